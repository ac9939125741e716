"""Store views kept between the triggers of a stream, and between the batch reads planned in one Python
process (plan.load_views; Spark reuses its Python workers): a view is loaded again only when a file of the
store changed (names, sizes, modification and change times and inodes of the commitlog, consume queue,
index, checkpoint, abort, lock and config files), so a read or trigger on a store nobody writes does not
emulate recovery again. Live views (a store another process has open) are loaded every time, reading each
queue's last file on from the end the previous load found (load_view's `previous`); stores at URIs
(store_fs: their listing has its own time to live) are never kept."""
from __future__ import annotations

import os

from ..store.files import store_fs
from . import storeview as SV

_MAX = 16


def _stamp(st: os.stat_result) -> tuple:
    # size and mtime, and what no copy or `touch` can set back: the inode and its change time (ctime moves on
    # every write and every utime, so an append whose writer restored sizes and mtimes is still seen)
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def fingerprint(root: str) -> tuple:
    """What identifies the store's state on disk: (path, size, mtime, ctime, inode) of the files a view reads:
    the commitlog, consume queue and index files, checkpoint, abort, lock and config/ (damagedRanges.json)."""
    out = []
    for name in ("checkpoint", "abort", "lock"):
        p = os.path.join(root, name)
        try:
            out.append((name, *_stamp(os.stat(p))))
        except OSError:
            out.append((name, -1))
    for d in (SV.commitlog_dir(root) or "", os.path.join(root, "consumequeue"), os.path.join(root, "index"),
              os.path.join(root, "config")):
        for dirpath, dirnames, files in os.walk(d):
            dirnames.sort()
            for f in sorted(files):
                try:
                    st = os.stat(os.path.join(dirpath, f))
                except OSError:
                    continue
                out.append((dirpath, f, *_stamp(st)))
    return tuple(out)


class ViewCache:
    """load_view, remembered per (root, topics) while the store's files stay the same."""

    def __init__(self) -> None:
        self._views: dict[tuple, tuple[tuple, SV.StoreView]] = {}

    def load(self, root: str, config, topics: set[str] | None) -> SV.StoreView:
        if store_fs.is_remote(root):
            return SV.load_view(root, config, topics=topics)
        key = (root, repr(config), None if topics is None else frozenset(topics))
        fp = fingerprint(root)
        got = self._views.get(key)
        if got is not None and got[0] == fp and not got[1].live:
            return got[1]
        # a live store's view is loaded again every time, from where its last load found each queue's end
        view = SV.load_view(root, config, topics=topics,
                            previous=got[1] if got is not None and got[1].live else None)
        if len(self._views) >= _MAX:
            self._views.pop(next(iter(self._views)))
        self._views[key] = (fp, view)
        return view
