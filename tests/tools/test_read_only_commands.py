"""Read commands never modify a store (issue 15): `rmqstore dump`, `get`, `query`, `cat` and `stats` on a
store that needs recovery (abort file present, torn commitlog tail, damaged consume queue, a store killed
with SIGKILL) change no byte, file, mtime or directory entry and create nothing, and dump/get/query answer
exactly what a read-write MessageStore.open serves (on a copy)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rmqstore.store.format import codec
from rmqstore.store.conf.config import StoreConfig
from rmqstore.store.store import MessageStore
from rmqstore.tools.dump import dump_lines, read_keys

from conftest import read_jsonl, run_cli
from store_checks import Child
from store.test_recovery_plan import snapshot

UNIT = codec.CQ_STORE_UNIT_SIZE
CONF = "rmq440-crash"


def _torn(store: Path, golden: Path) -> None:
    end = read_jsonl(golden / CONF / "dump.jsonl")[0]["maxPhy"]
    cl = [p for p in sorted((store / "commitlog").iterdir()) if int(p.name) <= end][-1]
    with open(cl, "r+b") as f:
        f.seek(end - int(cl.name))
        f.write(b"\x00\x00\x02\x00" + b"\xab" * 100)


def _damaged_cq(store: Path, golden: Path) -> None:
    qfile = next(p for p in sorted((store / "consumequeue").rglob("0" * 20)) if p.stat().st_size > 400)
    with open(qfile, "r+b") as f:
        f.seek(7 * UNIT)
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x05" + bytes(12))   # a unit pointing at no record


def _abort_only(store: Path, golden: Path) -> None:
    assert (store / "abort").exists()


DAMAGE = {"abort": _abort_only, "torn_tail": _torn, "damaged_cq": _damaged_cq}


def rw_answers(store: Path, cfg: StoreConfig, keys, topic: str, qid: int, key: tuple[str, str]) -> dict:
    """What MessageStore.open serves for the same commands."""
    with MessageStore.open(store, cfg, start_services=False) as st:
        r = st.get_message("rmqstore-cli", topic, qid, 0, 32)
        return {"dump": list(dump_lines(st, keys)),
                "get": [m.to_json() for m in r.messages],
                "get_status": {"status": r.status.value, "nextBeginOffset": r.next_begin_offset,
                               "minOffset": r.min_offset, "maxOffset": r.max_offset, "count": r.message_count},
                "query": [m.to_json() for m in st.find_messages_by_key(key[0], key[1], 64, 0, 2 ** 63 - 1)]}


def lines(out: bytes) -> list:
    return [json.loads(x) for x in out.decode().splitlines() if x.strip()]


def check_commands(store: Path, copy: Path, conf: Path, cfg: StoreConfig, keys_file: Path) -> None:
    keys = read_keys(keys_file)
    before = snapshot(store)
    p = run_cli("dump", "-c", conf, "--keys", keys_file, store)
    assert p.returncode == 0, p.stderr.decode()
    dumped = lines(p.stdout)
    assert snapshot(store) == before, "dump changed the store"
    queue = next(d for d in dumped if "queue" in d and d["max"] > d["min"])
    topic, qid = queue["queue"], queue["queueId"]
    key = keys[0]
    g = run_cli("get", "-c", conf, store, topic, str(qid), "0")
    q = run_cli("query", "-c", conf, store, key[0], key[1])
    c = run_cli("cat", "-c", conf, store, "--limit", "50")
    s = run_cli("stats", "-c", conf, store)
    assert snapshot(store) == before, "a read command changed the store"
    for proc in (g, q, c, s):
        assert proc.returncode in (0, 1), proc.stderr.decode()
        assert b"Traceback" not in proc.stderr, proc.stderr.decode()
    want = rw_answers(copy, cfg, keys, topic, qid, key)
    assert dumped == want["dump"]
    assert lines(g.stdout) == want["get"]
    assert json.loads(g.stderr.decode().strip().splitlines()[-1]) == want["get_status"]
    assert lines(q.stdout) == want["query"]


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_read_commands_leave_a_store_needing_recovery_untouched(golden, golden_copy, tmp_path, damage):
    store = golden_copy(CONF)
    DAMAGE[damage](store, golden)
    copy = tmp_path / "rw-copy"
    shutil.copytree(store, copy)
    conf = golden / CONF / "store.conf"
    check_commands(store, copy, conf, StoreConfig.load(conf), golden / CONF / "keys.tsv")


def test_read_commands_leave_a_sigkilled_store_untouched(tmp_path):
    store = tmp_path / "killed"
    child = Child(store, "ASYNC_FLUSH", "ro", 21, max_seconds=60)
    try:
        assert child.ready.wait(60), child.err.decode()
        assert child.wait_puts(600, timeout=60), child.err.decode()
    finally:
        child.kill()
    acked = child.acked()
    conf = tmp_path / "store.conf"
    conf.write_text("mapedFileSizeCommitLog=65536\nmapedFileSizeConsumeQueue=600\nmaxHashSlotNum=64\n"
                    "maxIndexNum=256\n")
    keys_file = tmp_path / "keys.tsv"
    keys_file.write_text("".join(f"{a.topic}\t{a.key}\n" for a in acked[:20]))
    copy = tmp_path / "rw-copy"
    shutil.copytree(store, copy)
    check_commands(store, copy, conf, StoreConfig.load(conf), keys_file)


def test_a_live_store_is_read_without_touching_it(tmp_path):
    """A store another process holds open (its lock taken) is readable by dump: nothing changes under it."""
    store = tmp_path / "live"
    child = Child(store, "ASYNC_FLUSH", "live", 22, max_seconds=60)
    try:
        assert child.ready.wait(60), child.err.decode()
        assert child.wait_puts(200, timeout=60), child.err.decode()
        conf = tmp_path / "store.conf"
        conf.write_text("mapedFileSizeCommitLog=65536\nmapedFileSizeConsumeQueue=600\nmaxHashSlotNum=64\n"
                        "maxIndexNum=256\n")
        lock = (store / "lock").stat()
        p = run_cli("dump", "-c", conf, store)
        assert p.returncode == 0, p.stderr.decode()
        got = lines(p.stdout)
        assert got[0]["maxPhy"] > 0 and any("queueOffset" in d for d in got)
        assert (store / "lock").stat().st_mtime_ns == lock.st_mtime_ns
    finally:
        child.kill()
