"""The task sizing of a plan without ``numPartitions``: parallelism, bytes per task and what one
queue offset of each topic costs to read, sampled from the ranges about to be read."""
from __future__ import annotations

import heapq
import logging
import operator

from rmq_source.errors import RmqSourceError
from rmq_source.schema import numpy_view
from rmq_source.spark.planner import (QUEUE_COST_BYTES, TASK_COST_BYTES, QueueRange, TaskSizing,
                                      default_parallelism)

log = logging.getLogger(__name__)
_SIZE = operator.attrgetter("size")

SAMPLE_TOPICS = 8       # per plan: the ones with the most offsets to read (a live sample pulls)
SAMPLE_QUEUES = 4       # per topic: the ones with the largest ranges
SAMPLE_WINDOWS = 8      # per queue, spread over its range (producers send runs of alike messages)
SAMPLE_MESSAGES = 2     # per window
CQ_UNIT_BYTES = 20      # what a filtered-out message costs: its ConsumeQueue unit is read


def task_sizing(opts, backend, ranges: list[QueueRange], known: dict[str, float] | None = None
                ) -> TaskSizing | None:
    """The sizing of ``ranges`` under ``opts``; None with ``numPartitions`` (it fixes the slots).

    A topic's bytes per queue offset are sampled by reading a few messages at spread points of its
    largest ranges with the query's subscription: the stored bytes of the messages it keeps, per offset
    read, plus the ConsumeQueue unit every offset costs (a tag filter keeping 1% makes a range
    light). At most :data:`SAMPLE_TOPICS` topics are sampled per plan, the largest; the others
    weigh the mean of those. ``known`` (topic -> bytes per offset) is consulted first and filled
    with what is sampled, so a streaming query samples a topic once (a live sample pulls).
    """
    if opts.num_partitions:
        return None
    known = {} if known is None else known
    by_topic: dict[str, list[QueueRange]] = {}
    for r in ranges:
        if r.size > 0 and r.mq.topic not in known:
            by_topic.setdefault(r.mq.topic, []).append(r)
    largest = sorted(by_topic, key=lambda t: (-sum(r.size for r in by_topic[t]), t))
    for topic in largest[:SAMPLE_TOPICS]:
        per_offset = _sample(opts, backend, heapq.nlargest(SAMPLE_QUEUES, by_topic[topic], key=_SIZE))
        if per_offset is not None:
            known[topic] = per_offset
    weights = dict(known)
    if len(largest) > SAMPLE_TOPICS and known:
        mean = sum(known.values()) / len(known)
        weights.update((t, mean) for t in largest[SAMPLE_TOPICS:] if t not in known)
    # minPartitions is a floor the user asked for; the core count is only what could run at once
    return TaskSizing(opts.min_partitions or default_parallelism(), opts.max_partition_bytes, weights,
                      backend.queue_cost_bytes or QUEUE_COST_BYTES,
                      0 if opts.min_partitions else TASK_COST_BYTES)


def _sample(opts, backend, ranges: list[QueueRange]) -> float | None:
    """Bytes per queue offset over a few windows of ``ranges``; None when nothing could be read
    (the sizing then assumes a size; the tasks report what they cannot read)."""
    offsets = kept_bytes = 0
    for r in ranges:
        for start, end in _windows(r):
            try:
                for batch in backend.read(r.mq, start, end, subscription=opts.subscription,
                                          batch_rows=SAMPLE_MESSAGES, batch_bytes=opts.batch_bytes,
                                          verify_crc=False, on_data_loss=_ignore, on_short_read=_ignore):
                    kept_bytes += _stored_bytes(batch.column("storeSize"))
            except RmqSourceError as exc:
                log.debug("no sample of %s for the task sizing: %s", r.mq, exc)
                continue
            offsets += end - start
    return CQ_UNIT_BYTES + kept_bytes / offsets if offsets else None


def _stored_bytes(sizes) -> int:
    """The sum of a batch's storeSize column (the decoders never leave one null)."""
    if sizes.null_count == 0:
        return int(numpy_view(sizes).sum())
    return sum(v for v in sizes.to_pylist() if v is not None)


def _windows(r: QueueRange) -> list[tuple[int, int]]:
    """The sample windows ``[start, end)`` of ``r``, not overlapping: the whole range when it is
    small, else windows at golden-ratio steps over it, so they meet no period of the data (evenly
    spaced ones can all land on runs of one kind); the same for the same range."""
    if r.size <= SAMPLE_WINDOWS * SAMPLE_MESSAGES:
        return [(r.start, r.end)]
    span = r.size - SAMPLE_MESSAGES + 1
    out: list[tuple[int, int]] = []
    for start in sorted(r.start + int(((k + 1) * _GOLDEN) % 1.0 * span) for k in range(SAMPLE_WINDOWS)):
        start = max(start, out[-1][1] if out else start)
        if start < r.end:
            out.append((start, min(r.end, start + SAMPLE_MESSAGES)))
    return out


_GOLDEN = 0.6180339887498949


def _ignore(*_args) -> None:
    """A sample skips what it cannot read: the tasks report it."""
