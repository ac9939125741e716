"""The operator's way out of a divergence: cut a slave's commitlog back to what its master holds.

A slave whose log diverged from its master's stops replicating and says so (slave.py). This module finds
how much of the slave's log the master holds byte for byte, and cuts the slave back to the last whole
record within that, on a stopped store:

1. `common_prefix`: over the master's HA port, as a slave would (report an offset, read the frames), fetch
   the master's copy of whole commitlog files and compare them with the slave's byte for byte: a binary
   search over the files finds the first that differs, then the first differing byte in it. A master that
   has less sends fewer bytes (then heartbeats): its end bounds the prefix. Works with rmqstore's and
   RocketMQ's masters.
2. `plan_cut`: the last record boundary at or below that prefix (record sizes walked from a file start).
3. `cut`: copy the bytes past the cut into `quarantine/` (damage.quarantine_range; nothing is deleted
   that was not kept), truncate the commitlog there, and leave an abort file so that the next open runs a
   full recovery: consume queue units and index entries past the new end are removed, as after a crash.
   The slave then reports the shorter offset and the master streams from there.
"""
from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from ..commitlog.commit_log import CommitLog
from ..conf.config import StoreConfig
from ..commitlog.damage import quarantine_range
from ..state.lock import StoreLock
from . import protocol, replica_log

log = logging.getLogger(__name__)


@dataclass
class CutPlan:
    end: int                # the slave's log end now
    prefix: int             # bytes [.., prefix) equal on master and slave (or the operator's --to)
    cut_at: int             # the last record boundary at or below prefix: the new end
    master_end: int | None  # what the master's heartbeats said its end is, when it has less

    @property
    def cut_bytes(self) -> int:
        return self.end - self.cut_at


async def fetch_master(addr: str, start: int, end: int, timeout: float = 10.0) -> tuple[bytes, int | None]:
    """The master's bytes [start, end) (fewer when it has fewer: then its end as its heartbeat says, when
    it says), fetched as a slave reporting `start` would get them."""
    host, _, port = addr.rpartition(":")
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout)
    got = bytearray()
    master_end = None
    try:
        writer.write(protocol.encode_report(start))
        await writer.drain()
        dec = protocol.FrameDecoder(4 << 20)
        while start + len(got) < end:
            try:
                data = await asyncio.wait_for(reader.read(1 << 20), timeout)
            except asyncio.TimeoutError:
                break               # nothing more: the master's log ends here
            if not data:
                break
            for f in dec.feed(data):
                if not f.data:      # a heartbeat: the master has nothing at start + len(got)
                    master_end = f.offset if f.offset != start + len(got) else start + len(got)
                    return bytes(got), master_end
                if f.offset != start + len(got):
                    raise replica_log.ReplicaError(f"master sent offset {f.offset}, expected {start + len(got)}")
                got += f.data
    finally:
        writer.close()
    return bytes(got[:end - start]), master_end


def _first_difference(cl: CommitLog, start: int, theirs: bytes) -> int:
    """start + the length of the common prefix of the slave's bytes from start and `theirs`."""
    at = start
    pos = 0
    while pos < len(theirs):
        mf = cl.file_of(at)
        if mf is None:
            return at
        mine = mf.read_from(at - mf.file_from_offset, len(theirs) - pos)
        if not mine:
            return at
        n = min(len(mine), len(theirs) - pos)
        if mine[:n] != theirs[pos:pos + n]:
            i = next(i for i in range(n) if mine[i] != theirs[pos + i])
            return at + i
        at += n
        pos += n
    return at


def common_prefix(cl: CommitLog, master: str, timeout: float = 10.0) -> tuple[int, int | None]:
    """(offset up to which the slave's log equals the master's, the master's end when it has less).

    Logs that diverged share a prefix and differ after it: the first commitlog file that differs is found
    by comparing whole files with the master's, a binary search over the slave's files; within it, the
    first differing byte."""
    end = cl.get_max_offset()
    lo = max(cl.get_min_offset(), 0)
    starts = list(range(lo - lo % cl.file_size, end, cl.file_size))
    found: dict[int, int | None] = {}
    master_end: list = [None]

    def differs_at(i: int) -> int | None:
        if i not in found:
            a = max(starts[i], lo)
            b = min(starts[i] + cl.file_size, end)
            theirs, said = asyncio.run(fetch_master(master, a, b, timeout))
            if said is not None:
                master_end[0] = said
            d = _first_difference(cl, a, theirs)
            found[i] = d if d < b else None
        return found[i]
    a, b = 0, len(starts)
    while a < b:                # files[:a] equal the master's, files[b:] do not
        mid = (a + b) // 2
        if differs_at(mid) is None:
            a = mid + 1
        else:
            b = mid
    return (end if a == len(starts) else differs_at(a)), master_end[0]


def plan_cut(cl: CommitLog, prefix: int, master_end: int | None = None) -> CutPlan:
    """The cut at the last record boundary at or below prefix."""
    end = cl.get_max_offset()
    prefix = min(prefix, end)
    mf = cl.file_of(prefix) if prefix < end else None
    start = mf.file_from_offset if mf is not None else max(prefix - prefix % cl.file_size, cl.get_min_offset(), 0)
    at = start
    while at < prefix:
        nxt = replica_log.last_boundary_step(cl, at)
        if nxt is None or nxt > prefix:
            break
        at = nxt
    return CutPlan(end, prefix, at, master_end)


def cut(root: str | Path, config: StoreConfig, plan: CutPlan, why: str) -> list[str]:
    """Quarantine the slave's bytes past plan.cut_at, truncate its commitlog there, leave an abort file
    (the next open recovers as after a crash). The store must be stopped (its lock is taken). Returns the
    quarantine files written."""
    root = Path(root)
    lock = StoreLock(root)
    lock.acquire()
    try:
        kept = quarantine_and_truncate(root, config, plan.cut_at, plan.end, why)
        abort = root / "abort"
        with open(abort, "w") as f:     # empty: RocketMQ's abort file, a full recovery at the next open
            f.flush()
            os.fsync(f.fileno())
        log.warning("%s: commitlog cut from %d to %d (%d bytes kept in quarantine/): %s", root, plan.end,
                    plan.cut_at, plan.cut_bytes, why)
        return kept
    finally:
        lock.release()


def quarantine_and_truncate(root: Path, config: StoreConfig, start: int, end: int, why: str) -> list[str]:
    """Copy the commitlog's bytes [start, end) to quarantine/ (a file per commitlog file piece), then cut the
    commitlog at start. The caller holds the store's lock; returns the quarantine files."""
    cl = CommitLog(root, config)
    cl.load()
    try:
        cl.queue.set_positions_from(end)
        kept = []
        at = start
        while at < end:
            mf = cl.file_of(at)
            if mf is None:
                break
            n = min(end, mf.file_from_offset + mf.file_size) - at
            kept.append(quarantine_range(root, mf.path, mf.file_from_offset, at - mf.file_from_offset, n,
                                         why).quarantined)
            at += n
        cl.queue.truncate_to(start)
        cl.queue.flush()
        return kept
    finally:
        cl.shutdown()
