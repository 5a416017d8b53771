"""A consumer group's progress: lag per queue (like RocketMQ's ``consumerProgress``) and resets
(like ``resetOffsetByTime``), through a :class:`~rmq_source.backend.Backend` and its group offset store.

``brokerOffset`` is the queue's max offset (next to be written); ``consumerOffset`` is the group's
next offset to consume (-1 when the group has none); ``diff`` = broker - consumer offset (the whole
queue when the group has no progress); ``lastTimestamp`` is the store time (epoch ms) of the last
consumed message, or None.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from rmq_source.backend import Backend
from rmq_source.errors import RmqOptionError
from rmq_source.group.allocation import MessageQueue
from rmq_source.group.offset_store import ReadOffsetType


@dataclass(frozen=True)
class QueueLag:
    topic: str
    broker_name: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    diff: int
    last_timestamp: int | None


def _queues(backend: Backend, topics: Iterable[str] | None) -> list[MessageQueue]:
    return backend.queues_for_topics(sorted(topics) if topics else sorted(backend.topics()))


def _store_time(backend: Backend, mq: MessageQueue, offset: int) -> int | None:
    """Store time (epoch ms) of the message at ``offset``, None when it cannot be read."""
    batches = backend.read(mq, offset, offset + 1, subscription="*", batch_rows=1, batch_bytes=1 << 26,
                           verify_crc=False, on_data_loss=lambda *_: None,
                           on_short_read=lambda *_: None)
    for batch in batches:
        if batch.num_rows:
            return batch.column("storeTimestamp")[0].value // 1000
    return None


def group_lag(backend: Backend, group: str, topics: Iterable[str] | None = None) -> list[QueueLag]:
    """Lag of ``group`` on every queue of ``topics`` (default: every topic of the backend)."""
    store = backend.offset_store(group)
    mqs = _queues(backend, topics)
    committed = store.read_offsets(mqs, ReadOffsetType.READ_FROM_STORE)
    infos = backend.infos(mqs)
    out = []
    for mq in mqs:
        info = infos[mq]
        consumer = committed.get(mq, -1)
        diff = info.max_offset - (consumer if consumer >= 0 else info.min_offset)
        last_ts = None
        if info.min_offset < consumer <= info.max_offset:
            last_ts = _store_time(backend, mq, consumer - 1)
        out.append(QueueLag(mq.topic, mq.broker_name, mq.queue_id, info.max_offset, consumer,
                            max(diff, 0), last_ts))
    return out


def reset_group(backend: Backend, group: str, topic: str, *, timestamp_ms: int | None = None,
                to: str | None = None, offsets: Mapping[MessageQueue, int] | None = None
                ) -> dict[MessageQueue, int]:
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
    mqs = backend.queues_for_topics([topic])
    if offsets is not None:
        unknown = sorted(set(offsets) - set(mqs))
        if unknown:
            names = ", ".join(f"{mq.topic}/{mq.broker_name}/{mq.queue_id}" for mq in unknown)
            raise RmqOptionError(f"--offsets names queues that {topic!r} does not have: {names} "
                                 f"(its queues: {', '.join(str(q.queue_id) for q in mqs)})")
        mqs = sorted(offsets)
    new: dict[MessageQueue, int] = {}
    infos = backend.infos(mqs)
    for mq in mqs:
        info = infos[mq]
        if timestamp_ms is not None:
            value = backend.offset_for_timestamp(mq, timestamp_ms)
        elif to is not None:
            value = info.min_offset if to == "earliest" else info.max_offset
        else:
            value = {-2: info.min_offset, -1: info.max_offset}.get(offsets[mq], offsets[mq])
        new[mq] = min(max(value, info.min_offset), info.max_offset)
    store = backend.offset_store(group)
    for mq, value in new.items():
        store.update_offset(mq, value, increase_only=False)
    store.persist(list(new))
    return new
