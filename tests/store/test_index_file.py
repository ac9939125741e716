"""IndexFile / IndexService: byte compatibility with RocketMQ 4.4.0's index files, queries, corruption.

The golden stores ($RMQSTORE_GOLDEN, else ../shared/golden) are read-only: every test works on a copy in a tmp dir.
"""
from __future__ import annotations

import json
import logging
import os
import random
import shutil
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import golden_dir

from rmqstore.store.format import codec
from rmqstore.store.format import scanner
from rmqstore.store.conf.config import StoreConfig
from rmqstore.errors import CorruptStoreError
from rmqstore.store.index.index_file import ENTRY_SIZE, HEADER_SIZE, IndexFile, IndexService, key_hash, key_hashes, time_millis_to_human_string

GOLDEN = golden_dir()     # $RMQSTORE_GOLDEN, else ../shared/golden (conftest)
SETS = ["rmq440-clean", "rmq440-crash"]
LOGGER = "rmqstore.store.index.index_file"
FOREVER = 2 ** 63 - 1

needs_golden = pytest.mark.usefixtures("golden")     # fails (never skips) when the golden data is missing


# --- helpers -------------------------------------------------------------------------------------------
def _copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for root, dirs, files in os.walk(dst):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    return dst


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    """Per set: config, checkpoint, dispatch requests of every record (physical order), dump queries."""
    out = {}
    for name in SETS:
        src = GOLDEN / name
        if not src.is_dir():
            continue
        copy = _copy_tree(src / "store", tmp_path_factory.mktemp(name) / "store")
        reqs = []
        cl = copy / "commitlog"
        for fname in sorted(os.listdir(cl)):       # files in name order; a blank record ends a file
            buf = (cl / fname).read_bytes()
            base = int(fname)
            for pos, kind, _size in scanner.iter_records(buf, 0, len(buf)):
                if kind == scanner.Outcome.END_OF_FILE:
                    break
                reqs.append(codec.dispatch_request_at(buf, pos, base))
        cp = struct.unpack_from(">qqq", (copy / "checkpoint").read_bytes())
        queries = [json.loads(line) for line in (src / "dump.jsonl").open(encoding="utf-8") if '"query"' in line]
        out[name] = dict(cfg=StoreConfig.load(src / "store.conf"), reqs=reqs, index_ckpt=cp[2],
                         index_dir=copy / "index", queries=queries, abort=(copy / "abort").exists())
    return out


def _header(raw: bytes) -> tuple:
    return struct.unpack_from(">qqqqii", raw, 0)


def _index_files(d: Path) -> list[Path]:
    return sorted((p for p in d.iterdir() if p.name.isdigit()), key=lambda p: p.name)


def _rebuild(tmp: Path, cfg: StoreConfig, reqs, mode: str) -> IndexService:
    svc = IndexService(tmp, cfg)
    svc.load(True, 0)
    if mode == "batch":
        svc.build_index_batch(reqs)
    elif mode == "single":
        for r in reqs:
            svc.build_index(r)
    else:  # chunks of varied sizes: both the per-key and the vectorised path, rolling inside chunks
        rng = random.Random(7)
        i = 0
        while i < len(reqs):
            n = rng.choice([1, 3, 11, 40, 200])
            svc.build_index_batch(reqs[i:i + n])
            i += n
    return svc


def _assert_same_index(golden_files: list[Path], ours: list[Path], slot_num: int) -> None:
    assert len(ours) == len(golden_files)
    for g, o in zip(golden_files, ours):
        graw, oraw = g.read_bytes(), o.read_bytes()
        assert len(graw) == len(oraw)
        assert oraw[HEADER_SIZE:] == graw[HEADER_SIZE:], f"{o.name} vs golden {g.name}: slots/entries differ"
        gh, oh = _header(graw), _header(oraw)
        assert oh[:4] == gh[:4] and oh[5] == gh[5], (o.name, g.name, oh, gh)
        # hashSlotCount: RocketMQ 4.4.0 counts every put (= indexCount - 1); ours counts slots in use.
        assert gh[4] == gh[5] - 1
        used = int(np.count_nonzero(np.frombuffer(graw, dtype=">i4", count=slot_num, offset=HEADER_SIZE)))
        assert oh[4] == used


def _check_queries(svc: IndexService, queries) -> list:
    wrong = []
    for q in queries:
        offs, _, _ = svc.query_offset(q["query"], q["key"], 64, 0, FOREVER)
        if sorted(offs) != q["offsets"]:
            wrong.append((q, sorted(offs)))
    return wrong


# --- key hashes ----------------------------------------------------------------------------------------
def _java_key_hash(s: str) -> int:
    """Reference: Horner over the UTF-16 code units (lone surrogates as themselves), abs, MIN -> 0."""
    raw = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(raw), 2):
        h = (31 * h + (raw[i] << 8 | raw[i + 1])) & 0xFFFFFFFF
    if h >= 1 << 31:
        h -= 1 << 32
    return 0 if h == -(1 << 31) else abs(h)


def test_key_hashes_match_java_string_hash():
    rng = random.Random(1)
    alphabet = "abcXYZ09#%-_ \u00e9\u00ff\u4e2d\u952e\U0001F600\U00010348"
    keys = ["", "a", "polygenelubricants", "TopicA#key-1", "\ud800x", "x" * 5000, "\u4e2d" * 4100]
    keys += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 60))) for _ in range(3000)]
    vec = key_hashes(keys).tolist()
    for k, v in zip(keys, vec):
        assert key_hash(k) == v == _java_key_hash(k), k
        if "\ud800" not in k:
            assert v == codec.index_key_hash(k)
    assert key_hash("polygenelubricants") == 0          # hashCode is Integer.MIN_VALUE
    assert key_hashes(["\ud800x"])[0] == (0xD800 * 31 + ord("x"))
    assert len(key_hashes([])) == 0


@pytest.mark.parametrize("chunk", [1 << 20, 64, 1])
@pytest.mark.parametrize("lengths", [[32], [0, 7, 43], list(range(0, 12)), list(range(0, 40)), [5000],
                                     list(range(1, 21)) + [300]])
def test_key_hashes_of_batches_in_one_piece_and_in_chunks(lengths, chunk, monkeypatch):
    """A batch hashes in one cumulative sum, or in pieces of about `chunk` units when it is long (a key
    longer than a piece alone in its piece): all equal Java's String.hashCode, ASCII and not."""
    from rmqstore.store.index import index_file

    monkeypatch.setattr(index_file, "_HASH_CHUNK_UNITS", chunk)
    rng = random.Random(len(lengths))
    keys = ["".join(rng.choice("ABCDEF0123456789#-_ ~") for _ in range(rng.choice(lengths))) for _ in range(500)]
    keys.append("polygenelubricants")               # hashCode is Integer.MIN_VALUE: abs gives 0
    assert key_hashes(keys).tolist() == [_java_key_hash(k) for k in keys]
    wide = [k + "\u952e" if i % 3 else k for i, k in enumerate(keys)]
    assert key_hashes(wide).tolist() == [_java_key_hash(k) for k in wide]
    nuls = keys[:50] + ["a\x00b", "\x00", "", "\x00\U0001F600\x00"] + wide[:50]    # NULs inside keys
    assert key_hashes(nuls).tolist() == [_java_key_hash(k) for k in nuls]


# --- golden: rebuild ------------------------------------------------------------------------------------
@needs_golden
@pytest.mark.parametrize("mode", ["batch", "single", "chunks"])
def test_rebuild_clean_is_byte_identical(golden, tmp_path, mode):
    g = golden["rmq440-clean"]
    cfg = g["cfg"]
    reqs = g["reqs"]
    assert len(reqs) == 3000
    # prepared (sysFlag & 0xC == 4) messages are indexed, rolled back (0xC) ones are not: both occur.
    assert any(r.sys_flag & 0xC == 4 for r in reqs) and any(r.sys_flag & 0xC == 0xC for r in reqs)
    svc = _rebuild(tmp_path, cfg, reqs, mode)
    svc.flush()
    ours = _index_files(tmp_path / "index")
    assert [p.name for p in ours] == sorted(p.name for p in ours) and len({p.name for p in ours}) == len(ours)
    _assert_same_index(_index_files(g["index_dir"]), ours, cfg.max_hash_slot_num)
    for f in svc.files:
        assert f.sanity_check(deep=True) == []
    svc.shutdown()


@needs_golden
@pytest.mark.parametrize("mode", ["batch", "chunks"])
def test_rebuild_crash_matches_what_rocketmq_wrote(golden, tmp_path, mode):
    """The crash set's index was left by kill -9 (abort file present, checkpoint stale). RocketMQ writes
    the index in the page cache, which survives kill -9, so what it left is exactly what it had written.
    Checked: it had indexed every one of the 8,008 records of the commitlog (the last file's endPhyOffset is
    the offset of the commitlog's last message), so the "prefix of a full rebuild" is the whole rebuild:
    all four files are byte-identical to a full rebuild (except hashSlotCount), the fourth file included."""
    g = golden["rmq440-crash"]
    assert g["abort"]
    cfg = g["cfg"]
    reqs = g["reqs"]
    assert len(reqs) == 8008
    svc = _rebuild(tmp_path, cfg, reqs, mode)
    svc.flush()
    golden_files = _index_files(g["index_dir"])
    _assert_same_index(golden_files, _index_files(tmp_path / "index"), cfg.max_hash_slot_num)
    assert _header(golden_files[-1].read_bytes())[3] == reqs[-1].commit_log_offset
    svc.shutdown()


@needs_golden
def test_rebuild_prefix_property(golden, tmp_path):
    """Rebuilding only part of the crash commitlog gives files that are a prefix of the golden ones."""
    g = golden["rmq440-crash"]
    cfg = g["cfg"]
    reqs = g["reqs"][:5000]
    svc = _rebuild(tmp_path, cfg, reqs, "batch")
    svc.flush()
    golden_files = _index_files(g["index_dir"])
    ours = _index_files(tmp_path / "index")
    assert 0 < len(ours) <= len(golden_files)
    for gp, op in zip(golden_files, ours):
        graw, oraw = gp.read_bytes(), op.read_bytes()
        count = _header(oraw)[5]
        base = HEADER_SIZE + cfg.max_hash_slot_num * 4
        assert oraw[base:base + count * ENTRY_SIZE] == graw[base:base + count * ENTRY_SIZE]
    svc.shutdown()


# --- golden: queries ------------------------------------------------------------------------------------
@needs_golden
def test_queries_on_golden_clean_index(golden, tmp_path):
    g = golden["rmq440-clean"]
    _copy_tree(g["index_dir"], tmp_path / "index")
    svc = IndexService(tmp_path, g["cfg"])
    svc.load(True, g["index_ckpt"])
    assert len(svc.files) == 14
    for f in svc.files:
        assert f.sanity_check(deep=True) == []
    assert len(g["queries"]) == 311
    assert _check_queries(svc, g["queries"]) == []
    offs, last_ts, last_phy = svc.query_offset("TopicA", "no-such-key", 64, 0, FOREVER)
    last = _header(_index_files(g["index_dir"])[-1].read_bytes())
    assert (last_ts, last_phy) == (last[1], last[3])
    # the checkpoint RocketMQ wrote is the endTimestamp of its newest full index file: ours says the same
    full_end = [_header(p.read_bytes())[1] for p in _index_files(g["index_dir"])][-2]
    assert g["index_ckpt"] == full_end
    assert svc.flush() == full_end
    svc.shutdown()


@needs_golden
def test_queries_crash_after_recovery_and_full_rebuild(golden, tmp_path):
    """dump.jsonl's answers are what RocketMQ returned after recovering the crash set: its index load
    destroyed the last file (endTimestamp > checkpoint), then the re-dispatch re-indexed every message
    from the remaining last file's endPhyOffset on, that message included (its first keys are then in
    the index twice). Our recovery reproduces that; a full rebuild answers the dump's queries the same
    (no queried key belongs to the message indexed twice), only those two keys differ."""
    g = golden["rmq440-crash"]
    cfg, reqs = g["cfg"], g["reqs"]
    _copy_tree(g["index_dir"], tmp_path / "rec" / "index")
    rec = IndexService(tmp_path / "rec", cfg)
    rec.load(False, g["index_ckpt"])
    assert len(rec.files) == 3 and len(_index_files(tmp_path / "rec" / "index")) == 3
    assert [p.name for p in rec.destroyed_files] == ["20261122060910620"]
    resume = rec.get_last_file_end_phy_offset()
    assert resume == 1977519
    rec.build_index_batch(reqs)
    assert _check_queries(rec, g["queries"]) == []

    full = _rebuild(tmp_path / "full", cfg, reqs, "batch")
    assert _check_queries(full, g["queries"]) == []

    msg = next(r for r in reqs if r.commit_log_offset == resume)
    assert msg.uniq_key and msg.keys
    words = [msg.uniq_key] + msg.keys.split(" ")
    twice = [w for w in words if rec.query_offset(msg.topic, w, 64, 0, FOREVER)[0] == [resume, resume]]
    once = [w for w in words if rec.query_offset(msg.topic, w, 64, 0, FOREVER)[0] == [resume]]
    assert twice == words[:2] and once == words[2:]       # the first two keys were in the kept file
    for w in words:
        assert full.query_offset(msg.topic, w, 64, 0, FOREVER)[0] == [resume]
    assert rec.files[-1].index_count == full.files[-1].index_count + 2
    rec.shutdown()
    full.shutdown()


# --- corruption -----------------------------------------------------------------------------------------
SLOTS, NUM = 8, 64


def _keys_in_slot(slot: int, n: int, slots: int = SLOTS) -> list[str]:
    out, i = [], 0
    while len(out) < n:
        k = f"T#k{i}"
        if key_hash(k) % slots == slot:
            out.append(k)
        i += 1
    return out


def _entry_pos(f: IndexFile, no: int) -> int:
    return f.entries_base + no * ENTRY_SIZE


def _small_file(path: Path) -> IndexFile:
    """Entries 1..6: the same key 'T#same' (one chain 6->5->4->3->2->1), then 7 other keys."""
    f = IndexFile(path, SLOTS, NUM)
    for i in range(1, 7):
        assert f.put_key("T#same", 1000 * i, 1_700_000_000_000 + i * 1000)
    for i, k in enumerate([f"T#other{j}" for j in range(7)], start=7):
        assert f.put_key(k, 1000 * i, 1_700_000_000_000 + i * 1000)
    return f


def test_chain_cycle_ends_with_warning(tmp_path, caplog):
    f = _small_file(tmp_path / "x")
    assert f.select_phy_offsets("T#same", 64, 0, FOREVER) == [6000, 5000, 4000, 3000, 2000, 1000]
    mm = f._mm
    struct.pack_into(">i", mm, _entry_pos(f, 5) + 16, 3)       # 5 -> 3
    struct.pack_into(">i", mm, _entry_pos(f, 3) + 16, 5)       # 3 -> 5: a cycle RocketMQ loops on forever
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        t = time.perf_counter()
        got = f.select_phy_offsets("T#same", 10 ** 9, 0, FOREVER)
        assert time.perf_counter() - t < 1
    assert got == [6000, 5000, 3000]
    assert any("cycle" in r.getMessage() and "entry 3" in r.getMessage() and str(f.path) in r.getMessage()
               for r in caplog.records)
    for j in range(7):                                         # other chains still answer
        assert f.select_phy_offsets(f"T#other{j}", 64, 0, FOREVER) == [1000 * (7 + j)]
    f.close()


@pytest.mark.parametrize("prev", [-5, 4, 6, 13, 64, 2 ** 31 - 1])
def test_bad_prev_pointer_ends_chain(tmp_path, caplog, prev):
    f = _small_file(tmp_path / "x")
    struct.pack_into(">i", f._mm, _entry_pos(f, 4) + 16, prev)   # forward, self, past indexCount, negative
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert f.select_phy_offsets("T#same", 64, 0, FOREVER) == [6000, 5000, 4000]
    assert any("entry 4" in r.getMessage() for r in caplog.records)
    f.close()


def test_garbage_entry_values(tmp_path, caplog):
    f = _small_file(tmp_path / "x")
    mm = f._mm
    struct.pack_into(">q", mm, _entry_pos(f, 5) + 4, -77)          # negative phyOffset: skipped
    struct.pack_into(">q", mm, _entry_pos(f, 6) + 4, 2 ** 62)      # anywhere: a candidate (caller checks)
    struct.pack_into(">i", mm, _entry_pos(f, 2) + 12, -1)          # negative timeDiff: chain ends
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert f.select_phy_offsets("T#same", 64, 0, FOREVER) == [2 ** 62, 4000, 3000]
    msgs = " ".join(r.getMessage() for r in caplog.records)
    assert "entry 5 has a negative phyOffset" in msgs and "entry 2 has a negative timeDiff" in msgs
    f.close()


@pytest.mark.parametrize("value", [-7, 14, 63, 64, 10 ** 6, -2 ** 31])
def test_garbage_slot(tmp_path, caplog, value):
    f = _small_file(tmp_path / "x")
    slot = key_hash("T#same") % SLOTS
    struct.pack_into(">i", f._mm, HEADER_SIZE + slot * 4, value)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got = f.select_phy_offsets("T#same", 64, 0, FOREVER)
    assert got == []
    if value < 0 or value >= NUM:
        assert any("slot at byte" in r.getMessage() for r in caplog.records)
    # a put finding garbage in its slot starts a new chain (RocketMQ), with a warning; a slot equal to
    # indexCount passes RocketMQ's check and makes the new entry point at itself: the walk stops there.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert f.put_key("T#same", 99_000, 1_700_000_100_000)
        assert f.select_phy_offsets("T#same", 64, 0, FOREVER) == [99_000]
    assert caplog.records
    if not 0 <= value <= 14:
        assert any("treated as empty" in r.getMessage() for r in caplog.records)
    f.close()


def test_random_bytes_over_slots_and_entries(tmp_path, caplog):
    f = _small_file(tmp_path / "x")
    rng = np.random.default_rng(5)
    f._mm[HEADER_SIZE:] = rng.integers(0, 256, f.file_size - HEADER_SIZE, dtype=np.uint8).tobytes()
    f.index_count = NUM                       # the worst case: every random entry reachable
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        t = time.perf_counter()
        for i in range(2000):
            f.select_phy_offsets(f"T#k{i}", 64, 0, FOREVER)
        assert time.perf_counter() - t < 2
    assert caplog.records
    assert f.sanity_check(deep=True)            # the deep check names the problems
    f.close()


def test_random_file_is_set_aside_by_the_service(tmp_path, caplog):
    cfg = StoreConfig(max_hash_slot_num=SLOTS, max_index_num=NUM)
    svc = IndexService(tmp_path, cfg)
    svc.load(True, 0)
    for i in range(200):                              # 400 keys, 63 a file: 7 files
        svc.build_index(_req(i * 100, 1_700_000_000_000 + i, keys=f"a{i} b{i}"))
    svc.shutdown()
    names = _index_files(tmp_path / "index")
    assert len(names) == 7
    victim = names[2]
    victim.write_bytes(random.Random(3).randbytes(victim.stat().st_size))
    with pytest.raises(CorruptStoreError) as ei:
        IndexFile(victim, SLOTS, NUM, load=True)
    assert str(victim) in str(ei.value)
    svc = IndexService(tmp_path, cfg)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        svc.load(True, 0)
    assert [f.name for f in svc.files] == [p.name for p in names if p != victim]
    assert svc.dropped_files == [victim.with_name(victim.name + ".corrupt")]
    assert svc.dropped_files[0].exists() and not victim.exists()
    assert any(victim.name in r.getMessage() for r in caplog.records)
    assert svc.query_offset("T", "a199", 64, 0, FOREVER)[0] == [19900]
    assert svc.query_offset("T", "b0", 64, 0, FOREVER)[0] == [0]
    svc.build_index(_req(20000, 1_700_000_001_000, keys="z"))
    assert svc.query_offset("T", "z", 64, 0, FOREVER)[0] == [20000]
    svc.shutdown()


@pytest.mark.parametrize("field,value", [(36, NUM + 1), (36, -1), (0, -5), (24, -1)])
def test_impossible_header_raises(tmp_path, field, value):
    f = _small_file(tmp_path / "x")
    f.close()
    raw = bytearray((tmp_path / "x").read_bytes())
    struct.pack_into(">i" if field == 36 else ">q", raw, field, value)
    (tmp_path / "x").write_bytes(bytes(raw))
    with pytest.raises(CorruptStoreError) as ei:
        IndexFile(tmp_path / "x", SLOTS, NUM, load=True)
    assert ei.value.path == str(tmp_path / "x") and ei.value.offset == field


def test_wrong_size_raises_and_empty_file_is_removed(tmp_path):
    d = tmp_path / "index"
    d.mkdir()
    (d / "20260101000000000").write_bytes(b"")
    cfg = StoreConfig(max_hash_slot_num=SLOTS, max_index_num=NUM)
    svc = IndexService(tmp_path, cfg)
    svc.load(True, 0)
    assert svc.files == [] and not (d / "20260101000000000").exists()
    (d / "20260101000000001").write_bytes(b"\0" * 100)
    with pytest.raises(CorruptStoreError, match="maxHashSlotNum"):
        IndexService(tmp_path, cfg).load(True, 0)


def test_an_index_file_a_crash_left_half_made_is_removed_and_only_that(tmp_path, caplog):
    """A crash between creating a new index file under its hidden name and renaming it into place leaves
    `.NAME.new`; index names are timestamps, never made again: load removes it (saying so). Anything else
    with a hidden name is left alone, and a read-only load changes nothing."""
    d = tmp_path / "index"
    d.mkdir()
    half = d / ".20260101000000000.new"
    half.write_bytes(b"\0" * 4096)
    others = [d / ".keep", d / ".x.new"]
    for p in others:
        p.write_bytes(b"mine")
    cfg = StoreConfig(max_hash_slot_num=SLOTS, max_index_num=NUM)
    IndexService(tmp_path, cfg, read_only=True).load(True, 0)
    assert half.exists()
    with caplog.at_level(logging.WARNING):
        IndexService(tmp_path, cfg).load(True, 0)
    assert not half.exists() and all(p.read_bytes() == b"mine" for p in others)
    assert any(half.name in r.getMessage() and "removed" in r.getMessage() for r in caplog.records)


def test_vectorised_put_equals_per_key_put(tmp_path):
    """put_hashes (numpy) and put_hash_list (several keys per call) give exactly put_hash's bytes and header,
    also over garbage slots, chains within one call and odd clocks."""
    rng = np.random.default_rng(11)
    n = 300
    hashes = rng.integers(0, 2 ** 31, n).astype(np.int64)
    hashes[::3] = hashes[0]                                         # long chains
    phys = np.cumsum(rng.integers(0, 500, n)).astype(np.int64)
    tss = (1_700_000_000_000 + np.cumsum(rng.integers(-3000, 5000, n))).astype(np.int64)
    a = IndexFile(tmp_path / "a", 16, 200, 777, 1_699_999_990_000)
    b = IndexFile(tmp_path / "b", 16, 200, 777, 1_699_999_990_000)
    c = IndexFile(tmp_path / "c", 16, 200, 777, 1_699_999_990_000)
    for f in (a, b, c):                                             # garbage slots, some in (count, count+k]
        for s, v in [(1, -4), (2, 5), (3, 150), (4, 10 ** 7)]:
            struct.pack_into(">i", f._mm, HEADER_SIZE + s * 4, v)
    i = 0
    for h, p, t in zip(hashes.tolist(), phys.tolist(), tss.tolist()):
        if not a.put_hash(h, p, t):
            break
        i += 1
    assert i == 199 and a.is_full
    nxt = b.put_hashes(hashes, phys, tss, 0, 50)
    assert nxt == 50
    assert b.put_hashes(hashes, phys, tss, 50, n) == 199
    assert b.put_hashes(hashes, phys, tss, 199, n) == 199            # full: nothing more
    hl, pl, tl = hashes.tolist(), phys.tolist(), tss.tolist()
    assert c.put_hash_list(hl[:1], pl[:1], tl[:1]) == 1             # the first entry alone (FIRST_ENTRY)
    assert c.put_hash_list(hl[:40], pl[:40], tl[:40], 1) == 40      # chains inside one call
    assert c.put_hash_list(hl, pl, tl, 40) == 199                   # until full
    assert c.put_hash_list(hl, pl, tl, 199) == 199
    assert a.header() == b.header() == c.header()
    for f in (a, b, c):
        f.flush()
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes() == (tmp_path / "c").read_bytes()
    for f in (a, b, c):
        f.close()


# --- rolling over, loading, cleanup ------------------------------------------------------------------------
def _req(off: int, ts: int, keys: str | None = None, uniq: str | None = None, topic: str = "T",
         sys_flag: int = 0) -> codec.DispatchRequest:
    return codec.DispatchRequest(topic, 0, off, 100, 0, ts, 0, keys, uniq, sys_flag, 0, {})


@pytest.mark.parametrize("uniq", [True, False])
@pytest.mark.parametrize("keys", ["one", "two words", "mixed", "odd spaces"])
def test_batch_of_one_topic_indexes_as_message_by_message(tmp_path, keys, uniq):
    """build_index_columns' vectorised path (one topic, a UNIQ_KEY each or none, KEYS of one or several words) writes
    exactly the index that build_index writes one message at a time, and so do the batches it leaves to
    _entries (empty words)."""
    rnd = random.Random(keys)

    def key(i: int) -> str:
        return {"one": f"k{i}", "two words": f"order-{i} user-{i % 7}",
                "mixed": " ".join(f"w{i}-{j}" for j in range(1 + i % 4)),
                "odd spaces": rnd.choice([f"a{i}  b", f" c{i}", f"d{i} ", f"e{i} f"])}[keys]
    t0 = 1_700_000_000_000
    reqs = [codec.DispatchRequest("Topic", 0, 100 * i, 100, 0, t0 + 10 * i, 0, key(i),
                                  f"U{i:030d}" if uniq else None, 0, 0, {}) for i in range(3000)]
    cfg = StoreConfig(max_hash_slot_num=500, max_index_num=2000)     # rolls over inside the batch
    one, cols = IndexService(tmp_path / "one", cfg), IndexService(tmp_path / "cols", cfg)
    for svc in (one, cols):
        svc.load(True, 0)
    for r in reqs:
        one.build_index(r)
    for a in range(0, len(reqs), 700):
        part = reqs[a:a + 700]
        cols.build_index_columns([r.topic for r in part], [r.keys for r in part], [r.uniq_key for r in part],
                                 np.array([r.commit_log_offset for r in part]),
                                 np.array([r.store_timestamp for r in part]), np.zeros(len(part), np.int64))
    for svc in (one, cols):
        svc.flush()
    ours, want = _index_files(tmp_path / "cols" / "index"), _index_files(tmp_path / "one" / "index")
    assert len(want) >= 2 and len(ours) == len(want)      # (named by the time they were made)
    for o, w in zip(ours, want):
        assert o.read_bytes() == w.read_bytes()
    one.shutdown()
    cols.shutdown()


def test_index_file_basics(tmp_path):
    f = IndexFile(tmp_path / "f", 4, 3, 500, 1_700_000_000_000)   # carries a previous file's end values
    assert f.header() == (1_700_000_000_000, 1_700_000_000_000, 500, 500, 0, 1)
    assert _header((tmp_path / "f").read_bytes()) == f.header()
    assert f.put_key("T#a", 600, 1_700_000_004_500)
    ent = struct.unpack_from(">iqii", f._mm, f.entries_base + ENTRY_SIZE)
    assert ent == (key_hash("T#a"), 600, 0, 0)      # timeDiff 0: its time is the begin this put sets
    assert f.header()[:4] == (1_700_000_004_500, 1_700_000_004_500, 600, 600)
    assert f.put_key("T#a", 700, 1_700_000_006_000) and f.is_full
    assert not f.put_key("T#b", 800, 1_700_000_007_000)
    assert f.select_phy_offsets("T#a", 64, 0, FOREVER) == [700, 600]
    assert f.select_phy_offsets("T#a", 1, 0, FOREVER) == [700]
    # entry 1 reads at its own time (RocketMQ writes timeDiff 4 here, from the carried begin, and then
    # reads it 4 s late: a range ending at its time missed it)
    assert f.select_phy_offsets("T#a", 64, 1_700_000_004_000, 1_700_000_004_500) == [600]
    assert f.select_phy_offsets("T#a", 64, 1_700_000_005_000, FOREVER) == [700]
    assert f.select_phy_offsets("T#a", 64, 1_700_000_005_000, 1_700_000_008_000) == [700]
    # a file RocketMQ wrote, entry 1 with that timeDiff 4: read at the file's beginTimestamp all the same
    f.mapped_file.pwrite(f.entries_base + ENTRY_SIZE, struct.pack(">iqii", key_hash("T#a"), 600, 4, 0))
    assert f.select_phy_offsets("T#a", 64, 1_700_000_004_000, 1_700_000_004_500) == [600]
    assert f.is_time_matched(0, FOREVER) and f.is_time_matched(1_700_000_005_000, 1_700_000_005_001)
    assert not f.is_time_matched(0, 1_700_000_000_000)
    with pytest.raises(FileExistsError):
        IndexFile(tmp_path / "f", 4, 3)
    f.close()
    g = IndexFile(tmp_path / "f", 4, 3, load=True)
    assert g.header() == (1_700_000_004_500, 1_700_000_006_000, 600, 700, 1, 3)
    g.destroy()
    assert not (tmp_path / "f").exists()
    assert time_millis_to_human_string(1_795_328_096_279).endswith("279") and \
        len(time_millis_to_human_string(1_795_328_096_279)) == 17


def test_first_entry_after_recovery_removed_every_entry_is_found_at_its_time(tmp_path):
    """Recovery (cut_entries) removes every entry of a file whose messages are past the commitlog's end; the
    header keeps the removed first entry's time. The next first put must still be found by a query whose
    range ends at its store time (RocketMQ's formula put it there 3 s late after a SIGKILL in the kill loop:
    a time-ranged queryMessage missed an acknowledged message)."""
    from rmqstore.store.index.index_file import cut_entries
    t0 = 1_700_000_000_000
    f = IndexFile(tmp_path / "f", 4, 8)
    assert f.put_key("T#a", 100, t0) and f.put_key("T#b", 200, t0 + 500)
    cut_entries(f, 1, 0, t0)
    assert f.index_count == 1 and f.select_phy_offsets("T#a", 64, 0, FOREVER) == []
    assert f.put_key("T#c", 300, t0 + 3_400)                           # the re-dispatch, 3.4 s later
    assert struct.unpack_from(">iqii", f._mm, f.entries_base + ENTRY_SIZE)[2] == 0
    assert f.select_phy_offsets("T#c", 64, t0 + 3_000, t0 + 3_400) == [300]
    f.close()


def test_new_file_when_full(tmp_path):
    flushed = []
    cfg = StoreConfig(max_hash_slot_num=4, max_index_num=5)          # 4 entries a file
    svc = IndexService(tmp_path, cfg, on_full_file_flushed=flushed.append)
    svc.load(True, 0)
    t0 = 1_700_000_000_000
    svc.build_index_batch([_req(100, t0, uniq="u1", keys="a b"), _req(200, t0 + 1000, keys="c d e"),
                           _req(250, t0 + 1500, sys_flag=codec.TRANSACTION_ROLLBACK_TYPE, keys="rolled"),
                           _req(300, t0 + 9000, keys="prepared", sys_flag=codec.TRANSACTION_PREPARED_TYPE)])
    f1, f2 = svc.files
    # file 1: u1 a b c; file 2, created carrying file 1's end values: d e (offset 200), then prepared
    assert f1.is_full and f1.header()[:4] == (t0, t0 + 1000, 100, 200) and f1.index_count == 5
    assert f2.header()[:4] == (t0 + 1000, t0 + 9000, 200, 300) and f2.index_count == 4
    entry = lambda f, no: struct.unpack_from(">iqii", f._mm, f.entries_base + no * ENTRY_SIZE)
    assert entry(f2, 1) == (key_hash("T#d"), 200, 0, 0)
    assert entry(f2, 3)[1:3] == (300, 8)                            # (t0+9000 - (t0+1000)) / 1000
    # the full file was flushed: header on disk, msync'ed, reported for the checkpoint
    assert f1.flush_count == 1 and not f1._dirty
    assert _header(f1.path.read_bytes()) == f1.header()
    assert flushed == [t0 + 1000]
    assert svc.flush() == t0 + 1000                                   # newest full file, not the last one
    assert _header(f2.path.read_bytes()) == f2.header()
    assert f1.path.name < f2.path.name
    assert svc.query_offset("T", "rolled", 64, 0, FOREVER)[0] == []
    assert svc.query_offset("T", "prepared", 64, 0, FOREVER)[0] == [300]
    assert svc.query_offset("T", "e", 64, 0, FOREVER)[0] == [200]
    assert svc.query_offset("T", "u1", 64, 0, FOREVER)[0] == [100]
    # already indexed: skipped; the message at endPhyOffset is indexed again (RocketMQ)
    svc.build_index(_req(200, t0 + 1000, keys="c"))
    assert svc.query_offset("T", "c", 64, 0, FOREVER)[0] == [200]
    svc.build_index(_req(300, t0 + 9000, keys="prepared"))
    assert svc.query_offset("T", "prepared", 64, 0, FOREVER)[0] == [300, 300]
    # file 2 is exactly full now: the next file appears only with the next key
    assert len(svc.files) == 2 and f2.is_full
    svc.build_index(_req(500, t0 + 11_000))                          # no keys: nothing
    svc.build_index(_req(550, t0 + 11_000, keys="  "))               # only separators: nothing
    assert len(svc.files) == 2
    svc.build_index(_req(600, t0 + 12_000, uniq=""))                # an empty UNIQ_KEY is still a key
    f3 = svc.files[-1]
    assert len(svc.files) == 3 and f3.header()[:4] == (t0 + 12_000, t0 + 12_000, 600, 600)
    assert entry(f3, 1)[1:3] == (600, 0)               # RocketMQ: 3 (from the carried t0 + 9000): FIRST_ENTRY
    assert svc.query_offset("T", "", 64, 0, FOREVER)[0] == [600]
    assert svc.query_offset("T", "", 64, t0 + 11_500, t0 + 12_000)[0] == [600]   # at its own time
    assert flushed == [t0 + 1000, t0 + 9000]
    assert f2.flush_count >= 1 and _header(f2.path.read_bytes()) == f2.header()
    svc.shutdown()


def test_new_file_names_stay_in_creation_order(tmp_path):
    d = tmp_path / "index"
    d.mkdir()
    cfg = StoreConfig(max_hash_slot_num=4, max_index_num=2)            # 1 entry a file
    future = "29991231235959999"                                       # as if the clock went back
    IndexFile(d / future, 4, 2).close()
    svc = IndexService(tmp_path, cfg)
    svc.load(True, 0)
    svc.build_index_batch([_req(100 * i, 1_700_000_000_000 + i, keys="k") for i in range(1, 6)])
    names = [f.name for f in svc.files]
    assert names[0] == future and names == sorted(names) and len(set(names)) == 5   # key 1 went in "future"
    assert names[1] == "29991231235960000"
    assert svc.query_offset("T", "k", 64, 0, FOREVER)[0] == [500, 400, 300, 200, 100]
    svc.shutdown()


def test_query_rules_and_cleanup(tmp_path):
    cfg = StoreConfig(max_hash_slot_num=4, max_index_num=3, max_msgs_num_batch=5)   # 2 entries a file
    svc = IndexService(tmp_path, cfg)
    svc.load(True, 0)
    t0 = 1_700_000_000_000
    reqs = [_req(100 * i, t0 + 10_000 * i, keys="k") for i in range(10)]
    svc.build_index_batch(reqs)
    assert len(svc.files) == 5
    offs, ts, phy = svc.query_offset("T", "k", 64, 0, FOREVER)
    assert offs == [900, 800, 700, 600, 500] and (ts, phy) == (t0 + 90_000, 900)   # maxMsgsNumBatch
    assert svc.query_offset("T", "k", 2, 0, FOREVER)[0] == [900, 800]
    # The first entry of each file reads at its own time (FIRST_ENTRY; RocketMQ wrote its timeDiff from the
    # carried begin, the previous file's end, and read offset 400 (t0 + 40 s) as t0 + 50 s: not found here)
    assert svc.query_offset("T", "k", 64, t0 + 20_000, t0 + 40_000)[0] == [400, 300, 200]
    assert svc.query_offset("T", "k", 64, t0 + 20_000, t0 + 50_000)[0] == [500, 400, 300, 200]
    assert svc.query_offset("T", "k", 0, 0, FOREVER)[0] == []
    assert svc.delete_expired_file(250) == 1                          # endPhyOffset 100 < 250; 300 is not
    assert svc.files[0].end_phy_offset == 300
    assert svc.delete_expired_file(10 ** 9) == 3                      # never the last file
    assert len(svc.files) == 1 and len(_index_files(tmp_path / "index")) == 1
    assert svc.get_last_file_end_phy_offset() == 900
    svc.destroy()
    assert svc.files == [] and _index_files(tmp_path / "index") == []


def test_load_after_crash_drops_files_past_checkpoint(tmp_path):
    cfg = StoreConfig(max_hash_slot_num=4, max_index_num=3)
    svc = IndexService(tmp_path, cfg)
    svc.load(True, 0)
    t0 = 1_700_000_000_000
    svc.build_index_batch([_req(100 * i, t0 + 1000 * i, keys="k") for i in range(5)])
    ckpt = svc.flush()
    assert ckpt == t0 + 3000                                          # the second (full) file's end
    svc.shutdown()
    again = IndexService(tmp_path, cfg)
    again.load(True, 0)
    assert len(again.files) == 3
    again.shutdown()
    crashed = IndexService(tmp_path, cfg)
    crashed.load(False, ckpt)
    assert len(crashed.files) == 2 and len(_index_files(tmp_path / "index")) == 2
    crashed.build_index_batch([_req(100 * i, t0 + 1000 * i, keys="k") for i in range(5)])   # re-dispatch
    assert crashed.query_offset("T", "k", 64, 0, FOREVER)[0] == [400, 300, 300, 200, 100, 0]
    crashed.shutdown()


def test_readers_while_writing(tmp_path):
    cfg = StoreConfig(max_hash_slot_num=64, max_index_num=200)
    svc = IndexService(tmp_path, cfg)
    svc.load(True, 0)
    t0 = 1_700_000_000_000
    errors = []
    stop = threading.Event()

    def reader():
        try:
            while not stop.is_set():
                offs, _, _ = svc.query_offset("T", "hot", 64, 0, FOREVER)
                assert offs == sorted(offs, reverse=True)
                assert all(o % 10 == 0 for o in offs)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    th = threading.Thread(target=reader)
    th.start()
    try:
        for i in range(0, 3000, 30):
            svc.build_index_batch([_req(10 * j, t0 + j, keys=f"hot c{j}") for j in range(i, i + 30)])
            if i % 600 == 0:
                svc.delete_expired_file(10 * (i - 300))
    finally:
        stop.set()
        th.join()
    assert errors == []
    assert svc.query_offset("T", "hot", 64, 0, FOREVER)[0][:3] == [29990, 29980, 29970]
    svc.shutdown()


# --- a full disk ----------------------------------------------------------------------------------------
_FULL_DISK_CHILD = r"""
import errno, json, os, sys
from pathlib import Path
import numpy as np
sys.path.insert(0, sys.argv[2])
from store_checks import fill_up
from rmqstore.store.conf.config import StoreConfig
from rmqstore.store.index.index_file import IndexFile, IndexService, key_hash
mnt = Path(sys.argv[1])
out = {}
f = IndexFile(mnt / "20260101000000000", 1000, 1_000_000)      # 20 MB, sparse, on an 8 MB disk
f.put_key("T#before", 100, 1_700_000_000_000)
fill_up(mnt / "ballast")
keys = [f"T#k{i}" for i in range(10_000)]                       # 200 KB of entries: no room
h = np.array([key_hash(k) for k in keys], dtype=np.int64)
try:
    f.put_hashes(h, np.arange(1000, 1000 + len(keys), dtype=np.int64), np.full(len(keys), 1_700_000_000_000))
    out["batch"] = "written"
except OSError as e:
    out["batch"] = errno.errorcode.get(e.errno, str(e.errno))
try:
    for i, k in enumerate(keys):
        f.put_key(k, 1000 + i, 1_700_000_000_000)
    out["one_by_one"] = "written"
except OSError as e:
    out["one_by_one"] = errno.errorcode.get(e.errno, str(e.errno))
hdr = f.header()                                                # a failed put changes nothing
for attempt in range(2):
    for put in (lambda: f.put_hash_list(h[:30].tolist(), list(range(5000, 5030)), [1_700_000_000_000] * 30),
                lambda: f.put_key("T#again", 6000, 1_700_000_000_000)):
        try:
            put()
            out["header_kept"] = "written"
        except OSError:
            pass
out.setdefault("header_kept", f.header() == hdr)
out["count_after"] = f.index_count
out["before_found"] = f.select_phy_offsets("T#before", 10, 0, 2**62)
cfg = StoreConfig.from_dict({"maxHashSlotNum": 5000, "maxIndexNum": 1000})
svc = IndexService(mnt / "store2", cfg)
svc.load(True, 0)
try:
    svc.build_index_columns(["T"], ["a"], [None], [0], [1_700_000_000_000], [0])
    out["new_file"] = "created"
except OSError as e:
    out["new_file"] = str(e)
os.unlink(mnt / "ballast")                                      # room again: puts go on
f.put_hashes(h, np.arange(1000, 1000 + len(keys), dtype=np.int64), np.full(len(keys), 1_700_000_000_000))
out["after_room"] = f.select_phy_offsets("T#k9999", 10, 0, 2**62)
f.close()
print(json.dumps(out))
"""


def test_index_on_a_full_disk_is_an_oserror_not_sigbus(tmp_path):
    """Index entries are written with pwrite and the header and slots are allocated when a file is created,
    so on a full disk putting keys raises ENOSPC (the dispatcher reports it and retries) instead of a store
    through the mapping into a hole, which kills the process with SIGBUS (a real 8 MB tmpfs)."""
    import subprocess
    import sys
    from store_checks import small_filesystem
    mnt = tmp_path / "mnt"
    with small_filesystem(mnt, 8):
        r = subprocess.run([sys.executable, "-c", _FULL_DISK_CHILD, str(mnt), str(Path(__file__).resolve().parents[1])],
                           capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"child died ({r.returncode}): {r.stderr[-3000:]}"
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["batch"] == "ENOSPC"
    assert out["one_by_one"] == "ENOSPC"
    assert out["header_kept"] is True       # hashSlotCount, begin/end and count as before the failed puts
    assert out["before_found"] == [100]
    assert "cannot allocate" in out["new_file"] and "store2" in out["new_file"]
    assert out["after_room"] == [1000 + 9999]
