"""Random SQL92 selectors and property maps for FilterOracle.java (RocketMQ 4.4.0's own filter module), and
the escaped line format both sides read.

    python tests/data/sql92/oracle_cases.py DIR [SEED] [N] [MESSAGES]   writes DIR/exprs.txt and DIR/props.txt

then FilterOracle (see its class comment) writes DIR/oracle.txt; exprs.txt, props.txt and oracle.txt are
committed here (tests/test_filter_oracle.py replays them). The generator is seeded: the same seed gives
the same files.
"""
from __future__ import annotations

import random
import sys
from pathlib import Path

NAMES = ["a", "b", "c", "d", "e", "A", "TAGS", "x_1", "$y", "_z", "KEYS"]
VALUES = ["5", "05", "-3", "+7", "0", "-0", "17", "2147483647", "2147483648", "-2147483649", "9223372036854775807",
          "9223372036854775808", "\u0661\u0662", "\uff15", "0x10", "2.5", "2.25", "1e3", "1E-3", "NaN", "Infinity",
          "-Infinity", "-0.0", "0.0", " 3.5 ", "1.5f", "2.0d", "0x1p3", "0x.8p1", "1_0", "5.", ".5", "inf", "true",
          "TRUE", "True", "false", "yes", "red", "red ", "RED", "green", "", "'", "O'Brien", "\u00e9t\u00e9",
          "\U0001f600", "5 ", "\t5", "TagA", "TagB"]
INTS = ["0", "5", "3", "17", "2147483647", "2147483648", "9223372036854775807", "9223372036854775808", "10L", "7l",
        "007", "1"]
FLOATS = ["5.0", "2.5", ".5", "5.", "1e3", "1E-3", "2.5e0", "1e400", "1e-400", "0.0", "0.5E1", "3.25", "1.0E308"]
STRINGS = ["'red'", "'red '", "'RED'", "'5'", "'it''s'", "''", "'true'", "'TagA'", "'\u00e9t\u00e9'", "'\U0001f600'"]
KEYWORDS = ["TRUE", "FALSE", "NULL", "true", "False", "null"]
GARBAGE = ["#", "!", '"', ".", "/", "*", "\t", "\n", "\r", "\r\n", "\u00e9", "\u212a", "\u017f", "\u0663", "\U0001f600",
           "--x\n", "/* c */", "/*", "'", "=", "<", ">", "(", ")", ",", "+", "-", "LIKE", "%", ";", "\\", "[", "@",
           "e", "E5", "1.", "..", "0x", "\f", "\x00"]


def _literal(r: random.Random) -> str:
    k = r.random()
    if k < 0.35:
        return r.choice(INTS)
    if k < 0.6:
        return r.choice(FLOATS)
    if k < 0.85:
        return r.choice(STRINGS)
    return r.choice(KEYWORDS)


def _operand(r: random.Random, depth: int) -> str:
    k = r.random()
    if depth > 3 or k < 0.45:
        return r.choice(NAMES)
    if k < 0.8:
        return _literal(r)
    if k < 0.88:
        return "-" + _operand(r, depth + 1)
    if k < 0.92:
        return "+" + _operand(r, depth + 1)
    return "(" + _expr(r, depth + 1) + ")"


def _predicate(r: random.Random, depth: int) -> str:
    x, y = _operand(r, depth), _operand(r, depth)
    k = r.randrange(12)
    if k < 6:
        return f"{x} {r.choice(['=', '<>', '>', '>=', '<', '<='])} {y}"
    if k == 6:
        return f"{x} {r.choice(['BETWEEN', 'NOT BETWEEN', 'between'])} {y} AND {_operand(r, depth)}"
    if k == 7:
        items = ", ".join(r.choice(STRINGS) for _ in range(r.choice([1, 2, 3, 5, 6])))
        return f"{r.choice(NAMES)} {r.choice(['IN', 'NOT IN', 'in'])} ({items})"
    if k == 8:
        return f"{x} {r.choice(['IS NULL', 'IS NOT NULL', 'is null'])}"
    if k == 9:
        return r.choice(NAMES)
    if k == 10:
        return r.choice(KEYWORDS)
    return f"NOT {_predicate(r, depth + 1)}" if depth < 4 else x


def _expr(r: random.Random, depth: int = 0) -> str:
    parts = [_predicate(r, depth)]
    for _ in range(r.choice([0, 0, 1, 1, 2, 3])):
        parts.append(r.choice([" AND ", " OR ", " and ", " Or "]))
        p = _predicate(r, depth)
        parts.append(f"({p})" if r.random() < 0.2 else p)
    return "".join(parts)


def _mutate(r: random.Random, s: str) -> str:
    for _ in range(r.choice([1, 1, 2])):
        i = r.randrange(len(s) + 1)
        k = r.random()
        if k < 0.4:
            s = s[:i] + r.choice(GARBAGE) + s[i:]
        elif k < 0.7 and s:
            s = s[:i] + s[i + r.randrange(1, 4):]
        else:
            j = r.randrange(len(s) + 1)
            s = s[:i] + s[j:] + s[i:j]
    return s


SOUP = ["a", "b", "5", "2.5", "'x'", "'", "(", ")", "+", "-", "NOT", "AND", "OR", "IS", "NULL", "IN", "BETWEEN", "=",
        "<>", "<", ">", ",", " ", "\t", "\n", "\r", "#", ".", "/*", "*/", "--", "e", "1e", "TRUE", "''", "\u00e9",
        "\U0001f600", "0", "07", "5L", "/"]


def selector(r: random.Random) -> str:
    k = r.random()
    if k < 0.12:        # token soup: lexical errors, look-ahead, every error message
        return "".join(r.choice(SOUP) + (" " if r.random() < 0.5 else "") for _ in range(r.randrange(1, 12)))
    s = _expr(r)
    if k < 0.35:
        s = _mutate(r, s)
    elif k < 0.4:
        s = "".join(r.choice(GARBAGE + [" ", "a", "5", "'x'"]) for _ in range(r.randrange(1, 6)))
    return s


def properties(r: random.Random) -> dict[str, str]:
    return {n: r.choice(VALUES) for n in NAMES if r.random() < 0.6}


def escape(s: str) -> str:
    out = []
    for ch in s:
        if ch == "\\":
            out.append("\\\\")
        elif ch in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[ch])
        elif ord(ch) < 0x20 or ord(ch) > 0x7E:
            raw = ch.encode("utf-16-be", "surrogatepass")
            out.extend(f"\\u{int.from_bytes(raw[i:i + 2], 'big'):04x}" for i in range(0, len(raw), 2))
        else:
            out.append(ch)
    return "".join(out)


def unescape(s: str) -> str:
    units: list[int] = []
    i = 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            n = s[i + 1]
            if n == "u":
                units.append(int(s[i + 2:i + 6], 16))
                i += 6
                continue
            c = {"n": "\n", "r": "\r", "t": "\t"}.get(n, n)
            i += 1
        units.extend(int.from_bytes(c.encode("utf-16-be", "surrogatepass")[j:j + 2], "big")
                     for j in range(0, len(c.encode("utf-16-be", "surrogatepass")), 2))
        i += 1
    return b"".join(u.to_bytes(2, "big") for u in units).decode("utf-16-be", "surrogatepass")


def props_line(p: dict[str, str]) -> str:
    return "\t".join(f"{escape(k)}={escape(v)}" for k, v in p.items())


def read_props(line: str) -> dict[str, str]:
    if not line:
        return {}
    return dict((unescape(k), unescape(v)) for k, _, v in (item.partition("=") for item in line.split("\t")))


def main(out: Path, seed: int = 38, n: int = 2000, messages: int = 48) -> None:
    r = random.Random(seed)
    exprs = [selector(r) for _ in range(n)]
    props = [properties(r) for _ in range(messages)]
    out.mkdir(parents=True, exist_ok=True)
    (out / "exprs.txt").write_text("".join(escape(e) + "\n" for e in exprs), encoding="utf-8")
    (out / "props.txt").write_text("".join(props_line(p) + "\n" for p in props), encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]), *(int(a) for a in sys.argv[2:]))
