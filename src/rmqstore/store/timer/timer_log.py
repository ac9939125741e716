"""TimerLog: the `{root}/timerlog/` mapped files of RocketMQ 5's timer (layout in store/timer/timer_codec.py).

Append-only 52-byte units over a MappedFileQueue (files named by offset, mappedFileSizeTimerLog each); a
unit's position is its global offset. A unit that would leave less than MIN_BLANK_LEN before a file's end
is preceded by a blank filling that end (TimerLog.append). Recovery (TimerMessageStore.recoverAndRevise)
walks the units from a position, stops at the first that is neither a unit nor a blank (a torn or never
written unit: besides RocketMQ's checks of size and magic, MAGIC_DEFAULT must be set and sizePy > 0, as in
every unit RocketMQ writes), and cuts the log there."""
from __future__ import annotations

import logging
import os
import struct
from typing import Callable

import numpy as np

from ...errors import CorruptStoreError
from ..files.mapped_file import MappedFileQueue
from .timer_codec import (BLANK_MAGIC_CODE, MAGIC_DEFAULT, MIN_BLANK_LEN, UNIT_DTYPE, UNIT_SIZE, TimerLogUnit,
                          decode_unit, encode_blank, is_magic_ok, offset_for_last_unit)

log = logging.getLogger(__name__)

_SCAN_UNITS = 8192          # units read per chunk while recovering


def is_unit_magic(magic: int) -> bool:
    """A unit's magic: RocketMQ's isMagicOK, and MAGIC_DEFAULT set (every unit RocketMQ writes has it; a
    zeroed or torn header has not)."""
    return is_magic_ok(magic) and bool(magic & MAGIC_DEFAULT)
_HEADER = struct.Struct(">iqi")


class TimerLog:
    """The timerlog directory: append units, read one by position, recover the end after a crash."""

    def __init__(self, store_path: str | os.PathLike, file_size: int):
        if file_size < UNIT_SIZE + MIN_BLANK_LEN:
            raise ValueError(f"mappedFileSizeTimerLog={file_size}: at least {UNIT_SIZE + MIN_BLANK_LEN} bytes")
        self.file_size = file_size
        self.queue = MappedFileQueue(store_path, file_size)

    def load(self) -> None:
        self.queue.load()

    @property
    def max_offset(self) -> int:
        return self.queue.get_max_offset()

    def append(self, data: bytes) -> int:
        """Append one unit; its position. OSError (a full disk) propagates: nothing is linked then."""
        mf = self.queue.get_last_mapped_file(0)
        if len(data) + MIN_BLANK_LEN > mf.file_size - mf.wrote_position:
            mf.append(encode_blank(mf.file_size - mf.wrote_position))
            mf.wrote_position = mf.committed_position = mf.file_size     # the blank fills the file
            mf = self.queue.get_last_mapped_file(0)
        pos = mf.file_from_offset + mf.wrote_position
        if not mf.append(data):     # pragma: no cover - the check above leaves room
            raise CorruptStoreError(str(mf.path), mf.wrote_position, "timerlog unit does not fit")
        return pos

    def read_unit(self, pos: int) -> TimerLogUnit | None:
        """The unit at pos, None when no file holds it or it is not a unit."""
        mf = self.queue.find_mapped_file_by_offset(pos)
        if mf is None:
            return None
        data = mf.read(pos - mf.file_from_offset, UNIT_SIZE)
        if data is None:
            return None
        u = decode_unit(data)
        return u if u.size == UNIT_SIZE and is_unit_magic(u.magic) else None

    def chain(self, last_pos: int, what: str) -> list[tuple[int, TimerLogUnit]]:
        """The units of a wheel slot in enqueue order: from last_pos back along prevPos to -1. A position
        with no unit, or a prevPos not before its unit, ends the chain with an error naming both."""
        units: list[tuple[int, TimerLogUnit]] = []
        pos = last_pos
        while pos != -1:
            u = self.read_unit(pos)
            if u is None:
                log.error("timer %s: no timerlog unit at %d (%s ends at %d): the rest of the chain is lost",
                          what, pos, self.queue.store_path, self.max_offset)
                break
            units.append((pos, u))
            if u.prev_pos >= pos:
                log.error("timer %s: timerlog unit at %d points forward to %d: chain cut", what, pos, u.prev_pos)
                break
            pos = u.prev_pos
        units.reverse()
        return units

    def recover(self, begin_offset: int, on_units: Callable[[np.ndarray, np.ndarray], None]) -> int:
        """Walk the units from the file holding begin_offset to the end of valid data, calling
        on_units(positions, units) per batch (units: a UNIT_DTYPE array); cut the log there and return
        that end."""
        files = self.queue.files
        if not files:
            return 0
        idx = max((i for i, mf in enumerate(files) if begin_offset >= mf.file_from_offset), default=0)
        end = files[idx].file_from_offset
        for mf in files[idx:]:
            pos, complete = self._scan_file(mf, on_units)
            end = mf.file_from_offset + pos
            if not complete:
                break
        self.queue.truncate_to(end)
        return end

    def _scan_file(self, mf, on_units) -> tuple[int, bool]:
        """(where valid data ends in mf, whether the file is complete: ended by a blank). Batches of
        units are checked with numpy (a measured hot path: 20,000 units one by one took 0.5 s)."""
        pos = 0
        data_end = mf.data_end()        # never read the sparse tail through the mapping (MappedFile.data_end)
        while pos + MIN_BLANK_LEN <= mf.file_size:
            chunk = mf.read_from(pos, min(UNIT_SIZE * _SCAN_UNITS, data_end - pos))
            n = len(chunk) // UNIT_SIZE
            units = np.frombuffer(chunk, UNIT_DTYPE, count=n)
            magic = units["magic"]
            ok = (units["size"] == UNIT_SIZE) & ((magic | 0xF) == 0xF) & ((magic & MAGIC_DEFAULT) != 0) \
                & (units["size_py"] > 0)       # (a unit torn after its header has no sizePy)
            bad = np.flatnonzero(~ok)
            k = int(bad[0]) if bad.size else n
            if k:
                on_units(mf.file_from_offset + pos + np.arange(k, dtype=np.int64) * UNIT_SIZE, units[:k])
            if k < n:
                return (mf.file_size, True) if magic[k] == BLANK_MAGIC_CODE else (pos + k * UNIT_SIZE, False)
            pos += n * UNIT_SIZE
            if len(chunk) - n * UNIT_SIZE >= MIN_BLANK_LEN or n == 0:     # a short tail: a blank or the end
                tail = chunk[n * UNIT_SIZE:]
                blank = len(tail) >= MIN_BLANK_LEN and _HEADER.unpack_from(tail)[2] == BLANK_MAGIC_CODE
                return (mf.file_size, True) if blank else (pos, False)
        return pos, False

    def delete_expired(self, min_offset_py: int) -> int:
        """Delete the first files (never the last) whose last unit's message is below the commitlog's
        min offset: their messages are gone (MappedFileQueue.deleteExpiredFileByOffsetForTimerLog, which
        does this every 30 s). A file whose last place holds no unit is kept, with a warning."""
        files = self.queue.files[:-1]
        victims = []
        at = offset_for_last_unit(self.file_size)
        for mf in files:
            data = mf.read(at, UNIT_SIZE)
            u = decode_unit(data) if data is not None else None
            if u is None or u.size != UNIT_SIZE or not is_unit_magic(u.magic):
                log.warning("timerlog %s: no unit at %d, where a full file's last is: kept", mf.path, at)
                break
            if u.offset_py >= min_offset_py:
                break
            victims.append(mf)
        return self.queue.delete_files(victims)

    def flush(self) -> None:
        self.queue.flush(0)

    @property
    def flushed_where(self) -> int:
        return self.queue.flushed_where

    def shutdown(self) -> None:
        self.flush()
        self.queue.shutdown()
