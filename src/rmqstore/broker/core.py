"""The broker's request processors (RocketMQ 4.4.0's SendMessageProcessor, PullMessageProcessor,
QueryMessageProcessor, ClientManageProcessor, ConsumerManageProcessor, AdminBrokerProcessor,
EndTransactionProcessor), over a MessageStore, on the asyncio event loop.

Nothing here blocks the loop for long: puts are gathered over one loop iteration into one
`put_messages` call (run in an executor thread when the store flushes synchronously); a pull that finds
nothing with the suspend flag is held (long polling) until the dispatcher reports new messages for its
queue or its suspendTimeoutMillis passes.
"""
from __future__ import annotations

import asyncio
import json
import logging
import random
import struct
import time
from dataclasses import dataclass
from itertools import repeat
from operator import add, attrgetter, itemgetter
from typing import Callable

from ..store import codec, validation
from ..store.message import GetMessageStatus, Message, PutMessageResult, PutMessageResults, PutMessageStatus
from ..store.message_batch import COLUMNAR_MIN, MessageBatch
from ..remoting import fastjson
from ..remoting.body import BodyError, decode_batch
from ..remoting.codes import (DEFAULT_TOPIC, DLQ_GROUP_TOPIC_PREFIX, MASTER_ID, PERM_READ, PERM_WRITE,
                              PROPERTY_MSG_REGION, PROPERTY_PRODUCER_GROUP, PROPERTY_TRACE_SWITCH,
                              PROPERTY_TRANSACTION_PREPARED, PULL_FLAG_COMMIT_OFFSET, PULL_FLAG_SUBSCRIPTION,
                              PULL_FLAG_SUSPEND, RETRY_GROUP_TOPIC_PREFIX, UNIQUE_MSG_QUERY_FLAG, V3_4_9, RequestCode,
                              ResponseCode)
from ..remoting.command import RemotingCommand
from .clients import ClientChannelInfo, ClientManager, SubscriptionData, TagFilter
from .namesrv import not_supported
from .net import Channel

log = logging.getLogger(__name__)

FAQ = "\nSee http://rocketmq.apache.org/docs/faq/ for further details."
DLQ_NUMS_PER_GROUP = 1
TOPIC_RE = validation.CLIENT_TOPIC_RE     # RocketMQ's rule for sends and topic creation (validation.py)
MULTI_TAGS_FLAG = codec.SYSFLAG_MULTI_TAGS
TRAN_MASK = codec.TRANSACTION_TYPE_MASK
SEND_CODES = (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE)
# SendMessageRequestHeaderV2's one-letter names.
V2_NAMES = {"a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums", "e": "queueId",
            "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties", "j": "reconsumeTimes",
            "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch"}
V2_ALIAS = {v: k for k, v in V2_NAMES.items()}
LONG_MAX = 2 ** 63 - 1
INT_MIN, INT_MAX = -2 ** 31, 2 ** 31 - 1
_II = struct.Struct(">iI")
_opaque_of = attrgetter("opaque")
_ext_of = attrgetter("ext_fields")
_body_of = attrgetter("body")
_V2_FIELDS = itemgetter("a", "b", "c", "d", "e", "f", "g", "h", "i")
_J_OK = {None, "0"}
_M_OK = {None, "false"}
_enc = json.encoder.encode_basestring


class HeaderError(Exception):
    """A custom header field is missing or malformed (RocketMQ answers SYSTEM_ERROR)."""


class Header:
    """Typed access to extFields, RocketMQ's decodeCommandCustomHeader rules."""

    __slots__ = ("f", "alias")

    def __init__(self, fields: dict | None, alias: dict | None = None):
        self.f = fields or {}
        self.alias = alias

    def get(self, name: str):
        a = self.alias
        return self.f.get(a.get(name, name) if a else name)

    def str(self, name: str, required: bool = True) -> str | None:
        v = self.get(name)
        if v is None and required:
            raise HeaderError(f"the custom field <{name}> is null")
        return v

    def int(self, name: str, required: bool = True, default: int | None = None, bits: int = 32) -> int | None:
        v = self.get(name)
        if v is None:
            if required:
                raise HeaderError(f"the custom field <{name}> is null")
            return default
        try:
            n = int(v)
        except ValueError:
            raise HeaderError(f"the custom field <{name}> is not a number: {v[:40]!r}") from None
        lim = 1 << (bits - 1)
        if not -lim <= n < lim:
            raise HeaderError(f"the custom field <{name}> is out of range: {v[:40]!r}")
        return n

    def long(self, name: str, required: bool = True, default: int | None = None) -> int | None:
        return self.int(name, required, default, 64)

    def bool(self, name: str, default: bool = False) -> bool:
        v = self.get(name)
        return default if v is None else v.lower() == "true"


@dataclass
class HeldPull:
    channel: Channel
    request: RemotingCommand
    topic: str
    queue_id: int
    offset: int
    deadline: float
    timer: asyncio.TimerHandle | None = None


@dataclass
class _PendingPut:
    msgs: list[Message]
    done: Callable[[list[PutMessageResult]], None]


class Broker:
    """Request handling of one broker; `handle` is the RemotingServer handler of both ports."""

    def __init__(self, store, cfg, local, groups, *, region_id: str = "DefaultRegion",
                 trace_on: bool = True, reject_transaction: bool = False):
        self.store = store
        self.cfg = cfg
        self.local = local               # rmqstore.messaging.local_broker.LocalBroker: topics, offsets, send-back
        self.topics = local.topics
        self.offsets = local.offsets
        self.groups = groups
        self.clients = ClientManager()
        self.region_id = region_id
        self.trace_on = "true" if trace_on else "false"
        self._base_fields = {PROPERTY_MSG_REGION: region_id, PROPERTY_TRACE_SWITCH: self.trace_on}
        # the header of a SEND_MESSAGE_V2 answer, as RemotingCommand.encode_header writes it (opaque, msgId,
        # queueId, queueOffset filled in)
        base = ",".join(_enc(k) + ":" + _enc(v) for k, v in self._base_fields.items()).replace("%", "%%")
        self._ok_header = ('{"code":0,"extFields":{"msgId":"%s","queueId":"%d","queueOffset":"%d",' + base +
                           '},"flag":1,"language":"JAVA","opaque":%d,"serializeTypeCurrentRPC":"JSON","version":293}')
        self._valid_topics: set[str] = set()
        self.reject_transaction = reject_transaction
        self.store_host = f"{cfg.broker_ip1}:{cfg.listen_port}"
        self.broker_addr = self.store_host
        self.loop: asyncio.AbstractEventLoop | None = None
        self.sync_flush = cfg.flush_disk_type == "SYNC_FLUSH"
        self._puts: list = []            # _PendingPut, or a tuple for a plain SEND_MESSAGE_V2 (_send_fast)
        self._puts_general = False       # some of _puts is a _PendingPut
        self._puts_raw = False           # some of _puts is a (channel, SEND_MESSAGE_V2 request) to check
        self._puts_fast = False          # some of _puts is a _send_fast tuple
        self._touched: set = set()
        self._tx_groups: set[str] = set()
        self._put_scheduled = False
        self.held: dict[tuple[str, int], list[HeldPull]] = {}
        self.rand = random.Random()
        self.stats = {"put": 0, "get": 0}
        self.handlers: dict[int, Callable] = {
            RequestCode.SEND_MESSAGE: self.send_message,
            RequestCode.SEND_MESSAGE_V2: self.send_message,
            RequestCode.SEND_BATCH_MESSAGE: self.send_message,
            RequestCode.PULL_MESSAGE: self.pull_message,
            RequestCode.QUERY_MESSAGE: self.query_message,
            RequestCode.VIEW_MESSAGE_BY_ID: self.view_message_by_id,
            RequestCode.HEART_BEAT: self.heart_beat,
            RequestCode.UNREGISTER_CLIENT: self.unregister_client,
            RequestCode.CHECK_CLIENT_CONFIG: self.check_client_config,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self.get_consumer_list_by_group,
            RequestCode.QUERY_CONSUMER_OFFSET: self.query_consumer_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self.update_consumer_offset,
            RequestCode.CONSUMER_SEND_MSG_BACK: self.consumer_send_msg_back,
            RequestCode.END_TRANSACTION: self.end_transaction,
            RequestCode.UPDATE_AND_CREATE_TOPIC: self.update_and_create_topic,
            RequestCode.DELETE_TOPIC_IN_BROKER: self.delete_topic,
            RequestCode.GET_ALL_TOPIC_CONFIG: self.get_all_topic_config,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset_by_timestamp,
            RequestCode.GET_MAX_OFFSET: self.get_max_offset,
            RequestCode.GET_MIN_OFFSET: self.get_min_offset,
            RequestCode.GET_EARLIEST_MSG_STORETIME: self.get_earliest_msg_storetime,
            RequestCode.QUERY_BROKER_OFFSET: self.query_broker_offset,
            RequestCode.GET_BROKER_RUNTIME_INFO: self.get_broker_runtime_info,
            RequestCode.LOCK_BATCH_MQ: self.lock_batch_mq,
            RequestCode.UNLOCK_BATCH_MQ: self.unlock_batch_mq,
            RequestCode.GET_ALL_CONSUMER_OFFSET: self.get_all_consumer_offset,
        }
        self.locks: dict[tuple[str, str, str, int], tuple[str, float]] = {}

    # --- entry ------------------------------------------------------------------------------------
    def handle(self, ch: Channel, req: RemotingCommand):
        if req.code == 310 and req.flag == 0 and req.serialize_type == 0 and req.ext_fields is not None:
            # SEND_MESSAGE_V2, the hot path: checked with the others of this loop iteration (_sends_batch)
            self._puts.append((ch, req))
            self._puts_raw = True
            if not self._put_scheduled:
                self._put_scheduled = True
                self.loop.call_soon(self._flush_puts)
            return None
        return self._handle(ch, req)

    def _handle(self, ch: Channel, req: RemotingCommand):
        h = self.handlers.get(req.code)
        if h is None:
            return not_supported(req)
        try:
            return h(ch, req)
        except HeaderError as e:
            return req.make_response(ResponseCode.SYSTEM_ERROR, str(e))

    def on_close(self, ch: Channel) -> None:
        self.clients.channel_closed(ch)
        for key, lst in list(self.held.items()):
            keep = [hp for hp in lst if hp.channel is not ch]
            for hp in lst:
                if hp.channel is ch and hp.timer is not None:
                    hp.timer.cancel()
            if keep:
                self.held[key] = keep
            else:
                del self.held[key]

    # --- sending ------------------------------------------------------------------------------------
    def _send_header(self, req: RemotingCommand) -> Header:
        f = req.ext_fields or {}
        if req.code != RequestCode.SEND_MESSAGE and "b" in f:
            return Header(f, V2_ALIAS)
        return Header(f)

    def _topic_for_send(self, ch: Channel, req: RemotingCommand, h: Header, topic: str, resp_fields: dict):
        """AbstractSendMessageProcessor.msgCheck: (topic config, None) or (None, error response)."""
        if topic == DEFAULT_TOPIC:
            return None, req.make_response(ResponseCode.SYSTEM_ERROR,
                                           f"the topic[{topic}] is conflict with system reserved words.", resp_fields)
        if topic not in self._valid_topics:
            if not TOPIC_RE.match(topic) or len(topic.encode()) > codec.MAX_TOPIC_LENGTH:
                return None, req.make_response(ResponseCode.MESSAGE_ILLEGAL,
                                               f"the topic[{topic[:200]}] is not a valid topic name", resp_fields)
            if len(self._valid_topics) < 100_000:
                self._valid_topics.add(topic)
        tc = self.topics.select(topic)
        if tc is None:
            unit = h.bool("unitMode")
            sys_flag = 0
            if unit:
                sys_flag = 2 if topic.startswith(RETRY_GROUP_TOPIC_PREFIX) else 1
            log.warning("the topic %s does not exist, producer %s", topic, ch.remote)
            tc = None
            if h.str("defaultTopic") == DEFAULT_TOPIC:
                tc = self.topics.create_topic_in_send_message_method(topic, h.int("defaultTopicQueueNums"), sys_flag)
            if tc is None and topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                tc = self.topics.create_topic_in_send_message_back_method(topic, 1, PERM_WRITE | PERM_READ, sys_flag)
            if tc is None:
                return None, req.make_response(ResponseCode.TOPIC_NOT_EXIST,
                                               f"topic[{topic}] not exist, apply first please!{FAQ}", resp_fields)
        qid = h.int("queueId")
        if qid >= tc.write_queue_nums and qid >= tc.read_queue_nums:
            return None, req.make_response(
                ResponseCode.SYSTEM_ERROR, f"request queueId[{qid}] is illegal, {tc} Producer: {ch.remote}", resp_fields)
        return tc, None

    def _send_fast(self, ch: Channel, req: RemotingCommand, f: dict) -> bool:
        """Queue _fast_tuple's tuple for the next put; False when send_message's general path must take it."""
        t = self._fast_tuple(ch, req, f)
        if t is None:
            return False
        self._puts.append(t)
        self._puts_fast = True
        if not self._put_scheduled:
            self._put_scheduled = True
            self.loop.call_soon(self._flush_puts)
        return True

    def _fast_tuple(self, ch: Channel, req: RemotingCommand, f: dict) -> tuple | None:
        """A (not oneway) SEND_MESSAGE_V2 of one plain message (no batch, retry topic, transaction, new topic or
        odd field) to a known topic, as a tuple for the put (no Header, no Message); None when send_message's
        general path must take it (it answers whatever is wrong)."""
        if req.flag:
            return None
        try:
            topic = f["b"]
            qid = int(f["e"])
            sys_flag = int(f["f"])
            born_ts = int(f["g"])
            flag = int(f["h"])
            int(f["d"])
            f["a"], f["c"]
        except (KeyError, ValueError, TypeError):
            return None
        if f.get("m", "false") != "false" or f.get("j", "0") != "0" or topic not in self._valid_topics \
                or topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return None
        if not (0 <= sys_flag <= INT_MAX and INT_MIN <= flag <= INT_MAX and -LONG_MAX - 1 <= born_ts <= LONG_MAX):
            return None
        tc = self.topics.table.get(topic)
        if tc is None or qid < 0 or (qid >= tc.write_queue_nums and qid >= tc.read_queue_nums):
            return None
        props = f.get("i") or ""
        if PROPERTY_TRANSACTION_PREPARED in props or not self.store.running_flags.writeable:
            return None
        if tc.topic_filter_type == "MULTI_TAG":
            sys_flag |= MULTI_TAGS_FLAG
        return ch, req, topic, qid, flag, sys_flag, born_ts, props, req.body or b""

    def send_message(self, ch: Channel, req: RemotingCommand):
        h = self._send_header(req)
        base = self._base_fields
        topic = h.str("topic")
        h.str("producerGroup")
        h.str("defaultTopic")
        h.int("defaultTopicQueueNums")
        sys_flag = h.int("sysFlag")
        born_ts = h.long("bornTimestamp")
        flag = h.int("flag")
        if not self.store.running_flags.writeable:
            return req.make_response(ResponseCode.SERVICE_NOT_AVAILABLE,
                                     "service not available now, maybe disk full, " + self.store.running_flags.why(), base)
        tc, err = self._topic_for_send(ch, req, h, topic, base)
        if err is not None:
            return err
        qid = h.int("queueId")
        if qid < 0:
            qid = abs(self.rand.randrange(-99999999, 99999999)) % max(1, tc.write_queue_nums)
        if tc.topic_filter_type == "MULTI_TAG":
            sys_flag |= MULTI_TAGS_FLAG
        reconsume = h.int("reconsumeTimes", required=False, default=0)
        batch = req.code == RequestCode.SEND_BATCH_MESSAGE or h.bool("batch")
        body = req.body or b""
        if batch:
            return self._send_batch(ch, req, h, topic, qid, sys_flag, reconsume, body, base)
        msg_topic = topic
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            group = topic[len(RETRY_GROUP_TOPIC_PREFIX):]
            sgc = self.groups.find(group)
            if sgc is None:
                return req.make_response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                                         f"subscription group not exist, {group}{FAQ}", base)
            max_times = sgc.retry_max_times
            if req.version >= V3_4_9:
                max_times = h.int("maxReconsumeTimes", required=False, default=max_times)
            if reconsume >= max_times:
                msg_topic = DLQ_GROUP_TOPIC_PREFIX + group
                qid = abs(self.rand.randrange(-99999999, 99999999)) % DLQ_NUMS_PER_GROUP
                self.topics.create_topic_in_send_message_back_method(msg_topic, DLQ_NUMS_PER_GROUP, PERM_WRITE, 0)
        props_str = h.str("properties", required=False) or ""
        props = codec.string_to_properties(props_str)
        msg = Message(msg_topic, body, qid, flag, sys_flag, born_ts, ch.remote, self.store_host, reconsume, 0, props)
        if props.get(PROPERTY_TRANSACTION_PREPARED, "").lower() == "true":
            if self.reject_transaction:
                return req.make_response(ResponseCode.NO_PERMISSION,
                                         f"the broker[{self.cfg.broker_ip1}] sending transaction message is forbidden", base)
            msg.sys_flag = (msg.sys_flag & ~TRAN_MASK) | codec.TRANSACTION_PREPARED_TYPE
            self.transaction_checker(h.str("producerGroup"))

        def done(results: list[PutMessageResult]) -> None:
            if not req.flag & 2:         # a oneway send gets no answer
                ch.send(self._put_response(req, results[0], qid, base))
                self._touched.add(ch)
        self._submit_put([msg], done)
        return None

    def _send_batch(self, ch, req, h, topic, qid, sys_flag, reconsume, body, base):
        if len(topic) > 127:
            return req.make_response(ResponseCode.MESSAGE_ILLEGAL, f"message topic length too long {len(topic)}", base)
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return req.make_response(ResponseCode.MESSAGE_ILLEGAL,
                                     f"batch request does not support retry group {topic}", base)
        try:
            entries = decode_batch(body)
        except BodyError as e:
            return req.make_response(ResponseCode.MESSAGE_ILLEGAL, f"the batch body is malformed: {e}", base)
        if not entries:
            return req.make_response(ResponseCode.MESSAGE_ILLEGAL, "the batch is empty", base)
        tl = len(topic.encode())
        total = 0
        for e in entries:
            size = codec.record_length(len(e.body), tl, len(codec.properties_to_string(e.properties).encode()))
            total += size
        if total > self.cfg.max_message_size:
            return req.make_response(ResponseCode.MESSAGE_ILLEGAL,
                                     "the message is illegal, maybe msg body or properties length not matched. "
                                     "msg body length limit 128k, msg properties length limit 32k.", base)
        born_ts, born_host = h.long("bornTimestamp"), _host(ch.remote)
        msgs = [Message(topic=topic, body=e.body, queue_id=qid, flag=e.flag, sys_flag=sys_flag, born_timestamp=born_ts,
                        born_host=born_host, store_host=self.store_host, reconsume_times=reconsume,
                        properties=e.properties) for e in entries]

        def done(results: list[PutMessageResult]) -> None:
            if req.flag & 2:             # a oneway send gets no answer
                return
            bad = next((r for r in results if r.status not in _SEND_OK), None)
            if bad is not None:
                ch.send(self._put_response(req, bad, qid, base))
                return
            first = results[0]
            ids = ",".join(r.append_result.msg_id for r in results)
            merged = PutMessageResult(first.status, first.append_result.__class__(
                first.append_result.status, first.append_result.wrote_offset,
                sum(r.append_result.wrote_bytes for r in results), ids, first.append_result.store_timestamp,
                first.append_result.logics_offset, len(results)))
            for r in results:
                if r.status is not PutMessageStatus.PUT_OK:
                    merged.status = r.status
            ch.send(self._put_response(req, merged, qid, base))
        self._submit_put(msgs, done)
        return None

    def _ok_frames(self, msg_ids, qids, queue_offsets, reqs) -> list[bytes]:
        """The answers to JSON SEND_MESSAGE_V2s whose messages were put, as (length prefix, header) pieces
        for one b"".join; encoded a column at a time."""
        n = len(reqs)
        heads = list(map(str.encode, map(self._ok_header.__mod__, zip(msg_ids, qids, queue_offsets,
                                                                      map(_opaque_of, reqs)))))
        lens = list(map(len, heads))
        parts = [None] * (2 * n)
        parts[0::2] = map(_II.pack, map(add, lens, repeat(4, n)), lens)
        parts[1::2] = heads
        return parts

    def _ok_frame(self, opaque: int, msg_id: str, qid: int, queue_offset: int) -> bytes:
        """The encoded answer to a JSON SEND_MESSAGE_V2 whose message was put."""
        h = (self._ok_header % (msg_id, qid, queue_offset, opaque)).encode()
        return _II.pack(4 + len(h), len(h)) + h

    def _put_response(self, req: RemotingCommand, r: PutMessageResult, qid: int, base: dict) -> RemotingCommand:
        st = r.status
        if st is PutMessageStatus.PUT_OK:
            a = r.append_result
            fields = {"msgId": a.msg_id, "queueId": str(qid), "queueOffset": str(a.logics_offset)}
            fields.update(base)
            return RemotingCommand(0, opaque=req.opaque, flag=1, ext_fields=fields, serialize_type=req.serialize_type)
        code, remark, ok = _PUT_CODES.get(st, (ResponseCode.SYSTEM_ERROR, "UNKNOWN_ERROR DEFAULT", False))
        if st is PutMessageStatus.SERVICE_NOT_AVAILABLE:
            remark = f"service not available now, maybe disk full, {self.store.running_flags.why()}"
        fields = dict(base)
        if ok:
            a = r.append_result
            fields["msgId"] = a.msg_id
            fields["queueId"] = str(qid)
            fields["queueOffset"] = str(a.logics_offset)
            remark = None
        return req.make_response(code, remark, fields)

    # --- the put queue: one store call per loop iteration -------------------------------------------
    def _submit_put(self, msgs: list[Message], done: Callable[[list[PutMessageResult]], None]) -> None:
        self._puts.append(_PendingPut(msgs, done))
        self._puts_general = True
        if not self._put_scheduled:
            self._put_scheduled = True
            self.loop.call_soon(self._flush_puts)

    def _flush_puts(self) -> None:
        self._put_scheduled = False
        puts, self._puts = self._puts, []
        general, self._puts_general = self._puts_general, False
        raw, self._puts_raw = self._puts_raw, False
        fast, self._puts_fast = self._puts_fast, False
        if not puts:
            return
        qids = payload = None
        if raw:
            got = None if general or fast or len(puts) < COLUMNAR_MIN else self._sends_batch(puts)
            if got is not None:
                payload, qids = got
            else:       # each send checked by itself (a few sync sends, or a mixed batch)
                checked = []
                for p in puts:
                    if type(p) is tuple and len(p) == 2:
                        p = self._fast_tuple(p[0], p[1], p[1].ext_fields)
                        if p is None:       # one for the general path: all again, in order
                            self._requeue(puts)
                            return
                    checked.append(p)
                puts = checked
        if qids is None:
            payload = None if general else self._message_batch(puts)
        if payload is None:
            payload = []
            for p in puts:
                if type(p) is tuple:
                    ch, req, topic, qid, flag, sys_flag, born_ts, props, body = p
                    payload.append(Message(topic, body, qid, flag, sys_flag, born_ts, ch.remote, self.store_host, 0, 0,
                                           codec.string_to_properties(props)))
                else:
                    payload.extend(p.msgs)
        n = len(payload)
        if self.sync_flush:
            fut = self.loop.run_in_executor(None, self._put_all, payload)
            fut.add_done_callback(lambda f: self._deliver_puts(puts, f.result() if not f.exception() else
                                                               self._failed(n, f.exception()), qids))
        else:
            try:
                results = self._put_all(payload)
            except Exception as e:
                results = self._failed(n, e)
            self._deliver_puts(puts, results, qids)

    def flush_all_puts(self) -> None:
        """Put what is queued now (at shutdown): _flush_puts until nothing is left (a flush may queue again
        what it had to check one by one)."""
        for _ in range(3):
            if not self._puts:
                return
            self._flush_puts()

    def _sends_batch(self, puts: list):
        """(MessageBatch, queue ids) of the SEND_MESSAGE_V2s one loop iteration queued as they came, (channel,
        request): checked and taken apart a field at a time over the whole batch. None unless every one is a
        plain send (what _send_fast takes) from one connection to one topic with one flag and sysFlag."""
        n = len(puts)
        chs, reqs = zip(*puts)
        ch = chs[0]
        if chs.count(ch) != n:
            return None
        exts = list(map(_ext_of, reqs))
        try:
            _a, topics, _c, ds, es, fs, gs, hs, props = zip(*map(_V2_FIELDS, exts))
        except (KeyError, TypeError):
            return None
        topic = topics[0]
        if topics.count(topic) != n or fs.count(fs[0]) != n or hs.count(hs[0]) != n \
                or topic not in self._valid_topics or topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return None
        tc = self.topics.table.get(topic)
        if tc is None:
            return None
        try:
            sys_flag, flag = int(fs[0]), int(hs[0])
            qids = list(map(int, es))
            borns = list(map(int, gs))
            for d in set(ds):
                int(d)
        except (ValueError, TypeError):
            return None
        if not (0 <= sys_flag <= INT_MAX and INT_MIN <= flag <= INT_MAX and min(qids) >= 0
                and max(qids) < max(tc.write_queue_nums, tc.read_queue_nums)
                and min(borns) >= -LONG_MAX - 1 and max(borns) <= LONG_MAX):
            return None
        if not (set(map(dict.get, exts, repeat("j", n))) <= _J_OK
                and set(map(dict.get, exts, repeat("m", n))) <= _M_OK):
            return None
        if not self.store.running_flags.writeable:
            return None
        columns = _property_columns(props, n)
        if columns is None:
            return None
        bodies = list(map(_body_of, reqs))
        if None in bodies:
            bodies = [b or b"" for b in bodies]
        if tc.topic_filter_type == "MULTI_TAG":
            sys_flag |= MULTI_TAGS_FLAG
        try:
            return MessageBatch(topic, bodies, queue_ids=qids, properties=columns, flag=flag, sys_flag=sys_flag,
                                born_timestamp=borns, born_host=ch.remote, store_host=self.store_host), qids
        except (TypeError, ValueError):
            return None

    def _requeue(self, puts: list) -> None:
        """Queue puts again, in order, each SEND_MESSAGE_V2 that came as it was checked by itself now: a plain
        one as _send_fast's tuple, any other by the general path (which answers what is wrong)."""
        for p in puts:
            if type(p) is not tuple or len(p) != 2:
                self._puts.append(p)
                if type(p) is tuple:
                    self._puts_fast = True
                else:
                    self._puts_general = True
                continue
            ch, req = p
            if self._send_fast(ch, req, req.ext_fields):
                continue
            try:
                r = self._handle(ch, req)
            except Exception as e:
                log.exception("request %s from %s failed", req.code_name, ch.remote)
                r = req.make_response(ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")
            if r is not None:
                ch._answer(req, r)
        if self._puts and not self._put_scheduled:
            self._put_scheduled = True
            self.loop.call_soon(self._flush_puts)

    def _message_batch(self, puts: list) -> MessageBatch | None:
        """The plain sends of _send_fast's tuples as one MessageBatch when they come from one connection, to one
        topic, with the same flag, sysFlag and property names; else None (they go as Messages)."""
        n = len(puts)
        if n < COLUMNAR_MIN:
            return None
        chs, _reqs, topics, qids, flags, sys_flags, borns, props, bodies = zip(*puts)
        ch = chs[0]
        if chs.count(ch) != n or topics.count(topics[0]) != n or flags.count(flags[0]) != n \
                or sys_flags.count(sys_flags[0]) != n:
            return None
        columns = _property_columns(props, n)
        if columns is None:
            return None
        try:
            return MessageBatch(topics[0], list(bodies), queue_ids=list(qids), properties=columns, flag=flags[0],
                                sys_flag=sys_flags[0], born_timestamp=list(borns), born_host=ch.remote,
                                store_host=self.store_host)
        except (TypeError, ValueError):
            return None

    def _put_all(self, msgs) -> list[PutMessageResult]:
        return self.store.put_messages(msgs)

    def _failed(self, n: int, exc) -> list[PutMessageResult]:
        log.error("put of %d messages failed: %s", n, exc)
        return [PutMessageResult(PutMessageStatus.UNKNOWN_ERROR) for _ in range(n)]

    def _deliver_puts(self, puts: list, results, qids: list | None = None) -> None:
        n = len(results)
        self.stats["put"] += n
        touched = self._touched
        if qids is not None:
            # _sends_batch's: one connection, (channel, request) pairs
            ch = puts[0][0]
            reqs = [p[1] for p in puts]
            if type(results) is PutMessageResults and results.all_ok:
                ch.send_frames(self._ok_frames(results.msg_ids, qids, results.queue_offsets, reqs))
            else:
                base = self._base_fields
                for i, req in enumerate(reqs):
                    ch.send(self._put_response(req, results[i], qids[i], base))
                touched.add(ch)
        elif type(results) is PutMessageResults and results.all_ok and n == len(puts) and not any(
                type(p) is not tuple for p in puts):
            # every message put, every request a plain send: the answers as bytes, per connection
            chs, reqs, _t, qids = list(zip(*puts))[:4]
            parts = self._ok_frames(results.msg_ids, qids, results.queue_offsets, reqs)
            ch = chs[0]
            if chs.count(ch) == n:
                ch.send_frames(parts)
            else:
                frames: dict = {}
                for i, ch in enumerate(chs):
                    lst = frames.get(ch)
                    if lst is None:
                        lst = frames[ch] = []
                    lst += parts[2 * i:2 * i + 2]
                for ch, lst in frames.items():
                    ch.send_frames(lst)
        else:
            i = 0
            base = self._base_fields
            for p in puts:
                if type(p) is tuple:
                    ch, req, qid = p[0], p[1], p[3]
                    r = results[i]
                    if r.status is PutMessageStatus.PUT_OK and req.serialize_type == 0:
                        a = r.append_result
                        ch.send_frames([self._ok_frame(req.opaque, a.msg_id, qid, a.logics_offset)])
                    else:
                        ch.send(self._put_response(req, r, qid, base))
                        touched.add(ch)
                    i += 1
                    continue
                k = len(p.msgs)
                try:
                    p.done(results[i:i + k])
                except Exception:
                    log.exception("answering a put failed")
                i += k
        # Write the answers now, before this thread lets go of the GIL (the next select() would hand it to
        # the dispatcher thread that the put just woke, delaying every answer by its parse).
        for ch in touched:
            ch.flush()
        touched.clear()

    def put_async(self, msgs: list[Message]) -> "asyncio.Future[list[PutMessageResult]]":
        fut = self.loop.create_future()

        def done(results):
            if not fut.done():
                fut.set_result(results)
        self._submit_put(msgs, done)
        return fut

    # --- pulling ------------------------------------------------------------------------------------
    def pull_message(self, ch: Channel, req: RemotingCommand, allow_suspend: bool = True, held: HeldPull | None = None):
        h = Header(req.ext_fields)
        group = h.str("consumerGroup")
        topic = h.str("topic")
        qid = h.int("queueId")
        offset = h.long("queueOffset")
        max_nums = h.int("maxMsgNums")
        sys_flag = h.int("sysFlag")
        commit_offset = h.long("commitOffset")
        suspend_ms = h.long("suspendTimeoutMillis")
        sub_version = h.long("subVersion")
        sgc = self.groups.find(group)
        if sgc is None:
            return req.make_response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                                     f"subscription group [{group}] does not exist, {FAQ}", {})
        if not sgc.consume_enable:
            return req.make_response(ResponseCode.NO_PERMISSION, f"subscription group no permission, {group}", {})
        has_suspend = bool(sys_flag & PULL_FLAG_SUSPEND)
        has_commit = bool(sys_flag & PULL_FLAG_COMMIT_OFFSET)
        has_sub = bool(sys_flag & PULL_FLAG_SUBSCRIPTION)
        tc = self.topics.select(topic)
        if tc is None:
            return req.make_response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please! {FAQ}", {})
        if not tc.readable:
            return req.make_response(ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden", {})
        if qid < 0 or qid >= tc.read_queue_nums:
            return req.make_response(ResponseCode.SYSTEM_ERROR,
                                     f"queueId[{qid}] is illegal, topic:[{topic}] topicConfig.readQueueNums:"
                                     f"[{tc.read_queue_nums}] consumer:[{ch.remote}]", {})
        if has_sub:
            sd = SubscriptionData.build(topic, h.str("subscription", required=False), h.str("expressionType", False),
                                        sub_version)
        else:
            gi = self.clients.group_info(group)
            if gi is None:
                return req.make_response(ResponseCode.SUBSCRIPTION_NOT_EXIST,
                                         f"the consumer's group info not exist{FAQ}", {})
            sd = gi.subscriptions.get(topic)
            if sd is None:
                return req.make_response(ResponseCode.SUBSCRIPTION_NOT_EXIST,
                                         f"the consumer's subscription not exist{FAQ}", {})
            if sd.sub_version < sub_version:
                return req.make_response(ResponseCode.SUBSCRIPTION_NOT_LATEST, "the consumer's subscription not latest", {})
        if sd.expression_type != "TAG":
            return req.make_response(ResponseCode.SYSTEM_ERROR,
                                     f"The broker does not support consumer to filter message by {sd.expression_type}", {})
        res = self.store.get_message(group, topic, qid, offset, max_nums, TagFilter(sd))
        fields = {"suggestWhichBrokerId": str(MASTER_ID), "nextBeginOffset": str(res.next_begin_offset),
                  "maxOffset": str(res.max_offset), "minOffset": str(res.min_offset)}
        st = res.status
        if st is GetMessageStatus.FOUND:
            code = ResponseCode.SUCCESS
        elif st in (GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, GetMessageStatus.NO_MESSAGE_IN_QUEUE):
            code = ResponseCode.PULL_OFFSET_MOVED if offset != 0 else ResponseCode.PULL_NOT_FOUND
        elif st in (GetMessageStatus.MESSAGE_WAS_REMOVING, GetMessageStatus.NO_MATCHED_MESSAGE):
            code = ResponseCode.PULL_RETRY_IMMEDIATELY
        elif st in (GetMessageStatus.OFFSET_FOUND_NULL, GetMessageStatus.OFFSET_OVERFLOW_ONE):
            code = ResponseCode.PULL_NOT_FOUND
        else:   # OFFSET_OVERFLOW_BADLY, OFFSET_TOO_SMALL
            code = ResponseCode.PULL_OFFSET_MOVED
        if allow_suspend and has_commit:
            self.offsets.commit_offset(group, topic, qid, commit_offset)
        if code == ResponseCode.PULL_NOT_FOUND and has_suspend:
            if held is not None and time.monotonic() < held.deadline:
                return _KEEP_HELD
            if allow_suspend:
                timeout_ms = suspend_ms if self.cfg.long_polling_enable else self.cfg.short_polling_time_mills
                self._hold(HeldPull(ch, req, topic, qid, offset, time.monotonic() + max(0, timeout_ms) / 1000.0))
                return None
        if code == ResponseCode.PULL_OFFSET_MOVED:
            log.warning("PULL_OFFSET_MOVED: topic=%s group=%s requestOffset=%d newOffset=%d", topic, group, offset,
                        res.next_begin_offset)
        body = None
        if code == ResponseCode.SUCCESS:
            body = self._raw_messages(res.messages)
            self.stats["get"] += len(res.messages)
        return req.make_response(code, st.name, fields, body)

    def _raw_messages(self, messages) -> bytes:
        read = self.store.commit_log.get_message
        parts = []
        for m in messages:
            raw = read(m.commit_log_offset, m.store_size)
            if raw is not None:
                parts.append(raw)
        return b"".join(parts)

    # long polling (PullRequestHoldService)
    def _hold(self, hp: HeldPull) -> None:
        key = (hp.topic, hp.queue_id)
        self.held.setdefault(key, []).append(hp)
        hp.timer = self.loop.call_at(self.loop.time() + max(0.0, hp.deadline - time.monotonic()), self._expire, hp)
        # a message dispatched between the read above and the registration: wake now
        if self.store.get_max_offset_in_queue(hp.topic, hp.queue_id) > hp.offset:
            self.loop.call_soon(self._wake, hp.topic, hp.queue_id, LONG_MAX)

    def _unhold(self, hp: HeldPull) -> bool:
        lst = self.held.get((hp.topic, hp.queue_id))
        if lst is None or hp not in lst:
            return False
        lst.remove(hp)
        if not lst:
            del self.held[(hp.topic, hp.queue_id)]
        if hp.timer is not None:
            hp.timer.cancel()
        return True

    def _expire(self, hp: HeldPull) -> None:
        if self._unhold(hp):
            self._rerun(hp, final=True)

    def _rerun(self, hp: HeldPull, final: bool) -> bool:
        """Re-execute a held pull; False when it stays held."""
        if hp.channel.closed:
            return True
        try:
            r = self.pull_message(hp.channel, hp.request, allow_suspend=False, held=None if final else hp)
        except HeaderError as e:
            r = hp.request.make_response(ResponseCode.SYSTEM_ERROR, str(e))
        except Exception as e:
            log.exception("held pull failed")
            r = hp.request.make_response(ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")
        if r is _KEEP_HELD:
            return False
        if r is not None:
            hp.channel.send(r)
        return True

    def on_message_arriving(self, topic: str, queue_id: int, next_offset: int, store_ts: int) -> None:
        """Dispatcher listener (dispatcher thread): wake the pulls held on this queue."""
        if (topic, queue_id) in self.held:
            loop = self.loop
            if loop is not None and not loop.is_closed():
                try:
                    loop.call_soon_threadsafe(self._wake, topic, queue_id, next_offset)
                except RuntimeError:
                    pass

    def _wake(self, topic: str, queue_id: int, next_offset: int) -> None:
        lst = self.held.get((topic, queue_id))
        if not lst:
            return
        for hp in list(lst):
            if next_offset > hp.offset:
                if self._rerun(hp, final=False):
                    self._unhold(hp)

    def release_all_held(self) -> None:
        for lst in list(self.held.values()):
            for hp in list(lst):
                self._unhold(hp)
                self._rerun(hp, final=True)

    # --- queries ------------------------------------------------------------------------------------
    def query_message(self, ch: Channel, req: RemotingCommand):
        h = Header(req.ext_fields)
        topic, key = h.str("topic"), h.str("key")
        max_num = h.int("maxNum")
        begin, end = h.long("beginTimestamp"), h.long("endTimestamp")
        if h.f.get(UNIQUE_MSG_QUERY_FLAG) == "true":
            max_num = self.cfg.default_query_max_num
        res = self.store.query_message(topic, key, max_num, begin, end)
        fields = {"indexLastUpdatePhyoffset": str(res.index_last_update_phyoffset),
                  "indexLastUpdateTimestamp": str(res.index_last_update_timestamp)}
        body = self._raw_messages(res.messages)
        if body:
            return req.make_response(ResponseCode.SUCCESS, None, fields, body)
        return req.make_response(ResponseCode.QUERY_NOT_FOUND, "can not find message, maybe time range not correct", fields)

    def _one_message(self, offset: int) -> bytes | None:
        """selectOneMessageByOffset: the whole record at a commitlog offset, if one is there."""
        if offset < 0:
            return None
        head = self.store.commit_log.get_message(offset, 8)
        if head is None:
            return None
        size, magic = struct.unpack(">iI", head)
        if magic not in (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2) or size <= 0 or \
                size > self.cfg.max_message_size + 1024:
            return None
        raw = self.store.commit_log.get_message(offset, size)
        if raw is None:
            return None
        try:
            codec.check_record(raw, 0, len(raw))
        except codec.RecordError:
            return None
        return raw

    def view_message_by_id(self, ch: Channel, req: RemotingCommand):
        offset = Header(req.ext_fields).long("offset")
        raw = self._one_message(offset)
        if raw is None:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}")
        return req.make_response(ResponseCode.SUCCESS, body=raw)

    # --- clients ------------------------------------------------------------------------------------
    def heart_beat(self, ch: Channel, req: RemotingCommand):
        try:
            data = fastjson.loads(req.body or b"")
            if not isinstance(data, dict):
                raise ValueError("not an object")
            client_id = str(data.get("clientID") or "")
            consumers = list(data.get("consumerDataSet") or [])
            producers = list(data.get("producerDataSet") or [])
            info = ClientChannelInfo(ch, client_id, req.language, req.version)
            parsed = []
            for cd in consumers:
                subs = [SubscriptionData.from_json(s) for s in (cd.get("subscriptionDataSet") or [])]
                parsed.append((str(cd["groupName"]), cd, subs))
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"bad heartbeat body: {e}")
        for group, cd, subs in parsed:
            sgc = self.groups.find(group)
            notify = True
            if sgc is not None:
                notify = sgc.notify_consumer_ids_changed_enable
                sys_flag = 2 if cd.get("unitMode") else 0
                self.topics.create_topic_in_send_message_back_method(RETRY_GROUP_TOPIC_PREFIX + group,
                                                                     sgc.retry_queue_nums, PERM_WRITE | PERM_READ, sys_flag)
            changed = self.clients.register_consumer(group, ClientChannelInfo(ch, client_id, req.language, req.version),
                                                     str(cd.get("consumeType", "CONSUME_PASSIVELY")),
                                                     str(cd.get("messageModel", "CLUSTERING")),
                                                     str(cd.get("consumeFromWhere", "CONSUME_FROM_LAST_OFFSET")),
                                                     subs, notify)
            if changed:
                log.info("consumer %s of %s registered from %s", client_id, group, ch.remote)
        for pd in producers:
            if isinstance(pd, dict) and pd.get("groupName"):
                self.clients.register_producer(str(pd["groupName"]), info)
        ch.attrs["client_id"] = client_id
        return req.make_response(ResponseCode.SUCCESS)

    def unregister_client(self, ch: Channel, req: RemotingCommand):
        h = Header(req.ext_fields)
        h.str("clientID")
        pg = h.str("producerGroup", required=False)
        if pg is not None:
            self.clients.unregister_producer(pg, ch)
        cg = h.str("consumerGroup", required=False)
        if cg is not None:
            sgc = self.groups.find(cg)
            self.clients.unregister_consumer(cg, ch, sgc.notify_consumer_ids_changed_enable if sgc else True)
        return req.make_response(ResponseCode.SUCCESS, None, {})

    def check_client_config(self, ch: Channel, req: RemotingCommand):
        try:
            body = fastjson.loads(req.body) if req.body else {}
            sd = (body or {}).get("subscriptionData") or {}
        except ValueError as e:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"bad body: {e}")
        et = sd.get("expressionType") or "TAG"
        if et != "TAG":
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"The broker does not support consumer to filter message by {et}")
        return req.make_response(ResponseCode.SUCCESS)

    def get_consumer_list_by_group(self, ch: Channel, req: RemotingCommand):
        group = Header(req.ext_fields).str("consumerGroup")
        gi = self.clients.group_info(group)
        if gi is not None:
            ids = gi.all_client_ids()
            if ids:
                return req.make_response(ResponseCode.SUCCESS, None, {},
                                         fastjson.dumps_bytes({"consumerIdList": ids}))
        return req.make_response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}", {})

    # --- offsets ------------------------------------------------------------------------------------
    def query_consumer_offset(self, ch: Channel, req: RemotingCommand):
        h = Header(req.ext_fields)
        group, topic, qid = h.str("consumerGroup"), h.str("topic"), h.int("queueId")
        off = self.offsets.query_offset(group, topic, qid)
        if off >= 0:
            return req.make_response(ResponseCode.SUCCESS, None, {"offset": str(off)})
        min_off = self.store.get_min_offset_in_queue(topic, qid)
        if min_off <= 0 and not self._in_disk(topic, qid, 0):
            return req.make_response(ResponseCode.SUCCESS, None, {"offset": "0"})
        return req.make_response(ResponseCode.QUERY_NOT_FOUND,
                                 "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first", {})

    def _in_disk(self, topic: str, qid: int, offset: int) -> bool:
        """checkInDiskByConsumeOffset: is the message far behind the commitlog's end (out of memory)?"""
        try:
            phy = self.store.get_commit_log_offset_in_queue(topic, qid, offset)
        except Exception:
            return False
        if phy <= 0 and self.store.get_max_offset_in_queue(topic, qid) == 0:
            return False
        from ..store.store import TOTAL_PHYSICAL_MEMORY_SIZE
        memory = TOTAL_PHYSICAL_MEMORY_SIZE * self.cfg.access_message_in_memory_max_ratio // 100
        return self.store.get_max_phy_offset() - phy > memory

    def update_consumer_offset(self, ch: Channel, req: RemotingCommand):
        h = Header(req.ext_fields)
        self.offsets.commit_offset(h.str("consumerGroup"), h.str("topic"), h.int("queueId"), h.long("commitOffset"))
        return req.make_response(ResponseCode.SUCCESS, None, {})

    def get_all_consumer_offset(self, ch: Channel, req: RemotingCommand):
        return req.make_response(ResponseCode.SUCCESS, body=fastjson.dumps_bytes(self.offsets.encode()))

    def search_offset_by_timestamp(self, ch: Channel, req: RemotingCommand):
        h = Header(req.ext_fields)
        off = self.store.get_offset_in_queue_by_time(h.str("topic"), h.int("queueId"), h.long("timestamp"))
        return req.make_response(ResponseCode.SUCCESS, None, {"offset": str(off)})

    def get_max_offset(self, ch: Channel, req: RemotingCommand):
        h = Header(req.ext_fields)
        return req.make_response(ResponseCode.SUCCESS, None,
                                 {"offset": str(self.store.get_max_offset_in_queue(h.str("topic"), h.int("queueId")))})

    def get_min_offset(self, ch: Channel, req: RemotingCommand):
        h = Header(req.ext_fields)
        return req.make_response(ResponseCode.SUCCESS, None,
                                 {"offset": str(self.store.get_min_offset_in_queue(h.str("topic"), h.int("queueId")))})

    def get_earliest_msg_storetime(self, ch: Channel, req: RemotingCommand):
        h = Header(req.ext_fields)
        ts = self.store.get_earliest_message_time(h.str("topic"), h.int("queueId"))
        return req.make_response(ResponseCode.SUCCESS, None, {"timestamp": str(ts)})

    def query_broker_offset(self, ch: Channel, req: RemotingCommand):
        return req.make_response(ResponseCode.SUCCESS, None, {"offset": str(self.store.get_max_phy_offset())})

    def get_broker_runtime_info(self, ch: Channel, req: RemotingCommand):
        table = {"brokerVersion": "293", "brokerVersionDesc": "V4_4_0",
                 "commitLogMinOffset": str(self.store.get_min_phy_offset()),
                 "commitLogMaxOffset": str(self.store.get_max_phy_offset()),
                 "dispatchBehindBytes": str(self.store.dispatch_behind_bytes()),
                 "putMessageTimesTotal": str(self.stats["put"]), "getMessageTimesTotal": str(self.stats["get"]),
                 "runtime": "rmqstore"}
        return req.make_response(ResponseCode.SUCCESS, body=fastjson.dumps_bytes({"table": table}))

    # --- topics -------------------------------------------------------------------------------------
    def update_and_create_topic(self, ch: Channel, req: RemotingCommand):
        h = Header(req.ext_fields)
        topic = h.str("topic")
        if topic == self.cfg.broker_cluster_name:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"the topic[{topic}] is conflict with system reserved words.")
        if not TOPIC_RE.match(topic) or len(topic.encode()) > codec.MAX_TOPIC_LENGTH:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"the topic[{topic[:200]}] is not a valid topic name")
        h.str("defaultTopic")
        rq, wq, perm = h.int("readQueueNums"), h.int("writeQueueNums"), h.int("perm")
        if not (0 <= rq <= 65535 and 0 <= wq <= 65535):
            return req.make_response(ResponseCode.SYSTEM_ERROR, "queue numbers out of range")
        h.str("topicFilterType")
        try:
            self.topics.create_topic(topic, wq, perm, read_queue_nums=rq, order=h.bool("order"),
                                     topic_sys_flag=h.int("topicSysFlag", False, 0))
        except ValueError as e:
            return req.make_response(ResponseCode.SYSTEM_ERROR, str(e))
        return req.make_response(ResponseCode.SUCCESS)

    def delete_topic(self, ch: Channel, req: RemotingCommand):
        topic = Header(req.ext_fields).str("topic")
        self.topics.delete_topic(topic)
        return req.make_response(ResponseCode.SUCCESS)

    def get_all_topic_config(self, ch: Channel, req: RemotingCommand):
        return req.make_response(ResponseCode.SUCCESS, body=fastjson.dumps_bytes(self.topics.encode()))

    # --- ordered consumption locks (RebalanceLockManager) ---------------------------------------------
    def lock_batch_mq(self, ch: Channel, req: RemotingCommand):
        try:
            body = fastjson.loads(req.body or b"{}")
            group, client = str(body["consumerGroup"]), str(body["clientId"])
            mqs = list(body.get("mqSet") or [])
        except (ValueError, KeyError, TypeError) as e:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"bad body: {e}")
        now = time.monotonic()
        locked = []
        for mq in mqs:
            key = (group, str(mq.get("topic")), str(mq.get("brokerName")), int(mq.get("queueId", 0)))
            holder = self.locks.get(key)
            if holder is None or holder[0] == client or now - holder[1] > 60:
                self.locks[key] = (client, now)
                locked.append(mq)
        return req.make_response(ResponseCode.SUCCESS, body=fastjson.dumps_bytes({"lockOKMQSet": locked}))

    def unlock_batch_mq(self, ch: Channel, req: RemotingCommand):
        try:
            body = fastjson.loads(req.body or b"{}")
            group, client = str(body["consumerGroup"]), str(body["clientId"])
            for mq in body.get("mqSet") or []:
                key = (group, str(mq.get("topic")), str(mq.get("brokerName")), int(mq.get("queueId", 0)))
                if self.locks.get(key, (None,))[0] == client:
                    del self.locks[key]
        except (ValueError, KeyError, TypeError) as e:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"bad body: {e}")
        return req.make_response(ResponseCode.SUCCESS)

    # --- retry ----------------------------------------------------------------------------------------
    def consumer_send_msg_back(self, ch: Channel, req: RemotingCommand):
        """SendMessageProcessor.consumerSendMsgBack, done by LocalBroker.send_message_back (the retry /
        dead-letter semantics of the in-process messaging layer)."""
        h = Header(req.ext_fields)
        offset = h.long("offset")
        group = h.str("group")
        delay_level = h.int("delayLevel")
        sgc = self.groups.find(group)
        if sgc is None:
            return req.make_response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}{FAQ}")
        if sgc.retry_queue_nums <= 0:
            return req.make_response(ResponseCode.SUCCESS)
        max_times = sgc.retry_max_times
        if req.version >= V3_4_9:
            max_times = h.int("maxReconsumeTimes", required=False, default=max_times)
        if offset < 0 or self.store.look_message_by_offset(offset) is None:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}")

        def run():
            return self.local.send_message_back(group, offset, delay_level, max_times)

        def answer(r):
            if r.status is PutMessageStatus.PUT_OK:
                return req.make_response(ResponseCode.SUCCESS)
            return req.make_response(ResponseCode.SYSTEM_ERROR, r.status.value)
        if self.sync_flush:
            return self._in_executor(run, answer)
        return answer(run())

    async def _in_executor(self, fn, then):
        return then(await self.loop.run_in_executor(None, fn))

    # --- transactions ---------------------------------------------------------------------------------
    def end_transaction(self, ch: Channel, req: RemotingCommand):
        """EndTransactionProcessor, over rmqstore.messaging.transaction's TransactionCheckService (the store-level model:
        the half sits in its real topic and queue with sysFlag PREPARED; commit appends a copy with sysFlag
        COMMIT and preparedTransactionOffset = the half's offset, rollback one with ROLLBACK and no body)."""
        h = Header(req.ext_fields)
        pgroup = h.str("producerGroup")
        tran_offset = h.long("tranStateTableOffset")
        cl_offset = h.long("commitLogOffset")
        kind = h.int("commitOrRollback")
        from_check = h.bool("fromTransactionCheck")
        if kind not in (codec.TRANSACTION_COMMIT_TYPE, codec.TRANSACTION_ROLLBACK_TYPE):
            log.warning("producer %s ended a transaction with state %d (pending) %s", ch.remote, kind,
                        "from check" if from_check else "in sending")
            return None
        half = self.store.look_message_by_offset(cl_offset) if cl_offset >= 0 else None
        if half is None or (half.sys_flag & TRAN_MASK) != codec.TRANSACTION_PREPARED_TYPE:
            return req.make_response(ResponseCode.SYSTEM_ERROR, "Find prepared transaction message failed")
        if half.properties.get(PROPERTY_PRODUCER_GROUP) != pgroup:
            return req.make_response(ResponseCode.SYSTEM_ERROR, "The producer group wrong")
        if half.queue_offset != tran_offset:
            return req.make_response(ResponseCode.SYSTEM_ERROR, "The transaction state table offset wrong")
        from ..messaging.transaction import LocalTransactionState
        state = (LocalTransactionState.COMMIT_MESSAGE if kind == codec.TRANSACTION_COMMIT_TYPE
                 else LocalTransactionState.ROLLBACK_MESSAGE)
        tx = self.local.transactions

        def run():
            try:
                return tx.end(pgroup, cl_offset, state)
            except ValueError as e:
                return e

        def answer(r):
            if isinstance(r, ValueError):
                return req.make_response(ResponseCode.SYSTEM_ERROR, str(r))
            if r is None:          # ended before (e.g. by a check): nothing more to write
                return req.make_response(ResponseCode.SUCCESS)
            if r.status in _SEND_OK:
                return req.make_response(ResponseCode.SUCCESS)
            code, remark, _ = _PUT_CODES.get(r.status, (ResponseCode.SYSTEM_ERROR, r.status.value, False))
            return req.make_response(code, remark)
        return self._in_executor(run, answer)

    def transaction_checker(self, group: str):
        """Register a stand-in for a remote producer group with the transaction check service: its checks
        become CHECK_TRANSACTION_STATE requests to one of the group's connections (the answer comes back as
        END_TRANSACTION with fromTransactionCheck)."""
        if group in self._tx_groups:
            return
        self._tx_groups.add(group)
        self.local.transactions.register(_RemoteTransactionProducer(self, group))

    def send_check_transaction_state(self, group: str, msg) -> None:
        """Called on the check service's thread: hand the request to the event loop."""
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        raw = self._one_message(msg.commit_log_offset)
        if raw is None:
            return
        fields = {"tranStateTableOffset": str(msg.queue_offset), "commitLogOffset": str(msg.commit_log_offset),
                  "msgId": msg.properties.get("UNIQ_KEY") or msg.msg_id,
                  "transactionId": msg.properties.get("UNIQ_KEY") or msg.msg_id, "offsetMsgId": msg.msg_id,
                  "producerGroup": group}

        def send():
            ch = self.clients.producer_channel(group)
            if ch is None:
                log.info("no connection of producer group %s to check a transaction on", group)
                return
            ch.oneway(RemotingCommand(RequestCode.CHECK_TRANSACTION_STATE, ext_fields=fields, body=raw, flag=2))
        try:
            loop.call_soon_threadsafe(send)
        except RuntimeError:
            pass


class _RemoteTransactionProducer:
    """What TransactionCheckService needs of a producer, for a group whose producers are remote clients."""

    def __init__(self, broker: Broker, group: str):
        from ..messaging.local_broker import broker_setting
        cfg = broker.cfg
        self.broker = broker
        self.group = group
        self.transaction_timeout_ms = broker_setting(cfg, "transactionTimeOut", 6000)
        self.transaction_check_max = broker_setting(cfg, "transactionCheckMax", 15)
        self.transaction_check_interval_ms = broker_setting(cfg, "transactionCheckInterval", 60_000)

    def _check_local_transaction(self, msg):
        from ..messaging.transaction import LocalTransactionState
        self.broker.send_check_transaction_state(self.group, msg)
        return LocalTransactionState.UNKNOW      # the producer answers later with END_TRANSACTION


_KEEP_HELD = object()
_SEND_OK = (PutMessageStatus.PUT_OK, PutMessageStatus.FLUSH_DISK_TIMEOUT, PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
            PutMessageStatus.SLAVE_NOT_AVAILABLE)
_ILLEGAL = ("the message is illegal, maybe msg body or properties length not matched. msg body length limit 128k, "
            "msg properties length limit 32k.")
_PUT_CODES = {
    PutMessageStatus.PUT_OK: (ResponseCode.SUCCESS, None, True),
    PutMessageStatus.FLUSH_DISK_TIMEOUT: (ResponseCode.FLUSH_DISK_TIMEOUT, None, True),
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: (ResponseCode.FLUSH_SLAVE_TIMEOUT, None, True),
    PutMessageStatus.SLAVE_NOT_AVAILABLE: (ResponseCode.SLAVE_NOT_AVAILABLE, None, True),
    PutMessageStatus.CREATE_MAPEDFILE_FAILED: (ResponseCode.SYSTEM_ERROR,
                                               "create mapped file failed, server is busy or broken.", False),
    PutMessageStatus.MESSAGE_ILLEGAL: (ResponseCode.MESSAGE_ILLEGAL, _ILLEGAL, False),
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: (ResponseCode.MESSAGE_ILLEGAL, _ILLEGAL, False),
    PutMessageStatus.SERVICE_NOT_AVAILABLE: (ResponseCode.SERVICE_NOT_AVAILABLE, "service not available now", False),
    PutMessageStatus.OS_PAGECACHE_BUSY: (ResponseCode.SYSTEM_ERROR,
                                         "[PC_SYNCHRONIZED]broker busy, start flow control for a while", False),
    PutMessageStatus.UNKNOWN_ERROR: (ResponseCode.SYSTEM_ERROR, "UNKNOWN_ERROR", False),
}


def _property_columns(props, n: int) -> dict | None:
    """The properties ("k\\x01v\\x02" * k) of n messages as {name: [value of each message]}, split over the
    whole batch at once; None unless each message has the same k names in the same order, each once, and
    none is a transaction half (those go as Messages, parsed one by one)."""
    p0 = props[0]
    k = p0.count("\x02")
    if not k:
        return None if any(props) else {}
    if list(map(str.count, props, repeat("\x02", n))).count(k) != n \
            or not all(map(str.endswith, props, repeat("\x02", n))):
        return None
    joined = "".join(props)
    if PROPERTY_TRANSACTION_PREPARED in joined:
        return None
    items = joined.split("\x02")
    items.pop()
    if list(map(str.count, items, repeat("\x01", n * k))).count(1) != n * k:
        return None
    flat = "\x01".join(items).split("\x01")
    names = flat[0:2 * k:2]
    if len(set(names)) != k or flat[0::2] != names * n:
        return None
    step = 2 * k
    return {names[j]: flat[2 * j + 1::step] for j in range(k)}


def _host(remote: str) -> str:
    return remote if ":" in remote else "127.0.0.1:0"
