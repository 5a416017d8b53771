"""The streaming reader (``spark.readStream.format("rmq")``).

Offsets are ``{"topic": {"broker": {"queueId": next_offset}}}`` (see :mod:`rmq_source.offsets`).
A micro-batch reads ``[start, end)`` of every queue. The consumer group's progress is written only
for batches Spark has committed, so a failed or retried batch never moves the group:

* :meth:`RmqStreamReader.commit` (Spark calls it for batch N-1 while it plans batch N);
* :meth:`RmqStreamReader.latestOffset`: Spark plans a new batch only after the batch ending at
  ``start`` is in the checkpoint's commit log, so ``start`` is committed progress. This is what
  records the final batch of a ``Trigger.AvailableNow`` run, for which Spark calls no ``commit``.

After a processing-time query stops, the group may trail the checkpoint by the last batch; the same
query resumes from its checkpoint regardless.
"""
from __future__ import annotations

import time

from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxBytes, ReadMaxRows,
                                              ReadMinRows, SupportsTriggerAvailableNow)

from .allocation import MessageQueue
from .catalog import StoreCatalog
from .offsets import from_json_dict, to_json_dict
from .partition_reader import build_partitions, read_partition
from .planner import QueueRange, plan_tasks, share_limit, unallocated
from .positions import check_data_loss, starting_offsets
from .query import discover_queues, open_group_store, strategy_of


class RmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over the queues of the query, with admission control and group commits."""

    def __init__(self, opts):
        self.opts = opts
        self.catalog = StoreCatalog(opts.brokers)
        self.strategy = strategy_of(opts)
        self.group_store = open_group_store(opts, self.catalog)
        self._target: dict[MessageQueue, int] | None = None  # Trigger.AvailableNow end
        self._last_batch_at = time.monotonic()
        self._committed: dict[MessageQueue, int] | None = None

    # -- offsets -----------------------------------------------------------------------------
    def _queues(self, known=()) -> list[MessageQueue]:
        return sorted(set(discover_queues(self.catalog, self.opts)) | set(known))

    def initialOffset(self) -> dict:
        mqs = self._queues()
        starts = starting_offsets(self.catalog, mqs, self.opts, self.group_store)
        infos = self.catalog.infos(mqs)
        return to_json_dict({mq: check_data_loss(mq, starts[mq], infos[mq], self.opts.fail_on_data_loss)
                             for mq in mqs})

    def _latest(self, mqs) -> dict[MessageQueue, int]:
        infos = self.catalog.infos(mqs)
        latest = {mq: infos[mq].max_offset for mq in mqs}
        if self._target is not None:
            # Trigger.AvailableNow: nothing written after prepareForTriggerAvailableNow is read.
            latest = {mq: min(v, self._target.get(mq, 0)) for mq, v in latest.items()}
        return latest

    def _starts_with_new_queues(self, start: dict, mqs) -> dict[MessageQueue, int]:
        """``start`` plus queues discovered since, which begin at their current min offset."""
        starts = from_json_dict(start, what="start offset")
        new = [mq for mq in mqs if mq not in starts]
        if new:
            infos = self.catalog.infos(new)
            for mq in new:
                starts[mq] = infos[mq].min_offset
        return starts

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        self._commit_group(from_json_dict(start, what="start offset"))
        starts = self._starts_with_new_queues(start, self._queues(from_json_dict(start)))
        mqs = sorted(starts)
        latest = self._latest(mqs)
        skipped = unallocated(mqs, self.strategy, self.opts.consumer_group or "",
                              self.opts.num_partitions, self.opts.client_id)
        backlog = {mq: max(0, latest[mq] - starts[mq]) for mq in mqs if mq not in skipped}
        if not isinstance(limit, ReadAllAvailable):
            backlog = self._admit(backlog, starts)
        end = {mq: starts[mq] + backlog.get(mq, 0) for mq in mqs}
        if any(backlog.values()):
            self._last_batch_at = time.monotonic()
        return to_json_dict(end)

    def _admit(self, backlog: dict[MessageQueue, int], starts) -> dict[MessageQueue, int]:
        """Apply the option limits: min messages (bounded by maxTriggerDelay), max messages/bytes."""
        o = self.opts
        total = sum(backlog.values())
        if o.min_messages_per_trigger and total < o.min_messages_per_trigger:
            waited_ms = (time.monotonic() - self._last_batch_at) * 1000
            if waited_ms < o.max_trigger_delay_ms:
                return {}
        if o.max_messages_per_trigger:
            backlog = share_limit(backlog, o.max_messages_per_trigger)
        if o.max_bytes_per_trigger:
            byte_share = self._byte_backlog(backlog, starts)
            budget = share_limit(byte_share, o.max_bytes_per_trigger)
            backlog = {mq: self._messages_within(mq, starts[mq], n, budget[mq])
                       for mq, n in backlog.items()}
        return backlog

    def _byte_backlog(self, backlog, starts) -> dict[MessageQueue, int]:
        return {mq: self.catalog.store(mq.broker_name).range_bytes(mq.topic, mq.queue_id, starts[mq],
                                                                  starts[mq] + n)
                for mq, n in backlog.items() if n}

    def _messages_within(self, mq: MessageQueue, start: int, count: int, budget: int) -> int:
        if count == 0:
            return 0
        return self.catalog.store(mq.broker_name).count_within_bytes(
            mq.topic, mq.queue_id, start, start + count, budget)

    def getDefaultReadLimit(self) -> ReadLimit:
        o = self.opts
        if o.max_messages_per_trigger:
            return ReadMaxRows(o.max_messages_per_trigger)
        if o.max_bytes_per_trigger:
            return ReadMaxBytes(o.max_bytes_per_trigger)
        if o.min_messages_per_trigger:
            return ReadMinRows(o.min_messages_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict:
        mqs = self._queues()
        infos = self.catalog.infos(mqs)
        return to_json_dict({mq: infos[mq].max_offset for mq in mqs})

    def prepareForTriggerAvailableNow(self) -> None:
        mqs = self._queues()
        infos = self.catalog.infos(mqs)
        self._target = {mq: infos[mq].max_offset for mq in mqs}

    # -- planning and reading ----------------------------------------------------------------
    def partitions(self, start: dict, end: dict):
        ends = from_json_dict(end, what="end offset")
        starts = from_json_dict(start, what="start offset")
        infos = self.catalog.infos(list(ends))
        ranges = []
        for mq, stop in sorted(ends.items()):
            if mq in starts:
                first = check_data_loss(mq, starts[mq], infos[mq], self.opts.fail_on_data_loss)
            else:  # a queue discovered in this batch starts at its min offset: nothing was lost
                first = min(infos[mq].min_offset, stop)
            ranges.append(QueueRange(mq, first, max(first, stop)))
        tasks = plan_tasks(ranges, self.strategy, self.opts.consumer_group or "",
                           self.opts.num_partitions, self.opts.orderly, self.opts.min_partitions,
                           self.opts.client_id)
        return build_partitions(tasks, self.opts, self.catalog)

    def read(self, partition):
        return read_partition(partition)

    def commit(self, end: dict) -> None:
        """Spark committed the batch ending at ``end``: persist the group's progress."""
        self._commit_group(from_json_dict(end, what="committed offset"))

    def _commit_group(self, offsets: dict[MessageQueue, int]) -> None:
        if self.group_store is None or offsets == self._committed:
            return
        for mq, offset in offsets.items():
            self.group_store.update_offset(mq, offset, increase_only=False)
        self.group_store.persist(list(offsets))
        self._committed = dict(offsets)

    def stop(self) -> None:
        pass
