"""The store's `lock` file (held with an exclusive POSIX lock while the store is open, as RocketMQ's
FileChannel.tryLock does) and its `abort` file (present while open: its presence at the next open means
the last run did not shut down cleanly)."""
from __future__ import annotations

import errno
import fcntl
import os
import struct
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
        """Take the lock or raise StoreLockedError at once (never waits); touches no byte of the store."""
        key = str(self.store_dir.resolve())
        with _held_lock:
            if key in _held:
                err = StoreLockedError(str(self.store_dir))
                err.args = (f"store {self.store_dir} is already open in this process (pid {os.getpid()}); "
                            "close it before opening it again",)
                raise err
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
            except OSError as e:
                holder = _lock_holder(fd)
                os.close(fd)
                if e.errno in (errno.EACCES, errno.EAGAIN):
                    err = StoreLockedError(str(self.store_dir))
                    if holder:
                        err.args = (err.args[0].replace("by another process", f"by another process (pid {holder})", 1),)
                    raise err from None
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


_FLOCK = "@hhqqi4x"   # struct flock on Linux: l_type, l_whence, l_start, l_len, l_pid


def _lock_holder(fd: int) -> int | None:
    """The pid holding the lock on byte 0 of fd's file (fcntl F_GETLK), if the platform tells."""
    try:
        req = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0)
        l_type, _, _, _, pid = struct.unpack(_FLOCK, fcntl.fcntl(fd, fcntl.F_GETLK, req))
        return pid if l_type != fcntl.F_UNLCK and pid > 0 else None
    except (OSError, struct.error, AttributeError):
        return None


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
