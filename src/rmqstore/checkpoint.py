"""StoreCheckpoint: the 4 KiB `checkpoint` file that tells recovery how far flushed data goes.

Layout (codec.CHECKPOINT, big-endian longs): physicMsgTimestamp at 0 (store time of the last commitlog
message known flushed), logicsMsgTimestamp at 8 (last message whose consume queue unit is flushed),
indexMsgTimestamp at 16 (last message in a flushed index file). Each value is set only after the data it
vouches for is on disk, and the file itself is msync'ed by `flush()`.
"""
from __future__ import annotations

import logging
import mmap
import os
from pathlib import Path

from . import codec

log = logging.getLogger(__name__)


class StoreCheckpoint:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        existed = self.path.exists()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size < codec.CHECKPOINT_FILE_SIZE:
                os.ftruncate(fd, codec.CHECKPOINT_FILE_SIZE)
            self._mm = mmap.mmap(fd, codec.CHECKPOINT_FILE_SIZE)
        finally:
            os.close(fd)
        self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp = \
            codec.CHECKPOINT.unpack_from(self._mm, 0)
        self.existed = existed

    def min_timestamp(self) -> int:
        """What the commitlog is known flushed up to, minus RocketMQ's 3 s margin."""
        m = min(self.physic_msg_timestamp, self.logics_msg_timestamp) - 3000
        return max(m, 0)

    def min_timestamp_index(self) -> int:
        return min(self.min_timestamp(), self.index_msg_timestamp)

    def flush(self) -> None:
        codec.CHECKPOINT.pack_into(self._mm, 0, self.physic_msg_timestamp, self.logics_msg_timestamp,
                                   self.index_msg_timestamp)
        self._mm.flush()

    def shutdown(self) -> None:
        if not self._mm.closed:
            self.flush()
            self._mm.close()
