"""spark.read.format("rocketmq") in a user's own SparkSession (built with SparkSession.builder, no rmqstore
settings, Python filter pushdown left off): it reads, a reused DataFrame gives the right rows for every query,
and a read that selects nothing gives 0 rows."""
from __future__ import annotations

import json

import pytest

from conftest import local_spark

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from rmqstore.store.conf.config import StoreConfig
from rmqstore.store.format.message import Message
from rmqstore.store.store import MessageStore
from conftest import load_store as load  # noqa: E402

pytestmark = pytest.mark.spark
TOPICS = {"TopicA": 60, "TopicB": 30, "TopicC": 10}     # messages per queue (2 queues each)


@pytest.fixture(scope="module")
def spark():
    return local_spark("rmqstore-test-source")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("src") / "broker-a" / "store"
    cfg = StoreConfig(mapped_file_size_commit_log=8192, mapped_file_size_consume_queue=20 * 1000)
    with MessageStore.open(root, cfg) as st:
        for t, n in TOPICS.items():
            st.put_messages([Message(t, f"{t}-{i}".encode(), queue_id=i % 2, properties={"KEYS": f"{t}-k{i}"})
                             for i in range(2 * n)])
        assert st.wait_dispatched()
    (root.parent / "store.conf").write_text(cfg.to_properties())
    return root


def test_own_session_reads_and_a_reused_dataframe_gives_each_query_its_rows(spark, store):
    """The issue's case: filter on topic, count; then count and group the same DataFrame."""
    df = load(spark, store)
    assert df.filter("topic = 'TopicA'").count() == 120
    assert df.count() == 200
    assert {r.topic: r["count"] for r in df.groupBy("topic").count().collect()} == {"TopicA": 120, "TopicB": 60,
                                                                                    "TopicC": 20}
    assert df.filter("topic = 'TopicB' and queueId = 1").count() == 30
    assert df.count() == 200
    assert "PushedFilters: []" in df.filter("topic = 'TopicA'")._jdf.queryExecution().executedPlan().toString() \
        or "PushedFilters" not in df.filter("topic = 'TopicA'")._jdf.queryExecution().executedPlan().toString()


def test_pushfilters_true_is_refused_saying_why(spark, store):
    """It returned wrong rows on a reused DataFrame (tests/spark/test_spark_pushdown.py); false is accepted."""
    from pyspark.errors import PySparkException
    with pytest.raises(PySparkException, match="option pushFilters=true was removed: it returned wrong rows"):
        load(spark, store, pushFilters="true").count()
    assert load(spark, store, pushFilters="false").count() == load(spark, store).count()


def _future_iso() -> str:
    """A store time after every message's: fixed, so that every pytest-xdist worker collects the same test ids
    (a time computed at collection differed between two workers once a second had passed)."""
    return "2099-01-01T00:00:00Z"


EMPTY = [
    ({}, "topic = 'Nope'"),
    ({}, f"storeTimestamp > timestamp'{_future_iso()[:-1].replace('T', ' ')}'"),
    ({}, "queueOffset >= 100000"),
    ({"subscribePattern": "Nothing.*"}, None),
    ({"queueIds": "99"}, None),
    # startingOffsets past a queue's end, or after endingOffsets, fail the read as Kafka's batch source does
    # (issue 40): tests/spark/test_spark_kafka_habits.py
    ({"startingTimestamp": _future_iso(), "startingOffsetsByTimestampStrategy": "latest"}, None),
    ({"endingTimestamp": "1000"}, None),
    ({"endingOffsetsByTimestamp": json.dumps({"TopicA": {"0": 1000, "1": 1000}}), "topics": "TopicA"}, None),
    ({"view": "queues", "topics": "TopicA", "queueIds": "7"}, None),
]


@pytest.mark.parametrize("opts,where", EMPTY, ids=[f"{o}-{w}" for o, w in EMPTY])
def test_a_read_that_selects_nothing_gives_no_rows(spark, store, opts, where):
    df = load(spark, store, **opts)
    if where:
        df = df.filter(where)
    assert df.select("topic").collect() == []
