"""MessageBatch, and the columnar encoder behind CommitLog.put_messages.

A MessageBatch is a batch of messages to one topic given as columns (bodies, queue ids, property
values), what a producer that sends thousands of messages at a time has at hand, and what a Spark or
Arrow batch already is: no Message object per message. `CommitLog.put_messages` takes a MessageBatch or
a list of Messages; either way a batch of at least COLUMNAR_MIN messages that share topic and (IPv4)
hosts is encoded here a field at a time over the whole batch (encode_columns): numpy for the header
fields and queue-offset ranks, one str.join for all the properties, one pass of codec.crc32 over the
bodies. What the lock assigns (physical offset, queue offset, store timestamp) is filled in by the
commitlog. A batch this cannot take (mixed topics, IPv6 hosts, a message to refuse) goes, as Messages,
to the commitlog's general path, which answers each message with RocketMQ's status.
"""
from __future__ import annotations

import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from . import codec, scanner, validation
from .message import DEFAULT_HOST, Message

_HEADER_V4 = codec.HEADER_V4
_MAGIC = codec.MESSAGE_MAGIC_CODE
_BLANK_MIN = codec.END_FILE_MIN_BLANK_LENGTH
_MAX_PROPS = codec.MAX_PROPERTIES_LENGTH
_crc32 = codec.crc32
_pack_len = struct.Struct(">h").pack
_JUST_INT = {int}
INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)


@dataclass
class MessageBatch:
    """Messages to one topic as columns; every sequence has one item per message (len(bodies)).

    queue_ids, born_timestamp, prepared_transaction_offset: one int for all, or one per message (a list or a
    numpy int array). properties: name -> one str for all,
    or a sequence of str (one per message); tags and keys are shorthands for the TAGS and KEYS
    properties (keys: one str per message, several keys separated by a space). born_timestamp defaults
    to the batch's creation time in ms.

    >>> b = MessageBatch("Orders", [b"a", b"b"], queue_ids=[0, 1], tags="paid", keys=["o-1", "o-2"])
    >>> len(b), b.to_messages()[1].keys
    (2, ['o-2'])
    """
    topic: str
    bodies: Sequence[bytes]
    queue_ids: int | Sequence[int] = 0
    properties: Mapping[str, str | Sequence[str]] = field(default_factory=dict)
    tags: str | Sequence[str] | None = None
    keys: Sequence[str] | None = None
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int | Sequence[int] | None = None
    born_host: str = DEFAULT_HOST
    store_host: str | None = None
    prepared_transaction_offset: int | Sequence[int] = 0

    def __post_init__(self):
        n = len(self.bodies)
        props = dict(self.properties)
        if self.tags is not None:
            props[codec.PROPERTY_TAGS] = self.tags
        if self.keys is not None:
            props[codec.PROPERTY_KEYS] = self.keys
        for name, v in props.items():
            if not isinstance(name, str):
                raise TypeError(f"MessageBatch: property name {name!r} is not a str")
            if not isinstance(v, str):
                if isinstance(v, (bytes, bytearray)) or not isinstance(v, Sequence):
                    raise TypeError(f"MessageBatch: property {name!r} must be a str or a sequence of str, "
                                    f"not {type(v).__name__}")
                if len(v) != n:
                    raise ValueError(f"MessageBatch: property {name!r} has {len(v)} values for {n} bodies")
        self._props = props
        if self.born_timestamp is None:
            self.born_timestamp = time.time_ns() // 1_000_000
        for name in ("queue_ids", "born_timestamp", "prepared_transaction_offset"):
            v = getattr(self, name)
            if isinstance(v, np.integer):
                setattr(self, name, v := int(v))
            if not isinstance(v, int) and len(v) != n:
                raise ValueError(f"MessageBatch: {name} has {len(v)} values for {n} bodies")

    def __len__(self) -> int:
        return len(self.bodies)

    def slice(self, start: int, stop: int) -> "MessageBatch":
        """Messages start..stop-1 of this batch, as a batch."""
        def part(v):
            return v if isinstance(v, (int, str)) else v[start:stop]
        return MessageBatch(self.topic, self.bodies[start:stop], part(self.queue_ids),
                            {k: part(v) for k, v in self._props.items()}, flag=self.flag, sys_flag=self.sys_flag,
                            born_timestamp=part(self.born_timestamp), born_host=self.born_host,
                            store_host=self.store_host,
                            prepared_transaction_offset=part(self.prepared_transaction_offset))

    def column(self, name: str) -> list:
        """A per-message column (queue_ids, born_timestamp, prepared_transaction_offset) as a list of n values."""
        v = getattr(self, name)
        return [v] * len(self.bodies) if isinstance(v, int) else v.tolist() if isinstance(v, np.ndarray) else list(v)

    def property(self, name: str):
        """A property's value: one str (or None) for all messages, or a list of one per message."""
        v = self._props.get(name)
        return v if v is None or isinstance(v, str) else list(v)

    def property_columns(self) -> tuple[list[str], list]:
        """(names, values): values[j] is one str or one str per message."""
        return list(self._props), [v if isinstance(v, str) else list(v) for v in self._props.values()]

    def to_messages(self) -> list[Message]:
        """The same messages one by one (what the general put path takes)."""
        n = len(self.bodies)
        names, cols = self.property_columns()
        rows = [[v] * n if isinstance(v, str) else v for v in cols]
        qids, borns = self.column("queue_ids"), self.column("born_timestamp")
        prepared = self.column("prepared_transaction_offset")
        return [Message(topic=self.topic, body=self.bodies[i], queue_id=qids[i], flag=self.flag,
                        sys_flag=self.sys_flag, born_timestamp=borns[i], born_host=self.born_host,
                        store_host=self.store_host, prepared_transaction_offset=prepared[i],
                        properties={k: r[i] for k, r in zip(names, rows)})
                for i in range(n)]


# Batches of at least this many messages that share topic and hosts (IPv4) are encoded column by column:
# numpy for the fixed header fields, one C-level pass per field for the rest. Others take the general path.
COLUMNAR_MIN = 16
_COLUMNAR_MAX_QUEUES = 64           # distinct queue ids in one batch
_HDR_V4 = codec.header_v4_dtype()     # the IPv4 record header as a numpy record (codec.HEADER_V4)
_chop_cache: dict[tuple[int, int], struct.Struct] = {}


def chop(data: bytes, size: int, n: int) -> tuple[bytes, ...]:
    """data (n pieces of size bytes, back to back) as n bytes objects, in one C call."""
    s = _chop_cache.get((size, n))
    if s is None:
        if len(_chop_cache) > 64:
            _chop_cache.clear()
        s = _chop_cache[(size, n)] = struct.Struct(f"{size}s" * n)
    return s.unpack(data)


class NotColumnar(Exception):
    """This batch is for the general path (raised before anything was written or counted)."""


def int_column(values: list, n: int, bounds: tuple[int, int]):
    """A message field of the batch: a plain int if it is the same for all, else an int64 array."""
    if isinstance(values, np.ndarray):     # a numpy column (of a MessageBatch): taken as it is if int
        if values.dtype.kind not in "iu" or values.shape != (n,) or not n:
            raise NotColumnar
        if values.min() < bounds[0] or values.max() > bounds[1]:
            raise NotColumnar
        return values.astype(np.int64)
    v0 = values[0]
    if type(v0) is int and values[-1] == v0 and values.count(v0) == n:
        if bounds[0] <= v0 <= bounds[1]:
            return v0
        raise NotColumnar
    if set(map(type, values)) != _JUST_INT:
        raise NotColumnar      # floats, bools, None: the general path refuses or takes them one by one
    try:
        a = np.fromiter(values, np.int64, n)
    except OverflowError:
        raise NotColumnar from None
    if a.min() < bounds[0] or a.max() > bounds[1]:
        raise NotColumnar      # out of range: the general path refuses them one by one
    return a


def props_from_columns(names: list[str], columns: list, n: int):
    """PROPERTIES of n messages that share their property names: one str.join over the whole batch.
    columns[j] is names[j]'s value for every message: one str, or a sequence of n str."""
    # the fixed text between the per-message values: constant values (one str, or a column of one
    # value) go into it, so each message needs 1 + (number of varying columns) pieces
    fixed, varying = [""], []
    for j, name in enumerate(names):
        v = columns[j]
        if not isinstance(v, str) and v and type(v[0]) is str and v[-1] == v[0] and v.count(v[0]) == n:
            v = v[0]
        fixed[-1] += ("\x02" + name if j else name) + "\x01"
        if isinstance(v, str):
            fixed[-1] += v
        else:
            varying.append(v)
            fixed.append("")
    fixed[-1] += "\x02\x00"
    stride = 2 * len(varying) + 1
    parts: list = [None] * (stride * n)
    for j, v in enumerate(varying):
        parts[2 * j::stride] = [fixed[j]] * n
        parts[2 * j + 1::stride] = v
    parts[stride - 1::stride] = [fixed[-1]] * n
    raw = "".join(parts).encode()
    if "" in names:
        return None             # an empty name: the general path refuses the messages, naming it
    # the bytes below 3 are exactly each message's k \x01, k \x02 and its \x00 terminator; any other (a
    # separator or a NUL in a name or value) makes more: the general path refuses what must be refused,
    # message by message (validation.py). One vectorised count, ~10 ns a message.
    buf = np.frombuffer(raw, np.uint8)
    if np.count_nonzero(buf < 3) != (2 * len(names) + 1) * n:
        return None
    ends = np.flatnonzero(buf == 0)
    lens = np.empty(n, np.int64)
    lens[0] = ends[0]
    np.subtract(ends[1:], ends[:-1] + 1, out=lens[1:])
    return buf, 1, lens, lambda: raw.split(b"\x00")[:n]


def _props_of_pieces(pieces: list, n: int):
    buf = np.frombuffer(b"".join(pieces), np.uint8)
    return buf, 0, np.fromiter(map(len, pieces), np.int64, n), lambda: pieces


def props_of_dicts(dicts: list, n: int):
    """The PROPERTIES fields of a batch: (buffer, stride_pad, lengths, pieces).

    buffer holds them back to back, each followed by stride_pad separator bytes; pieces() gives them as
    a list of bytes. When every message has the same property names in the same order (a producer's
    messages do), they are built with one str.join over the whole batch instead of one per message.
    """
    d0 = dicts[0]
    try:
        if d0:
            names = list(d0)
            k = len(names)
            flat = list(chain.from_iterable(dicts))
            if len(flat) == k * n and flat == names * n:
                values = list(chain.from_iterable(map(dict.values, dicts)))
                out = props_from_columns(names, [values[j::k] for j in range(k)], n)
                if out is not None:
                    return out
        elif not any(dicts):
            return np.zeros(0, np.uint8), 0, np.zeros(n, np.int64), lambda: [b""] * n
    except TypeError:
        pass            # not all dicts, or names / values that are not str: encoded one by one
    pieces = [validation.encode_properties(d) if d else b"" for d in dicts]
    if str in set(map(type, pieces)):
        raise NotColumnar   # one to refuse: the general path says which
    return _props_of_pieces(pieces, n)


class EncodedBatch:
    """A columnar batch, encoded except for what the lock assigns (queue offset, physical offset, store
    timestamp). The records are either rows of one 2-D array (every record the same size) or pieces."""
    __slots__ = ("n", "sizes", "ends", "hdr", "rows", "bodies", "mids", "props", "keys", "codes", "rank",
                 "counts", "store_addr", "store_port", "id_prefix", "dispatch")



def encode_columns(n: int, topic: str, ti: tuple, born: tuple, store: tuple, queue_ids, sys_flags, flags, born_ts,
                   reconsume, prepared, props: tuple, bodies: list, max_message_size: int,
                   file_size: int) -> EncodedBatch | None:
    """Encode a batch column by column; None if a message must be refused (the general path says which).

    ti: the commitlog's (TOPICLENGTH + TOPIC, {queueId: "topic-queueId"}) of the topic; born, store: its
    (address, port, ..., msgId prefix) of the IPv4 hosts; the int fields: an int for all or an int64 array
    (int_column); props: what props_of_dicts answers.

    One function on purpose (issue 16 item 6's exception): it is the columnar path's whole byte layout, a
    field at a time, in the order of the record; its pieces share the batch's arrays, and split up they
    would be read apart from the layout they write. Hot: ~1 us per call amortised over the batch (the
    put_columns row of BENCHMARKS.md, ~2 us a message in all)."""
    props, pad, plens, pieces = props
    blens = np.fromiter(map(len, bodies), np.int64, n)
    crcs = np.fromiter(map(_crc32, bodies), np.int64, n)
    crcs &= 0x7FFFFFFF
    piece = ti[0]
    hsz = _HEADER_V4.size
    sizes = blens + plens + (hsz + len(piece) + 2)
    big = int(sizes.max())
    if big > max_message_size or big + _BLANK_MIN > file_size or int(plens.max()) > _MAX_PROPS:
        return None     # some message is refused: the general path says which

    # queue offsets: each message's rank among the earlier ones of its queue that take an offset
    # (prepared and rolled-back messages take none); the lock adds each queue's next offset
    take = scanner.is_dispatched(sys_flags)
    keys_of = ti[1]
    if isinstance(queue_ids, int):
        keys = [keys_of.get(queue_ids) or keys_of.setdefault(queue_ids, f"{topic}-{queue_ids}")]
        codes = None if isinstance(take, bool) else np.where(take, 0, 1).astype(np.int16)
    else:
        lo, hi = int(queue_ids.min()), int(queue_ids.max())
        if 0 <= lo and hi < _COLUMNAR_MAX_QUEUES:      # the usual queue ids: they are the codes
            uniq, codes = range(hi + 1), queue_ids.astype(np.int16)
        else:
            uniq, codes = np.unique(queue_ids, return_inverse=True)
            if len(uniq) > _COLUMNAR_MAX_QUEUES:
                return None
            uniq, codes = uniq.tolist(), codes.astype(np.int16)
        keys = [keys_of.get(q) or keys_of.setdefault(q, f"{topic}-{q}") for q in uniq]
        if take is False:
            codes[:] = len(keys)
        elif take is not True:
            codes[~take] = len(keys)        # a pseudo-queue whose offsets are all 0
    if codes is None:
        rank = np.arange(n) if take else np.zeros(n, np.int64)
        counts = [n if take else 0]
    else:
        order = np.argsort(codes, kind="stable")
        grouped = codes[order]
        rank = np.empty(n, np.int64)
        rank[order] = np.arange(n) - np.searchsorted(grouped, grouped)
        counts = np.bincount(codes, minlength=len(keys) + 1).tolist()
        if counts[len(keys)]:
            rank[codes == len(keys)] = 0

    b = EncodedBatch()
    b.dispatch = None
    b.n, b.sizes, b.ends = n, sizes, np.cumsum(sizes)
    b.keys, b.codes, b.rank, b.counts = keys, codes, rank, counts
    b.store_addr, b.store_port, b.id_prefix = store[0], store[1], store[4]
    blen0, plen0 = int(blens[0]), int(plens[0])
    if int(blens.min()) == int(blens.max()) and int(plens.min()) == plen0 == int(plens.max()):
        # every record the same size: rows of one array, the header written in place
        rs = int(sizes[0])
        rows = np.empty((n, rs), np.uint8)
        p = hsz
        if blen0:
            rows[:, p:p + blen0] = np.frombuffer(b"".join(bodies), np.uint8).reshape(n, blen0)
        p += blen0
        tl = np.frombuffer(piece + _pack_len(plen0), np.uint8)
        rows[:, p:p + len(tl)] = tl
        p += len(tl)
        if plen0:
            rows[:, p:] = props.reshape(n, plen0 + pad)[:, :plen0]
        hdr = np.ndarray((n,), _HDR_V4, rows, 0, (rs,))
        b.rows, b.bodies, b.mids, b.props = rows, None, None, None
    else:
        # pieces for one b"".join: header, body, TOPICLENGTH TOPIC PROPERTIESLENGTH, properties
        hdr = np.empty(n, _HDR_V4)
        mids = np.empty(n, [("topic", f"S{len(piece)}"), ("plen", ">i2")])
        mids["topic"] = piece
        mids["plen"] = plens
        b.rows, b.bodies, b.props = None, bodies, pieces()
        b.mids = chop(mids.tobytes(), len(piece) + 2, n)
    hdr["total"] = sizes
    hdr["magic"] = _MAGIC
    hdr["crc"] = crcs
    hdr["queue_id"] = queue_ids
    hdr["flag"] = flags
    hdr["sys_flag"] = sys_flags & ~0x30
    hdr["born_ts"] = born_ts
    hdr["born_addr"] = np.void(born[0])
    hdr["born_port"] = born[1]
    hdr["store_addr"] = np.void(store[0])
    hdr["store_port"] = store[1]
    hdr["reconsume"] = reconsume
    hdr["prepared"] = prepared
    hdr["body_len"] = blens
    b.hdr = hdr
    return b

