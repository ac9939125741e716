"""Deleted consume queues: the commitlog offset below which each deleted queue's records lie.

deleteTopic (queue_clean) removes a topic's consume queues; its records stay in the commitlog. A re-dispatch
from below them (after a crash: from the dispatcher's note, the index's last entry, or after a reboot the
checkpoint's file) would build the deleted queue again, and when the topic was written again (its queue
restarts at offset 0) put the old generation's units where the new one's go: acknowledged messages unreadable.
RocketMQ keeps no record and has that fault. Here the deletion is recorded first, in
`{store}/config/deletedQueues.json` (atomic, previous content kept as .bak: config_file.string_to_file), and
the dispatcher never dispatches a deleted queue's records below the commitlog offset it had when deleted:

    {"version": 1, "queues": [{"topic": "TopicA", "queueId": 0, "below": 123456}]}

decode/encode are pure; load and record do the I/O.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FILE_NAME = "deletedQueues.json"
VERSION = 1

Deleted = dict[tuple[str, int], int]       # (topic, queue id) -> records below this commitlog offset are gone


def deleted_file(root: str | os.PathLike) -> Path:
    return Path(root) / "config" / FILE_NAME


def decode(data: Any) -> Deleted:
    """The JSON of deletedQueues.json; ValueError naming what is wrong."""
    if data is None:
        return {}
    if not isinstance(data, dict) or not isinstance(data.get("queues", []), list):
        raise ValueError(f"{FILE_NAME}: expected an object with a 'queues' list")
    out: Deleted = {}
    for i, q in enumerate(data.get("queues", [])):
        if not isinstance(q, dict):
            raise ValueError(f"{FILE_NAME}: queues[{i}] is not an object")
        topic, qid, below = q.get("topic"), q.get("queueId"), q.get("below")
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"{FILE_NAME}: queues[{i}]: topic must be a non-empty string")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (qid, below)):
            raise ValueError(f"{FILE_NAME}: queues[{i}]: queueId and below must be non-negative integers")
        out[(topic, qid)] = max(below, out.get((topic, qid), 0))
    return out


def encode(deleted: Deleted) -> str:
    queues = [{"topic": t, "queueId": q, "below": b} for (t, q), b in sorted(deleted.items())]
    return json.dumps({"version": VERSION, "queues": queues}, indent=2, ensure_ascii=False) + "\n"


def derive_from_restarts(queues) -> Deleted:
    """The deletions the commitlog itself shows, for a deletedQueues.json that is lost: a deleted queue
    written again starts over at queue offset 0, so where a queue's records (commitlog offsets and queue
    offsets, in commitlog order) go back to 0 and go on 1, 2, ... from there (or end there), everything
    before is an old generation. queues: {(topic, queue id): (offsets, queue offsets)}. Pure. A deletion
    after which the topic was not written again leaves no trace: see the caller."""
    import numpy as np
    out: Deleted = {}
    for key, (offs, qoffs) in queues.items():
        q = np.asarray(qoffs, dtype=np.int64)
        if len(q) < 2:
            continue
        zero = np.flatnonzero(q[1:] == 0) + 1                       # back to 0, not at the queue's start
        nxt = np.append(q, -1)[zero + 1]
        starts = zero[(nxt == 1) | (zero == len(q) - 1)]            # and going on 1, 2, ... (or the last)
        if len(starts):
            out[key] = int(np.asarray(offs)[starts[-1]])
    return out


def restarts(recs) -> tuple[Deleted, dict]:
    """derive_from_restarts over a commitlog scan (check_commitlog's Records): the deletions the commitlog
    shows, and each queue's (commitlog offsets, queue offsets) it derived them from."""
    names = recs.topic_names
    queues = {(names[t], q): (recs.offsets[part], recs.queue_offsets[part]) for (t, q), part in recs.by_queue().items()}
    return derive_from_restarts(queues), queues


def lacking(recorded: Deleted, derived: Deleted) -> Deleted:
    """The derived deletions a record does not hold (a later restart than its boundary, or none at all):
    the record is not complete (an older .bak, an emptied or lost file)."""
    return {k: b for k, b in derived.items() if b > recorded.get(k, -1)}


def merge(a: Deleted, b: Deleted) -> Deleted:
    """Both records' deletions, each queue at the later boundary (everything below it is deleted)."""
    out = dict(a)
    for k, v in b.items():
        out[k] = max(v, out.get(k, 0))
    return out


def load(root: str | os.PathLike, backup_ok: bool = True) -> Deleted:
    """The deletions recorded for the store at root ({} when none); falls back to the .bak copy, else
    CorruptStoreError naming the file (config_file.load_config_file). The file is never written empty:
    an empty one (with no usable .bak) is damage too, never "nothing was deleted". backup_ok=False (the
    open): a .bak is the state before the last deleteTopic, never trusted to be complete: the file
    unusable, empty or missing beside a .bak is a CorruptStoreError (check --repair merges the .bak with
    what the commitlog shows)."""
    from ...errors import CorruptStoreError
    from ..conf.config_file import _problem, backup_path, load_config_file
    f = deleted_file(root)
    if not backup_ok and backup_path(f).is_file():
        raw = f.read_bytes() if f.is_file() else b""
        why = "missing or empty" if not raw.strip() else _problem(raw, decode)
        if why is not None:
            raise CorruptStoreError(str(f), 0, f"{why}, beside its backup {backup_path(f).name}, which is the "
                                               "state before the last deleteTopic and may lack deletions; "
                                               "rmqstore check --repair derives what it lacks")
    got = load_config_file(f, decode)
    if got is None and f.is_file():
        raise CorruptStoreError(str(f), 0, "empty (deleteTopic never writes it empty: the record of which topics "
                                           "were deleted is lost); rmqstore check --repair derives it again")
    return got or {}


def record(root: str | os.PathLike, queues, below: int) -> Deleted:
    """Add deletions of queues ((topic, queue id) pairs) below one commitlog offset (a later deletion of a
    queue raises its offset); returns every deletion. Written and synced before it returns: OSError (or
    CorruptStoreError, the file unusable) when it cannot be, and then nothing may be deleted."""
    from ..conf.config_file import string_to_file
    have = load(root)
    for k in queues:
        have[k] = max(below, have.get(k, 0))
    string_to_file(encode(have), deleted_file(root), decode)
    return have
