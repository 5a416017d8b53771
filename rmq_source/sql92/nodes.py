"""The expressions of a SQL92 selector and how RocketMQ's broker evaluates them for one message
(the filter module's ``expression`` package): three-valued logic with Java's null, left to right
with short cuts, and an exception anywhere dropping the message.

``evaluate(props)`` takes the message's properties (name -> string, ``TAGS`` included) and returns
a value of :mod:`.javavalues` (booleans as ``(BOOL, b)``) or raises EvalError. This is the
reference the vectorized evaluator (:mod:`.arrow_eval`) is tested against, and the model of what
the brokers deliver.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rmq_source.sql92.javavalues import (BOOL, DOUBLE, NUMERIC, STR, EvalError, java_compare,
                                         java_equals, parse_java_double)

TRUE, FALSE = (BOOL, True), (BOOL, False)


def _b(x: bool):
    return TRUE if x else FALSE


class Node:
    #: a BooleanExpression in the Java model (may stand where a condition is expected)
    boolean = False

    def evaluate(self, props: dict[str, str]):
        raise NotImplementedError


@dataclass(frozen=True)
class Const(Node):
    value: object            # a javavalues value or None
    boolean: bool = False    # TRUE, FALSE and NULL are BooleanConstantExpressions

    def evaluate(self, props):
        return self.value

    def __str__(self):
        if self.value is None:
            return "NULL"
        kind, v = self.value
        if kind == BOOL:
            return "TRUE" if v else "FALSE"
        if kind == STR:
            return "'" + v.replace("'", "''") + "'"
        return repr(v)


@dataclass(frozen=True)
class Prop(Node):
    name: str

    def evaluate(self, props):
        v = props.get(self.name)
        return None if v is None else (STR, v)

    def __str__(self):
        return self.name


@dataclass(frozen=True)
class Negate(Node):
    operand: Node

    def evaluate(self, props):
        v = self.operand.evaluate(props)
        if v is None or v[0] not in NUMERIC:
            return None              # only numbers negate; a string (a property) gives null
        return (v[0], -v[1])

    def __str__(self):
        return f"(- {self.operand})"


@dataclass(frozen=True)
class BoolCast(Node):
    """A property where a condition is expected: true only if the value is a Boolean object,
    which a property (a string) never is."""
    operand: Node
    boolean = True

    def evaluate(self, props):
        v = self.operand.evaluate(props)
        if v is None:
            return None
        return _b(v[0] == BOOL and v[1])

    def __str__(self):
        return str(self.operand)


@dataclass(frozen=True)
class Less(Node):
    """``>``, ``>=``, ``<``, ``<=``: two strings compare as doubles; otherwise as __compare does."""
    op: str
    left: Node
    right: Node
    boolean = True

    def evaluate(self, props):
        lv = self.left.evaluate(props)
        if lv is None:
            return None
        rv = self.right.evaluate(props)
        if rv is None:
            return None
        if lv[0] == STR and rv[0] == STR:
            lv, rv = (DOUBLE, parse_java_double(lv[1])), (DOUBLE, parse_java_double(rv[1]))
        c = java_compare(lv, rv)
        return _b({">": c > 0, ">=": c >= 0, "<": c < 0, "<=": c <= 0}[self.op])

    def __str__(self):
        return f"({self.left} {self.op} {self.right})"


@dataclass(frozen=True)
class Equal(Node):
    """``=`` (and IS NULL, against the NULL constant): null on the left alone gives null, on the
    right alone false, on both sides true."""
    left: Node
    right: Node
    boolean = True

    def evaluate(self, props):
        lv = self.left.evaluate(props)
        rv = self.right.evaluate(props)
        if (lv is None) != (rv is None):
            return None if lv is None else FALSE
        if lv is None or java_equals(lv, rv):
            return TRUE
        return _b(java_compare(lv, rv) == 0)

    def __str__(self):
        if isinstance(self.right, Const) and self.right.value is None:
            return f"({self.left} IS NULL)"
        return f"({self.left} = {self.right})"


@dataclass(frozen=True)
class Not(Node):
    operand: Node
    boolean = True

    def evaluate(self, props):
        v = self.operand.evaluate(props)
        if v is None:
            return None
        if v[0] != BOOL:
            raise EvalError("ClassCastException: not a Boolean")
        return _b(not v[1])

    def __str__(self):
        return f"(NOT {self.operand})"


def _bool(v):
    if v is not None and v[0] != BOOL:
        raise EvalError("ClassCastException: not a Boolean")
    return v


def chain(node: Node) -> list[Node]:
    """The operands of a chain of one operator (And or Or), left to right, without recursion."""
    kind, out, todo = type(node), [], [node]
    while todo:
        n = todo.pop()
        if type(n) is kind:
            todo += [n.right, n.left]
        else:
            out.append(n)
    return out


def _logic(node: Node, props, decides) -> object:
    """AND (``decides`` FALSE) or OR (TRUE) over the whole chain, left to right: the first
    operand equal to ``decides`` is the answer, else null if one was null, else the other
    boolean. The same as the nested two-operand evaluation (the operator is associative, with
    its short cuts and errors), without recursion on long chains."""
    null = False
    for operand in chain(node):
        v = _bool(operand.evaluate(props))
        if v == decides:
            return decides
        null = null or v is None
    return None if null else _b(decides == FALSE)


@dataclass(frozen=True)
class And(Node):
    left: Node
    right: Node
    boolean = True

    def evaluate(self, props):
        return _logic(self, props, FALSE)

    def __str__(self):
        return "(" + " AND ".join(map(str, chain(self))) + ")"


@dataclass(frozen=True)
class Or(Node):
    left: Node
    right: Node
    boolean = True

    def evaluate(self, props):
        return _logic(self, props, TRUE)

    def __str__(self):
        return "(" + " OR ".join(map(str, chain(self))) + ")"


@dataclass(frozen=True)
class In(Node):
    """``prop [NOT] IN ('a', ...)``: strings only; a missing property gives null."""
    operand: Prop
    values: frozenset
    negated: bool
    boolean = True

    def evaluate(self, props):
        v = self.operand.evaluate(props)
        if v is None or v[0] != STR:
            return None
        return _b((v[1] in self.values) != self.negated)

    def __str__(self):
        vals = ", ".join("'" + v.replace("'", "''") + "'" for v in sorted(self.values))
        return f"({self.operand} {'NOT ' if self.negated else ''}IN ({vals}))"


@dataclass(frozen=True)
class StringTest(Node):
    """``x [NOT] CONTAINS|STARTSWITH|ENDSWITH 's'`` (RocketMQ 5): false, never null, when ``x`` is
    missing or not a string, and false for an empty ``s`` (NOT included)."""
    kind: str
    operand: Node
    search: str
    negated: bool
    boolean = True

    def evaluate(self, props):
        if not self.search:
            return FALSE
        v = self.operand.evaluate(props)
        if v is None or v[0] != STR:
            return FALSE
        s = v[1]
        hit = (self.search in s if self.kind == "CONTAINS" else
               s.startswith(self.search) if self.kind == "STARTSWITH" else s.endswith(self.search))
        return _b(hit != self.negated)

    def __str__(self):
        search = "'" + self.search.replace("'", "''") + "'"
        return f"({self.operand} {'NOT ' if self.negated else ''}{self.kind} {search})"


def string_tests(node: Node) -> frozenset[str]:
    """The string predicates (CONTAINS, STARTSWITH, ENDSWITH) ``node`` uses: RocketMQ added them
    in 5.1.3; an older broker reads ``s CONTAINS 'b'`` as ``s`` and ignores the rest."""
    found, todo = set(), [node]
    while todo:                       # (iterative: chains of thousands of terms)
        n = todo.pop()
        if isinstance(n, StringTest):
            found.add(n.kind)
        for f in dataclasses.fields(n):
            v = getattr(n, f.name)
            if isinstance(v, Node):
                todo.append(v)
    return frozenset(found)


def implied_tags(node: Node) -> frozenset | None:
    """Tags a message must have for ``node`` to be TRUE (``TAGS = 'x'``, ``TAGS IN (...)``, through
    AND and OR), or None when the expression implies none: a prefilter for the tag hash scan."""
    if isinstance(node, Equal):
        for a, b in ((node.left, node.right), (node.right, node.left)):
            if (isinstance(a, Prop) and a.name == "TAGS" and isinstance(b, Const)
                    and b.value is not None and b.value[0] == STR):
                return frozenset([b.value[1]])
        return None
    if isinstance(node, In) and node.operand.name == "TAGS" and not node.negated:
        return node.values
    if isinstance(node, (And, Or)):
        parts = [implied_tags(n) for n in chain(node)]
        if isinstance(node, And):          # every operand must hold: what any of them implies
            known = [p for p in parts if p is not None]
            return frozenset.intersection(*known) if known else None
        return None if any(p is None for p in parts) else frozenset().union(*parts)
    return None
