"""rmqstore's server (`python -m rmqstore.broker.server`, in a child process) driven at the frame level: the
requests of a real RocketMQ 4.4.0 Java client (small.pcap) replayed and every answer checked against the
real broker's, the name server's topic rules, and robustness (malformed, oversized and half frames,
unknown codes, a clean SIGTERM)."""
from __future__ import annotations

import json
import os
import socket
import struct
import time
from pathlib import Path

import pytest

from rmqstore.store.format import codec
from rmqstore.store.format import scanner
from rmqstore.remoting import FrameDecoder, RemotingCommand, fastjson
from rmqstore.remoting.body import encode_batch
from rmqstore.remoting.codes import RequestCode, ResponseCode, SerializeType
from rmqstore.broker.server import ServerProcess

NOTES = Path(os.environ.get("RMQSTORE_REMOTING_NOTES", Path(__file__).resolve().parents[1] / "data" / "remoting"))
PCAP = NOTES / "small.pcap"
CONF = {"mappedFileSizeCommitLog": 8 * 1024 * 1024, "mappedFileSizeConsumeQueue": 20 * 30000,
        "maxHashSlotNum": 20000, "maxIndexNum": 80000, "serverChannelMaxIdleTimeSeconds": 120}


class Conn:
    """A raw protocol connection: send commands, read answers by opaque (bounded waits)."""

    def __init__(self, addr: str, timeout: float = 10.0):
        host, _, port = addr.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.dec = FrameDecoder()
        self.got: dict[int, RemotingCommand] = {}
        self.requests: list[RemotingCommand] = []      # requests the server sent us (e.g. NOTIFY)
        self.timeout = timeout

    def send(self, cmd: RemotingCommand) -> None:
        self.sock.sendall(cmd.encode())

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _read(self, deadline: float) -> bool:
        self.sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = self.sock.recv(1 << 20)
        except socket.timeout:
            return True
        if not data:
            return False
        for c in self.dec.feed(data):
            if c.is_response:
                self.got[c.opaque] = c
            else:
                self.requests.append(c)
        return True

    def wait(self, opaque: int, timeout: float | None = None) -> RemotingCommand | None:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while opaque not in self.got and time.monotonic() < deadline:
            if not self._read(deadline):
                break
        return self.got.pop(opaque, None)

    def rpc(self, cmd: RemotingCommand, timeout: float | None = None) -> RemotingCommand:
        self.send(cmd)
        r = self.wait(cmd.opaque, timeout)
        assert r is not None, f"no answer to {cmd}"
        return r

    def closed_by_peer(self, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if not self._read(deadline):
                    return True
            except (ConnectionResetError, BrokenPipeError):
                return True
        return False

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("server") / "store", CONF)
    srv.start()
    try:
        yield srv
    finally:
        rc = srv.stop()
        assert rc == 0, srv.log_tail()


def req(code, fields=None, body=None, **kw) -> RemotingCommand:
    return RemotingCommand.request(code, fields, body, **kw)


def send_v2(topic: str, body: bytes, qid: int = 0, props: str = "", **extra) -> RemotingCommand:
    f = {"a": "pg", "b": topic, "c": "TBW102", "d": "4", "e": str(qid), "f": "0", "g": str(int(time.time() * 1000)),
         "h": "0", "i": props, "j": "0", "k": "false", "m": "false"}
    f.update(extra)
    return req(RequestCode.SEND_MESSAGE_V2, f, body)


# --- replay of the capture -----------------------------------------------------------------------------
def _record_key(raw: bytes) -> bytes:
    """A record's bytes minus what depends on the broker: physical offset, born / store host, store time."""
    return raw[:28] + raw[36:48] + raw[72:]


def _records(body: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(body):
        size = struct.unpack_from(">i", body, pos)[0]
        scanner.decode_record(body, pos, pos + size)
        out.append(body[pos:pos + size])
        pos += size
    return out


@pytest.mark.skipif(not PCAP.exists(), reason=f"no capture at {PCAP}")
def test_replay_java_client_capture(tmp_path):
    from rmqstore.remoting.pcap import read_frames
    frames = read_frames(PCAP)
    with ServerProcess(tmp_path / "store", CONF) as srv:
        port_map = {9876: srv.namesrv_port, 10911: srv.listen_port, 10909: srv.listen_port - 2}
        requests = [f for f in frames if not f.command.is_response and f.dst[1] in port_map
                    and f.command.code != RequestCode.REGISTER_BROKER]
        responses = {(f.dst, f.src, f.command.opaque): f for f in frames if f.command.is_response}
        conns: dict[tuple, Conn] = {}
        offset_map: dict[int, int] = {}            # captured commitlog offset -> ours (from the send answers)
        deferred = []
        checked = {}

        def check(f, cap, ours):
            c = f.command
            assert ours is not None, f"no answer to {c}"
            if cap.command.code == ResponseCode.SUBSCRIPTION_NOT_LATEST:
                # The Java broker ran this pull before the heartbeat sent just ahead of it on the same
                # connection (separate thread pools); rmqstore serves a connection in order, so the
                # subscription is already the latest here.
                assert ours.code in (ResponseCode.SUBSCRIPTION_NOT_LATEST, ResponseCode.SUCCESS)
                checked["raced"] = 1
                return
            assert ours.code == cap.command.code, (c, cap.command, ours)
            code = c.code
            ce, oe = cap.command.ext_fields or {}, ours.ext_fields or {}
            if code == RequestCode.GET_ROUTEINTO_BY_TOPIC:
                if ours.code == ResponseCode.SUCCESS:
                    cr, orr = fastjson.loads(cap.command.body), fastjson.loads(ours.body)
                    assert set(orr) >= {"brokerDatas", "queueDatas"}
                    assert orr["queueDatas"] == cr["queueDatas"]
                    assert [b["brokerName"] for b in orr["brokerDatas"]] == [b["brokerName"] for b in cr["brokerDatas"]]
                    assert orr["brokerDatas"][0]["brokerAddrs"] == {0: srv.broker_addr}
                else:
                    assert ours.remark == cap.command.remark
            elif code == RequestCode.SEND_MESSAGE_V2:
                assert (oe["queueId"], oe["queueOffset"]) == (ce["queueId"], ce["queueOffset"])
                assert (oe["MSG_REGION"], oe["TRACE_ON"]) == (ce["MSG_REGION"], ce["TRACE_ON"])
                host, off = codec.decode_message_id(oe["msgId"])
                assert host == srv.broker_addr
                offset_map[codec.decode_message_id(ce["msgId"])[1]] = off
            elif code == RequestCode.PULL_MESSAGE:
                if ours.code == ResponseCode.SUCCESS:
                    for k in ("nextBeginOffset", "minOffset", "maxOffset", "suggestWhichBrokerId"):
                        assert oe[k] == ce[k], k
                    assert ours.remark == "FOUND"
                    assert list(map(_record_key, _records(ours.body))) == list(map(_record_key, _records(cap.command.body)))
            elif code in (RequestCode.QUERY_MESSAGE, RequestCode.VIEW_MESSAGE_BY_ID):
                assert list(map(_record_key, _records(ours.body))) == list(map(_record_key, _records(cap.command.body)))
                if code == RequestCode.QUERY_MESSAGE:
                    assert set(oe) == set(ce) == {"indexLastUpdatePhyoffset", "indexLastUpdateTimestamp"}
            elif code == RequestCode.GET_CONSUMER_LIST_BY_GROUP:
                assert fastjson.loads(ours.body) == fastjson.loads(cap.command.body)
            elif code == RequestCode.QUERY_CONSUMER_OFFSET:
                assert oe["offset"] == ce["offset"]
            checked[code] = checked.get(code, 0) + 1

        try:
            for i, f in enumerate(requests):
                c = f.command
                conn = conns.get(f.src)
                if conn is None:
                    conn = conns[f.src] = Conn(f"127.0.0.1:{port_map[f.dst[1]]}")
                ext = dict(c.ext_fields) if c.ext_fields is not None else None
                if c.code == RequestCode.VIEW_MESSAGE_BY_ID:
                    ext["offset"] = str(offset_map[int(ext["offset"])])
                if c.code in (RequestCode.PULL_MESSAGE, RequestCode.QUERY_MESSAGE):
                    _wait_dispatched(srv)   # the real broker had dispatched everything sent before these
                cmd = RemotingCommand(c.code, opaque=c.opaque, flag=c.flag, remark=c.remark, ext_fields=ext,
                                      body=c.body, language=c.language, version=c.version)
                conn.send(cmd)
                if c.is_oneway:
                    continue
                cap = responses.get((f.src, f.dst, c.opaque))
                nxt = requests[i + 1].index if i + 1 < len(requests) else 1 << 60
                if cap is not None and cap.index < nxt:
                    check(f, cap, conn.wait(c.opaque))
                else:
                    deferred.append((f, cap, conn))
            for f, cap, conn in deferred:
                if cap is not None:
                    check(f, cap, conn.wait(f.command.opaque))
                else:   # the real broker still held this pull when the capture ended: so do we
                    assert f.command.code == RequestCode.PULL_MESSAGE
                    assert conn.wait(f.command.opaque, timeout=0.3) is None
            # the broker told the consumer its group changed (NOTIFY_CONSUMER_IDS_CHANGED, oneway)
            notes = [r for cn in conns.values() for r in cn.requests]
            assert any(r.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED and r.is_oneway and
                       r.ext_fields == {"consumerGroup": "bench_cg_162529"} for r in notes)
        finally:
            for cn in conns.values():
                cn.close()
        assert checked.get(RequestCode.SEND_MESSAGE_V2) == 41 and checked.get(RequestCode.PULL_MESSAGE, 0) + checked.get("raced", 0) >= 5
        assert checked.get(RequestCode.QUERY_MESSAGE) == 2 and checked.get(RequestCode.VIEW_MESSAGE_BY_ID) == 1
        assert checked.get(RequestCode.GET_ROUTEINTO_BY_TOPIC) == 8


# --- name server and topics ------------------------------------------------------------------------------
def test_route_cluster_and_unknown_topic(server):
    c = Conn(server.namesrv_addr)
    try:
        r = c.rpc(req(RequestCode.GET_ROUTEINTO_BY_TOPIC, {"topic": "TBW102"}))
        assert r.code == 0
        route = fastjson.loads(r.body)
        assert route["brokerDatas"] == [{"brokerAddrs": {0: server.broker_addr}, "brokerName": "broker-a",
                                         "cluster": "DefaultCluster"}]
        assert route["queueDatas"][0]["perm"] == 7 and route["queueDatas"][0]["writeQueueNums"] == 8
        assert b'"brokerAddrs":{0:"' in r.body        # fastjson dialect on the wire
        r = c.rpc(req(RequestCode.GET_ROUTEINTO_BY_TOPIC, {"topic": "NoSuchTopic"}))
        assert r.code == ResponseCode.TOPIC_NOT_EXIST
        assert r.remark.startswith("No topic route info in name server for the topic: NoSuchTopic")
        r = c.rpc(req(RequestCode.GET_BROKER_CLUSTER_INFO))
        info = fastjson.loads(r.body)
        assert info["clusterAddrTable"] == {"DefaultCluster": ["broker-a"]}
        assert info["brokerAddrTable"]["broker-a"]["brokerAddrs"] == {0: server.broker_addr}
    finally:
        c.close()


def test_send_creates_topic_and_route_appears(server):
    b = Conn(server.vip_addr)
    n = Conn(server.namesrv_addr)
    try:
        r = b.rpc(send_v2("FreshTopic", b"x", 3, "TAGS\x01A\x02"))
        assert r.code == 0 and r.ext_fields["queueOffset"] == "0" and r.ext_fields["queueId"] == "3"
        route = fastjson.loads(n.rpc(req(RequestCode.GET_ROUTEINTO_BY_TOPIC, {"topic": "FreshTopic"})).body)
        assert route["queueDatas"][0]["writeQueueNums"] == 4 and route["queueDatas"][0]["perm"] == 6
        r = b.rpc(send_v2("FreshTopic", b"x", 9))
        assert r.code == ResponseCode.SYSTEM_ERROR and "queueId[9] is illegal" in r.remark
        r = b.rpc(send_v2("TBW102", b"x", 0))
        assert r.code == ResponseCode.SYSTEM_ERROR and "conflict with system reserved words" in r.remark
        r = b.rpc(req(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "Made", "defaultTopic": "TBW102", "readQueueNums": 2,
                                                             "writeQueueNums": 2, "perm": 6, "topicFilterType": "SINGLE_TAG",
                                                             "topicSysFlag": 0, "order": "false"}))
        assert r.code == 0
        route = fastjson.loads(n.rpc(req(RequestCode.GET_ROUTEINTO_BY_TOPIC, {"topic": "Made"})).body)
        assert route["queueDatas"][0]["readQueueNums"] == 2
        _assert_max_offset(server, "FreshTopic", 1, qid=3)              # once dispatched
        r = b.rpc(req(RequestCode.GET_MAX_OFFSET, {"topic": "FreshTopic", "queueId": 3}))
        assert r.code == 0 and r.ext_fields == {"offset": "1"}
        r = b.rpc(req(RequestCode.GET_MIN_OFFSET, {"topic": "FreshTopic", "queueId": 3}))
        assert r.code == 0 and r.ext_fields == {"offset": "0"}
        r = b.rpc(req(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {"topic": "FreshTopic", "queueId": 3, "timestamp": 0}))
        assert r.code == 0 and r.ext_fields == {"offset": "0"}
    finally:
        b.close()
        n.close()


def test_auto_create_off_answers_topic_not_exist(tmp_path):
    with ServerProcess(tmp_path / "store", dict(CONF, autoCreateTopicEnable="false", defaultTopicQueueNums=2,
                                                brokerName="broker-x", brokerClusterName="ClusterX")) as srv:
        n, b = Conn(srv.namesrv_addr), Conn(srv.vip_addr)
        try:
            for topic in ("Unknown", "TBW102"):
                r = n.rpc(req(RequestCode.GET_ROUTEINTO_BY_TOPIC, {"topic": topic}))
                assert r.code == ResponseCode.TOPIC_NOT_EXIST
            r = b.rpc(send_v2("Unknown", b"x"))
            assert r.code == ResponseCode.TOPIC_NOT_EXIST and r.remark.startswith("topic[Unknown] not exist")
            r = b.rpc(req(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "Unknown", "defaultTopic": "TBW102",
                                                                 "readQueueNums": 2, "writeQueueNums": 2, "perm": 6,
                                                                 "topicFilterType": "SINGLE_TAG"}))
            assert r.code == 0
            route = fastjson.loads(n.rpc(req(RequestCode.GET_ROUTEINTO_BY_TOPIC, {"topic": "Unknown"})).body)
            assert route["brokerDatas"][0]["brokerName"] == "broker-x" and route["brokerDatas"][0]["cluster"] == "ClusterX"
            assert b.rpc(send_v2("Unknown", b"x", 1)).code == 0
        finally:
            n.close()
            b.close()


# --- requests and answers ---------------------------------------------------------------------------------
def test_batch_send_and_pull_and_query(server):
    b = Conn(server.vip_addr)
    m = Conn(server.broker_addr)
    try:
        entries = [(0, f"m{i}".encode(), {"KEYS": f"bk{i}", "UNIQ_KEY": f"U{i:030d}", "TAGS": "T" + "AB"[i % 2]})
                   for i in range(5)]
        r = b.rpc(req(RequestCode.SEND_BATCH_MESSAGE, send_v2("BatchT", b"", 0, m="true").ext_fields,
                      encode_batch(entries)))
        assert r.code == 0, r
        ids = r.ext_fields["msgId"].split(",")
        assert len(ids) == 5 and r.ext_fields["queueOffset"] == "0"
        offs = [codec.decode_message_id(i)[1] for i in ids]
        assert offs == sorted(offs)
        # pull with a tag subscription in the request (subscription flag), suspended until dispatched
        pull = {"consumerGroup": "raw_cg", "topic": "BatchT", "queueId": 0, "queueOffset": 0, "maxMsgNums": 32,
                "sysFlag": 4 | 2, "commitOffset": 0, "suspendTimeoutMillis": 3000, "subscription": "TB",
                "subVersion": 1, "expressionType": "TAG"}
        r = m.rpc(req(RequestCode.PULL_MESSAGE, pull))
        pull["sysFlag"] = 4
        assert r.code == 0 and r.remark == "FOUND"
        recs = [scanner.decode_record(x, 0) for x in _records(r.body)]
        assert [x.properties["KEYS"] for x in recs] == ["bk1", "bk3"]
        assert r.ext_fields["nextBeginOffset"] == "5" and r.ext_fields["maxOffset"] == "5"
        # no messages past the end, no suspend flag: PULL_NOT_FOUND (19) at once
        r = m.rpc(req(RequestCode.PULL_MESSAGE, dict(pull, queueOffset=5)))
        assert r.code == ResponseCode.PULL_NOT_FOUND and r.remark == "OFFSET_OVERFLOW_ONE"
        r = m.rpc(req(RequestCode.PULL_MESSAGE, dict(pull, queueOffset=99)))
        assert r.code == ResponseCode.PULL_OFFSET_MOVED
        # key query: the raw index answer
        deadline = time.monotonic() + 5
        while True:
            r = b.rpc(req(RequestCode.QUERY_MESSAGE, {"topic": "BatchT", "key": "bk3", "maxNum": 32, "beginTimestamp": 0,
                                                      "endTimestamp": 2 ** 63 - 1, "_UNIQUE_KEY_QUERY": "false"}))
            if r.code == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert r.code == 0 and [scanner.decode_record(x, 0).properties["KEYS"] for x in _records(r.body)] == ["bk3"]
        r = b.rpc(req(RequestCode.QUERY_MESSAGE, {"topic": "BatchT", "key": "nokey", "maxNum": 32, "beginTimestamp": 0,
                                                  "endTimestamp": 2 ** 63 - 1}))
        assert r.code == ResponseCode.QUERY_NOT_FOUND and "indexLastUpdatePhyoffset" in r.ext_fields
        r = b.rpc(req(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offs[2]}))
        assert r.code == 0 and scanner.decode_record(r.body, 0).properties["KEYS"] == "bk2" and r.ext_fields is None
        r = b.rpc(req(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offs[2] + 1}))
        assert r.code == ResponseCode.SYSTEM_ERROR and "can not find message by the offset" in r.remark
        # consumer offsets
        assert b.rpc(req(RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "raw_cg", "topic": "BatchT",
                                                             "queueId": 0})).ext_fields == {"offset": "0"}
        b.send(req(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "raw_cg", "topic": "BatchT", "queueId": 0,
                                                        "commitOffset": 3}, oneway=True))
        r = b.rpc(req(RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "raw_cg", "topic": "BatchT", "queueId": 0}))
        assert r.ext_fields == {"offset": "3"}
    finally:
        b.close()
        m.close()


def test_long_polling_suspends_and_wakes(server):
    m = Conn(server.broker_addr)
    b = Conn(server.vip_addr)
    try:
        assert b.rpc(send_v2("PollT", b"first", 0)).code == 0
        _assert_max_offset(server, "PollT", 1)          # dispatched
        pull = {"consumerGroup": "poll_cg", "topic": "PollT", "queueId": 0, "queueOffset": 1, "maxMsgNums": 32,
                "sysFlag": 2 | 4, "commitOffset": 0, "suspendTimeoutMillis": 300, "subscription": "*",
                "subVersion": 1, "expressionType": "TAG"}
        t0 = time.monotonic()
        r = m.rpc(req(RequestCode.PULL_MESSAGE, pull), timeout=5)
        waited = time.monotonic() - t0
        assert r.code == ResponseCode.PULL_NOT_FOUND and 0.25 <= waited < 10.0   # held for its 300 ms
        held = req(RequestCode.PULL_MESSAGE, dict(pull, suspendTimeoutMillis=15000))
        m.send(held)
        assert m.wait(held.opaque, timeout=0.2) is None          # suspended
        t0 = time.monotonic()
        assert b.rpc(send_v2("PollT", b"second", 0)).code == 0
        r = m.wait(held.opaque, timeout=10)
        # woken by the arrival, not by the end of its 15 s hold (generous: a loaded machine is slow)
        assert r is not None and r.code == 0 and time.monotonic() - t0 < 10.0
        assert scanner.decode_record(r.body, 0).body == b"second"
    finally:
        m.close()
        b.close()


def test_heartbeat_consumer_list_and_notify(server):
    a, bconn = Conn(server.broker_addr), Conn(server.broker_addr)
    try:
        def hb(cid):
            return req(RequestCode.HEART_BEAT, body=fastjson.dumps_bytes({
                "clientID": cid, "consumerDataSet": [{
                    "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "consumeType": "CONSUME_PASSIVELY",
                    "groupName": "hb_cg", "messageModel": "CLUSTERING", "subscriptionDataSet": [{
                        "classFilterMode": False, "codeSet": [], "expressionType": "TAG", "subString": "*",
                        "subVersion": 1, "tagsSet": [], "topic": "HbT"}], "unitMode": False}],
                "producerDataSet": [{"groupName": "CLIENT_INNER_PRODUCER"}]}))
        assert a.rpc(hb("10.0.0.1@1")).code == 0
        assert bconn.rpc(hb("10.0.0.2@2")).code == 0
        r = a.rpc(req(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "hb_cg"}))
        assert sorted(fastjson.loads(r.body)["consumerIdList"]) == ["10.0.0.1@1", "10.0.0.2@2"]
        # the first member was told when the second joined
        deadline = time.monotonic() + 3
        while not any(x.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED for x in a.requests) and time.monotonic() < deadline:
            a._read(time.monotonic() + 0.1)
        assert any(x.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED and x.ext_fields == {"consumerGroup": "hb_cg"}
                   for x in a.requests)
        a.requests.clear()
        bconn.close()       # a member leaving (connection closed) is announced too
        deadline = time.monotonic() + 3
        while not a.requests and time.monotonic() < deadline:
            a._read(time.monotonic() + 0.1)
        assert a.requests and a.requests[0].code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED
        r = a.rpc(req(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "hb_cg"}))
        assert fastjson.loads(r.body)["consumerIdList"] == ["10.0.0.1@1"]
        r = a.rpc(req(RequestCode.UNREGISTER_CLIENT, {"clientID": "10.0.0.1@1", "consumerGroup": "hb_cg"}))
        assert r.code == 0 and r.ext_fields == {}
        r = a.rpc(req(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "hb_cg"}))
        assert r.code == ResponseCode.SYSTEM_ERROR and r.remark == "no consumer for this group, hb_cg"
    finally:
        a.close()
        bconn.close()


def test_binary_header_requests_get_binary_answers(server):
    c = Conn(server.namesrv_addr)
    try:
        cmd = req(RequestCode.GET_ROUTEINTO_BY_TOPIC, {"topic": "TBW102"}, serialize_type=SerializeType.ROCKETMQ)
        raw = cmd.encode()
        assert raw[4] == 1
        c.send_raw(raw)
        r = c.wait(cmd.opaque)
        assert r.code == 0 and r.serialize_type == SerializeType.ROCKETMQ and fastjson.loads(r.body)["queueDatas"]
    finally:
        c.close()


# --- robustness -------------------------------------------------------------------------------------------
def test_unknown_code_answers_request_code_not_supported(server):
    for addr in (server.namesrv_addr, server.broker_addr, server.vip_addr):
        c = Conn(addr)
        try:
            r = c.rpc(req(4242, {"x": "y"}))
            assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and "4242" in r.remark
            assert c.rpc(req(RequestCode.GET_ROUTEINTO_BY_TOPIC if addr == server.namesrv_addr
                             else RequestCode.GET_MAX_OFFSET, {"topic": "TBW102", "queueId": 0})).code in (0,)
        finally:
            c.close()


def _max_offset(server, topic: str, qid: int = 0) -> int:
    c = Conn(server.vip_addr)
    try:
        return int(c.rpc(req(RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": qid})).ext_fields["offset"])
    finally:
        c.close()


def _wait_dispatched(server) -> None:
    m = Conn(server.broker_addr)
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            info = fastjson.loads(m.rpc(req(RequestCode.GET_BROKER_RUNTIME_INFO)).body)["table"]
            if int(info["dispatchBehindBytes"]) == 0:
                return
            time.sleep(0.01)
    finally:
        m.close()


def _warm(server) -> None:
    """RobustT exists and everything sent to it is dispatched."""
    c = Conn(server.vip_addr)
    try:
        assert c.rpc(send_v2("RobustT", b"warm", 0)).code == 0
        m = Conn(server.broker_addr)
        try:
            n = int(c.rpc(req(RequestCode.QUERY_BROKER_OFFSET)).ext_fields["offset"])
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                info = fastjson.loads(m.rpc(req(RequestCode.GET_BROKER_RUNTIME_INFO)).body)["table"]
                if int(info["dispatchBehindBytes"]) == 0 and int(info["commitLogMaxOffset"]) >= n:
                    break
                time.sleep(0.02)
        finally:
            m.close()
    finally:
        c.close()


def _assert_max_offset(server, topic: str, expect: int, qid: int = 0) -> None:
    """The queue's max offset reaches `expect` (dispatch is asynchronous) and does not pass it."""
    deadline = time.monotonic() + 5
    got = _max_offset(server, topic, qid)
    while got < expect and time.monotonic() < deadline:
        time.sleep(0.02)
        got = _max_offset(server, topic, qid)
    time.sleep(0.05)
    assert _max_offset(server, topic, qid) == expect


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@pytest.mark.parametrize("garbage", [
    struct.pack(">ii", 12, 8) + b"notjson!",                                  # JSON header that is not JSON
    struct.pack(">ii", 8, 4) + b"[42]",                                      # JSON but not an object
    struct.pack(">ii", 8, 1000) + b"{}{}",                                   # header longer than the frame
    struct.pack(">ii", 8, (1 << 24) | 4) + b"\xff\xff\xff\xff",               # ROCKETMQ header cut short
    struct.pack(">ii", 8, (9 << 24) | 4) + b"{}{}",                          # unknown serialize type
    struct.pack(">i", 1) + b"\x00",                                          # length below the minimum
    struct.pack(">i", -1),                                                    # negative length
    struct.pack(">i", 16 * 1024 * 1024 + 1) + b"\x00" * 64,                   # over 16 MiB
])
def test_malformed_frames_close_only_that_connection(server, garbage):
    _warm(server)
    before = _max_offset(server, "RobustT")
    other = Conn(server.vip_addr)
    bad = Conn(server.vip_addr)
    try:
        assert other.rpc(send_v2("RobustT", b"ok", 0)).code == 0
        bad.send_raw(garbage)
        assert bad.closed_by_peer(5.0)
        assert other.rpc(send_v2("RobustT", b"ok", 0)).code == 0        # the other connection is served
    finally:
        other.close()
        bad.close()
    _assert_max_offset(server, "RobustT", before + 2)                 # nothing else reached the store


def test_frame_that_stops_midway_and_oversized_payloads(server):
    _warm(server)
    before = _max_offset(server, "RobustT")
    stalled = []
    rss0 = _rss_kb(server.proc.pid)
    try:
        # five clients each stop 1 MiB short of a (legal) 15 MiB frame: buffered, bounded, harmless
        big = send_v2("RobustT", b"z" * (15 << 20), 0).encode()
        for _ in range(5):
            s = Conn(server.vip_addr)
            s.send_raw(big[:-(1 << 20)])
            stalled.append(s)
        # a half-sent request
        s = Conn(server.vip_addr)
        s.send_raw(send_v2("RobustT", b"never", 0).encode()[:30])
        stalled.append(s)
        ok = Conn(server.vip_addr)
        try:
            t0 = time.monotonic()
            assert ok.rpc(send_v2("RobustT", b"served", 0)).code == 0
            assert time.monotonic() - t0 < 2.0
        finally:
            ok.close()
        grew_mb = (_rss_kb(server.proc.pid) - rss0) / 1024
        assert grew_mb < 5 * 16 + 64, grew_mb         # at most the frames' own bytes, nothing amplified
    finally:
        for s in stalled:
            s.close()
    _assert_max_offset(server, "RobustT", before + 1)
    # a body over maxMessageSize (4 MiB) is refused as MESSAGE_ILLEGAL, the connection stays usable
    c = Conn(server.vip_addr)
    try:
        r = c.rpc(send_v2("RobustT", b"y" * (5 << 20), 0), timeout=20)
        assert r.code == ResponseCode.MESSAGE_ILLEGAL
        assert c.rpc(send_v2("RobustT", b"after", 0)).code == 0
    finally:
        c.close()


def test_client_that_never_reads_cannot_grow_server_memory(server):
    c = Conn(server.vip_addr)
    try:
        r = c.rpc(send_v2("BigMsgT", b"q" * (1 << 20), 0))
        assert r.code == 0
        offset = codec.decode_message_id(r.ext_fields["msgId"])[1]
    finally:
        c.close()
    rss0 = _rss_kb(server.proc.pid)
    greedy = socket.create_connection(("127.0.0.1", server.listen_port - 2), timeout=2)
    greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    view = req(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offset}).encode()
    sent = 0
    try:
        for _ in range(400):                 # 400 MiB of answers asked for, none read
            greedy.sendall(view)
            sent += 1
    except (socket.timeout, OSError):
        pass                                 # the server stopped reading us: fine
    try:
        time.sleep(0.5)
        grew_mb = (_rss_kb(server.proc.pid) - rss0) / 1024
        assert grew_mb < 48, (grew_mb, sent)  # the 8 MiB write high-water mark, not 400 MiB
        ok = Conn(server.vip_addr)
        try:
            assert ok.rpc(req(RequestCode.GET_MAX_OFFSET, {"topic": "BigMsgT", "queueId": 0})).code == 0
        finally:
            ok.close()
    finally:
        greedy.close()


@pytest.mark.parametrize("code, fields, body, expect", [
    (RequestCode.SEND_MESSAGE_V2, {"a": "pg", "b": "RobustT", "c": "TBW102", "d": "4", "e": "abc", "f": "0", "g": "1",
                                   "h": "0"}, b"x", ResponseCode.SYSTEM_ERROR),
    (RequestCode.SEND_MESSAGE_V2, {"b": "RobustT"}, b"x", ResponseCode.SYSTEM_ERROR),
    (RequestCode.SEND_MESSAGE_V2, {"a": "pg", "b": "bad topic!", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1",
                                   "h": "0"}, b"x", ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.SEND_BATCH_MESSAGE, {"a": "pg", "b": "RobustT", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1",
                                      "h": "0", "m": "true"}, b"\x00\x00\x00\x30garbage", ResponseCode.MESSAGE_ILLEGAL),
    (RequestCode.PULL_MESSAGE, {"consumerGroup": "g", "topic": "RobustT", "queueId": "0"}, None, ResponseCode.SYSTEM_ERROR),
    (RequestCode.PULL_MESSAGE, {"consumerGroup": "g", "topic": "Nope", "queueId": "0", "queueOffset": "0",
                                "maxMsgNums": "1", "sysFlag": "0", "commitOffset": "0", "suspendTimeoutMillis": "0",
                                "subVersion": "0"}, None, ResponseCode.TOPIC_NOT_EXIST),
    (RequestCode.HEART_BEAT, None, b"{not json", ResponseCode.SYSTEM_ERROR),
    (RequestCode.VIEW_MESSAGE_BY_ID, {"offset": "-5"}, None, ResponseCode.SYSTEM_ERROR),
    (RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "g", "topic": "RobustT", "queueId": "99999999999"}, None,
     ResponseCode.SYSTEM_ERROR),
])
def test_bad_requests_get_error_answers(server, code, fields, body, expect):
    _warm(server)
    before = _max_offset(server, "RobustT")
    c = Conn(server.vip_addr)
    try:
        r = c.rpc(req(code, fields, body))
        assert r.code == expect, r
        assert c.rpc(req(RequestCode.GET_MAX_OFFSET, {"topic": "RobustT", "queueId": 0})).code == 0
    finally:
        c.close()
    _assert_max_offset(server, "RobustT", before)


def test_sigterm_persists_offsets_and_closes_store(tmp_path):
    store = tmp_path / "store"
    srv = ServerProcess(store, CONF).start()
    try:
        c = Conn(srv.vip_addr)
        assert c.rpc(send_v2("TermT", b"x", 0)).code == 0
        c.send(req(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "term_cg", "topic": "TermT", "queueId": 0,
                                                        "commitOffset": 1}, oneway=True))
        assert c.rpc(req(RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "term_cg", "topic": "TermT",
                                                             "queueId": 0})).ext_fields == {"offset": "1"}
        m = Conn(srv.broker_addr)
        held = req(RequestCode.PULL_MESSAGE, {"consumerGroup": "term_cg", "topic": "TermT", "queueId": 0,
                                              "queueOffset": 1, "maxMsgNums": 1, "sysFlag": 6, "commitOffset": 0,
                                              "suspendTimeoutMillis": 30000, "subscription": "*", "subVersion": 0,
                                              "expressionType": "TAG"})
        m.send(held)
        time.sleep(0.1)
        t0 = time.monotonic()
    finally:
        rc = srv.stop()
    assert rc == 0, srv.log_tail()
    assert time.monotonic() - t0 < 10          # a held pull does not delay the shutdown
    assert not (store / "abort").exists()
    offsets = json.loads((store / "config" / "consumerOffset.json").read_text())
    assert offsets["offsetTable"]["TermT@term_cg"] in ({"0": 1}, {0: 1})
    topics = json.loads((store / "config" / "topics.json").read_text())
    assert "TermT" in topics["topicConfigTable"]


@pytest.mark.skipif(not PCAP.exists(), reason=f"no capture at {PCAP}")
def test_name_server_takes_the_real_brokers_registration(tmp_path):
    """REGISTER_BROKER (103) exactly as RocketMQ 4.4.0's broker sent it: its topics become routable."""
    from rmqstore.remoting.pcap import read_frames
    regs = [f.command for f in read_frames(PCAP) if f.command.code == RequestCode.REGISTER_BROKER
            and not f.command.is_response]
    assert regs
    with ServerProcess(tmp_path / "store", dict(CONF, brokerName="broker-x")) as srv:
        c = Conn(srv.namesrv_addr)
        try:
            for cmd in regs:       # (the broker sent some of them oneway: ask for answers here)
                cmd = RemotingCommand(cmd.code, flag=0, ext_fields=cmd.ext_fields, body=cmd.body)
                r = c.rpc(cmd)
                assert r.code == 0, r
            route = fastjson.loads(c.rpc(req(RequestCode.GET_ROUTEINTO_BY_TOPIC, {"topic": "BenchTopic68479"})).body)
            assert route["brokerDatas"] == [{"brokerAddrs": {0: "127.0.0.1:10911"}, "brokerName": "broker-a",
                                             "cluster": "DefaultCluster"}]
            assert route["queueDatas"][0]["writeQueueNums"] == 4
            info = fastjson.loads(c.rpc(req(RequestCode.GET_BROKER_CLUSTER_INFO)).body)
            assert set(info["brokerAddrTable"]) == {"broker-a", "broker-x"}
            # a body whose CRC does not match is refused
            bad = RemotingCommand(RequestCode.REGISTER_BROKER, ext_fields=dict(regs[0].ext_fields, bodyCrc32="1"),
                                  body=regs[0].body)
            assert c.rpc(bad).code == ResponseCode.SYSTEM_ERROR
        finally:
            c.close()
        # the registering connection closed: the name server forgets that broker (BrokerHousekeepingService)
        n = Conn(srv.namesrv_addr)
        try:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                r = n.rpc(req(RequestCode.GET_ROUTEINTO_BY_TOPIC, {"topic": "BenchTopic68479"}))
                if r.code == ResponseCode.TOPIC_NOT_EXIST:
                    break
                time.sleep(0.05)
            assert r.code == ResponseCode.TOPIC_NOT_EXIST
        finally:
            n.close()


def test_send_message_v1_header(server):
    """SEND_MESSAGE (10) with SendMessageRequestHeader's full field names."""
    c = Conn(server.vip_addr)
    try:
        r = c.rpc(req(RequestCode.SEND_MESSAGE, {
            "producerGroup": "pg", "topic": "V1Topic", "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
            "queueId": 1, "sysFlag": 0, "bornTimestamp": int(time.time() * 1000), "flag": 0,
            "properties": "TAGS\x01T1\x02KEYS\x01v1key\x02", "reconsumeTimes": 0, "unitMode": "false",
            "batch": "false"}, b"v1 body"))
        assert r.code == 0 and r.ext_fields["queueId"] == "1" and r.ext_fields["queueOffset"] == "0"
        _, off = codec.decode_message_id(r.ext_fields["msgId"])
        rec = scanner.decode_record(c.rpc(req(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": off})).body, 0)
        assert (rec.topic, rec.queue_id, rec.body, rec.properties) == ("V1Topic", 1, b"v1 body",
                                                                       {"TAGS": "T1", "KEYS": "v1key"})
        assert rec.born_host.startswith("127.0.0.1:") and rec.store_host == server.broker_addr
    finally:
        c.close()


def _read_frames(sock: socket.socket, count: int, timeout: float = 10.0) -> list[bytes]:
    """count whole frames (with their length prefix) as the server wrote them."""
    buf, out = b"", []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(1 << 20)
        except socket.timeout:
            break
        if not data:
            break
        buf += data
        while len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">i", buf)[0]:
            n = 4 + struct.unpack_from(">i", buf)[0]
            out.append(buf[:n])
            buf = buf[n:]
    return out


def test_pipelined_sends_answer_as_the_general_path(server):
    """Many sends in one read take the broker's batched path (one MessageBatch, answers encoded in bulk);
    mixed ones (other property names, a binary header, a transaction half, a batch) the general one. Every
    answer is byte for byte what RemotingCommand would encode, and every message is stored as sent."""
    from rmqstore.remoting.command import decode_frame
    topic = "PipeT"
    c = Conn(server.vip_addr)
    m = Conn(server.broker_addr)
    try:
        assert c.rpc(send_v2(topic, b"first", 0, "KEYS\x01k\x02")).code == 0      # creates the topic
        sent: dict[int, list[tuple[bytes, dict]]] = {q: [] for q in range(4)}
        sent[0].append((b"first", {"KEYS": "k"}))

        def props_of(i, odd):
            if odd == "names":
                return {"TAGS": "T", "KEYS": f"k{i}", "UNIQ_KEY": f"U{i:030d}"}
            if odd == "none":
                return {}
            return {"KEYS": f"k{i} x{i}", "WAIT": "true", "TAGS": "TagA", "UNIQ_KEY": f"U{i:030d}"}

        def run(specs):
            cmds = []
            for i, odd in specs:
                p = props_of(i, odd)
                cmd = send_v2(topic, f"body-{i}-".encode() * (1 + i % 3), i % 4, codec.properties_to_string(p))
                if odd == "binary":
                    cmd.serialize_type = SerializeType.ROCKETMQ
                cmds.append((cmd, p))
            c.send_raw(b"".join(cmd.encode() for cmd, _ in cmds))
            frames = _read_frames(c.sock, len(cmds))
            assert len(frames) == len(cmds)
            got = {}
            for raw in frames:
                r = decode_frame(raw[4:])
                assert r.encode() == raw              # the generic encoder writes the same bytes
                got[r.opaque] = r
            for cmd, p in cmds:
                r = got[cmd.opaque]
                assert r.code == 0 and r.ext_fields["queueId"] == cmd.ext_fields["e"], r
                assert r.serialize_type == cmd.serialize_type
                q = int(cmd.ext_fields["e"])
                assert int(r.ext_fields["queueOffset"]) == len(sent[q]), (r, len(sent[q]))
                sent[q].append((cmd.body, p))
                assert r.ext_fields["MSG_REGION"] == "DefaultRegion" and r.ext_fields["TRACE_ON"] == "true"

        run([(i, "") for i in range(40)])                                       # uniform: one MessageBatch
        run([(i, "names" if i == 50 else "none" if i == 60 else "binary" if i == 65 else "")
             for i in range(40, 80)])                                            # mixed: Messages
        run([(i, "none") for i in range(80, 120)])                               # no properties at all
        run([(i, "names" if i == 130 else "") for i in range(120, 160)])         # plain, other names: Messages
        for q in range(4):
            recs = []
            deadline = time.monotonic() + 5
            while len(recs) < len(sent[q]) and time.monotonic() < deadline:
                pull = {"consumerGroup": "pipe_cg", "topic": topic, "queueId": q, "queueOffset": len(recs),
                        "maxMsgNums": 32, "sysFlag": 4, "commitOffset": 0, "suspendTimeoutMillis": 0,
                        "subscription": "*", "subVersion": 1, "expressionType": "TAG"}
                r = m.rpc(req(RequestCode.PULL_MESSAGE, pull))
                if r.code == 0:
                    recs += [scanner.decode_record(x, 0) for x in _records(r.body)]
                else:
                    time.sleep(0.05)
            assert [(x.body, x.properties, x.queue_offset) for x in recs] == \
                [(b, p, i) for i, (b, p) in enumerate(sent[q])]
    finally:
        c.close()
        m.close()


def test_oneway_send_is_stored_and_not_answered(server):
    c = Conn(server.vip_addr)
    try:
        assert c.rpc(send_v2("OnewayT", b"first", 0, "KEYS\x01a\x02")).code == 0
        ow = send_v2("OnewayT", b"oneway", 0, "KEYS\x01b\x02")
        ow.flag |= 2
        last = send_v2("OnewayT", b"last", 0, "KEYS\x01c\x02")
        c.send_raw(ow.encode() + last.encode())
        frames = _read_frames(c.sock, 2, timeout=2.0)
        from rmqstore.remoting.command import decode_frame
        assert [decode_frame(f[4:]).opaque for f in frames] == [last.opaque]
        assert decode_frame(frames[0][4:]).ext_fields["queueOffset"] == "2"     # the oneway one took offset 1
    finally:
        c.close()
