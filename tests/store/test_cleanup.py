"""Cleanup: expired files at deleteWhen, disk thresholds on a real small filesystem, readers never fail.

Each test runs its store on its own 8 MiB tmpfs (store_checks.small_filesystem: root may mount here), so
the disk usage the cleanup service sees is real and independent of the host's disk.
"""
from __future__ import annotations

import datetime as dt
import logging
import os
import subprocess
import random
import sys
import threading
import time

from rmqstore.store.durability.cleanup import CleanCommitLogService, CleanupService, clean_store, disk_used_ratio, parse_delete_when
from rmqstore.store.format.message import GetMessageStatus, Message, PutMessageStatus
from rmqstore.store.store import MessageStore
from store_checks import fill_to, make_message, small_config, small_filesystem, verify_store

OK_READ = {GetMessageStatus.FOUND, GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.MESSAGE_WAS_REMOVING,
           GetMessageStatus.OFFSET_OVERFLOW_ONE, GetMessageStatus.OFFSET_OVERFLOW_BADLY,
           GetMessageStatus.NO_MATCHED_MESSAGE, GetMessageStatus.OFFSET_FOUND_NULL,
           GetMessageStatus.NO_MESSAGE_IN_QUEUE}


def _not_now() -> str:
    return f"{(dt.datetime.now().hour + 12) % 24:02d}"


def _cfg(**extra):
    values = {"deleteWhen": _not_now(), "fileReservedTime": 72, "cleanResourceInterval": 3_600_000}
    values.update(extra)
    return small_config(**values)


def _fill_store(store: MessageStore, n: int, tag: str = "m") -> list:
    rng = random.Random(tag)
    rs = store.put_messages([make_message(f"{tag}-{i}", rng) for i in range(n)])
    assert all(r.status is PutMessageStatus.PUT_OK for r in rs)
    store.wait_dispatched()
    return rs


def _age(paths, hours: float) -> None:
    t = time.time() - hours * 3600
    for p in paths:
        os.utime(p, (t, t))


def _cleanup(store: MessageStore) -> CleanupService:
    return next(s for s in store.services if isinstance(s, CleanupService))


def test_delete_when_parses_rocketmq_forms():
    assert parse_delete_when("04") == {4}
    assert parse_delete_when("04;05") == {4, 5}
    assert parse_delete_when("4; 23;x;25") == {4, 23}


def test_expired_files_go_at_the_delete_when_hour_only(tmp_path):
    with small_filesystem(tmp_path / "fs", 16):
        path = tmp_path / "fs" / "store"
        with MessageStore.open(path, _cfg()) as store:
            _fill_store(store, 800)
            files = sorted((path / "commitlog").iterdir())
            assert len(files) >= 8
            _age(files[:4], 100)                # older than fileReservedTime (72 h)
            _age(files[5:6], 100)               # expired too, but behind an unexpired one: kept (oldest first)
            svc = _cleanup(store)
            assert svc.commit_log_service.run_once() == []                      # not the hour, disk fine
            store.config.delete_when = f"{_not_now()};{dt.datetime.now().hour:02d}"
            deleted = svc.commit_log_service.run_once()
            assert deleted == [str(p) for p in files[:4]]
            assert store.get_min_phy_offset() == int(files[4].name)
            cq_files, idx_files = svc.consume_queue_service.run_once()
            assert cq_files > 0
            for cq in store.consume_queues:            # min offsets moved past the deleted messages
                lo = cq.get_min_offset_in_queue()
                u = cq.get_unit(lo)
                assert u is None or u[0] >= store.get_min_phy_offset()
                if lo > 0:
                    r = store.get_message("g", cq.topic, cq.queue_id, lo - 1, 4)
                    assert r.status is GetMessageStatus.OFFSET_TOO_SMALL and r.next_begin_offset == lo
            verify_store(store, [])
            assert store.look_message_by_offset(0) is None


def test_disk_thresholds_on_a_small_tmpfs(tmp_path, caplog):
    """75 %: expired files go at any hour; 85 %: unexpired ones too, oldest first, never the last;
    90 %: puts answer SERVICE_NOT_AVAILABLE naming the ratio, reads go on; under 90 % again: puts accepted."""
    fs = tmp_path / "fs"
    with small_filesystem(fs, 8):
        path = fs / "store"
        ballast = fs / "ballast"
        with MessageStore.open(path, _cfg()) as store:
            rs = _fill_store(store, 1500)
            files = sorted((path / "commitlog").iterdir())
            assert len(files) >= 16
            _age(files[:6], 100)
            svc = _cleanup(store)
            cl = svc.commit_log_service
            assert cl.check_disk().used < 0.5 and cl.run_once() == []
            # over diskMaxUsedSpaceRatio (75 %): the expired files, at once, whatever the hour
            assert 0.75 < fill_to(ballast, 0.78) < 0.85
            assert cl.run_once() == [str(p) for p in files[:6]]
            svc.consume_queue_service.run_once()
            assert store.put_message(Message("TopicA", b"still fine")).status is PutMessageStatus.PUT_OK
            # over diskSpaceCleanForciblyRatio (85 %): unexpired files too, oldest first, 10 a pass, not the last
            assert 0.85 < fill_to(ballast, 0.87) < 0.90
            left = sorted((path / "commitlog").iterdir())
            deleted = cl.run_once()
            assert deleted == [str(p) for p in left[:min(10, len(left) - 1)]]
            assert (path / "commitlog" / left[-1].name).exists()
            svc.consume_queue_service.run_once()
            assert store.put_message(Message("TopicA", b"85 % is no refusal")).status is PutMessageStatus.PUT_OK
            store.wait_dispatched()
            # over diskSpaceWarningLevelRatio (90 %), even after what cleanup can free: puts refused
            left = sorted((path / "commitlog").iterdir())
            freeable = (len(left) - 1) * 65536 / (8 << 20)
            assert fill_to(ballast, max(0.93, 0.905 + freeable + 0.01)) > 0.9
            cl.run_once()
            assert disk_used_ratio(fs) > 0.90
            assert store.running_flags.disk_full
            with caplog.at_level(logging.WARNING):
                r = store.put_message(Message("TopicA", b"refused"))
            assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
            assert "diskSpaceWarningLevelRatio 90%" in caplog.text and str(path) in caplog.text
            cq = store.consume_queues.find("TopicA", 0)
            hi = cq.get_max_offset_in_queue()
            got = store.get_message("g", "TopicA", 0, hi - 1, 1)         # reads go on
            assert got.status is GetMessageStatus.FOUND
            assert store.look_message_by_offset(got.messages[0].commit_log_offset) is not None
            # space freed: the next check accepts puts again (alibaba/rocketmq#331: it stayed refused)
            fill_to(ballast, 0.5)
            cl.check_disk()
            assert not store.running_flags.disk_full
            assert store.put_message(Message("TopicA", b"accepted again")).status is PutMessageStatus.PUT_OK
            store.wait_dispatched()
            verify_store(store, [])
        assert rs


def test_the_background_service_does_it_alone(tmp_path):
    """No test calls: the service thread deletes expired files (deleteWhen = now) and notices a full disk."""
    fs = tmp_path / "fs"
    with small_filesystem(fs, 8):
        path = fs / "store"
        cfg = _cfg(deleteWhen=f"{dt.datetime.now().hour:02d};{(dt.datetime.now().hour + 1) % 24:02d}",
                   cleanResourceInterval=200, deleteCommitLogFilesInterval=1)
        with MessageStore.open(path, cfg) as store:
            _fill_store(store, 600)
            files = sorted((path / "commitlog").iterdir())
            _age(files[:3], 100)
            deadline = time.monotonic() + 10
            while store.get_min_phy_offset() < int(files[3].name) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert store.get_min_phy_offset() == int(files[3].name)
            while any(cq.get_unit(cq.get_min_offset_in_queue()) and
                      cq.get_unit(cq.get_min_offset_in_queue())[0] < int(files[3].name) for cq in store.consume_queues):
                assert time.monotonic() < deadline, "consume queue min offsets did not move"
                time.sleep(0.05)
            fill_to(fs / "ballast", 0.95)
            deadline = time.monotonic() + 5
            while not store.running_flags.disk_full and time.monotonic() < deadline:
                time.sleep(0.05)
            assert store.running_flags.disk_full
            assert store.put_message(Message("T", b"x")).status is PutMessageStatus.SERVICE_NOT_AVAILABLE
            os.unlink(fs / "ballast")
            deadline = time.monotonic() + 5
            while store.running_flags.disk_full and time.monotonic() < deadline:
                time.sleep(0.05)
            assert store.put_message(Message("T", b"x")).status is PutMessageStatus.PUT_OK


def test_a_store_opened_on_a_full_disk_refuses_puts_at_once(tmp_path):
    fs = tmp_path / "fs"
    with small_filesystem(fs, 8):
        fill_to(fs / "ballast", 0.95)
        with MessageStore.open(fs / "store", _cfg()) as store:
            assert store.put_message(Message("T", b"x")).status is PutMessageStatus.SERVICE_NOT_AVAILABLE
            assert "diskSpaceWarningLevelRatio" in store.running_flags.why()


def test_readers_during_and_after_deletion_never_raise(tmp_path):
    """Consumers, lookups and key queries race a forced clean: they see FOUND, OFFSET_TOO_SMALL or
    MESSAGE_WAS_REMOVING (and None for lookups), never an exception (the files are unmapped under them)."""
    with MessageStore.open(tmp_path / "s", _cfg()) as store:
        rs = _fill_store(store, 1000, "r")
        ids = [r.append_result.msg_id for r in rs]
        offsets = [r.append_result.wrote_offset for r in rs]
        stop = threading.Event()
        errors: list[BaseException] = []
        statuses: set = set()

        def consume(topic: str) -> None:
            try:
                while not stop.is_set():
                    for q in range(4):
                        r = store.get_message("g", topic, q, 0, 32)
                        statuses.add(r.status)
                        if r.status not in OK_READ:
                            raise AssertionError(r.status)
                    store.query_message(topic, "r-10", 32)
            except BaseException as e:   # noqa: BLE001 - the test reports it
                errors.append(e)

        def lookup() -> None:
            try:
                while not stop.is_set():
                    for off in offsets[:600:7]:
                        store.look_message_by_offset(off)
                    for mid in ids[:600:25]:
                        store.view_message_by_id(mid)
            except BaseException as e:   # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=consume, args=(t,)) for t in ("TopicA", "TopicB", "TopicC")]
        threads += [threading.Thread(target=lookup) for _ in range(2)]
        for t in threads:
            t.start()
        held = store.commit_log.queue.files[0]           # a file a reader has in hand when it goes
        switch = sys.getswitchinterval()
        sys.setswitchinterval(1e-5)                      # threads interleave finely: the race is likely
        try:
            time.sleep(0.02)
            svc = CleanCommitLogService(store)
            while svc.delete_files(force=True, max_files=2):
                time.sleep(0.002)
            out = clean_store(store, force=True)
            time.sleep(0.02)
        finally:
            sys.setswitchinterval(switch)
            stop.set()
        for t in threads:
            t.join(timeout=30)
        assert not errors, errors[:3]
        assert held.read(0, 8) is None and held.read_from(0) == b""     # unmapped: nothing, no exception
        assert len(list((tmp_path / "s" / "commitlog").iterdir())) == 1 and out["consume_queue_files_deleted"] > 0
        assert GetMessageStatus.OFFSET_TOO_SMALL in statuses or GetMessageStatus.MESSAGE_WAS_REMOVING in statuses
        # after: the old offsets answer OFFSET_TOO_SMALL, lookups None
        for cq in store.consume_queues:
            r = store.get_message("g", cq.topic, cq.queue_id, 0, 8)
            if cq.get_min_offset_in_queue() > 0:
                assert r.status is GetMessageStatus.OFFSET_TOO_SMALL
        assert store.view_message_by_id(ids[0]) is None
        assert store.find_messages_by_key("TopicA", "r-0") == []


def test_clean_store_manual(tmp_path):
    with MessageStore.open(tmp_path / "s", _cfg()) as store:
        _fill_store(store, 900)
        files = sorted((tmp_path / "s" / "commitlog").iterdir())
        out = clean_store(store)                    # nothing expired: nothing deleted
        assert out["commitlog_files_deleted"] == 0 and out["min_offset_after"] == 0
        _age(files[:2], 100)
        out = clean_store(store)                    # expired ones, whatever the hour
        assert out["commitlog_files_deleted"] == 2 and out["min_offset_after"] == int(files[2].name)
        assert out["consume_queue_files_deleted"] >= 0 and out["store"] == str(tmp_path / "s")
        out = clean_store(store, force=True)        # everything but the current file
        assert out["commitlog_files_deleted"] == len(files) - 3
        assert [p.name for p in (tmp_path / "s" / "commitlog").iterdir()] == [files[-1].name]
        assert out["index_files_deleted"] >= 1
        r = store.put_message(Message("TopicA", b"after", queue_id=0))
        assert r.status is PutMessageStatus.PUT_OK
        store.wait_dispatched()
        verify_store(store, [])
    with MessageStore.open(tmp_path / "s", _cfg()) as store:     # and it reopens consistent
        assert store.get_min_phy_offset() == int(files[-1].name)
        verify_store(store, [])


def test_a_file_not_yet_dispatched_is_never_deleted(tmp_path):
    with MessageStore.open(tmp_path / "s", _cfg(), start_services=False) as store:
        store.commit_log.put_messages([make_message(f"u-{i}", random.Random(i)) for i in range(400)])
        # nothing dispatched yet (no dispatcher thread): every file is still needed
        store.dispatcher.reput_from_offset = 0
        svc = CleanCommitLogService(store)
        assert svc.delete_files(force=True) == []
        store.wait_dispatched()
        assert len(svc.delete_files(force=True)) > 0


ENOSPC_CHILD = r"""
import sys
from rmqstore.store.conf.config import StoreConfig
from rmqstore.store.format.message import Message, PutMessageStatus
from rmqstore.store.store import MessageStore
# commitlog files of 32 MiB on a 4 MiB filesystem: the disk fills inside a file, under the put; the index
# file (2 MiB, sparse) fills up with it
cfg = StoreConfig.from_dict({"mappedFileSizeCommitLog": 32 << 20, "maxHashSlotNum": 1000, "maxIndexNum": 100000,
                             "mappedFileSizeConsumeQueue": 6000, "cleanResourceInterval": 3600000})
store = MessageStore.open(sys.argv[1], cfg)
acked, statuses = [], []
for i in range(64):
    rs = store.put_messages([Message(topic="T", body=bytes([i]) * 1024, queue_id=0,
                                     properties={"KEYS": f"k{i}-{j}"}) for j in range(100)])
    statuses.append(rs[0].status.value)
    if rs[0].status is PutMessageStatus.PUT_OK:
        acked.append(i)
print("STATUSES", ",".join(sorted(set(statuses))))
print("ACKED", len(acked))
print("WHY", store.running_flags.why())
# the failed put's dispatch columns were handed over before its write: taken back, none waits at the end
print("STALE_HINTS", sum(k >= store.commit_log.get_max_offset() for k in store.commit_log.dispatch_hints))
got = store.get_message("g", "T", 0, 0, 32)
print("READ", got.status.value, len(got.messages))
store.close()
"""


REOPEN_FULL_CHILD = r"""
import sys
from rmqstore.store.conf.config import StoreConfig
from rmqstore.store.format.message import Message
from rmqstore.store.store import MessageStore
cfg = StoreConfig.from_dict({"mappedFileSizeCommitLog": 32 << 20, "maxHashSlotNum": 1000, "maxIndexNum": 100000,
                             "mappedFileSizeConsumeQueue": 6000, "cleanResourceInterval": 3600000})
store = MessageStore.open(sys.argv[1], cfg)
print("OPENED", store.recovery_report.summary().replace(" ", "_"))
n = int(sys.argv[2])
found = sum(store.get_message("g", "T", 0, i * 100, 1).message_count for i in range(n))
print("READ", found)
print("PUT", store.put_message(Message(topic="T", body=b"x" * 1024, queue_id=0)).status.value)
store.close()
print("CLOSED", 1)
"""


def test_disk_full_inside_a_commitlog_file_refuses_puts_and_keeps_what_was_acknowledged(tmp_path):
    """The filesystem fills up in the middle of a (sparse) commitlog file: the put that hits ENOSPC answers
    SERVICE_NOT_AVAILABLE naming the error, the process lives (a write through the mapping would die of
    SIGBUS here), and every acknowledged batch is readable after a reopen."""
    fs = tmp_path / "fs"
    with small_filesystem(fs, 4) as how:
        r = subprocess.run([sys.executable, "-c", ENOSPC_CHILD, str(fs / "store")], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        out = dict(line.split(" ", 1) for line in r.stdout.splitlines())
        assert out["STATUSES"] == "PUT_OK,SERVICE_NOT_AVAILABLE", r.stdout
        assert "No space left on device" in out["WHY"], r.stdout
        assert out["STALE_HINTS"] == "0", r.stdout
        assert out["READ"].startswith("FOUND")
        acked = int(out["ACKED"])
        assert 10 <= acked < 64
        # reopened on the still full disk: recovery reads no hole through a mapping (on a full tmpfs that
        # needs a page: SIGBUS) and cuts the record the full disk tore; the re-dispatch of what the queues
        # lack fails for want of room and is reported (the dispatcher tries again); what the queues hold
        # is read, a put is refused, nothing dies
        r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", REOPEN_FULL_CHILD, str(fs / "store"),
                            str(acked)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"reopen on the full disk died ({r.returncode}): {r.stderr[-2000:]}"
        out = dict(line.split(" ", 1) for line in r.stdout.splitlines())
        if "No_space_left_on_device" in out["OPENED"]:
            assert 1 <= int(out["READ"]) <= acked, r.stdout
        else:
            assert out["READ"] == str(acked), r.stdout
        assert out["PUT"] == "SERVICE_NOT_AVAILABLE", r.stdout
        assert out["CLOSED"] == "1"
        # the operator makes room
        if how == "tmpfs":
            subprocess.run(["mount", "-o", "remount,size=64m", str(fs)], check=True, timeout=30)
        else:
            (fs / "store" / "commitlog" / f"{32 << 20:020d}").unlink(missing_ok=True)
        cfg = small_config(mappedFileSizeCommitLog=32 << 20, maxHashSlotNum=1000, maxIndexNum=100000,
                           mappedFileSizeConsumeQueue=6000)
        with MessageStore.open(fs / "store", cfg) as store:
            store.wait_dispatched()
            assert store.get_max_offset_in_queue("T", 0) >= acked * 100
            for i in range(acked):
                got = store.get_message("g", "T", 0, i * 100, 1)
                assert got.status is GetMessageStatus.FOUND and got.messages[0].body == bytes([i]) * 1024
