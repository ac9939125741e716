"""Timer messages (rmqstore.store.timer.timer, RIP-43): parked in rmq_sys_wheel_timer by the put-message hook,
delivered to the real topic no earlier than their time, refused when malformed or too far, and kept across
a restart (delivered once after a clean close; store/timer/timer_service.py keeps the progress in RocketMQ 5's
files)."""
from __future__ import annotations

import time

from rmqstore import Message, MessageStore
from rmqstore.store.format.message import PutMessageStatus
from rmqstore.store.timer.timer import TIMER_TOPIC
from store_checks import wait_count


def now_ms() -> int:
    return int(time.time() * 1000)


def test_timer_message_parked_then_delivered_no_earlier(tmp_path):
    with MessageStore.open(tmp_path / "s") as store:
        due = now_ms() + 1500
        r = store.put_message(Message("T", b"late", properties={"TIMER_DELIVER_MS": str(due), "KEYS": "k"}))
        assert r.ok
        now = store.put_message(Message("T", b"now", properties={"TIMER_DELIVER_MS": str(now_ms() - 10)}))
        assert now.ok
        assert store.wait_dispatched(10)
        parked = store.get_message("g", TIMER_TOPIC, 0, 0, 8).messages
        assert [m.properties["REAL_TOPIC"] for m in parked] == ["T"]
        got = wait_count(store, "T", 2)
        assert [m.body for m in got] == [b"now", b"late"]
        late = got[1]
        assert late.store_timestamp >= due
        assert late.properties["KEYS"] == "k" and "REAL_TOPIC" not in late.properties


def test_4x_start_deliver_time_and_relative_delay(tmp_path):
    with MessageStore.open(tmp_path / "s") as store:
        t0 = now_ms()
        assert store.put_message(Message("T", b"a", properties={"__STARTDELIVERTIME": str(t0 + 1000)})).ok
        assert store.put_message(Message("T", b"b", properties={"TIMER_DELAY_SEC": "1"})).ok
        got = wait_count(store, "T", 2)
        assert sorted(m.body for m in got) == [b"a", b"b"]
        assert min(m.store_timestamp for m in got) >= t0 + 1000


def test_bad_or_too_far_timer_refused(tmp_path):
    with MessageStore.open(tmp_path / "s") as store:
        r = store.put_message(Message("T", b"x", properties={"TIMER_DELIVER_MS": "soon"}))
        assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and "TIMER_DELIVER_MS" in (r.reason or "")
        far = now_ms() + 10 * 24 * 3600 * 1000
        r = store.put_message(Message("T", b"x", properties={"TIMER_DELIVER_MS": str(far)}))
        assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and "timerMaxDelaySec" in (r.reason or "")


def test_timer_survives_restart_and_is_delivered_once(tmp_path):
    from rmqstore import StoreConfig
    path = tmp_path / "s"
    cfg = StoreConfig(timer_precision_ms=100)       # the default precision: the tests above
    with MessageStore.open(path, cfg) as store:
        due = now_ms() + 2000       # after the open: a slow open on a loaded machine must not make it due
        assert store.put_message(Message("T", b"t", properties={"TIMER_DELIVER_MS": str(due)})).ok
        assert store.wait_dispatched(10)
        assert store.get_message("g", "T", 0, 0, 8).messages == []
    time.sleep(max(0.0, (due - now_ms()) / 1000))
    with MessageStore.open(path, cfg) as store:
        got = wait_count(store, "T", 1)
        assert [m.body for m in got] == [b"t"]
        assert got[0].store_timestamp >= due
        time.sleep(0.2)
    assert (path / "config" / "timercheck").exists() and (path / "timerwheel").exists()
    with MessageStore.open(path, cfg) as store:
        time.sleep(1.0)                      # the service ran (ten rounds): nothing delivered twice
        assert len(store.get_message("g", "T", 0, 0, 8).messages) == 1


def test_delay_level_and_timer_together_keep_the_real_topic(tmp_path):
    """A message with both DELAY and TIMER_DELIVER_MS: the delay-level hook parks it first; the timer hook
    leaves SCHEDULE_TOPIC_XXXX's REAL_TOPIC alone."""
    with MessageStore.open(tmp_path / "s") as store:
        r = store.put_message(Message("T", b"both", properties={"DELAY": "1", "TIMER_DELIVER_MS": str(now_ms() + 500)}))
        assert r.ok
        got = wait_count(store, "T", 1)
        assert [m.body for m in got] == [b"both"]


def test_delete_message_cancels_a_timer_message_of_its_slot(tmp_path):
    """RocketMQ 5's TIMER_DEL_UNIQKEY: a delete message parked for the same time ({topic}+{UNIQ_KEY})
    cancels that message; the delete message itself is never put; a delete due now is refused."""
    from rmqstore import StoreConfig
    with MessageStore.open(tmp_path / "s", StoreConfig(timer_precision_ms=100)) as store:
        due = str(now_ms() + 4000)      # time enough to link all three in the wheel (a delete works there),
        #                                 also beside other test workers (test_timer_recovery's 1.5 s was not)
        for body, uniq in ((b"cancelled", "u1"), (b"kept", "u2")):
            assert store.put_message(Message("T", body, properties={"TIMER_DELIVER_MS": due, "UNIQ_KEY": uniq})).ok
        assert store.put_message(Message("T", b"del", properties={"TIMER_DELIVER_MS": due, "UNIQ_KEY": "u3",
                                                                  "TIMER_DEL_UNIQKEY": "T+u1"})).ok
        r = store.put_message(Message("T", b"d", properties={"TIMER_DELIVER_MS": str(now_ms() - 1),
                                                             "TIMER_DEL_UNIQKEY": "T+u2"}))
        assert r.status is PutMessageStatus.MESSAGE_ILLEGAL
        wait_count(store, "T", 1)
        time.sleep(0.5)
        assert [m.body for m in store.get_message("g", "T", 0, 0, 8).messages] == [b"kept"]


def test_parked_message_without_real_topic_is_skipped_with_an_error(tmp_path, caplog):
    """A parked message that cannot be delivered (no REAL_TOPIC) is logged, naming it, and does not stop
    the messages behind it."""
    from rmqstore import StoreConfig
    with MessageStore.open(tmp_path / "s", StoreConfig(timer_precision_ms=100)) as store:
        past = str(now_ms() - 1000)
        bad = Message(TIMER_TOPIC, b"bad", properties={"TIMER_OUT_MS": past})
        good = Message(TIMER_TOPIC, b"good", properties={"TIMER_OUT_MS": past, "REAL_TOPIC": "T", "REAL_QID": "0"})
        r_bad, _ = store.put_messages([bad, good], run_hooks=False)
        got = wait_count(store, "T", 1)
        assert [m.body for m in got] == [b"good"]
        assert f"commitlog {r_bad.append_result.wrote_offset}" in caplog.text and "REAL_TOPIC" in caplog.text
