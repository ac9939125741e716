"""HAService: the replication service of one store, with start()/shutdown().

It runs on one asyncio event loop: the HA port (HAServer, when the store listens for slaves), the slave's
HAClient (brokerRole=SLAVE), and the expiry of SYNC_MASTER waits. The loop is a thread of its own
("HAService"), or a running loop it is given (`loop`: a broker's, whose sends then append, wake the
connections' writers and are answered when the slave's report is read, all in that loop's thread: no
thread hand-off on a SYNC_MASTER send's round trip). The put path calls `notify()` after an append (cheap:
one flag test unless a connection is idle) and `await_slave` / `when_replicated` for what a SYNC_MASTER
answers.

A SYNC_MASTER's append is written to its slaves at once, from the put itself where a connection's writer is
parked (HAConnection.push), else by waking the writer (a put waits for it). An ASYNC_MASTER's
wakes them ASYNC_STREAM_DELAY later, and the appends meanwhile only find the wake-up already planned:
under a steady stream of small puts the slave gets a frame of many records every few milliseconds instead
of a frame, a write and a report per record, which costs both processes CPU that the puts need (RocketMQ's
ASYNC_MASTER is not woken at all: its writer polls every 100 ms).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from dataclasses import dataclass, field
from typing import Callable

from ..commitlog.commit_log import CommitLog
from ..conf.config import BrokerRole, StoreConfig
from ..state.failure import FailureChannel
from ..format.message import PutMessageStatus
from .master import HAConnection, HAServer
from .slave import HAClient
from .transfer import GroupTransfer, wait_end, with_status

log = logging.getLogger(__name__)

EXPIRE_TICK = 0.05
ASYNC_STREAM_DELAY = 0.005      # an ASYNC_MASTER's append to the writers' wake-up (module docstring)
DEFAULT_HA_PORT = 10912


@dataclass
class SlaveInfo:
    addr: str
    reported: int           # the slave's last report (its log's end)
    acked: int              # what counts for SYNC_MASTER
    behind: int             # bytes the master holds past the report


@dataclass
class HAStatus:
    """What `rmqstore admin`, the broker's runtime info and MessageStore.ha_status() show."""
    role: str
    listen: str | None                      # the HA port's address, when listening
    max_offset: int
    acked: int                              # push2SlaveMaxOffset (masters)
    slaves: list[SlaveInfo] = field(default_factory=list)
    master: str | None = None               # a slave's master (haServerAddr)
    connected: bool = False                 # a slave's link is up
    reported: int = -1                      # a slave's last report
    diverged: str | None = None             # why a slave stopped replicating
    slave_problems: dict[str, str] = field(default_factory=dict)    # a master's: host -> why it sends nothing

    def to_kv(self) -> dict[str, str]:
        kv = {"haRole": self.role, "haMaxOffset": str(self.max_offset)}
        if self.listen:
            kv["haListenAddr"] = self.listen
        if self.role != "SLAVE":
            kv["haSlaveCount"] = str(len(self.slaves))
            kv["haSlaveAckOffset"] = str(self.acked)
            kv["haSlaveBehindBytes"] = str(max(0, self.max_offset - self.acked) if self.slaves else self.max_offset)
            for i, s in enumerate(self.slaves):
                kv[f"haSlave{i}"] = f"{s.addr} reported={s.reported} acked={s.acked} behind={s.behind}"
            if self.slave_problems:
                kv["haSlaveDiverged"] = "; ".join(self.slave_problems.values())
        else:
            kv["haMasterAddress"] = self.master or ""
            kv["haConnected"] = str(self.connected).lower()
            kv["haReportedOffset"] = str(self.reported)
            if self.diverged:
                kv["haDiverged"] = self.diverged
        return kv


def listen_port(config: StoreConfig) -> int:
    """The HA port a store opened by the library listens on: haListenPort when set, 10912 (RocketMQ's
    default) for a SYNC_MASTER, else none (0). `rmqstore serve` sets haListenPort to listenPort + 1."""
    if config.ha_listen_port:
        return config.ha_listen_port
    return DEFAULT_HA_PORT if config.role is BrokerRole.SYNC_MASTER else 0


class HAService:
    def __init__(self, commit_log: CommitLog, dispatcher, config: StoreConfig, failures: FailureChannel,
                 flush: Callable[[], None] | None = None, accept: Callable[[str], bool] | None = None,
                 loop: asyncio.AbstractEventLoop | None = None):
        self.cl, self.dispatcher, self.config, self.failures = commit_log, dispatcher, config, failures
        self.role = config.role
        self.transfer = GroupTransfer(config.ha_slave_fallbehind_max, config.sync_flush_timeout)
        port = listen_port(config)
        host = config.broker_ip2 or config.broker_ip1 or "127.0.0.1"
        self.server = HAServer(host, port, self._connection, accept=accept) if port else None
        self.batch = config.ha_transfer_batch_size
        self.client = HAClient(commit_log, dispatcher, config, failures, flush) if config.is_slave else None
        if self.client is not None:
            dispatcher.on_damage = self.client.refetch      # damage on a slave: its master has the bytes
        self.loop: asyncio.AbstractEventLoop | None = None
        self._host = loop               # a running loop to run on (start() is then called from another thread)
        self._loop_thread = -1          # the ident of the thread the loop runs in
        self._thread: threading.Thread | None = None
        self._hosted: concurrent.futures.Future | None = None
        self._idle = True               # a connection's writer may be waiting: notify() wakes it
        self._tasks: list[asyncio.Task] = []
        self._stopping: asyncio.Event | None = None

    def _connection(self, reader, writer) -> HAConnection:
        cfg = self.config
        c = HAConnection(reader, writer, self.cl, self.transfer, self.batch, cfg.ha_send_heartbeat_interval / 1000,
                         cfg.ha_housekeeping_interval / 1000, self.failures)
        c.on_idle = self._set_idle
        return c

    def _set_idle(self) -> None:
        self._idle = True

    @property
    def sync_master(self) -> bool:
        return self.role is BrokerRole.SYNC_MASTER

    # --- life -----------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start on the given loop (from another thread than the loop's: it waits for it) or in a thread of
        its own; returns once the HA port listens (an OSError naming it when it cannot)."""
        ready = threading.Event()
        failed: list[BaseException] = []
        if self._host is not None:
            if self._host.is_closed() or _running_here(self._host):
                raise RuntimeError("HAService.start() on a loop must be called from another thread than the "
                                   "loop's, while it runs")
            self.loop = self._host
            self._hosted = asyncio.run_coroutine_threadsafe(self._main(ready, failed), self._host)
            self._hosted.add_done_callback(lambda f: ready.set())       # (ended before it was ready)
        else:
            def run() -> None:
                loop = self.loop = asyncio.new_event_loop()
                asyncio.set_event_loop(loop)
                try:
                    loop.run_until_complete(self._main(ready, failed))
                finally:
                    loop.close()
            self._thread = threading.Thread(target=run, name="HAService", daemon=True)
            self._thread.start()
        ready.wait()
        if self._hosted is not None and self._hosted.done() and not failed:
            e = self._hosted.exception() if not self._hosted.cancelled() else None
            raise RuntimeError(f"HAService did not start: {e or 'its loop stopped'}") from e
        if failed:
            if self._thread is not None:
                self._thread.join(5)
            e = failed[0]
            raise OSError(getattr(e, "errno", None),
                          f"HA port {self.server.host}:{self.server.port}: cannot listen: "
                          f"{getattr(e, 'strerror', None) or e}") from e

    async def _main(self, ready: threading.Event, failed: list) -> None:
        self._stopping = asyncio.Event()
        self._loop_thread = threading.get_ident()
        try:
            if self.server is not None:
                await self.server.start()
        except OSError as e:
            failed.append(e)
            ready.set()
            return
        ready.set()
        self._tasks.append(asyncio.ensure_future(self._expire()))
        if self.client is not None:
            self._tasks.append(asyncio.ensure_future(self.client.run()))
        mode = "listening on %s:%d" % (self.server.host, self.server.port) if self.server else "not listening"
        log.info("HAService (%s): %s%s", self.role.value, mode,
                 f"; master {self.client.master_address or '(from the name server)'}" if self.client else "")
        await self._stopping.wait()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.server is not None:
            await self.server.stop()

    async def _expire(self) -> None:
        while True:
            await asyncio.sleep(EXPIRE_TICK)
            self.transfer.expire()

    def shutdown(self) -> None:
        loop = self.loop
        if loop is not None and self._stopping is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._stopping.set)
            except RuntimeError:
                pass
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        if self._hosted is not None:
            if threading.get_ident() != self._loop_thread:      # (on the loop's own thread: it ends later)
                try:
                    self._hosted.result(10)
                except Exception:
                    pass
            self._hosted = None
        self.transfer.fail_all()

    # --- the put path ---------------------------------------------------------------------------------
    def notify(self) -> None:
        """Something was appended: wake the connections' writers when one waits (one flag test otherwise);
        an ASYNC_MASTER's a little later (module docstring)."""
        if self._idle and self.server is not None and self.server.connections:
            self._idle = False
            if threading.get_ident() == self._loop_thread:     # a put on the loop's own thread (a broker's)
                self._wake()
                return
            loop = self.loop
            if loop is not None:
                try:
                    loop.call_soon_threadsafe(self._wake)
                except RuntimeError:
                    pass

    def _wake(self) -> None:
        if self.role is BrokerRole.SYNC_MASTER:
            if self.server.push_all():      # written at once, every writer still parked: wake them next time
                self._idle = True
        else:
            self.loop.call_later(ASYNC_STREAM_DELAY, self.server.wake_all)

    def await_slave(self, results, wants=None):
        """A SYNC_MASTER's answer for stored results, blocking until a slave acknowledged them (or the
        timeout): results with FLUSH_SLAVE_TIMEOUT / SLAVE_NOT_AVAILABLE where that is the outcome."""
        end = wait_end(results, wants)
        if not end:
            return results
        self.notify()
        if threading.get_ident() == self._loop_thread:
            # on the loop that reads the slave's reports (a broker's): waiting here would stall it and every
            # connection on it; the answer is what holds now, FLUSH_SLAVE_TIMEOUT (stored on this master, not
            # acknowledged yet) unless already decided. The broker puts that wait do so off the loop.
            got: list = []
            self.transfer.when_acked(end, got.append)
            return with_status(results, got[0] if got else PutMessageStatus.FLUSH_SLAVE_TIMEOUT)
        return with_status(results, self.transfer.wait(end))

    def when_replicated(self, results, done: Callable[[object], None], wants=None) -> None:
        """await_slave without blocking: done(results) later, from the HA loop's thread (or at once, or from
        the thread that shuts the service down)."""
        end = wait_end(results, wants)
        if not end:
            done(results)
            return
        self.notify()
        self.transfer.when_acked(end, lambda status: done(with_status(results, status)))

    # --- the slave's master ---------------------------------------------------------------------------
    def update_master_address(self, addr: str | None) -> None:
        """A slave's master (the name server's haServerAddr answer); ignored with haMasterAddress set."""
        if self.client is None or self.loop is None or not addr:
            return
        try:
            self.loop.call_soon_threadsafe(self.client.update_master_address, addr)
        except RuntimeError:
            pass

    @property
    def master_online(self) -> bool:
        """A slave's link to its master is up."""
        return self.client is not None and self.client.connected

    # --- what it looks like ---------------------------------------------------------------------------
    def status(self) -> HAStatus:
        cl = self.cl
        st = HAStatus(self.role.value, f"{self.server.host}:{self.server.port}" if self.server else None,
                      cl.get_max_offset(), self.transfer.acked)
        if self.server is not None:
            for c in list(self.server.connections):
                if c.request_offset >= 0 and c.diverged is None:
                    st.slaves.append(SlaveInfo(c.addr, c.reported, c.acked, c.behind))
            st.slave_problems = dict(self.server.problems)
        if self.client is not None:
            st.master = self.client.master_address
            st.connected = self.client.connected
            st.reported = self.client.reported
            st.diverged = self.client.diverged
        return st


def _running_here(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def stored_status(status: PutMessageStatus) -> bool:
    return status in (PutMessageStatus.PUT_OK, PutMessageStatus.FLUSH_DISK_TIMEOUT,
                      PutMessageStatus.FLUSH_SLAVE_TIMEOUT, PutMessageStatus.SLAVE_NOT_AVAILABLE)
