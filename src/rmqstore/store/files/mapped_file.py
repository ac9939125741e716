"""MappedFile and MappedFileQueue: the fixed-size mmap'ed files under CommitLog, ConsumeQueue and IndexFile.

A MappedFile is named by the 20-digit offset of its first byte in the queue of files (IndexFiles by a
timestamp). Three positions move forward in it:

    0 <= flushed_position <= committed_position <= wrote_position <= file_size

`wrote` is where the next append goes; `committed` is what readers may see (equal to `wrote` unless a
transient write buffer is used: then appends go to an off-file buffer and `commit()` copies them into
the file); `flushed` is what msync has put on disk.

Appends go into the file with pwrite(2), reads come from the mapping: both are the same page cache, and
msync of a range syncs the file's pages in that range however they were dirtied. Writing through the
mapping would fault every fresh page of a sparse file in one at a time (13x slower than pwrite for a
batch here, see BENCHMARKS.md) and turns ENOSPC into SIGBUS; pwrite gets an OSError that names it. A MappedFileQueue is the ordered list of files of
one directory; the first file may have been deleted by cleanup, so offsets need not start at 0.
"""
from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
import time
from pathlib import Path

import numpy as np

from ...errors import CorruptStoreError

log = logging.getLogger(__name__)

OS_PAGE_SIZE = 4096
FILE_NAME_DIGITS = 20


def offset_to_file_name(offset: int) -> str:
    return f"{offset:0{FILE_NAME_DIGITS}d}"


_ZERO_CHUNK = bytes(1 << 20)


def _zero_tail(mf: "MappedFile", pos: int) -> None:
    """Zero a file from pos until a whole chunk is already zero (the written part ends before it); read
    and written through the file descriptor (MappedFile.has_data: no hole is faulted into the mapping)."""
    size = mf.file_size
    while pos < size:
        end = min(size, pos + len(_ZERO_CHUNK))
        if not mf.has_data(pos, end):
            return
        mf.zero_data(pos, end)
        pos = end


def _holds_no_data(path: Path) -> bool:
    """True if the file is all zero bytes (created, never written)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return not _fd_has_data(fd, 0, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def _fd_has_data(fd: int, pos: int, end: int) -> bool:
    """Any non-zero byte in [pos, end) of the file: read with pread, holes skipped (SEEK_DATA), never
    through a mapping (MappedFile.data_end says why)."""
    while pos < end:
        try:
            pos = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:      # only holes after pos
                return False
        except AttributeError:              # pragma: no cover - no SEEK_DATA here: read it all
            pass
        if pos >= end:
            return False
        chunk = os.pread(fd, min(len(_ZERO_CHUNK), end - pos), pos)
        if not chunk:
            return False
        if chunk != _ZERO_CHUNK[:len(chunk)]:
            return True
        pos += len(chunk)
    return False


def _open_new(path: Path, file_size: int) -> int | None:
    """A file that does not exist yet, created whole: sized under a hidden temporary name and renamed into
    place, so that no reader (`rmqstore check` on a live store, a Spark task) ever sees it short or empty.
    None when the file exists already. A stale temporary (a crash between create and rename) is removed
    first; the new one is created exclusively and never through a link (a link planted at the temporary
    name would have had its target truncated and taken for the store's file)."""
    if os.path.lexists(path):
        return None
    tmp = path.with_name(f".{path.name}.new")
    try:
        os.unlink(tmp)                  # a link is removed, never followed; a directory there raises
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.ftruncate(fd, file_size)
        os.rename(tmp, path)
    except OSError:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    return fd


def half_made_name(name: str) -> bool:
    """Whether name is that of a temporary of _open_new: `.NAME.new`, NAME a store file's (20 ASCII digits,
    or an index file's 17)."""
    digits = name[1:-4]
    return name.startswith(".") and name.endswith(".new") and len(digits) in (17, 20) and digits.isascii() \
        and digits.isdigit()


def half_made(path: Path) -> bool:
    """Whether path is a temporary of _open_new (created whole, then renamed to NAME): such a name, a regular
    file, not a link."""
    return half_made_name(path.name) and path.is_file() and not path.is_symlink()


def remove_half_made(directory: Path) -> list[str]:
    """Remove the temporaries of _open_new a crash left between create and rename (half_made), saying so;
    their names. Left there, RocketMQ could not load the directory (its load takes every file: a wrong size
    refuses the store, a right one is not an offset)."""
    removed = []
    for name in os.listdir(directory):
        p = directory / name
        if half_made(p):
            p.unlink()
            log.warning("%s: removed %s, a file a crash left half made", directory, name)
            removed.append(name)
    return removed


class MappedFile:
    """One fixed-size file mapped into memory."""

    def __init__(self, path: str | os.PathLike, file_size: int, *, file_from_offset: int | None = None,
                 use_write_buffer: bool = False, create: bool = True):
        self.path = Path(path)
        self.file_size = file_size
        self.file_from_offset = int(self.path.name) if file_from_offset is None else file_from_offset
        self.first_create_in_queue = False
        self.store_timestamp = 0
        try:
            fd = _open_new(self.path, file_size) if create else None
        except OSError as e:            # nothing was there: a failure to create (a full disk, ...)
            raise OSError(e.errno, f"{e.filename or self.path}: cannot create {self.path.name}: "
                                   f"{e.strerror or e}") from e
        try:
            if fd is None:              # the store's own file, never one a link points at (outside the store)
                fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT if create else 0),
                             0o644)
        except OSError as e:
            why = "a symbolic link, not the store's file" if e.errno == errno.ELOOP else e.strerror
            raise CorruptStoreError(str(self.path), 0, f"cannot open: {why}") from e
        try:
            actual = os.fstat(fd).st_size
            if actual == 0 and create:
                os.ftruncate(fd, file_size)
            elif actual != file_size:
                raise CorruptStoreError(str(self.path), actual,
                                        f"file size {actual} does not match the configured size {file_size}")
            self._mm = mmap.mmap(fd, file_size)
        except OSError as e:
            os.close(fd)
            raise CorruptStoreError(str(self.path), 0, f"cannot map {file_size} bytes: {e.strerror}") from e
        self._fd = fd       # appends are pwrite()s to it (module docstring)
        self._buffer = bytearray(file_size) if use_write_buffer else None
        self.wrote_position = 0
        self.committed_position = 0
        self.flushed_position = 0
        self._closed = False

    # --- positions ------------------------------------------------------------------------------
    @property
    def read_position(self) -> int:
        """What readers may see: committed data when a write buffer is in use, else all that was written."""
        return self.committed_position if self._buffer is not None else self.wrote_position

    def set_positions(self, pos: int) -> None:
        self.wrote_position = self.committed_position = self.flushed_position = pos

    @property
    def is_full(self) -> bool:
        return self.wrote_position >= self.file_size

    @property
    def free_space(self) -> int:
        return self.file_size - self.wrote_position

    @property
    def mm(self) -> mmap.mmap:
        return self._mm

    # --- writing --------------------------------------------------------------------------------
    def append(self, data) -> bool:
        """Append bytes at wrote_position; False (nothing written) when they do not fit."""
        pos = self.wrote_position
        end = pos + len(data)
        if end > self.file_size:
            return False
        if self._buffer is not None:
            self._buffer[pos:end] = data
        else:
            self._pwrite(pos, data)
        self.wrote_position = end
        return True

    def write_at(self, pos: int, data) -> None:
        """Write bytes at a position at or beyond wrote_position and move wrote_position past them."""
        end = pos + len(data)
        if end > self.file_size:
            raise ValueError(f"{self.path}: write of {len(data)} bytes at {pos} past the file's end")
        if self._buffer is not None:
            self._buffer[pos:end] = data
        else:
            self._pwrite(pos, data)
        self.wrote_position = max(self.wrote_position, end)

    def data_end(self) -> int:
        """Where the file's first hole begins (lseek SEEK_HOLE; file_size where the filesystem does not
        tell): every byte past it reads as zero. Reading a hole through the mapping costs a page fault and
        on tmpfs allocates a page, a SIGBUS when the tmpfs is full: scans stop here."""
        try:
            return min(os.lseek(self._fd, 0, os.SEEK_HOLE), self.file_size)
        except (OSError, AttributeError):
            return self.file_size

    def has_data(self, pos: int, end: int) -> bool:
        """Any non-zero byte in [pos, end): read with pread, holes skipped, never through the mapping (see
        data_end)."""
        return _fd_has_data(self._fd, pos, min(end, self.file_size))

    def zero_data(self, pos: int, end: int) -> None:
        """Write zeros over the data in [pos, end), holes left alone (they read as zeros already, and
        writing them would need room the disk may not have)."""
        end = min(end, self.file_size)
        fd = self._fd
        while pos < end:
            try:
                pos = os.lseek(fd, pos, os.SEEK_DATA)
                hole = os.lseek(fd, pos, os.SEEK_HOLE)
            except OSError as e:
                if e.errno == errno.ENXIO:
                    return
                hole = end
            stop = min(hole, end)
            while pos < stop:
                n = min(len(_ZERO_CHUNK), stop - pos)
                self._pwrite(pos, _ZERO_CHUNK[:n])
                pos += n

    def pwrite(self, pos: int, data) -> None:
        """Write data at pos through the file descriptor, positions untouched (files written at random
        places, the index): a full disk is an OSError (ENOSPC) here, where a store through the mapping
        into a hole would be a SIGBUS."""
        self._pwrite(pos, data)

    def reserve(self, length: int) -> None:
        """Allocate the file's first length bytes on disk (posix_fallocate), so that stores through the
        mapping there never meet a full disk (SIGBUS); OSError (ENOSPC) when there is no room."""
        os.posix_fallocate(self._fd, 0, length)

    def _pwrite(self, pos: int, data) -> None:
        """All of data into the file at pos (an OSError, e.g. ENOSPC, propagates)."""
        n = os.pwrite(self._fd, data, pos)
        while n < len(data):        # a short write: only when the disk fills up or a signal interrupts
            data = memoryview(data)[n:]
            pos += n
            n = os.pwrite(self._fd, data, pos)

    def commit(self, least_pages: int = 0) -> int:
        """Copy the write buffer's new bytes into the mapping (no-op without a buffer)."""
        if self._buffer is None:
            self.committed_position = self.wrote_position
            return self.committed_position
        start, end = self.committed_position, self.wrote_position
        if end > start and self._able(start, end, least_pages):
            self._pwrite(start, memoryview(self._buffer)[start:end])
            self.committed_position = end
        return self.committed_position

    def flush(self, least_pages: int = 0) -> int:
        """msync what was committed since the last flush; returns the flushed position.

        An OSError from msync propagates and leaves flushed_position where it was.
        """
        start, end = self.flushed_position, self.read_position
        if end > start and self._able(start, end, least_pages) and not self._closed:
            # fdatasync, not mmap.flush: CPython's mmap.flush() holds the GIL through the whole msync
            # (150-250 us here), so no other thread could append meanwhile and SYNC_FLUSH group commit would
            # not batch. On Linux msync(MS_SYNC) of a shared file mapping is vfs_fsync_range(datasync) over
            # the range; fdatasync is the same over the whole file, and appends only dirty [start, end).
            try:
                os.fdatasync(self._fd)
            except OSError:
                if self._closed:        # closed under the flush (shutdown): nothing to claim
                    return self.flushed_position
                raise
            if not self._closed:        # closed meanwhile: the fd number may be another file's now
                self.flushed_position = end
        return self.flushed_position

    def _able(self, start: int, end: int, least_pages: int) -> bool:
        if end >= self.file_size:
            return True
        if least_pages > 0:
            return end // OS_PAGE_SIZE - start // OS_PAGE_SIZE >= least_pages
        return end > start

    # --- reading --------------------------------------------------------------------------------
    def read(self, pos: int, size: int) -> bytes | None:
        """Bytes [pos, pos + size) if they are all readable, else None."""
        if pos < 0 or size < 0 or pos + size > self.read_position:
            return None
        try:
            return self._mm[pos:pos + size]
        except ValueError:      # unmapped under us: cleanup deleted the file while it was being read
            return None

    def read_from(self, pos: int, limit: int | None = None) -> bytes:
        """Readable bytes from pos to the read position (at most limit of them)."""
        end = self.read_position
        if limit is not None:
            end = min(end, pos + limit)
        try:
            return self._mm[pos:end] if pos < end else b""
        except ValueError:      # unmapped under us: cleanup deleted the file while it was being read
            return b""

    # --- lifecycle ------------------------------------------------------------------------------
    def last_modified(self) -> float:
        try:
            return self.path.stat().st_mtime
        except OSError:
            return 0.0

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self._fd)
            try:
                self._mm.close()
            except BufferError:  # a reader still holds a view: the mapping goes with the last one
                log.debug("%s: mapping still exported, left to the GC", self.path)

    def destroy(self) -> None:
        self.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def __repr__(self) -> str:
        return (f"MappedFile({self.path.name}, wrote={self.wrote_position}, committed={self.committed_position}, "
                f"flushed={self.flushed_position})")


def _hole_before(fd: int, end: int) -> bool:
    """A hole somewhere in the file's first end bytes."""
    if end <= 0:
        return False
    try:
        return os.lseek(fd, 0, os.SEEK_HOLE) < end
    except (OSError, AttributeError):
        return False


def _copy_data(fd: int, mm: mmap.mmap, size: int) -> None:
    """The file's data extents (holes skipped: they stay zero) into mm, with pread."""
    pos = 0
    while pos < size:
        try:
            pos = os.lseek(fd, pos, os.SEEK_DATA)
            end = min(os.lseek(fd, pos, os.SEEK_HOLE), size)
        except OSError as e:
            if e.errno == errno.ENXIO:
                return
            end = size
        while pos < end:
            chunk = os.pread(fd, min(1 << 24, end - pos), pos)
            if not chunk:
                return
            mm[pos:pos + len(chunk)] = chunk
            pos += len(chunk)


class ReadOnlyMappedFile(MappedFile):
    """A MappedFile that never changes its file: a private copy-on-write mapping (MAP_PRIVATE). Writes
    (appends, pwrite, zeroing) land in this process's memory only; the file on disk, its size and its
    mtime stay as they are. Used to plan recovery and to serve a store read-only (recovery.plan_recovery,
    store.recovery.view): the same code runs over it as over a MappedFile, and what it changes is never written.

    A file shorter than file_size (cut short by a crash or a copy: MappedFileQueue.load extends it) reads
    as if extended with zeros: its bytes are copied into an anonymous mapping of file_size. path=None (or
    a file that does not exist) makes a new, empty file in memory (a queue file the re-dispatch creates)."""

    def __init__(self, path: str | os.PathLike, file_size: int, *, file_from_offset: int | None = None,
                 in_memory: bool = False, holes_unsafe_before: int = 0):
        """holes_unsafe_before: bytes at the file's start that callers read through the mapping regardless
        of holes (an index file's header and slots): when a hole lies there, the file's data is copied into
        an anonymous mapping instead (a hole read through a file mapping on a full tmpfs is a SIGBUS)."""
        self.path = Path(path)
        self.file_size = file_size
        self.file_from_offset = int(self.path.name) if file_from_offset is None else file_from_offset
        self.first_create_in_queue = False
        self.store_timestamp = 0
        self._buffer = None
        self.wrote_position = self.committed_position = self.flushed_position = 0
        self._closed = False
        self._fd = None
        if in_memory:
            self._size_on_disk = 0
            self._mm = mmap.mmap(-1, max(file_size, 1))
            return
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise CorruptStoreError(str(self.path), 0, f"cannot open: {e.strerror}") from e
        try:
            actual = os.fstat(fd).st_size
            if actual > file_size:
                raise CorruptStoreError(str(self.path), actual,
                                        f"file size {actual} does not match the configured size {file_size}")
            if actual == file_size and not _hole_before(fd, min(holes_unsafe_before, actual)):
                self._mm = mmap.mmap(fd, file_size, access=mmap.ACCESS_COPY)
            else:       # short (the caller decided it may be), or holes where they are read: a copy
                self._mm = mmap.mmap(-1, max(file_size, 1))
                _copy_data(fd, self._mm, actual)
        except OSError as e:
            os.close(fd)
            raise CorruptStoreError(str(self.path), 0, f"cannot map {file_size} bytes: {e.strerror}") from e
        except BaseException:
            os.close(fd)
            raise
        self._size_on_disk = actual
        self._fd = fd

    def _pwrite(self, pos: int, data) -> None:
        self._mm[pos:pos + len(data)] = data        # private: never reaches the file

    def data_end(self) -> int:
        if self._fd is None:
            return self.file_size
        return min(super().data_end(), self._size_on_disk)

    def has_data(self, pos: int, end: int) -> bool:
        if self._fd is None:
            end = min(end, self.file_size)
            return pos < end and any(self._mm[pos:end])
        return super().has_data(pos, end)

    def reserve(self, length: int) -> None:
        return None

    def flush(self, least_pages: int = 0) -> int:
        self.flushed_position = self.read_position
        return self.flushed_position

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._fd is not None:
                os.close(self._fd)
            try:
                self._mm.close()
            except BufferError:
                log.debug("%s: mapping still exported, left to the GC", self.path)

    def destroy(self) -> None:
        """Forget the file (it stays on disk)."""
        self.close()


class MappedFileQueue:
    """The ordered files of one directory, each of mapped_file_size bytes, named by starting offset."""

    def __init__(self, store_path: str | os.PathLike, mapped_file_size: int, use_write_buffer: bool = False,
                 read_only: bool = False, short_middle_as_zeros: bool = False):
        self.store_path = Path(store_path)
        self.read_only = read_only          # ReadOnlyMappedFiles: loads, cuts and appends stay in memory
        # read-only only: a file cut short before other files with data reads as zeros past its end (load)
        self.short_middle_as_zeros = read_only and short_middle_as_zeros
        self.mapped_file_size = mapped_file_size
        self.use_write_buffer = use_write_buffer
        self.files: list[MappedFile] = []   # replaced, never mutated in place: readers take a snapshot
        self.flushed_where = 0
        self.committed_where = 0
        self.store_timestamp = 0
        self.repaired: list[tuple[str, int]] = []   # (path, size found) of short last files load() extended
        self.gaps: list[tuple[int, int]] = []       # [start, end) offsets of files missing between others
        self.create_error: str | None = None        # why the last new file could not be created (None: it was)
        self.flush_failed: OSError | None = None     # the first failed flush: final (see flush)
        self._lock = threading.RLock()
        # one commit and one flush at a time (see _advance)
        self._commit_lock = threading.Lock()
        self._flush_lock = threading.Lock()

    # --- loading --------------------------------------------------------------------------------
    def load(self, extend_short_first: bool = False) -> None:
        """Map every file of the directory; all positions at the file's end, recovery sets them.
        extend_short_first: the first file may be short as well (ConsumeQueueTable.load confirmed the
        geometry from other queues' files). Read-only: a short file reads as extended, nothing changes."""
        if not self.store_path.is_dir():
            return
        if not self.read_only:
            remove_half_made(self.store_path)
        names = sorted(n for n in os.listdir(self.store_path) if n.isdigit() and len(n) == FILE_NAME_DIGITS)
        stray = [n for n in os.listdir(self.store_path) if n not in names and not n.startswith(".")]
        if stray:
            log.warning("%s: ignoring files that are not named by an offset: %s", self.store_path, stray[:5])
        for n in names:
            p = self.store_path / n
            if not p.is_file():     # a directory (or a socket, ...) named like a data file: nothing to map
                kind = "a directory" if p.is_dir() else "not a regular file"
                raise CorruptStoreError(str(p), 0, f"is {kind} where a data file belongs: move it out of "
                                        f"{self.store_path} (or restore the file) and open again")
        files = []
        self.repaired = []
        for i, n in enumerate(names):
            p = self.store_path / n
            size = p.stat().st_size
            # A short file is only repaired where the geometry is not in doubt: an empty file, or one after
            # files of the configured size. Otherwise the config is likelier wrong than the file.
            geometry_known = size == 0 or len(files) > 0 or extend_short_first
            short = size < self.mapped_file_size and geometry_known
            last_data = short and all(_holds_no_data(self.store_path / m) for m in names[i + 1:])
            if short and self.short_middle_as_zeros and not last_data:
                # a read-only commitlog (a view: dump, Spark, stats): a middle file cut short reads as zeros past
                # its end, so what it lost is a damaged range of that file (recovery and the readers report it)
                # and the later files are read; opening the store to write refuses the file (below)
                log.warning("%s: %d bytes instead of %d with data in later files (truncated?): read as zeros past "
                            "its end, what it held there is lost", p, size, self.mapped_file_size)
                self.repaired.append((str(p), size))
            elif last_data:
                # The last file with data cut short (only empty files after it): killed between creating and
                # sizing it (RocketMQ then fails to start, #9728 / PR 6903), or truncated by a copy. Its
                # missing tail is zeros; recovery keeps what is valid.
                if not self.read_only:
                    log.warning("%s: %d bytes instead of %d (cut short by a crash or a copy?): extended with "
                                "zeros, recovery keeps its valid part", p, size, self.mapped_file_size)
                    os.truncate(p, self.mapped_file_size)
                self.repaired.append((str(p), size))
            elif size != self.mapped_file_size:
                hint = ("; only the last file of a directory may be short" if files else
                        "; was the store written with another configuration (mappedFileSize..., pass its "
                        "store.conf with -c)?")
                raise CorruptStoreError(str(p), size, f"file size {size} does not match the configured size "
                                        f"{self.mapped_file_size}" + hint)
            if self.read_only:
                mf = ReadOnlyMappedFile(self.store_path / n, self.mapped_file_size)
            else:
                mf = MappedFile(self.store_path / n, self.mapped_file_size, create=False,
                                use_write_buffer=self.use_write_buffer)
            mf.set_positions(self.mapped_file_size)
            files.append(mf)
        self.gaps = []
        for a, b in zip(files, files[1:]):
            if b.file_from_offset != a.file_from_offset + self.mapped_file_size:
                # files missing in the middle: their offsets hold nothing; readers find no file there
                # (find_mapped_file_by_offset answers None), recovery reports the gap and dispatch goes on after it
                start = a.file_from_offset + self.mapped_file_size
                self.gaps.append((start, b.file_from_offset))
                log.warning("%s: gap between %s and %s: file %s missing (offsets %d..%d)", self.store_path,
                            a.path.name, b.path.name, offset_to_file_name(start), start, b.file_from_offset)
        self.files = files

    # --- lookup ---------------------------------------------------------------------------------
    @property
    def first(self) -> MappedFile | None:
        files = self.files
        return files[0] if files else None

    @property
    def last(self) -> MappedFile | None:
        files = self.files
        return files[-1] if files else None

    def get_last_mapped_file(self, start_offset: int = 0, need_create: bool = True) -> MappedFile | None:
        """The file to append to: the last one, or a new one if there is none or it is full."""
        last = self.last
        if last is not None and not last.is_full:
            return last
        if not need_create:
            return last
        with self._lock:
            last = self.last
            if last is not None and not last.is_full:
                return last
            if last is None:
                create_offset = start_offset - start_offset % self.mapped_file_size
            else:
                create_offset = last.file_from_offset + self.mapped_file_size
            if self.read_only:
                mf = ReadOnlyMappedFile(self.store_path / offset_to_file_name(create_offset),
                                        self.mapped_file_size, in_memory=True)
            else:
                path = self.store_path / offset_to_file_name(create_offset)
                try:
                    self.store_path.mkdir(parents=True, exist_ok=True)
                    mf = MappedFile(path, self.mapped_file_size, use_write_buffer=self.use_write_buffer)
                except (OSError, CorruptStoreError) as e:
                    if isinstance(e, CorruptStoreError):
                        why = str(e)
                    else:       # MappedFile's names the file in strerror; mkdir's names it in filename
                        why = e.strerror or str(e) if e.filename is None else f"{e.filename}: {e.strerror}"
                    if why != self.create_error:        # once per reason, not once per put of a full disk
                        log.error("%s", why)
                    self.create_error = why
                    return None
                self.create_error = None
            if last is None:
                mf.first_create_in_queue = True
            self.files = self.files + [mf]
            return mf

    def find_mapped_file_by_offset(self, offset: int, return_first_on_not_found: bool = False) -> MappedFile | None:
        files = self.files
        if not files:
            return None
        first = files[0]
        idx = offset // self.mapped_file_size - first.file_from_offset // self.mapped_file_size
        if 0 <= idx < len(files):
            mf = files[idx]
            if mf.file_from_offset <= offset < mf.file_from_offset + self.mapped_file_size:
                return mf
        for mf in files:  # a gap in the names: search
            if mf.file_from_offset <= offset < mf.file_from_offset + self.mapped_file_size:
                return mf
        return first if return_first_on_not_found else None

    def get_mapped_file_by_time(self, timestamp_ms: float) -> MappedFile | None:
        files = self.files
        for mf in files:
            if mf.last_modified() * 1000 >= timestamp_ms:
                return mf
        return files[-1] if files else None

    def get_min_offset(self) -> int:
        first = self.first
        return first.file_from_offset if first else -1

    def get_max_offset(self) -> int:
        last = self.last
        return last.file_from_offset + last.read_position if last else 0

    def get_max_wrote_position(self) -> int:
        last = self.last
        return last.file_from_offset + last.wrote_position if last else 0

    def how_much_fall_behind(self) -> int:
        return self.get_max_offset() - self.flushed_where if self.files else 0

    # --- writing --------------------------------------------------------------------------------
    def flush(self, least_pages: int = 0) -> bool:
        """Flush from flushed_where on, file after file while they are full; True if nothing was left to
        flush. A failed flush is final, whoever flushes (a flush service, the group commit, flush_all): Linux
        reports a writeback error once and marks the pages clean, so a later fdatasync would "succeed" over
        data that never reached the disk; every later flush raises at once, nothing synced, flushed_where
        where the last good flush left it."""
        with self._flush_lock:
            failed = self.flush_failed
            if failed is not None:
                raise OSError(failed.errno, f"{self.store_path}: an earlier flush failed "
                                            f"({failed.strerror or failed}): nothing is flushed again")
            try:
                return self._advance("flushed_where", MappedFile.flush, least_pages)
            except OSError as e:
                self.flush_failed = e
                raise

    def commit(self, least_pages: int = 0) -> bool:
        """Commit (write buffer to file) from committed_where on, like flush."""
        with self._commit_lock:
            return self._advance("committed_where", MappedFile.commit, least_pages)

    def _advance(self, attr: str, step, least_pages: int) -> bool:
        """Step (commit or flush) the files from the position attr on; the caller holds that step's lock. One
        step of a kind at a time: one that read the positions before another one set them would set them back
        (a slower flush finishing after a faster one: flushed_where below bytes already on disk), and a
        SYNC_FLUSH round reading it would answer FLUSH_DISK_TIMEOUT for them (CommitRealTimeService, the group
        commit, flush_all from another thread)."""
        done = True
        while True:
            at = getattr(self, attr)
            mf = self.find_mapped_file_by_offset(at, at == 0)
            if mf is None:
                return done
            pos = step(mf, least_pages)
            where = mf.file_from_offset + pos
            done = done and where == at
            setattr(self, attr, where)
            if pos != mf.file_size or self.last is mf:  # a full file that is not the last: go on
                return done

    def create_failure(self) -> str:
        """Why the next file could not be made (the answer of a put or write that needed it)."""
        return self.create_error or f"{self.store_path}: cannot create the next file"

    def truncate_dirty_files(self, offset: int) -> None:
        """Forget everything at and after offset: later files deleted, the file holding it cut there."""
        with self._lock:
            keep = []
            for mf in self.files:
                end = mf.file_from_offset + self.mapped_file_size
                if end <= offset:
                    keep.append(mf)
                elif mf.file_from_offset <= offset:
                    pos = offset - mf.file_from_offset
                    mf.set_positions(pos)   # first: a reader of the open store (read_from) stops at pos
                    _zero_tail(mf, pos)     # before the bytes after it are zeroed
                    keep.append(mf)
                else:
                    log.info("truncate dirty file %s", mf.path)
                    mf.destroy()
            self.files = keep
            self.flushed_where = min(self.flushed_where, offset)
            self.committed_where = min(self.committed_where, offset)

    def truncate_to(self, offset: int) -> None:
        """Recovery's cut (RecoveryPlan): everything at and after offset goes (later files deleted, the
        file holding it zeroed from there), every position set there (LogSegment.truncateTo)."""
        self.truncate_dirty_files(offset)
        self.set_positions_from(offset)

    def set_positions_from(self, offset: int) -> None:
        """After recovery: every file up to offset complete, the one holding offset positioned there."""
        for mf in self.files:
            if mf.file_from_offset + self.mapped_file_size <= offset:
                mf.set_positions(self.mapped_file_size)
            elif mf.file_from_offset <= offset:
                mf.set_positions(offset - mf.file_from_offset)
        self.flushed_where = self.committed_where = offset

    def delete_last_mapped_file(self) -> None:
        with self._lock:
            if self.files:
                last = self.files[-1]
                self.files = self.files[:-1]
                last.destroy()

    def delete_files(self, victims: list[MappedFile]) -> int:
        """Remove these files (they must be a prefix of the queue); returns how many went."""
        with self._lock:
            ids = {id(v) for v in victims}
            self.files = [mf for mf in self.files if id(mf) not in ids]
        for v in victims:
            log.info("delete %s", v.path)
            v.destroy()
        return len(victims)

    def delete_expired_by_time(self, expired_ms: float, max_files: int, force: bool, now_ms: float | None = None,
                               keep_last: bool = True) -> int:
        now_ms = time.time() * 1000 if now_ms is None else now_ms
        files = self.files
        candidates = files[:-1] if keep_last else files
        victims = []
        for mf in candidates:
            if len(victims) >= max_files:
                break
            if force or now_ms >= mf.last_modified() * 1000 + expired_ms:
                victims.append(mf)
            else:
                break
        return self.delete_files(victims)

    def shutdown(self) -> None:
        for mf in self.files:
            mf.close()

    def destroy(self) -> None:
        with self._lock:
            for mf in self.files:
                mf.destroy()
            self.files = []
            self.flushed_where = self.committed_where = 0
        if self.read_only:
            return
        try:
            self.store_path.rmdir()
        except OSError:
            pass


# --- read-only mappings (readers that never write or lock: StoreView, Spark, check) -----------------------
def map_read_only(path: str) -> mmap.mmap | None:
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        return mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else None
    finally:
        os.close(fd)


class FileCache:
    """Read-only mappings of commitlog files, opened on first use (one per file and partition)."""

    def __init__(self):
        self._maps: dict[str, tuple[mmap.mmap | None, np.ndarray]] = {}

    def get(self, path: str) -> tuple[mmap.mmap | None, np.ndarray]:
        got = self._maps.get(path)
        if got is None:
            mm = map_read_only(path)
            arr = np.frombuffer(mm, dtype=np.uint8) if mm is not None else np.empty(0, dtype=np.uint8)
            got = self._maps[path] = (mm, arr)
        return got

    def close(self) -> None:
        maps, self._maps = self._maps, {}
        for mm, arr in maps.values():
            del arr
            if mm is not None:
                try:
                    mm.close()
                except BufferError:    # a batch still points into it: the GC unmaps it
                    pass
