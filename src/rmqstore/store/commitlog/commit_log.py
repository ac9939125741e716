"""CommitLog: every message of every topic, appended to one queue of mapped files.

Record layout: see codec. The put path assigns, under one lock, the physical offset, the queue offset of
(topic, queueId) and the store timestamp; everything that does not depend on them (properties, topic,
CRC, hosts) is encoded before the lock is taken. A record that does not fit the current file leaves an
END_OF_FILE blank record there and goes to the next file.

Three ways in, one byte layout (tests/store/test_put_path.py holds them to RocketMQ's files and to each other):

- put_message: one message, encoded by put_encoder.MessageEncoder (topic, hosts and "topic-queueId" keys
  come from caches), packed with the header Struct and copied into the mapping where the file is allocated
  ahead (_write_single);
- put_messages, general path (_append_locked): any batch, message by message, one write per file;
- put_messages, columnar path (message_batch.encode_columns / columnar_append): a batch of at least COLUMNAR_MIN valid
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

from ..format import codec
from ..format import scanner
from ..conf.config import StoreConfig
from ...errors import CorruptStoreError
from ..files.mapped_file import MappedFile, MappedFileQueue
from ..format.message_batch import COLUMNAR_MIN, MessageBatch, NotColumnar
from .columnar_append import put_columnar, undo_write, write_or_undo
from .put_encoder import MessageEncoder, log_refused, refuse
from ..format.message import AppendedResult, Message, MessageExt, PutMessageResult, PutMessageResults, PutMessageStatus

log = logging.getLogger(__name__)

_MAGIC = codec.MESSAGE_MAGIC_CODE
_BLANK_MIN = codec.END_FILE_MIN_BLANK_LENGTH
_PUT_OK = PutMessageStatus.PUT_OK
_ILLEGAL = PutMessageStatus.MESSAGE_ILLEGAL
_CREATE_FAILED = PutMessageStatus.CREATE_MAPEDFILE_FAILED
_FLUSH_TIMEOUT = PutMessageStatus.FLUSH_DISK_TIMEOUT
_NOT_AVAILABLE = PutMessageStatus.SERVICE_NOT_AVAILABLE
RESERVE_AHEAD = 4 << 20     # bytes of the last commitlog file allocated ahead of single puts (_write_single)

class AppendFailed(OSError):
    """A write of the put path failed (ENOSPC, EIO) after part of a batch was stored: `results` says, per
    message, what is true (PUT_OK for the records written before the failure, a failure status for the
    rest). Callers record the failure (the store refuses puts) and answer `results`."""

    def __init__(self, error: OSError, results):
        super().__init__(error.errno, error.strerror or str(error))
        self.error = error
        self.results = results


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
        self.encoder = MessageEncoder(config, self.file_size, config.store_host)
        self.encode = self.encoder.encode      # what append_encoded / put_encoded take (put_encoder.py)
        # Called with the max wrote offset after each append, outside the lock: the flush policy hook.
        # False turns the appended messages' results into FLUSH_DISK_TIMEOUT.
        self.on_appended: Callable[[int], bool] | None = None
        # start offset -> DispatchBatch of records the columnar path wrote, for the dispatcher (None: off)
        self.dispatch_hints: dict[int, codec.DispatchBatch] | None = None
        # (file, its mapping, end): [.., end) of the last file is allocated on disk (posix_fallocate), so the
        # single-put path copies records into the mapping there (_write_single)
        self._reserved: tuple = (None, None, 0)
        self._map_single_puts = not config.transient_store_pool_enable

    def load(self) -> None:
        self.queue.load()

    # --- put path -------------------------------------------------------------------------------
    def put_message(self, msg: Message, wait: bool = True) -> PutMessageResult:
        """Append one message: encoded by _encode (which refuses what must be refused), placed under the lock.
        wait=False: the flush policy hook (on_appended) is not called (the caller flushes)."""
        e = self.encoder.encode(msg)
        if type(e) is not tuple:
            log_refused((e,))
            return e
        return self.put_encoded(e, wait)

    def put_encoded(self, e: tuple, wait: bool = True) -> PutMessageResult:
        """put_message of a message encode() took (a tuple): placed under the lock, written, answered."""
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
                        return PutMessageResult(_CREATE_FAILED, None, q.create_failure())
                pos = mf.wrote_position
                if pos + size + _BLANK_MIN > mf.file_size:
                    mf = self.roll(mf, pos)
                    if mf is None:
                        return PutMessageResult(_CREATE_FAILED, None, q.create_failure())
                    pos = mf.wrote_position
                phys = mf.file_from_offset + pos
                table = self.topic_queue_table
                qoff = 0 if key is None else table.get(key, 0)
                try:
                    header = hs.pack(size, _MAGIC, crc, queue_id, flag, qoff, phys, sys_flag, born_ts, born_addr,
                                     born_port, now, store_addr, store_port, reconsume, prepared, len(body))
                except struct.error as err:
                    r = refuse(_ILLEGAL, f"a header field is out of range: {err}")
                    log_refused((r,))
                    return r
                data = b"".join((header, body, tail))
                end = pos + size
                r = self._reserved
                if r[0] is mf and end <= r[2]:
                    r[1][pos:end] = data        # a memcpy into allocated blocks (_write_single)
                    mf.wrote_position = end
                else:
                    self._write_single(mf, pos, data)
                if key is not None:
                    table[key] = qoff + 1
                mf.store_timestamp = now
                q.store_timestamp = now
            finally:
                self.begin_time_in_lock = 0
        result = AppendedResult(_PUT_OK, phys, size, id_prefix, now, qoff)    # msgId made when read
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
                    batch = self.encoder.encode_message_batch(msgs, self.dispatch_hints is not None)
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
                    batch = self.encoder.encode_columnar(msgs, self.dispatch_hints is not None)
                except (NotColumnar, AttributeError, TypeError, ValueError):
                    batch = None    # the general path refuses (or raises for) what it must, message by message
                if batch is not None:
                    results, failed = self._put_columnar(batch)
        if results is None:
            return self.append_encoded([self.encoder.encode(m) for m in msgs], wait)
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
        refused = False
        for i, r in enumerate(results):
            if type(r) is tuple:
                phys, size, qoff, id_prefix = r
                results[i] = AppendedResult(_PUT_OK, phys, size, id_prefix, now, qoff)
            else:
                refused = True
        if refused:
            log_refused(results)
        hook = self.on_appended if wait else None
        if hook is not None and any(r.status is _PUT_OK for r in results):
            if not hook(self.queue.get_max_wrote_position()):
                for i, r in enumerate(results):
                    if r.status is _PUT_OK:
                        results[i] = PutMessageResult(_FLUSH_TIMEOUT, r.append_result)
        if failed is not None:
            raise AppendFailed(failed, results)
        return results

    def _write_single(self, mf: MappedFile, pos: int, data) -> None:
        """The single-put path's write when data is not in the reserved range: reserve the next
        RESERVE_AHEAD bytes of the file (posix_fallocate: allocated blocks, so a store through the mapping
        there cannot meet a full disk, the SIGBUS of mapped_file's docstring) and copy data into the mapping;
        where that cannot be had (a full disk, a write buffer), pwrite as the other paths do, whose ENOSPC is
        an OSError naming the file. Measured: a 290-byte record costs ~0.3 us copied into the mapping, ~1 us
        as a pwrite (syscall), on a ~7 us put."""
        end = pos + len(data)
        if self._map_single_puts:
            r = self._reserved
            start = r[2] if r[0] is mf else 0
            want = min(mf.file_size, max(end, start) + RESERVE_AHEAD)
            try:
                if want > start:
                    mf.reserve(want)        # posix_fallocate of [0, want): cheap where allocated
                self._reserved = r = (mf, mf.mm, want)
            except OSError as e:        # no room for the reservation: the plain write says whether data fits
                log.debug("%s: cannot reserve %d bytes at %d (%s): pwrite", mf.path, want - start, start, e)
                self._reserved = (None, None, 0)
            else:
                if end <= want:
                    r[1][pos:end] = data
                    mf.wrote_position = max(mf.wrote_position, end)
                    return
        try:
            mf.write_at(pos, data)
        except OSError as err:
            undo_write(mf, pos, len(data))
            raise OSError(err.errno, f"{mf.path}: write at {pos} failed: {err.strerror or err}") from err

    # --- appending (under the lock) ----------------------------------------------------------------
    def roll(self, mf: MappedFile, pos: int) -> MappedFile | None:
        """END_OF_FILE: a blank record fills the rest of mf; the next file (None if it cannot be had)."""
        mf.write_at(pos, codec.encode_blank(mf.file_size - pos))
        mf.wrote_position = mf.file_size  # the blank record spans the rest of the file
        return self.queue.get_last_mapped_file(0)

    def _append_locked(self, encoded: list, results: list, now: int) -> OSError | None:
        """The general path: append encoded messages (tuples of _encode; a PutMessageResult for a refused
        one), one write per file. Fills results: the PutMessageResult of a refused (or unwritten) message,
        (offset, size, queue offset, msgId prefix) of an appended one. Queue offsets reach
        topic_queue_table only once their file's write succeeded; a failed write (returned) fails the
        messages of that write and after it, and leaves the queues as if they had not been put.

        One loop on purpose (a measured hot loop: the put_batch row of BENCHMARKS.md, ~3 us a message):
        per-message work stays inline, without a call per message."""
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
                            mf = self.roll(mf, mf.wrote_position)
                    else:
                        if parts:
                            write_or_undo(mf, start, b"".join(parts))
                            parts = []
                            table.update(nxt)
                            self._stamp(mf, now)
                        run = i
                        mf = self.roll(mf, pos)
                    if mf is None:
                        for j in range(i, len(encoded)):
                            e = encoded[j]
                            results[j] = e if type(e) is not tuple else refuse(_CREATE_FAILED,
                                                                                  self.queue.create_failure())
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
                write_or_undo(mf, start, b"".join(parts))
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

    def _put_columnar(self, b):
        """The columnar path's append (columnar_append.put_columnar): (results, the write error or None)."""
        return put_columnar(self, b)

    def _stamp(self, mf: MappedFile, now: int) -> None:
        """Records stamped `now` were written to mf (the checkpoint's physic timestamp follows it)."""
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
            return MessageExt.from_record(scanner.decode_record(raw, 0, len(raw), read_body=read_body,
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
