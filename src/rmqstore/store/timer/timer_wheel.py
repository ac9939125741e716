"""TimerWheel: the `{root}/timerwheel` file of RocketMQ 5's timer (layout in store/timer/timer_codec.py).

2 * SLOTS_TOTAL slots of 32 bytes, mapped; the slot of a time holds the timerlog positions of the first and
last units due in that precision interval. A slot whose stored time is not the time asked for belongs to
another lap of the wheel and reads as empty (TimerWheel.getSlot). The file is created (sparse) the first
time a timer message is parked; a file of another length is refused with an error naming it."""
from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

from ...errors import CorruptStoreError
from .timer_codec import (EMPTY_SLOT, IGNORE, SLOT_SIZE, SLOTS_TOTAL, WHEEL_DTYPE, Slot, decode_slot,
                          encode_slot, slot_index, wheel_file_size)


class TimerWheel:
    """The mapped wheel file; writes go through the mapping (the file is small and written in place)."""

    def __init__(self, path: str | os.PathLike, precision_ms: int, slots_total: int = SLOTS_TOTAL):
        self.path = Path(path)
        self.precision_ms = precision_ms
        self.slots_total = slots_total
        self.length = wheel_file_size(slots_total)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size not in (0, self.length):
                raise CorruptStoreError(str(self.path), size, f"timer wheel length {size} != expected "
                                        f"{self.length} ({slots_total} * 2 slots of {SLOT_SIZE} bytes)")
            if size == 0:
                os.ftruncate(fd, self.length)
            self._mm = mmap.mmap(fd, self.length)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def _offset(self, time_ms: int) -> int:
        return slot_index(time_ms, self.precision_ms, self.slots_total) * SLOT_SIZE

    def get_raw_slot(self, time_ms: int) -> Slot:
        return decode_slot(self._mm, self._offset(time_ms), self.precision_ms)

    def get_slot(self, time_ms: int) -> Slot:
        """The slot of time_ms, EMPTY_SLOT when it holds another lap's time (or nothing)."""
        slot = self.get_raw_slot(time_ms)
        if slot.time_ms != time_ms // self.precision_ms * self.precision_ms:
            return EMPTY_SLOT
        return slot

    def put_slot(self, time_ms: int, first_pos: int, last_pos: int, num: int | None = None,
                 magic: int | None = None) -> None:
        """Write the slot of time_ms (num / magic None: left as they are, TimerWheel.putSlot's 3-arg form)."""
        off = self._offset(time_ms)
        old = decode_slot(self._mm, off, self.precision_ms)
        slot = Slot(time_ms // self.precision_ms * self.precision_ms, first_pos, last_pos,
                    old.num if num is None else num, old.magic if magic is None else magic)
        self._mm[off:off + SLOT_SIZE] = encode_slot(slot, self.precision_ms)

    def revise_slot(self, time_ms: int, first_pos: int, last_pos: int, force: bool) -> None:
        """Recovery's fix-up (TimerWheel.reviseSlot): positions other than IGNORE replace the slot's; a
        slot of another lap is overwritten only when force."""
        raw = self.get_raw_slot(time_ms)
        if raw.time_ms // self.precision_ms != time_ms // self.precision_ms:
            if force:
                self.put_slot(time_ms, first_pos if first_pos != IGNORE else last_pos, last_pos)
            return
        self.put_slot(time_ms, raw.first_pos if first_pos == IGNORE else first_pos,
                      raw.last_pos if last_pos == IGNORE else last_pos)

    def _slots(self) -> np.ndarray:
        return np.frombuffer(self._mm, dtype=WHEEL_DTYPE)

    def next_slot_time(self, start_ms: int, end_ms: int) -> int | None:
        """The first time in [start_ms, end_ms) whose slot is in use for that time (whole precision
        intervals), None if none: the dequeue skips empty seconds in one numpy pass, not one by one."""
        p = self.precision_ms
        a, b = start_ms // p, min(end_ms // p, start_ms // p + 2 * self.slots_total)
        if b <= a:
            return None
        times = self._slots()["time"]
        ks = np.arange(a, b, dtype=np.int64)
        hits = np.flatnonzero(times[ks % (2 * self.slots_total)] == ks)
        del times
        return int(ks[hits[0]]) * p if hits.size else None

    def _beyond(self, time_start_ms: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """(indices, slots) of the slots from time_start_ms on (one lap) whose lastPos is at or past end."""
        p, n = self.precision_ms, 2 * self.slots_total
        ks = np.arange(time_start_ms // p, time_start_ms // p + n, dtype=np.int64)
        idx = ks % n
        slots = self._slots()[idx]
        live = (slots["time"] == ks) & (slots["last"] >= end)
        return idx[live], slots[live]

    def check_phy_pos(self, time_start_ms: int, end: int) -> int:
        """The lowest firstPos of the slots from time_start_ms on whose lastPos is at or past the
        timerlog's end (TimerWheel.checkPhyPos: the wheel points beyond the timerlog); 2**63-1 if none."""
        _idx, slots = self._beyond(time_start_ms, end)
        return int(slots["first"].min()) if slots.size else 2 ** 63 - 1

    def drop_beyond(self, time_start_ms: int, end: int) -> int:
        """Empty the slots from time_start_ms on whose lastPos is still at or past the timerlog's end once
        recovery revised them (none of their units is left: their messages are linked again from the
        queue); a new unit would otherwise chain to whatever is later written there. How many."""
        idx, _slots = self._beyond(time_start_ms, end)
        for i in idx.tolist():
            self._mm[i * SLOT_SIZE:(i + 1) * SLOT_SIZE] = bytes(SLOT_SIZE)
        return len(idx)

    def all_num(self, time_start_ms: int) -> int:
        """Units still in the wheel from time_start_ms on (TimerWheel.getAllNum)."""
        p, n = self.precision_ms, 2 * self.slots_total
        ks = np.arange(time_start_ms // p, time_start_ms // p + n, dtype=np.int64)
        slots = self._slots()[ks % n]
        return int(slots["num"][slots["time"] == ks].astype(np.int64).sum())

    def flush(self) -> None:
        self._mm.flush()

    def shutdown(self, flush: bool = True) -> None:
        if self._mm.closed:
            return
        if flush:
            self.flush()
        self._mm.close()
        os.close(self._fd)
