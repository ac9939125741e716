"""rebuild_spark: drop and rebuild a store's consume queues and index with Spark (distributed dispatch).

1. driver: take the store's lock (held to the end), remove consumequeue/ and index/, recover the commitlog
   as MessageStore.open does (rmqstore.store.recovery.recover_commit_log: invalid data after the last valid
   record is cut off);
2. one task per commitlog file parses it (codec.parse_dispatch_columns, the local dispatcher's parser) and
   returns its records' columns and the hashes of their index keys;
3. the driver lays the records out: per (topic, queue) the units in commitlog order, and the index entries
   cut into files of maxIndexNum - 1 entries each (a file is full then, as IndexService fills them);
4. one task per consume queue writes it (ConsumeQueue.put_arrays, the local dispatcher's code), and one task
   per index file writes it (IndexFile.put_hashes, carrying the previous file's end values, as a new file
   does): every file is written by exactly one task, so the tasks run in any order;
5. driver: checkpoint (logicsMsgTimestamp: the last record's store time; indexMsgTimestamp: the newest full
   index file's end, as a local rebuild's close() writes them), abort file removed, lock released; a
   read-only check (storeview) that recovery would find nothing to re-dispatch.

Consume queues are byte-identical to the local engine's (rmqstore.store.rebuild.rebuild_store) and RocketMQ's;
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

from ..store import codec
from ..store.config import StoreConfig
from ..store.index_file import time_millis_to_human_string

log = logging.getLogger(__name__)

ROLLBACK = codec.TRANSACTION_ROLLBACK_TYPE


# --- tasks (executors) --------------------------------------------------------------------------------
def parse_file(task: tuple) -> dict:
    """Task of step 2: (path, base offset, limit, delay levels) -> columns of the file's records."""
    path, base, limit, delay_levels, with_index = task
    from ..store.index_file import key_hashes
    from .storeview import map_read_only
    mm = map_read_only(path)
    if mm is None:
        return {"base": base, "n": 0, "pos": 0, "outcome": codec.PARSE_END, "reason": None}
    try:
        view = memoryview(mm)[:min(limit, len(mm))]
        batch, pos, outcome, reason = codec.parse_dispatch_columns(view, base, True, delay_levels)
        del view
    finally:
        try:
            mm.close()
        except BufferError:
            pass
    n = len(batch)
    out = {"base": base, "n": n, "pos": pos, "outcome": outcome, "reason": reason,
           "topic_names": list(batch.topic_names)}
    if n:
        for name in ("topic_ids", "queue_ids", "offsets", "sizes", "tags_codes", "store_timestamps",
                     "queue_offsets", "sys_flags"):
            out[name] = np.asarray(getattr(batch, name), dtype=np.int64)
    if n and with_index:
        # IndexService.build_index_columns' keys: UNIQ_KEY, then each KEYS word, as topic#key; not for
        # rolled-back messages
        keys: list[str] = []
        counts = np.zeros(n, dtype=np.int64)
        names = batch.topic_names
        tids = out["topic_ids"].tolist()
        sfs = out["sys_flags"].tolist()
        for i, (k, u) in enumerate(zip(batch.keys, batch.uniq_keys)):
            if sfs[i] & ROLLBACK == ROLLBACK:
                continue
            prefix = names[tids[i]] + "#"
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
        out["key_hashes"] = key_hashes(keys) if keys else np.empty(0, dtype=np.int64)
        out["key_counts"] = counts
    return out


def write_queue(task: tuple) -> dict:
    """Task of step 4: one consume queue."""
    root, file_size, topic, qid, offs, sizes, tags, qoffs = task
    from ..store.consume_queue import ConsumeQueue
    cq = ConsumeQueue(topic, qid, Path(root) / "consumequeue", file_size)
    try:
        cq.put_arrays(offs, sizes, tags, qoffs)
        cq.flush()
        files = len(cq.queue.files)
    finally:
        cq.shutdown()
    return {"queue": f"{topic}/{qid}", "units": len(offs), "files": files}


def write_index_file(task: tuple) -> dict:
    """Task of step 4: one index file."""
    path, slots, num, prev_phy, prev_ts, hashes, phys, stamps = task
    from ..store.index_file import IndexFile
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
    return {"file": os.path.basename(path), "entries": len(hashes), "header": header}


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


def _session(master: str | None, spark):
    if spark is not None:
        return spark
    from . import spark_session
    return spark_session(master, app_name="rmqstore-rebuild")


def rebuild_spark(store_path, config: StoreConfig | None = None, master: str | None = None, spark=None) -> dict:
    """Drop and rebuild the consume queues and index of the store at store_path with Spark tasks; returns
    counts like rmqstore.store.rebuild.rebuild_store (plus engine, tasks)."""
    from ..store.checkpoint import StoreCheckpoint
    from ..store.commit_log import CommitLog
    from ..store.lock import AbortFile, StoreLock
    from ..store.recovery import RecoveryReport, recover_commit_log

    path = Path(store_path).resolve()
    config = config or StoreConfig()
    if not (path / "commitlog").is_dir():
        raise FileNotFoundError(f"{path}: not a store (no commitlog directory)")
    t0 = time.perf_counter()
    lock = StoreLock(path)
    lock.acquire()           # a store open elsewhere: StoreLockedError at once
    released = False
    try:
        for sub in ("consumequeue", "index"):
            shutil.rmtree(path / sub, ignore_errors=True)
        abort = AbortFile(path)
        clean = not abort.exists()
        ckpt = StoreCheckpoint(path / "checkpoint")
        try:
            cl = CommitLog(path, config)
            cl.load()
            report = RecoveryReport(clean_shutdown=clean, checkpoint_found=True)
            end = recover_commit_log(cl, ckpt, clean, report)
            cl_min = max(cl.get_min_offset(), 0)
            files = [(str(mf.path), mf.file_from_offset, mf.file_size) for mf in cl.queue.files]
            cl.shutdown()
            sp = _session(master, spark)
            sc = sp.sparkContext
            levels = config.delay_levels_ms()
            tasks = [(p, base, min(size, end - base), levels, config.message_index_enable)
                     for p, base, size in files if base < end and base + size > cl_min]
            parsed = (sc.parallelize(tasks, max(len(tasks), 1)).map(parse_file).collect() if tasks else [])
            parsed.sort(key=lambda r: r["base"])
            # the local dispatcher stops at the first error (zeros or garbage inside the data)
            usable = []
            for r, (p, base, limit, _, _) in zip(parsed, tasks):
                usable.append(r)
                if r["outcome"] == codec.PARSE_ERROR or (r["outcome"] == codec.PARSE_END and base + r["pos"] < end):
                    log.error("%s: dispatch stops at offset %d: %s", p, base + r["pos"],
                              r["reason"] or "zero bytes inside the written part of the commitlog")
                    break
            cols = _concat(usable)
            n = len(cols["offsets"])
            cq_tasks, index_tasks, last_full_ts = _layout(path, config, cols)
            all_tasks = [("q", t) for t in cq_tasks] + [("i", t) for t in index_tasks]
            results = (sc.parallelize(all_tasks, max(len(all_tasks), 1)).map(_run_write).collect()
                       if all_tasks else [])
            if n:
                ckpt.logics_msg_timestamp = int(cols["store_timestamps"][-1])
            if last_full_ts:
                ckpt.index_msg_timestamp = max(ckpt.index_msg_timestamp, last_full_ts)
            ckpt.flush()
        finally:
            ckpt.shutdown()
        abort.remove()
        lock.release()
        released = True
        # what MessageStore.open would make of it, read-only: nothing left to re-dispatch
        from .storeview import load_view
        view = load_view(str(path), config, live=False)
        left = sum(len(q.tail) for q in view.queues.values())
        if left:
            log.warning("%s: %d units are still missing after the spark rebuild", path, left)
        out = {"store": str(path), "engine": "spark", "messages": n,
               "bytes": (end - cl_min) if files else 0, "queues": len(cq_tasks),
               "index_files": len(index_tasks), "tasks": len(tasks) + len(all_tasks), "missing_units": left}
    finally:
        if not released:
            lock.release()
    out["seconds"] = round(time.perf_counter() - t0, 3)
    return out


def _run_write(item):
    kind, task = item
    return write_queue(task) if kind == "q" else write_index_file(task)


def _concat(parsed: list[dict]) -> dict:
    names: list[str] = []
    ids: dict[str, int] = {}
    parts = {k: [] for k in ("topic_ids", "queue_ids", "offsets", "sizes", "tags_codes", "store_timestamps",
                             "queue_offsets", "sys_flags", "key_hashes", "key_counts")}
    for r in parsed:
        if not r["n"]:
            continue
        remap = np.array([ids.setdefault(t, len(ids)) for t in r["topic_names"]], dtype=np.int64)
        for k in parts:
            if k in r:
                parts[k].append(remap[r[k]] if k == "topic_ids" else r[k])
    names = list(ids)
    out = {k: (np.concatenate(v) if v else np.empty(0, dtype=np.int64)) for k, v in parts.items()}
    out["topic_names"] = names
    return out


def _layout(root: Path, config: StoreConfig, cols: dict) -> tuple[list, list, int]:
    """Step 3: per-queue units and per-file index entries (as task arguments)."""
    n = len(cols["offsets"])
    cq_tasks = []
    if n:
        tran = cols["sys_flags"] & codec.TRANSACTION_TYPE_MASK
        idx = np.flatnonzero((tran != codec.TRANSACTION_PREPARED_TYPE) & (tran != codec.TRANSACTION_ROLLBACK_TYPE))
        group = cols["topic_ids"][idx] * (1 << 32) + (cols["queue_ids"][idx] & 0xFFFFFFFF)
        order = np.argsort(group, kind="stable")
        sidx = idx[order]
        cuts = np.flatnonzero(np.diff(group[order])) + 1
        for part in (np.split(sidx, cuts) if len(sidx) else []):
            i0 = int(part[0])
            topic = cols["topic_names"][int(cols["topic_ids"][i0])]
            qid = int(cols["queue_ids"][i0])
            cq_tasks.append((str(root), config.mapped_file_size_consume_queue, topic, qid,
                             cols["offsets"][part], cols["sizes"][part], cols["tags_codes"][part],
                             cols["queue_offsets"][part]))
    index_tasks = []
    last_full_ts = 0
    hashes = cols["key_hashes"]
    if config.message_index_enable and len(hashes):
        c = cols["key_counts"]
        phys = np.repeat(cols["offsets"], c)
        stamps = np.repeat(cols["store_timestamps"], c)
        per = config.max_index_num - 1
        starts = list(range(0, len(hashes), per))
        names = index_file_names([int(stamps[s]) for s in starts])
        prev_phy = prev_ts = 0
        for s, name in zip(starts, names):
            e = min(s + per, len(hashes))
            index_tasks.append((str(root / "index" / name), config.max_hash_slot_num, config.max_index_num,
                                prev_phy, prev_ts, hashes[s:e], phys[s:e], stamps[s:e]))
            prev_phy, prev_ts = int(phys[e - 1]), int(stamps[e - 1])
            if e - s == per:
                last_full_ts = int(stamps[e - 1])
        (root / "index").mkdir(parents=True, exist_ok=True)
    return cq_tasks, index_tasks, last_full_ts
