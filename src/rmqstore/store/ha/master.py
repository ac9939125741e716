"""The master's side: one HAConnection per slave, streaming commitlog bytes from the slave's offset.

What it does beyond RocketMQ's HAConnection (the package docstring has the format):
- a connection counts as a slave from its first valid report on, not from accept: a peer that connects and
  says nothing cannot make a SYNC_MASTER wait instead of answering SLAVE_NOT_AVAILABLE;
- an acknowledgement counts only up to what this connection sent (min(report, end of what was sent)): a
  peer reporting an offset it was never sent acknowledges nothing (an rmqstore slave asks again for the
  last bytes it holds, which both checks its log against this one and acknowledges them);
- a slave whose first report lies past this master's end is ahead of (diverged from) it, one below this
  master's oldest file cannot be served: either gets nothing on that connection and does not count as a
  slave; it is reported on the failure channel and in the HA status, and told in heartbeats (this master's
  end, or its oldest offset) so that an rmqstore slave stops and says why;
- a slave that reads nothing for haHousekeepingInterval is closed (its unsent bytes are not kept);
- an empty slave (report 0) gets the whole log from the master's first file (RocketMQ sends only the last
  file, and its slave then never dispatches);
- frames are at most haTransferBatchSize bytes (a RocketMQ slave reads them into a 4 MiB buffer), written
  many at a time.
"""
from __future__ import annotations

import asyncio
import logging
import struct
import time
from typing import Callable

from ..format import codec
from ..commitlog.commit_log import CommitLog
from ..state.failure import FailureChannel, FailureKind
from . import protocol
from .transfer import GroupTransfer

log = logging.getLogger(__name__)

WRITE_CHUNK = 256 << 10         # commitlog bytes read and written per round (many frames)
MAX_CONNECTIONS = 64            # HA connections at once (a master has a few slaves; more are refused)
READ_CHUNK = 64 << 10
_II = struct.Struct(">iI")
_PHYS = struct.Struct(">q")


def is_boundary(cl: CommitLog, offset: int) -> bool:
    """Whether a record (or a blank, or nothing yet) starts at offset in this log."""
    if offset >= cl.get_max_offset() or offset % cl.file_size == 0:
        return True
    mf = cl.file_of(offset)
    head = mf.read(offset - mf.file_from_offset, 36) if mf is not None else None
    if head is None:
        head = mf.read(offset - mf.file_from_offset, 8) if mf is not None else None
        return head is not None and _II.unpack(head)[1] == codec.BLANK_MAGIC_CODE
    total, magic = _II.unpack_from(head, 0)
    if magic == codec.BLANK_MAGIC_CODE:
        return True
    return magic in (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2) and \
        _PHYS.unpack_from(head, 28)[0] == offset


class HAConnection:
    """One slave's connection (module docstring)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cl: CommitLog,
                 transfer: GroupTransfer, batch: int, heartbeat_s: float, housekeeping_s: float,
                 failures: FailureChannel):
        self.reader, self.writer = reader, writer
        peer = writer.get_extra_info("peername")
        self.addr = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.cl, self.transfer, self.batch = cl, transfer, batch
        self.heartbeat_s, self.housekeeping_s = heartbeat_s, housekeeping_s
        self.failures = failures
        self.request_offset = -1        # the first report: where streaming starts
        self.reported = -1              # the last report
        self.acked = 0                  # what counts for SYNC_MASTER (module docstring)
        self.sent_end = -1              # the end of what was sent on this connection
        self.diverged: str | None = None    # why this slave gets nothing (its log is ahead, or behind the oldest file)
        self.signal_offset = 0          # what its heartbeats carry then
        self.problems: dict[str, str] = {}  # the server's: host -> why its slave gets nothing
        self.wake = asyncio.Event()
        self.first = asyncio.Event()
        self.next_offset = -1           # where the stream goes on
        self.parked = False             # the writer waits for a wake-up (push() may write for it)
        self.last_write = 0.0
        self.counted = False
        self.connected_at = time.time()
        self.last_read = time.monotonic()
        self._pending = b""             # the start of a report not whole yet
        self.on_idle = lambda: None     # called before the writer waits (HAService.notify wakes it then)

    @property
    def behind(self) -> int:
        return max(0, self.cl.get_max_offset() - max(self.reported, 0))

    async def serve(self) -> None:
        tasks = [asyncio.ensure_future(self._read_loop()), asyncio.ensure_future(self._write_loop()),
                 asyncio.ensure_future(self._housekeeping())]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                e = t.exception()
                if e is not None and not isinstance(e, (ConnectionError, asyncio.IncompleteReadError)):
                    log.warning("HA connection from %s closed: %s", self.addr, e)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.counted:
                self.transfer.slave_disconnected()
            self.writer.close()
            try:
                await asyncio.wait_for(self.writer.wait_closed(), 1)
            except (OSError, asyncio.TimeoutError, ConnectionError):
                pass
            log.info("HA connection from %s closed (acknowledged %d)", self.addr, self.acked)

    @property
    def _key(self) -> str:
        """The failure channel condition of this slave's host: raised while its log is ahead of this
        master's, cleared when a connection from it reports an offset this master holds."""
        return f"ha.slave.{self.addr.rpartition(':')[0]}"

    # --- the slave's reports --------------------------------------------------------------------------
    async def _housekeeping(self) -> None:
        """Nothing read for haHousekeepingInterval: the connection ends (one timer for its life, not a
        wait_for per read: a SYNC_MASTER put waits for each report)."""
        while True:
            await asyncio.sleep(min(1.0, self.housekeeping_s / 2))
            if time.monotonic() - self.last_read > self.housekeeping_s:
                raise ConnectionError(f"nothing read for {self.housekeeping_s:.0f} s")

    async def _read_loop(self) -> None:
        await self.reader.attach(self.on_data)      # (HAServer's ReportReader): each report taken as it arrives

    def on_data(self, data: bytes) -> None:
        """Bytes from the slave: its reports (the last whole one counts); ProtocolError on a negative offset."""
        self.last_read = time.monotonic()
        buf = self._pending + data if self._pending else data
        value, used = protocol.last_report(buf)
        self._pending = buf[used:]
        if value is not None:
            self._on_report(value)

    def _on_report(self, value: int) -> None:
        cl = self.cl
        self.reported = value
        if self.request_offset < 0:
            self.request_offset = value
            end, lo = cl.get_max_offset(), max(cl.get_min_offset(), 0)
            if value > end:
                self._stop(f"slave {self.addr} reports commitlog offset {value}, past this master's end {end}: its "
                           "log is ahead of (diverged from) this master's; nothing is sent to it (see `rmqstore "
                           "ha-truncate`)", end)
            elif 0 < value < lo:
                self._stop(f"slave {self.addr} needs commitlog offset {value}, below this master's oldest file "
                           f"({lo}): cleanup deleted what it lacks; it gets nothing (empty its store to copy the "
                           "whole log again)", lo)
            else:
                self.problems.pop(self.host, None)
                self.failures.clear_condition(self._key)
                if not is_boundary(cl, value):
                    log.info("slave %s resumes at %d, inside a record of this master's log", self.addr, value)
                if not self.counted:
                    self.counted = True
                    self.transfer.slave_connected()
            self.first.set()
            log.info("HA connection from %s: slave at offset %d", self.addr, value)
        elif self.diverged is None and value > cl.get_max_offset():      # (an rmqstore slave that found it so)
            if self.counted:
                self.counted = False
                self.transfer.slave_disconnected()
            self._stop(f"slave {self.addr} reports commitlog offset {value}, past this master's end "
                       f"{cl.get_max_offset()}: its log is ahead of (diverged from) this master's", cl.get_max_offset())
        if self.diverged is None:
            acked = min(value, self.sent_end)   # what it holds of what this connection sent it
            if acked > self.acked:
                self.acked = acked
                self.transfer.acknowledge(acked)

    def _stop(self, why: str, signal_offset: int) -> None:
        """This slave gets no data: reported on the failure channel and in the HA status; its heartbeats
        carry signal_offset (this master's end, or its oldest offset) for an rmqstore slave to say why."""
        self.diverged, self.signal_offset = why, signal_offset
        self.problems[self.host] = why
        log.error("%s", why)
        self.failures.raise_condition(self._key, FailureKind.REPLICA, why, path=str(self.cl.queue.store_path),
                                      offset=self.request_offset)

    @property
    def host(self) -> str:
        return self.addr.rpartition(":")[0]

    # --- the stream -----------------------------------------------------------------------------------
    async def _write_loop(self) -> None:
        await self.first.wait()
        cl = self.cl
        w = self.writer
        self.next_offset = self.request_offset if self.request_offset else max(cl.get_min_offset(), 0)
        while True:
            if self.diverged is None and self._send():
                await self._drain()
                continue
            now = time.monotonic()
            if now - self.last_write >= self.heartbeat_s:
                w.write(protocol.encode_header(self.next_offset if self.diverged is None else self.signal_offset, 0))
                await self._drain()
                self.last_write = now
            self.wake.clear()
            self.on_idle()
            if self.diverged is None and self.next_offset < cl.get_max_offset() and cl.get_data(self.next_offset, 1):
                continue            # appended after the read above, before on_idle: no wake-up for it
            timer = asyncio.get_running_loop().call_later(0.1, self.wake.set)     # (no wait_for: no task)
            self.parked = True
            try:
                await self.wake.wait()
            finally:
                self.parked = False
            timer.cancel()

    def _send(self) -> bool:
        """Write the frames of what the log holds past next_offset (a chunk at most); False: nothing new."""
        nxt = self.next_offset
        got = self.cl.get_data(nxt, WRITE_CHUNK)
        if got is None or not got[0]:
            return False
        data = got[0]
        self.writer.writelines(protocol.encode_frames(nxt, data, self.batch))
        self.next_offset = self.sent_end = nxt + len(data)
        self.last_write = time.monotonic()
        return True

    def push(self) -> bool:
        """On the loop's thread, right after an append (a SYNC_MASTER's put): write its frames now for the
        parked writer, when the socket took everything before; False: the writer must be woken instead. The
        frame leaves before the put's caller lets go of the GIL (the dispatcher thread the put woke would
        take it), and the writer task is not woken only to do it."""
        if not self.parked or self.diverged is not None or self.writer.transport.is_closing() \
                or self.writer.transport.get_write_buffer_size():
            return False
        return self._send() and not self.writer.transport.get_write_buffer_size()

    async def _drain(self) -> None:
        """What was written leaves within haHousekeepingInterval, or the slave is not reading: closed. (The
        common case, everything already with the kernel, costs no timer.)"""
        t = self.writer.transport
        if t.is_closing():
            raise ConnectionError("closed")
        if not t.get_write_buffer_size():
            await asyncio.sleep(0)      # the report reader's turn between chunks of a long catch-up
            return
        try:
            await asyncio.wait_for(self.writer.drain(), self.housekeeping_s)
        except asyncio.TimeoutError:
            raise ConnectionError(f"the slave read nothing for {self.housekeeping_s:.0f} s") from None


class ReportReader(asyncio.StreamReader):
    """The HA port's reader: what a slave sends is handed to its connection (HAConnection.on_data) from the
    transport's callback, as it arrives, not queued for a task to read on a later turn of the loop: a
    SYNC_MASTER's answer leaves in the same turn as the slave's report (and no thread of the process gets the
    GIL in between)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        super().__init__(limit=READ_CHUNK, loop=loop)
        self._sink: Callable[[bytes], None] | None = None
        self._early = bytearray()       # bytes before attach()
        self._ended = loop.create_future()
        self._ended.add_done_callback(lambda f: f.cancelled() or f.exception())   # (retrieved: not logged
        # as never retrieved for a connection refused before it was attached)

    def feed_data(self, data: bytes) -> None:
        if self._ended.done():
            return
        if self._sink is None:
            self._early += data
            return
        try:
            self._sink(data)
        except Exception as e:      # a hostile peer's bytes (ProtocolError): the connection ends
            self._end(e)

    def feed_eof(self) -> None:
        self._end(ConnectionError("closed by the slave"))

    def set_exception(self, exc) -> None:
        self._end(exc)

    def _end(self, exc: BaseException) -> None:
        if not self._ended.done():
            self._ended.set_exception(exc)

    async def attach(self, sink: Callable[[bytes], None]) -> None:
        """Hand every byte to sink from now on (those that came before first); returns when the peer ends the
        connection or sink raises, with that as the exception."""
        self._sink = sink
        if self._early:
            self.feed_data(bytes(self._early))
            self._early = bytearray()
        await self._ended


class HAServer:
    """AcceptSocketService: the HA port; a task per connection (at most max_connections at once)."""

    def __init__(self, host: str, port: int, make_connection, max_connections: int = MAX_CONNECTIONS,
                 accept: Callable[[str], bool] | None = None):
        self.host, self.port = host, port
        self.accept = accept            # which peers ("host:port") may connect (ACL's whitelist); None: all
        self.make_connection = make_connection
        self.max_connections = max_connections
        self.connections: set[HAConnection] = set()
        self.server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self.refused = 0
        self._refused_logged = -60.0
        self.problems: dict[str, str] = {}      # host -> why its slave gets nothing (HAConnection._stop)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            lambda: asyncio.StreamReaderProtocol(ReportReader(loop), self._accept, loop=loop),
            self.host, self.port, reuse_address=True)
        sock = self.server.sockets[0]
        self.port = sock.getsockname()[1]

    async def _accept(self, reader, writer) -> None:
        if len(self.connections) >= self.max_connections:
            self.refused += 1
            now = time.monotonic()
            if now - self._refused_logged >= 60:        # once a minute, whatever a peer tries
                self._refused_logged = now
                log.warning("HA port: %d connections already: refused %s (%d refused so far)", len(self.connections),
                            writer.get_extra_info("peername"), self.refused)
            writer.close()
            return
        if self.accept is not None:
            peer = writer.get_extra_info("peername")
            if not self.accept(f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)):
                writer.close()
                return
        sock = writer.get_extra_info("socket")
        if sock is not None:
            _tune(sock)
        conn = self.make_connection(reader, writer)
        conn.problems = self.problems
        self.connections.add(conn)
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            await conn.serve()
        except asyncio.CancelledError:      # stop(): the task ends here (asyncio's stream callback reads
            pass                            # its result, a cancelled task would be an error there)
        finally:
            self.connections.discard(conn)
            self._tasks.discard(task)

    def wake_all(self) -> None:
        for c in self.connections:
            c.wake.set()

    def push_all(self) -> bool:
        """HAConnection.push on every connection, waking those it cannot write for; True: every connection
        was written for and still waits (none was woken)."""
        pushed = True
        for c in self.connections:
            if not c.push():
                c.wake.set()
                pushed = False
        return pushed

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.server is not None:
            try:
                await asyncio.wait_for(self.server.wait_closed(), 2)
            except (asyncio.TimeoutError, OSError):
                pass


def _tune(sock) -> None:
    """TCP_NODELAY, as RocketMQ's HA sockets (whose fixed 64 KiB buffers are left to the kernel here)."""
    import socket
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass
