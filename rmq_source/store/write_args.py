"""Checks of the arguments of the writer's API: integers in range, topic names the broker
accepts, ``ip:port`` hosts. Each raises :class:`~rmq_source.errors.RmqOptionError` naming the
argument and what is valid."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

from rmq_source.errors import RmqOptionError
from rmq_source.store import record_codec as rc


def int_arg(name: str, value: Any, lo: int, hi: int) -> int:
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, int)):
        raise RmqOptionError(f"{name} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise RmqOptionError(f"{name}={value} is out of range [{lo}, {hi}]")
    return value


def validate_topic(topic: Any) -> bytes:
    """Topic bytes, or :class:`RmqOptionError` unless the name is 1..32767 broker-valid characters
    (``A-Z a-z 0-9 _ % - |``; names over 127 characters are stored in the V2 record format)."""
    if not isinstance(topic, str) or not topic:
        raise RmqOptionError(f"topic must be a non-empty string, got {topic!r}")
    if len(topic) > rc.MAX_TOPIC_LENGTH:
        raise RmqOptionError(f"topic is {len(topic)} characters, at most {rc.MAX_TOPIC_LENGTH} allowed")
    bad = set(topic) - rc.TOPIC_CHARS
    if bad:
        raise RmqOptionError(f"topic {topic!r} has invalid characters {sorted(bad)!r}; allowed: "
                             "A-Z a-z 0-9 _ % - |")
    return topic.encode("ascii")


@lru_cache(maxsize=256)
def _cached_host(text: str, option: str) -> rc.Host:
    return rc.parse_host(text, option=option)


def host(text: Any, option: str) -> rc.Host:
    if type(text) is not str:
        return rc.parse_host(text, option=option)    # raises the option error
    return _cached_host(text, option)
