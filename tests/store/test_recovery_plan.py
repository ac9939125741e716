"""Recovery as plan, then apply (recovery.plan_recovery / apply_plan): the plan is pure (reads only), each
golden set's plan leads to what RocketMQ recovered (its dump.jsonl), and the read-only path (store.recovery.view,
StoreReader) and the read-write path (MessageStore.open) cannot disagree: for the golden sets and for
stores crashed here with SIGKILL, the view's queues and units equal what open() yields on a copy."""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from rmqstore.store.format import codec
from rmqstore.store.conf.config import StoreConfig
from rmqstore.store.recovery.recovery import RecoveryPlan, plan_recovery, read_inputs
from rmqstore.store.store import MessageStore
from rmqstore.store.reads.store_reader import StoreReader
from rmqstore.store.recovery.view import RecoveredStore, load_view
from rmqstore.tools.dump import dump_lines, read_keys

from conftest import golden_store, read_jsonl
from store_checks import Child, small_config

SETS = ("rmq440-clean", "rmq440-crash")
UNIT = codec.CQ_STORE_UNIT_SIZE


def snapshot(root: Path) -> dict:
    """Every entry under root: (kind, size, mtime_ns, sha256) of files, the names in each directory."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        st = d.stat()
        out[str(d.relative_to(root))] = ("dir", sorted(dirnames + filenames), st.st_mtime_ns)
        for n in filenames:
            p = d / n
            st = p.stat()
            out[str(p.relative_to(root))] = ("file", st.st_size, st.st_mtime_ns,
                                             hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def golden_config(golden: Path, name: str) -> StoreConfig:
    return StoreConfig.load(golden / name / "store.conf")


def open_answer(path: Path, cfg: StoreConfig) -> dict:
    """What MessageStore.open serves: per queue (min, max, units (offset, size) from min to max)."""
    out = {}
    with MessageStore.open(path, cfg, start_services=False) as st:
        for cq in st.consume_queues.sorted_queues():
            lo, hi = cq.get_min_offset_in_queue(), cq.get_max_offset_in_queue()
            u = cq.units(lo, hi)
            out[(cq.topic, cq.queue_id)] = (lo, hi, u["offset"].astype(np.int64).tolist(),
                                            u["size"].astype(np.int64).tolist())
        out["end"] = st.get_max_phy_offset()
    return out


def view_answer(path: Path, cfg: StoreConfig) -> dict:
    """The same from the read-only view (store.recovery.view.load_view)."""
    view = load_view(str(path), cfg, live=False)
    out = {}
    for key, qv in sorted(view.queues.items()):
        o, s = qv.units(qv.min_offset, qv.end)
        out[key] = (qv.min_offset, qv.end, o.tolist(), s.tolist())
    out["end"] = view.data_end
    return out


def same_queues(a: dict, b: dict) -> None:
    """Equal answers; queues that are empty on one side may be absent on the other."""
    keys = set(a) | set(b)
    for k in sorted(keys, key=str):
        x, y = a.get(k), b.get(k)
        if x is None or y is None:
            z = x if y is None else y
            assert z[1] == z[0] and not z[2], f"{k}: {x} vs {y}"
            continue
        assert x == y, f"{k}: open() {x[:2]} {len(x[2])} units vs view {y[:2]} {len(y[2])} units"


# --- the plan --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SETS)
def test_plan_of_golden_set_leads_to_what_rocketmq_recovered(golden, golden_copy, name):
    store = golden_copy(name)
    cfg = golden_config(golden, name)
    dump = read_jsonl(golden / name / "dump.jsonl")
    want = {(d["queue"], d["queueId"]): (d["min"], d["max"]) for d in dump if "queue" in d}
    before = snapshot(store)
    inputs = read_inputs(store)
    assert inputs.clean == (name == "rmq440-clean")
    plan = plan_recovery(inputs, cfg)
    assert snapshot(store) == before                    # pure: nothing written, created or touched
    assert isinstance(plan, RecoveryPlan)
    assert plan.commitlog.end == dump[0]["maxPhy"]      # RocketMQ's commitlog end after its recovery
    assert plan.dropped_at is None and not plan.commitlog.skipped
    planned = {(q.topic, q.queue_id): q for q in plan.queues}
    for key, (lo, hi) in want.items():
        q = planned[key]
        assert q.min_logic_offset // UNIT == lo, key
        assert q.end // UNIT <= hi, key                 # the rest comes back with the re-dispatch
        assert q.max_physic_offset <= plan.commitlog.end
    assert 0 <= plan.reput_from <= plan.commitlog.end
    # applied in memory (the view's path) it gives RocketMQ's queues exactly
    rec = RecoveredStore.open(store, cfg)
    try:
        got = {(cq.topic, cq.queue_id): (cq.get_min_offset_in_queue(), cq.get_max_offset_in_queue())
               for cq in rec.files.consume_queues}
    finally:
        rec.close()
    assert {k: v for k, v in got.items() if v != (0, 0) or k in want} == want
    assert snapshot(store) == before


def test_plan_is_pure_on_a_damaged_store(golden, golden_copy):
    """A crashed store with a torn commitlog tail and a damaged consume queue unit: planning changes no
    byte, mtime or directory entry, and says what open() then removes."""
    store = golden_copy("rmq440-crash")
    cfg = golden_config(golden, "rmq440-crash")
    end = read_jsonl(golden / "rmq440-crash" / "dump.jsonl")[0]["maxPhy"]
    cl = [p for p in sorted((store / "commitlog").iterdir()) if int(p.name) <= end][-1]
    with open(cl, "r+b") as f:                          # garbage after the end: a torn tail
        f.seek(end - int(cl.name))
        f.write(b"\x00\x00\x01\x00" + b"\xee" * 60)
    qfile = next(p for p in (store / "consumequeue").rglob("0" * 20) if p.stat().st_size > 200)
    with open(qfile, "r+b") as f:                       # one unit zeroed in the middle
        f.seek(5 * UNIT)
        f.write(bytes(UNIT))
    before = snapshot(store)
    plan = plan_recovery(read_inputs(store), cfg)
    assert snapshot(store) == before
    assert plan.dropped_at == end and plan.commitlog.end == end
    assert any(d.what == "consume queue" and d.path == str(qfile.parent) for d in plan.dropped), plan.dropped
    with MessageStore.open(store, cfg, start_services=False) as st:
        rep = st.recovery_report
        assert rep.dropped_at == plan.dropped_at and [str(d) for d in rep.dropped] == [str(d) for d in plan.dropped]
        assert rep.redispatched_from == plan.reput_from


# --- read-only path == read-write path --------------------------------------------------------------------
@pytest.mark.parametrize("name", SETS)
def test_view_equals_open_for_golden_sets(golden, golden_copy, tmp_path, name):
    cfg = golden_config(golden, name)
    a, b = golden_copy(name), tmp_path / "b"
    shutil.copytree(golden_store(golden, name), b)      # read-only files: the view needs no write access
    before = snapshot(b)
    same_queues(open_answer(a, cfg), view_answer(b, cfg))
    assert snapshot(b) == before


@pytest.mark.parametrize("name", SETS)
def test_store_reader_serves_the_golden_dump(golden, tmp_path, name):
    store = tmp_path / "s"
    shutil.copytree(golden_store(golden, name), store)  # read-only files, as the golden set's
    before = snapshot(store)
    keys = read_keys(golden / name / "keys.tsv")
    with StoreReader.open(store, golden_config(golden, name)) as r:
        got = list(dump_lines(r, keys))
    assert got == read_jsonl(golden / name / "dump.jsonl")
    assert snapshot(store) == before


def crash_store(tmp_path: Path, flush: str, seed: int, puts: int) -> Path:
    store = tmp_path / f"crashed-{flush}-{seed}"
    child = Child(store, flush, f"r{seed}", seed, max_seconds=60)
    try:
        assert child.ready.wait(60), child.err.decode()
        assert child.wait_puts(puts, timeout=60), child.err.decode()
    finally:
        child.kill()                                    # SIGKILL: the abort file stays
    assert (store / "abort").exists()
    return store


@pytest.mark.parametrize("flush,seed,puts", [("ASYNC_FLUSH", 11, 400), ("SYNC_FLUSH", 12, 150),
                                             ("ASYNC_FLUSH", 13, 1500)])
def test_view_and_reader_equal_open_after_sigkill(tmp_path, flush, seed, puts):
    a = crash_store(tmp_path, flush, seed, puts)
    b = tmp_path / "copy"
    shutil.copytree(a, b)
    cfg = small_config(flush)
    before = snapshot(b)
    view = view_answer(b, cfg)
    with StoreReader.open(b, cfg) as r:
        read = list(dump_lines(r))
    assert snapshot(b) == before
    same_queues(open_answer(a, cfg), view)
    with MessageStore.open(a, cfg, start_services=False) as st:
        assert read == list(dump_lines(st))
