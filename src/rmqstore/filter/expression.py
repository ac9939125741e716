"""The compiled form of an SQL92 selector: a tree of expressions with RocketMQ 4.4.0's evaluation rules and
its toString (the text its error messages quote), and the tree turned into one Python closure per node.

Evaluation returns True, False or None (unknown); an EvalError raised anywhere (a String that does not
convert to the other side's number) fails the whole expression: the message is not delivered.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .java import (JInt, JLong, EvalError, compare, compare_double, hash_set_order, number_to_string,
                   parse_double)

Evaluator = Callable[[dict], object]


def _wrap(v: int, bits: int) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


class Expression:
    """A node; `boolean`: Java's BooleanExpression (what AND, OR, NOT and the selector itself accept)."""
    boolean = False

    def java(self) -> str:
        raise NotImplementedError

    def compile(self) -> Evaluator:
        raise NotImplementedError

    def properties(self) -> set[str]:
        return set()

    depth = 1       # of the tree (evaluation recurses this deep)

    def __str__(self) -> str:
        return self.java()


@dataclass(eq=False)
class Property(Expression):
    name: str

    def java(self) -> str:
        return self.name

    def compile(self) -> Evaluator:
        name = self.name
        return lambda props: props.get(name)

    def properties(self) -> set[str]:
        return {self.name}


@dataclass(eq=False)
class Constant(Expression):
    """A literal: str, JInt, JLong, float; TRUE, FALSE and NULL are the boolean constants."""
    value: object
    boolean: bool = False

    def java(self) -> str:
        v = self.value
        if v is None:
            return "NULL"
        if type(v) is bool:
            return "TRUE" if v else "FALSE"
        if type(v) is str:
            return "'" + v.replace("'", "''") + "'"
        return number_to_string(v)

    def compile(self) -> Evaluator:
        v = self.value
        return lambda props: v


NULL = Constant(None, True)
TRUE = Constant(True, True)
FALSE = Constant(False, True)


@dataclass(eq=False)
class Binary(Expression):
    left: Expression
    right: Expression
    symbol = "?"

    def java(self) -> str:
        return f"({self.left.java()} {self.symbol} {self.right.java()})"

    def __post_init__(self):
        self.depth = 1 + max(self.left.depth, self.right.depth)

    def properties(self) -> set[str]:
        return self.left.properties() | self.right.properties()


class Equal(Binary):
    """`=` (and IS NULL: `x = NULL` built without the parser's checks). Never unknown when the left side is
    known: a null right side is FALSE, two nulls are TRUE."""
    boolean = True
    symbol = "=="

    def compile(self) -> Evaluator:
        lf, rf = self.left.compile(), self.right.compile()

        def equal(props):
            lv, rv = lf(props), rf(props)
            if lv is None:
                return True if rv is None else None
            if rv is None:
                return False
            return compare(lv, rv) == 0
        return equal


_RELATIONS = {">": lambda c: c > 0, ">=": lambda c: c >= 0, "<": lambda c: c < 0, "<=": lambda c: c <= 0}


class Relation(Binary):
    """`>`, `>=`, `<`, `<=`: unknown when a side is null; two Strings (two properties) compare as doubles."""
    boolean = True

    def __init__(self, symbol: str, left: Expression, right: Expression):
        super().__init__(left, right)
        self.symbol = symbol

    def compile(self) -> Evaluator:
        lf, rf, test = self.left.compile(), self.right.compile(), _RELATIONS[self.symbol]

        def relation(props):
            lv = lf(props)
            if lv is None:
                return None
            rv = rf(props)
            if rv is None:
                return None
            if type(lv) is str and type(rv) is str:
                return test(compare_double(parse_double(lv), parse_double(rv)))
            return test(compare(lv, rv))
        return relation


class _Logic(Binary):
    """AND / OR: three-valued, left to right; `stop` (FALSE for AND, TRUE for OR) decides at once, without
    evaluating the right side when the left side has it; otherwise an unknown side makes it unknown."""
    boolean = True
    stop = False

    def compile(self) -> Evaluator:
        lf, rf, stop = self.left.compile(), self.right.compile(), self.stop

        def logic(props):
            lv = lf(props)
            if lv is stop:
                return stop
            rv = rf(props)
            if rv is stop:
                return stop
            return None if lv is None or rv is None else not stop
        return logic


class And(_Logic):
    symbol = "&&"
    stop = False


class Or(_Logic):
    symbol = "||"
    stop = True


@dataclass(eq=False)
class Unary(Expression):
    operand: Expression
    symbol = "?"

    def java(self) -> str:
        return f"({self.symbol} {self.operand.java()})"

    def __post_init__(self):
        self.depth = 1 + self.operand.depth

    def properties(self) -> set[str]:
        return self.operand.properties()


class Not(Unary):
    boolean = True
    symbol = "NOT"

    def compile(self) -> Evaluator:
        f = self.operand.compile()

        def not_(props):
            v = f(props)
            return None if v is None else not v
        return not_


class Negate(Unary):
    """Unary minus: numbers only; anything else (a String property) is null."""
    symbol = "-"

    def compile(self) -> Evaluator:
        f = self.operand.compile()

        def negate(props):
            v = f(props)
            t = type(v)
            if t is JInt:
                return JInt(_wrap(-v, 32))
            if t is JLong:
                return JLong(_wrap(-v, 64))
            if t is float:
                return -v
            return None
        return negate


class BooleanCast(Unary):
    """A property where a boolean is expected (`d`, `NOT d`): a property is a String, never a Boolean, so
    FALSE when present, unknown when absent."""
    boolean = True

    def java(self) -> str:
        return self.operand.java()

    def compile(self) -> Evaluator:
        f = self.operand.compile()

        def cast(props):
            v = f(props)
            if v is None:
                return None
            return v if type(v) is bool else False
        return cast


class In(Unary):
    """`p [NOT] IN ('x', ...)`: exact, case-sensitive membership; unknown when the property is absent."""
    boolean = True

    def __init__(self, operand: Property, items: list[str], negated: bool):
        super().__init__(operand)
        self.items = items
        self.negated = negated

    @property
    def symbol(self) -> str:
        return "NOT IN" if self.negated else "IN"

    def java(self) -> str:
        shown = self.items if len(self.items) < 5 else hash_set_order(self.items)
        return f"{self.operand.java()} {self.symbol} ( {', '.join(shown)} )"

    def compile(self) -> Evaluator:
        f, items, negated = self.operand.compile(), frozenset(self.items), self.negated

        def in_(props):
            v = f(props)
            if type(v) is not str:
                return None
            return (v in items) is not negated
        return in_


def no_raise(f: Evaluator) -> Callable[[dict], bool]:
    """The broker's verdict on one message's properties: delivered only for TRUE; an EvalError drops it."""
    def matches(props) -> bool:
        try:
            return f(props) is True
        except EvalError:
            return False
    return matches


__all__ = ["Expression", "Property", "Constant", "Equal", "Relation", "And", "Or", "Not", "Negate", "BooleanCast",
           "In", "NULL", "TRUE", "FALSE", "Evaluator", "no_raise", "JInt", "JLong"]
