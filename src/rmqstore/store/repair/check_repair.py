"""`rmqstore check --repair`: rebuild what is derived, quarantine what is not, check again.

- config files that are malformed are moved aside (FILE.corrupt-<time>), a usable `.bak` takes their place;
- index files of another geometry are moved aside, their keys indexed again;
- commitlog damage (a range that fails its checks, valid records after it; a missing file) is quarantined:
  its bytes are copied to `quarantine/` and the range is recorded as accepted damage
  (`config/damagedRanges.json`, damage.py). The commitlog itself is not changed and no message is deleted;
  the range is then skipped by rebuild, dispatch and reads, and `check` reports it as a note;
- consume queues and index with problems are rebuilt from the commitlog (rebuild.rebuild_store, which
  skips accepted and CRC-damaged ranges), a checkpoint vouching for more than the commitlog holds is set
  back to the newest record.

A repair takes the store's lock (StoreLockedError when another process has it open) and refuses at once
(RepairRefusedError, nothing done) when a file it would write is a symbolic link out of the store, or
when commitlog files are not of the configured size (a wrong `-c` is likelier than damage).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from ..format import codec
from ..check.check import check_store
from ..check.check_commitlog import check_commitlog, commitlog_restarts
from ..check.check_files import links_out_of_store, quarantine, repair_config
from ..check.check_report import CheckReport, DamagedSpan, Progress, store_root
from ..conf.config import StoreConfig
from ..files.mapped_file import FileCache
from ...errors import CorruptStoreError, RmqStoreError


class RepairRefusedError(RmqStoreError):
    """The repair would write outside the store or on a misread store: nothing was done."""


def _refuse_links(root: Path) -> None:
    links = links_out_of_store(root)
    if links:
        p, target = links[0]
        raise RepairRefusedError(f"{p}: a symbolic link to {target}, outside the store: nothing repaired (a repair "
                                 f"never writes through one; {len(links)} such link{'s' * (len(links) != 1)})")


def _refuse_misread(first: CheckReport, fsize: int) -> None:
    for p in first.problems:
        if p.kind == "commitlog" and "does not match mappedFileSizeCommitLog" in p.what \
                and "open extends" not in p.what:
            raise RepairRefusedError(f"{p.path}: file size {p.offset} is not mappedFileSizeCommitLog {fsize}: "
                                     "nothing repaired (pass the store's broker.conf with -c)")


def repair_store(path: str | os.PathLike, config: StoreConfig | None = None, *,
                 progress: Progress | None = None) -> tuple[CheckReport, CheckReport]:
    """Check, repair, check again (module docstring): returns (the first report, the report after)."""
    from ..state.lock import StoreLock
    cfg = config or StoreConfig()
    root = store_root(path)
    _refuse_links(root)            # before the lock: the lock file itself may be such a link
    lock = StoreLock(root)
    lock.acquire()                 # StoreLockedError when another process has the store open
    try:
        first = check_store(root, cfg, progress=progress, live=False)
        _refuse_misread(first, cfg.mapped_file_size_commit_log)
        done: list[str] = []
        if _derive_lost_deletions(root, cfg, first, done):   # the check again, knowing the deletions
            first = check_store(root, cfg, progress=progress, live=False)
        repair_config(first.bad_config, done)
        _remove_half_made(root, done)
        _quarantine_misfit_index(root, cfg, done)
        _quarantine_commitlog(root, first.damaged, done)
    finally:
        lock.release()
    if any(p.kind != "config" for p in first.problems):
        _repair_derived(root, cfg, progress, done, rebuild=bool(first.damaged))
    after = check_store(root, cfg, progress=progress, live=False)
    first.repaired = after.repaired = done
    return first, after


def _derive_lost_deletions(root: Path, cfg: StoreConfig, first: CheckReport, done: list[str]) -> bool:
    """config/deletedQueues.json unusable, empty, or not holding deletions the commitlog shows (check
    reported it): a repair must not turn "unreadable" into "nothing was deleted" (the deleted messages
    would be served again, a rewritten topic's acknowledged ones lose their offsets), nor trust a .bak to be
    complete (it is the state before the last deleteTopic). What is still readable (the file, else its .bak)
    is merged with the deletions derived where queues start over at offset 0
    (deleted_queues.derive_from_restarts), each queue at its later boundary. A queue with messages above
    that boundary in the commitlog and no consume queue (deleted and not written again, or never
    dispatched) cannot be told apart: then RepairRefusedError names the file and those queues, nothing
    done. Else an unusable file is moved aside and the merged record written. Returns True when it wrote."""
    from ..consumequeue import deleted_queues
    from ..conf.config_file import string_to_file
    f = deleted_queues.deleted_file(root)
    if not any(p.path == str(f) for p in first.problems):
        return False
    derived, queues = commitlog_restarts(root, cfg)
    try:
        kept = deleted_queues.load(root)          # the file, else its .bak: never trusted to be complete
    except CorruptStoreError:
        kept = {}
    merged = deleted_queues.merge(kept, derived)
    unknown = [((t, q), n) for (t, q), (offs, _) in sorted(queues.items())
               if not (root / "consumequeue" / t / str(q)).is_dir()
               and (n := int((offs >= merged.get((t, q), 0)).sum()))]
    if unknown:
        listed = ", ".join(f"{t}/{q} ({n} messages)" for (t, q), n in unknown[:10])
        raise RepairRefusedError(
            f"{f}: unusable or not complete (its backup cannot be trusted to be): it records which topics were "
            f"deleted; a repair would bring back the messages of these queues, which have no consume queue: "
            f"{listed}{' and more' if len(unknown) > 10 else ''}. Nothing repaired: restore the file from a "
            "copy, or move it (and its .bak) away to let them come back")
    aside = quarantine(f) if f.is_file() and any(p == f for p, _ in first.bad_config) else None
    string_to_file(deleted_queues.encode(merged), f, deleted_queues.decode)
    done.append(f"{f}: {f'moved aside as {aside.name}; ' if aside else ''}written again from "
                f"{'what was readable of it (or its .bak) and ' if kept else ''}where queues start over in the "
                f"commitlog ({len(merged)} deleted queue{'s' * (len(merged) != 1)})")
    return True


def _quarantine_commitlog(root: Path, damaged: list[DamagedSpan], done: list[str]) -> None:
    """Copy each damaged commitlog range to quarantine/ and record it as accepted damage."""
    from ..commitlog.damage import DamagedRange, quarantine_range, record_ranges
    accepted = []
    for d in damaged:
        if d.pos < 0:           # missing files: no bytes to copy
            accepted.append(DamagedRange(str(Path(d.path).relative_to(root)), d.offset, d.length, d.reason,
                                         time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())))
            done.append(f"{d.path}: commitlog offsets {d.offset}..{d.end} ({d.reason}) recorded as accepted damage")
            continue
        rng = quarantine_range(root, Path(d.path), d.file_from_offset, d.pos, d.length, d.reason)
        accepted.append(rng)
        done.append(f"{d.path}: bytes {d.pos}..{d.pos + d.length} (commitlog offsets {d.offset}..{d.end}, "
                    f"{d.reason}) copied to {rng.quarantined} and recorded as accepted damage "
                    "(config/damagedRanges.json): skipped by dispatch and reads, left in the commitlog")
    if accepted:
        record_ranges(root, accepted)


def _remove_half_made(root: Path, done: list[str]) -> None:
    """The temporaries of files a crash left half made (their data is in no store file: nothing was renamed)."""
    from ..check.check_files import store_file_dirs
    from ..files.mapped_file import remove_half_made
    for d in store_file_dirs(root):
        if d.is_dir():
            done.extend(f"{d / n}: removed, a file a crash left half made" for n in remove_half_made(d))


def _quarantine_misfit_index(path: Path, cfg: StoreConfig, done: list[str]) -> None:
    """Index files whose size is not the configured geometry's: at open that is refused (likelier a wrong
    configuration than damage), but a repair was asked for with this configuration, and the index is derived:
    each is moved aside (FILE.corrupt-<time>) and its keys are indexed again from the commitlog."""
    d = store_root(path) / "index"
    if not d.is_dir():
        return
    expected = codec.index_file_size(cfg.max_hash_slot_num, cfg.max_index_num)
    for p in sorted(d.iterdir()):
        if p.name.isdigit() and p.is_file() and p.stat().st_size not in (0, expected):
            size = p.stat().st_size
            aside = quarantine(p)
            done.append(f"{p}: {size} bytes, not the {expected} of maxHashSlotNum={cfg.max_hash_slot_num} "
                        f"maxIndexNum={cfg.max_index_num}: moved to {aside.name}, its keys indexed again")


def _repair_derived(path: Path, cfg: StoreConfig, progress: Progress | None, done: list[str],
                    rebuild: bool) -> None:
    """Open (recover) the store; rebuild consume queues and index if problems remain (always after commitlog
    damage: units may point into it); fix the checkpoint."""
    from .rebuild import rebuild_store
    from ..store import MessageStore

    if not rebuild:
        store = MessageStore.open(path, cfg, start_services=False)
        try:
            rep = store.recovery_report
            if rep is not None and rep.damaged:
                done.append(f"{path}: opened and recovered: {rep.summary()}")
        finally:
            store.close()
        mid = check_store(path, cfg, progress=progress, live=False)
        rebuild = any(p.kind in ("consume queue", "index") for p in mid.problems)
    if rebuild:
        got = rebuild_store(path, cfg)
        done.append(f"{path}: consume queues and index rebuilt from the commitlog ({got['messages']} messages, "
                    f"{got['queues']} queues)")
    mid = check_store(path, cfg, progress=progress, live=False)
    if any(p.kind == "checkpoint" for p in mid.problems):
        done.append(_clamp_checkpoint(path / "checkpoint", path, cfg))


def _clamp_checkpoint(p: Path, root: Path, cfg: StoreConfig) -> str:
    """Set checkpoint timestamps later than the newest record back to it (the checkpoint then vouches for
    less: recovery checks more). Written with pwrite + fsync."""
    maps = FileCache()
    try:
        recs = check_commitlog(root, cfg, CheckReport(str(root)), maps, False)
    finally:
        maps.close()
    newest = int(recs.store_ts.max()) if len(recs.store_ts) else 0
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        raw = os.pread(fd, codec.CHECKPOINT.size, 0).ljust(codec.CHECKPOINT.size, b"\0")
        vals = [min(max(v, 0), newest) for v in codec.CHECKPOINT.unpack(raw)]
        os.pwrite(fd, codec.CHECKPOINT.pack(*vals), 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    return f"{p}: timestamps set back to the newest record's store time {newest}"
