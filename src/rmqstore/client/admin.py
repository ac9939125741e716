"""Admin calls (RocketMQ's MQAdminImpl and a few of MQAdminExt's): topic creation, key queries, view by
id, queue offsets, cluster info. Producers and consumers expose the message lookups too.

    with Admin("127.0.0.1:9876") as admin:
        admin.create_topic("TopicA", queue_nums=8)
        msgs = admin.query_message("TopicA", "order-1")
        msg = admin.view_message(send_result.offset_msg_id)
"""
from __future__ import annotations

import os

from ..store import codec
from ..remoting import fastjson
from ..remoting.codes import DEFAULT_TOPIC, PERM_READ, PERM_WRITE, UNIQUE_MSG_QUERY_FLAG, RequestCode, ResponseCode
from .instance import MQClientInstance, subscribe_info
from .message import MessageExt, MessageQueue, MQBrokerError, MQClientError, decode_messages

LONG_MAX = 2 ** 63 - 1


def query_message(mq: MQClientInstance, topic: str, key: str, max_num: int = 32, begin: int = 0, end: int = LONG_MAX,
                  unique_key: bool = False, timeout: float = 9.0) -> list[MessageExt]:
    """QUERY_MESSAGE on every broker of the topic; keeps the messages that really carry the key (the broker
    answers raw index matches)."""
    route = mq.update_route(topic)
    if route is None:
        raise MQClientError(f"The topic[{topic}] not matched route info")
    out: list[MessageExt] = []
    seen = set()
    for name, addrs in route.broker_addrs().items():
        addr = addrs.get(0) or next(iter(addrs.values()), None)
        if addr is None:
            continue
        cmd = mq.request(RequestCode.QUERY_MESSAGE, {"topic": topic, "key": key, "maxNum": max_num,
                                                     "beginTimestamp": begin, "endTimestamp": end})
        cmd.ext_fields[UNIQUE_MSG_QUERY_FLAG] = "true" if unique_key else "false"
        r = mq.invoke(mq.broker_channel(addr), cmd, timeout)
        if r.code == ResponseCode.QUERY_NOT_FOUND:
            continue
        if r.code != ResponseCode.SUCCESS:
            raise MQBrokerError(r.code, r.remark, addr)
        for m in decode_messages(r.body or b"", name):
            if m.topic != topic or m.offset_msg_id in seen:
                continue
            if (unique_key and m.msg_id == key) or (not unique_key and key in m.keys):
                seen.add(m.offset_msg_id)
                out.append(m)
    return out


def view_message(mq: MQClientInstance, msg_id: str, timeout: float = 3.0) -> MessageExt:
    """VIEW_MESSAGE_BY_ID: msg_id is an offset message id (the store's address + commitlog offset)."""
    try:
        addr, offset = codec.decode_message_id(msg_id)
    except ValueError as e:
        raise MQClientError(f"query message by id finished, but no message: {e}") from None
    try:
        r = mq.invoke(mq.broker_channel(addr), mq.request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offset}), timeout)
    except (OSError, TimeoutError) as e:
        raise MQClientError(f"view message {msg_id}: {e}") from None
    if r.code != ResponseCode.SUCCESS:
        raise MQBrokerError(r.code, r.remark, addr)
    msgs = decode_messages(r.body or b"")
    if not msgs:
        raise MQClientError("query message by id finished, but no message")
    return msgs[0]


def view_message_any(mq: MQClientInstance, topic: str, msg_id: str) -> MessageExt:
    """viewMessage(topic, msgId): an offset id first, else the producer's unique id (UNIQ_KEY) via the index."""
    try:
        return view_message(mq, msg_id)
    except (MQClientError, ValueError, OSError):
        pass
    found = query_message(mq, topic, msg_id, 32, 0, LONG_MAX, unique_key=True)
    if not found:
        raise MQClientError(f"query message by id finished, but no message: {msg_id}")
    return found[0]


class Admin:
    def __init__(self, namesrv_addr: str = "127.0.0.1:9876", *, instance_name: str | None = None,
                 vip_channel_enabled: bool = True, language: str = "JAVA"):
        self.namesrv_addr = namesrv_addr
        self.instance_name = instance_name or f"{os.getpid()}-admin"
        self.vip_channel_enabled = vip_channel_enabled
        self.language = language
        self.mq: MQClientInstance | None = None

    def start(self) -> "Admin":
        if self.mq is None:
            self.mq = MQClientInstance.get(self.namesrv_addr, self.instance_name, language=self.language,
                                           vip_channel_enabled=self.vip_channel_enabled)
        return self

    def shutdown(self) -> None:
        mq, self.mq = self.mq, None
        if mq is not None:
            mq.release()

    def __enter__(self) -> "Admin":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def _m(self) -> MQClientInstance:
        if self.mq is None:
            self.start()
        return self.mq

    # --- name server --------------------------------------------------------------------------------
    def cluster_info(self) -> dict:
        m = self._m()
        r = m._namesrv_invoke(m.request(RequestCode.GET_BROKER_CLUSTER_INFO))
        if r.code != ResponseCode.SUCCESS:
            raise MQBrokerError(r.code, r.remark)
        return fastjson.loads(r.body or b"{}")

    def topic_route(self, topic: str) -> dict | None:
        route = self._m().fetch_route(topic)
        return None if route is None else route.raw

    def master_addrs(self, cluster: str | None = None) -> list[str]:
        info = self.cluster_info()
        names = None
        if cluster is not None:
            names = set(info.get("clusterAddrTable", {}).get(cluster) or [])
        out = []
        for name, bd in (info.get("brokerAddrTable") or {}).items():
            if names is not None and name not in names:
                continue
            addrs = {int(k): v for k, v in (bd.get("brokerAddrs") or {}).items()}
            if 0 in addrs:
                out.append(addrs[0])
        return out

    # --- topics -------------------------------------------------------------------------------------
    def create_topic(self, topic: str, queue_nums: int = 8, perm: int = PERM_READ | PERM_WRITE, *,
                     read_queue_nums: int | None = None, cluster: str | None = None, order: bool = False) -> None:
        """UPDATE_AND_CREATE_TOPIC on every master (of the cluster), then refresh the route."""
        m = self._m()
        addrs = self.master_addrs(cluster)
        if not addrs:
            raise MQClientError("no broker to create the topic on")
        fields = {"topic": topic, "defaultTopic": DEFAULT_TOPIC, "readQueueNums": read_queue_nums or queue_nums,
                  "writeQueueNums": queue_nums, "perm": perm, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0,
                  "order": order}
        for addr in addrs:
            r = m.invoke(addr, m.request(RequestCode.UPDATE_AND_CREATE_TOPIC, fields))
            if r.code != ResponseCode.SUCCESS:
                raise MQBrokerError(r.code, r.remark, addr)

    def fetch_subscribe_message_queues(self, topic: str) -> set[MessageQueue]:
        route = self._m().update_route(topic)
        if route is None:
            raise MQClientError(f"Can not find Message Queue for this topic, {topic}")
        return subscribe_info(topic, route)

    # --- messages -----------------------------------------------------------------------------------
    def query_message(self, topic: str, key: str, max_num: int = 32, begin: int = 0, end: int = LONG_MAX) -> list[MessageExt]:
        return query_message(self._m(), topic, key, max_num, begin, end)

    def query_message_by_uniq_key(self, topic: str, uniq_key: str) -> MessageExt | None:
        found = query_message(self._m(), topic, uniq_key, 32, 0, LONG_MAX, unique_key=True)
        return found[0] if found else None

    def view_message(self, msg_id: str, topic: str | None = None) -> MessageExt:
        if topic is None:
            return view_message(self._m(), msg_id)
        return view_message_any(self._m(), topic, msg_id)

    # --- offsets ------------------------------------------------------------------------------------
    def _queue_call(self, code: int, mq: MessageQueue, extra: dict | None = None, use_vip: bool = True):
        m = self._m()
        addr = m.broker_addr_of(mq)
        fields = {"topic": mq.topic, "queueId": mq.queue_id}
        fields.update(extra or {})
        r = m.invoke(m.broker_channel(addr) if use_vip else addr, m.request(code, fields))
        if r.code != ResponseCode.SUCCESS:
            raise MQBrokerError(r.code, r.remark, addr)
        return r

    def max_offset(self, mq: MessageQueue) -> int:
        return int(self._queue_call(RequestCode.GET_MAX_OFFSET, mq).field("offset"))

    def min_offset(self, mq: MessageQueue) -> int:
        return int(self._queue_call(RequestCode.GET_MIN_OFFSET, mq).field("offset"))

    def search_offset(self, mq: MessageQueue, timestamp: int) -> int:
        return int(self._queue_call(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, mq, {"timestamp": timestamp}).field("offset"))

    def earliest_msg_store_time(self, mq: MessageQueue) -> int:
        return int(self._queue_call(RequestCode.GET_EARLIEST_MSG_STORETIME, mq).field("timestamp"))

    def query_consumer_offset(self, group: str, mq: MessageQueue) -> int:
        """-1 when the group has no offset for the queue (QUERY_NOT_FOUND)."""
        try:
            r = self._queue_call(RequestCode.QUERY_CONSUMER_OFFSET, mq, {"consumerGroup": group})
        except MQBrokerError as e:
            if e.code == ResponseCode.QUERY_NOT_FOUND:
                return -1
            raise
        return int(r.field("offset"))
