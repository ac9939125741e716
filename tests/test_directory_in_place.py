"""A directory where a commitlog or consume queue file belongs is refused naming it (found by the
corruption fuzzer: a raw IsADirectoryError from MappedFileQueue.load)."""
from __future__ import annotations

import shutil

import pytest

from conftest import run_cli
from rmqstore.store.config import StoreConfig
from rmqstore.errors import CorruptStoreError
from rmqstore.store.message import Message
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
