"""The scale curve (`make bench SCALE=huge`: a person's run, not CI): how opening a store grows with what it
holds, rmqstore beside RocketMQ 4.4.0's own store, both measured in the same run.

For each size (SCALE_SIZES: 2M, 20M, 100M messages; RMQSTORE_SCALE_SIZES=N,N,... overrides), one after the
other, each store removed before the next is written (100M messages are about 24 GB: the free disk is
checked first, and a size the disk cannot hold is reported as skipped):

1. rmqstore: a child process writes N messages of 100 B (MessageBatch of 1,000, 8 topics of 4 queues, a
   key and a tag each, the dispatcher running) and closes the store;
2. three clean opens, each in a fresh process: seconds until MessageStore.open returns (the store serves:
   services and the background check started), and that process's peak RSS at that moment; the last one
   also waits for the background check (BackgroundCheckService: every unit against its record, the CRCs
   RocketMQ's rule walks at open) and says how long it took;
3. a process opens it, puts 2,000 messages and is SIGKILLed; a fresh process opens it (timed the same);
4. RocketMQ 4.4.0 (../shared/reference, refbench): `bench DIR N 100 0` writes a store of N messages (one
   putMessage each, the same body size), `open DIR` times its restart (load + start); then `bench DIR` is
   started on that store again and SIGKILLed while it puts, and `open DIR` times the restart after it.
   The JVM's peak RSS comes from wait4.

    python -m rmqstore.tools.suite.scale write|open|killed DIR [N]    (the child processes)
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ...broker.bench import cpu_seconds
from .common import REFERENCE_BUILD, ROCKETMQ, Table, _fmt_rate, find_reference

SCALE_SIZES = (2_000_000, 20_000_000, 100_000_000)
TOPICS, QUEUES, BATCH, BODY = 8, 4, 1000, 100
KILL_PUTS = 2000
BYTES_PER_MESSAGE = 265         # commitlog record (~225 B), consume queue unit, index entry, on this layout


def sizes() -> tuple[int, ...]:
    env = os.environ.get("RMQSTORE_SCALE_SIZES")
    return tuple(int(x) for x in env.split(",") if x.strip()) if env else SCALE_SIZES


class ScaleWorkloads:
    """benchsuite.Suite's `scale` step (self: the Suite)."""

    def scale_curve(self) -> Table:
        t = Table("scale", "Open time by store size: rmqstore beside RocketMQ 4.4.0's own store, same run", "s",
                  False)
        binary = find_reference()
        lines = []
        for n in sizes():
            row = self._scale_one(t, n, binary)
            lines.append(row)
        t.notes.append(scale_markdown(lines, binary is not None))
        t.notes.append(_disk_note(self.work))
        return t

    def _scale_one(self, t: Table, n: int, binary) -> dict:
        row = {"n": n}
        need = n * BYTES_PER_MESSAGE * 1.1 + (2 << 30)
        free = shutil.disk_usage(self.work).free
        if free < need:
            row["skipped"] = f"not enough free disk: {need / 2**30:.1f} GiB needed, {free / 2**30:.1f} GiB free"
            self.log(f"[scale] {n:,}: {row['skipped']}")
            t.add(f"rmqstore, {n:,} messages", None, row["skipped"])
            return row
        d = self.work / f"scale-{n}"
        shutil.rmtree(d, ignore_errors=True)
        try:
            row.update(_rmqstore_figures(d, n, self.log))
        except Exception as e:  # noqa: BLE001 - reported in the table
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        finally:
            shutil.rmtree(d, ignore_errors=True)
        if binary is not None:
            d = self.work / f"scale-rocketmq-{n}"
            shutil.rmtree(d, ignore_errors=True)
            try:
                row.update(_rocketmq_figures(binary, d, n, self.log))
            except Exception as e:  # noqa: BLE001
                row["rocketmq_error"] = f"{type(e).__name__}: {e}"[:300]
            finally:
                shutil.rmtree(d, ignore_errors=True)
        for key, name in (("clean", "clean open"), ("killed", "open after SIGKILL")):
            if key in row:
                t.add(f"rmqstore {name}, {n:,} messages", row[key]["open_s"],
                      f"{row[key]['open_s']:.3f} s, peak RSS {row[key]['rss_mb']:.0f} MB", ref=key == "clean")
            rk = f"rocketmq_{key}"
            if rk in row:
                t.add(f"{ROCKETMQ} {name}, {n:,} messages", row[rk]["open_s"],
                      f"{row[rk]['open_s']:.3f} s, peak RSS {row[rk]['rss_mb']:.0f} MB", kind="rocketmq")
        for key in ("error", "rocketmq_error"):
            if key in row:
                t.add(f"{'rmqstore' if key == 'error' else ROCKETMQ}, {n:,} messages", None, f"ERROR: {row[key]}")
        return row


# --- rmqstore, in child processes ------------------------------------------------------------------------
def _child(args: list[str], *, kill_after_ready: bool = False, timeout: float = 7200) -> tuple[dict, float]:
    """Run `python -m rmqstore.tools.suite.scale ARGS`; (its last JSON line, its peak RSS in MB from wait4).
    kill_after_ready: SIGKILL it once it prints READY."""
    p = subprocess.Popen([sys.executable, "-m", "rmqstore.tools.suite.scale", *args], stdout=subprocess.PIPE,
                         text=True)
    out = []
    deadline = time.monotonic() + timeout
    try:
        for line in p.stdout:
            out.append(line)
            if kill_after_ready and line.startswith("READY"):
                os.kill(p.pid, signal.SIGKILL)
                break
            if time.monotonic() > deadline:
                os.kill(p.pid, signal.SIGKILL)
                break
    finally:
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        p.stdout.close()
    js = [ln for ln in out if ln.startswith("{")]
    if kill_after_ready:
        if not any(ln.startswith("READY") for ln in out):
            raise RuntimeError(f"`scale {' '.join(args)}` never got ready (exit {p.returncode})")
        return {}, usage.ru_maxrss / 1024
    if p.returncode != 0 or not js:
        raise RuntimeError(f"`scale {' '.join(args)}` exited with {p.returncode}: {''.join(out)[-300:]!r}")
    return json.loads(js[-1]), usage.ru_maxrss / 1024


def _rmqstore_figures(d: Path, n: int, log) -> dict:
    out = {}
    w, _ = _child(["write", str(d), str(n)])
    out["write_rate"] = w["rate"]
    out["store_bytes"] = sum(f.stat().st_blocks * 512 for f in d.rglob("*") if f.is_file())    # as du counts
    log(f"[scale] rmqstore {n:,}: written at {_fmt_rate(w['rate'])}, {out['store_bytes'] / 2**30:.1f} GiB")
    cleans = []
    for i in range(3):
        o, _ = _child(["open", str(d)] + (["--wait-check"] if i == 2 else []))
        cleans.append(o)
        log(f"[scale] rmqstore {n:,}: clean open {o['open_s']:.3f} s, RSS {o['rss_mb']:.0f} MB"
            + (f"; background check {o['check_s']:.1f} s ({o['check']}), RSS after it {o['rss_after_check_mb']:.0f} MB"
               if "check_s" in o else "") + f": {o['summary']}")
    out["clean_all"] = [c["open_s"] for c in cleans]
    out["clean"] = min(cleans, key=lambda c: c["open_s"]) | {"rss_mb": max(c["rss_mb"] for c in cleans)}
    out["check"] = cleans[-1]
    _child(["killed", str(d)], kill_after_ready=True)
    k, _ = _child(["open", str(d)])
    out["killed"] = k
    log(f"[scale] rmqstore {n:,}: open after SIGKILL {k['open_s']:.3f} s, RSS {k['rss_mb']:.0f} MB: {k['summary']}")
    return out


def _run_jvm(args: list[str], idle_s: float = 120) -> tuple[str, int, float]:
    """Run refbench with ARGS: (its stdout, exit code, peak RSS in MB from wait4). A JVM whose main thread
    died (its store's threads keep it alive; the reason goes to the stderr refbench discards) shows as a
    process that uses no CPU for idle_s: it is killed and RuntimeError raised."""
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    last, since = None, time.monotonic()
    while True:
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        time.sleep(1)
        cpu = cpu_seconds(p.pid)
        if cpu != last:
            last, since = cpu, time.monotonic()
        elif time.monotonic() - since > idle_s:
            os.kill(p.pid, signal.SIGKILL)
            os.wait4(p.pid, 0)
            p.stdout.close()
            raise RuntimeError(f"`refbench {' '.join(args[1:3])}`: its JVM sat idle for {idle_s:.0f} s (its main "
                               "thread gone): killed")
    p.returncode = os.waitstatus_to_exitcode(status)
    text = p.stdout.read()
    p.stdout.close()
    return text, p.returncode, usage.ru_maxrss / 1024


def _refbench_write(binary: Path, d: Path, n: int) -> dict:
    """`refbench bench DIR N 100 0`: its JSON."""
    text, code, _ = _run_jvm([str(binary), "bench", str(d), str(n), str(BODY), "0"])
    js = [ln for ln in text.splitlines() if ln.startswith("{")]
    if code != 0 or not js:
        raise RuntimeError(f"refbench bench exited with {code}: {text[-300:]!r}")
    return json.loads(js[-1])


def _rocketmq_figures(binary: Path, d: Path, n: int, log) -> dict:
    out = {}
    t0 = time.perf_counter()
    for attempt in (1, 2):
        try:
            b = _refbench_write(binary, d, n)
            break
        except RuntimeError as e:
            shutil.rmtree(d, ignore_errors=True)
            log(f"[scale] {ROCKETMQ} {n:,}: {e}" + ("; once more" if attempt == 1 else ""))
            if attempt == 2:
                raise
    out["rocketmq_write_rate"] = n / b["put_and_dispatch_s"]
    log(f"[scale] {ROCKETMQ} {n:,}: written at {_fmt_rate(out['rocketmq_write_rate'])} "
        f"({time.perf_counter() - t0:.0f} s with its JVM)")
    out["rocketmq_clean"] = _refbench_open(binary, d)
    log(f"[scale] {ROCKETMQ} {n:,}: clean open {out['rocketmq_clean']['open_s']:.3f} s")
    # the bench again on that store (its clean open first), SIGKILLed while it puts
    p = subprocess.Popen([str(binary), "bench", str(d), str(10 * n + 10_000_000), str(BODY), "0"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while not (d / "abort").exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2.0)                 # putting by now
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    out["rocketmq_killed"] = _refbench_open(binary, d)
    if not out["rocketmq_killed"].get("abnormal"):
        raise RuntimeError("RocketMQ's store did not see the SIGKILL (no abort file at its open)")
    log(f"[scale] {ROCKETMQ} {n:,}: open after SIGKILL {out['rocketmq_killed']['open_s']:.3f} s")
    return out


def _refbench_open(binary: Path, d: Path) -> dict:
    text, code, rss = _run_jvm([str(binary), "open", str(d)])
    js = [ln for ln in text.splitlines() if ln.startswith("{")]
    if code != 0 or not js:
        raise RuntimeError(f"refbench open exited with {code}: {text[-300:]!r}")
    o = json.loads(js[-1])
    return {"open_s": o["load_s"] + o["start_s"], "load_s": o["load_s"], "abnormal": o["abnormal"], "rss_mb": rss}


# --- the report ----------------------------------------------------------------------------------------
def _s(row: dict, key: str) -> str:
    v = row.get(key)
    return f"{v['open_s']:.2f} s" if v else "n/a"


def scale_markdown(rows: list[dict], built: bool) -> str:
    """The scale table (BENCHMARKS.md's 'Open time by store size' section)."""
    out = ["| messages (store size) | rmqstore write, end to end | rmqstore clean open (3 runs) | rmqstore open "
           "after SIGKILL | opener's peak RSS (clean / SIGKILL) | background check (while serving) | "
           f"{ROCKETMQ} clean open | {ROCKETMQ} open after SIGKILL | {ROCKETMQ} peak RSS (clean / SIGKILL) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        n = r["n"]
        if "skipped" in r or "error" in r:
            out.append(f"| {n:,} | {r.get('skipped') or 'ERROR: ' + r['error']} |||||||")
            continue
        size = f"{n:,} ({r['store_bytes'] / 2**30:.1f} GiB)"
        cleans = "-".join(f"{x:.2f}" for x in sorted(r["clean_all"])[::2]) + " s" if r["clean_all"] else "n/a"
        check = r["check"].get("check_s")
        check_rss = r["check"].get("rss_after_check_mb")
        ref = (f"{_s(r, 'rocketmq_clean')} | {_s(r, 'rocketmq_killed')} | "
               f"{r['rocketmq_clean']['rss_mb']:.0f} / {r['rocketmq_killed']['rss_mb']:.0f} MB"
               if "rocketmq_killed" in r else
               (f"ERROR: {r['rocketmq_error']} ||" if "rocketmq_error" in r else "not built ||"))
        out.append(f"| {size} | {_fmt_rate(r['write_rate'])} | {cleans} | {_s(r, 'killed')} | "
                   f"{r['clean']['rss_mb']:.0f} / {r['killed']['rss_mb']:.0f} MB | "
                   f"{f'{check:.0f} s (peak RSS {check_rss:.0f} MB)' if check is not None else 'n/a'} | {ref} |")
    if not built:
        out += ["", f"{ROCKETMQ} was not run (its reference benchmark is not built): {REFERENCE_BUILD}."]
    return "\n".join(out)


def _disk_note(work: Path) -> str:
    try:
        df = subprocess.run(["df", "-h", str(work)], capture_output=True, text=True).stdout.strip()
    except OSError:
        df = ""
    return f"Free disk after the run (`df -h {work}`):\n\n```\n{df}\n```"


# --- the child processes ----------------------------------------------------------------------------------
def _write(path: str, n: int) -> dict:
    import numpy as np
    from ...store.conf.config import StoreConfig
    from ...store.format.message_batch import MessageBatch
    from ...store.store import MessageStore
    s = MessageStore.open(path, StoreConfig())
    body = os.urandom(BODY)
    t0 = time.perf_counter()
    for i in range(0, n, BATCH):
        k = min(BATCH, n - i)
        s.put_messages(MessageBatch(f"ScaleTopic{(i // BATCH) % TOPICS}", [body] * k,
                                    queue_ids=np.arange(i, i + k) % QUEUES, tags="TagA",
                                    keys=[f"k{j}" for j in range(i, i + k)]))
    if not s.wait_dispatched(3600):
        raise RuntimeError("not dispatched after an hour")
    el = time.perf_counter() - t0
    s.close()
    return {"n": n, "seconds": el, "rate": n / el}


def _open(path: str, wait_check: bool) -> dict:
    from ...store.check.background_check import NAME
    from ...store.conf.config import StoreConfig
    from ...store.store import MessageStore
    t0 = time.perf_counter()
    s = MessageStore.open(path, StoreConfig())
    el = time.perf_counter() - t0
    out = {"open_s": el, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "summary": s.recovery_report.summary()}
    if wait_check:
        svc = s.service(NAME)
        svc.wait()
        out["check_s"] = svc.result.seconds
        out["check"] = f"{svc.result.units:,} units, {svc.result.crc_bytes:,} bytes CRC-checked, " \
                       f"{len(svc.result.problems)} problems"
        out["rss_after_check_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    s.close()
    return out


def _killed(path: str) -> None:
    from ...store.conf.config import StoreConfig
    from ...store.format.message_batch import MessageBatch
    from ...store.store import MessageStore
    s = MessageStore.open(path, StoreConfig())
    body = os.urandom(BODY)
    for i in range(0, KILL_PUTS, 500):
        s.put_messages(MessageBatch("ScaleTopic0", [body] * 500, queue_ids=[j % QUEUES for j in range(500)],
                                    tags="TagA", keys=[f"x{j}" for j in range(i, i + 500)]))
    print("READY", flush=True)
    time.sleep(3600)


def main(argv: list[str] | None = None) -> int:
    a = sys.argv[1:] if argv is None else argv
    if len(a) >= 2 and a[0] == "write":
        print(json.dumps(_write(a[1], int(a[2]))), flush=True)
    elif len(a) >= 2 and a[0] == "open":
        print(json.dumps(_open(a[1], "--wait-check" in a)), flush=True)
    elif len(a) >= 2 and a[0] == "killed":
        _killed(a[1])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
