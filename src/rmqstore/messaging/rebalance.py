"""Sharing a topic's queues among the consumer instances of a group (clustering mode).

AllocateMessageQueueAveragely, as RocketMQ's client: queues and client ids sorted; with q queues and c
clients, client i gets a contiguous run of q/c queues, the first q%c clients one more.

The registry is the in-process stand-in for the broker's ConsumerManager plus the clients' RebalanceService:
one per store (see local_broker), group -> live instances. A join or a leave rebalances the group at once
and synchronously: every instance first gives up the queues it loses (finishing or abandoning their
in-flight work and committing its offsets), then every instance takes the queues it gains, starting from
the committed offsets. A topic's queue set changing (topic created or altered, or messages arriving in a
queue not seen before) rebalances the groups subscribed to it on the registry's own thread, which also
rebalances every group every 20 s as RocketMQ's RebalanceService does.
"""
from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Protocol, Sequence

from ..common.allocate import allocate_averagely

if TYPE_CHECKING:  # pragma: no cover
    from .topic_config import MessageQueue

log = logging.getLogger(__name__)

REBALANCE_INTERVAL_S = 20.0


class RebalanceMember(Protocol):
    group: str
    client_id: str

    def subscribed_topics(self) -> set[str]: ...

    def _rebalance_release(self, keep: set["MessageQueue"]) -> None: ...

    def _rebalance_acquire(self, wanted: set["MessageQueue"]) -> None: ...


class QueueSource(Protocol):
    """Where the registry learns a topic's queues (the LocalBroker)."""

    def read_queues(self, topic: str) -> Sequence["MessageQueue"]: ...


class ConsumerRegistry:
    def __init__(self, broker: "QueueSource"):
        self.broker = broker
        self._groups: dict[str, list[RebalanceMember]] = {}
        self._lock = threading.RLock()
        self._pending_topics: set[str] = set()
        self._pending_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- membership -----------------------------------------------------------------------------
    def register(self, member: RebalanceMember) -> None:
        with self._lock:
            members = self._groups.setdefault(member.group, [])
            if any(m.client_id == member.client_id for m in members):
                raise ValueError(f"client id {member.client_id} already in group {member.group}")
            members.append(member)
            self.rebalance(member.group)
        self._ensure_thread()

    def unregister(self, member: RebalanceMember) -> None:
        with self._lock:
            members = self._groups.get(member.group, [])
            if member in members:
                members.remove(member)
            if not members:
                self._groups.pop(member.group, None)
            else:
                self.rebalance(member.group)

    def members(self, group: str) -> list[RebalanceMember]:
        with self._lock:
            return sorted(self._groups.get(group, []), key=lambda m: m.client_id)

    def groups(self) -> list[str]:
        with self._lock:
            return list(self._groups)

    def all_members(self) -> list[RebalanceMember]:
        with self._lock:
            return [m for ms in self._groups.values() for m in ms]

    # --- rebalancing ----------------------------------------------------------------------------
    def plan(self, group: str) -> dict[str, set["MessageQueue"]]:
        """client id -> the queues it should own now."""
        members = self.members(group)
        out: dict[str, set] = {m.client_id: set() for m in members}
        topics: set[str] = set()
        for m in members:
            topics |= m.subscribed_topics()
        for topic in sorted(topics):
            subs = [m for m in members if topic in m.subscribed_topics()]
            mq_all = self.broker.read_queues(topic)
            if not mq_all:
                continue
            cids = [m.client_id for m in subs]
            for m in subs:
                out[m.client_id].update(allocate_averagely(group, m.client_id, mq_all, cids))
        return out

    def rebalance(self, group: str) -> None:
        with self._lock:
            members = self.members(group)
            if not members:
                return
            plan = self.plan(group)
            for m in members:        # first everyone lets go ...
                try:
                    m._rebalance_release(plan[m.client_id])
                except Exception:
                    log.exception("rebalance of %s: release failed", m.client_id)
            for m in members:        # ... then everyone takes over
                try:
                    m._rebalance_acquire(plan[m.client_id])
                except Exception:
                    log.exception("rebalance of %s: acquire failed", m.client_id)

    def topic_changed(self, topic: str) -> None:
        """Queue set of a topic changed: rebalance its groups soon, on the registry thread. Called with
        other locks held (topic manager, dispatcher), so it only records the topic."""
        with self._pending_lock:
            self._pending_topics.add(topic)
        self._wake.set()

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="RebalanceService", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            woke = self._wake.wait(REBALANCE_INTERVAL_S)
            self._wake.clear()
            if self._stop.is_set():
                break
            with self._pending_lock:
                topics, self._pending_topics = self._pending_topics, set()
            with self._lock:
                if woke:
                    groups = {g for g, ms in self._groups.items()
                              if any(t in m.subscribed_topics() for m in ms for t in topics)}
                else:
                    groups = set(self._groups)
            for g in groups:
                try:
                    self.rebalance(g)
                except Exception:
                    log.exception("rebalance of group %s failed", g)

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        t, self._thread = self._thread, None
        if t is not None and t is not threading.current_thread():
            t.join(timeout=10)
