"""MessageStore: the store facade (RocketMQ's DefaultMessageStore API), assembled from small parts.

    with MessageStore.open("/data/store", StoreConfig.load("broker.conf")) as store:
        r = store.put_message(Message("TopicA", b"hello", properties={"TAGS": "TagA", "KEYS": "k1"}))
        store.wait_dispatched()
        got = store.get_message("group", "TopicA", 0, 0, 32)

Opening takes the store's lock (a second process fails at once), recovers (see recovery: what the
verified-state record vouches for is not checked again), re-dispatches what the queues and index lack, and
starts the dispatcher, the flush services, the background check (background_check: what the open did
not check) and the repair of units reads find damaged (check.unit_repair). A clean close records what is
verified (verified_state).
"""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from .check import background_check, unit_repair
from .check.unit_repair import UnitRepairService
from .state.checkpoint import StoreCheckpoint
from .commitlog.commit_log import CommitLog
from .consumequeue import queue_clean
from .conf.config import StoreConfig
from .conf.config_keys import check_store_paths
from .consumequeue.consume_queue import ConsumeQueueTable
from .consumequeue.dispatch import Dispatcher
from ..errors import StoreClosedError
from .state.failure import FailureChannel
from .commitlog.hooks import PutMessageHook, PutMessageHooks, default_extensions
from .index.index_file import IndexService
from .state.lock import AbortFile, StoreLock
from .durability.parts import StoreParts
from .state.running_flags import RunningFlags
from .durability.cleanup import CleanupService
from .durability.flush import flush_failed, install_flush_services
from .reads.read_api import StoreReadAPI
# the read API's names, where they were before it moved out (broker, store_reader, tests)
from .reads.read_api import TOTAL_PHYSICAL_MEMORY_SIZE  # noqa: F401  (the broker's figure, from the facade)
from .recovery.recovery import RecoveryReport, recover_store
from .ha import HAService, HAStatus, listen_port
from .ha import role as ha_role
from .ha.transfer import wants_of
from .consumequeue.consume_queue_ext import ConsumeQueueExtService, ConsumeQueueExtTable
from .commitlog.put_api import StorePutAPI

log = logging.getLogger(__name__)

class MessageStore(StorePutAPI, StoreReadAPI):
    def __init__(self, path: str | Path, config: StoreConfig | None = None):
        self.path = Path(path)
        self.config = config or StoreConfig()
        if self.config.is_slave and self.config.transient_store_pool_enable:
            # RocketMQ ignores the write buffer on a SLAVE too: replicated bytes go straight to the files
            log.info("%s: transientStorePoolEnable is ignored on a SLAVE", self.path)
            self.config = dataclasses.replace(self.config, transient_store_pool_enable=False)
        self._closed = True
        self.lock = StoreLock(self.path)
        self.abort_file = AbortFile(self.path)
        self.checkpoint: StoreCheckpoint | None = None
        self.commit_log = CommitLog(self.path, self.config)
        self.consume_queues = ConsumeQueueTable(self.path, self.config.mapped_file_size_consume_queue)
        self.index_service = IndexService(self.path, self.config)
        self.consume_queue_ext = ConsumeQueueExtTable(self.path, self.config, self.commit_log)
        # one failure channel every service reports to (failure.py): read by wait_dispatched, close, check
        self.failures = FailureChannel()
        self.dispatcher = Dispatcher(self.commit_log, self.consume_queues, self.index_service, self.config,
                                     self.failures)
        self.services: list = []          # flush / clean services: start() and shutdown()
        self.recovery_report: RecoveryReport | None = None
        self.running_flags = RunningFlags(self.failures)
        self.put_hooks = PutMessageHooks()    # put-message hooks (hooks.py), swapped whole
        self.named_services: dict = {}    # register_service: extension services (schedule, ...), by name
        self._services_running = False
        self.group_commit = None          # flush.GroupCommitService under SYNC_FLUSH, once started
        self.ha: HAService | None = None  # replication (store/ha), once started: a SLAVE, or listening
        self.ha_accept = None             # set before start: which peers ("host:port") the HA port admits
        self.ha_loop = None               # set before start: a running event loop a master's HA port runs on
        self.running_flags.slave = self.config.is_slave

    # --- lifecycle ------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path, config: StoreConfig | None = None, *, start_services: bool = True,
             replicate: bool = True) -> "MessageStore":
        """replicate=False: no replication service whatever brokerRole says (offline tools that write:
        their puts are this store's alone)."""
        store = cls(path, config)
        store.start(start_services, replicate=replicate)
        return store

    def start(self, start_services: bool = True, *, replicate: bool = True) -> None:
        check_store_paths(self.config, self.path)       # storePathRootDir & co. name this store, or ConfigError
        self.path.mkdir(parents=True, exist_ok=True)
        self.lock.acquire()
        try:
            self._load_and_recover()
            self._note_role()
            self.abort_file.create(self.dispatcher.reput_from_offset)
            self.dispatcher.on_dispatched = self.abort_file.note_dispatched
            # a slave's log may end inside a record (a frame cut it): the dispatcher waits for the rest
            self.dispatcher.tail_grows = self.config.is_slave
            self._closed = False
            if start_services:
                self.dispatcher.start()
                parts = self.parts()
                self.group_commit = install_flush_services(parts, self.services)
                self.services.append(CleanupService(parts))
                for s in self.services:
                    s.start()
                self._services_running = True
                for s in self.named_services.values():
                    s.start()
                self.register_service(background_check.NAME,
                                      background_check.install(parts, self.failures, self.recovery_report))
                self.unit_repair = UnitRepairService(self.commit_log, self.dispatcher, self.failures)
                self.register_service(unit_repair.NAME, self.unit_repair)
                if replicate:
                    self._start_ha()
            if self.config.broker_role and not self.config.is_slave:
                ha_role.promoted(self.path, self.config.broker_role)     # only once it started as a master
        except BaseException:
            if self.ha is not None:
                self.ha.shutdown()
                self.ha = None
            self._release_files()
            self.abort_file.close()
            self.lock.release()
            raise

    def _load_and_recover(self) -> None:
        """Load every file and recover (recovery.recover_store); the report is kept in recovery_report.
        Then the store extensions (hooks.py) register their hooks and services, before any put."""
        self.recovery_report = recover_store(self)
        self._open_consume_queue_ext()
        if self.config.is_slave:        # no delayed or timer deliveries on a slave: it takes no puts
            return
        for install in default_extensions():
            install(self)

    def _open_consume_queue_ext(self) -> None:
        """The consume queue extension (consume_queue_ext.py): read when its files exist, written at dispatch
        with enableConsumeQueueExt."""
        ext = self.consume_queue_ext
        ext.load(self.consume_queues)
        if self.config.enable_consume_queue_ext:
            self.dispatcher.cq_ext = ext
        if ext.table or self.config.enable_consume_queue_ext:
            self.register_service("consume_queue_ext", ConsumeQueueExtService(ext, self.consume_queues))

    def _note_role(self) -> None:
        """A SLAVE's record (ha/role.py): written by a slave, ended by a store opened with brokerRole set to a
        master role (a promotion); a store opened without brokerRole that was a slave refuses puts as the
        slave does (`rmqstore load` into a stopped slave's directory would make it diverge)."""
        if self.config.is_slave:
            ha_role.record_slave(self.path, self.config.ha_master_address)
        elif not self.config.broker_role and ha_role.was_slave(self.path) is not None:
            self.running_flags.slave = True

    def _start_ha(self) -> None:
        """Replication (store/ha): a SLAVE's client, and the HA port of a store that listens for slaves."""
        cfg = self.config
        if not (cfg.is_slave or listen_port(cfg)):
            return
        flush = self.commit_log.queue.flush if cfg.is_slave and cfg.flush_disk_type == "SYNC_FLUSH" else None
        # a master's HA port on the given loop (a broker's: start() then runs in another thread); a slave's
        # client keeps a thread of its own (its appends and flushes would hold up that loop)
        self.ha = HAService(self.commit_log, self.dispatcher, cfg, self.failures, flush, accept=self.ha_accept,
                            loop=None if cfg.is_slave else self.ha_loop)
        self.ha.start()

    def ha_status(self) -> HAStatus | None:
        """Replication as it stands (role, slaves and what they acknowledged, a slave's link), or None when
        this store neither listens for slaves nor is one."""
        return self.ha.status() if self.ha is not None else None

    # --- extensions: put-message hooks and services (hooks.py) ------------------------------------
    def register_put_message_hook(self, hook: PutMessageHook) -> None:
        """Run hook before each put of a message carrying one of its trigger properties (hooks.py)."""
        self.put_hooks = self.put_hooks.with_hook(hook)

    def unregister_put_message_hook(self, name: str) -> None:
        self.put_hooks = self.put_hooks.without(name)

    @property
    def put_message_hook_list(self) -> tuple:
        return self.put_hooks.hooks

    def register_service(self, name: str, service) -> None:
        """A service (start()/shutdown()) started with the store's services (at once if they run) and shut
        down first at close; the same name replaces (the old one is shut down)."""
        self.unregister_service(name)
        self.named_services[name] = service
        if self._services_running:
            service.start()

    def unregister_service(self, name: str) -> None:
        """Shut the service registered under name down (if the services run) and forget it."""
        old = self.named_services.pop(name, None)
        if old is not None and self._services_running:
            old.shutdown()

    def service(self, name: str):
        """The service registered under name, or None."""
        return self.named_services.get(name)

    @property
    def schedule_service(self):
        """The ScheduleMessageService the delay extension registered (messaging/schedule.install), or None."""
        return self.named_services.get("schedule")

    def close(self) -> None:
        """Clean shutdown: stop services, dispatch and flush everything, remove the abort file.

        Returns promptly when dispatching cannot progress (its reason is logged and on self.failures);
        the abort file then stays, so that the next open recovers and re-dispatches."""
        if self._closed:
            return
        self._closed = True
        self.group_commit = None
        if self.ha is not None:         # no more appends from a master, no more waits answered
            self.ha.shutdown()
            self.ha = None
        self._services_running = False
        try:
            self._close_files()
        finally:
            self.lock.release()         # whatever failed above: this process never keeps the store locked

    def _close_files(self) -> None:
        for name, s in reversed(list(self.named_services.items())):
            try:            # a service that cannot persist its state (a config file it cannot write) is logged
                s.shutdown()
            except Exception as e:  # noqa: BLE001 - close goes on: the store's own files come first
                log.error("%s: shutting down the %s service failed: %s", self.path, name, e)
        if self.config.transient_store_pool_enable:
            try:    # the write buffer into the file first: the dispatcher reads committed bytes only
                self.commit_log.queue.commit(0)
            except OSError as e:
                log.error("%s: committing the write buffer at close failed: %s", self.path, e)
        drained = self.dispatcher.shutdown(drain=True)
        if not drained:
            log.error("%s: closing with commitlog offsets %d..%d not dispatched: %s", self.path,
                      self.dispatcher.reput_from_offset, self.commit_log.get_max_offset(),
                      self.dispatcher.stuck_reason() or
                      ("a put appended them while the store was closing (the next open dispatches them)"
                       if self.dispatcher.written_while_stopping else "dispatch did not finish in time"))
        for s in reversed(self.services):
            s.shutdown()
        failed_flushes = [s.failed for s in self.services if getattr(s, "failed", None)]
        self.services.clear()
        ok = self.running_flags.write_error is None     # after a failed write the next open must recover
        if failed_flushes:  # a failed msync: a new one would "succeed" over lost data (see flush): claim nothing
            log.error("%s: %s: no final flush, the abort file stays", self.path, failed_flushes[0])
        else:
            try:
                self._flush_all()
            except OSError as e:
                ok = False
                self.abort_file.distrust()
                log.error("%s: final flush failed (%s): keeping the abort file so the next open recovers",
                          self.path, e)
        self._release_files()
        if ok and drained and self.dispatcher.stuck_reason() is None:
            background_check.save_at_close(self.parts(), self.failures, self.recovery_report,
                                           self.service(background_check.NAME))
            self.abort_file.remove()
        else:
            self.abort_file.close()

    shutdown = close

    def _release_files(self) -> None:
        self.index_service.shutdown()
        self.consume_queues.shutdown()
        self.consume_queue_ext.shutdown()
        self.commit_log.shutdown()
        if self.checkpoint is not None:
            self.checkpoint.shutdown()

    def flush_all(self) -> None:
        """Flush commitlog, consume queues and index, then record it in the checkpoint. StoreClosedError once
        closed; an OSError when a flush fails, now or before (a failed flush is final: see flush.py; the store
        then refuses puts and keeps its abort file, as after a failed flush of its services)."""
        self._check_open()
        try:
            self._flush_all()
        except OSError:
            if self._closed:
                raise StoreClosedError(f"store {self.path} was closed during flush_all") from None
            raise

    def _flush_all(self) -> None:
        cl = self.commit_log
        cl.queue.commit()                   # the write buffer into the file: a write, not a flush
        phys_ts = cl.queue.store_timestamp
        logics_ts = self.dispatcher.last_dispatched_timestamp
        try:
            cl.queue.flush()
            self.consume_queues.flush()
            self.consume_queue_ext.flush()
            index_ts = self.index_service.flush()
        except OSError as e:
            if not self._closed:            # (close() keeps its abort file itself)
                flush_failed(self.parts(), "flush_all", e)
            raise
        ck = self.checkpoint
        if phys_ts:
            ck.physic_msg_timestamp = phys_ts
        if logics_ts:
            ck.logics_msg_timestamp = logics_ts
        if index_ts:
            ck.index_msg_timestamp = index_ts
        ck.flush()

    def __enter__(self) -> "MessageStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.path} is closed")

    def _replicated(self, results, msgs):
        """A SYNC_MASTER's answer: results once a slave holds them (store/ha: await_slave)."""
        return self.ha.await_slave(results, wants_of(msgs))

    def delete_topic(self, topic: str) -> list[tuple[str, int]]:
        """Delete a topic's queues (RocketMQ's deleteTopic, in the store): every queue of it, dispatched or
        not yet, is removed with its consume queue files and its queue offsets; the messages stay in the
        commitlog (until cleanup) and are never served, dispatched or rebuilt again (config/deletedQueues.json).
        A put to the topic afterwards starts its queues over at offset 0. Returns the removed (topic, queue
        id) pairs; OSError when the deletion cannot be recorded (nothing is removed then)."""
        self._check_open()
        return queue_clean.delete_topic(self.parts(), topic)

    def record_write_failure(self, e: OSError) -> None:
        """A commitlog write failed (a full disk): puts are refused from now on (RunningFlags)."""
        self.parts().record_write_failure(e)

    def parts(self) -> StoreParts:
        """What the services are given (parts.py): the files and flags, not this facade."""
        return StoreParts(self.path, self.config, self.commit_log, self.consume_queues, self.index_service,
                          self.dispatcher, self.checkpoint, self.running_flags, self.abort_file)

    def dispatch_behind_bytes(self) -> int:
        return self.dispatcher.dispatch_behind_bytes()

    def wait_dispatched(self, timeout: float = 10.0, *, raise_on_failure: bool = False) -> bool:
        """True once everything written is in the consume queues and the index. False at the timeout, or
        at once when dispatching cannot progress; with raise_on_failure that case raises a
        StoreDispatchError with the reason instead (also on self.failures)."""
        ok = self.dispatcher.wait_dispatched(timeout=timeout)
        why = None if ok else self.dispatcher.stuck_reason()
        if why is not None and raise_on_failure:
            raise StoreDispatchError(f"{self.path}: dispatch stopped at offset "
                                     f"{self.dispatcher.reput_from_offset}: {why}")
        return ok

    def check(self, repair: bool = False):
        """A full consistency check of this open store (rmqstore.store.check.check.check_store: every record with its
        CRC, every consume queue unit against its record, index entries, checkpoint, config files), after
        the background check's pass (which repairs the queues it finds damaged) and after the dispatcher
        caught up. Returns a check.CheckReport (`ok`, `problems`, `summary()`).

        repair=True, on the open store: consume queues with a damaged unit are cut there and rebuilt from
        the commitlog by the dispatcher, malformed config files are quarantined (FILE.corrupt-<time>, the
        .bak restored); then the check runs again and its report is returned (`repaired` says what was
        done). Index damage is repaired at the next open, or by `rmqstore check --repair` on the closed
        store. Commitlog damage stays in the returned report (not ok): quarantining it needs the closed
        store (`rmqstore check --repair`, which records it in config/damagedRanges.json). Nothing in the
        commitlog is ever deleted."""
        from .check.check import check_store
        from .check.check_files import repair_config
        self._check_open()
        bg = self.service(background_check.NAME)
        if bg is not None:      # its pass cuts and rebuilds queues it finds damaged: read them after, not during
            bg.wait()
        self.wait_dispatched()
        report = check_store(self.path, self.config, live=True)
        if not repair or report.ok:
            return report
        done: list[str] = []
        repair_config(report.bad_config, done)
        done.extend(self._repair_queues())
        after = check_store(self.path, self.config, live=True)
        after.repaired = done
        return after

    def _repair_queues(self) -> list[str]:
        """Cut every consume queue at its first damaged unit (all units checked) and re-dispatch from there."""
        from .recovery.recovery import _commitlog_sources, check_queue, repair_queues_live
        cl = self.commit_log
        with self.dispatcher._lock:          # the dispatcher thread waits: no unit is appended meanwhile
            sources = _commitlog_sources(cl)
            cl_min = max(cl.get_min_offset(), 0)
            found = [(cq, *f) for cq in list(self.consume_queues)
                     if (f := check_queue(cq, sources, cl_min)) is not None]
        done = repair_queues_live(cl, self.dispatcher, found)
        if found:
            self.dispatcher.do_reput()
            self.wait_dispatched()
        return done


class StoreDispatchError(RuntimeError):
    """wait_dispatched(raise_on_failure=True): dispatching cannot progress (the message says why)."""
