"""The JSON dialect of Alibaba fastjson, which RocketMQ's bodies use.

fastjson writes a map whose keys are not strings with the keys unquoted: `{"brokerAddrs":{0:"127.0.0.1:10911"}}`
(a `HashMap<Long, String>`), and a map keyed by a bean with the bean as the key:
`{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:{...}}}`. Python's json module rejects both.

- `loads(data)` reads standard JSON and this dialect: unquoted numeric keys become ints; object keys become
  `FrozenDict`s (hashable, compare equal to the dict they were read from); unquoted identifier keys and
  single-quoted strings (fastjson accepts them too) are read as strings.
- `dumps(obj)` writes it: int keys unquoted, FrozenDict/tuple-of-pairs keys as objects, everything else as
  standard compact JSON (non-ASCII written as is, as fastjson does).

Standard JSON goes through the json module's C parser first; the hand parser runs only when it fails.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

__all__ = ["loads", "dumps", "FrozenDict", "JSONDecodeError"]


class JSONDecodeError(ValueError):
    def __init__(self, msg: str, pos: int):
        super().__init__(f"{msg} at char {pos}")
        self.msg = msg
        self.pos = pos


class FrozenDict(dict):
    """A dict usable as a key (a map key that was itself an object, as fastjson writes MessageQueue keys)."""

    def __hash__(self):  # type: ignore[override]
        return hash(tuple(sorted((k, _hashable(v)) for k, v in self.items())))

    def _ro(self, *a, **k):
        raise TypeError("FrozenDict is read-only")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = _ro  # type: ignore[assignment]


def _hashable(v):
    if isinstance(v, dict):
        return FrozenDict(v)
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    return v


# --- reading ------------------------------------------------------------------------------------------
_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?[LlFfDd]?")
_IDENT = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_STRING_CHUNK = re.compile(r'([^"\\\x00-\x1f]*)(["\\\x00-\x1f])')
_SQ_STRING_CHUNK = re.compile(r"([^'\\]*)(['\\])")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "'": "'"}
MAX_DEPTH = 200


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse fastjson-dialect JSON (bytes are UTF-8). Raises JSONDecodeError (a ValueError)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise JSONDecodeError(f"not UTF-8: {e.reason}", e.start) from None
    else:
        text = data
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    p = _Parser(text)
    try:
        value = p.value(0)
    except RecursionError:
        raise JSONDecodeError("nesting too deep", p.pos) from None
    p.skip_ws()
    if p.pos != len(text):
        raise JSONDecodeError("extra data", p.pos)
    return value


class _Parser:
    __slots__ = ("s", "pos")

    def __init__(self, s: str):
        self.s = s
        self.pos = 0

    def skip_ws(self) -> None:
        self.pos = _WS.match(self.s, self.pos).end()

    def value(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise JSONDecodeError("nesting too deep", self.pos)
        self.skip_ws()
        s, i = self.s, self.pos
        if i >= len(s):
            raise JSONDecodeError("unexpected end of data", i)
        c = s[i]
        if c == "{":
            return self.obj(depth)
        if c == "[":
            return self.arr(depth)
        if c == '"':
            return self.string('"')
        if c == "'":
            return self.string("'")
        m = _NUMBER.match(s, i)
        if m and m.end() > i:
            self.pos = m.end()
            text = m.group(0).rstrip("LlFfDd")
            if m.group(1) or m.group(2) or m.group(0)[-1:] in "FfDd":
                return float(text)
            return int(text)
        m = _IDENT.match(s, i)
        if m:
            word = m.group(0)
            self.pos = m.end()
            if word == "true":
                return True
            if word == "false":
                return False
            if word in ("null", "undefined"):
                return None
            if word == "NaN":
                return math.nan
            raise JSONDecodeError(f"unexpected word {word!r}", i)
        raise JSONDecodeError(f"unexpected character {c!r}", i)

    def key(self, depth: int) -> Any:
        self.skip_ws()
        s, i = self.s, self.pos
        c = s[i:i + 1]
        if c in ('"', "'"):
            return self.string(c)
        if c == "{":
            return FrozenDict(self.obj(depth))
        if c == "[":
            return _hashable(self.arr(depth))
        m = _NUMBER.match(s, i)
        if m and m.end() > i:
            return self.value(depth)
        m = _IDENT.match(s, i)
        if m:
            self.pos = m.end()
            w = m.group(0)
            return {"true": True, "false": False, "null": None}.get(w, w)
        raise JSONDecodeError("expected a key", i)

    def obj(self, depth: int) -> dict:
        s = self.s
        self.pos += 1
        out: dict = {}
        self.skip_ws()
        if s[self.pos:self.pos + 1] == "}":
            self.pos += 1
            return out
        while True:
            k = self.key(depth + 1)
            self.skip_ws()
            if s[self.pos:self.pos + 1] != ":":
                raise JSONDecodeError("expected ':'", self.pos)
            self.pos += 1
            out[k] = self.value(depth + 1)
            self.skip_ws()
            c = s[self.pos:self.pos + 1]
            self.pos += 1
            if c == ",":
                continue
            if c == "}":
                return out
            raise JSONDecodeError("expected ',' or '}'", self.pos - 1)

    def arr(self, depth: int) -> list:
        s = self.s
        self.pos += 1
        out: list = []
        self.skip_ws()
        if s[self.pos:self.pos + 1] == "]":
            self.pos += 1
            return out
        while True:
            out.append(self.value(depth + 1))
            self.skip_ws()
            c = s[self.pos:self.pos + 1]
            self.pos += 1
            if c == ",":
                continue
            if c == "]":
                return out
            raise JSONDecodeError("expected ',' or ']'", self.pos - 1)

    def string(self, quote: str) -> str:
        s = self.s
        chunk_re = _STRING_CHUNK if quote == '"' else _SQ_STRING_CHUNK
        start = self.pos
        self.pos += 1
        parts = []
        while True:
            m = chunk_re.match(s, self.pos)
            if m is None:
                raise JSONDecodeError("unterminated string", start)
            parts.append(m.group(1))
            self.pos = m.end()
            t = m.group(2)
            if t == quote:
                return "".join(parts)
            if t != "\\":
                raise JSONDecodeError("control character in string", self.pos - 1)
            esc = s[self.pos:self.pos + 1]
            if esc == "u":
                hexa = s[self.pos + 1:self.pos + 5]
                if len(hexa) != 4 or not all(ch in "0123456789abcdefABCDEF" for ch in hexa):
                    raise JSONDecodeError("bad \\u escape", self.pos)
                cp = int(hexa, 16)
                self.pos += 5
                if 0xD800 <= cp < 0xDC00 and s[self.pos:self.pos + 2] == "\\u":
                    lo_hex = s[self.pos + 2:self.pos + 6]
                    try:
                        lo = int(lo_hex, 16)
                    except ValueError:
                        lo = 0
                    if 0xDC00 <= lo < 0xE000:
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
                        self.pos += 6
                parts.append(chr(cp))
            elif esc == "x":   # fastjson accepts \xHH
                try:
                    parts.append(chr(int(s[self.pos + 1:self.pos + 3], 16)))
                except ValueError:
                    raise JSONDecodeError("bad \\x escape", self.pos) from None
                self.pos += 3
            elif esc in _ESCAPES:
                parts.append(_ESCAPES[esc])
                self.pos += 1
            else:
                raise JSONDecodeError(f"bad escape \\{esc}", self.pos)


# --- writing ------------------------------------------------------------------------------------------
_encode_str = json.JSONEncoder(ensure_ascii=False).encode


def dumps(obj: Any) -> str:
    """Serialise as fastjson does: compact, int map keys unquoted, object keys as objects."""
    out: list[str] = []
    _write(obj, out, 0)
    return "".join(out)


def dumps_bytes(obj: Any) -> bytes:
    return dumps(obj).encode("utf-8")


def _write(v: Any, out: list, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ValueError("nesting too deep")
    if v is None:
        out.append("null")
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif isinstance(v, str):
        out.append(_encode_str(v))
    elif isinstance(v, int):
        out.append(str(int(v)))
    elif isinstance(v, float):
        out.append(repr(v) if math.isfinite(v) else "null")
    elif isinstance(v, dict):
        out.append("{")
        first = True
        for k, x in v.items():
            if not first:
                out.append(",")
            first = False
            _write_key(k, out, depth + 1)
            out.append(":")
            _write(x, out, depth + 1)
        out.append("}")
    elif isinstance(v, (list, tuple, set, frozenset)):
        out.append("[")
        items = sorted(v) if isinstance(v, (set, frozenset)) else v
        for i, x in enumerate(items):
            if i:
                out.append(",")
            _write(x, out, depth + 1)
        out.append("]")
    elif hasattr(v, "to_json"):
        _write(v.to_json(), out, depth)
    else:
        raise TypeError(f"cannot serialise {type(v).__name__}")


def _write_key(k: Any, out: list, depth: int) -> None:
    if isinstance(k, str):
        out.append(_encode_str(k))
    elif isinstance(k, bool) or k is None:
        out.append(_encode_str(str(k).lower() if k is not None else "null"))
    elif isinstance(k, (int, float)):
        out.append(str(int(k)) if isinstance(k, int) else repr(k))
    elif isinstance(k, dict):
        _write(dict(k), out, depth)
    elif hasattr(k, "to_json"):
        _write(k.to_json(), out, depth)
    else:
        _write(k, out, depth)
