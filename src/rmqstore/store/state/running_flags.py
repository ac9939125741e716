"""RocketMQ's RunningFlags: why the store refuses writes (disk full, a failed write or flush)."""
from __future__ import annotations

import threading

from .failure import FailureChannel, FailureKind


class RunningFlags:
    """Why the store refuses writes (disk full, a failed write). A failed write is also reported to the
    failure channel."""

    def __init__(self, failures: FailureChannel | None = None):
        self.failures = failures
        self._lock = threading.Lock()
        self.disk_full = False
        self.disk_full_reason: str | None = None    # set with disk_full by the cleanup service
        self.write_error: str | None = None
        self.slave = False          # brokerRole=SLAVE: puts go to the master

    @property
    def writeable(self) -> bool:
        return not self.disk_full and self.write_error is None and not self.slave

    def write_failed(self, why: str, kind: FailureKind | str = FailureKind.WRITE) -> None:
        """Refuse puts from now on, for this reason (a WRITE or FLUSH failure on the failure channel)."""
        with self._lock:
            self.write_error = why
        if self.failures is not None:
            self.failures.raise_condition("store.write", FailureKind(kind), why)

    def why(self) -> str:
        if self.slave:
            return ("the store is a SLAVE (brokerRole, or its config/brokerRole.json): puts go to its master; "
                    "open it with brokerRole=ASYNC_MASTER or SYNC_MASTER to promote it")
        if self.disk_full:
            return self.disk_full_reason or "disk full"
        return self.write_error or "ok"
