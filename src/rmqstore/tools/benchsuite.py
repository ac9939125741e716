"""The comparison suite behind `make bench`: rmqstore against RocketMQ 4.4.0's own store, sqlite3, queuelib,
persist-queue and the plain-write / in-memory limits, every system of a workload in the same run. Writes a
report and a bar chart: BENCHMARKS.md and benchmarks/results.png at scale full, benchmarks/work/
BENCHMARKS-SCALE.md and results-SCALE.png at the other scales (a small run never overwrites the committed
full-scale report).

    python -m rmqstore.tools.benchsuite --scale small|full [--out FILE.md] [--chart FILE.png]

Workloads (sizes per scale in SCALES; full = the sizes of issue #7):

- append_100B / append_1KiB   async-flush appends: rmqstore one put_message per message and put_messages
  batches of 1000 (commitlog only; the "+ dispatch" row adds building consume queues and key index),
  sqlite3 (WAL, synchronous=NORMAL, executemany in transactions of 1000, index on key), queuelib
  FifoDiskQueue.push, persist-queue Queue.put, os.write of the same commitlog bytes in the same batches,
  bytearray.extend of them;
- sync_append   every put durable before it returns: rmqstore SYNC_FLUSH (group commit) from 1, 4 and 16
  producer threads, sqlite3 synchronous=FULL one transaction per message, os.write + fsync per message and
  per 16 messages;
- consume       read everything back by queue (on the append_100B data): rmqstore batch_read (list of bytes,
  and one buffer + offsets), rmqstore get_message 32 at a time, sqlite SELECT in order, queuelib pop,
  persist-queue get;
- key_lookup    p50/p99 of single key lookups on the append_100B data;
- restart       MessageStore.open of the append_100B store after a clean shutdown and after SIGKILL;
- e2e           put_messages with the dispatcher running until wait_dispatched; dispatcher lag sampled;
- long_poll     consumer.measure_long_polling_latency;
- rocketmq      RocketMQ 4.4.0's DefaultMessageStore (../shared/reference/, run when built: $RMQSTORE_REFERENCE
                or ~/.cache/rmqstore-reference/refbench) with the same 100 B messages: put one at a time, put +
                dispatch, SYNC_FLUSH from 1 and 16 threads; its rows join the tables above and a side-by-side
                table; when it is not built the report says so and how to build it (no figure is quoted);
- spark, server (full scale only) bench_spark / bench_server, as rows with ratios;
- acl (full scale only)  suite/acl.py: `rmqstore serve` with plain ACL on (every request signed by
                the client, checked by the server) beside the same sends with it off; one check in process.
- grpc (full scale only)  bench_grpc (the official Python 5.x client over gRPC: send, receive + ack) beside
                the server step's remoting rows, ratios against remoting async send.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .bench import machine_info
from .suite.acl import AclWorkloads
from .suite.appends import AppendWorkloads
from .suite.filters import FilterWorkloads
from .suite.common import REFERENCE_BUILD, ROCKETMQ, SCALES, Table, _fmt_rate, find_reference, run_reference
from .suite.lifecycle import LifecycleWorkloads
from .suite.reads import ReadWorkloads
from .suite.reference import ReferenceWorkloads, server_table, spark_table
from .suite.scale import ScaleWorkloads

__all__ = ["REFERENCE_BUILD", "SCALES", "Suite", "Table", "default_outputs", "find_reference", "main", "render_chart",
           "render_markdown", "run_reference", "server_table", "spark_table"]


class Suite(AppendWorkloads, ReadWorkloads, LifecycleWorkloads, ReferenceWorkloads, AclWorkloads, FilterWorkloads,
            ScaleWorkloads):
    """Every workload of the suite (one mixin per group, in suite/), run in order into tables."""

    def __init__(self, scale: str, work: Path, log=print):
        self.scale = scale
        self.p = SCALES[scale]
        self.work = work
        self.log = log
        self.tables: list[Table] = []
        self.state: dict = {}

    def dir(self, name) -> Path:
        d = self.work / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    def run(self, only=None):
        steps = [("append_100B", self.append_100), ("append_1KiB", self.append_1k), ("sync_append", self.sync_append),
                 ("consume", self.consume), ("key_lookup", self.key_lookup), ("restart", self.restart),
                 ("e2e", self.e2e), ("long_poll", self.long_poll), ("rocketmq", self.rocketmq)]
        if self.p["extras"]:
            steps += [("spark", self.spark), ("server", self.server), ("grpc", self.grpc), ("acl", self.acl),
                      ("sql92", self.sql92), ("ha", self.ha)]
        if self.scale == "huge":        # the scale curve alone (suite/scale.py)
            steps = [("scale", self.scale_curve)]
        try:
            for name, fn in steps:
                if only and name not in only:
                    continue
                t0 = time.perf_counter()
                self.log(f"[benchsuite] {name} ...")
                try:
                    table = fn()
                except Exception as e:  # noqa: BLE001 - a workload that fails is reported, not fatal
                    table = Table(name, name, "", True)
                    table.error("(workload)", e)
                table.seconds = time.perf_counter() - t0
                self.tables.append(table)
                self.log(f"[benchsuite] {name}: {table.seconds:.1f} s  "
                         + "; ".join(f"{r.system}={r.text}" for r in table.rows))
        finally:
            for s in self.state.pop("stores", []):
                try:
                    s.close()
                except Exception:  # noqa: BLE001
                    pass
        return self.tables


# --- targets -------------------------------------------------------------------------------------
def targets(tables: list[Table], scale: str, n_100: int) -> list[tuple[str, str, str, bool | None]]:
    by = {t.key: t for t in tables}

    def v(key, system_prefix):
        t = by.get(key)
        if t is None:
            return None
        for r in t.rows:
            if r.system.startswith(system_prefix) and r.value is not None:
                return r.value
        return None

    out = []

    def add(name, measured, fmt, ok):
        out.append((name, fmt if measured is not None else "not measured", None if measured is None else ok))

    a, am, b = v("append_100B", "rmqstore MessageBatch"), v("append_100B", "rmqstore put_messages ("), \
        v("append_100B", "sqlite3")
    ratio = a / b if a and b else None
    add("batched append >= 5x sqlite3 batched inserts (100 B, MessageBatch)", ratio,
        f"{ratio:.1f}x" + (f" (lists of Messages: {am / b:.1f}x)" if am else "") if ratio else "",
        ratio and ratio >= 5)
    c = v("consume", "rmqstore batch_read (list")
    add("consume by queue >= 1,000,000 msg/s (batched)", c, _fmt_rate(c) if c else "", c and c >= 1e6)
    k = v("key_lookup", "rmqstore find_messages_by_key")
    add("key lookup p99 < 100 us (find_messages_by_key)", k, f"{k:,.1f} us" if k else "", k is not None and k < 100)
    a1, w1 = v("append_1KiB", "rmqstore put_messages ("), v("append_1KiB", "limit: os.write")
    r1 = w1 / a1 if a1 and w1 else None
    add("1 KiB async appends within 2x of plain sequential write", r1,
        f"os.write / rmqstore = {r1:.1f}x" if r1 else "", r1 is not None and r1 <= 2)
    rs = v("restart", "rmqstore open after SIGKILL")
    add("restart after SIGKILL of 1M messages < 5 s", rs,
        f"{rs:.2f} s" + ("" if n_100 >= 1_000_000 else f" (store of {n_100:,} messages at this scale)") if rs else "",
        rs is not None and rs < 5)
    lp = v("long_poll", "rmqstore median")
    add("long-poll median < 5 ms", lp, f"{lp:.2f} ms" if lp else "", lp is not None and lp < 5)
    e, em = v("e2e", "rmqstore MessageBatch put + dispatch"), v("e2e", "rmqstore put + dispatch")
    rq = v("e2e", ROCKETMQ)
    er = e / rq if e and rq else None
    add(f"end to end (MessageBatch) faster than {ROCKETMQ}'s put + dispatch, measured in this run", er,
        f"{_fmt_rate(e)} / {_fmt_rate(rq)} = {er:.2f}x" + (f" (lists of Messages: {em / rq:.2f}x)" if em else "")
        if er else ("RocketMQ not run (reference not built)" if e else ""), er is not None and er > 1)
    s1, s16 = v("sync_append", "rmqstore SYNC_FLUSH, 1 "), v("sync_append", "rmqstore SYNC_FLUSH, 16")
    g = s16 / s1 if s1 and s16 else None
    add("sync flush: 16 threads several (>= 3) times 1 thread (group commit)", g, f"{g:.1f}x" if g else "",
        g is not None and g >= 3)
    return out


# --- report --------------------------------------------------------------------------------------
def cpu_calibration(n: int = 10_000_000) -> float:
    """Seconds this interpreter takes for n additions in a Python loop: how fast the cores were during a run,
    to compare runs by (this VM's speed varies by day)."""
    t0 = time.perf_counter()
    s = 0
    for i in range(n):
        s += i
    return time.perf_counter() - t0


def _machine_md(work: Path, calibration_start: float | None = None) -> list[str]:
    m = machine_info()
    try:
        df = subprocess.run(["df", "-hT", str(work)], capture_output=True, text=True).stdout.strip().splitlines()
    except OSError:
        df = []
    load = os.getloadavg()
    lines = [f"- CPU: {m.get('cpu', '?')}, nproc {os.cpu_count()}"
             + (f" ({m['cores_usable']} usable)" if "cores_usable" in m else ""),
             f"- memory: {m.get('memory_gib', '?')} GiB",
             f"- Python {m['python']} ({m['implementation']}), {m['platform']}; sqlite {sqlite3.sqlite_version}"]
    if len(df) >= 2:
        lines.append(f"- work dir `{work}` on: `{df[1]}` (df -hT: filesystem type size used avail use% mount)")
    lines.append(f"- load average at the end of the run: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    cal = cpu_calibration()
    lines.append(f"- CPU calibration (cpu_calibration: 10,000,000 additions in a Python loop): "
                 + (f"{calibration_start:.2f} s at the start of the run, " if calibration_start else "")
                 + f"{cal:.2f} s at the end; the CPU-bound figures scale with it")
    return lines


EXPLANATIONS = Path(__file__).resolve().parents[3] / "benchmarks" / "explanations.md"
# the scale curve (make bench SCALE=huge, suite/scale.py): its own run writes this section of BENCHMARKS.md
# in place; a full run carries it over from the page it replaces
SCALE_BEGIN = "<!-- scale curve: written by `make bench SCALE=huge`, kept by the full run -->"
SCALE_END = "<!-- end of scale curve -->"


def explanations() -> list[str]:
    """The hand-written section (benchmarks/explanations.md), or nothing outside a source checkout."""
    try:
        return EXPLANATIONS.read_text().rstrip().splitlines()
    except OSError:
        return []


def scale_section(page: str) -> str | None:
    """The scale curve section of a BENCHMARKS.md (markers included), or None."""
    a, b = page.find(SCALE_BEGIN), page.find(SCALE_END)
    return page[a:b + len(SCALE_END)] if 0 <= a < b else None


def with_scale_section(page: str, section: str) -> str:
    """page with its scale curve section replaced by section (appended when it has none)."""
    old = scale_section(page)
    if old is not None:
        return page.replace(old, section)
    return page.rstrip("\n") + "\n\n" + section + "\n"


def _cmp(a, b):
    return f"{a / b:.1f}x faster than" if a >= b else f"{b / a:.1f}x slower than"


def reading(tables: list[Table]) -> list[str]:
    """A short reading of the figures, computed from them (wins and losses both)."""
    by = {t.key: t for t in tables}

    def v(key, prefix):
        t = by.get(key)
        for r in (t.rows if t else []):
            if r.system.startswith(prefix) and r.value:
                return r.value
        return None

    return _reading_appends(v) + _reading_sync_and_reads(v) + _reading_lifecycle(v)


def _reading_appends(v) -> list[str]:
    out = []
    cmp = _cmp
    rb, rs, rq, rw = (v("append_100B", "rmqstore put_messages ("), v("append_100B", "sqlite3"),
                      v("append_100B", "queuelib"), v("append_100B", "limit: os.write"))
    rd = v("append_100B", "rmqstore put_messages + dispatch")
    rc = v("append_100B", "rmqstore MessageBatch")
    if rc and rs:
        out.append(f"- Appends of 100 B as columns (MessageBatch): {cmp(rc, rs)} sqlite3's batched inserts "
                   f"({rc / rs:.1f}x; target 5x), {rc / rb:.1f}x the same batches given as lists of Messages."
                   if rb else f"- Appends of 100 B as columns (MessageBatch): {cmp(rc, rs)} sqlite3.")
    if rb and rs:
        out.append(f"- Appends of 100 B: rmqstore batched (lists of Messages) is {cmp(rb, rs)} sqlite3's batched, "
                   f"indexed inserts ({rb / rs:.1f}x); once the consume queues and key index are built too "
                   f"(the fair comparison with sqlite's index) it is {cmp(rd, rs)} sqlite."
                   + (f" queuelib's FifoDiskQueue (body only, no index, no metadata) is {rq / rb:.1f}x faster "
                      f"than rmqstore batched." if rq and rq > rb else "")
                   + (f" A plain os.write of the same bytes is {rw / rb:.1f}x faster." if rw else ""))
    kb, ks, kw = (v("append_1KiB", "rmqstore put_messages ("), v("append_1KiB", "sqlite3"),
                  v("append_1KiB", "limit: os.write"))
    if kb and ks and kw:
        out.append(f"- Appends of 1 KiB: rmqstore batched is {cmp(kb, ks)} sqlite3, and os.write of "
                   f"the same bytes ran at {kw / kb:.1f}x rmqstore's rate (target: at most 2x).")
    return out


def _reading_sync_and_reads(v) -> list[str]:
    out = []
    cmp = _cmp
    o1, o16, sf = (v("sync_append", "rmqstore SYNC_FLUSH, 1 "), v("sync_append", "rmqstore SYNC_FLUSH, 16"),
                   v("sync_append", "sqlite3"))
    if o1 and o16:
        out.append(f"- Sync flush: group commit lifts 16 producer threads to {o16 / o1:.1f}x one thread"
                   + (f"; rmqstore with 16 threads is {cmp(o16, sf)} sqlite3 FULL with one "
                      f"transaction per message, with 1 thread {cmp(o1, sf)} it." if sf else ".")
                   + " os.write + fsync per 16 messages shows how much more batching the disk would take.")
    cb, cg, cs = (v("consume", "rmqstore batch_read (list"), v("consume", "rmqstore get_message"),
                  v("consume", "sqlite3"))
    if cb and cs:
        out.append(f"- Consume: the batched path (batch_read) is {cmp(cb, cs)} sqlite's ordered SELECT; "
                   f"the per-message get_message path (decoding every message into a MessageExt) is "
                   f"{cmp(cg, cs) if cg else '?'} it: consumers that need every property pay for it.")
    kf, ks2 = v("key_lookup", "rmqstore find"), v("key_lookup", "sqlite3")
    if kf and ks2:
        out.append(f"- Key lookups: p99 {kf:,.1f} us for find_messages_by_key against {ks2:,.1f} us for sqlite's "
                   f"B-tree (p50s in the table; rmqstore's figure includes decoding the whole "
                   f"message and re-checking topic and key).")
    return out


def _reading_lifecycle(v) -> list[str]:
    out = []
    cmp = _cmp
    r1, r2 = v("restart", "rmqstore open after clean"), v("restart", "rmqstore open after SIGKILL")
    if r1 and r2:
        out.append(f"- Restart: {r1:.2f} s after a clean shutdown, {r2:.2f} s after SIGKILL (what recovery re-did "
                   f"is in the recovery line under the table).")
    e, ec = v("e2e", "rmqstore put + dispatch"), v("e2e", "rmqstore MessageBatch put + dispatch")
    rq = v("e2e", ROCKETMQ)
    if e:
        out.append(f"- End to end (puts with the consume queues and key index built as they go): {e:,.0f} msg/s with "
                   f"lists of Messages" + (f", {ec:,.0f} msg/s with MessageBatch" if ec else "")
                   + (f"; {ROCKETMQ}'s own store, run in this run on this machine, did {rq:,.0f} msg/s "
                      f"(rmqstore {cmp(ec or e, rq)} it)" if rq else f"; {ROCKETMQ} was not run (not built)")
                   + ". In rmqstore the dispatcher and the puts compete for one core's worth of Python (the GIL).")
    one, rone = v("append_100B", "rmqstore put_message (1"), v("append_100B", ROCKETMQ)
    if one and rone:
        out.append(f"- One message per put_message call: rmqstore {one:,.0f} msg/s, {ROCKETMQ} {rone:,.0f} msg/s "
                   f"(rmqstore {cmp(one, rone)} it)" + (": a call into Python costs microseconds that a JIT-compiled "
                   "Java call does not; give put_messages a batch when you can." if one < rone else "."))
    lp = v("long_poll", "rmqstore median")
    if lp:
        out.append(f"- Long polling: median {lp:.2f} ms from send to listener.")
    return out


def render_markdown(tables: list[Table], scale: str, work: Path, total_seconds: float, machine: list[str],
                    load_start, chart: str | None) -> str:
    p = SCALES[scale]
    out = ["# rmqstore benchmarks", "",
           f"Generated by `python -m rmqstore.tools.benchsuite --scale {scale}` (`make bench SCALE={scale}`) on "
           f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}; the whole run took {total_seconds:.0f} s.",
           f"**Scale: {scale}** ({p['n_100']:,} x 100 B, {p['n_1k']:,} x 1 KiB, {p['n_sync']:,} sync puts, "
           f"{p['lookups']:,} key lookups, {p['e2e']:,} end to end). Every system of a table ran in the same run, "
           "one after the other, on the same machine. One run each: expect a few % of noise (more when other "
           "processes load the cores).", "",
           "## Machine", ""] + machine + [
           f"- load average at the start of the run: {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}",
           ""]
    if chart:
        out += [f"![results]({chart})", "", "The chart: one panel per table below, bars in msg/s, us, s or ms "
                "as the panel's axis says (its value printed on each bar); red = rmqstore, orange = RocketMQ "
                "4.4.0's own store run in this run, blue = other systems, grey = limits of this machine (plain "
                "writes and memory copies of the same bytes).", ""]
    for t in tables:
        if t.key == "rocketmq":
            out += render_compare(t)
    tg = targets(tables, scale, p["n_100"])
    out += ["## Targets", "", "| target | measured | |", "|---|---|---|"]
    for name, meas, ok in tg:
        out.append(f"| {name} | {meas} | {'MET' if ok else ('NOT MET' if ok is not None else 'n/a')} |")
    out.append("")
    for t in tables:
        if t.key == "rocketmq":
            continue
        out += [f"## {t.title}", ""]
        if t.compare:
            out += render_beside(t, *BESIDE.get(t.key, ("Parquet (Spark's own reader)", "query")))
        ref = t.ref_value()
        if t.unit:
            better = "higher is better" if t.higher_better else "lower is better"
            out += [f"Ratio = this row's {t.unit} / the rmqstore reference row's ({better}); run time "
                    f"{t.seconds:.1f} s.", ""]
        out += ["| system | figure(s) | ratio to rmqstore |", "|---|---|---|"]
        for r in t.rows:
            ratio = "" if (r.value is None or not ref) else ("1.00 (reference)" if r.ref else f"{r.value / ref:.2f}")
            cell = lambda x: str(x).replace("|", "\\|").replace("\n", " ")   # noqa: E731
            out.append(f"| {cell(r.system)} | {cell(r.text)} | {ratio} |")
        out.append("")
        for nt in t.notes:
            out += [nt, ""]
    out += ["## Reading", ""] + reading(tables) + [""] + explanations()
    return "\n".join(out)


def render_scale_section(tables: list[Table], total_seconds: float, machine: list[str], load_start) -> str:
    """The scale curve's section of BENCHMARKS.md (between SCALE_BEGIN and SCALE_END), its run described."""
    out = [SCALE_BEGIN, "## Open time by store size (the scale curve)", "",
           f"Generated by `make bench SCALE=huge` (`python -m rmqstore.tools.benchsuite --scale huge`) on "
           f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}, a run of its own ({total_seconds / 60:.0f} min; the stores "
           "take up to 24 GB): rmqstore and RocketMQ 4.4.0's own store write the same number of messages, then "
           "each opens its store clean and after a SIGKILL, in the same run, one after the other "
           "(src/rmqstore/tools/suite/scale.py says how).", "",
           f"Its machine: load average {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f} at the start; "
           + "; ".join(m.lstrip("- ") for m in machine if "load average" in m or "calibration" in m), ""]
    for t in tables:
        for nt in t.notes:
            out += [nt, ""]
    out.append(SCALE_END)
    return "\n".join(out)


def render_compare(t: Table) -> list[str]:
    """The side-by-side table: workload | RocketMQ 4.4.0 | rmqstore | rmqstore / RocketMQ | limit."""
    out = [f"## {t.title}", "",
           "Every figure in msg/s of 100 B messages, higher is better; ratio = rmqstore / RocketMQ (above 1: "
           "rmqstore is faster). Limit: what this machine's disk or memory allows for the same bytes, measured "
           "in this run (the workload tables below).", "",
           f"| workload | {ROCKETMQ} | rmqstore | rmqstore / RocketMQ | limit on this machine |",
           "|---|---|---|---|---|"]
    for c in t.compare:
        out.append(f"| {c.workload} | {c.rocketmq_text} | {_fmt_rate(c.rmqstore) if c.rmqstore else 'not measured'} "
                   f"| {f'{c.ratio:.2f}x' if c.ratio else 'n/a'} | {c.limit} |")
    out.append("")
    for nt in t.notes:
        out += [nt, ""]
    return out


BESIDE = {"ha": ("RocketMQ 4.4.0 (a Java master and slave)", "workload")}     # table key -> (other, what)


def render_beside(t: Table, other: str, what: str) -> list[str]:
    """A table's compare lines as: what | other | rmqstore | rmqstore / other (msg/s, above 1: faster)."""
    out = [f"Every figure in msg/s, higher is better; ratio = rmqstore / {other.split(' ')[0]} (above 1: rmqstore "
           "is faster; 0.50: it takes twice the time).", "",
           f"| {what} | {other} | rmqstore | rmqstore / {other.split(' ')[0]} |", "|---|---|---|---|"]
    for c in t.compare:
        ratio = f"{c.ratio:.2f}x" if c.ratio else "n/a"
        mine = c.rmqstore_text or (_fmt_rate(c.rmqstore) if c.rmqstore else "not measured")
        out.append(f"| {c.workload} | {c.rocketmq_text} | {mine} | {ratio}{' ' + c.limit if c.limit else ''} |")
    return out + ["", "Every way of reading, beside the reference row:", ""]


COLOURS = {"rmqstore": "#d62728", "rocketmq": "#ff7f0e", "other": "#1f77b4", "limit": "#9a9a9a"}
LEGEND = {"rmqstore": "rmqstore", "rocketmq": "RocketMQ 4.4.0's own store (Java), same run",
          "other": "other systems (sqlite3, queuelib, persist-queue, Parquet)",
          "limit": "limits: plain write / memory copy of the same bytes"}
UNIT_WORDS = {"msg/s": "messages per second", "us": "p99 latency, microseconds", "s": "seconds",
              "ms": "milliseconds"}


def _human(v: float, unit: str) -> str:
    """A short figure for a bar: 1.23M, 456k, 12.3 (unit msg/s); 12.3 us, 0.123 s, 1.23 ms."""
    if unit == "msg/s":
        for div, suf in ((1e6, "M"), (1e3, "k")):
            if v >= div:
                return f"{v / div:.3g}{suf}"
        return f"{v:.3g}"
    return f"{v:.3g} {unit}"


def render_chart(tables: list[Table], path: Path, scale: str) -> None:
    """One horizontal bar panel per table with figures (two columns): every label whole (wrapped), the value
    printed on each bar, a linear axis (log with ticks at 1-2-5 when a panel's values span more than 20x),
    colours by kind of system (COLOURS) and a legend saying what they mean."""
    import textwrap

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker as mt
    from matplotlib.patches import Patch
    shown = [t for t in tables if t.unit and t.key != "rocketmq" and any(r.value for r in t.rows if r.chart)]
    cols = 2
    nrows = max(1, -(-len(shown) // cols))
    bars = [[len([r for r in t.rows if r.chart and r.value]) for t in shown[i * cols:(i + 1) * cols]]
            for i in range(nrows)]
    heights = [0.42 * max(b, default=1) + 1.3 for b in bars]
    fig, axes = plt.subplots(nrows, cols, figsize=(16, sum(heights) + 1.2), squeeze=False, layout="constrained",
                             gridspec_kw={"height_ratios": heights})
    for ax in axes.flat[len(shown):]:
        ax.set_visible(False)
    for ax, t in zip(axes.flat, shown):
        rs = [r for r in t.rows if r.chart and r.value]
        vals = [r.value for r in rs]
        cont = ax.barh(range(len(rs)), vals, color=[COLOURS[r.category()] for r in rs])
        ax.set_yticks(range(len(rs)))
        ax.set_yticklabels([textwrap.fill(r.system, 38) for r in rs], fontsize=7.5)
        ax.invert_yaxis()
        ax.bar_label(cont, labels=[_human(v, t.unit) for v in vals], padding=3, fontsize=7.5)
        lo, hi = min(vals), max(vals)
        if hi / max(lo, 1e-12) > 20:
            ax.set_xscale("log")
            spread = hi / max(lo, 1e-12)
            subs = (1.0,) if spread > 3000 else ((1.0, 3.0) if spread > 300 else (1.0, 2.0, 5.0))
            ax.xaxis.set_major_locator(mt.LogLocator(base=10, subs=subs))
            ax.xaxis.set_minor_locator(mt.NullLocator())
            ax.set_xlim(lo / 2, hi * 6)
        else:
            ax.set_xlim(0, hi * 1.25)
        ax.xaxis.set_major_formatter(mt.FuncFormatter(lambda x, _pos, u=t.unit: _human(x, u).replace(f" {u}", "")))
        ax.set_xlabel(f"{UNIT_WORDS.get(t.unit, t.unit)} ({'higher' if t.higher_better else 'lower'} is better)",
                      fontsize=8)
        ax.set_title(textwrap.fill(t.title, 80), fontsize=9, loc="left")
        ax.tick_params(axis="x", labelsize=7.5)
        ax.grid(axis="x", alpha=0.3)
    kinds = {r.category() for t in shown for r in t.rows if r.chart and r.value}
    leg = fig.legend(handles=[Patch(color=COLOURS[k], label=LEGEND[k]) for k in COLOURS if k in kinds],
                     loc="outside upper center", ncol=4, fontsize=9.5, frameon=False,
                     title=f"rmqstore benchmarks, scale {scale}: every system of a panel measured in the same run",
                     title_fontsize=12)
    leg.get_title().set_fontweight("bold")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def default_outputs(scale: str) -> tuple[str, str]:
    """(report, chart) paths: the committed BENCHMARKS.md and benchmarks/results.png at scale full; scale huge
    writes its section of BENCHMARKS.md (no chart); other scales go to benchmarks/work/ (gitignored)."""
    if scale == "full":
        return "BENCHMARKS.md", "benchmarks/results.png"
    if scale == "huge":             # its own section of BENCHMARKS.md, no chart
        return "BENCHMARKS.md", ""
    return f"benchmarks/work/BENCHMARKS-{scale}.md", f"benchmarks/work/results-{scale}.png"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rmqstore.tools.benchsuite", description=__doc__.split("\n")[0])
    ap.add_argument("--scale", choices=sorted(SCALES), default="small")
    ap.add_argument("--out", default=None, help="the report (default: BENCHMARKS.md at scale full, else "
                    "benchmarks/work/BENCHMARKS-SCALE.md, so a small run never overwrites the committed one)")
    ap.add_argument("--chart", default=None, help="the chart (default: benchmarks/results.png at scale full, else "
                    "benchmarks/work/results-SCALE.png)")
    ap.add_argument("--work", default=None, help="where the stores go (default: a temporary directory, removed)")
    ap.add_argument("--only", default=None, help="comma-separated workloads (default: all)")
    args = ap.parse_args(argv)
    out_default, chart_default = default_outputs(args.scale)
    args.out = args.out or out_default
    args.chart = args.chart if args.chart is not None else chart_default
    load_start = os.getloadavg()
    calibration = cpu_calibration()
    work = Path(tempfile.mkdtemp(prefix="rmqstore-benchsuite-", dir=args.work))
    t0 = time.perf_counter()
    try:
        suite = Suite(args.scale, work, log=lambda s: print(s, file=sys.stderr, flush=True))
        tables = suite.run(only=set(args.only.split(",")) if args.only else None)
        machine = _machine_md(work, calibration)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    total = time.perf_counter() - t0
    out = Path(args.out)
    chart = Path(args.chart) if args.chart else None
    rel = None
    if chart is not None:
        render_chart(tables, chart, args.scale)
        try:
            rel = os.path.relpath(chart, out.parent)
        except ValueError:
            rel = str(chart)
    previous = out.read_text() if out.exists() else ""
    if args.scale == "huge":        # the scale curve: its section of the page, the rest kept
        md = render_scale_section(tables, total, machine, load_start)
        page = with_scale_section(previous, md) if previous else md + "\n"
    else:
        md = render_markdown(tables, args.scale, work, total, machine, load_start, rel)
        kept = scale_section(previous)
        page = md + ("\n\n" + kept if kept else "") + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page)
    print(md)
    print(f"[benchsuite] report written to {out}" + (f", chart to {chart}" if chart else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
