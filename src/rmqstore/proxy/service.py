"""`apache.rocketmq.v2.MessagingService` over the store (RocketMQ 5 proxy's activities: RouteActivity,
SendMessageActivity, ReceiveMessageActivity, AckMessageActivity, ChangeInvisibleDurationActivity,
ForwardMessageToDLQActivity, TransactionActivity, ClientActivity), on grpc.aio.

Every RPC answers a protocol Status; errors are statuses (TOPIC_NOT_FOUND, INVALID_RECEIPT_HANDLE, ...),
never a dropped stream; an RPC not served here answers UNSUPPORTED."""
from __future__ import annotations

import asyncio
import functools
from functools import partial
import inspect
import logging
import struct
import time
import zlib
from dataclasses import dataclass

from ..messaging.pop import AckResult, InvalidReceiptHandle, PopService, ReceiptHandle
from ..messaging.topic_config import PERM_READ, PERM_WRITE
from ..store.format import codec
from ..store.ha.transfer import answer_on, wants_of
from ..store.format.message import PutMessageStatus
from .arrivals import Arrivals
from .convert import BadMessageError, from_protocol, message_id_of, peer_address, to_protocol
from .protocol import Code, MessageType, Permission, TransactionResolution, definition, service
from .protocol import service_grpc, status
from .pull import PullActivity, expression_filter
from .settings import ServerSettings, answer_settings
from .telemetry import TelemetryHub, TelemetrySession

log = logging.getLogger(__name__)

ACCEPT_ALL = (MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY, MessageType.TRANSACTION)
MIN_INVISIBLE_MS = 1_000
MAX_INVISIBLE_MS = 12 * 3600 * 1000
POLL_MARGIN_S = 1.0
_OK_PUT = (PutMessageStatus.PUT_OK, PutMessageStatus.FLUSH_DISK_TIMEOUT, PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
           PutMessageStatus.SLAVE_NOT_AVAILABLE)
_STORED_CODES = {     # RocketMQ 5's SendMessageActivity: these answers carry no message id
    PutMessageStatus.FLUSH_DISK_TIMEOUT: Code.MASTER_PERSISTENCE_TIMEOUT,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: Code.SLAVE_PERSISTENCE_TIMEOUT,
    PutMessageStatus.SLAVE_NOT_AVAILABLE: Code.HA_NOT_AVAILABLE,
}
_PUT_CODES = {
    PutMessageStatus.MESSAGE_ILLEGAL: Code.BAD_REQUEST,
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: Code.MESSAGE_PROPERTIES_TOO_LARGE,
    PutMessageStatus.OS_PAGECACHE_BUSY: Code.TOO_MANY_REQUESTS,
}


@dataclass(frozen=True, slots=True)
class TransactionId:
    """The transaction id answered to a transactional send: where its half message is (RocketMQ 5's proxy
    encodes the half's commitlog and transaction-state-table offsets likewise)."""
    commit_log_offset: int
    queue_offset: int

    def encode(self) -> str:
        return struct.pack(">qq", self.commit_log_offset, self.queue_offset).hex().upper()

    @classmethod
    def decode(cls, s: str) -> "TransactionId":
        try:
            cl, qo = struct.unpack(">qq", bytes.fromhex(s))
        except (ValueError, struct.error):
            raise ValueError(f"transaction id {s[:64]!r} is not one this server gave") from None
        return cls(cl, qo)


def transaction_id_of(half) -> str:
    """The transaction id of a stored half (what its send answered)."""
    return TransactionId(half.commit_log_offset, half.queue_offset).encode()


def _permission(perm: int) -> int:
    r, w = bool(perm & PERM_READ), bool(perm & PERM_WRITE)
    return Permission.READ_WRITE if r and w else Permission.READ if r else Permission.WRITE if w else Permission.NONE


class MessagingService(service_grpc.MessagingServiceServicer):
    def __init__(self, store, local, *, broker_name: str, endpoint: tuple[str, int], pop: PopService,
                 settings: ServerSettings, auto_create_topic: bool, default_queue_nums: int,
                 max_reconsume_times=None):
        self.store = store
        self.local = local
        self.topics = local.topics
        self.broker_name = broker_name
        self.endpoint = endpoint
        self.pop = pop
        self.settings = settings
        self.auto_create_topic = auto_create_topic
        self.default_queue_nums = default_queue_nums
        self.loop: asyncio.AbstractEventLoop | None = None
        self.hub = TelemetryHub(local, store.config, transaction_id_of)
        self.arrivals = Arrivals()
        self.pulls = PullActivity(store, local, self.arrivals)
        self._rr = 0

    # --- helpers ----------------------------------------------------------------------------------
    def _topic(self, name: str):
        tc = self.topics.select(name)
        if tc is None and self.auto_create_topic and name and not name.startswith("rmq_sys_"):
            tc = self.topics.create_topic_in_send_message_method(name, self.default_queue_nums)
        return tc

    def _endpoints(self, asked: "definition.Endpoints") -> "definition.Endpoints":
        if asked.addresses:
            return asked
        e = definition.Endpoints(scheme=definition.AddressScheme.IPv4)
        e.addresses.add(host=self.endpoint[0], port=self.endpoint[1])
        return e

    async def _put(self, msgs):
        """The store's put: on the event loop with ASYNC_FLUSH (an append, as the remoting broker does), in
        the executor with SYNC_FLUSH (it waits for the flush); a SYNC_MASTER's answer once a slave holds the
        messages, awaited without blocking the loop (store/ha)."""
        store = self.store
        if store.config.flush_disk_type == "SYNC_FLUSH":
            results = await self.loop.run_in_executor(None, partial(store.put_messages, msgs, wait_slave=False))
        else:
            results = store.put_messages(msgs, wait_slave=False)
        ha = store.ha
        if ha is None or not ha.sync_master:
            return results
        fut = self.loop.create_future()
        ha.when_replicated(results, answer_on(self.loop, lambda r: _settle(fut, r)), wants_of(msgs))
        return await fut

    # --- route, heartbeat, telemetry ---------------------------------------------------------------
    async def QueryRoute(self, request, context):
        topic = request.topic.name
        tc = self._topic(topic)
        if tc is None:
            return service.QueryRouteResponse(status=status(Code.TOPIC_NOT_FOUND, f"topic {topic} not found"))
        resp = service.QueryRouteResponse(status=status())
        ep = self._endpoints(request.endpoints)
        for qid in range(max(tc.read_queue_nums, tc.write_queue_nums)):
            perm = tc.perm & ((PERM_READ if qid < tc.read_queue_nums else 0) | (PERM_WRITE if qid < tc.write_queue_nums else 0))
            mq = resp.message_queues.add(id=qid, permission=_permission(perm))
            mq.topic.CopyFrom(request.topic)
            mq.broker.name = self.broker_name
            mq.broker.id = 0
            mq.broker.endpoints.CopyFrom(ep)
            mq.accept_message_types.extend(ACCEPT_ALL)
        return resp

    async def Heartbeat(self, request, context):
        return service.HeartbeatResponse(status=status())

    async def NotifyClientTermination(self, request, context):
        return service.NotifyClientTerminationResponse(status=status())

    async def Telemetry(self, request_iterator, context):
        """Answers each Settings with the server's; the session also carries the server's own commands
        (RecoverOrphanedTransactionCommand) for as long as the client keeps the stream."""
        session = TelemetrySession(self.loop)
        reader = asyncio.ensure_future(self._telemetry_read(request_iterator, session))
        try:
            while True:
                cmd = await session.out.get()
                if cmd is None:
                    return
                yield cmd
        finally:
            reader.cancel()
            self.hub.close(session)

    async def _telemetry_read(self, request_iterator, session: TelemetrySession) -> None:
        try:
            async for cmd in request_iterator:
                kind = cmd.WhichOneof("command")
                if kind == "settings":
                    if cmd.settings.WhichOneof("pub_sub") == "publishing":
                        self.hub.publish(session, {t.name for t in cmd.settings.publishing.topics})
                    session.out.put_nowait(service.TelemetryCommand(
                        status=status(), settings=answer_settings(cmd.settings, self.settings)))
                elif kind not in ("thread_stack_trace", "verify_message_result"):
                    session.out.put_nowait(service.TelemetryCommand(
                        status=status(Code.UNSUPPORTED, f"telemetry command {kind} is not served")))
        except asyncio.CancelledError:
            raise
        except Exception as e:          # the client went away mid-stream
            log.debug("telemetry stream ended: %s", e)
        session.out.put_nowait(None)

    async def QueryAssignment(self, request, context):
        topic = request.topic.name
        tc = self._topic(topic)
        if tc is None:
            return service.QueryAssignmentResponse(status=status(Code.TOPIC_NOT_FOUND, f"topic {topic} not found"))
        resp = service.QueryAssignmentResponse(status=status())
        if tc.perm & PERM_READ:
            # one assignment for the broker; a receive pops from all its queues (RocketMQ: queue id -1)
            mq = resp.assignments.add().message_queue
            mq.topic.CopyFrom(request.topic)
            mq.id = -1
            mq.permission = Permission.READ_WRITE
            mq.broker.name = self.broker_name
            mq.broker.endpoints.CopyFrom(self._endpoints(request.endpoints))
            mq.accept_message_types.extend(ACCEPT_ALL)
        return resp

    # --- send ---------------------------------------------------------------------------------------
    async def SendMessage(self, request, context):
        if not request.messages:
            return service.SendMessageResponse(status=status(Code.BAD_REQUEST, "no message to send"))
        peer = context.peer() or ""
        entries = [await self._send_one(m, peer) for m in request.messages]
        resp = service.SendMessageResponse(entries=entries)
        codes = {e.status.code for e in entries}
        if len(entries) == 1 or codes == {Code.OK}:
            resp.status.CopyFrom(entries[0].status if len(codes) == 1 else status(Code.MULTIPLE_RESULTS, "see entries"))
        else:
            resp.status.CopyFrom(status(Code.MULTIPLE_RESULTS, "see entries"))
        return resp

    async def _send_one(self, m, peer: str) -> "service.SendResultEntry":
        topic = m.topic.name
        tc = self._topic(topic)
        if tc is None:
            return service.SendResultEntry(status=status(Code.TOPIC_NOT_FOUND, f"topic {topic} not found"))
        if not tc.perm & PERM_WRITE or tc.write_queue_nums <= 0:
            return service.SendResultEntry(status=status(Code.FORBIDDEN, f"topic {topic} is not writeable"))
        try:
            inc = from_protocol(m, born_host=peer_address(peer), producer_group=topic,
                                max_body_size=self.settings.max_body_size)
        except BadMessageError as e:
            return service.SendResultEntry(status=status(e.code, str(e)))
        msg = inc.message
        group = m.system_properties.message_group if m.system_properties.HasField("message_group") else None
        if group:
            msg.queue_id = (zlib.crc32(group.encode()) & 0x7FFFFFFF) % tc.write_queue_nums
        else:
            self._rr += 1
            msg.queue_id = self._rr % tc.write_queue_nums
        if inc.deliver_ms is not None and inc.transactional:
            return service.SendResultEntry(status=status(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                                                         "a transactional message cannot have a delivery time"))
        r = (await self._put([msg]))[0]
        stored = _STORED_CODES.get(r.status)
        if stored is not None:      # stored on this broker, not as durably as asked (RocketMQ 5's proxy)
            return service.SendResultEntry(status=status(stored, f"send message failed, sendStatus={r.status.value}"))
        if r.status not in _OK_PUT:
            code = _PUT_CODES.get(r.status, Code.INTERNAL_SERVER_ERROR)
            if r.status is PutMessageStatus.MESSAGE_ILLEGAL and "timer" in (r.reason or ""):
                code = Code.ILLEGAL_DELIVERY_TIME
            return service.SendResultEntry(status=status(code, f"{r.status.value}: {r.reason or ''}".strip(": ")))
        a = r.append_result
        tx = TransactionId(a.wrote_offset, a.logics_offset).encode() if inc.transactional else ""
        if inc.transactional:
            self.hub.ensure_checker(topic)       # orphaned halves: asked over the producers' Telemetry
        return service.SendResultEntry(status=status(), message_id=inc.message_id, transaction_id=tx,
                                       offset=a.logics_offset)

    async def EndTransaction(self, request, context):
        try:
            tid = TransactionId.decode(request.transaction_id)
        except ValueError as e:
            return service.EndTransactionResponse(status=status(Code.INVALID_TRANSACTION_ID, str(e)))
        from ..messaging.transaction import LocalTransactionState
        res = request.resolution
        if res == TransactionResolution.COMMIT:
            state = LocalTransactionState.COMMIT_MESSAGE
        elif res == TransactionResolution.ROLLBACK:
            state = LocalTransactionState.ROLLBACK_MESSAGE
        else:
            return service.EndTransactionResponse(status=status())       # unknown: left for a check
        half = self.store.look_message_by_offset(tid.commit_log_offset)
        if half is None or message_id_of(half) != request.message_id or half.queue_offset != tid.queue_offset:
            return service.EndTransactionResponse(status=status(Code.INVALID_TRANSACTION_ID,
                                                                "no such prepared message for this transaction id"))
        group = half.properties.get(codec.PROPERTY_PRODUCER_GROUP, "")
        try:
            r = await self.loop.run_in_executor(None, self.local.transactions.end, group, tid.commit_log_offset, state)
        except ValueError as e:
            return service.EndTransactionResponse(status=status(Code.INVALID_TRANSACTION_ID, str(e)))
        if r is not None and r.status not in _OK_PUT:
            return service.EndTransactionResponse(status=status(Code.INTERNAL_SERVER_ERROR, r.status.value))
        return service.EndTransactionResponse(status=status())

    # --- receive ------------------------------------------------------------------------------------
    async def ReceiveMessage(self, request, context):
        group, topic = request.group.name, request.message_queue.topic.name
        bad = None
        if not group:
            bad = status(Code.ILLEGAL_CONSUMER_GROUP, "consumer group is empty")
        elif self.topics.select(topic) is None:
            bad = status(Code.TOPIC_NOT_FOUND, f"topic {topic} not found")
        invisible_ms = request.invisible_duration.ToMilliseconds() if request.HasField("invisible_duration") else 30_000
        if bad is None and not MIN_INVISIBLE_MS <= invisible_ms <= MAX_INVISIBLE_MS:
            bad = status(Code.ILLEGAL_INVISIBLE_TIME, f"invisible duration {invisible_ms} ms out of "
                                                      f"[{MIN_INVISIBLE_MS}, {MAX_INVISIBLE_MS}]")
        accept = None
        if bad is None:
            try:
                accept = expression_filter(request.filter_expression, self.store.config.enable_property_filter)
            except ValueError as e:
                bad = status(Code.ILLEGAL_FILTER_EXPRESSION, str(e))
        if bad is not None:
            yield service.ReceiveMessageResponse(status=bad)
            return
        batch = max(1, min(request.batch_size or 32, 1024))
        poll_s = request.long_polling_timeout.ToMilliseconds() / 1000 if request.HasField("long_polling_timeout") else 20.0
        remaining = context.time_remaining()
        if remaining is not None:
            poll_s = max(0.0, min(poll_s, remaining - POLL_MARGIN_S))
        got = await self._poll(group, topic, batch, invisible_ms, accept, poll_s)
        if not got:
            yield service.ReceiveMessageResponse(status=status(Code.MESSAGE_NOT_FOUND, "no new message"))
            return
        yield service.ReceiveMessageResponse(status=status())
        for p in got:
            yield service.ReceiveMessageResponse(message=to_protocol(
                p.message, topic=topic, receipt_handle=p.handle.encode(), invisible_ms=p.handle.invisible_ms,
                delivery_attempt=p.attempt))
        ts = service.ReceiveMessageResponse()
        ts.delivery_timestamp.FromMilliseconds(int(time.time() * 1000))
        yield ts

    async def _poll(self, group: str, topic: str, batch: int, invisible_ms: int, accept, poll_s: float):
        deadline = time.monotonic() + poll_s
        while True:
            ev = self.arrivals.event(topic)
            got = self.pop.receive(group, topic, batch, invisible_ms, accept=accept)
            if got:
                return got
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            nv = self.pop.next_visible_ms(group, topic)
            if nv is not None:
                left = min(left, max(0.05, nv / 1000 - time.time()))
            await self.arrivals.wait(ev, left)

    # --- ack, change invisible, dead letter -------------------------------------------------------
    def _handle_status(self, res: AckResult, what: str) -> "definition.Status":
        if res is AckResult.OK:
            return status()
        if res is AckResult.EXPIRED:
            return status(Code.INVALID_RECEIPT_HANDLE, f"{what}: the receipt handle has expired")
        return status(Code.INVALID_RECEIPT_HANDLE, f"{what}: no message in flight for this receipt handle")

    async def AckMessage(self, request, context):
        group, topic = request.group.name, request.topic.name
        resp = service.AckMessageResponse()
        for e in request.entries:
            try:
                st = self._handle_status(self.pop.ack(group, topic, ReceiptHandle.decode(e.receipt_handle)), "ack")
            except InvalidReceiptHandle as ex:
                st = status(Code.INVALID_RECEIPT_HANDLE, str(ex))
            resp.entries.add(message_id=e.message_id, receipt_handle=e.receipt_handle, status=st)
        codes = {x.status.code for x in resp.entries}
        if not resp.entries:
            resp.status.CopyFrom(status(Code.BAD_REQUEST, "no entry to ack"))
        elif len(codes) == 1:
            resp.status.CopyFrom(resp.entries[0].status)
        else:
            resp.status.CopyFrom(status(Code.MULTIPLE_RESULTS, "see entries"))
        return resp

    async def ChangeInvisibleDuration(self, request, context):
        group, topic = request.group.name, request.topic.name
        ms = request.invisible_duration.ToMilliseconds()
        if not 0 <= ms <= MAX_INVISIBLE_MS:
            return service.ChangeInvisibleDurationResponse(status=status(Code.ILLEGAL_INVISIBLE_TIME,
                                                                         f"invisible duration {ms} ms"))
        try:
            res, h = self.pop.change_invisible(group, topic, ReceiptHandle.decode(request.receipt_handle), ms)
        except InvalidReceiptHandle as ex:
            return service.ChangeInvisibleDurationResponse(status=status(Code.INVALID_RECEIPT_HANDLE, str(ex)))
        return service.ChangeInvisibleDurationResponse(status=self._handle_status(res, "change invisible duration"),
                                                       receipt_handle=h.encode() if h else "")

    async def ForwardMessageToDeadLetterQueue(self, request, context):
        group, topic = request.group.name, request.topic.name
        try:
            h = ReceiptHandle.decode(request.receipt_handle)
        except InvalidReceiptHandle as ex:
            return service.ForwardMessageToDeadLetterQueueResponse(status=status(Code.INVALID_RECEIPT_HANDLE, str(ex)))
        res = await self.loop.run_in_executor(None, self.pop.forward_to_dead_letter, group, topic, h)
        return service.ForwardMessageToDeadLetterQueueResponse(status=self._handle_status(res, "forward to DLQ"))

    # --- offsets and pulls (the Node client's PushConsumer): pull.PullActivity -------------------------
    async def PullMessage(self, request, context):
        async for r in self.pulls.pull_message(request, context):
            yield r

    async def UpdateOffset(self, request, context):
        return self.pulls.update_offset(request)

    async def GetOffset(self, request, context):
        return self.pulls.get_offset(request)

    async def QueryOffset(self, request, context):
        return self.pulls.query_offset(request)

    # --- not served: the protocol's UNSUPPORTED ---------------------------------------------------
    async def RecallMessage(self, request, context):
        return service.RecallMessageResponse(status=status(Code.UNSUPPORTED, "RecallMessage is not served"))

    async def SyncLiteSubscription(self, request, context):
        return service.SyncLiteSubscriptionResponse(status=status(Code.UNSUPPORTED, "lite topics are not served"))


def _guarded(name: str, fn):
    """An RPC whose unexpected exception becomes the protocol's INTERNAL_SERVER_ERROR status (logged),
    not gRPC's UNKNOWN."""
    response = getattr(service, "TelemetryCommand" if name == "Telemetry" else f"{name}Response")

    def failed(e: Exception):
        log.exception("%s failed", name)
        return response(status=status(Code.INTERNAL_SERVER_ERROR, f"{name}: {type(e).__name__}: {e}"))

    if inspect.isasyncgenfunction(fn):
        @functools.wraps(fn)
        async def stream(self, request, context):
            try:
                async for r in fn(self, request, context):
                    yield r
            except Exception as e:
                yield failed(e)
        return stream

    @functools.wraps(fn)
    async def unary(self, request, context):
        try:
            return await fn(self, request, context)
        except Exception as e:
            return failed(e)
    return unary


for _name, _fn in list(vars(MessagingService).items()):
    if _name[:1].isupper() and callable(_fn):
        setattr(MessagingService, _name, _guarded(_name, _fn))


def _settle(fut: "asyncio.Future", value) -> None:
    if not fut.done():
        fut.set_result(value)
