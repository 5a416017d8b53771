"""The SQL92 selector language without a broker: errors name the position, every input either
parses or raises RmqOptionError, printed expressions parse back to themselves, and the Java
conversions the broker applies (test_sql92_conformance.py holds the brokers' verdicts)."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_source.errors import RmqOptionError
from rmq_source.sql92 import compile_selector
from rmq_source.sql92.javavalues import (INT_MAX, INT_MIN, EvalError, parse_java_double,
                                         parse_java_int)
from rmq_source.sql92.parser import parse


@pytest.mark.parametrize("text,pos,what", [
    ("a = NULL", 2, "IS NULL"),
    ("a > 'x'", 2, "cannot be compared"),
    ("a = 1 b", 6, "after a complete expression"),
    ("a > 0.0", 4, "Double.MIN_VALUE"),
    ("a BETWEEN 3 AND 1", 2, "at most the upper bound"),
    ("5", 0, "not a condition"),
    ("a IN (1)", 6, "string literal in the IN list"),
    ("'x' IN ('x')", 4, "needs a property"),
    ("a >", 3, "found the end of the expression"),
    ("TRUE = 1", 5, "cannot be compared with 1"),
    ("a = 99999999999999999999", 4, "64 bits"),
    ("a = 'x", 4, "unterminated string"),
    ("a # 1", 2, "unexpected character '#'"),
    ("a = 1 -- x", 6, "line break"),
    ("a IS 5", 5, "NULL or NOT NULL after IS"),
    ("", 0, "empty"),
    ("(a = 1", 6, "expected ')'"),
    ("a = 1 /* x", 6, "unterminated '/*'"),
])
def test_errors_name_the_option_the_position_and_what_was_expected(text, pos, what):
    with pytest.raises(RmqOptionError) as info:
        compile_selector(text)
    message = str(info.value)
    assert message.startswith(f"option subExpression: invalid SQL92 selector at position {pos}: ")
    assert what in message and message.splitlines()[-1] == "  " + " " * pos + "^"


@pytest.mark.parametrize("text,tree", [
    ("a = 1 OR b = 2 AND c = 3", "((a = 1) OR ((b = 2) AND (c = 3)))"),
    ("NOT a = 1", "((NOT a) = 1)"),
    ("a <> 'x''y'", "(NOT (a = 'x''y'))"),
    ("a NOT BETWEEN 1 AND 2", "((a < 1) OR (a > 2))"),
    ("a IS NOT NULL", "(NOT (a = NULL))"),
    ("x not contains 'q' and Y in ('b','a')", "((x NOT CONTAINS 'q') AND (Y IN ('a', 'b')))"),
    ("- -5 = a", "((- (- 5)) = a)"),
    ("+a > 2147483648", "(a > 2147483648)"),
    ("a > 1.5E3", "(a > 1500.0)"),
])
def test_precedence_and_forms(text, tree):
    assert str(parse(text)) == tree


_ATOMS = st.sampled_from(["a", "b", "TAGS", "1", "-2", "3000000000", "2.5", "'x'", "'it''s'", "TRUE",
                          "FALSE", "NULL", "( a = 1 )"])
_OPS = st.sampled_from(["=", "<>", ">", ">=", "<", "<=", "AND", "OR", "IS NULL", "IS NOT NULL",
                        "BETWEEN 1 AND 2", "NOT BETWEEN 1 AND 2", "IN ('x', 'y')", "NOT IN ('z')",
                        "CONTAINS 'x'", "NOT STARTSWITH 'y'", "ENDSWITH ''", "NOT", "(", ")", "-", "+"])


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(st.one_of(_ATOMS, _OPS), min_size=1, max_size=9))
def test_any_token_soup_parses_or_raises_an_option_error_and_prints_back(parts):
    text = " ".join(parts)
    try:
        sel = compile_selector(text)
    except RmqOptionError:
        return
    again = parse(str(sel.root))
    assert str(again) == str(sel.root)
    for props in ({}, {"a": "1"}, {"a": "x", "b": "2.5"}, {"TAGS": "x", "a": "3000000000"}):
        assert sel.matches(props) in (True, False)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=30))
def test_any_text_parses_or_raises_an_option_error(text):
    try:
        compile_selector(text)
    except RmqOptionError:
        pass


@pytest.mark.parametrize("s,value", [
    ("10", 10), ("+7", 7), ("-5", -5), ("٣", 3), ("２１", 21), ("2147483647", INT_MAX),
    ("-2147483648", INT_MIN),
])
def test_java_integers(s, value):
    assert parse_java_int(s, INT_MIN, INT_MAX) == value


@pytest.mark.parametrize("s", ["", "+", "-", " 3", "3 ", "1_000", "0x10", "2147483648", "3.0", "1e3"])
def test_java_integers_refused(s):
    with pytest.raises(EvalError):
        parse_java_int(s, INT_MIN, INT_MAX)


@pytest.mark.parametrize("s,value", [
    (" 3 ", 3.0), ("+.5", 0.5), ("5.", 5.0), ("1e3", 1000.0), ("10d", 10.0), ("2.5F", 2.5),
    ("0x1p3", 8.0), ("-0x1.8p1", -3.0), ("Infinity", math.inf), ("-Infinity", -math.inf),
    ("\t7\n", 7.0),
])
def test_java_doubles(s, value):
    assert parse_java_double(s) == value


@pytest.mark.parametrize("s", ["", "abc", "1_0", "٣", "infinity", "NaNd", "0x10", "1e", "--1", ". 5"])
def test_java_doubles_refused(s):
    with pytest.raises(EvalError):
        parse_java_double(s)


def test_nan_compares_above_everything_and_equal_to_itself():
    nan = compile_selector("a > 1E300")
    assert nan.matches({"a": "NaN"}) and not compile_selector("a < 1.5").matches({"a": "NaN"})
    assert math.isnan(parse_java_double("NaN"))
