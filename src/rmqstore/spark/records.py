"""Vectorised parsing of commitlog records into Arrow record batches (numpy + pyarrow, no Spark).

Given a commitlog file as a numpy uint8 array and the positions of records in it, every field of
every record is extracted with numpy gathers (one per field, for all records at once) and the
variable-length parts (topic, body, properties) are cut out with one range gather each; properties
are parsed with Arrow compute kernels. No Python object is made per record, except when a batch
holds data the fast path cannot represent exactly (invalid UTF-8, a property key written twice):
those batches fall back to codec's own decoding, row by row, so the answer is always codec's.

The validity rules are codec.check_record's (a record that fails them is reported, not parsed).
"""
from __future__ import annotations

import datetime as _dt
import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..store import codec

log = logging.getLogger(__name__)

# --- the rows' schema ------------------------------------------------------------------------------
FIELDS = [
    ("topic", pa.string()), ("queueId", pa.int32()), ("queueOffset", pa.int64()),
    ("commitLogOffset", pa.int64()), ("storeSize", pa.int32()), ("bodyCRC", pa.int32()),
    ("flag", pa.int32()), ("sysFlag", pa.int32()),
    ("bornTimestamp", pa.timestamp("us", tz="UTC")), ("storeTimestamp", pa.timestamp("us", tz="UTC")),
    ("bornHost", pa.string()), ("storeHost", pa.string()), ("reconsumeTimes", pa.int32()),
    ("preparedTransactionOffset", pa.int64()), ("msgId", pa.string()), ("body", pa.binary()),
    ("tags", pa.string()), ("keys", pa.list_(pa.string())), ("properties", pa.map_(pa.string(), pa.string())),
    ("broker", pa.string()),
]
ARROW_SCHEMA = pa.schema([pa.field(n, t, nullable=True) for n, t in FIELDS])
SPARK_DDL = ("topic string, queueId int, queueOffset long, commitLogOffset long, storeSize int, bodyCRC int, "
             "flag int, sysFlag int, bornTimestamp timestamp, storeTimestamp timestamp, bornHost string, "
             "storeHost string, reconsumeTimes int, preparedTransactionOffset long, msgId string, body binary, "
             "tags string, keys array<string>, properties map<string,string>, broker string")
COLUMNS = [n for n, _ in FIELDS]
# Columns that are never null (IsNotNull filters on them are always true).
NEVER_NULL = frozenset(COLUMNS) - {"tags", "body"}

_MAGIC1 = codec.MESSAGE_MAGIC_CODE
_MAGIC2 = codec.MESSAGE_MAGIC_CODE_V2
_BLANK = codec.BLANK_MAGIC_CODE
_TRAN_MASK = codec.TRANSACTION_TYPE_MASK
MIN_HEADER = codec.HEADER_V4.size            # 88
_AR = {n: np.arange(n, dtype=np.int64) for n in (1, 2, 4, 8, 16, 20)}

_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
_HEX_PAIRS = np.stack([_HEX[np.arange(256) >> 4], _HEX[np.arange(256) & 15]], axis=1).copy()  # (256, 2)
EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


# --- gathers -----------------------------------------------------------------------------------------
def _be(buf: np.ndarray, pos: np.ndarray, n: int, signed: bool = True) -> np.ndarray:
    """Big-endian integers of n bytes at each position (positions must be in bounds), as int64."""
    if len(pos) == 0:
        return np.empty(0, dtype=np.int64)
    if n == 1:
        return buf[pos].astype(np.int64)
    m = buf[pos[:, None] + _AR[n]]
    dt = (">i" if signed else ">u") + str(n)
    return m.view(dt).reshape(-1).astype(np.int64)


def ranges_index(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The flat index of the concatenated ranges [start, start + length), and the offsets of each range
    in it (len(starts) + 1 values)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    offs = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offs[1:])
    total = int(offs[-1])
    if total == 0:
        return np.empty(0, dtype=np.int64), offs
    idx = np.arange(total, dtype=np.int64)
    idx += np.repeat(np.asarray(starts, dtype=np.int64) - offs[:-1], lengths)
    return idx, offs


def _bytes_array(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray, typ: pa.DataType) -> pa.Array:
    """The byte ranges [start, start + length) of buf as a binary (or string) array, in the given order.

    The ranges must not overlap (fields of distinct records). No index per byte is built: buf itself
    becomes the values of an array whose elements alternate between the ranges and the gaps between
    them (zero copy), and Arrow's take copies out the ranges."""
    n = len(starts)
    if n == 0:
        return pa.array([], type=typ)
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    if n > 1 and not (np.diff(starts) >= 0).all():
        order = np.argsort(starts, kind="stable")
    else:
        order = None
    s = starts if order is None else starts[order]
    e = s + (lengths if order is None else lengths[order])
    lo = int(s[0])
    hi = int(e.max())
    if hi - lo >= 2 ** 31 or len(buf) < hi:
        idx, offs = ranges_index(starts, lengths)
        if offs[-1] >= 2 ** 31:
            raise ValueError("a batch of more than 2 GiB of variable-length data")
        return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(offs.astype(np.int32)), pa.py_buffer(buf[idx])])
    bounds = np.empty(2 * n, dtype=np.int64)
    bounds[0::2] = s - lo
    bounds[1::2] = e - lo
    if n > 1 and not (bounds[2::2] >= bounds[1:-1:2]).all():      # overlapping ranges: copy them out
        idx, offs = ranges_index(starts, lengths)
        return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(offs.astype(np.int32)), pa.py_buffer(buf[idx])])
    alt = pa.Array.from_buffers(pa.binary(), 2 * n - 1, [None, pa.py_buffer(bounds.astype(np.int32)),
                                                         pa.py_buffer(buf[lo:hi])])
    pick = np.arange(0, 2 * n, 2, dtype=np.int64)
    if order is not None:
        inv = np.empty(n, dtype=np.int64)
        inv[order] = np.arange(n, dtype=np.int64)
        pick = pick[inv]
    out = alt.take(pa.array(pick))
    return out if typ == pa.binary() else out.view(typ)


def _strings(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[pa.Array, bool]:
    """UTF-8 strings cut from buf; (array, ok). ok is False when some bytes are not UTF-8 (the array is
    then decoded row by row with replacement characters, as codec does)."""
    arr = _bytes_array(buf, starts, lengths, pa.string())
    try:
        arr.validate(full=True)
        return arr, True
    except pa.ArrowInvalid:
        raw = _bytes_array(buf, starts, lengths, pa.binary()).to_pylist()
        return pa.array([b.decode("utf-8", "replace") for b in raw], type=pa.string()), False


def _const_strings(value: str, n: int) -> pa.Array:
    raw = value.encode("utf-8")
    offs = (np.arange(n + 1, dtype=np.int64) * len(raw)).astype(np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offs), pa.py_buffer(raw * n)])


def _hosts(buf: np.ndarray, starts: np.ndarray, alen: np.ndarray) -> pa.Array:
    """'ip:port' strings of the (address, 4-byte port) fields at starts; one Python call per distinct host."""
    raw = _bytes_array(buf, starts, alen + 4, pa.binary())
    enc = pc.dictionary_encode(raw)
    uniq = enc.dictionary.to_pylist()
    names = pa.array([codec.format_host(u[:-4], int.from_bytes(u[-4:], "big", signed=True)) for u in uniq],
                     type=pa.string())
    return names.take(enc.indices)


# --- properties ------------------------------------------------------------------------------------
@dataclass
class Props:
    """Parsed properties of n records: the map column plus TAGS, KEYS and UNIQ_KEY."""
    map: pa.Array
    tags: pa.Array          # string, null when absent
    keys: pa.Array          # list<string>: KEYS split on spaces, empty words dropped
    uniq: pa.Array          # string, null when absent


def _last_value_of(name: str, k: pa.Array, v: pa.Array, parent: np.ndarray, n: int) -> pa.Array:
    """Per record, the value of the last pair named `name` (codec.string_to_properties keeps the last)."""
    idx = np.flatnonzero(pc.equal(k, name).to_numpy(zero_copy_only=False))
    out = np.full(n, -1, dtype=np.int64)
    if len(idx):
        p = parent[idx]
        last = np.ones(len(idx), dtype=bool)
        last[:-1] = p[1:] != p[:-1]
        out[p[last]] = idx[last]
    return v.take(pa.array(out, mask=out < 0))


def parse_properties(props: pa.Array) -> Props:
    """codec.string_to_properties over a string array, vectorised."""
    n = len(props)
    items = pc.split_pattern(props, "\x02")
    flat = items.flatten()
    parent = np.asarray(pc.list_parent_indices(items), dtype=np.int64)
    keep = np.asarray(pc.and_(pc.not_equal(flat, ""), pc.match_substring(flat, "\x01")).to_numpy(zero_copy_only=False))
    flat = flat.filter(pa.array(keep))
    parent = parent[keep]
    kv = pc.split_pattern(flat, "\x01", max_splits=1)
    k = pc.list_element(kv, 0)
    v = pc.list_element(kv, 1)
    counts = np.bincount(parent, minlength=n) if len(parent) else np.zeros(n, dtype=np.int64)
    offs = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offs[1:])
    if len(parent):
        # A key written twice: codec keeps one entry (the last value). Rare: decode those batches by row.
        codes = np.asarray(pc.dictionary_encode(k).indices, dtype=np.int64)
        combo = parent * (int(codes.max()) + 1) + codes
        if len(np.unique(combo)) != len(combo):
            return _parse_properties_slow(props)
    m = pa.MapArray.from_arrays(pa.array(offs.astype(np.int32)), k, v)
    keys_val = _last_value_of(codec.PROPERTY_KEYS, k, v, parent, n)
    return Props(m, _last_value_of(codec.PROPERTY_TAGS, k, v, parent, n), _split_keys(keys_val),
                 _last_value_of(codec.PROPERTY_UNIQ_KEY, k, v, parent, n))


def _split_keys(keys_val: pa.Array) -> pa.Array:
    n = len(keys_val)
    words = pc.split_pattern(keys_val, codec.KEY_SEPARATOR)
    flat = words.flatten()
    parent = np.asarray(pc.list_parent_indices(words), dtype=np.int64)
    keep = pc.not_equal(flat, "").to_numpy(zero_copy_only=False)
    flat = flat.filter(pa.array(keep))
    parent = parent[keep]
    counts = np.bincount(parent, minlength=n) if len(parent) else np.zeros(n, dtype=np.int64)
    offs = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offs[1:])
    return pa.ListArray.from_arrays(pa.array(offs.astype(np.int32)), flat, type=pa.list_(pa.string()))


def _parse_properties_slow(props: pa.Array) -> Props:
    dicts = [codec.string_to_properties(s) for s in props.to_pylist()]
    kw = [[k for k in d.get(codec.PROPERTY_KEYS, "").split(codec.KEY_SEPARATOR) if k] for d in dicts]
    return Props(pa.array([list(d.items()) for d in dicts], type=pa.map_(pa.string(), pa.string())),
                 pa.array([d.get(codec.PROPERTY_TAGS) for d in dicts], type=pa.string()),
                 pa.array(kw, type=pa.list_(pa.string())),
                 pa.array([d.get(codec.PROPERTY_UNIQ_KEY) for d in dicts], type=pa.string()))


# --- record headers --------------------------------------------------------------------------------
class Records:
    """Fixed fields and layout of records at positions `pos` of `buf` (a commitlog file's bytes, whose
    first byte is commitlog offset `base`), computed with numpy for all records at once.

    `valid` says which records are whole and consistent (codec.check_record's rules, without CRC; with
    `unit_size`, also RocketMQ getMessage's: the unit's bytes are readable and hold the whole record).
    Fields of invalid records are garbage. `select(mask)` keeps some records; `batch()` builds rows.
    """

    def __init__(self, buf: np.ndarray, base: int, pos: np.ndarray, limit: int | None = None,
                 unit_size: np.ndarray | None = None):
        self.buf = buf
        self.base = base
        limit = len(buf) if limit is None else min(limit, len(buf))
        pos = np.asarray(pos, dtype=np.int64)
        self.pos = pos
        n = len(pos)
        ok = (pos >= 0) & (pos + MIN_HEADER <= limit)
        if unit_size is not None:
            ok &= (unit_size > 0) & (pos + unit_size <= limit)
        # Clamped positions keep every gather in bounds; the rows they stand for are marked invalid.
        top = max(limit - MIN_HEADER, 0)
        p = np.clip(pos, 0, top) if n and len(buf) >= MIN_HEADER else np.zeros(n, dtype=np.int64)
        if len(buf) < MIN_HEADER:
            ok[:] = False
            buf = self.buf = np.zeros(MIN_HEADER + 64, dtype=np.uint8)
            limit = 0
        self.total = _be(buf, p, 4)
        magic = _be(buf, p + 4, 4, signed=False)
        self.magic = magic
        ok &= (magic == _MAGIC1) | (magic == _MAGIC2)
        self.body_crc = _be(buf, p + 8, 4)
        self.queue_id = _be(buf, p + 12, 4)
        self.flag = _be(buf, p + 16, 4)
        self.queue_offset = _be(buf, p + 20, 8)
        self.phys = _be(buf, p + 28, 8)
        self.sys_flag = _be(buf, p + 36, 4)
        self.born_ts = _be(buf, p + 40, 8)
        born_alen = np.where(self.sys_flag & codec.SYSFLAG_BORNHOST_V6, 16, 4)
        store_alen = np.where(self.sys_flag & codec.SYSFLAG_STOREHOST_V6, 16, 4)
        hs = MIN_HEADER + (born_alen - 4) + (store_alen - 4)
        ok &= pos + hs <= limit
        if unit_size is not None:
            ok &= self.total <= unit_size
        ok &= (self.total >= hs + 3) & (pos + self.total <= limit)
        def at(q, width):            # a position clamped so that `width` bytes from it are in bounds
            return np.clip(q, 0, max(limit - width, 0))
        self.born_host_pos = p + 48
        self.born_alen = born_alen
        sts = p + 48 + born_alen + 4
        self.store_ts = _be(buf, at(sts, 8), 8)
        self.store_host_pos = sts + 8
        self.store_alen = store_alen
        rc = self.store_host_pos + store_alen + 4
        self.reconsume = _be(buf, at(rc, 4), 4)
        self.prepared = _be(buf, at(rc + 4, 8), 8)
        self.body_len = _be(buf, at(rc + 12, 4), 4)
        self.body_pos = rc + 16
        tl_pos = self.body_pos + self.body_len
        end = pos + self.total
        v2 = magic == _MAGIC2
        ok &= (self.body_len >= 0) & (tl_pos + 3 <= end)
        topic_len = np.where(v2, _be(buf, at(tl_pos, 2), 2, signed=False), _be(buf, at(tl_pos, 1), 1))
        ok &= v2 | (topic_len <= codec.MAX_TOPIC_LENGTH)
        self.topic_pos = tl_pos + np.where(v2, 2, 1)
        self.topic_len = topic_len
        pl_pos = self.topic_pos + topic_len
        ok &= pl_pos + 2 <= end
        self.props_len = _be(buf, at(pl_pos, 2), 2)
        self.props_pos = pl_pos + 2
        ok &= (self.props_len >= 0) & (self.props_pos + self.props_len == end)
        self.valid = ok
        self.limit = limit

    def __len__(self) -> int:
        return len(self.pos)

    @property
    def offsets(self) -> np.ndarray:
        """Commitlog offset of each record (where it is, not what its PHYSICALOFFSET field says)."""
        return self.pos + self.base

    def select(self, mask) -> "Records":
        """A view on the records where mask is true (an index array works too)."""
        out = object.__new__(Records)
        for k, v in self.__dict__.items():
            out.__dict__[k] = v[mask] if isinstance(v, np.ndarray) and v.ndim == 1 and k != "buf" else v
        return out

    def slice(self, a: int, b: int) -> "Records":
        return self.select(slice(a, b))

    def topics(self) -> pa.Array:
        arr, _ = _strings(self.buf, self.topic_pos, self.topic_len)
        return arr

    def properties(self) -> Props:
        arr, _ = _strings(self.buf, self.props_pos, self.props_len)
        return parse_properties(arr)

    def bodies(self) -> pa.Array:
        return _bytes_array(self.buf, self.body_pos, self.body_len, pa.binary())

    def msg_ids(self) -> pa.Array:
        """codec.create_message_id: store address + port + PHYSICALOFFSET, upper-case hex."""
        n = len(self.pos)
        starts = np.stack([self.store_host_pos, self.pos + codec.POS_PHYSICALOFFSET], axis=1).reshape(-1)
        lens = np.stack([self.store_alen + 4, np.full(n, 8, dtype=np.int64)], axis=1).reshape(-1)
        idx, offs = ranges_index(starts, lens)
        raw = self.buf[idx] if len(idx) else np.empty(0, dtype=np.uint8)
        hexed = _HEX_PAIRS[raw].reshape(-1)
        row_offs = (offs[::2] * 2).astype(np.int32)
        return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(row_offs), pa.py_buffer(hexed)])

    def batch(self, broker: str, include_body: bool = True, props: Props | None = None,
              topics: pa.Array | None = None) -> pa.RecordBatch:
        """The rows of these records (which must all be valid), in ARROW_SCHEMA."""
        n = len(self.pos)
        i32 = lambda a: pa.array(a.astype(np.int32), type=pa.int32())   # noqa: E731
        i64 = lambda a: pa.array(a, type=pa.int64())                    # noqa: E731
        ts = lambda a: pa.array(a * 1000, type=pa.timestamp("us", tz="UTC"))  # noqa: E731
        props = props if props is not None else self.properties()
        cols = [
            topics if topics is not None else self.topics(), i32(self.queue_id), i64(self.queue_offset),
            i64(self.phys), i32(self.total), i32(self.body_crc), i32(self.flag), i32(self.sys_flag),
            ts(self.born_ts), ts(self.store_ts),
            _hosts(self.buf, self.born_host_pos, self.born_alen), _hosts(self.buf, self.store_host_pos, self.store_alen),
            i32(self.reconsume), i64(self.prepared), self.msg_ids(),
            self.bodies() if include_body else pa.nulls(n, pa.binary()),
            props.tags, props.keys, props.map, _const_strings(broker, n),
        ]
        return pa.RecordBatch.from_arrays(cols, schema=ARROW_SCHEMA)


# --- walking a commitlog file ------------------------------------------------------------------------
_II = codec._II


def walk(mm, start: int, limit: int) -> tuple[np.ndarray, int, str]:
    """Record positions from `start` (a record boundary) in a commitlog file's bytes, by their TOTALSIZE
    fields alone; the rest of each record is checked afterwards, vectorised (Records.valid).

    Returns (positions, stop position, why): why is "blank" (an END_OF_FILE record at the stop
    position), "end" (zeros or the limit: the data ends), or "invalid" (a record that cannot be one).
    """
    out = []
    append = out.append
    unpack = _II.unpack_from
    pos = start
    why = "end"
    while pos + 8 <= limit:
        total, magic = unpack(mm, pos)
        if magic == _BLANK:
            why = "blank"
            break
        if magic != _MAGIC1 and magic != _MAGIC2:
            if total != 0 or magic != 0:
                why = "invalid"
            break
        if total < MIN_HEADER + 3 or pos + total > limit:
            why = "invalid"
            break
        append(pos)
        pos += total
    return np.array(out, dtype=np.int64), pos, why


def ms_from_datetime(value) -> float:
    """A filter value (datetime, date, or number of ms) as epoch milliseconds (a float: sub-ms exact)."""
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        return (value - EPOCH) / _dt.timedelta(microseconds=1) / 1000.0
    if isinstance(value, _dt.date):
        return ms_from_datetime(_dt.datetime(value.year, value.month, value.day, tzinfo=_dt.timezone.utc))
    return float(value)
