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

import enum
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol

from ..store import codec
from ..store.config_file import as_int, as_object, config_dir, dumps_pretty, load_config_file, string_to_file
from ..store.java_map import as_broker_map
from .local_broker import broker_setting
from ..store.message import Message, MessageExt, PutMessageResult
from .producer import Producer, SendResult, SendStatus, TopicNotExistError
from .topic_config import MessageQueue

if TYPE_CHECKING:  # pragma: no cover
    from .local_broker import LocalBroker

log = logging.getLogger(__name__)

__all__ = ["LocalTransactionState", "TransactionListener", "TransactionProducer", "TransactionSendResult",
           "TransactionCheckService"]

PROPERTY_TRANSACTION_PREPARED = codec.PROPERTY_TRAN_PREPARED
PROPERTY_PRODUCER_GROUP = codec.PROPERTY_PRODUCER_GROUP
_PREPARED = codec.TRANSACTION_PREPARED_TYPE
_COMMIT = codec.TRANSACTION_COMMIT_TYPE
_ROLLBACK = codec.TRANSACTION_ROLLBACK_TYPE
_MASK = codec.TRANSACTION_TYPE_MASK


class LocalTransactionState(enum.Enum):
    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"          # sic, RocketMQ's spelling


COMMIT_MESSAGE = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK_MESSAGE = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW


def _state(value: Any) -> LocalTransactionState:
    if isinstance(value, LocalTransactionState):
        return value
    if isinstance(value, str):
        try:
            return LocalTransactionState(value)
        except ValueError:
            pass
    return LocalTransactionState.UNKNOW


class TransactionListener(Protocol):
    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState: ...

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState: ...


@dataclass
class TransactionSendResult(SendResult):
    local_transaction_state: LocalTransactionState = LocalTransactionState.UNKNOW


def end_record(half: MessageExt, tran_type: int) -> Message:
    """EndTransactionProcessor.endMessageTransaction + the fields set after it, for a commit (8) or rollback (12)."""
    props = as_broker_map(half.properties).to_dict()   # serialised before DELAY is cleared
    return Message(topic=half.topic, body=(half.body or b"") if tran_type == _COMMIT else b"", queue_id=half.queue_id,
                   flag=half.flag, sys_flag=(half.sys_flag & ~_MASK) | tran_type, born_timestamp=half.born_timestamp,
                   born_host=half.born_host, store_host=half.store_host, reconsume_times=half.reconsume_times,
                   prepared_transaction_offset=half.commit_log_offset, properties=props)


@dataclass
class _Half:
    group: str
    store_timestamp: int
    check_times: int = 0
    last_check: int = 0


def _decode_state(data) -> tuple[int, dict[int, _Half], set[int]]:
    """transactionCheck.json's parsed JSON; ValueError naming the entry for a wrong shape."""
    data = as_object(data, "transactionCheck.json")
    pending = {}
    for off, h in as_object(data.get("halfTable"), "halfTable").items():
        h = as_object(h, f"halfTable[{off!r}]")
        pending[as_int(off, "halfTable offset")] = _Half(
            str(h.get("producerGroup", "")), as_int(h.get("storeTimestamp", 0), f"halfTable[{off!r}].storeTimestamp"),
            as_int(h.get("checkTimes", 0), f"halfTable[{off!r}].checkTimes"))
    discarded = data.get("discarded") or []
    if not isinstance(discarded, list):
        raise ValueError("discarded is not a list")
    return (as_int(data.get("scanOffset", 0), "scanOffset"), pending,
            {as_int(x, "discarded offset") for x in discarded})


class TransactionCheckService:
    FILE_NAME = "transactionCheck.json"
    SCAN_CHUNK = 4 << 20

    def __init__(self, broker: "LocalBroker"):
        self.broker = broker
        self.store = broker.store
        self.path = config_dir(self.store.path) / self.FILE_NAME
        self.pending: dict[int, _Half] = {}
        self.discarded: set[int] = set()
        self._resolved: set[int] = set()       # ended here, end record not scanned yet
        self.scan_offset = max(self.store.commit_log.get_min_offset(), 0)
        self._lock = threading.RLock()
        self._producers: dict[str, list["TransactionProducer"]] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._dirty = False
        self._load()

    # --- state ----------------------------------------------------------------------------------
    def _load(self) -> None:
        """transactionCheck.json, else its .bak (config_file.load_config_file: CorruptStoreError naming
        the file when neither is usable)."""
        got = load_config_file(self.path, _decode_state)
        if got is None:
            return
        scan, pending, discarded = got
        self.scan_offset = max(scan, self.scan_offset)
        self.pending.update(pending)
        self.discarded = discarded

    def persist(self) -> None:
        with self._lock:
            doc = {"scanOffset": self.scan_offset,
                   "halfTable": {str(o): {"producerGroup": h.group, "storeTimestamp": h.store_timestamp,
                                          "checkTimes": h.check_times} for o, h in sorted(self.pending.items())},
                   "discarded": sorted(self.discarded)}
            self._dirty = False
        string_to_file(dumps_pretty(doc), self.path, _decode_state)

    # --- following the commitlog ----------------------------------------------------------------
    def catch_up(self) -> None:
        """Read the dispatched part of the commitlog past scan_offset for halves and end records."""
        store = self.store
        cl = store.commit_log
        with self._lock:
            end = store.dispatcher.reput_from_offset
            off = max(self.scan_offset, cl.get_min_offset())
            unpack_ii = codec._II.unpack_from
            unpack_i = codec._I.unpack_from
            while off < end:
                got = cl.get_data(off, self.SCAN_CHUNK)
                if got is None or not got[0]:
                    break
                data, start = got
                limit = min(len(data), end - start)
                pos = 0
                rolled = None
                while pos + 8 <= limit:
                    total, magic = unpack_ii(data, pos)
                    if magic == codec.BLANK_MAGIC_CODE:
                        rolled = cl.roll_next_file(start + pos)
                        break
                    if total <= 0 or pos + total > limit:
                        break
                    tran = unpack_i(data, pos + codec.POS_SYSFLAG)[0] & _MASK
                    if tran:
                        self._saw(codec.dispatch_request_at(data, pos, start), tran)
                    pos += total
                new_off = rolled if rolled is not None else start + pos
                if new_off <= off:
                    break
                off = new_off
            if off != self.scan_offset:
                self.scan_offset = off
                self._dirty = True

    def _saw(self, r: codec.DispatchRequest, tran: int) -> None:
        if tran == _PREPARED:
            group = r.properties.get(PROPERTY_PRODUCER_GROUP)
            off = r.commit_log_offset
            if group and off not in self._resolved and off not in self.discarded:
                self.pending[off] = _Half(group, r.store_timestamp)
                self._dirty = True
        else:
            half = r.prepared_transaction_offset
            self._resolved.discard(half)
            if self.pending.pop(half, None) is not None:
                self._dirty = True
            self.discarded.discard(half)

    def pending_halves(self, group: str | None = None) -> list[int]:
        """Commitlog offsets of the open halves (of a group), everything put so far considered."""
        if not self.store._closed:
            self.store.wait_dispatched()
        with self._lock:
            self.catch_up()
            return sorted(o for o, h in self.pending.items() if group is None or h.group == group)

    # --- ending ---------------------------------------------------------------------------------
    def end(self, group: str, half_offset: int, state: LocalTransactionState) -> PutMessageResult | None:
        """Write the commit or rollback record of a half (None if it was already ended)."""
        if state is LocalTransactionState.UNKNOW:
            return None
        tran_type = _COMMIT if state is LocalTransactionState.COMMIT_MESSAGE else _ROLLBACK
        with self._lock:
            self.catch_up()
            if half_offset in self._resolved:
                return None
            if half_offset < self.scan_offset and half_offset not in self.pending and half_offset not in self.discarded:
                return None                      # ended before (or not an open half of any group)
            half = self.store.look_message_by_offset(half_offset)
            if half is None or (half.sys_flag & _MASK) != _PREPARED:
                raise ValueError(f"no prepared transaction message at commitlog offset {half_offset}")
            if half.properties.get(PROPERTY_PRODUCER_GROUP) != group:
                raise ValueError(f"The producer group wrong: the half at {half_offset} belongs to "
                                 f"{half.properties.get(PROPERTY_PRODUCER_GROUP)!r}, not {group!r}")
            r = self.store.put_messages([end_record(half, tran_type)], delay_rewrite=False)[0]
            if r.ok or r.status.value in ("FLUSH_DISK_TIMEOUT", "FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE"):
                self.pending.pop(half_offset, None)
                self.discarded.discard(half_offset)
                self._resolved.add(half_offset)
                self._dirty = True
            return r

    # --- checking -------------------------------------------------------------------------------
    def register(self, producer: "TransactionProducer") -> None:
        with self._lock:
            self._producers.setdefault(producer.group, []).append(producer)
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="TransactionalMessageCheckService",
                                                daemon=True)
                self._thread.start()
        self._wake.set()

    def unregister(self, producer: "TransactionProducer") -> None:
        with self._lock:
            ps = self._producers.get(producer.group, [])
            if producer in ps:
                ps.remove(producer)
            if not ps:
                self._producers.pop(producer.group, None)

    def _tick(self) -> float:
        with self._lock:
            ps = [p for ps in self._producers.values() for p in ps]
        if not ps:
            return 1.0
        return max(0.01, min(min(p.transaction_check_interval_ms, p.transaction_timeout_ms) for p in ps) / 2000.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._tick())
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.check_once()
                if self._dirty:
                    self.persist()
            except Exception:
                log.exception("transaction check failed")

    def check_once(self) -> int:
        """Check every half due for a check; returns how many callbacks were made."""
        with self._lock:
            self.catch_up()
            items = sorted(self.pending.items())
        calls = 0
        for off, h in items:
            if self._stop.is_set():
                break
            with self._lock:
                ps = self._producers.get(h.group)
                producer = ps[0] if ps else None
            if producer is None:
                continue
            now = int(time.time() * 1000)
            if now - h.store_timestamp < producer.transaction_timeout_ms:
                continue
            if h.last_check and now - h.last_check < producer.transaction_check_interval_ms:
                continue
            if h.check_times >= producer.transaction_check_max:
                self._discard(off, h)
                continue
            msg = self.store.look_message_by_offset(off)
            if msg is None:
                with self._lock:
                    self.pending.pop(off, None)
                    self._dirty = True
                continue
            h.check_times += 1
            h.last_check = now
            self._dirty = True
            state = producer._check_local_transaction(msg)
            calls += 1
            if state is not LocalTransactionState.UNKNOW:
                try:
                    self.end(h.group, off, state)
                except ValueError as e:
                    log.warning("transaction check of %d: %s", off, e)
            elif h.check_times >= producer.transaction_check_max:
                self._discard(off, h)
        return calls

    def _discard(self, off: int, h: _Half) -> None:
        log.warning("half message at %d of %s discarded after %d checks", off, h.group, h.check_times)
        with self._lock:
            if self.pending.pop(off, None) is not None:
                self.discarded.add(off)
                self._dirty = True

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        t, self._thread = self._thread, None
        if t is not None and t is not threading.current_thread():
            t.join(timeout=10)
        try:
            self.catch_up()         # the store drained its dispatcher before shutting its services down
            self.persist()
        except OSError as e:
            log.error("cannot persist %s: %s", self.path, e)


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
