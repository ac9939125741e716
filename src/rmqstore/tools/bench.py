"""rmqstore bench: throughput of the store, as JSON.

    python -m rmqstore.tools.bench [--workload put,put_batch] [--messages N | --scale small|full] ...

Each workload runs in a fresh store directory and reports what it measured under its name in the
"workloads" object of the JSON printed to stdout (and returned by `run`), next to the machine it ran on
and the parameters. The messages are generated before any clock starts (generation is not the store's
cost) and shared by the workloads: the store never modifies a Message.

Workloads are registered with `@workload("name", "help")`; a workload is a function taking a
`BenchContext` and returning a dict. Workloads of the commitlog alone:

- `put`        one `CommitLog.put_message` call per message (from --threads producer threads);
- `put_batch`  `CommitLog.put_messages` with batches of --batch messages (lists of Messages);
- `put_columns` the same batches as `MessageBatch`es (columns: no Message object per message).

And of the whole store: `e2e`, MessageBatch puts with the dispatcher running until everything is in the
consume queues and the index, with the dispatcher's lag (bytes behind the commitlog's end) sampled.

MB are 10**6 bytes of commitlog written (records and END_OF_FILE blanks).

With --repeat R each workload runs R times, each time in a fresh store; a temporary store is deleted after
its run, so the next run writes into page cache the kernel has handed out before. The first run of a
process also pays for memory the machine touches for the first time (on a VM that can be most of the
cost of writing the commitlog pages): compare runs, not just the median.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..store.conf.config import ASYNC_FLUSH, SYNC_FLUSH, StoreConfig
from ..store.format.message import Message, PutMessageResults
from ..store.format.message_batch import MessageBatch

SCALES = {"small": 100_000, "full": 1_000_000}
DEFAULT_WORKLOADS = "put,put_batch,put_columns,e2e"
TOPIC = "BenchTopic"
TAG = "TagA"
BORN_HOST = "10.0.0.1:50000"


# --- workload registry ---------------------------------------------------------------------------
@dataclass
class Workload:
    name: str
    help: str
    fn: Callable[["BenchContext"], dict]


WORKLOADS: dict[str, Workload] = {}


def workload(name: str, help: str):
    """Register a workload function under a name (`--workload name`)."""
    def deco(fn: Callable[["BenchContext"], dict]):
        WORKLOADS[name] = Workload(name, help, fn)
        return fn
    return deco


@dataclass
class BenchContext:
    """What a workload gets: the parsed arguments, the store config and the pre-generated messages."""
    args: argparse.Namespace
    config: StoreConfig
    base_dir: Path
    _messages: list[Message] | None = field(default=None, repr=False)

    @property
    def n(self) -> int:
        return self.args.messages

    def messages(self) -> list[Message]:
        if self._messages is None:
            self._messages = generate_messages(self.n, self.args.body_size, self.args.queues)
        return self._messages

    run: int = 0
    _dirs: list = field(default_factory=list, repr=False)

    def store_dir(self, name: str) -> Path:
        """A fresh, empty store directory for one run of a workload (`name`, or `name-R` with --repeat)."""
        d = self.base_dir / (name if self.args.repeat == 1 else f"{name}-{self.run + 1}")
        if d.exists() and any(d.iterdir()):
            raise SystemExit(f"bench: store directory {d} is not empty")
        d.mkdir(parents=True, exist_ok=True)
        self._dirs.append(d)
        return d


# --- messages ------------------------------------------------------------------------------------
def generate_messages(n: int, body_size: int, queues: int, topic: str = TOPIC) -> list[Message]:
    """n messages as a RocketMQ producer sends them: a tag, a key and a client UNIQ_KEY each."""
    blob = os.urandom(body_size + 4096)
    # RocketMQ's MessageClientIDSetter: ip (4 bytes), pid (2), class loader hash (4), then a time
    # difference (4) and a counter (2) per message: 32 uppercase hex digits.
    prefix = (bytes([10, 0, 0, 1]) + (os.getpid() & 0xFFFF).to_bytes(2, "big") + os.urandom(4)).hex().upper()
    born = int(time.time() * 1000)
    out = []
    append = out.append
    for i in range(n):
        j = i & 4095
        append(Message(topic=topic, body=blob[j:j + body_size], queue_id=i % queues, born_timestamp=born + (i >> 10),
                       born_host=BORN_HOST,
                       properties={"TAGS": TAG, "KEYS": f"key-{i}", "UNIQ_KEY": f"{prefix}{i:012X}"}))
    return out


# --- machine -------------------------------------------------------------------------------------
def machine_info() -> dict:
    info: dict = {"cores": os.cpu_count(), "python": platform.python_version(),
                  "implementation": platform.python_implementation(), "platform": platform.platform()}
    try:
        info["cores_usable"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        info["cpu"] = platform.processor() or None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    kib = int(line.split()[1])
                    info["memory_bytes"] = kib * 1024
                    info["memory_gib"] = round(kib / (1 << 20), 1)
                    break
    except OSError:
        pass
    return info


# --- helpers -------------------------------------------------------------------------------------
@dataclass
class PutTarget:
    """What a put workload writes to: a CommitLog, the flush service answering its puts (SYNC_FLUSH) and
    how to close it."""
    commit_log: object
    flusher: object | None
    close: Callable[[], None]


def open_commit_log(ctx: BenchContext, name: str) -> PutTarget:
    """With ASYNC_FLUSH a CommitLog alone. With SYNC_FLUSH the commitlog of a MessageStore whose services
    run: each put is answered by its GroupCommitService once an msync covers it (RocketMQ's group commit:
    one msync serves every put waiting), the dispatcher builds queues and index meanwhile."""
    if ctx.config.flush_disk_type == SYNC_FLUSH:
        from ..store.durability.flush import GroupCommitService
        from ..store.store import MessageStore
        store = MessageStore.open(ctx.store_dir(name), ctx.config)
        svc = next(s for s in store.services if isinstance(s, GroupCommitService))
        return PutTarget(store.commit_log, svc, store.close)
    from ..store.commitlog.commit_log import CommitLog
    cl = CommitLog(ctx.store_dir(name), ctx.config)
    cl.load()
    return PutTarget(cl, None, cl.shutdown)


def _split(items: list, parts: int) -> list[list]:
    """items in `parts` contiguous slices (each thread sends its own run of messages)."""
    k, r = divmod(len(items), parts)
    out, s = [], 0
    for t in range(parts):
        e = s + k + (1 if t < r else 0)
        out.append(items[s:e])
        s = e
    return out


def _timed_threads(jobs: list[Callable[[], None]]) -> tuple[float, float]:
    """Run jobs, one thread each (inline for one); the wall-clock and the process CPU seconds they took."""
    if len(jobs) == 1:
        c0, t0 = time.process_time(), time.perf_counter()
        jobs[0]()
        return time.perf_counter() - t0, time.process_time() - c0
    barrier = threading.Barrier(len(jobs) + 1)
    errors: list[BaseException] = []

    def wrap(job):
        barrier.wait()
        try:
            job()
        except BaseException as e:  # noqa: BLE001 - reported after the join
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(j,), name=f"producer-{i}") for i, j in enumerate(jobs)]
    for t in threads:
        t.start()
    barrier.wait()
    c0, t0 = time.process_time(), time.perf_counter()
    for t in threads:
        t.join()
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    if errors:
        raise errors[0]
    return elapsed, cpu


def _figures(n: int, ok: int, nbytes: int, timing: tuple[float, float]) -> dict:
    """Throughput figures; cpu_* are the same per second of CPU the process used (less sensitive to other
    processes competing for the cores than the wall clock)."""
    seconds, cpu = timing
    return {"messages": n, "ok": ok, "seconds": round(seconds, 4),
            "msgs_per_s": round(n / seconds) if seconds > 0 else None,
            "bytes": nbytes, "mb_per_s": round(nbytes / seconds / 1e6, 2) if seconds > 0 else None,
            "us_per_msg": round(seconds / n * 1e6, 3) if n else None,
            "cpu_seconds": round(cpu, 4), "msgs_per_cpu_s": round(n / cpu) if cpu > 0 else None}


def _quiet_gc():
    """Collect now and move everything alive (the pre-generated messages) out of the collector's way."""
    gc.collect()
    gc.freeze()


# --- workloads -----------------------------------------------------------------------------------
@workload("put", "CommitLog.put_message, one message per call (--threads producers)")
def _wl_put(ctx: BenchContext) -> dict:
    msgs = ctx.messages()
    target = open_commit_log(ctx, "put")
    cl, flusher = target.commit_log, target.flusher
    try:
        parts = _split(msgs, max(1, ctx.args.threads))
        counts = [0] * len(parts)

        def job(t: int, part: list[Message]):
            put = cl.put_message
            ok = 0
            for m in part:
                if put(m).ok:
                    ok += 1
            counts[t] = ok

        _quiet_gc()
        try:
            timing = _timed_threads([lambda t=t, p=p: job(t, p) for t, p in enumerate(parts)])
        finally:
            gc.unfreeze()
        out = _figures(len(msgs), sum(counts), cl.get_max_offset() - cl.get_min_offset(), timing)
        out["threads"] = len(parts)
        if flusher is not None:
            out["flushes"] = flusher.flushes
        return out
    finally:
        target.close()


def _batched(ctx: BenchContext, name: str, prepare: Callable[[list[Message]], object],
             put_input: Callable[[object], object]) -> dict:
    """Batches of --batch messages from --threads producers through CommitLog.put_messages; prepare makes
    a batch's input before the clock starts, put_input what is put from it in the timed loop."""
    msgs = ctx.messages()
    size = max(1, ctx.args.batch)
    target = open_commit_log(ctx, name)
    cl, flusher = target.commit_log, target.flusher
    try:
        parts = _split(msgs, max(1, ctx.args.threads))
        batches = [[prepare(p[i:i + size]) for i in range(0, len(p), size)] for p in parts]
        counts = [0] * len(parts)

        def job(t: int, bs: list):
            put = cl.put_messages
            counts[t] = sum(ok_count(put(put_input(b))) for b in bs)

        _quiet_gc()
        try:
            timing = _timed_threads([lambda t=t, b=b: job(t, b) for t, b in enumerate(batches)])
        finally:
            gc.unfreeze()
        out = _figures(len(msgs), sum(counts), cl.get_max_offset() - cl.get_min_offset(), timing)
        out.update(threads=len(parts), batch=size)
        if flusher is not None:
            out["flushes"] = flusher.flushes
        return out
    finally:
        target.close()


def _same(x):
    return x


@workload("put_batch", "CommitLog.put_messages, batches of --batch messages (--threads producers)")
def _wl_put_batch(ctx: BenchContext) -> dict:
    return _batched(ctx, "put_batch", _same, _same)


@workload("put_columns", "CommitLog.put_messages of a MessageBatch (columns) of --batch messages "
                         "(--threads producers); the MessageBatch is made in the timed loop")
def _wl_put_columns(ctx: BenchContext) -> dict:
    return _batched(ctx, "put_columns", batch_columns, lambda kw: MessageBatch(**kw))


def ok_count(results) -> int:
    """How many results of a put_messages call are PUT_OK (without building a PutMessageResults' items)."""
    if type(results) is PutMessageResults:
        return results.ok_count
    return sum(1 for r in results if r.ok)


def batch_columns(msgs: list[Message]) -> dict:
    """The MessageBatch arguments for messages of one topic and born host that share their property names
    (what generate_messages makes): the same messages as columns."""
    names = list(msgs[0].properties)
    return {"topic": msgs[0].topic, "bodies": [m.body for m in msgs], "queue_ids": [m.queue_id for m in msgs],
            "properties": {k: [m.properties[k] for m in msgs] for k in names},
            "born_timestamp": [m.born_timestamp for m in msgs], "born_host": msgs[0].born_host}


@workload("e2e", "MessageStore.put_messages of MessageBatches of --batch messages with the dispatcher running "
                 "(consume queues and a key per message in the index), until all is dispatched; the "
                 "dispatcher's lag sampled every 10 ms")
def _wl_e2e(ctx: BenchContext) -> dict:
    from ..store.store import MessageStore
    msgs = ctx.messages()
    size = max(1, ctx.args.batch)
    batches = [batch_columns(msgs[i:i + size]) for i in range(0, len(msgs), size)]
    store = MessageStore.open(ctx.store_dir("e2e"), ctx.config)
    try:
        lags: list[int] = []
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                lags.append(store.dispatch_behind_bytes())
                stop.wait(0.01)

        sampler = threading.Thread(target=sample, name="lag-sampler", daemon=True)
        _quiet_gc()
        try:
            sampler.start()
            c0, t0 = time.process_time(), time.perf_counter()
            ok = sum(ok_count(store.put_messages(MessageBatch(**b))) for b in batches)
            t_put = time.perf_counter() - t0
            dispatched = store.wait_dispatched(timeout=600)
            timing = (time.perf_counter() - t0, time.process_time() - c0)
        finally:
            stop.set()
            sampler.join()
            gc.unfreeze()
        out = _figures(len(msgs), ok, store.commit_log.get_max_offset() - store.commit_log.get_min_offset(), timing)
        d = store.dispatcher
        out.update(batch=size, all_dispatched=dispatched, puts_alone_msgs_per_s=round(len(msgs) / t_put),
                   lag_max_bytes=max(lags, default=0),
                   lag_mean_bytes=round(sum(lags) / len(lags)) if lags else 0, lag_samples=len(lags),
                   dispatched_from_put_columns=d.hinted_messages, dispatched_parsed=d.dispatched_messages
                   - d.hinted_messages)
        return out
    finally:
        store.close()


# --- command line --------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", default=DEFAULT_WORKLOADS, metavar="W[,W...]",
                        help="comma-separated workloads to run, in order: "
                             + "; ".join(f"{w.name}: {w.help}" for w in WORKLOADS.values())
                             + f" (default {DEFAULT_WORKLOADS})")
    parser.add_argument("--messages", "-n", type=int, default=None, metavar="N",
                        help="messages per workload (default: the --scale's)")
    parser.add_argument("--scale", choices=sorted(SCALES), default="full",
                        help="small = 100,000 messages, full = 1,000,000 (default full)")
    parser.add_argument("--body-size", type=int, default=100, metavar="BYTES", help="body bytes (default 100)")
    parser.add_argument("--queues", type=int, default=4, help="queues of the one topic (default 4)")
    parser.add_argument("--batch", type=int, default=1000, help="messages per put_messages call (default 1000)")
    parser.add_argument("--flush", choices=("async", "sync"), default="async",
                        help="flushDiskType: async (no msync on the put path) or sync (msync before answering)")
    parser.add_argument("--threads", type=int, default=1, help="producer threads (default 1)")
    parser.add_argument("--repeat", type=int, default=1, metavar="R",
                        help="runs of each workload, each in a fresh store; the figures are the median run's, "
                             "every run is listed under 'runs' (default 1)")
    parser.add_argument("--store", metavar="DIR", default=None,
                        help="where the stores go (DIR/<workload>, kept); default a temporary directory, removed")
    parser.add_argument("-c", "--config", dest="config", metavar="CONF", default=None,
                        help="store config (broker.conf properties); default commitlog files of 1 GiB")


def _checked(args: argparse.Namespace) -> list[str]:
    """The workload names asked for; SystemExit naming a bad argument."""
    names = [w.strip() for w in (args.workload or DEFAULT_WORKLOADS).split(",") if w.strip()]
    unknown = [w for w in names if w not in WORKLOADS]
    if unknown:
        raise SystemExit(f"bench: unknown workload(s) {', '.join(unknown)}; known: {', '.join(WORKLOADS)}")
    if args.messages is None:
        args.messages = SCALES[args.scale]
    if min(args.messages, args.queues, args.batch, args.threads, args.repeat) <= 0 or args.body_size < 0:
        raise SystemExit("bench: --messages, --queues, --batch, --threads and --repeat must be positive, "
                         "--body-size >= 0")
    return names


def _run_workload(ctx: BenchContext, name: str, repeat: int, temporary: bool, step) -> dict:
    """Run one workload `repeat` times; the median run (by msg/s) with every run when more than one."""
    runs = []
    for r in range(repeat):
        ctx.run = r
        runs.append(WORKLOADS[name].fn(ctx))
        step(r)
        if temporary:         # free the page cache of a temporary store before the next run
            for d in ctx._dirs:
                shutil.rmtree(d, ignore_errors=True)
        ctx._dirs.clear()
        gc.collect()
    if len(runs) == 1:
        return runs[0]
    ranked = sorted(runs, key=lambda x: x.get("msgs_per_s") or 0)
    return {**ranked[(len(ranked) - 1) // 2], "runs": runs}


def run(args: argparse.Namespace) -> dict:
    names = _checked(args)
    config = StoreConfig.load(args.config)
    config.flush_disk_type = SYNC_FLUSH if args.flush == "sync" else ASYNC_FLUSH

    tmp = None
    if args.store is None:
        tmp = tempfile.mkdtemp(prefix="rmqstore-bench-")
        base = Path(tmp)
    else:
        base = Path(args.store)
        base.mkdir(parents=True, exist_ok=True)
    ctx = BenchContext(args, config, base)
    result: dict = {
        "machine": machine_info(),
        "params": {"messages": args.messages, "body_size": args.body_size, "queues": args.queues,
                   "topics": 1, "batch": args.batch, "flush": config.flush_disk_type, "threads": args.threads,
                   "repeat": args.repeat,
                   "mapped_file_size_commit_log": config.mapped_file_size_commit_log,
                   "config": args.config, "store": None if tmp else str(base)},
        "workloads": {},
        "notes": "wall clock (perf_counter) around the puts only (cpu_*: process CPU time instead); messages "
                 "generated before, then gc.collect() and gc.freeze() so the collector does not walk them; "
                 "MB = 10**6 commitlog bytes",
    }
    from .progress import ProgressBar
    bar = ProgressBar("bench", unit=" run", total=len(names) * args.repeat)     # drawn on a terminal only
    try:
        t0 = time.perf_counter()
        ctx.messages()
        result["params"]["generate_seconds"] = round(time.perf_counter() - t0, 3)
        for k, name in enumerate(names):
            result["workloads"][name] = _run_workload(ctx, name, args.repeat, tmp is not None,
                                                      lambda r, k=k: bar.update(k * args.repeat + r + 1))
    finally:
        bar.close()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    sys.stdout.flush()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rmqstore.tools.bench", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    run(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
