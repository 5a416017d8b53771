"""Parse a SQL92 selector as RocketMQ's broker does (``SelectorParser`` of the filter module), with
the checks its expression factories make while parsing, into :mod:`.nodes`.

Precedence, loosest first: OR; AND; ``=``, ``<>``, ``IS [NOT] NULL``; ``>``, ``>=``, ``<``, ``<=``,
``[NOT] BETWEEN``, ``[NOT] IN``, ``[NOT] CONTAINS|STARTSWITH|ENDSWITH``; unary ``+``, ``-``,
``NOT`` (so ``NOT a = 1`` is ``(NOT a) = 1``, as in RocketMQ); literals, names, parentheses.
Binary operators group to the left.

Rejected, as the broker rejects them: a literal integer beyond 64 bits; a decimal literal that is
infinite or below Double.MIN_VALUE (``0.0`` included); a string, boolean or NULL next to ``>``,
``>=``, ``<``, ``<=`` or ``BETWEEN``, or a condition there; NULL next to ``=``/``<>``; TRUE/FALSE
``=`` a literal of another kind; ``IN`` on anything but a property; constant BETWEEN bounds in
the wrong order; a number, string or negation where a condition is expected. One difference on
purpose: the broker ignores what follows a complete expression (``a = 1 b`` selects ``a = 1``);
here it is an error.
"""
from __future__ import annotations

from rmq_source.sql92.javavalues import (BOOL, DOUBLE, INT, INT_MAX, INT_MIN, LONG, LONG_MAX, STR,
                                         EvalError, java_compare)
from rmq_source.sql92.lexer import Token, sql92_error, tokenize
from rmq_source.sql92.nodes import (And, BoolCast, Const, Equal, In, Less, Negate, Node, Not, Or,
                                    Prop, StringTest)

DOUBLE_MAX = 1.7976931348623157e308
DOUBLE_MIN = 5e-324
STRING_TESTS = ("CONTAINS", "STARTSWITH", "ENDSWITH")


def parse(text: str) -> Node:
    """The selector's expression; RmqOptionError (naming the position) for anything the broker
    would refuse, or trailing text."""
    if not isinstance(text, str) or not text.strip():
        raise sql92_error(text or "", 0, "the selector is empty")
    p = _Parser(text)
    try:
        node = p.condition(p.or_expr(), p.tokens[0])
    except RecursionError:
        raise sql92_error(text, 0, "the selector nests too deeply (parentheses, NOT or unary "
                                   "operators)") from None
    tok = p.peek()
    if tok.kind != "EOF":
        raise p.error(tok, f"unexpected {tok.describe()} after a complete expression (expected AND, OR "
                           "or the end)")
    return node


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = tokenize(text)
        self.i = 0

    # ------------------------------------------------------------------ helpers
    def peek(self, k: int = 0) -> Token:
        return self.tokens[min(self.i + k, len(self.tokens) - 1)]

    def take(self) -> Token:
        tok = self.peek()
        self.i += 1
        return tok

    def expect(self, kind: str, what: str) -> Token:
        tok = self.peek()
        if tok.kind != kind:
            raise self.error(tok, f"expected {what}, found {tok.describe()}")
        return self.take()

    def error(self, tok: Token, message: str):
        return sql92_error(self.text, tok.pos, message)

    def condition(self, node: Node, at: Token) -> Node:
        """asBooleanExpression: a condition, or a property (cast)."""
        if node.boolean:
            return node
        if isinstance(node, Prop):
            return BoolCast(node)
        raise self.error(at, f"{node} is not a condition (a comparison, a property, TRUE, FALSE or NULL)")

    # ------------------------------------------------------------------ grammar
    def or_expr(self) -> Node:
        start = self.peek()
        left = self.and_expr()
        while self.peek().kind == "OR":
            self.take()
            right_at = self.peek()
            right = self.and_expr()
            left = Or(self.condition(left, start), self.condition(right, right_at))
        return left

    def and_expr(self) -> Node:
        start = self.peek()
        left = self.equality()
        while self.peek().kind == "AND":
            self.take()
            right_at = self.peek()
            right = self.equality()
            left = And(self.condition(left, start), self.condition(right, right_at))
        return left

    def equality(self) -> Node:
        left = self.comparison()
        while True:
            tok = self.peek()
            if tok.kind in ("=", "<>"):
                self.take()
                right = self.comparison()
                self._check_equal(left, right, tok)
                node = Equal(left, right)
                left = Not(node) if tok.kind == "<>" else node
            elif tok.kind == "IS" and self.peek(1).kind == "NULL":
                self.take(), self.take()
                left = Equal(left, Const(None, boolean=True))
            elif tok.kind == "IS":
                self.take()
                self.expect("NOT", "NULL or NOT NULL after IS")
                self.expect("NULL", "NULL after IS NOT")
                left = Not(Equal(left, Const(None, boolean=True)))
            else:
                return left

    def comparison(self) -> Node:
        left = self.unary()
        while True:
            tok = self.peek()
            kind = tok.kind
            negated = kind == "NOT" and self.peek(1).kind in ("BETWEEN", "IN") + STRING_TESTS
            if negated:
                self.take()
                kind = self.peek().kind
            if kind in (">", ">=", "<", "<=") and not negated:
                self.take()
                right = self.unary()
                self._check_less(left, tok)
                self._check_less(right, tok)
                left = Less(kind, left, right)
            elif kind in STRING_TESTS:
                self.take()
                search = self._string("a string literal after " + kind)
                left = StringTest(kind, left, search, negated)
            elif kind == "BETWEEN":
                self.take()
                low = self.unary()
                self.expect("AND", "AND between the bounds of BETWEEN")
                high = self.unary()
                left = self._between(left, low, high, negated, tok)
            elif kind == "IN":
                self.take()
                self.expect("(", "'(' after IN")
                values = [self._string("a string literal in the IN list")]
                while self.peek().kind == ",":
                    self.take()
                    values.append(self._string("a string literal in the IN list"))
                self.expect(")", "',' or ')' in the IN list")
                if not isinstance(left, Prop):
                    raise self.error(tok, f"IN needs a property on its left, not {left}")
                left = In(left, frozenset(values), negated)
            else:
                return left

    def unary(self) -> Node:
        tok = self.peek()
        if tok.kind == "+" and self._starts_unary(1):
            self.take()
            return self.unary()
        if tok.kind == "-":
            self.take()
            return Negate(self.unary())
        if tok.kind == "NOT":
            self.take()
            at = self.peek()
            return Not(self.condition(self.unary(), at))
        return self.primary()

    def _starts_unary(self, k: int) -> bool:
        return self.peek(k).kind in ("+", "-", "NOT", "(", "NAME", "STRING", "INT", "FLOAT", "TRUE",
                                     "FALSE", "NULL")

    def primary(self) -> Node:
        tok = self.take()
        kind = tok.kind
        if kind == "STRING":
            return Const((STR, _unquote(tok.text)))
        if kind == "INT":
            digits = tok.text.rstrip("lL")
            v = int(digits)
            if v > LONG_MAX:
                raise self.error(tok, f"integer {tok.text} does not fit in 64 bits")
            return Const((INT, v) if INT_MIN <= v <= INT_MAX else (LONG, v))
        if kind == "FLOAT":
            v = float(tok.text)
            if v > DOUBLE_MAX:
                raise self.error(tok, f"{tok.text} is greater than {DOUBLE_MAX!r}")
            if v < DOUBLE_MIN:
                raise self.error(tok, f"{tok.text} is less than Double.MIN_VALUE (4.9E-324): write "
                                      "0 instead of a zero with a decimal point")
            return Const((DOUBLE, v))
        if kind in ("TRUE", "FALSE"):
            return Const((BOOL, kind == "TRUE"), boolean=True)
        if kind == "NULL":
            return Const(None, boolean=True)
        if kind == "NAME":
            return Prop(tok.text)
        if kind == "(":
            node = self.or_expr()
            self.expect(")", "')'")
            return node
        raise self.error(tok, f"expected a value (a property, a literal, TRUE, FALSE, NULL, '(' or a "
                              f"unary operator), found {tok.describe()}")

    # ------------------------------------------------------------------ checks
    def _string(self, what: str) -> str:
        return _unquote(self.expect("STRING", what).text)

    def _check_less(self, node: Node, tok: Token) -> None:
        if isinstance(node, Const):
            if node.value is None or node.value[0] not in (INT, LONG, DOUBLE):
                raise self.error(tok, f"{node} cannot be compared with {tok.text} (only numbers "
                                      "and properties can)")
        elif node.boolean:
            raise self.error(tok, f"the condition {node} cannot be compared with {tok.text}")

    def _check_equal(self, left: Node, right: Node, tok: Token) -> None:
        for node in (left, right):
            if isinstance(node, Const) and node.value is None:
                raise self.error(tok, f"NULL cannot be compared with {tok.text}: write IS NULL or "
                                      "IS NOT NULL")
        if (isinstance(left, Const) and isinstance(right, Const) and left.boolean
                and not right.boolean):
            raise self.error(tok, f"{left} cannot be compared with {right}")

    def _between(self, value: Node, low: Node, high: Node, negated: bool, tok: Token) -> Node:
        if isinstance(low, Const) and isinstance(high, Const) and not negated:
            if low.value is None or high.value is None:
                raise self.error(tok, "the bounds of BETWEEN cannot be NULL")
            try:
                wrong = java_compare(high.value, low.value) < 0
            except EvalError:
                wrong = True
            if wrong:
                raise self.error(tok, f"the lower bound {low} of BETWEEN must be at most the upper "
                                      f"bound {high}")
        for node in (value, low, high):
            self._check_less(node, tok)
        if negated:
            return Or(Less("<", value, low), Less(">", value, high))
        return And(Less(">=", value, low), Less("<=", value, high))


def _unquote(text: str) -> str:
    return text[1:-1].replace("''", "'")
