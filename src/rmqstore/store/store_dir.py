"""What a store directory is, for the tools that take one: the names that mark it, and the one-line reason
a path is not one (with the store it holds in a `store/` folder, the layout of RocketMQ's storePathRootDir
copies and of the golden sets). Looks only: creates and changes nothing."""
from __future__ import annotations

import os
from pathlib import Path

MARKERS = ("commitlog", "consumequeue", "checkpoint")             # a store that holds data has one of these
ENTRIES = frozenset({*MARKERS, "index", "abort", "lock", "config"})   # any of these: a store being made


def is_store(path: str | os.PathLike) -> bool:
    p = Path(path)
    try:
        return p.is_dir() and any(os.path.lexists(p / name) for name in MARKERS)
    except OSError:
        return False


def _held(p: Path) -> str:
    """' (it holds a store: P/store)' when P/store is a store directory, else ''."""
    return f" (it holds a store: {p / 'store'})" if is_store(p / "store") else ""


def not_a_store(path: str | os.PathLike) -> str | None:
    """Why path is not a store directory to read ("not a store directory: PATH ..."), or None when it is."""
    p = Path(path)
    if is_store(p):
        return None
    if not os.path.lexists(p):
        return f"not a store directory: {p} (no such directory)"
    if not p.is_dir():
        return f"not a store directory: {p} (a file)"
    return f"not a store directory: {p}" + (_held(p) or " (no commitlog/, consumequeue/ or checkpoint)")


def not_a_store_to_write(path: str | os.PathLike) -> str | None:
    """Why path cannot be a store to write (created if missing), or None: it is a store, is missing, empty
    or holds only store entries (config/, lock, ...). A file, or a directory that holds other things (a
    `store/` folder, a project), is refused rather than filled with a new store."""
    p = Path(path)
    if not os.path.lexists(p):
        return None
    if not p.is_dir():
        return f"not a store directory: {p} (a file)"
    try:
        names = {n for n in os.listdir(p) if not n.startswith(".")}
    except OSError as e:
        return f"{p}: {e.strerror}"
    if not names or names & ENTRIES:
        return None
    return f"not a store directory: {p}" + (_held(p) or " (it holds other files: give a new or empty directory)")
