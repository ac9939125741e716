"""Issue 19 item 7: what a newcomer trips over on the command line (help texts, `get -n 0`, the line and
column of a JSON error, a forgotten `-c`, progress bars only on a terminal). Each error: exit 2, one line."""
from __future__ import annotations

import json
import os
import pty
import subprocess
from pathlib import Path

import pytest

from conftest import rmqstore_cmd, run_cli


def _one_line(res: subprocess.CompletedProcess, *needles: str) -> str:
    err = res.stderr.decode("utf-8", "replace")
    assert res.returncode == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for n in needles:
        assert n in err, (n, err)
    return err


@pytest.fixture(scope="module")
def small_store(tmp_path_factory) -> tuple[Path, Path]:
    """A store written with 256 KiB commitlog files (3 of them), and its broker.conf."""
    d = tmp_path_factory.mktemp("newcomer")
    conf = d / "broker.conf"
    conf.write_text("mappedFileSizeCommitLog=262144\n")
    msgs = "".join(json.dumps({"topic": "T", "body": "00" * 100, "properties": {"KEYS": f"k{i}"}}) + "\n"
                   for i in range(3000))
    r = run_cli("load", "-c", conf, d / "store", input=msgs.encode())
    assert r.returncode == 0, r.stderr
    return d / "store", conf


def test_help_names_store_topic_and_exit_statuses():
    serve = run_cli("serve", "--help").stdout.decode()
    assert "STORE" in serve.split("\n\n")[0] and " store\n" not in serve
    get = run_cli("get", "--help").stdout.decode()
    assert "TOPIC" in get and "the topic whose queue is read" in get
    assert "exit status: 0" in get and "1 none found" in get
    query = run_cli("query", "--help").stdout.decode()
    assert "exit status: 0" in query and "1 no message" in query


def test_get_n_0_prints_nothing(small_store):
    store, conf = small_store
    r = run_cli("get", "-c", conf, store, "T", "0", "5", "-n", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout == b""
    status = json.loads(r.stderr.decode().strip().splitlines()[-1])
    assert status["count"] == 0 and status["nextBeginOffset"] == 5
    r = run_cli("get", "-c", conf, store, "T", "0", "5", "-n", "2")
    assert len(r.stdout.decode().splitlines()) == 2


@pytest.mark.parametrize("text,line,column,hint", [
    ('{"topic":"T","body":"00"}\n\n  {"topic": "T", "body": 00}\n', 3, 27, False),
    ('{"topic":"T","body":"00"}\n{"topic": "T", "body": "00",}\n', 2, 29, False),
    ('{\n  "topic": "T"\n}\n', 1, 2, True),                  # a pretty-printed file: it said "column 1"
    ('{"topic": "T", "body": "00"\n', 1, 28, True),
])
def test_load_json_error_names_the_real_line_and_column(tmp_path, text, line, column, hint):
    r = run_cli("load", tmp_path / "s", input=text.encode())
    err = _one_line(r, f"<stdin> line {line}: not JSON", f"at column {column})")
    assert ("each line must hold one whole message object" in err) is hint


@pytest.mark.parametrize("cmd", [["dump"], ["get", "T", "0", "0"], ["query", "T", "k1"], ["check"], ["rebuild"],
                                 ["clean"], ["load"], ["serve"]])
def test_a_forgotten_config_says_so_on_one_line(small_store, cmd):
    """Without -c the default 1 GiB geometry misreads a store of 256 KiB files: one line naming the file, its
    size and mappedFileSizeCommitLog, suggesting -c broker.conf (it said "at offset 262144" of file ...0000),
    with the value to set, in every command that opens a store (issue 40: only check, rebuild and load gave
    the value; stats reads such a store: test_cli_mistakes)."""
    store, conf = small_store
    before = sorted(p.relative_to(store) for p in store.rglob("*"))
    r = run_cli(cmd[0], store, *cmd[1:], input=b"" if cmd[0] == "load" else None, timeout=120)
    err = _one_line(r, "00000000000000000000: file size 262144 does not match mappedFileSizeCommitLog 1073741824",
                    "-c broker.conf (mappedFileSizeCommitLog=262144)")
    assert "at offset" not in err
    assert sorted(p.relative_to(store) for p in store.rglob("*")) == before     # rebuild removed nothing


def _stderr_through_a_terminal(*args: str) -> tuple[int, str]:
    """Run the CLI with stderr on a pseudo-terminal; (exit status, what it drew there)."""
    import fcntl
    import struct
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))     # a 100-column terminal
    try:
        p = subprocess.Popen([*rmqstore_cmd(), *map(str, args)], stdout=subprocess.DEVNULL, stderr=slave,
                             stdin=subprocess.DEVNULL)
        os.close(slave)
        out = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:              # EIO: the child closed its end
                break
            if not chunk:
                break
            out += chunk
        return p.wait(timeout=300), out.decode("utf-8", "replace")
    finally:
        os.close(master)


@pytest.mark.parametrize("cmd", ["check", "rebuild"])
def test_progress_bar_only_on_a_terminal(small_store, cmd):
    store, conf = small_store
    status, drawn = _stderr_through_a_terminal(cmd, "-c", conf, store)
    assert status == 0, drawn
    assert f"{cmd}: 100%" in drawn, drawn                        # tqdm's bar, on the terminal
    r = run_cli(cmd, "-c", conf, store)
    assert r.returncode == 0 and "100%" not in r.stderr.decode()  # a pipe: nothing drawn
