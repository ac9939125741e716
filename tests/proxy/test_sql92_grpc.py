"""SQL92 filter expressions through RocketMQ 5's gRPC protocol: the official Python 5.x client
(rocketmq-python-client) against `rmqstore serve` with enablePropertyFilter, the delivered sets RocketMQ
4.4.0 recorded (tests/data/sql92) for selectors covering every operator, a selector that does not compile
refused with RocketMQ's remark (ILLEGAL_FILTER_EXPRESSION), and SQL92 refused where enablePropertyFilter is off."""
from __future__ import annotations

import time

import pytest

pytest.importorskip("grpc")
pytest.importorskip("rocketmq.grpc_protocol")

from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer  # noqa: E402
from rocketmq.grpc_protocol import FilterType  # noqa: E402

from rmqstore.broker.server import ServerProcess  # noqa: E402
from rmqstore.filter import SelectorError, compile_sql92  # noqa: E402
from sql92_cases import sqltool_props, sqltool_record, sqltool_tag  # noqa: E402

TOPIC, N = "SqlGrpcTopic", 200
CHOSEN = ["E03", "E07", "E11", "E15", "E20", "E23", "E33", "E52"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("sqlgrpc") / "store", {
        "autoCreateTopicEnable": "true", "enablePropertyFilter": "true",
        "mappedFileSizeCommitLog": 16 * 1024 * 1024})
    srv.start()
    assert srv.grpc_addr, srv.log_tail()
    p = Producer(_config(srv), (TOPIC,))
    p.startup()
    try:
        for i in range(N):
            m = Message()
            m.topic, m.body, m.keys = TOPIC, str(i).encode(), f"sql-{i}"
            if sqltool_tag(i):
                m.tag = sqltool_tag(i)
            for k, v in sqltool_props(i).items():
                m.add_property(k, v)
            p.send(m)
    finally:
        p.shutdown()
    yield srv
    rc = srv.stop()
    assert rc == 0, srv.log_tail()


def _config(srv) -> ClientConfiguration:
    return ClientConfiguration(srv.grpc_addr, Credentials(), request_timeout=10)


def _consumer(srv, group: str, selector: str) -> SimpleConsumer:
    c = SimpleConsumer(_config(srv), group, {TOPIC: FilterExpression(selector, FilterType.SQL)}, await_duration=1)
    c.startup()
    return c


def _receive(c: SimpleConsumer, want: frozenset[int]) -> set[int]:
    got: set[int] = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        msgs = c.receive(32, 30)
        for m in msgs:
            got.add(int(m.body))
            c.ack(m)
        if not msgs and got >= want:
            return got          # a long poll found nothing more
    return got


def test_official_client_gets_rocketmq_delivered_sets(server):
    by_id = {r.id: r for r in sqltool_record()}
    for rid in CHOSEN:
        r = by_id[rid]
        c = _consumer(server, f"sql_grpc_{rid}", r.selector)
        try:
            assert _receive(c, r.delivered(N)) == r.delivered(N), rid
        finally:
            c.shutdown()


def test_selector_that_does_not_compile_is_refused(server):
    c = _consumer(server, "sql_grpc_bad", "a = AND b")
    try:
        with pytest.raises(Exception) as e:
            c.receive(32, 30)
        with pytest.raises(SelectorError) as e2:
            compile_sql92("a = AND b")
        assert e2.value.remark.split("\n")[0] in str(e.value)
    finally:
        c.shutdown()


def test_sql92_refused_without_property_filter(tmp_path):
    with ServerProcess(tmp_path / "store", {"autoCreateTopicEnable": "true",
                                            "mappedFileSizeCommitLog": 4 * 1024 * 1024}) as srv:
        p = Producer(_config(srv), (TOPIC,))
        p.startup()
        m = Message()
        m.topic, m.body = TOPIC, b"x"
        p.send(m)
        p.shutdown()
        c = _consumer(srv, "sql_grpc_off", "a > 1")
        try:
            with pytest.raises(Exception, match="does not support consumer to filter message by SQL92"):
                c.receive(32, 30)
        finally:
            c.shutdown()
