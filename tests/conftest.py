"""Shared fixtures: the golden stores written by RocketMQ 4.4.0, and writable copies of them.

The suite follows the package's folders: tests/store/ covers src/rmqstore/store/, tests/broker/ the broker,
and so on (`pytest tests/store` runs what covers the engine); the tests of the whole package (its import
graph and class sizes, README, packaging) stay here. What several folders use lives in this directory: this
conftest (golden fixtures, run_cli, local_spark, the `server` fixture, the order modules run in), store_checks
and sql92_cases, the child processes tests start, and data/. pyproject.toml puts tests/ on sys.path, so a test
in any folder imports them by name (`from conftest import run_cli`, `from store_checks import small_config`).

The golden data lives in $RMQSTORE_GOLDEN, else <repo>/../shared/golden. It is required: a missing
directory fails the tests that use it (it is never skipped).
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GOLDEN_SETS = ("rmq440-clean", "rmq440-crash", "rocketmq-sample-commitlog")


def doc_pages() -> list[Path]:
    """README.md (the front page) and the documentation site's pages (docs/**/*.md), in that order."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def doc_section(heading: str) -> str:
    """The text under the Markdown heading `heading` (any level) of README or a docs/ page, up to the next
    heading of its level or above (lines in code blocks are not headings). One page holds it."""
    found = []
    for page in doc_pages():
        lines, level, fence = page.read_text(encoding="utf-8").splitlines(), 0, False
        for i, line in enumerate(lines):
            fence ^= line.startswith("```")
            hashes = len(line) - len(line.lstrip("#"))
            if fence or not hashes or line[hashes:hashes + 1] != " ":
                continue
            if level and hashes <= level:
                found[-1] = (page, "\n".join(lines[start:i]))
                level = 0
            if not level and line[hashes + 1:].strip() == heading:
                level, start = hashes, i
                found.append((page, None))
        if level:
            found[-1] = (page, "\n".join(lines[start:]))
    assert len(found) == 1, f"heading {heading!r} in {[str(p.relative_to(REPO)) for p, _ in found] or 'no page'}"
    return found[0][1]


def golden_dir() -> Path:
    env = os.environ.get("RMQSTORE_GOLDEN")
    return Path(env) if env else (REPO / ".." / "shared" / "golden").resolve()


@pytest.fixture(scope="session")
def golden() -> Path:
    g = golden_dir()
    if not (g / "README.md").is_file() or not all((g / s).is_dir() for s in GOLDEN_SETS):
        pytest.fail(f"golden data not found at {g}: set RMQSTORE_GOLDEN or put it at <repo>/../shared/golden",
                    pytrace=False)
    return g


@pytest.fixture(scope="session")
def compare_tools(golden: Path) -> Path:
    tools = golden.parent / "tools"
    if not (tools / "compare_commitlog.py").is_file():
        pytest.fail(f"comparators not found in {tools}", pytrace=False)
    return tools


def golden_store(golden: Path, name: str) -> Path:
    """A set's store directory (the sample set has no store/: its directory is the commitlog dir)."""
    s = golden / name
    return s / "store" if (s / "store").is_dir() else s


def _make_writable(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        os.chmod(dirpath, os.stat(dirpath).st_mode | stat.S_IWUSR | stat.S_IRUSR | stat.S_IXUSR)
        for f in filenames:
            p = os.path.join(dirpath, f)
            os.chmod(p, os.stat(p).st_mode | stat.S_IWUSR | stat.S_IRUSR)


@pytest.fixture
def golden_copy(golden: Path, tmp_path: Path):
    """golden_copy(name) -> a writable copy (under tmp_path) of that set's store directory."""
    def copy(name: str) -> Path:
        dst = tmp_path / f"copy-{name}"
        shutil.copytree(golden_store(golden, name), dst)
        _make_writable(dst)
        return dst
    return copy


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def rmqstore_cmd() -> list[str]:
    return [sys.executable, "-m", "rmqstore"]


def run_cli(*args: str, input: bytes | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m rmqstore ARGS`, its output captured: a process forked from tests/cli_forkserver.py (the
    modules imported once), or a new interpreter with RMQSTORE_TEST_CLI=subprocess."""
    if os.environ.get("RMQSTORE_TEST_CLI") != "subprocess":
        import cli_forkserver
        got = cli_forkserver.run([str(a) for a in args], input, timeout)
        if got is not None:
            return got
    return subprocess.run([*rmqstore_cmd(), *map(str, args)], input=input, capture_output=True, timeout=timeout)


# Runtime SQL settings every Spark test module starts from (then its own): a module never inherits what an
# earlier module of the same pytest worker set on the shared session.
SPARK_SQL_DEFAULTS = {"spark.sql.shuffle.partitions": "2", "spark.sql.session.timeZone": "UTC",
                      "spark.sql.python.filterPushdown.enabled": "false",      # Spark's default
                      "spark.sql.streaming.pollingDelay": "10ms"}               # Spark's default


# Options of every Spark driver JVM the suite starts (local_spark, the drivers tests start as child processes,
# the documentation's Spark blocks): C1 only and the serial collector halve a JVM's start-up CPU on 2 cores,
# and Spark's jars (from PyPI) are not verified again class by class: 10.7 -> 9.1 s of CPU for a session's
# start, 7.4 -> 6.7 s for its first job (measured). The suite's jobs are small; the code under test is Python.
SPARK_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote"


# sitecustomize for Spark's Python worker daemons: they fork workers with pyspark.sql, numpy, pyarrow and the
# data source already imported (its docstring says why that is most of a failing Spark call's time here)
WORKER_PRELOAD = REPO / "tests" / "spark_worker_preload"


def with_worker_preload(pythonpath: str | None) -> str:
    """pythonpath with WORKER_PRELOAD first."""
    return os.pathsep.join(p for p in (str(WORKER_PRELOAD), pythonpath) if p)


def local_spark(app: str, **sql_conf: str):
    """This pytest worker's one local[2] SparkSession with the rocketmq source registered: getOrCreate, never
    stopped (a JVM costs ~10 s to start and ~10 s to warm up here; the next Spark module reuses it), with
    SPARK_SQL_DEFAULTS and then sql_conf (dotted Spark keys) set on it. A module's fixture:
    `return local_spark("rmqstore-test-x", **{"spark.sql.python.filterPushdown.enabled": "true"})`."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from rmqstore.spark import register
    # the JVM (started by the first module) and so its Python worker daemons see WORKER_PRELOAD first on their
    # PYTHONPATH; this process and its other children keep theirs
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = with_worker_preload(path)
    try:
        s = (SparkSession.builder.master("local[2]").appName(app)
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.extraJavaOptions", SPARK_JVM_OPTIONS)
             .getOrCreate())
    finally:
        if path is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = path
    s.sparkContext.setLogLevel("ERROR")
    for k, v in {**SPARK_SQL_DEFAULTS, **sql_conf}.items():
        s.conf.set(k, v)
    register(s)
    return s


def load_store(spark, root, **opts):
    """spark.read of the store at root with its config beside it (root.parent / "store.conf", written by the
    module's fixture) and the given options."""
    r = spark.read.format("rocketmq").option("config", str(root.parent / "store.conf"))
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load(str(root))


# --- `rmqstore serve` for a whole module -------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    """`rmqstore serve` (a real process: broker.server.ServerProcess) over a fresh store configured with the
    requesting module's CONF, for the whole module; it must stop cleanly (exit 0)."""
    from rmqstore.broker.server import ServerProcess
    name = request.module.__name__.rsplit(".", 1)[-1]
    srv = ServerProcess(tmp_path_factory.mktemp(name) / "store", request.module.CONF).start()
    try:
        yield srv
    finally:
        rc = srv.stop()
        assert rc == 0, srv.log_tail()


@pytest.fixture(scope="module")
def admin(server):
    """A started rmqstore.client Admin on the module's server (modules may define their own)."""
    from rmqstore.client import Admin
    a = Admin(server.namesrv_addr).start()
    try:
        yield a
    finally:
        a.shutdown()


# --- the order modules are handed to the workers ---------------------------------------------------------
# Seconds each module took in one `make test` run (three workers, a quiet 2-core machine); modules not listed
# count as 1 s. The Makefile passes --no-loadscope-reorder, so xdist hands modules out in collection order
# (spark_schedule.py: the Spark modules to one of the workers): longest first (LPT
# scheduling), the short ones last, and the workers finish together instead of one running a long module
# alone at the end. Only the order changes, never what runs.
MODULE_SECONDS = {
    "test_readme": 112, "test_fuzz_corruption": 107, "test_spark_write": 101, "test_spark_rebuild": 48,
    "test_ha_faults": 47, "test_spark_view": 45, "test_spark_jobs": 43, "test_grpc_proxy": 43,
    "test_kill_loop": 43, "test_benchsuite": 42, "test_spark_remote": 42, "test_client": 36, "test_check": 35,
    "test_spark_kafka_options": 31, "test_durability": 31, "test_grpc_bench": 28, "test_ha": 27,
    "test_put_path": 26, "test_spark_read": 24, "test_codec": 24, "test_cli_store": 24, "test_power_loss": 21,
    "test_package": 18, "test_sql92_grpc": 17, "test_server": 15, "test_admin_ops": 14, "test_crash": 14,
    "test_index_file": 14, "test_record_scanner": 14, "test_timer": 14, "test_docs": 13, "test_frame_limits": 12,
    "test_damage_range": 12, "test_spark_columns": 12, "test_fast_open": 12, "test_admin": 11,
    "test_timer_recovery": 11, "test_cli": 11, "test_cli_truth": 11, "test_spark_kafka_habits": 11,
    "test_consumer": 11, "test_read_only_commands": 10, "test_sql92_broker": 10, "test_schedule": 9,
    "test_architecture": 8, "test_rocketmq_issues": 8, "test_network_imports": 8, "test_acl_server": 8,
    "test_demo": 8, "test_delete_topic": 7, "test_damaged_topic": 7, "test_cli_newcomer": 7,
    "test_recovery_plan": 6, "test_store": 6, "test_pop": 6, "test_cli_mistakes": 6, "test_lock": 6,
    "test_commit_log": 5, "test_sql92": 5, "test_consume_queue_ext": 4, "test_spark_source": 4,
    "test_config_keys": 4, "test_cleanup": 4, "test_spark_pushdown": 4, "test_directory_in_place": 3,
    "test_stats_plot": 3, "test_spark_deleted": 3, "test_spark_records": 3, "test_put_truth": 3,
    "test_config_files": 3, "test_rebuild": 3, "test_derived_repair": 3, "test_validation": 3,
}


def pytest_collection_modifyitems(config, items):
    """Longest modules first (MODULE_SECONDS); a stable sort keeps each module's own order."""
    def module_seconds(item) -> int:
        return MODULE_SECONDS.get(Path(item.nodeid.split("::")[0]).stem, 1)
    items.sort(key=lambda item: -module_seconds(item))


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile with the Spark modules on at most two workers (spark_schedule.py)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from spark_schedule import SparkSessionScheduling
    return SparkSessionScheduling(config, log)
