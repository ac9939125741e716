"""A slave's commitlog: the master's bytes appended exactly where they belong, and where whole records end.

The master streams bytes, not records: a frame may end inside a record. What the slave appends is the
master's log byte for byte (RocketMQ's MappedFileQueue.getLastMappedFile(offset) + appendMessage), under the
commitlog's put lock, into files of the slave's own mappedFileSizeCommitLog (it must equal the master's).
Before it reports its offset on a new connection the slave cuts a partial record off its tail (the master
sends it again), so that the offset it reports is a record boundary and the first bytes the master sends
can be checked to start a record there (`junction_problem`).
"""
from __future__ import annotations

import logging
import struct

from ..format import codec
from ..commitlog.commit_log import CommitLog

log = logging.getLogger(__name__)

_II = struct.Struct(">iI")
_PHYS = struct.Struct(">q")
POS_PHYSICALOFFSET = 28
JUNCTION_BYTES = POS_PHYSICALOFFSET + 8     # what the first frame must hold to check the junction


class ReplicaError(ValueError):
    """The master's stream does not continue this slave's log (the message says how)."""


def expected_offset(cl: CommitLog) -> int:
    """Where the next byte of the stream belongs: the commitlog's max offset (0: an empty log)."""
    return cl.get_max_offset()


def append(cl: CommitLog, offset: int, data: bytes) -> int:
    """Append data (the master's bytes at offset) to the slave's commitlog; returns the new max offset.
    ReplicaError when offset is not this log's end (an empty log takes any file-aligned offset: the start
    of the master's stream). A write error (ENOSPC) is an OSError naming the file."""
    q = cl.queue
    size = cl.file_size
    with cl.put_lock:
        end = q.get_max_offset()
        if q.last is None:
            if offset % size:
                raise ReplicaError(f"an empty slave needs a stream that starts at a file start, not at {offset} "
                                   f"(mappedFileSizeCommitLog {size}: the same on master and slave?)")
        elif offset != end:
            raise ReplicaError(f"master sent offset {offset}, this slave's log ends at {end}")
        if size - offset % size < len(data):       # a master's frames never cross its files' ends
            raise ReplicaError(f"the master's frame of {len(data)} bytes at {offset} crosses this slave's file end "
                               f"at {offset - offset % size + size}: is mappedFileSizeCommitLog ({size}) the "
                               "master's?")
        mf = q.get_last_mapped_file(offset)
        if mf is None:
            raise OSError(f"{q.store_path}: {q.create_failure()}")
        at = mf.wrote_position
        if mf.file_from_offset + at != offset:
            raise ReplicaError(f"{mf.path}: the stream's offset {offset} is not this file's end "
                               f"{mf.file_from_offset + at}")
        try:
            mf.write_at(at, data)
            mf.commit()                 # (a slave has no write buffer: a no-op that keeps positions in step)
        except OSError as e:
            raise OSError(e.errno, f"{mf.path}: write of {len(data)} replicated bytes at {at} failed: "
                                   f"{e.strerror or e}") from e
        return q.get_max_offset()


def verify_from(cl: CommitLog, end: int, nbytes: int, floor: int = 0) -> int:
    """Where a slave asks its master to stream from: up to nbytes below its log's end, not below the file
    holding the log's last byte, nor below `floor` (the master's oldest offset), nor below this log's start;
    `end` when the log is empty."""
    if end <= 0:
        return end
    last_file = (end - 1) - (end - 1) % cl.file_size
    # never 0: a report of 0 means an empty slave, which a master streams to from wherever it chooses
    return max(end - nbytes, last_file, floor, cl.get_min_offset(), 1)


def first_difference(cl: CommitLog, offset: int, theirs: bytes) -> int | None:
    """The first offset from `offset` where this log's bytes differ from `theirs` (None: all equal)."""
    got = cl.get_data(offset, len(theirs))
    mine = got[0] if got is not None and got[1] == offset else b""
    n = min(len(mine), len(theirs))
    if mine[:n] == theirs[:n]:
        return None if n == len(theirs) else offset + n
    return offset + next(i for i in range(n) if mine[i] != theirs[i])


def last_boundary_step(cl: CommitLog, at: int) -> int | None:
    """Where the next record begins after the whole record (or END_OF_FILE blank) at `at`; None when the
    log holds no whole record there (a partial one, or bytes that are not a record)."""
    mf = cl.file_of(at)
    if mf is None:
        return None
    pos = at - mf.file_from_offset
    head = mf.read(pos, 8)
    if head is None:
        return None
    total, magic = _II.unpack(head)
    if magic == codec.BLANK_MAGIC_CODE:
        return mf.file_from_offset + mf.file_size if mf.read_position == mf.file_size else None
    if total <= 0 or magic not in (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2) \
            or pos + total > mf.read_position:
        return None
    return at + total


def last_boundary(cl: CommitLog, start: int) -> int:
    """The end of the last whole record (or full file) of the log, walking record sizes from `start`, a
    record boundary at or below the log's end (the dispatcher's offset, or a file's start)."""
    end = cl.get_max_offset()
    at = start
    while at < end:
        nxt = last_boundary_step(cl, at)
        if nxt is None:
            return at
        at = nxt
    return at


def cut_partial_tail(cl: CommitLog, start: int) -> int:
    """Cut what lies past the last whole record (a frame that ended inside a record); returns the log's end."""
    with cl.put_lock:
        end = cl.get_max_offset()
        keep = last_boundary(cl, start)
        if keep < end:
            log.info("%s: cut %d bytes of a partial record at %d (the master sends them again)",
                     cl.queue.store_path, end - keep, keep)
            cl.queue.truncate_to(keep)
        return keep


def junction_problem(offset: int, data: bytes, file_size: int) -> str | None:
    """The first bytes the master sent at `offset` (this slave's end, a record boundary): None when they
    start a record that names this offset (or an END_OF_FILE blank filling the file), else why not: the
    master's log and this slave's differ before offset (a master that lost bytes, another master)."""
    if len(data) < 8:
        return None if len(data) == 0 else "too few bytes to check"
    total, magic = _II.unpack_from(data, 0)
    if magic == codec.BLANK_MAGIC_CODE:
        if total != file_size - offset % file_size:
            return (f"the master's END_OF_FILE blank at {offset} is {total} bytes, "
                    f"the file's rest is {file_size - offset % file_size}")
        return None
    if magic not in (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2):
        return f"the master's bytes at {offset} do not start a record (magic {magic:#010x})"
    if total > file_size - offset % file_size:
        return (f"the master's record at {offset} ({total} bytes) crosses this slave's file end: is "
                f"mappedFileSizeCommitLog ({file_size}) the master's?")
    if len(data) < JUNCTION_BYTES:
        return "too few bytes to check"
    (phys,) = _PHYS.unpack_from(data, POS_PHYSICALOFFSET)
    if phys != offset:
        return f"the master's record at {offset} says it lies at {phys}"
    return None
