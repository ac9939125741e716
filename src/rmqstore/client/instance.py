"""MQClientInstance: what producers and consumers of one client id share - connections, routes from the
name server, heartbeats to brokers, the rebalance trigger and a small scheduler thread.

Periodic work (RocketMQ's defaults): routes every 30 s (pollNameServerInterval), heartbeats every 30 s,
consumer offsets persisted every 5 s, rebalance every 20 s and at once on NOTIFY_CONSUMER_IDS_CHANGED,
response timeouts scanned every 200 ms.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import os
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from ..remoting import fastjson
from ..remoting.body import local_ip
from ..remoting.codes import (CLIENT_INNER_PRODUCER_GROUP, DEFAULT_TOPIC, MASTER_ID, PERM_READ, PERM_WRITE,
                              RequestCode, ResponseCode)
from ..remoting.command import RemotingCommand
from .message import MessageQueue, MQBrokerError, MQClientError
from .remoting import Connection, RemotingClient
from .running_info import answer_running_info

log = logging.getLogger(__name__)

POLL_NAME_SERVER_INTERVAL = 30.0
HEARTBEAT_BROKER_INTERVAL = 30.0
PERSIST_CONSUMER_OFFSET_INTERVAL = 5.0
REBALANCE_INTERVAL = 20.0
RPC_TIMEOUT = 3.0


class Scheduler:
    """One thread running delayed and periodic callables (RocketMQ's ScheduledExecutorService)."""

    def __init__(self, name: str):
        self._heap: list = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def call_later(self, delay: float, fn: Callable, *args) -> None:
        with self._cond:
            if self._stopped:
                return
            heapq.heappush(self._heap, (time.monotonic() + max(0.0, delay), next(self._seq), fn, args))
            self._cond.notify()

    def every(self, initial: float, period: float, fn: Callable) -> None:
        def tick():
            try:
                fn()
            finally:
                self.call_later(period, tick)
        self.call_later(initial, tick)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and (not self._heap or self._heap[0][0] > time.monotonic()):
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(timeout if timeout is None else max(0.0, min(timeout, 1.0)))
                if self._stopped:
                    return
                _, _, fn, args = heapq.heappop(self._heap)
            try:
                fn(*args)
            except Exception:
                log.exception("scheduled task %s failed", getattr(fn, "__name__", fn))

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._heap.clear()
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)


@dataclass
class TopicRoute:
    """TopicRouteData, parsed."""
    queue_datas: list[dict]
    broker_datas: list[dict]
    raw: dict = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: dict) -> "TopicRoute":
        return cls(list(d.get("queueDatas") or []), list(d.get("brokerDatas") or []), d)

    def broker_addrs(self) -> dict[str, dict[int, str]]:
        return {bd["brokerName"]: {int(k): v for k, v in (bd.get("brokerAddrs") or {}).items()}
                for bd in self.broker_datas}

    def signature(self) -> tuple:
        qs = tuple(sorted((q.get("brokerName"), q.get("readQueueNums"), q.get("writeQueueNums"), q.get("perm"))
                          for q in self.queue_datas))
        bs = tuple(sorted((b.get("brokerName"), tuple(sorted((b.get("brokerAddrs") or {}).items())))
                          for b in self.broker_datas))
        return qs, bs


class TopicPublishInfo:
    """The writable queues of a topic, chosen round-robin (TopicPublishInfo + MQFaultStrategy, no latency
    fault tolerance: the last failed broker is avoided on a retry)."""

    def __init__(self, topic: str, queues: list[MessageQueue], order: bool = False):
        self.topic = topic
        self.queues = queues
        self.order = order
        self._index = itertools.count(random.randrange(1 << 16))     # next() is atomic: no lock needed

    @property
    def ok(self) -> bool:
        return bool(self.queues)

    def select(self, last_broker: str | None = None) -> MessageQueue:
        i = next(self._index)
        n = len(self.queues)
        if last_broker is not None:
            for k in range(n):
                mq = self.queues[(i + k) % n]
                if mq.broker_name != last_broker:
                    return mq
        return self.queues[i % n]


def publish_info(topic: str, route: TopicRoute, max_queues: int | None = None) -> TopicPublishInfo:
    queues = []
    addrs = route.broker_addrs()
    for qd in sorted(route.queue_datas, key=lambda q: q.get("brokerName", "")):
        name = qd.get("brokerName")
        if not int(qd.get("perm", 0)) & PERM_WRITE or MASTER_ID not in addrs.get(name, {}):
            continue
        n = int(qd.get("writeQueueNums", 0))
        if max_queues is not None:
            n = min(n, max_queues)
        queues.extend(MessageQueue(topic, name, i) for i in range(n))
    return TopicPublishInfo(topic, queues)


def subscribe_info(topic: str, route: TopicRoute) -> set[MessageQueue]:
    out = set()
    for qd in route.queue_datas:
        if int(qd.get("perm", 0)) & PERM_READ:
            out.update(MessageQueue(topic, qd["brokerName"], i) for i in range(int(qd.get("readQueueNums", 0))))
    return out


def vip_addr(addr: str) -> str:
    host, _, port = addr.rpartition(":")
    try:
        p = int(port)
    except ValueError:
        return addr
    return f"{host}:{p - 2}" if p >= 2 else addr


class MQClientInstance:
    _instances: dict[str, "MQClientInstance"] = {}
    _registry_lock = threading.Lock()

    @classmethod
    def get(cls, namesrv_addr: str, instance_name: str | None = None, client_ip: str | None = None,
            **kw) -> "MQClientInstance":
        """The instance of a client id (shared by the producers and consumers of one process and instance
        name); clients signing with different access keys (rpc_hook) get instances of their own."""
        ip = client_ip or local_ip()
        client_id = f"{ip}@{instance_name or os.getpid()}"
        hook = kw.get("rpc_hook")
        key = client_id if hook is None else f"{client_id}#{hook.access_key}"
        with cls._registry_lock:
            inst = cls._instances.get(key)
            if inst is None or inst.closed:
                inst = cls._instances[key] = cls(client_id, namesrv_addr, **kw)
                inst._key = key
            inst.refs += 1
            return inst

    def __init__(self, client_id: str, namesrv_addr: str, *, language: str = "JAVA", vip_channel_enabled: bool = True,
                 rpc_hook=None):
        self.client_id = client_id
        self._key = client_id
        self.namesrv_addrs = [a.strip() for a in namesrv_addr.split(";") if a.strip()]
        if not self.namesrv_addrs:
            raise MQClientError("no name server address")
        self.language = language
        self.vip_channel_enabled = vip_channel_enabled
        self.remoting = RemotingClient(self._on_server_request, rpc_hook)
        self.routes: dict[str, TopicRoute] = {}
        self.broker_addrs: dict[str, dict[int, str]] = {}
        self.producers: dict[str, object] = {}
        self.consumers: dict[str, object] = {}
        self.refs = 0
        self.closed = False
        self._lock = threading.RLock()
        self._ns_index = random.randrange(len(self.namesrv_addrs))
        self.scheduler = Scheduler(f"rmq-client-{client_id}")
        self._rebalance_event = threading.Event()
        self._rebalance_thread = threading.Thread(target=self._rebalance_loop, name="rmq-rebalance", daemon=True)
        self._rebalance_thread.start()
        self.scheduler.every(0.2, 0.2, self.remoting.scan_timeouts)
        self.scheduler.every(0.01, POLL_NAME_SERVER_INTERVAL, self.update_all_routes)
        self.scheduler.every(1.0, HEARTBEAT_BROKER_INTERVAL, self.send_heartbeat_to_all_brokers)
        self.scheduler.every(PERSIST_CONSUMER_OFFSET_INTERVAL, PERSIST_CONSUMER_OFFSET_INTERVAL,
                             self.persist_all_consumer_offsets)
        self.scheduler.every(1.0, 1.0, self.update_missing_routes)

    # --- requests ----------------------------------------------------------------------------------
    def request(self, code: int, fields=None, body: bytes | None = None, oneway: bool = False) -> RemotingCommand:
        return RemotingCommand.request(code, fields, body, oneway, language=self.language)

    def invoke(self, addr: str, cmd: RemotingCommand, timeout: float = RPC_TIMEOUT) -> RemotingCommand:
        return self.remoting.invoke(addr, cmd, timeout)

    def broker_channel(self, addr: str) -> str:
        return vip_addr(addr) if self.vip_channel_enabled else addr

    # --- name server -------------------------------------------------------------------------------
    def _namesrv_invoke(self, cmd: RemotingCommand, timeout: float = RPC_TIMEOUT) -> RemotingCommand:
        last: Exception | None = None
        n = len(self.namesrv_addrs)
        for k in range(n):
            addr = self.namesrv_addrs[(self._ns_index + k) % n]
            try:
                r = self.remoting.invoke(addr, cmd, timeout)
                self._ns_index = (self._ns_index + k) % n
                return r
            except (OSError, TimeoutError) as e:
                last = e
                cmd = RemotingCommand(cmd.code, flag=cmd.flag, ext_fields=cmd.ext_fields, body=cmd.body,
                                      language=cmd.language)
        raise MQClientError(f"no name server answered: {last}")

    def fetch_route(self, topic: str, timeout: float = RPC_TIMEOUT) -> TopicRoute | None:
        """GET_ROUTEINTO_BY_TOPIC; None when the name server answers TOPIC_NOT_EXIST."""
        r = self._namesrv_invoke(self.request(RequestCode.GET_ROUTEINTO_BY_TOPIC, {"topic": topic}), timeout)
        if r.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        if r.code != ResponseCode.SUCCESS:
            raise MQBrokerError(r.code, r.remark)
        return TopicRoute.from_json(fastjson.loads(r.body or b"{}"))

    def update_route(self, topic: str, default: bool = False, default_queue_nums: int = 4) -> TopicRoute | None:
        """updateTopicRouteInfoFromNameServer; with `default`, TBW102's route trimmed to the client's
        defaultTopicQueueNums stands in for a topic the name server does not know."""
        try:
            route = self.fetch_route(DEFAULT_TOPIC if default else topic)
        except MQClientError as e:
            log.warning("route of %s: %s", topic, e)
            return self.routes.get(topic)
        if route is None:
            return None
        if default:
            # TBW102's route stands in for the producer only (consumers wait for the topic's own route)
            for qd in route.queue_datas:
                n = min(default_queue_nums, int(qd.get("readQueueNums", 0)))
                qd["readQueueNums"] = qd["writeQueueNums"] = n
            with self._lock:
                for name, addrs in route.broker_addrs().items():
                    self.broker_addrs[name] = addrs
            return route
        with self._lock:
            old = self.routes.get(topic)
            changed = old is None or old.signature() != route.signature()
            for name, addrs in route.broker_addrs().items():
                self.broker_addrs[name] = addrs
            if changed:
                self.routes[topic] = route
        for p in list(self.producers.values()):
            p._route_changed(topic, route, changed)
        for c in list(self.consumers.values()):
            c._route_changed(topic, route, changed)
        return route

    def update_all_routes(self) -> None:
        topics = set()
        for c in list(self.consumers.values()):
            topics.update(c.subscribed_topics())
        for p in list(self.producers.values()):
            topics.update(p.published_topics())
        for t in topics:
            self.update_route(t)

    def update_missing_routes(self) -> None:
        """Subscribed topics without a route yet (not created when the consumer started) are looked up every
        second rather than every 30 s; once one appears, heartbeat and rebalance at once."""
        found = False
        for c in list(self.consumers.values()):
            for t in c.subscribed_topics():
                if t not in c.topic_queues and self.update_route(t) is not None:
                    found = True
        if found:
            self.send_heartbeat_to_all_brokers()
            self.rebalance_immediately()

    def learn_brokers(self) -> None:
        """With no route known yet, learn the brokers from the name server's cluster info (so that a
        consumer's first heartbeat reaches them: it creates the group's retry topic)."""
        if self.broker_addrs:
            return
        try:
            r = self._namesrv_invoke(self.request(RequestCode.GET_BROKER_CLUSTER_INFO))
        except MQClientError as e:
            log.info("cluster info: %s", e)
            return
        if r.code != ResponseCode.SUCCESS or not r.body:
            return
        info = fastjson.loads(r.body)
        with self._lock:
            for name, bd in (info.get("brokerAddrTable") or {}).items():
                self.broker_addrs.setdefault(name, {int(k): v for k, v in (bd.get("brokerAddrs") or {}).items()})

    def find_broker_addr(self, broker_name: str, only_master: bool = True) -> str | None:
        addrs = self.broker_addrs.get(broker_name)
        if not addrs:
            return None
        if MASTER_ID in addrs:
            return addrs[MASTER_ID]
        return None if only_master else next(iter(addrs.values()))

    def find_broker_addr_in_subscribe(self, broker_name: str, broker_id: int = MASTER_ID) -> tuple[str | None, bool]:
        """RocketMQ's findBrokerAddressInSubscribe(name, id, false): the broker of that id, else the first
        one the route lists (a slave while its master is gone); and whether it is a slave."""
        addrs = self.broker_addrs.get(broker_name)
        if not addrs:
            return None, False
        bid = broker_id if broker_id in addrs else min(addrs)
        return addrs[bid], bid != MASTER_ID

    def find_broker_addr_in_admin(self, broker_name: str) -> str | None:
        """findBrokerAddressInAdmin: the master while it is in the route, else a slave (offsets)."""
        addrs = self.broker_addrs.get(broker_name)
        return addrs[min(addrs)] if addrs else None

    def broker_addr_of(self, mq: MessageQueue) -> str:
        """The master address of the queue's broker, asking the name server once if it is not known yet;
        MQClientError if there is none."""
        addr = self.find_broker_addr(mq.broker_name)
        if addr is None:
            self.update_route(mq.topic)
            addr = self.find_broker_addr(mq.broker_name)
        if addr is None:
            raise MQClientError(f"The broker[{mq.broker_name}] not exist")
        return addr

    def find_broker_addr_by_topic(self, topic: str) -> str | None:
        route = self.routes.get(topic)
        if route is None:
            return None
        for bd in route.broker_datas:
            addrs = {int(k): v for k, v in (bd.get("brokerAddrs") or {}).items()}
            if addrs:
                return addrs.get(MASTER_ID) or next(iter(addrs.values()))
        return None

    # --- heartbeats --------------------------------------------------------------------------------
    def heartbeat_data(self) -> dict:
        consumers = [c.consumer_data() for c in list(self.consumers.values())]
        producers = [{"groupName": g} for g in list(self.producers)] + [{"groupName": CLIENT_INNER_PRODUCER_GROUP}]
        return {"clientID": self.client_id, "consumerDataSet": consumers, "producerDataSet": producers}

    def send_heartbeat_to_all_brokers(self) -> None:
        if self.closed or (not self.producers and not self.consumers):
            return
        body = fastjson.dumps_bytes(self.heartbeat_data())
        has_consumers = bool(self.consumers)
        for name, addrs in list(self.broker_addrs.items()):
            for bid, addr in list(addrs.items()):
                if bid != MASTER_ID and not has_consumers:
                    continue
                try:
                    r = self.invoke(addr, self.request(RequestCode.HEART_BEAT, body=body))
                    if r.code != ResponseCode.SUCCESS:
                        log.warning("heartbeat to %s: %s %s", addr, r.code, r.remark)
                except (OSError, TimeoutError, MQClientError) as e:
                    log.info("heartbeat to %s failed: %s", addr, e)

    # --- rebalance ---------------------------------------------------------------------------------
    def rebalance_immediately(self) -> None:
        self._rebalance_event.set()

    def _rebalance_loop(self) -> None:
        while not self.closed:
            self._rebalance_event.wait(REBALANCE_INTERVAL)
            self._rebalance_event.clear()
            if self.closed:
                return
            self.do_rebalance()

    def do_rebalance(self) -> None:
        for c in list(self.consumers.values()):
            try:
                c.do_rebalance()
            except Exception:
                log.exception("rebalance of %s failed", getattr(c, "group", c))

    def persist_all_consumer_offsets(self) -> None:
        for c in list(self.consumers.values()):
            try:
                c.persist_offsets()
            except Exception:
                log.exception("persisting offsets of %s failed", getattr(c, "group", c))

    # --- requests from brokers ---------------------------------------------------------------------
    def _on_server_request(self, conn: Connection, cmd: RemotingCommand) -> None:
        code = cmd.code
        if code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            log.info("consumer ids of %s changed (from %s): rebalancing", cmd.field("consumerGroup"), conn.addr)
            self.rebalance_immediately()
            return
        if code == RequestCode.CHECK_TRANSACTION_STATE:
            group = cmd.field("producerGroup")
            for p in list(self.producers.values()):
                if group is None or getattr(p, "group", None) == group or len(self.producers) == 1:
                    handler = getattr(p, "_check_transaction_state", None)
                    if handler is not None:
                        self.scheduler.call_later(0, handler, conn.addr, cmd)
                        return
            return
        if code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET:
            self._reset_offset(cmd)
            return
        if code == RequestCode.GET_CONSUMER_RUNNING_INFO:     # mqadmin consumerStatus, through the broker
            try:
                conn.send(answer_running_info(self.consumers, cmd), None, want_future=False)
            except OSError:
                pass
            return
        if not cmd.is_oneway:
            resp = cmd.make_response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {code} not supported")
            try:
                conn.send(resp, None, want_future=False)
            except OSError:
                pass

    def _reset_offset(self, cmd: RemotingCommand) -> None:
        """RESET_CONSUMER_CLIENT_OFFSET: the group's consumer takes the broker's offsets (ResetOffsetBody)."""
        group, topic = cmd.field("group"), cmd.field("topic")
        c = self.consumers.get(group or "")
        if c is None or topic is None:
            return
        try:
            raw = (fastjson.loads(cmd.body or b"{}").get("offsetTable") or {})
            table = {MessageQueue(str(k["topic"]), str(k["brokerName"]), int(k["queueId"])): int(v)
                     for k, v in raw.items()}
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            log.warning("bad RESET_CONSUMER_CLIENT_OFFSET body: %s", e)
            return
        self.scheduler.call_later(0, c.reset_offset, topic, table)

    # --- registry ----------------------------------------------------------------------------------
    def register_producer(self, group: str, producer) -> None:
        with self._lock:
            if group in self.producers:
                raise MQClientError(f"the producer group [{group}] has been created before, specify another name")
            self.producers[group] = producer

    def register_consumer(self, group: str, consumer) -> None:
        with self._lock:
            if group in self.consumers:
                raise MQClientError(f"the consumer group [{group}] has been created before, specify another name")
            self.consumers[group] = consumer

    def unregister(self, producer_group: str | None = None, consumer_group: str | None = None) -> None:
        with self._lock:
            if producer_group is not None:
                self.producers.pop(producer_group, None)
            if consumer_group is not None:
                self.consumers.pop(consumer_group, None)
        fields = {"clientID": self.client_id}
        if producer_group is not None:
            fields["producerGroup"] = producer_group
        if consumer_group is not None:
            fields["consumerGroup"] = consumer_group
        for name, addrs in list(self.broker_addrs.items()):
            for addr in list(addrs.values()):
                try:
                    self.invoke(addr, self.request(RequestCode.UNREGISTER_CLIENT, fields))
                except (OSError, TimeoutError, MQClientError) as e:
                    log.info("unregister from %s failed: %s", addr, e)

    def release(self) -> None:
        with self._registry_lock:
            self.refs -= 1
            if self.refs > 0:
                return
            if MQClientInstance._instances.get(self._key) is self:
                del MQClientInstance._instances[self._key]
        self.close()

    def close(self) -> None:
        self.closed = True
        self._rebalance_event.set()
        self.scheduler.stop()
        self.remoting.close()
        if threading.current_thread() is not self._rebalance_thread:
            self._rebalance_thread.join(timeout=5)
