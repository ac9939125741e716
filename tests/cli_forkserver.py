"""`python -m rmqstore ARGS` for the tests, without paying Python's start and rmqstore's imports each time.

    python tests/cli_forkserver.py SOCKET

The server imports the command line's modules once, then for each request on its Unix socket forks a
child that is what `python -m rmqstore ARGS` would be: its own process (its own pid, file locks, exit
status; a signal kills it alone), the request's working directory, environment, stdin, stdout and stderr
(file descriptors passed with the request), `rmqstore`'s __main__ run by runpy as `-m` runs it. The
server answers the child's pid, then its wait status. It exits when its parent (the pytest worker) does.

conftest.run_cli is the client (RMQSTORE_TEST_CLI=subprocess makes it start a real interpreter each time).
The ~0.5 s a real start costs (interpreter, numpy, rmqstore) was a tenth of the suite: 170 CLI calls.
"""
from __future__ import annotations

import atexit
import json
import os
import socket
import struct
import sys
import threading

PRELOAD = ("rmqstore.tools.cli", "rmqstore.store.check.check", "rmqstore.store.repair.rebuild", "rmqstore.tools.dump",
           "rmqstore.store.reads.store_reader", "rmqstore.store.store", "rmqstore.tools.progress")


def _child(req: dict, fds: list[int]) -> None:
    """In the forked child: become `python -m rmqstore ARGS`; never returns."""
    import runpy
    code = 1
    try:
        for i, fd in enumerate(fds[:3]):
            os.dup2(fd, i)
        for fd in fds:
            os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.path[0] = os.getcwd()          # what -m puts first
        sys.argv = [sys.executable, *req["argv"]]
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        try:
            runpy.run_module("rmqstore", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, int) and e.code is not None:
                print(e.code, file=sys.stderr)
        except BaseException:                  # noqa: BLE001 - what the interpreter does with it
            import traceback
            traceback.print_exc()
            code = 1
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except OSError:
                pass
    finally:
        os._exit(code & 0xFF)


def _serve(conn: socket.socket) -> None:
    with conn:
        head, fds, _, _ = socket.recv_fds(conn, 4, 3)
        (n,) = struct.unpack(">I", head)
        raw = b""
        while len(raw) < n:
            chunk = conn.recv(n - len(raw))
            if not chunk:
                return
            raw += chunk
        req = json.loads(raw)
        pid = os.fork()
        if pid == 0:
            _child(req, fds)
        for fd in fds:
            os.close(fd)
        conn.sendall(struct.pack(">i", pid))
        _, status = os.waitpid(pid, 0)
        conn.sendall(struct.pack(">i", status))


def main(path: str) -> None:
    import importlib
    for m in PRELOAD:
        importlib.import_module(m)
    parent = os.getppid()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(16)
    srv.settimeout(1.0)
    print("READY", flush=True)
    while os.getppid() == parent:
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            continue
        conn.settimeout(None)
        threading.Thread(target=_serve, args=(conn,), daemon=True).start()


# --- the client (conftest.run_cli) ------------------------------------------------------------------------
_server: dict = {}
_lock = threading.Lock()


def _start() -> str | None:
    """This process's server (started once); its socket path, or None when it cannot run here."""
    import subprocess
    import tempfile
    with _lock:
        if "path" in _server:
            return _server["path"]
        d = tempfile.mkdtemp(prefix="rmqstore-cli-")
        path = os.path.join(d, "sock")
        src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p))
        p = subprocess.Popen([sys.executable, __file__, path], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                             env=env)
        ok = p.stdout.readline().strip() == b"READY"
        _server["path"] = path if ok else None
        _server["proc"] = p
        atexit.register(_stop, p, d)
        return _server["path"]


def _stop(p, d: str) -> None:
    """At the pytest worker's exit: the server ended (it would anyway, its parent gone) and waited for."""
    import shutil
    p.terminate()
    try:
        p.wait(10)
    except Exception:
        p.kill()
        p.wait()
    p.stdout.close()
    shutil.rmtree(d, ignore_errors=True)


def run(argv: list[str], input: bytes | None, timeout: float):
    """subprocess.run([python, -m, rmqstore, *argv], input=input, capture_output=True, timeout=timeout), by a
    child of the fork server; None when there is no server (the caller then starts a real interpreter)."""
    import signal
    import subprocess
    import tempfile
    path = _start()
    if path is None:
        return None
    files = [tempfile.TemporaryFile() for _ in range(3)]
    try:
        if input:
            files[0].write(input)
            files[0].seek(0)
        req = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.connect(path)
            socket.send_fds(c, [struct.pack(">I", len(req))], [f.fileno() for f in files])
            c.sendall(req)
            c.settimeout(timeout)
            pid = struct.unpack(">i", _recv(c, 4))[0]
            try:
                status = struct.unpack(">i", _recv(c, 4))[0]
            except socket.timeout:
                os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired([sys.executable, "-m", "rmqstore", *argv], timeout) from None
        out, err = (_read(f) for f in files[1:])
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        return subprocess.CompletedProcess([sys.executable, "-m", "rmqstore", *argv], code, out, err)
    finally:
        for f in files:
            f.close()


def _recv(c: socket.socket, n: int) -> bytes:
    raw = b""
    while len(raw) < n:
        chunk = c.recv(n - len(raw))
        if not chunk:
            raise ConnectionError("the CLI fork server went away")
        raw += chunk
    return raw


def _read(f) -> bytes:
    f.seek(0)
    return f.read()


if __name__ == "__main__":
    main(sys.argv[1])
