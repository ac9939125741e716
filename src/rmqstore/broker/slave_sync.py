"""SlaveSynchronize: a slave broker copies its master's metadata (RocketMQ's broker/slave/SlaveSynchronize).

Every SYNC_INTERVAL (60 s, as RocketMQ; and at once when the master's address becomes known) a SLAVE asks
its master, each request on its own (one failing does not stop the others; each failure is logged once):

    GET_ALL_TOPIC_CONFIG (21)              at the master's VIP port (listenPort - 2): replaces the topic table
                                           when its dataVersion differs, persisted (config/topics.json)
    GET_ALL_CONSUMER_OFFSET (43)           merged into the offset table (adds and overwrites, never removes)
    GET_ALL_DELAY_OFFSET (45)              written as it came to config/delayOffset.json (read at promotion)
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201) replaces the group table when its dataVersion differs

The commitlog itself comes over the HA link (store/ha), not here.
"""
from __future__ import annotations

import asyncio
import logging
import time

from ..store.conf.config_tables import decode_delay_offsets
from ..remoting import fastjson
from ..remoting.codes import RequestCode, ResponseCode
from ..remoting.command import RemotingCommand
from ..store.conf.config_file import config_dir, dumps_pretty, string_to_file
from .outer import BrokerOuterAPI, split_addr

log = logging.getLogger(__name__)

SYNC_INTERVAL = 60.0


def vip_addr(addr: str) -> str:
    host, port = split_addr(addr, 10911)
    return f"{host}:{port - 2}"


class SlaveSynchronize:
    def __init__(self, ctx, outer: BrokerOuterAPI, store_path):
        self.ctx, self.outer = ctx, outer
        self.store_path = store_path
        self.master_addr: str | None = None
        self.last_sync = 0.0
        self.synced = 0                 # full rounds done
        self._errors: dict[str, str] = {}

    def set_master_addr(self, addr: str | None) -> bool:
        """The name server's masterAddr answer (None while no master is registered); True when it changed."""
        changed = addr != self.master_addr
        if changed:
            log.info("slave sync: master %s (was %s)", addr, self.master_addr)
        self.master_addr = addr
        return changed

    def due(self, now: float) -> bool:
        return self.master_addr is not None and now - self.last_sync >= SYNC_INTERVAL

    async def sync_all(self) -> None:
        master = self.master_addr
        if not master:
            return
        self.last_sync = time.monotonic()
        for name, addr, code, apply in (
                ("topic config", vip_addr(master), RequestCode.GET_ALL_TOPIC_CONFIG, self._topics),
                ("consumer offsets", master, RequestCode.GET_ALL_CONSUMER_OFFSET, self._offsets),
                ("delay offsets", master, RequestCode.GET_ALL_DELAY_OFFSET, self._delay_offsets),
                ("subscription groups", master, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, self._groups)):
            try:
                resp = await self.outer.request(addr, RemotingCommand(code), 3.0)
                if resp.code != ResponseCode.SUCCESS:
                    raise ValueError(f"code {resp.code}: {resp.remark}")
                apply(resp.body or b"")
                self._errors.pop(name, None)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                if self._errors.get(name) != why:
                    log.warning("slave sync of %s from %s failed: %s", name, addr, why)
                self._errors[name] = why
        self.synced += 1

    def _topics(self, body: bytes) -> None:
        wrapper = fastjson.loads(body)
        topics = self.ctx.topics
        if wrapper.get("dataVersion") != topics.data_version:
            topics.replace_all(wrapper)

    def _offsets(self, body: bytes) -> None:
        table = fastjson.loads(body).get("offsetTable") or {}
        self.ctx.offsets.merge({str(k): {int(q): int(o) for q, o in v.items()} for k, v in table.items()})

    def _delay_offsets(self, body: bytes) -> None:
        table = decode_delay_offsets(fastjson.loads(body))        # ValueError: not written
        text = dumps_pretty({"offsetTable": {str(k): v for k, v in sorted(table.items())}})
        string_to_file(text, config_dir(self.store_path) / "delayOffset.json", decode_delay_offsets)

    def _groups(self, body: bytes) -> None:
        wrapper = fastjson.loads(body)
        groups = self.ctx.groups
        if wrapper.get("dataVersion") != groups.data_version:
            groups.replace_all(wrapper)
