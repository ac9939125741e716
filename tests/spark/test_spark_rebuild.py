"""`rmqstore rebuild --engine spark` as a subprocess: builds aside and swaps in, so a SIGKILLed rebuild
leaves consumequeue/ and index/ as they were; a later one (with a small spark.driver.memory, passed with
--conf) cleans up and gives the local engine's files. Also the staging directory's recovery, without
Spark."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from rmqstore.errors import StoreLockedError
from rmqstore.spark import staging
from rmqstore.store.conf.config import StoreConfig
from rmqstore.store.format.message_batch import MessageBatch
from rmqstore.store.repair.rebuild import rebuild_store
from rmqstore.store.store import MessageStore
from conftest import SPARK_JVM_OPTIONS, with_worker_preload
from store_checks import index_parts, tree_files

# 50,000 messages (make_store) in 7 commitlog files of 1 MiB, 7 consume queue files a queue, 6 index files
CONF = ("mapedFileSizeCommitLog=1048576\nmapedFileSizeConsumeQueue=20000\nmaxHashSlotNum=5000\n"
        "maxIndexNum=10000\n")


def make_store(path: Path, cfg: StoreConfig, n: int) -> None:
    with MessageStore.open(path, cfg) as st:
        for s in range(0, n, 5000):
            for t in ("RA", "RB"):
                st.put_messages(MessageBatch(t, [f"{t}-{i}".encode() * 3 for i in range(s, s + 5000)],
                                             queue_ids=[i % 4 for i in range(5000)], tags=f"tag{s % 3}",
                                             keys=[f"k{i}" for i in range(s, s + 5000)]))
        assert st.wait_dispatched(120)


# each CLI starts its own JVM for one short job (conftest.SPARK_JVM_OPTIONS); the rebuild's work is in Python
JVM_OPTIONS = ("--conf", f"spark.driver.extraJavaOptions={SPARK_JVM_OPTIONS}")


def rebuild_cli(store: Path, conf: Path, *extra: str) -> subprocess.Popen:
    # its Spark's Python processes load conftest.WORKER_PRELOAD, as the suite's own session's do
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYTHONPATH=with_worker_preload(os.environ.get("PYTHONPATH")))
    return subprocess.Popen([str(Path(sys.executable).parent / "rmqstore"), "rebuild", "--engine", "spark",
                             "--master", "local[2]", *JVM_OPTIONS, *extra, "-c", str(conf), str(store)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def wait_unlocked(store: Path, cfg: StoreConfig) -> None:
    deadline = time.time() + 120
    while True:
        try:
            with MessageStore.open(store, cfg, start_services=False):
                return
        except StoreLockedError:
            assert time.time() < deadline, "the killed rebuild's lock was not released"
            time.sleep(0.5)


@pytest.mark.spark
def test_killed_rebuild_leaves_store_then_rebuild_with_small_driver(tmp_path):
    conf = tmp_path / "store.conf"
    conf.write_text(CONF)
    cfg = StoreConfig.load(conf)
    store, local = tmp_path / "store", tmp_path / "local"
    make_store(store, cfg, 25_000)
    shutil.copytree(store, local)
    before = {sub: tree_files(store, sub) for sub in ("consumequeue", "index")}
    assert len(before["index"]) >= 4 and len(before["consumequeue"]) >= 16
    p = rebuild_cli(store, conf)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and p.poll() is None:     # mid-run: tasks have written pieces
            if any(store.glob(".rebuild-*/parts/*/q*.npy")):
                break
            time.sleep(0.01)
        assert p.poll() is None, p.communicate()
        os.kill(p.pid, signal.SIGKILL)                         # the CLI (driver) process only
        p.wait(60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    wait_unlocked(store, cfg)                                  # ... and the store opens
    assert {sub: tree_files(store, sub) for sub in ("consumequeue", "index")} == before, "store changed"
    assert list(store.glob(".rebuild-*")), "the killed rebuild's staging directory is left"
    # a full rebuild now, with a 512 MB driver (Spark's minimum is 450 MB): removes the stale staging
    # directory, equals the local engine
    p = rebuild_cli(store, conf, "--conf", "spark.driver.memory=512m", "--conf", "spark.ui.enabled=false")
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err.decode()[-3000:]
    assert b'"messages":50000' in out
    assert not list(store.glob(".rebuild-*"))
    rebuild_store(local, cfg)
    assert tree_files(store, "consumequeue") == tree_files(local, "consumequeue")
    assert index_parts(store) == index_parts(local)
    with MessageStore.open(store, cfg, start_services=False) as st:
        assert st.recovery_report.redispatched_messages == 0
        assert [m.body for m in st.find_messages_by_key("RB", "k777")] == [b"RB-777" * 3]


def test_staging_recovery(tmp_path):
    store = tmp_path / "s"
    (store / "consumequeue" / "T" / "0").mkdir(parents=True)
    (store / "consumequeue" / "T" / "0" / "old").write_text("old")
    (store / "index").mkdir()
    # a rebuild killed before its swap: removed, the store untouched
    dead = store / ".rebuild-1"
    (dead / "consumequeue").mkdir(parents=True)
    (dead / "consumequeue" / "new").write_text("new")
    assert staging.recover_stale(store) == [".rebuild-1: removed (its rebuild did not finish)"]
    assert not dead.exists() and (store / "consumequeue" / "T" / "0" / "old").read_text() == "old"
    # one killed during its swap (consumequeue swapped, index not yet): the swap is completed
    (dead / "index").mkdir(parents=True)
    (dead / "index" / "20260101000000000").write_text("new index")
    (dead / staging.MARKER).write_text("")
    os.rename(store / "consumequeue", dead / "old-consumequeue")
    (store / "consumequeue").mkdir()
    (store / "consumequeue" / "new").write_text("new")
    assert staging.recover_stale(store) == [".rebuild-1: completed its swap"]
    assert not dead.exists()
    assert os.listdir(store / "consumequeue") == ["new"]
    assert os.listdir(store / "index") == ["20260101000000000"]
