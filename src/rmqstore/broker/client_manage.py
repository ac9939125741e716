"""ClientManageProcessor: HEART_BEAT, UNREGISTER_CLIENT, CHECK_CLIENT_CONFIG."""
from __future__ import annotations

import logging

from ..remoting import fastjson
from ..remoting.codes import PERM_READ, PERM_WRITE, RETRY_GROUP_TOPIC_PREFIX, ResponseCode
from ..remoting.command import RemotingCommand
from .clients import ClientChannelInfo, SubscriptionData
from .context import BrokerContext
from .filter import check_client_config, register_group as register_filters
from .header import Header
from .net import Channel

log = logging.getLogger(__name__)


class ClientManageProcessor:
    def __init__(self, ctx: BrokerContext):
        self.ctx = ctx

    def heart_beat(self, ch: Channel, req: RemotingCommand):
        try:
            data = fastjson.loads(req.body or b"")
            if not isinstance(data, dict):
                raise ValueError("not an object")
            client_id = str(data.get("clientID") or "")
            consumers = list(data.get("consumerDataSet") or [])
            producers = list(data.get("producerDataSet") or [])
            info = ClientChannelInfo(ch, client_id, req.language, req.version)
            parsed = []
            for cd in consumers:
                subs = [SubscriptionData.from_json(s) for s in (cd.get("subscriptionDataSet") or [])]
                parsed.append((str(cd["groupName"]), cd, subs))
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"bad heartbeat body: {e}")
        for group, cd, subs in parsed:
            self._register_consumer(ch, req, client_id, group, cd, subs)
        for pd in producers:
            if isinstance(pd, dict) and pd.get("groupName"):
                self.ctx.clients.register_producer(str(pd["groupName"]), info)
        ch.attrs["client_id"] = client_id
        return req.make_response(ResponseCode.SUCCESS)

    def _register_consumer(self, ch: Channel, req: RemotingCommand, client_id: str, group: str, cd: dict,
                           subs: list) -> None:
        ctx = self.ctx
        sgc = ctx.groups.find(group)
        notify = True
        if sgc is not None:
            notify = sgc.notify_consumer_ids_changed_enable
            sys_flag = 2 if cd.get("unitMode") else 0
            ctx.topics.create_topic_in_send_message_back_method(RETRY_GROUP_TOPIC_PREFIX + group,
                                                                sgc.retry_queue_nums, PERM_WRITE | PERM_READ, sys_flag)
        register_filters(ctx, group, subs)
        changed = ctx.clients.register_consumer(group, ClientChannelInfo(ch, client_id, req.language, req.version),
                                                str(cd.get("consumeType", "CONSUME_PASSIVELY")),
                                                str(cd.get("messageModel", "CLUSTERING")),
                                                str(cd.get("consumeFromWhere", "CONSUME_FROM_LAST_OFFSET")),
                                                subs, notify)
        if changed:
            log.info("consumer %s of %s registered from %s", client_id, group, ch.remote)

    def unregister_client(self, ch: Channel, req: RemotingCommand):
        ctx = self.ctx
        h = Header(req.ext_fields)
        h.str("clientID")
        pg = h.str("producerGroup", required=False)
        if pg is not None:
            ctx.clients.unregister_producer(pg, ch)
        cg = h.str("consumerGroup", required=False)
        if cg is not None:
            sgc = ctx.groups.find(cg)
            ctx.clients.unregister_consumer(cg, ch, sgc.notify_consumer_ids_changed_enable if sgc else True)
        return req.make_response(ResponseCode.SUCCESS, None, {})

    def check_client_config(self, ch: Channel, req: RemotingCommand):
        try:
            body = fastjson.loads(req.body) if req.body else {}
            sd = (body or {}).get("subscriptionData") or {}
        except ValueError as e:
            return req.make_response(ResponseCode.SYSTEM_ERROR, f"bad body: {e}")
        if not isinstance(sd, dict):
            return req.make_response(ResponseCode.SYSTEM_ERROR, "bad body: subscriptionData is not an object")
        code, remark = check_client_config(ctx=self.ctx, sd=sd)
        return req.make_response(code, remark)
