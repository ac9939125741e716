"""The commitlog part of `rmqstore check`: every record (magic code, sizes, body CRC), file sizes, missing
files; the valid records as columns (Records) for the checks of what is derived from them.

After a record that fails, or zero bytes inside a file's written data, the scan resumes at the next record
whose successors chain (resync.next_valid_record) and the skipped range is reported (a DamagedSpan, what
`--repair` quarantines). A range recorded as accepted damage (damage.py, damagedRanges.json) is one note.
A torn tail after a crash, or the end of the data a live store is writing, is a note: recovery cuts it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .check_report import CheckReport, DamagedSpan, Progress, digit_files
from ..conf.config import StoreConfig
from ..commitlog.damage import covered
from ..files.mapped_file import FileCache
from ..format.codec import SCHEDULE_TOPIC
from ..format.resync import next_valid_record
from ..format.scanner import DispatchBatch, Outcome, RecordError, is_dispatched, parse_dispatch, \
    DAMAGED_QUEUEID, queue_problem, walk_records


@dataclass
class Records:
    """What the commitlog holds, column-wise (message records only, in offset order)."""
    offsets: np.ndarray
    sizes: np.ndarray
    topic_ids: np.ndarray
    queue_ids: np.ndarray
    queue_offsets: np.ndarray
    sys_flags: np.ndarray
    store_ts: np.ndarray
    topic_names: list[str]
    keys: list
    uniq: list
    min_offset: int = 0
    end: int = 0                     # where the last valid record ends (a live store: the scan's snapshot)
    # records whose header names a queue no record can belong to (scanner.queue_problem): no unit, no queue
    unqueued: np.ndarray | None = None

    def dispatched(self) -> np.ndarray:
        d = is_dispatched(self.sys_flags)
        return d if self.unqueued is None else d & ~self.unqueued

    def subset(self, keep: np.ndarray) -> "Records":
        """The records where keep (a bool mask) is True."""
        idx = np.flatnonzero(keep).tolist()
        return Records(self.offsets[keep], self.sizes[keep], self.topic_ids[keep], self.queue_ids[keep],
                       self.queue_offsets[keep], self.sys_flags[keep], self.store_ts[keep], self.topic_names,
                       [self.keys[i] for i in idx], [self.uniq[i] for i in idx], self.min_offset, self.end,
                       None if self.unqueued is None else self.unqueued[keep])

    def by_queue(self) -> dict[tuple[int, int], np.ndarray]:
        """(topic id, queue id) -> indices of the queue's dispatched records, in commitlog order."""
        disp = np.flatnonzero(self.dispatched())
        out: dict[tuple[int, int], np.ndarray] = {}
        if len(disp):
            key = self.topic_ids[disp] * (1 << 32) + (self.queue_ids[disp] & 0xFFFFFFFF)
            order = np.argsort(key, kind="stable")
            cuts = np.flatnonzero(np.diff(key[order])) + 1
            for part in np.split(disp[order], cuts):
                out[(int(self.topic_ids[part[0]]), int(self.queue_ids[part[0]]))] = part
        return out


@dataclass
class _FileWalk:
    """One commitlog file being walked, and what the walk may take for granted."""
    path: Path
    base: int
    size: int
    tail_ok: bool          # the last data file of a crashed or live store: damage with nothing after it is a tail
    live_end: bool         # the last data file of a live store: the end of the data is a snapshot
    accepted: list[tuple[int, int]] = field(default_factory=list)


def _has_data(path: Path, pos: int, end: int) -> bool:
    """Any non-zero byte in [pos, end) of the file: pread, holes skipped (never a hole read through a
    mapping: SIGBUS on a full tmpfs)."""
    from ..files.mapped_file import _fd_has_data
    fd = os.open(path, os.O_RDONLY)
    try:
        return _fd_has_data(fd, pos, end)
    finally:
        os.close(fd)


def _damage(f: _FileWalk, report: CheckReport, pos: int, nxt: int | None, why: str) -> None:
    """Report the damaged range [pos, nxt or the file's end) of f: a note when it is a torn tail or
    accepted damage, else a problem and a DamagedSpan."""
    if nxt is None and f.tail_ok:
        report.notes.append(f"{f.path}: offset {pos}: {why}: a torn tail, recovery cuts it")
        return
    end = f.size if nxt is None else nxt
    if covered(f.accepted, f.base + pos, f.base + end):
        report.notes.append(f"{f.path}: offset {pos}: accepted damage ({why}): bytes {pos}..{end} quarantined "
                            "and skipped (config/damagedRanges.json)")
        return
    report.damaged.append(DamagedSpan(str(f.path), f.base, pos, end - pos, why))
    if nxt is None:
        report.add("commitlog", f.path, pos, f"invalid record ({why}); no valid record follows in this file")
    else:
        report.add("commitlog", f.path, pos, f"invalid record ({why}); bytes {pos}..{nxt} skipped, records "
                                             f"resume at {nxt}")


def _walk_file(mm, f: _FileWalk, report: CheckReport) -> list[tuple[int, int]]:
    """Check every record of one file (CRC included): returns the valid ranges [a, b); damage reported."""
    ranges = []
    pos = 0
    while pos < f.size:
        try:
            stop, kind, _ = walk_records(mm, pos, f.size, True)
        except RecordError as e:
            if e.pos > pos:
                ranges.append((pos, e.pos))
            bad, why = e.pos, e.reason
        else:
            if stop > pos:
                ranges.append((pos, stop))
            if kind == Outcome.END_OF_FILE or stop >= f.size or f.live_end or not _has_data(f.path, stop + 8, f.size):
                return ranges
            bad, why = stop, "zero bytes inside the file's written part, data follows"
        nxt = next_valid_record(mm, bad, f.size, check_crc=True, base=f.base)
        _damage(f, report, bad, nxt, why)
        if nxt is None:
            return ranges
        pos = nxt
    return ranges


def _missing_before(report: CheckReport, files, i: int, fsize: int, accepted) -> None:
    base, path, _ = files[i]
    prev_end = files[i - 1][0] + fsize
    if covered(accepted, prev_end, base):
        report.notes.append(f"{path}: accepted damage: commitlog files from offset {prev_end} are missing "
                            "(config/damagedRanges.json)")
        return
    report.damaged.append(DamagedSpan(str(path), base, prev_end - base, base - prev_end,
                                      "commitlog files missing"))
    report.add("commitlog", path, 0, f"commitlog files missing before it (the previous file ends at {prev_end})")


def check_commitlog(root: Path, cfg: StoreConfig, report: CheckReport, maps: FileCache, crashed: bool,
                    progress: Progress | None = None) -> Records:
    """Check every commitlog record; returns the columns of the valid ones."""
    files = digit_files(root / "commitlog")
    fsize = cfg.mapped_file_size_commit_log
    total = sum(s for _, _, s in files) or 1
    done = 0
    cols: list = []
    last_data = max((i for i, (_, p, s) in enumerate(files) if s), default=-1)
    end = files[0][0] if files else 0
    for i, (base, path, size) in enumerate(files):
        if i and base != files[i - 1][0] + fsize:
            _missing_before(report, files, i, fsize, report.accepted)
        if report.being_created(files, i):
            break
        if size != fsize:
            report.add("commitlog", path, size, _size_problem(path, size, fsize, i == len(files) - 1))
        mm, _ = maps.get(path)
        if mm is None:
            continue
        last = i == last_data
        f = _FileWalk(path, base, size, tail_ok=(crashed or report.live) and last, live_end=report.live and last,
                      accepted=report.accepted)
        for a, b in _walk_file(mm, f, report):
            cols.append(_parse_range(mm, base, a, b, report, path))
            end = base + b
        done += size
        if progress is not None:
            progress(done, total)
    recs = _concat(cols)
    recs.min_offset = files[0][0] if files else 0
    recs.end = end
    recs = _sequence_damage(recs, files, report, _delay_levels(root, cfg))
    report.records = len(recs.offsets)
    return recs


def _delay_levels(root: Path, cfg: StoreConfig) -> int:
    """SCHEDULE_TOPIC_XXXX's queues: messageDelayLevel's levels, or more where the store holds schedule queues
    past them (written with more levels: their records are no damage; the dispatcher's QueueRule too)."""
    ids = [len(cfg.delay_levels_ms()) - 1]
    try:
        ids += [int(p.name) for p in (root / "consumequeue" / SCHEDULE_TOPIC).iterdir() if p.name.isdigit()]
    except OSError:
        pass
    return max(ids) + 1


SEQUENCE_SLACK = 64     # a queue offset may jump this far past its predecessor (records lost with a damaged range)


def _out_of_sequence(q: np.ndarray, lost: bool, complete: bool = False) -> np.ndarray:
    """Positions in one queue's queue offsets (commitlog order) that fit neither neighbour while the
    neighbours fit each other (a damaged QUEUEOFFSET, or a record another queue's damaged QUEUEID or topic
    moved here); the last one when it jumps back or far ahead; the first when it is past the second.
    lost: commitlog ranges are damaged or missing, so a queue may jump legitimately (the ends are not judged).
    complete: the commitlog holds every record from offset 0 and nothing is lost, so a queue's records are
    exactly 0, 1, 2, ...: also the first when it is not 0 and the second does not continue it (a record
    moved into a queue of its own, or to a queue's end), and the last when it jumps at all."""
    bad = np.zeros(len(q), dtype=bool)
    if len(q) < 2:
        if complete and len(q) == 1:
            bad[0] = q[0] != 0
        return bad
    if len(q) > 2:
        bad[1:-1] = (q[1:-1] - q[:-2] != 1) & (q[2:] - q[1:-1] != 1) & (q[2:] - q[:-2] == 2)
    if lost:
        return bad
    jump = int(q[-1] - q[-2])
    bad[-1] |= jump <= 0 or jump > 1 + (0 if complete else SEQUENCE_SLACK)
    bad[0] |= q[0] >= q[1] or (complete and q[0] != 0 and q[1] != q[0] + 1)
    return bad


def live_by_queue(recs: Records, deleted: dict[tuple[str, int], int]) -> dict[tuple[int, int], np.ndarray]:
    """recs.by_queue() without each deleted queue's old generation (deleted_queues.py: its records below the
    recorded offset belong to no queue; a queue written again starts over at offset 0 after them)."""
    by_queue = recs.by_queue()
    tid = {n: i for i, n in enumerate(recs.topic_names)}
    for (t, q), below in deleted.items():
        k = (tid.get(t, -1), q)
        if k in by_queue:
            part = by_queue[k][recs.offsets[by_queue[k]] >= below]
            if len(part):
                by_queue[k] = part
            else:
                del by_queue[k]
    return by_queue


def _sequence_damage(recs: Records, files, report: CheckReport, delay_levels: int) -> Records:
    """Records whose header passes every check but claims what cannot be: a QUEUEOFFSET out of its queue's
    sequence, or a queue no record can belong to (queue_problem: a SCHEDULE_TOPIC_XXXX queue that is no
    delay level; such records are left out of the queues checked, recs.unqueued). Damage like any other (a
    DamagedSpan over the record), or a note when accepted. Records inside accepted ranges are left out of
    what is checked against the queues (dispatch skips them)."""
    keep = np.ones(len(recs.offsets), dtype=bool)
    for a, b in report.accepted:
        keep &= ~((recs.offsets >= a) & (recs.offsets < b))
    bases = np.array([b for b, _, _ in files], dtype=np.int64)
    lost = bool(report.damaged or report.accepted)
    queues = [(t, qid, part[keep[part]]) for (t, qid), part in live_by_queue(recs, report.deleted).items()]

    def damaged(t: int, qid: int, rows, why_of) -> None:
        for j in rows.tolist():
            off, size = int(recs.offsets[j]), int(recs.sizes[j])
            if covered(report.accepted, off, off + size):
                continue
            base, path, _ = files[int(np.searchsorted(bases, off, side="right")) - 1]
            why = why_of(j)
            report.damaged.append(DamagedSpan(str(path), base, off - base, size, why))
            report.add("commitlog", path, off - base, f"record {off - base}..{off - base + size}: {why}")

    def out_of_sequence(t: int, qid: int):
        return lambda j: (f"QUEUEOFFSET {int(recs.queue_offsets[j])} out of the sequence of "
                          f"{recs.topic_names[t]}/{qid}: a damaged header")
    found = len(report.damaged)
    for t, qid, part in queues:
        no_queue = queue_problem(recs.topic_names[t], qid, delay_levels)
        if no_queue is not None:
            if recs.unqueued is None:
                recs.unqueued = np.zeros(len(recs.offsets), dtype=bool)
            recs.unqueued[part] = True
            damaged(t, qid, part, lambda j, why=f"{no_queue}: {DAMAGED_QUEUEID}": why)
        else:
            damaged(t, qid, part[_out_of_sequence(recs.queue_offsets[part], lost)], out_of_sequence(t, qid))
    # every record since the store began and none damaged: each queue is exactly 0, 1, 2, ... (a record
    # moved into a queue of its own, or to a queue's end, shows only so). Only then: a record found moved
    # above leaves a gap in the queue it left, which is no damage of the record after the gap
    if len(report.damaged) == found and not lost and recs.min_offset == 0:
        for t, qid, part in queues:
            if recs.unqueued is None or not recs.unqueued[part].any():
                damaged(t, qid, part[_out_of_sequence(recs.queue_offsets[part], False, True)], out_of_sequence(t, qid))
    for a, b in report.accepted:
        n = int(((recs.offsets >= a) & (recs.offsets < b)).sum())
        if n:
            base, path, _ = files[max(int(np.searchsorted(bases, a, side="right")) - 1, 0)]
            report.notes.append(f"{path}: offset {a - base}: accepted damage (config/damagedRanges.json): commitlog "
                                f"offsets {a}..{b}, {n} record{'s' * (n != 1)} there skipped by dispatch and reads")
    return recs if keep.all() else recs.subset(keep)


def _size_problem(path: Path, size: int, fsize: int, last: bool) -> str:
    what = f"file size {size} does not match mappedFileSizeCommitLog {fsize}"
    if last:
        return what + " (open extends a cut last file with zeros)"
    return what + " (a store written with another geometry? pass its broker.conf: -c broker.conf)"


def _parse_range(mm, base: int, a: int, b: int, report: CheckReport, path: Path):
    """The records of a valid range, as columns (the dispatch parse, chunk by chunk)."""
    out = []
    pos = a
    mv = memoryview(mm)
    try:
        while pos < b:
            stop = min(b, pos + (8 << 20))
            batch, used, outcome, reason = parse_dispatch(mv[pos:stop], base + pos, stop == b)
            if len(batch):
                out.append(DispatchBatch.from_requests(batch) if isinstance(batch, list) else batch)
            if used == 0:
                if outcome == Outcome.INVALID:
                    report.add("commitlog", path, pos, f"record not parseable: {reason}")
                break
            pos += used
    finally:
        mv.release()
    return out


def _concat(parts: list) -> Records:
    batches = [b for part in parts for b in part]
    ids: dict[str, int] = {}
    tid, keys, uniq = [], [], []
    for b in batches:
        remap = np.array([ids.setdefault(n, len(ids)) for n in b.topic_names], dtype=np.int64)
        tid.append(remap[np.asarray(b.topic_ids, dtype=np.int64)])
        keys.extend(b.keys)
        uniq.extend(b.uniq_keys)
    names = sorted(ids, key=ids.get)

    def col(attr):
        return np.concatenate([np.asarray(getattr(b, attr), dtype=np.int64) for b in batches]) if batches \
            else np.empty(0, np.int64)
    return Records(col("offsets"), col("sizes"), np.concatenate(tid) if tid else np.empty(0, np.int64),
                   col("queue_ids"), col("queue_offsets"), col("sys_flags"), col("store_timestamps"), names,
                   keys, uniq)


def scan_damage(root: Path, cfg: StoreConfig, accepted: list[tuple[int, int]] | None = None,
                progress: Progress | None = None) -> list[DamagedSpan]:
    """The damaged ranges of a closed store's commitlog, body CRCs included, that valid records follow:
    what an offline rebuild must not dispatch (accepted ranges and torn tails left out: the dispatcher
    skips the first, recovery cuts the second). Only the walk: no columns are parsed."""
    report = CheckReport(str(root), accepted=list(accepted or []))
    files = digit_files(root / "commitlog")
    last_data = max((i for i, (_, p, s) in enumerate(files) if s), default=-1)
    total = sum(s for _, _, s in files) or 1
    done = 0
    maps = FileCache()
    try:
        for i, (base, path, size) in enumerate(files):
            mm, _ = maps.get(path)
            if mm is not None:
                _walk_file(mm, _FileWalk(path, base, size, tail_ok=i == last_data, live_end=False,
                                         accepted=report.accepted), report)
            done += size
            if progress is not None:
                progress(done, total)
    finally:
        maps.close()
    return report.damaged


def commitlog_restarts(root: str | os.PathLike, config) -> tuple[Deleted, dict]:
    """deleted_queues.restarts() of the store at root's commitlog (a header scan, read only): the deletions the
    commitlog shows, and each queue's offsets they were derived from."""
    from ..consumequeue.deleted_queues import restarts
    from ..files.mapped_file import FileCache
    maps = FileCache()
    try:
        return restarts(check_commitlog(Path(root), config, CheckReport(str(root)), maps, False))
    finally:
        maps.close()
