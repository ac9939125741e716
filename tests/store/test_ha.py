"""Replication (store/ha) in one process: a master and a slave MessageStore over loopback.

Byte-equal commitlogs, SYNC_MASTER's three answers on every put path, a slave's refusals, frames that cut
records, an empty slave of a master whose log spans files, divergence and `rmqstore ha-truncate`, and
hostile peers on the HA port. The faults with real processes (SIGKILL, SIGSTOP) are in test_ha_faults.py.
"""
from __future__ import annotations

import dataclasses
import filecmp
import json
import os
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from rmqstore import Message, MessageBatch, MessageStore, StoreConfig
from rmqstore.broker.process import free_port
from rmqstore.store.state.failure import FailureKind
from rmqstore.store.ha import protocol
from rmqstore.store.ha.transfer import GroupTransfer
from rmqstore.store.format.message import PutMessageStatus as S

from conftest import run_cli

FILE = 64 * 1024


def master_cfg(port: int, role: str = "SYNC_MASTER", **kw) -> StoreConfig:
    return StoreConfig(broker_role=role, ha_listen_port=port,
                       mapped_file_size_commit_log=kw.pop("mapped_file_size_commit_log", FILE),
                       sync_flush_timeout=kw.pop("sync_flush_timeout", 3000),
                       ha_send_heartbeat_interval=kw.pop("ha_send_heartbeat_interval", 1000), **kw)


def slave_cfg(port: int, **kw) -> StoreConfig:
    return StoreConfig(broker_role="SLAVE", broker_id=1, ha_master_address=f"127.0.0.1:{port}",
                       mapped_file_size_commit_log=FILE, **kw)


def wait_for(cond, timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def wait_slave(m: MessageStore) -> None:
    wait_for(lambda: m.ha_status().slaves, what="the slave's first report")


def same_commitlog(a: Path, b: Path) -> None:
    """Every commitlog file of the master equals the slave's, byte for byte, over the master's written range."""
    names = sorted(os.listdir(a / "commitlog"))
    assert names, "master has no commitlog"
    for n in names:
        assert filecmp.cmp(a / "commitlog" / n, b / "commitlog" / n, shallow=False), n


def read_all(store: MessageStore, topic: str, qid: int, start: int = 0) -> list:
    out, q = [], start
    while True:
        r = store.get_message("g", topic, qid, q, 32)
        if not r.messages:
            return out
        out += r.messages
        q = r.next_begin_offset


def caught_up(m: MessageStore, s: MessageStore) -> bool:
    return s.commit_log.get_max_offset() == m.commit_log.get_max_offset()


@pytest.fixture
def pair(tmp_path):
    """pair(master_kw, slave_kw) -> (master, slave), closed at the end."""
    opened = []

    def make(role="SYNC_MASTER", master_kw=None, slave_kw=None, start_slave=True):
        port = free_port()
        m = MessageStore.open(tmp_path / "m", master_cfg(port, role, **(master_kw or {})))
        opened.append(m)
        s = None
        if start_slave:
            s = MessageStore.open(tmp_path / "s", slave_cfg(port, **(slave_kw or {})))
            opened.append(s)
            wait_slave(m)
        return m, s, port
    yield make
    for st in reversed(opened):
        st.close()


def test_sync_master_answers_after_the_slave_on_every_put_path(pair, tmp_path):
    m, s, _ = pair(master_kw={"flush_disk_type": "SYNC_FLUSH"})
    r = m.put_message(Message("T", b"one", properties={"KEYS": "k-one"}))
    assert r.status is S.PUT_OK
    assert s.commit_log.get_max_offset() >= r.wrote_end       # acknowledged = on the slave
    rs = m.put_messages([Message("T", b"batch%d" % i, queue_id=i % 2) for i in range(5)])
    assert [x.status for x in rs] == [S.PUT_OK] * 5
    big = m.put_messages(MessageBatch("T", [b"col%d" % i for i in range(200)], queue_ids=[i % 4 for i in range(200)]))
    assert big.all_ok and s.commit_log.get_max_offset() >= big.stored_end
    # group commit from several threads (SYNC_FLUSH): each answer waits for its own bytes on the slave
    out: list = []

    def producer(k: int) -> None:
        for i in range(30):
            x = m.put_message(Message("T", b"t%d-%d" % (k, i), queue_id=k))
            out.append((x.status, x.wrote_end, s.commit_log.get_max_offset()))
    threads = [threading.Thread(target=producer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {st for st, _, _ in out} == {S.PUT_OK}
    wait_for(lambda: caught_up(m, s))
    assert s.wait_dispatched(10) and m.wait_dispatched(10)       # both read through their own consume queues
    for qid in range(4):
        assert [x.body for x in read_all(s, "T", qid)] == [x.body for x in read_all(m, "T", qid)]
    assert len(read_all(s, "T", 0)) > 50
    assert [x.body for x in s.find_messages_by_key("T", "k-one")] == [b"one"]
    m.close()
    s.close()
    same_commitlog(tmp_path / "m", tmp_path / "s")


def test_sync_master_without_slave_answers_slave_not_available_at_once(pair):
    m, _, _ = pair(start_slave=False)
    t = time.monotonic()
    r = m.put_message(Message("T", b"x"))
    assert r.status is S.SLAVE_NOT_AVAILABLE and time.monotonic() - t < 1
    assert r.append_result is not None                    # stored on the master all the same
    assert m.wait_dispatched(5) and m.get_message("g", "T", 0, 0, 1).messages[0].body == b"x"
    assert [x.status for x in m.put_messages([Message("T", b"y"), Message("T", b"z")])] == [S.SLAVE_NOT_AVAILABLE] * 2


def test_wait_false_and_async_master_answer_at_once(pair):
    m, s, _ = pair(role="SYNC_MASTER", start_slave=False)
    assert m.put_message(Message("T", b"w", properties={"WAIT": "false"})).status is S.PUT_OK
    m.close()


def test_async_master_replicates_behind(pair, tmp_path):
    m, s, _ = pair(role="ASYNC_MASTER")
    rs = m.put_messages([Message("A", b"m%d" % i) for i in range(300)])
    assert all(r.status is S.PUT_OK for r in rs)
    wait_for(lambda: caught_up(m, s), what="the slave to catch up")
    wait_for(lambda: m.ha_status().acked == m.commit_log.get_max_offset(), what="the acknowledgement")


def test_slave_refuses_puts_on_every_library_path(pair):
    _, s, _ = pair()
    assert s.put_message(Message("T", b"x")).status is S.SERVICE_NOT_AVAILABLE
    assert {r.status for r in s.put_messages([Message("T", b"x")] * 3)} == {S.SERVICE_NOT_AVAILABLE}
    rs = s.put_messages(MessageBatch("T", [b"c"] * 40))
    assert {r.status for r in rs} == {S.SERVICE_NOT_AVAILABLE}
    assert "SLAVE" in s.put_message(Message("T", b"x")).reason


def test_frames_cut_records_anywhere_and_a_full_file_ends_in_a_replicated_blank(pair, tmp_path):
    m, s, _ = pair(role="ASYNC_MASTER", master_kw={"ha_transfer_batch_size": 4096})
    for i in range(60):     # 5 KiB records: every frame ends inside one; 60 of them span several 64 KiB files
        assert m.put_message(Message("Big", bytes([i]) * 5000, properties={"KEYS": f"big{i}"})).ok
    wait_for(lambda: caught_up(m, s))
    assert s.wait_dispatched(10)
    assert [x.body[0] for x in read_all(s, "Big", 0)] == list(range(60))     # past every file end
    m.close()
    s.close()
    assert len(os.listdir(tmp_path / "m" / "commitlog")) >= 5
    same_commitlog(tmp_path / "m", tmp_path / "s")


def test_empty_slave_of_a_master_whose_log_starts_past_zero(tmp_path):
    """The master's first files were cleaned up: its log starts at a later file. RocketMQ 4.4.0's empty slave
    would get only the last file and never dispatch it; here it gets every file the master has and builds its
    queues from there."""
    port = free_port()
    with MessageStore.open(tmp_path / "m", master_cfg(port, "ASYNC_MASTER")) as m:
        for i in range(120):
            assert m.put_message(Message("Old", b"%04d" % i + b"." * 2000, properties={"KEYS": f"o{i}"})).ok
        first = m.commit_log.queue.files[0]
    (tmp_path / "m" / "commitlog" / first.path.name).unlink()          # as cleanup deletes an expired file
    with MessageStore.open(tmp_path / "m", master_cfg(port, "ASYNC_MASTER")) as m, \
            MessageStore.open(tmp_path / "s", slave_cfg(port)) as s:
        start = m.commit_log.get_min_offset()
        assert start > 0
        wait_for(lambda: caught_up(m, s))
        assert s.commit_log.get_min_offset() == start
        assert s.wait_dispatched(10)
        lo = s.get_min_offset_in_queue("Old", 0)
        hi = s.get_max_offset_in_queue("Old", 0)
        assert hi == 120 and 0 < lo < 120
        assert [int(x.body[:4]) for x in read_all(s, "Old", 0, lo)] == list(range(lo, 120))
        assert [x.body[:4] for x in s.find_messages_by_key("Old", "o119")] == [b"0119"]


def test_slave_restarted_resumes_from_its_own_end(tmp_path):
    port = free_port()
    with MessageStore.open(tmp_path / "m", master_cfg(port, "ASYNC_MASTER")) as m:
        with MessageStore.open(tmp_path / "s", slave_cfg(port)) as s:
            m.put_messages([Message("R", b"a%d" % i) for i in range(100)])
            wait_for(lambda: caught_up(m, s))
        m.put_messages([Message("R", b"b%d" % i) for i in range(100)])       # while the slave is down
        with MessageStore.open(tmp_path / "s", slave_cfg(port)) as s:
            wait_for(lambda: caught_up(m, s))
            wait_for(lambda: [c.reported for c in m.ha_status().slaves] == [m.commit_log.get_max_offset()],
                     what="the restarted slave's report")
            assert s.wait_dispatched(10)
            assert [x.body for x in read_all(s, "R", 0)][-1] == b"b99"
    same_commitlog(tmp_path / "m", tmp_path / "s")


def test_slave_ahead_of_its_master_stops_loudly_and_ha_truncate_ends_it(tmp_path):
    """The master lost its last records (as after a power cut): the slave holds bytes the master does not.
    Both say so; nothing is appended; `rmqstore ha-truncate` cuts the slave back, keeping the cut bytes."""
    port = free_port()
    with MessageStore.open(tmp_path / "m", master_cfg(port, "ASYNC_MASTER")) as m, \
            MessageStore.open(tmp_path / "s", slave_cfg(port)) as s:
        rs = m.put_messages([Message("D", b"r%d" % i) for i in range(50)])
        wait_for(lambda: caught_up(m, s))
    keep = rs[29].wrote_end
    mf = m.commit_log.queue.files[0]
    with open(tmp_path / "m" / "commitlog" / mf.path.name, "r+b") as f:   # the master loses records 30..49
        f.seek(keep)
        f.write(b"\0" * (rs[-1].wrote_end - keep))
    (tmp_path / "m" / "abort").write_bytes(b"")
    with MessageStore.open(tmp_path / "m", master_cfg(port, "ASYNC_MASTER")) as m:
        assert m.commit_log.get_max_offset() == keep
        with MessageStore.open(tmp_path / "s", slave_cfg(port)) as s:
            wait_for(lambda: s.failures.condition("ha.diverged") is not None, what="the slave's divergence")
            why = s.failures.condition("ha.diverged")
            assert why.kind is FailureKind.REPLICA and str(keep) in why.reason
            wait_for(lambda: any(f.kind is FailureKind.REPLICA for f in m.failures.blocking()),
                     what="the master's report")
            assert s.ha_status().diverged
            m.put_messages([Message("D", b"new%d" % i) for i in range(10)])     # not appended to the slave
            time.sleep(0.5)
            assert s.commit_log.get_max_offset() == rs[-1].wrote_end
            assert m.ha_status().acked < m.commit_log.get_max_offset()
        slave_conf = tmp_path / "s.conf"
        slave_conf.write_text(f"mappedFileSizeCommitLog={FILE}\nbrokerRole=SLAVE\nbrokerId=1\n")
        out = run_cli("ha-truncate", "-c", str(slave_conf), "--master", f"127.0.0.1:{port}", str(tmp_path / "s"))
        assert out.returncode == 0, out.stderr
        res = json.loads(out.stdout)
        assert res["cutAt"] == keep and res["cutBytes"] == rs[-1].wrote_end - keep
        kept = b"".join((tmp_path / "s" / q).read_bytes() for q in res["quarantined"])
        assert kept.count(b"r49") == 1 and len(kept) == res["cutBytes"]
        with MessageStore.open(tmp_path / "s", slave_cfg(port)) as s:
            wait_for(lambda: caught_up(m, s))
            assert s.failures.condition("ha.diverged") is None
            assert s.wait_dispatched(10)
            assert [x.body for x in read_all(s, "D", 0, 28)] == [b"r28", b"r29"] + [b"new%d" % i for i in range(10)]
    same_commitlog(tmp_path / "m", tmp_path / "s")


def test_slave_pointed_at_another_master_stops_and_ha_truncate_ends_it(tmp_path):
    """Another master with a longer, different log. RocketMQ's slave would append its bytes after its own;
    this one compares its last bytes with the master's copy of them, stops and says so."""
    p1, p2 = free_port(), free_port()
    with MessageStore.open(tmp_path / "m1", master_cfg(p1, "ASYNC_MASTER")) as m1, \
            MessageStore.open(tmp_path / "s", slave_cfg(p1)) as s:
        m1.put_messages([Message("J", b"a" * 100) for _ in range(20)])
        wait_for(lambda: caught_up(m1, s))
        end = s.commit_log.get_max_offset()
    with MessageStore.open(tmp_path / "m2", master_cfg(p2, "ASYNC_MASTER")) as m2:
        m2.put_messages([Message("OtherTopic", b"b" * 77) for _ in range(60)])
        with MessageStore.open(tmp_path / "s", slave_cfg(p2)) as s:
            wait_for(lambda: s.failures.condition("ha.diverged") is not None, what="divergence")
            assert "differs from this slave" in s.failures.condition("ha.diverged").reason
            assert s.commit_log.get_max_offset() == end
        out = run_cli("ha-truncate", "--to", "0", "--dry-run", str(tmp_path / "s"), "-c", str(_conf(tmp_path)))
        assert out.returncode == 0 and json.loads(out.stdout)["cutAt"] == 0
        # the way out compares whole files: the other master's log differs from byte 0 on (its records' first
        # bytes may well be equal), so everything is cut and kept aside, then the slave copies m2's log
        out = run_cli("ha-truncate", "--master", f"127.0.0.1:{p2}", str(tmp_path / "s"), "-c", str(_conf(tmp_path)))
        res = json.loads(out.stdout)
        assert out.returncode == 0 and res["commonPrefix"] < 100 and res["cutAt"] == 0 and res["cutBytes"] == end
        with MessageStore.open(tmp_path / "s", slave_cfg(p2)) as s:
            wait_for(lambda: caught_up(m2, s))
            assert s.failures.condition("ha.diverged") is None
    same_commitlog(tmp_path / "m2", tmp_path / "s")


def _conf(tmp_path: Path) -> Path:
    p = tmp_path / "slave.conf"
    p.write_text(f"mappedFileSizeCommitLog={FILE}\n")
    return p


def test_same_sized_records_of_a_master_that_lost_its_tail_are_found(tmp_path):
    """The master lost its last records (a power cut) and took new ones of the same size: the slave's end is
    a record boundary in the master's new log too, where a record names its own offset. Only the bytes
    themselves tell: the slave asks again for its last ones and compares."""
    port = free_port()
    mcfg = master_cfg(port, "ASYNC_MASTER")
    with MessageStore.open(tmp_path / "m", mcfg) as m, MessageStore.open(tmp_path / "s", slave_cfg(port)) as s:
        rs = m.put_messages([Message("Same", b"old%05d" % i) for i in range(50)])
        wait_for(lambda: caught_up(m, s))
    keep = rs[39].wrote_end
    with open(tmp_path / "m" / "commitlog" / f"{0:020d}", "r+b") as f:
        f.seek(keep)
        f.write(b"\0" * (rs[-1].wrote_end - keep))
    (tmp_path / "m" / "abort").write_bytes(b"")
    with MessageStore.open(tmp_path / "m", mcfg) as m:
        m.put_messages([Message("Same", b"new%05d" % i) for i in range(20)])     # same sizes as the lost ones
        with MessageStore.open(tmp_path / "s", slave_cfg(port)) as s:
            wait_for(lambda: s.failures.condition("ha.diverged") is not None, what="the divergence")
            assert "differs from this slave's" in s.failures.condition("ha.diverged").reason
            assert s.commit_log.get_max_offset() == rs[-1].wrote_end      # nothing appended


def test_a_file_size_that_differs_from_the_masters_is_refused_loudly(tmp_path):
    """mappedFileSizeCommitLog must be the master's: records would cross the slave's file ends. The slave
    stops and names the key; what it holds stays whole."""
    port = free_port()
    with MessageStore.open(tmp_path / "m", master_cfg(port, "ASYNC_MASTER", mapped_file_size_commit_log=2 * FILE)) \
            as m, MessageStore.open(tmp_path / "s", slave_cfg(port)) as s:
        m.put_messages([Message("Fs", b"z" * 500) for _ in range(300)])        # ~170 KiB: past the slave's 64 KiB
        wait_for(lambda: any("mappedFileSizeCommitLog" in f.reason for f in s.failures.failures()), 30,
                 "the slave's complaint")
        assert s.wait_dispatched(10)
    report = MessageStore.open(tmp_path / "s", StoreConfig(broker_role="SLAVE", broker_id=1,
                                                           mapped_file_size_commit_log=FILE), start_services=False)
    try:
        assert report.check().ok
    finally:
        report.close()


def test_a_slave_with_a_write_buffer_writes_its_files(tmp_path):
    """transientStorePoolEnable (copied with the master's broker.conf) is ignored on a slave, as RocketMQ
    ignores it: the replicated bytes reach the files (they stayed in a buffer that was never committed)."""
    port = free_port()
    with MessageStore.open(tmp_path / "m", master_cfg(port, "SYNC_MASTER")) as m, \
            MessageStore.open(tmp_path / "s", slave_cfg(port, transient_store_pool_enable=True)):
        wait_slave(m)
        assert {m.put_message(Message("Wb", b"w%d" % i)).status for i in range(50)} == {S.PUT_OK}
    same_commitlog(tmp_path / "m", tmp_path / "s")


def test_a_slave_behind_the_masters_oldest_file_is_told_and_reported(tmp_path):
    """Cleanup deleted the files a stopped slave lacks: both sides say so; the master does not count it as
    a slave (SLAVE_NOT_AVAILABLE at once, not a wait) and its loop goes on serving others."""
    port = free_port()
    mcfg = master_cfg(port, "SYNC_MASTER")
    with MessageStore.open(tmp_path / "m", mcfg) as m, MessageStore.open(tmp_path / "s", slave_cfg(port)) as s:
        wait_slave(m)
        m.put_message(Message("Old", b"x"))
    with MessageStore.open(tmp_path / "m", dataclasses.replace(mcfg, broker_role="ASYNC_MASTER")) as m:
        m.put_messages([Message("Old", b"y" * 3000) for _ in range(60)])      # several files
        first = m.commit_log.queue.files[0].path
    first.unlink()                                                           # as cleanup deletes it
    with MessageStore.open(tmp_path / "m", mcfg) as m, MessageStore.open(tmp_path / "s", slave_cfg(port)) as s:
        wait_for(lambda: s.failures.condition("ha.diverged") is not None, what="the slave's report")
        assert "oldest file" in s.failures.condition("ha.diverged").reason
        wait_for(lambda: m.ha_status().slave_problems, what="the master's report")
        assert "oldest file" in m.ha_status().to_kv()["haSlaveDiverged"]
        t = time.monotonic()
        assert m.put_message(Message("Old", b"z")).status is S.SLAVE_NOT_AVAILABLE and time.monotonic() - t < 1


def test_bytes_damaged_on_the_way_are_fetched_again(tmp_path):
    """A proxy between master and slave damages the first record it carries (its magic code), once: the
    slave's dispatcher finds it, the slave cuts its log there and takes the master's bytes again; the logs
    end equal and nothing was skipped."""
    port, relay = free_port(), free_port()
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", relay))
    srv.listen(8)
    damaged = threading.Event()

    def pipe(a, b, flip: bool) -> None:
        try:
            while True:
                data = a.recv(1 << 16)
                if not data:
                    break
                if flip and not damaged.is_set() and len(data) > 40:
                    data = bytearray(data)
                    data[12 + 4 + 2] ^= 0x10                    # the first record's magic code, after the header
                    damaged.set()
                b.sendall(bytes(data))
        except OSError:
            pass
        finally:
            a.close()
            b.close()

    def relay_loop() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", port))
            threading.Thread(target=pipe, args=(c, up, False), daemon=True).start()
            threading.Thread(target=pipe, args=(up, c, True), daemon=True).start()
    threading.Thread(target=relay_loop, daemon=True).start()
    try:
        with MessageStore.open(tmp_path / "m", master_cfg(port, "ASYNC_MASTER")) as m:
            m.put_messages([Message("Way", b"v%03d" % i) for i in range(100)])
            with MessageStore.open(tmp_path / "s", slave_cfg(relay)) as s:
                wait_for(lambda: damaged.is_set() and caught_up(m, s), 30, "the slave to fetch again")
                assert s.wait_dispatched(10)
                assert not [f for f in s.failures.failures() if f.kind is FailureKind.CORRUPT_RECORD]
                assert [x.body for x in read_all(s, "Way", 0)] == [b"v%03d" % i for i in range(100)]
    finally:
        srv.close()
    same_commitlog(tmp_path / "m", tmp_path / "s")


# --- the HA port against hostile peers ----------------------------------------------------------------
def _room_for(n: int) -> int:
    """n connections (both ends in this process) within the open-file limit, raised where the hard one allows."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2 * n + 512
    if soft < want and (hard == resource.RLIM_INFINITY or hard > soft):
        resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return max(100, min(n, (soft - 512) // 2))


def _connect(port: int) -> socket.socket:
    c = socket.create_connection(("127.0.0.1", port), timeout=5)
    c.settimeout(5)
    return c


def test_hostile_peers_on_the_ha_port_never_stop_the_master(pair):
    m, s, port = pair(master_kw={"sync_flush_timeout": 10000})   # about the master surviving, not latency
    peers = []
    for payload in (b"\xff" * 8,                                   # a negative offset: closed
                    struct.pack(">q", 1 << 62),                   # past the end: diverged, nothing sent
                    b"garbage that is not a multiple of eight",   # reads as offsets; no crash
                    b""):                                         # connects and says nothing
        c = _connect(port)
        if payload:
            c.sendall(payload)
        peers.append(c)
    many = [_connect(port) for _ in range(_room_for(1500))]     # past the server's 1,000: those are closed
    assert m.put_message(Message("H", b"still ok")).status is S.PUT_OK       # the real slave acknowledges
    c = peers[0]
    assert c.recv(16) == b""                                      # the negative offset was refused
    assert m.ha_status().slaves and all(x.reported >= 0 for x in m.ha_status().slaves)
    for c in many + peers:
        c.close()
    t0 = time.monotonic()
    rs = [m.put_message(Message("H", b"after")) for _ in range(50)]
    assert {r.status for r in rs} == {S.PUT_OK} and time.monotonic() - t0 < 10


def test_a_silent_peer_does_not_count_as_a_slave(pair):
    """RocketMQ counts a connection as a slave from accept: a peer that says nothing makes each SYNC_MASTER
    put wait its whole timeout. Here it counts from its first report: SLAVE_NOT_AVAILABLE at once."""
    m, _, port = pair(start_slave=False)
    c = _connect(port)
    try:
        t = time.monotonic()
        assert m.put_message(Message("T", b"x")).status is S.SLAVE_NOT_AVAILABLE
        assert time.monotonic() - t < 1
    finally:
        c.close()


def test_a_slave_that_stops_acknowledging_gets_flush_slave_timeout_and_others_go_on(pair):
    m, _, port = pair(start_slave=False, master_kw={"sync_flush_timeout": 700})
    c = _connect(port)
    c.sendall(struct.pack(">q", 0))         # a slave at 0 that never reports again (frozen)
    wait_slave(m)
    t = time.monotonic()
    r = m.put_message(Message("T", b"x"))
    assert r.status is S.FLUSH_SLAVE_TIMEOUT and 0.6 < time.monotonic() - t < 5
    # the wait of one producer does not hold the others (RocketMQ's single send thread would)
    done: list = []
    threads = [threading.Thread(target=lambda: done.append(m.put_message(Message("T", b"y")).status))
               for _ in range(8)]
    t = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert done == [S.FLUSH_SLAVE_TIMEOUT] * 8 and time.monotonic() - t < 3
    c.close()


def test_a_peer_claiming_bytes_it_was_never_sent_does_not_acknowledge(pair):
    """RocketMQ's master takes a slave's report as its acknowledgement: a peer (or a diverged slave) reporting
    a large offset makes a SYNC_MASTER answer PUT_OK for bytes no slave holds. Here an acknowledgement counts
    only up to what the connection was sent."""
    m, _, port = pair(start_slave=False, master_kw={"sync_flush_timeout": 700})
    c = _connect(port)
    c.sendall(struct.pack(">q", 0))
    wait_slave(m)
    c.sendall(struct.pack(">q", 1 << 40))        # "I hold a terabyte" (it was sent nothing)
    time.sleep(0.3)
    assert m.put_message(Message("T", b"x")).status in (S.FLUSH_SLAVE_TIMEOUT, S.SLAVE_NOT_AVAILABLE)
    c.close()
    # a peer that learnt the master's end and reports it first holds nothing it was sent either
    end = m.commit_log.get_max_offset()
    c = _connect(port)
    c.sendall(struct.pack(">q", end))
    wait_slave(m)
    rs = [m.put_message(Message("T", b"y")) for _ in range(3)]
    assert {r.status for r in rs} == {S.FLUSH_SLAVE_TIMEOUT}
    c.close()


# --- the pure parts ------------------------------------------------------------------------------------
def test_protocol_round_trip_and_limits():
    frames = protocol.encode_frames(100, b"x" * 10000, 4096)
    stream = b"".join(bytes(f) for f in frames) + protocol.encode_header(10100, 0)
    dec = protocol.FrameDecoder(4096)
    got = []
    for i in range(0, len(stream), 7):          # fed 7 bytes at a time
        got += dec.feed(stream[i:i + 7])
    assert [(f.offset, len(f.data)) for f in got] == [(100, 4096), (4196, 4096), (8292, 1808), (10100, 0)]
    with pytest.raises(protocol.ProtocolError):
        protocol.FrameDecoder(4096).feed(protocol.encode_header(0, 4097))
    with pytest.raises(protocol.ProtocolError):
        protocol.FrameDecoder(4096).feed(protocol.encode_header(-1, 0))
    assert protocol.last_report(struct.pack(">qq", 5, 9) + b"\x00\x01") == (9, 16)
    assert protocol.last_report(b"\x00" * 7) == (None, 0)
    with pytest.raises(protocol.ProtocolError):
        protocol.last_report(struct.pack(">q", -5))


def test_group_transfer_rules():
    g = GroupTransfer(fallbehind_max=1000, timeout_ms=200)
    assert g.wait(10) is S.SLAVE_NOT_AVAILABLE               # no slave
    g.slave_connected()
    assert g.wait(5000) is S.SLAVE_NOT_AVAILABLE             # more than haSlaveFallbehindMax behind
    got = []
    g.when_acked(500, got.append)
    g.when_acked(900, got.append)
    g.acknowledge(600)
    assert got == [S.PUT_OK]
    assert g.expire(time.monotonic() + 1) == 1 and got == [S.PUT_OK, S.FLUSH_SLAVE_TIMEOUT]
    g.when_acked(600, got.append)                            # already acknowledged
    assert got[-1] is S.PUT_OK


def test_slave_dispatch_racing_the_stream_never_reads_a_partial_record_as_damage(tmp_path):
    """The dispatcher reads up to the log's end while frames keep arriving: a record cut at the end of its
    read, whose rest arrives right after the read, is waited for, never skipped as damage (it was, when the
    end was taken after the read: a stream of 1,000-message batches lost units to filler)."""
    from rmqstore.store.ha import replica_log
    port = free_port()
    with MessageStore.open(tmp_path / "m", master_cfg(port, "ASYNC_MASTER")) as m:
        rs = m.put_messages([Message("Race", bytes([65 + i]) * 300) for i in range(10)])
        data = m.commit_log.get_data(0)[0]
    cut = rs[4].append_result.wrote_offset + 100          # inside the fifth record
    s = MessageStore.open(tmp_path / "s", slave_cfg(port), start_services=False)
    try:
        s.dispatcher.tail_grows = True
        replica_log.append(s.commit_log, 0, data[:cut])
        real = s.commit_log.get_data

        def read_then_frame_arrives(offset, max_bytes=4 << 20):
            got = real(offset, max_bytes)
            if s.commit_log.get_max_offset() == cut:      # the rest of the record lands right after the read
                replica_log.append(s.commit_log, cut, data[cut:])
            return got
        s.commit_log.get_data = read_then_frame_arrives
        s.dispatcher.do_reput()
        s.commit_log.get_data = real
        s.dispatcher.do_reput()
        assert not s.failures.failures()
        assert [x.body[0] for x in read_all(s, "Race", 0)] == [65 + i for i in range(10)]
    finally:
        s.close()


def test_a_stopped_slaves_directory_refuses_offline_writers_until_promoted(tmp_path, golden):
    """`rmqstore load` into a stopped slave's directory (without its broker.conf) would make it diverge from its
    master: refused, as the slave refuses puts; starting it as a master promotes it."""
    port = free_port()
    with MessageStore.open(tmp_path / "m", master_cfg(port, "ASYNC_MASTER")) as m, \
            MessageStore.open(tmp_path / "s", slave_cfg(port)) as s:
        m.put_message(Message("T", b"x"))
        wait_for(lambda: caught_up(m, s))
    line = json.dumps({"topic": "T", "body": b"offline".hex()})
    out = run_cli("load", "-c", str(_conf(tmp_path)), str(tmp_path / "s"), input=(line + "\n").encode())
    assert json.loads(out.stdout.splitlines()[0])["status"] == "SERVICE_NOT_AVAILABLE"
    assert b"SLAVE" in out.stderr
    with MessageStore.open(tmp_path / "s", StoreConfig(mapped_file_size_commit_log=FILE)) as s:    # no role: a slave
        assert s.put_message(Message("T", b"x")).status is S.SERVICE_NOT_AVAILABLE
    with MessageStore.open(tmp_path / "s", StoreConfig(broker_role="ASYNC_MASTER",
                                                       mapped_file_size_commit_log=FILE)) as s:    # promotion
        assert s.put_message(Message("T", b"now a master")).ok
    out = run_cli("load", "-c", str(_conf(tmp_path)), str(tmp_path / "s"), input=(line + "\n").encode())
    assert json.loads(out.stdout.splitlines()[0])["status"] == "PUT_OK"


def test_the_ha_port_admits_only_the_peers_it_is_told(tmp_path):
    """ha_accept (the broker sets ACL's globalWhiteRemoteAddresses test): a peer it refuses is closed at once
    and never counts as a slave."""
    port = free_port()
    m = MessageStore(tmp_path / "m", master_cfg(port))
    seen = []
    m.ha_accept = lambda peer: seen.append(peer) or False
    m.start()
    try:
        with MessageStore.open(tmp_path / "s", slave_cfg(port)):
            wait_for(lambda: seen, what="a connection attempt")
            time.sleep(0.3)
            assert not m.ha_status().slaves
            assert m.put_message(Message("T", b"x")).status is S.SLAVE_NOT_AVAILABLE
    finally:
        m.close()


def test_a_peer_silent_for_the_housekeeping_interval_is_closed_on_both_sides(pair, tmp_path):
    """haHousekeepingInterval on both ends (one timer per connection, not one per read): the master closes a
    slave that reported once and then says nothing; a slave closes a master that sends nothing (no data, no
    heartbeat) and connects again."""
    m, _, port = pair(start_slave=False, master_kw={"ha_housekeeping_interval": 1500})
    c = _connect(port)
    c.sendall(struct.pack(">q", 0))
    wait_slave(m)
    c.settimeout(15)
    t = time.monotonic()
    while c.recv(65536):        # heartbeats, then the close
        pass
    assert 1.4 < time.monotonic() - t < 10
    wait_for(lambda: not m.ha_status().slaves, what="the silent slave's connection to end")
    c.close()
    # a master that says nothing: the slave closes and connects again
    lsn = socket.socket()
    lsn.bind(("127.0.0.1", 0))
    lsn.listen(4)
    lsn.settimeout(15)
    s = MessageStore.open(tmp_path / "s2", slave_cfg(lsn.getsockname()[1], ha_housekeeping_interval=1500,
                                                     ha_send_heartbeat_interval=500))
    try:
        a, _ = lsn.accept()
        a.settimeout(15)
        assert len(a.recv(8)) == 8                  # its report
        t = time.monotonic()
        while a.recv(65536):    # its heartbeat reports, then the close
            pass
        assert 1.4 < time.monotonic() - t < 10
        b, _ = lsn.accept()                         # and the next connection
        b.close()
        a.close()
    finally:
        s.close()
        lsn.close()


def test_a_master_started_on_a_running_loop_replicates_there(tmp_path):
    """MessageStore.ha_loop (what `rmqstore serve` sets): a master's HA port runs on that loop, not in a
    thread of its own; SYNC_MASTER puts are answered after the slave's report, from any thread; close()
    ends it; a start called on the loop's own thread is refused (it would wait for itself)."""
    import asyncio
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    port = free_port()
    m = MessageStore(tmp_path / "m", master_cfg(port))
    m.ha_loop = loop
    s = None
    def ha_threads() -> set:
        return {t.ident for t in threading.enumerate() if t.name == "HAService"}
    try:
        before = ha_threads()           # (another test's may still be ending)
        m.start()
        assert m.ha.loop is loop and ha_threads() <= before
        s = MessageStore.open(tmp_path / "s", slave_cfg(port))
        wait_slave(m)
        assert [m.put_message(Message("T", b"x%d" % i)).status for i in range(50)] == [S.PUT_OK] * 50
        got: list = []
        m.ha.when_replicated(m.put_messages([Message("T", b"y")], wait_slave=False), got.append)
        wait_for(lambda: got, what="the callback")
        assert [r.status for r in got[0]] == [S.PUT_OK]
        # a put that waits for the slave, made on the loop itself: it cannot wait there (the loop reads the
        # slave's reports): answered at once, never PUT_OK before the slave acknowledged
        async def put_on_loop():
            t = time.monotonic()
            return m.put_message(Message("T", b"on the loop")).status, time.monotonic() - t
        status, took = asyncio.run_coroutine_threadsafe(put_on_loop(), loop).result(30)
        assert status in (S.PUT_OK, S.FLUSH_SLAVE_TIMEOUT) and took < 2.0, (status, took)
        wait_for(lambda: caught_up(m, s), what="the slave")
        m.close()
        assert not m.ha_status() and loop.is_running()
        same_commitlog(tmp_path / "m", tmp_path / "s")
        # started on the loop's own thread: refused with a reason, nothing left listening
        m2 = MessageStore(tmp_path / "m2", master_cfg(free_port()))
        m2.ha_loop = loop

        async def start_here():
            with pytest.raises(RuntimeError, match="another thread"):
                m2.start()
        asyncio.run_coroutine_threadsafe(start_here(), loop).result(30)
    finally:
        if s is not None:
            s.close()
        m.close()
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)
