"""Recovery at open: bring the commitlog, consume queues and index back to an agreeing state.

recover_store(store) runs, in order:

1. load: a short LAST file of a directory (a crash between creating a file and sizing it, a cut copy) is
   extended with zeros (MappedFileQueue.load); a short file elsewhere is a CorruptStoreError naming it.
2. commitlog: after a clean shutdown (no `abort` file) records are checked from the third-last file; after a
   crash from the newest file whose first message is older than what the checkpoint vouches for (all files
   when the checkpoint is missing). Records are walked (CRC checked with checkCRCOnRecover) up to the last
   valid one; everything after it is cut off, and the report names the file, offset and reason.
3. consume queues: units are kept up to the first invalid one (bad values, out of order, pointing past the
   commitlog's end); the rest is removed and rebuilt from the commitlog. Min offsets follow the commitlog's.
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
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from . import codec
from .checkpoint import StoreCheckpoint
from .commit_log import CommitLog
from .config import StoreConfig
from .consume_queue import UNIT, ConsumeQueue, ConsumeQueueTable
from .mapped_file import MappedFile

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
    end = recover_commit_log(cl, store.checkpoint, clean, report)
    recover_consume_queues(cqs, end, report, cl)
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
    mm = mf.mm
    if mf.file_size < codec.HEADER_V4.size:
        return 0
    total, magic = codec._II.unpack_from(mm, 0)
    if magic not in (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2):
        return 0
    sys_flag = codec._I.unpack_from(mm, codec.POS_SYSFLAG)[0]
    return codec.struct.unpack_from(">q", mm, codec.store_timestamp_pos(sys_flag))[0]


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
                       report: RecoveryReport) -> int:
    """Walk records to the last valid one, cut the rest; returns the commitlog's new end offset."""
    q = commit_log.queue
    files = q.files
    if not files:
        q.flushed_where = q.committed_where = 0
        report.commitlog_end = 0
        return 0
    idx = choose_start_file(files, clean, checkpoint, commit_log.config)
    report.commitlog_checked_from = files[idx].file_from_offset
    check_crc = commit_log.config.check_crc_on_recover
    process = files[idx].file_from_offset
    while idx < len(files):
        mf = files[idx]
        pos = 0
        blank = False
        # the walk stops at the file's first hole (never written: zeros, and on a full tmpfs a read of it
        # through the mapping dies of SIGBUS); a record running into it was cut short
        data_end = mf.data_end()
        try:
            pos, kind, _ = codec.walk_records(mf.mm, 0, data_end, check_crc)
            blank = kind == codec.KIND_BLANK
        except codec.RecordError as e:
            pos = e.pos
            if data_end < mf.file_size and _blank_to_file_end(mf, pos, data_end):
                blank = True
            else:
                reason = e.reason if data_end == mf.file_size else \
                    f"{e.reason}; the file's written data ends at byte {data_end}"
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


_REC_HEAD = np.dtype(codec.RECORD_PREFIX_FIELDS)
_MAGICS = (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2)


def first_unit_not_matching(cq: ConsumeQueue, commit_log: CommitLog, start_index: int) -> int | None:
    """The first unit from start_index whose commitlog record does not say the same: its size, magic code,
    queue id, queue offset (= the unit's number) and physical offset (= the unit's offset). Units pointing
    below the commitlog's min offset (cleaned) are not checked. None when every unit matches."""
    hi = cq.get_max_offset_in_queue()
    start_index = max(start_index, cq.get_min_offset_in_queue())
    if start_index >= hi:
        return None
    units = cq.units(start_index, hi)
    files = ((mf.file_from_offset, mf.file_from_offset + mf.file_size, lambda mf=mf: np.frombuffer(mf.mm, np.uint8))
             for mf in list(commit_log.queue.files))
    return first_unit_mismatch(units["offset"].astype(np.int64), units["size"].astype(np.int64), start_index,
                               cq.queue_id, files, commit_log.get_min_offset())


def first_unit_mismatch(off: np.ndarray, size: np.ndarray, start_index: int, queue_id: int, files,
                        cl_min: int) -> int | None:
    """first_unit_not_matching over arrays: the units (offsets, sizes) numbered from start_index, and the
    commitlog files as (first offset, end offset, a function giving the file's bytes as a uint8 array)."""
    filler = (size == codec.CQ_BLANK_SIZE) & (off == 0)
    width = _REC_HEAD.itemsize
    bad = np.zeros(len(off), dtype=bool)
    for lo, hi, load in files:
        sel = np.flatnonzero((off >= lo) & (off < hi) & ~filler)
        if not len(sel):
            continue
        raw = load()
        pos = off[sel] - lo
        inside = pos + width <= len(raw)
        bad[sel[~inside]] = True
        sel, pos = sel[inside], pos[inside]
        head = raw[pos[:, None] + np.arange(width)].view(_REC_HEAD).reshape(-1)
        del raw
        ok = ((head["total"] == size[sel]) & np.isin(head["magic"], _MAGICS) & (head["queue_id"] == queue_id)
              & (head["queue_offset"] == start_index + sel) & (head["phys"] == off[sel]))
        bad[sel[~ok]] = True
    bad &= ~filler & (off >= max(cl_min, 0))
    first = np.flatnonzero(bad)
    return start_index + int(first[0]) if len(first) else None


def recover_consume_queues(cqs: ConsumeQueueTable, commitlog_end: int, report: RecoveryReport,
                           commit_log: CommitLog | None = None) -> None:
    """Keep each queue's units up to the first invalid one; remove units past the commitlog's end. With the
    commitlog, the units of each queue's last file must also match the records they point at (a torn or
    damaged unit there is cut with everything after it, and rebuilt)."""
    for cq in cqs:
        before = cq.get_max_offset_in_queue()
        dropped = cq.recover(commitlog_end)
        files = cq.queue.files
        if commit_log is not None and files:
            check_from = files[-1].file_from_offset // UNIT
            bad = first_unit_not_matching(cq, commit_log, check_from)
            if bad is not None:
                log.warning("%s: unit %d does not match the commitlog record it points at: it and later units are "
                            "dropped and rebuilt", cq.queue.store_path, bad)
                n = cq.get_max_offset_in_queue()
                with cq.lock:
                    cq.queue.truncate_dirty_files(bad * UNIT)
                    cq.queue.set_positions_from(bad * UNIT)
                dropped += n - cq.get_max_offset_in_queue()
        last = _last_unit(cq)
        if last is not None and last[0] + last[1] > commitlog_end:
            # units older than the files recover() checks still point past the end: cut them as well
            n = cq.get_max_offset_in_queue()
            cq.truncate_dirty_logic_files(commitlog_end)
            dropped += n - cq.get_max_offset_in_queue()
            last = _last_unit(cq)
        cq.max_physic_offset = last[0] + last[1] if last is not None else -1
        if dropped:
            name = f"{cq.topic}/{cq.queue_id}"
            report.consume_queue_units_dropped[name] = dropped
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
    slots_base = codec.INDEX_HEADER_SIZE
    problems = []
    slots = np.frombuffer(mm, dtype=">i4", count=f.hash_slot_num, offset=slots_base)
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
    half-finished put but damage, left for index_file_problems to report. Returns how many slots changed."""
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
