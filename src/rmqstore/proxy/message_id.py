"""RocketMQ 5's message ids (the clients' MessageIdCodec): 17 bytes as 34 upper-case hex characters,

    version (1 byte, 0x01) | MAC address (6) | process id (low 2 bytes) |
    seconds since 2021-01-01T00:00:00Z (4, big-endian) | sequence (4, big-endian)

The 5.x clients make the ids of what they send; the server makes one for a message that has none (a 4.x
message stored without UNIQ_KEY keeps its offset message id instead, see convert.message_id_of)."""
from __future__ import annotations

import itertools
import os
import struct
import threading
import time
import uuid

VERSION = 0x01
EPOCH_2021 = 1609459200          # 2021-01-01T00:00:00Z
_seq = itertools.count()
_lock = threading.Lock()
_prefix = bytes([VERSION]) + uuid.getnode().to_bytes(6, "big") + struct.pack(">H", os.getpid() & 0xFFFF)


def next_message_id(now: float | None = None) -> str:
    """A new 5.x message id."""
    secs = int((time.time() if now is None else now) - EPOCH_2021) & 0xFFFFFFFF
    with _lock:
        seq = next(_seq) & 0xFFFFFFFF
    return (_prefix + struct.pack(">II", secs, seq)).hex().upper()


def is_v5_message_id(s: str) -> bool:
    """True for a 34-hex-character id of version 01."""
    if len(s) != 34 or not s.startswith("01"):
        return False
    try:
        bytes.fromhex(s)
    except ValueError:
        return False
    return True
