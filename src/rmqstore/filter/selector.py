"""Compiled selectors (RocketMQ's FilterFactory / SqlFilter.compile, with its parse cache) and the
MessageSelector a consumer subscribes with."""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from .expression import Expression, no_raise
from .java import EvalError
from .parser import SelectorError, parse

TAG = "TAG"
SQL92 = "SQL92"
MEMO_LIMIT = 4096           # distinct property value tuples remembered per compiled selector


def is_tag_type(expression_type: str | None) -> bool:
    """ExpressionType.isTagType: no type, an empty one or TAG."""
    return not expression_type or expression_type == TAG


class SqlExpression:
    """A compiled SQL92 selector. `evaluate` is RocketMQ's three-valued result (True, False, None; EvalError
    where Java throws); `matches` is the broker's verdict (delivered only for True); `matches_many` judges a
    batch, evaluating each distinct combination of the properties the selector reads once."""

    def __init__(self, text: str, expression: Expression):
        self.text = text
        self.expression = expression
        self.properties = frozenset(expression.properties())
        self._names = tuple(sorted(self.properties))
        self.evaluate = expression.compile()
        self.matches = no_raise(self.evaluate)
        self._memo: dict[tuple, bool] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SqlExpression({self.text!r})"

    def java(self) -> str:
        """The compiled expression as RocketMQ's toString prints it (parenthesised, `==`, `&&`, `||`)."""
        return self.expression.java()

    def matches_cached(self, props: Mapping[str, str] | None) -> bool:
        """matches, remembered per combination of the values of the properties the selector reads."""
        p = props or {}
        key = tuple(map(p.get, self._names))
        hit = self._memo.get(key)
        if hit is None:
            hit = self.matches(p)
            if len(self._memo) >= MEMO_LIMIT:
                with self._lock:
                    self._memo.clear()
            self._memo[key] = hit
        return hit

    def matches_many(self, props: Iterable[Mapping[str, str] | None]) -> list[bool]:
        return list(map(self.matches_cached, props))

    def matches_columns(self, columns: Mapping[str, Sequence[str | None]], n: int) -> list[bool]:
        """The verdict for n messages given as columns: the value (or None) of each property the selector
        reads, per message. Each distinct combination of values is evaluated once."""
        names = self._names
        memo: dict[tuple, bool] = {}
        out = []
        for key in (zip(*(columns[name] for name in names)) if names else [()] * n):
            hit = memo.get(key)
            if hit is None:
                hit = memo[key] = self.matches({k: v for k, v in zip(names, key) if v is not None})
            out.append(hit)
        return out

    def outcome(self, props: Mapping[str, str] | None) -> str:
        """T, F, N (unknown) or X (an exception): what RocketMQ's evaluation gives (tests compare these)."""
        try:
            v = self.evaluate(props or {})
        except EvalError:
            return "X"
        return "N" if v is None else "T" if v is True else "F"


@functools.lru_cache(maxsize=1024)
def _compile(text: str) -> SqlExpression | SelectorError:
    try:
        return SqlExpression(text, parse(text))
    except SelectorError as e:
        return e


def compile_sql92(text: str) -> SqlExpression:
    """The compiled selector (cached per text, as RocketMQ's SelectorParser caches); SelectorError as
    RocketMQ refuses it (`remark` is the broker's answer)."""
    if not isinstance(text, str):
        raise TypeError(f"an SQL92 selector is a str, not {type(text).__name__}")
    got = _compile(text)
    if isinstance(got, SelectorError):
        raise SelectorError(got.java_class, got.message)
    return got


@dataclass(frozen=True)
class MessageSelector:
    """What a consumer subscribes with (RocketMQ's MessageSelector): `by_sql("a > 5 AND b = 'x'")` or
    `by_tag("TagA || TagB")`."""
    expression_type: str
    expression: str

    @classmethod
    def by_sql(cls, sql: str) -> "MessageSelector":
        if not isinstance(sql, str) or not sql.strip():
            raise ValueError("an SQL92 selector must not be empty")
        return cls(SQL92, sql)

    @classmethod
    def by_tag(cls, tag: str | None) -> "MessageSelector":
        return cls(TAG, tag or "*")

    @property
    def is_sql(self) -> bool:
        return self.expression_type == SQL92
