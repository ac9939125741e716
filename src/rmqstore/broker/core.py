"""The broker: RocketMQ 4.4.0's request processors over a MessageStore, on the asyncio event loop, and the
request code -> processor table that dispatches to them (BrokerController.registerProcessor).

    send.py             SendMessageProcessor (put_queue.py: one store call per loop iteration)
    pull.py             PullMessageProcessor (long_polling.py: PullRequestHoldService)
    query.py            QueryMessageProcessor
    admin.py            AdminBrokerProcessor (admin_stats.py: its statistics requests; stats.py: the figures)
    client_manage.py    ClientManageProcessor
    consumer_manage.py  ConsumerManageProcessor
    end_transaction.py  EndTransactionProcessor

Nothing here blocks the loop for long: puts are gathered over one loop iteration into one `put_messages`
call (run in an executor thread when the store flushes synchronously); a pull that finds nothing with the
suspend flag is held until the dispatcher reports new messages for its queue or its suspendTimeoutMillis
passes.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from ..remoting.codes import RequestCode, ResponseCode
from ..remoting.command import RemotingCommand
from ..store.format.message import Message, PutMessageResult
from .admin import AdminBrokerProcessor
from .admin_stats import AdminStatsProcessor
from .client_manage import ClientManageProcessor
from .consumer_manage import ConsumerManageProcessor
from .context import BrokerContext
from .end_transaction import EndTransactionProcessor
from .header import HeaderError
from .namesrv import not_supported
from .net import Channel
from .pull import PullMessageProcessor
from .put_queue import RawSend
from .query import QueryMessageProcessor
from .send import SendMessageProcessor

log = logging.getLogger(__name__)

# SEND_MESSAGE_V2 as a plain int: the hot path compares it once per request
_SEND_MESSAGE_V2 = int(RequestCode.SEND_MESSAGE_V2)
_SERIALIZE_JSON = 0
_tuple_new = tuple.__new__


class Broker:
    """Request handling of one broker; `handle` is the RemotingServer handler of both ports."""

    def __init__(self, store, cfg, local, groups, *, region_id: str = "DefaultRegion",
                 trace_on: bool = True, reject_transaction: bool = False, loop=None):
        self.ctx = ctx = BrokerContext(store, cfg, local, groups, region_id, trace_on, reject_transaction, loop)
        self.transactions = EndTransactionProcessor(ctx)
        self.sender = SendMessageProcessor(ctx, self.transactions)
        self.sender.handle_general = self._handle
        self.puller = PullMessageProcessor(ctx)
        self.query = QueryMessageProcessor(ctx)
        self.client_manage = ClientManageProcessor(ctx)
        self.consumer_manage = ConsumerManageProcessor(ctx)
        self.admin = AdminBrokerProcessor(ctx)
        self.admin_stats = AdminStatsProcessor(ctx)
        self.handlers: dict[int, Callable] = self._processor_table()
        self._puts = self.sender.puts

    def _processor_table(self) -> dict[int, Callable]:
        s, p, q, cl, cm, a, st = (self.sender, self.puller, self.query, self.client_manage, self.consumer_manage,
                                  self.admin, self.admin_stats)
        R = RequestCode
        return {
            R.SEND_MESSAGE: s.send_message, R.SEND_MESSAGE_V2: s.send_message, R.SEND_BATCH_MESSAGE: s.send_message,
            R.CONSUMER_SEND_MSG_BACK: s.consumer_send_msg_back,
            R.PULL_MESSAGE: p.pull_message,
            R.QUERY_MESSAGE: q.query_message, R.VIEW_MESSAGE_BY_ID: q.view_message_by_id,
            R.HEART_BEAT: cl.heart_beat, R.UNREGISTER_CLIENT: cl.unregister_client,
            R.CHECK_CLIENT_CONFIG: cl.check_client_config,
            R.GET_CONSUMER_LIST_BY_GROUP: cm.get_consumer_list_by_group,
            R.QUERY_CONSUMER_OFFSET: cm.query_consumer_offset, R.UPDATE_CONSUMER_OFFSET: cm.update_consumer_offset,
            R.END_TRANSACTION: self.transactions.end_transaction,
            R.UPDATE_AND_CREATE_TOPIC: a.update_and_create_topic, R.DELETE_TOPIC_IN_BROKER: a.delete_topic,
            R.GET_ALL_TOPIC_CONFIG: a.get_all_topic_config,
            R.GET_SYSTEM_TOPIC_LIST_FROM_BROKER: a.get_system_topic_list,
            R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: a.update_and_create_subscription_group,
            R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: a.get_all_subscription_group,
            R.DELETE_SUBSCRIPTIONGROUP: a.delete_subscription_group,
            R.GET_BROKER_CONFIG: a.get_broker_config, R.UPDATE_BROKER_CONFIG: a.update_broker_config,
            R.INVOKE_BROKER_TO_RESET_OFFSET: a.reset_offset,
            R.SEARCH_OFFSET_BY_TIMESTAMP: a.search_offset_by_timestamp, R.GET_MAX_OFFSET: a.get_max_offset,
            R.GET_MIN_OFFSET: a.get_min_offset, R.GET_EARLIEST_MSG_STORETIME: a.get_earliest_msg_storetime,
            R.QUERY_BROKER_OFFSET: a.query_broker_offset, R.GET_ALL_CONSUMER_OFFSET: a.get_all_consumer_offset,
            R.GET_ALL_DELAY_OFFSET: a.get_all_delay_offset,
            R.GET_CONSUMER_CONNECTION_LIST: a.get_consumer_connection_list,
            R.GET_PRODUCER_CONNECTION_LIST: a.get_producer_connection_list,
            R.QUERY_TOPIC_CONSUME_BY_WHO: a.query_topic_consume_by_who,
            R.GET_CONSUMER_RUNNING_INFO: a.get_consumer_running_info,
            R.CLEAN_EXPIRED_CONSUMEQUEUE: a.clean_expired_consume_queue, R.CLEAN_UNUSED_TOPIC: a.clean_unused_topic,
            R.LOCK_BATCH_MQ: a.lock_batch_mq, R.UNLOCK_BATCH_MQ: a.unlock_batch_mq,
            R.GET_BROKER_RUNTIME_INFO: st.get_broker_runtime_info, R.GET_TOPIC_STATS_INFO: st.get_topic_stats_info,
            R.GET_CONSUME_STATS: st.get_consume_stats, R.GET_BROKER_CONSUME_STATS: st.get_broker_consume_stats,
            R.VIEW_BROKER_STATS_DATA: st.view_broker_stats_data,
        }

    # --- what the server and its owner use ----------------------------------------------------------
    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self.ctx.loop

    @loop.setter
    def loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self.ctx.loop = loop

    @property
    def local(self):
        return self.ctx.local

    @property
    def topics(self):
        return self.ctx.topics

    @property
    def offsets(self):
        return self.ctx.offsets

    @property
    def groups(self):
        return self.ctx.groups

    @property
    def clients(self):
        return self.ctx.clients

    @property
    def stats(self):
        return self.ctx.stats

    @property
    def broker_addr(self) -> str:
        return self.ctx.broker_addr

    # --- entry ------------------------------------------------------------------------------------
    def handle(self, ch: Channel, req: RemotingCommand):
        if req.code == _SEND_MESSAGE_V2 and req.flag == 0 and req.serialize_type == _SERIALIZE_JSON \
                and req.ext_fields is not None:
            # the hot path: checked with the others of this loop iteration (PutQueue.flush); PutQueue.add_raw
            # written out here (measured: a call per send is 5 % of the server's CPU per message)
            q = self._puts
            q.entries.append(_tuple_new(RawSend, (ch, req)))
            q.has_raw = True
            if not q.scheduled:
                q.scheduled = True
                self.ctx.loop.call_soon(q.flush)
            return None
        return self._handle(ch, req)

    def _handle(self, ch: Channel, req: RemotingCommand):
        h = self.handlers.get(req.code)
        if h is None:
            return not_supported(req)
        try:
            return h(ch, req)
        except HeaderError as e:
            return req.make_response(ResponseCode.SYSTEM_ERROR, str(e))

    def on_close(self, ch: Channel) -> None:
        self.ctx.clients.channel_closed(ch)
        self.puller.hold_service.channel_closed(ch)

    def on_message_arriving(self, topic: str, queue_id: int, next_offset: int, store_ts: int) -> None:
        """Dispatcher listener (dispatcher thread)."""
        self.puller.hold_service.on_message_arriving(topic, queue_id, next_offset, store_ts)

    def release_all_held(self) -> None:
        self.puller.hold_service.release_all()

    def flush_all_puts(self) -> None:
        self.sender.puts.flush_all()

    def put_async(self, msgs: list[Message]) -> "asyncio.Future[list[PutMessageResult]]":
        fut = self.ctx.loop.create_future()

        def done(results):
            if not fut.done():
                fut.set_result(results)
        self.sender.puts.submit(msgs, done)
        return fut
