"""Who is connected: consumer groups (RocketMQ's ConsumerManager / ConsumerGroupInfo), producer groups
(ProducerManager), and the tag filter built from a subscription (FilterAPI + ExpressionMessageFilter).

A consumer group's membership changes (a new client's heartbeat, a new subscription, an unregister, a
connection closing, a client silent for 120 s) send NOTIFY_CONSUMER_IDS_CHANGED (40, oneway) to every
remaining member, which then rebalances.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from ..remoting.codes import RequestCode
from ..remoting.command import RemotingCommand
from ..remoting.subscription import SUB_ALL, SubscriptionData  # noqa: F401  (the wire model, shared with the client)
from .net import Channel

log = logging.getLogger(__name__)

CHANNEL_EXPIRED_TIMEOUT = 120.0
class TagFilter:
    """ExpressionMessageFilter for TAG subscriptions: the consume queue's tags code in the code set."""

    __slots__ = ("codes", "all")

    def __init__(self, sd: SubscriptionData | None):
        self.all = sd is None or sd.matches_all
        self.codes = frozenset(sd.code_set) if sd is not None else frozenset()

    def is_matched_by_consume_queue(self, tags_code) -> bool:
        if self.all or tags_code is None:
            return True
        return tags_code in self.codes

    def is_matched_by_commit_log(self, msg) -> bool:
        return True


@dataclass
class ClientChannelInfo:
    channel: Channel
    client_id: str
    language: str
    version: int
    last_update: float = field(default_factory=time.monotonic)


@dataclass
class ConsumerGroupInfo:
    group: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    subscriptions: dict[str, SubscriptionData] = field(default_factory=dict)
    channels: dict[Channel, ClientChannelInfo] = field(default_factory=dict)

    def all_client_ids(self) -> list[str]:
        return [c.client_id for c in self.channels.values()]

    def update_channel(self, info: ClientChannelInfo) -> bool:
        old = self.channels.get(info.channel)
        if old is None:
            self.channels[info.channel] = info
            return True
        if old.client_id != info.client_id:
            log.error("consumer channel %s changed its client id %s -> %s", info.channel, old.client_id, info.client_id)
            self.channels[info.channel] = info
        old.last_update = time.monotonic()
        return False

    def update_subscriptions(self, subs: list[SubscriptionData]) -> bool:
        """ConsumerGroupInfo.updateSubscription: True when a topic was added or removed."""
        updated = False
        for sd in subs:
            old = self.subscriptions.get(sd.topic)
            if old is None:
                self.subscriptions[sd.topic] = sd
                updated = True
            elif sd.sub_version > old.sub_version:
                self.subscriptions[sd.topic] = sd
        new_topics = {sd.topic for sd in subs}
        for t in list(self.subscriptions):
            if t not in new_topics:
                del self.subscriptions[t]
                updated = True
        return updated


class ClientManager:
    """ConsumerManager + ProducerManager of one broker."""

    def __init__(self):
        self.on_group_gone = None       # called with a consumer group's name when its last client left
        self.consumers: dict[str, ConsumerGroupInfo] = {}
        self.producers: dict[str, dict[Channel, ClientChannelInfo]] = {}

    # --- consumers ----------------------------------------------------------------------------
    def register_consumer(self, group: str, info: ClientChannelInfo, consume_type: str, message_model: str,
                          consume_from_where: str, subs: list[SubscriptionData], notify: bool = True) -> bool:
        g = self.consumers.get(group)
        if g is None:
            g = self.consumers[group] = ConsumerGroupInfo(group)
        g.consume_type, g.message_model, g.consume_from_where = consume_type, message_model, consume_from_where
        r1 = g.update_channel(info)
        r2 = g.update_subscriptions(subs)
        if (r1 or r2) and notify:
            self.notify_ids_changed(group)
        return r1 or r2

    def unregister_consumer(self, group: str, channel: Channel, notify: bool = True) -> None:
        g = self.consumers.get(group)
        if g is None:
            return
        if g.channels.pop(channel, None) is not None:
            if not g.channels:
                del self.consumers[group]
                if self.on_group_gone is not None:
                    self.on_group_gone(group)
            elif notify:
                self.notify_ids_changed(group)

    def group_info(self, group: str) -> ConsumerGroupInfo | None:
        return self.consumers.get(group)

    def notify_ids_changed(self, group: str) -> None:
        g = self.consumers.get(group)
        if g is None:
            return
        for ch in list(g.channels):
            if not ch.closed:
                ch.oneway(RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group},
                                                  oneway=True))

    # --- producers ----------------------------------------------------------------------------
    def register_producer(self, group: str, info: ClientChannelInfo) -> None:
        chans = self.producers.setdefault(group, {})
        old = chans.get(info.channel)
        if old is None:
            chans[info.channel] = info
        else:
            old.last_update = time.monotonic()

    def unregister_producer(self, group: str, channel: Channel) -> None:
        chans = self.producers.get(group)
        if chans is not None:
            chans.pop(channel, None)
            if not chans:
                del self.producers[group]

    def producer_channel(self, group: str) -> Channel | None:
        """A live channel of the producer group (for CHECK_TRANSACTION_STATE)."""
        for ch in (self.producers.get(group) or {}):
            if not ch.closed:
                return ch
        return None

    # --- channel life ---------------------------------------------------------------------------
    def channel_closed(self, channel: Channel) -> None:
        for group in list(self.consumers):
            self.unregister_consumer(group, channel)
        for group in list(self.producers):
            self.unregister_producer(group, channel)

    def scan_not_active(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for group, g in list(self.consumers.items()):
            for ch, info in list(g.channels.items()):
                if now - info.last_update > CHANNEL_EXPIRED_TIMEOUT:
                    log.warning("consumer %s of %s expired, closing %s", info.client_id, group, ch.remote)
                    ch.close()
                    self.unregister_consumer(group, ch)
        for group, chans in list(self.producers.items()):
            for ch, info in list(chans.items()):
                if now - info.last_update > CHANNEL_EXPIRED_TIMEOUT:
                    ch.close()
                    self.unregister_producer(group, ch)
