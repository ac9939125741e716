"""StoreParts: what the store's services (flush, cleanup) are given: the files and flags they work on,
not the MessageStore facade (so the services do not depend on the facade that installs them)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from ..state.checkpoint import StoreCheckpoint
from ..commitlog.commit_log import CommitLog
from ..conf.config import StoreConfig
from ..consumequeue.consume_queue import ConsumeQueueTable
from ..consumequeue.dispatch import Dispatcher
from ..index.index_file import IndexService
from ..state.lock import AbortFile
from ..state.running_flags import RunningFlags

log = logging.getLogger(__name__)


@dataclass
class StoreParts:
    path: Path
    config: StoreConfig
    commit_log: CommitLog
    consume_queues: ConsumeQueueTable
    index_service: IndexService
    dispatcher: Dispatcher
    checkpoint: StoreCheckpoint | None
    running_flags: RunningFlags
    abort_file: AbortFile

    def record_write_failure(self, e: OSError) -> None:
        """A commitlog write failed (a full disk): puts are refused from now on (RunningFlags)."""
        self.running_flags.write_failed(str(e))
        log.error("%s: write failed: %s", self.path, e)
