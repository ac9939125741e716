"""The fast open (issue 39): what the store verified is recorded at close (store/recovery/verified_state.py), a clean
open re-checks only what changed, the background check (store/check/background_check.py) checks the rest once the
store serves.

The promises kept: damage in a file the fast open does not read (an old consume queue file, a commitlog
record, its stat unchanged: bit rot) is found by the background check, reported on the failure channel
with file and offset, and repaired, while reads never answer a wrong message meanwhile; a file changed
while the store was closed (touched back to its old mtime, copied in, cut short) is never trusted; after
SIGKILL only what was written since the record is walked, and damage there is found at open as before.
Real files, real child processes killed with SIGKILL.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rmqstore.store.check import background_check
from rmqstore.store.format import codec
from rmqstore.store.recovery import verified_state
from rmqstore.store.check.check import check_store
from rmqstore.store.conf.config import StoreConfig
from rmqstore.store.state.failure import FailureKind
from rmqstore.store.format.message import GetMessageStatus, Message
from rmqstore.store.recovery.recovery import read_inputs
from rmqstore.store.store import MessageStore

CL_FILE = 64 * 1024
PER_CQ_FILE = 40
TOPICS = ("TopicA", "TopicB")
QUEUES = 2
N = 1200


def _cfg() -> StoreConfig:
    return StoreConfig(mapped_file_size_commit_log=CL_FILE, mapped_file_size_consume_queue=20 * PER_CQ_FILE,
                       max_hash_slot_num=256, max_index_num=1024)


def _body(topic: str, i: int) -> bytes:
    return f"{topic}-{i:05d}-".encode() + bytes([i % 251]) * (30 + i % 40)


def _put(s: MessageStore, start: int, n: int) -> None:
    for i in range(start, start + n):
        t = TOPICS[i % 2]
        r = s.put_message(Message(t, _body(t, i // 2), properties={"KEYS": f"k{i}", "TAGS": "x"},
                                  queue_id=(i // 2) % QUEUES))
        assert r.ok, r
    assert s.wait_dispatched(30)


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    """A store of N messages (two topics, two queues each: 8 consume queue files per queue, 4 commitlog
    files), closed cleanly: its verified-state record written."""
    path = tmp_path / "s"
    with MessageStore.open(path, _cfg()) as s:
        _put(s, 0, N)
    assert (path / verified_state.RECORD_NAME).is_file()
    return path


def _expected(topic: str, q: int, off: int) -> bytes:
    return _body(topic, off * QUEUES + q)


def _cq(path: Path, topic: str, q: int, file_no: int) -> Path:
    return path / "consumequeue" / topic / str(q) / f"{file_no * PER_CQ_FILE * 20:020d}"


def _rel(path: Path, p: Path) -> str:
    return str(p.relative_to(path))


def _restamp(path: Path, p: Path) -> None:
    """Make the record vouch for p as it is now: damage under an unchanged stat (bit rot, a stray write the
    stat does not show), which only reading the bytes finds."""
    state = verified_state.load(path)
    rel = _rel(path, p)
    e = state.files[rel]
    st = os.stat(p)
    files = dict(state.files)
    files[rel] = verified_state.FileEntry(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, e.begin, e.end,
                                          e.crc)
    verified_state.save(path, verified_state.VerifiedState(files))


def _point_unit_at(path: Path, topic: str, q: int, off: int, offset: int, size: int) -> Path:
    """Rewrite unit `off` of a queue to point at another record (a valid record of another queue)."""
    p = _cq(path, topic, q, off // PER_CQ_FILE)
    with open(p, "r+b") as f:
        f.seek((off % PER_CQ_FILE) * 20)
        f.write(codec.CQ_UNIT.pack(offset, size, 0)[:12])
    return p


def _read(s: MessageStore, topic: str, q: int, off: int) -> list:
    """get_message of one offset: whatever it answers is the right message for its own queue offset (a
    removed message, a filler unit, answers the next one)."""
    got = s.get_message("g", topic, q, off, 1).messages
    for m in got:
        assert (m.topic, m.queue_id, m.body) == (topic, q, _expected(topic, q, m.queue_offset)), m
        assert m.queue_offset >= off
    return got


def _assert_right_or_absent(s: MessageStore, topic: str, q: int, off: int) -> None:
    _read(s, topic, q, off)


def _read_queue(s: MessageStore, t: str, q: int, n: int) -> list:
    """The messages of queue offsets 0..n, batch by batch, each batch FOUND."""
    got, off = [], 0
    while off < n:
        r = s.get_message("g", t, q, off, 32)
        assert r.status == GetMessageStatus.FOUND, (t, q, off, r.status)
        got += r.messages
        off = r.next_begin_offset
    return got


def _assert_all_readable(s: MessageStore) -> None:
    for t in TOPICS:
        for q in range(QUEUES):
            n = s.get_max_offset_in_queue(t, q)
            assert n == N // 2 // QUEUES
            assert [m.body for m in _read_queue(s, t, q, n)] == [_expected(t, q, i) for i in range(n)]


def _gate_background_check(monkeypatch) -> threading.Event:
    """Hold the background check before its first step until the event is set (the store serves meanwhile)."""
    go = threading.Event()
    real = background_check.BackgroundCheckService.check_commitlog

    def gated(self):
        assert go.wait(60)
        real(self)
    monkeypatch.setattr(background_check.BackgroundCheckService, "check_commitlog", gated)
    return go


# --- the clean open ------------------------------------------------------------------------------------
def test_clean_open_reads_nothing_the_record_vouches_for(store_dir: Path):
    files = [p for p in store_dir.rglob("*") if p.is_file() and p.name.isdigit()]
    with MessageStore.open(store_dir, _cfg()) as s:
        rep = s.recovery_report
        end = s.commit_log.get_max_offset()
        assert rep.verified_files == len(files), rep.summary()
        assert rep.commitlog_checked_from == rep.commitlog_end == end       # nothing walked
        assert not rep.dropped
        # what RocketMQ's rule walks after a clean shutdown (the last three files) is the background's
        assert rep.deferred_crc == [((end // CL_FILE - 2) * CL_FILE, end)], rep.summary()
        svc = s.service(background_check.NAME)
        assert svc.wait(60) and svc.result.finished
        assert svc.result.problems == []
        assert svc.result.crc_bytes == end - (end // CL_FILE - 2) * CL_FILE
        assert svc.result.units == N                  # every unit, against its record
        assert svc.result.index_files == len(list((store_dir / "index").iterdir())) - 1
        _assert_all_readable(s)
    # the record is rewritten at every clean close: the next open trusts it again
    assert read_inputs(store_dir).verified.keys() == {_rel(store_dir, p) for p in files}


def test_record_is_ignored_after_a_power_cut(store_dir: Path):
    """An abort file of another boot: a file's stat on disk may predate data written back before the cut,
    so recovery is RocketMQ's (the record is not read)."""
    (store_dir / "abort").write_text(f"rmqstore-abort 00000000-0000-0000-0000-000000000000 {0:020d}\n")
    assert read_inputs(store_dir).verified == {}
    with MessageStore.open(store_dir, _cfg()) as s:
        assert s.recovery_report.verified_files == 0
        assert s.recovery_report.commitlog_checked_from < s.recovery_report.commitlog_end
        _assert_all_readable(s)


# --- damage the fast open does not read: found in the background --------------------------------------
@pytest.mark.parametrize("kind", ["other-queue", "out-of-order", "past-the-end"])
def test_damage_in_an_old_queue_file_is_found_by_the_background_check(store_dir: Path, monkeypatch, kind):
    """Unit 5 of TopicA/0 (in its first file, of 8) is rewritten to point at a valid record of TopicB, at its
    own queue's unit 2, or past the commitlog's end, its stat vouched for: the fast open does not read it.
    `rmqstore check` (complete) finds it; reads of it never answer a wrong message; the background check
    reports it (file and byte offset) and the queue is rebuilt from the commitlog."""
    with MessageStore.open(store_dir, _cfg()) as s:
        other = {"other-queue": s.get_message("g", "TopicB", 0, 5, 1).messages[0],
                 "out-of-order": s.get_message("g", "TopicA", 0, 2, 1).messages[0]}.get(kind)
        at, size = (other.commit_log_offset, other.store_size) if other else (s.commit_log.get_max_offset() + 999, 100)
    bad = _point_unit_at(store_dir, "TopicA", 0, 5, at, size)
    _restamp(store_dir, bad)
    assert any(p.path == str(bad) for p in check_store(store_dir, _cfg()).problems)
    go = _gate_background_check(monkeypatch)
    with MessageStore.open(store_dir, _cfg()) as s:
        assert _rel(store_dir, bad) in read_inputs(store_dir).verified
        assert not s.recovery_report.dropped, s.recovery_report.summary()      # not read at open
        for _ in range(3):                          # meanwhile: the read path's own checks (and its repair)
            _read(s, "TopicA", 0, 5)
        go.set()
        svc = s.service(background_check.NAME)
        assert svc.wait(60)
        found = s.failures.failures(FailureKind.CORRUPT_UNIT)     # found by the first of the two: reported once
        assert [(f.path, f.offset) for f in found] == [(str(bad), 5 * 20)], found
        why = {"other-queue": ("another topic or queue",), "out-of-order": ("not increasing", "another queue offset"),
               "past-the-end": ("outside the commitlog", "does not point at the start of a record")}[kind]
        assert any(w in found[0].reason for w in why) and "rebuilt" in found[0].reason, found[0].reason
        assert s.wait_dispatched(30)
        _assert_all_readable(s)
    assert check_store(store_dir, _cfg()).ok
    # the repaired file was left out of the record: the next open checks it
    assert _rel(store_dir, bad) not in verified_state.load(store_dir).files


def test_damaged_record_under_an_unchanged_stat_is_found_by_the_background_check(store_dir: Path, monkeypatch):
    """A flipped body bit in a commitlog file the record vouches for (in RocketMQ's three-file window after a
    clean shutdown): get_message never answers the damaged body; the background check skips the damaged
    record, reports it, and blanks its unit (a removed message), as recovery does."""
    with MessageStore.open(store_dir, _cfg()) as s:
        n = s.get_max_offset_in_queue("TopicB", 1)
        victim = s.get_message("g", "TopicB", 1, n - 3, 1).messages[0]
    f = store_dir / "commitlog" / f"{victim.commit_log_offset - victim.commit_log_offset % CL_FILE:020d}"
    at = victim.commit_log_offset % CL_FILE + victim.store_size - 30      # inside the body
    with open(f, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)[0]
        fh.seek(at)
        fh.write(bytes([b ^ 4]))
    _restamp(store_dir, f)
    go = _gate_background_check(monkeypatch)
    with MessageStore.open(store_dir, _cfg()) as s:
        assert not s.recovery_report.dropped
        assert [m.queue_offset for m in _read(s, "TopicB", 1, n - 3)] == [n - 2]     # not the damaged body
        go.set()
        assert s.service(background_check.NAME).wait(60)
        found = s.failures.failures(FailureKind.CORRUPT_RECORD)
        assert [(x.path, x.offset, x.end) for x in found] == \
            [(str(f), victim.commit_log_offset, victim.commit_log_offset + victim.store_size)], found
        assert [m.queue_offset for m in _read(s, "TopicB", 1, n - 3)] == [n - 2]     # removed
        _assert_right_or_absent(s, "TopicB", 1, n - 4)
        _assert_right_or_absent(s, "TopicB", 1, n - 2)
    assert _rel(store_dir, f) not in verified_state.load(store_dir).files


# --- files changed while the store was closed: never trusted -------------------------------------------
def _touched_back(path: Path, p: Path, other) -> None:
    st = os.stat(p)
    _point_unit_at(path, "TopicA", 0, 5, other.commit_log_offset, other.store_size)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))


def _copied_in(path: Path, p: Path, other) -> None:
    elsewhere = path.parent / "elsewhere"
    shutil.copytree(path, elsewhere)
    _point_unit_at(elsewhere, "TopicA", 0, 5, other.commit_log_offset, other.store_size)
    os.utime(_cq(elsewhere, "TopicA", 0, 0), ns=(os.stat(p).st_atime_ns, os.stat(p).st_mtime_ns))
    shutil.copy2(_cq(elsewhere, "TopicA", 0, 0), p)


def _cut_short(path: Path, p: Path, other) -> None:
    st = os.stat(p)
    os.truncate(p, 5 * 20)              # units 5.. gone, the file extended back to its size with zeros
    os.truncate(p, st.st_size)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("change", [_touched_back, _copied_in, _cut_short], ids=["touched-back", "copied-in",
                                                                                 "cut-short"])
def test_a_file_changed_while_closed_is_not_trusted(store_dir: Path, change):
    """The old consume queue file changed with its size and mtime as they were: its ctime (or inode) says
    so; the open checks it and repairs it from the commitlog, every message readable."""
    with MessageStore.open(store_dir, _cfg()) as s:
        other = s.get_message("g", "TopicB", 0, 5, 1).messages[0]
    p = _cq(store_dir, "TopicA", 0, 0)
    size, mtime = os.stat(p).st_size, os.stat(p).st_mtime_ns
    change(store_dir, p, other)
    assert (os.stat(p).st_size, os.stat(p).st_mtime_ns) == (size, mtime)
    assert _rel(store_dir, p) not in read_inputs(store_dir).verified
    with MessageStore.open(store_dir, _cfg()) as s:
        rep = s.recovery_report
        assert rep.consume_queue_units_dropped.get("TopicA/0", 0) > 0, rep.summary()
        assert any(d.path in (str(p), str(p.parent)) for d in rep.dropped), rep.summary()
        assert s.wait_dispatched(30)
        _assert_all_readable(s)


def test_a_bad_record_is_refused_whole(store_dir: Path):
    """A torn or edited record vouches for nothing (every file is checked, as without one)."""
    raw = (store_dir / verified_state.RECORD_NAME).read_bytes()
    state, why = verified_state.decode(raw)
    assert why is None and len(state) > 0
    assert verified_state.encode(state) == raw
    for bad, says in ((raw[:-7], "checksum"), (raw.replace(b" 1 ", b" 2 ", 1), "version"),
                      (raw[:raw.index(b"\n")] + b"\n" + raw[raw.index(b"\n") + 1:].replace(b" ", b"  ", 1), "")):
        st, why = verified_state.decode(bad)
        assert len(st) == 0 and why and says in why
    (store_dir / verified_state.RECORD_NAME).write_bytes(raw[:-7])
    with MessageStore.open(store_dir, _cfg()) as s:
        assert s.recovery_report.verified_files == 0
        assert s.recovery_report.commitlog_checked_from < s.recovery_report.commitlog_end
        _assert_all_readable(s)


# --- after SIGKILL ----------------------------------------------------------------------------------------
_CHILD = r"""
import sys
sys.path.insert(0, sys.argv[3])
from store.test_fast_open import _cfg, _put, N
from rmqstore.store.check.background_check import NAME
from rmqstore.store.store import MessageStore
s = MessageStore.open(sys.argv[1], _cfg())
_put(s, N, 200)
if sys.argv[2] == "refresh":
    s.service(NAME).refresh_record()      # what the running store notes every REFRESH_SECONDS
    print("END", s.commit_log.get_max_offset(), flush=True)
_put(s, N + 200, 100)
print("READY", flush=True)
import time
time.sleep(60)
"""


def _killed_child(path: Path, mode: str) -> int | None:
    """A child opens the store, puts 300 messages (in mode 'refresh' it notes the record after the first 200),
    and is SIGKILLed. Returns the commitlog end the refresh noted."""
    p = subprocess.Popen([sys.executable, "-c", _CHILD, str(path), mode, str(Path(__file__).resolve().parents[1])],
                         stdout=subprocess.PIPE, text=True)
    noted = None
    try:
        for line in p.stdout:
            if line.startswith("END"):
                noted = int(line.split()[1])
            if line.startswith("READY"):
                break
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        p.stdout.close()
    return noted


@pytest.mark.parametrize("mode", ["closed", "refresh"])
def test_after_sigkill_only_what_was_written_since_the_record_is_walked(store_dir: Path, mode):
    """The last commitlog file was appended to by the killed run: its vouched bytes still have the recorded
    crc32, so the walk starts where they end (the record of the last clean close, or the one the running
    store noted); everything the child put is there."""
    closed_end = verified_state.load(store_dir).files
    last = max(k for k in closed_end if k.startswith("commitlog/"))
    expect = int(last.split("/")[1]) + closed_end[last].end
    noted = _killed_child(store_dir, mode)
    if noted is not None:
        expect = noted
    assert (store_dir / "abort").exists()
    with MessageStore.open(store_dir, _cfg()) as s:
        rep = s.recovery_report
        assert rep.process_crash and rep.verified_files > 0
        assert rep.commitlog_checked_from == expect, rep.summary()
        assert not rep.dropped
        for t in TOPICS:
            for q in range(QUEUES):
                assert s.get_max_offset_in_queue(t, q) == (N + 300) // 2 // QUEUES
        assert s.service(background_check.NAME).wait(60)
        assert s.service(background_check.NAME).result.problems == []


def test_after_sigkill_damage_in_the_vouched_bytes_is_found_at_open(store_dir: Path):
    """A bit flipped after the kill in what the record vouched for: the crc32 no longer matches, the walk
    starts at the checkpoint's file as RocketMQ's does, and the damaged record is skipped and reported at
    open."""
    with MessageStore.open(store_dir, _cfg()) as s:
        n = s.get_max_offset_in_queue("TopicA", 1)
        victim = s.get_message("g", "TopicA", 1, n - 2, 1).messages[0]
        last_from = s.commit_log.queue.files[-1].file_from_offset
    assert victim.commit_log_offset >= last_from           # in the file the killed run appends to
    _killed_child(store_dir, "closed")
    f = store_dir / "commitlog" / f"{last_from:020d}"
    at = victim.commit_log_offset - last_from + victim.store_size - 30
    with open(f, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)[0]
        fh.seek(at)
        fh.write(bytes([b ^ 8]))
    assert "commitlog/" + f.name not in read_inputs(store_dir).verified
    with MessageStore.open(store_dir, _cfg()) as s:
        rep = s.recovery_report
        assert rep.commitlog_checked_from <= victim.commit_log_offset, rep.summary()
        assert (victim.commit_log_offset, victim.commit_log_offset + victim.store_size) in rep.skipped_ranges
        assert [m.queue_offset for m in _read(s, "TopicA", 1, n - 2)] == [n - 1]     # removed
        _assert_right_or_absent(s, "TopicA", 1, n - 1)


def test_a_torn_tail_under_an_unchanged_stat_is_walked(store_dir: Path):
    """The last commitlog file cut inside its last records and zero-extended, the record restamped (the fuzzer's
    mutation 102 of seed 605003459): the records before the vouched end no longer lead to it, so the file is
    walked and cut where the data ends; a put afterwards is dispatched and readable where it was answered."""
    last = sorted((store_dir / "commitlog").iterdir())[-1]
    size = last.stat().st_size
    end = verified_state.load(store_dir).files[_rel(store_dir, last)].end
    os.truncate(last, end - 50)
    os.truncate(last, size)
    _restamp(store_dir, last)
    with MessageStore.open(store_dir, _cfg()) as s:
        rep = s.recovery_report
        assert rep.commitlog_checked_from == int(last.name) and rep.commitlog_end < int(last.name) + end, \
            rep.summary()
        r = s.put_message(Message("TopicA", b"after", queue_id=0))
        assert r.ok and s.wait_dispatched(30)
        got = s.get_message("g", "TopicA", 0, r.append_result.logics_offset, 1).messages
        assert [m.body for m in got] == [b"after"]



def test_damage_the_background_check_finds_at_the_log_end_spares_later_puts(store_dir: Path, monkeypatch):
    """The last commitlog file replaced by random bytes of its size, the record restamped (the fuzzer's mutation
    65 of seed 101): the open walks from the vouched end and cuts there; the background check then finds the
    file's older bytes damaged and skips them, up to where the open's walk began. Before, it skipped them up
    to the file's end, over where the records written since the open go: a put answered PUT_OK was never
    dispatched (unreadable where it was answered)."""
    import random
    last = sorted((store_dir / "commitlog").iterdir())[-1]
    last.write_bytes(random.Random(65).randbytes(last.stat().st_size))
    _restamp(store_dir, last)
    go = _gate_background_check(monkeypatch)
    with MessageStore.open(store_dir, _cfg()) as s:
        end = s.recovery_report.commitlog_end
        assert int(last.name) < end < int(last.name) + CL_FILE, s.recovery_report.summary()
        _background_pass(s, go)
        found = [(x.path, x.offset, x.end) for x in s.failures.failures(FailureKind.CORRUPT_RECORD)
                 if x.offset == int(last.name)]
        assert found == [(str(last), int(last.name), end)], s.failures.failures()
        r = s.put_message(Message("TopicA", b"after the check", queue_id=0))
        assert r.ok and s.wait_dispatched(30)
        got = s.get_message("g", "TopicA", 0, r.append_result.logics_offset, 1).messages
        assert [m.body for m in got] == [b"after the check"]


# --- header damage under an unchanged stat: found in the background, never answered -------------------
def _records_of(path: Path, topic: str, q: int, offs) -> list:
    with MessageStore.open(path, _cfg()) as s:
        return [s.get_message("g", topic, q, o, 1).messages[0] for o in offs]


def _patch_commitlog(path: Path, fn) -> Path:
    """fn(bytearray of the first commitlog file) changes it in place; the record restamped (bit rot)."""
    f = path / "commitlog" / f"{0:020d}"
    data = bytearray(f.read_bytes())
    fn(data)
    f.write_bytes(bytes(data))
    _restamp(path, f)
    return f


def _background_pass(s: MessageStore, go: threading.Event) -> None:
    go.set()
    assert s.service(background_check.NAME).wait(60) and s.wait_dispatched(30)


def _assert_queue_right(s: MessageStore, topic: str, q: int, lost=(), expected=None) -> None:
    """Every offset of the queue answers its own message (expected(queue offset) its body: by default the
    fixture's), but those in lost, which answer none of theirs."""
    for off in range(s.get_max_offset_in_queue(topic, q)):
        deadline = time.monotonic() + 30
        while True:     # a read that met a damaged unit has the queue repaired: until then reads say "not yet"
            if expected is None:
                got = _read(s, topic, q, off)
            else:
                got = s.get_message("g", topic, q, off, 1).messages
                assert [(m.topic, m.queue_id, m.body) for m in got] == [(topic, q, expected(m.queue_offset))
                                                                       for m in got]
            if off in lost or got or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        if off not in lost:
            assert [m.queue_offset for m in got] == [off], (topic, q, off)
        else:
            assert off not in [m.queue_offset for m in got]


@pytest.mark.parametrize("claim", [6, 4])
def test_a_damaged_queueoffset_in_an_old_file_is_never_answered(store_dir: Path, monkeypatch, claim):
    """TopicA/0's record of queue offset 5 (first commitlog file, its stat vouched for) says QUEUEOFFSET 6
    (or 4): a header field the body CRC does not cover. Reads never answer it at 6 (or 4), nor lose 6 (or
    4); the background check reports the unit (file, offset) and rebuilds the queue, where the damaged
    record gets no unit (a CORRUPT_RECORD naming it): before, the rebuild put it at unit 6 and the intact
    message 6 was unreadable (the record claiming an offset the queue had was dropped as built already)."""
    (rec,) = _records_of(store_dir, "TopicA", 0, [5])
    f = _patch_commitlog(store_dir, lambda d: d.__setitem__(slice(rec.commit_log_offset % CL_FILE + 20,
                                                                   rec.commit_log_offset % CL_FILE + 28),
                                                             claim.to_bytes(8, "big")))
    go = _gate_background_check(monkeypatch)
    with MessageStore.open(store_dir, _cfg()) as s:
        assert not s.recovery_report.dropped, s.recovery_report.summary()      # not read at open
        _assert_queue_right(s, "TopicA", 0, lost=(5,))                           # the read path's checks
        _background_pass(s, go)
        _assert_queue_right(s, "TopicA", 0, lost=(5,))
        units = s.failures.failures(FailureKind.CORRUPT_UNIT)
        assert [(u.path, u.offset) for u in units] == [(str(_cq(store_dir, "TopicA", 0, 0)), 5 * 20)], units
        recs = s.failures.failures(FailureKind.CORRUPT_RECORD)
        assert [(r.path, r.offset) for r in recs] == [(str(f), rec.commit_log_offset)], recs
    with MessageStore.open(store_dir, _cfg()) as s:
        _assert_queue_right(s, "TopicA", 0, lost=(5,))


@pytest.mark.parametrize("found_by", ["re-dispatch", "background check"])
def test_a_record_moved_to_a_queue_of_its_own_is_never_answered(store_dir: Path, monkeypatch, found_by):
    """A flipped QUEUEID bit (TopicA/1 -> TopicA/257, a queue that does not exist) in a commitlog file the record
    vouches for (the fuzzer's mutation 3 of seed 505). Before, a re-dispatch over the record (here: the index
    removed, the open dispatches every record again) made TopicA/257 for it, and view_message_by_id answered
    the damaged record as that queue's message. Now the unit TopicA/1 holds for it shows it was built there:
    wherever it is found (the re-dispatch, or the background check's repair of the unit that no longer
    matches), it is a CORRUPT_RECORD with file and offset, gets no unit, makes no queue, is never answered."""
    (rec,) = _records_of(store_dir, "TopicA", 1, [20])
    at = rec.commit_log_offset % CL_FILE
    f = store_dir / "commitlog" / f"{rec.commit_log_offset - at:020d}"
    data = bytearray(f.read_bytes())
    assert int.from_bytes(data[at + 12:at + 16], "big") == 1
    data[at + 14] ^= 0x01                                       # QUEUEID 1 -> 257
    f.write_bytes(bytes(data))
    _restamp(store_dir, f)
    if found_by == "re-dispatch":
        shutil.rmtree(store_dir / "index")
    go = _gate_background_check(monkeypatch)
    for opening in range(2):                # the open that finds it, and a reopen
        with MessageStore.open(store_dir, _cfg()) as s:
            assert (s.recovery_report.redispatched_messages > N // 2) == (found_by == "re-dispatch" and not opening)
            if not opening:
                _background_pass(s, go)
                bad = [(x.path, x.offset, x.end) for x in s.failures.failures(FailureKind.CORRUPT_RECORD)]
                assert (str(f), rec.commit_log_offset, rec.commit_log_offset + rec.store_size) in bad, bad
            assert s.view_message_by_id(rec.msg_id) is None
            assert 257 not in s.topics()["TopicA"] and s.get_max_offset_in_queue("TopicA", 257) == 0
            _assert_queue_right(s, "TopicA", 1, lost=(20,))
            _assert_queue_right(s, "TopicA", 0)
            go.set()
    assert not (store_dir / "consumequeue" / "TopicA" / "257").exists()


def _same_size_store(path: Path, n: int) -> list:
    """n messages of one size over TopicA/0 and TopicA/1, closed cleanly; returns their PutMessageResults."""
    with MessageStore.open(path, _cfg()) as s:
        acks = [s.put_message(Message("TopicA", b"body-%04d" % i, queue_id=i % 2)) for i in range(n)]
        assert all(r.ok for r in acks) and s.wait_dispatched(30)
    return acks


def test_two_swapped_records_in_an_old_file_lose_nothing_else(tmp_path: Path, monkeypatch):
    """Two same-size, CRC-valid records of TopicA/0 swapped in place (queue offsets 20 and 21, in the first of
    four commitlog files, its stat vouched for): each names the other's position, so neither is answered
    (both reported as damaged records, with file and offset). Every other message stays readable at its
    offset, in the running store and after a reopen, and `check --repair` leaves a clean store. Before,
    the rebuild after the background check's cut wrote nothing more: 979 messages of TopicA/0 unreadable
    for good, and --repair gave up."""
    from rmqstore.store.repair.check_repair import repair_store
    path = tmp_path / "s"
    acks = _same_size_store(path, 2000)
    assert len(list((path / "commitlog").iterdir())) >= 4
    a, b = (acks[2 * k].append_result.wrote_offset for k in (20, 21))
    body0 = (lambda off: b"body-%04d" % (2 * off))

    def swap(d):
        n = int.from_bytes(d[a:a + 4], "big")
        d[a:a + n], d[b:b + n] = d[b:b + n], d[a:a + n]
    f = _patch_commitlog(path, swap)
    go = _gate_background_check(monkeypatch)
    with MessageStore.open(path, _cfg()) as s:
        assert not s.recovery_report.dropped, s.recovery_report.summary()
        _assert_queue_right(s, "TopicA", 0, lost=(20, 21), expected=body0)
        _background_pass(s, go)
        for q in range(2):
            _assert_queue_right(s, "TopicA", q, lost=(20, 21) if q == 0 else (),
                                expected=lambda off, q=q: b"body-%04d" % (2 * off + q))
        recs = s.failures.failures(FailureKind.CORRUPT_RECORD)
        assert sorted((r.path, r.offset) for r in recs) == [(str(f), a), (str(f), b)], recs
    with MessageStore.open(path, _cfg()) as s:
        _assert_queue_right(s, "TopicA", 0, lost=(20, 21), expected=body0)
    first, after = repair_store(path, _cfg())
    assert after.ok, after.problems


def test_a_queue_cut_after_a_filler_unit_is_rebuilt(store_dir: Path, monkeypatch):
    """TopicA/0's unit 20 is a filler (its record lost with a skipped range) and unit 21 points at another
    queue's record, in an old consume queue file vouched for. The background check cuts the queue at 21
    and rebuilds it: before, the queue's end was taken from the filler (offset 0 + size 0x7fffffff), past
    every record, and nothing was dispatched into it again (every later message unreadable for good)."""
    (other,) = _records_of(store_dir, "TopicB", 0, [5])
    _point_unit_at(store_dir, "TopicA", 0, 20, 0, codec.CQ_BLANK_SIZE)
    bad = _point_unit_at(store_dir, "TopicA", 0, 21, other.commit_log_offset, other.store_size)
    _restamp(store_dir, bad)
    go = _gate_background_check(monkeypatch)
    with MessageStore.open(store_dir, _cfg()) as s:
        assert not s.recovery_report.dropped, s.recovery_report.summary()
        _background_pass(s, go)
        assert [(u.path, u.offset) for u in s.failures.failures(FailureKind.CORRUPT_UNIT)] == [(str(bad), 21 * 20)]
        _assert_queue_right(s, "TopicA", 0, lost=(20,))
    with MessageStore.open(store_dir, _cfg()) as s:
        _assert_queue_right(s, "TopicA", 0, lost=(20,))


# --- restart time: a clean open dispatches nothing again -------------------------------------------------
def _full_queues_store(path: Path, keys: str) -> int:
    """Two queues whose last consume queue file is exactly full (PER_CQ_FILE * 2 units each), their messages
    with keys ("all"), the first queue's only ("first": the index ends before the commitlog) or none (no index
    file), closed cleanly; returns the commitlog's end."""
    with MessageStore.open(path, _cfg()) as s:
        for q in range(QUEUES):
            for i in range(PER_CQ_FILE * 2):
                props = {"KEYS": f"k{q}-{i}"} if keys == "all" or keys == "first" and q == 0 else {}
                assert s.put_message(Message("TopicA", _body("TopicA", i), properties=props, queue_id=q)).ok
        assert s.wait_dispatched(30)
        return s.commit_log.get_max_offset()


@pytest.mark.parametrize("keys", ["all", "first", "none"])
def test_a_clean_open_dispatches_nothing_again(tmp_path: Path, keys):
    """Queues ending with a full file, and an index ending before the commitlog (the last messages carry no
    key, or none does: no index file): a clean open re-dispatched from a full queue's end, from the last keyed
    message, or from offset 0, at every start, so restart time grew with the store. The record tells those
    from lost files: nothing is dispatched again, and the queues and the index go on from where they were."""
    path = tmp_path / "s"
    end = _full_queues_store(path, keys)
    with MessageStore.open(path, _cfg()) as s:
        rep = s.recovery_report
        assert (rep.redispatched_messages, rep.redispatched_from) == (0, end), rep.summary()
        assert s.put_message(Message("TopicA", b"next", properties={"KEYS": "after"}, queue_id=0)).ok
        assert s.wait_dispatched(30)
        got = s.get_message("g", "TopicA", 0, PER_CQ_FILE * 2, 8).messages
        assert [(m.queue_offset, m.body) for m in got] == [(PER_CQ_FILE * 2, b"next")]
        assert [m.body for m in s.query_message("TopicA", "after", 8).messages] == [b"next"]
        if keys != "none":
            assert [m.body for m in s.query_message("TopicA", "k0-3", 8).messages] == [_body("TopicA", 3)]


@pytest.mark.parametrize("lost", ["queue-file", "index", "record"])
def test_files_lost_after_a_clean_close_are_built_again(tmp_path: Path, lost):
    """What the rule above must not skip: the file after a full one deleted while the store was closed (the
    record lists it), the index directory emptied (the record lists its files), or no record at all: the
    open re-dispatches and every queue and key answers as before."""
    path = tmp_path / "s"
    _full_queues_store(path, keys="all")
    if lost == "queue-file":
        _cq(path, "TopicA", 1, 1).unlink()
    elif lost == "index":
        for p in (path / "index").iterdir():
            p.unlink()
    else:
        (path / verified_state.RECORD_NAME).unlink()
    with MessageStore.open(path, _cfg()) as s:
        assert s.recovery_report.redispatched_messages > 0, s.recovery_report.summary()
        for q in range(QUEUES):
            assert s.get_max_offset_in_queue("TopicA", q) == PER_CQ_FILE * 2
            got = _read_queue(s, "TopicA", q, PER_CQ_FILE * 2)
            assert [m.body for m in got] == [_body("TopicA", i) for i in range(PER_CQ_FILE * 2)]
        for q, i in ((0, 5), (1, PER_CQ_FILE + 7)):
            assert [m.body for m in s.query_message("TopicA", f"k{q}-{i}", 8).messages] == [_body("TopicA", i)]
