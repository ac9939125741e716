"""The commitlog's columnar append: a batch message_batch.encode_columns encoded (EncodedBatch) placed file
by file under the commitlog's lock, queue offsets for the records written only; the dispatcher handed
the columns it would parse back (dispatch hints). And the write helpers every append path uses.

The functions take the CommitLog (`cl`): its queue of files, put_lock, topic_queue_table and
dispatch_hints.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from ..format import codec
from ..files.mapped_file import MappedFile
from ..format.message import PutMessageResults, PutMessageStatus
from ..format.message_batch import EncodedBatch, chop

log = logging.getLogger("rmqstore.store.commitlog.commit_log")

_HEADER_V4 = codec.HEADER_V4
_BLANK_MIN = codec.END_FILE_MIN_BLANK_LENGTH
_CREATE_FAILED = PutMessageStatus.CREATE_MAPEDFILE_FAILED
_NOT_AVAILABLE = PutMessageStatus.SERVICE_NOT_AVAILABLE
DISPATCH_HINTS_MAX = 256    # batches handed to the dispatcher and not taken yet
DISPATCH_STALL = 0.005      # seconds: a writer waits for a dispatcher behind it while it takes hints ...
DISPATCH_WAIT_MAX = 0.05    # ... and this long at most per put


def undo_write(mf: MappedFile, pos: int, size: int) -> None:
    """A write at pos failed part way: zero what may have reached the file, so that no complete record of a
    put answered with a failure is found there by a later recovery (a later put overwrites it anyway)."""
    try:
        mf.zero_data(pos, pos + size)
    except OSError as e:
        log.error("%s: cannot zero the failed write at %d (%d bytes): %s", mf.path, pos, size, e)


def write_or_undo(mf: MappedFile, pos: int, data) -> None:
    """mf.write_at, undone (undo_write) if it raises."""
    try:
        mf.write_at(pos, data)
    except OSError:
        undo_write(mf, pos, len(data))
        raise


def put_columnar(cl, b: EncodedBatch) -> tuple[PutMessageResults, OSError | None]:
    """Append a columnar batch, file by file; (results, the write error that stopped it or None). The
    queues count only the records written: a write that fails stores the records before it (PUT_OK)
    and none after (SERVICE_NOT_AVAILABLE).

    One function on purpose: everything from taking the queue offsets to counting what was written
    happens under put_lock, and the failure handling (which records count) needs every step's state.
    Hot: once per batch (the put_columns / e2e rows of BENCHMARKS.md)."""
    n, hdr, ends, sizes = b.n, b.hdr, b.ends, b.sizes
    phys = np.empty(n, np.int64)
    q = cl.queue
    err = None
    mf = None
    with cl.put_lock:
        now = time.time_ns() // 1_000_000
        cl.begin_time_in_lock = now
        try:
            table = cl.topic_queue_table
            # queue offsets: the next ones of each queue, in batch order
            keys, codes = b.keys, b.codes
            bases = [table.get(key, 0) for key in keys]
            if codes is None:
                qoff = b.rank + bases[0] if b.counts[0] else b.rank
            else:
                qoff = np.array(bases + [0])[codes] + b.rank
            hdr["queue_offset"] = qoff
            hdr["store_ts"] = now
            # place the records file by file; a record that does not fit goes behind a blank record
            i = 0
            try:
                mf = q.get_last_mapped_file(0)
            except OSError as e:
                err = e
            while mf is not None and err is None:
                pos = mf.wrote_position
                done = int(ends[i - 1]) if i else 0
                k = int(np.searchsorted(ends, done + mf.file_size - pos - _BLANK_MIN, side="right"))
                if k > i:
                    phys[i:k] = ends[i:k] - sizes[i:k] + (mf.file_from_offset + pos - done)
                    hdr["phys"][i:k] = phys[i:k]
                    if b.rows is not None:
                        data = memoryview(b.rows[i:k].reshape(-1))
                    else:
                        m = k - i
                        parts: list = [None] * (4 * m)
                        parts[0::4] = chop(hdr[i:k].tobytes(), _HEADER_V4.size, m)
                        parts[1::4] = b.bodies[i:k]
                        parts[2::4] = b.mids[i:k]
                        parts[3::4] = b.props[i:k]
                        data = b"".join(parts)
                    # the dispatcher's columns for these records go first: once the write moves the
                    # file's position, the dispatcher may read them (without a hint it parses them)
                    hint = hint_dispatcher(cl, b, i, k, phys, now)
                    try:
                        write_or_undo(mf, pos, data)
                    except BaseException as e:
                        if hint is not None:
                            cl.dispatch_hints.pop(hint, None)
                        if not isinstance(e, OSError):
                            raise
                        err = e
                        break
                    pos += int(ends[k - 1]) - done
                    i = k
                if i == n or (k == i and pos == 0):     # done, or it fits no file (cannot happen:
                    break                               # sizes were checked against the file size)
                try:
                    mf = cl.roll(mf, pos)
                except OSError as e:
                    err = e
            # what was appended counts in the queues
            if i:
                counts = b.counts
                if i < n:
                    counts = ([i if counts[0] else 0] if codes is None
                              else np.bincount(codes[:i], minlength=len(keys) + 1).tolist())
                for key, base, c in zip(keys, bases, counts):
                    if c:
                        table[key] = base + c
                q.store_timestamp = now
                last = q.last
                if last is not None:
                    last.store_timestamp = now
        finally:
            cl.begin_time_in_lock = 0
    status, why = _CREATE_FAILED, None
    if err is not None:
        status = _NOT_AVAILABLE
        why = f"{mf.path if mf is not None else q.store_path}: write failed: {err}"
        err = OSError(err.errno, why)
    elif i < n:
        why = q.create_failure()
    if why is not None:
        log.error("%s; messages %d to %d of the batch are not stored", why, i, n - 1)
    if cl.dispatch_hints is not None and len(cl.dispatch_hints) >= DISPATCH_HINTS_MAX // 2:
        wait_for_dispatcher(cl)
    addr, port = b.store_addr, b.store_port
    return PutMessageResults(n, i, phys, sizes, qoff, now,
                             lambda: codec.create_message_ids_v4(addr, port, phys[:i]), status, why), err

def wait_for_dispatcher(cl) -> None:
    """The dispatcher has not taken half of DISPATCH_HINTS_MAX batches: the writer and the dispatcher share
    one GIL, and a writer that always has it would leave the dispatcher parsing what it could have taken
    from hints, and consumers far behind. Sleep (without the GIL) while the dispatcher takes hints: until
    it is back under half, or it took none for DISPATCH_STALL seconds (stopped, or parsing), or for
    DISPATCH_WAIT_MAX seconds in all."""
    hints = cl.dispatch_hints
    start = last_progress = time.monotonic()
    low = len(hints)
    while len(hints) >= DISPATCH_HINTS_MAX // 2:
        time.sleep(0.0002)
        now = time.monotonic()
        if len(hints) < low:
            low, last_progress = len(hints), now
        elif now - last_progress > DISPATCH_STALL or now - start > DISPATCH_WAIT_MAX:
            return

def hint_dispatcher(cl, b: EncodedBatch, a: int, k: int, phys, now: int) -> int | None:
    """Hand the dispatcher what it would parse back from records a..k-1 of the batch (one file's run),
    keyed by the run's first offset (Dispatcher takes it only when its reput offset is there); the key,
    or None when the batch carries no dispatch columns."""
    hints = cl.dispatch_hints
    if b.dispatch is None or hints is None:
        return None
    if len(hints) >= DISPATCH_HINTS_MAX:    # the dispatcher is far behind: it parses these records, and
        return None                         # takes the hints it has (the oldest, the next it needs) first
    topic, codes, keys, uniqs = b.dispatch
    h = b.hdr[a:k]
    key = int(phys[a])
    hints[key] = codec.DispatchBatch(
        [topic], np.zeros(k - a, np.int64), h["queue_id"].astype(np.int64), phys[a:k], b.sizes[a:k],
        codes[a:k], np.full(k - a, now, np.int64), h["queue_offset"].astype(np.int64),
        h["sys_flag"].astype(np.int64), h["prepared"].astype(np.int64), keys[a:k], uniqs[a:k])
    return key
