"""The SQL92 selector parser: RocketMQ 4.4.0's grammar (filter/.../parser/SelectorParser.jj) by recursive
descent, with its semantic checks at the same moments and its error texts.

Errors are what RocketMQ's `SqlFilter.compile` throws, as the broker's remark quotes them
(`MQFilterException.getMessage()` is the cause's `toString()`): a ParseException lists, as JavaCC does, every
token the parser looked for since it last consumed one (the choice points of the grammar below, by token
kind), a semantic check raises java.lang.RuntimeException with its own text, a bad number literal
java.lang.NumberFormatException, a character no token can start a TokenMgrError.

Grammar (loosest first; `{...}` repeats; the parser stops at the first token that cannot continue: there
is no end-of-input check, so `b LIKE 'x'` is the bare property `b`):

    selector    := or                                    (must be boolean: a property is cast)
    or          := and {OR and}
    and         := equality {AND equality}
    equality    := comparison {"=" comparison | "<>" comparison | IS NULL | IS NOT NULL}
    comparison  := unary {(">" | ">=" | "<" | "<=") unary | [NOT] BETWEEN unary AND unary
                          | [NOT] IN "(" string {"," string} ")"}
    unary       := "+" unary | "-" unary | NOT unary | primary
    primary     := literal | identifier | "(" or ")"
    literal     := string | decimal | floating | TRUE | FALSE | NULL
"""
from __future__ import annotations

from . import expression as X
from .java import DOUBLE_MAX, DOUBLE_MIN, EvalError, JInt, JLong, compare, double_to_string, number_to_string
from .lexer import IMAGES, Kind, Lexer, Token, TokenMgrError, escape

MAX_NESTING = 100      # parentheses and unary operators inside each other (the parser recurses)
MAX_DEPTH = 400        # of the expression tree (evaluation recurses): deeper selectors are refused

_LITERALS = {Kind.TRUE, Kind.FALSE, Kind.NULL, Kind.DECIMAL_LITERAL, Kind.FLOATING_POINT_LITERAL, Kind.STRING_LITERAL}
_PRIMARY = _LITERALS | {Kind.ID, Kind.LPAREN}
_UNARY = _PRIMARY | {Kind.NOT, Kind.MINUS}
_COMPARISON = {Kind.NOT, Kind.BETWEEN, Kind.IN, Kind.GT, Kind.GE, Kind.LT, Kind.LE}
_RELATIONS = {Kind.GT: ">", Kind.GE: ">=", Kind.LT: "<", Kind.LE: "<="}


class SelectorError(Exception):
    """A selector RocketMQ would refuse. `remark` is the text RocketMQ's broker answers
    (SUBSCRIPTION_PARSE_FAILED's remark): the Java exception's class and message."""

    def __init__(self, java_class: str, message: str):
        self.java_class = java_class
        self.message = message
        self.remark = f"{java_class}: {message}"
        super().__init__(self.remark)


def _runtime(msg: str) -> SelectorError:
    return SelectorError("java.lang.RuntimeException", msg)


class _ParseError(Exception):
    pass


class Parser:
    """One parse of one selector text (`parse()` once)."""

    def __init__(self, text: str):
        self.lexer = Lexer(text)
        self.tokens: list[Token] = []      # tokens read so far
        self.pos = 0                       # tokens consumed
        self.gen = 0                       # bumped by each consumed token
        self.looked: dict[str, tuple[int, frozenset]] = {}   # choice point -> (gen it last gave up at, kinds)
        self.nesting = 0

    # --- tokens ---------------------------------------------------------------------------------------
    def _peek(self, k: int = 1) -> Token:
        """The k-th token after the last consumed one (read from the lexer when first needed)."""
        while len(self.tokens) < self.pos + k:
            self.tokens.append(self.lexer.next())
        return self.tokens[self.pos + k - 1]

    def _kind(self, k: int = 1) -> Kind:
        return self._peek(k).kind

    def _consume(self, kind: Kind) -> Token:
        tok = self._peek()
        if tok.kind != kind:
            raise self._error(kind)
        self.pos += 1
        self.gen += 1
        return tok

    def _gave_up(self, point: str, kinds) -> None:
        self.looked[point] = (self.gen, frozenset(kinds))

    def _error(self, wanted: Kind | None = None) -> SelectorError:
        """JavaCC's generateParseException: the kinds every choice point gave up on since the last consumed
        token, plus the one a consume wanted, in kind order."""
        kinds = {k for gen, ks in self.looked.values() if gen == self.gen for k in ks}
        if wanted is not None:
            kinds.add(wanted)
        expected = sorted(kinds)
        tok = self._peek()
        seen = IMAGES[0] if tok.kind == Kind.EOF else f' {IMAGES[tok.kind]} "{escape(tok.image)} "'
        where = f"{tok.line}, column {tok.column}"
        head = "Was expecting:" if len(expected) == 1 else "Was expecting one of:"
        listed = "".join(f"{IMAGES[k]} ...\n    " for k in expected)
        return SelectorError("org.apache.rocketmq.filter.parser.ParseException",
                             f'Encountered "{seen}" at line {where}.\n{head}\n    {listed}')

    # --- grammar --------------------------------------------------------------------------------------
    def parse(self) -> X.Expression:
        try:
            e = self._as_boolean(self._or())
        except TokenMgrError as e:
            raise SelectorError(TokenMgrError.java_class, str(e)) from None
        return e

    def _as_boolean(self, e: X.Expression) -> X.Expression:
        if e.boolean:
            return e
        if isinstance(e, X.Property):
            return X.BooleanCast(e)
        raise SelectorError("org.apache.rocketmq.filter.parser.ParseException",
                            f"Expression will not result in a boolean value: {e.java()}")

    def _or(self) -> X.Expression:
        return self._logic(self._and, Kind.OR, "or", X.Or)

    def _and(self) -> X.Expression:
        return self._logic(self._equality, Kind.AND, "and", X.And)

    def _logic(self, operand, kind: Kind, point: str, make) -> X.Expression:
        """operand {kind operand}, left-associative; each side must be boolean (a property is cast)."""
        left = operand()
        while True:
            if self._kind() != kind:
                self._gave_up(point, (kind,))
                return left
            self._consume(kind)
            right = operand()
            left = make(self._as_boolean(left), self._as_boolean(right))
            self._check_depth(left)

    def _equality(self) -> X.Expression:
        left = self._comparison()
        while True:
            k = self._kind()
            if k not in (Kind.IS, Kind.EQ, Kind.NE):
                self._gave_up("equality", (Kind.IS, Kind.EQ, Kind.NE))
                return left
            if k == Kind.EQ:
                self._consume(Kind.EQ)
                left = _equal(left, self._comparison())
            elif k == Kind.NE:
                self._consume(Kind.NE)
                left = X.Not(_equal(left, self._comparison()))
            else:
                self._gave_up("equality-op", (Kind.EQ, Kind.NE))
                if self._kind(2) == Kind.NULL:
                    self._consume(Kind.IS)
                    self._consume(Kind.NULL)
                    left = X.Equal(left, X.NULL)
                else:
                    self._consume(Kind.IS)
                    self._consume(Kind.NOT)
                    self._consume(Kind.NULL)
                    left = X.Not(X.Equal(left, X.NULL))
            self._check_depth(left)

    def _comparison(self) -> X.Expression:
        left = self._unary()
        while True:
            k = self._kind()
            if k not in _COMPARISON:
                self._gave_up("comparison", _COMPARISON)
                return left
            if k in _RELATIONS:
                self._consume(k)
                left = _relation(_RELATIONS[k], left, self._unary())
            elif k == Kind.BETWEEN:
                self._consume(Kind.BETWEEN)
                low = self._unary()
                self._consume(Kind.AND)
                left = _between(left, low, self._unary())
            else:
                self._gave_up("comparison-op", (Kind.GT, Kind.GE, Kind.LT, Kind.LE, Kind.BETWEEN))
                if k == Kind.NOT and self._kind(2) == Kind.BETWEEN:
                    self._consume(Kind.NOT)
                    self._consume(Kind.BETWEEN)
                    low = self._unary()
                    self._consume(Kind.AND)
                    high = self._unary()
                    left = X.Or(_relation("<", left, low), _relation(">", left, high))
                elif k == Kind.IN:
                    self._consume(Kind.IN)
                    left = _in(left, self._string_list("in-list"), False)
                else:
                    self._gave_up("comparison-in", (Kind.IN,))
                    if self._kind(2) != Kind.IN:
                        raise self._error()
                    self._consume(Kind.NOT)
                    self._consume(Kind.IN)
                    left = _in(left, self._string_list("not-in-list"), True)
            self._check_depth(left)

    def _string_list(self, point: str) -> list[str]:
        self._consume(Kind.LPAREN)
        items = [self._string()]
        while self._kind() == Kind.COMMA:
            self._consume(Kind.COMMA)
            items.append(self._string())
        self._gave_up(point, (Kind.COMMA,))
        self._consume(Kind.RPAREN)
        return items

    def _unary(self) -> X.Expression:
        self.nesting += 1
        try:
            if self.nesting > MAX_NESTING:
                raise _runtime(f"the expression nests deeper than {MAX_NESTING} levels of parentheses and "
                               "unary operators")
            k = self._kind()
            if k == Kind.PLUS and _Scan(self).unary_after_plus():
                self._consume(Kind.PLUS)
                return self._unary()
            if k == Kind.MINUS:
                self._consume(Kind.MINUS)
                return X.Negate(self._unary())
            if k == Kind.NOT:
                self._consume(Kind.NOT)
                return X.Not(self._as_boolean(self._unary()))
            if k in _PRIMARY:
                return self._primary()
            self._gave_up("unary", _UNARY)
            raise self._error()
        finally:
            self.nesting -= 1

    def _primary(self) -> X.Expression:
        k = self._kind()
        if k in _LITERALS:
            return self._literal()
        if k == Kind.ID:
            return X.Property(self._consume(Kind.ID).image)
        self._consume(Kind.LPAREN)
        e = self._or()
        self._consume(Kind.RPAREN)
        return e

    def _literal(self) -> X.Expression:
        k = self._kind()
        if k == Kind.STRING_LITERAL:
            return X.Constant(self._string())
        if k == Kind.DECIMAL_LITERAL:
            return X.Constant(_decimal(self._consume(k).image))
        if k == Kind.FLOATING_POINT_LITERAL:
            return X.Constant(_floating(self._consume(k).image))
        self._consume(k)
        return {Kind.TRUE: X.TRUE, Kind.FALSE: X.FALSE, Kind.NULL: X.NULL}[k]

    def _string(self) -> str:
        image = self._consume(Kind.STRING_LITERAL).image
        return _from_utf16(image[1:-1].replace("''", "'"))

    @staticmethod
    def _check_depth(e: X.Expression) -> None:
        if e.depth > MAX_DEPTH:
            raise _runtime(f"the expression is deeper than {MAX_DEPTH} operators")


class _Scan:
    """The syntactic look-ahead of `"+" unary` (JavaCC's infinite LOOKAHEAD): does a unary expression follow
    the "+"? Reads tokens as far as it goes (a lexical error on the way is raised, as RocketMQ's is)."""

    def __init__(self, p: Parser):
        self.p = p

    def kind(self, i: int) -> Kind:
        return self.p._peek(i).kind

    def unary_after_plus(self) -> bool:
        return self.unary(2) is not None

    def unary(self, i: int) -> int | None:
        """Index after a unary expression starting at token i (1-based from the parser's position)."""
        k = self.kind(i)
        if k in (Kind.PLUS, Kind.MINUS, Kind.NOT):
            return self.unary(i + 1)
        if k in _LITERALS or k == Kind.ID:
            return i + 1
        if k == Kind.LPAREN:
            j = self.or_(i + 1)
            return j + 1 if j is not None and self.kind(j) == Kind.RPAREN else None
        return None

    def _repeat(self, i: int | None, tail) -> int | None:
        """i, then as many tails as follow (each tail(i) is the index after it, or None)."""
        while i is not None:
            j = tail(i)
            if j is None:
                return i
            i = j
        return None

    def or_(self, i: int) -> int | None:
        return self._repeat(self.and_(i), lambda j: self.and_(j + 1) if self.kind(j) == Kind.OR else None)

    def and_(self, i: int) -> int | None:
        return self._repeat(self.equality(i), lambda j: self.equality(j + 1) if self.kind(j) == Kind.AND else None)

    def equality(self, i: int) -> int | None:
        return self._repeat(self.comparison(i), self.equality_tail)

    def equality_tail(self, i: int) -> int | None:
        k = self.kind(i)
        if k in (Kind.EQ, Kind.NE):
            return self.comparison(i + 1)
        if k == Kind.IS and self.kind(i + 1) == Kind.NULL:
            return i + 2
        if k == Kind.IS and self.kind(i + 1) == Kind.NOT and self.kind(i + 2) == Kind.NULL:
            return i + 3
        return None

    def comparison(self, i: int) -> int | None:
        return self._repeat(self.unary(i), self.comparison_tail)

    def comparison_tail(self, i: int) -> int | None:
        k = self.kind(i)
        if k in _RELATIONS:
            return self.unary(i + 1)
        if k == Kind.NOT and self.kind(i + 1) == Kind.BETWEEN:
            i += 1
            k = Kind.BETWEEN
        if k == Kind.BETWEEN:
            j = self.unary(i + 1)
            if j is None or self.kind(j) != Kind.AND:
                return None
            return self.unary(j + 1)
        if k == Kind.NOT and self.kind(i + 1) == Kind.IN:
            i += 1
            k = Kind.IN
        if k == Kind.IN:
            if self.kind(i + 1) != Kind.LPAREN or self.kind(i + 2) != Kind.STRING_LITERAL:
                return None
            j = i + 3
            while self.kind(j) == Kind.COMMA and self.kind(j + 1) == Kind.STRING_LITERAL:
                j += 2
            return j + 1 if self.kind(j) == Kind.RPAREN else None
        return None


# --- the semantic checks (ComparisonExpression.create*, ConstantExpression.create*) ---------------------
def _equal(left: X.Expression, right: X.Expression) -> X.Expression:
    for e in (left, right):
        if isinstance(e, X.Constant) and e.value is None:
            raise _runtime(f"'{e.java()}' cannot be compared.")
    if isinstance(left, X.Constant) and isinstance(right, X.Constant) and left.boolean and not right.boolean:
        raise _runtime(f"'{left.java()}' cannot be compared with '{right.java()}'")
    return X.Equal(left, right)


def _check_ordered(e: X.Expression) -> None:
    if isinstance(e, X.Constant):
        if type(e.value) in (JInt, JLong, float):
            return
        raise _runtime(f"Value '{e.java()}' cannot be compared.")
    if e.boolean:
        raise _runtime(f"Value '{e.java()}' cannot be compared.")


def _relation(symbol: str, left: X.Expression, right: X.Expression) -> X.Expression:
    _check_ordered(left)
    _check_ordered(right)
    return X.Relation(symbol, left, right)


def _between(value: X.Expression, low: X.Expression, high: X.Expression) -> X.Expression:
    if isinstance(low, X.Constant) and isinstance(high, X.Constant):
        lv, rv = low.value, high.value
        if lv is None or rv is None:
            raise _runtime("Illegal values of between, values can not be null!")
        try:
            wrong = compare(rv, lv) < 0
        except EvalError as e:
            raise _conversion_error(rv, lv, e) from None
        if wrong:
            raise _runtime(f"Illegal values of between, left value({_plain(lv)}) must less than or equal to "
                           f"right value({_plain(rv)})")
    return X.And(_relation(">=", value, low), _relation("<=", value, high))


def _conversion_error(a, b, e: EvalError) -> SelectorError:
    if type(a) is bool and type(b) is str:
        return SelectorError("java.lang.ClassCastException",
                             "class java.lang.Boolean cannot be cast to class java.lang.String (java.lang.Boolean "
                             "and java.lang.String are in module java.base of loader 'bootstrap')")
    return _runtime(f"java.lang.NumberFormatException: {e}")


def _plain(v) -> str:
    """String.format("%s", v) of a constant's value."""
    if type(v) is bool:
        return "true" if v else "false"
    if type(v) is str:
        return v
    return number_to_string(v)


def _in(left: X.Expression, items: list[str], negated: bool) -> X.Expression:
    if not isinstance(left, X.Property):
        raise _runtime(f"Expected a property for In expression, got: {left.java()}")
    return X.In(left, items, negated)


def _decimal(text: str):
    """ConstantExpression.createFromDecimal: an Integer when it fits, else a Long; past a long: refused."""
    digits = text[:-1] if text[-1] in "lL" else text
    v = int(digits)
    if v > (1 << 63) - 1:
        raise SelectorError("java.lang.NumberFormatException", f'For input string: "{digits}"')
    return JInt(v) if v <= (1 << 31) - 1 else JLong(v)


def _floating(text: str) -> float:
    """ConstantExpression.createFloat: refused above Double.MAX_VALUE and below Double.MIN_VALUE (so 0.0)."""
    v = float(text)
    if v > DOUBLE_MAX:
        raise _runtime(f"{text} is greater than {double_to_string(DOUBLE_MAX)}")
    if v < DOUBLE_MIN:
        raise _runtime(f"{text} is less than {double_to_string(DOUBLE_MIN)}")
    return v


def _from_utf16(s: str) -> str:
    """The lexer reads UTF-16 code units (as Java): join surrogate pairs back into characters."""
    try:
        return s.encode("utf-16-be", "surrogatepass").decode("utf-16-be")
    except UnicodeDecodeError:
        return s        # a lone surrogate stays one


def to_utf16(text: str) -> str:
    """The selector as Java sees it: one Python character per UTF-16 code unit."""
    if all(ord(c) <= 0xFFFF for c in text):
        return text
    raw = text.encode("utf-16-be", "surrogatepass")
    return "".join(chr(int.from_bytes(raw[i:i + 2], "big")) for i in range(0, len(raw), 2))


def parse(text: str) -> X.Expression:
    """Compile a selector as RocketMQ 4.4.0's SqlFilter does; SelectorError as it refuses."""
    return Parser(to_utf16(text)).parse()

