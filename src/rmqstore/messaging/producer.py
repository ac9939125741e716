"""Producer: RocketMQ's DefaultMQProducer, in process, writing straight into a MessageStore.

    with MessageStore.open(path) as store:
        producer = Producer(store, group="order-producer")
        r = producer.send("TopicA", b"hello", tags="TagA", keys=["order-1"])
        r.send_status, r.msg_id, r.offset_msg_id, r.message_queue, r.queue_offset

Messages are built as the Java client builds them: properties TAGS, KEYS, WAIT=true, the user's
properties, DELAY for delayed messages, UNIQ_KEY (MessageClientIDSetter's 32 hex digits: client IP, pid,
class-loader hash, ms since the start of the month, counter), laid out in java.util.HashMap order as the
client serialises them. The queue is chosen round robin over the topic's write queues (from a random
start, as TopicPublishInfo), or by `queue`, or by hashing a sharding key (SelectMessageQueueByHash), or by
a `queue_selector(queues, message, arg)` callable (MessageQueueSelector).

Topics come from `{store}/config/topics.json`; an unknown topic is created on first send when
autoCreateTopicEnable (min(default_topic_queue_nums = 4, the store's defaultTopicQueueNums) queues,
as the broker's createTopicInSendMessageMethod), else send raises TopicNotExistError.

send(..., deliver_at=t) sends a timer message (RocketMQ 5's delivery timestamp: TIMER_DELIVER_MS, parked
by store/timer/timer.py until t): t is an aware datetime or epoch ms; a naive datetime, deliver_at with
delay_level, or a time beyond the store's timerMaxDelaySec is a ValueError naming it; a time already past
sends a plain message (delivered now).

send() returns a SendResult whose send_status mirrors RocketMQ's SendStatus (SEND_OK,
FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE); a refused put raises SendError carrying
the store's PutMessageStatus (as the Java client throws MQBrokerException).
"""
from __future__ import annotations

import itertools
import logging
import os
import random
import socket
import struct
import threading
import time
import zlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Iterable, Sequence

from ..common.enums import SendStatus
from ..store.format import codec, validation
from ..errors import RmqStoreError
from ..store.format.java_map import JavaHashMap
from .local_broker import PROPERTY_WAIT_STORE_MSG_OK, LocalBroker
from ..store.format.message import Message, MessageExt, PutMessageResult, PutMessageStatus
from ..store.timer.timer import PROPERTY_TIMER_DELIVER_MS
from .topic_config import AUTO_CREATE_TOPIC_KEY_TOPIC, PERM_WRITE, MessageQueue, TopicNotExistError

log = logging.getLogger(__name__)

__all__ = ["Producer", "SendResult", "SendStatus", "SendError", "MessageQueue", "TopicNotExistError",
           "create_uniq_id", "select_queue_by_hash"]

DEFAULT_PRODUCER_GROUP = "DEFAULT_PRODUCER"
MAX_MESSAGE_SIZE = 1024 * 1024 * 4
COMPRESS_LEVEL = 5


def deliver_at_ms(deliver_at: datetime | int | float) -> int:
    """Epoch ms of a deliver_at argument: an aware datetime or a number of epoch ms. A naive datetime
    (no tzinfo: which zone?), a bool or anything else is a ValueError naming deliver_at."""
    if isinstance(deliver_at, datetime):
        if deliver_at.tzinfo is None or deliver_at.utcoffset() is None:
            raise ValueError(f"deliver_at={deliver_at!r} is a naive datetime: give it a tzinfo "
                             f"(e.g. datetime.now(timezone.utc) + timedelta(seconds=10)) or pass epoch ms")
        return int(deliver_at.timestamp() * 1000)
    if isinstance(deliver_at, bool) or not isinstance(deliver_at, (int, float)):
        raise ValueError(f"deliver_at={deliver_at!r}: an aware datetime or epoch milliseconds expected")
    if not deliver_at >= 0 or deliver_at == float("inf"):
        raise ValueError(f"deliver_at={deliver_at!r}: epoch milliseconds must be a finite number >= 0")
    return int(deliver_at)


_SEND_STATUS = {
    PutMessageStatus.PUT_OK: SendStatus.SEND_OK,
    PutMessageStatus.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    PutMessageStatus.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}


class SendError(RmqStoreError):
    """The store refused the message (RocketMQ's MQBrokerException); `status` says why."""

    def __init__(self, status: PutMessageStatus, topic: str):
        self.status = status
        self.topic = topic
        super().__init__(f"send to {topic} failed: {status.value}")


@dataclass
class SendResult:
    send_status: SendStatus
    msg_id: str                 # the client's UNIQ_KEY (comma-separated for a batch)
    offset_msg_id: str          # the store's message id: store host + commitlog offset
    message_queue: MessageQueue
    queue_offset: int
    commit_log_offset: int = -1
    transaction_id: str | None = None
    region_id: str = "DefaultRegion"

    @property
    def ok(self) -> bool:
        return self.send_status is SendStatus.SEND_OK


# --- MessageClientIDSetter ---------------------------------------------------------------------------
def _client_ip() -> bytes:
    """UtilAll.getIP's choice, without sending anything: the address of the default route, else loopback."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))        # UDP connect: picks a source address, sends nothing
            ip = s.getsockname()[0]
            return socket.inet_aton(ip)
    except OSError:
        return socket.inet_aton("127.0.0.1")


class _UniqIdFactory:
    def __init__(self):
        self._lock = threading.Lock()
        self._pid = None
        self._counter = itertools.count()
        self._start = self._next_start = 0
        self._fix = ""
        self.ip = b"\x7f\x00\x00\x01"

    def _init(self) -> None:
        pid = os.getpid()
        self.ip = _client_ip()
        # IP (4), the low 2 bytes of the pid, a class-loader hash (4): ByteBuffer tricks of the Java client
        self._fix = (self.ip + struct.pack(">I", pid)[2:] + struct.pack(">I", random.getrandbits(32))).hex().upper()
        self._pid = pid
        self._counter = itertools.count()
        self._set_start_time(time.time())

    def _set_start_time(self, now: float) -> None:
        lt = time.localtime(now)
        start = time.mktime((lt.tm_year, lt.tm_mon, 1, 0, 0, 0, 0, 0, -1))
        year, month = (lt.tm_year + 1, 1) if lt.tm_mon == 12 else (lt.tm_year, lt.tm_mon + 1)
        self._start = int(start * 1000)
        self._next_start = int(time.mktime((year, month, 1, 0, 0, 0, 0, 0, -1)) * 1000)

    def create(self) -> str:
        if self._pid != os.getpid():        # first use, or a forked child
            with self._lock:
                if self._pid != os.getpid():
                    self._init()
        now = int(time.time() * 1000)
        if now >= self._next_start:
            with self._lock:
                if now >= self._next_start:
                    self._set_start_time(now / 1000.0)
        # (int) cast of the ms since the month began (wraps after 24.8 days, as in Java), (short) counter
        tail = struct.pack(">IH", (now - self._start) & 0xFFFFFFFF, next(self._counter) & 0xFFFF)
        return self._fix + tail.hex().upper()


_UNIQ = _UniqIdFactory()


def create_uniq_id() -> str:
    """A new UNIQ_KEY in MessageClientIDSetter's format (32 uppercase hex digits)."""
    return _UNIQ.create()


def client_ip() -> str:
    if _UNIQ._pid != os.getpid():
        _UNIQ.create()
    return socket.inet_ntoa(_UNIQ.ip)


# --- queue selection -----------------------------------------------------------------------------
def _java_hash_code(arg: Any) -> int:
    if isinstance(arg, str):
        return codec.java_string_hash(arg)
    if isinstance(arg, bool):
        return 1231 if arg else 1237
    if isinstance(arg, int):
        if -(1 << 31) <= arg < (1 << 31):
            return arg                                   # Integer.hashCode
        v = arg & 0xFFFFFFFFFFFFFFFF                     # Long.hashCode
        h = (v ^ (v >> 32)) & 0xFFFFFFFF
        return h - (1 << 32) if h & 0x80000000 else h
    if isinstance(arg, bytes):
        return codec.java_string_hash(arg.decode("utf-8", "replace"))
    return codec.java_string_hash(str(arg))


def select_queue_by_hash(mqs: Sequence[MessageQueue], msg: Any, arg: Any) -> MessageQueue:
    """SelectMessageQueueByHash: abs(arg.hashCode()) % queue count (strings hash as Java's String)."""
    value = _java_hash_code(arg)
    if value < 0:
        value = abs(value) if value != -(1 << 31) else 0
    return mqs[value % len(mqs)]


QueueSelector = Callable[[Sequence[MessageQueue], Message, Any], "MessageQueue | int"]


# --- the producer --------------------------------------------------------------------------------
class Producer:
    def __init__(self, store, group: str = DEFAULT_PRODUCER_GROUP, *, default_topic_queue_nums: int = 4,
                 born_host: str | None = None, compress_msg_body_over_howmuch: int | None = None,
                 max_message_size: int = MAX_MESSAGE_SIZE):
        if not group:
            raise ValueError("producer group must not be empty")
        self.store = store
        self.group = group
        self.default_topic_queue_nums = default_topic_queue_nums
        self.born_host = born_host or f"{client_ip()}:0"
        self.compress_over = compress_msg_body_over_howmuch
        self.max_message_size = max_message_size
        self.broker = LocalBroker.of(store)
        self._rr: dict[str, itertools.count] = {}
        self._running = True

    # lifecycle: usable right away; start/shutdown exist for symmetry with RocketMQ
    def start(self) -> "Producer":
        self._running = True
        return self

    def shutdown(self) -> None:
        self._running = False

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # --- routing --------------------------------------------------------------------------------
    def _topic_config(self, topic: str):
        tc = self.broker.topics.select(topic)
        if tc is None:
            tc = self.broker.topics.create_topic_in_send_message_method(topic, self.default_topic_queue_nums)
        if tc is None:
            raise TopicNotExistError(f"No route info of this topic: {topic}")
        if not tc.perm & PERM_WRITE or tc.write_queue_nums <= 0:
            raise TopicNotExistError(f"the topic[{topic}] sending message is forbidden")
        return tc

    def fetch_publish_message_queues(self, topic: str) -> list[MessageQueue]:
        tc = self._topic_config(topic)
        return [MessageQueue(topic, self.broker.broker_name, i) for i in range(tc.write_queue_nums)]

    def _select(self, topic: str, msg: Message, queue, sharding_key, queue_selector) -> MessageQueue:
        mqs = self.fetch_publish_message_queues(topic)
        if queue is not None:
            qid = queue.queue_id if isinstance(queue, MessageQueue) else int(queue)
            if not 0 <= qid < len(mqs):
                raise ValueError(f"request queueId[{qid}] is illegal, topic {topic} has {len(mqs)} write queues")
            return mqs[qid]
        if queue_selector is not None:
            got = queue_selector(mqs, msg, sharding_key)
            qid = got.queue_id if isinstance(got, MessageQueue) else int(got)
            if not 0 <= qid < len(mqs):
                raise ValueError(f"queue selector chose queue {qid}, topic {topic} has {len(mqs)} write queues")
            return mqs[qid]
        if sharding_key is not None:
            return select_queue_by_hash(mqs, msg, sharding_key)
        counter = self._rr.get(topic)
        if counter is None:
            counter = self._rr.setdefault(topic, itertools.count(random.randrange(1 << 16)))
        return mqs[next(counter) % len(mqs)]

    # --- building messages ----------------------------------------------------------------------
    def build_message(self, topic: str, body: bytes | str, tags: str | None = None,
                      keys: str | Iterable[str] | None = None, properties: dict[str, str] | None = None,
                      delay_level: int = 0, flag: int = 0, extra: dict[str, str] | None = None) -> Message:
        """The message as the Java client would send it (queue id chosen later)."""
        self._check_topic(topic)
        if isinstance(body, str):
            body = body.encode("utf-8")
        body = bytes(body) if body is not None else b""
        if not body:
            raise ValueError("the message body length is zero")
        if len(body) > self.max_message_size:
            raise ValueError(f"the message body size over max value, MAX: {self.max_message_size}")
        m = JavaHashMap()
        if tags:
            m.put(codec.PROPERTY_TAGS, tags)
        if keys:
            k = keys if isinstance(keys, str) else codec.KEY_SEPARATOR.join(str(x) for x in keys)
            if k:
                m.put(codec.PROPERTY_KEYS, k)
        m.put(PROPERTY_WAIT_STORE_MSG_OK, "true")
        for name, value in (properties or {}).items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise validation.InvalidMessageError(
                    f"property {name!r}: the name or value of property can not be null or blank string! "
                    f"(got a {type(name).__name__} name and a {type(value).__name__} value; str expected)")
            if not name.strip() or not value.strip():
                raise ValueError("The name or value of property can not be null or blank string!")
            if any(c in name or c in value for c in (codec.NAME_VALUE_SEPARATOR, codec.PROPERTY_SEPARATOR)):
                raise ValueError(f"property {name!r} contains a separator character (\\x01 or \\x02)")
            m.put(name, value)
        if delay_level:
            if delay_level < 0:
                raise ValueError("delay_level must be >= 0")
            m.put(codec.PROPERTY_DELAY, str(int(delay_level)))
        for name, value in (extra or {}).items():
            m.put(name, value)
        if codec.PROPERTY_UNIQ_KEY not in m:
            m.put(codec.PROPERTY_UNIQ_KEY, create_uniq_id())
        sys_flag = 0
        if self.compress_over is not None and len(body) >= self.compress_over:
            body = zlib.compress(body, COMPRESS_LEVEL)
            sys_flag |= codec.SYSFLAG_COMPRESSED
        return Message(topic=topic, body=body, flag=flag, sys_flag=sys_flag, born_timestamp=int(time.time() * 1000),
                       born_host=self.born_host, properties=m.to_dict())

    def _deliver_at_properties(self, deliver_at, delay_level: int) -> dict[str, str]:
        """TIMER_DELIVER_MS for deliver_at (none for None or a time already past: delivered now), checked
        against the store's timer extension (its timerMaxDelaySec)."""
        if deliver_at is None:
            return {}
        hooks = {h.hook_name: h for h in self.store.put_message_hook_list}
        timer = hooks.get("timer")
        if timer is None:
            raise ValueError("deliver_at: this store has no timer extension (store/timer/timer.py) installed")
        if delay_level:
            raise ValueError("deliver_at and delay_level together: a message has one delivery time")
        deliver_ms = deliver_at_ms(deliver_at)
        now = int(time.time() * 1000)
        if deliver_ms <= now:
            return {}
        if deliver_ms - now > timer.max_delay_ms:
            raise ValueError(f"deliver_at={deliver_at!r} is {(deliver_ms - now) // 1000} s ahead, beyond "
                             f"timerMaxDelaySec={timer.max_delay_ms // 1000}")
        return {PROPERTY_TIMER_DELIVER_MS: str(deliver_ms)}

    @staticmethod
    def _check_topic(topic: str) -> None:
        """RocketMQ's Validators.checkTopic: InvalidMessageError (a ValueError) naming the topic."""
        if not isinstance(topic, str) or not topic or not topic.strip():
            raise validation.InvalidMessageError(f"The specified topic is blank: {topic!r}")
        if len(topic.encode("utf-8")) > codec.MAX_TOPIC_LENGTH:
            raise ValueError(f"The specified topic is longer than topic max length {codec.MAX_TOPIC_LENGTH}.")
        if topic == AUTO_CREATE_TOPIC_KEY_TOPIC:
            raise ValueError(f"The topic[{topic}] is conflict with AUTO_CREATE_TOPIC_KEY_TOPIC.")
        validation.check_client_topic(topic)

    # --- sending --------------------------------------------------------------------------------
    def send(self, topic: str, body: bytes | str, tags: str | None = None, keys: str | Iterable[str] | None = None,
             properties: dict[str, str] | None = None, delay_level: int = 0, queue: int | MessageQueue | None = None,
             *, sharding_key: Any = None, queue_selector: QueueSelector | None = None, flag: int = 0,
             deliver_at: datetime | int | float | None = None) -> SendResult:
        """Send one message; see the module docstring. Raises SendError when the store refuses it.
        deliver_at: a timer message's delivery time (an aware datetime or epoch ms; see the module docstring)."""
        extra = self._deliver_at_properties(deliver_at, delay_level)
        msg = self.build_message(topic, body, tags, keys, properties, delay_level, flag, extra)
        return self._send_built([msg], topic, queue, sharding_key, queue_selector)

    def send_message(self, msg: Message, queue: int | MessageQueue | None = None, *, sharding_key: Any = None,
                     queue_selector: QueueSelector | None = None,
                     deliver_at: datetime | int | float | None = None) -> SendResult:
        """Send a Message built by the caller (or by build_message); it gets a UNIQ_KEY if it has none."""
        self._check_topic(msg.topic)
        timer = self._deliver_at_properties(deliver_at, int(msg.properties.get(codec.PROPERTY_DELAY, "0") or 0))
        if timer:
            msg.properties = {**msg.properties, **timer}
        validation.check_message(msg)
        if codec.PROPERTY_UNIQ_KEY not in msg.properties:
            m = JavaHashMap(msg.properties)
            m.put(codec.PROPERTY_UNIQ_KEY, create_uniq_id())
            msg.properties = m.to_dict()
        if not msg.born_timestamp:
            msg.born_timestamp = int(time.time() * 1000)
        return self._send_built([msg], msg.topic, queue, sharding_key, queue_selector)

    def query_message(self, topic: str, key: str, max_num: int = 32, begin: int = 0,
                      end: int = 2 ** 63 - 1) -> list[MessageExt]:
        """DefaultMQProducer.queryMessage: the messages of topic carrying key (in KEYS or as UNIQ_KEY), each
        once; index hash collisions and other topics' messages are dropped (RocketMQ #3613, #8438)."""
        return self.store.find_messages_by_key(topic, key, max_num, begin, end)

    def view_message(self, msg_id: str) -> MessageExt | None:
        """DefaultMQProducer.viewMessage: a message by its store msgId (offsetMsgId)."""
        return self.store.view_message_by_id(msg_id)

    def send_batch(self, topic: str, bodies: Iterable[bytes | str | Message], tags: str | None = None,
                   keys: str | Iterable[str] | None = None, properties: dict[str, str] | None = None,
                   queue: int | MessageQueue | None = None, *, sharding_key: Any = None,
                   queue_selector: QueueSelector | None = None) -> SendResult:
        """Send messages of one topic to one queue in one put (DefaultMQProducer.send(Collection)).
        Items are bodies (sharing tags/keys/properties) or Messages. Delayed messages cannot be batched.
        The result's msg_id and offset_msg_id are comma-separated, queue_offset is the first message's."""
        self._check_topic(topic)
        msgs = []
        for item in bodies:
            if isinstance(item, Message):
                if item.topic != topic:
                    raise ValueError("The topic of the messages in one batch should be the same")
                validation.check_message(item)
                if codec.PROPERTY_DELAY in item.properties:
                    raise ValueError("TimeDelayLevel is not supported for batching")
                if codec.PROPERTY_UNIQ_KEY not in item.properties:
                    m = JavaHashMap(item.properties)
                    m.put(codec.PROPERTY_UNIQ_KEY, create_uniq_id())
                    item.properties = m.to_dict()
                msgs.append(item)
            else:
                msgs.append(self.build_message(topic, item, tags, keys, properties))
        if not msgs:
            raise ValueError("empty batch")
        size = sum(len(m.body) + len(codec.properties_to_string(m.properties)) + 20 + len(topic) for m in msgs)
        if size > self.max_message_size:
            raise ValueError(f"the batch size {size} over max value, MAX: {self.max_message_size}")
        return self._send_built(msgs, topic, queue, sharding_key, queue_selector)

    def _send_built(self, msgs: list[Message], topic: str, queue, sharding_key, queue_selector,
                    transaction: bool = False) -> SendResult:
        if not self._running:
            raise RmqStoreError("The producer service state not OK, maybe started once, SHUTDOWN_ALREADY")
        mq = self._select(topic, msgs[0], queue, sharding_key, queue_selector)
        for m in msgs:
            m.queue_id = mq.queue_id
        results = self.broker.store.put_messages(msgs)
        return self._result(msgs, mq, results, transaction)

    @staticmethod
    def _result(msgs: list[Message], mq: MessageQueue, results: list[PutMessageResult], transaction: bool) -> SendResult:
        for r in results:
            if r.status not in _SEND_STATUS:
                raise SendError(r.status, mq.topic)
        status = SendStatus.SEND_OK
        for r in results:
            s = _SEND_STATUS[r.status]
            if s is not SendStatus.SEND_OK:
                status = s
                break
        first = results[0].append_result
        uniq = ",".join(m.properties.get(codec.PROPERTY_UNIQ_KEY, "") for m in msgs)
        return SendResult(status, uniq, ",".join(r.append_result.msg_id for r in results), mq,
                          first.logics_offset, first.wrote_offset, transaction_id=uniq if transaction else None)
