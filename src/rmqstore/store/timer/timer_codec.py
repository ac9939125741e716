"""Byte layouts of RocketMQ 5's timer files (store/timer/: Slot, TimerWheel, TimerLog, TimerCheckpoint), as
pure encode/decode functions. Kept out of store/format/codec.py only to keep that module's size in hand (the
project rule puts byte layouts there; this module may move into it). All integers are big-endian.

`{root}/timerwheel`: one file of 2 * SLOTS_TOTAL slots of 32 bytes (SLOTS_TOTAL = 7 days of seconds =
604,800, so 38,707,200 bytes whatever the precision); the slot of time t is
`t // timerPrecisionMs % (2 * SLOTS_TOTAL)`.

    offset  size  field
    0       8     timeMs // timerPrecisionMs   (the slot's time, in precision units; 0 = never used)
    8       8     firstPos   timerlog position of the slot's first unit (-1: none)
    16      8     lastPos    timerlog position of the slot's last unit; units chain back by prevPos
    24      4     num        units linked in the slot (delete units count -1)
    28      4     magic      unused, kept

`{root}/timerlog/`: mapped files named by the 20-digit offset of their first byte (mappedFileSizeTimerLog,
100 MiB), of 52-byte units:

    0   4  size (52)          4   8  prevPos (previous unit of the same slot, -1: first)
    12  4  magic (MAGIC_*)    16  8  currWriteTimeMs (the wheel's write time at enqueue)
    24  4  delayedTime - currWriteTimeMs   28  8  offsetPy (the parked message in the commitlog)
    36  4  sizePy             40  4  Java String.hashCode of REAL_TOPIC    44  8  reserved (0)

A unit that does not fit before the file's end (with MIN_BLANK_LEN to spare) is replaced by a blank
(size = bytes left, 0L, BLANK_MAGIC_CODE) and the unit goes to the next file.

`{root}/config/timercheck`: a 4096-byte file (an OS page, mapped by RocketMQ) starting with seven longs:
lastReadTimeMs, lastTimerLogFlushPos, lastTimerQueueOffset, masterTimerQueueOffset, then the DataVersion
(stateVersion, timestamp, counter); older files have only the first four (the rest reads as zero)."""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

SLOT_SIZE = 32
UNIT_SIZE = 52
UNIT_PRE_SIZE_FOR_MSG = 28          # offsetPy's place in a unit
MIN_BLANK_LEN = 4 + 8 + 4
TIMER_WHEEL_TTL_DAY = 7
DAY_SECS = 24 * 3600
SLOTS_TOTAL = TIMER_WHEEL_TTL_DAY * DAY_SECS
TIMER_BLANK_SLOTS = 60
DEFAULT_ROLL_WINDOW_SLOTS = 3600 * 24 * 2           # timerRollWindowSlot
DEFAULT_TIMER_LOG_FILE_SIZE = 100 * 1024 * 1024     # mappedFileSizeTimerLog
CHECKPOINT_SIZE = 56
CHECKPOINT_FILE_SIZE = 4096
MAGIC_DEFAULT = 1
MAGIC_ROLL = 1 << 1
MAGIC_DELETE = 1 << 2
BLANK = -1          # TimerWheel.BLANK: no position
IGNORE = -2         # TimerWheel.IGNORE: leave the position as it is (revise_slot)


def _int32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


# Java: 0xBBCCDDEE ^ 1880681586 + 8 (+ binds first), as a 32-bit int
BLANK_MAGIC_CODE = _int32(0xBBCCDDEE ^ (1880681586 + 8))


def wheel_file_size(slots_total: int = SLOTS_TOTAL) -> int:
    return slots_total * 2 * SLOT_SIZE


def roll_window_slots(configured: int, slots_total: int = SLOTS_TOTAL) -> int:
    """TimerMessageStore's bound on timerRollWindowSlot: 2 <= window <= slotsTotal - TIMER_BLANK_SLOTS, else
    the largest."""
    if configured > slots_total - TIMER_BLANK_SLOTS or configured < 2:
        return slots_total - TIMER_BLANK_SLOTS
    return configured


def is_magic_ok(magic: int) -> bool:
    """TimerMessageStore.isMagicOK: only the low four bits may be set."""
    return (magic | 0xF) == 0xF


def java_string_hash(s: str | None) -> int:
    """Java's String.hashCode (over UTF-16 code units), 0 for None (hashTopicForMetrics)."""
    if s is None:
        return 0
    h = 0
    data = s.encode("utf-16-be")
    for (c,) in struct.iter_unpack(">H", data):
        h = (31 * h + c) & 0xFFFFFFFF
    return _int32(h)


# --- timerwheel slots ------------------------------------------------------------------------------
_SLOT = struct.Struct(">qqqii")
WHEEL_DTYPE = np.dtype([("time", ">i8"), ("first", ">i8"), ("last", ">i8"), ("num", ">i4"), ("magic", ">i4")])


@dataclass(frozen=True)
class Slot:
    """One wheel slot (Slot.java); time_ms is the slot's time in ms, -1 for an empty or stale slot."""
    time_ms: int
    first_pos: int
    last_pos: int
    num: int = 0
    magic: int = 0


EMPTY_SLOT = Slot(-1, -1, -1)


def slot_index(time_ms: int, precision_ms: int, slots_total: int = SLOTS_TOTAL) -> int:
    return time_ms // precision_ms % (slots_total * 2)


def encode_slot(slot: Slot, precision_ms: int) -> bytes:
    return _SLOT.pack(slot.time_ms // precision_ms, slot.first_pos, slot.last_pos, slot.num, slot.magic)


def decode_slot(buf, offset: int, precision_ms: int) -> Slot:
    """The raw slot at byte offset (its time whatever it is: TimerWheel.getRawSlot)."""
    t, first, last, num, magic = _SLOT.unpack_from(buf, offset)
    return Slot(t * precision_ms, first, last, num, magic)


# --- timerlog units --------------------------------------------------------------------------------
_UNIT = struct.Struct(">iqiqiqiiq")
_BLANK = struct.Struct(">iqi")
assert _UNIT.size == UNIT_SIZE and _SLOT.size == SLOT_SIZE and _BLANK.size == MIN_BLANK_LEN


@dataclass(frozen=True)
class TimerLogUnit:
    """One timerlog unit (TimerMessageStore.doEnqueue)."""
    prev_pos: int
    magic: int
    curr_write_time_ms: int
    delayed_delta: int          # delayedTime - currWriteTimeMs (an int in the file)
    offset_py: int
    size_py: int
    topic_hash: int
    size: int = UNIT_SIZE
    reserved: int = 0

    @property
    def delayed_time_ms(self) -> int:
        return self.curr_write_time_ms + self.delayed_delta

    @property
    def is_roll(self) -> bool:
        return bool(self.magic & MAGIC_ROLL)

    @property
    def is_delete(self) -> bool:
        return bool(self.magic & MAGIC_DELETE)


UNIT_DTYPE = np.dtype([("size", ">i4"), ("prev_pos", ">i8"), ("magic", ">i4"), ("curr_write_time_ms", ">i8"),
                       ("delayed_delta", ">i4"), ("offset_py", ">i8"), ("size_py", ">i4"), ("topic_hash", ">i4"),
                       ("reserved", ">i8")])
assert UNIT_DTYPE.itemsize == UNIT_SIZE


def encode_unit(u: TimerLogUnit) -> bytes:
    return _UNIT.pack(u.size, u.prev_pos, u.magic, u.curr_write_time_ms, _int32(u.delayed_delta), u.offset_py,
                      u.size_py, u.topic_hash, u.reserved)


def decode_unit(buf, offset: int = 0) -> TimerLogUnit:
    size, prev, magic, write_ms, delta, off_py, size_py, h, reserved = _UNIT.unpack_from(buf, offset)
    return TimerLogUnit(prev, magic, write_ms, delta, off_py, size_py, h, size, reserved)


def offset_for_last_unit(file_size: int) -> int:
    """Where a full timerlog file's last unit is (TimerLog.getOffsetForLastUnit): the last multiple of
    UNIT_SIZE that leaves room for a unit and a blank."""
    return file_size - (file_size - MIN_BLANK_LEN) % UNIT_SIZE - MIN_BLANK_LEN - UNIT_SIZE


def encode_blank(length: int) -> bytes:
    """The blank that fills a timerlog file's tail of `length` bytes (its first MIN_BLANK_LEN written)."""
    return _BLANK.pack(length, 0, BLANK_MAGIC_CODE)


def unit_header(buf, offset: int) -> tuple[int, int]:
    """(size, magic) of the unit or blank at offset."""
    size, _prev, magic = _BLANK.unpack_from(buf, offset)
    return size, magic


# --- config/timercheck -----------------------------------------------------------------------------
_CHECKPOINT = struct.Struct(">7q")


@dataclass(frozen=True)
class TimerCheckpoint:
    """TimerCheckpoint.java's fields (masterTimerQueueOffset is the master's; rmqstore is always master)."""
    last_read_time_ms: int = 0
    last_timer_log_flush_pos: int = 0
    last_timer_queue_offset: int = 0
    master_timer_queue_offset: int = 0
    state_version: int = 0
    timestamp: int = 0
    counter: int = 0


def encode_checkpoint(cp: TimerCheckpoint) -> bytes:
    return _CHECKPOINT.pack(cp.last_read_time_ms, cp.last_timer_log_flush_pos, cp.last_timer_queue_offset,
                            cp.master_timer_queue_offset, cp.state_version, cp.timestamp, cp.counter)


def decode_checkpoint(buf) -> TimerCheckpoint:
    """From the file's first 56 bytes; a 32-byte (older) checkpoint has no DataVersion (zeros)."""
    if len(buf) < 32:
        raise ValueError(f"timer checkpoint of {len(buf)} bytes: at least 32 expected")
    data = bytes(buf[:CHECKPOINT_SIZE]).ljust(CHECKPOINT_SIZE, b"\0")
    return TimerCheckpoint(*_CHECKPOINT.unpack(data))
