"""Batched consume of a whole queue range: consume queue units with numpy, bodies gathered from the commitlog
in bulk.

    from rmqstore.store.reads.batch_read import read_queue_bodies
    bodies = read_queue_bodies(store, "TopicA", 0)                       # list[bytes], in queue order
    buf, offsets = read_queue_bodies(store, "TopicA", 0, as_buffer=True)  # one bytes + int64 offsets (Arrow-style)

What `get_message` does per message (unpack a unit, find the file, copy the record, decode every field,
build a MessageExt) is done here per commitlog file on arrays: the units of the range are read as one numpy
structured array, the ones pointing into each commitlog file are checked together (record inside the file's
readable part, TOTALSIZE equal to the unit's size, a message magic code, the body inside the record: what
getMessage relies on) from their headers, fetched with one gather; the bodies are then gathered by length, as numpy void items (one memcpy each), and become bytes in
C (tolist) or one buffer; only lengths that few bodies share are sliced in Python. Units that fail a check
are skipped (`stats["skipped"]` counts them), as get_message skips a damaged unit. No message filter, no CRC check
(getMessage does not check CRCs either); properties, tags and keys are not decoded.
"""
from __future__ import annotations

import numpy as np

from ..format import codec

_BODYLEN_POS_V4 = codec.HEADER_V4.size - 4   # BODYLENGTH in a record with IPv4 hosts; +12 per IPv6 host
# A length shared by fewer bodies than this is cut one slice at a time; numpy's fixed cost per group would
# cost more than it saves.
_MIN_GROUP = 16


def _at(arr: np.ndarray, dtype, pos: np.ndarray) -> np.ndarray:
    """The dtype values starting at each byte position pos of the uint8 array arr (one gather, no copy of
    arr: a view whose items overlap, one per byte). Callers keep pos + itemsize <= len(arr)."""
    dt = np.dtype(dtype)
    if not len(pos):
        return np.empty(0, dtype=dt)
    # gathered as raw void items (a memcpy each; numpy copies a structured item field by field), then viewed
    raw = np.dtype(f"V{dt.itemsize}")
    view = np.ndarray((len(arr) - dt.itemsize + 1,), dtype=raw, buffer=arr, strides=(1,))
    return view[pos].view(dt)


def _length_runs(lens: np.ndarray):
    """The indices of the bodies ordered by length (stable: radix sort on 16-bit lengths), and (length, a, b)
    for each run order[a:b] of bodies of one length."""
    key = lens.astype(np.uint16) if int(lens.max()) < 1 << 16 else lens
    order = np.argsort(key, kind="stable")
    sl = key[order]
    bounds = np.concatenate(([0], np.flatnonzero(np.diff(sl)) + 1, [len(sl)])).tolist()
    return order, [(int(sl[a]), a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def bodies_list(arr: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> list[bytes]:
    """bytes(arr[starts[i]:starts[i] + lens[i]]) for every i, in order. Bodies of one length are gathered as
    numpy void items (a memcpy each) and become bytes in C; only lengths that few bodies share are sliced in
    Python."""
    n = len(starts)
    if n == 0:
        return []
    if lens.min() == lens.max():
        return _at(arr, f"V{int(lens[0])}", starts).tolist()
    order, runs = _length_runs(lens)
    so = starts[order]
    parts = []
    mv = memoryview(arr)
    try:
        for length, a, b in runs:
            if b - a >= _MIN_GROUP:
                parts.append(_at(arr, f"V{length}", so[a:b]).astype(object))
            else:
                part = np.empty(b - a, dtype=object)
                part[:] = [bytes(mv[x:x + length]) for x in so[a:b].tolist()]
                parts.append(part)
    finally:
        mv.release()
    out = np.empty(n, dtype=object)
    out[order] = np.concatenate(parts)
    return out.tolist()


def bodies_buffer(arr: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bodies bodies_list would cut, one after another in one uint8 array, and their int64 offsets
    (len n + 1)."""
    n = len(starts)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    out = np.empty(int(offsets[-1]), dtype=np.uint8)
    if n == 0 or not len(out):
        return out, offsets
    if lens.min() == lens.max():
        out.view(f"V{int(lens[0])}")[:] = _at(arr, f"V{int(lens[0])}", starts)
        return out, offsets
    order, runs = _length_runs(lens)
    so, do = starts[order], offsets[:-1][order]
    for length, a, b in runs:
        if not length:
            continue
        if b - a >= _MIN_GROUP:
            dst = np.ndarray((len(out) - length + 1,), dtype=f"V{length}", buffer=out, strides=(1,))
            dst[do[a:b]] = _at(arr, f"V{length}", so[a:b])
        else:
            for x, d in zip(so[a:b].tolist(), do[a:b].tolist()):
                out[d:d + length] = arr[x:x + length]
    return out, offsets


def read_queue_bodies(store, topic: str, queue_id: int, start: int = 0, end: int | None = None, *,
                      as_buffer: bool = False, stats: dict | None = None):
    """Bodies of the messages at logical offsets [start, end) of a queue (end: the queue's max offset).

    Returns a list of bytes, or with as_buffer=True (values: bytes, offsets: int64 array of len n + 1)."""
    empty = (b"", np.zeros(1, dtype=np.int64)) if as_buffer else []
    cq = store.consume_queues.find(topic, queue_id)
    if cq is None:
        return empty
    if end is None:
        end = cq.get_max_offset_in_queue()
    units = cq.units(start, end)
    offs = units["offset"].astype(np.int64)
    sizes = units["size"].astype(np.int64)
    del units
    if len(offs) == 0:
        return empty
    cl = store.commit_log
    max_py = cl.get_max_offset()
    out: list = []
    skipped = 0
    # Units are in commitlog order within a queue, so each commitlog file covers one contiguous run.
    file_idx = offs // cl.file_size
    bounds = np.flatnonzero(np.diff(file_idx)) + 1
    for a, b in zip(np.concatenate(([0], bounds)).tolist(), np.concatenate((bounds, [len(offs)])).tolist()):
        mf = cl.queue.find_mapped_file_by_offset(int(offs[a]))
        if mf is None:
            skipped += b - a
            continue
        part, bad = _file_bodies(mf, offs[a:b], sizes[a:b], max_py, as_buffer)
        out.append(part)
        skipped += bad
    if stats is not None:
        stats["skipped"] = skipped
    if not as_buffer:
        return out[0] if len(out) == 1 else [x for part in out for x in part]
    if not out:
        return empty
    values = (out[0][0] if len(out) == 1 else np.concatenate([v for v, _ in out])).tobytes()
    lens = np.concatenate([np.diff(o) for _, o in out])
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    return values, offsets


def _file_bodies(mf, o: np.ndarray, s: np.ndarray, max_py: int, as_buffer: bool):
    """The bodies of the units (commitlog offsets o, sizes s) that point into one commitlog file: (bodies
    as bodies_list / bodies_buffer cut them, how many units were skipped). getMessage's checks, column-wise:
    the unit's bytes are readable and start a message record (either magic code) whose TOTALSIZE is the
    unit's size and whose body lies inside it. Not the record scanner's whole rule (topic and properties
    lengths): RocketMQ's getMessage does not check those either, and checking them here cost ~25 %."""
    readable = mf.read_position
    pos = o - mf.file_from_offset
    ok = (pos >= 0) & (s >= codec.HEADER_V4.size) & (pos + s <= readable) & (o + s <= max_py)
    arr = np.frombuffer(mf.mm, dtype=np.uint8, count=readable)
    try:
        p, sz = pos[ok], s[ok]
        h = _at(arr, codec.header_v4_dtype(), p)
        sysflag = h["sys_flag"]
        born6 = (sysflag & codec.SYSFLAG_BORNHOST_V6) != 0
        store6 = (sysflag & codec.SYSFLAG_STOREHOST_V6) != 0
        blpos = p + _BODYLEN_POS_V4 + 12 * born6 + 12 * store6
        magic = h["magic"]
        good = ((h["total"] == sz) & ((magic == codec.MESSAGE_MAGIC_CODE) | (magic == codec.MESSAGE_MAGIC_CODE_V2))
                & (blpos + 4 <= p + sz))
        body_len = h["body_len"].astype(np.int64)
        v6 = born6 | store6      # BODYLENGTH is not where the v4 header has it: read it where it is
        if v6.any():
            w = v6 & good
            body_len[w] = _at(arr, ">i4", blpos[w])
        blpos, body_len = blpos[good], body_len[good]
        body_start = blpos + 4
        fits = (body_len >= 0) & (body_start + body_len <= p[good] + sz[good])
        skipped = int((~ok).sum()) + int((~good).sum()) + int((~fits).sum())
        cut = bodies_buffer if as_buffer else bodies_list
        part = cut(arr, body_start[fits], body_len[fits])
        del h
    finally:
        del arr
    return part, skipped


def read_topic_bodies(store, topic: str, *, as_buffer: bool = False) -> dict[int, object]:
    """read_queue_bodies for every queue of a topic: {queue_id: bodies}."""
    qids = sorted(store.consume_queues.table.get(topic, {}))
    return {q: read_queue_bodies(store, topic, q, as_buffer=as_buffer) for q in qids}
