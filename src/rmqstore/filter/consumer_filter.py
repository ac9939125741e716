"""Which consumer groups filter which topic by SQL92 (RocketMQ 4.4.0's ConsumerFilterManager and
ConsumerFilterData), the bit maps the dispatcher computes from them, and the pull-side MessageFilter that
uses both (ExpressionMessageFilter).

A heartbeat registers each SQL92 subscription of a group: compiled once, with the group's bloom filter bit
positions ("group#topic") and its born time. A subscription that does not compile registers nothing (the
consumer's pulls then answer FILTER_DATA_NOT_EXIST); a newer client version of the same group replaces it;
a group gone from a topic is marked dead (its bits are still computed, as RocketMQ does, until the data is
cleaned). The dispatcher asks `bit_map(topic, properties)`: for every message of a topic with filter data,
the bits of each group whose selector is TRUE for it. A pull skips a message whose bit map misses the
group's bits, provided the message was stored after the group registered (older bit maps do not know it).

Readers (the dispatcher thread, pulls) see the tables copied on write: no lock on the read side.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from .bloom import BloomFilter, BloomFilterData
from .parser import SelectorError
from .selector import SQL92, SqlExpression, compile_sql92, is_tag_type

log = logging.getLogger(__name__)


@dataclass
class ConsumerFilterData:
    consumer_group: str
    topic: str
    expression: str
    expression_type: str
    compiled: SqlExpression
    born_time: int
    client_version: int
    bloom: BloomFilterData | None = None
    dead_time: int = 0

    @property
    def dead(self) -> bool:
        return self.dead_time >= self.born_time

    def is_msg_in_live(self, store_time: int) -> bool:
        return store_time > self.born_time


def build_filter_data(topic: str, group: str, expression: str, expression_type: str,
                      client_version: int) -> ConsumerFilterData:
    """ConsumerFilterManager.build: compiled now (SelectorError when it does not compile)."""
    if expression_type != SQL92:
        raise SelectorError("java.lang.IllegalArgumentException", f"unknown expression type {expression_type}")
    return ConsumerFilterData(group, topic, expression, expression_type, compile_sql92(expression),
                              int(time.time() * 1000), client_version)


class ConsumerFilterManager:
    """SQL92 subscriptions by topic and group, and the bloom filter of the bit maps."""

    def __init__(self, max_error_rate: int = 20, expect_consumer_num: int = 32):
        self.bloom = BloomFilter(max_error_rate, expect_consumer_num)
        self._by_topic: dict[str, dict[str, ConsumerFilterData]] = {}
        self._lock = threading.Lock()
        self.on_change = None       # called (no argument) after the registered filter data changed

    @classmethod
    def for_config(cls, cfg) -> "ConsumerFilterManager":
        return cls(cfg.max_error_rate_of_bloom_filter, cfg.expect_consumer_num_use_filter)

    # --- registration (heartbeats) --------------------------------------------------------------------
    def register_group(self, group: str, subscriptions) -> None:
        """ConsumerFilterManager.register(group, subList): each SQL92 subscription (objects with topic,
        sub_string, expression_type, sub_version); the group's other topics are marked dead."""
        topics = set()
        for sd in subscriptions:
            topics.add(sd.topic)
            self.register(sd.topic, group, sd.sub_string, sd.expression_type, sd.sub_version)
        self._mark_dead(group, lambda topic: topic not in topics)

    def register(self, topic: str, group: str, expression: str | None, expression_type: str | None,
                 client_version: int) -> bool:
        if is_tag_type(expression_type) or not expression:
            return False
        bloom = self.bloom.generate(f"{group}#{topic}")
        with self._lock:
            old = self._by_topic.get(topic, {}).get(group)
            if old is not None and client_version <= old.client_version:
                if client_version == old.client_version and old.dead:
                    old.dead_time = 0
                    self._changed()
                    return True
                return False
            if old is not None and old.expression == expression and old.expression_type == expression_type \
                    and old.bloom == bloom:
                old.client_version = client_version
                old.dead_time = 0
                self._changed()
                return True
            try:
                data = build_filter_data(topic, group, expression, expression_type, client_version)
            except SelectorError as e:
                log.warning("consumer %s of %s: SQL92 selector %r does not compile: %s", group, topic, expression,
                            e.remark)
                if old is not None:
                    self._put(topic, group, None)
                return False
            data.bloom = bloom
            self._put(topic, group, data)
            return True

    def unregister(self, group: str) -> None:
        """The group's last client left: its filter data is dead (kept for pulls of late clients)."""
        self._mark_dead(group, lambda topic: True)

    def _mark_dead(self, group: str, which) -> None:
        now = int(time.time() * 1000)
        with self._lock:
            dying = [d for topic, groups in self._by_topic.items() if which(topic)
                     for d in [groups.get(group)] if d is not None and not d.dead]
            for d in dying:
                d.dead_time = now
            if dying:
                self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _put(self, topic: str, group: str, data: ConsumerFilterData | None) -> None:
        groups = dict(self._by_topic.get(topic, {}))
        if data is None:
            groups.pop(group, None)
        else:
            groups[group] = data
        table = dict(self._by_topic)
        if groups:
            table[topic] = groups
        else:
            table.pop(topic, None)
        self._by_topic = table
        self._changed()

    # --- consumerFilter.json (ConsumerFilterManager's ConfigManager encode / decode) ---------------------
    def to_json(self, now: int | None = None, keep_dead_ms: int = 24 * 3600 * 1000) -> dict:
        """RocketMQ's consumerFilter.json; filter data dead for keep_dead_ms is left out (its clean())."""
        now = int(time.time() * 1000) if now is None else now
        out: dict = {}
        for topic, groups in self._by_topic.items():
            g = {name: {"bloomFilterData": {"bitNum": d.bloom.bit_num, "bitPos": list(d.bloom.bit_pos)} if d.bloom
                        else None, "bornTime": d.born_time, "clientVersion": d.client_version,
                        "consumerGroup": d.consumer_group, "dead": d.dead, "deadTime": d.dead_time,
                        "expression": d.expression, "expressionType": d.expression_type, "topic": d.topic}
                 for name, d in groups.items() if not (d.dead and now - d.dead_time >= keep_dead_ms)}
            if g:
                out[topic] = {"groupFilterData": g, "topic": topic}
        return {"filterDataByTopic": out}

    def load_json(self, saved: dict, now: int | None = None) -> int:
        """ConsumerFilterManager.decode: the saved filter data, each dead until its group's next heartbeat
        (pulls still use it); nothing at all when the bloom filter's parameters changed since. Returns how
        many were loaded. ValueError (or TypeError, KeyError) for a file of the wrong shape."""
        now = int(time.time() * 1000) if now is None else now
        table: dict[str, dict[str, ConsumerFilterData]] = {}
        for topic, by_topic in dict(saved.get("filterDataByTopic") or {}).items():
            for group, d in dict(by_topic.get("groupFilterData") or {}).items():
                bd = d.get("bloomFilterData")
                bloom = BloomFilterData(tuple(int(p) for p in bd["bitPos"]), int(bd["bitNum"])) if bd else None
                if not self.bloom.is_valid(bloom):
                    log.info("consumerFilter.json was written with another bloom filter: its filter data ignored")
                    return 0
                try:
                    compiled = compile_sql92(str(d["expression"]))
                except SelectorError as e:
                    log.warning("consumerFilter.json: %s of %s: %s", group, topic, e.remark)
                    continue
                born, dead = int(d.get("bornTime") or 0), int(d.get("deadTime") or 0)
                if dead == 0:
                    dead = max(now - 30_000, born)
                table.setdefault(str(topic), {})[str(group)] = ConsumerFilterData(
                    str(group), str(topic), str(d["expression"]), str(d.get("expressionType") or SQL92), compiled,
                    born, int(d.get("clientVersion") or 0), bloom, dead)
        self._by_topic = table
        return sum(len(g) for g in table.values())

    # --- lookups ------------------------------------------------------------------------------------
    def get(self, topic: str, group: str) -> ConsumerFilterData | None:
        return self._by_topic.get(topic, {}).get(group)

    def of_topic(self, topic: str) -> list[ConsumerFilterData]:
        return list(self._by_topic.get(topic, {}).values())

    def topics(self) -> list[str]:
        return list(self._by_topic)

    # --- bit maps (CommitLogDispatcherCalcBitMap) ---------------------------------------------------------
    def bit_maps(self, topic: str, props_list: list[dict]) -> list[bytes] | None:
        """The bit map of each message of the topic (None: no group filters this topic): each group's bits
        set where its selector is TRUE, evaluated over the batch (each distinct property combination once)."""
        datas = [d for d in self.of_topic(topic) if d.bloom is not None and self.bloom.is_valid(d.bloom)]
        if not datas:
            return None
        maps = [self.bloom.empty() for _ in props_list]
        for d in datas:
            for bits, hit in zip(maps, d.compiled.matches_many(props_list)):
                if hit:
                    self.bloom.hash_to(d.bloom, bits)
        return [bytes(b) for b in maps]


class ExpressionMessageFilter:
    """The store's MessageFilter for an SQL92 subscription (RocketMQ's ExpressionMessageFilter): the bit map
    of the consume queue extension first (a miss skips the message without reading it), then the selector
    on the message's properties."""

    __slots__ = ("data", "compiled", "bloom", "_bloom_ok")

    def __init__(self, compiled: SqlExpression, data: ConsumerFilterData | None = None,
                 bloom: BloomFilter | None = None):
        self.compiled = compiled
        self.data = data
        self.bloom = bloom
        self._bloom_ok = data is not None and bloom is not None and bloom.is_valid(data.bloom)

    def is_matched_by_consume_queue(self, tags_code) -> bool:
        return True

    def cq_ext_mask(self, store_times, bit_maps, has_bit_map):
        """Which units must be read (numpy bool array): all but those whose bit map, computed after the group
        registered and of the bloom filter's length, misses the group's bits."""
        import numpy as np
        n = len(store_times)
        if not self._bloom_ok or bit_maps is None or bit_maps.shape[1] * 8 != self.data.bloom.bit_num:
            return np.ones(n, dtype=bool)
        hit = np.ones(n, dtype=bool)
        for p in self.data.bloom.bit_pos:
            hit &= (bit_maps[:, p >> 3] & (1 << (p & 7))) != 0
        return hit | ~has_bit_map | (store_times <= self.data.born_time)

    def is_matched_by_commit_log(self, msg) -> bool:
        return self.compiled.matches_cached(msg.properties)
