"""Deleted topics stay deleted (an outside audit of deleteTopic): MessageStore.delete_topic removes queues
the dispatcher has not built yet; a Spark rebuild, check --repair over a torn deletedQueues.json, key
lookups and commitlog reads never bring a deleted generation back."""
from __future__ import annotations

import os
import threading

import pytest

from rmqstore import Message, MessageBatch, MessageStore
from store_checks import run_until_sigkilled, small_config


# --- item: queues the dispatcher has not built ---------------------------------------------------------
def test_delete_topic_removes_queues_the_dispatcher_has_not_built(tmp_path):
    """A batch, then delete_topic at once while the dispatcher has not reached the batch (held at its door
    here; the audit: 200,000 messages, 39 MB behind): every queue of the topic goes, none comes back when
    the dispatcher gets there, nor after a reopen; the other topic is whole; the next put starts at 0."""
    from rmqstore.store.consumequeue.dispatch import Dispatcher
    gate, at_door = threading.Event(), threading.Event()
    orig = Dispatcher.dispatch

    def held(self, batch):
        at_door.set()
        gate.wait(30)
        return orig(self, batch)
    with MessageStore.open(tmp_path, small_config()) as s:
        assert s.put_message(Message("Keep", b"k", queue_id=0)).ok and s.wait_dispatched()
        Dispatcher.dispatch = held
        try:
            n = 20000
            assert s.put_messages(MessageBatch("TA", [b"a" * 100] * n, queue_ids=[i % 8 for i in range(n)])).all_ok
            assert all(r.ok for r in s.put_messages(MessageBatch("Keep", [b"k"] * 10, queue_ids=0)))
            assert at_door.wait(30)
            assert s.consume_queues.find("TA", 0) is None           # not built yet
            removed = s.delete_topic("TA")
        finally:
            Dispatcher.dispatch = orig
            gate.set()
        assert removed == [("TA", q) for q in range(8)]
        assert s.wait_dispatched()
        assert all(s.consume_queues.find("TA", q) is None for q in range(8))
        assert s.get_max_offset_in_queue("TA", 3) == 0
        assert s.get_max_offset_in_queue("Keep", 0) == 11
        r = s.put_message(Message("TA", b"new", queue_id=3))
        assert r.ok and r.append_result.logics_offset == 0
    with MessageStore.open(tmp_path, small_config()) as s:
        assert s.wait_dispatched()
        assert [s.get_max_offset_in_queue("TA", q) for q in range(8)] == [0, 0, 0, 1, 0, 0, 0, 0]
        assert [m.body for m in s.get_message("G", "TA", 3, 0, 8).messages] == [b"new"]
    assert sorted(os.listdir(tmp_path / "consumequeue" / "TA")) == ["3"]


_BATCH_DELETE_KILL = """
import os, signal, sys, threading
sys.path.insert(0, {tests!r})
from rmqstore import Message, MessageBatch, MessageStore
from rmqstore.store.consumequeue.dispatch import Dispatcher
from store_checks import small_config
s = MessageStore.open({root!r}, small_config())
for i in range(5):
    assert s.put_message(Message("Keep", b"k%d" % i, queue_id=0)).ok
assert s.wait_dispatched()
Dispatcher.dispatch = lambda self, batch: threading.Event().wait()      # the dispatcher falls behind for good
n = 20000
assert s.put_messages(MessageBatch("TA", [b"a" * 150] * n, queue_ids=[i % 8 for i in range(n)])).all_ok
behind = s.dispatch_behind_bytes()
removed = s.delete_topic("TA")
print(behind, len(removed), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_delete_topic_of_undispatched_messages_then_sigkill(tmp_path):
    """The audit's case with a real process: a batch the dispatcher has not reached, deleteTopic at once,
    SIGKILL: the reopen's re-dispatch crosses the whole batch, and no queue of the topic holds a message
    (before: nothing was removed and all 8 queues came back whole)."""
    root = tmp_path / "store"
    behind, removed = map(int, run_until_sigkilled(_BATCH_DELETE_KILL, root).stdout.split())
    assert behind > 3_000_000 and removed == 8
    for _ in range(2):
        with MessageStore.open(root, small_config()) as s:
            assert s.wait_dispatched()
            assert [s.get_max_offset_in_queue("TA", q) for q in range(8)] == [0] * 8
            assert s.get_max_offset_in_queue("Keep", 0) == 5
    assert not (root / "consumequeue" / "TA").exists()


_KILL_MID_DELETE = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from rmqstore import Message, MessageStore
from rmqstore.store.consumequeue.consume_queue import ConsumeQueue
from store_checks import small_config
s = MessageStore.open({root!r}, small_config())
for i in range(10):
    assert s.put_message(Message("T", b"old-%d" % i, queue_id=0)).ok
    assert s.put_message(Message("Keep", b"k-%d" % i, queue_id=0)).ok
assert s.wait_dispatched()
ConsumeQueue.destroy = lambda self: os.kill(os.getpid(), signal.SIGKILL)   # dies between record and effect
s.delete_topic("T")
"""


def test_a_deletion_a_sigkill_interrupted_is_finished_at_open(tmp_path):
    """SIGKILL inside delete_topic after the deletion is recorded and before the queue's files are removed:
    the reopen served the old messages as they were, `check` said ok, and the next put got queue offset 10.
    Now check reports the queue, the open finishes the deletion (the record first, the effect redone at
    open), the topic starts over at 0, and the other topic is whole."""
    from rmqstore.store.check.check import check_store
    root = tmp_path / "store"
    run_until_sigkilled(_KILL_MID_DELETE, root)
    assert (root / "consumequeue" / "T" / "0").is_dir()              # the effect did not happen
    report = check_store(root, small_config(), live=False)
    assert [p.path for p in report.problems] == [str(root / "consumequeue" / "T" / "0")], report.problems
    assert "deleted generation" in report.problems[0].what
    with MessageStore.open(root, small_config()) as s:
        assert s.wait_dispatched()
        assert s.get_message("G", "T", 0, 0, 32).messages == []
        assert s.get_max_offset_in_queue("T", 0) == 0
        r = s.put_message(Message("T", b"new-0", queue_id=0))
        assert r.ok and r.append_result.logics_offset == 0
        assert s.get_max_offset_in_queue("Keep", 0) == 10
    with MessageStore.open(root, small_config()) as s:
        assert [m.body for m in s.get_message("G", "T", 0, 0, 32).messages] == [b"new-0"]
    assert check_store(root, small_config(), live=False).ok


# --- item: a torn deletedQueues.json with no backup ------------------------------------------------------
@pytest.mark.parametrize("rewrite", [True, False], ids=["written-again", "deleted-only"])
def test_check_repair_never_turns_a_torn_deletion_record_into_nothing_deleted(tmp_path, rewrite):
    """deleteTopic once (its record has no .bak then), maybe the topic written again, the record torn: the
    open refuses it; check --repair moved it aside and rebuilt, and offsets 0..4 answered the deleted
    messages. Now the deletion is derived where the queue starts over at 0; a deleted queue that was not
    written again leaves no trace, and the repair refuses, naming the file and the queue (exit 2, nothing
    done)."""
    from conftest import run_cli
    from rmqstore.errors import CorruptStoreError
    root = tmp_path / "store"
    with MessageStore.open(root, small_config()) as s:
        for i in range(30):
            assert s.put_message(Message("TopicA", b"old-%d" % i, queue_id=0)).ok
            assert s.put_message(Message("TopicB", b"b-%d" % i, queue_id=1)).ok
        assert s.wait_dispatched()
        s.delete_topic("TopicA")
        for i in range(5 if rewrite else 0):
            assert s.put_message(Message("TopicA", b"new-%d" % i, queue_id=0)).ok
    f = root / "config" / "deletedQueues.json"
    assert not f.with_name(f.name + ".bak").exists()
    f.write_bytes(f.read_bytes()[:len(f.read_bytes()) // 2])          # torn
    with pytest.raises(CorruptStoreError, match="deletedQueues.json"):
        MessageStore.open(root, small_config())
    conf = tmp_path / "store.conf"
    conf.write_text(small_config().to_properties())
    r = run_cli("check", "--repair", "-c", conf, root)
    if not rewrite:
        assert r.returncode == 2, r.stdout.decode() + r.stderr.decode()
        err = r.stderr.decode().strip().splitlines()
        assert len(err) == 1 and str(f) in err[0] and "TopicA/0 (30 messages)" in err[0], err
        assert f.read_bytes().startswith(b"{") and len(list(f.parent.glob("*.corrupt-*"))) == 0   # untouched
        return
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()
    assert "written again from where queues start over" in r.stdout.decode()
    with MessageStore.open(root, small_config()) as s:
        got = s.get_message("G", "TopicA", 0, 0, 32)
        assert [m.body for m in got.messages] == [b"new-%d" % i for i in range(5)]
        assert s.get_max_offset_in_queue("TopicB", 1) == 30
        r = s.put_message(Message("TopicA", b"next", queue_id=0))
        assert r.ok and r.append_result.logics_offset == 5
    assert run_cli("check", "-c", conf, root).returncode == 0


def _two_deletions(root, delete_b: bool):
    """TopicA deleted twice (5 + 5 messages), written again (3); TopicB (4) deleted and not written again
    when delete_b. The record's .bak is then the state before the last deleteTopic."""
    with MessageStore.open(root, small_config()) as s:
        for gen in range(2):
            for i in range(5):
                assert s.put_message(Message("TopicA", b"A-gen%d-%d" % (gen, i), queue_id=0)).ok
            assert s.wait_dispatched()
            s.delete_topic("TopicA")
        for i in range(4 if delete_b else 0):
            assert s.put_message(Message("TopicB", b"B-old-%d" % i, queue_id=0)).ok
        if delete_b:
            assert s.wait_dispatched()
            s.delete_topic("TopicB")
        for i in range(3):
            assert s.put_message(Message("TopicA", b"A-live-%d" % i, queue_id=0)).ok
    return root / "config" / "deletedQueues.json"


@pytest.mark.parametrize("damage", ["torn", "empty", "missing"])
def test_a_backup_or_a_lost_record_never_brings_a_deleted_generation_back(tmp_path, damage):
    """The record damaged after a second deleteTopic: check --repair restored the .bak (the state before
    it) and the middle generation answered at offsets 0..4 (or, emptied or removed, it read as "nothing
    deleted"). Now the open and rebuild refuse it, check reports it, and --repair merges what is readable
    with the last restart the commitlog shows: only the live generation answers, at 0..2."""
    from conftest import run_cli
    from rmqstore.errors import CorruptStoreError
    from rmqstore.store.check.check import check_store
    root = tmp_path / "store"
    f = _two_deletions(root, delete_b=False)
    assert f.with_name(f.name + ".bak").is_file()
    {"torn": lambda: f.write_bytes(f.read_bytes()[:40]), "empty": lambda: f.write_bytes(b""),
     "missing": f.unlink}[damage]()
    with pytest.raises(CorruptStoreError, match="deletedQueues.json"):
        MessageStore.open(root, small_config())
    assert any(p.path == str(f) for p in check_store(root, small_config(), live=False).problems)
    conf = tmp_path / "store.conf"
    conf.write_text(small_config().to_properties())
    r = run_cli("rebuild", "-c", conf, root)
    assert r.returncode == 2 and str(f) in r.stderr.decode(), r.stderr.decode()
    assert (root / "consumequeue" / "TopicA" / "0").is_dir()           # refused before anything was removed
    r = run_cli("check", "--repair", "-c", conf, root)
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()
    for _ in range(2):                                                  # repaired, then rebuilt
        with MessageStore.open(root, small_config()) as s:
            assert [m.body for m in s.get_message("G", "TopicA", 0, 0, 32).messages] == \
                [b"A-live-%d" % i for i in range(3)]
        assert run_cli("check", "-c", conf, root).returncode == 0
        assert run_cli("rebuild", "-c", conf, root).returncode == 0


def test_a_repair_from_a_backup_refuses_naming_a_queue_it_would_bring_back(tmp_path):
    """The record torn after TopicB's deletion, its .bak from before it: check --repair said "restored from
    deletedQueues.json.bak", exited 0 and TopicB's deleted messages answered again (a deletion not followed
    by a write leaves no trace in the commitlog). Now it refuses (exit 2) naming the file and TopicB/0,
    changing nothing."""
    from conftest import run_cli
    root = tmp_path / "store"
    f = _two_deletions(root, delete_b=True)
    before = f.read_bytes()[:60]
    f.write_bytes(before)
    conf = tmp_path / "store.conf"
    conf.write_text(small_config().to_properties())
    r = run_cli("check", "--repair", "-c", conf, root)
    assert r.returncode == 2, r.stdout.decode() + r.stderr.decode()
    err = [ln for ln in r.stderr.decode().splitlines() if "WARNING" not in ln]
    assert len(err) == 1 and str(f) in err[0] and "TopicB/0 (4 messages)" in err[0], err
    assert f.read_bytes() == before and not list(f.parent.glob("*.corrupt-*"))
    assert not (root / "consumequeue" / "TopicB").exists()


def test_deletions_derived_from_restarts_are_pure():
    from rmqstore.store.consumequeue.deleted_queues import derive_from_restarts
    q = {("A", 0): ([0, 10, 20, 30, 40], [0, 1, 2, 0, 1]),          # restarts at 30
         ("A", 1): ([0, 10, 20, 30], [0, 1, 0, 1]),                  # ... at 20
         ("B", 0): ([0, 10, 20], [0, 1, 2]),                         # never
         ("C", 0): ([0, 10, 20, 30], [5, 6, 0, 8]),                  # a damaged QUEUEOFFSET, no restart
         ("D", 0): ([0, 10, 20], [0, 1, 0]),                         # one new message at the end
         ("E", 0): ([0, 10, 20, 30, 40], [0, 0, 1, 0, 1])}           # two deletions: the last counts
    assert derive_from_restarts(q) == {("A", 0): 30, ("A", 1): 20, ("D", 0): 20, ("E", 0): 30}


# --- item: reads of a deleted generation ---------------------------------------------------------------
def test_key_and_id_lookups_never_answer_a_deleted_generation(tmp_path, caplog):
    """The index keeps a deleted generation's keys: key lookups answered the deleted message beside the live
    one and logged 'a damaged header' for it (an outside audit). They answer the live one only, quietly;
    a deleted message's id answers nothing; the read-only reader (`rmqstore query`) agrees."""
    from conftest import run_cli
    with MessageStore.open(tmp_path, small_config()) as s:
        old = [s.put_message(Message("TopicA", b"old-%d" % i, queue_id=0, properties={"KEYS": f"k{i}"}))
               for i in range(10)]
        assert s.wait_dispatched()
        s.delete_topic("TopicA")
        new = s.put_message(Message("TopicA", b"new-0", queue_id=0, properties={"KEYS": "k0"}))
        assert s.wait_dispatched()
        with caplog.at_level("WARNING"):
            assert [m.body for m in s.find_messages_by_key("TopicA", "k0")] == [b"new-0"]
            assert s.find_messages_by_key("TopicA", "k3") == []
            assert s.view_message_by_id(old[0].append_result.msg_id) is None
            assert s.view_message_by_id(new.append_result.msg_id).body == b"new-0"
            assert [m.body for m in s.query_message("TopicA", "k0", 32).messages] == [b"new-0"]
        assert not [r for r in caplog.records if "damaged" in r.getMessage()], caplog.text
    conf = tmp_path.parent / f"{tmp_path.name}.conf"
    conf.write_text(small_config().to_properties())
    r = run_cli("query", "-c", conf, tmp_path, "TopicA", "k0")
    assert r.returncode == 0 and r.stdout.count(b'"queueOffset"') == 1 and b"new-0".hex().encode() in r.stdout, \
        r.stdout


def test_a_deleted_queues_files_go_before_its_next_generation_is_written(tmp_path):
    """Found by deleteTopic under load with SIGKILLs: the old consume queue's files were deleted after the
    locks were released, so the topic written again at once could have its new queue's first file (the same
    name) deleted by the old queue's destroy: acknowledged messages unreadable, 'its head is lost'. The
    old queue's destroy is held here until the new message is dispatched (or 2 s)."""
    from rmqstore.store.consumequeue.consume_queue import ConsumeQueue
    from store_checks import wait_until
    new_unit = threading.Event()
    orig = ConsumeQueue.destroy

    def slow_destroy(self):
        if self.topic == "A":
            new_unit.wait(2)
        return orig(self)
    with MessageStore.open(tmp_path, small_config()) as s:
        for i in range(10):
            assert s.put_message(Message("A", b"old-%d" % i, queue_id=0)).ok
        assert s.wait_dispatched()
        ConsumeQueue.destroy = slow_destroy
        try:
            t = threading.Thread(target=s.delete_topic, args=("A",))
            t.start()
            assert wait_until(lambda: ("A", 0) in s.dispatcher.deleted, 10)
            for i in range(35):             # more than a consume queue file (30 units) holds
                assert s.put_message(Message("A", b"new-%d" % i, queue_id=0)).ok
            wait_until(lambda: s.get_max_offset_in_queue("A", 0) == 35, 1)
            new_unit.set()
            t.join(10)
        finally:
            ConsumeQueue.destroy = orig
        assert s.wait_dispatched()
    with MessageStore.open(tmp_path, small_config()) as s:
        bodies, at = [], 0
        while at < 35:
            r = s.get_message("G", "A", 0, at, 16)
            bodies += [m.body for m in r.messages]
            assert r.next_begin_offset > at, r.status
            at = r.next_begin_offset
        assert bodies == [b"new-%d" % i for i in range(35)]


def test_a_remote_copy_knows_its_deleted_queues(tmp_path):
    """A store read by URI (here fsspec's memory://) carries its deletedQueues.json to the reads as a local one
    does; an unusable one with no backup is refused naming it."""
    fsspec = pytest.importorskip("fsspec")
    import pyarrow.fs as pafs
    from rmqstore.errors import CorruptStoreError
    from rmqstore.store.recovery import view as V
    root = tmp_path / "store"
    with MessageStore.open(root, small_config()) as s:
        for i in range(5):
            assert s.put_message(Message("A", b"old-%d" % i, queue_id=1)).ok
        s.delete_topic("A")
        assert s.put_message(Message("A", b"new", queue_id=1)).ok
    mem = pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem("memory")))
    pafs.copy_files(str(root), "/w36-del/b/store", source_filesystem=pafs.LocalFileSystem(), destination_filesystem=mem)
    try:
        from rmqstore.store.consumequeue import deleted_queues
        assert V.load_view("memory://w36-del/b/store").deleted == deleted_queues.load(root) != {}
        fsspec.filesystem("memory").pipe("/w36-del/b/store/config/deletedQueues.json", b'{"queues": [')
        with pytest.raises(CorruptStoreError, match="deletedQueues.json"):
            V.load_view("memory://w36-del/b/store")
    finally:
        fsspec.filesystem("memory").rm("/w36-del", recursive=True)
