"""SendMessageProcessor: SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE and CONSUMER_SEND_MSG_BACK.

A plain JSON SEND_MESSAGE_V2 is queued as it came (PutQueue.add_raw) and checked with the others of its
loop iteration (`columnar`, or `plain` one by one); anything else takes the general path (`send_message`),
which answers what is wrong with it as RocketMQ does.
"""
from __future__ import annotations

import logging
import random
import struct
from itertools import repeat
from operator import add, attrgetter, itemgetter

from ..remoting.body import BodyError, decode_batch
from ..remoting.codes import (DEFAULT_TOPIC, DLQ_GROUP_TOPIC_PREFIX, PERM_READ, PERM_WRITE,
                              PROPERTY_TRANSACTION_PREPARED, RETRY_GROUP_TOPIC_PREFIX, V3_4_9, RequestCode,
                              ResponseCode)
from ..remoting.command import RemotingCommand
from ..store.format import codec, validation
from ..store.format.message import Message, PutMessageResult, PutMessageStatus
from ..store.format.message_batch import MessageBatch
from .context import BrokerContext
from .header import FAQ, INT_MAX, INT_MIN, LONG_MAX, V2_ALIAS, Header
from .net import Channel
from .put_queue import PlainSend, PutQueue, property_columns

log = logging.getLogger(__name__)

DLQ_NUMS_PER_GROUP = 1
TOPIC_RE = validation.CLIENT_TOPIC_RE     # RocketMQ's rule for sends and topic creation (validation.py)
MULTI_TAGS_FLAG = codec.SYSFLAG_MULTI_TAGS
TRAN_MASK = codec.TRANSACTION_TYPE_MASK
_II = struct.Struct(">iI")
_opaque_of = attrgetter("opaque")
_ext_of = attrgetter("ext_fields")
_body_of = attrgetter("body")
_V2_FIELDS = itemgetter("a", "b", "c", "d", "e", "f", "g", "h", "i")
_J_OK = {None, "0"}
_M_OK = {None, "false"}
ONEWAY = 2                                # RemotingCommand flag bit
_tuple_new = tuple.__new__                # builds a NamedTuple without its keyword-handling __new__ (hot path)


def valid_topic_name(topic: str) -> bool:
    return bool(TOPIC_RE.match(topic)) and len(topic.encode()) <= codec.MAX_TOPIC_LENGTH


class SendMessageProcessor:
    def __init__(self, ctx: BrokerContext, transactions):
        self.ctx = ctx
        self.transactions = transactions          # EndTransactionProcessor: registers a remote checker
        self.puts = PutQueue(ctx, self)
        self.rand = random.Random()
        self._valid_topics: set[str] = set()
        self._ok_header = ctx.ok_header_template()
        self.handle_general = None                # set by the Broker: its dispatch (for re-queued raw sends)

    # --- the topic ----------------------------------------------------------------------------------
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
            if not valid_topic_name(topic):
                return None, req.make_response(ResponseCode.MESSAGE_ILLEGAL,
                                               f"the topic[{topic[:200]}] is not a valid topic name", resp_fields)
            if len(self._valid_topics) < 100_000:
                self._valid_topics.add(topic)
        tc = self.ctx.topics.select(topic)
        if tc is None:
            tc = self._auto_create(ch, h, topic)
            if tc is None:
                return None, req.make_response(ResponseCode.TOPIC_NOT_EXIST,
                                               f"topic[{topic}] not exist, apply first please!{FAQ}", resp_fields)
        qid = h.int("queueId")
        if qid >= tc.write_queue_nums and qid >= tc.read_queue_nums:
            return None, req.make_response(
                ResponseCode.SYSTEM_ERROR, f"request queueId[{qid}] is illegal, {tc} Producer: {ch.remote}", resp_fields)
        return tc, None

    def _auto_create(self, ch: Channel, h: Header, topic: str):
        topics = self.ctx.topics
        sys_flag = 0
        if h.bool("unitMode"):
            sys_flag = 2 if topic.startswith(RETRY_GROUP_TOPIC_PREFIX) else 1
        log.warning("the topic %s does not exist, producer %s", topic, ch.remote)
        tc = None
        if h.str("defaultTopic") == DEFAULT_TOPIC:
            tc = topics.create_topic_in_send_message_method(topic, h.int("defaultTopicQueueNums"), sys_flag)
        if tc is None and topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            tc = topics.create_topic_in_send_message_back_method(topic, 1, PERM_WRITE | PERM_READ, sys_flag)
        return tc

    # --- the fast paths -----------------------------------------------------------------------------
    def send_fast(self, ch: Channel, req: RemotingCommand, f: dict) -> bool:
        """Queue a plain send for the next put; False when the general path must take it."""
        p = self.plain(ch, req, f)
        if p is None:
            return False
        self.puts.add_plain(p)
        return True

    def plain(self, ch: Channel, req: RemotingCommand, f: dict) -> PlainSend | None:
        """A (not oneway) SEND_MESSAGE_V2 of one plain message (no batch, retry topic, transaction, new topic or
        odd field) to a known topic, as a PlainSend; None when the general path must take it (it answers
        whatever is wrong)."""
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
        tc = self.ctx.topics.table.get(topic)
        if tc is None or qid < 0 or (qid >= tc.write_queue_nums and qid >= tc.read_queue_nums):
            return None
        props = f.get("i") or ""
        if PROPERTY_TRANSACTION_PREPARED in props or not self.ctx.store.running_flags.writeable:
            return None
        if tc.topic_filter_type == "MULTI_TAG":
            sys_flag |= MULTI_TAGS_FLAG
        return _tuple_new(PlainSend, (ch, req, topic, qid, flag, sys_flag, born_ts, props, req.body or b""))

    def columnar(self, raws: list):
        """(MessageBatch, queue ids) of the RawSends one loop iteration queued, checked and taken apart a field
        at a time over the whole batch. None unless every one is a plain send (what `plain` takes) from one
        connection to one topic with one flag and sysFlag."""
        n = len(raws)
        chs, reqs = zip(*raws)
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
        tc = self.ctx.topics.table.get(topic)
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
        if not self.ctx.store.running_flags.writeable:
            return None
        columns = property_columns(props, n)
        if columns is None:
            return None
        bodies = list(map(_body_of, reqs))
        if None in bodies:
            bodies = [b or b"" for b in bodies]
        if tc.topic_filter_type == "MULTI_TAG":
            sys_flag |= MULTI_TAGS_FLAG
        try:
            return MessageBatch(topic, bodies, queue_ids=qids, properties=columns, flag=flag, sys_flag=sys_flag,
                                born_timestamp=borns, born_host=ch.remote, store_host=self.ctx.store_host), qids
        except (TypeError, ValueError):
            return None

    # --- the general path ---------------------------------------------------------------------------
    def send_message(self, ch: Channel, req: RemotingCommand):
        ctx = self.ctx
        h = self._send_header(req)
        base = ctx.base_fields
        topic = h.str("topic")
        h.str("producerGroup")
        h.str("defaultTopic")
        h.int("defaultTopicQueueNums")
        sys_flag = h.int("sysFlag")
        h.long("bornTimestamp")
        h.int("flag")
        if not ctx.store.running_flags.writeable:
            return req.make_response(ResponseCode.SERVICE_NOT_AVAILABLE,
                                     "service not available now, maybe disk full, " + ctx.store.running_flags.why(), base)
        tc, err = self._topic_for_send(ch, req, h, topic, base)
        if err is not None:
            return err
        qid = h.int("queueId")
        if qid < 0:
            qid = abs(self.rand.randrange(-99999999, 99999999)) % max(1, tc.write_queue_nums)
        if tc.topic_filter_type == "MULTI_TAG":
            sys_flag |= MULTI_TAGS_FLAG
        reconsume = h.int("reconsumeTimes", required=False, default=0)
        if req.code == RequestCode.SEND_BATCH_MESSAGE or h.bool("batch"):
            return self._send_batch(ch, req, h, topic, qid, sys_flag, reconsume, req.body or b"")
        return self._send_one(ch, req, h, topic, qid, sys_flag, reconsume)

    def _send_one(self, ch: Channel, req: RemotingCommand, h: Header, topic: str, qid: int, sys_flag: int,
                  reconsume: int):
        ctx = self.ctx
        base = ctx.base_fields
        msg_topic = topic
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            group = topic[len(RETRY_GROUP_TOPIC_PREFIX):]
            sgc = ctx.groups.find(group)
            if sgc is None:
                return req.make_response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                                         f"subscription group not exist, {group}{FAQ}", base)
            max_times = sgc.retry_max_times
            if req.version >= V3_4_9:
                max_times = h.int("maxReconsumeTimes", required=False, default=max_times)
            if reconsume >= max_times:
                msg_topic = DLQ_GROUP_TOPIC_PREFIX + group
                qid = abs(self.rand.randrange(-99999999, 99999999)) % DLQ_NUMS_PER_GROUP
                ctx.topics.create_topic_in_send_message_back_method(msg_topic, DLQ_NUMS_PER_GROUP, PERM_WRITE, 0)
        props = codec.string_to_properties(h.str("properties", required=False) or "")
        msg = Message(msg_topic, req.body or b"", qid, h.int("flag"), sys_flag, h.long("bornTimestamp"), ch.remote,
                      ctx.store_host, reconsume, 0, props)
        if props.get(PROPERTY_TRANSACTION_PREPARED, "").lower() == "true":
            if ctx.reject_transaction:
                return req.make_response(ResponseCode.NO_PERMISSION,
                                         f"the broker[{ctx.cfg.broker_ip1}] sending transaction message is forbidden",
                                         base)
            msg.sys_flag = (msg.sys_flag & ~TRAN_MASK) | codec.TRANSACTION_PREPARED_TYPE
            self.transactions.register_checker(h.str("producerGroup"))

        def done(results: list[PutMessageResult]) -> None:
            if not req.flag & ONEWAY:
                ch.send(self.put_response(req, results[0], qid))
                self.puts.touched.add(ch)
        self.puts.submit([msg], done)
        return None

    def _send_batch(self, ch, req, h, topic, qid, sys_flag, reconsume, body):
        base = self.ctx.base_fields
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
        total = sum(codec.record_length(len(e.body), tl, len(codec.properties_to_string(e.properties).encode()))
                    for e in entries)
        if total > self.ctx.cfg.max_message_size:
            return req.make_response(ResponseCode.MESSAGE_ILLEGAL, _ILLEGAL, base)
        born_ts, born_host = h.long("bornTimestamp"), _host(ch.remote)
        msgs = [Message(topic=topic, body=e.body, queue_id=qid, flag=e.flag, sys_flag=sys_flag, born_timestamp=born_ts,
                        born_host=born_host, store_host=self.ctx.store_host, reconsume_times=reconsume,
                        properties=e.properties) for e in entries]

        def done(results: list[PutMessageResult]) -> None:
            if not req.flag & ONEWAY:
                ch.send(self.put_response(req, _merged(results), qid))
        self.puts.submit(msgs, done)
        return None

    # --- answers ------------------------------------------------------------------------------------
    def ok_frames(self, msg_ids, qids, queue_offsets, reqs) -> list[bytes]:
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

    def ok_frame(self, opaque: int, msg_id: str, qid: int, queue_offset: int) -> bytes:
        """The encoded answer to a JSON SEND_MESSAGE_V2 whose message was put."""
        h = (self._ok_header % (msg_id, qid, queue_offset, opaque)).encode()
        return _II.pack(4 + len(h), len(h)) + h

    def put_response(self, req: RemotingCommand, r: PutMessageResult, qid: int) -> RemotingCommand:
        base = self.ctx.base_fields
        st = r.status
        if st is PutMessageStatus.PUT_OK:
            a = r.append_result
            fields = {"msgId": a.msg_id, "queueId": str(qid), "queueOffset": str(a.logics_offset)}
            fields.update(base)
            return RemotingCommand(0, opaque=req.opaque, flag=1, ext_fields=fields, serialize_type=req.serialize_type)
        code, remark, ok = PUT_CODES.get(st, (ResponseCode.SYSTEM_ERROR, "UNKNOWN_ERROR DEFAULT", False))
        if st is PutMessageStatus.SERVICE_NOT_AVAILABLE:
            remark = f"service not available now, maybe disk full, {self.ctx.store.running_flags.why()}"
        fields = dict(base)
        if ok:
            a = r.append_result
            fields["msgId"] = a.msg_id
            fields["queueId"] = str(qid)
            fields["queueOffset"] = str(a.logics_offset)
            remark = None
        return req.make_response(code, remark, fields)

    # --- retry --------------------------------------------------------------------------------------
    def consumer_send_msg_back(self, ch: Channel, req: RemotingCommand):
        """SendMessageProcessor.consumerSendMsgBack, done by LocalBroker.send_message_back (the retry /
        dead-letter semantics of the in-process messaging layer)."""
        ctx = self.ctx
        h = Header(req.ext_fields)
        offset = h.long("offset")
        group = h.str("group")
        delay_level = h.int("delayLevel")
        sgc = ctx.groups.find(group)
        if sgc is None:
            return req.make_response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}{FAQ}")
        if sgc.retry_queue_nums <= 0:
            return req.make_response(ResponseCode.SUCCESS)
        max_times = sgc.retry_max_times
        if req.version >= V3_4_9:
            max_times = h.int("maxReconsumeTimes", required=False, default=max_times)
        if offset < 0:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}")
        msg = ctx.store.look_message_by_offset(offset)
        if msg is None:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}")

        def run():
            return ctx.local.send_message_back(group, offset, delay_level, max_times)

        def answer(r):
            if r.status is PutMessageStatus.PUT_OK:
                ctx.stats.on_send_back(group, msg.topic)
                return req.make_response(ResponseCode.SUCCESS)
            return req.make_response(ResponseCode.SYSTEM_ERROR, r.status.value)
        ha = ctx.store.ha
        if ctx.sync_flush or (ha is not None and ha.sync_master):     # the put waits (a flush, a slave): off the loop
            return ctx.in_executor(run, answer)
        return answer(run())


def _merged(results: list[PutMessageResult]) -> PutMessageResult:
    """A batch's results as RocketMQ's one answer: the first bad one, or the first with the total bytes and
    the comma-joined msgIds."""
    bad = next((r for r in results if r.status not in SEND_OK), None)
    if bad is not None:
        return bad
    first = results[0]
    a = first.append_result
    merged = PutMessageResult(first.status, a.__class__(
        a.status, a.wrote_offset, sum(r.append_result.wrote_bytes for r in results),
        ",".join(r.append_result.msg_id for r in results), a.store_timestamp, a.logics_offset, len(results)))
    for r in results:
        if r.status is not PutMessageStatus.PUT_OK:
            merged.status = r.status
    return merged


def _host(remote: str) -> str:
    return remote if ":" in remote else "127.0.0.1:0"


SEND_OK = (PutMessageStatus.PUT_OK, PutMessageStatus.FLUSH_DISK_TIMEOUT, PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
           PutMessageStatus.SLAVE_NOT_AVAILABLE)
_ILLEGAL = ("the message is illegal, maybe msg body or properties length not matched. msg body length limit 128k, "
            "msg properties length limit 32k.")
PUT_CODES = {
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
