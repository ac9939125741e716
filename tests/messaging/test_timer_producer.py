"""Producer.send(..., deliver_at=...) (messaging/producer.py): a timer message from the library API, with
its argument checked (a naive datetime, too far ahead, with a delay level: errors naming it; past: now)."""
from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from rmqstore import Message, MessageStore, Producer, StoreConfig
from rmqstore.store.timer.timer import TIMER_TOPIC


def test_deliver_at_datetime_and_epoch_ms_arrive_no_earlier(tmp_path):
    with MessageStore.open(tmp_path / "s", StoreConfig(timer_precision_ms=100)) as store:
        p = Producer(store, group="pg")
        at = datetime.now(timezone.utc) + timedelta(milliseconds=1200)
        r1 = p.send("TopicT", b"dt", deliver_at=at)
        at_ms = int(time.time() * 1000) + 900
        r2 = p.send("TopicT", b"ms", tags="tg", deliver_at=at_ms)
        r3 = p.send_message(Message("TopicT", b"built"), deliver_at=at_ms)
        assert r1.msg_id and r2.msg_id and r3.msg_id
        assert store.wait_dispatched(10)
        assert store.get_max_offset_in_queue(TIMER_TOPIC, 0) == 3          # all parked
        got = []
        end = time.monotonic() + 30
        while len(got) < 3 and time.monotonic() < end:
            got = [m for q in range(8) for m in store.get_message("g", "TopicT", q, 0, 8).messages]
            time.sleep(0.05)
        by_body = {m.body: m for m in got}
        assert set(by_body) == {b"dt", b"ms", b"built"}
        assert by_body[b"built"].store_timestamp >= at_ms
        assert by_body[b"dt"].store_timestamp >= int(at.timestamp() * 1000)
        assert by_body[b"ms"].store_timestamp >= at_ms and by_body[b"ms"].tags == "tg"
        assert by_body[b"dt"].properties["UNIQ_KEY"] == r1.msg_id


def test_deliver_at_in_the_past_is_delivered_now(tmp_path):
    with MessageStore.open(tmp_path / "s") as store:
        p = Producer(store, group="pg")
        r = p.send("TopicT", b"late", queue=0, deliver_at=datetime.now(timezone.utc) - timedelta(hours=1))
        assert r.queue_offset == 0
        assert store.wait_dispatched(10)
        [m] = store.get_message("g", "TopicT", 0, 0, 8).messages
        assert "TIMER_DELIVER_MS" not in m.properties and store.get_max_offset_in_queue(TIMER_TOPIC, 0) == 0


def test_bad_deliver_at_is_an_error_naming_it(tmp_path):
    with MessageStore.open(tmp_path / "s") as store:
        p = Producer(store, group="pg")
        with pytest.raises(ValueError, match="deliver_at=.*naive datetime"):
            p.send("TopicT", b"x", deliver_at=datetime.now() + timedelta(seconds=5))
        with pytest.raises(ValueError, match="deliver_at=.*timerMaxDelaySec=259200"):
            p.send("TopicT", b"x", deliver_at=datetime.now(timezone.utc) + timedelta(days=4))
        with pytest.raises(ValueError, match="deliver_at and delay_level"):
            p.send("TopicT", b"x", delay_level=2, deliver_at=int(time.time() * 1000) + 5000)
        for bad in (True, "soon", -5, float("nan"), float("inf")):
            with pytest.raises(ValueError, match="deliver_at="):
                p.send("TopicT", b"x", deliver_at=bad)
        assert store.get_max_offset_in_queue(TIMER_TOPIC, 0) == 0
        assert all(store.get_max_offset_in_queue("TopicT", q) == 0 for q in range(8))
