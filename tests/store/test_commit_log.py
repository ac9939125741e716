"""CommitLog put path against RocketMQ 4.4.0's own answers and files, limits, file ends, threads."""
from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import golden_store, read_jsonl
from rmqstore.store.format import codec
from rmqstore.store.commitlog.commit_log import CommitLog
from rmqstore.store.conf.config import StoreConfig
from rmqstore.store.format.message import Message, PutMessageStatus
from rmqstore.store.reads.reader import CommitLogReader


def open_log(store: Path, cfg: StoreConfig) -> CommitLog:
    cl = CommitLog(store, cfg)
    cl.load()
    return cl


def put_in_chunks(cl: CommitLog, msgs: list[Message], chunk: int = 1000) -> list[dict]:
    out = []
    for i in range(0, len(msgs), chunk):
        out.extend(r.to_json() for r in cl.put_messages(msgs[i:i + chunk]))
    return out


def commitlog_bytes(store: Path) -> dict[str, bytes]:
    d = store / "commitlog"
    return {n: (d / n).read_bytes() for n in sorted(os.listdir(d))}


def compare_commitlog(tools: Path, expected: Path, actual: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(tools / "compare_commitlog.py"), str(expected), str(actual)],
                          capture_output=True, text=True, timeout=300)


# --- byte compatibility with the golden sets --------------------------------------------------------
@pytest.mark.parametrize("name, puts, extra_golden_files", [
    ("rmq440-clean", 3000, 0),
    # RocketMQ had already created (pre-allocated) the next, still empty, file when it was killed
    ("rmq440-crash", 8008, 1),
])
def test_golden_puts_and_commitlog(golden, compare_tools, tmp_path, name, puts, extra_golden_files):
    gset = golden / name
    cfg = StoreConfig.load(gset / "store.conf")
    msgs = [Message.from_json(d) for d in read_jsonl(gset / "messages.jsonl")]
    expected = [{k: d[k] for k in ("status", "msgId", "wroteOffset", "logicsOffset")}
                for d in read_jsonl(gset / "puts.jsonl")]
    assert len(msgs) == len(expected) == puts

    cl = open_log(tmp_path, cfg)
    got = put_in_chunks(cl, msgs)
    cl.queue.flush()
    cl.shutdown()
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"put {i}"
    assert len(got) == len(expected)

    golden_dir = golden_store(golden, name) / "commitlog"
    golden_names = sorted(os.listdir(golden_dir))
    ours = sorted(os.listdir(tmp_path / "commitlog"))
    assert ours == golden_names[:len(golden_names) - extra_golden_files]
    for extra in golden_names[len(ours):]:
        assert not any((golden_dir / extra).read_bytes()), f"golden {extra} is not empty"

    if extra_golden_files:   # compare over the files the golden set has in common with ours
        expected_dir = tmp_path / "expected-commitlog"
        expected_dir.mkdir()
        for n in ours:
            os.symlink(golden_dir / n, expected_dir / n)
    else:
        expected_dir = golden_dir
    res = compare_commitlog(compare_tools, expected_dir, tmp_path / "commitlog")
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{puts} message records equal" in res.stdout


@pytest.mark.parametrize("name", ["rmq440-clean", "rmq440-crash"])
def test_reader_summary_matches_golden_dump(golden, name):
    """The read-only scan of RocketMQ's commitlog ends where RocketMQ says and finds every queue's end."""
    dump = read_jsonl(golden / name / "dump.jsonl")
    s = CommitLogReader(golden_store(golden, name), StoreConfig.load(golden / name / "store.conf")).summary()
    assert s.min_offset == dump[0]["minPhy"] == 0
    assert s.end_offset == dump[0]["maxPhy"]
    assert s.messages == len(read_jsonl(golden / name / "puts.jsonl"))
    queues = {f"{d['queue']}-{d['queueId']}": d["max"] for d in dump if "queue" in d}
    assert s.queue_offsets == queues


# --- limits: refused messages write nothing ----------------------------------------------------------
def msg(topic: str = "T", body: bytes = b"", queue_id: int = 0, sys_flag: int = 0, **props: str) -> Message:
    return Message(topic=topic, body=body, queue_id=queue_id, sys_flag=sys_flag, born_timestamp=1,
                   born_host="10.0.0.1:1", store_host="10.0.0.2:10911", properties=dict(props))


def test_limits_refuse_and_write_nothing(tmp_path):
    cfg = StoreConfig.from_dict({"mappedFileSizeCommitLog": 65536 * 2, "maxMessageSize": 40000})
    cl = open_log(tmp_path, cfg)
    first = [cl.put_message(msg(body=b"x" * 10, queue_id=q)) for q in range(3)]
    assert all(r.ok for r in first)
    cl.queue.flush()
    max_before = cl.get_max_offset()
    bytes_before = commitlog_bytes(tmp_path)
    table_before = dict(cl.topic_queue_table)

    too_long_props = "v" * (codec.MAX_PROPERTIES_LENGTH - 2)        # "k\x01" + v + "\x02" = 32768 bytes
    assert len(codec.properties_to_string({"k": too_long_props}).encode()) == 32768
    body_for = lambda total: b"b" * (total - codec.record_length(0, 1, 0))   # noqa: E731  topic "T", no props
    cases = [
        (msg(topic="T" * 128), PutMessageStatus.MESSAGE_ILLEGAL),
        (msg(topic="订" * 43), PutMessageStatus.MESSAGE_ILLEGAL),           # 129 bytes of UTF-8
        (msg(topic=""), PutMessageStatus.MESSAGE_ILLEGAL),
        (msg(k=too_long_props), PutMessageStatus.PROPERTIES_SIZE_EXCEEDED),
        (msg(body=body_for(40001)), PutMessageStatus.MESSAGE_ILLEGAL),      # maxMessageSize + 1
    ]
    for m, status in cases:
        r = cl.put_message(m)
        assert r.status is status, m.topic[:10]
        assert r.append_result is None
        assert cl.get_max_offset() == max_before
    cl.queue.flush()
    assert commitlog_bytes(tmp_path) == bytes_before
    assert cl.topic_queue_table == table_before

    # a refused message in a batch: the others are stored, back to back
    rs = cl.put_messages([msg(queue_id=0), msg(topic="T" * 128), msg(queue_id=0)])
    assert [r.status for r in rs] == [PutMessageStatus.PUT_OK, PutMessageStatus.MESSAGE_ILLEGAL,
                                      PutMessageStatus.PUT_OK]
    assert rs[0].append_result.wrote_offset == max_before
    assert rs[2].append_result.wrote_offset == max_before + rs[0].append_result.wrote_bytes
    assert [rs[0].append_result.logics_offset, rs[2].append_result.logics_offset] == [1, 2]

    # the limits themselves are allowed
    ok = [msg(topic="T" * 127), msg(k="v" * (codec.MAX_PROPERTIES_LENGTH - 3)), msg(body=body_for(40000))]
    for m in ok:
        r = cl.put_message(m)
        assert r.ok, r.status
    assert r.append_result.wrote_bytes == 40000
    cl.shutdown()


# --- END_OF_FILE blank records ---------------------------------------------------------------------
def test_end_of_file_blank_record(tmp_path):
    size = 4096
    cl = open_log(tmp_path, StoreConfig.from_dict({"mappedFileSizeCommitLog": size}))
    base = codec.record_length(0, 1, 0)             # topic "T", no properties, empty body

    def put(total: int, queue_id: int = 0):
        r = cl.put_message(msg(body=b"z" * (total - base), queue_id=queue_id))
        assert r.ok and r.append_result.wrote_bytes == total
        return r.append_result

    # file 0: a message that leaves exactly 8 bytes free still goes in; the next one does not
    assert put(size - 8 - 200).wrote_offset == 0
    assert put(200).wrote_offset == size - 200 - 8
    a = put(300)
    assert a.wrote_offset == size                   # to file 1, behind an 8-byte blank record
    # file 1: a message that would leave 7 bytes goes to file 2, behind a blank of its size + 7
    pos = 300
    b = put(size - pos - 7)
    assert b.wrote_offset == 2 * size
    assert b.logics_offset == 3                     # blank records take no queue offset
    cl.queue.flush()
    data = commitlog_bytes(tmp_path)
    f0, f1, f2 = (data[f"{i * size:020d}"] for i in range(3))
    assert struct.unpack_from(">iI", f0, size - 8) == (8, codec.BLANK_MAGIC_CODE)
    assert struct.unpack_from(">iI", f1, pos) == (size - pos, codec.BLANK_MAGIC_CODE)
    assert struct.unpack_from(">i", f2, 0)[0] == size - pos - 7
    assert cl.get_max_offset() == 2 * size + size - pos - 7

    # the read-only scanner sees the same thing
    recs = [(r.offset, r.kind, r.size) for r in CommitLogReader(tmp_path).records()]
    assert recs == [(0, 0, size - 208), (size - 208, 0, 200), (size - 8, 1, 8), (size, 0, 300),
                    (size + pos, 1, size - pos), (2 * size, 0, size - pos - 7)]
    cl.shutdown()


# --- concurrency ------------------------------------------------------------------------------------
def test_concurrent_producers(tmp_path):
    threads_n, per_thread = 8, 2000
    fsize = 256 * 1024
    cl = open_log(tmp_path, StoreConfig.from_dict({"mappedFileSizeCommitLog": fsize}))
    results: list[list[tuple]] = [[] for _ in range(threads_n)]
    start = threading.Barrier(threads_n)

    def producer(t: int) -> None:
        rnd = random.Random(t)
        start.wait()
        i = 0
        while i < per_thread:
            n = 1 if rnd.random() < 0.7 else min(rnd.randint(2, 20), per_thread - i)
            batch = [msg(topic=f"Topic{rnd.randint(0, 2)}", queue_id=rnd.randint(0, 3),
                         body=os.urandom(rnd.randint(0, 300)), UNIQ_KEY=f"{t}-{i + k}") for k in range(n)]
            rs = cl.put_messages(batch) if n > 1 else [cl.put_message(batch[0])]
            for m, r in zip(batch, rs):
                assert r.ok, r.status
                a = r.append_result
                results[t].append((a.wrote_offset, a.wrote_bytes, f"{m.topic}-{m.queue_id}", a.logics_offset))
            i += n

    ts = [threading.Thread(target=producer, args=(t,)) for t in range(threads_n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    cl.queue.flush()

    all_puts = sorted(p for r in results for p in r)
    assert len(all_puts) == threads_n * per_thread
    assert len({p[0] for p in all_puts}) == len(all_puts)           # distinct offsets
    data = commitlog_bytes(tmp_path)
    expect = 0
    for off, size, _key, _q in all_puts:                              # contiguous, blanks at file ends
        if off != expect:
            assert off % fsize == 0 and expect // fsize == off // fsize - 1, (expect, off)
            blank = struct.unpack_from(">iI", data[f"{expect - expect % fsize:020d}"], expect % fsize)
            assert blank == (fsize - expect % fsize, codec.BLANK_MAGIC_CODE)
        expect = off + size
    assert expect == cl.get_max_offset()
    per_queue: dict[str, list[int]] = {}
    for _off, _size, key, q in all_puts:                              # physical order = queue order
        per_queue.setdefault(key, []).append(q)
    for key, qs in per_queue.items():
        assert qs == list(range(len(qs))), key
    for r in results:                                                 # each thread's puts in its order
        offs = [p[0] for p in r]
        assert offs == sorted(offs)
    # and the bytes say the same
    scanned = [(m.commit_log_offset, m.store_size, f"{m.topic}-{m.queue_id}", m.queue_offset)
               for m in CommitLogReader(tmp_path).messages(read_body=False)]
    assert scanned == all_puts
    cl.shutdown()


# --- transactions -----------------------------------------------------------------------------------
def test_prepared_and_rollback_take_no_queue_offset(tmp_path):
    cl = open_log(tmp_path, StoreConfig())
    flags = [0, 4, 8, 12, 4, 0, 12, 8, 0]
    want = [0, 0, 1, 0, 0, 2, 0, 3, 4]
    got = [cl.put_message(msg(topic="TX", queue_id=1, sys_flag=f)).append_result.logics_offset for f in flags]
    assert got == want
    assert cl.topic_queue_table["TX-1"] == 5
    cl.queue.flush()
    stored = [(m.sys_flag, m.queue_offset) for m in CommitLogReader(tmp_path).messages()]
    assert stored == list(zip(flags, want))
    cl.shutdown()


def test_flush_and_commit_walk_thousands_of_full_files(tmp_path):
    """One flush (and one commit of the write buffer) over more full files than Python's recursion limit."""
    from rmqstore.store.format.message_batch import MessageBatch
    cfg = StoreConfig.from_dict({"mappedFileSizeCommitLog": 4096, "transientStorePoolEnable": "true"})
    cl = CommitLog(tmp_path, cfg)
    cl.load()
    try:
        n = 60_000
        assert cl.put_messages(MessageBatch("T", [b"x"] * n)).all_ok
        q = cl.queue
        assert len(q.files) > 1200
        assert q.commit(0) is False and q.committed_where == cl.get_max_offset()
        assert q.flush(0) is False and q.flushed_where == cl.get_max_offset()
        assert q.flush(0) is True           # nothing left
        assert cl.look_message_by_offset(q.files[-1].file_from_offset).body == b"x"
    finally:
        cl.shutdown()
