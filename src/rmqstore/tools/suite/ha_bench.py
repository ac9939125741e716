"""The `ha` step of `make bench`: a master/slave pair's send throughput with RocketMQ 4.4.0's Java producer,
rmqstore's pair beside RocketMQ's own pair in the same run (ha_pair.Pair; ../notes/ha-replication.md §8),
the replication lag under that load, and the put cost a slave adds to an rmqstore master.

Per system (both brokers rmqstore, or both RocketMQ 4.4.0) and master role (SYNC_MASTER, ASYNC_MASTER): sync
sends from one thread (HaTool send), async sends with WINDOW in flight (HaTool async), while the master's and
the slave's commitLogMaxOffset are sampled (GET_BROKER_RUNTIME_INFO every 0.25 s): the most bytes the slave
was behind, and how long it took to hold everything once the sends ended. 1 GiB commitlog files,
ASYNC_FLUSH, 256 B bodies, loopback.

Put cost: MessageBatch puts of 1,000 messages of 100 B into an ASYNC_MASTER store in this process, alone and
with a slave (another process) replicating it.
"""
from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from .ha_pair import Pair, clean, parse_rate, realmq


def _lag_sampler(pair: Pair, stop: threading.Event, out: dict) -> None:
    from ...client import Admin
    worst = 0
    with Admin(pair.ns) as admin:
        while not stop.is_set():
            try:
                m = int(admin.broker_runtime_stats(pair.addr("master"))["commitLogMaxOffset"])
                s = int(admin.broker_runtime_stats(pair.addr("slave"))["commitLogMaxOffset"])
                worst = max(worst, m - s)
            except Exception:       # noqa: BLE001 - a missed sample
                pass
            stop.wait(0.25)
    out["max_behind_bytes"] = worst


def _catch_up_seconds(pair: Pair, timeout: float = 120.0) -> float | None:
    from ...client import Admin
    t0 = time.monotonic()
    with Admin(pair.ns) as admin:
        while time.monotonic() - t0 < timeout:
            try:
                m = admin.broker_runtime_stats(pair.addr("master"))["commitLogMaxOffset"]
                s = admin.broker_runtime_stats(pair.addr("slave"))["commitLogMaxOffset"]
                if m == s:
                    return time.monotonic() - t0
            except Exception:       # noqa: BLE001
                pass
            time.sleep(0.05)
    return None


def bench_pair(work: Path, kind: str, role: str, n_sync: int, n_async: int, size: int, window: int) -> dict:
    clean(work)
    out: dict = {"system": kind, "role": role}
    with Pair(work, kind, kind, role) as pair:
        pair.hatool("mktopic", pair.addr("master"), "HaBench", 4)
        pair.hatool("mktopic", pair.addr("master"), "HaBenchAsync", 4)
        time.sleep(2)
        line = pair.hatool("send", pair.ns, "HaBench", n_sync, size, 600)
        out["sync_line"], out["sync_msgs_per_s"] = line, parse_rate(line)
        lag: dict = {}
        stop = threading.Event()
        sampler = threading.Thread(target=_lag_sampler, args=(pair, stop, lag), daemon=True)
        sampler.start()
        line = pair.hatool("async", pair.ns, "HaBenchAsync", n_async, size, window)
        stop.set()
        sampler.join(10)
        m = re.search(r"SEND_OK rate=(\d+) msg/s", line)
        out["async_line"], out["async_msgs_per_s"] = line, parse_rate(line)
        out["async_send_ok_per_s"] = float(m[1]) if m else None
        out["max_behind_bytes"] = lag.get("max_behind_bytes")
        out["catch_up_s"] = _catch_up_seconds(pair)
    clean(work)
    return out


def put_cost(work: Path, n: int = 200_000) -> dict:
    """msg/s of MessageBatch puts into an ASYNC_MASTER store, alone and with a slave process replicating."""
    from ...broker.process import free_port
    from ...store.conf.config import StoreConfig
    from ...store.format.message_batch import MessageBatch
    from ...store.store import MessageStore

    out = {}
    for with_slave in (False, True):
        clean(work)
        port = free_port()
        cfg = StoreConfig(broker_role="ASYNC_MASTER", ha_listen_port=port)
        slave = None
        with MessageStore.open(work / "m", cfg) as m:
            if with_slave:
                slave = subprocess.Popen([sys.executable, "-c", _SLAVE, str(work / "s"), str(port)],
                                         stdout=subprocess.PIPE)
                while not m.ha_status().slaves:
                    time.sleep(0.05)
            body = [b"x" * 100] * 1000
            cpu0 = _cpu()
            t0 = time.perf_counter()
            for i in range(n // 1000):
                m.put_messages(MessageBatch("PutCost", body, queue_ids=[j % 4 for j in range(1000)]))
            secs = time.perf_counter() - t0
            cpu = _cpu() - cpu0
            lagged = m.commit_log.get_max_offset() - m.ha_status().acked if with_slave else 0
            if with_slave:
                t1 = time.monotonic()
                while m.ha_status().acked < m.commit_log.get_max_offset() and time.monotonic() - t1 < 60:
                    time.sleep(0.01)
                out["slave_catch_up_s"] = time.monotonic() - t1
                out["slave_behind_at_end_bytes"] = lagged
        if slave is not None:
            slave.terminate()
            slave.wait(20)
        out["with_slave" if with_slave else "alone"] = n / secs
        out[f"cpu_us_per_msg_{'with_slave' if with_slave else 'alone'}"] = cpu / n * 1e6
    clean(work)
    return out


def _cpu() -> float:
    """CPU seconds of this process (every thread: puts, dispatcher, HA), user + system."""
    import resource
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


_SLAVE = """
import sys, time
from rmqstore import MessageStore, StoreConfig
cfg = StoreConfig(broker_role="SLAVE", broker_id=1, ha_master_address="127.0.0.1:" + sys.argv[2])
with MessageStore.open(sys.argv[1], cfg) as s:
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
"""


def bench_ha(work: Path, n_sync: int = 5000, n_async: int = 20000, size: int = 256, window: int = 64) -> dict:
    """Every row's figures (module docstring); the Java pair only when RocketMQ 4.4.0 is built."""
    r: dict = {"n_sync": n_sync, "n_async": n_async, "size": size, "window": window, "pairs": []}
    if realmq() is None:
        r["java_missing"] = True
    for role in ("SYNC_MASTER", "ASYNC_MASTER"):
        for kind in (("java", "rmq") if realmq() else ()):
            try:
                r["pairs"].append(bench_pair(work / f"{kind}-{role}", kind, role, n_sync, n_async, size, window))
            except Exception as e:  # noqa: BLE001 - a row that says so
                r["pairs"].append({"system": kind, "role": role, "error": f"{type(e).__name__}: {e}"[:300]})
    r["put_cost"] = put_cost(work / "put-cost")
    return r


def ha_table(r: dict):
    """bench_ha's figures as the report's table: the two pairs side by side per workload, then the rows."""
    from .common import Compare, Table, _fmt_rate
    t = Table("ha", "Master/slave replication: a pair's sends with RocketMQ 4.4.0's Java producer", "msg/s", True)
    by = {(p["system"], p["role"]): p for p in r.get("pairs", [])}
    for role in ("SYNC_MASTER", "ASYNC_MASTER"):
        for key, what in (("sync_msgs_per_s", "sync send, one thread"),
                          ("async_send_ok_per_s", f"async send, {r['window']} in flight (SEND_OK/s)")):
            j, m = by.get(("java", role), {}), by.get(("rmq", role), {})
            c = Compare(f"{role}: {what}", j.get(key), m.get(key))
            c.rocketmq_text = _fmt_rate(c.rocketmq) if c.rocketmq else (j.get("error") or "not run")
            c.rmqstore_text = _fmt_rate(c.rmqstore) if c.rmqstore else (m.get("error") or "not run")
            t.compare.append(c)
    for p in r.get("pairs", []):
        name = f"{'RocketMQ 4.4.0' if p['system'] == 'java' else 'rmqstore'} pair, {p['role']}"
        if "error" in p:
            t.add(name, None, "ERROR: " + p["error"])
            continue
        lag = p.get("max_behind_bytes")
        catch = p.get("catch_up_s")
        t.add(name + ": sync send", p.get("sync_msgs_per_s"), p.get("sync_line", ""),
              kind="rocketmq" if p["system"] == "java" else "rmqstore")
        t.add(name + ": async send", p.get("async_send_ok_per_s"),
              f"{p.get('async_line', '')}; slave at most {lag if lag is not None else '?'} bytes behind, "
              f"caught up {catch:.2f} s after the last answer" if catch is not None else p.get("async_line", ""),
              kind="rocketmq" if p["system"] == "java" else "rmqstore")
    pc = r.get("put_cost") or {}
    if pc:
        t.add("rmqstore master, MessageBatch puts, no slave", pc.get("alone"),
              f"{_fmt_rate(pc.get('alone', 0))}; master CPU {pc.get('cpu_us_per_msg_alone', 0):.2f} us/msg")
        t.add("rmqstore master, MessageBatch puts, a slave replicating", pc.get("with_slave"),
              f"{_fmt_rate(pc.get('with_slave', 0))}; master CPU {pc.get('cpu_us_per_msg_with_slave', 0):.2f} "
              f"us/msg; the slave {pc.get('slave_behind_at_end_bytes', 0):,} bytes behind at the last put, caught "
              f"up {pc.get('slave_catch_up_s', 0):.2f} s later (the slave process shares this machine's cores)")
    t.notes.append(f"{r['n_sync']:,} sync and {r['n_async']:,} async sends of {r['size']} B per pair and role, "
                   "ASYNC_FLUSH, 1 GiB commitlog files, one name server; the Java producer (HaTool, from "
                   "../shared/realmq) for both pairs; 'behind': the master's commitLogMaxOffset minus the slave's, "
                   "sampled every 0.25 s. Put cost: ASYNC_MASTER, 1,000-message batches of 100 B in process.")
    if r.get("java_missing"):
        t.notes.append("RocketMQ 4.4.0 is not built here (../shared/realmq/README.md): its pair was not run.")
    return t
