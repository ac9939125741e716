"""PullRequestHoldService: pulls that found nothing, held until their queue gets a message or their
suspendTimeoutMillis passes; then the pull runs again and answers."""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable

from ..remoting.codes import ResponseCode
from ..remoting.command import RemotingCommand
from .context import BrokerContext
from .header import LONG_MAX, HeaderError
from .net import Channel

log = logging.getLogger(__name__)

KEEP_HELD = object()        # what a re-run pull answers when it stays held


@dataclass
class HeldPull:
    channel: Channel
    request: RemotingCommand
    topic: str
    queue_id: int
    offset: int
    deadline: float          # time.monotonic()
    timer: asyncio.TimerHandle | None = None


class PullRequestHoldService:
    """`rerun(channel, request, held)` is the pull processor's pull without suspending: a response, None, or
    KEEP_HELD."""

    def __init__(self, ctx: BrokerContext, rerun: Callable):
        self.ctx = ctx
        self.pull_again = rerun
        self.held: dict[tuple[str, int], list[HeldPull]] = {}

    def hold(self, hp: HeldPull) -> None:
        loop = self.ctx.loop
        self.held.setdefault((hp.topic, hp.queue_id), []).append(hp)
        hp.timer = loop.call_at(loop.time() + max(0.0, hp.deadline - time.monotonic()), self._expire, hp)
        # a message dispatched between the read and the registration: wake now
        if self.ctx.store.get_max_offset_in_queue(hp.topic, hp.queue_id) > hp.offset:
            loop.call_soon(self._wake, hp.topic, hp.queue_id, LONG_MAX)

    def _unhold(self, hp: HeldPull) -> bool:
        lst = self.held.get((hp.topic, hp.queue_id))
        if lst is None or hp not in lst:
            return False
        lst.remove(hp)
        if not lst:
            del self.held[(hp.topic, hp.queue_id)]
        if hp.timer is not None:
            hp.timer.cancel()
        return True

    def _expire(self, hp: HeldPull) -> None:
        if self._unhold(hp):
            self._rerun(hp, final=True)

    def _rerun(self, hp: HeldPull, final: bool) -> bool:
        """Re-execute a held pull; False when it stays held."""
        if hp.channel.closed:
            return True
        try:
            r = self.pull_again(hp.channel, hp.request, None if final else hp)
        except HeaderError as e:
            r = hp.request.make_response(ResponseCode.SYSTEM_ERROR, str(e))
        except Exception as e:
            log.exception("held pull failed")
            r = hp.request.make_response(ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")
        if r is KEEP_HELD:
            return False
        if r is not None:
            hp.channel.send(r)
        return True

    def on_message_arriving(self, topic: str, queue_id: int, next_offset: int, store_ts: int) -> None:
        """Dispatcher listener (dispatcher thread): wake the pulls held on this queue."""
        if (topic, queue_id) in self.held:
            loop = self.ctx.loop
            if loop is not None and not loop.is_closed():
                try:
                    loop.call_soon_threadsafe(self._wake, topic, queue_id, next_offset)
                except RuntimeError:
                    pass

    def _wake(self, topic: str, queue_id: int, next_offset: int) -> None:
        lst = self.held.get((topic, queue_id))
        if not lst:
            return
        for hp in list(lst):
            if next_offset > hp.offset:
                if self._rerun(hp, final=False):
                    self._unhold(hp)

    def release_all(self) -> None:
        for lst in list(self.held.values()):
            for hp in list(lst):
                self._unhold(hp)
                self._rerun(hp, final=True)

    def channel_closed(self, ch: Channel) -> None:
        for key, lst in list(self.held.items()):
            keep = [hp for hp in lst if hp.channel is not ch]
            for hp in lst:
                if hp.channel is ch and hp.timer is not None:
                    hp.timer.cancel()
            if keep:
                self.held[key] = keep
            else:
                del self.held[key]
