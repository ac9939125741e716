"""Running `rmqstore serve` in a child process on free loopback ports (tests, benchmarks): ServerProcess."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (outgoing connections take theirs from it)."""
    try:
        return int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _pick_port(host: str, below: tuple[int, ...], tries: int = 200) -> int:
    """A port p with p - d free for each d in `below`, picked at random below the ephemeral range:
    a port handed out by bind(0) can be taken by any client's outgoing connection before the server
    binds it, one below that range cannot (another picker can still race: ServerProcess retries)."""
    import random
    import socket
    hi = min(_ephemeral_low(), 65536) - 1
    lo = 10000 if hi > 12000 else 1024
    rnd = random.Random()
    for _ in range(tries):
        p = rnd.randrange(lo, hi)
        ok = True
        for d in below:
            with socket.socket() as s:
                try:
                    s.bind((host, p - d))
                except OSError:
                    ok = False
                    break
        if ok:
            return p
    raise OSError(f"no free port found on {host} in {lo}..{hi}")


def free_port_pair(host: str = "127.0.0.1") -> int:
    """A port p with p, p-2 and p+1 free (the broker's listenPort, its VIP port and its HA port)."""
    return _pick_port(host, (0, 2, -1))


def free_port(host: str = "127.0.0.1") -> int:
    return _pick_port(host, (0,))


def sigstop(pid: int, *, group: bool = False, timeout: float = 10.0) -> None:
    """SIGSTOP a process (or its process group) and return once every thread of it is stopped. kill()
    returns when the signal is queued: one thread takes it and stops the others only when it next runs,
    and on a busy machine another thread (a slave's HA client) can go on reading and answering meanwhile.
    TimeoutError naming the pid when that takes longer than timeout; without /proc, returns at once."""
    import os
    import signal
    import time
    (os.killpg if group else os.kill)(pid, signal.SIGSTOP)
    if not os.path.isdir("/proc/self/task"):
        return
    deadline = time.monotonic() + timeout
    while not all(_threads_stopped(p) for p in (_group_members(pid) if group else (pid,))):
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {'group ' if group else ''}{pid} not stopped {timeout:.0f} s after SIGSTOP")
        time.sleep(0.002)


def proc_stat_fields(path: str) -> list[str] | None:
    """The fields of a /proc/PID/stat (or /proc/PID/task/TID/stat) file after the command name: the state
    first, the process group third, utime and stime at 11 and 12; None when it cannot be read (the process
    is gone, or there is no /proc)."""
    try:
        with open(path, "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return stat.rpartition(")")[2].split()


def _threads_stopped(pid: int) -> bool:
    import os
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True                     # gone
    for tid in tids:
        st = proc_stat_fields(f"/proc/{pid}/task/{tid}/stat")
        if st and st[0] not in "TtZX":
            return False
    return True


def _group_members(pgid: int) -> list[int]:
    import os
    return [int(p) for p in os.listdir("/proc") if p.isdigit()
            and (proc_stat_fields(f"/proc/{p}/stat") or ["", "", ""])[2] == str(pgid)]


class NamesrvProcess:
    """`rmqstore namesrv` in a child process on a free loopback port (what a master/slave pair registers
    with, so that routes outlive either broker). start() waits for its ready line."""

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.proc = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "NamesrvProcess":
        import subprocess
        self.proc = subprocess.Popen([sys.executable, "-m", "rmqstore", "namesrv", "--listen", self.addr],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        line = self.proc.stdout.readline()
        if not line:
            self.stop()
            raise RuntimeError(f"name server on {self.addr} did not start")
        return self

    def stop(self) -> None:
        p, self.proc = self.proc, None
        if p is not None:
            p.terminate()
            try:
                p.wait(10)
            except Exception:
                p.kill()
                p.wait(5)
            p.stdout.close()

    def __enter__(self) -> "NamesrvProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


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
        # Ports this object picked may be picked again on a first start that lost them to another process.
        self._own_ports = (listen_port is None, namesrv_port is None and namesrv,
                           "grpcListenPort" not in self.conf)
        self._started = False
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

    @property
    def grpc_addr(self) -> str | None:
        """The gRPC endpoint's address from the ready line (None without one)."""
        return (self.ready or {}).get("grpc")

    def start(self) -> "ServerProcess":
        """Start and wait for the ready line. A first start whose own picked port was taken between the
        pick and the bind (another process raced it) is retried on new ports, up to three times; a
        restart keeps its ports (clients hold those addresses)."""
        for attempt in range(3):
            try:
                self._start_once()
                self._started = True
                return self
            except RuntimeError as e:
                if self._started or attempt == 2 or "address already in use" not in str(e).lower() \
                        or not any(self._own_ports):
                    raise
                if self._own_ports[0]:
                    self.listen_port = free_port_pair()
                if self._own_ports[1]:
                    self.namesrv_port = free_port()
                # (the gRPC port, when it is ours, is picked anew by every start)
        raise AssertionError("unreachable")

    def _start_once(self) -> None:
        import subprocess
        import threading
        self.store.mkdir(parents=True, exist_ok=True)
        conf_path = self.store.parent / f"{self.store.name}.broker.conf"
        lines = [f"{k}={v}" for k, v in self.conf.items()]
        lines += [f"listenPort={self.listen_port}", f"namesrvAddr={self.namesrv_addr}"]
        if "grpcListenPort" not in self.conf:
            lines.append(f"grpcListenPort={free_port()}")     # never 8081: servers of parallel tests
        conf_path.write_text("\n".join(lines) + "\n")
        # The child's stderr beside its conf file (not in /tmp, where every run would leave one behind).
        self.stderr_path = self.store.parent / f"{self.store.name}.server.log"
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
