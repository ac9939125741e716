"""AdminBrokerProcessor: topics, subscription groups, the broker's configuration, queue offsets, client
connections and the ordered-consumption locks. Its statistics requests are in admin_stats.py."""
from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
from pathlib import Path

from ..acl import INNER_CREDENTIALS_KEY
from ..errors import ConfigError
from ..remoting import fastjson
from ..remoting.codes import RequestCode, ResponseCode
from ..remoting.command import RemotingCommand
from ..store.consumequeue import queue_clean
from .admin_stats import message_queue_key
from .context import BrokerContext
from .header import Header
from .net import Channel
from .rebalance_lock import RebalanceLockManager
from .send import valid_topic_name
from .state import SubscriptionGroupConfig

log = logging.getLogger(__name__)

# UPDATE_BROKER_CONFIG's keys: what this broker reads from its configuration at each use
RUNTIME_KEYS = frozenset({"longPollingEnable", "shortPollingTimeMills", "autoCreateTopicEnable",
                          "defaultTopicQueueNums", "maxMessageSize",
                          "fileReservedTime", "deleteWhen", "diskMaxUsedSpaceRatio", "defaultQueryMaxNum"})

CALL_CLIENT_TIMEOUT = 10.0      # Broker2Client.callClient's invokeSync timeout
V3_1_8_SNAPSHOT = 77            # MQVersion.Version.V3_1_8_SNAPSHOT.ordinal(): callConsumer's oldest client


def connection_json(info) -> dict:
    """Connection: one client's channel."""
    return {"clientAddr": info.channel.remote, "clientId": info.client_id, "language": info.language,
            "version": info.version}


def groups_with_offsets(offsets, topic: str) -> set[str]:
    """ConsumerOffsetManager.whichGroupByTopic: the groups with an offset on topic."""
    out = set()
    for key in list(offsets.offset_table):
        t, sep, g = key.rpartition("@")
        if sep and t == topic:
            out.add(g)
    return out


def properties_text(props: dict[str, str]) -> str:
    """MixAll.properties2String: key=value lines."""
    return "".join(f"{k}={v}\n" for k, v in props.items())


def parse_properties(text: str) -> dict[str, str]:
    """MixAll.string2Properties (key=value lines; # comments and blank lines skipped)."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        k, sep, v = line.partition("=")
        if sep:
            out[k.strip()] = v.strip()
    return out


def apply_runtime_properties(cfg, props: dict[str, str], source: str | None = None) -> None:
    """Set RUNTIME_KEYS values on the live configuration: all of them or, when one is wrong, none (the
    ConfigError names the key, the value and source)."""
    trial = copy.deepcopy(cfg).update(props, source)
    for k in props:
        attr = cfg.attr_name(k)
        if attr is not None:
            setattr(cfg, attr, getattr(trial, attr))
        else:
            cfg.extra[k] = trial.extra[k]           # as the configuration keeps it (booleans normalised)


def persisted_config_path(store_root) -> Path:
    """Where UPDATE_BROKER_CONFIG persists the configuration (RocketMQ: Configuration.persist)."""
    return Path(store_root) / "config" / "broker.properties"


def load_persisted_config(store_root, cfg) -> dict[str, str]:
    """At start (`rmqstore serve`): the RUNTIME_KEYS of <store>/config/broker.properties (what
    updateBrokerConfig set before a restart) over broker.conf's values; the other keys in that file are
    copies of broker.conf's and are not read. Returns what it applied; a ConfigError names the file."""
    path = persisted_config_path(store_root)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError("broker.properties", str(path), f"cannot read the persisted broker config: {e}",
                          str(path)) from e
    props = {k: v for k, v in parse_properties(text).items() if k in RUNTIME_KEYS}
    if props:
        apply_runtime_properties(cfg, props, str(path))
        log.info("broker config from %s: %s", path, props)
    return props


class AdminBrokerProcessor:
    def __init__(self, ctx: BrokerContext):
        self.ctx = ctx
        self.locks = RebalanceLockManager()

    # --- topics -------------------------------------------------------------------------------------
    def update_and_create_topic(self, ch: Channel, req: RemotingCommand):
        h = Header(req.ext_fields)
        topic = h.str("topic")
        if topic == self.ctx.cfg.broker_cluster_name:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"the topic[{topic}] is conflict with system reserved words.")
        if not valid_topic_name(topic):
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"the topic[{topic[:200]}] is not a valid topic name")
        h.str("defaultTopic")
        rq, wq, perm = h.int("readQueueNums"), h.int("writeQueueNums"), h.int("perm")
        if not (0 <= rq <= 65535 and 0 <= wq <= 65535):
            return req.make_response(ResponseCode.SYSTEM_ERROR, "queue numbers out of range")
        h.str("topicFilterType")
        try:
            self.ctx.topics.create_topic(topic, wq, perm, read_queue_nums=rq, order=h.bool("order"),
                                         topic_sys_flag=h.int("topicSysFlag", False, 0))
        except ValueError as e:
            return req.make_response(ResponseCode.SYSTEM_ERROR, str(e))
        return req.make_response(ResponseCode.SUCCESS)

    def delete_topic(self, ch: Channel, req: RemotingCommand):
        """DELETE_TOPIC_IN_BROKER: the topic's config goes, and its consume queues with it. RocketMQ runs the
        whole cleanUnusedTopic here; this broker removes only the deleted topic's queues, since a store
        written through the library may hold topics that never had a config (cleanUnusedTopic, asked
        for, removes those too)."""
        topic = Header(req.ext_fields).str("topic")
        self.ctx.topics.delete_topic(topic)
        store = self.ctx.store
        return self.ctx.in_executor(lambda: store.delete_topic(topic),
                                    lambda removed: req.make_response(ResponseCode.SUCCESS))

    def get_all_topic_config(self, ch: Channel, req: RemotingCommand):
        return req.make_response(ResponseCode.SUCCESS, body=fastjson.dumps_bytes(self.ctx.topics.encode()))

    def get_system_topic_list(self, ch: Channel, req: RemotingCommand):
        """GET_SYSTEM_TOPIC_LIST_FROM_BROKER: TopicList of the system topics this broker has."""
        system = {"SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TBW102",
                  "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT", "BenchmarkTest", self.ctx.cfg.broker_cluster_name,
                  self.ctx.cfg.broker_name}
        topics = sorted(t for t in self.ctx.topics.table if t in system)
        return req.make_response(ResponseCode.SUCCESS, body=fastjson.dumps_bytes({"topicList": topics}))

    # --- subscription groups ------------------------------------------------------------------------
    def update_and_create_subscription_group(self, ch: Channel, req: RemotingCommand):
        try:
            sgc = SubscriptionGroupConfig.from_json(fastjson.loads(req.body or b""))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"bad SubscriptionGroupConfig body: {e}")
        self.ctx.groups.update(sgc)
        return req.make_response(ResponseCode.SUCCESS)

    def get_all_subscription_group(self, ch: Channel, req: RemotingCommand):
        return req.make_response(ResponseCode.SUCCESS, body=fastjson.dumps_bytes(self.ctx.groups.encode()))

    def delete_subscription_group(self, ch: Channel, req: RemotingCommand):
        self.ctx.groups.delete(Header(req.ext_fields).str("groupName"))
        return req.make_response(ResponseCode.SUCCESS)

    # --- the broker's configuration -----------------------------------------------------------------
    def config_properties(self) -> dict[str, str]:
        """Configuration.getAllConfigs as this broker knows them: the store's settings and the broker keys
        it was given."""
        props = parse_properties(self.ctx.cfg.to_properties())
        if not props.get("storePathRootDir"):
            props["storePathRootDir"] = str(getattr(self.ctx.store, "path", ""))
        for k, v in (self.ctx.cfg.extra or {}).items():
            if k != INNER_CREDENTIALS_KEY:       # a secret: never answered nor persisted
                props.setdefault(k, str(v))
        return props

    def get_broker_config(self, ch: Channel, req: RemotingCommand):
        body = properties_text(self.config_properties()).encode()
        version = json.dumps(self.ctx.groups.data_version, separators=(",", ":"))
        return req.make_response(ResponseCode.SUCCESS, None, {"version": version}, body)

    def update_broker_config(self, ch: Channel, req: RemotingCommand):
        """UPDATE_BROKER_CONFIG: the keys this broker reads at run time (RUNTIME_KEYS) change now and are
        written to <store>/config/broker.properties (RocketMQ's Configuration.persist); any other key is
        refused, named in the remark."""
        try:
            props = parse_properties((req.body or b"").decode("utf-8"))
        except UnicodeDecodeError as e:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"the properties are not UTF-8: {e}")
        fixed = sorted(k for k in props if k not in RUNTIME_KEYS)
        if fixed:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"not changeable at run time: {', '.join(fixed)} "
                                     f"(changeable: {', '.join(sorted(RUNTIME_KEYS))})")
        try:
            apply_runtime_properties(self.ctx.cfg, props)
        except Exception as e:                 # ConfigError: the key and value that are wrong
            return req.make_response(ResponseCode.SYSTEM_ERROR, str(e))
        try:
            self._persist_config()
        except OSError as e:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"updated, but not persisted: {e}")
        log.info("broker config updated from %s: %s", ch.remote, props)
        return req.make_response(ResponseCode.SUCCESS)

    def _persist_config(self) -> None:
        root = getattr(self.ctx.store, "path", None)
        if root is None:
            return
        path = persisted_config_path(root)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(properties_text(self.config_properties()))
        os.replace(tmp, path)

    # --- queue offsets ------------------------------------------------------------------------------
    def reset_offset(self, ch: Channel, req: RemotingCommand):
        """INVOKE_BROKER_TO_RESET_OFFSET (Broker2Client.resetOffset): per queue, the offset of the timestamp
        (-1: the max offset) where it is below the group's (or always, isForce), sent to the group's online
        clients as RESET_CONSUMER_CLIENT_OFFSET; CONSUMER_NOT_ONLINE without one (mqadmin then sets the
        offsets itself, with UPDATE_CONSUMER_OFFSET)."""
        ctx = self.ctx
        h = Header(req.ext_fields)
        topic, group, ts, force = h.str("topic"), h.str("group"), h.long("timestamp"), h.bool("isForce")
        tc = ctx.topics.select(topic)
        if tc is None:
            return req.make_response(ResponseCode.SYSTEM_ERROR,
                                     f"[reset-offset] reset offset failed, no topic in this broker. topic={topic}")
        table = {}
        for i in range(tc.write_queue_nums):
            cur = ctx.offsets.query_offset(group, topic, i)
            if cur == -1:
                return req.make_response(ResponseCode.SYSTEM_ERROR, f"THe consumer group <{group}> not exist")
            to = ctx.store.get_max_offset_in_queue(topic, i) if ts == -1 else \
                ctx.store.get_offset_in_queue_by_time(topic, i, ts)
            to = max(0, to)
            table[message_queue_key(topic, ctx.cfg.broker_name, i)] = to if force or to < cur else cur
        body = fastjson.dumps_bytes({"offsetTable": table})
        gi = ctx.clients.group_info(group)
        if gi is None or not gi.channels:
            return req.make_response(ResponseCode.CONSUMER_NOT_ONLINE,
                                     f"Consumer not online, so can not reset offset, Group: {group} Topic: {topic} "
                                     f"Timestamp: {ts}")
        cmd = RemotingCommand.request(RequestCode.RESET_CONSUMER_CLIENT_OFFSET,
                                      {"topic": topic, "group": group, "timestamp": str(ts)}, oneway=True)
        cmd.body = body
        for c in list(gi.channels):
            c.oneway(cmd)
        return req.make_response(ResponseCode.SUCCESS, body=body)


    def search_offset_by_timestamp(self, ch: Channel, req: RemotingCommand):
        h = Header(req.ext_fields)
        off = self.ctx.store.get_offset_in_queue_by_time(h.str("topic"), h.int("queueId"), h.long("timestamp"))
        return req.make_response(ResponseCode.SUCCESS, None, {"offset": str(off)})

    def get_max_offset(self, ch: Channel, req: RemotingCommand):
        h = Header(req.ext_fields)
        off = self.ctx.store.get_max_offset_in_queue(h.str("topic"), h.int("queueId"))
        return req.make_response(ResponseCode.SUCCESS, None, {"offset": str(off)})

    def get_min_offset(self, ch: Channel, req: RemotingCommand):
        h = Header(req.ext_fields)
        off = self.ctx.store.get_min_offset_in_queue(h.str("topic"), h.int("queueId"))
        return req.make_response(ResponseCode.SUCCESS, None, {"offset": str(off)})

    def get_earliest_msg_storetime(self, ch: Channel, req: RemotingCommand):
        h = Header(req.ext_fields)
        ts = self.ctx.store.get_earliest_message_time(h.str("topic"), h.int("queueId"))
        return req.make_response(ResponseCode.SUCCESS, None, {"timestamp": str(ts)})

    def query_broker_offset(self, ch: Channel, req: RemotingCommand):
        return req.make_response(ResponseCode.SUCCESS, None, {"offset": str(self.ctx.store.get_max_phy_offset())})

    def get_all_consumer_offset(self, ch: Channel, req: RemotingCommand):
        """ConsumerOffsetManager.encode as fastjson writes it: queue ids as unquoted integer keys."""
        table = self.ctx.offsets.encode()["offsetTable"]
        body = {"offsetTable": {k: {int(q): o for q, o in m.items()} for k, m in table.items()}}
        return req.make_response(ResponseCode.SUCCESS, body=fastjson.dumps_bytes(body))

    def get_all_delay_offset(self, ch: Channel, req: RemotingCommand):
        """GET_ALL_DELAY_OFFSET (45), what a slave's SlaveSynchronize asks: ScheduleMessageService.encode."""
        sched = getattr(self.ctx.store, "schedule_service", None)
        if sched is None:
            return req.make_response(ResponseCode.SYSTEM_ERROR, "No delay offset in this broker")
        return req.make_response(ResponseCode.SUCCESS, body=fastjson.dumps_bytes(sched.encode()))

    # --- connections --------------------------------------------------------------------------------
    def get_consumer_connection_list(self, ch: Channel, req: RemotingCommand):
        group = Header(req.ext_fields).str("consumerGroup")
        gi = self.ctx.clients.group_info(group)
        if gi is None or not gi.channels:
            return req.make_response(ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
        body = {"connectionSet": [connection_json(i) for i in gi.channels.values()],
                "consumeFromWhere": gi.consume_from_where, "consumeType": gi.consume_type,
                "messageModel": gi.message_model,
                "subscriptionTable": {t: sd.to_json() for t, sd in gi.subscriptions.items()}}
        return req.make_response(ResponseCode.SUCCESS, body=fastjson.dumps_bytes(body))

    def get_producer_connection_list(self, ch: Channel, req: RemotingCommand):
        group = Header(req.ext_fields).str("producerGroup")
        chans = self.ctx.clients.producers.get(group)
        if not chans:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"the producer group[{group}] not exist")
        body = {"connectionSet": [connection_json(i) for i in chans.values()]}
        return req.make_response(ResponseCode.SUCCESS, body=fastjson.dumps_bytes(body))

    def query_topic_consume_by_who(self, ch: Channel, req: RemotingCommand):
        """GroupList: the online groups subscribed to the topic and the groups with an offset on it."""
        topic = Header(req.ext_fields).str("topic")
        groups = {g for g, gi in self.ctx.clients.consumers.items() if topic in gi.subscriptions}
        groups |= groups_with_offsets(self.ctx.offsets, topic)
        return req.make_response(ResponseCode.SUCCESS, body=fastjson.dumps_bytes({"groupList": sorted(groups)}))

    # --- asking a consumer (Broker2Client.callClient) ------------------------------------------------
    def get_consumer_running_info(self, ch: Channel, req: RemotingCommand):
        """GET_CONSUMER_RUNNING_INFO (AdminBrokerProcessor.callConsumer): the request (its extFields and body)
        goes to the client over its own connection; its answer (a ConsumerRunningInfo body) is relayed."""
        h = Header(req.ext_fields)
        group, client_id = h.str("consumerGroup"), h.str("clientId")
        gi = self.ctx.clients.group_info(group)
        info = next((i for i in gi.channels.values() if i.client_id == client_id and not i.channel.closed),
                    None) if gi is not None else None
        if info is None:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"The Consumer <{group}> <{client_id}> not online")
        if info.version < V3_1_8_SNAPSHOT:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"The Consumer <{client_id}> Version <{info.version}> "
                                     "too low to finish, please upgrade it to V3_1_8_SNAPSHOT")
        return self._call_client(req, info, group, client_id)

    async def _call_client(self, req: RemotingCommand, info, group: str, client_id: str) -> RemotingCommand:
        """Broker2Client.callClient: the request, as it came, to the client; its answer with our opaque."""
        cmd = RemotingCommand.request(req.code, dict(req.ext_fields or {}))
        cmd.body = req.body
        try:
            answer = await info.channel.invoke(cmd, CALL_CLIENT_TIMEOUT)
        except asyncio.TimeoutError:
            return req.make_response(ResponseCode.CONSUME_MSG_TIMEOUT,
                                     f"consumer <{group}> <{client_id}> Timeout: RemotingTimeoutException: wait "
                                     f"response on the channel <{info.channel.remote}> timeout, "
                                     f"{int(CALL_CLIENT_TIMEOUT * 1000)}(ms)")
        except (ConnectionError, OSError) as e:
            return req.make_response(ResponseCode.SYSTEM_ERROR,
                                     f"invoke consumer <{group}> <{client_id}> Exception: {type(e).__name__}: {e}")
        return req.make_response(answer.code, answer.remark, answer.ext_fields, answer.body)

    # --- cleaning the store's consume queues --------------------------------------------------------
    def clean_expired_consume_queue(self, ch: Channel, req: RemotingCommand):
        """CLEAN_EXPIRED_CONSUMEQUEUE: remove the consume queues whose messages all left the commitlog."""
        log.warning("invoke cleanExpiredConsumeQueue start (from %s).", ch.remote)
        store = self.ctx.store

        def done(removed):
            log.warning("invoke cleanExpiredConsumeQueue end: %d queues removed %s", len(removed), removed)
            return req.make_response(ResponseCode.SUCCESS)
        return self.ctx.in_executor(lambda: queue_clean.clean_expired_consumer_queue(store), done)

    def clean_unused_topic(self, ch: Channel, req: RemotingCommand):
        """CLEAN_UNUSED_TOPIC: remove the consume queues of topics this broker has no config for."""
        log.warning("invoke cleanUnusedTopic start (from %s).", ch.remote)
        store, topics = self.ctx.store, set(self.ctx.topics.table)

        def done(removed):
            log.warning("invoke cleanUnusedTopic end: %d queues removed %s", len(removed), removed)
            return req.make_response(ResponseCode.SUCCESS)
        return self.ctx.in_executor(lambda: queue_clean.clean_unused_topic(store, topics), done)

    # --- ordered consumption locks ------------------------------------------------------------------
    def lock_batch_mq(self, ch: Channel, req: RemotingCommand):
        try:
            body = fastjson.loads(req.body or b"{}")
            group, client = str(body["consumerGroup"]), str(body["clientId"])
            mqs = list(body.get("mqSet") or [])
        except (ValueError, KeyError, TypeError) as e:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"bad body: {e}")
        locked = self.locks.try_lock_batch(group, mqs, client)
        return req.make_response(ResponseCode.SUCCESS, body=fastjson.dumps_bytes({"lockOKMQSet": locked}))

    def unlock_batch_mq(self, ch: Channel, req: RemotingCommand):
        try:
            body = fastjson.loads(req.body or b"{}")
            group, client = str(body["consumerGroup"]), str(body["clientId"])
            self.locks.unlock_batch(group, list(body.get("mqSet") or []), client)
        except (ValueError, KeyError, TypeError) as e:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"bad body: {e}")
        return req.make_response(ResponseCode.SUCCESS)
