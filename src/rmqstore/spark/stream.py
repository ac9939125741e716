"""spark.readStream.format("rocketmq"): micro-batches by consume queue offsets.

An offset is {broker: {topic: {queueId: next logical offset}}} (JSON-serialisable, as Spark checkpoints
it). latestOffset() reads how far each selected queue goes now (the consume queues of a store open in
another process; a store nobody has open reads as after recovery, see storeview), caps the batch with
maxOffsetsPerTrigger (ReadMaxRows, shared among the queues in proportion to what each has), and a
micro-batch reads [start, end) of every queue: the same logical offsets whatever process wrote the store
meanwhile, so a restart from a checkpoint neither loses nor repeats a message. Queues that appear later
start at their earliest offset.
"""
from __future__ import annotations

import logging

from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

from . import options as O
from . import storeview as SV
from .plan import load_views, queue_partitions, resolve_start, selected_queues
from .scan import read_partition

log = logging.getLogger(__name__)


def _key(q: int) -> str:
    return str(q)


def split_limit(avail: dict[tuple, int], max_rows: int) -> dict[tuple, int]:
    """How many rows each queue may give when max_rows must be shared: in proportion to what each has
    (largest remainders first), every row accounted for, never more than a queue has."""
    total = sum(avail.values())
    if total <= max_rows:
        return dict(avail)
    out = {k: v * max_rows // total for k, v in avail.items()}
    left = max_rows - sum(out.values())
    rema = sorted(avail, key=lambda k: (-(avail[k] * max_rows % total), k))
    for k in rema:
        if left <= 0:
            break
        if out[k] < avail[k]:
            out[k] += 1
            left -= 1
    return out


class RocketMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict):
        self.ro = O.parse(options, streaming=True)
        self._target: dict | None = None

    # --- offsets ------------------------------------------------------------------------------------
    def _views(self) -> list[SV.StoreView]:
        return load_views(self.ro, [], topics=self.ro.topics)

    def _current(self) -> tuple[dict, dict]:
        """(end offsets, min offsets) of the selected queues now."""
        ends: dict = {}
        mins: dict = {}
        for view in self._views():
            for qv in selected_queues(self.ro, [], view):
                ends.setdefault(view.broker, {}).setdefault(qv.topic, {})[_key(qv.queue_id)] = qv.end
                mins.setdefault(view.broker, {}).setdefault(qv.topic, {})[_key(qv.queue_id)] = qv.min_offset
        return ends, mins

    def initialOffset(self) -> dict:
        out: dict = {}
        for view in self._views():
            cache = SV.FileCache()
            try:
                for qv in selected_queues(self.ro, [], view):
                    off = resolve_start(self.ro, view, qv, cache, default="latest")
                    off = min(max(off, qv.min_offset), qv.end)
                    out.setdefault(view.broker, {}).setdefault(qv.topic, {})[_key(qv.queue_id)] = off
            finally:
                cache.close()
        return out

    def getDefaultReadLimit(self):
        n = self.ro.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target, _ = self._current()

    def latestOffset(self, start: dict, limit) -> dict:
        ends, mins = self._current()
        if self._target is not None:
            ends = {b: {t: {q: min(v, self._target.get(b, {}).get(t, {}).get(q, v)) for q, v in qm.items()}
                        for t, qm in tm.items()} for b, tm in ends.items()}
        # rows available per queue
        avail = {}
        for b, tm in ends.items():
            for t, qm in tm.items():
                for q, e in qm.items():
                    s = _get(start, b, t, q)
                    if s is None:
                        s = _get(mins, b, t, q) or 0
                    avail[(b, t, q)] = max(e - s, 0)
        out = _copy(start)
        max_rows = getattr(limit, "max_rows", None)
        take = split_limit(avail, max_rows) if max_rows is not None else avail
        for (b, t, q), n in take.items():
            s = _get(start, b, t, q)
            if s is None:
                s = _get(mins, b, t, q) or 0
            out.setdefault(b, {}).setdefault(t, {})[q] = s + n
        return out

    # --- reading ------------------------------------------------------------------------------------
    def partitions(self, start: dict, end: dict):
        parts = []
        for view in self._views():
            tm = end.get(view.broker, {})
            ranges = []
            for qv in selected_queues(self.ro, [], view):
                e = tm.get(qv.topic, {}).get(_key(qv.queue_id))
                if e is None:
                    continue
                s = _get(start, view.broker, qv.topic, _key(qv.queue_id))
                if s is None:
                    s = qv.min_offset
                if s < qv.min_offset:
                    log.warning("%s %s/%d: offsets %d..%d were deleted from the store: skipped", view.broker,
                                qv.topic, qv.queue_id, s, qv.min_offset)
                    s = qv.min_offset
                if e > qv.end:
                    raise RuntimeError(f"{view.root}: queue {qv.topic}/{qv.queue_id} ends at {qv.end}, before the "
                                       f"offset {e} of the batch being read: the store was truncated (recovered "
                                       "after a crash?) since that offset was planned")
                if s < e:
                    ranges.append((qv, s, e))
            parts.extend(queue_partitions(view, ranges, [], self.ro.include_body, self.ro.rows_per_partition))
        return parts

    def read(self, partition):
        yield from read_partition(partition)

    def commit(self, end: dict) -> None:
        pass


def _get(offsets: dict, b: str, t: str, q: str):
    return offsets.get(b, {}).get(t, {}).get(q)


def _copy(offsets: dict) -> dict:
    return {b: {t: dict(qm) for t, qm in tm.items()} for b, tm in offsets.items()}
