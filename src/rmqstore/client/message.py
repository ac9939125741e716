"""What the client API hands around: Message (to send), MessageExt (received), MessageQueue, send and
pull results, statuses and errors - RocketMQ's client classes with Python names."""
from __future__ import annotations

import enum
import zlib
from dataclasses import dataclass, field

from ..common.enums import (ConsumeConcurrentlyStatus, ConsumeFromWhere, LocalTransactionState,  # noqa: F401 (the API's)
                            PullStatus, SendStatus)
from ..store.format import codec
from ..store.format import scanner
from ..remoting.codes import (PROPERTY_DELAY_TIME_LEVEL, PROPERTY_KEYS, PROPERTY_TAGS,
                              PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, PROPERTY_WAIT_STORE_MSG_OK, ResponseCode)


class MQClientError(Exception):
    """A client-side failure (no route, connection, timeout, bad argument)."""


class MQBrokerError(MQClientError):
    """The broker answered with an error code."""

    def __init__(self, code: int, remark: str | None, addr: str | None = None):
        self.code = code
        self.remark = remark
        self.addr = addr
        try:
            name = ResponseCode(code).name
        except ValueError:
            name = str(code)
        super().__init__(f"CODE: {code} ({name}) DESC: {remark}" + (f" BROKER: {addr}" if addr else ""))


class Message:
    """A message to send (RocketMQ's org.apache.rocketmq.common.message.Message)."""

    __slots__ = ("topic", "body", "flag", "properties", "transaction_id")

    def __init__(self, topic: str, body: bytes | str = b"", tags: str | None = None, keys: str | list[str] | None = None,
                 *, flag: int = 0, properties: dict[str, str] | None = None, delay_level: int = 0,
                 wait_store_msg_ok: bool = True):
        self.topic = topic
        self.body = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        self.flag = flag
        self.properties: dict[str, str] = {}
        self.transaction_id: str | None = None
        if keys:
            self.keys = keys
        if properties:
            self.properties.update({str(k): str(v) for k, v in properties.items()})
        self.properties[PROPERTY_WAIT_STORE_MSG_OK] = "true" if wait_store_msg_ok else "false"
        if tags:
            self.properties[PROPERTY_TAGS] = tags
        if delay_level:
            self.delay_level = delay_level

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @tags.setter
    def tags(self, v: str | None) -> None:
        if v is None:
            self.properties.pop(PROPERTY_TAGS, None)
        else:
            self.properties[PROPERTY_TAGS] = v

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get(PROPERTY_KEYS, "").split(" ") if k]

    @keys.setter
    def keys(self, v: str | list[str] | None) -> None:
        if not v:
            self.properties.pop(PROPERTY_KEYS, None)
        else:
            self.properties[PROPERTY_KEYS] = v if isinstance(v, str) else " ".join(v)

    @property
    def delay_level(self) -> int:
        try:
            return int(self.properties.get(PROPERTY_DELAY_TIME_LEVEL, "0"))
        except ValueError:
            return 0

    @delay_level.setter
    def delay_level(self, level: int) -> None:
        self.properties[PROPERTY_DELAY_TIME_LEVEL] = str(int(level))

    def put_user_property(self, name: str, value: str) -> None:
        self.properties[name] = value

    def get_property(self, name: str) -> str | None:
        return self.properties.get(name)

    def __repr__(self) -> str:
        return f"Message(topic={self.topic!r}, tags={self.tags!r}, keys={self.keys!r}, body={len(self.body)}B)"


@dataclass(frozen=True, order=True)
class MessageQueue:
    topic: str
    broker_name: str
    queue_id: int

    def to_json(self) -> dict:
        return {"brokerName": self.broker_name, "queueId": self.queue_id, "topic": self.topic}


@dataclass(slots=True)
class MessageExt:
    """A received message (RocketMQ's MessageClientExt): msg_id is the producer's unique id (UNIQ_KEY) when
    the message has one, offset_msg_id the store's id (store host + commitlog offset)."""
    topic: str
    body: bytes
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    store_size: int
    flag: int
    sys_flag: int
    born_timestamp: int
    born_host: str
    store_timestamp: int
    store_host: str
    reconsume_times: int
    prepared_transaction_offset: int
    body_crc: int
    offset_msg_id: str
    properties: dict[str, str] = field(default_factory=dict)
    broker_name: str | None = None

    @property
    def msg_id(self) -> str:
        return self.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or self.offset_msg_id

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get(PROPERTY_KEYS, "").split(" ") if k]

    def get_property(self, name: str) -> str | None:
        return self.properties.get(name)

    @property
    def message_queue(self) -> MessageQueue | None:
        return MessageQueue(self.topic, self.broker_name, self.queue_id) if self.broker_name else None

    @classmethod
    def from_record(cls, r: codec.DecodedRecord, broker_name: str | None = None) -> "MessageExt":
        body = r.body or b""
        if r.sys_flag & codec.SYSFLAG_COMPRESSED and body:
            try:
                body = zlib.decompress(body)
            except zlib.error:
                pass
        return cls(r.topic, body, r.queue_id, r.queue_offset, r.physical_offset, r.store_size, r.flag, r.sys_flag,
                   r.born_timestamp, r.born_host, r.store_timestamp, r.store_host, r.reconsume_times,
                   r.prepared_transaction_offset, r.body_crc, r.msg_id, r.properties, broker_name)

    def __repr__(self) -> str:
        return (f"MessageExt(topic={self.topic!r}, queue_id={self.queue_id}, queue_offset={self.queue_offset}, "
                f"msg_id={self.msg_id!r}, tags={self.tags!r}, reconsume_times={self.reconsume_times}, "
                f"body={len(self.body)}B)")


def decode_messages(data: bytes, broker_name: str | None = None) -> list[MessageExt]:
    """The records of a pull / query / view answer (MessageDecoder.decodes)."""
    out = []
    pos, n = 0, len(data)
    while pos < n:
        r = scanner.decode_record(data, pos, n)
        out.append(MessageExt.from_record(r, broker_name))
        pos += r.store_size
    return out


@dataclass
class SendResult:
    send_status: SendStatus
    msg_id: str
    offset_msg_id: str
    message_queue: MessageQueue
    queue_offset: int
    transaction_id: str | None = None
    region_id: str | None = None
    trace_on: bool = True


@dataclass
class TransactionSendResult(SendResult):
    local_transaction_state: LocalTransactionState = LocalTransactionState.UNKNOW


@dataclass
class PullResult:
    pull_status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    msg_found_list: list[MessageExt] = field(default_factory=list)
    suggest_which_broker_id: int = 0


ConsumeStatus = ConsumeConcurrentlyStatus   # the listener's answer


class MessageModel(enum.Enum):
    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"
