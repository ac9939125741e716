"""rebuild_spark: rebuild a store's consume queues and index with Spark (distributed dispatch), aside.

1. driver: take the store's lock (held to the end), finish or remove what a killed rebuild left
   (staging.recover_stale), recover the commitlog as MessageStore.open does
   (rmqstore.store.recovery.recovery.recover_commit_log: invalid data after the last valid record is cut off);
2. one task per commitlog file parses it (scanner.parse_dispatch_columns, the local dispatcher's parser) and
   writes its pieces into the staging directory `{store}/.rebuild-<pid>/parts/<file>/`: per (topic,
   queue) the units in commitlog order, and its index entries (key hash, offset, store time); it returns
   only a summary (counts and piece names), so the driver never holds the records' columns;
3. the driver lays the work out from the summaries: per (topic, queue) its pieces, and the index entries
   cut into files of maxIndexNum - 1 entries each (a file is full then, as IndexService fills them),
   reading only the entries at the cuts (memory-mapped);
4. one task per consume queue writes it into the staging directory (ConsumeQueue.put_arrays, the local
   dispatcher's code), and one task per index file (IndexFile.put_hashes, carrying the previous file's
   end values, as a new file does): every file is written by exactly one task, in any order;
5. driver: swap in (staging.swap_in: the old consumequeue/ and index/ are replaced only now), checkpoint
   (logicsMsgTimestamp: the last record's store time; indexMsgTimestamp: the newest full index file's
   end, as a local rebuild's close() writes them), abort file removed, staging directory removed, lock
   released; a read-only check (storeview) that recovery would find nothing to re-dispatch.

A rebuild that fails, or is killed before step 5, leaves consumequeue/ and index/ as they were.

Driver memory: the task summaries and the cut entries (a few hundred bytes per commitlog file and per
consume queue); an executor holds one commitlog file's columns (about 80 bytes per record) while parsing,
one queue's pieces one at a time, or one index file's entries (24 bytes each).

Consume queues are byte-identical to the local engine's (rmqstore.store.repair.rebuild.rebuild_store) and RocketMQ's;
index files have the same headers, slots and entries. Index file NAMES differ: the local engine (like
RocketMQ) names a file by the clock when it creates it; this engine names it, deterministically, by the
store time of its first message (yyyyMMddHHmmssSSS, local time; one more than the previous name when that
is not later), so a rebuild gives the same names every time.

Tasks read the commitlog and write into the store directory: the store must be on a file system every
executor sees at the same path (local mode, or a shared mount).
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

import numpy as np

from ..store.format import scanner
from ..store.conf.config import StoreConfig
from ..store.index.index_file import time_millis_to_human_string
from . import staging

log = logging.getLogger(__name__)



# --- tasks (executors) --------------------------------------------------------------------------------
def _segments(base: int, limit: int, skip: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The [start, end) byte ranges of one file (commitlog offset base, data up to limit) outside the skip
    ranges (commitlog offsets: accepted damage, never dispatched)."""
    out, pos = [], 0
    for a, b in sorted(skip):
        a, b = max(a - base, 0), min(b - base, limit)
        if b <= pos or a >= limit:
            continue
        if a > pos:
            out.append((pos, a))
        pos = max(pos, b)
    if pos < limit:
        out.append((pos, limit))
    return out


def _parse_columns(path: str, base: int, limit: int, delay_levels, skip=()):
    """scanner.parse_dispatch_columns over one commitlog file (read-only map), around the skip ranges:
    (columns, summary); the summary's pos and outcome are the last parsed piece's (or the first failing)."""
    from ..store.format.codec import DispatchBatch
    from .storeview import map_read_only
    mm = map_read_only(path)
    if mm is None:
        return None, {"base": base, "n": 0, "pos": 0, "outcome": scanner.Outcome.END_OF_DATA, "reason": None}
    batches, pos, outcome, reason = [], 0, scanner.Outcome.END_OF_DATA, None
    try:
        limit = min(limit, len(mm))
        for a, b in _segments(base, limit, list(skip)):
            view = memoryview(mm)[a:b]
            batch, got, outcome, reason = scanner.parse_dispatch_columns(view, base + a, True, delay_levels)
            del view
            batches.append(batch)
            pos = a + got
            if pos < b:                         # stopped inside the piece (damage, a blank)
                break
    finally:
        try:
            mm.close()
        except BufferError:
            pass
    batch = batches[0] if batches else DispatchBatch.from_requests([])
    for more in batches[1:]:
        batch = batch.concat(more)
    return batch, {"base": base, "n": len(batch), "pos": pos, "outcome": outcome, "reason": reason}


def _index_keys(batch, tids: np.ndarray, sfs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IndexService.build_index_columns' keys: UNIQ_KEY, then each KEYS word, as topic#key; none for
    rolled-back messages. (hashes, per-record key counts)"""
    from ..store.index.index_file import key_hashes
    keys: list[str] = []
    counts = np.zeros(len(tids), dtype=np.int64)
    names = batch.topic_names
    tl, sl = tids.tolist(), sfs.tolist()
    for i, (k, u) in enumerate(zip(batch.keys, batch.uniq_keys)):
        if not scanner.is_indexed(sl[i]):
            continue
        prefix = names[tl[i]] + "#"
        c = 0
        if u is not None:
            keys.append(prefix + u)
            c = 1
        if k:
            for w in k.split(" "):
                if w:
                    keys.append(prefix + w)
                    c += 1
        counts[i] = c
    return (key_hashes(keys) if keys else np.empty(0, dtype=np.int64)), counts


def parse_file(task: tuple) -> dict:
    """Task of step 2: parse one commitlog file and write its pieces into the staging directory:
    per (topic, queue) the units (offset, size, tags code, queue offset) in commitlog order, and its
    index entries (hash, offset, store time). Returns a small summary (counts, where each piece is)."""
    path, base, limit, delay_levels, with_index, part_dir, skip, deleted = task
    batch, out = _parse_columns(path, base, limit, delay_levels, skip)
    out.update(queues=[], keys=0, last_store_timestamp=0, dir=part_dir)
    n = out["n"]
    if not n:
        return out
    os.makedirs(part_dir, exist_ok=True)
    col = {name: np.asarray(getattr(batch, name), dtype=np.int64)
           for name in ("topic_ids", "queue_ids", "offsets", "sizes", "tags_codes", "store_timestamps",
                        "queue_offsets", "sys_flags")}
    out["last_store_timestamp"] = int(col["store_timestamps"][-1])
    units = scanner.is_dispatched(col["sys_flags"])
    tid = {name: i for i, name in enumerate(batch.topic_names)}
    for topic, qid, below in deleted:          # a deleted queue's old records: in no queue (the dispatcher's rule)
        if topic in tid:
            units &= ~((col["topic_ids"] == tid[topic]) & (col["queue_ids"] == qid) & (col["offsets"] < below))
    idx = np.flatnonzero(units)
    group = col["topic_ids"][idx] * (1 << 32) + (col["queue_ids"][idx] & 0xFFFFFFFF)
    order = np.argsort(group, kind="stable")
    sidx = idx[order]
    cuts = np.flatnonzero(np.diff(group[order])) + 1
    for k, part in enumerate(np.split(sidx, cuts) if len(sidx) else []):
        i0 = int(part[0])
        name = os.path.join(part_dir, f"q{k}.npy")
        np.save(name, np.stack([col["offsets"][part], col["sizes"][part], col["tags_codes"][part],
                                col["queue_offsets"][part]]))
        out["queues"].append((batch.topic_names[int(col["topic_ids"][i0])], int(col["queue_ids"][i0]), name))
    if with_index:
        hashes, counts = _index_keys(batch, col["topic_ids"], col["sys_flags"])
        if len(hashes):
            np.save(os.path.join(part_dir, "index.npy"), np.stack([
                hashes, np.repeat(col["offsets"], counts), np.repeat(col["store_timestamps"], counts)]))
        out["keys"] = int(len(hashes))
    return out


def write_queue(task: tuple) -> dict:
    """Task of step 4: one consume queue, from its pieces (in commitlog order)."""
    root, file_size, topic, qid, pieces, fill_bound = task
    from ..store.consumequeue.consume_queue import ConsumeQueue
    from ..store.consumequeue.dispatch import fill_queue
    cq = ConsumeQueue(topic, qid, Path(root) / "consumequeue", file_size)
    units = 0
    try:
        for piece in pieces:
            offs, sizes, tags, qoffs = np.load(piece)
            cuts = [0, *(np.flatnonzero(np.diff(qoffs) > 1) + 1).tolist(), len(offs)]
            for a, b in zip(cuts, cuts[1:]):      # queue offsets lost with a skipped range: filler units first
                fill_queue(cq, int(qoffs[a]), fill_bound)
                cq.put_arrays(offs[a:b], sizes[a:b], tags[a:b], qoffs[a:b])
            units += len(offs)
        cq.flush()
        files = len(cq.queue.files)
    finally:
        cq.shutdown()
    return {"queue": f"{topic}/{qid}", "units": units, "files": files}


def write_index_file(task: tuple) -> dict:
    """Task of step 4: one index file, from slices of the pieces' entries."""
    path, slots, num, prev_phy, prev_ts, slices = task
    from ..store.index.index_file import IndexFile
    cols = np.concatenate([np.load(p, mmap_mode="r")[:, lo:hi] for p, lo, hi in slices], axis=1)
    hashes, phys, stamps = (np.ascontiguousarray(c) for c in cols)
    f = IndexFile(path, slots, num, prev_phy, prev_ts)
    try:
        n = len(hashes)
        done = f.put_hashes(hashes, phys, stamps, 0, n)
        if done != n:
            raise RuntimeError(f"{path}: only {done} of {n} entries fit")
        f.write_header()
        header = f.header()
    finally:
        f.close()
    return {"file": os.path.basename(path), "entries": n, "header": header}


def _run_write(item):
    kind, task = item
    return write_queue(task) if kind == "q" else write_index_file(task)


# --- the driver ---------------------------------------------------------------------------------------
def index_file_names(first_stamps: list[int]) -> list[str]:
    """yyyyMMddHHmmssSSS of each file's first store time, made strictly increasing."""
    out: list[str] = []
    for ts in first_stamps:
        name = time_millis_to_human_string(int(ts))
        if out and name <= out[-1]:
            name = str(int(out[-1]) + 1).zfill(len(out[-1]))
        out.append(name)
    return out


def _session(master: str | None, spark, conf: dict | None = None):
    """(session, made here: to be stopped at the end)"""
    if spark is not None:
        return spark, False
    from pyspark.sql import SparkSession
    from .session import spark_session
    made = SparkSession.getActiveSession() is None or master is not None
    return spark_session(master, app_name="rmqstore-rebuild", conf=conf), made


def usable_parts(parts: list[dict], tasks: list[tuple], end: int) -> list[dict]:
    """The parsed files up to the first error (the local dispatcher stops there too)."""
    usable = []
    for r, t in zip(sorted(parts, key=lambda r: r["base"]), tasks):
        usable.append(r)
        if r["outcome"] == scanner.Outcome.INVALID or (r["outcome"] == scanner.Outcome.END_OF_DATA and t[1] + r["pos"] < end):
            log.error("%s: dispatch stops at offset %d: %s", t[0], t[1] + r["pos"],
                      r["reason"] or "zero bytes inside the written part of the commitlog")
            break
    return usable


def queue_tasks(stage: Path, config: StoreConfig, parts: list[dict], skip: list = ()) -> list[tuple]:
    """Step 3a: one task per (topic, queue): its pieces in commitlog order, and how many queue offsets the
    skipped ranges can have held (dispatch.fill_queue's bound, as the dispatcher computes it)."""
    from ..store.consumequeue.dispatch import FILL_SLACK, MIN_RECORD_SIZE
    bound = sum(b - a for a, b in skip) // MIN_RECORD_SIZE + FILL_SLACK
    pieces: dict[tuple[str, int], list[str]] = {}
    for r in parts:
        for topic, qid, name in r["queues"]:
            pieces.setdefault((topic, qid), []).append(name)
    return [(str(stage), config.mapped_file_size_consume_queue, t, q, ps, bound) for (t, q), ps in pieces.items()]


def index_tasks(stage: Path, config: StoreConfig, parts: list[dict]) -> tuple[list[tuple], int]:
    """Step 3b: the index entries cut into files of maxIndexNum - 1 entries (as IndexService fills them);
    per file its slices of the pieces, its name and the previous file's end values. The driver reads
    only the few entries at the cuts (memory-mapped)."""
    pieces = [(os.path.join(r["dir"], "index.npy"), r["keys"]) for r in parts if r.get("keys")]
    total = sum(k for _, k in pieces)
    if not config.message_index_enable or not total:
        return [], 0
    starts_of = np.cumsum([0] + [k for _, k in pieces])
    maps = [np.load(p, mmap_mode="r") for p, _ in pieces]

    def entry(g: int) -> tuple[int, int, int]:
        j = int(np.searchsorted(starts_of, g, side="right")) - 1
        c = maps[j][:, g - int(starts_of[j])]
        return int(c[0]), int(c[1]), int(c[2])
    per = config.max_index_num - 1
    starts = list(range(0, total, per))
    names = index_file_names([entry(s)[2] for s in starts])
    out, last_full_ts = [], 0
    for s, name in zip(starts, names):
        e = min(s + per, total)
        prev_phy, prev_ts = (entry(s - 1)[1:] if s else (0, 0))
        slices = []
        for j, (p, k) in enumerate(pieces):
            lo, hi = max(s, int(starts_of[j])), min(e, int(starts_of[j]) + k)
            if lo < hi:
                slices.append((p, lo - int(starts_of[j]), hi - int(starts_of[j])))
        out.append((str(stage / "index" / name), config.max_hash_slot_num, config.max_index_num,
                    prev_phy, prev_ts, slices))
        if e - s == per:
            last_full_ts = entry(e - 1)[2]
    (stage / "index").mkdir(parents=True, exist_ok=True)
    return out, last_full_ts


def _run(sc, fn, items: list) -> list:
    return sc.parallelize(items, max(len(items), 1)).map(fn).collect() if items else []


def rebuild_spark(store_path, config: StoreConfig | None = None, master: str | None = None, spark=None,
                  conf: dict | None = None) -> dict:
    """Rebuild the consume queues and index of the store at store_path with Spark tasks, aside, and swap
    them in on success; returns counts like rmqstore.store.repair.rebuild.rebuild_store (plus engine, tasks).
    conf: Spark settings for the session made here (ignored with spark=)."""
    from ..store.state.checkpoint import StoreCheckpoint
    from ..store.commitlog.commit_log import CommitLog
    from ..store.state.lock import AbortFile, StoreLock
    from ..store.recovery.recovery import RecoveryReport, recover_commit_log

    path = Path(store_path).resolve()
    config = config or StoreConfig()
    if not (path / "commitlog").is_dir():
        raise FileNotFoundError(f"{path}: not a store (no commitlog directory)")
    t0 = time.perf_counter()
    lock = StoreLock(path)
    lock.acquire()           # a store open elsewhere: StoreLockedError at once
    stage = staging.stage_dir(path)
    made = False
    stages: dict[str, float] = {}
    try:
        from ..store.commitlog import damage
        from ..store.consumequeue import deleted_queues
        # what the local engine leaves out too: accepted damage (check --repair) and deleted queues
        # (deleteTopic); an unusable record of either refuses the rebuild, naming its file
        skip = damage.merged(damage.load_ranges(path))
        deleted = [(t, q, b) for (t, q), b in sorted(deleted_queues.load(path).items())]
        staging.recover_stale(path)
        stage.mkdir()
        abort = AbortFile(path)
        ckpt = StoreCheckpoint(path / "checkpoint")
        try:
            cl = CommitLog(path, config)
            cl.load()
            end = recover_commit_log(cl, ckpt, not abort.exists(), RecoveryReport(clean_shutdown=not abort.exists(),
                                                                                  checkpoint_found=True))
            cl_min = max(cl.get_min_offset(), 0)
            stages["recover"] = time.perf_counter()
            files = [(str(mf.path), mf.file_from_offset, mf.file_size) for mf in cl.queue.files]
            cl.shutdown()
            sp, made = _session(master, spark, conf)
            sc = sp.sparkContext
            stages["session"] = time.perf_counter()
            parts, counts, last_full_ts = _build(sc, stage, config, files, end, cl_min, stages, skip, deleted)
            n = counts["messages"]
            staging.swap_in(path, stage)                 # from here on the store has the new files
            if n:
                ckpt.logics_msg_timestamp = [r for r in parts if r["n"]][-1]["last_store_timestamp"]
            if last_full_ts:
                ckpt.index_msg_timestamp = max(ckpt.index_msg_timestamp, last_full_ts)
            ckpt.flush()
            stages["swap"] = time.perf_counter()
        finally:
            ckpt.shutdown()
        abort.remove()
    finally:
        shutil.rmtree(stage, ignore_errors=True)         # a failed rebuild: the store keeps its files
        lock.release()
        if made:
            sp.stop()                                    # a failed job does not leave a session behind
    left = _missing_units(path, config)
    stages["check"] = time.perf_counter()
    prev, took = t0, {}
    for k, v in stages.items():
        took[k], prev = round(v - prev, 3), v
    return {"store": str(path), "engine": "spark", "bytes": (end - cl_min) if files else 0, **counts,
            "missing_units": left, "seconds": round(time.perf_counter() - t0, 3), "stage_seconds": took}


def _build(sc, stage: Path, config: StoreConfig, files: list, end: int, cl_min: int, stages: dict, skip: list,
           deleted: list):
    """Steps 2-4 into the staging directory: (parsed file summaries, counts, last full index file's end).
    skip: commitlog ranges not to dispatch (accepted damage); deleted: (topic, queue id, below) of deleted
    queues (their records below are in no queue)."""
    tasks = [(p, base, min(size, end - base), config.delay_levels_ms(), config.message_index_enable,
              str(stage / "parts" / str(base)), [(a, b) for a, b in skip if a < base + size and b > base], deleted)
             for p, base, size in files if base < end and base + size > cl_min]
    parts = usable_parts(_run(sc, parse_file, tasks), tasks, end)
    stages["parse"] = time.perf_counter()
    cq_tasks = queue_tasks(stage, config, parts, skip)
    ix_tasks, last_full_ts = index_tasks(stage, config, parts)
    _run(sc, _run_write, [("q", t) for t in cq_tasks] + [("i", t) for t in ix_tasks])
    stages["write"] = time.perf_counter()
    shutil.rmtree(stage / "parts", ignore_errors=True)
    counts = {"messages": sum(r["n"] for r in parts), "queues": len(cq_tasks), "index_files": len(ix_tasks),
              "tasks": len(tasks) + len(cq_tasks) + len(ix_tasks)}
    return parts, counts, last_full_ts


def _missing_units(path: Path, config: StoreConfig) -> int:
    """What MessageStore.open would make of the store, read-only: units left to re-dispatch (0)."""
    from .storeview import load_view
    view = load_view(str(path), config, live=False)
    left = sum(len(q.tail) for q in view.queues.values())
    if left:
        log.warning("%s: %d units are still missing after the spark rebuild", path, left)
    return left
