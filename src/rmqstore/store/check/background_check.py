"""BackgroundCheckService: the checks the fast open (open_trust.py) left out, run once the store serves.

One pass, in a daemon thread, started with the store's services:

1. the commitlog ranges the open did not walk but RocketMQ's rule would have (RecoveryReport.deferred_crc):
   every record checked with its body CRC (scanner.walk_records). Damage is handled as recovery handles
   it: the damaged range is skipped (the dispatcher never parses it again), the units pointing into it
   become filler units (read as removed messages), a CORRUPT_RECORD failure names the file and offset;
2. every consume queue unit below each queue's end at the start of the pass, against the record it points
   at (queue_check.unit_problems: record start, size, topic, queue id, queue offset) and in its values
   and order (structure_problem, missing files): the check `rmqstore check` makes. A damaged unit is a
   CORRUPT_UNIT failure naming the queue's file and byte offset; the queue is cut there and rebuilt from
   the commitlog by the dispatcher (recovery.repair_queues_live, as MessageStore.check(repair=True));
3. every index file that is not the last (the index service writes the last) deep-checked
   (recovery.index_file_problems): damage is a CORRUPT_INDEX failure; the file is left out of the
   verified-state record, so the next open checks it and sets it aside (as MessageStore.check does).

The pass reads the commitlog by windows (WINDOW bytes of one file, mapped read-only and unmapped after
use, its units gathered from every queue by a cursor per queue reading its files with pread): memory stays
bounded whatever the store holds. Until the pass reaches a unit, reads are guarded by the read path's own
checks (getMessage compares each unit with its record and checks the body CRC).

Then, every REFRESH_SECONDS, the verified-state record is rewritten as the store's files are then
(verified_state.vouched(live=True): the last file of the commitlog and of each queue with the crc32 of its
written bytes): after a crash of the process alone, the next open re-checks only what was written since.
Files with damage found and not repaired are never in it.
"""
from __future__ import annotations

import logging
import mmap
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..format import codec, resync, scanner
from ..recovery import verified_state
from ..consumequeue.consume_queue import UNIT, ConsumeQueue
from ..state.failure import FailureChannel, FailureKind
from ..files.mapped_file import map_read_only
from ..recovery.queue_check import UNIT_MISSING, UNIT_OUTSIDE, UNIT_REASONS, structure_problem, unit_problems
from ..recovery.recovery import index_file_problems, let_go_pages
from .unit_repair import repair_unit

log = logging.getLogger(__name__)

_CQ_NP = np.dtype(codec.CQ_DTYPE)
BLOCK_UNITS = 16384                 # units a queue's cursor reads at a time (320 KB)


@dataclass
class CheckResult:
    """What one pass found (also on the failure channel)."""
    crc_bytes: int = 0
    units: int = 0
    index_files: int = 0
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    finished: bool = False


class BackgroundCheckService:
    WINDOW = 64 << 20               # commitlog bytes mapped at a time
    REFRESH_SECONDS = 60.0

    def __init__(self, parts, failures: FailureChannel, deferred_crc=(), unverified=()):
        self.parts = parts
        self.root = Path(parts.path)
        self.failures = failures
        self.deferred_crc = list(deferred_crc)
        self.unverified: set[str] = {str(p) for p in unverified}   # files never vouched for this run
        self.result = CheckResult()
        self.done = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="BackgroundCheckService", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)

    def wait(self, timeout: float | None = None) -> bool:
        """True once the pass is over (finished or stopped)."""
        return self.done.wait(timeout)

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            self.check_commitlog()
            self.check_consume_queues()
            self.check_index()
            self.result.finished = not self._stop.is_set()
        except Exception as e:  # noqa: BLE001 - a bug here must not take the store down; it is reported
            log.exception("%s: background check failed", self.root)
            self.result.problems.append(f"the background check stopped: {type(e).__name__}: {e}")
        finally:
            self.result.seconds = time.perf_counter() - t0
            self.done.set()
        r = self.result
        log.log(logging.WARNING if r.problems else logging.INFO,
                "%s: background check %s in %.1f s: %d commitlog bytes CRC-checked, %d units, %d index files; %s",
                self.root, "done" if r.finished else "stopped", r.seconds, r.crc_bytes, r.units, r.index_files,
                "; ".join(r.problems) if r.problems else "no damage")
        while not self._stop.wait(self.REFRESH_SECONDS):
            self.refresh_record()

    # --- the verified-state record --------------------------------------------------------------
    def exclude(self) -> set[str]:
        """Files not to vouch for: damage found this run (here, at open, or by the dispatcher)."""
        kinds = (FailureKind.CORRUPT_RECORD, FailureKind.COMMITLOG_GAP, FailureKind.CORRUPT_UNIT,
                 FailureKind.CORRUPT_INDEX)
        return self.unverified | {verified_state.rel_path(self.root, f.path) for f in self.failures.failures()
                                  if f.kind in kinds and f.path}

    def refresh_record(self) -> None:
        """Rewrite the record as the files are now (module docstring)."""
        p = self.parts
        try:
            verified_state.save(self.root, verified_state.vouched(self.root, p.commit_log, p.consume_queues,
                                                                  p.index_service, live=True,
                                                                  exclude=self.exclude()))
        except OSError as e:
            log.warning("%s: cannot refresh the verified-state record: %s", self.root, e)

    # --- 1. commitlog CRCs ----------------------------------------------------------------------
    def check_commitlog(self) -> None:
        cl = self.parts.commit_log
        for a, b in self.deferred_crc:
            for mf in list(cl.queue.files):
                lo, hi = max(a, mf.file_from_offset), min(b, mf.file_from_offset + mf.file_size)
                if lo < hi and not self._stop.is_set():
                    self._crc_file(mf, lo - mf.file_from_offset, hi - mf.file_from_offset)

    def _crc_file(self, mf, pos: int, end: int) -> None:
        """CRC-walk records of one commitlog file from byte pos (a record boundary) to end, by windows."""
        try:
            mm = map_read_only(str(mf.path))
        except OSError as e:
            log.info("%s: not CRC-checked: %s", mf.path, e)     # removed meanwhile (cleanup)
            return
        if mm is None:
            return
        try:
            data_end = min(len(mm), mf.data_end())
            limit_all = min(end, data_end)
            while pos < limit_all and not self._stop.is_set():
                limit = min(pos + self.WINDOW, limit_all)
                start = pos
                try:
                    pos, kind, _ = scanner.walk_records(mm, pos, limit, True)
                    if kind is scanner.Outcome.END_OF_FILE:       # a blank to the file's end
                        self.result.crc_bytes += min(end, mf.file_size) - start
                        break
                    if pos < limit and pos + 8 <= limit:    # zeros inside the written data
                        pos = self._damage(mf, mm, pos, data_end, end, "zero bytes inside the written data")
                except scanner.RecordError as e:
                    pos = e.pos
                    if not (limit < limit_all and _fits_later(mm, pos, limit, data_end)):
                        pos = self._damage(mf, mm, pos, data_end, end, e.reason)
                    # else a record crossing the window: the next window walks it
                self.result.crc_bytes += max(pos - start, 0)
                let_go_pages(mm, start, pos - start)
                time.sleep(0)               # let the store's threads have the interpreter
        finally:
            mm.close()

    def _resume(self, mf, mm, pos: int, data_end: int) -> int:
        found = resync.next_valid_record(mm, pos, data_end, check_crc=True, base=mf.file_from_offset)
        return data_end if found is None else found

    def _damage(self, mf, mm, pos: int, data_end: int, stop: int, why: str) -> int:
        """A damaged commitlog range found at byte pos of mf: skipped, its units blanked, reported. Returns
        where valid records resume (byte in the file). The range ends at `stop` at the latest (the end of
        the range deferred to this check): the open walked the records from there itself, and cut the
        commitlog there if nothing valid followed, so bytes past it are its business, or records written
        since the open (which a skip range would hide from the dispatcher: acknowledged and never read)."""
        from ..consumequeue.dispatch import blank_units_in
        found = self._resume(mf, mm, pos, data_end)
        resume = min(found, stop)
        start, end = mf.file_from_offset + pos, mf.file_from_offset + resume
        reason = (f"{why}: bytes {pos}..{resume} of the file skipped ({resume - pos} bytes, left in place)"
                  + (f"; valid records resume at offset {end}" if found < data_end and found <= stop else
                     f"; the open walked the records from offset {end}" if found > stop else ""))
        p = self.parts
        with p.dispatcher._lock:
            p.dispatcher.add_skip_range(start, end)
        blank_units_in(p.consume_queues, [(start, end)])    # (below the dispatcher's end: no race with it)
        self.unverified.add(verified_state.rel_path(self.root, mf.path))
        self.failures.report(FailureKind.CORRUPT_RECORD, reason, path=str(mf.path), offset=start, end=end)
        self.result.problems.append(f"{mf.path} at offset {start}: {reason}")
        log.warning("%s: background check: damaged commitlog range %d..%d: %s", mf.path, start, end, reason)
        return resume

    # --- 2. consume queue units -----------------------------------------------------------------
    def check_consume_queues(self) -> None:
        p = self.parts
        with p.dispatcher._lock:    # every unit below the queues' ends points below upto: no unit is written
            cursors = [_Cursor(cq) for cq in p.consume_queues.sorted_queues()]
            upto = p.dispatcher.reput_from_offset
        try:
            for mf in list(p.commit_log.queue.files):
                first = mf.file_from_offset
                for a in range(first, min(first + mf.file_size, upto), self.WINDOW):
                    if self._stop.is_set():
                        return
                    self._window(mf, a, min(a + self.WINDOW, first + mf.file_size, upto), cursors)
            cl_min = max(p.commit_log.get_min_offset(), 0)
            for c in cursors:       # a unit left points past what was dispatched when the pass began
                bad = None if c.done else c.problem()
                if bad is None and not c.done:
                    left = c.take_below(1 << 62, first_only=True)
                    if left is not None and int(left[1][0]) >= cl_min:
                        bad = (int(left[0][0]), UNIT_OUTSIDE)
                if bad is not None:
                    self._unit_damage(c, *bad)
        finally:
            for c in cursors:
                c.close()

    def _window(self, mf, a: int, b: int, cursors: list["_Cursor"]) -> None:
        """Check the units of every queue that point into [a, b) of commitlog file mf (its bytes mapped
        read-only for the time of the window, up to the end of the last record they name)."""
        taken = []
        reach = b
        for c in cursors:
            u = None if c.done else c.take_below(b)
            if u is not None:
                taken.append((c, u))
                real = u[2] != codec.CQ_BLANK_SIZE
                if real.any():
                    reach = max(reach, int((u[1][real] + u[2][real]).max()))
        if taken:
            self._check_units(mf, a, b, reach, taken)
        for c in cursors:           # a unit that cannot be right (values, order, a missing file) after them
            bad = None if c.done else c.problem()
            if bad is not None:
                self._unit_damage(c, *bad)

    def _check_units(self, mf, a: int, b: int, reach: int, taken) -> None:
        cfg = self.parts.config
        cl_min = max(self.parts.commit_log.get_min_offset(), 0)
        span = min(mf.file_from_offset + mf.file_size, reach, b + cfg.max_message_size + (64 << 10))
        try:
            fd = os.open(mf.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return                      # removed meanwhile (cleanup): its units are below the min offset
        try:
            size = min(span, mf.file_from_offset + os.fstat(fd).st_size) - a
            if size <= 0:
                return
            mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ, offset=a - mf.file_from_offset)
        finally:
            os.close(fd)
        raw = np.frombuffer(mm, np.uint8)
        try:
            src = [(a, a + size, lambda: raw)]
            for c, (logical, off, usize) in taken:
                if c.done:
                    continue
                codes = unit_problems(off, usize, logical, c.cq.queue_id, c.topic, src, cl_min)
                self.result.units += len(off)
                bad = np.flatnonzero(codes)
                if len(bad):
                    self._unit_damage(c, int(logical[bad[0]]), int(codes[bad[0]]))
        finally:
            del raw
            mm.close()

    def _unit_damage(self, c: "_Cursor", bad: int, code: int) -> None:
        """A damaged unit: reported, the queue cut there and rebuilt (unless it went away meanwhile)."""
        c.done = True
        p = self.parts
        done = repair_unit(p.commit_log, p.dispatcher, self.failures, c.cq, bad, code,
                           UNIT_REASONS.get(code, "damaged"))
        if done is None:    # deleted, or whole again: another repair (a read's, check(repair=True)) reported it
            log.info("%s: background check: unit %d: nothing to repair any more", c.cq.queue.store_path, bad)
            return
        path, reason = done
        self.unverified.add(verified_state.rel_path(self.root, path))
        self.result.problems.append(f"{path}: {reason}")
        log.warning("%s: background check: %s", path, reason)

    # --- 3. index files -------------------------------------------------------------------------
    def check_index(self) -> None:
        idx = self.parts.index_service
        for f in list(idx.files)[:-1]:
            if self._stop.is_set():
                return
            try:
                problems = index_file_problems(f, release=True)
            except ValueError:          # closed meanwhile (cleanup deleted it)
                continue
            self.result.index_files += 1
            if problems:
                why = "; ".join(problems)
                self.unverified.add(verified_state.rel_path(self.root, f.path))
                self.failures.report(FailureKind.CORRUPT_INDEX, f"{why} (set aside at the next open, its keys "
                                     "indexed again)", path=str(f.path), offset=0)
                self.result.problems.append(f"{f.path}: {why}")
                log.warning("%s: background check: %s", f.path, why)


def _fits_later(mm, pos: int, limit: int, data_end: int) -> bool:
    """The record at pos failed only because the window ended inside it."""
    try:
        kind, size = scanner.check_record(mm, pos, data_end, True)
    except scanner.RecordError:
        return False
    return pos + size > limit or kind is not scanner.Outcome.MESSAGE


class _Cursor:
    """A queue's units in order, read block by block with pread from its files, checked in their values and
    order as they are read (structure_problem; a missing file is UNIT_MISSING)."""

    def __init__(self, cq: ConsumeQueue):
        self.cq = cq
        self.topic = cq.topic.encode("utf-8")
        self.files = list(cq.queue.files)
        self.at = cq.get_min_offset_in_queue()
        self.end = cq.get_max_offset_in_queue()
        self.prev = -1                  # the last real unit's offset read so far
        self.done = False
        self._fd = None
        self._fd_file = None
        self._buf: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None   # (logical, offset, size) pending
        self._problem: tuple[int, int] | None = None

    def problem(self) -> tuple[int, int] | None:
        """The unit found wrong in its values, order or file, once every unit before it was taken."""
        if self._buf is not None and len(self._buf[0]):
            return None
        p, self._problem = self._problem, None
        return p

    def take_below(self, b: int, first_only: bool = False):
        """The pending units (logical, offset, size) pointing below commitlog offset b (fillers among them),
        reading blocks as needed; None when there are none. first_only: the first unit that is not a filler
        alone (what is left after the last window)."""
        parts = []
        while not self.done:
            if self._buf is None or not len(self._buf[0]):
                if not self._refill():
                    break
            lg, off, size = self._buf
            filler = (size == codec.CQ_BLANK_SIZE) & (off == 0)
            if first_only:
                real = np.flatnonzero(~filler)
                if len(real):
                    i = int(real[0])
                    return lg[i:i + 1], off[i:i + 1], size[i:i + 1]
                self._buf = None
                continue
            beyond = np.flatnonzero(~filler & (off >= b))
            k = int(beyond[0]) if len(beyond) else len(lg)
            if k:
                parts.append((lg[:k], off[:k], size[:k]))
            self._buf = (lg[k:], off[k:], size[k:])
            if k < len(lg):
                break
        if not parts:
            return None
        return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))

    def _refill(self) -> bool:
        if self.done or self.at >= self.end:
            return False
        per = self.cq.file_size // UNIT
        base = (self.at // per) * per
        mf = next((m for m in self.files if m.file_from_offset // UNIT == base), None)
        if mf is None:
            self._problem = (self.at, UNIT_MISSING)
            self.done = True
            return False
        if self._fd_file is not mf:
            self.close()
            try:
                self._fd = os.open(mf.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:         # removed meanwhile (cleanup, a deleted topic): nothing to check
                self.done = True
                return False
            self._fd_file = mf
        n = min(BLOCK_UNITS, self.end - self.at, base + per - self.at)
        raw = os.pread(self._fd, n * UNIT, (self.at - base) * UNIT)
        got = len(raw) // UNIT
        if got == 0:
            self._problem = (self.at, UNIT_MISSING)
            self.done = True
            return False
        a = np.frombuffer(raw, dtype=_CQ_NP, count=got)
        off, size = a["offset"].astype(np.int64), a["size"].astype(np.int64)
        lg = np.arange(self.at, self.at + got, dtype=np.int64)
        s = structure_problem(np.concatenate(([self.prev], off)) if self.prev >= 0 else off,
                              np.concatenate(([1], size)) if self.prev >= 0 else size)
        if s is not None:
            i = max(s[0] - (1 if self.prev >= 0 else 0), 0)
            self._problem = (self.at + i, s[1])
            lg, off, size = lg[:i], off[:i], size[:i]
            self.end = self.at + i
        real = np.flatnonzero((size != codec.CQ_BLANK_SIZE) | (off != 0))
        if len(real):
            self.prev = int(off[real[-1]])
        self.at += len(lg) if s is None else got
        self._buf = (lg, off, size)
        return len(lg) > 0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._fd_file = None


NAME = "background_check"           # MessageStore.service(NAME)


def install(store_parts, failures: FailureChannel, report) -> BackgroundCheckService:
    """The service for a store that just opened (report: its RecoveryReport: what the open left to it,
    files it found damaged)."""
    return BackgroundCheckService(store_parts, failures, report.deferred_crc if report else (),
                                  [verified_state.rel_path(Path(store_parts.path), d.path)
                                   for d in (report.dropped if report else ())])


def save_at_close(store_parts, failures: FailureChannel, report, service: BackgroundCheckService | None) -> None:
    """A clean close: record every file as verified (verified_state.vouched), but those with damage found
    and not repaired this run. A failure to write it is logged; the next open then checks more."""
    svc = service or install(store_parts, failures, report)
    p = store_parts
    try:
        verified_state.save(p.path, verified_state.vouched(p.path, p.commit_log, p.consume_queues,
                                                           p.index_service, exclude=svc.exclude()))
    except OSError as e:
        log.warning("%s: cannot write the verified-state record (%s): the next open checks every file", p.path, e)
        try:
            verified_state.discard(p.path)
        except OSError:
            pass
