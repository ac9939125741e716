"""`make demo` shows what the commands do: every `$ rmqstore ...` line the demo prints is followed by the
first lines of that very command's output (and a count of the rest), and every file it names exists."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path


def _blocks(lines: list[str]) -> list[tuple[str, list[str], int]]:
    """(command line, shown output lines, lines said not shown) for each `$ ` line of the demo's output."""
    out = []
    for i, line in enumerate(lines):
        if not line.startswith("$ "):
            continue
        shown, more = [], 0
        for nxt in lines[i + 1:]:
            if nxt == "" or nxt.startswith(("$ ", "== ")):
                break
            m = re.fullmatch(r"  \[\.\.\. (\d+) more lines\]", nxt)
            if m:
                more = int(m.group(1))
                break
            shown.append(nxt)
        out.append((line[2:], shown, more))
    return out


def _real(cmdline: str, cwd: Path) -> list[str]:
    argv = shlex.split(cmdline)
    stdin = None
    if "<" in argv:
        k = argv.index("<")
        stdin = (cwd / argv[k + 1]).read_text(encoding="utf-8")
        argv = argv[:k]
    if argv[0] == "ls":
        return sorted(os.listdir(cwd / argv[1]))
    assert argv[0] == "rmqstore", cmdline
    res = subprocess.run([sys.executable, "-m", "rmqstore", *argv[1:]], cwd=cwd, input=stdin,
                         capture_output=True, text=True, encoding="utf-8", timeout=120)
    assert res.returncode == 0, (cmdline, res.stderr)
    return res.stdout.splitlines()


def test_demo_commands_show_their_real_output(tmp_path, monkeypatch):
    from rmqstore.tools.demo import STORE, command_tour
    demo_dir, replay = tmp_path / "demo", tmp_path / "replay"
    demo_dir.mkdir()
    replay.mkdir()
    monkeypatch.chdir(demo_dir)
    printed: list[str] = []
    command_tour(STORE, out=printed.append)
    text = "\n".join(printed)
    blocks = _blocks(printed)
    assert [b[0].split()[:2] for b in blocks][:3] == [["rmqstore", "load"], ["rmqstore", "cat"],
                                                     ["ls", "demo-store/commitlog"]]
    for path in re.findall(r"(demo-store/[\w./-]+\.(?:jsonl|conf))", text):       # every file it names exists
        assert (demo_dir / path).is_file(), path
    # the writing command (load) is replayed on a fresh copy of its inputs; the others read the demo's store
    (replay / STORE).mkdir()
    for name in ("store.conf", "messages.jsonl"):
        shutil.copy(demo_dir / STORE / name, replay / STORE / name)
    for cmdline, shown, more in blocks:
        real = _real(cmdline, replay if " load " in f" {cmdline} " else demo_dir)
        assert shown == real[:len(shown)], cmdline
        assert len(shown) + more == len(real), (cmdline, len(shown), more, len(real))
    records = _real(f"rmqstore cat -c {STORE}/store.conf {STORE}", demo_dir)
    assert len(records) == 24


def test_demo_ends_by_saying_where_the_command_is(tmp_path, monkeypatch):
    """Issue 40 item 1: after `make demo`, `rmqstore --help` was "command not found": the demo now ends by
    naming the script beside its interpreter (.venv/bin when make runs it) and how to activate it."""
    from rmqstore.tools.demo import next_steps
    monkeypatch.chdir(Path(sys.executable).parent.parent.parent)     # the checkout, for .venv/bin/python
    printed: list[str] = []
    next_steps(out=printed.append)
    words = printed[-1].split("`")
    run, activate = words[1], words[3]
    assert run.endswith("/rmqstore --help") and Path(run.split()[0]).is_file(), printed
    assert activate.startswith("source ") and Path(activate.split()[1]).is_file(), printed
    r = subprocess.run(["bash", "-c", f"{activate} && rmqstore --version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("rmqstore "), r.stderr
