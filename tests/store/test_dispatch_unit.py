"""The dispatcher (store/consumequeue/dispatch.py) on its own: a commitlog the store wrote, copied, and dispatched by a
Dispatcher over fresh consume queues and a fresh index. It must rebuild exactly what the store's own
dispatcher built (units, filler units, index entries), leave prepared and rolled-back transaction records
out of the queues (and rolled-back ones out of the index), handle IPv6 (v2 host) records and batches, and
report a QUEUEOFFSET jump it cannot fill on the failure channel.

Small stores (< 64 records a chunk) take the per-request path (put_requests), larger ones the column path
(put_columns): each test runs both.
"""
from __future__ import annotations

import shutil
import struct

import pytest

from rmqstore import Message, MessageStore
from rmqstore.store.format import codec, scanner
from rmqstore.store.commitlog.commit_log import CommitLog
from rmqstore.store.consumequeue.consume_queue import ConsumeQueueTable
from rmqstore.store.consumequeue.dispatch import Dispatcher
from rmqstore.store.state.failure import FailureChannel, FailureKind
from rmqstore.store.index.index_file import IndexService
from rmqstore.store.format.message_batch import MessageBatch

from store_checks import small_config

TOPICS = ("A", "B", "订单Topic")
TRAN = {0: codec.TRANSACTION_NOT_TYPE, 1: codec.TRANSACTION_PREPARED_TYPE, 2: codec.TRANSACTION_COMMIT_TYPE,
        3: codec.TRANSACTION_ROLLBACK_TYPE}


def _message(i: int) -> Message:
    v6 = i % 5 == 0
    return Message(TOPICS[i % 3], f"body-{i}".encode() * (1 + i % 7), queue_id=i % 4,
                   sys_flag=TRAN[i % 11] if i % 11 < 4 and i % 11 else 0,
                   born_host="[fe80::1]:4321" if v6 else "10.0.0.1:4321",
                   store_host="[::1]:10911" if i % 10 == 0 else None,
                   properties={"TAGS": f"t{i % 3}", "KEYS": f"k{i} shared", "UNIQ_KEY": f"U{i:08d}"})


def _write_store(path, n: int, batches: int = 0):
    """A store holding n single puts (and `batches` MessageBatch puts of 50), closed; returns (the put
    results of the single puts, the commitlog's end)."""
    with MessageStore.open(path, small_config()) as store:
        results = [(m, store.put_message(m)) for m in map(_message, range(n))]
        for b in range(batches):
            mb = MessageBatch("A", [f"batch-{b}-{j}".encode() for j in range(50)], queue_ids=3,
                              keys=[f"bk{b}-{j}" for j in range(50)])
            assert store.put_messages(mb).status.name == "PUT_OK"
        assert all(r.ok for _, r in results)
        assert store.wait_dispatched(timeout=60)
        end = store.commit_log.get_max_offset()
    return results, end


def _fresh_dispatcher(src, dst, end: int, patch=None) -> Dispatcher:
    """A Dispatcher over a copy of src's commitlog (patch(bytearray of the file, file base) may change the
    copy's files), with fresh consume queues and index in dst, dispatched from the start."""
    cfg = small_config()
    shutil.copytree(src / "commitlog", dst / "commitlog")
    if patch is not None:
        for f in sorted((dst / "commitlog").iterdir()):
            raw = bytearray(f.read_bytes())
            if patch(raw, int(f.name)):
                f.write_bytes(bytes(raw))
    cl = CommitLog(dst, cfg)
    cl.load()
    cl.queue.truncate_to(end)
    cqs = ConsumeQueueTable(dst, cfg.mapped_file_size_consume_queue)
    idx = IndexService(dst, cfg)
    idx.load(True, 0)
    d = Dispatcher(cl, cqs, idx, cfg, FailureChannel())
    d.reput_from_offset = cl.get_min_offset()
    d.do_reput()
    assert d.reput_from_offset == end
    return d


def _units(cqs, topic, qid):
    cq = cqs.find(topic, qid)
    if cq is None:
        return []
    u = cq.units(0, cq.get_max_offset_in_queue())
    return list(zip(u["offset"].tolist(), u["size"].tolist(), u["tags_code"].tolist()))


def _close(d: Dispatcher) -> None:
    for cq in d.consume_queues:
        cq.queue.shutdown() if hasattr(cq.queue, "shutdown") else None
    d.index_service.shutdown()


@pytest.mark.parametrize("n", [40, 400])
def test_fresh_dispatch_rebuilds_what_the_store_built(tmp_path, n):
    results, end = _write_store(tmp_path / "s", n, batches=2 if n > 100 else 0)
    d = _fresh_dispatcher(tmp_path / "s", tmp_path / "fresh", end)
    try:
        with MessageStore.open(tmp_path / "s", small_config(), start_services=False) as store:
            for t in TOPICS:
                for q in range(4):
                    assert _units(d.consume_queues, t, q) == _units(store.consume_queues, t, q), (t, q)
        assert d.failures.failures() == [] and d.stuck_reason() is None
        in_queues = {u[0] for cq in d.consume_queues for u in _units(d.consume_queues, cq.topic, cq.queue_id)}
        for m, r in results:
            off = r.append_result.wrote_offset
            assert (off in in_queues) == bool(scanner.is_dispatched(m.sys_flag)), (m, off)
            found, _, _ = d.index_service.query_offset(m.topic, m.properties["UNIQ_KEY"], 10, 0, 2 ** 62)
            assert (off in found) == bool(scanner.is_indexed(m.sys_flag)), (m, off)
            found, _, _ = d.index_service.query_offset(m.topic, m.keys[0], 10, 0, 2 ** 62)
            assert (off in found) == bool(scanner.is_indexed(m.sys_flag))
        v6 = [r.append_result.wrote_offset for m, r in results
              if m.born_host.startswith("[") and scanner.is_dispatched(m.sys_flag)]
        assert v6 and all(o in in_queues for o in v6)      # v2 host records: dispatched like any other
        if n > 100:
            assert len(_units(d.consume_queues, "A", 3)) >= 100         # the batches' records
            found, _, _ = d.index_service.query_offset("A", "bk1-49", 10, 0, 2 ** 62)
            assert len(found) == 1
    finally:
        _close(d)


def _patch_queue_offset(pick):
    """A patch for _fresh_dispatcher: the QUEUEOFFSET of the message record pick(records) chooses (from the
    list of (file base, position, topic, queue id, queue offset) of every dispatched record) is rewritten
    to the value pick returns; the chosen record is kept in `chosen`."""
    chosen = {}

    def patch(raw, base):
        if chosen:
            return False
        recs = []
        for pos, kind, _ in scanner.iter_records(raw, 0, len(raw)):
            if kind is scanner.Outcome.MESSAGE:
                r = codec.decode_fields(raw, pos, read_body=False)
                if scanner.is_dispatched(r.sys_flag):
                    recs.append((base, pos, r.topic, r.queue_id, r.queue_offset))
        got = pick(recs)
        if got is None:
            return False
        rec, new = got
        struct.pack_into(">q", raw, rec[1] + codec.POS_QUEUEOFFSET, new)
        chosen.update(rec=rec, new=new)
        return True
    return patch, chosen


def _last_of_queue(recs, jump):
    """The last record of the queue A/1 in the first file (so that no later record of it follows), moved
    `jump` queue offsets ahead."""
    mine = [r for r in recs if (r[2], r[3]) == ("A", 1)]
    return (mine[-1], mine[-1][4] + jump) if mine else None


@pytest.mark.parametrize("n", [40, 400])
def test_small_queue_offset_jump_is_filled_with_filler_units(tmp_path, n):
    """A record whose queue offset jumps ahead (within FILL_SLACK): the queue offsets between are filler units
    and the record keeps its own queue offset. When a later record of its queue does not continue it (400:
    the next one, in the next file and chunk, carries the offset after the jumped record's own), it is out
    of sequence (a damaged QUEUEOFFSET): its unit and fillers are cut, it is reported, and every later
    record keeps its queue offset (before, the jumped record answered at qoff + 4 and the intact messages
    qoff + 1 .. qoff + 4 were dropped as built already)."""
    results, end = _write_store(tmp_path / "s", n)
    patch, chosen = _patch_queue_offset(lambda recs: _last_of_queue(recs, 4))
    d = _fresh_dispatcher(tmp_path / "s", tmp_path / "fresh", end, patch)
    try:
        base, pos, topic, qid, qoff = chosen["rec"]
        units = _units(d.consume_queues, topic, qid)
        later = [r.append_result.wrote_offset for m, r in results if (m.topic, m.queue_id) == (topic, qid)
                 and scanner.is_dispatched(m.sys_flag) and r.append_result.wrote_offset > base + pos]
        if not later:
            assert units[qoff:qoff + 4] == [(0, codec.CQ_BLANK_SIZE, 0)] * 4
            assert len(units) == qoff + 5 and units[qoff + 4][0] == base + pos
            assert d.failures.failures() == []
        else:
            assert n == 400
            assert units[qoff] == (0, codec.CQ_BLANK_SIZE, 0)
            assert [u[0] for u in units[qoff + 1:]] == later
            assert [(f.kind, f.offset) for f in d.failures.failures()] == [(FailureKind.CORRUPT_RECORD, base + pos)]
    finally:
        _close(d)


@pytest.mark.parametrize("n", [40, 400])
def test_queue_offset_jump_too_large_to_fill_is_on_the_failure_channel(tmp_path, n):
    """Issue 15 leftover: a QUEUEOFFSET far past what lost ranges could hold (a damaged header) is not filled
    (no flood of filler units) and is reported on the failure channel, naming the commitlog file and the
    record's offset, so that check / wait_dispatched's callers see it, not only the log."""
    results, end = _write_store(tmp_path / "s", n)
    patch, chosen = _patch_queue_offset(lambda recs: _last_of_queue(recs, 100_000))
    d = _fresh_dispatcher(tmp_path / "s", tmp_path / "fresh", end, patch)
    try:
        base, pos, topic, qid, qoff = chosen["rec"]
        fails = d.failures.failures(FailureKind.CORRUPT_RECORD)
        assert len(fails) == 1, fails
        f = fails[0]
        assert f.offset == base + pos and f.path.endswith(f"{base:020d}")
        assert "QUEUEOFFSET" in f.reason and f"{topic}/{qid}" in f.reason
        assert d.consume_queues.find(topic, qid).get_max_offset_in_queue() < qoff + 100    # not filled
        assert d.reput_from_offset == end                   # dispatching went on
    finally:
        _close(d)


def test_prepared_and_rolled_back_records_take_no_queue_offset(tmp_path):
    """Prepared and rolled-back records carry queue offset 0 and never reach a queue; the records around
    them keep consecutive queue offsets (no filler units)."""
    path = tmp_path / "s"
    with MessageStore.open(path, small_config()) as store:
        flags = [0, codec.TRANSACTION_PREPARED_TYPE, 0, codec.TRANSACTION_ROLLBACK_TYPE,
                 codec.TRANSACTION_COMMIT_TYPE, codec.TRANSACTION_PREPARED_TYPE, 0]
        rs = [store.put_message(Message("T", b"x%d" % i, sys_flag=f, properties={"KEYS": f"k{i}"}))
              for i, f in enumerate(flags)]
        assert store.wait_dispatched(timeout=60)
        end = store.commit_log.get_max_offset()
    d = _fresh_dispatcher(path, tmp_path / "fresh", end)
    try:
        units = _units(d.consume_queues, "T", 0)
        want = [r.append_result.wrote_offset for r, f in zip(rs, flags) if scanner.is_dispatched(f)]
        assert [u[0] for u in units] == want and len(want) == 4
        for i, (r, f) in enumerate(zip(rs, flags)):
            found, _, _ = d.index_service.query_offset("T", f"k{i}", 10, 0, 2 ** 62)
            assert (r.append_result.wrote_offset in found) == (f != codec.TRANSACTION_ROLLBACK_TYPE)
    finally:
        _close(d)


def test_a_few_records_out_of_their_queues_sequence_get_no_unit(tmp_path):
    """put_requests (a put of a few records) decides the common case without numpy: a record in the middle
    of a small batch whose QUEUEOFFSET is out of sequence still gets no unit and is told, and the batch's
    other records get theirs; a lone record continuing the queue gets its unit."""
    from rmqstore.store.consumequeue.dispatch import fill_queue, put_requests
    table = ConsumeQueueTable(tmp_path / "consumequeue", 20 * 1000)

    def req(claim: int, offset: int) -> codec.DispatchRequest:
        return codec.DispatchRequest("T", 0, offset, 100, 0, 1, claim, None, None, 0, 0, {})
    told = []

    def put(reqs):
        return put_requests(table.find_or_create, reqs, lambda cq, upto, _off: fill_queue(cq, upto), None,
                            lambda cq, off, size, claim: told.append((off, claim)))
    assert put([req(i, 100 * i) for i in range(5)]) == [("T", 0, 5)]
    assert put([req(5, 500), req(99, 600), req(6, 700)]) == [("T", 0, 7)]
    assert put([req(7, 800)]) == [("T", 0, 8)]
    cq = table.find("T", 0)
    assert [cq.get_unit(i)[0] for i in range(8)] == [0, 100, 200, 300, 400, 500, 700, 800]
    assert told == [(600, 99)]
