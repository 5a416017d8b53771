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
    ("a = 1 OR b = 2 OR (c = 3 OR d = 4) AND e = 5", "((a = 1) OR (b = 2) OR (((c = 3) OR (d = 4)) AND (e = 5)))"),
    ("NOT a = 1", "((NOT a) = 1)"),
    ("a <> 'x''y'", "(NOT (a = 'x''y'))"),
    ("a NOT BETWEEN 1 AND 2", "((a < 1) OR (a > 2))"),
    ("a IS NOT NULL", "(NOT (a IS NULL))"),
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
    ("\t7\n", 7.0), ("0x1p1024", math.inf), ("-0x1.fffffffffffff8p1023", -math.inf),
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


# ------------------------------------------------------------------ the C evaluation

_VALUES = st.sampled_from(["10", "5", "-5", "0", "+7", " 3", "3.5", "1e3", "NaN", "-Infinity",
                           "0x1p3", "10d", "2147483648", "3000000000", "9223372036854775807",
                           "99999999999999999999", "abc", "x", "y", "it's", "ünï", "true", "TRUE",
                           "٣", "２", "𝟘", "-0", "1_000", "1.5F", ".5", "5.", "0x10", "tRuE"])
_PROPS = st.dictionaries(st.sampled_from(["a", "b", "TAGS", "c"]), _VALUES, max_size=4)


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.one_of(_ATOMS, _OPS), min_size=1, max_size=9),
       rows=st.lists(st.one_of(st.none(), _PROPS), min_size=1, max_size=12),
       start=st.integers(0, 3))
def test_the_c_evaluation_selects_what_the_reference_selects(parts, rows, start):
    import pyarrow as pa

    from rmq_source.sql92.program import Program
    text = " ".join(parts)
    try:
        sel = compile_selector(text)
    except RmqOptionError:
        return
    column = pa.array([list(r.items()) if r is not None else None for r in rows],
                      type=pa.map_(pa.string(), pa.string())).slice(min(start, len(rows) - 1))
    expected = [sel.matches(dict(r) if r is not None else {}) for r in column.to_pylist()]
    assert Program(sel.root, text).matches_mask(column).astype(bool).tolist() == expected, text


@pytest.mark.parametrize("text,props,expected", [
    ("a > 5", {"a": "10"}, True), ("a > 5", {"a": "abc"}, False), ("a > 5.0", {"a": " 7 "}, True),
    ("a = 3", {"a": "٣"}, True), ("a = 0", {"a": "𝟘"}, False), ("a = TRUE", {"a": "tRuE"}, True),
    ("a > 1E300", {"a": "NaN"}, True), ("a = 8.0", {"a": "0x1p3"}, True),
    ("a < 5 OR b = 'x'", {"a": "abc", "b": "x"}, False), ("b = 'x' OR a < 5", {"a": "abc", "b": "x"}, True),
    ("NOT ('x' = b)", {}, True), ("NOT (b = 'x')", {}, False), ("a = b", {}, True),
    ("a > 3000000000", {"a": "3000000001"}, True), ("a > 2147483647", {"a": "3000000000"}, False),
    ("a = 5", {"a": "3000000000"}, False), ("a CONTAINS ''", {"a": "x"}, False),
    ("a NOT CONTAINS 'z'", {}, False),
])
def test_c_and_reference_on_the_brokers_corner_cases(text, props, expected):
    import pyarrow as pa

    from rmq_source.sql92.program import Program
    sel = compile_selector(text)
    column = pa.array([list(props.items())], type=pa.map_(pa.string(), pa.string()))
    assert sel.matches(props) is expected
    assert bool(Program(sel.root, text).matches_mask(column)[0]) is expected


def test_long_chains_and_deep_nesting():
    """3,000 ORs evaluate (reference and C, the C tree balanced); nesting beyond what the parser
    takes is an option error, not a crash."""
    import pyarrow as pa

    from rmq_source.sql92.program import Program
    text = " OR ".join(f"a = {i}" for i in range(3000))
    sel = compile_selector(text)
    column = pa.array([[("a", "2999")], [("a", "x")], [("a", "17")], []],
                      type=pa.map_(pa.string(), pa.string()))
    assert Program(sel.root, text).matches_mask(column).tolist() == [1, 0, 1, 0]
    assert [sel.matches(dict(r)) for r in column.to_pylist()] == [True, False, True, False]
    with pytest.raises(RmqOptionError, match="nests too deeply"):
        compile_selector("(" * 3000 + "a = 1" + ")" * 3000)
    with pytest.raises(RmqOptionError, match="nests deeper than 256"):
        Program(parse("NOT " * 300 + "a"), "deep")


def test_implied_tags():
    from rmq_source.sql92.nodes import implied_tags
    cases = {"TAGS = 'a' AND x = 1": {"a"}, "TAGS IN ('a', 'b') AND TAGS = 'b'": {"b"},
             "TAGS = 'a' OR TAGS IN ('b')": {"a", "b"}, "TAGS = 'a' OR x = 1": None,
             "'a' = TAGS AND (TAGS = 'a' OR TAGS = 'c')": {"a"}, "TAGS NOT IN ('a')": None,
             "NOT TAGS = 'a'": None, "TAGS <> 'a'": None}
    for text, tags in cases.items():
        got = implied_tags(parse(text))
        assert (set(got) if got is not None else None) == tags, text


@pytest.mark.parametrize("selector, tests", [
    ("a = 1", set()), ("s CONTAINS 'x'", {"CONTAINS"}),
    ("a = 1 AND (b NOT STARTSWITH 'y' OR NOT (c ENDSWITH 'z'))", {"STARTSWITH", "ENDSWITH"}),
    (" OR ".join(f"p{i} = 'v'" for i in range(2000)) + " OR q CONTAINS 'x'", {"CONTAINS"}),
])
def test_string_tests_found_anywhere(selector, tests):
    from rmq_source.sql92.nodes import string_tests
    assert string_tests(compile_selector(selector).root) == tests
