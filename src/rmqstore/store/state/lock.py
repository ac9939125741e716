"""The store's `lock` file (held with an exclusive POSIX lock while the store is open, as RocketMQ's
FileChannel.tryLock does) and its `abort` file (present while open: its presence at the next open means
the last run did not shut down cleanly).

RocketMQ only checks whether `abort` exists. rmqstore also writes one line into it (AbortFile.LINE):

    rmqstore-abort <boot id> <offset, 20 digits>\n

the kernel's boot id (/proc/sys/kernel/random/boot_id) at open, and the commitlog offset below which the
dispatcher has written every consume queue unit and index entry (updated at most every NOTE_INTERVAL s).
When the next open finds the abort file with the same boot id, only the process died (SIGKILL, a crash):
the page cache still holds everything it wrote, so recovery keeps the index files newer than the
checkpoint and re-dispatches from that offset instead of the checkpoint's file (recovery.recover_store).
A failed flush clears the boot id (`distrust`): after an fsync error the kernel may drop dirty pages, so
the next open recovers as after a power loss. An empty abort file (RocketMQ's) means the same.
"""
from __future__ import annotations

import errno
import logging
import fcntl
import os
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..conf.config_file import check_file_or_missing
from ...errors import StoreLockedError

log = logging.getLogger(__name__)

_held: set[str] = set()      # POSIX locks are per process: also refuse a second open inside this one
_held_lock = threading.Lock()
_dir_fds: set[int] = set()   # directory fds holding a flock: a forked child closes its copies (below)


def _close_dir_fds_in_child() -> None:
    """After fork: the child's copies of the directory fds would keep the flock alive after the parent
    released it (flock belongs to the open file, shared by both). Closing a copy releases nothing."""
    for fd in list(_dir_fds):
        try:
            os.close(fd)
        except OSError:
            pass
    _dir_fds.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_dir_fds_in_child)


class StoreLock:
    """The store's lock: RocketMQ's POSIX lock on byte 0 of `lock` (what RocketMQ checks), and a flock on
    the store directory itself. The directory lock holds even when `lock` is unlinked or replaced while
    the store is open (a second process would create and lock a new `lock` file): a second writer is
    refused either way, with StoreLockedError."""

    def __init__(self, store_dir: str | Path):
        self.store_dir = Path(store_dir)
        self.path = self.store_dir / "lock"
        self._fd: int | None = None
        self._dir_fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise StoreLockedError at once (never waits); touches no byte of the store.
        A directory where the lock file belongs: CorruptStoreError naming it."""
        key = str(self.store_dir.resolve())
        with _held_lock:
            if key in _held:
                err = StoreLockedError(str(self.store_dir))
                err.args = (f"store {self.store_dir} is already open in this process (pid {os.getpid()}); "
                            "close it before opening it again",)
                raise err
            check_file_or_missing(self.path, "lock file")
            dir_fd = self._lock_directory()
            try:
                fd = self._lock_file()
            except BaseException:
                self._unlock_directory(dir_fd)
                raise
            _held.add(key)
            self._key = key
            self._fd = fd
            self._dir_fd = dir_fd

    def _lock_directory(self) -> int | None:
        """flock the store directory (None where the filesystem cannot: the lock file alone then)."""
        try:
            dfd = os.open(self.store_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            log.warning("%s: cannot open the store directory to lock it (%s): only the lock file guards it",
                        self.store_dir, e.strerror)
            return None
        try:
            fcntl.flock(dfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(dfd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                holder = _lock_holder_of(self.path)
                raise self._locked(holder, "the store directory is locked") from None
            log.warning("%s: cannot flock the store directory (%s): only the lock file guards it",
                        self.store_dir, e.strerror)
            return None
        _dir_fds.add(dfd)
        return dfd

    def _lock_file(self) -> int:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        except OSError as e:
            holder = _lock_holder(fd)
            os.close(fd)
            if e.errno in (errno.EACCES, errno.EAGAIN):
                raise self._locked(holder) from None
            raise
        return fd

    def _locked(self, holder: int | None, why: str = "") -> StoreLockedError:
        err = StoreLockedError(str(self.store_dir))
        msg = err.args[0]
        if holder:
            msg = msg.replace("by another process", f"by another process (pid {holder})", 1)
        if why:
            msg = f"{msg} ({why})"
        err.args = (msg,)
        return err

    @staticmethod
    def _unlock_directory(dfd: int | None) -> None:
        """Unlock and close a directory fd this process holds (in a forked child it was closed already)."""
        if dfd is None or dfd not in _dir_fds:
            return
        _dir_fds.discard(dfd)
        try:
            fcntl.flock(dfd, fcntl.LOCK_UN)
        except OSError:
            pass
        finally:
            os.close(dfd)

    def release(self) -> None:
        if self._fd is not None:
            with _held_lock:
                try:
                    fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, 0)
                finally:
                    os.close(self._fd)
                    self._fd = None
                    dfd, self._dir_fd = self._dir_fd, None
                    try:
                        self._unlock_directory(dfd)
                    finally:
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


def _lock_holder_of(path: Path) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _lock_holder(fd)
    finally:
        os.close(fd)


def boot_id() -> str | None:
    """The running kernel's boot id (Linux), None where there is none."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            raw = f.read(64).strip().decode("ascii")
    except (OSError, UnicodeDecodeError):
        return None
    return raw if len(raw) == 36 and " " not in raw else None


@dataclass(frozen=True)
class CrashNote:
    """What an abort file left by a run of this boot says (AbortFile.read_note)."""
    boot_id: str
    dispatched: int      # every consume queue unit and index entry below this commitlog offset was written


class AbortFile:
    LINE = "rmqstore-abort {boot} {offset:020d}\n"
    NOTE_INTERVAL = 0.01            # seconds between two notes of the dispatched offset
    _UNTRUSTED = "-" * 36

    def __init__(self, store_dir: str | Path):
        self.path = Path(store_dir) / "abort"
        self._fd: int | None = None
        self._boot = self._UNTRUSTED
        self._last_note = 0.0
        self._noting = False
        self._lock = threading.Lock()

    def exists(self) -> bool:
        """Whether the file is there (a directory or other non-file there: CorruptStoreError naming it)."""
        return check_file_or_missing(self.path, "abort file")

    def read_note(self) -> CrashNote | None:
        """The note of the run that left this abort file, if that run was in this boot and trusted its
        page cache to the end; None otherwise (no file, RocketMQ's empty file, another boot, a failed flush)."""
        try:
            with open(self.path, "rb") as f:
                parts = f.read(128).decode("ascii", "replace").split()
        except OSError:
            return None
        now = boot_id()
        if len(parts) != 3 or parts[0] != "rmqstore-abort" or now is None or parts[1] != now \
                or not parts[2].isdigit():
            return None
        return CrashNote(parts[1], int(parts[2]))

    def create(self, dispatched: int = 0) -> None:
        """Create (or keep) the file, emptied, then note this boot and the dispatched offset, and fsync it.
        Emptied first (that needs no room): when the note cannot be written (a full disk) the file stays
        empty, which the next open reads as "do not trust the page cache", never an older run's note."""
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        self._fd = fd
        os.ftruncate(fd, 0)
        self._boot = boot_id() or self._UNTRUSTED
        self._noting = True
        try:
            os.pwrite(fd, self._line(dispatched), 0)
        except OSError as e:
            self._stop_noting(e)
        try:
            os.fsync(fd)
        except OSError as e:
            self._stop_noting(e)

    def _line(self, offset: int) -> bytes:
        return self.LINE.format(boot=self._boot, offset=max(offset, 0)).encode()

    def _stop_noting(self, e: OSError) -> None:
        """A note could not be written: empty the file (untrusted) and write no more notes."""
        self._noting = False
        try:
            os.ftruncate(self._fd, 0)
        except OSError:
            pass
        log.warning("%s: cannot write the crash note (%s): the next open after a crash recovers as after a "
                    "power loss", self.path, e.strerror)

    def note_dispatched(self, offset: int) -> None:
        """Record that everything below offset is dispatched (throttled; the dispatcher calls it)."""
        now = time.monotonic()
        if now - self._last_note < self.NOTE_INTERVAL or not self._noting:
            return
        self._last_note = now
        with self._lock:
            if self._fd is not None and self._noting:
                try:
                    os.pwrite(self._fd, self._line(offset), 0)
                except OSError as e:
                    self._stop_noting(e)

    def distrust(self) -> None:
        """A flush failed: the next open must not trust the page cache (see module docstring)."""
        with self._lock:
            self._boot = self._UNTRUSTED
            self._noting = False
            if self._fd is not None:
                try:
                    os.ftruncate(self._fd, 0)
                    os.pwrite(self._fd, self._line(0), 0)
                    os.fsync(self._fd)
                except OSError:
                    pass

    def remove(self) -> None:
        self.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
