"""What RocketMQ 4.4.0's own brokers send and answer on the replication paths, recorded from a real Java
master/slave pair (tests/data/ha, see its README) and replayed against rmqstore:

- the Java master's HA stream (heartbeat first, 32 KiB frames cutting records, END_OF_FILE blanks as bytes)
  served over a real socket to rmqstore's HAClient: the slave's commitlog is the stream's bytes and its
  queues and index serve every message;
- the Java brokers' REGISTER_BROKER requests against rmqstore's name server: the slave is answered the
  master's masterAddr and haServerAddr exactly as RocketMQ's name server answered it;
- the Java slave's SlaveSynchronize requests (21, 43, 45, 201) against an rmqstore master broker, and the
  Java master's answers to them applied by rmqstore's SlaveSynchronize.
"""
from __future__ import annotations

import asyncio
import gzip
import json
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from rmqstore import MessageStore, StoreConfig
from rmqstore.broker.namesrv import NameServer
from rmqstore.broker.slave_sync import SlaveSynchronize
from rmqstore.broker.state import SubscriptionGroupManager
from rmqstore.messaging.offset_store import ConsumerOffsetManager
from rmqstore.messaging.topic_config import TopicConfigManager
from rmqstore.remoting import fastjson
from rmqstore.remoting.command import decode_frame
from rmqstore.store.ha import protocol

DATA = Path(__file__).resolve().parents[1] / "data" / "ha"
FILE = 64 * 1024
N = 1000


def recorded_frames() -> list[tuple[int, int, object]]:
    out = []
    for line in (DATA / "remoting.jsonl").read_text().splitlines():
        d = json.loads(line)
        raw = bytes.fromhex(d["frame"])
        out.append((d["src"], d["dst"], decode_frame(raw[4:])))
    return out


def answer_to(frames, src: int, dst: int, opaque: int):
    """The recorded answer to a request (None: the capture ended before it)."""
    return next((c for s, d, c in frames if c.is_response and s == dst and d == src and c.opaque == opaque), None)


def test_java_master_stream_replayed_to_our_slave(tmp_path):
    stream = gzip.decompress((DATA / "ha-stream.bin.gz").read_bytes())
    frames = protocol.FrameDecoder(1 << 22).feed(stream)
    # RocketMQ's shape: a heartbeat first, contiguous frames of at most haTransferBatchSize
    assert frames[0].data == b"" and max(len(f.data) for f in frames) <= 32 * 1024
    data = [f for f in frames if f.data]
    assert all(a.offset + len(a.data) == b.offset for a, b in zip(data, data[1:]))
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    reports: list[int] = []

    def java_master() -> None:              # the recorded bytes, once the slave has reported (as RocketMQ)
        conn, _ = srv.accept()
        conn.settimeout(20)
        reports.append(protocol.REPORT.unpack(conn.recv(8))[0])
        for i in range(0, len(stream), 7000):
            conn.sendall(stream[i:i + 7000])
        try:
            while conn.recv(8):             # the slave's reports, until it closes
                pass
        except OSError:
            pass
        conn.close()
    t = threading.Thread(target=java_master, daemon=True)
    t.start()
    cfg = StoreConfig(broker_role="SLAVE", broker_id=1, ha_master_address=f"127.0.0.1:{port}",
                      mapped_file_size_commit_log=FILE)
    data_end = max(f.offset + len(f.data) for f in frames)
    with MessageStore.open(tmp_path / "s", cfg) as s:
        deadline = time.monotonic() + 30
        while s.commit_log.get_max_offset() < data_end and time.monotonic() < deadline:
            time.sleep(0.05)
        assert s.commit_log.get_max_offset() == data_end
        assert s.wait_dispatched(20)
        keys = set()
        for qid in range(4):
            q = 0
            while True:
                r = s.get_message("g", "HaT", qid, q, 32)
                if not r.messages:
                    break
                keys.update(m.properties.get("KEYS") for m in r.messages)
                q = r.next_begin_offset
        assert {f"hakey-{i}" for i in range(N)} <= keys
        assert s.find_messages_by_key("HaT", "hakey-999")[0].body == b"h" * 256
    assert reports == [0]
    # the slave's files hold exactly the bytes of the frames, at their offsets
    got = b"".join((tmp_path / "s" / "commitlog" / n).read_bytes() for n in sorted((tmp_path / "s" / "commitlog").iterdir()))
    for f in frames:
        assert got[f.offset:f.offset + len(f.data)] == f.data
    srv.close()


def test_java_registrations_replayed_against_our_name_server():
    frames = recorded_frames()
    ns = NameServer()
    answered = 0
    for src, dst, cmd in frames:
        if cmd.is_response or cmd.code != 103:
            continue
        ours = ns.handle(None, cmd)
        java = answer_to(frames, src, dst, cmd.opaque)
        if java is None:
            continue
        assert ours.code == java.code == 0
        mine = {k: v for k, v in (ours.ext_fields or {}).items() if v is not None}
        theirs = {k: v for k, v in (java.ext_fields or {}).items() if k in ("masterAddr", "haServerAddr")}
        if (cmd.ext_fields or {}).get("brokerId") == "1" and theirs:
            assert mine == theirs == {"masterAddr": "127.0.0.1:20911", "haServerAddr": "127.0.0.1:20912"}
            answered += 1
    assert answered >= 2


@pytest.fixture
def master_broker(tmp_path):
    """An rmqstore master broker in process (its topic, offset and groups as the recorded pair had them)."""
    from rmqstore.broker.app import BrokerServer
    from rmqstore.broker.process import free_port, free_port_pair

    loop = asyncio.new_event_loop()
    cfg = StoreConfig(listen_port=free_port_pair(), namesrv_addr=f"127.0.0.1:{free_port()}",
                      mapped_file_size_commit_log=FILE)
    srv = BrokerServer(tmp_path / "m", cfg)
    loop.run_until_complete(srv.start())
    srv.broker.topics.create_topic("HaT", 4)
    srv.broker.offsets.commit_offset("ha_cg", "HaT", 0, 17)
    yield srv, loop
    loop.run_until_complete(srv.stop())
    loop.close()


def test_java_slave_sync_requests_replayed_against_our_master(master_broker):
    srv, _ = master_broker
    frames = recorded_frames()
    seen = set()
    for src, dst, cmd in frames:
        if cmd.is_response or cmd.code not in (21, 43, 45, 201):
            continue
        ours = srv.broker.handle(None, cmd)
        java = answer_to(frames, src, dst, cmd.opaque)
        if java is None:
            continue
        assert ours.code == java.code == 0, (cmd.code, ours.remark)
        mine, theirs = fastjson.loads(ours.body), fastjson.loads(java.body)
        assert set(mine) == set(theirs)               # the same wrapper (dataVersion, tables)
        if cmd.code == 21:
            assert "HaT" in mine["topicConfigTable"] and "HaT" in theirs["topicConfigTable"]
        if cmd.code == 43:
            assert mine["offsetTable"]["HaT@ha_cg"] == theirs["offsetTable"]["HaT@ha_cg"] == {0: 17}
            assert ours.body == java.body       # byte for byte, fastjson's unquoted integer keys included
        seen.add(cmd.code)
    assert seen == {21, 43, 45, 201}


def test_java_master_sync_answers_applied_by_our_slave(tmp_path):
    frames = recorded_frames()
    ctx = SimpleNamespace(topics=TopicConfigManager(tmp_path), offsets=ConsumerOffsetManager(tmp_path),
                          groups=SubscriptionGroupManager(tmp_path))
    sync = SlaveSynchronize(ctx, None, tmp_path)
    apply = {21: sync._topics, 43: sync._offsets, 45: sync._delay_offsets, 201: sync._groups}
    last: dict = {}
    for src, dst, cmd in frames:
        if not cmd.is_response and cmd.code in apply:
            answer = answer_to(frames, src, dst, cmd.opaque)
            if answer is not None:
                apply[cmd.code](answer.body or b"")
                last[cmd.code] = answer
    java_topics = fastjson.loads(last[21].body)
    assert ctx.topics.select("HaT") is not None
    assert ctx.topics.data_version == java_topics["dataVersion"]
    assert ctx.offsets.query_offset("ha_cg", "HaT", 0) == 17
    assert (tmp_path / "config" / "topics.json").exists() and (tmp_path / "config" / "delayOffset.json").exists()
    java_groups = fastjson.loads(last[201].body)["subscriptionGroupTable"]
    assert set(ctx.groups.table) == set(java_groups) and ctx.groups.data_version == \
        fastjson.loads(last[201].body)["dataVersion"]
