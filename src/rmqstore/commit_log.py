"""CommitLog: every message of every topic, appended to one queue of mapped files.

Record layout: see codec. The put path assigns, under one lock, the physical offset, the queue offset of
(topic, queueId) and the store timestamp; everything that does not depend on them (properties, topic,
CRC, hosts) is encoded before the lock is taken. A record that does not fit the current file leaves an
END_OF_FILE blank record there and goes to the next file.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

from . import codec
from .config import StoreConfig
from .errors import CorruptStoreError
from .mapped_file import MappedFile, MappedFileQueue
from .message import (AppendMessageResult, AppendMessageStatus, Message, MessageExt, PutMessageResult,
                      PutMessageStatus)

log = logging.getLogger(__name__)

_HS = codec.HEADER_STRUCTS
_MAGIC = codec.MESSAGE_MAGIC_CODE
_TRAN_MASK = codec.TRANSACTION_TYPE_MASK
_PREPARED = codec.TRANSACTION_PREPARED_TYPE
_ROLLBACK = codec.TRANSACTION_ROLLBACK_TYPE
_crc = codec.body_crc
_parse_host = codec.parse_host


class _Encoded:
    """A message with everything encoded that does not depend on its place in the log."""
    __slots__ = ("msg", "key", "tran", "sys_flag", "hs", "crc", "tail", "size", "born", "store", "error")

    def __init__(self, msg: Message, default_store_host: str, max_message_size: int):
        self.msg = msg
        self.error = None
        try:
            topic = msg.topic.encode("utf-8")
            props = codec.properties_to_string(msg.properties).encode("utf-8") if msg.properties else b""
            born_addr, born_port, born_v6 = _parse_host(msg.born_host)
            store_addr, store_port, store_v6 = _parse_host(msg.store_host or default_store_host)
        except (ValueError, TypeError, AttributeError) as e:
            log.warning("illegal message: %s", e)
            self.error = PutMessageStatus.MESSAGE_ILLEGAL
            return
        if len(topic) > codec.MAX_TOPIC_LENGTH or not topic:
            log.warning("topic %r is %d bytes, RocketMQ allows 1 to 127", msg.topic[:40], len(topic))
            self.error = PutMessageStatus.MESSAGE_ILLEGAL
            return
        if len(props) > codec.MAX_PROPERTIES_LENGTH:
            log.warning("properties of %d bytes exceed %d", len(props), codec.MAX_PROPERTIES_LENGTH)
            self.error = PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
            return
        sys_flag = (msg.sys_flag & ~0x30) | (0x10 if born_v6 else 0) | (0x20 if store_v6 else 0)
        self.sys_flag = sys_flag
        self.hs = _HS[sys_flag >> 4 & 3]
        body = msg.body if msg.body is not None else b""
        self.crc = _crc(body)
        self.tail = codec.encode_tail(topic, props)
        self.size = self.hs.size + len(body) + len(self.tail)
        if self.size > max_message_size:
            log.warning("message of %d bytes (body %d) exceeds maxMessageSize %d", self.size, len(body),
                        max_message_size)
            self.error = PutMessageStatus.MESSAGE_ILLEGAL
            return
        self.key = f"{msg.topic}-{msg.queue_id}"
        self.tran = sys_flag & _TRAN_MASK
        self.born = (born_addr, born_port)
        self.store = (store_addr, store_port)


class CommitLog:
    """The commitlog of one store directory."""

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
        # Called with (next_offset, results) after each append, outside the lock: flush policy hook.
        self.on_appended: Callable[[int], bool] | None = None

    def load(self) -> None:
        self.queue.load()

    # --- put path -------------------------------------------------------------------------------
    def put_message(self, msg: Message) -> PutMessageResult:
        return self.put_messages([msg])[0]

    def put_messages(self, msgs: Iterable[Message]) -> list[PutMessageResult]:
        """Append messages in order, under one lock hold; one result per message."""
        store_host, max_size = self.default_store_host, self.config.max_message_size
        encoded = [_Encoded(m, store_host, max_size) for m in msgs]
        results: list[PutMessageResult | None] = [None] * len(encoded)
        with self.put_lock:
            now = int(time.time() * 1000)
            self.begin_time_in_lock = now
            try:
                self._append_locked(encoded, results, now)
            finally:
                self.begin_time_in_lock = 0
        if self.on_appended is not None and any(r.ok for r in results):
            if not self.on_appended(self.queue.get_max_wrote_position()):
                for i, r in enumerate(results):
                    if r.ok:
                        results[i] = PutMessageResult(PutMessageStatus.FLUSH_DISK_TIMEOUT, r.append_result)
        return results  # type: ignore[return-value]

    def _append_locked(self, encoded: list[_Encoded], results: list, now: int) -> None:
        table = self.topic_queue_table
        mf = self.queue.get_last_mapped_file(0)
        if mf is None:
            for i in range(len(encoded)):
                results[i] = PutMessageResult(PutMessageStatus.CREATE_MAPEDFILE_FAILED)
            return
        parts: list[bytes] = []
        start = pos = mf.wrote_position
        base = mf.file_from_offset
        fsize = mf.file_size
        for i, e in enumerate(encoded):
            if e.error is not None:
                results[i] = PutMessageResult(e.error)
                continue
            size = e.size
            if pos + size + codec.END_FILE_MIN_BLANK_LENGTH > fsize:
                # END_OF_FILE: a blank record fills the rest, the message goes to the next file.
                parts.append(codec.encode_blank(fsize - pos))
                pos = fsize
                mf.write_at(start, b"".join(parts))
                mf.wrote_position = fsize  # the blank record spans the rest of the file
                parts = []
                mf = self.queue.get_last_mapped_file(0)
                if mf is None or size + codec.END_FILE_MIN_BLANK_LENGTH > mf.file_size:
                    for j in range(i, len(encoded)):
                        results[j] = PutMessageResult(PutMessageStatus.CREATE_MAPEDFILE_FAILED if mf is None
                                                      else PutMessageStatus.MESSAGE_ILLEGAL)
                    return
                start = pos = mf.wrote_position
                base = mf.file_from_offset
                fsize = mf.file_size
            msg = e.msg
            phys = base + pos
            key = e.key
            if e.tran == _PREPARED or e.tran == _ROLLBACK:
                qoff = 0
            else:
                qoff = table.get(key, 0)
                table[key] = qoff + 1
            body = msg.body if msg.body is not None else b""
            parts.append(e.hs.pack(size, _MAGIC, e.crc, msg.queue_id, msg.flag, qoff, phys, e.sys_flag,
                                   msg.born_timestamp, e.born[0], e.born[1], now, e.store[0], e.store[1],
                                   msg.reconsume_times, msg.prepared_transaction_offset, len(body)))
            parts.append(body)
            parts.append(e.tail)
            pos += size
            msg_id = (e.store[0] + codec.struct.pack(">iq", e.store[1], phys)).hex().upper()
            results[i] = PutMessageResult(PutMessageStatus.PUT_OK,
                                          AppendMessageResult(AppendMessageStatus.PUT_OK, phys, size, msg_id, now, qoff))
        if parts:
            mf.write_at(start, b"".join(parts))
        mf.store_timestamp = now
        self.queue.store_timestamp = now

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
            return MessageExt.from_record(codec.decode_record(raw, 0, len(raw), read_body=read_body))
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
