"""The Spark writers' exactly-once: a batch write whose driver is SIGKILLed leaves all or none of its rows
(a re-run with the same writeId gives exactly one copy), and the streaming sink appends each micro-batch
once across a restart that replays a batch (one local SparkSession for the module; the killed drivers
are child processes with their own)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import local_spark

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from rmqstore.store import codec
from rmqstore.store.config import StoreConfig
from rmqstore.store.reader import CommitLogReader
from rmqstore.store.store import MessageStore

pytestmark = pytest.mark.spark

CONF = "mapedFileSizeCommitLog=33554432\nmapedFileSizeConsumeQueue=600000\ndefaultTopicQueueNums=4\n"

# for a JVM that lives one small job: C1 only and one GC thread halve its CPU time (measured: about 30 s
# -> 15 s of JVM CPU for session start plus this write); the code under test is Python
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

# A plain session, as a user's script makes it, run by this interpreter with no PYSPARK_PYTHON and a `python3`
# first on its PATH that cannot be a Python worker (start_killed_writer): register() must give the source's
# workers the driver's interpreter, as `.venv/bin/python script.py` needs
DRIVER = r'''
import os, sys
from pyspark.sql import SparkSession
from rmqstore.spark import register
store, conf, n, write_id, JVM_OPTIONS = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
s = (SparkSession.builder.master("local[2]").appName("killed-writer").config("spark.ui.enabled", "false")
     .config("spark.ui.showConsoleProgress", "false")
     .config("spark.driver.extraJavaOptions", JVM_OPTIONS).getOrCreate())
s.sparkContext.setLogLevel("ERROR")
register(s)
df = s.range(n, numPartitions=4).selectExpr("concat('K', cast(id % 3 as string)) as topic",
                                          "cast(concat('body-', cast(id as string)) as binary) as body",
                                          "map('seq', cast(id as string)) as properties")
df.write.format("rocketmq").mode("append").option("config", conf).option("writeId", write_id).save(store)
print("WRITTEN", flush=True)
'''


@pytest.fixture(scope="module")
def spark():
    return local_spark("rmqstore-test-write", **{"spark.sql.streaming.pollingDelay": "100ms"})


def visible(store: Path, cfg: StoreConfig, topics) -> int:
    """Messages consumers see (consume queue units), after the recovery MessageStore.open does."""
    with MessageStore.open(store, cfg, start_services=False) as st:
        return sum(st.get_max_offset_in_queue(t, q) for t in topics for q in range(cfg.default_topic_queue_nums))


def committed_seqs(store: Path) -> list[int]:
    """The seq property of every commit record (what the consume queues point at), sorted."""
    with CommitLogReader(store) as r:
        return sorted(int(m.properties["seq"]) for m in r.messages()
                      if m.sys_flag & codec.TRANSACTION_TYPE_MASK == codec.TRANSACTION_COMMIT_TYPE)


def commit_records(store: Path) -> tuple[list[int], list[int]]:
    """(committed_seqs(store), the transaction type of every record), from one read of the commitlog."""
    kinds, seqs = [], []
    with CommitLogReader(store) as r:
        for m in r.messages():
            k = m.sys_flag & codec.TRANSACTION_TYPE_MASK
            kinds.append(k)
            if k == codec.TRANSACTION_COMMIT_TYPE:
                seqs.append(int(m.properties["seq"]))
    return sorted(seqs), kinds


def tx_state(store: Path) -> str | None:
    p = store / "config" / "sparkTransaction.json"
    try:
        opened = json.loads(p.read_text()).get("open") or {}
    except (OSError, ValueError):
        return None
    return next(iter(opened.values()))["state"] if opened else "NONE"


def has_records(store: Path) -> bool:
    first = store / "commitlog" / ("0" * 20)
    try:
        with open(first, "rb") as f:
            return f.read(4) != b"\0\0\0\0"
    except OSError:
        return False


GATE_DIR = Path(__file__).resolve().parent / "spark_kill_gate"


def start_killed_writer(store: Path, conf: Path, n: int, write_id: str, kill_in: str) -> tuple:
    """Start DRIVER in a child process that stops in the middle of phase kill_in of its two-phase append
    (see kill_writer); returns (process, gate file)."""
    src = Path(__file__).resolve().parent.parent / "src"
    gate = store.parent / f"gate-{kill_in}"
    fake = store.parent / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "python3").write_text("#!/bin/sh\necho 'not a Python for Spark workers' >&2\nexit 3\n")
    (fake / "python3").chmod(0o755)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), str(GATE_DIR)]),
               RMQSTORE_TEST_GATE=f"{kill_in}:{gate}", PATH=f"{fake}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("PYSPARK_PYTHON", None)
    p = subprocess.Popen([sys.executable, "-c", DRIVER, str(store), str(conf), str(n), write_id, JVM_OPTIONS], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    return p, gate


def kill_writer(p, gate: Path, store: Path, conf: Path, kill_in: str) -> int:
    """SIGKILL a start_killed_writer child in the middle of phase kill_in; returns how many records of that
    phase it had written. The child's Python processes load spark_kill_gate/sitecustomize.py, which stops
    the append in that phase after one and a half chunks (transaction.CHUNK rows each) until the kill: so
    the kill lands mid-phase on any machine, however fast (no race with a poll loop), and n needs only be
    more than two chunks."""
    try:
        deadline = time.time() + 300
        while time.time() < deadline and p.poll() is None and not gate.exists():
            time.sleep(0.02)
        assert p.poll() is None, "the writer finished before it could be killed"
        assert gate.exists(), "the writer did not reach the phase to kill in"
        assert tx_state(store) == kill_in and has_records(store)
        os.kill(p.pid, signal.SIGKILL)        # the driver process only
        p.wait(60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    deadline = time.time() + 60               # its JVM notices and exits, ending the worker that appends
    from rmqstore.errors import StoreLockedError
    while True:
        try:
            MessageStore.open(store, StoreConfig.load(conf), start_services=False).close()
            return int(gate.read_text())
        except StoreLockedError:
            assert time.time() < deadline
            time.sleep(0.2)


def test_killed_writes_are_all_or_none_and_reruns_are_exactly_once(spark, tmp_path):
    """Two drivers SIGKILLed, one in each phase of its append (both run at once: each is a child with its
    own JVM, whose start is most of the test's time)."""
    from rmqstore.spark import recover_writes
    from rmqstore.spark.transaction import CHUNK
    # more than two chunks: the kill lands after one and a half chunks of the phase (kill_writer), so
    # each phase is cut inside a chunk with whole chunks before and after, and the rollback spans 2 chunks
    n = 2 * CHUNK + 1808
    runs = {}
    try:
        for phase in ("PREPARING", "COMMITTING"):
            d = tmp_path / phase
            d.mkdir()
            (d / "store.conf").write_text(CONF)
            runs[phase] = (d / "store", d / "store.conf", *start_killed_writer(d / "store", d / "store.conf", n,
                                                                             "job-1", phase))
        written = {ph: kill_writer(p, gate, store, conf, ph) for ph, (store, conf, p, gate) in runs.items()}
    finally:
        for _, _, p, _ in runs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    for phase, (store, conf, _, _) in runs.items():
        _after_the_kill(spark, store, conf, n, phase, written[phase], recover_writes)


def _after_the_kill(spark, store: Path, conf: Path, n: int, phase: str, written: int, recover_writes) -> None:
    cfg = StoreConfig.load(conf)
    topics = ["K0", "K1", "K2"]
    assert 0 < written < n, phase
    if phase == "PREPARING":
        assert visible(store, cfg, topics) == 0          # only halves: nothing visible, before any repair
    got = recover_writes(store, cfg)                     # what the next write does first
    assert [("rolledBack" if phase == "PREPARING" else "committed") in g for g in got] == [True]
    assert got[0].get("rolledBack", got[0].get("committed")) == (written if phase == "PREPARING" else n - written)
    assert tx_state(store) == "NONE"
    expect = 0 if phase == "PREPARING" else n
    assert visible(store, cfg, topics) == expect
    assert committed_seqs(store) == list(range(expect))
    # the re-run (same writeId): appends the rows when the first run did not commit, else nothing
    df = spark.range(n, numPartitions=4).selectExpr(
        "concat('K', cast(id % 3 as string)) as topic", "cast(concat('body-', cast(id as string)) as binary) as body",
        "map('seq', cast(id as string)) as properties")
    df.write.format("rocketmq").mode("append").option("config", str(conf)).option("writeId", "job-1").save(str(store))
    assert visible(store, cfg, topics) == n
    seqs, kinds = commit_records(store)                  # one read of the commitlog for both checks
    assert seqs == list(range(n))
    # every half ended: a commit or a rollback record
    assert kinds.count(codec.TRANSACTION_PREPARED_TYPE) == kinds.count(codec.TRANSACTION_COMMIT_TYPE) \
        + kinds.count(codec.TRANSACTION_ROLLBACK_TYPE)


def test_stream_sink_exactly_once_across_replayed_batch(spark, tmp_path):
    store, ckpt, conf = tmp_path / "sink", tmp_path / "ckpt", tmp_path / "sink.conf"
    conf.write_text(CONF)
    cfg = StoreConfig.load(conf)

    def start():
        df = (spark.readStream.format("rate").option("rowsPerSecond", "400").option("numPartitions", "2").load()
              .selectExpr("'R' as topic", "cast(cast(value as string) as binary) as body",
                          "map('seq', cast(value as string)) as properties"))
        return (df.writeStream.format("rocketmq").option("config", str(conf)).option("checkpointLocation", str(ckpt))
                .trigger(processingTime="300 milliseconds").start(str(store)))

    def run_batches(q, k: int):
        deadline = time.time() + 180
        while time.time() < deadline and sum(1 for p in q.recentProgress if p["numInputRows"]) < k:
            assert q.exception() is None, q.exception()
            time.sleep(0.2)
        q.stop()
        assert q.exception() is None
    run_batches(start(), 3)
    first = committed_seqs(store)
    assert first and first == list(range(len(first)))
    # Spark crashed after the sink committed its last batch but before it recorded that in the checkpoint:
    # the batch is replayed on restart (same offsets), and the store must not take it again
    recorded = json.loads((store / "config" / "sparkTransaction.json").read_text())["sinks"]
    (sink_batch,) = recorded.values()

    def batch_files(sub: str) -> dict[int, Path]:
        return {int(p.name): p for p in (ckpt / sub).iterdir() if p.name.isdigit()}
    for b, p in batch_files("offsets").items():    # planned after the last batch the sink took: never written
        if b > sink_batch:
            p.unlink()
            (ckpt / "offsets" / f".{b}.crc").unlink(missing_ok=True)
    commits = batch_files("commits")
    if sink_batch in commits:                       # Spark had recorded it: forget that
        commits[sink_batch].unlink()
        (ckpt / "commits" / f".{sink_batch}.crc").unlink(missing_ok=True)
    q = start()
    run_batches(q, 3)
    assert min(p["batchId"] for p in q.recentProgress) == sink_batch     # replayed
    seqs = committed_seqs(store)
    assert len(seqs) > len(first)
    assert seqs == list(range(len(seqs))), "no duplicates, nothing missing"
    assert visible(store, cfg, ["R"]) == len(seqs)


def test_committed_write_id_is_skipped_before_any_message_is_built(tmp_path):
    """two_phase_append: a write whose writeId (or a sink batch that) is committed is skipped before its
    messages are made (a re-run of a 1M-row job costs no Message objects); the others are built and put."""
    from rmqstore.store.message import Message
    from rmqstore.spark.transaction import two_phase_append

    def never():
        raise AssertionError("the messages of a committed write were built")
    with MessageStore.open(tmp_path / "s", StoreConfig(), start_services=False) as store:
        got = two_phase_append(store, lambda: [Message("T", b"a"), Message("T", b"b")], write_id="w1")
        assert got["messages"] == 2 and got["skipped"] is None
        assert two_phase_append(store, never, write_id="w1")["skipped"] == "writeId w1 is committed already"
        assert two_phase_append(store, [Message("T", b"c")], sink=("q", 0))["messages"] == 1
        assert "batch 0 of sink q" in two_phase_append(store, never, sink=("q", 0))["skipped"]


def test_two_phase_append_keeps_each_queues_order_across_interleaved_topics(tmp_path):
    """The halves go in one topic at a time (the columnar path); each queue still holds its rows in order."""
    from rmqstore.store.message import Message
    from rmqstore.spark.transaction import CHUNK, two_phase_append
    n = CHUNK + 500                              # spans longer than a chunk, and topic boundaries inside one
    msgs = [Message(("A", "B", "C")[i % 3 if i < n // 2 else i % 2], b"%d" % i, queue_id=i % 2) for i in range(n)]
    with MessageStore.open(tmp_path / "s", StoreConfig(), start_services=False) as store:
        assert two_phase_append(store, msgs)["messages"] == n
        assert store.wait_dispatched()
        for topic in "ABC":
            for q in (0, 1):
                want = [m.body for m in msgs if m.topic == topic and m.queue_id == q]
                got: list = []
                while True:                      # a get answers at most 32 messages
                    more = store.get_message("g", topic, q, len(got), 32).messages
                    if not more:
                        break
                    got += [m.body for m in more]
                assert got == want
