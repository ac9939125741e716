"""The derived-data part of `rmqstore check`: consume queues (file sizes, missing files, every unit against
the record it points at, every dispatched record present in its queue) and index files (size, header,
slots, every entry's offset a record's and its hash one of that record's `topic#key` hashes).

On a live store (another process has it open) only what the commitlog scan saw is checked: units and
index entries pointing past the scan's end, and the newest index file's slots, are being written.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..format import codec
from .check_commitlog import Records, live_by_queue
from .check_report import CheckReport, digit_files, queue_dirs
from ..conf.config import StoreConfig
from ..files.mapped_file import FileCache
from ..recovery.queue_check import UNIT_MISSING, UNIT_REASONS, structure_problem, unit_problems
from ..recovery.recovery import index_file_problems

UNIT = codec.CQ_STORE_UNIT_SIZE
_CQ_NP = np.dtype(codec.CQ_DTYPE)
_ENTRY_NP = np.dtype(codec.INDEX_ENTRY_DTYPE)


def _read_units(files: list[tuple[int, Path, int]], fsize: int, report: CheckReport):
    """The units of a queue's files, from its first file: (first logical offset, offsets, sizes); a missing
    file or a short one ends the read (reported)."""
    offs, sizes = [], []
    first = files[0][0] // UNIT if files else 0
    expect = first
    for i, (base, path, size) in enumerate(files):
        if report.being_created(files, i):
            break
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
               for b, p, s in digit_files(root / "commitlog")]
    by_queue = live_by_queue(recs, report.deleted)
    tid = {n: i for i, n in enumerate(recs.topic_names)}
    seen = set()
    for topic, qid, d in queue_dirs(root):
        files = digit_files(d)
        if not files:
            continue
        k = (tid.get(topic, -1), qid)
        seen.add(k)
        first, off, size = _read_units(files, fsize, report)
        if report.live:         # units appended after the commitlog scan point past its snapshot
            seen_by_scan = np.flatnonzero(off + size <= recs.end)
            n = int(seen_by_scan[-1]) + 1 if len(seen_by_scan) else 0
            off, size = off[:n], size[:n]
        report.units += len(off)
        below = report.deleted.get((topic, qid))
        stale = 0 if below is None else int(((off < below) & ((off != 0) | (size != codec.CQ_BLANK_SIZE))).sum())
        if stale:               # recorded as deleted, its files still there: a deleteTopic a crash interrupted
            report.add("consume queue", d, 0, f"{stale} units of a deleted generation (below commitlog offset "
                                              f"{below}, config/deletedQueues.json): a deleteTopic a crash "
                                              "interrupted; the next open (or --repair) removes them")
            continue
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
    from ..index.index_file import _entries, key_hashes
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
    that record's keys' (entries for messages below the commitlog's min offset, or past what the scan saw
    of a live store, are not checked; nor the slots of a live store's newest file, being written)."""
    slots, num = cfg.max_hash_slot_num, cfg.max_index_num
    want = codec.index_file_size(slots, num)
    keys: list = []                  # (starts, hashes) of the records' keys, computed once when needed
    files = digit_files(root / "index", None)
    for i, (_, path, size) in enumerate(files):
        if report.being_created(files, i):
            break
        if size != want:
            report.add("index", path, size, f"file size {size}, maxHashSlotNum={slots} maxIndexNum={num} give {want}")
            continue
        _check_index_file(path, cfg, recs, report, keys, writing=report.live and i == len(files) - 1)


def _check_index_file(path: Path, cfg: StoreConfig, recs: Records, report: CheckReport, keys: list,
                      writing: bool) -> None:
    import types
    slots, num = cfg.max_hash_slot_num, cfg.max_index_num
    base = codec.INDEX_HEADER_SIZE + slots * codec.INDEX_HASH_SLOT_SIZE
    raw = path.read_bytes()
    b_ts, e_ts, b_phy, e_phy, _, count = codec.INDEX_HEADER.unpack_from(raw, 0)
    if count < 0 or count > num or min(b_ts, e_ts, b_phy, e_phy) < 0:
        report.add("index", path, 0, f"impossible header (indexCount {count}, timestamps {b_ts}..{e_ts}, "
                                     f"offsets {b_phy}..{e_phy})")
        return
    count = max(count, 1)
    if not writing:
        f = types.SimpleNamespace(mapped_file=types.SimpleNamespace(mm=raw), index_count=count, hash_slot_num=slots,
                                  entries_base=base, begin_phy_offset=b_phy, end_phy_offset=e_phy,
                                  read_slots=lambda: np.frombuffer(raw, dtype=">i4", count=slots,
                                                                   offset=codec.INDEX_HEADER_SIZE))
        for what in index_file_problems(f):
            report.add("index", path, base, what)
    ent = np.frombuffer(raw, dtype=_ENTRY_NP, count=count - 1, offset=base + codec.INDEX_ENTRY_SIZE)
    report.index_entries += len(ent)
    phy = ent["phy_offset"].astype(np.int64)
    live = np.flatnonzero((phy >= recs.min_offset) & ((phy < recs.end) if report.live else True))
    if len(live):
        _check_entries(path, base, ent, phy, live, recs, report, keys)


def _check_entries(path: Path, base: int, ent, phy, live, recs: Records, report: CheckReport, keys: list) -> None:
    """Entries `live` of one index file: each at a record's offset, each hash one of that record's keys'."""
    r = np.searchsorted(recs.offsets, phy[live])
    r_ok = r < len(recs.offsets)
    hit = np.zeros(len(live), dtype=bool)
    hit[r_ok] = recs.offsets[r[r_ok]] == phy[live][r_ok]
    if (~hit).any():
        j = int(live[np.flatnonzero(~hit)[0]])
        report.add("index", path, base + (j + 1) * codec.INDEX_ENTRY_SIZE,
                   f"{int((~hit).sum())} entries point at no record (first: entry {j + 1}, offset {int(phy[j])})")
    if not keys:
        keys.extend(_expected_keys(recs))
    starts, hashes = keys
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
