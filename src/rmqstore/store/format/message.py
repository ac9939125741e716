"""Typed messages, results and RocketMQ's status enums."""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Callable

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
    """One message's answer. PUT_OK, FLUSH_DISK_TIMEOUT and FLUSH_SLAVE_TIMEOUT: the record is in the
    commitlog at append_result.wrote_offset and is dispatched at append_result.logics_offset; any other
    status: it was not stored, and reason says why (the refused argument, the failed write)."""
    status: PutMessageStatus
    append_result: AppendMessageResult | None = None
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is PutMessageStatus.PUT_OK

    @property
    def wrote_end(self) -> int | None:
        """The commitlog offset after the record (None when nothing was written)."""
        a = self.append_result
        return None if a is None else a.wrote_offset + a.wrote_bytes

    def to_json(self) -> dict:
        a = self.append_result
        return {"status": self.status.value, "msgId": a.msg_id if a else None,
                "wroteOffset": a.wrote_offset if a else None, "logicsOffset": a.logics_offset if a else None}


class AppendedResult(PutMessageResult):
    """The PutMessageResult of one appended message (the single-put path), whose AppendMessageResult and
    msgId string are made on first access: building them costs more than the rest of the answer (measured:
    ~1.4 us of a ~7 us put), and most callers read only `ok` / `status`. Equal to the PutMessageResult
    with the same fields."""
    __slots__ = ("_a",)

    def __init__(self, status: PutMessageStatus, wrote_offset: int, wrote_bytes: int, id_prefix: str,
                 store_timestamp: int, logics_offset: int):
        self.status = status
        self.reason = None
        self._a = (wrote_offset, wrote_bytes, id_prefix, store_timestamp, logics_offset)

    @property
    def append_result(self) -> AppendMessageResult:        # type: ignore[override]
        a = self._a
        if type(a) is tuple:
            off, size, prefix, ts, qoff = a
            a = self._a = AppendMessageResult(AppendMessageStatus.PUT_OK, off, size, prefix + "%016X" % off, ts,
                                              qoff)
        return a

    @property
    def wrote_end(self) -> int:
        a = self._a
        return a[0] + a[1] if type(a) is tuple else a.wrote_offset + a.wrote_bytes

    def __eq__(self, other) -> bool:
        if not isinstance(other, PutMessageResult):
            return NotImplemented
        return (self.status, self.append_result, self.reason) == (other.status, other.append_result, other.reason)

    __hash__ = None     # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PutMessageResult(status={self.status!r}, append_result={self.append_result!r}, reason=None)"


class PutMessageResults(Sequence):
    """What put_messages answers for a batch the columnar path took: one PutMessageResult per message, made
    only when asked for. The batch's figures stay columns (RocketMQ answers a MessageExtBatch with ONE
    PutMessageResult: first offset, total bytes, comma-joined msgIds); indexing and iterating give the
    per-message results, the properties below give the columns without building them.

    The first `appended` messages were appended; the rest (a file could not be created or written) failed
    with `failed_status` and `reason`. `status` is the batch's: PUT_OK when every message is, else the
    first other status.
    """
    __slots__ = ("appended", "_n", "_ok_status", "failed_status", "_offsets", "_sizes", "_queue_offsets",
                 "store_timestamp", "_make_ids", "_ids", "_items", "reason")

    def __init__(self, n: int, appended: int, offsets, sizes, queue_offsets, store_timestamp: int,
                 make_ids: Callable[[], list[str]], failed_status: "PutMessageStatus | None" = None,
                 reason: str | None = None):
        self._n, self.appended = n, appended
        self.reason = reason
        self._ok_status = PutMessageStatus.PUT_OK
        self.failed_status = failed_status
        self._offsets, self._sizes, self._queue_offsets = offsets, sizes, queue_offsets    # int arrays
        self.store_timestamp = store_timestamp
        self._make_ids, self._ids, self._items = make_ids, None, None

    def mark_flush_failed(self, status: "PutMessageStatus") -> None:
        """The appended messages were not flushed in time: they answer status (FLUSH_DISK_TIMEOUT)."""
        self._ok_status, self._items = status, None

    @property
    def status(self) -> "PutMessageStatus":
        return self._ok_status if self.appended else (self.failed_status or self._ok_status)

    @property
    def ok_count(self) -> int:
        """How many messages answer PUT_OK."""
        return self.appended if self._ok_status is PutMessageStatus.PUT_OK else 0

    @property
    def all_ok(self) -> bool:
        return self.ok_count == self._n

    @property
    def wrote_offsets(self) -> list[int]:
        """Commitlog offsets of the appended messages."""
        return self._offsets[:self.appended].tolist()

    @property
    def queue_offsets(self) -> list[int]:
        return self._queue_offsets[:self.appended].tolist()

    @property
    def wrote_bytes(self) -> int:
        return int(self._sizes[:self.appended].sum())

    @property
    def stored_end(self) -> int:
        """The commitlog offset after the last appended record (0 when none was)."""
        k = self.appended
        return int(self._offsets[k - 1] + self._sizes[k - 1]) if k else 0

    @property
    def msg_ids(self) -> list[str]:
        if self._ids is None:
            self._ids = self._make_ids() if self.appended else []
        return self._ids

    def _all(self) -> list["PutMessageResult"]:
        if self._items is None:
            k, st, now = self.appended, self._ok_status, self.store_timestamp
            items = list(map(PutMessageResult, repeat(st, k), map(
                AppendMessageResult, repeat(AppendMessageStatus.PUT_OK, k), self.wrote_offsets,
                self._sizes[:k].tolist(), self.msg_ids, repeat(now, k), self.queue_offsets)))
            items.extend(PutMessageResult(self.failed_status, None, self.reason) for _ in range(self._n - k))
            self._items = items
        return self._items

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if self._items is not None or not isinstance(i, int):
            return self._all()[i]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("put result index out of range")
        if i >= self.appended:
            return PutMessageResult(self.failed_status, None, self.reason)
        return PutMessageResult(self._ok_status, AppendMessageResult(
            AppendMessageStatus.PUT_OK, int(self._offsets[i]), int(self._sizes[i]), self.msg_ids[i],
            self.store_timestamp, int(self._queue_offsets[i])))

    def __iter__(self):
        return iter(self._all())

    def __eq__(self, other) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    def __repr__(self) -> str:
        return f"PutMessageResults({self._n} messages, {self.appended} appended, {self.status.value})"


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
