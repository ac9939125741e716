"""GroupTransfer: what slaves acknowledged, and the SYNC_MASTER puts waiting for it.

RocketMQ's HAService keeps `push2SlaveMaxOffset` (the highest offset a slave acknowledged) and
GroupTransferService, where a SYNC_MASTER put waits in the broker's only send thread. Here a put waits on
its own (`wait`, for library callers in their own thread) or not at all (`when_acked`, a callback: the
broker's event loop answers the send later and goes on with other producers meanwhile). Either way the
put's answer is PUT_OK once a slave acknowledged every byte up to the put's end, FLUSH_SLAVE_TIMEOUT when
that did not happen within syncFlushTimeout, SLAVE_NOT_AVAILABLE at once when no slave is connected or the
best one is more than haSlaveFallbehindMax behind (RocketMQ's HAService.isSlaveOK).
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import threading
import time
from collections import deque
from typing import Callable, Iterable

from ..format.message import PutMessageResult, PutMessageResults, PutMessageStatus

log = logging.getLogger(__name__)

_OK = PutMessageStatus.PUT_OK
_STORED = (PutMessageStatus.PUT_OK, PutMessageStatus.FLUSH_DISK_TIMEOUT)
Done = Callable[[PutMessageStatus], None]


class _Waiter:
    __slots__ = ("end", "deadline", "done", "fired")

    def __init__(self, end: int, deadline: float, done: Done):
        self.end, self.deadline, self.done, self.fired = end, deadline, done, False


class GroupTransfer:
    """Slave acknowledgements and the puts waiting for them (module docstring). Thread-safe."""

    def __init__(self, fallbehind_max: int, timeout_ms: int):
        self.fallbehind_max = fallbehind_max
        self.timeout = timeout_ms / 1000.0
        self._lock = threading.Lock()
        self.acked = 0              # push2SlaveMaxOffset: the highest offset a slave acknowledged
        self.slaves = 0             # connected slaves (RocketMQ's connectionCount)
        self._by_end: list = []     # heap of (end, seq, waiter)
        self._by_deadline: deque[_Waiter] = deque()     # registration order = deadline order
        self._seq = itertools.count()
        self.timed_out = 0          # puts answered FLUSH_SLAVE_TIMEOUT
        self.not_available = 0      # puts answered SLAVE_NOT_AVAILABLE

    # --- the slaves' side ---------------------------------------------------------------------------
    def slave_connected(self) -> None:
        with self._lock:
            self.slaves += 1

    def slave_disconnected(self) -> None:
        with self._lock:
            self.slaves = max(0, self.slaves - 1)

    def acknowledge(self, offset: int) -> None:
        """A slave holds every byte below offset: wake the puts that waited for no more."""
        fire = []
        with self._lock:
            if offset <= self.acked:
                return
            self.acked = offset
            heap = self._by_end
            while heap and heap[0][0] <= offset:
                w = heapq.heappop(heap)[2]
                if not w.fired:
                    w.fired = True
                    fire.append(w)
        for w in fire:
            _call(w.done, _OK)

    def expire(self, now: float | None = None) -> int:
        """Answer FLUSH_SLAVE_TIMEOUT to the waits past their deadline (called every ~50 ms by the HA
        service's loop); returns how many."""
        now = time.monotonic() if now is None else now
        fire = []
        with self._lock:
            q = self._by_deadline
            while q and (q[0].fired or q[0].deadline <= now):
                w = q.popleft()
                if not w.fired:
                    w.fired = True
                    fire.append(w)
            if len(self._by_end) > 2 * len(q) + 64:         # fired ones left in the heap: drop them
                self._by_end = [e for e in self._by_end if not e[2].fired]
                heapq.heapify(self._by_end)
            self.timed_out += len(fire)
        for w in fire:
            _call(w.done, PutMessageStatus.FLUSH_SLAVE_TIMEOUT)
        return len(fire)

    def fail_all(self) -> None:
        """Shutdown: every wait answers FLUSH_SLAVE_TIMEOUT now (the messages are stored on the master)."""
        self.expire(float("inf"))

    # --- the puts' side -----------------------------------------------------------------------------
    def slave_ok(self, master_put_where: int) -> bool:
        """RocketMQ's HAService.isSlaveOK: a slave is connected and not too far behind."""
        return self.slaves > 0 and master_put_where - self.acked < self.fallbehind_max

    def when_acked(self, end: int, done: Done) -> None:
        """Call done(status) once a slave acknowledged `end` (PUT_OK), after the timeout
        (FLUSH_SLAVE_TIMEOUT), or at once (SLAVE_NOT_AVAILABLE, or PUT_OK when already acknowledged).
        done runs in whichever thread decides: keep it short and thread-safe."""
        with self._lock:
            if end <= self.acked:
                status = _OK
            elif not (self.slaves > 0 and end - self.acked < self.fallbehind_max):
                status = PutMessageStatus.SLAVE_NOT_AVAILABLE
                self.not_available += 1
            else:
                w = _Waiter(end, time.monotonic() + self.timeout, done)
                heapq.heappush(self._by_end, (end, next(self._seq), w))
                self._by_deadline.append(w)
                return
        _call(done, status)

    def wait(self, end: int) -> PutMessageStatus:
        """when_acked, blocking the calling thread (at most the timeout, plus the expiry tick)."""
        got: list = []
        ev = threading.Event()

        def done(status: PutMessageStatus) -> None:
            got.append(status)
            ev.set()
        self.when_acked(end, done)
        if not ev.wait(self.timeout + 1.0):     # the HA loop's expiry did not run (shut down meanwhile)
            with self._lock:
                self.timed_out += 1
            return PutMessageStatus.FLUSH_SLAVE_TIMEOUT
        return got[0]

    @property
    def waiting(self) -> int:
        with self._lock:
            return sum(1 for w in self._by_deadline if not w.fired)


def _call(done: Done, status: PutMessageStatus) -> None:
    try:
        done(status)
    except Exception:       # a caller's bug must not stop the acknowledgements of others
        log.exception("a SYNC_MASTER put's callback failed")


def answer_on(loop, fn: Callable[[object], None]) -> Callable[[object], None]:
    """A when_replicated callback that runs fn(results) in loop's thread: at once when it is called there (a
    broker whose loop the HA port runs on: the slave's report answers the send in the same turn), else
    handed to the loop (call_soon_threadsafe)."""
    def done(results) -> None:
        try:
            here = asyncio.get_running_loop() is loop
        except RuntimeError:
            here = False
        if here:
            fn(results)
        else:
            loop.call_soon_threadsafe(fn, results)
    return done


# --- what a put waits for ------------------------------------------------------------------------------
def wants_of(msgs) -> list[bool] | None:
    """Which messages wait for the slave: all but those whose WAIT property is "false" (RocketMQ's
    Message.isWaitStoreMsgOK). None: every message (the common case, without a list)."""
    props = getattr(msgs, "properties", None)
    if isinstance(props, dict):                 # a MessageBatch: columns, or one dict for all
        col = props.get("WAIT")
        if col is None:
            return None
        vals = [col] * len(msgs) if isinstance(col, str) else list(col)
        return None if "false" not in vals else [v != "false" for v in vals]
    flags = [not (m.properties and m.properties.get("WAIT") == "false") for m in msgs]
    return None if all(flags) else flags


def wait_end(results, wants: Iterable[bool] | None = None) -> int:
    """The commitlog offset a SYNC_MASTER put of these results waits for: the end of the last stored record
    (whose message wants to wait: `wants`, RocketMQ's WAIT property; None: all). 0: nothing to wait for."""
    if type(results) is PutMessageResults:
        if not results.appended or (wants is not None and not any(wants)):
            return 0
        return results.stored_end
    end = 0
    for i, r in enumerate(results):
        if r.status in _STORED and (wants is None or wants[i]):
            end = max(end, r.wrote_end or 0)
    return end


def with_status(results, status: PutMessageStatus):
    """results with every stored message answering status (FLUSH_SLAVE_TIMEOUT / SLAVE_NOT_AVAILABLE: the
    HA outcome replaces a flush outcome, as RocketMQ's handleHA does)."""
    if status is _OK:
        return results
    if type(results) is PutMessageResults:
        results.mark_flush_failed(status)
        return results
    return [PutMessageResult(status, r.append_result, r.reason) if r.append_result is not None and r.status in _STORED
            else r for r in results]
