"""The dispatcher (RocketMQ's ReputMessageService): reads the commitlog behind the writer and builds the
consume queues and the index from it.

It reads from `reput_from_offset` in chunks, parses every whole record of a chunk in one pass, and hands
the batch to the consume queues (only non-transactional and committed messages) and to the index
(everything but rolled-back messages). An END_OF_FILE blank record moves it to the next file. Listeners
registered with `add_listener` are told which queues received messages (the long-polling wake-up).

Records the columnar put path wrote in this process come with their columns (CommitLog.dispatch_hints,
the same DispatchBatch the parser would make of them): when the reput offset is where such a batch
starts and its bytes are readable, it is dispatched without reading the records back. Anything else
(another writer's records, batches written while the dispatcher was DISPATCH_HINTS_MAX batches behind,
recovery) is parsed, up to the next hinted batch.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

import numpy as np

from . import codec
from .commit_log import CommitLog
from .config import StoreConfig
from .consume_queue import ConsumeQueueTable

log = logging.getLogger(__name__)

CHUNK = 4 << 20
SMALL_ROUND = 32        # messages: after a round of fewer, the dispatcher rests 1 ms
_II = codec._II
_TRAN_MASK = codec.TRANSACTION_TYPE_MASK
_PREPARED = codec.TRANSACTION_PREPARED_TYPE
_ROLLBACK = codec.TRANSACTION_ROLLBACK_TYPE

ArrivalListener = Callable[[str, int, int, int], None]  # topic, queue id, next logical offset, store time


class Dispatcher:
    def __init__(self, commit_log: CommitLog, consume_queues: ConsumeQueueTable, index_service, config: StoreConfig):
        self.commit_log = commit_log
        self.consume_queues = consume_queues
        self.index_service = index_service if config.message_index_enable else None
        self.config = config
        self.delay_levels = config.delay_levels_ms()
        self.chunk = max(CHUNK, 2 * config.max_message_size)
        self.reput_from_offset = 0
        self.last_dispatched_timestamp = 0
        self.dispatched_messages = 0
        self.hinted_messages = 0        # of those, how many came with the writer's columns (not parsed)
        self.error: str | None = None
        self.write_error: str | None = None     # the last failed write of a consume queue or index file
        self.on_progress: Callable[[int, int], None] | None = None   # (offset reached, commitlog end)
        # told the reput offset after each step: everything below it is written to the queues and index
        self.on_dispatched: Callable[[int], None] | None = None
        self._listeners: list[ArrivalListener] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()   # one pump at a time (thread or synchronous caller)
        self._idle = threading.Condition()

    # --- hooks ----------------------------------------------------------------------------------
    def add_listener(self, fn: ArrivalListener) -> None:
        self._listeners.append(fn)

    def remove_listener(self, fn: ArrivalListener) -> None:
        try:
            self._listeners.remove(fn)
        except ValueError:
            pass

    def wakeup(self) -> None:
        if not self._wake.is_set():     # set() takes the event's lock: not once per put when already set
            self._wake.set()

    def dispatch_behind_bytes(self) -> int:
        return max(0, self.commit_log.get_max_offset() - self.reput_from_offset)

    # --- the pump -------------------------------------------------------------------------------
    def do_reput(self, until: int | None = None) -> int:
        """Dispatch every whole record readable now (or up to `until`); returns how many messages."""
        with self._lock:
            n = self._reput(until)
        if n:
            with self._idle:
                self._idle.notify_all()
        return n

    def _reput(self, until: int | None) -> int:
        cl = self.commit_log
        total = 0
        while True:
            end = cl.get_max_offset() if until is None else min(until, cl.get_max_offset())
            reput = self.reput_from_offset
            if reput >= end:
                return total
            hints = cl.dispatch_hints
            if hints:
                hint = hints.pop(reput, None)
                if hint is not None:
                    hint_end = int(hint.offsets[-1] + hint.sizes[-1])
                    if hint_end <= end:     # the writer's own columns for the records at reput: no parse
                        self.dispatch(hint)
                        self.hinted_messages += len(hint)
                        total += len(hint)
                        self._advance(hint_end, end)
                        continue
                    hints[reput] = hint     # not all readable yet (a write buffer not committed)
            min_off = cl.get_min_offset()
            if reput < min_off:
                log.warning("reput offset %d below the commitlog's min offset %d: skipping deleted files",
                            reput, min_off)
                self.reput_from_offset = min_off
                continue
            # parse up to the next hinted batch at most, to take the hints up again from there
            want = self.chunk
            if hints:
                keys = list(hints)      # one C call: the writer may add hints meanwhile
                ahead = [k for k in keys if k > reput]
                if ahead:
                    want = min(want, min(ahead) - reput)
                for k in keys:
                    if k < reput:       # a batch written after an earlier round listed the hints, and parsed
                        hints.pop(k, None)      # in that round's chunk: never to be taken
            got = cl.get_data(reput, want)
            if got is None or not got[0]:
                return total
            data, start = got
            n, next_offset, err = self._parse_and_dispatch(data, start, len(data) < want)
            total += n
            if err is not None:
                if self.error != err:
                    log.error("dispatch stopped: %s", err)
                self.error = err
                cl.dispatch_hints = None        # nothing past the error is dispatched: writers must not wait
                return total
            if next_offset == self.reput_from_offset:
                return total
            self._advance(next_offset, end)

    def _advance(self, offset: int, end: int) -> None:
        """Everything below offset is dispatched: move the reput offset there and tell the hooks."""
        self.reput_from_offset = offset
        if self.on_dispatched is not None:
            self.on_dispatched(offset)
        if self.on_progress is not None:
            base = max(self.commit_log.get_min_offset(), 0)
            self.on_progress(offset - base, end - base)

    def _parse_and_dispatch(self, data: bytes, start: int, at_read_end: bool) -> tuple[int, int, str | None]:
        """Parse the records of one chunk; returns (messages dispatched, next offset, error)."""
        batch, pos, outcome, reason = codec.parse_dispatch(data, start, at_read_end, self.delay_levels)
        if len(batch):
            self.dispatch(batch)
        err = None
        next_offset = start + pos
        if outcome == codec.PARSE_BLANK:
            next_offset = self.commit_log.roll_next_file(start + pos)
        elif outcome == codec.PARSE_ERROR:
            err = str(self.commit_log.corrupt(start + pos, reason))
        elif outcome == codec.PARSE_END and at_read_end:
            err = str(self.commit_log.corrupt(start + pos, "zero bytes inside the written part of the commitlog"))
        return len(batch), next_offset, err

    def dispatch(self, batch: codec.DispatchBatch | list[codec.DispatchRequest]) -> None:
        """Feed parsed records to the consume queues (grouped per queue, in order) and the index, then
        tell listeners which queues grew."""
        if isinstance(batch, list):
            if len(batch) < 64:
                self._dispatch_requests(batch)
                return
            batch = codec.DispatchBatch.from_requests(batch)
        n = len(batch)
        if not n:
            return
        tran = batch.sys_flags & _TRAN_MASK
        idx = np.flatnonzero((tran != _PREPARED) & (tran != _ROLLBACK))
        grown: list[tuple[str, int, int]] = []
        if len(idx):
            group = batch.topic_ids[idx] * (1 << 32) + (batch.queue_ids[idx] & 0xFFFFFFFF)
            order = np.argsort(group, kind="stable")
            sidx = idx[order]
            cuts = np.flatnonzero(np.diff(group[order])) + 1
            names = batch.topic_names
            find = self.consume_queues.find_or_create
            for part in np.split(sidx, cuts):
                i0 = int(part[0])
                topic, qid = names[int(batch.topic_ids[i0])], int(batch.queue_ids[i0])
                qoffs = batch.queue_offsets[part]
                find(topic, qid).put_arrays(batch.offsets[part], batch.sizes[part], batch.tags_codes[part], qoffs)
                grown.append((topic, qid, int(qoffs[-1]) + 1))
        if self.index_service is not None:
            self.index_service.build_index_columns(batch.topics, batch.keys, batch.uniq_keys, batch.offsets,
                                                   batch.store_timestamps, batch.sys_flags)
        self._arrived(grown, int(batch.store_timestamps[-1]), n)

    def _dispatch_requests(self, reqs: list[codec.DispatchRequest]) -> None:
        """The same for a few records, without numpy's fixed costs."""
        if not reqs:
            return
        by_queue: dict[tuple[str, int], list] = {}
        for r in reqs:
            tran = r.sys_flag & _TRAN_MASK
            if tran != _PREPARED and tran != _ROLLBACK:
                by_queue.setdefault((r.topic, r.queue_id), []).append(
                    (r.commit_log_offset, r.msg_size, r.tags_code, r.consume_queue_offset))
        find = self.consume_queues.find_or_create
        grown = []
        for (topic, qid), units in by_queue.items():
            find(topic, qid).put_units(units)
            grown.append((topic, qid, units[-1][3] + 1))
        if self.index_service is not None:
            self.index_service.build_index_batch(reqs)
        self._arrived(grown, reqs[-1].store_timestamp, len(reqs))

    def _arrived(self, grown: list[tuple[str, int, int]], last_ts: int, n: int) -> None:
        self.last_dispatched_timestamp = last_ts
        self.dispatched_messages += n
        if self._listeners:
            for topic, qid, nxt in grown:
                for fn in list(self._listeners):
                    try:
                        fn(topic, qid, nxt, last_ts)
                    except Exception:  # a listener's bug must not stop dispatching
                        log.exception("arrival listener failed")

    # --- the thread -----------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        # columnar puts hand the thread their columns (not a synchronous do_reput: without the thread nobody
        # would take them, and writers would wait for it)
        self.commit_log.dispatch_hints = {}
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="ReputMessageService", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                n = self.do_reput()
                self.write_error = None
            except Exception as e:
                # a consume queue or index write failed (a full disk): tried again every 0.1 s; meanwhile
                # waiting for the dispatcher returns at once (write_error says why)
                why = f"dispatch at offset {self.reput_from_offset} failed: {e}"
                if why != self.write_error:
                    log.exception("dispatcher failed at offset %d", self.reput_from_offset)
                self.write_error = why
                with self._idle:
                    self._idle.notify_all()
                n = 0
                self._stop.wait(0.1)
            if n == 0:
                self._wake.wait(0.001 if self.error is None else 0.5)
                self._wake.clear()
            elif n < SMALL_ROUND:
                # a round of a few records (puts one at a time): rest 1 ms as RocketMQ's ReputMessageService
                # does, so that the next round takes many records instead of taking the GIL from the
                # producers (and from the SYNC_FLUSH group commit) once per put
                self._stop.wait(0.001)

    def wait_dispatched(self, offset: int | None = None, timeout: float = 10.0) -> bool:
        """Block until everything up to offset (default: the commitlog's end) is dispatched."""
        target = self.commit_log.get_max_offset() if offset is None else offset
        if self._thread is None:
            self.do_reput(target)
            return self.reput_from_offset >= target
        import time
        deadline = time.monotonic() + timeout
        with self._idle:
            while self.reput_from_offset < target and self.error is None and self.write_error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.set()
                self._idle.wait(min(left, 0.01))
        return self.reput_from_offset >= target

    def shutdown(self, drain: bool = True) -> None:
        if drain and self.error is None and self.write_error is None:
            self.wait_dispatched(timeout=30)
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.commit_log.dispatch_hints = None
