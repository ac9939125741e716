"""Transactional messages with the store-level semantics of RocketMQ's message store.

    def execute(msg, arg):  ...; return LocalTransactionState.COMMIT_MESSAGE   # or ROLLBACK_MESSAGE / UNKNOW
    def check(msg):         ...; return LocalTransactionState.COMMIT_MESSAGE

    producer = TransactionProducer(store, "tx-group", execute=execute, check=check).start()
    r = producer.send_message_in_transaction("TopicA", b"order #1", tags="TagA", arg=...)
    # r.local_transaction_state; producer.end_transaction(r, LocalTransactionState.COMMIT_MESSAGE) if UNKNOW

The half message is stored in its real topic and queue with sysFlag TRANSACTION_PREPARED (4) and the
properties TRAN_MSG=true and PGROUP=<group>: the dispatcher indexes it but never puts it in a consume
queue, so no consumer sees it. Ending the transaction appends, as EndTransactionProcessor did over the
store (RocketMQ 4.0-4.2; 4.3+ brokers keep halves in RMQ_SYS_TRANS_HALF_TOPIC instead):
- commit: a copy of the half (same topic, queue, body, flag, born time and hosts, reconsumeTimes,
  properties re-serialised in HashMap order) with sysFlag TRANSACTION_COMMIT (8) and
  preparedTransactionOffset = the half's commitlog offset. It is dispatched: the message becomes visible
  in its queue at the next queue offset.
- rollback: the same with sysFlag TRANSACTION_ROLLBACK (12) and an empty body. It is neither dispatched nor
  indexed: the message is never visible.
A half is ended at most once.

The check service (one per store, running while a TransactionProducer is started) follows the commitlog
for halves and end records. A half with no end record that is older than transaction_timeout_ms (6 s)
is checked: the application's check callback of a started producer of its PGROUP is called with it, again
every transaction_check_interval_ms (60 s), at most transaction_check_max (15) times; COMMIT_MESSAGE or
ROLLBACK_MESSAGE ends it, UNKNOW leaves it for the next check, and after the last check it is discarded
(never checked again; it stays invisible). The service's progress and open halves survive restarts in
`{store}/config/transactionCheck.json` (an rmqstore file: RocketMQ 4.4.0 keeps this state in its op topic).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

from ..store.format import codec
from ..store.format.message import Message, MessageExt, PutMessageResult
from .producer import Producer, SendResult, SendStatus, TopicNotExistError
from .settings import broker_setting
from .topic_config import MessageQueue
from .transaction_check import (COMMIT_MESSAGE, PROPERTY_PRODUCER_GROUP, PROPERTY_TRANSACTION_PREPARED,
                                ROLLBACK_MESSAGE, UNKNOW, LocalTransactionState, TransactionCheckService,
                                _state, end_record)

_PREPARED = codec.TRANSACTION_PREPARED_TYPE

log = logging.getLogger(__name__)

__all__ = ["LocalTransactionState", "TransactionListener", "TransactionProducer", "TransactionSendResult",
           "TransactionCheckService"]


class TransactionListener(Protocol):
    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState: ...

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState: ...


@dataclass
class TransactionSendResult(SendResult):
    local_transaction_state: LocalTransactionState = LocalTransactionState.UNKNOW


class TransactionProducer(Producer):
    """TransactionMQProducer: send_message_in_transaction, end_transaction, and the check callback."""

    def __init__(self, store, group: str, listener: TransactionListener | None = None, *,
                 execute: Callable[[Message, Any], Any] | None = None, check: Callable[[MessageExt], Any] | None = None,
                 transaction_timeout_ms: int | None = None, transaction_check_max: int | None = None,
                 transaction_check_interval_ms: int | None = None, **kwargs):
        super().__init__(store, group, **kwargs)
        cfg = store.config
        self.listener = listener
        self._execute = execute or (listener.execute_local_transaction if listener is not None else None)
        self._check = check or (listener.check_local_transaction if listener is not None else None)
        self.transaction_timeout_ms = (transaction_timeout_ms if transaction_timeout_ms is not None
                                       else broker_setting(cfg, "transactionTimeOut", 6000))
        self.transaction_check_max = (transaction_check_max if transaction_check_max is not None
                                      else broker_setting(cfg, "transactionCheckMax", 15))
        self.transaction_check_interval_ms = (transaction_check_interval_ms if transaction_check_interval_ms is not None
                                              else broker_setting(cfg, "transactionCheckInterval", 60_000))
        self._registered = False

    def start(self) -> "TransactionProducer":
        super().start()
        if not self._registered:
            self.broker.transactions.register(self)
            self._registered = True
        return self

    def shutdown(self) -> None:
        if self._registered:
            self.broker.transactions.unregister(self)
            self._registered = False
        super().shutdown()

    def _check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        if self._check is None:
            return LocalTransactionState.UNKNOW
        try:
            return _state(self._check(msg))
        except Exception:
            log.exception("%s: check_local_transaction raised", self.group)
            return LocalTransactionState.UNKNOW

    def send_message_in_transaction(self, topic: str, body: bytes | str, tags: str | None = None,
                                    keys: str | Iterable[str] | None = None, properties: dict[str, str] | None = None,
                                    arg: Any = None, queue: int | MessageQueue | None = None, *, sharding_key: Any = None,
                                    queue_selector=None, execute: Callable[[Message, Any], Any] | None = None,
                                    flag: int = 0) -> TransactionSendResult:
        """Put the half message, run the local transaction (execute(msg, arg) or the listener's), then
        commit or roll back per its answer; UNKNOW leaves the half to end_transaction or the checker.
        A half that could not be stored raises SendError and runs no local transaction."""
        props = dict(properties or {})
        props.pop(codec.PROPERTY_DELAY, None)       # delay is not supported for transactional messages
        msg = self.build_message(topic, body, tags, keys, props, 0, flag,
                                 extra={PROPERTY_TRANSACTION_PREPARED: "true", PROPERTY_PRODUCER_GROUP: self.group})
        msg.sys_flag |= _PREPARED
        sr = self._send_built([msg], topic, queue, sharding_key, queue_selector, transaction=True)
        fn = execute or self._execute
        state = LocalTransactionState.UNKNOW
        if sr.send_status is SendStatus.SEND_OK and fn is not None:
            try:
                state = _state(fn(msg, arg))
            except Exception:
                log.exception("%s: execute_local_transaction raised; the state is UNKNOW", self.group)
                state = LocalTransactionState.UNKNOW
        elif sr.send_status is not SendStatus.SEND_OK:
            state = LocalTransactionState.ROLLBACK_MESSAGE
        result = TransactionSendResult(**{f: getattr(sr, f) for f in SendResult.__dataclass_fields__},
                                       local_transaction_state=state)
        if state is not LocalTransactionState.UNKNOW:
            self.end_transaction(result, state)
        return result

    def end_transaction(self, half: SendResult | int | str, state: LocalTransactionState | str) -> PutMessageResult | None:
        """Commit or roll back a half given its SendResult, commitlog offset or offsetMsgId. Returns the
        end record's put result, or None for UNKNOW or a half already ended."""
        if isinstance(half, SendResult):
            offset = half.commit_log_offset
        elif isinstance(half, str):
            offset = codec.decode_message_id(half)[1]
        else:
            offset = int(half)
        return self.broker.transactions.end(self.group, offset, _state(state))


__all__ += ["COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW", "TopicNotExistError", "end_record"]
