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

from conftest import SPARK_JVM_OPTIONS, local_spark

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

import pyarrow as pa  # noqa: E402

from rmqstore.store.format import codec
from rmqstore.store.conf.config import StoreConfig
from rmqstore.store.reads.reader import CommitLogReader
from rmqstore.store.store import MessageStore

pytestmark = pytest.mark.spark

CONF = "mapedFileSizeCommitLog=33554432\nmapedFileSizeConsumeQueue=600000\ndefaultTopicQueueNums=4\n"

# A plain session, as a user's script makes it, run by this interpreter with no PYSPARK_PYTHON and a `python3`
# first on its PATH that cannot be a Python worker (start_killed_writer): register() must give the source's
# workers the driver's interpreter, as `.venv/bin/python script.py` needs. It runs one write per (store, conf)
# pair of its arguments, side by side in threads (Spark runs jobs of several threads at once)
DRIVER = r'''
import os, sys, threading
from pyspark.sql import SparkSession
from rmqstore.spark import register
n, write_id, JVM_OPTIONS, pairs = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
s = (SparkSession.builder.master("local[2]").appName("killed-writer").config("spark.ui.enabled", "false")
     .config("spark.ui.showConsoleProgress", "false")
     .config("spark.driver.extraJavaOptions", JVM_OPTIONS).getOrCreate())
s.sparkContext.setLogLevel("ERROR")
register(s)
df = s.range(n, numPartitions=4).selectExpr("concat('K', cast(id % 3 as string)) as topic",
                                          "cast(concat('body-', cast(id as string)) as binary) as body",
                                          "map('seq', cast(id as string)) as properties")
def write(store, conf):
    # Spark 4.3 looks a Python data source's name up in the JVM thread's active session, which a Python
    # thread's JVM thread lacks (DATA_SOURCE_NOT_FOUND otherwise; README: writing from threads)
    s._jvm.SparkSession.setActiveSession(s._jsparkSession)
    try:
        df.write.format("rocketmq").mode("append").option("config", conf).option("writeId", write_id).save(store)
    except BaseException:       # the other write may sleep at its gate: end the child, the test fails at once
        import traceback
        traceback.print_exc()
        os._exit(1)
writers = [threading.Thread(target=write, args=(pairs[i], pairs[i + 1])) for i in range(0, len(pairs), 2)]
for t in writers:
    t.start()
for t in writers:
    t.join()
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


GATE_DIR = Path(__file__).resolve().parents[1] / "spark_kill_gate"
KILLED_CHUNK = 512          # the killed writer's chunks (transaction.CHUNK is 4096): the same cuts, fewer rows


def start_killed_writer(stores: dict, n: int, write_id: str) -> tuple:
    """Start DRIVER in a child process writing n rows to each store of stores ({phase: (store, conf)}), each
    write stopping in the middle of its phase of the two-phase append (see kill_writer); returns (process,
    {phase: gate file})."""
    src = Path(__file__).resolve().parents[2] / "src"
    top = next(iter(stores.values()))[0].parent.parent
    gates = {phase: store.parent / f"gate-{phase}" for phase, (store, _) in stores.items()}
    fake = top / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "python3").write_text("#!/bin/sh\necho 'not a Python for Spark workers' >&2\nexit 3\n")
    (fake / "python3").chmod(0o755)
    spec = ";".join(f"{phase}:{gates[phase]}:{store}" for phase, (store, _) in stores.items())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), str(GATE_DIR)]),
               RMQSTORE_TEST_GATE=spec, RMQSTORE_TEST_CHUNK=str(KILLED_CHUNK),
               PATH=f"{fake}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("PYSPARK_PYTHON", None)
    pairs = [str(x) for store, conf in stores.values() for x in (store, conf)]
    p = subprocess.Popen([sys.executable, "-c", DRIVER, str(n), write_id, SPARK_JVM_OPTIONS, *pairs], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    return p, gates


def kill_writer(p, gates: dict, stores: dict) -> dict:
    """SIGKILL a start_killed_writer child once every write is in the middle of its phase; returns {phase: how
    many records of that phase its write had written}. The child's Python processes load
    spark_kill_gate/sitecustomize.py, which stops each append in its phase after one and a half chunks
    (KILLED_CHUNK rows each) until the kill: so the kill lands mid-phase on any machine, however fast
    (no race with a poll loop), and n needs only be more than two chunks."""
    try:
        deadline = time.time() + 300
        while time.time() < deadline and p.poll() is None and not all(g.exists() for g in gates.values()):
            time.sleep(0.02)
        assert p.poll() is None, "the writer finished before it could be killed"
        assert all(g.exists() for g in gates.values()), "a write did not reach the phase to kill in"
        for phase, (store, _) in stores.items():
            assert tx_state(store) == phase and has_records(store)
        os.kill(p.pid, signal.SIGKILL)        # the driver process only
        p.wait(60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    deadline = time.time() + 60               # its JVM notices and exits, ending the workers that append
    from rmqstore.errors import StoreLockedError
    written = {}
    for phase, (store, conf) in stores.items():
        while phase not in written:
            try:
                MessageStore.open(store, StoreConfig.load(conf), start_services=False).close()
                written[phase] = int(gates[phase].read_text())
            except StoreLockedError:
                assert time.time() < deadline
                time.sleep(0.2)
    return written


def test_killed_writes_are_all_or_none_and_reruns_are_exactly_once(spark, tmp_path):
    """Two writes whose driver is SIGKILLed, one in each phase of its two-phase append: one child driver
    (with its own JVM, whose start is most of the test's time) runs both side by side, each stopped in the
    middle of its phase, then is killed once."""
    from rmqstore.spark import recover_writes
    # more than two chunks: the kill lands after one and a half chunks of the phase (kill_writer), so
    # each phase is cut inside a chunk with whole chunks before and after, and the rollback spans 2 chunks
    n = 2 * KILLED_CHUNK + 226
    stores = {}
    for phase in ("PREPARING", "COMMITTING"):
        d = tmp_path / phase
        d.mkdir()
        (d / "store.conf").write_text(CONF)
        stores[phase] = (d / "store", d / "store.conf")
    p, gates = start_killed_writer(stores, n, "job-1")
    written = kill_writer(p, gates, stores)
    for phase, (store, conf) in stores.items():
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
    run_batches(start(), 2)
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
    run_batches(q, 2)                               # the replayed batch and a new one
    assert min(p["batchId"] for p in q.recentProgress) == sink_batch     # replayed
    seqs = committed_seqs(store)
    assert len(seqs) > len(first)
    assert seqs == list(range(len(seqs))), "no duplicates, nothing missing"
    assert visible(store, cfg, ["R"]) == len(seqs)


def test_committed_write_id_is_skipped_before_any_message_is_built(tmp_path):
    """two_phase_append: a write whose writeId (or a sink batch that) is committed is skipped before its
    messages are made (a re-run of a 1M-row job costs no Message objects); the others are built and put."""
    from rmqstore.store.format.message import Message
    from rmqstore.spark.transaction import two_phase_append

    def never():
        raise AssertionError("the messages of a committed write were built")
    with MessageStore.open(tmp_path / "s", StoreConfig(), start_services=False) as store:
        got = two_phase_append(store, lambda: [[Message("T", b"a"), Message("T", b"b")]], write_id="w1")
        assert got["messages"] == 2 and got["skipped"] is None
        assert two_phase_append(store, never, write_id="w1")["skipped"] == "writeId w1 is committed already"
        assert two_phase_append(store, [[Message("T", b"c")]], sink=("q", 0))["messages"] == 1
        assert "batch 0 of sink q" in two_phase_append(store, never, sink=("q", 0))["skipped"]


def _encoded(partition: int, columns: dict):
    """A writer task's commit message for rows given as columns (normalize: the executors' part)."""
    import io
    import pyarrow as pa
    from rmqstore.spark.writer import NORMAL, EncodedRows, normalize
    nb = normalize(pa.RecordBatch.from_pydict(columns), 4 << 20, 1_700_000_000_000)
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, NORMAL) as w:
        w.write_batch(nb)
    return EncodedRows(partition, 0, nb.num_rows, sink.getvalue())


def test_writer_keeps_each_queues_order_and_every_field_across_topics_and_chunks(tmp_path):
    """The driver's part of a write (to_chunks + two_phase_append): rows of interleaved topics over more than
    a chunk, null queue ids round robin, rows whose properties differ in names (a chunk of Messages) beside
    uniform ones (a MessageBatch: the columnar path). Each queue holds its rows in order, and every field
    reads back as it was given, through the half and its commit record."""
    import pyarrow as pa
    from rmqstore.spark.transaction import CHUNK, two_phase_append
    from rmqstore.spark.writer import to_chunks
    from rmqstore.store.format.message_batch import MessageBatch
    n = 2 * CHUNK + 2000            # topics A and B: more than a chunk each; C: less, with other property names
    topics = [("A", "B", "C")[i % 3 if i < n // 2 else i % 2] for i in range(n)]
    rows = {"topic": topics, "body": [b"%d" % i for i in range(n)],
            "queueId": pa.array([None if i % 5 == 0 else i % 2 for i in range(n)], pa.int32()),
            "tags": [f"t{i % 7}" for i in range(n)], "keys": [f"k{i} x{i}" for i in range(n)],
            # topic C: one row with another property name, so its chunk is Messages
            "properties": [[("seq", str(i))] + ([("odd", "1")] if i == 3 * 7 + 2 else []) for i in range(n)],
            "bornTimestamp": [1_700_000_000_000 + i for i in range(n)]}
    enc = [_encoded(0, {k: v[:n // 3] for k, v in rows.items()}),
           _encoded(1, {k: v[n // 3:] for k, v in rows.items()})]
    want_q: list = []
    rr = {t: 0 for t in "ABC"}
    for i in range(n):                           # null queue ids: each topic's queues round robin, in row order
        q = rows["queueId"][i].as_py()
        if q is None:
            q, rr[topics[i]] = rr[topics[i]] % 4, rr[topics[i]] + 1
        want_q.append(q)
    with MessageStore.open(tmp_path / "s", StoreConfig(), start_services=False) as store:
        chunks = to_chunks(enc, {}, 4)
        a, b, c = (topics.count(t) for t in "ABC")
        assert CHUNK < a < 2 * CHUNK and CHUNK < b < 2 * CHUNK and c < CHUNK
        assert [(type(c) is MessageBatch, len(c)) for c in chunks] == \
            [(True, CHUNK), (True, a - CHUNK), (True, CHUNK), (True, b - CHUNK), (False, c)]
        assert two_phase_append(store, chunks)["messages"] == n
        assert store.wait_dispatched()
        for topic in "ABC":
            for q in range(4):
                want = [i for i in range(n) if topics[i] == topic and want_q[i] == q]
                got: list = []
                while True:                      # a get answers at most 32 messages
                    more = store.get_message("g", topic, q, len(got), 32).messages
                    if not more:
                        break
                    got += more
                assert [m.body for m in got] == [b"%d" % i for i in want]
                for i, m in zip(want, got):
                    assert (m.tags, m.keys, m.born_timestamp, m.properties["seq"]) == \
                        (f"t{i % 7}", [f"k{i}", f"x{i}"], 1_700_000_000_000 + i, str(i))
                    assert ("odd" in m.properties) == (i == 3 * 7 + 2)
                    assert m.sys_flag & codec.TRANSACTION_TYPE_MASK == codec.TRANSACTION_COMMIT_TYPE


def test_properties_built_with_arrow_equal_the_row_by_row_rule():
    """normalize's properties column (Arrow kernels) is exactly the row-by-row build, and refuses what it
    refuses with the same message, over tags, keys (lists and space-separated strings) and property maps
    with nulls, empty values, duplicate names and names that the tags / keys columns replace."""
    import random
    import pyarrow as pa
    from rmqstore.spark.writer import WriteError, _properties, _properties_by_row
    rnd = random.Random(7)
    words = ["", " ", "a", "b c", "k1", "ü", "x  y", None]
    listed = ["a", "k1", "ü"]           # a key in an array that is null, empty or holds a space is refused (below)
    names = ["seq", "a", "TAGS", "KEYS", "zz", "UNIQ_KEY"]
    mtype = pa.map_(pa.string(), pa.string())
    for case in range(300):
        n = rnd.randint(1, 12)
        cols = {}
        if rnd.random() < 0.7:
            cols["tags"] = pa.array([rnd.choice(["", "t", "tag b", None]) for _ in range(n)], pa.string())
        if rnd.random() < 0.4:
            cols["keys"] = pa.array([None if rnd.random() < 0.2 else
                                     [rnd.choice(listed) for _ in range(rnd.randint(0, 3))] for _ in range(n)],
                                    pa.list_(pa.string()))
        elif rnd.random() < 0.5:
            cols["keys"] = pa.array([rnd.choice(words) for _ in range(n)], pa.string())
        if rnd.random() < 0.8:
            once = case % 3 != 0            # a third of the cases may name a property twice
            cols["properties"] = pa.array(
                [None if rnd.random() < 0.1 else
                 [(nm, rnd.choice(["1", "", "v w", None])) for nm in
                  (rnd.sample(names, rnd.randint(0, 4)) if once else rnd.choices(names, k=rnd.randint(0, 3)))]
                 for _ in range(n)], mtype)
        batch = pa.RecordBatch.from_pydict(cols) if cols else pa.RecordBatch.from_pydict({"x": [0] * n})
        assert _properties(batch, n).to_pylist() == _properties_by_row(batch, n).to_pylist(), (case, cols)
    for bad in ([("a\x01", "1")], [("a", "x\x02")], [("", "1")], [("a", "x" * 40000)]):
        batch = pa.RecordBatch.from_pydict({"properties": pa.array([[("ok", "1")], bad], mtype)})
        with pytest.raises(WriteError) as fast:
            _properties(batch, 2)
        with pytest.raises(WriteError) as slow:
            _properties_by_row(batch, 2)
        assert str(fast.value) == str(slow.value) and "row 1" in str(fast.value)
    batch = pa.RecordBatch.from_pydict({"tags": pa.array(["t", "x\x01"])})
    with pytest.raises(WriteError, match="row 1"):
        _properties(batch, 2)
    for key in ("order 1", " "):      # one key of an array would be stored as other keys: refused, named
        batch = pa.RecordBatch.from_pydict({"keys": pa.array([["k"], ["a", key]], pa.list_(pa.string()))})
        with pytest.raises(WriteError, match="row 1: key .* holds a space"):
            _properties(batch, 2)
    for key, what in (("", "an empty key"), (None, "a null key")):    # no key at all: refused, not dropped
        batch = pa.RecordBatch.from_pydict({"keys": pa.array([["k"], None, [], ["a", key]], pa.list_(pa.string())),
                                            "tags": ["t", "u", "v", "w"]})
        with pytest.raises(WriteError) as fast:
            _properties(batch, 4)
        with pytest.raises(WriteError) as slow:
            _properties_by_row(batch, 4)
        assert str(fast.value) == str(slow.value) and str(fast.value).startswith(f"row 3: {what} in column 'keys'")
    for col, value in (("tags", pa.array(["t", "t\x02X\x01evil"])),          # replacing the map's TAGS / KEYS
                       ("keys", pa.array([["k"], ["k\x01"]], pa.list_(pa.string())))):
        name = "TAGS" if col == "tags" else "KEYS"
        batch = pa.RecordBatch.from_pydict({col: value, "properties": pa.array([[(name, "m")]] * 2, mtype)})
        with pytest.raises(WriteError, match="row 1: property"):
            _properties(batch, 2)


def test_refused_rows_are_named_by_their_index_across_a_tasks_batches():
    """encode_task counts the rows of earlier batches: outside a Spark task the index is over all the batches
    given (and says so); normalize of one batch names the batch's row. Every check that refuses a row names it."""
    from rmqstore.spark.writer import RowError, WriteError, encode_task, normalize
    good = pa.RecordBatch.from_pydict({"topic": ["T"] * 3, "body": [b"x"] * 3})
    for column, value, what in (("topic", None, "column 'topic' is null"),
                                ("topic", "a" * 200, "column 'topic': 'aaa"),
                                ("topic", "a/b", "column 'topic': topic 'a/b' contains"),
                                ("body", None, "column 'body' is null"),
                                ("queueId", -2, "column 'queueId' has a negative queue id -2"),
                                ("queueId", 1 << 20, "column 'queueId' has queue id 1048576, above"),
                                ("bornHost", "nohost", "column 'bornHost': ")):
        cols = {"topic": ["T"] * 3, "body": [b"x"] * 3, "queueId": [1, 2, 3], "bornHost": ["1.2.3.4:5"] * 3}
        cols[column] = cols[column][:2] + [value]         # the third row is bad
        cols["queueId"] = pa.array(cols["queueId"], pa.int32())
        bad = pa.RecordBatch.from_pydict(cols)
        with pytest.raises(RowError) as e:
            normalize(bad, 4 << 20, 0)
        assert str(e.value).startswith(f"row 2: {what}") and e.value.row == 2, (column, str(e.value))
        with pytest.raises(WriteError) as e:
            normalize(bad, 4 << 20, 0, partition=3, first_row=20_000)
        assert str(e.value).startswith(f"partition 3, row 20002: {what}"), str(e.value)
        with pytest.raises(WriteError) as e:       # no TaskContext: no partition, the index over the batches
            encode_task(iter([good, good.slice(0, 0), bad]), 4 << 20)
        assert str(e.value).startswith("row 5 (counted from 0 over all the batches given, outside any Spark "
                                       f"task): {what}"), str(e.value)


def test_the_first_refused_row_of_a_batch_is_named_whichever_check_refuses_it():
    """Row 4 has a bad topic (checked first), row 1 a bad bornHost, row 2 a negative queue id: the error names
    row 1, the batch's first bad row, not the first bad row of the first check that fails."""
    from rmqstore.spark.writer import RowError, normalize
    bad = pa.RecordBatch.from_pydict({"topic": ["T", "T", "T", "T", "a/b", "T"], "body": [b"x"] * 6,
                                      "queueId": pa.array([0, 0, -1, 0, 0, 0], pa.int32()),
                                      "bornHost": ["1.2.3.4:5", "nohost", "1.2.3.4:5", "1.2.3.4:5", "1.2.3.4:5",
                                                   "1.2.3.4:5"]})
    with pytest.raises(RowError) as e:
        normalize(bad, 4 << 20, 0, partition=2, first_row=10)
    assert e.value.row == 11 and str(e.value).startswith("partition 2, row 11: column 'bornHost': "), str(e.value)


@pytest.mark.parametrize("keys", [pa.array([[1, 7], [2], None], pa.list_(pa.int32())),
                                  pa.array([[b"k"], [b"j"], None], pa.list_(pa.binary())),
                                  pa.array([1, 2, 3], pa.int64())])
def test_a_keys_column_of_another_type_is_refused_naming_it(keys):
    """keys of array<int>, array<binary> or int: a WriteError naming the column and its type (it was a raw
    TypeError from joining the keys); all-null keys (no keys) stay allowed."""
    from rmqstore.spark.writer import WriteError, normalize
    bad = pa.RecordBatch.from_pydict({"topic": ["T"] * 3, "body": [b"x"] * 3, "keys": keys})
    with pytest.raises(WriteError, match=r"column 'keys' is of type .*array of strings"):
        normalize(bad, 4 << 20, 0)
    none = pa.RecordBatch.from_pydict({"topic": ["T"] * 3, "body": [b"x"] * 3, "keys": pa.nulls(3)})
    assert normalize(none, 4 << 20, 0).num_rows == 3


def _read_queue(store, topic: str, q: int) -> list:
    got: list = []
    while True:
        more = store.get_message("g", topic, q, len(got), 32).messages
        if not more:
            return got
        got += more


def test_commit_records_carry_every_property_of_their_rows(tmp_path):
    """Empty values included, whatever the chunk (a MessageBatch, or Messages when the rows' names differ) and
    whatever an earlier write of the same process put in the property-order cache (found by an outside test:
    an order cached from a row with an empty value dropped that name from every later commit record)."""
    from rmqstore.spark.transaction import two_phase_append
    from rmqstore.spark.writer import to_chunks
    mtype = pa.map_(pa.string(), pa.string())
    writes = [{"topic": ["A", "A", "B", "B"], "body": [b"1", b"2", b"3", b"4"], "queueId": [0, 0, 0, 0],
               "tags": ["", "t", "", "u"],
               "properties": pa.array([[("e", ""), ("a", "1")], [("z", "9")], [("e", "x1"), ("a", "1")],
                                       [("e", "x2"), ("a", "2")]], mtype)},
              {"topic": ["C", "C"], "body": [b"5", b"6"], "queueId": [0, 0], "tags": ["", ""],
               "properties": pa.array([[("e", ""), ("a", "1")], [("e", "x"), ("a", "2")]], mtype)}]
    with MessageStore.open(tmp_path / "s", StoreConfig(), start_services=False) as store:
        for w in writes:
            assert two_phase_append(store, to_chunks([_encoded(0, w)], {}, 4))["messages"] == len(w["body"])
        assert store.wait_dispatched()
        for w in writes:
            for topic in sorted(set(w["topic"])):
                want = [(b, t, dict(p)) for tp, b, t, p in zip(w["topic"], w["body"], w["tags"],
                                                               w["properties"].to_pylist()) if tp == topic]
                got = [(m.body, m.properties.get("TAGS"),
                        {k: v for k, v in m.properties.items() if k not in ("TAGS", "TRAN_MSG", "PGROUP")})
                       for m in _read_queue(store, topic, 0)]
                assert got == want


def test_rows_the_store_would_grow_past_the_limit_are_refused_by_their_task(tmp_path):
    """A row's properties must fit with what the store adds (TRAN_MSG, PGROUP; REAL_TOPIC, REAL_QID with
    DELAY): refused in the task, naming the row, never after the transaction began (found by an outside test:
    the driver failed mid-append, and with DELAY after the commit point, leaving a transaction no write could
    finish). A row just at the limit is appended."""
    from rmqstore.spark.transaction import two_phase_append
    from rmqstore.spark.writer import WriteError, to_chunks
    from rmqstore.store.format.codec import MAX_PROPERTIES_LENGTH
    mtype = pa.map_(pa.string(), pa.string())

    def row(pad: int, delay: bool):
        props = ([("DELAY", "3")] if delay else []) + [("pad", "p" * pad)]
        return {"topic": ["T"], "body": [b"x"], "queueId": [0], "properties": pa.array([props], mtype)}
    fixed = len("pad\x01\x02")
    for delay, extra in ((False, 36), (True, 36 + 27 + 1)):
        room = MAX_PROPERTIES_LENGTH - extra - fixed - (len("DELAY\x013\x02") if delay else 0)
        with pytest.raises(WriteError, match="row 0: properties of"):
            _encoded(0, row(room + 1, delay))
        with MessageStore.open(tmp_path / f"s{delay}", StoreConfig(), start_services=False) as store:
            assert two_phase_append(store, to_chunks([_encoded(0, row(room, delay))], {}, 4))["messages"] == 1
            assert json.loads((tmp_path / f"s{delay}" / "config" / "sparkTransaction.json").read_text())["open"] == {}


def test_a_failed_halves_phase_is_rolled_back_at_once(tmp_path, monkeypatch):
    """A write failing before its commit point rolls its halves back before raising (not at the next write)."""
    from rmqstore.store.format.message import Message
    from rmqstore.spark import transaction as T
    put_all, calls = T._put_all, []

    def failing(store, msgs, what, delay_rewrite):
        calls.append(what)
        if what == "appending half messages" and calls.count(what) == 2:
            raise OSError(28, "No space left on device")
        return put_all(store, msgs, what, delay_rewrite)
    monkeypatch.setattr(T, "_put_all", failing)
    with MessageStore.open(tmp_path / "s", StoreConfig(), start_services=False) as store:
        with pytest.raises(OSError, match="No space"):
            T.two_phase_append(store, [[Message("T", b"a")], [Message("U", b"b")]])
        assert json.loads((tmp_path / "s" / "config" / "sparkTransaction.json").read_text())["open"] == {}
    kinds = [m.sys_flag & codec.TRANSACTION_TYPE_MASK for m in CommitLogReader(tmp_path / "s").messages()]
    assert kinds == [codec.TRANSACTION_PREPARED_TYPE, codec.TRANSACTION_ROLLBACK_TYPE]


def test_tasks_stage_their_rows_in_the_store_and_the_driver_checks_them(tmp_path):
    """A task that sees the write's staging directory writes its rows there (not into its commit message,
    which the driver's JVM would hold: OutOfMemoryError with Spark's default driver, found by `make bench`);
    the driver reads them mapped, and a staged file it cannot see, or whose size differs, is an error naming
    it, not rows missing."""
    from rmqstore.spark import handoff
    from rmqstore.spark.transaction import two_phase_append
    from rmqstore.spark.writer import check_target, encode_task, to_chunks
    store = tmp_path / "s"
    stage, made = handoff.make_stage(str(store))
    assert made and os.path.isdir(stage)
    batch = pa.RecordBatch.from_pydict({"topic": ["T"] * 50, "body": [b"%d" % i for i in range(50)]})
    m = encode_task(iter([batch]), 4 << 20, stage)
    assert m.payload == b"" and m.staged and m.size == os.path.getsize(os.path.join(stage, m.staged))
    with MessageStore.open(store, StoreConfig(), start_services=False) as st:
        assert two_phase_append(st, to_chunks([m], {}, 4, stage))["messages"] == 50
    elsewhere = encode_task(iter([batch]), 4 << 20, str(tmp_path / "not-seen"))   # an executor elsewhere
    assert elsewhere.staged is None and len(elsewhere.payload) > 0
    with open(os.path.join(stage, m.staged), "ab") as f:
        f.write(b"x")
    with pytest.raises(handoff.StagingError, match=f"partition 0 .*{m.staged}"):
        to_chunks([m], {}, 4, stage)
    handoff.remove_stage(stage, str(store), made)
    assert not os.path.exists(stage) and store.is_dir()     # the store stays: the write appended
    with pytest.raises(handoff.StagingError, match="missing"):
        to_chunks([m], {}, 4, stage)
    dead, _ = handoff.make_stage(str(tmp_path / "new"))      # a write whose driver was killed left only this:
    check_target({"path": str(tmp_path / "new")}, False)     # the path still takes a write


def test_staging_on_a_full_disk_is_an_error_naming_the_file(tmp_path):
    """A task whose staged rows do not fit (a real 1 MB filesystem) fails with an error naming the file."""
    from rmqstore.spark import handoff
    from rmqstore.spark.writer import WriteError, encode_task
    from store_checks import small_filesystem
    with small_filesystem(tmp_path / "fs", 1):
        stage, _ = handoff.make_stage(str(tmp_path / "fs" / "store"))
        batch = pa.RecordBatch.from_pydict({"topic": ["T"] * 3000, "body": [b"x" * 1000] * 3000})
        with pytest.raises(WriteError, match=f"partition 0: writing its staged rows to {stage}/part-.*No space"):
            encode_task(iter([batch]), 4 << 20, stage)


# --- errors name the Spark partition and the row's index in it; empty / null keys of an array are refused ----
def _write_fails(spark, df, store: Path) -> str:
    """The message of the write of df to store that must fail (Spark wraps the task's WriteError)."""
    with pytest.raises(Exception) as e:
        df.write.format("rocketmq").mode("append").save(str(store))
    return str(e.value)


BAD_ROW = 3_500     # spark.range(4_000, numPartitions=2): partition 1 holds ids 2,000.., so this is its row 1,500
BAD_ROWS = {        # a column whose value at BAD_ROW breaks a rule, and the message's text after the place
    "key with a space":
        ("keys", "case when id = {b} then array('k', 'a b') else array(concat('k', cast(id as string))) end",
         "key 'a b' of column 'keys' holds a space"),
    "property over the limit with the store's TRAN_MSG and PGROUP":     # checked in normalize (Arrow kernels)
        ("properties", "case when id = {b} then map('pad', repeat('p', 32760)) "
                       "else map('seq', cast(id as string)) end",
         "properties of 32765 bytes exceed 32767"),
    "bad bornHost": ("bornHost", "case when id = {b} then 'nohost' else '10.0.0.1:9' end", "column 'bornHost'"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_a_refused_row_is_named_by_its_partition_and_its_index_in_it(spark, tmp_path, case):
    """A partition of more rows than an Arrow batch (spark.sql.execution.arrow.maxRecordsPerBatch, 1,000 here,
    10,000 by default): the refused row is named by its Spark partition and its index in that partition, rows
    of the partition's earlier batches counted (found by an outside test: its index in its Arrow batch was
    given, "row 5000" of 10,000-row batches)."""
    column, expr, what = BAD_ROWS[case]
    df = spark.range(4_000, numPartitions=2).selectExpr(
        "'T' as topic", "cast(cast(id as string) as binary) as body", f"{expr.format(b=BAD_ROW)} as {column}")
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key, None)
    spark.conf.set(key, "1000")             # so the bad row is in the partition's second batch
    try:
        msg = _write_fails(spark, df, tmp_path / "s")
    finally:
        spark.conf.set(key, before) if before is not None else spark.conf.unset(key)
    assert f"partition 1, row 1500: {what}" in msg, msg[-2000:]
    assert "row 500:" not in msg
    assert not (tmp_path / "s").exists()        # the aborted write removed the store it made


def test_empty_or_null_keys_in_an_array_are_refused_and_nothing_is_appended(spark, tmp_path):
    """RocketMQ has no empty key (KEYS is a space-separated string): an empty or null element of an array
    `keys` is refused naming its partition and row, as a key holding a space is, and the write appends
    nothing. No keys (a null or empty array, a null, empty or blank string) is allowed; a string of keys is
    RocketMQ's KEYS value, split at spaces, its empty words (runs of spaces) no key, as the store reads it."""
    store, topics = tmp_path / "s", ["T", "U"]
    cfg = StoreConfig()
    good = spark.createDataFrame(
        [("T", b"0", ["k0", "x0"]), ("T", b"1", None), ("T", b"2", []), ("T", b"3", ["k3"])],
        "topic string, body binary, keys array<string>")
    good.write.format("rocketmq").mode("append").save(str(store))
    spaced = spark.createDataFrame([("U", b"4", " a  b "), ("U", b"5", None), ("U", b"6", ""), ("U", b"7", "  ")],
                                   "topic string, body binary, keys string")
    spaced.write.format("rocketmq").mode("append").save(str(store))
    with MessageStore.open(store, cfg, start_services=False) as st:
        got = {m.body: (m.keys, m.properties.get("KEYS")) for t in topics for q in range(4)
               for m in _read_queue(st, t, q)}
    assert got == {b"0": (["k0", "x0"], "k0 x0"), b"1": ([], None), b"2": ([], None), b"3": (["k3"], "k3"),
                   b"4": (["a", "b"], "a b"), b"5": ([], None), b"6": ([], None), b"7": ([], None)}
    count = visible(store, cfg, topics)
    assert count == 8
    for element, what in (("''", "an empty key"), ("cast(null as string)", "a null key")):
        df = spark.range(40, numPartitions=2).selectExpr(
            "'T' as topic", "cast(cast(id as string) as binary) as body",
            f"case when id = 33 then array('k', {element}) else array(concat('k', cast(id as string))) end as keys")
        msg = _write_fails(spark, df, store)
        assert f"partition 1, row 13: {what} in column 'keys'" in msg, msg[-2000:]
        assert visible(store, cfg, topics) == count       # nothing appended
