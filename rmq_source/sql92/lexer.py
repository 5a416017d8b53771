"""Tokens of RocketMQ's SQL92 selector language, as its JavaCC grammar (``SelectorParser.jj`` of
the filter module) defines them.

* Blanks: space, tab, CR, LF, form feed. Comments: ``-- ...`` ended by a line break (one at the very
  end of the text is required), ``/* ... */``.
* Keywords, any case: NOT AND OR BETWEEN IN TRUE FALSE NULL IS, and (RocketMQ 5) CONTAINS
  STARTSWITH ENDSWITH.
* Integers ``0`` or ``[1-9][0-9]*`` with an optional ``l``/``L``; decimals ``5.5``, ``5.``, ``.5``,
  ``5E10`` with an optional exponent; strings in single quotes, ``''`` standing for one quote.
* Property names ``[a-zA-Z_$][a-zA-Z0-9_$]*`` (case kept).
* Operators ``= <> > >= < <= ( ) , + -``.

The longest match wins; a keyword beats a name of the same length (``notx`` is a name).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from rmq_source.errors import RmqOptionError

KEYWORDS = ("NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS",
            "CONTAINS", "STARTSWITH", "ENDSWITH")

_BLANK = re.compile(r"[ \t\n\r\f]+")
_LINE_COMMENT = re.compile(r"--[^\n\r]*(\r\n|\n|\r)")
_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_FLOAT = re.compile(r"[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+")
_DECIMAL = re.compile(r"(?:0|[1-9][0-9]*)[lL]?")
_STRING = re.compile(r"'(?:''|[^'])*'")
_NAME = re.compile(r"[a-zA-Z_$][a-zA-Z0-9_$]*")
_OPERATORS = ("<>", ">=", "<=", "=", ">", "<", "(", ")", ",", "+", "-")


@dataclass(frozen=True)
class Token:
    kind: str        # a keyword, "INT", "FLOAT", "STRING", "NAME", an operator, or "EOF"
    text: str        # as written (a string literal with its quotes)
    pos: int         # character position in the expression

    def describe(self) -> str:
        return "the end of the expression" if self.kind == "EOF" else repr(self.text)


def sql92_error(text: str, pos: int, message: str) -> RmqOptionError:
    """RmqOptionError for ``subExpression`` naming the position with a caret under it."""
    line = text.replace("\n", " ").replace("\r", " ")
    return RmqOptionError(f"option subExpression: invalid SQL92 selector at position {pos}: "
                          f"{message}\n  {line}\n  {' ' * pos}^")


def tokenize(text: str) -> list[Token]:
    """Every token of ``text``, then an EOF token; RmqOptionError at the first character that
    starts no token."""
    out: list[Token] = []
    pos, n = 0, len(text)
    while pos < n:
        m = _BLANK.match(text, pos)
        if m:
            pos = m.end()
            continue
        if text.startswith("--", pos):
            m = _LINE_COMMENT.match(text, pos)
            if not m:
                raise sql92_error(text, pos, "a '--' comment must end with a line break")
            pos = m.end()
            continue
        if text.startswith("/*", pos):
            m = _BLOCK_COMMENT.match(text, pos)
            if not m:
                raise sql92_error(text, pos, "unterminated '/*' comment")
            pos = m.end()
            continue
        out.append(_token(text, pos))
        pos += len(out[-1].text)
    out.append(Token("EOF", "", n))
    return out


def _token(text: str, pos: int) -> Token:
    c = text[pos]
    if c == "'":
        m = _STRING.match(text, pos)
        if not m:
            raise sql92_error(text, pos, "unterminated string literal (quotes inside are written '')")
        return Token("STRING", m.group(), pos)
    if c.isascii() and (c.isdigit() or c == "."):
        f, d = _FLOAT.match(text, pos), _DECIMAL.match(text, pos)
        flen, dlen = (len(f.group()) if f else 0), (len(d.group()) if d else 0)
        if flen == 0 and dlen == 0:
            raise sql92_error(text, pos, f"unexpected character {c!r}")
        return Token("FLOAT", f.group(), pos) if flen > dlen else Token("INT", d.group(), pos)
    m = _NAME.match(text, pos)
    if m:
        word = m.group()
        return Token(word.upper() if word.upper() in KEYWORDS else "NAME", word, pos)
    for op in _OPERATORS:
        if text.startswith(op, pos):
            return Token(op, op, pos)
    raise sql92_error(text, pos, f"unexpected character {c!r}")
