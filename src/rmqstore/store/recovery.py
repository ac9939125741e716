"""Recovery at open: bring the commitlog, consume queues and index back to an agreeing state.

recover_store(store) runs, in order:

1. load: a short LAST file of a directory (a crash between creating a file and sizing it, a cut copy) is
   extended with zeros (MappedFileQueue.load); a short file elsewhere is a CorruptStoreError naming it.
2. commitlog: after a clean shutdown (no `abort` file) records are checked from the third-last file; after a
   crash from the newest file whose first message is older than what the checkpoint vouches for (all files
   when the checkpoint is missing). Records are walked (CRC checked with checkCRCOnRecover) up to the last
   valid one; everything after it is cut off, and the report names the file, offset and reason.
3. consume queues: units are kept up to the first invalid one (bad values, out of order, pointing past the
   commitlog's end); the rest is removed and rebuilt from the commitlog. Then every queue is checked whole
   (check_queue): every unit's values and order, missing files, and against the records they point at
   (unit_problems: record start, size, topic, queue id, queue offset) all units of its last file and a
   sample of CQ_CHECK_SAMPLE older ones (a 1,000,000-unit check costs what the last-file check it replaces
   cost). A queue is cut at its first damaged unit and rebuilt from the commitlog from the end of the
   unit before it, when the commitlog parses from there (else it is reported and left: the read path skips
   units that do not match). Min offsets follow the commitlog's.
4. index: files the load set aside (impossible header) and files whose entries fail a deep check are set
   aside together with every later file (their keys are re-indexed); entries pointing past the commitlog's
   end are cut off (RocketMQ keeps them, and then never indexes the new messages written below them).
5. re-dispatch from the earliest point any consume queue or the index may lack (their own ends, queues that
   lost units, and after a crash the checkpoint's file as well). A unit or index entry already present is
   not written twice; queue offsets then go on from what the consume queues hold.

After a crash of the process alone (the abort file names this boot: lock.AbortFile), the page cache holds
everything the dead process wrote, so what the checkpoint does not vouch for is still there: index files
newer than the checkpoint are kept (deep-checked, their slots pointing at unpublished entries repaired),
and the re-dispatch starts at the offset the dispatcher last noted instead of the checkpoint's file.
"""
from __future__ import annotations

import logging
import os
import struct
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from . import codec, scanner
from .checkpoint import StoreCheckpoint
from .commit_log import CommitLog
from .config import StoreConfig
from .consume_queue import _CQ_NP as _CQ_UNIT_NP
from .consume_queue import UNIT, ConsumeQueue, ConsumeQueueTable
from ..errors import CorruptStoreError
from .failure import FailureChannel, FailureKind
from .mapped_file import MappedFile, offset_to_file_name

if TYPE_CHECKING:  # pragma: no cover
    from .index_file import IndexFile, IndexService
    from .store import MessageStore

log = logging.getLogger(__name__)

# Index files are deep-checked newest first until this many bytes of slots and entries were read (the
# newest file always): small stores are checked whole, a default-sized store's newest file or two.
INDEX_DEEP_CHECK_BYTES = 64 << 20


@dataclass
class Dropped:
    """One piece of data recovery removed or set aside."""
    what: str            # "commitlog", "consume queue", "index", "file"
    path: str
    offset: int          # commitlog: the global offset; other files: the byte offset inside the file
    reason: str
    count: int = 0       # units / entries / files, where that means something

    def __str__(self) -> str:
        n = f", {self.count}" if self.count else ""
        return f"{self.what} {self.path} at {self.offset}: {self.reason}{n}"


@dataclass
class RecoveryReport:
    clean_shutdown: bool
    checkpoint_found: bool = True
    commitlog_checked_from: int = 0
    commitlog_end: int = 0
    dropped_at: int | None = None          # commitlog offset where invalid data began
    dropped_reason: str | None = None
    dropped_path: str | None = None
    commitlog_files_removed: int = 0
    repaired_files: list[tuple[str, int]] = field(default_factory=list)   # short last files, size found
    consume_queue_units_dropped: dict[str, int] = field(default_factory=dict)
    index_files_dropped: int = 0
    index_entries_dropped: int = 0
    index_files_rebuilt: int = 0           # after a crash: newer than the index checkpoint (RocketMQ's rule)
    process_crash: bool = False            # the abort file named this boot: the page cache was trusted
    redispatch_error: str | None = None    # the re-dispatch stopped (a write failed: a full disk)
    dropped: list[Dropped] = field(default_factory=list)                  # everything removed, in order
    redispatched_from: int = 0
    redispatched_messages: int = 0
    seconds: float = 0.0
    rebuild_queues: list = field(default_factory=list, repr=False)   # queues that lost units
    skipped_ranges: list[tuple[int, int]] = field(default_factory=list)  # commitlog ranges skipped, kept

    @property
    def damaged(self) -> bool:
        """True when recovery removed or repaired anything beyond a crash's unflushed queue tails."""
        return bool(self.dropped or self.repaired_files)

    def summary(self) -> str:
        kind = "clean" if self.clean_shutdown else "abnormal (process only, same boot)" if self.process_crash \
            else "abnormal"
        parts = [f"{kind} shutdown",
                 f"commitlog checked from {self.commitlog_checked_from}, ends at {self.commitlog_end}"]
        if self.dropped_at is not None:
            name = (self.dropped_path or "").rsplit("/", 1)[-1]
            where = f"byte {self.dropped_at - int(name)} of " if name.isdigit() else ""
            parts.append(f"dropped data from offset {self.dropped_at} ({where}{self.dropped_path}: "
                         f"{self.dropped_reason})")
        if self.skipped_ranges:
            n = sum(b - a for a, b in self.skipped_ranges)
            parts.append(f"{len(self.skipped_ranges)} damaged or missing commitlog ranges skipped ({n} bytes, "
                         f"first at offset {self.skipped_ranges[0][0]}; later records kept)")
        if self.commitlog_files_removed:
            parts.append(f"{self.commitlog_files_removed} commitlog files removed")
        for path, size in self.repaired_files:
            parts.append(f"{path} was {size} bytes: extended with zeros")
        if self.consume_queue_units_dropped:
            parts.append(f"consume queue units dropped: {self.consume_queue_units_dropped}")
        if self.index_files_dropped:
            parts.append(f"{self.index_files_dropped} index files dropped")
        if self.index_entries_dropped:
            parts.append(f"{self.index_entries_dropped} index entries past the commitlog's end dropped")
        if self.index_files_rebuilt:
            parts.append(f"{self.index_files_rebuilt} index files newer than the checkpoint rebuilt")
        parts.append(f"re-dispatched {self.redispatched_messages} messages from {self.redispatched_from}")
        if self.redispatch_error:
            parts.append(self.redispatch_error)
        if not self.checkpoint_found:
            parts.append("checkpoint was missing")
        parts.append(f"{self.seconds:.3f} s")
        return "; ".join(parts)


# --- the whole sequence ---------------------------------------------------------------------------------
def recover_store(store: "MessageStore") -> RecoveryReport:
    """Load every file of the store and recover (module docstring); re-dispatch; return the report."""
    t0 = time.perf_counter()
    clean = not store.abort_file.exists()
    ckpt_path = store.path / "checkpoint"
    found = ckpt_path.exists()
    store.checkpoint = StoreCheckpoint(ckpt_path)
    report = RecoveryReport(clean_shutdown=clean, checkpoint_found=found)
    note = None if clean else store.abort_file.read_note()
    report.process_crash = note is not None
    cl, cqs, idx, cfg = store.commit_log, store.consume_queues, store.index_service, store.config
    cl.load()
    if not found and cl.queue.files:
        log.warning("%s: no checkpoint file: recovering as if it said nothing was flushed", ckpt_path)
    cqs.load()
    report.repaired_files = list(cl.queue.repaired) + [r for cq in cqs for r in cq.queue.repaired]
    for path, size in report.repaired_files:
        report.dropped.append(Dropped("file", path, size, "cut short: extended with zeros"))
    idx.load(clean or note is not None, store.checkpoint.index_msg_timestamp)
    report.index_files_rebuilt = len(getattr(idx, "destroyed_files", ()))
    end = recover_commit_log(cl, store.checkpoint, clean, report, getattr(store, "failures", None))
    for a, b in report.skipped_ranges:      # damaged ranges stay undispatched (never as other messages)
        store.dispatcher.add_skip_range(a, b)
    recover_consume_queues(cqs, end, report, cl)
    if report.skipped_ranges:       # units of skipped records: fillers (never answered with damaged bytes)
        from .dispatch import blank_units_in
        blank_units_in(cqs, report.skipped_ranges)
    cl_min = max(cl.get_min_offset(), 0)
    for cq in cqs:
        cq.correct_min_offset(cl_min)
    index_end = recover_index(idx, cl, end, report, repair_slots=note is not None) \
        if cfg.message_index_enable else None
    start = reput_start(cl, cqs, index_end, clean, report, note.dispatched if note is not None else None)
    report.redispatched_from = start
    store.dispatcher.reput_from_offset = start
    try:
        report.redispatched_messages = store.dispatcher.do_reput()
    except OSError as e:
        # a consume queue or index write failed (a full disk): the store opens readable, the dispatcher
        # thread tries again from where it stopped; queue offsets go on from the commitlog's records
        reput = store.dispatcher.reput_from_offset
        store.dispatcher.write_error = f"dispatch at offset {reput} failed at recovery: {e}"
        report.redispatch_error = store.dispatcher.write_error
        log.error("%s: %s; the dispatcher tries again once started", store.path, store.dispatcher.write_error)
        table = cqs.topic_queue_offsets()
        table.update(_queue_offsets_after(cl, reput, table))
        cl.topic_queue_table = table
    else:
        cl.topic_queue_table = cqs.topic_queue_offsets()
    report.seconds = time.perf_counter() - t0
    level = logging.INFO if clean and not report.damaged else logging.WARNING
    log.log(level, "%s: recovered: %s", store.path, report.summary())
    for d in report.dropped:
        log.warning("%s: recovery dropped: %s", store.path, d)
    return report


def _queue_offsets_after(commit_log: CommitLog, start: int, table: dict[str, int]) -> dict[str, int]:
    """Next queue offsets of the queues that records from start (not dispatched) carry on: what the
    consume queues will hold once the dispatcher has written them."""
    out: dict[str, int] = {}
    pos, end = start, commit_log.get_max_offset()
    while pos < end:
        got = commit_log.get_data(pos, 4 << 20)
        if got is None or not got[0]:
            break
        data, base = got
        batch, used, outcome, _ = codec.parse_dispatch(data, base, True)
        reqs = batch.requests() if isinstance(batch, codec.DispatchBatch) else batch
        for r in reqs:
            tran = r.sys_flag & codec.TRANSACTION_TYPE_MASK
            if tran not in (codec.TRANSACTION_PREPARED_TYPE, codec.TRANSACTION_ROLLBACK_TYPE):
                key = f"{r.topic}-{r.queue_id}"
                out[key] = max(out.get(key, table.get(key, 0)), r.consume_queue_offset + 1)
        if outcome == codec.PARSE_BLANK:
            pos = commit_log.roll_next_file(base + used)
        elif used == 0:
            break
        else:
            pos = base + used
    return out


# --- commitlog ------------------------------------------------------------------------------------------
def _first_store_timestamp(mf: MappedFile) -> int:
    """Store time of the file's first record (0: none). Read with pread, never through the mapping: the
    last file may never have been written (a hole, and on a full tmpfs a read of it through the mapping
    dies of SIGBUS). An unreadable file is a CorruptStoreError naming it."""
    if mf.file_size < codec.HEADER_V4.size:
        return 0
    try:
        with open(mf.path, "rb", buffering=0) as f:
            head = os.pread(f.fileno(), 256, 0)       # more than any record header
    except OSError as e:
        raise CorruptStoreError(str(mf.path), 0, f"cannot read the first record: {e.strerror}") from e
    if len(head) < codec.HEADER_V4.size:
        return 0
    total, magic = codec._II.unpack_from(head, 0)
    if magic not in (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2):
        return 0
    sys_flag = codec._I.unpack_from(head, codec.POS_SYSFLAG)[0]
    pos = codec.store_timestamp_pos(sys_flag)
    if pos + 8 > len(head):
        return 0
    return codec.struct.unpack_from(">q", head, pos)[0]


def choose_start_file(files: list[MappedFile], clean: bool, checkpoint: StoreCheckpoint, config: StoreConfig) -> int:
    """Index of the commitlog file to check from."""
    if clean:
        return max(0, len(files) - 3)
    limit = checkpoint.min_timestamp_index() if config.message_index_enable and config.message_index_safe \
        else checkpoint.min_timestamp()
    for i in range(len(files) - 1, -1, -1):
        ts = _first_store_timestamp(files[i])
        if 0 < ts <= limit:
            return i
    return 0


def recover_commit_log(commit_log: CommitLog, checkpoint: StoreCheckpoint, clean: bool,
                       report: RecoveryReport, failures: FailureChannel | None = None) -> int:
    """Walk records to the last valid one, cut the rest; returns the commitlog's new end offset.

    Damage stays in its damaged range: a record that fails its checks (or zeros inside the written data)
    followed by valid records that chain (scanner.next_valid_record) is skipped, not cut; the skipped
    range is reported (report.dropped, report.skipped_ranges, the failure channel, a warning) and its
    bytes are left in place. Only when no valid chain resumes after it (a torn tail) is everything from
    it cut, exactly as RocketMQ cuts. Missing middle files (gaps) are reported the same way."""
    q = commit_log.queue
    files = q.files
    if not files:
        q.flushed_where = q.committed_where = 0
        report.commitlog_end = 0
        return 0
    _report_gaps(q, report, failures)
    idx = choose_start_file(files, clean, checkpoint, commit_log.config)
    report.commitlog_checked_from = files[idx].file_from_offset
    check_crc = commit_log.config.check_crc_on_recover
    process = files[idx].file_from_offset
    while idx < len(files):
        mf = files[idx]
        nxt = files[idx + 1] if idx + 1 < len(files) else None
        pos, blank, reason = _walk_file(mf, check_crc, nxt, report, failures)
        if reason is not None:
            report.dropped_at = mf.file_from_offset + pos
            report.dropped_reason = reason
            report.dropped_path = str(mf.path)
            log.warning("%s: invalid record at offset %d (%s): the commitlog ends there", mf.path, pos, reason)
        process = mf.file_from_offset + pos
        if blank and idx + 1 < len(files):
            idx += 1
            continue
        if blank:
            process = mf.file_from_offset + mf.file_size
        break
    removed = [mf for mf in files if mf.file_from_offset > process]
    report.commitlog_files_removed = len(removed)
    if report.dropped_at is None and process < files[-1].file_from_offset + files[-1].file_size:
        # Zero bytes ended the data: anything non-zero after them is a torn write, also dropped.
        tail = q.find_mapped_file_by_offset(process)
        later = any(_has_data(mf, 0) for mf in removed)
        if tail is not None and (later or _has_data(tail, process - tail.file_from_offset)):
            report.dropped_at, report.dropped_reason, report.dropped_path = process, "data after a gap", str(tail.path)
    if report.dropped_at is not None:
        mf = q.find_mapped_file_by_offset(report.dropped_at)
        report.dropped.append(Dropped("commitlog", report.dropped_path or "", report.dropped_at,
                                      report.dropped_reason or "", len(removed)))
        log.warning("%s: commitlog cut at offset %d (byte %d of %s): %s; %d later files removed", q.store_path,
                    report.dropped_at, report.dropped_at - (mf.file_from_offset if mf else 0),
                    report.dropped_path, report.dropped_reason, len(removed))
    for mf in removed:
        if _has_data(mf, 0):
            report.dropped.append(Dropped("commitlog", str(mf.path), mf.file_from_offset,
                                          "file after the commitlog's end removed"))
    q.truncate_dirty_files(process)
    q.set_positions_from(process)
    report.commitlog_end = process
    return process


def _walk_file(mf: MappedFile, check_crc: bool, nxt: MappedFile | None, report: RecoveryReport,
               failures: FailureChannel | None) -> tuple[int, bool, str | None]:
    """Walk one file's records, skipping damaged ranges after which valid records resume: returns (where
    the valid data ends, whether an END_OF_FILE blank ends it, why the data ends there when it is
    invalid data rather than zeros or a blank)."""
    # the walk stops at the file's first hole (never written: zeros, and on a full tmpfs a read of it
    # through the mapping dies of SIGBUS); a record running into it was cut short
    data_end = mf.data_end()
    pos = 0
    while True:
        try:
            pos, kind, _ = codec.walk_records(mf.mm, pos, data_end, check_crc)
            if kind == codec.KIND_BLANK:
                return pos, True, None
            why = "zero bytes inside the written data" if pos + 8 <= data_end else None
        except codec.RecordError as e:
            pos = e.pos
            if data_end < mf.file_size and _blank_to_file_end(mf, pos, data_end):
                return pos, True, None
            why = e.reason if data_end == mf.file_size else \
                f"{e.reason}; the file's written data ends at byte {data_end}"
        if why is None:
            return pos, False, None
        resume = _resume_after(mf, pos, data_end, nxt)
        if resume is None:
            # a torn tail (or the end of the data, for zeros): cut as RocketMQ cuts
            return pos, False, None if why.startswith("zero bytes") else why
        _report_skip(mf, pos, resume, why, report, failures)
        if resume >= mf.file_size:
            return mf.file_size, True, None     # nothing valid left in this file: the next one goes on
        pos = resume


def _resume_after(mf: MappedFile, pos: int, data_end: int, nxt: MappedFile | None) -> int | None:
    """Where valid records resume after the invalid data at pos: in this file, else at the next file's
    start (file_size) when its first records check and chain; None when they do not (a torn tail)."""
    found = scanner.next_valid_record(mf.mm, pos, data_end, check_crc=True, base=mf.file_from_offset)
    if found is not None:
        return found
    if nxt is not None and nxt.file_from_offset == mf.file_from_offset + mf.file_size and \
            scanner.chains_from(nxt.mm, 0, nxt.data_end(), base=nxt.file_from_offset):
        return mf.file_size
    return None


def _report_skip(mf: MappedFile, pos: int, resume: int, why: str, report: RecoveryReport,
                 failures: FailureChannel | None) -> None:
    start, end = mf.file_from_offset + pos, mf.file_from_offset + resume
    reason = f"{why}: bytes {pos}..{resume} of the file skipped ({resume - pos} bytes, left in place); " \
             f"valid records resume at offset {end}"
    log.warning("%s: damaged commitlog range %d..%d skipped: %s", mf.path, start, end, reason)
    report.dropped.append(Dropped("commitlog", str(mf.path), start, reason))
    report.skipped_ranges.append((start, end))
    if failures is not None:
        failures.report(FailureKind.CORRUPT_RECORD, reason, path=str(mf.path), offset=start, end=end)


def _report_gaps(q, report: RecoveryReport, failures: FailureChannel | None) -> None:
    """Missing files between two commitlog files: reported (their messages are lost; the dispatcher goes
    on after them), with how to repair."""
    files = q.files
    for a, b in zip(files, files[1:]):
        start = a.file_from_offset + a.file_size
        if b.file_from_offset <= start:
            continue
        names = ", ".join(offset_to_file_name(o) for o in range(start, b.file_from_offset, a.file_size)[:3])
        reason = (f"commitlog file(s) {names} missing between {a.path.name} and {b.path.name}: offsets "
                  f"{start}..{b.file_from_offset} are lost, later messages are kept; restore the file(s) from "
                  f"a copy to get them back")
        log.warning("%s: %s", q.store_path, reason)
        path = str(q.store_path / offset_to_file_name(start))
        report.dropped.append(Dropped("commitlog", path, start, reason))
        report.skipped_ranges.append((start, b.file_from_offset))
        if failures is not None:
            failures.report(FailureKind.COMMITLOG_GAP, reason, path=path, offset=start, end=b.file_from_offset)


def _blank_to_file_end(mf: MappedFile, pos: int, data_end: int) -> bool:
    """An END_OF_FILE blank record at pos (written as its 8-byte head: the rest of the file is a hole)."""
    if pos + 8 > data_end:
        return False
    total, magic = codec._II.unpack_from(mf.mm, pos)
    return magic == codec.BLANK_MAGIC_CODE and total >= codec.END_FILE_MIN_BLANK_LENGTH \
        and pos + total <= mf.file_size


def _has_data(mf: MappedFile, pos: int, window: int = 1 << 20) -> bool:
    """Any non-zero byte in the window after pos."""
    return mf.has_data(pos, pos + window)


# --- consume queues -------------------------------------------------------------------------------------
def _last_unit(cq: ConsumeQueue) -> tuple[int, int] | None:
    hi = cq.get_max_offset_in_queue()
    if hi <= cq.get_min_offset_in_queue():
        return None
    u = cq.get_unit(hi - 1)
    return (u[0], u[1]) if u else None


_MAGICS = (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2)

# Why a consume queue unit does not match the commitlog record it points at (unit_problems' codes).
UNIT_OK, UNIT_OUTSIDE, UNIT_NOT_A_RECORD, UNIT_SIZE, UNIT_OTHER_QUEUE, UNIT_OTHER_OFFSET, UNIT_INVALID, \
    UNIT_ORDER, UNIT_MISSING = range(9)
UNIT_REASONS = {
    UNIT_OUTSIDE: "points outside the commitlog's files",
    UNIT_NOT_A_RECORD: "does not point at the start of a record",
    UNIT_SIZE: "size differs from the record's TOTALSIZE",
    UNIT_OTHER_QUEUE: "points at a record of another topic or queue",
    UNIT_OTHER_OFFSET: "points at a record with another queue offset",
    UNIT_INVALID: "invalid unit (zero or negative offset or size)",
    UNIT_ORDER: "commitlog offsets not increasing",
    UNIT_MISSING: "unit missing (its consume queue file is gone)",
}
# At open, units whose messages lie before the commitlog range recovery walked are sampled, not all checked:
# at most this many per queue (each one reads a commitlog page that may not be in the page cache).
CQ_CHECK_SAMPLE = 256


def _gather(raw: np.ndarray, dtype, pos: np.ndarray) -> np.ndarray:
    """dtype values at each byte position pos of the uint8 array raw (pos + itemsize <= len(raw))."""
    dt = np.dtype(dtype)
    if not len(pos):
        return np.empty(0, dtype=dt)
    view = np.ndarray((len(raw) - dt.itemsize + 1,), dtype=np.dtype(f"V{dt.itemsize}"), buffer=raw, strides=(1,))
    return view[pos].view(dt)


# what unit_problems reads of a record: TOTALSIZE .. SYSFLAG (every variant has them there)
_UNIT_HEAD = np.dtype(codec.HEADER_V4_FIELDS[:8])


def _topic_matches(raw: np.ndarray, pos: np.ndarray, total: np.ndarray, sys_flag: np.ndarray, magic: np.ndarray,
                   topic: bytes) -> np.ndarray:
    """For records at pos (whole inside raw): is their topic exactly `topic`? The length field and the
    topic's bytes are compared as one fixed-width item per record."""
    sys_flag = sys_flag.astype(np.int64)
    hs = codec.HEADER_V4.size + 12 * ((sys_flag & codec.SYSFLAG_BORNHOST_V6) != 0) \
        + 12 * ((sys_flag & codec.SYSFLAG_STOREHOST_V6) != 0)
    end = pos + total
    ok = pos + hs <= end
    body_len = np.full(len(pos), -1, dtype=np.int64)
    body_len[ok] = _gather(raw, ">i4", pos[ok] + hs[ok] - 4)
    tpos = pos + hs + body_len
    v1 = magic == codec.MESSAGE_MAGIC_CODE
    ok &= body_len >= 0
    out = np.zeros(len(pos), dtype=bool)
    for is_v1, length in ((True, struct.pack(">B", len(topic) & 0xFF)), (False, struct.pack(">H", len(topic) & 0xFFFF))):
        if is_v1 and len(topic) > 127:
            continue
        want = length + topic
        sel = np.flatnonzero(ok & (v1 == is_v1) & (tpos + len(want) <= end))
        if len(sel):
            got = _gather(raw, f"V{len(want)}", tpos[sel])
            out[sel] = got == np.void(want)
    return out


def unit_problems(off: np.ndarray, size: np.ndarray, logical: np.ndarray, queue_id: int, topic: bytes | None,
                  files, cl_min: int) -> np.ndarray:
    """Check consume queue units against the commitlog records they point at, vectorised: returns one code a
    unit (UNIT_OK or why not, see UNIT_REASONS). off, size: the units' int64 columns; logical: their logical
    offsets (the record's QUEUEOFFSET must equal it); topic: the queue's topic as UTF-8 (None: not checked);
    files: the commitlog files as (first offset, end offset, a function giving the file's readable bytes as
    a uint8 array). A unit must point at a record start inside a file (magic code, PHYSICALOFFSET = the
    unit's offset), its size must be the record's TOTALSIZE, and the record's queue id, queue offset and
    topic must be the queue's. Filler units (offset 0, size 0x7fffffff) and units below cl_min (cleaned)
    are not checked. Pure: reads only what load() returns."""
    codes = np.zeros(len(off), dtype=np.uint8)
    skip = ((size == codec.CQ_BLANK_SIZE) & (off == 0)) | (off < max(cl_min, 0))
    covered = skip.copy()
    for lo, hi, load in files:
        sel = np.flatnonzero((off >= lo) & (off < hi) & ~skip)
        if not len(sel):
            continue
        covered[sel] = True
        raw = load()
        pos = off[sel] - lo
        inside = pos + codec.HEADER_V4.size <= len(raw)
        codes[sel[~inside]] = UNIT_NOT_A_RECORD
        sel, pos = sel[inside], pos[inside]
        h = _gather(raw, _UNIT_HEAD, pos)
        total = h["total"].astype(np.int64)
        magic = h["magic"]
        c = np.zeros(len(sel), dtype=np.uint8)
        c[h["queue_offset"] != logical[sel]] = UNIT_OTHER_OFFSET
        c[h["queue_id"] != queue_id] = UNIT_OTHER_QUEUE
        c[total != size[sel]] = UNIT_SIZE
        rec = ((magic == _MAGICS[0]) | (magic == _MAGICS[1])) & (h["phys"] == off[sel]) & (pos + total <= len(raw))
        c[~rec] = UNIT_NOT_A_RECORD
        if topic is not None:
            t = np.flatnonzero(c == 0)
            if len(t):
                same = _topic_matches(raw, pos[t], total[t], h["sys_flag"][t], magic[t], topic)
                c[t[~same]] = UNIT_OTHER_QUEUE
        codes[sel] = c
        del h, raw
    codes[~covered] = UNIT_OUTSIDE
    return codes


def _commitlog_sources(commit_log: CommitLog):
    """The commitlog files as unit_problems wants them: readable parts only (never a hole's page)."""
    return [(mf.file_from_offset, mf.file_from_offset + mf.file_size,
             lambda mf=mf: np.frombuffer(mf.mm, np.uint8, count=min(mf.read_position, mf.file_size)))
            for mf in list(commit_log.queue.files)]


@dataclass
class QueueUnits:
    """Every unit of a consume queue from its min offset, read from its files (missing files: no units)."""
    first: int                    # logical offset of off[0]
    off: np.ndarray               # int64 commitlog offsets
    size: np.ndarray              # int64 sizes
    missing: int | None           # first logical offset a missing middle file or a hole should hold


def read_queue_units(cq: ConsumeQueue) -> QueueUnits:
    """The units of cq from its min offset to its max offset, file by file; a file missing between two
    others (or unwritten bytes inside a non-last file) ends the read and is named by `missing`."""
    lo, hi = cq.get_min_offset_in_queue(), cq.get_max_offset_in_queue()
    offs, sizes = [], []
    expect = lo
    missing = None
    files = list(cq.queue.files)
    for i, mf in enumerate(files):
        base = mf.file_from_offset // UNIT
        end = min(base + mf.file_size // UNIT, hi)
        if end <= expect:
            continue
        if base > expect:
            missing = expect
            break
        readable = min(mf.read_position, mf.data_end()) // UNIT     # data_end: no hole is faulted in
        last = min(base + readable, end)
        if last > expect:
            a = np.frombuffer(mf.mm, dtype=_CQ_UNIT_NP, count=last - base)[expect - base:]
            offs.append(a["offset"].astype(np.int64))
            sizes.append(a["size"].astype(np.int64))
            del a
        if last < end:
            missing = max(last, expect)
            break
        expect = end
    cat = (lambda xs: np.concatenate(xs) if xs else np.empty(0, np.int64))
    return QueueUnits(lo, cat(offs), cat(sizes), missing)


def structure_problem(off: np.ndarray, size: np.ndarray) -> tuple[int, int] | None:
    """(index, UNIT_INVALID or UNIT_ORDER) of the first unit that cannot be right whatever the commitlog says:
    a zero or negative offset or size, offsets not increasing (filler units are allowed anywhere)."""
    filler = (size == codec.CQ_BLANK_SIZE) & (off == 0)
    real = ~filler
    invalid = (off < 0) | (size <= 0) | (real & (size == codec.CQ_BLANK_SIZE))
    # a filler after a real unit is kept: it stands for a record lost in a skipped damaged range or a missing
    # commitlog file (dispatch.fill_queue / blank_units_in), and reads as a removed message
    bad = np.flatnonzero(invalid)
    ro = np.flatnonzero(real)
    order = ro[1:][np.diff(off[ro]) <= 0]
    cands = []
    if len(bad):
        cands.append((int(bad[0]), UNIT_INVALID))
    if len(order):
        cands.append((int(order[0]), UNIT_ORDER))
    return min(cands) if cands else None


def _checked_positions(upto: int, deep_from: int, sample: int | None) -> np.ndarray:
    """Indices of the units [0, upto) to check against their records: all from index deep_from on, and of
    the older ones `sample` spread evenly (first and last included); sample None: all."""
    deep_from = min(max(deep_from, 0), upto)
    if sample is None or deep_from <= sample:
        return np.arange(upto)
    old = np.unique(np.linspace(0, deep_from - 1, sample).astype(np.int64))
    return np.concatenate((old, np.arange(deep_from, upto)))


def check_queue(cq: ConsumeQueue, sources, cl_min: int, deep_from: int = 0,
                sample: int | None = None) -> tuple[int, int] | None:
    """The first damaged unit of cq as (logical offset, UNIT_* code), or None. Every unit's values are
    checked (zero units, order, missing files: cheap, the consume queue files only); units are checked
    against their records (unit_problems) from logical offset deep_from on, older ones by a sample of
    `sample` units (None: all)."""
    qu = read_queue_units(cq)
    upto = len(qu.off)
    found = []
    if qu.missing is not None:
        found.append((qu.missing, UNIT_MISSING))
    s = structure_problem(qu.off, qu.size)
    if s is not None:
        found.append((qu.first + s[0], s[1]))
        upto = s[0]
    idx = _checked_positions(upto, deep_from - qu.first, sample)
    if len(idx):
        codes = unit_problems(qu.off[idx], qu.size[idx], qu.first + idx, cq.queue_id, cq.topic.encode("utf-8"),
                              sources, cl_min)
        bad = np.flatnonzero(codes)
        if len(bad):
            found.append((qu.first + int(idx[bad[0]]), int(codes[bad[0]])))
    return min(found) if found else None


def _walks(commit_log: CommitLog, start: int, end: int, skips: list[tuple[int, int]] = ()) -> str | None:
    """None if the dispatcher can parse the commitlog from the record boundary start to end (files in a
    row, whole valid records; the ranges recovery skipped as damaged or missing, `skips`, are passed over
    as the dispatcher passes over them), else what stops it (a repair that re-dispatches from start needs
    this)."""
    def skipped(at: int) -> int | None:
        return next((b for a, b in skips if a <= at < b), None)

    pos = start
    while pos < end:
        after = skipped(pos)
        if after is not None:
            pos = after
            continue
        mf = commit_log.queue.find_mapped_file_by_offset(pos)
        if mf is None:
            return f"no commitlog file holds offset {pos}"
        limit = min(mf.read_position, end - mf.file_from_offset)
        try:
            stop, kind, _ = codec.walk_records(mf.mm, pos - mf.file_from_offset, limit)
        except codec.RecordError as e:
            if skipped(mf.file_from_offset + e.pos) is not None:
                pos = mf.file_from_offset + e.pos
                continue
            return f"invalid record at offset {mf.file_from_offset + e.pos} of {mf.path}: {e.reason}"
        if kind == codec.KIND_BLANK:
            pos = mf.file_from_offset + mf.file_size
        elif mf.file_from_offset + stop < end:
            if skipped(mf.file_from_offset + stop) is not None:
                pos = mf.file_from_offset + stop
                continue
            return f"no record at offset {mf.file_from_offset + stop} of {mf.path}"
        else:
            return None
    return None


def _repair_queue(cq: ConsumeQueue, commit_log: CommitLog, commitlog_end: int, bad: int, code: int,
                  report: RecoveryReport) -> int:
    """Cut cq at its damaged unit `bad` and mark it for rebuilding from the commitlog (when the commitlog
    can be parsed from there); returns how many units were dropped."""
    why = UNIT_REASONS.get(code, "damaged")
    path = str(cq.queue.store_path)
    prev = cq.get_unit(bad - 1) if bad - 1 >= cq.get_min_offset_in_queue() else None
    if prev is not None and (prev[1] <= 0 or prev[1] == codec.CQ_BLANK_SIZE):
        prev = None                 # a filler unit: no message before the damage, rebuild from the start
    start = prev[0] + prev[1] if prev is not None else max(commit_log.get_min_offset(), 0)
    stop = _walks(commit_log, start, commitlog_end, report.skipped_ranges)
    if stop is not None:
        log.error("%s: unit %d %s; not rebuilt: %s (the read path skips the units that do not match)",
                  path, bad, why, stop)
        report.dropped.append(Dropped("consume queue", path, bad * UNIT, f"unit {bad} {why}; not rebuilt: {stop}"))
        return 0
    n = cq.get_max_offset_in_queue()
    with cq.lock:
        cq.queue.truncate_dirty_files(bad * UNIT)
        cq.queue.set_positions_from(bad * UNIT)
        cq.max_physic_offset = start if prev is not None else -1
    dropped = max(n - bad, 0)
    log.warning("%s: unit %d %s: it and the %d units after it are rebuilt from the commitlog (from offset %d)",
                path, bad, why, dropped - 1, start)
    report.dropped.append(Dropped("consume queue", path, bad * UNIT, f"unit {bad} {why}: rebuilt from the "
                                  f"commitlog from offset {start}", dropped))
    return dropped


def recover_consume_queues(cqs: ConsumeQueueTable, commitlog_end: int, report: RecoveryReport,
                           commit_log: CommitLog | None = None) -> None:
    """Keep each queue's units up to the first invalid one; remove units past the commitlog's end. With the
    commitlog, each queue is checked whole (check_queue: all units of its last file and a sample of the
    older ones against their records, every unit's values, missing files); a damaged unit is cut with
    everything after it and rebuilt from the commitlog (_repair_queue), reported in report.dropped. A queue
    whose file was cut short (extended with zeros at load) is rebuilt from its end as well."""
    sources = _commitlog_sources(commit_log) if commit_log is not None else None
    cl_min = commit_log.get_min_offset() if commit_log is not None else 0
    for cq in cqs:
        before = cq.get_max_offset_in_queue()
        dropped = cq.recover(commitlog_end)
        last = _last_unit(cq)
        if last is not None and (last[0] + last[1] > commitlog_end or last[1] <= 0):
            # units older than the files recover() checks still point past the end, or the queue ends in
            # zero units (a file a power cut left unwritten): cut them as well
            n = cq.get_max_offset_in_queue()
            cq.truncate_dirty_logic_files(commitlog_end)
            dropped += n - cq.get_max_offset_in_queue()
            last = _last_unit(cq)
        rebuilt = 0
        if commit_log is not None:
            files = cq.queue.files
            deep_from = files[-1].file_from_offset // UNIT if files else 0
            found = check_queue(cq, sources, cl_min, deep_from, CQ_CHECK_SAMPLE)
            if found is not None:
                rebuilt = _repair_queue(cq, commit_log, commitlog_end, found[0], found[1], report)
                last = _last_unit(cq)
        cq.max_physic_offset = last[0] + last[1] if last is not None else -1
        name = f"{cq.topic}/{cq.queue_id}"
        if rebuilt:
            report.consume_queue_units_dropped[name] = report.consume_queue_units_dropped.get(name, 0) + rebuilt
        if (rebuilt or cq.queue.repaired) and not dropped:
            report.rebuild_queues.append(cq)    # a damaged unit, or a file cut short: what it lost comes back
        if dropped:
            report.consume_queue_units_dropped[name] = report.consume_queue_units_dropped.get(name, 0) + dropped
            report.dropped.append(Dropped("consume queue", str(cq.queue.store_path), cq.get_max_offset_in_queue() * UNIT,
                                          f"units invalid or past the commitlog's end (queue had {before} units)",
                                          dropped))
            report.rebuild_queues.append(cq)


# --- index ----------------------------------------------------------------------------------------------
_ENTRY = np.dtype(codec.INDEX_ENTRY_DTYPE)


def index_file_problems(f: "IndexFile") -> list[str]:
    """What is impossible in an index file's slots and entries (empty list: nothing found)."""
    mm = f.mapped_file.mm
    count = f.index_count
    problems = []
    slots = f.read_slots()          # pread when the slots were never allocated (no SIGBUS on a full disk)
    bad = np.flatnonzero((slots < 0) | (slots >= max(count, 1)))
    if len(bad):
        problems.append(f"{len(bad)} hash slots outside [0, {count}) (slot {int(bad[0])} = {int(slots[bad[0]])})")
    del slots
    if count > 1:
        ent = np.frombuffer(mm, dtype=_ENTRY, count=count - 1, offset=f.entries_base + codec.INDEX_ENTRY_SIZE)
        no = np.arange(1, count)
        phy = ent["phy_offset"].astype(np.int64)
        checks = (("keyHash < 0", ent["key_hash"] < 0), ("timeDiff < 0", ent["time_diff"] < 0),
                  ("preIndexNo not in [0, own number)", (ent["prev"] < 0) | (ent["prev"] >= no)),
                  ("phyOffset outside the header's range",
                   (phy < f.begin_phy_offset) | (phy > f.end_phy_offset)),
                  ("phyOffset going backwards", np.concatenate(([False], np.diff(phy) < 0))))
        for what, mask in checks:
            b = np.flatnonzero(mask)
            if len(b):
                problems.append(f"{len(b)} entries with {what} (first: entry {int(b[0]) + 1})")
        del ent
    return problems


def _set_aside(idx: "IndexService", f: "IndexFile", why: str, report: RecoveryReport) -> None:
    f.close()
    aside = f.path.with_name(f.path.name + ".corrupt")
    i = 1
    while aside.exists():
        aside = f.path.with_name(f"{f.path.name}.corrupt{i}")
        i += 1
    f.path.replace(aside)
    idx.dropped_files.append(aside)
    report.dropped.append(Dropped("index", str(f.path), 0, f"{why}; set aside as {aside.name}"))
    log.error("%s: %s; set aside as %s, its keys are indexed again from the commitlog", f.path, why, aside.name)


def recover_index(idx: "IndexService", commit_log: CommitLog, commitlog_end: int, report: RecoveryReport,
                  repair_slots: bool = False) -> int:
    """Set aside corrupt index files (and re-index from before them), cut entries past the commitlog's end.
    repair_slots (after a process crash): slots of the newest file pointing at entries written but not yet
    published by the header are moved down their chains first. Returns the commitlog offset from which the
    index needs the messages again."""
    gone = 0
    with idx._lock:
        files: list = list(idx.files)
        if repair_slots and files:
            n = _repair_slots(files[-1], files[-1].index_count)
            if n:
                log.info("%s: %d hash slots pointed at entries not yet counted in the header: moved down their "
                         "chains", files[-1].path, n)
        drop_from = None            # files after files[drop_from] go: they follow a corrupt file
        for p in idx.dropped_files:   # set aside by load for an impossible header
            gone += 1
            report.dropped.append(Dropped("index", str(p), 0, "impossible header; set aside"))
            later = [i for i, f in enumerate(files) if f.name > p.name.split(".")[0]]
            if later:
                drop_from = min(drop_from if drop_from is not None else len(files), later[0] - 1)
        checked = 0
        for i in range(len(files) - 1, -1, -1):
            f = files[i]
            cost = f.hash_slot_num * codec.INDEX_HASH_SLOT_SIZE + max(f.index_count, 1) * codec.INDEX_ENTRY_SIZE
            if i < len(files) - 1 and checked + cost > INDEX_DEEP_CHECK_BYTES:
                log.info("%s: index files up to %s not deep-checked (over %d bytes)", idx.store_path, f.name,
                         INDEX_DEEP_CHECK_BYTES)
                break
            checked += cost
            problems = index_file_problems(f)
            if problems:
                _set_aside(idx, f, "; ".join(problems), report)
                gone += 1
                files[i] = None
                drop_from = i if drop_from is None else min(drop_from, i)
        keep = []
        for i, f in enumerate(files):
            if f is None:
                continue
            if drop_from is not None and i > drop_from:
                report.dropped.append(Dropped("index", str(f.path), 0, "after a corrupt index file: its keys are "
                                              "indexed again", f.index_count - 1))
                f.destroy()
                gone += 1
                continue
            keep.append(f)
        # entries past the commitlog's end (it was cut): whole files go, the last kept file is cut
        while keep and ((keep[-1].index_count <= 1 and keep[-1].end_phy_offset >= commitlog_end > 0)
                        or (keep[-1].index_count > 1 and keep[-1].begin_phy_offset >= commitlog_end)):
            f = keep.pop()
            report.dropped.append(Dropped("index", str(f.path), 0, "indexes only messages past the commitlog's "
                                          f"end {commitlog_end}", f.index_count - 1))
            report.index_entries_dropped += max(f.index_count - 1, 0)
            f.destroy()
            gone += 1
        if keep and keep[-1].end_phy_offset >= commitlog_end and keep[-1].index_count > 1 \
                and not keep[-1].slots_allocated:
            # its slots are holes (a full disk): cutting would write them through the mapping (SIGBUS on
            # tmpfs); set the file aside instead, the re-dispatch indexes its messages again
            f = keep.pop()
            report.dropped.append(Dropped("index", str(f.path), 0, "entries past the commitlog's end "
                                          f"{commitlog_end} and slots not allocated (disk full): set aside, its "
                                          "keys are indexed again", f.index_count - 1))
            report.index_entries_dropped += max(f.index_count - 1, 0)
            f.destroy()
            gone += 1
        if keep and keep[-1].end_phy_offset >= commitlog_end and keep[-1].index_count > 1:
            n = _cut_index_file(keep[-1], commitlog_end, commit_log)
            report.index_entries_dropped += n
            report.dropped.append(Dropped("index", str(keep[-1].path), 0,
                                          f"entries for messages at or past the commitlog's end {commitlog_end}", n))
        idx.files = keep
    report.index_files_dropped = gone
    if not keep or (len(keep) == 1 and keep[0].index_count <= 1 and keep[0].end_phy_offset == 0):
        return 0
    # the last entry's message (the header's endPhyOffset says the same unless it was torn) is indexed: the
    # index needs what comes after it. Re-dispatching from earlier (the consume queues' end) must not index
    # it twice, as RocketMQ would: the index skips it (indexed_through)
    last = _last_entry_offset(keep[-1])
    idx.indexed_through = last
    raw = commit_log.get_message(last, 8)
    if raw is not None:
        size, magic = codec._II.unpack(raw)
        if magic in _MAGICS and size > 0:
            return last + size
    return last


def _last_entry_offset(f: "IndexFile") -> int:
    if f.index_count <= 1:
        return f.end_phy_offset
    last = f.entries_base + (f.index_count - 1) * codec.INDEX_ENTRY_SIZE
    return codec.INDEX_ENTRY.unpack_from(f.mapped_file.mm, last)[1]


def _repair_slots(f: "IndexFile", k: int) -> int:
    """Point every slot holding an entry number >= k at the first entry < k of its chain (0 if none):
    entries k.. are being removed, or were written by a process killed before it published them.
    A slot is only changed when every entry its chain passes through hashes to it: anything else is not a
    half-finished put but damage, left for index_file_problems to report. Returns how many slots changed.
    A file whose slots could not be allocated (a full disk) is left as it is: its slots are read with pread
    and a read never follows a slot past indexCount (IndexFile.select_by_hash)."""
    if not f.slots_allocated:
        log.warning("%s: slots not allocated (disk full): slots pointing past indexCount are not repaired",
                    f.path)
        return 0
    mm = f.mapped_file.mm
    slot_num = f.hash_slot_num
    slots = np.ndarray((slot_num,), dtype=">i4", buffer=mm, offset=codec.INDEX_HEADER_SIZE)
    fix = np.flatnonzero(slots >= k)
    if not len(fix):
        del slots
        return 0
    top = min(int(slots[fix].max()) + 1, f.index_num)
    ent = np.frombuffer(mm, dtype=_ENTRY, count=top, offset=f.entries_base)
    prev = ent["prev"].astype(np.int64)
    home = ent["key_hash"].astype(np.int64) % slot_num
    del ent
    changed, new_vals = [], []
    for s in fix.tolist():
        cur = int(slots[s])
        steps = 0
        while k <= cur < top and steps < top and home[cur] == s:
            cur = int(prev[cur])
            steps += 1
        if cur < k:
            changed.append(s)
            new_vals.append(max(cur, 0))
    if changed:
        slots[np.array(changed, dtype=np.int64)] = np.array(new_vals, dtype=np.int64)
    del slots
    return len(changed)


def _cut_index_file(f: "IndexFile", end: int, commit_log: CommitLog) -> int:
    """Remove the entries of f for messages at or past end (a suffix: entries are in commitlog order);
    slots pointing into that suffix are moved down their chains. Returns how many entries went."""
    mm = f.mapped_file.mm
    count = f.index_count
    base = f.entries_base
    ent = np.frombuffer(mm, dtype=_ENTRY, count=count, offset=base)
    phy = ent["phy_offset"].astype(np.int64)
    k = int(np.searchsorted(phy[1:], end, side="left")) + 1     # first entry number to remove
    del ent
    if k >= count:
        return 0
    _repair_slots(f, k)
    slots = np.ndarray((f.hash_slot_num,), dtype=">i4", buffer=mm, offset=codec.INDEX_HEADER_SIZE)
    slots[slots >= k] = 0           # chains _repair_slots would not follow (damage): empty, not dangling
    del slots
    mm[base + k * codec.INDEX_ENTRY_SIZE: base + count * codec.INDEX_ENTRY_SIZE] = bytes((count - k) * codec.INDEX_ENTRY_SIZE)
    f.index_count = k
    if k > 1:
        last_phy = int(phy[k - 1])
        f.end_phy_offset = last_phy
        msg = commit_log.look_message_by_offset(last_phy)
        if msg is not None:
            f.end_timestamp = msg.store_timestamp
    else:
        f.end_phy_offset = f.begin_phy_offset
        f.end_timestamp = f.begin_timestamp
    f.write_header()
    f.flush()
    log.warning("%s: %d index entries for messages at or past the commitlog's end %d removed", f.path, count - k, end)
    return count - k


# --- where to re-dispatch from --------------------------------------------------------------------------
def reput_start(commit_log: CommitLog, cqs: ConsumeQueueTable, index_end: int | None, clean: bool,
                report: RecoveryReport, noted_dispatched: int | None = None) -> int:
    """Where the dispatcher must start so that no consume queue unit or index entry is missing.
    noted_dispatched: after a process crash, the dispatcher's last note (everything below it was written
    and the page cache kept it); otherwise a crash re-dispatches from the checkpoint's file."""
    min_off = max(commit_log.get_min_offset(), 0)
    candidates = []
    cq_max = cqs.max_physic_offset()
    candidates.append(cq_max if cq_max >= 0 else min_off)
    for cq in cqs:
        last = cq.queue.last
        # A queue whose last file is full or empty may have lost the file after it (a deleted or
        # never-flushed tail): rebuild from its own end.
        if last is None or last.wrote_position in (0, last.file_size):
            candidates.append(cq.max_physic_offset if cq.max_physic_offset >= 0 else min_off)
    for cq in report.rebuild_queues:   # queues that lost units: rebuild them
        candidates.append(cq.max_physic_offset if cq.max_physic_offset >= 0 else min_off)
    if index_end is not None:
        candidates.append(index_end)
    if not clean:
        candidates.append(report.commitlog_checked_from if noted_dispatched is None else noted_dispatched)
    return max(min_off, min(candidates))
