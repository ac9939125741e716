"""`rmqstore serve STORE [-c broker.conf]`: a RocketMQ 4.x name server and broker over one store, in one
asyncio process (also `python -m rmqstore.server STORE ...`).

    from rmqstore.server import serve
    serve("/data/store", StoreConfig.load("broker.conf"))       # blocks until SIGTERM / SIGINT

broker.conf keys used: brokerName, brokerClusterName, brokerIP1 (also the listening address, 127.0.0.1 by
default), listenPort (10911; the VIP port is listenPort-2), namesrvAddr (where the embedded name server
listens, 127.0.0.1:9876 by default), autoCreateTopicEnable, defaultTopicQueueNums, longPollingEnable,
shortPollingTimeMills, flushDiskType, serverChannelMaxIdleTimeSeconds, plus every store key.

On start it prints one JSON line to stdout, `{"event": "ready", "namesrv": ..., "broker": ..., "vip": ...}`.
SIGTERM / SIGINT stop it cleanly: connections closed, consumer offsets and topics persisted, store closed.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from pathlib import Path

from .broker.app import BrokerServer
from .config import StoreConfig

log = logging.getLogger("rmqstore.server")


async def run_server(store_path: str | Path, config: StoreConfig | None = None, *, namesrv: bool = True,
                     ready=None, stop_event: asyncio.Event | None = None) -> None:
    """Serve until stop_event is set (or SIGTERM / SIGINT when running in the main thread)."""
    server = BrokerServer(store_path, config or StoreConfig(), namesrv=namesrv)
    stop = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
    try:
        await server.start()
        if ready is not None:
            ready(server)
        await stop.wait()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        await server.stop()


def serve(store_path: str | Path, config: StoreConfig | None = None, *, namesrv: bool = True, ready=None) -> int:
    """Blocking: run the name server and the broker until SIGTERM / SIGINT. Returns an exit status."""
    asyncio.run(run_server(store_path, config, namesrv=namesrv, ready=ready))
    return 0


def ready_line(server: BrokerServer) -> str:
    vip = None
    if server.cfg.listen_port >= 2:
        vip = f"{server.cfg.broker_ip1}:{server.cfg.listen_port - 2}"
    return json.dumps({"event": "ready", "namesrv": server.namesrv_listen_addr, "broker": server.broker_addr,
                       "vip": vip, "store": str(server.store_path)})


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", help="store directory (created if missing)")
    p.add_argument("-c", "--config", help="broker.conf-style properties file")
    p.add_argument("--listen-port", type=int, help="broker port (overrides listenPort); the VIP port is this - 2")
    p.add_argument("--namesrv-addr", help="where the embedded name server listens (overrides namesrvAddr)")
    p.add_argument("--no-namesrv", action="store_true", help="do not run the embedded name server")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")


def config_from_args(args) -> StoreConfig:
    overrides = {}
    if args.listen_port is not None:
        overrides["listenPort"] = args.listen_port
    if args.namesrv_addr:
        overrides["namesrvAddr"] = args.namesrv_addr
    return StoreConfig.load(args.config, overrides or None)


def cmd_serve(args) -> int:
    """The body of `rmqstore serve` (args from add_arguments)."""
    cfg = config_from_args(args)

    def ready(server):
        print(ready_line(server), flush=True)
    return serve(args.store, cfg, namesrv=not args.no_namesrv, ready=ready)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="rmqstore serve", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .errors import RmqStoreError
    try:
        return cmd_serve(args)
    except (RmqStoreError, OSError) as e:
        print(f"rmqstore serve: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
