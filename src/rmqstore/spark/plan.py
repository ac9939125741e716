"""Planning a read: which consume queue ranges, commitlog files or index hits each partition reads."""
from __future__ import annotations

import logging
import os

import numpy as np

from . import storeview as SV
from .options import ReadOptions
from .scan import Cond, Partition, StoreRef, int_range

log = logging.getLogger(__name__)

PACK_BYTES = 64 << 20       # commitlog mode: files packed into one partition up to this many bytes
MIN_ROWS = 10_000           # queue mode: partitions are not made smaller than this to get more of them


def _topic_conds(conds: list[Cond]) -> set[str] | None:
    """Topics the pushed topic filters allow (None: any)."""
    allowed = None
    for c in conds:
        if c.col == "topic" and c.op in ("eq", "in"):
            vals = {c.value} if c.op == "eq" else set(c.value)
            allowed = vals if allowed is None else (allowed & vals)
    return allowed


def _passes(conds: list[Cond], col: str, value) -> bool:
    return all(c.test_scalar(value) for c in conds if c.col == col)


def topics_to_load(ro: ReadOptions, conds: list[Cond]) -> set[str] | None:
    t = set(ro.topics) if ro.topics is not None else None
    tc = _topic_conds(conds)
    if tc is not None:
        t = tc if t is None else (t & tc)
    return t


def load_views(ro: ReadOptions, conds: list[Cond], *, topics: set[str] | None = None) -> list[SV.StoreView]:
    out = []
    for root, broker in zip(ro.paths, ro.brokers):
        if not _passes(conds, "broker", broker):
            continue
        out.append(SV.load_view(root, ro.config, topics=topics))
    return out


def selected_queues(ro: ReadOptions, conds: list[Cond], view: SV.StoreView) -> list[SV.QueueView]:
    allowed = _topic_conds(conds)
    out = []
    for (t, q), qv in sorted(view.queues.items()):
        if not ro.queue_selected(t, q):
            continue
        if allowed is not None and t not in allowed:
            continue
        if not _passes(conds, "queueId", q) or not _passes(conds, "topic", t):
            continue
        out.append(qv)
    return out


def _spec_offset(spec, broker: str, topic: str, qid: int) -> int | None:
    if not isinstance(spec, dict):
        return None
    for b in (broker, None):
        m = spec.get(b)
        if m and topic in m and qid in m[topic]:
            return m[topic][qid]
    return None


def resolve_start(ro: ReadOptions, view: SV.StoreView, qv: SV.QueueView, cache: SV.FileCache,
                  default: str = "earliest") -> int:
    lo, hi = qv.min_offset, qv.end
    if ro.starting_ts is not None:
        return SV.offset_by_time(view, qv, ro.starting_ts, cache)
    spec = ro.starting if ro.starting is not None else default
    if spec == "earliest":
        return lo
    if spec == "latest":
        return hi
    off = _spec_offset(spec, view.broker, qv.topic, qv.queue_id)
    if off is None or off == -2:
        return lo
    if off == -1:
        return hi
    return off


def resolve_end(ro: ReadOptions, view: SV.StoreView, qv: SV.QueueView, cache: SV.FileCache) -> int:
    hi = qv.end
    if ro.ending_ts is not None:
        return SV.offset_by_time(view, qv, ro.ending_ts, cache)
    spec = ro.ending if ro.ending is not None else "latest"
    if spec == "latest":
        return hi
    off = _spec_offset(spec, view.broker, qv.topic, qv.queue_id)
    if off is None or off == -1:
        return hi
    return off


def _first_at_or_after(view: SV.StoreView, qv: SV.QueueView, a: int, b: int, ms: int, cache: SV.FileCache,
                       strict: bool = False) -> int:
    """First logical offset in [a, b) whose store time is >= ms (> ms if strict), by binary search: assumes
    store times do not decrease along the queue (RocketMQ's lookup by time assumes it too). Returns a when
    a unit cannot be read (no narrowing)."""
    lo, hi = a, b
    while lo < hi:
        mid = (lo + hi) // 2
        o, s = qv.units(mid, mid + 1)
        if not len(o) or s[0] <= 0 or s[0] == SV.BLANK_SIZE:
            return a
        t = view.store_time(cache, int(o[0]), int(s[0]))
        if t < 0:
            return a
        if t > ms or (not strict and t == ms):
            hi = mid
        else:
            lo = mid + 1
    return lo


def queue_range(ro: ReadOptions, conds: list[Cond], view: SV.StoreView, qv: SV.QueueView,
                cache: SV.FileCache) -> tuple[int, int]:
    lo, hi = qv.min_offset, qv.end
    a = max(lo, resolve_start(ro, view, qv, cache))
    b = min(hi, resolve_end(ro, view, qv, cache))
    qa, qb = int_range(conds, "queueOffset")
    if qa is not None:
        a = max(a, qa)
    if qb is not None:
        b = min(b, qb)
    ta, tb = int_range(conds, "storeTimestamp", 1000)
    if a < b and ta is not None:
        a = _first_at_or_after(view, qv, a, b, ta, cache)
    if a < b and tb is not None:
        b = _first_at_or_after(view, qv, a, b, tb, cache)     # first with time >= tb (tb exclusive)
    return a, b


def queue_partitions(view: SV.StoreView, ranges: list[tuple[SV.QueueView, int, int]], conds: list[Cond],
                     include_body: bool, rows_per_partition: int, min_partitions: int = 8) -> list[Partition]:
    """Slices of at most rows_per_partition units, packed into partitions of about that many rows (fewer
    rows when that gives at least min_partitions partitions of MIN_ROWS or more)."""
    ref = StoreRef.of(view)
    total = sum(b - a for _, a, b in ranges)
    rows_per_partition = max(1, min(rows_per_partition, max(MIN_ROWS, -(-total // min_partitions))))
    parts: list[Partition] = []
    items: list = []
    rows = 0
    for qv, a, b in ranges:
        while a < b:
            take = min(b - a, rows_per_partition - rows)
            items.append((qv.slim(a, a + take), a, a + take))
            rows += take
            a += take
            if rows >= rows_per_partition:
                parts.append(Partition("queue", ref, items, conds, include_body, rows=rows))
                items, rows = [], 0
    if items:
        parts.append(Partition("queue", ref, items, conds, include_body, rows=rows))
    return parts


def commitlog_items(view: SV.StoreView, start: int = 0, cl_lo: int | None = None,
                    cl_hi: int | None = None) -> list[tuple[int, str, int, int]]:
    """(base, path, start position, limit) of each file's part in [start, data end) and [cl_lo, cl_hi)."""
    out = []
    end = view.data_end
    for f in view.cl_files:
        fend = f.base + f.size
        limit = f.size if end is None else min(f.size, end - f.base)
        if limit <= 0 or fend <= start:
            continue
        if cl_hi is not None and f.base >= cl_hi:
            continue
        if cl_lo is not None and f.base + limit <= cl_lo:
            continue
        out.append((f.base, f.path, max(start - f.base, 0), limit))
    return out


def _pack_commitlog(view: SV.StoreView, items, conds, include_body, key=None, key_topics=None) -> list[Partition]:
    ref = StoreRef.of(view)
    parts, cur, size = [], [], 0
    for it in items:
        cur.append(it)
        size += it[3] - it[2]
        if size >= PACK_BYTES:
            parts.append(Partition("commitlog", ref, cur, conds, include_body, key, key_topics, rows=size))
            cur, size = [], 0
    if cur:
        parts.append(Partition("commitlog", ref, cur, conds, include_body, key, key_topics, rows=size))
    return parts


def key_partitions(ro: ReadOptions, conds: list[Cond], view: SV.StoreView) -> list[Partition]:
    """find_messages_by_key over the view: index hits below the index's end, a scan of the records after it
    (those recovery would index again), both checked for topic and key."""
    cfg = view.config
    if not cfg.message_index_enable:
        return []
    if view.live:
        cache = SV.FileCache()
        try:
            view.index_end = SV._recover_index(view, cache, None, destroy=False, deep=False)
        finally:
            cache.close()
    SV.index_geometry(view)         # a key lookup needs the index geometry: fails here, naming 'config'
    known = set(t for t, _ in view.queues) | set(SV.list_topics(view.root))
    topics = set(ro.topics) if ro.topics is not None else {t for t in known if ro.topic_selected(t)}
    allowed = _topic_conds(conds)
    if allowed is not None:
        topics &= allowed
    key_topics = frozenset(topics)
    ref = StoreRef.of(view)
    hits: list[int] = []
    for t in sorted(topics):
        hits.extend(SV.index_candidates(view, t, ro.key))
    parts = []
    if hits:
        parts.append(Partition("offsets", ref, sorted(set(hits)), conds, ro.include_body, ro.key, key_topics,
                               rows=len(hits)))
    items = commitlog_items(view, start=view.index_end)
    parts.extend(_pack_commitlog(view, items, conds, ro.include_body, ro.key, key_topics))
    return parts


def plan_batch(ro: ReadOptions, conds: list[Cond]) -> list[Partition]:
    parts: list[Partition] = []
    load_topics = topics_to_load(ro, conds) if ro.key is None and ro.mode == "queue" else None
    for view in load_views(ro, conds, topics=load_topics):
        for note in view.notes:
            log.warning("%s", note)
        if ro.key is not None:
            parts.extend(key_partitions(ro, conds, view))
            continue
        if ro.mode == "commitlog":
            cl_lo, cl_hi = int_range(conds, "commitLogOffset")
            items = commitlog_items(view, 0, cl_lo, cl_hi)
            parts.extend(_pack_commitlog(view, items, conds, ro.include_body))
            continue
        cache = SV.FileCache()
        try:
            ranges = []
            for qv in selected_queues(ro, conds, view):
                a, b = queue_range(ro, conds, view, qv, cache)
                if a < b:
                    ranges.append((qv, a, b))
        finally:
            cache.close()
        parts.extend(queue_partitions(view, ranges, conds, ro.include_body, ro.rows_per_partition))
    return parts
