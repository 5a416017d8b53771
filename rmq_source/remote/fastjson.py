"""Parse JSON as RocketMQ's servers write it with fastjson, which is not always standard JSON.

fastjson writes a ``Map`` key that is not a string as the key's own JSON: an integer unquoted
(``{0:"127.0.0.1:10911"}``, broker addresses by id) and an object as an object
(``{{"brokerName":"b","queueId":0,"topic":"T"}:{"maxOffset":5}}``, topic statistics keyed by
MessageQueue). :func:`loads` accepts both: integer keys come back as ``int``, object keys as a
:class:`ObjectKey` (a hashable, sorted tuple of the object's items; ``dict(key)`` gives them back).
Standard JSON parses exactly as :func:`json.loads` would.
"""
from __future__ import annotations

import json
import json.scanner
from json.decoder import scanstring

__all__ = ["loads", "ObjectKey"]

_WS = " \t\n\r"
_NUMBER = json.scanner.NUMBER_RE
_LITERALS = {"true": True, "false": False, "null": None}
_STANDARD = json.JSONDecoder()


class ObjectKey(tuple):
    """A map key that fastjson wrote as a JSON object: its (name, value) items, sorted."""

    @classmethod
    def of(cls, obj: dict) -> "ObjectKey":
        return cls(sorted((k, _frozen(v)) for k, v in obj.items()))


def _frozen(value):
    if isinstance(value, dict):
        return ObjectKey.of(value)
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


class _Parser:
    def __init__(self, text: str):
        self.s = text
        self.n = len(text)

    def fail(self, what: str, i: int):
        raise ValueError(f"{what} at char {i}: {self.s[max(0, i - 20):i + 20]!r}")

    def ws(self, i: int) -> int:
        while i < self.n and self.s[i] in _WS:
            i += 1
        return i

    def value(self, i: int):
        i = self.ws(i)
        if i >= self.n:
            self.fail("unexpected end", i)
        c = self.s[i]
        if c == "{" or c == "[":
            try:   # most values are standard JSON: parsed by the json module's C scanner
                return _STANDARD.raw_decode(self.s, i)
            except ValueError:
                pass
            return self.obj(i + 1) if c == "{" else self.arr(i + 1)
        if c == '"':
            return scanstring(self.s, i + 1, True)
        for word, val in _LITERALS.items():
            if self.s.startswith(word, i):
                return val, i + len(word)
        m = _NUMBER.match(self.s, i)
        if m is None:
            self.fail("expected a value", i)
        integer, frac, exp = m.groups()
        num = float(integer + (frac or "") + (exp or "")) if (frac or exp) else int(integer)
        return num, m.end()

    def obj(self, i: int):
        out: dict = {}
        i = self.ws(i)
        if i < self.n and self.s[i] == "}":
            return out, i + 1
        while True:
            key, i = self.value(i)
            if isinstance(key, dict):
                key = ObjectKey.of(key)
            elif isinstance(key, list):
                key = _frozen(key)
            i = self.ws(i)
            if i >= self.n or self.s[i] != ":":
                self.fail("expected ':'", i)
            out[key], i = self.value(i + 1)
            i = self.ws(i)
            if i < self.n and self.s[i] == ",":
                i += 1
                continue
            if i < self.n and self.s[i] == "}":
                return out, i + 1
            self.fail("expected ',' or '}'", i)

    def arr(self, i: int):
        out: list = []
        i = self.ws(i)
        if i < self.n and self.s[i] == "]":
            return out, i + 1
        while True:
            item, i = self.value(i)
            out.append(item)
            i = self.ws(i)
            if i < self.n and self.s[i] == ",":
                i += 1
                continue
            if i < self.n and self.s[i] == "]":
                return out, i + 1
            self.fail("expected ',' or ']'", i)


def loads(text: str | bytes):
    """The value of ``text`` (module doc); ValueError names the position of what is wrong."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode("utf-8")
    try:
        return json.loads(text)
    except ValueError:
        pass
    parser = _Parser(text)
    value, end = parser.value(0)
    if parser.ws(end) != parser.n:
        parser.fail("extra data", parser.ws(end))
    return value


def keyed_by_objects(text: str | bytes, member: str) -> list[tuple[dict, dict]] | None:
    """The entries of the top-level object's ``member``, a map whose keys and values are flat
    objects, as (key, value) pairs, read at the json module's C speed; None when the text is not
    in the compact form fastjson writes (``{..."member":{{k}:{v},{k}:{v}}...}``, no braces in the
    members after it), or any key or value is not an object: then :func:`loads` must read it.

    fastjson writes a map keyed by MessageQueue this way (topic statistics, consume statistics:
    thousands of entries), which :func:`loads` would walk entry by entry in Python. Here every
    ``}:{`` inside the member becomes ``},{``, making the member a standard JSON list of keys and
    values; there must be exactly one per entry (one inside a string would change the string)."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode("utf-8")
    head = f'"{member}":{{'
    at = text.find(head)
    # the member's closing brace: the last but the top-level object's (members after it hold none)
    close = text.rfind("}", 0, len(text) - 1)
    if at < 0 or not text.endswith("}") or text.count(head) != 1 or close < at + len(head):
        return None
    inner = text[at + len(head):close]
    try:
        parsed = json.loads(f'{text[:at]}"{member}":[{inner.replace("}:{", "},{")}]{text[close + 1:]}')
    except ValueError:
        return None
    items = parsed.get(member) if isinstance(parsed, dict) else None
    if not isinstance(items, list) or len(items) % 2:
        return None
    keys, values = items[0::2], items[1::2]
    if (not all(type(k) is dict for k in keys) or not all(type(v) is dict for v in values)
            or inner.count("}:{") != len(keys)):
        return None     # (a "}:{" inside a string, or a map inside the entries)
    return list(zip(keys, values))
