"""What a Spark task runs: read the queue ranges of one input partition as Arrow batches.

Everything a task needs travels in the pickled :class:`RmqInputPartition`; nothing here depends
on driver state, so tasks run the same in separate executor processes.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from rmq_source.group.allocation import MessageQueue
from rmq_source.store.catalog import open_store
from rmq_source.errors import RmqDataLossError, RmqStoreLayoutError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RangeSpec:
    """Queue offsets ``[start, end)`` of (topic, broker, queue) in the store at ``store_path``."""

    topic: str
    broker_name: str
    queue_id: int
    start: int
    end: int
    store_path: str


@dataclass(frozen=True)
class LockSpec:
    """Ordered mode: the task must hold these locks (checked before reading)."""

    state_dir: str
    group: str
    client_id: str
    client_lease_ms: int


@dataclass(frozen=True)
class RmqInputPartition(InputPartition):
    """One task: its ranges (read in order), the subscription and read settings."""

    slot: str
    ranges: tuple[RangeSpec, ...]
    sub_expression: str
    batch_rows: int
    batch_bytes: int
    verify_crc: bool
    fail_on_data_loss: bool
    lock: LockSpec | None = None


def read_partition(part: RmqInputPartition) -> Iterator[pa.RecordBatch]:
    """Yield the partition's rows: each range in ascending queue offset, ranges in order.

    Spark hands a plain ``InputPartition(None)`` to ``read`` when the plan has no partition (nothing
    to read): it yields nothing.
    """
    if not isinstance(part, RmqInputPartition):
        return
    if part.lock is not None:
        from rmq_source.group.locks import check_task_locks
        check_task_locks(part)
    for r in part.ranges:
        def lost(first: int, until: int, why: str, r: RangeSpec = r) -> None:
            msg = (f"{MessageQueue(r.topic, r.broker_name, r.queue_id)}: offsets [{first}, "
                   f"{until}) ({until - first} messages) of the planned range [{r.start}, {r.end}) "
                   f"cannot be read: {why}")
            if part.fail_on_data_loss:
                raise RmqDataLossError(msg + "; set failOnDataLoss=false to skip them")
            log.warning("%s; skipped %d messages (failOnDataLoss=false)", msg, until - first)

        if r.start >= r.end:
            continue
        try:
            store = open_store(r.store_path, r.broker_name)
        except RmqStoreLayoutError:
            if os.path.isdir(r.store_path):
                raise
            # the broker's store was removed after the driver planned the batch
            lost(r.start, r.end, f"the store root {r.store_path} of broker {r.broker_name!r} no "
                                 "longer exists")
            continue
        # A task reaches the end it was planned with, or says what it could not read: retention
        # (on_data_loss) and a queue shorter than planned or gone (on_short_read).
        yield from store.iter_batches(
            r.topic, r.queue_id, r.start, r.end, subscription=part.sub_expression,
            batch_rows=part.batch_rows, batch_bytes=part.batch_bytes,
            verify_crc=part.verify_crc,
            on_data_loss=lambda first, readable, lost=lost: lost(
                first, readable, "deleted by retention after the batch was planned"),
            on_short_read=lost)


def build_partitions(tasks, opts, catalog, lock: LockSpec | None = None) -> list[RmqInputPartition]:
    """Planner tasks -> picklable input partitions carrying everything a task needs."""
    return [
        RmqInputPartition(
            slot=task.slot,
            ranges=tuple(RangeSpec(r.mq.topic, r.mq.broker_name, r.mq.queue_id, r.start, r.end,
                                   catalog.brokers[r.mq.broker_name]) for r in task.ranges),
            sub_expression=opts.subscription.expression,
            batch_rows=opts.batch_rows,
            batch_bytes=opts.batch_bytes,
            verify_crc=opts.verify_crc,
            fail_on_data_loss=opts.fail_on_data_loss,
            lock=lock,
        )
        for task in tasks
    ]
