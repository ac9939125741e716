"""ConsumerManageProcessor: GET_CONSUMER_LIST_BY_GROUP, QUERY_CONSUMER_OFFSET, UPDATE_CONSUMER_OFFSET."""
from __future__ import annotations

from ..remoting import fastjson
from ..remoting.codes import ResponseCode
from ..remoting.command import RemotingCommand
from ..store.store import TOTAL_PHYSICAL_MEMORY_SIZE
from .context import BrokerContext
from .header import Header
from .net import Channel


class ConsumerManageProcessor:
    def __init__(self, ctx: BrokerContext):
        self.ctx = ctx

    def get_consumer_list_by_group(self, ch: Channel, req: RemotingCommand):
        group = Header(req.ext_fields).str("consumerGroup")
        gi = self.ctx.clients.group_info(group)
        if gi is not None:
            ids = gi.all_client_ids()
            if ids:
                return req.make_response(ResponseCode.SUCCESS, None, {},
                                         fastjson.dumps_bytes({"consumerIdList": ids}))
        return req.make_response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}", {})

    def query_consumer_offset(self, ch: Channel, req: RemotingCommand):
        store = self.ctx.store
        h = Header(req.ext_fields)
        group, topic, qid = h.str("consumerGroup"), h.str("topic"), h.int("queueId")
        off = self.ctx.offsets.query_offset(group, topic, qid)
        if off >= 0:
            return req.make_response(ResponseCode.SUCCESS, None, {"offset": str(off)})
        min_off = store.get_min_offset_in_queue(topic, qid)
        if min_off <= 0 and not self._in_disk(topic, qid, 0):
            return req.make_response(ResponseCode.SUCCESS, None, {"offset": "0"})
        return req.make_response(ResponseCode.QUERY_NOT_FOUND,
                                 "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first", {})

    def _in_disk(self, topic: str, qid: int, offset: int) -> bool:
        """checkInDiskByConsumeOffset: is the message far behind the commitlog's end (out of memory)?"""
        store = self.ctx.store
        try:
            phy = store.get_commit_log_offset_in_queue(topic, qid, offset)
        except Exception:
            return False
        if phy <= 0 and store.get_max_offset_in_queue(topic, qid) == 0:
            return False
        memory = TOTAL_PHYSICAL_MEMORY_SIZE * self.ctx.cfg.access_message_in_memory_max_ratio // 100
        return store.get_max_phy_offset() - phy > memory

    def update_consumer_offset(self, ch: Channel, req: RemotingCommand):
        h = Header(req.ext_fields)
        self.ctx.offsets.commit_offset(h.str("consumerGroup"), h.str("topic"), h.int("queueId"),
                                       h.long("commitOffset"))
        return req.make_response(ResponseCode.SUCCESS, None, {})
