"""What a store directory is, for the tools that take one: the names that mark it, and the one-line reason
a path is not one (with the store it holds in a `store/` folder, the layout of RocketMQ's storePathRootDir
copies and of the golden sets), and the files of a store folder named by digits (digit_files). Looks only:
creates and changes nothing."""
from __future__ import annotations

import os
import stat
from pathlib import Path

MARKERS = ("commitlog", "consumequeue", "checkpoint")             # a store that holds data has one of these
ENTRIES = frozenset({*MARKERS, "index", "abort", "lock", "config"})   # any of these: a store being made


def digit_files(d: str, digits: int | None = 20) -> list[tuple[int, str, int]]:
    """(the number in the name, path, size) of the regular files of directory d named by `digits` digits (any
    number of them: None), in name order; [] when d does not exist. A file removed between the listing and its
    stat (an open store's clean service, a repair) is left out."""
    try:
        names = sorted(os.listdir(d))
    except FileNotFoundError:
        return []
    out = []
    for n in names:
        if n.isdigit() and (digits is None or len(n) == digits):
            p = os.path.join(d, n)
            try:
                st = os.stat(p)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                out.append((int(n), p, st.st_size))
    return out


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


def not_a_store_to_write(path: str | os.PathLike, *, other_files: bool = True) -> str | None:
    """Why path cannot be a store to write (created if missing), or None. A file is refused, and so is a
    directory that is not a store but holds one in `store/` (the store was meant). Any other directory
    becomes a store as RocketMQ's broker makes one in its storePathRootDir, unless other_files is False:
    then one that holds other files than a store's (config/, lock, ...; hidden names aside) is refused."""
    p = Path(path)
    if not os.path.lexists(p):
        return None
    if not p.is_dir():
        return f"not a store directory: {p} (a file)"
    if is_store(p):
        return None
    held = _held(p)
    if held:
        return f"not a store directory: {p}{held}"
    if other_files:
        return None
    try:
        names = {n for n in os.listdir(p) if not n.startswith(".")}
    except OSError as e:
        return f"{p}: {e.strerror}"
    if not names or names & ENTRIES:
        return None
    return f"not a store directory: {p} (it holds other files: give a new or empty directory)"
