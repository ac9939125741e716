"""StoreCheckpoint: the 4 KiB `checkpoint` file that tells recovery how far flushed data goes.

Layout (codec.CHECKPOINT, big-endian longs): physicMsgTimestamp at 0 (store time of the last commitlog
message known flushed), logicsMsgTimestamp at 8 (last message whose consume queue unit is flushed),
indexMsgTimestamp at 16 (last message in a flushed index file). Each value is set only after the data it
vouches for is on disk, and the file itself is written (pwrite) and fdatasync'ed by `flush()`.

RocketMQ maps the file; here it is read with pread and written with pwrite, never through a mapping: a new
store's checkpoint is a hole until its first flush, and a read of a hole through a mapping on a full tmpfs
dies of SIGBUS. Same bytes on disk.
"""
from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from ..format import codec
from ..conf.config_file import check_file_or_missing
from ...errors import CorruptStoreError

log = logging.getLogger(__name__)


class StoreCheckpoint:
    """The checkpoint file, read and written with pread/pwrite, never through a mapping.

    A new file is allocated (posix_fallocate) when it is created, so that writing it later never meets a
    full disk; reading goes through pread, which reads a hole (a file created but never written, or
    copied sparse) as zeros where a read through a mapping on a full tmpfs dies of SIGBUS. Values are
    written to the file only by flush() (then fdatasync'ed). A directory where the file belongs, or a
    file that cannot be opened or created, is a CorruptStoreError naming it."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        existed = check_file_or_missing(self.path, "checkpoint file")
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise CorruptStoreError(str(self.path), 0, f"cannot open the checkpoint: {e.strerror}") from e
        try:
            self._prepare(fd, existed)
            raw = os.pread(fd, codec.CHECKPOINT.size, 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd
        raw = raw.ljust(codec.CHECKPOINT.size, b"\0")
        self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp = \
            codec.CHECKPOINT.unpack_from(raw, 0)
        self.existed = existed

    def _prepare(self, fd: int, existed: bool) -> None:
        """Give the file its 4 KiB and, where there is room, allocate them (a failure to allocate an
        existing file is only logged: it is read with pread, and a later failed write is an OSError)."""
        if os.fstat(fd).st_size < codec.CHECKPOINT_FILE_SIZE:
            try:
                os.ftruncate(fd, codec.CHECKPOINT_FILE_SIZE)
            except OSError as e:
                raise CorruptStoreError(str(self.path), 0, f"cannot size the checkpoint: {e.strerror}") from e
        try:
            os.posix_fallocate(fd, 0, codec.CHECKPOINT_FILE_SIZE)
        except OSError as e:
            if e.errno in (errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)):
                return
            if not existed:
                os.unlink(self.path)
                raise CorruptStoreError(str(self.path), 0, f"cannot allocate the new checkpoint: {e.strerror}") \
                    from e
            log.warning("%s: cannot allocate the checkpoint (%s): read with pread; writing it may fail",
                        self.path, e.strerror)

    def min_timestamp(self) -> int:
        """What the commitlog is known flushed up to, minus RocketMQ's 3 s margin."""
        m = min(self.physic_msg_timestamp, self.logics_msg_timestamp) - 3000
        return max(m, 0)

    def min_timestamp_index(self) -> int:
        return min(self.min_timestamp(), self.index_msg_timestamp)

    def flush(self) -> None:
        """Write the three timestamps (pwrite) and fdatasync; OSError (e.g. ENOSPC, EIO) propagates."""
        fd = self._fd
        if fd is None:
            return
        data = codec.CHECKPOINT.pack(self.physic_msg_timestamp, self.logics_msg_timestamp,
                                     self.index_msg_timestamp)
        if os.pwrite(fd, data, 0) != len(data):
            raise OSError(errno.ENOSPC, f"short write of the checkpoint {self.path}")
        os.fdatasync(fd)

    def shutdown(self) -> None:
        """Flush and close. A failed write is logged, not raised: the file then vouches for less than was
        flushed, and the next open only checks more (a checkpoint is never ahead of the data)."""
        if self._fd is not None:
            try:
                self.flush()
            except OSError as e:
                log.error("%s: cannot write the checkpoint at shutdown (%s): the next open checks from an "
                          "older point", self.path, e.strerror)
            finally:
                os.close(self._fd)
                self._fd = None


def read_checkpoint(path: str | Path) -> tuple[int, int, int] | None:
    """The checkpoint's (physicMsgTimestamp, logicsMsgTimestamp, indexMsgTimestamp), read with pread and
    changing nothing (recovery's plan, the read-only view); None when there is no checkpoint file. A
    short file reads as zeros after its bytes; a directory there is a CorruptStoreError naming it."""
    path = Path(path)
    if not check_file_or_missing(path, "checkpoint file"):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise CorruptStoreError(str(path), 0, f"cannot open the checkpoint: {e.strerror}") from e
    try:
        raw = os.pread(fd, codec.CHECKPOINT.size, 0)
    finally:
        os.close(fd)
    return codec.CHECKPOINT.unpack_from(raw.ljust(codec.CHECKPOINT.size, b"\0"), 0)
