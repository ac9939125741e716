"""Subscription groups (RocketMQ's SubscriptionGroupManager, config/subscriptionGroup.json).

Topics and consumer offsets are rmqstore.local_broker's (topic_config.TopicConfigManager,
offset_store.ConsumerOffsetManager); the network broker uses them as they are.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..remoting import fastjson

log = logging.getLogger(__name__)


def _atomic_write(path: Path, text: str) -> None:
    """RocketMQ's MixAll.string2File: keep the previous version as .bak, write via a temp file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    if path.exists():
        try:
            os.replace(path, path.with_name(path.name + ".bak"))
        except OSError:
            pass
    os.replace(tmp, path)


def _read_json(path: Path):
    for p in (path, path.with_name(path.name + ".bak")):
        try:
            text = p.read_text(encoding="utf-8")
        except OSError:
            continue
        if not text.strip():
            continue
        try:
            return fastjson.loads(text)
        except ValueError as e:
            log.warning("%s: unreadable (%s), trying the backup", p, e)
    return None


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

    def persist(self) -> None:
        self.dirty = False
        _atomic_write(self.path, fastjson.dumps({"dataVersion": dict(self.data_version),
                                                 "subscriptionGroupTable": {k: v.to_json() for k, v in self.table.items()}}))
