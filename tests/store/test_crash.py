"""Crash test: an ASYNC_FLUSH writer is SIGKILLed at random moments, again and again, and what survives is a
gap-free prefix of what it put.

After each kill the parent opens the store (in place, or a copy so that the next child recovers from the
crash itself) and checks what a client was told against what is on disk (store_checks.verify_store):
every acknowledged put is there with its content, no queue offset twice, consume queues and index agree
with the commitlog, and the next put to a queue gets the next queue offset. SIGKILL does not lose the page
cache, so "acknowledged => present" holds for ASYNC_FLUSH too. The SIGKILL loops of both flush modes with a
multi-threaded writer, each answer looked up by offset, msgId and key: test_kill_loop.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import time
from pathlib import Path

from kill_child import Zygote, read_side, wait_ready
from rmqstore.store.store import MessageStore
from store_checks import Acked, WalkCache, next_puts_continue, small_config, verify_store


SEED = int(os.environ.get("RMQSTORE_CRASH_SEED", "0"))   # another value explores other kill moments


def _crash_loop(tmp_path: Path, flush: str, kills: int, seed: int, max_run: float = 0.4) -> tuple[list[Acked], int]:
    rng = random.Random(seed)
    store_dir = tmp_path / "store"
    acked: list[Acked] = []
    total_puts = 0
    walk = WalkCache()          # commitlog files walked before, byte for byte the same, are not decoded again
    # The writer is tests/crash_child.py's main(), forked by kill_child's zygote (which imported rmqstore once)
    # instead of a new interpreter per kill: the same process code from the same store, started in ms, not 1 s.
    zygote = Zygote(tmp_path / "zygote.err")
    try:
        for k in range(kills):
            side = tmp_path / f"child-{k}.out"
            err = Path(str(side) + ".err")
            pid = zygote.crash(store_dir, flush, f"r{k}", seed * 1000 + k, 30, side)
            try:
                assert wait_ready(side), f"child did not open the store: {_tail(err)}"
                # kill at a random moment: right away, mid-stream, or after a file roll or two
                time.sleep(rng.choice((0.0, 0.01, 0.05)) + rng.uniform(0.0, max_run))
            finally:
                os.kill(pid, signal.SIGKILL)
                code = zygote.wait(pid)
            assert code == -signal.SIGKILL, f"child ended with {code} before the kill: {_tail(err)}"
            new, failures, _, _ = read_side(side)      # PUT_OK lines written whole before the kill
            assert not failures, failures[:5]
            total_puts += len(new)
            acked += new
            _check_after_kill(tmp_path, store_dir, flush, k, acked, rng, walk)
    finally:
        zygote.close()
    return acked, total_puts


def _tail(p: Path) -> str:
    return p.read_text(errors="replace")[-2000:] if p.exists() else ""


def _check_after_kill(tmp_path: Path, store_dir: Path, flush: str, k: int, acked: list[Acked], rng: random.Random,
                      walk: WalkCache) -> None:
    in_place = k % 2 == 1
    target = store_dir
    if not in_place:            # check a copy: the next child then recovers from this crash itself
        target = tmp_path / "copy"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(store_dir, target)
    t0 = time.monotonic()
    with MessageStore.open(target, small_config(flush)) as store:
        rep = store.recovery_report
        assert not rep.clean_shutdown, "a killed store must recover as after a crash"
        verify_store(store, acked, index_sample=300, rng=rng, walk_cache=walk)
        # every queue (not only those with acknowledged puts) continues
        added = next_puts_continue(store, {(cq.topic, cq.queue_id): -1 for cq in store.consume_queues}, f"p{k}")
        verify_store(store, added, walk_cache=walk)
    if in_place:
        acked += added
    else:
        shutil.rmtree(target)
    assert time.monotonic() - t0 < 30


def test_async_flush_keeps_a_gap_free_prefix(tmp_path):
    """ASYNC_FLUSH: what survives each kill is a gap-free prefix of what was put (by physical offset), with
    gap-free queue offsets; acknowledged puts survive too (SIGKILL keeps the page cache)."""
    acked, puts = _crash_loop(tmp_path, "ASYNC_FLUSH", kills=10, seed=23 + SEED, max_run=0.2)
    assert puts > 200
    with MessageStore.open(tmp_path / "store", small_config("ASYNC_FLUSH")) as store:
        records = verify_store(store, acked, check_index=False)
        # a prefix: records tile the commitlog from its min offset (blank END_OF_FILE records aside)
        size = store.config.mapped_file_size_commit_log
        expect = store.get_min_phy_offset()
        for r in records:
            if r.offset != expect:
                assert r.offset % size == 0 and expect // size < r.offset // size, \
                    f"gap in the commitlog between {expect} and {r.offset}"
            expect = r.offset + r.size
        assert expect == store.get_max_phy_offset()
        # every queue gap-free from 0 (nothing was cleaned)
        per_queue: dict[tuple[str, int], list[int]] = {}
        for r in records:
            if r.dispatchable:
                per_queue.setdefault((r.topic, r.queue_id), []).append(r.queue_offset)
        for k, offs in per_queue.items():
            assert offs == list(range(len(offs))), f"queue {k} has gaps or repeats"
