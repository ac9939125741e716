"""The slave's side: HAClient, connecting to the master's HA port and appending what it streams.

Per connection: cut a partial record off the log's tail (replica_log.cut_partial_tail), report the log's
end at once (RocketMQ's slave waits haSendHeartbeatInterval first), check that the master's first bytes
start a record naming that offset (replica_log.junction_problem), then append every frame where it belongs,
wake the dispatcher, flush first under SYNC_FLUSH, and report the new end. A heartbeat or a report is sent
every haSendHeartbeatInterval; nothing read for haHousekeepingInterval closes the connection; any close is
followed by a new connection (1 s later, the master's address as known then).

A master whose log does not continue this slave's (its first bytes do not start a record there, or its
heartbeat says its log ends below this slave's) is a divergence: nothing is appended, the failure channel
holds the condition `ha.diverged` with the offsets, and the client tries again every haHousekeepingInterval
(an operator's `rmqstore ha-truncate` ends it; the package docstring).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from ..commit_log import CommitLog
from ..failure import FailureChannel, FailureKind
from . import protocol, replica_log
from .replica_log import ReplicaError

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 20
DIVERGED = "ha.diverged"
LINK = "ha.link"


class Diverged(ReplicaError):
    """The master's log does not continue this slave's (see the module docstring)."""


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
        self.reported = -1
        self.received_bytes = 0
        self.diverged: str | None = None
        self._changed = asyncio.Event()
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
        while True:
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
            try:
                await self._session(reader, writer, addr)
            except Diverged as e:
                self._diverged(str(e))
                pause = self.housekeeping_s
            except (ReplicaError, protocol.ProtocolError) as e:
                self._note(f"master {addr}: {e}")
            except (OSError, ConnectionError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
                self._note(f"connection to master {addr} lost: {e or type(e).__name__}")
            finally:
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
        self._report(writer, end)
        await writer.drain()
        decoder = protocol.FrameDecoder(4 << 20)
        junction = bytearray() if end > 0 else None     # the first bytes after `end`, until checked
        self.connected, self.connected_since = True, time.time()
        log.info("HA: connected to master %s, reporting offset %d", addr, end)
        last_report = time.monotonic()
        while True:
            try:
                data = await asyncio.wait_for(reader.read(READ_CHUNK), self.housekeeping_s)
            except asyncio.TimeoutError:
                raise ConnectionError(f"nothing from the master for {self.housekeeping_s:.0f} s") from None
            if not data:
                raise ConnectionError("closed by the master")
            self.last_read = time.monotonic()
            appended = False
            for f in decoder.feed(data):
                mine = cl.get_max_offset()
                if not f.data:                              # a heartbeat
                    if f.offset != mine and mine > 0:
                        if f.offset < mine and end > 0:
                            raise Diverged(f"this slave's log ends at {mine}, past master {addr}'s end "
                                           f"{f.offset}: {mine - f.offset} bytes this master does not have")
                        raise ReplicaError(f"master pushed offset {f.offset}, this slave's log ends at {mine}")
                    continue
                if junction is not None:
                    if f.offset != end + len(junction):
                        raise ReplicaError(f"master sent offset {f.offset}, this slave's log ends at "
                                           f"{end + len(junction)}")
                    junction += f.data
                    if len(junction) < replica_log.JUNCTION_BYTES and \
                            len(junction) < cl.file_size - end % cl.file_size:
                        continue
                    why = replica_log.junction_problem(end, bytes(junction), cl.file_size)
                    if why is not None:
                        raise Diverged(f"master {addr}'s log differs from this slave's before offset {end}: {why}")
                    data_at, f_data = end, bytes(junction)
                    junction = None
                    self._resolved()
                else:
                    data_at, f_data = f.offset, f.data
                replica_log.append(cl, data_at, f_data)
                self.received_bytes += len(f_data)
                appended = True
            if appended:
                self.dispatcher.wakeup()
                if self.flush is not None:
                    await asyncio.get_running_loop().run_in_executor(None, self.flush)
                self._report(writer, cl.get_max_offset())
                last_report = time.monotonic()
            elif time.monotonic() - last_report >= self.heartbeat_s:
                self._report(writer, cl.get_max_offset())
                last_report = time.monotonic()
            await writer.drain()

    def _report(self, writer: asyncio.StreamWriter, offset: int) -> None:
        writer.write(protocol.encode_report(offset))
        self.reported = offset
        if self._last_error is not None:
            self._last_error = None
            self.failures.clear_condition(LINK)

    def _resolved(self) -> None:
        if self.diverged is not None:
            log.warning("HA: the master's log continues this slave's again: replication resumes")
            self.diverged = None
            self.failures.clear_condition(DIVERGED)
