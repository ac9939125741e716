"""Stores on a filesystem other than the local one (issue 17, "Beyond one machine"): a store written by
rmqstore, shut down cleanly, uploaded to a real S3-compatible server (moto's, started here on a free port)
and read from s3://... by a plain local[2] SparkSession: the same rows as the local directory, selections,
key lookups, the queues view; a damaged copy is data loss (failOnDataLoss both ways); bad URIs fail in one
line. Then the same reads without Spark: ranged reads split into spans and chunks, what is pickled for
executors, globs over the bucket."""
from __future__ import annotations

import logging
import os
import pickle
import random
import socket
import sys

import numpy as np
import pytest

pytest.importorskip("pyspark")
pafs = pytest.importorskip("pyarrow.fs")
moto_server = pytest.importorskip("moto.server")

from rmqstore import MessageBatch, MessageStore, StoreConfig  # noqa: E402
from rmqstore.spark import skipped_data  # noqa: E402
from rmqstore.spark import options as O  # noqa: E402
from rmqstore.spark import plan, records as R, scan  # noqa: E402
from rmqstore.store.files import store_fs  # noqa: E402
from rmqstore.store.recovery import view as V

from conftest import local_spark  # noqa: E402

pytestmark = pytest.mark.spark

TOPICS = ("TopicA", "TopicB", "TopicC")
PER_TOPIC = 4100          # 1025 per queue: the last consume queue file of each is partly written


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on 127.0.0.1; yields the URI query that points pyarrow at it (the credentials go in
    the URI's user info: executors of a session started earlier do not see this process's environment)."""
    import logging
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = _free_port()
    srv = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    srv.start()
    try:
        yield f"endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
    finally:
        srv.stop()


def _uri(s3: str, prefix: str) -> str:
    return f"s3://test:test@bkt/{prefix}?{s3}"


def _bucket(s3: str):
    fs, _ = pafs.FileSystem.from_uri(f"s3://test:test@bkt/?{s3}&allow_bucket_creation=true")
    return fs


@pytest.fixture(scope="module")
def stores(s3, tmp_path_factory):
    """(local store root, its s3:// URI): 3 topics x 4 queues, 12300 messages of 50-600 B in 1 MiB commitlog
    files, 500-unit consume queue files and small index files, shut down cleanly, uploaded with pyarrow."""
    root = tmp_path_factory.mktemp("remote") / "broker-a" / "store"
    cfg = StoreConfig(mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * 500,
                      max_hash_slot_num=10_000, max_index_num=40_000)     # 840 KB index files, not 420 MB
    rnd = random.Random(17)
    with MessageStore.open(root, cfg) as st:
        for t in TOPICS:
            st.put_messages(MessageBatch(t, [rnd.randbytes(rnd.randrange(50, 600)) for _ in range(PER_TOPIC)],
                                         queue_ids=[i % 4 for i in range(PER_TOPIC)], tags="tg",
                                         keys=[f"{t}-k{i}" for i in range(PER_TOPIC)]))
    assert len(os.listdir(root / "commitlog")) >= 5
    fs = _bucket(s3)
    fs.create_dir("bkt")
    pafs.copy_files(str(root), "bkt/broker-a/store", source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=fs)
    return str(root), _uri(s3, "broker-a/store")


@pytest.fixture(scope="module")
def spark():
    return local_spark("rmqstore-test-remote")


def _load(spark, path, **opts):
    r = spark.read.format("rocketmq")
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load(path)


def _rows(df, keys=("topic", "queueId", "queueOffset")):
    """The DataFrame's rows as an Arrow table in key order (every column)."""
    return df.toArrow().sort_by([(k, "ascending") for k in keys])


def test_s3_copy_reads_as_the_local_store(spark, stores):
    local, uri = stores
    got, expected = _rows(_load(spark, uri)), _rows(_load(spark, local))
    assert got.num_rows == len(TOPICS) * PER_TOPIC
    assert got.equals(expected)              # every column, body included; broker is broker-a for both


def test_s3_selections_keys_and_queues_view(spark, stores):
    local, uri = stores
    for opts in ({"topics": "TopicB", "queueIds": "1,3", "startingOffsets": '{"TopicB": {"1": 200}}'},
                 {"mode": "commitlog"},
                 {"key": "TopicC-k77"},
                 {"view": "queues"}):
        keys = ("topic", "queueId") if "view" in opts else ("topic", "queueId", "queueOffset")
        a, b = _rows(_load(spark, local, **opts), keys), _rows(_load(spark, uri, **opts), keys)
        assert a.num_rows and a.equals(b), opts
    assert _load(spark, uri, key="TopicC-k77").count() == 1
    assert _load(spark, uri, topics="TopicB", queueIds="1,3",
                 startingOffsets='{"TopicB": {"1": 200}}').count() == 2 * PER_TOPIC // 4 - 200


def _flip_body_byte(local: str, s3: str, prefix: str) -> int:
    """Upload a copy of the store with one body byte flipped in its second commitlog file; the commitlog
    offset of the damaged message."""
    fs = _bucket(s3)
    pafs.copy_files(local, f"bkt/{prefix}", source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
    name = sorted(os.listdir(os.path.join(local, "commitlog")))[1]
    buf = np.fromfile(os.path.join(local, "commitlog", name), dtype=np.uint8)
    positions, _, _ = scan.scanner.walk_positions(buf, 0, len(buf))
    recs = R.Records(buf, int(name), positions[10:11], len(buf))
    buf = buf.copy()
    buf[int(recs.body_pos[0])] ^= 0xFF
    with fs.open_output_stream(f"bkt/{prefix}/commitlog/{name}") as out:
        out.write(buf.tobytes())
    return int(name) + int(positions[10])


def test_damaged_s3_copy_is_data_loss(spark, stores, s3):
    local, _ = stores
    offset = _flip_body_byte(local, s3, "damaged/broker-a/store")
    uri = _uri(s3, "damaged/broker-a/store")
    from pyspark.errors import PySparkException
    with pytest.raises(PySparkException) as e:
        _load(spark, uri).count()
    msg = str(e.value)
    assert "s3://bkt/damaged/broker-a/store" in msg and f"commitlog offset {offset}" in msg, msg
    assert "test:test" not in msg                       # credentials never in messages
    before = skipped_data(spark)["messages"]
    assert _load(spark, uri, failOnDataLoss="false").count() == len(TOPICS) * PER_TOPIC - 1
    assert skipped_data(spark)["messages"] == before + 1


def _running_copies(local: str, s3: str, golden) -> tuple[int, int]:
    """Under running/: broker-a (the module's store) and broker-c, a copy of a running RocketMQ 4.4.0 broker
    (the golden crash set: an abort file, and the commitlog file after the one being written allocated
    ahead, all zeros) taken while it wrote its last record (torn: its second half zeros). Returns (where
    broker-c's records end: the torn record's offset, its record count up to there)."""
    from conftest import golden_store
    crash = golden_store(golden, "rmq440-crash")
    fs = _bucket(s3)
    for src, name in ((local, "broker-a"), (str(crash), "broker-c")):
        pafs.copy_files(src, f"bkt/running/{name}/store", source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=fs)
    files = sorted(os.listdir(crash / "commitlog"))
    assert (crash / "abort").exists() and not np.fromfile(crash / "commitlog" / files[-1], np.uint8).any()
    buf = np.fromfile(crash / "commitlog" / files[-2], dtype=np.uint8).copy()
    positions, _, _ = scan.scanner.walk_positions(buf, 0, len(buf))
    last = int(positions[-1])
    size = int.from_bytes(buf[last:last + 4].tobytes(), "big")
    buf[last + size // 2:last + size] = 0
    with fs.open_output_stream(f"bkt/running/broker-c/store/commitlog/{files[-2]}") as out:
        out.write(buf.tobytes())
    n = sum(len(scan.scanner.walk_positions(np.fromfile(crash / "commitlog" / f, np.uint8), 0, 1 << 20)[0])
            for f in files[:-2])
    return int(files[-2]) + last, n + len(positions) - 1


def test_a_torn_copy_of_a_running_broker_reads_up_to_its_tear(spark, stores, s3, golden, caplog):
    """Issue 40 item 8: over a glob of stores, one of them a copy of a running broker, option key failed the
    whole read with DataLossError on that copy's zeroed tail (a commitlog file that is not the last one,
    zeros after its data: the file after it is only allocated ahead) while plain reads worked. A copy's torn
    tail is not data loss: what is valid is read, as a plain read does, and a warning names the torn copy."""
    local, _ = stores
    torn_at, records = _running_copies(local, s3, golden)
    glob, copy = _uri(s3, "running/*/store"), _uri(s3, "running/broker-c/store")
    rows = _load(spark, copy, mode="commitlog", columns="commitLogOffset,keys").collect()
    assert len(rows) == records and max(r.commitLogOffset for r in rows) < torn_at
    off, keys = max((r.commitLogOffset, r["keys"]) for r in rows if r["keys"])
    got = _load(spark, glob, key=keys[0]).select("broker", "commitLogOffset").collect()
    assert ("broker-c", off) in {(r.broker, r.commitLogOffset) for r in got}, got
    assert _load(spark, glob, key="TopicC-k77").select("broker").collect()[0].broker == "broker-a"
    with caplog.at_level(logging.WARNING, logger="rmqstore.spark.scan"):
        tab, _ = _read_all(copy, mode="commitlog")
    assert tab.num_rows == records
    assert any(f"s3://bkt/running/broker-c/store: a torn tail: the commitlog's records end at offset {torn_at}"
               in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_bad_uris_fail_in_one_line(spark, s3):
    from pyspark.errors import PySparkException
    for path, words in (("foo://bkt/store", ("foo://", "fsspec")),
                        (_uri(s3, "no-such-prefix/store"), ("s3://bkt/no-such-prefix/store",
                                                              "is not a RocketMQ store directory"))):
        with pytest.raises(V.StoreError) as e:
            V.resolve_paths(path, None)
        assert "\n" not in str(e.value) and all(w in str(e.value) for w in words), str(e.value)
        with pytest.raises(PySparkException) as e:
            _load(spark, path)
        assert all(w in str(e.value) for w in words), str(e.value)


# --- without Spark ------------------------------------------------------------------------------------
def _read_all(path: str, **opts):
    import pyarrow as pa
    parts = plan.plan_batch(O.parse({"path": path, **opts}), [])
    tab = pa.Table.from_batches([b for p in parts for b in scan.read_partition(p)], schema=R.ARROW_SCHEMA)
    return tab.sort_by([("commitLogOffset", "ascending")]), parts


def test_remote_ranged_reads_in_small_spans_and_chunks(stores, monkeypatch):
    """Consume queue files read in growing blocks up to their written end, spans split by gap and size
    (queue reads), commitlog ranges walked 64 KiB per read (records cut by a
    chunk's end are read again whole) and a start by store time (ranged reads of units and headers) give the
    local rows."""
    local, uri = stores
    monkeypatch.setattr(store_fs, "GAP", 2000)            # the queue's records are ~1 KB apart
    monkeypatch.setattr(store_fs, "MAX_SPAN", 16 << 10)
    monkeypatch.setattr(scan, "REMOTE_CHUNK", 64 << 10)
    monkeypatch.setattr(V, "REMOTE_UNITS_BLOCK", 7 * V.UNIT)     # a queue's written units found in 7 reads
    ends = {k: (q.min_offset, q.end, q.max_physic_offset) for k, q in V.load_view(local).queues.items()}
    assert {k: (q.min_offset, q.end, q.max_physic_offset) for k, q in V.load_view(uri).queues.items()} == ends
    everything, _ = _read_all(local, topics="TopicC")
    ts = everything.column("storeTimestamp").to_numpy()
    middle = str(int(ts[len(ts) // 2].astype("datetime64[ms]").astype(np.int64)))   # binary search by time
    for opts in ({"mode": "commitlog"}, {"topics": "TopicA", "queueIds": "2"},
                 {"topics": "TopicC", "startingTimestamp": middle}):
        a, _ = _read_all(local, **opts)
        b, parts = _read_all(uri, **opts)
        assert a.num_rows and a.equals(b), opts
        assert all(p.store.fs is not None for p in parts)


def test_read_spans():
    pos = np.array([0, 100, 300, 5000, 5100, 200], dtype=np.int64)
    sizes = np.array([100, 100, 100, 100, 100, 100], dtype=np.int64)
    assert store_fs.read_spans(pos, sizes, 10_000, gap=1000) == [(0, 3, 0, 400), (3, 5, 5000, 5200), (5, 6, 200, 300)]
    assert store_fs.read_spans(pos[:3], sizes[:3], 10_000, gap=1000, max_span=150) == [
        (0, 1, 0, 100), (1, 2, 100, 200), (2, 3, 300, 400)]
    assert store_fs.read_spans(pos[:2], None, 10_000) == [(0, 2, 0, 10_000)]
    assert store_fs.read_spans(pos[:0], sizes[:0], 10) == []


def test_what_executors_get_names_no_driver_path(stores):
    """Partitions of an s3 read carry the store's URI and its files, nothing of the driver's machine (its
    interpreter, its venv, its working directory); they unpickle into readable partitions."""
    _, uri = stores
    from pyspark import cloudpickle
    ro = O.parse({"path": uri})
    from rmqstore.spark.datasource import RocketMQReader
    blob = cloudpickle.dumps((RocketMQReader(ro), plan.plan_batch(ro, [])))
    for local_thing in {sys.executable, sys.prefix, os.getcwd(), os.path.dirname(store_fs.__file__)}:
        assert local_thing.encode() not in blob, local_thing
    _, parts = pickle.loads(blob)
    store_fs._FILESYSTEMS.clear()           # as in a fresh executor process
    assert sum(b.num_rows for p in parts for b in scan.read_partition(p)) == len(TOPICS) * PER_TOPIC


def test_globs_over_a_bucket(stores, s3):
    _, uri = stores
    assert V.resolve_paths(_uri(s3, "*/store"), None) == [uri]       # a glob matches existing stores only
    assert V.resolve_paths(_uri(s3, "broker-[ab]/store"), None) == [uri]    # "?" starts a URI's query
    assert V.broker_name(uri) == "broker-a"
    with pytest.raises(V.StoreError, match="matches no store directory"):
        V.resolve_paths(_uri(s3, "nothing-*/store"), None)


def test_fsspec_filesystem_when_pyarrow_has_none(stores):
    """A scheme pyarrow does not know (memory://) opens through fsspec (pyarrow's FSSpecHandler)."""
    fsspec = pytest.importorskip("fsspec")
    local, _ = stores
    mem = pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem("memory")))
    pafs.copy_files(local, "/mem-test/broker-a/store", source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=mem)
    try:
        a, _ = _read_all(local)
        b, parts = _read_all("memory://mem-test/broker-a/store")
        assert a.num_rows == len(TOPICS) * PER_TOPIC and a.equals(b)
        assert parts[0].store.root == "memory://mem-test/broker-a/store"
    finally:
        fsspec.filesystem("memory").rm("/mem-test", recursive=True)
    with pytest.raises(V.StoreError, match="cannot open 'nosuchscheme://x/store' with fsspec") as e:
        V.resolve_paths("nosuchscheme://x/store", None)
    assert "\n" not in str(e.value)


def test_file_uri_is_the_local_path(stores):
    local, _ = stores
    assert V.resolve_paths("file://" + local, None) == [local]
    assert V.load_view("file://" + local).fs is None           # read as before: mmap, recovery emulated


def test_stats_of_an_s3_copy_and_the_writer_refuses_uris(spark, stores):
    """`stats` (local engine: ranged reads in this process) counts the S3 copy as the local store; the
    writer, which appends under the store's lock, refuses a URI at planning in one line and creates nothing
    (no local directory named after the scheme)."""
    from rmqstore.spark.stats import stats
    from pyspark.errors import PySparkException
    local, uri = stores
    assert stats(uri) == stats(local)
    assert sum(r["messages"] for r in stats(uri)) == len(TOPICS) * PER_TOPIC
    cwd = os.getcwd()
    df = spark.createDataFrame([("TopicA", bytearray(b"x"))], "topic string, body binary")
    with pytest.raises(PySparkException) as e:
        df.write.format("rocketmq").mode("append").save(uri)
    assert "s3://bkt/broker-a/store" in str(e.value) and "remote URIs are read-only" in str(e.value)
    assert "test:test" not in str(e.value)
    assert not os.path.exists(os.path.join(cwd, "s3:"))
