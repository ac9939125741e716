"""Subscription groups (RocketMQ's SubscriptionGroupManager, config/subscriptionGroup.json).

Topics and consumer offsets are rmqstore.messaging.local_broker's (topic_config.TopicConfigManager,
offset_store.ConsumerOffsetManager); the network broker uses them as they are.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from ..store.conf.config_file import as_object, load_config_file, string_to_file
from ..remoting import fastjson

log = logging.getLogger(__name__)


def _decode_groups(data) -> dict:
    """subscriptionGroup.json's parsed JSON: its subscriptionGroupTable (ValueError for a wrong shape)."""
    return as_object(as_object(data, "subscriptionGroup.json").get("subscriptionGroupTable"),
                     "subscriptionGroupTable")


def _atomic_write(path: Path, text: str) -> None:
    """RocketMQ's MixAll.string2File, atomic, the previous good content kept as .bak (config_file)."""
    string_to_file(text, path, _decode_groups)


def _read_json(path: Path):
    """The file, else its .bak; CorruptStoreError naming it when neither is usable (config_file)."""
    table = load_config_file(path, _decode_groups)
    return None if table is None else {"subscriptionGroupTable": table}


# --- subscription groups -----------------------------------------------------------------------------------
@dataclass
class SubscriptionGroupConfig:
    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True

    def to_json(self) -> dict:
        return {"brokerId": self.broker_id, "consumeBroadcastEnable": self.consume_broadcast_enable,
                "consumeEnable": self.consume_enable, "consumeFromMinEnable": self.consume_from_min_enable,
                "groupName": self.group_name, "notifyConsumerIdsChangedEnable": self.notify_consumer_ids_changed_enable,
                "retryMaxTimes": self.retry_max_times, "retryQueueNums": self.retry_queue_nums,
                "whichBrokerWhenConsumeSlowly": self.which_broker_when_consume_slowly}

    @classmethod
    def from_json(cls, d: dict) -> "SubscriptionGroupConfig":
        return cls(str(d["groupName"]), bool(d.get("consumeEnable", True)), bool(d.get("consumeFromMinEnable", True)),
                   bool(d.get("consumeBroadcastEnable", True)), int(d.get("retryQueueNums", 1)),
                   int(d.get("retryMaxTimes", 16)), int(d.get("brokerId", 0)),
                   int(d.get("whichBrokerWhenConsumeSlowly", 1)), bool(d.get("notifyConsumerIdsChangedEnable", True)))


class SubscriptionGroupManager:
    """RocketMQ's SubscriptionGroupManager (config/subscriptionGroup.json); groups are auto-created
    (autoCreateSubscriptionGroup, true by default)."""

    def __init__(self, store_root: str | Path, auto_create: bool = True):
        self.path = Path(store_root) / "config" / "subscriptionGroup.json"
        self.auto_create = auto_create
        self.table: dict[str, SubscriptionGroupConfig] = {}
        self.data_version = {"counter": 0, "timestamp": int(time.time() * 1000)}
        self.dirty = False

    def load(self) -> None:
        d = _read_json(self.path)
        if not isinstance(d, dict):
            return
        for name, g in (d.get("subscriptionGroupTable") or {}).items():
            try:
                self.table[str(name)] = SubscriptionGroupConfig.from_json(g)
            except (KeyError, TypeError, ValueError) as e:
                log.warning("%s: group %r skipped: %s", self.path, name, e)

    def find(self, group: str) -> SubscriptionGroupConfig | None:
        g = self.table.get(group)
        if g is None and self.auto_create:
            g = self.table[group] = SubscriptionGroupConfig(group)
            self.data_version = {"counter": self.data_version["counter"] + 1, "timestamp": int(time.time() * 1000)}
            self.dirty = True
        return g

    def _changed(self) -> None:
        self.data_version = {"counter": self.data_version["counter"] + 1, "timestamp": int(time.time() * 1000)}
        self.dirty = True

    def update(self, sgc: SubscriptionGroupConfig) -> None:
        """updateSubscriptionGroupConfig (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP)."""
        self.table[sgc.group_name] = sgc
        self._changed()

    def delete(self, group: str) -> None:
        """deleteSubscriptionGroupConfig (DELETE_SUBSCRIPTIONGROUP)."""
        if self.table.pop(group, None) is not None:
            self._changed()

    def replace_all(self, wrapper: dict) -> None:
        """A slave takes its master's groups and dataVersion (SlaveSynchronize.syncSubscriptionGroupConfig)."""
        table = {str(n): SubscriptionGroupConfig.from_json(g) for n, g in (wrapper.get("subscriptionGroupTable")
                                                                            or {}).items()}
        self.table = table
        dv = wrapper.get("dataVersion")
        if isinstance(dv, dict):
            self.data_version = {"counter": int(dv.get("counter", 0)), "timestamp": int(dv.get("timestamp", 0))}
        self.persist()

    def encode(self) -> dict:
        """SubscriptionGroupWrapper: the table and its data version."""
        return {"dataVersion": dict(self.data_version),
                "subscriptionGroupTable": {k: v.to_json() for k, v in self.table.items()}}

    def persist(self) -> None:
        self.dirty = False
        _atomic_write(self.path, fastjson.dumps({"dataVersion": dict(self.data_version),
                                                 "subscriptionGroupTable": {k: v.to_json() for k, v in self.table.items()}}))
