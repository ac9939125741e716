"""PullMessageProcessor: PULL_MESSAGE, with long polling (a pull that finds nothing with the suspend flag is
held by the PullRequestHoldService until its queue gets a message or suspendTimeoutMillis passes)."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ..remoting.codes import (MASTER_ID, PULL_FLAG_COMMIT_OFFSET, PULL_FLAG_SUBSCRIPTION, PULL_FLAG_SUSPEND,
                              ResponseCode)
from ..remoting.command import RemotingCommand
from ..store.format.message import GetMessageStatus
from .clients import SubscriptionData, TagFilter
from ..filter import is_tag_type
from .context import BrokerContext
from .filter import pull_filter
from .header import FAQ, Header
from .long_polling import KEEP_HELD, HeldPull, PullRequestHoldService
from .net import Channel
from .query import raw_messages

log = logging.getLogger(__name__)

# GetMessageStatus -> the pull's response code (PullMessageProcessor's switch); the two "no queue / no
# message" statuses answer PULL_NOT_FOUND for offset 0 and PULL_OFFSET_MOVED otherwise
_PULL_CODES = {
    GetMessageStatus.FOUND: ResponseCode.SUCCESS,
    GetMessageStatus.MESSAGE_WAS_REMOVING: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetMessageStatus.NO_MATCHED_MESSAGE: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetMessageStatus.OFFSET_FOUND_NULL: ResponseCode.PULL_NOT_FOUND,
    GetMessageStatus.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
    GetMessageStatus.OFFSET_OVERFLOW_BADLY: ResponseCode.PULL_OFFSET_MOVED,
    GetMessageStatus.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
}
_EMPTY_QUEUE = (GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, GetMessageStatus.NO_MESSAGE_IN_QUEUE)


@dataclass
class PullRequest:
    """PullMessageRequestHeader."""
    group: str
    topic: str
    queue_id: int
    offset: int
    max_nums: int
    sys_flag: int
    commit_offset: int
    suspend_ms: int
    sub_version: int
    subscription: str | None
    expression_type: str | None

    @classmethod
    def of(cls, req: RemotingCommand) -> "PullRequest":
        h = Header(req.ext_fields)
        return cls(h.str("consumerGroup"), h.str("topic"), h.int("queueId"), h.long("queueOffset"),
                   h.int("maxMsgNums"), h.int("sysFlag"), h.long("commitOffset"), h.long("suspendTimeoutMillis"),
                   h.long("subVersion"), h.str("subscription", required=False), h.str("expressionType", False))


class PullMessageProcessor:
    def __init__(self, ctx: BrokerContext):
        self.ctx = ctx
        self.hold_service = PullRequestHoldService(ctx, self.pull_again)

    def pull_message(self, ch: Channel, req: RemotingCommand):
        return self._pull(ch, req, True, None)

    def pull_again(self, ch: Channel, req: RemotingCommand, held: HeldPull | None):
        """A held pull run again (it is not held anew; KEEP_HELD while held is before its deadline and finds
        nothing)."""
        return self._pull(ch, req, False, held)

    def _subscription(self, ch: Channel, req: RemotingCommand, p: PullRequest):
        """(the store's MessageFilter for the subscription, None) or (None, error response)."""
        ctx = self.ctx
        sgc = ctx.groups.find(p.group)
        if sgc is None:
            return None, req.make_response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                                           f"subscription group [{p.group}] does not exist, {FAQ}", {})
        if not sgc.consume_enable:
            return None, req.make_response(ResponseCode.NO_PERMISSION, f"subscription group no permission, {p.group}", {})
        tc = ctx.topics.select(p.topic)
        if tc is None:
            return None, req.make_response(ResponseCode.TOPIC_NOT_EXIST,
                                           f"topic[{p.topic}] not exist, apply first please! {FAQ}", {})
        if not tc.readable:
            return None, req.make_response(ResponseCode.NO_PERMISSION,
                                           f"the topic[{p.topic}] pulling message is forbidden", {})
        if p.queue_id < 0 or p.queue_id >= tc.read_queue_nums:
            return None, req.make_response(ResponseCode.SYSTEM_ERROR,
                                           f"queueId[{p.queue_id}] is illegal, topic:[{p.topic}] topicConfig.readQueueNums:"
                                           f"[{tc.read_queue_nums}] consumer:[{ch.remote}]", {})
        if p.sys_flag & PULL_FLAG_SUBSCRIPTION:
            sd = SubscriptionData.build(p.topic, p.subscription, p.expression_type, p.sub_version)
        else:
            gi = ctx.clients.group_info(p.group)
            if gi is None:
                return None, req.make_response(ResponseCode.SUBSCRIPTION_NOT_EXIST,
                                               f"the consumer's group info not exist{FAQ}", {})
            sd = gi.subscriptions.get(p.topic)
            if sd is None:
                return None, req.make_response(ResponseCode.SUBSCRIPTION_NOT_EXIST,
                                               f"the consumer's subscription not exist{FAQ}", {})
            if sd.sub_version < p.sub_version:
                return None, req.make_response(ResponseCode.SUBSCRIPTION_NOT_LATEST,
                                               "the consumer's subscription not latest", {})
        if is_tag_type(sd.expression_type):
            return TagFilter(sd), None
        mf, refused = pull_filter(ctx, p.group, p.topic, sd, bool(p.sys_flag & PULL_FLAG_SUBSCRIPTION), p.sub_version)
        return (mf, None) if refused is None else (None, req.make_response(*refused, {}))

    def _suggest(self, group: str, from_slave: bool) -> int:
        """suggestWhichBrokerId: with slaveReadEnable, the group's whichBrokerWhenConsumeSlowly when the pulled
        messages lie further behind the log's head than accessMessageInMemoryMaxRatio % of memory, else its
        brokerId; without it, the master."""
        if not self.ctx.cfg.slave_read_enable:
            return MASTER_ID
        sgc = self.ctx.groups.find(group)
        if sgc is None:
            return MASTER_ID
        return sgc.which_broker_when_consume_slowly if from_slave else sgc.broker_id

    def _pull(self, ch: Channel, req: RemotingCommand, allow_suspend: bool, held: HeldPull | None):
        ctx = self.ctx
        p = PullRequest.of(req)
        message_filter, err = self._subscription(ch, req, p)
        if err is not None:
            return err
        t0 = time.monotonic()
        cfg = ctx.cfg
        if cfg.is_slave and not cfg.slave_read_enable and ctx.store.ha is not None and ctx.store.ha.master_online:
            # slaveReadEnable=false: consumers read from the master while it is there (RocketMQ 4.4.0 means
            # this and serves anyway); a slave whose master is gone serves them (failover)
            return req.make_response(ResponseCode.PULL_RETRY_IMMEDIATELY, "slave read disabled: pull from the master",
                                     {"suggestWhichBrokerId": str(MASTER_ID), "nextBeginOffset": str(p.offset),
                                      "maxOffset": "0", "minOffset": "0"})
        res = ctx.store.get_message(p.group, p.topic, p.queue_id, p.offset, p.max_nums, message_filter)
        st = res.status
        code = (ResponseCode.PULL_OFFSET_MOVED if p.offset != 0 else ResponseCode.PULL_NOT_FOUND) \
            if st in _EMPTY_QUEUE else _PULL_CODES.get(st, ResponseCode.PULL_OFFSET_MOVED)
        next_begin = res.next_begin_offset
        if cfg.is_slave and code == ResponseCode.PULL_OFFSET_MOVED and not cfg.offset_check_in_slave:
            code, next_begin = ResponseCode.PULL_RETRY_IMMEDIATELY, p.offset    # the master corrects offsets
        if allow_suspend and p.sys_flag & PULL_FLAG_COMMIT_OFFSET and not cfg.is_slave:
            ctx.offsets.commit_offset(p.group, p.topic, p.queue_id, p.commit_offset)
        if code == ResponseCode.PULL_NOT_FOUND and p.sys_flag & PULL_FLAG_SUSPEND:
            if held is not None and time.monotonic() < held.deadline:
                return KEEP_HELD
            if allow_suspend:
                timeout_ms = p.suspend_ms if ctx.cfg.long_polling_enable else ctx.cfg.short_polling_time_mills
                self.hold_service.hold(HeldPull(ch, req, p.topic, p.queue_id, p.offset,
                                                time.monotonic() + max(0, timeout_ms) / 1000.0))
                return None
        if code == ResponseCode.PULL_OFFSET_MOVED:
            log.warning("PULL_OFFSET_MOVED: topic=%s group=%s requestOffset=%d newOffset=%d", p.topic, p.group,
                        p.offset, next_begin)
        body = None
        if code == ResponseCode.SUCCESS:
            body = raw_messages(ctx.store, res.messages)
        ctx.stats.on_get(p.group, p.topic, p.queue_id, len(res.messages) if body else 0, len(body or b""),
                         int((time.monotonic() - t0) * 1000))
        fields = {"suggestWhichBrokerId": str(self._suggest(p.group, res.suggest_pulling_from_slave)),
                  "nextBeginOffset": str(next_begin), "maxOffset": str(res.max_offset), "minOffset": str(res.min_offset)}
        return req.make_response(code, st.name, fields, body)
