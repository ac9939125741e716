"""Per-queue statistics of a store: message count, bytes, first and last store time, messages per minute.

    stats("/data/broker-a/store", engine="local", plot="rate.png")

engine="local" reads the store in this process (the data source's read-only view and batch parser, no
Spark; bodies and properties are not even cut out); engine="spark" runs the same aggregation as a Spark
job over spark.read.format("rocketmq"). Both read the messages of the consume queues (mode=queue), as the
store serves them (a store nobody has open: as after recovery).

Each result row: broker, topic, queueId, messages, bytes (sum of storeSize), firstStoreTime and
lastStoreTime (epoch ms), messagesPerMinute = messages / max(minutes from first to last, 1): the rate over
the queue's active span, over at least one minute. The plot (matplotlib, Agg) shows messages per time bin
per topic over time, the bin and the axis fitted to the data's span (plot_rates).
"""
from __future__ import annotations

import logging
import os

import numpy as np

from ..store.files import store_fs
from ..store.conf.config import StoreConfig

log = logging.getLogger(__name__)


def _store_arg(store_path) -> str:
    """A local path made absolute; a URI (s3://..., store.store_fs) as it is."""
    p = str(store_path)
    return p if store_fs.is_remote(p) else os.path.abspath(store_fs.local_path(p))


def _row(broker, topic, qid, n, nbytes, first, last) -> dict:
    minutes = max((last - first) / 60000.0, 1.0) if n else 1.0
    return {"broker": broker, "topic": topic, "queueId": int(qid), "messages": int(n), "bytes": int(nbytes),
            "firstStoreTime": int(first) if n else None, "lastStoreTime": int(last) if n else None,
            "messagesPerMinute": round(n / minutes, 3)}


def local_scan(store_path, config: StoreConfig | None = None):
    """(rows, per-second counts {topic: {epoch second: n}}) computed in this process."""
    from . import records as R
    from . import storeview as SV
    from .scan import StoreRef, _records_at, Partition
    view = SV.load_view(_store_arg(store_path), config)
    ref = StoreRef.of(view)
    part = Partition("queue", ref, [], [])
    part.fail_on_data_loss = False      # statistics count what can be read; the rest is logged as a warning
    rows, minutes = [], {}
    cache = SV.FileCache() if ref.fs is None else store_fs.RangeReader(ref.fs)
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
                m, c = np.unique(ts // 1000, return_counts=True)
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
        from .session import spark_session
        spark = spark_session(app_name="rmqstore-stats")
    else:
        from .session import register
        register(spark)
    r = spark.read.format("rocketmq").option("includeBody", "false")
    if config_path:
        r = r.option("config", config_path)
    df = r.load(_store_arg(store_path))
    ms = F.unix_millis("storeTimestamp")
    agg = (df.groupBy("broker", "topic", "queueId")
           .agg(F.count(F.lit(1)).alias("n"), F.sum("storeSize").alias("bytes"), F.min(ms).alias("first"),
                F.max(ms).alias("last"))
           .orderBy("broker", "topic", "queueId").collect())
    rows = [_row(a["broker"], a["topic"], a["queueId"], a["n"], a["bytes"], a["first"], a["last"]) for a in agg]
    per = (df.groupBy("topic", F.floor(ms / 1000).alias("second")).count().collect())
    minutes: dict = {}
    for p in per:
        minutes.setdefault(p["topic"], {})[int(p["second"])] = int(p["count"])
    return rows, minutes


CJK_FONT_PACKAGES = "fonts-noto-cjk or fonts-wqy-zenhei (Debian/Ubuntu), google-noto-sans-cjk-fonts (Fedora)"
_warned_glyphs: set = set()


def _font_for(texts) -> tuple[list[str], str]:
    """(font families, missing): the matplotlib font list that draws every character of texts, and the
    characters no installed font has ("" when all are covered). DejaVu Sans first; a font with CJK glyphs
    (any installed one that has them: Noto CJK, WenQuanYi, Droid Sans Fallback, ...) after it as a fallback."""
    from matplotlib import font_manager as fm
    from matplotlib.ft2font import FT2Font
    chars = sorted({c for t in texts for c in str(t) if ord(c) > 0x2FF})
    if not chars:
        return ["DejaVu Sans"], ""

    def covers(path):
        if "LastResort" in os.path.basename(path):    # matplotlib's own font of boxes claims every char
            return set()
        try:
            cmap = FT2Font(path).get_charmap()
        except Exception:  # noqa: BLE001 - an unreadable font file covers nothing
            return set()
        return {c for c in chars if ord(c) in cmap}

    families, left = ["DejaVu Sans"], set(chars) - covers(fm.findfont("DejaVu Sans"))
    for f in sorted(fm.fontManager.ttflist, key=lambda f: ("CJK" not in f.name and "WenQuanYi" not in f.name, f.name)):
        if not left:
            break
        got = covers(f.fname) & left
        if got and f.name not in families and not f.name.startswith("Last Resort"):   # boxes for all
            families.append(f.name)
            left -= got
    if left:   # installed after matplotlib's font cache was built: look at the system's font files too
        known = {f.fname for f in fm.fontManager.ttflist}
        for path in sorted(fm.findSystemFonts()):
            if not left:
                break
            got = covers(path) & left if path not in known else set()
            if got:
                fm.fontManager.addfont(path)
                name = fm.FontProperties(fname=path).get_name()
                if name not in families:
                    families.append(name)
                left -= got
    return families, "".join(sorted(left))


def _time_axis(ax, first_ms: int, last_ms: int, bin_s: int = 1) -> None:
    """Ticks and labels fitted to the data's span, padded by 5 % or one bin (times of day with seconds
    for a span under 10 minutes, dates for days), never the years matplotlib's default picks for one point."""
    import matplotlib.dates as mdates
    from datetime import datetime, timedelta, timezone
    span = (last_ms - first_ms) / 1000.0
    lo = datetime.fromtimestamp(first_ms / 1000.0, tz=timezone.utc)
    hi = datetime.fromtimestamp(last_ms / 1000.0, tz=timezone.utc)
    pad = timedelta(seconds=max(span * 0.05, bin_s))
    ax.set_xlim(lo - pad, hi + pad)
    loc = mdates.AutoDateLocator(minticks=3, maxticks=8)
    ax.xaxis.set_major_locator(loc)
    fmt = "%H:%M:%S" if span < 600 else ("%m-%d %H:%M" if span < 3 * 86400 else "%Y-%m-%d")
    ax.xaxis.set_major_formatter(mdates.DateFormatter(fmt, tz=timezone.utc))
    day = lo.strftime("%Y-%m-%d") if lo.date() == hi.date() else f"{lo:%Y-%m-%d} to {hi:%Y-%m-%d}"
    ax.set_xlabel(f"store time (UTC, {day})")


BINS = ((1, "second"), (5, "5 seconds"), (10, "10 seconds"), (30, "30 seconds"), (60, "minute"),
        (300, "5 minutes"), (600, "10 minutes"), (1800, "30 minutes"), (3600, "hour"), (6 * 3600, "6 hours"),
        (86400, "day"), (7 * 86400, "week"))


def pick_bin(first_s: int, last_s: int, max_points: int = 120) -> tuple[int, str]:
    """(seconds, name) of the smallest bin from BINS that cuts [first_s, last_s] into at most max_points."""
    for sec, name in BINS:
        if (last_s - first_s) / sec <= max_points:
            return sec, name
    return BINS[-1]


def plot_rates(per_second: dict, out: str, title: str | None = None, name: str = "") -> str:
    """Draws draw_rates(per_second, title, name) into the PNG out; returns out."""
    import matplotlib.pyplot as plt
    fig = draw_rates(per_second, title, name, where=out)
    import warnings
    with warnings.catch_warnings(), _quiet_font_log():   # missing glyphs: reported once, by name, in _font_for's caller
        warnings.filterwarnings("ignore", message="Glyph .* missing from font")
        fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


class _quiet_font_log:
    """matplotlib logs "findfont: Failed to find font weight normal" for CJK fonts that come in medium only."""
    def __enter__(self):
        self.logger = logging.getLogger("matplotlib.font_manager")
        self.level = self.logger.level
        self.logger.setLevel(logging.ERROR)

    def __exit__(self, *exc):
        self.logger.setLevel(self.level)


def draw_rates(per_second: dict, title: str | None = None, name: str = "", where: str = "plot"):
    """The figure of plot_rates: a line (with markers) per topic, messages stored per time bin, the bin
    (1 s ... 1 week, BINS) fitted to the data's span so the plot has up to ~120 points; per_second is
    {topic: {epoch second: n}}. The time axis spans the data (padded by one bin or 5 %); topic names are
    drawn with an installed font that has their glyphs (CJK: Noto CJK, WenQuanYi, ...); when none has them,
    one warning per set of missing characters (logged, naming `where`) names the characters
    and the package to install, and the figure is still drawn."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from datetime import datetime, timezone
    from matplotlib.font_manager import FontProperties
    secs = [x for t in per_second.values() for x in t]
    width, unit = pick_bin(min(secs), max(secs)) if secs else (60, "minute")
    binned: dict = {}
    for topic, counts in per_second.items():
        b = binned.setdefault(topic, {})
        for sec, n in counts.items():
            k = sec // width * width
            b[k] = b.get(k, 0) + n
    title = title or f"{name + ': ' if name else ''}messages stored per {unit}"
    families, missing = _font_for(list(binned) + [title])
    if missing and missing not in _warned_glyphs:
        _warned_glyphs.add(missing)
        msg = (f"{where}: no installed font has the glyphs {missing!r} (topic names); they are drawn as boxes. "
               f"Install a font that has them (for Chinese, Japanese, Korean: {CJK_FONT_PACKAGES})")
        log.warning(msg)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for topic in sorted(binned):
        pts = sorted(binned[topic].items())
        xs = [datetime.fromtimestamp(m, tz=timezone.utc) for m, _ in pts]
        ax.plot(xs, [c for _, c in pts], marker="o", label=f"{topic} ({sum(c for _, c in pts):,})")
    ax.set_title(title, fontfamily=families)
    ax.set_ylabel(f"messages per {unit}")
    if secs:
        _time_axis(ax, min(secs) // width * width * 1000, max(secs) // width * width * 1000, width)
        ax.legend(prop=FontProperties(family=families, size="small"), title="topic (messages)")
        ax.set_ylim(bottom=0)
    else:
        ax.text(0.5, 0.5, "no messages", ha="center", va="center", transform=ax.transAxes)
    ax.grid(True, alpha=0.3)
    fig.autofmt_xdate()
    import warnings
    with warnings.catch_warnings(), _quiet_font_log():   # missing glyphs: reported once above, by name
        warnings.filterwarnings("ignore", message="Glyph .* missing from font")
        fig.tight_layout()
    return fig


def stats(store_path, engine: str = "local", plot: str | None = None, config=None, spark=None) -> list[dict]:
    """Per (topic, queue) statistics (module docstring), sorted by topic and queue; plot: a PNG path.

    config: a StoreConfig or the path of a store.conf (geometry; optional for stats)."""
    config_path = None
    if isinstance(config, (str, os.PathLike)):
        config_path = str(config)
        config = StoreConfig.load(config_path, reading=True)
    if engine == "local":
        rows, minutes = local_scan(store_path, config)
    elif engine == "spark":
        if config is not None and config_path is None:
            log.info("engine=spark reads the geometry from the files (a StoreConfig object is not passed on)")
        rows, minutes = spark_scan(store_path, config_path, spark)
    else:
        raise ValueError(f"engine must be local or spark, got {engine!r}")
    if plot:
        plot_rates(minutes, str(plot), name=os.path.basename(store_fs.display_uri(_store_arg(store_path))))
    return rows
