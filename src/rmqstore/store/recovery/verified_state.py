"""VerifiedState: what the store vouched for when it last closed cleanly (or last noted while running), per
file, so that the next open re-checks only what changed since (recovery's fast open, open_trust.py).

The record is the file `verified` in the store's root, text, written whole to `verified.tmp`, fsynced and
renamed over the old one:

    rmqstore-verified 1 <crc32 of the lines below, 8 hex digits>\\n
    <path> <size> <mtime_ns> <ctime_ns> <inode> <begin> <end> <crc>\\n        one line per file

path: the file's path under the store's root (commitlog/NAME, consumequeue/TOPIC/QUEUE/NAME, index/NAME;
a path holds no whitespace: topics and file names never do; a line that does not parse voids the record);
size, mtime_ns, ctime_ns, inode: its stat then; [begin, end): the bytes of it that hold verified data, the
part that only grows (a commitlog file's records and a consume queue file's units from byte 0, an index
file's entries after its header and hash slots); crc: for the files still being appended to (the last of
the commitlog, of each consume queue and of the index), the crc32 of those bytes, else -1.

What "verified" means: the bytes were written by this store (records by the put path, units by the
dispatcher, index entries by the index service) or checked by an open of it; a file with damage that was
found and not repaired is left out. A file matches its line exactly when its stat is the same: its inode,
size, mtime and ctime. A ctime cannot be set from user space, so a file copied in (another inode, another
ctime), cut short, rewritten, or touched back to an old mtime after a change never matches exactly. A
file appended to since (by a run that then crashed) matches up to `end` when the crc32 of [begin, end) is
the recorded one: only what follows is checked. A running store notes its files being written by their
crc only (inode 0: a write in the same clock tick as the stat leaves the mtime as it was).

The record is used only when the last run shut down cleanly or only its process died in this boot
(lock.AbortFile's note): after a power cut a file's stat on disk may predate data the kernel had already
written back, so recovery then ignores the record (RocketMQ's rules apply).

Pure parts: encode / decode (a damaged or foreign record decodes as empty: nothing trusted),
FileEntry.matches. I/O: load, save, discard, matching, vouched.
"""
from __future__ import annotations

import logging
import mmap
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, NamedTuple

from ..format import codec

log = logging.getLogger(__name__)

RECORD_NAME = "verified"
_MAGIC = "rmqstore-verified"
_VERSION = "1"


@dataclass(frozen=True)
class FileEntry:
    """One file as it was vouched for: its stat then, the bytes [begin, end) holding verified data, and for a
    file being appended to the crc32 of those bytes (-1: none)."""
    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int                        # 0: match by crc only
    begin: int
    end: int
    crc: int = -1

    def matches(self, st: os.stat_result | None) -> bool:
        """The file is the one vouched for, unchanged: same inode, size, mtime and ctime (module docstring)."""
        return st is not None and (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) == \
            (self.ino, self.size, self.mtime_ns, self.ctime_ns)


@dataclass(frozen=True)
class VerifiedState:
    files: Mapping[str, FileEntry]

    def __len__(self) -> int:
        return len(self.files)


EMPTY = VerifiedState({})


class Vouched(NamedTuple):
    """A file matching its entry now (matching): the verified bytes [begin, end); exact: unchanged since."""
    begin: int
    end: int
    exact: bool


# --- the codec (pure) ---------------------------------------------------------------------------------
def encode(state: VerifiedState) -> bytes:
    body = "".join(f"{p} {e.size} {e.mtime_ns} {e.ctime_ns} {e.ino} {e.begin} {e.end} {e.crc}\n"
                   for p, e in sorted(state.files.items())).encode()
    return f"{_MAGIC} {_VERSION} {zlib.crc32(body):08x}\n".encode() + body


def decode(raw: bytes) -> tuple[VerifiedState, str | None]:
    """(the state, None), or (EMPTY, why) when raw is not a whole record of this version."""
    head, sep, body = raw.partition(b"\n")
    parts = head.split()
    if not sep or len(parts) != 3 or parts[0].decode(errors="replace") != _MAGIC:
        return EMPTY, "not a verified-state record"
    if parts[1].decode(errors="replace") != _VERSION:
        return EMPTY, f"version {parts[1].decode(errors='replace')} (this store reads version {_VERSION})"
    if parts[2] != f"{zlib.crc32(body):08x}".encode():
        return EMPTY, "its checksum does not match (torn or changed)"
    files = {}
    try:
        for line in body.decode().splitlines():
            p, *nums = line.split(" ")
            size, mtime, ctime, ino, begin, end, crc = (int(x) for x in nums)
            if not p or min(size, ino, begin) < 0 or not begin <= end <= size or not -1 <= crc < 1 << 32 \
                    or (ino == 0 and crc < 0):
                return EMPTY, f"impossible line {line!r}"
            files[p] = FileEntry(size, mtime, ctime, ino, begin, end, crc)
    except ValueError:
        return EMPTY, "a line does not parse"
    return VerifiedState(files), None


# --- the file -----------------------------------------------------------------------------------------
def load(root: str | Path) -> VerifiedState:
    """The record of the store at root; EMPTY when there is none or it cannot be used (a warning says why:
    the open then checks as if no record existed)."""
    path = Path(root) / RECORD_NAME
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return EMPTY
    except OSError as e:
        log.warning("%s: cannot read (%s): every file is checked at open", path, e.strerror)
        return EMPTY
    state, why = decode(raw)
    if why is not None:
        log.warning("%s: %s: every file is checked at open", path, why)
    return state


def save(root: str | Path, state: VerifiedState) -> None:
    """Write the record whole (temp file, fsync, rename, directory fsync). An OSError leaves the old record
    or none, never a torn one (decode refuses a torn one anyway)."""
    root = Path(root)
    tmp = root / (RECORD_NAME + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        data = memoryview(encode(state))
        while data:
            data = data[os.write(fd, data):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, root / RECORD_NAME)
    dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def discard(root: str | Path) -> None:
    """Remove the record (and a temp file a crash left): the next open checks every file."""
    for name in (RECORD_NAME, RECORD_NAME + ".tmp"):
        try:
            os.unlink(Path(root) / name)
        except FileNotFoundError:
            pass


def rel_path(root: Path, path) -> str:
    """A store file's path as the record names it: under the root, else absolute."""
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return str(path)


def _stat(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def matching(root: str | Path, state: VerifiedState) -> dict[str, Vouched]:
    """The files of the record that match it now (module docstring): exactly by their stat, else by the
    crc32 of their verified bytes."""
    root = Path(root)
    out = {}
    for p, e in state.files.items():
        st = _stat(root / p)
        if e.matches(st):
            out[p] = Vouched(e.begin, e.end, True)
        elif e.crc >= 0 and st is not None and st.st_size >= e.end and \
                range_crc(root / p, e.begin, e.end) == e.crc:
            out[p] = Vouched(e.begin, e.end, False)
    return out


CRC_CHUNK = 64 << 20


def range_crc(path: Path, begin: int, end: int) -> int | None:
    """crc32 of the file's bytes [begin, end) (None: unreadable or shorter), read through a mapping
    CRC_CHUNK bytes at a time, each chunk's pages let go once read (memory stays bounded)."""
    from ..format.scanner import crc32
    if end <= begin:
        return 0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size < end:
            return None
        mm = mmap.mmap(fd, end, access=mmap.ACCESS_READ)
    except OSError:
        return None
    finally:
        os.close(fd)
    mv = memoryview(mm)
    crc = 0
    try:
        for a in range(begin, end, CRC_CHUNK):
            b = min(a + CRC_CHUNK, end)
            crc = crc32(mv[a:b], crc)
            page = a - a % mmap.PAGESIZE
            mm.madvise(mmap.MADV_DONTNEED, page, b - page)
    finally:
        mv.release()
        mm.close()
    return crc & 0xFFFFFFFF


class _File(NamedTuple):
    rel: str
    begin: int
    end: int
    digest: bool        # with the crc32 of [begin, end)
    crc_only: bool      # being written: matched by its crc only


def _entries(root: Path, files: Iterable[_File]) -> dict[str, FileEntry]:
    """The entries of files, stat'ed now (files gone meanwhile are left out; an end past the file's size is
    its size)."""
    out = {}
    for f in files:
        st = _stat(root / f.rel)
        if st is None:
            continue
        end = max(min(f.end, st.st_size), f.begin)
        crc = range_crc(root / f.rel, f.begin, end) if f.digest else None
        if f.crc_only and crc is None:
            continue
        out[f.rel] = FileEntry(st.st_size, st.st_mtime_ns, st.st_ctime_ns, 0 if f.crc_only else st.st_ino,
                               f.begin, end, -1 if crc is None else crc)
    return out


def _index_entries_end(path: Path, entries_base: int) -> int | None:
    """Where the entries an index file's header counts end (its header read from the file)."""
    try:
        with open(path, "rb") as f:
            head = f.read(codec.INDEX_HEADER_SIZE)
    except OSError:
        return None
    if len(head) < codec.INDEX_HEADER_SIZE:
        return None
    count = codec.INDEX_HEADER.unpack(head)[5]
    return entries_base + max(count, 1) * codec.INDEX_ENTRY_SIZE


def vouched(root: str | Path, commit_log, consume_queues, index_service, *, live: bool = False,
            exclude: Iterable[str] = ()) -> VerifiedState:
    """The record of the store's files as they are now: every commitlog, consume queue and index file with
    its verified bytes (the files still appended to with their crc32), but those under `exclude` (paths as
    rel_path names them: files with damage found and not repaired). live: the store is running: the
    files it may still write are noted by their crc only."""
    root = Path(root)
    skip = set(exclude)
    todo: list[_File] = []

    def add(files, end_of) -> None:
        files = list(files)
        for i, mf in enumerate(files):
            r = rel_path(root, mf.path)
            end = end_of(mf)
            appended = i == len(files) - 1 or end < mf.file_size     # may still be written
            if r not in skip:
                todo.append(_File(r, 0, end, appended, appended and live))

    add(commit_log.queue.files, lambda mf: mf.read_position)
    for cq in consume_queues:
        add(cq.queue.files, lambda mf: mf.read_position)
    # index files from the directory (a closed IndexService has let go of its list); its entries only grow
    d = Path(index_service.store_path)
    try:
        names = sorted(n for n in os.listdir(d) if n.isdigit())
    except OSError:
        names = []
    base = codec.INDEX_HEADER_SIZE + index_service.hash_slot_num * codec.INDEX_HASH_SLOT_SIZE
    for i, n in enumerate(names):
        r = rel_path(root, d / n)
        end = _index_entries_end(d / n, base)
        newest = i == len(names) - 1
        if r not in skip and end is not None:
            todo.append(_File(r, base, end, newest, newest and live))
    return VerifiedState(_entries(root, todo))
