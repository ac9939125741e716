"""RocketMQ 5's timer file layouts (store/timer/timer_codec.py, timer_wheel.py, timer_log.py, timer_checkpoint.py):
constants as in RocketMQ 5's Slot / TimerLog / TimerWheel / TimerCheckpoint, byte round trips, and the files
a store with a parked timer message has where RocketMQ 5 puts them."""
from __future__ import annotations

import struct
import time

import pytest

from rmqstore import Message, MessageStore
from rmqstore.errors import CorruptStoreError
from rmqstore.store.timer.timer import TIMER_TOPIC, timer_out_ms
from rmqstore.store.timer.timer_checkpoint import TimerCheckpointFile, read_timer_checkpoint
from rmqstore.store.timer.timer_codec import (BLANK_MAGIC_CODE, CHECKPOINT_FILE_SIZE, EMPTY_SLOT, MAGIC_DEFAULT,
                                        MAGIC_ROLL, MIN_BLANK_LEN, SLOT_SIZE, SLOTS_TOTAL, UNIT_PRE_SIZE_FOR_MSG,
                                        UNIT_SIZE, Slot, TimerCheckpoint, TimerLogUnit, decode_checkpoint,
                                        decode_slot, decode_unit, encode_checkpoint, encode_slot, encode_unit,
                                        is_magic_ok, java_string_hash, offset_for_last_unit, slot_index,
                                        wheel_file_size)
from rmqstore.store.timer.timer_log import TimerLog
from rmqstore.store.timer.timer_wheel import TimerWheel


def java_int(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def test_constants_are_rocketmq_5s():
    assert SLOT_SIZE == 32 and UNIT_SIZE == 4 + 8 + 4 + 8 + 4 + 8 + 4 + 4 + 8 == 52
    assert MIN_BLANK_LEN == 16 and UNIT_PRE_SIZE_FOR_MSG == 28
    assert SLOTS_TOTAL == 7 * 24 * 3600
    assert wheel_file_size() == SLOTS_TOTAL * 2 * 32 == 38_707_200
    # TimerLog.BLANK_MAGIC_CODE = 0xBBCCDDEE ^ 1880681586 + 8 (Java: + before ^, int arithmetic)
    assert BLANK_MAGIC_CODE == java_int(0xBBCCDDEE ^ 1880681594)
    assert is_magic_ok(MAGIC_DEFAULT | MAGIC_ROLL) and not is_magic_ok(BLANK_MAGIC_CODE)
    # String.hashCode of known strings (Java: "hello".hashCode() == 99162322)
    assert java_string_hash("hello") == 99162322 and java_string_hash("") == 0 and java_string_hash(None) == 0
    assert java_string_hash("é") == 233 and java_string_hash("TopicTest") == java_int(
        sum(ord(c) * 31 ** (len("TopicTest") - 1 - i) for i, c in enumerate("TopicTest")))


def test_slot_unit_checkpoint_round_trip_and_byte_places():
    s = Slot(1_700_000_000_000, 52, 104, 2, 0)
    raw = encode_slot(s, 1000)
    assert len(raw) == 32 and struct.unpack(">qqqii", raw) == (1_700_000_000, 52, 104, 2, 0)
    assert decode_slot(raw, 0, 1000) == s
    assert slot_index(1_700_000_000_500, 1000) == 1_700_000_000 % (2 * SLOTS_TOTAL)

    u = TimerLogUnit(prev_pos=-1, magic=MAGIC_DEFAULT | MAGIC_ROLL, curr_write_time_ms=1_700_000_000_000,
                     delayed_delta=172_800_000, offset_py=123_456_789_012, size_py=321,
                     topic_hash=java_string_hash("T"))
    raw = encode_unit(u)
    assert len(raw) == 52
    assert struct.unpack_from(">i", raw, 0)[0] == 52 and struct.unpack_from(">q", raw, 4)[0] == -1
    assert struct.unpack_from(">q", raw, UNIT_PRE_SIZE_FOR_MSG)[0] == 123_456_789_012
    assert struct.unpack_from(">i", raw, 36)[0] == 321 and raw[44:] == bytes(8)
    assert decode_unit(raw) == u and u.delayed_time_ms == 1_700_000_000_000 + 172_800_000 and u.is_roll

    cp = TimerCheckpoint(1_700_000_001_000, 5200, 17, 17, 0, 1_700_000_002_000, 9)
    raw = encode_checkpoint(cp)
    assert len(raw) == 56 and decode_checkpoint(raw + bytes(4040)) == cp
    # a checkpoint of RocketMQ before DataVersion: four longs
    assert decode_checkpoint(raw[:32]) == TimerCheckpoint(1_700_000_001_000, 5200, 17, 17)
    with pytest.raises(ValueError, match="32"):
        decode_checkpoint(raw[:20])


def test_timer_rounding_is_hookutils():
    assert timer_out_ms(1_700_000_000_500, 1000) == 1_700_000_000_000
    assert timer_out_ms(1_700_000_001_000, 1000) == 1_700_000_000_000     # a multiple: one precision earlier


def test_wheel_slots_laps_and_next_used_slot(tmp_path):
    w = TimerWheel(tmp_path / "timerwheel", 1000)
    try:
        t = 1_700_000_000_000
        assert w.get_slot(t) == EMPTY_SLOT
        w.put_slot(t + 300, 0, 52, 2, 0)
        assert w.get_slot(t) == Slot(t, 0, 52, 2, 0)
        lap = t + 2 * SLOTS_TOTAL * 1000          # the same slot, one lap later: not this lap's
        assert w.get_slot(lap) == EMPTY_SLOT and w.get_raw_slot(lap).time_ms == t
        assert w.next_slot_time(t - 5000, t + 5000) == t
        assert w.next_slot_time(t + 1000, t + 5000) is None
        assert w.all_num(t - 10_000) == 2
        # lastPos at or past the timerlog's end: the wheel points beyond it
        assert w.check_phy_pos(t - 10_000, 52) == 0 and w.check_phy_pos(t - 10_000, 53) == 2 ** 63 - 1
        w.revise_slot(t, -2, 104, True)
        assert w.get_slot(t) == Slot(t, 0, 104, 2, 0)
        w.put_slot(t + 1000, 156, 156, 1, 0)
        assert w.drop_beyond(t - 10_000, 150) == 1 and w.get_slot(t + 1000) == EMPTY_SLOT
        assert w.get_slot(t) == Slot(t, 0, 104, 2, 0)
    finally:
        w.shutdown()
    assert (tmp_path / "timerwheel").stat().st_size == 38_707_200
    (tmp_path / "bad").write_bytes(bytes(64))
    with pytest.raises(CorruptStoreError, match="bad.*timer wheel length 64"):
        TimerWheel(tmp_path / "bad", 1000)


def unit(prev: int, i: int) -> bytes:
    return encode_unit(TimerLogUnit(prev, MAGIC_DEFAULT, 1000, 2000, i * 100, 90, 7))


def test_timer_log_rolls_with_a_blank_and_recovers_its_end(tmp_path):
    size = 2 * UNIT_SIZE + MIN_BLANK_LEN + 10        # two units and a blank per file
    log = TimerLog(tmp_path / "timerlog", size)
    log.load()
    pos = [log.append(unit(-1, i)) for i in range(5)]
    assert pos == [0, 52, size, size + 52, 2 * size]
    first = (tmp_path / "timerlog" / "00000000000000000000").read_bytes()
    assert struct.unpack_from(">iqi", first, 104) == (size - 104, 0, BLANK_MAGIC_CODE)
    assert log.read_unit(size + 52).offset_py == 300 and log.read_unit(10_000) is None
    log.shutdown()
    # a torn unit after the last whole one: recovery stops there and cuts the log
    last = tmp_path / "timerlog" / f"{2 * size:020d}"
    data = bytearray(last.read_bytes())
    data[52:68] = unit(-1, 9)[:16]      # size, prevPos and magic made it to disk, the rest did not
    last.write_bytes(bytes(data))
    log = TimerLog(tmp_path / "timerlog", size)
    log.load()
    seen = []
    end = log.recover(0, lambda ps, us: seen.extend(zip(ps.tolist(), us["offset_py"].tolist())))
    assert end == 2 * size + 52
    assert seen == [(0, 0), (52, 100), (size, 200), (size + 52, 300), (2 * size, 400)]
    assert log.append(unit(-1, 5)) == 2 * size + 52
    log.shutdown()


def test_timer_log_files_of_removed_messages_are_deleted(tmp_path):
    size = 2 * UNIT_SIZE + MIN_BLANK_LEN + 10
    assert offset_for_last_unit(size) == 52 and offset_for_last_unit(100 * 1024 * 1024) == 2016491 * 52
    log = TimerLog(tmp_path / "timerlog", size)
    log.load()
    for i in range(7):                      # files 0..3 of two units; last units' offsetPy 100, 300, 500
        log.append(unit(-1, i))
    assert log.delete_expired(0) == 0 and log.delete_expired(301) == 2      # below 301: files 0 and 1
    assert [mf.file_from_offset for mf in log.queue.files] == [2 * size, 3 * size]
    assert log.delete_expired(10_000) == 1                  # never the last file
    assert log.read_unit(3 * size).offset_py == 600
    log.shutdown()


def test_checkpoint_file_is_a_page(tmp_path):
    f = TimerCheckpointFile(tmp_path / "config" / "timercheck")
    f.flush(TimerCheckpoint(5, 6, 7, 8))
    f.shutdown()
    assert (tmp_path / "config" / "timercheck").stat().st_size == CHECKPOINT_FILE_SIZE
    assert read_timer_checkpoint(tmp_path / "config" / "timercheck") == TimerCheckpoint(5, 6, 7, 8)
    assert read_timer_checkpoint(tmp_path / "none") is None


def test_a_parked_message_is_in_rocketmq_5s_files(tmp_path):
    root = tmp_path / "s"
    with MessageStore.open(root) as store:
        due = int(time.time() * 1000) + 60_000
        assert store.put_message(Message("RealTopic", b"later", properties={"TIMER_DELIVER_MS": str(due)})).ok
        assert store.wait_dispatched(10)
        parked = store.get_message("g", TIMER_TOPIC, 0, 0, 1).messages[0]
        assert parked.properties["TIMER_OUT_MS"] == str(timer_out_ms(due, 1000))
        end = time.monotonic() + 20
        while store.service("timer").curr_queue_offset < 1 and time.monotonic() < end:
            time.sleep(0.05)
    assert (root / "timerwheel").stat().st_size == 38_707_200
    assert (root / "timerlog" / "00000000000000000000").stat().st_size == 100 * 1024 * 1024
    cp = read_timer_checkpoint(root / "config" / "timercheck")
    assert cp.last_timer_queue_offset == 1 and cp.last_timer_log_flush_pos == 52
    u = decode_unit((root / "timerlog" / "00000000000000000000").read_bytes()[:52])
    assert (u.offset_py, u.size_py, u.prev_pos) == (parked.commit_log_offset, parked.store_size, -1)
    assert u.delayed_time_ms == timer_out_ms(due, 1000) and u.topic_hash == java_string_hash("RealTopic")
    w = TimerWheel(root / "timerwheel", 1000)
    try:
        assert w.get_slot(u.delayed_time_ms) == Slot(u.delayed_time_ms, 0, 0, 1, 0)
    finally:
        w.shutdown()


def test_timer_config_keys_are_rocketmq_5s():
    from rmqstore import StoreConfig
    from rmqstore.errors import ConfigError
    c = StoreConfig.from_dict({"timerPrecisionMs": "100", "timerMaxDelaySec": "60", "timerRollWindowSlot": "30",
                               "mappedFileSizeTimerLog": "5200"})
    assert (c.timer_precision_ms, c.timer_max_delay_sec, c.timer_roll_window_slot,
            c.mapped_file_size_timer_log) == (100, 60, 30, 5200)
    d = StoreConfig()
    assert (d.timer_precision_ms, d.timer_max_delay_sec, d.timer_roll_window_slot,
            d.mapped_file_size_timer_log) == (1000, 3 * 86400, 2 * 86400, 100 * 1024 * 1024)
    with pytest.raises(ConfigError, match="timerPrecisionMs"):
        StoreConfig.from_dict({"timerPrecisionMs": "0"})
