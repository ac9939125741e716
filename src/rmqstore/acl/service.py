"""PlainAclService: plain_acl.yml loaded at start and re-read when it changes (RocketMQ's FileWatchService:
a look every 500 ms, an MD5 of the whole content). A changed file that cannot be used is logged (file:line,
no secret) and the rules in force stay; that content is not tried again until the file changes again.

    service = PlainAclService(plain_acl_path(cfg.extra)).start()   # AclConfigError: the broker must not start
    service.validator.check_remoting(cmd, ip)
    service.shutdown()
"""
from __future__ import annotations

import hashlib
import logging
import os
import stat
import threading
from pathlib import Path
from typing import Mapping

from .plain_config import AclConfigError, parse_plain_acl, read_plain_acl
from .validator import PlainAccessValidator

log = logging.getLogger(__name__)

PLAIN_ACL_FILE = Path("conf") / "plain_acl.yml"
WATCH_INTERVAL = 0.5


def plain_acl_path(extra: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """HOME/conf/plain_acl.yml, HOME being broker.conf's rocketmqHome, else $ROCKETMQ_HOME."""
    environ = os.environ if environ is None else environ
    home = str((extra or {}).get("rocketmqHome") or "").strip() or environ.get("ROCKETMQ_HOME", "").strip()
    if not home:
        raise AclConfigError(str(PLAIN_ACL_FILE), None, "aclEnable=true needs RocketMQ's home, where the file is "
                             "HOME/conf/plain_acl.yml: set rocketmqHome in broker.conf or ROCKETMQ_HOME")
    return Path(home) / PLAIN_ACL_FILE


def warn_if_readable_by_others(path: Path) -> bool:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        log.warning("%s holds secret keys and is readable by other users (mode %03o): chmod 600 it",
                    path, stat.S_IMODE(mode))
        return True
    return False


class PlainAclService:
    def __init__(self, path: str | Path, interval: float = WATCH_INTERVAL):
        self.path = Path(path)
        self.interval = interval
        self.validator: PlainAccessValidator | None = None
        self.generation = 0              # rules loaded so far (1 after start)
        self._digest: str | None = None
        self._missing = False
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "PlainAclService":
        """Load the file (AclConfigError when it is missing or cannot be used) and start watching it."""
        data = read_plain_acl(self.path)
        config = parse_plain_acl(data, self.path)
        self._digest = hashlib.md5(data).hexdigest()
        self._install(config)
        warn_if_readable_by_others(self.path)
        self._thread = threading.Thread(target=self._run, name="AclWatchService", daemon=True)
        self._thread.start()
        return self

    def _install(self, config) -> None:
        for w in config.warnings:
            log.warning("%s", w)
        with self._cond:
            self.validator = PlainAccessValidator(config)
            self.generation += 1
            self._cond.notify_all()
        log.info("plain ACL from %s: %d accounts, %d global white addresses (rules #%d)", self.path,
                 len(config.accounts), len(config.global_white), self.generation)

    def check(self) -> bool:
        """One look at the file: True when new rules were installed."""
        try:
            data = read_plain_acl(self.path)
        except AclConfigError as e:
            if not self._missing:
                self._missing = True
                log.error("plain ACL not reloaded, the rules in force stay: %s", e)
            return False
        self._missing = False
        digest = hashlib.md5(data).hexdigest()
        if digest == self._digest:
            return False
        self._digest = digest
        try:
            config = parse_plain_acl(data, self.path)
        except AclConfigError as e:
            log.error("plain ACL not reloaded, the rules in force stay: %s", e)
            return False
        warn_if_readable_by_others(self.path)
        self._install(config)
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception:          # never let the watcher die
                log.exception("plain ACL watch failed")

    def wait_for_generation(self, generation: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.generation >= generation, timeout)

    def shutdown(self) -> None:
        self._stop.set()
        t, self._thread = self._thread, None
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5)
