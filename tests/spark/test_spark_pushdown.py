"""A DataFrame reused for queries with and without filters answers every query right (an outside audit: with
option pushFilters=true, df.filter("topic='T1'").count() then df.count() answered 8,416 instead of 101,001,
without a warning: PySpark 4.3 keeps the read planned with the first query's pushed filters for the
DataFrame's next query). The option is refused, saying why; the session here has Spark's filter pushdown on,
as a user's may."""
from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from conftest import local_spark
from rmqstore import MessageBatch, MessageStore, StoreConfig

COUNTS = {"T1": 841, "T2": 9000, "T3": 160}


@pytest.fixture(scope="module")
def spark():
    return local_spark("rmqstore-test-spark-pushdown", **{"spark.sql.python.filterPushdown.enabled": "true"})


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("pushdown") / "store"
    with MessageStore.open(root, StoreConfig.from_dict({"mappedFileSizeCommitLog": 8 << 20})) as s:
        for t, n in COUNTS.items():
            assert s.put_messages(MessageBatch(t, [b"x"] * n, queue_ids=[i % 4 for i in range(n)])).all_ok
    return str(root)


def test_a_reused_dataframe_answers_each_query(spark, store):
    df = spark.read.format("rocketmq").load(store)
    total = sum(COUNTS.values())
    assert df.filter("topic = 'T1'").count() == COUNTS["T1"]
    assert df.count() == total                                         # the audit's reuse
    assert {r.topic: r["count"] for r in df.groupBy("topic").count().collect()} == COUNTS
    assert {r.topic: r["count"] for r in df.filter("topic != 'T2'").groupBy("topic").count().collect()} == \
        {"T1": COUNTS["T1"], "T3": COUNTS["T3"]}
    assert {r.topic: r["count"] for r in df.groupBy("topic").count().collect()} == COUNTS
    assert df.filter("queueId = 3 and topic = 'T3'").count() == COUNTS["T3"] // 4
    assert df.count() == total


def test_push_filters_is_refused_saying_why(spark, store):
    from pyspark.errors import PySparkException
    with pytest.raises(PySparkException) as e:
        spark.read.format("rocketmq").option("pushFilters", "true").load(store).count()
    assert "pushFilters=true was removed: it returned wrong rows" in str(e.value)
    assert "df.count() counted topic T1 only" in str(e.value)
