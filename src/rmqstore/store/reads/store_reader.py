"""StoreReader: MessageStore's read API (get_message, query_message, find_messages_by_key, offsets and
lookups) over a store that is never written: the store as MessageStore.open would serve it, recovered in
memory (store.recovery.view.RecoveredStore: recovery.plan_recovery, then recovery.apply_plan over privately mapped
files, the re-dispatch included). No file is created, changed or locked, so it also reads a store another
process holds open (what that process has written so far, recovered as if it had just stopped).

The read methods are MessageStore's own (read_api.StoreReadAPI, the base class of both), so the answers
(statuses, next offsets, the unit cross-checks, the index's raw matches) are the ones an open store gives.
"""
from __future__ import annotations

from pathlib import Path

from ...errors import StoreClosedError
from ..conf.config import StoreConfig
from .read_api import StoreReadAPI
from ..recovery.view import RecoveredStore


class StoreReader(StoreReadAPI):
    """A read-only store (module docstring); a context manager. open() recovers in memory."""

    def __init__(self, recovered: RecoveredStore):
        self._recovered = recovered
        files = recovered.files
        self.path = files.root
        self.config = files.config
        self.commit_log = files.commit_log
        self.consume_queues = files.consume_queues
        self.index_service = files.index_service
        self.dispatcher = recovered.dispatcher
        self.recovery_plan = recovered.plan
        self._closed = False

    @classmethod
    def open(cls, path: str | Path, config: StoreConfig | None = None) -> "StoreReader":
        config = config or StoreConfig()
        return cls(RecoveredStore.open(Path(path), config, with_index=config.message_index_enable))

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store reader of {self.path} is closed")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._recovered.close()

    def __enter__(self) -> "StoreReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

