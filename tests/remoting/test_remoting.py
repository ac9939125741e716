"""The remoting codec: frames, JSON and ROCKETMQ binary headers, the fastjson dialect, batch bodies, and
every frame of the real RocketMQ 4.4.0 capture (small.pcap) decoded and re-encoded."""
from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from rmqstore.store.format import scanner
from rmqstore.remoting import FrameDecoder, FrameError, FrameTooLarge, RemotingCommand, fastjson
from rmqstore.remoting.body import BodyError, UniqIdGenerator, decode_batch, encode_batch
from rmqstore.remoting.codes import RequestCode, ResponseCode, SerializeType, code_name
from rmqstore.remoting.command import MAX_FRAME_LENGTH, decode_frame

NOTES = Path(os.environ.get("RMQSTORE_REMOTING_NOTES", Path(__file__).resolve().parents[1] / "data" / "remoting"))
PCAP = NOTES / "small.pcap"
needs_pcap = pytest.mark.skipif(not PCAP.exists(), reason=f"no capture at {PCAP}")


# --- codes --------------------------------------------------------------------------------------------
def test_codes_have_rocketmq_names_and_values():
    assert RequestCode.SEND_MESSAGE_V2 == 310 and RequestCode.SEND_BATCH_MESSAGE == 320
    assert RequestCode.GET_ROUTEINTO_BY_TOPIC == 105 == RequestCode.GET_ROUTEINFO_BY_TOPIC
    assert RequestCode.NOTIFY_CONSUMER_IDS_CHANGED == 40 and RequestCode.END_TRANSACTION == 37
    assert ResponseCode.TOPIC_NOT_EXIST == 17 and ResponseCode.QUERY_NOT_FOUND == 22
    assert ResponseCode.REQUEST_CODE_NOT_SUPPORTED == 3 and ResponseCode.SUBSCRIPTION_NOT_LATEST == 25
    assert code_name(11) == "PULL_MESSAGE" and code_name(19, response=True) == "PULL_NOT_FOUND"
    assert code_name(9999) == "9999"


# --- frames -------------------------------------------------------------------------------------------
def test_json_frame_layout_matches_java():
    cmd = RemotingCommand.request(RequestCode.GET_ROUTEINTO_BY_TOPIC, {"topic": "TBW102"}, opaque=0)
    raw = cmd.encode()
    length, ori = struct.unpack(">ii", raw[:8])
    assert length == len(raw) - 4 and ori >> 24 == 0
    header = raw[8:8 + (ori & 0xFFFFFF)]
    assert header == (b'{"code":105,"extFields":{"topic":"TBW102"},"flag":0,"language":"JAVA","opaque":0,'
                      b'"serializeTypeCurrentRPC":"JSON","version":293}')


def test_roundtrip_json_and_binary_with_body():
    for st_ in (SerializeType.JSON, SerializeType.ROCKETMQ):
        cmd = RemotingCommand.request(310, {"a": "pg", "i": "KEYS\x01k\x02", "é": "ü"}, b"\x00body\xff",
                                      serialize_type=st_)
        cmd.remark = "hello ☃"
        got = FrameDecoder().feed(cmd.encode())
        assert len(got) == 1
        g = got[0]
        assert (g.code, g.opaque, g.flag, g.remark, g.ext_fields, g.body, g.serialize_type) == \
            (310, cmd.opaque, 0, "hello ☃", cmd.ext_fields, b"\x00body\xff", st_)
        resp = g.make_response(0, None, {"x": 1})
        assert resp.serialize_type == st_ and resp.is_response and resp.opaque == cmd.opaque
        r2 = FrameDecoder().feed(resp.encode())[0]
        assert r2.ext_fields == {"x": "1"} and r2.is_response


def test_binary_header_layout():
    cmd = RemotingCommand(12, opaque=7, flag=2, remark="r", ext_fields={"k": "v"}, serialize_type=1, version=293)
    raw = cmd.encode()
    hl = struct.unpack(">i", raw[4:8])[0] & 0xFFFFFF
    assert raw[4] == 1
    h = raw[8:8 + hl]
    assert h == struct.pack(">hbhii", 12, 0, 293, 7, 2) + struct.pack(">i", 1) + b"r" + \
        struct.pack(">i", 2 + 1 + 4 + 1) + struct.pack(">h", 1) + b"k" + struct.pack(">i", 1) + b"v"


def test_decoder_splits_any_chunking():
    cmds = [RemotingCommand.request(34, body=os.urandom(i * 37)) for i in range(20)]
    stream = b"".join(c.encode() for c in cmds)
    for step in (1, 3, 17, 1000, len(stream)):
        dec = FrameDecoder()
        out = []
        for i in range(0, len(stream), step):
            out.extend(dec.feed(stream[i:i + step]))
        assert [c.opaque for c in out] == [c.opaque for c in cmds]
        assert [c.body or b"" for c in out] == [c.body or b"" for c in cmds]
        assert dec.buffered == 0


@pytest.mark.parametrize("frame, why", [
    (struct.pack(">i", 2) + b"xx", "below the minimum"),
    (struct.pack(">i", -5) + b"xxxx", "below the minimum"),
    (struct.pack(">ii", 8, 100) + b"{}{}", "exceeds the frame"),
    (struct.pack(">ii", 8, 4) + b"nope", "JSON header"),
    (struct.pack(">ii", 8, 4) + b"[1] ", "not an object"),
    (struct.pack(">ii", 8, (7 << 24) | 4) + b"{}  ", "unknown serialize type"),
    (struct.pack(">ii", 8, (1 << 24) | 4) + b"\x00\x01\x00\x00", "binary header"),
    (struct.pack(">ii", 24, 20) + b'{"code":"x","a":1}  ', "must be integers"),
])
def test_malformed_frames_raise(frame, why):
    with pytest.raises(FrameError, match=why):
        FrameDecoder().feed(frame)


def test_oversized_frame_refused_before_buffering():
    dec = FrameDecoder()
    with pytest.raises(FrameTooLarge):
        dec.feed(struct.pack(">i", MAX_FRAME_LENGTH + 1) + b"\0" * 100)
    assert dec.buffered == 0
    # exactly the limit is allowed (buffered until complete)
    dec = FrameDecoder()
    assert dec.feed(struct.pack(">i", MAX_FRAME_LENGTH) + b"\0" * 10) == []


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_decoder_never_crashes_on_garbage(data):
    try:
        FrameDecoder(max_frame=1 << 16).feed(data)
    except FrameError:
        pass


# --- fastjson -----------------------------------------------------------------------------------------
def test_fastjson_reads_unquoted_numeric_and_object_keys():
    d = fastjson.loads(b'{"brokerAddrs":{0:"127.0.0.1:10911",1:"x"},"t":{{"brokerName":"b","queueId":0}:5},'
                       b'"n":-3,"f":1.5e2,"l":[true,false,null],"s":"\\u00e9\\n"}')
    assert d["brokerAddrs"] == {0: "127.0.0.1:10911", 1: "x"}
    (k, v), = d["t"].items()
    assert k == {"brokerName": "b", "queueId": 0} and v == 5 and hash(k)
    assert d["n"] == -3 and d["f"] == 150.0 and d["l"] == [True, False, None] and d["s"] == "é\n"
    assert fastjson.loads("{'a':'b',c:1}") == {"a": "b", "c": 1}


def test_fastjson_writes_unquoted_numeric_keys():
    s = fastjson.dumps({"brokerDatas": [{"brokerAddrs": {0: "127.0.0.1:10911"}, "brokerName": "broker-a"}],
                        "x": [1, True, None, "é\x01"], "m": {fastjson.FrozenDict({"a": 1}): 2}})
    assert s == ('{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:10911"},"brokerName":"broker-a"}],'
                 '"x":[1,true,null,"é\\u0001"],"m":{{"a":1}:2}}')
    assert fastjson.loads(s)["brokerDatas"][0]["brokerAddrs"] == {0: "127.0.0.1:10911"}


@pytest.mark.parametrize("bad", ['{"a":', '{"a" 1}', '[1,,2]', '{"a":tru}', '"\\q"', '{"a":1}x', "{0:}", "[" * 1000])
def test_fastjson_rejects_malformed(bad):
    with pytest.raises(ValueError):
        fastjson.loads(bad)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 63, 2 ** 63 - 1) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8) | st.integers(-1000, 1000),
                                                                       children, max_size=4),
    max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_fastjson_roundtrip(v):
    assert fastjson.loads(fastjson.dumps(v)) == v


# --- bodies ---------------------------------------------------------------------------------------------
def test_batch_body_roundtrip_and_layout():
    entries = [(0, b"abc", {"KEYS": "k1", "UNIQ_KEY": "U1"}), (7, b"", {}), (1, b"x" * 1000, {"TAGS": "T"})]
    raw = encode_batch(entries)
    size, magic, crc, flag, blen = struct.unpack_from(">iiiii", raw, 0)
    assert (magic, crc, flag, blen) == (0, 0, 0, 3) and size == 20 + 3 + 2 + len("KEYS\x01k1\x02UNIQ_KEY\x01U1\x02")
    got = decode_batch(raw)
    assert [(e.flag, e.body, e.properties) for e in got] == entries


@pytest.mark.parametrize("cut", [1, 5, 21, 30])
def test_batch_body_truncated_raises(cut):
    raw = encode_batch([(0, b"abc", {"KEYS": "k1"})])
    with pytest.raises(BodyError):
        decode_batch(raw[:-cut])


def test_uniq_id_format():
    g = UniqIdGenerator("192.0.2.2")
    a, b = g.new_id(), g.new_id()
    assert len(a) == 32 and a[:8] == "C0000202" and a != b and int(a, 16) >= 0
    assert int(b[-4:], 16) == (int(a[-4:], 16) + 1) & 0xFFFF
    # digits 20-28: milliseconds since the start of the month (local time), as MessageClientIDSetter
    import time
    t = time.localtime()
    month_start = time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, -1)) * 1000
    ids = [g.new_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    assert abs(int(ids[-1][20:28], 16) - (time.time() * 1000 - month_start)) < 1000


# --- the capture ----------------------------------------------------------------------------------------
@needs_pcap
def test_capture_frames_decode_and_reencode_identically():
    from rmqstore.remoting.pcap import read_frames
    frames = read_frames(PCAP)
    assert len(frames) > 150
    codes = {f.command.code for f in frames if not f.command.is_response}
    assert {105, 103, 310, 11, 12, 14, 15, 33, 34, 35, 38, 40} <= codes
    for f in frames:
        cmd = f.command
        assert cmd.serialize_type == SerializeType.JSON and cmd.language == "JAVA" and cmd.version == 293
        # our encoder writes the same header bytes as the Java client and servers (fastjson member order)
        again = decode_frame(cmd.encode()[4:])
        assert (again.code, again.opaque, again.flag, again.remark, again.ext_fields, again.body) == \
            (cmd.code, cmd.opaque, cmd.flag, cmd.remark, cmd.ext_fields, cmd.body)
        if not cmd.ext_fields or len(cmd.ext_fields) <= 1:
            assert cmd.encode() == f.raw
    bodies = [f.command for f in frames if f.src[1] == 10911 and f.command.is_response and f.command.body]
    recs = [scanner.decode_record(c.body, 0) for c in bodies if c.body]
    assert recs and all(r.topic == "CapTopic" for r in recs)
    routes = [f.command for f in frames if f.src[1] == 9876 and f.command.code == 0 and f.command.body]
    route = fastjson.loads(routes[0].body)
    assert route["brokerDatas"][0]["brokerAddrs"] == {0: "127.0.0.1:10911"}
    assert fastjson.dumps(route).encode() == routes[0].body
    hb = [f.command for f in frames if f.command.code == 34 and not f.command.is_response][0]
    d = fastjson.loads(hb.body)
    assert fastjson.dumps(d).encode() == hb.body
