"""Admin: RocketMQ's MQAdminExt calls (topic creation, cluster info, stats, consumer offsets, broker config)
and the lookups every client shares (admin_impl: key queries, view by id, queue offsets).

    with Admin("127.0.0.1:9876") as admin:
        admin.create_topic("TopicA", queue_nums=8)
        msgs = admin.query_message("TopicA", "order-1")
        msg = admin.view_message(send_result.offset_msg_id)
"""
from __future__ import annotations

import os

from ..acl.signature import RemotingSigner, SessionCredentials
from ..remoting import fastjson
from ..remoting.codes import (DEFAULT_TOPIC, PERM_READ, PERM_WRITE, RETRY_GROUP_TOPIC_PREFIX, RequestCode,
                              ResponseCode)
from . import admin_impl
from .admin_impl import LONG_MAX
from .instance import MQClientInstance
from .message import MessageExt, MessageQueue, MQBrokerError, MQClientError

def _mq(key) -> MessageQueue:
    """A MessageQueue from a fastjson map key ({"brokerName", "queueId", "topic"})."""
    return MessageQueue(str(key["topic"]), str(key["brokerName"]), int(key["queueId"]))


class Admin:
    def __init__(self, namesrv_addr: str = "127.0.0.1:9876", *, instance_name: str | None = None,
                 vip_channel_enabled: bool = True, language: str = "JAVA",
                 credentials: SessionCredentials | None = None):
        """credentials: plain ACL's access and secret key; every request is then signed (AclClientRPCHook)."""
        self.namesrv_addr = namesrv_addr
        self._signer = RemotingSigner(credentials) if credentials is not None else None
        self.instance_name = instance_name or f"{os.getpid()}-admin"
        self.vip_channel_enabled = vip_channel_enabled
        self.language = language
        self.mq: MQClientInstance | None = None

    def start(self) -> "Admin":
        if self.mq is None:
            self.mq = MQClientInstance.get(self.namesrv_addr, self.instance_name, language=self.language,
                                           vip_channel_enabled=self.vip_channel_enabled, rpc_hook=self._signer)
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

    def topic_list(self) -> list[str]:
        """GET_ALL_TOPIC_LIST_FROM_NAMESERVER (fetchAllTopicList)."""
        return sorted(self._namesrv_json(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER).get("topicList") or [])

    def _namesrv_json(self, code: int, fields: dict | None = None):
        m = self._m()
        r = m._namesrv_invoke(m.request(code, fields))
        if r.code != ResponseCode.SUCCESS:
            raise MQBrokerError(r.code, r.remark)
        return fastjson.loads(r.body) if r.body else {}

    def _broker_json(self, addr: str, code: int, fields: dict | None = None, body: bytes | None = None):
        """One request to a broker; its body as JSON (None without one); MQBrokerError unless SUCCESS."""
        m = self._m()
        r = m.invoke(addr, m.request(code, fields, body))
        if r.code != ResponseCode.SUCCESS:
            raise MQBrokerError(r.code, r.remark, addr)
        return fastjson.loads(r.body) if r.body else None

    def _topic_masters(self, topic: str) -> list[str]:
        route = self._m().fetch_route(topic)
        if route is None:
            raise MQClientError(f"No topic route info in name server for the topic: {topic}")
        return [addrs[0] for addrs in route.broker_addrs().values() if 0 in addrs]

    # --- broker statistics and configuration (MQAdminExt) --------------------------------------------
    def broker_runtime_stats(self, addr: str) -> dict[str, str]:
        """GET_BROKER_RUNTIME_INFO (fetchBrokerRuntimeStats): the KVTable."""
        return dict((self._broker_json(addr, RequestCode.GET_BROKER_RUNTIME_INFO) or {}).get("table") or {})

    def broker_config(self, addr: str) -> dict[str, str]:
        """GET_BROKER_CONFIG (getBrokerConfig): the broker's properties."""
        m = self._m()
        r = m.invoke(addr, m.request(RequestCode.GET_BROKER_CONFIG))
        if r.code != ResponseCode.SUCCESS:
            raise MQBrokerError(r.code, r.remark, addr)
        out = {}
        for line in (r.body or b"").decode().splitlines():
            k, sep, v = line.partition("=")
            if sep and not line.startswith("#"):
                out[k.strip()] = v.strip()
        return out

    def topic_stats(self, topic: str) -> dict[MessageQueue, dict]:
        """GET_TOPIC_STATS_INFO on each master of the topic (examineTopicStats): per queue minOffset,
        maxOffset, lastUpdateTimestamp."""
        out = {}
        for addr in self._topic_masters(topic):
            body = self._broker_json(addr, RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic}) or {}
            out.update({_mq(k): v for k, v in (body.get("offsetTable") or {}).items()})
        return out

    def consume_stats(self, group: str, topic: str | None = None) -> dict:
        """GET_CONSUME_STATS on every master (examineConsumeStats): {"consumeTps", "offsetTable": {MessageQueue:
        {brokerOffset, consumerOffset, lastTimestamp}}}."""
        tps, table = 0.0, {}
        fields = {"consumerGroup": group}
        if topic:
            fields["topic"] = topic
        for addr in self.master_addrs():
            body = self._broker_json(addr, RequestCode.GET_CONSUME_STATS, fields) or {}
            tps += float(body.get("consumeTps") or 0)
            table.update({_mq(k): v for k, v in (body.get("offsetTable") or {}).items()})
        return {"consumeTps": tps, "offsetTable": table}

    def broker_consume_stats(self, addr: str, is_order: bool = False) -> dict:
        """GET_BROKER_CONSUME_STATS (fetchConsumeStatsInBroker): ConsumeStatsList."""
        return self._broker_json(addr, RequestCode.GET_BROKER_CONSUME_STATS,
                                 {"isOrder": is_order}) or {}

    def view_broker_stats(self, addr: str, stats_name: str, stats_key: str) -> dict:
        """VIEW_BROKER_STATS_DATA (viewBrokerStatsData): BrokerStatsData (statsMinute / statsHour / statsDay,
        each {sum, tps, avgpt})."""
        return self._broker_json(addr, RequestCode.VIEW_BROKER_STATS_DATA,
                                 {"statsName": stats_name, "statsKey": stats_key}) or {}

    def query_topic_consume_by_who(self, topic: str) -> set[str]:
        """QUERY_TOPIC_CONSUME_BY_WHO on the topic's masters: the groups consuming it."""
        out: set[str] = set()
        for addr in self._topic_masters(topic):
            out |= set((self._broker_json(addr, RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": topic}) or {})
                       .get("groupList") or [])
        return out

    def consumer_connection(self, group: str) -> dict:
        """GET_CONSUMER_CONNECTION_LIST (examineConsumerConnectionInfo) on the first master that has the group
        online: ConsumerConnection."""
        err = None
        for addr in self.master_addrs():
            try:
                return self._broker_json(addr, RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": group})
            except MQBrokerError as e:
                err = e
        raise err or MQClientError("no broker")

    def consumer_running_info(self, group: str, client_id: str, jstack: bool = False) -> dict:
        """GET_CONSUMER_RUNNING_INFO (getConsumerRunningInfo) through a master of %RETRY%group: the broker asks
        the client over its connection and relays its ConsumerRunningInfo (mqadmin consumerStatus)."""
        for addr in self._topic_masters(RETRY_GROUP_TOPIC_PREFIX + group):
            return self._broker_json(addr, RequestCode.GET_CONSUMER_RUNNING_INFO,
                                     {"consumerGroup": group, "clientId": client_id, "jstackEnable": jstack}) or {}
        raise MQClientError(f"no master broker for the consumer group {group}")

    def _each_master(self, code: int, addr: str | None, cluster: str | None) -> bool:
        """code on addr, or on every master of the cluster (of every cluster without one); True when all
        answered SUCCESS (DefaultMQAdminExtImpl's ...ByAddr / ...ByCluster)."""
        addrs = [addr] if addr else self.master_addrs(cluster or None)
        for a in addrs:
            self._broker_json(a, code)
        return bool(addrs)

    def clean_expired_consume_queue(self, addr: str | None = None, cluster: str | None = None) -> bool:
        """CLEAN_EXPIRED_CONSUMEQUEUE (cleanExpiredConsumerQueue): the brokers drop the consume queues whose
        messages all left the commitlog."""
        return self._each_master(RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE, addr, cluster)

    def clean_unused_topic(self, addr: str | None = None, cluster: str | None = None) -> bool:
        """CLEAN_UNUSED_TOPIC (cleanUnusedTopic): the brokers drop the consume queues of topics they have no
        config for."""
        return self._each_master(RequestCode.CLEAN_UNUSED_TOPIC, addr, cluster)

    def producer_connection(self, group: str, topic: str) -> dict:
        """GET_PRODUCER_CONNECTION_LIST on the topic's masters (examineProducerConnectionInfo)."""
        conns = []
        for addr in self._topic_masters(topic):
            try:
                body = self._broker_json(addr, RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": group})
            except MQBrokerError:
                continue
            conns.extend((body or {}).get("connectionSet") or [])
        return {"connectionSet": conns}

    def subscription_groups(self, addr: str) -> dict:
        """GET_ALL_SUBSCRIPTIONGROUP_CONFIG: the SubscriptionGroupWrapper."""
        return self._broker_json(addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG) or {}

    def create_subscription_group(self, addr: str, group: str, **settings) -> None:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (createAndUpdateSubscriptionGroupConfig); settings in RocketMQ's
        names (retryQueueNums=1, retryMaxTimes=16, consumeEnable=True, ...)."""
        cfg = {"groupName": group, "consumeEnable": True, "consumeFromMinEnable": True,
               "consumeBroadcastEnable": True, "retryQueueNums": 1, "retryMaxTimes": 16, "brokerId": 0,
               "whichBrokerWhenConsumeSlowly": 1, "notifyConsumerIdsChangedEnable": True}
        cfg.update(settings)
        self._broker_json(addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, fastjson.dumps_bytes(cfg))

    def delete_subscription_group(self, addr: str, group: str) -> None:
        self._broker_json(addr, RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": group})

    def update_broker_config(self, addr: str, props: dict[str, str]) -> None:
        """UPDATE_BROKER_CONFIG (updateBrokerConfig): properties as key=value lines."""
        body = "".join(f"{k}={v}\n" for k, v in props.items()).encode()
        self._broker_json(addr, RequestCode.UPDATE_BROKER_CONFIG, None, body)

    def reset_offset_by_time(self, group: str, topic: str, timestamp: int, force: bool = True) -> dict:
        """resetOffsetByTimestamp: INVOKE_BROKER_TO_RESET_OFFSET on the topic's masters (the brokers tell the
        group's online clients); with no client online, the old way: each queue's offset for the time set
        with UPDATE_CONSUMER_OFFSET (resetOffsetByTimeOld). {MessageQueue: new offset}."""
        m = self._m()
        out: dict[MessageQueue, int] = {}
        for addr in self._topic_masters(topic):
            fields = {"topic": topic, "group": group, "timestamp": timestamp, "isForce": force}
            r = m.invoke(addr, m.request(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, fields))
            if r.code == ResponseCode.SUCCESS:
                table = (fastjson.loads(r.body) if r.body else {}).get("offsetTable") or {}
                out.update({_mq(k): int(v) for k, v in table.items()})
            elif r.code == ResponseCode.CONSUMER_NOT_ONLINE:
                out.update(self._reset_offline(group, topic, timestamp, force))
            else:
                raise MQBrokerError(r.code, r.remark, addr)
        return out

    def _reset_offline(self, group: str, topic: str, timestamp: int, force: bool) -> dict:
        out = {}
        for mq, o in self.consume_stats(group, topic)["offsetTable"].items():
            to = self.search_offset(mq, timestamp) if timestamp != -1 else o["brokerOffset"]
            if force or to < o["consumerOffset"]:
                self.update_consumer_offset(group, mq, to)
                out[mq] = to
        return out

    # --- topics -------------------------------------------------------------------------------------
    def delete_topic(self, topic: str, cluster: str | None = None) -> None:
        """DELETE_TOPIC_IN_BROKER on the masters, then DELETE_TOPIC_IN_NAMESRV (deleteTopicInBroker /
        deleteTopicInNameServer)."""
        for addr in self.master_addrs(cluster):
            self._broker_json(addr, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic})
        self._namesrv_json(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": topic})

    def create_topic(self, topic: str, queue_nums: int = 8, perm: int = PERM_READ | PERM_WRITE, *,
                     read_queue_nums: int | None = None, cluster: str | None = None, order: bool = False,
                     broker_addr: str | None = None) -> None:
        """UPDATE_AND_CREATE_TOPIC on broker_addr, else on every master (of the cluster)."""
        m = self._m()
        addrs = [broker_addr] if broker_addr else self.master_addrs(cluster)
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
        return admin_impl.fetch_subscribe_message_queues(self._m(), topic)

    # --- messages -----------------------------------------------------------------------------------
    def query_message(self, topic: str, key: str, max_num: int = 32, begin: int = 0, end: int = LONG_MAX) -> list[MessageExt]:
        return admin_impl.query_message(self._m(), topic, key, max_num, begin, end)

    def query_message_by_uniq_key(self, topic: str, uniq_key: str) -> MessageExt | None:
        found = admin_impl.query_message(self._m(), topic, uniq_key, 32, 0, LONG_MAX, unique_key=True)
        return found[0] if found else None

    def view_message(self, msg_id: str, topic: str | None = None) -> MessageExt:
        if topic is None:
            return admin_impl.view_message(self._m(), msg_id)
        return admin_impl.view_message_any(self._m(), topic, msg_id)

    # --- offsets ------------------------------------------------------------------------------------
    def max_offset(self, mq: MessageQueue) -> int:
        return admin_impl.max_offset(self._m(), mq)

    def min_offset(self, mq: MessageQueue) -> int:
        return admin_impl.min_offset(self._m(), mq)

    def search_offset(self, mq: MessageQueue, timestamp: int) -> int:
        return admin_impl.search_offset(self._m(), mq, timestamp)

    def earliest_msg_store_time(self, mq: MessageQueue) -> int:
        return admin_impl.earliest_msg_store_time(self._m(), mq)

    def update_consumer_offset(self, group: str, mq: MessageQueue, offset: int) -> None:
        """updateConsumeOffset: the group's committed offset of the queue, set on its broker."""
        admin_impl.queue_call(self._m(), RequestCode.UPDATE_CONSUMER_OFFSET, mq,
                              {"consumerGroup": group, "commitOffset": offset})

    def query_consumer_offset(self, group: str, mq: MessageQueue) -> int:
        """-1 when the group has no offset for the queue (QUERY_NOT_FOUND)."""
        try:
            r = admin_impl.queue_call(self._m(), RequestCode.QUERY_CONSUMER_OFFSET, mq, {"consumerGroup": group})
        except MQBrokerError as e:
            if e.code == ResponseCode.QUERY_NOT_FOUND:
                return -1
            raise
        return int(r.field("offset"))
