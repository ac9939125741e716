"""GrpcProxyServer: the RocketMQ 5 gRPC endpoint of `rmqstore serve`, on the broker's asyncio loop and store.

    proxy = GrpcProxyServer(store, local_broker, cfg, groups=subscription_groups)
    await proxy.start()          # listens on brokerIP1:grpcListenPort (8081 by default; 0 picks a free port)
    ...
    await proxy.shutdown()

broker.conf keys: grpcListenPort (8081; -1 turns the endpoint off), brokerIP1, brokerName,
autoCreateTopicEnable, defaultTopicQueueNums, maxMessageSize (the largest body a producer may send).
With `acl` (rmqstore.acl.AclGate, aclEnable=true) every request message is checked by its interceptor."""
from __future__ import annotations

import asyncio
import logging

from ..messaging.pop import DEFAULT_MAX_RECONSUME_TIMES, PopService
from .protocol import grpc, service_grpc
from .service import MessagingService
from .settings import ServerSettings

log = logging.getLogger(__name__)

DEFAULT_GRPC_PORT = 8081
TICK_S = 1.0


def grpc_listen_port(cfg) -> int:
    raw = (getattr(cfg, "extra", None) or {}).get("grpcListenPort")
    try:
        return DEFAULT_GRPC_PORT if raw is None else int(str(raw).strip())
    except ValueError:
        raise ValueError(f"broker.conf grpcListenPort={raw!r} is not a port number") from None


class GrpcProxyServer:
    def __init__(self, store, local, cfg, *, groups=None, port: int | None = None, acl=None):
        self.store = store
        self.local = local
        self.cfg = cfg
        self.groups = groups
        self.acl = acl
        self.host = cfg.broker_ip1 or "127.0.0.1"
        self.port = grpc_listen_port(cfg) if port is None else port
        self.server: "grpc.aio.Server | None" = None
        self.pop = PopService(store, local, max_reconsume_times=self._max_reconsume_times)
        self.service: MessagingService | None = None
        self._tick: asyncio.Task | None = None

    def _max_reconsume_times(self, group: str) -> int:
        g = self.groups.find(group) if self.groups is not None else None
        return g.retry_max_times if g is not None else DEFAULT_MAX_RECONSUME_TIMES

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        cfg = self.cfg
        self.pop.start()
        # broker.conf's maxMessageSize; an auto-created topic gets min(4, defaultTopicQueueNums) queues, what a
        # 4.x client's send gets (its defaultTopicQueueNums, 4, bounded by the broker's TBW102)
        settings = ServerSettings(max_body_size=cfg.max_message_size)
        self.service = svc = MessagingService(
            self.store, self.local, broker_name=cfg.broker_name, endpoint=(self.host, self.port), pop=self.pop,
            settings=settings, auto_create_topic=cfg.auto_create_topic_enable,
            default_queue_nums=min(4, cfg.default_topic_queue_nums))
        svc.loop = svc.arrivals.loop = asyncio.get_running_loop()
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 * 1024 * 1024),
                                          ("grpc.so_reuseport", 0)],
                                 interceptors=[self.acl.grpc_interceptor()] if self.acl is not None else None)
        service_grpc.add_MessagingServiceServicer_to_server(svc, server)
        try:
            bound = server.add_insecure_port(f"{self.host}:{self.port}")
        except RuntimeError:            # grpcio >= 1.5x raises where older ones answered 0
            bound = 0
        if bound == 0:
            raise OSError(f"gRPC endpoint: cannot listen on {self.host}:{self.port} (grpcListenPort)")
        self.server = server
        self.port = bound
        svc.endpoint = (self.host, bound)
        self.store.dispatcher.add_listener(svc.arrivals.on_message_arriving)
        await self.server.start()
        self._tick = asyncio.ensure_future(self._ticker())
        log.info("gRPC endpoint (RocketMQ 5 protocol) at %s", self.address)

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self.pop.tick()
            except Exception:
                log.exception("pop state sync failed")

    async def shutdown(self) -> None:
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        if self.server is not None:
            await self.server.stop(grace=1.0)
            self.server = None
        if self.service is not None:
            self.store.dispatcher.remove_listener(self.service.arrivals.on_message_arriving)
            self.service.hub.shutdown()
        self.pop.shutdown()
