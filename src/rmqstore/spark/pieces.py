"""Commitlog mode's parallelism: commitlog files cut into pieces at record starts.

A commitlog file is one walk of records chained by their TOTALSIZE fields, so a task can start only where
a record starts. The consume queues know such places: every unit points at the start of a record. A file
whose part of the read is larger than its share of the partitions wanted (the session's parallelism, or
option minPartitions) is cut at the unit offsets nearest to equal shares, each checked on the driver (the
commitlog there holds a valid record, body CRC included, of the unit's size whose QUEUEID, QUEUEOFFSET and
PHYSICALOFFSET are the unit's: bytes inside a body that only look like a record are not taken). A piece is (base, path, start, limit, cut): cut says another piece goes on at limit, so its
task checks that its walk lands exactly there (scan.py: anything else is data loss, reported as such,
never a silent gap).
"""
from __future__ import annotations

import logging
import struct

import numpy as np

from ..store.format import codec, scanner
from . import storeview as SV

log = logging.getLogger(__name__)

MIN_PIECE_BYTES = 4 << 20       # pieces are not made smaller than this to get more of them (minPartitions can)
_SYSFLAG = struct.Struct(">i")


def cut_pieces(view: SV.StoreView, items: list[tuple], want: int, at_least: int = MIN_PIECE_BYTES) -> list[tuple]:
    """items (whole-file parts, cut False) as pieces, aiming at `want` pieces of at least `at_least` bytes."""
    total = sum(it[3] - it[2] for it in items)
    per = max(-(-total // max(want, 1)), at_least, 1)
    shares = [max(1, int((it[3] - it[2]) / per + 0.5)) for it in items]    # the nearest number of pieces
    if max(shares, default=1) == 1:
        return items
    units = _record_starts(view)
    out = []
    for (base, path, start, limit, _), k in zip(items, shares):
        cuts = _cuts(view, path, base, start, limit, k, units) if k > 1 else []
        edges = [start, *cuts, limit]
        out += [(base, path, a, b, b != limit) for a, b in zip(edges, edges[1:])]
    return out


def _record_starts(view: SV.StoreView) -> tuple[np.ndarray, ...]:
    """(commitlog offsets, sizes, queue ids, queue offsets) of the records the view's consume queues point
    at, sorted by commitlog offset."""
    cols: list[list[np.ndarray]] = [[np.empty(0, np.int64)] for _ in range(4)]
    for qv in view.queues.values():
        o, s = qv.units(qv.min_offset, qv.end)
        keep = (s > 0) & (s != SV.BLANK_SIZE) & (o >= 0)
        for col, v in zip(cols, (o, s, np.full(len(o), qv.queue_id, np.int64),
                                 np.arange(qv.min_offset, qv.min_offset + len(o), dtype=np.int64))):
            col.append(v[keep])
    offs, sizes, qids, qoffs = (np.concatenate(c) for c in cols)
    order = np.argsort(offs, kind="stable")
    return offs[order], sizes[order], qids[order], qoffs[order]


def _cuts(view, path: str, base: int, start: int, limit: int, k: int, units: tuple) -> list[int]:
    """Up to k - 1 positions in (start, limit) of path where a checked record starts, near equal shares."""
    starts = units[0]
    lo, hi = np.searchsorted(starts, [base + start + 1, base + limit])
    if lo >= hi:
        return []
    targets = base + start + (limit - start) * np.arange(1, k, dtype=np.int64) // k
    picks = np.unique(lo + np.minimum(np.searchsorted(starts[lo:hi], targets), hi - lo - 1))
    return [int(starts[i]) - base for i in picks.tolist()
            if _starts_record(view, path, base, int(starts[i]) - base, *(int(c[i]) for c in units[1:]))]


def _starts_record(view, path: str, base: int, pos: int, size: int, queue_id: int, queue_offset: int) -> bool:
    """The commitlog file at pos holds the consume queue unit's record: a valid message record (its body CRC
    checked) of `size` bytes whose QUEUEID, QUEUEOFFSET and PHYSICALOFFSET are the unit's (bytes that only
    look like a record, inside another record's body, are not one)."""
    try:
        if view.fs is not None:
            rec = view.fs.read(path, pos, size)
        else:
            with open(path, "rb") as f:
                f.seek(pos)
                rec = f.read(size)
    except OSError as e:
        log.warning("%s: cannot read the record at %d to cut the file there (%s): not cut there", path, pos, e)
        return False
    try:
        kind, got = scanner.check_record(rec, 0, len(rec), check_crc=True)
        fields = codec.header_struct(_SYSFLAG.unpack_from(rec, codec.POS_SYSFLAG)[0]).unpack_from(rec, 0)
    except (scanner.RecordError, struct.error):
        kind = None
    if kind is scanner.Outcome.MESSAGE and got == size and (fields[3], fields[5], fields[6]) == \
            (queue_id, queue_offset, base + pos):
        return True
    log.warning("%s: a consume queue unit points at byte %d, where its record (%d bytes, queue %d offset %d) "
                "does not start: the file is not cut there", path, pos, size, queue_id, queue_offset)
    return False
