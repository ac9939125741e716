"""SQL92 message selectors: RocketMQ 4.4.0's property filter (`MessageSelector.bySql` in its 4.x clients,
`FilterExpression(expr, SQL92)` in the 5.x ones), compiled and evaluated exactly as its filter module does.

    from rmqstore.filter import MessageSelector, compile_sql92, SelectorError
    sel = compile_sql92("region = 'eu' AND amount BETWEEN 10 AND 100")
    sel.matches({"region": "eu", "amount": "42"})        # True: delivered
    sel.matches_many(list_of_property_dicts)            # a batch: each distinct combination judged once
    consumer.subscribe("Orders", MessageSelector.by_sql("amount > 100"))

Grammar (filter/.../parser/SelectorParser.jj; loosest first, keywords in any case):

    selector    := or                          a property alone is cast to boolean (always FALSE or unknown)
    or          := and {OR and}
    and         := equality {AND equality}
    equality    := comparison {"=" comparison | "<>" comparison | IS NULL | IS NOT NULL}
    comparison  := unary {(">" | ">=" | "<" | "<=") unary | [NOT] BETWEEN unary AND unary
                          | [NOT] IN "(" 'string' {"," 'string'} ")"}
    unary       := "+" unary | "-" unary | NOT unary | primary       NOT binds to the next primary:
    primary     := literal | identifier | "(" or ")"                  `NOT a = 5` is `(NOT a) = 5`
    literal     := 'string' ('' for a quote) | decimal [l|L] (Integer, else Long) | 5.5 5. .5 5E10 (Double)
                   | TRUE | FALSE | NULL
    identifier  := [a-zA-Z_$][a-zA-Z0-9_$]*    case kept: property names are case-sensitive
    comments    := -- to the end of a line (only when a line end follows), /* ... */

The parser stops at the first token that cannot continue the selector and ignores the rest (`b LIKE 'x'`
is the bare property `b`). Refused when compiling (SelectorError; `remark` is the text RocketMQ's broker
answers, class and message, e.g. `org.apache.rocketmq.filter.parser.ParseException: Encountered " "AND"
"AND "" at line 1, column 5. Was expecting one of: ...`): syntax errors (JavaCC's messages, positions and
expected tokens), a character no token can start (TokenMgrError), a string, boolean or NULL constant or a
boolean expression compared with <, <=, >, >= or BETWEEN, NULL compared with = or <>, a boolean constant =
another kind of constant, constant BETWEEN bounds that are null or reversed, IN on anything but a property,
a decimal beyond a long, a floating literal beyond Double's range or below Double.MIN_VALUE (0.0 too).
Beyond RocketMQ: more than 100 nested parentheses or unary operators, or a tree deeper than 400 operators,
are refused (RocketMQ would overflow its stack on far deeper ones).

Evaluation (ComparisonExpression, LogicExpression, UnaryExpression, ConstantExpression): a message's
properties are Strings (user and system ones: TAGS, KEYS, UNIQ_KEY, ...); an absent one is null. Only TRUE
delivers; FALSE and null (unknown) do not, and an exception anywhere (a failed conversion) drops the message
even inside an OR that would be TRUE later. Against a number constant a String converts with that number's
class (Integer.valueOf, Long.valueOf, Double.valueOf: `a = 5` matches "05", fails on "2.5"); against TRUE or
FALSE it is Boolean.valueOf ("true" in any case); two Strings (two properties) compare as strings with =,
as doubles with <, >; numbers widen (Integer, Long, Double; Double's NaN above everything). `=` with an
absent left side is unknown, with an absent right side FALSE, both absent TRUE; IS NULL never unknown;
<, > and BETWEEN with an absent side unknown; IN is exact string membership, unknown when absent; AND / OR
three-valued and short-circuit left to right; unary minus on a property is null.

Modules: lexer.py (tokens, positions, lexical errors), parser.py (grammar, checks, error texts),
expression.py (the tree, its toString, closures), java.py (Java's conversions and compareTo),
selector.py (compiled selectors, their cache and batches; MessageSelector), bloom.py (the bit maps'
bloom filter), consumer_filter.py (registered selectors per topic and group, bit maps at dispatch, the
store's MessageFilter). Used by the 4.x broker (broker/filter.py), the gRPC endpoint (proxy/pull.py), the
in-process consumers (messaging/consumer.py), the Spark source (option messageSelector) and the store's
consume queue extension (store/consumequeue/consume_queue_ext.py).
"""
from .parser import SelectorError
from .selector import SQL92, TAG, MessageSelector, SqlExpression, compile_sql92, is_tag_type

__all__ = ["MessageSelector", "SelectorError", "SqlExpression", "compile_sql92", "is_tag_type", "SQL92", "TAG"]
