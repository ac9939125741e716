"""Timer messages (RocketMQ 5's RIP-43, TimerMessageStore): a message with a delivery time is parked in the
system topic `rmq_sys_wheel_timer` (queue 0) with REAL_TOPIC / REAL_QID / TIMER_DELIVER_MS, as RocketMQ 5
does, and put to its real topic and queue when its time comes, to within TIMER_PRECISION_MS.

    install(store)    # the store extension (rmqstore/__init__.py registers it for every store):
                      # the "timer" put-message hook and the TimerMessageService ("timer")
    store.put_message(Message("T", b"x", properties={"TIMER_DELIVER_MS": str(t)}))    # parked until t

Any put carrying TIMER_DELIVER_MS (absolute ms), TIMER_DELAY_SEC / TIMER_DELAY_MS (relative) or the 4.x
clients' __STARTDELIVERTIME (absolute ms) goes through TimerHook: due within the precision, it is stored
as it is; later, it is parked; beyond timerMaxDelaySec (or an unparseable value) it is refused with
MESSAGE_ILLEGAL naming the property.

The parked messages are the durable part (they are in the commit log); what has been delivered is kept in
`{store}/config/timerProgress.json`: {"committed": the lowest wheel queue offset not yet delivered,
"delivered": the offsets above it already delivered}, written atomically after each delivery batch.
A restart rescans the wheel queue from `committed` and delivers what is due and not delivered.

This is rmqstore's simpler durable design, NOT yet RocketMQ 5's on-disk timer layout (timerwheel with
32-byte slots, timerlog/ with 52-byte units, config/timercheck): a RocketMQ 5 store's timer files are not
read. Messages parked beyond timerMaxDelaySec are refused by the caller (see MAX_DELAY_SEC)."""
from __future__ import annotations

import heapq
import json
import logging
import threading
import time
from pathlib import Path

from . import codec
from .config_file import load_config_file, string_to_file
from .message import GetMessageStatus, Message, MessageExt, PutMessageResult, PutMessageStatus

log = logging.getLogger(__name__)

TIMER_TOPIC = "rmq_sys_wheel_timer"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"      # the delay-level hook's topic (messaging/schedule.py)
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_START_DELIVER_TIME = "__STARTDELIVERTIME"
TRIGGERS = frozenset({PROPERTY_TIMER_DELIVER_MS, PROPERTY_TIMER_DELAY_SEC, PROPERTY_TIMER_DELAY_MS,
                      PROPERTY_START_DELIVER_TIME})
TIMER_PRECISION_MS = 1000          # timerPrecisionMs default
MAX_DELAY_SEC = 3 * 24 * 3600      # timerMaxDelaySec default
SCAN_BATCH = 256


def now_ms() -> int:
    return int(time.time() * 1000)


def park(msg: Message, deliver_ms: int) -> Message:
    """The message as parked in the timer topic: its real topic and queue kept in properties."""
    props = dict(msg.properties)
    props[codec.PROPERTY_REAL_TOPIC] = msg.topic
    props[codec.PROPERTY_REAL_QUEUE_ID] = str(msg.queue_id)
    props[PROPERTY_TIMER_DELIVER_MS] = str(int(deliver_ms))
    return Message(topic=TIMER_TOPIC, body=msg.body, queue_id=0, flag=msg.flag, sys_flag=msg.sys_flag,
                   born_timestamp=msg.born_timestamp, born_host=msg.born_host, store_host=msg.store_host,
                   reconsume_times=msg.reconsume_times, properties=props)


def unpark(m: MessageExt) -> Message:
    """A parked message as put to its real topic and queue (TIMER_DELIVER_MS kept, as RocketMQ 5 does)."""
    props = dict(m.properties)
    topic = props.pop(codec.PROPERTY_REAL_TOPIC)
    qid = int(props.pop(codec.PROPERTY_REAL_QUEUE_ID, "0"))
    props[PROPERTY_TIMER_ENQUEUE_MS] = str(m.store_timestamp)
    return Message(topic=topic, body=m.body or b"", queue_id=qid, flag=m.flag, sys_flag=m.sys_flag,
                   born_timestamp=m.born_timestamp, born_host=m.born_host, reconsume_times=m.reconsume_times,
                   properties=props)


def deliver_ms_of(props: dict[str, str], now: int) -> int | None:
    """The absolute delivery time a message asks for (ms), None for none; ValueError for a bad value."""
    for key, scale, relative in ((PROPERTY_TIMER_DELIVER_MS, 1, False), (PROPERTY_START_DELIVER_TIME, 1, False),
                                 (PROPERTY_TIMER_DELAY_MS, 1, True), (PROPERTY_TIMER_DELAY_SEC, 1000, True)):
        v = props.get(key)
        if v is None:
            continue
        try:
            t = int(v.strip()) * scale
        except ValueError:
            raise ValueError(f"{key}={v!r} is not an integer") from None
        return now + t if relative else t
    return None


class TimerHook:
    """The put-message hook: a message due later than the precision is parked in the timer topic."""
    hook_name = "timer"
    trigger_properties = TRIGGERS

    def __init__(self, precision_ms: int = TIMER_PRECISION_MS, max_delay_sec: int = MAX_DELAY_SEC):
        self.precision_ms = precision_ms
        self.max_delay_ms = max_delay_sec * 1000

    def execute_before_put_message(self, msg: Message) -> Message | PutMessageResult:
        if msg.topic in (TIMER_TOPIC, SCHEDULE_TOPIC) or msg.sys_flag & codec.TRANSACTION_TYPE_MASK:
            return msg          # parked already (by this hook or the delay-level one), or a transaction's
        now = now_ms()
        try:
            due = deliver_ms_of(msg.properties, now)
        except ValueError as e:
            return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, None, f"timer message to {msg.topic}: {e}")
        if due is None or due <= now:
            return msg
        if due - now > self.max_delay_ms:
            return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, None,
                                    f"timer message to {msg.topic}: delivery in {(due - now) // 1000} s exceeds "
                                    f"timerMaxDelaySec={self.max_delay_ms // 1000}")
        return park(msg, due)


def install(store) -> None:
    """The store extension: TimerHook and the TimerMessageService ("timer")."""
    store.register_put_message_hook(TimerHook())
    store.register_service("timer", TimerMessageService(store))


def _decode_progress(d) -> dict:
    if not isinstance(d, dict) or not isinstance(d.get("committed"), int):
        raise ValueError("timerProgress.json: expected {committed: int, delivered: [int]}")
    return {"committed": d["committed"], "delivered": [int(x) for x in d.get("delivered", [])]}


class TimerMessageService:
    """Scans the timer topic's queue, delivers due messages to their real topics, keeps its progress."""

    def __init__(self, store, precision_ms: int = TIMER_PRECISION_MS):
        self.store = store
        self.precision_ms = precision_ms
        self.path = Path(store.path) / "config" / "timerProgress.json"
        self.committed = 0
        self.scanned = 0
        self.delivered: set[int] = set()
        self.pending: list[tuple[int, int, int]] = []      # heap of (deliver_ms, queue offset, commitlog offset)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        d = load_config_file(self.path, _decode_progress)
        if d is not None:
            self.committed = d["committed"]
            self.delivered = set(d["delivered"])
        self.committed = max(self.committed, self.store.get_min_offset_in_queue(TIMER_TOPIC, 0))
        self.scanned = self.committed
        self.store.dispatcher.add_listener(self._on_arrival)
        self._thread = threading.Thread(target=self._run, name="TimerMessageService", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        self.store.dispatcher.remove_listener(self._on_arrival)
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def _on_arrival(self, topic: str, queue_id: int, next_offset: int, store_ts: int) -> None:
        if topic == TIMER_TOPIC:
            self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.scan()
                wait = self.deliver_due()
            except Exception:
                log.exception("timer service: scan or delivery failed; retrying in 1 s")
                wait = 1.0
            self._wake.wait(wait)
            self._wake.clear()

    def scan(self) -> int:
        """Read newly parked messages into the pending heap; returns how many."""
        n = 0
        while True:
            r = self.store.get_message("TIMER_SCAN", TIMER_TOPIC, 0, self.scanned, SCAN_BATCH)
            if r.status is not GetMessageStatus.FOUND:
                if r.status in (GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.OFFSET_OVERFLOW_BADLY):
                    self.scanned = r.next_begin_offset
                return n
            for m in r.messages:
                if m.queue_offset in self.delivered:
                    continue
                try:
                    due = int(m.properties.get(PROPERTY_TIMER_DELIVER_MS, "0"))
                except ValueError:
                    log.warning("timer: %s at wheel offset %d has a bad TIMER_DELIVER_MS %r: delivered now",
                                m.msg_id, m.queue_offset, m.properties.get(PROPERTY_TIMER_DELIVER_MS))
                    due = 0
                with self._lock:
                    heapq.heappush(self.pending, (due, m.queue_offset, m.commit_log_offset))
                n += 1
            self.scanned = r.next_begin_offset

    def deliver_due(self) -> float:
        """Put every due message to its real topic; the seconds until the next is due (at most 1)."""
        now = now_ms()
        batch: list[tuple[int, int, int]] = []
        with self._lock:
            while self.pending and self.pending[0][0] <= now:
                batch.append(heapq.heappop(self.pending))
        if batch:
            self._deliver(batch)
        with self._lock:
            nxt = self.pending[0][0] if self.pending else None
        return 1.0 if nxt is None else max(0.01, min(1.0, (nxt - now_ms()) / 1000))

    def _deliver(self, batch: list[tuple[int, int, int]]) -> None:
        msgs, offsets = [], []
        for _due, qoff, cl in batch:
            m = self.store.look_message_by_offset(cl)
            if m is None or codec.PROPERTY_REAL_TOPIC not in m.properties:
                log.warning("timer: wheel offset %d (commitlog %d) unreadable or without REAL_TOPIC: skipped",
                            qoff, cl)
                offsets.append(qoff)
                continue
            msgs.append(unpark(m))
            offsets.append(qoff)
        results = self.store.put_messages(msgs, run_hooks=False) if msgs else []
        failed = [r for r in results if not r.ok]
        if failed:
            # nothing is marked delivered: the whole batch is tried again (at-least-once)
            log.error("timer: %d of %d deliveries failed (%s); retrying", len(failed), len(msgs), failed[0].status)
            with self._lock:
                for item in batch:
                    heapq.heappush(self.pending, item)
            return
        self.delivered.update(offsets)
        self._persist()

    def _persist(self) -> None:
        with self._lock:
            pending_offsets = [p[1] for p in self.pending]
        low = min(pending_offsets + [self.scanned])
        self.delivered = {o for o in self.delivered if o >= low}
        self.committed = low
        string_to_file(json.dumps({"committed": low, "delivered": sorted(self.delivered)}), self.path,
                       _decode_progress)
