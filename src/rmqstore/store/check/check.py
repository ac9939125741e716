"""`rmqstore check`: a full consistency check of a store directory, in the spirit of SQLite's
`PRAGMA integrity_check` and diskcache's `check(fix=...)`.

    report = check_store("/data/store", StoreConfig.load("broker.conf"))
    for p in report.problems:
        print(p)                       # FILE: offset N: what
    print(report.summary())

What is checked, read-only (files are opened O_RDONLY and mapped ACCESS_READ; nothing is created, locked or
written, and a store another process has open is read as it is, the check says so):

* commitlog: every record (magic code, sizes, body CRC), file sizes and missing files. After a record that
  fails, the scan resumes at the next record whose successors chain (resync.next_valid_record) and the
  skipped byte range is reported;
* consume queues: file sizes, missing files, every unit against the record it points at (recovery.
  unit_problems: record start, size, topic, queue id, queue offset), and against the commitlog: messages of
  a queue the queue does not hold (a lost tail or head), queues missing altogether;
* index: file sizes, headers, slots and entries (recovery.index_file_problems), every entry's offset a
  record's, every entry's hash one of that record's `topic#key` hashes;
* checkpoint: its size, and timestamps the commitlog's records reach;
* config/*.json: each parses and has the shape the store loads (else its `.bak` is looked at).

After a crash (an `abort` file) or while another process has the store open, queues and index behind the
commitlog and a torn last record are what recovery repairs at the next open: they are listed as notes, not
problems. A store another process has open is checked as far as the commitlog scan saw it (units and
index entries written after it are left out), with a note naming the process. check_repair.repair_store()
(`check --repair`, check_repair.py) takes the lock, rebuilds what is derived (consume queues and index)
and quarantines what is not (a malformed config file goes to `FILE.corrupt-<time>`, its `.bak` takes its
place; damaged commitlog bytes are copied to `quarantine/` and recorded as accepted damage, damage.py);
a message is never deleted.

The parts: check_commitlog (records), check_derived (consume queues, index), check_files (checkpoint,
config, file kinds, links), check_report (what is reported), check_repair (the repair).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from .check_commitlog import Records, check_commitlog
from .check_derived import check_consume_queues, check_index
from .check_files import check_checkpoint, check_config, check_file_kinds, check_links, config_problem
from .check_report import CheckReport, NotAStoreError, Problem, Progress, digit_files, store_root
from ..conf.config import StoreConfig
from ..files.mapped_file import FileCache

__all__ = ["CheckReport", "NotAStoreError", "Problem", "Records", "check_store", "config_problem",
           "store_open_by"]


def store_open_by(root: Path) -> str | None:
    """Who has the store open ("process 1234", "this process"), or None: a probe (F_GETLK) of its lock,
    nothing locked or created."""
    from ..state import lock
    if str(root.resolve()) in getattr(lock, "_held", ()):
        return "this process"
    pid = lock._lock_holder_of(root / "lock")
    return None if pid is None else f"process {pid}"


class GeometryError(NotAStoreError):
    """The commitlog files are all of one size that is not the configured one: the store was written with
    another broker.conf (checking it with this one would report every file)."""


def check_geometry(root: Path, cfg: StoreConfig) -> None:
    """GeometryError when every commitlog file but a possibly cut last one has one size, not the configured
    mappedFileSizeCommitLog, and the names step by that size (a forgotten `-c`, not damage)."""
    files = digit_files(root / "commitlog")
    fsize = cfg.mapped_file_size_commit_log
    sizes = {s for _, _, s in files[:-1]} if len(files) > 1 else {s for _, _, s in files}
    if len(sizes) != 1 or fsize in sizes:
        return
    (size,) = sizes
    steps = all(b - a == size for (a, _, _), (b, _, _) in zip(files, files[1:]))
    if size and steps and (len(files) > 1 or files[0][0] % size == 0 and size < fsize):
        raise GeometryError(f"{files[0][1]}: file size {size} does not match mappedFileSizeCommitLog {fsize}: the "
                            f"store was written with another configuration; pass its broker.conf with -c broker.conf "
                            f"(mappedFileSizeCommitLog={size})")


def _load_accepted(root: Path, report: CheckReport) -> None:
    """The records check honours: accepted damage, deleted queues (check_config reports an unusable file;
    its records then count as absent)."""
    from ...errors import CorruptStoreError
    from ..commitlog.damage import accepted_ranges
    from ..consumequeue.deleted_queues import load as load_deleted
    try:
        report.accepted = accepted_ranges(root)
    except CorruptStoreError:
        report.accepted = []
    try:
        report.deleted = load_deleted(root)
    except CorruptStoreError:
        report.deleted = {}


def _check_deletions(root: Path, recs, report: CheckReport) -> None:
    """Queues whose offsets start over at 0 in the commitlog (deleted and written again) that
    config/deletedQueues.json (or the .bak open would fall back to) does not hold, or holds at an earlier
    boundary: the record is not complete (an older .bak, an emptied or lost file), and a rebuild would bring
    the deleted generation back. Reported on the file; the rest of the check honours the derived deletions."""
    from ..consumequeue.deleted_queues import deleted_file, lacking, merge, restarts
    missing = lacking(report.deleted, restarts(recs)[0])
    if not missing:
        return
    listed = ", ".join(f"{t}/{q} below {b}" for (t, q), b in sorted(missing.items())[:10])
    report.add("config", deleted_file(root), 0,
               f"does not record deletions the commitlog shows (queue offsets starting over at 0): {listed}"
               f"{' and more' if len(missing) > 10 else ''}; a rebuild would bring the deleted messages back "
               "(--repair records them)")
    report.deleted = merge(report.deleted, missing)


def check_store(path: str | os.PathLike, config: StoreConfig | None = None, *, progress: Progress | None = None,
                live: bool | None = None) -> CheckReport:
    """Check everything (module docstring), read-only. NotAStoreError when path is not a store directory.
    live: the store is open (in this process or another): queues and index may be behind the commitlog,
    and what was written after the commitlog scan is not checked (None: probe the lock)."""
    t0 = time.perf_counter()
    root = store_root(path)
    cfg = config or StoreConfig()
    check_geometry(root, cfg)
    report = CheckReport(str(root))
    holder = store_open_by(root) if live is None else ("this process" if live else None)
    report.live = holder is not None
    crashed = (root / "abort").exists()
    if holder is not None and live is None:
        report.notes.append(f"{root}: the store is open in {holder} (its lock is held; its abort file is normal): "
                            "checked as it was when the scan began; queues and index may be behind the commitlog")
    elif crashed and holder is None:
        report.notes.append(f"{root}: abort file present (not shut down cleanly): what recovery repairs at the "
                            "next open is listed as notes")
    _load_accepted(root, report)
    maps = FileCache()
    try:
        recs = check_commitlog(root, cfg, report, maps, crashed or report.live, progress)
        _check_deletions(root, recs, report)
        check_consume_queues(root, cfg, recs, report, maps, crashed or report.live)
        if cfg.message_index_enable:
            check_index(root, cfg, recs, report)
        check_checkpoint(root, recs, report)
        report.bad_config = check_config(root, report)
        check_file_kinds(root, report)
        check_links(root, report)
    finally:
        maps.close()
    report.seconds = time.perf_counter() - t0
    return report


