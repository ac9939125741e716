"""ConsumeQueue on its own: cutting units past a commitlog end when the queue's last file is empty (the
power-loss model found a queue whose empty last file stopped the cut, leaving a unit past the end that
then swallowed the next put's unit: PUT_OK, read back as OFFSET_OVERFLOW_ONE)."""
from __future__ import annotations

from rmqstore.store.consumequeue.consume_queue import UNIT, ConsumeQueue


def _queue(tmp_path, units: int, file_units: int = 10) -> ConsumeQueue:
    cq = ConsumeQueue("T", 0, tmp_path / "consumequeue", file_units * UNIT)
    cq.load()
    cq.put_units([(1000 + 100 * i, 100, 0, i) for i in range(units)])
    return cq


def test_cut_past_the_end_skips_an_empty_last_file(tmp_path):
    cq = _queue(tmp_path, 30)                       # three full files ...
    cq.queue.get_last_mapped_file(30 * UNIT)        # ... and an empty fourth, as a crash leaves it
    assert len(cq.queue.files) == 4 and cq.queue.files[-1].wrote_position == 0
    cq.truncate_dirty_logic_files(1000 + 100 * 17)  # the commitlog now ends where unit 17 started
    assert cq.get_max_offset_in_queue() == 17
    assert cq.get_unit(16) == (1000 + 100 * 16, 100, 0)
    assert cq.max_physic_offset == 1000 + 100 * 17
    # the next unit goes where it belongs
    cq.put_units([(1000 + 100 * 17, 50, 0, 17)])
    assert cq.get_unit(17) == (1000 + 100 * 17, 50, 0)
    cq.shutdown()


def test_cut_keeps_everything_below_the_end(tmp_path):
    cq = _queue(tmp_path, 25)
    cq.truncate_dirty_logic_files(10 ** 9)
    assert cq.get_max_offset_in_queue() == 25
    cq.truncate_dirty_logic_files(1000)             # every unit's message is past the end
    assert cq.get_max_offset_in_queue() == 0
    cq.shutdown()


def test_fill_queue_is_bounded_by_what_was_lost(tmp_path):
    """Filler units stand for messages lost in a skipped range; a jump larger than the lost bytes can hold is
    a damaged QUEUEOFFSET field, not lost messages: nothing is filled (the fuzzer's flipped bit asked for
    65,536 filler units and exhausted the open files)."""
    from rmqstore.store.consumequeue.dispatch import fill_queue
    cq = _queue(tmp_path, 12)
    assert fill_queue(cq, 100_000, bound=5) is False
    assert cq.get_max_offset_in_queue() == 12 and len(cq.queue.files) == 2
    assert fill_queue(cq, 15, bound=5) is True
    assert cq.get_max_offset_in_queue() == 15
    assert cq.get_unit(14)[1] == 0x7FFFFFFF             # a filler: reads as a removed message
    cq.put_units([(5000, 100, 0, 15)])
    assert cq.get_unit(15) == (5000, 100, 0)
    cq.shutdown()


def test_cut_removes_zero_units_and_trailing_fillers(tmp_path):
    """A power cut leaves zero units at a queue's end (and the power-loss model found units past the
    commitlog's end kept in front of them): the cut keeps real units below the end only."""
    from rmqstore.store.consumequeue.dispatch import FILLER_UNIT
    cq = _queue(tmp_path, 25)
    cq.queue.last.append(FILLER_UNIT * 5)          # units 25..29: fillers, the third file is full
    cq.queue.get_last_mapped_file(30 * UNIT).append(bytes(UNIT * 4))    # a fourth file of zero units
    assert cq.get_max_offset_in_queue() == 34
    cq.truncate_dirty_logic_files(1000 + 100 * 23)  # units 23, 24 point past the end
    assert cq.get_max_offset_in_queue() == 23
    assert cq.max_physic_offset == 1000 + 100 * 23
    cq.shutdown()


def _digest(d):
    import hashlib
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(d.iterdir())}


def test_cut_applies_a_planned_end(tmp_path):
    """ConsumeQueue.cut (recovery.apply_plan's part for a queue): later files go, the kept file is zeroed
    after the cut, positions and the planned offsets are taken; the next put lands right after."""
    cq = _queue(tmp_path, 25)                       # files of 10 units: 0..9, 10..19, 20..24
    cq.cut(2, 13 * UNIT, 1000 + 100 * 13, 2 * UNIT)
    assert len(cq.queue.files) == 2 and not (cq.queue.store_path / f"{20 * UNIT:020d}").exists()
    assert cq.get_max_offset_in_queue() == 13 and cq.get_min_offset_in_queue() == 2
    assert cq.max_physic_offset == 1000 + 100 * 13
    assert cq.queue.files[1].mm[3 * UNIT:10 * UNIT] == bytes(7 * UNIT)      # zeroed after the cut
    cq.put_units([(1000 + 100 * 13, 100, 0, 13)])
    assert cq.get_unit(13) == (1000 + 100 * 13, 100, 0)
    cq.shutdown()


def test_read_only_queue_cuts_and_appends_in_memory_only(tmp_path):
    """A read-only ConsumeQueue (what recovery plans with and the read-only view serves from) runs the same
    cut and put code, and its files do not change: bytes, sizes, mtimes, names."""
    cq = _queue(tmp_path, 25)
    cq.shutdown()
    d = cq.queue.store_path
    before = _digest(d)
    ro = ConsumeQueue("T", 0, tmp_path / "consumequeue", 10 * UNIT, read_only=True)
    ro.load()
    ro.recover(10 ** 9)
    assert ro.get_max_offset_in_queue() == 25
    ro.cut(2, 13 * UNIT, 1000 + 100 * 13, 0)
    assert ro.get_max_offset_in_queue() == 13 and ro.get_unit(12) == (1000 + 100 * 12, 100, 0)
    ro.put_units([(5000 + 10 * i, 10, 0, 13 + i) for i in range(20)])     # a new file, in memory
    assert ro.get_max_offset_in_queue() == 33 and ro.get_unit(32) == (5000 + 190, 10, 0)
    ro.shutdown()
    assert _digest(d) == before


def test_read_only_table_reads_a_short_only_file_as_extended(tmp_path):
    """A queue whose only file was cut mid-unit (#7355): the read-write table extends it, the read-only one
    reads it as extended and records the same repair, without touching it."""
    from rmqstore.store.consumequeue.consume_queue import ConsumeQueueTable
    root = tmp_path / "store"
    for q, n in ((0, 25), (1, 7)):
        cq = ConsumeQueue("T", q, root / "consumequeue", 10 * UNIT)
        cq.load()
        cq.put_units([(1000 + 100 * i, 100, 0, i) for i in range(n)])
        cq.shutdown()
    short = root / "consumequeue" / "T" / "1" / f"{0:020d}"
    with open(short, "r+b") as f:
        f.truncate(3 * UNIT + 7)
    before = _digest(short.parent)
    ro = ConsumeQueueTable(root, 10 * UNIT, read_only=True)
    ro.load()
    cq = ro.find("T", 1)
    assert cq.queue.repaired == [(str(short), 3 * UNIT + 7)]
    assert cq.recover(10 ** 9) == 1                 # the torn unit's bytes are dropped
    assert cq.get_max_offset_in_queue() == 3
    ro.shutdown()
    assert _digest(short.parent) == before
