"""PushConsumer and PullConsumer: RocketMQ's DefaultMQPushConsumer and (lite / plain) pull consumers.

    c = PushConsumer("my_group", "127.0.0.1:9876", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    c.subscribe("TopicA", "TagA || TagB")
    c.register_message_listener(lambda msgs: ConsumeStatus.CONSUME_SUCCESS)
    c.start() ... c.shutdown()

    pc = PullConsumer("g2", "127.0.0.1:9876")
    pc.subscribe("TopicA", "*"); pc.start()
    msgs = pc.poll(timeout=1.0)                     # rebalanced queues, offsets committed automatically
    r = pc.pull(mq, "*", offset, 32)                # or the plain pull API on a queue of your choice

Clustering consumption: the queues of every subscribed topic (and of %RETRY%<group>) are shared among the
group's clients by AllocateMessageQueueAveragely over the broker's consumer list (GET_CONSUMER_LIST_BY_GROUP),
recomputed every 20 s and at once when the broker sends NOTIFY_CONSUMER_IDS_CHANGED. Each assigned queue is
pulled with long polling (PULL_MESSAGE with the suspend flag, 15 s); consumed offsets are committed to the
broker (UPDATE_CONSUMER_OFFSET every 5 s, the commitOffset of each pull, and at shutdown). A listener that
answers RECONSUME_LATER (or raises) has its messages sent back (CONSUMER_SEND_MSG_BACK): the broker
redelivers them through %RETRY%<group> after a delay, and to %DLQ%<group> after maxReconsumeTimes.
"""
from __future__ import annotations

import collections
import concurrent.futures
import logging
import queue as queue_mod
import threading
import time
from typing import Callable

from ..acl.signature import RemotingSigner, SessionCredentials
from ..filter import SQL92, MessageSelector
from ..remoting.subscription import SubscriptionData
from ..common.allocate import allocate_averagely  # AllocateMessageQueueAveragely
from ..remoting.codes import (MASTER_ID, PROPERTY_CONSUME_START_TIMESTAMP, PROPERTY_MAX_OFFSET, PROPERTY_MIN_OFFSET,
                              PROPERTY_RETRY_TOPIC, PULL_FLAG_COMMIT_OFFSET, PULL_FLAG_SUBSCRIPTION, PULL_FLAG_SUSPEND,
                              RETRY_GROUP_TOPIC_PREFIX, RequestCode, ResponseCode)
from ..remoting import fastjson
from ..remoting.command import RemotingCommand
from . import admin_impl
from .instance import MQClientInstance
from .message import (ConsumeFromWhere, ConsumeStatus, MessageExt, MessageModel, MessageQueue, MQBrokerError,
                      MQClientError, PullResult, PullStatus, decode_messages)
from .rebalance import RebalanceImpl

log = logging.getLogger(__name__)


def subscription_data(topic: str, expression: "str | MessageSelector") -> SubscriptionData:
    """FilterAPI.build: tags, or a MessageSelector's SQL92 selector (sent as is: the broker compiles it)."""
    if isinstance(expression, MessageSelector):
        if expression.is_sql:
            return SubscriptionData.build(topic, expression.expression, SQL92)
        expression = expression.expression
    return SubscriptionData.build(topic, expression)


PULL_TIME_DELAY_WHEN_EXCEPTION = 3.0
PULL_TIME_DELAY_WHEN_FLOW_CONTROL = 0.05
BROKER_SUSPEND_MAX_TIME_MILLIS = 15000
CONSUMER_TIMEOUT_WHEN_SUSPEND = 30.0
_CONSUME_SUCCESS = ConsumeStatus.CONSUME_SUCCESS.value   # a listener may answer the in-process API's member
_PULL_STATUS = {ResponseCode.SUCCESS: PullStatus.FOUND, ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
                ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
                ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL}


class ProcessQueue:
    """The messages of one queue pulled but not yet consumed (RocketMQ's ProcessQueue)."""

    def __init__(self):
        self.msgs: dict[int, MessageExt] = {}
        self._order: collections.deque[int] = collections.deque()
        self.max_offset = -1
        self.dropped = False
        self.lock = threading.Lock()
        self.last_pull = time.monotonic()
        self.last_consume = self.last_pull     # ProcessQueue.lastConsumeTimestamp (consumerStatus shows it)
        self.size = 0

    def put(self, msgs: list[MessageExt]) -> None:
        with self.lock:
            for m in msgs:
                off = m.queue_offset
                if off not in self.msgs:
                    self.msgs[off] = m
                    self._order.append(off)
                    self.size += len(m.body)
                    if off > self.max_offset:
                        self.max_offset = off

    def remove(self, msgs: list[MessageExt]) -> int:
        """Drop consumed messages; the offset to commit (smallest still pending, or past the last), -1 if none."""
        with self.lock:
            if not self.msgs:
                return -1
            result = self.max_offset + 1
            self.last_consume = time.monotonic()
            for m in msgs:
                got = self.msgs.pop(m.queue_offset, None)
                if got is not None:
                    self.size -= len(got.body)
            order = self._order
            while order and order[0] not in self.msgs:
                order.popleft()
            if self.msgs:
                result = order[0]
            return result

    def __len__(self) -> int:
        return len(self.msgs)


class RemoteOffsetStore:
    """RemoteBrokerOffsetStore: offsets kept in memory, read from and persisted to the broker."""

    def __init__(self, consumer: "_ConsumerBase"):
        self.c = consumer
        self.table: dict[MessageQueue, int] = {}
        self.lock = threading.Lock()

    def update(self, mq: MessageQueue, offset: int, increase_only: bool = False) -> None:
        with self.lock:
            old = self.table.get(mq)
            if old is None or not increase_only or offset > old:
                self.table[mq] = offset

    def read_memory(self, mq: MessageQueue) -> int:
        return self.table.get(mq, -1)

    def read_store(self, mq: MessageQueue) -> int:
        """-1: the broker has none (QUERY_NOT_FOUND); -2: no answer."""
        mqc = self.c._mq()
        addr = mqc.find_broker_addr_in_admin(mq.broker_name) or self._refresh(mq)
        if addr is None:
            return -2
        try:
            r = mqc.invoke(mqc.broker_channel(addr), mqc.request(RequestCode.QUERY_CONSUMER_OFFSET, {
                "consumerGroup": self.c.group, "topic": mq.topic, "queueId": mq.queue_id}), 5.0)
        except (OSError, TimeoutError, MQClientError) as e:
            log.warning("query offset of %s failed: %s", mq, e)
            return -2
        if r.code == ResponseCode.QUERY_NOT_FOUND:
            return -1
        if r.code != ResponseCode.SUCCESS:
            log.warning("query offset of %s: %s %s", mq, r.code, r.remark)
            return -2
        off = int(r.field("offset", "-1"))
        self.update(mq, off)
        return off

    def _refresh(self, mq: MessageQueue) -> str | None:
        mqc = self.c._mq()
        mqc.update_route(mq.topic)
        return mqc.find_broker_addr_in_admin(mq.broker_name)

    def persist(self, mqs, oneway: bool = True) -> None:
        mqc = self.c.mq
        if mqc is None:
            return
        with self.lock:
            items = [(mq, off) for mq, off in self.table.items() if mq in mqs]
        for mq, off in items:
            addr = mqc.find_broker_addr_in_admin(mq.broker_name)
            if addr is None:
                continue
            cmd = mqc.request(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": self.c.group, "topic": mq.topic,
                                                                   "queueId": mq.queue_id, "commitOffset": off},
                              oneway=oneway)
            try:
                if oneway:
                    mqc.remoting.invoke_oneway(mqc.broker_channel(addr), cmd)
                else:
                    mqc.invoke(mqc.broker_channel(addr), cmd, 3.0)
            except (OSError, TimeoutError, MQClientError) as e:
                log.info("persisting the offset of %s failed: %s", mq, e)

    def remove(self, mq: MessageQueue) -> None:
        with self.lock:
            self.table.pop(mq, None)


class _PullRequest:
    __slots__ = ("mq", "pq", "next_offset")

    def __init__(self, mq: MessageQueue, pq: ProcessQueue, next_offset: int):
        self.mq = mq
        self.pq = pq
        self.next_offset = next_offset


class _ConsumerBase(RebalanceImpl):
    consume_type = "CONSUME_PASSIVELY"

    def __init__(self, group: str, namesrv_addr: str = "127.0.0.1:9876", *, instance_name: str | None = None,
                 consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                 consume_timestamp: int | None = None, pull_batch_size: int = 32, pull_threshold_for_queue: int = 1000,
                 pull_threshold_size_for_queue: int = 100 * 1024 * 1024,
                 broker_suspend_max_time_millis: int = BROKER_SUSPEND_MAX_TIME_MILLIS,
                 allocate: Callable[[str, str, list, list], list] = allocate_averagely,
                 vip_channel_enabled: bool = True, language: str = "JAVA", client_ip: str | None = None,
                 credentials: SessionCredentials | None = None):
        """credentials: plain ACL's access and secret key; every request is then signed (AclClientRPCHook)."""
        self.group = group
        self.namesrv_addr = namesrv_addr
        self.instance_name = instance_name
        self.consume_from_where = ConsumeFromWhere.of(consume_from_where)
        self.consume_timestamp = consume_timestamp
        self.pull_batch_size = pull_batch_size
        self.pull_threshold_for_queue = pull_threshold_for_queue
        self.pull_threshold_size_for_queue = pull_threshold_size_for_queue
        self.broker_suspend_max_time_millis = broker_suspend_max_time_millis
        self.allocate = allocate
        self.vip_channel_enabled = vip_channel_enabled
        self.language = language
        self.client_ip = client_ip
        self._signer = RemotingSigner(credentials) if credentials is not None else None
        self.message_model = MessageModel.CLUSTERING
        self.subscriptions: dict[str, SubscriptionData] = {}
        self.topic_queues: dict[str, set[MessageQueue]] = {}
        self.process_queues: dict[MessageQueue, ProcessQueue] = {}
        self.offset_store = RemoteOffsetStore(self)
        self.pull_from_which_node: dict[MessageQueue, int] = {}     # suggestWhichBrokerId of each queue's last pull
        self.mq: MQClientInstance | None = None
        self._rebalance_lock = threading.Lock()
        self.running = False
        self.start_timestamp = 0     # epoch ms of start() (PROP_CONSUMER_START_TIMESTAMP of consumerStatus)

    # --- configuration ------------------------------------------------------------------------------
    def subscribe(self, topic: str, expression: "str | MessageSelector" = "*") -> None:
        """`expression`: tags ("TagA || TagB", "*") or a MessageSelector (MessageSelector.by_sql(...))."""
        self.subscriptions[topic] = subscription_data(topic, expression)
        if self.mq is not None:
            self.mq.update_route(topic)
            self.mq.send_heartbeat_to_all_brokers()
            self.mq.rebalance_immediately()

    def unsubscribe(self, topic: str) -> None:
        self.subscriptions.pop(topic, None)

    def subscribed_topics(self) -> list[str]:
        return list(self.subscriptions)

    def consumer_data(self) -> dict:
        return {"consumeFromWhere": self.consume_from_where.value, "consumeType": self.consume_type,
                "groupName": self.group, "messageModel": self.message_model.value,
                "subscriptionDataSet": [sd.to_json() for sd in self.subscriptions.values()], "unitMode": False}

    def _mq(self) -> MQClientInstance:
        if self.mq is None:
            raise MQClientError("the consumer is not started")
        return self.mq

    # --- life ---------------------------------------------------------------------------------------
    def _subscribe_retry(self) -> None:
        retry = RETRY_GROUP_TOPIC_PREFIX + self.group
        if retry not in self.subscriptions:
            self.subscriptions[retry] = SubscriptionData.build(retry, "*")

    def start(self):
        if self.mq is not None:
            return self
        name = self.instance_name
        for attempt in range(64):
            inst = MQClientInstance.get(self.namesrv_addr, name, self.client_ip, language=self.language,
                                        vip_channel_enabled=self.vip_channel_enabled, rpc_hook=self._signer)
            try:
                inst.register_consumer(self.group, self)
                break
            except MQClientError:
                inst.release()
                if self.instance_name is not None:
                    raise
                import os
                name = f"{os.getpid()}#{attempt + 1}"   # another consumer of this group in this process
        else:
            raise MQClientError(f"cannot register consumer group {self.group}")
        self.mq = inst
        self.running = True
        self.start_timestamp = int(time.time() * 1000)
        try:
            for t in list(self.subscriptions):
                inst.update_route(t)
            inst.learn_brokers()
            if self.consume_type == "CONSUME_PASSIVELY":
                self._check_client_in_broker()
            inst.send_heartbeat_to_all_brokers()
            for t in list(self.subscriptions):
                if t not in self.topic_queues:
                    inst.update_route(t)
            self.do_rebalance()
        except Exception:
            self.shutdown()
            raise
        return self

    def _check_client_in_broker(self) -> None:
        """MQClientInstance.checkClientInBroker: each non-TAG subscription checked (CHECK_CLIENT_CONFIG) by a
        broker of its topic; a refusal (a selector that does not compile) fails start()."""
        mqc = self._mq()
        for sd in self.subscriptions.values():
            if sd.expression_type == "TAG":
                continue
            addr = mqc.find_broker_addr_by_topic(sd.topic)
            if addr is None:
                continue
            body = fastjson.dumps_bytes({"clientId": mqc.client_id, "group": self.group,
                                         "subscriptionData": sd.to_json()})
            resp = mqc.invoke(addr, mqc.request(RequestCode.CHECK_CLIENT_CONFIG, None, body))
            if resp.code != ResponseCode.SUCCESS:
                raise MQBrokerError(resp.code, resp.remark, addr)

    def shutdown(self) -> None:
        mq = self.mq
        if mq is None:
            return
        self.running = False
        self._on_shutdown()     # listeners running finish and their offsets count (then the queues go, as
        with self._rebalance_lock:      # RocketMQ's consume service shutdown, persist, rebalance destroy)
            for pq in self.process_queues.values():
                pq.dropped = True
        try:
            self.offset_store.persist(set(self.process_queues), oneway=False)
        except Exception:
            log.exception("persisting offsets at shutdown failed")
        try:
            mq.unregister(consumer_group=self.group)
        finally:
            self.mq = None
            mq.release()

    def _on_shutdown(self) -> None:
        pass

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def persist_offsets(self) -> None:
        if self.running:
            self.offset_store.persist(set(self.process_queues))

    def _update_process_queues(self, topic: str, allocated: set[MessageQueue]) -> None:
        for mq, pq in list(self.process_queues.items()):
            if mq.topic == topic and mq not in allocated:
                pq.dropped = True
                self.offset_store.persist({mq})
                self.offset_store.remove(mq)
                del self.process_queues[mq]
                log.info("%s: dropped %s", self.group, mq)
        new = []
        for mq in sorted(allocated):
            if mq in self.process_queues:
                continue
            offset = self.compute_pull_from_where(mq)
            if offset < 0:
                log.warning("%s: no start offset for %s yet", self.group, mq)
                continue
            pq = ProcessQueue()
            self.process_queues[mq] = pq
            new.append(_PullRequest(mq, pq, offset))
            log.info("%s: assigned %s from offset %d", self.group, mq, offset)
        for req in new:
            self._pull(req)

    # --- admin calls (MQAdminImpl) -------------------------------------------------------------------
    def max_offset(self, mq: MessageQueue) -> int:
        return admin_impl.max_offset(self._mq(), mq)

    def min_offset(self, mq: MessageQueue) -> int:
        return admin_impl.min_offset(self._mq(), mq)

    def search_offset(self, mq: MessageQueue, timestamp: int) -> int:
        return admin_impl.search_offset(self._mq(), mq, timestamp)

    def fetch_subscribe_message_queues(self, topic: str) -> set[MessageQueue]:
        return admin_impl.fetch_subscribe_message_queues(self._mq(), topic)

    # --- pulling ------------------------------------------------------------------------------------
    def _pull_command(self, mq: MessageQueue, offset: int, max_nums: int, sd: SubscriptionData | None,
                      suspend: bool, commit_offset: int, with_subscription: bool) -> RemotingCommand:
        sys_flag = 0
        if commit_offset > 0:
            sys_flag |= PULL_FLAG_COMMIT_OFFSET
        if suspend:
            sys_flag |= PULL_FLAG_SUSPEND
        if with_subscription:
            sys_flag |= PULL_FLAG_SUBSCRIPTION
        fields = {"consumerGroup": self.group, "topic": mq.topic, "queueId": mq.queue_id, "queueOffset": offset,
                  "maxMsgNums": max_nums, "sysFlag": sys_flag, "commitOffset": max(0, commit_offset),
                  "suspendTimeoutMillis": self.broker_suspend_max_time_millis if suspend else 0,
                  "subscription": sd.sub_string if (with_subscription and sd) else None,
                  "subVersion": sd.sub_version if sd else 0, "expressionType": sd.expression_type if sd else "TAG"}
        return self._mq().request(RequestCode.PULL_MESSAGE, fields)

    def _pull_result(self, resp: RemotingCommand, mq: MessageQueue, sd: SubscriptionData | None) -> PullResult:
        status = _PULL_STATUS.get(resp.code)
        if status is None:
            raise MQBrokerError(resp.code, resp.remark)
        f = resp.ext_fields or {}
        res = PullResult(status, int(f.get("nextBeginOffset", 0)), int(f.get("minOffset", 0)),
                         int(f.get("maxOffset", 0)), [], int(f.get("suggestWhichBrokerId", 0)))
        if status is PullStatus.FOUND and resp.body:
            msgs = decode_messages(resp.body, mq.broker_name)
            if sd is not None and sd.tags_set and not sd.class_filter_mode:
                tags = set(sd.tags_set)
                msgs = [m for m in msgs if m.tags is not None and m.tags in tags]
            mn, mx = str(res.min_offset), str(res.max_offset)
            for m in msgs:
                m.properties[PROPERTY_MIN_OFFSET] = mn
                m.properties[PROPERTY_MAX_OFFSET] = mx
            res.msg_found_list = msgs
        return res

    def _pull(self, req: _PullRequest) -> None:
        """Issue the next long-polling pull of a queue (callbacks continue the loop)."""
        pq, mq = req.pq, req.mq
        if pq.dropped or not self.running or self.mq is None:
            return
        if len(pq) > self.pull_threshold_for_queue or pq.size > self.pull_threshold_size_for_queue:
            self.mq.scheduler.call_later(PULL_TIME_DELAY_WHEN_FLOW_CONTROL, self._pull, req)
            return
        sd = self.subscriptions.get(mq.topic)
        if sd is None:
            self.mq.scheduler.call_later(PULL_TIME_DELAY_WHEN_EXCEPTION, self._pull, req)
            return
        mqc = self.mq
        # the broker the last answer suggested (suggestWhichBrokerId), else the first listed: a slave once
        # its master left the route (RocketMQ's PullAPIWrapper)
        addr, slave = mqc.find_broker_addr_in_subscribe(mq.broker_name, self.pull_from_which_node.get(mq, MASTER_ID))
        if addr is None:
            mqc.update_route(mq.topic)
            self.mq.scheduler.call_later(PULL_TIME_DELAY_WHEN_EXCEPTION, self._pull, req)
            return
        cmd = self._pull_command(mq, req.next_offset, self.pull_batch_size, sd, True,
                                 -1 if slave else self.offset_store.read_memory(mq), False)
        log.debug("%s: pull %s from %d (opaque %d) via %s", self.group, mq, req.next_offset, cmd.opaque, addr)
        pq.last_pull = time.monotonic()

        def on_response(resp, exc) -> None:
            try:
                if exc is not None:
                    raise exc
                res = self._pull_result(resp, mq, sd)
            except Exception as e:
                if self.running and not pq.dropped:
                    log.info("pull of %s failed: %s", mq, e)
                    if isinstance(e, (OSError, TimeoutError, ConnectionError)) and self.mq is not None:
                        self.mq.update_route(mq.topic)      # a broker that went away: a slave may serve
                    sch = self.mq.scheduler if self.mq else None
                    if sch is not None:
                        sch.call_later(PULL_TIME_DELAY_WHEN_EXCEPTION, self._pull, req)
                return
            self.pull_from_which_node[mq] = res.suggest_which_broker_id
            self._on_pulled(req, res)
        try:
            mqc.remoting.invoke_async(addr, cmd, CONSUMER_TIMEOUT_WHEN_SUSPEND, on_response)
        except Exception as e:
            log.info("pull of %s failed: %s", mq, e)
            mqc.scheduler.call_later(PULL_TIME_DELAY_WHEN_EXCEPTION, self._pull, req)

    def _on_pulled(self, req: _PullRequest, res: PullResult) -> None:
        pq, mq = req.pq, req.mq
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: pulled %s at %d: %s, %d messages, next %d", self.group, mq, req.next_offset,
                      res.pull_status.value, len(res.msg_found_list), res.next_begin_offset)
        if pq.dropped:
            return
        st = res.pull_status
        if st is PullStatus.FOUND:
            req.next_offset = res.next_begin_offset
            if res.msg_found_list:
                pq.put(res.msg_found_list)
                self._deliver(mq, pq, res.msg_found_list)
            self._pull(req)
        elif st in (PullStatus.NO_NEW_MSG, PullStatus.NO_MATCHED_MSG):
            req.next_offset = res.next_begin_offset
            if len(pq) == 0:
                self.offset_store.update(mq, req.next_offset, increase_only=True)
            self._pull(req)
        else:   # OFFSET_ILLEGAL: move to the broker's offset, let the rebalance recreate the queue
            log.warning("%s: offset of %s illegal, moving to %d", self.group, mq, res.next_begin_offset)
            req.next_offset = res.next_begin_offset
            pq.dropped = True

            def fix():
                self.offset_store.update(mq, req.next_offset)
                self.offset_store.persist({mq})
                with self._rebalance_lock:
                    if self.process_queues.get(mq) is pq:
                        del self.process_queues[mq]
                self.offset_store.remove(mq)
                if self.mq is not None:
                    self.mq.rebalance_immediately()
            if self.mq is not None:
                self.mq.scheduler.call_later(1.0, fix)

    def _deliver(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        raise NotImplementedError

    def _reset_retry_topic(self, msgs: list[MessageExt]) -> None:
        retry = RETRY_GROUP_TOPIC_PREFIX + self.group
        for m in msgs:
            rt = m.properties.get(PROPERTY_RETRY_TOPIC)
            if rt is not None and m.topic == retry:
                m.topic = rt

    # --- retry ----------------------------------------------------------------------------------------
    def send_message_back(self, msg: MessageExt, delay_level: int = 0, max_reconsume_times: int = 16) -> None:
        """CONSUMER_SEND_MSG_BACK: the broker re-sends msg through %RETRY%<group> (or to %DLQ%<group>)."""
        mqc = self._mq()
        addr = mqc.find_broker_addr(msg.broker_name) if msg.broker_name else None
        if addr is None:
            addr = msg.store_host
        cmd = mqc.request(RequestCode.CONSUMER_SEND_MSG_BACK, {
            "offset": msg.commit_log_offset, "group": self.group, "delayLevel": delay_level,
            "originMsgId": msg.msg_id, "originTopic": msg.topic, "unitMode": False,
            "maxReconsumeTimes": max_reconsume_times})
        r = mqc.invoke(addr, cmd, 5.0)
        if r.code != ResponseCode.SUCCESS:
            raise MQBrokerError(r.code, r.remark, addr)


ConsumeListener = Callable[[list[MessageExt]], "ConsumeStatus | bool | None"]


class PushConsumer(_ConsumerBase):
    """DefaultMQPushConsumer, concurrent consumption."""
    consume_type = "CONSUME_PASSIVELY"

    def __init__(self, group: str, namesrv_addr: str = "127.0.0.1:9876", *, consume_thread_nums: int = 4,
                 consume_message_batch_max_size: int = 1, max_reconsume_times: int = -1,
                 delay_level_when_next_consume: int = 0, **kw):
        super().__init__(group, namesrv_addr, **kw)
        self.consume_thread_nums = consume_thread_nums
        self.consume_message_batch_max_size = max(1, consume_message_batch_max_size)
        self.max_reconsume_times = max_reconsume_times
        self.delay_level_when_next_consume = delay_level_when_next_consume
        self.listener: ConsumeListener | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    def register_message_listener(self, listener: ConsumeListener) -> None:
        self.listener = listener

    def start(self):
        if self.listener is None:
            raise MQClientError("register a message listener before start()")
        self._subscribe_retry()
        self._executor = concurrent.futures.ThreadPoolExecutor(self.consume_thread_nums,
                                                               thread_name_prefix=f"consume-{self.group}")
        return super().start()

    def _on_shutdown(self) -> None:
        ex, self._executor = self._executor, None
        if ex is not None:
            ex.shutdown(wait=True, cancel_futures=True)

    @property
    def _max_reconsume(self) -> int:
        return 16 if self.max_reconsume_times == -1 else self.max_reconsume_times

    def _deliver(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        ex = self._executor
        if ex is None:
            return
        chunk = max(self.consume_message_batch_max_size, 32)
        for i in range(0, len(msgs), chunk):
            try:
                ex.submit(self._consume, mq, pq, msgs[i:i + chunk])
            except RuntimeError:     # shut down
                return

    def _consume(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        try:
            self._consume_batch(mq, pq, msgs)
        except Exception:
            log.exception("%s: consuming %d messages of %s failed", self.group, len(msgs), mq)

    def _consume_batch(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        log.debug("%s: consume %d messages of %s", self.group, len(msgs), mq)
        if pq.dropped:
            return
        self._reset_retry_topic(msgs)
        n = self.consume_message_batch_max_size
        failed: list[MessageExt] = []
        done: list[MessageExt] = []
        now = str(int(time.time() * 1000))
        for i in range(0, len(msgs), n):
            batch = msgs[i:i + n]
            for m in batch:
                m.properties[PROPERTY_CONSUME_START_TIMESTAMP] = now
            try:
                status = self.listener(batch)
            except Exception:
                log.exception("%s: listener failed on %d messages", self.group, len(batch))
                status = ConsumeStatus.RECONSUME_LATER
            if status is None or status is True or getattr(status, "value", status) == _CONSUME_SUCCESS:
                done.extend(batch)
            else:
                failed.extend(batch)
        if pq.dropped:
            return
        later = []
        for m in failed:
            try:
                self.send_message_back(m, self.delay_level_when_next_consume, self._max_reconsume)
                done.append(m)
            except Exception as e:
                log.warning("%s: send back of %s failed (%s): consuming again in 5 s", self.group, m.msg_id, e)
                m.reconsume_times += 1
                later.append(m)
        offset = pq.remove(done)
        if offset >= 0 and not pq.dropped:
            self.offset_store.update(mq, offset, increase_only=True)
        if later and self.mq is not None:
            self.mq.scheduler.call_later(5.0, lambda: self._executor and self._executor.submit(self._consume, mq, pq, later))


class PullConsumer(_ConsumerBase):
    """Pull consumption: `poll()` over the queues the rebalance gives this client (DefaultLitePullConsumer),
    or `pull()` on any queue (DefaultMQPullConsumer)."""
    consume_type = "CONSUME_ACTIVELY"

    def __init__(self, group: str, namesrv_addr: str = "127.0.0.1:9876", *, auto_commit: bool = True,
                 poll_batch_size: int = 32, buffer_threshold: int = 10000, **kw):
        kw.setdefault("consume_from_where", ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET)
        super().__init__(group, namesrv_addr, **kw)
        self.auto_commit = auto_commit
        self.poll_batch_size = poll_batch_size
        self.pull_threshold_for_queue = min(self.pull_threshold_for_queue, buffer_threshold)
        self._buffer: queue_mod.Queue = queue_mod.Queue()
        self._pending_commit: list[tuple[MessageQueue, ProcessQueue, list[MessageExt]]] = []

    def start(self):
        return super().start()

    def _deliver(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        self._reset_retry_topic(msgs)
        self._buffer.put((mq, pq, msgs))

    def poll(self, timeout: float = 5.0, max_messages: int | None = None) -> list[MessageExt]:
        """Messages of the assigned queues (waits up to timeout for some). With auto_commit, returning
        them counts as consumed: their offsets are committed."""
        self.commit_sync(persist=False) if self.auto_commit else None
        out: list[MessageExt] = []
        limit = max_messages or self.poll_batch_size
        deadline = time.monotonic() + timeout
        while len(out) < limit:
            left = deadline - time.monotonic()
            try:
                mq, pq, msgs = self._buffer.get(timeout=max(0.0, left)) if not out else self._buffer.get_nowait()
            except queue_mod.Empty:
                break
            if pq.dropped:
                continue
            room = limit - len(out)
            take, rest = msgs[:room], msgs[room:]
            if rest:
                with self._buffer.mutex:
                    self._buffer.queue.appendleft((mq, pq, rest))
            out.extend(take)
            self._pending_commit.append((mq, pq, take))
        return out

    def commit_sync(self, persist: bool = True) -> None:
        """Count every message returned by poll() so far as consumed (and send the offsets now)."""
        pending, self._pending_commit = self._pending_commit, []
        for mq, pq, msgs in pending:
            off = pq.remove(msgs)
            if off >= 0 and not pq.dropped:
                self.offset_store.update(mq, off, increase_only=True)
        if persist and self.mq is not None:
            self.offset_store.persist(set(self.process_queues), oneway=False)

    def _on_shutdown(self) -> None:
        if self.auto_commit:
            self.commit_sync(persist=False)

    # --- the plain pull API ---------------------------------------------------------------------------
    def pull(self, mq: MessageQueue, sub_expression: "str | MessageSelector" = "*", offset: int = 0, max_nums: int = 32,
             timeout: float = 10.0, block: bool = False) -> PullResult:
        """One PULL_MESSAGE on a queue; with block, the broker holds it until a message arrives or
        broker_suspend_max_time_millis passes (pullBlockIfNotFound)."""
        mqc = self._mq()
        addr, _slave = mqc.find_broker_addr_in_subscribe(mq.broker_name, self.pull_from_which_node.get(mq, MASTER_ID))
        if addr is None:
            addr = mqc.broker_addr_of(mq)
        sd = subscription_data(mq.topic, sub_expression)
        cmd = self._pull_command(mq, offset, max_nums, sd, block, 0, True)
        wait = max(timeout, self.broker_suspend_max_time_millis / 1000.0 + 5) if block else timeout
        res = self._pull_result(mqc.invoke(addr, cmd, wait), mq, sd)
        self.pull_from_which_node[mq] = res.suggest_which_broker_id
        return res

    def pull_block_if_not_found(self, mq: MessageQueue, sub_expression: str = "*", offset: int = 0,
                                max_nums: int = 32) -> PullResult:
        return self.pull(mq, sub_expression, offset, max_nums, block=True)

    def update_consume_offset(self, mq: MessageQueue, offset: int) -> None:
        self.offset_store.update(mq, offset)

    def fetch_consume_offset(self, mq: MessageQueue, from_store: bool = True) -> int:
        return self.offset_store.read_store(mq) if from_store else self.offset_store.read_memory(mq)

    def persist_offsets(self) -> None:
        if self.running:
            self.offset_store.persist(set(self.process_queues) | set(self.offset_store.table))

    def assignment(self) -> set[MessageQueue]:
        return set(self.process_queues)

