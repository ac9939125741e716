"""StoreConfig: RocketMQ's names (both spellings), defaults, warnings and errors."""
from __future__ import annotations

import dataclasses

import pytest

from rmqstore.store.conf.config import StoreConfig
from rmqstore.errors import ConfigError


def test_defaults_are_rocketmqs():
    c = StoreConfig()
    assert c.mapped_file_size_commit_log == 1 << 30
    assert c.mapped_file_size_consume_queue == 300000 * 20
    assert (c.max_hash_slot_num, c.max_index_num) == (5000000, 20000000)
    assert c.max_message_size == 4 << 20 and c.flush_disk_type == "ASYNC_FLUSH"
    assert c.delay_levels_ms()[:4] == [1000, 5000, 10000, 30000] and len(c.delay_levels_ms()) == 18


def test_both_spellings_and_acronyms(tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text("# comment\nmapedFileSizeCommitLog=262144\nmappedFileSizeConsumeQueue = 20000\n"
                    "checkCRCOnRecover=false\nbrokerIP1=10.0.0.7\nflushDiskType=SYNC_FLUSH\n")
    c = StoreConfig.load(conf)
    assert c.mapped_file_size_commit_log == 262144 and c.mapped_file_size_consume_queue == 20000
    assert c.check_crc_on_recover is False and c.broker_ip1 == "10.0.0.7" and c.flush_disk_type == "SYNC_FLUSH"


def test_every_field_round_trips_through_its_rocketmq_name():
    for f in dataclasses.fields(StoreConfig):
        if f.name != "extra":
            assert StoreConfig.attr_name(StoreConfig.java_name(f.name)) == f.name


@pytest.mark.parametrize("line,key", [("mapedFileSizeCommitLog=big", "mapedFileSizeCommitLog"),
                                      ("flushDiskType=SOMETIMES", "flushDiskType"),
                                      ("messageIndexEnable=maybe", "messageIndexEnable"),
                                      ("mappedFileSizeConsumeQueue=21", "mappedFileSizeConsumeQueue")])
def test_bad_values_name_the_key_and_file(tmp_path, line, key):
    conf = tmp_path / "b.conf"
    conf.write_text(line + "\n")
    with pytest.raises(ConfigError) as e:
        StoreConfig.load(conf)
    assert key in str(e.value) and str(conf) in str(e.value)
