"""The Spark writers' two-phase append: rows become visible all together, exactly once, or not at all.

RocketMQ's own way (its transactional messages, as rocketmq-flink's EXACTLY_ONCE sink uses them), over one
store whose lock the writer holds from the first half to the last commit record:

1. PREPARING: `{store}/config/sparkTransaction.json` records the transaction and the commitlog offset it
   starts at (fsynced, renamed into place); every row is appended as a half message (sysFlag
   TRANSACTION_PREPARED, properties TRAN_MSG=true and PGROUP=rmqstore-spark): the dispatcher never puts a
   half in a consume queue, so no consumer or reader sees it; the commitlog is flushed.
2. COMMIT POINT: the same file records state COMMITTING, the halves' range and, for a streaming sink, the
   batch id (for a batch write, its writeId): one atomic rename, fsynced.
3. COMMITTING: one commit record per half (sysFlag TRANSACTION_COMMIT, preparedTransactionOffset = the
   half's offset, a copy of it otherwise: messaging.transaction.end_record) in the halves' order; these
   are dispatched, and the rows become visible in their queues. The commitlog is flushed, the entry removed.

A writer that dies (SIGKILL, a failed job) leaves its entry. Whoever next writes to the store with the
Spark writer or sink (`recover`, run first under the lock) ends it: PREPARING -> a rollback record per
half (sysFlag TRANSACTION_ROLLBACK, empty body: never visible); COMMITTING -> the commit records not
written yet (counted from the commit range: those written are the first halves' commit records). So a
crash before the commit point leaves no row visible, ever; one after it leaves the rows committed, and
until the next write (or `rmqstore.spark.recover_writes(store)`, which does only that step) writes the
missing commit records, whoever opens or reads the store sees the prefix whose commit records were
written.

Everything appended between the recorded start and the commit point is the transaction's own (the lock
excludes every other writer), so halves need no transaction id property.
"""
from __future__ import annotations

import logging
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from ..store.format import codec
from ..store.conf.config_file import as_int, as_object, config_dir, dumps_pretty, load_config_file, string_to_file
from ..store.format.message import Message, MessageExt
from ..store.format.message_batch import MessageBatch

log = logging.getLogger(__name__)

FILE_NAME = "sparkTransaction.json"
PRODUCER_GROUP = "rmqstore-spark"
PREPARING, COMMITTING = "PREPARING", "COMMITTING"
CHUNK = 4096
Chunk = "MessageBatch | list[Message]"       # messages to one topic, at most CHUNK of them (two_phase_append)
_MASK = codec.TRANSACTION_TYPE_MASK


@dataclass
class OpenTransaction:
    txid: str
    state: str
    half_from: int
    half_to: int = -1
    halves: int = 0
    commit_from: int = -1


@dataclass
class TransactionLog:
    """The content of sparkTransaction.json: open transactions, the last batch id committed per streaming
    sink, and the writeIds of committed batch writes."""
    open: dict[str, OpenTransaction] = field(default_factory=dict)
    sinks: dict[str, int] = field(default_factory=dict)
    writes: dict[str, int] = field(default_factory=dict)      # writeId -> messages committed

    def to_json(self) -> dict:
        return {"open": {t.txid: {"state": t.state, "halfFrom": t.half_from, "halfTo": t.half_to,
                                  "halves": t.halves, "commitFrom": t.commit_from} for t in self.open.values()},
                "sinks": dict(sorted(self.sinks.items())), "writes": dict(sorted(self.writes.items()))}


def decode_log(data) -> TransactionLog:
    data = as_object(data, FILE_NAME)
    out = TransactionLog()
    for txid, t in as_object(data.get("open") or {}, "open").items():
        t = as_object(t, f"open[{txid!r}]")
        state = t.get("state")
        if state not in (PREPARING, COMMITTING):
            raise ValueError(f"open[{txid!r}].state is {state!r}")
        out.open[txid] = OpenTransaction(txid, state, as_int(t.get("halfFrom"), "halfFrom"),
                                         as_int(t.get("halfTo", -1), "halfTo"), as_int(t.get("halves", 0), "halves"),
                                         as_int(t.get("commitFrom", -1), "commitFrom"))
    out.sinks = {str(k): as_int(v, f"sinks[{k!r}]") for k, v in as_object(data.get("sinks") or {}, "sinks").items()}
    out.writes = {str(k): as_int(v, f"writes[{k!r}]")
                  for k, v in as_object(data.get("writes") or {}, "writes").items()}
    return out


def log_path(store_path) -> Path:
    return config_dir(store_path) / FILE_NAME


def load_log(store_path) -> TransactionLog:
    return load_config_file(log_path(store_path), decode_log) or TransactionLog()


def save_log(store_path, tlog: TransactionLog) -> None:
    string_to_file(dumps_pretty(tlog.to_json()), log_path(store_path), decode_log)


def half_of(msg: Message) -> Message:
    props = dict(msg.properties)
    props[codec.PROPERTY_TRAN_PREPARED] = "true"
    props[codec.PROPERTY_PRODUCER_GROUP] = PRODUCER_GROUP
    return Message(topic=msg.topic, body=msg.body, queue_id=msg.queue_id, flag=msg.flag,
                   sys_flag=(msg.sys_flag & ~_MASK) | codec.TRANSACTION_PREPARED_TYPE,
                   born_timestamp=msg.born_timestamp, born_host=msg.born_host, properties=props)


def _records(store, start: int, end: int, tran: int) -> Iterator[MessageExt]:
    """The records of transaction type `tran` in [start, end) of the store's commitlog, in order."""
    from ..store.reads.reader import CommitLogReader
    store.commit_log.queue.commit()
    with CommitLogReader(store.path) as r:
        for m in r.messages(from_offset=start):
            if m.commit_log_offset >= end:
                break
            if m.sys_flag & _MASK == tran:
                yield m


def _put_all(store, msgs: Chunk, what: str, delay_rewrite: bool) -> list[int]:
    """Put msgs and dispatch them (in this thread: the writer's store runs no dispatcher thread, and a columnar
    put hands the dispatcher its own columns, _hinted, instead of records to parse back); their commitlog
    offsets, or RuntimeError naming the first refusal. A columnar batch's answer (PutMessageResults) is read
    as columns, never as a result per message."""
    with _hinted(store):
        res = store.put_messages(msgs, delay_rewrite=delay_rewrite)
        store.dispatcher.do_reput()
    if getattr(res, "all_ok", None) is True:
        return list(res.wrote_offsets)
    bad = [r for r in res if not r.ok]
    if bad:
        raise RuntimeError(f"{store.path}: {what} failed with {bad[0].status.value}: {bad[0].reason}")
    return [r.append_result.wrote_offset for r in res]


@contextmanager
def _hinted(store):
    """Dispatch hints on (commit_log.dispatch_hints) while a put of _put_all runs, as a running dispatcher has
    them: the do_reput after it takes them (and nothing else does: off again after)."""
    cl = store.commit_log
    if cl.dispatch_hints is not None:
        yield
        return
    cl.dispatch_hints = {}
    try:
        yield
    finally:
        cl.dispatch_hints = None


def _end_all(store, halves: Iterable[MessageExt], tran: int) -> int:
    """Rollback records (RocketMQ's end_record) or commit records (_commit_of, as the writer makes them:
    the same properties) of halves read back, appended a chunk at a time; how many."""
    from ..messaging.transaction import end_record
    n = 0
    chunk: list[Message] = []
    for h in halves:
        chunk.append(_commit_of(h, h.commit_log_offset) if tran == codec.TRANSACTION_COMMIT_TYPE
                     else end_record(h, tran))
        if len(chunk) == CHUNK:
            _put_all(store, chunk, "ending a transaction", True)
            n, chunk = n + len(chunk), []
    if chunk:
        _put_all(store, chunk, "ending a transaction", True)
        n += len(chunk)
    return n


def recover(store) -> list[dict]:
    """End the transactions a dead writer left open in this store (opened by the caller, who holds its
    lock): roll back those before their commit point, finish committing the others. Returns what was done."""
    tlog = load_log(store.path)
    done = []
    for t in list(tlog.open.values()):
        end = store.get_max_phy_offset()
        if t.state == PREPARING:
            n = _end_all(store, list(_records(store, t.half_from, end, codec.TRANSACTION_PREPARED_TYPE)),
                         codec.TRANSACTION_ROLLBACK_TYPE)
            log.warning("%s: Spark write %s died before its commit point: %d half messages rolled back",
                        store.path, t.txid, n)
            done.append({"transaction": t.txid, "rolledBack": n})
        else:
            written = sum(1 for _ in _records(store, t.commit_from, end, codec.TRANSACTION_COMMIT_TYPE))
            rest = (h for i, h in enumerate(_records(store, t.half_from, t.half_to,
                                                     codec.TRANSACTION_PREPARED_TYPE)) if i >= written)
            n = _end_all(store, rest, codec.TRANSACTION_COMMIT_TYPE)
            if written + n != t.halves:
                raise RuntimeError(f"{store.path}: Spark write {t.txid}: {t.halves} halves recorded, "
                                   f"{written} + {n} commit records: {log_path(store.path)} disagrees "
                                   "with the commitlog")
            log.warning("%s: Spark write %s died after its commit point: %d commit records written now",
                        store.path, t.txid, n)
            done.append({"transaction": t.txid, "committed": n})
        store.flush_all()
        del tlog.open[t.txid]
        save_log(store.path, tlog)
    return done


def half_chunk(c: Chunk) -> Chunk:
    """The half messages of a chunk (half_of, column-wise for a MessageBatch)."""
    if not isinstance(c, MessageBatch):
        return [half_of(m) for m in c]
    props = dict(zip(*c.property_columns()))
    props[codec.PROPERTY_TRAN_PREPARED] = "true"
    props[codec.PROPERTY_PRODUCER_GROUP] = PRODUCER_GROUP
    return MessageBatch(c.topic, c.bodies, queue_ids=c.queue_ids, properties=props, flag=c.flag,
                        sys_flag=(c.sys_flag & ~_MASK) | codec.TRANSACTION_PREPARED_TYPE,
                        born_timestamp=c.born_timestamp, born_host=c.born_host, store_host=c.store_host)


def commit_chunk(half: Chunk, offsets) -> Chunk:
    """The commit records of a chunk of halves written at offsets (_commit_of, column-wise for a
    MessageBatch: one property order for all, as its messages share their names)."""
    if not isinstance(half, MessageBatch):
        return [_commit_of(h, off) for h, off in zip(half, offsets)]
    return MessageBatch(half.topic, half.bodies, queue_ids=half.queue_ids,
                        properties=_broker_order(dict(zip(*half.property_columns()))), flag=half.flag,
                        sys_flag=(half.sys_flag & ~_MASK) | codec.TRANSACTION_COMMIT_TYPE,
                        born_timestamp=half.born_timestamp, born_host=half.born_host, store_host=half.store_host,
                        prepared_transaction_offset=np.asarray(offsets, dtype=np.int64))


def two_phase_append(store, chunks: list[Chunk] | Callable[[], list[Chunk]], *,
                     sink: tuple[str, int] | None = None, write_id: str | None = None) -> dict:
    """Append the messages of chunks (each of one topic and at most CHUNK messages: a MessageBatch, or a
    list of Messages; in the order to append) to the open store (lock held) as one transaction (see the
    module docstring). With sink=(sink id, batch id): skipped when that batch (or a later one) is committed
    already; with write_id: skipped when a write of that id is. chunks may be a function making them, called
    only when not skipped (a re-run of a committed job builds no message). Returns {"messages": appended,
    "skipped": reason or None}."""
    recovered = recover(store)
    tlog = load_log(store.path)
    if sink is not None and tlog.sinks.get(sink[0], -1) >= sink[1]:
        return {"messages": 0, "skipped": f"batch {sink[1]} of sink {sink[0]} is committed already",
                "recovered": recovered}
    if write_id is not None and write_id in tlog.writes:
        return {"messages": 0, "skipped": f"writeId {write_id} is committed already", "recovered": recovered}
    if callable(chunks):
        chunks = chunks()
    # a MessageBatch of one topic is what the columnar path takes (with _put_all reading its answer as
    # columns)
    halves = [half_chunk(c) for c in chunks]
    del chunks
    total = sum(map(len, halves))
    t = OpenTransaction(uuid.uuid4().hex, PREPARING, store.get_max_phy_offset())
    tlog.open[t.txid] = t
    save_log(store.path, tlog)                                  # durable before the first half
    try:
        offsets = [_put_all(store, h, "appending half messages", False) for h in halves]
        store.flush_all()
    except BaseException:
        _roll_back_now(store, t.txid)
        raise
    t.state, t.half_to, t.halves, t.commit_from = COMMITTING, store.get_max_phy_offset(), total, \
        store.get_max_phy_offset()
    if sink is not None:
        tlog.sinks[sink[0]] = sink[1]
    if write_id is not None:
        tlog.writes[write_id] = total
    save_log(store.path, tlog)                                  # the commit point
    for h, offs in zip(halves, offsets):
        _put_all(store, commit_chunk(h, offs), "appending commit records", True)
    store.flush_all()
    del tlog.open[t.txid]
    save_log(store.path, tlog)
    return {"messages": total, "skipped": None, "recovered": recovered}


def _roll_back_now(store, txid: str) -> None:
    """The halves phase of txid failed: roll back what it wrote now (recover), not at the next write; when
    that fails too (a full disk), the next write does it."""
    try:
        recover(store)
    except Exception as e:      # the original failure is what the caller raises
        log.warning("%s: Spark write %s failed before its commit point and its halves could not be rolled back "
                    "now (%s): the next write to the store rolls them back", store.path, txid, e)


_ORDERS: dict[tuple, list[str]] = {}


def _broker_order(props: dict) -> dict:
    """props (values, or columns of values) in the order of the broker's HashMap (java_map.hashmap_order),
    every one kept (an empty value too: the commit record carries what the half does). That order depends
    only on the names and the order they are put in, so it is computed once per tuple of names."""
    names = tuple(props)
    order = _ORDERS.get(names)
    if order is None:
        from ..store.format.java_map import hashmap_order
        order = list(hashmap_order(dict.fromkeys(names, "")))
        if len(_ORDERS) > 4096:
            _ORDERS.clear()
        _ORDERS[names] = order
    return {k: props[k] for k in order}


def _commit_of(half: Message, offset: int) -> Message:
    """messaging.transaction.end_record for a half we wrote (without reading it back)."""
    return Message(topic=half.topic, body=half.body, queue_id=half.queue_id, flag=half.flag,
                   sys_flag=(half.sys_flag & ~_MASK) | codec.TRANSACTION_COMMIT_TYPE,
                   born_timestamp=half.born_timestamp, born_host=half.born_host,
                   prepared_transaction_offset=offset, properties=_broker_order(half.properties))


def wait_visible(store, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while not store.dispatcher.wait_dispatched(timeout=min(30.0, timeout)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{store.path}: the appended messages were not dispatched in {timeout:.0f} s")


def recover_writes(store_path, config=None) -> list[dict]:
    """Open the store (taking its lock), end what a dead Spark writer left open (recover), close it."""
    from ..store.conf.config import StoreConfig
    from ..store.store import MessageStore
    store = MessageStore.open(store_path, config or StoreConfig(), start_services=False)
    try:
        done = recover(store)
        wait_visible(store)
    finally:
        store.close()
    return done
