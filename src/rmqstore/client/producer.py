"""Producer: RocketMQ's DefaultMQProducer (and TransactionMQProducer) in Python.

    p = Producer("my_group", "127.0.0.1:9876")
    p.start()
    r = p.send(Message("TopicA", b"hello", tags="TagA", keys="order-1"))       # blocking -> SendResult
    f = p.send_async(Message("TopicA", b"hi"))                                  # concurrent.futures.Future
    p.send_oneway(Message("TopicA", b"fire and forget"))
    p.send_batch([Message("TopicA", b"a"), Message("TopicA", b"b")])           # SEND_BATCH_MESSAGE
    await p.send_coro(msg)                                                      # from asyncio code
    p.shutdown()

On the wire it is the Java 4.4.0 client: SEND_MESSAGE_V2 (310) with the one-letter header to the broker's
VIP port (listenPort - 2), a UNIQ_KEY property per message, GET_ROUTEINTO_BY_TOPIC with the TBW102
fallback for a topic the name server does not know yet, heartbeats with the producer group.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import struct
import threading
import time
from typing import Callable

from ..acl.signature import RemotingSigner, SessionCredentials
from ..remoting.body import encode_batch_entry
from ..remoting.codes import (DEFAULT_TOPIC, PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, RETRY_GROUP_TOPIC_PREFIX,
                              RequestCode, ResponseCode)
from ..remoting.command import RemotingCommand, next_opaque
from . import admin_impl
from .instance import MQClientInstance, TopicPublishInfo, TopicRoute, publish_info
from .message import Message, MessageQueue, MQBrokerError, MQClientError, SendResult
from .remoting import RemotingSendError, RemotingTimeoutError
from .transaction import TransactionalProducer
from .send_request import SendRequests, _UNIQ, _enc

log = logging.getLogger(__name__)

# Broker codes after which the Java producer tries another queue.
_RETRY_CODES = {ResponseCode.TOPIC_NOT_EXIST, ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.SYSTEM_ERROR,
                ResponseCode.NO_PERMISSION, ResponseCode.NO_BUYER_ID, ResponseCode.NOT_IN_CURRENT_UNIT}
MAX_MESSAGE_SIZE = 4 * 1024 * 1024
_II = struct.Struct(">iI")


class Producer(SendRequests, TransactionalProducer):
    def __init__(self, group: str, namesrv_addr: str = "127.0.0.1:9876", *, instance_name: str | None = None,
                 send_msg_timeout: float = 3.0, retry_times_when_send_failed: int = 2,
                 retry_times_when_send_async_failed: int = 2, default_topic_queue_nums: int = 4,
                 create_topic_key: str = DEFAULT_TOPIC, compress_msg_body_over: int = 4096,
                 max_message_size: int = MAX_MESSAGE_SIZE, vip_channel_enabled: bool = True,
                 max_async_in_flight: int = 65535, language: str = "JAVA", client_ip: str | None = None,
                 credentials: SessionCredentials | None = None):
        """credentials: plain ACL's access and secret key; every request is then signed (AclClientRPCHook)."""
        self.group = group
        self.namesrv_addr = namesrv_addr
        self.instance_name = instance_name
        self.send_msg_timeout = send_msg_timeout
        self.retry_times_when_send_failed = retry_times_when_send_failed
        self.retry_times_when_send_async_failed = retry_times_when_send_async_failed
        self.default_topic_queue_nums = default_topic_queue_nums
        self.create_topic_key = create_topic_key
        self.compress_msg_body_over = compress_msg_body_over
        self.max_message_size = max_message_size
        self.vip_channel_enabled = vip_channel_enabled
        self.language = language
        self.client_ip = client_ip
        self._signer = RemotingSigner(credentials) if credentials is not None else None
        self.max_async_in_flight = max_async_in_flight
        self._inflight = 0
        self._inflight_lock = threading.Lock()
        self._slot_freed = threading.Event()
        self._channels: dict[str, str] = {}             # broker name -> address to send to (VIP port)
        self._heads: dict[tuple[str, int], str] = {}     # (topic, code) -> the send header's format
        self._waiters = 0                               # threads waiting for a slot
        self._enc_group = _enc(group)
        self._enc_key = _enc(create_topic_key)
        self._enc_lang = _enc(language)
        self.publish: dict[str, TopicPublishInfo] = {}
        self.mq: MQClientInstance | None = None
        self.transaction_listener = None     # for CHECK_TRANSACTION_STATE: fn(MessageExt) -> LocalTransactionState

    # --- life ---------------------------------------------------------------------------------------
    def start(self) -> "Producer":
        if self.mq is not None:
            return self
        self.mq = MQClientInstance.get(self.namesrv_addr, self.instance_name, self.client_ip, language=self.language,
                                       vip_channel_enabled=self.vip_channel_enabled, rpc_hook=self._signer)
        try:
            self.mq.register_producer(self.group, self)
        except MQClientError:
            self.mq.release()
            self.mq = None
            raise
        self.mq.scheduler.call_later(0, self.mq.send_heartbeat_to_all_brokers)
        return self

    def shutdown(self) -> None:
        mq, self.mq = self.mq, None
        if mq is None:
            return
        try:
            mq.unregister(producer_group=self.group)
        finally:
            mq.release()

    def __enter__(self) -> "Producer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def _check(self) -> MQClientInstance:
        if self.mq is None:
            raise MQClientError("the producer is not started")
        return self.mq

    # --- routes -------------------------------------------------------------------------------------
    def published_topics(self) -> list[str]:
        return list(self.publish)

    def _route_changed(self, topic: str, route: TopicRoute, changed: bool = True) -> None:
        if changed:
            self._channels.clear()
        if changed and topic in self.publish:
            self.publish[topic] = publish_info(topic, route)

    def fetch_publish_message_queues(self, topic: str) -> list[MessageQueue]:
        return list(self._publish_info(topic).queues)

    def _publish_info(self, topic: str) -> TopicPublishInfo:
        info = self.publish.get(topic)
        if info is not None and info.ok:
            return info
        mq = self._check()
        route = mq.update_route(topic)
        if route is not None:
            info = publish_info(topic, route)
        else:
            droute = mq.update_route(topic, default=True, default_queue_nums=self.default_topic_queue_nums)
            if droute is None:
                raise MQClientError(f"No route info of this topic, {topic}\nSee http://rocketmq.apache.org/docs/faq/ "
                                    "for further details.")
            info = publish_info(topic, droute)
        if not info.ok:
            raise MQClientError(f"No route info of this topic, {topic}")
        self.publish[topic] = info
        return info

    # --- sync ---------------------------------------------------------------------------------------
    def send(self, msg: Message, timeout: float | None = None, *, queue: MessageQueue | None = None,
             selector: Callable[[list[MessageQueue], Message, object], MessageQueue] | None = None,
             arg=None) -> SendResult:
        """Send and wait for the broker's answer; on a failure another queue is tried
        (retryTimesWhenSendFailed times) unless a queue was given."""
        self._check_message(msg)
        timeout = self.send_msg_timeout if timeout is None else timeout
        uid = self._prepare(msg)
        deadline = time.monotonic() + timeout
        info = None if queue is not None else self._publish_info(msg.topic)
        if selector is not None:
            queue = selector(list(info.queues), msg, arg)
            info = None
        attempts = 1 if info is None else 1 + self.retry_times_when_send_failed
        last_broker = None
        last_exc: Exception | None = None
        for _ in range(attempts):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            mq = queue if info is None else info.select(last_broker)
            try:
                addr = self._broker_addr(mq)
                resp = self._check().invoke(addr, self._request(msg, mq), left)
                return self._result(resp, uid, mq, addr)
            except MQBrokerError as e:
                last_exc = e
                if e.code not in _RETRY_CODES:
                    raise
            except (RemotingSendError, RemotingTimeoutError, OSError, MQClientError) as e:
                last_exc = e
            last_broker = mq.broker_name
        if last_exc is None:
            raise MQClientError(f"send of {msg!r} timed out after {timeout} s")
        if isinstance(last_exc, MQBrokerError):
            raise last_exc
        raise MQClientError(f"send failed: {last_exc}") from last_exc

    # --- async --------------------------------------------------------------------------------------
    def send_async(self, msg: Message, callback: Callable[[SendResult | None, BaseException | None], None] | None = None,
                   timeout: float | None = None, *, queue: MessageQueue | None = None) -> concurrent.futures.Future:
        """Send without waiting: a Future of the SendResult (callback(result, error) too, in the client's
        reader thread). A failure is retried on another queue retryTimesWhenSendAsyncFailed times."""
        out = _Send()
        if callback is not None:
            out.add_done_callback(lambda f: callback(None if f.exception() else f.result(), f.exception()))
        try:
            self._check_message(msg)
            uid = self._prepare(msg)
            info = None if queue is not None else self._publish_info(msg.topic)
        except Exception as e:
            out.set_exception(e)
            return out
        timeout = self.send_msg_timeout if timeout is None else timeout
        # one of max_async_in_flight slots (RocketMQ's semaphoreAsyncValue); waits up to timeout
        lock = self._inflight_lock
        lock.acquire()
        if self._inflight < self.max_async_in_flight:
            self._inflight += 1
            lock.release()
        else:
            lock.release()
            if not self._acquire_slot(timeout):
                out.set_exception(MQClientError("too many asynchronous sends in flight"))
                return out
        out._producer, out._msg, out._uid, out._info, out._queue = self, msg, uid, info, queue
        out._deadline, out._retries, out._mq, out._addr = (time.monotonic() + timeout,
                                                           self.retry_times_when_send_async_failed, None, None)
        out.attempt(None)
        return out

    def _acquire_slot(self, timeout: float) -> bool:
        """Wait up to timeout for a free slot. Waiters are woken when an eighth of the slots are free
        again (so a waiting sender sends a batch, not one message per answer)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._inflight_lock:
                if self._inflight < self.max_async_in_flight:
                    self._inflight += 1
                    return True
                self._slot_freed.clear()
                self._waiters += 1
            try:
                now = time.monotonic()
                if now >= deadline:
                    return False
                mq = self.mq
                if mq is not None:
                    mq.remoting.flush()     # what is queued goes out before this thread sleeps
                self._slot_freed.wait(min(0.05, deadline - now))
            finally:
                with self._inflight_lock:
                    self._waiters -= 1

    def _release_slot(self, _f=None) -> None:
        with self._inflight_lock:
            self._inflight -= 1
            wake = self._waiters and self._inflight <= self.max_async_in_flight - max(1, self.max_async_in_flight >> 3)
        if wake:
            self._slot_freed.set()

    async def send_coro(self, msg: Message, timeout: float | None = None) -> SendResult:
        """`await producer.send_coro(msg)` from asyncio code (wraps send_async)."""
        return await asyncio.wrap_future(self.send_async(msg, timeout=timeout))

    # --- oneway -------------------------------------------------------------------------------------
    def send_oneway(self, msg: Message, *, queue: MessageQueue | None = None) -> None:
        self._check_message(msg)
        self._prepare(msg)
        mq = queue or self._publish_info(msg.topic).select()
        cmd = self._request(msg, mq)
        self._check().remoting.invoke_oneway(self._broker_addr(mq), cmd)

    # --- batch --------------------------------------------------------------------------------------
    def _batch_request(self, msgs: list[Message], mq: MessageQueue) -> tuple[RemotingCommand, str]:
        if not msgs:
            raise MQClientError("the batch is empty")
        topic = msgs[0].topic
        parts, ids = [], []
        for m in msgs:
            if m.topic != topic:
                raise MQClientError("the topic of the messages in one batch should be the same")
            if m.delay_level > 0:
                raise MQClientError("TimeDelayLevel in not supported for batching")
            if m.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                raise MQClientError("Retry Group is not supported for batching")
            self._check_message(m)
            ids.append(self._prepare(m))
            parts.append(encode_batch_entry(m.flag, m.body, m.properties))
        body = b"".join(parts)
        if len(body) > self.max_message_size:
            raise MQClientError(f"the batch body size {len(body)} over max value, MAX: {self.max_message_size}")
        head = Message(topic, body, wait_store_msg_ok=msgs[0].properties.get("WAIT", "true") == "true")
        head.properties[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = _UNIQ.new_id()
        return self._request(head, mq, code=RequestCode.SEND_BATCH_MESSAGE, body=body, batch=True), ",".join(ids)

    def send_batch(self, msgs: list[Message], timeout: float | None = None, *,
                   queue: MessageQueue | None = None) -> SendResult:
        """All messages to one queue in one request (SEND_BATCH_MESSAGE); msg_id is the comma-joined ids."""
        timeout = self.send_msg_timeout if timeout is None else timeout
        info = None if queue is not None else self._publish_info(msgs[0].topic if msgs else "")
        deadline = time.monotonic() + timeout
        attempts = 1 if info is None else 1 + self.retry_times_when_send_failed
        last_exc, last_broker = None, None
        for _ in range(attempts):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            mq = queue if info is None else info.select(last_broker)
            cmd, ids = self._batch_request(msgs, mq)
            try:
                addr = self._broker_addr(mq)
                return self._result(self._check().invoke(addr, cmd, left), ids, mq, addr)
            except MQBrokerError as e:
                last_exc = e
                if e.code not in _RETRY_CODES:
                    raise
            except (RemotingSendError, RemotingTimeoutError, OSError, MQClientError) as e:
                last_exc = e
            last_broker = mq.broker_name
        if isinstance(last_exc, MQBrokerError):
            raise last_exc
        raise MQClientError(f"batch send failed: {last_exc}")

    def send_batch_async(self, msgs: list[Message], timeout: float | None = None) -> concurrent.futures.Future:
        out: concurrent.futures.Future = concurrent.futures.Future()
        try:
            mq = self._publish_info(msgs[0].topic if msgs else "").select()
            cmd, ids = self._batch_request(msgs, mq)
            addr = self._broker_addr(mq)
        except Exception as e:
            out.set_exception(e)
            return out

        def on_response(resp, exc):
            try:
                if exc is not None:
                    raise exc
                out.set_result(self._result(resp, ids, mq, addr))
            except Exception as e:
                out.set_exception(e)
        try:
            self._check().remoting.invoke_async(addr, cmd, self.send_msg_timeout if timeout is None else timeout,
                                                on_response)
        except Exception as e:
            if not out.done():
                out.set_exception(e)
        return out

    # --- lookups (DefaultMQProducer.queryMessage / viewMessage) ----------------------------------------
    def query_message(self, topic: str, key: str, max_num: int = 32, begin: int = 0, end: int = 2 ** 63 - 1):
        return admin_impl.query_message(self._check(), topic, key, max_num, begin, end)

    def view_message(self, msg_id: str, topic: str | None = None):
        if topic is None:
            return admin_impl.view_message(self._check(), msg_id)
        return admin_impl.view_message_any(self._check(), topic, msg_id)


_LAZY = threading.Lock()
_FINISHED = concurrent.futures._base.FINISHED
_CANCELLED = (concurrent.futures._base.CANCELLED, concurrent.futures._base.CANCELLED_AND_NOTIFIED)
_DONE = _CANCELLED + (_FINISHED,)


class SendFuture(concurrent.futures.Future):
    """The Future send_async answers: a concurrent.futures.Future whose Condition (and waiter and callback
    lists) are made only when something waits on it (result() before it is done, wait(), as_completed())
    or cancels it - most are done before anyone asks. Until then its state changes under one module lock;
    once the Condition exists, everything is the base class's, under the Condition."""

    def __init__(self):
        self._cond = None
        self._state = concurrent.futures._base.PENDING
        self._result = None
        self._exception = None
        self._wl = None
        self._cbs = None

    @property
    def _condition(self):
        c = self._cond
        if c is None:
            with _LAZY:
                c = self._cond
                if c is None:
                    c = self._cond = threading.Condition()
        return c

    @property
    def _waiters(self):
        w = self._wl
        if w is None:
            with _LAZY:
                w = self._wl
                if w is None:
                    w = self._wl = []
        return w

    @property
    def _done_callbacks(self):
        cbs = self._cbs
        if cbs is None:
            with _LAZY:
                cbs = self._cbs
                if cbs is None:
                    cbs = self._cbs = []
        return cbs

    def _invoke_callbacks(self):
        cbs = self._cbs
        if cbs:
            for callback in cbs:
                try:
                    callback(self)
                except Exception:
                    concurrent.futures._base.LOGGER.exception("exception calling callback for %r", self)

    def done(self):
        return self._state in _DONE

    def running(self):
        return self._state == concurrent.futures._base.RUNNING

    def cancelled(self):
        return self._state in _CANCELLED

    def result(self, timeout=None):
        if self._state == _FINISHED and self._exception is None:
            return self._result
        return super().result(timeout)

    def exception(self, timeout=None):
        if self._state == _FINISHED:
            return self._exception
        return super().exception(timeout)

    def add_done_callback(self, fn):
        with _LAZY:
            if self._cond is not None:
                now = None
            elif self._state not in _DONE:
                if self._cbs is None:
                    self._cbs = [fn]
                else:
                    self._cbs.append(fn)
                return
            else:
                now = True
        if now is None:
            super().add_done_callback(fn)
            return
        try:
            fn(self)
        except Exception:
            concurrent.futures._base.LOGGER.exception("exception calling callback for %r", self)

    def _set(self, result, exception) -> bool:
        """Finish without a Condition (True), or leave it to the base class (False: one exists)."""
        with _LAZY:
            if self._cond is not None:
                return False
            state = self._state
            if state not in _DONE:
                self._result = result
                self._exception = exception
                self._state = _FINISHED
        if state in _DONE:
            raise concurrent.futures.InvalidStateError(f"{state}: {self!r}")
        self._invoke_callbacks()
        return True

    def set_result(self, result):
        if not self._set(result, None):
            super().set_result(result)

    def set_exception(self, exception):
        if not self._set(None, exception):
            super().set_exception(exception)


class _Send(SendFuture):
    """One send_async: its future, and the pending request of its connection (`_deadline`, `_on_answer`)."""

    def attempt(self, last_broker: str | None) -> None:
        p = self._producer
        info = self._info
        mq = self._mq = self._queue if info is None else info.select(last_broker)
        if self._deadline <= time.monotonic():
            self.finish(None, MQClientError(f"send of {self._msg!r} timed out"))
            return
        try:
            addr = self._addr = p._channels.get(mq.broker_name) or p._broker_addr(mq)
            opaque = next_opaque()
            header, body = p._encode(self._msg, mq, opaque)
            conn = p._check().remoting.connection(addr)
            conn.send_async(_II.pack(4 + len(header) + len(body), len(header)) + header + body, opaque, self)
        except Exception as e:
            self.retry_or_fail(e)

    def _on_answer(self, resp: RemotingCommand | None, exc: BaseException | None) -> None:
        """The answer (or the error) of the request: a SendResult, or another attempt, or the error."""
        if exc is None:
            try:
                res = self._producer._result(resp, self._uid, self._mq, self._addr)
            except Exception as e:
                exc = e
            else:
                self.finish(res, None)
                return
        self.retry_or_fail(exc)

    def retry_or_fail(self, exc: BaseException) -> None:
        if self._retries > 0 and self._info is not None and not (isinstance(exc, MQBrokerError)
                                                                  and exc.code not in _RETRY_CODES):
            self._retries -= 1
            self.attempt(self._mq.broker_name if self._mq is not None else None)
        else:
            self.finish(None, exc)

    def finish(self, res: SendResult | None, exc: BaseException | None) -> None:
        p = self._producer
        if p is None:
            return
        self._producer = self._msg = self._info = self._queue = None      # once; and let them go
        p._release_slot()
        if self._state in _DONE:        # cancelled meanwhile
            return
        try:
            if exc is None:
                self.set_result(res)
            else:
                self.set_exception(exc)
        except concurrent.futures.InvalidStateError:
            pass
