"""Issue 21's remaining admin requests against a real `rmqstore serve` process: consumerStatus
(GET_CONSUMER_RUNNING_INFO forwarded by the broker to the client and its ConsumerRunningInfo relayed),
cleanExpiredCQ (CLEAN_EXPIRED_CONSUMEQUEUE), cleanUnusedTopic (CLEAN_UNUSED_TOPIC), and the broker
configuration persisted by updateBrokerConfig read back at the next start. Expected bodies, field names and
remarks as RocketMQ 4.4.0 writes them (ConsumerRunningInfo, ProcessQueueInfo, ConsumeStatus,
AdminBrokerProcessor.callConsumer, ClientRemotingProcessor.getConsumerRunningInfo)."""
from __future__ import annotations

import re
import subprocess
import sys
import threading
import time

import pytest

from rmqstore import Message as StoreMessage
from rmqstore import MessageStore, StoreConfig
from rmqstore.broker.server import ServerProcess
from rmqstore.client import Admin, ConsumeFromWhere, ConsumeStatus, Message, Producer, PushConsumer
from rmqstore.client.message import MQBrokerError
from rmqstore.client.running_info import answer_running_info
from rmqstore.remoting.codes import RequestCode, ResponseCode
from rmqstore.remoting.command import RemotingCommand
from rmqstore.store.durability.cleanup import clean_store
from store_checks import raw_request, wait_until

CONF = {"mappedFileSizeCommitLog": 8 * 1024 * 1024, "mappedFileSizeConsumeQueue": 20 * 30000,
        "maxHashSlotNum": 5000, "maxIndexNum": 20000, "brokerClusterName": "OpsCluster", "brokerName": "ops-b"}
TOPIC, GROUP, SENT, QUEUES = "StatusTopic", "status_cg", 40, 4

RUNNING_INFO_KEYS = {"mqTable", "properties", "statusTable", "subscriptionSet"}
PROCESS_QUEUE_INFO_KEYS = {"commitOffset", "cachedMsgMinOffset", "cachedMsgMaxOffset", "cachedMsgCount",
                           "cachedMsgSizeInMiB", "transactionMsgMinOffset", "transactionMsgMaxOffset",
                           "transactionMsgCount", "locked", "tryUnlockTimes", "lastLockTimestamp", "droped",
                           "lastPullTimestamp", "lastConsumeTimestamp"}
CONSUME_STATUS_KEYS = {"pullRT", "pullTPS", "consumeRT", "consumeOKTPS", "consumeFailedTPS", "consumeFailedMsgs"}
PROP_KEYS = {"PROP_NAMESERVER_ADDR", "PROP_THREADPOOL_CORE_SIZE", "PROP_CONSUMEORDERLY", "PROP_CONSUME_TYPE",
             "PROP_CLIENT_VERSION", "PROP_CONSUMER_START_TIMESTAMP"}


HUNG_TEST = "test_consumer_running_info_of_a_hung_or_old_client"


class _HungClientCalls:
    """GET_CONSUMER_RUNNING_INFO of a client too old to be asked and of a hung one (it never answers: the
    broker waits its whole 10 s), sent from a thread with an Admin of its own, so that the other tests of the
    module run during the wait; result() joins it."""

    def __init__(self, server):
        self.answers: dict = {}
        self.error: BaseException | None = None
        self.mute = _MuteConsumer(server.broker_addr, "mute_cg", "10.9.9.9@mute", 293)
        self.old = _MuteConsumer(server.broker_addr, "old_cg", "10.9.9.9@old", 10)
        self.thread = threading.Thread(target=self._run, args=(server,), daemon=True)
        self.thread.start()

    def _run(self, server) -> None:
        try:
            with Admin(server.namesrv_addr) as admin:
                for name in ("old", "mute"):
                    self.answers[name] = raw_request(
                        admin, server.broker_addr, RequestCode.GET_CONSUMER_RUNNING_INFO,
                        {"consumerGroup": f"{name}_cg", "clientId": f"10.9.9.9@{name}", "jstackEnable": "false"})
        except BaseException as e:        # handed to the test
            self.error = e

    def result(self) -> dict:
        self.thread.join(60)
        assert not self.thread.is_alive(), "GET_CONSUMER_RUNNING_INFO of the hung client never answered"
        if self.error is not None:
            raise self.error
        return self.answers

    def close(self) -> None:
        self.thread.join(60)
        self.mute.close()
        self.old.close()


@pytest.fixture(scope="module", autouse=True)
def hung_client_calls(request):
    """Started with the module's first test when HUNG_TEST is to run (it is the module's last)."""
    if not any(item.name == HUNG_TEST and item.module is request.module for item in request.session.items):
        yield None
        return
    calls = _HungClientCalls(request.getfixturevalue("server"))
    try:
        yield calls
    finally:
        calls.close()


@pytest.fixture(scope="module")
def live_consumer(server, admin):
    """A push consumer of GROUP on TOPIC that consumed all SENT messages and committed them."""
    admin.create_topic(TOPIC, QUEUES)
    with Producer("status_pg", server.namesrv_addr) as p:
        for i in range(SENT):
            p.send(Message(TOPIC, b"s%02d" % i))
    seen = []
    lock = threading.Lock()

    def listener(msgs):
        with lock:
            seen.extend(msgs)
        return ConsumeStatus.CONSUME_SUCCESS
    c = PushConsumer(GROUP, server.namesrv_addr, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    c.subscribe(TOPIC, "*")
    c.register_message_listener(listener)
    c.start()
    try:
        assert wait_until(lambda: len(seen) == SENT, 60), len(seen)
        c.persist_offsets()
        yield c
    finally:
        c.shutdown()


def _client_id(admin) -> str:
    conns = admin.consumer_connection(GROUP)["connectionSet"]
    assert len(conns) == 1
    return conns[0]["clientId"]


# --- consumerStatus ------------------------------------------------------------------------------------
def test_consumer_running_info_relayed_from_the_client(server, admin, live_consumer):
    client_id = _client_id(admin)
    assert client_id == live_consumer.mq.client_id
    before = int(time.time() * 1000)
    info = admin.consumer_running_info(GROUP, client_id)
    assert set(info) == RUNNING_INFO_KEYS
    props = info["properties"]
    assert PROP_KEYS <= set(props)
    assert props["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY" and props["PROP_CLIENT_VERSION"] == "V4_4_0"
    assert props["PROP_CONSUMEORDERLY"] == "false" and props["consumerGroup"] == GROUP
    assert props["PROP_NAMESERVER_ADDR"] == server.namesrv_addr + ";"
    assert 0 < int(props["PROP_CONSUMER_START_TIMESTAMP"]) <= before
    assert {sd["topic"] for sd in info["subscriptionSet"]} == {TOPIC, f"%RETRY%{GROUP}"}
    assert set(info["statusTable"]) == {TOPIC, f"%RETRY%{GROUP}"}
    assert all(set(st) == CONSUME_STATUS_KEYS for st in info["statusTable"].values())
    mine = {k["queueId"]: v for k, v in info["mqTable"].items() if k["topic"] == TOPIC}
    assert sorted(mine) == list(range(QUEUES))
    assert all(set(v) == PROCESS_QUEUE_INFO_KEYS for v in info["mqTable"].values())
    # every message consumed: the commit offsets add up to what was sent, nothing is cached
    assert sum(v["commitOffset"] for v in mine.values()) == SENT
    assert all(v["cachedMsgCount"] == 0 and v["droped"] is False and v["lastPullTimestamp"] > 0
               for v in mine.values())
    # the body itself: fastjson's field order, MessageQueue keys as objects
    r = raw_request(admin, server.broker_addr, RequestCode.GET_CONSUMER_RUNNING_INFO,
             {"consumerGroup": GROUP, "clientId": client_id, "jstackEnable": "false"})
    assert r.code == ResponseCode.SUCCESS
    assert r.body.startswith(b'{"mqTable":{{"brokerName":"ops-b","queueId":')


def test_consumer_running_info_of_a_client_not_online(server, admin, live_consumer):
    r = raw_request(admin, server.broker_addr, RequestCode.GET_CONSUMER_RUNNING_INFO,
             {"consumerGroup": GROUP, "clientId": "10.0.0.1@nobody", "jstackEnable": "false"})
    assert r.code == ResponseCode.SYSTEM_ERROR
    assert r.remark == f"The Consumer <{GROUP}> <10.0.0.1@nobody> not online"
    with pytest.raises(MQBrokerError) as e:
        admin._broker_json(server.broker_addr, RequestCode.GET_CONSUMER_RUNNING_INFO,
                           {"consumerGroup": "nobody_cg_at_all", "clientId": "x@y"})
    assert e.value.remark == "The Consumer <nobody_cg_at_all> <x@y> not online"


def test_client_answer_for_a_group_it_does_not_have():
    """ClientRemotingProcessor.getConsumerRunningInfo's answer when the group is not in this client."""
    cmd = RemotingCommand.request(RequestCode.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": "g0", "clientId": "c"})
    r = answer_running_info({}, cmd)
    assert r.code == ResponseCode.SYSTEM_ERROR and r.opaque == cmd.opaque
    assert r.remark == "The Consumer Group <g0> not exist in this consumer"


def _cli(server, *argv) -> tuple[int, str]:
    import contextlib
    import io

    from rmqstore.tools import cli
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.main(["admin", argv[0], "-n", server.namesrv_addr, *argv[1:]])
    return rc, out.getvalue()


def test_cli_consumer_status(server, admin, live_consumer):
    client_id = _client_id(admin)
    rc, text = _cli(server, "consumerStatus", "-g", GROUP)
    assert rc == 0, text
    first = text.splitlines()[0].split()
    assert first[:3] == ["001", client_id, "V4_4_0"]
    assert "Same subscription in the same group of consumer" in text and "Rebalance OK" in text
    rc, text = _cli(server, "consumerStatus", "-g", GROUP, "-i", client_id)
    assert rc == 0
    assert text.startswith("#Consumer Properties#\n")
    for head in ("#Consumer Subscription#", "#Consumer Offset#", "#Consumer MQ Detail#", "#Consumer RT&TPS#"):
        assert head in text
    rows = [ln.split() for ln in text.split("#Consumer Offset#")[1].split("#Consumer MQ Detail#")[0].splitlines()
            if ln.startswith(TOPIC)]
    assert len(rows) == QUEUES and sum(int(r[3]) for r in rows) == SENT


def _cli_process(server, *argv) -> str:
    """`rmqstore admin ...` in its own process (this process's client instance serves the module's server)."""
    p = subprocess.run([sys.executable, "-m", "rmqstore", "admin", argv[0], "-n", server.namesrv_addr, *argv[1:]],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout


# --- cleanUnusedTopic / cleanExpiredCQ ------------------------------------------------------------------
def test_delete_topic_removes_its_consume_queues(server, admin):
    keep, gone = "KeepTopic", "GoneTopic2"
    admin.create_topic(keep, 2)
    admin.create_topic(gone, 2)
    with Producer("clean_pg", server.namesrv_addr) as p:
        for i in range(10):
            p.send(Message(keep, b"k"))
            p.send(Message(gone, b"u"))
    cq_root = server.store / "consumequeue"
    assert wait_until(lambda: (cq_root / gone).is_dir() and (cq_root / keep).is_dir(), 15)
    admin.delete_topic(gone)
    assert not (cq_root / gone).exists()
    assert sorted(p.name for p in (cq_root / keep).iterdir()) == ["0", "1"]
    assert sum(o["maxOffset"] for o in admin.topic_stats(keep).values()) == 10


def test_clean_unused_topic_removes_queues_of_topics_without_config(tmp_path):
    """Topics written through the library have no topic config: cleanUnusedTopic removes their queues; the
    topics with a config and the delay topic (SCHEDULE_TOPIC_XXXX) keep theirs."""
    store = tmp_path / "store"
    cfg = StoreConfig().update({k: str(v) for k, v in CONF.items() if k.startswith(("mapped", "max"))})
    with MessageStore.open(store, cfg) as st:
        for i in range(5):
            st.put_message(StoreMessage("LibTopic", b"l%d" % i))
        st.put_message(StoreMessage("LibTopic", b"later", properties={"DELAY": "18"}))   # 2 h: stays parked
        assert st.wait_dispatched(30)
    cq_root = store / "consumequeue"
    assert (cq_root / "LibTopic").is_dir() and (cq_root / "SCHEDULE_TOPIC_XXXX").is_dir()
    with ServerProcess(store, CONF) as srv, Admin(srv.namesrv_addr, instance_name="own-unused") as admin:
        admin.create_topic("ConfTopic", 1)
        with Producer("clean_pg", srv.namesrv_addr, instance_name="own-unused-p") as p:
            for i in range(3):
                p.send(Message("ConfTopic", b"c"))
        assert wait_until(lambda: (cq_root / "ConfTopic").is_dir(), 15)
        r = raw_request(admin, srv.broker_addr, RequestCode.CLEAN_UNUSED_TOPIC)
        assert r.code == ResponseCode.SUCCESS and r.remark is None and not r.body
        assert not (cq_root / "LibTopic").exists()
        assert (cq_root / "ConfTopic" / "0").is_dir() and (cq_root / "SCHEDULE_TOPIC_XXXX").is_dir()
        assert sum(o["maxOffset"] for o in admin.topic_stats("ConfTopic").values()) == 3
        assert _cli_process(srv, "cleanUnusedTopic", "-b", srv.broker_addr) == "success"


def _expired_store(path) -> None:
    """A store whose OldTopic messages are all in commitlog files since deleted: OldTopic's consume queue
    points only below the commitlog's min offset; NewTopic's messages are still there."""
    cfg = StoreConfig().update({k: str(v) for k, v in CONF.items() if k.startswith(("mapped", "max"))})
    cfg.mapped_file_size_commit_log = 64 * 1024
    with MessageStore.open(path, cfg) as st:
        for _ in range(20):
            st.put_message(StoreMessage("OldTopic", b"o" * 1000, queue_id=0))
        for _ in range(300):
            st.put_message(StoreMessage("NewTopic", b"n" * 1000, queue_id=0))
        assert st.wait_dispatched(30)
        done = clean_store(st, force=True)
        assert done["commitlog_files_deleted"] >= 4
        assert st.consume_queues.find("OldTopic", 0).get_last_offset() < st.get_min_phy_offset()
    return cfg


def test_clean_expired_cq_removes_queues_below_the_commitlog(tmp_path):
    store = tmp_path / "store"
    cfg = _expired_store(store)
    conf = dict(CONF, mappedFileSizeCommitLog=cfg.mapped_file_size_commit_log)
    with ServerProcess(store, conf) as srv, Admin(srv.namesrv_addr, instance_name="own-expired") as admin:
        assert (store / "consumequeue" / "OldTopic" / "0").is_dir()
        r = raw_request(admin, srv.broker_addr, RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE)
        assert r.code == ResponseCode.SUCCESS and r.remark is None and not r.body
        assert not (store / "consumequeue" / "OldTopic").exists()
        assert (store / "consumequeue" / "NewTopic" / "0").is_dir()
        r = raw_request(admin, srv.broker_addr, RequestCode.GET_MAX_OFFSET, {"topic": "NewTopic", "queueId": 0})
        assert int(r.field("offset")) == 300
        r = raw_request(admin, srv.broker_addr, RequestCode.GET_MAX_OFFSET, {"topic": "OldTopic", "queueId": 0})
        assert int(r.field("offset")) == 0
        assert _cli_process(srv, "cleanExpiredCQ", "-c", "OpsCluster") == "success"


def test_clean_expired_cq_library_keeps_live_queues(tmp_path):
    """The store function itself: the delay topic and queues with messages left are kept; a queue written
    again after its removal starts over at queue offset 0 (RocketMQ's removeQueueFromTopicQueueTable)."""
    from rmqstore.store.consumequeue.queue_clean import clean_expired_consumer_queue
    store = tmp_path / "store"
    cfg = _expired_store(store)
    with MessageStore.open(store, cfg) as st:
        assert clean_expired_consumer_queue(st) == [("OldTopic", 0)]
        assert clean_expired_consumer_queue(st) == []
        assert st.get_max_offset_in_queue("NewTopic", 0) == 300
        r = st.put_message(StoreMessage("OldTopic", b"again", queue_id=0))
        assert r.append_result.logics_offset == 0
        assert st.wait_dispatched(30)
        assert st.get_max_offset_in_queue("OldTopic", 0) == 1


# --- the persisted broker configuration ---------------------------------------------------------------
def test_update_broker_config_survives_a_restart(tmp_path):
    store = tmp_path / "store"
    conf = dict(CONF, fileReservedTime=72, shortPollingTimeMills=1000)
    with ServerProcess(store, conf) as srv, Admin(srv.namesrv_addr, instance_name="own-conf1") as admin:
        admin.update_broker_config(srv.broker_addr, {"fileReservedTime": "48", "shortPollingTimeMills": "1500"})
    assert "fileReservedTime=48\n" in (store / "config" / "broker.properties").read_text()
    # the next start: broker.conf says 72 / 1000, the persisted update says 48 / 1500 and wins
    with ServerProcess(store, conf) as srv, Admin(srv.namesrv_addr, instance_name="own-conf2") as admin:
        got = admin.broker_config(srv.broker_addr)
        assert got["fileReservedTime"] == "48" and got["shortPollingTimeMills"] == "1500"
        # keys that are not changeable at run time come from broker.conf (the command line) as before
        assert got["listenPort"] == str(srv.listen_port) and got["brokerName"] == "ops-b"


def test_bad_persisted_broker_config_stops_the_start(tmp_path):
    store = tmp_path / "store"
    (store / "config").mkdir(parents=True)
    path = store / "config" / "broker.properties"
    path.write_text("fileReservedTime=-1\n")
    p = subprocess.run([sys.executable, "-m", "rmqstore.broker.server", str(store)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2
    assert "fileReservedTime" in p.stderr and str(path) in p.stderr, p.stderr


def test_cli_get_consumer_config(server, admin):
    admin.create_subscription_group(server.broker_addr, "cfg_cg", retryMaxTimes=7)
    rc, text = _cli(server, "getConsumerConfig", "-g", "cfg_cg")
    assert rc == 0
    lines = text.splitlines()
    assert lines[0] == "=============================OpsCluster:ops-b============================="
    assert "retryMaxTimes                           =  7" in lines and \
        "consumeEnable                           =  true" in lines
    assert _cli(server, "getConsumerConfig", "-g", "no_such_cg")[1] == ""


class _MuteConsumer:
    """A raw connection that registers as a consumer with HEART_BEAT and then never answers the broker's
    requests (a hung client), with the remoting version it claims."""

    def __init__(self, broker_addr: str, group: str, client_id: str, version: int):
        import json
        import socket

        from rmqstore.remoting.command import FrameDecoder
        host, port = broker_addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        body = json.dumps({"clientID": client_id, "producerDataSet": [], "consumerDataSet": [
            {"groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
             "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "subscriptionDataSet": [], "unitMode": False}]})
        hb = RemotingCommand.request(RequestCode.HEART_BEAT, body=body.encode(), version=version)
        self.sock.sendall(hb.encode())
        dec = FrameDecoder()
        while True:
            got = [c for c in dec.feed(self.sock.recv(65536)) if c.is_response and c.opaque == hb.opaque]
            if got:
                assert got[0].code == ResponseCode.SUCCESS, got[0]
                return

    def close(self) -> None:
        self.sock.close()


_DELETE_AND_DIE = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from rmqstore import Message, MessageStore
from store_checks import small_config
st = MessageStore.open({root!r}, small_config())
for i in range(3000):
    assert st.put_message(Message("T%d" % (i % 2), b"old" * 30, queue_id=0)).ok
st.wait_dispatched()
st.delete_topic("T1")
for i in range(50):
    assert st.put_message(Message("T%d" % (i % 2), b"new" * 30, queue_id=0)).ok
st.wait_dispatched()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_topic_deleted_and_written_again_recovers_without_false_damage(tmp_path, caplog):
    """deleteTopic, then new messages to the topic (its queue starts over at 0), then SIGKILL: the reopen
    re-dispatches the old records too. They are already below the new queue's end: no damage reported
    (their queue offsets lie far past the new queue's end, which once read as damaged QUEUEOFFSET
    fields), the new queue keeps exactly the new messages, and the next put continues it."""
    import os
    root = tmp_path / "store"
    proc = subprocess.run([sys.executable, "-c", _DELETE_AND_DIE.format(
        tests=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), root=str(root))], capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    from store_checks import small_config
    with caplog.at_level("WARNING"):
        with MessageStore.open(root, small_config()) as s:
            assert not s.recovery_report.clean_shutdown
            assert s.recovery_report.redispatched_messages > 0
            assert not s.failures.failures(), [str(f) for f in s.failures.failures()]
            assert (s.get_min_offset_in_queue("T1", 0), s.get_max_offset_in_queue("T1", 0)) == (0, 25)
            got = s.get_message("G", "T1", 0, 0, 32)
            assert [m.body[:3] for m in got.messages] == [b"new"] * 25
            assert [m.queue_offset for m in got.messages] == list(range(25))
            assert s.get_max_offset_in_queue("T0", 0) == 1525
            r = s.put_message(StoreMessage("T1", b"next", queue_id=0))
            assert r.ok and r.append_result.logics_offset == 25
            assert s.wait_dispatched()
    assert not [r for r in caplog.records if "damaged" in r.getMessage()], caplog.text[-2000:]


def test_index_file_lost_while_closed_is_indexed_again_at_open(tmp_path):
    """The newest index file deleted while the store is closed (cleanly): the open indexes its keys again
    from the last entry of the file before it (an outside tester's case: a rule that trusted any index
    with files after a clean shutdown lost them for good)."""
    from store_checks import small_config
    cfg = small_config(maxIndexNum=40)
    with MessageStore.open(tmp_path, cfg) as s:
        for i in range(100):
            assert s.put_message(StoreMessage("T", b"m%d" % i, queue_id=0, properties={"KEYS": f"k{i}"})).ok
        assert s.wait_dispatched()
    files = sorted((tmp_path / "index").iterdir())
    assert len(files) >= 3
    files[-1].unlink()
    with MessageStore.open(tmp_path, cfg) as s:
        assert s.recovery_report.redispatched_messages > 0
        assert s.wait_dispatched()
        for i in (0, 50, 99):
            assert [m.body for m in s.find_messages_by_key("T", f"k{i}")] == [b"m%d" % i]


_DELETE_UNDISPATCHED = """
import os, signal, sys, threading, time
sys.path.insert(0, {tests!r})
from rmqstore import Message, MessageStore
from rmqstore.store.consumequeue import consume_queue
from store_checks import small_config
st = MessageStore.open({root!r}, small_config())
for i in range(30):
    assert st.put_message(Message("TA", b"old-%d" % i, queue_id=0)).ok
    assert st.put_message(Message("TB", b"b-%d" % i, queue_id=0)).ok
st.wait_dispatched()
st.delete_topic("TA")
if {rewrite!r}:
    gate = threading.Event()
    for name in ("put_arrays", "put_units"):        # the process dies before TA's new units are written
        orig = getattr(consume_queue.ConsumeQueue, name)
        def blocked(self, *a, _o=orig, **k):
            if self.topic == "TA":
                gate.wait()
            return _o(self, *a, **k)
        setattr(consume_queue.ConsumeQueue, name, blocked)
    for i in range(5):
        r = st.put_message(Message("TA", b"new-%d" % i, queue_id=0))
        assert r.ok and r.append_result.logics_offset == i, r
for i in range(5):
    assert st.put_message(Message("TB", b"b-%d" % (30 + i), queue_id=0)).ok
time.sleep(0.3)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("rewrite", [False, True], ids=["deleted", "deleted-and-written-again"])
def test_deleted_topic_stays_deleted_after_sigkill(tmp_path, rewrite):
    """deleteTopic, then (maybe) new acknowledged messages to the topic whose units were not yet written,
    then SIGKILL: the re-dispatch from below the deletion (keyless messages: from the start) must not build
    the deleted queue again from its old records, and the new messages keep offsets 0..4 (an outside
    tester: the old generation came back and took offsets 0..29; new-0 was unreadable, the next put landed
    at 31). RocketMQ itself has that fault; the deletion is recorded in config/deletedQueues.json."""
    import os
    root = tmp_path / "store"
    proc = subprocess.run([sys.executable, "-c", _DELETE_UNDISPATCHED.format(
        tests=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), root=str(root), rewrite=rewrite)], capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert '"topic": "TA"' in (root / "config" / "deletedQueues.json").read_text()
    from store_checks import small_config
    for _ in range(2):                      # the crash's reopen, then a clean one
        with MessageStore.open(root, small_config()) as s:
            assert s.wait_dispatched()
            assert not s.failures.failures(), [str(f) for f in s.failures.failures()]
            got = s.get_message("G", "TA", 0, 0, 32)
            want = [b"new-%d" % i for i in range(5)] if rewrite else []
            assert [m.body for m in got.messages] == want
            assert [m.queue_offset for m in got.messages] == list(range(len(want)))
            assert s.get_max_offset_in_queue("TA", 0) == len(want)
            assert s.get_max_offset_in_queue("TB", 0) == 35
            assert s.get_message("G", "TB", 0, 34, 1).messages[0].body == b"b-34"
    from rmqstore.store.check.check import check_store
    from rmqstore.store.repair.rebuild import rebuild_store
    rep = check_store(root, small_config(), live=False)     # the deleted generation is no missing queue
    assert not rep.problems, [str(p) for p in rep.problems]
    rebuild_store(root, small_config())                     # nor does a rebuild bring it back
    with MessageStore.open(root, small_config()) as s:
        assert [m.body for m in s.get_message("G", "TA", 0, 0, 32).messages] == want
        r = s.put_message(StoreMessage("TA", b"next", queue_id=0))
        assert r.ok and r.append_result.logics_offset == (5 if rewrite else 0)


def test_deleted_queues_file_is_validated(tmp_path):
    """A malformed deletedQueues.json names the file and the field (at open, its .bak is used; check reports
    it like every config file)."""
    from rmqstore.store.consumequeue import deleted_queues as D
    assert D.decode({"queues": [{"topic": "T", "queueId": 1, "below": 7}]}) == {("T", 1): 7}
    for bad, what in (([], "'queues' list"), ({"queues": [3]}, "queues[0] is not an object"),
                      ({"queues": [{"topic": "", "queueId": 0, "below": 1}]}, "topic"),
                      ({"queues": [{"topic": "T", "queueId": -1, "below": 1}]}, "queueId and below"),
                      ({"queues": [{"topic": "T", "queueId": 0, "below": True}]}, "queueId and below")):
        with pytest.raises(ValueError, match=re.escape(what)):
            D.decode(bad)
    D.record(tmp_path, [("T", 0)], 10)
    assert D.record(tmp_path, [("T", 0)], 5) == {("T", 0): 10}    # a later deletion never lowers it
    assert D.load(tmp_path) == {("T", 0): 10}
    from rmqstore.store.check.check_files import _config_decoders
    assert D.FILE_NAME in _config_decoders()


def test_check_sees_no_damage_in_a_deleted_then_rewritten_queue(tmp_path):
    """A queue deleted and written again with one message: its old generation's offsets end where the new
    one starts over at 0; check once called the new record 'QUEUEOFFSET 0 out of the sequence: a damaged
    header', and check --repair quarantined it (an outside tester)."""
    from rmqstore.store.check.check import check_store
    from store_checks import small_config
    with MessageStore.open(tmp_path, small_config()) as s:
        for i in range(20):
            assert s.put_message(StoreMessage("TA", b"old-%d" % i, queue_id=0)).ok
        assert s.wait_dispatched()
        s.delete_topic("TA")
        assert s.put_message(StoreMessage("TA", b"new-0", queue_id=0, properties={"KEYS": "k0"})).ok
        assert s.wait_dispatched()
    rep = check_store(tmp_path, small_config(), live=False)
    assert not rep.problems and not rep.damaged, [str(p) for p in rep.problems]


def test_consumer_running_info_of_a_hung_or_old_client(hung_client_calls):
    """callConsumer: a client that does not answer within 10 s gives CONSUME_MSG_TIMEOUT; one older than
    V3_1_8_SNAPSHOT is not asked (SYSTEM_ERROR naming its version). (Asked from the module's first test on:
    hung_client_calls.)"""
    got = hung_client_calls.result()
    r = got["old"]
    assert r.code == ResponseCode.SYSTEM_ERROR
    assert r.remark.startswith("The Consumer <10.9.9.9@old> Version <") and "V3_1_8_SNAPSHOT" in r.remark
    r = got["mute"]
    assert r.code == ResponseCode.CONSUME_MSG_TIMEOUT
    assert r.remark.startswith("consumer <mute_cg> <10.9.9.9@mute> Timeout: RemotingTimeoutException: wait ")
    assert r.remark.endswith("> timeout, 10000(ms)")
