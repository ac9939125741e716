"""The fast open: what recovery may skip because the verified-state record (verified_state.py) vouches for
it, and what it leaves to the background check (background_check.py). Decisions over loaded files.

Recovery (recovery.py) asks:

* commitlog_start: where the commitlog walk starts. RocketMQ's rule picks a file (after a clean shutdown
  the third-last, after a crash the checkpoint's); files from there on that the record vouches for are
  not walked, and a last file vouched for up to some byte (its crc32 matched: a crashed run appended to
  it) is walked from that byte. After a clean shutdown with every file vouched for, nothing is walked:
  the commitlog ends where the record says. What RocketMQ's rule would have walked and this open did not
  is `deferred`: the background check walks it with CRCs once the store serves.
* first_untrusted: per consume queue, the first file the record does not vouch for whole (recover and
  the structure checks start there) and the first unit it does not vouch for (units are checked against
  their records from there, and from the first unit of a record the walk went over).
* index_check_from: the entries of an index file deep-checked at open (none when the record vouches for it
  as it is; those appended since otherwise).

The record is read only after a clean shutdown or a crash of the process alone (recovery.read_inputs):
with it a clean open reads a few bytes per file whatever the store holds, and an open after SIGKILL reads
what was written since the record (the last files' crc32 and what follows their vouched part).
"""
from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import AbstractSet, Mapping, Sequence

import numpy as np

from ..format import codec, scanner
from ..consumequeue.consume_queue import UNIT, ConsumeQueue
from .verified_state import Vouched, rel_path

log = logging.getLogger(__name__)

_PHYS = struct.Struct(">q")
_CQ = np.dtype(codec.CQ_DTYPE)


@dataclass(frozen=True)
class CommitLogStart:
    index: int                                  # the file the walk starts in (len(files): no walk)
    pos: int                                    # the byte in it
    end: int | None = None                      # no walk: where the commitlog ends (the record's end)
    deferred: tuple[tuple[int, int], ...] = ()  # ranges RocketMQ's rule walks and this open does not


class OpenTrust:
    """The files that match the record now (verified_state.matching); recorded: every path the record lists."""

    def __init__(self, root: Path, verified: Mapping[str, Vouched], recorded: AbstractSet[str] = frozenset()):
        self.root = Path(root)
        self.verified = verified
        self.recorded = recorded
        self._last_recorded: dict[str, str] | None = None

    def __bool__(self) -> bool:
        return bool(self.verified)

    def end_of(self, mf) -> int | None:
        """How many bytes of a mapped file the record vouches for, else None."""
        v = self.verified.get(rel_path(self.root, mf.path))
        return None if v is None else v.end

    def exact(self, mf) -> bool:
        """The record vouches for the file as it is (nothing was written to it since)."""
        v = self.verified.get(rel_path(self.root, mf.path))
        return v is not None and v.exact

    def settled(self, mf) -> bool:
        """The record vouches for mf as it is and nothing follows its vouched bytes (a cheap guard: a write
        in the clock tick of the record's stat would leave the stat as it was)."""
        end = self.end_of(mf)
        return self.exact(mf) and (end >= mf.file_size or not mf.has_data(end, end + 64))

    def whole(self, mf) -> bool:
        """mf is vouched for up to its end (a file that is not the last of its queue)."""
        return self.end_of(mf) == mf.file_size

    def index_check_from(self, f) -> int | None:
        """The first entry of index file f to deep-check at open: None when the record vouches for the file
        as it is, the first entry after those it vouches for when the file was appended to since, else 1."""
        v = self.verified.get(rel_path(self.root, f.path))
        if v is None or v.begin != f.entries_base:
            return 1
        return None if v.exact else max((v.end - v.begin) // codec.INDEX_ENTRY_SIZE, 1)

    # --- commitlog ------------------------------------------------------------------------------
    def commitlog_start(self, files: Sequence, base: int, clean: bool, cqs=()) -> CommitLogStart:
        """Where to walk (module docstring). base: RocketMQ's start file (choose_start_file). cqs: the consume
        queues; their last vouched units name the last records before the vouched end, which are walked to
        it (tail_chains) before the commitlog is taken to end there unwalked."""
        if not files or not self.verified:
            return CommitLogStart(base, 0)
        base_from = files[base].file_from_offset
        i = base
        while i < len(files) - 1 and self.whole(files[i]):
            i += 1
        pos = self.end_of(files[i]) or 0
        at = files[i].file_from_offset + pos
        deferred = ((base_from, at),) if at > base_from else ()
        if clean and i == len(files) - 1 and self.settled(files[i]):
            if tail_chains(files[i], pos, self.last_units(cqs)):
                return CommitLogStart(len(files), 0, at, deferred)
            log.warning("%s: the records before the end %d the verified record names do not lead to it: the file "
                        "is walked", files[i].path, pos)
            at = files[i].file_from_offset
            return CommitLogStart(i, 0, None, ((base_from, at),) if at > base_from else ())
        return CommitLogStart(i, pos, None, deferred)

    def last_units(self, cqs) -> list[tuple[int, int]]:
        """(commitlog offset, size) of the last unit each queue's vouched last file holds (fillers left out)."""
        out = []
        for cq in cqs:
            files = cq.queue.files
            end = self.end_of(files[-1]) if files and self.exact(files[-1]) else None
            if not end or end < UNIT:
                continue
            u = np.frombuffer(files[-1].mm, dtype=_CQ, count=1, offset=end - UNIT)
            off, size = int(u["offset"][0]), int(u["size"][0])
            del u
            if size != codec.CQ_BLANK_SIZE and size > 0:
                out.append((off, size))
        return out

    def untrusted_commitlog_from(self, files: Sequence) -> int | None:
        """The offset of the first commitlog file the record does not vouch for whole (the last file
        excepted: the walk covers it), or None."""
        for mf in files[:-1]:
            if not self.whole(mf):
                return mf.file_from_offset
        return None

    # --- after a clean shutdown: where the dispatcher need not start ------------------------------
    def queue_ends_here(self, cq: ConsumeQueue) -> bool:
        """The record vouches for cq's last file as it is and lists no later file of the queue: the queue
        ended there when the store closed (a last file full or empty is no sign of a lost file after it)."""
        files = cq.queue.files
        if not files or not self.exact(files[-1]):
            return False
        if self._last_recorded is None:
            last: dict[str, str] = {}
            for p in self.recorded:
                d, _, name = p.rpartition("/")
                if name > last.get(d, ""):
                    last[d] = name
            self._last_recorded = last
        d, _, name = rel_path(self.root, files[-1].path).rpartition("/")
        return self._last_recorded.get(d, "") <= name

    def index_complete(self, commitlog_files: Sequence, index_files: Sequence) -> bool:
        """The record vouches for the commitlog's last file and for every index file as they are, and lists
        no other index file: the index held every key up to the commitlog's end when the store closed (the
        messages after its last entry carry none; with none at all there is no index file)."""
        if not self.recorded or not commitlog_files or not self.exact(commitlog_files[-1]):
            return False
        present = {rel_path(self.root, f.path) for f in index_files}
        return all(self.exact(f) for f in index_files) and \
            {p for p in self.recorded if p.startswith("index/")} == present

    # --- consume queues -------------------------------------------------------------------------
    def first_untrusted(self, cq: ConsumeQueue) -> tuple[int, int]:
        """(index of cq's first file the record does not vouch for whole, the first unit it does not vouch
        for); (len(files), max offset) when it vouches for the queue as it is."""
        files = cq.queue.files
        for i, mf in enumerate(files):
            last = i == len(files) - 1
            if last and self.settled(mf):
                break
            if not self.whole(mf) or (last and not self.exact(mf)):
                return i, (mf.file_from_offset + (self.end_of(mf) or 0)) // UNIT
        return len(files), cq.get_max_offset_in_queue()


def tail_chains(mf, end: int, units: list[tuple[int, int]]) -> bool:
    """Whether the last commitlog file mf holds valid records (CRC included) from the last one a consume queue
    unit names (its own PHYSICALOFFSET naming it; the file's start when no unit points into it) up to byte
    end exactly (or to its END_OF_FILE blank), and no unit points past end: a few records are read."""
    first = mf.file_from_offset
    if any(o + s > first + end for o, s in units):
        return False
    inside = [o for o, _ in units if o >= first]
    pos = max(inside) - first if inside else 0
    try:
        if pos and _PHYS.unpack_from(mf.mm, pos + codec.POS_PHYSICALOFFSET)[0] != first + pos:
            return False
        stop, kind, _ = scanner.walk_records(mf.mm, pos, end, True)
    except (scanner.RecordError, struct.error, ValueError):
        return False
    return stop == end or kind is scanner.Outcome.END_OF_FILE


def first_unit_pointing_at(cq: ConsumeQueue, offset: int) -> int:
    """A logical offset from which every unit of cq that points at or after commitlog `offset` is included:
    the file holding the first such unit is found by its first units (files from the end), and in it the
    first unit whose offset, or an earlier unit's, reaches `offset` (a running maximum: filler units read as
    offset 0). The queue's end when no unit does. Reads a few units per file and one file's offsets."""
    files = cq.queue.files
    hi = cq.get_max_offset_in_queue()
    last = cq.get_unit(hi - 1) if hi > cq.get_min_offset_in_queue() else None
    if last is not None and 0 < last[1] != codec.CQ_BLANK_SIZE and last[0] < offset:
        return hi                       # offsets grow: no unit points at or after offset
    for i in range(len(files) - 1, -1, -1):
        mf = files[i]
        first = _first_real_offset(mf)
        if first is None or first >= offset:
            continue
        n = min(mf.read_position, mf.data_end()) // UNIT
        off = np.frombuffer(mf.mm, dtype=_CQ, count=n)["offset"].astype(np.int64)
        k = int(np.searchsorted(np.maximum.accumulate(off), offset, side="left"))
        del off
        return mf.file_from_offset // UNIT + k
    return files[0].file_from_offset // UNIT if files else hi


def _head_units(mf, look: int = 64) -> np.ndarray:
    """A copy of mf's first `look` units (fewer when fewer are readable)."""
    n = min(look, min(mf.read_position, mf.data_end()) // UNIT)
    return np.frombuffer(mf.mm, dtype=_CQ, count=max(n, 0)).copy()


def _first_real_offset(mf, look: int = 64) -> int | None:
    """The commitlog offset of the first unit of mf that is not a filler (within its first `look` units and
    its readable bytes): None for a file without units, 0 (below anything) when the first `look` are all
    fillers."""
    a = _head_units(mf, look)
    real = np.flatnonzero((a["size"] != codec.CQ_BLANK_SIZE) | (a["offset"] != 0))
    if len(real):
        return int(a["offset"][real[0]])
    return 0 if len(a) == look else None


def first_real_unit_position(cq: ConsumeQueue) -> int:
    """The byte position of cq's first unit that is not a filler (ConsumeQueue's min logic offset), from the
    first units of its first file; the whole file is read only when they are all fillers."""
    first = cq.queue.first
    if first is None:
        return 0
    a = _head_units(first)
    real = np.flatnonzero((a["size"] != codec.CQ_BLANK_SIZE) | (a["offset"] != 0))
    if len(real):
        return first.file_from_offset + int(real[0]) * UNIT
    return cq._first_real_unit_offset()


def first_real_unit_below(cq: ConsumeQueue, cl_min: int) -> bool:
    """Whether ConsumeQueue.correct_min_offset(cl_min) may move cq's min offset: False when one of the first
    units of its first file already points at or after cl_min, at or before the min offset (the usual case:
    then only those units are read)."""
    first = cq.queue.first
    if first is None:
        return False
    a = _head_units(first)
    ok = np.flatnonzero((a["offset"] >= cl_min) & (a["size"] > 0) & (a["size"] != codec.CQ_BLANK_SIZE))
    return not (len(ok) and first.file_from_offset + int(ok[0]) * UNIT <= cq.min_logic_offset)
