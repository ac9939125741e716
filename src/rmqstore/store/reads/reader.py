"""Read-only scanning of a commitlog: decode its records in physical order without writing anything.

Works on stores nobody may write to (the golden sets are read-only directories): files are opened
O_RDONLY and mapped with ACCESS_READ, one whole file at a time, so a scan costs no syscall per record.

    with CommitLogReader("/path/to/store") as r:        # a store dir (with commitlog/) or a commitlog dir
        for m in r.messages(from_offset=0, limit=10):   # MessageExt, in physical order
            print(m.commit_log_offset, m.topic)

Rules of the scan (the same ones RocketMQ's recovery follows):

* files are the 20-digit names of the directory, in name order; a file's name is the commitlog offset
  of its first byte;
* a file is read to its actual size, whatever the configured size is (a truncated file, such as the
  8,192-byte rocketmq-sample-commitlog, is read as far as it goes);
* an END_OF_FILE blank record ends a file, the scan goes on at the next file;
* a zero TOTALSIZE (or nothing but zeros) ends the data: the scan stops there, later files included;
* anything else that is not a whole, valid record (bad magic code, sizes that do not add up, a record
  running past the end of the file, a bad body CRC when asked to check) raises CorruptStoreError
  naming the file and the offset in that file. Records before it have been yielded already.
"""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..format import codec, scanner
from ..format.scanner import Outcome
from ..conf.config import StoreConfig
from ...errors import CorruptStoreError
from ..format.message import MessageExt

__all__ = ["CommitLogFile", "CommitLogReader", "RecordInfo", "ScanSummary", "find_commitlog_dir",
           "list_commitlog_files", "KIND_MESSAGE", "KIND_BLANK"]

KIND_MESSAGE = Outcome.MESSAGE         # the record kinds a scan yields (old names, kept for callers)
KIND_BLANK = Outcome.END_OF_FILE
_FILE_NAME_DIGITS = 20
_Q = codec.struct.Struct(">q")
_I = codec.struct.Struct(">i")
_II = codec.struct.Struct(">iI")


def _is_segment_name(name: str) -> bool:
    return len(name) == _FILE_NAME_DIGITS and name.isdigit()


def find_commitlog_dir(path: str | os.PathLike) -> Path:
    """The commitlog directory of `path`: `path/commitlog` for a store directory, else `path` itself
    when it holds commitlog files (20-digit names). Raises FileNotFoundError / NotADirectoryError
    (with the path) when `path` is neither."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(2, "no such store directory", str(p))
    if not p.is_dir():
        raise NotADirectoryError(20, "not a directory", str(p))
    sub = p / "commitlog"
    if sub.is_dir():
        return sub
    if any(_is_segment_name(n) for n in os.listdir(p)):
        return p
    raise FileNotFoundError(2, "not a store directory: it has no commitlog/ and no commitlog files", str(p))


@dataclass(frozen=True, slots=True)
class CommitLogFile:
    """One file of a commitlog directory."""
    path: Path
    base_offset: int     # commitlog offset of its first byte (its name)
    size: int            # actual size in bytes


def list_commitlog_files(commitlog_dir: str | os.PathLike) -> list[CommitLogFile]:
    """The 20-digit-named files of a commitlog directory, in name (= offset) order."""
    d = Path(commitlog_dir)
    out = []
    for name in sorted(n for n in os.listdir(d) if _is_segment_name(n)):
        p = d / name
        if p.is_file():
            out.append(CommitLogFile(p, int(name), p.stat().st_size))
    return out


@dataclass(frozen=True, slots=True)
class RecordInfo:
    """Where one record is: its commitlog offset, kind (KIND_MESSAGE or KIND_BLANK), size, file."""
    offset: int
    kind: int
    size: int
    file: CommitLogFile

    @property
    def position(self) -> int:
        """Offset of the record inside its file."""
        return self.offset - self.file.base_offset


@dataclass(slots=True)
class ScanSummary:
    """What a whole scan found (see CommitLogReader.summary)."""
    min_offset: int          # first file's base offset (-1 if there is no file)
    end_offset: int          # commitlog offset just past the last record (where the next append goes)
    messages: int            # message records
    blanks: int              # END_OF_FILE blank records
    files: int               # files in the directory
    queue_offsets: dict[str, int]   # "topic-queueId" -> next queue offset (max stored + 1)


class CommitLogReader:
    """Read-only, sequential access to the records of one commitlog directory.

    `path` is a store directory (holding commitlog/) or a commitlog directory. `config` (or
    `file_size`) gives the configured file size, used only to tell a truncated file's END_OF_FILE
    record apart from corruption; a file whose actual size differs is read to its actual size.
    The list of files is taken when the reader is created (`refresh()` takes it again).
    """

    def __init__(self, path: str | os.PathLike, config: StoreConfig | None = None, *,
                 file_size: int | None = None):
        self.dir = find_commitlog_dir(path)
        if file_size is None:
            file_size = config.mapped_file_size_commit_log if config is not None else None
        self.file_size = file_size
        self.files: list[CommitLogFile] = []
        self.refresh()

    def refresh(self) -> None:
        self.files = list_commitlog_files(self.dir)

    # --- context manager (nothing is held open between calls; kept for symmetry with the store) ---
    def __enter__(self) -> "CommitLogReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        pass

    # --- offsets ----------------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        return self.files[0].base_offset if self.files else -1

    # --- scanning ---------------------------------------------------------------------------------
    def _files_from(self, from_offset: int) -> list[CommitLogFile]:
        files = self.files
        for i, f in enumerate(files):
            if from_offset < f.base_offset + f.size:
                return files[i:]
        return []

    def _scan(self, from_offset: int, check_crc: bool) -> Iterator[tuple[CommitLogFile, bytes, int, int, int]]:
        """Yield (file, mapped buffer, position in file, kind, size) for each record at or after
        from_offset. The buffer is valid only until the generator resumes."""
        for f in self._files_from(from_offset):
            if f.size == 0:
                return                        # an empty file: nothing was ever written here
            try:
                fd = os.open(f.path, os.O_RDONLY)
            except OSError as e:
                raise CorruptStoreError(str(f.path), 0, f"cannot open: {e.strerror}") from e
            try:
                limit = min(f.size, os.fstat(fd).st_size)   # the file may have shrunk since listed
                mm = mmap.mmap(fd, limit, access=mmap.ACCESS_READ) if limit else None
            except (OSError, ValueError) as e:
                raise CorruptStoreError(str(f.path), 0, f"cannot map {f.size} bytes: {e}") from e
            finally:
                os.close(fd)
            if mm is None:
                return
            try:
                pos = self._start_in(f, mm, from_offset, limit)
                while pos < limit:
                    try:
                        kind, size = scanner.check_record(mm, pos, limit, check_crc)
                    except scanner.RecordError as e:
                        if self._truncated_blank(mm, pos, limit):
                            yield f, mm, pos, KIND_BLANK, _I.unpack_from(mm, pos)[0]
                            break
                        raise self._corrupt(f, e.pos, e.reason) from None
                    if kind is Outcome.END_OF_DATA:
                        return                # zeros: the data ends here
                    yield f, mm, pos, kind, size
                    if kind == KIND_BLANK:
                        break
                    pos += size
            finally:
                mm.close()

    def _start_in(self, f: CommitLogFile, mm, from_offset: int, limit: int) -> int:
        """Position in f of the first record at or after from_offset."""
        target = from_offset - f.base_offset
        if target <= 0:
            return 0
        if target >= limit:
            return limit
        # A record boundary is recognised by its own PHYSICALOFFSET field; otherwise walk from 0.
        try:
            kind, _ = scanner.check_record(mm, target, limit)
            if kind is Outcome.MESSAGE and _Q.unpack_from(mm, target + codec.POS_PHYSICALOFFSET)[0] == from_offset:
                return target
        except scanner.RecordError:
            pass
        pos = 0
        while pos < target:
            try:
                kind, size = scanner.check_record(mm, pos, limit)
            except scanner.RecordError as e:
                raise self._corrupt(f, e.pos, e.reason) from None
            if kind != KIND_MESSAGE:
                return limit if kind == KIND_BLANK else pos
            pos += size
        return pos

    def _truncated_blank(self, mm, pos: int, limit: int) -> bool:
        """An END_OF_FILE record cut short by a truncated copy of the file: it would have fit the
        configured file size."""
        if pos + 8 > limit or self.file_size is None or limit >= self.file_size:
            return False
        total, magic = _II.unpack_from(mm, pos)
        return magic == codec.BLANK_MAGIC_CODE and total >= codec.END_FILE_MIN_BLANK_LENGTH \
            and pos + total <= self.file_size

    @staticmethod
    def _corrupt(f: CommitLogFile, pos: int, reason: str) -> CorruptStoreError:
        if f.base_offset:
            reason = f"{reason} (commitlog offset {f.base_offset + pos})"
        return CorruptStoreError(str(f.path), pos, reason)

    # --- public iteration -------------------------------------------------------------------------
    def records(self, from_offset: int = 0, *, check_crc: bool = False) -> Iterator[RecordInfo]:
        """Every record (messages and END_OF_FILE blanks) at or after from_offset, in order."""
        for f, _mm, pos, kind, size in self._scan(from_offset, check_crc):
            yield RecordInfo(f.base_offset + pos, kind, size, f)

    def raw_messages(self, from_offset: int = 0, *, limit: int | None = None,
                     check_crc: bool = False) -> Iterator[tuple[int, bytes]]:
        """(commitlog offset, the record's bytes) of each message record."""
        n = 0
        if limit is not None and limit <= 0:
            return
        for f, mm, pos, kind, size in self._scan(from_offset, check_crc):
            if kind != KIND_MESSAGE:
                continue
            yield f.base_offset + pos, mm[pos:pos + size]
            n += 1
            if limit is not None and n >= limit:
                return

    def decoded(self, from_offset: int = 0, *, limit: int | None = None, check_crc: bool = False,
                read_body: bool = True) -> Iterator[codec.DecodedRecord]:
        """codec.DecodedRecord of each message record."""
        n = 0
        if limit is not None and limit <= 0:
            return
        for f, mm, pos, kind, size in self._scan(from_offset, check_crc):
            if kind != KIND_MESSAGE:
                continue
            try:
                rec = scanner.decode_record(mm, pos, pos + size, read_body=read_body)
            except scanner.RecordError as e:    # check_record passed, so this cannot happen; be safe
                raise self._corrupt(f, e.pos, e.reason) from None
            yield rec
            n += 1
            if limit is not None and n >= limit:
                return

    def messages(self, from_offset: int = 0, *, limit: int | None = None, check_crc: bool = False,
                 read_body: bool = True) -> Iterator[MessageExt]:
        """MessageExt of each message record at or after from_offset (at most `limit` of them)."""
        for rec in self.decoded(from_offset, limit=limit, check_crc=check_crc, read_body=read_body):
            yield MessageExt.from_record(rec)

    def summary(self, *, check_crc: bool = False) -> ScanSummary:
        """Scan everything: where the data ends and the next queue offset of every queue."""
        end = self.min_offset if self.files else 0
        msgs = blanks = 0
        table: dict[str, int] = {}
        for f, mm, pos, kind, size in self._scan(0, check_crc):
            end = f.base_offset + pos + size
            if kind == KIND_BLANK:
                blanks += 1
                continue
            msgs += 1
            if not scanner.is_dispatched(_I.unpack_from(mm, pos + codec.POS_SYSFLAG)[0]):
                continue
            rec = codec.decode_fields(mm, pos, read_body=False)     # the scan checked it
            key = f"{rec.topic}-{rec.queue_id}"
            if rec.queue_offset + 1 > table.get(key, 0):
                table[key] = rec.queue_offset + 1
        return ScanSummary(self.min_offset, end, msgs, blanks, len(self.files), table)
