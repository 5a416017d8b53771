"""Turning offset ranges into Spark tasks, and admission control.

* :func:`share_limit` splits a per-trigger limit across queues in proportion to their backlog.
* :func:`plan_tasks` maps queues onto consumer slots with an allocation strategy: the sorted
  queues are allocated to the sorted slot ids exactly as a RocketMQ client allocates queues to
  the sorted client ids of a group. With ``numPartitions`` each slot is one task reading its
  queues one after another; without it every queue is a slot and consecutive slots are packed
  into tasks sized to the work (:class:`TaskSizing`). Either way a queue is read by one task, in
  offset order, unless ``orderly`` is false: then ranges larger than needed are split to reach
  ``min_partitions`` tasks.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Mapping, NamedTuple

from rmq_source.group.allocation import (AllocateMessageQueueAveragely, AllocationStrategy, MessageQueue,
                                        java_string_key, sort_queues)
from rmq_source.errors import RmqAllocationError


class QueueRange(NamedTuple):
    """Queue offsets ``[start, end)`` of one queue (a named tuple: a plan makes one per queue,
    thousands per batch)."""

    mq: MessageQueue
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class ReadTask:
    """One Spark task: the ranges it reads, in this order, under consumer slot ``slot``."""

    slot: str
    ranges: tuple[QueueRange, ...]


#: A queue's fixed cost in a task (finding its files or its broker, the first scan or pull, the
#: Python around each range) as bytes of rows, for a backend that states none of its own
#: (Backend.queue_cost_bytes): a queue of a few small messages cost a store task about 0.1 ms
#: when every range had its own C call (bench/bench_scale.py), what Spark takes about 64 KiB of
#: rows in.
QUEUE_COST_BYTES = 64 << 10
#: What launching one more task costs, as bytes of reading (Spark's file sources call it
#: ``spark.sql.files.openCostInBytes``): without ``minPartitions`` a plan lighter than
#: ``parallelism`` times this gets fewer tasks, one per this many bytes. A Python task's round
#: trips cost ~50-70 ms on 2 cores, what one task reads ~8-16 MiB in (bench/bench_vs_kafka.py).
TASK_COST_BYTES = 8 << 20
#: The bytes per queue offset assumed for a topic when no message could be sampled.
UNSAMPLED_OFFSET_BYTES = 1024


def default_parallelism() -> int:
    """CPUs this process may run on. The planning runs in a Python worker beside the driver, to
    which PySpark passes no Spark setting that tells the cluster's parallelism: this is Spark's
    default parallelism in local mode (``local[*]``); a cluster sets ``minPartitions``."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):    # (not Linux)
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class TaskSizing:
    """How many tasks a plan without ``numPartitions`` gets, and what each weighs.

    A range weighs its offsets times the topic's bytes per offset (sampled with the query's
    subscription; see :mod:`.sizing`) plus ``queue_cost_bytes``. The plan gets ``max(spread,
    ceil(total weight / max_partition_bytes))`` tasks, but never more than the queues with data,
    where ``spread`` is ``parallelism``, or with ``task_cost_bytes`` (0: none) at most
    ``ceil(total weight / task_cost_bytes)``: a small micro-batch is one task, not one per core.
    More tasks than ``parallelism`` are rounded up to a multiple of it (whole waves).
    """

    parallelism: int
    max_partition_bytes: int
    offset_bytes: dict[str, float] = field(default_factory=dict)   # topic -> bytes per offset
    queue_cost_bytes: float = QUEUE_COST_BYTES      # a backend's own (Backend.queue_cost_bytes)
    task_cost_bytes: float = 0

    def weight(self, r: QueueRange) -> float:
        return ((r.end - r.start) * self.offset_bytes.get(r.mq.topic, UNSAMPLED_OFFSET_BYTES)
                + self.queue_cost_bytes)

    def task_count(self, total_weight: float, slots_with_data: int) -> int:
        spread = self.parallelism
        if self.task_cost_bytes:
            spread = min(spread, math.ceil(total_weight / self.task_cost_bytes))
        wanted = max(spread, math.ceil(total_weight / self.max_partition_bytes))
        if wanted > self.parallelism:    # whole waves: 3 tasks on 2 cores leave one idle half the time
            wanted = math.ceil(wanted / self.parallelism) * self.parallelism
        return max(1, min(slots_with_data, wanted))


def slot_ids(count: int, client_id: str = "rmq_source") -> list[str]:
    """Consumer slot ids ``<client_id>#0000`` ...; zero-padded so string order is numeric order.

    Room-aware strategies read the room of a slot from ``client_id`` (text before its first ``@``),
    so ``clientId=room1@etl`` puts every slot of the query in room ``room1``.
    """
    return list(_slot_ids(count, client_id))


@lru_cache(maxsize=16)
def _slot_ids(count: int, client_id: str) -> tuple[str, ...]:
    return tuple(f"{client_id}#{i:04d}" for i in range(count))


def share_limit(backlogs: Mapping[MessageQueue, int], limit: int) -> dict[MessageQueue, int]:
    """How many messages each queue may admit when ``limit`` is shared by backlog.

    Each queue gets ``floor(limit * backlog / total)``; what rounding leaves over goes one by one to
    the queues with the largest remainders (ties: queue order). No queue gets more than its
    backlog and the shares add up to ``min(limit, total)``.
    """
    total = sum(b for b in backlogs.values() if b > 0)
    if total <= limit:
        return {mq: max(b, 0) for mq, b in backlogs.items()}
    shares: dict[MessageQueue, int] = dict.fromkeys(backlogs, 0)
    remainders = []
    # (queues without backlog get 0 and no remainder: only the others are ordered)
    for i, mq in enumerate(sort_queues([mq for mq, b in backlogs.items() if b > 0])):
        q, r = divmod(limit * backlogs[mq], total)
        shares[mq] = q
        remainders.append((-r, i, mq))
    left = limit - sum(shares.values())
    for _, _, mq in sorted(remainders)[:left]:
        shares[mq] += 1
    return shares


def allocate_slots(mqs: list[MessageQueue], strategy, group: str, slots: list[str]
                   ) -> dict[str, list[MessageQueue]]:
    """Queue -> slot allocation; every queue must go to exactly one slot.

    Memoized for the built-in strategies (pure functions of their arguments): a query asks for
    the same allocation every micro-batch (twice: latestOffset and partitions) and computing it
    costs O(slots x queues). A user's strategy is asked every time."""
    return {slot: list(q) for slot, q in _allocation(mqs, strategy, group, slots).items()}


def _allocation(mqs: list[MessageQueue], strategy, group: str, slots: list[str]) -> Mapping:
    """:func:`allocate_slots` without the copy (read only: it may be the memoized answer)."""
    if type(strategy).__module__ != _BUILT_IN:
        return _allocate_slots(mqs, strategy, group, slots)
    return _allocate_slots_cached(strategy, group, tuple(sort_queues(mqs)), tuple(slots))


_BUILT_IN = AllocateMessageQueueAveragely.__module__


@lru_cache(maxsize=16)
def _allocate_slots_cached(strategy, group: str, mqs: tuple, slots: tuple
                           ) -> dict[str, tuple[MessageQueue, ...]]:
    return {slot: tuple(q) for slot, q in _allocate_slots(list(mqs), strategy, group, list(slots)).items()}


def _allocate_slots(mqs: list[MessageQueue], strategy, group: str, slots: list[str]
                    ) -> dict[str, list[MessageQueue]]:
    mq_all = sort_queues(mqs)
    known = set(mq_all)
    cid_all = sorted(slots, key=java_string_key)
    owner: dict[MessageQueue, str] = {}
    out: dict[str, list[MessageQueue]] = {}
    every = (strategy.allocate_all(group, mq_all, cid_all) if isinstance(strategy, AllocationStrategy)
             else {slot: strategy.allocate(group, slot, mq_all, cid_all) for slot in cid_all})
    for slot in cid_all:
        # CONFIG may name queues this query does not read: they are not this query's to read.
        got = [mq for mq in every[slot] if mq in known]
        for mq in got:
            if mq in owner:
                raise RmqAllocationError(
                    f"allocateStrategy {getattr(strategy, 'name', type(strategy).__name__)} gave "
                    f"{mq} to both {owner[mq]} and {slot}; a queue must be read by one task only "
                    "(use numPartitions=1 with CONFIG, or another strategy)")
            owner[mq] = slot
        out[slot] = sort_queues(got)
    return out


def plan_tasks(ranges: list[QueueRange], strategy, group: str, num_partitions: int | None,
               orderly: bool, min_partitions: int | None, client_id: str = "rmq_source",
               sizing: TaskSizing | None = None) -> list[ReadTask]:
    """Tasks for ``ranges``; empty ranges make no task and slots without data make no task.

    Without ``num_partitions`` the one-queue slots are packed into tasks by ``sizing`` (none:
    one task per slot). Queues the strategy gives to no slot are not read (their ranges are
    returned by no task); :func:`unallocated` tells the caller which ones, so it does not advance
    their offsets.
    """
    if not any(r.end > r.start for r in ranges):
        return []
    by_mq = {r.mq: r for r in ranges}
    slots = _slot_ids(num_partitions if num_partitions else len(by_mq), client_id)
    allocation = _allocation(list(by_mq), strategy, group, slots)
    live: list[tuple[str, tuple[QueueRange, ...]]] = []    # (slot, its ranges with data)
    for slot in slots:
        got = allocation[slot]
        if len(got) == 1:    # (every slot without numPartitions: no generator per queue)
            r = by_mq[got[0]]
            if r.end > r.start:
                live.append((slot, (r,)))
            continue
        mine = tuple(r for r in map(by_mq.__getitem__, got) if r.end > r.start)
        if mine:
            live.append((slot, mine))
    if not num_partitions and sizing is not None:
        tasks = _pack(live, sizing)
    else:
        tasks = [ReadTask(slot, mine) for slot, mine in live]
    if not orderly and min_partitions and len(tasks) < min_partitions:
        tasks = _split(tasks, min_partitions)
    return tasks


def pack_tasks(tasks: list[ReadTask], sizing: TaskSizing) -> list[ReadTask]:
    """Consecutive ``tasks`` (slots) merged into :meth:`TaskSizing.task_count` tasks of about
    equal weight; a merged task reads its slots' ranges in slot order. A slot heavier than a
    task's share is a task of its own (its ranges are never split here)."""
    return _pack([(t.slot, t.ranges) for t in tasks], sizing, tasks)


def _pack(slots: list[tuple[str, tuple[QueueRange, ...]]], sizing: TaskSizing,
          tasks: list[ReadTask] | None = None) -> list[ReadTask]:
    """:func:`pack_tasks` of (slot, ranges) pairs; ``tasks``: the same as ReadTasks, returned
    when nothing is merged (else made from the pairs)."""
    weight = sizing.weight
    weights = [weight(ranges[0]) if len(ranges) == 1 else sum(map(weight, ranges))
               for _, ranges in slots]
    total = sum(weights)
    n = sizing.task_count(total, len(slots))
    if n >= len(slots):
        return tasks if tasks is not None else [ReadTask(s, rs) for s, rs in slots]
    bins: list[list[tuple[str, tuple]]] = [[] for _ in range(n)]
    before = 0.0
    for pair, w in zip(slots, weights):
        # the bin holding the slot's middle, in cumulative weight: contiguous and balanced
        bins[min(n - 1, int((before + w / 2) * n / total))].append(pair)
        before += w
    return [ReadTask(b[0][0] if len(b) == 1 else f"{b[0][0]}..{b[-1][0]}",
                     tuple(r for _, ranges in b for r in ranges)) for b in bins if b]


def unallocated(mqs: list[MessageQueue], strategy, group: str, num_partitions: int | None,
                client_id: str = "rmq_source") -> set[MessageQueue]:
    """Queues that no slot receives (a query must not advance their offsets). Memoized for the
    built-in strategies, as :func:`allocate_slots` (asked at every micro-batch)."""
    if type(strategy).__module__ != _BUILT_IN:
        return _unallocated(mqs, strategy, group, num_partitions, client_id)
    return set(_unallocated_cached(strategy, group, tuple(sort_queues(mqs)), num_partitions,
                                   client_id))


@lru_cache(maxsize=16)
def _unallocated_cached(strategy, group: str, mqs: tuple, num_partitions: int | None,
                        client_id: str) -> frozenset:
    return frozenset(_unallocated(list(mqs), strategy, group, num_partitions, client_id))


def _unallocated(mqs: list[MessageQueue], strategy, group: str, num_partitions: int | None,
                 client_id: str) -> set[MessageQueue]:
    slots = slot_ids(num_partitions if num_partitions else len(mqs), client_id)
    given = {mq for got in allocate_slots(mqs, strategy, group, slots).values() for mq in got}
    return set(mqs) - given


def _split(tasks: list[ReadTask], min_partitions: int) -> list[ReadTask]:
    """Split each range into pieces so that about ``min_partitions`` tasks exist (unordered mode)."""
    total = sum(r.size for t in tasks for r in t.ranges)
    target = max(1, -(-total // min_partitions))
    out = []
    for task in tasks:
        for r in task.ranges:
            start = r.start
            n = 0
            while start < r.end:
                end = min(r.end, start + target)
                out.append(ReadTask(f"{task.slot}-{n}", (QueueRange(r.mq, start, end),)))
                start, n = end, n + 1
    return out
