"""PullMessage / UpdateOffset / GetOffset / QueryOffset (RocketMQ 5 proxy's pull path, which the Node
5.x client's PushConsumer uses): plain reads of a queue by offset with long polling, and the group's
offsets in consumerOffset.json, next to POP."""
from __future__ import annotations

import time

from ..filter import SelectorError, compile_sql92
from ..store.format import codec
from ..store.format.message import GetMessageStatus
from .convert import to_protocol
from .protocol import Code, definition, service, status

POLL_MARGIN_S = 1.0


def expression_filter(expr: "definition.FilterExpression", property_filter: bool):
    """A TAG expression ("*", "a || b") or an SQL92 selector (rmqstore.filter: RocketMQ's rules, compiled once
    per text) as a predicate on messages; None accepts all. ValueError with RocketMQ's remark for a selector
    that does not compile, or for any SQL92 one when enablePropertyFilter is off (property_filter)."""
    if expr.type == definition.FilterType.SQL:
        if not property_filter:
            raise ValueError("The broker does not support consumer to filter message by SQL92")
        try:
            compiled = compile_sql92(expr.expression)
        except SelectorError as e:
            raise ValueError(e.remark) from None
        return lambda m: compiled.matches_cached(m.properties)
    text = (expr.expression or "*").strip()
    if text in ("", "*"):
        return None
    tags = {t.strip() for t in text.split("||") if t.strip()}
    return lambda m: m.properties.get(codec.PROPERTY_TAGS) in tags


class PullActivity:
    def __init__(self, store, local, arrivals):
        self.store = store
        self.local = local
        self.topics = local.topics
        self.arrivals = arrivals           # arrivals.Arrivals: long polling

    def _queue(self, mq) -> tuple[str, int, "definition.Status | None"]:
        topic, qid = mq.topic.name, mq.id
        tc = self.topics.select(topic)
        if tc is None:
            return topic, qid, status(Code.TOPIC_NOT_FOUND, f"topic {topic} not found")
        if not 0 <= qid < max(tc.read_queue_nums, 1):
            return topic, qid, status(Code.BAD_REQUEST, f"queue {qid} of {topic} does not exist")
        return topic, qid, None

    async def pull_message(self, request, context):
        topic, qid, bad = self._queue(request.message_queue)
        if bad is None and not request.group.name:
            bad = status(Code.ILLEGAL_CONSUMER_GROUP, "consumer group is empty")
        try:
            accept = expression_filter(request.filter_expression, self.store.config.enable_property_filter) \
                if bad is None else None
        except ValueError as e:
            bad = status(Code.ILLEGAL_FILTER_EXPRESSION, str(e))
        if bad is not None:
            yield service.PullMessageResponse(status=bad)
            return
        offset, n = request.offset, max(1, min(request.batch_size or 32, 1024))
        poll_s = request.long_polling_timeout.ToMilliseconds() / 1000
        remaining = context.time_remaining()
        if remaining is not None:
            poll_s = max(0.0, min(poll_s, remaining - POLL_MARGIN_S))
        r = await self._pull(request.group.name, topic, qid, offset, n, poll_s)
        msgs = [m for m in r.messages if accept is None or accept(m)]
        code = Code.OK if msgs else Code.MESSAGE_NOT_FOUND
        if r.status in (GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.OFFSET_OVERFLOW_BADLY):
            code = Code.ILLEGAL_OFFSET
        yield service.PullMessageResponse(status=status(code, r.status.value))
        for m in msgs:
            yield service.PullMessageResponse(message=to_protocol(m, topic=topic))
        yield service.PullMessageResponse(next_offset=r.next_begin_offset)

    async def _pull(self, group: str, topic: str, qid: int, offset: int, n: int, poll_s: float):
        deadline = time.monotonic() + poll_s
        while True:
            ev = self.arrivals.event(topic)
            r = self.store.get_message(group, topic, qid, offset, n)
            left = deadline - time.monotonic()
            if r.messages or r.status is not GetMessageStatus.OFFSET_OVERFLOW_ONE or left <= 0:
                return r
            await self.arrivals.wait(ev, left)

    def update_offset(self, request):
        topic, qid, bad = self._queue(request.message_queue)
        if bad is None:
            self.local.offsets.commit_offset(request.group.name, topic, qid, request.offset)
        return service.UpdateOffsetResponse(status=bad or status())

    def get_offset(self, request):
        topic, qid, bad = self._queue(request.message_queue)
        if bad is not None:
            return service.GetOffsetResponse(status=bad)
        off = self.local.offsets.query_offset(request.group.name, topic, qid)
        if off < 0:
            return service.GetOffsetResponse(status=status(Code.OFFSET_NOT_FOUND, "the group has no offset here"))
        return service.GetOffsetResponse(status=status(), offset=off)

    def query_offset(self, request):
        topic, qid, bad = self._queue(request.message_queue)
        if bad is not None:
            return service.QueryOffsetResponse(status=bad)
        policy = request.query_offset_policy
        if policy == definition.QueryOffsetPolicy.BEGINNING:
            off = self.store.get_min_offset_in_queue(topic, qid)
        elif policy == definition.QueryOffsetPolicy.END:
            off = self.store.get_max_offset_in_queue(topic, qid)
        else:
            off = self.store.get_offset_in_queue_by_time(topic, qid, request.timestamp.ToMilliseconds())
        return service.QueryOffsetResponse(status=status(), offset=max(0, off))     # -1: no message yet

