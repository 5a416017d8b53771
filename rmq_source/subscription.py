"""Subscriptions parsed as RocketMQ's FilterAPI does, and Java's String.hashCode.

A tag :class:`Subscription` has two stages, as the broker and the client apply them: the
ConsumeQueue stage compares the unit's tag hash code (low 32 bits) with ``codes``; the client stage
keeps only records whose ``TAGS`` string is in ``tags`` (hash codes collide: ``"Aa"`` and ``"BB"``
both hash to 2112). A SQL92 subscription (``expression_type="SQL92"``) selects by the message's
properties (:mod:`rmq_source.sql92`); it reads every unit and filters the decoded messages.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

SUB_ALL = "*"
TAG, SQL92 = "TAG", "SQL92"
EXPRESSION_TYPES = (TAG, SQL92)
_SPLIT = re.compile(r"\|\|")


def java_string_hash(text: str) -> int:
    """Java ``String.hashCode`` of ``text`` as a signed int32 (UTF-16 code units, 31 multiplier)."""
    h = 0
    units = text.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def tags_code(tags: str | None) -> int:
    """The ConsumeQueue tagsCode the broker stores for a message's ``TAGS`` (0 when absent/empty)."""
    return java_string_hash(tags) if tags else 0


def _java_trim(text: str) -> str:
    # Java's String.trim removes every char <= U+0020 at both ends, not only whitespace.
    start, end = 0, len(text)
    while start < end and text[start] <= " ":
        start += 1
    while end > start and text[end - 1] <= " ":
        end -= 1
    return text[start:end]


@dataclass(frozen=True)
class Subscription:
    """A parsed subscription expression.

    ``expression`` is the text as given; ``sub_all`` is true for ``None``, ``""`` and ``"*"``
    exactly (``" * "`` is the tag ``"*"``, as in RocketMQ); ``tags`` and ``codes`` keep the order of
    first appearance without duplicates.
    """

    expression: str
    sub_all: bool
    tags: tuple[str, ...] = ()
    codes: tuple[int, ...] = ()
    expression_type: str = TAG

    @property
    def is_sql(self) -> bool:
        return self.expression_type == SQL92

    @property
    def tag_filter(self) -> bool:
        """Units are filtered by tag hash code (and records by tag string): the tags of a tag
        expression, or those a SQL92 selector implies (``TAGS = 'x' AND ...``), a prefilter."""
        return not self.sub_all and (not self.is_sql or bool(self.tags))

    @classmethod
    def parse(cls, expression: str | None, expression_type: str = TAG) -> "Subscription":
        """RmqOptionError for a SQL92 selector the broker would refuse (naming the position)."""
        if expression_type == SQL92:
            from rmq_source.sql92 import compile_selector
            from rmq_source.sql92.nodes import implied_tags
            implied = implied_tags(compile_selector(expression).root)
            tags: tuple[str, ...] = ()
            if implied is not None and all(t and t == _java_trim(t) and "||" not in t and t != SUB_ALL
                                           for t in implied):
                tags = tuple(sorted(implied))    # every one expressible as a tag subscription
            if implied is not None and not implied:
                tags = ("",)                     # TAGS = 'a' AND TAGS = 'b': no unit can match
            return cls(expression, False, tags, tuple(sorted({java_string_hash(t) for t in tags})),
                       expression_type=SQL92)
        if expression_type != TAG:
            from rmq_source.errors import RmqOptionError
            raise RmqOptionError(f"option expressionType: {expression_type!r} is not one of "
                                 f"{', '.join(EXPRESSION_TYPES)}")
        if expression is None or expression == "" or expression == SUB_ALL:
            return cls(expression or SUB_ALL, True)
        pieces = _SPLIT.split(expression)
        while pieces and pieces[-1] == "":  # Java's split drops trailing empty strings
            pieces.pop()
        tags: list[str] = []
        for piece in pieces:
            tag = _java_trim(piece)
            if tag and tag not in tags:
                tags.append(tag)
        codes: list[int] = []
        for tag in tags:
            code = java_string_hash(tag)
            if code not in codes:
                codes.append(code)
        return cls(expression, False, tuple(tags), tuple(codes))

    def matches_code(self, tags_code_value: int) -> bool:
        """ConsumeQueue stage: does a unit with this tagsCode pass the hash filter?"""
        if not self.tag_filter:
            return True
        low = tags_code_value & 0xFFFFFFFF
        low = low - (1 << 32) if low & 0x80000000 else low
        return low in self.codes

    def matches(self, tags_code_value: int, tags: str | None) -> bool:
        """Both stages: hash code, then the exact tag string (SQL92: every unit, see module doc)."""
        if not self.tag_filter:
            return True
        return self.matches_code(tags_code_value) and tags is not None and tags in self.tags
