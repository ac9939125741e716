"""Recovery at open: bring the commitlog, consume queues and index back to an agreeing state.

Plan, then apply (the shape of Kafka's LogLoader and LogSegment.recover):

* plan_recovery(read_inputs(root), config) -> RecoveryPlan reads the store and writes nothing: the steps
  below run over the store's files mapped privately (StoreFiles(read_only=True): MappedFileQueue,
  ConsumeQueueTable and IndexService over ReadOnlyMappedFiles, whose cuts and writes stay in memory), and
  the state they end in is the plan: the commitlog's end and skipped ranges, each queue's kept files and
  end, the index files set aside, dropped and cut, where the re-dispatch starts, the Dropped list.
* apply_plan(plan, files, dispatcher): each owner applies its part (MappedFileQueue.truncate_to,
  ConsumeQueue.cut, IndexService.apply_recovery), then the dispatcher re-dispatches from the planned
  offset. recover_store (MessageStore.open) applies it to the store's files; view applies it to
  private mappings (the read-only view, StoreReader): both serve the same queues by construction.

The steps, in order:

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

The fast open (open_trust.py): after a clean shutdown or a crash of the process alone, the files the
verified-state record (verified_state.py: written at every clean close, renewed while running) vouches for
are not read again: the commitlog walk of step 2 starts after them (with every file vouched for, and the
records before the record's end leading to it, nothing is walked), step 3 recovers and checks only the
units they do not vouch for (and those of records walked), step 4 deep-checks only index entries they do
not vouch for. What RocketMQ's rule would have walked and this did not is RecoveryReport.deferred_crc: the
background check (background_check.py) walks it with CRCs, and checks every unit and full index file,
once the store serves.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

import numpy as np

from ..format import codec, resync, scanner
from ..state.checkpoint import StoreCheckpoint, read_checkpoint
from ..commitlog.commit_log import CommitLog
from ..conf.config import StoreConfig
from ..consumequeue.consume_queue import UNIT, ConsumeQueue, ConsumeQueueTable
from ...errors import CorruptStoreError
from ..state.failure import FailureChannel, FailureKind
from ..index.index_file import cut_entries, repair_slots as repair_index_slots
from ..state.lock import AbortFile
from .open_trust import OpenTrust, first_real_unit_below, first_real_unit_position, first_unit_pointing_at
from .queue_check import (CQ_CHECK_SAMPLE, UNIT_OTHER_QUEUE, UNIT_REASONS, _commitlog_sources, check_queue,
                          moved_record, unit_offsets_from)
from ..files.mapped_file import MappedFile, MappedFileQueue, offset_to_file_name

if TYPE_CHECKING:  # pragma: no cover
    from ..index.index_file import IndexFile, IndexService
    from .verified_state import Vouched
    from ..store import MessageStore

log = logging.getLogger(__name__)

# Index files are deep-checked newest first until this many bytes of slots and entries were read (the
# newest file always): small stores are checked whole, a default-sized store's newest file or two.
INDEX_DEEP_CHECK_BYTES = 64 << 20


@dataclass(frozen=True)
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
    verified_files: int = 0                # files the verified-state record vouched for (not re-checked)
    deferred_crc: list[tuple[int, int]] = field(default_factory=list)   # left to the background check
    vouched_queues: set = field(default_factory=set, repr=False)   # "topic/queueId" taken as the record says

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
        if self.verified_files:
            parts.append(f"{self.verified_files} files unchanged since verified")
        if self.deferred_crc:
            n = sum(b - a for a, b in self.deferred_crc)
            parts.append(f"CRC check of {n} commitlog bytes left to the background check")
        if self.redispatch_error:
            parts.append(self.redispatch_error)
        if not self.checkpoint_found:
            parts.append("checkpoint was missing")
        parts.append(f"{self.seconds:.3f} s")
        return "; ".join(parts)


# --- inputs and the plan --------------------------------------------------------------------------------
@dataclass(frozen=True)
class RecoveryInputs:
    """What recovery decides from besides the files: read with read_inputs, changing nothing."""
    root: Path
    clean: bool                                   # no abort file: the last run shut down cleanly
    crash_dispatched: int | None                  # process-only crash: the dispatcher's last note
    checkpoint: tuple[int, int, int] | None       # physic, logics, index timestamps; None: no file
    accepted_damage: tuple[tuple[int, int], ...] = ()   # commitlog ranges `check --repair` quarantined
    deleted_queues: tuple[tuple[str, int, int], ...] = ()   # (topic, queue id, below): deleted_queues.py
    verified: Mapping[str, "Vouched"] = field(default_factory=dict)   # files matching verified_state's record
    recorded: frozenset[str] = frozenset()        # every path that record lists (present or not)

    @property
    def process_crash(self) -> bool:
        return self.crash_dispatched is not None

    def _ts(self, i: int) -> int:
        return self.checkpoint[i] if self.checkpoint is not None else 0

    def min_timestamp(self) -> int:
        """What the commitlog is known flushed up to, minus RocketMQ's 3 s margin (StoreCheckpoint's)."""
        return max(min(self._ts(0), self._ts(1)) - 3000, 0)

    def min_timestamp_index(self) -> int:
        return min(self.min_timestamp(), self._ts(2))


def read_inputs(root: str | Path) -> RecoveryInputs:
    """The abort file (and its note), the checkpoint and the verified-state record (after a clean shutdown
    or a crash of the process alone: the files that match it) of the store at root, read only."""
    root = Path(root)
    abort = AbortFile(root)
    clean = not abort.exists()
    note = None if clean else abort.read_note()
    from ..commitlog.damage import accepted_ranges
    from ..consumequeue.deleted_queues import load as load_deleted
    from . import verified_state
    state = verified_state.load(root) if clean or note is not None else verified_state.EMPTY
    return RecoveryInputs(root, clean, None if note is None else note.dispatched,
                          read_checkpoint(root / "checkpoint"), tuple(accepted_ranges(root)),
                          tuple((t, q, b) for (t, q), b in sorted(load_deleted(root, backup_ok=False).items())),
                          verified_state.matching(root, state), frozenset(state.files))


@dataclass(frozen=True)
class SkippedRange:
    """A commitlog range recovery skips (damage followed by valid records, or a missing file)."""
    start: int
    end: int
    kind: FailureKind
    path: str
    reason: str


@dataclass(frozen=True)
class CommitLogPlan:
    checked_from: int                   # the walk started at this file
    end: int                            # the commitlog is cut here (MappedFileQueue.truncate_to)
    files_removed: int
    skipped: tuple[SkippedRange, ...] = ()


@dataclass(frozen=True)
class QueuePlan:
    """One consume queue after recovery (ConsumeQueue.cut): its first files_kept files, cut at byte end."""
    topic: str
    queue_id: int
    files_kept: int
    end: int
    max_physic_offset: int
    min_logic_offset: int
    as_is: bool = False     # the verified-state record vouches for it as it is: nothing to cut, no tail to zero


@dataclass(frozen=True)
class IndexCut:
    """The last kept index file keeps its first `keep` entries (IndexFile.cut_entries)."""
    name: str
    keep: int
    end_phy_offset: int
    end_timestamp: int


@dataclass(frozen=True)
class IndexPlan:
    newer_destroyed: tuple[str, ...]        # after a crash: newer than the index checkpoint (RocketMQ's rule)
    set_aside: tuple[tuple[str, str], ...]  # (name, why): renamed NAME.corrupt, keys indexed again
    dropped: tuple[str, ...]                # deleted (after a corrupt file, past the commitlog's end)
    repair_slots: str | None                # process crash: slots of this file moved down their chains
    cut: IndexCut | None
    kept: tuple[str, ...]
    resume_from: int                        # the index needs the messages from this commitlog offset
    indexed_through: int                    # the message at this offset is indexed already (-1: none)


@dataclass(frozen=True)
class RecoveryPlan:
    """What recovery does to a store (plan_recovery): every owner applies its part (apply_plan), the
    read-only view applies it in memory (view). Values only; the Dropped list says what and why."""
    inputs: RecoveryInputs
    commitlog: CommitLogPlan
    queues: tuple[QueuePlan, ...]
    index: IndexPlan | None
    reput_from: int
    dropped: tuple[Dropped, ...]
    repaired_files: tuple[tuple[str, int], ...]
    dropped_at: int | None
    dropped_reason: str | None
    dropped_path: str | None
    consume_queue_units_dropped: tuple[tuple[str, int], ...]
    index_files_dropped: int
    index_entries_dropped: int
    deferred_crc: tuple[tuple[int, int], ...] = ()     # commitlog ranges the background check walks
    verified_files: int = 0

    def report(self) -> RecoveryReport:
        """The RecoveryReport of this plan (re-dispatch figures are added when it is applied)."""
        i = self.inputs
        return RecoveryReport(
            clean_shutdown=i.clean, checkpoint_found=i.checkpoint is not None,
            commitlog_checked_from=self.commitlog.checked_from, commitlog_end=self.commitlog.end,
            dropped_at=self.dropped_at, dropped_reason=self.dropped_reason, dropped_path=self.dropped_path,
            commitlog_files_removed=self.commitlog.files_removed, repaired_files=list(self.repaired_files),
            consume_queue_units_dropped=dict(self.consume_queue_units_dropped),
            index_files_dropped=self.index_files_dropped, index_entries_dropped=self.index_entries_dropped,
            index_files_rebuilt=len(self.index.newer_destroyed) if self.index is not None else 0,
            process_crash=i.process_crash, dropped=list(self.dropped), redispatched_from=self.reput_from,
            skipped_ranges=[(r.start, r.end) for r in self.commitlog.skipped],
            verified_files=self.verified_files, deferred_crc=list(self.deferred_crc))


class StoreFiles:
    """The commitlog, consume queues and index of a store directory, loaded by recovery: read-write (what
    MessageStore serves) or read-only (private mappings: what recovery changes stays in memory)."""

    def __init__(self, root: str | Path, config: StoreConfig, *, read_only: bool,
                 commit_log: CommitLog | None = None, consume_queues: ConsumeQueueTable | None = None,
                 index_service: "IndexService | None" = None):
        from ..index.index_file import IndexService
        self.root = Path(root)
        self.config = config
        self.read_only = read_only
        self.commit_log = commit_log or CommitLog(self.root, config)
        if read_only:       # the same CommitLog over files mapped privately (MappedFileQueue(read_only))
            self.commit_log.queue = MappedFileQueue(self.root / "commitlog", config.mapped_file_size_commit_log,
                                                    read_only=True, short_middle_as_zeros=True)
        self.consume_queues = consume_queues or ConsumeQueueTable(
            self.root, config.mapped_file_size_consume_queue, read_only=read_only)
        self.index_service = index_service or IndexService(self.root, config, read_only=read_only)

    def close(self) -> None:
        self.index_service.shutdown()
        self.consume_queues.shutdown()
        self.commit_log.shutdown()


class _Collect:
    """A failure channel that only collects what recovery would report (the plan replays it)."""

    def __init__(self):
        self.items: list[SkippedRange] = []

    def report(self, kind: FailureKind, reason: str, path: str = "", offset: int = 0, end: int = 0, **_) -> None:
        self.items.append(SkippedRange(offset, end, kind, path, reason))


@dataclass
class _IndexActions:
    set_aside: list[tuple[str, str]] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    repair_slots: str | None = None
    cut: IndexCut | None = None


# --- planning: the recovery, run over private mappings ----------------------------------------------------
def plan_recovery(inputs: RecoveryInputs, config: StoreConfig) -> RecoveryPlan:
    """Work out what recovery does to the store at inputs.root, changing nothing on disk (files are read
    through private mappings, MappedFileQueue(read_only=True); module docstring for the steps)."""
    files = StoreFiles(inputs.root, config, read_only=True)
    try:
        return simulate(files, inputs)
    finally:
        files.close()


def simulate(files: StoreFiles, inputs: RecoveryInputs) -> RecoveryPlan:
    """Recover the read-only `files` in memory and return the plan that brings the disk to the same state
    (plan_recovery; view keeps the files: the store as it reads after recovery)."""
    assert files.read_only, "simulate() changes its files: read-only ones only"
    report = RecoveryReport(clean_shutdown=inputs.clean, checkpoint_found=inputs.checkpoint is not None,
                            process_crash=inputs.process_crash)
    cl, cqs, idx, cfg = files.commit_log, files.consume_queues, files.index_service, files.config
    cl.load()
    cqs.load()
    report.repaired_files = list(cl.queue.repaired) + [r for cq in cqs for r in cq.queue.repaired]
    for path, size in report.repaired_files:
        report.dropped.append(Dropped("file", path, size, "cut short: extended with zeros"))
    idx.load(inputs.clean or inputs.process_crash, inputs._ts(2))
    newer = tuple(p.name for p in idx.destroyed_files)
    collected = _Collect()
    trust = OpenTrust(inputs.root, inputs.verified, inputs.recorded)
    end = recover_commit_log(cl, inputs, inputs.clean, report, collected,
                             hints=lambda start: unit_offsets_from(cqs, start), trust=trust, cqs=cqs)
    deep_from = report.commitlog_checked_from
    if trust:       # units of commitlog files the record does not vouch for are checked against them
        old = trust.untrusted_commitlog_from(cl.queue.files)
        deep_from = min(deep_from, old) if old is not None else deep_from
    recover_consume_queues(cqs, end, report, cl, trust=trust if trust else None, deep_from_offset=deep_from,
                           failures=collected)
    if report.skipped_ranges:       # units of skipped records: fillers (never answered with damaged bytes)
        from ..consumequeue.dispatch import blank_units_in
        blank_units_in(cqs, report.skipped_ranges)
    cl_min = max(cl.get_min_offset(), 0)
    for cq in cqs:
        if first_real_unit_below(cq, cl_min):
            cq.correct_min_offset(cl_min)
    actions = _IndexActions()
    index_end = recover_index(idx, cl, end, report, repair_slots=inputs.process_crash, actions=actions,
                              check_from=trust.index_check_from if trust else None) \
        if cfg.message_index_enable else None
    # after a clean shutdown the record tells a queue that ended with a full file, and an index that ends
    # before the commitlog (the last messages carry no key, or none does: no index file), from lost files:
    # neither makes the dispatcher start over (the rule alone re-reads the commitlog from a full queue's
    # end, from the last keyed message, or from 0, at every start)
    closed = inputs.clean and trust
    start = reput_start(cl, cqs, None if closed and trust.index_complete(cl.queue.files, idx.files) else index_end,
                        inputs.clean, report, inputs.crash_dispatched,
                        complete=trust.queue_ends_here if closed else None)
    queues = tuple(QueuePlan(cq.topic, cq.queue_id, len(cq.queue.files), cq.queue.get_max_wrote_position(),
                             cq.max_physic_offset, cq.min_logic_offset,
                             f"{cq.topic}/{cq.queue_id}" in report.vouched_queues) for cq in cqs.sorted_queues())
    index = None
    if index_end is not None:
        index = IndexPlan(newer, tuple(actions.set_aside), tuple(actions.dropped), actions.repair_slots,
                          actions.cut, tuple(f.name for f in idx.files), index_end, idx.indexed_through)
    return RecoveryPlan(
        inputs, CommitLogPlan(report.commitlog_checked_from, end, report.commitlog_files_removed,
                              tuple(collected.items)),
        queues, index, start, tuple(report.dropped), tuple(report.repaired_files), report.dropped_at,
        report.dropped_reason, report.dropped_path, tuple(report.consume_queue_units_dropped.items()),
        report.index_files_dropped, report.index_entries_dropped, tuple(report.deferred_crc), len(inputs.verified))


# --- applying: each owner its part ----------------------------------------------------------------------
def recover_store(store: "MessageStore") -> RecoveryReport:
    """MessageStore.open's recovery: plan (read only), apply (each file's owner), re-dispatch; the report."""
    t0 = time.perf_counter()
    inputs = read_inputs(store.path)
    if inputs.checkpoint is None and (store.path / "commitlog").is_dir() and any((store.path / "commitlog").iterdir()):
        log.warning("%s: no checkpoint file: recovering as if it said nothing was flushed", store.path / "checkpoint")
    plan = plan_recovery(inputs, store.config)
    if store.config.is_slave and plan.commitlog.skipped:
        # a slave's master holds these bytes: cut the log at the first damage (the bytes kept aside) and
        # let the master stream them again, rather than live with a skipped range
        from ..ha.truncate import quarantine_and_truncate
        bad = plan.commitlog.skipped[0]
        log.warning("%s: a SLAVE with damage at commitlog offset %d (%s): cut there, the master sends the rest "
                    "again", store.path, bad.start, bad.reason)
        quarantine_and_truncate(store.path, store.config, bad.start, plan.commitlog.end,
                                f"slave recovery: {bad.reason}")
        inputs = read_inputs(store.path)
        plan = plan_recovery(inputs, store.config)
    store.checkpoint = StoreCheckpoint(store.path / "checkpoint")
    files = StoreFiles(store.path, store.config, read_only=False, commit_log=store.commit_log,
                       consume_queues=store.consume_queues, index_service=store.index_service)
    report = apply_plan(plan, files, store.dispatcher, getattr(store, "failures", None))
    report.seconds = time.perf_counter() - t0
    level = logging.INFO if inputs.clean and not report.damaged else logging.WARNING
    log.log(level, "%s: recovered: %s", store.path, report.summary())
    for d in report.dropped:
        log.warning("%s: recovery dropped: %s", store.path, d)
    return report


def apply_plan(plan: RecoveryPlan, files: StoreFiles, dispatcher, failures: FailureChannel | None = None) \
        -> RecoveryReport:
    """Bring `files` to the planned state (read-write files: on disk; read-only ones: in memory), then
    re-dispatch from the planned offset with `dispatcher` (a Dispatcher over the same files)."""
    report = plan.report()
    cl, cqs, idx = files.commit_log, files.consume_queues, files.index_service
    cl.load()
    cl.queue.truncate_to(plan.commitlog.end)
    for r in plan.commitlog.skipped:
        dispatcher.add_skip_range(r.start, r.end)      # damaged ranges stay undispatched
        if failures is not None:
            failures.report(r.kind, r.reason, path=r.path, offset=r.start, end=r.end)
    cqs.load()
    for qp in plan.queues:
        cq = cqs.find(qp.topic, qp.queue_id)
        if cq is None:
            raise CorruptStoreError(str(cqs.root / qp.topic / str(qp.queue_id)), 0,
                                    "consume queue changed while the store was being recovered")
        if qp.as_is and qp.files_kept == len(cq.queue.files):
            cq.queue.set_positions_from(qp.end)
            cq.max_physic_offset, cq.min_logic_offset = qp.max_physic_offset, qp.min_logic_offset
        else:
            cq.cut(qp.files_kept, qp.end, qp.max_physic_offset, qp.min_logic_offset)
    for a, b in plan.inputs.accepted_damage:           # quarantined by check --repair: never dispatched
        dispatcher.add_skip_range(a, b)
    dispatcher.deleted = {(t, q): b for t, q, b in plan.inputs.deleted_queues}   # deleteTopic: never again
    redo_from = _finish_deletions(cqs, plan.inputs.deleted_queues, report)
    ranges = [(r.start, r.end) for r in plan.commitlog.skipped] + list(plan.inputs.accepted_damage)
    if ranges:
        from ..consumequeue.dispatch import blank_units_in
        blank_units_in(cqs, ranges)
    i = plan.inputs
    idx.load(i.clean or i.process_crash, i._ts(2))
    if plan.index is not None:
        gone = idx.apply_recovery(plan.index)
        if gone is not None:
            report.dropped.append(Dropped("index", gone[0], 0, "entries past the commitlog's end and slots not "
                                          "allocated (disk full): dropped, its keys are indexed again", gone[1]))
            report.index_files_dropped += 1
    dispatcher.reput_from_offset = plan.reput_from if redo_from is None else min(plan.reput_from, redo_from)
    _redispatch(cl, cqs, dispatcher, report)
    return report


def _finish_deletions(cqs: ConsumeQueueTable, deleted, report: RecoveryReport) -> int | None:
    """Redo the deletions a crash interrupted. deleteTopic records a deletion (deletedQueues.json) before it
    removes the queue's files (queue_clean): a crash in between leaves a consume queue that still holds
    units of the deleted generation (below the recorded commitlog offset). Such a queue is removed here,
    before anything is served or dispatched, and starts over at queue offset 0, as the record says
    (idempotent: a queue removed already, or written again, holds no unit below it). Returns the offset to
    re-dispatch from when a removed queue also held units at or above it (a new generation: built again
    from its records), else None."""
    redo = None
    for topic, qid, below in deleted:
        cq = cqs.find(topic, qid)
        if cq is None or cq.get_max_offset_in_queue() <= cq.get_min_offset_in_queue():
            continue
        first = cq.get_unit(cq.get_min_offset_in_queue())
        if first is None or first[0] >= below:
            continue
        last = cq.get_unit(cq.get_max_offset_in_queue() - 1)
        if last is not None and last[0] >= below:
            redo = below if redo is None else min(redo, below)
        n = cq.get_message_total_in_queue()
        cqs.remove(cq)
        with cq.lock:
            if cqs.read_only:
                cq.shutdown()           # a read-only open: left out in memory only
            else:
                cq.destroy()
        if not cqs.read_only:
            try:
                (cqs.root / topic).rmdir()      # only when its last queue directory went
            except OSError:
                pass
        report.dropped.append(Dropped("consume queue", str(cqs.root / topic / str(qid)), 0,
                                      f"units of a deleted generation (below commitlog offset {below}, "
                                      "config/deletedQueues.json): the interrupted deleteTopic finished", n))
    return redo


def _redispatch(cl: CommitLog, cqs: ConsumeQueueTable, dispatcher, report: RecoveryReport) -> None:
    try:
        report.redispatched_messages = dispatcher.do_reput()
    except OSError as e:
        # a consume queue or index write failed (a full disk): the store opens readable, the dispatcher
        # thread tries again from where it stopped; queue offsets go on from the commitlog's records
        reput = dispatcher.reput_from_offset
        dispatcher.write_error = f"dispatch at offset {reput} failed at recovery: {e}"
        report.redispatch_error = dispatcher.write_error
        log.error("%s: %s; the dispatcher tries again once started", cl.queue.store_path, dispatcher.write_error)
        table = cqs.topic_queue_offsets()
        built = {f"{cq.topic}-{cq.queue_id}": cq.max_physic_offset for cq in cqs}
        for (t, q), below in dispatcher.deleted.items():        # a deleted queue's records: not dispatched
            key = f"{t}-{q}"
            built[key] = max(built.get(key, -1), below)
        table.update(_queue_offsets_after(cl, reput, table, built))
        cl.topic_queue_table = table
    else:
        cl.topic_queue_table = cqs.topic_queue_offsets()


def _queue_offsets_after(commit_log: CommitLog, start: int, table: dict[str, int],
                         built: dict[str, int]) -> dict[str, int]:
    """Next queue offsets of the queues that records from start (not dispatched) carry on: what the
    consume queues will hold once the dispatcher has written them. built: each queue's max physical
    offset; records below it are already in the queue (a topic deleted and written again: its old records
    carry queue offsets the queue no longer continues)."""
    out: dict[str, int] = {}
    pos, end = start, commit_log.get_max_offset()
    while pos < end:
        got = commit_log.get_data(pos, 4 << 20)
        if got is None or not got[0]:
            break
        data, base = got
        batch, used, outcome, _ = scanner.parse_dispatch(data, base, True)
        reqs = batch.requests() if isinstance(batch, codec.DispatchBatch) else batch
        for r in reqs:
            key = f"{r.topic}-{r.queue_id}"
            if scanner.is_dispatched(r.sys_flag) and r.commit_log_offset + r.msg_size > built.get(key, -1):
                out[key] = max(out.get(key, table.get(key, 0)), r.consume_queue_offset + 1)
        if outcome == scanner.Outcome.END_OF_FILE:
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
    return scanner.store_timestamp(head, 0)       # 256 bytes hold every header variant


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
                       report: RecoveryReport, failures: FailureChannel | None = None, hints=None,
                       trust: OpenTrust | None = None, cqs=()) -> int:
    """Walk records to the last valid one, cut the rest; returns the commitlog's new end offset. hints(start):
    sorted offsets where records probably start from `start` on (queue_check.unit_offsets_from): faster.
    trust (the verified-state record): files it vouches for are not walked (open_trust.commitlog_start;
    what RocketMQ's rule walks and this does not goes to report.deferred_crc, for the background check).

    Damage stays in its damaged range: a record that fails its checks (or zeros inside the written data)
    followed by valid records that chain (resync.next_valid_record) is skipped, not cut; the skipped
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
    start_pos = 0
    if trust is not None:
        start = trust.commitlog_start(files, idx, clean, cqs)
        report.deferred_crc = list(start.deferred)
        idx, start_pos = start.index, start.pos
        if start.end is not None:       # every file vouched for: the commitlog ends where the record says
            report.commitlog_checked_from = start.end
            _report_cut(q, start.end, report)
            q.truncate_dirty_files(start.end)
            q.set_positions_from(start.end)
            report.commitlog_end = start.end
            return start.end
    report.commitlog_checked_from = process = files[idx].file_from_offset + start_pos
    check_crc = commit_log.config.check_crc_on_recover
    hint = hints(process) if hints is not None else None
    while idx < len(files):
        mf = files[idx]
        nxt = files[idx + 1] if idx + 1 < len(files) else None
        pos, blank, reason = _walk_file(mf, check_crc, nxt, report, failures, _file_part(hint, mf), start_pos)
        start_pos = 0
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
    _report_cut(q, process, report)
    q.truncate_dirty_files(process)
    q.set_positions_from(process)
    report.commitlog_end = process
    return process


def _report_cut(q: MappedFileQueue, process: int, report: RecoveryReport) -> None:
    """Into report: what cutting the commitlog at `process` drops (later files, data after a gap)."""
    files = q.files
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


def _file_part(hint, mf: MappedFile):
    """The hinted offsets inside mf, as positions in the file (None: no hint)."""
    if hint is None:
        return None
    lo, hi = np.searchsorted(hint, [mf.file_from_offset, mf.file_from_offset + mf.file_size])
    return hint[lo:hi] - mf.file_from_offset


def _walk_file(mf: MappedFile, check_crc: bool, nxt: MappedFile | None, report: RecoveryReport,
               failures: FailureChannel | None, hint=None, pos: int = 0) -> tuple[int, bool, str | None]:
    """Walk one file's records from byte pos (a record boundary), skipping damaged ranges after which valid
    records resume: returns (where the valid data ends, whether an END_OF_FILE blank ends it, why the data
    ends there when it is invalid data rather than zeros or a blank)."""
    # the walk stops at the file's first hole (never written: zeros, and on a full tmpfs a read of it
    # through the mapping dies of SIGBUS); a record running into it was cut short
    data_end = mf.data_end()
    while True:
        try:
            pos, kind, _ = scanner.walk_records(mf.mm, pos, data_end, check_crc, hint)
            if kind == scanner.Outcome.END_OF_FILE:
                return pos, True, None
            why = "zero bytes inside the written data" if pos + 8 <= data_end else None
        except scanner.RecordError as e:
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
    found = resync.next_valid_record(mf.mm, pos, data_end, check_crc=True, base=mf.file_from_offset)
    if found is not None:
        return found
    if nxt is not None and nxt.file_from_offset == mf.file_from_offset + mf.file_size and \
            resync.chains_from(nxt.mm, 0, nxt.data_end(), base=nxt.file_from_offset):
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
def _vouched_queue(cq: ConsumeQueue, trust: OpenTrust) -> int:
    """A queue whose every file the record vouches for as it is: it ends where the record says, with nothing
    after (ConsumeQueue.recover without reading its units). Returns 0 (units dropped)."""
    files = cq.queue.files
    if files:
        cq.queue.set_positions_from(files[-1].file_from_offset + trust.end_of(files[-1]))
        cq.min_logic_offset = first_real_unit_position(cq)
    return 0


def _last_unit(cq: ConsumeQueue) -> tuple[int, int] | None:
    """(offset, size) of the queue's last real unit, or None. Filler units (records lost with a skipped
    range) are passed over: they name no commitlog position, and taking their size as one would put the
    queue's max_physic_offset past every record (nothing re-dispatched would ever be written again)."""
    lo, hi = cq.get_min_offset_in_queue(), cq.get_max_offset_in_queue()
    while hi > lo:
        a = cq.units(max(lo, hi - 4096), hi)
        if len(a) != hi - max(lo, hi - 4096):
            return None             # a missing file: no last unit known
        real = np.flatnonzero(~((a["size"] == codec.CQ_BLANK_SIZE) & (a["offset"] == 0)))
        if len(real):
            return int(a["offset"][real[-1]]), int(a["size"][real[-1]])
        hi -= len(a)
    return None


_MAGICS = (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2)

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
            stop, kind, _ = scanner.walk_records(mf.mm, pos - mf.file_from_offset, limit)
        except scanner.RecordError as e:
            if skipped(mf.file_from_offset + e.pos) is not None:
                pos = mf.file_from_offset + e.pos
                continue
            return f"invalid record at offset {mf.file_from_offset + e.pos} of {mf.path}: {e.reason}"
        if kind == scanner.Outcome.END_OF_FILE:
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
                  report: RecoveryReport, cqs: ConsumeQueueTable | None = None, failures=None) -> int:
    """Cut cq at its damaged unit `bad` and mark it for rebuilding from the commitlog (when the commitlog
    can be parsed from there); returns how many units were dropped. When the unit points at a record whose
    QUEUEID or TOPIC was damaged since the unit was written for it (queue_check.moved_record, with cqs),
    that record is skipped like any damaged range (report.skipped_ranges, report.dropped, a CORRUPT_RECORD
    on failures): the rebuild gives it no unit, in the queue it names or anywhere."""
    why = UNIT_REASONS.get(code, "damaged")
    path = str(cq.queue.store_path)
    moved = moved_record(cq, bad, commit_log, cqs.find) if code == UNIT_OTHER_QUEUE and cqs is not None else None
    if moved is not None and not any(a <= moved[0] < b for a, b in report.skipped_ranges):     # (not twice)
        _skip_moved_record(commit_log, *moved, report, failures)
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


def _skip_moved_record(commit_log: CommitLog, off: int, size: int, why: str, report: RecoveryReport,
                       failures) -> None:
    mf = commit_log.file_of(off)
    path = str(mf.path if mf is not None else commit_log.queue.store_path)
    log.warning("%s: the record at commitlog offset %d is skipped: %s", path, off, why)
    report.dropped.append(Dropped("commitlog", path, off, why))
    report.skipped_ranges.append((off, off + size))
    if failures is not None:
        failures.report(FailureKind.CORRUPT_RECORD, why, path=path, offset=off, end=off + size)


def repair_queues_live(commit_log: CommitLog, dispatcher, damaged: list[tuple[ConsumeQueue, int, int]]) -> list[str]:
    """On an open store: cut each (queue, damaged unit, UNIT_* code) there and have the dispatcher rebuild it
    from the commitlog (_repair_queue; the dispatcher thread waits meanwhile: no unit is appended). Returns
    what was done, one line each. MessageStore.check(repair=True) and the background check repair so, each
    from units it read earlier: under the lock each queue is checked again from its damaged unit on, and
    one that another repair rebuilt meanwhile is left alone (cut again, it would be rebuilt while readers
    expect it whole)."""
    rep = RecoveryReport(clean_shutdown=True)
    rep.skipped_ranges = list(dispatcher.skip_ranges)     # passed over by the rebuild, as by the dispatcher
    starts = []
    with dispatcher._lock:
        cl_min = max(commit_log.get_min_offset(), 0)
        sources = _commitlog_sources(commit_log)
        for cq, bad, code in damaged:
            now = check_queue(cq, sources, cl_min, deep_from=bad, sample=0)
            if now is None:
                continue                # repaired meanwhile
            bad, code = now
            known = len(rep.skipped_ranges)
            end = commit_log.get_max_offset()
            rebuilding = cq.rebuilding_to
            # set before the cut: readers keep seeing the units up to it as there (not yet readable)
            cq.rebuilding_to = max(rebuilding, cq.get_max_offset_in_queue())
            done = _repair_queue(cq, commit_log, end, bad, code, rep, dispatcher.consume_queues,
                                 dispatcher.failures)
            for a, b in rep.skipped_ranges[known:]:     # a moved record: never dispatched again
                dispatcher.add_skip_range(a, b)
            if not done:
                cq.rebuilding_to = rebuilding
                continue
            dispatcher.rebuilding[cq] = max(end, dispatcher.rebuilding.get(cq, end))
            last = _last_unit(cq)
            cq.max_physic_offset = last[0] + last[1] if last is not None else -1
            starts.append(cq.max_physic_offset if cq.max_physic_offset >= 0 else cl_min)
        if starts:
            dispatcher.reput_from_offset = min(starts + [dispatcher.reput_from_offset])
    if starts:
        dispatcher.wakeup()
    return [str(d) for d in rep.dropped]


def recover_consume_queues(cqs: ConsumeQueueTable, commitlog_end: int, report: RecoveryReport,
                           commit_log: CommitLog | None = None, trust: OpenTrust | None = None,
                           deep_from_offset: int | None = None, failures=None) -> None:
    """Keep each queue's units up to the first invalid one; remove units past the commitlog's end. With the
    commitlog, each queue is checked whole (check_queue: all units of its last file and a sample of the
    older ones against their records, every unit's values, missing files); a damaged unit is cut with
    everything after it and rebuilt from the commitlog (_repair_queue), reported in report.dropped (and a
    record it shows damaged on `failures`, recovery's collector of skipped ranges). A queue
    whose file was cut short (extended with zeros at load) is rebuilt from its end as well.

    With trust (the verified-state record): files it vouches for are neither recovered nor checked (the
    background check covers every unit once the store serves); units in the other files are recovered and
    checked whole, and so are units of records at or after deep_from_offset (the walk's start, or a
    commitlog file the record does not vouch for)."""
    sources = _commitlog_sources(commit_log) if commit_log is not None else None
    cl_min = commit_log.get_min_offset() if commit_log is not None else 0
    for cq in cqs:
        before = cq.get_max_offset_in_queue()
        untrusted, unit = trust.first_untrusted(cq) if trust is not None else (None, 0)
        name = f"{cq.topic}/{cq.queue_id}"
        if untrusted is not None and untrusted == len(cq.queue.files):
            dropped = _vouched_queue(cq, trust)
            report.vouched_queues.add(name)
        else:
            dropped = cq.recover(commitlog_end, untrusted)
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
            if untrusted is None:
                deep_from = files[-1].file_from_offset // UNIT if files else 0
                found = check_queue(cq, sources, cl_min, deep_from, CQ_CHECK_SAMPLE)
            else:       # units not vouched for, and units of records walked (or not vouched for)
                first = min(unit, cq.get_max_offset_in_queue())
                deep_from = first if deep_from_offset is None else \
                    min(first, first_unit_pointing_at(cq, deep_from_offset))
                found = check_queue(cq, sources, cl_min, deep_from, 0, from_index=deep_from)
            if found is not None:
                rebuilt = _repair_queue(cq, commit_log, commitlog_end, found[0], found[1], report, cqs, failures)
                last = _last_unit(cq)
        cq.max_physic_offset = last[0] + last[1] if last is not None else -1
        if rebuilt or dropped or cq.queue.repaired:
            report.vouched_queues.discard(name)
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


INDEX_CHECK_CHUNK = 1 << 20         # index entries checked at a time (index_file_problems)


def index_file_problems(f: "IndexFile", release: bool = False, from_entry: int = 1) -> list[str]:
    """What is impossible in an index file's slots and its entries from number from_entry on (empty list:
    nothing found). Entries are read INDEX_CHECK_CHUNK at a time; release: each chunk's pages are let go
    from this process once checked (madvise DONTNEED on the file's shared mapping: the background check's
    memory stays bounded)."""
    mm = f.mapped_file.mm
    count = f.index_count
    problems = []
    slots = f.read_slots()          # pread when the slots were never allocated (no SIGBUS on a full disk)
    bad = np.flatnonzero((slots < 0) | (slots >= max(count, 1)))
    if len(bad):
        problems.append(f"{len(bad)} hash slots outside [0, {count}) (slot {int(bad[0])} = {int(slots[bad[0]])})")
    del slots
    found: dict[str, list[int]] = {}        # what -> [how many, first entry]
    prev_phy = None
    for lo in range(max(from_entry, 1), count, INDEX_CHECK_CHUNK):
        n = min(INDEX_CHECK_CHUNK, count - lo)
        at = f.entries_base + lo * codec.INDEX_ENTRY_SIZE
        ent = np.frombuffer(mm, dtype=_ENTRY, count=n, offset=at)
        no = np.arange(lo, lo + n)
        phy = ent["phy_offset"].astype(np.int64)
        back = np.diff(phy) < 0 if prev_phy is None else np.diff(np.concatenate(([prev_phy], phy))) < 0
        checks = (("keyHash < 0", ent["key_hash"] < 0), ("timeDiff < 0", ent["time_diff"] < 0),
                  ("preIndexNo not in [0, own number)", (ent["prev"] < 0) | (ent["prev"] >= no)),
                  ("phyOffset outside the header's range",
                   (phy < f.begin_phy_offset) | (phy > f.end_phy_offset)),
                  ("phyOffset going backwards", np.concatenate(([False], back)) if prev_phy is None else back))
        for what, mask in checks:
            b = np.flatnonzero(mask)
            if len(b):
                seen = found.setdefault(what, [0, int(b[0]) + lo])
                seen[0] += len(b)
        prev_phy = int(phy[-1])
        del ent
        if release:
            let_go_pages(mm, at, n * codec.INDEX_ENTRY_SIZE)
    for what, (n, first) in found.items():
        problems.append(f"{n} entries with {what} (first: entry {first})")
    return problems


def let_go_pages(mm, start: int, length: int) -> None:
    """madvise(DONTNEED) the pages of [start, start + length) of a shared mapping (its file keeps them)."""
    import mmap as _mmap
    a = start - start % _mmap.PAGESIZE
    try:
        mm.madvise(_mmap.MADV_DONTNEED, a, start + length - a)
    except (OSError, ValueError, AttributeError):
        pass


def recover_index(idx: "IndexService", commit_log: CommitLog, commitlog_end: int, report: RecoveryReport,
                  repair_slots: bool = False, actions: _IndexActions | None = None, check_from=None) -> int:
    """Set aside corrupt index files (and re-index from before them), cut entries past the commitlog's end.
    repair_slots (after a process crash): slots of the newest file pointing at entries written but not yet
    published by the header are moved down their chains first. Returns the commitlog offset from which the
    index needs the messages again. `actions` collects what was done, by file name (the plan). check_from(f):
    the first entry of f to deep-check (None: none; open_trust.OpenTrust.index_check_from: the entries the
    verified-state record vouches for are checked by the background check)."""
    actions = actions if actions is not None else _IndexActions()
    with idx._lock:
        files: list = list(idx.files)
        if repair_slots and files:
            actions.repair_slots = files[-1].name
            n = repair_index_slots(files[-1], files[-1].index_count)
            if n:
                log.info("%s: %d hash slots pointed at entries not yet counted in the header: moved down their "
                         "chains", files[-1].path, n)
        drop_from, gone = _set_aside_corrupt(idx, files, report, actions, check_from)
        keep = []
        for i, f in enumerate(files):
            if f is None:
                continue
            if drop_from is not None and i > drop_from:
                _drop(f, "after a corrupt index file: its keys are indexed again", report, actions)
                gone += 1
                continue
            keep.append(f)
        gone += _cut_past_end(keep, commitlog_end, commit_log, report, actions)
        idx.files = keep
    if actions.repair_slots not in [f.name for f in keep]:
        actions.repair_slots = None
    report.index_files_dropped = gone
    return _resume_from(idx, keep, commit_log)


def _set_aside_corrupt(idx: "IndexService", files: list, report: RecoveryReport,
                       actions: _IndexActions, check_from=None) -> tuple[int | None, int]:
    """Files load() set aside (impossible header) and files failing the deep check, newest first within
    INDEX_DEEP_CHECK_BYTES (set aside, their entry in `files` becomes None). Returns (the index in files
    after which every file goes, or None; how many files went)."""
    gone = 0
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
        first = check_from(f) if check_from is not None else 1
        if first is None:
            continue
        cost = f.hash_slot_num * codec.INDEX_HASH_SLOT_SIZE + max(f.index_count - first, 0) * codec.INDEX_ENTRY_SIZE
        if i < len(files) - 1 and checked + cost > INDEX_DEEP_CHECK_BYTES:
            log.info("%s: index files up to %s not deep-checked (over %d bytes)", idx.store_path, f.name,
                     INDEX_DEEP_CHECK_BYTES)
            break
        checked += cost
        problems = index_file_problems(f, from_entry=first)
        if problems:
            why = "; ".join(problems)
            aside = idx.set_aside(f, why)
            actions.set_aside.append((f.name, why))
            report.dropped.append(Dropped("index", str(f.path), 0, f"{why}; set aside as {aside}"))
            gone += 1
            files[i] = None
            drop_from = i if drop_from is None else min(drop_from, i)
    return drop_from, gone


def _drop(f: "IndexFile", why: str, report: RecoveryReport, actions: _IndexActions, entries: bool = False) -> None:
    report.dropped.append(Dropped("index", str(f.path), 0, why, f.index_count - 1))
    if entries:
        report.index_entries_dropped += max(f.index_count - 1, 0)
    actions.dropped.append(f.name)
    f.destroy()


def _cut_past_end(keep: list, commitlog_end: int, commit_log: CommitLog, report: RecoveryReport,
                  actions: _IndexActions) -> int:
    """Entries past the commitlog's end (it was cut): whole files go, the last kept file is cut. Returns
    how many files went."""
    gone = 0
    while keep and ((keep[-1].index_count <= 1 and keep[-1].end_phy_offset >= commitlog_end > 0)
                    or (keep[-1].index_count > 1 and keep[-1].begin_phy_offset >= commitlog_end)):
        _drop(keep.pop(), f"indexes only messages past the commitlog's end {commitlog_end}", report, actions, True)
        gone += 1
    if keep and keep[-1].end_phy_offset >= commitlog_end and keep[-1].index_count > 1 \
            and not keep[-1].slots_allocated:
        # its slots are holes (a full disk): cutting would write them through the mapping (SIGBUS on
        # tmpfs); set the file aside instead, the re-dispatch indexes its messages again
        _drop(keep.pop(), f"entries past the commitlog's end {commitlog_end} and slots not allocated (disk full): "
              "set aside, its keys are indexed again", report, actions, True)
        gone += 1
    if keep and keep[-1].end_phy_offset >= commitlog_end and keep[-1].index_count > 1:
        actions.cut = _index_cut(keep[-1], commitlog_end, commit_log)
        n = cut_entries(keep[-1], actions.cut.keep, actions.cut.end_phy_offset, actions.cut.end_timestamp)
        report.index_entries_dropped += n
        report.dropped.append(Dropped("index", str(keep[-1].path), 0,
                                      f"entries for messages at or past the commitlog's end {commitlog_end}", n))
    return gone


def _resume_from(idx: "IndexService", keep: list, commit_log: CommitLog) -> int:
    """The commitlog offset after the last indexed message (0: nothing indexed); sets idx.indexed_through."""
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


def _index_cut(f: "IndexFile", end: int, commit_log: CommitLog) -> IndexCut:
    """Where f is cut so that it indexes no message at or past end (entries are in commitlog order):
    how many entries stay, and the header's new end values."""
    ent = np.frombuffer(f.mapped_file.mm, dtype=_ENTRY, count=f.index_count, offset=f.entries_base)
    phy = ent["phy_offset"].astype(np.int64)
    del ent
    k = int(np.searchsorted(phy[1:], end, side="left")) + 1     # first entry number to remove
    if k >= f.index_count:
        return IndexCut(f.name, f.index_count, f.end_phy_offset, f.end_timestamp)
    if k <= 1:
        return IndexCut(f.name, k, f.begin_phy_offset, f.begin_timestamp)
    last_phy = int(phy[k - 1])
    msg = commit_log.look_message_by_offset(last_phy)
    return IndexCut(f.name, k, last_phy, msg.store_timestamp if msg is not None else f.end_timestamp)


# --- where to re-dispatch from --------------------------------------------------------------------------
def reput_start(commit_log: CommitLog, cqs: ConsumeQueueTable, index_end: int | None, clean: bool,
                report: RecoveryReport, noted_dispatched: int | None = None, complete=None) -> int:
    """Where the dispatcher must start so that no consume queue unit or index entry is missing.
    noted_dispatched: after a process crash, the dispatcher's last note (everything below it was written
    and the page cache kept it); otherwise a crash re-dispatches from the checkpoint's file. complete(cq):
    the queue is known to end with its last file (OpenTrust.queue_ends_here)."""
    min_off = max(commit_log.get_min_offset(), 0)
    candidates = []
    cq_max = cqs.max_physic_offset()
    candidates.append(cq_max if cq_max >= 0 else min_off)
    for cq in cqs:
        last = cq.queue.last
        # A queue whose last file is full or empty may have lost the file after it (a deleted or
        # never-flushed tail): rebuild from its own end.
        if (last is None or last.wrote_position in (0, last.file_size)) and not (complete and complete(cq)):
            candidates.append(cq.max_physic_offset if cq.max_physic_offset >= 0 else min_off)
    for cq in report.rebuild_queues:   # queues that lost units: rebuild them
        candidates.append(cq.max_physic_offset if cq.max_physic_offset >= 0 else min_off)
    if index_end is not None:
        candidates.append(index_end)
    if not clean:
        candidates.append(report.commitlog_checked_from if noted_dispatched is None else noted_dispatched)
    return max(min_off, min(candidates))
