"""Spark filters a batch read takes over (``pushFilters``, active when the session sets
``spark.sql.python.filterPushdown.enabled=true``), each applied exactly where the store answers it
faster than a scan:

* ``topic``, ``brokerName``, ``queueId`` equal to / IN values: only those queues are planned;
* ``queueOffset`` compared with an integer: the planned ranges are clamped;
* ``tags`` equal to / IN strings: the tag hash scan of the ConsumeQueue with the exact tag check
  (as a tag subscription), when the query has no subExpression of its own (reading a system
  topic, whose codes are not tag hashes, the rows' tags are checked instead);
* ``storeTimestamp`` compared with a timestamp: each queue's range is narrowed with the
  timestamp search (as ``startingTimestamp``/``endingTimestamp``: store times grow with the queue
  offset), and Spark still applies the comparison itself (a partial push).

A filter is taken only when its value has the column's type and can be applied exactly; every
other filter (and any filter on other columns, e.g. ``properties['k']``, which Spark does not
push) stays with Spark. Filters are ANDed.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass, replace
from typing import Iterable

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)

_EXACT_TAG = "||"


@dataclass(frozen=True)
class Pushed:
    """Restrictions of the taken filters; None: no restriction. Offsets: ``[offset_lo,
    offset_hi)``."""

    topics: frozenset | None = None
    brokers: frozenset | None = None
    queue_ids: frozenset | None = None
    offset_lo: int = 0
    offset_hi: int | None = None
    tags: frozenset | None = None
    #: store times (epoch ms) the rows must lie in: ``[ts_lo_ms, ts_hi_ms)``
    ts_lo_ms: int | None = None
    ts_hi_ms: int | None = None

    def keeps_queue(self, mq, shown_topic: str | None = None) -> bool:
        """Whether ``mq`` passes; ``shown_topic``: its topic as the rows show it (the name
        without the client namespace), else ``mq.topic``."""
        return ((self.topics is None or (shown_topic or mq.topic) in self.topics)
                and (self.brokers is None or mq.broker_name in self.brokers)
                and (self.queue_ids is None or mq.queue_id in self.queue_ids))

    def clamp(self, start: int, end: int) -> tuple[int, int]:
        """``[start, end)`` within the offset restriction (empty: start == end)."""
        lo = max(start, self.offset_lo)
        hi = end if self.offset_hi is None else min(end, self.offset_hi)
        return lo, max(lo, hi)


def tag_codes_reliable(topic: str) -> bool:
    """Whether a topic's ConsumeQueue tag codes are its messages' tag hash codes: not in the
    brokers' system topics (the delay topic's codes are delivery times)."""
    return not (topic.startswith(("SCHEDULE_TOPIC", "rmq_sys_", "RMQ_SYS_")))


def _values(f, kind: type) -> frozenset | None:
    """The values an EqualTo/In filter accepts, if all of type ``kind`` (nulls never match)."""
    from pyspark.sql.datasource import EqualTo, In
    vals = (f.value,) if isinstance(f, EqualTo) else tuple(f.value) if isinstance(f, In) else None
    if vals is None:
        return None
    vals = tuple(v for v in vals if v is not None)
    if not all(type(v) is kind for v in vals):
        return None
    return frozenset(vals)


def _tag_ok(tag: str) -> bool:
    """A tag a tag subscription can name exactly (no ||, no blanks at the ends, not * or empty)."""
    return bool(tag) and tag != "*" and _EXACT_TAG not in tag and tag.strip() == tag and all(
        c > " " for c in (tag[0], tag[-1]))


def _micros(value) -> int | None:
    """Microseconds since the epoch of an aware datetime (Spark's TIMESTAMP); None otherwise."""
    if not isinstance(value, datetime.datetime) or value.tzinfo is None:
        return None
    return (value - _EPOCH) // datetime.timedelta(microseconds=1)


def _time_bounds(pushed: Pushed, f) -> Pushed | None:
    """``pushed`` narrowed by a storeTimestamp comparison (ms values m: m * 1000 vs the micros)."""
    from pyspark.sql.datasource import (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan,
                                        LessThanOrEqual)
    us = _micros(getattr(f, "value", None))
    if us is None:
        return None
    lo = hi = None
    if isinstance(f, (GreaterThanOrEqual, EqualTo)):
        lo = -(-us // 1000)
    if isinstance(f, GreaterThan):
        lo = us // 1000 + 1
    if isinstance(f, (LessThanOrEqual, EqualTo)):
        hi = us // 1000 + 1
    if isinstance(f, LessThan):
        hi = -(-us // 1000)
    if lo is None and hi is None:
        return None
    return replace(pushed, ts_lo_ms=_tighter(pushed.ts_lo_ms, lo, max),
                   ts_hi_ms=_tighter(pushed.ts_hi_ms, hi, min))


def _tighter(old, new, pick):
    return new if old is None else old if new is None else pick(old, new)


def absorb(filters: Iterable, *, subscription_all: bool) -> tuple[Pushed, list]:
    """(what the taken filters restrict, the filters left to Spark, by reference)."""
    from pyspark.sql.datasource import (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan,
                                        LessThanOrEqual)
    pushed, left = Pushed(), []
    for f in filters:
        attr = getattr(f, "attribute", None)
        col = attr[0] if isinstance(attr, tuple) and len(attr) == 1 else None
        taken = None
        if col in ("topic", "brokerName", "queueId", "tags"):
            vals = _values(f, int if col == "queueId" else str)
            if vals is not None and col == "tags" and not (subscription_all and all(map(_tag_ok, vals))):
                vals = None
            if vals is not None:
                field = {"topic": "topics", "brokerName": "brokers", "queueId": "queue_ids",
                         "tags": "tags"}[col]
                old = getattr(pushed, field)
                taken = replace(pushed, **{field: vals if old is None else old & vals})
        elif col == "queueOffset" and type(getattr(f, "value", None)) is int:
            v = f.value
            if isinstance(f, EqualTo):
                taken = replace(pushed, offset_lo=max(pushed.offset_lo, v),
                                offset_hi=v + 1 if pushed.offset_hi is None else min(pushed.offset_hi, v + 1))
            elif isinstance(f, (GreaterThan, GreaterThanOrEqual)):
                taken = replace(pushed, offset_lo=max(pushed.offset_lo, v + (isinstance(f, GreaterThan))))
            elif isinstance(f, (LessThan, LessThanOrEqual)):
                hi = v + (isinstance(f, LessThanOrEqual))
                taken = replace(pushed, offset_hi=hi if pushed.offset_hi is None else min(pushed.offset_hi, hi))
        elif col == "storeTimestamp":
            narrowed = _time_bounds(pushed, f)
            if narrowed is not None:
                pushed = narrowed             # and Spark still compares (partial push)
        if taken is None:
            left.append(f)
        else:
            pushed = taken
    return pushed, left
