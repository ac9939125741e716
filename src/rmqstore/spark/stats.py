"""Per-queue statistics of a store: message count, bytes, first and last store time, messages per minute.

    stats("/data/broker-a/store", engine="local", plot="rate.png")

engine="local" reads the store in this process (the data source's read-only view and batch parser, no
Spark; bodies and properties are not even cut out); engine="spark" runs the same aggregation as a Spark
job over spark.read.format("rocketmq"). Both read the messages of the consume queues (mode=queue), as the
store serves them (a store nobody has open: as after recovery).

Each result row: broker, topic, queueId, messages, bytes (sum of storeSize), firstStoreTime and
lastStoreTime (epoch ms), messagesPerMinute = messages / max(minutes from first to last, 1): the rate over
the queue's active span, over at least one minute. The plot (matplotlib, Agg) shows messages per minute per
topic over time.
"""
from __future__ import annotations

import logging
import os

import numpy as np

from ..config import StoreConfig

log = logging.getLogger(__name__)


def _row(broker, topic, qid, n, nbytes, first, last) -> dict:
    minutes = max((last - first) / 60000.0, 1.0) if n else 1.0
    return {"broker": broker, "topic": topic, "queueId": int(qid), "messages": int(n), "bytes": int(nbytes),
            "firstStoreTime": int(first) if n else None, "lastStoreTime": int(last) if n else None,
            "messagesPerMinute": round(n / minutes, 3)}


def local_scan(store_path, config: StoreConfig | None = None):
    """(rows, per-minute counts {topic: {minute: n}}) computed in this process."""
    from . import records as R
    from . import storeview as SV
    from .scan import StoreRef, _records_at, Partition
    view = SV.load_view(os.path.abspath(str(store_path)), config)
    ref = StoreRef.of(view)
    part = Partition("queue", ref, [], [])
    rows, minutes = [], {}
    cache = SV.FileCache()
    try:
        for (topic, qid), qv in sorted(view.queues.items()):
            offs, sizes = qv.units(qv.min_offset, qv.end)
            ok = (sizes > 0) & (sizes != SV.BLANK_SIZE) & (offs >= max(view.cl_min, 0))
            offs, sizes = offs[ok], sizes[ok]
            n = nbytes = 0
            first, last = None, None
            ts_parts = []
            for recs in _records_at(part, cache, offs, sizes, f"units of {topic}/{qid}"):
                n += len(recs)
                nbytes += int(recs.total.sum())
                ts_parts.append(recs.store_ts)
            if ts_parts:
                ts = np.concatenate(ts_parts)
                first, last = int(ts.min()), int(ts.max())
                m, c = np.unique(ts // 60000, return_counts=True)
                tm = minutes.setdefault(topic, {})
                for k, v in zip(m.tolist(), c.tolist()):
                    tm[k] = tm.get(k, 0) + v
            rows.append(_row(view.broker, topic, qid, n, nbytes, first or 0, last or 0))
    finally:
        cache.close()
    return rows, minutes


def spark_scan(store_path, config_path: str | None = None, spark=None):
    from pyspark.sql import functions as F
    if spark is None:
        from . import spark_session
        spark = spark_session(app_name="rmqstore-stats")
    else:
        from . import register
        register(spark)
    r = spark.read.format("rocketmq").option("includeBody", "false")
    if config_path:
        r = r.option("config", config_path)
    df = r.load(os.path.abspath(str(store_path)))
    ms = F.unix_millis("storeTimestamp")
    agg = (df.groupBy("broker", "topic", "queueId")
           .agg(F.count(F.lit(1)).alias("n"), F.sum("storeSize").alias("bytes"), F.min(ms).alias("first"),
                F.max(ms).alias("last"))
           .orderBy("broker", "topic", "queueId").collect())
    rows = [_row(a["broker"], a["topic"], a["queueId"], a["n"], a["bytes"], a["first"], a["last"]) for a in agg]
    per = (df.groupBy("topic", F.floor(ms / 60000).alias("minute")).count().collect())
    minutes: dict = {}
    for p in per:
        minutes.setdefault(p["topic"], {})[int(p["minute"])] = int(p["count"])
    return rows, minutes


def plot_rates(minutes: dict, out: str, title: str = "messages per minute") -> str:
    """A line (with markers) per topic: messages stored in each minute."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from datetime import datetime, timezone
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for topic in sorted(minutes):
        pts = sorted(minutes[topic].items())
        xs = [datetime.fromtimestamp(m * 60, tz=timezone.utc) for m, _ in pts]
        ax.plot(xs, [c for _, c in pts], marker="o", label=topic)
    ax.set_title(title)
    ax.set_ylabel("messages / minute")
    ax.set_xlabel("store time (UTC)")
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M"))
    if minutes:
        ax.legend(fontsize="small")
    ax.grid(True, alpha=0.3)
    fig.autofmt_xdate()
    import warnings
    with warnings.catch_warnings():          # topic names in scripts the default font lacks (CJK)
        warnings.filterwarnings("ignore", message="Glyph .* missing from font")
        fig.tight_layout()
        fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def stats(store_path, engine: str = "local", plot: str | None = None, config=None, spark=None) -> list[dict]:
    """Per (topic, queue) statistics (module docstring), sorted by topic and queue; plot: a PNG path.

    config: a StoreConfig or the path of a store.conf (geometry; optional for stats)."""
    config_path = None
    if isinstance(config, (str, os.PathLike)):
        config_path = str(config)
        config = StoreConfig.load(config_path)
    if engine == "local":
        rows, minutes = local_scan(store_path, config)
    elif engine == "spark":
        if config is not None and config_path is None:
            log.info("engine=spark reads the geometry from the files (a StoreConfig object is not passed on)")
        rows, minutes = spark_scan(store_path, config_path, spark)
    else:
        raise ValueError(f"engine must be local or spark, got {engine!r}")
    if plot:
        plot_rates(minutes, str(plot), title=f"{os.path.basename(os.path.abspath(str(store_path)))}: messages per minute")
    return rows
