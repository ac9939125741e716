"""The name server (RocketMQ's NamesrvController / RouteInfoManager), served by the same process.

Brokers register their topic configs (REGISTER_BROKER 103 over the network, or `register_broker` in
process for rmqstore's own broker); clients ask GET_ROUTEINTO_BY_TOPIC (105) and GET_BROKER_CLUSTER_INFO
(106). A topic no broker serves answers TOPIC_NOT_EXIST (17) with RocketMQ's remark; the Java producer
then asks for TBW102, which a broker registers only when autoCreateTopicEnable is on.
"""
from __future__ import annotations

import logging
import time
import zlib
from dataclasses import dataclass, field

from ..remoting import fastjson
from ..remoting.codes import RequestCode, ResponseCode
from ..remoting.command import RemotingCommand
from .net import Channel

log = logging.getLogger(__name__)

BROKER_CHANNEL_EXPIRED_TIME = 120.0     # seconds without a registration before a broker is dropped
FAQ_SUFFIX = "\nSee http://rocketmq.apache.org/docs/faq/ for further details."


@dataclass
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_syn_flag: int = 0

    def to_json(self) -> dict:
        return {"brokerName": self.broker_name, "perm": self.perm, "readQueueNums": self.read_queue_nums,
                "topicSynFlag": self.topic_syn_flag, "writeQueueNums": self.write_queue_nums}


@dataclass
class BrokerData:
    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"brokerAddrs": dict(self.broker_addrs), "brokerName": self.broker_name, "cluster": self.cluster}


@dataclass
class BrokerLiveInfo:
    last_update: float
    data_version: tuple
    channel: Channel | None
    ha_server_addr: str


class RouteInfoManager:
    def __init__(self):
        self.topic_queue_table: dict[str, dict[str, QueueData]] = {}
        self.broker_addr_table: dict[str, BrokerData] = {}
        self.cluster_addr_table: dict[str, set[str]] = {}
        self.broker_live_table: dict[str, BrokerLiveInfo] = {}

    def register_broker(self, cluster: str, broker_addr: str, broker_name: str, broker_id: int,
                        ha_server_addr: str, topic_config_wrapper: dict | None,
                        channel: Channel | None = None) -> None:
        self.cluster_addr_table.setdefault(cluster, set()).add(broker_name)
        bd = self.broker_addr_table.get(broker_name)
        first = bd is None
        if bd is None:
            bd = self.broker_addr_table[broker_name] = BrokerData(cluster, broker_name)
        # One address per id: a re-registration of the same address under a new id replaces the old one.
        for bid, addr in list(bd.broker_addrs.items()):
            if addr == broker_addr and bid != broker_id:
                del bd.broker_addrs[bid]
        old_addr = bd.broker_addrs.get(broker_id)
        bd.broker_addrs[broker_id] = broker_addr
        first = first or old_addr is None
        dv = ()
        if topic_config_wrapper:
            v = topic_config_wrapper.get("dataVersion") or {}
            dv = (v.get("timestamp"), v.get("counter"))
        prev = self.broker_live_table.get(broker_addr)
        if topic_config_wrapper is not None and broker_id == 0 and (first or prev is None or prev.data_version != dv):
            table = topic_config_wrapper.get("topicConfigTable") or {}
            for name, tc in table.items():
                try:
                    qd = QueueData(broker_name, int(tc.get("readQueueNums", 0)), int(tc.get("writeQueueNums", 0)),
                                   int(tc.get("perm", 6)), int(tc.get("topicSysFlag", 0)))
                except (TypeError, ValueError, AttributeError):
                    continue
                self.topic_queue_table.setdefault(str(name), {})[broker_name] = qd
            # topics the broker no longer has
            for topic, qds in list(self.topic_queue_table.items()):
                if broker_name in qds and topic not in table:
                    del qds[broker_name]
                    if not qds:
                        del self.topic_queue_table[topic]
        self.broker_live_table[broker_addr] = BrokerLiveInfo(time.monotonic(), dv, channel, ha_server_addr)

    def master_of(self, broker_name: str, broker_id: int) -> dict[str, str]:
        """What REGISTER_BROKER answers a slave (brokerId != 0) while its master is registered: masterAddr and
        the master's haServerAddr; nothing otherwise (RouteInfoManager.registerBroker's result)."""
        bd = self.broker_addr_table.get(broker_name)
        master = bd.broker_addrs.get(0) if bd is not None else None
        if broker_id == 0 or not master:
            return {}
        live = self.broker_live_table.get(master)
        return {"masterAddr": master, "haServerAddr": live.ha_server_addr if live is not None else None}

    def unregister_broker(self, cluster: str, broker_addr: str, broker_name: str, broker_id: int) -> None:
        self.broker_live_table.pop(broker_addr, None)
        bd = self.broker_addr_table.get(broker_name)
        removed_name = False
        if bd is not None:
            if bd.broker_addrs.get(broker_id) == broker_addr:
                del bd.broker_addrs[broker_id]
            if not bd.broker_addrs:
                del self.broker_addr_table[broker_name]
                removed_name = True
        if removed_name:
            names = self.cluster_addr_table.get(cluster)
            if names is not None:
                names.discard(broker_name)
                if not names:
                    del self.cluster_addr_table[cluster]
            for topic, qds in list(self.topic_queue_table.items()):
                qds.pop(broker_name, None)
                if not qds:
                    del self.topic_queue_table[topic]

    def on_channel_destroy(self, channel: Channel) -> None:
        for addr, info in list(self.broker_live_table.items()):
            if info.channel is channel:
                self._drop_addr(addr)

    def _drop_addr(self, addr: str) -> None:
        for name, bd in list(self.broker_addr_table.items()):
            for bid, a in list(bd.broker_addrs.items()):
                if a == addr:
                    self.unregister_broker(bd.cluster, addr, name, bid)
        self.broker_live_table.pop(addr, None)

    def scan_not_active(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for addr, info in list(self.broker_live_table.items()):
            if info.channel is not None and now - info.last_update > BROKER_CHANNEL_EXPIRED_TIME:
                log.warning("broker %s expired (no registration for %.0f s)", addr, now - info.last_update)
                if info.channel is not None:
                    info.channel.close()
                self._drop_addr(addr)

    def pickup_topic_route_data(self, topic: str) -> dict | None:
        qds = self.topic_queue_table.get(topic)
        if not qds:
            return None
        broker_datas = []
        for name in qds:
            bd = self.broker_addr_table.get(name)
            if bd is not None:
                broker_datas.append(bd.to_json())
        if not broker_datas:
            return None
        return {"brokerDatas": broker_datas, "filterServerTable": {},
                "queueDatas": [qd.to_json() for qd in qds.values()]}

    def cluster_info(self) -> dict:
        return {"brokerAddrTable": {n: bd.to_json() for n, bd in self.broker_addr_table.items()},
                "clusterAddrTable": {c: sorted(names) for c, names in self.cluster_addr_table.items()}}


class NameServer:
    """Request handling of the name server; `handle` is the RemotingServer handler."""

    def __init__(self):
        self.route = RouteInfoManager()
        self.kv: dict[str, dict[str, str]] = {}

    def on_close(self, channel: Channel) -> None:
        self.route.on_channel_destroy(channel)

    def handle(self, ch: Channel, req: RemotingCommand):
        code = req.code
        if code == RequestCode.GET_ROUTEINTO_BY_TOPIC:
            return self.get_route(req)
        if code == RequestCode.REGISTER_BROKER:
            return self.register(ch, req)
        if code == RequestCode.UNREGISTER_BROKER:
            f = req.ext_fields or {}
            try:
                self.route.unregister_broker(f["clusterName"], f["brokerAddr"], f["brokerName"], int(f["brokerId"]))
            except (KeyError, ValueError) as e:
                return req.make_response(ResponseCode.SYSTEM_ERROR, f"bad UNREGISTER_BROKER header: {e}")
            return req.make_response(ResponseCode.SUCCESS, None, {})
        if code == RequestCode.GET_BROKER_CLUSTER_INFO:
            return req.make_response(ResponseCode.SUCCESS, body=fastjson.dumps_bytes(self.route.cluster_info()))
        if code == RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER:
            body = {"topicList": sorted(self.route.topic_queue_table)}
            return req.make_response(ResponseCode.SUCCESS, body=fastjson.dumps_bytes(body))
        if code == RequestCode.GET_TOPICS_BY_CLUSTER:
            cluster = req.field("cluster", "")
            names = self.route.cluster_addr_table.get(cluster, set())
            topics = sorted(t for t, qds in self.route.topic_queue_table.items() if set(qds) & names)
            return req.make_response(ResponseCode.SUCCESS, body=fastjson.dumps_bytes({"topicList": topics}))
        if code == RequestCode.PUT_KV_CONFIG:
            ns, k, v = req.field("namespace"), req.field("key"), req.field("value")
            if ns is None or k is None or v is None:
                return req.make_response(ResponseCode.SYSTEM_ERROR, "namespace, key and value are required")
            self.kv.setdefault(ns, {})[k] = v
            return req.make_response(ResponseCode.SUCCESS)
        if code == RequestCode.GET_KV_CONFIG:
            ns, k = req.field("namespace"), req.field("key")
            v = self.kv.get(ns or "", {}).get(k or "")
            if v is None:
                return req.make_response(ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {ns} Key: {k}", {})
            return req.make_response(ResponseCode.SUCCESS, None, {"value": v})
        if code == RequestCode.DELETE_KV_CONFIG:
            self.kv.get(req.field("namespace") or "", {}).pop(req.field("key") or "", None)
            return req.make_response(ResponseCode.SUCCESS)
        if code == RequestCode.DELETE_TOPIC_IN_NAMESRV:     # RouteInfoManager.deleteTopic
            topic = req.field("topic")
            if topic is None:
                return req.make_response(ResponseCode.SYSTEM_ERROR, "the custom field <topic> is null")
            self.route.topic_queue_table.pop(topic, None)
            return req.make_response(ResponseCode.SUCCESS)
        if code == RequestCode.QUERY_DATA_VERSION:
            return req.make_response(ResponseCode.SUCCESS, None, {"changed": "true"})
        return not_supported(req)

    def get_route(self, req: RemotingCommand) -> RemotingCommand:
        topic = req.field("topic")
        if topic is None:
            return req.make_response(ResponseCode.SYSTEM_ERROR, "the custom field <topic> is null")
        data = self.route.pickup_topic_route_data(topic)
        if data is None:
            return req.make_response(ResponseCode.TOPIC_NOT_EXIST,
                                     f"No topic route info in name server for the topic: {topic}{FAQ_SUFFIX}")
        return req.make_response(ResponseCode.SUCCESS, body=fastjson.dumps_bytes(data))

    def register(self, ch: Channel, req: RemotingCommand) -> RemotingCommand:
        f = req.ext_fields or {}
        try:
            cluster, addr, name = f["clusterName"], f["brokerAddr"], f["brokerName"]
            broker_id = int(f["brokerId"])
        except (KeyError, ValueError) as e:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"bad REGISTER_BROKER header: {e}")
        wrapper = None
        if req.body:
            if f.get("compressed") == "true":
                return req.make_response(ResponseCode.SYSTEM_ERROR, "compressed registration bodies are not supported")
            crc = f.get("bodyCrc32")
            if crc not in (None, "0") and str(zlib.crc32(req.body) & 0x7FFFFFFF) != crc:
                return req.make_response(ResponseCode.SYSTEM_ERROR, "crc32 not match")
            try:
                body = fastjson.loads(req.body)
            except ValueError as e:
                return req.make_response(ResponseCode.SYSTEM_ERROR, f"bad registration body: {e}")
            if isinstance(body, dict):
                wrapper = body.get("topicConfigSerializeWrapper")
        self.route.register_broker(cluster, addr, name, broker_id, f.get("haServerAddr", ""), wrapper, ch)
        return req.make_response(ResponseCode.SUCCESS, None, self.route.master_of(name, broker_id))


def not_supported(req: RemotingCommand) -> RemotingCommand:
    return req.make_response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {req.code} not supported")


