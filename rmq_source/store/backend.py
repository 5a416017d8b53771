"""The store-folder backend: one :class:`Store` per broker name, group state in files beside them.

Stores are cached per process (Spark reuses Python workers), keyed by path and broker name, so
repeated tasks reuse the same file mappings. Group state (offsets, membership, locks, batch plans)
lives in the offset store folder (``offsetStorePath``, default ``<first store>/.rmq_source``).
"""
from __future__ import annotations

import itertools
import os
import threading
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping

from rmq_source.backend import Backend, BackendSpec, QueueInfo, TaskLock
from rmq_source.errors import RmqStoreLayoutError, RmqUnknownTopicError
from rmq_source.group.allocation import MessageQueue
from rmq_source.store.range_reads import read_ranges
from rmq_source.store.reader import Store

_CACHE: dict[tuple[str, str], Store] = {}
_BACKENDS: dict["StoreBackendSpec", "StoreBackend"] = {}
_CACHE_LOCK = threading.Lock()


def open_store(path: str, broker_name: str) -> Store:
    """The process-wide :class:`Store` for ``path`` under ``broker_name``."""
    key = (path, broker_name)
    with _CACHE_LOCK:
        store = _CACHE.get(key)
        if store is None:
            store = _CACHE[key] = Store(path, broker_name=broker_name)
        return store


@dataclass(frozen=True)
class StoreBackendSpec(BackendSpec):
    """Store roots by broker name (sorted pairs) and the folder of the groups' state files."""

    brokers: tuple[tuple[str, str], ...]
    state_dir: str

    def open(self) -> "StoreBackend":
        with _CACHE_LOCK:
            backend = _BACKENDS.get(self)
            if backend is None:
                backend = _BACKENDS[self] = StoreBackend(dict(self.brokers), self.state_dir)
            return backend


class StoreBackend(Backend):
    """Broker store folders; ``brokers`` maps each broker name to its store root. Group state
    lives in ``state_dir`` (``offsetStorePath``; by default beside the first store)."""

    #: A task reads a queue of a few small messages in about 15 us (its listing checked, its
    #: range scanned in a C call shared with other queues: bench/bench_scale.py), what a task
    #: takes about 8 KiB of rows in (at the rate QUEUE_COST_BYTES assumes, 64 KiB per 0.1 ms).
    queue_cost_bytes = 8 << 10

    def __init__(self, brokers: Mapping[str, str], state_dir: str | None = None):
        from rmq_source.group.offset_store import default_offset_store_path
        self.brokers = dict(sorted(brokers.items()))
        self.state_dir = os.path.abspath(state_dir or default_offset_store_path(brokers))
        self.spec = StoreBackendSpec(tuple(self.brokers.items()), self.state_dir)

    def store(self, broker_name: str) -> Store:
        self.check_broker(broker_name)
        return open_store(self.brokers[broker_name], broker_name)

    # -- queues --------------------------------------------------------------------------------
    def check_broker(self, broker_name: str) -> None:
        if broker_name not in self.brokers:
            raise RmqUnknownTopicError(
                f"broker {broker_name!r} is not configured (brokers: {', '.join(self.brokers)})")

    def where(self) -> str:
        return f"any store ({', '.join(f'{b}={p}' for b, p in self.brokers.items())})"

    def topics(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for broker in self.brokers:
            for topic in self.store(broker).topics():
                out.setdefault(topic, []).append(broker)
        return out

    def queue_ids(self, topic: str, broker_name: str) -> list[int]:
        return self.store(broker_name).queue_ids(topic)

    # -- offsets -------------------------------------------------------------------------------
    def infos(self, mqs: Iterable[MessageQueue]) -> dict[MessageQueue, QueueInfo]:
        """Each store lists its CommitLog once for all its queues."""
        mqs = list(mqs)
        groups: dict[tuple[str, str], list[MessageQueue]] = {}
        for mq in mqs:
            groups.setdefault((mq.broker_name, mq.topic), []).append(mq)
        if len(groups) == 1:   # (one topic of one store: the queues are already in order)
            (broker, topic), group = next(iter(groups.items()))
            return dict(zip(group, self.store(broker).queue_infos(
                topic, [mq.queue_id for mq in group])))
        found: dict[MessageQueue, QueueInfo] = {}
        for (broker, topic), group in groups.items():
            infos = self.store(broker).queue_infos(topic, [mq.queue_id for mq in group])
            found.update(zip(group, infos))
        return {mq: found[mq] for mq in mqs}

    def info(self, mq: MessageQueue) -> QueueInfo:
        return self.store(mq.broker_name).queue_info(mq.topic, mq.queue_id)

    def offset_for_timestamp(self, mq: MessageQueue, timestamp_ms: int, *, info=None) -> int:
        return self.store(mq.broker_name).offset_for_timestamp(mq.topic, mq.queue_id, timestamp_ms)

    def unit_sizes(self, mq: MessageQueue, start: int, end: int):
        return self.store(mq.broker_name).unit_sizes(mq.topic, mq.queue_id, start, end)

    # -- messages ------------------------------------------------------------------------------
    def read(self, mq, start, end, *, subscription, batch_rows, batch_bytes, verify_crc,
             on_data_loss, on_short_read, columns=None) -> Iterator:
        store = self._store_to_read(mq, start, end, on_short_read)
        if store is not None:
            yield from store.iter_batches(mq.topic, mq.queue_id, start, end, subscription=subscription,
                                          batch_rows=batch_rows, batch_bytes=batch_bytes,
                                          verify_crc=verify_crc, on_data_loss=on_data_loss,
                                          on_short_read=on_short_read, columns=columns)

    def _store_to_read(self, mq, start, end, on_short_read) -> Store | None:
        path = self.brokers.get(mq.broker_name)
        try:
            return self.store(mq.broker_name)
        except RmqStoreLayoutError:
            if path is None or os.path.isdir(path):
                raise
            # the broker's store was removed after the driver planned the batch
            on_short_read(start, end, f"the store root {path} of broker {mq.broker_name!r} no "
                                      "longer exists")
            return None

    def read_many(self, ranges, *, subscription, batch_rows, batch_bytes, verify_crc,
                  columns=None) -> Iterator:
        """The consecutive ranges of one broker are read together
        (:func:`rmq_source.store.range_reads.read_ranges`: one C call scans many ranges of a
        topic into one batch, converted to rows once), so a task over many small queues pays
        per batch, not per queue; batches of up to ``batch_rows`` rows and ``batch_bytes``
        bytes, each handed out as soon as it is full, before more is read."""
        for broker, run in itertools.groupby(ranges, key=lambda r: r.mq.broker_name):
            run = list(run)
            store = self._store_to_read(run[0].mq, run[0].start, run[0].end, run[0].on_short_read)
            if store is None:
                for r in run[1:]:
                    r.on_short_read(r.start, r.end, f"the store root {self.brokers[broker]} of "
                                    f"broker {broker!r} no longer exists")
                continue
            yield from read_ranges(store, run, subscription=subscription, batch_rows=batch_rows,
                                   batch_bytes=batch_bytes, verify_crc=verify_crc, columns=columns)

    # -- group state ---------------------------------------------------------------------------
    def offset_store(self, group: str):
        from rmq_source.group.offset_store import GroupOffsetStore
        return GroupOffsetStore(self.state_dir, group, broker_stores=self.brokers)

    def group_session(self, opts, strategy, offset_store):
        from rmq_source.group.session import GroupSession
        return GroupSession(opts, strategy, offset_store, state_dir=self.state_dir)

    def group_topics(self, group: str) -> set[str]:
        """Topics with offsets of ``group`` in our offset store or a broker's consumerOffset.json."""
        from rmq_source.errors import RmqOffsetStoreError
        from rmq_source.store.config_files import load_config_json, read_consumer_offsets

        store = self.offset_store(group)
        topics = set()
        for broker, root in self.brokers.items():
            data = load_config_json(store.file_path(broker), root=self.state_dir,
                                    error_cls=RmqOffsetStoreError)
            table = data.get("offsetTable") if isinstance(data, dict) else None
            for key in (table or {}):
                topic, _, owner = str(key).partition("@")
                if owner == group and topic:
                    topics.add(topic)
            topics.update(t for t, g in read_consumer_offsets(root) if g == group)
        return topics

    def group_users(self, group: str) -> tuple[list[str], dict[str, str]]:
        from rmq_source.group.locks import QueueLockManager, parse_queue_key
        from rmq_source.group.membership import GroupMembership

        if not os.path.isdir(self.state_dir):
            return [], {}
        locks = QueueLockManager(self.state_dir, group, history=False)
        now = locks.now_ms()
        held = {}
        for key, entry in sorted(locks.entries().items()):
            if not entry.is_expired(now):
                topic, broker, qid = parse_queue_key(key)
                held[f"{topic}/{broker}/{qid}"] = entry.client_id
        live = GroupMembership(self.state_dir, group, f"rmq-store-{os.getpid()}").live_clients()
        return live, held

    def check_task_locks(self, lock: TaskLock, mqs: Iterable[MessageQueue]) -> set[MessageQueue]:
        """Every queue, or RmqLockError: the lock table tells a lease this client let run out
        from a queue another member holds only by its history, so any missing lock fails."""
        from rmq_source.group.locks import QueueLockManager
        mqs = list(mqs)
        mgr = QueueLockManager(self.state_dir, lock.group, history=False)
        mgr.assert_held_batch([(mq.topic, mq.broker_name, mq.queue_id) for mq in mqs],
                              lock.client_id, lock.client_lease_ms)
        return set(mqs)
