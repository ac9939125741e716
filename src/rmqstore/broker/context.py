"""What every request processor of one broker shares (RocketMQ's BrokerController, as far as the processors
reach into it): the store, the configuration, the topic / offset / subscription-group managers, the client
manager, the statistics and the event loop."""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from ..remoting.codes import PROPERTY_MSG_REGION, PROPERTY_TRACE_SWITCH
from .clients import ClientManager
from .filter import install as filter_install
from .stats import BrokerStatsManager

_enc = json.encoder.encode_basestring


@dataclass
class BrokerContext:
    store: object                    # rmqstore.store.store.MessageStore
    cfg: object                      # rmqstore.store.conf.config.StoreConfig
    local: object                    # rmqstore.messaging.local_broker.LocalBroker: topics, offsets, send-back
    groups: object                   # .state.SubscriptionGroupManager
    region_id: str = "DefaultRegion"
    trace_on: bool = True
    reject_transaction: bool = False
    loop: asyncio.AbstractEventLoop | None = None
    clients: ClientManager = field(default_factory=ClientManager)
    stats: BrokerStatsManager | None = None

    def __post_init__(self):
        self.topics = self.local.topics
        self.offsets = self.local.offsets
        self.store_host = f"{self.cfg.broker_ip1}:{self.cfg.listen_port}"
        self.broker_addr = self.store_host
        self.sync_flush = self.cfg.flush_disk_type == "SYNC_FLUSH"
        # the extFields every send answer carries (SendMessageProcessor's MSG_REGION and TRACE_ON)
        self.base_fields = {PROPERTY_MSG_REGION: self.region_id,
                            PROPERTY_TRACE_SWITCH: "true" if self.trace_on else "false"}
        if self.stats is None:
            self.stats = BrokerStatsManager(self.cfg.broker_cluster_name)
        self.filters = filter_install(self)       # SQL92 subscriptions (filter.py)

    def ok_header_template(self) -> str:
        """The header of a SEND_MESSAGE_V2 answer as RemotingCommand.encode_header writes it, with %-slots for
        msgId, queueId, queueOffset and opaque."""
        base = ",".join(_enc(k) + ":" + _enc(v) for k, v in self.base_fields.items()).replace("%", "%%")
        return ('{"code":0,"extFields":{"msgId":"%s","queueId":"%d","queueOffset":"%d",' + base +
                '},"flag":1,"language":"JAVA","opaque":%d,"serializeTypeCurrentRPC":"JSON","version":293}')

    async def in_executor(self, fn, then):
        """Run fn on an executor thread, answer with then(result) (a request answered later)."""
        return then(await self.loop.run_in_executor(None, fn))
