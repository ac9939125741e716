"""`rebuild` (local engine) against RocketMQ's own consume queue and index files."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rmqstore import codec
from rmqstore.config import StoreConfig
from rmqstore.rebuild import rebuild_store

GOLDEN = Path(__file__).resolve().parents[1].parent / "shared" / "golden"


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


def test_rebuild_refuses_non_store(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a store"):
        rebuild_store(tmp_path, StoreConfig())
