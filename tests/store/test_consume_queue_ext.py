"""The consume queue extension (store/consumequeue/consume_queue_ext.py) against the files RocketMQ 4.4.0 wrote (recorded in
tests/data/sql92/rocketmq440-ext-queue0.json): the same units laid out byte for byte, RocketMQ's files read
back, the same filter bit maps computed; then a store writing it, pulls skipping what the bit map rules
out, reopening, and the delay queue reading its delivery times through it."""
from __future__ import annotations

import base64
import json
import time

import pytest

from rmqstore import Message, MessageStore, StoreConfig
from rmqstore.filter.consumer_filter import ConsumerFilterManager, ExpressionMessageFilter
from rmqstore.messaging.consumer import SubscriptionData
from rmqstore.store.format import codec
from rmqstore.store.consumequeue.consume_queue_ext import EXT_DIR, ConsumeQueueExt, CqExtUnit, is_ext_addr
from sql92_cases import DATA, sqltool_all_props

REC = json.loads((DATA / "rocketmq440-ext-queue0.json").read_text())
TOPIC = REC["topic"]


def _units() -> list[CqExtUnit]:
    return [CqExtUnit(u["tagsCode"], u["storeTime"], bytes.fromhex(u["bitMap"]) if u["bitMap"] else None)
            for u in REC["units"]]


def test_units_are_laid_out_as_rocketmq_lays_them_out(tmp_path):
    ext = ConsumeQueueExt(tmp_path, TOPIC, 0, REC["mappedFileSizeConsumeQueueExt"])
    addrs = []
    for k in range(0, len(REC["units"]), 7):          # several puts, as the dispatcher makes them
        addrs += ext.put(_units()[k:k + 7])
    ext.flush()
    assert addrs == [u["addr"] for u in REC["units"]]
    files = {mf.path.name: mf.path.read_bytes() for mf in ext.queue.files}
    assert files == {n: base64.b64decode(b) for n, b in REC["extFiles"].items()}      # end marks included
    assert len(files) == 3
    ext.shutdown()


def _rocketmq_files(root) -> None:
    d = root / EXT_DIR / TOPIC / "0"
    d.mkdir(parents=True)
    for n, b in REC["extFiles"].items():
        (d / n).write_bytes(base64.b64decode(b))


def test_rocketmq_files_are_read_and_appended_to(tmp_path):
    _rocketmq_files(tmp_path)
    ext = ConsumeQueueExt(tmp_path, TOPIC, 0, REC["mappedFileSizeConsumeQueueExt"])
    ext.load_and_recover()
    for u, want in zip(REC["units"], _units()):
        assert is_ext_addr(u["addr"]) and ext.get(u["addr"]) == want
    last = REC["units"][-1]["addr"]
    nxt = ext.put([CqExtUnit(7, 8, b"\x01" * 14)])[0]
    assert nxt == last + 34                      # appended right after RocketMQ's last unit
    assert ext.get(nxt) == CqExtUnit(7, 8, b"\x01" * 14) and ext.get(last) == _units()[-1]
    assert ext.get(123) is None and ext.get(nxt + 34) is None
    ext.shutdown()


def test_bit_maps_are_rocketmq_ones():
    filters = ConsumerFilterManager(20, 32)
    for group, g in REC["groups"].items():
        assert filters.register(TOPIC, group, g["expression"], "SQL92", 1)
        assert list(filters.get(TOPIC, group).bloom.bit_pos) == g["bitPos"]
    props = [sqltool_all_props(u["i"]) for u in REC["units"]]
    maps = filters.bit_maps(TOPIC, props)
    assert [m.hex() for m in maps] == [u["bitMap"] for u in REC["units"]]
    assert len({u["bitMap"] for u in REC["units"]}) > 30          # bit maps that differ: a real check


CONF = dict(enable_consume_queue_ext=True, mapped_file_size_consume_queue_ext=4096,
            mapped_file_size_commit_log=1 << 20, message_delay_level="1s 2s")


class CountingFilter(ExpressionMessageFilter):
    """The broker's filter, counting the messages it had to read."""
    __slots__ = ("read",)

    def is_matched_by_commit_log(self, msg) -> bool:
        self.read = getattr(self, "read", 0) + 1
        return super().is_matched_by_commit_log(msg)


def _pull_all(store, flt, qid=0) -> list[int]:
    out, off = [], 0
    while True:
        r = store.get_message("g", "T", qid, off, 32, flt)
        out += [int(m.body) for m in r.messages]
        if r.next_begin_offset >= r.max_offset or r.next_begin_offset <= off:
            return out
        off = r.next_begin_offset


def test_pulls_skip_what_the_bit_map_rules_out(tmp_path):
    store = MessageStore.open(tmp_path / "s", StoreConfig(**CONF))
    filters = ConsumerFilterManager()
    store.consume_queue_ext.bit_map_calculator = filters.bit_maps
    assert filters.register("T", "g", "a BETWEEN 1 AND 2", "SQL92", 1)
    time.sleep(0.002)                               # messages stored after the group registered
    store.put_messages([Message("T", b"%d" % i, properties={"a": str(i % 100), "TAGS": f"T{i % 3}"})
                        for i in range(1000)])
    assert store.dispatcher.wait_dispatched()
    data = filters.get("T", "g")
    flt = CountingFilter(data.compiled, data, filters.bloom)
    assert _pull_all(store, flt) == [i for i in range(1000) if i % 100 in (1, 2)]
    assert flt.read < 100                           # 20 matches + bloom false positives, not 1000 reads
    plain = CountingFilter(data.compiled)           # no bit map: every message read
    assert _pull_all(store, plain) == [i for i in range(1000) if i % 100 in (1, 2)] and plain.read == 1000
    tags = SubscriptionData.build("T", "T1")        # tag filtering through the ext units' tags codes
    assert _pull_all(store, tags) == [i for i in range(1000) if i % 3 == 1]
    store.close()
    # reopened without the option: plain units follow the ext ones; a unit the bit map ruled out does not
    # rule out the plain units after it
    store = MessageStore.open(tmp_path / "s", StoreConfig(mapped_file_size_commit_log=1 << 20,
                                                          mapped_file_size_consume_queue_ext=4096))
    store.put_messages([Message("T", b"%d" % i, properties={"a": "1"}) for i in range(1000, 1004)])
    assert store.dispatcher.wait_dispatched()
    assert _pull_all(store, ExpressionMessageFilter(data.compiled, data, filters.bloom)) == \
        [i for i in range(1000) if i % 100 in (1, 2)] + [1000, 1001, 1002, 1003]
    store.close()


def test_reopened_store_goes_on_and_reads_without_the_option(tmp_path):
    path = tmp_path / "s"
    store = MessageStore.open(path, StoreConfig(**CONF))
    store.put_messages([Message("T", b"%d" % i, properties={"TAGS": f"T{i % 2}"}) for i in range(300)])
    store.close()
    store = MessageStore.open(path, StoreConfig(**CONF))
    store.put_messages([Message("T", b"%d" % i, properties={"TAGS": f"T{i % 2}"}) for i in range(300, 400)])
    assert store.dispatcher.wait_dispatched()
    units = [store.consume_queues.find("T", 0).get_unit(q)[2] for q in range(400)]
    assert all(map(is_ext_addr, units)) and sorted(set(units)) == units      # one unit each, in order
    store.close()
    store = MessageStore.open(path, StoreConfig(mapped_file_size_commit_log=1 << 20,
                                                mapped_file_size_consume_queue_ext=4096))
    assert _pull_all(store, SubscriptionData.build("T", "T1")) == list(range(1, 400, 2))
    store.put_message(Message("T", b"400", properties={"TAGS": "T0"}))      # without the option: plain codes
    assert store.dispatcher.wait_dispatched()
    assert store.consume_queues.find("T", 0).get_unit(400)[2] == codec.tags_code("T0")
    store.close()


def test_delay_queue_reads_delivery_times_through_the_extension(tmp_path):
    store = MessageStore.open(tmp_path / "s", StoreConfig(**CONF))
    t0 = int(time.time() * 1000)
    store.put_message(Message("D", b"late", properties={"DELAY": "2"}))
    assert store.dispatcher.wait_dispatched()
    cq = store.consume_queues.find(codec.SCHEDULE_TOPIC, 1)
    addr = cq.get_unit(0)[2]
    assert is_ext_addr(addr)
    assert store.consume_queue_ext.unit(codec.SCHEDULE_TOPIC, 1, addr).tags_code >= t0 + 2000
    deadline = time.monotonic() + 30
    while store.get_max_offset_in_queue("D", 0) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert store.get_max_offset_in_queue("D", 0) == 1 and int(time.time() * 1000) >= t0 + 2000
    store.close()


@pytest.mark.parametrize("raw", [b"", b"\x00\x05", b"\x00\x14" + b"\x00" * 16 + b"\x00\x02", b"\xff\xff"])
def test_bad_units_decode_to_none(raw):
    assert CqExtUnit.decode(raw) is None


def test_bench_step_measures_the_three_ways(tmp_path):
    """`make bench`'s sql92 step at the tiny scale: its rows are there (structure, not speed)."""
    from rmqstore.tools.benchsuite import Suite
    suite = Suite("tiny", tmp_path)
    try:
        t = suite.sql92()
    finally:
        for s in suite.state.pop("stores", []):
            s.close()
    assert [r.system.split(",")[0].split(" (")[0] for r in t.rows] == [
        "rmqstore SQL92 selector", "rmqstore SQL92 selector", "rmqstore tag filter", "rmqstore tag filter",
        "rmqstore put + dispatch", "rmqstore put + dispatch"]
    assert all(r.value and r.value > 0 for r in t.rows) and "20 delivered" in t.rows[0].text
