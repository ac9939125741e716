"""Delayed messages: the put-path rewrite and RocketMQ's ScheduleMessageService.

The rewrite (CommitLog.putMessage): a non-transactional or commit message whose DELAY property is > 0 is
stored in SCHEDULE_TOPIC_XXXX, queue level-1 (the level clamped to the highest of messageDelayLevel),
with its real topic and queue id in REAL_TOPIC / REAL_QID. Like the broker, the properties are re-read
into a java.util.HashMap and serialised in its iteration order (see java_map), so the bytes equal
RocketMQ's. The dispatcher gives such a message the tags code store time + delay of its level.

ScheduleMessageService: one thread follows every level's queue from its offset; when the head
message's delivery time (its tags code) has come, it puts the message back (messageTimeup): real topic
and queue id, the same body, flag, sysFlag, born time and hosts, reconsumeTimes. As in RocketMQ 4.4.0,
the properties are serialised before DELAY is cleared from the map, so the re-put record still carries
DELAY, REAL_TOPIC and REAL_QID (the put path does not delay it again). It wakes when the dispatcher
reports new schedule messages and when the next message is due; a failed put is retried 10 s later.
Progress per level is kept in `{store}/config/delayOffset.json` ({"offsetTable": {"1": 12, ...}}),
written every flushDelayOffsetInterval ms when changed and at shutdown; a restart resumes from it.

Both are installed into a store by `install(store)` (a store extension, store/commitlog/hooks.py): the rewrite as a
put-message hook (ScheduleMessageHook, RocketMQ 5's HookUtils.handleScheduleMessage), the service as a
store service started and stopped with the store's services. The top-level package registers `install`
as a default extension, so every MessageStore delays DELAY messages and delivers them whether or not a
consumer runs in this process, as RocketMQ 4.4.0's DefaultMessageStore did; the store never imports
this module.
"""
from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from typing import TYPE_CHECKING

from ..store.format import codec
from ..store.consumequeue.consume_queue_ext import MAX_ADDR as MAX_EXT_ADDR, delivery_time_of_ext
from ..store.conf.config_tables import decode_delay_offsets
from ..store.conf.config_file import config_dir, dumps_pretty, load_config_file, string_to_file
from ..store.format.java_map import as_broker_map
from ..store.format import validation
from ..store.format.message import Message, MessageExt, PutMessageResult, PutMessageStatus

if TYPE_CHECKING:  # pragma: no cover
    from ..store.store import MessageStore

log = logging.getLogger(__name__)

SCHEDULE_TOPIC = codec.SCHEDULE_TOPIC
PROPERTY_DELAY = codec.PROPERTY_DELAY
PROPERTY_REAL_TOPIC = codec.PROPERTY_REAL_TOPIC
PROPERTY_REAL_QUEUE_ID = codec.PROPERTY_REAL_QUEUE_ID
DELAY_FOR_A_WHILE_MS = 100
DELAY_FOR_A_PERIOD_MS = 10_000
IDLE_WAIT_MS = 1000
PUT_BATCH = 64

_JAVA_INT = re.compile(r"[+-]?\d+")
_TRAN_NOT_OR_COMMIT = (codec.TRANSACTION_NOT_TYPE, codec.TRANSACTION_COMMIT_TYPE)


def delay_level2queue_id(level: int) -> int:
    return level - 1


def queue_id2delay_level(queue_id: int) -> int:
    return queue_id + 1


def _java_int(s: str | None) -> int | None:
    if s is None or not _JAVA_INT.fullmatch(s):
        return None
    v = int(s)
    return v if -(1 << 31) <= v < (1 << 31) else None


def rewrite_delayed(msgs: list[Message], max_level: int) -> list[Message]:
    """The delay rewrite of CommitLog.putMessage for every message that needs it (others untouched;
    the list is copied only if something changes)."""
    out = msgs
    for i, m in enumerate(msgs):
        p = m.properties
        if not p or PROPERTY_DELAY not in p or max_level <= 0:
            continue
        if (m.sys_flag & codec.TRANSACTION_TYPE_MASK) not in _TRAN_NOT_OR_COMMIT:
            continue
        hm = as_broker_map(p)
        level = _java_int(hm.get(PROPERTY_DELAY))
        if level is None or level <= 0:
            if level is None:
                log.warning("message to %s: DELAY %r is not an integer; stored without delay", m.topic,
                            p.get(PROPERTY_DELAY))
            continue
        if level > max_level:
            level = max_level
            hm.put(PROPERTY_DELAY, str(level))
        hm.put(PROPERTY_REAL_TOPIC, m.topic)
        hm.put(PROPERTY_REAL_QUEUE_ID, str(m.queue_id))
        if out is msgs:
            out = list(msgs)
        out[i] = dataclasses.replace(m, topic=SCHEDULE_TOPIC, queue_id=delay_level2queue_id(level),
                                     properties=hm.to_dict())
    return out


class ScheduleMessageHook:
    """The delay rewrite as a put-message hook (store/commitlog/hooks.py): a message with a DELAY property goes to
    SCHEDULE_TOPIC_XXXX (rewrite_delayed). Its real topic and queue id are checked first: a message the
    store would refuse at delivery is refused now (MESSAGE_ILLEGAL), not answered PUT_OK and lost later."""
    hook_name = "schedule"
    trigger_properties = frozenset((PROPERTY_DELAY,))

    def __init__(self, max_level: int):
        self.max_level = max_level

    def execute_before_put_message(self, msg: Message) -> Message | PutMessageResult:
        out = rewrite_delayed([msg], self.max_level)[0]
        if out is msg:
            return msg
        why = validation.topic_problem(msg.topic) or validation.queue_id_problem(msg.queue_id)
        if why is not None:
            return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, None, f"delayed message: {why}")
        return out


def install(store: "MessageStore") -> None:
    """The store extension: the delay rewrite hook and the ScheduleMessageService ("schedule")."""
    store.register_put_message_hook(ScheduleMessageHook(len(store.config.delay_levels_ms())))
    store.register_service("schedule", ScheduleMessageService(store))


def message_timeup(msg: MessageExt) -> Message:
    """ScheduleMessageService.messageTimeup: the message to put back to its real topic and queue."""
    hm = as_broker_map(msg.properties)
    props = hm.to_dict()                   # serialised before DELAY is cleared: the bytes keep it
    topic = hm.get(PROPERTY_REAL_TOPIC)
    qid = _java_int(hm.get(PROPERTY_REAL_QUEUE_ID))
    if not topic or qid is None:
        raise ValueError(f"schedule message at {msg.commit_log_offset} has no REAL_TOPIC/REAL_QID")
    return Message(topic=topic, body=msg.body or b"", queue_id=qid, flag=msg.flag, sys_flag=msg.sys_flag,
                   born_timestamp=msg.born_timestamp, born_host=msg.born_host, store_host=msg.store_host,
                   reconsume_times=msg.reconsume_times, prepared_transaction_offset=0, properties=props)


def _now_ms() -> int:
    return int(time.time() * 1000)


class ScheduleMessageService:
    FILE_NAME = "delayOffset.json"

    def __init__(self, store: "MessageStore"):
        self.store = store
        self.path = config_dir(store.path) / self.FILE_NAME
        self.delay_levels = store.config.delay_levels_ms()
        self.max_delay_level = len(self.delay_levels)
        self.offset_table: dict[int, int] = {}
        self.delivered = 0
        self._lock = threading.Lock()
        self._dirty = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._retry_at: dict[int, int] = {}     # level -> ms before which a failed put is not retried
        self._last_persist = time.monotonic()
        self.load()

    # --- offsets --------------------------------------------------------------------------------
    def load(self) -> None:
        """delayOffset.json, else its .bak (config_file.load_config_file); CorruptStoreError naming the
        file when neither is usable."""
        table = load_config_file(self.path, decode_delay_offsets)
        if table is not None:
            self.offset_table = table

    def encode(self) -> dict:
        with self._lock:
            return {"offsetTable": {str(k): v for k, v in sorted(self.offset_table.items())}}

    def persist(self) -> None:
        with self._lock:
            self._dirty = False
        string_to_file(dumps_pretty(self.encode()), self.path, decode_delay_offsets)
        self._last_persist = time.monotonic()

    def _update_offset(self, level: int, offset: int) -> None:
        with self._lock:
            if self.offset_table.get(level) != offset:
                self.offset_table[level] = offset
                self._dirty = True

    def compute_deliver_timestamp(self, level: int, store_timestamp: int) -> int:
        if 1 <= level <= self.max_delay_level:
            return store_timestamp + self.delay_levels[level - 1]
        return store_timestamp + 1000

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self.store.dispatcher.add_listener(self._on_arrival)
        self._thread = threading.Thread(target=self._run, name="ScheduleMessageService", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        self.store.dispatcher.remove_listener(self._on_arrival)
        t, self._thread = self._thread, None
        if t is not None and t is not threading.current_thread():
            t.join(timeout=10)
        if self._dirty:
            try:
                self.persist()
            except OSError as e:
                log.error("cannot persist %s: %s", self.path, e)

    def _on_arrival(self, topic: str, queue_id: int, next_offset: int, store_ts: int) -> None:
        if topic == SCHEDULE_TOPIC:
            self._wake.set()

    def wakeup(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        interval = max(self.store.config.flush_delay_offset_interval, 1) / 1000.0
        while not self._stop.is_set():
            self._wake.clear()
            try:
                next_due = self.deliver_due()
            except Exception:
                log.exception("schedule service failed")
                next_due = _now_ms() + DELAY_FOR_A_PERIOD_MS
            if self._dirty and time.monotonic() - self._last_persist >= interval:
                try:
                    self.persist()
                except OSError as e:
                    log.error("cannot persist %s: %s", self.path, e)
            wait_ms = min(IDLE_WAIT_MS, max(0, next_due - _now_ms()) if next_due is not None else IDLE_WAIT_MS)
            wait_ms = min(wait_ms, interval * 1000)
            if wait_ms > 0:
                self._wake.wait(wait_ms / 1000.0)

    # --- delivery -------------------------------------------------------------------------------
    def deliver_due(self) -> int | None:
        """Deliver every due message of every level; returns when the next one is due (ms), or None."""
        next_due = None
        for level in range(1, self.max_delay_level + 1):
            if self._stop.is_set():
                break
            t = self._deliver_level(level)
            if t is not None and (next_due is None or t < next_due):
                next_due = t
        return next_due

    def _deliver_level(self, level: int) -> int | None:
        store = self.store
        cq = store.consume_queues.find(SCHEDULE_TOPIC, delay_level2queue_id(level))
        if cq is None:
            return None
        now = _now_ms()
        retry_at = self._retry_at.get(level)
        if retry_at is not None:
            if now < retry_at:
                return retry_at
            del self._retry_at[level]
        offset = self.offset_table.get(level, 0)
        min_off = cq.get_min_offset_in_queue()
        if offset < min_off:
            log.error("schedule queue %d: offset %d below the queue's min offset %d", level - 1, offset, min_off)
            offset = min_off
            self._update_offset(level, offset)
        max_off = cq.get_max_offset_in_queue()
        delay = self.delay_levels[level - 1]
        batch: list[tuple[Message, int]] = []
        unpack = codec.CQ_UNIT.unpack_from
        while offset < max_off and not self._stop.is_set():
            got = cq.get_index_buffer(offset)
            if got is None:
                nxt = cq.roll_next_file(offset)
                log.warning("schedule queue %d: no unit at %d, skipping to %d", level - 1, offset, nxt)
                offset = min(nxt, max_off)
                self._update_offset(level, offset)
                continue
            data = got[0]
            n = min(len(data) // codec.CQ_STORE_UNIT_SIZE, max_off - offset)
            for i in range(n):
                phys, size, tags_code = unpack(data, i * codec.CQ_STORE_UNIT_SIZE)
                if tags_code <= MAX_EXT_ADDR:       # enableConsumeQueueExt: the delivery time is in the ext unit
                    tags_code = delivery_time_of_ext(store, cq, tags_code, phys, size, delay)
                now = _now_ms()
                deliver = tags_code if tags_code <= now + delay else now   # correctDeliverTimestamp
                if deliver > now:
                    if not self._put_batch(level, batch):
                        return self._retry_at[level]
                    self._update_offset(level, offset + i)
                    return deliver
                msg = store.look_message_by_offset(phys, size) if 0 < size < (1 << 30) else None
                inner = None
                if msg is not None:
                    try:
                        inner = message_timeup(msg)
                    except (ValueError, TypeError) as e:
                        log.error("schedule message dropped: %s", e)
                batch.append((inner, offset + i + 1))
                if len(batch) >= PUT_BATCH:
                    if not self._put_batch(level, batch):
                        return self._retry_at[level]
            offset += n
            if n == 0:
                break
        if not self._put_batch(level, batch):
            return self._retry_at[level]
        self._update_offset(level, offset)
        return None

    def _put_batch(self, level: int, batch: list[tuple[Message | None, int]]) -> bool:
        """Put the batch's messages; advance the level's offset past what was stored. False on failure."""
        if not batch:
            return True
        msgs = [m for m, _ in batch if m is not None]
        results = self.store.put_messages(msgs, run_hooks=False) if msgs else []
        it = iter(results)
        for m, next_offset in batch:
            if m is not None:
                r = next(it)
                if not r.ok:
                    log.error("schedule service: re-put to %s failed (%s); retrying in %d ms", m.topic,
                              r.status.value, DELAY_FOR_A_PERIOD_MS)
                    self._retry_at[level] = _now_ms() + DELAY_FOR_A_PERIOD_MS
                    batch.clear()
                    return False
                self.delivered += 1
            self._update_offset(level, next_offset)
        batch.clear()
        return True
