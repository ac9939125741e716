"""The transactional half of the Producer (RocketMQ's TransactionMQProducer): a half message, the local
transaction, END_TRANSACTION with its outcome; and the answer to a broker's CHECK_TRANSACTION_STATE."""
from __future__ import annotations

import logging
from typing import Callable

from ..remoting.codes import PROPERTY_PRODUCER_GROUP, PROPERTY_TRANSACTION_PREPARED, RequestCode
from ..remoting.command import RemotingCommand
from ..store.format import codec
from .message import (LocalTransactionState, Message, MessageQueue, MQClientError, SendResult, SendStatus,
                      TransactionSendResult, decode_messages)

log = logging.getLogger(__name__)
_KIND = {LocalTransactionState.COMMIT_MESSAGE: codec.TRANSACTION_COMMIT_TYPE,
         LocalTransactionState.ROLLBACK_MESSAGE: codec.TRANSACTION_ROLLBACK_TYPE}


class TransactionalProducer:
    """Mixed into Producer: uses its group, language, send(), _check() and transaction_listener."""

    def send_message_in_transaction(self, msg: Message,
                                    execute_local: Callable[[Message, object], LocalTransactionState],
                                    arg=None) -> TransactionSendResult:
        """Half message, local transaction, then END_TRANSACTION (oneway) with its outcome.
        `transaction_listener` (fn(MessageExt) -> LocalTransactionState) answers the broker's checks."""
        msg.properties[PROPERTY_TRANSACTION_PREPARED] = "true"
        msg.properties[PROPERTY_PRODUCER_GROUP] = self.group
        r = self.send(msg)
        state = LocalTransactionState.UNKNOW
        if r.send_status is SendStatus.SEND_OK:
            msg.transaction_id = r.msg_id
            try:
                state = LocalTransactionState.of(execute_local(msg, arg)) or LocalTransactionState.UNKNOW
            except Exception:
                log.exception("local transaction of %s failed", r.msg_id)
                state = LocalTransactionState.UNKNOW
        else:
            state = LocalTransactionState.ROLLBACK_MESSAGE
        self._end_transaction(r, state)
        out = TransactionSendResult(r.send_status, r.msg_id, r.offset_msg_id, r.message_queue, r.queue_offset,
                                    r.msg_id, r.region_id, r.trace_on)
        out.local_transaction_state = state
        return out

    def _end_transaction(self, r: SendResult, state: LocalTransactionState, from_check: bool = False,
                         addr: str | None = None) -> None:
        _, offset = codec.decode_message_id(r.offset_msg_id)
        kind = _KIND.get(state, codec.TRANSACTION_NOT_TYPE)
        fields = {"producerGroup": self.group, "tranStateTableOffset": str(r.queue_offset), "commitLogOffset": str(offset),
                  "commitOrRollback": str(kind), "fromTransactionCheck": "true" if from_check else "false",
                  "msgId": r.msg_id, "transactionId": r.transaction_id or r.msg_id}
        mq = self._check()
        if addr is None:
            addr = self._broker_addr_plain(r.message_queue)     # END_TRANSACTION goes to the main port
        cmd = RemotingCommand(RequestCode.END_TRANSACTION, ext_fields=fields, language=self.language)
        mq.remoting.invoke_oneway(addr, cmd)

    def _broker_addr_plain(self, mqq: MessageQueue) -> str:
        addr = self._check().find_broker_addr(mqq.broker_name)
        if addr is None:
            raise MQClientError(f"The broker[{mqq.broker_name}] not exist")
        return addr

    def _check_transaction_state(self, addr: str, cmd: RemotingCommand) -> None:
        """CHECK_TRANSACTION_STATE from a broker: ask transaction_listener, answer with END_TRANSACTION."""
        if self.transaction_listener is None or not cmd.body:
            return
        try:
            msg = decode_messages(cmd.body)[0]
        except Exception as e:
            log.warning("bad CHECK_TRANSACTION_STATE body from %s: %s", addr, e)
            return
        try:
            state = LocalTransactionState.of(self.transaction_listener(msg)) or LocalTransactionState.UNKNOW
        except Exception:
            log.exception("transaction check of %s failed", msg.msg_id)
            state = LocalTransactionState.UNKNOW
        f = cmd.ext_fields or {}
        kind = _KIND.get(state, codec.TRANSACTION_NOT_TYPE)
        fields = {"producerGroup": self.group, "tranStateTableOffset": f.get("tranStateTableOffset", str(msg.queue_offset)),
                  "commitLogOffset": f.get("commitLogOffset", str(msg.commit_log_offset)), "commitOrRollback": str(kind),
                  "fromTransactionCheck": "true", "msgId": f.get("msgId") or msg.msg_id,
                  "transactionId": f.get("transactionId") or msg.msg_id}
        self._check().remoting.invoke_oneway(addr, RemotingCommand(RequestCode.END_TRANSACTION, ext_fields=fields,
                                                                   language=self.language))
