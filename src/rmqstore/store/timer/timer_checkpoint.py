"""The timer checkpoint file `{root}/config/timercheck` (RocketMQ 5's TimerCheckpoint; layout in
store/timer/timer_codec.py): where the timer's reading of the wheel, its enqueue from rmq_sys_wheel_timer and
its timerlog flush stood at the last flush. 4096 bytes (an OS page) of which the first 56 are used; written
in place with pwrite + fdatasync (the 56 bytes are within one sector)."""
from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

from ...errors import CorruptStoreError
from .timer_codec import CHECKPOINT_FILE_SIZE, TimerCheckpoint, decode_checkpoint, encode_checkpoint


def read_timer_checkpoint(path: str | os.PathLike) -> TimerCheckpoint | None:
    """The checkpoint in the file, None if there is no file; a file too short is an error naming it."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return decode_checkpoint(data)
    except ValueError as e:
        raise CorruptStoreError(str(p), len(data), str(e)) from None


def next_version(cp: TimerCheckpoint, state_version: int = 0) -> TimerCheckpoint:
    """DataVersion.nextVersion: a new timestamp, the counter one up."""
    return replace(cp, state_version=state_version, timestamp=int(time.time() * 1000), counter=cp.counter + 1)


class TimerCheckpointFile:
    """The open checkpoint file; flush(cp) makes cp durable."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(self._fd).st_size < CHECKPOINT_FILE_SIZE:
            os.ftruncate(self._fd, CHECKPOINT_FILE_SIZE)

    def flush(self, cp: TimerCheckpoint) -> None:
        data = encode_checkpoint(cp)
        if os.pwrite(self._fd, data, 0) != len(data):
            raise OSError(f"short write of the timer checkpoint {self.path}")
        os.fdatasync(self._fd)

    def shutdown(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
