"""The client side of the remoting protocol, on plain sockets and threads (no event loop to share).

One Connection per broker / name server address. Writes: a synchronous invoke (or a oneway) writes at once
from the calling thread; asynchronous requests are queued and written in batches - one `sendall` of many
frames - by the connection's writer thread, or by the caller itself when WRITE_BATCH frames are queued.
Reads: one reader thread per connection receives into one buffer, splits every whole frame of it and
completes the pending requests (or hands server requests, e.g. NOTIFY_CONSUMER_IDS_CHANGED, to
`on_request`). Timeouts: a synchronous invoke waits on its future with a timeout; asynchronous invokes
are failed by `scan_timeouts()` (RocketMQ's scanResponseTable), which the client instance calls every few
hundred ms.

A pending request is any object with `_deadline` (time.monotonic()) and `_on_answer(response, error)`;
`_Pending` is the one for futures and callbacks, hot paths (the producer's send_async) bring their own.

An `rpc_hook(cmd)` (rmqstore.acl.RemotingSigner: plain ACL's AccessKey and Signature) runs on every request
before it is encoded; frames sent already encoded (send_async) are signed by whoever encodes them.
"""
from __future__ import annotations

import collections
import concurrent.futures
import logging
import socket
import threading
import time
from typing import Callable

from ..remoting.command import FrameDecoder, FrameError, RemotingCommand

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 3.0
WRITE_BATCH = 64              # queued frames the caller writes itself (else the writer thread does)
WRITE_BATCH_BYTES = 1 << 18   # bytes per sendall


class RemotingTimeoutError(TimeoutError):
    pass


class RemotingConnectError(ConnectionError):
    pass


class RemotingSendError(ConnectionError):
    pass


class _Pending:
    __slots__ = ("future", "_deadline", "callback")

    def __init__(self, future, deadline, callback):
        self.future = future
        self._deadline = deadline
        self.callback = callback

    def _on_answer(self, result, exc: BaseException | None = None) -> None:
        """Resolve: the future (synchronous invokes) and/or the callback(response, error)."""
        fut = self.future
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
        if self.callback is not None:
            try:
                self.callback(result, exc)
            except Exception:
                log.exception("response callback failed")


class Connection:
    def __init__(self, addr: str, on_request: Callable[["Connection", RemotingCommand], None] | None = None,
                 on_close: Callable[["Connection"], None] | None = None,
                 rpc_hook: Callable[[RemotingCommand], None] | None = None):
        self.addr = addr
        self.rpc_hook = rpc_hook
        host, _, port = addr.rpartition(":")
        try:
            self.sock = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT)
        except (OSError, ValueError) as e:
            raise RemotingConnectError(f"connect to {addr} failed: {e}") from None
        self.sock.settimeout(None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.on_request = on_request
        self.on_close = on_close
        self.pending: dict[int, object] = {}
        self.closed = False
        self._wlock = threading.Lock()          # held while writing to the socket
        self._queue: collections.deque = collections.deque()     # frames waiting for the writer
        self._wake = threading.Lock()           # released to wake the writer thread
        self._wake.acquire()
        self._wake_pending = False
        self._writer: threading.Thread | None = None
        self._reader = threading.Thread(target=self._read_loop, name=f"rmq-reader-{addr}", daemon=True)
        self._reader.start()

    # --- reading ------------------------------------------------------------------------------------
    def _read_loop(self) -> None:
        dec = FrameDecoder()
        feed = dec.feed
        recv_into = self.sock.recv_into
        pending = self.pending
        buf = bytearray(1 << 18)
        view = memoryview(buf)
        try:
            while not self.closed:
                n = recv_into(buf)
                if not n:
                    break
                for cmd in feed(view[:n]):
                    if cmd.flag & 1:
                        p = pending.pop(cmd.opaque, None)
                        if p is not None:
                            try:
                                p._on_answer(cmd, None)
                            except Exception:
                                log.exception("completing a request to %s failed", self.addr)
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

    # --- writing ------------------------------------------------------------------------------------
    def send(self, cmd: RemotingCommand, timeout: float | None, callback=None,
             want_future: bool = True) -> concurrent.futures.Future | None:
        """Write one request now. With a callback(response, error) and want_future=False no Future is made."""
        if self.closed:
            raise RemotingSendError(f"connection to {self.addr} is closed")
        fut = concurrent.futures.Future() if want_future else None
        if self.rpc_hook is not None and not cmd.flag & 1:
            self.rpc_hook(cmd)
        data = cmd.encode()
        oneway = cmd.flag & 3         # oneway requests and responses get no answer
        if not oneway:
            self.pending[cmd.opaque] = _Pending(fut, time.monotonic() + (timeout or 30.0), callback)
        self.write(data, cmd.opaque)
        if oneway and fut is not None:
            fut.set_result(None)
        return fut

    def send_async(self, data: bytes, opaque: int, pending) -> None:
        """Queue one request frame (data) whose answer completes `pending` (see the module doc); written
        with the frames queued around it."""
        if self.closed:
            raise RemotingSendError(f"connection to {self.addr} is closed")
        self.pending[opaque] = pending
        if self.closed:       # closed meanwhile: answer here unless close() did
            if self.pending.pop(opaque, None) is not None:
                raise RemotingSendError(f"connection to {self.addr} is closed")
            return
        q = self._queue
        q.append(data)
        if len(q) >= WRITE_BATCH and self._wlock.acquire(False):
            try:
                self._drain()
            except OSError as e:
                self._write_failed(e, opaque)
            finally:
                self._wlock.release()
        elif not self._wake_pending:
            self._wake_pending = True
            if self._writer is None:
                self._start_writer()
            try:
                self._wake.release()
            except RuntimeError:      # released already (two threads raced past _wake_pending)
                pass

    def write(self, data: bytes, opaque: int | None = None) -> None:
        """Write data now (after whatever is queued before it)."""
        try:
            with self._wlock:
                if self._queue:
                    self._queue.append(data)
                    self._drain()
                else:
                    self.sock.sendall(data)
        except OSError as e:
            self._write_failed(e, opaque)

    def flush(self) -> None:
        """Write the queued frames now."""
        if self._queue:
            try:
                with self._wlock:
                    self._drain()
            except OSError as e:
                self._write_failed(e, None)

    def _drain(self) -> None:
        """Write the queued frames, many to a sendall (the caller holds _wlock)."""
        q = self._queue
        popleft = q.popleft
        sendall = self.sock.sendall
        while q:
            if len(q) == 1:
                sendall(popleft())
                continue
            parts = []
            size = 0
            while q and size < WRITE_BATCH_BYTES:
                d = popleft()
                parts.append(d)
                size += len(d)
            sendall(b"".join(parts))

    def _write_failed(self, e: OSError, opaque: int | None) -> None:
        if opaque is not None:
            self.pending.pop(opaque, None)
        self.close()
        raise RemotingSendError(f"send to {self.addr} failed: {e}") from None

    def _start_writer(self) -> None:
        with self._wlock:
            if self._writer is None and not self.closed:
                self._writer = threading.Thread(target=self._write_loop, name=f"rmq-writer-{self.addr}", daemon=True)
                self._writer.start()

    def _write_loop(self) -> None:
        wake = self._wake.acquire
        try:
            while True:
                wake()
                if self.closed:
                    return
                self._wake_pending = False
                if self._queue:
                    with self._wlock:
                        self._drain()
        except OSError as e:
            if not self.closed:
                log.info("writing to %s failed: %s", self.addr, e)
            self.close()

    # --- timeouts and closing -------------------------------------------------------------------------
    def scan_timeouts(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for opaque, p in list(self.pending.items()):
            if p._deadline < now:
                if self.pending.pop(opaque, None) is not None:
                    try:
                        p._on_answer(None, RemotingTimeoutError(f"wait response from {self.addr} timed out"))
                    except Exception:
                        log.exception("completing a request to %s failed", self.addr)

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
        try:
            self._wake.release()      # the writer thread sees `closed` and ends
        except RuntimeError:
            pass
        err = RemotingSendError(f"connection to {self.addr} closed")
        for opaque, p in list(self.pending.items()):
            if self.pending.pop(opaque, None) is not None:
                try:
                    p._on_answer(None, err)
                except Exception:
                    log.exception("completing a request to %s failed", self.addr)
        if self.on_close is not None:
            try:
                self.on_close(self)
            except Exception:
                log.exception("close callback failed")


class RemotingClient:
    """Connections by address, created on first use (and again after a failure)."""

    def __init__(self, on_request: Callable[[Connection, RemotingCommand], None] | None = None,
                 rpc_hook: Callable[[RemotingCommand], None] | None = None):
        self.on_request = on_request
        self.rpc_hook = rpc_hook
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
                c = Connection(addr, self.on_request, self._on_conn_close, self.rpc_hook)
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

    def flush(self) -> None:
        """Write every connection's queued frames now."""
        for c in list(self._conns.values()):
            try:
                c.flush()
            except RemotingSendError:
                pass

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
