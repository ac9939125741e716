"""Issue 40, items 5, 6 and 7 on a plain SparkSession (SparkSession.builder + register): what a user of Spark's
Kafka source types. A write in Spark's default save mode appends (it failed asking for Append or Overwrite,
then refused Overwrite without saying why); startingOffsets past a queue's end fails a batch read as
Kafka's does (it read an empty queue silently) and is data loss for a stream; subscribe, subscribePattern
and assign select as Kafka's do; Kafka-only options say what serves instead; an option error is one line,
and nothing more where Spark allows it (hideTraceback); PushedFilters are shown by explain("formatted"), as
the documentation says, not by explain()."""
from __future__ import annotations

import re

import json

import pytest

from conftest import local_spark

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from rmqstore import MessageBatch, MessageStore, StoreConfig  # noqa: E402

pytestmark = pytest.mark.spark
CFG = StoreConfig(mapped_file_size_commit_log=1 << 20)
SIZES = {("A", 0): 25, ("A", 1): 25, ("A", 2): 25, ("A", 3): 25, ("B", 0): 10, ("B", 1): 10, ("C", 0): 5}
HIDE = "spark.sql.execution.pyspark.udf.hideTraceback.enabled"


@pytest.fixture(scope="module")
def spark():
    return local_spark("rmqstore-test-kafka-habits", **{"spark.sql.python.filterPushdown.enabled": "true"})


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Topics A (4 queues of 25), B (2 of 10), C (1 of 5), and the store.conf beside it."""
    root = tmp_path_factory.mktemp("habits") / "b" / "store"
    with MessageStore.open(root, CFG) as st:
        for t in ("A", "B", "C"):
            qids = [q for (tt, q), n in SIZES.items() if tt == t for _ in range(n)]
            st.put_messages(MessageBatch(t, [b"m%d" % i for i in range(len(qids))], queue_ids=qids, keys="k"))
        assert st.wait_dispatched()
    (root.parent / "store.conf").write_text(CFG.to_properties())
    return root


def _read(spark, store, **opts):
    r = spark.read.format("rocketmq").option("config", str(store.parent / "store.conf"))
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load(str(store))


def _queues(df) -> dict:
    return {(r.topic, r.queueId): r["count"] for r in df.groupBy("topic", "queueId").count().collect()}


def _error(fn) -> str:
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException
    with pytest.raises((PySparkException, Py4JJavaError)) as e:
        fn()
    return str(e.value)


# --- item 5: save modes ------------------------------------------------------------------------------
def test_the_default_save_mode_appends_as_kafkas_sink(spark, tmp_path):
    df = spark.createDataFrame([("T", b"a"), ("T", b"b")], "topic string, body binary")
    df.write.format("rocketmq").save(str(tmp_path / "s"))          # no mode: Spark's ErrorIfExists (other
    # spellings of it: test_other_formats_keep_sparks_save_modes)
    for mode, meaning in (("overwrite", "it would delete every message of the store before writing"),
                          ("ignore", "it would write nothing when the store exists")):
        err = _error(lambda: df.write.format("rocketmq").mode(mode).save(str(tmp_path / "s")))
        assert f"save mode '{mode}' is not allowed for the rocketmq sink: {meaning}" in err, err
        assert "allowed: 'append' and 'errorifexists'" in err
    # a writer that bypasses PySpark's DataFrameWriter (the JVM's, as Spark Connect or SQL use) meets the
    # sink's own refusal of Overwrite, with the same words
    err = _error(lambda: df._jdf.write().format("rocketmq").mode("overwrite").save(str(tmp_path / "s")))
    assert "save mode 'overwrite' is not allowed for the rocketmq sink: it would delete" in err
    assert spark.read.format("rocketmq").load(str(tmp_path / "s")).count() == 2


def test_other_formats_keep_sparks_save_modes():
    """The wrapper register() puts on PySpark's DataFrameWriter changes the mode of rocketmq saves only."""
    from rmqstore.spark import save_mode

    class Writer:                                  # DataFrameWriter's three methods, recording what Spark gets
        def format(self, source):
            self.source = source
            return self

        def mode(self, saveMode):
            self.saved_mode = saveMode
            return self

        def save(self, path=None, format=None, mode=None, partitionBy=None, **options):
            self.sent = (format or self.source, mode if mode is not None else getattr(self, "saved_mode", None))

    save_mode.install(Writer)
    save_mode.install(Writer)                      # once: a second register() wraps nothing again
    for fmt, mode, sent in (("parquet", None, None), ("parquet", "error", "error"), ("rocketmq", None, "append"),
                            ("RocketMQ", "ErrorIfExists", "append"), ("rocketmq", "append", "append")):
        w = Writer().format(fmt)
        (w.mode(mode) if mode else w).save("/p")
        assert w.sent == (fmt, sent), (fmt, mode, w.sent)


# --- item 6: offsets past the end ------------------------------------------------------------------
def test_starting_offsets_past_a_queues_end_fail_a_batch_read(spark, store):
    err = _error(lambda: _read(spark, store, startingOffsets=json.dumps({"A": {"1": 90}})).count())
    assert "beginning offset 90 is after the ending offset 25 for queue A/1 (its offsets: 0..25)" in err, err
    err = _error(lambda: _read(spark, store, startingOffsets=json.dumps({"B": {"0": 7}}),
                               endingOffsets=json.dumps({"B": {"0": 3}})).count())
    assert "beginning offset 7 is after the ending offset 3 for queue B/0" in err, err
    # at the end, or the end given as the start: nothing to read, as Kafka's (from == until)
    assert _read(spark, store, topics="A", startingOffsets=json.dumps({"A": {"1": 25}})).count() == 75
    assert _read(spark, store, startingOffsets=json.dumps({"B": {"0": 4}}),
                 endingOffsets=json.dumps({"B": {"0": 4}}), topics="B").count() == 10


def test_a_stream_starting_past_the_end_is_data_loss(spark, store, tmp_path):
    from pyspark.errors import StreamingQueryException
    q = (spark.readStream.format("rocketmq").option("config", str(store.parent / "store.conf"))
         .option("topics", "C").option("startingOffsets", json.dumps({"C": {"0": 9}})).load(str(store))
         .writeStream.format("memory").queryName("past_end").trigger(availableNow=True)
         .option("checkpointLocation", str(tmp_path / "cp")).start())
    with pytest.raises(StreamingQueryException, match="startingOffsets 9 is after the queue's end 5"):
        q.awaitTermination(300)


# --- item 6: Kafka's subscription options ------------------------------------------------------------
def test_subscribe_subscribe_pattern_and_assign_select_as_kafkas(spark, store):
    assert _queues(_read(spark, store, subscribe="A, C")) == {k: n for k, n in SIZES.items() if k[0] in "AC"}
    assert _queues(_read(spark, store, subscribePattern="[BC]")) == {k: n for k, n in SIZES.items() if k[0] in "BC"}
    want = {("A", 0): 25, ("A", 3): 25, ("B", 1): 10}
    assign = json.dumps({"A": [0, 3], "B": [1]})
    assert _queues(_read(spark, store, assign=assign)) == want
    assert _queues(_read(spark, store, assign=assign, mode="commitlog")) == want       # a walk of every record
    view = _read(spark, store, assign=assign, view="queues").collect()
    assert {(r.topic, r.queueId): r.messages for r in view} == want
    keyed = _read(spark, store, key="k", assign=json.dumps({"B": [1]})).collect()      # the index's hits too
    assert {(r.topic, r.queueId) for r in keyed} == {("B", 1)} and len(keyed) == 10


OPTION_ERRORS = [
    ({"subscribe": "A", "topics": "B"}, "options 'topics' and 'subscribe' exclude each other"),
    ({"subscribe": "A", "assign": '{"B": [0]}'}, "options 'subscribe' and 'assign' exclude each other"),
    ({"subscribe": " , "}, "option 'subscribe' names no topic"),
    ({"subscribePattern": " "}, "option 'subscribePattern' is empty"),
    ({"assign": "A"}, 'option \'assign\' must be JSON like {"topicA": [0, 1], "topicB": [2]}'),
    ({"assign": '{"A": [7]}'}, "option 'assign': the store has no queue A/7 (queues of A: [0, 1, 2, 3])"),
    ({"assign": '{"Z": [0]}'}, "option 'assign': unknown topic 'Z'"),
    ({"assign": '{"A": [0]}', "queueIds": "1"}, "option 'queueIds' selects queues of every topic"),
    ({"kafka.bootstrap.servers": "h:9092"}, "option 'kafka.bootstrap.servers' of Spark's Kafka source has no "
                                            "meaning here: a store is read from its files"),
    ({"includeHeaders": "true"}, "the properties column always holds the messages' properties"),
    ({"topcs": "A"}, "unknown option 'topcs' of the rocketmq data source (did you mean 'topics'?)"),
]


def test_option_errors_say_what_is_wrong(store):
    """Each option error's line (options.parse, what the source's schema() runs when the DataFrame is made)."""
    from rmqstore.spark import options as O
    for opts, line in OPTION_ERRORS:
        with pytest.raises(O.OptionError) as e:
            O.parse({"path": str(store), **opts})
        assert line in str(e.value) and "\n" not in str(e.value), (opts, str(e.value))


def test_option_errors_reach_the_user_as_one_line(spark, store):
    """Through Spark, an option error is the last line of Spark's message (after the Python traceback of the
    worker that planned the read); with Spark's hideTraceback it is all of it beyond Spark's error class."""
    err = _error(lambda: _read(spark, store, topcs="A"))
    assert "Traceback" in err and [x for x in err.splitlines() if x.strip()][-2 if "SQLSTATE" in err else -1] \
        .startswith("rmqstore.spark.options.OptionError: unknown option 'topcs'"), err
    spark.conf.set(HIDE, "true")
    try:
        for opts, line in (OPTION_ERRORS[1], OPTION_ERRORS[-1]):
            err = _error(lambda: _read(spark, store, **opts))
            assert line in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2, (opts, err)
    finally:
        spark.conf.unset(HIDE)


# --- item 7: where explain shows the pushed filters ---------------------------------------------------
def test_explain_shows_spark_applying_every_filter(spark, store):
    """The reader claims no filter (option pushFilters=true is refused: it answered wrong rows on a reused
    DataFrame): explain shows Spark's own Filter above the scan, no PushedFilters, and the docs say so."""
    df = _read(spark, store).filter("topic = 'A' AND queueId = 1")
    formatted = spark._jvm.PythonSQLUtils.explainString(df._jdf.queryExecution(), "formatted")
    assert re.search(r"Condition : .*\(topic#\d+ = A\)", formatted), formatted
    assert not any(ln.startswith("PushedFilters:") and "EqualTo" in ln for ln in formatted.splitlines()), formatted
    assert df.count() == SIZES[("A", 1)]
    from conftest import doc_pages
    docs = " ".join(" ".join(page.read_text().split()) for page in doc_pages())
    assert "The reader claims no filter: Spark applies every filter itself" in docs
