"""`rmqstore check STORE [--repair]` and MessageStore.check: a full consistency check (issue 15).

Clean golden copies check clean and are not touched (no lock file created, nothing written); each kind of
damage gives exit 1 with a line naming the damaged file; --repair rebuilds what is derived and quarantines
what is not, after which a second check is clean and every acknowledged message reads back as RocketMQ's
dump says.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_cli
from rmqstore.store.format import codec
from rmqstore.store.format import scanner
from rmqstore.store.check.check import check_store
from rmqstore.store.conf.config import StoreConfig
from rmqstore.store.reads.reader import CommitLogReader
from rmqstore.store.format.message import Message
from rmqstore.store.store import MessageStore

SET = "rmq440-clean"


def _fingerprint(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes() if p.stat().st_size
                                       < 1 << 20 else None)
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name", ["rmq440-clean", "rmq440-crash"])
def test_clean_golden_copies_check_clean_and_are_not_touched(golden, golden_copy, name):
    store = golden_copy(name)
    (store / "lock").unlink()
    before = _fingerprint(store)
    p = run_cli("check", "-c", golden / name / "store.conf", store)
    assert p.returncode == 0, p.stdout.decode() + p.stderr.decode()
    out = p.stdout.decode().splitlines()
    assert len(out) == 1 and ": ok: " in out[0] and "commitlog records" in out[0]
    assert _fingerprint(store) == before            # read only: no lock file, nothing written


def _record_positions(store: Path, cfg: StoreConfig) -> list[tuple[Path, int, int]]:
    with CommitLogReader(store, cfg) as r:
        return [(rec.file.path, rec.position, rec.size) for rec in r.records() if rec.kind == scanner.Outcome.MESSAGE]


def _flip(path: Path, at: int) -> None:
    a = bytearray(path.read_bytes())
    a[at] ^= 0x40
    path.write_bytes(bytes(a))


def _damage(store: Path, cfg: StoreConfig, how: str) -> str:
    """Damage the copy; returns the path fragment the problem line must name."""
    if how == "commitlog body flipped":
        path, pos, _ = _record_positions(store, cfg)[1500]
        _flip(path, pos + codec.HEADER_V4.size)                     # the first body byte: the CRC fails
        return f"commitlog/{path.name}"
    if how == "commitlog file missing":
        f = sorted((store / "commitlog").iterdir())[1]
        f.unlink()
        return "commitlog/"
    if how == "unit rewritten":
        f = store / "consumequeue" / "TopicA" / "0" / "00000000000000000000"
        a = bytearray(f.read_bytes())
        a[40 * 20 + 8:40 * 20 + 12] = (7).to_bytes(4, "big")        # unit 40's size no longer its record's
        f.write_bytes(bytes(a))
        return "consumequeue/TopicA/0/00000000000000000000"
    if how == "units zeroed":
        f = store / "consumequeue" / "TopicB" / "1" / "00000000000000000000"
        a = bytearray(f.read_bytes())
        a[20 * 20:30 * 20] = bytes(200)
        f.write_bytes(bytes(a))
        return "consumequeue/TopicB/1/00000000000000000000"
    if how == "queue tail zeroed":               # after a clean shutdown: open cannot tell, check can
        f = store / "consumequeue" / "TopicA" / "1" / "00000000000000000000"
        a = bytearray(f.read_bytes())
        end = len(a.rstrip(b"\0"))
        end += -end % 20
        a[end - 30 * 20:end] = bytes(30 * 20)
        f.write_bytes(bytes(a))
        return "consumequeue/TopicA/1/00000000000000000000"
    if how == "index entry hash":
        f = sorted((store / "index").iterdir())[0]
        at = codec.INDEX_HEADER_SIZE + cfg.max_hash_slot_num * 4 + 5 * codec.INDEX_ENTRY_SIZE
        a = bytearray(f.read_bytes())
        a[at:at + 4] = (12345).to_bytes(4, "big")
        f.write_bytes(bytes(a))
        return f"index/{f.name}"
    if how == "checkpoint ahead":
        f = store / "checkpoint"
        a = bytearray(f.read_bytes())
        a[0:8] = (int(time.time() * 1000) * 2).to_bytes(8, "big")
        f.write_bytes(bytes(a))
        return "checkpoint"
    if how == "config malformed":
        d = store / "config"
        d.mkdir(exist_ok=True)
        (d / "topics.json").write_text('{"topicConfigTable": [1, 2')
        (d / "topics.json.bak").write_text('{"topicConfigTable": {}}')
        return "config/topics.json"
    raise ValueError(how)  # pragma: no cover


DAMAGE = ["commitlog body flipped", "commitlog file missing", "unit rewritten", "units zeroed", "queue tail zeroed",
          "index entry hash", "checkpoint ahead", "config malformed"]
REPAIRABLE = ["unit rewritten", "units zeroed", "queue tail zeroed", "index entry hash", "checkpoint ahead",
              "config malformed"]


@pytest.mark.parametrize("how", DAMAGE)
def test_each_kind_of_damage_is_found_naming_the_file(golden, golden_copy, how):
    conf = golden / SET / "store.conf"
    store = golden_copy(SET)
    where = _damage(store, StoreConfig.load(conf), how)
    before = _fingerprint(store)
    p = run_cli("check", "-c", conf, store)
    out = p.stdout.decode().splitlines()
    assert p.returncode == 1, p.stdout.decode() + p.stderr.decode()
    assert any(where in line and ": offset " in line for line in out[:-1]), out
    assert "problem" in out[-1]
    assert _fingerprint(store) == before


@pytest.mark.parametrize("how", REPAIRABLE)
def test_repair_then_check_is_clean_and_every_message_reads_back(golden, golden_copy, compare_tools, tmp_path, how):
    conf = golden / SET / "store.conf"
    store = golden_copy(SET)
    _damage(store, StoreConfig.load(conf), how)
    p = run_cli("check", "-c", conf, "--repair", store)
    assert p.returncode == 0, p.stdout.decode() + p.stderr.decode()
    assert "repaired: " in p.stdout.decode()
    p = run_cli("check", "-c", conf, store)
    assert p.returncode == 0, p.stdout.decode() + p.stderr.decode()
    d = run_cli("dump", "-c", conf, "--keys", golden / SET / "keys.tsv", store)
    assert d.returncode == 0, d.stderr.decode()
    (tmp_path / "dump.jsonl").write_bytes(d.stdout)
    cmp = subprocess.run([sys.executable, compare_tools / "compare_dump.py", golden / SET / "dump.jsonl",
                          tmp_path / "dump.jsonl"], capture_output=True)
    assert cmp.returncode == 0, cmp.stdout.decode()[-2000:]
    if how == "config malformed":
        assert json.loads((store / "config" / "topics.json").read_text()) == {"topicConfigTable": {}}
        assert [f.name for f in (store / "config").iterdir() if ".corrupt-" in f.name]


def _commitlog_bytes(store: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted((store / "commitlog").iterdir())}


@pytest.mark.parametrize("where", ["body", "header"])
def test_repair_quarantines_commitlog_damage_and_check_is_then_clean(golden, golden_copy, where):
    """Commitlog damage is not derived: `--repair` copies the damaged bytes to quarantine/ (a file named by
    the commitlog offset, a JSON line saying file, offset, length, reason, time), records the range as
    accepted damage (config/damagedRanges.json), changes no commitlog byte, rebuilds the queues without the
    damaged record; `check` then reports the range as one note and exits 0 (it exited 1 forever before)."""
    conf = golden / SET / "store.conf"
    cfg = StoreConfig.load(conf)
    store = golden_copy(SET)
    with CommitLogReader(store, cfg) as r:       # a message that goes to a consume queue, past the middle
        m = next(m for i, m in enumerate(r.messages()) if i >= 1500 and scanner.is_dispatched(m.sys_flag))
    topic, qid, qoff = m.topic, m.queue_id, m.queue_offset
    path, pos, size = next(x for x in _record_positions(store, cfg) if int(x[0].name) + x[1] == m.commit_log_offset)
    base = int(path.name)
    _flip(path, pos + (codec.HEADER_V4.size if where == "body" else codec.POS_QUEUEOFFSET + 2))
    damaged = _commitlog_bytes(store)
    assert run_cli("check", "-c", conf, store).returncode == 1
    p = run_cli("check", "-c", conf, "--repair", store)
    assert p.returncode == 0, p.stdout.decode() + p.stderr.decode()
    assert "quarantine/" in p.stdout.decode() and "accepted damage" in p.stdout.decode()
    assert _commitlog_bytes(store) == damaged                       # nothing in the commitlog changed
    qfile = store / "quarantine" / f"{base + pos:020d}"
    assert qfile.read_bytes()[:size] == damaged[path.name][pos:pos + size]
    (line,) = (store / "quarantine" / "quarantine.jsonl").read_text().splitlines()
    logged = json.loads(line)
    assert logged["offset"] == base + pos and logged["length"] >= size and logged["file"] == f"commitlog/{path.name}"
    assert logged["reason"] and logged["time"]
    ranges = json.loads((store / "config" / "damagedRanges.json").read_text())["ranges"]
    assert [(r["offset"], r["length"]) for r in ranges] == [(base + pos, logged["length"])]
    p = run_cli("check", "-c", conf, store)
    assert p.returncode == 0, p.stdout.decode() + p.stderr.decode()
    notes = [n for n in p.stderr.decode().splitlines() if "accepted damage" in n]
    assert len(notes) == 1 and path.name in notes[0], p.stderr.decode()
    with MessageStore.open(store, cfg) as s:
        got = s.get_message("g", topic, qid, qoff, 1)
        assert not got.messages or got.messages[0].commit_log_offset != base + pos
        assert s.get_message("g", topic, qid, qoff + 1, 1).messages        # the next message reads


def test_a_record_moved_to_a_queue_of_its_own_is_damage_and_repair_quarantines_it(golden, golden_copy):
    """A flipped QUEUEID bit moves one of RocketMQ's records to a queue that does not exist (queue id + 256:
    the fuzzer's seed 505). The commitlog holds every record from offset 0, so each queue's records claim
    0, 1, 2, ...: a queue whose only record claims a later offset is header damage. check names the record
    (file, offset); --repair quarantines it and rebuilds without it, and it is never answered. Before,
    check named only the unit and the queue missing, --repair's rebuild made the queue for the record, the
    next check said ok and view_message_by_id answered it as a message of that queue."""
    conf = golden / SET / "store.conf"
    cfg = StoreConfig.load(conf)
    store = golden_copy(SET)
    with CommitLogReader(store, cfg) as r:
        m = next(m for i, m in enumerate(r.messages()) if i >= 1500 and scanner.is_dispatched(m.sys_flag))
    path, pos, _ = next(x for x in _record_positions(store, cfg) if int(x[0].name) + x[1] == m.commit_log_offset)
    a = bytearray(path.read_bytes())
    a[pos + codec.POS_QUEUEID + 2] ^= 0x01                      # queue id + 256
    path.write_bytes(bytes(a))
    p = run_cli("check", "-c", conf, store)
    out = p.stdout.decode()
    assert p.returncode == 1 and f"{path}: offset {pos}: record {pos}.." in out and \
        f"out of the sequence of {m.topic}/{m.queue_id + 256}" in out, out
    p = run_cli("check", "-c", conf, "--repair", store)
    assert p.returncode == 0 and f"quarantine/{m.commit_log_offset:020d}" in p.stdout.decode(), p.stdout.decode()
    assert run_cli("check", "-c", conf, store).returncode == 0
    with MessageStore.open(store, cfg) as s:
        assert s.view_message_by_id(m.msg_id) is None
        assert s.get_max_offset_in_queue(m.topic, m.queue_id + 256) == 0
        assert s.get_message("g", m.topic, m.queue_id, m.queue_offset + 1, 1).messages     # the next one reads


def test_repair_accepts_a_missing_commitlog_file(golden, golden_copy):
    conf = golden / SET / "store.conf"
    store = golden_copy(SET)
    _damage(store, StoreConfig.load(conf), "commitlog file missing")
    p = run_cli("check", "-c", conf, "--repair", store)
    assert p.returncode == 0, p.stdout.decode() + p.stderr.decode()
    p = run_cli("check", "-c", conf, store)
    assert p.returncode == 0 and "accepted damage" in p.stderr.decode(), p.stdout.decode() + p.stderr.decode()


def test_not_a_store_is_one_line_exit_2(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    for target in (tmp_path / "missing", f, tmp_path):
        p = run_cli("check", target)
        err = p.stderr.decode().strip().splitlines()
        assert p.returncode == 2 and len(err) == 1 and "not a store directory" in err[0], err
    assert not (tmp_path / "missing").exists() and not (tmp_path / "lock").exists()


CHILD = """
import sys, time
from rmqstore.store.store import MessageStore
from rmqstore.store.conf.config import StoreConfig
s = MessageStore.open(sys.argv[1], StoreConfig.load(sys.argv[2]))
print("READY", flush=True)
time.sleep(60)
"""


def test_store_open_elsewhere_is_said_and_repair_refused(golden, golden_copy):
    conf = golden / SET / "store.conf"
    store = golden_copy(SET)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(store), str(conf)], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"READY"
        p = run_cli("check", "-c", conf, store)
        assert p.returncode == 0, p.stdout.decode() + p.stderr.decode()
        assert f"open in process {child.pid}" in p.stderr.decode()
        p = run_cli("check", "-c", conf, "--repair", store)
        assert p.returncode == 2 and len(p.stderr.decode().strip().splitlines()) == 1, p.stderr.decode()
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


def test_message_store_check_on_an_open_store(golden, golden_copy):
    conf = golden / SET / "store.conf"
    store = golden_copy(SET)
    with MessageStore.open(store, StoreConfig.load(conf)) as s:
        rep = s.check()
        assert rep.ok, [str(p) for p in rep.problems]
        assert rep.records == 3000 and rep.units == 2480
        assert rep.summary().startswith(f"{store}: ok")


def test_check_reports_every_file_kind_via_api(golden, golden_copy):
    conf = golden / SET / "store.conf"
    cfg = StoreConfig.load(conf)
    store = golden_copy(SET)
    for how in REPAIRABLE:
        _damage(store, cfg, how)
    kinds = {p.kind for p in check_store(store, cfg).problems}
    assert kinds == {"consume queue", "index", "checkpoint", "config"}


def test_repair_moves_a_cut_index_file_aside(tmp_path):
    """An index file cut short is refused at open (a wrong configuration is likelier), and `check --repair`,
    asked with this configuration, moves it aside and indexes its keys again (found by the outside tester:
    open, dump and check --repair all refused, and nothing repaired the derived file)."""
    from rmqstore.store.format.message import Message
    path = tmp_path / "store"
    cfg = {"mappedFileSizeCommitLog": 65536, "mappedFileSizeConsumeQueue": 600}
    with MessageStore.open(path, StoreConfig.from_dict(cfg)) as s:
        for i in range(500):
            s.put_message(Message("T", b"m%d" % i, properties={"KEYS": f"k{i}"}))
    conf = tmp_path / "store.conf"
    conf.write_text("".join(f"{k}={v}\n" for k, v in cfg.items()))
    (f,) = [p for p in (path / "index").iterdir()]
    f.write_bytes(f.read_bytes()[:1000])
    r = run_cli("dump", "-c", conf, path)
    assert r.returncode == 2 and b"check --repair" in r.stderr, r.stderr
    r = run_cli("check", "-c", conf, "--repair", path)
    assert r.returncode == 0, r.stdout.decode()[-1500:]
    assert any(p.name.startswith(f.name + ".corrupt-") for p in (path / "index").iterdir())
    assert run_cli("check", "-c", conf, path).returncode == 0
    with MessageStore.open(path, StoreConfig.from_dict(cfg)) as s:
        assert [m.body for m in s.find_messages_by_key("T", "k321")] == [b"m321"]


WRITER = """
import sys, time
from rmqstore import Message, MessageStore, StoreConfig
s = MessageStore.open(sys.argv[1], StoreConfig.from_dict({"mappedFileSizeCommitLog": 1 << 20,
                                                         "mappedFileSizeConsumeQueue": 6000}))
for i in range(500):
    s.put_message(Message("T", b"x" * 100, properties={"KEYS": f"k{i}"}))
s.wait_dispatched(60)
print("READY", flush=True)
i = 500
while True:                                  # puts until killed: files roll, queues and index follow
    s.put_message(Message("T", b"x" * 100, properties={"KEYS": f"k{i}"}))
    i += 1
"""


def test_check_on_a_store_being_written_says_it_is_open_and_checks_what_is_stable(tmp_path):
    """A live store's abort file, units and index entries written after the commitlog scan, the newest index
    file's slots and a checkpoint ahead of the scan are normal: check says which process has the store open
    and exits 0 (it reported thousands of units and entries "pointing at no record" and exited 1)."""
    store = tmp_path / "store"
    conf = tmp_path / "store.conf"
    conf.write_text("mappedFileSizeCommitLog=1048576\nmappedFileSizeConsumeQueue=6000\n")
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(store)], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"READY"
        for _ in range(3):
            p = run_cli("check", "-c", conf, store)
            assert p.returncode == 0, p.stdout.decode()[-3000:] + p.stderr.decode()[-1000:]
            assert f"open in process {child.pid}" in p.stderr.decode()
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


def test_a_live_stores_newest_files_still_empty_are_being_created_not_damage(tmp_path):
    """A live store's newest commitlog, queue and index files with no bytes yet are files their writer has
    just created (RocketMQ sizes a file after creating it): check passes them; the same files in a closed
    store are problems (CI saw check fail on a live store's queue file of size 0)."""
    path = tmp_path / "store"
    cfg = StoreConfig.from_dict({"mappedFileSizeCommitLog": 65536, "mappedFileSizeConsumeQueue": 600})
    with MessageStore.open(path, cfg) as s:
        for i in range(30):             # the queue's first file is full: the next one is created
            s.put_message(Message("T", b"m%d" % i, properties={"KEYS": f"k{i}"}))
    (path / "commitlog" / f"{65536:020d}").touch()
    (path / "consumequeue" / "T" / "0" / f"{600:020d}").unlink(missing_ok=True)
    (path / "consumequeue" / "T" / "0" / f"{600:020d}").touch()
    (path / "index" / "99999999999999999").touch()
    live = check_store(path, cfg, live=True)
    assert live.ok, live.problems
    assert live.records == live.units == 30
    closed = check_store(path, cfg, live=False)
    assert sorted(p.kind for p in closed.problems) == ["commitlog", "consume queue", "index"], closed.problems


def test_a_new_store_file_appears_whole(tmp_path):
    """A mapped file is created at its full size under a hidden name and renamed into place: no reader
    ever sees it empty, and no temporary is left (a stale one from a crash is overwritten)."""
    from rmqstore.store.files.mapped_file import MappedFile
    p = tmp_path / f"{0:020d}"
    (tmp_path / f".{p.name}.new").write_bytes(b"stale")
    mf = MappedFile(p, 8192)
    try:
        assert p.stat().st_size == 8192
        assert sorted(x.name for x in tmp_path.iterdir()) == [p.name]
    finally:
        mf.close()


def test_opening_a_store_removes_files_a_crash_left_half_made(tmp_path, caplog):
    """A SIGKILL between creating a commitlog or consume queue file under its hidden name and renaming it
    leaves `.NAME.new` (a kill loop of the test suite did): RocketMQ's load takes every file of the directory
    and refuses the store for it. Opening the store removes them, saying so; a read-only open changes nothing,
    and a link at that name (or anything else hidden) is left alone."""
    import logging
    from rmqstore.store.format.message import Message
    from rmqstore.store.reads.store_reader import StoreReader
    path = tmp_path / "store"
    cfg = StoreConfig.from_dict({"mappedFileSizeCommitLog": 65536, "mappedFileSizeConsumeQueue": 600})
    with MessageStore.open(path, cfg) as s:
        assert s.put_message(Message("T", b"x", queue_id=0)).ok
    cl, cq = path / "commitlog", path / "consumequeue" / "T" / "0"
    half = [cl / f".{65536:020d}.new", cq / f".{600:020d}.new"]
    for p in half:
        p.write_bytes(b"\0" * 4096)
    outside = tmp_path / "outside"
    outside.write_bytes(b"mine")
    kept = [cl / ".keep", cq / f".{1200:020d}.new"]
    kept[0].write_bytes(b"mine")
    kept[1].symlink_to(outside)
    StoreReader.open(path, cfg).close()
    assert all(p.exists() for p in half)
    with caplog.at_level(logging.WARNING):
        with MessageStore.open(path, cfg) as s:
            assert s.get_max_offset_in_queue("T", 0) == 1
    assert not any(p.exists() for p in half)
    for p in half:
        assert any(p.name in r.getMessage() and "removed" in r.getMessage() for r in caplog.records), p
    assert kept[0].read_bytes() == b"mine" and kept[1].is_symlink() and outside.read_bytes() == b"mine"


def test_check_names_files_a_crash_left_half_made_and_repair_removes_them(tmp_path):
    """`.NAME.new` in a closed store's commitlog, consume queue or index directory is a problem (exit 1, the
    file named), a note in a live store (its writer may be making it); --repair removes them and says so."""
    path = tmp_path / "store"
    cfg = StoreConfig.from_dict({"mappedFileSizeCommitLog": 65536, "mappedFileSizeConsumeQueue": 600})
    with MessageStore.open(path, cfg) as s:
        assert s.put_message(Message("T", b"x", queue_id=0, properties={"KEYS": "k"})).ok
        assert s.wait_dispatched()
        half = [path / "commitlog" / f".{65536:020d}.new", path / "consumequeue" / "T" / "0" / f".{600:020d}.new"]
        for p in half:
            p.write_bytes(b"\0" * 4096)
        live = check_store(path, cfg)
        assert live.ok and sum(str(p) in n and "its writer is making" in n for p in half for n in live.notes) == 2
    conf = tmp_path / "store.conf"
    conf.write_text(cfg.to_properties())
    others = [path / "commitlog" / n for n in (".1.new", ".\u00b2\u00b3.new", "." + "\u0661" * 20 + ".new", f".{65536:020d}.New")]
    for o in others:                        # no name _open_new makes: not its, left alone
        o.write_bytes(b"mine")
    (path / "index" / f".{2 * 10 ** 16:017d}.new").mkdir()     # named like one, but a directory
    p = run_cli("check", "-c", conf, path)
    out = p.stdout.decode()
    assert p.returncode == 1 and all(f"{h}: offset 0: a file a crash left half made" in out for h in half), out
    assert "index/.20000000000000000.new: offset 0: not a regular file, named like a new store file" in out
    assert out.count("offset 0:") == 3, out
    p = run_cli("check", "--repair", "-c", conf, path)
    out = p.stdout.decode() + p.stderr.decode()
    assert all(f"{h}: removed, a file a crash left half made" in out for h in half), out
    assert not any(h.exists() for h in half) and all(o.read_bytes() == b"mine" for o in others)
    (path / "index" / f".{2 * 10 ** 16:017d}.new").rmdir()
    with MessageStore.open(path, cfg) as s:
        assert s.get_max_offset_in_queue("T", 0) == 1


def test_repair_never_writes_through_a_symlink_out_of_the_store(tmp_path):
    """A consume queue file that is a symbolic link to a file outside the store: `check` names it, `check
    --repair` refuses (exit 2, one line naming it) and the file outside is untouched (the repair rebuilt
    the queue through the link before)."""
    from rmqstore.store.format.message import Message
    path = tmp_path / "store"
    cfg = {"mappedFileSizeCommitLog": 65536, "mappedFileSizeConsumeQueue": 600}
    with MessageStore.open(path, StoreConfig.from_dict(cfg)) as s:
        for i in range(100):
            s.put_message(Message("T", b"m%d" % i))
    conf = tmp_path / "store.conf"
    conf.write_text("".join(f"{k}={v}\n" for k, v in cfg.items()))
    cq = path / "consumequeue" / "T" / "0" / f"{0:020d}"
    outside = tmp_path / "outside-file"
    outside.write_bytes(cq.read_bytes()[:200] + bytes(400))      # units 10.. lost: a queue to repair
    cq.unlink()
    cq.symlink_to(outside)
    before = outside.read_bytes()
    p = run_cli("check", "-c", conf, path)
    assert p.returncode == 1 and f"{cq}: offset 0: a symbolic link to {outside}" in p.stdout.decode(), p.stdout.decode()
    p = run_cli("check", "-c", conf, "--repair", path)
    err = p.stderr.decode().strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and str(cq) in err[0] and "symbolic link" in err[0], err
    assert outside.read_bytes() == before and cq.is_symlink()


def test_message_store_check_repair_keeps_commitlog_damage_in_its_report(golden, golden_copy):
    """check(repair=True) on an open store repairs what is derived, never touches the commitlog, and a body
    flip stays in the report it returns (not ok, naming the commitlog file): it is not said repaired."""
    conf = golden / SET / "store.conf"
    cfg = StoreConfig.load(conf)
    store = golden_copy(SET)
    path, pos, _ = _record_positions(store, cfg)[1500]
    _flip(path, pos + codec.HEADER_V4.size)
    damaged = _commitlog_bytes(store)
    with MessageStore.open(store, cfg) as s:
        rep = s.check(repair=True)
        assert not rep.ok
        assert any(path.name in str(p) for p in rep.problems), [str(p) for p in rep.problems]
    assert _commitlog_bytes(store) == damaged
