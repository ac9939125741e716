"""codec: record round trips, robustness against garbage, Java hash codes, message ids, v2 records."""
from __future__ import annotations

import ipaddress
import struct

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rmqstore.store.format import codec, scanner
from rmqstore.store.format.validation import topic_problem

INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
settings.register_profile("rmqstore", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("rmqstore")


def host_str(ip, port: int) -> str:
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


hosts = st.builds(host_str, st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)), st.integers(0, 65535))
# topics a put could write (the record rule refuses others: control characters, "/", "\\", "." and "..")
topics = st.text(min_size=1, max_size=127).filter(lambda s: 1 <= len(s.encode()) <= 127
                                                  and topic_problem(s) is None)
prop_text = st.text(alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
                    max_size=40)
properties = st.dictionaries(prop_text.filter(bool), prop_text, max_size=8)


def java_hash_reference(s: str) -> int:
    """s[0]*31^(n-1) + ... + s[n-1] over UTF-16 code units, as a Java int."""
    units = struct.unpack(f">{len(s.encode('utf-16-be')) // 2}H", s.encode("utf-16-be"))
    n = len(units)
    h = sum(u * 31 ** (n - 1 - i) for i, u in enumerate(units)) % (1 << 32)
    return h - (1 << 32) if h >= 1 << 31 else h


@st.composite
def records(draw):
    # queue ids a put could write (the record rule refuses others)
    return dict(queue_id=draw(st.integers(0, 65535)), flag=draw(INT32), queue_offset=draw(INT64),
                physical_offset=draw(INT64),
                sys_flag=draw(INT32), born_timestamp=draw(INT64), born_host=draw(hosts),
                store_timestamp=draw(INT64), store_host=draw(hosts), reconsume_times=draw(INT32),
                prepared_transaction_offset=draw(INT64), body=draw(st.binary(max_size=300)),
                topic=draw(topics), properties=draw(properties))


# --- round trips ---------------------------------------------------------------------------------
@given(records())
@example(dict(queue_id=0, flag=0, queue_offset=0, physical_offset=0, sys_flag=0, born_timestamp=0,
              born_host="0.0.0.0:0", store_timestamp=0, store_host="[::]:0", reconsume_times=0,
              prepared_transaction_offset=0, body=b"", topic="t", properties={}))
def test_encode_decode_round_trip(f):
    raw = codec.encode_record(**f)
    born_v6 = ipaddress.ip_address(f["born_host"].rpartition(":")[0].strip("[]")).version == 6
    store_v6 = ipaddress.ip_address(f["store_host"].rpartition(":")[0].strip("[]")).version == 6
    want_sys = (f["sys_flag"] & ~0x30) | (0x10 if born_v6 else 0) | (0x20 if store_v6 else 0)
    topic_b = f["topic"].encode()
    props_b = codec.properties_to_string(f["properties"]).encode()
    assert len(raw) == codec.record_length(len(f["body"]), len(topic_b), len(props_b), want_sys)
    assert scanner.check_record(raw, 0, len(raw), check_crc=True) == (scanner.Outcome.MESSAGE, len(raw))
    # inside a bigger buffer, at a position, followed by zeros
    buf = b"\xaa" * 13 + raw + bytes(16)
    assert list(scanner.iter_records(buf, 13, len(buf), check_crc=True)) == [(13, scanner.Outcome.MESSAGE, len(raw))]
    r = scanner.decode_record(buf, 13, len(buf), check_crc=True)
    assert r.store_size == len(raw)
    assert r.magic == codec.MESSAGE_MAGIC_CODE
    assert r.body_crc == codec.body_crc(f["body"])
    assert (r.queue_id, r.flag, r.queue_offset, r.physical_offset) == \
        (f["queue_id"], f["flag"], f["queue_offset"], f["physical_offset"])
    assert r.sys_flag == want_sys
    assert (r.born_timestamp, r.store_timestamp) == (f["born_timestamp"], f["store_timestamp"])
    assert r.born_host == f["born_host"] and r.store_host == f["store_host"]
    assert (r.reconsume_times, r.prepared_transaction_offset) == (f["reconsume_times"], f["prepared_transaction_offset"])
    assert r.body == f["body"]
    assert r.topic == f["topic"]
    assert r.properties == f["properties"]
    assert codec.decode_message_id(r.msg_id) == (f["store_host"], f["physical_offset"])
    # the STORETIMESTAMP field is where store_timestamp_pos says
    ts_pos = codec.store_timestamp_pos(want_sys)
    assert struct.unpack_from(">q", raw, ts_pos)[0] == f["store_timestamp"]
    # without the body
    assert scanner.decode_record(raw, 0, read_body=False).body is None


@given(st.dictionaries(prop_text.filter(bool), prop_text, max_size=20))
def test_properties_round_trip(props):
    s = codec.properties_to_string(props)
    assert codec.string_to_properties(s) == props
    assert codec.string_to_properties(codec.sorted_properties_string(props)) == props
    for k, v in props.items():
        assert codec.property_from_bytes(s.encode(), k.encode()) == v


# --- garbage never breaks the decoder -------------------------------------------------------------
def _only_record_errors(buf: bytes, pos: int, check_crc: bool) -> None:
    try:
        kind, size = scanner.check_record(buf, pos, len(buf), check_crc)
    except codec.RecordError as e:
        assert e.pos == pos
        kind = None
    else:
        assert kind in (scanner.Outcome.MESSAGE, scanner.Outcome.END_OF_FILE, scanner.Outcome.END_OF_DATA)
        if kind != scanner.Outcome.END_OF_DATA:
            assert 8 <= size <= len(buf) - pos
    try:
        r = scanner.decode_record(buf, pos, len(buf), check_crc=check_crc)
    except codec.RecordError:
        pass
    else:
        assert kind == scanner.Outcome.MESSAGE and r.store_size == size
    # walking never hangs and never leaves the buffer
    try:
        for p, k, s in scanner.iter_records(buf, pos, len(buf), check_crc):
            assert pos <= p < len(buf) and p + s <= len(buf) and s > 0
    except codec.RecordError:
        pass


@given(st.binary(max_size=400), st.data(), st.booleans())
def test_random_bytes_raise_only_record_error(buf, data, check_crc):
    pos = data.draw(st.integers(0, len(buf)))
    _only_record_errors(buf, pos, check_crc)


@given(records(), st.data(), st.booleans(), st.sampled_from([codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2,
                                                              codec.BLANK_MAGIC_CODE]))
def test_mutated_records_raise_only_record_error(f, data, check_crc, magic):
    """Valid records with bytes flipped, sizes rewritten, magic swapped, or cut short."""
    buf = bytearray(codec.encode_record(**f))
    struct.pack_into(">I", buf, 4, magic)
    for _ in range(data.draw(st.integers(0, 4))):
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):   # rewrite a length field: total, sysflag, body length
        where = data.draw(st.sampled_from([0, 36, codec.header_struct(f["sys_flag"]).size - 4]))
        if where + 4 <= len(buf):
            struct.pack_into(">i", buf, where, data.draw(INT32))
    cut = data.draw(st.integers(0, len(buf)))
    _only_record_errors(bytes(buf[:cut]), 0, check_crc)
    _only_record_errors(bytes(buf), 0, check_crc)


def test_specific_errors():
    raw = codec.encode_record(queue_id=0, flag=0, queue_offset=0, physical_offset=0, sys_flag=0, born_timestamp=0,
                              born_host="1.2.3.4:5", store_timestamp=0, store_host="1.2.3.4:6",
                              reconsume_times=0, prepared_transaction_offset=0, body=b"abc", topic="T",
                              properties={"a": "b"})
    bad_magic = bytearray(raw)
    bad_magic[4:8] = b"\x12\x34\x56\x78"
    with pytest.raises(codec.RecordError, match="magic"):
        scanner.check_record(bad_magic, 0, len(raw))
    with pytest.raises(codec.RecordError, match="total size"):
        scanner.check_record(raw[:-1], 0, len(raw) - 1)
    bad_crc = bytearray(raw)
    bad_crc[codec.HEADER_V4.size] ^= 1
    assert scanner.check_record(bad_crc, 0, len(raw))[0] == scanner.Outcome.MESSAGE
    with pytest.raises(codec.RecordError, match="CRC"):
        scanner.check_record(bad_crc, 0, len(raw), check_crc=True)
    assert scanner.check_record(bytes(64), 0, 64) == (scanner.Outcome.END_OF_DATA, 0)
    blank = codec.encode_blank(64) + bytes(56)
    assert scanner.check_record(blank, 0, 64) == (scanner.Outcome.END_OF_FILE, 64)
    with pytest.raises(codec.RecordError):
        scanner.check_record(blank, 0, 63)
    with pytest.raises(codec.RecordError):
        scanner.decode_record(blank, 0)


# --- Java hash codes ------------------------------------------------------------------------------
@pytest.mark.parametrize("s, h", [
    ("", 0),
    ("a", 97),
    ("abc", 96354),
    ("hello", 99162322),
    ("Aa", 2112), ("BB", 2112),
    ("TagA", 84 * 31 ** 3 + 97 * 31 ** 2 + 103 * 31 + 65),
    ("TagA", 2598919),
    ("😀", 0xD83D * 31 + 0xDE00),          # two UTF-16 code units
    ("😀", 1772899),
    ("polygenelubricants", -(1 << 31)),     # Integer.MIN_VALUE
    ("订单Topic", java_hash_reference("订单Topic")),
])
def test_java_string_hash_known_values(s, h):
    assert codec.java_string_hash(s) == h


@given(st.text(max_size=60))
def test_java_string_hash_formula(s):
    assert codec.java_string_hash(s) == java_hash_reference(s)
    assert -(1 << 31) <= codec.java_string_hash(s) < 1 << 31


def test_java_string_hash_long_strings():
    for n in (4095, 4096, 4097, 10000):
        s = "".join(chr(0x20 + (i * 7919) % 0x7000) for i in range(n))
        assert codec.java_string_hash(s) == java_hash_reference(s)
    s = "😀" * 3000    # 6000 UTF-16 units
    assert codec.java_string_hash(s) == java_hash_reference(s)


def test_index_key_hash_and_tags_code():
    assert codec.index_key_hash("polygenelubricants") == 0
    assert codec.index_key_hash("TagA") == 2598919
    neg = "polygenelubricantz"
    assert codec.java_string_hash(neg) < 0
    assert codec.index_key_hash(neg) == -codec.java_string_hash(neg)
    assert codec.tags_code(None) == 0 and codec.tags_code("") == 0
    assert codec.tags_code("TagA") == 2598919
    assert codec.index_key("TopicA", "k1") == "TopicA#k1"


# --- message ids ---------------------------------------------------------------------------------
def test_message_id_golden_value():
    assert codec.create_message_id(bytes([192, 168, 7, 9]), 10911, 0) == "C0A8070900002A9F0000000000000000"
    assert codec.decode_message_id("C0A8070900002A9F00000000000D6C22") == ("192.168.7.9:10911", 879650)
    assert codec.decode_message_id("c0a8070900002a9f00000000000d6c22") == ("192.168.7.9:10911", 879650)


@given(hosts, st.integers(0, (1 << 63) - 1))
def test_message_id_round_trip(host, offset):
    addr, port, v6 = codec.parse_host(host)
    mid = codec.create_message_id(addr, port, offset)
    assert len(mid) == (56 if v6 else 32) and mid == mid.upper()
    assert codec.decode_message_id(mid) == (host, offset)


@pytest.mark.parametrize("bad", ["", "XYZ", "C0A80709", "00" * 20])
def test_message_id_bad(bad):
    with pytest.raises(ValueError):
        codec.decode_message_id(bad)


# --- RocketMQ 5 records (magic v2, 2-byte topic length) --------------------------------------------
def encode_v2(f: dict) -> bytes:
    born_addr, born_port, born_v6 = codec.parse_host(f["born_host"])
    store_addr, store_port, store_v6 = codec.parse_host(f["store_host"])
    sys_flag = (f["sys_flag"] & ~0x30) | (0x10 if born_v6 else 0) | (0x20 if store_v6 else 0)
    hs = codec.header_struct(sys_flag)
    tail = codec.encode_tail(f["topic"].encode(), codec.properties_to_string(f["properties"]).encode(), v2=True)
    total = hs.size + len(f["body"]) + len(tail)
    return hs.pack(total, codec.MESSAGE_MAGIC_CODE_V2, codec.body_crc(f["body"]), f["queue_id"], f["flag"],
                   f["queue_offset"], f["physical_offset"], sys_flag, f["born_timestamp"], born_addr, born_port,
                   f["store_timestamp"], store_addr, store_port, f["reconsume_times"],
                   f["prepared_transaction_offset"], len(f["body"])) + f["body"] + tail


@given(records(), st.text(min_size=1, max_size=300).filter(lambda t: topic_problem(t, max_bytes=1200) is None))
def test_v2_records_decode(f, long_topic):
    f["topic"] = long_topic                     # v2 topics may be longer than 127 bytes
    raw = encode_v2(f)
    assert len(raw) == codec.record_length(len(f["body"]), len(long_topic.encode()),
                                           len(codec.properties_to_string(f["properties"]).encode()),
                                           f["sys_flag"] & ~0x30 | (0x10 if "[" in f["born_host"] else 0)
                                           | (0x20 if "[" in f["store_host"] else 0), v2=True)
    assert scanner.check_record(raw, 0, len(raw), check_crc=True) == (scanner.Outcome.MESSAGE, len(raw))
    r = scanner.decode_record(raw, 0, check_crc=True)
    assert r.magic == codec.MESSAGE_MAGIC_CODE_V2
    assert r.topic == long_topic
    assert r.properties == f["properties"]
    assert r.body == f["body"]
    assert (r.queue_offset, r.physical_offset, r.store_timestamp) == \
        (f["queue_offset"], f["physical_offset"], f["store_timestamp"])
    assert r.born_host == f["born_host"] and r.store_host == f["store_host"]


def test_v2_record_with_200_byte_topic_fixed():
    topic = "T" * 200
    f = dict(queue_id=3, flag=1, queue_offset=7, physical_offset=1234, sys_flag=0, born_timestamp=1,
             born_host="10.0.0.1:1", store_timestamp=2, store_host="[2001:db8::1]:10911", reconsume_times=0,
             prepared_transaction_offset=0, body=b"xyz", topic=topic, properties={"TAGS": "t"})
    raw = encode_v2(f)
    tpos = codec.header_struct(0x20).size + 3
    assert raw[tpos:tpos + 2] == b"\x00\xc8"
    r = scanner.decode_record(raw, 0)
    assert (r.topic, r.store_host, r.sys_flag) == (topic, "[2001:db8::1]:10911", 0x20)
    # the same record with the v1 magic cannot be read: its topic length byte would be 0
    v1 = bytearray(raw)
    struct.pack_into(">I", v1, 4, codec.MESSAGE_MAGIC_CODE)
    with pytest.raises(codec.RecordError):
        scanner.decode_record(bytes(v1), 0)


# --- walk_records: the batched walk recovery uses, against check_record one record at a time --------------
def _walk_one_by_one(buf, limit: int, check_crc: bool):
    pos = 0
    try:
        while pos < limit:
            kind, size = scanner.check_record(buf, pos, limit, check_crc)
            if kind == scanner.Outcome.END_OF_DATA:
                return pos, kind, 0
            if kind == scanner.Outcome.END_OF_FILE:
                return pos, kind, size
            pos += size
        return pos, scanner.Outcome.END_OF_DATA, 0
    except codec.RecordError as e:
        return "error", e.pos, e.reason


def _walk_batched(buf, limit: int, check_crc: bool):
    try:
        return scanner.walk_records(buf, 0, limit, check_crc)
    except codec.RecordError as e:
        return "error", e.pos, e.reason


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(records(), min_size=1, max_size=12), st.data(), st.booleans())
def test_walk_records_agrees_with_check_record(recs, data, check_crc):
    """Runs of v1, v2 and IPv6 records, a blank or zeros or garbage after them, bytes flipped and lengths
    rewritten anywhere: walk_records stops where check_record's walk stops, with the same error reason,
    whatever the batch size."""
    parts = [encode_v2(f) if data.draw(st.integers(0, 5)) == 0 else codec.encode_record(**f) for f in recs]
    buf = bytearray(b"".join(parts))
    tail = data.draw(st.sampled_from(["zeros", "blank", "none", "garbage"]))
    if tail == "zeros":
        buf += bytes(data.draw(st.integers(0, 200)))
    elif tail == "blank":
        n = data.draw(st.integers(8, 200))
        buf += codec.encode_blank(n) + bytes(n - 8)
    elif tail == "garbage":
        buf += data.draw(st.binary(min_size=1, max_size=100))
    for _ in range(data.draw(st.integers(0, 3))):
        i = data.draw(st.integers(0, len(buf) - 1))
        if data.draw(st.booleans()):
            buf[i] = data.draw(st.integers(0, 255))
        elif i + 4 <= len(buf):
            struct.pack_into(">i", buf, i, data.draw(INT32))
    limit = data.draw(st.integers(0, len(buf)))
    want = _walk_one_by_one(bytes(buf), limit, check_crc)
    saved = scanner.WALK_BATCH
    try:
        for batch in (saved, 1, 2, 5):
            scanner.WALK_BATCH = batch
            assert _walk_batched(bytes(buf), limit, check_crc) == want, batch
    finally:
        scanner.WALK_BATCH = saved


def test_walk_records_golden_commitlog():
    """Every golden commitlog file walks to the same end as check_record's walk, CRCs checked."""
    import mmap
    from conftest import golden_dir
    root = golden_dir()
    files = sorted(root.glob("*/commitlog/*")) + sorted(root.glob("*/store/commitlog/*"))
    files = [f for f in files if f.is_file() and f.name.isdigit()]
    assert files, f"no golden commitlog under {root}"
    walked = 0
    for f in files:
        with open(f, "rb") as fh:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            try:
                want = _walk_one_by_one(mm, len(mm), True)
                assert want[0] != "error", (f, want)
                assert _walk_batched(mm, len(mm), True) == want, f
                walked += want[0]
            finally:
                mm.close()
    assert walked > 3 << 20         # the files hold some megabytes of records
