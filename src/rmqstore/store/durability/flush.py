"""Flush policies: when written bytes reach the disk, and what the checkpoint may vouch for.

- ASYNC_FLUSH (FlushRealTimeService): every flushIntervalCommitLog ms flush at least
  flushCommitLogLeastPages dirty pages, everything every flushCommitLogThoroughInterval ms.
- SYNC_FLUSH (GroupCommitService): a put waits until its bytes are flushed; one msync serves every put
  waiting at that moment; past syncFlushTimeout the put answers FLUSH_DISK_TIMEOUT (the message stays).
  A put that finds no round running leads one in its own thread (append what is queued, its own message
  included, fdatasync, answer them all): one producer thread pays write + fdatasync without a hand-off to
  the flusher thread; with many, puts arriving during that fdatasync queue for the next round.
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
from collections import deque
from _thread import allocate_lock as _allocate_lock
from ..commitlog.commit_log import AppendFailed, log_refused
from ..conf.config import SYNC_FLUSH
from ..format.message import PutMessageResult, PutMessageStatus
from ..format.message_batch import COLUMNAR_MIN
from .parts import StoreParts

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
        self.wakeup()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None


def flush_commit_log(parts: StoreParts, least_pages: int) -> None:
    """Flush the commitlog; advance the checkpoint's physic timestamp only over what was flushed."""
    q = parts.commit_log.queue
    ts, wrote = q.store_timestamp, q.get_max_offset()
    q.flush(least_pages)
    if ts and q.flushed_where >= wrote:
        parts.checkpoint.physic_msg_timestamp = ts


def flush_failed(parts: StoreParts, what: str, e: OSError) -> str:
    """Record a failed flush: the store refuses puts from now on; returns the reason."""
    why = f"{what} flush failed ({e.strerror or e}): nothing written since the last good flush is claimed durable"
    parts.running_flags.write_failed(why, "FLUSH")     # also on the failure channel
    parts.abort_file.distrust()
    log.error("%s: %s; puts are refused and the abort file is kept", parts.path, why)
    return why


class FlushRealTimeService(ServiceThread):
    name = "FlushRealTimeService"

    def __init__(self, parts: StoreParts):
        super().__init__(parts.config.flush_interval_commit_log)
        self.parts = parts
        self._last_thorough = time.monotonic()

    failed: str | None = None

    def run_once(self, least: int | None = None) -> None:
        if self.failed:
            return
        cfg = self.parts.config
        if least is None:
            least = cfg.flush_commit_log_least_pages
            now = time.monotonic()
            if (now - self._last_thorough) * 1000 >= cfg.flush_commit_log_thorough_interval:
                self._last_thorough = now
                least = 0
        try:
            flush_commit_log(self.parts, least)
        except OSError as e:
            self.failed = flush_failed(self.parts, "commitlog", e)

    def on_appended(self, next_offset: int) -> bool:
        if not self.parts.config.flush_commit_log_timed:
            self.wakeup()
        return True

    def on_stop(self) -> None:
        self.run_once(0)


def _not_flushed(r: "PutMessageResult") -> "PutMessageResult":
    """A put appended but not flushed in time answers FLUSH_DISK_TIMEOUT (the message stays); others as
    they are."""
    return PutMessageResult(PutMessageStatus.FLUSH_DISK_TIMEOUT, r.append_result) \
        if r.status is PutMessageStatus.PUT_OK else r


class _CombinedPut:
    """One message handed to the flusher by put() (GroupCommitService), already encoded (validated) by the
    putting thread: `encoded` is CommitLog.encode's tuple."""
    __slots__ = ("msg", "encoded", "done", "result", "taken")

    def __init__(self, msg, encoded):
        self.msg = msg
        self.encoded = encoded
        self.done = _allocate_lock()
        self.done.acquire()
        self.result = None          # set once appended (before the flush), final when done is released
        self.taken = False


class GroupCommitService(ServiceThread):
    """Sync flush: puts wait for an msync that covers their bytes; one msync serves all waiting puts.

    Each waiting put queues a request (its next offset and a one-shot lock it blocks on) and wakes the
    flusher; the flusher takes every queued request after each flush (RocketMQ's requestsWrite /
    requestsRead swap) and releases exactly those its flush covered, so a put wakes once, when its own
    bytes are on disk, and never queues on a lock shared with the others. While requests are pending the
    flusher flushes again at once (no interval wait): the puts that arrive during one msync ride on the
    next. Released and not covered (flushed_where < next offset) means the put answers FLUSH_DISK_TIMEOUT:
    after a failed flush (at once; `failed` is final, module docstring) and at shutdown.

    Single-message puts from many threads are combined (put()): the producer queues its message and
    blocks once; the flusher appends everything queued in one put_messages, flushes once, and answers
    each. A producer thread then takes the GIL once per put instead of three times (wake-up, the append's
    pwrite, the wait), which is what limited group commit with many threads on few cores.

    A put is encoded and validated in its own thread before it joins a round: a malformed message is
    refused there (MESSAGE_ILLEGAL, with the reason) and never reaches the flusher, so it cannot change
    the answers of the other puts of the round. A round answers each message with what is true for it:
    FLUSH_DISK_TIMEOUT only for a message that was written; a write that fails answers the messages it
    did not store SERVICE_NOT_AVAILABLE."""
    name = "GroupCommitService"

    def __init__(self, parts: StoreParts):
        super().__init__(10)
        self.parts = parts
        self._requests: deque = deque()     # (next_offset, locked one-shot lock) of puts waiting; any thread
        self._pending: list = []            # requests taken by run_once, not yet covered by a flush
        self._run_lock = threading.Lock()   # one run_once at a time (tests call it beside the thread)
        self._signal = threading.Lock()     # a binary semaphore: unlocked = the flusher has work
        self._signal.acquire()
        self._closing = False               # the thread's last round has begun: waiters do not queue on
        self._puts: deque = deque()         # _CombinedPut of put(), not yet taken by a round
        self._appended: list = []           # _CombinedPut appended by the last round, to flush and answer
        self._puts_lock = threading.Lock()
        self.combined = 0                   # messages appended by rounds for put()
        self.led = 0                        # put() calls that led their own round (_lead)
        self.flushes = 0                    # flush rounds that moved flushed_where
        self.failures = 0
        self.failed: str | None = None      # set by the first failed flush, never cleared (module docstring)

    def start(self) -> None:
        self._closing = False
        super().start()

    def wakeup(self) -> None:
        signal = self._signal
        if signal.locked():                 # else: already signalled
            try:
                signal.release()
            except RuntimeError:            # signalled by another thread in between
                pass

    def on_appended(self, next_offset: int) -> bool:
        """Called by the put path after appending (outside the put lock): block until flushed past next_offset.
        False (the put answers FLUSH_DISK_TIMEOUT) on timeout, at shutdown and, at once, after a failed flush."""
        q = self.parts.commit_log.queue
        if q.flushed_where >= next_offset:
            return True
        if not self.failed and not self._closing:
            done = _allocate_lock()
            done.acquire()
            self._requests.append((next_offset, done))
            self.wakeup()
            # _closing is set before the last round takes the requests: if it is still clear here, that
            # round (or an earlier one) takes ours and releases it
            if not self._closing:
                done.acquire(True, self.parts.config.sync_flush_timeout / 1000.0)
        if q.flushed_where >= next_offset:
            return True
        if self.failed:
            log.warning("sync flush of offset %d failed (flushed to %d): %s", next_offset, q.flushed_where,
                        self.failed)
        elif self._closing:
            log.warning("sync flush of offset %d: not flushed at shutdown (flushed to %d)", next_offset,
                        q.flushed_where)
        else:
            log.warning("sync flush of offset %d timed out (flushed to %d)", next_offset, q.flushed_where)
        return False

    def put(self, msg) -> "PutMessageResult | None":
        """SYNC_FLUSH put of one message through the flusher (class docstring); None when the service is not
        taking messages (not running, closing, failed): the caller puts it the plain way."""
        if self.failed or self._closing or self._thread is None:
            return None
        encoded = self.parts.commit_log.encode(msg)
        if type(encoded) is not tuple:      # refused (a PutMessageResult naming the reason), in this thread
            log_refused((encoded,))
            return encoded
        p = _CombinedPut(msg, encoded)
        # no other put waits and no round runs: lead one here, no hand-off (_lead); else join the group
        if not (self._puts or self._appended or self._pending) and self._run_lock.acquire(False):
            try:
                led = self._lead(p)
            finally:
                self._run_lock.release()
            if led:
                self.led += 1
                if self._puts or self._appended or self._requests or self._pending:
                    self.wakeup()           # puts that came during the flush: the flusher's next round
                return p.result
        with self._puts_lock:
            self._puts.append(p)
        self.wakeup()
        if self._closing:                   # the last rounds may have run before it was queued
            with self._puts_lock:
                if not p.taken:
                    self._puts.remove(p)
                    return None
        timeout = self.parts.config.sync_flush_timeout / 1000.0
        if p.done.acquire(True, timeout):
            return p.result
        with self._puts_lock:
            if not p.taken:                 # the flusher is stuck (a hung fsync): append it here, unflushed
                self._puts.remove(p)
                try:
                    r = self.parts.commit_log.put_message(msg, wait=False)
                except OSError as e:
                    self.parts.record_write_failure(e)
                    return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE)
                log.warning("sync flush: no flush round within %.1f s", timeout)
                return _not_flushed(r)
        # taken: appended now or in a moment, its flush late
        deadline = time.monotonic() + timeout
        while p.result is None and time.monotonic() < deadline:
            if p.done.acquire(True, 0.01):
                return p.result
        r = p.result
        if r is None:   # the round that took it has not answered: whether it was written is not known
            return PutMessageResult(PutMessageStatus.UNKNOWN_ERROR, None,
                                    "the group commit round that took this message did not answer in time")
        log.warning("sync flush of offset %d timed out", r.append_result.wrote_offset)
        return _not_flushed(r)

    def _lead(self, p: _CombinedPut) -> bool:
        """Under _run_lock, in the putting thread, when no other put waits: append p (with any put queued
        meanwhile), flush, answer them. One producer thread then pays write + fdatasync and no hand-off to
        the flusher thread it would wait for; puts that arrive during the flush queue for the flusher's
        round (several producers keep the flusher's rounds, which batch them). False (nothing done) when
        closing or after a failed flush: p then queues as usual."""
        if self.failed or self._closing:
            return False
        with self._puts_lock:
            self._puts.append(p)
        for x in self._append_combined():
            if x.result.status is PutMessageStatus.PUT_OK:
                self._appended.append(x)    # answered by the flush below
            else:
                x.done.release()            # refused: answered now
        self._round()
        return True

    def _append_combined(self) -> list:
        """Take the queued put() messages and append them in one put_messages (not flushed yet)."""
        with self._puts_lock:
            puts = list(self._puts)
            self._puts.clear()
            for p in puts:
                p.taken = True
        if not puts:
            return puts
        parts = self.parts
        results = None
        why = "puts are refused: " + (self.failed or parts.running_flags.why())
        if not self.failed and parts.running_flags.writeable:
            try:
                if len(puts) == 1:              # one message: the single-put path (commit_log._write_single)
                    results = [parts.commit_log.put_encoded(puts[0].encoded, wait=False)]
                elif len(puts) >= COLUMNAR_MIN:   # validated messages: the columnar path may take them at once
                    results = parts.commit_log.put_messages([p.msg for p in puts], wait=False)
                else:
                    results = parts.commit_log.append_encoded([p.encoded for p in puts], wait=False)
            except AppendFailed as e:       # the records written before the failure are stored
                parts.record_write_failure(e.error)
                results = e.results
            except OSError as e:
                parts.record_write_failure(e)
                why = f"write failed: {e}"
            except Exception as e:          # a bug: answered as such, never as a flush timeout
                log.exception("%s: appending %d messages failed", parts.path, len(puts))
                results = [PutMessageResult(PutMessageStatus.UNKNOWN_ERROR, None, f"append failed: {e!r}")
                           for _ in puts]
        if results is None:                 # refused (as the store refuses puts) or nothing was written
            results = [PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, None, why)] * len(puts)
        for p, r in zip(puts, results):
            p.result = r
        self.combined += len(puts)
        parts.dispatcher.wakeup()
        return puts

    def _loop(self) -> None:
        signal = self._signal
        q = self.parts.commit_log.queue
        idle = 0                            # rounds in a row that left requests pending and flushed nothing
        while not self._stop.is_set():
            if (self._pending or self._requests or self._puts or self._appended) and idle < 2:
                signal.acquire(False)       # consume the wakeup of the requests this round takes
            else:
                signal.acquire(True, self.interval)
            if self._stop.is_set():
                break
            # a put leading a round (_lead) flushes everything appended and wakes this thread for what it
            # leaves: no round here then, and no waiting for its lock; nor a round when nothing waits and
            # nothing is unflushed (a put arriving while this thread held the lock would have to queue and
            # be handed off, the cost _lead exists to avoid)
            if not (self._pending or self._requests or self._puts or self._appended) and \
                    q.flushed_where >= q.get_max_offset():
                continue
            if not self._run_lock.acquire(False):
                signal.acquire(True, self.interval)
                continue
            try:
                # a round that flushed nothing may still leave a request whose bytes came in after the
                # flush: the next round covers it; two such rounds in a row would be a stuck request (no
                # spinning on it: then wait for the next put or the interval)
                idle = 0 if self._round() or not self._pending else idle + 1
            except Exception:
                log.exception("%s failed", self.name)
                idle = -1
            finally:
                self._run_lock.release()
            if idle < 0:
                idle = 0
                self._stop.wait(0.1)
        self._closing = True
        for _ in range(100):    # the last rounds: until nothing is queued or appended and unanswered
            self.run_once()
            if not self._puts and not self._appended:
                break

    def run_once(self) -> bool:
        """Flush (unless a flush failed before), append the messages queued by put(), then release every
        waiting put the flush covered (all of them after a failure or in the last round); True if
        flushed_where moved or messages were appended (the next round flushes them).

        The queued messages are appended after the flush and before the release, so the flusher does its
        Python work while the producers it is about to wake are still blocked, and they run during the
        next round's fdatasync (which releases the GIL) instead of competing with the flusher for it."""
        with self._run_lock:
            return self._round()

    def _round(self) -> bool:
        """run_once's round, _run_lock held (by the flusher thread, or a leading put: _lead)."""
        parts = self.parts
        q = parts.commit_log.queue
        before = q.flushed_where
        if not self.failed:
            try:
                if parts.config.transient_store_pool_enable:
                    q.commit(0)
                flush_commit_log(parts, 0)
            except OSError as e:
                self.failures += 1
                self.failed = flush_failed(parts, "commitlog", e)
        where = q.flushed_where
        moved = where != before
        if moved:
            self.flushes += 1
        puts, self._appended = self._appended, []
        if self._puts:
            for p in self._append_combined():
                if p.result.status is PutMessageStatus.PUT_OK:
                    self._appended.append(p)        # answered after the next round's flush
                else:
                    p.done.release()                # refused: answered now
        pending, requests = self._pending, self._requests
        while requests:
            pending.append(requests.popleft())
        release_all = self.failed or self._closing
        keep = []
        for r in pending:
            if release_all or r[0] <= where:
                r[1].release()
            else:
                keep.append(r)
        self._pending = keep
        for p in puts:
            end = p.result.wrote_end
            if end is not None and end > where:
                p.result = _not_flushed(p.result)
            p.done.release()
        return moved or bool(self._appended)


class CommitRealTimeService(ServiceThread):
    """Transient write buffer: copy appended bytes into the mapped file, then wake the flusher."""
    name = "CommitRealTimeService"

    def __init__(self, parts: StoreParts, flusher: ServiceThread):
        super().__init__(parts.config.commit_interval_commit_log)
        self.parts = parts
        self.flusher = flusher
        self._last_thorough = time.monotonic()

    def run_once(self) -> None:
        cfg = self.parts.config
        least = cfg.commit_commit_log_least_pages
        now = time.monotonic()
        if (now - self._last_thorough) * 1000 >= cfg.commit_commit_log_thorough_interval:
            self._last_thorough = now
            least = 0
        q = self.parts.commit_log.queue
        before = q.committed_where
        q.commit(least)
        if q.committed_where != before:
            self.flusher.wakeup()
            self.parts.dispatcher.wakeup()

    def on_stop(self) -> None:
        self.parts.commit_log.queue.commit(0)


class FlushConsumeQueueService(ServiceThread):
    name = "FlushConsumeQueueService"

    def __init__(self, parts: StoreParts):
        super().__init__(parts.config.flush_interval_consume_queue)
        self.parts = parts
        self._last_thorough = time.monotonic()

    failed: str | None = None

    def run_once(self, force: bool = False) -> None:
        """One flush; the checkpoint's logics timestamp moves only when every consume queue flush succeeded
        (RocketMQ #678), its index timestamp only when the index flush did, and neither after a failure."""
        if self.failed:
            return
        parts, cfg = self.parts, self.parts.config
        least = cfg.flush_consume_queue_least_pages
        now = time.monotonic()
        if force or (now - self._last_thorough) * 1000 >= cfg.flush_consume_queue_thorough_interval:
            self._last_thorough = now
            least = 0
        logics_ts = parts.dispatcher.last_dispatched_timestamp   # taken before the flush it vouches for
        try:
            parts.consume_queues.flush(least)
            if least == 0:
                ck = parts.checkpoint
                index_ts = parts.index_service.flush()
                if logics_ts:
                    ck.logics_msg_timestamp = logics_ts
                if index_ts:
                    ck.index_msg_timestamp = index_ts
                ck.flush()
        except OSError as e:
            self.failed = flush_failed(parts, "consume queue / index / checkpoint", e)

    def on_stop(self) -> None:
        self.run_once(force=True)


def install_flush_services(parts: StoreParts, services: list) -> "GroupCommitService | None":
    """Create the services the config asks for (appended to services) and hook the commitlog's put path to
    them; the GroupCommitService under SYNC_FLUSH, else None."""
    cfg = parts.config
    if cfg.flush_disk_type == SYNC_FLUSH:
        flusher: ServiceThread = GroupCommitService(parts)
    else:
        flusher = FlushRealTimeService(parts)
    if cfg.transient_store_pool_enable:
        services.append(CommitRealTimeService(parts, flusher))
    services += [flusher, FlushConsumeQueueService(parts)]
    parts.commit_log.on_appended = flusher.on_appended  # type: ignore[attr-defined]
    return flusher if isinstance(flusher, GroupCommitService) else None
