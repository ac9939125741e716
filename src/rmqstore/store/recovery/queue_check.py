"""Consume queue units checked against the commitlog records they point at, vectorised: recovery cuts a
queue at its first damaged unit (recovery.recover_consume_queues), `check` reports every one (check.py).

Pure functions over arrays and read-only buffers: unit_problems (one code a unit, UNIT_REASONS says why),
structure_problem (what cannot be right whatever the commitlog says), read_queue_units and check_queue (a
queue's first damaged unit, older units sampled)."""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..format import codec, scanner
from ..format.scanner import gather_rows
from ..consumequeue.consume_queue import _CQ_NP as _CQ_UNIT_NP
from ..consumequeue.consume_queue import UNIT, ConsumeQueue

if TYPE_CHECKING:  # pragma: no cover
    from ..commitlog.commit_log import CommitLog

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


def _covers(idx: np.ndarray, n: int) -> bool:
    """idx (sorted unique indices) is all of range(n), in order."""
    return len(idx) == n and (n == 0 or (idx[0] == 0 and idx[-1] == n - 1))


def _part(a: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """a[idx], or a itself when idx covers it (the usual case: fancy indexing of a structured array copies
    field by field, and is most of the check's time on a million units)."""
    return a if _covers(idx, len(a)) else a[idx]


def _put(dst: np.ndarray, idx: np.ndarray, src: np.ndarray) -> np.ndarray:
    """dst with dst[idx] = src; src itself when idx covers dst."""
    if _covers(idx, len(dst)):
        return src
    dst[idx] = src
    return dst


# what unit_problems reads of a record: TOTALSIZE .. SYSFLAG (every variant has them there)
_UNIT_HEAD = np.dtype(codec.HEADER_V4_FIELDS[:8])


def _topic_matches(topics: list[bytes | None], tpos: np.ndarray, end: np.ndarray, v1: np.ndarray, topic: bytes) -> np.ndarray:
    """For records whose topic field starts at tpos (its end at end, within the record): is their topic
    exactly `topic`? topics: per unit, the bytes read there for the longest form (see unit_problems).
    The length field and the topic's bytes are compared as one fixed-width item per record."""
    out = np.zeros(len(tpos), dtype=bool)
    for is_v1, length in ((True, struct.pack(">B", len(topic) & 0xFF)), (False, struct.pack(">H", len(topic) & 0xFFFF))):
        if is_v1 and len(topic) > 127:
            continue
        want = length + topic
        sel = np.flatnonzero((v1 == is_v1) & (tpos + len(want) <= end))
        if len(sel):
            out[sel] = topics[is_v1][sel] == np.void(want)
    return out


CONCAT_BYTES = 32 << 20     # _gather_units: small files are read as one buffer up to this many bytes


def _buffers(uoff: np.ndarray, fi: np.ndarray, starts: np.ndarray, files):
    """(unit indices, bytes, their positions in the bytes, the end of their file in the bytes) for the units
    (sorted by file index fi): one buffer of every file they point into when those files hold at most
    CONCAT_BYTES together (small files: one pass over all units instead of a dozen array operations per
    file), else one per file (large files are never copied)."""
    m = len(uoff)
    cuts = np.flatnonzero(np.diff(fi)) + 1
    groups = np.split(np.arange(m), cuts)
    raws = [files[int(fi[g[0]])][2]() for g in groups]
    if len(groups) > 1 and sum(len(r) for r in raws) <= CONCAT_BYTES:
        at = np.cumsum([0] + [len(r) for r in raws])
        gid = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
        pos = uoff - starts[fi] + at[gid]
        yield np.arange(m), np.concatenate(raws), pos, at[gid + 1]
        return
    for g, raw in zip(groups, raws):
        yield g, raw, uoff[g] - starts[fi[g[0]]], np.full(len(g), len(raw), dtype=np.int64)


def _gather_units(uoff: np.ndarray, fi: np.ndarray, starts: np.ndarray, files, topic: bytes | None):
    """What unit_problems compares, read from the files' bytes (_buffers; units sorted by file index fi):
    each record's head (TOTALSIZE .. SYSFLAG), whether the head lies inside the file's readable bytes, the
    bytes from the record to the file's end, the header size and body length, and the bytes where a topic
    of `topic`'s length would be, in the v1 form for v1 records and the v2 form for the others (zero where
    not read). Nothing is read past the end of a unit's own file."""
    m = len(uoff)
    head = np.zeros(m, dtype=_UNIT_HEAD)
    inside = np.zeros(m, dtype=bool)
    room = np.zeros(m, dtype=np.int64)
    body_len = np.full(m, -1, dtype=np.int64)
    tl = len(topic) if topic is not None else 0
    topics = {True: np.zeros(m, dtype=f"V{tl + 1}"), False: np.zeros(m, dtype=f"V{tl + 2}")}
    hs_all = np.zeros(m, dtype=np.int64)
    for grp, raw, pos, lim in _buffers(uoff, fi, starts, files) if m else []:
        room[grp] = lim - pos
        ok = pos + codec.HEADER_V4.size <= lim
        g, p, lim = grp[ok], pos[ok], lim[ok]
        inside[g] = True
        h = gather_rows(raw, p, _UNIT_HEAD)
        head = _put(head, g, h)
        if topic is not None and len(g):
            sf = h["sys_flag"].astype(np.int64)
            hs = codec.HEADER_V4.size + 12 * ((sf & codec.SYSFLAG_BORNHOST_V6) != 0) \
                + 12 * ((sf & codec.SYSFLAG_STOREHOST_V6) != 0)
            hs_all[g] = hs
            rec_end = np.minimum(p + h["total"].astype(np.int64), lim)
            b_ok = p + hs <= rec_end
            bl = np.full(len(g), -1, dtype=np.int64)
            bl[b_ok] = gather_rows(raw, p[b_ok] + hs[b_ok] - 4, ">i4")
            body_len[g] = bl
            tpos = p + hs + bl
            v1 = h["magic"] == codec.MESSAGE_MAGIC_CODE      # each record's topic is read in its own form
            for is_v1, width in ((True, tl + 1), (False, tl + 2)):
                t_ok = np.flatnonzero((bl >= 0) & (tpos + width <= lim) & (v1 == is_v1))
                if len(t_ok):
                    topics[is_v1] = _put(topics[is_v1], g[t_ok], gather_rows(raw, tpos[t_ok], f"V{width}"))
        del h, raw
    return head, inside, room, hs_all, body_len, topics


def unit_problems(off: np.ndarray, size: np.ndarray, logical: np.ndarray, queue_id: int, topic: bytes | None,
                  files, cl_min: int) -> np.ndarray:
    """Check consume queue units against the commitlog records they point at, vectorised: returns one code a
    unit (UNIT_OK or why not, see UNIT_REASONS). off, size: the units' int64 columns; logical: their logical
    offsets (the record's QUEUEOFFSET must equal it); topic: the queue's topic as UTF-8 (None: not checked);
    files: the commitlog files as (first offset, end offset, a function giving the file's readable bytes as
    a uint8 array), in offset order. A unit must point at a record start inside a file (magic code,
    PHYSICALOFFSET = the unit's offset), its size must be the record's TOTALSIZE, and the record's queue id,
    queue offset and topic must be the queue's. Filler units (offset 0, size 0x7fffffff) and units below
    cl_min (cleaned) are not checked. Pure: reads only what load() returns.

    The bytes are gathered file by file (only the files some unit points into; a unit goes to the last file
    starting at or before it), the comparisons run once over all units: a queue's sampled units spread over
    hundreds of files cost a few gathers per file, not a dozen array operations."""
    n = len(off)
    codes = np.zeros(n, dtype=np.uint8)
    skip = ((size == codec.CQ_BLANK_SIZE) & (off == 0)) | (off < max(cl_min, 0))
    cand = np.flatnonzero(~skip)
    starts = np.fromiter((f[0] for f in files), np.int64, len(files))
    ends = np.fromiter((f[1] for f in files), np.int64, len(files))
    fi = np.searchsorted(starts, off[cand], side="right") - 1
    hit = fi >= 0
    hit[hit] = off[cand[hit]] < ends[fi[hit]]
    codes[cand[~hit]] = UNIT_OUTSIDE
    cand, fi = cand[hit], fi[hit]
    if len(fi) and (np.diff(fi) < 0).any():        # units in offset order are in file order already
        order = np.argsort(fi, kind="stable")
        cand, fi = cand[order], fi[order]
    head, inside, room, hs_all, body_len, topics = _gather_units(off[cand], fi, starts, files, topic)
    sel = cand
    codes[sel[~inside]] = UNIT_NOT_A_RECORD
    keep = np.flatnonzero(inside)
    sel, h = sel[keep], _part(head, keep)
    total = h["total"].astype(np.int64)
    magic = h["magic"]
    c = np.zeros(len(sel), dtype=np.uint8)
    c[h["queue_offset"] != logical[sel]] = UNIT_OTHER_OFFSET
    c[h["queue_id"] != queue_id] = UNIT_OTHER_QUEUE
    c[total != size[sel]] = UNIT_SIZE
    rec = ((magic == _MAGICS[0]) | (magic == _MAGICS[1])) & (h["phys"] == off[sel]) & (total <= room[keep])
    c[~rec] = UNIT_NOT_A_RECORD
    if topic is not None:
        t = np.flatnonzero(c == 0)
        if len(t):
            k = keep[t]
            tpos = hs_all[k] + body_len[k]          # from the record's start
            same = (body_len[k] >= 0) & _topic_matches({True: topics[True][k], False: topics[False][k]}, tpos,
                                                       total[t], magic[t] == codec.MESSAGE_MAGIC_CODE, topic)
            c[t[~same]] = UNIT_OTHER_QUEUE
    codes[sel] = c
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


def read_queue_units(cq: ConsumeQueue, from_index: int = 0) -> QueueUnits:
    """The units of cq from its min offset (or from_index, when later) to its max offset, file by file; a
    file missing between two others (or unwritten bytes inside a non-last file) ends the read and is named
    by `missing` (files before from_index: by their names only)."""
    lo, hi = cq.get_min_offset_in_queue(), cq.get_max_offset_in_queue()
    skipped_gap = _gap_before(cq, lo, min(max(lo, from_index), hi)) if from_index > lo else None
    if skipped_gap is not None:
        return QueueUnits(lo, np.empty(0, np.int64), np.empty(0, np.int64), skipped_gap)
    lo = min(max(lo, from_index), hi)
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


def _gap_before(cq: ConsumeQueue, lo: int, upto: int) -> int | None:
    """The first logical offset in [lo, upto) whose consume queue file is missing (names only), or None."""
    expect = lo
    for mf in list(cq.queue.files):
        base = mf.file_from_offset // UNIT
        end = base + mf.file_size // UNIT
        if end <= expect:
            continue
        if base > expect:
            return expect if expect < upto else None
        expect = end
        if expect >= upto:
            return None
    return expect if expect < upto else None


def unit_offsets_from(cqs, start: int) -> np.ndarray:
    """The commitlog offsets, sorted and unique, that the units of every queue in cqs point at from `start`
    on (filler units left out): where records probably start, the commitlog walk's hint
    (scanner.walk_records). Only each queue's files from the last one whose units begin before `start`
    are read (a queue's offsets increase); unreadable bytes (holes) are not read."""
    parts = []
    for cq in cqs:
        for mf in reversed(list(cq.queue.files)):
            n = min(mf.read_position, mf.data_end(), mf.file_size) // UNIT
            if n <= 0:
                continue
            off = np.frombuffer(mf.mm, dtype=_CQ_UNIT_NP, count=n)["offset"].astype(np.int64)
            parts.append(off[off >= max(start, 1)])
            if off[0] < start:
                break
    a = np.concatenate(parts) if parts else np.empty(0, np.int64)
    if len(a) < 2:
        return a
    a.sort(kind="stable")               # a merge of increasing runs, one per queue
    return a[np.concatenate(([True], a[1:] != a[:-1]))]


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
                sample: int | None = None, from_index: int = 0) -> tuple[int, int] | None:
    """The first damaged unit of cq as (logical offset, UNIT_* code), or None. Every unit's values are
    checked (zero units, order, missing files: cheap, the consume queue files only); units are checked
    against their records (unit_problems) from logical offset deep_from on, older ones by a sample of
    `sample` units (None: all). from_index: units before it are not read at all (the fast open: files
    the verified-state record vouches for; only their names are looked at, for missing files)."""
    qu = read_queue_units(cq, from_index)
    upto = len(qu.off)
    found = []
    if qu.missing is not None:
        found.append((qu.missing, UNIT_MISSING))
    s = structure_problem(qu.off, qu.size)
    if s is not None and s[1] == UNIT_ORDER:
        s = _order_culprit(qu, s[0], cq, sources, cl_min)
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


def _order_culprit(qu, j: int, cq: ConsumeQueue, sources, cl_min: int) -> tuple[int, int]:
    """Unit j's offset is not past the previous real unit's: either may be the damaged one (one pointing too
    far ahead makes the next look out of order). Their records tell: the previous one when it does not
    match its record (a repair cut after it would rebuild from the end of the record it wrongly names and
    leave out the messages between), else j (with its own problem when its record shows one)."""
    real = ~((qu.size[:j] == codec.CQ_BLANK_SIZE) & (qu.off[:j] == 0))
    p = int(np.flatnonzero(real)[-1])
    pair = np.array([p, j])
    codes = unit_problems(qu.off[pair], qu.size[pair], qu.first + pair, cq.queue_id, cq.topic.encode("utf-8"),
                          sources, cl_min)
    if codes[0]:
        return p, int(codes[0])
    return j, int(codes[1]) or UNIT_ORDER


def moved_record(cq: ConsumeQueue, bad: int, commit_log: "CommitLog", find) -> tuple[int, int, str] | None:
    """Unit `bad` of cq points at a record of another topic or queue (UNIT_OTHER_QUEUE). When the unit
    matches that record in everything else (its start, its size, and its queue offset is `bad`), a CRC-valid
    record, and the queue the record names (find(topic, queue id) -> ConsumeQueue or None) has no real unit
    at that queue offset, the unit was written for this record and the record's QUEUEID or TOPIC changed
    since: header damage the body CRC does not cover, which a rebuild would put in a queue of its own and
    answer there. Returns the record's (commitlog offset, size, why); None when the unit may be the damaged
    side (the named queue's unit there is a real one: units copied or files swapped between queues)."""
    unit = cq.get_unit(bad)
    if unit is None:
        return None
    off, size = int(unit[0]), int(unit[1])
    raw = commit_log.get_message(off, size)
    if raw is None:
        return None
    try:
        rec = scanner.decode_record(raw, 0, len(raw), check_crc=True)
    except codec.RecordError:
        return None
    if rec.physical_offset != off or rec.store_size != size or rec.queue_offset != bad \
            or (rec.topic, rec.queue_id) == (cq.topic, cq.queue_id):
        return None
    named = find(rec.topic, rec.queue_id)
    there = named.get_unit(bad) if named is not None and named.get_min_offset_in_queue() <= bad else None
    if there is not None and not (there[0] == 0 and there[1] == codec.CQ_BLANK_SIZE):
        return None
    return off, size, (f"the record names {rec.topic}/{rec.queue_id} queue offset {bad}, where no unit is its own, "
                       f"and unit {bad} of {cq.topic}/{cq.queue_id} was written for it: a damaged QUEUEID or TOPIC "
                       "field")
