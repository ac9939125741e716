"""SQL92 selectors in process and in Spark: PushConsumer / PullConsumer subscribed with
MessageSelector.by_sql, and the rocketmq data source's messageSelector option, each giving RocketMQ 4.4.0's
recorded delivered sets (tests/data/sql92) over a store holding SqlTool's messages; selectors RocketMQ refuses
refused at subscribe time and at planning, naming the option."""
from __future__ import annotations

import threading

import pytest

from conftest import load_store, local_spark
from rmqstore import MessageSelector, SelectorError
from rmqstore.messaging.consumer import CONSUME_SUCCESS, ConsumeFromWhere, PullConsumer, PullStatus, PushConsumer
from rmqstore.messaging.local_broker import LocalBroker
from rmqstore.messaging.producer import Producer
from rmqstore.store.conf.config import StoreConfig
from rmqstore.store.store import MessageStore
from sql92_cases import sqltool_props, sqltool_record, sqltool_tag
from store_checks import wait_until

TOPIC, N = "SqlLocal", 400
RECORD = sqltool_record()
VALID = [r for r in RECORD if r.valid]
CFG = StoreConfig(mapped_file_size_commit_log=4 << 20, mapped_file_size_consume_queue=20 * 1000)


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("sqllocal") / "broker-a" / "store"
    with MessageStore.open(root, CFG) as st:
        LocalBroker.of(st).topics.create_topic(TOPIC, 4)
        p = Producer(st, "pg")
        for i in range(N):
            p.send(TOPIC, str(i), tags=sqltool_tag(i), keys=f"sql-{i}", properties=sqltool_props(i))
        assert st.wait_dispatched()
    (root.parent / "store.conf").write_text(CFG.to_properties())
    return root


@pytest.fixture
def store(store_path):
    with MessageStore.open(store_path, CFG) as st:
        yield st


def test_pull_consumer_gets_rocketmq_delivered_sets(store):
    c = PullConsumer(store, "sql_local_pull")
    mqs = c.fetch_subscribe_message_queues(TOPIC)
    assert len(mqs) == 4
    for r in VALID:
        sel = MessageSelector.by_sql(r.selector)
        got = set()
        for mq in mqs:
            off = 0
            while True:
                res = c.pull(mq, off, 32, sel)
                got.update(int(m.body) for m in res.msg_found_list)
                if res.pull_status is PullStatus.NO_NEW_MSG or res.next_begin_offset <= off:
                    break
                off = res.next_begin_offset
        assert got == r.delivered(N), r.id


def test_push_consumer_gets_rocketmq_delivered_sets(store):
    by_id = {r.id: r for r in RECORD}
    for rid in ("E04", "E10", "E22", "E29", "E44"):
        seen, lock = set(), threading.Lock()

        def on(msgs):
            with lock:
                seen.update(int(m.body) for m in msgs)
            return CONSUME_SUCCESS
        c = PushConsumer(store, f"sql_local_push_{rid}", on, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
        c.subscribe(TOPIC, MessageSelector.by_sql(by_id[rid].selector))
        c.start()
        try:
            want = by_id[rid].delivered(N)
            assert wait_until(lambda: seen >= want, 60), rid
            offsets = LocalBroker.of(store).offsets       # every queue consumed to its end: nothing more comes
            assert wait_until(lambda: all(offsets.query_offset(c.group, TOPIC, q) >= store.get_max_offset_in_queue(
                TOPIC, q) for q in range(4)), 60), rid
        finally:
            c.shutdown()
        assert seen == want, rid


def test_selectors_rocketmq_refuses_are_refused_at_subscribe(store):
    c = PullConsumer(store, "sql_local_bad")
    for r in RECORD:
        if not r.valid:
            with pytest.raises(SelectorError) as e:
                c.subscribe(TOPIC, MessageSelector.by_sql(r.selector))
            assert r.push_status.startswith("refused 23 " + " ".join(e.value.remark.split())[:150]), r.id


def test_spark_batch_mask_gives_rocketmq_delivered_sets():
    """The option's evaluation over a batch of property maps (Arrow columns): every recorded selector."""
    pa = pytest.importorskip("pyarrow")
    from rmqstore.spark.records import parse_properties
    from rmqstore.spark.scan import selector_mask
    from rmqstore.store.format import codec
    from sql92_cases import sqltool_all_props
    props = parse_properties(pa.array([codec.properties_to_string(sqltool_all_props(i)) for i in range(2000)]))
    for r in VALID:
        mask = selector_mask(r.selector, props, 2000)
        assert {int(i) for i in mask.nonzero()[0]} == r.push, r.id


@pytest.fixture(scope="module")
def spark():
    return local_spark("rmqstore-test-sql92")


@pytest.mark.spark
def test_spark_message_selector_option(spark, store_path):
    r = {r.id: r for r in RECORD}["E23"]          # c > 2 OR a = 5: an exception drops a message inside an OR
    df = load_store(spark, store_path, topics=TOPIC, messageSelector=r.selector)
    assert {int(bytes(row.body)) for row in df.select("body").collect()} == r.delivered(N)
    with pytest.raises(Exception, match="messageSelector.*Value ''x'' cannot be compared"):
        load_store(spark, store_path, messageSelector="b > 'x'")
