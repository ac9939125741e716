"""ConsumerRunningInfo: what a consumer answers to GET_CONSUMER_RUNNING_INFO (307), the request the broker
forwards from `mqadmin consumerStatus` (RocketMQ 4.4.0's ClientRemotingProcessor.getConsumerRunningInfo,
MQClientInstance.consumerRunningInfo and DefaultMQPushConsumerImpl.consumerRunningInfo).

The body (fastjson, fields in alphabetical order as fastjson writes them):
    mqTable        MessageQueue -> ProcessQueueInfo (the queues this client holds and their cached messages)
    properties     the consumer's settings plus PROP_CONSUMEORDERLY, PROP_THREADPOOL_CORE_SIZE,
                   PROP_CONSUMER_START_TIMESTAMP, PROP_NAMESERVER_ADDR, PROP_CONSUME_TYPE, PROP_CLIENT_VERSION
    statusTable    topic -> ConsumeStatus (this client keeps no consume statistics: its rates are 0.0)
    subscriptionSet  the SubscriptionData of every subscription (the retry topic's included, as in RocketMQ)
jstack is left out (a Python process has no Java stack; mqadmin's -s prints nothing then).
"""
from __future__ import annotations

import time

from ..remoting import fastjson
from ..remoting.codes import RequestCode, ResponseCode
from ..remoting.command import RemotingCommand

PROP_NAMESERVER_ADDR = "PROP_NAMESERVER_ADDR"
PROP_THREADPOOL_CORE_SIZE = "PROP_THREADPOOL_CORE_SIZE"
PROP_CONSUME_ORDERLY = "PROP_CONSUMEORDERLY"
PROP_CONSUME_TYPE = "PROP_CONSUME_TYPE"
PROP_CLIENT_VERSION = "PROP_CLIENT_VERSION"
PROP_CONSUMER_START_TIMESTAMP = "PROP_CONSUMER_START_TIMESTAMP"
CLIENT_VERSION_DESC = "V4_4_0"      # MQVersion.getVersionDesc(CURRENT_VERSION)


def _wall_ms(monotonic_s: float) -> int:
    """A time.monotonic() instant as epoch milliseconds."""
    return int((time.time() - (time.monotonic() - monotonic_s)) * 1000)


def process_queue_info(pq, commit_offset: int) -> dict:
    """ProcessQueue.fillProcessQueueInfo: the messages pulled and not yet consumed."""
    with pq.lock:
        offsets = list(pq.msgs)
        size = pq.size
    return {"cachedMsgCount": len(offsets), "cachedMsgMaxOffset": max(offsets) if offsets else 0,
            "cachedMsgMinOffset": min(offsets) if offsets else 0, "cachedMsgSizeInMiB": size // (1024 * 1024),
            "commitOffset": commit_offset, "droped": pq.dropped,
            "lastConsumeTimestamp": _wall_ms(pq.last_consume), "lastLockTimestamp": 0,
            "lastPullTimestamp": _wall_ms(pq.last_pull), "locked": False, "transactionMsgCount": 0,
            "transactionMsgMaxOffset": 0, "transactionMsgMinOffset": 0, "tryUnlockTimes": 0}


def consumer_properties(c) -> dict[str, str]:
    """MixAll.object2Properties of the consumer (the settings this client has) and the PROP_ keys."""
    props = {"consumerGroup": c.group, "messageModel": c.message_model.value,
             "consumeFromWhere": c.consume_from_where.value, "namesrvAddr": c.namesrv_addr,
             "pullBatchSize": str(c.pull_batch_size), "pullThresholdForQueue": str(c.pull_threshold_for_queue),
             "pullThresholdSizeForQueue": str(c.pull_threshold_size_for_queue // (1024 * 1024)),
             "brokerSuspendMaxTimeMillis": str(c.broker_suspend_max_time_millis),
             "vipChannelEnabled": str(c.vip_channel_enabled).lower(), "unitMode": "false",
             "language": c.language}
    if c.instance_name:
        props["instanceName"] = c.instance_name
    if c.consume_timestamp is not None:
        props["consumeTimestamp"] = str(c.consume_timestamp)
    threads = getattr(c, "consume_thread_nums", None)
    if threads is not None:
        props["consumeThreadMin"] = props["consumeThreadMax"] = str(threads)
        props["consumeMessageBatchMaxSize"] = str(c.consume_message_batch_max_size)
        props["maxReconsumeTimes"] = str(c.max_reconsume_times)
    mq = c.mq
    props[PROP_CONSUME_ORDERLY] = "false"
    props[PROP_THREADPOOL_CORE_SIZE] = str(threads if threads is not None else 0)
    props[PROP_CONSUMER_START_TIMESTAMP] = str(c.start_timestamp)
    props[PROP_NAMESERVER_ADDR] = "".join(a + ";" for a in (mq.namesrv_addrs if mq is not None else []))
    props[PROP_CONSUME_TYPE] = c.consume_type
    props[PROP_CLIENT_VERSION] = CLIENT_VERSION_DESC
    return props


def consumer_running_info(c) -> dict:
    """The ConsumerRunningInfo of one consumer (a PushConsumer or PullConsumer of this package)."""
    with c._rebalance_lock:
        queues = list(c.process_queues.items())
    mq_table = {}
    for mq, pq in sorted(queues, key=lambda kv: (kv[0].topic, kv[0].broker_name, kv[0].queue_id)):
        commit = c.offset_store.read_memory(mq)
        key = fastjson.FrozenDict(mq.to_json())
        mq_table[key] = process_queue_info(pq, commit)
    subs = sorted(c.subscriptions.values(), key=lambda sd: (sd.topic, sd.sub_string))
    status = {sd.topic: {"consumeFailedMsgs": 0, "consumeFailedTPS": 0.0, "consumeOKTPS": 0.0, "consumeRT": 0.0,
                         "pullRT": 0.0, "pullTPS": 0.0} for sd in subs}
    return {"mqTable": mq_table, "properties": consumer_properties(c), "statusTable": status,
            "subscriptionSet": [sd.to_json() for sd in subs]}


def answer_running_info(consumers: dict, cmd: RemotingCommand) -> RemotingCommand:
    """The client's answer to GET_CONSUMER_RUNNING_INFO: the group's ConsumerRunningInfo, or SYSTEM_ERROR
    when this client has no consumer of that group."""
    assert cmd.code == RequestCode.GET_CONSUMER_RUNNING_INFO
    group = cmd.field("consumerGroup") or ""
    c = consumers.get(group)
    if c is None or not hasattr(c, "offset_store"):
        return cmd.make_response(ResponseCode.SYSTEM_ERROR,
                                 f"The Consumer Group <{group}> not exist in this consumer")
    return cmd.make_response(ResponseCode.SUCCESS, body=fastjson.dumps_bytes(consumer_running_info(c)))
