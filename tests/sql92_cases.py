"""What RocketMQ 4.4.0 answered for SQL92 selectors, recorded under tests/data/sql92 (see its files' headers),
and the messages it answered about: the suite replays these against rmqstore's evaluator, broker, gRPC
endpoint, in-process consumers and Spark option."""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "sql92"
sys.path.insert(0, str(DATA))
from oracle_cases import read_props, unescape  # noqa: E402


def sqltool_props(i: int) -> dict[str, str]:
    """SqlTool.props(i): the user properties of message i (a int, b string, c float, d boolean; some absent)."""
    p = {}
    if i % 13 != 0:
        p["a"] = str((i * 7) % 23 - 5)
    if i % 11 != 0:
        p["b"] = ["red", "green", "blue", "5", "RED", "red "][(i // 3) % 6]
    if i % 3 != 0:
        p["c"] = repr(((i * 37) % 41) / 4.0)     # Java's String.valueOf(double) of these quarters
    d = ["true", "false", "TRUE", None][i % 4]
    if d is not None:
        p["d"] = d
    return p


def sqltool_tag(i: int) -> str | None:
    return None if i % 5 == 4 else ["TagA", "TagB", "TagC"][(i // 2) % 3]


def sqltool_all_props(i: int) -> dict[str, str]:
    """What the broker evaluates: the user properties plus the system ones SqlTool's messages carry."""
    p = dict(sqltool_props(i), KEYS=f"sql-{i}", WAIT="true")
    if sqltool_tag(i):
        p["TAGS"] = sqltool_tag(i)
    return p


@dataclass
class Recorded:
    id: str
    selector: str
    push_status: str
    push: frozenset[int]
    pull_status: str
    pull: frozenset[int]

    @property
    def valid(self) -> bool:
        return self.push_status == "ok"

    def delivered(self, below: int) -> frozenset[int]:
        return frozenset(i for i in self.push if i < below)


def _bits(h: str) -> frozenset[int]:
    v = int(h, 16) if h else 0
    return frozenset(i for i in range(v.bit_length()) if v >> i & 1)


def sqltool_record() -> list[Recorded]:
    out = []
    for line in (DATA / "rocketmq440-sqltool.tsv").read_text(encoding="utf-8").splitlines():
        if line.startswith("#") or not line:
            continue
        f = line.split("\t")
        out.append(Recorded(f[0], unescape(f[1]), f[2], _bits(f[3]), f[4], _bits(f[5])))
    return out


def oracle_record() -> tuple[list[str], list[dict], list[str]]:
    """FilterOracle's inputs and answers: selectors, property maps, one answer line per selector."""
    def lines(name):
        return (DATA / name).read_text(encoding="utf-8").split("\n")[:-1]
    return [unescape(e) for e in lines("exprs.txt")], [read_props(p) for p in lines("props.txt")], lines("oracle.txt")


def folded(remark: str) -> str:
    """A remark as SqlTool prints it: whitespace folded, cut at 200 characters."""
    s = re.sub(r"\s+", " ", remark)
    return s[:200] + "..." if len(s) > 200 else s
