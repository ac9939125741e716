"""The HA wire format as pure functions (the package docstring describes it).

Slave -> master: 8-byte big-endian reports (the slave's commitlog max offset). The master takes the last
complete report of what it has read (`last_report`). Master -> slave: a 12-byte header (big-endian int64
offset, int32 size) and `size` bytes of commitlog (`encode_frames`, `FrameDecoder`).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

REPORT = struct.Struct(">q")
HEADER = struct.Struct(">qi")
REPORT_SIZE = REPORT.size        # 8
HEADER_SIZE = HEADER.size        # 12
MAX_OFFSET = (1 << 63) - 1


class ProtocolError(ValueError):
    """A peer sent what the format does not allow (a negative offset or size, a frame over the limit)."""


def encode_report(offset: int) -> bytes:
    """A slave's report: its commitlog max offset."""
    return REPORT.pack(offset)


def last_report(buf: bytes | bytearray | memoryview) -> tuple[int | None, int]:
    """(the last complete report in buf or None, bytes consumed): what RocketMQ's master does, which keeps
    only the newest value of what arrived together. A negative value is a ProtocolError."""
    n = len(buf) - len(buf) % REPORT_SIZE
    if not n:
        return None, 0
    (value,) = REPORT.unpack_from(buf, n - REPORT_SIZE)
    if value < 0:
        raise ProtocolError(f"slave reported a negative offset {value}")
    return value, n


def encode_header(offset: int, size: int) -> bytes:
    return HEADER.pack(offset, size)


def encode_frames(offset: int, data: bytes | memoryview, batch: int) -> list:
    """data (commitlog bytes from offset, within one file) as frames of at most `batch` bytes each:
    [header, data, header, data, ...] ready for writelines."""
    out: list = []
    view = memoryview(data)
    n = len(view)
    pos = 0
    while pos < n:
        take = min(batch, n - pos)
        out.append(HEADER.pack(offset + pos, take))
        out.append(view[pos:pos + take])
        pos += take
    return out


@dataclass(frozen=True)
class Frame:
    offset: int
    data: bytes          # empty: a heartbeat


class FrameDecoder:
    """The slave's side: bytes in, whole frames out. A frame larger than max_size (or a negative offset or
    size) is a ProtocolError: a peer that is not a RocketMQ master, or a broken one."""

    def __init__(self, max_size: int):
        self.max_size = max_size
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        buf = self._buf
        buf += data
        frames: list[Frame] = []
        pos = 0
        n = len(buf)
        while n - pos >= HEADER_SIZE:
            offset, size = HEADER.unpack_from(buf, pos)
            if offset < 0 or size < 0 or size > self.max_size:
                raise ProtocolError(f"frame header at stream byte {pos}: offset {offset}, size {size} "
                                    f"(at most {self.max_size})")
            end = pos + HEADER_SIZE + size
            if end > n:
                break
            frames.append(Frame(offset, bytes(buf[pos + HEADER_SIZE:end])))
            pos = end
        if pos:
            del buf[:pos]
        return frames

    @property
    def buffered(self) -> int:
        return len(self._buf)
