"""Small ranges of a task read ahead, several at once (live mode).

A task over hundreds of queues with a few new messages each (a topic of a thousand queues, a
micro-batch limited by ``maxMessagesPerTrigger``) would wait a pull's round trip per queue, one
after the other: RocketMQ has no pull of several queues. Here the ranges of at most
:data:`SMALL_RANGE` messages are read by a few threads at once (each with its own connections:
:meth:`ClusterBackend._take_puller` keeps pullers per thread), while the rows still come out in
range order, and a larger range is read in its turn by the task's own thread, streamed as before.
At most :data:`THREADS` ranges are read ahead of the one being handed out (their rows held in
memory: at most that many small ranges' worth).

The ranges' rows come as the C core decodes them (bodies as stored, no topic nor broker columns):
:func:`full_rows` makes the rows of consecutive ranges of one broker full rows together, one
conversion (and one join) for many small ranges instead of one each.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa

#: a range of at most this many messages (one pull's worth at the broker's default cap) is read ahead
SMALL_RANGE = 32
#: ranges read ahead at once, by as many threads
THREADS = 8


def pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="rmq-read-ahead")


def in_range_order(ranges: Sequence, read: Callable[[object], Iterator[pa.RecordBatch]],
                   executor: ThreadPoolExecutor) -> Iterator[pa.RecordBatch]:
    """The batches of ``read(r)`` for each of ``ranges`` (with ``start``, ``end``), in range
    order; small ranges are read ahead on ``executor``. An error of a range read ahead is raised
    in its turn (the ranges before it are handed out first); the reads still ahead when the
    caller stops are cancelled or left to finish on their own."""
    small = [i for i, r in enumerate(ranges) if r.end - r.start <= SMALL_RANGE]
    if len(small) < 2:
        for r in ranges:
            yield from read(r)
        return
    ahead: dict[int, Future] = {}
    queue = iter(small)
    try:
        for i, r in enumerate(ranges):
            while len(ahead) < THREADS:       # (small ones in order: this one if it is small)
                j = next(queue, None)
                if j is None:
                    break
                ahead[j] = executor.submit(lambda r=ranges[j]: list(read(r)))
            if i in ahead:
                yield from ahead.pop(i).result()
            else:
                yield from read(r)
    finally:
        for future in ahead.values():
            future.cancel()


def full_rows(parts: Iterator[tuple[pa.RecordBatch, object]], max_rows: int, max_bytes: int
              ) -> Iterator[pa.RecordBatch]:
    """``parts``, (C core batch, its queue) in order, as full rows in the same order: consecutive
    parts of one broker are converted together (:func:`native_rows_of_queues`), grouped as
    :func:`rmq_source.backend.coalesce` joins batches (within ``max_rows`` rows and ``max_bytes``
    bytes of buffers; a part of an eighth of either or more goes alone: joining copies)."""
    from rmq_source.backend import join_groups
    from rmq_source.store.reader import native_rows_of_queues
    for group in join_groups(parts, max_rows, max_bytes, batch_of=lambda part: part[0],
                             key=lambda part: part[1].broker_name):
        yield native_rows_of_queues([(batch, mq.topic, np.full(batch.num_rows, mq.queue_id, dtype=np.int32))
                                     for batch, mq in group], group[0][1].broker_name)
