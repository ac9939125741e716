"""Nothing stops silently (rmqstore issue 15; issue 16 item 3): one failure channel every I/O service
reports to; wait_dispatched and close return promptly with the reason when dispatch cannot progress."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from rmqstore.store.conf.config import StoreConfig
from rmqstore.store.state.failure import FailureChannel, FailureKind
from rmqstore.store.format.message import Message, PutMessageStatus
from rmqstore.store.store import MessageStore, StoreDispatchError
from store_checks import small_filesystem


def _cfg(**kw) -> StoreConfig:
    return StoreConfig(mapped_file_size_commit_log=1 << 20, max_hash_slot_num=1024, max_index_num=4096, **kw)


def test_channel_keeps_typed_failures_and_wakes_waiters():
    ch = FailureChannel()
    woke = []
    v0 = ch.version
    t = threading.Thread(target=lambda: woke.append(ch.wait(5, since=v0)))
    t.start()
    f = ch.report(FailureKind.CORRUPT_RECORD, "bad CRC", path="/s/commitlog/0", offset=10, end=20)
    t.join(5)
    assert woke and woke[0] > v0
    assert ch.failures() == [f] and ch.failures(FailureKind.WRITE) == []
    assert "CORRUPT_RECORD" in str(f) and "/s/commitlog/0" in str(f) and "10..20" in str(f)
    # conditions: in force until cleared, recorded once per distinct reason
    ch.raise_condition("w", FailureKind.DISPATCH, "disk full", errno=28)
    ch.raise_condition("w", FailureKind.DISPATCH, "disk full", errno=28)
    assert [b.reason for b in ch.blocking()] == ["disk full"] and len(ch.failures(FailureKind.DISPATCH)) == 1
    ch.clear_condition("w")
    assert ch.blocking() == [] and ch.count == 2


def _block_queue_dir(path: Path, topic: str) -> None:
    """A file where the topic's consume queue directory belongs: every write of that queue fails."""
    (path / "consumequeue").mkdir(parents=True, exist_ok=True)
    (path / "consumequeue" / topic).write_bytes(b"not a directory")


def test_wait_dispatched_and_close_are_prompt_when_dispatch_cannot_progress(tmp_path):
    path = tmp_path / "s"
    s = MessageStore.open(path, _cfg())
    closed = False
    try:
        _block_queue_dir(path, "Blocked")
        r = s.put_message(Message("Blocked", b"x"))
        assert r.ok
        t0 = time.monotonic()
        assert s.wait_dispatched(timeout=20) is False
        assert time.monotonic() - t0 < 3
        stuck = s.failures.blocking()
        assert stuck and stuck[0].kind is FailureKind.DISPATCH and "Blocked" in stuck[0].reason
        assert s.dispatcher.write_error == stuck[0].reason      # the old string view still works
        with pytest.raises(StoreDispatchError, match="Blocked"):
            s.wait_dispatched(timeout=20, raise_on_failure=True)
        t0 = time.monotonic()
        s.close()
        closed = True
        assert time.monotonic() - t0 < 5
        assert (path / "abort").exists()        # not everything was dispatched: the next open recovers
    finally:
        if not closed:
            s.close()
    os.remove(path / "consumequeue" / "Blocked")
    with MessageStore.open(path, _cfg()) as s:  # repaired: the message reaches its queue
        assert s.wait_dispatched(timeout=10)
        got = s.get_message("g", "Blocked", 0, 0, 1)
        assert got.messages and got.messages[0].body == b"x"


def test_failed_commitlog_write_is_on_the_channel(tmp_path):
    mnt = tmp_path / "mnt"
    with small_filesystem(mnt, 8):
        # no services: no cleanup refusing puts before the disk is really full
        s = MessageStore.open(mnt / "s", _cfg(), start_services=False)
        try:
            statuses = set()
            for i in range(400):
                r = s.put_messages([Message("T", os.urandom(2000)) for _ in range(20)])
                statuses |= {x.status for x in r}
                if PutMessageStatus.PUT_OK not in {x.status for x in r}:
                    break
            assert statuses - {PutMessageStatus.PUT_OK}, statuses
            writes = s.failures.failures(FailureKind.WRITE)
            assert writes, s.failures.failures()
            assert s.running_flags.write_error is not None
        finally:
            s.close()
