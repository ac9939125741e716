"""A read-only view of a store directory: what its consume queues hold, as MessageStore.open would serve
them, worked out without writing anything and without taking the store's lock.

Two cases:

* the store is open in another process (its `lock` file is locked, as MessageStore and RocketMQ's broker
  hold it): the view is what a consumer gets now, the consume queues' units as far as they are written
  (the last file of each queue is read up to its first empty unit). The commitlog's end may hold a
  record being written; nothing after the queues is read.

* nobody holds the store: the view is what the store serves after MessageStore.open's recovery. It is
  the same recovery: recovery.plan_recovery works out the plan without writing, and recovery.apply_plan
  applies it to the store's files mapped privately (MappedFileQueue(read_only=True): cuts, fillers and
  the re-dispatch by the store's own Dispatcher stay in this process's memory). Units on disk below each
  queue's planned end are read from the files; the units the re-dispatch adds become "tail" units held
  in memory. A crashed store therefore reads as MessageStore.open serves it (and as RocketMQ does).

StoreReader (store.reads.store_reader) serves the same recovered state with MessageStore's read API.

A store at a URI other than a local path or file:// (s3://, hdfs://, ...: store.files.store_fs) is read as it is,
like a live store (no recovery emulation, which would need the commitlog's last files): the consume queues
as far as they are written, the records they point at checked when read. It is never "live" (no lock).

The view is plain data (picklable): Spark partitions carry the parts they need.
"""
from __future__ import annotations

import dataclasses
import fcntl
import glob
import logging
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..files import store_dir, store_fs
from ..format import codec, scanner
from ..conf.config import StoreConfig
from ..consumequeue.consume_queue import search_by_time
from ..consumequeue.dispatch import Dispatcher
from ..index.index_file import IndexFile, cut_entries, key_hash, repair_slots
from ..files.mapped_file import FileCache, map_read_only  # noqa: F401 - used here and by spark modules
from .recovery import IndexPlan, RecoveryPlan, StoreFiles, apply_plan, plan_recovery, read_inputs
from ..files.store_fs import RemoteStore, StoreError  # noqa: F401 - StoreError is this module's error

log = logging.getLogger(__name__)

UNIT = codec.CQ_STORE_UNIT_SIZE
CQ_NP = np.dtype(codec.CQ_DTYPE)
BLANK_SIZE = codec.CQ_BLANK_SIZE
MAX_TIME = 2 ** 63 - 1


# --- files ------------------------------------------------------------------------------------------
# read-only mappings live with the other mappings (rmqstore.store.files.mapped_file); the names stay importable here
_FLOCK = struct.Struct("hhqqi4x")


def lock_held_elsewhere(store: str | os.PathLike) -> bool:
    """True when another process (or this one, through rmqstore.store.state.lock) holds the store's lock.

    A probe (F_GETLK on byte 0, the byte MessageStore and RocketMQ lock): nothing is locked or written.
    """
    root = Path(store)
    try:
        from ..state.lock import _held
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
        if store_fs.is_remote(item):
            _add_remote(item, out)
            continue
        item = store_fs.local_path(item)
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


def _add_remote(item: str, out: list[str]) -> None:
    """resolve_paths for a URI (store_fs): the stores it names (a glob in its path is expanded by listing)."""
    hits = store_fs.expand_glob(item) if store_fs.path_has_magic(item) else [item]
    if not hits:
        raise StoreError(f"option 'path': {store_fs.display_uri(item)!r} matches no store directory")
    for h in hits:
        if commitlog_dir(h) is None:
            raise StoreError(f"option 'path': {store_fs.display_uri(h)!r} is not a RocketMQ store directory "
                             "(no commitlog/ directory and no commitlog files there)")
        if h not in out:
            out.append(h)


def commitlog_dir(root: str) -> str | None:
    """root/commitlog, or root itself when it holds commitlog files (a bare commitlog directory)."""
    if store_fs.is_remote(root):
        return store_fs.open_store(root).listing().commitlog_dir()
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
    p = Path(store_fs.display_uri(root) if store_fs.is_remote(root) else root)
    return p.parent.name if p.name == "store" and p.parent.name else p.name


def has_consume_queues(root: str) -> bool:
    """The store has a consumequeue/ directory."""
    if store_fs.is_remote(root):
        return store_fs.open_store(root).listing().is_dir(store_fs.display_uri(root) + "/consumequeue")
    return os.path.isdir(os.path.join(root, "consumequeue"))


def list_topics(root: str) -> dict[str, list[int]]:
    """Topics and queue ids of the consume queue directories."""
    if store_fs.is_remote(root):
        return store_fs.open_store(root).listing().topics()
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
    blank: tuple = ()                       # commitlog ranges recovery skipped: disk units there are fillers
    fs: RemoteStore | None = None           # the store's filesystem when it is not local (store_fs)
    kept_end: int = -1                      # the byte (queue space) where recovery cut the files (-1: none)

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
                arr = _units_at(path, s - base, e - s, self.fs)
                o, z = arr["offset"].astype(np.int64), arr["size"].astype(np.int64)
                for lo_b, hi_b in self.blank:     # recovery.apply_plan's blank_units_in, in memory
                    hit = (o >= lo_b) & (o < hi_b)
                    o[hit], z[hit] = 0, BLANK_SIZE
                offs.append(o)
                sizes.append(z)
        t0 = self.disk_end + self.tail_skip
        if b > t0 and len(self.tail):
            t = self.tail[max(a, t0) - t0: b - t0]
            offs.append(t[:, 0])
            sizes.append(t[:, 1])
        if not offs:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        return np.concatenate(offs), np.concatenate(sizes)

    def dropped_units(self) -> np.ndarray:
        """(offset, size) of the written units on disk that recovery dropped (past kept_end): read on the first
        call, for the planner's data loss checks only (none for a view without recovery)."""
        got = self.__dict__.get("_dropped")
        if got is None:
            got = self.__dict__["_dropped"] = _dropped_units(self.dir, self.kept_end) \
                if self.kept_end >= 0 and self.fs is None else np.empty((0, 2), dtype=np.int64)
        return got

    def slim(self, a: int, b: int) -> "QueueView":
        """A copy carrying only the tail units of [a, b) (what a partition reading [a, b) needs)."""
        t0 = self.disk_end + self.tail_skip
        lo = min(max(a - t0, 0), len(self.tail))
        hi = min(max(b - t0, lo), len(self.tail))
        return QueueView(self.topic, self.queue_id, self.dir, self.files, self.min_offset, self.disk_end,
                         self.max_physic_offset, self.tail[lo:hi].copy(), self.file_units, self.tail_skip + lo,
                         self.blank, self.fs)


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
    plan: RecoveryPlan | None = None       # the recovery this view applied (None: live)
    fs: RemoteStore | None = None          # the store's filesystem when it is not local (store_fs)
    deleted: dict = field(default_factory=dict)    # deleted queues (deleted_queues.py): their old records are no rows

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
        pos = offset - f.base
        if self.fs is not None:     # a remote store: the header alone, one ranged read
            buf = self.fs.read(f.path, pos, scanner.MIN_RECORD + 32)
            pos = 0
        else:
            _, buf = cache.get(f.path)
        if pos < 0 or pos + codec.HEADER_V4.size > len(buf):
            return -1
        try:
            return scanner.store_timestamp(buf, pos)
        except struct.error:    # the header runs past the file's bytes
            return -1


def _cl_files(cdir: str) -> list[CLFile]:
    return [CLFile(b, p, s) for b, p, s in store_dir.digit_files(cdir)]



def load_view(root: str, config: StoreConfig | None = None, *, live: bool | None = None,
              topics: set[str] | None = None, previous: StoreView | None = None) -> StoreView:
    """The view of the store at root (see the module docstring). `topics` limits the queues in the view
    (recovery still examines every queue: where the re-dispatch starts depends on all of them). `previous`,
    an earlier view of the same store while live, lets a live view read each queue's last file from where
    that view found its end (a stream's trigger reads what was appended since, not the whole file)."""
    if store_fs.is_remote(root):
        return _load_remote_view(store_fs.open_store(root), config, topics)
    root = os.path.abspath(store_fs.local_path(root))
    cdir = commitlog_dir(root)
    if cdir is None:
        raise StoreError(f"option 'path': {root!r} is not a RocketMQ store directory")
    if live is None:
        live = lock_held_elsewhere(root)
    clean = not os.path.exists(os.path.join(root, "abort"))
    files = _cl_files(cdir)
    sizes = [f.size for f in files]
    if config is None:      # no configuration given: the files tell the geometry
        config = _geometry_from_files(root, StoreConfig(), sizes)
    file_size = _cl_file_size(config, sizes)
    cl_min = files[0].base if files else 0
    view = StoreView(root, broker_name(root), config, live, clean, files, file_size, cl_min, None, {})
    from ..consumequeue.deleted_queues import load as load_deleted
    view.deleted = load_deleted(root)         # CorruptStoreError naming it when unusable, as at open
    cq_size = config.mapped_file_size_consume_queue
    if live or cdir != os.path.join(root, "commitlog"):
        seen = previous.queues if previous is not None and previous.live else {}
        for t, qids in list_topics(root).items():
            if topics is not None and t not in topics:
                continue
            for q in qids:
                qv = _live_queue(t, q, os.path.join(root, "consumequeue", t, str(q)), cq_size, cl_min,
                                 known=seen.get((t, q)))
                if qv is not None:
                    view.queues[(t, q)] = qv
        return view
    rec = RecoveredStore.open(root, store_config(view), with_index=False)
    try:
        _fill_view(view, rec, topics)
    finally:
        rec.close()
    return view


def _cl_file_size(config: StoreConfig, sizes: list[int]) -> int:
    """The commitlog file size: the configuration's, or what the files show when they are larger."""
    file_size = config.mapped_file_size_commit_log
    if sizes and max(sizes) > file_size:
        file_size = max(sizes)          # the configuration was not given: the files tell their size
    if len(sizes) > 1 and sizes[0] != file_size and sizes[0] == max(sizes):
        file_size = sizes[0]
    return file_size


def _load_remote_view(rs: RemoteStore, config: StoreConfig | None, topics: set[str] | None) -> StoreView:
    """The view of a store at a URI: as it is (module docstring), from one listing and ranged reads."""
    lst = rs.listing()
    cdir = lst.commitlog_dir()
    if cdir is None:
        raise StoreError(f"option 'path': {rs.root!r} is not a RocketMQ store directory")
    files = [CLFile(b, p, s) for b, p, s in lst.digit_files(cdir)]
    sizes = [f.size for f in files]
    cq_root = f"{rs.root}/consumequeue"
    queues = {(t, q): f"{cq_root}/{t}/{q}" for t, qids in lst.topics().items() for q in qids}
    if config is None:
        cq_sizes = [s for d in queues.values() for _, _, s in lst.digit_files(d)]
        config = _geometry_from_files(rs.root, StoreConfig(), sizes, cq_sizes)
    cl_min = files[0].base if files else 0
    view = StoreView(rs.root, broker_name(rs.root), config, False, not lst.is_file(f"{rs.root}/abort"), files,
                     _cl_file_size(config, sizes), cl_min, None, {}, fs=rs)
    if not view.clean:
        view.notes.append(f"{rs.root}: has an abort file (copied from a running or crashed store): read as it is, "
                          "without recovery; records its queues point at are checked as they are read")
    view.deleted = _remote_deleted(rs, lst)
    for (t, q), d in sorted(queues.items()):
        if topics is None or t in topics:
            qv = _live_queue(t, q, d, config.mapped_file_size_consume_queue, cl_min, rs, lst.digit_files(d))
            if qv is not None:
                view.queues[(t, q)] = qv
    return view


def _remote_deleted(rs: RemoteStore, lst) -> dict:
    """A remote copy's config/deletedQueues.json (deleted_queues.py; its .bak when the file is unusable), read
    as the local store's is: CorruptStoreError naming it when neither is usable."""
    import json
    from ...errors import CorruptStoreError
    from ..consumequeue.deleted_queues import FILE_NAME, decode
    path = f"{rs.root}/config/{FILE_NAME}"
    why = None
    for p in (path, path + ".bak"):
        size = lst.names(p.rpartition("/")[0]).get(p.rpartition("/")[2], -1)
        if size <= 0:
            continue
        try:
            return decode(json.loads(rs.read(p, 0, size).tobytes().decode("utf-8")))
        except (ValueError, UnicodeDecodeError) as e:
            why = why or str(e)
    if why is not None:
        raise CorruptStoreError(path, 0, f"{why}; no usable backup: the deleted queues cannot be told apart")
    return {}


def _geometry_from_files(root: str, config: StoreConfig, cl_sizes: list[int],
                         cq_sizes: list[int] | None = None) -> StoreConfig:
    """config with the file sizes the store's files show (the largest commitlog file; the largest consume
    queue file, a whole number of units): a file is never larger than its configured size, and only the
    newest file of a queue can be shorter (created by a crash before its resize)."""
    changes = {}
    if cl_sizes:
        changes["mapped_file_size_commit_log"] = max(cl_sizes)
    cq_max = max(cq_sizes, default=0) if cq_sizes is not None else 0
    cq_root = os.path.join(root, "consumequeue")
    for t, qids in (list_topics(root).items() if cq_sizes is None else ()):
        for q in qids:
            for _, _, size in store_dir.digit_files(os.path.join(cq_root, t, str(q))):
                cq_max = max(cq_max, size)
    if cq_max and cq_max % UNIT == 0:
        changes["mapped_file_size_consume_queue"] = cq_max
    return dataclasses.replace(config, **changes) if changes else config


def store_config(view: StoreView) -> StoreConfig:
    """The configuration recovery runs with: the view's, with the geometry the files show where it was not
    given (commitlog file size; index geometry, or no index when it cannot be told)."""
    cfg = view.config
    changes = {}
    if view.cl_file_size != cfg.mapped_file_size_commit_log:
        changes["mapped_file_size_commit_log"] = view.cl_file_size
    try:
        slots, num = index_geometry(view)
        if (slots, num) != (cfg.max_hash_slot_num, cfg.max_index_num):
            changes.update(max_hash_slot_num=slots, max_index_num=num)
    except StoreError:
        changes["message_index_enable"] = False
    return dataclasses.replace(cfg, **changes) if changes else cfg


class RecoveredStore:
    """The store at root as MessageStore.open would leave it, in memory: plan_recovery, then apply_plan over
    the files mapped privately, the re-dispatch included (with_index: the index too). Nothing is written,
    nothing is locked. close() lets the mappings go."""

    def __init__(self, plan: RecoveryPlan, files: StoreFiles, dispatcher: Dispatcher):
        self.plan = plan
        self.files = files
        self.dispatcher = dispatcher

    @classmethod
    def open(cls, root: str | os.PathLike, config: StoreConfig, *, with_index: bool = True) -> "RecoveredStore":
        inputs = read_inputs(root)
        plan = plan_recovery(inputs, config)
        files = StoreFiles(root, config, read_only=True)
        try:
            dispatcher = Dispatcher(files.commit_log, files.consume_queues, files.index_service, config)
            if not with_index:
                dispatcher.index_service = None
            apply_plan(plan, files, dispatcher)
        except BaseException:
            files.close()
            raise
        return cls(plan, files, dispatcher)

    def close(self) -> None:
        self.files.close()


def _fill_view(view: StoreView, rec: RecoveredStore, topics: set[str] | None) -> None:
    """The view's queues from the recovered store: units below each queue's planned end on disk, the rest
    (what the re-dispatch added) as tail units."""
    plan = rec.plan
    per = max(view.config.mapped_file_size_consume_queue // UNIT, 1)
    planned = {(q.topic, q.queue_id): q for q in plan.queues}
    blank = tuple((r.start, r.end) for r in plan.commitlog.skipped)
    for cq in rec.files.consume_queues.sorted_queues():
        key = (cq.topic, cq.queue_id)
        if topics is not None and cq.topic not in topics:
            continue
        qp = planned.get(key)
        d = os.path.join(view.root, "consumequeue", cq.topic, str(cq.queue_id))
        lo, hi = cq.get_min_offset_in_queue(), cq.get_max_offset_in_queue()
        disk = store_dir.digit_files(d)[:qp.files_kept] if qp is not None else []
        disk_end = min(qp.end // UNIT, hi) if qp is not None and disk else lo
        t = cq.units(disk_end, hi)
        tail = np.stack([t["offset"].astype(np.int64), t["size"].astype(np.int64)], axis=1) if len(t) \
            else np.empty((0, 2), dtype=np.int64)
        qv = QueueView(cq.topic, cq.queue_id, d, disk, lo, disk_end, cq.max_physic_offset, tail, per, 0, blank,
                       kept_end=qp.end if qp is not None else -1)
        if qv.end > 0 or qv.files:
            view.queues[key] = qv
    view.data_end = plan.commitlog.end
    view.reput_from = plan.reput_from
    view.plan = plan
    view.notes.extend(str(d) for d in plan.dropped)
    if plan.index is not None:
        view.index_files = [os.path.join(view.root, "index", n) for n in plan.index.kept]
        view.index_end = plan.index.resume_from


def _dropped_units(d: str, end: int) -> np.ndarray:
    """(offset, size) of the written units in the consume queue files of d from byte `end` (queue space) on,
    up to the first unwritten one (a file is written from its start: preallocated zeros after), read in
    blocks growing from one unit (most queues have none: one 20-byte read)."""
    out = [np.empty((0, 2), dtype=np.int64)]
    for base, path, size in store_dir.digit_files(d):
        pos, stop, block = max(end, base), base + size - size % UNIT, 1
        while pos < stop:
            arr = np.fromfile(path, dtype=CQ_NP, count=min(block, (stop - pos) // UNIT), offset=pos - base)
            unwritten = np.flatnonzero(_unwritten(arr))
            keep = arr[:unwritten[0]] if len(unwritten) else arr
            keep = keep[_is_real(keep)]
            out.append(np.stack([keep["offset"].astype(np.int64), keep["size"].astype(np.int64)], axis=1))
            if len(unwritten) or not len(arr):
                return np.concatenate(out)
            pos, block = pos + len(arr) * UNIT, min(block * 8, 1 << 16)
    return np.concatenate(out)


REMOTE_UNITS_BLOCK = 3276 * UNIT       # the first ranged read of a remote consume queue file (64 KiB)


def _units_of(path: str, nbytes: int | None = None, fs: RemoteStore | None = None, until=None,
              start: int = 0) -> np.ndarray:
    """The units of the file's bytes [start, nbytes). With `until`, the file (consume queue files are preallocated:
    6 MB of mostly zeros by default) is read in blocks from REMOTE_UNITS_BLOCK bytes, doubling, up to the
    first block holding a unit for which until(units) is true: the caller looks for the first such unit, and
    gets the units up to it (a prefix). A local file is read the same way (a live store's view is loaded on
    every trigger of a stream: reading whole files made that 0.28 s for 16 queues of 190k messages)."""
    if nbytes is None or (fs is None and until is None):
        return np.fromfile(path, dtype=CQ_NP, count=-1 if nbytes is None else nbytes // UNIT)
    out, pos, block = [], start, REMOTE_UNITS_BLOCK
    while pos < nbytes:
        arr = _units_at(path, pos, min(block, nbytes - pos), fs)
        out.append(arr)
        if not len(arr) or (until is not None and until(arr).any()):
            break
        pos, block = pos + len(arr) * UNIT, block * 2
    return np.concatenate(out) if out else np.empty(0, dtype=CQ_NP)


def _units_at(path: str, pos: int, nbytes: int, fs: RemoteStore | None) -> np.ndarray:
    """The consume queue units in bytes [pos, pos + nbytes) of the file (a ranged read when remote)."""
    if fs is None:
        return np.fromfile(path, dtype=CQ_NP, count=nbytes // UNIT, offset=pos)
    raw = fs.read(path, pos, nbytes - nbytes % UNIT)
    return np.frombuffer(raw[:len(raw) - len(raw) % UNIT], dtype=CQ_NP)


def _unwritten(arr) -> np.ndarray:
    return (arr["offset"] < 0) | (arr["size"] <= 0)


def _is_real(arr) -> np.ndarray:
    return (arr["size"] != BLANK_SIZE) | (arr["offset"] != 0)


def _still_written(path: str, size: int, known: QueueView | None, fs: RemoteStore | None) -> int:
    """How many units of the queue's last file, seen written by `known` (the queue's view at the previous
    load of this live store), are still there: the writer only appends, so while the last unit seen is
    unchanged the ones below it are too (a writer restarted meanwhile may have cut the file: then that unit
    is gone or differs, and the file is read from its start)."""
    if known is None or not known.files or known.files[-1][1] != path or known.max_physic_offset < 0:
        return 0
    n = known.disk_end - known.files[-1][0] // UNIT
    if n <= 0 or n * UNIT > size:
        return 0
    u = _units_at(path, (n - 1) * UNIT, UNIT, fs)
    if len(u) != 1 or _unwritten(u)[0] or int(u["offset"][0]) + int(u["size"][0]) != known.max_physic_offset:
        return 0
    return n


def _live_queue(topic: str, qid: int, d: str, cq_size: int, cl_min: int, fs: RemoteStore | None = None,
                files: list | None = None, known: QueueView | None = None) -> QueueView | None:
    files = store_dir.digit_files(d) if files is None else files
    if not files:
        return None
    per = max(cq_size // UNIT, 1)
    base, path, size = files[-1]
    skip = _still_written(path, size, known, fs)
    arr = _units_of(path, size - size % UNIT, fs, until=_unwritten, start=skip * UNIT)
    bad = np.flatnonzero(_unwritten(arr))
    n = int(bad[0]) if len(bad) else len(arr)
    disk_end = base // UNIT + skip + n
    qv = QueueView(topic, qid, d, files, 0, disk_end, -1, file_units=per, fs=fs)
    if n:
        qv.max_physic_offset = int(arr["offset"][n - 1]) + int(arr["size"][n - 1])
    elif skip:
        qv.max_physic_offset = known.max_physic_offset
    qv.min_offset = _min_offset(files, disk_end, max(cl_min, 0), fs)
    return qv


def _min_offset(files, disk_end: int, phy_min: int, fs: RemoteStore | None = None) -> int:
    """ConsumeQueue._first_real_unit_offset then correct_min_offset(phy_min), in units."""
    if not files:
        return 0
    # first real unit of the first file
    b0, p0, s0 = files[0]
    first_end = min(s0 // UNIT, max(disk_end - b0 // UNIT, 0))

    def usable(a):      # an ok unit is also a real one: a prefix up to the first ok unit holds both answers
        return (a["offset"] >= phy_min) & (a["size"] > 0) & (a["size"] != BLANK_SIZE)
    arr = _units_of(p0, first_end * UNIT, fs, until=usable)
    real = np.flatnonzero(_is_real(arr))
    min_off = b0 // UNIT + (int(real[0]) if len(real) else first_end)
    for i, (b, p, s) in enumerate(files):
        count = min(s // UNIT, max(disk_end - b // UNIT, 0))
        a = arr if i == 0 else _units_of(p, count * UNIT, fs, until=usable)
        ok = np.flatnonzero(usable(a))
        if len(ok):
            return max(min_off, b // UNIT + int(ok[0]))
        if i == len(files) - 1:
            min_off = max(min_off, b // UNIT + count)
    return min_off



def _index_names(root: str) -> list[str]:
    if store_fs.is_remote(root):
        return []           # a remote store's index is not read: key lookups scan its commitlog
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



def _open_index_file(view: StoreView, path: str, slots: int, num: int) -> IndexFile:
    """An index file mapped privately, with recovery's repair and cut applied in memory (view.plan)."""
    f = IndexFile(path, slots, num, load=True, read_only=True)
    plan: IndexPlan | None = view.plan.index if view.plan is not None else None
    if plan is not None:
        if plan.repair_slots == f.name:
            repair_slots(f, f.index_count)
        if plan.cut is not None and plan.cut.name == f.name:
            cut_entries(f, plan.cut.keep, plan.cut.end_phy_offset, plan.cut.end_timestamp)
    return f


def _recover_index(view: StoreView, cache: FileCache | None = None, end: int | None = None,
                   destroy: bool | None = None, deep: bool = True) -> int:
    """A live store's index (no recovery: the files as the running store has them): sets view.index_files
    and returns the commitlog offset after the last indexed message. (The name is kept for the Spark
    modules; a store nobody holds gets its index from the recovery plan, load_view.)"""
    try:
        slots, num = index_geometry(view)
    except StoreError:
        view.index_files = []
        return 0
    kept, last = [], 0
    for p in _index_names(view.root):
        try:
            f = IndexFile(p, slots, num, load=True, read_only=True)
        except (OSError, ValueError) as e:      # CorruptStoreError is an OSError
            view.notes.append(f"{p}: {e}")
            continue
        try:
            kept.append(p)
            last = f.end_phy_offset if f.index_count > 1 else last
        finally:
            f.close()
    view.index_files = kept
    cf = view.file_of(last) if last else None
    if cf is not None:
        _, buf = (cache or FileCache()).get(cf.path)
        pos = last - cf.base
        if pos + 8 <= len(buf):
            size = int.from_bytes(buf[pos:pos + 4], "big", signed=True)
            magic = int.from_bytes(buf[pos + 4:pos + 8], "big")
            if magic in (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2) and size > 0:
                return last + size
    return last



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
            files.append(_open_index_file(view, p, slots, num))
        for f in reversed(files):
            if f.is_time_matched(0, MAX_TIME):
                f.select_by_hash(h, 1 << 62, 0, MAX_TIME, out)
    finally:
        for f in files:
            f.close()
    return sorted(set(o for o in out if o < view.index_end))
