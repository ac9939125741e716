"""The record scanner (store/format/scanner.py): one rule, one outcome vocabulary, and its back-ends held equal.

Random commitlog buffers (v1 and v2 records, IPv4 and IPv6 hosts, every transaction type, a blank, zeros,
a torn tail or garbage after them, bytes flipped and lengths rewritten anywhere) go through every back-end:
the scalar walk (check_record / iter_records), the batched walk (walk_records), the column-wise rule
(walk_positions + record_columns) and the dispatch parse (numpy and scalar). They must agree on where
the records are, what stops the walk (and why) and every field.
"""
from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rmqstore.store.format import codec, scanner
from rmqstore.store.format.scanner import Outcome, RecordError

INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])

v4_hosts = st.builds(lambda ip, port: f"{ip}:{port}", st.ip_addresses(v=4), st.integers(0, 65535))
v6_hosts = st.builds(lambda ip, port: f"[{ip}]:{port}", st.ip_addresses(v=6), st.integers(0, 65535))
topics = st.one_of(st.sampled_from(["T", "TopicA", "订单Topic", codec.SCHEDULE_TOPIC]),
                   st.text(min_size=1, max_size=40).filter(lambda s: len(s.encode()) <= 127))
prop_text = st.text(alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
                    max_size=12)
properties = st.one_of(
    st.dictionaries(st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "DELAY", "a", "b"]), prop_text, max_size=5),
    st.dictionaries(prop_text.filter(bool), prop_text, max_size=4))


@st.composite
def record(draw, v6: bool = False, v2: bool = False) -> bytes:
    hosts = st.one_of(v4_hosts, v6_hosts) if v6 else v4_hosts
    tran = draw(st.sampled_from([codec.TRANSACTION_NOT_TYPE, codec.TRANSACTION_PREPARED_TYPE,
                                 codec.TRANSACTION_COMMIT_TYPE, codec.TRANSACTION_ROLLBACK_TYPE]))
    f = dict(queue_id=draw(st.integers(0, 7)), flag=draw(INT32), queue_offset=draw(st.integers(0, 1 << 40)),
             physical_offset=draw(INT64), sys_flag=tran | draw(st.sampled_from([0, 1, 2])),
             born_timestamp=draw(INT64), born_host=draw(hosts), store_timestamp=draw(INT64),
             store_host=draw(hosts), reconsume_times=draw(INT32), prepared_transaction_offset=draw(INT64),
             body=draw(st.binary(max_size=80)), topic=draw(topics), properties=draw(properties))
    if not v2:
        return codec.encode_record(**f)
    born_addr, born_port, born_v6 = codec.parse_host(f["born_host"])
    store_addr, store_port, store_v6 = codec.parse_host(f["store_host"])
    sys_flag = f["sys_flag"] | (0x10 if born_v6 else 0) | (0x20 if store_v6 else 0)
    hs = codec.header_struct(sys_flag)
    tail = codec.encode_tail(f["topic"].encode(), codec.properties_to_string(f["properties"]).encode(), v2=True)
    return hs.pack(hs.size + len(f["body"]) + len(tail), codec.MESSAGE_MAGIC_CODE_V2, codec.body_crc(f["body"]),
                   f["queue_id"], f["flag"], f["queue_offset"], f["physical_offset"], sys_flag, f["born_timestamp"],
                   born_addr, born_port, f["store_timestamp"], store_addr, store_port, f["reconsume_times"],
                   f["prepared_transaction_offset"], len(f["body"])) + f["body"] + tail


@st.composite
def commitlog(draw) -> tuple[bytes, int]:
    """(buffer, limit): records, then a tail (zeros, a blank, a torn record, garbage or nothing), then a
    few mutations."""
    mixed = draw(st.booleans())
    recs = draw(st.lists(record(v6=mixed, v2=mixed and draw(st.booleans())) if mixed else record(),
                         min_size=0, max_size=10))
    buf = bytearray(b"".join(recs))
    tail = draw(st.sampled_from(["zeros", "blank", "torn", "garbage", "none"]))
    if tail == "zeros":
        buf += bytes(draw(st.integers(1, 120)))
    elif tail == "blank":
        n = draw(st.integers(8, 120))
        buf += codec.encode_blank(n) + bytes(n - 8)
    elif tail == "torn":
        more = draw(record())
        buf += more[:draw(st.integers(1, len(more) - 1))]
    elif tail == "garbage":
        buf += draw(st.binary(min_size=1, max_size=60))
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2])) if buf else 0):
        i = draw(st.integers(0, len(buf) - 1))
        if draw(st.booleans()):
            buf[i] = draw(st.integers(0, 255))
        elif i + 4 <= len(buf):
            struct.pack_into(">i", buf, i, draw(INT32))
    return bytes(buf), draw(st.one_of(st.just(len(buf)), st.integers(0, len(buf))))


def scalar_walk(buf, limit, check_crc=False):
    """(message positions and sizes, stop position, outcome, reason) from iter_records; for END_OF_FILE the
    blank's own size in place of the reason (its size field: a mutated blank may end before the limit)."""
    msgs = []
    try:
        for pos, kind, size in scanner.iter_records(buf, 0, limit, check_crc):
            if kind is Outcome.END_OF_FILE:
                return msgs, pos, kind, size
            msgs.append((pos, size))
    except RecordError as e:
        return msgs, e.pos, Outcome.INVALID, e.reason
    stop = msgs[-1][0] + msgs[-1][1] if msgs else 0
    return msgs, stop, Outcome.END_OF_DATA, None


@pytest.fixture
def small_batches():
    """The numpy back-ends on every run of records, however short (they normally start at 64)."""
    saved = scanner._VECTOR_MIN_RECORDS, scanner.WALK_BATCH
    scanner._VECTOR_MIN_RECORDS, scanner.WALK_BATCH = 1, 3
    yield
    scanner._VECTOR_MIN_RECORDS, scanner.WALK_BATCH = saved


# --- the walks ----------------------------------------------------------------------------------------
@SETTINGS
@given(commitlog(), st.booleans())
@example(cl=(codec.encode_blank(8) + b"\0", 9), check_crc=False)    # a blank that ends a byte before the limit
def test_batched_walk_agrees_with_scalar_walk(small_batches, cl, check_crc):
    buf, limit = cl
    msgs, stop, outcome, reason = scalar_walk(buf, limit, check_crc)
    try:
        got = scanner.walk_records(buf, 0, limit, check_crc)
    except RecordError as e:
        got = (e.pos, Outcome.INVALID, e.reason)
    want_size = reason if outcome is Outcome.END_OF_FILE else 0
    assert got == (stop, outcome, reason if outcome is Outcome.INVALID else want_size)


@settings(SETTINGS, max_examples=100)
@given(commitlog(), st.booleans(), st.data())
def test_hinted_walk_agrees_with_scalar_walk(small_batches, cl, check_crc, data):
    """walk_records with a hint (where recovery passes the consume queues' units): a subset of the true
    record positions, possibly with wrong positions mixed in; the answer is the unhinted one."""
    buf, limit = cl
    msgs, stop, outcome, reason = scalar_walk(buf, limit, check_crc)
    true = [p for p, _ in msgs]
    hint = data.draw(st.lists(st.sampled_from(true), unique=True) if true else st.just([]))
    hint += data.draw(st.lists(st.integers(0, max(len(buf) - 1, 0)), max_size=4))
    hint = np.unique(np.array(hint, dtype=np.int64))
    try:
        got = scanner.walk_records(buf, 0, limit, check_crc, hint=hint)
    except RecordError as e:
        got = (e.pos, Outcome.INVALID, e.reason)
    want_size = reason if outcome is Outcome.END_OF_FILE else 0
    assert got == (stop, outcome, reason if outcome is Outcome.INVALID else want_size)


def test_follow_hinted_gives_the_totals_chain_for_any_hint():
    """_follow_hinted against _follow_totals on 5,000 chained records, for hints that are complete, sparse,
    mostly wrong, cut short or empty (a wrong hint costs time, never a different answer)."""
    rng = np.random.default_rng(7)
    recs = [codec.encode_record(queue_id=0, flag=0, queue_offset=i, physical_offset=0, sys_flag=0,
                                born_timestamp=0, born_host="1.2.3.4:5", store_timestamp=0, store_host="1.2.3.4:5",
                                reconsume_times=0, prepared_transaction_offset=0, body=bytes(int(rng.integers(0, 300))),
                                topic="T", properties={}) for i in range(5000)]
    buf = b"".join(recs) + bytes(64)
    limit = len(buf)
    stop = limit - scanner.MIN_RECORD
    want, want_end = scanner._follow_totals(buf, 0, stop, limit, scanner.MIN_RECORD)
    P = np.array(want, dtype=np.int64)
    raw = np.frombuffer(buf, np.uint8)
    junk = rng.integers(0, limit, 3000)
    for hint in (P, P[::2], P[:100], P[-100:], np.unique(np.concatenate((P[::7], junk))), np.unique(junk),
                 np.empty(0, np.int64)):
        got, end = scanner._follow_hinted(buf, raw, 0, stop, limit, scanner.MIN_RECORD, hint)
        assert end == want_end and got.tolist() == want


@SETTINGS
@given(commitlog())
def test_columns_agree_with_scalar_walk(cl):
    """walk_positions + record_columns: the same messages, the same stop and outcome, the same fields."""
    buf, limit = cl
    msgs, stop, outcome, reason = scalar_walk(buf, limit)
    arr = np.frombuffer(buf, dtype=np.uint8)
    positions, pstop, why = scanner.walk_positions(buf, 0, limit)
    recs = scanner.record_columns(arr, 1000, positions, limit)
    bad = np.flatnonzero(~recs.valid)
    if len(bad):
        pstop, why = int(positions[bad[0]]), Outcome.INVALID
        recs = recs.slice(0, int(bad[0]))
    assert [(p, s) for p, s in zip(recs.pos.tolist(), recs.total.tolist())] == msgs
    assert (pstop, why) == (stop, outcome)
    for i, (pos, _) in enumerate(msgs):
        r = codec.decode_fields(buf, pos)
        assert (recs.queue_id[i], recs.queue_offset[i], recs.sys_flag[i], recs.store_ts[i], recs.born_ts[i],
                recs.prepared[i], recs.body_crc[i], recs.flag[i], recs.reconsume[i]) == \
            (r.queue_id, r.queue_offset, r.sys_flag, r.store_timestamp, r.born_timestamp,
             r.prepared_transaction_offset, r.body_crc, r.flag, r.reconsume_times)
        assert buf[recs.body_pos[i]:recs.body_pos[i] + recs.body_len[i]] == r.body
        assert scanner.store_timestamp(buf, pos) == r.store_timestamp
    assert recs.dispatched().tolist() == [bool(scanner.is_dispatched(int(f))) for f in recs.sys_flag]
    assert recs.crc_ok().tolist() == [scanner.scan_record(buf, p, limit, True)[0] is Outcome.MESSAGE
                                      for p, _ in msgs]


# --- the dispatch parse ---------------------------------------------------------------------------------
def _fields(reqs):
    return [(r.topic, r.queue_id, r.commit_log_offset, r.msg_size, r.tags_code, r.store_timestamp,
             r.consume_queue_offset, r.keys, r.uniq_key, r.sys_flag, r.prepared_transaction_offset) for r in reqs]


@SETTINGS
@given(commitlog(), st.booleans())
def test_dispatch_parse_backends_agree(small_batches, cl, at_read_end):
    """The numpy dispatch parse and the scalar one give identical outcomes and columns; both agree with the
    walk on which records are messages and why the parse stops."""
    buf, limit = cl
    data = buf[:limit]
    delay = [1000, 5000]
    batch, pos, outcome, reason = scanner.parse_dispatch(data, 7 << 20, at_read_end, delay)
    reqs = batch if isinstance(batch, list) else batch.requests()
    sreqs, spos, soutcome, sreason = scanner.parse_dispatch_scalar(data, 7 << 20, at_read_end, delay)
    assert (pos, outcome, reason) == (spos, soutcome, sreason)
    assert _fields(reqs) == _fields(sreqs)
    # against the walk: the same messages up to where the parse stops, the same reason when it is INVALID
    msgs, stop, woutcome, wreason = scalar_walk(data, len(data))
    assert [(r.commit_log_offset - (7 << 20), r.msg_size) for r in sreqs] == [m for m in msgs if m[0] < pos]
    if outcome is Outcome.INVALID:
        assert (stop, woutcome, wreason) == (pos, Outcome.INVALID, reason)
    elif outcome is Outcome.END_OF_DATA:
        assert (stop, woutcome) == (pos, Outcome.END_OF_DATA)
    for r in sreqs:
        want = codec.decode_fields(data, r.commit_log_offset - (7 << 20))
        assert (r.topic, r.queue_id, r.consume_queue_offset, r.store_timestamp) == \
            (want.topic, want.queue_id, want.queue_offset, want.store_timestamp)
        assert r.keys == (want.properties.get("KEYS") or None)
        tags = want.properties.get("TAGS")
        if r.topic != codec.SCHEDULE_TOPIC or "DELAY" not in want.properties:
            assert r.tags_code == (codec.java_string_hash(tags) if tags else 0)


def test_dispatch_parse_reads_a_value_holding_the_pair_separator_as_the_decoder_does():
    """A property value with a \\x01 in it (hostile bytes, found by the test above): the dispatch parse takes
    the value up to the next pair, as codec.decode_fields does, and the tags code and keys agree."""
    props = {"KEYS": "", "TAGS": "v\x01", "UNIQ_KEY": "u\x01w"}
    one = codec.encode_record(queue_id=0, flag=0, queue_offset=0, physical_offset=0, sys_flag=0, born_timestamp=1,
                              born_host="1.2.3.4:5", store_timestamp=2, store_host="1.2.3.4:5", reconsume_times=0,
                              prepared_transaction_offset=0, body=b"x", topic="T", properties=props)
    want = codec.decode_fields(one, 0).properties
    assert want == props
    for parse in (scanner.parse_dispatch, scanner.parse_dispatch_scalar):
        batch = parse(one, 0, True, None)[0]
        (r,) = batch if isinstance(batch, list) else batch.requests()
        assert (r.tags_code, r.keys, r.uniq_key) == (codec.java_string_hash("v\x01"), None, "u\x01w")


def test_dispatch_parse_stops_inside_a_record_for_more():
    one = codec.encode_record(queue_id=0, flag=0, queue_offset=0, physical_offset=0, sys_flag=0, born_timestamp=1,
                              born_host="1.2.3.4:5", store_timestamp=2, store_host="1.2.3.4:5", reconsume_times=0,
                              prepared_transaction_offset=0, body=b"x", topic="T", properties={"TAGS": "a"})
    data = one * 3 + one[:20]
    reqs, pos, outcome, reason = scanner.parse_dispatch_scalar(data, 0, False)
    assert (len(reqs), pos, outcome, reason) == (3, 3 * len(one), Outcome.MORE, None)
    _, pos, outcome, reason = scanner.parse_dispatch_scalar(data, 0, True)
    assert outcome is Outcome.INVALID and pos == 3 * len(one) and "total size" in reason


# --- the rules ---------------------------------------------------------------------------------------------
def test_transaction_rules():
    kinds = [codec.TRANSACTION_NOT_TYPE, codec.TRANSACTION_PREPARED_TYPE, codec.TRANSACTION_COMMIT_TYPE,
             codec.TRANSACTION_ROLLBACK_TYPE]
    flags = [k | extra for k in kinds for extra in (0, 0x1, 0x30)]
    assert [bool(scanner.is_dispatched(f)) for f in flags] == [True] * 3 + [False] * 3 + [True] * 3 + [False] * 3
    assert [bool(scanner.is_indexed(f)) for f in flags] == [True] * 9 + [False] * 3
    arr = np.array(flags, dtype=np.int64)
    assert scanner.is_dispatched(arr).tolist() == [bool(scanner.is_dispatched(f)) for f in flags]
    assert scanner.is_indexed(arr).tolist() == [bool(scanner.is_indexed(f)) for f in flags]


@given(record(v6=True))
def test_store_timestamp_v4_and_v6(raw):
    assert scanner.store_timestamp(raw) == codec.decode_fields(raw, 0).store_timestamp


def test_outcome_vocabulary_and_old_names():
    """Outcome carries the old codec names' values; the old names are thin aliases of the scanner's."""
    assert (scanner.Outcome.MESSAGE, scanner.Outcome.END_OF_FILE, scanner.Outcome.END_OF_DATA) == (0, 1, 2)
    assert scanner.Outcome.END_OF_FILE is Outcome.END_OF_FILE and scanner.Outcome.INVALID is Outcome.INVALID
    assert scanner.Outcome.MORE is Outcome.MORE and scanner.Outcome.END_OF_DATA is Outcome.END_OF_DATA
    assert scanner.check_record is scanner.check_record and scanner.walk_records is scanner.walk_records
    assert scanner.is_dispatched is scanner.is_dispatched and scanner.parse_dispatch is scanner.parse_dispatch
    assert scanner.check_record(bytes(16), 0, 16) == (Outcome.END_OF_DATA, 0)
    assert scanner.check_record(codec.encode_blank(16) + bytes(8), 0, 16) == (Outcome.END_OF_FILE, 16)
    assert scanner.scan_record(b"\x00\x00\x00\x10abcdefgh", 0, 12)[::2] == (Outcome.INVALID, "bad magic code "
                                                                             "0x61626364")
    with pytest.raises(RecordError, match="blank record of size 16 does not fit"):
        scanner.check_record(codec.encode_blank(16), 0, 15)


def test_v1_topic_length_over_127_is_invalid_in_every_backend():
    raw = bytearray(codec.encode_record(queue_id=0, flag=0, queue_offset=0, physical_offset=0, sys_flag=0,
                                        born_timestamp=1, born_host="1.2.3.4:5", store_timestamp=2,
                                        store_host="1.2.3.4:5", reconsume_times=0, prepared_transaction_offset=0,
                                        body=b"", topic="T", properties={}))
    # a 200-byte topic under the v1 magic: rewrite the length fields so that the sizes still add up
    body_end = codec.HEADER_V4.size
    raw = raw[:body_end] + bytes([200]) + b"T" * 200 + b"\x00\x00"
    struct.pack_into(">i", raw, 0, len(raw))
    with pytest.raises(RecordError, match="topic length 200 over 127"):
        scanner.check_record(bytes(raw), 0, len(raw))
    assert scanner.parse_dispatch_scalar(bytes(raw), 0, True)[2:] == (Outcome.INVALID, "topic length 200 over 127")
    assert not scanner.record_columns(np.frombuffer(bytes(raw), np.uint8), 0, [0]).valid[0]


@pytest.mark.parametrize("bad", ["a\x00", "\x00", "T/picA", "T\\p", "..", ".", "T\x7f"])
def test_a_record_whose_topic_no_put_could_write_is_invalid_in_every_back_end(small_batches, bad):
    """The TOPIC field is not covered by BODYCRC and consume queue directories are named after it: a topic
    the validation boundary refuses on a put (a NUL, '/', '\\', '.', '..', control characters) is a damaged
    record for every reader (an outside audit: one zeroed topic byte killed MessageStore.open with
    'embedded null byte'; '/' made the dispatcher create consumequeue/T/picA/0). Older files holding such
    topics read as damage now, named with their offset."""
    recs = [codec.encode_record(queue_id=0, flag=0, queue_offset=i, physical_offset=0, sys_flag=0,
                                born_timestamp=1, born_host="1.2.3.4:5", store_timestamp=2, store_host="1.2.3.4:5",
                                reconsume_times=0, prepared_transaction_offset=0, body=b"x", topic=t, properties={})
            for i, t in enumerate(["a", "b", bad, "c"])]
    data = b"".join(recs)
    at = len(recs[0]) + len(recs[1])
    for parse in (scanner.parse_dispatch, scanner.parse_dispatch_scalar):
        batch, pos, outcome, reason = parse(data, 0, True)
        assert (pos, outcome) == (at, Outcome.INVALID) and "damaged TOPIC field" in reason
        assert len(batch) == 2
    with pytest.raises(RecordError, match="damaged TOPIC field"):
        scanner.check_record(data, at, len(data))
    with pytest.raises(RecordError, match="damaged TOPIC field"):
        scanner.walk_records(data, 0, len(data))
    cols = scanner.record_columns(np.frombuffer(data, np.uint8), 0, [0, len(recs[0]), at, at + len(recs[2])])
    assert cols.valid.tolist() == [True, True, False, True]


@pytest.mark.parametrize("qid", [-1, 65536, 1 << 24])
def test_a_record_whose_queue_id_no_put_could_write_is_invalid_in_every_back_end(small_batches, qid):
    """The QUEUEID field is not covered by BODYCRC either, and names a consume queue directory: a queue id
    outside 0..65535 (a damaged byte) is a damaged record for every reader."""
    recs = [codec.encode_record(queue_id=q, flag=0, queue_offset=0, physical_offset=0, sys_flag=0,
                                born_timestamp=1, born_host="1.2.3.4:5", store_timestamp=2, store_host="1.2.3.4:5",
                                reconsume_times=0, prepared_transaction_offset=0, body=b"x", topic="T", properties={})
            for q in (0, 1)]
    bad = bytearray(recs[1])
    struct.pack_into(">i", bad, codec.POS_QUEUEID, qid)
    data = recs[0] + bytes(bad) + recs[0]
    at = len(recs[0])
    for parse in (scanner.parse_dispatch, scanner.parse_dispatch_scalar):
        batch, pos, outcome, reason = parse(data, 0, True)
        assert (pos, outcome) == (at, Outcome.INVALID) and "damaged QUEUEID field" in reason
    with pytest.raises(RecordError, match="damaged QUEUEID field"):
        scanner.walk_records(data, 0, len(data))
    cols = scanner.record_columns(np.frombuffer(data, np.uint8), 0, [0, at, 2 * at])
    assert cols.valid.tolist() == [True, False, True]
