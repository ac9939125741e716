"""Every broker.conf key is honoured, or refused naming it (an outside audit: `aclEnable=true` was accepted
without a word and nothing was enforced; an unsigned UPDATE_BROKER_CONFIG then deleted 6 of 7 commitlog
files). The registry is store/conf/config_keys.py; the list of docs/broker.md is checked against it."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import doc_section
from rmqstore import MessageStore, StoreConfig
from rmqstore.errors import ConfigError
from rmqstore.store.conf import config_keys as K

SRC = Path(__file__).resolve().parents[2] / "src" / "rmqstore"


def test_a_key_not_honoured_stops_serve_naming_it(tmp_path):
    """A broker.conf asking for what rmqstore does not have (useTLS=true: the listeners speak plain TCP):
    `rmqstore serve` refuses to start (exit 2, one line naming the file, the key and what is missing), before
    it opens the store or listens anywhere."""
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerClusterName=DefaultCluster\nbrokerName=broker-a\nuseTLS=true\nlistenPort=31011\n")
    r = subprocess.run([sys.executable, "-m", "rmqstore", "serve", "-c", str(conf), str(tmp_path / "store")],
                       capture_output=True, timeout=120)
    err = r.stderr.decode().strip().splitlines()
    assert r.returncode == 2 and len(err) == 1, r.stderr.decode()
    assert "useTLS" in err[0] and str(conf) in err[0] and "TLS is not implemented" in err[0], err
    assert not (tmp_path / "store").exists()
    conf.write_text("useTLS=false\n")                       # asks for what rmqstore does: accepted
    assert StoreConfig.load(conf).extra["useTLS"] == "false"


def test_the_keys_of_rocketmqs_own_broker_confs():
    """RocketMQ 4.4.0's distribution/conf/broker.conf loads, and so do its 2m-2s-sync pair's (replication,
    store/ha)."""
    cfg = StoreConfig.from_dict({"brokerClusterName": "DefaultCluster", "brokerName": "broker-a", "brokerId": "0",
                                 "deleteWhen": "04", "fileReservedTime": "48", "brokerRole": "ASYNC_MASTER",
                                 "flushDiskType": "ASYNC_FLUSH"})
    assert cfg.file_reserved_time == 48
    slave = StoreConfig.from_dict({"brokerName": "broker-a", "brokerId": "1", "brokerRole": "SLAVE",
                                   "flushDiskType": "ASYNC_FLUSH"})
    assert slave.is_slave and slave.broker_id == 1
    assert StoreConfig.from_dict({"brokerRole": "SYNC_MASTER"}).role.name == "SYNC_MASTER"
    with pytest.raises(ConfigError, match=r"brokerId"):
        StoreConfig.from_dict({"brokerName": "broker-a", "brokerId": "0", "brokerRole": "SLAVE"})


@pytest.mark.parametrize("key", sorted(k for k, r in K.KEYS.items() if r.support is K.Support.DEFAULT_ONLY))
def test_a_key_not_honoured_is_accepted_only_at_its_default(key):
    rule = K.KEYS[key]
    StoreConfig.from_dict({key: rule.accepted[0]})          # asks for what rmqstore does
    other = "true" if rule.accepted[0] in ("", "false") else "false" if rule.accepted[0] == "true" else "12345"
    with pytest.raises(ConfigError) as e:
        StoreConfig.from_dict({key: other}, "broker.conf")
    assert key in str(e.value) and "broker.conf" in str(e.value) and rule.why in str(e.value)


def test_tuning_keys_are_accepted_and_named_in_one_warning(caplog):
    with caplog.at_level("WARNING"):
        StoreConfig.from_dict({"sendMessageThreadPoolNums": "64", "serverSocketRcvBufSize": "131072",
                               "warmMapedFileEnable": "true"}, "broker.conf")
    lines = [r.getMessage() for r in caplog.records if "no effect" in r.getMessage()]
    assert len(lines) == 1 and all(k in lines[0] for k in ("sendMessageThreadPoolNums", "serverSocketRcvBufSize",
                                                             "warmMappedFileEnable")), lines


def test_an_unknown_key_is_refused(tmp_path):
    conf = tmp_path / "b.conf"
    conf.write_text("flushDiskTyp=SYNC_FLUSH\n")            # a typo: RocketMQ would ignore it silently
    with pytest.raises(ConfigError, match=r"flushDiskTyp in .*b\.conf: not a broker.conf key rmqstore knows"):
        StoreConfig.load(conf)


def test_every_honoured_key_is_read():
    """HONOURED means read: a StoreConfig field, or a key the code reads from StoreConfig.extra by name."""
    code = "\n".join(p.read_text() for p in SRC.rglob("*.py") if p.name not in ("config.py", "config_keys.py"))
    for key, rule in K.KEYS.items():
        if rule.support is not K.Support.HONOURED:
            continue
        attr = StoreConfig.attr_name(key)
        assert attr is not None or f'"{key}"' in code, f"{key} is marked honoured but nothing reads it"
        if attr is not None:
            reader = {"message_delay_level": "delay_levels_ms"}.get(attr, attr)    # read through a method
            assert re.search(rf"\b{reader}\b", code), f"{key} ({attr}) is marked honoured but nothing reads it"
    import dataclasses
    for f in dataclasses.fields(StoreConfig):
        if f.name != "extra":
            assert K.canonical(StoreConfig.java_name(f.name)) in K.KEYS, f.name


def test_store_path_keys_must_name_the_store_being_opened(tmp_path):
    store = tmp_path / "store"
    ok = StoreConfig.from_dict({"storePathRootDir": str(store), "storePathCommitLog": str(store / "commitlog")})
    MessageStore.open(store, ok).close()
    bad = StoreConfig.from_dict({"storePathCommitLog": "/data/commitlog"})
    with pytest.raises(ConfigError, match=r"storePathCommitLog.*rmqstore keeps its files there"):
        MessageStore.open(store, bad)


def test_readme_lists_every_key_as_the_registry_says():
    """The documentation's "broker.conf keys" section names every key under its support."""
    section = doc_section("broker.conf keys")
    for support in K.Support:
        listed = re.search(rf"\*\*{re.escape(support.value)}\*\*[^:]*:(.*?)(?=\n- \*\*|\Z)", section, re.S)
        assert listed, support
        names = set(re.findall(r"`([A-Za-z0-9]+)`", listed.group(1)))
        want = {k for k, r in K.KEYS.items() if r.support is support}
        assert names == want, (support, sorted(want - names), sorted(names - want))


def test_a_configuration_written_by_to_properties_loads_without_a_warning(tmp_path, caplog):
    """StoreConfig.to_properties() writes every field, tuning ones at their defaults: they ask for nothing."""
    conf = tmp_path / "b.conf"
    conf.write_text(StoreConfig().to_properties())
    with caplog.at_level("WARNING"):
        StoreConfig.load(conf)
    assert not caplog.records, caplog.text


def test_a_read_only_command_or_spark_read_only_names_what_serving_would_refuse(tmp_path, caplog):
    """A real slave's broker.conf (brokerRole=SLAVE, brokerId=1, its own storePathRootDir) with a key serving
    refuses (useTLS=true) given to a command that only reads (dump, get, check, rebuild, Spark's option config)
    is read for the store's geometry; what serving would refuse is named in one warning; `rmqstore serve` and
    `load` refuse it."""
    from conftest import run_cli
    from rmqstore import Message
    store = tmp_path / "copy"
    with MessageStore.open(store, StoreConfig.from_dict({"mappedFileSizeCommitLog": 1 << 20})) as s:
        assert s.put_message(Message("T", b"x", queue_id=0)).ok
    conf = tmp_path / "broker-a-s.properties"
    conf.write_text("brokerName=broker-a\nbrokerId=1\nbrokerRole=SLAVE\nuseTLS=true\n"
                    "storePathRootDir=/root/store\nmappedFileSizeCommitLog=1048576\n")
    with caplog.at_level("WARNING"):
        cfg = StoreConfig.load(conf, reading=True)
    assert cfg.broker_role == "SLAVE" and cfg.store_path_root_dir == "" and "useTLS" not in cfg.extra
    assert "useTLS: not honoured by rmqstore, ignored for this read" in caplog.text
    r = run_cli("get", "-c", conf, store, "T", "0", "0")
    assert r.returncode == 0 and b"useTLS" in r.stderr, r.stderr
    assert run_cli("rebuild", "-c", conf, store).returncode == 0
    r = run_cli("load", "-c", conf, store, input=b"")
    assert r.returncode == 2 and b"useTLS" in r.stderr, r.stderr


@pytest.mark.parametrize("key,value", [
    ("mappedFileSizeCommitLog", "99999999999999999999"), ("deleteWhen", "25"), ("deleteWhen", "abc"),
    ("serverFrameMemoryMax", "0"), ("serverFrameMemoryMax", "-1"), ("serverFrameTimeoutSeconds", "-1"),
    ("serverChannelMaxIdleTimeSeconds", "-3"), ("flushIntervalCommitLog", "0"), ("flushIntervalCommitLog", "-1"),
    ("defaultTopicQueueNums", "0"), ("defaultTopicQueueNums", "100000"), ("maxMessageSize", "99999999999999999999"),
    ("shortPollingTimeMills", "-1"), ("defaultQueryMaxNum", "0"), ("accessMessageInMemoryMaxRatio", "500"),
    ("maxTransferCountOnMessageInMemory", "0"), ("messageDelayLevel", ""), ("aclEnable", "maybe"),
    ("grpcListenPort", "70000")])
def test_a_value_out_of_its_range_is_refused_naming_it(key, value):
    """An outside audit's values, each accepted without a word before: a file size that crashed the first put,
    an hour that never comes, budgets and intervals of 0 or below (a flush thread spinning), more queues than
    queue ids."""
    with pytest.raises(ConfigError) as e:
        StoreConfig.from_dict({key: value}, "broker.conf")
    assert key in str(e.value) and "broker.conf" in str(e.value), e.value


@pytest.mark.parametrize("value,on", [("true", True), ("yes", True), ("1", True), ("TRUE", True), ("false", False),
                                      ("0", False), ("no", False)])
def test_acl_enable_is_a_boolean_read_as_it_is_accepted(value, on):
    """aclEnable=yes was accepted as a boolean and then read as off (the gate compared with "true"): every
    spelling a boolean key accepts turns ACL on or off as it says."""
    from rmqstore.acl.gate import acl_enabled
    assert acl_enabled(StoreConfig.from_dict({"aclEnable": value})) is on
