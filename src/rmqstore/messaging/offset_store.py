"""Consumer progress: RocketMQ's ConsumerOffsetManager, persisted to `{store}/config/consumerOffset.json`.

    {"offsetTable": {"TopicA@groupX": {"0": 12, "1": 7}, "%RETRY%groupX@groupX": {"0": 3}}}

An offset is the next logical offset the group will consume in that queue. Consumers commit into the
table after consumption; the table is written (temp file, previous content kept as `.bak`, as
ConfigManager.persist) every flushConsumerOffsetInterval ms (broker default 5000) when it changed, and at
shutdown. The reader also accepts fastjson's unquoted integer keys (`{0:12}`), as RocketMQ writes them.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path

from ..store.conf.config_tables import decode_offsets
from ..store.conf.config_file import PeriodicPersister, config_dir, dumps_pretty, load_config_file, string_to_file

log = logging.getLogger(__name__)

TOPIC_GROUP_SEPARATOR = "@"
DEFAULT_FLUSH_INTERVAL_MS = 5000


class ConsumerOffsetManager:
    FILE_NAME = "consumerOffset.json"

    def __init__(self, store_path: str | Path, flush_interval_ms: int = DEFAULT_FLUSH_INTERVAL_MS):
        self.path = config_dir(store_path) / self.FILE_NAME
        self.flush_interval_ms = flush_interval_ms
        self.offset_table: dict[str, dict[int, int]] = {}
        self._lock = threading.Lock()
        self._persist_lock = threading.Lock()
        self._version = 0
        self._persisted_version = 0
        self._persister: PeriodicPersister | None = None

    # --- persistence ----------------------------------------------------------------------------
    def load(self) -> "ConsumerOffsetManager":
        """ConfigManager.load (config_file.load_config_file): consumerOffset.json, else its .bak; a
        CorruptStoreError naming the file when neither is usable."""
        table = load_config_file(self.path, decode_offsets)
        if table is not None:
            with self._lock:
                self.offset_table = table
        return self

    def encode(self) -> dict:
        with self._lock:
            return self._encode()

    def _encode(self) -> dict:
        return {"offsetTable": {k: {str(q): o for q, o in sorted(m.items())} for k, m in self.offset_table.items()}}

    def persist(self) -> None:
        """Write consumerOffset.json. One writer at a time (the periodic persister, a consumer leaving, close):
        two side by side could leave the older table in the file while dirty() said all was written."""
        with self._persist_lock:
            with self._lock:
                version, doc = self._version, self._encode()
            string_to_file(dumps_pretty(doc), self.path, decode_offsets)
            with self._lock:
                self._persisted_version = max(self._persisted_version, version)

    def dirty(self) -> bool:
        return self._version != self._persisted_version

    def start(self) -> None:
        if self._persister is None:
            self._persister = PeriodicPersister("ConsumerOffsetPersist", self.flush_interval_ms, self.persist,
                                                self.dirty)
            self._persister.start()

    def shutdown(self) -> None:
        if self._persister is not None:
            self._persister.stop()
            self._persister = None
        elif self.dirty():
            self.persist()

    # --- offsets --------------------------------------------------------------------------------
    def merge(self, table: dict[str, dict[int, int]]) -> None:
        """A slave takes its master's offsets (SlaveSynchronize.syncConsumerOffset: putAll, never removes)."""
        with self._lock:
            for key, offsets in table.items():
                self.offset_table.setdefault(key, {}).update(offsets)
            self._version += 1

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        key = topic + TOPIC_GROUP_SEPARATOR + group
        with self._lock:
            m = self.offset_table.setdefault(key, {})
            old = m.get(queue_id)
            if old == offset:
                return
            if old is not None and offset < old:
                log.debug("offset of %s queue %d moves back from %d to %d", key, queue_id, old, offset)
            m[queue_id] = offset
            self._version += 1

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when the group has none for that queue."""
        m = self.offset_table.get(topic + TOPIC_GROUP_SEPARATOR + group)
        if m is not None:
            off = m.get(queue_id)
            if off is not None:
                return off
        return -1

    def query_offsets(self, group: str, topic: str) -> dict[int, int]:
        with self._lock:
            return dict(self.offset_table.get(topic + TOPIC_GROUP_SEPARATOR + group, {}))

    def which_topics_by_group(self, group: str) -> set[str]:
        out = set()
        for key in list(self.offset_table):
            topic, sep, g = key.rpartition(TOPIC_GROUP_SEPARATOR)
            if sep and g == group:
                out.add(topic)
        return out

    def remove_offset(self, group: str, topic: str | None = None) -> None:
        with self._lock:
            for key in list(self.offset_table):
                t, _, g = key.rpartition(TOPIC_GROUP_SEPARATOR)
                if g == group and (topic is None or t == topic):
                    del self.offset_table[key]
                    self._version += 1
