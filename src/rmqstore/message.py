"""Typed messages, results and RocketMQ's status enums."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from . import codec


class PutMessageStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPEDFILE_FAILED = "CREATE_MAPEDFILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGECACHE_BUSY = "OS_PAGECACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


class AppendMessageStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    END_OF_FILE = "END_OF_FILE"
    MESSAGE_SIZE_EXCEEDED = "MESSAGE_SIZE_EXCEEDED"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


class GetMessageStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


class TransactionType(enum.IntEnum):
    NOT_TYPE = codec.TRANSACTION_NOT_TYPE
    PREPARED = codec.TRANSACTION_PREPARED_TYPE
    COMMIT = codec.TRANSACTION_COMMIT_TYPE
    ROLLBACK = codec.TRANSACTION_ROLLBACK_TYPE


DEFAULT_HOST = "127.0.0.1:0"


@dataclass(slots=True)
class Message:
    """A message handed to put_message (RocketMQ's MessageExtBrokerInner, minus what the store assigns)."""
    topic: str
    body: bytes = b""
    queue_id: int = 0
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: str = DEFAULT_HOST
    store_host: str | None = None
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    properties: dict[str, str] = field(default_factory=dict)

    @property
    def tags(self) -> str | None:
        return self.properties.get(codec.PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get(codec.PROPERTY_KEYS, "").split(codec.KEY_SEPARATOR) if k]

    @classmethod
    def from_json(cls, d: dict) -> "Message":
        """A line of the golden messages.jsonl (camelCase names, hex body) to a Message."""
        body = d.get("body", "")
        return cls(topic=d["topic"], body=bytes.fromhex(body) if isinstance(body, str) else bytes(body),
                   queue_id=int(d.get("queueId", 0)), flag=int(d.get("flag", 0)), sys_flag=int(d.get("sysFlag", 0)),
                   born_timestamp=int(d.get("bornTimestamp", 0)), born_host=d.get("bornHost", DEFAULT_HOST),
                   store_host=d.get("storeHost"), reconsume_times=int(d.get("reconsumeTimes", 0)),
                   prepared_transaction_offset=int(d.get("preparedTransactionOffset", 0)),
                   properties=dict(d.get("properties") or {}))


@dataclass(slots=True)
class MessageExt:
    """A stored message as read back (RocketMQ's MessageExt)."""
    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    store_size: int
    body_crc: int
    flag: int
    sys_flag: int
    born_timestamp: int
    store_timestamp: int
    born_host: str
    store_host: str
    reconsume_times: int
    prepared_transaction_offset: int
    msg_id: str
    properties: dict[str, str]
    body: bytes | None

    @property
    def tags(self) -> str | None:
        return self.properties.get(codec.PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get(codec.PROPERTY_KEYS, "").split(codec.KEY_SEPARATOR) if k]

    @classmethod
    def from_record(cls, r: codec.DecodedRecord) -> "MessageExt":
        return cls(r.topic, r.queue_id, r.queue_offset, r.physical_offset, r.store_size, r.body_crc, r.flag,
                   r.sys_flag, r.born_timestamp, r.store_timestamp, r.born_host, r.store_host, r.reconsume_times,
                   r.prepared_transaction_offset, r.msg_id, r.properties, r.body)

    def to_json(self) -> dict:
        """The golden dump's message line: camelCase fields, sorted properties string, hex body."""
        return {
            "topic": self.topic, "queueId": self.queue_id, "queueOffset": self.queue_offset,
            "commitLogOffset": self.commit_log_offset, "storeSize": self.store_size, "bodyCRC": self.body_crc,
            "flag": self.flag, "sysFlag": self.sys_flag, "bornTimestamp": self.born_timestamp,
            "storeTimestamp": self.store_timestamp, "bornHost": self.born_host, "storeHost": self.store_host,
            "reconsumeTimes": self.reconsume_times, "preparedTransactionOffset": self.prepared_transaction_offset,
            "msgId": self.msg_id, "properties": codec.sorted_properties_string(self.properties),
            "body": self.body.hex() if self.body is not None else None,
        }


@dataclass(slots=True)
class AppendMessageResult:
    status: AppendMessageStatus
    wrote_offset: int = 0
    wrote_bytes: int = 0
    msg_id: str = ""
    store_timestamp: int = 0
    logics_offset: int = 0
    msg_num: int = 1


@dataclass(slots=True)
class PutMessageResult:
    status: PutMessageStatus
    append_result: AppendMessageResult | None = None

    @property
    def ok(self) -> bool:
        return self.status is PutMessageStatus.PUT_OK

    def to_json(self) -> dict:
        a = self.append_result
        return {"status": self.status.value, "msgId": a.msg_id if a else None,
                "wroteOffset": a.wrote_offset if a else None, "logicsOffset": a.logics_offset if a else None}


@dataclass(slots=True)
class GetMessageResult:
    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt] = field(default_factory=list)
    buffer_total_size: int = 0
    suggest_pulling_from_slave: bool = False

    @property
    def message_count(self) -> int:
        return len(self.messages)
