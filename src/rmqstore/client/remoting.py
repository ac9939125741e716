"""The client side of the remoting protocol, on plain sockets and threads (no event loop to share).

One Connection per broker / name server address: writes are made by the calling thread under a lock
(one `sendall` per frame), one reader thread per connection splits frames and completes the pending
requests' futures (or hands server requests, e.g. NOTIFY_CONSUMER_IDS_CHANGED, to `on_request`).
Timeouts: a synchronous invoke waits on its future with a timeout; asynchronous invokes are failed by
`scan_timeouts()` (RocketMQ's scanResponseTable), which the client instance calls every few hundred ms.
"""
from __future__ import annotations

import concurrent.futures
import logging
import socket
import threading
import time
from typing import Callable

from ..remoting.command import FrameDecoder, FrameError, RemotingCommand

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 3.0


class RemotingTimeoutError(TimeoutError):
    pass


class RemotingConnectError(ConnectionError):
    pass


class RemotingSendError(ConnectionError):
    pass


class _Pending:
    __slots__ = ("future", "deadline", "callback")

    def __init__(self, future, deadline, callback):
        self.future = future
        self.deadline = deadline
        self.callback = callback


class Connection:
    def __init__(self, addr: str, on_request: Callable[["Connection", RemotingCommand], None] | None = None,
                 on_close: Callable[["Connection"], None] | None = None):
        self.addr = addr
        host, _, port = addr.rpartition(":")
        try:
            self.sock = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT)
        except (OSError, ValueError) as e:
            raise RemotingConnectError(f"connect to {addr} failed: {e}") from None
        self.sock.settimeout(None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.on_request = on_request
        self.on_close = on_close
        self.pending: dict[int, _Pending] = {}
        self.closed = False
        self._wlock = threading.Lock()
        self._reader = threading.Thread(target=self._read_loop, name=f"rmq-reader-{addr}", daemon=True)
        self._reader.start()

    def _read_loop(self) -> None:
        dec = FrameDecoder()
        sock = self.sock
        buf = bytearray(1 << 18)
        view = memoryview(buf)
        try:
            while not self.closed:
                n = sock.recv_into(buf)
                if not n:
                    break
                for cmd in dec.feed(view[:n]):
                    if cmd.is_response:
                        p = self.pending.pop(cmd.opaque, None)
                        if p is not None:
                            self._complete(p, cmd)
                    elif self.on_request is not None:
                        try:
                            self.on_request(self, cmd)
                        except Exception:
                            log.exception("handling %s from %s failed", cmd.code_name, self.addr)
        except FrameError as e:
            log.warning("bad frame from %s: %s", self.addr, e)
        except OSError as e:
            if not self.closed:
                log.info("connection to %s lost: %s", self.addr, e)
        finally:
            self.close()

    @staticmethod
    def _complete(p: _Pending, result, exc: BaseException | None = None) -> None:
        """Resolve a pending request: its future (synchronous invokes) or its callback(response, error)."""
        fut = p.future
        if fut is not None:
            if fut.done():
                return
            try:
                if exc is not None:
                    fut.set_exception(exc)
                else:
                    fut.set_result(result)
            except concurrent.futures.InvalidStateError:
                return
        if p.callback is not None:
            try:
                p.callback(result, exc)
            except Exception:
                log.exception("response callback failed")

    def send(self, cmd: RemotingCommand, timeout: float | None, callback=None,
             want_future: bool = True) -> concurrent.futures.Future | None:
        """Write one request. With a callback(response, error) and want_future=False no Future is made."""
        if self.closed:
            raise RemotingSendError(f"connection to {self.addr} is closed")
        fut = concurrent.futures.Future() if want_future else None
        data = cmd.encode()
        oneway = cmd.flag & 3         # oneway requests and responses get no answer
        if not oneway:
            self.pending[cmd.opaque] = _Pending(fut, time.monotonic() + (timeout or 30.0), callback)
        try:
            with self._wlock:
                self.sock.sendall(data)
        except OSError as e:
            self.pending.pop(cmd.opaque, None)
            self.close()
            raise RemotingSendError(f"send to {self.addr} failed: {e}") from None
        if oneway and fut is not None:
            fut.set_result(None)
        return fut

    def scan_timeouts(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for opaque, p in list(self.pending.items()):
            if p.deadline < now:
                if self.pending.pop(opaque, None) is not None:
                    self._complete(p, None, RemotingTimeoutError(f"wait response from {self.addr} timed out"))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass
        err = RemotingSendError(f"connection to {self.addr} closed")
        for opaque, p in list(self.pending.items()):
            self.pending.pop(opaque, None)
            self._complete(p, None, err)
        if self.on_close is not None:
            try:
                self.on_close(self)
            except Exception:
                log.exception("close callback failed")


class RemotingClient:
    """Connections by address, created on first use (and again after a failure)."""

    def __init__(self, on_request: Callable[[Connection, RemotingCommand], None] | None = None):
        self.on_request = on_request
        self._conns: dict[str, Connection] = {}
        self._lock = threading.Lock()
        self.closed = False

    def connection(self, addr: str) -> Connection:
        c = self._conns.get(addr)
        if c is not None and not c.closed:
            return c
        with self._lock:
            if self.closed:
                raise RemotingConnectError("client is shut down")
            c = self._conns.get(addr)
            if c is None or c.closed:
                c = Connection(addr, self.on_request, self._on_conn_close)
                self._conns[addr] = c
            return c

    def _on_conn_close(self, c: Connection) -> None:
        with self._lock:
            if self._conns.get(c.addr) is c:
                del self._conns[c.addr]

    def invoke(self, addr: str, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        fut = self.connection(addr).send(cmd, timeout)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            raise RemotingTimeoutError(f"wait response from {addr} timed out after {timeout} s "
                                       f"({cmd.code_name})") from None

    def invoke_async(self, addr: str, cmd: RemotingCommand, timeout: float,
                     callback: Callable[[RemotingCommand | None, BaseException | None], None]) -> None:
        """Send; callback(response, None) or callback(None, error) runs in the connection's reader thread
        (or the timeout scanner)."""
        self.connection(addr).send(cmd, timeout, callback, want_future=False)

    def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        cmd.flag |= 2
        self.connection(addr).send(cmd, None, want_future=False)

    def scan_timeouts(self) -> None:
        now = time.monotonic()
        for c in list(self._conns.values()):
            c.scan_timeouts(now)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            conns = list(self._conns.values())
            self._conns.clear()
        for c in conns:
            c.close()
