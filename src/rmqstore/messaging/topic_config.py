"""Topics and their queues: RocketMQ's TopicConfigManager, persisted to `{store}/config/topics.json`.

    {"dataVersion": {"counter": 3, "timestamp": 1700000000000},
     "topicConfigTable": {"T": {"order": false, "perm": 6, "readQueueNums": 4, "topicFilterType": "SINGLE_TAG",
                                "topicName": "T", "topicSysFlag": 0, "writeQueueNums": 4}, ...}}

As the broker does, the table starts with the system topics (SELF_TEST_TOPIC, TBW102 when
autoCreateTopicEnable, BenchmarkTest, the cluster and broker names, OFFSET_MOVED_EVENT), then the file's
entries. A producer sending to an unknown topic creates it (createTopicInSendMessageMethod) with
min(the producer's defaultTopicQueueNums, the store's defaultTopicQueueNums) queues, perm 6, when
autoCreateTopicEnable; retry and dead-letter topics are created as consumerSendMsgBack does.
Producers write to queues [0, writeQueueNums); consumers read [0, readQueueNums).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..store.conf.config import StoreConfig
from ..store.conf.config_tables import PERM_INHERIT, PERM_READ, PERM_WRITE, TopicConfig, decode_topics
from ..store.conf.config_file import PeriodicPersister, config_dir, dumps_pretty, load_config_file, string_to_file

log = logging.getLogger(__name__)

AUTO_CREATE_TOPIC_KEY_TOPIC = "TBW102"
BENCHMARK_TOPIC = "BenchmarkTest"
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


@dataclass(frozen=True, order=True)
class MessageQueue:
    """RocketMQ's MessageQueue: (topic, brokerName, queueId), ordered as RocketMQ sorts them."""
    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"MessageQueue [topic={self.topic}, brokerName={self.broker_name}, queueId={self.queue_id}]"


class TopicNotExistError(LookupError):
    """No route for the topic (RocketMQ's "No route info of this topic")."""


class TopicConfigManager:
    FILE_NAME = "topics.json"

    def __init__(self, store_path: str | Path, config: StoreConfig | None = None):
        self.config = config or StoreConfig()
        self.path = config_dir(store_path) / self.FILE_NAME
        self.table: dict[str, TopicConfig] = {}
        self.system_topics: set[str] = set()
        self.data_version = {"counter": 0, "timestamp": int(time.time() * 1000)}
        self._lock = threading.RLock()
        self._listeners: list[Callable[[str], None]] = []
        self._dirty = False
        self._persister: PeriodicPersister | None = None
        self._add_system_topics()

    def _add_system_topics(self) -> None:
        cfg = self.config
        sys_topics = [TopicConfig(SELF_TEST_TOPIC, 1, 1)]
        if cfg.auto_create_topic_enable:
            sys_topics.append(TopicConfig(AUTO_CREATE_TOPIC_KEY_TOPIC, cfg.default_topic_queue_nums,
                                          cfg.default_topic_queue_nums, PERM_INHERIT | PERM_READ | PERM_WRITE))
        sys_topics.append(TopicConfig(BENCHMARK_TOPIC, 1024, 1024))
        sys_topics.append(TopicConfig(cfg.broker_cluster_name, perm=PERM_INHERIT | PERM_READ | PERM_WRITE))
        sys_topics.append(TopicConfig(cfg.broker_name, 1, 1, PERM_INHERIT | PERM_READ | PERM_WRITE))
        sys_topics.append(TopicConfig(OFFSET_MOVED_EVENT, 1, 1))
        for tc in sys_topics:
            self.system_topics.add(tc.topic_name)
            self.table[tc.topic_name] = tc

    # --- persistence ----------------------------------------------------------------------------
    def load(self) -> "TopicConfigManager":
        """ConfigManager.load (config_file.load_config_file): topics.json, else topics.json.bak; a
        CorruptStoreError naming the file when neither is usable."""
        got = load_config_file(self.path, decode_topics)
        if got is not None:
            table, version = got
            with self._lock:
                self.table.update(table)
                if version is not None:
                    self.data_version = version
        return self

    def encode(self) -> dict:
        with self._lock:
            return {"dataVersion": dict(self.data_version),
                    "topicConfigTable": {n: tc.to_json() for n, tc in self.table.items()}}

    def persist(self) -> None:
        """Write topics.json, one writer at a time (two side by side could leave the older table last)."""
        with self._lock:    # re-entrant: a change persists under it (_changed)
            text = dumps_pretty(self.encode())
            self._dirty = False
            string_to_file(text, self.path, decode_topics)

    def replace_all(self, wrapper: dict) -> None:
        """A slave takes its master's table and dataVersion (SlaveSynchronize.syncTopicConfig), persisted;
        ValueError for a wrong shape (nothing changes then)."""
        table, version = decode_topics(wrapper)
        with self._lock:
            self.table = {**{n: tc for n, tc in self.table.items() if n in self.system_topics}, **table}
            if version is not None:
                self.data_version = version
            self._dirty = True
        self.persist()

    def start(self, interval_ms: int = 10_000) -> None:
        self._persister = PeriodicPersister("TopicConfigPersist", interval_ms, self.persist, lambda: self._dirty)
        self._persister.start()

    def shutdown(self) -> None:
        if self._persister is not None:
            self._persister.stop()
            self._persister = None
        elif self._dirty:
            self.persist()

    # --- lookups --------------------------------------------------------------------------------
    def select(self, topic: str) -> TopicConfig | None:
        return self.table.get(topic)

    def add_listener(self, fn: Callable[[str], None]) -> None:
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[str], None]) -> None:
        try:
            self._listeners.remove(fn)
        except ValueError:
            pass

    def _changed(self, topic: str) -> None:
        self.data_version = {"counter": self.data_version["counter"] + 1, "timestamp": int(time.time() * 1000)}
        self._dirty = True
        try:
            self.persist()      # the broker persists at once after creating or updating a topic
        except OSError as e:
            log.error("cannot persist %s: %s", self.path, e)
        for fn in list(self._listeners):
            try:
                fn(topic)
            except Exception:
                log.exception("topic listener failed")

    # --- creation -------------------------------------------------------------------------------
    def create_topic(self, topic: str, queue_nums: int = 4, perm: int = PERM_READ | PERM_WRITE,
                     read_queue_nums: int | None = None, order: bool = False, topic_sys_flag: int = 0) -> TopicConfig:
        """Create or update a topic (the admin's updateTopic): queue_nums write queues (and read queues)."""
        if not topic or len(topic.encode("utf-8")) > 127:
            raise ValueError(f"topic {topic!r}: must be 1 to 127 bytes")
        if queue_nums < 1:
            raise ValueError("queue_nums must be at least 1")
        tc = TopicConfig(topic, read_queue_nums if read_queue_nums is not None else queue_nums, queue_nums, perm,
                         topic_sys_flag=topic_sys_flag, order=order)
        with self._lock:
            old = self.table.get(topic)
            self.table[topic] = tc
            if old != tc:
                self._changed(topic)
        return tc

    def create_topic_in_send_message_method(self, topic: str, client_default_queue_nums: int,
                                            topic_sys_flag: int = 0) -> TopicConfig | None:
        """Auto-create from TBW102 (None when autoCreateTopicEnable is off)."""
        with self._lock:
            tc = self.table.get(topic)
            if tc is not None:
                return tc
            default = self.table.get(AUTO_CREATE_TOPIC_KEY_TOPIC)
            if default is None or not self.config.auto_create_topic_enable:
                log.warning("create topic %s failed: autoCreateTopicEnable is off", topic)
                return None
            if not default.perm & PERM_INHERIT:
                log.warning("create topic %s failed: %s has no inherit permission", topic, AUTO_CREATE_TOPIC_KEY_TOPIC)
                return None
            n = max(0, min(client_default_queue_nums, default.write_queue_nums))
            tc = TopicConfig(topic, n, n, default.perm & ~PERM_INHERIT, default.topic_filter_type, topic_sys_flag)
            self.table[topic] = tc
            log.info("create new topic %s by default topic %s", tc, AUTO_CREATE_TOPIC_KEY_TOPIC)
            self._changed(topic)
            return tc

    def create_topic_in_send_message_back_method(self, topic: str, queue_nums: int, perm: int,
                                                 topic_sys_flag: int = 0) -> TopicConfig:
        with self._lock:
            tc = self.table.get(topic)
            if tc is not None:
                return tc
            tc = TopicConfig(topic, queue_nums, queue_nums, perm, topic_sys_flag=topic_sys_flag)
            self.table[topic] = tc
            self._changed(topic)
            return tc

    def delete_topic(self, topic: str) -> None:
        with self._lock:
            if self.table.pop(topic, None) is not None:
                self._changed(topic)
