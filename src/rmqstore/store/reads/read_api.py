"""The store's read API (RocketMQ DefaultMessageStore's getMessage, lookMessageByOffset, queryMessage and the
offset lookups), as a base class: MessageStore has it, and so does the read-only store (store_reader).

It reads self.commit_log, consume_queues, index_service, config and dispatcher (skip_ranges,
reput_from_offset), and calls self._check_open(); it writes nothing.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Protocol

from ..format import codec
from ..format import scanner
from ..consumequeue.consume_queue import UNIT, ConsumeQueue
from ..consumequeue.consume_queue_ext import MAX_ADDR as MAX_EXT_ADDR
from ..format.message import GetMessageResult, GetMessageStatus, MessageExt

log = logging.getLogger("rmqstore.store.store")

try:
    TOTAL_PHYSICAL_MEMORY_SIZE = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
except (ValueError, OSError, AttributeError):  # pragma: no cover
    TOTAL_PHYSICAL_MEMORY_SIZE = 8 << 30


class MessageFilter(Protocol):
    """RocketMQ's MessageFilter: first by the consume queue's tags code, then by the message itself. A filter
    may also have `cq_ext_mask(store_times, bit_maps, has_bit_map) -> bool array`: which units, by their
    consume queue extension units (consume_queue_ext.py), must be read at all (a bit map test, batched)."""

    def is_matched_by_consume_queue(self, tags_code: int | None) -> bool: ...

    def is_matched_by_commit_log(self, msg: MessageExt) -> bool: ...


@dataclass
class QueryMessageResult:
    messages: list[MessageExt] = field(default_factory=list)
    index_last_update_timestamp: int = 0
    index_last_update_phyoffset: int = 0


WRONG_UNIT = object()       # _message_at: the unit names another record than its queue's (a damaged unit)


class StoreReadAPI:
    """MessageStore's read methods (module docstring)."""

    # a running MessageStore's check.unit_repair.UnitRepairService: repairs a unit a read found damaged
    # (the read stops before it meanwhile); None: such a unit is skipped
    unit_repair = None

    # --- get ------------------------------------------------------------------------------------
    def get_message(self, group: str, topic: str, queue_id: int, offset: int, max_msg_nums: int,
                    message_filter: MessageFilter | None = None) -> GetMessageResult:
        """Up to max_msg_nums messages of a queue from a logical offset, as RocketMQ's getMessage."""
        self._check_open()
        cq = self.consume_queues.find(topic, queue_id)
        if cq is None:
            return GetMessageResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        min_off = cq.get_min_offset_in_queue()
        written, max_off = cq.max_offset_for_readers()
        if written <= offset < max_off:     # a unit a repair on the open store is rebuilding: not yet readable
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, offset, min_off, max_off)
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
            if offset < cq.rebuilding_to:       # cut since the max offset was read: rebuilding
                return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, offset, min_off, max_off)
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
        ext_table = getattr(self, "consume_queue_ext", None)
        ext = ext_table.resolve(cq.topic, cq.queue_id, units[:min(n, max_filter)], message_filter) \
            if ext_table is not None else None
        while i < n and i < max_filter:
            off_py, size_py, tags = unpack(units, i)
            skip = False
            if ext is not None and tags <= MAX_EXT_ADDR:    # the consume queue extension holds the tags code
                tags, skip = ext[0][i // UNIT], ext[1][i // UNIT]
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
            if message_filter is not None and (skip or not message_filter.is_matched_by_consume_queue(tags)):
                i += UNIT       # not read: its tags code (or its filter bit map) says it does not match
                continue
            msg = self._message_at(off_py, size_py, cq, offset + i // UNIT)
            wrong_unit = msg is WRONG_UNIT
            if wrong_unit and off_py + size_py > max_py:
                log.warning("%s: unit %d points past the commitlog's end (%d + %d > %d)", cq.queue.store_path,
                            offset + i // UNIT, off_py, size_py, max_py)
            if msg is None or wrong_unit:
                msg = None
                if cq.rebuilding_to > offset + i // UNIT:
                    break       # read while a repair cut the queue (ConsumeQueue.rebuilding_to): not skipped
                if wrong_unit and self.unit_repair is not None \
                        and self.unit_repair.request(cq, offset + i // UNIT, codec.CQ_UNIT.unpack_from(units, i)):
                    break       # the message it lost comes back with the repair: the read waits, not skips
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

    def _message_at(self, off: int, size: int, cq: ConsumeQueue | None = None, logical: int | None = None):
        """The message of the record at off, or None (no valid record there), or WRONG_UNIT (with cq: the
        record is valid but not the one unit `logical` of cq names)."""
        if self.dispatcher.skip_ranges and self.dispatcher.is_skipped(off):
            return None     # in a damaged range recovery skipped (recovery.py): not a message to answer
        raw = self.commit_log.get_message(off, size)
        if raw is None:
            # with cq: a unit that names no readable bytes (a negative or garbage offset or size, past the end
            # or across a file's end) is damaged; one below the commitlog's min names a cleaned file
            cleaned = 0 <= off < self.commit_log.get_min_offset()
            return WRONG_UNIT if cq is not None and not cleaned else None
        where = f" (unit {logical} of {cq.topic}/{cq.queue_id})" if cq is not None else ""
        try:
            rec = scanner.decode_record(raw, 0, len(raw), check_crc=True)   # a damaged body is not an answer
        except codec.RecordError as e:
            log.warning("%s: commitlog offset %d%s holds no valid message: %s",
                        self.commit_log.queue.store_path, off, where, e.reason)
            if cq is not None and not _record_starts_at(raw):
                return WRONG_UNIT       # the unit does not point at a record (a damaged unit, not body damage)
            return None
        if cq is not None:
            # the unit must name this record: never answer FOUND with another queue's or offset's message
            wrong = unit_record_mismatch(rec, off, size, cq.topic, cq.queue_id, logical)
            if wrong is not None:
                log.warning("%s: commitlog offset %d%s: %s", self.commit_log.queue.store_path, off, where, wrong)
                return WRONG_UNIT
        return MessageExt.from_record(rec)

    # --- offsets and lookups --------------------------------------------------------------------
    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queues.find(topic, queue_id)
        return cq.max_offset_for_readers()[1] if cq else 0

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
        if msg is not None and commit_log_offset < self.dispatcher.deleted.get((msg.topic, msg.queue_id), -1):
            return None     # its queue was deleted (deleteTopic): the message is gone, as from its queue
        if msg is None or commit_log_offset >= self.dispatcher.reput_from_offset:
            return msg      # not dispatched yet: no unit to agree with
        if not scanner.is_dispatched(msg.sys_flag):
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

    def topics(self) -> dict[str, list[int]]:
        return {t: sorted(qs) for t, qs in sorted(self.consume_queues.table.items())}


def _record_starts_at(raw: bytes) -> bool:
    """A record whose header parses starts at raw (its body may be damaged: the CRC is not checked)."""
    try:
        scanner.decode_record(raw, 0, len(raw), check_crc=False)
    except codec.RecordError:
        return False
    return True


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
