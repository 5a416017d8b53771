"""The human-readable tables of a group's progress, one format wherever a user looks
(``rmq-store lag``/``reset-offset``, the examples): a queue is named by its TOPIC, BROKER and QUEUE
columns, times are UTC with milliseconds, a queue without committed progress shows ``-``."""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from rmq_source.group.allocation import MessageQueue
from rmq_source.group.progress import QueueLag

LAG_HEADER = ("TOPIC", "BROKER", "QUEUE", "BROKER_OFFSET", "CONSUMER_OFFSET", "DIFF", "LAST_CONSUMED")
RESET_HEADER = ("TOPIC", "BROKER", "QUEUE", "PREVIOUS", "NEW")


def ms_text(ms: int | None) -> str:
    """``2026-11-27 03:04:05.678Z`` for epoch milliseconds; ``-`` for none."""
    if ms is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def _offset_text(offset: int) -> str | int:
    """A committed offset, or ``-`` for none (negative: no progress stored)."""
    return offset if offset >= 0 else "-"


def table_lines(header: Sequence[str], rows: list[Sequence], left: int = 1) -> list[str]:
    """Aligned columns; the first ``left`` columns left-aligned, the others right-aligned."""
    cells = [list(map(str, header))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) if i < left else c.rjust(w)
                      for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in cells]


def lag_lines(lags: Sequence[QueueLag]) -> list[str]:
    """The lag table (what RocketMQ's ``consumerProgress`` shows) and its total line."""
    rows = [(q.topic, q.broker_name, q.queue_id, q.broker_offset,
             _offset_text(q.consumer_offset), q.diff,
             ms_text(q.last_timestamp)) for q in lags]
    return table_lines(LAG_HEADER, rows, left=2) + [
        f"total diff: {sum(q.diff for q in lags)} ({len(lags)} queues)"]


def reset_lines(before: Mapping[MessageQueue, int], written: Mapping[MessageQueue, int]) -> list[str]:
    """Each reset queue's previous committed offset (``-``: none) and the new one."""
    rows = [(mq.topic, mq.broker_name, mq.queue_id, _offset_text(before.get(mq, -1)), value)
            for mq, value in sorted(written.items())]
    return table_lines(RESET_HEADER, rows, left=2)
