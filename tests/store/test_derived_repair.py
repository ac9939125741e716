"""Derived data is repaired wherever it is damaged (issue 15, defects 7 and 14).

Consume queues are derived from the commitlog: a damaged consume queue file anywhere (not only the last
ones recovery walks) is detected at open and rebuilt from the commitlog, and a read never answers FOUND
with a record of another topic, queue or queue offset. The read-only view (`rmqstore dump`, Spark) repairs
in memory what open() repairs on disk.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import golden_store, read_jsonl, run_cli
from store_checks import wait_until
from rmqstore.store.check import background_check
from rmqstore.store.format import codec
from rmqstore.store.conf.config import StoreConfig
from rmqstore.tools.dump import dump_lines
from rmqstore.store.format.message import GetMessageStatus, Message
from rmqstore.spark import storeview as SV
from rmqstore.store.store import MessageStore

PER_FILE = 50                       # units per consume queue file: 600 messages make 12 files
N = 600


def _config() -> StoreConfig:
    return StoreConfig.from_dict({"mappedFileSizeCommitLog": 1 << 20, "mappedFileSizeConsumeQueue": PER_FILE * 20,
                                  "maxHashSlotNum": 64, "maxIndexNum": 4096})


def _body(topic: str, i: int) -> bytes:
    return f"{topic} message {i}".encode()


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    """A store holding N acknowledged messages in T/0 and N in U/0 (interleaved), closed cleanly."""
    path = tmp_path / "store"
    with MessageStore.open(path, _config()) as s:
        for i in range(N):
            for topic in ("T", "U"):
                r = s.put_message(Message(topic, _body(topic, i), queue_id=0, properties={"KEYS": f"{topic}-{i}"}))
                assert r.status.name == "PUT_OK" and r.append_result.logics_offset == i
        assert s.wait_dispatched()
    return path


def _cq_file(path: Path, topic: str, k: int) -> Path:
    return path / "consumequeue" / topic / "0" / f"{k * PER_FILE * 20:020d}"


def _assert_all_readable(s: MessageStore) -> None:
    """Every acknowledged message of T/0 and U/0 is found at its queue offset, and nothing else is."""
    for topic in ("T", "U"):
        assert s.get_max_offset_in_queue(topic, 0) == N
        got = []
        offset = 0
        while offset < N:
            r = s.get_message("g", topic, 0, offset, 32)
            assert r.status == GetMessageStatus.FOUND, (topic, offset, r.status)
            got.extend(r.messages)
            offset = r.next_begin_offset
        assert [m.body for m in got] == [_body(topic, i) for i in range(N)]
        assert [(m.topic, m.queue_offset) for m in got] == [(topic, i) for i in range(N)]


def _view_units(path: Path, topic: str) -> list[int]:
    view = SV.load_view(str(path), _config())
    qv = view.queues[(topic, 0)]
    offs, _ = qv.units(qv.min_offset, qv.end)
    return offs.tolist()


def _store_units(s: MessageStore, topic: str) -> list[int]:
    return s.consume_queues.find(topic, 0).units(0, N)["offset"].astype(np.int64).tolist()


@pytest.mark.parametrize("damage", ["zeroed", "deleted"])
def test_middle_consume_queue_file_zeroed_or_deleted_is_rebuilt(store_dir: Path, tmp_path: Path, damage: str):
    """Defect 7: a zeroed or deleted consume queue file in the middle of a queue (far from the last files
    recovery walks) is detected at open, reported and rebuilt: every acknowledged message is readable."""
    victim = _cq_file(store_dir, "T", 3)
    if damage == "zeroed":
        victim.write_bytes(bytes(victim.stat().st_size))
    else:
        victim.unlink()
    view_copy = tmp_path / "view-copy"
    shutil.copytree(store_dir, view_copy)
    with MessageStore.open(store_dir, _config()) as s:
        _assert_all_readable(s)
        rep = s.recovery_report
        assert any("consumequeue/T/0" in d.path and d.offset == 3 * PER_FILE * 20 for d in rep.dropped), rep.dropped
        assert rep.consume_queue_units_dropped.get("T/0", 0) > 0
        units = _store_units(s, "T")
    # the read-only view repairs the same, in memory (and writes nothing)
    before = sorted((p, p.stat().st_size) for p in view_copy.rglob("*") if p.is_file())
    assert _view_units(view_copy, "T") == units
    assert sorted((p, p.stat().st_size) for p in view_copy.rglob("*") if p.is_file()) == before
    with MessageStore.open(store_dir, _config()) as s:           # the repair lasts
        assert not s.recovery_report.dropped
        _assert_all_readable(s)


def _record_offset(s: MessageStore, topic: str, i: int) -> int:
    return s.get_commit_log_offset_in_queue(topic, 0, i)


def _point_unit_at(path: Path, topic: str, i: int, offset: int, size: int) -> None:
    """Unit i's offset and size rewritten in place (never truncating a file an open store may have mapped)."""
    fd = os.open(_cq_file(path, topic, i // PER_FILE), os.O_WRONLY)
    try:
        os.pwrite(fd, codec.CQ_UNIT.pack(offset, size, 0)[:12], (i % PER_FILE) * 20)
    finally:
        os.close(fd)


def test_unit_pointing_at_another_topics_record_is_rebuilt(store_dir: Path, tmp_path: Path):
    """Defect 7: a unit rewritten to point at another topic's valid record (same queue id, same queue offset,
    so only the topic tells them apart) is found at open and rebuilt; get_message answers T's own message.
    Open checks every unit of a queue's last file and a sample of the older ones against their records (the
    read path and `check` cover every unit): unit 580 is in the last file, unit 120 in the sample."""
    from rmqstore.store.recovery import recovery
    if hasattr(recovery, "_checked_positions"):        # (the code before the fix has no sample)
        assert 120 in recovery._checked_positions(N, N - PER_FILE, recovery.CQ_CHECK_SAMPLE)
    with MessageStore.open(store_dir, _config()) as s:
        targets = {i: (_record_offset(s, "U", i), s.look_message_by_offset(_record_offset(s, "U", i)).store_size)
                   for i in (120, 580)}
    for i, (u_off, u_size) in targets.items():
        _point_unit_at(store_dir, "T", i, u_off, u_size)
    view_copy = tmp_path / "view-copy"
    shutil.copytree(store_dir, view_copy)
    with MessageStore.open(store_dir, _config()) as s:
        for i in targets:
            r = s.get_message("g", "T", 0, i, 1)
            assert r.status == GetMessageStatus.FOUND and r.messages[0].topic == "T"
            assert r.messages[0].body == _body("T", i)
        _assert_all_readable(s)
        assert any("consumequeue/T/0" in d.path and "another topic" in d.reason for d in s.recovery_report.dropped)
        units = _store_units(s, "T")
    assert _view_units(view_copy, "T") == units


def test_read_never_answers_found_with_another_queues_record(store_dir: Path, caplog):
    """Defect 7, read path: a unit damaged while the store is open (after open's checks) pointing at another
    topic's record, or at a record of the same queue with another queue offset, is never answered: the read
    stops before it with a warning naming the unit (a consumer waits there, it does not skip the message)
    and the store repairs the queue (check.unit_repair: cut there, rebuilt from the commitlog; a
    CORRUPT_UNIT on the failure channel): the messages come back at their offsets."""
    from rmqstore.store.state.failure import FailureKind
    with MessageStore.open(store_dir, _config()) as s:
        # the damage comes after the background check's pass, which would otherwise find and repair it first
        assert s.service(background_check.NAME).wait(60)
        u_off = _record_offset(s, "U", 7)
        u_size = s.look_message_by_offset(u_off).store_size
        t_off = _record_offset(s, "T", 9)
        t_size = s.look_message_by_offset(t_off).store_size
        _point_unit_at(store_dir, "T", 7, u_off, u_size)       # the file shares its pages with the mapping
        _point_unit_at(store_dir, "T", 8, t_off, t_size)
        with caplog.at_level(logging.WARNING):
            r = s.get_message("g", "T", 0, 5, 8)
        assert [m.queue_offset for m in r.messages] == [5, 6] and r.next_begin_offset == 7
        assert all(m.topic == "T" and m.body == _body("T", m.queue_offset) for m in r.messages)
        assert "unit 7 of T/0" in caplog.text and "U/0" in caplog.text
        assert wait_until(lambda: s.unit_repair.repaired == 1, 30) and s.wait_dispatched(30)
        r = s.get_message("g", "T", 0, 7, 32)
        assert [(m.queue_offset, m.body) for m in r.messages] == [(i, _body("T", i)) for i in range(7, 39)]
        got = s.failures.failures(FailureKind.CORRUPT_UNIT)
        assert [(f.path.endswith(f"T/0/{0:020d}"), f.offset) for f in got] == [(True, 7 * 20)], got
        rep = s.check(repair=True)
        assert rep.ok, [str(p) for p in rep.problems]
        _assert_all_readable(s)


def _consume_t(s: MessageStore, timeout: float = 20) -> list[int]:
    """T/0 read as a consumer reads it (from the next offset each answer gives): the queue offsets received."""
    import time
    got, offset, deadline = [], 0, time.monotonic() + timeout
    while offset < N and time.monotonic() < deadline:
        r = s.get_message("g", "T", 0, offset, 32)
        assert all(m.topic == "T" and m.body == _body("T", m.queue_offset) for m in r.messages)
        got += [m.queue_offset for m in r.messages]
        assert r.next_begin_offset >= offset, (offset, r)
        offset = r.next_begin_offset
    return got


@pytest.mark.parametrize("kind", ["ff", "negative offset", "negative size", "zero size", "across a file's end"])
def test_a_unit_naming_no_readable_bytes_is_repaired_not_skipped(store_dir: Path, kind):
    """Garbage a read cannot even look up (all 0xFF, a negative offset or size, a size running past the end of
    the commitlog file): repaired as a unit naming another record is, the consumer misses nothing."""
    with MessageStore.open(store_dir, _config()) as s:
        assert s.service(background_check.NAME).wait(60)
        t_off = _record_offset(s, "T", 77)
        size = s.look_message_by_offset(t_off).store_size
        fs = s.commit_log.file_size
        raw = {"ff": b"\xff" * 12, "negative offset": codec.CQ_UNIT.pack(-1000, size, 0)[:12],
               "negative size": codec.CQ_UNIT.pack(t_off, -5, 0)[:12], "zero size": codec.CQ_UNIT.pack(t_off, 0, 0)[:12],
               "across a file's end": codec.CQ_UNIT.pack(fs - 10, 200, 0)[:12]}[kind]
        fd = os.open(_cq_file(store_dir, "T", 77 // PER_FILE), os.O_WRONLY)
        os.pwrite(fd, raw, (77 % PER_FILE) * 20)
        os.close(fd)
        assert _consume_t(s) == list(range(N))
        assert s.unit_repair.repaired == 1


def test_the_same_unit_damaged_again_is_repaired_again(store_dir: Path):
    with MessageStore.open(store_dir, _config()) as s:
        assert s.service(background_check.NAME).wait(60)
        u_off = _record_offset(s, "U", 77)
        for k in (1, 2):
            _point_unit_at(store_dir, "T", 77, u_off, s.look_message_by_offset(u_off).store_size)
            assert _consume_t(s) == list(range(N))
            assert s.unit_repair.repaired == k and s.wait_dispatched(30)


def test_without_its_services_a_store_skips_a_damaged_unit(store_dir: Path, caplog):
    """A store opened without its services has no repair: a read skips the damaged units (warning naming
    each), never answering another queue's or offset's record."""
    with MessageStore.open(store_dir, _config(), start_services=False) as s:
        u_off = _record_offset(s, "U", 7)
        t_off = _record_offset(s, "T", 9)
        _point_unit_at(store_dir, "T", 7, u_off, s.look_message_by_offset(u_off).store_size)
        _point_unit_at(store_dir, "T", 8, t_off, s.look_message_by_offset(t_off).store_size)
        with caplog.at_level(logging.WARNING):
            r = s.get_message("g", "T", 0, 7, 4)
        assert [m.queue_offset for m in r.messages] == [9, 10, 11, 12] and all(m.topic == "T" for m in r.messages)
        assert "unit 7 of T/0" in caplog.text and "unit 8 of T/0" in caplog.text


def test_a_repair_decided_on_units_read_before_another_repair_leaves_the_queue_alone(store_dir: Path):
    """The background check and check(repair=True) each decide on units they read earlier: a queue another
    repair rebuilt meanwhile (here: never damaged) is checked again under the dispatcher's lock and not
    cut, so that it never shrinks under readers that saw it whole."""
    from rmqstore.store.recovery.queue_check import UNIT_OTHER_QUEUE
    from rmqstore.store.recovery.recovery import repair_queues_live
    with MessageStore.open(store_dir, _config()) as s:
        cq = s.consume_queues.find("T", 0)
        assert repair_queues_live(s.commit_log, s.dispatcher, [(cq, 7, UNIT_OTHER_QUEUE)]) == []
        assert s.get_max_offset_in_queue("T", 0) == N          # not cut at unit 7, at once
        _assert_all_readable(s)


def test_readers_never_see_a_queue_shorter_while_a_repair_on_the_open_store_rebuilds_it(store_dir: Path):
    """A repair on the open store (the background check's, check(repair=True)) cuts a queue at its damaged unit
    and the dispatcher rebuilds the rest from the commitlog. Until it has, the queue's max offset stays what it
    was and a read past the cut answers "not yet" at the same offset (OFFSET_OVERFLOW_ONE): never
    OFFSET_OVERFLOW_BADLY, whose next offset (the cut) a consumer would move back to (the broker answers it
    with PULL_OFFSET_MOVED), nor a next offset past the read one. Without the dispatcher thread (services not
    started) the window stays open until the test runs the dispatcher itself."""
    from rmqstore.store.recovery.queue_check import UNIT_OTHER_QUEUE
    from rmqstore.store.recovery.recovery import repair_queues_live
    with MessageStore.open(store_dir, _config(), start_services=False) as s:
        u_off = _record_offset(s, "U", 7)
        _point_unit_at(store_dir, "T", 7, u_off, s.look_message_by_offset(u_off).store_size)
        cq = s.consume_queues.find("T", 0)
        assert repair_queues_live(s.commit_log, s.dispatcher, [(cq, 7, UNIT_OTHER_QUEUE)]) != []
        assert cq.get_max_offset_in_queue() == 7                       # cut, not rebuilt yet
        assert s.get_max_offset_in_queue("T", 0) == N
        for offset in (7, 300, N - 1):                                 # acknowledged messages, coming back
            r = s.get_message("g", "T", 0, offset, 4)
            assert (r.status, r.next_begin_offset, r.max_offset) == (GetMessageStatus.OFFSET_OVERFLOW_ONE, offset, N)
        r = s.get_message("g", "T", 0, N + 5, 4)                       # past it: as ever
        assert r.status == GetMessageStatus.OFFSET_OVERFLOW_BADLY and r.max_offset == N
        assert [m.queue_offset for m in s.get_message("g", "T", 0, 0, 32).messages] == list(range(7))
        s.dispatcher.do_reput()                                        # the rebuild
        assert cq.rebuilding_to == -1 and not s.dispatcher.rebuilding
        _assert_all_readable(s)


def test_a_consumer_reading_through_repairs_on_the_open_store_misses_nothing(tmp_path: Path):
    """The same with the dispatcher's own thread, racing: a reader walks T/0 as a consumer does (from the next
    offset each answer gives) while the queue is damaged and repaired on the open store again and again
    (the background check's and check(repair=True)'s repair_queues_live; or first the one a read that met
    the damage asked for). It gets every message once, in order: no answer moves it back
    (OFFSET_OVERFLOW_BADLY, OFFSET_TOO_SMALL) or past a message."""
    import threading
    from rmqstore.store.format.message_batch import MessageBatch
    from rmqstore.store.recovery.queue_check import UNIT_OTHER_QUEUE
    from rmqstore.store.recovery.recovery import repair_queues_live
    n = 20_000
    cfg = StoreConfig.from_dict({"mappedFileSizeCommitLog": 8 << 20, "mappedFileSizeConsumeQueue": n * 20})
    path = tmp_path / "store"
    with MessageStore.open(path, cfg) as s:
        for k in range(0, n, 5000):
            for topic in ("T", "U"):
                s.put_messages(MessageBatch(topic, [_body(topic, i) for i in range(k, k + 5000)], queue_ids=[0] * 5000))
        assert s.wait_dispatched(60)
        assert s.service(background_check.NAME).wait(60)
        cq = s.consume_queues.find("T", 0)
        got: list[int] = []
        wrong: list[str] = []
        done = threading.Event()

        def consume():
            offset = 0
            while offset < n and not done.is_set():
                r = s.get_message("g", "T", 0, offset, 64)
                if r.status == GetMessageStatus.FOUND:
                    qo = [m.queue_offset for m in r.messages]
                    if qo != list(range(offset, offset + len(qo))) or r.next_begin_offset != offset + len(qo):
                        wrong.append(f"at {offset}: {qo[:3]}.. next {r.next_begin_offset}")
                    got.extend(qo)
                elif r.next_begin_offset != offset:
                    wrong.append(f"at {offset}: {r.status.name} moves to {r.next_begin_offset}")
                offset = r.next_begin_offset
        reader = threading.Thread(target=consume)
        reader.start()
        repairs = 0
        try:
            for bad in (19_990, 15_000, 9_000, 4_000, 12_000, 19_000):
                u_off = _record_offset(s, "U", bad)
                fd = os.open(path / "consumequeue" / "T" / "0" / f"{0:020d}", os.O_WRONLY)
                os.pwrite(fd, codec.CQ_UNIT.pack(u_off, s.look_message_by_offset(u_off).store_size, 0)[:12], bad * 20)
                os.close(fd)
                repairs += bool(repair_queues_live(s.commit_log, s.dispatcher, [(cq, bad, UNIT_OTHER_QUEUE)]))
                assert s.wait_dispatched(60)
        finally:
            reader.join(60)
            done.set()
        # each damage repaired once: by the test's repair, or first by the one a read asked for
        assert s.wait_dispatched(30) and not wrong, wrong[:5]
        assert wait_until(lambda: repairs + s.unit_repair.repaired == 6, 10), (repairs, s.unit_repair.repaired)
        assert got == list(range(n))
        _assert_queue(s, "T", n)


def test_a_unit_pointing_ahead_is_cut_not_the_one_after_it(store_dir: Path):
    """A unit damaged to point far ahead (at a later record of another queue) makes the next unit look out of
    order (commitlog offsets not increasing) to a check that does not compare it with its record (an open's
    sample, a repair decided on a later unit): the cut is at the damaged unit, not after it, else the
    rebuild would start from the end of the record it points at and leave the queue without the messages
    between."""
    from rmqstore.store.recovery.queue_check import UNIT_OTHER_QUEUE
    from rmqstore.store.recovery.recovery import repair_queues_live
    with MessageStore.open(store_dir, _config(), start_services=False) as s:
        u_off = _record_offset(s, "U", 500)
        _point_unit_at(store_dir, "T", 120, u_off, s.look_message_by_offset(u_off).store_size)
        cq = s.consume_queues.find("T", 0)
        done = repair_queues_live(s.commit_log, s.dispatcher, [(cq, 130, UNIT_OTHER_QUEUE)])
        assert len(done) == 1 and "unit 120 " in done[0], done
        s.dispatcher.do_reput()
        _assert_all_readable(s)


def _assert_queue(s: MessageStore, topic: str, n: int) -> None:
    assert s.get_max_offset_in_queue(topic, 0) == n and s.consume_queues.find(topic, 0).rebuilding_to == -1
    for i in (0, n // 2, n - 1):
        m = s.get_message("g", topic, 0, i, 1).messages[0]
        assert (m.queue_offset, m.body) == (i, _body(topic, i))


# --- defect 14 ---------------------------------------------------------------------------------------
def _cut_copy(golden: Path, dst: Path) -> Path:
    shutil.copytree(golden_store(golden, "rmq440-clean"), dst)
    for dirpath, _, files in os.walk(dst):
        os.chmod(dirpath, 0o755)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o644)
    f = dst / "consumequeue" / "TopicA" / "0" / "00000000000000000000"
    os.truncate(f, 2010)                       # the queue's only file, cut mid-unit (#7355-style)
    return dst


def test_dump_repairs_a_queue_whose_only_file_was_cut_mid_unit(golden: Path, tmp_path: Path, compare_tools):
    """Defect 14: `rmqstore dump -c store.conf` of a store whose queue's only consume queue file was cut mid-unit
    is not refused: the other queues' files confirm the geometry; the file is extended and the queue rebuilt.
    Its output equals RocketMQ's dump, and what MessageStore.open then dump gives; the read-only view agrees."""
    conf = golden / "rmq440-clean" / "store.conf"
    a = _cut_copy(golden, tmp_path / "a")
    b = _cut_copy(golden, tmp_path / "b")
    c = _cut_copy(golden, tmp_path / "c")
    p = run_cli("dump", "-c", conf, "--keys", golden / "rmq440-clean" / "keys.tsv", a)
    assert p.returncode == 0, p.stderr.decode()
    out = tmp_path / "dump.jsonl"
    out.write_bytes(p.stdout)
    cmp = subprocess.run([os.sys.executable, compare_tools / "compare_dump.py", golden / "rmq440-clean" / "dump.jsonl",
                          out], capture_output=True)
    assert cmp.returncode == 0, cmp.stdout.decode()[-2000:]
    cfg = StoreConfig.load(conf)
    with MessageStore.open(b, cfg) as s:
        assert s.recovery_report.repaired_files
        lines = [line for line in dump_lines(s)]
    import json
    assert [json.loads(x) for x in p.stdout.decode().splitlines()[:len(lines)]] == \
        [json.loads(json.dumps(x)) for x in lines]
    view = SV.load_view(str(c), cfg)
    expected = {(d["queue"], d["queueId"]): (d["min"], d["max"])
                for d in read_jsonl(golden / "rmq440-clean" / "dump.jsonl") if "queue" in d}
    assert {k: (q.min_offset, q.end) for k, q in view.queues.items()} == expected
    offs, _ = view.queues[("TopicA", 0)].units(0, 10 ** 9)
    want = [d["commitLogOffset"] for d in read_jsonl(golden / "rmq440-clean" / "dump.jsonl")
            if d.get("topic") == "TopicA" and d.get("queueId") == 0]
    assert offs.tolist() == want
    assert (c / "consumequeue" / "TopicA" / "0" / "00000000000000000000").stat().st_size == 2010   # never written
