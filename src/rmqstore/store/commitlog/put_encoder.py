"""MessageEncoder: a message's record bytes that do not depend on its place in the commitlog (RocketMQ's
MessageExtEncoder), encoded and validated in the putting thread, before the commitlog's lock is taken.

encode(msg) is the single and general put path's (a tuple the append fills in: header Struct, size, CRC,
fields, body, TOPICLENGTH + TOPIC + PROPERTIESLENGTH + PROPERTIES, the "topic-queueId" key, the msgId
prefix; or the PutMessageResult refusing the message). encode_columnar / encode_message_batch are the
columnar path's (message_batch.encode_columns over a list of Messages or a MessageBatch). Topics, hosts and
"topic-queueId" keys come from caches: a topic is validated once.
"""
from __future__ import annotations

import logging
import struct
from typing import Sequence

import numpy as np

from ..format import codec, scanner, validation
from ..conf.config import StoreConfig
from ..format.message import Message, PutMessageResult, PutMessageStatus
from ..format.message_batch import (INT32, INT64, EncodedBatch, MessageBatch, encode_columns, int_column, props_from_columns,
                            props_of_dicts)

log = logging.getLogger("rmqstore.store.commitlog.commit_log")     # refusals are the put path's: logged under its name

_HS = codec.HEADER_STRUCTS
_BLANK_MIN = codec.END_FILE_MIN_BLANK_LENGTH
_MAX_PROPS = codec.MAX_PROPERTIES_LENGTH
_QUEUE_IDS = (0, validation.MAX_QUEUE_ID)
_ILLEGAL = PutMessageStatus.MESSAGE_ILLEGAL
_PROPS_EXCEEDED = PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
_CREATE_FAILED = PutMessageStatus.CREATE_MAPEDFILE_FAILED
_crc32 = codec.crc32
_pack_len = struct.Struct(">h").pack
_CACHE_LIMIT = 4096     # entries of the topic and host caches before they start over


def refuse(status: PutMessageStatus, reason: str) -> PutMessageResult:
    """A refused message's answer, naming the reason (the argument refused). Logged by the put call that
    answers it, one line per call (log_refused), not one per message of a batch."""
    return PutMessageResult(status, None, reason)


_REFUSED = frozenset((_ILLEGAL, _PROPS_EXCEEDED, _CREATE_FAILED))


def log_refused(results: Sequence, what: str = "put") -> int:
    """One WARNING for the refused messages of one put call (MESSAGE_ILLEGAL, PROPERTIES_SIZE_EXCEEDED,
    CREATE_MAPEDFILE_FAILED): how many of how many, and the first one's index, status and reason. Returns
    how many there were."""
    count, first = 0, None
    for i, r in enumerate(results):
        if r.status in _REFUSED:
            count += 1
            if first is None:
                first = i
    if count:
        r = results[first]
        if len(results) == 1:
            log.warning("%s refused (%s): %s", what, r.status.value, r.reason)
        else:
            log.warning("%s refused %d of %d messages of a batch; the first, message %d (%s): %s", what, count,
                        len(results), first, r.status.value, r.reason)
    return count


class MessageEncoder:
    """The encoder of one commitlog (its config, file size and default store host), with its caches:
    topic -> (TOPICLENGTH + TOPIC, {queueId: "topic-queueId"}), refused topic -> why, host -> (address,
    port, sysFlag bit as born host, as store host, msgId prefix)."""

    def __init__(self, config: StoreConfig, file_size: int, default_store_host: str):
        self.config = config
        self.file_size = file_size
        self.default_store_host = default_store_host
        self.delay_levels = len(config.delay_levels_ms())   # SCHEDULE_TOPIC_XXXX's queues (scanner.queue_problem)
        self._topics: dict = {}
        self._refused_topics: dict = {}
        self._hosts: dict = {}

    def topic(self, topic):
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

    def _queue_ids(self, topic) -> tuple[int, int]:
        """The queue ids the columnar path takes for topic (out of them: the general path, which refuses)."""
        return (0, self.delay_levels - 1) if topic == codec.SCHEDULE_TOPIC else _QUEUE_IDS

    def host(self, host):
        """(address, port, born-host sysFlag bit, store-host sysFlag bit, msgId prefix) of 'ip:port'."""
        h = self._hosts.get(host)
        if h is None:
            addr, port, v6 = codec.parse_host(host)
            if len(self._hosts) >= _CACHE_LIMIT:
                self._hosts.clear()
            h = self._hosts[host] = (addr, port, codec.SYSFLAG_BORNHOST_V6 if v6 else 0,
                                     codec.SYSFLAG_STOREHOST_V6 if v6 else 0, codec.message_id_prefix(addr, port))
        return h

    def encode(self, msg: Message):
        """Everything of a record that does not depend on its place in the log, as a tuple; or the
        PutMessageResult that refuses the message (MESSAGE_ILLEGAL or PROPERTIES_SIZE_EXCEEDED, with the
        reason)."""
        try:
            topic = msg.topic
            ti = self._topics.get(topic)
            if ti is None:
                ti = self.topic(topic)
                if type(ti) is str:
                    return refuse(_ILLEGAL, ti)
            queue_id = msg.queue_id
            key = ti[1].get(queue_id)   # the topic's "topic-queueId" keys: made for valid queue ids only
            if key is None:
                queue_id = validation.queue_id_or_problem(queue_id)
                if type(queue_id) is str:
                    return refuse(_ILLEGAL, queue_id)
                if topic == codec.SCHEDULE_TOPIC:      # (once per queue: its key is cached)
                    why = scanner.queue_problem(topic, queue_id, self.delay_levels)
                    if why is not None:     # dispatch would take it for a damaged record: never acknowledged
                        return refuse(_ILLEGAL, why)
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
            born = hosts.get(host) or self.host(host)
            host = msg.store_host or self.default_store_host
            store = hosts.get(host) or self.host(host)
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
        if not scanner.is_dispatched(sys_flag):            # prepared and rolled back: no queue offset
            key = None
        return (hs, size, _crc32(body) & 0x7FFFFFFF, queue_id, msg.flag, sys_flag, msg.born_timestamp,
                born[0], born[1], store[0], store[1], msg.reconsume_times, msg.prepared_transaction_offset, body,
                tail, key, store[4])

    def columnar_target(self, topic, born_host, store_host):
        """(topic info, born host, store host) for the columnar path; None for the general path (an illegal
        topic or host, or IPv6 hosts: another header layout)."""
        try:
            ti = self.topic(topic)
            born = self.host(born_host)
            store = self.host(store_host or self.default_store_host)
        except (ValueError, TypeError, AttributeError):
            return None
        if type(ti) is not tuple or born[2] or store[3]:
            return None
        return ti, born, store

    def encode_columnar(self, msgs: list[Message], hints: bool = False) -> EncodedBatch | None:
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
        target = self.columnar_target(topic, born_hosts[0], store_hosts[0])
        if target is None:
            return None
        queue_ids = int_column([m.queue_id for m in msgs], n, self._queue_ids(topic))
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
        if b is not None and hints and topic != codec.SCHEDULE_TOPIC:
            b.dispatch = (topic, codec.tags_codes([d.get(codec.PROPERTY_TAGS) for d in dicts], n),
                          [d.get(codec.PROPERTY_KEYS) or None for d in dicts],
                          [d.get(codec.PROPERTY_UNIQ_KEY) or None for d in dicts])
        return b

    def encode_message_batch(self, mb: MessageBatch, hints: bool = False) -> EncodedBatch | None:
        """Encode a MessageBatch; None (or NotColumnar) if it is one for the general path."""
        n = len(mb)
        target = self.columnar_target(mb.topic, mb.born_host, mb.store_host)
        if target is None:
            return None
        qids, born_ts = mb.queue_ids, mb.born_timestamp
        queue_ids = int_column(qids if type(qids) is list or type(qids) is np.ndarray else mb.column("queue_ids"),
                               n, self._queue_ids(mb.topic))
        born_ts = int_column(born_ts if type(born_ts) is list or type(born_ts) is np.ndarray
                             else mb.column("born_timestamp"), n, INT64)
        prepared = mb.prepared_transaction_offset
        prepared = int_column(prepared if type(prepared) is list or type(prepared) is np.ndarray
                              else mb.column("prepared_transaction_offset"), n, INT64)
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
        b = encode_columns(n, mb.topic, *target, queue_ids, sys_flags, flags, born_ts, 0, prepared, props, bodies,
                           self.config.max_message_size, self.file_size)
        if b is not None and hints and mb.topic != codec.SCHEDULE_TOPIC:
            keys, uniqs = mb.property(codec.PROPERTY_KEYS), mb.property(codec.PROPERTY_UNIQ_KEY)
            b.dispatch = (mb.topic, codec.tags_codes(mb.property(codec.PROPERTY_TAGS), n),
                          [keys or None] * n if keys is None or isinstance(keys, str) else [k or None for k in keys],
                          [uniqs or None] * n if uniqs is None or isinstance(uniqs, str) else [u or None for u in uniqs])
        return b
