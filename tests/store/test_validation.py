"""One validation boundary (issue 15, defects 1, 4 and 5): every way in refuses what can break the store or
escape its directory, says why, and accepts everything RocketMQ's own store accepts."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pyarrow as pa
import pytest

from conftest import run_cli
from rmqstore.store.conf.config import StoreConfig
from rmqstore.store.format.message import GetMessageStatus, Message, PutMessageStatus
from rmqstore.store.format.message_batch import COLUMNAR_MIN, MessageBatch
from rmqstore.messaging.producer import Producer
from rmqstore.store.store import MessageStore
from store_checks import small_config, walk_commitlog

try:
    from rmqstore.store.format import validation
    MAX_QUEUE_ID, Invalid = validation.MAX_QUEUE_ID, validation.InvalidMessageError
except ImportError:     # the code before issue 15 (PYTHONPATH=/tmp/base/src): the tests fail on their asserts
    validation, MAX_QUEUE_ID, Invalid = None, 65535, ValueError

ILLEGAL = PutMessageStatus.MESSAGE_ILLEGAL
OK = PutMessageStatus.PUT_OK
SYSTEM_TOPICS = ["%RETRY%group", "%DLQ%group", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC",
                 "RMQ_SYS_TRANS_OP_HALF_TOPIC", "rmq_sys_trace", "订单Topic", "T" * 127, "a.b", "a..b", "..a"]


def _files(root: Path) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs + _}


def _readable_everything(path: Path, config=None) -> int:
    """Reopen the store: it opens, and every message record is read back through its consume queue."""
    with MessageStore.open(path, config or small_config()) as store:
        recs = walk_commitlog(store)
        for r in recs:
            got = store.get_message("g", r.topic, r.queue_id, r.queue_offset, 1)
            assert got.status is GetMessageStatus.FOUND, (r, got.status)
            assert got.messages[0].commit_log_offset == r.offset
        return len(recs)


# --- defect 1: a NUL in a topic ----------------------------------------------------------------------------
def test_nul_in_topic_is_refused_and_the_store_goes_on(tmp_path, caplog):
    path = tmp_path / "s"
    with MessageStore.open(path, small_config()) as store:
        with caplog.at_level(logging.WARNING):
            r = store.put_message(Message("a\x00b", b"x"))
        assert r.status is ILLEGAL and "topic" in r.reason and "\\x00" in r.reason
        assert "\\x00" in caplog.text
        r2 = store.put_message(Message("TopicB", b"after", queue_id=1))
        assert r2.status is OK
        assert store.wait_dispatched(10)
        got = store.get_message("g", "TopicB", 1, 0, 8)
        assert got.status is GetMessageStatus.FOUND and got.messages[0].body == b"after"
    assert _readable_everything(path) == 1
    conf = tmp_path / "store.conf"
    conf.write_text("mappedFileSizeCommitLog=65536\nmappedFileSizeConsumeQueue=600\nmaxHashSlotNum=64\n"
                    "maxIndexNum=256\n")
    dump = run_cli("dump", "-c", conf, path)
    assert dump.returncode == 0, dump.stderr.decode()[-500:]


@pytest.mark.parametrize("topic", ["a\x00b", "a\nb", "tab\there", "del\x7f", "", ".", "..", "a/b", "a\\b",
                                   "T" * 128, "订" * 43])
def test_topics_the_store_refuses(tmp_path, topic):
    with MessageStore.open(tmp_path / "s", small_config()) as store:
        r = store.put_message(Message(topic, b"x"))
        assert r.status is ILLEGAL and r.reason and "topic" in r.reason
        rs = store.put_messages([Message(topic, b"x")] * (COLUMNAR_MIN + 1))
        assert all(x.status is ILLEGAL and "topic" in x.reason for x in rs)
        rs = store.put_messages(MessageBatch(topic, [b"x"] * (COLUMNAR_MIN + 1)))
        assert all(x.status is ILLEGAL and "topic" in x.reason for x in rs)
        assert store.get_max_phy_offset() == 0


def test_system_and_unicode_topics_still_work(tmp_path):
    path = tmp_path / "s"
    with MessageStore.open(path, small_config()) as store:
        for t in SYSTEM_TOPICS:
            assert store.put_message(Message(t, b"one", queue_id=2)).status is OK, t
            assert store.put_messages(MessageBatch(t, [b"b"] * COLUMNAR_MIN, queue_ids=3)).all_ok, t
        store.wait_dispatched(10)
        for t in SYSTEM_TOPICS:
            assert store.get_message("g", t, 3, 0, 64).message_count == COLUMNAR_MIN, t
    assert _readable_everything(path) == len(SYSTEM_TOPICS) * (1 + COLUMNAR_MIN)


# --- defect 4: topics and queue ids as paths ------------------------------------------------------------------
def _bad_targets(tmp_path: Path) -> list[tuple[str, int]]:
    return [("../../X", 0), (str(tmp_path / "abs"), 0), ("a/b", 0), ("..", 0), (".", 0), ("T", -1),
            ("T", MAX_QUEUE_ID + 1)]


def _puts(store: MessageStore, topic: str, qid: int) -> list:
    small, big = 3, COLUMNAR_MIN + 4
    out = [store.put_message(Message(topic, b"x", queue_id=qid))]
    out += store.put_messages([Message(topic, b"x", queue_id=qid) for _ in range(small)])
    out += store.put_messages([Message(topic, b"x", queue_id=qid) for _ in range(big)])
    out += store.put_messages(MessageBatch(topic, [b"x"] * small, queue_ids=qid))
    out += store.put_messages(MessageBatch(topic, [b"x"] * big, queue_ids=[qid] * big))
    return out


def test_no_topic_or_queue_id_escapes_the_store(tmp_path):
    box = tmp_path / "box"
    path = box / "a" / "store"
    path.mkdir(parents=True)
    before = _files(tmp_path)
    with MessageStore.open(path, small_config()) as store:
        assert store.put_message(Message("Good", b"g")).status is OK
        for topic, qid in _bad_targets(tmp_path):
            for r in _puts(store, topic, qid):
                assert r.status is ILLEGAL, (topic, qid, r)
                assert r.reason and ("topic" in r.reason or "queue id" in r.reason), r.reason
        assert store.wait_dispatched(10)
    outside = {f for f in _files(tmp_path) - before if not f.startswith(os.path.join("box", "a", "store"))}
    assert not outside, f"files outside the store: {sorted(outside)}"
    assert not any(p.name in ("X", "abs", "b", "-1") for p in path.rglob("*")), sorted(path.rglob("*"))
    assert _readable_everything(path) == 1


def test_a_schedule_queue_that_is_no_delay_level_is_refused(tmp_path):
    """SCHEDULE_TOPIC_XXXX holds one queue per delay level (queue id = level - 1): a message put there in
    another queue is refused, on every path (single, list, columnar list and batch), naming the queue id;
    dispatch would take its record for a damaged header and give it no unit: it must never be PUT_OK."""
    sched = "SCHEDULE_TOPIC_XXXX"
    with MessageStore.open(tmp_path / "s", small_config(messageDelayLevel="1s 5s 10s")) as store:
        for r in _puts(store, sched, 3):
            assert r.status is ILLEGAL and "queue id 3 of SCHEDULE_TOPIC_XXXX is no delay level" in r.reason, r
        taken = _puts(store, sched, 2)
        assert all(r.status is OK for r in taken)
        assert store.wait_dispatched(10) and store.get_max_offset_in_queue(sched, 3) == 0
    assert _readable_everything(tmp_path / "s", small_config(messageDelayLevel="1s 5s 10s")) == len(taken)


def test_mixed_batch_answers_each_message(tmp_path):
    n = COLUMNAR_MIN + 4
    with MessageStore.open(tmp_path / "s", small_config()) as store:
        rs = store.put_messages(MessageBatch("T", [b"x"] * n, queue_ids=[0] * (n - 1) + [-1]))
        assert [r.status for r in rs] == [OK] * (n - 1) + [ILLEGAL]
        assert [r.append_result.logics_offset for r in rs[:-1]] == list(range(n - 1))
        assert "queue id -1" in rs[-1].reason


def test_producer_refuses_bad_topics_naming_them(tmp_path):
    with MessageStore.open(tmp_path / "s", small_config()) as store:
        p = Producer(store, "pg").start()
        for topic, _ in _bad_targets(tmp_path) + [("订单Topic", 0), ("a\x00b", 0), ("has space", 0)]:
            if topic == "T":
                continue
            with pytest.raises(Invalid, match="topic"):
                p.send(topic, b"x")
            with pytest.raises(Invalid, match="topic"):
                p.send_message(Message(topic, b"x"))
            with pytest.raises(Invalid, match="topic"):
                p.send_batch(topic, [b"x", b"y"])
        with pytest.raises(Invalid, match="queue id"):
            p.send_message(Message("T", b"x", queue_id=-1), queue=0)
        assert p.send("%RETRY%pg", b"ok").ok
        p.shutdown()


def test_load_refuses_bad_topics_and_queue_ids(tmp_path):
    box = tmp_path / "box"
    path = box / "a" / "store"
    path.parent.mkdir(parents=True)
    lines = [{"topic": t, "queueId": q, "body": "00"} for t, q in _bad_targets(tmp_path)]
    lines.append({"topic": "Good", "queueId": 1, "body": "01"})
    before = _files(tmp_path)
    res = run_cli("load", path, input="".join(json.dumps(x) + "\n" for x in lines).encode())
    out = [json.loads(x) for x in res.stdout.splitlines()]
    assert [o["status"] for o in out] == ["MESSAGE_ILLEGAL"] * (len(lines) - 1) + ["PUT_OK"], res.stderr[-400:]
    outside = {f for f in _files(tmp_path) - before if not f.startswith(os.path.join("box", "a", "store"))}
    assert not outside, f"files outside the store: {sorted(outside)}"
    assert _readable_everything(path, StoreConfig()) == 1


def test_spark_writer_refuses_bad_topics_and_queue_ids(tmp_path):
    from rmqstore.spark.writer import WriteError, normalize
    for topic, qid in _bad_targets(tmp_path):
        batch = pa.RecordBatch.from_pydict({"topic": [topic], "body": [b"x"], "queueId": [qid]})
        with pytest.raises(WriteError, match="topic|queue"):
            normalize(batch, 4 << 20, 0)
    batch = pa.RecordBatch.from_pydict({"topic": ["Good"], "body": [b"x"],
                                        "properties": [[("a", "b\x01UNIQ_KEY\x01forged")]]})
    with pytest.raises(WriteError, match="separator"):
        normalize(batch, 4 << 20, 0)
    ok = normalize(pa.RecordBatch.from_pydict({"topic": ["订单Topic"], "body": [b"x"], "queueId": [3]}), 4 << 20, 0)
    assert ok.num_rows == 1


# --- defect 5: property separators and None ------------------------------------------------------------------
BAD_PROPS = [{"a\x01": "v"}, {"a": "v\x01UNIQ_KEY\x01forged"}, {"a": "v\x02TAGS\x01evil"}, {"a\x02b": "v"},
             {"a": None}, {"": "v"}, {1: "v"}, {"a": 5}]


@pytest.mark.parametrize("props", BAD_PROPS, ids=range(len(BAD_PROPS)))
def test_properties_with_separators_or_none_are_refused(tmp_path, props):
    path = tmp_path / "s"
    with MessageStore.open(path, small_config()) as store:
        r = store.put_message(Message("T", b"x", properties=props))
        assert r.status is ILLEGAL and "propert" in r.reason, r
        rs = store.put_messages([Message("T", b"x", properties=dict(props)) for _ in range(3)])
        assert all(x.status is ILLEGAL for x in rs)
        n = COLUMNAR_MIN + 2
        good = [Message("T", b"g", properties={"a": "ok"}) for _ in range(n - 1)]
        rs = store.put_messages(good + [Message("T", b"x", properties=props)])
        assert [x.status for x in rs] == [OK] * (n - 1) + [ILLEGAL]
        name, value = next(iter(props.items()))
        if name == "a":     # a bad value in a column: only its message is refused
            column = ["ok"] * (n - 1) + [value]
            try:
                mb = MessageBatch("T", [b"c"] * n, properties={name: column})
            except (TypeError, ValueError):
                mb = None
            if mb is not None:
                rs = store.put_messages(mb)
                assert [x.status for x in rs] == [OK] * (n - 1) + [ILLEGAL], rs
        assert store.wait_dispatched(10)
        for m in store.get_message("g", "T", 0, 0, 64).messages:
            assert m.properties == {"a": "ok"}
    _readable_everything(path)


def test_producer_refuses_none_and_separators(tmp_path):
    with MessageStore.open(tmp_path / "s", small_config()) as store:
        p = Producer(store, "pg").start()
        for props in BAD_PROPS[:5]:
            with pytest.raises(ValueError, match="propert"):
                p.send("T", b"x", properties=props)
            with pytest.raises(ValueError, match="propert"):
                p.send_message(Message("T", b"x", properties=dict(props)))
        assert store.get_max_phy_offset() == 0
        p.shutdown()


def test_str_body_is_refused_not_encoded(tmp_path):
    with MessageStore.open(tmp_path / "s", small_config()) as store:
        r = store.put_message(Message("T", "a str body"))
        assert r.status is ILLEGAL and "body" in r.reason
        rs = store.put_messages(MessageBatch("T", ["s"] * COLUMNAR_MIN))
        assert all(x.status is ILLEGAL and "body" in x.reason for x in rs)
        assert store.put_message(Message("T", bytearray(b"ba"))).status is OK
        assert store.put_message(Message("T", memoryview(b"mv"))).status is OK
        assert store.wait_dispatched(10)
        assert [m.body for m in store.get_message("g", "T", 0, 0, 8).messages] == [b"ba", b"mv"]


def test_properties_size_limit(tmp_path):
    with MessageStore.open(tmp_path / "s", config=small_config(maxMessageSize=1 << 20,
                                                                mappedFileSizeCommitLog=1 << 20)) as store:
        r = store.put_message(Message("T", b"x", properties={"a": "v" * 40000}))
        assert r.status is PutMessageStatus.PROPERTIES_SIZE_EXCEEDED and "32767" in r.reason


def test_validation_unit_rules():
    assert validation.topic_problem("订单Topic") is None
    assert validation.client_topic_problem("订单Topic")
    assert validation.client_topic_problem("%RETRY%g|x") is None
    assert validation.queue_id_or_problem("1").startswith("queue id")
    assert validation.queue_id_or_problem(-1).startswith("queue id")
    import numpy as np
    assert validation.queue_id_or_problem(np.int64(3)) == 3
    assert validation.encode_properties({"a": "b", "c": "d"}) == b"a\x01b\x02c\x01d\x02"
    assert isinstance(validation.encode_properties({"a": "b\x02c\x01d"}), str)


def test_refused_messages_of_a_batch_are_logged_once(tmp_path, caplog):
    """Issue 15 leftover: a batch with many refused messages logs ONE warning (how many, the first's index
    and reason), not one per message; each message still gets its own answer."""
    msgs = [Message("Good", b"x", queue_id=0) for _ in range(5)]
    msgs += [Message("bad\x00topic", b"x") for _ in range(300)] + [Message("Good", b"y", properties={"A": None})]
    with MessageStore.open(tmp_path / "s", small_config()) as store:
        with caplog.at_level(logging.WARNING, logger="rmqstore"):
            rs = store.put_messages(msgs)
        assert [r.status for r in rs[:5]] == [OK] * 5
        assert all(r.status is ILLEGAL and r.reason for r in rs[5:])
        lines = [r for r in caplog.records if "refused" in r.getMessage()]
        assert len(lines) == 1, [r.getMessage() for r in lines]
        text = lines[0].getMessage()
        assert "301 of 306" in text and "message 5" in text and "\\x00" in text
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rmqstore"):     # a single put: its own line, as before
            assert store.put_message(Message("bad\x00topic", b"x")).status is ILLEGAL
        assert sum("refused" in r.getMessage() for r in caplog.records) == 1
