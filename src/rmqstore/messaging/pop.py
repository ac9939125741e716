"""POP consumption (RocketMQ 5's PopMessageProcessor / AckMessageProcessor / ChangeInvisibleTimeProcessor),
over the store's consume queues: a consumer group receives messages that then stay invisible to the group
for an invisible duration; an ack by receipt handle ends them; what is not acked in time is delivered again
with its delivery attempt counted, and after maxReconsumeTimes redeliveries goes to %DLQ%{group}.

    pop = PopService(store, local_broker)
    got = pop.receive("g", "T", max_nums=32, invisible_ms=30_000)       # [Popped(message, handle, attempt)]
    pop.ack("g", "T", got[0].handle)                                     # AckResult.OK
    pop.change_invisible("g", "T", handle, 5_000)                        # a new ReceiptHandle

Receipt handles have RocketMQ 5's layout (ReceiptHandle.encode): "startOffset retrieveTime invisibleTime
reviveQueueId topicType brokerName queueId offset commitLogOffset", space separated.

Durable state (rmqstore's own design, not RocketMQ's revive topic): `{store}/pop/popState.log`, JSON lines,
one per change, written (write(2), no buffering) before the answer:
    {"op":"pop","g":group,"t":topic,"q":queueId,"n":nextOffset,"pt":popTime,"vis":visibleAt,
     "o":[queueOffsets],"cl":[commitLogOffsets],"a":[attempts],"f":[0|1 (FIFO)]}
    {"op":"ack","g":..,"t":..,"q":..,"o":queueOffset}
    {"op":"chg","g":..,"t":..,"q":..,"o":queueOffset,"pt":popTime,"vis":visibleAt}
Opening replays it and rewrites it compacted (one "pop" line per queue holding what is in flight) by an
atomic rename; so does tick() once COMPACT_BYTES were appended. The log is fsynced at most every
FSYNC_INTERVAL seconds: a kill of the process loses nothing, a power loss at most that much (acked
messages become visible again: at-least-once). The lowest offset still in flight of each queue is
committed to consumerOffset.json as the group's offset.
A group with no state starts at its committed offset, else at the queue's first message.

FIFO (RocketMQ 5.0's queue-level order): a message with a message group (__SHARDINGKEY; a group's
messages all go to one queue) is delivered alone, and its queue gives the consumer group nothing more until
that message is acked, dead-lettered, or its invisible time runs out (then it is delivered again, first).
Log records carry "f": [0|1] per offset for this."""
from __future__ import annotations

import enum
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..store.format.message import GetMessageStatus, MessageExt

log = logging.getLogger(__name__)

FSYNC_INTERVAL = 1.0
COMPACT_BYTES = 64 * 1024 * 1024       # the log is rewritten (compacted) past this size
DEFAULT_MAX_RECONSUME_TIMES = 16
MIN_INVISIBLE_MS = 1_000
MAX_INVISIBLE_MS = 12 * 3600 * 1000
PROPERTY_SHARDING_KEY = "__SHARDINGKEY"         # a message's message group (FIFO)


def now_ms() -> int:
    return int(time.time() * 1000)


# --- receipt handles -------------------------------------------------------------------------------------
class InvalidReceiptHandle(ValueError):
    """A receipt handle that cannot be parsed."""


@dataclass(frozen=True, slots=True)
class ReceiptHandle:
    queue_offset: int
    retrieve_time_ms: int
    invisible_ms: int
    queue_id: int
    commit_log_offset: int
    broker_name: str
    revive_queue_id: int = 0
    topic_type: str = "0"          # RocketMQ: "0" normal topic, "1" retry topic, "2" retry topic v2

    def encode(self) -> str:
        return " ".join(str(x) for x in (self.queue_offset, self.retrieve_time_ms, self.invisible_ms,
                                         self.revive_queue_id, self.topic_type, self.broker_name, self.queue_id,
                                         self.queue_offset, self.commit_log_offset))

    @classmethod
    def decode(cls, s: str) -> "ReceiptHandle":
        parts = s.split(" ")
        if len(parts) != 9:
            raise InvalidReceiptHandle(f"receipt handle {s[:80]!r}: {len(parts)} fields, expected 9")
        try:
            start, rt, inv, rq, _tt, _bn, qid, off, cl = (int(p) if i not in (4, 5) else 0
                                                          for i, p in enumerate(parts))
        except ValueError as e:
            raise InvalidReceiptHandle(f"receipt handle {s[:80]!r}: {e}") from None
        if start != off or min(rt, inv, qid, off, cl) < 0:
            raise InvalidReceiptHandle(f"receipt handle {s[:80]!r}: inconsistent fields")
        return cls(off, rt, inv, qid, cl, parts[5], rq, parts[4])

    @property
    def expire_ms(self) -> int:
        return self.retrieve_time_ms + self.invisible_ms


# --- state ----------------------------------------------------------------------------------------------
@dataclass(slots=True)
class Inflight:
    commit_log_offset: int
    pop_time_ms: int
    visible_at_ms: int
    attempts: int                  # deliveries so far (delivery_attempt of the last one)
    fifo: bool = False             # a message of a message group (__SHARDINGKEY): its queue waits for it


@dataclass(slots=True)
class QueueState:
    next_offset: int
    inflight: dict[int, Inflight] = field(default_factory=dict)

    def low_offset(self) -> int:
        return min(self.inflight, default=self.next_offset)


class AckResult(enum.Enum):
    OK = "OK"
    EXPIRED = "EXPIRED"            # the handle's invisible time ran out, or the message was delivered again
    NOT_FOUND = "NOT_FOUND"        # nothing in flight at that offset (already acked, or never popped)


@dataclass(slots=True)
class Popped:
    message: MessageExt
    handle: ReceiptHandle
    attempt: int


Key = tuple[str, str, int]


class PopStateLog:
    """popState.log: the JSON lines above; replay() then compact() on open, append() per change."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None
        self._last_sync = 0.0
        self._dirty = False
        self.appended = 0                  # bytes appended since the last compaction

    def replay(self) -> dict[Key, QueueState]:
        states: dict[Key, QueueState] = {}
        if not self.path.exists():
            return states
        with open(self.path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                if not line.endswith(b"\n"):
                    log.warning("%s: line %d is torn (a crash while writing it): ignored", self.path, lineno)
                    break
                try:
                    self._apply(states, json.loads(line))
                except (ValueError, KeyError, TypeError) as e:
                    log.warning("%s: line %d unreadable (%s): ignored", self.path, lineno, e)
        return states

    @staticmethod
    def _apply(states: dict[Key, QueueState], r: dict) -> None:
        key = (r["g"], r["t"], int(r["q"]))
        st = states.get(key)
        op = r["op"]
        if op == "pop":
            if st is None:
                st = states[key] = QueueState(int(r["n"]))
            st.next_offset = max(st.next_offset, int(r["n"]))
            fifo = r.get("f") or [0] * len(r["o"])
            for o, cl, a, f in zip(r["o"], r["cl"], r["a"], fifo):
                st.inflight[int(o)] = Inflight(int(cl), int(r["pt"]), int(r["vis"]), int(a), bool(f))
        elif st is not None and op == "ack":
            st.inflight.pop(int(r["o"]), None)
        elif st is not None and op == "chg":
            e = st.inflight.get(int(r["o"]))
            if e is not None:
                e.pop_time_ms, e.visible_at_ms = int(r["pt"]), int(r["vis"])

    def compact(self, states: dict[Key, QueueState]) -> None:
        """Rewrite the log as one pop record per queue (atomic rename), then open it for appending."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            for (g, t, q), st in states.items():
                # one record per distinct (popTime, visibleAt) keeps each entry's own times
                groups: dict[tuple[int, int], list[tuple[int, Inflight]]] = {}
                for o, e in sorted(st.inflight.items()):
                    groups.setdefault((e.pop_time_ms, e.visible_at_ms), []).append((o, e))
                if not groups:
                    groups[(0, 0)] = []
                for (pt, vis), es in groups.items():
                    f.write(json.dumps({"op": "pop", "g": g, "t": t, "q": q, "n": st.next_offset, "pt": pt,
                                        "vis": vis, "o": [o for o, _ in es],
                                        "cl": [e.commit_log_offset for _, e in es],
                                        "a": [e.attempts for _, e in es],
                                        "f": [int(e.fifo) for _, e in es]}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self.appended = 0

    def append(self, record: dict) -> None:
        if self._fd is None:
            raise RuntimeError(f"{self.path} is not open")
        data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        os.write(self._fd, data)
        self.appended += len(data)
        self._dirty = True

    def sync(self, force: bool = False) -> None:
        if self._fd is not None and self._dirty and (force or time.monotonic() - self._last_sync >= FSYNC_INTERVAL):
            os.fsync(self._fd)
            self._dirty = False
            self._last_sync = time.monotonic()

    def close(self) -> None:
        if self._fd is not None:
            self.sync(force=True)
            os.close(self._fd)
            self._fd = None


# --- the service ------------------------------------------------------------------------------------------
class PopService:
    """POP receive / ack / change-invisible / dead-letter over a store and its LocalBroker."""

    def __init__(self, store, local, *, max_reconsume_times: Callable[[str], int] | None = None):
        self.store = store
        self.local = local
        self.broker_name = store.config.broker_name
        self.max_reconsume_times = max_reconsume_times or (lambda _g: DEFAULT_MAX_RECONSUME_TIMES)
        self.log = PopStateLog(Path(store.path) / "pop" / "popState.log")
        self.states: dict[Key, QueueState] = {}
        self._lock = threading.RLock()

    def start(self) -> None:
        with self._lock:
            self.states = self.log.replay()
            self.log.compact(self.states)

    def shutdown(self) -> None:
        with self._lock:
            self.log.close()

    def tick(self) -> None:
        """Periodic: fsync the log (every FSYNC_INTERVAL); compact it past COMPACT_BYTES."""
        with self._lock:
            if self.log.appended > COMPACT_BYTES:
                self.log.compact(self.states)
            else:
                self.log.sync()

    # --- receive ----------------------------------------------------------------------------------
    def _state(self, group: str, topic: str, qid: int) -> QueueState:
        key = (group, topic, qid)
        st = self.states.get(key)
        if st is None:
            committed = self.local.offsets.query_offset(group, topic, qid)
            start = committed if committed >= 0 else max(0, self.store.get_min_offset_in_queue(topic, qid))
            st = self.states[key] = QueueState(start)
        return st

    def receive(self, group: str, topic: str, max_nums: int, invisible_ms: int, *,
                accept: Callable[[MessageExt], bool] | None = None) -> list[Popped]:
        """Up to max_nums messages of the topic's queues for the group: first those whose invisible time ran
        out (delivered again, or dead-lettered after maxReconsumeTimes), then new ones. Messages that
        `accept` refuses (a tag filter) are passed over as consumed."""
        invisible_ms = max(MIN_INVISIBLE_MS, min(MAX_INVISIBLE_MS, invisible_ms))
        out: list[Popped] = []
        with self._lock:
            now = now_ms()
            qids = [mq.queue_id for mq in self.local.read_queues(topic)]
            for qid in qids:
                if len(out) >= max_nums:
                    break
                st = self._state(group, topic, qid)
                out += self._revive(group, topic, qid, st, now, max_nums - len(out), invisible_ms)
                if any(e.fifo for e in st.inflight.values()):
                    continue            # FIFO: the queue waits for its message group's message in flight
                out += self._pop_new(group, topic, qid, st, now, max_nums - len(out), invisible_ms, accept)
        return out

    def _revive(self, group, topic, qid, st: QueueState, now: int, room: int, invisible_ms: int) -> list[Popped]:
        """The queue's in-flight messages whose invisible time ran out, in offset order."""
        due = sorted(o for o, e in st.inflight.items() if e.visible_at_ms <= now)
        if not due or room <= 0:
            return []
        max_times = self.max_reconsume_times(group)
        out: list[Popped] = []
        for o in due:
            if len(out) >= room:
                break
            e = st.inflight[o]
            msg = self.store.look_message_by_offset(e.commit_log_offset)
            if msg is None:
                log.warning("pop %s %s:%d: message at queue offset %d (commitlog %d) is gone; dropped from flight",
                            group, topic, qid, o, e.commit_log_offset)
                self._ack_record(group, topic, qid, st, o)
                continue
            if e.attempts - 1 >= max_times:
                self._dead_letter(group, msg, e.attempts - 1)
                self._ack_record(group, topic, qid, st, o)
                continue
            e.attempts += 1
            t = max(now, e.pop_time_ms + 1)
            e.pop_time_ms, e.visible_at_ms = t, t + invisible_ms
            self.log.append({"op": "pop", "g": group, "t": topic, "q": qid, "n": st.next_offset, "pt": t,
                             "vis": e.visible_at_ms, "o": [o], "cl": [e.commit_log_offset], "a": [e.attempts],
                             "f": [int(e.fifo)]})
            out.append(Popped(msg, self._handle(qid, o, e, invisible_ms), e.attempts))
            if e.fifo:
                break
        return out

    def _pop_new(self, group, topic, qid, st: QueueState, now: int, room: int, invisible_ms: int,
                 accept) -> list[Popped]:
        if room <= 0:
            return []
        r = self.store.get_message(group, topic, qid, st.next_offset, room)
        if r.status in (GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.OFFSET_OVERFLOW_BADLY,
                        GetMessageStatus.OFFSET_FOUND_NULL):
            log.warning("pop %s %s:%d: offset %d is %s; moved to %d", group, topic, qid, st.next_offset,
                        r.status.value, r.next_begin_offset)
            st.next_offset = r.next_begin_offset
            return []
        msgs = r.messages if r.status is GetMessageStatus.FOUND else []
        nxt = r.next_begin_offset if msgs or r.status is GetMessageStatus.NO_MATCHED_MESSAGE else st.next_offset
        out: list[Popped] = []
        rec_o, rec_cl = [], []
        for m in msgs:
            if accept is not None and not accept(m):
                continue
            fifo = PROPERTY_SHARDING_KEY in m.properties
            e = Inflight(m.commit_log_offset, now, now + invisible_ms, m.reconsume_times + 1, fifo)
            st.inflight[m.queue_offset] = e
            rec_o.append(m.queue_offset)
            rec_cl.append(m.commit_log_offset)
            out.append(Popped(m, self._handle(qid, m.queue_offset, e, invisible_ms), e.attempts))
            if fifo:                    # nothing after a message group's message until it is done
                nxt = m.queue_offset + 1
                break
        if nxt != st.next_offset or out:
            st.next_offset = max(st.next_offset, nxt)
            self.log.append({"op": "pop", "g": group, "t": topic, "q": qid, "n": st.next_offset, "pt": now,
                             "vis": now + invisible_ms, "o": rec_o, "cl": rec_cl, "a": [p.attempt for p in out],
                             "f": [int(st.inflight[o].fifo) for o in rec_o]})
            self._commit(group, topic, qid, st)
        return out

    def _handle(self, qid: int, offset: int, e: Inflight, invisible_ms: int) -> ReceiptHandle:
        return ReceiptHandle(offset, e.pop_time_ms, invisible_ms, qid, e.commit_log_offset, self.broker_name)

    # --- ack / change / dead letter ------------------------------------------------------------------
    def _check(self, group: str, topic: str, h: ReceiptHandle, now: int) -> tuple[QueueState | None, AckResult]:
        st = self.states.get((group, topic, h.queue_id))
        e = st.inflight.get(h.queue_offset) if st is not None else None
        if e is None:
            return st, AckResult.NOT_FOUND
        if e.pop_time_ms != h.retrieve_time_ms or now >= h.expire_ms:
            return st, AckResult.EXPIRED
        return st, AckResult.OK

    def ack(self, group: str, topic: str, h: ReceiptHandle) -> AckResult:
        with self._lock:
            st, res = self._check(group, topic, h, now_ms())
            if res is AckResult.OK:
                self._ack_record(group, topic, h.queue_id, st, h.queue_offset)
            return res

    def change_invisible(self, group: str, topic: str, h: ReceiptHandle,
                         invisible_ms: int) -> tuple[AckResult, ReceiptHandle | None]:
        invisible_ms = max(0, min(MAX_INVISIBLE_MS, invisible_ms))
        with self._lock:
            now = now_ms()
            st, res = self._check(group, topic, h, now)
            if res is not AckResult.OK:
                return res, None
            e = st.inflight[h.queue_offset]
            now = max(now, e.pop_time_ms + 1)       # the retrieve time tells handles apart: the old one is spent
            e.pop_time_ms, e.visible_at_ms = now, now + invisible_ms
            self.log.append({"op": "chg", "g": group, "t": topic, "q": h.queue_id, "o": h.queue_offset,
                             "pt": now, "vis": e.visible_at_ms})
            return res, self._handle(h.queue_id, h.queue_offset, e, invisible_ms)

    def forward_to_dead_letter(self, group: str, topic: str, h: ReceiptHandle) -> AckResult:
        with self._lock:
            st, res = self._check(group, topic, h, now_ms())
            if res is not AckResult.OK:
                return res
            e = st.inflight[h.queue_offset]
            msg = self.store.look_message_by_offset(e.commit_log_offset)
            if msg is not None:
                self._dead_letter(group, msg, e.attempts - 1)
            self._ack_record(group, topic, h.queue_id, st, h.queue_offset)
            return res

    def _dead_letter(self, group: str, msg: MessageExt, reconsumed: int) -> None:
        r = self.local.send_message_back(group, msg.commit_log_offset, -1, self.max_reconsume_times(group))
        log.info("pop %s: message %s of %s after %d redeliveries to %%DLQ%%%s: %s", group, msg.msg_id, msg.topic,
                 reconsumed, group, r.status.value)

    def _ack_record(self, group: str, topic: str, qid: int, st: QueueState, offset: int) -> None:
        st.inflight.pop(offset, None)
        self.log.append({"op": "ack", "g": group, "t": topic, "q": qid, "o": offset})
        self._commit(group, topic, qid, st)

    def _commit(self, group: str, topic: str, qid: int, st: QueueState) -> None:
        self.local.offsets.commit_offset(group, topic, qid, st.low_offset())

    def next_visible_ms(self, group: str, topic: str) -> int | None:
        """The earliest time an in-flight message of the group's topic becomes visible again."""
        with self._lock:
            times = [e.visible_at_ms for (g, t, _q), st in self.states.items() if g == group and t == topic
                     for e in st.inflight.values()]
        return min(times, default=None)
