"""Rebuild a store's consume queues and index from its commitlog (the local engine).

The store is locked, `consumequeue/` and `index/` are removed, and opening the store re-dispatches the
whole commitlog: the files written are those RocketMQ's dispatcher writes (consume queues byte for byte;
index slots and entries alike, file names taken from the clock).
"""
from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Callable

from .config import StoreConfig
from .lock import StoreLock
from .store import MessageStore


class ProgressBar:
    """A plain progress bar on stderr, drawn only when stderr is a terminal (or force=True)."""

    def __init__(self, total: int, label: str = "", force: bool = False, stream=None):
        self.total = max(total, 1)
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = force or self.stream.isatty()
        self._last = 0.0
        self._start = time.monotonic()

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < 0.1 and done < self.total:
            return
        self._last = now
        frac = min(done / self.total, 1.0)
        bar = "#" * int(frac * 30)
        rate = done / max(now - self._start, 1e-9) / 1e6
        self.stream.write(f"\r{self.label} [{bar:<30}] {frac * 100:5.1f}% {rate:7.1f} MB/s")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.update(self.total)
            self.stream.write("\n")
            self.stream.flush()


def rebuild_store(path: str | Path, config: StoreConfig | None = None,
                  progress: Callable[[int, int], None] | None = None) -> dict:
    """Drop and rebuild consume queues and index of the store at path; returns counts."""
    path = Path(path)
    config = config or StoreConfig()
    if not (path / "commitlog").is_dir():
        raise FileNotFoundError(f"{path}: not a store (no commitlog directory)")
    lock = StoreLock(path)
    lock.acquire()          # refuse at once if another process has the store open
    try:
        for sub in ("consumequeue", "index"):
            shutil.rmtree(path / sub, ignore_errors=True)
    finally:
        lock.release()
    t0 = time.perf_counter()
    store = MessageStore(path, config)
    if progress is not None:
        store.dispatcher.on_progress = progress
    store.start(start_services=False)
    try:
        report = store.recovery_report
        out = {"store": str(path), "messages": report.redispatched_messages,
               "bytes": store.get_max_phy_offset() - max(store.get_min_phy_offset(), 0),
               "queues": sum(1 for _ in store.consume_queues),
               "index_files": len(store.index_service.files)}
    finally:
        store.close()
    out["seconds"] = round(time.perf_counter() - t0, 3)
    return out
