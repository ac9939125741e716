"""The commitlog put path: byte compatibility with RocketMQ 4.4.0, batch == one-by-one, thread safety."""
from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import golden_store, read_jsonl

from rmqstore.store.format import codec
from rmqstore.store.format import scanner
from rmqstore.store.commitlog.commit_log import CommitLog
from rmqstore.store.format.message_batch import MessageBatch
from rmqstore.store.conf.config import StoreConfig
from rmqstore.store.format.message import Message, PutMessageStatus

SETS = ["rmq440-clean", "rmq440-crash"]


# --- golden data: the answers and the bytes of RocketMQ 4.4.0 -----------------------------------------
_cache: dict = {}


def _golden_set(golden: Path, name: str):
    if name not in _cache:
        d = golden / name
        msgs = [Message.from_json(x) for x in read_jsonl(d / "messages.jsonl")]
        puts = [{k: x[k] for k in ("status", "msgId", "wroteOffset", "logicsOffset")}
                for x in read_jsonl(d / "puts.jsonl")]
        _cache[name] = (msgs, puts, StoreConfig.load(d / "store.conf"), golden_store(golden, name) / "commitlog")
    return _cache[name]


def _answer(r) -> dict:
    j = r.to_json()
    return {k: j[k] for k in ("status", "msgId", "wroteOffset", "logicsOffset")}


def _check_against_golden(results, puts, golden_dir: Path, tmp_path: Path, compare_tools: Path) -> None:
    assert len(results) == len(puts)
    for i, (r, p) in enumerate(zip(results, puts)):
        assert _answer(r) == p, f"put #{i}"
    ours = sorted(os.listdir(tmp_path / "commitlog"))
    theirs = sorted(os.listdir(golden_dir))
    # RocketMQ pre-allocates the next file (AllocateMappedFileService): the crash set has one more, empty
    assert ours == theirs[:len(ours)]
    for extra in theirs[len(ours):]:
        assert not any((golden_dir / extra).read_bytes()), f"golden {extra} is not empty"
    expected = golden_dir
    if len(theirs) > len(ours):
        expected = tmp_path / "expected-commitlog"
        expected.mkdir()
        for n in ours:
            os.symlink(golden_dir / n, expected / n)
    proc = subprocess.run([sys.executable, str(compare_tools / "compare_commitlog.py"), str(expected),
                           str(tmp_path / "commitlog")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(puts)} message records equal" in proc.stdout


@pytest.mark.parametrize("name", SETS)
def test_golden_one_at_a_time(golden, compare_tools, tmp_path, name):
    msgs, puts, cfg, golden_dir = _golden_set(golden, name)
    cl = CommitLog(tmp_path, cfg)
    cl.load()
    try:
        results = [cl.put_message(m) for m in msgs]
    finally:
        cl.shutdown()
    _check_against_golden(results, puts, golden_dir, tmp_path, compare_tools)


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_golden_batches(golden, compare_tools, tmp_path, name, seed):
    msgs, puts, cfg, golden_dir = _golden_set(golden, name)
    rng = random.Random(seed)
    cl = CommitLog(tmp_path, cfg)
    cl.load()
    results = []
    crossed = 0
    i = 0
    try:
        while i < len(msgs):
            # mostly small batches, now and then one spanning whole files
            n = rng.choice((1, 2, rng.randint(3, 40), rng.randint(40, 400), rng.randint(400, 3000)))
            before = len(cl.queue.files)
            results.extend(cl.put_messages(msgs[i:i + n]))
            crossed += len(cl.queue.files) > before > 0
            i += n
    finally:
        cl.shutdown()
    assert crossed > 0, "no batch crossed a file boundary"
    _check_against_golden(results, puts, golden_dir, tmp_path, compare_tools)


# --- batch == one by one ----------------------------------------------------------------------------
def _records_masked(commitlog_dir: Path) -> dict[str, bytes]:
    """Every file of a commitlog, with each message's STORETIMESTAMP zeroed."""
    out = {}
    if not commitlog_dir.exists():
        return out
    for p in sorted(commitlog_dir.iterdir()):
        buf = bytearray(p.read_bytes())
        for pos, kind, size in scanner.iter_records(buf, 0, len(buf)):
            if kind == scanner.Outcome.MESSAGE:
                sys_flag = struct.unpack_from(">i", buf, pos + codec.POS_SYSFLAG)[0]
                ts = pos + codec.store_timestamp_pos(sys_flag)
                buf[ts:ts + 8] = bytes(8)
        out[p.name] = bytes(buf)
    return out


def _result_tuple(r):
    a = r.append_result
    if a is None:
        return (r.status,)
    return (r.status, a.status, a.wrote_offset, a.wrote_bytes, a.msg_id, a.logics_offset, a.msg_num)


_hosts = st.sampled_from(["10.1.2.3:40170", "192.168.7.9:10911", "127.0.0.1:0", "[::1]:9876",
                          "[fe80::1:2]:10911", "255.255.255.255:2147483647"])
_topics = st.sampled_from(["TopicA", "TopicB", "\u8ba2\u5355Topic", "%RETRY%groupX", "T" * 127])
_prop_names = st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "u3", "\u952e", "WAIT"])
_prop_values = st.text(alphabet=st.sampled_from("abcXYZ012 -_\u952e\u6807"), max_size=12)


@st.composite
def _messages(draw):
    kind = draw(st.integers(0, 19))
    topic = draw(_topics)
    props = draw(st.dictionaries(_prop_names, _prop_values, max_size=4))
    born_host = draw(_hosts)
    store_host = draw(st.one_of(st.none(), _hosts))
    body = draw(st.binary(max_size=300))
    if kind == 0:      # illegal: topic too long
        topic = "X" * 128
    elif kind == 1:    # illegal: empty topic
        topic = ""
    elif kind == 2:    # illegal host
        born_host = "nohost"
    elif kind == 3:    # properties too long
        props = {"big": "v" * 32767}
    elif kind == 4:    # bigger than maxMessageSize (below)
        body = bytes(3000)
    elif kind == 5:    # no body at all
        body = None
    return Message(topic=topic, body=body, queue_id=draw(st.integers(0, 3)),
                   flag=draw(st.integers(-(1 << 31), (1 << 31) - 1)),
                   sys_flag=draw(st.sampled_from([0, 0, 0, 1, 2, 4, 8, 12, 0x10, 0x30])),
                   born_timestamp=draw(st.integers(0, (1 << 63) - 1)), born_host=born_host, store_host=store_host,
                   reconsume_times=draw(st.integers(0, 16)),
                   prepared_transaction_offset=draw(st.integers(0, 1 << 40)), properties=props)


def _small_config() -> StoreConfig:
    return StoreConfig.from_dict({"mappedFileSizeCommitLog": 4096, "maxMessageSize": 2048})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(batches=st.lists(st.lists(_messages(), min_size=0, max_size=30), min_size=1, max_size=6))
def test_batch_equals_one_by_one(batches, tmp_path_factory):
    cfg = _small_config()
    da, db = tmp_path_factory.mktemp("batch"), tmp_path_factory.mktemp("single")
    a, b = CommitLog(da, cfg), CommitLog(db, cfg)
    a.load()
    b.load()
    try:
        ra = [r for batch in batches for r in a.put_messages(batch)]
        rb = [b.put_message(m) for batch in batches for m in batch]
        assert [_result_tuple(r) for r in ra] == [_result_tuple(r) for r in rb]
        assert a.topic_queue_table == b.topic_queue_table
        assert a.get_max_offset() == b.get_max_offset()
    finally:
        a.shutdown()
        b.shutdown()
    assert _records_masked(da / "commitlog") == _records_masked(db / "commitlog")
    # what was written reads back as what was put
    a = CommitLog(da, cfg)
    a.load()
    try:
        msgs = [m for batch in batches for m in batch]
        for m, r in zip(msgs, ra):
            if not r.ok:
                continue
            ext = a.look_message_by_offset(r.append_result.wrote_offset, r.append_result.wrote_bytes)
            assert ext is not None
            assert (ext.topic, ext.queue_id, ext.body, ext.properties, ext.flag, ext.born_timestamp) == \
                (m.topic, m.queue_id, m.body or b"", m.properties or {}, m.flag, m.born_timestamp)
            assert ext.msg_id == r.append_result.msg_id
            assert ext.queue_offset == r.append_result.logics_offset
            assert ext.store_timestamp == r.append_result.store_timestamp
    finally:
        a.shutdown()


# Batches as a producer sends them (one topic, the same hosts): the columnar path, with every kind of
# variation it must handle or hand over to the general path.
_text = st.text(alphabet=st.sampled_from("abcXYZ019 -_\u952e\u6807\x00"), max_size=10)


@st.composite
def _producer_batch(draw):
    n = draw(st.integers(16, 120))
    topic = draw(st.sampled_from(["TopicA", "\u8ba2\u5355Topic", "T" * 127]))
    born_host = draw(st.sampled_from(["10.1.2.3:40170", "127.0.0.1:0"]))
    store_host = draw(st.sampled_from([None, "192.168.7.9:10911"]))

    def column(const, varied):
        return [const] * n if draw(st.booleans()) else draw(st.lists(varied, min_size=n, max_size=n))

    queue_ids = column(draw(st.integers(0, 7)), st.one_of(st.integers(0, 5), st.integers(0, 99)))
    sys_flags = column(draw(st.sampled_from([0, 4, 8, 12])), st.sampled_from([0, 0, 1, 2, 4, 8, 12, 0x30]))
    flags = column(draw(st.integers(-(1 << 31), (1 << 31) - 1)), st.integers(-(1 << 31), (1 << 31) - 1))
    born_ts = column(draw(st.integers(0, 1 << 45)), st.integers(0, (1 << 63) - 1))
    reconsume = column(0, st.integers(0, 16))
    prepared = column(0, st.integers(0, 1 << 40))
    body_kind = draw(st.sampled_from(["fixed", "fixed", "varied", "none"]))
    blen = draw(st.integers(0, 120))
    bodies = [None if body_kind == "none" and draw(st.booleans()) else
              draw(st.binary(min_size=blen, max_size=blen) if body_kind == "fixed" else st.binary(max_size=150))
              for _ in range(n)]
    props_kind = draw(st.sampled_from(["template", "template_fixed", "mixed", "empty"]))
    names = draw(st.lists(st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "u3", "\u952e"]), unique=True,
                          min_size=1, max_size=4))
    props = []
    for i in range(n):
        if props_kind == "template":
            props.append({k: draw(_text) for k in names})
        elif props_kind == "template_fixed":
            props.append({k: f"{k}{i:06d}" for k in names})
        elif props_kind == "mixed":
            props.append(draw(st.dictionaries(st.sampled_from(names), _text, max_size=3)))
        else:
            props.append(draw(st.sampled_from([{}, None])))
    msgs = [Message(topic=topic, body=bodies[i], queue_id=queue_ids[i], flag=flags[i], sys_flag=sys_flags[i],
                    born_timestamp=born_ts[i], born_host=born_host, store_host=store_host,
                    reconsume_times=reconsume[i], prepared_transaction_offset=prepared[i], properties=props[i])
            for i in range(n)]
    spoil = draw(st.sampled_from([None] * 6 + ["props", "size", "topic", "host", "queue_id", "none"]))
    j = draw(st.integers(0, n - 1))
    if spoil == "props":
        msgs[j].properties = {"big": "v" * 32767}
    elif spoil == "size":
        msgs[j].body = bytes(3000)
    elif spoil == "topic":
        msgs[j].topic = "Other"
    elif spoil == "host":
        msgs[j].born_host = "[::1]:1"
    elif spoil == "queue_id":
        msgs[j].queue_id = 1 << 40          # does not fit QUEUEID: refused
    elif spoil == "none":
        msgs[j] = None                      # not a message: refused
    return msgs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batches=st.lists(_producer_batch(), min_size=1, max_size=3))
def test_columnar_batch_equals_one_by_one(batches, tmp_path_factory):
    test_batch_equals_one_by_one.hypothesis.inner_test(batches, tmp_path_factory)


def test_columnar_path_is_taken(tmp_path, monkeypatch):
    from rmqstore.tools import bench
    calls = []
    real = CommitLog._put_columnar
    monkeypatch.setattr(CommitLog, "_put_columnar", lambda self, b: calls.append(b.n) or real(self, b))
    msgs = bench.generate_messages(5000, 100, 4)
    cfg = StoreConfig.from_dict({"mappedFileSizeCommitLog": 64 * 1024})
    a, b = CommitLog(tmp_path / "a", cfg), CommitLog(tmp_path / "b", cfg)
    a.load()
    b.load()
    ra = [r for i in range(0, 5000, 1000) for r in a.put_messages(msgs[i:i + 1000])]
    rb = [b.put_message(m) for m in msgs]
    assert calls == [1000] * 5
    assert [_result_tuple(r) for r in ra] == [_result_tuple(r) for r in rb]
    for m, r in zip(msgs, ra):     # and each record is what codec's reference encoder makes of it
        x = r.append_result
        assert a.get_message(x.wrote_offset, x.wrote_bytes) == codec.encode_record(
            queue_id=m.queue_id, flag=m.flag, queue_offset=x.logics_offset, physical_offset=x.wrote_offset,
            sys_flag=m.sys_flag, born_timestamp=m.born_timestamp, born_host=m.born_host,
            store_timestamp=x.store_timestamp, store_host=cfg.store_host, reconsume_times=m.reconsume_times,
            prepared_transaction_offset=m.prepared_transaction_offset, body=m.body, topic=m.topic,
            properties=m.properties)
    a.shutdown()
    b.shutdown()
    assert _records_masked(tmp_path / "a" / "commitlog") == _records_masked(tmp_path / "b" / "commitlog")


@st.composite
def _message_batches(draw):
    n = draw(st.integers(0, 60))
    names = draw(st.lists(_prop_names, unique=True, max_size=3))
    props = {k: draw(st.one_of(_prop_values, st.lists(_prop_values, min_size=n, max_size=n))) for k in names}
    sizes = draw(st.sampled_from(["same", "mixed", "one too big"]))
    if sizes == "same":
        bodies = [bytes([i % 256]) * 40 for i in range(n)]
    else:
        bodies = [draw(st.binary(max_size=300)) for _ in range(n)]
        if sizes == "one too big" and n:
            bodies[draw(st.integers(0, n - 1))] = bytes(3000)
    qids = draw(st.one_of(st.integers(0, 3), st.lists(st.integers(0, 70), min_size=n, max_size=n)))
    born = draw(st.one_of(st.integers(0, 1 << 45), st.lists(st.integers(0, 1 << 45), min_size=n, max_size=n)))
    return MessageBatch(draw(_topics), bodies, queue_ids=qids, properties=props, born_timestamp=born,
                        flag=draw(st.integers(-5, 5)), sys_flag=draw(st.sampled_from([0, 0, 4, 8, 12])),
                        born_host=draw(_hosts), store_host=draw(st.one_of(st.none(), _hosts)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(batches=st.lists(_message_batches(), min_size=1, max_size=4))
def test_message_batch_equals_its_messages_one_by_one(batches, tmp_path_factory):
    """A MessageBatch (columns) writes the records and answers the results that its messages put one at
    a time do: the columnar path for plain batches, the general path for IPv6 hosts or a refused message."""
    cfg = _small_config()
    da, db = tmp_path_factory.mktemp("mb"), tmp_path_factory.mktemp("single")
    a, b = CommitLog(da, cfg), CommitLog(db, cfg)
    a.load()
    b.load()
    try:
        ra, rb = [], []
        for mb in batches:
            ra.extend(a.put_messages(mb))
            rb.extend(b.put_message(m) for m in mb.to_messages())
        assert [_result_tuple(r) for r in ra] == [_result_tuple(r) for r in rb]
    finally:
        a.shutdown()
        b.shutdown()
    assert _records_masked(da / "commitlog") == _records_masked(db / "commitlog")


def test_message_batch_checks_its_columns():
    with pytest.raises(ValueError, match="property 'KEYS' has 1 values for 2 bodies"):
        MessageBatch("T", [b"a", b"b"], keys=["k"])
    with pytest.raises(ValueError, match="queue_ids has 3 values for 2 bodies"):
        MessageBatch("T", [b"a", b"b"], queue_ids=[0, 1, 2])
    with pytest.raises(TypeError, match="property 'TAGS' must be a str or a sequence of str, not int"):
        MessageBatch("T", [b"a"], tags=5)
    mb = MessageBatch("T", [b"a", b"b"], queue_ids=[2, 3], tags="x", keys=["k1", "k2 k3"], properties={"u": "v"})
    ms = mb.to_messages()
    assert [(m.queue_id, m.tags, m.keys, m.properties["u"]) for m in ms] == \
        [(2, "x", ["k1"], "v"), (3, "x", ["k2", "k3"], "v")]
    assert ms[0].born_timestamp == mb.born_timestamp > 0


def test_columnar_results_are_a_lazy_sequence(tmp_path):
    """The columnar path answers a PutMessageResults: each way of reading it says what the per-message
    results say, and a failed sync flush turns every appended message into FLUSH_DISK_TIMEOUT."""
    from rmqstore.tools import bench
    from rmqstore.store.format.message import PutMessageResults
    cl = CommitLog(tmp_path, StoreConfig.from_dict({"mappedFileSizeCommitLog": 64 * 1024}))
    cl.load()
    try:
        msgs = bench.generate_messages(600, 100, 3)
        rs = cl.put_messages(msgs[:300])
        assert type(rs) is PutMessageResults and len(rs) == 300 and rs.all_ok and rs.status is PutMessageStatus.PUT_OK
        one = [rs[i] for i in range(300)]           # built one at a time, before the whole list exists
        assert rs[-1] == one[-1] and rs[10:12] == one[10:12] and list(rs) == one and rs == one
        assert rs.msg_ids == [r.append_result.msg_id for r in one]
        assert rs.msg_ids[7] == codec.create_message_id(*codec.parse_host(cl.default_store_host)[:2],
                                                        one[7].append_result.wrote_offset)
        assert rs.wrote_offsets == [r.append_result.wrote_offset for r in one]
        assert rs.queue_offsets == [i // 3 for i in range(300)]
        assert rs.wrote_bytes == sum(r.append_result.wrote_bytes for r in one) and rs.ok_count == 300
        with pytest.raises(IndexError):
            rs[300]
        cl.on_appended = lambda offset: False
        late = cl.put_messages(msgs[300:])
        assert type(late) is PutMessageResults and late.appended == 300 and late.ok_count == 0
        assert late.status is PutMessageStatus.FLUSH_DISK_TIMEOUT and not late.all_ok
        assert {r.status for r in late} == {PutMessageStatus.FLUSH_DISK_TIMEOUT}
        assert late[0].append_result.logics_offset == 100     # appended all the same: the offsets went on
    finally:
        cl.shutdown()


def test_result_fields(tmp_path):
    cl = CommitLog(tmp_path, _small_config())
    cl.load()
    try:
        m = Message(topic="T", body=b"abc", queue_id=1, properties={"TAGS": "x"}, sys_flag=codec.TRANSACTION_PREPARED_TYPE)
        r = cl.put_message(m)
        assert r.ok and r.append_result.logics_offset == 0 and r.append_result.wrote_offset == 0
        r2 = cl.put_message(Message(topic="T", body=b"abc", queue_id=1))
        assert r2.append_result.logics_offset == 0      # prepared messages take no queue offset
        assert r2.append_result.wrote_offset == r.append_result.wrote_bytes
        assert cl.put_message(Message(topic="T", queue_id=1)).append_result.logics_offset == 1
        assert [x.status for x in cl.put_messages([Message(topic=""), Message(topic="T", born_host="bad")])] == \
            [PutMessageStatus.MESSAGE_ILLEGAL, PutMessageStatus.MESSAGE_ILLEGAL]
        assert cl.put_messages([]) == []
    finally:
        cl.shutdown()


def test_on_appended_hook(tmp_path):
    cl = CommitLog(tmp_path, _small_config())
    cl.load()
    seen = []

    def hook(offset):
        seen.append((offset, cl.put_lock.locked()))
        return len(seen) != 2

    cl.on_appended = hook
    try:
        r1 = cl.put_message(Message(topic="T", body=b"x" * 10))
        rs = cl.put_messages([Message(topic="T", body=b"y"), Message(topic=""), Message(topic="T")])
        r3 = cl.put_messages([Message(topic="")])       # nothing appended: the hook is not called
        assert r1.status is PutMessageStatus.PUT_OK
        assert [r.status for r in rs] == [PutMessageStatus.FLUSH_DISK_TIMEOUT, PutMessageStatus.MESSAGE_ILLEGAL,
                                          PutMessageStatus.FLUSH_DISK_TIMEOUT]
        assert rs[0].append_result is not None and rs[2].append_result.logics_offset == 2
        assert r3[0].status is PutMessageStatus.MESSAGE_ILLEGAL
        assert seen == [(r1.append_result.wrote_bytes, False), (cl.get_max_offset(), False)]
    finally:
        cl.shutdown()


# --- threads -----------------------------------------------------------------------------------------
def test_concurrent_producers(tmp_path, monkeypatch):
    cfg = StoreConfig.from_dict({"mappedFileSizeCommitLog": 64 * 1024})
    cl = CommitLog(tmp_path, cfg)
    cl.load()
    columnar = [0]
    real = CommitLog._put_columnar

    def counting(self, b):
        columnar[0] += 1
        return real(self, b)
    monkeypatch.setattr(CommitLog, "_put_columnar", counting)
    n_threads, per_thread = 6, 3000
    out: dict[int, list] = {}

    def producer(t: int):
        rng = random.Random(t)
        res = []
        i = 0
        while i < per_thread:
            n = rng.choice((1, 1, 1, rng.randint(2, 15), rng.randint(16, 200)))
            n = min(n, per_thread - i)
            if n >= 16 and rng.random() < 0.8:      # one topic: the columnar path
                topic, blen = f"T{rng.randint(0, 1)}", rng.choice((None, 0, 10, 100))
                batch = [Message(topic=topic, queue_id=rng.randint(0, 2),
                                 body=bytes(blen if blen is not None else rng.randint(0, 200)),
                                 sys_flag=rng.choice((0, 0, 0, 4, 8, 12)),
                                 properties={"KEYS": f"{t}-{i + j}"}) for j in range(n)]
            else:
                batch = [Message(topic=f"T{(i + j) % 2}", queue_id=(i + j) % 3, body=bytes(rng.randint(0, 200)),
                                 properties={"KEYS": f"{t}-{i + j}"}) for j in range(n)]
            if len(batch) == 1 and rng.random() < 0.5:
                res.append((batch[0], cl.put_message(batch[0])))
            else:
                res.extend(zip(batch, cl.put_messages(batch)))
            i += len(batch)
        out[t] = res

    threads = [threading.Thread(target=producer, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    try:
        allr = [(m, r) for t in range(n_threads) for m, r in out[t]]
        assert len(allr) == n_threads * per_thread and all(r.ok for _, r in allr)
        # contiguous, distinct physical offsets (a file's unused tail only where the next record starts a file)
        spans = sorted((r.append_result.wrote_offset, r.append_result.wrote_bytes) for _, r in allr)
        fs = cfg.mapped_file_size_commit_log
        for (o1, s1), (o2, _) in zip(spans, spans[1:]):
            assert o2 == o1 + s1 or o2 == (o1 // fs + 1) * fs, (o1, s1, o2)
        assert spans[-1][0] + spans[-1][1] == cl.get_max_offset()
        # gap-free queue offsets per queue, in each producer's order
        per_queue: dict[tuple, list[int]] = {}
        for m, r in allr:
            if m.sys_flag & 4:          # prepared and rolled back: no queue offset
                assert r.append_result.logics_offset == 0
                continue
            per_queue.setdefault((m.topic, m.queue_id), []).append(r.append_result.logics_offset)
        for key, offs in per_queue.items():
            assert sorted(offs) == list(range(len(offs))), key
        assert cl.topic_queue_table == {f"{t}-{q}": len(offs) for (t, q), offs in per_queue.items()}
        assert columnar[0] > 20
        for t in range(n_threads):
            last: dict = {}
            for m, r in out[t]:
                if m.sys_flag & 4:
                    continue
                k = (m.topic, m.queue_id)
                assert r.append_result.logics_offset > last.get(k, -1)
                last[k] = r.append_result.logics_offset
        # and every record reads back as the message its result names
        for m, r in allr[::37]:
            ext = cl.look_message_by_offset(r.append_result.wrote_offset)
            assert ext.properties == m.properties and ext.queue_offset == r.append_result.logics_offset
    finally:
        cl.shutdown()


# --- bench -------------------------------------------------------------------------------------------
def test_bench_runs(tmp_path, capsys):
    import argparse

    from rmqstore.tools import bench
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    res = bench.run(p.parse_args(["--messages", "3000", "--batch", "100", "--store", str(tmp_path / "s"),
                                  "--workload", "put,put_batch,put_columns,e2e"]))
    printed = json.loads(capsys.readouterr().out)
    assert printed == res
    for w in ("put", "put_batch", "put_columns", "e2e"):
        assert res["workloads"][w]["ok"] == 3000 and res["workloads"][w]["msgs_per_s"] > 0
    assert res["workloads"]["put"]["bytes"] == res["workloads"]["put_batch"]["bytes"] \
        == res["workloads"]["put_columns"]["bytes"] == res["workloads"]["e2e"]["bytes"]
    e2e = res["workloads"]["e2e"]
    assert e2e["all_dispatched"] and e2e["dispatched_from_put_columns"] + e2e["dispatched_parsed"] == 3000
    assert e2e["lag_samples"] >= 1 and e2e["lag_max_bytes"] >= 0
    assert res["machine"]["cores"] >= 1


def test_message_batch_takes_the_columnar_path(tmp_path, monkeypatch):
    calls = []
    real = CommitLog._put_columnar
    monkeypatch.setattr(CommitLog, "_put_columnar", lambda self, b: calls.append(b.n) or real(self, b))
    cl = CommitLog(tmp_path, StoreConfig.from_dict({"mappedFileSizeCommitLog": 64 * 1024}))
    cl.load()
    try:
        keys = [f"k{i}" for i in range(500)]
        rs = cl.put_messages(MessageBatch("T", [b"x" * (i % 7) for i in range(500)], queue_ids=[i % 4 for i in range(500)],
                                          tags="t", keys=keys))
        assert calls == [500] and rs.all_ok and rs.queue_offsets == [i // 4 for i in range(500)]
        got = [cl.look_message_by_offset(o) for o in rs.wrote_offsets[::97]]
        assert [(m.keys, m.tags, m.body) for m in got] == [([f"k{i}"], "t", b"x" * (i % 7)) for i in range(0, 500, 97)]
        ipv6 = cl.put_messages(MessageBatch("T", [b"y"] * 20, born_host="[::1]:5"))   # another header layout
        assert calls == [500] and all(r.ok for r in ipv6)
        import numpy as np
        np_cols = cl.put_messages(MessageBatch("T", [b"z"] * 40, queue_ids=np.arange(40, dtype=np.int32) % 4,
                                               born_timestamp=np.int64(1234)))       # numpy columns
        assert calls == [500, 40] and np_cols.queue_offsets == [(145 if i % 4 == 0 else 125) + i // 4 for i in range(40)]
        assert cl.look_message_by_offset(np_cols.wrote_offsets[-1]).born_timestamp == 1234
    finally:
        cl.shutdown()


def test_bench_sync_flush_goes_through_group_commit(tmp_path, capsys):
    """`rmqstore bench --flush sync` answers each put after the GroupCommitService's msync covers it; with
    several producer threads some msyncs serve more than one put."""
    import argparse

    from rmqstore.tools import bench
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    res = bench.run(p.parse_args(["--messages", "400", "--threads", "8", "--flush", "sync", "--workload", "put",
                                  "--store", str(tmp_path / "s")]))
    put = res["workloads"]["put"]
    assert put["ok"] == 400 and put["threads"] == 8
    assert 0 < put["flushes"] < 400
