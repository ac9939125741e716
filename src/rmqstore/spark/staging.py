"""Build aside, swap in on success: the staging directory of a Spark rebuild.

A rebuild writes its consume queues and index into `{store}/.rebuild-<pid>/` (inside the store: same file
system, so renames are atomic, and executors see it where they see the store). Only when every file is
written does the driver swap: it writes the marker SWAP (fsynced), then per directory (consumequeue,
index) renames the store's one to `old-<name>` inside the staging directory and the new one into the
store. A rebuild that fails or is killed before SWAP leaves the store as it was (the staging directory
is removed, or, after a SIGKILL, by the next rebuild); one killed during the swap (four renames) is
completed by the next rebuild (`recover_stale`), which runs first under the store's lock.
"""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = ".rebuild-"
MARKER = "SWAP"
SUBDIRS = ("consumequeue", "index")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def stage_dir(store: Path) -> Path:
    return store / f"{PREFIX}{os.getpid()}"


def _swap(store: Path, stage: Path) -> None:
    for name in SUBDIRS:
        new = stage / name
        if not new.exists():
            continue                         # moved in already (a swap that is being completed)
        if (store / name).exists():
            os.rename(store / name, stage / f"old-{name}")
        os.rename(new, store / name)
    _fsync_dir(store)


def swap_in(store: Path, stage: Path) -> None:
    """Make the staged directories the store's (the caller holds the store's lock)."""
    for name in SUBDIRS:
        (stage / name).mkdir(exist_ok=True)  # an empty result is a result too
    with open(stage / MARKER, "w") as f:
        f.write("consumequeue and index of this directory are complete: swap them in\n")
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(stage)
    _swap(store, stage)
    shutil.rmtree(stage, ignore_errors=True)


def recover_stale(store: Path) -> list[str]:
    """Staging directories of dead rebuilds (the caller holds the store's lock, so none is alive):
    complete a swap that had started, remove the rest. Returns what was done."""
    done = []
    for stage in sorted(store.glob(PREFIX + "*")):
        if not stage.is_dir():
            continue
        if (stage / MARKER).exists():
            _swap(store, stage)
            done.append(f"{stage.name}: completed its swap")
            log.warning("%s: completed the swap of an interrupted Spark rebuild", stage)
        else:
            done.append(f"{stage.name}: removed (its rebuild did not finish)")
            log.warning("%s: removed the staging directory of a Spark rebuild that did not finish", stage)
        shutil.rmtree(stage, ignore_errors=True)
    return done
