"""Producer: send results, UNIQ_KEY, property layout, queue selection, topic creation and topics.json."""
from __future__ import annotations

import json
import os
import time
from collections import Counter

import pytest

from rmqstore.store.format import codec
from rmqstore.store.conf.config import StoreConfig
from rmqstore.messaging.local_broker import LocalBroker
from rmqstore.store.format.message import PutMessageStatus
from rmqstore.messaging.producer import Producer, SendError, SendStatus, TopicNotExistError, client_ip, create_uniq_id, select_queue_by_hash
from rmqstore.store.store import MessageStore
from rmqstore.messaging.topic_config import MessageQueue


def cfg(**kw) -> StoreConfig:
    base = dict(mapped_file_size_commit_log=4 << 20, mapped_file_size_consume_queue=60000)
    base.update(kw)
    return StoreConfig(**base)


def test_uniq_key_format():
    before = int(time.time() * 1000)
    ids = [create_uniq_id() for _ in range(3)]
    after = int(time.time() * 1000)
    for u in ids:
        assert len(u) == 32 and u == u.upper() and int(u, 16) >= 0
    raw = [bytes.fromhex(u) for u in ids]
    assert raw[0][:4] == bytes(int(x) for x in client_ip().split("."))           # IP
    assert raw[0][4:6] == (os.getpid() & 0xFFFF).to_bytes(2, "big")               # pid, low 2 bytes
    assert len({r[:10] for r in raw}) == 1                                         # fixed part, class-loader hash
    counters = [int.from_bytes(r[14:16], "big") for r in raw]
    assert counters[1] == (counters[0] + 1) & 0xFFFF and counters[2] == (counters[1] + 1) & 0xFFFF
    lt = time.localtime(before / 1000)
    month_start = int(time.mktime((lt.tm_year, lt.tm_mon, 1, 0, 0, 0, 0, 0, -1)) * 1000)
    span = int.from_bytes(raw[0][10:14], "big")
    assert (before - month_start) & 0xFFFFFFFF <= span <= (after - month_start) & 0xFFFFFFFF


def test_send_result_and_stored_message(store):
    LocalBroker.of(store).topics.create_topic("TopicA", 4)
    p = Producer(store, "pg")
    r = p.send("TopicA", "hello", tags="TagA", keys=["k1", "k2"], properties={"color": "red"}, queue=2)
    assert r.send_status is SendStatus.SEND_OK and r.ok
    assert r.message_queue == MessageQueue("TopicA", "broker-a", 2) and r.queue_offset == 0
    host, off = codec.decode_message_id(r.offset_msg_id)
    assert off == r.commit_log_offset and host == store.config.store_host
    store.wait_dispatched()
    m = store.get_message("g", "TopicA", 2, 0, 1).messages[0]
    assert m.body == b"hello" and m.tags == "TagA" and m.keys == ["k1", "k2"]
    assert m.properties["UNIQ_KEY"] == r.msg_id and m.msg_id == r.offset_msg_id
    # the Java client's HashMap layout (recorded from Java 17 for these keys)
    assert list(m.properties) == ["color", "KEYS", "UNIQ_KEY", "WAIT", "TAGS"]
    assert m.properties["WAIT"] == "true"
    assert store.find_messages_by_key("TopicA", "k2")[0].commit_log_offset == r.commit_log_offset
    assert store.find_messages_by_key("TopicA", r.msg_id)[0].commit_log_offset == r.commit_log_offset
    r2 = p.send("TopicA", b"second", queue=2)
    assert r2.queue_offset == 1 and r2.msg_id != r.msg_id


def test_round_robin_and_sharding(store):
    LocalBroker.of(store).topics.create_topic("RR", 4)
    p = Producer(store, "pg")
    used = [p.send("RR", f"m{i}").message_queue.queue_id for i in range(12)]
    assert Counter(used) == {0: 3, 1: 3, 2: 3, 3: 3}
    assert all((b - a) % 4 == 1 for a, b in zip(used, used[1:]))                  # one after the other
    # SelectMessageQueueByHash: abs(String.hashCode) % n; "order-1".hashCode() == -1207111310 in Java
    mqs = [MessageQueue("RR", "broker-a", i) for i in range(4)]
    assert select_queue_by_hash(mqs, None, "order-1").queue_id == 1207111310 % 4
    qs = {p.send("RR", f"x{i}", sharding_key="order-1").message_queue.queue_id for i in range(5)}
    assert qs == {1207111310 % 4}
    chosen = p.send("RR", "sel", queue_selector=lambda mqs, msg, arg: mqs[-1], sharding_key="ignored")
    assert chosen.message_queue.queue_id == 3
    with pytest.raises(ValueError):
        p.send("RR", "bad", queue=4)


def test_auto_create_topic_and_topics_json(tmp_path):
    path = tmp_path / "s"
    with MessageStore.open(path, cfg(default_topic_queue_nums=8)) as store:
        r = Producer(store, "pg").send("NewTopic", b"x")
        assert r.ok and 0 <= r.message_queue.queue_id < 4
        LocalBroker.of(store).topics.create_topic("Six", 6)
    doc = json.loads((path / "config" / "topics.json").read_text(encoding="utf-8"))
    assert set(doc) == {"dataVersion", "topicConfigTable"}
    assert set(doc["dataVersion"]) == {"counter", "timestamp"} and doc["dataVersion"]["counter"] >= 2
    table = doc["topicConfigTable"]
    # min(the client's defaultTopicQueueNums 4, the broker's 8), perm of TBW102 without inherit
    assert table["NewTopic"] == {"order": False, "perm": 6, "readQueueNums": 4, "topicFilterType": "SINGLE_TAG",
                                 "topicName": "NewTopic", "topicSysFlag": 0, "writeQueueNums": 4}
    assert table["Six"]["readQueueNums"] == 6 and table["Six"]["writeQueueNums"] == 6
    assert table["TBW102"]["perm"] == 7 and table["TBW102"]["writeQueueNums"] == 8
    for sys_topic in ("SELF_TEST_TOPIC", "BenchmarkTest", "DefaultCluster", "broker-a", "OFFSET_MOVED_EVENT"):
        assert sys_topic in table
    # reloaded on the next open, with a queue count change persisted
    with MessageStore.open(path, cfg(auto_create_topic_enable=False)) as store:
        topics = LocalBroker.of(store).topics
        assert topics.select("Six").write_queue_nums == 6
        p = Producer(store, "pg")
        assert p.send("Six", b"y", queue=5).ok
        with pytest.raises(TopicNotExistError):
            p.send("Unknown", b"z")


def test_batch_and_errors(store):
    LocalBroker.of(store).topics.create_topic("B", 2)
    p = Producer(store, "pg")
    r = p.send_batch("B", [b"a", b"b", b"c"], tags="T", queue=1)
    assert r.ok and r.queue_offset == 0 and len(r.msg_id.split(",")) == 3 and len(r.offset_msg_id.split(",")) == 3
    store.wait_dispatched()
    got = store.get_message("g", "B", 1, 0, 10).messages
    assert [m.body for m in got] == [b"a", b"b", b"c"] and [m.queue_offset for m in got] == [0, 1, 2]
    assert [m.properties["UNIQ_KEY"] for m in got] == r.msg_id.split(",")
    with pytest.raises(ValueError):
        p.send("B", b"")                              # the message body length is zero
    with pytest.raises(ValueError):
        p.send("TBW102", b"x")
    with pytest.raises(ValueError):
        p.send("B", b"x", properties={"k": " "})
    store.close()
    with pytest.raises(SendError) as e:
        p.send("B", b"after close")
    assert e.value.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
