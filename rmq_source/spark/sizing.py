"""The task sizing of a plan without ``numPartitions``: parallelism, bytes per task and what one
queue offset of each topic costs to read, sampled from the ranges about to be read."""
from __future__ import annotations

import heapq
import logging
import operator

import pyarrow.compute as pc

from rmq_source.errors import RmqSourceError
from rmq_source.spark.planner import QueueRange, TaskSizing, default_parallelism

log = logging.getLogger(__name__)
_SIZE = operator.attrgetter("size")

SAMPLE_QUEUES = 4       # per topic: the ones with the largest ranges
SAMPLE_MESSAGES = 16    # per queue, from the start of its range
CQ_UNIT_BYTES = 20      # what a filtered-out message costs: its ConsumeQueue unit is read


def task_sizing(opts, backend, ranges: list[QueueRange], known: dict[str, float] | None = None
                ) -> TaskSizing | None:
    """The sizing of ``ranges`` under ``opts``; None with ``numPartitions`` (it fixes the slots).

    A topic's bytes per queue offset are sampled by reading the first messages of its largest
    ranges with the query's subscription: the stored bytes of the messages it keeps, per offset
    read, plus the ConsumeQueue unit every offset costs (a tag filter keeping 1% makes a range
    light). ``known`` (topic -> bytes per offset) is consulted first and filled with what is
    sampled, so a streaming query samples a topic once (a live sample pulls messages).
    """
    if opts.num_partitions:
        return None
    known = {} if known is None else known
    by_topic: dict[str, list[QueueRange]] = {}
    for r in ranges:
        if r.size > 0 and r.mq.topic not in known:
            by_topic.setdefault(r.mq.topic, []).append(r)
    for topic, rs in by_topic.items():
        per_offset = _sample(opts, backend, heapq.nlargest(SAMPLE_QUEUES, rs, key=_SIZE))
        if per_offset is not None:
            known[topic] = per_offset
    return TaskSizing(opts.min_partitions or default_parallelism(), opts.max_partition_bytes, dict(known))


def _sample(opts, backend, ranges: list[QueueRange]) -> float | None:
    """Bytes per queue offset over the first messages of ``ranges``; None when nothing could be
    read (the sizing then assumes a size; the tasks report what they cannot read)."""
    offsets = kept_bytes = 0
    for r in ranges:
        end = min(r.end, r.start + SAMPLE_MESSAGES)
        try:
            for batch in backend.read(r.mq, r.start, end, subscription=opts.subscription,
                                      batch_rows=SAMPLE_MESSAGES, batch_bytes=opts.batch_bytes,
                                      verify_crc=False, on_data_loss=_ignore, on_short_read=_ignore):
                kept_bytes += pc.sum(batch.column("storeSize")).as_py() or 0
        except RmqSourceError as exc:
            log.debug("no sample of %s for the task sizing: %s", r.mq, exc)
            continue
        offsets += end - r.start
    return CQ_UNIT_BYTES + kept_bytes / offsets if offsets else None


def _ignore(*_args) -> None:
    """A sample skips what it cannot read: the tasks report it."""
