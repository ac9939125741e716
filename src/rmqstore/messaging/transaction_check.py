"""The transaction check service and the end records of transactional messages (see transaction.py).

TransactionCheckService (RocketMQ's TransactionalMessageCheckService, one per store, owned by the
LocalBroker) follows the commitlog for halves and end records and asks a registered checker (a started
TransactionProducer, or the network broker's remote producer) about halves that stay open. It depends on
the store only; the producers depend on it, not the other way round.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..common.enums import LocalTransactionState
from ..store.format import codec
from ..store.conf.config_file import as_int, as_object, config_dir, dumps_pretty, load_config_file, string_to_file
from ..store.format.java_map import as_broker_map
from ..store.format.message import Message, MessageExt, PutMessageResult

if TYPE_CHECKING:  # pragma: no cover
    from ..store.store import MessageStore

log = logging.getLogger(__name__)

PROPERTY_TRANSACTION_PREPARED = codec.PROPERTY_TRAN_PREPARED
PROPERTY_PRODUCER_GROUP = codec.PROPERTY_PRODUCER_GROUP
_PREPARED = codec.TRANSACTION_PREPARED_TYPE
_COMMIT = codec.TRANSACTION_COMMIT_TYPE
_ROLLBACK = codec.TRANSACTION_ROLLBACK_TYPE
_MASK = codec.TRANSACTION_TYPE_MASK


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


class TransactionChecker(Protocol):
    """What the check service asks about a group's open halves (a started TransactionProducer)."""
    group: str
    transaction_timeout_ms: int
    transaction_check_interval_ms: int
    transaction_check_max: int

    def _check_local_transaction(self, msg: MessageExt) -> LocalTransactionState: ...


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

    def __init__(self, store: "MessageStore"):
        self.store = store
        self.path = config_dir(self.store.path) / self.FILE_NAME
        self.pending: dict[int, _Half] = {}
        self.discarded: set[int] = set()
        self._resolved: set[int] = set()       # ended here, end record not scanned yet
        self.scan_offset = max(self.store.commit_log.get_min_offset(), 0)
        self._lock = threading.RLock()
        self._producers: dict[str, list[TransactionChecker]] = {}
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
            r = self.store.put_messages([end_record(half, tran_type)], run_hooks=False)[0]
            if r.ok or r.status.value in ("FLUSH_DISK_TIMEOUT", "FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE"):
                self.pending.pop(half_offset, None)
                self.discarded.discard(half_offset)
                self._resolved.add(half_offset)
                self._dirty = True
            return r

    # --- checking -------------------------------------------------------------------------------
    def register(self, producer: TransactionChecker) -> None:
        with self._lock:
            self._producers.setdefault(producer.group, []).append(producer)
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="TransactionalMessageCheckService",
                                                daemon=True)
                self._thread.start()
        self._wake.set()

    def unregister(self, producer: TransactionChecker) -> None:
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
