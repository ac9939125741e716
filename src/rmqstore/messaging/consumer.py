"""Consumer groups in process: PushConsumer and PullConsumer (RocketMQ's DefaultMQPushConsumer /
DefaultMQPullConsumer, clustering mode), reading straight from a MessageStore.

    consumer = PushConsumer(store, "order-consumers", listener=on_messages)
    consumer.subscribe("TopicA", "TagA || TagB")
    consumer.start()            # ... consumer.shutdown()

    def on_messages(msgs, context):         # or on_messages(msgs)
        ...
        return CONSUME_SUCCESS              # or RECONSUME_LATER, or raise

Subscriptions: "*", "TagA || TagB", or MessageSelector.by_sql("a > 5 AND b = 'x'") (rmqstore.filter: RocketMQ
4.4.0's SQL92 selectors over the message's properties). Tags are filtered by the tags code in the consume
queue, then by their real tag (the broker's ExpressionMessageFilter and the client's tag check); a selector
on each message's properties (only TRUE is delivered). A push consumer also subscribes to its group's retry
topic %RETRY%{group}.

Delivery: the instances of a group share every subscribed topic's queues (AllocateMessageQueueAveragely,
see rebalance); each queue starts at the group's committed offset, or, for a group without one, per
consume_from_where (CONSUME_FROM_LAST_OFFSET: the queue's end; CONSUME_FROM_FIRST_OFFSET: its start;
CONSUME_FROM_TIMESTAMP: the first message stored at or after consume_timestamp). A pull that finds
nothing waits for the dispatcher to report new messages in one of the instance's queues (long polling)
or for the suspend timeout; with longPollingEnable off it waits shortPollingTimeMills.

Progress: after consumption the offset committed for a queue is that of its oldest message still in
flight (ProcessQueue), so a crash re-delivers at most what was pulled but not yet consumed; offsets go to
the store's ConsumerOffsetManager, which writes `config/consumerOffset.json` periodically and when a
consumer shuts down. At-least-once: a message is committed only after its listener returned
CONSUME_SUCCESS, or after it was put to the retry (or dead-letter) topic.

Concurrent consumers (default): listener calls run on consume_thread_nums threads. A failed message
(RECONSUME_LATER, an exception, or None) goes back to the broker (consumerSendMsgBack): to
%RETRY%{group} with reconsumeTimes + 1 after delay level 3 + reconsumeTimes, and after
max_reconsume_times (default 16) to %DLQ%{group}. Orderly consumers (orderly=True): each queue's
messages are handed to the listener one batch at a time, in queue order; a failure suspends the queue
for suspend_current_queue_time_millis and retries the same messages locally (after
max_reconsume_times, default unlimited, they go to the dead-letter topic).
"""
from __future__ import annotations

import dataclasses
import heapq
import inspect
import itertools
import logging
import os
import statistics
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..common.enums import ConsumeConcurrentlyStatus, ConsumeFromWhere, ConsumeOrderlyStatus, PullStatus
from ..store.format import codec
from ..errors import StoreClosedError
from ..filter import MessageSelector, SqlExpression, compile_sql92
from .local_broker import PROPERTY_RETRY_TOPIC, LocalBroker
from ..store.format.message import GetMessageStatus, MessageExt
from .topic_config import MessageQueue, retry_topic

log = logging.getLogger(__name__)

__all__ = ["PushConsumer", "PullConsumer", "ConsumeFromWhere", "ConsumeConcurrentlyStatus", "ConsumeOrderlyStatus",
           "CONSUME_SUCCESS", "RECONSUME_LATER", "SUCCESS", "SUSPEND_CURRENT_QUEUE_A_MOMENT", "PullStatus",
           "PullResult", "SubscriptionData", "ConsumeConcurrentlyContext", "ConsumeOrderlyContext",
           "measure_long_polling_latency"]


# --- enums and results ---------------------------------------------------------------------------


CONSUME_SUCCESS = ConsumeConcurrentlyStatus.CONSUME_SUCCESS
RECONSUME_LATER = ConsumeConcurrentlyStatus.RECONSUME_LATER
SUCCESS = ConsumeOrderlyStatus.SUCCESS
SUSPEND_CURRENT_QUEUE_A_MOMENT = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
_OK_STATUSES = (CONSUME_SUCCESS, SUCCESS, "CONSUME_SUCCESS", "SUCCESS")


@dataclass
class PullResult:
    pull_status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    msg_found_list: list[MessageExt] = field(default_factory=list)


@dataclass
class ConsumeConcurrentlyContext:
    message_queue: MessageQueue
    delay_level_when_next_consume: int = 0      # 0: the broker picks 3 + reconsumeTimes; -1: straight to DLQ
    ack_index: int = (1 << 31) - 1


@dataclass
class ConsumeOrderlyContext:
    message_queue: MessageQueue
    auto_commit: bool = True
    suspend_current_queue_time_millis: int = -1


# --- subscriptions -------------------------------------------------------------------------------
SUB_ALL = "*"


def _java_int(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


@dataclass
class SubscriptionData:
    """FilterAPI.buildSubscriptionData, usable as the store's MessageFilter: tags, or an SQL92 selector
    (`sql`, compiled when subscribing: a selector RocketMQ refuses raises rmqstore.filter.SelectorError)."""
    topic: str
    sub_string: str = SUB_ALL
    tags_set: frozenset[str] = frozenset()
    code_set: frozenset[int] = frozenset()
    sql: SqlExpression | None = None

    @classmethod
    def build(cls, topic: str, expression: "str | MessageSelector | None") -> "SubscriptionData":
        if isinstance(expression, MessageSelector):
            if expression.is_sql:
                return cls(topic, expression.expression, sql=compile_sql92(expression.expression))
            expression = expression.expression
        if expression is None or expression.strip() in ("", SUB_ALL):
            return cls(topic)
        tags = [t.strip() for t in expression.split("||")]
        tags = [t for t in tags if t]
        return cls(topic, expression, frozenset(tags), frozenset(codec.java_string_hash(t) for t in tags))

    @property
    def match_all(self) -> bool:
        return self.sql is None and (self.sub_string == SUB_ALL or not self.tags_set)

    def is_matched_by_consume_queue(self, tags_code: int | None) -> bool:
        if tags_code is None or self.match_all or self.sql is not None:
            return True
        return _java_int(tags_code) in self.code_set

    def is_matched_by_commit_log(self, msg: MessageExt) -> bool:
        if self.sql is not None:
            return self.sql.matches_cached(msg.properties)
        if self.match_all:
            return True
        tags = msg.properties.get(codec.PROPERTY_TAGS)
        return tags is not None and tags in self.tags_set

    def matches(self, msg: MessageExt) -> bool:
        return self.is_matched_by_commit_log(msg)


# --- the process queue ---------------------------------------------------------------------------
class ProcessQueue:
    """Messages of one queue pulled but not yet consumed (RocketMQ's ProcessQueue)."""

    def __init__(self, mq: MessageQueue, next_offset: int):
        self.mq = mq
        self.next_offset = next_offset          # where the next pull starts
        self.committed = -1                     # last offset committed by this instance
        self.lock = threading.Lock()
        self.consume_lock = threading.Lock()    # orderly: one consumer of the queue at a time
        self.msgs: dict[int, MessageExt] = {}   # queue offset -> message, ascending
        self.consuming: dict[int, MessageExt] = {}
        self.queue_offset_max = -1
        self.dropped = False
        self.orderly_scheduled = False
        self.in_flight = 0

    @property
    def msg_count(self) -> int:
        return len(self.msgs) + len(self.consuming)

    def put(self, msgs: list[MessageExt]) -> None:
        with self.lock:
            for m in msgs:
                self.msgs[m.queue_offset] = m
                if m.queue_offset > self.queue_offset_max:
                    self.queue_offset_max = m.queue_offset

    def remove(self, msgs: list[MessageExt]) -> int:
        """Forget consumed messages; the offset safe to commit now (-1: nothing was ever put)."""
        with self.lock:
            if self.queue_offset_max < 0:
                return -1
            for m in msgs:
                self.msgs.pop(m.queue_offset, None)
            if self.msgs:
                return min(self.msgs)
            return self.queue_offset_max + 1

    # orderly
    def take(self, n: int) -> list[MessageExt]:
        with self.lock:
            out = []
            for off in sorted(self.msgs)[:n]:
                m = self.msgs.pop(off)
                self.consuming[off] = m
                out.append(m)
            return out

    def commit_taken(self) -> int:
        with self.lock:
            if not self.consuming:
                return -1
            off = max(self.consuming) + 1
            self.consuming.clear()
            if self.msgs:
                return min(min(self.msgs), off)
            return off

    def put_back_taken(self) -> None:
        with self.lock:
            self.msgs.update(self.consuming)
            self.consuming.clear()

    def safe_commit_offset(self) -> int:
        """Offset committed when this instance lets the queue go: its oldest unconsumed message, else the
        end of what it pulled (or the pull offset when nothing is in flight)."""
        with self.lock:
            pending = list(self.msgs) + list(self.consuming)
            if pending:
                return min(pending)
            return self.next_offset


# --- a tiny delayed-task scheduler -----------------------------------------------------------------
class _Scheduler:
    def __init__(self, name: str):
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def schedule(self, delay_s: float, fn: Callable[[], None]) -> None:
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + delay_s, next(self._seq), fn))
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and (not self._heap or self._heap[0][0] > time.monotonic()):
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(timeout)
                if self._stop:
                    return
                _, _, fn = heapq.heappop(self._heap)
            try:
                fn()
            except Exception:
                log.exception("scheduled task failed")

    def shutdown(self) -> None:
        with self._cond:
            self._stop = True
            self._heap.clear()
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)


# --- shared base -----------------------------------------------------------------------------------
_instance_seq = itertools.count(1)


def _make_client_id(instance_name: str | None) -> str:
    from .producer import client_ip
    return f"{client_ip()}@{instance_name or os.getpid()}#{next(_instance_seq)}"


def _default_consume_timestamp() -> int:
    return int(time.time() * 1000) - 30 * 60 * 1000    # half an hour ago, as the Java client


def _parse_timestamp(ts: int | str | None) -> int:
    if ts is None:
        return _default_consume_timestamp()
    if isinstance(ts, str):    # yyyyMMddHHmmss, local time, as DefaultMQPushConsumer.consumeTimestamp
        return int(time.mktime(time.strptime(ts, "%Y%m%d%H%M%S")) * 1000)
    return int(ts)


def _prepare_for_listener(msg: MessageExt, group: str) -> MessageExt:
    """What the client does before handing a message over: decompress, restore a retry message's topic."""
    changes: dict[str, Any] = {}
    if msg.sys_flag & codec.SYSFLAG_COMPRESSED and msg.body:
        try:
            changes["body"] = zlib.decompress(msg.body)
        except zlib.error:
            log.warning("message %s: body flagged compressed is not zlib data", msg.msg_id)
    if msg.topic == retry_topic(group):
        real = msg.properties.get(PROPERTY_RETRY_TOPIC)
        if real:
            changes["topic"] = real
    return dataclasses.replace(msg, **changes) if changes else msg


class _ConsumerBase:
    """Subscriptions, group membership, offsets: what push and pull consumers share."""
    auto_retry_subscription = False

    def __init__(self, store, group: str, *, consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                 consume_timestamp: int | str | None = None, instance_name: str | None = None,
                 pull_batch_size: int = 32, broker_suspend_max_time_millis: int = 15000):
        if not group:
            raise ValueError("consumer group must not be empty")
        self.store = store
        self.group = group
        self.consume_from_where = ConsumeFromWhere(consume_from_where)
        self.consume_timestamp = _parse_timestamp(consume_timestamp)
        self.pull_batch_size = pull_batch_size
        self.broker_suspend_max_time_millis = broker_suspend_max_time_millis
        self.client_id = _make_client_id(instance_name)
        self.broker: LocalBroker | None = None
        self.subscriptions: dict[str, SubscriptionData] = {}
        self._pqs: dict[MessageQueue, ProcessQueue] = {}
        self._pq_lock = threading.RLock()
        self._running = False
        self._stopping = False

    # --- subscriptions --------------------------------------------------------------------------
    def subscribe(self, topic: str, expression: "str | MessageSelector | None" = SUB_ALL) -> None:
        """expression: tags ("TagA || TagB", "*") or a MessageSelector (MessageSelector.by_sql("a > 5")); a
        selector RocketMQ would refuse raises rmqstore.filter.SelectorError here."""
        self.subscriptions[topic] = SubscriptionData.build(topic, expression)
        if self._running and self.broker is not None:
            self.broker.registry.rebalance(self.group)

    def unsubscribe(self, topic: str) -> None:
        self.subscriptions.pop(topic, None)
        if self._running and self.broker is not None:
            self.broker.registry.rebalance(self.group)

    def subscribed_topics(self) -> set[str]:
        return set(self.subscriptions)

    @property
    def assigned_queues(self) -> list[MessageQueue]:
        with self._pq_lock:
            return sorted(mq for mq, pq in self._pqs.items() if not pq.dropped)

    # --- offsets --------------------------------------------------------------------------------
    def compute_pull_from_where(self, mq: MessageQueue) -> int:
        """RebalancePushImpl.computePullFromWhere (a group without a committed offset)."""
        off = self.broker.offsets.query_offset(self.group, mq.topic, mq.queue_id)
        if off >= 0:
            return off
        store = self.store
        is_retry = mq.topic.startswith("%RETRY%")
        cfw = self.consume_from_where
        if cfw is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET or (is_retry and cfw is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET):
            return max(store.get_min_offset_in_queue(mq.topic, mq.queue_id), 0)
        if cfw is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET or is_retry:
            return store.get_max_offset_in_queue(mq.topic, mq.queue_id)
        return store.get_offset_in_queue_by_time(mq.topic, mq.queue_id, self.consume_timestamp)

    def _commit(self, pq: ProcessQueue, offset: int, force: bool = False) -> None:
        """Commit an offset for the queue (only forward, and not for a queue this instance let go)."""
        if offset < 0 or (pq.dropped and not force):
            return
        with pq.lock:   # decided and written under one lock: two consume threads finishing out of order
            if offset <= pq.committed and not force:    # would otherwise write 10, then an older 9 over it
                return
            pq.committed = offset
            self.broker.offsets.commit_offset(self.group, pq.mq.topic, pq.mq.queue_id, offset)

    def fetch_consume_offset(self, mq: MessageQueue) -> int:
        return self.broker.offsets.query_offset(self.group, mq.topic, mq.queue_id)

    def update_consume_offset(self, mq: MessageQueue, offset: int) -> None:
        self.broker.offsets.commit_offset(self.group, mq.topic, mq.queue_id, offset)

    def _leave_broker(self) -> None:
        """The end of shutdown: stop watching arrivals, leave the group (its queues rebalance to the others),
        write the offsets, forget the queues."""
        broker = self.broker
        if broker is not None:
            broker.hub.unwatch(self._watched, self._arrival)
            self._watched = set()
            broker.registry.unregister(self)
            if broker.offsets.dirty():
                try:
                    broker.offsets.persist()
                except OSError as e:
                    log.error("cannot persist consumer offsets: %s", e)
        with self._pq_lock:
            self._pqs.clear()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def persist_consumer_offset(self) -> None:
        """Commit every owned queue's safe offset and write consumerOffset.json now."""
        with self._pq_lock:
            pqs = list(self._pqs.values())
        for pq in pqs:
            if not pq.dropped:
                self._commit(pq, pq.safe_commit_offset())
        if self.broker is not None and self.broker.offsets.dirty():
            try:
                self.broker.offsets.persist()
            except OSError as e:
                log.error("cannot persist consumer offsets: %s", e)

    # --- pulling --------------------------------------------------------------------------------
    def _pull(self, mq: MessageQueue, sub: SubscriptionData | None, offset: int, max_nums: int) -> PullResult:
        """One pull, with the broker's status mapping (PullMessageProcessor) and the client's handling."""
        flt = sub if sub is not None and not sub.match_all else None
        r = self.store.get_message(self.group, mq.topic, mq.queue_id, offset, max_nums, flt)
        s = r.status
        if s is GetMessageStatus.FOUND:
            return PullResult(PullStatus.FOUND, r.next_begin_offset, r.min_offset, r.max_offset, list(r.messages))
        if s in (GetMessageStatus.NO_MATCHED_MESSAGE, GetMessageStatus.MESSAGE_WAS_REMOVING):
            return PullResult(PullStatus.NO_MATCHED_MSG, r.next_begin_offset, r.min_offset, r.max_offset)
        if s in (GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, GetMessageStatus.NO_MESSAGE_IN_QUEUE):
            st = PullStatus.OFFSET_ILLEGAL if offset != 0 else PullStatus.NO_NEW_MSG
            return PullResult(st, r.next_begin_offset, r.min_offset, r.max_offset)
        if s in (GetMessageStatus.OFFSET_FOUND_NULL, GetMessageStatus.OFFSET_OVERFLOW_ONE):
            return PullResult(PullStatus.NO_NEW_MSG, r.next_begin_offset, r.min_offset, r.max_offset)
        return PullResult(PullStatus.OFFSET_ILLEGAL, r.next_begin_offset, r.min_offset, r.max_offset)

    # --- membership -----------------------------------------------------------------------------
    def _join(self) -> None:
        self.broker = LocalBroker.of(self.store)
        self._running = True
        self._stopping = False
        self.broker.registry.register(self)

    def _rebalance_release(self, keep: set[MessageQueue]) -> None:
        with self._pq_lock:
            gone = [pq for mq, pq in self._pqs.items() if mq not in keep]
        for pq in gone:
            self._release_queue(pq)
            with self._pq_lock:
                if self._pqs.get(pq.mq) is pq:
                    del self._pqs[pq.mq]
        if gone:
            self._queues_changed()
            log.info("%s: released %s", self.client_id, [str(pq.mq) for pq in gone])

    def _release_queue(self, pq: ProcessQueue) -> None:
        pq.dropped = True
        self._commit(pq, pq.safe_commit_offset(), force=True)

    def _rebalance_acquire(self, wanted: set[MessageQueue]) -> None:
        if not self._running:
            return
        added = []
        for mq in sorted(wanted):
            with self._pq_lock:
                if mq in self._pqs:
                    continue
            try:
                offset = self.compute_pull_from_where(mq)
            except StoreClosedError:
                return
            pq = ProcessQueue(mq, offset)
            with self._pq_lock:
                self._pqs[mq] = pq
            added.append(mq)
        if added:
            self._queues_changed()
            log.info("%s: took %s", self.client_id, [str(mq) for mq in added])

    def _queues_changed(self) -> None:
        pass


# --- push consumer -------------------------------------------------------------------------------
Listener = Callable[..., Any]


def _wants_context(fn: Callable) -> bool:
    """listener(msgs, context) when it takes two required positional parameters (or *args), else listener(msgs)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    required = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    return len(required) >= 2


class PushConsumer(_ConsumerBase):
    def __init__(self, store, group: str, listener: Listener | None = None, *, orderly: bool = False,
                 consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                 consume_timestamp: int | str | None = None, max_reconsume_times: int = -1,
                 consume_thread_nums: int = 4, pull_batch_size: int = 32, consume_message_batch_max_size: int = 1,
                 pull_threshold_for_queue: int = 1000, suspend_current_queue_time_millis: int = 1000,
                 broker_suspend_max_time_millis: int = 15000, await_termination_millis: int = 5000,
                 instance_name: str | None = None):
        super().__init__(store, group, consume_from_where=consume_from_where, consume_timestamp=consume_timestamp,
                         instance_name=instance_name, pull_batch_size=pull_batch_size,
                         broker_suspend_max_time_millis=broker_suspend_max_time_millis)
        self.orderly = orderly
        self.max_reconsume_times_setting = max_reconsume_times
        self.consume_thread_nums = max(1, consume_thread_nums)
        self.consume_message_batch_max_size = max(1, consume_message_batch_max_size)
        self.pull_threshold_for_queue = pull_threshold_for_queue
        self.suspend_current_queue_time_millis = suspend_current_queue_time_millis
        self.await_termination_millis = await_termination_millis
        self._listener: Listener | None = None
        self._listener_ctx = True
        if listener is not None:
            self.register_message_listener(listener)
        self._arrival = threading.Event()
        self._watched: set[tuple[str, int]] = set()
        self._pull_thread: threading.Thread | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._scheduler: _Scheduler | None = None
        self._in_flight = 0
        self._in_flight_cond = threading.Condition()
        self._warned_none = False
        self.consumed = 0        # listener calls that succeeded (messages)
        self.sent_back = 0       # messages put to the retry or dead-letter topic

    @property
    def max_reconsume_times(self) -> int:
        if self.max_reconsume_times_setting == -1:
            return (1 << 31) - 1 if self.orderly else 16
        return self.max_reconsume_times_setting

    def register_message_listener(self, fn: Listener) -> None:
        self._listener = fn
        self._listener_ctx = _wants_context(fn)

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "PushConsumer":
        if self._running:
            return self
        if self._listener is None:
            raise ValueError("messageListener is null: register a listener before start()")
        self.subscriptions.setdefault(retry_topic(self.group), SubscriptionData.build(retry_topic(self.group), SUB_ALL))
        self._executor = ThreadPoolExecutor(self.consume_thread_nums, thread_name_prefix=f"Consume_{self.group}")
        self._scheduler = _Scheduler(f"ConsumeScheduler_{self.group}")
        broker = LocalBroker.of(self.store)
        broker.ensure_retry_topic(self.group)
        self._join()
        self._pull_thread = threading.Thread(target=self._pull_loop, name=f"PullMessageService_{self.client_id}",
                                             daemon=True)
        self._pull_thread.start()
        return self

    def shutdown(self) -> None:
        """Stop pulling, let in-flight listener calls finish (up to await_termination_millis), commit the
        offsets, leave the group (the others take over its queues) and write consumerOffset.json."""
        if not self._running or self._stopping:
            return
        self._stopping = True
        self._arrival.set()
        t = self._pull_thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=10)
        deadline = time.monotonic() + self.await_termination_millis / 1000.0
        with self._in_flight_cond:
            while self._in_flight > 0 and time.monotonic() < deadline:
                self._in_flight_cond.wait(max(0.0, deadline - time.monotonic()))
        if self._scheduler is not None:
            self._scheduler.shutdown()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        with self._pq_lock:
            pqs = list(self._pqs.values())
        for pq in pqs:
            if not pq.dropped:
                self._commit(pq, pq.safe_commit_offset())
                pq.dropped = True
        self._running = False
        self._leave_broker()

    # --- rebalance hooks ------------------------------------------------------------------------
    def _release_queue(self, pq: ProcessQueue) -> None:
        if self.orderly:
            # wait for the listener working on this queue, so the next owner starts after it
            got = pq.consume_lock.acquire(timeout=self.await_termination_millis / 1000.0)
            try:
                pq.dropped = True
                if pq.consuming:
                    pq.put_back_taken()
                self._commit(pq, pq.safe_commit_offset(), force=True)
            finally:
                if got:
                    pq.consume_lock.release()
        else:
            super()._release_queue(pq)

    def _queues_changed(self) -> None:
        broker = self.broker
        if broker is None:
            return
        with self._pq_lock:
            keys = {(mq.topic, mq.queue_id) for mq in self._pqs}
        broker.hub.unwatch(self._watched - keys, self._arrival)
        broker.hub.watch(keys - self._watched, self._arrival)
        self._watched = keys
        self._arrival.set()

    # --- pulling --------------------------------------------------------------------------------
    def _pull_loop(self) -> None:
        hub = self.broker.hub
        while self._running and not self._stopping:
            self._arrival.clear()
            try:
                progressed = self._pull_round()
            except StoreClosedError:
                break
            except Exception:
                log.exception("%s: pull failed", self.client_id)
                progressed = False
                self._arrival.wait(0.5)
            if not progressed and not self._stopping:
                self._arrival.wait(hub.suspend_time(self.broker_suspend_max_time_millis / 1000.0))

    def _pull_round(self) -> bool:
        progressed = False
        with self._pq_lock:
            pqs = list(self._pqs.values())
        for pq in pqs:
            if self._stopping:
                break
            if pq.dropped or pq.msg_count >= self.pull_threshold_for_queue:
                continue
            sub = self.subscriptions.get(pq.mq.topic)
            if sub is None:
                continue
            r = self._pull(pq.mq, sub, pq.next_offset, self.pull_batch_size)
            if pq.dropped:
                continue
            if r.pull_status is PullStatus.FOUND:
                pq.next_offset = r.next_begin_offset
                self._dispatch(pq, r.msg_found_list)
                progressed = True
            elif r.pull_status is PullStatus.NO_MATCHED_MSG:
                progressed = r.next_begin_offset != pq.next_offset or progressed
                self._correct_tags_offset(pq, r.next_begin_offset)
            elif r.pull_status is PullStatus.NO_NEW_MSG:
                self._correct_tags_offset(pq, r.next_begin_offset)
            else:  # OFFSET_ILLEGAL
                log.warning("%s: pull offset %d of %s illegal, moving to %d", self.client_id, pq.next_offset,
                            pq.mq, r.next_begin_offset)
                progressed = r.next_begin_offset != pq.next_offset or progressed
                pq.next_offset = r.next_begin_offset
                if pq.msg_count == 0:
                    self._commit(pq, r.next_begin_offset, force=True)
        return progressed

    def _correct_tags_offset(self, pq: ProcessQueue, next_offset: int) -> None:
        pq.next_offset = next_offset
        if pq.msg_count == 0:
            self._commit(pq, next_offset)

    def _dispatch(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        pq.put(msgs)
        if self.orderly:
            self._submit_orderly(pq)
            return
        n = self.consume_message_batch_max_size
        for i in range(0, len(msgs), n):
            self._submit(self._consume_concurrently, pq, msgs[i:i + n])

    def _submit(self, fn, *args) -> None:
        with self._in_flight_cond:
            self._in_flight += 1
        try:
            self._executor.submit(self._run_task, fn, *args)
        except RuntimeError:                 # executor shut down
            self._task_done()

    def _run_task(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("%s: consume task failed", self.client_id)
        finally:
            self._task_done()

    def _task_done(self) -> None:
        with self._in_flight_cond:
            self._in_flight -= 1
            self._in_flight_cond.notify_all()
        self._arrival.set()      # a queue under flow control may be pulled again

    def _call_listener(self, msgs: list[MessageExt], context) -> Any:
        view = [_prepare_for_listener(m, self.group) for m in msgs]
        try:
            status = self._listener(view, context) if self._listener_ctx else self._listener(view)
        except Exception as e:
            log.warning("%s: listener raised %r for %d message(s) of %s", self.client_id, e, len(msgs),
                        context.message_queue)
            return None
        if status is None and not self._warned_none:
            self._warned_none = True
            log.warning("%s: listener returned None; treated as %s (return a status)", self.client_id,
                        "SUSPEND_CURRENT_QUEUE_A_MOMENT" if self.orderly else "RECONSUME_LATER")
        return status

    # --- concurrently ---------------------------------------------------------------------------
    def _consume_concurrently(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        if pq.dropped or self._stopping:
            return
        ctx = ConsumeConcurrentlyContext(pq.mq)
        status = self._call_listener(msgs, ctx)
        if pq.dropped:
            return
        if status in _OK_STATUSES:
            ack_index = min(ctx.ack_index, len(msgs) - 1)
        else:
            ack_index = -1
        self.consumed += ack_index + 1
        failed = msgs[ack_index + 1:]
        later = []
        for m in failed:
            if self._send_back(m, ctx.delay_level_when_next_consume):
                self.sent_back += 1
            else:
                later.append(m)
        if later:
            retry_ids = {id(m) for m in later}
            done = [m for m in msgs if id(m) not in retry_ids]
        else:
            done = msgs
        offset = pq.remove(done)
        if later:
            for m in later:
                m.reconsume_times += 1
            self._scheduler.schedule(5.0, lambda: self._submit(self._consume_concurrently, pq, later))
        if offset >= 0:
            self._commit(pq, offset)

    def _send_back(self, msg: MessageExt, delay_level: int = 0) -> bool:
        try:
            r = self.broker.send_message_back(self.group, msg.commit_log_offset, delay_level, self.max_reconsume_times)
        except Exception:
            log.exception("%s: send back failed", self.client_id)
            return False
        return r.ok

    # --- orderly --------------------------------------------------------------------------------
    def _submit_orderly(self, pq: ProcessQueue) -> None:
        with pq.lock:
            if pq.orderly_scheduled:
                return
            pq.orderly_scheduled = True
        self._submit(self._consume_orderly, pq)

    def _consume_orderly(self, pq: ProcessQueue) -> None:
        begin = time.monotonic()
        with pq.consume_lock:
            while True:
                if pq.dropped or self._stopping:
                    with pq.lock:
                        pq.orderly_scheduled = False
                    return
                if time.monotonic() - begin > 1.0:       # let other queues have the threads
                    with pq.lock:
                        pq.orderly_scheduled = False
                    if pq.msgs:
                        self._submit_orderly(pq)
                    return
                msgs = pq.take(self.consume_message_batch_max_size)
                if not msgs:
                    with pq.lock:
                        if not pq.msgs:
                            pq.orderly_scheduled = False
                            return
                    continue
                ctx = ConsumeOrderlyContext(pq.mq)
                status = self._call_listener(msgs, ctx)
                if pq.dropped:
                    pq.put_back_taken()
                    with pq.lock:
                        pq.orderly_scheduled = False
                    return
                if status in _OK_STATUSES:
                    self.consumed += len(msgs)
                    self._commit(pq, pq.commit_taken())
                    continue
                # failure: retry the same messages locally, unless they are over the limit
                if any(m.reconsume_times >= self.max_reconsume_times for m in msgs):
                    if all(self._send_back(m, -1) for m in msgs):
                        self.sent_back += len(msgs)
                        self._commit(pq, pq.commit_taken())
                        continue
                for m in msgs:
                    m.reconsume_times += 1
                pq.put_back_taken()
                suspend = ctx.suspend_current_queue_time_millis
                if suspend < 0:
                    suspend = self.suspend_current_queue_time_millis
                self._scheduler.schedule(max(suspend, 0) / 1000.0, lambda: self._resume_orderly(pq))
                return

    def _resume_orderly(self, pq: ProcessQueue) -> None:
        with pq.lock:
            pq.orderly_scheduled = False
        if not pq.dropped and not self._stopping:
            self._submit_orderly(pq)


# --- pull consumer -------------------------------------------------------------------------------
class PullConsumer(_ConsumerBase):
    """DefaultMQPullConsumer (pull by queue and offset) plus a lite poll() over the instance's share of
    the subscribed topics' queues.

    - pull(mq, offset, max_nums, expression=None, timeout=None): one pull; with a timeout > 0 it waits
      (long polling) when there is nothing new. Offsets are the caller's business:
      update_consume_offset / fetch_consume_offset.
    - poll(timeout): messages from the queues rebalancing gave this instance, from the group's committed
      offsets; the offsets of what a poll returned are committed by the next poll(), commit() or
      shutdown() (at-least-once).
    """

    def __init__(self, store, group: str, *, consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                 consume_timestamp: int | str | None = None, pull_batch_size: int = 32,
                 broker_suspend_max_time_millis: int = 20000, instance_name: str | None = None):
        super().__init__(store, group, consume_from_where=consume_from_where, consume_timestamp=consume_timestamp,
                         instance_name=instance_name, pull_batch_size=pull_batch_size,
                         broker_suspend_max_time_millis=broker_suspend_max_time_millis)
        self._arrival = threading.Event()
        self._watched: set[tuple[str, int]] = set()
        self._uncommitted: list[tuple[ProcessQueue, list[MessageExt]]] = []
        self._rr = 0

    def start(self) -> "PullConsumer":
        if not self._running:
            self._join()
        return self

    def shutdown(self) -> None:
        if not self._running:
            return
        self.commit()
        with self._pq_lock:
            pqs = list(self._pqs.values())
        for pq in pqs:
            self._commit(pq, pq.safe_commit_offset())
            pq.dropped = True
        self._running = False
        self._leave_broker()

    def _queues_changed(self) -> None:
        with self._pq_lock:
            keys = {(mq.topic, mq.queue_id) for mq in self._pqs}
        self.broker.hub.unwatch(self._watched - keys, self._arrival)
        self.broker.hub.watch(keys - self._watched, self._arrival)
        self._watched = keys
        self._arrival.set()

    def fetch_subscribe_message_queues(self, topic: str) -> list[MessageQueue]:
        return LocalBroker.of(self.store).read_queues(topic)

    def pull(self, mq: MessageQueue, offset: int, max_nums: int = 32, expression: "str | MessageSelector | None" = None,
             timeout: float | None = None) -> PullResult:
        """Pull from a queue; with timeout (seconds) > 0, wait for messages when there are none."""
        if self.broker is None:
            self.broker = LocalBroker.of(self.store)
        if expression is None:
            sub = self.subscriptions.get(mq.topic)
        else:
            sub = SubscriptionData.build(mq.topic, expression)
        r = self._pull(mq, sub, offset, max_nums)
        if r.pull_status is not PullStatus.NO_NEW_MSG or not timeout or timeout <= 0:
            return r
        hub = self.broker.hub
        deadline = time.monotonic() + hub.suspend_time(timeout)
        ev = threading.Event()
        key = [(mq.topic, mq.queue_id)]
        hub.watch(key, ev)
        try:
            while True:
                r = self._pull(mq, sub, offset, max_nums)
                if r.pull_status is not PullStatus.NO_NEW_MSG:
                    return r
                left = deadline - time.monotonic()
                if left <= 0:
                    return r
                ev.wait(left)
                ev.clear()
        finally:
            hub.unwatch(key, ev)

    def pull_block_if_not_found(self, mq: MessageQueue, expression: str | None, offset: int,
                                max_nums: int = 32) -> PullResult:
        return self.pull(mq, offset, max_nums, expression, timeout=self.broker_suspend_max_time_millis / 1000.0)

    def send_message_back(self, msg: MessageExt, delay_level: int = 0, max_reconsume_times: int = 16) -> bool:
        return LocalBroker.of(self.store).send_message_back(self.group, msg.commit_log_offset, delay_level,
                                                            max_reconsume_times).ok

    def commit(self) -> None:
        """Commit what earlier polls returned."""
        batches, self._uncommitted = self._uncommitted, []
        for pq, msgs in batches:
            off = pq.remove(msgs)
            if off >= 0:
                self._commit(pq, off)

    def poll(self, timeout: float = 5.0) -> list[MessageExt]:
        """Messages from one of this instance's queues (in queue order), waiting up to timeout seconds."""
        if not self._running:
            raise RuntimeError("PullConsumer not started")
        self.commit()
        hub = self.broker.hub
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            self._arrival.clear()
            with self._pq_lock:
                pqs = sorted(self._pqs.values(), key=lambda p: p.mq)
            n = len(pqs)
            for i in range(n):
                pq = pqs[(self._rr + i) % n]
                if pq.dropped:
                    continue
                r = self._pull(pq.mq, self.subscriptions.get(pq.mq.topic), pq.next_offset, self.pull_batch_size)
                if r.pull_status is PullStatus.FOUND:
                    self._rr = (self._rr + i + 1) % n
                    pq.next_offset = r.next_begin_offset
                    pq.put(r.msg_found_list)
                    self._uncommitted.append((pq, r.msg_found_list))
                    return [_prepare_for_listener(m, self.group) for m in r.msg_found_list]
                pq.next_offset = r.next_begin_offset
                if r.pull_status is PullStatus.NO_MATCHED_MSG or r.pull_status is PullStatus.NO_NEW_MSG:
                    if pq.msg_count == 0:
                        self._commit(pq, r.next_begin_offset)
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            self._arrival.wait(min(left, hub.suspend_time(left)))


# --- benchmark helper ----------------------------------------------------------------------------
def measure_long_polling_latency(store_path: str | Path, n: int = 200, config=None) -> dict:
    """Latency from a put to a PushConsumer waiting on the queue receiving it (ms).

    Opens (or creates) the store at store_path, sends n messages one at a time to a 1-queue topic, each
    after the consumer has gone back to waiting, and measures from just before send() to the listener
    being called. Returns {"n", "median_ms", "p99_ms", "mean_ms", "min_ms", "max_ms"}."""
    from ..store.conf.config import StoreConfig
    from .producer import Producer
    from ..store.store import MessageStore
    cfg = config or StoreConfig(mapped_file_size_commit_log=64 << 20, mapped_file_size_consume_queue=300000 * 20)
    topic = "LongPollingLatency"
    received: dict[int, float] = {}
    cond = threading.Condition()

    def on_msgs(msgs):
        now = time.perf_counter()
        with cond:
            for m in msgs:
                received[int(m.body)] = now
            cond.notify_all()
        return CONSUME_SUCCESS

    latencies = []
    with MessageStore.open(store_path, cfg) as store:
        broker = LocalBroker.of(store)
        broker.topics.create_topic(topic, 1)
        consumer = PushConsumer(store, "long-polling-latency", on_msgs, consume_thread_nums=1)
        consumer.subscribe(topic, "*")
        consumer.start()
        producer = Producer(store, "long-polling-latency")
        try:
            for i in range(n):
                time.sleep(0.002)           # let the consumer go back to waiting
                t0 = time.perf_counter()
                producer.send(topic, str(i).encode(), queue=0)
                with cond:
                    if not cond.wait_for(lambda: i in received, timeout=5.0):
                        raise TimeoutError(f"message {i} not received within 5 s")
                latencies.append((received[i] - t0) * 1000.0)
        finally:
            consumer.shutdown()
    lat = sorted(latencies)
    p99 = lat[min(len(lat) - 1, max(0, int(round(0.99 * len(lat))) - 1))]
    return {"n": len(lat), "median_ms": statistics.median(lat), "p99_ms": p99, "mean_ms": statistics.fmean(lat),
            "min_ms": lat[0], "max_ms": lat[-1]}
