"""df.write.format("rocketmq").save(STORE): append rows as messages, exactly once or none (save modes:
save_mode.py).

A store has one writer at a time (its `lock` file), and a Spark job has many tasks, some of which may run
twice (retries, speculation). So:

* executors encode: each task checks and normalises its rows (topic, body, properties built from the
  tags / keys / properties columns, queue id, flag, born time and host) into one Arrow IPC stream, a file
  in the write's staging directory inside the store (or, for an executor that does not see it, its commit
  message: handoff.py); nothing is appended by a task;
* the driver appends: commit() opens the store (taking its lock: a store open in another process fails
  with StoreLockedError naming it) and appends the tasks' messages (grouped by topic, in partition order
  within each topic: each queue's order is the rows' order) as one two-phase
  transaction (spark/transaction.py: half messages, a durable commit point, commit records), then waits
  until they are dispatched and closes the store. A failed job aborts before anything was appended, a
  retried task's message replaces its first attempt's, and a driver killed mid-append leaves either
  nothing visible (halves only: rolled back by the next write) or a committed transaction (finished by
  the next write). Option writeId (like Delta's txnAppId): a write whose id the store has committed is
  skipped, so re-running a job whose driver died gives exactly one copy.

Every row is appended by the driver's Python process, column-wise (MessageBatch chunks of one topic): this
suits what a broker's store takes (GBs), not more. Each row costs two commitlog records (its half and its
commit record).

Columns: topic (string, required), body (binary or string, required), tags (string), keys (array<string>,
each element a key: not null, not empty, without a space; or a string of space-separated keys, an empty word
between spaces being no key, as RocketMQ reads KEYS; a null or empty value: no keys), properties
(map<string,string>), queueId (int: when null or absent the topic's queues are used round robin: those the
store has, else defaultTopicQueueNums of the config), flag (int), bornTimestamp (timestamp or epoch ms;
default: now), bornHost (string ip:port). The other columns of the rocketmq read schema are ignored (a
DataFrame read from a store can be written to another); any other column is an error. A refused row is
named by its Spark partition and its index in that partition, from 0 ("partition 1, row 15000: ...";
RowError).
"""
from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from ..store.files import store_fs
from ..store.format import codec, validation
from ..store.files.store_dir import not_a_store_to_write
from ..store.conf.config import StoreConfig
from ..errors import ConfigError, StoreLockedError
from . import handoff, storeview as SV
from .records import COLUMNS
from .transaction import PRODUCER_GROUP
from .save_mode import mode_error

log = logging.getLogger(__name__)

WRITABLE = {"topic", "body", "tags", "keys", "properties", "queueId", "flag", "bornTimestamp", "bornHost"}
IGNORED = set(COLUMNS) - WRITABLE
NORMAL = pa.schema([("topic", pa.string()), ("queueId", pa.int32()), ("flag", pa.int32()),
                    ("bornTimestamp", pa.int64()), ("bornHost", pa.string()), ("properties", pa.string()),
                    ("body", pa.binary())])


class WriteError(ValueError):
    """A row or option that cannot be written (names the column or option)."""


class RowError(WriteError):
    """A row that cannot be written: what is wrong with it (.what) and where it is. Raised by the checks with
    the row's index in the batch they check (.row); normalize names it for the user (located): in a Spark task
    by the task's partition id (.partition) and the row's index in that partition, from 0, the rows of the
    partition's earlier Arrow batches counted ("partition 1, row 15000: ...")."""

    def __init__(self, row: int, what: str, partition: int | None = None, place: str | None = None):
        self.row, self.what, self.partition = row, what, partition
        super().__init__(f"{place or f'row {row}'}: {what}")

    def located(self, partition: int | None, first_row: int) -> "RowError":
        """This error of a batch whose first row is the first_row-th (from 0) of the rows of Spark partition
        partition, or, with partition None, of the rows given to one call outside any Spark task."""
        row = first_row + self.row
        if partition is not None:
            return RowError(row, self.what, partition, f"partition {partition}, row {row}")
        if first_row == 0:
            return self
        return RowError(row, self.what, None, f"row {row} (counted from 0 over all the batches given, "
                                              "outside any Spark task)")


@dataclass
class EncodedRows(WriterCommitMessage):
    partition: int
    attempt: int
    rows: int
    payload: bytes          # Arrow IPC stream in NORMAL (empty when staged)
    staged: str | None = None   # else: the name of the file in the write's staging directory (handoff.py) ...
    size: int = 0               # ... of this many bytes


def _store_path(options: dict) -> str:
    p = options.get("path")
    if not p:
        raise WriteError("option 'path' is missing: save(STORE) with a store directory")
    if store_fs.is_remote(p):       # appending needs the store's lock and a recovery: a local directory
        raise WriteError(f"option 'path': {store_fs.display_uri(p)!r} is not a local directory: the rocketmq "
                         "sink appends to a store on this machine's filesystem (or a shared mount); remote "
                         "URIs are read-only")
    try:
        return os.path.abspath(store_fs.local_path(p))
    except store_fs.StoreError as e:
        raise WriteError(str(e)) from None


def check_target(options: dict, overwrite: bool, known: tuple = ("path", "config", "writeid")
                 ) -> tuple[str, StoreConfig]:
    """Fail at planning: overwrite mode, a path that is neither a store nor empty, a store held by another
    process, a bad config."""
    if overwrite:
        raise WriteError(mode_error("overwrite"))
    unknown = sorted(set(k.lower() for k in options) - set(known))
    if unknown:
        raise WriteError(f"unknown option {unknown[0]!r} of the rocketmq sink (known: {', '.join(known)})")
    path = _store_path(options)
    why = not_a_store_to_write(path, other_files=False)   # a dead write's staging dir (handoff.PREFIX) is hidden
    if why:
        raise WriteError(f"option 'path': {why}")
    if os.path.isdir(path) and SV.lock_held_elsewhere(path):
        raise StoreLockedError(path)
    try:
        config = StoreConfig.load(options.get("config")) if options.get("config") else StoreConfig()
    except (ConfigError, OSError) as e:
        raise WriteError(f"option 'config': {e}") from None
    return path, config


def check_schema(schema) -> None:
    names = [f.name for f in schema.fields]
    for need in ("topic", "body"):
        if need not in names:
            raise WriteError(f"the rocketmq sink needs a column {need!r} (columns: {', '.join(names)})")
    bad = [n for n in names if n not in WRITABLE and n not in IGNORED]
    if bad:
        raise WriteError(f"column {bad[0]!r} is not something a message has (writable: "
                         f"{', '.join(sorted(WRITABLE))})")


# --- executors ----------------------------------------------------------------------------------------
def _col(batch: pa.RecordBatch, name: str):
    i = batch.schema.get_field_index(name)
    return batch.column(i) if i >= 0 else None


def normalize(batch: pa.RecordBatch, max_message_size: int, now_ms: int, partition: int | None = None,
              first_row: int = 0) -> pa.RecordBatch:
    """Check and normalise rows: one NORMAL row per input row, or WriteError naming the column and row (a
    RowError: in a task, partition is its Spark partition id and first_row the index in it of the batch's
    first row, so the error names the row as "partition P, row R"; see RowError.located)."""
    try:
        return _normalize(batch, max_message_size, now_ms)
    except RowError as e:
        first = e
    # the checks run column by column: the first that fails names its first bad row, but an earlier row may
    # fail a later check; look again in the rows before it until none fails (errors are rare, re-checks cheap)
    while first.row > 0:
        try:
            _normalize(batch.slice(0, first.row), max_message_size, now_ms)
            break
        except RowError as e:
            first = e
    raise first.located(partition, first_row) from None


def _normalize(batch: pa.RecordBatch, max_message_size: int, now_ms: int) -> pa.RecordBatch:
    n = batch.num_rows
    topic, tlen = _topics(batch)
    body = _bodies(batch)
    props = _properties(batch, n)
    qid = _queue_ids(batch, n)
    flag = _col(batch, "flag")
    flag = flag.cast(pa.int32()).fill_null(0) if flag is not None else pa.array(np.zeros(n, dtype=np.int32))
    born = _col(batch, "bornTimestamp")
    if born is None:
        born = pa.array(np.full(n, now_ms, dtype=np.int64))
    elif pa.types.is_timestamp(born.type):
        born = pc.cast(pc.cast(born, pa.timestamp("ms", tz="UTC")), pa.int64()).fill_null(now_ms)
    else:
        born = born.cast(pa.int64()).fill_null(now_ms)
    host = _born_hosts(batch, n)
    plen, extra, tlen = _grown(props, tlen)
    over = np.flatnonzero(plen + extra > codec.MAX_PROPERTIES_LENGTH)
    if len(over):
        i = int(over[0])
        raise RowError(i, f"properties of {int(plen[i])} bytes exceed {codec.MAX_PROPERTIES_LENGTH} with up to "
                          f"the {int(extra[i])} bytes the store adds (TRAN_MSG and PGROUP of the two-phase append; "
                          "with DELAY, REAL_TOPIC and REAL_QID of the delay)")
    sizes = (codec.HEADER_STRUCTS[3].size + pc.binary_length(body).to_numpy(zero_copy_only=False) + 3 + tlen
             + plen + extra)
    big = np.flatnonzero(sizes > max_message_size)
    if len(big):
        raise RowError(int(big[0]), f"a message of {int(sizes[big[0]])} bytes exceeds maxMessageSize "
                                    f"{max_message_size}")
    return pa.RecordBatch.from_arrays([topic.cast(pa.string()), qid, flag, born, host.cast(pa.string()), props, body],
                                      schema=NORMAL)


# what the store's records add to a row's properties: the half and the commit record carry TRAN_MSG and PGROUP
# (transaction.py); a row with DELAY has its commit record rewritten to SCHEDULE_TOPIC_XXXX with REAL_TOPIC and
# REAL_QID (messaging/schedule.py: its queue id is at most MAX_QUEUE_ID)
_HALF_EXTRA = len(codec.properties_to_string({codec.PROPERTY_TRAN_PREPARED: "true",
                                              codec.PROPERTY_PRODUCER_GROUP: PRODUCER_GROUP}))
_DELAY_EXTRA = len(codec.properties_to_string({codec.PROPERTY_REAL_TOPIC: "", codec.PROPERTY_REAL_QUEUE_ID:
                                               str(validation.MAX_QUEUE_ID)}))


def _grown(props: pa.Array, tlen: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(properties bytes, bytes the store's largest record of the row adds to them, its topic bytes) per row."""
    plen = pc.binary_length(props.cast(pa.binary())).to_numpy(zero_copy_only=False).astype(np.int64)
    delayed = pc.match_substring_regex(props, f"(^|\x02){codec.PROPERTY_DELAY}\x01").to_numpy(zero_copy_only=False)
    extra = _HALF_EXTRA + np.where(delayed, _DELAY_EXTRA + tlen, 0)
    return plen, extra, np.where(delayed, np.maximum(tlen, len(codec.SCHEDULE_TOPIC)), tlen)


def _topics(batch: pa.RecordBatch):
    """The topic column, checked (not null, 1..MAX_TOPIC_LENGTH bytes, the store's rule), and its lengths."""
    topic = _col(batch, "topic")
    if topic.null_count:
        raise RowError(_first(topic.is_null()), "column 'topic' is null")
    tlen = pc.binary_length(topic.cast(pa.binary())).to_numpy(zero_copy_only=False)
    bad = np.flatnonzero((tlen == 0) | (tlen > codec.MAX_TOPIC_LENGTH))
    if len(bad):
        raise RowError(int(bad[0]), f"column 'topic': {topic[int(bad[0])].as_py()!r} is {int(tlen[bad[0]])} bytes, "
                                    f"RocketMQ allows 1 to {codec.MAX_TOPIC_LENGTH}")
    text = topic.cast(pa.string())
    for t in pc.unique(text).to_pylist():     # the store's rule (validation.py), per topic (first seen first)
        why = validation.topic_problem(t)
        if why:
            raise RowError(pc.index(text, t).as_py(), f"column 'topic': {why}")
    return topic, tlen


def _first(mask) -> int:
    """The index of the first true of a boolean Arrow array (one that has one)."""
    return int(np.flatnonzero(mask.to_numpy(zero_copy_only=False))[0])


def _bodies(batch: pa.RecordBatch):
    """The body column as binary (a string column is taken as its UTF-8 bytes); never null."""
    body = _col(batch, "body")
    if _is_text(body.type):
        body = pc.cast(body, pa.binary())
    if body.type != pa.binary():
        body = body.cast(pa.binary())
    if body.null_count:
        raise RowError(_first(body.is_null()), "column 'body' is null")
    return body


def _properties(batch: pa.RecordBatch, n: int) -> pa.Array:
    """Each row's properties string: the properties map, then tags (TAGS) and keys (KEYS, words joined by a
    space; a map naming TAGS or KEYS gets the column's value in its place), checked by the store's rule and
    against MAX_PROPERTIES_LENGTH. Built with Arrow kernels; a batch where a map names a property twice, or
    that breaks a rule, goes row by row (_properties_by_row, which names the row)."""
    tags, keys, props = _col(batch, "tags"), _col(batch, "keys"), _col(batch, "properties")
    if not _string_columns(tags, keys, props):
        return _properties_by_row(batch, n)     # it refuses what is not a str, naming it
    if keys is not None and pa.types.is_list(keys.type) and _bad_listed_keys(keys):
        return _properties_by_row(batch, n)     # a null or empty key, or one holding the separator: refused there
    keys = _keys_joined(keys)
    for col in (tags, keys):        # a value with a separator (also one that replaces the map's): row by row
        if col is not None and pc.any(pc.match_substring_regex(col, _SEPARATORS)).as_py():
            return _properties_by_row(batch, n)
    entries = []        # (row of each entry, "name\x01value\x02" of each entry): map entries, TAGS, KEYS
    placed: dict[str, np.ndarray] = {}      # rows whose map names TAGS / KEYS: the column's value goes there
    if props is not None:
        lst = props.cast(pa.list_(pa.struct([("key", pa.string()), ("value", pa.string())])))
        flat = pc.list_flatten(lst)
        rows = pc.list_parent_indices(lst).to_numpy(zero_copy_only=False)
        names, values = flat.field("key"), flat.field("value")
        keep = values.is_valid()
        names, values, rows = names.filter(keep), values.filter(keep), rows[keep.to_numpy(zero_copy_only=False)]
        if len(names):
            bad = pc.or_(pc.equal(pc.binary_length(names), 0),
                         pc.or_(pc.match_substring_regex(names, _SEPARATORS),
                                pc.match_substring_regex(values, _SEPARATORS)))
            codes = pc.dictionary_encode(names).indices.to_numpy(zero_copy_only=False).astype(np.int64)
            if pc.any(bad).as_py() or len(np.unique(rows * (int(codes.max()) + 1) + codes)) != len(codes):
                return _properties_by_row(batch, n)     # a name twice, or a rule broken
            at = pa.array(rows)
            for name, col in (("TAGS", tags), ("KEYS", keys)):
                if col is not None:     # named in the map and given as a column: the column's value, in place
                    hit = pc.and_(pc.equal(names, name), col.is_valid().take(at))
                    values = pc.if_else(hit, col.take(at), values)
                    placed[name] = rows[hit.to_numpy(zero_copy_only=False)]
            entries.append((rows, _pairs(names, values)))
    for name, col in (("TAGS", tags), ("KEYS", keys)):
        if col is not None and col.null_count < n:
            valid = col.is_valid()
            if name in placed:
                free = np.ones(n, dtype=bool)
                free[placed[name]] = False
                valid = pc.and_(valid, pa.array(free))
            values = col.filter(valid)
            entries.append((np.flatnonzero(valid.to_numpy(zero_copy_only=False)),
                            _pairs(pa.array([name] * len(values), pa.string()), values)))
    if not entries:
        return pa.array([""] * n, pa.string())
    rows = np.concatenate([r for r, _ in entries])
    order = np.argsort(rows, kind="stable")       # per row: its map entries in order, then TAGS, then KEYS
    offsets = np.searchsorted(rows[order], np.arange(n + 1)).astype(np.int32)
    pieces = pa.concat_arrays([e for _, e in entries]).take(pa.array(order))
    out = pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets), pieces), "")
    size = pc.binary_length(out.cast(pa.binary())).to_numpy(zero_copy_only=False)
    if len(size) and int(size.max()) > codec.MAX_PROPERTIES_LENGTH:
        return _properties_by_row(batch, n)
    return out


_SEPARATORS = validation._SEPARATORS.pattern       # the store's rule's separators, as an Arrow regex


def _is_text(t) -> bool:
    """An Arrow string type (string or large_string)."""
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _string_columns(tags, keys, props) -> bool:
    """tags a string column, keys a string or list of strings column, properties a map of strings (or absent)."""
    return ((tags is None or _is_text(tags.type))
            and (keys is None or _is_text(keys.type) or (pa.types.is_list(keys.type) and _is_text(keys.type.value_type)))
            and (props is None or (pa.types.is_map(props.type) and _is_text(props.type.key_type)
                                   and _is_text(props.type.item_type))))


def _pairs(names: pa.Array, values: pa.Array) -> pa.Array:
    """"name\x01value\x02" of each entry."""
    return pc.binary_join_element_wise(pc.binary_join_element_wise(names, values, "\x01"), "", "\x02")


def _bad_listed_keys(keys) -> bool:
    """Whether an array keys column has an element that is no key: null, empty, or holding a space (the
    separator of KEYS). Arrow kernels; _properties_by_row names the row."""
    words = pc.list_flatten(keys)
    if not len(words):
        return False
    return bool(words.null_count) or pc.any(pc.or_(pc.equal(pc.binary_length(words), 0),
                                                   pc.match_substring(words, codec.KEY_SEPARATOR))).as_py()


def _keys_joined(keys) -> pa.Array | None:
    """The keys column as KEYS values: the keys (of an array, each a non-empty string without a space:
    _properties refuses others; of a string, its words between spaces, an empty word being no key, as RocketMQ
    reads KEYS) joined by a space; null where there is none."""
    if keys is None:
        return None
    if _is_text(keys.type):
        keys = pc.split_pattern(keys.cast(pa.string()), codec.KEY_SEPARATOR)
    words = pc.list_flatten(keys)
    rows = pc.list_parent_indices(keys).to_numpy(zero_copy_only=False)
    keep = pc.and_(words.is_valid(), pc.greater(pc.binary_length(words), 0)).fill_null(False)
    words, rows = words.filter(keep).cast(pa.string()), rows[keep.to_numpy(zero_copy_only=False)]
    offsets = np.searchsorted(rows, np.arange(len(keys) + 1)).astype(np.int32)
    counts = np.diff(offsets)
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets), words), codec.KEY_SEPARATOR)
    return pc.if_else(pa.array(counts > 0), joined, pa.nulls(len(keys), pa.string()))


def _properties_by_row(batch: pa.RecordBatch, n: int) -> pa.Array:
    """_properties one row at a time: the rule, exact, and the error naming the first bad row."""
    tags = _col(batch, "tags")
    keys = _col(batch, "keys")
    props_col = _col(batch, "properties")
    tags_l = tags.to_pylist() if tags is not None else None
    if keys is not None and not _keys_type_ok(keys.type):
        raise WriteError(f"column 'keys' is of type {keys.type}: give an array of strings (one key each) or a "
                         "string of space-separated keys")
    if keys is not None:
        keys_l = keys.to_pylist()
        if _is_text(keys.type):
            keys_l = [None if k is None else [w for w in k.split(" ") if w] for k in keys_l]
        else:
            for i, ks in enumerate(keys_l):
                why = next((w for w in map(_listed_key_problem, ks or ()) if w), None)
                if why:
                    raise RowError(i, why)
    else:
        keys_l = None
    props_l = props_col.to_pylist() if props_col is not None else None
    out_props = []
    for i in range(n):
        p: dict[str, str] = {}
        if props_l is not None and props_l[i]:
            p.update((k, v) for k, v in props_l[i] if v is not None)
        if tags_l is not None and tags_l[i] is not None:
            p[codec.PROPERTY_TAGS] = tags_l[i]
        if keys_l is not None and keys_l[i]:
            ks = [k for k in keys_l[i] if k]
            if ks:
                p[codec.PROPERTY_KEYS] = codec.KEY_SEPARATOR.join(ks)
        why = validation.properties_problem(p)
        if why:
            raise RowError(i, why)
        s = codec.properties_to_string(p)
        if len(s.encode("utf-8")) > codec.MAX_PROPERTIES_LENGTH:
            raise RowError(i, f"properties of {len(s.encode())} bytes exceed {codec.MAX_PROPERTIES_LENGTH}")
        out_props.append(s)
    return pa.array(out_props, type=pa.string())


def _keys_type_ok(t) -> bool:
    """A keys column type the writer reads: a string, a list of strings, or all null (no keys)."""
    def text(x) -> bool:
        return _is_text(x) or pa.types.is_null(x)
    return text(t) or ((pa.types.is_list(t) or pa.types.is_large_list(t)) and text(t.value_type))


def _listed_key_problem(k) -> str | None:
    """Why an element of an array keys column is no key (None when it is one)."""
    if k is None or k == "":
        return (f"{'a null' if k is None else 'an empty'} key in column 'keys': RocketMQ has no empty key (its "
                "KEYS property is a space-separated string); leave it out of the array (a row with no keys has a "
                "null or empty array)")
    if isinstance(k, str) and codec.KEY_SEPARATOR in k:
        return (f"key {k!r} of column 'keys' holds a space, the separator of RocketMQ's KEYS property: it would "
                f"be stored as other keys (give each key as its own array element, without spaces)")
    return None


def _queue_ids(batch: pa.RecordBatch, n: int) -> pa.Array:
    """The queueId column as int32 (null: the writer picks), each in [0, MAX_QUEUE_ID]."""
    qid = _col(batch, "queueId")
    qid = qid.cast(pa.int32()) if qid is not None else pa.nulls(n, pa.int32())
    if qid.null_count < n:
        q = qid.fill_null(0).to_numpy(zero_copy_only=False)
        bad = np.flatnonzero((q < 0) | (q > validation.MAX_QUEUE_ID))
        if len(bad):
            i = int(bad[0])
            raise RowError(i, f"column 'queueId' has a negative queue id {int(q[i])}" if q[i] < 0 else
                           f"column 'queueId' has queue id {int(q[i])}, above {validation.MAX_QUEUE_ID}")
    return qid


def _born_hosts(batch: pa.RecordBatch, n: int) -> pa.Array:
    """The bornHost column, each non-null value a host:port the codec can encode (each distinct value parsed
    once; the error names the first row of a bad one)."""
    host = _col(batch, "bornHost")
    if host is None:
        return pa.nulls(n, pa.string())
    for h in pc.unique(host).to_pylist():       # in the order first seen: the first bad one is the first bad row
        if h is not None:
            try:
                codec.parse_host(h)
            except ValueError as e:
                raise RowError(pc.index(host, h).as_py(), f"column 'bornHost': {e}") from None
    return host


def encode_task(iterator, max_message_size: int, stage: str | None = None) -> EncodedRows:
    """A task's rows (Arrow batches), checked and normalised, as its commit message: the rows themselves, or
    the file of stage they were written to when this executor sees stage (handoff.py)."""
    from pyspark import TaskContext
    ctx = TaskContext.get()
    partition, attempt = (ctx.partitionId(), ctx.attemptNumber()) if ctx else (0, 0)
    where = partition if ctx else None      # what a refused row is named by (normalize): its partition, or none
    now = int(time.time() * 1000)
    try:
        sink, name = handoff.open_sink(stage, partition, attempt)
    except OSError as e:
        raise WriteError(f"partition {partition}: cannot make its staged rows' file in {stage}: {e}") from None
    rows = 0
    try:
        with pa.ipc.new_stream(sink, NORMAL) as w:
            for batch in iterator:
                if batch.num_rows:
                    nb = normalize(batch, max_message_size, now, where, rows)
                    w.write_batch(nb)
                    rows += nb.num_rows
        if name is None:
            return EncodedRows(partition, attempt, rows, sink.getvalue())
        size = sink.tell()
    except OSError as e:        # a full disk: name the file
        raise WriteError(f"partition {partition}: writing its staged rows to {stage}/{name} failed: {e}") from None
    finally:
        if name is not None:
            try:
                sink.close()
            except OSError:
                pass            # the write's own error (above) says what went wrong
    return EncodedRows(partition, attempt, rows, b"", name, size)


class RocketMQWriter(DataSourceArrowWriter):
    def __init__(self, options: dict, schema, overwrite: bool):
        self.options = dict(options)
        self.path, self.config = check_target(self.options, overwrite)
        check_schema(schema)
        try:
            self.stage, self.made_store = handoff.make_stage(self.path)
        except OSError as e:
            raise WriteError(f"option 'path': cannot make a staging directory in {self.path}: {e}") from None

    def write(self, iterator) -> EncodedRows:
        return encode_task(iterator, self.config.max_message_size, self.stage)

    def commit(self, messages) -> None:
        msgs = sorted((m for m in messages if m is not None), key=lambda m: m.partition)
        try:
            append_encoded(self.path, self.config, msgs, write_id=self.options.get("writeId")
                           or self.options.get("writeid"), stage=self.stage)
        finally:
            handoff.remove_stage(self.stage, self.path, False)

    def abort(self, messages) -> None:
        handoff.remove_stage(self.stage, self.path, self.made_store)
        log.warning("%s: write aborted: nothing was appended", self.path)


def to_chunks(msgs: list[EncodedRows], queues: dict[str, list[int]], default_queues: int,
              stage: str | None = None) -> list:
    """The encoded rows as two_phase_append's chunks: grouped by topic (topics in name order, rows in their
    order within each: each queue's order is the rows' order), at most transaction.CHUNK rows each; null
    queue ids round robin over the topic's queues, in row order. A chunk whose rows share flag, born host and
    property names is a MessageBatch (the columnar put path), any other a list of Messages."""
    from .transaction import CHUNK
    tables = [pa.ipc.open_stream(handoff.rows_source(stage, m.staged, m.size, m.payload, m.partition)).read_all()
              for m in msgs if m.rows]
    if not tables:
        return []
    t = pa.concat_tables(tables).combine_chunks()
    enc = pc.dictionary_encode(t.column("topic")).combine_chunks()
    names = enc.dictionary.to_pylist()
    idx = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    qid = t.column("queueId").fill_null(-1).to_numpy().astype(np.int64)
    for i, topic in enumerate(names):
        free = np.flatnonzero((idx == i) & (qid < 0))
        if len(free):
            qs = np.asarray(queues.get(topic) or range(default_queues), dtype=np.int64)
            qid[free] = qs[np.arange(len(free)) % len(qs)]
    rank = np.empty(len(names), np.int64)
    rank[sorted(range(len(names)), key=names.__getitem__)] = np.arange(len(names))
    order = np.argsort(rank[idx], kind="stable")
    t, idx, qid = t.take(order), idx[order], qid[order]
    cuts = [0, *(np.flatnonzero(np.diff(idx)) + 1).tolist(), t.num_rows]
    return [_chunk(t.slice(s, min(s + CHUNK, b) - s), names[int(idx[a])], qid[s:min(s + CHUNK, b)])
            for a, b in zip(cuts, cuts[1:]) for s in range(a, b, CHUNK)]


def _chunk(t: pa.Table, topic: str, qids: np.ndarray):
    """One chunk of rows of one topic (to_chunks)."""
    from ..store.format.message import DEFAULT_HOST, Message
    from ..store.format.message_batch import MessageBatch
    n = t.num_rows
    flags = t.column("flag").to_numpy()
    hosts = t.column("bornHost").to_pylist()
    born = t.column("bornTimestamp").to_numpy()
    bodies = t.column("body").to_pylist()
    props = t.column("properties").combine_chunks()
    columns = None
    if int(flags.min()) == int(flags.max()) and hosts.count(hosts[0]) == n:
        columns = _property_columns(props)
    if columns is not None:
        return MessageBatch(topic, bodies, queue_ids=qids, properties=columns, flag=int(flags[0]),
                            born_timestamp=born, born_host=hosts[0] or DEFAULT_HOST)
    return [Message(topic=topic, body=body, queue_id=q, flag=f, born_timestamp=b, born_host=h or DEFAULT_HOST,
                    properties=codec.string_to_properties(p))
            for body, q, f, b, h, p in zip(bodies, qids.tolist(), flags.tolist(), born.tolist(), hosts,
                                           props.to_pylist())]


def _property_columns(props: pa.Array) -> dict | None:
    """{name: one value per row} when every row's properties string (normalize's) has the first row's names
    in the same order, else None."""
    first = codec.string_to_properties(props[0].as_py())
    if not first:
        return {} if pc.max(pc.binary_length(props.cast(pa.binary()))).as_py() == 0 else None
    pattern = "^" + "".join(f"{re.escape(name)}\x01(?P<v{j}>[^\x01\x02]*)\x02" for j, name in enumerate(first)) + "$"
    if not pc.all(pc.match_substring_regex(props, pattern)).as_py():
        return None
    values = pc.extract_regex(props, pattern)
    return {name: values.field(j).to_pylist() for j, name in enumerate(first)}


def append_encoded(path: str, config: StoreConfig, msgs: list[EncodedRows], *, write_id: str | None = None,
                   sink: tuple[str, int] | None = None, stage: str | None = None) -> dict:
    """Append the encoded rows (in order) to the store at path as one transaction (transaction.py),
    holding its lock; returns counts."""
    from ..store.store import MessageStore
    from .transaction import two_phase_append, wait_visible
    store = MessageStore.open(path, config, start_services=False)
    try:
        handoff.remove_stale(path)
        got = two_phase_append(store, lambda: to_chunks(msgs, store.topics(), config.default_topic_queue_nums, stage),
                               sink=sink, write_id=write_id)
        wait_visible(store)
    finally:
        store.close()
    if got["skipped"]:
        log.warning("%s: nothing appended: %s", path, got["skipped"])
    else:
        log.info("%s: %d messages appended", path, got["messages"])
    return {"store": path, **got}
