"""Binary bodies of the protocol: RocketMQ's batch encoding (MessageDecoder.encodeMessages), the message
records of pull / query / view answers (the commitlog record format), and the unique message id
(MessageClientIDSetter) the Java client stamps on each message as UNIQ_KEY.

Batch body, one entry per message, back to back (big-endian):

    int32 TOTALSIZE   (of this entry)
    int32 MAGICCODE   (0)
    int32 BODYCRC     (0)
    int32 FLAG
    int32 BODYLENGTH, BODY
    int16 PROPERTIESLENGTH, PROPERTIES ("k\\x01v\\x02" per pair)
"""
from __future__ import annotations

import itertools
import os
import random
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

from ..store.format import codec
from ..store.format import scanner

_BATCH_HEAD = struct.Struct(">iiiii")
_H = struct.Struct(">h")
_I = struct.Struct(">i")


class BodyError(ValueError):
    pass


@dataclass(slots=True)
class BatchEntry:
    flag: int
    body: bytes
    properties: dict[str, str] = field(default_factory=dict)


def encode_batch_entry(flag: int, body: bytes, properties: dict[str, str] | None) -> bytes:
    props = codec.properties_to_string(properties).encode("utf-8") if properties else b""
    if len(props) > 0x7FFF:
        raise BodyError(f"properties of {len(props)} bytes exceed 32767")
    size = 20 + len(body) + 2 + len(props)
    return _BATCH_HEAD.pack(size, 0, 0, flag, len(body)) + body + _H.pack(len(props)) + props


def encode_batch(entries) -> bytes:
    """MessageDecoder.encodeMessages: entries are BatchEntry or (flag, body, properties) tuples."""
    out = []
    for e in entries:
        if isinstance(e, BatchEntry):
            out.append(encode_batch_entry(e.flag, e.body, e.properties))
        else:
            out.append(encode_batch_entry(*e))
    return b"".join(out)


def decode_batch(data: bytes) -> list[BatchEntry]:
    """MessageDecoder.decodeMessages, strict: raises BodyError on any inconsistency."""
    out = []
    pos, n = 0, len(data)
    while pos < n:
        if n - pos < 22:
            raise BodyError(f"batch entry at {pos}: {n - pos} bytes left, too short")
        size, _magic, _crc, flag, body_len = _BATCH_HEAD.unpack_from(data, pos)
        if body_len < 0 or pos + 20 + body_len + 2 > n:
            raise BodyError(f"batch entry at {pos}: body length {body_len} out of range")
        body = bytes(data[pos + 20:pos + 20 + body_len])
        p = pos + 20 + body_len
        pl = _H.unpack_from(data, p)[0]
        if pl < 0 or p + 2 + pl > n:
            raise BodyError(f"batch entry at {pos}: properties length {pl} out of range")
        try:
            props = codec.string_to_properties(bytes(data[p + 2:p + 2 + pl]).decode("utf-8"))
        except UnicodeDecodeError as e:
            raise BodyError(f"batch entry at {pos}: properties are not UTF-8") from e
        end = p + 2 + pl
        if size != end - pos:
            raise BodyError(f"batch entry at {pos}: total size {size} but the fields take {end - pos}")
        out.append(BatchEntry(flag, body, props))
        pos = end
    return out


def iter_records(data: bytes) -> Iterator[codec.DecodedRecord]:
    """The message records of a pull / query / view body (MessageDecoder.decodes)."""
    pos, n = 0, len(data)
    while pos < n:
        rec = scanner.decode_record(data, pos, n)
        yield rec
        pos += rec.store_size


def decode_records(data: bytes) -> list[codec.DecodedRecord]:
    return list(iter_records(data))


# --- MessageClientIDSetter -----------------------------------------------------------------------------
class UniqIdGenerator:
    """32 hex digits: IPv4 (4 bytes) + pid (2) + a per-process random (4, the class loader hash in Java),
    then per message: milliseconds since the start of the month (4) + a counter (2)."""

    def __init__(self, ip: str | None = None):
        try:
            ip_bytes = socket.inet_aton(ip or local_ip())
        except OSError:
            ip_bytes = b"\x7f\x00\x00\x01"
        self.prefix = (ip_bytes + struct.pack(">H", os.getpid() & 0xFFFF)
                       + struct.pack(">I", random.getrandbits(32))).hex().upper()
        self._lock = threading.Lock()
        self._counter = itertools.count()
        self._start = 0
        self._next_start = 0
        self._head = (-1, "")
        self._set_start(time.time())

    def _set_start(self, now_s: float) -> None:
        t = time.localtime(now_s)
        start = time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, -1))
        nm = (t.tm_year + (t.tm_mon == 12), t.tm_mon % 12 + 1)
        self._start = int(start * 1000)
        self._next_start = int(time.mktime((nm[0], nm[1], 1, 0, 0, 0, 0, 0, -1)) * 1000)

    def new_id(self) -> str:
        now = time.time_ns() // 1_000_000
        ms, head = self._head          # (millisecond, the id's first 28 digits): one per millisecond
        if now != ms:
            if now >= self._next_start:
                with self._lock:
                    if now >= self._next_start:
                        self._set_start(now / 1000)
            head = "%s%08X" % (self.prefix, (now - self._start) & 0xFFFFFFFF)
            self._head = (now, head)
        return head + "%04X" % (next(self._counter) & 0xFFFF)


_LOCAL_IP: str | None = None


def local_ip() -> str:
    """The address the Java client would call its own (first non-loopback IPv4), else 127.0.0.1.
    Found without sending anything (a UDP socket's connect only picks a route)."""
    global _LOCAL_IP
    if _LOCAL_IP is None:
        ip = "127.0.0.1"
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect(("192.0.2.1", 9))   # TEST-NET-1, nothing is sent
                ip = s.getsockname()[0]
        except OSError:
            pass
        _LOCAL_IP = ip
    return _LOCAL_IP
