"""Cleanup: RocketMQ's CleanCommitLogService and CleanConsumeQueueService, and the disk-full guard.

Commitlog files (never the current, last one) are deleted, oldest first, at most 10 per pass:

- expired ones (last modified more than fileReservedTime hours ago) at a deleteWhen hour ("04", "04;05"),
  or at any hour once the store's filesystem is more than diskMaxUsedSpaceRatio % used (default 75);
- over diskSpaceCleanForciblyRatio (0.85) with cleanFileForciblyEnable, unexpired ones too ("forcibly");
- over diskSpaceWarningLevelRatio (0.90) the store also refuses puts (RunningFlags.disk_full: put answers
  SERVICE_NOT_AVAILABLE, with a warning naming the ratio); reads go on. Under it again, puts are accepted.

Then consume queue files whose every unit points below the commitlog's new min offset and index files whose
endPhyOffset is below it are deleted, and every consume queue's min offset is moved past the units whose
messages are gone (RocketMQ #8753: a queue whose messages all sat in deleted files kept its old min offset).

Usage is statvfs of the filesystem holding the store (used = total - free, free counting root-reserved
blocks, as Java's File.getFreeSpace): no hook, a test fills a real small filesystem. The two ratios RocketMQ
reads from system properties (rocketmq.broker.diskSpaceWarningLevelRatio / ...CleanForciblyRatio) can be
given as config keys diskSpaceWarningLevelRatio / diskSpaceCleanForciblyRatio (0.90 or 90).

Beyond RocketMQ: the disk is checked every second, not only when a cleanup pass runs (#1400: a long
deletion delayed the disk-full flag); a directory that does not exist yet is measured on its nearest
existing parent (RocketMQ answered -1 and reported a full disk, #1493 / #2067); a commitlog file the
dispatcher has not read yet is never deleted (its messages would never reach their consume queues).

clean_store(parts, force=False) is the manual `rmqstore clean STORE [--force]`.
"""
from __future__ import annotations

import datetime as _dt
import logging
import os
import threading
import time
from pathlib import Path
from .flush import ServiceThread
from .parts import StoreParts

log = logging.getLogger(__name__)

DELETE_FILES_BATCH_MAX = 10            # RocketMQ's MappedFileQueue.DELETE_FILES_BATCH_MAX
DISK_CHECK_INTERVAL = 1.0              # seconds between two disk checks of the background service
DEFAULT_WARNING_LEVEL_RATIO = 0.90     # rocketmq.broker.diskSpaceWarningLevelRatio
DEFAULT_CLEAN_FORCIBLY_RATIO = 0.85    # rocketmq.broker.diskSpaceCleanForciblyRatio
_DELETE_LOCK = threading.Lock()        # one deletion at a time (background service, manual clean_store)


def disk_used_ratio(path: str | os.PathLike) -> float:
    """Used fraction (0..1) of the filesystem holding path, or of its nearest existing parent."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    st = os.statvfs(p)
    total = st.f_blocks * st.f_frsize
    if total <= 0:
        return 0.0
    return (total - st.f_bfree * st.f_frsize) / total


def _ratio(config, key: str, default: float) -> float:
    """A ratio from the config: an attribute if StoreConfig has one, else the RocketMQ key in config.extra."""
    attr = "".join("_" + c.lower() if c.isupper() else c for c in key)
    v = getattr(config, attr, None)
    if v is None:
        v = getattr(config, "extra", {}).get(key)
    if v is None:
        return default
    try:
        f = float(v)
    except (TypeError, ValueError):
        log.warning("bad value %r for %s: using %s", v, key, default)
        return default
    return f / 100.0 if f > 1.0 else f


def parse_delete_when(spec: str) -> set[int]:
    """RocketMQ's deleteWhen: hours of the day, "04" or "04;05"."""
    hours = set()
    for part in str(spec).split(";"):
        part = part.strip()
        if part.isdigit() and 0 <= int(part) <= 23:
            hours.add(int(part))
        elif part:
            log.warning("deleteWhen %r: %r is not an hour (00-23), ignored", spec, part)
    return hours


class DiskState:
    """The outcome of one disk check."""

    def __init__(self, used: float, limit: float, forcibly: float, warning: float):
        self.used, self.limit, self.forcibly, self.warning = used, limit, forcibly, warning

    @property
    def space_full(self) -> bool:          # RocketMQ's isSpaceToDelete: over diskMaxUsedSpaceRatio
        return self.used > self.limit

    @property
    def clean_immediately(self) -> bool:   # over diskSpaceCleanForciblyRatio (or the warning level)
        return self.used > self.forcibly

    @property
    def disk_full(self) -> bool:           # over diskSpaceWarningLevelRatio: puts refused
        return self.used > self.warning

    def __repr__(self) -> str:
        return (f"DiskState(used={self.used:.3f}, maxUsed={self.limit:.2f}, forcibly={self.forcibly:.2f}, "
                f"warning={self.warning:.2f})")


class CleanCommitLogService:
    """Deletes old commitlog files and keeps the store's disk-full flag (RunningFlags.disk_full) current."""

    def __init__(self, parts: StoreParts):
        self.parts = parts
        self.manual_delete_times = 0          # RocketMQ's manualDeleteFileSeveralTimes
        self.deleted_files: list[str] = []    # every file this service deleted, for reports and tests

    # --- the disk ------------------------------------------------------------------------------------
    def check_disk(self) -> DiskState:
        parts, cfg = self.parts, self.parts.config
        limit = min(max(cfg.disk_max_used_space_ratio, 10), 95) / 100.0     # RocketMQ clamps to [10, 95]
        warning = _ratio(cfg, "diskSpaceWarningLevelRatio", DEFAULT_WARNING_LEVEL_RATIO)
        forcibly = _ratio(cfg, "diskSpaceCleanForciblyRatio", DEFAULT_CLEAN_FORCIBLY_RATIO)
        used = max(disk_used_ratio(parts.path / "commitlog"), disk_used_ratio(parts.path / "consumequeue"))
        state = DiskState(used, limit, forcibly, warning)
        flags = parts.running_flags
        if state.disk_full:
            reason = (f"disk of {parts.path} is {used:.1%} used, over diskSpaceWarningLevelRatio {warning:.0%}: "
                      f"puts are refused until cleanup frees space")
            was = flags.disk_full
            flags.disk_full_reason = reason
            flags.disk_full = True
            if not was:
                log.error("%s", reason)
        elif flags.disk_full:
            flags.disk_full = False
            flags.disk_full_reason = None
            still = f", but puts stay refused: {flags.write_error}" if flags.write_error else ": puts accepted"
            log.warning("%s: disk %.1f%% used, under diskSpaceWarningLevelRatio %.0f%% again%s",
                        parts.path, used * 100, warning * 100, still)
        return state

    # --- deleting ------------------------------------------------------------------------------------
    def is_time_to_delete(self, now: float | None = None) -> bool:
        hour = _dt.datetime.fromtimestamp(time.time() if now is None else now).hour
        return hour in parse_delete_when(self.parts.config.delete_when)

    def delete_files(self, force: bool, max_files: int = DELETE_FILES_BATCH_MAX, now_ms: float | None = None,
                     pause: float = 0.0) -> list[str]:
        """Delete the oldest commitlog files that are expired (or any, with force), at most max_files, never
        the last one nor one the dispatcher has not finished reading. Returns the deleted paths."""
        parts = self.parts
        q = parts.commit_log.queue
        now_ms = time.time() * 1000 if now_ms is None else now_ms
        expired_ms = parts.config.file_reserved_time * 3600 * 1000
        reput = parts.dispatcher.reput_from_offset
        deleted: list[str] = []
        with _DELETE_LOCK:
            for mf in list(q.files)[:-1]:
                if len(deleted) >= max_files:
                    break
                if mf.file_from_offset + mf.file_size > reput:
                    log.warning("%s: not deleted: the dispatcher has not read it yet (at %d)", mf.path, reput)
                    break
                if not (force or now_ms >= mf.last_modified() * 1000 + expired_ms):
                    break
                q.delete_files([mf])
                deleted.append(str(mf.path))
                if pause:
                    time.sleep(pause)
        if deleted:
            self.deleted_files += deleted
            log.info("%s: %d commitlog files deleted (%s), min offset now %d", parts.path, len(deleted),
                     "forcibly" if force else "expired", parts.commit_log.get_min_offset())
        return deleted

    def run_once(self, now: float | None = None, pause: float = 0.0) -> list[str]:
        """One pass of RocketMQ's deleteExpiredFiles; returns the deleted paths."""
        state = self.check_disk()
        time_up = self.is_time_to_delete(now)
        manual = self.manual_delete_times > 0
        if not (time_up or state.space_full or manual):
            return []
        if manual:
            self.manual_delete_times -= 1
        force = self.parts.config.clean_file_forcibly_enable and state.clean_immediately
        if state.space_full:
            log.warning("%s: disk %.1f%% used (diskMaxUsedSpaceRatio %.0f%%): deleting %s commitlog files",
                        self.parts.path, state.used * 100, state.limit * 100, "the oldest" if force else "expired")
        return self.delete_files(force, now_ms=None if now is None else now * 1000, pause=pause)


class CleanConsumeQueueService:
    """After commitlog files went: consume queue and index files below the new min offset, and min offsets."""

    def __init__(self, parts: StoreParts):
        self.parts = parts
        self.last_physical_min_offset = 0

    def run_once(self, always: bool = False) -> tuple[int, int]:
        """Returns (consume queue files deleted, index files deleted)."""
        parts = self.parts
        min_off = parts.commit_log.get_min_offset()
        with _DELETE_LOCK:
            if min_off <= 0 or (min_off <= self.last_physical_min_offset and not always):
                return 0, 0
            self.last_physical_min_offset = min_off
            cq_files = 0
            for cq in list(parts.consume_queues):
                cq_files += cq.delete_expired_files(min_off)      # also moves the queue's min offset (#8753)
            idx_files = parts.index_service.delete_expired_file(min_off) if parts.config.message_index_enable else 0
        if cq_files or idx_files:
            log.info("%s: %d consume queue files and %d index files below commitlog offset %d deleted",
                     parts.path, cq_files, idx_files, min_off)
        return cq_files, idx_files


class CleanupService(ServiceThread):
    """The background thread: a disk check every second, a cleanup pass every cleanResourceInterval ms."""
    name = "StoreCleanupService"

    def __init__(self, parts: StoreParts):
        interval = parts.config.clean_resource_interval
        super().__init__(min(interval, int(DISK_CHECK_INTERVAL * 1000)))
        self.parts = parts
        self.commit_log_service = CleanCommitLogService(parts)
        self.consume_queue_service = CleanConsumeQueueService(parts)
        self._pass_interval = interval / 1000.0
        self._next_pass = time.monotonic() + self._pass_interval

    def start(self) -> None:
        self.commit_log_service.check_disk()      # a store opened on a full disk refuses puts from the start
        super().start()

    def run_once(self) -> None:
        now = time.monotonic()
        if now < self._next_pass:
            self.commit_log_service.check_disk()
            return
        self._next_pass = now + self._pass_interval
        pause = self.parts.config.delete_commit_log_files_interval / 1000.0
        self.commit_log_service.run_once(pause=pause)
        self.consume_queue_service.run_once()


def clean_store(parts, force: bool = False) -> dict:
    """The manual cleanup (`rmqstore clean STORE [--force]`), now, whatever the hour and the disk:
    delete every expired commitlog file (force: every file but the current one), then the consume queue and
    index files below the commitlog's new min offset. Returns what happened. parts: a StoreParts, or an
    open MessageStore (its parts() are taken)."""
    if not isinstance(parts, StoreParts):
        parts = parts.parts()
    cl = CleanCommitLogService(parts)
    cq = CleanConsumeQueueService(parts)
    before = parts.commit_log.get_min_offset()
    state = cl.check_disk()
    deleted: list[str] = []
    while True:
        batch = cl.delete_files(force)
        deleted += batch
        if len(batch) < DELETE_FILES_BATCH_MAX:
            break
    cq_files, idx_files = cq.run_once(always=True)
    after_state = cl.check_disk()
    return {"store": str(parts.path), "force": force, "commitlog_files_deleted": len(deleted),
            "deleted_bytes": len(deleted) * parts.config.mapped_file_size_commit_log,
            "consume_queue_files_deleted": cq_files, "index_files_deleted": idx_files,
            "min_offset_before": before, "min_offset_after": parts.commit_log.get_min_offset(),
            "disk_used_ratio_before": round(state.used, 4), "disk_used_ratio": round(after_state.used, 4),
            "disk_full": parts.running_flags.disk_full}
