"""Broker state kept beside the store: topic configs (config/topics.json), consumer offsets
(config/consumerOffset.json) and subscription groups, in RocketMQ 4.4.0's formats.

INTERIM: these are the smallest versions the broker needs. rmqstore.topic_config / rmqstore.offset_store
(the in-process messaging layer) replace them when present: see `make_topic_manager` and
`make_offset_manager`, which prefer those modules.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..remoting import fastjson
from ..remoting.codes import (BENCHMARK_TOPIC, DEFAULT_TOPIC, OFFSET_MOVED_EVENT, PERM_INHERIT, PERM_READ,
                              PERM_WRITE, SELF_TEST_TOPIC)

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


# --- topics ----------------------------------------------------------------------------------------------
@dataclass
class TopicConfig:
    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False

    def to_json(self) -> dict:   # fastjson order: alphabetical
        return {"order": self.order, "perm": self.perm, "readQueueNums": self.read_queue_nums,
                "topicFilterType": self.topic_filter_type, "topicName": self.topic_name,
                "topicSysFlag": self.topic_sys_flag, "writeQueueNums": self.write_queue_nums}

    @classmethod
    def from_json(cls, d: dict) -> "TopicConfig":
        return cls(str(d["topicName"]), int(d.get("readQueueNums", 16)), int(d.get("writeQueueNums", 16)),
                   int(d.get("perm", 6)), str(d.get("topicFilterType", "SINGLE_TAG")),
                   int(d.get("topicSysFlag", 0)), bool(d.get("order", False)))

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writeable(self) -> bool:
        return bool(self.perm & PERM_WRITE)


@dataclass
class DataVersion:
    timestamp: int = field(default_factory=lambda: int(time.time() * 1000))
    counter: int = 0

    def next(self) -> None:
        self.timestamp = int(time.time() * 1000)
        self.counter += 1

    def to_json(self) -> dict:
        return {"counter": self.counter, "timestamp": self.timestamp}


class TopicConfigManager:
    """RocketMQ's TopicConfigManager: system topics, auto-creation from TBW102, topics.json."""

    def __init__(self, store_root: str | Path, cfg):
        self.path = Path(store_root) / "config" / "topics.json"
        self.cfg = cfg
        self.lock = threading.RLock()
        self.table: dict[str, TopicConfig] = {}
        self.data_version = DataVersion()
        self.system_topics: set[str] = set()
        self.on_change = None     # called (no arguments) after a topic is created or changed
        self._init_system_topics()

    def _add_system(self, tc: TopicConfig) -> None:
        self.system_topics.add(tc.topic_name)
        self.table[tc.topic_name] = tc

    def _init_system_topics(self) -> None:
        cfg = self.cfg
        self._add_system(TopicConfig(SELF_TEST_TOPIC, 1, 1))
        if cfg.auto_create_topic_enable:
            n = cfg.default_topic_queue_nums
            self._add_system(TopicConfig(DEFAULT_TOPIC, n, n, PERM_INHERIT | PERM_READ | PERM_WRITE))
        self._add_system(TopicConfig(BENCHMARK_TOPIC, 1024, 1024))
        self._add_system(TopicConfig(cfg.broker_cluster_name, 16, 16, PERM_INHERIT | PERM_READ | PERM_WRITE))
        self._add_system(TopicConfig(cfg.broker_name, 1, 1, PERM_INHERIT | PERM_READ | PERM_WRITE))
        self._add_system(TopicConfig(OFFSET_MOVED_EVENT, 1, 1))

    def load(self) -> None:
        d = _read_json(self.path)
        if not isinstance(d, dict):
            return
        for name, tc in (d.get("topicConfigTable") or {}).items():
            try:
                self.table[str(name)] = TopicConfig.from_json(tc)
            except (KeyError, TypeError, ValueError) as e:
                log.warning("%s: topic %r skipped: %s", self.path, name, e)
        dv = d.get("dataVersion") or {}
        self.data_version = DataVersion(int(dv.get("timestamp", 0) or 0), int(dv.get("counter", 0) or 0))

    def to_json(self) -> dict:
        with self.lock:
            return {"dataVersion": self.data_version.to_json(),
                    "topicConfigTable": {k: v.to_json() for k, v in self.table.items()}}

    def persist(self) -> None:
        _atomic_write(self.path, fastjson.dumps(self.to_json()))

    def select(self, topic: str) -> TopicConfig | None:
        return self.table.get(topic)

    def is_topic_can_send(self, topic: str) -> bool:
        return topic != DEFAULT_TOPIC

    def _created(self) -> None:
        self.data_version.next()
        try:
            self.persist()
        except OSError as e:
            log.error("cannot persist %s: %s", self.path, e)
        if self.on_change is not None:
            self.on_change()

    def create_in_send(self, topic: str, default_topic: str, client_default_queue_nums: int,
                       topic_sys_flag: int = 0) -> TopicConfig | None:
        with self.lock:
            tc = self.table.get(topic)
            if tc is not None:
                return tc
            dtc = self.table.get(default_topic)
            if dtc is None:
                log.warning("create topic %s failed: default topic %s does not exist", topic, default_topic)
                return None
            if default_topic == DEFAULT_TOPIC and not self.cfg.auto_create_topic_enable:
                dtc.perm = PERM_READ | PERM_WRITE
            if not dtc.perm & PERM_INHERIT:
                log.warning("create topic %s failed: default topic %s has no inherit perm (%d)", topic,
                            default_topic, dtc.perm)
                return None
            n = max(0, min(client_default_queue_nums, dtc.write_queue_nums))
            tc = TopicConfig(topic, n, n, dtc.perm & ~PERM_INHERIT, dtc.topic_filter_type, topic_sys_flag)
            self.table[topic] = tc
            log.info("created topic %s from %s: %s", topic, default_topic, tc)
        self._created()
        return tc

    def create_in_send_back(self, topic: str, queue_nums: int, perm: int, topic_sys_flag: int = 0) -> TopicConfig:
        tc = self.table.get(topic)
        if tc is not None:
            return tc
        with self.lock:
            tc = self.table.get(topic)
            if tc is not None:
                return tc
            tc = TopicConfig(topic, queue_nums, queue_nums, perm, "SINGLE_TAG", topic_sys_flag)
            self.table[topic] = tc
            log.info("created topic %s", tc)
        self._created()
        return tc

    def update(self, tc: TopicConfig) -> None:
        with self.lock:
            self.table[tc.topic_name] = tc
        self._created()

    def delete(self, topic: str) -> bool:
        with self.lock:
            if self.table.pop(topic, None) is None:
                return False
        self._created()
        return True


# --- consumer offsets ------------------------------------------------------------------------------------
class ConsumerOffsetManager:
    """RocketMQ's ConsumerOffsetManager: offsetTable {"topic@group": {queueId: offset}}."""

    def __init__(self, store_root: str | Path):
        self.path = Path(store_root) / "config" / "consumerOffset.json"
        self.lock = threading.Lock()
        self.table: dict[str, dict[int, int]] = {}
        self.dirty = False

    def load(self) -> None:
        d = _read_json(self.path)
        if not isinstance(d, dict):
            return
        for key, offsets in (d.get("offsetTable") or {}).items():
            if isinstance(offsets, dict):
                self.table[str(key)] = {int(q): int(o) for q, o in offsets.items()}

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        key = f"{topic}@{group}"
        with self.lock:
            m = self.table.get(key)
            if m is None:
                m = self.table[key] = {}
            m[int(queue_id)] = int(offset)
            self.dirty = True

    def query(self, group: str, topic: str, queue_id: int) -> int:
        m = self.table.get(f"{topic}@{group}")
        if m is None:
            return -1
        return m.get(int(queue_id), -1)

    def query_all(self, group: str, topic: str) -> dict[int, int]:
        return dict(self.table.get(f"{topic}@{group}", {}))

    def to_json(self) -> dict:
        with self.lock:
            return {"offsetTable": {k: dict(v) for k, v in self.table.items()}}

    def persist(self) -> None:
        with self.lock:
            self.dirty = False
        _atomic_write(self.path, fastjson.dumps(self.to_json()))


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
        self.data_version = DataVersion()
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
            self.data_version.next()
            self.dirty = True
        return g

    def persist(self) -> None:
        self.dirty = False
        _atomic_write(self.path, fastjson.dumps({"dataVersion": self.data_version.to_json(),
                                                 "subscriptionGroupTable": {k: v.to_json() for k, v in self.table.items()}}))
