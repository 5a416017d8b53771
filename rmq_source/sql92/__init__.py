"""RocketMQ's SQL92 message selectors (``expressionType=SQL92``): the language and the broker's
evaluation rules (:mod:`.parser`, :mod:`.nodes`, :mod:`.javavalues`)."""
from __future__ import annotations

from dataclasses import dataclass

from rmq_source.sql92.javavalues import BOOL, EvalError
from rmq_source.sql92.nodes import Node
from rmq_source.sql92.parser import parse


@dataclass(frozen=True)
class Selector:
    """A parsed selector. ``matches(props)`` is what a broker decides for a message with these
    properties (``TAGS`` among them): the expression is TRUE, not FALSE, null or an error."""

    text: str
    root: Node

    def matches(self, props: dict[str, str]) -> bool:
        try:
            return self.root.evaluate(props) == (BOOL, True)
        except EvalError:
            return False


def compile_selector(text: str) -> Selector:
    """RmqOptionError naming the position for a selector the broker would refuse."""
    return Selector(text, parse(text))


__all__ = ["Selector", "compile_selector"]
