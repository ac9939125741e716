"""AclGate: the one place the broker, the name server, the gRPC endpoint and replication ask "may this
peer do this?". Built from broker.conf (`aclEnable=true`); None when ACL is off.

    gate = AclGate.from_config(cfg)              # None without aclEnable; AclConfigError for a bad file
    handler = gate.remoting(broker.handle)       # broker ports: every request checked first
    ns_handler = gate.namesrv(namesrv.handle)    # name server: its writes (REGISTER_BROKER, ...) checked
    interceptors = [gate.grpc_interceptor()]     # gRPC: every request message checked
    gate.trusted_peer("10.0.0.5:40512")          # HA port: may this peer connect?
    gate.shutdown()

A refusal on the remoting ports answers SYSTEM_ERROR (1) with RocketMQ 4.4.0's remark
(`org.apache.rocketmq.acl.common.AclException: MESSAGE, FRAME`; a oneway request gets nothing); on gRPC
the call ends with PERMISSION_DENIED. Nothing refused reaches a processor. Refusals are logged at
WARNING, at most one line a second (the rest counted); no log line holds a secret or a signature.
"""
from __future__ import annotations

import logging
import threading
import time

from ..remoting.codes import ResponseCode
from .address import peer_ip
from .permission import NAMESRV_WRITE_CODES
from .service import PlainAclService, plain_acl_path
from .validator import ACL_EXCEPTION, AclDenied

log = logging.getLogger(__name__)

_UNCHECKED = f"{ACL_EXCEPTION}: the request could not be checked"


def acl_enabled(cfg) -> bool:
    """aclEnable (StoreConfig keeps it normalised: "true" or "false"; any other value was refused at load)."""
    return str((getattr(cfg, "extra", None) or {}).get("aclEnable", "false")).strip().lower() == "true"


class _RefusalLog:
    """At most one WARNING line per `every` seconds; the lines in between are counted."""

    def __init__(self, every: float = 1.0):
        self.every = every
        self._next = 0.0
        self._quiet = 0
        self._lock = threading.Lock()

    def __call__(self, what: str, remote: str, message: str) -> None:
        now = time.monotonic()
        with self._lock:
            if now < self._next:
                self._quiet += 1
                return
            quiet, self._quiet = self._quiet, 0
            self._next = now + self.every
        log.warning("ACL refused %s from %s: %s%s", what, remote, message,
                    f" ({quiet} more refusals not logged)" if quiet else "")


class AclGate:
    def __init__(self, service: PlainAclService):
        self.service = service
        self._log = _RefusalLog()

    @classmethod
    def from_config(cls, cfg) -> "AclGate | None":
        """The gate of a broker.conf: None without aclEnable=true; else plain_acl.yml loaded and watched."""
        if not acl_enabled(cfg):
            return None
        return cls(PlainAclService(plain_acl_path(cfg.extra)).start())

    def shutdown(self) -> None:
        self.service.shutdown()

    # --- remoting ---------------------------------------------------------------------------------------
    def check_remoting(self, req, remote: str, *, admin_only: bool = False):
        """None when req may go on, else the response that refuses it."""
        v = self.service.validator
        try:
            if admin_only:
                v.check_admin_request(req, peer_ip(remote))
            else:
                v.check_remoting(req, peer_ip(remote))
            return None
        except AclDenied as e:
            self._log(f"request code {req.code}", remote, e.message)
            return req.make_response(ResponseCode.SYSTEM_ERROR, e.remark)
        except Exception:
            log.exception("ACL check of request code %s from %s failed: refused", req.code, remote)
            return req.make_response(ResponseCode.SYSTEM_ERROR, _UNCHECKED)

    def remoting(self, handler):
        """A RemotingServer handler that checks every request before handler sees it."""
        check = self.check_remoting

        def guarded(ch, req):
            refusal = check(req, ch.remote)
            return refusal if refusal is not None else handler(ch, req)
        return guarded

    def namesrv(self, handler):
        """A name server handler whose writes (NAMESRV_WRITE_CODES: broker registration, KV config, topic
        deletion) need a peer of globalWhiteRemoteAddresses or an admin account; route queries stay open."""
        check = self.check_remoting

        def guarded(ch, req):
            if req.code in NAMESRV_WRITE_CODES:
                refusal = check(req, ch.remote, admin_only=True)
                if refusal is not None:
                    return refusal
            return handler(ch, req)
        return guarded

    # --- replication --------------------------------------------------------------------------------------
    def trusted_peer(self, remote: str) -> bool:
        """May this peer use the HA port (which carries no credentials)? Only an IP of
        globalWhiteRemoteAddresses."""
        ok = self.service.validator.globally_trusted(peer_ip(remote))
        if not ok:
            self._log("HA connection", remote, "not in globalWhiteRemoteAddresses")
        return ok

    # --- gRPC --------------------------------------------------------------------------------------------
    def check_grpc(self, message, metadata, peer: str) -> str | None:
        """None when the request message may go on, else the refusal's message."""
        try:
            self.service.validator.check_grpc(message, metadata, peer_ip(peer))
            return None
        except AclDenied as e:
            self._log(type(message).__name__, peer, e.message)
            return e.message
        except Exception:
            log.exception("ACL check of %s from %s failed: refused", type(message).__name__, peer)
            return _UNCHECKED

    def grpc_interceptor(self):
        from .grpc_auth import AclInterceptor
        return AclInterceptor(self.check_grpc)
