"""A streaming query as a consumer of its group on the brokers (RocketMQ's own membership).

The query heartbeats (HEART_BEAT) to the master of every broker that serves its topics (to a
slave while the master is away, as RocketMQ's clients heartbeat every node), as a clustering
consumer with its subscription, over connections of its own (a broker knows a consumer
by its connection: two members sharing one would replace each other there): the brokers list
it among the group's consumers (GET_CONSUMER_LIST_BY_GROUP) beside Java consumers of the same
group, and every member allocates the queues with the same strategy over the same sorted lists.
A member leaves with UNREGISTER_CLIENT; one that dies leaves when its connections close (or after
the broker's channel expiry, about two minutes, when its host vanished).

Heartbeats and consumer lists go once per address, not per broker name: through a RocketMQ 5
Proxy every broker has the Proxy's address, and the Proxy keeps the group's members itself (for
all its brokers; the brokers behind it never hear of them), so one heartbeat and one list there
are the whole group as the Proxy knows it. A Proxy answers the list of a group it has no member
of with an error, taken as the empty list (:func:`~rmq_source.remote.requests.consumer_list`).

It has the interface :class:`rmq_source.group.session.GroupSession` uses of the file-based
:class:`rmq_source.group.membership.GroupMembership`.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Iterable

from rmq_source.errors import RmqAuthError, RmqRemotingConnectionError, RmqRemotingError
from rmq_source.group.membership import java_sorted
from rmq_source.remote import requests as rq
from rmq_source.remote.client import RemotingClient

log = logging.getLogger(__name__)


class BrokerMembership:
    """``client_id`` in ``group`` on the brokers of ``backend`` (a ClusterBackend)."""

    def __init__(self, backend, group: str, client_id: str, *, subscription: str,
                 consume_from_where: str, heartbeat_timeout_ms: int, expression_type: str = "TAG"):
        self.backend = backend
        self.group = group
        self.client_id = client_id
        self.subscription = subscription
        self.expression_type = expression_type
        self.consume_from_where = consume_from_where
        #: how long a member that stopped heartbeating may still hold queues (the session's bound
        #: of waits; the brokers themselves expire a silent channel after about 120 s)
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.topics: tuple[str, ...] = ()
        self._joined: set[str] = set()     # names of the brokers heartbeated to (through their address)
        self.client = RemotingClient(timeout=backend.spec.timeout_s,
                                     credentials=backend.spec.credentials, tls=backend.spec.tls)

    @staticmethod
    def now_ms() -> int:
        return int(time.time() * 1000)

    def subscribe(self, topics: Iterable[str]) -> None:
        """The topics the query reads now (its heartbeats name them)."""
        self.topics = tuple(sorted(set(topics)))

    def _brokers(self) -> list[str]:
        """Names of the brokers serving the topics (routes asked again each time, so a broker
        added is joined at the next heartbeat)."""
        names = set()
        for topic in self.topics:
            names.update(self.backend.route(topic).nodes())
        return sorted(names)

    def heartbeat(self) -> list[str]:
        """Heartbeat to every broker of the topics, side by side; the group's consumers they list,
        Java-sorted (this client included). A broker down is waited for with the backend's
        retries; one that stays down is skipped (its queues are then not readable either) unless
        none answers."""
        listed: dict[str, list[str]] = {}      # address -> its consumer list, this round
        per_addr: dict[str, threading.Lock] = {}
        guard = threading.Lock()

        def at(addr):   # (once per address: the broker names behind a Proxy share one)
            with guard:
                lock = per_addr.setdefault(addr, threading.Lock())
            with lock:
                if addr not in listed:
                    rq.heartbeat(self.client, addr, self.client_id,
                                 consumer_groups={self.group: list(self.topics)},
                                 subscription=self.subscription,
                                 expression_type=self.expression_type,
                                 consume_from_where=self.consume_from_where)
                    listed[addr] = rq.consumer_list(self.client, addr, self.group)
                return listed[addr]

        def beat(name, _):
            try:
                cids = self.backend._call(name, at, slave_ok=True)
            except RmqAuthError:
                raise            # an ACL refusal is not a broker being down
            except RmqRemotingError as exc:
                return exc
            self._joined.add(name)
            return cids

        answered, errors, cids = 0, [], set()
        for name, got in self.backend.each_broker(beat, dict.fromkeys(self._brokers())).items():
            if isinstance(got, RmqRemotingError):
                errors.append(f"{name}: {got}")
            else:
                cids.update(got)
                answered += 1
        if errors and not answered:
            raise RmqRemotingConnectionError(
                f"consumer group {self.group!r}: no broker took the heartbeat of "
                f"{self.client_id!r}: " + "; ".join(errors))
        if errors:
            log.warning("consumer group %r: heartbeat of %r missed brokers: %s", self.group,
                        self.client_id, "; ".join(errors))
        return java_sorted(cids | {self.client_id})

    def members(self) -> dict[str, int]:
        """The group's consumers as the brokers list them now. The brokers keep no heartbeat
        times: every listed member counts as heard from now (a dead one is gone from the list)."""
        now = self.now_ms()
        cids = set()
        listed: dict[str, list[str]] = {}      # address -> its consumer list
        for name in self._brokers():
            def ask(addr):
                if addr not in listed:
                    listed[addr] = rq.consumer_list(self.client, addr, self.group)
                return listed[addr]
            try:
                cids.update(self.backend._call(name, ask, slave_ok=True))
            except RmqRemotingError as exc:
                log.warning("consumer group %r: consumer list of broker %s: %s", self.group, name, exc)
        return {cid: now for cid in cids}

    def live_clients(self) -> list[str]:
        return java_sorted(self.members())

    def leave(self) -> None:
        """Unregister from every broker joined (best effort, no retries), then close the
        member's connections (which a broker takes as leaving too); a later heartbeat reconnects."""
        left: set[str] = set()
        for name in sorted(self._joined):
            try:
                addr = self.backend.broker_addr(name)
                if addr in left:
                    continue
                left.add(addr)
                rq.unregister_consumer(self.client, addr, self.client_id, self.group)
            except RmqRemotingError as exc:
                log.info("consumer group %r: unregister from broker %s: %s", self.group, name, exc)
        self._joined.clear()
        self.client.close()
