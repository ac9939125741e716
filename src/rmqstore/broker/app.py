"""One process: the name server and a broker over a MessageStore, on one asyncio event loop.

    server = BrokerServer("/data/store", StoreConfig.load("broker.conf"))
    await server.start()        # opens the store, listens on listenPort, listenPort-2 (VIP) and the name server
    ...
    await server.stop()         # closes connections, persists offsets/topics, closes the store

Listening addresses: the broker on brokerIP1 (127.0.0.1 by default) at listenPort and listenPort-2; the
name server on the address of namesrvAddr (127.0.0.1:9876 by default) unless `namesrv=False`.
"""
from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from ..acl import AclGate, inner_client_signer
from ..store.conf.config import StoreConfig
from .admin import load_persisted_config
from .core import Broker
from .namesrv import NameServer
from .net import FrameLimits, RemotingServer
from .outer import BrokerOuterAPI, split_addr
from .slave_sync import SlaveSynchronize
from .state import SubscriptionGroupManager

log = logging.getLogger(__name__)

REGISTER_INTERVAL = 30.0
REGISTER_RETRY = 1.0        # while no name server took the registration, or a slave's answer named no master
PERSIST_INTERVAL = 5.0
SCAN_INTERVAL = 10.0


def parse_addr(addr: str, default_port: int = 9876) -> tuple[str, int]:
    """The first address of a name server list ("a:9876;b:9876")."""
    return split_addr(addr.split(";")[0], default_port)


class BrokerServer:
    def __init__(self, store_path: str | Path, config: StoreConfig | None = None, *, namesrv: bool = True,
                 namesrv_addr: str | None = None, idle_timeout: float | None = None, store=None):
        self.store_path = Path(store_path)
        self.cfg = config or StoreConfig()
        self.embedded_namesrv = namesrv
        self.namesrv_addr = namesrv_addr or self.cfg.namesrv_addr or "127.0.0.1:9876"
        extra = self.cfg.extra or {}
        self.idle_timeout = idle_timeout if idle_timeout is not None else float(
            extra.get("serverChannelMaxIdleTimeSeconds", 120))
        self.store = store
        self._own_store = store is None
        self.broker: Broker | None = None
        self.namesrv: NameServer | None = None
        self.servers: list[RemotingServer] = []
        self._tasks: list[asyncio.Task] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self.acl: AclGate | None = None          # aclEnable=true: every port's requests pass this gate
        self.signer = None                       # innerClientAuthenticationCredentials: signs our own requests
        self.started = False
        self._registering = False
        self._register_again = False
        self._register_soon = False     # register again after REGISTER_RETRY, not REGISTER_INTERVAL
        self.outer = BrokerOuterAPI()                   # requests to the name servers and the master
        self.slave_sync: SlaveSynchronize | None = None

    # --- life ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        cfg = self.cfg
        # updateBrokerConfig's persisted keys over broker.conf's (RocketMQ rewrites its -c file instead)
        load_persisted_config(self.store_path, cfg)
        if cfg.ha_listen_port not in (0, cfg.listen_port + 1):
            log.warning("haListenPort=%d ignored: the HA port is listenPort + 1 = %d, as RocketMQ's broker",
                        cfg.ha_listen_port, cfg.listen_port + 1)
        cfg.ha_listen_port = cfg.listen_port + 1
        self.signer = inner_client_signer(cfg)
        self.outer.signer = self.signer          # registrations and a slave's sync requests are signed
        self.acl = AclGate.from_config(cfg)      # before the store: a bad plain_acl.yml stops the start
        if self.store is None:
            from ..store.store import MessageStore
            store = MessageStore(self.store_path, cfg)
            if self.acl is not None:     # the HA port admits only peers of globalWhiteRemoteAddresses
                store.ha_accept = self.acl.trusted_peer
            store.ha_loop = self.loop    # a master's HA port on this loop: a SYNC_MASTER send's round trip in one thread
            await self.loop.run_in_executor(None, store.start)
            self.store = store
        try:
            await self._start_services()
        except BaseException:
            await self.stop()
            raise
        self.started = True

    async def _start_services(self) -> None:
        from ..messaging.local_broker import LocalBroker
        cfg = self.cfg
        root = self.store_path
        local = LocalBroker.of(self.store)      # topics.json, consumerOffset.json, retry / DLQ send-back
        groups = SubscriptionGroupManager(root, auto_create=str(cfg.extra.get("autoCreateSubscriptionGroup", "true"))
                                          .lower() != "false")
        groups.load()
        self.broker = broker = Broker(self.store, cfg, local, groups)
        broker.loop = self.loop
        local.topics.add_listener(self._on_topic_changed)
        host = cfg.broker_ip1 or "127.0.0.1"
        limits = FrameLimits.of(cfg)        # serverFrameMemoryMax: one budget for every listener
        if self.embedded_namesrv:
            self.namesrv = NameServer()
            nhost, nport = parse_addr(self.namesrv_addr)
            ns_handler = self.namesrv.handle if self.acl is None else self.acl.namesrv(self.namesrv.handle)
            ns = RemotingServer(nhost, nport, ns_handler, name="namesrv", idle_timeout=self.idle_timeout,
                                on_close=self.namesrv.on_close, limits=limits)
            await ns.start()
            self.servers.append(ns)
        handler = broker.handle if self.acl is None else self.acl.remoting(broker.handle)
        main = RemotingServer(host, cfg.listen_port, handler, name="broker", idle_timeout=self.idle_timeout,
                              on_close=broker.on_close, limits=limits)
        await main.start()
        self.servers.append(main)
        if cfg.listen_port >= 2:
            vip = RemotingServer(host, cfg.listen_port - 2, handler, name="broker-vip",
                                 idle_timeout=self.idle_timeout, on_close=broker.on_close, limits=limits)
            await vip.start()
            self.servers.append(vip)
        self.store.dispatcher.add_listener(broker.on_message_arriving)
        if cfg.is_slave:
            self.slave_sync = SlaveSynchronize(broker.ctx, self.outer, self.store_path)
        self._register_broker()
        self._tasks.append(asyncio.ensure_future(self._periodic()))
        log.info("broker %s (%s) serving store %s at %s; name server %s", cfg.broker_name, cfg.broker_cluster_name,
                 self.store_path, broker.broker_addr, self.namesrv_addr if self.embedded_namesrv else "external")

    def _on_topic_changed(self, topic: str) -> None:
        # TopicConfigManager listeners run in whatever thread changed the topic
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        try:
            if asyncio.get_running_loop() is loop:
                self._register_broker()
                return
        except RuntimeError:
            pass
        loop.call_soon_threadsafe(self._register_broker)

    def _register_broker(self) -> None:
        """registerBrokerAll: publish the topic configs to the embedded name server (in process), or with
        REGISTER_BROKER (103) to every name server of namesrvAddr when there is no embedded one. A slave takes
        its master's addresses from the answer (RocketMQ's doRegisterBrokerAll)."""
        if self.broker is None:
            return
        cfg = self.cfg
        wrapper = self.broker.topics.encode()
        if self.namesrv is not None:
            route = self.namesrv.route
            route.register_broker(cfg.broker_cluster_name, self.broker.broker_addr, cfg.broker_name,
                                  cfg.broker_id, cfg.ha_server_addr, wrapper, None)
            self._on_registered(route.master_of(cfg.broker_name, cfg.broker_id))
            return
        if self._registering:
            self._register_again = True
            return
        if self.loop is not None:
            self._registering = True
            self._register_again = False
            t = asyncio.ensure_future(self._register_remote(wrapper))
            self._tasks.append(t)
            t.add_done_callback(lambda _t: self._tasks.remove(_t) if _t in self._tasks else None)

    async def _register_remote(self, wrapper: dict) -> None:
        import zlib
        from ..remoting import fastjson
        from ..remoting.codes import RequestCode
        from ..remoting.command import RemotingCommand
        cfg = self.cfg
        try:
            body = fastjson.dumps_bytes({"filterServerList": [], "topicConfigSerializeWrapper": wrapper})
            fields = {"brokerAddr": self.broker.broker_addr, "brokerId": str(cfg.broker_id),
                      "brokerName": cfg.broker_name, "clusterName": cfg.broker_cluster_name,
                      "haServerAddr": cfg.ha_server_addr, "compressed": "false",
                      "bodyCrc32": str(zlib.crc32(body) & 0x7FFFFFFF)}
            first = None
            for addr in [a.strip() for a in self.namesrv_addr.split(";") if a.strip()]:
                try:
                    cmd = RemotingCommand(RequestCode.REGISTER_BROKER, ext_fields=fields, body=body)
                    resp = await self.outer.request(addr, cmd, 3)
                except (OSError, asyncio.TimeoutError, ConnectionError, ValueError) as e:
                    log.warning("register to name server %s failed: %s", addr, e or type(e).__name__)
                    self.outer.forget(addr)
                    continue
                if resp.code != 0:
                    log.warning("register to name server %s: %s", addr, resp)
                elif first is None:
                    first = resp.ext_fields or {}
            if first is not None:
                self._on_registered(first)
            else:
                self._register_soon = True      # no name server took it: again in a second, not in 30
        finally:
            self._registering = False
            if self._register_again and self.broker is not None and self.loop is not None:
                self.loop.call_soon(self._register_broker)

    def _on_registered(self, answer: dict) -> None:
        """A slave's master, as the (first) name server answered: the HA link's address (unless haMasterAddress
        is configured) and SlaveSynchronize's master (None while no master is registered)."""
        # a slave started before its master learns of it at its next registration: in a second, not in 30
        self._register_soon = self.slave_sync is not None and not answer.get("masterAddr")
        if self.slave_sync is None:
            return
        ha = self.store.ha if self.store is not None else None
        if ha is not None and answer.get("haServerAddr"):
            ha.update_master_address(answer["haServerAddr"])
        if self.slave_sync.set_master_addr(answer.get("masterAddr") or None) and answer.get("masterAddr"):
            self._start_task(self.slave_sync.sync_all())

    def _start_task(self, coro) -> None:
        t = asyncio.ensure_future(coro)
        self._tasks.append(t)
        t.add_done_callback(lambda _t: self._tasks.remove(_t) if _t in self._tasks else None)

    async def _periodic(self) -> None:
        last_reg = last_scan = time.monotonic()
        while True:
            await asyncio.sleep(min(PERSIST_INTERVAL, 1.0))
            now = time.monotonic()
            b = self.broker
            try:
                b.stats.tick()
                if getattr(b.groups, "dirty", False):
                    await self.loop.run_in_executor(None, b.groups.persist)
                if now - last_scan >= SCAN_INTERVAL:
                    last_scan = now
                    b.clients.scan_not_active()
                    for s in self.servers:
                        s.sweep_idle()
                    if self.namesrv is not None:
                        self.namesrv.route.scan_not_active()
                if now - last_reg >= (REGISTER_RETRY if self._register_soon else REGISTER_INTERVAL):
                    last_reg = now
                    self._register_broker()
                if self.slave_sync is not None and self.slave_sync.due(now):
                    self._start_task(self.slave_sync.sync_all())
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("periodic broker task failed")

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks.clear()
        ha = getattr(self.store, "ha", None)
        if ha is not None:          # SYNC_MASTER sends waiting for a slave are answered before connections close
            ha.transfer.fail_all()
            await asyncio.sleep(0.05)
        if self.broker is not None:
            try:
                self.broker.release_all_held()
            except Exception:
                log.exception("releasing held pulls failed")
            self.broker.flush_all_puts()
        for s in self.servers:
            await s.stop()
        self.servers.clear()
        await self.outer.close()
        if self.store is not None and self.broker is not None:
            self.store.dispatcher.remove_listener(self.broker.on_message_arriving)
            self.broker.topics.remove_listener(self._on_topic_changed)
        if self.broker is not None:
            b = self.broker
            for name, fn in (("consumer offsets", b.offsets.persist), ("topics", b.topics.persist),
                             ("subscription groups", b.groups.persist)):
                try:
                    fn()
                except Exception as e:
                    log.error("persisting %s failed: %s", name, e)
        if self.store is not None and self._own_store:
            await self.loop.run_in_executor(None, self.store.close)
            self.store = None
        if self.acl is not None:
            self.acl.shutdown()
            self.acl = None
        self.started = False

    # --- addresses ------------------------------------------------------------------------------------
    @property
    def broker_addr(self) -> str:
        return self.broker.broker_addr if self.broker else f"{self.cfg.broker_ip1}:{self.cfg.listen_port}"

    @property
    def namesrv_listen_addr(self) -> str | None:
        for s in self.servers:
            if s.name == "namesrv":
                return f"{s.host}:{s.port}"
        return None
