"""QueryMessageProcessor: QUERY_MESSAGE (by key or unique key, through the index) and VIEW_MESSAGE_BY_ID
(one record at a commitlog offset); also the record reads the pull and transaction paths share."""
from __future__ import annotations

import struct

from ..remoting.codes import UNIQUE_MSG_QUERY_FLAG, ResponseCode
from ..remoting.command import RemotingCommand
from ..store.format import codec
from ..store.format import scanner
from .context import BrokerContext
from .header import Header
from .net import Channel

_II = struct.Struct(">iI")


def raw_messages(store, messages) -> bytes:
    """The stored records of messages (found by get_message / query_message), concatenated."""
    read = store.commit_log.get_message
    parts = []
    for m in messages:
        raw = read(m.commit_log_offset, m.store_size)
        if raw is not None:
            parts.append(raw)
    return b"".join(parts)


def one_message(store, max_message_size: int, offset: int) -> bytes | None:
    """selectOneMessageByOffset: the whole record at a commitlog offset, if one is there."""
    if offset < 0:
        return None
    head = store.commit_log.get_message(offset, 8)
    if head is None:
        return None
    size, magic = _II.unpack(head)
    if magic not in (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2) or size <= 0 or \
            size > max_message_size + 1024:
        return None
    raw = store.commit_log.get_message(offset, size)
    if raw is None:
        return None
    try:
        scanner.check_record(raw, 0, len(raw))
    except codec.RecordError:
        return None
    return raw


class QueryMessageProcessor:
    def __init__(self, ctx: BrokerContext):
        self.ctx = ctx

    def query_message(self, ch: Channel, req: RemotingCommand):
        ctx = self.ctx
        h = Header(req.ext_fields)
        topic, key = h.str("topic"), h.str("key")
        max_num = h.int("maxNum")
        begin, end = h.long("beginTimestamp"), h.long("endTimestamp")
        if h.f.get(UNIQUE_MSG_QUERY_FLAG) == "true":
            max_num = ctx.cfg.default_query_max_num
        res = ctx.store.query_message(topic, key, max_num, begin, end)
        fields = {"indexLastUpdatePhyoffset": str(res.index_last_update_phyoffset),
                  "indexLastUpdateTimestamp": str(res.index_last_update_timestamp)}
        body = raw_messages(ctx.store, res.messages)
        if body:
            return req.make_response(ResponseCode.SUCCESS, None, fields, body)
        return req.make_response(ResponseCode.QUERY_NOT_FOUND, "can not find message, maybe time range not correct", fields)

    def view_message_by_id(self, ch: Channel, req: RemotingCommand):
        offset = Header(req.ext_fields).long("offset")
        raw = one_message(self.ctx.store, self.ctx.cfg.max_message_size, offset)
        if raw is None:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}")
        return req.make_response(ResponseCode.SUCCESS, body=raw)
