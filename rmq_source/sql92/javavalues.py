"""Values as RocketMQ's selector evaluation sees them (Java objects), and the conversions and
comparisons it applies (``ComparisonExpression.__compare`` of the filter module, with string
conversion on, as ``SelectorParser.parse`` sets it).

A value is ``None`` (Java null) or a ``(kind, value)`` pair: ``INT`` (Integer), ``LONG``, ``DOUBLE``,
``STR`` (String) or ``BOOL``. Message properties are always strings; literals give the others.
Any Java exception of an evaluation (a string that is not a number where one is needed, a class
cast) is :class:`EvalError`: the broker then does not deliver the message, whatever the rest of the
expression says.
"""
from __future__ import annotations

import math
import re
import struct
import unicodedata

INT, LONG, DOUBLE, STR, BOOL = "INT", "LONG", "DOUBLE", "STR", "BOOL"
INT_MIN, INT_MAX = -(2 ** 31), 2 ** 31 - 1
LONG_MIN, LONG_MAX = -(2 ** 63), 2 ** 63 - 1
NUMERIC = (INT, LONG, DOUBLE)


class EvalError(Exception):
    """A Java exception during evaluation: the message does not match."""


def parse_java_int(s: str, lo: int, hi: int) -> int:
    """``Integer.parseInt`` / ``Long.parseLong`` (radix 10): an optional sign, then decimal digits
    of any script in the BMP (``Character.digit`` of one UTF-16 unit: a digit outside the BMP is
    two surrogates, neither a digit); no blanks, no underscores."""
    if not s:
        raise EvalError("empty number")
    i, neg = 0, False
    if s[0] in "+-":
        neg, i = s[0] == "-", 1
        if len(s) == 1:
            raise EvalError(f"bad number {s!r}")
    v = 0
    for ch in s[i:]:
        d = unicodedata.decimal(ch, None) if ord(ch) <= 0xFFFF else None
        if d is None:
            raise EvalError(f"bad number {s!r}")
        v = v * 10 + d
    v = -v if neg else v
    if not lo <= v <= hi:
        raise EvalError(f"number out of range {s!r}")
    return v


_JAVA_DEC = re.compile(r"[+-]?(?:(NaN|Infinity)|(\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[fFdD]?)", re.A)
_JAVA_HEX = re.compile(r"([+-]?)0[xX]([0-9a-fA-F]*)(?:\.([0-9a-fA-F]*))?[pP]([+-]?\d+)[fFdD]?", re.A)


def parse_java_double(s: str) -> float:
    """``Double.parseDouble``: blanks (chars <= U+0020) trimmed at both ends; NaN, Infinity,
    decimal and hexadecimal forms, an optional f/F/d/D suffix; correctly rounded."""
    t = s.strip("".join(map(chr, range(33))))
    m = _JAVA_DEC.fullmatch(t)
    if m:
        if m.group(1) == "NaN":
            return math.nan
        if m.group(1) == "Infinity":
            return -math.inf if t.startswith("-") else math.inf
        return float(t.rstrip("fFdD"))
    m = _JAVA_HEX.fullmatch(t)
    if m and (m.group(2) or m.group(3)):
        mant = m.group(2) + ("." + m.group(3) if m.group(3) is not None else "")
        try:
            return float.fromhex(f"{m.group(1)}0x{mant or '0'}p{m.group(4)}")
        except OverflowError:            # Java rounds to infinity
            return -math.inf if m.group(1) == "-" else math.inf
    raise EvalError(f"bad number {s!r}")


def _bits(x: float) -> int:
    if math.isnan(x):
        return 0x7FF8000000000000
    return struct.unpack(">q", struct.pack(">d", x))[0]


def _cmp(a, b) -> int:
    return (a > b) - (a < b)


def compare_to(kind: str, a, b) -> int:
    """``a.compareTo(b)`` of two values of one Java class."""
    if kind == DOUBLE:                 # Double.compare: -0.0 < 0.0, NaN above everything
        if a < b:
            return -1
        if a > b:
            return 1
        return _cmp(_bits(a), _bits(b))
    if kind == STR:                    # UTF-16 code units
        return _cmp(a.encode("utf-16-be", "surrogatepass"), b.encode("utf-16-be", "surrogatepass"))
    return _cmp(a, b)                  # Integer, Long, Boolean (false < true)


def _to(kind: str, s: str):
    if kind == INT:
        return parse_java_int(s, INT_MIN, INT_MAX)
    if kind == LONG:
        return parse_java_int(s, LONG_MIN, LONG_MAX)
    if kind == DOUBLE:
        return parse_java_double(s)
    if kind == BOOL:                   # Boolean.valueOf: "true" in any case, else false
        return s.isascii() and s.lower() == "true"
    raise AssertionError(kind)


def java_compare(lv, rv) -> int:
    """``__compare(lv, rv, convertStringExpressions=true)`` of two non-null values: the left
    value's class leads; a number meets a wider number or a string it parses; a string meets the
    class of the other side; anything else compares as -1."""
    lk, l = lv
    rk, r = rv
    if lk == rk:
        return compare_to(lk, l, r)
    if lk == BOOL:
        if rk == STR:
            raise EvalError("ClassCastException: Boolean cannot be cast to String")
        return -1
    if lk == INT:
        if rk in (LONG, DOUBLE):
            return compare_to(rk, float(l) if rk == DOUBLE else l, r)
        if rk == STR:
            return compare_to(INT, l, _to(INT, r))
        return -1
    if lk == LONG:
        if rk == INT:
            return compare_to(LONG, l, r)
        if rk == DOUBLE:
            return compare_to(DOUBLE, float(l), r)
        if rk == STR:
            return compare_to(LONG, l, _to(LONG, r))
        return -1
    if lk == DOUBLE:
        if rk in (INT, LONG):
            return compare_to(DOUBLE, l, float(r))
        if rk == STR:
            return compare_to(DOUBLE, l, _to(DOUBLE, r))
        return -1
    if lk == STR:
        if rk in (BOOL, INT, LONG, DOUBLE):
            return compare_to(rk, _to(rk, l), r)
        return -1
    return -1


def java_equals(lv, rv) -> bool:
    """``lv.equals(rv)`` of two non-null values (same class and value; Double by its bits)."""
    if lv[0] != rv[0]:
        return False
    if lv[0] == DOUBLE:
        return _bits(lv[1]) == _bits(rv[1])
    return lv[1] == rv[1]
