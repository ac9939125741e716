"""The admin requests behind mqadmin's commands (issue 21), driven by rmqstore.client.Admin against a real
`rmqstore serve` process, the bodies checked against RocketMQ 4.4.0's (field names and shapes written down
from 4.4.0's AdminBrokerProcessor, StoreStatsService, BrokerStatsManager and their body classes)."""
from __future__ import annotations

import json
import re

import pytest

from rmqstore.client import Message, MessageQueue, Producer, PullConsumer, PullStatus
from rmqstore.client.message import MQBrokerError, MQClientError
from rmqstore.remoting import fastjson
from rmqstore.remoting.codes import RequestCode, ResponseCode
from store_checks import raw_request, wait_until

CONF = {"mappedFileSizeCommitLog": 8 * 1024 * 1024, "mappedFileSizeConsumeQueue": 20 * 30000,
        "maxHashSlotNum": 5000, "maxIndexNum": 20000, "brokerClusterName": "OpsCluster", "brokerName": "ops-b"}
TOPIC, GROUP, PGROUP = "OpsTopic", "ops_cg", "ops_pg"
SENT, QUEUES, PULLED_PER_QUEUE = 100, 4, 10

# GET_BROKER_RUNTIME_INFO's KVTable keys in RocketMQ 4.4.0 (StoreStatsService.getRuntimeInfo,
# DefaultMessageStore.getRuntimeInfo, AdminBrokerProcessor.prepareRuntimeInfo)
RUNTIME_KEYS = {
    "bootTimestamp", "runtime", "putMessageEntireTimeMax", "putMessageTimesTotal", "putMessageSizeTotal",
    "putMessageDistributeTime", "putMessageAverageSize", "dispatchMaxBuffer", "getMessageEntireTimeMax", "putTps",
    "getFoundTps", "getMissTps", "getTotalTps", "getTransferedTps", "commitLogDiskRatio", "consumeQueueDiskRatio",
    "commitLogMinOffset", "commitLogMaxOffset", "brokerVersionDesc", "brokerVersion",
    "msgPutTotalYesterdayMorning", "msgPutTotalTodayMorning", "msgPutTotalTodayNow",
    "msgGetTotalYesterdayMorning", "msgGetTotalTodayMorning", "msgGetTotalTodayNow",
    "sendThreadPoolQueueSize", "sendThreadPoolQueueCapacity", "pullThreadPoolQueueSize",
    "pullThreadPoolQueueCapacity", "queryThreadPoolQueueSize", "queryThreadPoolQueueCapacity",
    "EndTransactionQueueSize", "EndTransactionThreadPoolQueueCapacity", "dispatchBehindBytes",
    "pageCacheLockTimeMills", "sendThreadPoolQueueHeadWaitTimeMills", "pullThreadPoolQueueHeadWaitTimeMills",
    "queryThreadPoolQueueHeadWaitTimeMills", "earliestMessageTimeStamp", "startAcceptSendRequestTimeStamp",
    "remainTransientStoreBufferNumbs", "remainHowManyDataToFlush", "commitLogDirCapacity"}
RATE = r"(\d+\.\d+(E-?\d+)?)?"
RATES_RE = re.compile(f"^{RATE} {RATE} {RATE}$")        # "10s 1min 10min", a window without samples empty
DISTRIBUTION_RE = re.compile(r"^(\[[^\]]+\]:\d+ ){13}$")
OFFSET_WRAPPER_KEYS = {"brokerOffset", "consumerOffset", "lastTimestamp"}
TOPIC_OFFSET_KEYS = {"lastUpdateTimestamp", "maxOffset", "minOffset"}
STATS_ITEM_KEYS = {"sum", "tps", "avgpt"}


@pytest.fixture(scope="module")
def traffic(server, admin):
    """SENT messages to TOPIC; GROUP pulled and committed PULLED_PER_QUEUE of each queue; the producer and
    the pull consumer stay connected."""
    admin.create_topic(TOPIC, QUEUES)
    p = Producer(PGROUP, server.namesrv_addr).start()
    pc = PullConsumer(GROUP, server.namesrv_addr)    # no subscription: no background pulls, only ours
    pc.start()
    try:
        for i in range(SENT):
            p.send(Message(TOPIC, b"m%03d" % i, keys=f"k{i}"))
        for q in range(QUEUES):
            mq = MessageQueue(TOPIC, "ops-b", q)
            r = pc.pull(mq, "*", 0, PULLED_PER_QUEUE)
            assert r.pull_status is PullStatus.FOUND and len(r.msg_found_list) == PULLED_PER_QUEUE
            pc.update_consume_offset(mq, PULLED_PER_QUEUE)
        pc.persist_offsets()
        assert wait_until(lambda: sum(admin.query_consumer_offset(GROUP, MessageQueue(TOPIC, "ops-b", q))
                                 for q in range(QUEUES)) == QUEUES * PULLED_PER_QUEUE, 10)
        yield p, pc
    finally:
        pc.shutdown()
        p.shutdown()


def test_runtime_info_has_rocketmq_keys_and_rate_strings(server, admin, traffic):
    info = admin.broker_runtime_stats(server.broker_addr)
    assert RUNTIME_KEYS <= set(info), RUNTIME_KEYS - set(info)
    for k in ("putTps", "getFoundTps", "getMissTps", "getTransferedTps", "getTotalTps"):
        assert RATES_RE.match(info[k]), (k, info[k])
    assert DISTRIBUTION_RE.match(info["putMessageDistributeTime"]), info["putMessageDistributeTime"]
    assert int(info["putMessageTimesTotal"]) == SENT == int(info["msgPutTotalTodayNow"])
    assert sum(int(n) for n in re.findall(r":(\d+)", info["putMessageDistributeTime"])) == SENT
    assert int(info["msgGetTotalTodayNow"]) == QUEUES * PULLED_PER_QUEUE
    assert int(info["putMessageSizeTotal"]) == int(info["commitLogMaxOffset"]) > 0
    assert info["brokerVersionDesc"] == "V4_4_0" and info["brokerVersion"] == "293"
    assert int(info["dispatchBehindBytes"]) == 0
    assert 0.0 <= float(info["commitLogDiskRatio"]) <= 1.0
    assert re.match(r"^\[ \d+ days, \d+ hours, \d+ minutes, \d+ seconds \]$", info["runtime"])
    assert int(info["earliestMessageTimeStamp"]) > 1_500_000_000_000


def test_topic_stats_table(server, admin, traffic):
    stats = admin.topic_stats(TOPIC)
    assert set(stats) == {MessageQueue(TOPIC, "ops-b", q) for q in range(QUEUES)}
    assert sum(o["maxOffset"] for o in stats.values()) == SENT
    for o in stats.values():
        assert set(o) == TOPIC_OFFSET_KEYS and o["minOffset"] == 0
        assert (o["lastUpdateTimestamp"] > 0) == (o["maxOffset"] > 0)
    # the body itself: fastjson's MessageQueue keys, fields in fastjson's (alphabetical) order
    r = raw_request(admin, server.broker_addr, RequestCode.GET_TOPIC_STATS_INFO, {"topic": TOPIC})
    assert r.code == ResponseCode.SUCCESS
    assert r.body.startswith(b'{"offsetTable":{{"brokerName":"ops-b","queueId":0,"topic":"OpsTopic"}:'
                             b'{"lastUpdateTimestamp":')
    r = raw_request(admin, server.broker_addr, RequestCode.GET_TOPIC_STATS_INFO, {"topic": "NoSuchTopic"})
    assert r.code == ResponseCode.TOPIC_NOT_EXIST and r.remark == "topic[NoSuchTopic] not exist"


def test_broker_config(server, admin):
    cfg = admin.broker_config(server.broker_addr)
    assert cfg["brokerClusterName"] == "OpsCluster" and cfg["brokerName"] == "ops-b"
    assert cfg["listenPort"] == str(server.listen_port)
    assert cfg["mappedFileSizeCommitLog"] == str(8 * 1024 * 1024)
    r = raw_request(admin, server.broker_addr, RequestCode.GET_BROKER_CONFIG)
    version = json.loads(r.field("version"))          # GetBrokerConfigResponseHeader.version: a DataVersion
    assert set(version) == {"counter", "timestamp"}


def test_consume_stats_and_broker_consume_stats(server, admin, traffic):
    cs = admin.consume_stats(GROUP, TOPIC)
    table = cs["offsetTable"]
    assert set(table) == {MessageQueue(TOPIC, "ops-b", q) for q in range(QUEUES)}
    assert all(set(o) == OFFSET_WRAPPER_KEYS for o in table.values())
    assert sum(o["brokerOffset"] for o in table.values()) == SENT
    assert all(o["consumerOffset"] == PULLED_PER_QUEUE and o["lastTimestamp"] > 0 for o in table.values())
    assert isinstance(cs["consumeTps"], float)
    # without a topic: every topic the group has offsets for
    assert admin.consume_stats(GROUP)["offsetTable"] == table
    bcs = admin.broker_consume_stats(server.broker_addr)
    assert bcs["brokerAddr"] == server.broker_addr
    assert bcs["totalDiff"] == SENT - QUEUES * PULLED_PER_QUEUE
    mine = [d[GROUP] for d in bcs["consumeStatsList"] if GROUP in d]
    assert len(mine) == 1 and len(mine[0]) == 1 and set(mine[0][0]) == {"consumeTps", "offsetTable"}


def test_view_broker_stats_data(server, admin, traffic):
    d = admin.view_broker_stats(server.broker_addr, "TOPIC_PUT_NUMS", TOPIC)
    assert set(d) == {"statsMinute", "statsHour", "statsDay"}
    assert all(set(v) == STATS_ITEM_KEYS for v in d.values())
    # the minute window is sampled every 10 s: within 25 s the puts show up in it
    assert wait_until(lambda: admin.view_broker_stats(server.broker_addr, "TOPIC_PUT_NUMS", TOPIC)
                 ["statsMinute"]["sum"] == SENT, 25)
    g = admin.view_broker_stats(server.broker_addr, "GROUP_GET_NUMS", f"{TOPIC}@{GROUP}")
    assert wait_until(lambda: admin.view_broker_stats(server.broker_addr, "GROUP_GET_NUMS", f"{TOPIC}@{GROUP}")
                 ["statsMinute"]["sum"] == QUEUES * PULLED_PER_QUEUE, 25), g
    with pytest.raises(MQBrokerError) as e:
        admin.view_broker_stats(server.broker_addr, "TOPIC_PUT_NUMS", "NoSuchTopic")
    assert e.value.code == ResponseCode.SYSTEM_ERROR and e.value.remark == "The stats <TOPIC_PUT_NUMS> <NoSuchTopic> not exist"


def test_connections_and_consumers_of_a_topic(server, admin, traffic):
    assert GROUP in admin.query_topic_consume_by_who(TOPIC)
    cc = admin.consumer_connection(GROUP)
    assert set(cc) == {"connectionSet", "consumeFromWhere", "consumeType", "messageModel", "subscriptionTable"}
    assert len(cc["connectionSet"]) == 1
    assert set(cc["connectionSet"][0]) == {"clientAddr", "clientId", "language", "version"}
    assert cc["consumeType"] == "CONSUME_ACTIVELY" and cc["messageModel"] == "CLUSTERING"
    pc = admin.producer_connection(PGROUP, TOPIC)
    assert len(pc["connectionSet"]) == 1
    with pytest.raises(MQBrokerError) as e:
        admin.consumer_connection("nobody_cg")
    assert e.value.code == ResponseCode.CONSUMER_NOT_ONLINE


def test_subscription_groups_and_topic_deletion(server, admin):
    addr = server.broker_addr
    admin.create_subscription_group(addr, "made_cg", retryMaxTimes=3)
    groups = admin.subscription_groups(addr)
    assert groups["subscriptionGroupTable"]["made_cg"]["retryMaxTimes"] == 3
    assert set(groups["dataVersion"]) == {"counter", "timestamp"}
    admin.delete_subscription_group(addr, "made_cg")
    assert "made_cg" not in admin.subscription_groups(addr)["subscriptionGroupTable"]
    admin.create_topic("GoneTopic", 2)
    assert "GoneTopic" in admin.topic_list()
    admin.delete_topic("GoneTopic")
    assert "GoneTopic" not in admin.topic_list()
    with pytest.raises(MQClientError, match="No topic route info"):
        admin.topic_stats("GoneTopic")


def test_unknown_request_code_answers_not_supported(server, admin):
    """An unknown or unsupported request gets REQUEST_CODE_NOT_SUPPORTED with a remark, and the connection
    stays usable."""
    for code in (9999, RequestCode.CONSUME_MESSAGE_DIRECTLY):
        r = raw_request(admin, server.broker_addr, code)
        assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert r.remark == f" request type {int(code)} not supported"
    assert admin.broker_runtime_stats(server.broker_addr)["brokerVersionDesc"] == "V4_4_0"
    r = raw_request(admin, server.namesrv_addr, 9999)
    assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and r.remark


def test_topic_stats_json_is_fastjson(server, admin, traffic):
    """The TopicStatsTable body reads back through the fastjson dialect reader into MessageQueue keys."""
    r = raw_request(admin, server.broker_addr, RequestCode.GET_TOPIC_STATS_INFO, {"topic": TOPIC})
    keys = list(fastjson.loads(r.body)["offsetTable"])
    assert sorted(k["queueId"] for k in keys) == list(range(QUEUES))


# --- `rmqstore admin` (mqadmin's command names) ---------------------------------------------------------
def _cli(server, *argv) -> tuple[int, str]:
    import contextlib
    import io

    from rmqstore.tools import cli
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.main(["admin", argv[0], "-n", server.namesrv_addr, *argv[1:]])
    return rc, out.getvalue()


def test_cli_cluster_list_topic_status_consumer_progress(server, traffic):
    rc, text = _cli(server, "clusterList")
    assert rc == 0
    header, row = text.splitlines()[:2]
    assert header.split()[:3] == ["#Cluster", "Name", "#Broker"]
    assert row.split()[:5] == ["OpsCluster", "ops-b", "0", server.broker_addr, "V4_4_0"]
    assert "null" not in row and re.search(r"\d+\.\d\d\(0,0ms\)", row)
    rc, text = _cli(server, "topicStatus", "-t", TOPIC)
    rows = text.splitlines()[1:]
    assert rc == 0 and len(rows) == QUEUES and sum(int(r.split()[3]) for r in rows) == SENT
    rc, text = _cli(server, "consumerProgress", "-g", GROUP)
    assert rc == 0 and f"Diff Total: {SENT - QUEUES * PULLED_PER_QUEUE}" in text
    assert len([r for r in text.splitlines() if r.startswith(TOPIC)]) == QUEUES


def test_cli_broker_status_config_and_stats_all(server, traffic):
    rc, text = _cli(server, "brokerStatus", "-b", server.broker_addr)
    assert rc == 0 and re.search(r"^putTps\s+: ", text, re.M) and re.search(r"^msgPutTotalTodayNow\s+: 100$", text, re.M)
    rc, text = _cli(server, "getBrokerConfig", "-b", server.broker_addr)
    assert rc == 0 and re.search(r"^brokerClusterName\s+=  OpsCluster$", text, re.M)
    want = re.compile(rf"^{TOPIC}\s+{GROUP}\s+{SENT - QUEUES * PULLED_PER_QUEUE}\s+\d+\.\d\d\s+\d+\.\d\d\s+{SENT}\s+"
                      rf"{QUEUES * PULLED_PER_QUEUE}$", re.M)
    # InMsg24Hour / OutMsg24Hour come from the minute window, sampled every 10 s
    assert wait_until(lambda: want.search(_cli(server, "statsAll", "-t", TOPIC)[1]), 25), _cli(server, "statsAll")[1]


def test_cli_topics_groups_and_messages(server, traffic):
    rc, text = _cli(server, "updateTopic", "-t", "CliTopic", "-b", server.broker_addr, "-r", "2", "-w", "2")
    assert rc == 0 and "success" in text
    assert "CliTopic" in _cli(server, "topicList")[1].split()
    rc, text = _cli(server, "topicRoute", "-t", "CliTopic")
    assert rc == 0 and json.loads(text)["queueDatas"][0]["writeQueueNums"] == 2
    assert _cli(server, "deleteTopic", "-t", "CliTopic")[0] == 0
    assert "CliTopic" not in _cli(server, "topicList")[1].split()
    assert _cli(server, "updateSubGroup", "-g", "cli_cg", "-b", server.broker_addr, "-m", "5")[0] == 0
    assert _cli(server, "deleteSubGroup", "-g", "cli_cg", "-b", server.broker_addr)[0] == 0
    rc, text = _cli(server, "queryMsgByKey", "-t", TOPIC, "-k", "k7")
    assert rc == 0 and len(text.splitlines()) == 2
    msg_id = text.splitlines()[1].split()[0]
    rc, text = _cli(server, "queryMsgByUniqueKey", "-t", TOPIC, "-i", msg_id)
    assert rc == 0 and re.search(r"^Message Body:\s+m007$", text, re.M)
    rc, text = _cli(server, "consumerConnection", "-g", GROUP)
    assert rc == 0 and "ConsumeType: CONSUME_ACTIVELY" in text
    assert _cli(server, "producerConnection", "-g", PGROUP, "-t", TOPIC)[1].startswith("0001  ")


def test_cli_errors_are_one_line(server, capsys):
    rc, _ = _cli(server, "topicStatus", "-t", "NoSuchTopicAtAll")
    assert rc == 2
    assert capsys.readouterr().err.strip() == \
        "rmqstore admin topicStatus: No topic route info in name server for the topic: NoSuchTopicAtAll"


def test_cli_as_a_process(server, traffic):
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "rmqstore", "admin", "topicStatus", "-n", server.namesrv_addr, "-t",
                        TOPIC], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.splitlines()) == 1 + QUEUES


def test_reset_offset_by_time_with_a_live_consumer(server, admin):
    """INVOKE_BROKER_TO_RESET_OFFSET: the broker tells the online consumer (RESET_CONSUMER_CLIENT_OFFSET),
    which starts again from the reset offsets: every message is consumed a second time."""
    import threading

    from rmqstore.client import ConsumeFromWhere, ConsumeStatus, PushConsumer
    topic, group = "ResetLiveT", "reset_live_cg"
    admin.create_topic(topic, 2)
    with Producer("reset_pg", server.namesrv_addr) as p:
        for i in range(20):
            p.send(Message(topic, b"r%d" % i))
    seen: list[bytes] = []
    lock = threading.Lock()

    def listener(msgs):
        with lock:
            seen.extend(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS
    c = PushConsumer(group, server.namesrv_addr, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    c.subscribe(topic, "*")
    c.register_message_listener(listener)
    c.start()
    try:
        assert wait_until(lambda: len(seen) == 20, 30)
        c.persist_offsets()
        assert wait_until(lambda: sum(o["consumerOffset"] for o in admin.consume_stats(group, topic)
                                 ["offsetTable"].values()) == 20, 15)
        table = admin.reset_offset_by_time(group, topic, 0)
        assert sorted(table.values()) == [0, 0]
        assert wait_until(lambda: len(seen) == 40, 30), len(seen)
        assert sorted(seen) == sorted(seen[:20] * 2)
    finally:
        c.shutdown()


def test_reset_offset_by_time_without_a_consumer(server, admin):
    """No client online: CONSUMER_NOT_ONLINE, and the admin sets the offsets itself (mqadmin's old way)."""
    topic, group = "ResetOffT", "reset_off_cg"
    admin.create_topic(topic, 2)
    with Producer("reset_pg2", server.namesrv_addr) as p:
        for i in range(10):
            p.send(Message(topic, b"o%d" % i))
    mqs = sorted(admin.fetch_subscribe_message_queues(topic))
    for mq in mqs:
        admin.update_consumer_offset(group, mq, admin.max_offset(mq))
    r = raw_request(admin, server.broker_addr, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
             {"topic": topic, "group": group, "timestamp": 0, "isForce": True})
    assert r.code == ResponseCode.CONSUMER_NOT_ONLINE and r.remark.startswith("Consumer not online")
    assert admin.reset_offset_by_time(group, topic, 0) == {mq: 0 for mq in mqs}
    assert [admin.query_consumer_offset(group, mq) for mq in mqs] == [0, 0]


def test_update_broker_config_at_run_time(server, admin, tmp_path):
    addr = server.broker_addr
    admin.update_broker_config(addr, {"shortPollingTimeMills": "1500", "fileReservedTime": "48"})
    cfg = admin.broker_config(addr)
    assert cfg["shortPollingTimeMills"] == "1500" and cfg["fileReservedTime"] == "48"
    persisted = (server.store / "config" / "broker.properties").read_text()
    assert "shortPollingTimeMills=1500\n" in persisted and "fileReservedTime=48\n" in persisted
    with pytest.raises(MQBrokerError, match="not changeable at run time: listenPort"):
        admin.update_broker_config(addr, {"listenPort": "1"})
    with pytest.raises(MQBrokerError, match="fileReservedTime"):
        admin.update_broker_config(addr, {"fileReservedTime": "-1"})
    assert admin.broker_config(addr)["fileReservedTime"] == "48"


def test_cli_update_broker_config_and_reset_offset(server, admin):
    rc, text = _cli(server, "updateBrokerConfig", "-b", server.broker_addr, "-k", "defaultQueryMaxNum", "-v", "40")
    assert rc == 0 and "success" in text and admin.broker_config(server.broker_addr)["defaultQueryMaxNum"] == "40"
    admin.create_topic("CliResetT", 1)
    mq = MessageQueue("CliResetT", "ops-b", 0)
    with Producer("cli_reset_pg", server.namesrv_addr) as p:
        for i in range(3):
            p.send(Message("CliResetT", b"x"), queue=mq)
    admin.update_consumer_offset("cli_reset_cg", mq, 3)
    rc, text = _cli(server, "resetOffsetByTime", "-g", "cli_reset_cg", "-t", "CliResetT", "-s", "0")
    assert rc == 0 and text.splitlines()[1].split() == ["ops-b", "0", "0"]
    assert admin.query_consumer_offset("cli_reset_cg", mq) == 0


def test_runtime_info_put_tps_after_ten_seconds(server, admin, traffic):
    """The 10 s figure needs 11 one-second samples: after them it is a number (ClusterListSubCommand
    parses the first figure of putTps and getTransferedTps). The module's last test: the server's samples
    accumulate while the others run."""
    assert wait_until(lambda: admin.broker_runtime_stats(server.broker_addr)["putTps"].split(" ")[0] != "", 30)
    info = admin.broker_runtime_stats(server.broker_addr)
    for k in ("putTps", "getTransferedTps"):
        assert float(info[k].split(" ")[0]) >= 0.0
