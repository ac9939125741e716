"""bench_grpc: throughput of `rmqstore serve`'s gRPC endpoint over loopback, driven by the official Python 5.x
client (rocketmq-python-client, extra `rmqstore[grpc]`).

    from rmqstore.broker.bench_grpc import bench_grpc
    print(bench_grpc("small"))

Starts `python -m rmqstore.broker.server` on a temporary store (a child process, free ports, as bench_server),
then, with 256-byte bodies on 4-queue topics: sync sends one at a time (Producer.send), async sends with
`in_flight` outstanding (Producer.send_async; the client has no bound of its own, so a semaphore keeps the
number in flight), and a SimpleConsumer receiving batches of `batch` (32) with long polling and acking every
message (SimpleConsumer.ack, one call per message: the client's ack_async returns no future to wait on)
until every message of the async sends is acked. Exactly once is checked: a message received twice, one
never received, an id that was not sent, a failed send or a failed ack raises BenchError (a figure is only
given for a complete run). Scales: "small" 2,000 messages, "full" 15,000 (55-70 s on the 2-core reference
machine, where client and server each spend about 1 ms of CPU per message sent, about half of it grpcio's own
per-call cost), or an int; sync sends are a tenth of that (at least 200). grpc_limit adds what grpcio itself
allows here (round trips to an echo handler), the limit rows of the table.
"""
from __future__ import annotations

import os
import platform
import shutil
import threading
import time
from pathlib import Path

from .bench import bench_body, cpu_seconds, cpu_us_per_msg, scratch_store, timed_sends

SCALES = {"small": 2_000, "full": 15_000}


class BenchError(RuntimeError):
    """The gRPC benchmark's run was not complete (a lost, duplicate or failed message): no figure."""


def bench_grpc(scale: str | int = "small", *, body_size: int = 256, in_flight: int = 256, queues: int = 4,
               batch: int = 32, sync_messages: int | None = None, invisible_s: int = 120, long_poll_s: int = 5,
               store_dir: str | Path | None = None, conf: dict | None = None, keep_store: bool = False) -> dict:
    """The figures (msg/s: send_sync, send_async, receive_ack) and counts of one run; see the module."""
    from .process import ServerProcess
    from ..client import Admin

    n = SCALES[scale] if isinstance(scale, str) else int(scale)
    n_sync = sync_messages if sync_messages is not None else max(200, n // 10)
    tmp, store_dir = scratch_store(store_dir, "rmqstore-bench-grpc-")
    cfg = {"mappedFileSizeCommitLog": 256 * 1024 * 1024}
    cfg.update(conf or {})
    body = bench_body(body_size)
    out: dict = {"messages": n, "sync_messages": n_sync, "body_size": body_size, "in_flight": in_flight,
                 "queues": queues, "batch": batch, "python": platform.python_version(), "cpus": os.cpu_count(),
                 "client": _client_version()}
    srv = ServerProcess(store_dir, cfg).start()
    try:
        if not srv.grpc_addr:
            raise BenchError(f"`rmqstore serve` started without its gRPC endpoint (is the extra `rmqstore[grpc]` "
                             f"installed?): {srv.log_tail(1000)}")
        topic = f"GrpcBench{os.getpid()}"
        with Admin(srv.namesrv_addr) as admin:
            for t in (topic, topic + "_sync", topic + "_warm"):
                admin.create_topic(t, queues)
        sent = _bench_sends(srv, topic, body, n, n_sync, in_flight, out)
        _bench_receive_ack(srv, topic, sent, batch, invisible_s, long_poll_s, out)
    finally:
        out["server_exit"] = srv.stop()
        if tmp is not None and not keep_store:
            shutil.rmtree(tmp, ignore_errors=True)
    out.update(grpc_limit(max(300, n // 5), body_size + 100, in_flight))
    return out


def grpc_limit(calls: int, payload: int, in_flight: int) -> dict:
    """What grpcio itself allows on this machine: unary round trips of payload bytes to a grpc.aio server (a
    child process, as `serve`'s) whose handler answers the request as it came, one at a time and with
    in_flight outstanding (calls each); msg/s, the limit any gRPC server written with grpcio meets."""
    import subprocess
    import sys

    import grpc

    from .process import free_port
    port = free_port()
    code = f"from rmqstore.broker.bench_grpc import _echo_server; _echo_server({port})"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        if proc.stdout.readline().strip() != b"ready":
            err = proc.communicate(timeout=10)[1].decode(errors="replace")[-500:]
            raise BenchError(f"the grpcio echo server on port {port} did not start: {err}")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = ch.unary_unary("/rmqstore.bench.Echo/Call")
            data = b"x" * payload
            for _ in range(200):
                call(data, timeout=30)
            t0 = time.perf_counter()
            for _ in range(calls):
                call(data, timeout=30)
            one = calls / (time.perf_counter() - t0)
            cpu0 = (cpu_seconds(), cpu_seconds(proc.pid))
            many = _echo_in_flight(call, data, calls, in_flight)
            cpu = cpu_us_per_msg(cpu0, (cpu_seconds(), cpu_seconds(proc.pid)), calls)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()
    return {"limit_grpc_calls": calls, "limit_grpc_payload": payload,
            "limit_grpc_unary_sync_msgs_per_s": round(one), "limit_grpc_unary_async_msgs_per_s": round(many),
            "limit_grpc_unary_async_cpu_us_per_call": cpu}


def _echo_in_flight(call, data: bytes, calls: int, in_flight: int) -> float:
    slots = threading.BoundedSemaphore(in_flight)
    lock = threading.Lock()
    done, failed = [0], []
    finished = threading.Event()

    def on_done(f):
        if f.exception() is not None:
            failed.append(f.exception())
        slots.release()
        with lock:
            done[0] += 1
            if done[0] == calls:
                finished.set()
    t0 = time.perf_counter()
    for _ in range(calls):
        slots.acquire()
        call.future(data, timeout=60).add_done_callback(on_done)
    if not finished.wait(max(120.0, calls / 100)) or failed:
        raise BenchError(f"grpcio echo: {done[0]} of {calls} calls answered, {len(failed)} failed "
                         f"{failed[:1]}")
    return calls / (time.perf_counter() - t0)


def _echo_server(port: int) -> None:
    """The child of grpc_limit: a grpc.aio server on 127.0.0.1:port answering each request with itself."""
    import asyncio

    import grpc

    async def echo(request, context):
        return request

    async def main():
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "rmqstore.bench.Echo", {"Call": grpc.unary_unary_rpc_method_handler(echo)}),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()
    asyncio.run(main())


def _client_version() -> str:
    try:
        from importlib.metadata import version
        return f"rocketmq-python-client {version('rocketmq-python-client')}"
    except Exception:  # noqa: BLE001 - informative only
        return "rocketmq-python-client"


def _config(srv):
    from rocketmq import ClientConfiguration, Credentials
    return ClientConfiguration(srv.grpc_addr, Credentials(), request_timeout=30)


def _message(topic: str, body: bytes, key: str | None = None):
    from rocketmq import Message
    m = Message()
    m.topic = topic
    m.body = body
    m.tag = "TagA"
    if key:
        m.keys = key
    return m


def _bench_sends(srv, topic: str, body: bytes, n: int, n_sync: int, in_flight: int, out: dict) -> set[str]:
    """Sync sends to topic_sync, then async sends (in_flight outstanding) to topic; the figures into out; the
    message ids of the async sends (every one acknowledged by the server)."""
    from rocketmq import Producer
    producer = Producer(_config(srv), (topic, topic + "_sync", topic + "_warm"))
    producer.startup()
    try:
        for _ in range(200):             # warm-up (channel, routes, the server's first files)
            producer.send(_message(topic + "_warm", body))
        out["send_sync_msgs_per_s"], out["send_sync_latency_ms"] = timed_sends(
            lambda: producer.send(_message(topic + "_sync", body)), n_sync)
        return _async_sends(srv, producer, topic, body, n, in_flight, out)
    finally:
        producer.shutdown()


def _async_sends(srv, producer, topic: str, body: bytes, n: int, in_flight: int, out: dict) -> set[str]:
    """n send_async calls with at most in_flight outstanding; every receipt's message id, or BenchError."""
    slots = threading.BoundedSemaphore(in_flight)
    ids: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()
    all_done = threading.Event()
    done = [0]

    def on_done(f):
        try:
            mid = f.result().message_id
            with lock:
                ids.append(mid)
        except Exception as e:  # noqa: BLE001 - counted, then raised as BenchError
            with lock:
                errors.append(f"{type(e).__name__}: {e}")
        slots.release()
        with lock:
            done[0] += 1
            if done[0] == n:
                all_done.set()

    cpu0 = (cpu_seconds(), cpu_seconds(srv.proc.pid))
    t0 = time.perf_counter()
    for i in range(n):
        if not slots.acquire(timeout=120):
            raise BenchError(f"gRPC async send {i} of {n}: no answer for 120 s with {in_flight} in flight")
        producer.send_async(_message(topic, body, f"k{i}")).add_done_callback(on_done)
    if not all_done.wait(max(120.0, n / 100)):
        raise BenchError(f"gRPC async sends: {done[0]} of {n} answered")
    t_async = time.perf_counter() - t0
    out["send_async_msgs_per_s"] = round(n / t_async)
    out["send_async_cpu_us_per_msg"] = cpu_us_per_msg(cpu0, (cpu_seconds(), cpu_seconds(srv.proc.pid)), n)
    out["send_async_errors"] = len(errors)
    if errors:
        raise BenchError(f"gRPC async sends: {len(errors)} of {n} failed, first: {errors[0]}")
    unique = set(ids)
    if len(unique) != n:
        raise BenchError(f"gRPC async sends: {n} receipts carry {len(unique)} distinct message ids")
    return unique


def _bench_receive_ack(srv, topic: str, sent: set[str], batch: int, invisible_s: int, long_poll_s: int,
                       out: dict) -> None:
    """A SimpleConsumer receiving batches and acking each message until every id of sent is acked once; the
    figures into out; BenchError on a duplicate, a stranger, a failed ack or a message missing at the end."""
    from rocketmq import FilterExpression, SimpleConsumer
    c = SimpleConsumer(_config(srv), f"GrpcBench{os.getpid()}_cg", {topic: FilterExpression("TagA")},
                       await_duration=long_poll_s)
    c.startup()
    try:
        n = len(sent)
        acked: set[str] = set()
        receives = 0
        cpu0 = (cpu_seconds(), cpu_seconds(srv.proc.pid))
        t0 = time.perf_counter()
        deadline = time.monotonic() + max(120.0, n / 50)
        while len(acked) < n and time.monotonic() < deadline:
            msgs = c.receive(batch, invisible_s)
            receives += 1
            for m in msgs:
                mid = m.message_id
                if mid in acked:
                    raise BenchError(f"gRPC receive: message {mid} delivered again after its ack "
                                     f"(delivery attempt {m.delivery_attempt})")
                if mid not in sent:
                    raise BenchError(f"gRPC receive: message {mid} was not sent by this run")
                c.ack(m)
                acked.add(mid)
        t_recv = time.perf_counter() - t0
        cpu1 = (cpu_seconds(), cpu_seconds(srv.proc.pid))
        out["receive_ack_msgs_per_s"] = round(len(acked) / t_recv) if acked else 0
        out["receive_ack_cpu_us_per_msg"] = cpu_us_per_msg(cpu0, cpu1, len(acked))
        out["receive_calls"] = receives
        out["acked"] = len(acked)
        if len(acked) < n:
            missing = sorted(sent - acked)
            raise BenchError(f"gRPC receive: {n - len(acked)} of {n} messages never received "
                             f"in {t_recv:.0f} s, e.g. {missing[:3]}")
        c.await_duration = 1             # one short long poll: nothing may come again
        again = c.receive(batch, invisible_s)
        out["redelivered_after_all_acked"] = len(again)
        if again:
            raise BenchError(f"gRPC receive: {len(again)} message(s) delivered again after every message was "
                             f"acked, e.g. {again[0].message_id}")
    finally:
        c.shutdown()
