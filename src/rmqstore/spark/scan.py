"""Partitions of a read and how a task reads one (no Spark needed: `read_partition` yields Arrow batches).

Three kinds of partition:

* queue: slices (topic, queue, [a, b)) of consume queues: the units are read from the consume queue files
  (numpy over the 20-byte units) or from the view's tail, the records they point at are parsed in batch;
* commitlog: a range of one commitlog file, walked record by record (the walk reads only TOTALSIZE;
  everything else is parsed in batch);
* offsets: records at given commitlog offsets (key lookups answered by the index).

A store on a remote filesystem (StoreRef.fs, store.files.store_fs) is read with ranged reads instead of mmap:
the spans of each commitlog file the records of a queue slice lie in (store_fs.read_spans), a commitlog
range REMOTE_CHUNK bytes per read, consume queue units likewise (QueueView.units). Every record is checked
as a local one is (Records.valid, then BODYCRC with checkCRC), so a damaged copy is data loss, never rows.

Pushed filters travel with the partition as plain conditions and are applied exactly to the rows (Spark
does not re-check the filters a source claims).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..filter import compile_sql92
from ..store.files import store_fs
from ..store.format import codec, scanner
from ..store.format.scanner import Outcome
from . import records as R
from . import storeview as SV
from .loss import data_loss, describe

log = logging.getLogger(__name__)

try:  # Spark is optional for the local engine
    from pyspark.sql.datasource import InputPartition as _Base
except ImportError:  # pragma: no cover
    class _Base:  # type: ignore[no-redef]
        def __init__(self, value=None):
            self.value = value

BATCH_ROWS = 8192
BATCH_BYTES = 32 << 20
REMOTE_CHUNK = 16 << 20      # a remote commitlog range is fetched this many bytes at a time

# Columns whose values are fixed header fields: name -> Records attribute (timestamps in ms).
NUMERIC = {
    "queueId": "queue_id", "queueOffset": "queue_offset", "commitLogOffset": "phys", "storeSize": "total",
    "bodyCRC": "body_crc", "flag": "flag", "sysFlag": "sys_flag", "reconsumeTimes": "reconsume",
    "preparedTransactionOffset": "prepared", "bornTimestamp": "born_ts", "storeTimestamp": "store_ts",
}
TIMESTAMPS = {"bornTimestamp", "storeTimestamp"}
STRINGS = {"topic", "tags", "broker"}


@dataclass(frozen=True)
class Cond:
    """A pushed filter: column op value (op: eq, in, ne, nin, gt, ge, lt, le; timestamps in microseconds)."""
    col: str
    op: str
    value: object

    def test_scalar(self, v) -> bool:
        op, x = self.op, self.value
        if op == "eq":
            return v == x
        if op == "in":
            return v in x
        if op == "ne":
            return v != x
        if op == "nin":
            return v not in x
        if op == "gt":
            return v > x
        if op == "ge":
            return v >= x
        if op == "lt":
            return v < x
        return v <= x

    def mask(self, arr: np.ndarray) -> np.ndarray:
        op, x = self.op, self.value
        if op == "eq":
            return arr == x
        if op == "in":
            return np.isin(arr, np.asarray(list(x)))
        if op == "ne":
            return arr != x
        if op == "nin":
            return ~np.isin(arr, np.asarray(list(x)))
        if op == "gt":
            return arr > x
        if op == "ge":
            return arr >= x
        if op == "lt":
            return arr < x
        return arr <= x


def bounds(conds: list[Cond], col: str) -> tuple[float, float, bool, bool]:
    """(low, high, low inclusive, high inclusive) implied by the conditions on col (ranges and eq)."""
    lo, hi, lo_inc, hi_inc = -np.inf, np.inf, True, True
    for c in conds:
        if c.col != col or c.op in ("ne", "nin"):
            continue
        vals = [c.value] if c.op in ("eq", "gt", "ge", "lt", "le") else list(c.value)
        if not vals:
            return np.inf, -np.inf, False, False
        if c.op in ("eq", "in"):
            a, b = min(vals), max(vals)
            if a > lo or (a == lo and not lo_inc):
                lo, lo_inc = a, True
            if b < hi or (b == hi and not hi_inc):
                hi, hi_inc = b, True
        elif c.op in ("gt", "ge"):
            if c.value > lo or (c.value == lo and c.op == "gt"):
                lo, lo_inc = c.value, c.op == "ge"
        else:
            if c.value < hi or (c.value == hi and c.op == "lt"):
                hi, hi_inc = c.value, c.op == "le"
    return lo, hi, lo_inc, hi_inc


def _floor_div(v, scale: int) -> int:
    if isinstance(v, (int, np.integer)):
        return int(v) // scale
    return math.floor(v / scale)


def _ceil_div(v, scale: int) -> int:
    if isinstance(v, (int, np.integer)):
        return -(-int(v) // scale)
    return math.ceil(v / scale)


def int_range(conds: list[Cond], col: str, scale: int = 1) -> tuple[int | None, int | None]:
    """[a, b) over the integers x whose x * scale meets the conditions on col (scale 1000: a timestamp
    column in microseconds, x in ms); None for an open end. Exact for ranges and eq/in bounds."""
    lo, hi, lo_inc, hi_inc = bounds(conds, col)
    a = b = None
    if lo != -np.inf:
        a = _ceil_div(lo, scale) if lo_inc else _floor_div(lo, scale) + 1
    if hi != np.inf:
        b = _floor_div(hi, scale) + 1 if hi_inc else _ceil_div(hi, scale)
    return a, b


# --- partitions ---------------------------------------------------------------------------------------
@dataclass
class StoreRef:
    """What a task needs of a store: its commitlog files and where the data ends."""
    root: str
    broker: str
    cl_files: list[tuple[int, str, int]]
    cl_file_size: int
    data_end: int | None
    fs: store_fs.RemoteStore | None = None     # not a local store: read with ranged reads
    clean: bool = True                         # no abort file
    tail_base: int | None = None               # plan.data_tail: the last file holding data (a store read as it is)
    deleted: tuple = ()         # (topic, queue id, below): a deleted queue's records below are no rows

    @classmethod
    def of(cls, view: SV.StoreView) -> "StoreRef":
        return cls(view.root, view.broker, [(f.base, f.path, f.size) for f in view.cl_files], view.cl_file_size,
                   view.data_end, view.fs, view.clean,
                   deleted=tuple((t, q, b) for (t, q), b in sorted(view.deleted.items())))

    @property
    def last_base(self) -> int:
        """The base of the file where the commitlog's data ends: a walk may stop short there (not loss)."""
        if self.tail_base is not None:
            return self.tail_base
        return self.cl_files[-1][0] if self.cl_files else -1

    def file_index(self, offsets: np.ndarray) -> np.ndarray:
        bases = np.array([b for b, _, _ in self.cl_files], dtype=np.int64)
        if not len(bases):
            return np.full(len(offsets), -1, dtype=np.int64)
        return np.searchsorted(bases, offsets, side="right") - 1


class Partition(_Base):
    fail_on_data_loss = True          # set by the planner from the option failOnDataLoss
    loss_counter = None               # and the session's skipped-data accumulator (loss.py)
    check_crc = False                 # option checkCRC: bodies returned are checked against BODYCRC
    columns = None                    # option columns: the only columns built (None: all)
    selector = None                   # option messageSelector: the SQL92 selector rows must match (text)
    selection = None                  # mode=commitlog: (topics, pattern, queue ids, assign) of options topics /
                                      # subscribePattern / queueIds, applied to the rows (None: every record)

    def __init__(self, kind: str, store: StoreRef, items: list, conds: list[Cond], include_body: bool = True,
                 key: str | None = None, key_topics: frozenset | None = None, rows: int = 0):
        super().__init__(None)
        self.kind = kind
        self.store = store
        self.items = items
        self.conds = conds
        self.include_body = include_body
        self.key = key
        self.key_topics = key_topics
        self.rows = rows

    def __repr__(self) -> str:
        return f"Partition({self.kind}, {self.store.broker}, {len(self.items)} items, ~{self.rows} rows)"


# --- reading ------------------------------------------------------------------------------------------
def selector_mask(selector: str, props: R.Props, n: int) -> np.ndarray:
    """Which of n records an SQL92 selector delivers (RocketMQ's rules: rmqstore.filter), from the property
    map column: each property it reads looked up once per batch, each distinct combination judged once."""
    compiled = compile_sql92(selector)
    cols = {name: pc.map_lookup(props.map, pa.scalar(name), "last").to_pylist() for name in compiled.properties}
    return np.fromiter(compiled.matches_columns(cols, n), dtype=bool, count=n)


def _header_mask(recs: R.Records, conds: list[Cond]) -> np.ndarray | None:
    m = None
    for c in conds:
        attr = NUMERIC.get(c.col)
        if attr is None:
            continue
        arr = getattr(recs, attr)
        if c.col in TIMESTAMPS:
            arr = arr * 1000                    # the column is in microseconds
        cm = c.mask(arr)
        m = cm if m is None else (m & cm)
    return m


def _string_mask(arr: pa.Array, c: Cond) -> np.ndarray:
    if c.op in ("eq", "ne"):
        got = pc.equal(arr, c.value)
    elif c.op in ("in", "nin"):
        got = pc.is_in(arr, value_set=pa.array(list(c.value), type=pa.string()))
    else:
        got = {"gt": pc.greater, "ge": pc.greater_equal, "lt": pc.less, "le": pc.less_equal}[c.op](arr, c.value)
    hit = np.asarray(pc.fill_null(got, False).to_numpy(zero_copy_only=False), dtype=bool)
    if c.op in ("ne", "nin"):      # SQL: a null value passes neither the test nor its negation
        return ~hit & np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    return hit


def _filter_props(p: R.Props, mask: np.ndarray) -> R.Props:
    m = pa.array(mask)
    return R.Props(p.map.filter(m), p.tags.filter(m), p.keys.filter(m), p.uniq.filter(m))


def _has_key(props: R.Props, key: str) -> np.ndarray:
    """find_messages_by_key's check: key is one of the KEYS words, or the UNIQ_KEY."""
    n = len(props.keys)
    flat = props.keys.flatten()
    parent = np.asarray(pc.list_parent_indices(props.keys), dtype=np.int64)
    hit = np.zeros(n, dtype=bool)
    eq = np.asarray(pc.fill_null(pc.equal(flat, key), False).to_numpy(zero_copy_only=False), dtype=bool)
    hit[parent[eq]] = True
    hit |= np.asarray(pc.fill_null(pc.equal(props.uniq, key), False).to_numpy(zero_copy_only=False), dtype=bool)
    return hit


def _key_bytes_mask(recs: R.Records, key: str) -> np.ndarray:
    """Records whose properties bytes contain the key's bytes (a cheap superset of the key check)."""
    n = len(recs)
    if not n:
        return np.zeros(0, dtype=bool)
    needle = key.encode("utf-8")
    buf = recs.buf
    lo = int(recs.pos.min())
    hi = int((recs.pos + recs.total).max())
    hay = buf[lo:hi].tobytes()
    hits = []
    i = hay.find(needle)
    while i >= 0:
        hits.append(i + lo)
        i = hay.find(needle, i + 1)
    if not hits:
        return np.zeros(n, dtype=bool)
    h = np.asarray(hits, dtype=np.int64)
    order = np.argsort(recs.props_pos, kind="stable")
    starts = recs.props_pos[order]
    ends = starts + recs.props_len[order]
    j = np.searchsorted(starts, h, side="right") - 1
    ok = (j >= 0)
    j = np.where(ok, j, 0)
    ok &= h + len(needle) <= ends[j]
    out = np.zeros(n, dtype=bool)
    out[order[j[ok]]] = True
    return out


def _deleted_mask(recs: R.Records, deleted: tuple) -> np.ndarray | None:
    """The records of deleted queues' old generations (deleteTopic: below the recorded commitlog offset),
    or None when there are none among recs."""
    qids = np.fromiter({q for _, q, _ in deleted}, np.int64)
    maybe = np.isin(recs.queue_id, qids) & (recs.phys < max(b for _, _, b in deleted))
    if not maybe.any():
        return None
    enc = pc.dictionary_encode(recs.topics())
    tid = {t: i for i, t in enumerate(enc.dictionary.to_pylist())}
    codes = enc.indices.to_numpy(zero_copy_only=False)
    m = np.zeros(len(recs), dtype=bool)
    for t, q, below in deleted:
        if t in tid:
            m |= maybe & (codes == tid[t]) & (recs.queue_id == q) & (recs.phys < below)
    return m if m.any() else None


def _selection_mask(recs: R.Records, topics: set | None, pattern, queue_ids: set | None,
                    assign: dict | None = None) -> np.ndarray:
    """The records of the topics (a set, or those fully matching pattern) and queue ids selected, or of
    the queues assign names ({topic: queue ids})."""
    m = np.ones(len(recs), dtype=bool)
    if topics is not None or pattern is not None:
        enc = pc.dictionary_encode(recs.topics())
        names = enc.dictionary.to_pylist()
        codes = enc.indices.to_numpy(zero_copy_only=False)
        if assign is not None:
            ok = np.zeros(len(recs), dtype=bool)
            for k, t in enumerate(names):
                if t in assign:
                    ok |= (codes == k) & np.isin(recs.queue_id, np.fromiter(assign[t], np.int64))
            return m & ok
        keep = np.array([(t in topics) if topics is not None else pattern.fullmatch(t) is not None for t in names],
                        dtype=bool)
        m &= keep[codes] if len(names) else False
    if queue_ids is not None:
        m &= np.isin(recs.queue_id, np.fromiter(queue_ids, np.int64))
    return m


def _in_place_and_selected(recs: R.Records, part: Partition) -> R.Records | None:
    """recs without those whose PHYSICALOFFSET field (not covered by BODYCRC) is not where they lie (damaged:
    data loss, never a row with a false commitLogOffset and msgId) and, in mode=commitlog and key reads,
    those of topics and queues the options do not select; None when none is left."""
    real = recs.base + recs.pos
    moved = recs.phys != real
    if moved.any():
        n = int(moved.sum())
        data_loss(part.fail_on_data_loss, f"{part.store.root}: {n} message(s) whose PHYSICALOFFSET field is not "
                  f"where they lie (a damaged header), first at commitlog offset {int(real[moved][0])} (the field "
                  f"says {int(recs.phys[moved][0])})", n, part.loss_counter)
        if moved.all():
            return None
        recs = recs.select(~moved)
    if part.store.deleted and part.kind != "queue":      # consume queues never hold a deleted generation
        old = _deleted_mask(recs, part.store.deleted)
        if old is not None:
            if old.all():
                return None
            recs = recs.select(~old)
    if part.selection is not None:
        sel = _selection_mask(recs, *part.selection)
        if not sel.any():
            return None
        if not sel.all():
            recs = recs.select(sel)
    return recs


def rows_of(recs: R.Records, part: Partition) -> pa.RecordBatch | None:
    """Rows of valid records that pass the partition's conditions (and key), or None."""
    recs = _in_place_and_selected(recs, part)
    if recs is None:
        return None
    conds = part.conds
    m = _header_mask(recs, conds)
    if part.key is not None:
        km = _key_bytes_mask(recs, part.key)
        m = km if m is None else (m & km)
    if part.key is not None:
        km = recs.indexed()     # what a key lookup finds: what goes to the index
        m = km if m is None else (m & km)
    if m is not None:
        if not m.any():
            return None
        if not m.all():
            recs = recs.select(m)
    if part.check_crc and part.include_body:
        ok = np.asarray(recs.crc_ok(), dtype=bool)
        if not ok.all():
            data_loss(part.fail_on_data_loss, f"{part.store.root}: {int((~ok).sum())} message(s) whose body does "
                      f"not match its BODYCRC (corrupt), first at commitlog offset {int(recs.phys[~ok][0])}",
                      int((~ok).sum()), part.loss_counter)
            if not ok.any():
                return None
            recs = recs.select(ok)
    topics = props = None
    smask = None
    for c in conds:
        if c.col == "topic":
            topics = topics if topics is not None else recs.topics()
            cm = _string_mask(topics, c)
        elif c.col == "tags":
            props = props if props is not None else recs.properties()
            cm = _string_mask(props.tags, c)
        elif c.col == "broker":
            cm = np.full(len(recs), c.test_scalar(part.store.broker))
        else:
            continue
        smask = cm if smask is None else (smask & cm)
    if part.key is not None:
        props = props if props is not None else recs.properties()
        km = _has_key(props, part.key)
        if part.key_topics is not None:
            topics = topics if topics is not None else recs.topics()
            km &= _string_mask(topics, Cond("topic", "in", tuple(part.key_topics)))
        smask = km if smask is None else (smask & km)
    if part.selector is not None:       # before any row is built: the properties the selector reads, batched
        props = props if props is not None else recs.properties()
        sm = selector_mask(part.selector, props, len(recs))
        smask = sm if smask is None else (smask & sm)
    if smask is not None:
        if not smask.any():
            return None
        if not smask.all():
            recs = recs.select(smask)
            if topics is not None:
                topics = topics.filter(pa.array(smask))
            if props is not None:
                props = _filter_props(props, smask)
    if not len(recs):
        return None
    return recs.batch(part.store.broker, part.include_body, props=props, topics=topics, columns=part.columns)


def _walk(walk_buf, buf, base: int, start: int, limit: int) -> tuple:
    """The records walked in [start, limit) of a commitlog file's bytes (buf, at commitlog offset base;
    walk_buf: the same bytes as the walk takes them), cut before the first invalid one: (records, where the
    data stops, why, whether a record the walk took was invalid: then why is Outcome.INVALID)."""
    positions, stop, why = scanner.walk_positions(walk_buf, start, limit)
    recs = R.Records(buf, base, positions, limit)
    bad = np.flatnonzero(~recs.valid)
    if len(bad):
        return recs.slice(0, int(bad[0])), int(positions[bad[0]]), Outcome.INVALID, True
    return recs, stop, why, False


def _rows(part: Partition, recs: R.Records):
    """The Arrow batches of recs (BATCH_ROWS / BATCH_BYTES at most each)."""
    for chunk in _chunks(recs):
        batch = rows_of(chunk, part)
        if batch is not None:
            yield batch


def _chunks(recs: R.Records):
    n = len(recs)
    if n <= BATCH_ROWS and int(recs.total.sum()) <= BATCH_BYTES:
        yield recs
        return
    csum = np.cumsum(recs.total)
    i = 0
    while i < n:
        j = min(n, i + BATCH_ROWS)
        base = csum[i - 1] if i else 0
        k = int(np.searchsorted(csum, base + BATCH_BYTES, side="right"))
        j = max(i + 1, min(j, k))
        yield recs.slice(i, j)
        i = j


def _lost(part: Partition, what: str, offsets: np.ndarray, qoffs: np.ndarray | None, why: str) -> None:
    """Units or entries whose messages cannot be read: failOnDataLoss decides (see loss.py)."""
    where = f"queue {describe(qoffs)}, " if qoffs is not None else ""
    data_loss(part.fail_on_data_loss, f"{part.store.root}: {what}: {where}commitlog {describe(offsets)}: {why}",
              len(offsets), part.loss_counter)


def read_partition(part: Partition):
    """Yield the partition's rows as Arrow record batches (records.ARROW_SCHEMA). A read that selects
    nothing has no partition: PySpark then hands the read one InputPartition(None), which yields nothing."""
    if not isinstance(part, Partition):
        return
    cache = SV.FileCache() if part.store.fs is None else store_fs.RangeReader(part.store.fs)
    try:
        if part.kind == "queue":
            yield from _read_queue(part, cache)
        elif part.kind == "commitlog":
            yield from _read_commitlog(part, cache)
        elif part.kind == "offsets":
            yield from _read_offsets(part, cache)
        else:  # pragma: no cover
            raise ValueError(f"unknown partition kind {part.kind!r}")
    finally:
        cache.close()


def _runs(fidx: np.ndarray):
    """[start, end) runs of equal values."""
    if not len(fidx):
        return
    cut = np.flatnonzero(np.diff(fidx)) + 1
    edges = np.concatenate(([0], cut, [len(fidx)]))
    for a, b in zip(edges[:-1], edges[1:]):
        yield int(a), int(b)


def _records_at(part: Partition, cache: SV.FileCache, offs: np.ndarray, sizes: np.ndarray | None, what: str,
                qoffs: np.ndarray | None = None):
    """Records at commitlog offsets (in order), file by file; those that cannot be read are data loss
    (failOnDataLoss: the read fails, or they are skipped with a warning). qoffs: their queue offsets."""
    store = part.store
    fidx = store.file_index(offs)
    for a, b in _runs(fidx):
        fi = int(fidx[a])
        o = offs[a:b]
        q = None if qoffs is None else qoffs[a:b]
        base, path, fsize = store.cl_files[fi] if fi >= 0 else (0, "", 0)
        in_file = (o < base + max(fsize, store.cl_file_size)) if fi >= 0 else np.zeros(len(o), dtype=bool)
        if not in_file.all():          # before the first file, or in a file that is missing (a gap)
            _lost(part, what, o[~in_file], None if q is None else q[~in_file], "no commitlog file holds it")
            if not in_file.any():
                continue
            o, q = o[in_file], (None if q is None else q[in_file])
            sizes_here = None if sizes is None else sizes[a:b][in_file]
        else:
            sizes_here = None if sizes is None else sizes[a:b]
        if store.fs is not None:
            yield from _remote_records_at(part, cache, base, path, fsize, o, sizes_here, what, q)
            continue
        try:
            _, buf = cache.get(path)
        except FileNotFoundError:
            _lost(part, what, o, q, f"its commitlog file {path} is gone")
            continue
        limit = len(buf)
        if store.data_end is not None:
            limit = min(limit, max(store.data_end - base, 0))
        recs = R.Records(buf, base, o - base, limit, sizes_here)
        yield from _valid_records(part, recs, o, q, what, path)


def _valid_records(part: Partition, recs: R.Records, o: np.ndarray, q: np.ndarray | None, what: str, path: str):
    """The valid ones of recs (records at commitlog offsets o of file path); the others are data loss."""
    if not recs.valid.all():
        bad = ~recs.valid
        _lost(part, what, o[bad], None if q is None else q[bad],
              f"no valid message there in {path} (damaged, truncated or zeroed)")
        recs = recs.select(recs.valid)
    if len(recs):
        yield recs


def _remote_records_at(part: Partition, reader: store_fs.RangeReader, base: int, path: str, fsize: int,
                       o: np.ndarray, sizes: np.ndarray | None, what: str, q: np.ndarray | None):
    """_records_at for one file of a remote store: one ranged read per span of records (read_spans)."""
    data_end = part.store.data_end
    for i, j, lo, hi in store_fs.read_spans(o - base, sizes, fsize):
        oo, qq = o[i:j], (None if q is None else q[i:j])
        try:
            buf = reader.read(path, lo, hi - lo)
        except FileNotFoundError:
            _lost(part, what, oo, qq, f"its commitlog file {path} is gone")
            continue
        limit = len(buf) if data_end is None else min(len(buf), max(data_end - base - lo, 0))
        recs = R.Records(buf, base + lo, oo - base - lo, limit, None if sizes is None else sizes[i:j])
        yield from _valid_records(part, recs, oo, qq, what, path)


def _read_queue(part: Partition, cache: SV.FileCache):
    cl_lo, cl_hi = int_range(part.conds, "commitLogOffset")
    cl_min = part.store.cl_files[0][0] if part.store.cl_files else 0
    for qv, a, b in part.items:
        what = f"queue {qv.topic}/{qv.queue_id}"
        for offs, sizes, qoffs in _units(part, qv, a, b, what):
            yield from _read_units(part, cache, offs, sizes, qoffs, what, cl_lo, cl_hi, cl_min)


def _units(part: Partition, qv, a: int, b: int, what: str) -> list:
    """(commitlog offsets, sizes, queue offsets) of the queue's units [a, b), in pieces: a consume queue file
    deleted since the read was planned (`rmqstore clean`, a broker's cleaner) is data loss for its offsets
    (failOnDataLoss), and the files still there are read."""
    try:
        pieces = [(a, b, qv.units(a, b))]
    except FileNotFoundError:
        unit = codec.CQ_STORE_UNIT_SIZE
        cuts = sorted({a, b, min(max(qv.disk_end, a), b), *(min(max(base // unit, a), b) for base, _, _ in qv.files)})
        pieces = []
        for x, y in zip(cuts, cuts[1:]):
            if x < y:
                try:
                    pieces.append((x, y, qv.units(x, y)))
                except FileNotFoundError as e:
                    data_loss(part.fail_on_data_loss, f"{part.store.root}: {what} offsets {x} to {y}: its consume "
                              f"queue file {e.filename} is gone (deleted since the read was planned)", y - x,
                              part.loss_counter)
    out = []
    for x, _, (offs, sizes) in pieces:
        if len(offs):
            start = max(x, qv.min_offset)
            out.append((offs, sizes, np.arange(start, start + len(offs), dtype=np.int64)))
    return out


def _read_units(part: Partition, cache: SV.FileCache, offs, sizes, qoffs, what: str, cl_lo, cl_hi, cl_min: int):
    """The rows of one queue's units (_read_queue)."""
    ok = (sizes > 0) & (sizes != SV.BLANK_SIZE)
    gone = ok & (offs < cl_min)
    if gone.any():
        _lost(part, what, offs[gone], qoffs[gone], f"its commitlog files were deleted (the commitlog starts "
              f"at {cl_min})")
        ok &= ~gone
    if cl_lo is not None:
        ok &= offs >= cl_lo
    if cl_hi is not None:
        ok &= offs < cl_hi
    if not ok.all():
        offs, sizes, qoffs = offs[ok], sizes[ok], qoffs[ok]
    for recs in _records_at(part, cache, offs, sizes, what, qoffs):
        yield from _rows(part, recs)


def _check_file_end(part: Partition, base: int, path: str, stop: int, why: Outcome, last_base: int) -> None:
    """A commitlog file's data stops at stop (walk's why). A file before the last one ends with an
    END_OF_FILE record or is full; a stopped store's data runs to its known end: anything else is loss.
    The last file of a store being written ends with the record in the making (not loss)."""
    store = part.store
    known_end = store.data_end is not None and base + stop < store.data_end
    if base != last_base and why is not Outcome.END_OF_FILE and stop < store.cl_file_size:
        if store.data_end is None or known_end:
            data_loss(part.fail_on_data_loss, f"{store.root}: commitlog file {path} holds no message from offset "
                      f"{base + stop} ({why.name}) to its end {base + store.cl_file_size}: truncated, zeroed or "
                      "damaged (later files are read)", 0, part.loss_counter)
    elif why is Outcome.INVALID and store.data_end is None and not store.clean:
        log.warning("%s: a torn tail: the commitlog's records end at offset %d with a record cut short (the store "
                    "has an abort file: a copy of a running or crashed broker, read as it is); read up to there",
                    store.root, base + stop)
    elif why is Outcome.INVALID:
        lvl = logging.DEBUG if store.data_end is None else logging.WARNING
        log.log(lvl, "%s: no valid record at offset %d: the file's data ends there", path, base + stop)


def _check_end(part: Partition, base: int, path: str, start: int, limit: int, stop: int, why: Outcome,
               last_base: int, piece: bool) -> None:
    """The walk of [start, limit) of a commitlog file stopped at stop: _check_piece_end for a piece that
    another piece goes on from at limit (pieces.py), else _check_file_end."""
    if piece:
        _check_piece_end(part, base, path, start, limit, stop, why)
    else:
        _check_file_end(part, base, path, stop, why, last_base)


def _check_piece_end(part: Partition, base: int, path: str, start: int, limit: int, stop: int, why: Outcome) -> None:
    """The walk of a piece (pieces.py) that another piece goes on from at limit stopped at stop: anything but
    limit leaves [stop, limit) unread, which is data loss."""
    if stop != limit:
        data_loss(part.fail_on_data_loss, f"{part.store.root}: commitlog file {path}: the records from offset "
                  f"{base + start} stop at {base + stop} ({why.name}), before the next piece of the read at "
                  f"{base + limit}: offsets {base + stop}..{base + limit} are not read (damaged)", 0,
                  part.loss_counter)


def _read_commitlog(part: Partition, cache: SV.FileCache):
    store = part.store
    last_base = store.last_base
    for base, path, start, limit, piece in part.items:
        if store.fs is not None:
            yield from _read_remote_range(part, cache, base, path, start, limit, last_base, piece)
            continue
        try:
            mm, buf = cache.get(path)
        except FileNotFoundError:
            data_loss(part.fail_on_data_loss, f"{store.root}: commitlog file {path} is gone", 0, part.loss_counter)
            continue
        if mm is None:
            continue
        recs, stop, why, _ = _walk(mm, buf, base, start, min(limit, len(buf)))
        _check_end(part, base, path, start, limit, stop, why, last_base, piece)
        yield from _rows(part, recs)


def _read_remote_range(part: Partition, reader: store_fs.RangeReader, base: int, path: str, start: int, limit: int,
                       last_base: int, piece: bool = False):
    """_read_commitlog for one file of a remote store: [start, limit) walked REMOTE_CHUNK bytes at a time."""
    pos, want = start, REMOTE_CHUNK
    while True:
        end = min(limit, pos + want)
        try:
            buf = reader.read(path, pos, end - pos)
        except FileNotFoundError:
            data_loss(part.fail_on_data_loss, f"{part.store.root}: commitlog file {path} is gone", 0,
                      part.loss_counter)
            return
        recs, stop, why, bad = _walk(buf, buf, base + pos, 0, len(buf))
        yield from _rows(part, recs)
        cut = _cut_at(buf, stop, limit - pos) if not bad and len(buf) == end - pos < limit - pos else 0
        if not cut:
            _check_end(part, base, path, start, limit, pos + stop, why, last_base, piece)
            return
        pos, want = pos + stop, max(REMOTE_CHUNK, cut)


def _cut_at(buf: np.ndarray, stop: int, left: int) -> int:
    """Whether the walk of a chunk stopped at a record the chunk's end cut (then: the bytes to read from stop
    to have it whole; else 0). left: the bytes of the range from the chunk's start."""
    if stop + codec.HEADER_V4.size > len(buf):
        return codec.HEADER_V4.size
    total, magic = codec.HEADER_V4.unpack_from(buf, stop)[:2]
    magics = (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2, codec.BLANK_MAGIC_CODE)
    if magic in magics and stop + total > len(buf) and stop + total <= left:
        return total
    return 0


def _read_offsets(part: Partition, cache: SV.FileCache):
    offs = np.asarray(part.items, dtype=np.int64)
    cl_min = part.store.cl_files[0][0] if part.store.cl_files else 0
    offs = offs[offs >= cl_min]        # index entries outlive deleted commitlog files (RocketMQ skips them too)
    for recs in _records_at(part, cache, offs, None, f"index entries for key {part.key!r}"):
        yield from _rows(part, recs)
