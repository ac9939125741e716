"""The slave's side: HAClient, connecting to the master's HA port and appending what it streams.

Per connection: cut a partial record off the log's tail (replica_log.cut_partial_tail), report at once
(RocketMQ's slave waits haSendHeartbeatInterval first) an offset up to 64 KiB below the log's end, so that
the master sends the last bytes this log holds again and they are compared byte for byte (any master,
RocketMQ's too, streams from the offset reported); check that the master's first bytes after the log's end
start a record naming that offset (replica_log.junction_problem); then append every frame where it belongs
(never across a file's end), wake the dispatcher, flush first under SYNC_FLUSH, and report the new end. A heartbeat or a report is sent
every haSendHeartbeatInterval; nothing read for haHousekeepingInterval closes the connection; any close is
followed by a new connection (1 s later, the master's address as known then).

A master whose log does not continue this slave's (the bytes asked again differ, its first bytes do not
start a record there, or its heartbeat says its log ends below this slave's or starts past it) is a
divergence: nothing is appended, the failure channel
holds the condition `ha.diverged` with the offsets, and the client tries again every haHousekeepingInterval
(an operator's `rmqstore ha-truncate` ends it; the package docstring).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from ..commitlog.commit_log import CommitLog
from ..state.failure import FailureChannel, FailureKind
from . import protocol, replica_log
from .replica_log import ReplicaError

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 20
VERIFY_BYTES = 64 << 10         # the last bytes a slave asks for again on each connection, to compare
DIVERGED = "ha.diverged"
LINK = "ha.link"


class Diverged(ReplicaError):
    """The master's log does not continue this slave's (see the module docstring); `ahead`: this log holds
    bytes past the master's end."""

    def __init__(self, why: str, ahead: bool = False):
        super().__init__(why)
        self.ahead = ahead


class HAClient:
    def __init__(self, cl: CommitLog, dispatcher, config, failures: FailureChannel,
                 flush: Callable[[], None] | None = None):
        self.cl, self.dispatcher, self.failures = cl, dispatcher, failures
        self.flush = flush                      # SYNC_FLUSH: the commitlog flushed before each report
        self.heartbeat_s = config.ha_send_heartbeat_interval / 1000.0
        self.housekeeping_s = config.ha_housekeeping_interval / 1000.0
        self.fixed_address = config.ha_master_address or None
        self.master_address: str | None = self.fixed_address
        self.connected = False
        self.connected_since = 0.0
        self.last_read = 0.0
        self._stale = False             # the housekeeping timer closed the connection
        self.reported = -1
        self.received_bytes = 0
        self.diverged: str | None = None
        self._changed = asyncio.Event()
        self._verify_floor = 0          # the master's oldest offset when it lies inside the bytes asked again
        self._paused_at = -1            # where the master's stream last paused (a heartbeat) while comparing
        self._refetches: dict[int, int] = {}    # the offset the dispatcher last sent back (refetch), how often
        self.stopped: str | None = None         # refetch gave up: no more connections until the store reopens
        self.loop: asyncio.AbstractEventLoop | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._last_error: str | None = None

    # --- the master's address -------------------------------------------------------------------------
    def update_master_address(self, addr: str | None) -> None:
        """The haServerAddr the name server answered (ignored when haMasterAddress is configured); a new
        address closes the current connection. Call on the HA loop."""
        if self.fixed_address or not addr or addr == self.master_address:
            return
        log.info("HA master address: %s (was %s)", addr, self.master_address)
        self.master_address = addr
        if self._writer is not None:
            self._writer.close()
        self._changed.set()

    # --- the loop -------------------------------------------------------------------------------------
    async def run(self) -> None:
        self.loop = asyncio.get_running_loop()
        while True:
            if self.stopped is not None:
                await self._pause(self.housekeeping_s)
                continue
            addr = self.master_address
            if not addr:
                await self._pause(self.heartbeat_s)
                continue
            host, _, port = addr.rpartition(":")
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 3)
            except (OSError, asyncio.TimeoutError, ValueError) as e:
                self._note(f"cannot connect to master {addr}: {e or type(e).__name__}")
                await self._pause(min(5.0, self.heartbeat_s))
                continue
            self._writer = writer
            pause = 1.0
            self.last_read, self._stale = time.monotonic(), False
            watch = asyncio.ensure_future(self._housekeeping(writer))
            try:
                await self._session(reader, writer, addr)
            except Diverged as e:
                self._diverged(str(e))
                pause = self.housekeeping_s
                if e.ahead:     # this log's end, past the master's: it says so too (master.py)
                    try:
                        writer.write(protocol.encode_report(self.cl.get_max_offset()))
                        await asyncio.wait_for(writer.drain(), 1)
                    except (OSError, ConnectionError, asyncio.TimeoutError):
                        pass
            except (ReplicaError, protocol.ProtocolError) as e:
                self._note(f"master {addr}: {e}")
            except (OSError, ConnectionError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
                self._note(f"connection to master {addr} lost: {e or type(e).__name__}")
            finally:
                watch.cancel()
                self.connected = False
                self._writer = None
                writer.close()
            await self._pause(pause)

    async def _pause(self, seconds: float) -> None:
        self._changed.clear()
        try:
            await asyncio.wait_for(self._changed.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    def _note(self, why: str) -> None:
        if why != self._last_error:
            log.warning("HA: %s", why)
            self._last_error = why
        self.failures.raise_condition(LINK, FailureKind.REPLICA, why)

    def _diverged(self, why: str) -> None:
        if why != self.diverged:
            log.error("HA: replication stopped: %s", why)
        self.diverged = why
        self.failures.raise_condition(DIVERGED, FailureKind.REPLICA, why, path=str(self.cl.queue.store_path),
                                      offset=self.cl.get_max_offset())

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, addr: str) -> None:
        cl = self.cl
        last = cl.queue.last
        start = max(self.dispatcher.reput_from_offset, last.file_from_offset if last is not None else 0)
        end = replica_log.cut_partial_tail(cl, min(start, cl.get_max_offset()))
        # ask again for the last bytes held: the master's copy of them is compared with this log's (a master
        # whose log differs before `end` is found here, whatever its record sizes), and they acknowledge
        verified = replica_log.verify_from(cl, end, VERIFY_BYTES, self._verify_floor)
        self._paused_at = -1
        self._report(writer, verified)
        await writer.drain()
        decoder = protocol.FrameDecoder(cl.file_size)
        junction = bytearray() if end > 0 else None     # the first bytes after `end`, until checked
        self.connected, self.connected_since = True, time.time()
        log.info("HA: connected to master %s; this log ends at %d, checking it from %d", addr, end, verified)
        last_report = time.monotonic()
        while True:
            data = await reader.read(READ_CHUNK)
            if not data:
                raise ConnectionError(f"nothing from the master for {self.housekeeping_s:.0f} s" if self._stale
                                      else "closed by the master")
            self.last_read = time.monotonic()
            appended = False
            for f in decoder.feed(data):
                if not f.data:                              # a heartbeat
                    self._heartbeat(f.offset, verified if verified < end else cl.get_max_offset(), end, addr)
                    continue
                at, chunk = f.offset, f.data
                if verified < end:                          # the bytes this log holds already: compared
                    if at != verified:
                        raise ReplicaError(f"master sent offset {at}, expected {verified}")
                    n = min(len(chunk), end - verified)
                    where = replica_log.first_difference(cl, verified, chunk[:n])
                    if where is not None:
                        raise Diverged(f"master {addr}'s log differs from this slave's at offset {where} (this "
                                       f"log ends at {end})")
                    verified += n
                    at, chunk = at + n, chunk[n:]
                    if verified == end:
                        self._verify_floor = 0
                    if not chunk:
                        continue
                if junction is not None:
                    if at != end + len(junction):
                        raise ReplicaError(f"master sent offset {at}, this slave's log ends at {end + len(junction)}")
                    junction += chunk
                    if len(junction) < replica_log.JUNCTION_BYTES and \
                            len(junction) < cl.file_size - end % cl.file_size:
                        continue
                    why = replica_log.junction_problem(end, bytes(junction), cl.file_size)
                    if why is not None:
                        raise Diverged(f"master {addr}'s log differs from this slave's before offset {end}: {why}")
                    at, chunk = end, bytes(junction)
                    junction = None
                replica_log.append(cl, at, chunk)
                self.received_bytes += len(chunk)
                if not appended and self.diverged is not None:
                    self._resolved()
                appended = True
            self._link_up()
            if appended:
                if self.flush is not None:
                    self.dispatcher.wakeup()
                    await asyncio.get_running_loop().run_in_executor(None, self.flush)
                    self._report(writer, cl.get_max_offset())
                else:       # the report first: a SYNC_MASTER's put waits for it, not for the dispatch here
                    self._report(writer, cl.get_max_offset())
                    self.dispatcher.wakeup()
                last_report = time.monotonic()
            elif time.monotonic() - last_report >= self.heartbeat_s:
                self._report(writer, verified if verified < end else cl.get_max_offset())
                last_report = time.monotonic()
            await writer.drain()

    async def _housekeeping(self, writer: asyncio.StreamWriter) -> None:
        """Nothing from the master for haHousekeepingInterval: the connection is closed (one timer for the
        connection's life, not a wait_for per read: each read is on a SYNC_MASTER put's path)."""
        while True:
            await asyncio.sleep(min(1.0, self.housekeeping_s / 2))
            if time.monotonic() - self.last_read > self.housekeeping_s:
                self._stale = True
                writer.close()
                return

    def _heartbeat(self, offset: int, expected: int, end: int, addr: str) -> None:
        """A heartbeat names where the master's stream stands: where this slave asked (RocketMQ's, and
        rmqstore's while it serves), else why an rmqstore master sends nothing: its end (below this log's:
        this log is ahead) or its oldest offset (past what this log holds). A master that pauses twice at the
        same offset while this slave still holds bytes past it has no more: this log is ahead of it."""
        if self.cl.get_max_offset() == 0:
            return
        if offset == expected:
            if expected < end:
                if self._paused_at == offset:
                    raise Diverged(f"this slave's log ends at {end}, past master {addr}'s end {offset}: "
                                   f"{end - offset} bytes this master does not have", ahead=True)
                self._paused_at = offset
            return
        if offset < expected:
            raise Diverged(f"this slave's log ends at {end}, past master {addr}'s end {offset}: "
                           f"{end - offset} bytes this master does not have", ahead=True)
        if offset <= end:               # the master's oldest file starts inside the bytes asked again
            self._verify_floor = offset
            raise ReplicaError(f"master {addr}'s log starts at {offset}: asking again from there")
        raise Diverged(f"master {addr}'s oldest file starts at {offset}, past this slave's end {end}: its "
                       "cleanup deleted what this slave lacks (empty this slave's store to copy the whole log)")

    def _report(self, writer: asyncio.StreamWriter, offset: int) -> None:
        writer.write(protocol.encode_report(offset))
        self.reported = offset

    def _link_up(self) -> None:
        if self._last_error is not None:
            self._last_error = None
            self.failures.clear_condition(LINK)

    def refetch(self, offset: int, why: str) -> bool:
        """The dispatcher found a record at `offset` that fails its checks (bytes damaged on the way or on this
        disk, or a master whose file size differs): cut the log there and take the master's bytes again
        (the connection closes; the next one reports the shorter log). Three times at the same offset is no
        accident: replication stops, loudly. Runs on the dispatcher's thread; True: do not skip the record."""
        n = self._refetches.get(offset, 0) + 1
        self._refetches = {offset: n}
        if n > 3:
            self._diverge_threadsafe(f"the master's bytes at commitlog offset {offset} fail the record checks again "
                                     f"and again ({why}): is mappedFileSizeCommitLog the master's?")
            return True
        log.warning("%s: commitlog offset %d: %s: cut there, taking the master's bytes again (%d)",
                    self.cl.queue.store_path, offset, why, n)
        with self.cl.put_lock:
            if offset < self.cl.get_max_offset():
                self.cl.queue.truncate_to(offset)
        loop, w = self.loop, self._writer
        if loop is not None and w is not None:
            loop.call_soon_threadsafe(w.close)
        return True

    def _diverge_threadsafe(self, why: str) -> None:
        loop = self.loop
        if loop is None:
            return
        self.stopped = why
        loop.call_soon_threadsafe(self._diverged, why)
        if self._writer is not None:
            loop.call_soon_threadsafe(self._writer.close)

    def _resolved(self) -> None:
        if self.diverged is not None:
            log.warning("HA: the master's log continues this slave's again: replication resumes")
            self.diverged = None
            self.failures.clear_condition(DIVERGED)
