"""The asyncio side of the remoting server: one Channel (an asyncio.Protocol) per TCP connection.

- Frames are split by FrameDecoder (16 MiB limit); a malformed or oversized frame closes the connection
  (as RocketMQ's NettyDecoder does) after logging it; nothing reaches the store.
- Each request goes to `handler(channel, cmd)`, which returns a response, None (oneway, or answered later),
  or an awaitable giving the response. An exception answers SYSTEM_ERROR with the exception as remark.
- Writes made during one event-loop iteration are coalesced into one transport write.
- Back-pressure: when the transport's write buffer is over its high-water mark the channel stops reading
  (a client that does not read its answers cannot make the server buffer without bound).
- Responses to requests the server sends (e.g. CHECK_TRANSACTION_STATE) resolve `invoke()` futures.
- Idle connections (no frame for `idle_timeout` seconds) are closed by the server's sweep.
- Unfinished frames (FrameLimits, shared by the listeners of one process): the bytes every connection holds
  of a frame not yet whole count against broker.conf `serverFrameMemoryMax` (256 MiB); a connection whose
  next bytes would take the total beyond it is closed, so 40 peers holding 15 MiB each cannot take the
  server to 600 MiB (at most one read, 256 KiB, over per connection). A connection that holds an unfinished
  frame and completes none for `serverFrameTimeoutSeconds` (30) is closed: a peer sending a byte now and
  then is not idle, but makes no progress.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from ..remoting.codes import ResponseCode
from ..remoting.command import MAX_FRAME_LENGTH, FrameDecoder, FrameError, RemotingCommand

log = logging.getLogger(__name__)

Handler = Callable[["Channel", RemotingCommand], "RemotingCommand | None | Awaitable[RemotingCommand | None]"]

WRITE_HIGH_WATER = 8 << 20
WRITE_LOW_WATER = 1 << 20


@dataclass
class FrameLimits:
    """What unfinished frames may hold across the connections of every listener given this object."""
    memory_max: int = 256 << 20        # serverFrameMemoryMax: bytes
    timeout: float = 30.0              # serverFrameTimeoutSeconds: without a frame completed while one is held
    held: int = 0                      # bytes held now
    holders: set = field(default_factory=set)       # the channels holding some of them

    @classmethod
    def of(cls, cfg) -> "FrameLimits":
        extra = getattr(cfg, "extra", None) or {}
        return cls(int(extra.get("serverFrameMemoryMax", cls.memory_max)),
                   float(extra.get("serverFrameTimeoutSeconds", cls.timeout)))


class Channel(asyncio.Protocol):
    def __init__(self, server: "RemotingServer"):
        self.server = server
        self.loop = server.loop
        self.handler = server.handler
        self.decoder = FrameDecoder(server.max_frame)
        self.transport: asyncio.Transport | None = None
        self.remote = "0.0.0.0:0"
        self.local_port = server.port
        self.closed = False
        self.last_active = time.monotonic()
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_scheduled = False
        self._paused = False
        self._backlog: list[RemotingCommand] = []      # requests read but not served while writing is paused
        self._pending: dict[int, asyncio.Future] = {}
        self.attrs: dict = {}          # per-connection state for the handler (client id, groups)
        self.tasks: set[asyncio.Task] = set()
        self._held = 0                 # bytes of an unfinished frame counted in server.limits
        self._progress = 0.0           # when a frame last completed (or the held one began)
        self._frame_timer: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if peer:
            self.remote = f"{peer[0]}:{peer[1]}"
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        self.server.channels.add(self)

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.server.channels.discard(self)
        self._release_held()
        if self._frame_timer is not None:
            self._frame_timer.cancel()
            self._frame_timer = None
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ConnectionError(f"connection to {self.remote} closed"))
        self._pending.clear()
        for t in list(self.tasks):
            t.cancel()
        self._out.clear()
        self._backlog.clear()
        try:
            self.server.on_close(self)
        except Exception:
            log.exception("close hook failed for %s", self.remote)

    def pause_writing(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            backlog, self._backlog = self._backlog, []
            self._serve(backlog)
            if not self._paused and not self.closed:
                self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        try:
            cmds = self.decoder.feed(data)
        except FrameError as e:
            log.warning("closing %s: %s", self.remote, e)
            self.close()
            return
        if (cmds or self._held or self.decoder.buffered) and not self._count_unfinished(bool(cmds)):
            return
        if self._paused or self._backlog:
            self._backlog.extend(cmds)
            return
        self._serve(cmds)

    # --- unfinished frames (FrameLimits) ---------------------------------------------------------------
    def _count_unfinished(self, completed: bool) -> bool:
        """Count what the decoder holds of an unfinished frame against the limits. Over serverFrameMemoryMax,
        the connections holding the most pay: the largest holders are closed until it fits, or this one when
        it holds the most (so peers parking big unfinished frames cannot shut out an honest request that
        arrives in several reads). False when this channel was closed."""
        limits = self.server.limits
        held = self.decoder.buffered
        grow = held - self._held
        while grow > 0 and limits.held + grow > limits.memory_max:
            victim = max(limits.holders - {self}, key=lambda c: c._held, default=None)
            if victim is None or victim._held <= held:
                log.warning("closing %s: its unfinished frame (%d bytes so far) would take the unfinished frames "
                            "of all connections to %d bytes, over serverFrameMemoryMax %d", self.remote, held,
                            limits.held + grow, limits.memory_max)
                self.close()
                return False
            log.warning("closing %s: it holds the largest unfinished frame (%d bytes) and the unfinished frames "
                        "of all connections would go over serverFrameMemoryMax %d", victim.remote, victim._held,
                        limits.memory_max)
            victim.close()
            victim._release_held()
        limits.held += grow
        if held:
            limits.holders.add(self)
        else:
            limits.holders.discard(self)
        if completed or not self._held:
            self._progress = time.monotonic()
        self._held = held
        if held and self._frame_timer is None and limits.timeout > 0:
            self._frame_timer = self.loop.call_later(limits.timeout, self._frame_deadline)
        return True

    def _release_held(self) -> None:
        """This channel's unfinished bytes no longer count (it is closed, or closing)."""
        limits = self.server.limits
        limits.held -= self._held
        limits.holders.discard(self)
        self._held = 0

    def _frame_deadline(self) -> None:
        self._frame_timer = None
        if self.closed or not self._held:
            return
        late = time.monotonic() - self._progress - self.server.limits.timeout
        if late < 0:        # a frame completed since: look again when the held one is due
            self._frame_timer = self.loop.call_later(-late, self._frame_deadline)
            return
        log.warning("closing %s: it holds an unfinished frame (%d bytes) and completed none for %.0f s "
                    "(serverFrameTimeoutSeconds)", self.remote, self._held, self.server.limits.timeout)
        self.close()

    def _serve(self, cmds: list[RemotingCommand]) -> None:
        handler = self.handler
        for i, cmd in enumerate(cmds):
            if self.closed:
                return
            if self._paused:      # the peer is not reading its answers: serve the rest when it does
                self._backlog[:0] = cmds[i:]
                return
            if cmd.flag & 1:      # a response to a request of ours
                fut = self._pending.pop(cmd.opaque, None)
                if fut is not None and not fut.done():
                    fut.set_result(cmd)
                continue
            try:
                r = handler(self, cmd)
            except Exception as e:
                log.exception("request %s from %s failed", cmd.code_name, self.remote)
                r = cmd.make_response(ResponseCode.SYSTEM_ERROR, _remark(e))
            if r is not None:
                self._answer(cmd, r)

    # --- requests -----------------------------------------------------------------------------
    def _dispatch(self, cmd: RemotingCommand) -> None:
        try:
            r = self.handler(self, cmd)
        except Exception as e:
            log.exception("request %s from %s failed", cmd.code_name, self.remote)
            r = cmd.make_response(ResponseCode.SYSTEM_ERROR, _remark(e))
        if r is not None:
            self._answer(cmd, r)

    def _answer(self, cmd: RemotingCommand, r) -> None:
        """What the handler gave for cmd: a response to send, or an awaitable giving one."""
        if isinstance(r, RemotingCommand):
            if not cmd.is_oneway:
                self.send(r)
            return
        if inspect.isawaitable(r):
            task = asyncio.ensure_future(self._await(cmd, r))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _await(self, cmd: RemotingCommand, aw) -> None:
        try:
            r = await aw
        except asyncio.CancelledError:
            return
        except Exception as e:
            log.exception("request %s from %s failed", cmd.code_name, self.remote)
            r = cmd.make_response(ResponseCode.SYSTEM_ERROR, _remark(e))
        if r is not None and not cmd.is_oneway:
            self.send(r)

    # --- writing ------------------------------------------------------------------------------
    def send(self, cmd: RemotingCommand) -> None:
        if self.closed:
            return
        try:
            data = cmd.encode()
        except Exception as e:   # e.g. a header over 16 MiB: answer the error instead
            log.error("cannot encode %s for %s: %s", cmd, self.remote, e)
            data = RemotingCommand(ResponseCode.SYSTEM_ERROR, opaque=cmd.opaque, flag=cmd.flag,
                                   remark=_remark(e), serialize_type=cmd.serialize_type).encode()
        self._out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= WRITE_LOW_WATER:
            self.flush()          # large answers go out at once (and may pause this channel)
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def send_frames(self, frames: list[bytes]) -> None:
        """Write encoded frames now, after what is queued."""
        if self.closed or self.transport is None:
            return
        if self._out:
            frames = self._out + frames
            self._out = []
            self._out_bytes = 0
        self.transport.write(b"".join(frames) if len(frames) > 1 else frames[0])

    def flush(self) -> None:
        """Write what is queued now (the scheduled flush then finds nothing)."""
        if self._out:
            out, self._out = self._out, []
            self._out_bytes = 0
            if not self.closed and self.transport is not None:
                self.transport.write(b"".join(out) if len(out) > 1 else out[0])

    def _flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, []
        self._out_bytes = 0
        if out and not self.closed and self.transport is not None:
            self.transport.write(b"".join(out) if len(out) > 1 else out[0])

    def oneway(self, cmd: RemotingCommand) -> None:
        cmd.flag |= 2
        self.send(cmd)

    async def invoke(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send a request to the peer and wait for its answer."""
        if self.closed:
            raise ConnectionError(f"connection to {self.remote} closed")
        fut = self.loop.create_future()
        self._pending[cmd.opaque] = fut
        self.send(cmd)
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._pending.pop(cmd.opaque, None)

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.abort()

    def __repr__(self) -> str:
        return f"Channel({self.remote} -> :{self.local_port})"


def _remark(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


class RemotingServer:
    """One listening socket; `handler` serves every request of every connection."""

    def __init__(self, host: str, port: int, handler: Handler, *, name: str = "server",
                 max_frame: int = MAX_FRAME_LENGTH, idle_timeout: float = 120.0,
                 on_close: Callable[[Channel], None] | None = None, limits: FrameLimits | None = None):
        """limits: shared by every listener of a process (serverFrameMemoryMax is one budget); a listener
        given none has its own, at the defaults."""
        self.limits = limits if limits is not None else FrameLimits()
        self.host = host
        self.port = port
        self.handler = handler
        self.name = name
        self.max_frame = max_frame
        self.idle_timeout = idle_timeout
        self.on_close = on_close or (lambda ch: None)
        self.channels: set[Channel] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(lambda: Channel(self), self.host, self.port,
                                                     reuse_address=True, backlog=1024)
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        log.info("%s listening on %s:%d", self.name, self.host, self.port)

    def sweep_idle(self) -> None:
        if self.idle_timeout <= 0:
            return
        now = time.monotonic()
        for ch in list(self.channels):
            if now - ch.last_active > self.idle_timeout:
                log.info("%s: closing idle connection %s", self.name, ch.remote)
                ch.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for ch in list(self.channels):
                ch.close()
            try:
                await asyncio.wait_for(self._server.wait_closed(), 2)
            except (asyncio.TimeoutError, Exception):
                pass
            self._server = None
