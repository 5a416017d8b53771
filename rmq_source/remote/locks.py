"""Queue locks of ordered consumption on the brokers (RocketMQ's RebalanceLockManager).

LOCK_BATCH_MQ takes or renews a group's queues for a client id on the broker that serves them and
answers the ones granted; UNLOCK_BATCH_MQ releases them. The broker keeps a lock for
``rocketmq.broker.rebalance.lockMaxLiveTime`` (60 s by default) after its last renewal, so a query
that died holds its queues until then, exactly as a Java orderly consumer does. The broker tells no
one who holds a queue: a refused queue is someone else's.

:class:`BrokerLockManager` has the interface of :class:`rmq_source.group.locks.QueueLockManager`
that :class:`~rmq_source.group.locks.ClientLockView`, :class:`~rmq_source.group.locks.LockRenewer`
and :class:`~rmq_source.group.session.GroupSession` use, so ordered consumption keeps RocketMQ's
three locks with the broker's as the first.

A broker that does not answer (down, restarting) refuses nothing: its queues are away, not
another member's. A restarted broker has an empty lock table, so the next renewal takes the
queues again, as RocketMQ's orderly consumers re-lock at their next rebalance.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Iterable

from rmq_source.errors import RmqAuthError, RmqBrokerUnavailableError, RmqRemotingError
from rmq_source.group.locks import _queue_fields, check_queues_given, queue_key
from rmq_source.remote import requests as rq

log = logging.getLogger(__name__)


class BrokerLockManager:
    """The locks of ``group`` on the brokers of ``backend`` (a ClusterBackend).

    ``lease_ms`` is how long a lock lives on the broker after its last renewal as this query
    assumes it (the broker's own lockMaxLiveTime must not be shorter); clients trust their locks
    for a shorter client lease and renew well within it.
    """

    def __init__(self, backend, group: str, *, lease_ms: int):
        self.backend = backend
        self.group = group
        self.lease_ms = lease_ms
        self._clock = time.time
        #: brokers whose last lock request got no answer: their queues are away, not refused
        self.away_brokers: set[str] = set()

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    @staticmethod
    def _by_broker(mqs: Iterable[Any]) -> dict[str, list[tuple[tuple[str, str, int], Any]]]:
        """{broker name: [((topic, broker, queueId), the queue as given)]}, each queue once."""
        check_queues_given(mqs)
        given = {_queue_fields(mq): mq for mq in mqs}      # (each queue once: the last as given)
        out: dict[str, list] = {}
        for fields, mq in given.items():
            out.setdefault(fields[1], []).append((fields, mq))
        return out

    def _lock(self, mqs: Iterable[Any], client_id: str, *, ride_out: bool = False) -> tuple[set, set]:
        """Lock or renew ``mqs`` for ``client_id``, one request per broker: (the inputs granted,
        the inputs of brokers that did not answer after the backend's retries; with
        ``ride_out`` after ``brokerOutageTimeoutMs`` of their absence)."""
        def ask(broker: str, pairs: list) -> tuple[set | None, Exception | None]:
            fields = [f for f, _ in pairs]
            try:
                return self.backend._call(broker, lambda addr: rq.lock_batch(
                    self.backend.client, addr, self.group, client_id, fields), ride_out=ride_out), None
            except RmqAuthError:
                raise
            except RmqRemotingError as exc:
                return None, exc

        granted, away = set(), set()
        by_broker = self._by_broker(mqs)
        # (brokers asked side by side: one that does not answer delays no other)
        for broker, (got, exc) in sorted(self.backend.each_broker(ask, by_broker).items()):
            pairs = by_broker[broker]
            if exc is not None:
                log.warning("consumer group %r: lock of %d queue(s) on broker %s: %s", self.group,
                            len(pairs), broker, exc)
                self.away_brokers.add(broker)
                away.update(mq for _, mq in pairs)
                continue
            self.away_brokers.discard(broker)
            granted.update(mq for f, mq in pairs if f in got)
        return granted, away

    def try_lock_batch(self, mqs: Iterable[Any], client_id: str) -> set:
        """Lock or renew ``mqs`` for ``client_id`` (one request per broker); the inputs granted.
        A broker that does not answer grants nothing (the others are still asked)."""
        return self._lock(mqs, client_id)[0]

    #: the brokers renew a lock by taking it again (RocketMQ's clients re-lock every 20 s)
    renew = try_lock_batch

    def unlock_batch(self, mqs: Iterable[Any], client_id: str) -> set:
        """Release ``mqs`` held by ``client_id`` (the brokers ignore queues it does not hold). A
        broker that does not answer is skipped: its locks end with their lease (or died with it)."""
        done = set()
        for broker, pairs in sorted(self._by_broker(mqs).items()):
            try:
                self.backend._call(broker, lambda addr: rq.unlock_batch(
                    self.backend.client, addr, self.group, client_id, [f for f, _ in pairs]))
            except RmqAuthError:
                raise
            except RmqRemotingError as exc:
                log.warning("consumer group %r: unlock of %d queue(s) on broker %s: %s", self.group,
                            len(pairs), broker, exc)
                continue
            done.update(mq for _, mq in pairs)
        return done

    def entry(self, mq: Any):
        """The brokers do not show lock holders: always None (a waiting client retries until the
        lease of a dead holder has run out, see GroupSession)."""
        return None

    def is_locked(self, mq: Any, client_id: str) -> bool:
        """Whether ``client_id`` holds ``mq`` (asking renews it, as any RocketMQ client check does)."""
        return bool(self.try_lock_batch([mq], client_id))

    def held_by(self, mqs: Iterable[Any], client_id: str) -> set:
        """The queues of ``mqs`` that ``client_id`` holds (one request per broker; renews them).
        Those of a broker that does not answer count as held: no one can take them there while it
        is away, and the progress this query made on them is still its own to write."""
        granted, away = self._lock(mqs, client_id)
        return granted | away

    def task_readable(self, mqs: Iterable[Any], client_id: str, trusted_until_ms: int = 0) -> set:
        """A task's check before it reads: the queues of ``mqs`` whose broker grants ``client_id``
        their lock (renewing the driver's locks is what the driver does anyway).

        A broker with no master in the NameServers' routes grants no locks, and no one else can
        take them there: until ``trusted_until_ms`` (the driver's grant plus its client lease)
        its queues are read under the driver's grant, as RocketMQ's orderly consumers go on under
        a lock younger than 30 s; after that they are waited for as below.

        A broker that does not answer is waited for (``brokerOutageTimeoutMs`` of its absence,
        then RmqBrokerUnavailableError: the batch's offsets are logged, its queues cannot be
        left out); once back it grants the locks again. A queue the broker refuses is held by
        another client: the task leaves it out, as in a rebalance (that member reads it from the
        group's progress, and the driver does not commit it for this batch, see
        :meth:`GroupSession.held`)."""
        mqs = list(mqs)
        trusted = set()
        if self.now_ms() < trusted_until_ms:
            for broker, pairs in self._by_broker(mqs).items():
                if self.backend.master_away(broker):
                    log.info("consumer group %r: broker %s has no master now; this task reads its "
                             "%d queue(s) under the lock the driver was granted, trusted for %d "
                             "ms more", self.group, broker, len(pairs),
                             trusted_until_ms - self.now_ms())
                    trusted.update(mq for _, mq in pairs)
        granted, away = self._lock([mq for mq in mqs if mq not in trusted], client_id, ride_out=True)
        granted |= trusted
        if away:
            queues = ", ".join(sorted(queue_key(mq) for mq in away))
            raise RmqBrokerUnavailableError(
                f"consumer group {self.group!r}: the broker of {queues} did not answer for "
                "brokerOutageTimeoutMs, so this task cannot lock the queues it must read (the "
                "batch's offsets are logged: it is read once the broker is back)")
        refused = [queue_key(mq) for mq in mqs if mq not in granted]
        if refused:
            log.warning("consumer group %r: the broker grants client %r no lock of %s: another "
                        "member holds it (it took the queue while this query's lock was lost, e.g. "
                        "across a broker restart); this task leaves it to that member, which reads "
                        "it from the group's progress", self.group, client_id, ", ".join(refused))
        return granted

