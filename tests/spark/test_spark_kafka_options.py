"""The rocketmq source's Kafka-source options on a plain SparkSession: timestamps as Kafka reads them (the
first offset whose store time is >= T), startingOffsetsByTimestamp / endingOffsetsByTimestamp and their
strategy, minPartitions, unknown queues, stream-only and batch-only options, the queues metadata view, and
failOnDataLoss both ways (commitlog files deleted, a middle commitlog file zeroed or missing)."""
from __future__ import annotations

import json
import shutil
import time

import pytest

from conftest import local_spark

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from rmqstore.spark import skipped_data
from rmqstore.store.conf.config import StoreConfig
from rmqstore.store.format.message import Message
from rmqstore.store.store import MessageStore
from conftest import load_store as load

pytestmark = pytest.mark.spark
CFG = StoreConfig(mapped_file_size_commit_log=8192, mapped_file_size_consume_queue=20 * 1000)
ROUNDS, PER_ROUND = 4, 60           # messages of topic T (2 queues), stored in rounds a few ms apart


@pytest.fixture(scope="module")
def spark():
    return local_spark("rmqstore-test-kafka-options")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Topic T, 2 queues, 240 messages of ~200 bytes in 8 KiB commitlog files (about 9 files)."""
    root = tmp_path_factory.mktemp("kafka") / "b" / "store"
    with MessageStore.open(root, CFG) as st:
        for r in range(ROUNDS):
            st.put_messages([Message("T", (f"r{r}-{i}-" + "x" * 150).encode(), queue_id=i % 2)
                             for i in range(PER_ROUND)])
            assert st.wait_dispatched()
            time.sleep(0.03)
    (root.parent / "store.conf").write_text(CFG.to_properties())
    return root


def rows(df) -> list[tuple]:
    from pyspark.sql import functions as F
    return sorted((r.queueId, r.queueOffset, r.ms) for r in
                  df.select("queueId", "queueOffset", F.unix_millis("storeTimestamp").alias("ms")).collect())


def test_timestamps_start_at_the_first_message_stored_at_or_after(spark, store):
    every = rows(load(spark, store))
    assert len(every) == ROUNDS * PER_ROUND
    times = sorted({ms for _, _, ms in every})
    t = times[len(times) // 2] + 1            # between two store times: Kafka's rule differs from RocketMQ's
    got = rows(load(spark, store, startingTimestamp=str(t)))
    assert got == [r for r in every if r[2] >= t] and got
    per_queue = {"T": {"0": t, "1": times[0]}}
    got = rows(load(spark, store, startingOffsetsByTimestamp=json.dumps(per_queue),
                    endingOffsetsByTimestamp=json.dumps({"T": {"0": times[-1] + 1, "1": t}})))
    assert got == [r for r in every if (r[0] == 0 and r[2] >= t) or (r[0] == 1 and r[2] < t)]
    from pyspark.errors import PySparkException
    with pytest.raises(PySparkException, match="startingOffsetsByTimestampStrategy"):
        load(spark, store, startingTimestamp=str(times[-1] + 1)).count()


def test_option_checks(spark, store):
    from pyspark.errors import PySparkException
    conf = str(store.parent / "store.conf")
    with pytest.raises(Exception, match="endingTimestamp"):       # when the stream starts
        q = (spark.readStream.format("rocketmq").option("config", conf).option("endingTimestamp", "5")
             .load(str(store)).writeStream.format("memory").queryName("ending_ts").start())
        q.awaitTermination(300)
    with pytest.raises(PySparkException, match="no queue T/5"):
        load(spark, store, startingOffsets=json.dumps({"T": {"0": 0, "5": 0}})).count()
    with pytest.raises(PySparkException, match="startingOffsetsByTimestampStrategy"):
        load(spark, store, startingOffsetsByTimestampStrategy="earliest")
    with pytest.raises(PySparkException, match="maxTriggerDelay"):
        load(spark, store, maxTriggerDelay="soon")
    assert load(spark, store, minPartitions="6").rdd.getNumPartitions() >= 6
    assert load(spark, store).rdd.getNumPartitions() == 1


def test_queues_view_counts_without_a_scan(spark, store):
    got = {(r.topic, r.queueId): r for r in load(spark, store, view="queues").collect()}
    assert set(got) == {("T", 0), ("T", 1)}
    every = rows(load(spark, store))
    for q in (0, 1):
        r = got[("T", q)]
        mine = [x for x in every if x[0] == q]
        assert (r.minOffset, r.maxOffset, r.messages) == (0, len(mine), len(mine))
        assert (r.firstStoreTimestamp.timestamp() * 1000, r.lastStoreTimestamp.timestamp() * 1000) == \
            pytest.approx((mine[0][2], mine[-1][2]), abs=1)


def _copy(store, dst):
    shutil.copytree(store.parent, dst)
    return dst / "store"


def _cl_files(root):
    return sorted((root / "commitlog").iterdir())


@pytest.mark.parametrize("how", ["zeroed", "deleted"])
def test_damaged_middle_commitlog_file_fails_or_is_skipped(spark, store, tmp_path, how):
    from pyspark.errors import PySparkException
    root = _copy(store, tmp_path / "c")
    files = _cl_files(root)
    assert len(files) >= 6
    victim = files[2]
    base, nxt = int(victim.name), int(files[3].name)
    if how == "zeroed":
        victim.write_bytes(b"\0" * victim.stat().st_size)
    else:
        victim.unlink()
    every = rows(load(spark, store))
    offs = {(r.queueId, r.queueOffset): r.commitLogOffset for r in
            load(spark, store).select("queueId", "queueOffset", "commitLogOffset").collect()}
    kept = [r for r in every if not base <= offs[(r[0], r[1])] < nxt]
    assert 0 < len(kept) < len(every)
    for mode in ("queue", "commitlog"):
        with pytest.raises(PySparkException, match="failOnDataLoss") as e:
            load(spark, root, mode=mode).count()
        assert str(base) in str(e.value) or victim.name in str(e.value)
    before = skipped_data(spark)
    assert rows(load(spark, root, failOnDataLoss="false")) == kept          # later files are read
    after = skipped_data(spark)
    if how == "deleted":    # the messages it held are known (the queues' offsets jump over them): counted
        assert (after["ranges"] - before["ranges"], after["messages"] - before["messages"]) == \
            (1, len(every) - len(kept))
    got = load(spark, root, mode="commitlog", failOnDataLoss="false").filter("topic = 'T'")
    assert rows(got) == kept


def test_deleted_commitlog_files_and_offsets_before_the_queue_start(spark, store, tmp_path):
    from pyspark.errors import PySparkException
    root = _copy(store, tmp_path / "d")
    files = _cl_files(root)
    for f in files[:2]:
        f.unlink()                         # what `rmqstore clean --force` leaves: the consume queues still point there
    start = int(files[2].name)
    every = load(spark, store).select("queueId", "queueOffset", "commitLogOffset").collect()
    left = sorted((r.queueId, r.queueOffset) for r in every if r.commitLogOffset >= start)
    assert sorted((r.queueId, r.queueOffset) for r in load(spark, root).collect()) == left   # earliest: no loss
    asked = json.dumps({"T": {"0": 0, "1": 0}})
    with pytest.raises(PySparkException, match="failOnDataLoss") as e:
        load(spark, root, startingOffsets=asked).count()
    assert "T/0" in str(e.value) or "T/1" in str(e.value)
    got = load(spark, root, startingOffsets=asked, failOnDataLoss="false")
    before = skipped_data(spark)
    assert sorted((r.queueId, r.queueOffset) for r in got.collect()) == left
    after = skipped_data(spark)             # each queue's deleted offsets, counted once
    assert (after["ranges"] - before["ranges"], after["messages"] - before["messages"]) == (2, len(every) - len(left))
    stream = (spark.readStream.format("rocketmq").option("config", str(root.parent / "store.conf"))
              .option("startingOffsets", asked).load(str(root)))
    q = stream.writeStream.format("memory").queryName("loss_stream").trigger(availableNow=True).start()
    with pytest.raises(Exception, match="failOnDataLoss"):
        q.awaitTermination(300)


def test_a_flipped_body_byte_fails_the_read_unless_told(spark, store, tmp_path):
    """checkCRC (on by default, as Kafka's check.crcs): a body that does not match its BODYCRC."""
    from pyspark.errors import PySparkException
    root = _copy(store, tmp_path / "crc")
    first = _cl_files(root)[0]
    raw = bytearray(first.read_bytes())
    at = raw.index(b"r0-4-") + 6
    raw[at] ^= 0x01
    first.write_bytes(bytes(raw))
    with pytest.raises(PySparkException, match="BODYCRC"):
        load(spark, root, topics="T", queueIds="0").count()
    assert load(spark, root, topics="T", queueIds="0", checkCRC="false").count() == ROUNDS * PER_ROUND // 2
    before = skipped_data(spark)
    assert load(spark, root, topics="T", queueIds="0", failOnDataLoss="false").count() == ROUNDS * PER_ROUND // 2 - 1
    after = skipped_data(spark)             # the session's metric: one range of one message skipped
    assert (after["ranges"] - before["ranges"], after["messages"] - before["messages"]) == (1, 1)


def test_stream_offsets_reuse_the_view_while_the_store_is_unchanged(tmp_path):
    """latestOffset on a store nobody writes does not emulate recovery again (no Spark needed)."""
    from rmqstore.spark.stream import RocketMQStreamReader
    root = tmp_path / "s" / "store"
    with MessageStore.open(root, CFG) as st:
        st.put_messages([Message("T", b"m%d" % i, queue_id=i % 2) for i in range(10)])
        assert st.wait_dispatched()
    conf = tmp_path / "s" / "store.conf"
    conf.write_text(CFG.to_properties())
    r = RocketMQStreamReader({"path": str(root), "config": str(conf), "startingOffsets": "earliest"})
    start = r.initialOffset()
    assert r.latestOffset(start, r.getDefaultReadLimit()) == {"s": {"T": {"0": 5, "1": 5}}}
    views = [v for _, v in r._cache._views.values()]
    r.latestOffset(start, r.getDefaultReadLimit())
    assert all(a is b for a, b in zip(views, [v for _, v in r._cache._views.values()], strict=True))
    # minOffsetsPerTrigger: 10 messages are fewer than 20: no batch until maxTriggerDelay has passed
    opts = {"path": str(root), "config": str(conf), "startingOffsets": "earliest", "minOffsetsPerTrigger": "20"}
    waiting = RocketMQStreamReader({**opts, "maxTriggerDelay": "1h"})
    assert waiting.latestOffset(start, waiting.getDefaultReadLimit()) == start
    due = RocketMQStreamReader({**opts, "maxTriggerDelay": "0s"})
    assert due.latestOffset(start, due.getDefaultReadLimit()) == {"s": {"T": {"0": 5, "1": 5}}}
    with MessageStore.open(root, CFG) as st:
        st.put_messages([Message("T", b"n", queue_id=0)])
        assert st.wait_dispatched()
    end = r.latestOffset(start, r.getDefaultReadLimit())
    assert list(end.values())[0] == {"T": {"0": 6, "1": 5}}


def test_stream_batch_whose_offsets_were_deleted_meanwhile(store, tmp_path):
    """A micro-batch planned before `rmqstore clean --force` deleted its messages (no Spark needed)."""
    from rmqstore.spark.loss import DataLossError
    from rmqstore.spark.stream import RocketMQStreamReader
    root = _copy(store, tmp_path / "st")
    opts = {"path": str(root), "config": str(root.parent / "store.conf"), "startingOffsets": "earliest"}
    r = RocketMQStreamReader(opts)
    start = r.initialOffset()
    end = r.latestOffset(start, r.getDefaultReadLimit())
    assert start == {"st": {"T": {"0": 0, "1": 0}}}
    for f in _cl_files(root)[:2]:
        f.unlink()
    with pytest.raises(DataLossError, match=r"queue T/0: offsets 0\.\.\d+ of this batch were deleted"):
        RocketMQStreamReader(opts).partitions(start, end)
    parts = RocketMQStreamReader({**opts, "failOnDataLoss": "false"}).partitions(start, end)
    firsts = {qv.queue_id: a for p in parts for qv, a, _ in p.items}
    assert firsts[0] > 0 and firsts[1] > 0


def test_commitlog_mode_cuts_files_at_record_starts_for_min_partitions(spark, store, tmp_path):
    """mode=commitlog honours minPartitions: a file is cut where a consume queue unit points at a record
    (checked on the driver) and each piece's walk must land on the next piece: the same rows as whole files;
    a damaged record loses the rest of its piece only, and says so (failOnDataLoss)."""
    from pyspark.errors import PySparkException
    from rmqstore.spark import skipped_data

    def key(df) -> list[tuple]:
        return sorted(tuple(r) for r in df.select("commitLogOffset", "queueId", "queueOffset", "body").collect())
    whole = load(spark, store, mode="commitlog")
    cut = load(spark, store, mode="commitlog", minPartitions="20")
    assert whole.rdd.getNumPartitions() < 20 <= cut.rdd.getNumPartitions()
    every = key(whole)
    assert key(cut) == every and len(every) == ROUNDS * PER_ROUND
    root = _copy(store, tmp_path / "d")
    victim = _cl_files(root)[2]
    base, nxt = int(victim.name), int(_cl_files(root)[3].name)
    with open(victim, "r+b") as f:             # the magic code of the file's first record
        f.seek(4)
        f.write(b"\xde\xad\xbe\xef")
    with pytest.raises(PySparkException, match="failOnDataLoss") as e:
        load(spark, root, mode="commitlog", minPartitions="20").count()
    assert str(base) in str(e.value)
    before = skipped_data(spark)["ranges"]
    got = key(load(spark, root, mode="commitlog", minPartitions="20", failOnDataLoss="false"))
    in_file = [r for r in every if base <= r[0] < nxt]
    lost = [r for r in every if r not in got]
    assert lost and lost == in_file[:len(lost)] and len(lost) < len(in_file)     # the later pieces are read
    assert skipped_data(spark)["ranges"] > before


def test_pieces_are_cut_only_where_a_record_starts(store, tmp_path, caplog, monkeypatch):
    """cut_pieces takes a consume queue unit as a cut only when the commitlog holds a record of the unit's
    size there: a unit pointing into the middle of a record (a damaged consume queue) is passed over, with a
    warning naming the file and byte."""
    import struct
    import numpy as np
    from rmqstore.store.format import codec
    from rmqstore.spark.pieces import cut_pieces
    from rmqstore.spark.plan import commitlog_items
    from rmqstore.store.recovery.view import load_view
    root = _copy(store, tmp_path / "p")
    view = load_view(str(root), CFG)
    items = commitlog_items(view)
    good = cut_pieces(view, items, 30, 1)
    assert len(good) > len(items) and all(p[2] < p[3] for p in good)
    starts = {p[0] + p[2] for p in good}
    walked = {int(r.commit_log_offset) for r in _records(root)}
    assert starts <= walked                       # every piece starts at a record
    import rmqstore.spark.pieces as P          # units pointing 16 bytes into their records (recovery would
    true = P._record_starts(view)               # rebuild such a consume queue: given to the cutter directly)
    monkeypatch.setattr(P, "_record_starts", lambda v: (true[0] + 16, *true[1:]))
    with caplog.at_level("WARNING", logger="rmqstore.spark.pieces"):
        bad = cut_pieces(view, items, 30, 1)
    assert bad == items and "does not start" in caplog.text
    # bytes inside a body that look like a record header (TOTALSIZE and magic code), a unit pointing there
    fake = tmp_path / "f" / "store"
    with MessageStore.open(fake, CFG) as st:
        for i in range(40):
            body = b"x" * 20 + struct.pack(">iI", 230, codec.MESSAGE_MAGIC_CODE) + b"z" * 200 if i == 20 else b"y" * 220
            st.put_message(Message("T", body, queue_id=0))
        assert st.wait_dispatched()
    view = load_view(str(fake), CFG)
    items = commitlog_items(view)
    at = _cl_files(fake)[0].read_bytes().index(struct.pack(">iI", 230, codec.MESSAGE_MAGIC_CODE))
    monkeypatch.setattr(P, "_record_starts", lambda v: tuple(np.array([x]) for x in (at, 230, 0, 21)))
    caplog.clear()
    with caplog.at_level("WARNING", logger="rmqstore.spark.pieces"):
        assert cut_pieces(view, items, 30, 1) == items and "does not start" in caplog.text


def _records(root):
    from rmqstore.store.reads.reader import CommitLogReader
    with CommitLogReader(root, CFG) as r:
        return list(r.messages())


def test_a_record_whose_physicaloffset_field_is_damaged_is_data_loss(spark, store, tmp_path):
    """PHYSICALOFFSET is not covered by BODYCRC: a damaged one must not make a row with a false commitLogOffset
    (found by an outside test: every mode answered commitLogOffset=123); the record is data loss, reported."""
    import struct
    from pyspark.errors import PySparkException
    root = _copy(store, tmp_path / "p")
    every = sorted(r.commitLogOffset for r in load(spark, store).select("commitLogOffset").collect())
    victim = every[len(every) // 2]
    f = next(p for p in reversed(_cl_files(root)) if int(p.name) <= victim)
    with open(f, "r+b") as fh:
        fh.seek(victim - int(f.name) + 28)       # the PHYSICALOFFSET field
        fh.write(struct.pack(">q", 123))
    for mode in ("queue", "commitlog"):
        with pytest.raises(PySparkException, match=f"first at commitlog offset {victim} .the field says 123"):
            load(spark, root, mode=mode).count()
        before = skipped_data(spark)["messages"]
        got = sorted(r.commitLogOffset for r in
                     load(spark, root, mode=mode, failOnDataLoss="false").select("commitLogOffset").collect())
        assert got == [o for o in every if o != victim] and skipped_data(spark)["messages"] == before + 1


def test_commitlog_mode_reads_the_topics_and_queues_the_options_select(spark, store):
    """topics / subscribePattern / queueIds select the same rows in mode=commitlog as in mode=queue (found by
    an outside test: the commitlog walk returned every topic's rows)."""
    def key(df) -> list:
        return sorted((r.topic, r.queueId, r.queueOffset)
                      for r in df.select("topic", "queueId", "queueOffset").collect())
    for opts in ({"queueIds": "1"}, {"subscribePattern": "T"}, {"subscribePattern": "Nope.*"}, {"topics": "T"},
                 {"topics": "T", "queueIds": "0", "minPartitions": "5"}):
        want = key(load(spark, store, **opts))
        assert key(load(spark, store, mode="commitlog", **opts)) == want
        assert len(want) == {"1": ROUNDS * PER_ROUND // 2, "0": ROUNDS * PER_ROUND // 2}.get(
            opts.get("queueIds"), 0 if opts.get("subscribePattern") == "Nope.*" else ROUNDS * PER_ROUND)


@pytest.mark.parametrize("which", [-1, -2])
def test_missing_last_commitlog_files_are_data_loss_counted(spark, store, tmp_path, which):
    """The last commitlog file deleted (which=-1: the store's data now ends before what its consume queues
    point at) or the one before it: data loss, with the number of messages lost (found by an outside test:
    the last file went missing without a word, and the one before it was under-counted)."""
    from pyspark.errors import PySparkException
    root = _copy(store, tmp_path / "m")
    files = _cl_files(root)
    victim = files[which]
    lo, hi = int(victim.name), int(victim.name) + CFG.mapped_file_size_commit_log
    victim.unlink()
    every = load(spark, store).select("commitLogOffset").collect()
    lost = sum(1 for r in every if lo <= r.commitLogOffset < hi)
    assert lost
    for mode in ("queue", "commitlog"):
        with pytest.raises(PySparkException, match="failOnDataLoss"):
            load(spark, root, mode=mode).count()
        before = skipped_data(spark)
        assert load(spark, root, mode=mode, failOnDataLoss="false").count() == len(every) - lost
        after = skipped_data(spark)
        assert (after["ranges"] - before["ranges"], after["messages"] - before["messages"]) == (1, lost)
