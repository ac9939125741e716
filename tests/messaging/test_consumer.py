"""Consumer groups: order, filtering, long polling, offsets across restarts and a SIGKILL, rebalancing,
retries and dead letters."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

from rmqstore.store.conf.config import StoreConfig
from rmqstore.messaging.consumer import CONSUME_SUCCESS, RECONSUME_LATER, SUCCESS, SUSPEND_CURRENT_QUEUE_A_MOMENT, ConsumeFromWhere, PullConsumer, PullStatus, PushConsumer, measure_long_polling_latency
from rmqstore.messaging.local_broker import LocalBroker
from rmqstore.messaging.producer import Producer
from rmqstore.store.store import MessageStore
from rmqstore.messaging.topic_config import MessageQueue
from store_checks import wait_until

HERE = Path(__file__).resolve().parents[1]     # tests/: the helpers
REPO = HERE.parent
FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET


def cfg(**kw) -> StoreConfig:
    base = dict(mapped_file_size_commit_log=4 << 20, mapped_file_size_consume_queue=60000,
                message_delay_level=" ".join(["1s"] * 18))
    base.update(kw)
    return StoreConfig(**base)


def topic(store, name: str, queues: int) -> None:
    LocalBroker.of(store).topics.create_topic(name, queues)


def read_offsets(path: Path) -> dict:
    return json.loads((path / "config" / "consumerOffset.json").read_text(encoding="utf-8"))


# --- order -----------------------------------------------------------------------------------------
def test_orderly_consumer_keeps_per_queue_order(store):
    topic(store, "Orders", 4)
    p = Producer(store, "pg")
    sent = defaultdict(list)                           # sharding key -> bodies in send order
    for i in range(160):
        key = f"order-{i % 10}"
        p.send("Orders", f"{key}:{i}", sharding_key=key)
        sent[key].append(f"{key}:{i}")
    seen = defaultdict(list)                           # queue -> offsets as consumed
    by_key = defaultdict(list)
    active: set[int] = set()
    overlap = []
    lock = threading.Lock()

    def listener(msgs, ctx):
        q = msgs[0].queue_id
        with lock:
            if q in active:
                overlap.append(q)
            active.add(q)
        time.sleep(random.random() * 0.002)
        with lock:
            for m in msgs:
                seen[q].append(m.queue_offset)
                by_key[m.body.decode().split(":")[0]].append(m.body.decode())
            active.discard(q)
        return SUCCESS

    c = PushConsumer(store, "orderly-group", listener, orderly=True, consume_thread_nums=4, consume_from_where=FIRST)
    c.subscribe("Orders", "*")
    with c:
        assert wait_until(lambda: sum(len(v) for v in seen.values()) >= 160, 10)
    assert not overlap, "two listener calls ran on one queue at once"
    for q, offs in seen.items():
        assert offs == list(range(store.get_max_offset_in_queue("Orders", q))), q
    assert dict(by_key) == dict(sent)


# --- filtering -------------------------------------------------------------------------------------
def test_tag_expression_filters_and_offsets_move_past_filtered(tmp_path):
    path = tmp_path / "s"
    with MessageStore.open(path, cfg()) as store:
        topic(store, "Tags", 2)
        p = Producer(store, "pg")
        tags = ["TagA", "TagB", "TagC", None]
        for i in range(40):
            p.send("Tags", f"m{i}", tags=tags[i % 4])
        got = []
        c = PushConsumer(store, "tag-group", lambda msgs: got.extend(msgs) or CONSUME_SUCCESS, consume_from_where=FIRST)
        c.subscribe("Tags", "TagA || TagB")
        with c:
            assert wait_until(lambda: len(got) >= 20, 5)
            time.sleep(0.1)
            assert {m.tags for m in got} == {"TagA", "TagB"} and len(got) == 20
            ends = {q: store.get_max_offset_in_queue("Tags", q) for q in (0, 1)}
            assert wait_until(lambda: LocalBroker.of(store).offsets.query_offsets("tag-group", "Tags") == ends, 3)
    assert read_offsets(path)["offsetTable"]["Tags@tag-group"] == {"0": ends[0], "1": ends[1]}


# --- long polling ----------------------------------------------------------------------------------
def test_pull_waits_for_arrival(store):
    topic(store, "LP", 1)
    c = PullConsumer(store, "lp-group")
    mq = MessageQueue("LP", "broker-a", 0)
    t0 = time.monotonic()
    r = c.pull(mq, 0, 32, timeout=0.3)
    assert r.pull_status is PullStatus.NO_NEW_MSG and 0.28 <= time.monotonic() - t0 < 2.0
    p = Producer(store, "pg")
    threading.Timer(0.2, lambda: p.send("LP", b"wake", queue=0)).start()
    t0 = time.monotonic()
    r = c.pull(mq, 0, 32, timeout=10)
    waited = time.monotonic() - t0
    assert r.pull_status is PullStatus.FOUND and r.msg_found_list[0].body == b"wake"
    assert 0.15 <= waited < 1.0, waited                 # woken by the arrival, not the 10 s timeout


def test_short_polling_when_long_polling_is_off(tmp_path):
    with MessageStore.open(tmp_path / "s", cfg(long_polling_enable=False, short_polling_time_mills=400)) as store:
        topic(store, "SP", 1)
        c = PullConsumer(store, "sp-group")
        mq = MessageQueue("SP", "broker-a", 0)
        p = Producer(store, "pg")
        threading.Timer(0.05, lambda: p.send("SP", b"x", queue=0)).start()
        t0 = time.monotonic()
        r = c.pull(mq, 0, 32, timeout=10)
        waited = time.monotonic() - t0
        assert r.pull_status is PullStatus.FOUND and 0.35 <= waited < 2.0, waited
        t0 = time.monotonic()
        r = c.pull(mq, 1, 32, timeout=10)
        assert r.pull_status is PullStatus.NO_NEW_MSG and 0.35 <= time.monotonic() - t0 < 2.0


def test_long_polling_latency(tmp_path):
    result = measure_long_polling_latency(tmp_path / "lat", n=60)
    assert result["n"] == 60
    assert 0 < result["median_ms"] < 20, result        # typically well under 1 ms
    assert result["p99_ms"] >= result["median_ms"]


# --- offsets ---------------------------------------------------------------------------------------
def test_offsets_resume_after_restart(tmp_path):
    path = tmp_path / "s"
    got = []

    def run_consumer(store, expect):
        c = PushConsumer(store, "resume", lambda msgs: got.extend(m.body for m in msgs) or CONSUME_SUCCESS,
                         consume_from_where=FIRST)
        c.subscribe("R", "*")
        with c:
            assert wait_until(lambda: len(got) >= expect, 5)
            time.sleep(0.1)

    with MessageStore.open(path, cfg()) as store:
        topic(store, "R", 2)
        p = Producer(store, "pg")
        for i in range(10):
            p.send("R", f"a{i}")
        run_consumer(store, 10)
    doc = read_offsets(path)
    assert set(doc) == {"offsetTable"}
    assert doc["offsetTable"]["R@resume"] == {"0": 5, "1": 5}
    assert doc["offsetTable"]["%RETRY%resume@resume"] == {"0": 0}
    with MessageStore.open(path, cfg()) as store:
        p = Producer(store, "pg")
        for i in range(10):
            p.send("R", f"b{i}")
        run_consumer(store, 20)
    assert sorted(got) == sorted([f"a{i}".encode() for i in range(10)] + [f"b{i}".encode() for i in range(10)])
    assert read_offsets(path)["offsetTable"]["R@resume"] == {"0": 10, "1": 10}
    assert (path / "config" / "consumerOffset.json.bak").exists()


def test_an_older_commit_finishing_late_does_not_move_the_offset_back(tmp_path):
    """Two consume threads of one queue finish out of order: the one that consumed offset 8 decides to commit 9,
    the one that consumed 9 then commits 10. The offset written last must be 10 (CI once read 9 from
    consumerOffset.json after a clean shutdown: decided under the queue's lock, written outside it)."""
    with MessageStore.open(tmp_path / "s", cfg()) as store:
        topic(store, "R", 1)
        offsets = LocalBroker.of(store).offsets
        real = offsets.commit_offset
        older_writing, newer_writing = threading.Event(), threading.Event()

        def commit_offset(group, t, queue_id, offset):
            if t == "R" and offset == 9:        # the older commit is slow to write: the newer one gets in first,
                older_writing.set()             # if it can
                newer_writing.wait(1.0)
            elif t == "R" and offset == 10:
                newer_writing.set()
            real(group, t, queue_id, offset)

        offsets.commit_offset = commit_offset
        c = PushConsumer(store, "late", lambda msgs: CONSUME_SUCCESS, consume_from_where=FIRST)
        c.subscribe("R", "*")
        with c:
            assert wait_until(lambda: MessageQueue("R", c.broker.broker_name, 0) in c._pqs, 5)
            pq = c._pqs[MessageQueue("R", c.broker.broker_name, 0)]
            older = threading.Thread(target=c._commit, args=(pq, 9))
            older.start()
            assert older_writing.wait(5)
            newer = threading.Thread(target=c._commit, args=(pq, 10))
            newer.start()
            older.join(5)
            newer.join(5)
            assert offsets.query_offset("late", "R", 0) == 10


def test_rocketmq_written_offset_file_is_read(tmp_path):
    """fastjson writes Integer keys unquoted; consumption resumes from such a file."""
    path = tmp_path / "s"
    with MessageStore.open(path, cfg()) as store:
        topic(store, "F", 1)
        p = Producer(store, "pg")
        for i in range(5):
            p.send("F", f"m{i}", queue=0)
    (path / "config" / "consumerOffset.json").write_text(
        '{\n\t"offsetTable":{\n\t\t"F@fj":{0:3\n\t\t}\n\t}\n}', encoding="utf-8")
    with MessageStore.open(path, cfg()) as store:
        got = []
        c = PushConsumer(store, "fj", lambda msgs: got.extend(m.body for m in msgs) or CONSUME_SUCCESS,
                         consume_from_where=FIRST)
        c.subscribe("F", "*")
        with c:
            assert wait_until(lambda: len(got) >= 2, 5)
            time.sleep(0.1)
        assert got == [b"m3", b"m4"]
    assert read_offsets(path)["offsetTable"]["F@fj"] == {"0": 5}


def test_consume_from_where_for_new_groups(store):
    topic(store, "W", 1)
    p = Producer(store, "pg")
    for i in range(3):
        p.send("W", f"old{i}", queue=0)
    store.wait_dispatched()
    time.sleep(0.01)
    ts = int(time.time() * 1000)
    time.sleep(0.01)
    p.send("W", "mid", queue=0)
    store.wait_dispatched()
    results = {}
    for name, how in (("first", ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET),
                      ("last", ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET),
                      ("ts", ConsumeFromWhere.CONSUME_FROM_TIMESTAMP)):
        got = []
        c = PushConsumer(store, f"g-{name}", lambda msgs, got=got: got.extend(m.body for m in msgs) or CONSUME_SUCCESS,
                         consume_from_where=how, consume_timestamp=ts)
        c.subscribe("W", "*")
        c.start()
        results[name] = got
        results[name + "_c"] = c
    p.send("W", "new", queue=0)
    assert wait_until(lambda: len(results["first"]) == 5 and len(results["last"]) == 1 and len(results["ts"]) == 2, 5)
    for name in ("first", "last", "ts"):
        results[name + "_c"].shutdown()
    assert results["first"] == [b"old0", b"old1", b"old2", b"mid", b"new"]
    assert results["last"] == [b"new"]
    assert results["ts"] == [b"mid", b"new"]


# --- rebalancing -----------------------------------------------------------------------------------
def test_two_instances_share_queues_and_one_takes_over(store):
    topic(store, "Shared", 4)
    got = {"a": [], "b": []}
    lock = threading.Lock()

    def make(name):
        def on(msgs):
            with lock:
                got[name].extend((m.queue_id, m.body) for m in msgs)
            return CONSUME_SUCCESS
        c = PushConsumer(store, "shared-group", on, consume_from_where=FIRST)
        c.subscribe("Shared", "*")
        return c

    a, b = make("a").start(), make("b").start()
    qa = [mq.queue_id for mq in a.assigned_queues if mq.topic == "Shared"]
    qb = [mq.queue_id for mq in b.assigned_queues if mq.topic == "Shared"]
    assert sorted(qa + qb) == [0, 1, 2, 3] and len(qa) == 2 and len(qb) == 2
    # the retry queue of the group goes to exactly one of them
    assert sum(mq.topic == "%RETRY%shared-group" for c in (a, b) for mq in c.assigned_queues) == 1
    p = Producer(store, "pg")
    for i in range(40):
        p.send("Shared", f"first-{i}", queue=i % 4)
    assert wait_until(lambda: len(got["a"]) + len(got["b"]) >= 40, 5)
    assert {q for q, _ in got["a"]} == set(qa) and {q for q, _ in got["b"]} == set(qb)
    b.shutdown()
    assert [mq.queue_id for mq in a.assigned_queues if mq.topic == "Shared"] == [0, 1, 2, 3]
    for i in range(40):
        p.send("Shared", f"second-{i}", queue=i % 4)
    assert wait_until(lambda: sum(body.startswith(b"second") for _, body in got["a"]) >= 40, 5)
    a.shutdown()
    bodies = [body for _, body in got["a"] + got["b"]]
    for i in range(40):
        assert f"first-{i}".encode() in bodies and f"second-{i}".encode() in bodies
    assert not any(body.startswith(b"second") for _, body in got["b"])
    offsets = LocalBroker.of(store).offsets.query_offsets("shared-group", "Shared")
    assert offsets == {0: 20, 1: 20, 2: 20, 3: 20}


# --- retries and dead letters ----------------------------------------------------------------------
def test_failing_listener_retries_then_dead_letter(store):
    topic(store, "Retry", 1)
    calls = defaultdict(list)
    lock = threading.Lock()

    def listener(msgs):
        m = msgs[0]
        with lock:
            calls[m.body].append((time.monotonic(), m.topic, m.reconsume_times, dict(m.properties)))
        if m.body == b"poison":
            raise RuntimeError("cannot handle it")
        if m.body == b"flaky" and m.reconsume_times == 0:
            return RECONSUME_LATER
        return CONSUME_SUCCESS

    c = PushConsumer(store, "retry-group", listener, max_reconsume_times=2, consume_from_where=FIRST)
    c.subscribe("Retry", "*")
    p = Producer(store, "pg")
    with c:
        for body in (b"ok", b"flaky", b"poison"):
            p.send("Retry", body, tags="T", queue=0)
        assert wait_until(lambda: store.get_max_offset_in_queue("%DLQ%retry-group", 0) == 1, 8), calls
        time.sleep(0.2)
    # at least once: "ok" once, "flaky" twice (the retry succeeded), "poison" 1 + 2 retries
    assert len(calls[b"ok"]) == 1 and len(calls[b"flaky"]) == 2 and len(calls[b"poison"]) == 3
    t_first, topic1, rt1, props1 = calls[b"flaky"][0]
    t_retry, topic2, rt2, props2 = calls[b"flaky"][1]
    assert (rt1, rt2) == (0, 1) and topic2 == "Retry"                # the retry topic is hidden from the listener
    assert t_retry - t_first >= 0.95                                   # delay level 3 (1 s here)
    assert props2["RETRY_TOPIC"] == "Retry" and props2["DELAY"] == "3" and props2["WAIT"] == "false"
    flaky_origin = store.get_message("g", "Retry", 0, 1, 1).messages[0]
    assert flaky_origin.body == b"flaky" and props2["ORIGIN_MESSAGE_ID"] == flaky_origin.msg_id
    assert [rt for _, _, rt, _ in calls[b"poison"]] == [0, 1, 2]
    dlq = store.get_message("g", "%DLQ%retry-group", 0, 0, 10).messages
    assert len(dlq) == 1 and dlq[0].body == b"poison" and dlq[0].reconsume_times == 3
    assert dlq[0].properties["RETRY_TOPIC"] == "Retry"
    origin = store.get_message("g", "Retry", 0, 2, 1).messages[0]
    assert dlq[0].properties["ORIGIN_MESSAGE_ID"] == origin.msg_id
    retry_msgs = store.get_message("g", "%RETRY%retry-group", 0, 0, 10).messages
    assert sorted(m.body for m in retry_msgs) == [b"flaky", b"poison", b"poison"]
    topics = LocalBroker.of(store).topics
    assert topics.select("%DLQ%retry-group").perm == 2 and topics.select("%DLQ%retry-group").write_queue_nums == 1
    assert topics.select("%RETRY%retry-group").perm == 6
    offs = LocalBroker.of(store).offsets
    assert offs.query_offset("retry-group", "Retry", 0) == 3
    assert offs.query_offset("retry-group", "%RETRY%retry-group", 0) == 3


def test_orderly_failure_retries_the_same_message_locally(store):
    topic(store, "Seq", 1)
    p = Producer(store, "pg")
    for i in range(5):
        p.send("Seq", str(i), queue=0)
    order = []

    def listener(msgs):
        m = msgs[0]
        order.append((int(m.body), m.reconsume_times))
        if m.body == b"2" and m.reconsume_times < 2:
            return SUSPEND_CURRENT_QUEUE_A_MOMENT
        return SUCCESS

    c = PushConsumer(store, "seq-group", listener, orderly=True, suspend_current_queue_time_millis=100,
                     consume_from_where=FIRST)
    c.subscribe("Seq", "*")
    t0 = time.monotonic()
    with c:
        assert wait_until(lambda: len(order) >= 7, 5)
        elapsed = time.monotonic() - t0
    assert order == [(0, 0), (1, 0), (2, 0), (2, 1), (2, 2), (3, 0), (4, 0)]
    assert elapsed >= 0.2                                                  # suspended twice for 100 ms
    assert store.get_max_offset_in_queue("%RETRY%seq-group", 0) == 0       # nothing sent back
    assert LocalBroker.of(store).offsets.query_offset("seq-group", "Seq", 0) == 5


def test_pull_consumer_poll_and_commit(tmp_path):
    path = tmp_path / "s"
    with MessageStore.open(path, cfg()) as store:
        topic(store, "P", 2)
        p = Producer(store, "pg")
        for i in range(6):
            p.send("P", f"m{i}", queue=i % 2)
        c = PullConsumer(store, "poller", consume_from_where=FIRST)
        c.subscribe("P", "*")
        c.start()
        assert [mq.queue_id for mq in c.assigned_queues] == [0, 1]
        got = []
        while len(got) < 6:
            batch = c.poll(timeout=2)
            assert batch
            got.extend(m.body for m in batch)
        assert c.poll(timeout=0.2) == []
        c.shutdown()
        assert sorted(got) == [f"m{i}".encode() for i in range(6)]
    assert read_offsets(path)["offsetTable"]["P@poller"] == {"0": 3, "1": 3}


# --- a consumer process killed with SIGKILL --------------------------------------------------------
def test_sigkill_redelivers_only_uncommitted(tmp_path):
    path = tmp_path / "s"
    total = 240
    with MessageStore.open(path, cfg()) as store:
        topic(store, "K", 2)
        p = Producer(store, "pg")
        for i in range(total):
            p.send("K", f"m{i}", queue=i % 2)
    log_path = tmp_path / "child.log"
    env = dict(os.environ, PYTHONPATH=str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = subprocess.Popen([sys.executable, str(HERE / "consumer_child.py"), str(path), "kgroup", "K", str(log_path),
                              "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        def processed_lines():
            return log_path.read_text().splitlines() if log_path.exists() else []
        ok = wait_until(lambda: len(processed_lines()) >= 80 or child.poll() is not None, 20, 0.01)
        assert ok and child.poll() is None, child.stderr.read().decode() if child.poll() is not None else "too slow"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    committed = {int(q): o for q, o in read_offsets(path)["offsetTable"]["K@kgroup"].items()}
    processed = set()
    for line in log_path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:
            processed.add((int(parts[0]), int(parts[1])))
    assert len(processed) < total                       # killed mid-way
    per_queue = total // 2
    for q in (0, 1):
        # committed means consumed: everything below the committed offset was processed
        assert all((q, o) in processed for o in range(committed.get(q, 0)))
    redelivered = []
    with MessageStore.open(path, cfg()) as store:       # recovers the killed process's store
        c = PushConsumer(store, "kgroup", lambda msgs: redelivered.extend((m.queue_id, m.queue_offset) for m in msgs)
                         or CONSUME_SUCCESS, consume_from_where=FIRST)
        c.subscribe("K", "*")
        with c:
            need = sum(per_queue - committed.get(q, 0) for q in (0, 1))
            assert wait_until(lambda: len(redelivered) >= need, 10)
            time.sleep(0.1)
    # the second run starts exactly at the committed offsets and delivers the rest once each
    for q in (0, 1):
        assert sorted(o for qq, o in redelivered if qq == q) == list(range(committed.get(q, 0), per_queue))
    again = processed & set(redelivered)
    uncommitted = {(q, o) for q, o in processed if o >= committed.get(q, 0)}
    assert again == uncommitted                         # re-delivered: exactly what was not committed
    assert len(again) <= 2 * 40                         # a few hundred ms of work at most
    assert processed | set(redelivered) == {(q, o) for q in (0, 1) for o in range(per_queue)}


def test_consumer_picks_up_a_topic_created_after_it_started(store):
    got = []
    c = PushConsumer(store, "early-group", lambda msgs: got.extend(m.body for m in msgs) or CONSUME_SUCCESS,
                     consume_from_where=FIRST)
    c.subscribe("Later", "*")
    with c:
        assert [mq for mq in c.assigned_queues if mq.topic == "Later"] == []
        Producer(store, "pg").send("Later", b"auto-created")          # 4 queues, created on send
        assert wait_until(lambda: got == [b"auto-created"], 5)
        assert [mq.queue_id for mq in c.assigned_queues if mq.topic == "Later"] == [0, 1, 2, 3]
        LocalBroker.of(store).topics.create_topic("Later", 6)         # more queues: rebalanced too
        assert wait_until(lambda: len([mq for mq in c.assigned_queues if mq.topic == "Later"]) == 6, 5)


def test_two_offset_writers_side_by_side_leave_the_newest_table(tmp_path, monkeypatch):
    """The periodic persister and a consumer leaving both write consumerOffset.json: the one holding the
    older table was slow to write, the newer one wrote first, the older one last; dirty() then said all was
    written and nothing wrote it again. One writer at a time now: the file ends with the newest table."""
    from rmqstore.messaging import offset_store
    m = offset_store.ConsumerOffsetManager(tmp_path)
    real = offset_store.string_to_file
    older_writing, newer_tried = threading.Event(), threading.Event()

    def string_to_file(text, path, decode):
        if json.loads(text)["offsetTable"]["T@g"]["0"] == 1:    # the older table: slow, the newer tries meanwhile
            older_writing.set()
            newer_tried.wait(1.0)
        real(text, path, decode)

    monkeypatch.setattr(offset_store, "string_to_file", string_to_file)
    m.commit_offset("g", "T", 0, 1)
    older = threading.Thread(target=m.persist)
    older.start()
    assert older_writing.wait(5)
    m.commit_offset("g", "T", 0, 2)
    newer = threading.Thread(target=m.persist)
    newer.start()
    time.sleep(0.2)
    newer_tried.set()
    older.join(5)
    newer.join(5)
    assert not m.dirty()
    assert read_offsets(tmp_path)["offsetTable"]["T@g"] == {"0": 2}
