"""POP consumption on the store (rmqstore.messaging.pop): receive with an invisible time, ack by receipt
handle, change invisible time, redelivery counted, dead-lettering after maxReconsumeTimes, FIFO groups, and
the state surviving a restart (pop/popState.log)."""
from __future__ import annotations

import time

import pytest

from rmqstore import Message, MessageStore
from rmqstore.messaging.local_broker import LocalBroker
from rmqstore.messaging.pop import AckResult, InvalidReceiptHandle, PopService, ReceiptHandle


def open_pop(path, max_times=16):
    store = MessageStore.open(path)
    pop = PopService(store, LocalBroker.of(store), max_reconsume_times=lambda _g: max_times)
    pop.start()
    return store, pop


def put(store, topic, bodies, **props):
    for b in bodies:
        assert store.put_message(Message(topic, b, properties=dict(props))).ok
    assert store.wait_dispatched(10)


def wait_receive(pop, group, topic, n=32, invisible_ms=30_000, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pop.receive(group, topic, n, invisible_ms)
        if got:
            return got
        time.sleep(0.05)
    return []


def test_receipt_handle_round_trip_and_bad_handles():
    h = ReceiptHandle(7, 1_700_000_000_000, 30_000, 2, 4096, "broker-a")
    assert ReceiptHandle.decode(h.encode()) == h
    assert len(h.encode().split(" ")) == 9           # RocketMQ 5's ReceiptHandle fields
    for bad in ("", "x", "1 2 3 4 0 b 0 x 5", "1 2 3 4 0 b 0 2 5", "-1 2 3 4 0 b 0 -1 5"):
        with pytest.raises(InvalidReceiptHandle):
            ReceiptHandle.decode(bad)


def test_receive_ack_exactly_once(tmp_path):
    store, pop = open_pop(tmp_path / "s")
    try:
        put(store, "T", [b"m%d" % i for i in range(10)])
        got = pop.receive("g", "T", 32, 30_000)
        assert sorted(p.message.body for p in got) == sorted(b"m%d" % i for i in range(10))
        assert all(p.attempt == 1 for p in got)
        assert pop.receive("g", "T", 32, 30_000) == []          # invisible now
        for p in got:
            assert pop.ack("g", "T", p.handle) is AckResult.OK
        assert pop.ack("g", "T", got[0].handle) is AckResult.NOT_FOUND
        assert pop.receive("g2", "T", 32, 30_000)              # another group has its own progress
        assert LocalBroker.of(store).offsets.query_offset("g", "T", 0) == 10
    finally:
        pop.shutdown()
        store.close()


def test_redelivery_counts_attempts_and_dead_letters(tmp_path):
    store, pop = open_pop(tmp_path / "s", max_times=1)
    try:
        put(store, "T", [b"poison"])
        first = pop.receive("g", "T", 1, 1_000)
        assert [p.attempt for p in first] == [1]
        second = wait_receive(pop, "g", "T", 1, 1_000)
        assert [p.attempt for p in second] == [2]
        assert pop.ack("g", "T", first[0].handle) is AckResult.EXPIRED      # spent by the redelivery
        time.sleep(1.1)
        assert pop.receive("g", "T", 1, 1_000) == []           # reconsumed once = max: to the DLQ instead
        assert store.wait_dispatched(10)
        dlq = store.get_message("x", "%DLQ%g", 0, 0, 10).messages
        assert [m.body for m in dlq] == [b"poison"]
    finally:
        pop.shutdown()
        store.close()


def test_change_invisible_duration(tmp_path):
    store, pop = open_pop(tmp_path / "s")
    try:
        put(store, "T", [b"a"])
        p = pop.receive("g", "T", 1, 60_000)[0]
        res, h2 = pop.change_invisible("g", "T", p.handle, 1_000)
        assert res is AckResult.OK and h2 is not None
        assert pop.ack("g", "T", p.handle) is AckResult.EXPIRED            # the old handle is spent
        again = wait_receive(pop, "g", "T", 1, 30_000)
        assert [x.message.body for x in again] == [b"a"] and again[0].attempt == 2
        assert pop.ack("g", "T", again[0].handle) is AckResult.OK
    finally:
        pop.shutdown()
        store.close()


def test_fifo_group_waits_for_ack(tmp_path):
    store, pop = open_pop(tmp_path / "s")
    try:
        put(store, "T", [b"0", b"1", b"2"], __SHARDINGKEY="order-7")
        order = []
        for _ in range(3):
            got = pop.receive("g", "T", 32, 30_000)
            assert len(got) == 1
            assert pop.receive("g", "T", 32, 30_000) == []    # the group's next waits for the ack
            order.append(got[0].message.body)
            assert pop.ack("g", "T", got[0].handle) is AckResult.OK
        assert order == [b"0", b"1", b"2"]
    finally:
        pop.shutdown()
        store.close()


def test_state_survives_restart(tmp_path):
    path = tmp_path / "s"
    store, pop = open_pop(path)
    put(store, "T", [b"m%d" % i for i in range(4)])
    got = pop.receive("g", "T", 32, 2_000)
    assert len(got) == 4
    acked = got[0].message.body
    assert pop.ack("g", "T", got[0].handle) is AckResult.OK
    pop.shutdown()
    store.close()

    store, pop = open_pop(path)
    try:
        put(store, "T", [b"new"])
        first = pop.receive("g", "T", 32, 30_000)
        # the un-acked three are still in flight (invisible) unless their 2 s already ran out
        assert acked not in [p.message.body for p in first]
        seen = [p for p in first]
        end = time.monotonic() + 30
        while len(seen) < 4 and time.monotonic() < end:
            seen += pop.receive("g", "T", 32, 30_000)
            time.sleep(0.05)
        bodies = sorted(p.message.body for p in seen)
        assert bodies == sorted([b"m1", b"m2", b"m3", b"new"])
        assert all(p.attempt == 2 for p in seen if p.message.body != b"new")
    finally:
        pop.shutdown()
        store.close()


def test_torn_last_line_is_ignored(tmp_path, caplog):
    path = tmp_path / "s"
    store, pop = open_pop(path)
    put(store, "T", [b"a", b"b"])
    got = pop.receive("g", "T", 32, 60_000)
    pop.shutdown()
    store.close()
    log = path / "pop" / "popState.log"
    with open(log, "ab") as f:
        f.write(b'{"op":"ack","g":"g","t":"T","q":0,"o":0')       # a crash while writing
    store, pop = open_pop(path)
    try:
        assert "torn" in caplog.text
        assert pop.receive("g", "T", 32, 60_000) == []             # both still in flight
        assert pop.ack("g", "T", got[0].handle) is AckResult.OK
    finally:
        pop.shutdown()
        store.close()


def test_log_compacted_while_running(tmp_path, monkeypatch):
    import rmqstore.messaging.pop as popmod
    monkeypatch.setattr(popmod, "COMPACT_BYTES", 1000)
    store, pop = open_pop(tmp_path / "s")
    try:
        put(store, "T", [b"m%d" % i for i in range(40)])
        got = pop.receive("g", "T", 64, 60_000)
        got += pop.receive("g", "T", 64, 60_000)      # (a read gives at most 32: maxTransferCount)
        assert len(got) == 40
        for p in got[:30]:
            assert pop.ack("g", "T", p.handle) is AckResult.OK
        log = tmp_path / "s" / "pop" / "popState.log"
        big = log.stat().st_size
        pop.tick()
        assert log.stat().st_size < big                          # rewritten: what is in flight only
        assert pop.ack("g", "T", got[30].handle) is AckResult.OK  # state and handles unchanged
    finally:
        pop.shutdown()
        store.close()
    store, pop = open_pop(tmp_path / "s")
    try:
        assert pop.receive("g", "T", 64, 60_000) == []             # the 9 left are still in flight
        assert len(pop.states[("g", "T", 0)].inflight) == 9
    finally:
        pop.shutdown()
        store.close()
