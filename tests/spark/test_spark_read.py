"""spark.read.format("rocketmq") on a real local SparkSession: golden stores, modes, several stores, options,
pushed filters, key lookups, option errors at planning."""
from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from rmqstore.store.format import codec
from rmqstore.store.conf.config import StoreConfig
from rmqstore.store.reads.reader import CommitLogReader
from rmqstore.store.store import MessageStore

from conftest import golden_store, local_spark, read_jsonl

pytestmark = pytest.mark.spark
SETS = ("rmq440-clean", "rmq440-crash")


@pytest.fixture(scope="module")
def spark():
    return local_spark("rmqstore-test-read", **{"spark.sql.python.filterPushdown.enabled": "true"})


def rows_json(df) -> list[dict]:
    """Rows as golden dump lines (timestamps as epoch ms computed by Spark, body hex, sorted properties)."""
    from pyspark.sql import functions as F
    got = df.withColumn("bornMs", F.unix_millis("bornTimestamp")).withColumn("storeMs", F.unix_millis("storeTimestamp"))
    out = []
    for r in got.collect():
        d = r.asDict()
        out.append({"topic": d["topic"], "queueId": d["queueId"], "queueOffset": d["queueOffset"],
                    "commitLogOffset": d["commitLogOffset"], "storeSize": d["storeSize"], "bodyCRC": d["bodyCRC"],
                    "flag": d["flag"], "sysFlag": d["sysFlag"], "bornTimestamp": d["bornMs"],
                    "storeTimestamp": d["storeMs"], "bornHost": d["bornHost"], "storeHost": d["storeHost"],
                    "reconsumeTimes": d["reconsumeTimes"], "preparedTransactionOffset": d["preparedTransactionOffset"],
                    "msgId": d["msgId"], "properties": codec.sorted_properties_string(dict(d["properties"] or {})),
                    "body": bytes(d["body"]).hex() if d["body"] is not None else None})
    return sorted(out, key=lambda d: (d["topic"], d["queueId"], d["queueOffset"], d["commitLogOffset"]))


def reader(spark, name, golden, **opts):
    r = spark.read.format("rocketmq").option("config", str(golden / name / "store.conf"))
    for k, v in opts.items():
        r = r.option(k, v)
    return r


@pytest.mark.parametrize("name", SETS)
def test_golden_store_reads_as_its_dump(spark, golden, name):
    df = reader(spark, name, golden).load(str(golden_store(golden, name)))
    expected = sorted((d for d in read_jsonl(golden / name / "dump.jsonl") if "queueOffset" in d),
                      key=lambda d: (d["topic"], d["queueId"], d["queueOffset"], d["commitLogOffset"]))
    got = rows_json(df)
    assert len(got) == len(expected) == {"rmq440-clean": 2480, "rmq440-crash": 6718}[name]
    assert got == expected
    one = df.filter("topic = 'TopicA' and queueId = 0 and queueOffset = 3").collect()[0]
    assert one.broker == name
    props = dict(one.properties)
    assert one.tags == props.get("TAGS")
    assert one.keys == [k for k in props.get("KEYS", "").split(" ") if k]


def test_commitlog_mode_reads_every_record(spark, golden):
    name = "rmq440-crash"
    root = golden_store(golden, name)
    df = reader(spark, name, golden, mode="commitlog").load(str(root))
    expected = sorted((m.to_json() for m in CommitLogReader(root).messages()),
                      key=lambda d: (d["topic"], d["queueId"], d["queueOffset"], d["commitLogOffset"]))
    got = rows_json(df)
    assert len(got) == 8008
    assert got == expected
    assert {r.sysFlag & 0xC for r in df.select("sysFlag").distinct().collect()} == {0, 4, 8, 12}


def test_several_stores_one_dataframe(spark, golden):
    paths = [str(golden_store(golden, n)) for n in SETS]
    df = spark.read.format("rocketmq").load(paths)
    counts = {r.broker: r["count"] for r in df.groupBy("broker").count().collect()}
    assert counts == {"rmq440-clean": 2480, "rmq440-crash": 6718}
    df = spark.read.format("rocketmq").load(str(golden / "rmq440-*" / "store"))
    assert df.count() == 2480 + 6718
    per = (spark.read.format("rocketmq").option("startingOffsets", json.dumps({"rmq440-clean": {"TopicA": {"0": 150}}}))
           .option("topics", "TopicA").option("queueIds", "0").load(paths))
    got = {r.broker: r["count"] for r in per.groupBy("broker").count().collect()}
    assert got == {"rmq440-clean": 156 - 150, "rmq440-crash": 455}


def test_filters_give_the_same_rows(spark, golden):
    """Spark applies every filter itself (the source claims none; option pushFilters is refused)."""
    from pyspark.sql import functions as F
    name = "rmq440-clean"
    root = str(golden_store(golden, name))

    def load(**opts):
        return reader(spark, name, golden, **opts).load(root)
    every = rows_json(load())
    ts = sorted(r["storeTimestamp"] for r in every)
    lo, hi = ts[len(ts) // 4], ts[3 * len(ts) // 4]
    import datetime as dt
    lo_t = dt.datetime.fromtimestamp(lo / 1000, dt.timezone.utc)
    hi_t = dt.datetime.fromtimestamp(hi / 1000, dt.timezone.utc)
    df = load()
    q = (df.filter(F.col("topic").isin("TopicA", "订单Topic")).filter(F.col("queueId") != 2)
         .filter((F.col("storeTimestamp") >= F.lit(lo_t)) & (F.col("storeTimestamp") < F.lit(hi_t)))
         .filter(F.col("queueOffset") <= 120).filter(F.col("tags").isNotNull()))
    got = rows_json(q)
    exp = [r for r in every if r["topic"] in ("TopicA", "订单Topic") and r["queueId"] != 2
           and lo <= r["storeTimestamp"] < hi and r["queueOffset"] <= 120 and "TAGS\x01" in r["properties"]]
    assert got == exp and 100 < len(got) < 1500
    assert rows_json(df.filter(F.col("topic") == "TopicB").filter(F.col("queueId") == 2)) == \
        [r for r in every if r["topic"] == "TopicB" and r["queueId"] == 2]
    assert df.filter(F.col("sysFlag") == 8).count() == sum(1 for r in every if r["sysFlag"] == 8)
    assert df.filter(F.col("tags") == "*").count() == sum(1 for r in every if "TAGS\x01*\x02" in r["properties"])
    assert df.count() == 2480                   # the DataFrame reused after filtered queries


def test_offsets_and_timestamps_options(spark, golden):
    name = "rmq440-crash"
    root = str(golden_store(golden, name))
    df = (reader(spark, name, golden, topics="TopicA", queueIds="0,1",
                 startingOffsets=json.dumps({"TopicA": {"0": 10, "1": -1}}),
                 endingOffsets=json.dumps({"TopicA": {"0": 20}})).load(root))
    got = sorted((r.queueId, r.queueOffset) for r in df.select("queueId", "queueOffset").collect())
    assert got == [(0, o) for o in range(10, 20)]
    view_dump = [d for d in read_jsonl(golden / name / "dump.jsonl") if d.get("topic") == "TopicB" and d["queueId"] == 3]
    mid = view_dump[200]["storeTimestamp"]
    # Kafka's rule: each queue starts at its first message stored at or after the time
    df = reader(spark, name, golden, topics="TopicB", queueIds="3", startingTimestamp=str(mid)).load(root)
    offs = sorted(r.queueOffset for r in df.select("queueOffset").collect())
    first = min(d["queueOffset"] for d in view_dump if d["storeTimestamp"] >= mid)
    assert offs == list(range(first, 432)) and first <= 200
    assert reader(spark, name, golden, includeBody="false").load(root).filter("body is not null").count() == 0
    pat = reader(spark, name, golden, subscribePattern="Topic[AB]").load(root)
    assert {r.topic for r in pat.select("topic").distinct().collect()} == {"TopicA", "TopicB"}


def test_key_option_answers_through_the_index(spark, golden, tmp_path):
    name = "rmq440-clean"
    root = golden_store(golden, name)
    keys = [tuple(line.split("\t")) for line in (golden / name / "keys.tsv").read_text("utf-8").splitlines() if line]
    sample = keys[:8] + keys[-3:]
    copy = tmp_path / "s"
    shutil.copytree(root, copy)
    for p in [copy, *copy.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    with MessageStore.open(copy, StoreConfig.load(golden / name / "store.conf"), start_services=False) as st:
        expected = {(t, k): sorted(m.commit_log_offset for m in st.find_messages_by_key(t, k)) for t, k in sample}
    from pyspark.sql import functions as F
    for topic, key in sample:
        df = reader(spark, name, golden, key=key).load(str(root)).filter(F.col("topic") == topic)
        got = sorted(r.commitLogOffset for r in df.select("commitLogOffset").collect())
        assert got == expected[(topic, key)], (topic, key)
        if topic != "NoSuchTopic":
            df2 = reader(spark, name, golden, key=key, topics=topic).load(str(root))
            assert sorted(r.commitLogOffset for r in df2.select("commitLogOffset").collect()) == got
    assert sum(len(v) for v in expected.values()) >= 8


def test_bad_options_fail_when_the_dataframe_is_created(spark, golden, tmp_path):
    from pyspark.errors import PySparkException
    name = "rmq440-clean"
    root = str(golden_store(golden, name))
    for opts, word in [({"topics": "NoSuchTopic"}, "topics"), ({"startingOffsets": '{"TopicA": {"0": '}, "startingOffsets"),
                       ({"endingOffsets": "soon"}, "endingOffsets"), ({"mode": "fast"}, "mode")]:
        r = spark.read.format("rocketmq")
        for k, v in opts.items():
            r = r.option(k, v)
        with pytest.raises(PySparkException, match=word):
            r.load(root)                      # no action: planning fails
    with pytest.raises(PySparkException, match="'path'.*not a RocketMQ store"):
        spark.read.format("rocketmq").load(str(tmp_path))
    with pytest.raises(PySparkException, match="topics"):
        spark.readStream.format("rocketmq").option("topics", "Nope").load(root)
