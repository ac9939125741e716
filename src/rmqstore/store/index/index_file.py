"""IndexFile and IndexService: RocketMQ's message-key index, `{store}/index/yyyyMMddHHmmssSSS`.

File format (all integers big-endian; codec.INDEX_HEADER / INDEX_SLOT / INDEX_ENTRY):

     offset                        size  field
          0                           8  beginTimestamp   store time (ms) of the file's first entry
          8                           8  endTimestamp     store time (ms) of the file's last entry
         16                           8  beginPhyOffset   commitlog offset of the first entry's message
         24                           8  endPhyOffset     commitlog offset of the last entry's message
         32                           4  hashSlotCount    slots in use (see below)
         36                           4  indexCount       number of the next entry; starts at 1
         40      4 * maxHashSlotNum      slots: the newest entry number of each hash chain, 0 = empty
   40 + 4*S     20 * maxIndexNum         entries: keyHash (4), phyOffset (8), timeDiff (4), preIndexNo (4)

A key `topic#key` hashes to keyHash = abs(String.hashCode) (codec.index_key_hash) and to slot
keyHash % maxHashSlotNum. Putting a key writes entry number indexCount (entry 0 is never used) with
preIndexNo = the slot's previous value, then points the slot at it: each slot heads a chain of entries,
newest first. timeDiff is (storeTimestamp - beginTimestamp) / 1000 in seconds, clamped to [0, INT_MAX]
(0 while beginTimestamp <= 0). The file is full when indexCount >= maxIndexNum. A new file starts with
the previous file's endPhyOffset and endTimestamp as both its begin and end values; its first put
replaces the begin values with its own message's. Files are named by their creation time, local time,
`yyyyMMddHHmmssSSS` (RocketMQ's UtilAll.timeMillisToHumanString), so name order is creation order.

FIRST_ENTRY: RocketMQ computes entry 1's timeDiff from the beginTimestamp the header holds before that put
replaces it: the previous file's endTimestamp (or, after recovery removed every entry of a file, the time
of the removed first one). Entry 1 then reads back as stored that much later than it was, and a query
whose time range ends before that (queryMessage(topic, key, maxNum, begin, end)) misses it: measured after
a SIGKILL and recovery, entry 1 read 3 s late. rmqstore writes timeDiff 0 for entry 1 (its time is the
beginTimestamp the same put sets) and reads entry 1 at beginTimestamp, whatever its timeDiff, so files
RocketMQ wrote are read right too.

hashSlotCount counts the puts that found their slot empty (the number of slots in use, later
RocketMQ's semantics); RocketMQ 4.4.0 increments it on every put. It is informational only: nothing reads
it back. Every other byte is what RocketMQ 4.4.0 writes for the same puts (entry 1's timeDiff too, but
when the previous file ended a second or more before the new file's first message).

Writes: entries go to the file with pwrite, header and slots through the mapping; a file's header and
slot pages are allocated (posix_fallocate) when it is created, so a full disk makes a put raise OSError
(ENOSPC: the dispatcher reports it and tries again) and never a store into a hole (SIGBUS). A loaded file
whose header and slots cannot be allocated takes no more keys (IndexFile.room); its slots are read with
pread and its header written with pwrite (IndexFile.read_slots), never through the mapping. A loaded file's
header is always read with pread (a file written elsewhere, or copied sparse, may hold holes there).

Header write policy: header values live in Python ints (the authority for readers in this process).
The 40 header bytes are written to the mapping at the end of every IndexService.build_index /
build_index_batch call, by IndexFile.write_header(), and always before any msync (flush, roll-over,
shutdown); IndexFile.put_key alone only marks the header dirty. Entries are written before the slot that
points at them, and in-memory endPhyOffset/endTimestamp before indexCount, so a concurrent reader that
checks a slot against the indexCount it read never follows a half-written chain. A process killed
between a put and the header write leaves a header that is behind its entries: the extra entries are
invisible (slots pointing past indexCount count as empty, as in RocketMQ) and get overwritten.

Reading is hardened beyond RocketMQ: a chain walk only moves to strictly smaller entry numbers (which is
all RocketMQ ever writes) and is bounded by indexCount steps, so a corrupt preIndexNo (a cycle, a
forward or out-of-range pointer) ends the walk with a logged warning instead of looping forever; garbage
slots and entries (negative values) give no result and a warning, never an exception.
"""
from __future__ import annotations

import logging
import operator
import os
import threading
import time
from itertools import repeat
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from ..format import codec
from ...errors import CorruptStoreError
from ..files.mapped_file import MappedFile, ReadOnlyMappedFile, remove_half_made
from .entries import IndexEntries, ENTRY_DTYPE, ENTRY_SIZE, HEADER_SIZE, INT_MAX, SLOT_SIZE, _slot_unpack

log = logging.getLogger(__name__)

ROLLBACK = codec.TRANSACTION_ROLLBACK_TYPE      # 0xC, also the mask

_hdr_pack = codec.INDEX_HEADER.pack_into
_hdr_unpack = codec.INDEX_HEADER.unpack_from

assert ENTRY_DTYPE.itemsize == ENTRY_SIZE

# Below this many keys a batch is put one key at a time (numpy's fixed cost is higher than the loop's).
_VECTOR_MIN_KEYS = 24
# Distinct corruption warnings logged per file before the rest are suppressed.
_MAX_WARNINGS_PER_FILE = 200


def time_millis_to_human_string(ms: int) -> str:
    """RocketMQ's UtilAll.timeMillisToHumanString: local time as yyyyMMddHHmmssSSS."""
    return time.strftime("%Y%m%d%H%M%S", time.localtime(ms // 1000)) + f"{ms % 1000:03d}"


# --- key hashes -------------------------------------------------------------------------------------
_POW31_DESC = [pow(31, i, 1 << 32) for i in range(4095, -1, -1)]   # 31**4095 ... 31**0 mod 2**32
_mul = operator.mul


def key_hash(key: str) -> int:
    """codec.index_key_hash (abs(String.hashCode), MIN_VALUE -> 0), faster for ASCII keys, and also
    defined for strings holding lone surrogates (hashed as Java would)."""
    if key.isascii():
        raw = key.encode()
        n = len(raw)
        if n <= 4096:
            h = sum(map(_mul, raw, _POW31_DESC[4096 - n:])) & 0xFFFFFFFF if n else 0
            if h & 0x80000000:
                h = 0x100000000 - h
                return 0 if h == 0x80000000 else h
            return h
    try:
        return codec.index_key_hash(key)
    except UnicodeEncodeError:
        return int(key_hashes([key])[0])


_INV31 = pow(31, -1, 1 << 32)     # 31 is odd: it has an inverse mod 2**32
_powers: dict[int, np.ndarray] = {31: np.ones(1, dtype=np.uint32), _INV31: np.ones(1, dtype=np.uint32)}


def _power_table(base: int, n: int) -> np.ndarray:
    """base**i mod 2**32 for i < n (at least), as uint32; grown by doubling and kept."""
    t = _powers[base]
    if len(t) < n:
        size = max(n, 256)
        while len(t) < size:      # t[k:2k] = t[:k] * base**k, uint32 arithmetic wrapping mod 2**32
            step = np.uint32(pow(base, len(t), 1 << 32))
            t = np.concatenate((t, t * step))
        _powers[base] = t
    return t


def _pow31_table(n: int) -> np.ndarray:
    """31**i mod 2**32 for i < n, as uint32."""
    return _power_table(31, n)


def key_hashes(keys: Sequence[str]) -> np.ndarray:
    """codec.index_key_hash of every key, vectorised: an int64 array."""
    return _java_abs(string_hashes(keys)[0])


def string_hashes(keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Java's String.hashCode of every string as uint32 (sum(unit[i] * 31**(n-1-i)) mod 2**32 over the
    UTF-16 code units), and each string's length in UTF-16 units (int64): the hash of a + b is
    hash(a) * 31**len(b) + hash(b) mod 2**32.

    The keys are joined with a NUL after each (its positions give the lengths, and a 0 unit adds nothing
    to a sum); with u the units of the join, the key at [s, e) hashes to 31**(e-1) * sum(u[g] * 31**-g
    for s <= g < e) (31 has an inverse mod 2**32): one product and one segmented sum for the whole batch,
    uint32 arithmetic wrapping as Java's int does."""
    n = len(keys)
    if n == 0:
        return np.empty(0, dtype=np.uint32), np.empty(0, dtype=np.int64)
    joined = "\x00".join(keys) + "\x00"
    if joined.isascii():
        units = np.frombuffer(joined.encode("ascii"), dtype=np.uint8)
    else:
        units = np.frombuffer(joined.encode("utf-16-be", "surrogatepass"), dtype=">u2")
    ends = np.flatnonzero(units == 0)
    if len(ends) == n:
        starts = np.empty(n, dtype=np.int64)
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
    else:                                   # NULs inside keys: lengths one by one (UTF-16 units)
        lens = np.fromiter((len(k.encode("utf-16-be", "surrogatepass")) >> 1 for k in keys),
                           dtype=np.int64, count=n)
        ends = np.cumsum(lens + 1) - 1
        starts = ends - lens
    if len(units) <= _HASH_CHUNK_UNITS:
        return _segment_hashes(units, starts, ends), ends - starts
    out = np.empty(n, dtype=np.uint32)      # a long batch: in pieces, so the power tables stay small
    i = 0
    while i < n:
        j = max(int(np.searchsorted(ends, starts[i] + _HASH_CHUNK_UNITS, "right")), i + 1)
        base = int(starts[i])
        out[i:j] = _segment_hashes(units[base:int(ends[j - 1]) + 1], starts[i:j] - base, ends[i:j] - base)
        i = j
    return out, ends - starts


_HASH_CHUNK_UNITS = 1 << 20


def _segment_hashes(units: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """String.hashCode (uint32) of units[starts[i]:ends[i]] for every i, where units[ends[i]] is the 0
    that follows each key (see string_hashes)."""
    total = len(units)
    weighted = units * _power_table(_INV31, total)[:total]
    # segment i runs to starts[i + 1]: the key and its trailing 0 (an empty key: just the 0)
    sums = np.add.reduceat(weighted, starts, dtype=np.uint32)
    return _pow31_table(total)[ends - 1] * sums     # ends - 1 = -1 only for an empty first key: sum 0


def _entries(topics, keys_col, uniq_col, offsets, timestamps, sys_flags, end: int):
    """The index entries of a batch, in order: (`topic#key` strings; and per message that has any, its
    offset, store time and number of keys). Skipped: messages before end (indexed already) and rolled-back
    ones. Keys: the UNIQ_KEY, then each word of KEYS."""
    keys: list[str] = []
    add = keys.append
    offs: list[int] = []
    tss: list[int] = []
    counts: list[int] = []
    add_off, add_ts, add_count = offs.append, tss.append, counts.append
    for topic, k, u, off, ts, sf in zip(topics, keys_col, uniq_col, offsets, timestamps, sys_flags):
        if off < end or sf & ROLLBACK == ROLLBACK:
            continue
        prefix = topic + "#"
        if u is not None:
            add(prefix + u)
            n = 1
        else:
            n = 0
        if k:
            if " " in k:
                for w in k.split(" "):
                    if w:
                        add(prefix + w)
                        n += 1
            else:
                add(prefix + k)
                n += 1
        if n:
            end = off
            add_off(off)
            add_ts(ts)
            add_count(n)
    return keys, offs, tss, counts


def _uniform_columns(topics, keys_col, uniq_col, offsets, timestamps, sys_flags, end: int):
    """The index entries of the common batch (what producers send: one topic, every message with a UNIQ_KEY,
    or none with one, and a KEYS of one or more words, single spaces between them, none rolled back, none
    indexed yet) as (key hashes, offsets, timestamps) arrays, without building the `topic#key` strings:
    hash(topic#key) = hash(topic#) * 31**len(key) + hash(key). None for any other batch (_entries takes it)."""
    n = len(offsets)
    if n < _VECTOR_MIN_KEYS or offsets[0] < end or not isinstance(topics, list):
        return None
    topic = topics[0]
    if topics.count(topic) != n or not all(keys_col):
        return None
    nuniq = n - uniq_col.count(None) if isinstance(uniq_col, list) else n - list(uniq_col).count(None)
    if nuniq not in (0, n):
        return None             # some messages with a UNIQ_KEY, some without
    joined = " ".join(keys_col)
    words = joined.split(" ") if " " in joined else keys_col
    if len(words) > n and "" in words:
        return None             # an empty word (two spaces in a row, a space at either end): _entries skips it
    flags = np.asarray(sys_flags, dtype=np.int64)
    if ((flags & ROLLBACK) == ROLLBACK).any():
        return None
    hk, lk = string_hashes(words)
    hu, lu = string_hashes(uniq_col) if nuniq else (hk[:0], lk[:0])
    prefix = string_hashes([topic + "#"])[0].astype(np.uint64)[0]
    table = _pow31_table(int(max(lu.max(initial=0), lk.max())) + 1)
    mask = np.uint64(0xFFFFFFFF)
    uniq = (prefix * table[lu].astype(np.uint64) + hu) & mask
    word = (prefix * table[lk].astype(np.uint64) + hk) & mask
    if not nuniq and len(words) == n:   # per message: its key
        out, counts = word.astype(np.uint32), 1
    elif len(words) == n:               # per message: its UNIQ_KEY, then its key
        out = np.empty(2 * n, dtype=np.uint32)
        out[0::2], out[1::2], counts = uniq, word, 2
    else:                               # per message: its UNIQ_KEY (if any), then each word of its KEYS
        counts = np.fromiter(map(str.count, keys_col, repeat(" ")), np.int64, n) + (2 if nuniq else 1)
        out = np.empty(len(words) + nuniq, dtype=np.uint32)
        if nuniq:
            first = np.cumsum(counts) - counts
            is_uniq = np.zeros(len(out), dtype=bool)
            is_uniq[first] = True
            out[first] = uniq
            out[~is_uniq] = word
        else:
            out[:] = word
    phys = np.repeat(np.asarray(offsets, dtype=np.int64), counts)
    stamps = np.repeat(np.asarray(timestamps, dtype=np.int64), counts)
    return _java_abs(out), phys, stamps


def _java_abs(sums: np.ndarray) -> np.ndarray:
    """Math.abs of String.hashCode values given as uint32 (Math.abs(Integer.MIN_VALUE) -> 0)."""
    h = np.abs(sums.view(np.int32).astype(np.int64))
    h[h == 0x80000000] = 0
    return h


# --- one file -----------------------------------------------------------------------------------------
def _map_index_file(path: Path, size: int, load: bool, read_only: bool, slots_end: int) -> MappedFile:
    """An index file's mapping: a new file (it must not exist), or an existing one; read_only: a private
    mapping (what recovery or a put changes stays in memory; a new file lives in memory only)."""
    if read_only:
        if load and os.path.getsize(path) != size:
            raise CorruptStoreError(str(path), os.path.getsize(path), f"file size does not match the configured "
                                    f"size {size}")
        return ReadOnlyMappedFile(path, size, file_from_offset=0, in_memory=not load, holes_unsafe_before=slots_end)
    if not load and path.exists() and path.stat().st_size > 0:
        raise FileExistsError(f"{path}: index file exists already (open it with load=True)")
    return MappedFile(path, size, file_from_offset=0, create=not load)


def _corrupt_name(p: Path) -> Path:
    """Where a damaged index file is set aside: NAME.corrupt, NAME.corrupt1, ... (the first free one)."""
    aside = p.with_name(p.name + ".corrupt")
    i = 1
    while aside.exists():
        aside = p.with_name(f"{p.name}.corrupt{i}")
        i += 1
    return aside


class IndexFile(IndexEntries):
    """One index file (format in the module docstring), mapped whole.

    IndexFile(path, slots, num, end_phy_offset, end_timestamp) creates a new file (it must not exist)
    carrying a previous file's end values; IndexFile(path, slots, num, load=True) opens an existing one
    and checks its header (CorruptStoreError naming the file when the header is impossible).

    Header fields are plain attributes (read them, do not assign): begin_timestamp, end_timestamp,
    begin_phy_offset, end_phy_offset, hash_slot_count, index_count.
    """

    def __init__(self, path: str | os.PathLike, max_hash_slot_num: int, max_index_num: int,
                 end_phy_offset: int = 0, end_timestamp: int = 0, *, load: bool = False, read_only: bool = False):
        if max_hash_slot_num <= 0 or max_index_num <= 1:
            raise ValueError(f"bad index geometry: {max_hash_slot_num} slots, {max_index_num} entries")
        self.path = Path(path)
        self.name = self.path.name
        self.hash_slot_num = max_hash_slot_num
        self.index_num = max_index_num
        self.file_size = codec.index_file_size(max_hash_slot_num, max_index_num)
        self.entries_base = HEADER_SIZE + max_hash_slot_num * SLOT_SIZE
        self.mapped_file = _map_index_file(self.path, self.file_size, load, read_only, self.entries_base)
        self._mm = self.mapped_file.mm
        # Header and slots are written through the mapping, entries with pwrite (module docstring): the
        # header and slot pages are allocated up front, so a full disk is an OSError, never a SIGBUS.
        self._write_limit = max_index_num       # puts accepted up to this entry number
        # None while header and slots are allocated (read and written through the mapping); a read-only
        # fd when a loaded file's could not be allocated: they are read with pread (a hole read through
        # the mapping on a full tmpfs is a SIGBUS) and the header is written with pwrite
        self._pread_fd: int | None = None
        try:
            self.mapped_file.reserve(self.entries_base)
        except OSError as e:
            if not load:
                self.mapped_file.destroy()
                raise OSError(e.errno, f"cannot allocate the {self.entries_base} bytes of header and slots of "
                                       f"the new index file {self.path}: {e.strerror}") from e
            self._write_limit = 0               # set to indexCount below: read-only
            self._pread_fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            log.warning("%s: cannot allocate its header and slots (%s): no more keys are put into it; they "
                        "are read with pread", self.path, e.strerror)
        self.begin_timestamp = 0
        self.end_timestamp = 0
        self.begin_phy_offset = 0
        self.end_phy_offset = 0
        self.hash_slot_count = 0
        self.index_count = 1
        self._closed = False
        self._dirty = False
        self.flush_count = 0                    # msyncs done, for tests and monitoring
        self._warned: set = set()
        if load:
            try:
                self.load()
            except BaseException:
                self._close_pread_fd()
                self.mapped_file.close()
                raise
            if self._write_limit == 0:
                self._write_limit = self.index_count
        else:
            if end_phy_offset > 0:
                self.begin_phy_offset = self.end_phy_offset = end_phy_offset
            if end_timestamp > 0:
                self.begin_timestamp = self.end_timestamp = end_timestamp
            self.write_header()

    # --- header -------------------------------------------------------------------------------------
    def load(self) -> None:
        """Read the header with pread, never through the mapping (a file written elsewhere may hold a hole
        there: SIGBUS on a full tmpfs), and check it (RocketMQ: an indexCount <= 0 means 1)."""
        raw = self._pread(HEADER_SIZE, 0)
        if len(raw) < HEADER_SIZE:
            raise CorruptStoreError(str(self.path), len(raw), "index header cut short")
        (self.begin_timestamp, self.end_timestamp, self.begin_phy_offset, self.end_phy_offset,
         self.hash_slot_count, count) = _hdr_unpack(raw, 0)
        self.index_count = count
        self.check_header()
        if count <= 0:
            self.index_count = 1
        self._dirty = False

    def check_header(self) -> None:
        """Raise CorruptStoreError (naming the file and the field's offset) for an impossible header.

        Impossible: indexCount < 0 or > maxIndexNum, negative timestamps or commitlog offsets.
        Odd but possible (logged): hashSlotCount outside [0, indexCount] (4.4.0 counts every put, a crash
        can leave it one ahead), begin after end (a clock step back, or a torn header after a crash).
        """
        p = str(self.path)
        count = self.index_count
        if count < 0 or count > self.index_num:
            raise CorruptStoreError(p, 36, f"index header: indexCount {count} outside [0, {self.index_num}]")
        for off, name, v in ((0, "beginTimestamp", self.begin_timestamp), (8, "endTimestamp", self.end_timestamp),
                             (16, "beginPhyOffset", self.begin_phy_offset), (24, "endPhyOffset", self.end_phy_offset)):
            if v < 0:
                raise CorruptStoreError(p, off, f"index header: negative {name} {v}")
        if not 0 <= self.hash_slot_count <= max(count, 1):
            log.warning("%s: index header hashSlotCount %d outside [0, indexCount %d]; ignored",
                        p, self.hash_slot_count, count)
        if count > 1 and (self.begin_phy_offset > self.end_phy_offset or self.begin_timestamp > self.end_timestamp):
            log.warning("%s: index header begins after it ends (phy %d > %d or time %d > %d)", p,
                        self.begin_phy_offset, self.end_phy_offset, self.begin_timestamp, self.end_timestamp)

    def _pread(self, size: int, pos: int) -> bytes:
        """size bytes at pos, read through a file descriptor (never the mapping)."""
        if self._pread_fd is not None:
            return os.pread(self._pread_fd, size, pos)
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return os.pread(fd, size, pos)
        finally:
            os.close(fd)

    @property
    def slots_allocated(self) -> bool:
        """Header and slots are allocated: reading and writing them through the mapping is safe."""
        return self._pread_fd is None

    def read_slots(self) -> np.ndarray:
        """The hash slots (big-endian int32), through the mapping when allocated (a view: do not keep it
        past close), else a copy read with pread."""
        if self._pread_fd is None:
            return np.frombuffer(self._mm, dtype=">i4", count=self.hash_slot_num, offset=HEADER_SIZE)
        raw = self._pread(self.hash_slot_num * SLOT_SIZE, HEADER_SIZE)
        return np.frombuffer(raw.ljust(self.hash_slot_num * SLOT_SIZE, b"\0"), dtype=">i4")

    def _read_slot(self, mm, slot_pos: int) -> int:
        if self._pread_fd is None:
            return _slot_unpack(mm, slot_pos)[0]
        raw = os.pread(self._pread_fd, SLOT_SIZE, slot_pos)
        return _slot_unpack(raw, 0)[0] if len(raw) == SLOT_SIZE else 0

    def _close_pread_fd(self) -> None:
        fd, self._pread_fd = self._pread_fd, None
        if fd is not None:
            os.close(fd)

    def sanity_check(self, deep: bool = False) -> list[str]:
        """check_header(); with deep, also scan slots and entries: returns (and logs) what is wrong."""
        self.check_header()
        if not deep:
            return []
        problems = []
        count = self.index_count
        slots = self.read_slots()
        bad = np.flatnonzero((slots < 0) | (slots >= count))
        if len(bad):
            problems.append(f"{len(bad)} slots outside [0, {count}), first slot {int(bad[0])} = {int(slots[bad[0]])}")
        del slots
        if count > 1:
            ent = np.frombuffer(self._mm, dtype=ENTRY_DTYPE, count=count - 1, offset=self.entries_base + ENTRY_SIZE)
            no = np.arange(1, count)
            for what, mask in (("keyHash < 0", ent["key_hash"] < 0), ("phyOffset < 0", ent["phy_offset"] < 0),
                               ("timeDiff < 0", ent["time_diff"] < 0),
                               ("preIndexNo not below its own number", (ent["prev"] < 0) | (ent["prev"] >= no))):
                b = np.flatnonzero(mask)
                if len(b):
                    problems.append(f"{len(b)} entries with {what}, first entry {int(b[0]) + 1}")
            del ent
        for pr in problems:
            log.warning("%s: %s", self.path, pr)
        return problems

    def write_header(self) -> None:
        """Write the in-memory header values to the mapping (before any msync; see module docstring); to
        a file whose header could not be allocated with pwrite (a full disk is an OSError, not a SIGBUS)."""
        if self._pread_fd is not None:
            self.mapped_file.pwrite(0, codec.INDEX_HEADER.pack(
                self.begin_timestamp, self.end_timestamp, self.begin_phy_offset, self.end_phy_offset,
                self.hash_slot_count, self.index_count))
        else:
            _hdr_pack(self._mm, 0, self.begin_timestamp, self.end_timestamp, self.begin_phy_offset,
                      self.end_phy_offset, self.hash_slot_count, self.index_count)
        self._dirty = True

    @property
    def is_full(self) -> bool:
        return self.index_count >= self.index_num

    @property
    def room(self) -> int:
        """Entries this file still takes (0 when full, or read-only: see __init__)."""
        return max(0, self._write_limit - self.index_count)

    def is_time_matched(self, begin: int, end: int) -> bool:
        """RocketMQ's isTimeMatched: [begin, end] overlaps [beginTimestamp, endTimestamp]."""
        b, e = self.begin_timestamp, self.end_timestamp
        return (begin < b and end > e) or (b <= begin <= e) or (b <= end <= e)

    # --- writing -----------------------------------------------------------------------------------
    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        """Index key for the message at phy_offset; False (nothing written) when the file is full.

        The header is updated in memory only (write_header / flush put it in the file).
        """
        return self.put_hash(key_hash(key), phy_offset, store_timestamp)

    # --- reading -----------------------------------------------------------------------------------
    def select_phy_offsets(self, key: str, max_num: int, begin: int, end: int,
                           out: list[int] | None = None) -> list[int]:
        """RocketMQ's selectPhyOffset: commitlog offsets of entries whose keyHash equals key's and whose
        time (beginTimestamp + timeDiff * 1000) is in [begin, end], newest first, appended to out (a new
        list if None) until out holds max_num. Never raises for corrupt contents (logs a warning)."""
        if out is None:
            out = []
        self.select_by_hash(key_hash(key), max_num, begin, end, out)
        return out

    def _warn(self, what, msg: str, *args) -> None:
        warned = self._warned
        if what in warned or len(warned) > _MAX_WARNINGS_PER_FILE:
            return
        warned.add(what)
        if len(warned) > _MAX_WARNINGS_PER_FILE:
            log.warning("%s: more corruption warnings suppressed", self.path)
            return
        log.warning("%s: " + msg, self.path, *args)

    # --- lifecycle ---------------------------------------------------------------------------------
    def flush(self) -> None:
        """Write the header and msync the whole file (a no-op when nothing changed since the last flush)."""
        if self._closed:
            return
        if self._dirty:
            self.write_header()
            self._dirty = False
            self.msync()

    def msync(self) -> None:
        """msync the mapping as it is (the header must have been written: see write_header)."""
        if not self._closed:
            self._mm.flush()
            self.flush_count += 1

    def close(self) -> None:
        """Flush and unmap (RocketMQ's shutdown)."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            self._close_pread_fd()
            self.mapped_file.close()

    shutdown = close

    def destroy(self) -> None:
        """Unmap and delete the file."""
        self._closed = True
        self._close_pread_fd()
        self.mapped_file.destroy()

    @property
    def closed(self) -> bool:
        return self._closed

    def header(self) -> tuple[int, int, int, int, int, int]:
        """(beginTimestamp, endTimestamp, beginPhyOffset, endPhyOffset, hashSlotCount, indexCount)."""
        return (self.begin_timestamp, self.end_timestamp, self.begin_phy_offset, self.end_phy_offset,
                self.hash_slot_count, self.index_count)

    def __repr__(self) -> str:
        return (f"IndexFile({self.name}, count={self.index_count}/{self.index_num}, "
                f"phy={self.begin_phy_offset}..{self.end_phy_offset}, ts={self.begin_timestamp}..{self.end_timestamp})")


# --- recovery's changes to one file (IndexFile.repair_slots / cut_entries) -----------------------------------
def repair_slots(f: IndexFile, k: int) -> int:
    """Point every slot holding an entry number >= k at the first entry < k of its chain (0 if none):
    entries k.. are being removed, or were written by a process killed before it published them.
    A slot is only changed when every entry its chain passes through hashes to it: anything else is not a
    half-finished put but damage, left for recovery.index_file_problems to report. Returns how many slots
    changed. A file whose slots could not be allocated (a full disk) is left as it is: its slots are read
    with pread and a read never follows a slot past indexCount (IndexFile.select_by_hash)."""
    if not f.slots_allocated:
        log.warning("%s: slots not allocated (disk full): slots pointing past indexCount are not repaired", f.path)
        return 0
    mm = f.mapped_file.mm
    slot_num = f.hash_slot_num
    slots = np.ndarray((slot_num,), dtype=">i4", buffer=mm, offset=HEADER_SIZE)
    fix = np.flatnonzero(slots >= k)
    if not len(fix):
        del slots
        return 0
    top = min(int(slots[fix].max()) + 1, f.index_num)
    ent = np.frombuffer(mm, dtype=ENTRY_DTYPE, count=top, offset=f.entries_base)
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


def cut_entries(f: IndexFile, k: int, end_phy_offset: int, end_timestamp: int) -> int:
    """Remove the entries numbered k and later (recovery: they index messages past the commitlog's end);
    slots pointing into them are moved down their chains (or emptied), the header takes the given end
    values and the file is flushed. Returns how many entries went."""
    count = f.index_count
    if k >= count:
        return 0
    repair_slots(f, k)
    mm = f.mapped_file.mm
    slots = np.ndarray((f.hash_slot_num,), dtype=">i4", buffer=mm, offset=HEADER_SIZE)
    slots[slots >= k] = 0           # chains repair_slots would not follow (damage): empty, not dangling
    del slots
    base = f.entries_base
    mm[base + k * ENTRY_SIZE: base + count * ENTRY_SIZE] = bytes((count - k) * ENTRY_SIZE)
    f.index_count = k
    f.end_phy_offset = end_phy_offset
    f.end_timestamp = end_timestamp
    f.write_header()
    f.flush()
    log.warning("%s: %d index entries for messages at or past offset %d removed", f.path, count - k, end_phy_offset)
    return count - k


# --- the index directory ------------------------------------------------------------------------------
class IndexService:
    """The index files of `{store_dir}/index`, oldest first (RocketMQ's IndexService).

    Writers (build_index*, load, delete, flush, shutdown) serialise on a lock; the file list is replaced,
    never mutated, so query_offset reads a snapshot without the lock while the dispatcher writes.
    on_full_file_flushed(end_timestamp), if given, is called after a full file was msync'ed (the moment
    RocketMQ stores indexMsgTimestamp in the checkpoint).
    """

    def __init__(self, store_dir: str | os.PathLike, config, *,
                 on_full_file_flushed: Callable[[int], None] | None = None, read_only: bool = False):
        self.store_path = Path(store_dir) / "index"
        self.read_only = read_only      # files mapped privately: loads, cuts and puts stay in memory
        self.config = config
        self.hash_slot_num = config.max_hash_slot_num
        self.index_num = config.max_index_num
        self.files: list[IndexFile] = []
        self.dropped_files: list[Path] = []     # corrupt files load() set aside (renamed *.corrupt)
        self.destroyed_files: list[Path] = []   # files load() destroyed after an abnormal exit
        self.on_full_file_flushed = on_full_file_flushed
        self._lock = threading.RLock()
        self._flushed_full_ts = 0               # endTimestamp of the newest full file known on disk
        self.indexed_through = -1               # recovery: the message at this offset is indexed already
        self._last_name = ""

    # --- loading -----------------------------------------------------------------------------------
    def load(self, last_exit_ok: bool, index_checkpoint_ts: int) -> bool:
        """Open every file of the directory in name order. After a crash (not last_exit_ok) files whose
        endTimestamp > index_checkpoint_ts are destroyed, as RocketMQ does (their tail may be torn; the
        commitlog re-dispatch indexes those messages again).

        A file whose header is impossible is renamed `NAME.corrupt`, logged and listed in dropped_files
        (the messages it indexed need a re-dispatch to be found again); an empty file is removed. A file
        of the wrong size raises CorruptStoreError: that is a maxHashSlotNum/maxIndexNum mismatch.
        """
        expected = codec.index_file_size(self.hash_slot_num, self.index_num)
        with self._lock:
            for f in self.files:       # loading again: let go of what was open
                f.close()
            self.files = []
            loaded: list[IndexFile] = []
            if not self.read_only and self.store_path.is_dir():
                remove_half_made(self.store_path)   # timestamp names are never made again: nothing else would
            names = sorted(os.listdir(self.store_path)) if self.store_path.is_dir() else []
            for name in names:
                p = self.store_path / name
                if not name.isdigit() or not p.is_file():
                    if not name.startswith(".") and not name.endswith(".corrupt"):
                        log.warning("%s: ignoring %s, not an index file name", self.store_path, name)
                    continue
                size = p.stat().st_size
                if size == 0:
                    if not self.read_only:
                        log.warning("%s: empty index file (created just before a crash?), removed", p)
                        p.unlink()
                    continue
                if size != expected:
                    raise CorruptStoreError(str(p), size, f"index file size {size} is not {expected}, the size "
                                            f"for maxHashSlotNum={self.hash_slot_num} maxIndexNum={self.index_num}; "
                                            "was the store written with another configuration (pass its "
                                            "broker.conf with -c)? If not, the file is damaged: `rmqstore check "
                                            "--repair` moves it aside and indexes its keys again")
                try:
                    f = IndexFile(p, self.hash_slot_num, self.index_num, load=True, read_only=self.read_only)
                except CorruptStoreError as e:
                    if self.read_only:
                        self.dropped_files.append(p)
                        continue
                    aside = _corrupt_name(p)
                    os.replace(p, aside)
                    self.dropped_files.append(aside)
                    log.error("%s; set aside as %s: the messages it indexed are not found by key until they "
                              "are dispatched again", e, aside.name)
                    continue
                if not last_exit_ok and f.end_timestamp > index_checkpoint_ts:
                    log.info("%s: endTimestamp %d after the index checkpoint %d, destroyed (abnormal exit)",
                             p, f.end_timestamp, index_checkpoint_ts)
                    f.destroy()
                    self.destroyed_files.append(p)
                    continue
                log.info("load index file OK, %s", p)
                loaded.append(f)
            self.files = loaded
            self._last_name = loaded[-1].name if loaded else ""
            self._flushed_full_ts = max([index_checkpoint_ts] + [f.end_timestamp for f in loaded if f.is_full])
        return True

    def set_aside(self, f: IndexFile, why: str) -> str:
        """Take f out of the index: renamed NAME.corrupt (read-only: forgotten in memory); its keys are
        indexed again by the re-dispatch. Returns the name it was set aside as."""
        f.close()
        with self._lock:
            self.files = [x for x in self.files if x is not f]
        if self.read_only:
            return f.name + ".corrupt"
        aside = _corrupt_name(f.path)
        f.path.replace(aside)
        self.dropped_files.append(aside)
        log.error("%s: %s; set aside as %s, its keys are indexed again from the commitlog", f.path, why, aside.name)
        return aside.name

    def apply_recovery(self, plan):
        """Apply recovery's IndexPlan to the loaded files (recovery.apply_plan): set aside, drop, repair
        slots, cut. Returns (path, entries) of a file dropped instead of cut because its slots are not
        allocated (a full disk: cutting would write holes through the mapping); its keys are indexed again."""
        by_name = {f.name: f for f in self.files}
        for name, why in plan.set_aside:
            if name in by_name:
                self.set_aside(by_name.pop(name), why)
        with self._lock:
            for name in plan.dropped:
                f = by_name.pop(name, None)
                if f is not None:
                    self.files = [x for x in self.files if x is not f]
                    f.destroy()
        if plan.repair_slots in by_name:
            f = by_name[plan.repair_slots]
            repair_slots(f, f.index_count)
        gone = None
        cut = plan.cut
        if cut is not None and cut.name in by_name:
            f = by_name[cut.name]
            if f.slots_allocated:
                cut_entries(f, cut.keep, cut.end_phy_offset, cut.end_timestamp)
            else:
                # cutting would write its slots through the mapping, holes on a full disk (SIGBUS on tmpfs)
                with self._lock:
                    self.files = [x for x in self.files if x is not f]
                gone = (str(f.path), f.index_count - 1)
                f.destroy()
        self.indexed_through = plan.indexed_through
        self._last_name = self.files[-1].name if self.files else self._last_name
        return gone

    # --- writing -----------------------------------------------------------------------------------
    def _new_file(self) -> tuple[IndexFile, IndexFile | None]:
        """Under the lock: a new last file carrying the previous last file's end values."""
        files = self.files
        prev = files[-1] if files else None
        if not self.read_only:
            self.store_path.mkdir(parents=True, exist_ok=True)
        name = time_millis_to_human_string(int(time.time() * 1000))
        last = self._last_name
        if name <= last:
            # Same millisecond as the previous file, or the clock went back (also at a DST change, the
            # names being local time): the next name up, so that name order stays creation order.
            name = str(int(last) + 1).zfill(len(last))
        while (self.store_path / name).exists():
            name = str(int(name) + 1).zfill(len(name))
        if prev is not None:
            prev.write_header()
            f = IndexFile(self.store_path / name, self.hash_slot_num, self.index_num,
                          prev.end_phy_offset, prev.end_timestamp, read_only=self.read_only)
        else:
            f = IndexFile(self.store_path / name, self.hash_slot_num, self.index_num, read_only=self.read_only)
        self._last_name = name
        self.files = files + [f]
        log.info("index file %s created (previous %s)", f.path, prev.name if prev else None)
        return f, prev

    def _flush_full(self, full: list[IndexFile]) -> None:
        """msync files that became full (outside the lock) and report their endTimestamp."""
        for f in full:
            f.flush()
            ts = f.end_timestamp
            if f.is_full and ts > self._flushed_full_ts:
                self._flushed_full_ts = ts
                if self.on_full_file_flushed is not None:
                    self.on_full_file_flushed(ts)

    def build_index(self, req: codec.DispatchRequest) -> None:
        """Index one dispatched message: its UNIQ_KEY and each word of KEYS, as `topic#key`.

        Skipped: messages before the last file's endPhyOffset (indexed already; the message *at* it is
        indexed again, as RocketMQ does after a restart, unless recovery set indexed_through) and
        rolled-back transaction messages.
        """
        if not self.config.message_index_enable:
            return
        full: list[IndexFile] = []
        with self._lock:
            files = self.files
            f = files[-1] if files else None
            off = req.commit_log_offset
            if (f is not None and off < f.end_phy_offset) or off <= self.indexed_through:
                return
            if req.sys_flag & ROLLBACK == ROLLBACK:
                return
            topic = req.topic
            uniq = req.uniq_key
            keys = [uniq] if uniq is not None else []
            k = req.keys
            if k:
                keys += [w for w in k.split(" ") if w]
            if not keys:
                return
            ts = req.store_timestamp
            for w in keys:
                h = key_hash(f"{topic}#{w}")
                while f is None or not f.put_hash(h, off, ts):
                    f, prev = self._new_file()
                    if prev is not None:
                        full.append(prev)
            f.write_header()
        if full:
            self._flush_full(full)

    def build_index_batch(self, reqs: Iterable[codec.DispatchRequest]) -> None:
        """build_index for many requests, in order, with one lock hold and vectorised puts."""
        reqs = list(reqs)
        self.build_index_columns([r.topic for r in reqs], [r.keys for r in reqs], [r.uniq_key for r in reqs],
                                 [r.commit_log_offset for r in reqs], [r.store_timestamp for r in reqs],
                                 [r.sys_flag for r in reqs])

    def build_index_columns(self, topics: Sequence[str], keys_col: Sequence[str | None],
                            uniq_col: Sequence[str | None], offsets: Sequence[int], timestamps: Sequence[int],
                            sys_flags: Sequence[int]) -> None:
        """build_index_batch over columns (one entry per message, in commitlog order); offsets, timestamps and
        sys_flags may be int64 arrays."""
        if not self.config.message_index_enable:
            return
        full: list[IndexFile] = []
        with self._lock:
            files = self.files
            end = max(files[-1].end_phy_offset if files else 0, self.indexed_through + 1)
            f = files[-1] if files else None
            columns = _uniform_columns(topics, keys_col, uniq_col, offsets, timestamps, sys_flags, end)
            if columns is None:
                offsets, timestamps, sys_flags = (c.tolist() if isinstance(c, np.ndarray) else c
                                                  for c in (offsets, timestamps, sys_flags))
                keys, offs, tss, counts = _entries(topics, keys_col, uniq_col, offsets, timestamps, sys_flags, end)
                total = len(keys)
                if not total:
                    return
                if total < _VECTOR_MIN_KEYS:
                    hashes = [key_hash(k) for k in keys]
                    if len(counts) != total:
                        offs = [o for o, n in zip(offs, counts) for _ in range(n)]
                        tss = [t for t, n in zip(tss, counts) for _ in range(n)]
                    i = 0
                    while i < total:
                        if f is None or not f.room:
                            f, prev = self._new_file()
                            if prev is not None:
                                full.append(prev)
                        i = f.put_hash_list(hashes, offs, tss, i)
                elif len(counts) == total:
                    columns = key_hashes(keys), np.array(offs, dtype=np.int64), np.array(tss, dtype=np.int64)
                else:
                    c = np.array(counts, dtype=np.int64)
                    columns = (key_hashes(keys), np.repeat(np.array(offs, dtype=np.int64), c),
                               np.repeat(np.array(tss, dtype=np.int64), c))
            if columns is not None:
                hashes, phys, stamps = columns
                i, total = 0, len(hashes)
                while i < total:
                    if f is None or not f.room:
                        f, prev = self._new_file()
                        if prev is not None:
                            full.append(prev)
                    i = f.put_hashes(hashes, phys, stamps, i, total)
            f.write_header()
        if full:
            self._flush_full(full)

    # --- reading -----------------------------------------------------------------------------------
    def query_offset(self, topic: str, key: str, max_num: int, begin: int, end: int) -> tuple[list[int], int, int]:
        """RocketMQ's queryOffset: (commitlog offsets, indexLastUpdateTimestamp, indexLastUpdatePhyoffset).

        At most min(max_num, maxMsgsNumBatch) offsets, newest file first and newest entry first within a
        file; only files whose time range meets [begin, end] are searched, and the search stops at a file
        that begins before `begin`. Offsets are candidates (a hash match): the caller checks the message.
        """
        max_num = min(max_num, self.config.max_msgs_num_batch)
        out: list[int] = []
        files = self.files
        if not files:
            return out, 0, 0
        last = files[-1]
        last_ts, last_phy = last.end_timestamp, last.end_phy_offset
        if max_num <= 0:
            return out, last_ts, last_phy
        h = key_hash(f"{topic}#{key}")
        for i in range(len(files) - 1, -1, -1):
            f = files[i]
            if f.is_time_matched(begin, end):
                f.select_by_hash(h, max_num, begin, end, out)
            if f.begin_timestamp < begin or len(out) >= max_num:
                break
        return out, last_ts, last_phy

    def get_last_file_end_phy_offset(self) -> int:
        files = self.files
        return files[-1].end_phy_offset if files else 0

    def get_last_file_end_timestamp(self) -> int:
        files = self.files
        return files[-1].end_timestamp if files else 0

    # --- cleanup and lifecycle -----------------------------------------------------------------------
    def delete_expired_file(self, min_commitlog_offset: int) -> int:
        """Delete the oldest files whose endPhyOffset < min_commitlog_offset (never the last file)."""
        with self._lock:
            files = self.files
            if not files or files[0].end_phy_offset >= min_commitlog_offset:
                return 0
            n = 0
            for f in files[:-1]:
                if f.end_phy_offset < min_commitlog_offset:
                    n += 1
                else:
                    break
            victims = files[:n]
            self.files = files[n:]
        for f in victims:
            log.info("delete expired index file %s (endPhyOffset %d < %d)", f.path, f.end_phy_offset,
                     min_commitlog_offset)
            f.destroy()
        return n

    def flush(self) -> int:
        """Write the headers and msync every changed file (the last one, and any full one not yet synced).

        Returns the timestamp to store as the checkpoint's indexMsgTimestamp: the endTimestamp of the
        newest FULL file now on disk (0 if none), RocketMQ's rule. The last, still growing file's
        endTimestamp is not safe there: after a crash load() destroys every file ending after the
        checkpoint, and with messageIndexSafe the commitlog re-dispatch starts from it, so it must not be
        later than the beginning of the file that will be destroyed.
        """
        with self._lock:
            dirty = [f for f in self.files if f._dirty and not f.closed]
            for f in dirty:
                f.write_header()
                f._dirty = False        # a put after this point marks it again for the next flush
        for f in dirty:
            f.msync()
        self._flush_full([f for f in dirty if f.is_full])
        return self._flushed_full_ts

    def shutdown(self) -> None:
        """Flush and close every file (the service is empty afterwards)."""
        with self._lock:
            files = self.files
            self.files = []
            for f in files:
                f.close()
            self._flush_full([f for f in files if f.is_full])

    def destroy(self) -> None:
        """Delete every index file."""
        with self._lock:
            files = self.files
            self.files = []
            self._last_name = ""
            self._flushed_full_ts = 0
            for f in files:
                f.destroy()
