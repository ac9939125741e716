"""SQL92 subscriptions through `rmqstore serve` (enablePropertyFilter, enableConsumeQueueExt and
enableCalcFilterBitMap on) with rmqstore's 4.x client over real sockets: RocketMQ 4.4.0's recorded delivered
sets (tests/data/sql92) for pull consumers and push consumers (their pulls carry no selector: the broker uses
the one their heartbeat registered, and the bit maps computed at dispatch), RocketMQ's refusals at a push
consumer's start (CHECK_CLIENT_CONFIG), a pull with a selector that does not compile refused, a push group
without filter data, and a broker with enablePropertyFilter off."""
from __future__ import annotations

import json
import threading

import pytest

from rmqstore.broker.server import ServerProcess
from rmqstore.client import (Admin, ConsumeFromWhere, ConsumeStatus, Message, MQBrokerError, Producer, PullConsumer,
                             PushConsumer)
from rmqstore.filter import MessageSelector, SelectorError, compile_sql92
from rmqstore.remoting.codes import ResponseCode
from sql92_cases import folded, sqltool_props, sqltool_record, sqltool_tag
from store_checks import wait_until

CONF = {"enablePropertyFilter": "true", "enableConsumeQueueExt": "true", "enableCalcFilterBitMap": "true",
        "mappedFileSizeCommitLog": 16 * 1024 * 1024, "mappedFileSizeConsumeQueueExt": 1024 * 1024}
TOPIC, N = "SqlTopic", 300
RECORD = sqltool_record()
VALID = [r for r in RECORD if r.valid]
INVALID = [r for r in RECORD if not r.valid]
PUSHED = ["E01", "E07", "E11", "E13", "E15", "E20", "E23", "E29", "E33", "E40", "E44", "E52"]   # every operator


class Seen:
    def __init__(self):
        self.lock = threading.Lock()
        self.ids: set[int] = set()

    def __call__(self, msgs):
        with self.lock:
            self.ids.update(int(m.body) for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS


@pytest.fixture(scope="module")
def sent(server):
    """Push consumers of PUSHED started (registered: the dispatcher computes their bit maps), then the first N
    of SqlTool's messages sent; yields {id: (consumer, Seen)}."""
    create_topic(server.namesrv_addr, 4)
    by_id = {r.id: r for r in RECORD}
    pushers = {}
    for rid in PUSHED:
        seen = Seen()
        c = PushConsumer(f"sql_push_{rid}", server.namesrv_addr,
                         consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
        c.subscribe(TOPIC, MessageSelector.by_sql(by_id[rid].selector))
        c.register_message_listener(seen)
        c.start()
        pushers[rid] = (c, seen)
    p = Producer("sql_pg", server.namesrv_addr).start()
    for i in range(N):
        p.send(Message(TOPIC, str(i), tags=sqltool_tag(i), keys=f"sql-{i}", properties=sqltool_props(i)))
    p.shutdown()
    try:
        yield pushers
    finally:
        for c, _ in pushers.values():
            c.shutdown()


def create_topic(namesrv: str, queues: int) -> None:
    """The topic, and its route known to the name server (a push consumer checks its selector with a broker
    of the topic's route: without one, RocketMQ's client skips the check)."""
    admin = Admin(namesrv).start()
    try:
        admin.create_topic(TOPIC, queues)
        assert wait_until(lambda: admin._m().update_route(TOPIC) is not None, 30)
    finally:
        admin.shutdown()


def _pull_all(pc: PullConsumer, selector) -> set[int]:
    got: set[int] = set()
    for mq in pc.fetch_subscribe_message_queues(TOPIC):
        off = 0
        while True:
            r = pc.pull(mq, selector, off, 32)
            got.update(int(m.body) for m in r.msg_found_list)
            if r.next_begin_offset >= r.max_offset or r.next_begin_offset <= off:
                break
            off = r.next_begin_offset
    return got


def test_pull_consumers_get_rocketmq_delivered_sets(server, sent):
    pc = PullConsumer("sql_pull", server.namesrv_addr).start()
    try:
        for r in VALID:
            assert _pull_all(pc, MessageSelector.by_sql(r.selector)) == r.delivered(N), r.id
        for r in INVALID:       # RocketMQ 4.4.0 delivers everything here (an assert); rmqstore refuses
            with pytest.raises(MQBrokerError) as e:
                pc.pull(next(iter(pc.fetch_subscribe_message_queues(TOPIC))), MessageSelector.by_sql(r.selector))
            assert e.value.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
            assert "refused 23 " + folded(e.value.remark) == r.push_status, r.id
    finally:
        pc.shutdown()


def test_push_consumers_get_rocketmq_delivered_sets_through_bit_maps(server, sent):
    by_id = {r.id: r for r in RECORD}
    for rid, (c, seen) in sent.items():
        want = by_id[rid].delivered(N)
        assert wait_until(lambda: seen.ids >= want, 60), (rid, sorted(want - seen.ids)[:10])
    for rid, (c, seen) in sent.items():       # every queue consumed to its end: nothing more will come
        mqs = [mq for mq in c.process_queues if mq.topic == TOPIC]
        assert len(mqs) == 4
        assert wait_until(lambda: all(c.offset_store.read_memory(mq) >= c.max_offset(mq) for mq in mqs), 30), rid
        assert seen.ids == by_id[rid].delivered(N), rid
    ext = server.store / "consumequeue_ext" / TOPIC
    assert sorted(p.name for p in ext.iterdir()) == ["0", "1", "2", "3"]
    saved = json.loads((server.store / "config" / "consumerFilter.json").read_text())     # RocketMQ's file
    groups = saved["filterDataByTopic"][TOPIC]["groupFilterData"]
    assert {f"sql_push_{rid}" for rid in PUSHED} <= set(groups)
    assert groups["sql_push_E01"]["expression"] == "a = 5" and groups["sql_push_E01"]["bloomFilterData"]["bitNum"] == 112


def test_push_consumer_start_refused_as_rocketmq_refuses(server, sent):
    for r in INVALID:
        c = PushConsumer(f"sql_bad_{r.id}", server.namesrv_addr)
        c.subscribe(TOPIC, MessageSelector.by_sql(r.selector))
        c.register_message_listener(Seen())
        with pytest.raises(MQBrokerError) as e:
            c.start()
        assert e.value.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
        assert "refused 23 " + folded(e.value.remark) == r.push_status, r.id
        with pytest.raises(SelectorError) as e2:
            compile_sql92(r.selector)
        assert e.value.remark == e2.value.remark


class UncheckedPushConsumer(PushConsumer):
    """A client that skips CHECK_CLIENT_CONFIG (before RocketMQ 4.1): its bad selector reaches the heartbeat."""

    def _check_client_in_broker(self) -> None:
        pass


def test_push_group_without_filter_data_is_told_so(server, sent):
    c = UncheckedPushConsumer("sql_unchecked", server.namesrv_addr)
    c.subscribe(TOPIC, MessageSelector.by_sql("a = AND b"))
    c.register_message_listener(Seen())
    c.start()
    try:
        mq = next(iter(c.fetch_subscribe_message_queues(TOPIC)))
        mqc = c.mq
        resp = mqc.invoke(mqc.broker_addr_of(mq), c._pull_command(mq, 0, 32, c.subscriptions[TOPIC], False, 0, False))
        assert resp.code == ResponseCode.FILTER_DATA_NOT_EXIST
        assert resp.remark == "The broker's consumer filter data is not exist!Your expression may be wrong!"
    finally:
        c.shutdown()


def test_broker_without_property_filter_refuses_sql92(tmp_path):
    with ServerProcess(tmp_path / "store", {"mappedFileSizeCommitLog": 4 * 1024 * 1024}) as srv:
        create_topic(srv.namesrv_addr, 1)
        c = PushConsumer("sql_off", srv.namesrv_addr, instance_name="sql_off")   # not the module server's client
        c.subscribe(TOPIC, MessageSelector.by_sql("a > 1"))
        c.register_message_listener(Seen())
        with pytest.raises(MQBrokerError) as e:
            c.start()
        assert (e.value.code, e.value.remark) == (ResponseCode.SYSTEM_ERROR,
                                                  "The broker does not support consumer to filter message by SQL92")
        pc = PullConsumer("sql_off_pull", srv.namesrv_addr, instance_name="sql_off").start()
        try:
            with pytest.raises(MQBrokerError) as e:
                pc.pull(next(iter(pc.fetch_subscribe_message_queues(TOPIC))), MessageSelector.by_sql("a > 1"))
            assert e.value.code == ResponseCode.SYSTEM_ERROR
        finally:
            pc.shutdown()
