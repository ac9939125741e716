"""A directory where a commitlog or consume queue file belongs is refused naming it (found by the
corruption fuzzer: a raw IsADirectoryError from MappedFileQueue.load)."""
from __future__ import annotations

import shutil

import pytest

from conftest import run_cli
from rmqstore.store.conf.config import StoreConfig
from rmqstore.errors import CorruptStoreError
from rmqstore.store.format.message import Message
from rmqstore.store.store import MessageStore

CFG = {"mappedFileSizeCommitLog": 64 * 1024, "mappedFileSizeConsumeQueue": 20 * 100}


def _store(tmp_path):
    path = tmp_path / "store"
    with MessageStore.open(path, StoreConfig.from_dict(CFG)) as s:
        for i in range(800):
            s.put_message(Message("T", b"x" * 100, queue_id=i % 2))
    conf = tmp_path / "store.conf"
    conf.write_text("".join(f"{k}={v}\n" for k, v in CFG.items()))
    return path, conf


@pytest.mark.parametrize("victim", ["commitlog/00000000000000065536", "consumequeue/T/0/00000000000000000000"])
def test_directory_in_place_of_a_data_file_is_named(tmp_path, victim):
    path, conf = _store(tmp_path)
    target = path / victim
    assert target.is_file()
    target.unlink()
    target.mkdir()
    with pytest.raises(CorruptStoreError) as e:
        MessageStore.open(path, StoreConfig.from_dict(CFG))
    assert str(target) in str(e.value) and "directory" in str(e.value)
    r = run_cli("dump", "-c", conf, path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and str(target) in lines[0], lines
    shutil.rmtree(target)   # moved away as the error says: the store opens again (the file is gone: a gap)


def test_directory_in_place_of_a_config_backup_is_refused_at_open_and_close_never_keeps_the_lock(tmp_path):
    """config/delayOffset.json.bak a directory (an outside audit): the open accepted the store, and after a
    delayed send close() raised CorruptStoreError, kept the abort file and the lock (a reopen in the same
    process: StoreLockedError). The open now refuses it naming the file; a backup that turns into a
    directory while the store is open fails the service's persist, logged, and close() still finishes."""
    from store_checks import wait_until
    path = tmp_path / "store"
    cfg = StoreConfig.from_dict({**CFG, "messageDelayLevel": "1s"})
    bak = path / "config" / "delayOffset.json.bak"

    def delayed_send(s, n):
        assert s.put_message(Message("T", b"later", queue_id=0, properties={"DELAY": "1"})).ok
        assert wait_until(lambda: s.get_max_offset_in_queue("T", 0) == n, 30)     # delivered
    with MessageStore.open(path, cfg) as s:
        delayed_send(s, 1)
        s.schedule_service.persist()
        delayed_send(s, 2)
    assert bak.is_file()                                      # the second persist kept the first as .bak
    bak.unlink()
    bak.mkdir()
    with pytest.raises(CorruptStoreError) as e:
        MessageStore.open(path, cfg)
    assert str(bak) in str(e.value) and "directory" in str(e.value)
    bak.rmdir()
    s = MessageStore.open(path, cfg)
    bak.mkdir()                                               # while the store is open
    delayed_send(s, 3)
    s.close()                                                 # the persist fails: logged, not raised
    assert not (path / "abort").exists()
    bak.rmdir()
    with MessageStore.open(path, cfg) as again:               # not left locked by this process
        assert again.recovery_report.clean_shutdown
        # the delivery whose offset could not be persisted comes again (delay delivery is at least once)
        assert again.get_max_offset_in_queue("T", 0) in (3, 4)
