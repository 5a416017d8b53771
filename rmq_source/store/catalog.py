"""The brokers a query reads: one :class:`Store` per broker name, and the queues they hold.

Stores are cached per process (Spark reuses Python workers), keyed by path and broker name, so
repeated tasks reuse the same file mappings.
"""
from __future__ import annotations

import re
import threading
from typing import Iterable, Mapping

from rmq_source.group.allocation import MessageQueue
from rmq_source.errors import RmqUnknownTopicError
from rmq_source.store.reader import QueueInfo, Store

_CACHE: dict[tuple[str, str], Store] = {}
_CACHE_LOCK = threading.Lock()


def open_store(path: str, broker_name: str) -> Store:
    """The process-wide :class:`Store` for ``path`` under ``broker_name``."""
    key = (path, broker_name)
    with _CACHE_LOCK:
        store = _CACHE.get(key)
        if store is None:
            store = _CACHE[key] = Store(path, broker_name=broker_name)
        return store


class StoreCatalog:
    """Stores by broker name; ``brokers`` maps each broker name to its store root."""

    def __init__(self, brokers: Mapping[str, str]):
        self.brokers = dict(sorted(brokers.items()))

    def store(self, broker_name: str) -> Store:
        try:
            path = self.brokers[broker_name]
        except KeyError:
            raise RmqUnknownTopicError(
                f"broker {broker_name!r} is not configured (brokers: {', '.join(self.brokers)})") from None
        return open_store(path, broker_name)

    def topics(self) -> dict[str, list[str]]:
        """Topic -> broker names that hold it."""
        out: dict[str, list[str]] = {}
        for broker in self.brokers:
            for topic in self.store(broker).topics():
                out.setdefault(topic, []).append(broker)
        return out

    def _queues_of(self, topic: str, brokers: Iterable[str]) -> list[MessageQueue]:
        return [MessageQueue(topic, b, q) for b in brokers for q in self.store(b).queue_ids(topic)]

    def queues_for_topics(self, topics: Iterable[str]) -> list[MessageQueue]:
        """Every queue of the named topics on every broker; a topic found nowhere is an error."""
        known = self.topics()
        out: list[MessageQueue] = []
        for topic in topics:
            if topic not in known:
                raise RmqUnknownTopicError(
                    f"option topic: {topic!r} is not in any store "
                    f"({', '.join(f'{b}={p}' for b, p in self.brokers.items())}); "
                    f"topics found: {', '.join(sorted(known)) or 'none'}")
            out.extend(self._queues_of(topic, known[topic]))
        return sorted(out)

    def queues_for_pattern(self, pattern: re.Pattern) -> list[MessageQueue]:
        """Queues of every topic whose whole name matches ``pattern`` (may be empty)."""
        out: list[MessageQueue] = []
        for topic, brokers in self.topics().items():
            if pattern.fullmatch(topic):
                out.extend(self._queues_of(topic, brokers))
        return sorted(out)

    def queues_for_assign(self, assign: Mapping[str, Mapping[str, Iterable[int]]]) -> list[MessageQueue]:
        """The queues named by ``assign`` ({topic: {broker: [queueIds]}}); each must exist."""
        out: list[MessageQueue] = []
        for topic, brokers in assign.items():
            for broker, qids in brokers.items():
                existing = set(self.store(broker).queue_ids(topic))
                for qid in qids:
                    if qid not in existing:
                        raise RmqUnknownTopicError(
                            f"option assign: queue {qid} of topic {topic!r} does not exist on broker "
                            f"{broker!r} (queues: {sorted(existing)})")
                    out.append(MessageQueue(topic, broker, qid))
        return sorted(set(out))

    def info(self, mq: MessageQueue) -> QueueInfo:
        return self.store(mq.broker_name).queue_info(mq.topic, mq.queue_id)

    def infos(self, mqs: Iterable[MessageQueue]) -> dict[MessageQueue, QueueInfo]:
        """Min/max of every queue; each store lists its CommitLog once for all its queues."""
        mqs = list(mqs)
        groups: dict[tuple[str, str], list[MessageQueue]] = {}
        for mq in mqs:
            groups.setdefault((mq.broker_name, mq.topic), []).append(mq)
        found: dict[MessageQueue, QueueInfo] = {}
        for (broker, topic), group in groups.items():
            infos = self.store(broker).queue_infos(topic, [mq.queue_id for mq in group])
            found.update(zip(group, infos))
        return {mq: found[mq] for mq in mqs}

    def offset_for_timestamp(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return self.store(mq.broker_name).offset_for_timestamp(mq.topic, mq.queue_id, timestamp_ms)
