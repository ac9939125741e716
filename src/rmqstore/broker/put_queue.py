"""The broker's put queue: the sends of one event-loop iteration go to the store in one `put_messages` call
(in an executor thread when the store flushes synchronously), and their answers go back a connection at a
time.

A queued entry is one of three shapes:
- RawSend: a JSON SEND_MESSAGE_V2 as it came (the hot path: checked at flush time, all at once when a
  whole iteration's sends are plain ones from one connection to one topic, SendMessageProcessor.columnar);
- PlainSend: one checked plain send (SendMessageProcessor.plain), put without building a Message;
- PendingPut: Messages from the general path, answered by their callback.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from itertools import repeat
from typing import Callable, NamedTuple

from ..remoting.codes import PROPERTY_TRANSACTION_PREPARED, ResponseCode
from ..remoting.command import RemotingCommand
from ..store.format import codec
from ..store.format.message import Message, PutMessageResult, PutMessageResults, PutMessageStatus
from ..store.ha.transfer import answer_on, wants_of
from ..store.format.message_batch import COLUMNAR_MIN, MessageBatch
from .context import BrokerContext
from .net import Channel

log = logging.getLogger(__name__)


_COUNTED = (PutMessageStatus.PUT_OK, PutMessageStatus.FLUSH_DISK_TIMEOUT, PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
            PutMessageStatus.SLAVE_NOT_AVAILABLE)


class RawSend(NamedTuple):
    """A JSON SEND_MESSAGE_V2 queued as it came, checked when the queue is flushed."""
    channel: Channel
    request: RemotingCommand


class PlainSend(NamedTuple):
    """A checked (not oneway) SEND_MESSAGE_V2 of one plain message to a known topic (no batch, retry topic,
    transaction or odd field): what the put needs, without a Header or a Message."""
    channel: Channel
    request: RemotingCommand
    topic: str
    queue_id: int
    flag: int
    sys_flag: int
    born_timestamp: int
    properties: str
    body: bytes


@dataclass
class PendingPut:
    """Messages of the general send path (or of put_async); done gets their results."""
    msgs: list[Message]
    done: Callable[[list[PutMessageResult]], None]


_tuple_new = tuple.__new__


class PutQueue:
    """Gathers puts over one loop iteration into one store call; `sender` is the SendMessageProcessor that
    checks raw sends and encodes the answers."""

    def __init__(self, ctx: BrokerContext, sender):
        self.ctx = ctx
        self.sender = sender
        self.entries: list = []
        self._general = False            # some entry is a PendingPut
        self.has_raw = False             # some entry is a RawSend (Broker.handle sets it too, see add_raw)
        self._plain = False              # some entry is a PlainSend
        self.scheduled = False           # flush is scheduled
        self.touched: set = set()        # connections with answers to flush

    # --- queueing -----------------------------------------------------------------------------------
    def _schedule(self) -> None:
        if not self.scheduled:
            self.scheduled = True
            self.ctx.loop.call_soon(self.flush)

    def add_raw(self, ch: Channel, req: RemotingCommand) -> None:
        """Queue a RawSend. Broker.handle does the same inline (the hot path: one call per send saved), and
        builds the RawSend as tuple.__new__ does, without NamedTuple's keyword-handling __new__."""
        self.entries.append(_tuple_new(RawSend, (ch, req)))
        self.has_raw = True
        if not self.scheduled:
            self.scheduled = True
            self.ctx.loop.call_soon(self.flush)

    def add_plain(self, p: PlainSend) -> None:
        self.entries.append(p)
        self._plain = True
        self._schedule()

    def submit(self, msgs: list[Message], done: Callable[[list[PutMessageResult]], None]) -> None:
        self.entries.append(PendingPut(msgs, done))
        self._general = True
        self._schedule()

    # --- flushing -----------------------------------------------------------------------------------
    def flush(self) -> None:
        self.scheduled = False
        puts, self.entries = self.entries, []
        general, self._general = self._general, False
        raw, self.has_raw = self.has_raw, False
        plain, self._plain = self._plain, False
        if not puts:
            return
        qids = payload = None
        if raw:
            got = None if general or plain or len(puts) < COLUMNAR_MIN else self.sender.columnar(puts)
            if got is not None:
                payload, qids = got
            else:       # each send checked by itself (a few sync sends, or a mixed batch)
                puts = self._check_each(puts)
                if puts is None:
                    return
        if qids is None:
            payload = None if general else self._message_batch(puts)
        if payload is None:
            payload = self._messages(puts)
        self._put(puts, payload, qids)

    def _check_each(self, puts: list) -> list | None:
        """The raw sends as PlainSends; None when one needs the general path (all queued again, in order)."""
        checked = []
        for p in puts:
            if type(p) is RawSend:
                p = self.sender.plain(p.channel, p.request, p.request.ext_fields)
                if p is None:
                    self._requeue(puts)
                    return None
            checked.append(p)
        return checked

    def _messages(self, puts: list) -> list[Message]:
        payload = []
        store_host = self.ctx.store_host
        for p in puts:
            if type(p) is PlainSend:
                payload.append(Message(p.topic, p.body, p.queue_id, p.flag, p.sys_flag, p.born_timestamp,
                                       p.channel.remote, store_host, 0, 0, codec.string_to_properties(p.properties)))
            else:
                payload.extend(p.msgs)
        return payload

    def _put(self, puts: list, payload, qids: list | None) -> None:
        n = len(payload)
        if self.ctx.sync_flush:
            fut = self.ctx.loop.run_in_executor(None, self._put_all, payload)
            fut.add_done_callback(lambda f: self._answer(puts, f.result() if not f.exception() else
                                                         self._failed(n, f.exception()), qids, payload))
        else:
            try:
                results = self._put_all(payload)
            except Exception as e:
                results = self._failed(n, e)
            self._answer(puts, results, qids, payload)

    def _answer(self, puts: list, results, qids: list | None, payload) -> None:
        """Deliver the answers now, or, on a SYNC_MASTER, once a slave holds the messages (store/ha): the
        loop goes on with other producers' sends meanwhile (RocketMQ's send thread waits instead)."""
        ha = self.ctx.store.ha
        if ha is None or not ha.sync_master:
            self._deliver(puts, results, qids)
            return
        ha.when_replicated(results, answer_on(self.ctx.loop, lambda r: self._deliver(puts, r, qids)),
                           wants_of(payload))

    def flush_all(self) -> None:
        """Put what is queued now (at shutdown): flush until nothing is left (a flush may queue again what it
        had to check one by one)."""
        for _ in range(3):
            if not self.entries:
                return
            self.flush()

    def _requeue(self, puts: list) -> None:
        """Queue puts again, in order, each raw send checked by itself now: a plain one as a PlainSend, any
        other by the general path (which answers what is wrong)."""
        for p in puts:
            if type(p) is PlainSend:
                self.add_plain(p)
                continue
            if type(p) is PendingPut:
                self.entries.append(p)
                self._general = True
                continue
            ch, req = p
            plain = self.sender.plain(ch, req, req.ext_fields)
            if plain is not None:
                self.add_plain(plain)
                continue
            try:
                r = self.sender.handle_general(ch, req)
            except Exception as e:
                log.exception("request %s from %s failed", req.code_name, ch.remote)
                r = req.make_response(ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")
            if r is not None:
                ch._answer(req, r)
        if self.entries:
            self._schedule()

    def _message_batch(self, puts: list) -> MessageBatch | None:
        """PlainSends as one MessageBatch when they come from one connection, to one topic, with the same
        flag, sysFlag and property names; else None (they go as Messages)."""
        n = len(puts)
        if n < COLUMNAR_MIN:
            return None
        chs, _reqs, topics, qids, flags, sys_flags, borns, props, bodies = zip(*puts)
        ch = chs[0]
        if chs.count(ch) != n or topics.count(topics[0]) != n or flags.count(flags[0]) != n \
                or sys_flags.count(sys_flags[0]) != n:
            return None
        columns = property_columns(props, n)
        if columns is None:
            return None
        try:
            return MessageBatch(topics[0], list(bodies), queue_ids=list(qids), properties=columns, flag=flags[0],
                                sys_flag=sys_flags[0], born_timestamp=list(borns), born_host=ch.remote,
                                store_host=self.ctx.store_host)
        except (TypeError, ValueError):
            return None

    def _put_all(self, msgs) -> list[PutMessageResult]:
        t0 = time.monotonic()
        results = self.ctx.store.put_messages(msgs, wait_slave=False)     # (_answer waits for a slave)
        self._count(msgs, results, int((time.monotonic() - t0) * 1000))
        return results

    def _count(self, msgs, results, elapsed_ms: int) -> None:
        """The put statistics: per topic, the messages written and their bytes."""
        per_topic: dict[str, list[int]] = {}
        if type(results) is PutMessageResults and (type(msgs) is MessageBatch or _one_topic(msgs)):
            # the columnar answer: its columns, not a result object per message
            if results.appended:
                per_topic[msgs.topic if type(msgs) is MessageBatch else msgs[0].topic] = [results.appended,
                                                                                          results.wrote_bytes]
        else:
            topics = repeat(msgs.topic) if type(msgs) is MessageBatch else (m.topic for m in msgs)
            for topic, r in zip(topics, results):
                if r.append_result is not None and r.status in _COUNTED:
                    acc = per_topic.get(topic)
                    if acc is None:
                        acc = per_topic[topic] = [0, 0]
                    acc[0] += 1
                    acc[1] += r.append_result.wrote_bytes
        if not per_topic:
            return
        stats = self.ctx.stats
        for topic, (n, size) in per_topic.items():
            if self.ctx.sync_flush:      # on an executor thread: count on the loop
                self.ctx.loop.call_soon_threadsafe(stats.on_put, topic, n, size, elapsed_ms)
            else:
                stats.on_put(topic, n, size, elapsed_ms)

    def _failed(self, n: int, exc) -> list[PutMessageResult]:
        log.error("put of %d messages failed: %s", n, exc)
        return [PutMessageResult(PutMessageStatus.UNKNOWN_ERROR) for _ in range(n)]

    # --- answering ----------------------------------------------------------------------------------
    def _deliver(self, puts: list, results, qids: list | None = None) -> None:
        if qids is not None:
            self._deliver_columnar(puts, results, qids)
        elif type(results) is PutMessageResults and results.all_ok and len(results) == len(puts) and all(
                type(p) is PlainSend for p in puts):
            self._deliver_all_ok(puts, results)
        else:
            self._deliver_each(puts, results)
        # Write the answers now, before this thread lets go of the GIL (the next select() would hand it to
        # the dispatcher thread that the put just woke, delaying every answer by its parse).
        for ch in self.touched:
            ch.flush()
        self.touched.clear()

    def _deliver_columnar(self, puts: list, results, qids: list) -> None:
        """SendMessageProcessor.columnar's: RawSends of one connection."""
        ch = puts[0].channel
        reqs = [p.request for p in puts]
        if type(results) is PutMessageResults and results.all_ok:
            ch.send_frames(self.sender.ok_frames(results.msg_ids, qids, results.queue_offsets, reqs))
            return
        for i, req in enumerate(reqs):
            ch.send(self.sender.put_response(req, results[i], qids[i]))
        self.touched.add(ch)

    def _deliver_all_ok(self, puts: list, results: PutMessageResults) -> None:
        """Every message put, every request a PlainSend: the answers as bytes, per connection."""
        n = len(puts)
        chs, reqs, _t, qids = list(zip(*puts))[:4]
        parts = self.sender.ok_frames(results.msg_ids, qids, results.queue_offsets, reqs)
        ch = chs[0]
        if chs.count(ch) == n:
            ch.send_frames(parts)
            return
        frames: dict = {}
        for i, ch in enumerate(chs):
            lst = frames.get(ch)
            if lst is None:
                lst = frames[ch] = []
            lst += parts[2 * i:2 * i + 2]
        for ch, lst in frames.items():
            ch.send_frames(lst)

    def _deliver_each(self, puts: list, results) -> None:
        i = 0
        for p in puts:
            if type(p) is PlainSend:
                ch, req, qid = p.channel, p.request, p.queue_id
                r = results[i]
                if r.status is PutMessageStatus.PUT_OK and req.serialize_type == 0:
                    a = r.append_result
                    ch.send_frames([self.sender.ok_frame(req.opaque, a.msg_id, qid, a.logics_offset)])
                else:
                    ch.send(self.sender.put_response(req, r, qid))
                    self.touched.add(ch)
                i += 1
                continue
            k = len(p.msgs)
            try:
                p.done(results[i:i + k])
            except Exception:
                log.exception("answering a put failed")
            i += k


def _one_topic(msgs: list[Message]) -> bool:
    t = msgs[0].topic if msgs else None
    return all(m.topic == t for m in msgs)


def property_columns(props, n: int) -> dict | None:
    """The properties ("k\\x01v\\x02" * k) of n messages as {name: [value of each message]}, split over the
    whole batch at once; None unless each message has the same k names in the same order, each once, and
    none is a transaction half (those go as Messages, parsed one by one)."""
    p0 = props[0]
    k = p0.count("\x02")
    if not k:
        return None if any(props) else {}
    if list(map(str.count, props, repeat("\x02", n))).count(k) != n \
            or not all(map(str.endswith, props, repeat("\x02", n))):
        return None
    joined = "".join(props)
    if PROPERTY_TRANSACTION_PREPARED in joined:
        return None
    items = joined.split("\x02")
    items.pop()
    if list(map(str.count, items, repeat("\x01", n * k))).count(1) != n * k:
        return None
    flat = "\x01".join(items).split("\x01")
    names = flat[0:2 * k:2]
    if len(set(names)) != k or flat[0::2] != names * n:
        return None
    step = 2 * k
    return {names[j]: flat[2 * j + 1::step] for j in range(k)}
