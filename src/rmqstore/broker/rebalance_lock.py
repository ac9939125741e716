"""RebalanceLockManager: which client holds each message queue of a group for ordered consumption (a lock
not renewed within REBALANCE_LOCK_MAX_LIVE_TIME expires)."""
from __future__ import annotations

import time

REBALANCE_LOCK_MAX_LIVE_TIME = 60.0      # s


class RebalanceLockManager:
    def __init__(self):
        self.locks: dict[tuple[str, str, str, int], tuple[str, float]] = {}

    @staticmethod
    def _key(group: str, mq: dict) -> tuple[str, str, str, int]:
        return group, str(mq.get("topic")), str(mq.get("brokerName")), int(mq.get("queueId", 0))

    def try_lock_batch(self, group: str, mqs: list[dict], client: str) -> list[dict]:
        """The queues now locked by client (taken, renewed, or expired from another holder)."""
        now = time.monotonic()
        locked = []
        for mq in mqs:
            key = self._key(group, mq)
            holder = self.locks.get(key)
            if holder is None or holder[0] == client or now - holder[1] > REBALANCE_LOCK_MAX_LIVE_TIME:
                self.locks[key] = (client, now)
                locked.append(mq)
        return locked

    def unlock_batch(self, group: str, mqs: list[dict], client: str) -> None:
        for mq in mqs:
            key = self._key(group, mq)
            if self.locks.get(key, (None,))[0] == client:
                del self.locks[key]
