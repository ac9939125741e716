"""`rebuild` (local engine) against RocketMQ's own consume queue and index files."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from conftest import golden_dir

from rmqstore.store import codec
from rmqstore.store.config import StoreConfig
from rmqstore.store.rebuild import rebuild_store

GOLDEN = golden_dir()     # $RMQSTORE_GOLDEN, else ../shared/golden (conftest)


def copy_store(name: str, dst: Path) -> Path:
    out = dst / name
    shutil.copytree(GOLDEN / name / "store", out)
    for p in [out, *out.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return out


def cq_files(root: Path) -> dict[str, bytes]:
    base = root / "consumequeue"
    return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


def index_parts(root: Path) -> list[tuple[tuple, bytes]]:
    """Per index file in name order: header without hashSlotCount, and slots + entries."""
    out = []
    for p in sorted((root / "index").iterdir()):
        raw = p.read_bytes()
        b_ts, e_ts, b_phy, e_phy, _slots, count = codec.INDEX_HEADER.unpack_from(raw, 0)
        out.append(((b_ts, e_ts, b_phy, e_phy, count), raw[codec.INDEX_HEADER_SIZE:]))
    return out


def test_rebuild_clean_set_matches_rocketmq(tmp_path):
    cfg = StoreConfig.load(GOLDEN / "rmq440-clean" / "store.conf")
    path = copy_store("rmq440-clean", tmp_path)
    seen = []
    out = rebuild_store(path, cfg, progress=lambda done, total: seen.append((done, total)))
    assert out["messages"] == 3000
    assert seen and seen[-1][0] == seen[-1][1]
    assert cq_files(path) == cq_files(GOLDEN / "rmq440-clean" / "store")
    assert index_parts(path) == index_parts(GOLDEN / "rmq440-clean" / "store")
    assert not (path / "abort").exists()


def test_rebuild_crash_set_queues_match_rocketmq(tmp_path):
    """RocketMQ recovered this set on opening; its dump came from that. A rebuild from the commitlog
    writes every queue unit RocketMQ has, and the units it lacked, in the same order."""
    cfg = StoreConfig.load(GOLDEN / "rmq440-crash" / "store.conf")
    path = copy_store("rmq440-crash", tmp_path)
    rebuild_store(path, cfg)
    ours, theirs = cq_files(path), cq_files(GOLDEN / "rmq440-crash" / "store")
    assert ours.keys() == theirs.keys()
    for name, data in theirs.items():
        # RocketMQ's files stopped where its dispatcher was killed: ours extend them.
        written = len(data.rstrip(b"\0"))
        written += -written % codec.CQ_STORE_UNIT_SIZE
        assert ours[name][:written] == data[:written], name


def test_dispatcher_parses_up_to_the_next_hinted_batch(tmp_path, monkeypatch):
    """Records without columns (a put of the general path; batches put while DISPATCH_HINTS_MAX batches
    waited) are parsed, and the parse stops where the next batch with columns starts, so that the dispatcher
    takes the columns again from there; the queues and index equal a rebuild's."""
    from rmqstore.store import commit_log
    from rmqstore.tools.bench import generate_messages
    from rmqstore.store.message import Message
    from rmqstore.store.store import MessageStore

    monkeypatch.setattr(commit_log, "DISPATCH_HINTS_MAX", 4)
    cfg = StoreConfig.from_dict({"mappedFileSizeCommitLog": 1 << 20, "maxHashSlotNum": 512, "maxIndexNum": 4096})
    path = tmp_path / "live"
    with MessageStore.open(path, cfg, start_services=False) as store:
        store.commit_log.dispatch_hints = {}     # what Dispatcher.start does; no thread takes them here
        store.put_message(Message("T", b"general path", properties={"KEYS": "g"}))
        for i in range(6):                       # the first 4 batches are handed over, 2 are not
            assert all(r.ok for r in store.put_messages(generate_messages(50, 20, 2, topic=f"T{i % 2}")))
        assert len(store.commit_log.dispatch_hints) == 4
        while store.dispatcher.do_reput():
            pass
        assert store.dispatcher.hinted_messages == 4 * 50
        assert store.dispatcher.dispatched_messages == 6 * 50 + 1
        assert not store.commit_log.dispatch_hints
    copy = tmp_path / "rebuilt"
    shutil.copytree(path, copy)
    rebuild_store(copy, cfg)
    assert cq_files(path) == cq_files(copy)
    assert index_parts(path) == index_parts(copy)


def test_rebuild_refuses_non_store(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a store"):
        rebuild_store(tmp_path, StoreConfig())


def test_dispatch_from_the_writers_columns_equals_a_rebuild(tmp_path):
    """Columnar puts hand the dispatcher their columns instead of having it parse the records back: the
    consume queues and index built that way are byte for byte what a rebuild from the commitlog writes,
    across file rolls, several topics, prepared transaction messages and batches of every kind."""
    import random

    from rmqstore.tools.bench import generate_messages
    from rmqstore.store.message import Message
    from rmqstore.store.message_batch import MessageBatch
    from rmqstore.store.store import MessageStore
    cfg = StoreConfig.from_dict({"mappedFileSizeCommitLog": 256 * 1024, "mappedFileSizeConsumeQueue": 300 * 20,
                                 "maxHashSlotNum": 512, "maxIndexNum": 2048})
    rng = random.Random(7)
    path = tmp_path / "live"
    with MessageStore.open(path, cfg) as store:
        for round_ in range(12):
            msgs = generate_messages(rng.randint(20, 400), rng.randint(0, 300), 3, topic=f"T{round_ % 3}")
            if round_ % 4 == 1:
                msgs[5].sys_flag = codec.TRANSACTION_PREPARED_TYPE      # takes no queue offset, indexed
            if round_ % 4 == 2:
                msgs[3].sys_flag = codec.TRANSACTION_ROLLBACK_TYPE      # neither queued nor indexed
            assert all(r.ok for r in store.put_messages(msgs))
            n = rng.randint(16, 300)
            batch = MessageBatch("Cols", [bytes([i % 251]) * rng.randint(0, 200) for i in range(n)],
                                 queue_ids=[rng.randint(0, 5) for _ in range(n)],
                                 tags=rng.choice(["A", None, [rng.choice(["x", "y", ""]) for _ in range(n)]]),
                                 keys=[f"c{round_}-{i} k{i % 7}" for i in range(n)])
            assert store.put_messages(batch).all_ok
            store.put_messages([Message("Few", b"f", properties={"KEYS": f"few{round_}"})])   # general path
        assert store.wait_dispatched(timeout=30)
        hinted, total = store.dispatcher.hinted_messages, store.dispatcher.dispatched_messages
    assert 0 < hinted < total
    copy = tmp_path / "rebuilt"
    shutil.copytree(path, copy)
    rebuild_store(copy, cfg)
    assert cq_files(path) == cq_files(copy)
    assert index_parts(path) == index_parts(copy)
