"""spark.readStream.format("rocketmq"): micro-batches by consume queue offsets.

An offset is {broker: {topic: {queueId: next logical offset}}} (JSON-serialisable, as Spark checkpoints
it). latestOffset() reads how far each selected queue goes now (the consume queues of a store open in
another process; a store nobody has open reads as after recovery, see storeview), caps the batch with
maxOffsetsPerTrigger (ReadMaxRows, shared among the queues in proportion to what each has), and a
micro-batch reads [start, end) of every queue: the same logical offsets whatever process wrote the store
meanwhile, so a restart from a checkpoint neither loses nor repeats a message. Queues that appear later
start at their earliest offset.

Kafka's stream options: minOffsetsPerTrigger with maxTriggerDelay (a trigger waits until that many
messages are there, or the delay has passed since the last batch), failOnDataLoss (offsets of the batch
deleted meanwhile: the query fails naming them, or skips them with a warning), endingTimestamp and
endingOffsets* rejected (a stream has no end).
"""
from __future__ import annotations

import logging
import time

from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

from . import options as O
from . import storeview as SV
from .loss import data_loss
from .plan import check_spec_queues, partition_rows, queue_partitions, resolve_start, selected_queues
from .scan import read_partition
from .viewcache import ViewCache

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
    def __init__(self, options: dict, loss_counter=None, parallelism: int | None = None):
        self.ro = O.parse(options, streaming=True)
        self.ro.loss_counter, self.ro.parallelism = loss_counter, parallelism
        self._target: dict | None = None
        self._cache = ViewCache()
        self._last_batch = time.monotonic()       # for maxTriggerDelay

    # --- offsets ------------------------------------------------------------------------------------
    def _views(self) -> list[SV.StoreView]:
        return [self._cache.load(root, self.ro.config, self.ro.topics) for root in self.ro.paths]

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
        views = self._views()
        check_spec_queues(self.ro, views)
        for view in views:
            cache = SV.FileCache()
            try:
                for qv in selected_queues(self.ro, [], view):
                    off = resolve_start(self.ro, view, qv, cache, default="latest")
                    if off > qv.end:     # Kafka's stream: the offset "was changed", data loss
                        data_loss(self.ro.fail_on_data_loss, f"{view.root}: queue {qv.topic}/{qv.queue_id}: "
                                  f"startingOffsets {off} is after the queue's end {qv.end}", 0, self.ro.loss_counter)
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
        if self._too_few(sum(avail.values())):
            return _copy(start)
        out = _copy(start)
        max_rows = getattr(limit, "max_rows", None)
        take = split_limit(avail, max_rows) if max_rows is not None else avail
        for (b, t, q), n in take.items():
            s = _get(start, b, t, q)
            if s is None:
                s = _get(mins, b, t, q) or 0
            out.setdefault(b, {}).setdefault(t, {})[q] = s + n
        return out

    def _too_few(self, available: int) -> bool:
        """minOffsetsPerTrigger: wait for more messages, unless maxTriggerDelay has passed since the last
        batch (or the query runs Trigger.AvailableNow, which reads what is there)."""
        need = self.ro.min_offsets_per_trigger
        if available <= 0:
            return False          # nothing to read: the offsets stay where they are
        if need is None or self._target is not None or available >= need:
            self._last_batch = time.monotonic()
            return False
        if (time.monotonic() - self._last_batch) * 1000 >= self.ro.max_trigger_delay_ms:
            self._last_batch = time.monotonic()
            return False
        return True

    # --- reading ------------------------------------------------------------------------------------
    def partitions(self, start: dict, end: dict):
        parts = []
        views = self._views()
        per = partition_rows(self.ro, sum(max(e - (_get(start, b, t, q) or 0), 0) for b, tm in end.items()
                                          for t, qm in tm.items() for q, e in qm.items()))
        for view in views:
            tm = end.get(view.broker, {})
            ranges = []
            for qv in selected_queues(self.ro, [], view):
                e = tm.get(qv.topic, {}).get(_key(qv.queue_id))
                if e is None:
                    continue
                s = _get(start, view.broker, qv.topic, _key(qv.queue_id))
                if s is None:
                    s = qv.min_offset
                if s < min(qv.min_offset, e):
                    data_loss(self.ro.fail_on_data_loss, f"{view.root}: queue {qv.topic}/{qv.queue_id}: offsets "
                              f"{s}..{min(qv.min_offset, e) - 1} of this batch were deleted from the store "
                              f"(its first offset is now {qv.min_offset})", min(qv.min_offset, e) - s,
                              self.ro.loss_counter)
                    s = qv.min_offset
                if e > qv.end:
                    data_loss(self.ro.fail_on_data_loss, f"{view.root}: queue {qv.topic}/{qv.queue_id} ends at "
                              f"{qv.end}, before the offset {e} of the batch being read: offsets {qv.end}..{e - 1} "
                              "are gone (the store was truncated, recovered after a crash?, since they were planned)",
                              e - qv.end, self.ro.loss_counter)
                    e = qv.end
                if s < e:
                    ranges.append((qv, s, e))
            parts.extend(queue_partitions(view, ranges, [], self.ro.include_body, per))
        for p in parts:
            p.fail_on_data_loss, p.check_crc, p.loss_counter = (self.ro.fail_on_data_loss, self.ro.check_crc,
                                                                self.ro.loss_counter)
            p.columns = self.ro.columns
        return parts

    def read(self, partition):
        yield from read_partition(partition)

    def commit(self, end: dict) -> None:
        pass


def _get(offsets: dict, b: str, t: str, q: str):
    return offsets.get(b, {}).get(t, {}).get(q)


def _copy(offsets: dict) -> dict:
    return {b: {t: dict(qm) for t, qm in tm.items()} for b, tm in offsets.items()}
