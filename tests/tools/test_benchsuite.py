"""The comparison suite at its tiny scale: a well-formed report and a PNG (structure, not speed); RocketMQ
4.4.0's own store is measured in the same run when its reference benchmark is built, and the report says
plainly when it is not; small runs do not overwrite the committed full-scale report."""
from __future__ import annotations

import os
import re

import pytest

pytest.importorskip("matplotlib")


ROCKETMQ_ROWS = ("RocketMQ 4.4.0 putMessage (1 at a time", "RocketMQ 4.4.0 SYNC_FLUSH, 1 producer thread",
                 "RocketMQ 4.4.0 SYNC_FLUSH, 16 producer threads", "RocketMQ 4.4.0 putMessage 1 at a time, until")


def _compare_rows(md: str) -> list[list[str]]:
    body = md.split("| workload | RocketMQ 4.4.0 | rmqstore | rmqstore / RocketMQ | limit on this machine |\n"
                    "|---|---|---|---|---|\n", 1)[1].split("\n\n", 1)[0]
    return [[c.strip() for c in row.strip("|").split("|")] for row in body.splitlines()]


def test_benchsuite_tiny_writes_markdown_and_chart(tmp_path):
    from rmqstore.tools import benchsuite

    out, chart = tmp_path / "BENCHMARKS.md", tmp_path / "benchmarks" / "results.png"
    assert benchsuite.main(["--scale", "tiny", "--out", str(out), "--chart", str(chart),
                            "--work", str(tmp_path)]) == 0
    md = out.read_text()
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![results](benchmarks/results.png)" in md
    for word in ("## Machine", "nproc", "memory", "df -hT", "## Targets", "Scale: tiny"):
        assert word in md
    # one table per workload, each with a header, a separator and every row of three cells
    for title in ("Append: 3,000 messages of 100 B", "Append: 1,000 messages of 1024 B", "Sync-flush append",
                  "Consume everything by queue", "Key lookup", "Restart", "End to end", "Long polling"):
        assert f"## {title}" in md
    tables = re.findall(r"\| system \| figure\(s\) \| ratio to rmqstore \|\n\|---\|---\|---\|\n((?:\|.*\|\n)+)", md)
    assert len(tables) == 8
    for body in tables:
        rows = body.strip().splitlines()
        assert len(rows) >= 2
        for row in rows:
            assert row.count("|") - row.count("\\|") == 4, row
            assert "ERROR" not in row, row
    assert md.count("(reference)") == 8
    systems = "\n".join(tables)
    for s in ("rmqstore put_messages", "sqlite3", "queuelib", "persist-queue", "limit: os.write", "in-memory",
              "batch_read", "get_message", "SIGKILL", "SYNC_FLUSH, 16", "unavoidable Python steps",
              "plainest durable Python put, 1 thread (", "plainest durable Python put, 16 threads ("):
        assert s in systems, s
    targets = md.split("## Targets", 1)[1].split("\n## ", 1)[0]
    assert len(re.findall(r"\| (MET|NOT MET|n/a) \|", targets)) == 8
    # RocketMQ 4.4.0: every row of issue 20's table, measured now (a ratio) or said to be not built
    for gone in ("do_reput", "figure from the issue", "218,000"):
        assert gone not in md, gone
    compare = _compare_rows(md)
    assert len(compare) == 5 and all(len(c) == 5 for c in compare), compare
    built = benchsuite.find_reference() is not None
    for workload, rocketmq, rmq, ratio, _limit in compare:
        assert rmq.endswith("msg/s"), (workload, rmq)
        if built:
            assert rocketmq.endswith("msg/s") and re.fullmatch(r"\d+\.\d\dx", ratio), (workload, rocketmq, ratio)
        else:
            assert rocketmq == "not built" and ratio == "n/a", (workload, rocketmq, ratio)
    one = next(c for c in compare if c[0].startswith("put_message, one message per call"))
    assert re.fullmatch(r"a put's unavoidable Python steps: [\d,]+ msg/s", one[4]), one
    # the SYNC_FLUSH rows: the disk's limit and what Python itself can do (issue 20)
    sync1, sync16 = (next(c for c in compare if c[0].startswith(w)) for w in ("SYNC_FLUSH (each", "SYNC_FLUSH, 16"))
    assert re.fullmatch(r"write \+ fsync per message: [\d,]+ msg/s; the plainest durable Python put: [\d,]+ msg/s",
                        sync1[4]), sync1
    assert re.fullmatch(r"write \+ fsync per 16 messages: [\d,]+ msg/s; 16 Python threads, plainest group commit: "
                        r"[\d,]+ msg/s", sync16[4]), sync16
    for name in ROCKETMQ_ROWS:
        row = next(r for r in systems.splitlines() if name in r)
        assert ("msg/s" in row) if built else ("not built" in row), row
    if not built:
        assert "was not run: its reference benchmark is not built" in md and "build.sh" in md


def test_benchsuite_says_when_rocketmq_is_not_built(tmp_path, monkeypatch):
    from rmqstore.tools import benchsuite
    monkeypatch.setenv("RMQSTORE_REFERENCE", str(tmp_path / "no-such-refbench"))
    out = tmp_path / "B.md"
    assert benchsuite.main(["--scale", "tiny", "--out", str(out), "--chart", "", "--work", str(tmp_path),
                            "--only", "e2e,rocketmq"]) == 0
    md = out.read_text()
    assert "was not run: its reference benchmark is not built on this machine" in md
    assert "bash ../shared/reference/build.sh" in md
    assert all(c[1] == "not built" and c[3] == "n/a" for c in _compare_rows(md))
    assert "| RocketMQ 4.4.0 putMessage 1 at a time, until dispatched | not built" in md


def test_small_runs_do_not_overwrite_the_committed_report():
    from rmqstore.tools.benchsuite import default_outputs
    assert default_outputs("full") == ("BENCHMARKS.md", "benchmarks/results.png")
    for scale in ("small", "tiny"):
        md, png = default_outputs(scale)
        assert md.startswith("benchmarks/work/") and png.startswith("benchmarks/work/") and scale in md
    assert os.path.basename(default_outputs("small")[1]) != "results.png"


def test_one_page_the_explanations_and_the_scale_curve_kept(tmp_path, monkeypatch):
    """BENCHMARKS.md is one run's page: the full run writes it whole with the hand-written explanations
    (benchmarks/explanations.md) and carries over the scale curve section; a SCALE=huge run replaces only that
    section, in place."""
    from rmqstore.tools import benchsuite as B
    assert default_outputs_huge() == ("BENCHMARKS.md", "")
    t = B.Table("scale", "Open time by store size", "s", False)
    t.notes.append("| messages | rmqstore clean open |\n|---|---|\n| 2,000,000 | 0.4 s |")
    sec = B.render_scale_section([t], 3600.0, ["- CPU calibration (x): 0.65 s at the end"], (1.0, 1.0, 1.0))
    assert sec.startswith(B.SCALE_BEGIN) and sec.endswith(B.SCALE_END) and "| 2,000,000 | 0.4 s |" in sec
    full = B.render_markdown([], "full", tmp_path, 1.0, [], (0, 0, 0), None)
    assert "## Where the time goes" in full and B.EXPLANATIONS.read_text().splitlines()[2] in full
    page = B.with_scale_section(full, sec)
    assert B.scale_section(page) == sec and page.startswith("# rmqstore benchmarks")
    newer = sec.replace("0.4 s", "0.3 s")
    again = B.with_scale_section(page, newer)
    assert again.count(B.SCALE_BEGIN) == 1 and "0.3 s" in again and "| 2,000,000 | 0.4 s |" not in again
    assert again.replace(newer, "") == page.replace(sec, "")


def default_outputs_huge():
    from rmqstore.tools.benchsuite import default_outputs
    return default_outputs("huge")


# bench_spark / bench_server answers as they were in the committed full-scale run (BENCHMARKS.md)
SPARK = {"scale": 200000, "body_size": 512, "master": "local[*]", "cores": 2, "messages": 200000,
         "bytes": 133999946, "local_reader_seconds": 2.895, "local_reader_msgs_per_s": 69077,
         "local_reader_MB_per_s": 46.3, "local_vectorised_headers_seconds": 0.36,
         "local_vectorised_headers_msgs_per_s": 555945, "local_vectorised_headers_MB_per_s": 372.5,
         "spark_queue_seconds": 2.471, "spark_queue_msgs_per_s": 80941, "spark_queue_MB_per_s": 54.2,
         "spark_commitlog_seconds": 2.054, "spark_commitlog_msgs_per_s": 97357, "spark_commitlog_MB_per_s": 65.2,
         "parquet_write_seconds": 10.477, "parquet_MB": 113.5, "spark_parquet_seconds": 1.006,
         "spark_parquet_msgs_per_s": 198851, "spark_parquet_MB_per_s": 133.2, "same_answer": True,
         "rebuild_local_seconds": 1.795, "rebuild_spark_seconds": 5.49, "rebuild_spark_tasks": 19,
         "rebuild_same_queues": True, "trigger_first_ms": 414.6, "trigger_stopped_ms": 0.8,
         "trigger_live_ms": 11.5, "trigger_live_sees_appends": True,
         "queries": [{"query": "aggregate, every column", "rmqstore_seconds": 2.471, "parquet_seconds": 1.006,
                      "same": True},
                     {"query": "aggregate, option columns", "rmqstore_seconds": 0.96, "parquet_seconds": 0.8,
                      "same": True},
                     {"query": "count()", "rmqstore_seconds": 0.3, "parquet_seconds": 0.2, "same": False}]}
SERVER = {"messages": 100000, "sync_messages": 10000, "body_size": 256, "in_flight": 512, "queues": 4,
          "async_send_msgs_per_s": 19021, "async_send_errors": 0,
          "async_send_cpu_us_per_msg": {"client": 47.3, "server": 41.1}, "sync_send_msgs_per_s": 2336,
          "sync_send_latency_ms": {"p50": 0.385, "p99": 0.814}, "push_consume_msgs_per_s": 32310,
          "consumed": 100000, "server_exit": 0}


def test_spark_and_server_results_are_rows_with_ratios(tmp_path):
    from rmqstore.tools import benchsuite
    tables = [benchsuite.spark_table(SPARK), benchsuite.server_table(SERVER)]
    md = benchsuite.render_markdown(tables, "full", tmp_path, 1.0, [], (0, 0, 0), None)
    for title, n in (("## Spark: read 200,000 messages", 5), ("## RocketMQ-protocol server over loopback", 3)):
        section = md.split(title, 1)[1].split("\n## ", 1)[0]
        rows = [r for r in section.splitlines() if r.startswith("| ") and not r.startswith(("| system", "| query"))
                and "x |" not in r and "DIFFERENT" not in r]
        assert len(rows) == n, rows
        assert all(re.search(r"\| (\d+\.\d\d|1\.00 \(reference\)) \|$", r) for r in rows), rows
    assert "| Spark reading the same messages from Parquet | 198,851 msg/s, 133 MB/s, 1.01 s | 2.46 |" in md
    # each query beside Parquet: msg/s and seconds of both, the ratio, and a different answer said plainly
    assert ("| aggregate, option columns | 250,000 msg/s (0.80 s) | 208,333 msg/s (0.96 s) | 0.83x |" in md), md
    assert "| count() | 1,000,000 msg/s (0.20 s) | 666,667 msg/s (0.30 s) | 0.67x DIFFERENT ANSWERS |" in md
    assert "latestOffset (asked before every micro-batch; goal under 100 ms): the first 415 ms" in md
    assert "11.5 ms while a writer (MessageStore) holds it open" in md
    chart = tmp_path / "r.png"
    benchsuite.render_chart(tables, chart, "full")
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
