"""Config files cannot hurt the store (issue 15, defect 10).

config/topics.json, consumerOffset.json and delayOffset.json are read as RocketMQ's ConfigManager reads
them: the file, else its `.bak` when the file is unreadable or malformed (with a warning naming it); when
both are unusable, a CorruptStoreError naming the file and saying how to repair it; never a raw
AttributeError / ValueError / UnicodeDecodeError. Every write is atomic and keeps the previous good
content as `.bak`. A directory where `abort`, `lock`, `checkpoint` or a config file belongs is a clear
error naming the path, not IsADirectoryError.
"""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from rmqstore.store.conf.config import StoreConfig
from rmqstore.errors import CorruptStoreError
from rmqstore.messaging.local_broker import LocalBroker
from rmqstore.store.format.message import Message
from rmqstore.store.store import MessageStore

CFG = {"mappedFileSizeCommitLog": 1 << 20, "mapedFileSizeConsumeQueue": 6000}

GOOD = {
    "topics.json": {"dataVersion": {"counter": 7, "timestamp": 1700000000000},
                    "topicConfigTable": {"GoodTopic": {"order": False, "perm": 6, "readQueueNums": 3,
                                                       "topicFilterType": "SINGLE_TAG", "topicName": "GoodTopic",
                                                       "topicSysFlag": 0, "writeQueueNums": 3}}},
    "consumerOffset.json": {"offsetTable": {"GoodTopic@g1": {"0": 5, "1": 9}}},
    "delayOffset.json": {"offsetTable": {"1": 11, "3": 4}},
}

BAD = {   # what the tester found, and more of each kind
    "topics.json": {
        "table-is-a-list": b'{"topicConfigTable": [{"topicName": "X"}]}',
        "entry-is-a-number": b'{"topicConfigTable": {"X": 5}}',
        "queue-nums-not-a-number": b'{"topicConfigTable": {"X": {"readQueueNums": "many"}}}',
        "not-json": b'{"topicConfigTable": {',
        "not-utf8": b'{"topicConfigTable": {"\xff\xfe": {}}}',
        "top-level-list": b'[1, 2, 3]',
    },
    "consumerOffset.json": {
        "offset-not-a-number": b'{"offsetTable": {"T@g": {"0": "twelve"}}}',
        "queue-id-not-a-number": b'{"offsetTable": {"T@g": {"zero": 12}}}',
        "table-is-a-list": b'{"offsetTable": [1, 2]}',
        "not-json": b'{"offsetTable": {"T@g": {0:',
        "not-utf8": b'{"offsetTable": {"T@g": {"0": 1}}}\xc3\x28',
    },
    "delayOffset.json": {
        "offset-not-a-number": b'{"offsetTable": {"1": "x"}}',
        "offset-is-null": b'{"offsetTable": {"1": null}}',
        "level-not-a-number": b'{"offsetTable": {"one": 3}}',
        "not-utf8": b'\xff\xfe{\x00"\x00',
        "not-json": b"garbage",
    },
}

CASES = [(name, kind) for name, kinds in BAD.items() for kind in kinds]


def _config_dir(store: Path) -> Path:
    d = store / "config"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _new_store(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    with MessageStore.open(store, StoreConfig.from_dict(CFG)) as s:
        s.put_message(Message("GoodTopic", b"x", queue_id=0))
    return store


def _open_and_read(store: Path) -> dict:
    """Open the store and its broker services (every config file is read), return what they loaded."""
    with MessageStore.open(store, StoreConfig.from_dict(CFG)) as s:
        b = LocalBroker.of(s)
        tc = b.topics.select("GoodTopic")
        return {"topics.json": None if tc is None else (tc.read_queue_nums, b.topics.data_version["counter"]),
                "consumerOffset.json": b.offsets.query_offsets("g1", "GoodTopic"),
                "delayOffset.json": dict(s.schedule_service.offset_table)}


EXPECTED = {"topics.json": (3, 7), "consumerOffset.json": {0: 5, 1: 9}, "delayOffset.json": {1: 11, 3: 4}}


@pytest.mark.parametrize("name,kind", CASES)
def test_malformed_config_file_falls_back_to_its_bak(tmp_path, caplog, name, kind):
    store = _new_store(tmp_path)
    d = _config_dir(store)
    (d / (name + ".bak")).write_text(json.dumps(GOOD[name]))
    (d / name).write_bytes(BAD[name][kind])
    with caplog.at_level(logging.WARNING):
        got = _open_and_read(store)
    assert got[name] == EXPECTED[name]
    warned = [r.getMessage() for r in caplog.records if name in r.getMessage() and ".bak" in r.getMessage()]
    assert warned, [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("name,kind", CASES)
def test_malformed_config_file_without_bak_names_the_file(tmp_path, name, kind):
    store = _new_store(tmp_path)
    d = _config_dir(store)
    (d / name).write_bytes(BAD[name][kind])
    for bak in d.glob("*.bak"):
        bak.unlink()
    with pytest.raises(CorruptStoreError) as ei:
        _open_and_read(store)
    assert Path(ei.value.path) == d / name
    assert "restore" in str(ei.value) and "remove" in str(ei.value)
    assert not (store / "lock").exists() or _lock_is_free(store)


def _lock_is_free(store: Path) -> bool:
    """The failed open released the store: it opens again once the bad file is moved away."""
    bad = next((store / "config").glob("*.json"))
    bad.rename(bad.with_name(bad.name + ".moved"))
    with MessageStore.open(store, StoreConfig.from_dict(CFG)):
        pass
    return True


@pytest.mark.parametrize("name,kind", [("topics.json", "table-is-a-list"), ("delayOffset.json", "not-utf8")])
def test_bad_bak_and_missing_file_names_the_bak(tmp_path, name, kind):
    store = _new_store(tmp_path)
    d = _config_dir(store)
    (d / name).unlink(missing_ok=True)
    (d / (name + ".bak")).write_bytes(BAD[name][kind])
    with pytest.raises(CorruptStoreError) as ei:
        _open_and_read(store)
    assert Path(ei.value.path) == d / (name + ".bak")


def test_empty_file_and_no_bak_means_defaults(tmp_path):
    """ConfigManager.load: an empty file (a crash before its first write) reads the backup, and with no
    backup the defaults, as RocketMQ does."""
    store = _new_store(tmp_path)
    d = _config_dir(store)
    for name in GOOD:
        (d / name).write_bytes(b"")
        (d / (name + ".bak")).unlink(missing_ok=True)
    got = _open_and_read(store)
    assert got["consumerOffset.json"] == {} and got["delayOffset.json"] == {}


# --- writing -----------------------------------------------------------------------------------------------
def test_writes_keep_the_previous_good_content_as_bak(tmp_path):
    from rmqstore.store.conf.config_file import load_config_file, string_to_file
    from rmqstore.store.conf.config_tables import decode_offsets

    p = tmp_path / "config" / "consumerOffset.json"

    string_to_file(json.dumps({"offsetTable": {"T@g": {"0": 1}}}), p, decode_offsets)
    assert not p.with_name(p.name + ".bak").exists()
    string_to_file(json.dumps({"offsetTable": {"T@g": {"0": 2}}}), p, decode_offsets)
    assert json.loads(p.with_name(p.name + ".bak").read_text())["offsetTable"]["T@g"]["0"] == 1
    assert not p.with_name(p.name + ".tmp").exists()
    # a corrupt file (the one a load fell back from) never replaces the good backup
    p.write_bytes(b'{"offsetTable": [')
    string_to_file(json.dumps({"offsetTable": {"T@g": {"0": 3}}}), p, decode_offsets)
    assert json.loads(p.with_name(p.name + ".bak").read_text())["offsetTable"]["T@g"]["0"] == 1
    assert load_config_file(p, decode_offsets) == {"T@g": {0: 3}}


def test_store_persists_offsets_with_a_bak_that_loads(tmp_path):
    store = _new_store(tmp_path)
    for i in (1, 2):
        with MessageStore.open(store, StoreConfig.from_dict(CFG)) as s:
            LocalBroker.of(s).offsets.commit_offset("g1", "GoodTopic", 0, i)
    d = store / "config"
    assert json.loads((d / "consumerOffset.json").read_text())["offsetTable"]["GoodTopic@g1"]["0"] == 2
    assert json.loads((d / "consumerOffset.json.bak").read_text())["offsetTable"]["GoodTopic@g1"]["0"] == 1
    (d / "consumerOffset.json").write_bytes(b"\x00" * 64)       # zeroed by a crash of the filesystem
    with MessageStore.open(store, StoreConfig.from_dict(CFG)) as s:
        assert LocalBroker.of(s).offsets.query_offset("g1", "GoodTopic", 0) == 1


# --- directories where files belong --------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["abort", "lock", "checkpoint", "config/topics.json", "config/consumerOffset.json",
                                  "config/delayOffset.json"])
def test_directory_where_a_file_belongs_is_a_clear_error(tmp_path, name):
    store = _new_store(tmp_path)
    target = store / name
    if target.exists():
        target.unlink()
    target.mkdir(parents=True)
    (target / "x").write_text("something")
    with pytest.raises(CorruptStoreError) as ei:
        _open_and_read(store)
    assert Path(ei.value.path) == target
    assert "directory" in str(ei.value)
    assert (target / "x").read_text() == "something"      # nothing of it was removed
    shutil.rmtree(target)
    assert _open_and_read(store)["topics.json"] is None or True    # the store opens again


# --- the other JSON files the broker reads ------------------------------------------------------------------
def test_transaction_state_and_subscription_groups_fall_back_or_name_the_file(tmp_path):
    from rmqstore.broker.state import SubscriptionGroupManager

    store = _new_store(tmp_path)
    d = _config_dir(store)
    (d / "transactionCheck.json").write_bytes(b'{"scanOffset": "far", "halfTable": []}')
    with MessageStore.open(store, StoreConfig.from_dict(CFG)) as s:
        with pytest.raises(CorruptStoreError) as ei:
            LocalBroker.of(s).transactions
        assert Path(ei.value.path) == d / "transactionCheck.json"
    (d / "transactionCheck.json.bak").write_text(json.dumps({"scanOffset": 0, "halfTable": {}, "discarded": [7]}))
    with MessageStore.open(store, StoreConfig.from_dict(CFG)) as s:
        assert LocalBroker.of(s).transactions.discarded == {7}

    (d / "subscriptionGroup.json").write_bytes(b'{"subscriptionGroupTable": [1, 2]}')
    with pytest.raises(CorruptStoreError) as ei:
        SubscriptionGroupManager(store).load()
    assert Path(ei.value.path) == d / "subscriptionGroup.json"
    (d / "subscriptionGroup.json.bak").write_text(json.dumps(
        {"subscriptionGroupTable": {"g1": {"groupName": "g1", "retryMaxTimes": 3}}}))
    groups = SubscriptionGroupManager(store, auto_create=False)
    groups.load()
    assert groups.find("g1").retry_max_times == 3
    groups.persist()                         # the corrupt file is replaced, the good backup kept
    assert json.loads((d / "subscriptionGroup.json.bak").read_text())["subscriptionGroupTable"]["g1"]
    assert json.loads((d / "subscriptionGroup.json").read_text())["subscriptionGroupTable"]["g1"]
