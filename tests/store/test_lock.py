"""The lock holds even when the `lock` file is unlinked or replaced (issue 15, defect 11), with real
processes: a second process is refused with StoreLockedError and no acknowledged message is lost."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rmqstore.store.conf.config import StoreConfig
from rmqstore.errors import StoreLockedError
from rmqstore.store.format.message import GetMessageStatus, Message, PutMessageStatus
from rmqstore.store.store import MessageStore

CONF = {"mappedFileSizeCommitLog": 1 << 20, "mappedFileSizeConsumeQueue": 6000}

WRITER = r"""
import sys
from rmqstore.store.conf.config import StoreConfig
from rmqstore.store.format.message import Message, PutMessageStatus
from rmqstore.store.store import MessageStore
store = MessageStore.open(sys.argv[1], StoreConfig.from_dict({"mappedFileSizeCommitLog": 1 << 20,
                                                             "mappedFileSizeConsumeQueue": 6000}))
def put(n, start):
    ok = 0
    for i in range(start, start + n):
        r = store.put_message(Message("LockT", b"first writer %d" % i, queue_id=0))
        ok += r.status is PutMessageStatus.PUT_OK
    return ok
acked = put(300, 0)
print("OPEN", acked, flush=True)
sys.stdin.readline()                  # the test unlinks the lock and tries a second process
acked += put(300, 300)
store.close()
print("ACKED", acked, flush=True)
"""

SECOND = r"""
import sys
from rmqstore.store.conf.config import StoreConfig
from rmqstore.errors import StoreLockedError
from rmqstore.store.format.message import Message
from rmqstore.store.store import MessageStore
try:
    store = MessageStore.open(sys.argv[1], StoreConfig.from_dict({"mappedFileSizeCommitLog": 1 << 20,
                                                                 "mappedFileSizeConsumeQueue": 6000}))
except StoreLockedError as e:
    print("LOCKED", e)
    sys.exit(0)
for i in range(100):
    store.put_message(Message("LockT", b"second writer %d" % i, queue_id=0))
store.close()
print("OPENED")
"""


@pytest.mark.parametrize("how", ["unlinked", "replaced"])
def test_unlinked_lock_file_does_not_admit_a_second_writer(tmp_path, how):
    store = tmp_path / "store"
    a = subprocess.Popen([sys.executable, "-c", WRITER, str(store)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = a.stdout.readline().split()
        assert first[:1] == ["OPEN"], a.stderr.read()
        (store / "lock").unlink()
        if how == "replaced":
            (store / "lock").write_bytes(b"")
        b = subprocess.run([sys.executable, "-c", SECOND, str(store)], capture_output=True, text=True,
                           timeout=120)
        assert b.returncode == 0, b.stderr[-2000:]
        assert b.stdout.startswith("LOCKED"), f"a second process opened the store: {b.stdout} {b.stderr[-500:]}"
        assert str(store) in b.stdout
        a.stdin.write("go\n")
        a.stdin.flush()
        out, err = a.communicate(timeout=120)
    finally:
        if a.poll() is None:
            a.kill()
    assert a.returncode == 0, err[-2000:]
    acked = int(out.split()[1])
    assert acked == 600
    with MessageStore.open(store, StoreConfig.from_dict(CONF)) as s:
        s.wait_dispatched()
        assert s.get_max_offset_in_queue("LockT", 0) == acked
        off = 0
        while off < acked:
            got = s.get_message("g", "LockT", 0, off, 32)
            assert got.status is GetMessageStatus.FOUND
            for m in got.messages:
                assert m.body == b"first writer %d" % m.queue_offset
            off = got.next_begin_offset


def test_lock_is_released_at_close_and_in_a_forked_child_after_close(tmp_path):
    """The directory lock goes with close(); a child forked while the store was open does not keep it."""
    store = tmp_path / "store"
    s = MessageStore.open(store, StoreConfig.from_dict(CONF))
    pid = os.fork()
    if pid == 0:                                  # the child sleeps holding whatever fork gave it
        import time
        time.sleep(3)
        os._exit(0)
    try:
        s.put_message(Message("LockT", b"x", queue_id=0))
        s.close()
        r = subprocess.run([sys.executable, "-c", SECOND, str(store)], capture_output=True, text=True, timeout=60)
        assert r.stdout.startswith("OPENED"), (r.stdout, r.stderr[-1000:])
    finally:
        os.waitpid(pid, 0)


def test_second_open_in_the_same_process_is_refused(tmp_path):
    store = tmp_path / "store"
    with MessageStore.open(store, StoreConfig.from_dict(CONF)):
        (store / "lock").unlink()
        with pytest.raises(StoreLockedError):
            MessageStore.open(store, StoreConfig.from_dict(CONF))
    with MessageStore.open(store, StoreConfig.from_dict(CONF)) as s:
        assert s.put_message(Message("LockT", b"y", queue_id=0)).status is PutMessageStatus.PUT_OK
