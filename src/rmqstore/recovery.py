"""Recovery at open: bring the commitlog, consume queues and index back to an agreeing state.

After a clean shutdown (no `abort` file) the commitlog is checked from its third-last file; after a crash
from the newest file whose first message is older than what the checkpoint vouches for. Records are
walked (CRC checked with checkCRCOnRecover) up to the last valid one; everything after it is cut off.
Consume queue units past that point are removed. Then the dispatcher re-runs from the earliest point the
consume queues or the index may lack (their own max physical offsets, and after a crash the checkpoint's
file as well), whatever file that is in: a unit or index entry already present is not written twice.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from . import codec
from .checkpoint import StoreCheckpoint
from .commit_log import CommitLog
from .config import StoreConfig
from .consume_queue import ConsumeQueueTable
from .mapped_file import MappedFile

log = logging.getLogger(__name__)


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
    consume_queue_units_dropped: dict[str, int] = field(default_factory=dict)
    index_files_dropped: int = 0
    redispatched_from: int = 0
    redispatched_messages: int = 0

    def summary(self) -> str:
        parts = [f"{'clean' if self.clean_shutdown else 'abnormal'} shutdown",
                 f"commitlog checked from {self.commitlog_checked_from}, ends at {self.commitlog_end}"]
        if self.dropped_at is not None:
            parts.append(f"dropped data from offset {self.dropped_at} ({self.dropped_path}: {self.dropped_reason})")
        if self.commitlog_files_removed:
            parts.append(f"{self.commitlog_files_removed} commitlog files removed")
        if self.consume_queue_units_dropped:
            parts.append(f"consume queue units dropped: {self.consume_queue_units_dropped}")
        if self.index_files_dropped:
            parts.append(f"{self.index_files_dropped} index files dropped")
        parts.append(f"re-dispatched {self.redispatched_messages} messages from {self.redispatched_from}")
        if not self.checkpoint_found:
            parts.append("checkpoint was missing")
        return "; ".join(parts)


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
    check = codec.check_record
    while idx < len(files):
        mf = files[idx]
        mm, limit, pos = mf.mm, mf.file_size, 0
        blank = False
        try:
            while pos < limit:
                kind, size = check(mm, pos, limit, check_crc)
                if kind == codec.KIND_END:
                    break
                if kind == codec.KIND_BLANK:
                    blank = True
                    break
                pos += size
        except codec.RecordError as e:
            report.dropped_at = mf.file_from_offset + pos
            report.dropped_reason = e.reason
            report.dropped_path = str(mf.path)
            log.warning("%s: invalid record at offset %d (%s): the commitlog ends there", mf.path, pos, e.reason)
        process = mf.file_from_offset + pos
        if blank and idx + 1 < len(files):
            idx += 1
            continue
        if blank:
            process = mf.file_from_offset + mf.file_size
        break
    report.commitlog_files_removed = sum(1 for mf in files if mf.file_from_offset > process)
    if report.dropped_at is None and process < files[-1].file_from_offset + files[-1].file_size:
        # Zero bytes ended the data: anything non-zero after them is a torn write, also dropped.
        tail = q.find_mapped_file_by_offset(process)
        if tail is not None and any(tail.mm[process - tail.file_from_offset:
                                            min(tail.file_size, process - tail.file_from_offset + 65536)]):
            report.dropped_at, report.dropped_reason, report.dropped_path = process, "data after a gap", str(tail.path)
    q.truncate_dirty_files(process)
    q.set_positions_from(process)
    report.commitlog_end = process
    return process


def recover_consume_queues(cqs: ConsumeQueueTable, commitlog_end: int, report: RecoveryReport) -> None:
    for cq in cqs:
        dropped = cq.recover()
        if cq.max_physic_offset > commitlog_end:
            before = cq.get_max_offset_in_queue()
            cq.truncate_dirty_logic_files(commitlog_end)
            dropped += before - cq.get_max_offset_in_queue()
        if dropped:
            report.consume_queue_units_dropped[f"{cq.topic}/{cq.queue_id}"] = dropped


def reput_start(commit_log: CommitLog, cqs: ConsumeQueueTable, index_end: int | None, clean: bool,
                report: RecoveryReport) -> int:
    """Where the dispatcher must start so that no consume queue unit or index entry is missing."""
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
    if index_end is not None:
        candidates.append(index_end)
    if not clean:
        candidates.append(report.commitlog_checked_from)
    return max(min_off, min(candidates))
