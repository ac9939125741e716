"""MessageStore against the golden sets: dumps, rebuilds, getMessage statuses, lookups."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import golden_dir

from rmqstore.store.check import background_check
from rmqstore.store.format import codec
from rmqstore.store.conf.config import StoreConfig
from rmqstore.tools.dump import dump_lines, read_keys
from rmqstore.store.format.message import GetMessageStatus, Message, PutMessageStatus
from rmqstore.store.store import MessageStore

GOLDEN = golden_dir()     # $RMQSTORE_GOLDEN, else ../shared/golden (conftest)
TOOLS = GOLDEN.parent / "tools"


def copy_store(name: str, dst: Path) -> Path:
    out = dst / name
    shutil.copytree(GOLDEN / name / "store", out)
    for p in [out, *out.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return out


def golden_cfg(name: str) -> StoreConfig:
    return StoreConfig.load(GOLDEN / name / "store.conf")


def write_dump(store: MessageStore, name: str, path: Path) -> Path:
    keys = read_keys(GOLDEN / name / "keys.tsv")
    with open(path, "w", encoding="utf-8") as f:
        for line in dump_lines(store, keys):
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    return path


def compare(expected: Path, actual: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOLS / "compare_dump.py"), str(expected), str(actual)],
                          capture_output=True, text=True)


@pytest.mark.parametrize("name", ["rmq440-clean", "rmq440-crash"])
def test_golden_store_dumps_equal(tmp_path, name):
    path = copy_store(name, tmp_path)
    with MessageStore.open(path, golden_cfg(name)) as store:
        out = write_dump(store, name, tmp_path / "dump.jsonl")
    r = compare(GOLDEN / name / "dump.jsonl", out)
    assert r.returncode == 0, r.stdout


def test_crash_set_recovery_reports(tmp_path):
    path = copy_store("rmq440-crash", tmp_path)
    with MessageStore.open(path, golden_cfg("rmq440-crash")) as store:
        rep = store.recovery_report
        assert not rep.clean_shutdown
        assert rep.redispatched_messages > 0   # the queues were behind the commitlog
        assert store.get_max_phy_offset() == 2452602
    assert not (path / "abort").exists()        # closed cleanly now


def _load_messages(store: MessageStore, name: str) -> list:
    msgs = [Message.from_json(json.loads(l)) for l in open(GOLDEN / name / "messages.jsonl", encoding="utf-8")]
    return store.put_messages(msgs)


@pytest.mark.parametrize("name", ["rmq440-clean", "rmq440-crash"])
def test_written_store_dumps_equal_but_store_time(tmp_path, name):
    path = tmp_path / "store"
    with MessageStore.open(path, golden_cfg(name)) as store:
        results = _load_messages(store, name)
        assert all(r.status is PutMessageStatus.PUT_OK for r in results)
        store.wait_dispatched()
        out = write_dump(store, name, tmp_path / "dump.jsonl")
    expected = [json.loads(l) for l in open(GOLDEN / name / "dump.jsonl", encoding="utf-8")]
    actual = [json.loads(l) for l in open(out, encoding="utf-8")]
    assert len(actual) == len(expected)
    for e, a in zip(expected, actual):
        e.pop("storeTimestamp", None)
        a.pop("storeTimestamp", None)
        assert a == e


def test_get_message_statuses(tmp_path):
    cfg = StoreConfig.from_dict({"mappedFileSizeCommitLog": 65536, "mappedFileSizeConsumeQueue": 200})
    with MessageStore.open(tmp_path / "s", cfg) as store:
        assert store.get_message("g", "T", 0, 0, 32).status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
        rs = store.put_messages([Message("T", b"x%d" % i, queue_id=0, properties={"TAGS": "A" if i % 2 else "B"})
                                 for i in range(25)])
        assert [r.append_result.logics_offset for r in rs] == list(range(25))
        store.wait_dispatched()
        r = store.get_message("g", "T", 0, 0, 4)
        assert r.status is GetMessageStatus.FOUND and [m.body for m in r.messages] == [b"x0", b"x1", b"x2", b"x3"]
        assert r.next_begin_offset == 4 and r.max_offset == 25
        # a batch never crosses a consume queue file (10 units per file here)
        r = store.get_message("g", "T", 0, 8, 32)
        assert r.message_count == 2 and r.next_begin_offset == 10
        assert store.get_message("g", "T", 0, 25, 32).status is GetMessageStatus.OFFSET_OVERFLOW_ONE
        bad = store.get_message("g", "T", 0, 40, 32)
        assert bad.status is GetMessageStatus.OFFSET_OVERFLOW_BADLY and bad.next_begin_offset == 0

        class OnlyA:
            code = codec.tags_code("A")

            def is_matched_by_consume_queue(self, tags_code):
                return tags_code == self.code

            def is_matched_by_commit_log(self, msg):
                return msg.tags == "A"

        r = store.get_message("g", "T", 0, 0, 3, OnlyA())
        assert [m.queue_offset for m in r.messages] == [1, 3, 5]
        assert store.get_commit_log_offset_in_queue("T", 0, 1) == rs[1].append_result.wrote_offset
        assert store.view_message_by_id(rs[7].append_result.msg_id).body == b"x7"
        ts = rs[12].append_result.store_timestamp
        assert store.get_message_store_timestamp("T", 0, 12) == ts
        off = store.get_offset_in_queue_by_time("T", 0, ts)
        assert store.get_message_store_timestamp("T", 0, off) == ts
        assert store.get_message_total_in_queue("T", 0) == 25


def test_queue_offsets_continue_after_reopen(tmp_path):
    cfg = StoreConfig.from_dict({"mappedFileSizeCommitLog": 65536})
    with MessageStore.open(tmp_path / "s", cfg) as store:
        store.put_messages([Message("T", b"a", queue_id=i % 3) for i in range(30)])
    with MessageStore.open(tmp_path / "s", cfg) as store:
        r = store.put_message(Message("T", b"b", queue_id=1))
        assert r.append_result.logics_offset == 10
        assert store.recovery_report.clean_shutdown
        store.wait_dispatched()
        assert store.get_max_offset_in_queue("T", 1) == 11


def test_find_messages_by_key_checks_topic_and_key(tmp_path):
    path = copy_store("rmq440-clean", tmp_path)
    with MessageStore.open(path, golden_cfg("rmq440-clean")) as store:
        for topic, key in read_keys(GOLDEN / "rmq440-clean" / "keys.tsv")[:50]:
            found = store.find_messages_by_key(topic, key)
            raw = store.query_message(topic, key, 64).messages
            assert len({m.commit_log_offset for m in found}) == len(found)
            for m in found:
                assert m.topic == topic and (key in m.keys or m.properties.get("UNIQ_KEY") == key)
            assert {m.commit_log_offset for m in found} <= {m.commit_log_offset for m in raw}


def test_corrupt_consume_queue_units_read_without_crash(tmp_path, caplog):
    """Units overwritten while the store is open: pointing past the commitlog, into the middle of a
    record, or garbage sizes give no message and a warning; a read stops before them (never past: a
    consumer does not skip the messages they lost) and the store repairs the queue from the commitlog,
    after which every message reads at its offset."""
    import time
    cfg = StoreConfig.from_dict({"mappedFileSizeCommitLog": 65536, "mappedFileSizeConsumeQueue": 2000})
    with MessageStore.open(tmp_path / "s", cfg) as store:
        rs = store.put_messages([Message("T", b"m%d" % i) for i in range(20)])
        store.wait_dispatched()
        # the damage comes after the background check's pass, which would otherwise find and repair it first
        assert store.service(background_check.NAME).wait(60)
        cq_file = tmp_path / "s" / "consumequeue" / "T" / "0" / ("0" * 20)
        with open(cq_file, "r+b") as f:
            f.seek(3 * 20)
            f.write(codec.CQ_UNIT.pack(10 ** 9, 100, 0))                                  # past the end
            f.write(codec.CQ_UNIT.pack(rs[4].append_result.wrote_offset + 7, 90, 0))     # mid-record
            f.write(codec.CQ_UNIT.pack(rs[5].append_result.wrote_offset, 2 ** 31 - 1, 0))  # huge size
        got = []
        offset = 0
        deadline = time.monotonic() + 30
        with caplog.at_level("WARNING"):
            while offset < 20 and time.monotonic() < deadline:
                r = store.get_message("g", "T", 0, offset, 32)
                got += [m.queue_offset for m in r.messages]
                assert r.next_begin_offset >= offset
                offset = r.next_begin_offset
        assert got == list(range(20))
        assert "points past the commitlog" in caplog.text
