"""Issue 40, items 3 and 4: what a user types wrong on the command line, run in a subprocess. A misspelt option
of a command is named alone, with the command's usage and the option it resembles (it printed the top-level
usage and "unrecognized arguments: --flsh STORE", blaming the store path too); a path that is not a store
is "not a store directory" for the commands that write as for those that read, and one holding a store in
store/ says so (serve answered "bad value 'README.md/config/broker.properties' ... Not a directory", load
"README.md: File exists", and serve over such a folder made a store beside its store/)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli


def _usage_error(r: subprocess.CompletedProcess, command: str) -> str:
    """The error line of an argparse usage error of `rmqstore COMMAND` (exit 2, its usage, one error line)."""
    err = r.stderr.decode()
    lines = err.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in err, err
    assert lines[0].startswith(f"usage: rmqstore {command} "), err
    assert lines[-1].startswith(f"rmqstore {command}: error: "), err
    return lines[-1]


def _one_line(r: subprocess.CompletedProcess) -> str:
    err = r.stderr.decode()
    assert r.returncode == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


def _safe(argv: list, tmp_path: Path) -> list:
    """serve's argv with free ports and no gRPC endpoint: should a refusal regress, the broker it starts
    takes no well-known port, and run_cli's timeout ends it."""
    if argv[0] != "serve":
        return argv
    import socket
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        ports = a.getsockname()[1], b.getsockname()[1]
    (tmp_path / "serve.conf").write_text("grpcListenPort=-1\n")
    return ["serve", "-c", str(tmp_path / "serve.conf"), "--listen-port", str(ports[0]),
            "--namesrv-addr", f"127.0.0.1:{ports[1]}", *argv[1:]]


def _tree(d: Path) -> list:
    return sorted((str(p.relative_to(d)), p.stat().st_size) for p in d.rglob("*"))


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("mistakes") / "store"
    msgs = "".join(json.dumps({"topic": "T", "body": "00" * 8}) + "\n" for _ in range(5))
    assert run_cli("load", d, input=msgs.encode()).returncode == 0
    return d


@pytest.mark.parametrize("argv,command,bad,near", [
    (["load", "--flsh", "sync", "{new}"], "load", "--flsh", "--flush"),
    (["get", "--limt", "3", "{store}", "T", "0", "0"], "get", "--limt", "--limit"),
    (["cat", "--limt", "2", "{store}"], "cat", "--limt", "--limit"),
    (["dump", "--kyes", "k.tsv", "{store}"], "dump", "--kyes", "--keys"),
    (["check", "--reapir", "{store}"], "check", "--reapir", "--repair"),
])
def test_a_misspelt_option_is_named_alone_with_its_near_match(store, tmp_path, argv, command, bad, near):
    argv = [a.format(store=store, new=tmp_path / "new") for a in argv]
    line = _usage_error(run_cli(*argv), command)
    assert line == f"rmqstore {command}: error: unrecognized option {bad} (did you mean {near}?)"
    assert not (tmp_path / "new").exists()                   # load created nothing


def test_extra_arguments_and_unknown_options_show_the_commands_usage(store):
    assert _usage_error(run_cli("cat", store, "extra"), "cat") == \
        "rmqstore cat: error: unrecognized arguments: extra (see rmqstore cat --help)"
    assert _usage_error(run_cli("stats", "--xyz", store), "stats") == \
        "rmqstore stats: error: unrecognized option --xyz (see rmqstore stats --help)"
    line = _usage_error(run_cli("admin", "clusterList", "-n", "127.0.0.1:1", "--bogus"), "admin clusterList")
    assert "unrecognized option --bogus" in line
    line = _usage_error(run_cli("load", "--flush", "snc", store), "load")
    assert "invalid choice: 'snc', did you mean 'sync'?" in line


def test_a_misspelt_command_gets_its_near_match():
    r = run_cli("lod", "x")
    err = r.stderr.decode()
    assert r.returncode == 2 and "invalid choice: 'lod', did you mean 'load'?" in err, err


def test_get_takes_limit_as_cat_does(store):
    r = run_cli("get", store, "T", "0", "1", "--limit", "2")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2, r.stderr


def test_version_is_the_packages():
    """The console script itself (not python -m): `rmqstore --version` is the installed distribution's."""
    from importlib.metadata import version
    exe = Path(sys.executable).parent / "rmqstore"
    r = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"rmqstore {version('rmqstore')}", r


@pytest.mark.parametrize("command", ["serve", "load"])
def test_a_file_is_not_a_store_to_write(tmp_path, command):
    (tmp_path / "w").mkdir()
    f = tmp_path / "w" / "README.md"
    f.write_text("# not a store\n")
    line = _one_line(run_cli(*_safe([command, f], tmp_path), input=b"", timeout=60))
    assert line == f"rmqstore {command}: not a store directory: {f} (a file)"
    assert _tree(tmp_path / "w") == [("README.md", 14)]


@pytest.mark.parametrize("argv", [["serve"], ["load"], ["dump"], ["cat"], ["stats"], ["check"], ["clean"],
                                  ["get", "@", "T", "0", "0"], ["query", "@", "T", "k"]])
def test_a_folder_holding_a_store_points_at_it(store, tmp_path, argv):
    """The layout of a golden set or a broker's storePathRootDir copy: the store is in STORE/store."""
    parent = tmp_path / "set"
    (parent / "store").mkdir(parents=True)
    os.rmdir(parent / "store")
    os.symlink(store, parent / "store")
    (parent / "messages.jsonl").write_text("")
    before = _tree(parent)
    argv = [a if a != "@" else str(parent) for a in argv] if "@" in argv else [*argv, str(parent)]
    line = _one_line(run_cli(*_safe(argv, tmp_path), input=b"", timeout=60))
    assert line == f"rmqstore {argv[0]}: not a store directory: {parent} (it holds a store: {parent / 'store'})"
    assert _tree(parent) == before                      # serve and load made no store beside it


def test_load_makes_a_store_in_a_new_empty_or_other_folder(tmp_path):
    """As RocketMQ's broker makes its store in any storePathRootDir (the demo keeps its inputs in its
    store's folder); only a file, or a folder holding store/, is refused."""
    (tmp_path / "inputs").mkdir()
    (tmp_path / "inputs" / "messages.jsonl").write_text("")
    (tmp_path / "empty").mkdir()
    for d in (tmp_path / "empty", tmp_path / "new", tmp_path / "inputs"):
        r = run_cli("load", d, input=b'{"topic": "T", "body": "00"}\n')
        assert r.returncode == 0 and (d / "commitlog").is_dir(), r.stderr


@pytest.mark.parametrize("argv", [["dump"], ["cat"], ["get", "T", "0", "0"]])
def test_reading_a_missing_path_or_a_file(tmp_path, argv):
    for path, why in ((tmp_path / "nope", "no such directory"), (Path(__file__), "a file")):
        line = _one_line(run_cli(argv[0], path, *argv[1:]))
        assert line == f"rmqstore {argv[0]}: not a store directory: {path} ({why})"


@pytest.mark.parametrize("conf,named", [
    ("mappedFileSizeCommitLog=262144\nmappedFileSizeConsumeQueue=6000\n",
     "commitlog/00000000000000000000: file size 262144 does not match mappedFileSizeCommitLog 1073741824: the store "
     "was written with another configuration; pass its broker.conf with -c broker.conf (mappedFileSizeCommitLog=262144)"),
    ("mappedFileSizeConsumeQueue=6000\n",
     "consumequeue/T/0/00000000000000000000: file size 6000 does not match mappedFileSizeConsumeQueue 6000000: the "
     "store was written with another configuration; pass its broker.conf with -c broker.conf "
     "(mappedFileSizeConsumeQueue=6000)"),
], ids=["commitlog-and-queues", "queues"])
def test_a_forgotten_config_is_the_same_line_in_every_command(tmp_path, conf, named):
    """stats named a consume queue file where the others named the commitlog's, and only check, rebuild and
    load gave the value to set: every command now says the same (the commitlog's when its files differ)."""
    (tmp_path / "broker.conf").write_text(conf)
    msgs = "".join(json.dumps({"topic": "T", "body": "00" * 100}) + "\n" for _ in range(400))
    assert run_cli("load", "-c", tmp_path / "broker.conf", tmp_path / "s", input=msgs.encode()).returncode == 0
    for argv in (["stats"], ["dump"], ["get", "T", "0", "0"], ["clean"]):
        line = _one_line(run_cli(argv[0], tmp_path / "s", *argv[1:]))
        assert line.startswith(f"rmqstore {argv[0]}: ") and line.endswith(named), (argv, line)
