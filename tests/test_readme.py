"""The code of README.md and of the documentation (docs/**/*.md) runs as written: every ```python block, each
in a fresh interpreter; the shell session of docs/cli.md (its `$` lines run by bash from the repository, in
the virtualenv its first line activates, as a newcomer's shell would: nothing else puts `rmqstore` on the
PATH; what each prints, stdout and stderr as a terminal shows them, checked against the page); and the ```sh
blocks that run against a broker (`rmqstore admin`, here against a `rmqstore serve` of the test's own).
Blocks of other kinds show what is not run here: file contents (```properties, ```yaml) and, untagged, a
layout or a command's synopsis. The golden data is found where the pages say (../shared/golden) or through
$RMQSTORE_GOLDEN; the session's /tmp/s becomes a temporary directory."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, SPARK_JVM_OPTIONS, doc_pages, doc_section, with_worker_preload

# (page, kind, code) of every fenced block, README first
BLOCKS = [(str(page.relative_to(REPO)), lang, code) for page in doc_pages()
          for lang, code in re.findall(r"^```(\w*)\n(.*?)^```", page.read_text(encoding="utf-8"), re.S | re.M)]
PYTHON = [(page, code) for page, lang, code in BLOCKS if lang == "python"]
SESSIONS = [code for page, lang, code in BLOCKS if not lang and code.lstrip().startswith("$ ")]
SH = [code for page, lang, code in BLOCKS if lang == "sh"]
SHOWN = {"", "properties", "yaml"}      # kinds of block that only show (see the module docstring)
# ```sh blocks the suite cannot run as written, and why (any other sh block must run: test_sh_blocks_run)
NOT_RUN = {"mqadmin ": "RocketMQ's own Java tool (checked live against the real RocketMQ, not in the suite)",
           "rmqstore namesrv ": "the replication pair, run as written by test_ha_faults.test_the_documented_pair_runs",
           "printf ": "the replication pair's broker.conf files (test_ha_faults.test_the_documented_pair_runs)",
           "pip install ": "would reinstall the checkout into the suite's own virtualenv; "
                           "test_package installs built wheels into fresh ones"}
ACTIVATE = "source .venv/bin/activate"
STORE_TIME = re.compile(r'"storeTimestamp":\d+')     # the time of the test's own load: the one field that varies


def _env(path_python: bool = True) -> dict:
    """The commands' environment; path_python: this interpreter's bin first on the PATH (for code that
    starts `python`), else the PATH as the user has it (the shell session activates the virtualenv itself)."""
    env = dict(os.environ)
    if path_python:
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    else:
        env.pop("VIRTUAL_ENV", None)
        env["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep)
                                      if not (Path(d) / "rmqstore").exists())
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    # The JVM of a block that starts Spark lives one small job (conftest.SPARK_JVM_OPTIONS): an environment
    # setting, not a change to the code as written; the JVM reads it and says so on stderr.
    env.setdefault("JAVA_TOOL_OPTIONS", SPARK_JVM_OPTIONS)
    return env


def test_readme_has_the_blocks_this_test_runs():
    assert len(PYTHON) >= 4 and SESSIONS and PYTHON[0][0] == "README.md"


def test_every_block_is_run_or_only_shows():
    """A block of a kind this module neither runs nor counts as showing (```bash, ```console ...) would be
    passed over silently: name it sh or python, or add its kind to SHOWN with the reason."""
    assert {(page, lang) for page, lang, _ in BLOCKS if lang not in {"python", "sh"} | SHOWN} == set()


def _python_id(n: int) -> str:
    page = PYTHON[n][0]
    return f"{page}-{sum(1 for p, _ in PYTHON[:n + 1] if p == page)}"


@pytest.mark.parametrize("n", range(len(PYTHON)), ids=_python_id)
def test_python_block_runs_as_written(n, tmp_path):
    page, code = PYTHON[n]
    env = _env()
    if "pyspark" in code or "rmqstore.spark" in code:
        pytest.importorskip("pyspark")
        # the Python processes its JVM starts load conftest.WORKER_PRELOAD (as the suite's own Spark
        # session's do): an environment setting, as JAVA_TOOL_OPTIONS; 36 -> 27 s of CPU for docs/spark.md's
        env["PYTHONPATH"] = with_worker_preload(env.get("PYTHONPATH"))
    if "from rocketmq import" in code:
        pytest.importorskip("rocketmq.grpc_protocol")          # the `grpc` extra (RocketMQ 5 section)
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"{_python_id(n)} failed:\n{code}\n--- stderr ---\n{r.stderr[-3000:]}"
    assert r.stdout.strip(), f"{_python_id(n)} printed nothing"


def _steps(session: str) -> list[tuple[str, list[str]]]:
    steps: list[tuple[str, list[str]]] = []
    for line in session.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps and line.strip():
            steps[-1][1].append(line)
    return steps


def test_shell_session_runs_as_written(golden, tmp_path):
    """Each `$` line in bash from the repository, after the session's `source .venv/bin/activate` (the only
    way `rmqstore` is on its PATH: an un-activated shell has no `rmqstore`, issue 40); what it prints on
    stdout and stderr, in a terminal's order, is the page's sample (the store time aside)."""
    steps = _steps(SESSIONS[0])
    assert steps and steps[0] == (ACTIVATE, []), "the session starts by activating the virtualenv"
    assert (REPO / ".venv" / "bin" / "activate").is_file(), "no .venv: the pages' commands run after `make`"
    store = tmp_path / "s"
    for cmd, shown in steps[1:]:
        real = cmd.replace("/tmp/s", str(store)).replace("../shared/golden", str(golden))
        r = subprocess.run(["bash", "-o", "pipefail", "-c", f"{ACTIVATE} && {real}"], cwd=REPO,
                           env=_env(path_python=False), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=300)
        assert r.returncode == 0, f"{cmd}\n{r.stdout}"
        printed = STORE_TIME.sub('"storeTimestamp":T', r.stdout).splitlines()
        assert printed == [STORE_TIME.sub('"storeTimestamp":T', x) for x in shown], \
            f"{cmd}: the page shows\n{shown}\nthe command prints\n{r.stdout}"


def test_without_activation_the_command_is_not_there():
    """What the README's activation line is for: a shell with the user's PATH has no `rmqstore` (after
    `make`, it is in .venv/bin), and the README says so where it first names the command."""
    r = subprocess.run(["bash", "-c", "command -v rmqstore"], cwd=REPO, env=_env(path_python=False),
                       capture_output=True, text=True)
    assert r.returncode != 0, r.stdout
    install = doc_section("Install")
    assert ".venv/bin/rmqstore --help" in install and ACTIVATE in install


def _sh_commands(block: str) -> list[str]:
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_sh_blocks_run(tmp_path):
    """Every ```sh block runs as written, its addresses those of a `rmqstore serve` started here (the
    pages' are the defaults, 127.0.0.1:9876 and :10911), in the activated virtualenv; blocks of
    NOT_RUN's kinds are the exception, each for its reason."""
    from rmqstore.broker.server import ServerProcess
    runnable = [b for b in SH if not any(c.startswith(tuple(NOT_RUN)) for c in _sh_commands(b))]
    skipped = [b for b in SH if b not in runnable]
    assert runnable and all(all(c.startswith(tuple(NOT_RUN)) or c.startswith("rmqstore serve ") for c in
                                _sh_commands(b)) for b in skipped), skipped
    with ServerProcess(tmp_path / "store") as srv:
        for block in runnable:
            for cmd in _sh_commands(block):
                real = cmd.replace("127.0.0.1:9876", srv.namesrv_addr).replace("127.0.0.1:10911", srv.broker_addr)
                r = subprocess.run(["bash", "-o", "pipefail", "-c", f"{ACTIVATE} && {real}"], cwd=REPO,
                                   env=_env(path_python=False), capture_output=True, text=True, timeout=120)
                assert r.returncode == 0 and r.stdout.strip() and "Traceback" not in r.stderr, (cmd, r.stdout, r.stderr)
