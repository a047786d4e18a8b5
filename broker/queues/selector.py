"""Message selectors: the consumer argument ``x-filter``, JMS-selector syntax (SQL-92 subset).

``compile_selector(text)`` parses once (at basic.consume) and returns a predicate over a
message; an invalid expression raises ``SelectorError`` naming the position, which the
channel turns into 406 PRECONDITION_FAILED. The grammar is JMS 2.0's message selector
(also what ActiveMQ and RocketMQ's SQL92 filters accept):

* literals: ``'text'`` (``''`` escapes a quote), integers, decimals and ``1e3``, TRUE, FALSE;
* identifiers: an application header of that name, else a message property: the AMQP names
  (``priority``, ``message_id``, ``correlation_id``, ``type``, ``app_id``, ``user_id``,
  ``timestamp``, ``delivery_mode``, ``content_type``, ``content_encoding``, ``reply_to``,
  ``expiration``), their JMS names (``JMSPriority``, ``JMSMessageID``, ``JMSCorrelationID``,
  ``JMSType``, ``JMSTimestamp``, ``JMSDeliveryMode``), and ``routing_key`` / ``exchange``;
* ``= <> < > <= >=``, ``+ - * /``, ``[NOT] BETWEEN a AND b``, ``[NOT] IN ('a', 'b')``,
  ``[NOT] LIKE 'pat%' [ESCAPE '!']``, ``IS [NOT] NULL``, ``AND``, ``OR``, ``NOT``, parentheses.

Evaluation uses SQL's three-valued logic: a missing identifier is NULL, any comparison with
NULL is unknown, and a message is selected only when the whole expression is TRUE.
Comparing a string with a number is unknown too (JMS: no conversions).
"""
from __future__ import annotations

import operator
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from lark import Lark, Token, Transformer, UnexpectedInput, v_args
from lark.exceptions import UnexpectedToken, VisitError

__all__ = ["SelectorError", "compile_selector"]

_GRAMMAR = r"""
?start: or_expr
?or_expr: and_expr (_OR and_expr)*        -> or_
?and_expr: not_expr (_AND not_expr)*      -> and_
?not_expr: _NOT not_expr                  -> not_
         | predicate
?predicate: sum COMPARE sum                             -> compare
          | sum _BETWEEN sum _AND sum                   -> between
          | sum _NOT_BETWEEN sum _AND sum               -> not_between
          | sum _NOT_IN "(" literal ("," literal)* ")"  -> not_in
          | sum _IN "(" literal ("," literal)* ")"      -> in_
          | sum _NOT_LIKE STRING (_ESCAPE STRING)?      -> not_like
          | sum _LIKE STRING (_ESCAPE STRING)?          -> like
          | sum _IS _NOT _NULL                          -> is_not_null
          | sum _IS _NULL                               -> is_null
          | sum
?sum: product (ADD_OP product)*           -> arith
?product: unary (MUL_OP unary)*           -> arith
?unary: ADD_OP unary                      -> neg
      | atom
?atom: literal
     | IDENT                              -> ident
     | "(" or_expr ")"
literal: STRING | NUMBER | TRUE | FALSE

COMPARE: "<>" | "<=" | ">=" | "=" | "<" | ">"
ADD_OP: "+" | "-"
MUL_OP: "*" | "/"
STRING: /'(?:[^']|'')*'/
NUMBER: /(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?/
TRUE.2: /TRUE\b/i
FALSE.2: /FALSE\b/i
_OR.2: /OR\b/i
_AND.2: /AND\b/i
_NOT_IN.3: /NOT\s+IN\b/i
_NOT_BETWEEN.3: /NOT\s+BETWEEN\b/i
_NOT_LIKE.3: /NOT\s+LIKE\b/i
_NOT.2: /NOT\b/i
_BETWEEN.2: /BETWEEN\b/i
_IN.2: /IN\b/i
_LIKE.2: /LIKE\b/i
_ESCAPE.2: /ESCAPE\b/i
_IS.2: /IS\b/i
_NULL.2: /NULL\b/i
IDENT: /[A-Za-z_$][A-Za-z0-9_$.\-]*/
%ignore /\s+/
"""

_PARSER: Lark | None = None  # built on first use: building the LALR tables costs a broker
# start ~50 ms, and most brokers never see a selector


def _parser() -> Lark:
    global _PARSER
    if _PARSER is None:
        _PARSER = Lark(_GRAMMAR, parser="lalr", propagate_positions=False,
                       maybe_placeholders=False)
    return _PARSER

_PROPERTY_NAMES = {
    "priority": "priority", "jmspriority": "priority",
    "message_id": "message_id", "jmsmessageid": "message_id",
    "correlation_id": "correlation_id", "jmscorrelationid": "correlation_id",
    "type": "type", "jmstype": "type",
    "timestamp": "timestamp", "jmstimestamp": "timestamp",
    "delivery_mode": "delivery_mode", "jmsdeliverymode": "delivery_mode",
    "app_id": "app_id", "user_id": "user_id", "content_type": "content_type",
    "content_encoding": "content_encoding", "reply_to": "reply_to", "expiration": "expiration",
}
_MAX_LENGTH = 4096

Message = Any
Expr = Callable[[Message], Any]


class SelectorError(ValueError):
    """An invalid selector; ``position`` is the 1-based character where it went wrong."""

    def __init__(self, position: int, detail: str):
        super().__init__(f"at position {position}: {detail}")
        self.position = position
        self.detail = detail


def _norm(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, Decimal):
        return float(value)
    return value


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_MISSING = object()


def _lookup(name: str) -> Expr:
    prop = _PROPERTY_NAMES.get(name.lower())

    def value(message: Message) -> Any:
        headers = message.properties.get("headers")
        if headers:
            v = headers.get(name, _MISSING)
            if v is not _MISSING:
                t = type(v)
                if t is str or t is int:
                    return v
                return v.decode("utf-8", "replace") if t is bytes else _norm(v)
        if prop is not None:
            return _norm(message.properties.get(prop))
        if name == "routing_key":
            return message.routing_key
        if name == "exchange":
            return message.exchange
        return None
    return value


class _Const:
    """A literal: compare and IN read ``value`` once, at compile time."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __call__(self, _m: Message) -> Any:
        return self.value


def _const(v: Any) -> Expr:
    return _Const(v)


_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "<>": operator.ne, "<": operator.lt, ">": operator.gt,
    "<=": operator.le, ">=": operator.ge}


def _cmp(op: str, a: Any, b: Any) -> bool | None:
    if a is None or b is None:
        return None
    if _number(a) and _number(b):
        pass
    elif type(a) is not type(b):
        return None  # no conversions between strings, numbers and booleans
    elif isinstance(a, bool) and op not in ("=", "<>"):
        return None
    if op == "=":
        return bool(a == b)
    if op == "<>":
        return bool(a != b)
    if op == "<":
        return bool(a < b)
    if op == ">":
        return bool(a > b)
    if op == "<=":
        return bool(a <= b)
    return bool(a >= b)


def _like_regex(pattern: str, escape: str | None) -> re.Pattern[str]:
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if escape is not None and c == escape and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if c == "%" else "." if c == "_" else re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def _string(token: Token) -> str:
    return str(token)[1:-1].replace("''", "'")


@v_args(inline=True)
class _Compile(Transformer[Token, Expr]):
    def literal(self, tok: Token) -> Expr:
        if tok.type == "STRING":
            return _const(_string(tok))
        if tok.type == "TRUE":
            return _const(True)
        if tok.type == "FALSE":
            return _const(False)
        text = str(tok)
        return _const(int(text) if text.isdigit() else float(text))

    def ident(self, tok: Token) -> Expr:
        return _lookup(str(tok))

    def neg(self, op: Token, operand: Expr) -> Expr:
        if op == "+":
            return operand

        def f(m: Message) -> Any:
            v = operand(m)
            return -v if _number(v) else None
        return f

    def arith(self, first: Expr, *rest: Any) -> Expr:
        if not rest:  # a lone operand (the grammar wraps every value in sum and product)
            return first
        pairs = list(zip(rest[::2], rest[1::2], strict=True))

        def f(m: Message) -> Any:
            acc = first(m)
            for op, operand in pairs:
                v = operand(m)
                if not (_number(acc) and _number(v)):
                    return None
                if op == "+":
                    acc = acc + v
                elif op == "-":
                    acc = acc - v
                elif op == "*":
                    acc = acc * v
                elif v == 0:
                    return None
                else:
                    acc = acc / v
            return acc
        return f

    def compare(self, a: Expr, op: Token, b: Expr) -> Expr:
        o = str(op)
        if isinstance(b, _Const) and not isinstance(a, _Const):
            # the usual `name OP literal`: _cmp's rules with the literal's type known
            c, fn = b.value, _OPS[o]
            if _number(c):
                def number(m: Message) -> bool | None:
                    v = a(m)
                    return bool(fn(v, c)) if _number(v) else None
                return number
            if type(c) is str:
                def text(m: Message) -> bool | None:
                    v = a(m)
                    return bool(fn(v, c)) if type(v) is str else None
                return text
        return lambda m: _cmp(o, a(m), b(m))

    def between(self, value: Expr, low: Expr, high: Expr) -> Expr:
        def f(m: Message) -> bool | None:
            v = value(m)
            lo = _cmp(">=", v, low(m))
            hi = _cmp("<=", v, high(m))
            if lo is False or hi is False:
                return False
            if lo is None or hi is None:
                return None
            return True
        return f

    def not_between(self, value: Expr, low: Expr, high: Expr) -> Expr:
        inner = self.between(value, low, high)
        return lambda m: _not(inner(m))

    def in_(self, value: Expr, *items: Expr) -> Expr:
        consts = [i(None) for i in items]
        texts = frozenset(consts) if all(type(c) is str for c in consts) else None

        def f(m: Message) -> bool | None:
            v = value(m)
            if v is None:
                return None
            if texts is not None and type(v) is str:
                return v in texts
            return any(_cmp("=", v, c) for c in consts)
        return f

    def not_in(self, value: Expr, *items: Expr) -> Expr:
        inner = self.in_(value, *items)
        return lambda m: _not(inner(m))

    def like(self, value: Expr, pattern: Token, escape: Token | None = None) -> Expr:
        esc = None
        if escape is not None:
            esc = _string(escape)
            if len(esc) != 1:
                raise SelectorError((escape.start_pos or 0) + 1, "ESCAPE takes exactly one character")
        rx = _like_regex(_string(pattern), esc)

        def f(m: Message) -> bool | None:
            v = value(m)
            if not isinstance(v, str):
                return None
            return rx.fullmatch(v) is not None
        return f

    def not_like(self, value: Expr, pattern: Token, escape: Token | None = None) -> Expr:
        inner = self.like(value, pattern, escape)
        return lambda m: _not(inner(m))

    def is_null(self, value: Expr) -> Expr:
        return lambda m: value(m) is None

    def is_not_null(self, value: Expr) -> Expr:
        return lambda m: value(m) is not None

    def not_(self, operand: Expr) -> Expr:
        return lambda m: _not(operand(m))

    def and_(self, *operands: Expr) -> Expr:
        return operands[0] if len(operands) == 1 else _connective(operands, decisive=False)

    def or_(self, *operands: Expr) -> Expr:
        return operands[0] if len(operands) == 1 else _connective(operands, decisive=True)


def _connective(operands: tuple[Expr, ...], decisive: bool) -> Expr:
    """SQL's three-valued AND (``decisive`` False) or OR (True): the first operand equal to
    ``decisive`` decides; otherwise unknown (None) if any operand was unknown."""
    neutral = not decisive

    def f(m: Message) -> bool | None:
        result: bool | None = neutral
        for op in operands:
            v: object = op(m)
            if v is decisive:
                return decisive
            if v is not neutral:
                result = None
        return result
    return f


def _not(v: Any) -> bool | None:
    if v is True:
        return False
    if v is False:
        return True
    return None


def compile_selector(text: str) -> Callable[[Message], bool]:
    """The predicate for ``text``: True only when the selector is TRUE for a message.

    Raises SelectorError (with the 1-based position) for an invalid expression."""
    if len(text) > _MAX_LENGTH:
        raise SelectorError(_MAX_LENGTH + 1, f"longer than {_MAX_LENGTH} characters")
    if not text.strip():
        raise SelectorError(1, "empty expression")
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as exc:
        at_end = isinstance(exc, UnexpectedToken) and exc.token.type == "$END"
        if at_end or exc.pos_in_stream is None:
            raise SelectorError(len(text) + 1, "unexpected end of expression") from None
        pos = exc.pos_in_stream + 1
        raise SelectorError(pos, f"unexpected {text[pos - 1:pos + 9]!r}") from None
    try:
        expr = _Compile().transform(tree)
    except VisitError as exc:
        if isinstance(exc.orig_exc, SelectorError):
            raise exc.orig_exc from None
        raise
    return lambda message: expr(message) is True
