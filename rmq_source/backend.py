"""The seam between the Spark side and where messages and group state come from.

The planner, positions, admission control, the stream and batch readers, the tasks and the CLI's
group commands ask a :class:`Backend`, never a store folder or a broker directly:

* **queues**: topics and their queues (by name, by pattern, or named one by one);
* **offsets**: per queue the min offset (first readable) and max offset (next to be written), so a
  queue holds ``[min, max)``; the first offset stored at or after a timestamp; the byte size of the
  messages of a range (for ``maxBytesPerTrigger``);
* **messages**: a queue range ``[start, end)`` read with a subscription into Arrow record batches of
  :data:`rmq_source.schema.ARROW_SCHEMA`, reporting what cannot be read through callbacks;
* **group state**: the consumer group's offset store, the query's session in its group (membership,
  allocation, locks, batch plans) and the task-side lock check of ordered consumption.

A backend is built on the driver from the options (:func:`rmq_source.spark.query.open_backend`).
Tasks receive its :class:`BackendSpec`, a small picklable description, and open it in their own
process (:meth:`BackendSpec.open`, one backend per spec and process).
"""
from __future__ import annotations

import abc
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping, NamedTuple

import pyarrow as pa

from rmq_source.errors import RmqUnknownTopicError
from rmq_source.group.allocation import MessageQueue, sort_queues

#: Called with (first_lost_offset, first_readable_offset) when retention removed messages of a
#: range being read.
DataLossCallback = Callable[[int, int], None]
#: Called with (first_unread_offset, end, reason) when a planned range cannot be read to its end.
ShortReadCallback = Callable[[int, int, str], None]


class RangeRead(NamedTuple):
    """One range of :meth:`Backend.read_many`: offsets ``[start, end)`` of ``mq`` and its callbacks."""

    mq: MessageQueue
    start: int
    end: int
    on_data_loss: DataLossCallback
    on_short_read: ShortReadCallback


class QueueInfo(NamedTuple):
    """One queue of one topic: it holds offsets ``[min_offset, max_offset)``; ``max_offset`` is
    the next offset to be written. (A tuple: a planning makes one per queue every batch.)"""

    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    #: live mode: the slave that answered while its master was away (None: the master, or a
    #: store). A slave's offsets are what it holds: it does not decide that offsets below its
    #: min were deleted, nor that a queue ended or was re-created below the master's max.
    slave: str | None = None


@dataclass(frozen=True)
class TaskLock:
    """Ordered mode: a task must find ``client_id`` holding the locks of its queues in ``group``,
    renewed within ``client_lease_ms``, before it reads."""

    group: str
    client_id: str
    client_lease_ms: int
    #: when the driver asked the brokers for the batch's locks (ms since the epoch; 0: unknown). A
    #: broker whose master is away grants and takes no locks: its queues are read under that
    #: grant for ``client_lease_ms`` (as RocketMQ's orderly consumers go on for 30 s), then wait.
    locked_at_ms: int = 0


class BackendSpec(abc.ABC):
    """A picklable description of a backend, carried by Spark's input partitions."""

    @abc.abstractmethod
    def open(self) -> "Backend":
        """The backend this spec describes, shared by everything in this process."""


class Backend(abc.ABC):
    """What the Spark side and the CLI's group commands ask of a message source (module doc)."""

    #: The description tasks receive to open this backend in their own process.
    spec: BackendSpec
    #: What one more queue costs a task beyond its messages (finding it, its first read, the
    #: bookkeeping of its range), as bytes of rows: the task sizing adds it to every range's
    #: weight. None: the planner's default (:data:`rmq_source.spark.planner.QUEUE_COST_BYTES`).
    queue_cost_bytes: int | None = None

    # -- queues --------------------------------------------------------------------------------
    @abc.abstractmethod
    def topics(self) -> dict[str, list[str]]:
        """Topic -> names of the brokers that hold it."""

    @abc.abstractmethod
    def queue_ids(self, topic: str, broker_name: str) -> list[int]:
        """Queue ids of ``topic`` on ``broker_name`` (empty when the broker does not hold it)."""

    @abc.abstractmethod
    def where(self) -> str:
        """Where topics are looked for, for messages: ``any store (broker-a=/data/a)``."""

    def _queues_of(self, topic: str, brokers: Iterable[str]) -> list[MessageQueue]:
        return [MessageQueue.of(topic, b, q) for b in brokers for q in self.queue_ids(topic, b)]

    def queues_for_topics(self, topics: Iterable[str]) -> list[MessageQueue]:
        """Every queue of the named topics on every broker; a topic found nowhere is an error."""
        known = self.topics()
        out: list[MessageQueue] = []
        for topic in topics:
            if topic not in known:
                raise RmqUnknownTopicError(
                    f"option topic: {topic!r} is not in {self.where()}; "
                    f"topics found: {', '.join(sorted(known)) or 'none'}")
            out.extend(self._queues_of(topic, known[topic]))
        return sort_queues(out)

    def queues_for_pattern(self, pattern: re.Pattern) -> list[MessageQueue]:
        """Queues of every topic whose whole name matches ``pattern`` (may be empty)."""
        out: list[MessageQueue] = []
        for topic, brokers in self.topics().items():
            if pattern.fullmatch(topic):
                out.extend(self._queues_of(topic, brokers))
        return sort_queues(out)

    def queues_for_assign(self, assign: Mapping[str, Mapping[str, Iterable[int]]]) -> list[MessageQueue]:
        """The queues named by ``assign`` ({topic: {broker: [queueIds]}}); each must exist."""
        out: list[MessageQueue] = []
        for topic, brokers in assign.items():
            for broker, qids in brokers.items():
                self.check_broker(broker)
                existing = set(self.queue_ids(topic, broker))
                for qid in qids:
                    if qid not in existing:
                        raise RmqUnknownTopicError(
                            f"option assign: queue {qid} of topic {topic!r} does not exist on broker "
                            f"{broker!r} (queues: {sorted(existing)})")
                    out.append(MessageQueue(topic, broker, qid))
        return sorted(set(out))

    def check_broker(self, broker_name: str) -> None:
        """Raise RmqUnknownTopicError when ``broker_name`` is not a broker of this backend."""

    # -- offsets -------------------------------------------------------------------------------
    @abc.abstractmethod
    def infos(self, mqs: Iterable[MessageQueue]) -> dict[MessageQueue, QueueInfo]:
        """Min and max offset of every queue, asked together (one listing or round trip per
        broker and topic, not one per queue)."""

    def info(self, mq: MessageQueue) -> QueueInfo:
        return self.infos([mq])[mq]

    def infos_reachable(self, mqs: Iterable[MessageQueue]
                        ) -> tuple[dict[MessageQueue, QueueInfo], dict[str, Exception]]:
        """(:meth:`infos` of the queues whose broker answers, {broker name: why it does not} for
        the others). A store always answers; a live cluster's broker may be away."""
        return self.infos(mqs), {}

    def away_for(self, broker_name: str) -> float | None:
        """Seconds since ``broker_name`` stopped answering (None: it answers). A store always
        answers."""
        return None

    def each_broker(self, fn, work: Mapping[str, object]) -> dict[str, object]:
        """{broker: fn(broker, its work)}; an exception of ``fn`` is raised. One broker after the
        other here; a live cluster asks its brokers side by side."""
        return {broker: fn(broker, w) for broker, w in work.items()}

    @abc.abstractmethod
    def offset_for_timestamp(self, mq: MessageQueue, timestamp_ms: int, *,
                             info: QueueInfo | None = None) -> int:
        """The first offset whose message was stored at or after ``timestamp_ms`` (the max offset
        when there is none). ``info``: the queue's min/max offsets when the caller has them
        (a backend that needs them need not ask again)."""

    @abc.abstractmethod
    def unit_sizes(self, mq: MessageQueue, start: int, end: int):
        """CommitLog record sizes of the messages at offsets ``start``, ``start + 1``, ... (numpy
        int64 array, at most ``end - start`` long; shorter when the queue ends first)."""

    # -- messages ------------------------------------------------------------------------------
    @abc.abstractmethod
    def read(self, mq: MessageQueue, start: int, end: int, *, subscription: str, batch_rows: int,
             batch_bytes: int, verify_crc: bool, on_data_loss: DataLossCallback,
             on_short_read: ShortReadCallback, columns: tuple[str, ...] | None = None) -> Iterator:
        """Arrow record batches of the messages at offsets ``[start, end)`` of ``mq`` that match
        ``subscription``, in offset order. Messages removed before they were read are reported
        through ``on_data_loss``; a range that ends short of ``end`` (queue shorter or gone)
        through ``on_short_read``. Nothing is skipped silently. ``columns``: the columns the
        caller uses (None: all); the batches keep the full row schema, others may come empty
        or null (:func:`rmq_source.store.native.skip_bits`)."""

    def check_subscription(self, subscription, mqs: Iterable[MessageQueue]) -> None:
        """Raise RmqOptionError when a broker of ``mqs`` would not evaluate ``subscription`` as
        the query does (the store mode evaluates everything itself: nothing to check)."""

    def read_many(self, ranges: Iterable[RangeRead], *, subscription, batch_rows: int,
                  batch_bytes: int, verify_crc: bool, columns: tuple[str, ...] | None = None
                  ) -> Iterator:
        """:meth:`read` of each range in turn, rows in range order, the batches of small ranges
        joined (:func:`coalesce`; a backend may join them its own way, within ``batch_rows``
        and ``batch_bytes``)."""
        return coalesce((batch for r in ranges for batch in self.read(
            r.mq, r.start, r.end, subscription=subscription, batch_rows=batch_rows,
            batch_bytes=batch_bytes, verify_crc=verify_crc, on_data_loss=r.on_data_loss,
            on_short_read=r.on_short_read, columns=columns)), batch_rows, batch_bytes)

    # -- group state ---------------------------------------------------------------------------
    @abc.abstractmethod
    def offset_store(self, group: str):
        """The consumer group's offset store (shaped like RocketMQ's OffsetStore: read, update,
        persist)."""

    @abc.abstractmethod
    def group_session(self, opts, strategy, offset_store):
        """The query's session in its group (membership, allocation, locks, batch plans); see
        :class:`rmq_source.group.session.GroupSession`."""

    def retry_queues(self, group: str) -> list[MessageQueue]:
        """The queues of ``group``'s retry topic that a streaming member must read besides its
        topics (:mod:`rmq_source.group.retry`): none in store mode, whose groups are this
        package's own and send nothing back."""
        return []

    @abc.abstractmethod
    def group_topics(self, group: str) -> set[str]:
        """Topics ``group`` has recorded progress for."""

    @abc.abstractmethod
    def group_users(self, group: str) -> tuple[list[str], dict[str, str]]:
        """(live member client ids, {"topic/broker/queueId": holder} of unexpired queue locks)."""

    @abc.abstractmethod
    def check_task_locks(self, lock: TaskLock, mqs: Iterable[MessageQueue]) -> set[MessageQueue]:
        """The queues of ``mqs`` a task of ``lock.client_id`` may read now. A store's lock table
        raises RmqLockError for any lock not held (or held past its client lease); a live broker
        that refuses a lock (another member holds the queue) leaves that queue out."""


def coalesce(batches: Iterator[pa.RecordBatch], max_rows: int, max_bytes: int) -> Iterator[pa.RecordBatch]:
    """``batches`` with consecutive small ones joined: each output holds at most ``max_rows`` rows
    and ``max_bytes`` bytes of buffers (a slice counts its whole buffers) unless one input alone is
    larger (passed through as it is); rows keep their order. Joining copies, so only batches under
    an eighth of either limit are held back for it, and a full join goes out at once."""
    return (_joined(group) for group in join_groups(batches, max_rows, max_bytes))


def join_groups(items: Iterable, max_rows: int, max_bytes: int, *, batch_of=lambda item: item,
                key=None) -> Iterator[list]:
    """Consecutive ``items`` (``batch_of(item)`` is an item's Arrow batch; those without rows are
    left out) grouped in order for :func:`coalesce`'s joins: a group holds at most ``max_rows``
    rows and ``max_bytes`` bytes of buffers, an item of an eighth of either or more is a group of
    its own (joining copies: a live read decodes its answers 16 MiB at a time, not worth a copy
    to make batches of 64 MiB), a group that reaches ``max_rows`` or half of ``max_bytes`` ends;
    with ``key``, a group's items share ``key(item)``."""
    held: list = []
    rows = size = 0
    last = None
    for item in items:
        batch = batch_of(item)
        n, b = batch.num_rows, batch.get_total_buffer_size()
        if not n:
            continue
        alone = n * 8 >= max_rows or b * 8 >= max_bytes
        kind = key(item) if key is not None else None
        if held and (alone or kind != last or rows + n > max_rows or size + b > max_bytes):
            yield held
            held, rows, size = [], 0, 0
        held.append(item)
        last, rows, size = kind, rows + n, size + b
        if alone or rows >= max_rows or size >= max_bytes // 2:
            yield held
            held, rows, size = [], 0, 0
    if held:
        yield held


def _joined(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)
