"""Rebuild a store's consume queues and index from its commitlog (the local engine).

The store is locked, `consumequeue/` and `index/` are removed, and opening the store re-dispatches the
whole commitlog: the files written are those RocketMQ's dispatcher writes (consume queues byte for byte;
index slots and entries alike, file names taken from the clock).

Damage stays out of the rebuilt queues. The dispatcher parses headers, not bodies, and recovery after a
clean shutdown checks CRCs only in the last files, so before dispatching, the rebuild (offline: the store
is closed) walks every record with its body CRC (check_commitlog.scan_damage; measured on the shared 2-core
machine: 0.9 s for 277 MB, 18 % of a 4.9 s rebuild) and gives the dispatcher, as ranges not to dispatch,
every range that fails its checks and that valid records follow, plus the ranges recorded as accepted
damage (damage.py, config/damagedRanges.json, written by `check --repair`). Those records' queue offsets
read as removed messages (filler units); the ranges are reported in the result ("skipped") and logged.
"""
from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Callable

from ...errors import CorruptStoreError
from ..check.check_commitlog import commitlog_restarts
from ..conf.config import StoreConfig
from ..state.lock import StoreLock
from ..store import MessageStore

log = logging.getLogger(__name__)
Progress = Callable[[int, int], None]


def damaged_ranges(path: Path, config: StoreConfig, progress: Progress | None = None) -> list[dict]:
    """The commitlog ranges a rebuild must not dispatch: accepted damage and CRC-checked damage, as
    {"offset", "length", "file", "reason", "accepted"} sorted by offset."""
    from ..check.check_commitlog import scan_damage
    from ..commitlog.damage import load_ranges, merged

    accepted = load_ranges(path)
    out = [{"offset": r.offset, "length": r.length, "file": r.file, "reason": r.reason, "accepted": True}
           for r in accepted]
    for d in scan_damage(path, config, merged(accepted), progress):
        out.append({"offset": d.offset, "length": d.length, "file": Path(d.path).name, "reason": d.reason,
                    "accepted": False})
    return sorted(out, key=lambda r: r["offset"])


def _refuse_lost_deletions(path: Path, config: StoreConfig) -> None:
    """A rebuild dispatches every record the deletion record (config/deletedQueues.json) does not exclude:
    with that record unusable, or only its .bak (an older state), or empty, or missing or not complete
    while the commitlog shows queues starting over at offset 0 (deleted and written again), it would bring
    deleted messages back and move acknowledged ones off their offsets. CorruptStoreError naming the file
    and the queues (check --repair derives the record), nothing removed."""
    from ..consumequeue import deleted_queues
    recorded = deleted_queues.load(path, backup_ok=False)   # unusable, or only its .bak: CorruptStoreError
    f = deleted_queues.deleted_file(path)
    if f.is_file():
        return          # usable (else load raised): deleteTopic writes every deletion into it
    missing = deleted_queues.lacking(recorded, commitlog_restarts(path, config)[0])
    if missing:
        listed = ", ".join(f"{t}/{q}" for t, q in sorted(missing)[:10])
        raise CorruptStoreError(str(f), 0, f"does not record the deletions the commitlog shows (queue offsets "
                                           f"starting over at 0): {listed}{' and more' if len(missing) > 10 else ''}; "
                                           "a rebuild would bring the deleted messages back: run rmqstore check "
                                           "--repair first (it records them)")


def rebuild_store(path: str | Path, config: StoreConfig | None = None,
                  progress: Progress | None = None) -> dict:
    """Drop and rebuild consume queues and index of the store at path; returns counts and the damaged
    ranges skipped. progress(done, total) is called through the CRC scan, then through the dispatch."""
    path = Path(path)
    config = config or StoreConfig()
    if not (path / "commitlog").is_dir():
        raise FileNotFoundError(f"{path}: not a store (no commitlog directory)")
    from ..check.check import check_geometry
    check_geometry(path, config)     # a forgotten -c: refused before anything is removed
    lock = StoreLock(path)
    lock.acquire()          # refuse at once if another process has the store open
    try:
        _refuse_lost_deletions(path, config)      # before anything is removed
        t0 = time.perf_counter()
        skip = damaged_ranges(path, config, progress)
        scan_s = time.perf_counter() - t0
        for sub in ("consumequeue", "index"):
            shutil.rmtree(path / sub, ignore_errors=True)
    finally:
        lock.release()
    for r in skip:
        log.warning("%s: commitlog offsets %d..%d (%s, %s) not dispatched: %s", path, r["offset"],
                    r["offset"] + r["length"], r["file"], "accepted damage" if r["accepted"] else "damaged",
                    r["reason"])
    t0 = time.perf_counter()
    store = MessageStore(path, config)
    if progress is not None:
        store.dispatcher.on_progress = progress
    for r in skip:
        store.dispatcher.add_skip_range(r["offset"], r["offset"] + r["length"])
    store.start(start_services=False)
    try:
        report = store.recovery_report
        out = {"store": str(path), "messages": report.redispatched_messages,
               "bytes": store.get_max_phy_offset() - max(store.get_min_phy_offset(), 0),
               "queues": sum(1 for _ in store.consume_queues),
               "index_files": len(store.index_service.files),
               "skipped": skip}
    finally:
        store.close()
    out["seconds"] = round(time.perf_counter() - t0 + scan_s, 3)
    out["crc_scan_seconds"] = round(scan_s, 3)
    return out
