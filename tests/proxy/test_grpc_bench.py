"""bench_grpc (rmqstore.broker.bench_grpc) at a tiny scale: the official Python 5.x client sends and receives + acks
through a real `rmqstore serve` over gRPC; positive figures, every message acked exactly once; the suite's
grpc table (beside the remoting rows) builds from its answer."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("grpc")
pytest.importorskip("rocketmq.grpc_protocol")

from rmqstore.broker.bench_grpc import bench_grpc  # noqa: E402
from rmqstore.tools import benchsuite  # noqa: E402
from rmqstore.tools.suite.reference import grpc_table, server_table  # noqa: E402

# bench_server's answer as in the committed full-scale run (the remoting rows)
SERVER = {"messages": 100000, "sync_messages": 10000, "body_size": 256, "in_flight": 512, "queues": 4,
          "async_send_msgs_per_s": 19021, "async_send_errors": 0,
          "async_send_cpu_us_per_msg": {"client": 47.3, "server": 41.1}, "sync_send_msgs_per_s": 2336,
          "sync_send_latency_ms": {"p50": 0.385, "p99": 0.814}, "push_consume_msgs_per_s": 32310,
          "consumed": 100000, "server_exit": 0}


@pytest.fixture(scope="module")
def answer(tmp_path_factory):
    return bench_grpc(300, sync_messages=50, in_flight=64, store_dir=tmp_path_factory.mktemp("grpcbench") / "s")


def test_bench_grpc_figures_and_exactly_once(answer):
    r = answer
    for key in ("send_sync_msgs_per_s", "send_async_msgs_per_s", "receive_ack_msgs_per_s"):
        assert isinstance(r[key], int) and r[key] > 0, (key, r)
    assert r["messages"] == r["acked"] == 300 and r["sync_messages"] == 50
    assert r["send_async_errors"] == 0 and r["redelivered_after_all_acked"] == 0
    assert r["receive_calls"] >= 10                       # batches of at most 32: at least ceil(300 / 32)
    assert r["body_size"] == 256 and r["server_exit"] == 0
    assert r["send_sync_latency_ms"]["p50"] > 0
    assert r["limit_grpc_unary_sync_msgs_per_s"] > 0 and r["limit_grpc_unary_async_msgs_per_s"] > 0
    assert r["limit_grpc_calls"] == 300 and r["limit_grpc_payload"] == 356
    assert set(r["limit_grpc_unary_async_cpu_us_per_call"]) == {"client", "server"}


def _section(md: str, title: str) -> list[str]:
    section = md.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    return [row for row in section.splitlines() if row.startswith("| ") and not row.startswith("| system")]


def test_grpc_table_beside_remoting_rows(answer, tmp_path):
    t = grpc_table(answer, server_table(SERVER))
    md = benchsuite.render_markdown([t], "full", tmp_path, 1.0, [], (0, 0, 0), None)
    rows = _section(md, "RocketMQ 5 gRPC beside 4.x remoting")
    assert len(rows) == 8, rows
    assert rows[0].startswith("| rmqstore server, remoting (rmqstore.client): async send (512 in flight) | "
                              "19,021 msg/s | 1.00 (reference) |")
    grpc_rows = [row for row in rows if "gRPC (official 5.x client)" in row]
    assert len(grpc_rows) == 3
    for row in rows[1:]:
        assert re.search(r"\| [\d,]+ msg/s.* \| \d+\.\d\d \|$", row), row
    ratio = float(grpc_rows[0].rsplit("|", 2)[1])
    assert ratio == pytest.approx(answer["send_async_msgs_per_s"] / 19021, abs=0.006)
    assert "acked exactly once: 300 of 300" in md
    limits = [r for r in t.rows if r.system.startswith("limit: grpcio")]
    assert len(limits) == 2 and all(r.category() == "limit" and r.value > 0 for r in limits)
    chart = tmp_path / "r.png"
    benchsuite.render_chart([t], chart, "full")
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_grpc_table_without_remoting_says_so(answer):
    t = grpc_table(answer, None)
    assert len(t.rows) == 5 and t.ref_value() is None
    assert any("remoting rows were not measured" in n for n in t.notes)


def test_suite_grpc_step_uses_the_server_steps_rows(tmp_path):
    """The suite's grpc step (at the tiny scale: 300 messages) takes the remoting rows from the server step
    of the same run instead of measuring them again."""
    suite = benchsuite.Suite("tiny", tmp_path, log=lambda s: None)
    suite.tables.append(server_table(SERVER))
    t = suite.grpc()
    assert [r.system for r in t.rows if r.ref] == ["rmqstore server, remoting (rmqstore.client): async send "
                                                   "(512 in flight)"]
    assert all("ERROR" not in r.text for r in t.rows), [r.text for r in t.rows]
    assert len(t.rows) == 8 and all(r.value and r.value > 0 for r in t.rows)


def test_a_message_this_run_did_not_send_is_an_error_not_a_figure(tmp_path):
    """Exactly once is checked, not assumed: a message already in the benchmark's topic (put there through the
    remoting port before the run) reaches the consumer, and bench_grpc raises instead of answering figures."""
    import os

    from rmqstore.broker.process import ServerProcess
    from rmqstore.client import Admin, Message, Producer
    from rmqstore.broker.bench_grpc import BenchError
    store, topic = tmp_path / "store", f"GrpcBench{os.getpid()}"
    with ServerProcess(store, {"grpcListenPort": "-1", "mappedFileSizeCommitLog": 256 * 1024 * 1024}) as srv:
        with Admin(srv.namesrv_addr) as admin:
            admin.create_topic(topic, 4)
        p = Producer("stranger_pg", srv.namesrv_addr).start()
        try:
            p.send(Message(topic, b"not from this run", tags="TagA"))
        finally:
            p.shutdown()
    with pytest.raises(BenchError, match="was not sent by this run"):
        bench_grpc(100, sync_messages=20, store_dir=store)
