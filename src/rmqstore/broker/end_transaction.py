"""EndTransactionProcessor: END_TRANSACTION, over rmqstore.messaging.transaction's TransactionCheckService
(the store-level model: the half sits in its real topic and queue with sysFlag PREPARED; commit appends a
copy with sysFlag COMMIT and preparedTransactionOffset = the half's offset, rollback one with ROLLBACK and
no body); and the broker's side of the transaction check: CHECK_TRANSACTION_STATE to a producer."""
from __future__ import annotations

import logging

from ..messaging.local_broker import broker_setting
from ..messaging.transaction import LocalTransactionState
from ..remoting.codes import PROPERTY_PRODUCER_GROUP, RequestCode, ResponseCode
from ..remoting.command import RemotingCommand
from ..store.format import codec
from .context import BrokerContext
from .header import Header
from .net import Channel
from .query import one_message
from .send import PUT_CODES, SEND_OK

log = logging.getLogger(__name__)
TRAN_MASK = codec.TRANSACTION_TYPE_MASK


class EndTransactionProcessor:
    def __init__(self, ctx: BrokerContext):
        self.ctx = ctx
        self._groups: set[str] = set()

    def end_transaction(self, ch: Channel, req: RemotingCommand):
        ctx = self.ctx
        h = Header(req.ext_fields)
        pgroup = h.str("producerGroup")
        tran_offset = h.long("tranStateTableOffset")
        cl_offset = h.long("commitLogOffset")
        kind = h.int("commitOrRollback")
        from_check = h.bool("fromTransactionCheck")
        if kind not in (codec.TRANSACTION_COMMIT_TYPE, codec.TRANSACTION_ROLLBACK_TYPE):
            log.warning("producer %s ended a transaction with state %d (pending) %s", ch.remote, kind,
                        "from check" if from_check else "in sending")
            return None
        half = ctx.store.look_message_by_offset(cl_offset) if cl_offset >= 0 else None
        if half is None or (half.sys_flag & TRAN_MASK) != codec.TRANSACTION_PREPARED_TYPE:
            return req.make_response(ResponseCode.SYSTEM_ERROR, "Find prepared transaction message failed")
        if half.properties.get(PROPERTY_PRODUCER_GROUP) != pgroup:
            return req.make_response(ResponseCode.SYSTEM_ERROR, "The producer group wrong")
        if half.queue_offset != tran_offset:
            return req.make_response(ResponseCode.SYSTEM_ERROR, "The transaction state table offset wrong")
        state = (LocalTransactionState.COMMIT_MESSAGE if kind == codec.TRANSACTION_COMMIT_TYPE
                 else LocalTransactionState.ROLLBACK_MESSAGE)
        tx = ctx.local.transactions

        def run():
            try:
                return tx.end(pgroup, cl_offset, state)
            except ValueError as e:
                return e

        def answer(r):
            if isinstance(r, ValueError):
                return req.make_response(ResponseCode.SYSTEM_ERROR, str(r))
            if r is None:          # ended before (e.g. by a check): nothing more to write
                return req.make_response(ResponseCode.SUCCESS)
            if r.status in SEND_OK:
                return req.make_response(ResponseCode.SUCCESS)
            code, remark, _ = PUT_CODES.get(r.status, (ResponseCode.SYSTEM_ERROR, r.status.value, False))
            return req.make_response(code, remark)
        return ctx.in_executor(run, answer)

    def register_checker(self, group: str) -> None:
        """Register a stand-in for a remote producer group with the transaction check service: its checks
        become CHECK_TRANSACTION_STATE requests to one of the group's connections (the answer comes back as
        END_TRANSACTION with fromTransactionCheck)."""
        if group in self._groups:
            return
        self._groups.add(group)
        self.ctx.local.transactions.register(RemoteTransactionProducer(self, group))

    def send_check_transaction_state(self, group: str, msg) -> None:
        """Called on the check service's thread: hand the request to the event loop."""
        ctx = self.ctx
        loop = ctx.loop
        if loop is None or loop.is_closed():
            return
        raw = one_message(ctx.store, ctx.cfg.max_message_size, msg.commit_log_offset)
        if raw is None:
            return
        uniq = msg.properties.get("UNIQ_KEY") or msg.msg_id
        fields = {"tranStateTableOffset": str(msg.queue_offset), "commitLogOffset": str(msg.commit_log_offset),
                  "msgId": uniq, "transactionId": uniq, "offsetMsgId": msg.msg_id, "producerGroup": group}

        def send():
            ch = ctx.clients.producer_channel(group)
            if ch is None:
                log.info("no connection of producer group %s to check a transaction on", group)
                return
            ch.oneway(RemotingCommand(RequestCode.CHECK_TRANSACTION_STATE, ext_fields=fields, body=raw, flag=2))
        try:
            loop.call_soon_threadsafe(send)
        except RuntimeError:
            pass


class RemoteTransactionProducer:
    """What TransactionCheckService needs of a producer, for a group whose producers are remote clients."""

    def __init__(self, processor: EndTransactionProcessor, group: str):
        cfg = processor.ctx.cfg
        self.processor = processor
        self.group = group
        self.transaction_timeout_ms = broker_setting(cfg, "transactionTimeOut", 6000)
        self.transaction_check_max = broker_setting(cfg, "transactionCheckMax", 15)
        self.transaction_check_interval_ms = broker_setting(cfg, "transactionCheckInterval", 60_000)

    def _check_local_transaction(self, msg):
        self.processor.send_check_transaction_state(self.group, msg)
        return LocalTransactionState.UNKNOW      # the producer answers later with END_TRANSACTION
