"""UnitRepairService: a consume queue unit a read found damaged, repaired on the open store.

A unit that names another record than its queue's (another topic, queue or queue offset, another size), no
record at all, or points past the commitlog's end was skipped by reads: a consumer reading through it moved past an
acknowledged message that the commitlog still holds. Now the read stops before it and asks this service,
which repairs the queue as the background check does (recovery.repair_queues_live: cut at the unit,
rebuilt from the commitlog by the dispatcher; readers see the queue's max offset unchanged meanwhile), in
its own thread, not the reader's; the failure channel gets a CORRUPT_UNIT naming the file and byte offset.

Each damage is repaired once: after the attempt the unit is settled with the values it had, and a read
that still finds those values (the commitlog does not parse from its record on, so nothing was rebuilt)
skips it as before; other values there are new damage, repaired again. Without this
service (a store opened without its services) reads skip damaged units.
"""
from __future__ import annotations

import logging
import queue
import threading

from ..consumequeue.consume_queue import UNIT
from ..recovery.queue_check import UNIT_OTHER_QUEUE
from ..recovery.recovery import repair_queues_live
from ..state.failure import FailureChannel, FailureKind

log = logging.getLogger(__name__)

NAME = "unit_repair"                # MessageStore.service(NAME)


class UnitRepairService:
    def __init__(self, commit_log, dispatcher, failures: FailureChannel):
        self.commit_log = commit_log
        self.dispatcher = dispatcher
        self.failures = failures
        self._pending: set[tuple[int, int]] = set()     # (id of the queue, unit) asked for, not yet settled
        self._settled: dict[tuple[int, int], tuple] = {}     # ... attempted, with the unit's values then
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.repaired = 0               # repairs that cut and rebuilt a queue

    def request(self, cq, unit: int, values: tuple) -> bool:
        """True: the unit (with the values a read found, (offset, size, tags code)) is (to be) repaired, the
        read stops before it; False: a repair attempt left it with these values, the read skips it."""
        key = (id(cq), unit)
        with self._lock:
            if self._settled.get(key) == values or self._thread is None:
                return False
            if key not in self._pending:
                self._pending.add(key)
                self._requests.put((cq, unit))
            return True

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="unit-repair", daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        t, self._thread = self._thread, None
        if t is not None:
            self._requests.put(None)
            t.join(30)

    def _run(self) -> None:
        while True:
            item = self._requests.get()
            if item is None:
                return
            cq, unit = item
            try:
                self._repair(cq, unit)
            except Exception:       # the read skips the unit as before; the next open checks the queue
                log.exception("%s: unit %d: the repair failed", cq.queue.store_path, unit)
            now = cq.get_unit(unit)
            with self._lock:
                self._pending.discard((id(cq), unit))
                self._settled[(id(cq), unit)] = tuple(now) if now is not None else None

    def _repair(self, cq, unit: int) -> None:
        done = repair_unit(self.commit_log, self.dispatcher, self.failures, cq, unit, UNIT_OTHER_QUEUE,
                           "found damaged by a read")
        if done is not None:
            self.repaired += 1
            log.warning("%s: %s", *done)


def repair_unit(commit_log, dispatcher, failures: FailureChannel, cq, bad: int, code: int,
                found: str) -> tuple[str, str] | None:
    """Unit `bad` of cq found damaged (`found`: how, for the reason) on the open store: the queue cut there
    and rebuilt from the commitlog (recovery.repair_queues_live), a CORRUPT_UNIT naming the file and byte
    offset on the failure channel. Returns (path, reason), or None when there was nothing to do: the queue
    was deleted, or is whole again (another repair did it, and reported it). The background check's repair
    and this service's."""
    if dispatcher.consume_queues.find(cq.topic, cq.queue_id) is not cq:
        return None
    mf = cq.queue.find_mapped_file_by_offset(bad * UNIT)
    path = str(mf.path) if mf is not None else str(cq.queue.store_path)
    done = repair_queues_live(commit_log, dispatcher, [(cq, bad, code)])
    if not done:
        return None
    reason = f"unit {bad} {found}; {done[0]}"
    failures.report(FailureKind.CORRUPT_UNIT, reason, path=path,
                    offset=bad * UNIT - (mf.file_from_offset if mf is not None else 0))
    return path, reason
