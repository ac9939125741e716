"""Flush policies: when written bytes reach the disk, and what the checkpoint may vouch for.

- ASYNC_FLUSH (FlushRealTimeService): every flushIntervalCommitLog ms flush at least
  flushCommitLogLeastPages dirty pages, everything every flushCommitLogThoroughInterval ms.
- SYNC_FLUSH (GroupCommitService): a put waits until its bytes are flushed; one msync serves every put
  waiting at that moment; past syncFlushTimeout the put answers FLUSH_DISK_TIMEOUT (the message stays).
  A failed msync is never reported as flushed: the waiting puts answer FLUSH_DISK_TIMEOUT.
- transientStorePoolEnable (CommitRealTimeService): appends go to an off-file buffer; this service copies
  them into the mapped file every commitIntervalCommitLog ms; readers see committed bytes only.
- FlushConsumeQueueService: consume queues every flushIntervalConsumeQueue ms (least 2 pages, all every
  flushConsumeQueueThoroughInterval), then the index's last file, then the checkpoint, each timestamp
  taken before its flush so the checkpoint never vouches for unflushed data (RocketMQ #678).

A failed flush is final for the process (RocketMQ #2706 answered SEND_OK after a failed msync): Linux
reports a writeback error once and marks the pages clean, so the NEXT msync "succeeds" although the data
never reached the disk. After a failure a service therefore never flushes again: flushed positions and
checkpoint timestamps stay where the last good flush left them, waiting and later sync puts answer
FLUSH_DISK_TIMEOUT at once, the store refuses puts (RunningFlags.write_error) and keeps its abort file at
close, so the next open recovers as after a crash.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from .config import SYNC_FLUSH

if TYPE_CHECKING:  # pragma: no cover
    from .store import MessageStore

log = logging.getLogger(__name__)


class ServiceThread:
    """A named daemon thread running `run_once()` every interval or when woken."""
    name = "service"

    def __init__(self, interval_ms: int):
        self.interval = interval_ms / 1000.0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def wakeup(self) -> None:
        self._wake.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.run_once()
            except Exception:
                log.exception("%s failed", self.name)
                self._stop.wait(0.1)
        try:
            self.on_stop()
        except Exception:
            log.exception("%s failed while stopping", self.name)

    def run_once(self) -> None:  # pragma: no cover - overridden
        pass

    def on_stop(self) -> None:
        pass

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None


def flush_commit_log(store: "MessageStore", least_pages: int) -> None:
    """Flush the commitlog; advance the checkpoint's physic timestamp only over what was flushed."""
    q = store.commit_log.queue
    ts, wrote = q.store_timestamp, q.get_max_offset()
    q.flush(least_pages)
    if ts and q.flushed_where >= wrote:
        store.checkpoint.physic_msg_timestamp = ts


def flush_failed(store: "MessageStore", what: str, e: OSError) -> str:
    """Record a failed flush: the store refuses puts from now on; returns the reason."""
    why = f"{what} flush failed ({e.strerror or e}): nothing written since the last good flush is claimed durable"
    store.running_flags.write_failed(why)
    log.error("%s: %s; puts are refused and the abort file is kept", store.path, why)
    return why


class FlushRealTimeService(ServiceThread):
    name = "FlushRealTimeService"

    def __init__(self, store: "MessageStore"):
        super().__init__(store.config.flush_interval_commit_log)
        self.store = store
        self._last_thorough = time.monotonic()

    failed: str | None = None

    def run_once(self, least: int | None = None) -> None:
        if self.failed:
            return
        cfg = self.store.config
        if least is None:
            least = cfg.flush_commit_log_least_pages
            now = time.monotonic()
            if (now - self._last_thorough) * 1000 >= cfg.flush_commit_log_thorough_interval:
                self._last_thorough = now
                least = 0
        try:
            flush_commit_log(self.store, least)
        except OSError as e:
            self.failed = flush_failed(self.store, "commitlog", e)

    def on_appended(self, next_offset: int) -> bool:
        if not self.store.config.flush_commit_log_timed:
            self.wakeup()
        return True

    def on_stop(self) -> None:
        self.run_once(0)


class GroupCommitService(ServiceThread):
    """Sync flush: puts wait for an msync that covers their bytes; one msync serves all waiting puts."""
    name = "GroupCommitService"

    def __init__(self, store: "MessageStore"):
        super().__init__(10)
        self.store = store
        self._cond = threading.Condition()
        self._waiting = 0
        self.failures = 0
        self.failed: str | None = None      # set by the first failed flush, never cleared (module docstring)

    def on_appended(self, next_offset: int) -> bool:
        """Called by the put path after appending: block until flushed past next_offset (or timeout).
        False (the put answers FLUSH_DISK_TIMEOUT) on timeout and, at once, after a failed flush."""
        q = self.store.commit_log.queue
        deadline = time.monotonic() + self.store.config.sync_flush_timeout / 1000.0
        with self._cond:
            self._waiting += 1
            try:
                self._wake.set()
                while q.flushed_where < next_offset:
                    if self.failed:
                        log.warning("sync flush of offset %d failed (flushed to %d): %s", next_offset,
                                    q.flushed_where, self.failed)
                        return False
                    left = deadline - time.monotonic()
                    if left <= 0 or self.stopped:
                        log.warning("sync flush of offset %d timed out (flushed to %d)", next_offset, q.flushed_where)
                        return False
                    self._cond.wait(left)
                return True
            finally:
                self._waiting -= 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            self.run_once()
        self.run_once()

    def run_once(self) -> None:
        store = self.store
        if not self.failed:
            try:
                if store.config.transient_store_pool_enable:
                    store.commit_log.queue.commit(0)
                flush_commit_log(store, 0)
            except OSError as e:
                self.failures += 1
                self.failed = flush_failed(store, "commitlog", e)
        with self._cond:
            self._cond.notify_all()


class CommitRealTimeService(ServiceThread):
    """Transient write buffer: copy appended bytes into the mapped file, then wake the flusher."""
    name = "CommitRealTimeService"

    def __init__(self, store: "MessageStore", flusher: ServiceThread):
        super().__init__(store.config.commit_interval_commit_log)
        self.store = store
        self.flusher = flusher
        self._last_thorough = time.monotonic()

    def run_once(self) -> None:
        cfg = self.store.config
        least = cfg.commit_commit_log_least_pages
        now = time.monotonic()
        if (now - self._last_thorough) * 1000 >= cfg.commit_commit_log_thorough_interval:
            self._last_thorough = now
            least = 0
        q = self.store.commit_log.queue
        before = q.committed_where
        q.commit(least)
        if q.committed_where != before:
            self.flusher.wakeup()
            self.store.dispatcher.wakeup()

    def on_stop(self) -> None:
        self.store.commit_log.queue.commit(0)


class FlushConsumeQueueService(ServiceThread):
    name = "FlushConsumeQueueService"

    def __init__(self, store: "MessageStore"):
        super().__init__(store.config.flush_interval_consume_queue)
        self.store = store
        self._last_thorough = time.monotonic()

    failed: str | None = None

    def run_once(self, force: bool = False) -> None:
        """One flush; the checkpoint's logics timestamp moves only when every consume queue flush succeeded
        (RocketMQ #678), its index timestamp only when the index flush did, and neither after a failure."""
        if self.failed:
            return
        store, cfg = self.store, self.store.config
        least = cfg.flush_consume_queue_least_pages
        now = time.monotonic()
        if force or (now - self._last_thorough) * 1000 >= cfg.flush_consume_queue_thorough_interval:
            self._last_thorough = now
            least = 0
        logics_ts = store.dispatcher.last_dispatched_timestamp   # taken before the flush it vouches for
        try:
            store.consume_queues.flush(least)
            if least == 0:
                ck = store.checkpoint
                index_ts = store.index_service.flush()
                if logics_ts:
                    ck.logics_msg_timestamp = logics_ts
                if index_ts:
                    ck.index_msg_timestamp = index_ts
                ck.flush()
        except OSError as e:
            self.failed = flush_failed(store, "consume queue / index / checkpoint", e)

    def on_stop(self) -> None:
        self.run_once(force=True)


def install_flush_services(store: "MessageStore") -> None:
    """Create the services the config asks for and hook the commitlog's put path to them."""
    cfg = store.config
    if cfg.flush_disk_type == SYNC_FLUSH:
        flusher: ServiceThread = GroupCommitService(store)
    else:
        flusher = FlushRealTimeService(store)
    services: list[ServiceThread] = [flusher]
    if cfg.transient_store_pool_enable:
        services.insert(0, CommitRealTimeService(store, flusher))
    services.append(FlushConsumeQueueService(store))
    store.commit_log.on_appended = flusher.on_appended  # type: ignore[attr-defined]
    store.services.extend(services)
