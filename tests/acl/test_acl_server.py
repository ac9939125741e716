"""`rmqstore serve` with aclEnable=true, over real sockets: rmqstore's own signing clients (right keys work;
wrong secret, unknown key, no signature, DENY topic, SUB-only send, non-admin admin requests and an
address outside the white list are refused and store nothing), white lists, a plain_acl.yml edited while
serving, the name server's registrations, the broker's own credentials kept out of GET_BROKER_CONFIG,
hostile input at the auth layer, `rmqstore admin` with keys, and the official RocketMQ 5 Python client
with right and wrong Credentials over gRPC."""
from __future__ import annotations

import os
import socket
import threading
import time
import zlib
from pathlib import Path

import pytest

from rmqstore.acl import SessionCredentials, sign_fields
from rmqstore.broker.server import ServerProcess
from rmqstore.client import (Admin, ConsumeStatus, Message, MQBrokerError, Producer, PushConsumer)
from rmqstore.remoting import fastjson
from rmqstore.remoting.codes import RequestCode, ResponseCode
from rmqstore.remoting.command import FrameDecoder, RemotingCommand

from conftest import run_cli
from broker.test_server import Conn

R = RequestCode
ACL_EXCEPTION = "org.apache.rocketmq.acl.common.AclException: "
RULES = """\
globalWhiteRemoteAddresses:
- 127.0.0.2
accounts:
- accessKey: aclAppUser1
  secretKey: aclAppSecret1
  defaultTopicPerm: DENY
  defaultGroupPerm: DENY
  topicPerms: [AclTopicMain=PUB|SUB, AclTopicOther=PUB|SUB]
  groupPerms: [acl_cg_main=SUB]
- accessKey: aclDenyUser4
  secretKey: aclDenySecret4
  defaultTopicPerm: PUB
  topicPerms: [AclTopicDenied=DENY]
- accessKey: aclSubOnly5
  secretKey: aclSubSecret5
  topicPerms: [AclTopicMain=SUB]
  groupPerms: [acl_cg_sub=SUB]
- accessKey: aclAdminUser7
  secretKey: aclAdminSecret7
  admin: true
- accessKey: aclLocalUser9
  secretKey: aclLocalSecret9
  whiteRemoteAddress: 127.0.0.1
- accessKey: aclFarUser11
  secretKey: aclFarSecret11
  whiteRemoteAddress: 10.9.9.*
  topicPerms: [AclTopicMain=PUB]
- accessKey: aclGrpcUser10
  secretKey: aclGrpcSecret10
  topicPerms: [AclGrpcTopic=PUB|SUB]
  groupPerms: [acl_grpc_cg=SUB]
"""
APP = SessionCredentials("aclAppUser1", "aclAppSecret1")
ADMIN = SessionCredentials("aclAdminUser7", "aclAdminSecret7")
INNER = '{"accessKey":"aclAdminUser7","secretKey":"aclAdminSecret7"}'
TOPICS = ("AclTopicMain", "AclTopicOther", "AclTopicDenied", "AclGrpcTopic")


def write_rules(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("acl")
    (root / "home" / "conf").mkdir(parents=True)
    write_rules(root / "home" / "conf" / "plain_acl.yml", RULES)
    srv = ServerProcess(root / "store", {"aclEnable": "true", "rocketmqHome": str(root / "home"),
                                         "autoCreateTopicEnable": "false", "mappedFileSizeCommitLog": 4 << 20,
                                         "innerClientAuthenticationCredentials": INNER})
    srv.start()
    srv.acl_file = root / "home" / "conf" / "plain_acl.yml"
    srv.root = root
    with Admin(srv.namesrv_addr, credentials=ADMIN) as a:
        for t in TOPICS:
            a.create_topic(t, 4)
    yield srv
    assert srv.stop() == 0, srv.log_tail()


def stored(srv, topic: str) -> int:
    with Admin(srv.namesrv_addr, credentials=ADMIN, instance_name=f"count-{time.monotonic_ns()}") as a:
        return sum(int(v.get("maxOffset", 0)) for v in a.topic_stats(topic).values())


def producer(srv, creds, tag: str) -> Producer:
    return Producer(f"acl_pg_{tag}", srv.namesrv_addr, credentials=creds, retry_times_when_send_failed=0,
                    instance_name=f"acl-{tag}-{time.monotonic_ns()}").start()


def refused_send(srv, creds, topic: str, tag: str) -> MQBrokerError:
    p = producer(srv, creds, tag)
    try:
        with pytest.raises(MQBrokerError) as ei:
            p.send(Message(topic, b"refused", keys=f"refused-{tag}"))
    finally:
        p.shutdown()
    assert ei.value.code == ResponseCode.SYSTEM_ERROR
    return ei.value


def test_right_keys_send_and_consume(server):
    before = stored(server, "AclTopicMain")
    p = producer(server, APP, "right")
    try:
        for i in range(20):
            assert p.send(Message("AclTopicMain", f"m{i}".encode(), keys=f"right-{i}")).send_status.name == "SEND_OK"
        assert p.send_async(Message("AclTopicMain", b"async")).result(10).send_status.name == "SEND_OK"
    finally:
        p.shutdown()
    got, done = [], threading.Event()

    def listener(msgs):
        got.extend(m.body for m in msgs)
        if {f"m{i}".encode() for i in range(20)} <= set(got):
            done.set()
        return ConsumeStatus.CONSUME_SUCCESS
    c = PushConsumer("acl_cg_main", server.namesrv_addr, credentials=APP,
                     consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                     instance_name="acl-right-consumer")
    c.subscribe("AclTopicMain", "*")
    c.register_message_listener(listener)
    c.start()
    try:
        assert done.wait(60), got
    finally:
        c.shutdown()
    assert stored(server, "AclTopicMain") == before + 21


@pytest.mark.parametrize("creds, topic, message", [
    (SessionCredentials("aclAppUser1", "aclWrongSecret"), "AclTopicMain",
     "Check signature failed for accessKey=aclAppUser1"),
    (SessionCredentials("aclNobodyUser", "aclNobodySecret"), "AclTopicMain", "No acl config for aclNobodyUser"),
    (None, "AclTopicMain", "No accessKey is configured"),
    (SessionCredentials("aclDenyUser4", "aclDenySecret4"), "AclTopicDenied",
     "No default permission for topic:AclTopicDenied"),
    (SessionCredentials("aclSubOnly5", "aclSubSecret5"), "AclTopicMain",
     "No default permission for topic:AclTopicMain"),
    (APP, "AclTopicDenied", "No default permission for topic:AclTopicDenied"),
], ids=["wrong-secret", "unknown-key", "no-signature", "deny-topic", "sub-only", "unlisted-topic"])
def test_refused_sends_store_nothing(server, creds, topic, message):
    before = stored(server, topic)
    e = refused_send(server, creds, topic, "refused")
    assert e.remark.startswith(ACL_EXCEPTION + message + ", org.apache.rocketmq.acl.plain.PlainPermissionLoader.")
    assert stored(server, topic) == before


def test_defaults_come_from_the_account(server):
    """RocketMQ 5's rule (4.4.0 refused every unlisted topic): aclDenyUser4's defaultTopicPerm is PUB."""
    p = producer(server, SessionCredentials("aclDenyUser4", "aclDenySecret4"), "deny4")
    try:
        assert p.send(Message("AclTopicOther", b"by default")).send_status.name == "SEND_OK"
    finally:
        p.shutdown()


def test_non_admin_admin_requests_change_nothing(server):
    user = Admin(server.namesrv_addr, credentials=APP, instance_name="acl-user-admin").start()
    try:
        for call, code in ((lambda: user.create_topic("AclTopicByUser", 4), 17),
                           (lambda: user.update_broker_config(server.broker_addr, {"fileReservedTime": "1"}), 25),
                           (lambda: user.create_subscription_group(server.broker_addr, "acl_cg_user"), 200)):
            with pytest.raises(MQBrokerError) as ei:
                call()
            assert ei.value.code == 1 and f"Need admin permission for request code={code}, but accessKey=aclAppUser1" \
                in ei.value.remark
        # DELETE_TOPIC_IN_BROKER straight to the broker
        m = user._m()
        r = m.invoke(server.broker_addr, m.request(R.DELETE_TOPIC_IN_BROKER, {"topic": "AclTopicOther"}))
        assert r.code == 1 and "request code=215" in r.remark
    finally:
        user.shutdown()
    with Admin(server.namesrv_addr, credentials=ADMIN, instance_name="acl-root-admin") as a:
        assert "AclTopicByUser" not in a.topic_list() and "AclTopicOther" in a.topic_list()
        assert a.broker_config(server.broker_addr)["fileReservedTime"] != "1"


def raw_conn(addr: str, source: str = "127.0.0.1") -> Conn:
    c = Conn.__new__(Conn)
    host, _, port = addr.rpartition(":")
    c.sock = socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))
    c.dec, c.got, c.requests, c.timeout = FrameDecoder(), {}, [], 10.0
    return c


def rpc(conn: Conn, code, fields=None, body=None, creds=None) -> RemotingCommand:
    fields = dict(fields or {})
    if creds is not None:
        sign_fields(fields, body, creds)
    return conn.rpc(RemotingCommand(code, ext_fields=fields if fields else None, body=body))


def test_white_lists(server):
    topic = {"topic": "AclTopicMain"}
    far = raw_conn(server.broker_addr, "127.0.0.2")          # globalWhiteRemoteAddresses: nothing checked
    near = raw_conn(server.broker_addr)
    try:
        assert rpc(far, R.GET_TOPIC_STATS_INFO, topic).code == ResponseCode.SUCCESS
        r = rpc(near, R.GET_TOPIC_STATS_INFO, topic)
        assert r.code == 1 and r.remark.startswith(ACL_EXCEPTION + "No accessKey is configured")
        # an account's whiteRemoteAddress: unsigned requests with its key from there pass; from elsewhere not
        assert rpc(near, R.GET_TOPIC_STATS_INFO, {**topic, "AccessKey": "aclLocalUser9"}).code == ResponseCode.SUCCESS
        r = rpc(near, R.GET_TOPIC_STATS_INFO, {**topic, "AccessKey": "aclFarUser11"})
        assert r.code == 1 and "Check signature failed for accessKey=aclFarUser11" in r.remark
        far_key = SessionCredentials("aclFarUser11", "aclFarSecret11")
        assert rpc(near, R.GET_TOPIC_STATS_INFO, topic, creds=far_key).code == ResponseCode.SUCCESS
    finally:
        far.close()
        near.close()


def test_broker_credentials_are_not_answered(server):
    with Admin(server.namesrv_addr, credentials=ADMIN, instance_name="acl-config") as a:
        conf = a.broker_config(server.broker_addr)
    assert conf.get("aclEnable") == "true"
    assert "innerClientAuthenticationCredentials" not in conf
    assert not any("aclAdminSecret7" in v for v in conf.values())
    assert "aclAdminSecret7" not in server.log_tail(1 << 20)


def registration(name: str, addr: str) -> tuple[dict, bytes]:
    body = fastjson.dumps_bytes({"filterServerList": [], "topicConfigSerializeWrapper": {
        "topicConfigTable": {"HijackTopic": {"topicName": "HijackTopic", "readQueueNums": 1, "writeQueueNums": 1,
                                              "perm": 6}}, "dataVersion": {"timestamp": 1, "counter": 1}}})
    return ({"brokerAddr": addr, "brokerId": "0", "brokerName": name, "clusterName": "DefaultCluster",
             "haServerAddr": addr, "compressed": "false", "bodyCrc32": str(zlib.crc32(body) & 0x7FFFFFFF)}, body)


def test_name_server_registrations_need_a_trusted_peer(server):
    near, far = raw_conn(server.namesrv_addr), raw_conn(server.namesrv_addr, "127.0.0.2")
    try:
        fields, body = registration("hijacker", "127.0.0.1:1")
        r = rpc(near, R.REGISTER_BROKER, fields, body)
        assert r.code == 1 and "No accessKey is configured" in r.remark
        r = rpc(near, R.REGISTER_BROKER, fields, body, APP)
        assert r.code == 1 and "Need admin permission for request code=103, but accessKey=aclAppUser1" in r.remark
        r = rpc(near, R.GET_ROUTEINTO_BY_TOPIC, {"topic": "HijackTopic"})          # route queries stay open
        assert r.code == ResponseCode.TOPIC_NOT_EXIST
        assert rpc(far, R.REGISTER_BROKER, *registration("trusted-by-address", "127.0.0.2:1")).code == 0
        assert rpc(near, R.REGISTER_BROKER, *registration("trusted-by-key", "127.0.0.3:1"), ADMIN).code == 0
        route = fastjson.loads(rpc(near, R.GET_ROUTEINTO_BY_TOPIC, {"topic": "HijackTopic"}).body)
        assert {b["brokerName"] for b in route["brokerDatas"]} == {"trusted-by-address", "trusted-by-key"}
        for name, addr in (("trusted-by-address", "127.0.0.2:1"), ("trusted-by-key", "127.0.0.3:1")):
            rpc(far, R.UNREGISTER_BROKER, {"brokerAddr": addr, "brokerId": "0", "brokerName": name,
                                           "clusterName": "DefaultCluster"})
    finally:
        near.close()
        far.close()


def test_a_broker_registers_with_its_own_credentials(server, tmp_path):
    """A second `rmqstore serve --no-namesrv` registers with this ACL'd name server, signing REGISTER_BROKER
    with its innerClientAuthenticationCredentials."""
    other = ServerProcess(tmp_path / "store2", {"brokerName": "broker-signed", "autoCreateTopicEnable": "false",
                                                "innerClientAuthenticationCredentials": INNER,
                                                "mappedFileSizeCommitLog": 4 << 20},
                          namesrv=False, namesrv_port=int(server.namesrv_addr.rpartition(":")[2]))
    other.start()
    try:
        with Admin(server.namesrv_addr, credentials=ADMIN, instance_name="acl-reg") as a:
            deadline = time.monotonic() + 30
            while "broker-signed" not in (a.cluster_info().get("brokerAddrTable") or {}):
                assert time.monotonic() < deadline, other.log_tail()
                time.sleep(0.1)
    finally:
        assert other.stop() == 0


def test_hostile_auth_input_never_crashes_the_server(server):
    c = raw_conn(server.vip_addr)
    try:
        for fields, body in (({"AccessKey": "k" * (4 << 20), "Signature": "s" * (4 << 20)}, None),
                             ({"AccessKey": "aclAppUser1"}, None),
                             ({"Signature": "x"}, None),
                             ({"AccessKey": "aclAppUser1", "Signature": "\u00e9\u6f22" * 1000, "b": "\ud7ff"},
                              b"\x00" * 1000)):
            r = rpc(c, R.SEND_MESSAGE_V2, fields, body)
            assert r.code == 1 and r.remark.startswith(ACL_EXCEPTION) and len(r.remark) < 1000
        r = rpc(c, R.HEART_BEAT, {}, b"[" * 50000, APP)
        assert r.code == 1 and r.remark.startswith(ACL_EXCEPTION)
        # the same signed request twice: both served (RocketMQ's signatures carry no time or nonce)
        send = {"a": "pg", "b": "AclTopicMain", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1", "h": "0",
                "i": "", "j": "0", "k": "false", "m": "false"}
        sign_fields(send, b"replayed", APP)
        for _ in range(2):
            assert c.rpc(RemotingCommand(R.SEND_MESSAGE_V2, ext_fields=dict(send), body=b"replayed")).code == 0
    finally:
        c.close()
    ok = raw_conn(server.broker_addr)
    try:
        assert rpc(ok, R.GET_BROKER_CONFIG, {}, None, APP).code == ResponseCode.SUCCESS
    finally:
        ok.close()


def wait_until(fn, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_edited_rules_apply_while_serving(server):
    new = SessionCredentials("aclNewUser8", "aclNewSecret8")
    conn = raw_conn(server.broker_addr)

    def allowed():
        return rpc(conn, R.GET_TOPIC_STATS_INFO, {"topic": "AclTopicMain"}, None, new).code == ResponseCode.SUCCESS
    try:
        assert not allowed()
        account = "- accessKey: aclNewUser8\n  secretKey: aclNewSecret8\n"
        write_rules(server.acl_file, RULES + account)
        t0 = time.monotonic()
        wait_until(allowed, "the new account was never honoured")
        added_ms = (time.monotonic() - t0) * 1000
        # a broken file: logged with its line, the rules in force stay
        write_rules(server.acl_file, RULES + account + "- accessKey: aclBrokenUser\n  secretKey: 'aclBrokenSecret\n")
        line = wait_until(lambda: next((ln for ln in server.log_tail(1 << 20).splitlines()
                                        if "not reloaded" in ln), None), "the broken file was not reported")
        assert f"{server.acl_file}:" in line and "aclBrokenSecret" not in line
        assert allowed()
        write_rules(server.acl_file, RULES)
        wait_until(lambda: not allowed(), "the removed account was still honoured")
    finally:
        write_rules(server.acl_file, RULES)
        conn.close()
    assert added_ms < 20000


def test_rmqstore_admin_signs_with_keys(server, tmp_path):
    ns = server.namesrv_addr
    r = run_cli("admin", "updateTopic", "-n", ns, "-t", "AclTopicCli", "-b", server.broker_addr,
                "--accessKey", "aclAdminUser7", "--secretKey", "aclAdminSecret7")
    assert r.returncode == 0, r.stderr
    r = run_cli("admin", "updateTopic", "-n", ns, "-t", "AclTopicCli2", "-b", server.broker_addr,
                "--accessKey", "aclAppUser1", "--secretKey", "aclAppSecret1")
    assert r.returncode == 2 and b"Need admin permission for request code=17" in r.stderr
    assert len(r.stderr.decode().strip().splitlines()) == 1
    r = run_cli("admin", "topicList", "-n", ns, "--accessKey", "aclAppUser1")
    assert r.returncode == 2 and b"both an access key and a secret key are needed" in r.stderr
    r = run_cli("admin", "topicStatus", "-n", ns, "-t", "AclTopicCli")
    assert r.returncode == 2 and b"No accessKey is configured" in r.stderr


# --- RocketMQ 5 over gRPC: the official Python client -------------------------------------------------
def test_official_grpc_client_right_and_wrong_credentials(server):
    pytest.importorskip("rocketmq.grpc_protocol")
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message as Message5, Producer as P5, \
        SimpleConsumer

    def config(ak, sk):
        return ClientConfiguration(server.grpc_addr, Credentials(ak, sk), request_timeout=5)

    def message(body: bytes):
        m = Message5()
        m.topic, m.body = "AclGrpcTopic", body
        return m
    before = stored(server, "AclGrpcTopic")
    p = P5(config("aclGrpcUser10", "aclGrpcSecret10"), ("AclGrpcTopic",))
    p.startup()
    try:
        for i in range(3):
            assert p.send(message(f"grpc-{i}".encode())).message_id
    finally:
        p.shutdown()
    for ak, sk in (("aclGrpcUser10", "aclWrongSecret"), ("", ""), ("aclSubOnly5", "aclSubSecret5")):
        bad = P5(config(ak, sk), ("AclGrpcTopic",))
        try:
            bad.startup()
            with pytest.raises(Exception):
                bad.send(message(b"refused"))
        finally:
            bad.shutdown()
    assert stored(server, "AclGrpcTopic") == before + 3
    c = SimpleConsumer(config("aclGrpcUser10", "aclGrpcSecret10"), "acl_grpc_cg",
                       {"AclGrpcTopic": FilterExpression("*")}, await_duration=1)
    c.startup()
    try:
        got = []
        deadline = time.monotonic() + 60
        while len(got) < 3 and time.monotonic() < deadline:
            for m in c.receive(16, 30):
                got.append(m.body)
                c.ack(m)
        assert sorted(got) == [b"grpc-0", b"grpc-1", b"grpc-2"]
    finally:
        c.shutdown()
    wrong = SimpleConsumer(config("aclGrpcUser10", "aclWrongSecret"), "acl_grpc_cg",
                           {"AclGrpcTopic": FilterExpression("*")}, await_duration=1)
    try:
        with pytest.raises(Exception):
            wrong.startup()
            wrong.receive(16, 30)
    finally:
        try:
            wrong.shutdown()
        except Exception:
            pass


def test_grpc_calls_of_every_kind_are_refused_with_permission_denied(server):
    """Unary (QueryRoute), server streaming (ReceiveMessage) and bidirectional (Telemetry) calls, raw."""
    grpc = pytest.importorskip("grpc")
    pytest.importorskip("rocketmq.grpc_protocol")
    from rocketmq.grpc_protocol import definition_pb2 as d, service_pb2 as s
    from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
    from rmqstore.acl import grpc_authorization

    def meta(creds):
        dt = time.strftime("%Y%m%dT%H%M%SZ")
        return (("authorization", grpc_authorization(creds, dt)), ("x-mq-date-time", dt))
    right = SessionCredentials("aclGrpcUser10", "aclGrpcSecret10")
    wrong = SessionCredentials("aclGrpcUser10", "aclWrongSecret")
    topic, group = d.Resource(name="AclGrpcTopic"), d.Resource(name="acl_grpc_cg")
    settings = s.TelemetryCommand(settings=d.Settings(client_type=d.ClientType.PRODUCER,
                                                      publishing=d.Publishing(topics=[topic])))
    with grpc.insecure_channel(server.grpc_addr) as ch:
        stub = MessagingServiceStub(ch)
        assert stub.QueryRoute(s.QueryRouteRequest(topic=topic), metadata=meta(right), timeout=10).status.code == \
            d.Code.OK
        answers = stub.Telemetry(iter([settings]), metadata=meta(right), timeout=5)
        assert next(answers).status.code == d.Code.OK
        answers.cancel()
        calls = (lambda md: stub.QueryRoute(s.QueryRouteRequest(topic=topic), metadata=md, timeout=10),
                 lambda md: list(stub.ReceiveMessage(s.ReceiveMessageRequest(
                     group=group, message_queue=d.MessageQueue(topic=topic)), metadata=md, timeout=10)),
                 lambda md: list(stub.Telemetry(iter([settings]), metadata=md, timeout=10)))
        for call in calls:
            for md in (meta(wrong), ()):
                with pytest.raises(grpc.RpcError) as ei:
                    call(md)
                assert ei.value.code() == grpc.StatusCode.PERMISSION_DENIED, ei.value


def test_bench_step_costs_and_table():
    """The `acl` step of make bench: the in-process costs measured, and a run's figures as its table (the
    server rounds themselves are `rmqstore serve` with and without ACL, as in the tests above)."""
    from rmqstore.tools.suite.acl import acl_table, check_costs
    costs = check_costs(n=50)
    assert all(costs[k] > 0 for k in ("sign_us", "check_us", "decode_us", "grpc_check_us")), costs
    run = {"async_msgs_per_s": 9000, "sync_msgs_per_s": 1500, "sync_latency_ms": {"p50": 0.4},
           "async_cpu_us_per_msg": {"client": 40.0, "server": 45.0}, "async_errors": 0}
    t = acl_table({"messages": 30000, "body_size": 256, "in_flight": 512, "rounds": 2, "off": run,
                   "on": {**run, "async_msgs_per_s": 8000}, "in_process": costs})
    assert [(row.ref, row.value) for row in t.rows] == [(True, 9000), (False, 8000), (False, 1500), (False, 1500)]
    assert f"checking {costs['check_us']} us" in t.notes[0] and "server 45.0 / 45.0 us" in t.notes[0]
