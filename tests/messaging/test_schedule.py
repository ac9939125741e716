"""Delayed messages: HashMap property order, the put-path rewrite, ScheduleMessageService delivery and
its delayOffset.json across restarts."""
from __future__ import annotations

import json
import time

from rmqstore.store.format import codec
from rmqstore.store.conf.config import StoreConfig
from rmqstore.store.format.java_map import JavaHashMap, as_broker_map, hashmap_order
from rmqstore.store.format.message import Message
from rmqstore.messaging.producer import Producer
from rmqstore.messaging.schedule import SCHEDULE_TOPIC, rewrite_delayed
from rmqstore.store.store import MessageStore
from store_checks import wait_until


def cfg(**kw) -> StoreConfig:
    base = dict(mapped_file_size_commit_log=4 << 20, mapped_file_size_consume_queue=60000,
                message_delay_level="1s 2s 3s")
    base.update(kw)
    return StoreConfig(**base)


# --- java.util.HashMap iteration order, checked against Java 17 (outputs recorded here) -----------------
def test_hashmap_order_matches_java():
    # for (int i = 0; i < 40; i++) m.put("k" + i, ...); keySet order:
    java = ("k31,k30,k11,k33,k10,k32,k13,k35,k12,k34,k15,k37,k14,k36,k17,k39,k16,k38,k19,k18,k0,k1,k2,k3,k20,"
            "k4,k5,k22,k6,k21,k7,k24,k8,k23,k9,k26,k25,k28,k27,k29").split(",")
    assert list(hashmap_order({f"k{i}": str(i) for i in range(40)})) == java
    # 10 keys of one hash ("Aa"/"BB" blocks) after z1, TAGS: the 9th in a bucket resizes the table
    p = ["Aa", "BB"]
    coll = ["".join(p[(i >> j) & 1] for j in range(4)) for i in range(16)]
    m = JavaHashMap()
    m.put("z1", "1")
    m.put("TAGS", "t")
    for i in range(10):
        m.put(coll[i], str(i))
    m.put("KEYS", "k")
    assert ",".join(m.to_dict()) == ("AaAaAaAa,BBAaAaAa,AaBBAaAa,BBBBAaAa,AaAaBBAa,BBAaBBAa,AaBBBBAa,BBBBBBAa,"
                                     "AaAaAaBB,BBAaAaBB,KEYS,z1,TAGS")
    # remove + put moves a key to the end of its bucket
    d = JavaHashMap()
    for k in ["UNIQ_KEY", "u1", "WAIT", "DELAY", "PGROUP", "TAGS", "KEYS", "TRAN_MSG", "REAL_TOPIC", "REAL_QID",
              "RETRY_TOPIC", "ORIGIN_MESSAGE_ID", "MAX_RECONSUME_TIMES", "RECONSUME_TIME", "a", "b", "c"]:
        d.put(k, "v")
    d.remove("u1")
    d.put("u1", "w")
    assert ",".join(d.to_dict()) == ("a,RECONSUME_TIME,b,c,TRAN_MSG,MAX_RECONSUME_TIMES,REAL_TOPIC,ORIGIN_MESSAGE_ID,"
                                     "RETRY_TOPIC,KEYS,UNIQ_KEY,u1,WAIT,DELAY,PGROUP,TAGS,REAL_QID")


def test_golden_property_orders_are_hashmap_orders(golden):
    """RocketMQ serialised the golden messages' properties from HashMaps: re-ordering is the identity."""
    for line in (golden / "rmq440-clean" / "messages.jsonl").read_text(encoding="utf-8").splitlines()[:1000]:
        props = json.loads(line)["properties"]
        assert list(hashmap_order(props)) == list(props)


def test_broker_parse_drops_what_java_drops():
    # string2messageProperties keeps only pairs that split into exactly name and value
    m = as_broker_map({"a": "1", "empty": "", "b": "2"})
    assert m.to_dict() == {"a": "1", "b": "2"}


# --- the rewrite -----------------------------------------------------------------------------------
def test_rewrite_matches_java_order_and_clamps():
    # client: TAGS, KEYS, WAIT, color, DELAY, UNIQ_KEY put into a HashMap, serialised (Java order below);
    # broker: parsed, REAL_TOPIC and REAL_QID put, re-serialised. Orders recorded from Java 17.
    client = hashmap_order({"TAGS": "TagA", "KEYS": "k1 k2", "WAIT": "true", "color": "red", "DELAY": "2",
                            "UNIQ_KEY": "X"})
    assert list(client) == ["color", "KEYS", "UNIQ_KEY", "WAIT", "DELAY", "TAGS"]
    msg = Message("T", b"x", queue_id=1, properties=client)
    out = rewrite_delayed([msg], 18)[0]
    assert out.topic == SCHEDULE_TOPIC and out.queue_id == 1
    assert list(out.properties) == ["REAL_TOPIC", "color", "KEYS", "UNIQ_KEY", "WAIT", "DELAY", "TAGS", "REAL_QID"]
    assert out.properties["REAL_TOPIC"] == "T" and out.properties["REAL_QID"] == "1"
    assert msg.topic == "T" and "REAL_TOPIC" not in msg.properties        # the caller's message is untouched

    big = hashmap_order({"TAGS": "t", "WAIT": "true", **{f"p{i}": "v" for i in range(8)}, "DELAY": "1",
                         "UNIQ_KEY": "X"})
    out = rewrite_delayed([Message("T", b"x", properties=big)], 18)[0]
    assert ",".join(out.properties) == "p0,p1,p2,p3,p4,p5,p6,p7,REAL_TOPIC,UNIQ_KEY,WAIT,DELAY,TAGS,REAL_QID"

    clamped = rewrite_delayed([Message("T", b"x", properties={"DELAY": "99"})], 3)[0]
    assert clamped.queue_id == 2 and clamped.properties["DELAY"] == "3"
    # not rewritten: no delay, level 0, prepared or rolled-back transaction messages
    for m in (Message("T", b"x", properties={"DELAY": "0"}), Message("T", b"x", properties={"a": "b"}),
              Message("T", b"x", sys_flag=codec.TRANSACTION_PREPARED_TYPE, properties={"DELAY": "1"}),
              Message("T", b"x", sys_flag=codec.TRANSACTION_ROLLBACK_TYPE, properties={"DELAY": "1"})):
        assert rewrite_delayed([m], 18)[0] is m
    commit = Message("T", b"x", sys_flag=codec.TRANSACTION_COMMIT_TYPE, properties={"DELAY": "1"})
    assert rewrite_delayed([commit], 18)[0].topic == SCHEDULE_TOPIC


def test_delayed_message_in_store_and_delivery_time(tmp_path):
    with MessageStore.open(tmp_path / "s", cfg()) as store:
        producer = Producer(store, "p")
        r = producer.send("DelayTopic", b"later", tags="TagA", delay_level=1, queue=0)
        assert r.ok
        store.wait_dispatched()
        # in SCHEDULE_TOPIC_XXXX queue 0, tags code = store time + 1000
        cq = store.consume_queues.find(SCHEDULE_TOPIC, 0)
        off, size, tags_code = cq.get_unit(0)
        sched = store.look_message_by_offset(off)
        assert off == r.commit_log_offset and sched.topic == SCHEDULE_TOPIC
        assert tags_code == sched.store_timestamp + 1000
        assert sched.properties["REAL_TOPIC"] == "DelayTopic" and sched.properties["REAL_QID"] == "0"
        assert store.get_max_offset_in_queue("DelayTopic", 0) == 0
        got = wait_until(lambda: store.get_max_offset_in_queue("DelayTopic", 0) == 1, 10.0)
        assert got, "delayed message not delivered within 10 s"
        real = store.get_message("g", "DelayTopic", 0, 0, 1).messages[0]
        late = real.store_timestamp - sched.store_timestamp
        assert 1000 <= late < 5000, late        # never early; late only by a loaded machine's pauses
        assert real.body == b"later" and real.born_timestamp == sched.born_timestamp
        assert real.store_timestamp >= sched.store_timestamp + 1000
        # RocketMQ 4.4.0's messageTimeup serialises the properties before clearing DELAY: the record keeps them
        assert list(real.properties) == list(sched.properties)
        assert real.properties["DELAY"] == "1" and real.tags == "TagA"
        # and the re-put record is dispatched with the real tag's code, not delayed again
        assert store.consume_queues.find("DelayTopic", 0).get_unit(0)[2] == codec.tags_code("TagA")
        assert store.get_max_offset_in_queue(SCHEDULE_TOPIC, 0) == 1


def test_delay_offsets_persist_and_survive_restart(tmp_path):
    path = tmp_path / "s"
    # level 3 is 6 s: the store closes well before it is due, also on a loaded machine
    config = cfg(flush_delay_offset_interval=100, message_delay_level="1s 2s 6s")
    with MessageStore.open(path, config) as store:
        p = Producer(store, "p")
        p.send("D", b"one", delay_level=1, queue=0)
        p.send("D", b"three", delay_level=3, queue=0)
        assert wait_until(lambda: store.get_max_offset_in_queue("D", 0) == 1, 3.0)
        offsets_file = path / "config" / "delayOffset.json"
        # written every flushDelayOffsetInterval (100 ms here) while running
        assert wait_until(lambda: offsets_file.exists() and json.loads(offsets_file.read_text()) ==
                          {"offsetTable": {"1": 1, "3": 0}}, 2.0)
    # closed before the level-3 message was due: the file says level 1 is done, level 3 is not
    doc = json.loads((path / "config" / "delayOffset.json").read_text())
    assert doc["offsetTable"]["1"] == 1 and doc["offsetTable"].get("3", 0) == 0
    with MessageStore.open(path, config) as store:
        assert wait_until(lambda: store.get_max_offset_in_queue("D", 0) >= 2, 15.0)
        time.sleep(0.3)
        bodies = [m.body for m in store.get_message("g", "D", 0, 0, 10).messages]
        assert bodies == [b"one", b"three"]            # each once: level 1 was not delivered again
    doc = json.loads((path / "config" / "delayOffset.json").read_text())
    assert doc == {"offsetTable": {"1": 1, "3": 1}}
    assert (path / "config" / "delayOffset.json.bak").exists()


def test_fastjson_delay_offset_file_is_read(tmp_path):
    """RocketMQ writes integer keys unquoted; such a file resumes delivery from its offsets."""
    path = tmp_path / "s"
    with MessageStore.open(path, cfg()) as store:
        store.put_message(Message("D", b"old", properties={"DELAY": "1"}))
        store.wait_dispatched()
        store.unregister_service("schedule")        # stop it before it delivers
    (path / "config").mkdir(exist_ok=True)
    (path / "config" / "delayOffset.json").write_text('{\n\t"offsetTable":{1:1\n\t}\n}')
    with MessageStore.open(path, cfg()) as store:
        store.put_message(Message("D", b"new", properties={"DELAY": "1"}))
        assert wait_until(lambda: store.get_max_offset_in_queue("D", 0) >= 1, 3.0)
        time.sleep(0.2)
        assert [m.body for m in store.get_message("g", "D", 0, 0, 10).messages] == [b"new"]
