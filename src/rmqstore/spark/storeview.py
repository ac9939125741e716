"""A read-only view of a store directory: what its consume queues hold, as MessageStore.open would serve
them, worked out without writing anything and without taking the store's lock.

Two cases:

* the store is open in another process (its `lock` file is locked, as MessageStore and RocketMQ's broker
  hold it): the view is what a consumer gets now, the consume queues' units as far as they are written
  (the last file of each queue is read up to its first empty unit). The commitlog's end may hold a
  record being written; nothing after the queues is read.

* nobody holds the store: the view is what the store serves after MessageStore.open's recovery, which
  is emulated read-only, step by step (rmqstore.store.recovery, ConsumeQueue.recover, IndexService.load):
  the commitlog is checked (after a crash from the file the checkpoint vouches for, with CRCs, as
  recovery does; after a clean shutdown from where the queues and the index end), queue units are kept
  up to the last valid one and not past the commitlog's end, and the records recovery would re-dispatch
  (from rmqstore's reput start) become "tail" units appended to their queues in memory. A crashed store
  therefore reads as RocketMQ and rmqstore return it after recovery.

The view is plain data (picklable): Spark partitions carry the parts they need.
"""
from __future__ import annotations

import fcntl
import glob
import logging
import os
import struct
import types
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..store import codec
from ..store.config import StoreConfig
from ..store.consume_queue import search_by_time, short_only_file
from ..store.index_file import IndexFile, key_hash
from ..store.mapped_file import FileCache, map_read_only  # noqa: F401 - used here and by spark modules
from ..store.recovery import CQ_CHECK_SAMPLE, _checked_positions, structure_problem, unit_problems
from . import records as R

log = logging.getLogger(__name__)

UNIT = codec.CQ_STORE_UNIT_SIZE
CQ_NP = np.dtype(codec.CQ_DTYPE)
BLANK_SIZE = codec.CQ_BLANK_SIZE
MAX_TIME = 2 ** 63 - 1
_TRAN_MASK = codec.TRANSACTION_TYPE_MASK
NOT_DISPATCHED = (codec.TRANSACTION_PREPARED_TYPE, codec.TRANSACTION_ROLLBACK_TYPE)


class StoreError(ValueError):
    """A path, option or file that makes a read impossible; the message names it."""


# --- files ------------------------------------------------------------------------------------------
def _digit_files(d: str, digits: int | None = 20) -> list[tuple[int, str, int]]:
    """(offset from the name, path, size) of the files of d named by digits, in name order."""
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    out = []
    for n in sorted(names):
        if n.isdigit() and (digits is None or len(n) == digits):
            p = os.path.join(d, n)
            try:
                st = os.stat(p)
            except FileNotFoundError:
                continue
            if os.path.isfile(p):
                out.append((int(n), p, st.st_size))
    return out


# read-only mappings live with the other mappings (rmqstore.store.mapped_file); the names stay importable here
_FLOCK = struct.Struct("hhqqi4x")


def lock_held_elsewhere(store: str | os.PathLike) -> bool:
    """True when another process (or this one, through rmqstore.store.lock) holds the store's lock.

    A probe (F_GETLK on byte 0, the byte MessageStore and RocketMQ lock): nothing is locked or written.
    """
    root = Path(store)
    try:
        from ..store.lock import _held
        if str(root.resolve()) in _held:
            return True
    except ImportError:  # pragma: no cover
        pass
    p = root / "lock"
    try:
        fd = os.open(p, os.O_RDONLY)
    except OSError:
        return False
    try:
        got = fcntl.fcntl(fd, fcntl.F_GETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0))
        return _FLOCK.unpack(got)[0] != fcntl.F_UNLCK
    except OSError:
        return False
    finally:
        os.close(fd)


def resolve_paths(path: str | None, paths_json: str | None) -> list[str]:
    """The store directories named by the `path` option (a path or a glob) or `paths` (a JSON list)."""
    import json
    items: list[str] = []
    if paths_json:
        try:
            got = json.loads(paths_json)
        except ValueError:
            got = None
        if not isinstance(got, list) or not all(isinstance(x, str) for x in got):
            raise StoreError(f"option 'paths' must be a JSON list of store directories, got {paths_json!r}")
        items.extend(got)
    if path:
        items.append(path)
    if not items:
        raise StoreError("option 'path' is missing: load(PATH) with a store directory (or a glob, or a list)")
    out: list[str] = []
    for item in items:
        hits = sorted(glob.glob(item)) if glob.has_magic(item) else [item]
        if not hits:
            raise StoreError(f"option 'path': {item!r} matches no store directory")
        for h in hits:
            root = os.path.abspath(h)
            if commitlog_dir(root) is None:
                raise StoreError(f"option 'path': {h!r} is not a RocketMQ store directory "
                                 "(no commitlog/ directory and no commitlog files)")
            if root not in out:
                out.append(root)
    return out


def commitlog_dir(root: str) -> str | None:
    """root/commitlog, or root itself when it holds commitlog files (a bare commitlog directory)."""
    if not os.path.isdir(root):
        return None
    sub = os.path.join(root, "commitlog")
    if os.path.isdir(sub):
        return sub
    if any(len(n) == 20 and n.isdigit() for n in os.listdir(root)):
        return root
    return None


def broker_name(root: str) -> str:
    """The broker column: the store directory's name (its parent's when it is called `store`, RocketMQ's
    default storePathRootDir name, so that /data/broker-a/store reads as broker-a)."""
    p = Path(root)
    return p.parent.name if p.name == "store" and p.parent.name else p.name


def list_topics(root: str) -> dict[str, list[int]]:
    """Topics and queue ids of the consume queue directories."""
    cq = os.path.join(root, "consumequeue")
    out: dict[str, list[int]] = {}
    if not os.path.isdir(cq):
        return out
    for t in sorted(os.listdir(cq)):
        td = os.path.join(cq, t)
        if os.path.isdir(td):
            out[t] = sorted(int(q) for q in os.listdir(td) if q.isdigit() and os.path.isdir(os.path.join(td, q)))
    return out


# --- the view ----------------------------------------------------------------------------------------
@dataclass
class CLFile:
    base: int
    path: str
    size: int


@dataclass
class QueueView:
    """One consume queue as the store would serve it: logical offsets [min_offset, end)."""
    topic: str
    queue_id: int
    dir: str
    files: list[tuple[int, str, int]]      # (byte offset from the name, path, size) of its files
    min_offset: int                         # first readable logical offset
    disk_end: int                           # logical end of the valid units on disk
    max_physic_offset: int = -1
    tail: np.ndarray = field(default_factory=lambda: np.empty((0, 2), dtype=np.int64))  # (offset, size)
    file_units: int = 0                     # units per file (configured size / 20)
    tail_skip: int = 0                      # tail units dropped from the front (a partition's copy)

    @property
    def end(self) -> int:
        return self.disk_end + self.tail_skip + len(self.tail)

    def units(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """(commitlog offsets, sizes) of logical offsets [a, b) within [min_offset, end), as int64."""
        a = max(a, self.min_offset)
        b = min(b, self.end)
        offs, sizes = [], []
        if a < min(b, self.disk_end):
            lo, hi = a * UNIT, min(b, self.disk_end) * UNIT
            for base, path, size in self.files:
                s, e = max(lo, base), min(hi, base + size - size % UNIT)
                if s >= e:
                    continue
                arr = np.fromfile(path, dtype=CQ_NP, count=(e - s) // UNIT, offset=s - base)
                offs.append(arr["offset"].astype(np.int64))
                sizes.append(arr["size"].astype(np.int64))
        t0 = self.disk_end + self.tail_skip
        if b > t0 and len(self.tail):
            t = self.tail[max(a, t0) - t0: b - t0]
            offs.append(t[:, 0])
            sizes.append(t[:, 1])
        if not offs:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        return np.concatenate(offs), np.concatenate(sizes)

    def slim(self, a: int, b: int) -> "QueueView":
        """A copy carrying only the tail units of [a, b) (what a partition reading [a, b) needs)."""
        t0 = self.disk_end + self.tail_skip
        lo = min(max(a - t0, 0), len(self.tail))
        hi = min(max(b - t0, lo), len(self.tail))
        return QueueView(self.topic, self.queue_id, self.dir, self.files, self.min_offset, self.disk_end,
                         self.max_physic_offset, self.tail[lo:hi].copy(), self.file_units, self.tail_skip + lo)


@dataclass
class StoreView:
    root: str
    broker: str
    config: StoreConfig
    live: bool
    clean: bool
    cl_files: list[CLFile]
    cl_file_size: int
    cl_min: int
    data_end: int | None                  # where the commitlog's valid data ends (None: live, unknown)
    queues: dict[tuple[str, int], QueueView]
    index_files: list[str] = field(default_factory=list)   # the index files recovery keeps
    index_end: int = 0                     # commitlog offset up to which those files index messages
    reput_from: int | None = None
    notes: list[str] = field(default_factory=list)

    def topics(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for t, q in sorted(self.queues):
            out.setdefault(t, []).append(q)
        return out

    def file_of(self, offset: int) -> CLFile | None:
        for f in self.cl_files:
            if f.base <= offset < f.base + max(f.size, self.cl_file_size):
                return f
        return None

    def store_time(self, cache: FileCache, offset: int, size: int) -> int:
        """RocketMQ's pickupStoreTimestamp: the store time of the record at offset (-1 if unreadable)."""
        f = self.file_of(offset)
        if f is None:
            return -1
        _, buf = cache.get(f.path)
        pos = offset - f.base
        if pos < 0 or pos + codec.HEADER_V4.size > len(buf):
            return -1
        sys_flag = int.from_bytes(buf[pos + codec.POS_SYSFLAG: pos + codec.POS_SYSFLAG + 4], "big", signed=True)
        p = pos + codec.store_timestamp_pos(sys_flag)
        return int.from_bytes(buf[p:p + 8], "big", signed=True)


def _cl_files(cdir: str) -> list[CLFile]:
    return [CLFile(b, p, s) for b, p, s in _digit_files(cdir)]


def _first_store_timestamp(buf) -> int:
    if len(buf) < codec.HEADER_V4.size:
        return 0
    total, magic = codec._II.unpack_from(buf, 0)
    if magic not in (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2):
        return 0
    sys_flag = codec._I.unpack_from(buf, codec.POS_SYSFLAG)[0]
    return struct.unpack_from(">q", buf, codec.store_timestamp_pos(sys_flag))[0]


def _read_checkpoint(root: str) -> tuple[int, int, int]:
    try:
        with open(os.path.join(root, "checkpoint"), "rb") as f:
            raw = f.read(codec.CHECKPOINT.size)
    except OSError:
        return 0, 0, 0
    if len(raw) < codec.CHECKPOINT.size:
        return 0, 0, 0
    return codec.CHECKPOINT.unpack(raw)


def load_view(root: str, config: StoreConfig | None = None, *, live: bool | None = None,
              topics: set[str] | None = None) -> StoreView:
    """The view of the store at root (see the module docstring). `topics` limits the queues in the view
    (recovery still examines every queue: where the re-dispatch starts depends on all of them)."""
    root = os.path.abspath(root)
    config = config or StoreConfig()
    cdir = commitlog_dir(root)
    if cdir is None:
        raise StoreError(f"option 'path': {root!r} is not a RocketMQ store directory")
    if live is None:
        live = lock_held_elsewhere(root)
    clean = not os.path.exists(os.path.join(root, "abort"))
    files = _cl_files(cdir)
    sizes = [f.size for f in files]
    file_size = config.mapped_file_size_commit_log
    if files and max(sizes) > file_size:
        file_size = max(sizes)          # the configuration was not given: the files tell their size
    if files and len(files) > 1 and sizes[0] != file_size and sizes[0] == max(sizes):
        file_size = sizes[0]
    cl_min = files[0].base if files else 0
    view = StoreView(root, broker_name(root), config, live, clean, files, file_size, cl_min, None, {})
    cq_size = config.mapped_file_size_consume_queue
    qdirs = []
    for t, qids in list_topics(root).items():
        if topics is not None and t not in topics and live:
            continue
        for q in qids:
            qdirs.append((t, q, os.path.join(root, "consumequeue", t, str(q))))
    if live:
        for t, q, d in qdirs:
            qv = _live_queue(t, q, d, cq_size, cl_min)
            if qv is not None:
                view.queues[(t, q)] = qv
        return view
    _recover(view, qdirs, cq_size, topics)
    return view


def _units_of(path: str, nbytes: int | None = None) -> np.ndarray:
    return np.fromfile(path, dtype=CQ_NP, count=-1 if nbytes is None else nbytes // UNIT)


def _is_real(arr) -> np.ndarray:
    return (arr["size"] != BLANK_SIZE) | (arr["offset"] != 0)


def _live_queue(topic: str, qid: int, d: str, cq_size: int, cl_min: int) -> QueueView | None:
    files = _digit_files(d)
    if not files:
        return None
    per = max(cq_size // UNIT, 1)
    base, path, size = files[-1]
    arr = _units_of(path, size - size % UNIT)
    bad = np.flatnonzero((arr["offset"] < 0) | (arr["size"] <= 0))
    n = int(bad[0]) if len(bad) else len(arr)
    disk_end = base // UNIT + n
    qv = QueueView(topic, qid, d, files, 0, disk_end, -1, file_units=per)
    if n:
        qv.max_physic_offset = int(arr["offset"][n - 1]) + int(arr["size"][n - 1])
    qv.min_offset = _min_offset(files, disk_end, max(cl_min, 0))
    return qv


def _min_offset(files, disk_end: int, phy_min: int) -> int:
    """ConsumeQueue._first_real_unit_offset then correct_min_offset(phy_min), in units."""
    if not files:
        return 0
    # first real unit of the first file
    b0, p0, s0 = files[0]
    first_end = min(s0 // UNIT, max(disk_end - b0 // UNIT, 0))
    arr = _units_of(p0, first_end * UNIT)
    real = np.flatnonzero(_is_real(arr))
    min_off = b0 // UNIT + (int(real[0]) if len(real) else first_end)
    for i, (b, p, s) in enumerate(files):
        count = min(s // UNIT, max(disk_end - b // UNIT, 0))
        a = arr if i == 0 else _units_of(p, count * UNIT)
        ok = np.flatnonzero((a["offset"] >= phy_min) & (a["size"] > 0) & (a["size"] != BLANK_SIZE))
        if len(ok):
            return max(min_off, b // UNIT + int(ok[0]))
        if i == len(files) - 1:
            min_off = max(min_off, b // UNIT + count)
    return min_off


def _recover(view: StoreView, qdirs, cq_size: int, topics: set[str] | None) -> None:
    cache = FileCache()
    try:
        _recover_with(view, qdirs, cq_size, topics, cache)
    finally:
        cache.close()


def _recover_queue(view: StoreView, t: str, q: int, d: str, cq_size: int, per: int,
                   limit: int | None = None) -> tuple[QueueView, bool, int]:
    """ConsumeQueue.recover(limit), read-only: valid units from the third-last file on (offsets growing,
    messages ending by the commitlog's end). Returns the queue, whether units were dropped, and where the
    messages of the units it checked end."""
    qfiles = _digit_files(d)
    qv = QueueView(t, q, d, qfiles, 0, 0, -1, file_units=per)
    if not qfiles:
        return qv, False, -1
    idx = max(0, len(qfiles) - 3)
    prev_off = -1
    scanned_end = -1
    process = qfiles[idx][0]
    loaded = {}
    while idx < len(qfiles):
        base, path, size = qfiles[idx]
        arr = loaded[path] = _units_of(path, size - size % UNIT)
        bad = np.flatnonzero((arr["offset"] < 0) | (arr["size"] <= 0))
        n = int(bad[0]) if len(bad) else len(arr)
        off = arr["offset"][:n].astype(np.int64)
        sz = arr["size"][:n].astype(np.int64)
        real = (sz[:n] != BLANK_SIZE) | (off[:n] != 0)
        ro = off[:n][real]
        if len(ro):
            ends = ro + sz[:n][real]
            order_bad = np.flatnonzero(np.diff(np.concatenate(([prev_off], ro))) <= 0)
            limit_bad = np.flatnonzero(ends > limit) if limit is not None else np.empty(0, dtype=np.int64)
            cut = min([int(x) for x in (order_bad[:1].tolist() + limit_bad[:1].tolist())] or [len(ro)])
            if cut < len(ro):
                n = int(np.flatnonzero(real)[cut])
                ro = ro[:cut]
                ends = ends[:cut]
            if len(ro):
                prev_off = int(ro[-1])
                scanned_end = max(scanned_end, int(ends.max()))
        process = base + n * UNIT
        if n * UNIT == cq_size and idx + 1 < len(qfiles):
            idx += 1
            continue
        break
    dropped = False
    for base, path, size in qfiles:             # _count_units_from(process) > 0
        if base + size <= process:
            continue
        start = max(0, process - base)
        raw = loaded[path].view(np.uint8)[start:] if path in loaded else np.fromfile(path, dtype=np.uint8, offset=start)
        if np.count_nonzero(raw):
            dropped = True
            break
    qv.disk_end = process // UNIT
    qv.files = [f for f in qfiles if f[0] <= process] or qfiles[:1]
    return qv, dropped, scanned_end


def _last_unit(qv: QueueView) -> tuple[int, int] | None:
    if qv.disk_end <= qv.min_offset or not qv.files:
        return None
    o, s = _unit_at(qv, qv.disk_end - 1)
    return (o, s) if o is not None else None


def _unit_at(qv: QueueView, i: int) -> tuple[int | None, int | None]:
    for base, path, size in qv.files:
        if base <= i * UNIT < base + size - size % UNIT:
            a = np.fromfile(path, dtype=CQ_NP, count=1, offset=i * UNIT - base)
            if len(a):
                return int(a["offset"][0]), int(a["size"][0])
    return None, None


def _cl_sources(view: StoreView, cache: FileCache):
    """The commitlog files as recovery.unit_problems reads them (up to the end of the valid data)."""
    end = view.data_end
    out = []
    for f in view.cl_files:
        def load(f=f):
            buf = cache.get(f.path)[1]
            return buf if end is None else buf[:max(0, min(len(buf), end - f.base))]
        out.append((f.base, f.base + max(f.size, view.cl_file_size), load))
    return out


def _first_damaged_unit(view: StoreView, qv: QueueView, cache: FileCache) -> int | None:
    """recovery.check_queue, read-only: the first unit open() would cut and rebuild (a missing file, a unit
    that cannot be right, a unit of the last file not matching its record, a sampled older one), or None."""
    lo, hi = qv.min_offset, qv.disk_end
    if hi <= lo:
        return None
    offs, sizes, expect, missing = [], [], lo, None
    for base, path, size in qv.files:
        b, e = base // UNIT, min(base // UNIT + size // UNIT, hi)
        if e <= expect:
            continue
        if b > expect:
            missing = expect
            break
        a = np.fromfile(path, dtype=CQ_NP, count=e - expect, offset=(expect - b) * UNIT)
        offs.append(a["offset"].astype(np.int64))
        sizes.append(a["size"].astype(np.int64))
        expect = b + len(a)
        if expect < e:
            missing = expect
            break
    off = np.concatenate(offs) if offs else np.empty(0, np.int64)
    size = np.concatenate(sizes) if sizes else np.empty(0, np.int64)
    found = [missing] if missing is not None else []
    upto = len(off)
    st = structure_problem(off, size)
    if st is not None:
        found.append(lo + st[0])
        upto = st[0]
    deep_from = qv.files[-1][0] // UNIT if qv.files else lo
    idx = _checked_positions(upto, deep_from - lo, CQ_CHECK_SAMPLE)
    if len(idx):
        codes = unit_problems(off[idx], size[idx], lo + idx, qv.queue_id, qv.topic.encode("utf-8"),
                              _cl_sources(view, cache), view.cl_min)
        bad = np.flatnonzero(codes)
        if len(bad):
            found.append(lo + int(idx[bad[0]]))
    return min(found) if found else None


def _reput_start(view: StoreView, queues: dict, rebuild: list, index_end: int | None, checked_from: int,
                 cq_size: int) -> int:
    """recovery.reput_start over the view."""
    cl_min = max(view.cl_min, 0)
    cq_max = max((qv.max_physic_offset for qv in queues.values()), default=-1)
    cands = [cq_max if cq_max >= 0 else cl_min]
    for qv in queues.values():
        if not qv.files:
            cands.append(qv.max_physic_offset if qv.max_physic_offset >= 0 else cl_min)
            continue
        wrote = max(0, min(qv.disk_end * UNIT - qv.files[-1][0], cq_size))
        if wrote in (0, cq_size):
            cands.append(qv.max_physic_offset if qv.max_physic_offset >= 0 else cl_min)
    for qv in rebuild:
        cands.append(qv.max_physic_offset if qv.max_physic_offset >= 0 else cl_min)
    if index_end is not None:
        cands.append(index_end)
    if not view.clean:
        cands.append(checked_from)
    return max(cl_min, min(cands))


def _recover_with(view: StoreView, qdirs, cq_size: int, topics: set[str] | None, cache: FileCache) -> None:
    """recovery.recover_store, read-only (module docstring)."""
    cfg = view.config
    files = view.cl_files
    cl_min = max(view.cl_min, 0)
    per = max(cq_size // UNIT, 1)
    index_on = cfg.message_index_enable
    # 1. the commitlog's end. After a crash the walk starts at the file the checkpoint vouches for and
    # checks CRCs, as recovery does. After a clean shutdown it starts where the re-dispatch starts
    # (recovery re-checks the last three files: records the queues already point at are taken as is).
    checked_from = cl_min
    pre_full: dict = {}
    if not files:
        view.data_end = 0
    else:
        if view.clean:
            pre_full = {(t, q): _recover_queue(view, t, q, d, cq_size, per) for t, q, d in qdirs}
            pre = {k: v[0] for k, v in pre_full.items()}
            for qv in pre.values():
                last = _last_unit(qv)
                qv.max_physic_offset = last[0] + last[1] if last else -1
            pre_index = _recover_index(view, cache, None) if index_on else None
            walk_from = _reput_start(view, pre, [], pre_index, cl_min, cq_size)
            start_idx = next((i for i, f in enumerate(files)
                              if f.base <= walk_from < f.base + max(f.size, view.cl_file_size)), len(files) - 1)
        else:
            ck_phys, ck_logics, ck_index = _read_checkpoint(view.root)
            ck_min = max(min(ck_phys, ck_logics) - 3000, 0)
            limit = min(ck_min, ck_index) if index_on and cfg.message_index_safe else ck_min
            start_idx = 0
            for i in range(len(files) - 1, -1, -1):
                mm, _ = cache.get(files[i].path)
                ts = _first_store_timestamp(mm) if mm is not None else 0
                if 0 < ts <= limit:
                    start_idx = i
                    break
            walk_from = checked_from = files[start_idx].base
        view.data_end = _check_commitlog(view, cache, start_idx, walk_from,
                                         cfg.check_crc_on_recover and not view.clean)
    end = view.data_end
    # a queue's only file cut short is repaired by open() when other queues' files confirm the geometry
    confirmed = any(n == cq_size for _, _, d in qdirs for _, _, n in _digit_files(d))
    # 2. consume queues: recover_consume_queues, then correct_min_offset
    queues: dict[tuple[str, int], QueueView] = {}
    rebuild: list[QueueView] = []
    for t, q, d in qdirs:
        got = pre_full.get((t, q))
        if got is not None and got[2] <= end:       # the limit changes nothing: reuse the first pass
            qv, dropped = got[0], got[1]
            qv.max_physic_offset = -1
        else:
            qv, dropped, _ = _recover_queue(view, t, q, d, cq_size, per, end)
        qv.min_offset = _min_offset(qv.files, qv.disk_end, 0)
        if confirmed and short_only_file([(p, n) for _, p, n in _digit_files(d)], cq_size) is not None:
            view.notes.append(f"{d}: its only file is cut short: open() extends it, rebuilds what it lost")
            dropped = True
        last = _last_unit(qv)
        if last is not None and last[0] + last[1] > end:
            offs, sizes = _disk_units(qv)
            first = qv.files[0][0] // UNIT
            real = (sizes != BLANK_SIZE) | (offs != 0)
            keep = np.flatnonzero(real & (offs < end) & (sizes > 0))
            new_end = first + int(keep[-1]) + 1 if len(keep) else first
            dropped = dropped or new_end < qv.disk_end
            qv.disk_end = new_end
            last = _last_unit(qv)
        if qv.files:
            bad = _first_damaged_unit(view, qv, cache)
            if bad is not None:
                view.notes.append(f"{d}: unit {bad} is damaged: the queue is rebuilt from there, as open() does")
                dropped = dropped or bad < qv.disk_end
                qv.disk_end = bad
                qv.files = [f for f in qv.files if f[0] <= bad * UNIT] or qv.files[:1]
                last = _last_unit(qv)
        qv.max_physic_offset = last[0] + last[1] if last is not None else -1
        qv.min_offset = _min_offset(qv.files, qv.disk_end, cl_min) if qv.files else 0
        queues[(t, q)] = qv
        if dropped:
            rebuild.append(qv)
    # 3. the index: recover_index
    index_end = _recover_index(view, cache, end) if index_on else None
    view.index_end = index_end or 0
    # 4. the re-dispatch: from rmqstore's reput start to the end of the data
    start = _reput_start(view, queues, rebuild, index_end, checked_from, cq_size)
    view.reput_from = start
    _redispatch(view, queues, cache, start, end, per, topics)
    view.queues = {k: v for k, v in queues.items() if (v.end > 0 or v.files) and (topics is None or k[0] in topics)}


def _disk_units(qv: QueueView, start: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, sizes) of the units on disk from logical offset start (default: the first file's first)."""
    offs, sizes = [], []
    for base, path, size in qv.files:
        lo = base // UNIT if start is None else max(start, base // UNIT)
        count = min(base // UNIT + size // UNIT, qv.disk_end) - lo
        if count <= 0:
            continue
        a = np.fromfile(path, dtype=CQ_NP, count=count, offset=(lo - base // UNIT) * UNIT)
        offs.append(a["offset"].astype(np.int64))
        sizes.append(a["size"].astype(np.int64))
    if not offs:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(offs), np.concatenate(sizes)


def _check_commitlog(view: StoreView, cache: FileCache, idx: int, start: int, check_crc: bool) -> int:
    """recover_commit_log's walk from `start` in file idx: the offset where the valid data ends."""
    files = view.cl_files
    process = start
    while idx < len(files):
        f = files[idx]
        mm, buf = cache.get(f.path)
        if mm is None:
            process = f.base
            break
        limit = len(buf)
        pos = max(start - f.base, 0)
        blank = False
        try:
            positions, stop, why = R.walk(mm, pos, limit)
            if len(positions):
                recs = R.Records(buf, f.base, positions, limit)
                bad = np.flatnonzero(~recs.valid)
                n_ok = int(bad[0]) if len(bad) else len(positions)
                if check_crc and n_ok:
                    crc = zlib.crc32
                    mv = memoryview(mm)
                    for i, (b0, bl, want) in enumerate(zip(recs.body_pos[:n_ok].tolist(), recs.body_len[:n_ok].tolist(),
                                                           recs.body_crc[:n_ok].tolist())):
                        if crc(mv[b0:b0 + bl]) & 0x7FFFFFFF != want:
                            n_ok = i
                            break
                    mv.release()
                if n_ok < len(positions):
                    stop = int(positions[n_ok])
                    why = "invalid"
            if why == "blank":
                codec.check_record(mm, stop, limit)   # a blank that does not fit raises
                blank = True
            elif why == "invalid":
                codec.check_record(mm, stop, limit, check_crc)   # raises with the reason
            pos = stop
        except codec.RecordError as e:
            view.notes.append(f"{f.path}: invalid record at offset {e.pos} ({e.reason}): the data ends there")
            pos = e.pos
            blank = False
        except Exception:
            raise
        process = f.base + pos
        if blank and idx + 1 < len(files):
            idx += 1
            start = files[idx].base
            continue
        if blank:
            process = f.base + max(f.size, view.cl_file_size)
        break
    return process


def _redispatch(view: StoreView, queues: dict, cache: FileCache, start: int, end: int, per: int,
                topics: set[str] | None) -> None:
    """The units the dispatcher would add from `start` to `end`: appended to the queues' tails."""
    tails: dict[tuple[str, int], list[np.ndarray]] = {}
    ends: dict[tuple[str, int], int] = {}
    for f in view.cl_files:
        fend = f.base + max(f.size, view.cl_file_size)
        if fend <= start or f.base >= end:
            continue
        _, buf = cache.get(f.path)
        pos0 = max(start - f.base, 0)
        limit = min(len(buf), end - f.base)
        positions, stop, why = R.walk(buf, pos0, limit)
        if not len(positions):
            continue
        recs = R.Records(buf, f.base, positions, limit)
        bad = np.flatnonzero(~recs.valid)
        if len(bad):
            recs = recs.slice(0, int(bad[0]))
        tran = recs.sys_flag & _TRAN_MASK
        recs = recs.select((tran != NOT_DISPATCHED[0]) & (tran != NOT_DISPATCHED[1]))
        if not len(recs):
            continue
        tnames = recs.topics().to_pylist()
        qids = recs.queue_id
        offs = recs.offsets
        sizes = recs.total
        qoffs = recs.queue_offset
        groups: dict[tuple[str, int], list[int]] = {}
        tq = list(zip(tnames, qids.tolist()))
        for i, k in enumerate(tq):          # one dict lookup per re-dispatched record
            groups.setdefault(k, []).append(i)
        for k, idx in groups.items():
            t, q = k
            if topics is not None and t not in topics:
                continue
            sel = np.asarray(idx, dtype=np.int64)
            qv = queues.get(k)
            if qv is None or (not qv.files and k not in tails):
                # a queue without files: its first unit makes the first file, at the unit's queue offset
                d = os.path.join(view.root, "consumequeue", t, str(q))
                first = int(qoffs[sel[0]])
                qv = queues[k] = QueueView(t, q, d, [], first, first, -1, file_units=per)
            lim = ends.get(k, qv.max_physic_offset)
            o, s = offs[sel], sizes[sel]
            take = o + s > lim
            if take.any():
                tails.setdefault(k, []).append(np.stack([o[take], s[take]], axis=1))
                ends[k] = int(o[take][-1] + s[take][-1])
    for k, parts in tails.items():
        qv = queues[k]
        qv.tail = np.concatenate(parts).astype(np.int64)
        qv.max_physic_offset = ends[k]


class ReadOnlyIndexFile(IndexFile):
    """An IndexFile opened read-only (a read-only mapping; load() and the select functions only)."""

    def __init__(self, path: str | os.PathLike, max_hash_slot_num: int, max_index_num: int):
        self.path = Path(path)
        self.name = self.path.name
        self.hash_slot_num = max_hash_slot_num
        self.index_num = max_index_num
        self.file_size = codec.index_file_size(max_hash_slot_num, max_index_num)
        self.entries_base = codec.INDEX_HEADER_SIZE + max_hash_slot_num * codec.INDEX_HASH_SLOT_SIZE
        mm = map_read_only(str(self.path))
        if mm is None or len(mm) != self.file_size:
            size = 0 if mm is None else len(mm)
            if mm is not None:
                mm.close()
            raise StoreError(f"index file {self.path} has {size} bytes, not {self.file_size} "
                             f"(maxHashSlotNum={max_hash_slot_num}, maxIndexNum={max_index_num}): give the "
                             "store's configuration with option 'config'")
        self._mm = mm
        self._pread_fd = None       # IndexFile reads the header with pread (by path), the slots from the map
        self.mapped_file = types.SimpleNamespace(mm=mm)     # what recovery.index_file_problems reads
        self.begin_timestamp = self.end_timestamp = self.begin_phy_offset = self.end_phy_offset = 0
        self.hash_slot_count = 0
        self.index_count = 1
        self._closed = False
        self._dirty = False
        self.flush_count = 0
        self._warned = set()
        try:
            self.load()
        except BaseException:
            mm.close()
            raise

    def write_header(self) -> None:     # never writes
        raise PermissionError(f"{self.path}: opened read-only")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._mm.close()

    shutdown = close


def _index_names(root: str) -> list[str]:
    d = os.path.join(root, "index")
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    return [os.path.join(d, n) for n in sorted(names) if n.isdigit() and os.path.isfile(os.path.join(d, n))]


def index_geometry(view: StoreView) -> tuple[int, int]:
    """(maxHashSlotNum, maxIndexNum) of the store's index files: the configuration's when the files have
    its size, else inferred from the size with RocketMQ's ratio maxIndexNum = 4 * maxHashSlotNum."""
    cfg = view.config
    sizes = {os.path.getsize(p) for p in _index_names(view.root)} - {0}
    expected = codec.index_file_size(cfg.max_hash_slot_num, cfg.max_index_num)
    if not sizes or sizes == {expected}:
        return cfg.max_hash_slot_num, cfg.max_index_num
    if len(sizes) == 1:
        size = sizes.pop()
        if (size - codec.INDEX_HEADER_SIZE) % 84 == 0:
            s = (size - codec.INDEX_HEADER_SIZE) // 84
            if s > 0:
                return s, 4 * s
    raise StoreError(f"option 'config': the index files of {view.root} do not have the size "
                     f"maxHashSlotNum={cfg.max_hash_slot_num} maxIndexNum={cfg.max_index_num} gives ({expected} "
                     "bytes): give the store's configuration (option config) to query by key")


INDEX_DEEP_CHECK_BYTES = 64 << 20


def _recover_index(view: StoreView, cache: FileCache, end: int | None, destroy: bool | None = None,
                   deep: bool = True) -> int:
    """IndexService.load then recovery.recover_index, read-only: sets view.index_files (the files the store
    keeps) and returns the commitlog offset from which the index needs messages again (after the last
    indexed one). Entries of the last file at or past `end` count as cut (key lookups stop below it)."""
    if destroy is None:
        destroy = not view.clean
    _, _, ck_index = _read_checkpoint(view.root)
    try:
        slots, num = index_geometry(view)
    except StoreError:
        slots = num = None
        deep = False
    loaded: list[dict] = []
    aside: list[str] = []
    for p in _index_names(view.root):
        try:
            with open(p, "rb") as f:
                raw = f.read(codec.INDEX_HEADER_SIZE)
        except OSError as e:
            view.notes.append(f"{p}: {e}")
            continue
        if not raw:
            continue                     # empty: load() removes it
        if len(raw) < codec.INDEX_HEADER_SIZE:
            aside.append(os.path.basename(p))
            continue
        b_ts, e_ts, b_phy, e_phy, _slots, count = codec.INDEX_HEADER.unpack(raw)
        if count < 0 or (num is not None and count > num) or min(b_ts, e_ts, b_phy, e_phy) < 0:
            view.notes.append(f"{p}: impossible index header: set aside by recovery")
            aside.append(os.path.basename(p))
            continue
        if destroy and e_ts > ck_index:
            continue                     # destroyed by load() after a crash
        loaded.append({"path": p, "name": os.path.basename(p), "b_phy": b_phy, "e_phy": e_phy,
                       "count": max(count, 1)})
    drop_from = None
    for name in aside:                   # files after one set aside are dropped (their keys re-indexed)
        later = [i for i, f in enumerate(loaded) if f["name"] > name]
        if later:
            drop_from = min(drop_from if drop_from is not None else len(loaded), later[0] - 1)
    if deep and loaded:
        try:
            from ..store.recovery import index_file_problems
        except ImportError:  # pragma: no cover
            index_file_problems = None
        checked = 0
        for i in range(len(loaded) - 1, -1, -1) if index_file_problems else ():
            f = loaded[i]
            cost = slots * codec.INDEX_HASH_SLOT_SIZE + f["count"] * codec.INDEX_ENTRY_SIZE
            if i < len(loaded) - 1 and checked + cost > INDEX_DEEP_CHECK_BYTES:
                break
            checked += cost
            ro = ReadOnlyIndexFile(f["path"], slots, num)
            try:
                problems = index_file_problems(ro)
            finally:
                ro.close()
            if problems:
                view.notes.append(f"{f['path']}: {'; '.join(problems)}: set aside by recovery")
                f["gone"] = True
                drop_from = i if drop_from is None else min(drop_from, i)
    keep = [f for i, f in enumerate(loaded) if not f.get("gone") and (drop_from is None or i <= drop_from)]
    if end is not None:
        while keep and ((keep[-1]["count"] <= 1 and keep[-1]["e_phy"] >= end > 0)
                        or (keep[-1]["count"] > 1 and keep[-1]["b_phy"] >= end)):
            keep.pop()
        if keep and keep[-1]["e_phy"] >= end and keep[-1]["count"] > 1 and num is not None:
            f = keep[-1]
            ent = np.fromfile(f["path"], dtype=_ENTRY_NP, count=f["count"],
                              offset=codec.INDEX_HEADER_SIZE + slots * codec.INDEX_HASH_SLOT_SIZE)
            phy = ent["phy_offset"].astype(np.int64)
            k = int(np.searchsorted(phy[1:], end, side="left")) + 1
            if k < f["count"]:
                f["count"] = k
                f["e_phy"] = int(phy[k - 1]) if k > 1 else f["b_phy"]
    view.index_files = [f["path"] for f in keep]
    if not keep or (len(keep) == 1 and keep[0]["count"] <= 1 and keep[0]["e_phy"] == 0):
        return 0
    last = keep[-1]["e_phy"]
    cf = view.file_of(last)
    if cf is not None:
        _, buf = cache.get(cf.path)
        pos = last - cf.base
        if pos + 8 <= len(buf) and (end is None or last + 8 <= end):
            size = int.from_bytes(buf[pos:pos + 4], "big", signed=True)
            magic = int.from_bytes(buf[pos + 4:pos + 8], "big")
            if magic in (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2) and size > 0:
                return last + size
    return last


_ENTRY_NP = np.dtype(codec.INDEX_ENTRY_DTYPE)


# --- lookups -----------------------------------------------------------------------------------------
def offset_by_time(view: StoreView, qv: QueueView, timestamp: int, cache: FileCache) -> int:
    """ConsumeQueue.get_offset_in_queue_by_time over the view (tail units count as written)."""
    per = qv.file_units
    lo_all, hi_all = qv.min_offset, qv.end
    if hi_all <= lo_all and not qv.files:
        return 0
    # the queue's files as logical ranges [start, stop)
    ranges = []
    bases = [b // UNIT for b, _, _ in qv.files]
    if not bases:
        bases = [lo_all - lo_all % per]
    b = bases[0]
    while b < max(hi_all, bases[-1] + 1):
        ranges.append((b, min(b + per, hi_all)))
        b += per
    if not ranges:
        return 0

    def unit(i):
        o, s = qv.units(i, i + 1)
        return (int(o[0]), int(s[0])) if len(o) else None

    found = search_by_time(ranges, lo_all, timestamp, unit, lambda o, s: view.store_time(cache, o, s),
                           max(view.cl_min, 0))
    if found is None:
        return 0
    return qv.min_offset if found < 0 else found


def index_candidates(view: StoreView, topic: str, key: str) -> list[int]:
    """Commitlog offsets the kept index files give for topic#key (RocketMQ's queryOffset over the whole
    time range, without its 64-result cap), below the index's end; unchecked (hash matches)."""
    slots, num = index_geometry(view)
    out: list[int] = []
    h = key_hash(f"{topic}#{key}")
    files = []
    try:
        for p in view.index_files:
            files.append(ReadOnlyIndexFile(p, slots, num))
        for f in reversed(files):
            if f.is_time_matched(0, MAX_TIME):
                f.select_by_hash(h, 1 << 62, 0, MAX_TIME, out)
    finally:
        for f in files:
            f.close()
    return sorted(set(o for o in out if o < view.index_end))
