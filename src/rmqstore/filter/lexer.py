"""The SQL92 selector's tokens, read as RocketMQ 4.4.0's generated token manager reads them: longest match
over every token at once (a tie goes to the token declared first: keywords before identifiers), lines and
columns counted as its character stream counts them (from 1; a tab moves to the next multiple of 8; \\r,
\\n and \\r\\n end a line), and a character no token can start or continue is a lexical error raised only
when the parser asks for that token (there is no end-of-input check: what follows a complete expression is
never read beyond the one token the parser looks at).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass


class Kind(enum.IntEnum):
    """Token kinds, numbered as RocketMQ's SelectorParserConstants (error messages list them in this order)."""
    EOF = 0
    SPACE = 1
    TAB = 2
    LF = 3
    CR = 4
    FF = 5
    LINE_COMMENT = 6
    BLOCK_COMMENT = 7
    NOT = 8
    AND = 9
    OR = 10
    BETWEEN = 11
    IN = 12
    TRUE = 13
    FALSE = 14
    NULL = 15
    IS = 16
    DECIMAL_LITERAL = 17
    FLOATING_POINT_LITERAL = 18
    EXPONENT = 19
    STRING_LITERAL = 20
    ID = 21
    EQ = 22
    NE = 23
    GT = 24
    GE = 25
    LT = 26
    LE = 27
    LPAREN = 28
    COMMA = 29
    RPAREN = 30
    PLUS = 31
    MINUS = 32


IMAGES = ['<EOF>', '" "', '"\\t"', '"\\n"', '"\\r"', '"\\f"', '<LINE_COMMENT>', '<BLOCK_COMMENT>', '"NOT"', '"AND"',
          '"OR"', '"BETWEEN"', '"IN"', '"TRUE"', '"FALSE"', '"NULL"', '"IS"', '<DECIMAL_LITERAL>',
          '<FLOATING_POINT_LITERAL>', '<EXPONENT>', '<STRING_LITERAL>', '<ID>', '"="', '"<>"', '">"', '">="', '"<"',
          '"<="', '"("', '","', '")"', '"+"', '"-"']
KEYWORDS = {k.name: k for k in (Kind.NOT, Kind.AND, Kind.OR, Kind.BETWEEN, Kind.IN, Kind.TRUE, Kind.FALSE,
                                Kind.NULL, Kind.IS)}
OPERATORS = {"=": Kind.EQ, "<>": Kind.NE, ">": Kind.GT, ">=": Kind.GE, "<": Kind.LT, "<=": Kind.LE,
             "(": Kind.LPAREN, ",": Kind.COMMA, ")": Kind.RPAREN, "+": Kind.PLUS, "-": Kind.MINUS}
WHITESPACE = {" ": Kind.SPACE, "\t": Kind.TAB, "\n": Kind.LF, "\r": Kind.CR, "\f": Kind.FF}
SKIPPED = (Kind.SPACE, Kind.TAB, Kind.LF, Kind.CR, Kind.FF, Kind.LINE_COMMENT, Kind.BLOCK_COMMENT)
_ID_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_$")
_ID_PART = _ID_START | frozenset("0123456789")
_DIGITS = frozenset("0123456789")


@dataclass(frozen=True, slots=True)
class Token:
    kind: Kind
    image: str
    line: int
    column: int


class TokenMgrError(Exception):
    """org.apache.rocketmq.filter.parser.TokenMgrError (a lexical error)."""

    java_class = "org.apache.rocketmq.filter.parser.TokenMgrError"


def escape(s: str) -> str:
    """JavaCC's addEscapes: the text of a token or character in an error message."""
    out = []
    for ch in s:
        if ch == "\0":
            continue
        esc = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r", '"': '\\"', "'": "\\'",
               "\\": "\\\\"}.get(ch)
        if esc is not None:
            out.append(esc)
        elif ord(ch) < 0x20 or ord(ch) > 0x7E:
            out.extend(f"\\u{u:04x}" for u in _utf16(ch))
        else:
            out.append(ch)
    return "".join(out)


def _utf16(ch: str) -> list[int]:
    b = ch.encode("utf-16-be", "surrogatepass")
    return [int.from_bytes(b[i:i + 2], "big") for i in range(0, len(b), 2)]


# --- the matchers: each returns (length of its longest match or 0, length of its longest viable prefix) ---
def _number(s: str, i: int) -> tuple[int, int, int]:
    """(DECIMAL_LITERAL match length, FLOATING_POINT_LITERAL match length, viable prefix length)."""
    n = len(s)
    j = i
    while j < n and s[j] in _DIGITS:
        j += 1
    ndig = j - i
    dec = 0
    if ndig:
        if s[i] == "0":
            dec = 1
        else:
            dec = ndig + (1 if j < n and s[j] in "lL" else 0)
    flt, viable = 0, max(dec, ndig)
    k = j
    if k < n and s[k] == ".":
        k += 1
        m = k
        while m < n and s[m] in _DIGITS:
            m += 1
        if ndig or m > k:
            flt = m - i
            viable = max(viable, m - i)
            e_len, e_viable = _exponent(s, m)
            flt += e_len
            viable = max(viable, m - i + e_viable)
        else:
            viable = max(viable, 1)      # "." alone may still become ".5"
    elif ndig:
        e_len, e_viable = _exponent(s, j)
        if e_len:
            flt = ndig + e_len
        viable = max(viable, ndig + e_viable)
    return dec, flt, viable


def _exponent(s: str, i: int) -> tuple[int, int]:
    """(match length, viable length) of [eE][+-]?[0-9]+ at i."""
    n = len(s)
    if i >= n or s[i] not in "eE":
        return 0, 0
    j = i + 1
    if j < n and s[j] in "+-":
        j += 1
    k = j
    while k < n and s[k] in _DIGITS:
        k += 1
    return (k - i, k - i) if k > j else (0, j - i)


def _string(s: str, i: int) -> tuple[int, int]:
    """'...' with '' for a quote: the longest complete literal (a quote pair may also be an end and a start)."""
    n = len(s)
    if s[i] != "'":
        return 0, 0
    j, last = i + 1, 0
    while j < n:
        if s[j] == "'":
            last = j + 1 - i
            if j + 1 < n and s[j + 1] == "'":
                j += 2
                continue
            return last, last
        j += 1
    return last, n - i


def _line_comment(s: str, i: int) -> tuple[int, int]:
    if not s.startswith("--", i):
        return 0, (1 if s[i] == "-" else 0)
    j = i + 2
    n = len(s)
    while j < n and s[j] not in "\r\n":
        j += 1
    if j >= n:
        return 0, n - i
    if s[j] == "\r" and j + 1 < n and s[j + 1] == "\n":
        return j + 2 - i, j + 2 - i
    return j + 1 - i, j + 1 - i


def _block_comment(s: str, i: int) -> tuple[int, int]:
    if not s.startswith("/*", i):
        return 0, (1 if s[i] == "/" else 0)
    end = s.find("*/", i + 2)
    if end < 0:
        return 0, len(s) - i
    return end + 2 - i, end + 2 - i


class Lexer:
    """Tokens of one expression, read on demand (`next()`); positions as RocketMQ's SimpleCharStream."""

    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self._line, self._col = 1, 0
        self._cr = self._lf = False
        self._positions: list[tuple[int, int]] = []     # (line, column) of each character read so far

    def _position(self, i: int) -> tuple[int, int]:
        """(line, column) of character i, counting characters up to it as SimpleCharStream.UpdateLineColumn."""
        ps = self._positions
        while len(ps) <= i:
            c = self.text[len(ps)]
            self._col += 1
            if self._lf:
                self._lf = False
                self._line += 1
                self._col = 1
            elif self._cr:
                self._cr = False
                if c == "\n":
                    self._lf = True
                else:
                    self._line += 1
                    self._col = 1
            if c == "\r":
                self._cr = True
            elif c == "\n":
                self._lf = True
            elif c == "\t":
                self._col -= 1
                self._col += 8 - self._col % 8
            ps.append((self._line, self._col))
        return ps[i]

    def next(self) -> Token:
        s, n = self.text, len(self.text)
        while True:
            i = self.pos
            if i >= n:
                line, col = self._position(n - 1) if n else (0, 0)
                return Token(Kind.EOF, "", line, col)
            kind, length, viable = self._match(s, i)
            if kind is None:
                raise self._lexical_error(i, viable)
            self.pos = i + length
            if kind in SKIPPED:
                continue
            line, col = self._position(i)
            return Token(kind, s[i:i + length], line, col)

    @staticmethod
    def _match(s: str, i: int) -> tuple[Kind | None, int, int]:
        """The longest token at i (a tie: the lower kind), and the longest prefix some token could start."""
        c = s[i]
        cands: list[tuple[int, Kind]] = []
        viable = 0
        if c in WHITESPACE:
            cands.append((1, WHITESPACE[c]))
        for matcher, kind in ((_line_comment, Kind.LINE_COMMENT), (_block_comment, Kind.BLOCK_COMMENT),
                              (_string, Kind.STRING_LITERAL)):
            m, v = matcher(s, i)
            viable = max(viable, v)
            if m:
                cands.append((m, kind))
        if c in _ID_START:
            j = i + 1
            while j < len(s) and s[j] in _ID_PART:
                j += 1
            word = s[i:j]
            cands.append((j - i, KEYWORDS.get(word.upper(), Kind.ID)))
        if c in _DIGITS or c == ".":
            dec, flt, v = _number(s, i)
            viable = max(viable, v)
            if dec:
                cands.append((dec, Kind.DECIMAL_LITERAL))
            if flt:
                cands.append((flt, Kind.FLOATING_POINT_LITERAL))
        two = s[i:i + 2]
        if two in OPERATORS:
            cands.append((2, OPERATORS[two]))
        elif c in OPERATORS:
            cands.append((1, OPERATORS[c]))
        if not cands:
            return None, 0, viable
        length, kind = max(cands, key=lambda lk: (lk[0], -lk[1]))
        return kind, length, max(viable, length)

    def _lexical_error(self, i: int, viable: int) -> TokenMgrError:
        """TokenMgrError as the token manager builds it: the position of the last character it read, and
        either that character ("Encountered: "c" (code), after : prefix") or <EOF> one column further."""
        s, n = self.text, len(self.text)
        read = i + viable + 1 if i + viable < n else n      # characters read: the one that killed the match
        cur = read - 1
        consumed = read - i                                  # curPos of the token manager
        line, col = self._position(cur)
        ch = s[cur]
        if read >= n:
            after = "" if consumed <= 1 else s[i:read]
            if ch in "\r\n":
                line, col = line + 1, 0
            else:
                col += 1
            what = "<EOF> "
        else:
            after = "" if consumed <= 1 else s[i:cur]
            what = f'"{escape(ch)}" ({_utf16(ch)[0]}), '
        return TokenMgrError(f"Lexical error at line {line}, column {col}.  Encountered: {what}"
                             f'after : "{escape(after)}"')
