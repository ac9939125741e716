"""df.write.format("rocketmq").mode("append").save(STORE): append rows as messages, exactly once or none.

A store has one writer at a time (its `lock` file), and a Spark job has many tasks, some of which may run
twice (retries, speculation). So:

* executors encode: each task checks and normalises its rows (topic, body, properties built from the
  tags / keys / properties columns, queue id, flag, born time and host) into one Arrow IPC buffer, its
  commit message; nothing is written by a task;
* the driver appends: commit() opens the store (taking its lock: a store open in another process fails
  with StoreLockedError naming it) and appends the tasks' messages (grouped by topic, in partition order
  within each topic: each queue's order is the rows' order) as one two-phase
  transaction (spark/transaction.py: half messages, a durable commit point, commit records), then waits
  until they are dispatched and closes the store. A failed job aborts before anything was appended, a
  retried task's message replaces its first attempt's, and a driver killed mid-append leaves either
  nothing visible (halves only: rolled back by the next write) or a committed transaction (finished by
  the next write). Option writeId (like Delta's txnAppId): a write whose id the store has committed is
  skipped, so re-running a job whose driver died gives exactly one copy.

Everything passes through the driver: this suits what a broker's store takes (GBs), not more. Each row
costs two commitlog records (its half and its commit record).

Columns: topic (string, required), body (binary or string, required), tags (string), keys (array<string>,
or a string of space-separated keys), properties (map<string,string>), queueId (int: when null or absent the
topic's queues are used round robin: those the store has, else defaultTopicQueueNums of the config), flag
(int), bornTimestamp (timestamp or epoch ms; default: now), bornHost (string ip:port). The other columns of
the rocketmq read schema are ignored (a DataFrame read from a store can be written to another); any other
column is an error.
"""
from __future__ import annotations

import io
import logging
import os
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from ..store import codec, store_fs, validation
from ..store.config import StoreConfig
from ..errors import ConfigError, StoreLockedError
from . import storeview as SV
from .records import COLUMNS

log = logging.getLogger(__name__)

WRITABLE = {"topic", "body", "tags", "keys", "properties", "queueId", "flag", "bornTimestamp", "bornHost"}
IGNORED = set(COLUMNS) - WRITABLE
NORMAL = pa.schema([("topic", pa.string()), ("queueId", pa.int32()), ("flag", pa.int32()),
                    ("bornTimestamp", pa.int64()), ("bornHost", pa.string()), ("properties", pa.string()),
                    ("body", pa.binary())])


class WriteError(ValueError):
    """A row or option that cannot be written (names the column or option)."""


@dataclass
class EncodedRows(WriterCommitMessage):
    partition: int
    attempt: int
    rows: int
    payload: bytes          # Arrow IPC stream in NORMAL


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
        raise WriteError("the rocketmq sink only appends: use mode('append')")
    unknown = sorted(set(k.lower() for k in options) - set(known))
    if unknown:
        raise WriteError(f"unknown option {unknown[0]!r} of the rocketmq sink (known: {', '.join(known)})")
    path = _store_path(options)
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise WriteError(f"option 'path': {path} is not a directory")
        if SV.lock_held_elsewhere(path):
            raise StoreLockedError(path)
        names = set(os.listdir(path))
        if names and not names & {"commitlog", "consumequeue", "index", "lock", "checkpoint", "abort"}:
            raise WriteError(f"option 'path': {path} is not a RocketMQ store directory (no commitlog/) and not empty")
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


def normalize(batch: pa.RecordBatch, max_message_size: int, now_ms: int) -> pa.RecordBatch:
    """Check and normalise rows: one NORMAL row per input row, or WriteError naming the column and row."""
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
    sizes = (codec.HEADER_STRUCTS[3].size + pc.binary_length(body).to_numpy(zero_copy_only=False) + 3 + tlen
             + pc.binary_length(props.cast(pa.binary())).to_numpy(zero_copy_only=False))
    big = np.flatnonzero(sizes > max_message_size)
    if len(big):
        raise WriteError(f"row {int(big[0])}: a message of {int(sizes[big[0]])} bytes exceeds maxMessageSize "
                         f"{max_message_size}")
    return pa.RecordBatch.from_arrays([topic.cast(pa.string()), qid, flag, born, host.cast(pa.string()), props, body],
                                      schema=NORMAL)


def _topics(batch: pa.RecordBatch):
    """The topic column, checked (not null, 1..MAX_TOPIC_LENGTH bytes, the store's rule), and its lengths."""
    topic = _col(batch, "topic")
    if topic.null_count:
        raise WriteError(f"column 'topic' is null in row {int(np.flatnonzero(topic.is_null().to_numpy(zero_copy_only=False))[0])}")
    tlen = pc.binary_length(topic.cast(pa.binary())).to_numpy(zero_copy_only=False)
    bad = np.flatnonzero((tlen == 0) | (tlen > codec.MAX_TOPIC_LENGTH))
    if len(bad):
        raise WriteError(f"column 'topic': {topic[int(bad[0])].as_py()!r} is {int(tlen[bad[0]])} bytes, "
                         f"RocketMQ allows 1 to {codec.MAX_TOPIC_LENGTH}")
    for t in pc.unique(topic.cast(pa.string())).to_pylist():     # the store's rule (validation.py), per topic
        why = validation.topic_problem(t)
        if why:
            raise WriteError(f"column 'topic': {why}")
    return topic, tlen


def _bodies(batch: pa.RecordBatch):
    """The body column as binary (a string column is taken as its UTF-8 bytes); never null."""
    body = _col(batch, "body")
    if pa.types.is_string(body.type) or pa.types.is_large_string(body.type):
        body = pc.cast(body, pa.binary())
    if body.type != pa.binary():
        body = body.cast(pa.binary())
    if body.null_count:
        raise WriteError("column 'body' is null in some row")
    return body


def _properties(batch: pa.RecordBatch, n: int) -> pa.Array:
    """Each row's properties string: the properties map, then tags (TAGS) and keys (KEYS, words joined by a
    space), checked by the store's rule and against MAX_PROPERTIES_LENGTH."""
    tags = _col(batch, "tags")
    keys = _col(batch, "keys")
    props_col = _col(batch, "properties")
    tags_l = tags.to_pylist() if tags is not None else None
    if keys is not None:
        keys_l = keys.to_pylist()
        if pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type):
            keys_l = [None if k is None else [w for w in k.split(" ") if w] for k in keys_l]
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
            raise WriteError(f"row {i}: {why}")
        s = codec.properties_to_string(p)
        if len(s.encode("utf-8")) > codec.MAX_PROPERTIES_LENGTH:
            raise WriteError(f"row {i}: properties of {len(s.encode())} bytes exceed {codec.MAX_PROPERTIES_LENGTH}")
        out_props.append(s)
    return pa.array(out_props, type=pa.string())


def _queue_ids(batch: pa.RecordBatch, n: int) -> pa.Array:
    """The queueId column as int32 (null: the writer picks), each in [0, MAX_QUEUE_ID]."""
    qid = _col(batch, "queueId")
    qid = qid.cast(pa.int32()) if qid is not None else pa.nulls(n, pa.int32())
    if qid.null_count < n and pc.min(qid).as_py() is not None and pc.min(qid).as_py() < 0:
        raise WriteError("column 'queueId' has a negative queue id")
    if qid.null_count < n and pc.max(qid).as_py() is not None and pc.max(qid).as_py() > validation.MAX_QUEUE_ID:
        raise WriteError(f"column 'queueId' has queue id {pc.max(qid).as_py()}, above {validation.MAX_QUEUE_ID}")
    return qid


def _born_hosts(batch: pa.RecordBatch, n: int) -> pa.Array:
    """The bornHost column, each non-null value a host:port the codec can encode."""
    host = _col(batch, "bornHost")
    if host is None:
        return pa.nulls(n, pa.string())
    for i, h in enumerate(host.to_pylist()):
        if h is not None:
            try:
                codec.parse_host(h)
            except ValueError as e:
                raise WriteError(f"column 'bornHost', row {i}: {e}") from None
    return host


def encode_task(iterator, max_message_size: int) -> EncodedRows:
    """A task's rows (Arrow batches), checked and normalised, as its commit message."""
    from pyspark import TaskContext
    ctx = TaskContext.get()
    now = int(time.time() * 1000)
    sink = io.BytesIO()
    rows = 0
    with pa.ipc.new_stream(sink, NORMAL) as w:
        for batch in iterator:
            if batch.num_rows:
                nb = normalize(batch, max_message_size, now)
                w.write_batch(nb)
                rows += nb.num_rows
    return EncodedRows(ctx.partitionId() if ctx else 0, ctx.attemptNumber() if ctx else 0, rows, sink.getvalue())


class RocketMQWriter(DataSourceArrowWriter):
    def __init__(self, options: dict, schema, overwrite: bool):
        self.options = dict(options)
        self.path, self.config = check_target(self.options, overwrite)
        check_schema(schema)

    def write(self, iterator) -> EncodedRows:
        return encode_task(iterator, self.config.max_message_size)

    def commit(self, messages) -> None:
        msgs = sorted((m for m in messages if m is not None), key=lambda m: m.partition)
        append_encoded(self.path, self.config, msgs, write_id=self.options.get("writeId")
                       or self.options.get("writeid"))

    def abort(self, messages) -> None:
        log.warning("%s: write aborted: nothing was appended", self.path)


def to_messages(msgs: list[EncodedRows], queues: dict[str, list[int]], default_queues: int) -> list:
    """The encoded rows as Messages, in order; null queue ids round robin over the topic's queues."""
    from ..store.message import DEFAULT_HOST, Message
    rr: dict[str, int] = {}
    out = []
    for m in msgs:
        if not m.rows:
            continue
        with pa.ipc.open_stream(m.payload) as r:
            for batch in r:
                d = batch.to_pydict()
                for topic, qid, flag, born, host, props, body in zip(
                        d["topic"], d["queueId"], d["flag"], d["bornTimestamp"], d["bornHost"],
                        d["properties"], d["body"]):
                    if qid is None:
                        qs = queues.get(topic) or list(range(default_queues))
                        i = rr.get(topic, 0)
                        qid = qs[i % len(qs)]
                        rr[topic] = i + 1
                    out.append(Message(topic=topic, body=body, queue_id=qid, flag=flag, born_timestamp=born,
                                       born_host=host or DEFAULT_HOST, properties=codec.string_to_properties(props)))
    return out


def append_encoded(path: str, config: StoreConfig, msgs: list[EncodedRows], *, write_id: str | None = None,
                   sink: tuple[str, int] | None = None) -> dict:
    """Append the encoded rows (in order) to the store at path as one transaction (transaction.py),
    holding its lock; returns counts."""
    from ..store.store import MessageStore
    from .transaction import two_phase_append, wait_visible
    store = MessageStore.open(path, config, start_services=False)
    try:
        got = two_phase_append(store, lambda: to_messages(msgs, store.topics(), config.default_topic_queue_nums),
                               sink=sink, write_id=write_id)
        wait_visible(store)
    finally:
        store.close()
    if got["skipped"]:
        log.warning("%s: nothing appended: %s", path, got["skipped"])
    else:
        log.info("%s: %d messages appended", path, got["messages"])
    return {"store": path, **got}
