"""Planning a read: which consume queue ranges, commitlog files or index hits each partition reads."""
from __future__ import annotations

import logging
import os
import struct

import numpy as np

from ..store.format import codec
from . import storeview as SV
from .loss import data_loss
from .options import OptionError, ReadOptions
from .pieces import MIN_PIECE_BYTES, cut_pieces
from .scan import Cond, Partition, StoreRef, int_range
from .viewcache import ViewCache

log = logging.getLogger(__name__)

PACK_BYTES = 64 << 20       # commitlog mode: files packed into one partition up to this many bytes
DEFAULT_PARTITIONS = 8      # partitions when the session's parallelism is unknown (not registered by register)
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


_VIEWS = ViewCache()         # views of stores nobody writes, kept while their files stay the same


def load_views(ro: ReadOptions, conds: list[Cond], *, topics: set[str] | None = None) -> list[SV.StoreView]:
    out = []
    for root, broker in zip(ro.paths, ro.brokers):
        if not _passes(conds, "broker", broker):
            continue
        out.append(_VIEWS.load(root, ro.config, topics))
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


def first_at_or_after_time(view: SV.StoreView, qv: SV.QueueView, ms: int, cache: SV.FileCache) -> int | None:
    """Kafka's offsetsForTimes: the first offset whose store time is >= ms, None when there is none."""
    lo, hi = qv.min_offset, qv.end
    if lo >= hi:
        return None
    off = _first_at_or_after(view, qv, lo, hi, ms, cache)
    return off if off < hi else None


def _below_min(ro: ReadOptions, view: SV.StoreView, qv: SV.QueueView, off: int, what: str) -> int:
    """A start before the queue's first offset: those messages are gone (failOnDataLoss decides)."""
    if off < qv.min_offset:
        data_loss(ro.fail_on_data_loss, f"{view.root}: queue {qv.topic}/{qv.queue_id}: {what} {off} is before the "
                  f"queue's first offset {qv.min_offset}: offsets {off}..{qv.min_offset - 1} were deleted",
                  qv.min_offset - off, ro.loss_counter)
        return qv.min_offset
    return off


def resolve_start(ro: ReadOptions, view: SV.StoreView, qv: SV.QueueView, cache: SV.FileCache,
                  default: str = "earliest") -> int:
    lo, hi = qv.min_offset, qv.end
    ts = ro.starting_ts
    if ts is None and ro.starting_by_ts is not None:
        ts = _spec_offset(ro.starting_by_ts, view.broker, qv.topic, qv.queue_id)
        if ts is None:
            return lo if default == "earliest" else hi
    if ts is not None:
        off = first_at_or_after_time(view, qv, ts, cache)
        if off is not None:
            return off
        if ro.ts_strategy == "latest":
            return hi
        raise OptionError(f"{view.root}: queue {qv.topic}/{qv.queue_id} has no message stored at or after {ts} "
                          "(startingTimestamp/startingOffsetsByTimestamp; option "
                          "startingOffsetsByTimestampStrategy=latest starts such queues at their end)")
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
    return _below_min(ro, view, qv, off, "startingOffsets")


def resolve_end(ro: ReadOptions, view: SV.StoreView, qv: SV.QueueView, cache: SV.FileCache) -> int:
    hi = qv.end
    ts = ro.ending_ts
    if ts is None and ro.ending_by_ts is not None:
        ts = _spec_offset(ro.ending_by_ts, view.broker, qv.topic, qv.queue_id)
    if ts is not None:
        off = first_at_or_after_time(view, qv, ts, cache)
        return hi if off is None else off          # Kafka: no such offset -> latest
    spec = ro.ending if ro.ending is not None else "latest"
    if spec == "latest":
        return hi
    off = _spec_offset(spec, view.broker, qv.topic, qv.queue_id)
    if off is None or off == -1:
        return hi
    return off


def check_spec_queues(ro: ReadOptions, views: list[SV.StoreView]) -> None:
    """Queues named in offset options must exist (Kafka fails on a partition it is not assigned): a queue
    named for one store must be in it, one named for every store in at least one of them."""
    have = {v.broker: set(v.queues) for v in views}
    anywhere = set().union(*have.values()) if have else set()
    loaded = {t for t, _ in anywhere}
    for name, spec in (("startingOffsets", ro.starting), ("endingOffsets", ro.ending),
                       ("startingOffsetsByTimestamp", ro.starting_by_ts),
                       ("endingOffsetsByTimestamp", ro.ending_by_ts)):
        if not isinstance(spec, dict):
            continue
        for b, tm in spec.items():
            queues = anywhere if b is None else have.get(b)
            if queues is None:
                continue
            for t, qm in tm.items():
                for q in qm:
                    if t in loaded and (t, q) not in queues:
                        where = f"store {b!r}" if b else "the store"
                        raise OptionError(f"option {name!r}: {where} has no queue {t}/{q} (queues of {t}: "
                                          f"{sorted(x for tt, x in queues if tt == t)})")


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
    """A batch read's [a, b) of the queue. A start after the end (startingOffsets past the queue's end, or
    an end before the start) fails the read, as Kafka's batch source fails ("Beginning offset ... is after
    the ending offset"): the offsets given are wrong, or the queue is not what they were taken from."""
    lo, hi = qv.min_offset, qv.end
    a = max(lo, resolve_start(ro, view, qv, cache))
    b = min(hi, resolve_end(ro, view, qv, cache))
    if a > b:
        raise OptionError(f"{view.root}: beginning offset {a} is after the ending offset {b} for queue "
                          f"{qv.topic}/{qv.queue_id} (its offsets: {lo}..{hi}): startingOffsets names an offset "
                          "past the queue's end or after endingOffsets, or the store is not the one the offsets "
                          "were taken from")
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


def target_partitions(ro: ReadOptions) -> int:
    """How many partitions a read is split into at least: the session's default parallelism (every core
    busy, as Spark's file sources split), DEFAULT_PARTITIONS when it is not known. More cost more: each
    partition is a Python task, ~80 ms of CPU on top of its rows here (BENCHMARKS.md)."""
    return ro.parallelism or DEFAULT_PARTITIONS


def partition_rows(ro: ReadOptions, total: int) -> int:
    """Rows per partition for a read of `total` rows: option rowsPerPartition, made smaller to give at least
    target_partitions partitions of MIN_ROWS or more, or (option minPartitions, as Kafka's) at least
    minPartitions."""
    if ro.min_partitions:
        return max(1, min(ro.rows_per_partition, -(-total // ro.min_partitions)))
    return max(1, min(ro.rows_per_partition, max(MIN_ROWS, -(-total // target_partitions(ro)))))


def queue_partitions(view: SV.StoreView, ranges: list[tuple[SV.QueueView, int, int]], conds: list[Cond],
                     include_body: bool, rows_per_partition: int) -> list[Partition]:
    """Slices of at most rows_per_partition units, packed into partitions of about that many rows."""
    ref = StoreRef.of(view)
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
                    cl_hi: int | None = None) -> list[tuple[int, str, int, int, bool]]:
    """(base, path, start position, limit, False) of each file's part in [start, data end) and [cl_lo, cl_hi):
    pieces.py's pieces, each a whole file's part."""
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
        out.append((f.base, f.path, max(start - f.base, 0), limit, False))
    return out


def data_tail(view: SV.StoreView) -> int | None:
    """The base of the last commitlog file that starts with a record, for a store read as it is (remote, or
    open in another process: no recovery told where its data ends); the files after it hold nothing (RocketMQ
    allocates the next file ahead: a copy of a running broker has one, all zeros). None when recovery set
    data_end, or when no file starts with a record."""
    if view.data_end is not None:
        return None
    for f in reversed(view.cl_files):
        if view.fs is not None:
            head = view.fs.read(f.path, 0, 8).tobytes()
        else:
            with open(f.path, "rb") as fh:
                head = os.pread(fh.fileno(), 8, 0)
        if len(head) == 8:
            total, magic = struct.unpack(">iI", head)
            if total > 0 and magic in (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2, codec.BLANK_MAGIC_CODE):
                return f.base
    return None


def _pack_commitlog(view: SV.StoreView, items, conds, include_body, key=None, key_topics=None,
                    pack_bytes: int = PACK_BYTES) -> list[Partition]:
    ref = StoreRef.of(view)
    ref.tail_base = data_tail(view)
    if ref.tail_base is not None:           # the empty files after it: nothing to walk
        items = [it for it in items if it[0] <= ref.tail_base]
    parts, cur, size = [], [], 0
    for it in items:
        if cur and size + it[3] - it[2] > pack_bytes:
            parts.append(Partition("commitlog", ref, cur, conds, include_body, key, key_topics, rows=size))
            cur, size = [], 0
        cur.append(it)
        size += it[3] - it[2]
        if size >= pack_bytes:
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
    known = set(t for t, _ in view.queues) | set(SV.list_topics(view.root if view.fs is None else view.fs.uri))
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


def check_commitlog_gaps(ro: ReadOptions, view: SV.StoreView, conds: list[Cond]) -> None:
    """Commitlog files follow each other and hold what the consume queues point at: a missing middle file
    is data loss (failOnDataLoss decides), of as many messages as the read's queues lost with it
    (_lost_in); so are units past the end of a stopped local store's commitlog data (its last files
    missing, cut or zeroed: recovery drops those units)."""
    gaps = [(f.base + view.cl_file_size, g.base, f, g) for f, g in zip(view.cl_files, view.cl_files[1:])
            if g.base != f.base + view.cl_file_size]
    local = view.fs is None
    queues = selected_queues(ro, conds, view) if local and (gaps or not view.live) else []
    if gaps:
        lost = _lost_in(queues, [(a, b) for a, b, _, _ in gaps])
        for (a, b, f, g), n in zip(gaps, lost):
            data_loss(ro.fail_on_data_loss, f"{view.root}: commitlog offsets {a}..{b - 1} have no file (a "
                      f"commitlog file between {os.path.basename(f.path)} and {os.path.basename(g.path)} is missing"
                      + (f"; {n} messages of the read's queues were in it)" if n else ")"), n, ro.loss_counter)
    if local and not view.live and view.data_end is not None:
        past = {(qv.topic, qv.queue_id): int((qv.dropped_units()[:, 0] >= view.data_end).sum()) for qv in queues}
        past = {k: n for k, n in past.items() if n}
        if past:
            (t, q), n = next(iter(past.items()))
            data_loss(ro.fail_on_data_loss, f"{view.root}: the commitlog's data ends at offset {view.data_end}, but "
                      f"{sum(past.values())} consume queue units of the read's queues point past it (queue {t}/{q}: "
                      f"{n}; its last commitlog file(s) are missing, cut or zeroed)", sum(past.values()),
                      ro.loss_counter)


def _lost_in(queues: list[SV.QueueView], gaps: list[tuple[int, int]]) -> list[int]:
    """Messages of each queue lost with each commitlog range [a, b) of gaps (sorted): the units recovery
    dropped that point into it, or (when those are gone too) the filler units a local view's recovery put
    between the queue's last unit before a and its first after b in the units it re-dispatched (a queue's
    tail), whichever is more; fillers between two units with several gaps between them count for the first.
    A remote view is not recovered: its reads count the units that point into a missing file."""
    out = [0] * len(gaps)
    for qv in queues:
        t = qv.tail
        real = np.flatnonzero(t[:, 1] != SV.BLANK_SIZE) if len(t) else np.empty(0, np.int64)
        offs = t[real, 0] if len(t) else real
        seen = set()
        for k, (a, b) in enumerate(gaps):
            units = qv.dropped_units()[:, 0]
            dropped = int(((units >= a) & (units < b)).sum())
            filled = 0
            i, j = (int(x) for x in np.searchsorted(offs, [a, b]))
            if j < len(real) and (i, j) not in seen and j == i:     # no unit points into the gap itself
                seen.add((i, j))
                filled = int(real[j]) - (int(real[i - 1]) if i > 0 else -1) - 1
            out[k] += max(dropped, filled)
    return out


def _queue_ranges(ro: ReadOptions, conds: list[Cond], view: SV.StoreView) -> list[tuple[SV.QueueView, int, int]]:
    cache = SV.FileCache()
    try:
        ranges = []
        for qv in selected_queues(ro, conds, view):
            a, b = queue_range(ro, conds, view, qv, cache)
            if a < b:
                ranges.append((qv, a, b))
        return ranges
    finally:
        cache.close()


def plan_batch(ro: ReadOptions, conds: list[Cond]) -> list[Partition]:
    parts: list[Partition] = []
    load_topics = topics_to_load(ro, conds) if ro.key is None and ro.mode == "queue" else None
    views = load_views(ro, conds, topics=load_topics)
    check_spec_queues(ro, views)
    queue_reads = []
    for view in views:
        for note in view.notes:
            log.warning("%s", note)
        check_commitlog_gaps(ro, view, conds)
        if ro.key is not None:
            parts.extend(key_partitions(ro, conds, view))
        elif ro.mode == "commitlog":
            cl_lo, cl_hi = int_range(conds, "commitLogOffset")
            items = commitlog_items(view, 0, cl_lo, cl_hi)
            want = ro.min_partitions or target_partitions(ro)
            items = cut_pieces(view, items, want, 1 if ro.min_partitions else MIN_PIECE_BYTES)
            total = sum(it[3] - it[2] for it in items)
            parts.extend(_pack_commitlog(view, items, conds, ro.include_body,
                                         pack_bytes=min(PACK_BYTES, max(1, -(-total // want)))))
        else:
            queue_reads.append((view, _queue_ranges(ro, conds, view)))
    per = partition_rows(ro, sum(b - a for _, ranges in queue_reads for _, a, b in ranges))
    for view, ranges in queue_reads:
        parts.extend(queue_partitions(view, ranges, conds, ro.include_body, per))
    selection = (ro.topics, ro.pattern, ro.queue_ids, ro.assign)
    for p in parts:
        p.fail_on_data_loss, p.check_crc, p.loss_counter = ro.fail_on_data_loss, ro.check_crc, ro.loss_counter
        p.columns, p.selector = ro.columns, ro.selector
        if p.kind != "queue" and selection != (None, None, None, None):
            p.selection = selection     # a commitlog walk (or a key's index hits) meets every queue: the options select rows
    return parts
