"""`rebuild` (local engine) against RocketMQ's own consume queue and index files."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import golden_dir

from rmqstore.store.format import codec
from rmqstore.store.conf.config import StoreConfig
from rmqstore.store.repair.rebuild import rebuild_store

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
    from rmqstore.store.commitlog import commit_log
    from rmqstore.tools.bench import generate_messages
    from rmqstore.store.format.message import Message
    from rmqstore.store.store import MessageStore

    try:                                 # the columnar append path moved to its own module
        from rmqstore.store.commitlog import columnar_append as holder
    except ImportError:
        holder = commit_log
    monkeypatch.setattr(holder, "DISPATCH_HINTS_MAX", 4)
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
    from rmqstore.store.format.message import Message
    from rmqstore.store.format.message_batch import MessageBatch
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


def _small_store(path: Path, n: int = 600) -> StoreConfig:
    from rmqstore.store.format.message import Message
    from rmqstore.store.store import MessageStore
    cfg = StoreConfig.from_dict({"mappedFileSizeCommitLog": 64 * 1024, "mappedFileSizeConsumeQueue": 300 * 20})
    with MessageStore.open(path, cfg) as s:
        for i in range(n):
            assert s.put_message(Message("T", b"m%04d" % i + b"." * 90, queue_id=i % 2,
                                         properties={"KEYS": f"k{i}"})).ok
    return cfg


def test_rebuild_leaves_a_crc_damaged_record_out_of_its_queue(tmp_path):
    """A record whose body fails its CRC (skipped by recovery after a crash, refused by reads) came back into
    its queue after a full rebuild: the dispatcher parses headers, not bodies. The offline rebuild checks
    every body's CRC first, leaves the damaged record out (its queue offset reads as a removed message, the
    next ones read) and reports the skipped range, in its result and on stderr from the CLI."""
    from conftest import run_cli
    from rmqstore.store.reads.reader import CommitLogReader
    from rmqstore.store.store import MessageStore
    path = tmp_path / "store"
    cfg = _small_store(path, 1500)            # 5 files: recovery checks only the last 3
    with CommitLogReader(path, cfg) as r:
        m = [m for m in r.messages() if m.body.startswith(b"m0101")][0]
    f = path / "commitlog" / f"{m.commit_log_offset // (64 * 1024) * 64 * 1024:020d}"
    assert f.name == "0" * 20
    raw = bytearray(f.read_bytes())
    pos = m.commit_log_offset - int(f.name)
    raw[pos + codec.HEADER_V4.size + 2] ^= 0x01      # a body byte: the CRC fails
    f.write_bytes(bytes(raw))
    out = rebuild_store(path, cfg)
    assert [(r["offset"], r["length"]) for r in out["skipped"]] == [(m.commit_log_offset, m.store_size)]
    assert "CRC" in out["skipped"][0]["reason"].upper() and out["skipped"][0]["accepted"] is False
    assert out["messages"] == 1499
    with MessageStore.open(path, cfg) as s:
        got = s.get_message("g", "T", m.queue_id, m.queue_offset, 1)
        assert all(x.commit_log_offset != m.commit_log_offset for x in got.messages)
        nxt = s.get_message("g", "T", m.queue_id, m.queue_offset + 1, 1).messages
        assert nxt and nxt[0].body.startswith(b"m0103")
        assert s.find_messages_by_key("T", "k101") == []
    p = run_cli("rebuild", "-c", _conf(tmp_path, cfg), path)
    assert p.returncode == 0, p.stderr.decode()
    err = [e for e in p.stderr.decode().splitlines() if "rmqstore.store.repair.rebuild" in e or "not dispatched" in e]
    assert len(err) == 1 and f"{m.commit_log_offset}..{m.commit_log_offset + m.store_size}" in err[0], err
    assert json.loads(p.stdout)["skipped"][0]["offset"] == m.commit_log_offset


def _conf(tmp_path: Path, cfg: StoreConfig) -> Path:
    conf = tmp_path / "store.conf"
    conf.write_text(f"mappedFileSizeCommitLog={cfg.mapped_file_size_commit_log}\n"
                    f"mappedFileSizeConsumeQueue={cfg.mapped_file_size_consume_queue}\n")
    return conf


def test_rebuild_skips_accepted_damage(tmp_path):
    """A range recorded as accepted damage (config/damagedRanges.json, written by check --repair) is not
    dispatched by a rebuild, even when its bytes look like a valid record."""
    from rmqstore.store.commitlog.damage import DamagedRange, record_ranges
    from rmqstore.store.reads.reader import CommitLogReader
    from rmqstore.store.store import MessageStore
    path = tmp_path / "store"
    cfg = _small_store(path)
    with CommitLogReader(path, cfg) as r:
        m = [m for m in r.messages() if m.body.startswith(b"m0100")][0]
    record_ranges(path, [DamagedRange("commitlog/x", m.commit_log_offset, m.store_size, "test", "now")])
    out = rebuild_store(path, cfg)
    assert [(r["offset"], r["accepted"]) for r in out["skipped"]] == [(m.commit_log_offset, True)]
    with MessageStore.open(path, cfg) as s:
        got = s.get_message("g", "T", m.queue_id, m.queue_offset, 1)
        assert all(x.commit_log_offset != m.commit_log_offset for x in got.messages)


def test_rebuild_with_a_forgotten_config_removes_nothing(tmp_path):
    from conftest import run_cli
    path = tmp_path / "store"
    _small_store(path)
    before = cq_files(path)
    p = run_cli("rebuild", path)
    err = p.stderr.decode().strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and "-c broker.conf" in err[0], err
    assert "does not match mappedFileSizeCommitLog" in err[0]
    assert cq_files(path) == before


def test_open_never_dispatches_accepted_damage_again(tmp_path):
    """A range check --repair accepted (config/damagedRanges.json) stays out of its queue when an open after
    a crash dispatches it again, as it stays out of a rebuild."""
    import shutil
    from rmqstore.store.commitlog.damage import DamagedRange, record_ranges
    from rmqstore.store.reads.reader import CommitLogReader
    from rmqstore.store.store import MessageStore
    path = tmp_path / "store"
    cfg = _small_store(path)
    with CommitLogReader(path, cfg) as r:
        m = [m for m in r.messages() if m.body.startswith(b"m0100")][0]
    record_ranges(path, [DamagedRange("commitlog/x", m.commit_log_offset, m.store_size, "test", "now")])
    shutil.rmtree(path / "consumequeue")              # the queues are gone: the open dispatches every record
    (path / "abort").write_bytes(b"")
    with MessageStore.open(path, cfg) as s:
        got = s.get_message("g", "T", m.queue_id, m.queue_offset, 1)
        assert all(x.commit_log_offset != m.commit_log_offset for x in got.messages)
        after = s.get_message("g", "T", m.queue_id, m.queue_offset + 1, 1)
        assert after.messages and after.messages[0].queue_offset == m.queue_offset + 1   # offsets go on
