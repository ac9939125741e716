"""A store whose consume queues (mode `cq`) or commitlog (mode `commitlog`) live on a disk that starts
failing midway (store_checks.failing_filesystem); run in a child process because a failing ext4 may answer
a later page fault with SIGBUS. Prints one JSON object per step for the parent to check.

    python tests/flush_failure_child.py cq|commitlog STORE_DIR BALLAST
"""
from __future__ import annotations

import json
import sys
import time

from rmqstore.store.format import codec
from rmqstore.store.durability.flush import FlushConsumeQueueService, GroupCommitService
from rmqstore.store.format.message import Message
from rmqstore.store.store import MessageStore
from store_checks import fill_up, small_config


T0 = time.monotonic()


def say(**kw) -> None:
    print(json.dumps({**kw, "t": round(time.monotonic() - T0, 3)}), flush=True)


def acked(r, m) -> dict:
    a = r.append_result
    return {"status": r.status.value, "offset": a.wrote_offset if a else None,
            "qoff": a.logics_offset if a else None, "msg_id": a.msg_id if a else None, "topic": m.topic,
            "queue": m.queue_id, "key": m.properties.get("KEYS"), "ts": a.store_timestamp if a else None}


def checkpoint_file(path) -> list[int]:
    with open(path / "checkpoint", "rb") as f:
        return list(codec.CHECKPOINT.unpack(f.read(codec.CHECKPOINT.size)))


def cq_mode(path, ballast) -> None:
    cfg = small_config("ASYNC_FLUSH", mappedFileSizeConsumeQueue=60000, flushIntervalConsumeQueue=3_600_000)
    store = MessageStore.open(path, cfg)
    svc = next(s for s in store.services if isinstance(s, FlushConsumeQueueService))
    msgs = [Message("TopicA", b"first %d" % i, properties={"KEYS": f"f{i}"}) for i in range(20)]
    for m, r in zip(msgs, store.put_messages(msgs)):
        say(step="put", **acked(r, m))
    store.wait_dispatched()
    svc.run_once(force=True)
    say(step="flushed", logics=store.checkpoint.logics_msg_timestamp, file=checkpoint_file(path), failed=svc.failed)
    fill_up(ballast)
    time.sleep(0.01)
    # 1500 units, 30 KB: new blocks over eight pages. The file system has 1 KiB blocks on 4 KiB pages of the
    # full tmpfs: a block beside one written before lands on a tmpfs page that exists and its writeback
    # succeeds (CI once saw no EIO at all after 400 units, two pages)
    msgs = [Message("TopicA", b"second %d" % i, properties={"KEYS": f"s{i}"}) for i in range(1500)]
    for m, r in zip(msgs, store.put_messages(msgs)):
        say(step="put", **acked(r, m))
    say(step="dispatched", ok=store.wait_dispatched(timeout=60), last_ts=store.dispatcher.last_dispatched_timestamp)
    svc.run_once(force=True)                 # the consume queue msync fails (EIO)
    say(step="failed", logics=store.checkpoint.logics_msg_timestamp, file=checkpoint_file(path), failed=svc.failed,
        write_error=store.running_flags.write_error)
    try:                                     # what a naive retry sees: the kernel reports the error only once
        store.consume_queues.flush(0)
        retry = "ok"
    except OSError as e:
        retry = f"error {e.errno}"
    svc.run_once(force=True)                 # sticky: no flush, no checkpoint move
    say(step="again", logics=store.checkpoint.logics_msg_timestamp, file=checkpoint_file(path), retry=retry)
    r = store.put_message(Message("TopicA", b"refused"))
    say(step="put_after", status=r.status.value)
    store.close()
    say(step="closed", abort=(path / "abort").exists())


def commitlog_mode(path, ballast) -> None:
    cfg = small_config("SYNC_FLUSH", syncFlushTimeout=3000)
    store = MessageStore.open(path, cfg)
    svc = next(s for s in store.services if isinstance(s, GroupCommitService))
    q = store.commit_log.queue
    for i in range(5):
        m = Message("TopicA", b"small %d" % i, properties={"KEYS": f"k{i}"})
        say(step="put", **acked(store.put_message(m), m))
    before = q.flushed_where
    say(step="flushed", flushed=before, physic=store.checkpoint.physic_msg_timestamp)
    fill_up(ballast)
    m = Message("TopicA", b"b" * 20000, properties={"KEYS": "big"})   # new pages: new blocks on the dying disk
    t0 = time.monotonic()
    r = store.put_message(m)
    say(step="failed", seconds=time.monotonic() - t0, flushed=q.flushed_where, failed=svc.failed,
        write_error=store.running_flags.write_error, physic=store.checkpoint.physic_msg_timestamp, **acked(r, m))
    svc.run_once()                           # a later round must not "succeed" over the lost data
    time.sleep(0.05)
    say(step="again", flushed=q.flushed_where, physic=store.checkpoint.physic_msg_timestamp)
    try:                                     # nor a flush_all of the user's
        store.flush_all()
        result = "ok"
    except OSError as e:
        result = f"error {e.errno}"
    say(step="flush_all", result=result, flushed=q.flushed_where, physic=store.checkpoint.physic_msg_timestamp)
    m = Message("TopicA", b"after", properties={"KEYS": "after"})
    say(step="put_after", **acked(store.put_message(m), m))
    store.close()
    say(step="closed", abort=(path / "abort").exists())


if __name__ == "__main__":
    from pathlib import Path
    mode, path, ballast = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    (cq_mode if mode == "cq" else commitlog_mode)(path, ballast)
