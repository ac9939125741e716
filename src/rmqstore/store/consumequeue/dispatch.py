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

Damage never stops it silently (rmqstore issue 15). A missing commitlog file (a gap between two files) is
skipped to the next file; a record that fails its checks, or zero bytes inside the written data, is
skipped by resynchronising on the next record that checks and chains (resync.next_valid_record); ranges
recovery skipped (`skip_ranges`) are skipped the same way. Each skip is a warning naming the file and
offsets and a Failure on the failure channel. Later records go to their queues at the queue offsets they
carry: queue offsets the lost records held are filled with filler units (offset 0, size CQ_BLANK_SIZE,
as RocketMQ fills a queue's first file), which read as removed messages. A record whose header passes the
record checks but claims what cannot be (a QUEUEOFFSET out of its queue's sequence, a SCHEDULE_TOPIC_XXXX
queue that is no delay level, a queue offset another queue's unit holds the record at: fields the body CRC
does not cover) gets no unit, is reported as CORRUPT_RECORD and its range skipped, so that no read answers
it as the message it no longer describes.
What cannot progress (a consume queue or index write failing) is a condition on the channel, and waiters
return at once with its reason.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import numpy as np

from ..format import codec, scanner
from ..format.scanner import Outcome
from ..commitlog.commit_log import CommitLog
from ..conf.config import StoreConfig
from .consume_queue import UNIT, ConsumeQueueTable
from ..state.failure import Failure, FailureChannel, FailureKind
from .dispatch_skip import DamageSkips

log = logging.getLogger(__name__)

CHUNK = 4 << 20
FILL_SLACK = 64        # queue offsets a jump may skip beyond what lost ranges hold: records misattributed by
                       # a damaged topic or queue id byte (a larger jump is a damaged QUEUEOFFSET)
MIN_RECORD_SIZE = codec.HEADER_V4.size + 4   # the smallest record: a 1-byte topic, no body, no properties
SMALL_ROUND = 32        # messages: after a round of fewer, the dispatcher rests 1 ms

ArrivalListener = Callable[[str, int, int, int], None]  # topic, queue id, next logical offset, store time
FILLER_UNIT = codec.CQ_UNIT.pack(0, codec.CQ_BLANK_SIZE, 0)
_STOPPED = "dispatch.stopped"       # failure channel condition keys
_WRITE = "dispatch.write"


class Dispatcher(DamageSkips):
    def __init__(self, commit_log: CommitLog, consume_queues: ConsumeQueueTable, index_service, config: StoreConfig,
                 failures: FailureChannel | None = None):
        self.commit_log = commit_log
        self.failures = failures if failures is not None else FailureChannel()
        # [start, end) commitlog ranges not to dispatch (damage recovery skipped), sorted, not overlapping
        self.skip_ranges: list[tuple[int, int]] = []
        self.skipped: list[Failure] = []       # every range this dispatcher skipped (gaps, damage)
        # deleted queues (deleted_queues.py): (topic, queue id) -> their records below it are never dispatched
        self.deleted: dict[tuple[str, int], int] = {}
        # queues a repair on the open store cut (recovery.repair_queues_live): the commitlog end to pass
        # before their rebuild is over (ConsumeQueue.rebuilding_to is cleared then)
        self.rebuilding: dict = {}
        # held while a batch's units are written, and by deleteTopic (queue_clean) while it removes queues:
        # no unit of a queue is written after the queue is deleted (taken after the put lock, never before)
        self.units_lock = threading.Lock()
        self.consume_queues = consume_queues
        self.index_service = index_service if config.message_index_enable else None
        self.config = config
        self.delay_levels = config.delay_levels_ms()
        # what a record may not claim of its queue beyond its sequence (QueueRule): damage, given no unit
        self._queue_rule = QueueRule(len(self.delay_levels), self._bad_header, consume_queues)
        self.chunk = max(CHUNK, 2 * config.max_message_size)
        self.reput_from_offset = 0
        self.last_dispatched_timestamp = 0
        self.dispatched_messages = 0
        self.hinted_messages = 0        # of those, how many came with the writer's columns (not parsed)
        self.written_while_stopping = False     # shutdown drained, then a racing put appended more
        # a slave's log (store/ha) may end inside a record, whose rest the master has not sent yet: a partial
        # record at the log's end is waited for, not damage
        self.tail_grows = False
        # a slave's (store/ha): told of a damaged record before it is skipped; True: not skipped, the dispatcher
        # waits there (the slave cuts its log at it and takes the master's bytes again)
        self.on_damage: Callable[[int, str], bool] | None = None
        self.on_progress: Callable[[int, int], None] | None = None   # (offset reached, commitlog end)
        # told the reput offset after each step: everything below it is written to the queues and index
        self.on_dispatched: Callable[[int], None] | None = None
        self.cq_ext = None      # consume_queue_ext.ConsumeQueueExtTable: units' tags codes become ext addresses
        self._listeners: list[ArrivalListener] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()   # one pump at a time (thread or synchronous caller)
        self._idle = threading.Condition()
        self._retries = 0               # attempts the thread made while a write error stood (wait_dispatched)

    # --- failure state (views of the failure channel) -----------------------------------------------
    @property
    def error(self) -> str | None:
        """Why dispatching stopped for good (None while it progresses)."""
        f = self.failures.condition(_STOPPED)
        return f.reason if f is not None else None

    @error.setter
    def error(self, why: str | None) -> None:
        if why is None:
            self.failures.clear_condition(_STOPPED)
        else:
            self.failures.raise_condition(_STOPPED, FailureKind.DISPATCH, why, offset=self.reput_from_offset)

    @property
    def write_error(self) -> str | None:
        """The last failed write of a consume queue or index file, while it keeps failing (retried)."""
        f = self.failures.condition(_WRITE)
        return f.reason if f is not None else None

    @write_error.setter
    def write_error(self, why: str | None) -> None:
        if why is None:
            self.failures.clear_condition(_WRITE)
        else:
            self.failures.raise_condition(_WRITE, FailureKind.DISPATCH, why, offset=self.reput_from_offset)

    def stuck_reason(self) -> str | None:
        """Why dispatching cannot progress now, or None."""
        return self.error or self.write_error

    def _fill(self, cq, upto: int, offset: int) -> None:
        """fill_queue, bounded by what the lost commitlog ranges (skipped, missing files) could hold; a jump
        past that is a damaged record header, reported on the failure channel."""
        lost = sum(b - a for a, b in self.skip_ranges) + sum(b - a for a, b in self.commit_log.queue.gaps)
        if not fill_queue(cq, upto, lost // MIN_RECORD_SIZE + FILL_SLACK):
            mf = self.commit_log.file_of(offset)
            self.failures.report(FailureKind.CORRUPT_RECORD, f"record claims queue offset {upto} of "
                                 f"{cq.topic}/{cq.queue_id}, {upto - cq.get_max_offset_in_queue()} past the "
                                 "queue's end, more than the lost commitlog ranges can hold: a damaged "
                                 "QUEUEOFFSET field; not filled",
                                 path=str(mf.path if mf is not None else self.commit_log.queue.store_path),
                                 offset=offset)

    def _bad_claim(self, cq, offset: int, size: int, claim: int) -> None:
        """A record out of its queue's sequence (claims_out_of_sequence): damage, reported and skipped."""
        self._bad_header(offset, size, f"record claims queue offset {claim} of {cq.topic}/{cq.queue_id}, out of "
                                       "the queue's sequence: a damaged QUEUEOFFSET field (or a record moved)")

    def _bad_header(self, offset: int, size: int, why: str) -> None:
        """A record whose header claims what cannot be (it gets no unit): damage, reported and skipped."""
        mf = self.commit_log.file_of(offset)
        self.add_skip_range(offset, offset + size)
        self.failures.report(FailureKind.CORRUPT_RECORD, f"{why}; no unit points at it",
                             path=str(mf.path if mf is not None else self.commit_log.queue.store_path),
                             offset=offset, end=offset + size)

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
            if self.rebuilding:
                self._end_rebuilds(reput, False)
            if reput >= end:
                return total
            hints = cl.dispatch_hints
            if hints:
                n = self._take_hint(hints, reput, end)
                if n:
                    total += n
                    continue
            min_off = cl.get_min_offset()
            if reput < min_off:
                if reput or not self.tail_grows:    # (a slave's log may start past 0: nothing was deleted)
                    log.warning("reput offset %d below the commitlog's min offset %d: skipping deleted files",
                                reput, min_off)
                self.reput_from_offset = min_off
                continue
            # parse up to the next hinted batch at most, to take the hints up again from there
            want = self.chunk
            if self.skip_ranges:
                skip_to, next_skip = self._skip_range_at(reput)
                if skip_to is not None:
                    self._advance(skip_to, end)
                    continue
                if next_skip is not None:
                    want = min(want, next_skip - reput)
            if hints:
                keys = list(hints)      # one C call: the writer may add hints meanwhile
                ahead = [k for k in keys if k > reput]
                if ahead:
                    want = min(want, min(ahead) - reput)
                for k in keys:
                    if k < reput:       # a batch written after an earlier round listed the hints, and parsed
                        hints.pop(k, None)      # in that round's chunk: never to be taken
            got = cl.get_data(reput, want)
            if got is None:
                nxt = self._skip_gap(reput)
                if nxt is None:
                    return total
                self._advance(nxt, end)
                continue
            if not got[0]:
                return total
            data, start = got
            # a slave's read that reached the log's end (as it was before the read) may end inside a record
            # whose rest is still on its way: not damage
            at_read_end = len(data) < want and not (self.tail_grows and start + len(data) >= end)
            n, next_offset, err = self._parse_and_dispatch(data, start, at_read_end)
            total += n
            if err is not None:
                if self.error != err:
                    log.error("dispatch stopped: %s", err)
                self.error = err
                cl.dispatch_hints = None        # nothing past the error is dispatched: writers must not wait
                self._end_rebuilds(next_offset, True)   # no more is coming: readers see the queues as they are
                return total
            if next_offset == self.reput_from_offset:
                return total
            self._advance(next_offset, end)

    def _end_rebuilds(self, reput: int, stopped: bool) -> None:
        for cq, until in list(self.rebuilding.items()):
            if stopped or reput >= until:
                cq.rebuilding_to = -1
                del self.rebuilding[cq]

    def _take_hint(self, hints: dict, reput: int, end: int) -> int:
        """Dispatch the writer's own columns for the records at reput if they are all readable: returns how
        many messages (0: no hint there, or not readable yet)."""
        hint = hints.pop(reput, None)
        if hint is None:
            return 0
        hint_end = int(hint.offsets[-1] + hint.sizes[-1])
        if hint_end > end:
            hints[reput] = hint     # not all readable yet (a write buffer not committed)
            return 0
        self.dispatch(hint)
        self.hinted_messages += len(hint)
        self._advance(hint_end, end)
        return len(hint)

    def _advance(self, offset: int, end: int) -> None:
        """Everything below offset is dispatched: move the reput offset there and tell the hooks."""
        self.reput_from_offset = offset
        if self.on_dispatched is not None:
            self.on_dispatched(offset)
        if self.on_progress is not None:
            base = max(self.commit_log.get_min_offset(), 0)
            self.on_progress(offset - base, end - base)

    def _parse_and_dispatch(self, data: bytes, start: int, at_read_end: bool) -> tuple[int, int, str | None]:
        """Parse the records of one chunk; returns (messages dispatched, next offset, error). A damaged
        record (or zeros inside the written data) is skipped up to where valid records resume."""
        batch, pos, outcome, reason = scanner.parse_dispatch(data, start, at_read_end, self.delay_levels)
        if len(batch):
            self.dispatch(batch)
        err = None
        next_offset = start + pos
        if outcome is Outcome.END_OF_FILE:
            left = self.commit_log.file_size - next_offset % self.commit_log.file_size
            if pos + 4 <= len(data) and codec._I.unpack_from(data, pos)[0] != left:
                outcome, reason = Outcome.INVALID, (f"an END_OF_FILE blank of {codec._I.unpack_from(data, pos)[0]} "
                                                    f"bytes where the file has {left} left")
            else:
                next_offset = self.commit_log.roll_next_file(start + pos)
        if outcome is Outcome.INVALID or (outcome is Outcome.END_OF_DATA
                                          and (at_read_end or pos + 8 <= len(data))):
            why = reason if outcome is Outcome.INVALID else "zero bytes inside the written part of the commitlog"
            if self.on_damage is not None and self.on_damage(start + pos, why):
                return len(batch), start + pos, None        # taken care of (a slave fetches it again): wait
            nxt = self._resync(start + pos, why)
            if nxt is None:
                err = str(self.commit_log.corrupt(start + pos, why))
            else:
                next_offset = nxt
        return len(batch), next_offset, err

    def dispatch(self, batch: codec.DispatchBatch | list[codec.DispatchRequest]) -> None:
        """Feed parsed records to the consume queues (grouped per queue, in order: put_columns /
        put_requests) and the index, then tell listeners which queues grew."""
        if self.cq_ext is not None:     # enableConsumeQueueExt: the units' tags codes become ext addresses
            batch = self.cq_ext.decorate(batch, self.consume_queues)
        if isinstance(batch, list):
            if not batch:
                return
            if len(batch) < 64:         # a few records: without numpy's fixed costs
                with self.units_lock:
                    grown = put_requests(self.consume_queues.find_or_create, batch, self._fill, self.deleted,
                                         self._bad_claim, self._queue_rule)
                if self.index_service is not None:
                    self.index_service.build_index_batch(batch)
                self._arrived(grown, batch[-1].store_timestamp, len(batch))
                return
            batch = codec.DispatchBatch.from_requests(batch)
        n = len(batch)
        if not n:
            return
        with self.units_lock:
            grown = put_columns(self.consume_queues.find_or_create, batch, self._fill, self.deleted,
                                self._bad_claim, self._queue_rule)
        if self.index_service is not None:
            self.index_service.build_index_columns(batch.topics, batch.keys, batch.uniq_keys, batch.offsets,
                                                   batch.store_timestamps, batch.sys_flags)
        self._arrived(grown, int(batch.store_timestamps[-1]), n)

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
                if self.failures.condition(_WRITE) is not None:
                    self.write_error = None     # the write that failed went through
                    with self._idle:
                        self._retries += 1
                        self._idle.notify_all()
                if n and self.failures.condition(_STOPPED) is not None:
                    self.error = None           # dispatching goes on again
            except Exception as e:
                # a consume queue or index write failed (a full disk): tried again every 0.1 s; meanwhile
                # waiting for the dispatcher returns at once (write_error says why)
                why = f"dispatch at offset {self.reput_from_offset} failed: {e}"
                if why != self.write_error:
                    log.exception("dispatcher failed at offset %d", self.reput_from_offset)
                self.write_error = why
                with self._idle:
                    self._retries += 1
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
        """Block until everything up to offset (default: the commitlog's end) is dispatched: True when it
        is, False at the timeout or when dispatching cannot progress (stuck_reason() and the failure channel
        say why): at once when it stopped for good, after the thread's next attempt (~0.1 s) when a consume
        queue or index write keeps failing. Never True while something below offset is not dispatched."""
        target = self.commit_log.get_max_offset() if offset is None else offset
        if self._thread is None:
            try:
                self.do_reput(target)
            except OSError as e:
                self.write_error = f"dispatch at offset {self.reput_from_offset} failed: {e}"
            return self.reput_from_offset >= target
        deadline = time.monotonic() + timeout
        retried = False
        with self._idle:
            while self.reput_from_offset < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if self.stuck_reason() is not None:
                    if self.error is not None or retried:
                        return False
                    # a write that failed is tried again within 0.1 s (_run): answer after that attempt, not
                    # from the last one's state (a full disk may have been freed since)
                    retried, seen = True, self._retries
                    self._wake.set()
                    # the attempt itself, however long a loaded machine keeps the thread from it
                    if not self._idle.wait_for(lambda: self._retries != seen, left):
                        return False
                    continue
                self._wake.set()
                self._idle.wait(min(left, 0.01))
        return self.reput_from_offset >= target

    def shutdown(self, drain: bool = True, timeout: float = 30.0) -> bool:
        """Stop the thread; with drain, first dispatch everything written (returns at once when that
        cannot progress). Returns True when everything written was dispatched."""
        drained = self.stuck_reason() is None and self.wait_dispatched(timeout=timeout) if drain else False
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.commit_log.dispatch_hints = None
        # drained, then more written: a put that was appending while the store closed
        self.written_while_stopping = drained and self.reput_from_offset < self.commit_log.get_max_offset()
        return drained and not self.written_while_stopping


Filler = Callable[[object, int, int], None]    # (consume queue, queue offset reached, commitlog offset)


def put_columns(find, batch: codec.DispatchBatch, fill: Filler,
                deleted: dict[tuple[str, int], int] | None = None,
                bad_claim: BadClaim | None = None, rule: QueueRule | None = None) -> list[tuple[str, int, int]]:
    """Write the units of a batch's dispatched records (scanner.is_dispatched) to their consume queues
    (find(topic, queue id) gives one), grouped per queue, in order. Each record keeps the queue offset it
    carries: where a queue's offsets jump ahead (records lost, or misattributed by a damaged topic / queue
    id byte), fill(cq, offset, commitlog offset) fills the gap first. Returns (topic, queue id, next
    queue offset) per queue that grew. deleted: a deleted queue's records below its offset are left out.
    A record whose QUEUEOFFSET is out of its queue's sequence (claims_out_of_sequence) gets no unit:
    bad_claim(cq, commitlog offset, size, queue offset) is told of it. Nor do the records of a queue no
    record can belong to (rule: a schedule topic queue that is no delay level), each told to rule.bad, nor
    a record another queue holds already (rule.moved)."""
    if rule is not None:
        rule.new_batch()
    idx = np.flatnonzero(scanner.is_dispatched(batch.sys_flags))
    grown: list[tuple[str, int, int]] = []
    if not len(idx):
        return grown
    group = batch.topic_ids[idx] * (1 << 32) + (batch.queue_ids[idx] & 0xFFFFFFFF)
    order = np.argsort(group, kind="stable")
    sidx = idx[order]
    cuts = np.flatnonzero(np.diff(group[order])) + 1
    names = batch.topic_names
    for part in np.split(sidx, cuts):
        i0 = int(part[0])
        topic, qid = names[int(batch.topic_ids[i0])], int(batch.queue_ids[i0])
        if deleted and (topic, qid) in deleted:
            part = part[batch.offsets[part] >= deleted[(topic, qid)]]
            if not len(part):
                continue
        why = rule.problem(topic, qid) if rule is not None else None
        if why is not None:
            rule.tell(topic, qid, batch.offsets[part].tolist(), batch.sizes[part].tolist(), why)
            continue
        new = rule is not None and rule.queues is not None and rule.queues.find(topic, qid) is None
        cq = find(topic, qid)
        keep = _in_sequence(cq, batch.offsets[part], batch.sizes[part], batch.queue_offsets[part], bad_claim)
        if keep is not None:
            part = part[keep]
        qoffs = batch.queue_offsets[part]
        runs = np.flatnonzero(np.diff(qoffs) > 1) + 1
        wrote = False
        for a, b in zip([0, *runs.tolist()], [*runs.tolist(), len(part)]):
            sel = part[a:b]
            # units the queue already has (a re-dispatch after recovery) are skipped, so they are no gap to
            # fill: only the first unit written is (after a topic was deleted and written again, the old
            # records' queue offsets lie far past the new queue's end, below its commitlog offsets)
            a += int(np.count_nonzero(batch.offsets[sel] + batch.sizes[sel] <= cq.max_physic_offset))
            while a < b and int(qoffs[a]) > cq.get_max_offset_in_queue() and rule is not None \
                    and rule.moved(cq, int(qoffs[a]), int(batch.offsets[part[a]]), int(batch.sizes[part[a]])):
                a += 1          # built into another queue, its header changed since: no unit
            if a == b:
                continue
            if int(qoffs[a]) > cq.get_max_offset_in_queue():
                fill(cq, int(qoffs[a]), int(batch.offsets[part[a]]))
            sel = part[a:b]
            cq.put_arrays(batch.offsets[sel], batch.sizes[sel], batch.tags_codes[sel], qoffs[a:b])
            wrote = True
        if wrote:
            grown.append((topic, qid, int(qoffs[-1]) + 1))
        elif new:
            rule.queues.remove(cq)      # made for records that got no unit: no queue
    return grown


def put_requests(find, reqs: list[codec.DispatchRequest], fill: Filler,
                 deleted: dict[tuple[str, int], int] | None = None,
                 bad_claim: BadClaim | None = None, rule: QueueRule | None = None) -> list[tuple[str, int, int]]:
    """put_columns for a few records as DispatchRequests."""
    if rule is not None:
        rule.new_batch()
    by_queue: dict[tuple[str, int], list] = {}
    dispatched = scanner.is_dispatched
    for r in reqs:
        if dispatched(r.sys_flag) and not (deleted and r.commit_log_offset < deleted.get((r.topic, r.queue_id), -1)):
            by_queue.setdefault((r.topic, r.queue_id), []).append(
                (r.commit_log_offset, r.msg_size, r.tags_code, r.consume_queue_offset))
    grown = []
    for (topic, qid), units in by_queue.items():
        why = rule.problem(topic, qid) if rule is not None else None
        if why is not None:
            rule.tell(topic, qid, [u[0] for u in units], [u[1] for u in units], why)
            continue
        new = rule is not None and rule.queues is not None and rule.queues.find(topic, qid) is None
        cq = find(topic, qid)
        keep = _in_sequence_few(cq, units, bad_claim)
        if keep is not None:
            units = [u for u, k in zip(units, keep.tolist()) if k]
        start = 0
        wrote = False
        for i in range(1, len(units) + 1):      # runs of consecutive queue offsets (see put_columns)
            if i == len(units) or units[i][3] > units[i - 1][3] + 1:
                while start < i and units[start][0] + units[start][1] <= cq.max_physic_offset:
                    start += 1          # already in the queue: no gap to fill (put_columns)
                while start < i and units[start][3] > cq.get_max_offset_in_queue() and rule is not None \
                        and rule.moved(cq, units[start][3], units[start][0], units[start][1]):
                    start += 1          # built into another queue (put_columns)
                if start < i:
                    if units[start][3] > cq.get_max_offset_in_queue():
                        fill(cq, units[start][3], units[start][0])
                    cq.put_units(units[start:i])
                    wrote = True
                start = i
        if wrote:
            grown.append((topic, qid, units[-1][3] + 1))
        elif new:
            rule.queues.remove(cq)      # (put_columns)
    return grown


BadClaim = Callable[[object, int, int, int], None]   # (consume queue, commitlog offset, size, queue offset)


class QueueRule:
    """What a record's header may not claim of its queue, beyond its queue offset's sequence
    (claims_out_of_sequence), for put_columns / put_requests; each record that claims it has a damaged
    header, gets no unit, and is told to bad(commitlog offset, size, why):
    - a queue no record can belong to (problem: scanner.queue_problem, a SCHEDULE_TOPIC_XXXX queue that is
      no delay level): one test per queue of a batch, never per record;
    - a queue offset past its queue's end (a new queue's first record past offset 0 too) while another
      queue (`queues`, the ConsumeQueueTable) holds the record at that offset already (moved: only where
      a queue jumps, which damage and lost ranges alone make happen)."""

    def __init__(self, delay_levels: int, bad: Callable[[int, int, str], None] | None = None, queues=None):
        self.delay_levels = delay_levels
        self.bad = bad
        self.queues = queues
        self._built: int | None = None      # the queues' highest unit end, taken once per batch (new_batch)

    def new_batch(self) -> None:
        self._built = None

    def problem(self, topic: str, queue_id: int) -> str | None:
        """Why no record can belong to topic/queue_id, or None. A queue the store holds already is no
        problem: a store written with more delay levels than messageDelayLevel has now keeps its records."""
        why = scanner.queue_problem(topic, queue_id, self.delay_levels)
        if why is not None and self.queues is not None and self.queues.find(topic, queue_id) is not None:
            return None
        return why

    def moved(self, cq, claim: int, offset: int, size: int) -> bool:
        """The record at commitlog offset `offset` claims queue offset `claim` of cq, past its end: True (told
        to bad) when the unit at `claim` of another queue of its topic (of its queue id, when its topic has no
        other queue: a damaged TOPIC) is this record's. That unit was written for it, from its header as it
        was: its QUEUEID or TOPIC changed since (a re-dispatch after recovery, over records already built)."""
        if self.queues is None:
            return False
        if self._built is None:
            self._built = self.queues.max_physic_offset()
        if offset >= self._built:       # no queue was built this far: no unit can be this record's
            return False
        table = self.queues.table
        others = [q for q in list(table.get(cq.topic, {}).values()) if q is not cq]
        if not others:
            others = [m[cq.queue_id] for t, m in list(table.items()) if t != cq.topic and cq.queue_id in m]
        for other in others:
            if other.max_physic_offset <= offset:
                continue
            unit = other.get_unit(claim)
            if unit is not None and unit[0] == offset:
                why = (f"the record claims queue offset {claim} of {cq.topic}/{cq.queue_id}, past the queue's end, "
                       f"while unit {claim} of {other.topic}/{other.queue_id} was written for it: a damaged QUEUEID "
                       "or TOPIC field")
                log.warning("%s: commitlog offset %d: %s: no unit written", cq.queue.store_path, offset, why)
                if self.bad is not None:
                    self.bad(offset, size, why)
                return True
        return False

    def tell(self, topic: str, queue_id: int, offsets: list[int], sizes: list[int], why: str) -> None:
        """The records (commitlog offsets, sizes) of such a queue get no unit: each is told to bad."""
        why = f"{why}: {scanner.DAMAGED_QUEUEID}"
        log.warning("%s/%d: %d records (first at commitlog offset %d) get no unit: %s", topic, queue_id,
                    len(offsets), offsets[0], why)
        if self.bad is not None:
            for off, size in zip(offsets, sizes):
                self.bad(off, size, why)


def claims_out_of_sequence(q: np.ndarray, before: int) -> np.ndarray:
    """Per record of one queue not yet in it (their QUEUEOFFSETs q, in commitlog order): True where the
    record continues neither its predecessor (before: the queue's last offset, -1 for an empty queue, whose
    first record is not judged on its left) nor is continued by its successor (the last record is not
    judged on its right). Such a claim is a damaged QUEUEOFFSET field (the body CRC does not cover it), or
    one of two records swapped in place: given a unit, it would answer at an offset that is not its own
    message's (or hide the message that is). Records lost with a damaged range make a jump that the next
    record continues: not flagged."""
    n = len(q)
    if n == 0 or (q[0] == before + 1 and (n == 1 or bool((np.diff(q) == 1).all()))):
        return np.zeros(n, dtype=bool)     # the common case: every claim in sequence
    step = np.diff(q) == 1
    left = np.concatenate(([before < 0 or int(q[0]) == before + 1], step))
    right = np.concatenate((step, [True]))
    return ~left & ~right


def _in_sequence(cq, offs: np.ndarray, sizes: np.ndarray, claims: np.ndarray,
                 bad_claim: BadClaim | None) -> np.ndarray | None:
    """Which of a queue's records (commitlog order) may get a unit: None for all, else a mask leaving out
    those claims_out_of_sequence flags among the ones not built yet (each told to bad_claim). The queue's
    last unit is judged too, by the first record not built (_judge_last_unit)."""
    built = int(np.count_nonzero(offs + sizes <= cq.max_physic_offset))    # a prefix: re-dispatched
    if built == len(claims):
        return None
    bad = claims_out_of_sequence(claims[built:], _last_claim(cq))
    _judge_last_unit(cq, int(claims[built]), int(offs[built]), bad_claim)
    if not bad.any():
        return None
    keep = np.ones(len(claims), dtype=bool)
    keep[built:] = ~bad
    for i in np.flatnonzero(~keep).tolist():
        _tell_bad_claim(bad_claim, cq, int(offs[i]), int(sizes[i]), int(claims[i]))
    return keep


def _in_sequence_few(cq, units: list, bad_claim: BadClaim | None) -> np.ndarray | None:
    """_in_sequence for put_requests' few (offset, size, tags code, claim) tuples: the common case (records
    not built yet that continue the queue's end one by one) decided without numpy's fixed costs, which are
    most of a single put's dispatch; anything else as _in_sequence decides it."""
    mpo = cq.max_physic_offset
    built = sum(1 for u in units if u[0] + u[1] <= mpo)
    if built == len(units):
        return None
    end = cq.get_max_offset_in_queue()
    claim = units[built][3]
    if claim == end and (mpo >= 0 or end == 0) and \
            all(units[i][3] == claim + i - built for i in range(built + 1, len(units))):
        return None         # in sequence (claims_out_of_sequence), and the last unit continued (_judge_last_unit)
    return _in_sequence(cq, *(np.array([u[k] for u in units], dtype=np.int64) for k in (0, 1, 3)), bad_claim)


def _last_claim(cq) -> int:
    """The queue offset a next record continues (-1: the queue has no unit)."""
    return cq.get_max_offset_in_queue() - 1 if cq.max_physic_offset >= 0 else -1


def _judge_last_unit(cq, claim: int, offset: int, bad_claim: BadClaim | None) -> None:
    """claims_out_of_sequence across two batches. The next record of cq (at commitlog offset `offset`)
    claims `claim`; the queue's last unit was written after a jump (filler units before it) at the end of
    the previous batch, so its right was not judged. When this record does not continue it either, the
    last unit's record is out of sequence: the unit is cut with the fillers its jump wrote, its record
    told to bad_claim (this record was judged on its left by the cut unit's claim, as within a batch)."""
    end = cq.get_max_offset_in_queue()
    if claim == end or end - 2 < cq.get_min_offset_in_queue():
        return
    last, prev = cq.get_unit(end - 1), cq.get_unit(end - 2)
    if last is None or prev is None or _is_filler(last) or not _is_filler(prev) or offset <= last[0]:
        return
    lo = max(cq.get_min_offset_in_queue(), end - 1 - 4096)
    before = cq.units(lo, end - 1)
    real = np.flatnonzero(~((before["size"] == codec.CQ_BLANK_SIZE) & (before["offset"] == 0)))
    cut = end - 1                           # the unit alone when its fillers cannot all be read
    if len(before) == end - 1 - lo:
        cut = lo + (int(real[-1]) + 1 if len(real) else 0)
    with cq.lock:
        cq.queue.truncate_dirty_files(cut * UNIT)
        cq.queue.set_positions_from(cut * UNIT)
        cq.max_physic_offset = last[0]     # what lies before the cut record is built
    _tell_bad_claim(bad_claim, cq, last[0], last[1], end - 1)


def _is_filler(unit) -> bool:
    return unit[0] == 0 and unit[1] == codec.CQ_BLANK_SIZE


def _tell_bad_claim(bad_claim: BadClaim | None, cq, offset: int, size: int, claim: int) -> None:
    log.warning("%s: the record at commitlog offset %d claims queue offset %d, out of the queue's sequence (a "
                "damaged QUEUEOFFSET): no unit written", cq.queue.store_path, offset, claim)
    if bad_claim is not None:
        bad_claim(cq, offset, size, claim)


def fill_queue(cq, upto: int, bound: int | None = None) -> bool:
    """A record carries queue offset `upto` but the queue ends below it: the records of the offsets between
    were lost (a skipped damaged range, a missing commitlog file). Fill them with filler units (they read
    as removed messages) so that every later message keeps the queue offset its record carries. A queue
    with no file yet is left to ConsumeQueue (it starts at its first real unit).

    `bound`: how many messages the lost ranges can have held at most. A jump past it is not lost messages
    but a damaged QUEUEOFFSET field (the body CRC does not cover the header): nothing is filled (a flipped
    bit must not make millions of filler units) and False is returned; the unit then goes to the queue's
    end, where the read path refuses it (its record names another queue offset) and check reports it."""
    with cq.lock:
        q = cq.get_max_offset_in_queue()
        if q >= upto or cq.queue.last is None:
            return True
        if bound is not None and upto - q > bound:
            log.warning("%s: a record claims queue offset %d, %d past the queue's end %d, more than the lost "
                        "commitlog ranges can hold (%d): a damaged header; not filled", cq.queue.store_path,
                        upto, upto - q, q, bound)
            return False
        first = q
        keep = cq.max_physic_offset
        while q < upto:
            mf = cq.queue.get_last_mapped_file(q * UNIT)
            if mf is None or mf.file_from_offset + mf.wrote_position != q * UNIT:
                raise OSError(f"{cq.queue.store_path}: cannot fill queue offsets {q}..{upto}")
            n = min(mf.free_space // UNIT, upto - q)
            mf.append(FILLER_UNIT * n)
            q += n
        cq.max_physic_offset = keep
    log.warning("%s: queue offsets %d..%d were lost with a skipped commitlog range: filled with filler units "
                "(read as removed messages)", cq.queue.store_path, first, upto)
    return True


def blank_units_in(consume_queues: ConsumeQueueTable, ranges: list[tuple[int, int]]) -> int:
    """Overwrite, in every consume queue, the units pointing into the commitlog ranges [start, end) with
    filler units: those records were skipped as damaged (or lost with a missing file), and a unit must
    never answer with their bytes. Units keep their places (the queue offsets after them are unchanged).
    Returns how many units were blanked (each queue is logged)."""
    if not ranges:
        return 0
    total = 0
    for cq in consume_queues:
        n = 0
        with cq.lock:
            for mf in list(cq.queue.files):
                count = mf.wrote_position // UNIT
                if not count:
                    continue
                arr = np.frombuffer(mf.mm, dtype=codec.CQ_DTYPE, count=count)
                off = arr["offset"].astype(np.int64)
                del arr
                hit = np.zeros(count, dtype=bool)
                for a, b in ranges:
                    hit |= (off >= a) & (off < b)
                for i in np.flatnonzero(hit).tolist():
                    mf.mm[i * UNIT:(i + 1) * UNIT] = FILLER_UNIT
                n += int(hit.sum())
        if n:
            log.warning("%s: %d units pointed into skipped commitlog ranges: replaced with filler units (read as "
                        "removed messages)", cq.queue.store_path, n)
            total += n
    return total
