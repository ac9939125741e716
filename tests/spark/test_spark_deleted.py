"""Spark and deleted topics (an outside audit): `rmqstore rebuild --engine spark` built a deleted generation
back (its old messages answered at offsets 0..4, the 5 acknowledged new ones unreadable, and it exited 0
after "1 units are still missing"); the `key` option answered two rows for one queue offset and
`mode=commitlog` served deleted records."""
from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from conftest import load_store, local_spark, run_cli
from rmqstore import Message, MessageStore
from rmqstore.store.check.check import check_store
from store_checks import small_config


@pytest.fixture(scope="module")
def spark():
    return local_spark("rmqstore-test-spark-deleted")


def _deleted_then_written_again(root) -> None:
    """TopicA: 30 messages (keys k0..k29), deleteTopic, 5 new ones (keys n0..n4, then k0 again); TopicB kept."""
    with MessageStore.open(root, small_config()) as s:
        for i in range(30):
            assert s.put_message(Message("TopicA", b"old-%d" % i, queue_id=0, properties={"KEYS": f"k{i}"})).ok
            assert s.put_message(Message("TopicB", b"b-%d" % i, queue_id=0)).ok
        assert s.wait_dispatched()
        assert s.delete_topic("TopicA") == [("TopicA", 0)]
        for i in range(5):
            assert s.put_message(Message("TopicA", b"new-%d" % i, queue_id=0,
                                         properties={"KEYS": f"n{i}" + (" k0" if i == 0 else "")})).ok
        assert s.wait_dispatched()
    (root.parent / "store.conf").write_text(small_config().to_properties())


def test_spark_rebuild_leaves_deleted_queues_out(spark, tmp_path):
    from rmqstore.spark import rebuild_spark
    root = tmp_path / "store"
    _deleted_then_written_again(root)
    got = rebuild_spark(root, small_config(), spark=spark)
    assert got["missing_units"] == 0, got
    with MessageStore.open(root, small_config()) as s:
        r = s.get_message("G", "TopicA", 0, 0, 32)
        assert [m.body for m in r.messages] == [b"new-%d" % i for i in range(5)]
        assert s.get_max_offset_in_queue("TopicA", 0) == 5
        assert s.get_max_offset_in_queue("TopicB", 0) == 30
    rep = check_store(root, small_config(), live=False)
    assert not rep.problems, [str(p) for p in rep.problems]


def test_spark_rebuild_leaves_accepted_damage_out_as_the_local_engine_does(spark, tmp_path):
    """A damaged record quarantined by check --repair (config/damagedRanges.json): the Spark rebuild skips
    the range, as the local engine does, instead of stopping there with every later unit missing."""
    from rmqstore.spark import rebuild_spark
    root = tmp_path / "store"
    with MessageStore.open(root, small_config()) as s:
        offs = [s.put_message(Message("TopicA", b"m%d" % i, queue_id=0)).append_result.wrote_offset
                for i in range(40)]
    f = root / "commitlog" / "00000000000000000000"
    data = bytearray(f.read_bytes())
    data[offs[10] + 4:offs[10] + 8] = b"\0\0\0\1"              # record 10's magic code
    f.write_bytes(bytes(data))
    (root.parent / "store.conf").write_text(small_config().to_properties())
    assert run_cli("check", "--repair", "-c", root.parent / "store.conf", root).returncode == 0
    assert (root / "config" / "damagedRanges.json").exists()
    got = rebuild_spark(root, small_config(), spark=spark)
    assert got["missing_units"] == 0, got
    with MessageStore.open(root, small_config()) as s:
        bodies, at = [], 0
        while at < 40:
            r = s.get_message("G", "TopicA", 0, at, 16)
            bodies += [m.body for m in r.messages]
            at = r.next_begin_offset
        assert bodies == [b"m%d" % i for i in range(40) if i != 10]     # offset 10 reads as removed


def test_spark_key_and_commitlog_reads_leave_a_deleted_generation_out(spark, tmp_path):
    """The `key` option answered two rows for one queue offset (the deleted record and the live one), and
    mode=commitlog returned the deleted records."""
    root = tmp_path / "store"
    _deleted_then_written_again(root)
    rows = load_store(spark, root, key="k0").select("topic", "queueOffset", "body").collect()
    assert [(r.topic, r.queueOffset, bytes(r.body)) for r in rows] == [("TopicA", 0, b"new-0")]
    assert load_store(spark, root, key="k7").count() == 0
    got = load_store(spark, root, mode="commitlog", topics="TopicA").select("body").collect()
    assert sorted(bytes(r.body) for r in got) == [b"new-%d" % i for i in range(5)]
    assert load_store(spark, root, mode="commitlog").count() == 35
