"""Java value semantics the SQL92 evaluator reproduces: the boxed types of RocketMQ 4.4.0's filter module
(String, Boolean, Integer, Long, Double), their conversions (Integer.valueOf, Long.valueOf, Double.valueOf,
Boolean.valueOf of a String), Comparable.compareTo across them with ComparisonExpression's widening, and
the texts Java prints for them (Double.toString, a HashSet's iteration order).

Values are Python objects: str (String), bool (Boolean), JInt (Integer), JLong (Long), float (Double),
None (null). A failed conversion raises EvalError (the broker logs it and does not deliver the message).
"""
from __future__ import annotations

import math
import re
import struct
import unicodedata

from ..store.format.codec import java_string_hash

INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1
LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1
DOUBLE_MAX = 1.7976931348623157e308
DOUBLE_MIN = 5e-324     # Double.MIN_VALUE, printed 4.9E-324


class JInt(int):
    """java.lang.Integer."""
    __slots__ = ()


class JLong(int):
    """java.lang.Long."""
    __slots__ = ()


class EvalError(Exception):
    """What Java throws while a compiled expression is evaluated (NumberFormatException,
    ClassCastException): the message is not delivered, whatever the rest of the expression says."""


def java_name(v) -> str:
    return {str: "java.lang.String", bool: "java.lang.Boolean", JInt: "java.lang.Integer",
            JLong: "java.lang.Long", float: "java.lang.Double"}[type(v)]


# --- String -> number ---------------------------------------------------------------------------------
def _digit(ch: str) -> int:
    """Character.digit(ch, 10) for one UTF-16 code unit: a Unicode decimal digit's value, else -1."""
    if ord(ch) > 0xFFFF:
        return -1           # a supplementary character is two surrogates in Java: no digit
    return unicodedata.decimal(ch, -1)


def _parse_integral(s: str, lo: int, hi: int) -> int:
    """Integer.parseInt / Long.parseLong (radix 10): an optional sign, then decimal digits (any script's)."""
    if not s:
        raise EvalError(f'For input string: "{s}"')
    i, neg = 0, False
    if s[0] in "+-":
        neg = s[0] == "-"
        i = 1
        if len(s) == 1:
            raise EvalError(f'For input string: "{s}"')
    v = 0
    for ch in s[i:]:
        d = _digit(ch)
        if d < 0:
            raise EvalError(f'For input string: "{s}"')
        v = v * 10 + d
        if v > hi + 1:
            raise EvalError(f'For input string: "{s}"')
    v = -v if neg else v
    if not lo <= v <= hi:
        raise EvalError(f'For input string: "{s}"')
    return v


def parse_int(s: str) -> JInt:
    return JInt(_parse_integral(s, INT_MIN, INT_MAX))


def parse_long(s: str) -> JLong:
    return JLong(_parse_integral(s, LONG_MIN, LONG_MAX))


_DEC = re.compile(r"([+-]?)(?:(NaN)|(Infinity)|((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)[fFdD]?)\Z")
_HEX = re.compile(r"([+-]?)0[xX]([0-9a-fA-F]*)(?:\.([0-9a-fA-F]*))?[pP]([+-]?[0-9]+)[fFdD]?\Z")


def parse_double(s: str) -> float:
    """Double.valueOf(String): Java's grammar (surrounding characters <= U+0020 trimmed; NaN, Infinity,
    decimal with an optional exponent and an f/F/d/D suffix, hexadecimal with a binary exponent); ASCII
    digits only; nothing else (no underscores, no "inf")."""
    t = s.strip("".join(map(chr, range(33))))
    m = _DEC.match(t)
    if m is not None:
        sign = -1.0 if m.group(1) == "-" else 1.0
        if m.group(2):
            return math.nan
        if m.group(3):
            return sign * math.inf
        return sign * float(m.group(4))
    m = _HEX.match(t)
    if m is not None and (m.group(2) or m.group(3)):
        mant = (m.group(2) or "0") + "." + (m.group(3) or "")
        try:
            v = float.fromhex(mant + "p" + m.group(4))
        except OverflowError:
            v = math.inf
        return -v if m.group(1) == "-" else v
    raise EvalError(f'For input string: "{t}"' if t else "empty String")


def parse_boolean(s: str) -> bool:
    """Boolean.valueOf(String): "true" in any case."""
    return len(s) == 4 and s.lower() == "true"


# --- compareTo -----------------------------------------------------------------------------------------
def _double_bits(d: float) -> int:
    if d != d:
        return 0x7FF8000000000000
    return struct.unpack(">q", struct.pack(">d", d))[0]


def compare_double(a: float, b: float) -> int:
    """Double.compare: NaN above everything (and equal to itself), -0.0 below 0.0."""
    if a < b:
        return -1
    if a > b:
        return 1
    x, y = _double_bits(a), _double_bits(b)
    return 0 if x == y else (-1 if x < y else 1)


def _same_type_compare(a, b) -> int:
    if type(a) is float:
        return compare_double(a, b)
    if type(a) is str:
        if a == b:
            return 0
        ua, ub = a.encode("utf-16-be"), b.encode("utf-16-be")     # String.compareTo: UTF-16 code units
        return -1 if ua < ub else 1
    return (a > b) - (a < b)


def compare(lv, rv) -> int:
    """ComparisonExpression.__compare with string conversion on (as the parser sets it): two values of
    different types are brought to one (a String to the other side's number class or Boolean, numbers
    widened); anything else compares as -1. A failed conversion raises EvalError."""
    lt, rt = type(lv), type(rv)
    if lt is not rt:
        if lt is bool:
            if rt is str:       # Boolean.valueOf((String) lv) on a Boolean: a ClassCastException
                raise EvalError("class java.lang.Boolean cannot be cast to class java.lang.String")
            return -1
        if lt is JInt:
            if rt is JLong:
                pass
            elif rt is float:
                lv = float(lv)
            elif rt is str:
                rv = parse_int(rv)
            else:
                return -1
        elif lt is JLong:
            if rt is JInt:
                pass
            elif rt is float:
                lv = float(lv)
            elif rt is str:
                rv = parse_long(rv)
            else:
                return -1
        elif lt is float:
            if rt is JInt or rt is JLong:
                rv = float(rv)
            elif rt is str:
                rv = parse_double(rv)
            else:
                return -1
        elif lt is str:
            if rt is bool:
                lv = parse_boolean(lv)
            elif rt is JInt:
                lv = parse_int(lv)
            elif rt is JLong:
                lv = parse_long(lv)
            elif rt is float:
                lv = parse_double(lv)
            else:
                return -1
        else:
            return -1
    if type(lv) is float or type(rv) is float:
        return compare_double(float(lv), float(rv))
    return _same_type_compare(lv, rv)


# --- texts ---------------------------------------------------------------------------------------------
def double_to_string(d: float) -> str:
    """Double.toString: plain between 10^-3 and 10^7, else d.dddE[-]n; at least one digit after the point."""
    if d != d:
        return "NaN"
    if d in (math.inf, -math.inf):
        return "Infinity" if d > 0 else "-Infinity"
    if d == 0:
        return "-0.0" if math.copysign(1.0, d) < 0 else "0.0"
    sign = "-" if d < 0 else ""
    if abs(d) == DOUBLE_MIN:
        return sign + "4.9E-324"        # Java's digits for the smallest subnormal
    digits, exp = _shortest_digits(abs(d))        # value = 0.d1d2... * 10^exp
    if 1e-3 <= abs(d) < 1e7:
        if exp <= 0:
            return f"{sign}0.{'0' * -exp}{digits}"
        whole, frac = digits[:exp].ljust(exp, "0"), digits[exp:]
        return f"{sign}{whole}.{frac or '0'}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{exp - 1}"


def _shortest_digits(d: float) -> tuple[str, int]:
    mant, _, e = f"{d!r}".partition("e")
    whole, _, frac = mant.partition(".")
    exp10 = int(e) if e else 0
    digits = (whole + frac).lstrip("0")
    lead_zeros = len(whole + frac) - len((whole + frac).lstrip("0"))
    return digits.rstrip("0") or "0", len(whole) + exp10 - lead_zeros


def number_to_string(v) -> str:
    return double_to_string(v) if type(v) is float else str(int(v))


def hash_set_order(items: list[str]) -> list[str]:
    """new HashSet<>(items) iterated: Java HashMap buckets (String.hashCode spread, table size a power of
    two >= items/0.75 + 1 and >= 16), insertion order within a bucket, duplicates once."""
    want = max(int(len(items) / 0.75) + 1, 16)
    cap = 1
    while cap < want:
        cap <<= 1
    buckets: dict[int, list[str]] = {}
    seen: set[str] = set()
    for s in items:
        if s in seen:
            continue
        seen.add(s)
        h = java_string_hash(s) & 0xFFFFFFFF
        buckets.setdefault((h ^ (h >> 16)) & (cap - 1), []).append(s)
    return [s for b in sorted(buckets) for s in buckets[b]]
