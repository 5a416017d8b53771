"""The SQL92 conformance corpus: messages with varied properties and the selectors run over them
(tests/test_sql92_conformance.py). Valid and invalid selectors alike: the broker must refuse
what the parser refuses and select what the evaluator selects."""
from __future__ import annotations

import itertools

#: property values that probe the broker's conversions: ints of every width, signs and blanks,
#: decimals Java parses (NaN, Infinity, hex, suffixes) or not, Unicode digits, booleans, quotes
VALUES = ["10", "5", "-5", "0", "+7", " 3", "3.5", "2.5", "1e3", "NaN", "-Infinity", "0x1p3", "10d",
          "2147483647", "2147483648", "3000000000", "-3000000000", "9223372036854775807",
          "99999999999999999999", "abc", "ABC", "x'y", "ünï 😀", "true", "TRUE", "false", "٣", "5L",
          "eu", "us", "-0", "1_000"]


def messages() -> list[dict]:
    """Properties of each message (TAGS and user properties; some left out)."""
    out = []
    n = len(VALUES)
    for i in range(2 * n):
        props = {"n": VALUES[i % n], "s": VALUES[(i * 7 + 3) % n], "f": VALUES[(i * 11 + 5) % n],
                 "region": ("eu", "us", "apac")[i % 3], "amount": str((i * 37) % 200 - 20)}
        if i % 5 == 0:
            del props["n"]
        if i % 7 == 0:
            del props["s"]
        tags = (None, "TagA", "TagB", "tag'c")[i % 4]
        out.append({"properties": props, "tags": tags})
    return out


_PROPS = ["n", "s", "f", "missing", "TAGS", "amount"]
_LITERALS = ["5", "-5", "3000000000", "2.5", "-2.5", "1E3", "'abc'", "'5'", "'10'", "TRUE", "FALSE",
             "9223372036854775807", "0", "5L"]


def selectors() -> list[str]:
    out = []
    for p, op, lit in itertools.product(_PROPS, ["=", "<>", ">", ">=", "<", "<="], _LITERALS):
        if (p, op) in {("TAGS", ">"), ("TAGS", "<="), ("missing", ">="), ("missing", "<=")}:
            continue
        out.append(f"{p} {op} {lit}")
    out += [f"{lit} {op} n" for lit, op in itertools.product(["5", "'5'", "2.5", "TRUE", "'abc'"],
                                                            ["=", "<>", ">", "<"])]
    out += [
        # nulls and IS
        "n IS NULL", "n IS NOT NULL", "missing IS NULL", "missing IS NOT NULL", "NOT n IS NULL",
        "n = NULL", "NULL = n", "n <> NULL", "NULL IS NULL", "TRUE IS NOT NULL", "n = missing",
        "missing = missing2", "NOT (n = 'x')", "NOT ('x' = n)", "n <> 'x'", "'x' <> n",
        # BETWEEN
        "n BETWEEN 1 AND 10", "n NOT BETWEEN 1 AND 10", "n BETWEEN -5 AND 5", "n BETWEEN 10 AND 1",
        "n BETWEEN 2.5 AND 3000000000", "n BETWEEN 'a' AND 'z'", "amount BETWEEN 0 AND 100",
        "amount NOT BETWEEN 0 AND 100", "n BETWEEN -10 AND -20", "n BETWEEN NULL AND 5",
        "n BETWEEN s AND f", "5 BETWEEN 1 AND 10", "n between 1 and 10",
        # IN
        "n IN ('5', '10', 'abc')", "n NOT IN ('5', '10', 'abc')", "s IN ('eu')", "missing IN ('x')",
        "missing NOT IN ('x')", "TAGS IN ('TagA', 'tag''c')", "TAGS NOT IN ('TagA')", "n IN (5)",
        "'5' IN ('5')", "n IN ()", "region IN ('eu', 'us', 'x', 'y', 'z', 'w')",
        "n IN ('ünï 😀', 'x''y')",
        # logic, precedence, short cuts
        "n > 5 AND s < 5", "n > 5 OR s < 5", "NOT n > 5", "NOT (n > 5)", "n > 5 AND s = 'abc' OR f = 'eu'",
        "n > 5 AND (s = 'abc' OR f = 'eu')", "n = 'abc' OR n > 5", "n > 5 OR n = 'abc'",
        "region = 'eu' AND amount > 100", "region = 'eu' AND NOT amount > 100", "NOT NOT n = '5'",
        "TRUE", "FALSE", "NULL", "NOT TRUE", "NOT NULL", "TRUE AND n = '5'", "FALSE OR n = '5'",
        "NULL OR n = '5'", "NULL AND n = '5'", "n", "NOT n", "n AND TRUE", "n OR TRUE",
        "(n = '5') = TRUE", "(n = '5') = (s = '5')", "n = '5' = TRUE", "n > 1 > 0", "NOT 5",
        "5", "'abc'", "-n > 0", "-n IS NULL", "+n = 5", "- -5 = n", "n = -5", "-5 = n", "n = +5",
        "n = - 3000000000", "n > -2.5", "(n > 5)", "((n = '5'))", "n > (5)", "a", "TAGS = 'TagA'",
        "TAGS = 'tag''c'", "TAGS IS NULL", "TAGS <> 'TagA'", "region = 'EU'", "Region = 'eu'",
        # literals
        "n = 0.0", "n > 0.5", "n > .5", "n > 5.", "n > 5e0", "n > 1e400", "n > 1e-400", "n > 5E-324",
        "n = 00", "n = 01", "n = 99999999999999999999", "n = 9223372036854775808",
        "n = 2147483648", "n = 2147483647", "n = 0x10", "n = 5l", "n = ''", "s = 'ABC'",
        "s = 'abc'", "n = '٣'", "n = 3", "n = TRUE", "n = FALSE", "s = TRUE", "n = 'true'",
        # the string tests (RocketMQ 5)
        "s CONTAINS 'b'", "s NOT CONTAINS 'b'", "s STARTSWITH 'a'", "s NOT STARTSWITH 'a'",
        "s ENDSWITH 'c'", "s NOT ENDSWITH 'c'", "missing CONTAINS 'a'", "missing NOT CONTAINS 'a'",
        "s CONTAINS ''", "s NOT CONTAINS ''", "s contains 'ü'", "TAGS STARTSWITH 'Tag'",
        "NOT s CONTAINS 'b'", "s CONTAINS 5", "n CONTAINS '1' AND n > 5",
        # syntax
        "n = 5 -- a comment\n", "n = 5 /* block */ AND s IS NULL", "n=5", "n<>5", "n>=5AND s<5",
        "n = 5 AND", "n = 5 s", "(n = 5", "n = 5)", "n == 5", "n != 5", "n = 'abc", "n = \"abc\"",
        "n # 5", "AND n = 5", "", "   ", "n LIKE 'a%'", "n = 5 -- no line break", "$x IS NULL",
        "_y IS NULL", "n.x = 5", "1n = 5", "n IS NOT", "n IS 5", "n NOT = 5", "n IN 'a'",
        "n BETWEEN 1", "n BETWEEN 1 OR 2",
    ]
    return out
