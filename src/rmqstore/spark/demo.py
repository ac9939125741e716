"""demo_pipeline: read a store with Spark, show a small aggregate, stream from it briefly (for `make demo`)."""
from __future__ import annotations

import os
import shutil
import tempfile
import time


def demo_pipeline(store_path, config=None, spark=None, out=print) -> dict:
    """Batch: messages and bytes per topic, and the three biggest queues. Stream: the store read again as a
    stream (maxOffsetsPerTrigger 500, Trigger.AvailableNow) into a memory sink, batch sizes shown.
    Reads only (no lock taken, nothing written to the store). Returns what it showed."""
    from pyspark.sql import functions as F
    from .session import spark_session
    spark = spark or spark_session(app_name="rmqstore-demo")
    path = os.path.abspath(str(store_path))
    r = spark.read.format("rocketmq")
    if config:
        r = r.option("config", str(config))
    t0 = time.perf_counter()
    df = r.load(path)
    per_topic = (df.groupBy("topic").agg(F.count(F.lit(1)).alias("messages"),
                                         F.sum("storeSize").alias("bytes"),
                                         F.min("storeTimestamp").alias("first"),
                                         F.max("storeTimestamp").alias("last"))
                 .orderBy("topic"))
    out(f"== {path}: messages per topic (spark.read.format('rocketmq'))")
    rows = per_topic.collect()
    per_topic.show(truncate=False)
    top = df.groupBy("topic", "queueId").count().orderBy(F.desc("count"), "topic", "queueId").limit(3).collect()
    out("== biggest queues: " + ", ".join(f"{t['topic']}/{t['queueId']}={t['count']}" for t in top))
    batch_seconds = time.perf_counter() - t0
    # --- a short stream ---------------------------------------------------------------------------------
    ckpt = tempfile.mkdtemp(prefix="rmqstore-demo-ckpt-")
    name = "rmqstore_demo_" + str(int(time.time() * 1000))
    try:
        sr = (spark.readStream.format("rocketmq").option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", "500").option("includeBody", "false"))
        if config:
            sr = sr.option("config", str(config))
        q = (sr.load(path).select("topic", "queueId", "queueOffset").writeStream.format("memory")
             .queryName(name).option("checkpointLocation", ckpt).trigger(availableNow=True).start())
        q.awaitTermination(300)
        sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
        streamed = spark.sql(f"select count(*) as n from {name}").collect()[0]["n"]
        q.stop()
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)
    out(f"== stream: {streamed} messages in {len(sizes)} micro-batches of at most 500 (first batches: {sizes[:5]})")
    return {"store": path, "topics": [r.asDict() for r in rows], "biggest_queues": [t.asDict() for t in top],
            "streamed": int(streamed), "micro_batches": len(sizes), "batch_seconds": round(batch_seconds, 3)}
