"""The broker-side services of one store, for in-process producers and consumers.

    broker = LocalBroker.of(store)     # created on first use, one per open store

holds what a RocketMQ broker keeps beside its message store:
- `topics`: TopicConfigManager (`{store}/config/topics.json`);
- `offsets`: ConsumerOffsetManager (`{store}/config/consumerOffset.json`), written every
  flushConsumerOffsetInterval ms (default 5000) when changed and at shutdown;
- `hub`: the long-polling hub (PullRequestHoldService);
- `registry`: the consumer groups and their rebalancing;
- `transactions`: the transaction check service (created on first use);
and implements the broker's consumerSendMsgBack (retry and dead-letter topics).

It registers itself among the store's services, so closing the store shuts it down: consumers stop
(committing their offsets), offsets and topics are persisted. Broker settings that StoreConfig has no
field for are read from a broker.conf's extra keys when present: flushConsumerOffsetInterval,
transactionTimeOut, transactionCheckMax, transactionCheckInterval.
"""
from __future__ import annotations

import logging
import random
import threading
import weakref
from typing import TYPE_CHECKING

from ..store.format import codec
from ..store.format.java_map import as_broker_map
from .long_polling import ArrivalHub
from ..store.format.message import Message, MessageExt, PutMessageResult, PutMessageStatus
from .offset_store import DEFAULT_FLUSH_INTERVAL_MS, ConsumerOffsetManager
from .rebalance import ConsumerRegistry
from .schedule import _java_int
from .settings import broker_setting
from .topic_config import PERM_READ, PERM_WRITE, MessageQueue, TopicConfig, TopicConfigManager, dlq_topic, retry_topic

if TYPE_CHECKING:  # pragma: no cover
    from ..store.store import MessageStore
    from .transaction_check import TransactionCheckService

log = logging.getLogger(__name__)

PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
DLQ_NUMS_PER_GROUP = 1
RETRY_QUEUE_NUMS = 1          # SubscriptionGroupConfig.retryQueueNums default

_brokers: "weakref.WeakKeyDictionary[MessageStore, LocalBroker]" = weakref.WeakKeyDictionary()
_brokers_lock = threading.Lock()


__all__ = ["LocalBroker", "broker_setting"]


class LocalBroker:
    def __init__(self, store: "MessageStore"):
        self.store = store
        cfg = store.config
        self.broker_name = cfg.broker_name
        self.topics = TopicConfigManager(store.path, cfg).load()
        self.offsets = ConsumerOffsetManager(
            store.path, broker_setting(cfg, "flushConsumerOffsetInterval", DEFAULT_FLUSH_INTERVAL_MS)).load()
        self.offsets.start()
        self.hub = ArrivalHub(store)
        self.registry = ConsumerRegistry(self)
        self.hub.on_new_queue = lambda topic, qid: self.registry.topic_changed(topic)
        self.topics.add_listener(self.registry.topic_changed)
        self._transactions: "TransactionCheckService | None" = None
        self._lock = threading.Lock()
        self._random = random.Random()
        self._closed = False

    @classmethod
    def of(cls, store: "MessageStore") -> "LocalBroker":
        """The store's broker services (created, and hooked to the store's shutdown, on first use)."""
        with _brokers_lock:
            b = _brokers.get(store)
            if b is None or b._closed:
                store._check_open()
                b = cls(store)
                _brokers[store] = b
                store.services.append(b)
            return b

    # the store calls start() on services it installs itself and shutdown() on all of them at close
    def start(self) -> None:
        pass

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for m in self.registry.all_members():
            try:
                m.shutdown()
            except Exception:
                log.exception("consumer %s: shutdown failed", getattr(m, "client_id", m))
        self.registry.shutdown()
        if self._transactions is not None:
            self._transactions.shutdown()
        self.hub.close()
        self.topics.remove_listener(self.registry.topic_changed)
        self.offsets.shutdown()
        self.topics.shutdown()
        with _brokers_lock:
            if _brokers.get(self.store) is self:
                del _brokers[self.store]

    @property
    def closed(self) -> bool:
        return self._closed or self.store._closed

    # --- topics and queues ----------------------------------------------------------------------
    def read_queues(self, topic: str) -> list[MessageQueue]:
        """The queues consumers read: readQueueNums of the topic's config; for a topic with no config,
        the queues the store already holds."""
        tc = self.topics.select(topic)
        if tc is not None:
            if not tc.perm & PERM_READ:
                return []
            ids = range(tc.read_queue_nums)
        else:
            ids = sorted(self.store.consume_queues.table.get(topic, {}))
        return [MessageQueue(topic, self.broker_name, i) for i in ids]

    def ensure_retry_topic(self, group: str) -> TopicConfig:
        return self.topics.create_topic_in_send_message_back_method(retry_topic(group), RETRY_QUEUE_NUMS,
                                                                    PERM_WRITE | PERM_READ)

    # --- transactions ---------------------------------------------------------------------------
    @property
    def transactions(self) -> "TransactionCheckService":
        with self._lock:
            if self._transactions is None:
                from .transaction_check import TransactionCheckService
                self._transactions = TransactionCheckService(self.store)
            return self._transactions

    # --- consumerSendMsgBack --------------------------------------------------------------------
    def send_message_back(self, group: str, commit_log_offset: int, delay_level: int = 0,
                          max_reconsume_times: int = 16) -> PutMessageResult:
        """SendMessageProcessor.consumerSendMsgBack: put the stored message at commit_log_offset to the
        group's retry topic with reconsumeTimes + 1 and delay level (3 + reconsumeTimes when 0), or to
        its dead-letter topic once reconsumeTimes reaches max_reconsume_times (or delay_level < 0).

        As the broker, it adds RETRY_TOPIC (the original topic, once) and WAIT=false, and sets
        ORIGIN_MESSAGE_ID on the map after serialising it: that property reaches the record only through
        the delay rewrite (so a dead-letter message carries it only from an earlier retry)."""
        self.ensure_retry_topic(group)
        new_topic = retry_topic(group)
        queue_id = abs(self._random.getrandbits(31) % 99999999) % RETRY_QUEUE_NUMS
        msg_ext = self.store.look_message_by_offset(commit_log_offset)
        if msg_ext is None:
            log.warning("send back of %s: no message at offset %d", group, commit_log_offset)
            return PutMessageResult(PutMessageStatus.UNKNOWN_ERROR)
        hm = as_broker_map(msg_ext.properties)
        if hm.get(PROPERTY_RETRY_TOPIC) is None:
            hm.put(PROPERTY_RETRY_TOPIC, msg_ext.topic)
        hm.put(PROPERTY_WAIT_STORE_MSG_OK, "false")
        if msg_ext.reconsume_times >= max_reconsume_times or delay_level < 0:
            new_topic = dlq_topic(group)
            queue_id = abs(self._random.getrandbits(31) % 99999999) % DLQ_NUMS_PER_GROUP
            self.topics.create_topic_in_send_message_back_method(new_topic, DLQ_NUMS_PER_GROUP, PERM_WRITE)
        else:
            if delay_level == 0:
                delay_level = 3 + msg_ext.reconsume_times
            hm.put(codec.PROPERTY_DELAY, str(delay_level))
        props_string = hm.to_dict()                  # msgInner.setPropertiesString(...)
        origin = hm.get(PROPERTY_ORIGIN_MESSAGE_ID)
        hm.put(PROPERTY_ORIGIN_MESSAGE_ID, origin if origin and origin.strip() else msg_ext.msg_id)
        delayed = (_java_int(hm.get(codec.PROPERTY_DELAY)) or 0) > 0 and \
            (msg_ext.sys_flag & codec.TRANSACTION_TYPE_MASK) in (codec.TRANSACTION_NOT_TYPE,
                                                                 codec.TRANSACTION_COMMIT_TYPE)
        # The delay rewrite re-serialises the map, which by then holds ORIGIN_MESSAGE_ID too.
        props = hm.to_dict() if delayed else props_string
        msg = Message(topic=new_topic, body=msg_ext.body or b"", queue_id=queue_id, flag=msg_ext.flag,
                      sys_flag=msg_ext.sys_flag, born_timestamp=msg_ext.born_timestamp, born_host=msg_ext.born_host,
                      store_host=None, reconsume_times=msg_ext.reconsume_times + 1, properties=props)
        result = self.store.put_message(msg)
        if not result.ok:
            log.warning("send back of %s to %s failed: %s", group, new_topic, result.status.value)
        return result

    def look_message(self, commit_log_offset: int) -> MessageExt | None:
        return self.store.look_message_by_offset(commit_log_offset)
