"""RocketMQ 5 on the wire: the official Python 5.x client (rocketmq-python-client, extra `grpc`) against a
real `rmqstore serve` process (its gRPC endpoint, rmqstore.proxy), plus raw protocol calls for bad input."""
from __future__ import annotations

import time

import pytest

pytest.importorskip("grpc")
pytest.importorskip("rocketmq.grpc_protocol")

import grpc  # noqa: E402
from rocketmq import (ClientConfiguration, Credentials, FilterExpression, Message, Producer,  # noqa: E402
                      SimpleConsumer)
from rocketmq.grpc_protocol import definition_pb2 as pb, service_pb2 as spb  # noqa: E402
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub  # noqa: E402

from rmqstore.broker.server import ServerProcess  # noqa: E402

Code = pb.Code


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("grpc") / "store", {
        "autoCreateTopicEnable": "true", "transactionTimeOut": "1000", "transactionCheckInterval": "1000"})
    srv.start()
    assert srv.grpc_addr, srv.log_tail()
    yield srv
    rc = srv.stop()
    assert rc == 0, srv.log_tail()


def config(srv) -> ClientConfiguration:
    return ClientConfiguration(srv.grpc_addr, Credentials(), request_timeout=10)


def message(topic: str, body: bytes, *, tag: str | None = None, key: str | None = None, group: str | None = None,
            deliver_s: int | None = None) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    if tag:
        m.tag = tag
    if key:
        m.keys = key
    if group:
        m.message_group = group
    if deliver_s:
        m.delivery_timestamp = deliver_s
    return m


class Clients:
    """Official clients started against one server; all shut down at the end."""

    def __init__(self, srv):
        self.srv = srv
        self.started = []

    def producer(self, topics=(), checker=None) -> Producer:
        p = Producer(config(self.srv), tuple(topics), checker)
        p.startup()
        self.started.append(p)
        return p

    def consumer(self, group: str, topic: str, tag: str = "*", await_s: int = 1) -> SimpleConsumer:
        c = SimpleConsumer(config(self.srv), group, {topic: FilterExpression(tag)}, await_duration=await_s)
        c.startup()
        self.started.append(c)
        return c

    def close(self):
        for c in reversed(self.started):
            try:
                c.shutdown()
            except Exception:
                pass


@pytest.fixture
def clients(server):
    c = Clients(server)
    yield c
    c.close()


def receive_all(consumer, n: int, invisible_s: int = 30, deadline_s: float = 60, ack: bool = True):
    """Receive n messages; the client itself must find each whole (its body digest check: `corrupted`)."""
    got = []
    end = time.monotonic() + deadline_s
    while len(got) < n and time.monotonic() < end:
        for m in consumer.receive(32, invisible_s):
            assert not m.corrupted, (m.message_id, m.body)
            got.append(m)
            if ack:
                consumer.ack(m)
    return got


def stub(srv) -> tuple[grpc.Channel, MessagingServiceStub]:
    ch = grpc.insecure_channel(srv.grpc_addr)
    return ch, MessagingServiceStub(ch)


# --- the flows ----------------------------------------------------------------------------------------------
def test_send_receive_ack_exactly_once(clients):
    p = clients.producer(["T_ONCE"])
    sent = {}
    for i in range(500):
        m = message("T_ONCE", f"body {i}".encode(), tag="A" if i % 2 else "B", key=f"k{i}")
        m.add_property("idx", str(i))
        r = p.send(m)
        sent[r.message_id] = i
    c = clients.consumer("G_ONCE", "T_ONCE")
    got = receive_all(c, 500)
    ids = [m.message_id for m in got]
    assert len(ids) == len(set(ids)) == 500
    assert set(ids) == set(sent)
    for m in got:
        i = sent[m.message_id]
        assert m.body == f"body {i}".encode()
        assert m.tag == ("A" if i % 2 else "B")
        assert f"k{i}" in m.keys
        assert m.properties.get("idx") == str(i), m.properties     # what the client reports of it
    assert c.receive(32, 30) == []          # all acked: nothing more (after one long poll)


def test_push_consumer(clients):
    """The official PushConsumer: QueryAssignment, then receives and acks through its listener."""
    import threading
    from rocketmq import ConsumeResult, MessageListener, PushConsumer
    got, done = [], threading.Event()

    class Listener(MessageListener):
        def consume(self, m):
            got.append(m.body if not m.corrupted else b"corrupted")
            if len(got) >= 20:
                done.set()
            return ConsumeResult.SUCCESS

    p = clients.producer(["T_PUSH"])
    for i in range(20):
        p.send(message("T_PUSH", b"%d" % i))
    c = PushConsumer(config(clients.srv), "G_PUSH", Listener(), {"T_PUSH": FilterExpression()})
    c.startup()
    clients.started.append(c)
    assert done.wait(60)
    assert sorted(got) == sorted(b"%d" % i for i in range(20))


def test_tag_filter(clients):
    p = clients.producer(["T_TAG"])
    for i in range(10):
        p.send(message("T_TAG", b"x%d" % i, tag="A" if i < 4 else "B"))
    c = clients.consumer("G_TAG", "T_TAG", tag="A")
    got = receive_all(c, 4)
    assert sorted(m.body for m in got) == [b"x0", b"x1", b"x2", b"x3"]
    assert c.receive(32, 30) == []


def test_not_acked_is_redelivered_after_invisible_duration(clients):
    p = clients.producer(["T_REDO"])
    mid = p.send(message("T_REDO", b"again")).message_id
    c = clients.consumer("G_REDO", "T_REDO")
    first = receive_all(c, 1, invisible_s=2, ack=False)
    assert [m.message_id for m in first] == [mid]
    assert first[0].delivery_attempt == 1
    t0 = time.monotonic()
    second = receive_all(c, 1, invisible_s=30, ack=False)
    assert [m.message_id for m in second] == [mid]
    assert second[0].delivery_attempt == 2
    assert time.monotonic() - t0 >= 1.0        # not before the invisible time (2 s from the first receive)
    c.ack(second[0])
    with pytest.raises(Exception):
        c.ack(first[0])                         # the first handle is spent


def test_change_invisible_duration(clients):
    p = clients.producer(["T_CHG"])
    mid = p.send(message("T_CHG", b"later")).message_id
    c = clients.consumer("G_CHG", "T_CHG")
    m = receive_all(c, 1, invisible_s=30, ack=False)[0]
    c.change_invisible_duration(m, 1)
    again = receive_all(c, 1, invisible_s=30, ack=False)
    assert [x.message_id for x in again] == [mid]
    c.ack(again[0])


def test_delayed_message_arrives_no_earlier_than_its_time(clients):
    p = clients.producer(["T_DELAY"])
    c = clients.consumer("G_DELAY", "T_DELAY", await_s=5)
    deliver_s = int(time.time()) + 3
    p.send(message("T_DELAY", b"timer", deliver_s=deliver_s))
    got = receive_all(c, 1, deadline_s=30)
    arrived = time.time()
    assert [m.body for m in got] == [b"timer"]
    assert arrived >= deliver_s
    assert arrived <= deliver_s + 2 * 1.0 + 5     # precision 1 s (x2), plus a loaded machine's margin


def test_fifo_group_in_order_next_after_ack(clients):
    p = clients.producer(["T_FIFO"])
    for i in range(6):
        p.send(message("T_FIFO", b"%d" % i, group="order-1"))
    c = clients.consumer("G_FIFO", "T_FIFO")
    order = []
    end = time.monotonic() + 60
    while len(order) < 6 and time.monotonic() < end:
        batch = c.receive(32, 30)
        assert len(batch) <= 1, "a FIFO group's next message comes only after the previous is acked"
        for m in batch:
            order.append(int(m.body))
            c.ack(m)
    assert order == list(range(6))


def test_transaction_commit_and_rollback(clients):
    from rocketmq import TransactionChecker  # noqa: F401  (the checker is required to start a transaction)

    class Checker(TransactionChecker):
        def check(self, message):
            from rocketmq import TransactionResolution
            return TransactionResolution.COMMIT

    p = clients.producer(["T_TX"], checker=Checker())
    t1 = p.begin_transaction()
    r1 = p.send(message("T_TX", b"commit-me"), t1)
    t1.commit()
    t2 = p.begin_transaction()
    p.send(message("T_TX", b"roll-me-back"), t2)
    t2.rollback()
    c = clients.consumer("G_TX", "T_TX")
    got = receive_all(c, 1)
    assert [(m.message_id, m.body) for m in got] == [(r1.message_id, b"commit-me")]
    assert c.receive(32, 30) == []
    # an orphaned half (never ended): the server asks the producer over Telemetry, its checker commits
    t3 = p.begin_transaction()
    r3 = p.send(message("T_TX", b"orphan"), t3)
    got = receive_all(c, 1, deadline_s=60)
    assert [(m.message_id, m.body) for m in got] == [(r3.message_id, b"orphan")]


def test_4x_producer_and_5x_consumer_on_one_topic(server, clients):
    from rmqstore.client import Message as Message4, Producer as Producer4
    p4 = Producer4("pg_mixed", server.namesrv_addr).start()
    try:
        for i in range(20):
            p4.send(Message4("T_MIXED", f"four {i}", tags="X", keys=f"key{i}"))
        big = "z" * 10_000                      # compressed by the 4.x producer: the 5.x consumer gets it inflated
        p4.send(Message4("T_MIXED", big, tags="X"))
        due_ms = int(time.time() * 1000) + 2000      # a 4.x timer message (__STARTDELIVERTIME)
        p4.send(Message4("T_MIXED", "timed", tags="X", properties={"__STARTDELIVERTIME": str(due_ms)}))
    finally:
        p4.shutdown()
    p5 = clients.producer(["T_MIXED"])
    p5.send(message("T_MIXED", b"five", tag="X"))
    c = clients.consumer("G_MIXED", "T_MIXED", tag="X")
    got = receive_all(c, 23)
    bodies = sorted(m.body for m in got)
    assert bodies == sorted([f"four {i}".encode() for i in range(20)] + [big.encode(), b"five", b"timed"])
    # (that a timer message arrives no earlier than its time: test_timer.py and the 5.x delay test)


# --- bad input: the protocol's codes, and the server keeps serving ------------------------------------------
def test_bad_input_gets_protocol_codes(server):
    ch, s = stub(server)
    try:
        topic = pb.Resource(name="T_BAD")
        ok = s.QueryRoute(spb.QueryRouteRequest(topic=topic), timeout=10)
        assert ok.status.code == Code.OK and ok.message_queues
        assert ok.message_queues[0].broker.endpoints.addresses[0].port == int(server.grpc_addr.rsplit(":", 1)[1])
        # oversized body
        m = pb.Message(topic=topic, body=b"x" * (4 * 1024 * 1024 + 1))
        m.system_properties.message_id = "01" + "0" * 32
        r = s.SendMessage(spb.SendMessageRequest(messages=[m]), timeout=10)
        assert r.status.code == Code.MESSAGE_BODY_TOO_LARGE
        # wrong digests; right ones as each client spells them (CRC32 of b"abc" is 0x352441C2)
        for kind, checksum, code in ((pb.DigestType.CRC32, "00000000", Code.MESSAGE_CORRUPTED),
                                     (pb.DigestType.MD5, "0" * 32, Code.MESSAGE_CORRUPTED),
                                     (pb.DigestType.CRC32, "352441c2", Code.OK),
                                     (pb.DigestType.CRC32, str(0x352441C2), Code.OK),
                                     (pb.DigestType.MD5, "900150983cd24fb0d6963f7d28e17f72", Code.OK),
                                     (pb.DigestType.SHA1, "A9993E364706816ABA3E25717850C26C9CD0D89D", Code.OK)):
            m = pb.Message(topic=topic, body=b"abc")
            m.system_properties.message_id = "01" + "0" * 32
            m.system_properties.body_digest.type = kind
            m.system_properties.body_digest.checksum = checksum
            r = s.SendMessage(spb.SendMessageRequest(messages=[m]), timeout=10)
            assert r.status.code == code, (kind, checksum, r.status)
        # a system topic cannot be auto-created
        r = s.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name="rmq_sys_nope")), timeout=10)
        assert r.status.code == Code.TOPIC_NOT_FOUND
        # bad receipt handles
        for handle in ("garbage", "1 2 3 4 0 b 0 1 5"):
            r = s.AckMessage(spb.AckMessageRequest(group=pb.Resource(name="G_BAD"), topic=topic,
                                                   entries=[spb.AckMessageEntry(message_id="x", receipt_handle=handle)]),
                             timeout=10)
            assert r.status.code == Code.INVALID_RECEIPT_HANDLE, r
        r = s.ChangeInvisibleDuration(spb.ChangeInvisibleDurationRequest(
            group=pb.Resource(name="G_BAD"), topic=topic, receipt_handle="nope", message_id="x"), timeout=10)
        assert r.status.code == Code.INVALID_RECEIPT_HANDLE
        # receive from a topic that does not exist, and an illegal invisible time
        rq = spb.ReceiveMessageRequest(group=pb.Resource(name="G_BAD"), batch_size=1)
        rq.message_queue.topic.name = "T_NEVER_MADE"
        assert [x.status.code for x in s.ReceiveMessage(rq, timeout=10)] == [Code.TOPIC_NOT_FOUND]
        rq.message_queue.topic.name = "T_BAD"
        rq.invisible_duration.FromMilliseconds(10)
        assert [x.status.code for x in s.ReceiveMessage(rq, timeout=10)] == [Code.ILLEGAL_INVISIBLE_TIME]
        # an RPC not served: UNSUPPORTED, not a dropped call
        r = s.RecallMessage(spb.RecallMessageRequest(topic=topic, recall_handle="x"), timeout=10)
        assert r.status.code == Code.UNSUPPORTED
        # bad transaction id
        r = s.EndTransaction(spb.EndTransactionRequest(topic=topic, message_id="x", transaction_id="zz",
                                                       resolution=pb.TransactionResolution.COMMIT), timeout=10)
        assert r.status.code == Code.INVALID_TRANSACTION_ID
        # a delivery time beyond timerMaxDelaySec (3 days)
        m = pb.Message(topic=topic, body=b"far")
        m.system_properties.delivery_timestamp.FromMilliseconds(int(time.time() * 1000) + 10 * 86400_000)
        m.system_properties.message_type = pb.MessageType.DELAY
        r = s.SendMessage(spb.SendMessageRequest(messages=[m]), timeout=10)
        assert r.status.code == Code.ILLEGAL_DELIVERY_TIME, r
        # still serving
        ok = s.QueryRoute(spb.QueryRouteRequest(topic=topic), timeout=10)
        assert ok.status.code == Code.OK
    finally:
        ch.close()


def raw_receive(s, group: str, topic: str, invisible_ms: int, deadline_s: float = 30):
    rq = spb.ReceiveMessageRequest(group=pb.Resource(name=group), batch_size=1)
    rq.message_queue.topic.name = topic
    rq.invisible_duration.FromMilliseconds(invisible_ms)
    rq.long_polling_timeout.FromSeconds(2)
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        msgs = [x.message for x in s.ReceiveMessage(rq, timeout=10) if x.HasField("message")]
        if msgs:
            return msgs
    return []


def test_expired_handle_and_dead_letter_forward(server):
    ch, s = stub(server)
    try:
        topic = pb.Resource(name="T_DLQ")
        for body in (b"one", b"two"):
            m = pb.Message(topic=topic, body=body)
            assert s.SendMessage(spb.SendMessageRequest(messages=[m]), timeout=10).status.code == Code.OK
        group = pb.Resource(name="G_DLQ")
        first = raw_receive(s, "G_DLQ", "T_DLQ", 1000)[0]
        import hashlib                      # RocketMQ 5's proxy sends an MD5 digest, upper-case hex
        assert first.system_properties.body_digest.type == pb.DigestType.MD5
        assert first.system_properties.body_digest.checksum == hashlib.md5(first.body).hexdigest().upper()
        time.sleep(1.2)
        r = s.AckMessage(spb.AckMessageRequest(group=group, topic=topic, entries=[spb.AckMessageEntry(
            message_id=first.system_properties.message_id, receipt_handle=first.system_properties.receipt_handle)]),
            timeout=10)
        assert r.status.code == Code.INVALID_RECEIPT_HANDLE and "expired" in r.status.message
        got = raw_receive(s, "G_DLQ", "T_DLQ", 30_000) + raw_receive(s, "G_DLQ", "T_DLQ", 30_000)
        assert sorted(m.body for m in got) == [b"one", b"two"]
        for m in got:
            r = s.ForwardMessageToDeadLetterQueue(spb.ForwardMessageToDeadLetterQueueRequest(
                group=group, topic=topic, receipt_handle=m.system_properties.receipt_handle,
                message_id=m.system_properties.message_id, delivery_attempt=2, max_delivery_attempts=16), timeout=10)
            assert r.status.code == Code.OK
        rq = spb.ReceiveMessageRequest(group=group, batch_size=4)
        rq.message_queue.topic.name = "%DLQ%G_DLQ"
        rq.invisible_duration.FromSeconds(30)
        rq.long_polling_timeout.FromSeconds(2)
        # a dead-letter topic is readable as any other (perm 0 in RocketMQ: here by topics.json's config)
        codes_or_msgs = list(s.ReceiveMessage(rq, timeout=10))
        assert codes_or_msgs[0].HasField("status")
    finally:
        ch.close()


def test_pull_and_offsets(server):
    """The Node client's push path: QueryOffset, PullMessage (long polling), UpdateOffset, GetOffset."""
    ch, s = stub(server)
    try:
        topic = pb.Resource(name="T_PULL")
        assert s.QueryRoute(spb.QueryRouteRequest(topic=topic), timeout=10).status.code == Code.OK
        for i in range(5):
            m = pb.Message(topic=topic, body=b"p%d" % i)
            m.system_properties.tag = "A" if i % 2 == 0 else "B"
            assert s.SendMessage(spb.SendMessageRequest(messages=[m]), timeout=10).status.code == Code.OK
        group = pb.Resource(name="G_PULL")

        def end_offset(qid):
            return s.QueryOffset(spb.QueryOffsetRequest(message_queue=pb.MessageQueue(topic=topic, id=qid),
                                                        query_offset_policy=pb.QueryOffsetPolicy.END), timeout=10).offset
        deadline = time.monotonic() + 30            # sent = stored; the consume queues follow (dispatch)
        while sum(end_offset(q) for q in range(4)) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        found = {}
        for qid in range(4):
            mq = pb.MessageQueue(topic=topic, id=qid)
            lo = s.QueryOffset(spb.QueryOffsetRequest(message_queue=mq,
                                                      query_offset_policy=pb.QueryOffsetPolicy.BEGINNING), timeout=10)
            hi = s.QueryOffset(spb.QueryOffsetRequest(message_queue=mq,
                                                      query_offset_policy=pb.QueryOffsetPolicy.END), timeout=10)
            assert lo.status.code == hi.status.code == Code.OK and lo.offset == 0
            rq = spb.PullMessageRequest(group=group, message_queue=mq, offset=0, batch_size=32)
            rq.filter_expression.type = pb.FilterType.TAG
            rq.filter_expression.expression = "A"
            rq.long_polling_timeout.FromSeconds(1)
            out = list(s.PullMessage(rq, timeout=10))
            assert out[0].HasField("status") and out[-1].HasField("next_offset")
            assert out[-1].next_offset == hi.offset
            found.update({x.message.body: qid for x in out if x.HasField("message")})
            assert s.UpdateOffset(spb.UpdateOffsetRequest(group=group, message_queue=mq, offset=hi.offset),
                                  timeout=10).status.code == Code.OK
            got = s.GetOffset(spb.GetOffsetRequest(group=group, message_queue=mq), timeout=10)
            assert (got.status.code, got.offset) == (Code.OK, hi.offset)
        assert sorted(found) == [b"p0", b"p2", b"p4"]
        r = s.GetOffset(spb.GetOffsetRequest(group=pb.Resource(name="G_NEVER"),
                                             message_queue=pb.MessageQueue(topic=topic, id=0)), timeout=10)
        assert r.status.code == Code.OFFSET_NOT_FOUND
        r = s.GetOffset(spb.GetOffsetRequest(group=group, message_queue=pb.MessageQueue(topic=topic, id=99)), timeout=10)
        assert r.status.code == Code.BAD_REQUEST
    finally:
        ch.close()


def test_unknown_topic_without_auto_create(tmp_path):
    with ServerProcess(tmp_path / "store", {"autoCreateTopicEnable": "false"}) as srv:
        ch, s = stub(srv)
        try:
            r = s.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name="T_NOPE")), timeout=10)
            assert r.status.code == Code.TOPIC_NOT_FOUND
            m = pb.Message(topic=pb.Resource(name="T_NOPE"), body=b"x")
            r = s.SendMessage(spb.SendMessageRequest(messages=[m]), timeout=10)
            assert r.status.code == Code.TOPIC_NOT_FOUND
            r = s.Heartbeat(spb.HeartbeatRequest(), timeout=10)
            assert r.status.code == Code.OK
        finally:
            ch.close()


# --- restart --------------------------------------------------------------------------------------------------
def test_kill_and_restart_keep_unacked_and_timer_messages(tmp_path):
    store = tmp_path / "store"
    srv = ServerProcess(store, {"autoCreateTopicEnable": "true"}).start()
    cl = Clients(srv)
    try:
        p = cl.producer(["T_RS"])
        mids = {p.send(message("T_RS", b"r%d" % i)).message_id for i in range(3)}
        deliver_s = int(time.time()) + 6
        timer_id = p.send(message("T_RS", b"timer", deliver_s=deliver_s)).message_id
        c = cl.consumer("G_RS", "T_RS")
        first = receive_all(c, 3, invisible_s=4, ack=False)
        assert {m.message_id for m in first} == mids
        c.ack(first[0])
    finally:
        cl.close()
        srv.kill()                      # SIGKILL: what was answered must be on disk
    srv = ServerProcess(store, {"autoCreateTopicEnable": "true"}).start()
    cl = Clients(srv)
    try:
        c = cl.consumer("G_RS", "T_RS", await_s=5)
        got = receive_all(c, 3, deadline_s=60)
        ids = [m.message_id for m in got]
        assert sorted(ids) == sorted((mids - {first[0].message_id}) | {timer_id})
        assert time.time() >= deliver_s
        assert c.receive(32, 30) == []
    finally:
        cl.close()
        assert srv.stop() == 0, srv.log_tail()


def test_default_grpc_port_taken_serves_remoting_only(tmp_path):
    """grpcListenPort unset (8081) and 8081 taken: a warning, remoting still served, "grpc": null."""
    import json
    import signal
    import socket
    import subprocess
    import sys
    from rmqstore.broker.server import free_port, free_port_pair
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 8081))
        holder.listen()
    except OSError:
        pass                                   # taken by someone else: the same situation
    port, ns = free_port_pair(), free_port()
    p = subprocess.Popen([sys.executable, "-m", "rmqstore.broker.server", str(tmp_path / "s"), "--listen-port",
                          str(port), "--namesrv-addr", f"127.0.0.1:{ns}"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        ready = json.loads(p.stdout.readline())
        assert ready["event"] == "ready" and ready["grpc"] is None and ready["broker"] == f"127.0.0.1:{port}"
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
        assert "no gRPC endpoint" in p.stderr.read()
    finally:
        holder.close()
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_picked_grpc_port_taken_before_the_bind_is_picked_again(tmp_path, monkeypatch):
    """Another process binds the gRPC port ServerProcess picked before its server does (a race seen in the
    suite: two workers, random ports): the start is retried on new ports instead of failing."""
    import socket
    from rmqstore.broker import process
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    srv = ServerProcess(tmp_path / "store")
    picks = iter([taken])               # the next port picked (the gRPC port, at the start) is the taken one
    real = process.free_port
    monkeypatch.setattr(process, "free_port", lambda host="127.0.0.1": next(picks, None) or real(host))
    srv.start()
    try:
        assert srv.grpc_addr and not srv.grpc_addr.endswith(f":{taken}")
    finally:
        holder.close()
        assert srv.stop() == 0, srv.log_tail()


_IMPORTS = r"""
import sys
from rmqstore.proxy import protocol, server
assert "rocketmq.v5" not in sys.modules, "the endpoint imported the 5.x client"
import rocketmq
import rocketmq.grpc_protocol
from rocketmq import ClientConfiguration, Producer            # the package's own __init__ runs now
assert "rocketmq.v5" in sys.modules and Producer.__module__.startswith("rocketmq.v5")
assert rocketmq.grpc_protocol.Code is protocol.Code and "Producer" in rocketmq.__all__
print("ok")
"""


def test_the_endpoint_loads_only_the_generated_protocol_and_the_client_still_imports():
    """A broker's gRPC endpoint imports rocketmq.grpc_protocol without the package's __init__ (the whole 5.x
    client); the same process can still use the client, with the same protocol modules."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", _IMPORTS], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
