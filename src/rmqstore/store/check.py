"""`rmqstore check`: a full consistency check of a store directory, in the spirit of SQLite's
`PRAGMA integrity_check` and diskcache's `check(fix=...)`.

    report = check_store("/data/store", StoreConfig.load("broker.conf"))
    for p in report.problems:
        print(p)                       # FILE: offset N: what
    print(report.summary())

What is checked, read-only (files are opened O_RDONLY and mapped ACCESS_READ; nothing is created, locked or
written, and a store another process has open is read as it is, the check says so):

* commitlog: every record (magic code, sizes, body CRC), file sizes and missing files. After a record that
  fails, the scan resumes at the next record whose successors chain (scanner.next_valid_record) and the
  skipped byte range is reported;
* consume queues: file sizes, missing files, every unit against the record it points at (recovery.
  unit_problems: record start, size, topic, queue id, queue offset), and against the commitlog: messages of
  a queue the queue does not hold (a lost tail or head), queues missing altogether;
* index: file sizes, headers, slots and entries (recovery.index_file_problems), every entry's offset a
  record's, every entry's hash one of that record's `topic#key` hashes;
* checkpoint: its size, and timestamps the commitlog's records reach;
* config/*.json: each parses and has the shape the store loads (else its `.bak` is looked at).

After a crash (an `abort` file) or while another process has the store open, queues and index behind the
commitlog and a torn last record are what recovery repairs at the next open: they are listed as notes, not
problems. repair_store() (`check --repair`) opens the store (taking its lock), rebuilds what is derived
(consume queues and index) and quarantines what is not (a malformed config file goes to
`FILE.corrupt-<time>`, its `.bak` takes its place); a message is never deleted.
"""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from . import codec
from .config import StoreConfig
from .mapped_file import FileCache
from .recovery import UNIT_MISSING, UNIT_REASONS, index_file_problems, structure_problem, unit_problems

UNIT = codec.CQ_STORE_UNIT_SIZE
_CQ_NP = np.dtype(codec.CQ_DTYPE)
_ENTRY_NP = np.dtype(codec.INDEX_ENTRY_DTYPE)
Progress = Callable[[int, int], None]       # (bytes done, bytes in all)


class NotAStoreError(ValueError):
    """The path is not a store directory (missing, a file, no commitlog/)."""


@dataclass(frozen=True)
class Problem:
    """One thing found wrong: the file, the byte offset in it, what."""
    kind: str            # "commitlog", "consume queue", "index", "checkpoint", "config", "store"
    path: str
    offset: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}: offset {self.offset}: {self.what}"


@dataclass
class CheckReport:
    store: str
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)         # not problems: what recovery does at the next open
    records: int = 0
    units: int = 0
    index_entries: int = 0
    repaired: list[str] = field(default_factory=list)      # what repair_store did
    bad_config: list[tuple[Path, bool]] = field(default_factory=list)   # (unusable config file, .bak usable)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, kind: str, path, offset: int, what: str) -> None:
        self.problems.append(Problem(kind, str(path), int(offset), what))

    def summary(self) -> str:
        state = "ok" if self.ok else f"{len(self.problems)} problem{'s' * (len(self.problems) != 1)}"
        return (f"{self.store}: {state}: {self.records} commitlog records, {self.units} consume queue units, "
                f"{self.index_entries} index entries checked in {self.seconds:.2f} s")


# --- files -------------------------------------------------------------------------------------------
def _digit_files(d: Path, digits: int | None = 20) -> list[tuple[int, Path, int]]:
    """(number in the name, path, size) of the files of d named by digits, in name order."""
    try:
        names = sorted(os.listdir(d))
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for n in names:
        p = d / n
        if n.isdigit() and (digits is None or len(n) == digits) and p.is_file():
            out.append((int(n), p, p.stat().st_size))
    return out


def store_root(path: str | os.PathLike) -> Path:
    """path as a store directory; NotAStoreError naming it when it is not one (nothing is created)."""
    p = Path(path)
    if not p.exists():
        raise NotAStoreError(f"{p}: not a store directory (no such directory)")
    if not p.is_dir():
        raise NotAStoreError(f"{p}: not a store directory (not a directory)")
    if not (p / "commitlog").is_dir():
        raise NotAStoreError(f"{p}: not a store directory (no commitlog/ directory)")
    return p


# --- commitlog ---------------------------------------------------------------------------------------
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
    end: int = 0                     # where the last valid record ends

    def dispatched(self) -> np.ndarray:
        return codec.is_dispatched(self.sys_flags)


def _next_valid(buf, pos: int, end: int, base: int) -> int | None:
    try:
        from .scanner import next_valid_record
    except ImportError:  # pragma: no cover - older tree: stop at the bad record
        return None
    return next_valid_record(buf, pos, end, check_crc=True, base=base)


def _walk_file(mm, size: int, base: int, report: CheckReport, path: Path, tail_ok: bool) -> list[tuple[int, int]]:
    """Check every record of one file (CRC included): returns the valid ranges [a, b); problems reported."""
    ranges = []
    pos = 0
    while pos < size:
        try:
            stop, kind, _ = codec.walk_records(mm, pos, size, True)
        except codec.RecordError as e:
            if e.pos > pos:
                ranges.append((pos, e.pos))
            nxt = _next_valid(mm, e.pos, size, base)
            if nxt is None:
                if tail_ok:
                    report.notes.append(f"{path}: offset {e.pos}: {e.reason}: a torn tail, recovery cuts it")
                else:
                    report.add("commitlog", path, e.pos, f"invalid record ({e.reason}); no valid record follows "
                                                         "in this file")
                return ranges
            report.add("commitlog", path, e.pos, f"invalid record ({e.reason}); bytes {e.pos}..{nxt} skipped, "
                                                 f"records resume at {nxt}")
            pos = nxt
            continue
        if stop > pos:
            ranges.append((pos, stop))
        if kind == codec.KIND_BLANK:
            return ranges
        if stop < size and _has_data(path, stop + 8, size):
            report.add("commitlog", path, stop, "zero bytes inside the file's written part (data follows)")
        return ranges
    return ranges


def _has_data(path: Path, pos: int, end: int) -> bool:
    """Any non-zero byte in [pos, end) of the file: pread, holes skipped (never a hole read through a
    mapping: SIGBUS on a full tmpfs)."""
    from .mapped_file import _fd_has_data
    fd = os.open(path, os.O_RDONLY)
    try:
        return _fd_has_data(fd, pos, end)
    finally:
        os.close(fd)


def check_commitlog(root: Path, cfg: StoreConfig, report: CheckReport, maps: FileCache, crashed: bool,
                    progress: Progress | None = None) -> Records:
    """Check every commitlog record; returns the columns of the valid ones."""
    cdir = root / "commitlog"
    files = _digit_files(cdir)
    fsize = cfg.mapped_file_size_commit_log
    total = sum(s for _, _, s in files) or 1
    done = 0
    cols: list = []
    last_data = max((i for i, (_, p, s) in enumerate(files) if s), default=-1)
    end = files[0][0] if files else 0
    for i, (base, path, size) in enumerate(files):
        if i and base != files[i - 1][0] + fsize:
            report.add("commitlog", path, 0, f"commitlog files missing before it (the previous file ends at "
                                             f"{files[i - 1][0] + fsize})")
        if size != fsize:
            report.add("commitlog", path, size, f"file size {size}, configured mappedFileSizeCommitLog {fsize}"
                       + (" (open extends a cut last file with zeros)" if i == len(files) - 1 else ""))
        mm, _ = maps.get(path)
        if mm is None:
            continue
        for a, b in _walk_file(mm, size, base, report, path, tail_ok=crashed and i == last_data):
            cols.append(_parse_range(mm, base, a, b, report, path))
            end = base + b
        done += size
        if progress is not None:
            progress(done, total)
    recs = _concat(cols)
    recs.min_offset = files[0][0] if files else 0
    recs.end = end
    report.records = len(recs.offsets)
    return recs


def _parse_range(mm, base: int, a: int, b: int, report: CheckReport, path: Path):
    """The records of a valid range, as columns (parse_dispatch, chunk by chunk)."""
    out = []
    pos = a
    mv = memoryview(mm)
    try:
        while pos < b:
            stop = min(b, pos + (8 << 20))
            batch, used, outcome, reason = codec.parse_dispatch(mv[pos:stop], base + pos, stop == b)
            if len(batch):
                out.append(codec.DispatchBatch.from_requests(batch) if isinstance(batch, list) else batch)
            if used == 0:
                if outcome == codec.PARSE_ERROR:
                    report.add("commitlog", path, pos, f"record not parseable: {reason}")
                break
            pos += used
    finally:
        mv.release()
    return out


def _concat(parts: list) -> Records:
    batches = [b for part in parts for b in part]
    names: list[str] = []
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


# --- consume queues ----------------------------------------------------------------------------------
def _queue_dirs(root: Path) -> list[tuple[str, int, Path]]:
    out = []
    cq = root / "consumequeue"
    if not cq.is_dir():
        return out
    for t in sorted(os.listdir(cq)):
        if not (cq / t).is_dir():
            continue
        for q in sorted(os.listdir(cq / t)):
            if q.isdigit() and (cq / t / q).is_dir():
                out.append((t, int(q), cq / t / q))
    return out


def _read_units(files: list[tuple[int, Path, int]], fsize: int, report: CheckReport):
    """The units of a queue's files, from its first file: (first logical offset, offsets, sizes); a missing
    file or a short one ends the read (reported)."""
    offs, sizes = [], []
    first = files[0][0] // UNIT if files else 0
    expect = first
    for i, (base, path, size) in enumerate(files):
        if base % UNIT or base // UNIT != expect:
            report.add("consume queue", path, 0, f"{UNIT_REASONS[UNIT_MISSING]}: units from logical offset "
                                                 f"{expect} to {base // UNIT} have no file")
            break
        if size != fsize:
            report.add("consume queue", path, size, f"file size {size}, configured mappedFileSizeConsumeQueue "
                                                    f"{fsize}" + (" (open extends it and rebuilds what it lost)"
                                                                  if i == len(files) - 1 else ""))
        a = np.fromfile(path, dtype=_CQ_NP, count=min(size, fsize) // UNIT)
        o, s = a["offset"].astype(np.int64), a["size"].astype(np.int64)
        if i == len(files) - 1 or size < fsize:
            n = int(np.flatnonzero((o != 0) | (s != 0))[-1]) + 1 if ((o != 0) | (s != 0)).any() else 0
            o, s = o[:n], s[:n]       # the written part of the last file
        offs.append(o)
        sizes.append(s)
        expect = base // UNIT + len(o)
        if size < fsize:
            break
    cat = (lambda xs: np.concatenate(xs) if xs else np.empty(0, np.int64))
    return first, cat(offs), cat(sizes)


def check_consume_queues(root: Path, cfg: StoreConfig, recs: Records, report: CheckReport, maps: FileCache,
                         behind_ok: bool) -> None:
    """Every unit of every queue against its record; every dispatched record present in its queue."""
    fsize = cfg.mapped_file_size_consume_queue
    sources = [(b, b + max(s, cfg.mapped_file_size_commit_log),
                lambda p=p, b=b, s=s: maps.get(p)[1][:max(0, min(s, recs.end - b))])
               for b, p, s in _digit_files(root / "commitlog")]
    disp = np.flatnonzero(recs.dispatched())
    by_queue: dict[tuple[int, int], np.ndarray] = {}
    if len(disp):
        key = recs.topic_ids[disp] * (1 << 32) + (recs.queue_ids[disp] & 0xFFFFFFFF)
        order = np.argsort(key, kind="stable")
        cuts = np.flatnonzero(np.diff(key[order])) + 1
        for part in np.split(disp[order], cuts):
            by_queue[(int(recs.topic_ids[part[0]]), int(recs.queue_ids[part[0]]))] = part
    tid = {n: i for i, n in enumerate(recs.topic_names)}
    seen = set()
    for topic, qid, d in _queue_dirs(root):
        files = _digit_files(d)
        if not files:
            continue
        k = (tid.get(topic, -1), qid)
        seen.add(k)
        first, off, size = _read_units(files, fsize, report)
        report.units += len(off)
        _check_units(d, topic, qid, first, off, size, sources, recs, report, fsize)
        _check_coverage(d, topic, qid, first, off, size, by_queue.get(k), recs, report, behind_ok, fsize)
    for k, part in by_queue.items():
        if k not in seen:
            t = recs.topic_names[k[0]]
            what = (f"no consume queue for {t}/{k[1]}: the commitlog holds {len(part)} of its messages "
                    f"(first at offset {int(recs.offsets[part[0]])})")
            if behind_ok:
                report.notes.append(f"{root / 'consumequeue'}: {what}; recovery dispatches them")
            else:
                report.add("consume queue", root / "consumequeue" / t / str(k[1]), 0, what)


def _file_of(files_base: int, logical: int, fsize: int, d: Path) -> tuple[Path, int]:
    """The file and byte offset in it where a logical offset's unit lives."""
    per = max(fsize // UNIT, 1)
    fb = logical - logical % per
    return d / f"{fb * UNIT:020d}", (logical - fb) * UNIT


def _check_units(d: Path, topic: str, qid: int, first: int, off, size, sources, recs: Records,
                 report: CheckReport, fsize: int) -> None:
    upto = len(off)
    st = structure_problem(off, size)
    if st is not None:
        path, at = _file_of(first, first + st[0], fsize, d)
        report.add("consume queue", path, at, f"unit {first + st[0]}: {UNIT_REASONS[st[1]]}")
        upto = st[0]
    if not upto:
        return
    logical = np.arange(first, first + upto, dtype=np.int64)
    codes = unit_problems(off[:upto], size[:upto], logical, qid, topic.encode("utf-8"), sources, recs.min_offset)
    bad = np.flatnonzero(codes)
    for j in bad[:10].tolist():
        path, at = _file_of(first, first + j, fsize, d)
        report.add("consume queue", path, at, f"unit {first + j} (offset {int(off[j])}, size {int(size[j])}) "
                                              f"{UNIT_REASONS.get(int(codes[j]), 'damaged')}")
    if len(bad) > 10:
        report.add("consume queue", d, 0, f"{len(bad) - 10} more units do not match their records")


def _check_coverage(d: Path, topic: str, qid: int, first: int, off, size, part, recs: Records,
                    report: CheckReport, behind_ok: bool, fsize: int) -> None:
    """Messages of the queue in the commitlog that the queue does not hold (past its end, before its head)."""
    if part is None or not len(part):
        return
    real = ~((size == codec.CQ_BLANK_SIZE) & (off == 0))
    head = first + (int(np.argmax(real)) if real.any() else len(off))
    end = first + len(off)
    qo = recs.queue_offsets[part]
    past = part[qo >= end]
    if len(past):
        what = (f"{len(past)} messages of {topic}/{qid} in the commitlog are past the queue's last unit "
                f"(queue offsets {int(recs.queue_offsets[past[0]])}.., first at commitlog offset "
                f"{int(recs.offsets[past[0]])})")
        if behind_ok:
            report.notes.append(f"{d}: {what}; recovery dispatches them")
        else:
            report.add("consume queue", *_file_of(first, end, fsize, d), what)
    before = part[qo < head]
    if len(before):
        report.add("consume queue", *_file_of(first, head, fsize, d), f"{len(before)} messages of {topic}/{qid} in the commitlog "
                                                    f"come before the queue's first unit {head} (its head is lost)")


# --- index -------------------------------------------------------------------------------------------
def _expected_keys(recs: Records):
    """Per record (offset order): the index hashes of its `topic#key` strings, as CSR (starts, hashes)."""
    from .index_file import _entries, key_hashes
    topics = [recs.topic_names[i] for i in recs.topic_ids.tolist()]
    offs = recs.offsets.tolist()
    keys, k_offs, _, counts = _entries(topics, recs.keys, recs.uniq, offs, recs.store_ts.tolist(),
                                       recs.sys_flags.tolist(), -1)
    hashes = key_hashes(keys) if keys else np.empty(0, np.int64)
    per = np.zeros(len(offs), dtype=np.int64)
    if k_offs:
        per[np.searchsorted(recs.offsets, np.asarray(k_offs, dtype=np.int64))] = counts
    starts = np.zeros(len(offs) + 1, dtype=np.int64)
    np.cumsum(per, out=starts[1:])
    return starts, hashes


def check_index(root: Path, cfg: StoreConfig, recs: Records, report: CheckReport) -> None:
    """Index files: size, header, slots and entries; every entry's offset a record's, its hash one of
    that record's keys' (entries for messages below the commitlog's min offset are not checked)."""
    import types
    slots, num = cfg.max_hash_slot_num, cfg.max_index_num
    want = codec.index_file_size(slots, num)
    base = codec.INDEX_HEADER_SIZE + slots * codec.INDEX_HASH_SLOT_SIZE
    starts = hashes = None
    for _, path, size in _digit_files(root / "index", None):
        if size != want:
            report.add("index", path, size, f"file size {size}, maxHashSlotNum={slots} maxIndexNum={num} give {want}")
            continue
        raw = path.read_bytes()
        b_ts, e_ts, b_phy, e_phy, _, count = codec.INDEX_HEADER.unpack_from(raw, 0)
        if count < 0 or count > num or min(b_ts, e_ts, b_phy, e_phy) < 0:
            report.add("index", path, 0, f"impossible header (indexCount {count}, timestamps {b_ts}..{e_ts}, "
                                         f"offsets {b_phy}..{e_phy})")
            continue
        count = max(count, 1)
        f = types.SimpleNamespace(mapped_file=types.SimpleNamespace(mm=raw), index_count=count, hash_slot_num=slots,
                                  entries_base=base, begin_phy_offset=b_phy, end_phy_offset=e_phy,
                                  read_slots=lambda raw=raw: np.frombuffer(raw, dtype=">i4", count=slots,
                                                                           offset=codec.INDEX_HEADER_SIZE))
        for what in index_file_problems(f):
            report.add("index", path, base, what)
        ent = np.frombuffer(raw, dtype=_ENTRY_NP, count=count - 1, offset=base + codec.INDEX_ENTRY_SIZE)
        report.index_entries += len(ent)
        phy = ent["phy_offset"].astype(np.int64)
        live = np.flatnonzero(phy >= recs.min_offset)
        if not len(live):
            continue
        r = np.searchsorted(recs.offsets, phy[live])
        r_ok = r < len(recs.offsets)
        hit = np.zeros(len(live), dtype=bool)
        hit[r_ok] = recs.offsets[r[r_ok]] == phy[live][r_ok]
        if (~hit).any():
            j = int(live[np.flatnonzero(~hit)[0]])
            report.add("index", path, base + (j + 1) * codec.INDEX_ENTRY_SIZE,
                       f"{int((~hit).sum())} entries point at no record (first: entry {j + 1}, offset {int(phy[j])})")
        if starts is None:
            starts, hashes = _expected_keys(recs)
        idx = live[hit]
        rr = r[hit]
        h = ent["key_hash"].astype(np.int64)[idx]
        lo, n = starts[rr], starts[rr + 1] - starts[rr]
        match = np.zeros(len(idx), dtype=bool)
        for k in range(int(n.max()) if len(n) else 0):
            m = n > k
            match[m] |= hashes[lo[m] + k] == h[m]
        if (~match).any():
            j = int(idx[np.flatnonzero(~match)[0]])
            report.add("index", path, base + (j + 1) * codec.INDEX_ENTRY_SIZE,
                       f"{int((~match).sum())} entries whose hash is none of their message's keys' (first: "
                       f"entry {j + 1}, offset {int(phy[j])})")


# --- checkpoint and config -----------------------------------------------------------------------------
def check_checkpoint(root: Path, recs: Records, report: CheckReport) -> None:
    p = root / "checkpoint"
    if not p.exists():
        if len(recs.offsets):
            report.add("checkpoint", p, 0, "missing (open recovers as if nothing was flushed)")
        return
    if not p.is_file():
        report.add("checkpoint", p, 0, "not a regular file")
        return
    raw = p.read_bytes()
    if len(raw) < codec.CHECKPOINT.size:
        report.add("checkpoint", p, len(raw), f"{len(raw)} bytes, too short for its three timestamps")
        return
    newest = int(recs.store_ts.max()) if len(recs.store_ts) else 0
    for name, v, at in zip(("physicMsgTimestamp", "logicsMsgTimestamp", "indexMsgTimestamp"),
                           codec.CHECKPOINT.unpack_from(raw, 0), (0, 8, 16)):
        if v < 0:
            report.add("checkpoint", p, at, f"{name} {v} is negative")
        elif len(recs.store_ts) and v > newest:
            report.add("checkpoint", p, at, f"{name} {v} is after the newest record's store time {newest}: the "
                                            "commitlog lost data the checkpoint says was flushed")


def _config_decoders() -> dict[str, Callable | None]:
    out: dict[str, Callable | None] = {}
    for name, mod, fn in (("topics.json", "topic_config", "decode_topics"),
                          ("consumerOffset.json", "offset_store", "decode_offsets"),
                          ("delayOffset.json", "schedule", "decode_delay_offsets")):
        try:
            out[name] = getattr(__import__(f"rmqstore.{mod}", fromlist=[fn]), fn)
        except (ImportError, AttributeError):  # pragma: no cover - an older tree: JSON only
            out[name] = None
    return out


def config_problem(path: Path, decode: Callable | None) -> str | None:
    """Why a config file is unusable (None: it is usable, or missing/empty: the defaults)."""
    if not path.exists():
        return None
    if not path.is_file():
        return "a directory (or not a regular file) where a config file belongs"
    try:
        raw = path.read_bytes()
    except OSError as e:
        return f"cannot read: {e.strerror}"
    if not raw.strip():
        return None
    try:
        from .config_file import _problem
        return _problem(raw, decode)
    except ImportError:  # pragma: no cover
        import json
        try:
            json.loads(raw)
        except ValueError as e:
            return f"not valid JSON ({e})"
        return None


def check_config(root: Path, report: CheckReport) -> list[tuple[Path, bool]]:
    """config/*.json (and the known files): returns [(file, its .bak usable)] of the unusable ones."""
    d = root / "config"
    bad = []
    if not d.exists():
        return bad
    if not d.is_dir():
        report.add("config", d, 0, "not a directory")
        return bad
    decoders = _config_decoders()
    names = sorted(set(decoders) | {n for n in os.listdir(d) if n.endswith(".json")})
    for n in names:
        p = d / n
        why = config_problem(p, decoders.get(n))
        if why is None:
            continue
        bak = p.with_name(n + ".bak")
        bak_ok = bak.is_file() and bak.stat().st_size > 0 and config_problem(bak, decoders.get(n)) is None
        report.add("config", p, 0, why + ("; its .bak is usable (open falls back to it, --repair restores it)"
                                          if bak_ok else "; no usable .bak"))
        bad.append((p, bak_ok))
    return bad


# --- the whole check and the repair ---------------------------------------------------------------------
def _store_is_open(root: Path) -> bool:
    """Another process (or this one) holds the store's lock: a probe (F_GETLK), nothing locked or created."""
    from . import lock
    if str(root.resolve()) in getattr(lock, "_held", ()):
        return True
    try:
        return lock._lock_holder_of(root / "lock") is not None
    except AttributeError:  # pragma: no cover - an older lock module
        from ..spark.storeview import lock_held_elsewhere
        return lock_held_elsewhere(root)


def check_store(path: str | os.PathLike, config: StoreConfig | None = None, *, progress: Progress | None = None,
                live: bool | None = None) -> CheckReport:
    """Check everything (module docstring), read-only. NotAStoreError when path is not a store directory.
    live: the store is open (in this process or another): queues and index may be behind the commitlog."""
    t0 = time.perf_counter()
    root = store_root(path)
    cfg = config or StoreConfig()
    report = CheckReport(str(root))
    if live is None:
        live = _store_is_open(root)
    crashed = (root / "abort").exists()
    if live:
        report.notes.append(f"{root}: the store is open in another process (its lock is held): checked as it is "
                            "now; queues and index may be behind the commitlog")
    elif crashed:
        report.notes.append(f"{root}: abort file present (not shut down cleanly): what recovery repairs at the "
                            "next open is listed as notes")
    behind_ok = live or crashed
    maps = FileCache()
    try:
        recs = check_commitlog(root, cfg, report, maps, behind_ok, progress)
        check_consume_queues(root, cfg, recs, report, maps, behind_ok)
        if cfg.message_index_enable:
            check_index(root, cfg, recs, report)
        check_checkpoint(root, recs, report)
        report.bad_config = check_config(root, report)
        check_file_kinds(root, report)
    finally:
        maps.close()
    report.seconds = time.perf_counter() - t0
    return report


def check_file_kinds(root: Path, report: CheckReport) -> None:
    """Something else than a regular file where a store file belongs (a directory named like a commitlog,
    consume queue or index file; abort, lock)."""
    dirs = [root / "commitlog", root / "index"] + [d for _, _, d in _queue_dirs(root)]
    for d in dirs:
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for n in names:
            if n.isdigit() and not (d / n).is_file():
                report.add("store", d / n, 0, "not a regular file where a store file belongs")
    for n in ("abort", "lock"):
        p = root / n
        if p.exists() and not p.is_file():
            report.add("store", p, 0, "not a regular file where the store's " + n + " file belongs")


def quarantine(path: Path, stamp: str | None = None) -> Path:
    """Move path aside as PATH.corrupt-<time> (never deleted); returns the new name."""
    stamp = stamp or time.strftime("%Y%m%d%H%M%S")
    dst = path.with_name(f"{path.name}.corrupt-{stamp}")
    i = 1
    while dst.exists():
        dst = path.with_name(f"{path.name}.corrupt-{stamp}.{i}")
        i += 1
    os.replace(path, dst)
    return dst


def _repair_config(bad: list[tuple[Path, bool]], out: list[str]) -> None:
    for p, bak_ok in bad:
        aside = quarantine(p)
        if bak_ok:
            shutil.copy2(p.with_name(p.name + ".bak"), p)
            out.append(f"{p}: moved aside as {aside.name}; restored from {p.name}.bak")
        else:
            out.append(f"{p}: moved aside as {aside.name}; no usable backup: the store starts from defaults")


def repair_store(path: str | os.PathLike, config: StoreConfig | None = None, *,
                 progress: Progress | None = None) -> tuple[CheckReport, CheckReport]:
    """Check, repair, check again: returns (the first report, the report after the repair).

    Repairs: malformed config files are quarantined (FILE.corrupt-<time>; a usable .bak takes their place).
    Then, unless the commitlog itself is damaged, the store is opened (its lock taken: StoreLockedError if
    another process has it open), which recovers it; consume queues, index or checkpoint that still have
    problems are rebuilt from the commitlog (rebuild.rebuild_store), a checkpoint vouching for more than
    the commitlog holds is set back to the newest record. Commitlog damage is not repaired here: opening
    the store would cut or skip records, and a repair never deletes a message; it is reported."""
    from .lock import StoreLock
    cfg = config or StoreConfig()
    lock = StoreLock(store_root(path))
    lock.acquire()                 # StoreLockedError when another process has the store open
    try:
        first = check_store(path, cfg, progress=progress, live=False)
        done: list[str] = []
        _repair_config(first.bad_config, done)
        _quarantine_misfit_index(Path(path), cfg, done)
    finally:
        lock.release()
    if any(p.kind == "commitlog" for p in first.problems):
        done.append(f"{path}: the commitlog is damaged: nothing else repaired (a repair never deletes a message; "
                    "opening the store lets recovery skip or cut the damaged records, and reports them)")
    elif any(p.kind != "config" for p in first.problems):
        _repair_derived(Path(path), cfg, progress, done)
    after = check_store(path, cfg, progress=progress, live=False)
    first.repaired = after.repaired = done
    return first, after


def _quarantine_misfit_index(path: Path, cfg: StoreConfig, done: list[str]) -> None:
    """Index files whose size is not the configured geometry's: at open that is refused (likelier a wrong
    configuration than damage), but a repair was asked for with this configuration, and the index is derived:
    each is moved aside (FILE.corrupt-<time>) and its keys are indexed again from the commitlog."""
    d = store_root(path) / "index"
    if not d.is_dir():
        return
    expected = codec.index_file_size(cfg.max_hash_slot_num, cfg.max_index_num)
    for p in sorted(d.iterdir()):
        if p.name.isdigit() and p.is_file() and p.stat().st_size not in (0, expected):
            size = p.stat().st_size
            aside = quarantine(p)
            done.append(f"{p}: {size} bytes, not the {expected} of maxHashSlotNum={cfg.max_hash_slot_num} "
                        f"maxIndexNum={cfg.max_index_num}: moved to {aside.name}, its keys indexed again")


def _repair_derived(path: Path, cfg: StoreConfig, progress: Progress | None, done: list[str]) -> None:
    """Open (recover) the store; rebuild consume queues and index if problems remain; fix the checkpoint."""
    from .rebuild import rebuild_store
    from .store import MessageStore

    store = MessageStore.open(path, cfg, start_services=False)
    try:
        rep = store.recovery_report
        if rep is not None and rep.damaged:
            done.append(f"{path}: opened and recovered: {rep.summary()}")
    finally:
        store.close()
    mid = check_store(path, cfg, progress=progress, live=False)
    if any(p.kind in ("consume queue", "index") for p in mid.problems):
        got = rebuild_store(path, cfg)
        done.append(f"{path}: consume queues and index rebuilt from the commitlog ({got['messages']} messages, "
                    f"{got['queues']} queues)")
        mid = check_store(path, cfg, progress=progress, live=False)
    if any(p.kind == "checkpoint" for p in mid.problems):
        done.append(_clamp_checkpoint(path / "checkpoint", path, cfg))


def _clamp_checkpoint(p: Path, root: Path, cfg: StoreConfig) -> str:
    """Set checkpoint timestamps later than the newest record back to it (the checkpoint then vouches for
    less: recovery checks more). Written with pwrite + fsync."""
    maps = FileCache()
    try:
        recs = check_commitlog(root, cfg, CheckReport(str(root)), maps, False)
    finally:
        maps.close()
    newest = int(recs.store_ts.max()) if len(recs.store_ts) else 0
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        raw = os.pread(fd, codec.CHECKPOINT.size, 0).ljust(codec.CHECKPOINT.size, b"\0")
        vals = [min(max(v, 0), newest) for v in codec.CHECKPOINT.unpack(raw)]
        os.pwrite(fd, codec.CHECKPOINT.pack(*vals), 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    return f"{p}: timestamps set back to the newest record's store time {newest}"


def progress_bar(label: str = "check"):
    """A progress callback drawing on stderr when it is a terminal (tqdm if installed), and its closer."""
    import sys
    if not sys.stderr.isatty():
        return None, (lambda: None)
    try:
        from tqdm import tqdm
    except ImportError:
        from .rebuild import ProgressBar
        bar = ProgressBar(1, label)

        def update(done: int, total: int) -> None:
            bar.total = max(total, 1)
            bar.update(done)
        return update, bar.close
    t = tqdm(total=1, unit="B", unit_scale=True, desc=label, file=sys.stderr)

    def update_tqdm(done: int, total: int) -> None:
        t.total = total
        t.n = done
        t.refresh()
    return update_tqdm, t.close
