"""bench_server: throughput of rmqstore's server over loopback, driven by rmqstore.client.

    from rmqstore.broker.server import bench_server
    print(bench_server("small"))

Starts `python -m rmqstore.broker.server` on a temporary store (a child process, free ports), then, with 256-byte
bodies on a 4-queue topic: async sends with `in_flight` outstanding (as the RocketMQ numbers: 512), sync
sends, and a push consumer draining the async backlog; also the CPU time per message of this process (the
client) and of the server, over the async sends and over the consumption (Linux). Scales: "small" 10,000
messages, "full" 100,000, or an int. The real RocketMQ 4.4.0 broker on the reference 2-core machine: async send 17-22k msg/s,
sync 2.8-3.4k msg/s, push consume 13-38k msg/s.
"""
from __future__ import annotations

import os
import platform
import shutil
import tempfile
import threading
import time
from pathlib import Path

from .process import proc_stat_fields

SCALES = {"small": 10_000, "full": 100_000}


def cpu_seconds(pid: int | None = None) -> float | None:
    """CPU time (user + system) of this process, or of process pid (Linux /proc); None if unknown."""
    try:
        if pid is None:
            import resource
            r = resource.getrusage(resource.RUSAGE_SELF)
            return r.ru_utime + r.ru_stime
        fields = proc_stat_fields(f"/proc/{pid}/stat")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") if fields else None
    except (OSError, ValueError, IndexError, ImportError):
        return None


def cpu_us_per_msg(before: tuple, after: tuple, n: int) -> dict:
    """{"client": us, "server": us} of CPU per message between two (client, server) cpu_seconds readings."""
    return {side: (round((a - b) / n * 1e6, 1) if a is not None and b is not None and n else None)
            for side, b, a in zip(("client", "server"), before, after)}


def scratch_store(store_dir, prefix: str) -> tuple[str | None, Path]:
    """(a temporary directory for the caller to remove, or None; the store directory): store_dir as given,
    else "store" in a new temporary directory."""
    if store_dir is not None:
        return None, Path(store_dir)
    tmp = tempfile.mkdtemp(prefix=prefix)
    return tmp, Path(tmp) / "store"


def bench_body(size: int) -> bytes:
    """A body of size printable random bytes (no compression helps a transport)."""
    return os.urandom(size // 2).hex().encode()[:size].ljust(size, b"x")


def timed_sends(send, n: int) -> tuple[int, dict]:
    """Call send() n times, one after the other: (msg/s, {"p50", "p99"} latency in ms)."""
    lat = []
    t0 = time.perf_counter()
    for _ in range(n):
        s = time.perf_counter()
        send()
        lat.append(time.perf_counter() - s)
    took = time.perf_counter() - t0
    lat.sort()
    return round(n / took), {"p50": round(lat[len(lat) // 2] * 1000, 3), "p99": round(lat[int(len(lat) * 0.99)] * 1000, 3)}


def bench_server(scale: str | int = "small", *, body_size: int = 256, in_flight: int = 512, queues: int = 4,
                 store_dir: str | Path | None = None, conf: dict | None = None, sync_messages: int | None = None,
                 keep_store: bool = False) -> dict:
    from ..client import Admin
    from .process import ServerProcess

    n = SCALES[scale] if isinstance(scale, str) else int(scale)
    n_sync = sync_messages if sync_messages is not None else max(1000, n // 10)
    tmp, store_dir = scratch_store(store_dir, "rmqstore-bench-server-")
    cfg = {"mappedFileSizeCommitLog": 256 * 1024 * 1024, "maxHashSlotNum": 500_000, "maxIndexNum": 2_000_000}
    cfg.update(conf or {})
    body = bench_body(body_size)
    out: dict = {"messages": n, "sync_messages": n_sync, "body_size": body_size, "in_flight": in_flight,
                 "queues": queues, "python": platform.python_version(), "cpus": os.cpu_count()}
    srv = ServerProcess(store_dir, cfg).start()
    try:
        topic = f"BenchTopic{os.getpid()}_async"
        with Admin(srv.namesrv_addr) as admin:
            admin.create_topic(topic, queues)
            admin.create_topic(topic + "_sync", queues)
        sent = _bench_sends(srv, topic, body, n, n_sync, in_flight, out)
        _bench_push_consume(srv, topic, sent, n, out)
        out["reference_rocketmq_4_4_0"] = {"async_send_msgs_per_s": "17000-22000", "sync_send_msgs_per_s": "2800-3400",
                                           "push_consume_msgs_per_s": "13000-38000"}
    finally:
        rc = srv.stop()
        out["server_exit"] = rc
        if tmp is not None and not keep_store:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _bench_sends(srv, topic: str, body: bytes, n: int, n_sync: int, in_flight: int, out: dict) -> int:
    """Async sends (in_flight outstanding) to topic, then sync sends to topic_sync; the figures into out;
    how many async sends succeeded."""
    from ..client import Message, Producer
    producer = Producer("bench_pg", srv.namesrv_addr, max_async_in_flight=in_flight).start()
    try:
        # warm-up (connections, routes, the server's first files)
        for f in [producer.send_async(Message(topic + "_sync", body, tags="TagA")) for _ in range(500)]:
            f.result(30)
        sent = errors = 0
        cpu0 = (cpu_seconds(), cpu_seconds(srv.proc.pid))
        t0 = time.perf_counter()
        futures = [producer.send_async(Message(topic, body, tags="TagA", keys=f"k{i}")) for i in range(n)]
        for f in futures:
            try:
                f.result(60)
                sent += 1
            except Exception:
                errors += 1
        t_async = time.perf_counter() - t0
        out["async_send_msgs_per_s"] = round(sent / t_async)
        out["async_send_errors"] = errors
        out["async_send_cpu_us_per_msg"] = cpu_us_per_msg(cpu0, (cpu_seconds(), cpu_seconds(srv.proc.pid)), n)
        out["sync_send_msgs_per_s"], out["sync_send_latency_ms"] = timed_sends(
            lambda: producer.send(Message(topic + "_sync", body, tags="TagA")), n_sync)
        return sent
    finally:
        producer.shutdown()


def _bench_push_consume(srv, topic: str, sent: int, n: int, out: dict) -> None:
    """A push consumer draining the async backlog; the figures into out."""
    from ..client import ConsumeFromWhere, ConsumeStatus, PushConsumer
    got = [0]
    lock = threading.Lock()
    done = threading.Event()
    first = [0.0]

    def listener(msgs):
        with lock:
            if not got[0]:
                first[0] = time.perf_counter()
            got[0] += len(msgs)
            if got[0] >= sent:
                done.set()
        return ConsumeStatus.CONSUME_SUCCESS
    c = PushConsumer("bench_cg", srv.namesrv_addr, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                     consume_message_batch_max_size=32)
    c.subscribe(topic, "TagA")
    c.register_message_listener(listener)
    cpu0 = (cpu_seconds(), cpu_seconds(srv.proc.pid))
    t0 = time.perf_counter()
    c.start()
    try:
        done.wait(max(60.0, n / 1000))
        t_cons = time.perf_counter() - t0
        cpu1 = (cpu_seconds(), cpu_seconds(srv.proc.pid))
    finally:
        c.shutdown()
    out["push_consume_msgs_per_s"] = round(got[0] / t_cons) if got[0] else 0
    out["push_consume_from_first_msg_per_s"] = round(got[0] / (time.perf_counter() - first[0])) if got[0] else 0
    out["consumed"] = got[0]
    out["push_consume_cpu_us_per_msg"] = cpu_us_per_msg(cpu0, cpu1, got[0])
