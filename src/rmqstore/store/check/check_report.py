"""What `rmqstore check` reports (Problem, CheckReport) and how it finds a store's files, read-only.

Shared by the parts of the check (check_commitlog, check_derived, check_files) and the repair
(check_repair); the whole check is check.check_store.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..files import store_dir

Progress = Callable[[int, int], None]       # (bytes done, bytes in all)


class NotAStoreError(ValueError):
    """The path is not a store directory (missing, a file, no commitlog/)."""


@dataclass(frozen=True)
class Problem:
    """One thing found wrong: the file, the byte offset in it, what."""
    kind: str            # "commitlog", "consume queue", "index", "checkpoint", "config", "store"
    path: str
    offset: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}: offset {self.offset}: {self.what}"


@dataclass(frozen=True)
class DamagedSpan:
    """A commitlog byte range that fails its checks and that valid records follow (or a missing file's
    range): what `--repair` quarantines and records as accepted damage."""
    path: str                # the commitlog file (for a missing file: the file after the gap)
    file_from_offset: int    # its first commitlog offset
    pos: int                 # where the damage starts in it (a missing file: the gap's start - base, < 0)
    length: int
    reason: str

    @property
    def offset(self) -> int:
        return self.file_from_offset + self.pos

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass
class CheckReport:
    store: str
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)         # not problems: what recovery does at the next open
    records: int = 0
    units: int = 0
    index_entries: int = 0
    repaired: list[str] = field(default_factory=list)      # what repair_store did
    bad_config: list[tuple[Path, bool]] = field(default_factory=list)   # (unusable config file, .bak usable)
    damaged: list[DamagedSpan] = field(default_factory=list)            # commitlog damage not yet accepted
    accepted: list[tuple[int, int]] = field(default_factory=list)       # damagedRanges.json, merged
    deleted: dict[tuple[str, int], int] = field(default_factory=dict)   # deletedQueues.json
    live: bool = False                                      # another process had the store open
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, kind: str, path, offset: int, what: str) -> None:
        self.problems.append(Problem(kind, str(path), int(offset), what))

    def being_created(self, files: list, i: int) -> bool:
        """files[i] is a live store's newest file, still empty: its writer has just created it (a store
        written by RocketMQ, or by rmqstore before files were created whole, sizes it after creating it)."""
        return self.live and i == len(files) - 1 and files[i][2] == 0

    def summary(self) -> str:
        state = "ok" if self.ok else f"{len(self.problems)} problem{'s' * (len(self.problems) != 1)}"
        return (f"{self.store}: {state}: {self.records} commitlog records, {self.units} consume queue units, "
                f"{self.index_entries} index entries checked in {self.seconds:.2f} s")


def digit_files(d: Path, digits: int | None = 20) -> list[tuple[int, Path, int]]:
    """store_dir.digit_files with Path paths; [] also when d is not a directory."""
    try:
        return [(n, Path(p), size) for n, p, size in store_dir.digit_files(str(d), digits)]
    except NotADirectoryError:
        return []


def store_root(path: str | os.PathLike) -> Path:
    """path as a store directory; NotAStoreError naming it when it is not one (nothing is created)."""
    p = Path(path)
    if not p.exists():
        raise NotAStoreError(f"{p}: not a store directory (no such directory)")
    if not p.is_dir():
        raise NotAStoreError(f"{p}: not a store directory (not a directory)")
    if not (p / "commitlog").is_dir():
        raise NotAStoreError(f"{p}: not a store directory (no commitlog/ directory)")
    return p


def queue_dirs(root: Path) -> list[tuple[str, int, Path]]:
    """(topic, queue id, directory) of every consume queue directory."""
    out = []
    cq = root / "consumequeue"
    if not cq.is_dir():
        return out
    for t in sorted(os.listdir(cq)):
        if not (cq / t).is_dir():
            continue
        for q in sorted(os.listdir(cq / t)):
            if q.isdigit() and (cq / t / q).is_dir():
                out.append((t, int(q), cq / t / q))
    return out
