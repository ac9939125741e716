"""Spark jobs over stores: streaming exactly-once across a restart, the writer, the distributed rebuild,
statistics and the demo pipeline (one local SparkSession for the module)."""
from __future__ import annotations

import dataclasses
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from rmqstore.store.format import codec
from rmqstore.store.conf.config import StoreConfig
from rmqstore.store.format.message import Message
from rmqstore.store.repair.rebuild import rebuild_store
from rmqstore.store.store import MessageStore

from conftest import golden_store, local_spark, read_jsonl
from store_checks import index_parts, tree_files

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark():
    return local_spark("rmqstore-test-jobs", **{"spark.sql.python.filterPushdown.enabled": "true",
                          "spark.sql.streaming.pollingDelay": "100ms"})


def writable_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for p in [dst, *dst.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


SMALL = StoreConfig(mapped_file_size_commit_log=256 << 10, mapped_file_size_consume_queue=20 * 200,
                    max_hash_slot_num=100, max_index_num=400)


def _msg(i: int) -> Message:
    return Message(f"S{i % 2}", f"body-{i}".encode() * (1 + i % 5), queue_id=(i // 2) % 3,
                   properties={"KEYS": f"k{i}", "TAGS": f"t{i % 4}", "seq": str(i)})


# --- streaming ----------------------------------------------------------------------------------------
def test_stream_exactly_once_across_restart(spark, tmp_path):
    store, ckpt, out = tmp_path / "store", str(tmp_path / "ckpt"), str(tmp_path / "out")
    first, second = 600, 400          # ~167 a queue: 2 consume queue files each (100 units); second > 300
    st = MessageStore.open(store, dataclasses.replace(SMALL, mapped_file_size_consume_queue=20 * 100))
    st.put_messages([_msg(i) for i in range(100)])
    assert st.wait_dispatched()

    def produce():
        for i in range(100, first, 50):
            st.put_messages([_msg(j) for j in range(i, i + 50)])
            time.sleep(0.05)
    writer = threading.Thread(target=produce)

    def start(trigger: dict):
        df = (spark.readStream.format("rocketmq").option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", "300").load(str(store)))      # 1000 messages: 4 triggers or more
        return (df.select("topic", "queueId", "queueOffset", "msgId", "body", "properties").writeStream
                .format("parquet").option("path", out).option("checkpointLocation", ckpt).trigger(**trigger).start())
    q = start({"processingTime": "200 milliseconds"})
    writer.start()
    writer.join()
    assert st.wait_dispatched()
    deadline = time.time() + 120
    while time.time() < deadline:             # stop mid-way: some batches done, not all messages read
        done = sum(p["numInputRows"] for p in q.recentProgress)
        if done >= 300:
            break
        time.sleep(0.2)
    q.stop()
    assert q.exception() is None
    read_before = spark.read.parquet(out).count()
    assert 0 < read_before
    st.put_messages([_msg(i) for i in range(first, first + second)])
    assert st.wait_dispatched()
    st.close()                                # now nobody holds the store: it reads as after recovery
    q = start({"availableNow": True})
    q.awaitTermination(180)
    assert q.exception() is None
    rows = spark.read.parquet(out).collect()
    seqs = sorted(int(dict(r.properties)["seq"]) for r in rows)
    assert seqs == list(range(first + second)), "every message exactly once"
    keys = {(r.topic, r.queueId, r.queueOffset) for r in rows}
    assert len(keys) == len(rows) == first + second
    for r in rows:
        i = int(dict(r.properties)["seq"])
        assert bytes(r.body) == _msg(i).body and r.topic == f"S{i % 2}" and r.queueId == (i // 2) % 3
    sizes = [p["numInputRows"] for p in q.recentProgress]
    assert sizes and max(sizes) <= 300


# --- writer -------------------------------------------------------------------------------------------
def test_write_appends_rows_as_messages(spark, tmp_path):
    from pyspark.sql import Row
    store = tmp_path / "w"
    conf = tmp_path / "w.conf"
    conf.write_text("mapedFileSizeCommitLog=262144\nmapedFileSizeConsumeQueue=4000\nmaxHashSlotNum=100\n"
                    "maxIndexNum=400\ndefaultTopicQueueNums=3\n")
    rows = [Row(topic="W1", body=bytearray(f"b{i}".encode()), tags=f"tag{i % 2}", keys=[f"k{i}", "common"],
                properties={"p": str(i)}, queueId=None if i % 3 else 1) for i in range(90)]
    df = spark.createDataFrame(rows, "topic string, body binary, tags string, keys array<string>, "
                                     "properties map<string,string>, queueId int").repartition(3)
    df.write.format("rocketmq").mode("append").option("config", str(conf)).save(str(store))
    df2 = spark.createDataFrame([("W2", "text body")], "topic string, body string")
    df2.write.format("rocketmq").mode("append").option("config", str(conf)).save(str(store))
    back = spark.read.format("rocketmq").option("config", str(conf)).load(str(store))
    got = back.collect()
    assert len(got) == 91
    w1 = [r for r in got if r.topic == "W1"]
    assert sorted(bytes(r.body) for r in w1) == sorted(f"b{i}".encode() for i in range(90))
    for r in w1:
        i = int(dict(r.properties)["p"])
        assert r.tags == f"tag{i % 2}" and r.keys == [f"k{i}", "common"]
        if i % 3 == 0:
            assert r.queueId == 1
    assert {r.queueId for r in w1} == {0, 1, 2}             # round robin over defaultTopicQueueNums=3
    assert [bytes(r.body) for r in got if r.topic == "W2"] == [b"text body"]
    with MessageStore.open(store, StoreConfig.load(conf), start_services=False) as st:   # the store agrees
        # the index has the half message and its commit record (RocketMQ indexes both)
        assert [(m.body, m.sys_flag & codec.TRANSACTION_TYPE_MASK) for m in st.find_messages_by_key("W1", "k7")] \
            == [(b"b7", codec.TRANSACTION_PREPARED_TYPE), (b"b7", codec.TRANSACTION_COMMIT_TYPE)]
        assert st.get_max_offset_in_queue("W2", 0) + st.get_max_offset_in_queue("W2", 1) \
            + st.get_max_offset_in_queue("W2", 2) == 1


def test_write_a_store_read_from_another(spark, golden, tmp_path):
    name = "rmq440-clean"
    src = spark.read.format("rocketmq").option("config", str(golden / name / "store.conf")).load(
        str(golden_store(golden, name)))
    dst = tmp_path / "copy"
    src.write.format("rocketmq").mode("append").save(str(dst))
    def props(r) -> str:        # the copy's are the source's plus the transaction's TRAN_MSG and PGROUP
        return codec.sorted_properties_string({k: v for k, v in dict(r.properties).items()
                                               if k not in ("TRAN_MSG", "PGROUP")})
    a = sorted((r.topic, r.queueId, bytes(r.body), props(r))
               for r in src.select("topic", "queueId", "body", "properties").collect())
    b = sorted((r.topic, r.queueId, bytes(r.body), props(r))
               for r in spark.read.format("rocketmq").load(str(dst)).select("topic", "queueId", "body", "properties")
               .collect())
    assert a == b and len(a) == 2480
    assert not list(dst.glob(".spark-write-*"))     # the tasks' staged rows are removed once appended


def test_write_errors(spark, tmp_path):
    from pyspark.errors import PySparkException
    from py4j.protocol import Py4JJavaError
    store = tmp_path / "locked"
    df = spark.createDataFrame([("T", b"x")], "topic string, body binary")
    with MessageStore.open(store, SMALL):
        with pytest.raises((PySparkException, Py4JJavaError), match=f"{store}.*locked"):
            df.write.format("rocketmq").mode("append").save(str(store))
    with pytest.raises((PySparkException, Py4JJavaError), match="append"):
        df.write.format("rocketmq").mode("overwrite").save(str(store))
    with pytest.raises((PySparkException, Py4JJavaError), match="'tpoic'"):
        spark.createDataFrame([("T", b"x", "T")], "topic string, body binary, tpoic string") \
            .write.format("rocketmq").mode("append").save(str(store))
    with pytest.raises((PySparkException, Py4JJavaError), match="topic"):
        spark.createDataFrame([("x" * 200, b"x")], "topic string, body binary") \
            .write.format("rocketmq").mode("append").save(str(store))
    new = tmp_path / "new-store"
    with pytest.raises((PySparkException, Py4JJavaError), match="topic"):
        spark.createDataFrame([("x" * 200, b"x")], "topic string, body binary") \
            .write.format("rocketmq").mode("append").save(str(new))
    assert not new.exists()                         # made for the write's staging directory, removed with it
    assert not list(store.glob(".spark-write-*"))
    with MessageStore.open(store, SMALL, start_services=False) as st:
        assert st.get_max_phy_offset() == 0         # nothing was appended by the failed writes


# --- rebuild ------------------------------------------------------------------------------------------
def _cq_files(root: Path) -> dict[str, bytes]:
    return tree_files(root, "consumequeue")


@pytest.mark.parametrize("name", ["rmq440-clean", "rmq440-crash"])
def test_rebuild_spark_equals_rocketmq_and_local(spark, golden, tmp_path, name):
    from rmqstore.spark import rebuild_spark
    from rmqstore.spark.rebuild import index_file_names
    cfg = StoreConfig.load(golden / name / "store.conf")
    local = writable_copy(golden_store(golden, name), tmp_path / "local")
    dist = writable_copy(golden_store(golden, name), tmp_path / "spark")
    rebuild_store(local, cfg)
    got = rebuild_spark(dist, cfg, spark=spark)
    assert got["messages"] == {"rmq440-clean": 3000, "rmq440-crash": 8008}[name]
    assert got["missing_units"] == 0 and got["queues"] == 16
    ours, theirs = _cq_files(dist), _cq_files(golden_store(golden, name))
    assert ours == _cq_files(local)                         # byte-identical to the local engine
    assert ours.keys() == theirs.keys()
    for f, data in theirs.items():                          # and to RocketMQ's own files
        if name == "rmq440-clean":
            assert ours[f] == data, f
        else:                                               # (where its killed dispatcher had written)
            n = len(data.rstrip(b"\0"))
            n += -n % codec.CQ_STORE_UNIT_SIZE
            assert ours[f][:n] == data[:n], f
    assert index_parts(dist) == index_parts(local)        # headers (but hashSlotCount), slots, entries
    if name == "rmq440-clean":
        assert index_parts(dist) == index_parts(golden_store(golden, name))
    names = sorted(os.listdir(dist / "index"))
    firsts = [codec.INDEX_HEADER.unpack_from((dist / "index" / n).read_bytes(), 0)[0] for n in names]
    assert names == index_file_names(firsts)                # named by their first store time
    assert not (dist / "abort").exists()                     # as after the local engine's close()
    reports = []
    for path in (local, dist):        # opening either finds the same (nothing to add: units already there)
        with MessageStore.open(path, cfg, start_services=False) as st:
            r = st.recovery_report
            reports.append((r.clean_shutdown, r.redispatched_from, r.redispatched_messages, r.dropped))
    assert reports[0] == reports[1] and reports[1][0]
    assert _cq_files(dist) == _cq_files(local)


# --- stats and demo -------------------------------------------------------------------------------------
def test_stats_local_and_spark_agree(spark, golden, tmp_path):
    from rmqstore.spark import stats
    name = "rmq440-crash"
    root = golden_store(golden, name)
    png = tmp_path / "rate.png"
    a = stats(root, engine="local", plot=str(png), config=str(golden / name / "store.conf"))
    b = stats(root, engine="spark", config=str(golden / name / "store.conf"), spark=spark)
    assert a == b
    dump = [d for d in read_jsonl(golden / name / "dump.jsonl") if "queueOffset" in d]
    assert sum(r["messages"] for r in a) == len(dump) == 6718
    assert sum(r["bytes"] for r in a) == sum(d["storeSize"] for d in dump)
    r0 = next(r for r in a if r["topic"] == "TopicA" and r["queueId"] == 0)
    q0 = [d for d in dump if d["topic"] == "TopicA" and d["queueId"] == 0]
    assert (r0["firstStoreTime"], r0["lastStoreTime"]) == (min(d["storeTimestamp"] for d in q0),
                                                          max(d["storeTimestamp"] for d in q0))
    assert r0["messagesPerMinute"] == len(q0)                # the span is under a minute
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_pipeline(spark, golden, capsys):
    from rmqstore.spark import demo_pipeline
    got = demo_pipeline(golden_store(golden, "rmq440-clean"), spark=spark)
    assert got["streamed"] == 2480 and got["micro_batches"] == 5
    assert sum(t["messages"] for t in got["topics"]) == 2480
    assert "messages per topic" in capsys.readouterr().out


def test_read_a_live_slave_off_the_masters_disk(spark, tmp_path):
    """A Spark job reads a running slave's store (replicated from its master, store/ha) and gets every
    message the master holds, without touching the master's disk."""
    from rmqstore.broker.process import free_port
    port = free_port()
    cfg = dict(mapped_file_size_commit_log=256 << 10)
    with MessageStore.open(tmp_path / "m", StoreConfig(broker_role="ASYNC_MASTER", ha_listen_port=port, **cfg)) as m, \
            MessageStore.open(tmp_path / "s", StoreConfig(broker_role="SLAVE", broker_id=1,
                                                          ha_master_address=f"127.0.0.1:{port}", **cfg)) as s:
        for a in range(0, 3000, 500):
            m.put_messages([Message(("A", "B")[i % 2], f"b{i}".encode(), queue_id=i % 3,
                                    properties={"KEYS": f"k{i}"}) for i in range(a, a + 500)])
        deadline = time.monotonic() + 30
        while s.commit_log.get_max_offset() < m.commit_log.get_max_offset() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert s.wait_dispatched(30)
        conf = tmp_path / "store.conf"
        conf.write_text("mappedFileSizeCommitLog=262144\n")
        rows = spark.read.format("rocketmq").option("config", str(conf)).load(str(tmp_path / "s")) \
            .select("topic", "queueId", "queueOffset", "body").collect()
    expected, nxt = set(), {}
    for i in range(3000):
        q = (("A", "B")[i % 2], i % 3)
        expected.add((*q, nxt.get(q, 0), f"b{i}".encode()))
        nxt[q] = nxt.get(q, 0) + 1
    assert len(rows) == 3000
    assert {(r.topic, r.queueId, r.queueOffset, bytes(r.body)) for r in rows} == expected
