"""Transactional messages: halves invisible, commit visible, rollback never, the checker."""
from __future__ import annotations

import json
import threading
import time

import pytest

from rmqstore.store.format import codec
from rmqstore.store.conf.config import StoreConfig
from rmqstore.messaging.consumer import CONSUME_SUCCESS, ConsumeFromWhere, PushConsumer
from rmqstore.messaging.local_broker import LocalBroker
from rmqstore.store.store import MessageStore
from rmqstore.messaging.transaction import LocalTransactionState as S
from rmqstore.messaging.transaction import TransactionProducer
from store_checks import wait_until


def cfg(**kw) -> StoreConfig:
    base = dict(mapped_file_size_commit_log=4 << 20, mapped_file_size_consume_queue=60000)
    base.update(kw)
    return StoreConfig(**base)


@pytest.fixture
def store(tmp_path):
    s = MessageStore.open(tmp_path / "store", cfg())
    LocalBroker.of(s).topics.create_topic("Tx", 1)
    yield s
    s.close()


def queue_bodies(store, topic="Tx", q=0):
    store.wait_dispatched()
    return [m.body for m in store.get_message("g", topic, q, 0, 100).messages]


def test_half_invisible_until_commit(store):
    p = TransactionProducer(store, "txg").start()
    r = p.send_message_in_transaction("Tx", b"pay order 1", tags="TagA", keys="order-1", queue=0)
    assert r.local_transaction_state is S.UNKNOW and r.ok and r.transaction_id == r.msg_id
    half = store.look_message_by_offset(r.commit_log_offset)
    assert half.sys_flag & 0xC == codec.TRANSACTION_PREPARED_TYPE
    assert half.properties["TRAN_MSG"] == "true" and half.properties["PGROUP"] == "txg"
    # the Java client's HashMap layout for these keys (recorded from Java 17, KEYS added)
    assert [k for k in half.properties if k != "KEYS"] == ["TRAN_MSG", "UNIQ_KEY", "WAIT", "PGROUP", "TAGS"]
    assert queue_bodies(store) == []                                   # not in the consume queue
    assert store.find_messages_by_key("Tx", "order-1")[0].commit_log_offset == r.commit_log_offset  # but indexed
    put = p.end_transaction(r, S.COMMIT_MESSAGE)
    assert put.ok
    assert queue_bodies(store) == [b"pay order 1"]
    commit = store.get_message("g", "Tx", 0, 0, 1).messages[0]
    assert commit.sys_flag & 0xC == codec.TRANSACTION_COMMIT_TYPE
    assert commit.prepared_transaction_offset == r.commit_log_offset
    assert commit.commit_log_offset == put.append_result.wrote_offset and commit.queue_offset == 0
    assert list(commit.properties.items()) == list(half.properties.items())
    assert (commit.flag, commit.born_timestamp, commit.born_host, commit.tags) == \
        (half.flag, half.born_timestamp, half.born_host, "TagA")
    assert store.consume_queues.find("Tx", 0).get_unit(0)[2] == codec.tags_code("TagA")
    # a half ends once
    assert p.end_transaction(r, S.COMMIT_MESSAGE) is None
    assert p.end_transaction(r.offset_msg_id, S.ROLLBACK_MESSAGE) is None
    assert queue_bodies(store) == [b"pay order 1"]
    p.shutdown()


def test_rollback_is_never_visible(store):
    p = TransactionProducer(store, "txg", execute=lambda msg, arg: arg).start()
    r1 = p.send_message_in_transaction("Tx", b"rolled back", keys="rb-1", arg=S.ROLLBACK_MESSAGE, queue=0)
    r2 = p.send_message_in_transaction("Tx", b"committed", arg="COMMIT_MESSAGE", queue=0)
    assert r1.local_transaction_state is S.ROLLBACK_MESSAGE and r2.local_transaction_state is S.COMMIT_MESSAGE
    assert queue_bodies(store) == [b"committed"]
    # the rollback record: sysFlag 12, empty body, preparedTransactionOffset = the half, not indexed
    after_half = r1.commit_log_offset + store.look_message_by_offset(r1.commit_log_offset).store_size
    rb = store.look_message_by_offset(after_half)
    assert rb.sys_flag & 0xC == codec.TRANSACTION_ROLLBACK_TYPE and rb.body == b""
    assert rb.prepared_transaction_offset == r1.commit_log_offset and rb.queue_offset == 0
    assert [m.commit_log_offset for m in store.find_messages_by_key("Tx", "rb-1")] == [r1.commit_log_offset]
    assert p.end_transaction(r1, S.COMMIT_MESSAGE) is None            # already rolled back
    assert queue_bodies(store) == [b"committed"]
    # the wrong producer group cannot end someone else's half
    r3 = p.send_message_in_transaction("Tx", b"open", arg=S.UNKNOW, queue=0)
    other = TransactionProducer(store, "other-group")
    with pytest.raises(ValueError):
        other.end_transaction(r3, S.COMMIT_MESSAGE)
    p.shutdown()


def test_consumer_sees_only_committed(store):
    got = []
    c = PushConsumer(store, "tx-consumers", lambda msgs: got.extend(m.body for m in msgs) or CONSUME_SUCCESS,
                     consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    c.subscribe("Tx", "*")
    with c:
        p = TransactionProducer(store, "txg", execute=lambda msg, arg: arg).start()
        for i in range(6):
            p.send_message_in_transaction("Tx", f"m{i}", arg=[S.COMMIT_MESSAGE, S.ROLLBACK_MESSAGE, S.UNKNOW][i % 3])
        assert wait_until(lambda: len(got) >= 2, 3)
        time.sleep(0.2)
        assert sorted(got) == [b"m0", b"m3"]
        p.shutdown()


def test_checker_resolves_unknown_halves(store):
    calls: dict[bytes, int] = {}
    lock = threading.Lock()

    def check(msg):
        with lock:
            calls[msg.body] = calls.get(msg.body, 0) + 1
            n = calls[msg.body]
        if msg.body == b"late-commit":
            return S.COMMIT_MESSAGE if n >= 2 else S.UNKNOW
        if msg.body == b"late-rollback":
            return S.ROLLBACK_MESSAGE
        return S.UNKNOW                                             # "never-known"

    p = TransactionProducer(store, "txg", check=check, transaction_timeout_ms=300, transaction_check_interval_ms=100,
                            transaction_check_max=3)
    t0 = time.monotonic()
    for body in (b"late-commit", b"late-rollback", b"never-known"):
        p.send_message_in_transaction("Tx", body, queue=0)
    p.start()
    assert wait_until(lambda: calls.get(b"never-known", 0) >= 3 and calls.get(b"late-commit", 0) >= 2, 5)
    time.sleep(0.5)                                                 # no further checks after the last one
    assert calls == {b"late-commit": 2, b"late-rollback": 1, b"never-known": 3}
    assert time.monotonic() - t0 >= 0.3                             # not before the transaction timeout
    assert queue_bodies(store) == [b"late-commit"]
    assert LocalBroker.of(store).transactions.pending_halves("txg") == []
    p.shutdown()


def test_checker_after_restart(tmp_path):
    path = tmp_path / "s"
    with MessageStore.open(path, cfg()) as store:
        LocalBroker.of(store).topics.create_topic("Tx", 1)
        p = TransactionProducer(store, "txg")            # no checker in this run
        r = p.send_message_in_transaction("Tx", b"crashed before commit", queue=0)
        assert LocalBroker.of(store).transactions.pending_halves() == [r.commit_log_offset]
    state = json.loads((path / "config" / "transactionCheck.json").read_text())
    assert list(state["halfTable"]) == [str(r.commit_log_offset)]
    assert state["halfTable"][str(r.commit_log_offset)]["producerGroup"] == "txg"
    with MessageStore.open(path, cfg()) as store:
        checked = []
        p = TransactionProducer(store, "txg", check=lambda m: checked.append(m.body) or S.COMMIT_MESSAGE,
                                transaction_timeout_ms=100, transaction_check_interval_ms=100).start()
        assert wait_until(lambda: queue_bodies(store) == [b"crashed before commit"], 3)
        assert checked == [b"crashed before commit"]
        p.shutdown()
    state = json.loads((path / "config" / "transactionCheck.json").read_text())
    assert state["halfTable"] == {}
