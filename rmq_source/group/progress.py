"""A consumer group's progress: lag per queue (like RocketMQ's ``consumerProgress``) and resets
(like ``resetOffsetByTime``), on top of :class:`~rmq_source.group.offset_store.GroupOffsetStore`.

``brokerOffset`` is the queue's max offset (next to be written); ``consumerOffset`` is the group's
next offset to consume (-1 when the group has none); ``diff`` = broker - consumer offset (the whole
queue when the group has no progress); ``lastTimestamp`` is the store time (epoch ms) of the last
consumed message, or None.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable, Mapping

from rmq_source.group.allocation import MessageQueue
from rmq_source.store.catalog import StoreCatalog
from rmq_source.errors import RmqOptionError
from rmq_source.group.offset_store import GroupOffsetStore, ReadOffsetType
from rmq_source.spark.options import DEFAULT_OFFSET_STORE_DIRNAME


@dataclass(frozen=True)
class QueueLag:
    topic: str
    broker_name: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    diff: int
    last_timestamp: int | None


def default_offset_store_path(brokers: Mapping[str, str]) -> str:
    """Where a query keeps group progress when ``offsetStorePath`` is not given."""
    return os.path.join(next(iter(brokers.values())), DEFAULT_OFFSET_STORE_DIRNAME)


def open_group(brokers: Mapping[str, str], group: str, offset_store_path: str | None = None
               ) -> GroupOffsetStore:
    return GroupOffsetStore(offset_store_path or default_offset_store_path(brokers), group,
                            broker_stores=brokers)


def _queues(catalog: StoreCatalog, topics: Iterable[str] | None) -> list[MessageQueue]:
    return catalog.queues_for_topics(sorted(topics) if topics else sorted(catalog.topics()))


def group_lag(brokers: Mapping[str, str], group: str, topics: Iterable[str] | None = None,
              offset_store_path: str | None = None) -> list[QueueLag]:
    """Lag of ``group`` on every queue of ``topics`` (default: every topic of the stores)."""
    catalog = StoreCatalog(brokers)
    store = open_group(catalog.brokers, group, offset_store_path)
    mqs = _queues(catalog, topics)
    committed = store.read_offsets(mqs, ReadOffsetType.READ_FROM_STORE)
    out = []
    for mq in mqs:
        info = catalog.info(mq)
        consumer = committed.get(mq, -1)
        diff = info.max_offset - (consumer if consumer >= 0 else info.min_offset)
        last_ts = None
        if info.min_offset < consumer <= info.max_offset:
            batch = catalog.store(mq.broker_name).read(mq.topic, mq.queue_id, consumer - 1, consumer)
            if batch.num_rows:
                last_ts = batch.column("storeTimestamp")[0].value // 1000
        out.append(QueueLag(mq.topic, mq.broker_name, mq.queue_id, info.max_offset, consumer,
                            max(diff, 0), last_ts))
    return out


def reset_group(brokers: Mapping[str, str], group: str, topic: str, *, timestamp_ms: int | None = None,
                to: str | None = None, offsets: Mapping[MessageQueue, int] | None = None,
                offset_store_path: str | None = None) -> dict[MessageQueue, int]:
    """Rewrite ``group``'s progress on ``topic``; exactly one of timestamp_ms / to / offsets.

    ``to`` is ``earliest`` or ``latest``; ``timestamp_ms`` moves each queue to its first message
    stored at or after it; ``offsets`` gives queues explicitly (-2 earliest, -1 latest) and must name
    queues of ``topic``. Offsets are clamped to each queue's [min, max]. Returns what was written.
    """
    given = [x is not None for x in (timestamp_ms, to, offsets)]
    if sum(given) != 1:
        raise RmqOptionError("reset needs exactly one of --timestamp, --to or --offsets")
    if to is not None and to not in ("earliest", "latest"):
        raise RmqOptionError(f"--to must be earliest or latest, got {to!r}")
    catalog = StoreCatalog(brokers)
    mqs = catalog.queues_for_topics([topic])
    if offsets is not None:
        unknown = sorted(set(offsets) - set(mqs))
        if unknown:
            names = ", ".join(f"{mq.topic}/{mq.broker_name}/{mq.queue_id}" for mq in unknown)
            raise RmqOptionError(f"--offsets names queues that {topic!r} does not have: {names} "
                                 f"(its queues: {', '.join(str(q.queue_id) for q in mqs)})")
        mqs = sorted(offsets)
    new: dict[MessageQueue, int] = {}
    for mq in mqs:
        info = catalog.info(mq)
        if timestamp_ms is not None:
            value = catalog.offset_for_timestamp(mq, timestamp_ms)
        elif to is not None:
            value = info.min_offset if to == "earliest" else info.max_offset
        else:
            value = {-2: info.min_offset, -1: info.max_offset}.get(offsets[mq], offsets[mq])
        new[mq] = min(max(value, info.min_offset), info.max_offset)
    store = open_group(catalog.brokers, group, offset_store_path)
    for mq, value in new.items():
        store.update_offset(mq, value, increase_only=False)
    store.persist(list(new))
    return new
