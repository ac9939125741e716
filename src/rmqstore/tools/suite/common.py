"""What the benchmark suite's workloads share: sizes per scale, the result tables (Row, Table, Compare), the
RocketMQ reference benchmark's runner, and small helpers (rates, a GC pause, stores opened for a workload)."""
from __future__ import annotations

import gc
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ...store.conf.config import StoreConfig


TOPIC = "BenchTopic"
QUEUES = 4
BATCH = 1000
SCALES = {
    # tiny: the test's scale (structure, not speed)
    "tiny": dict(n_100=3000, n_1k=1000, n_sync=48, lookups=300, e2e=3000, longpoll=10, queue_cap=3000, pq_cap=1000,
                 file_size=16 << 20, extras=False),
    "small": dict(n_100=100_000, n_1k=20_000, n_sync=960, lookups=5000, e2e=100_000, longpoll=100,
                  queue_cap=100_000, pq_cap=10_000, file_size=1 << 30, extras=False),
    "full": dict(n_100=1_000_000, n_1k=200_000, n_sync=4800, lookups=20_000, e2e=1_000_000, longpoll=200,
                 queue_cap=1_000_000, pq_cap=50_000, file_size=1 << 30, extras=True),
}
SCALES["huge"] = dict(SCALES["full"], extras=False)     # the scale curve alone: suite/scale.py's sizes
REFERENCE_BUILD = ("apt-get install -y libcommons-lang3-java libjna-java libnetty-java; fetch the public repository "
                   "github:RtwChina/RocketMQ_Fork (RocketMQ 4.4.0's release jars); "
                   "bash ../shared/reference/build.sh GIT_DIR (see ../shared/reference/README.md)")
ROCKETMQ = "RocketMQ 4.4.0"


def find_reference() -> Path | None:
    """The built RocketMQ 4.4.0 reference benchmark (../shared/reference/): $RMQSTORE_REFERENCE, else
    ~/.cache/rmqstore-reference/refbench; None when it is not there (not built on this machine)."""
    env = os.environ.get("RMQSTORE_REFERENCE")
    p = Path(env) if env else Path.home() / ".cache" / "rmqstore-reference" / "refbench"
    if p.is_dir():
        p = p / "refbench"
    return p if p.is_file() and os.access(p, os.X_OK) else None


def run_reference(binary: Path, work: Path, mode: str, n: int, size: int, arg: int, timeout: float = 1800) -> dict:
    """One run of RocketMQ 4.4.0's own store (`refbench bench DIR N SIZE 0` or `refbench syncbench DIR N SIZE
    THREADS`) in a fresh directory under work, removed afterwards; its JSON answer. Raises RuntimeError
    naming the command when it fails or prints no JSON."""
    import json
    d = work / f"rocketmq-{mode}-{n}-{arg}"
    shutil.rmtree(d, ignore_errors=True)
    cmd = [str(binary), mode, str(d), str(n), str(size), str(arg)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        raise RuntimeError(f"`{' '.join(cmd)}` exited with {r.returncode}: {(r.stderr or r.stdout)[-300:]!r}")
    return json.loads(lines[-1])


# --- results -------------------------------------------------------------------------------------
@dataclass
class Row:
    system: str
    value: float | None          # the figure the ratio and the chart use
    text: str = ""               # the figure(s) as shown
    ref: bool = False            # the rmqstore row the ratios are taken against
    chart: bool = True
    kind: str = ""               # "rocketmq" | "limit" | "other" | "rmqstore" ("" = from the system's name)

    def category(self) -> str:
        if self.kind:
            return self.kind
        if self.system.startswith(ROCKETMQ):
            return "rocketmq"
        if self.system.startswith("limit"):
            return "limit"
        return "rmqstore" if self.system.startswith("rmqstore") else "other"


@dataclass
class Table:
    key: str
    title: str
    unit: str                    # of Row.value
    higher_better: bool
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    compare: list["Compare"] = field(default_factory=list)   # side-by-side lines (RocketMQ's table, Spark's)

    def add(self, system, value, text="", **kw):
        self.rows.append(Row(system, value, text, **kw))

    def error(self, system, exc):
        self.rows.append(Row(system, None, f"ERROR: {type(exc).__name__}: {exc}"[:300]))

    def ref_value(self):
        for r in self.rows:
            if r.ref and r.value:
                return r.value
        return None

    def get(self, system):
        for r in self.rows:
            if r.system == system:
                return r.value
        return None


@dataclass
class Compare:
    """One line of the side-by-side table: a workload, RocketMQ's figure and rmqstore's (msg/s, this run)."""
    workload: str
    rocketmq: float | None
    rmqstore: float | None
    limit: str = ""
    rocketmq_text: str = ""         # (the other system's figure as shown, when the table is not RocketMQ's)
    rmqstore_text: str = ""

    @property
    def ratio(self) -> float | None:
        return self.rmqstore / self.rocketmq if self.rocketmq and self.rmqstore else None


def _rate(n, seconds):
    return n / seconds if seconds > 0 else float("inf")


def _fmt_rate(v):
    return f"{v:,.0f} msg/s"


def _pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(p * len(xs))) - 1))]


class _NoGC:
    """Around every timed section: the disk settled first (os.sync: the previous system's dirty pages are
    written back now, not during the next one's writes, which on this VM slowed them up to 10x), then the
    collector out of the way."""
    def __enter__(self):
        os.sync()
        gc.collect()
        gc.freeze()
        gc.disable()

    def __exit__(self, *a):
        gc.enable()
        gc.unfreeze()


def _rmq_config(p, **kw) -> StoreConfig:
    cfg = StoreConfig(mapped_file_size_commit_log=p["file_size"])
    for k, v in kw.items():
        setattr(cfg, k, v)
    return cfg


def _open(path, cfg, services=False):
    from ...store.store import MessageStore
    return MessageStore.open(path, cfg, start_services=services)


def _dispatch_all(store):
    d = store.dispatcher
    while d.do_reput():
        pass


def _commitlog_chunks(store, n_chunks):
    """The commitlog bytes store holds, cut into n_chunks pieces (the batches' bytes, for the limits)."""
    cl = store.commit_log
    data = []
    for mf in cl.queue.files:
        data.append(mf.mm[:mf.read_position])
    blob = b"".join(data)
    del data
    step = max(1, -(-len(blob) // n_chunks))
    return [blob[i:i + step] for i in range(0, len(blob), step)], len(blob)


# --- the suite -----------------------------------------------------------------------------------
