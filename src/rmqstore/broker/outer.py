"""BrokerOuterAPI: the broker's own requests to other processes (name servers, its master), on its loop.

One connection per address, kept open (a name server drops a broker whose connection closes) and opened
again after a failure; requests are answered by opaque; a request that gets no answer within its timeout
raises asyncio.TimeoutError, a closed or refused connection OSError / ConnectionError.
"""
from __future__ import annotations

import asyncio
import logging

from ..remoting.command import FrameDecoder, RemotingCommand

log = logging.getLogger(__name__)


def split_addr(addr: str, default_port: int = 9876) -> tuple[str, int]:
    host, _, port = addr.strip().rpartition(":")
    if not host:
        return addr.strip() or "127.0.0.1", default_port
    return host, int(port)


class _Peer:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.pending: dict[int, asyncio.Future] = {}
        self.decoder = FrameDecoder()
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        err: BaseException = ConnectionError("closed by the peer")
        try:
            while True:
                data = await self.reader.read(1 << 16)
                if not data:
                    break
                for cmd in self.decoder.feed(data):
                    fut = self.pending.pop(cmd.opaque, None) if cmd.is_response else None
                    if fut is not None and not fut.done():
                        fut.set_result(cmd)
        except (OSError, ValueError) as e:
            err = ConnectionError(str(e))
        finally:
            for fut in self.pending.values():
                if not fut.done():
                    fut.set_exception(err)
            self.pending.clear()
            self.writer.close()

    @property
    def closed(self) -> bool:
        return self.task.done()


class BrokerOuterAPI:
    def __init__(self, signer=None):
        self._peers: dict[str, _Peer] = {}
        self.signer = signer            # ACL: signs each request (acl's client hook), or None

    async def request(self, addr: str, cmd: RemotingCommand, timeout: float = 3.0) -> RemotingCommand:
        peer = self._peers.get(addr)
        if peer is None or peer.closed:
            host, port = split_addr(addr)
            r, w = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
            peer = self._peers[addr] = _Peer(r, w)
        if self.signer is not None:
            self.signer(cmd)
        fut = asyncio.get_running_loop().create_future()
        peer.pending[cmd.opaque] = fut
        try:
            peer.writer.write(cmd.encode())
            return await asyncio.wait_for(fut, timeout)
        except BaseException:
            peer.pending.pop(cmd.opaque, None)
            raise

    def forget(self, addr: str) -> None:
        """Close the connection to addr (the next request opens a new one)."""
        peer = self._peers.pop(addr, None)
        if peer is not None:
            peer.task.cancel()
            peer.writer.close()

    async def close(self) -> None:
        peers, self._peers = list(self._peers.values()), {}
        for p in peers:
            p.task.cancel()
            p.writer.close()
        await asyncio.gather(*(p.task for p in peers), return_exceptions=True)
