"""Every byte layout of a RocketMQ store, in one place, as pure encode/decode functions.

CommitLog record (all integers big-endian; RocketMQ 4.x MESSAGE_MAGIC_CODE):

     off  size  field
       0     4  TOTALSIZE            whole record, these 4 bytes included
       4     4  MAGICCODE            0xdaa320a7 (v1); 0xdaa320ab (v2, RocketMQ 5: 2-byte topic length)
       8     4  BODYCRC              crc32(body) & 0x7fffffff
      12     4  QUEUEID
      16     4  FLAG
      20     8  QUEUEOFFSET          logical offset in (topic, queueId); 0 for prepared/rolled-back
      28     8  PHYSICALOFFSET       offset of this record in the commitlog
      36     4  SYSFLAG              bits: 0x4 prepared, 0x8 commit (0xc rollback), 0x10 born v6, 0x20 store v6
      40     8  BORNTIMESTAMP        ms
      48   8|20 BORNHOST             IPv4 (4 bytes, or 16 for IPv6) + 4-byte port
       .     8  STORETIMESTAMP       ms
       .   8|20 STOREHOSTADDRESS     IPv4|IPv6 + 4-byte port
       .     4  RECONSUMETIMES
       .     8  PREPARED TRANSACTION OFFSET
       .     4  BODYLENGTH, then BODY
       .   1|2  TOPICLENGTH, then TOPIC (UTF-8)
       .     2  PROPERTIESLENGTH, then PROPERTIES (UTF-8, "key\\x01value\\x02" per pair)

END_OF_FILE blank record: TOTALSIZE = bytes left in the file, MAGICCODE = 0xcbd43194, the rest
meaningless; at least END_FILE_MIN_BLANK_LENGTH (8) bytes are always left free for it.

ConsumeQueue unit (20 bytes): commitlog offset (8), size (4), tags code (8).

IndexFile: header (40 bytes) beginTimestamp (8), endTimestamp (8), beginPhyOffset (8), endPhyOffset (8),
hashSlotCount (4), indexCount (4); then maxHashSlotNum slots of 4 bytes (the newest entry number of the
chain, 0 = empty); then maxIndexNum entries of 20 bytes: keyHash (4), phyOffset (8), timeDiff in
seconds from beginTimestamp (4), preIndexNo (4). Entry number 0 is never used.

Checkpoint (4 KiB file): physicMsgTimestamp (8) at 0, logicsMsgTimestamp (8) at 8,
indexMsgTimestamp (8) at 16.
"""
from __future__ import annotations

import functools
import ipaddress
import operator
import struct
import zlib
from dataclasses import dataclass

# --- commitlog ---------------------------------------------------------------------------------
MESSAGE_MAGIC_CODE = 0xDAA320A7
MESSAGE_MAGIC_CODE_V2 = 0xDAA320AB
BLANK_MAGIC_CODE = 0xCBD43194
END_FILE_MIN_BLANK_LENGTH = 8
MAX_TOPIC_LENGTH = 127
MAX_PROPERTIES_LENGTH = 32767

SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
TRANSACTION_TYPE_MASK = 0xC
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC


SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

# Property names RocketMQ's store reads.
PROPERTY_TAGS = "TAGS"
PROPERTY_KEYS = "KEYS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_DELAY = "DELAY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_TRAN_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
KEY_SEPARATOR = " "

# Offsets of the fixed fields every record variant shares.
POS_TOTALSIZE, POS_MAGIC, POS_BODYCRC, POS_QUEUEID, POS_FLAG = 0, 4, 8, 12, 16
POS_QUEUEOFFSET, POS_PHYSICALOFFSET, POS_SYSFLAG, POS_BORNTIMESTAMP, POS_BORNHOST = 20, 28, 36, 40, 48

_I = struct.Struct(">i")
_II = struct.Struct(">iI")
_H = struct.Struct(">h")


def _header_struct(born_v6: bool, store_v6: bool) -> struct.Struct:
    born = "16si" if born_v6 else "4si"
    store = "16si" if store_v6 else "4si"
    # TOTALSIZE MAGIC BODYCRC QUEUEID FLAG QUEUEOFFSET PHYSOFFSET SYSFLAG BORNTS BORNHOST STORETS
    # STOREHOST RECONSUMETIMES PREPAREDTXOFFSET BODYLENGTH
    return struct.Struct(">iIiiiqqiq" + born + "q" + store + "iqi")


# Header structs by (sysFlag & 0x30) >> 4: 0 both v4, 1 born v6, 2 store v6, 3 both v6.
HEADER_STRUCTS = tuple(_header_struct(bool(i & 1), bool(i & 2)) for i in range(4))
HEADER_V4 = HEADER_STRUCTS[0]


def header_struct(sys_flag: int) -> struct.Struct:
    return HEADER_STRUCTS[(sys_flag >> 4) & 3]


def store_timestamp_pos(sys_flag: int) -> int:
    return POS_BORNHOST + (20 if sys_flag & SYSFLAG_BORNHOST_V6 else 8)


def record_length(body_len: int, topic_len: int, props_len: int, sys_flag: int = 0, v2: bool = False) -> int:
    """RocketMQ's calMsgLength: the record size for these lengths."""
    return header_struct(sys_flag).size + body_len + (2 if v2 else 1) + topic_len + 2 + props_len


try:    # zlib-ng's crc32 (the same CRC-32, with SIMD): 3x faster than zlib's on 100-byte bodies
    from zlib_ng.zlib_ng import crc32
except ImportError:     # pragma: no cover - the dependency is declared; zlib gives the same values
    crc32 = zlib.crc32


def body_crc(body: bytes) -> int:
    return crc32(body) & 0x7FFFFFFF


# --- hosts and message ids -------------------------------------------------------------------------
@functools.lru_cache(maxsize=4096)
def parse_host(host: str) -> tuple[bytes, int, bool]:
    """'ip:port' or '[v6]:port' -> (packed address, port, is_v6)."""
    if not isinstance(host, str) or ":" not in host:
        raise ValueError(f"host {host!r} is not 'ip:port'")
    addr, _, port = host.rpartition(":")
    addr = addr.lstrip("/")
    if addr.startswith("[") and addr.endswith("]"):
        addr = addr[1:-1]
    ip = ipaddress.ip_address(addr)
    port_no = int(port)
    if not 0 <= port_no <= 0x7FFFFFFF:
        raise ValueError(f"host {host!r}: port out of range")
    return ip.packed, port_no, ip.version == 6


@functools.lru_cache(maxsize=4096)
def format_host(addr: bytes, port: int) -> str:
    ip = ipaddress.ip_address(addr)
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def create_message_id(store_addr: bytes, store_port: int, phy_offset: int) -> str:
    """RocketMQ's MessageDecoder.createMessageId: address + port (4) + offset (8), uppercase hex."""
    return (store_addr + struct.pack(">iq", store_port, phy_offset)).hex().upper()


def create_message_ids_v4(store_addr: bytes, store_port: int, phy_offsets) -> list[str]:
    """create_message_id for many offsets (an int64 array) of one IPv4 store host, in one pass."""
    import numpy as np
    raw = np.empty(len(phy_offsets), [("addr", "V4"), ("port", ">i4"), ("offset", ">i8")])
    raw["addr"] = np.void(store_addr)
    raw["port"] = store_port
    raw["offset"] = phy_offsets
    return raw.tobytes().hex(" ", 16).upper().split(" ") if len(raw) else []


def decode_message_id(msg_id: str) -> tuple[str, int]:
    """A msgId back to (store host 'ip:port', commitlog offset)."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError as e:
        raise ValueError(f"msgId {msg_id!r} is not hex") from e
    if len(raw) not in (16, 28):
        raise ValueError(f"msgId {msg_id!r} has {len(raw)} bytes, expected 16 (IPv4) or 28 (IPv6)")
    alen = len(raw) - 12
    port, offset = struct.unpack_from(">iq", raw, alen)
    return format_host(raw[:alen], port), offset


# --- properties ----------------------------------------------------------------------------------
def properties_to_string(props: dict[str, str] | None) -> str:
    if not props:
        return ""
    return "".join(f"{k}\x01{v}\x02" for k, v in props.items())


def string_to_properties(s: str) -> dict[str, str]:
    out: dict[str, str] = {}
    if not s:
        return out
    for item in s.split(PROPERTY_SEPARATOR):
        if not item:
            continue
        k, sep, v = item.partition(NAME_VALUE_SEPARATOR)
        if sep:
            out[k] = v
    return out


def sorted_properties_string(props: dict[str, str]) -> str:
    """The golden dump's form: pairs sorted by key."""
    return "".join(f"{k}\x01{props[k]}\x02" for k in sorted(props))


def property_from_bytes(raw: bytes, name: bytes) -> str | None:
    """One property straight from the serialised bytes, without building the dict."""
    i = raw.find(name + b"\x01")
    while i > 0 and raw[i - 1] != 2:
        i = raw.find(name + b"\x01", i + 1)
    if i < 0:
        return None
    start = i + len(name) + 1
    end = raw.find(b"\x02", start)
    return raw[start:end if end >= 0 else len(raw)].decode("utf-8", "replace")


# --- Java hash codes -----------------------------------------------------------------------------
_POW31 = [pow(31, i, 1 << 32) for i in range(4096)]


def java_string_hash(s: str) -> int:
    """java.lang.String.hashCode over UTF-16 code units, as a signed 32-bit int."""
    raw = s.encode("utf-16-be")
    n = len(raw) >> 1
    if n == 0:
        return 0
    units = struct.unpack(f">{n}H", raw)
    if n <= len(_POW31):
        h = sum(map(operator.mul, units, reversed(_POW31[:n]))) & 0xFFFFFFFF
    else:
        h = 0
        for u in units:
            h = (31 * h + u) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def tags_code(tags: str | None) -> int:
    """RocketMQ's tagsString2tagsCode: the Java hash of the TAGS string (0 when absent)."""
    return java_string_hash(tags) if tags else 0


def index_key_hash(key: str) -> int:
    """IndexFile.indexKeyHashMethod: abs(hashCode), with Integer.MIN_VALUE -> 0."""
    h = java_string_hash(key)
    if h < 0:
        h = 0 if h == -(1 << 31) else -h
    return h


def index_key(topic: str, key: str) -> str:
    return f"{topic}#{key}"


# --- record encode / decode -----------------------------------------------------------------------
@dataclass(slots=True)
class DecodedRecord:
    """Every field of one commitlog record."""
    store_size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: str
    store_timestamp: int
    store_host: str
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes | None
    topic: str
    properties: dict[str, str]
    store_addr: bytes = b""
    store_port: int = 0

    @property
    def msg_id(self) -> str:
        return create_message_id(self.store_addr, self.store_port, self.physical_offset)


class RecordError(ValueError):
    """Raised by the decoder: the bytes at this position are not a valid record (with the reason)."""

    def __init__(self, pos: int, reason: str):
        self.pos = pos
        self.reason = reason
        super().__init__(f"offset {pos}: {reason}")


def topic_and_properties(buf, p: int, magic: int) -> tuple[str, dict[str, str]]:
    """The tail of a message record from p (just after the body): the topic (its length one byte in a v1
    record, two in a v2 one) and the properties."""
    if magic == MESSAGE_MAGIC_CODE:
        tl = buf[p]
        p += 1
    else:
        tl = struct.unpack_from(">H", buf, p)[0]
        p += 2
    topic = bytes(buf[p:p + tl]).decode("utf-8", "replace")
    p += tl
    pl = _H.unpack_from(buf, p)[0]
    props = string_to_properties(bytes(buf[p + 2:p + 2 + pl]).decode("utf-8", "replace")) if pl else {}
    return topic, props


def decode_fields(buf, pos: int, read_body: bool = True) -> DecodedRecord:
    """Every field of the message record at pos, which the rule has passed (scanner.decode_record checks
    first; this only reads the layout)."""
    sys_flag = _I.unpack_from(buf, pos + POS_SYSFLAG)[0]
    hs = header_struct(sys_flag)
    (total, magic, crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts, born_addr, born_port,
     store_ts, store_addr, store_port, reconsume, prep, body_len) = hs.unpack_from(buf, pos)
    p = pos + hs.size
    body = bytes(buf[p:p + body_len]) if read_body else None
    topic, props = topic_and_properties(buf, p + body_len, magic)
    return DecodedRecord(total, magic, crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts,
                         format_host(born_addr, born_port), store_ts, format_host(store_addr, store_port),
                         reconsume, prep, body, topic, props, store_addr, store_port)


def encode_blank(size: int) -> bytes:
    return _II.pack(size, BLANK_MAGIC_CODE)


@dataclass(slots=True)
class DispatchRequest:
    """What the dispatcher needs of one record (RocketMQ's DispatchRequest)."""
    topic: str
    queue_id: int
    commit_log_offset: int
    msg_size: int
    tags_code: int
    store_timestamp: int
    consume_queue_offset: int
    keys: str | None
    uniq_key: str | None
    sys_flag: int
    prepared_transaction_offset: int
    properties: dict[str, str]


def delivery_time_for_schedule(props: dict[str, str], store_ts: int, delay_levels: list[int] | None) -> int | None:
    level = props.get(PROPERTY_DELAY)
    if not level or delay_levels is None:
        return None
    try:
        lv = int(level)
    except ValueError:
        return None
    lv = min(max(lv, 1), len(delay_levels))
    return store_ts + delay_levels[lv - 1]


SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"


def dispatch_request_at(buf, pos: int, base_offset: int, delay_levels: list[int] | None = None) -> DispatchRequest:
    """Decode the fields the dispatcher uses from a record already validated by check_record."""
    sys_flag = _I.unpack_from(buf, pos + POS_SYSFLAG)[0]
    hs = header_struct(sys_flag)
    f = hs.unpack_from(buf, pos)
    total, magic, queue_id, queue_offset, store_ts, prep, body_len = f[0], f[1], f[3], f[5], f[11], f[15], f[16]
    topic, props = topic_and_properties(buf, pos + hs.size + body_len, magic)
    tags = props.get(PROPERTY_TAGS)
    code = java_string_hash(tags) if tags else 0
    if topic == SCHEDULE_TOPIC:
        t = delivery_time_for_schedule(props, store_ts, delay_levels)
        if t is not None:
            code = t
    return DispatchRequest(topic, queue_id, base_offset + pos, total, code, store_ts, queue_offset,
                           props.get(PROPERTY_KEYS), props.get(PROPERTY_UNIQ_KEY), sys_flag, prep, props)


@functools.lru_cache(maxsize=1 << 16)
def _cached_tags_code(tags: str) -> int:
    return java_string_hash(tags)


def tags_codes(tags, n: int):
    """The consume queue tags codes (java hashCode; 0 without tags) of n messages: tags is one str (or None)
    for all, or one per message."""
    import numpy as np
    if tags is None or isinstance(tags, str):
        return np.full(n, _cached_tags_code(tags) if tags else 0, np.int64)
    if n and isinstance(tags, list) and (tags[0] is None or isinstance(tags[0], str)) \
            and tags.count(tags[0]) == n:                               # one tag for all, as a column
        return tags_codes(tags[0], n)
    return np.fromiter([_cached_tags_code(t) if t else 0 for t in tags], np.int64, n)


# HEADER_V4 as numpy fields; the first seven (TOTALSIZE .. PHYSICALOFFSET) are where every variant has them
HEADER_V4_FIELDS = [
    ("total", ">i4"), ("magic", ">u4"), ("crc", ">i4"), ("queue_id", ">i4"), ("flag", ">i4"),
    ("queue_offset", ">i8"), ("phys", ">i8"), ("sys_flag", ">i4"), ("born_ts", ">i8"),
    ("born_addr", "V4"), ("born_port", ">i4"), ("store_ts", ">i8"), ("store_addr", "V4"),
    ("store_port", ">i4"), ("reconsume", ">i4"), ("prepared", ">i8"), ("body_len", ">i4")]
RECORD_PREFIX_FIELDS = HEADER_V4_FIELDS[:7]
_HEADER_V4_NP = None   # numpy dtype of HEADER_V4, built on first use (numpy is imported lazily here)


def header_v4_dtype():
    global _HEADER_V4_NP
    if _HEADER_V4_NP is None:
        import numpy as np
        _HEADER_V4_NP = np.dtype(HEADER_V4_FIELDS)
        assert _HEADER_V4_NP.itemsize == HEADER_V4.size
    return _HEADER_V4_NP


class DispatchBatch:
    """Parsed records column-wise: what DispatchRequest holds, for many records at once."""
    __slots__ = ("topic_names", "topic_ids", "queue_ids", "offsets", "sizes", "tags_codes", "store_timestamps",
                 "queue_offsets", "sys_flags", "prepared", "keys", "uniq_keys")

    def __init__(self, topic_names, topic_ids, queue_ids, offsets, sizes, tags_codes, store_timestamps,
                 queue_offsets, sys_flags, prepared, keys, uniq_keys):
        self.topic_names: list[str] = topic_names
        self.topic_ids = topic_ids              # int64 array, index into topic_names
        self.queue_ids = queue_ids              # the rest: int64 arrays / lists, one item per record
        self.offsets = offsets
        self.sizes = sizes
        self.tags_codes = tags_codes
        self.store_timestamps = store_timestamps
        self.queue_offsets = queue_offsets
        self.sys_flags = sys_flags
        self.prepared = prepared
        self.keys: list = keys
        self.uniq_keys: list = uniq_keys

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def topics(self) -> list[str]:
        names = self.topic_names
        if len(names) == 1:
            return names * len(self.topic_ids)
        return [names[i] for i in self.topic_ids.tolist()]

    @classmethod
    def from_requests(cls, reqs: list[DispatchRequest]) -> "DispatchBatch":
        import numpy as np
        ids: dict[str, int] = {}
        tids = [ids.setdefault(r.topic, len(ids)) for r in reqs]

        def col(name):
            return np.array([getattr(r, name) for r in reqs], dtype=np.int64)
        return cls(list(ids), np.array(tids, dtype=np.int64), col("queue_id"), col("commit_log_offset"),
                   col("msg_size"), col("tags_code"), col("store_timestamp"), col("consume_queue_offset"),
                   col("sys_flag"), col("prepared_transaction_offset"), [r.keys for r in reqs],
                   [r.uniq_key for r in reqs])

    def concat(self, other: "DispatchBatch") -> "DispatchBatch":
        import numpy as np
        if not len(other):
            return self
        if not len(self):
            return other
        names = list(self.topic_names)
        remap = np.array([names.index(t) if t in names else names.append(t) or len(names) - 1
                          for t in other.topic_names], dtype=np.int64)
        cat = np.concatenate
        return DispatchBatch(names, cat([self.topic_ids, remap[other.topic_ids]]),
                             *(cat([getattr(self, f), getattr(other, f)]) for f in
                               ("queue_ids", "offsets", "sizes", "tags_codes", "store_timestamps", "queue_offsets",
                                "sys_flags", "prepared")),
                             self.keys + other.keys, self.uniq_keys + other.uniq_keys)

    def requests(self) -> list[DispatchRequest]:
        n = len(self)
        return list(map(DispatchRequest, self.topics, self.queue_ids.tolist(), self.offsets.tolist(),
                        self.sizes.tolist(), self.tags_codes.tolist(), self.store_timestamps.tolist(),
                        self.queue_offsets.tolist(), self.keys, self.uniq_keys, self.sys_flags.tolist(),
                        self.prepared.tolist(), [{}] * n))


# --- consume queue --------------------------------------------------------------------------------
CQ_STORE_UNIT_SIZE = 20
CQ_UNIT = struct.Struct(">qiq")
CQ_DTYPE = [("offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")]
CQ_BLANK_SIZE = 0x7FFFFFFF  # size of the filler units RocketMQ writes before a queue's first real unit

# --- index file -----------------------------------------------------------------------------------
INDEX_HEADER_SIZE = 40
INDEX_HEADER = struct.Struct(">qqqqii")
INDEX_HASH_SLOT_SIZE = 4
INDEX_SLOT = struct.Struct(">i")
INDEX_ENTRY_SIZE = 20
INDEX_ENTRY = struct.Struct(">iqii")
INDEX_ENTRY_DTYPE = [("key_hash", ">i4"), ("phy_offset", ">i8"), ("time_diff", ">i4"), ("prev", ">i4")]
INDEX_INVALID = 0


def index_file_size(max_hash_slot_num: int, max_index_num: int) -> int:
    return INDEX_HEADER_SIZE + max_hash_slot_num * INDEX_HASH_SLOT_SIZE + max_index_num * INDEX_ENTRY_SIZE


# --- checkpoint -----------------------------------------------------------------------------------
CHECKPOINT_FILE_SIZE = 4096
CHECKPOINT = struct.Struct(">qqq")


def encode_tail(topic: bytes, props: bytes, v2: bool = False) -> bytes:
    """TOPICLENGTH TOPIC PROPERTIESLENGTH PROPERTIES: the part of a record after the body."""
    tl = struct.pack(">H", len(topic)) if v2 else bytes((len(topic),))
    return tl + topic + _H.pack(len(props)) + props


def encode_record(*, queue_id: int, flag: int, queue_offset: int, physical_offset: int, sys_flag: int,
                  born_timestamp: int, born_host: str, store_timestamp: int, store_host: str,
                  reconsume_times: int, prepared_transaction_offset: int, body: bytes, topic: str,
                  properties: dict[str, str] | None) -> bytes:
    """One whole record (v1 magic), from field values; the put path uses the same structs, batched."""
    born_addr, born_port, born_v6 = parse_host(born_host)
    store_addr, store_port, store_v6 = parse_host(store_host)
    sys_flag = (sys_flag & ~0x30) | (SYSFLAG_BORNHOST_V6 if born_v6 else 0) | (SYSFLAG_STOREHOST_V6 if store_v6 else 0)
    tail = encode_tail(topic.encode(), properties_to_string(properties).encode())
    hs = header_struct(sys_flag)
    total = hs.size + len(body) + len(tail)
    return hs.pack(total, MESSAGE_MAGIC_CODE, body_crc(body), queue_id, flag, queue_offset, physical_offset,
                   sys_flag, born_timestamp, born_addr, born_port, store_timestamp, store_addr, store_port,
                   reconsume_times, prepared_transaction_offset, len(body)) + body + tail


# =================================================================================================
# Put-path encode helpers (added for the fast put path; pure functions, byte-identical to the above).
# =================================================================================================
def encode_properties(props: dict | None) -> bytes:
    """The PROPERTIES field of a record: properties_to_string(props) as UTF-8, built in C where it can.

    Raises UnicodeEncodeError (a ValueError) for strings UTF-8 cannot encode, like the slower form.
    """
    if not props:
        return b""
    try:
        return ("\x02".join(map("\x01".join, props.items())) + "\x02").encode()
    except TypeError:  # a key or value that is not a str: formatted by properties_to_string's f-string
        return properties_to_string(props).encode("utf-8")


def message_id_prefix(addr: bytes, port: int) -> str:
    """The part of create_message_id that depends on the store host: create_message_id(a, p, o) ==
    message_id_prefix(a, p) + f"{o:016X}" for every offset 0 <= o < 2**63."""
    return (addr + _I.pack(port)).hex().upper()
