"""CommitLog: every message of every topic, appended to one queue of mapped files.

Record layout: see codec. The put path assigns, under one lock, the physical offset, the queue offset of
(topic, queueId) and the store timestamp; everything that does not depend on them (properties, topic,
CRC, hosts) is encoded before the lock is taken. A record that does not fit the current file leaves an
END_OF_FILE blank record there and goes to the next file.

Three ways in, one byte layout (tests/test_put_path.py holds them to RocketMQ's files and to each other):

- put_message: one message, encoded by _encode (topic, hosts and "topic-queueId" keys come from caches),
  packed with the header Struct and written with one write;
- put_messages, general path (_append_locked): any batch, message by message, one write per file;
- put_messages, columnar path (message_batch.encode_columns / _put_columnar): a batch of at least COLUMNAR_MIN valid
  messages with one topic and the same IPv4 hosts (what a producer sends) is encoded a field at a time
  over the whole batch: numpy for the header fields and queue offsets, one str.join for all the
  properties when the messages share their property names, one hex() for all the msgIds. A batch it
  cannot take (mixed topics, IPv6, a message to refuse, ...) goes to the general path untouched.
"""
from __future__ import annotations

import logging
import struct
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from . import codec, validation
from .config import StoreConfig
from ..errors import CorruptStoreError
from .mapped_file import MappedFile, MappedFileQueue
from .message_batch import COLUMNAR_MIN, INT32, INT64, EncodedBatch, MessageBatch, NotColumnar, chop, encode_columns, int_column, props_from_columns, props_of_dicts
from .message import AppendMessageResult, AppendMessageStatus, Message, MessageExt, PutMessageResult, PutMessageResults, PutMessageStatus

log = logging.getLogger(__name__)

_HS = codec.HEADER_STRUCTS
_HEADER_V4 = codec.HEADER_V4
_MAGIC = codec.MESSAGE_MAGIC_CODE
_BLANK_MIN = codec.END_FILE_MIN_BLANK_LENGTH
_MAX_PROPS = codec.MAX_PROPERTIES_LENGTH
_MAX_TOPIC = codec.MAX_TOPIC_LENGTH
_MAX_QUEUE_ID = validation.MAX_QUEUE_ID
_QUEUE_IDS = (0, _MAX_QUEUE_ID)
_PUT_OK = PutMessageStatus.PUT_OK
_APPEND_OK = AppendMessageStatus.PUT_OK
_ILLEGAL = PutMessageStatus.MESSAGE_ILLEGAL
_PROPS_EXCEEDED = PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
_CREATE_FAILED = PutMessageStatus.CREATE_MAPEDFILE_FAILED
_FLUSH_TIMEOUT = PutMessageStatus.FLUSH_DISK_TIMEOUT
_NOT_AVAILABLE = PutMessageStatus.SERVICE_NOT_AVAILABLE
_crc32 = codec.crc32
_props_bytes = codec.encode_properties
_pack_len = struct.Struct(">h").pack
_CACHE_LIMIT = 4096     # entries of the topic and host caches before they start over
DISPATCH_HINTS_MAX = 256    # batches handed to the dispatcher and not taken yet
DISPATCH_STALL = 0.005      # seconds: a writer waits for a dispatcher behind it while it takes hints ...
DISPATCH_WAIT_MAX = 0.05    # ... and this long at most per put

class AppendFailed(OSError):
    """A write of the put path failed (ENOSPC, EIO) after part of a batch was stored: `results` says, per
    message, what is true (PUT_OK for the records written before the failure, a failure status for the
    rest). Callers record the failure (the store refuses puts) and answer `results`."""

    def __init__(self, error: OSError, results):
        super().__init__(error.errno, error.strerror or str(error))
        self.error = error
        self.results = results


def refuse(status: PutMessageStatus, reason: str) -> PutMessageResult:
    """A refused message's answer; the warning names the reason (the argument refused)."""
    log.warning("put refused (%s): %s", status.value, reason)
    return PutMessageResult(status, None, reason)


def _undo_write(mf: MappedFile, pos: int, size: int) -> None:
    """A write at pos failed part way: zero what may have reached the file, so that no complete record of a
    put answered with a failure is found there by a later recovery (a later put overwrites it anyway)."""
    try:
        mf.zero_data(pos, pos + size)
    except OSError as e:
        log.error("%s: cannot zero the failed write at %d (%d bytes): %s", mf.path, pos, size, e)


def _write(mf: MappedFile, pos: int, data) -> None:
    """mf.write_at, undone (_undo_write) if it raises."""
    try:
        mf.write_at(pos, data)
    except OSError:
        _undo_write(mf, pos, len(data))
        raise


class CommitLog:
    """The commitlog of one store directory.

    Guarantees of the put path: a message is validated (validation.py) before the lock is taken; a result
    PUT_OK names the offset of a record that was written and the queue offset it is dispatched at; queue
    offsets advance only for records written, so a failed write leaves no gap in any queue; a batch whose
    write fails part way answers PUT_OK for exactly the records written (raising AppendFailed)."""

    def __init__(self, store_dir: str | Path, config: StoreConfig):
        self.config = config
        self.store_dir = Path(store_dir)
        self.queue = MappedFileQueue(self.store_dir / "commitlog", config.mapped_file_size_commit_log,
                                     use_write_buffer=config.transient_store_pool_enable)
        self.file_size = config.mapped_file_size_commit_log
        # Next queue offset per "topic-queueId" (RocketMQ's topicQueueTable).
        self.topic_queue_table: dict[str, int] = {}
        self.put_lock = threading.Lock()
        self.begin_time_in_lock = 0
        self.default_store_host = config.store_host
        # Called with the max wrote offset after each append, outside the lock: the flush policy hook.
        # False turns the appended messages' results into FLUSH_DISK_TIMEOUT.
        self.on_appended: Callable[[int], bool] | None = None
        # start offset -> DispatchBatch of records the columnar path wrote, for the dispatcher (None: off)
        self.dispatch_hints: dict[int, codec.DispatchBatch] | None = None
        # Encodings that do not depend on the message: topic -> (TOPICLENGTH + TOPIC, {queueId: key}),
        # host -> (address, port, sysFlag bit as born host, as store host, msgId prefix).
        self._topics: dict = {}
        self._refused_topics: dict = {}     # topic -> why (validation.topic_problem)
        self._hosts: dict = {}

    def load(self) -> None:
        self.queue.load()

    # --- put path -------------------------------------------------------------------------------
    def put_message(self, msg: Message, wait: bool = True) -> PutMessageResult:
        """Append one message: encoded by _encode (which refuses what must be refused), placed under the lock.
        wait=False: the flush policy hook (on_appended) is not called (the caller flushes)."""
        e = self._encode(msg)
        if type(e) is not tuple:
            return e
        (hs, size, crc, queue_id, flag, sys_flag, born_ts, born_addr, born_port, store_addr, store_port,
         reconsume, prepared, body, tail, key, id_prefix) = e
        q = self.queue
        with self.put_lock:
            now = time.time_ns() // 1_000_000
            self.begin_time_in_lock = now
            try:
                files = q.files
                mf = files[-1] if files else None
                if mf is None or mf.wrote_position >= mf.file_size:
                    mf = q.get_last_mapped_file(0)
                    if mf is None:
                        return PutMessageResult(_CREATE_FAILED)
                pos = mf.wrote_position
                if pos + size + _BLANK_MIN > mf.file_size:
                    mf = self._roll(mf, pos)
                    if mf is None:
                        return PutMessageResult(_CREATE_FAILED)
                    pos = mf.wrote_position
                phys = mf.file_from_offset + pos
                table = self.topic_queue_table
                qoff = 0 if key is None else table.get(key, 0)
                try:
                    header = hs.pack(size, _MAGIC, crc, queue_id, flag, qoff, phys, sys_flag, born_ts, born_addr,
                                     born_port, now, store_addr, store_port, reconsume, prepared, len(body))
                except struct.error as err:
                    return refuse(_ILLEGAL, f"a header field is out of range: {err}")
                data = b"".join((header, body, tail))
                try:
                    mf.write_at(pos, data)
                except OSError as err:
                    _undo_write(mf, pos, len(data))
                    raise OSError(err.errno, f"{mf.path}: write at {pos} failed: {err.strerror or err}") from err
                if key is not None:
                    table[key] = qoff + 1
                mf.store_timestamp = now
                q.store_timestamp = now
            finally:
                self.begin_time_in_lock = 0
        result = PutMessageResult(_PUT_OK, AppendMessageResult(_APPEND_OK, phys, size, id_prefix + "%016X" % phys,
                                                               now, qoff))
        hook = self.on_appended if wait else None
        if hook is not None and not hook(q.get_max_wrote_position()):
            return PutMessageResult(_FLUSH_TIMEOUT, result.append_result)
        return result

    def put_messages(self, msgs: Iterable[Message] | MessageBatch, wait: bool = True) -> Sequence[PutMessageResult]:
        """Append messages (a list of Messages or a MessageBatch) in order, under one lock hold; one result
        per message (a PutMessageResults when the columnar path took the batch: built on access).
        wait=False: as put_message's."""
        results = failed = None
        if isinstance(msgs, MessageBatch):
            if len(msgs) >= COLUMNAR_MIN:
                try:
                    batch = self._encode_message_batch(msgs)
                except (NotColumnar, AttributeError, TypeError, ValueError):
                    batch = None
                if batch is not None:
                    results, failed = self._put_columnar(batch)
            if results is None:
                msgs = msgs.to_messages()
        elif not isinstance(msgs, list):
            msgs = list(msgs)
        if results is None:
            n = len(msgs)
            if n <= 1:
                return [self.put_message(msgs[0], wait)] if n else []
            if n >= COLUMNAR_MIN:
                try:
                    batch = self._encode_columnar(msgs)
                except (NotColumnar, AttributeError, TypeError, ValueError):
                    batch = None    # the general path refuses (or raises for) what it must, message by message
                if batch is not None:
                    results, failed = self._put_columnar(batch)
        if results is None:
            return self.append_encoded([self._encode(m) for m in msgs], wait)
        hook = self.on_appended if wait else None
        if hook is not None and (results.appended if type(results) is PutMessageResults
                                 else any(r.status is _PUT_OK for r in results)):
            if not hook(self.queue.get_max_wrote_position()):
                if type(results) is PutMessageResults:
                    results.mark_flush_failed(_FLUSH_TIMEOUT)
                else:
                    for i, r in enumerate(results):
                        if r.status is _PUT_OK:
                            results[i] = PutMessageResult(_FLUSH_TIMEOUT, r.append_result)
        if failed is not None:
            raise AppendFailed(failed, results)
        return results  # type: ignore[return-value]

    def encode(self, msg: Message):
        """What append_encoded takes for msg: a tuple, or the PutMessageResult that refuses it (validated
        here, in the caller's thread: the group commit encodes before a put joins a round)."""
        return self._encode(msg)

    def append_encoded(self, encoded: list, wait: bool = True) -> list[PutMessageResult]:
        """The general path: append messages encoded by encode() (refusals are answered as they are), in
        order, under one lock hold; one result per message. Raises AppendFailed when a write failed (its
        results say which messages are stored). wait=False: as put_message's."""
        n = len(encoded)
        results: list = [None] * n
        with self.put_lock:
            now = time.time_ns() // 1_000_000
            self.begin_time_in_lock = now
            try:
                failed = self._append_locked(encoded, results, now)
            finally:
                self.begin_time_in_lock = 0
        for i, r in enumerate(results):
            if type(r) is tuple:
                phys, size, qoff, id_prefix = r
                results[i] = PutMessageResult(_PUT_OK, AppendMessageResult(
                    _APPEND_OK, phys, size, id_prefix + "%016X" % phys, now, qoff))
        hook = self.on_appended if wait else None
        if hook is not None and any(r.status is _PUT_OK for r in results):
            if not hook(self.queue.get_max_wrote_position()):
                for i, r in enumerate(results):
                    if r.status is _PUT_OK:
                        results[i] = PutMessageResult(_FLUSH_TIMEOUT, r.append_result)
        if failed is not None:
            raise AppendFailed(failed, results)
        return results

    # --- encoding (outside the lock) ---------------------------------------------------------------
    def _topic(self, topic):
        """(TOPICLENGTH + TOPIC bytes, {queueId: "topic-queueId"}) of a topic, or the reason (a str) the
        store refuses it (validation.topic_problem). Checked once per topic: both answers are cached, the
        refused ones apart (a hit in _topics needs no check)."""
        info = self._topics.get(topic)
        if info is not None:
            return info
        why = self._refused_topics.get(topic) or validation.topic_problem(topic)
        if why is not None:
            if len(self._refused_topics) >= _CACHE_LIMIT:
                self._refused_topics.clear()
            self._refused_topics[topic] = why
            return why
        if len(self._topics) >= _CACHE_LIMIT:
            self._topics.clear()
        raw = topic.encode("utf-8")
        info = self._topics[topic] = (bytes((len(raw),)) + raw, {})
        return info

    def _host(self, host):
        """(address, port, born-host sysFlag bit, store-host sysFlag bit, msgId prefix) of 'ip:port'."""
        h = self._hosts.get(host)
        if h is None:
            addr, port, v6 = codec.parse_host(host)
            if len(self._hosts) >= _CACHE_LIMIT:
                self._hosts.clear()
            h = self._hosts[host] = (addr, port, codec.SYSFLAG_BORNHOST_V6 if v6 else 0,
                                     codec.SYSFLAG_STOREHOST_V6 if v6 else 0, codec.message_id_prefix(addr, port))
        return h

    def _encode(self, msg: Message):
        """Everything of a record that does not depend on its place in the log, as a tuple; or the
        PutMessageResult that refuses the message (MESSAGE_ILLEGAL or PROPERTIES_SIZE_EXCEEDED, with the
        reason)."""
        try:
            topic = msg.topic
            ti = self._topics.get(topic)
            if ti is None:
                ti = self._topic(topic)
                if type(ti) is str:
                    return refuse(_ILLEGAL, ti)
            queue_id = msg.queue_id
            key = ti[1].get(queue_id)   # the topic's "topic-queueId" keys: made for valid queue ids only
            if key is None:
                queue_id = validation.queue_id_or_problem(queue_id)
                if type(queue_id) is str:
                    return refuse(_ILLEGAL, queue_id)
                key = ti[1][queue_id] = f"{topic}-{queue_id}"
            props = msg.properties
            if props:
                try:    # validation.encode_properties, inline: one scan counts the separators (2 per pair)
                    p = ("\x02".join(map("\x01".join, props.items())) + "\x02").encode()
                except TypeError:
                    p = b"\x01"
                if len(p.translate(None, b"\x01\x02")) + 2 * len(props) != len(p) or "" in props:
                    p = validation.encode_properties(props)
                    if type(p) is str:
                        return refuse(_ILLEGAL, p)
            else:
                p = b""
            body = msg.body
            if type(body) is not bytes:
                if body is None:
                    body = b""
                else:
                    why = validation.body_problem(body)
                    if why is not None:
                        return refuse(_ILLEGAL, why)
            hosts = self._hosts
            host = msg.born_host
            born = hosts.get(host) or self._host(host)
            host = msg.store_host or self.default_store_host
            store = hosts.get(host) or self._host(host)
            sys_flag = (msg.sys_flag & ~0x30) | born[2] | store[3]
        except (ValueError, TypeError, AttributeError) as e:
            return refuse(_ILLEGAL, f"illegal message: {e}")
        if len(p) > _MAX_PROPS:
            return refuse(_PROPS_EXCEEDED, f"properties of {len(p)} bytes exceed {_MAX_PROPS}")
        hs = _HS[sys_flag >> 4 & 3]
        tail = b"".join((ti[0], _pack_len(len(p)), p))
        size = hs.size + len(body) + len(tail)
        if size > self.config.max_message_size or size + _BLANK_MIN > self.file_size:
            return refuse(_ILLEGAL, f"message of {size} bytes (body {len(body)}) exceeds maxMessageSize "
                                    f"{self.config.max_message_size} or the file size {self.file_size}")
        if sys_flag & codec.TRANSACTION_PREPARED_TYPE:     # prepared (0x4) and rolled back (0xc)
            key = None                                      # take no queue offset
        return (hs, size, _crc32(body) & 0x7FFFFFFF, queue_id, msg.flag, sys_flag, msg.born_timestamp,
                born[0], born[1], store[0], store[1], msg.reconsume_times, msg.prepared_transaction_offset, body,
                tail, key, store[4])

    def _columnar_target(self, topic, born_host, store_host):
        """(topic info, born host, store host) for the columnar path; None for the general path (an illegal
        topic or host, or IPv6 hosts: another header layout)."""
        try:
            ti = self._topic(topic)
            born = self._host(born_host)
            store = self._host(store_host or self.default_store_host)
        except (ValueError, TypeError, AttributeError):
            return None
        if type(ti) is not tuple or born[2] or store[3]:
            return None
        return ti, born, store

    def _encode_columnar(self, msgs: list[Message]) -> EncodedBatch | None:
        """Encode a list of Messages column by column; None (or NotColumnar) if it is one for the general path."""
        n = len(msgs)
        topics = [m.topic for m in msgs]
        topic = topics[0]
        if topics.count(topic) != n:
            return None
        born_hosts = [m.born_host for m in msgs]
        store_hosts = [m.store_host for m in msgs]
        if born_hosts.count(born_hosts[0]) != n or store_hosts.count(store_hosts[0]) != n:
            return None
        target = self._columnar_target(topic, born_hosts[0], store_hosts[0])
        if target is None:
            return None
        queue_ids = int_column([m.queue_id for m in msgs], n, _QUEUE_IDS)
        sys_flags = int_column([m.sys_flag for m in msgs], n, INT32)
        flags = int_column([m.flag for m in msgs], n, INT32)
        born_ts = int_column([m.born_timestamp for m in msgs], n, INT64)
        reconsume = int_column([m.reconsume_times for m in msgs], n, INT32)
        prepared = int_column([m.prepared_transaction_offset for m in msgs], n, INT64)
        dicts = [m.properties for m in msgs]
        try:
            props = props_of_dicts(dicts, n)
        except (ValueError, TypeError, AttributeError):
            return None     # properties that cannot be encoded: the general path refuses the message
        bodies = [m.body for m in msgs]
        if None in bodies:
            bodies = [b"" if b is None else b for b in bodies]
        b = encode_columns(n, topic, *target, queue_ids, sys_flags, flags, born_ts, reconsume, prepared, props,
                           bodies, self.config.max_message_size, self.file_size)
        if b is not None and self.dispatch_hints is not None and topic != codec.SCHEDULE_TOPIC:
            b.dispatch = (topic, codec.tags_codes([d.get(codec.PROPERTY_TAGS) for d in dicts], n),
                          [d.get(codec.PROPERTY_KEYS) or None for d in dicts],
                          [d.get(codec.PROPERTY_UNIQ_KEY) or None for d in dicts])
        return b

    def _encode_message_batch(self, mb: MessageBatch) -> EncodedBatch | None:
        """Encode a MessageBatch; None (or NotColumnar) if it is one for the general path."""
        n = len(mb)
        target = self._columnar_target(mb.topic, mb.born_host, mb.store_host)
        if target is None:
            return None
        qids, born_ts = mb.queue_ids, mb.born_timestamp
        queue_ids = int_column(qids if type(qids) is list or type(qids) is np.ndarray else mb.column("queue_ids"),
                               n, _QUEUE_IDS)
        born_ts = int_column(born_ts if type(born_ts) is list or type(born_ts) is np.ndarray
                             else mb.column("born_timestamp"), n, INT64)
        sys_flags = int_column([mb.sys_flag], 1, INT32)
        flags = int_column([mb.flag], 1, INT32)
        names, columns = mb.property_columns()
        try:
            props = props_from_columns(names, columns, n) if names else props_of_dicts([{}] * n, n)
        except (ValueError, TypeError):
            return None
        if props is None:
            return None
        bodies = mb.bodies if type(mb.bodies) is list else list(mb.bodies)
        b = encode_columns(n, mb.topic, *target, queue_ids, sys_flags, flags, born_ts, 0, 0, props, bodies,
                           self.config.max_message_size, self.file_size)
        if b is not None and self.dispatch_hints is not None and mb.topic != codec.SCHEDULE_TOPIC:
            keys, uniqs = mb.property(codec.PROPERTY_KEYS), mb.property(codec.PROPERTY_UNIQ_KEY)
            b.dispatch = (mb.topic, codec.tags_codes(mb.property(codec.PROPERTY_TAGS), n),
                          [keys or None] * n if keys is None or isinstance(keys, str) else [k or None for k in keys],
                          [uniqs or None] * n if uniqs is None or isinstance(uniqs, str) else [u or None for u in uniqs])
        return b

    # --- appending (under the lock) ----------------------------------------------------------------
    def _roll(self, mf: MappedFile, pos: int) -> MappedFile | None:
        """END_OF_FILE: a blank record fills the rest of mf; the next file (None if it cannot be had)."""
        mf.write_at(pos, codec.encode_blank(mf.file_size - pos))
        mf.wrote_position = mf.file_size  # the blank record spans the rest of the file
        return self.queue.get_last_mapped_file(0)

    def _append_locked(self, encoded: list, results: list, now: int) -> OSError | None:
        """The general path: append encoded messages (tuples of _encode; a PutMessageResult for a refused
        one), one write per file. Fills results: the PutMessageResult of a refused (or unwritten) message,
        (offset, size, queue offset, msgId prefix) of an appended one. Queue offsets reach
        topic_queue_table only once their file's write succeeded; a failed write (returned) fails the
        messages of that write and after it, and leaves the queues as if they had not been put."""
        table = self.topic_queue_table
        nxt: dict = {}      # queue offsets this batch takes, in table once written
        mf = None
        parts: list[bytes] = []
        run = start = pos = base = fsize = 0     # run: the first message of parts
        try:
            for i, e in enumerate(encoded):
                if type(e) is not tuple:
                    results[i] = e
                    continue
                (hs, size, crc, queue_id, flag, sys_flag, born_ts, born_addr, born_port, store_addr, store_port,
                 reconsume, prepared, body, tail, key, id_prefix) = e
                if mf is None or pos + size + _BLANK_MIN > fsize:
                    if mf is None:
                        mf = self.queue.get_last_mapped_file(0)
                        if mf is not None and mf.wrote_position + size + _BLANK_MIN > mf.file_size:
                            mf = self._roll(mf, mf.wrote_position)
                    else:
                        if parts:
                            _write(mf, start, b"".join(parts))
                            parts = []
                            table.update(nxt)
                            self._stamp(mf, now)
                        run = i
                        mf = self._roll(mf, pos)
                    if mf is None:
                        for j in range(i, len(encoded)):
                            e = encoded[j]
                            results[j] = e if type(e) is not tuple else refuse(
                                _CREATE_FAILED, f"{self.queue.store_path}: cannot create the next commitlog file")
                        return None
                    start = pos = mf.wrote_position
                    base = mf.file_from_offset
                    fsize = mf.file_size
                phys = base + pos
                if key is None:
                    qoff = 0
                else:
                    qoff = nxt.get(key)
                    if qoff is None:
                        qoff = table.get(key, 0)
                try:
                    header = hs.pack(size, _MAGIC, crc, queue_id, flag, qoff, phys, sys_flag, born_ts, born_addr,
                                     born_port, now, store_addr, store_port, reconsume, prepared, len(body))
                except struct.error as err:
                    results[i] = refuse(_ILLEGAL, f"a header field is out of range: {err}")
                    continue
                if key is not None:
                    nxt[key] = qoff + 1
                parts += (header, body, tail)
                pos += size
                results[i] = (phys, size, qoff, id_prefix)
            if parts:
                _write(mf, start, b"".join(parts))
                table.update(nxt)
                self._stamp(mf, now)
        except OSError as err:
            why = f"{mf.path if mf is not None else self.queue.store_path}: write at {start} failed: {err}"
            log.error("%s; messages %d to %d of the batch are not stored", why, run, len(encoded) - 1)
            for j in range(run, len(encoded)):
                r = results[j]
                if r is None or type(r) is tuple:
                    results[j] = PutMessageResult(_NOT_AVAILABLE, None, why)
            return OSError(err.errno, why)      # names the file and the position
        return None

    def _stamp(self, mf: MappedFile, now: int) -> None:
        """Records stamped `now` were written to mf (the checkpoint's physic timestamp follows it)."""
        mf.store_timestamp = now
        self.queue.store_timestamp = now

    def _put_columnar(self, b: EncodedBatch) -> tuple[PutMessageResults, OSError | None]:
        """Append a columnar batch, file by file; (results, the write error that stopped it or None). The
        queues count only the records written: a write that fails stores the records before it (PUT_OK)
        and none after (SERVICE_NOT_AVAILABLE)."""
        n, hdr, ends, sizes = b.n, b.hdr, b.ends, b.sizes
        phys = np.empty(n, np.int64)
        q = self.queue
        err = None
        mf = None
        with self.put_lock:
            now = time.time_ns() // 1_000_000
            self.begin_time_in_lock = now
            try:
                table = self.topic_queue_table
                # queue offsets: the next ones of each queue, in batch order
                keys, codes = b.keys, b.codes
                bases = [table.get(key, 0) for key in keys]
                if codes is None:
                    qoff = b.rank + bases[0] if b.counts[0] else b.rank
                else:
                    qoff = np.array(bases + [0])[codes] + b.rank
                hdr["queue_offset"] = qoff
                hdr["store_ts"] = now
                # place the records file by file; a record that does not fit goes behind a blank record
                i = 0
                try:
                    mf = q.get_last_mapped_file(0)
                except OSError as e:
                    err = e
                while mf is not None and err is None:
                    pos = mf.wrote_position
                    done = int(ends[i - 1]) if i else 0
                    k = int(np.searchsorted(ends, done + mf.file_size - pos - _BLANK_MIN, side="right"))
                    if k > i:
                        phys[i:k] = ends[i:k] - sizes[i:k] + (mf.file_from_offset + pos - done)
                        hdr["phys"][i:k] = phys[i:k]
                        if b.rows is not None:
                            data = memoryview(b.rows[i:k].reshape(-1))
                        else:
                            m = k - i
                            parts: list = [None] * (4 * m)
                            parts[0::4] = chop(hdr[i:k].tobytes(), _HEADER_V4.size, m)
                            parts[1::4] = b.bodies[i:k]
                            parts[2::4] = b.mids[i:k]
                            parts[3::4] = b.props[i:k]
                            data = b"".join(parts)
                        # the dispatcher's columns for these records go first: once the write moves the
                        # file's position, the dispatcher may read them (without a hint it parses them)
                        hint = self._hint_dispatcher(b, i, k, phys, now)
                        try:
                            _write(mf, pos, data)
                        except BaseException as e:
                            if hint is not None:
                                self.dispatch_hints.pop(hint, None)
                            if not isinstance(e, OSError):
                                raise
                            err = e
                            break
                        pos += int(ends[k - 1]) - done
                        i = k
                    if i == n or (k == i and pos == 0):     # done, or it fits no file (cannot happen:
                        break                               # sizes were checked against the file size)
                    try:
                        mf = self._roll(mf, pos)
                    except OSError as e:
                        err = e
                # what was appended counts in the queues
                if i:
                    counts = b.counts
                    if i < n:
                        counts = ([i if counts[0] else 0] if codes is None
                                  else np.bincount(codes[:i], minlength=len(keys) + 1).tolist())
                    for key, base, c in zip(keys, bases, counts):
                        if c:
                            table[key] = base + c
                    q.store_timestamp = now
                    last = q.last
                    if last is not None:
                        last.store_timestamp = now
            finally:
                self.begin_time_in_lock = 0
        status, why = _CREATE_FAILED, None
        if err is not None:
            status = _NOT_AVAILABLE
            why = f"{mf.path if mf is not None else q.store_path}: write failed: {err}"
            err = OSError(err.errno, why)
        elif i < n:
            why = f"{q.store_path}: cannot create the next commitlog file"
        if why is not None:
            log.error("%s; messages %d to %d of the batch are not stored", why, i, n - 1)
        if self.dispatch_hints is not None and len(self.dispatch_hints) >= DISPATCH_HINTS_MAX // 2:
            self._wait_for_dispatcher()
        addr, port = b.store_addr, b.store_port
        return PutMessageResults(n, i, phys, sizes, qoff, now,
                                 lambda: codec.create_message_ids_v4(addr, port, phys[:i]), status, why), err

    def _wait_for_dispatcher(self) -> None:
        """The dispatcher has not taken half of DISPATCH_HINTS_MAX batches: the writer and the dispatcher share
        one GIL, and a writer that always has it would leave the dispatcher parsing what it could have taken
        from hints, and consumers far behind. Sleep (without the GIL) while the dispatcher takes hints: until
        it is back under half, or it took none for DISPATCH_STALL seconds (stopped, or parsing), or for
        DISPATCH_WAIT_MAX seconds in all."""
        hints = self.dispatch_hints
        start = last_progress = time.monotonic()
        low = len(hints)
        while len(hints) >= DISPATCH_HINTS_MAX // 2:
            time.sleep(0.0002)
            now = time.monotonic()
            if len(hints) < low:
                low, last_progress = len(hints), now
            elif now - last_progress > DISPATCH_STALL or now - start > DISPATCH_WAIT_MAX:
                return

    def _hint_dispatcher(self, b: EncodedBatch, a: int, k: int, phys, now: int) -> int | None:
        """Hand the dispatcher what it would parse back from records a..k-1 of the batch (one file's run),
        keyed by the run's first offset (Dispatcher takes it only when its reput offset is there); the key,
        or None when the batch carries no dispatch columns."""
        hints = self.dispatch_hints
        if b.dispatch is None or hints is None:
            return None
        if len(hints) >= DISPATCH_HINTS_MAX:    # the dispatcher is far behind: it parses these records, and
            return None                         # takes the hints it has (the oldest, the next it needs) first
        topic, codes, keys, uniqs = b.dispatch
        h = b.hdr[a:k]
        key = int(phys[a])
        hints[key] = codec.DispatchBatch(
            [topic], np.zeros(k - a, np.int64), h["queue_id"].astype(np.int64), phys[a:k], b.sizes[a:k],
            codes[a:k], np.full(k - a, now, np.int64), h["queue_offset"].astype(np.int64),
            h["sys_flag"].astype(np.int64), h["prepared"].astype(np.int64), keys[a:k], uniqs[a:k])
        return key

    # --- read path ------------------------------------------------------------------------------
    def get_min_offset(self) -> int:
        first = self.queue.first
        return first.file_from_offset if first is not None else -1

    def get_max_offset(self) -> int:
        return self.queue.get_max_offset()

    def roll_next_file(self, offset: int) -> int:
        return offset + self.file_size - offset % self.file_size

    def get_message(self, offset: int, size: int) -> bytes | None:
        """The raw record at offset if all of its size is readable, else None."""
        mf = self.queue.find_mapped_file_by_offset(offset, offset == 0)
        if mf is None:
            return None
        return mf.read(offset - mf.file_from_offset, size)

    def look_message_by_offset(self, offset: int, size: int | None = None, read_body: bool = True) -> MessageExt | None:
        """Decode the message at offset; None if there is no readable message there."""
        mf = self.queue.find_mapped_file_by_offset(offset)
        if mf is None:
            return None
        pos = offset - mf.file_from_offset
        if size is None:
            head = mf.read(pos, 4)
            if head is None:
                return None
            size = codec._I.unpack(head)[0]
        raw = mf.read(pos, size) if size > 0 else None
        if raw is None:
            return None
        try:
            return MessageExt.from_record(codec.decode_record(raw, 0, len(raw), read_body=read_body,
                                                              check_crc=read_body))
        except codec.RecordError as e:
            log.warning("%s: no message at offset %d (%s)", mf.path, offset, e.reason)
            return None

    def get_data(self, offset: int, max_bytes: int = 4 << 20) -> tuple[bytes, int] | None:
        """Readable bytes from offset to its file's read position (at most max_bytes), and that offset."""
        mf = self.queue.find_mapped_file_by_offset(offset, offset == 0)
        if mf is None:
            return None
        pos = offset - mf.file_from_offset
        if pos < 0:
            return None
        return mf.read_from(pos, max_bytes), mf.file_from_offset + pos

    def file_of(self, offset: int) -> MappedFile | None:
        return self.queue.find_mapped_file_by_offset(offset)

    def corrupt(self, offset: int, reason: str) -> CorruptStoreError:
        mf = self.queue.find_mapped_file_by_offset(offset)
        path = mf.path if mf else self.queue.store_path
        return CorruptStoreError(str(path), offset - (mf.file_from_offset if mf else 0), reason)

    def flush(self, least_pages: int = 0) -> bool:
        return self.queue.flush(least_pages)

    def shutdown(self) -> None:
        self.queue.shutdown()
