"""rmqstore on Apache Spark (PySpark >= 4.0, Python Data Source API): read, stream and write RocketMQ stores,
rebuild their consume queues and index in parallel, and compute per-queue statistics.

    from rmqstore.spark import register
    register(spark)
    df = (spark.read.format("rocketmq")
          .option("config", "broker.conf")          # a store.conf / broker.conf (StoreConfig.load)
          .option("topics", "TopicA,TopicB")
          .load("/data/broker-a/store"))            # or a glob, or load([path, path]): one DataFrame

Columns: topic, queueId, queueOffset, commitLogOffset, storeSize, bodyCRC, flag, sysFlag, bornTimestamp,
storeTimestamp, bornHost, storeHost, reconsumeTimes, preparedTransactionOffset, msgId, body (the fields
of RocketMQ's MessageExt), tags, keys (KEYS split on spaces), properties, broker (the store directory's
name; its parent's when it is called `store`).

Read options (batch and stream):

=====================  ==========================================================================
mode                   queue (default): the messages of the consume queues, as a consumer gets them
                       (for a store nobody has open: as MessageStore.open serves them after recovery);
                       commitlog: every record of the commitlog files, transaction halves included
topics                 comma list of topics (unknown topic: error)
subscribePattern       a regular expression topics must match entirely
queueIds               comma list of queue ids
startingOffsets        earliest (batch default), latest (stream default), or JSON {"topic": {"0": 23}}
                       (-2 earliest, -1 latest; unlisted queues start at earliest, an unknown queue fails);
                       with several stores also {"broker": {"topic": {"0": 23}}}
endingOffsets          latest (default) or JSON, exclusive (batch only)
startingTimestamp      epoch ms or ISO-8601: as Kafka's, each queue starts at its first message stored at or
endingTimestamp        after the time (binary search over the queue's store times); the end is exclusive;
                       endingTimestamp is for batch reads
startingOffsetsByTimestamp / endingOffsetsByTimestamp   JSON {"topic": {"0": epoch ms}}, per queue
startingOffsetsByTimestampStrategy   error (default: a queue with no message at or after the time fails
                       the read) or latest (such a queue starts at its end); no such end offset: latest
failOnDataLoss         true (default): messages the read should return but cannot (deleted or missing
                       commitlog files, offsets before a queue's first, a damaged middle commitlog file, a
                       body failing checkCRC) fail it, naming store, queue and offsets; false: skipped with a
                       warning naming them, and counted: rmqstore.spark.skipped_data(spark) ->
                       {"ranges": n, "messages": m} for the session
checkCRC               true (default, as Kafka's check.crcs) / false: check returned bodies against BODYCRC
minPartitions          at least this many partitions (queues are split; mode=commitlog: files cut at record
                       starts, pieces.py), as Kafka's; otherwise one per core
                       of the session (register(spark) tells it), 8 when unknown
minOffsetsPerTrigger   stream: wait until this many messages are there, at most maxTriggerDelay (15m)
view                   queues: one row per queue (broker, topic, queueId, minOffset, maxOffset, messages,
                       firstStoreTimestamp, lastStoreTimestamp) from the consume queues, no scan
includeBody            true (default) / false: body is null (saves the copy)
columns                only these columns (comma-separated): the others are not decoded (Spark 4.3 tells a
                       Python source nothing of the columns a query needs)
config                 path of a store.conf / broker.conf (geometry; needed for key lookups)
key                    only the messages the store finds for this key: the index (read-only) answers,
                       then topic and key are checked, as MessageStore.find_messages_by_key does
                       (without its result cap; indexed prepared messages included; batch only)
maxOffsetsPerTrigger   stream: at most this many messages per micro-batch (ReadMaxRows)
rowsPerPartition       queue mode: units per partition (default 200000)
pushFilters            refused when true (it returned wrong rows: see below); false is accepted
=====================  ==========================================================================

Filters: the reader claims none, Spark applies every filter itself, and a DataFrame can be reused for any
query. Option pushFilters=true (claim the filters Spark pushes and prune with them) was removed: PySpark 4.3
stores the read planned during filter pushdown on the DataFrame's relation (PythonScanBuilder.pushFilters ->
PythonDataSourceV2.setReadInfo) and reuses it for a later query of the SAME DataFrame that has no pushable
filter, so df.filter(topic = 'A').count() then df.count() counted topic A only, and no data source can tell
the two queries apart. Prune with the options instead (topics, queueIds, startingOffsets..., which belong to
the relation).
"""
from __future__ import annotations


__all__ = ["register", "spark_session", "skipped_data", "rebuild_spark", "stats", "demo_pipeline", "bench_spark",
           "recover_writes"]


from .session import register, spark_session  # noqa: E402 - the public names of this package


def skipped_data(spark) -> dict:
    """{"ranges", "messages"} that reads and streams of this session skipped with failOnDataLoss=false."""
    from .loss import skipped_data as _s
    return _s(spark)


def rebuild_spark(store_path, config=None, master: str | None = None, spark=None, conf: dict | None = None) -> dict:
    from .rebuild import rebuild_spark as _r
    return _r(store_path, config, master=master, spark=spark, conf=conf)


def recover_writes(store_path, config=None) -> list[dict]:
    """End the two-phase appends a killed Spark writer left open in a store (see spark/transaction.py)."""
    from .transaction import recover_writes as _w
    return _w(store_path, config)


def stats(store_path, engine: str = "local", plot=None, config=None, spark=None) -> list[dict]:
    from .stats import stats as _s
    return _s(store_path, engine=engine, plot=plot, config=config, spark=spark)


def demo_pipeline(store_path, config=None, spark=None) -> dict:
    from .demo import demo_pipeline as _d
    return _d(store_path, config=config, spark=spark)


def bench_spark(scale: int = 200_000, **kw) -> dict:
    from .bench import bench_spark as _b
    return _b(scale, **kw)
