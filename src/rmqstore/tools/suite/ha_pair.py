"""Master/slave pairs of any mix of rmqstore and RocketMQ 4.4.0 brokers, driven by RocketMQ's own Java client
(HaTool, from ../shared/realmq): what the `ha` bench step and the live interop check run.

    with Pair(work, master="java", slave="rmq", role="SYNC_MASTER") as pair:
        pair.hatool("send", pair.ns, "HaT", 2000, 256, 600)      # -> "SEND n=2000 ... statuses={SEND_OK=2000} ..."

The Java side needs RocketMQ 4.4.0 built by ../shared/realmq/build.sh ($RMQSTORE_REALMQ, default
~/.cache/rmqstore-realmq); `realmq()` says whether it is there. A pair is one name server (RocketMQ's), a
master and a slave of one brokerName on loopback; rmqstore brokers are `rmqstore serve --no-namesrv`.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ...broker.process import sigstop

HA_TIMEOUT = 900


def realmq() -> Path | None:
    """RocketMQ 4.4.0's run.sh (built by ../shared/realmq), or None."""
    d = Path(os.environ.get("RMQSTORE_REALMQ", "~/.cache/rmqstore-realmq")).expanduser()
    return d if (d / "run.sh").is_file() and (d / "classes" / "hatool").is_dir() else None


def port_free(port: int) -> bool:
    import socket
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)    # as the servers do: TIME_WAIT is no obstacle
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


class Proc:
    """A child process with its output in a log file; stopped with SIGTERM, then SIGKILL."""

    def __init__(self, args: list[str], log: Path, env: dict | None = None):
        self.log = log
        self._f = open(log, "wb")
        self.p = subprocess.Popen(args, stdout=self._f, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def wait_for(self, pattern: str, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if re.search(pattern, self.log.read_text(errors="replace")):
                return
            if self.p.poll() is not None:
                break
            time.sleep(0.3)
        raise RuntimeError(f"{self.log.name}: no {pattern!r} within {timeout:.0f} s: "
                           f"{self.log.read_text(errors='replace')[-1500:]}")

    def signal(self, sig: int) -> None:
        """sig to the process group; SIGSTOP returns once every thread of it is stopped."""
        if self.p.poll() is None:
            try:
                if sig == signal.SIGSTOP:
                    sigstop(self.p.pid, group=True)
                else:
                    os.killpg(self.p.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, kill: bool = False) -> None:
        if self.p.poll() is None:
            self.signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.p.wait(10)
        self._f.close()


class Pair:
    """Name server NS_PORT, master on MASTER_PORT (HA port +1), slave on SLAVE_PORT (module docstring)."""
    NS_PORT, MASTER_PORT, SLAVE_PORT = 19876, 20911, 21911

    def __init__(self, work: Path, master: str = "rmq", slave: str = "rmq", role: str = "SYNC_MASTER",
                 file_size: int = 1 << 30, flush: str = "ASYNC_FLUSH", extra: dict | None = None,
                 start_slave: bool = True):
        self.rm = realmq()
        if self.rm is None:
            raise RuntimeError("RocketMQ 4.4.0 is not built: ../shared/realmq/README.md")
        self.work = Path(work)
        self.kinds = {"master": master, "slave": slave}
        self.role, self.file_size, self.flush = role, file_size, flush
        self.extra = dict(extra or {})
        self.start_slave = start_slave
        self.procs: dict[str, Proc] = {}
        self.ns = f"127.0.0.1:{self.NS_PORT}"

    # --- processes ------------------------------------------------------------------------------------
    def addr(self, which: str) -> str:
        return f"127.0.0.1:{self.MASTER_PORT if which == 'master' else self.SLAVE_PORT}"

    def store(self, which: str) -> Path:
        return self.work / which

    def _conf(self, which: str) -> dict:
        slave = which == "slave"
        c = {"brokerClusterName": "HaCluster", "brokerName": "broker-ha", "brokerId": "1" if slave else "0",
             "brokerRole": "SLAVE" if slave else self.role, "flushDiskType": self.flush,
             "namesrvAddr": self.ns, "brokerIP1": "127.0.0.1", "brokerIP2": "127.0.0.1",
             "listenPort": str(self.SLAVE_PORT if slave else self.MASTER_PORT), "autoCreateTopicEnable": "true",
             "mapedFileSizeCommitLog": str(self.file_size)}
        c.update(self.extra)
        return c

    def start(self, which: str) -> None:
        kind, conf = self.kinds[which], self._conf(which)
        store = self.store(which)
        store.mkdir(parents=True, exist_ok=True)
        path = self.work / f"{which}.conf"
        log = self.work / f"{which}.log"
        if kind == "java":
            conf.update({"storePathRootDir": str(store), "storePathCommitLog": str(store / "commitlog")})
            path.write_text("".join(f"{k}={v}\n" for k, v in conf.items()))
            env = dict(os.environ, RMQ_LOGDIR=str(self.work / f"logs-{which}"), JAVA_HEAP="1g")
            p = Proc([str(self.rm / "run.sh"), "broker", str(path)], log, env)
            self.procs[which] = p
            p.wait_for("boot success")
        else:
            conf["grpcListenPort"] = "-1"
            path.write_text("".join(f"{k}={v}\n" for k, v in conf.items()))
            p = Proc([sys.executable, "-m", "rmqstore", "serve", "--no-namesrv", "-c", str(path), str(store)],
                     log)
            self.procs[which] = p
            p.wait_for('"event": "ready"')

    def __enter__(self) -> "Pair":
        for port in (self.NS_PORT, self.MASTER_PORT, self.MASTER_PORT + 1, self.MASTER_PORT - 2,
                     self.SLAVE_PORT, self.SLAVE_PORT + 1, self.SLAVE_PORT - 2):
            if not port_free(port):
                raise RuntimeError(f"port {port} is busy")
        self.work.mkdir(parents=True, exist_ok=True)
        (self.work / "ns.conf").write_text(f"listenPort={self.NS_PORT}\n")
        env = dict(os.environ, RMQ_LOGDIR=str(self.work / "logs-ns"), JAVA_HEAP="256m")
        self.procs["ns"] = Proc([str(self.rm / "run.sh"), "namesrv", "-c", str(self.work / "ns.conf")],
                                self.work / "ns.log", env)
        self.procs["ns"].wait_for("boot success|The Name Server boot")
        self.start("master")
        if self.start_slave:
            self.start("slave")
            self.wait_link()
        return self

    def wait_link(self, timeout: float = 60.0) -> None:
        """The slave's HA connection is up and reported (a RocketMQ slave reports 5 s after connecting)."""
        deadline = time.monotonic() + timeout
        port = self.MASTER_PORT + 1
        while time.monotonic() < deadline:
            out = subprocess.run(["ss", "-tnH", "state", "established", f"( dport = :{port} )"],
                                 capture_output=True, text=True).stdout
            if out.strip():
                time.sleep(7)
                return
            time.sleep(0.5)
        raise RuntimeError("the slave did not connect to the master's HA port")

    def __exit__(self, *exc) -> None:
        for name in ("slave", "master", "ns"):
            p = self.procs.pop(name, None)
            if p is not None:
                p.signal(signal.SIGCONT)
                p.stop()

    # --- RocketMQ's Java client ------------------------------------------------------------------------
    def hatool(self, *args, timeout: float = HA_TIMEOUT) -> str:
        env = dict(os.environ, RMQ_LOGDIR=str(self.work / "logs-tool"), JAVA_EXTRA="-Xmx512m")
        r = subprocess.run(["timeout", "-k", "5", str(int(timeout)), str(self.rm / "run.sh"), "java",
                            "hatool.HaTool", *map(str, args)], capture_output=True, text=True, env=env)
        lines = [x for x in r.stdout.splitlines() if re.match(r"^[A-Z]+ ", x)]
        return lines[-1] if lines else f"NO RESULT rc={r.returncode} {r.stderr[-300:]}"

    def max_offset(self, which: str) -> int | None:
        """The broker's commitLogMaxOffset (GET_BROKER_RUNTIME_INFO; asked up to 3 times), or None."""
        for _ in range(3):
            m = re.search(r"commitLogMaxOffset=(\d+)", self.hatool("runtime", self.addr(which), timeout=60))
            if m:
                return int(m[1])
        return None

    def wait_caught_up(self, timeout: float = 120.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            a, b = self.max_offset("master"), self.max_offset("slave")
            if a is not None and a == b:
                return True
            time.sleep(1)
        return False


def parse_rate(line: str) -> float | None:
    m = re.search(r"rate=(\d+) msg/s", line)
    return float(m[1]) if m else None


def commitlogs_equal(a: Path, b: Path, end: int, file_size: int) -> str:
    """'equal over N bytes in K files' or where they differ (the master's range [0, end))."""
    files = sorted(p.name for p in (a / "commitlog").iterdir() if p.name.isdigit())
    n = 0
    for name in files:
        start = int(name)
        if start >= end:
            break
        length = min(file_size, end - start)
        x = (a / "commitlog" / name).read_bytes()[:length]
        other = b / "commitlog" / name
        if not other.exists():
            return f"{name} missing on the slave"
        y = other.read_bytes()[:length]
        if x != y:
            i = next(i for i in range(length) if x[i] != y[i])
            return f"{name} differs at byte {i}"
        n += 1
    return f"equal over {end} bytes in {n} files"


def clean(work: Path) -> None:
    shutil.rmtree(work, ignore_errors=True)
