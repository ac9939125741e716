"""One damaged byte in a record's TOPIC field (not covered by BODYCRC) of a crashed store (an outside audit):
MessageStore.open died with `ValueError: embedded null byte` naming no file, and a '/' made the dispatcher
create consumequeue/T/picA/0. A record read back from disk passes the same topic rule as a put
(validation.topic_problem, through the record scanner) before anything is named after it: one whose topic
no put could write is damage, reported with file and offset and confined like any other; so is a QUEUEID
no put could write (a directory is named after it too), and a SCHEDULE_TOPIC_XXXX QUEUEID that is no delay
level."""
from __future__ import annotations

import os

import pytest

from conftest import run_cli
from rmqstore import MessageStore
from store_checks import run_until_sigkilled, small_config

_WRITE_AND_DIE = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from rmqstore import Message, MessageStore
from store_checks import small_config
s = MessageStore.open({root!r}, small_config())
for i in range(200):
    assert s.put_message(Message("TopicA", b"m%d" % i, queue_id=0)).ok
assert s.wait_dispatched()
os.kill(os.getpid(), signal.SIGKILL)
"""


def _damage_record(root, n: int, what: str) -> int:
    """Damage record n: the second byte of its topic (NUL or '/') or the high byte of its QUEUEID; returns
    the record's commitlog offset."""
    f = root / "commitlog" / "00000000000000000000"
    data = bytearray(f.read_bytes())
    pos = 0
    for _ in range(n):
        pos += int.from_bytes(data[pos:pos + 4], "big")
    if what == "queueid":
        data[pos + 12] = 0x01                          # QUEUEID 0 -> 16777216
    else:
        data[data.index(b"TopicA", pos) + 1] = {"nul": 0, "slash": ord("/")}[what]
    f.write_bytes(bytes(data))
    return pos


@pytest.mark.parametrize("what", ["nul", "slash", "queueid"])
@pytest.mark.parametrize("queues", ["kept", "removed"])
def test_a_damaged_topic_or_queue_id_byte_is_confined_damage(tmp_path, what, queues):
    root = tmp_path / "store"
    run_until_sigkilled(_WRITE_AND_DIE, root)
    at = _damage_record(root, 100, what)
    if queues == "removed":                 # every record is dispatched again at the open
        import shutil
        shutil.rmtree(root / "consumequeue")
    with MessageStore.open(root, small_config()) as s:
        fails = [f for f in s.failures.failures() if f.offset == at]
        assert fails and fails[0].path.endswith("00000000000000000000"), [str(f) for f in s.failures.failures()]
        assert "damaged TOPIC field" in fails[0].reason or "damaged QUEUEID field" in fails[0].reason
        assert s.get_max_offset_in_queue("TopicA", 0) == 200      # later messages keep their queue offsets
        got = s.get_message("G", "TopicA", 0, 99, 3)
        assert [m.body for m in got.messages] == [b"m99", b"m101", b"m102"]   # the damaged one reads as removed
    assert sorted(os.listdir(root / "consumequeue")) == ["TopicA"]
    assert sorted(os.listdir(root / "consumequeue" / "TopicA")) == ["0"]
    r = run_cli("check", "-c", _conf(tmp_path), root)
    assert r.returncode == 1 and f"offset {at}" in r.stdout.decode() and "damaged" in r.stdout.decode(), r.stdout
    r = run_cli("check", "--repair", "-c", _conf(tmp_path), root)          # quarantined as accepted damage
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()
    assert run_cli("check", "-c", _conf(tmp_path), root).returncode == 0


def _conf(tmp_path):
    conf = tmp_path / "store.conf"
    if not conf.exists():
        conf.write_text(small_config().to_properties())
    return conf


@pytest.mark.parametrize("queues", ["kept", "removed"])
def test_a_schedule_queue_id_that_is_no_delay_level_is_damage(tmp_path, queues):
    """A flipped QUEUEID bit (not covered by BODYCRC) moved a delayed message of level 18 from
    SCHEDULE_TOPIC_XXXX/17 to queue 19, which no delay level has (messageDelayLevel: 18 levels, queues
    0..17). Before, the rebuild of the queues (the open's cut of queue 17 at the unit that no longer matches
    its record, or every queue removed) made SCHEDULE_TOPIC_XXXX/19 for it, and view_message_by_id answered
    the damaged record as a message of queue 19 (fuzzer seed 33). Now it gets no unit, is a CORRUPT_RECORD
    naming the commitlog file and offset (the rebuild of every queue: no delay level; the cut of queue 17:
    the unit written for it there), is never answered by id, and check reports it."""
    from rmqstore import Message
    from rmqstore.store.state.failure import FailureKind
    root = tmp_path / "store"
    with MessageStore.open(root, small_config()) as s:
        acks = [s.put_message(Message("TopicA", b"later %d" % j, properties={"KEYS": f"d-{j}", "DELAY": "18"}))
                for j in range(4)]
        assert s.wait_dispatched() and s.get_max_offset_in_queue("SCHEDULE_TOPIC_XXXX", 17) == 4
    at, msg_id = acks[2].append_result.wrote_offset, acks[2].append_result.msg_id
    f = root / "commitlog" / "00000000000000000000"
    data = bytearray(f.read_bytes())
    assert int.from_bytes(data[at + 12:at + 16], "big") == 17
    data[at + 15] ^= 0x02                                       # QUEUEID 17 -> 19
    f.write_bytes(bytes(data))
    if queues == "removed":
        import shutil
        shutil.rmtree(root / "consumequeue")
    for opening in range(2):                # the open that finds it, and a reopen
        with MessageStore.open(root, small_config()) as s:
            assert s.wait_dispatched()
            bad = [x for x in s.failures.failures(FailureKind.CORRUPT_RECORD) if x.offset == at]
            why = "no delay level" if queues == "removed" else "damaged QUEUEID"
            assert opening or (bad and bad[0].path == str(f) and why in bad[0].reason), \
                [str(x) for x in s.failures.failures()]
            assert s.view_message_by_id(msg_id) is None
            assert s.look_message_by_offset(at) is None
            assert s.get_max_offset_in_queue("SCHEDULE_TOPIC_XXXX", 19) == 0
            for off, ack in enumerate(acks):            # the others keep their offsets; 2 answers none
                got = s.get_message("G", "SCHEDULE_TOPIC_XXXX", 17, off, 1).messages
                want = [] if off == 2 else [b"later %d" % off]
                assert [m.body for m in got if m.queue_offset == off] == want, (off, got)
                if off != 2:
                    assert s.view_message_by_id(ack.append_result.msg_id).body == b"later %d" % off
    assert not (root / "consumequeue" / "SCHEDULE_TOPIC_XXXX" / "19").exists()
    r = run_cli("check", "-c", _conf(tmp_path), root)
    out = r.stdout.decode()
    assert r.returncode == 1 and f"offset {at}" in out and "no delay level" in out, out
    r = run_cli("check", "--repair", "-c", _conf(tmp_path), root)          # quarantined as accepted damage
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()
    assert run_cli("check", "-c", _conf(tmp_path), root).returncode == 0


def test_schedule_queues_of_more_delay_levels_than_configured_now_are_no_damage(tmp_path):
    """A store written with 20 delay levels, opened after a crash and checked with RocketMQ's default 18: its
    SCHEDULE_TOPIC_XXXX/19 holds real messages (the queue is on disk), which no check may call damage nor
    repair quarantine (a config change is not a damaged byte)."""
    from rmqstore import Message
    from rmqstore.store.state.failure import FailureKind
    root = tmp_path / "store"
    cfg20 = small_config(messageDelayLevel=" ".join(["1h"] * 20))
    with MessageStore.open(root, cfg20) as s:
        acks = [s.put_message(Message("TopicA", b"later %d" % j, properties={"DELAY": "20"})) for j in range(3)]
        assert s.wait_dispatched() and s.get_max_offset_in_queue("SCHEDULE_TOPIC_XXXX", 19) == 3
    (root / "abort").write_bytes(b"")           # a crash: the queues' ends are dispatched again at the open
    with MessageStore.open(root, small_config()) as s:
        assert s.wait_dispatched()
        assert not s.failures.failures(FailureKind.CORRUPT_RECORD), [str(x) for x in s.failures.failures()]
        for ack in acks:
            assert s.view_message_by_id(ack.append_result.msg_id) is not None
        assert s.get_max_offset_in_queue("SCHEDULE_TOPIC_XXXX", 19) == 3
    r = run_cli("check", "-c", _conf(tmp_path), root)
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()


def test_check_blames_the_moved_record_not_the_one_after_the_gap_it_left(tmp_path):
    """The damaged record (QUEUEID 17 -> 19 of SCHEDULE_TOPIC_XXXX) is the only one `check` reports: the gap
    it leaves in queue 17 before its last record is no damage of that record (whose QUEUEOFFSET is true), and
    `check --repair` keeps it readable."""
    from rmqstore import Message
    root = tmp_path / "store"
    with MessageStore.open(root, small_config()) as s:
        acks = [s.put_message(Message("TopicA", b"later %d" % j, properties={"DELAY": "18"})) for j in range(4)]
    at = acks[2].append_result.wrote_offset
    f = root / "commitlog" / "00000000000000000000"
    data = bytearray(f.read_bytes())
    data[at + 15] ^= 0x02                                       # QUEUEID 17 -> 19
    f.write_bytes(bytes(data))
    r = run_cli("check", "-c", _conf(tmp_path), root)
    out = r.stdout.decode()
    assert r.returncode == 1 and out.count("commitlog/00000000000000000000: offset") == 1, out
    assert f"offset {at}" in out and "no delay level" in out, out
    assert run_cli("check", "--repair", "-c", _conf(tmp_path), root).returncode == 0
    assert run_cli("check", "-c", _conf(tmp_path), root).returncode == 0
    with MessageStore.open(root, small_config()) as s:
        assert s.view_message_by_id(acks[3].append_result.msg_id).body == b"later 3"
        assert s.view_message_by_id(acks[2].append_result.msg_id) is None
