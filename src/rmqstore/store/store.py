"""MessageStore: the store facade (RocketMQ's DefaultMessageStore API), assembled from small parts.

    with MessageStore.open("/data/store", StoreConfig.load("broker.conf")) as store:
        r = store.put_message(Message("TopicA", b"hello", properties={"TAGS": "TagA", "KEYS": "k1"}))
        store.wait_dispatched()
        got = store.get_message("group", "TopicA", 0, 0, 32)

Opening takes the store's lock (a second process fails at once), recovers (see recovery), re-dispatches
what the queues and index lack, and starts the dispatcher and the flush services.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Protocol, Sequence

from . import codec
from .checkpoint import StoreCheckpoint
from .commit_log import AppendFailed, CommitLog
from .config import StoreConfig
from .consume_queue import UNIT, ConsumeQueue, ConsumeQueueTable
from .dispatch import Dispatcher
from ..errors import StoreClosedError
from .failure import FailureChannel, FailureKind
from .index_file import IndexService
from .lock import AbortFile, StoreLock
from .message_batch import MessageBatch
from .message import GetMessageResult, GetMessageStatus, Message, MessageExt, PutMessageResult, PutMessageStatus
from .recovery import RecoveryReport, recover_store
from ..messaging.schedule import rewrite_delayed

log = logging.getLogger(__name__)

try:
    TOTAL_PHYSICAL_MEMORY_SIZE = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
except (ValueError, OSError, AttributeError):  # pragma: no cover
    TOTAL_PHYSICAL_MEMORY_SIZE = 8 << 30


class MessageFilter(Protocol):
    """RocketMQ's MessageFilter: first by the consume queue's tags code, then by the message itself."""

    def is_matched_by_consume_queue(self, tags_code: int | None) -> bool: ...

    def is_matched_by_commit_log(self, msg: MessageExt) -> bool: ...


@dataclass
class QueryMessageResult:
    messages: list[MessageExt] = field(default_factory=list)
    index_last_update_timestamp: int = 0
    index_last_update_phyoffset: int = 0


class MessageStore:
    def __init__(self, path: str | Path, config: StoreConfig | None = None):
        self.path = Path(path)
        self.config = config or StoreConfig()
        self._closed = True
        self.lock = StoreLock(self.path)
        self.abort_file = AbortFile(self.path)
        self.checkpoint: StoreCheckpoint | None = None
        self.commit_log = CommitLog(self.path, self.config)
        self.consume_queues = ConsumeQueueTable(self.path, self.config.mapped_file_size_consume_queue)
        self.index_service = IndexService(self.path, self.config)
        # one failure channel every service reports to (failure.py): read by wait_dispatched, close, check
        self.failures = FailureChannel()
        self.dispatcher = Dispatcher(self.commit_log, self.consume_queues, self.index_service, self.config,
                                     self.failures)
        self.services: list = []          # flush / clean services: start() and shutdown()
        self.recovery_report: RecoveryReport | None = None
        self.running_flags = RunningFlags(self.failures)
        self.max_delay_level = len(self.config.delay_levels_ms())
        self.schedule_service = None      # schedule.ScheduleMessageService, started with the services
        self.group_commit = None          # flush.GroupCommitService under SYNC_FLUSH, once started

    # --- lifecycle ------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path, config: StoreConfig | None = None, *, start_services: bool = True) -> "MessageStore":
        store = cls(path, config)
        store.start(start_services)
        return store

    def start(self, start_services: bool = True) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self.lock.acquire()
        try:
            self._load_and_recover()
            self.abort_file.create(self.dispatcher.reput_from_offset)
            self.dispatcher.on_dispatched = self.abort_file.note_dispatched
            self._closed = False
            if start_services:
                self.dispatcher.start()
                from .flush import install_flush_services
                install_flush_services(self)
                from .cleanup import install_cleanup_services
                install_cleanup_services(self)
                for s in self.services:
                    s.start()
                from ..messaging.schedule import ScheduleMessageService
                self.schedule_service = ScheduleMessageService(self)
                self.schedule_service.start()
        except BaseException:
            self._release_files()
            self.abort_file.close()
            self.lock.release()
            raise

    def _load_and_recover(self) -> None:
        """Load every file and recover (recovery.recover_store); the report is kept in recovery_report."""
        self.recovery_report = recover_store(self)

    def close(self) -> None:
        """Clean shutdown: stop services, dispatch and flush everything, remove the abort file.

        Returns promptly when dispatching cannot progress (its reason is logged and on self.failures);
        the abort file then stays, so that the next open recovers and re-dispatches."""
        if self._closed:
            return
        self._closed = True
        self.group_commit = None
        if self.schedule_service is not None:
            self.schedule_service.shutdown()
            self.schedule_service = None
        drained = self.dispatcher.shutdown(drain=True)
        if not drained:
            log.error("%s: closing with commitlog offsets %d..%d not dispatched: %s", self.path,
                      self.dispatcher.reput_from_offset, self.commit_log.get_max_offset(),
                      self.dispatcher.stuck_reason() or "dispatch did not finish in time")
        for s in reversed(self.services):
            s.shutdown()
        flush_failed = [s.failed for s in self.services if getattr(s, "failed", None)]
        self.services.clear()
        ok = self.running_flags.write_error is None     # after a failed write the next open must recover
        if flush_failed:   # a failed msync: a new one would "succeed" over lost data (see flush): claim nothing
            log.error("%s: %s: no final flush, the abort file stays", self.path, flush_failed[0])
        else:
            try:
                self.flush_all()
            except OSError as e:
                ok = False
                self.abort_file.distrust()
                log.error("%s: final flush failed (%s): keeping the abort file so the next open recovers",
                          self.path, e)
        self._release_files()
        if ok and drained and self.dispatcher.stuck_reason() is None:
            self.abort_file.remove()
        else:
            self.abort_file.close()
        self.lock.release()

    shutdown = close

    def _release_files(self) -> None:
        self.index_service.shutdown()
        self.consume_queues.shutdown()
        self.commit_log.shutdown()
        if self.checkpoint is not None:
            self.checkpoint.shutdown()

    def flush_all(self) -> None:
        """Flush commitlog, consume queues and index, then record it in the checkpoint."""
        cl = self.commit_log
        cl.queue.commit()
        phys_ts = cl.queue.store_timestamp
        cl.queue.flush()
        logics_ts = self.dispatcher.last_dispatched_timestamp
        self.consume_queues.flush()
        index_ts = self.index_service.flush()
        ck = self.checkpoint
        if phys_ts:
            ck.physic_msg_timestamp = phys_ts
        if logics_ts:
            ck.logics_msg_timestamp = logics_ts
        if index_ts:
            ck.index_msg_timestamp = index_ts
        ck.flush()

    def __enter__(self) -> "MessageStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.path} is closed")

    # --- put ------------------------------------------------------------------------------------
    def put_message(self, msg: Message) -> PutMessageResult:
        """Append one message (put_messages for one, without the batch's costs). The message is validated
        first (validation.py: refused with MESSAGE_ILLEGAL / PROPERTIES_SIZE_EXCEEDED and a reason); PUT_OK
        means written at the answered offset and dispatched at the answered queue offset; a failed write
        answers SERVICE_NOT_AVAILABLE (not stored) and the store refuses puts from then on."""
        if self._closed or not self.running_flags.writeable:
            return self.put_messages([msg])[0]      # refused there, with the reason logged
        p = msg.properties
        if p and codec.PROPERTY_DELAY in p:
            msg = rewrite_delayed([msg], self.max_delay_level)[0]
        gc = self.group_commit
        if gc is not None:      # SYNC_FLUSH: appended and flushed by the flusher with others' (flush.put)
            result = gc.put(msg)
            if result is not None:
                return result
        try:
            result = self.commit_log.put_message(msg)
        except OSError as e:
            self.record_write_failure(e)
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, None, f"write failed: {e}")
        self.dispatcher.wakeup()
        return result

    def put_messages(self, msgs: Iterable[Message] | MessageBatch, *,
                     delay_rewrite: bool = True) -> Sequence[PutMessageResult]:
        """Append messages, or a MessageBatch (columns: the fastest way in); with delay_rewrite (the
        default), messages with a DELAY property go to SCHEDULE_TOPIC_XXXX as CommitLog.putMessage does
        (see schedule.rewrite_delayed). One result per message, each true for that message: a refused
        one does not stop the others, and a write that fails part way answers PUT_OK for exactly the
        records written before it (they are stored and dispatched) and SERVICE_NOT_AVAILABLE for the rest."""
        if isinstance(msgs, MessageBatch):
            if delay_rewrite and codec.PROPERTY_DELAY in msgs.properties:
                msgs = msgs.to_messages()
        else:
            msgs = list(msgs)
        if self._closed or not self.running_flags.writeable:
            why = "the store is closed" if self._closed else f"puts are refused: {self.running_flags.why()}"
            if not self._closed:
                log.warning("%s: put refused: %s", self.path, self.running_flags.why())
            return [PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, None, why) for _ in range(len(msgs))]
        if delay_rewrite and not isinstance(msgs, MessageBatch):
            msgs = rewrite_delayed(msgs, self.max_delay_level)
        try:
            results = self.commit_log.put_messages(msgs)
        except AppendFailed as e:
            self.record_write_failure(e.error)
            self.dispatcher.wakeup()        # the records written before the failure are dispatched
            return e.results
        except OSError as e:
            self.record_write_failure(e)
            return [PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, None, f"write failed: {e}")
                    for _ in range(len(msgs))]
        self.dispatcher.wakeup()
        return results

    def record_write_failure(self, e: OSError) -> None:
        """A commitlog write failed (a full disk): puts are refused from now on (RunningFlags)."""
        self.running_flags.write_failed(str(e))
        log.error("%s: write failed: %s", self.path, e)

    # --- get ------------------------------------------------------------------------------------
    def get_message(self, group: str, topic: str, queue_id: int, offset: int, max_msg_nums: int,
                    message_filter: MessageFilter | None = None) -> GetMessageResult:
        """Up to max_msg_nums messages of a queue from a logical offset, as RocketMQ's getMessage."""
        self._check_open()
        cq = self.consume_queues.find(topic, queue_id)
        if cq is None:
            return GetMessageResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        min_off, max_off = cq.get_min_offset_in_queue(), cq.get_max_offset_in_queue()
        if max_off == 0:
            return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0, min_off, max_off)
        if offset < min_off:
            return GetMessageResult(GetMessageStatus.OFFSET_TOO_SMALL, min_off, min_off, max_off)
        if offset == max_off:
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, offset, min_off, max_off)
        if offset > max_off:
            nxt = min_off if min_off == 0 else max_off
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_BADLY, nxt, min_off, max_off)
        got = cq.get_index_buffer(offset)
        if got is None:
            return GetMessageResult(GetMessageStatus.OFFSET_FOUND_NULL, cq.roll_next_file(offset), min_off, max_off)
        return self._read_units(cq, got[0], offset, max_msg_nums, message_filter, min_off, max_off)

    def _read_units(self, cq: ConsumeQueue, units: bytes, offset: int, max_msg_nums: int,
                    message_filter: MessageFilter | None, min_off: int, max_off: int) -> GetMessageResult:
        cfg = self.config
        result = GetMessageResult(GetMessageStatus.NO_MATCHED_MESSAGE, offset, min_off, max_off)
        max_py = self.commit_log.get_max_offset()
        memory = TOTAL_PHYSICAL_MEMORY_SIZE * cfg.access_message_in_memory_max_ratio // 100
        max_filter = max(16000, max_msg_nums * UNIT)
        next_phy_file_start = None
        max_phy_pulling = 0
        i = 0
        n = len(units)
        unpack = codec.CQ_UNIT.unpack_from
        while i < n and i < max_filter:
            off_py, size_py, tags = unpack(units, i)
            max_phy_pulling = off_py
            if next_phy_file_start is not None and off_py < next_phy_file_start:
                i += UNIT
                continue
            if size_py == codec.CQ_BLANK_SIZE and off_py == 0:
                # a filler unit: its record was lost (a skipped damaged range, a missing file): removed
                if result.buffer_total_size == 0:
                    result.status = GetMessageStatus.MESSAGE_WAS_REMOVING
                i += UNIT
                continue
            in_disk = max_py - off_py > memory
            if self._batch_full(size_py, max_msg_nums, result, in_disk):
                break
            if message_filter is not None and not message_filter.is_matched_by_consume_queue(tags):
                i += UNIT
                continue
            msg = self._message_at(off_py, size_py, cq, offset + i // UNIT)
            if msg is None and off_py + size_py > max_py:
                log.warning("%s: unit %d points past the commitlog's end (%d + %d > %d)", cq.queue.store_path,
                            offset + i // UNIT, off_py, size_py, max_py)
            if msg is None:
                if result.buffer_total_size == 0:
                    result.status = GetMessageStatus.MESSAGE_WAS_REMOVING
                if off_py < self.commit_log.get_min_offset():
                    # its file was cleaned: skip the units pointing into the same file (RocketMQ)
                    next_phy_file_start = self.commit_log.roll_next_file(off_py)
                i += UNIT   # a damaged unit: skip it alone, the ones after it may be good
                continue
            if message_filter is not None and not message_filter.is_matched_by_commit_log(msg):
                if result.buffer_total_size == 0:
                    result.status = GetMessageStatus.NO_MATCHED_MESSAGE
                i += UNIT
                continue
            result.messages.append(msg)
            result.buffer_total_size += size_py
            result.status = GetMessageStatus.FOUND
            next_phy_file_start = None
            i += UNIT
        result.next_begin_offset = offset + i // UNIT
        result.suggest_pulling_from_slave = max_py - max_phy_pulling > memory
        return result

    def _batch_full(self, size_py: int, max_msg_nums: int, r: GetMessageResult, in_disk: bool) -> bool:
        total, count = r.buffer_total_size, len(r.messages)
        if total == 0 or count == 0:
            return False
        if max_msg_nums <= count:
            return True
        cfg = self.config
        if in_disk:
            return (total + size_py > cfg.max_transfer_bytes_on_message_in_disk
                    or count > cfg.max_transfer_count_on_message_in_disk - 1)
        return (total + size_py > cfg.max_transfer_bytes_on_message_in_memory
                or count > cfg.max_transfer_count_on_message_in_memory - 1)

    def _message_at(self, off: int, size: int, cq: ConsumeQueue | None = None, logical: int | None = None) -> MessageExt | None:
        if self.dispatcher.skip_ranges and self.dispatcher.is_skipped(off):
            return None     # in a damaged range recovery skipped (recovery.py): not a message to answer
        raw = self.commit_log.get_message(off, size)
        if raw is None:
            return None
        where = f" (unit {logical} of {cq.topic}/{cq.queue_id})" if cq is not None else ""
        try:
            rec = codec.decode_record(raw, 0, len(raw), check_crc=True)   # a damaged body is not an answer
        except codec.RecordError as e:
            log.warning("%s: commitlog offset %d%s holds no valid message: %s",
                        self.commit_log.queue.store_path, off, where, e.reason)
            return None
        if cq is not None:
            # the unit must name this record: never answer FOUND with another queue's or offset's message
            wrong = unit_record_mismatch(rec, off, size, cq.topic, cq.queue_id, logical)
            if wrong is not None:
                log.warning("%s: commitlog offset %d%s: %s; unit skipped (rmqstore check --repair rebuilds the "
                            "queue)", self.commit_log.queue.store_path, off, where, wrong)
                return None
        return MessageExt.from_record(rec)

    # --- offsets and lookups --------------------------------------------------------------------
    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queues.find(topic, queue_id)
        return cq.get_max_offset_in_queue() if cq else 0

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queues.find(topic, queue_id)
        return cq.get_min_offset_in_queue() if cq else -1

    def get_message_total_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queues.find(topic, queue_id)
        return cq.get_message_total_in_queue() if cq else -1

    def get_commit_log_offset_in_queue(self, topic: str, queue_id: int, consume_queue_offset: int) -> int:
        cq = self.consume_queues.find(topic, queue_id)
        unit = cq.get_unit(consume_queue_offset) if cq else None
        return unit[0] if unit else 0

    def get_message_store_timestamp(self, topic: str, queue_id: int, consume_queue_offset: int) -> int:
        cq = self.consume_queues.find(topic, queue_id)
        unit = cq.get_unit(consume_queue_offset) if cq else None
        return self._store_time(unit[0], unit[1]) if unit else -1

    def get_earliest_message_time(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queues.find(topic, queue_id)
        if cq is None:
            return -1
        return self.get_message_store_timestamp(topic, queue_id, cq.get_min_offset_in_queue())

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp: int) -> int:
        cq = self.consume_queues.find(topic, queue_id)
        if cq is None:
            return 0
        return cq.get_offset_in_queue_by_time(timestamp, self._store_time, max(self.commit_log.get_min_offset(), 0))

    def _store_time(self, off: int, size: int) -> int:
        """RocketMQ's pickupStoreTimestamp: -1 when the message is gone."""
        raw = self.commit_log.get_message(off, min(size, codec.HEADER_STRUCTS[3].size))
        if raw is None or len(raw) < codec.HEADER_V4.size:
            return -1
        sys_flag = codec._I.unpack_from(raw, codec.POS_SYSFLAG)[0]
        return codec.struct.unpack_from(">q", raw, codec.store_timestamp_pos(sys_flag))[0]

    def look_message_by_offset(self, commit_log_offset: int, size: int | None = None) -> MessageExt | None:
        """The message at a commitlog offset (RocketMQ's lookMessageByOffset), or None. Besides its own checks
        (sizes, body CRC), a dispatched message must be where its consume queue says: its header fields are
        not covered by the CRC, and a record whose QUEUEOFFSET, topic or queue id was damaged is not answered
        as the message it no longer describes."""
        if self.dispatcher.skip_ranges and self.dispatcher.is_skipped(commit_log_offset):
            return None     # in a damaged range recovery skipped
        msg = self.commit_log.look_message_by_offset(commit_log_offset, size)
        if msg is None or commit_log_offset >= self.dispatcher.reput_from_offset:
            return msg      # not dispatched yet: no unit to agree with
        if not codec.is_dispatched(msg.sys_flag):
            return msg      # never in a consume queue
        cq = self.consume_queues.find(msg.topic, msg.queue_id)
        unit = cq.get_unit(msg.queue_offset) if cq is not None and 0 <= msg.queue_offset < 1 << 62 else None
        if cq is not None and msg.queue_offset < cq.get_min_offset_in_queue():
            return msg      # its unit was cleaned with its consume queue file: nothing to agree with
        if unit is None or unit[0] != commit_log_offset:
            log.warning("%s: commitlog offset %d: the record names %s/%d queue offset %d, whose unit %s: a "
                        "damaged header; not answered", self.commit_log.queue.store_path, commit_log_offset,
                        msg.topic, msg.queue_id, msg.queue_offset,
                        "does not exist" if unit is None else f"points at {unit[0]}")
            return None
        return msg

    def view_message_by_id(self, msg_id: str) -> MessageExt | None:
        _, offset = codec.decode_message_id(msg_id)
        return self.look_message_by_offset(offset)

    def get_min_phy_offset(self) -> int:
        return self.commit_log.get_min_offset()

    def get_max_phy_offset(self) -> int:
        return self.commit_log.get_max_offset()

    def query_message(self, topic: str, key: str, max_num: int, begin: int = 0, end: int = 2 ** 63 - 1) -> QueryMessageResult:
        """RocketMQ's raw queryMessage: every message whose index entry matches the key's hash in the time
        range (the store does not re-check topic or key; see find_messages_by_key)."""
        offsets, last_ts, last_phy = self.index_service.query_offset(topic, key, max_num, begin, end)
        result = QueryMessageResult(index_last_update_timestamp=last_ts, index_last_update_phyoffset=last_phy)
        for off in sorted(offsets):
            msg = self.look_message_by_offset(off)
            if msg is not None:
                result.messages.append(msg)
        return result

    def find_messages_by_key(self, topic: str, key: str, max_num: int = 64, begin: int = 0,
                             end: int = 2 ** 63 - 1) -> list[MessageExt]:
        """The user-facing query: only messages of this topic that really carry the key (in KEYS or as
        UNIQ_KEY), each once. Fixes RocketMQ's #3613 / #8438 (hash collisions, duplicates)."""
        seen: set[int] = set()
        out = []
        for msg in self.query_message(topic, key, max_num, begin, end).messages:
            if msg.commit_log_offset in seen or msg.topic != topic:
                continue
            if key in msg.keys or msg.properties.get(codec.PROPERTY_UNIQ_KEY) == key:
                seen.add(msg.commit_log_offset)
                out.append(msg)
        return out

    def dispatch_behind_bytes(self) -> int:
        return self.dispatcher.dispatch_behind_bytes()

    def wait_dispatched(self, timeout: float = 10.0, *, raise_on_failure: bool = False) -> bool:
        """True once everything written is in the consume queues and the index. False at the timeout, or
        at once when dispatching cannot progress; with raise_on_failure that case raises a
        StoreDispatchError with the reason instead (also on self.failures)."""
        ok = self.dispatcher.wait_dispatched(timeout=timeout)
        why = None if ok else self.dispatcher.stuck_reason()
        if why is not None and raise_on_failure:
            raise StoreDispatchError(f"{self.path}: dispatch stopped at offset "
                                     f"{self.dispatcher.reput_from_offset}: {why}")
        return ok

    def topics(self) -> dict[str, list[int]]:
        return {t: sorted(qs) for t, qs in sorted(self.consume_queues.table.items())}

    def check(self, repair: bool = False):
        """A full consistency check of this open store (rmqstore.store.check.check_store: every record with its
        CRC, every consume queue unit against its record, index entries, checkpoint, config files), after
        the dispatcher caught up. Returns a check.CheckReport (`ok`, `problems`, `summary()`).

        repair=True, on the open store: consume queues with a damaged unit are cut there and rebuilt from
        the commitlog by the dispatcher, malformed config files are quarantined (FILE.corrupt-<time>, the
        .bak restored); then the check runs again and its report is returned (`repaired` says what was
        done). Index damage is repaired at the next open, or by `rmqstore check --repair` on the closed
        store. Nothing in the commitlog is ever deleted."""
        from .check import _repair_config, check_store
        self._check_open()
        self.wait_dispatched()
        report = check_store(self.path, self.config, live=True)
        if not repair or report.ok:
            return report
        done: list[str] = []
        _repair_config(report.bad_config, done)
        done.extend(self._repair_queues())
        after = check_store(self.path, self.config, live=True)
        after.repaired = done
        return after

    def _repair_queues(self) -> list[str]:
        """Cut every consume queue at its first damaged unit (all units checked) and re-dispatch from there."""
        from .recovery import _commitlog_sources, _last_unit, _repair_queue, check_queue
        cl = self.commit_log
        done, starts = [], []
        rep = RecoveryReport(clean_shutdown=True)
        with self.dispatcher._lock:          # the dispatcher thread waits: no unit is appended meanwhile
            sources = _commitlog_sources(cl)
            cl_min = max(cl.get_min_offset(), 0)
            for cq in list(self.consume_queues):
                found = check_queue(cq, sources, cl_min)
                if found is None or not _repair_queue(cq, cl, cl.get_max_offset(), found[0], found[1], rep):
                    continue
                last = _last_unit(cq)
                cq.max_physic_offset = last[0] + last[1] if last is not None else -1
                starts.append(cq.max_physic_offset if cq.max_physic_offset >= 0 else cl_min)
            if starts:
                self.dispatcher.reput_from_offset = min(starts + [self.dispatcher.reput_from_offset])
        if starts:
            self.dispatcher.do_reput()
            self.wait_dispatched()
        done.extend(str(d) for d in rep.dropped)
        return done


def unit_record_mismatch(rec: codec.DecodedRecord, off: int, size: int, topic: str, queue_id: int,
                         logical: int | None) -> str | None:
    """What a consume queue unit (offset, size, logical offset of topic/queue_id) and the record it points
    at disagree on, or None: the read path's cross-check (the fields are in the decoded header)."""
    if rec.physical_offset != off:
        return f"the record says it is at offset {rec.physical_offset}"
    if rec.store_size != size:
        return f"the record has {rec.store_size} bytes, the unit says {size}"
    if rec.topic != topic or rec.queue_id != queue_id:
        return f"the record belongs to {rec.topic}/{rec.queue_id}"
    if logical is not None and rec.queue_offset != logical:
        return f"the record has queue offset {rec.queue_offset}"
    return None


class StoreDispatchError(RuntimeError):
    """wait_dispatched(raise_on_failure=True): dispatching cannot progress (the message says why)."""


class RunningFlags:
    """RocketMQ's RunningFlags: why the store refuses writes (disk full, a failed write). A failed write is
    also reported to the failure channel."""

    def __init__(self, failures: FailureChannel | None = None):
        self.failures = failures
        self._lock = threading.Lock()
        self.disk_full = False
        self.disk_full_reason: str | None = None    # set with disk_full by the cleanup service
        self.write_error: str | None = None

    @property
    def writeable(self) -> bool:
        return not self.disk_full and self.write_error is None

    def write_failed(self, why: str, kind: FailureKind | str = FailureKind.WRITE) -> None:
        """Refuse puts from now on, for this reason (a WRITE or FLUSH failure on the failure channel)."""
        with self._lock:
            self.write_error = why
        if self.failures is not None:
            self.failures.raise_condition("store.write", FailureKind(kind), why)

    def why(self) -> str:
        if self.disk_full:
            return self.disk_full_reason or "disk full"
        return self.write_error or "ok"
