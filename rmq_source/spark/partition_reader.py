"""What a Spark task runs: read the queue ranges of one input partition as Arrow batches.

Everything a task needs travels in the pickled :class:`RmqInputPartition`; nothing here depends
on driver state, so tasks run the same in separate executor processes.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from rmq_source.backend import BackendSpec, RangeRead, TaskLock
from rmq_source.group.allocation import MessageQueue
from rmq_source.errors import RmqDataLossError
from rmq_source.namespace import unwrap, unwrap_topic_column
from rmq_source.spark.gc_pause import collector_paused, freeze_long_lived_objects
from rmq_source.sql92.program import filter_batch, selector_program
from rmq_source.subscription import Subscription

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RangeSpec:
    """Queue offsets ``[start, end)`` of (topic, broker, queue)."""

    topic: str
    broker_name: str
    queue_id: int
    start: int
    end: int

    @property
    def mq(self) -> MessageQueue:
        # shared: a task over thousands of queues would otherwise build (and check) each anew
        return MessageQueue.of(self.topic, self.broker_name, self.queue_id)


@dataclass(frozen=True)
class RmqInputPartition(InputPartition):
    """One task: where to read (``backend``), its ranges (read in order), the subscription and
    read settings; in ordered mode the locks it must find held (``lock``)."""

    backend: BackendSpec
    slot: str
    ranges: tuple[RangeSpec, ...]
    sub_expression: str
    batch_rows: int
    batch_bytes: int
    verify_crc: bool
    fail_on_data_loss: bool
    lock: TaskLock | None = None
    expression_type: str = "TAG"
    #: rows kept only when their tags are one of these (pushed tags read without the hash scan)
    exact_tags: tuple[str, ...] | None = None
    #: the client namespace: the rows' topics are shown without it (rmq_source.namespace)
    namespace: str | None = None
    #: enableMsgTrace: (trace topic, consumer group without the namespace), None without traces
    trace: tuple[str, str] | None = None
    #: the columns handed to Spark, in order (rmq_source.spark.columns); None: all
    columns: tuple[str, ...] | None = None


def check_task_locks(part: RmqInputPartition):
    """Ordered mode: the partition's client must hold the locks of its queues (``part.lock``;
    nothing to check when None), see :meth:`Backend.check_task_locks`. Returns (the partition's
    opened backend, its ranges of the queues it may read)."""
    backend = part.backend.open()
    if part.lock is None:
        return backend, part.ranges
    readable = backend.check_task_locks(part.lock, [r.mq for r in part.ranges])
    return backend, [r for r in part.ranges if r.mq in readable]


def read_partition(part: RmqInputPartition) -> Iterator[pa.RecordBatch]:
    """Yield the partition's rows: each range in ascending queue offset, ranges in order.

    The batches of small ranges are joined (:meth:`Backend.read_many`, up to ``batch_rows`` rows
    and ``batch_bytes`` bytes), so a task over many small queues hands Spark a few batches, not
    one per queue. Spark hands a
    plain ``InputPartition(None)`` to ``read`` when the plan has no partition (nothing to read): it
    yields nothing.
    """
    if not isinstance(part, RmqInputPartition):
        return
    freeze_long_lived_objects()
    with collector_paused():
        if part.trace is None:
            for batch in _read_ranges(part):
                yield _shown(batch, part)
            return
        from rmq_source.remote.traces import ConsumeTraces
        traces = ConsumeTraces(part.backend.open(), *part.trace)
        try:
            began = time.monotonic()
            for batch in _read_ranges(part):
                traces.record(batch, cost_ms=int((time.monotonic() - began) * 1000))
                yield _shown(batch, part)
                began = time.monotonic()
        finally:
            traces.close()


def _shown(batch: pa.RecordBatch, part: RmqInputPartition) -> pa.RecordBatch:
    """The batch as Spark gets it: topics without the namespace, the columns asked for (the
    filters and traces above saw every column)."""
    if part.columns is not None:
        batch = batch.select(part.columns)
    return unwrap_topic_column(batch, part.namespace)     # (as it is without a namespace)


def _read_ranges(part: RmqInputPartition) -> Iterator[pa.RecordBatch]:
    backend, ranges = check_task_locks(part)
    sub = Subscription.parse(part.sub_expression, part.expression_type)
    # SQL92: the store's units are all read and the live brokers filter; the rows are (re)checked
    # here by the C evaluation, as RocketMQ's clients do not (a broker delivers every message for a
    # selector it cannot compile)
    program = selector_program(sub.expression) if sub.is_sql else None
    batches = backend.read_many(
        (_range_read(part, r) for r in ranges if r.start < r.end), subscription=sub,
        batch_rows=part.batch_rows, batch_bytes=part.batch_bytes, verify_crc=part.verify_crc,
        columns=_needed(part, program is not None))
    if program is None and part.exact_tags is None:
        yield from batches
        return
    for batch in batches:
        if program is not None:
            batch = filter_batch(program, batch)
        if part.exact_tags is not None:
            import pyarrow.compute as pc   # slow to import: only where used
            keep = pc.fill_null(pc.is_in(batch.column("tags"), value_set=pa.array(part.exact_tags)), False)
            batch = batch.filter(keep)
        if batch.num_rows:
            yield batch


#: the columns message traces are made of (rmq_source.remote.traces.sub_contexts)
_TRACED = ("uniqKey", "msgId", "keys", "reconsumeTimes")


def _needed(part: RmqInputPartition, sql: bool) -> tuple[str, ...] | None:
    """The columns the task uses: those asked, and those its filters and traces read (None:
    all): the C core may leave the others out."""
    if part.columns is None:
        return None
    needed = set(part.columns)
    if sql:
        needed.add("properties")
    if part.exact_tags is not None:
        needed.add("tags")
    if part.trace is not None:
        needed.update(_TRACED)
    return tuple(sorted(needed))


def _range_read(part: RmqInputPartition, r: RangeSpec) -> RangeRead:
    """A task reaches the end it was planned with, or says what it could not read: retention
    (on_data_loss) and a queue shorter than planned or gone (on_short_read)."""
    def lost(first: int, until: int, why: str) -> None:
        msg = (f"{r.mq}: offsets [{first}, {until}) ({until - first} messages) of the planned "
               f"range [{r.start}, {r.end}) cannot be read: {why}")
        if part.fail_on_data_loss:
            raise RmqDataLossError(msg + "; set failOnDataLoss=false to skip them")
        log.warning("%s; skipped %d messages (failOnDataLoss=false)", msg, until - first)

    return RangeRead(r.mq, r.start, r.end,
                     lambda first, readable: lost(first, readable,
                                                  "deleted by retention after the batch was planned"),
                     lost)


def build_partitions(tasks, opts, backend, lock: TaskLock | None = None,
                     exact_tags: tuple[str, ...] | None = None) -> list[RmqInputPartition]:
    """Planner tasks -> picklable input partitions carrying everything a task needs."""
    return [
        RmqInputPartition(
            backend=backend.spec,
            slot=task.slot,
            ranges=tuple(RangeSpec(r.mq.topic, r.mq.broker_name, r.mq.queue_id, r.start, r.end)
                         for r in task.ranges),
            sub_expression=opts.subscription.expression,
            expression_type=opts.subscription.expression_type,
            exact_tags=exact_tags,
            batch_rows=opts.batch_rows,
            batch_bytes=opts.batch_bytes,
            verify_crc=opts.verify_crc,
            fail_on_data_loss=opts.fail_on_data_loss,
            lock=lock,
            namespace=opts.namespace,
            trace=(None if opts.trace_topic is None   # (groups shown without the namespace)
                   else (opts.trace_topic, unwrap(opts.namespace, backend.spec.pull_group))),
            columns=opts.columns,
        )
        for task in tasks
    ]
