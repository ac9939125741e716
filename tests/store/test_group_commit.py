"""GroupCommitService (SYNC_FLUSH): a put returns True only once its bytes are flushed, and every waiting
put returns: at once after a failed flush, and at shutdown.

Most tests drive the real service over a fake commitlog queue whose flush the test controls (how far it
gets, or that it fails with EIO), with a sync flush timeout far longer than the tests wait, so a put that
only came back by timing out counts as one that never returned. No timing is asserted.
"""
from __future__ import annotations

import errno
import tempfile
import threading
import time
import types

import pytest

from rmqstore.store.conf.config import SYNC_FLUSH, StoreConfig
from rmqstore.store.durability.flush import GroupCommitService
from rmqstore.store.state.lock import AbortFile
from rmqstore.store.format.message import Message, PutMessageStatus
from rmqstore.store.store import MessageStore, RunningFlags

NEVER = 600_000          # sync flush timeout (ms) no test waits for
JOIN = 20.0              # seconds a put may take to come back before the test calls it stuck


class FakeQueue:
    """The commitlog queue as flush_commit_log sees it: bytes up to `written`, a flush reaches `limit`."""

    def __init__(self):
        self.written = 0
        self.limit = 0
        self.flushed_where = 0
        self.store_timestamp = 0
        self.fail: OSError | None = None
        self.flush_calls = 0

    def get_max_offset(self) -> int:
        return self.written

    def flush(self, least_pages: int = 0) -> bool:
        self.flush_calls += 1
        if self.fail is not None:
            raise self.fail
        before = self.flushed_where
        self.flushed_where = max(before, min(self.written, self.limit))
        return self.flushed_where == before


def _service(timeout_ms: int = NEVER):
    q = FakeQueue()
    cfg = StoreConfig(flush_disk_type=SYNC_FLUSH, sync_flush_timeout=timeout_ms)
    store = types.SimpleNamespace(commit_log=types.SimpleNamespace(queue=q), config=cfg, path="fake",
                                  checkpoint=types.SimpleNamespace(physic_msg_timestamp=0),
                                  running_flags=RunningFlags(), abort_file=AbortFile(tempfile.mkdtemp()))
    svc = GroupCommitService(store)
    return svc, q


class Put(threading.Thread):
    """One put's wait: on_appended(offset); records the answer and flushed_where the moment it came back."""

    def __init__(self, svc: GroupCommitService, q: FakeQueue, offset: int):
        super().__init__(daemon=True)
        self.svc, self.q, self.offset = svc, q, offset
        self.result: bool | None = None
        self.flushed_at_return = -1

    def run(self):
        r = self.svc.on_appended(self.offset)
        self.flushed_at_return = self.q.flushed_where
        self.result = r


def _waiting(svc: GroupCommitService, n: int) -> None:
    """Until n puts have queued their requests (with the service thread stopped nothing takes them)."""
    deadline = time.monotonic() + JOIN
    while len(svc._requests) + len(svc._pending) < n:
        assert time.monotonic() < deadline, "puts did not queue"
        time.sleep(0.001)


def _settle(puts, expect_done) -> None:
    deadline = time.monotonic() + JOIN
    for p in expect_done:
        p.join(max(0.0, deadline - time.monotonic()))
        assert not p.is_alive(), f"put of offset {p.offset} never returned"
    time.sleep(0.05)        # room for a put that should still wait to come back wrongly


def test_woken_put_returns_only_when_its_own_bytes_are_flushed():
    """Flushes that reach only part of the waiting puts' bytes: exactly the covered puts return (True),
    each with flushed_where >= its offset when it returned; the others go on waiting."""
    svc, q = _service()
    offsets = [100 * (i + 1) for i in range(12)]
    q.written = offsets[-1]
    svc.start()
    try:
        puts = [Put(svc, q, o) for o in offsets]
        for p in puts:
            p.start()
        for limit in (0, 150, 150, 420, 900, 1199, 1200):
            q.limit = limit
            svc.wakeup()
            done = [p for p in puts if p.offset <= limit]
            _settle(puts, done)
            for p in puts:
                if p.offset <= limit:
                    assert p.result is True and p.flushed_at_return >= p.offset
                else:
                    assert p.is_alive() and p.result is None, f"offset {p.offset} returned at flushed {limit}"
        assert all(p.result is True for p in puts)
    finally:
        svc.shutdown()


def test_put_already_flushed_returns_at_once_without_a_request():
    svc, q = _service()
    q.written = q.limit = q.flushed_where = 500
    assert svc.on_appended(500) is True
    assert not svc._requests


def test_failed_flush_answers_every_waiting_put_and_later_ones_at_once():
    """A flush fails (EIO): every waiting put returns False (not after the timeout: the timeout here is
    ten minutes), flushed_where stays, the store refuses puts, and a later put returns False without a
    flush round; the service never flushes again."""
    svc, q = _service()
    q.written, q.limit = 1000, 300
    svc.start()
    try:
        first = Put(svc, q, 300)
        first.start()
        _settle([first], [first])
        assert first.result is True
        q.fail = OSError(errno.EIO, "Input/output error")
        puts = [Put(svc, q, 300 + 50 * (i + 1)) for i in range(10)]
        for p in puts:
            p.start()
        _settle(puts, puts)
        assert all(p.result is False for p in puts)
        assert q.flushed_where == 300 and svc.failed and svc.failures == 1
        assert not svc.parts.running_flags.writeable
        q.fail, q.limit = None, 1000      # the next msync would "succeed": it must not be used
        calls = q.flush_calls
        late = Put(svc, q, 1000)
        late.start()
        _settle([late], [late])
        assert late.result is False and q.flushed_where == 300
        svc.wakeup()
        time.sleep(0.05)
        assert q.flush_calls == calls
    finally:
        svc.shutdown()


def test_shutdown_answers_every_waiting_put():
    """Puts waiting for bytes the last flush cannot reach return False at shutdown, those it reaches True;
    a put after shutdown returns at once."""
    svc, q = _service()
    q.written, q.limit = 1000, 0
    svc.start()
    puts = [Put(svc, q, 100 * (i + 1)) for i in range(10)]
    for p in puts:
        p.start()
    _waiting(svc, len(puts))
    q.limit = 550                          # what the last round's flush reaches
    svc._stop.set()                        # the round that runs next is the last one
    svc.shutdown()
    _settle(puts, puts)
    for p in puts:
        assert p.result is (p.offset <= 550) and (not p.result or p.flushed_at_return >= p.offset)
    after = Put(svc, q, 1000)
    after.start()
    _settle([after], [after])
    assert after.result is False


def test_request_queued_while_the_flusher_is_stopped_is_taken_by_the_next_round():
    """A put whose request arrives while no round is running (service started later) is answered by the
    first round that covers it; run_once called beside the thread (as the failure test does) is safe."""
    svc, q = _service()
    q.written = q.limit = 700
    p = Put(svc, q, 700)
    p.start()
    _waiting(svc, 1)
    assert svc.run_once() is True
    _settle([p], [p])
    assert p.result is True and p.flushed_at_return >= 700


def test_timeout_without_a_flusher_answers_false():
    svc, q = _service(timeout_ms=50)
    q.written = 100
    p = Put(svc, q, 100)
    p.start()
    _settle([p], [p])
    assert p.result is False


@pytest.mark.parametrize("threads", [1, 16])
def test_sync_flush_store_puts_are_flushed_when_acknowledged(tmp_path, threads):
    """A real store, SYNC_FLUSH, many producer threads: every put answers PUT_OK and, when it does, the
    commitlog is flushed past its record."""
    cfg = StoreConfig(flush_disk_type=SYNC_FLUSH, mapped_file_size_commit_log=1 << 16, sync_flush_timeout=NEVER)
    errors: list[str] = []
    with MessageStore.open(tmp_path / "s", cfg) as store:
        q = store.commit_log.queue

        def producer(t: int):
            for i in range(40):
                r = store.put_message(Message("TopicA", b"x" * (50 + 37 * (i % 7)), queue_id=t % 4,
                                              properties={"KEYS": f"k{t}-{i}"}))
                flushed = q.flushed_where
                a = r.append_result
                if r.status is not PutMessageStatus.PUT_OK:
                    errors.append(f"{t}/{i}: {r.status}")
                elif flushed < a.wrote_offset + a.wrote_bytes:
                    errors.append(f"{t}/{i}: acknowledged at flushed {flushed} < {a.wrote_offset + a.wrote_bytes}")

        ths = [threading.Thread(target=producer, args=(t,), daemon=True) for t in range(threads)]
        for th in ths:
            th.start()
        for th in ths:
            th.join(120)
            assert not th.is_alive()
        assert not errors, errors[:5]
        svc = next(s for s in store.services if isinstance(s, GroupCommitService))
        assert 0 < svc.flushes <= 40 * threads


def test_put_message_from_many_threads_is_combined_and_durable_on_return(tmp_path):
    """SYNC_FLUSH put_message from 8 threads: the flusher appends the queued messages together and flushes
    once for them (fewer flushes than puts); every put answers PUT_OK only once its bytes are flushed, in
    queue order per thread, and everything reads back."""
    cfg = StoreConfig(flush_disk_type=SYNC_FLUSH, mapped_file_size_commit_log=1 << 20)
    threads, per = 8, 150
    errors: list[str] = []
    results: list[list] = [[] for _ in range(threads)]
    with MessageStore.open(tmp_path / "s", cfg) as store:
        q = store.commit_log.queue

        def job(i: int) -> None:
            for j in range(per):
                r = store.put_message(Message("T", f"{i}-{j}".encode(), queue_id=i % 4))
                if r.status is not PutMessageStatus.PUT_OK:
                    errors.append(f"{i}-{j}: {r.status}")
                    continue
                a = r.append_result
                if q.flushed_where < a.wrote_offset + a.wrote_bytes:
                    errors.append(f"{i}-{j} answered PUT_OK before its flush")
                results[i].append(a)

        ths = [threading.Thread(target=job, args=(i,)) for i in range(threads)]
        for t in ths:
            t.start()
        for t in ths:
            t.join(60)
        assert not errors, errors[:5]
        gc = store.group_commit
        assert gc.combined == threads * per
        assert gc.flushes < threads * per
        for i, rs in enumerate(results):
            assert [a.wrote_offset for a in rs] == sorted(a.wrote_offset for a in rs)
            for j, a in enumerate(rs):
                assert store.look_message_by_offset(a.wrote_offset).body == f"{i}-{j}".encode()
        assert store.wait_dispatched()
        assert sum(store.get_max_offset_in_queue("T", k) for k in range(4)) == threads * per


def test_put_message_when_the_flusher_is_stuck_keeps_the_message_and_answers_flush_disk_timeout(tmp_path):
    """A flush round that does not come back (a hung fsync; here the round's own lock is held): a combined
    put waits syncFlushTimeout, then appends its message itself and answers FLUSH_DISK_TIMEOUT with where it
    was written, as RocketMQ's group commit does; once the flusher is back, puts are durable again."""
    cfg = StoreConfig(flush_disk_type=SYNC_FLUSH, sync_flush_timeout=300, mapped_file_size_commit_log=1 << 20)
    with MessageStore.open(tmp_path / "s", cfg) as store:
        gc = store.group_commit
        assert store.put_message(Message("T", b"first", queue_id=0)).status is PutMessageStatus.PUT_OK
        with gc._run_lock:
            t0 = time.monotonic()
            r = store.put_message(Message("T", b"second", queue_id=0))
            waited = time.monotonic() - t0
        assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
        assert 0.25 <= waited < 5
        assert store.look_message_by_offset(r.append_result.wrote_offset).body == b"second"
        r3 = store.put_message(Message("T", b"third", queue_id=0))
        assert r3.status is PutMessageStatus.PUT_OK
        a = r3.append_result
        assert store.commit_log.queue.flushed_where >= a.wrote_offset + a.wrote_bytes
        assert store.wait_dispatched()
        assert store.get_max_offset_in_queue("T", 0) == 3


def test_one_producer_thread_flushes_inline_without_a_hand_off(tmp_path):
    """Issue 20: with no round running, a SYNC_FLUSH put leads one in its own thread (appends, fdatasyncs,
    answers) instead of handing its message to the flusher thread and sleeping until that thread's round;
    answers stay true (PUT_OK only once flushed)."""
    cfg = StoreConfig(flush_disk_type=SYNC_FLUSH, mapped_file_size_commit_log=1 << 20)
    with MessageStore.open(tmp_path / "s", cfg) as store:
        q = store.commit_log.queue
        flushed_by: list[str] = []
        real_flush = q.flush

        def recording_flush(least_pages: int = 0):
            flushed_by.append(threading.current_thread().name)
            return real_flush(least_pages)

        q.flush = recording_flush
        time.sleep(0.05)                   # let the flusher thread settle into its wait
        flushed_by.clear()
        me = threading.current_thread().name
        n = 300                            # ~50 ms: several of the flusher's 10 ms timer wake-ups
        for i in range(n):
            r = store.put_message(Message("T", f"m{i}".encode(), queue_id=0))
            assert r.status is PutMessageStatus.PUT_OK
            assert q.flushed_where >= r.append_result.wrote_offset + r.append_result.wrote_bytes
        # every put led its round and flushed in its own thread: the flusher thread's timer wake-ups find
        # nothing waiting and nothing unflushed and take no round (a round of theirs holding the lock at a
        # put's moment made that put queue and be handed off: ~1.5 % of puts, 7 % of the time)
        assert store.group_commit.led == n
        assert flushed_by == [me] * n, set(flushed_by)
        assert store.group_commit.combined == n
        assert store.wait_dispatched()
        assert store.get_max_offset_in_queue("T", 0) == n
