"""The SparkSession side of rmqstore.spark: register the data source, or make a session set up for it."""
from __future__ import annotations

import os
import sys


def register(spark) -> None:
    """Register the `rocketmq` data source with this SparkSession: a subclass of RocketMQDataSource made for
    the session's SparkContext, carrying its skipped-data accumulator (loss.py: skipped_data(spark)) and its
    default parallelism (reads are split into that many partitions or more: plan.partition_rows). Also lets
    `df.write.format("rocketmq").save(STORE)` run in Spark's default save mode, as Kafka's sink does
    (save_mode.py: PySpark's DataFrameWriter sends it as Append)."""
    from . import save_mode
    from .datasource import RocketMQDataSource
    from .loss import session_counter
    save_mode.install_for(spark)
    cls = type("RocketMQDataSource", (RocketMQDataSource,), {"loss_counter": session_counter(spark),
                                                              "parallelism": _parallelism(spark),
                                                              "__module__": __name__})
    sc, exe = _worker_python(spark)
    if exe is None:
        spark.dataSource.register(cls)
        return
    # the source's Python workers (planning, reads, writes, streams) run exe: Spark takes the interpreter of a
    # Python function from the SparkContext when the function is wrapped, here at registration
    before = sc.pythonExec
    sc.pythonExec = exe
    try:
        spark.dataSource.register(cls)
    finally:
        sc.pythonExec = before


def _worker_python(spark) -> tuple:
    """(SparkContext, the interpreter the source's Python workers should run) when that is this driver's
    (sys.executable): a local master (workers on this machine) whose session names none (neither
    PYSPARK_PYTHON nor spark.pyspark.python), where Spark would start `python3` from the PATH, often another
    Python without rmqstore (a script run as .venv/bin/python). Else (None, None): Spark's choice stands."""
    try:
        sc = spark.sparkContext
        conf = sc.getConf()
        local = conf.get("spark.master", "").startswith("local")
        named = os.environ.get("PYSPARK_PYTHON") or conf.get("spark.pyspark.python", None)
    except Exception:       # noqa: BLE001 - Spark Connect: no SparkContext, the server's workers
        return None, None
    if not local or named or sc.pythonExec == sys.executable:
        return None, None
    return sc, sys.executable


def _parallelism(spark) -> int | None:
    """The session's spark.default.parallelism (its cores on a local master); None where the session has no
    SparkContext to ask (Spark Connect)."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:       # noqa: BLE001 - Spark Connect raises its own errors for sparkContext
        return None


HIDE_TRACEBACK = "spark.sql.execution.pyspark.udf.hideTraceback.enabled"   # planner and task workers alike


def spark_session(master: str | None = None, app_name: str = "rmqstore", conf: dict | None = None):
    """The active SparkSession, or a new one (master default local[*]) set up for rmqstore: executors run
    this Python (PYSPARK_PYTHON, for a local master only: a cluster's executors run their own Python, which
    needs rmqstore installed), UI off, few shuffle partitions, Python workers' errors without their
    traceback (an option error is then its one line). The data source is registered."""
    from pyspark.sql import SparkSession
    if (master or "local[*]").startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    active = SparkSession.getActiveSession()
    if active is not None and master is None:
        register(active)
        return active
    b = (SparkSession.builder.appName(app_name).master(master or "local[*]")
         .config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "4")
         .config("spark.sql.session.timeZone", "UTC")
         .config(HIDE_TRACEBACK, "true"))
    for k, v in (conf or {}).items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    register(spark)
    return spark
