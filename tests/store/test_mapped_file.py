"""MappedFile and MappedFileQueue on their own: appends and reads, the recovery cut (truncate_to), load's
checks, and the read-only variant recovery plans with (ReadOnlyMappedFile: everything stays in memory)."""
from __future__ import annotations

import hashlib
import os

import pytest

from rmqstore.errors import CorruptStoreError
from rmqstore.store.files.mapped_file import MappedFile, MappedFileQueue, ReadOnlyMappedFile, offset_to_file_name

SIZE = 4096


def digest(d):
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(d.iterdir())}


def filled_queue(d, nbytes: int) -> MappedFileQueue:
    q = MappedFileQueue(d, SIZE)
    pos = 0
    while pos < nbytes:
        mf = q.get_last_mapped_file(pos)
        n = min(mf.free_space, nbytes - pos)
        assert mf.append(bytes([1 + (pos // SIZE) % 250]) * n)
        pos += n
    return q


def test_append_read_and_positions(tmp_path):
    mf = MappedFile(tmp_path / offset_to_file_name(0), SIZE)
    assert mf.append(b"abc") and mf.append(b"de")
    assert mf.read(0, 5) == b"abcde" and mf.read(3, 3) is None          # past what was written
    assert not mf.append(b"x" * SIZE)                                   # does not fit: nothing written
    assert mf.wrote_position == 5 and mf.free_space == SIZE - 5
    assert mf.data_end() >= 5 and mf.has_data(0, 5) and not mf.has_data(5, SIZE)
    mf.destroy()
    assert not (tmp_path / offset_to_file_name(0)).exists()


def test_truncate_to_cuts_zeroes_and_deletes_later_files(tmp_path):
    q = filled_queue(tmp_path, 3 * SIZE + 100)
    assert len(q.files) == 4
    q.truncate_to(SIZE + 10)
    assert [mf.path.name for mf in q.files] == [offset_to_file_name(0), offset_to_file_name(SIZE)]
    assert not (tmp_path / offset_to_file_name(2 * SIZE)).exists()
    assert q.get_max_offset() == SIZE + 10 and q.flushed_where == SIZE + 10
    assert q.files[1].mm[10:SIZE] == bytes(SIZE - 10) and q.files[1].mm[:10] == bytes([2]) * 10
    q.shutdown()


def test_load_refuses_a_short_middle_file_naming_it(tmp_path):
    filled_queue(tmp_path, 3 * SIZE).shutdown()
    os.truncate(tmp_path / offset_to_file_name(SIZE), 100)
    q = MappedFileQueue(tmp_path, SIZE)
    with pytest.raises(CorruptStoreError, match=offset_to_file_name(SIZE)):
        q.load()


def test_load_extends_a_short_last_file(tmp_path):
    filled_queue(tmp_path, SIZE + 50).shutdown()
    os.truncate(tmp_path / offset_to_file_name(SIZE), 50)
    q = MappedFileQueue(tmp_path, SIZE)
    q.load()
    assert q.repaired == [(str(tmp_path / offset_to_file_name(SIZE)), 50)]
    assert os.path.getsize(tmp_path / offset_to_file_name(SIZE)) == SIZE
    q.shutdown()


def test_read_only_queue_changes_nothing(tmp_path):
    """The same load, cut and appends over a read-only queue: a short last file reads as extended (and is
    reported), the cut and the appends (a new file included) stay in memory; the directory is as it was."""
    filled_queue(tmp_path, 2 * SIZE + 300).shutdown()
    os.truncate(tmp_path / offset_to_file_name(2 * SIZE), 300)
    before = digest(tmp_path)
    q = MappedFileQueue(tmp_path, SIZE, read_only=True)
    q.load()
    assert q.repaired == [(str(tmp_path / offset_to_file_name(2 * SIZE)), 300)]
    last = q.files[-1]
    assert isinstance(last, ReadOnlyMappedFile) and len(last.mm) == SIZE
    assert last.data_end() == 300 and last.mm[299] == 3 and last.mm[300:] == bytes(SIZE - 300)
    q.truncate_to(SIZE + 7)
    assert q.get_max_offset() == SIZE + 7 and len(q.files) == 2
    assert q.files[1].mm[7:20] == bytes(13)                     # zeroed, in memory
    mf = q.get_last_mapped_file(SIZE + 7)
    assert mf.append(b"z" * (SIZE - 7))
    new = q.get_last_mapped_file(2 * SIZE)                      # a new file: in memory only
    assert new.append(b"new") and new.read(0, 3) == b"new" and new.has_data(0, 3)
    q.shutdown()
    assert digest(tmp_path) == before


def test_read_only_file_refuses_a_file_larger_than_configured(tmp_path):
    p = tmp_path / offset_to_file_name(0)
    p.write_bytes(b"x" * (SIZE + 1))
    with pytest.raises(CorruptStoreError, match="does not match"):
        ReadOnlyMappedFile(p, SIZE)


@pytest.mark.parametrize("step", ["commit", "flush"])
def test_two_threads_stepping_at_once_never_move_a_position_back(tmp_path, monkeypatch, step):
    """A commit (write buffer into the file: CommitRealTimeService and a SYNC_FLUSH round) or a flush (the
    group commit and a flush_all of another thread) that read the positions before another one of its kind
    set them must not set the position back below bytes already in the file or on disk (the round's flush then
    stopped short and answered FLUSH_DISK_TIMEOUT for them; found by outside tests). The first one is held in
    its write (commit) or fdatasync (flush) while the second runs."""
    import threading
    q = MappedFileQueue(tmp_path / "cl", 1 << 16, use_write_buffer=step == "commit")
    mf = q.get_last_mapped_file(0)
    mf.append(b"a" * 100)
    entered, go = threading.Event(), threading.Event()

    def holding(real):
        def held(*args):
            if threading.current_thread().name == "first":
                entered.set()
                go.wait(10)
            return real(*args)
        return held

    if step == "commit":
        monkeypatch.setattr(mf, "_pwrite", holding(mf._pwrite))
    else:
        monkeypatch.setattr(os, "fdatasync", holding(os.fdatasync))
    first = threading.Thread(target=getattr(q, step), name="first")
    first.start()
    assert entered.wait(10)
    mf.append(b"b" * 100)                       # more bytes, stepped over by a second thread meanwhile
    second = threading.Thread(target=getattr(q, step), name="second")
    second.start()
    second.join(0.2)
    go.set()
    first.join(10)
    second.join(10)
    assert not first.is_alive() and not second.is_alive()
    if step == "commit":
        assert mf.committed_position == 200 and q.committed_where == 200
        q.flush()
    assert mf.flushed_position == 200 and q.flushed_where == 200
    assert os.pread(mf._fd, 200, 0) == b"a" * 100 + b"b" * 100
