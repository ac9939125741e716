"""No SIGBUS on a full tmpfs (issue 15, defect 9), on a real 8 MiB tmpfs filled to the last page.

On tmpfs a read of a hole through a shared mapping needs a page; on a full tmpfs there is none and the
process dies of SIGBUS. Every read of a possibly unallocated page (a new store's checkpoint, the first
record of a never-written last commitlog file, the header and slots of index files written elsewhere)
goes through pread. Each open runs in a child process: it must not die of a signal; it opens and reads,
or fails with one line naming the file.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rmqstore.store.conf.config import StoreConfig
from rmqstore.store.state.lock import AbortFile, boot_id
from rmqstore.store.format.message import Message
from rmqstore.store.store import MessageStore
from store_checks import small_filesystem

CONF = {"mappedFileSizeCommitLog": 1 << 20, "mappedFileSizeConsumeQueue": 6000, "maxHashSlotNum": 4000,
        "maxIndexNum": 8000}
N = 200

OPEN_CHILD = r"""
import sys
from rmqstore.store.conf.config import StoreConfig
from rmqstore.errors import RmqStoreError
from rmqstore.store.store import MessageStore
conf = {"mappedFileSizeCommitLog": 1 << 20, "mappedFileSizeConsumeQueue": 6000, "maxHashSlotNum": 4000,
        "maxIndexNum": 8000}
try:
    store = MessageStore.open(sys.argv[1], StoreConfig.from_dict(conf), start_services=False)
except (RmqStoreError, OSError) as e:
    print("ERROR", " ".join(str(e).split()))
    sys.exit(3)
n = 0
for q in range(4):
    off = 0
    while True:
        got = store.get_message("g", "NoSigbus", q, off, 32)
        if not got.messages:
            break
        n += len(got.messages)
        off = got.next_begin_offset
keyed = len(store.find_messages_by_key("NoSigbus", "key-7"))
print("READ", n, keyed)
store.close()
print("CLOSED")
"""


def _fill(fs: Path) -> None:
    """Fill the filesystem to its last byte."""
    chunk = b"\xa5" * (1 << 16)
    with open(fs / "ballast", "ab") as f:
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError:
            pass
    with open(fs / "ballast2", "ab", buffering=0) as f:
        try:
            while True:
                f.write(b"\xa5" * 512)
        except OSError:
            pass


def _run_child(store: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", OPEN_CHILD, str(store)], capture_output=True, text=True,
                          timeout=120)


def _assert_no_signal(r: subprocess.CompletedProcess) -> None:
    assert r.returncode >= 0, f"the child died of signal {-r.returncode}: {r.stderr[-2000:]}"
    assert "Traceback" not in r.stderr, r.stderr[-2000:]


def test_new_store_on_a_full_tmpfs_does_not_die_of_sigbus(tmp_path):
    fs = tmp_path / "fs"
    with small_filesystem(fs, 8):
        _fill(fs)
        r = _run_child(fs / "new-store")
        _assert_no_signal(r)
        if r.returncode == 3:          # refused: one line naming the file it could not create
            line = r.stdout.strip()
            assert len(line.splitlines()) == 1 and str(fs / "new-store") in line, r.stdout
        else:
            assert r.returncode == 0 and "READ 0 0" in r.stdout, (r.stdout, r.stderr[-2000:])
        # the CLI says the same in one line (nothing to load)
        c = subprocess.run([sys.executable, "-m", "rmqstore", "load", str(fs / "cli-store")], input=b"",
                           capture_output=True, timeout=120)
        assert c.returncode >= 0, f"rmqstore load died of signal {-c.returncode}"
        assert c.returncode in (0, 2), c.stderr
        if c.returncode == 2:
            assert len(c.stderr.strip().splitlines()) == 1 and str(fs / "cli-store").encode() in c.stderr


def _sparse_copy(src: Path, dst: Path) -> None:
    """Copy src to dst leaving every all-zero 4 KiB page a hole (as `cp --sparse=always` does)."""
    with open(src, "rb") as f, open(dst, "wb") as g:
        size = os.fstat(f.fileno()).st_size
        while True:
            page = f.read(4096)
            if not page:
                break
            if page.count(0) == len(page):
                g.seek(len(page), os.SEEK_CUR)
            else:
                g.write(page)
        g.truncate(size)


def test_reopen_after_a_crash_on_a_full_tmpfs_does_not_die_of_sigbus(tmp_path):
    """A store left by a crash with a never-written last commitlog file (a hole from byte 0) and index
    files whose empty slot pages are holes (as a sparse copy written elsewhere leaves them), reopened once
    the tmpfs is full: recovery and reads go on, keys are found (today: SIGBUS)."""
    fs = tmp_path / "fs"
    with small_filesystem(fs, 8):
        store = fs / "store"
        with MessageStore.open(store, StoreConfig.from_dict(CONF)) as s:
            for i in range(N):
                s.put_message(Message("NoSigbus", b"body %d" % i, queue_id=i % 4,
                                      properties={"KEYS": f"key-{i}"}))
            s.wait_dispatched()
            end = s.commit_log.get_max_offset()
        # the crash: a process killed in this boot (its abort note: the index files are kept, not rebuilt,
        # and nothing frees room before recovery reads them), a last commitlog file created, never written
        (store / "abort").write_text(AbortFile.LINE.format(boot=boot_id(), offset=end))
        nxt = store / "commitlog" / f"{1 << 20:020d}"
        with open(nxt, "wb") as f:
            f.truncate(1 << 20)
        for idx in (store / "index").iterdir():
            tmp = idx.with_name(idx.name + ".sparse")
            _sparse_copy(idx, tmp)
            os.replace(tmp, idx)
        _fill(fs)
        r = _run_child(store)
        _assert_no_signal(r)
        if r.returncode == 3:
            line = r.stdout.strip()
            assert len(line.splitlines()) == 1 and str(store) in line, r.stdout
        else:
            assert r.returncode == 0, r.stderr[-2000:]
            assert f"READ {N} 1" in r.stdout, (r.stdout, r.stderr[-2000:])
