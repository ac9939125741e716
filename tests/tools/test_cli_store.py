"""CLI commands over a whole store: dump, get, query, rebuild, and the lock message."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from conftest import golden_dir

GOLDEN = golden_dir()     # $RMQSTORE_GOLDEN, else ../shared/golden (conftest)
TOOLS = GOLDEN.parent / "tools"
CONF = str(GOLDEN / "rmq440-clean" / "store.conf")


def rmq(*args, check=True):
    r = subprocess.run([sys.executable, "-m", "rmqstore", *map(str, args)], capture_output=True, text=True,
                       timeout=120)
    if check:
        assert r.returncode == 0, r.stderr
    return r


@pytest.fixture
def clean_copy(tmp_path):
    out = tmp_path / "store"
    shutil.copytree(GOLDEN / "rmq440-clean" / "store", out)
    for p in [out, *out.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return out


def test_dump_equals_golden(clean_copy, tmp_path):
    r = rmq("dump", "-c", CONF, "--keys", GOLDEN / "rmq440-clean" / "keys.tsv", clean_copy)
    out = tmp_path / "dump.jsonl"
    out.write_text(r.stdout)
    cmp = subprocess.run([sys.executable, TOOLS / "compare_dump.py", GOLDEN / "rmq440-clean" / "dump.jsonl", out],
                         capture_output=True, text=True)
    assert cmp.returncode == 0, cmp.stdout


def test_get_and_query(clean_copy):
    r = rmq("get", "-c", CONF, clean_copy, "TopicB", 1, 5, "-n", 2)
    lines = [json.loads(l) for l in r.stdout.splitlines()]
    assert [m["queueOffset"] for m in lines] == [5, 6]
    status = json.loads(r.stderr.strip().splitlines()[-1])
    assert status["status"] == "FOUND" and status["nextBeginOffset"] == 7
    miss = rmq("get", "-c", CONF, clean_copy, "NoSuchTopic", 0, 0, check=False)
    assert miss.returncode == 1 and "NO_MATCHED_LOGIC_QUEUE" in miss.stderr
    q = rmq("query", "-c", CONF, clean_copy, "TopicB", "key-1212")
    found = [json.loads(l) for l in q.stdout.splitlines()]
    assert found and all(m["topic"] == "TopicB" and "key-1212" in m["properties"] for m in found)
    assert len({m["commitLogOffset"] for m in found}) == len(found)


def test_rebuild_prints_counts(clean_copy):
    r = rmq("rebuild", "-c", CONF, clean_copy)
    out = json.loads(r.stdout)
    assert out["messages"] == 3000 and out["queues"] == 16


def test_second_process_gets_clear_lock_error(clean_copy):
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from rmqstore.store.store import MessageStore\n"
        "from rmqstore.store.conf.config import StoreConfig\n"
        f"s = MessageStore.open({str(clean_copy)!r}, StoreConfig.load({CONF!r}))\n"
        "print('open', flush=True)\n"
        "sys.stdin.read()\n"
        "s.close()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        r = rmq("clean", "-c", CONF, clean_copy, check=False)       # a command that writes
        assert r.returncode == 2
        assert "locked by another process" in r.stderr and str(clean_copy) in r.stderr
        assert "Traceback" not in r.stderr
        r = rmq("dump", "-c", CONF, clean_copy, check=False)        # read commands read a store open elsewhere
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


def test_clean_force_deletes_old_files_and_moves_min(tmp_path):
    conf = tmp_path / "c.conf"
    conf.write_text("mapedFileSizeCommitLog=65536\nmapedFileSizeConsumeQueue=2000\n")
    store = tmp_path / "s"
    lines = "".join(json.dumps({"topic": "T", "queueId": 0, "body": "ab" * 1000}) + "\n" for _ in range(200))
    r = subprocess.run([sys.executable, "-m", "rmqstore", "load", "-c", conf, store], input=lines,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    files = sorted((store / "commitlog").iterdir())
    assert len(files) >= 3
    out = json.loads(rmq("clean", "-c", conf, "--force", store).stdout)
    assert json.dumps(out)  # a JSON report
    left = sorted((store / "commitlog").iterdir())
    assert len(left) < len(files) and left[-1].name == files[-1].name
    g = rmq("get", "-c", conf, store, "T", 0, 0, check=False)
    assert "OFFSET_TOO_SMALL" in g.stderr


def test_stats_local_counts_match_dump(tmp_path):
    png = tmp_path / "rates.png"
    r = rmq("stats", "-c", CONF, GOLDEN / "rmq440-clean" / "store", "--plot", png)
    rows = [json.loads(l) for l in r.stdout.splitlines()]
    queues = [json.loads(l) for l in open(GOLDEN / "rmq440-clean" / "dump.jsonl") if '"queue"' in l]
    assert {(q["queue"], q["queueId"]): q["max"] - q["min"] for q in queues} == \
        {(x["topic"], x["queueId"]): x["messages"] for x in rows}
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"


def _no_grpc_conf(tmp_path):
    """A broker.conf with the gRPC endpoint off (its default port 8081 may be another test's)."""
    conf = tmp_path / "broker.conf"
    conf.write_text("grpcListenPort=-1\n")
    return conf


def test_serve_refuses_a_listen_port_out_of_range(tmp_path):
    for bad in ("0", "70000"):
        r = subprocess.run([sys.executable, "-m", "rmqstore", "serve", str(tmp_path / "s"), "--listen-port", bad],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "listenPort" in r.stderr, r.stderr


def test_serve_starts_and_stops_cleanly_on_sigterm(tmp_path):
    import signal

    from rmqstore.broker.process import free_port, free_port_pair
    port, ns = free_port_pair(), free_port()
    store = tmp_path / "s"
    p = subprocess.Popen([sys.executable, "-m", "rmqstore", "serve", str(store), "--listen-port", str(port),
                          "--namesrv-addr", f"127.0.0.1:{ns}", "-c", str(_no_grpc_conf(tmp_path))],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert line, p.stderr.read() if p.wait(timeout=30) is not None else "no ready line"
        ready = json.loads(line)
        assert ready["event"] == "ready" and ready["broker"] == f"127.0.0.1:{port}"
        assert (store / "abort").exists()           # open: a crash now would mean recovery
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
        assert not (store / "abort").exists()       # clean shutdown
    finally:
        if p.poll() is None:
            p.kill()


def test_wrong_geometry_is_refused_not_repaired(tmp_path):
    """A store of 64 KiB files opened without its config must not have its files grown to 1 GiB."""
    conf = tmp_path / "c.conf"
    conf.write_text("mapedFileSizeCommitLog=65536\n")
    store = tmp_path / "s"
    r = subprocess.run([sys.executable, "-m", "rmqstore", "load", "-c", conf, store],
                       input=json.dumps({"topic": "T", "body": "00"}) + "\n", capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    r = rmq("dump", store, check=False)
    assert r.returncode == 2 and "another configuration" in r.stderr and "Traceback" not in r.stderr
    assert (store / "commitlog" / ("0" * 20)).stat().st_size == 65536


def test_server_process_first_start_survives_a_port_race(tmp_path):
    """A port picked free and then taken by someone else before the server binds it: the first start
    is retried on new ports (a CI run had failed with 'address already in use'); a restart is not."""
    import socket

    from rmqstore.broker.process import ServerProcess
    srv = ServerProcess(tmp_path / "s", {"grpcListenPort": "-1"})
    taken = srv.listen_port
    with socket.socket() as thief:
        thief.bind(("127.0.0.1", taken))
        thief.listen()
        with srv:
            assert srv.listen_port != taken and srv.ready["broker"] == srv.broker_addr
    with socket.socket() as thief:                      # the same object restarted: its ports are kept
        thief.bind(("127.0.0.1", srv.listen_port))
        thief.listen()
        with pytest.raises(RuntimeError, match="address already in use"):
            srv.start()
