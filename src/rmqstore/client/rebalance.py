"""RebalanceImpl, as in RocketMQ's client: which queues of its subscribed topics a consumer takes (the group's
consumer ids from a broker, AllocateMessageQueueAveragely), and where it starts pulling a queue it was given
(CONSUME_FROM_LAST_OFFSET / FIRST_OFFSET / TIMESTAMP, resetOffset)."""
from __future__ import annotations

import logging
import time

from ..remoting import fastjson
from ..remoting.codes import RETRY_GROUP_TOPIC_PREFIX, RequestCode, ResponseCode
from .instance import TopicRoute, subscribe_info
from .message import ConsumeFromWhere, MessageQueue, MQClientError

log = logging.getLogger("rmqstore.client.consumer")     # logged under the name of the module it came from


class RebalanceImpl:
    """Mixed into the push and pull consumers' base (consumer.py): uses its group, subscriptions,
    topic_queues, process queues and the client instance (_mq())."""

    # --- rebalance ----------------------------------------------------------------------------------
    def _route_changed(self, topic: str, route: TopicRoute, changed: bool = True) -> None:
        if topic in self.subscriptions:
            new = subscribe_info(topic, route)
            old = self.topic_queues.get(topic)
            self.topic_queues[topic] = new
            if old != new and self.running and self.mq is not None:
                self.mq.rebalance_immediately()      # queues appeared or changed: share them out now

    def consumer_ids(self, topic: str) -> list[str]:
        mqc = self._mq()
        addr = mqc.find_broker_addr_by_topic(topic)
        if addr is None:
            mqc.update_route(topic)
            addr = mqc.find_broker_addr_by_topic(topic)
        if addr is None:
            return []
        try:
            r = mqc.invoke(mqc.broker_channel(addr), mqc.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                                                  {"consumerGroup": self.group}))
        except (OSError, TimeoutError, MQClientError) as e:
            log.warning("consumer list of %s from %s failed: %s", self.group, addr, e)
            return []
        if r.code != ResponseCode.SUCCESS:
            return []
        return [str(x) for x in (fastjson.loads(r.body or b"{}").get("consumerIdList") or [])]

    def do_rebalance(self) -> None:
        if not self.running:
            return
        with self._rebalance_lock:
            for topic in list(self.subscriptions):
                mqs = self.topic_queues.get(topic)
                if mqs is None:
                    continue
                cids = self.consumer_ids(topic)
                if not cids:
                    continue
                allocated = self.allocate(self.group, self.mq.client_id, sorted(mqs), sorted(cids))
                self._update_process_queues(topic, set(allocated))

    def reset_offset(self, topic: str, table: dict[MessageQueue, int]) -> None:
        """RESET_CONSUMER_CLIENT_OFFSET (MQClientInstance.resetOffset): drop the topic's queues, store the
        broker's offsets and persist them, rebalance: the queues start again from there."""
        with self._rebalance_lock:
            for mq, pq in list(self.process_queues.items()):
                if mq.topic == topic:
                    pq.dropped = True
                    del self.process_queues[mq]
            for mq, off in table.items():
                self.offset_store.update(mq, off)
            self.offset_store.persist(set(table), oneway=False)
            for mq in table:
                self.offset_store.remove(mq)
        log.info("%s: offsets of %s reset: %s", self.group, topic, table)
        self.mq.rebalance_immediately()

    def compute_pull_from_where(self, mq: MessageQueue) -> int:
        last = self.offset_store.read_store(mq)
        if last >= 0:
            return last
        if last != -1:
            return -1
        cfw = self.consume_from_where
        if cfw is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
            return 0
        if mq.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return 0 if cfw is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET else self.max_offset(mq)
        if cfw is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET:
            return self.max_offset(mq)
        ts = self.consume_timestamp if self.consume_timestamp is not None else int(time.time() * 1000) - 1800_000
        return self.search_offset(mq, ts)
