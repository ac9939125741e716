"""Long polling for in-process consumers (RocketMQ's PullRequestHoldService + NotifyMessageArrivingListener).

A pull that finds nothing waits instead of returning at once. The dispatcher tells the hub, for each batch
it dispatches, which (topic, queue) got messages (Dispatcher.add_listener); the hub wakes every waiter
registered for that queue at once. Waiters are plain threading.Events, so one consumer thread can wait
on all of its queues with a single event.

With longPollingEnable off, nothing is woken early: a pull that found nothing waits shortPollingTimeMills
and looks once more (the broker's short polling).
"""
from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Callable, Iterable

if TYPE_CHECKING:  # pragma: no cover
    from ..store.store import MessageStore

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]


class ArrivalHub:
    def __init__(self, store: "MessageStore", long_polling_enable: bool | None = None,
                 short_polling_time_mills: int | None = None):
        cfg = store.config
        self.store = store
        self.long_polling_enable = cfg.long_polling_enable if long_polling_enable is None else long_polling_enable
        self.short_polling_time_mills = (cfg.short_polling_time_mills if short_polling_time_mills is None
                                         else short_polling_time_mills)
        self._waiters: dict[QueueKey, set[threading.Event]] = {}
        self._lock = threading.Lock()
        self._known: set[QueueKey] = {(cq.topic, cq.queue_id) for cq in store.consume_queues}
        self.on_new_queue: Callable[[str, int], None] | None = None
        store.dispatcher.add_listener(self._on_arrival)

    def close(self) -> None:
        self.store.dispatcher.remove_listener(self._on_arrival)
        with self._lock:
            waiters = [e for s in self._waiters.values() for e in s]
            self._waiters.clear()
        for e in waiters:
            e.set()

    # called on the dispatcher thread: keep it cheap
    def _on_arrival(self, topic: str, queue_id: int, next_offset: int, store_ts: int) -> None:
        key = (topic, queue_id)
        ws = self._waiters.get(key)
        if ws:
            for e in tuple(ws):
                e.set()
        if key not in self._known:
            self._known.add(key)
            cb = self.on_new_queue
            if cb is not None:
                try:
                    cb(topic, queue_id)
                except Exception:
                    log.exception("new-queue callback failed")

    def watch(self, keys: Iterable[QueueKey], event: threading.Event) -> None:
        """Set `event` whenever one of these queues receives messages (no-op without long polling)."""
        if not self.long_polling_enable:
            return
        with self._lock:
            for k in keys:
                self._waiters.setdefault(k, set()).add(event)

    def unwatch(self, keys: Iterable[QueueKey], event: threading.Event) -> None:
        with self._lock:
            for k in keys:
                s = self._waiters.get(k)
                if s is not None:
                    s.discard(event)
                    if not s:
                        del self._waiters[k]

    def suspend_time(self, wanted_s: float) -> float:
        """How long a pull that found nothing is held: the wanted time when long polling (woken early on
        arrival), else shortPollingTimeMills (never longer than wanted)."""
        if self.long_polling_enable:
            return wanted_s
        return min(wanted_s, self.short_polling_time_mills / 1000.0)
