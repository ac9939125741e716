"""Batched consume of a whole queue range: consume queue units with numpy, bodies gathered from the commitlog
in bulk.

    from rmqstore.batch_read import read_queue_bodies
    bodies = read_queue_bodies(store, "TopicA", 0)                       # list[bytes], in queue order
    buf, offsets = read_queue_bodies(store, "TopicA", 0, as_buffer=True)  # one bytes + int64 offsets (Arrow-style)

What `get_message` does per message (unpack a unit, find the file, copy the record, decode every field,
build a MessageExt) is done here per commitlog file on arrays: the units of the range are read as one numpy
structured array, the ones pointing into each commitlog file are checked together (record inside the file's
readable part, TOTALSIZE equal to the unit's size, the v1 magic code) and their BODYLENGTH fields fetched
with one fancy-indexing gather; only the body slices are cut in Python (as_buffer: joined into one
buffer from zero-copy views, one copy per body byte). Units that fail a check are skipped
(`stats["skipped"]` counts them), as get_message skips a damaged unit. No message filter, no CRC check
(getMessage does not check CRCs either); properties, tags and keys are not decoded.
"""
from __future__ import annotations

import numpy as np

from . import codec

# Offset of BODYLENGTH in a record with IPv4 born and store hosts; +12 for each IPv6 host.
_BODYLEN_POS_V4 = codec.HEADER_V4.size - 4
_FIELD4 = np.arange(4, dtype=np.int64)


def _gather_be_i4(arr: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Big-endian int32 at each byte position pos of the uint8 array arr."""
    return np.ascontiguousarray(arr[pos[:, None] + _FIELD4]).view(">i4").ravel().astype(np.int64)


def read_queue_bodies(store, topic: str, queue_id: int, start: int = 0, end: int | None = None, *,
                      as_buffer: bool = False, stats: dict | None = None):
    """Bodies of the messages at logical offsets [start, end) of a queue (end: the queue's max offset).

    Returns a list of bytes, or with as_buffer=True (values: bytes, offsets: int64 array of len n + 1)."""
    cq = store.consume_queues.find(topic, queue_id)
    if cq is None:
        return (b"", np.zeros(1, dtype=np.int64)) if as_buffer else []
    if end is None:
        end = cq.get_max_offset_in_queue()
    units = cq.units(start, end)
    offs = units["offset"].astype(np.int64)
    sizes = units["size"].astype(np.int64)
    del units
    cl = store.commit_log
    max_py = cl.get_max_offset()
    file_size = cl.file_size
    out: list = []
    pieces: list[np.ndarray] = []
    lens_all: list[np.ndarray] = []
    skipped = 0
    if len(offs) == 0:
        return (b"", np.zeros(1, dtype=np.int64)) if as_buffer else []
    # Units are in commitlog order within a queue, so each commitlog file covers one contiguous run.
    file_idx = offs // file_size
    bounds = np.flatnonzero(np.diff(file_idx)) + 1
    starts_runs = np.concatenate(([0], bounds))
    ends_runs = np.concatenate((bounds, [len(offs)]))
    for a, b in zip(starts_runs.tolist(), ends_runs.tolist()):
        o, s = offs[a:b], sizes[a:b]
        mf = cl.queue.find_mapped_file_by_offset(int(o[0]))
        if mf is None:
            skipped += b - a
            continue
        readable = mf.read_position
        pos = o - mf.file_from_offset
        ok = (pos >= 0) & (s >= codec.HEADER_V4.size) & (pos + s <= readable) & (o + s <= max_py)
        arr = np.frombuffer(mf.mm, dtype=np.uint8, count=readable)
        try:
            p = pos[ok]
            sz = s[ok]
            total = _gather_be_i4(arr, p)
            magic = _gather_be_i4(arr, p + codec.POS_MAGIC) & 0xFFFFFFFF
            sysflag = _gather_be_i4(arr, p + codec.POS_SYSFLAG)
            blpos = (p + _BODYLEN_POS_V4 + 12 * ((sysflag & codec.SYSFLAG_BORNHOST_V6) != 0)
                     + 12 * ((sysflag & codec.SYSFLAG_STOREHOST_V6) != 0))
            good = (total == sz) & (magic == codec.MESSAGE_MAGIC_CODE) & (blpos + 4 <= p + sz)
            blpos = blpos[good]
            body_len = _gather_be_i4(arr, blpos)
            body_start = blpos + 4
            fits = (body_len >= 0) & (body_start + body_len <= p[good] + sz[good])
            skipped += int((~ok).sum()) + int((~good).sum()) + int((~fits).sum())
            bs = body_start[fits]
            bl = body_len[fits]
            if as_buffer:
                # one copy of every body into one buffer: join zero-copy views of the mapped file
                if len(bs):
                    mv = memoryview(arr)
                    be = bs + bl
                    pieces.append(b"".join([mv[x:y] for x, y in zip(bs.tolist(), be.tolist())]))
                    del mv
                lens_all.append(bl)
            else:
                mm = mf.mm
                be = bs + bl
                out.extend([mm[x:y] for x, y in zip(bs.tolist(), be.tolist())])
        finally:
            del arr
    if stats is not None:
        stats["skipped"] = skipped
    if as_buffer:
        lens = np.concatenate(lens_all) if lens_all else np.zeros(0, dtype=np.int64)
        offsets = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        values = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        return values, offsets
    return out


def read_topic_bodies(store, topic: str, *, as_buffer: bool = False) -> dict[int, object]:
    """read_queue_bodies for every queue of a topic: {queue_id: bodies}."""
    qids = sorted(store.consume_queues.table.get(topic, {}))
    return {q: read_queue_bodies(store, topic, q, as_buffer=as_buffer) for q in qids}
