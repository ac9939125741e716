"""Vectorised parsing of commitlog records into Arrow record batches (numpy + pyarrow, no Spark).

Given a commitlog file as a numpy uint8 array and the positions of records in it, every field of
every record is extracted with numpy gathers (one per field, for all records at once) and the
variable-length parts (topic, body, properties) are cut out with one range gather each; properties
are parsed with Arrow compute kernels. No Python object is made per record, except when a batch
holds data the fast path cannot represent exactly (invalid UTF-8, a property key written twice):
those batches fall back to codec's own decoding, row by row, so the answer is always codec's.

The validity rule is the record scanner's (store/format/scanner.py: RecordColumns, walk_positions); a record
that fails it is reported, not parsed.
"""
from __future__ import annotations

import datetime as _dt
import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..store.format import codec, scanner
from ..store.format.scanner import Outcome

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
SPARK_TYPES = {"string": "string", "int32": "int", "int64": "long", "timestamp[us, tz=UTC]": "timestamp",
               "binary": "binary", "list<item: string>": "array<string>",
               "map<string, string>": "map<string,string>"}
COLUMNS = [n for n, _ in FIELDS]


def spark_ddl(columns=None) -> str:
    """The Spark schema (DDL) of the rows, or of the given columns (in COLUMNS order)."""
    return ", ".join(f"{n} {SPARK_TYPES[str(t)]}" for n, t in FIELDS if columns is None or n in columns)


def arrow_schema(columns=None) -> pa.Schema:
    return ARROW_SCHEMA if columns is None else pa.schema([f for f in ARROW_SCHEMA if f.name in columns])


SPARK_DDL = spark_ddl()
# Columns that are never null (IsNotNull filters on them are always true).
NEVER_NULL = frozenset(COLUMNS) - {"tags", "body"}

MIN_HEADER = codec.HEADER_V4.size            # 88

_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
_HEX_PAIRS = np.stack([_HEX[np.arange(256) >> 4], _HEX[np.arange(256) & 15]], axis=1).copy()  # (256, 2)
_HEX16 = _HEX_PAIRS.view(np.uint16).reshape(-1)     # byte -> its two hex digits as one 2-byte item
_SPAN8 = np.arange(8, dtype=np.int64)
EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


def _hex(raw: np.ndarray) -> np.ndarray:
    """Upper-case hex digits of the bytes raw (any shape), flat: one 2-byte lookup per byte (10x faster than
    gathering digit pairs from a (256, 2) table)."""
    return np.take(_HEX16, raw).view(np.uint8).reshape(-1)


# --- gathers -----------------------------------------------------------------------------------------
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
    """'ip:port' strings of the (address, 4-byte port) fields at starts; one Python call per distinct host.
    IPv4 hosts (8 bytes each, as most are) are told apart as one uint64 each."""
    if len(starts) and (alen == 4).all():
        both = scanner.gather_rows(buf, starts, np.uint64)
        if (both == both[0]).all():         # one host (a batch of one producer's, or one broker's, messages)
            uniq, inv = both[:1], None
        else:
            uniq, inv = np.unique(both, return_inverse=True)
        names = [codec.format_host(u[:4], int.from_bytes(u[4:], "big", signed=True))
                 for u in map(bytes, uniq.view(np.uint8).reshape(-1, 8))]
        if len(names) == 1:
            return _const_strings(names[0], len(starts))
        return pa.array(names, type=pa.string()).take(pa.array(inv.reshape(-1)))
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


def _key_twice(parent: np.ndarray, codes: np.ndarray, offs: np.ndarray, counts: np.ndarray) -> bool:
    """Whether a record names a key twice (parent: record of each pair, codes: key code of each pair, pairs
    grouped by record). Up to 63 distinct keys: one bit per key, summed and or-ed per record (they differ
    when a bit is there twice); beyond: a sort."""
    if int(codes.max()) < 63:
        bits = np.left_shift(np.uint64(1), codes.astype(np.uint64))
        starts = offs[:-1][counts > 0]
        return bool((np.add.reduceat(bits, starts) != np.bitwise_or.reduceat(bits, starts)).any())
    combo = parent * (int(codes.max()) + 1) + codes
    return len(np.unique(combo)) != len(combo)


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
        if _key_twice(parent, codes, offs, counts):
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
class Records(scanner.RecordColumns):
    """Fixed fields and layout of records at positions `pos` of `buf` (a commitlog file's bytes, whose
    first byte is commitlog offset `base`), computed with numpy for all records at once: the record
    scanner's RecordColumns (its `valid` is the record rule, without CRC; with `unit_size`, also RocketMQ
    getMessage's), plus the Arrow columns: `batch()` builds rows. Fields of invalid records are garbage.
    """

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
        if n and (self.store_alen == 4).all():      # IPv4 store hosts: 16 bytes each, one 2-D gather
            raw = np.concatenate([self.buf[self.store_host_pos[:, None] + _SPAN8],
                                  self.buf[(self.pos + codec.POS_PHYSICALOFFSET)[:, None] + _SPAN8]], axis=1)
            hexed = _hex(raw)
            offs = np.arange(0, 32 * (n + 1), 32, dtype=np.int32)
            return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offs), pa.py_buffer(hexed)])
        starts = np.stack([self.store_host_pos, self.pos + codec.POS_PHYSICALOFFSET], axis=1).reshape(-1)
        lens = np.stack([self.store_alen + 4, np.full(n, 8, dtype=np.int64)], axis=1).reshape(-1)
        idx, offs = ranges_index(starts, lens)
        raw = self.buf[idx] if len(idx) else np.empty(0, dtype=np.uint8)
        hexed = _hex(raw)
        row_offs = (offs[::2] * 2).astype(np.int32)
        return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(row_offs), pa.py_buffer(hexed)])

    def batch(self, broker: str, include_body: bool = True, props: Props | None = None,
              topics: pa.Array | None = None, columns: tuple | None = None) -> pa.RecordBatch:
        """The rows of these records (which must all be valid), in ARROW_SCHEMA, or only the given columns
        (arrow_schema(columns)): the others are not decoded at all."""
        n = len(self.pos)
        i32 = lambda a: pa.array(a.astype(np.int32), type=pa.int32())   # noqa: E731
        i64 = lambda a: pa.array(a, type=pa.int64())                    # noqa: E731
        ts = lambda a: pa.array(a * 1000, type=pa.timestamp("us", tz="UTC"))  # noqa: E731
        if props is None and (columns is None or {"tags", "keys", "properties"} & set(columns)):
            props = self.properties()
        make = {
            "topic": lambda: topics if topics is not None else self.topics(),
            "queueId": lambda: i32(self.queue_id), "queueOffset": lambda: i64(self.queue_offset),
            "commitLogOffset": lambda: i64(self.phys), "storeSize": lambda: i32(self.total),
            "bodyCRC": lambda: i32(self.body_crc), "flag": lambda: i32(self.flag),
            "sysFlag": lambda: i32(self.sys_flag), "bornTimestamp": lambda: ts(self.born_ts),
            "storeTimestamp": lambda: ts(self.store_ts),
            "bornHost": lambda: _hosts(self.buf, self.born_host_pos, self.born_alen),
            "storeHost": lambda: _hosts(self.buf, self.store_host_pos, self.store_alen),
            "reconsumeTimes": lambda: i32(self.reconsume), "preparedTransactionOffset": lambda: i64(self.prepared),
            "msgId": self.msg_ids, "body": lambda: self.bodies() if include_body else pa.nulls(n, pa.binary()),
            "tags": lambda: props.tags, "keys": lambda: props.keys, "properties": lambda: props.map,
            "broker": lambda: _const_strings(broker, n),
        }
        schema = arrow_schema(columns)
        return pa.RecordBatch.from_arrays([make[f.name]() for f in schema], schema=schema)


# --- walking a commitlog file ------------------------------------------------------------------------
_WHY = {Outcome.END_OF_FILE: "blank", Outcome.END_OF_DATA: "end", Outcome.INVALID: "invalid"}


def walk(mm, start: int, limit: int) -> tuple[np.ndarray, int, str]:
    """Old form of scanner.walk_positions, its outcome as "blank" / "end" / "invalid" (kept for callers
    not yet moved to the scanner's Outcome)."""
    positions, stop, why = scanner.walk_positions(mm, start, limit)
    return positions, stop, _WHY[why]


def ms_from_datetime(value) -> float:
    """A filter value (datetime, date, or number of ms) as epoch milliseconds (a float: sub-ms exact)."""
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        return (value - EPOCH) / _dt.timedelta(microseconds=1) / 1000.0
    if isinstance(value, _dt.date):
        return ms_from_datetime(_dt.datetime(value.year, value.month, value.day, tzinfo=_dt.timezone.utc))
    return float(value)
