"""Recovery of RocketMQ 5's timer files at open (TimerMessageStore.recover / recoverAndRevise /
reviseQueueOffset), for store/timer/timer_service.py:

- the timerlog's end is found from the file before the checkpointed flush position (units past a torn or
  zeroed one are cut: store/timer/timer_log.py);
- every wheel slot not yet read is pointed at its last unit found (once per slot, numpy per batch);
  slots still pointing at or past the end (their units lost) are revised from their firstPos, and those
  with no unit left are emptied, so that a new unit never chains to whatever is written there later;
- the queue offset to go on reading the timer topic from: the checkpoint's or past the last unit's
  message, whichever is further (units are flushed before the checkpoint that covers them); when the
  timerlog ends before what the checkpoint saw flushed, past the last unit left (RocketMQ's way: the lost
  units' messages are linked again; some may come twice, none is lost)."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from .timer import TIMER_TOPIC
from .timer_codec import IGNORE, SLOTS_TOTAL, TIMER_BLANK_SLOTS, TimerCheckpoint
from .timer_log import TimerLog
from .timer_wheel import TimerWheel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecoveredTimer:
    read_time_ms: int           # the first slot time not delivered
    queue_offset: int           # the timer topic's queue offset to link from
    timer_log_end: int


def recover_timer(store, wheel: TimerWheel, timer_log: TimerLog, cp: TimerCheckpoint, now_ms: int) -> RecoveredTimer:
    """Recover the timerlog, revise the wheel; where reading and delivering go on (module doc)."""
    p = wheel.precision_ms
    read_ms = max(cp.last_read_time_ms, now_ms // p * p - (SLOTS_TOTAL - TIMER_BLANK_SLOTS) * p)
    last = timer_log.queue.last
    begin = max(0, cp.last_timer_log_flush_pos - (last.file_size if last else 0))
    end, last_unit = _revise_from(wheel, timer_log, begin, read_ms)
    queue_offset = _queue_offset(store, timer_log, cp, end, last_unit)
    min_first = wheel.check_phy_pos(read_ms, end)
    if min_first < end:
        log.warning("timer: wheel slots point past the timerlog's end %d: revised from %d", end, min_first)
        _revise_from(wheel, timer_log, min_first, read_ms)
    dropped = wheel.drop_beyond(read_ms, end)
    if dropped:
        log.warning("timer: %d wheel slots pointed only past the timerlog's end %d: emptied", dropped, end)
    return RecoveredTimer(read_ms, queue_offset, end)


def _queue_offset(store, timer_log: TimerLog, cp: TimerCheckpoint, end: int,
                  last_unit: tuple[int, int] | None) -> int:
    m = store.look_message_by_offset(*last_unit) if last_unit is not None else None
    after_last = m.queue_offset + 1 if m is not None and m.topic == TIMER_TOPIC else None
    if end < cp.last_timer_log_flush_pos:
        # no unit left at all: from the queue's start (everything parked still in the commitlog comes
        # again, delivered or not) rather than lose what was linked
        again = 0 if after_last is None else min(after_last, cp.last_timer_queue_offset)
        log.error("timer: %s ends at %d, before the checkpoint's flushed %d: units lost; linking the timer "
                  "topic again from queue offset %d", timer_log.queue.store_path, end,
                  cp.last_timer_log_flush_pos, again)
        return again
    return cp.last_timer_queue_offset if after_last is None else max(after_last, cp.last_timer_queue_offset)


def _revise_from(wheel: TimerWheel, timer_log: TimerLog, begin: int,
                 read_ms: int) -> tuple[int, tuple[int, int] | None]:
    """Recover the timerlog from begin and point every slot from read_ms on at its last unit found
    (TimerWheel.reviseSlot, once per slot); (the timerlog's end, (offsetPy, sizePy) of its last unit)."""
    latest: dict[int, int] = {}
    last_unit: list[tuple[int, int]] = []

    def revise(positions: np.ndarray, units: np.ndarray) -> None:
        times = units["curr_write_time_ms"].astype(np.int64) + units["delayed_delta"]
        keep = times >= read_ms             # a delivered slot is not read again: left alone
        t_rev, p_rev = times[keep][::-1], positions[keep][::-1]
        slot_times, first = np.unique(t_rev, return_index=True)     # each time's last unit
        latest.update(zip(slot_times.tolist(), p_rev[first].tolist()))
        last_unit[:] = [(int(units["offset_py"][-1]), int(units["size_py"][-1]))]

    end = timer_log.recover(begin, revise)
    for t, pos in latest.items():
        wheel.revise_slot(t, IGNORE, pos, True)
    return end, (last_unit[0] if last_unit else None)
