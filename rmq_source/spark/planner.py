"""Turning offset ranges into Spark tasks, and admission control.

* :func:`share_limit` splits a per-trigger limit across queues in proportion to their backlog.
* :func:`plan_tasks` maps queues onto consumer slots (Spark tasks) with an allocation strategy:
  the sorted queues are allocated to the sorted slot ids exactly as a RocketMQ client allocates
  queues to the sorted client ids of a group; each slot becomes one task reading its queues one
  after another. A queue range is never split when ``orderly`` (one task per queue, in offset
  order); otherwise ranges larger than needed are split to reach ``min_partitions`` tasks.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping

from rmq_source.group.allocation import (AllocateMessageQueueAveragely, AllocationStrategy, MessageQueue,
                                        java_string_key)
from rmq_source.errors import RmqAllocationError


@dataclass(frozen=True)
class QueueRange:
    """Queue offsets ``[start, end)`` of one queue."""

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


def slot_ids(count: int, client_id: str = "rmq_source") -> list[str]:
    """Consumer slot ids ``<client_id>#0000`` ...; zero-padded so string order is numeric order.

    Room-aware strategies read the room of a slot from ``client_id`` (text before its first ``@``),
    so ``clientId=room1@etl`` puts every slot of the query in room ``room1``.
    """
    return [f"{client_id}#{i:04d}" for i in range(count)]


def share_limit(backlogs: Mapping[MessageQueue, int], limit: int) -> dict[MessageQueue, int]:
    """How many messages each queue may admit when ``limit`` is shared by backlog.

    Each queue gets ``floor(limit * backlog / total)``; what rounding leaves over goes one by one to
    the queues with the largest remainders (ties: queue order). No queue gets more than its
    backlog and the shares add up to ``min(limit, total)``.
    """
    total = sum(b for b in backlogs.values() if b > 0)
    if total <= limit:
        return {mq: max(b, 0) for mq, b in backlogs.items()}
    shares: dict[MessageQueue, int] = {}
    remainders = []
    for mq in sorted(backlogs):
        b = max(backlogs[mq], 0)
        q, r = divmod(limit * b, total)
        shares[mq] = q
        remainders.append((-r, mq))
    left = limit - sum(shares.values())
    for _, mq in sorted(remainders)[:left]:
        shares[mq] += 1
    return shares


def allocate_slots(mqs: list[MessageQueue], strategy, group: str, slots: list[str]
                   ) -> dict[str, list[MessageQueue]]:
    """Queue -> slot allocation; every queue must go to exactly one slot.

    Memoized for the built-in strategies (pure functions of their arguments): a query asks for
    the same allocation every micro-batch (twice: latestOffset and partitions) and computing it
    costs O(slots x queues). A user's strategy is asked every time."""
    if type(strategy).__module__ != _BUILT_IN:
        return _allocate_slots(mqs, strategy, group, slots)
    got = _allocate_slots_cached(strategy, group, tuple(sorted(mqs)), tuple(slots))
    return {slot: list(q) for slot, q in got.items()}


_BUILT_IN = AllocateMessageQueueAveragely.__module__


@lru_cache(maxsize=16)
def _allocate_slots_cached(strategy, group: str, mqs: tuple, slots: tuple
                           ) -> dict[str, tuple[MessageQueue, ...]]:
    return {slot: tuple(q) for slot, q in _allocate_slots(list(mqs), strategy, group, list(slots)).items()}


def _allocate_slots(mqs: list[MessageQueue], strategy, group: str, slots: list[str]
                    ) -> dict[str, list[MessageQueue]]:
    mq_all = sorted(mqs)
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
        out[slot] = sorted(got)
    return out


def plan_tasks(ranges: list[QueueRange], strategy, group: str, num_partitions: int | None,
               orderly: bool, min_partitions: int | None, client_id: str = "rmq_source"
               ) -> list[ReadTask]:
    """Tasks for ``ranges``; empty ranges make no task and slots without data make no task.

    Queues the strategy gives to no slot are not read (their ranges are returned by no task);
    :func:`unallocated` tells the caller which ones, so it does not advance their offsets.
    """
    live = [r for r in ranges if r.size > 0]
    if not live:
        return []
    by_mq = {r.mq: r for r in ranges}
    slots = slot_ids(num_partitions if num_partitions else len(by_mq), client_id)
    allocation = allocate_slots(list(by_mq), strategy, group, slots)
    tasks = []
    for slot in slots:
        mine = tuple(by_mq[mq] for mq in allocation[slot] if by_mq[mq].size > 0)
        if mine:
            tasks.append(ReadTask(slot, mine))
    if not orderly and min_partitions and len(tasks) < min_partitions:
        tasks = _split(tasks, min_partitions)
    return tasks


def unallocated(mqs: list[MessageQueue], strategy, group: str, num_partitions: int | None,
                client_id: str = "rmq_source") -> set[MessageQueue]:
    """Queues that no slot receives (a query must not advance their offsets)."""
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
