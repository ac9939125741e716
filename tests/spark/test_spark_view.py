"""The rocketmq data source's read path without Spark: the batch parser, the read-only store view (the recovery
plan applied in memory), planning and reading partitions, key lookups. Fast: no SparkSession."""
from __future__ import annotations

import dataclasses

import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pyarrow")

from rmqstore.store.format import codec
from rmqstore.store.format import scanner
from rmqstore.store.conf.config import StoreConfig
from rmqstore.tools.dump import queue_messages
from rmqstore.store.format.message import Message
from rmqstore.store.reads.reader import CommitLogReader, find_commitlog_dir, list_commitlog_files
from rmqstore.spark import options as O
from rmqstore.spark import plan as P
from rmqstore.spark import records as R
from rmqstore.spark import scan as S
from rmqstore.spark import storeview as SV
from rmqstore.store.store import MessageStore

from conftest import golden_store, read_jsonl

SETS = ("rmq440-clean", "rmq440-crash")


# --- helpers ------------------------------------------------------------------------------------------
def row_json(d: dict) -> dict:
    """A data source row as a golden dump line."""
    def ms(t):
        return int(t.timestamp() * 1000 + 0.5) if hasattr(t, "timestamp") else t
    return {"topic": d["topic"], "queueId": d["queueId"], "queueOffset": d["queueOffset"],
            "commitLogOffset": d["commitLogOffset"], "storeSize": d["storeSize"], "bodyCRC": d["bodyCRC"],
            "flag": d["flag"], "sysFlag": d["sysFlag"], "bornTimestamp": ms(d["bornTimestamp"]),
            "storeTimestamp": ms(d["storeTimestamp"]), "bornHost": d["bornHost"], "storeHost": d["storeHost"],
            "reconsumeTimes": d["reconsumeTimes"], "preparedTransactionOffset": d["preparedTransactionOffset"],
            "msgId": d["msgId"], "properties": codec.sorted_properties_string(dict(d["properties"])),
            "body": d["body"].hex() if d["body"] is not None else None}


def by_queue(rows):
    return sorted(rows, key=lambda d: (d["topic"], d["queueId"], d["queueOffset"]))


def read_local(options: dict, conds=()) -> list[dict]:
    ro = O.parse(options)
    out = []
    for part in P.plan_batch(ro, list(conds)):
        for b in S.read_partition(part):
            out.extend(b.to_pylist())
    return out


def dump_messages(golden: Path, name: str) -> list[dict]:
    return by_queue(d for d in read_jsonl(golden / name / "dump.jsonl") if "queueOffset" in d)


def fingerprint(root: Path) -> dict:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns, hashlib.sha1(p.read_bytes()).hexdigest())
    return out


def store_answer(path: Path, cfg: StoreConfig) -> list[dict]:
    """What MessageStore.open serves: every message of every queue, as dump lines."""
    out = []
    with MessageStore.open(path, cfg, start_services=False) as st:
        for topic, qids in st.topics().items():
            for q in qids:
                cq = st.consume_queues.find(topic, q)
                out.extend(m.to_json() for m in queue_messages(st, topic, q, cq.get_min_offset_in_queue(),
                                                               cq.get_max_offset_in_queue()))
    return by_queue(out)


def writable_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for p in [dst, *dst.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


# --- the parser ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SETS + ("rocketmq-sample-commitlog",))
def test_batch_parser_equals_codec(golden, name):
    root = golden_store(golden, name)
    expected = [m.to_json() for m in CommitLogReader(root).messages()]
    got = []
    cache = SV.FileCache()
    for f in list_commitlog_files(find_commitlog_dir(root)):
        mm, buf = cache.get(str(f.path))
        if mm is None:
            continue
        pos, _, _ = R.walk(mm, 0, len(mm))
        recs = R.Records(buf, f.base_offset, pos)
        assert recs.valid.all()
        got.extend(row_json(r) for r in recs.batch("b").to_pylist())
        for i in range(0, len(pos), max(1, len(pos) // 50)):     # a record ending exactly at the limit
            one = R.Records(buf, f.base_offset, pos[i:i + 1], int(pos[i] + recs.total[i]))
            assert one.valid.all() and row_json(one.batch("b").to_pylist()[0]) == got[-len(pos) + i]
    cache.close()
    assert got == expected
    assert len(got) == {"rmq440-clean": 3000, "rmq440-crash": 8008, "rocketmq-sample-commitlog": 47}[name]


def test_parser_flags_damaged_records_like_check_record(golden):
    raw = bytearray((golden_store(golden, "rmq440-clean") / "commitlog" / "00000000000000000000").read_bytes())
    pos, _, _ = R.walk(raw, 0, len(raw))
    buf = np.frombuffer(bytes(raw), dtype=np.uint8)
    # damage: a topic length past its record, a bad magic, a properties length off by one
    victims = [int(pos[3]), int(pos[10]), int(pos[20])]
    recs0 = R.Records(buf, 0, pos)
    raw[int(recs0.topic_pos[3]) - 1] = 200
    raw[victims[1] + 4] ^= 0xFF
    pl = int(recs0.props_pos[20]) - 2
    raw[pl + 1] = (raw[pl + 1] + 1) & 0xFF
    buf = np.frombuffer(bytes(raw), dtype=np.uint8)
    recs = R.Records(buf, 0, pos)
    for i, p in enumerate(pos.tolist()):
        try:
            scanner.check_record(bytes(raw), p, len(raw))
            ok = True
        except codec.RecordError:
            ok = False
        assert bool(recs.valid[i]) == ok, (i, p)
    assert not recs.valid[[3, 10, 20]].any()


def test_properties_parsing_matches_codec():
    import pyarrow as pa
    cases = ["", "TAGS\x01a\x02", "KEYS\x01k1  k2 \x02TAGS\x01\x02UNIQ_KEY\x01u\x02",
             "a\x01b\x01c\x02", "noval\x02x\x01y\x02", "\x02\x02k\x01v\x02", "k\x01v", "TAGS\x01x\x02TAGS\x01y\x02"]
    _same_as_codec(cases, R.parse_properties(pa.array(cases, type=pa.string())))
    # random strings of names, separators and multi-byte characters, in batches with and without a key written
    # twice (that batch is decoded row by row), and a slice of one (the array's offset)
    rnd = random.Random(5)
    words = ["TAGS", "KEYS", "UNIQ_KEY", "TAG", "KEYSX", "a", "é", "中", " ", "k1 k2", "\x01", "\x02", ""]
    for _ in range(300):
        batch = ["".join(rnd.choice(words) for _ in range(rnd.randrange(0, 12))) for _ in range(rnd.randrange(1, 9))]
        arr = pa.array(["x"] + batch + ["y"], type=pa.string()).slice(1, len(batch))
        _same_as_codec(batch, R.parse_properties(arr))


def _same_as_codec(cases, p):
    assert len(p.map) == len(cases)
    for i, s in enumerate(cases):
        d = codec.string_to_properties(s)
        assert dict(p.map[i].as_py()) == d and len(p.map[i].as_py()) == len(d), repr(s)
        assert p.tags[i].as_py() == d.get("TAGS")
        assert p.keys[i].as_py() == [k for k in d.get("KEYS", "").split(" ") if k]
        assert p.uniq[i].as_py() == d.get("UNIQ_KEY")


# --- the store view -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SETS)
def test_read_golden_equals_dump_without_writing(golden, tmp_path, name):
    """Read a copy (fingerprinted: nothing may change, no file may appear) and the original."""
    copy = writable_copy(golden_store(golden, name), tmp_path / "store")
    before = fingerprint(copy)
    conf = str(golden / name / "store.conf")
    rows = read_local({"path": str(copy), "config": conf})
    assert fingerprint(copy) == before
    expected = dump_messages(golden, name)
    assert by_queue(row_json(r) for r in rows) == expected
    assert {r["broker"] for r in rows} == {tmp_path.name}      # a dir called store: its parent names it
    rows = read_local({"path": str(golden_store(golden, name)), "config": conf})
    assert by_queue(row_json(r) for r in rows) == expected
    assert {r["broker"] for r in rows} == {name}
    view = SV.load_view(str(golden_store(golden, name)), StoreConfig.load(conf))
    for d in read_jsonl(golden / name / "dump.jsonl"):
        if "queue" in d:
            qv = view.queues[(d["queue"], d["queueId"])]
            assert (qv.min_offset, qv.end) == (d["min"], d["max"])


def _zero_units(root: Path, topic: str, qid: int, n: int) -> None:
    d = root / "consumequeue" / topic / str(qid)
    f = sorted(d.iterdir())[-1]
    a = bytearray(f.read_bytes())
    units = np.frombuffer(bytes(a), dtype=codec.CQ_DTYPE)
    k = int(np.flatnonzero(units["size"] > 0)[-1]) + 1
    a[(k - n) * 20:k * 20] = bytes(n * 20)
    f.write_bytes(bytes(a))


def _damage(root: Path, how: str) -> None:
    if how == "queue tails zeroed":
        _zero_units(root, "TopicA", 1, 50)
        _zero_units(root, "TopicB", 2, 200)
    elif how == "topic dir removed":
        shutil.rmtree(root / "consumequeue" / "订单Topic")
    elif how == "no consumequeue, no index":
        shutil.rmtree(root / "consumequeue")
        shutil.rmtree(root / "index")
    elif how == "unit rewritten":
        d = root / "consumequeue" / "TopicA" / "0"
        f = sorted(d.iterdir())[-1]
        a = bytearray(f.read_bytes())
        a[40 * 20 + 8:40 * 20 + 12] = (7).to_bytes(4, "big")      # unit 40's size no longer its record's
        f.write_bytes(bytes(a))
    elif how == "commitlog torn":
        files = sorted((root / "commitlog").iterdir())
        data = [f for f in files if f.stat().st_size and any(f.read_bytes()[:8])]
        last = data[-1]
        a = bytearray(last.read_bytes())
        end = len(a.rstrip(b"\0"))
        a[end - 300:end] = os.urandom(300)                          # the last record is garbage
        last.write_bytes(bytes(a))
    elif how == "index file corrupt":
        f = sorted((root / "index").iterdir())[1]
        a = bytearray(f.read_bytes())
        a[40 + 4 * 7:40 + 4 * 8] = (-5).to_bytes(4, "big", signed=True)   # a slot out of range
        f.write_bytes(bytes(a))
    else:  # pragma: no cover
        raise ValueError(how)


@pytest.mark.parametrize("name,how", [
    ("rmq440-crash", "queue tails zeroed"), ("rmq440-crash", "topic dir removed"),
    ("rmq440-crash", "no consumequeue, no index"), ("rmq440-crash", "unit rewritten"),
    ("rmq440-crash", "commitlog torn"), ("rmq440-clean", "unit rewritten"),
    ("rmq440-clean", "commitlog torn"), ("rmq440-clean", "topic dir removed"),
])
def test_view_of_damaged_store_equals_what_open_serves(golden, tmp_path, name, how):
    """The read-only view of a damaged store = what MessageStore.open serves after its recovery."""
    cfg = StoreConfig.load(golden / name / "store.conf")
    a = writable_copy(golden_store(golden, name), tmp_path / "a")
    _damage(a, how)
    b = writable_copy(a, tmp_path / "b")
    before = fingerprint(a)
    opts = {"path": str(a), "config": str(golden / name / "store.conf")}
    if how == "commitlog torn":     # the torn record's unit points past the data's end: data loss, reported
        from rmqstore.spark.loss import DataLossError
        with pytest.raises(DataLossError, match="point past it"):
            list(read_local(opts))
        opts["failOnDataLoss"] = "false"
    ours = by_queue(row_json(r) for r in read_local(opts))
    assert fingerprint(a) == before
    theirs = store_answer(b, cfg)
    assert len(ours) == len(theirs)
    assert ours == theirs
    if how != "commitlog torn":
        assert ours == dump_messages(golden, name) or how in ("queue tails zeroed", "topic dir removed") \
            and name == "rmq440-clean"


@pytest.mark.parametrize("name", SETS)
def test_key_lookups_equal_find_messages_by_key(golden, tmp_path, name):
    conf = str(golden / name / "store.conf")
    keys = [tuple(line.split("\t")) for line in (golden / name / "keys.tsv").read_text("utf-8").splitlines() if line]
    ours = {}
    root = golden_store(golden, name)
    # The whole path (options, view, plan, read) for the first key; every key through the same view: the
    # view is what the files say (a pure function of them), and loading it again per key (a recovery
    # emulated in memory each time) would only repeat that.
    (view,) = P.load_views(O.parse({"path": str(root), "config": conf, "key": keys[0][1]}), [])
    for i, (topic, key) in enumerate(keys):
        ro = O.parse({"path": str(root), "config": conf, "key": key})
        conds = [S.Cond("topic", "eq", topic)]
        rows = [r for part in P.key_partitions(ro, conds, view) for b in S.read_partition(part) for r in b.to_pylist()]
        if i == 0:
            assert rows == read_local({"path": str(root), "config": conf, "key": key}, conds)
        ours[(topic, key)] = sorted(r["commitLogOffset"] for r in rows)
        assert all(r["topic"] == topic for r in rows)
    copy = writable_copy(root, tmp_path / "store")
    hits = 0
    with MessageStore.open(copy, StoreConfig.load(conf), start_services=False) as st:
        for topic, key in keys:
            exp = sorted(m.commit_log_offset for m in st.find_messages_by_key(topic, key))
            assert ours[(topic, key)] == exp, (topic, key)
            hits += len(exp)
    assert hits > 250


def test_key_lookup_after_index_damage(golden, tmp_path):
    """Index files recovery sets aside: their keys come from the commitlog scan instead."""
    conf = str(golden / "rmq440-clean" / "store.conf")
    a = writable_copy(golden_store(golden, "rmq440-clean"), tmp_path / "a")
    _damage(a, "index file corrupt")
    b = writable_copy(a, tmp_path / "b")
    keys = [tuple(line.split("\t")) for line in (golden / "rmq440-clean" / "keys.tsv").read_text("utf-8").splitlines()
            if line][:60]
    ours = {k: sorted(r["commitLogOffset"] for r in read_local({"path": str(a), "config": conf, "key": k[1]},
                                                               [S.Cond("topic", "eq", k[0])])) for k in keys}
    with MessageStore.open(b, StoreConfig.load(conf), start_services=False) as st:
        for topic, key in keys:
            assert ours[(topic, key)] == sorted(m.commit_log_offset for m in st.find_messages_by_key(topic, key))


def test_live_store_reads_queues_as_written(tmp_path):
    """A store open in this process (its lock held): the view is its consume queues, no recovery."""
    cfg = StoreConfig(mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * 100)
    path = tmp_path / "live"
    with MessageStore.open(path, cfg) as st:
        st.put_messages([Message("T", f"m{i}".encode(), queue_id=i % 2, properties={"KEYS": f"k{i}"})
                         for i in range(250)])
        assert st.wait_dispatched()
        assert SV.lock_held_elsewhere(path)
        view = SV.load_view(str(path), cfg)
        assert view.live and view.data_end is None
        assert {k: (q.min_offset, q.end) for k, q in view.queues.items()} == {("T", 0): (0, 125), ("T", 1): (0, 125)}
        rows = read_local({"path": str(path)})
        assert sorted(r["body"] for r in rows) == sorted(f"m{i}".encode() for i in range(250))
        rows = read_local({"path": str(path), "key": "k17"})
        assert [r["body"] for r in rows] == [b"m17"]
    assert not SV.lock_held_elsewhere(path)
    assert not SV.load_view(str(path), cfg).live


def test_live_view_reads_on_from_the_previous_end(tmp_path):
    """A live view loaded with the previous one (a stream's next trigger) reads each queue's last file from the
    end that view found, and answers as a fresh load does; when the last unit it saw is gone or differs (a
    restarted writer cut the file), the file is read from its start."""
    cfg = StoreConfig(mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * 100)
    path = tmp_path / "live"

    def ends(view):
        return {k: (q.min_offset, q.end, q.max_physic_offset) for k, q in view.queues.items()}
    with MessageStore.open(path, cfg) as st:
        st.put_messages([Message("T", f"m{i}".encode(), queue_id=i % 2) for i in range(130)])
        assert st.wait_dispatched()
        first = SV.load_view(str(path), cfg)
        assert first.live and {k: q.end for k, q in first.queues.items()} == {("T", 0): 65, ("T", 1): 65}
        st.put_messages([Message("T", f"n{i}".encode(), queue_id=0) for i in range(70)])   # q0 rolls a file
        st.put_messages([Message("U", b"u", queue_id=3)])
        assert st.wait_dispatched()
        fresh = SV.load_view(str(path), cfg)
        assert ends(SV.load_view(str(path), cfg, previous=first)) == ends(fresh)
        assert {k: q.end for k, q in fresh.queues.items()} == {("T", 0): 135, ("T", 1): 65, ("U", 3): 1}
        again = SV.load_view(str(path), cfg, previous=fresh)
        assert ends(again) == ends(fresh)
        for wrong in ({"max_physic_offset": 7}, {"disk_end": 70}):   # last unit changed / no longer written
            q1 = dataclasses.replace(fresh.queues[("T", 1)], **wrong)
            stale = dataclasses.replace(fresh, queues={**fresh.queues, ("T", 1): q1})
            assert ends(SV.load_view(str(path), cfg, previous=stale)) == ends(fresh)
        rows = read_local({"path": str(path), "topics": "T"})
        assert len(rows) == 200


def test_offset_by_time_equals_consume_queue_lookup(golden, tmp_path):
    name = "rmq440-crash"
    cfg = StoreConfig.load(golden / name / "store.conf")
    view = SV.load_view(str(golden_store(golden, name)), cfg)
    copy = writable_copy(golden_store(golden, name), tmp_path / "s")
    cache = SV.FileCache()
    with MessageStore.open(copy, cfg, start_services=False) as st:
        for topic, q in [("TopicA", 0), ("订单Topic", 3), ("%RETRY%groupX", 2)]:
            qv = view.queues[(topic, q)]
            first = st.get_message_store_timestamp(topic, q, 0)
            last = st.get_message_store_timestamp(topic, q, qv.end - 1)
            for ts in [0, first - 1, first, (first + last) // 2, last, last + 10_000,
                       st.get_message_store_timestamp(topic, q, 77) + 1]:
                assert SV.offset_by_time(view, qv, ts, cache) == st.get_offset_in_queue_by_time(topic, q, ts), ts
    cache.close()


def test_pushed_conditions_prune_and_filter_exactly(golden):
    name = "rmq440-clean"
    root = str(golden_store(golden, name))
    conf = str(golden / name / "store.conf")
    every = read_local({"path": root, "config": conf})
    ts = sorted(r["storeTimestamp"] for r in every)
    lo, hi = ts[len(ts) // 3], ts[2 * len(ts) // 3]
    us = lambda t: int(t.timestamp() * 1_000_000)      # noqa: E731
    conds = [S.Cond("topic", "in", frozenset({"TopicA", "TopicB"})), S.Cond("queueId", "ge", 1),
             S.Cond("storeTimestamp", "ge", us(lo)), S.Cond("storeTimestamp", "lt", us(hi)),
             S.Cond("queueOffset", "gt", 10)]
    got = by_queue(read_local({"path": root, "config": conf}, conds))
    exp = by_queue(r for r in every if r["topic"] in ("TopicA", "TopicB") and r["queueId"] >= 1
                   and lo <= r["storeTimestamp"] < hi and r["queueOffset"] > 10)
    assert got == exp and 100 < len(got) < 1000
    ro = O.parse({"path": root, "config": conf})
    parts = P.plan_batch(ro, conds)
    planned = sum(b - a for p in parts for _, a, b in p.items)
    assert planned < len(every) // 3          # queues, offsets and times were pruned before reading
    # commitlog mode: offsets prune files
    rows = read_local({"path": root, "config": conf, "mode": "commitlog"},
                      [S.Cond("commitLogOffset", "ge", 300_000), S.Cond("commitLogOffset", "le", 600_000)])
    assert rows and all(300_000 <= r["commitLogOffset"] <= 600_000 for r in rows)
    assert len(rows) == sum(1 for m in CommitLogReader(root).messages(read_body=False)
                            if 300_000 <= m.commit_log_offset <= 600_000)


def test_int_range_and_split_limit():
    from rmqstore.spark.stream import split_limit
    assert S.int_range([S.Cond("x", "gt", 1500), S.Cond("x", "le", 3000)], "x", 1000) == (2, 4)
    assert S.int_range([S.Cond("x", "ge", 1500), S.Cond("x", "lt", 3000)], "x", 1000) == (2, 3)
    assert S.int_range([S.Cond("x", "in", (5, 9))], "x") == (5, 10)
    assert S.int_range([], "x") == (None, None)
    got = split_limit({"a": 10, "b": 30, "c": 0}, 8)
    assert sum(got.values()) == 8 and got["c"] == 0 and got["a"] <= 10
    assert split_limit({"a": 3, "b": 4}, 100) == {"a": 3, "b": 4}


def test_options_fail_naming_the_option(golden, tmp_path):
    root = str(golden_store(golden, "rmq440-clean"))
    for opts, word in [({"topics": "Nope"}, "topics"), ({"startingOffsets": "{bad"}, "startingOffsets"),
                       ({"startingOffsets": '{"TopicA": {"x": 1}}'}, "startingOffsets"),
                       ({"endingOffsets": '{"Nope": {"0": 1}}'}, "endingOffsets"), ({"mode": "x"}, "mode"),
                       ({"queueIds": "a"}, "queueIds"), ({"includeBody": "maybe"}, "includeBody"),
                       ({"subscribePattern": "("}, "subscribePattern"), ({"config": "/nope.conf"}, "config"),
                       ({"topcis": "TopicA"}, "topcis"), ({"mode": "commitlog", "startingOffsets": "earliest"},
                                                          "startingOffsets")]:
        with pytest.raises(O.OptionError, match=word):
            O.parse({"path": root, **opts})
    with pytest.raises(O.OptionError, match="path"):
        O.parse({"path": str(tmp_path)})
    with pytest.raises(O.OptionError, match="path"):
        O.parse({"path": str(tmp_path / "nothing*")})
    with pytest.raises(O.OptionError, match="path"):
        O.parse({"paths": json.dumps([root, str(tmp_path)])})


def _messages_in(view) -> int:
    return sum(q.end - q.min_offset for q in view.queues.values())


def test_view_cache_sees_an_append_whose_files_kept_their_sizes_and_mtimes(tmp_path):
    """The views kept between reads (viewcache): an append that left every file's size and mtime as they
    were (preallocated files; times put back as cp -p, rsync -t or tar do) is still a changed store, and so
    is a new config/damagedRanges.json; an unchanged store is served from the cache."""
    from rmqstore.spark.viewcache import ViewCache
    root = tmp_path / "store"
    cfg = StoreConfig(mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * 1000)
    with MessageStore.open(root, cfg) as st:
        st.put_messages([Message("T", b"m%d" % i, queue_id=i % 2) for i in range(100)])
        assert st.wait_dispatched()
    cache = ViewCache()
    first = cache.load(str(root), cfg, None)
    assert _messages_in(first) == 100 and cache.load(str(root), cfg, None) is first
    times = {p: (p.stat().st_atime_ns, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}
    with MessageStore.open(root, cfg) as st:
        st.put_messages([Message("T", b"n%d" % i, queue_id=i % 2) for i in range(10)])
        assert st.wait_dispatched()
    for p, ns in times.items():
        os.utime(p, ns=ns)
    assert {p: p.stat().st_size for p in times} == {p: os.path.getsize(p) for p in times}   # same sizes
    second = cache.load(str(root), cfg, None)
    assert second is not first and _messages_in(second) == 110
    assert cache.load(str(root), cfg, None) is second
    (root / "config").mkdir(exist_ok=True)
    (root / "config" / "damagedRanges.json").write_text('{"ranges": []}')
    assert cache.load(str(root), cfg, None) is not second


@pytest.mark.parametrize("fail", [True, False])
def test_consume_queue_file_deleted_after_planning_is_data_loss(tmp_path, fail):
    """A read planned before `rmqstore clean` (or a broker's cleaner) deleted a consume queue file: its
    offsets are data loss (failOnDataLoss: the read fails naming the queue, offsets and file; false: skipped
    and counted), the queue's other files and the other queues are read. It was a FileNotFoundError."""
    from rmqstore.spark.loss import DataLossError
    root = tmp_path / "store"
    cfg = StoreConfig(mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * 100)
    with MessageStore.open(root, cfg) as st:
        st.put_messages([Message("T", b"m%d" % i, queue_id=i % 2) for i in range(500)])   # 250 a queue
        assert st.wait_dispatched()
    conf = tmp_path / "store.conf"
    conf.write_text(cfg.to_properties())
    parts = P.plan_batch(O.parse({"path": str(root), "config": str(conf), "failOnDataLoss": str(fail).lower()}), [])
    gone = root / "consumequeue" / "T" / "0" / "00000000000000000000"      # queue 0's offsets 0..99
    gone.unlink()
    rows = []
    if fail:
        with pytest.raises(DataLossError, match=r"queue T/0 offsets 0 to 100: its consume queue file .*00000000000000000000 is gone"):
            for part in parts:
                for b in S.read_partition(part):
                    rows.extend(b.to_pylist())
        return
    for part in parts:
        for b in S.read_partition(part):
            rows.extend(b.to_pylist())
    got = {(r["queueId"], r["queueOffset"]) for r in rows}
    assert len(rows) == 400 and len(got) == 400
    assert got == {(0, o) for o in range(100, 250)} | {(1, o) for o in range(250)}


@pytest.mark.parametrize("fail", [True, False])
def test_commitlog_file_cut_short_in_the_middle_is_data_loss(tmp_path, fail):
    """A middle commitlog file truncated (a bad copy): its lost part is data loss (failOnDataLoss), every
    message before the cut and in the later files is read, as from an object store. It was a
    CorruptStoreError traceback from the view's recovery, whatever failOnDataLoss said."""
    from rmqstore.spark.loss import DataLossError
    root = tmp_path / "store"
    cfg = StoreConfig(mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=20 * 1000)
    with MessageStore.open(root, cfg) as st:
        res = st.put_messages([Message("T", b"x%05d" % i + b"y" * 100, queue_id=i % 2) for i in range(2000)])
        put = [(r.append_result.wrote_offset, r.append_result.wrote_bytes) for r in res]
        assert st.wait_dispatched()
        second = st.commit_log.queue.files[1]
        lo, hi = second.file_from_offset, second.file_from_offset + second.file_size
    conf = tmp_path / "store.conf"
    conf.write_text(cfg.to_properties())
    cut = lo + 30000
    os.truncate(root / "commitlog" / ("%020d" % lo), 30000)
    opts = {"path": str(root), "config": str(conf), "failOnDataLoss": str(fail).lower()}
    if fail:
        with pytest.raises(DataLossError, match="%020d" % lo):
            read_local(opts)
        return
    offs = [r["commitLogOffset"] for r in read_local(opts)]
    assert sorted(offs) == [o for o, size in put if o + size <= cut or o >= hi]
    assert any(o >= hi for o in offs) and any(lo <= o < cut for o in offs)
