"""Record resynchronisation (part of the record scanner, re-exported by scanner.py): where the next trustworthy commitlog record starts after a damaged one.

RocketMQ's recovery stops at the first record that fails its checks and cuts everything after it, so one
flipped bit in one body loses every later message. This module finds where valid records resume, so that
recovery and the dispatcher can skip exactly the damaged byte range (and report it) instead.

Pure functions over a buffer (bytes, mmap, memoryview); no I/O. Records are validated by
scanner.check_record (the one record rule); candidates are found by searching for the 4-byte magic codes with bytes.find (C
speed), never byte by byte in Python.
"""
from __future__ import annotations

import struct

from . import codec
from .scanner import Outcome, RecordError, check_record

_Q = struct.Struct(">q")

_MAGICS = tuple(m.to_bytes(4, "big") for m in (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2,
                                                codec.BLANK_MAGIC_CODE))
_SEARCH_CHUNK = 1 << 20
_ZERO_CHUNK = 8 << 20
DEFAULT_CHAIN = 3


def _record_ok(buf, pos: int, end: int, check_crc: bool, base: int | None) -> tuple[int, int] | None:
    """(kind, size) of a valid record at pos, or None. With base, a message must also carry its own
    commitlog offset (base + pos) in its PHYSICALOFFSET field, as every record RocketMQ writes does."""
    try:
        kind, size = check_record(buf, pos, end, check_crc)
    except RecordError:
        return None
    if kind is Outcome.MESSAGE and base is not None:
        phys = _Q.unpack_from(buf, pos + codec.POS_PHYSICALOFFSET)[0]
        if phys != base + pos:
            return None
    return kind, size


def chains_from(buf, pos: int, end: int, *, check_crc: bool = True, chain: int = DEFAULT_CHAIN,
                base: int | None = None) -> bool:
    """True when a valid message record starts at pos and its successors chain correctly: `chain` records
    in a row check (pos's included), or fewer followed by the end of the written data (a zero header or
    `end` itself) or by a valid END_OF_FILE blank record that reaches `end`."""
    first = _record_ok(buf, pos, end, check_crc, base)
    if first is None or first[0] is not Outcome.MESSAGE:
        return False
    p, n = pos + first[1], 1
    while n < chain:
        if p >= end:
            return True
        got = _record_ok(buf, p, end, check_crc, base)
        if got is None:
            return False
        kind, size = got
        if kind is Outcome.END_OF_DATA:
            return True
        if kind is Outcome.END_OF_FILE:
            return p + size == end
        p, n = p + size, n + 1
    return True


def _magic_candidates(buf, start: int, end: int):
    """Yield, in increasing order, every position >= start whose bytes 4..8 are a record magic code
    (found column-wise with numpy, a chunk at a time)."""
    import numpy as np
    raw = np.frombuffer(buf, dtype=np.uint8)
    try:
        lo = start + 4
        while lo + 4 <= end:
            hi = min(end, lo + _SEARCH_CHUNK + 3)
            a = raw[lo:hi]
            head = a[:len(a) - 3]
            hits = []
            for magic in _MAGICS:
                c = np.flatnonzero(head == magic[0])
                for k in (1, 2, 3):
                    c = c[a[c + k] == magic[k]]
                hits.append(c)
            for i in np.sort(np.concatenate(hits)).tolist():
                yield lo + i - 4
            lo = hi - 3
    finally:
        del raw


def _first_nonzero(buf, start: int, end: int) -> int | None:
    """The first position in [start, end) holding a non-zero byte, or None: zero runs (never written or
    zeroed ranges, up to a whole preallocated file) are crossed at memory speed."""
    import numpy as np
    raw = np.frombuffer(buf, dtype=np.uint8)
    try:
        pos = start
        while pos < end:
            stop = min(end, pos + _ZERO_CHUNK)
            part = raw[pos:stop]
            n8 = len(part) // 8 * 8         # eight bytes at a time: np.any over uint8 is slow
            if part[:n8].view(np.uint64).any() or part[n8:].any():
                return pos + int(np.argmax(part != 0))
            pos = stop
        return None
    finally:
        del raw


def next_valid_record(buf, pos: int, end: int, *, check_crc: bool = True, chain: int = DEFAULT_CHAIN,
                      base: int | None = None) -> int | None:
    """The position of the first record after pos (pos excluded) that checks and chains (see chains_from),
    or a valid END_OF_FILE blank record that reaches exactly `end`; None when there is none before `end`.

    buf: the bytes of one commitlog file (or a part of it), end: where its data ends (a file's size).
    check_crc: require good body CRCs (recommended: it is what makes a resumed chain trustworthy).
    base: the commitlog offset of buf[0]; when given, a message must also carry its own offset in its
    PHYSICALOFFSET field, which rules out records copied into message bodies.
    A None answer means "no valid chain resumes": the damage is a torn tail, to be cut as RocketMQ cuts.
    """
    nz = _first_nonzero(buf, pos + 1, end)
    if nz is None:
        return None
    # a record's magic code is non-zero: no record starts more than 4 bytes before the first non-zero byte
    for c in _magic_candidates(buf, max(pos + 1, nz - 4), end):
        if c <= pos:
            continue
        got = _record_ok(buf, c, end, check_crc, base)
        if got is None:
            continue
        kind, size = got
        if kind is Outcome.END_OF_FILE:
            if c + size == end:
                return c
            continue
        if chains_from(buf, c, end, check_crc=check_crc, chain=chain, base=base):
            return c
    return None
