"""bench_spark: read throughput of the rocketmq data source against local reading and Parquet, and the
Spark rebuild against the local one, on a store written for the occasion.

    from rmqstore.spark import bench_spark
    print(bench_spark(200_000))

Every read computes the same aggregate over the same messages (count, total body bytes, total properties
entries, max storeTimestamp, distinct topics): Spark must materialise those columns (the Python data source
builds every column; Parquet reads only the four it needs). Times are the best of `repeat` runs after one
warm-up run; MB/s is commitlog bytes (the store's data) per second.
"""
from __future__ import annotations

import os
import random
import shutil
import tempfile
import time

from ..store.conf.config import StoreConfig

TOPICS = ("BenchA", "BenchB", "BenchC", "BenchD")


def bench_config() -> StoreConfig:
    return StoreConfig(mapped_file_size_commit_log=64 << 20, mapped_file_size_consume_queue=300_000 * 20,
                       max_hash_slot_num=500_000, max_index_num=2_000_000)


def write_store(path: str, scale: int, config: StoreConfig, body_size: int = 512, seed: int = 7) -> dict:
    """A store of `scale` messages: 4 topics x 4 queues, bodies of body_size/2..3*body_size/2 bytes, tags,
    keys on half of them, UNIQ_KEY on all."""
    from ..store.format.message import Message
    from ..store.store import MessageStore
    rnd = random.Random(seed)
    blob = random.Random(seed).randbytes(4 << 20)      # bodies do not compress (as real payloads mostly do not)
    t0 = time.perf_counter()
    with MessageStore.open(path, config, start_services=False) as store:
        batch = []
        for i in range(scale):
            n = rnd.randint(body_size // 2, body_size * 3 // 2)
            s = rnd.randrange(0, len(blob) - n)
            props = {"UNIQ_KEY": f"UNIQ{i:024d}", "TAGS": f"tag{i % 7}"}
            if i % 2 == 0:
                props["KEYS"] = f"order-{i} user-{i % 1000}"
            batch.append(Message(TOPICS[i % 4], blob[s:s + n], queue_id=(i // 4) % 4, born_timestamp=1_700_000_000_000 + i,
                                 born_host="10.0.0.1:5000", properties=props))
            if len(batch) == 2000:
                store.put_messages(batch)
                store.dispatcher.do_reput()
                batch = []
        if batch:
            store.put_messages(batch)
        store.wait_dispatched()
        end = store.get_max_phy_offset()
    return {"messages": scale, "bytes": end, "write_seconds": round(time.perf_counter() - t0, 3)}


def _best(fn, repeat: int) -> tuple[float, object]:
    fn()                                   # warm-up
    best, got = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        got = fn()
        best = min(best, time.perf_counter() - t)
    return best, got


def _pair(ours, theirs, repeat: int) -> tuple[float, object, float, object]:
    """(best seconds, answer) of ours and of theirs, run alternately after one warm-up each, so that both
    see the JVM as warm (its JIT keeps speeding up Spark's own code during a run)."""
    ours()
    theirs()
    a = b = float("inf")
    got = want = None
    for _ in range(repeat):
        t = time.perf_counter()
        got = ours()
        a = min(a, time.perf_counter() - t)
        t = time.perf_counter()
        want = theirs()
        b = min(b, time.perf_counter() - t)
    return a, got, b, want


def _agg(df):
    from pyspark.sql import functions as F
    return df.agg(F.count(F.lit(1)).alias("n"), F.sum(F.length("body")).alias("body"),
                  F.sum(F.size("properties")).alias("props"), F.max("storeTimestamp").alias("last"),
                  F.countDistinct("topic").alias("topics")).collect()[0]


def bench_spark(scale: int = 200_000, *, body_size: int = 512, repeat: int = 2, work_dir: str | None = None,
                master: str | None = None, spark=None, keep: bool = False) -> dict:
    """Measure (see the module docstring); returns a dict of numbers."""
    from .session import spark_session
    spark = spark or spark_session(master, app_name="rmqstore-bench")
    work = tempfile.mkdtemp(prefix="rmqstore-bench-", dir=work_dir)
    config = bench_config()
    conf_path = os.path.join(work, "store.conf")
    with open(conf_path, "w") as f:
        f.write(f"mapedFileSizeCommitLog={config.mapped_file_size_commit_log}\n"
                f"mapedFileSizeConsumeQueue={config.mapped_file_size_consume_queue}\n"
                f"maxHashSlotNum={config.max_hash_slot_num}\nmaxIndexNum={config.max_index_num}\n")
    store = os.path.join(work, "store")
    out: dict = {"scale": scale, "body_size": body_size, "master": spark.sparkContext.master,
                 "cores": spark.sparkContext.defaultParallelism}
    try:
        out.update(write_store(store, scale, config, body_size))
        _bench_local(out, store, config, scale, repeat)
        _bench_reads(out, spark, work, store, conf_path, scale, repeat)
        _bench_rebuild(out, spark, work, store, config)
        _bench_triggers(out, store, conf_path, config)        # last: it appends to the store
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            out["work_dir"] = work
    return out


def _rates(out: dict, prefix: str, seconds: float, n: int) -> None:
    """{prefix}_seconds, _msgs_per_s and _MB_per_s (of the commitlog's bytes) into out."""
    out[f"{prefix}_seconds"] = round(seconds, 3)
    out[f"{prefix}_msgs_per_s"] = round(n / seconds)
    out[f"{prefix}_MB_per_s"] = round(out["bytes"] / 1e6 / seconds, 1)


def _bench_local(out: dict, store: str, config, scale: int, repeat: int) -> None:
    """Without Spark: reader.py (a MessageExt per message, body included), and the data source's batch
    parser (headers only, as stats(engine=local))."""
    from ..store.reads.reader import CommitLogReader
    from .stats import local_scan

    def local_reader():
        n = body = 0
        for m in CommitLogReader(store, config).messages():
            n += 1
            body += len(m.body)
        return n
    s, n = _best(local_reader, 1)
    _rates(out, "local_reader", s, n)
    s, _ = _best(lambda: local_scan(store, config), repeat)
    _rates(out, "local_vectorised_headers", s, scale)


def _bench_triggers(out: dict, store: str, conf_path: str, config, triggers: int = 20) -> None:
    """A stream's latestOffset (what Spark asks the source before every micro-batch; no Spark needed): the
    first, on the store nobody holds (its view emulates recovery once), later ones on that unchanged store,
    then while this process holds the store open (live) and appends 100 messages before each trigger.
    Medians in milliseconds; the store gets triggers * 100 more messages (measured after every read)."""
    import statistics

    from ..store.format.message import Message
    from ..store.store import MessageStore
    from .stream import RocketMQStreamReader

    def timed(fn) -> float:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1000
    r = RocketMQStreamReader({"path": store, "config": conf_path, "startingOffsets": "earliest"})
    start = {}
    first = timed(lambda: start.update(r.initialOffset())) + timed(lambda: r.latestOffset(start, None))
    stopped = statistics.median(timed(lambda: r.latestOffset(start, None)) for _ in range(triggers))
    live = []
    with MessageStore.open(store, config) as st:
        for i in range(triggers):
            st.put_messages([Message(TOPICS[j % 4], b"live", queue_id=j % 4) for j in range(100)])
            st.wait_dispatched()
            live.append(timed(lambda: r.latestOffset(start, None)))
        end = r.latestOffset(start, None)
    out["trigger_first_ms"], out["trigger_stopped_ms"] = round(first, 1), round(stopped, 1)
    out["trigger_live_ms"] = round(statistics.median(live), 1)
    out["trigger_live_sees_appends"] = sum(v for tm in end.values() for qm in tm.values()
                                           for v in qm.values()) == out["messages"] + triggers * 100


AGG_COLUMNS = "topic,storeTimestamp,body,properties"     # what _agg reads


def _narrow(df):
    from pyspark.sql import functions as F
    return tuple(df.agg(F.max("queueOffset"), F.countDistinct("topic")).collect()[0])


def _bench_reads(out: dict, spark, work: str, store: str, conf_path: str, scale: int, repeat: int) -> None:
    """The data source against Spark reading the same messages from Parquet, query by query (out["queries"]:
    name, rmqstore seconds, Parquet seconds, same answer), and the Python data source API's floor."""
    def src(**opts):
        r = spark.read.format("rocketmq").option("config", conf_path)
        for k, v in opts.items():
            r = r.option(k, v)
        return r.load(store)
    df = src()
    s, row = _best(lambda: _agg(df), repeat)
    _rates(out, "spark_queue", s, row["n"])
    dfc = src(mode="commitlog")
    s, row2 = _best(lambda: _agg(dfc), repeat)
    _rates(out, "spark_commitlog", s, row2["n"])
    pq = os.path.join(work, "messages.parquet")
    t = time.perf_counter()
    df.write.mode("overwrite").parquet(pq)
    out["parquet_write_seconds"] = round(time.perf_counter() - t, 3)
    out["parquet_MB"] = round(sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(pq)
                                  for f in fs) / 1e6, 1)
    dfp = spark.read.parquet(pq)
    s, row3 = _best(lambda: _agg(dfp), repeat)
    _rates(out, "spark_parquet", s, row3["n"])
    out["same_answer"] = (tuple(row) == tuple(row3)) and row["n"] == scale
    queries = []
    for name, ours, theirs in (
            ("aggregate of body, properties, storeTimestamp, topic: every column built (default)",
             lambda: _agg(df), lambda: _agg(dfp)),
            ("the same aggregate, option columns (only those four read)", lambda: _agg(src(columns=AGG_COLUMNS)),
             lambda: _agg(dfp)),
            ("the same, columns, commitlog order", lambda: _agg(src(columns=AGG_COLUMNS, mode="commitlog")),
             lambda: _agg(dfp)),
            ("narrow: max(queueOffset), countDistinct(topic), option columns",
             lambda: _narrow(src(columns="topic,queueOffset")), lambda: _narrow(dfp)),
            ("count(), option columns=queueOffset", lambda: src(columns="queueOffset").count(), dfp.count),
            ("count() from the queues view (no message read)", lambda: _view_count(src(view="queues")), dfp.count)):
        a, got, b, want = _pair(ours, theirs, repeat + 1)
        queries.append((name, a, b, tuple(got) == tuple(want) if isinstance(got, tuple) else got == want))
    queries += _floor(spark, pq, dfp, repeat)
    out["queries"] = [{"query": q, "rmqstore_seconds": round(a, 3), "parquet_seconds": round(b, 3), "same": ok}
                      for q, a, b, ok in queries]
    _bench_write(out, spark, work, pq, conf_path, scale, repeat)


WRITTEN = "topic,queueId,body,tags,keys,properties,flag,bornTimestamp,bornHost"    # what _bench_write writes


def _bench_write(out: dict, spark, work: str, pq: str, conf_path: str, scale: int, repeat: int) -> None:
    """The rocketmq writer (every row appended as one exactly-once two-phase transaction to a new store)
    against Spark writing the same rows as Parquet, from the Parquet copy (cached): a row of out["queries"]
    whose answer is the number of rows the new store's queues hold."""
    from ..store.store import MessageStore
    df = spark.read.parquet(pq).select(*WRITTEN.split(",")).cache()
    df.count()
    runs = iter(range(1 << 30))
    config = StoreConfig.load(conf_path)

    def ours() -> int:
        d = os.path.join(work, f"written-{next(runs)}")
        df.write.format("rocketmq").mode("append").option("config", conf_path).save(d)
        with MessageStore.open(d, config, start_services=False) as st:
            n = sum(st.get_max_offset_in_queue(t, q) for t, qs in st.topics().items() for q in qs)
        shutil.rmtree(d, ignore_errors=True)
        return n

    def theirs() -> int:
        df.write.mode("overwrite").parquet(os.path.join(work, "written.parquet"))
        return scale
    a, got, b, want = _pair(ours, theirs, repeat)
    df.unpersist()
    out["queries"].append({"query": "write: df.write.format('rocketmq') (exactly once: halves, commit point, "
                                    "commit records) vs df.write.parquet", "rmqstore_seconds": round(a, 3),
                           "parquet_seconds": round(b, 3), "same": got == want})


def _view_count(df) -> int:
    from pyspark.sql import functions as F
    return int(df.agg(F.sum("messages")).collect()[0][0])


FLOOR = "limit, not rmqstore: a Python data source yielding these rows from its workers' memory, "


def _floor(spark, pq: str, dfp, repeat: int) -> list[tuple[str, float, float, bool]]:
    """Query rows (name, seconds, Parquet's seconds, same answer) of a Python data source that only yields
    the Parquet copy's rows as Arrow batches, every column, from its Python workers' memory after the first
    read (ArrowFloorSource), run alternately with Parquet as every query is: what Spark's Python data
    source API costs before any RocketMQ work (for the aggregate, count()); and of count() over it yielding
    one row a partition: what any query through that API costs, whatever it reads."""
    import glob
    files = sorted(glob.glob(os.path.join(pq, "*.parquet")))
    spark.dataSource.register(ArrowFloorSource)

    def floor(one_row: bool):
        return (spark.read.format("arrow_floor").option("files", ",".join(files)).option("oneRow", str(one_row))
                .option("parts", str(spark.sparkContext.defaultParallelism)).load())
    df = floor(False)
    _best(df.count, repeat)                 # every worker reads the files it gets once (more warm-ups)
    rows = []
    for name, ours, theirs in ((FLOOR + "the aggregate (every column)", lambda: _agg(df), lambda: _agg(dfp)),
                               (FLOOR + "count() (every column)", df.count, dfp.count),
                               (FLOOR + "count(), one row a partition: any query's fixed cost",
                                floor(True).count, dfp.count)):
        a, got, b, want = _pair(ours, theirs, repeat + 2)
        rows.append((name, a, b, got == want or "one row" in name))
    return rows


try:
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
except ImportError:  # pragma: no cover - bench_spark needs pyspark anyway
    DataSource = DataSourceReader = object
    InputPartition = None


class _FloorReader(DataSourceReader):
    def __init__(self, files: list[str], parts: int, one_row: bool):
        self.files, self.parts, self.one_row = files, parts, one_row

    def partitions(self):
        return [InputPartition(self.files[i::self.parts]) for i in range(self.parts)]

    def read(self, partition):
        import pyarrow.parquet as pq
        from .records import ARROW_SCHEMA
        for f in partition.value:
            if f not in _FLOOR_BATCHES:          # kept in this Python worker (Spark reuses its workers)
                t = pq.read_table(f).replace_schema_metadata(None).cast(ARROW_SCHEMA)
                _FLOOR_BATCHES[f] = t.to_batches(8192)
            if self.one_row:
                yield _FLOOR_BATCHES[f][0].slice(0, 1)
                return
            yield from _FLOOR_BATCHES[f]


_FLOOR_BATCHES: dict[str, list] = {}


class ArrowFloorSource(DataSource):
    """The floor of bench_spark: rows of Parquet files (option files) read by pyarrow once per Python worker,
    then yielded from memory as they are (option oneRow=true: one row a partition)."""

    @classmethod
    def name(cls) -> str:
        return "arrow_floor"

    def schema(self) -> str:
        from .records import SPARK_DDL
        return SPARK_DDL

    def reader(self, schema):
        return _FloorReader(self.options["files"].split(","), int(self.options.get("parts", "2")),
                            self.options.get("oneRow", "false").lower() == "true")


def _bench_rebuild(out: dict, spark, work: str, store: str, config) -> None:
    """Rebuilding consume queues and index: the local engine and Spark, on copies of the store."""
    from ..store.repair.rebuild import rebuild_store
    from .rebuild import rebuild_spark
    a, b = os.path.join(work, "rebuild-local"), os.path.join(work, "rebuild-spark")
    shutil.copytree(store, a)
    shutil.copytree(store, b)
    t = time.perf_counter()
    rebuild_store(a, config)
    out["rebuild_local_seconds"] = round(time.perf_counter() - t, 3)
    t = time.perf_counter()
    rs = rebuild_spark(b, config, spark=spark)
    out["rebuild_spark_seconds"] = round(time.perf_counter() - t, 3)
    out["rebuild_spark_tasks"] = rs["tasks"]
    out["rebuild_same_queues"] = _same_tree(os.path.join(a, "consumequeue"), os.path.join(b, "consumequeue"))


def _same_tree(a: str, b: str) -> bool:
    def files(root):
        out = {}
        for dp, _, fs in os.walk(root):
            for f in fs:
                p = os.path.join(dp, f)
                with open(p, "rb") as fh:
                    out[os.path.relpath(p, root)] = fh.read()
        return out
    return files(a) == files(b)
