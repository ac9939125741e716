"""AdminBrokerProcessor's statistics requests: GET_BROKER_RUNTIME_INFO, GET_TOPIC_STATS_INFO,
GET_CONSUME_STATS, GET_BROKER_CONSUME_STATS and VIEW_BROKER_STATS_DATA, with RocketMQ 4.4.0's bodies
(KVTable, TopicStatsTable, ConsumeStats, ConsumeStatsList, BrokerStatsData)."""
from __future__ import annotations

import shutil

from ..remoting import fastjson
from ..remoting.codes import ResponseCode
from ..remoting.command import RemotingCommand
from .context import BrokerContext
from .header import Header
from .net import Channel

BROKER_VERSION = 293            # MQVersion.CURRENT_VERSION of 4.4.0
BROKER_VERSION_DESC = "V4_4_0"


def human_bytes(n: int) -> str:
    """MixAll.humanReadableByteCount(bytes, si=false)."""
    if n < 1024:
        return f"{n} B"
    exp = 0
    v = float(n)
    while v >= 1024 and exp < 6:
        v /= 1024
        exp += 1
    return f"{n / 1024 ** exp:.1f} {'KMGTPE'[exp - 1]}iB"


def message_queue_key(topic: str, broker_name: str, queue_id: int) -> fastjson.FrozenDict:
    """A MessageQueue as a fastjson map key."""
    return fastjson.FrozenDict({"brokerName": broker_name, "queueId": queue_id, "topic": topic})


class AdminStatsProcessor:
    def __init__(self, ctx: BrokerContext):
        self.ctx = ctx

    # --- GET_BROKER_RUNTIME_INFO --------------------------------------------------------------------
    def runtime_info(self) -> dict[str, str]:
        """AdminBrokerProcessor.prepareRuntimeInfo (with DefaultMessageStore's and StoreStatsService's)."""
        ctx = self.ctx
        store, stats = ctx.store, ctx.stats
        info = stats.store.runtime_info(stats.now_ms())
        info.update(self._disk_info())
        info["commitLogMinOffset"] = str(store.get_min_phy_offset())
        info["commitLogMaxOffset"] = str(store.get_max_phy_offset())
        info["brokerVersionDesc"] = BROKER_VERSION_DESC
        info["brokerVersion"] = str(BROKER_VERSION)
        info.update(stats.daily_info())
        # one event loop, no thread pools: their queues are always empty (capacities: BrokerConfig's defaults)
        for pool, capacity in (("send", 10000), ("pull", 100000), ("query", 20000)):
            info[f"{pool}ThreadPoolQueueSize"] = "0"
            info[f"{pool}ThreadPoolQueueCapacity"] = str(capacity)
            info[f"{pool}ThreadPoolQueueHeadWaitTimeMills"] = "0"
        info["EndTransactionQueueSize"] = "0"
        info["EndTransactionThreadPoolQueueCapacity"] = "100000"
        info["dispatchBehindBytes"] = str(store.dispatch_behind_bytes())
        info["pageCacheLockTimeMills"] = "0"
        info["earliestMessageTimeStamp"] = str(self._earliest_message_time())
        info["startAcceptSendRequestTimeStamp"] = "0"
        info["remainTransientStoreBufferNumbs"] = str(2 ** 31 - 1)
        info["remainHowManyDataToFlush"] = human_bytes(self._unflushed())
        ha = store.ha_status() if hasattr(store, "ha_status") else None
        if ha is not None:                  # replication (store/ha): role, slaves, acknowledged offset, lag
            info.update(ha.to_kv())
        return info

    def _disk_info(self) -> dict[str, str]:
        path = getattr(self.ctx.store, "path", None)
        if path is None:
            return {}
        try:
            du = shutil.disk_usage(path)
        except OSError:
            return {}
        ratio = str((du.total - du.free) / du.total if du.total else 0.0)
        return {"commitLogDiskRatio": ratio, "consumeQueueDiskRatio": ratio,
                "commitLogDirCapacity": f"Total : {human_bytes(du.total)}, Free : {human_bytes(du.free)}."}

    def _earliest_message_time(self) -> int:
        """getEarliestMessageTime: the store time of the first message in the commitlog (-1: none)."""
        store = self.ctx.store
        m = store.look_message_by_offset(store.get_min_phy_offset())
        return m.store_timestamp if m is not None else -1

    def _unflushed(self) -> int:
        """remainHowManyDataToFlush: what the last commitlog file holds beyond its flushed position."""
        files = self.ctx.store.commit_log.queue.files
        if not files:
            return 0
        last = files[-1]
        return max(0, last.wrote_position - last.flushed_position)

    def get_broker_runtime_info(self, ch: Channel, req: RemotingCommand):
        return req.make_response(ResponseCode.SUCCESS, body=fastjson.dumps_bytes({"table": self.runtime_info()}))

    # --- GET_TOPIC_STATS_INFO -----------------------------------------------------------------------
    def get_topic_stats_info(self, ch: Channel, req: RemotingCommand):
        ctx = self.ctx
        topic = Header(req.ext_fields).str("topic")
        tc = ctx.topics.select(topic)
        if tc is None:
            return req.make_response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        table = {}
        for i in range(tc.write_queue_nums):
            lo = max(0, ctx.store.get_min_offset_in_queue(topic, i))
            hi = max(0, ctx.store.get_max_offset_in_queue(topic, i))
            ts = ctx.store.get_message_store_timestamp(topic, i, hi - 1) if hi > 0 else 0
            table[message_queue_key(topic, ctx.cfg.broker_name, i)] = {
                "lastUpdateTimestamp": ts, "maxOffset": hi, "minOffset": lo}
        return req.make_response(ResponseCode.SUCCESS, body=fastjson.dumps_bytes({"offsetTable": table}))

    # --- GET_CONSUME_STATS / GET_BROKER_CONSUME_STATS -----------------------------------------------
    def consume_stats(self, group: str, topic: str, queues: str = "read") -> dict | None:
        """ConsumeStats of group on topic (None when the topic is unknown or the online group does not
        subscribe to it): per queue the broker's and the group's offsets and the store time of the last
        consumed message."""
        ctx = self.ctx
        tc = ctx.topics.select(topic)
        if tc is None:
            return None
        gi = ctx.clients.group_info(group)
        if gi is not None and gi.subscriptions and topic not in gi.subscriptions:
            return None
        table = {}
        n = tc.read_queue_nums if queues == "read" else tc.write_queue_nums
        for i in range(n):
            broker_off = max(0, ctx.store.get_max_offset_in_queue(topic, i))
            cons_off = max(0, ctx.offsets.query_offset(group, topic, i))
            ow = {"brokerOffset": broker_off, "consumerOffset": cons_off, "lastTimestamp": 0}
            if cons_off >= 1:
                ts = ctx.store.get_message_store_timestamp(topic, i, cons_off - 1)
                if ts > 0:
                    ow["lastTimestamp"] = ts
            table[message_queue_key(topic, ctx.cfg.broker_name, i)] = ow
        return {"consumeTps": ctx.stats.tps_group_get_nums(group, topic), "offsetTable": table}

    def get_consume_stats(self, ch: Channel, req: RemotingCommand):
        h = Header(req.ext_fields)
        group = h.str("consumerGroup")
        topic = h.str("topic", required=False)
        topics = [topic] if topic else sorted(self.ctx.offsets.which_topics_by_group(group))
        out = {"consumeTps": 0.0, "offsetTable": {}}
        for t in topics:
            cs = self.consume_stats(group, t)
            if cs is not None:
                out["offsetTable"].update(cs["offsetTable"])
                out["consumeTps"] += cs["consumeTps"]
        return req.make_response(ResponseCode.SUCCESS, body=fastjson.dumps_bytes(out))

    def get_broker_consume_stats(self, ch: Channel, req: RemotingCommand):
        """fetchAllConsumeStatsInBroker: ConsumeStatsList over every subscription group."""
        ctx = self.ctx
        is_order = Header(req.ext_fields).bool("isOrder")
        total_diff = 0
        lst = []
        for group in list(ctx.groups.table):
            per_group = []
            for topic in sorted(ctx.offsets.which_topics_by_group(group)):
                tc = ctx.topics.select(topic)
                if tc is None or (is_order and not tc.order):
                    continue
                cs = self.consume_stats(group, topic, queues="write")
                if cs is None:
                    continue
                total_diff += sum(o["brokerOffset"] - o["consumerOffset"] for o in cs["offsetTable"].values())
                per_group.append(cs)
            lst.append({group: per_group})
        body = {"brokerAddr": ctx.broker_addr, "consumeStatsList": lst, "totalDiff": total_diff}
        return req.make_response(ResponseCode.SUCCESS, body=fastjson.dumps_bytes(body))

    # --- VIEW_BROKER_STATS_DATA ---------------------------------------------------------------------
    def view_broker_stats_data(self, ch: Channel, req: RemotingCommand):
        h = Header(req.ext_fields)
        name, key = h.str("statsName"), h.str("statsKey")
        data = self.ctx.stats.broker_stats_data(name, key)
        if data is None:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"The stats <{name}> <{key}> not exist")
        return req.make_response(ResponseCode.SUCCESS, body=fastjson.dumps_bytes(data))
