"""The store's `lock` file (held with an exclusive POSIX lock while the store is open, as RocketMQ's
FileChannel.tryLock does) and its `abort` file (present while open: its presence at the next open means
the last run did not shut down cleanly)."""
from __future__ import annotations

import errno
import fcntl
import os
import threading
from pathlib import Path

from .errors import StoreLockedError

_held: set[str] = set()      # POSIX locks are per process: also refuse a second open inside this one
_held_lock = threading.Lock()


class StoreLock:
    def __init__(self, store_dir: str | Path):
        self.store_dir = Path(store_dir)
        self.path = self.store_dir / "lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        key = str(self.store_dir.resolve())
        with _held_lock:
            if key in _held:
                raise StoreLockedError(str(self.store_dir))
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EACCES, errno.EAGAIN):
                    raise StoreLockedError(str(self.store_dir)) from None
                raise
            _held.add(key)
            self._key = key
            self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with _held_lock:
                try:
                    fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, 0)
                finally:
                    os.close(self._fd)
                    self._fd = None
                    _held.discard(self._key)


class AbortFile:
    def __init__(self, store_dir: str | Path):
        self.path = Path(store_dir) / "abort"

    def exists(self) -> bool:
        return self.path.exists()

    def create(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.fsync(fd)
        os.close(fd)

    def remove(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
