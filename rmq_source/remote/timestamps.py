"""Which queue offset a timestamp names on a live broker.

The contract (docs/semantics.md): the first message stored at or after the timestamp, the queue's
max offset when there is none - RocketMQ 5's ``BoundaryType.LOWER``. A broker's own answer to
SEARCH_OFFSET_BY_TIMESTAMP is only a hint: RocketMQ 4.9 answers the *closest* message (which may be
the one before), picks the ConsumeQueue file by its mtime and, for a timestamp after the last
message, may answer an offset anywhere in the last file. The hint is checked against the store
times of the messages on either side of it (a pull each) and, when it is wrong, narrows a binary
search by pulls.
"""
from __future__ import annotations

from typing import Callable, Optional


def first_at_or_after(timestamp_ms: int, lo: int, hi: int, hint: int,
                      store_time: Callable[[int], Optional[int]]) -> int:
    """The first offset ``k`` in ``[lo, hi)`` with ``store_time(k) >= timestamp_ms``, else ``hi``.

    ``store_time(k)`` is message ``k``'s store time in ms, or None when it is gone (removed by
    retention since ``lo`` was read: older than any timestamp asked). Store times grow with the
    offset within a queue. A right ``hint`` costs at most two lookups."""
    if hi <= lo:
        return hi

    def before(k: int) -> bool:            # message k was stored before the timestamp
        t = store_time(k)
        return t is None or t < timestamp_ms

    h = min(max(hint, lo), hi)
    right_ok = h == hi or not before(h)
    left_ok = h == lo or before(h - 1)
    if right_ok and left_ok:
        return h
    if not right_ok:                       # the answer is past the hint
        lo = h + 1
    else:                                  # message h - 1 is already at or after it
        hi = h - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if before(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo
