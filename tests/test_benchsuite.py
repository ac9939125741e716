"""The comparison suite at its tiny scale: a well-formed report and a PNG (structure, not speed)."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("matplotlib")


def test_benchsuite_tiny_writes_markdown_and_chart(tmp_path):
    from rmqstore import benchsuite

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
              "batch_read", "get_message", "SIGKILL", "SYNC_FLUSH, 16"):
        assert s in systems, s
    targets = md.split("## Targets", 1)[1].split("\n## ", 1)[0]
    assert len(re.findall(r"\| (MET|NOT MET|n/a) \|", targets)) == 8
