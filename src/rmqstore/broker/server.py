"""`rmqstore serve STORE [-c broker.conf]`: a RocketMQ 4.x name server and broker over one store, in one
asyncio process (also `python -m rmqstore.broker.server STORE ...`).

    from rmqstore.broker.server import serve
    serve("/data/store", StoreConfig.load("broker.conf"))       # blocks until SIGTERM / SIGINT

broker.conf keys used: brokerName, brokerClusterName, brokerIP1 (also the listening address, 127.0.0.1 by
default), listenPort (10911; the VIP port is listenPort-2), namesrvAddr (where the embedded name server
listens, 127.0.0.1:9876 by default), autoCreateTopicEnable, defaultTopicQueueNums, longPollingEnable,
shortPollingTimeMills, flushDiskType, serverChannelMaxIdleTimeSeconds, plus every store key.

On start it prints one JSON line to stdout, `{"event": "ready", "namesrv": ..., "broker": ..., "vip": ...}`.
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

from .app import BrokerServer
from ..store.config import StoreConfig

log = logging.getLogger("rmqstore.broker.server")


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


# --- running a server in a child process (tests, benchmarks) --------------------------------------------
def free_port_pair(host: str = "127.0.0.1", tries: int = 200) -> int:
    """A port p with p and p-2 both free (the broker's listenPort and its VIP port)."""
    import random
    import socket
    rnd = random.Random()
    for _ in range(tries):
        p = rnd.randrange(20000, 60000)
        ok = True
        for q in (p, p - 2):
            with socket.socket() as s:
                try:
                    s.bind((host, q))
                except OSError:
                    ok = False
                    break
        if ok:
            return p
    raise OSError("no free port pair found")


def free_port(host: str = "127.0.0.1") -> int:
    import socket
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerProcess:
    """`python -m rmqstore.broker.server STORE` in a child process on free loopback ports.

        with ServerProcess(store_dir, {"autoCreateTopicEnable": "true"}) as srv:
            Producer("g", srv.namesrv_addr) ...

    start() waits (bounded) for the ready line; stop() sends SIGTERM and waits, then kills."""

    def __init__(self, store: str | Path, conf: dict | None = None, *, listen_port: int | None = None,
                 namesrv_port: int | None = None, start_timeout: float = 30.0, log_level: str | None = None,
                 namesrv: bool = True):
        """namesrv=False: no embedded name server; the broker registers with the one at namesrv_port."""
        self.store = Path(store)
        self.conf = dict(conf or {})
        self.listen_port = listen_port or free_port_pair()
        self.namesrv_port = namesrv_port or free_port()
        self.embedded_namesrv = namesrv
        self.start_timeout = start_timeout
        self.log_level = log_level
        self.proc = None
        self.ready: dict | None = None
        self.stderr_path = None

    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    @property
    def broker_addr(self) -> str:
        return f"127.0.0.1:{self.listen_port}"

    @property
    def vip_addr(self) -> str:
        return f"127.0.0.1:{self.listen_port - 2}"

    def start(self) -> "ServerProcess":
        import os
        import subprocess
        import tempfile
        import threading
        self.store.mkdir(parents=True, exist_ok=True)
        conf_path = self.store.parent / f"{self.store.name}.broker.conf"
        lines = [f"{k}={v}" for k, v in self.conf.items()]
        lines += [f"listenPort={self.listen_port}", f"namesrvAddr={self.namesrv_addr}"]
        conf_path.write_text("\n".join(lines) + "\n")
        fd, self.stderr_path = tempfile.mkstemp(prefix="rmqstore-server-", suffix=".log")
        os.close(fd)
        args = [sys.executable, "-m", "rmqstore.broker.server", str(self.store), "-c", str(conf_path)]
        if self.log_level == "INFO":
            args.append("-v")
        if not self.embedded_namesrv:
            args.append("--no-namesrv")
        self._err = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._err)
        line: list[bytes] = []
        t = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(self.start_timeout)
        if not line or not line[0]:
            self.stop()
            raise RuntimeError(f"server did not start: {self.log_tail()}")
        self.ready = json.loads(line[0])
        return self

    def log_tail(self, n: int = 4000) -> str:
        try:
            return Path(self.stderr_path).read_text(errors="replace")[-n:]
        except (OSError, TypeError):
            return ""

    def stop(self, timeout: float = 20.0) -> int | None:
        import subprocess
        p = self.proc
        if p is None:
            return None
        self.proc = None
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        try:
            p.stdout.close()
        except OSError:
            pass
        self._err.close()
        return p.returncode

    def kill(self) -> None:
        p = self.proc
        if p is not None and p.poll() is None:
            p.kill()
            p.wait(5)
        self.stop()

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def bench_server(scale="small", **kw) -> dict:
    """Async send, sync send and push-consume throughput over loopback (see rmqstore.broker.bench)."""
    from .bench import bench_server as _bench
    return _bench(scale, **kw)


if __name__ == "__main__":
    sys.exit(main())
