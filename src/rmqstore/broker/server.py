"""`rmqstore serve STORE [-c broker.conf]`: a RocketMQ 4.x name server and broker over one store, in one
asyncio process (also `python -m rmqstore.broker.server STORE ...`).

    from rmqstore.broker.server import serve
    serve("/data/store", StoreConfig.load("broker.conf"))       # blocks until SIGTERM / SIGINT

broker.conf keys used: brokerName, brokerClusterName, brokerIP1 (also the listening address, 127.0.0.1 by
default), listenPort (10911; the VIP port is listenPort-2), namesrvAddr (where the embedded name server
listens, 127.0.0.1:9876 by default), autoCreateTopicEnable, defaultTopicQueueNums, longPollingEnable,
shortPollingTimeMills, flushDiskType, serverChannelMaxIdleTimeSeconds, plus every store key. The keys
updateBrokerConfig changed (persisted in STORE/config/broker.properties) win over broker.conf's at start.

grpcListenPort (8081; -1 off): the RocketMQ 5 gRPC endpoint (rmqstore.proxy, needs the `grpc` extra).

aclEnable (false), rocketmqHome (else $ROCKETMQ_HOME), innerClientAuthenticationCredentials: plain ACL on
every port (rmqstore.acl; the rules in HOME/conf/plain_acl.yml).

On start it prints one JSON line to stdout, `{"event": "ready", "namesrv": ..., "broker": ..., "vip": ...,
"grpc": host:port or null}`.
SIGTERM / SIGINT stop it cleanly: connections closed, consumer offsets and topics persisted, store closed.

Wiring into rmqstore.tools.cli (one Command each):
    Command("serve", "run a RocketMQ name server and broker over the store", server.cli_run,
            server.cli_add_arguments, config_overrides=server.cli_config_overrides)
    `rmqstore bench --server`: server.cli_bench_server(args, cfg) (uses args.scale: small | full)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .process import ServerProcess, free_port, free_port_pair  # noqa: F401  (where tests and benchmarks find them)
from ..store.conf.config import StoreConfig

if TYPE_CHECKING:  # pragma: no cover
    from .app import BrokerServer

log = logging.getLogger("rmqstore.broker.server")


def _stop_on_signals(loop, stop: asyncio.Event) -> list:
    """SIGTERM and SIGINT set stop (where the loop can take signal handlers: the main thread); returns the
    signals handled, for remove_signal_handler at the end."""
    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
    return installed


async def run_server(store_path: str | Path, config: StoreConfig | None = None, *, namesrv: bool = True,
                     ready=None, stop_event: asyncio.Event | None = None) -> None:
    """Serve until stop_event is set (or SIGTERM / SIGINT when running in the main thread)."""
    from .app import BrokerServer

    server = BrokerServer(store_path, config or StoreConfig(), namesrv=namesrv)
    stop = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed = _stop_on_signals(loop, stop)
    server.grpc = None
    try:
        await server.start()
        server.grpc = await _start_grpc(server)
        if ready is not None:
            ready(server)
        await stop.wait()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        if server.grpc is not None:
            await server.grpc.shutdown()
        await server.stop()


async def _start_grpc(server: BrokerServer):
    """The RocketMQ 5 gRPC endpoint (rmqstore.proxy) on grpcListenPort (8081; -1: off) over the same store;
    without the `grpc` extra installed, or with the default port taken, a warning and none (a port set in
    broker.conf that cannot be bound stops the start)."""
    explicit = "grpcListenPort" in (server.cfg.extra or {})
    port = str((server.cfg.extra or {}).get("grpcListenPort", "8081")).strip()
    if port == "-1":
        return None
    try:
        from ..proxy.server import GrpcProxyServer
    except ImportError as e:
        log.warning("no gRPC endpoint (RocketMQ 5 clients): %s", e)
        return None
    proxy = GrpcProxyServer(server.store, server.broker.local, server.cfg, groups=server.broker.groups,
                            acl=server.acl)
    try:
        await proxy.start()
    except OSError as e:
        await proxy.shutdown()
        if explicit:
            raise
        log.warning("no gRPC endpoint (RocketMQ 5 clients): %s; set grpcListenPort in broker.conf", e)
        return None
    return proxy


async def run_namesrv(addr: str, *, ready=None, stop_event: asyncio.Event | None = None,
                      idle_timeout: float = 120.0) -> None:
    """A name server alone (RocketMQ's mqnamesrv): what a master/slave pair registers with, so that routes
    survive either broker. Serves until stop_event is set (or SIGTERM / SIGINT in the main thread)."""
    from .app import parse_addr
    from .namesrv import NameServer
    from .net import RemotingServer

    ns = NameServer()
    host, port = parse_addr(addr)
    server = RemotingServer(host, port, ns.handle, name="namesrv", idle_timeout=idle_timeout, on_close=ns.on_close)
    stop = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed = _stop_on_signals(loop, stop)

    async def scan() -> None:
        while True:
            await asyncio.sleep(10)
            ns.route.scan_not_active()
    await server.start()
    task = asyncio.ensure_future(scan())
    try:
        if ready is not None:
            ready(f"{server.host}:{server.port}")
        await stop.wait()
    finally:
        task.cancel()
        for sig in installed:
            loop.remove_signal_handler(sig)
        await server.stop()


def cli_namesrv_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", default=None, metavar="HOST:PORT",
                   help="where to listen (default: namesrvAddr of -c, else 127.0.0.1:9876)")


def cli_namesrv(args, cfg: StoreConfig) -> int:
    """`rmqstore namesrv`: print {"event": "ready", "namesrv": ...} and serve until SIGTERM / SIGINT."""
    def ready(addr: str) -> None:
        print(json.dumps({"event": "ready", "namesrv": addr}), flush=True)
    asyncio.run(run_namesrv(args.listen or cfg.namesrv_addr or "127.0.0.1:9876", ready=ready))
    return 0


def serve(store_path: str | Path, config: StoreConfig | None = None, *, namesrv: bool = True, ready=None) -> int:
    """Blocking: run the name server and the broker until SIGTERM / SIGINT. Returns an exit status."""
    asyncio.run(run_server(store_path, config, namesrv=namesrv, ready=ready))
    return 0


def ready_line(server: BrokerServer) -> str:
    vip = None
    if server.cfg.listen_port >= 2:
        vip = f"{server.cfg.broker_ip1}:{server.cfg.listen_port - 2}"
    grpc = getattr(server, "grpc", None)
    return json.dumps({"event": "ready", "namesrv": server.namesrv_listen_addr, "broker": server.broker_addr,
                       "vip": vip, "grpc": grpc.address if grpc is not None else None,
                       "store": str(server.store_path)})


def cli_add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `rmqstore serve` besides the CLI's common -c/--config and -v."""
    p.add_argument("store", help="store directory (created if missing)")
    p.add_argument("--listen-port", type=int, help="broker port (overrides listenPort); the VIP port is this - 2")
    p.add_argument("--namesrv-addr", help="where the embedded name server listens (overrides namesrvAddr); "
                                          "with --no-namesrv, the name server(s) to register with")
    p.add_argument("--no-namesrv", action="store_true", help="run no name server; register with namesrvAddr")


def cli_config_overrides(args) -> dict:
    """broker.conf keys set by the command line (for StoreConfig.load(path, overrides))."""
    overrides = {}
    if getattr(args, "listen_port", None) is not None:
        overrides["listenPort"] = args.listen_port
    if getattr(args, "namesrv_addr", None):
        overrides["namesrvAddr"] = args.namesrv_addr
    return overrides


def cli_run(args, cfg: StoreConfig) -> int:
    """`rmqstore serve`: print the ready line, serve until SIGTERM / SIGINT, exit 0."""
    def ready(server):
        print(ready_line(server), flush=True)
    return serve(args.store, cfg, namesrv=not args.no_namesrv, ready=ready)


def cli_bench_server(args, cfg: StoreConfig | None = None) -> int:
    """`rmqstore bench --server [--scale small|full]`: bench_server's numbers as JSON on stdout."""
    scale = getattr(args, "scale", "small") or "small"
    if scale not in ("small", "full"):
        scale = "small"
    print(json.dumps(bench_server(scale), indent=2), flush=True)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    cli_add_arguments(p)
    p.add_argument("-c", "--config", help="broker.conf-style properties file")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="rmqstore serve", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from ..errors import RmqStoreError
    try:
        return cli_run(args, StoreConfig.load(args.config, cli_config_overrides(args) or None))
    except (RmqStoreError, OSError) as e:
        print(f"rmqstore serve: {e}", file=sys.stderr)
        return 2


def bench_server(scale="small", **kw) -> dict:
    """Async send, sync send and push-consume throughput over loopback (see rmqstore.broker.bench)."""
    from .bench import bench_server as _bench
    return _bench(scale, **kw)


if __name__ == "__main__":
    sys.exit(main())
