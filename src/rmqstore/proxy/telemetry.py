"""Telemetry streams (RocketMQ 5 proxy's ClientActivity.telemetry + its transaction check): each client's
bidirectional stream is a TelemetrySession the server can write to at any time; a producer's session is
registered under the topics of its Publishing settings, and the transaction check service asks it about
orphaned halves with RecoverOrphanedTransactionCommand (the client answers with EndTransaction, source
SERVER_CHECK)."""
from __future__ import annotations

import asyncio
import logging
import random

from ..messaging.settings import broker_setting
from ..messaging.transaction import LocalTransactionState
from ..store.format.message import MessageExt
from .convert import message_id_of, to_protocol
from .protocol import service

log = logging.getLogger(__name__)


class TelemetrySession:
    """One client's stream: what the server writes goes through `out` (None ends it)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.out: asyncio.Queue = asyncio.Queue()
        self.topics: set[str] = set()

    def send_threadsafe(self, cmd) -> None:
        try:
            self.loop.call_soon_threadsafe(self.out.put_nowait, cmd)
        except RuntimeError:
            pass            # the loop is closed: the stream is gone


class TelemetryHub:
    """The producers' sessions by topic; registers a transaction checker per transactional topic."""

    def __init__(self, local, cfg, transaction_id_of):
        self.local = local
        self.cfg = cfg
        self.transaction_id_of = transaction_id_of        # MessageExt -> the transaction id answered at send
        self.by_topic: dict[str, list[TelemetrySession]] = {}
        self._checkers: dict[str, "OrphanedTransactionChecker"] = {}

    def publish(self, session: TelemetrySession, topics: set[str]) -> None:
        for t in topics - session.topics:
            self.by_topic.setdefault(t, []).append(session)
            if t not in self._checkers and self.local.transactions.pending_halves(t):
                self.ensure_checker(t)          # halves left open before a restart
        session.topics |= topics

    def close(self, session: TelemetrySession) -> None:
        for t in session.topics:
            lst = self.by_topic.get(t, [])
            if session in lst:
                lst.remove(session)
        session.topics.clear()

    def ensure_checker(self, group: str) -> None:
        """The transaction check service asks this hub about the group's (the topic's) orphaned halves."""
        if group in self._checkers:
            return
        c = self._checkers[group] = OrphanedTransactionChecker(self, group)
        self.local.transactions.register(c)

    def shutdown(self) -> None:
        for c in self._checkers.values():
            try:
                self.local.transactions.unregister(c)
            except Exception:
                log.exception("unregistering the transaction checker of %s failed", c.group)
        self._checkers.clear()

    def recover(self, group: str, msg: MessageExt) -> bool:
        """Send RecoverOrphanedTransactionCommand to one producer of the topic (the group); False if none."""
        sessions = self.by_topic.get(group) or []
        if not sessions:
            return False
        cmd = service.TelemetryCommand()
        rc = cmd.recover_orphaned_transaction_command
        rc.message.CopyFrom(to_protocol(msg))
        rc.transaction_id = self.transaction_id_of(msg)
        random.choice(sessions).send_threadsafe(cmd)
        log.info("asked a producer of %s about orphaned transaction %s", group, message_id_of(msg))
        return True


class OrphanedTransactionChecker:
    """What TransactionCheckService needs of a producer group (transaction_check.TransactionChecker)."""

    def __init__(self, hub: TelemetryHub, group: str):
        self.hub = hub
        self.group = group
        cfg = hub.cfg
        self.transaction_timeout_ms = broker_setting(cfg, "transactionTimeOut", 6000)
        self.transaction_check_max = broker_setting(cfg, "transactionCheckMax", 15)
        self.transaction_check_interval_ms = broker_setting(cfg, "transactionCheckInterval", 60_000)

    def _check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        self.hub.recover(self.group, msg)
        return LocalTransactionState.UNKNOW           # the producer answers later with EndTransaction
