"""The failure channel (Kafka's LogDirFailureChannel): one object every I/O service reports to.

A store creates one FailureChannel and hands it to its services (dispatcher, flush services, recovery,
the put path). Every failure is a typed `Failure` (what, file, offset, errno, why, when) kept in order;
nothing a service gives up on, skips or cannot write is only a log line.

Two kinds of entries:
- events: something happened and is over (a skipped damaged range, a missing commitlog file, a failed
  write): kept in `failures()` for whoever asks (the facade, `check`, the broker).
- conditions: something is wrong *now* and blocks progress (the dispatcher cannot write a consume queue,
  a flush failed): `raise_condition(key, ...)` sets it, `clear_condition(key)` ends it, `blocking()` lists
  the ones in force. Waiters (wait_dispatched, close) return at once with the reason instead of timing out.

Thread-safe; `wait(timeout)` wakes on every new report.
"""
from __future__ import annotations

import enum
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

log = logging.getLogger(__name__)

MAX_KEPT = 10_000   # events kept (the oldest are dropped first; `count` keeps counting)


class FailureKind(enum.Enum):
    WRITE = "WRITE"                      # a commitlog write failed (ENOSPC, EIO): puts are refused
    FLUSH = "FLUSH"                      # an fsync/msync failed: nothing since the last good flush is durable
    DISPATCH = "DISPATCH"                # the dispatcher cannot make progress (a consume queue / index write)
    COMMITLOG_GAP = "COMMITLOG_GAP"      # a commitlog file is missing between two others
    CORRUPT_RECORD = "CORRUPT_RECORD"    # a damaged commitlog range was skipped (its messages are lost)
    CORRUPT_UNIT = "CORRUPT_UNIT"        # a consume queue unit does not match its record: cut and rebuilt
    CORRUPT_INDEX = "CORRUPT_INDEX"      # an index file fails its deep check: set aside at the next open
    REPLICA = "REPLICA"                  # replication: the link to the master is down, or the logs diverged


@dataclass(frozen=True)
class Failure:
    kind: FailureKind
    reason: str
    path: str = ""
    offset: int = -1                     # commitlog offset (or byte offset inside `path` for other files)
    end: int | None = None               # for a skipped range: where it ends (exclusive)
    errno: int | None = None
    time: float = field(default_factory=time.time)

    def __str__(self) -> str:
        where = self.path or "store"
        if self.offset >= 0:
            where += f" at offset {self.offset}" + (f"..{self.end}" if self.end is not None else "")
        err = f" [errno {self.errno}]" if self.errno is not None else ""
        return f"{self.kind.value}: {where}: {self.reason}{err}"


class FailureChannel:
    """Where every service reports what went wrong (module docstring)."""

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._events: deque[Failure] = deque(maxlen=MAX_KEPT)
        self._conditions: dict[str, Failure] = {}
        self._listeners: list[Callable[[Failure], None]] = []
        self.count = 0          # every report ever made (events and conditions)
        self.version = 0        # bumped on every change: waiters compare it

    # --- reporting ------------------------------------------------------------------------------
    def report(self, kind: FailureKind, reason: str, *, path: str = "", offset: int = -1,
               end: int | None = None, errno: int | None = None) -> Failure:
        """Record an event; returns it."""
        f = Failure(kind, reason, str(path), offset, end, errno)
        with self._cond:
            self._events.append(f)
            self.count += 1
            self.version += 1
            self._cond.notify_all()
        self._tell(f)
        return f

    def raise_condition(self, key: str, kind: FailureKind, reason: str, *, path: str = "", offset: int = -1,
                        errno: int | None = None) -> Failure:
        """Set (or replace) a condition that blocks progress until cleared; recorded as an event too when
        it is new or its reason changed."""
        with self._cond:
            old = self._conditions.get(key)
            if old is not None and old.reason == reason and old.kind == kind:
                return old
        f = self.report(kind, reason, path=path, offset=offset, errno=errno)
        with self._cond:
            self._conditions[key] = f
            self.version += 1
            self._cond.notify_all()
        return f

    def clear_condition(self, key: str) -> None:
        with self._cond:
            if self._conditions.pop(key, None) is not None:
                self.version += 1
                self._cond.notify_all()

    def condition(self, key: str) -> Failure | None:
        return self._conditions.get(key)

    # --- reading --------------------------------------------------------------------------------
    def failures(self, kind: FailureKind | None = None) -> list[Failure]:
        with self._cond:
            return [f for f in self._events if kind is None or f.kind == kind]

    def blocking(self) -> list[Failure]:
        """The conditions in force, oldest first."""
        with self._cond:
            return list(self._conditions.values())

    def wait(self, timeout: float, since: int | None = None) -> int:
        """Block until something is reported after version `since` (default: now), or timeout; returns
        the version reached."""
        with self._cond:
            start = self.version if since is None else since
            self._cond.wait_for(lambda: self.version != start, timeout)
            return self.version

    def add_listener(self, fn: Callable[[Failure], None]) -> None:
        self._listeners.append(fn)

    def _tell(self, f: Failure) -> None:
        for fn in list(self._listeners):
            try:
                fn(f)
            except Exception:   # a listener's bug must not hide the failure
                log.exception("failure listener failed")

    def __bool__(self) -> bool:
        return True

    def __len__(self) -> int:
        return len(self._events)
