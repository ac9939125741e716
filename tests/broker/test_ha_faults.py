"""Replication under faults, with real processes: `rmqstore namesrv` and two `rmqstore serve` brokers
(a master and its slave), RocketMQ's client protocol through rmqstore.client.

- SIGKILL of the master under SYNC_MASTER sends: every message answered SEND_OK is consumed from the slave
  (failover: the consumer finds the slave in the route and pulls from it);
- SIGKILL of the slave mid-stream, writes while it is down (more than a commitlog file), a damaged record in
  its last file, restart: it resumes from its own end, its commitlog ends byte-equal to the master's and both
  stores dump the same;
- SIGSTOP of the slave: SYNC_MASTER sends answer FLUSH_SLAVE_TIMEOUT within syncFlushTimeout, concurrent
  producers are not serialised behind each other's waits, and SEND_OK comes back after SIGCONT.
"""
from __future__ import annotations

import contextlib
import filecmp
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from rmqstore.broker.process import NamesrvProcess, ServerProcess, sigstop
from rmqstore.client import Admin, Message, Producer, PushConsumer
from rmqstore.client.message import ConsumeFromWhere, ConsumeStatus, SendStatus

from conftest import run_cli

FILE = 256 * 1024


def conf(role: str, **kw) -> dict:
    c = {"brokerClusterName": "HaCluster", "brokerName": "broker-ha", "brokerRole": role,
         "brokerId": "1" if role == "SLAVE" else "0", "mappedFileSizeCommitLog": str(FILE),
         "autoCreateTopicEnable": "true"}
    c.update({k: str(v) for k, v in kw.items()})
    return c


def wait_for(cond, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def runtime(admin: Admin, addr: str) -> dict:
    try:
        return admin.broker_runtime_stats(addr)
    except Exception:
        return {}


def ha_view(ns, m) -> dict:
    """The master's HA figures (its slaves, what each acknowledged): what a failure message shows."""
    with Admin(ns.addr) as admin:
        return {k: v for k, v in runtime(admin, m.broker_addr).items() if k.startswith("haSlave")
                or k == "commitLogMaxOffset"}


def commitlog_equal(a: Path, b: Path) -> None:
    names = sorted(os.listdir(a / "commitlog"))
    assert names
    for n in names:
        assert filecmp.cmp(a / "commitlog" / n, b / "commitlog" / n, shallow=False), n


@pytest.fixture
def cluster(tmp_path):
    """cluster(master_role, **master_kw) -> (ns, master, slave_factory); everything stopped at the end."""
    procs: list = []

    def make(role: str = "SYNC_MASTER", topic: str = "HaT", **kw):
        ns = NamesrvProcess().start()
        procs.append(ns)
        m = ServerProcess(tmp_path / "m", conf(role, **kw), namesrv=False, namesrv_port=ns.port)
        procs.append(m)
        m.start()
        with Admin(ns.addr) as admin:
            admin.create_topic(topic, 4, broker_addr=m.broker_addr)
        s = ServerProcess(tmp_path / "s", conf("SLAVE", **kw), namesrv=False, namesrv_port=ns.port)
        procs.append(s)
        s.start()
        with Admin(ns.addr) as admin:
            wait_for(lambda: runtime(admin, m.broker_addr).get("haSlaveCount") == "1", what="the slave's link")
        # the slave took the topic from its master (SlaveSynchronize, at once when it learnt the master)
        wait_for(lambda: topic in (tmp_path / "s" / "config" / "topics.json").read_text()
                 if (tmp_path / "s" / "config" / "topics.json").exists() else False, what="slave sync")
        return ns, m, s
    yield make
    for p in reversed(procs):
        if isinstance(p, ServerProcess) and p.proc is not None and p.proc.poll() is None:
            try:
                os.kill(p.proc.pid, signal.SIGCONT)
            except OSError:
                pass
        p.stop()


def test_master_sigkill_under_sync_master_sends_loses_no_acknowledged_message(cluster):
    ns, m, s = cluster("SYNC_MASTER", syncFlushTimeout=3000)
    acked: list[str] = []
    stop = threading.Event()
    errors: list = []

    def send() -> None:
        with Producer("ha_pg", ns.addr, retry_times_when_send_failed=0, send_msg_timeout=4.0) as p:
            i = 0
            while not stop.is_set():
                key = f"hakey-{i}"
                i += 1
                try:
                    r = p.send(Message("HaT", b"payload-" + key.encode(), keys=key))
                except Exception as e:          # the master is gone: not acknowledged
                    errors.append(e)
                    time.sleep(0.05)
                    continue
                if r.send_status is SendStatus.SEND_OK:
                    acked.append(key)
    t = threading.Thread(target=send)
    t.start()
    wait_for(lambda: len(acked) >= 300, 60, "300 acknowledged sends")
    m.kill()                                    # SIGKILL, mid-stream
    time.sleep(1.0)
    stop.set()
    t.join(30)
    assert len(acked) >= 300
    seen: set[str] = set()
    c = PushConsumer("ha_failover_cg", ns.addr, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    c.subscribe("HaT", "*")
    c.register_message_listener(lambda msgs: (seen.update(k for x in msgs for k in x.keys), ConsumeStatus.CONSUME_SUCCESS)[1])
    c.start()
    try:
        wait_for(lambda: set(acked) <= seen, 90, "every acknowledged message from the slave")
    finally:
        c.shutdown()
    assert set(acked) <= seen


def test_slave_sigkill_downtime_and_damage_then_resumes_byte_equal(cluster, tmp_path):
    ns, m, s = cluster("ASYNC_MASTER")
    with Producer("ha_pg2", ns.addr) as p:
        for i in range(300):
            assert p.send(Message("HaT", b"a" * 700, keys=f"a{i}")).send_status is SendStatus.SEND_OK
        s.kill()                                            # SIGKILL mid-stream
        for i in range(600):                                # > 1 commitlog file (256 KiB) while it is down
            assert p.send(Message("HaT", b"b" * 700, keys=f"b{i}")).send_status is SendStatus.SEND_OK
    # a damaged record in the slave's last file (a flipped body byte: its CRC fails)
    files = sorted((tmp_path / "s" / "commitlog").iterdir())
    last = files[-1]
    data = bytearray(last.read_bytes())
    at = data.find(b"a" * 700)
    assert at > 0
    data[at + 100] ^= 0xFF
    last.write_bytes(bytes(data))
    s.start()
    with Admin(ns.addr) as admin:
        wait_for(lambda: runtime(admin, s.broker_addr).get("commitLogMaxOffset") ==
                 runtime(admin, m.broker_addr).get("commitLogMaxOffset"), 60, "the slave to catch up")
    assert list((tmp_path / "s" / "quarantine").iterdir())          # the damaged tail kept aside
    s.stop()
    m.stop()
    commitlog_equal(tmp_path / "m", tmp_path / "s")
    conf_file = tmp_path / "store.conf"
    conf_file.write_text(f"mappedFileSizeCommitLog={FILE}\n")
    dm = run_cli("dump", "-c", str(conf_file), str(tmp_path / "m"))
    ds = run_cli("dump", "-c", str(conf_file), str(tmp_path / "s"))
    assert dm.returncode == 0 and ds.returncode == 0, ds.stderr
    assert dm.stdout == ds.stdout and b"HaT" in dm.stdout


def test_frozen_slave_gives_flush_slave_timeout_and_others_are_not_serialised(cluster):
    rocketmq = pytest.importorskip("rocketmq")
    from rocketmq.grpc_protocol import Code
    ns, m, s = cluster("SYNC_MASTER", syncFlushTimeout=2000)
    g = rocketmq.Producer(rocketmq.ClientConfiguration(m.grpc_addr, rocketmq.Credentials(), request_timeout=10),
                          ("HaT",))
    g.startup()

    def grpc_send(body: bytes):
        msg = rocketmq.Message()
        msg.topic, msg.body = "HaT", body
        return g.send(msg)
    with contextlib.closing(_Shutdown(g)), Producer("ha_pg3", ns.addr, retry_times_when_send_failed=0,
                                                    send_msg_timeout=10.0) as p:
        assert grpc_send(b"before, 5.x").message_id           # the gRPC send answers once the slave holds it
        assert p.send(Message("HaT", b"before")).send_status is SendStatus.SEND_OK
        # what an operator sees: both brokers of the pair, each role, what the slave acknowledged
        out = run_cli("admin", "clusterList", "-n", ns.addr).stdout.decode()
        assert m.broker_addr in out and s.broker_addr in out
        out = run_cli("admin", "brokerStatus", "-n", ns.addr, "-b", m.broker_addr).stdout.decode()
        assert "SYNC_MASTER" in out and "haSlaveAckOffset" in out and "haSlaveBehindBytes" in out
        out = run_cli("admin", "brokerStatus", "-n", ns.addr, "-b", s.broker_addr).stdout.decode()
        assert "haConnected" in out and "true" in out
        sigstop(s.proc.pid)         # every thread stopped (the HA client's thread is not the one SIGSTOP wakes)
        try:
            t0 = time.monotonic()
            r = p.send(Message("HaT", b"frozen"))
            assert r.send_status is SendStatus.FLUSH_SLAVE_TIMEOUT, (r, ha_view(ns, m))
            assert 1.8 < time.monotonic() - t0 < 10
            got: list = []
            threads = [threading.Thread(target=lambda: got.append(p.send(Message("HaT", b"c")).send_status))
                       for _ in range(8)]
            t0 = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            # eight waits of 2 s each, side by side: not 16 s one after the other (RocketMQ's send thread)
            assert got == [SendStatus.FLUSH_SLAVE_TIMEOUT] * 8 and time.monotonic() - t0 < 10
            with pytest.raises(Exception) as e:                 # the 5.x client's send (it tries 3 times)
                grpc_send(b"frozen, 5.x")
            assert getattr(e.value, "code", None) == Code.SLAVE_PERSISTENCE_TIMEOUT, e.value
        finally:
            os.kill(s.proc.pid, signal.SIGCONT)
        wait_for(lambda: p.send(Message("HaT", b"after")).send_status is SendStatus.SEND_OK, 30, "SEND_OK again")


class _Shutdown:
    """contextlib.closing for the 5.x client's shutdown()."""
    def __init__(self, client):
        self.close = client.shutdown


def test_a_5x_client_reads_from_the_slave_over_grpc(cluster):
    """The official 5.x Python client against the slave's gRPC port: it receives what the master took; a
    send to the slave is refused."""
    rocketmq = pytest.importorskip("rocketmq")
    pytest.importorskip("rocketmq.grpc_protocol")
    ns, m, s = cluster("ASYNC_MASTER")
    with Producer("ha_pg4", ns.addr) as p:
        for i in range(100):
            assert p.send(Message("HaT", b"g%d" % i, keys=f"g{i}")).send_status is SendStatus.SEND_OK
    with Admin(ns.addr) as admin:
        wait_for(lambda: runtime(admin, s.broker_addr).get("commitLogMaxOffset") ==
                 runtime(admin, m.broker_addr).get("commitLogMaxOffset"), 60, "the slave to catch up")
    conf = rocketmq.ClientConfiguration(s.grpc_addr, rocketmq.Credentials(), request_timeout=10)
    c = rocketmq.SimpleConsumer(conf, "ha_grpc_cg", {"HaT": rocketmq.FilterExpression("*")}, await_duration=1)
    c.startup()
    got: set[bytes] = set()
    try:
        deadline = time.monotonic() + 60
        while len(got) < 100 and time.monotonic() < deadline:
            for msg in c.receive(32, 30):
                got.add(bytes(msg.body))
                c.ack(msg)
    finally:
        c.shutdown()
    assert got == {b"g%d" % i for i in range(100)}
    prod = rocketmq.Producer(conf, ("HaT",))
    prod.startup()
    try:
        msg = rocketmq.Message()
        msg.topic, msg.body = "HaT", b"to the slave"
        with pytest.raises(Exception):
            prod.send(msg)
    finally:
        prod.shutdown()


def test_a_slave_started_before_its_master_links_within_seconds(tmp_path):
    """A slave whose name server knows no master yet registers again every second (not every 30 s, the
    broker's registration period) until it learns of one: started first, it links soon after the master."""
    ns = NamesrvProcess().start()
    procs = [ns]
    try:
        s = ServerProcess(tmp_path / "s", conf("SLAVE"), namesrv=False, namesrv_port=ns.port)
        procs.append(s)
        s.start()
        with Admin(ns.addr) as admin:
            wait_for(lambda: runtime(admin, s.broker_addr).get("haRole") == "SLAVE", what="the slave")
            m = ServerProcess(tmp_path / "m", conf("SYNC_MASTER"), namesrv=False, namesrv_port=ns.port)
            procs.append(m)
            m.start()
            wait_for(lambda: runtime(admin, m.broker_addr).get("haSlaveCount") == "1", 12, "the slave's link")
    finally:
        for p in reversed(procs):
            p.stop()


def test_the_documented_pair_runs(tmp_path):
    """The pair of docs/replication.md, its commands as written (the default ports swapped for free ones), in a
    shell: the slave registers, takes the master's sends and holds them."""
    import re
    import subprocess
    import sys
    from rmqstore.broker.process import free_port, free_port_pair
    from conftest import doc_section
    block = next(b for b in re.findall(r"^```sh\n(.*?)^```", doc_section("A pair of brokers"), re.S | re.M)
                 if "rmqstore namesrv" in b)
    ns, mp, sp = free_port(), free_port_pair(), free_port_pair()
    script = block.replace("127.0.0.1:9876", f"127.0.0.1:{ns}").replace("10911", str(mp)).replace("10921", str(sp))
    script = script.replace("\\n' > master.conf", f"\\ngrpcListenPort=-1\\n' > master.conf").replace(
        "\\n' > slave.conf", f"\\ngrpcListenPort=-1\\n' > slave.conf")        # (8081: another test's)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    sh = subprocess.Popen(["bash", "-c", script + "\nwait"], cwd=tmp_path, env=env, start_new_session=True,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with Admin(f"127.0.0.1:{ns}") as admin:
            wait_for(lambda: runtime(admin, f"127.0.0.1:{mp}").get("haSlaveCount") == "1", 60, "the pair")
            with Producer("readme_pg", f"127.0.0.1:{ns}") as p:
                assert {p.send(Message("ReadmeTopic", b"m%d" % i)).send_status for i in range(20)} == \
                    {SendStatus.SEND_OK}
            wait_for(lambda: runtime(admin, f"127.0.0.1:{sp}").get("commitLogMaxOffset") ==
                     runtime(admin, f"127.0.0.1:{mp}").get("commitLogMaxOffset"), 30, "the slave")
            assert runtime(admin, f"127.0.0.1:{mp}")["haRole"] == "SYNC_MASTER"
            assert runtime(admin, f"127.0.0.1:{sp}")["haRole"] == "SLAVE"
    finally:
        os.killpg(sh.pid, signal.SIGTERM)
        sh.wait(30)


_ECHO_CHILD = r"""
import socket, sys, threading, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
def echo():
    while d := s.recv(16):
        s.sendall(d)
threading.Thread(target=echo, daemon=True).start()    # not the thread SIGSTOP wakes (the main one)
time.sleep(600)
"""


def test_sigstop_returns_once_no_thread_runs():
    """What the frozen-slave test relies on: after sigstop() no thread of the process answers. kill(SIGSTOP)
    alone let a second thread (as a slave's HA client) echo in about one try of six here."""
    import socket
    import subprocess
    import sys
    with socket.create_server(("127.0.0.1", 0)) as lsn:
        p = subprocess.Popen([sys.executable, "-c", _ECHO_CHILD, str(lsn.getsockname()[1])])
        try:
            c, _ = lsn.accept()
            with c:
                for i in range(30):
                    c.settimeout(10)
                    c.sendall(b"a")
                    assert c.recv(16) == b"a"
                    sigstop(p.pid)
                    c.sendall(b"b")
                    c.settimeout(0.1)
                    with pytest.raises(socket.timeout):
                        c.recv(16)
                    os.kill(p.pid, signal.SIGCONT)
                    c.settimeout(10)
                    assert c.recv(16) == b"b"
        finally:
            p.kill()
            p.wait()
