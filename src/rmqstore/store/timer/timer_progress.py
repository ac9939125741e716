"""The earlier rmqstore timer design's progress file, `config/timerProgress.json`, read once to continue
such a store with RocketMQ 5's timer files (store/timer/timer_service.py):

    {"committed": the lowest rmq_sys_wheel_timer queue offset not yet delivered,
     "delivered": [queue offsets above it already delivered]}

The service goes on from `committed`, skips `delivered`, and retires the file (renamed
timerProgress.json.migrated) once a timer checkpoint covers every offset in it."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..conf.config_file import load_config_file

log = logging.getLogger(__name__)

FILE_NAME = "timerProgress.json"


@dataclass
class EarlierProgress:
    committed: int
    delivered: set[int] = field(default_factory=set)


def _decode(d) -> EarlierProgress:
    if not isinstance(d, dict) or not isinstance(d.get("committed"), int):
        raise ValueError(f"{FILE_NAME}: expected {{committed: int, delivered: [int]}}")
    return EarlierProgress(d["committed"], {int(x) for x in d.get("delivered", [])})


def read_earlier_progress(path: str | os.PathLike) -> EarlierProgress | None:
    """The file's progress, None without a file (a bad file: the config_file error naming it)."""
    p = Path(path)
    return load_config_file(p, _decode) if p.exists() else None


def retire_earlier_progress(path: str | os.PathLike, by: str | os.PathLike) -> None:
    """Rename the file to *.migrated (kept for a look, never read again)."""
    p = Path(path)
    if p.exists():
        os.replace(p, p.with_name(p.name + ".migrated"))
        log.info("timer: %s migrated to %s", p, by)
