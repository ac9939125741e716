"""Long polling of the gRPC endpoint: receives and pulls waiting for a topic's next message
(RocketMQ's PopLongPollingService / PullRequestHoldService, as asyncio events on the server's loop)."""
from __future__ import annotations

import asyncio


class Arrivals:
    """One asyncio.Event per topic waited on, set from the store dispatcher's thread."""

    def __init__(self):
        self.loop: asyncio.AbstractEventLoop | None = None
        self._events: dict[str, asyncio.Event] = {}

    def on_message_arriving(self, topic: str, queue_id: int, next_offset: int, store_ts: int) -> None:
        """The dispatcher's listener (its thread)."""
        loop = self.loop
        if loop is None or topic not in self._events:
            return
        try:
            loop.call_soon_threadsafe(self._wake, topic)
        except RuntimeError:
            pass                # the loop is closed

    def _wake(self, topic: str) -> None:
        ev = self._events.get(topic)
        if ev is not None:
            ev.set()

    def event(self, topic: str) -> asyncio.Event:
        """The topic's event, cleared: take it BEFORE looking, so that an arrival in between is not missed."""
        ev = self._events.get(topic)
        if ev is None:
            ev = self._events[topic] = asyncio.Event()
        ev.clear()
        return ev

    @staticmethod
    async def wait(ev: asyncio.Event, timeout: float) -> None:
        """Until the event is set or timeout seconds pass."""
        try:
            await asyncio.wait_for(ev.wait(), max(0.0, timeout))
        except asyncio.TimeoutError:
            pass
