"""A consumer group's offsets on the brokers, as RocketMQ's RemoteBrokerOffsetStore keeps them.

The memory table and its API are :class:`~rmq_source.group.offset_store.OffsetTable`'s; reads ask
the broker of each queue (QUERY_CONSUMER_OFFSET; a queue the broker has no offset for is "no
progress", -1, not offset 0) and :meth:`persist` writes each entry to its broker
(UPDATE_CONSUMER_OFFSET). The broker keeps them in its ``config/consumerOffset.json``, where
``mqadmin consumerProgress`` and every other client of the group see them.

Questions about many queues of a topic (a group query's planning asks about every queue each
micro-batch) are asked with GET_CONSUME_STATS, what ``mqadmin consumerProgress`` asks: one request
answers every queue of the topic on a broker. It answers 0 both for offset 0 and for no offset, so
a caller says which queues that difference does not matter for (``zero_will_do``); the others, and
every queue where it cannot be asked (a Proxy, an account without the Get right on 5.x), are asked
one by one, those of a broker going to its master one after another without waiting for each
answer (``WINDOW`` in flight): a thousand queues cost about one round trip, not a thousand. Writes
go the same way. Whatever goes wrong there (no master listed, a broker away, an error answer) sends
the queues not yet answered the one-at-a-time way, with its retries, its slave fallback and its
errors.
"""
from __future__ import annotations

import contextlib
import logging
from collections import deque
from typing import Callable, Iterable, Mapping

from rmq_source.errors import (RmqAuthError, RmqBrokerError, RmqBrokerUnavailableError, RmqMasterAwayError,
                               RmqRemotingConnectionError, RmqRemotingError,
                               RmqRemotingProtocolError, RmqRemotingTimeoutError)
from rmq_source.group.allocation import MessageQueue
from rmq_source.group.offset_store import OffsetTable
from rmq_source.remote import requests as rq
from rmq_source.remote.client import RemotingClient


log = logging.getLogger(__name__)

#: what a master answers a group commit for a group or topic it has not heard of
_NOT_KNOWN_YET = (rq.SUBSCRIPTION_GROUP_NOT_EXIST, rq.TOPIC_NOT_EXIST)
#: questions or writes of one broker's queues in flight at once (module doc)
WINDOW = 32
#: queues of one topic on one broker whose offsets are asked with one GET_CONSUME_STATS
BULK_MIN = 2


class BrokerOffsetStore(OffsetTable):
    """Offsets of ``group`` kept by the brokers of ``backend`` (a ClusterBackend, whose retries
    apply). While a broker's master is away its slave is asked and written to, as RocketMQ's
    RemoteBrokerOffsetStore does; a write a slave took still raises
    :class:`~rmq_source.errors.RmqMasterAwayError` (a broker unavailable), so the caller
    keeps the entries and writes them again until the master has them: a master that comes back
    knows nothing of what its slave took, and its older offsets must not stay the group's."""

    def __init__(self, client: RemotingClient, group: str, backend):
        super().__init__(group)
        self.client = client
        self.backend = backend
        self._written_to: dict[str, str] = {}   # broker name -> the master that took the last write
        self._no_bulk: set[str] = set()          # addresses that refused GET_CONSUME_STATS
        #: inside one_look: (address, topic) -> {queue id: offset} of the look taken there
        self._looked: dict[tuple[str, str], dict[int, int]] | None = None

    def __getstate__(self) -> dict:
        raise TypeError("a BrokerOffsetStore holds connections; tasks receive a BackendSpec instead")

    def __repr__(self) -> str:
        return f"BrokerOffsetStore(group={self.group!r})"

    @contextlib.contextmanager
    def one_look(self):
        """:meth:`OffsetTable.one_look`: one GET_CONSUME_STATS per broker and topic inside it; the
        commits a master took since are laid over its answer."""
        self._looked = {}
        try:
            yield
        finally:
            self._looked = None

    def _in_a_row(self, broker: str, addr: str | None, items: list, send: Callable,
                  take: Callable, min_items: int = 2, *, together: bool = False) -> dict:
        """``take(call)`` of ``send(addr, item)`` for the items of ``broker`` (``addr``: its master
        as last routed), at most ``WINDOW`` in flight, in order: {item: answer} of those answered
        before the first failure (none when no master is listed, the broker failed lately or
        there are fewer than ``min_items``). ``together``: ``send(addr, items)`` sends up to
        ``WINDOW`` items at once (one write) and returns their calls; two such windows in flight."""
        done: dict = {}
        if addr is None or self.backend.away_for(broker) is not None or len(items) < min_items:
            return done
        pending: deque = deque()
        try:
            if together:
                for i in range(0, len(items), WINDOW):
                    chunk = items[i:i + WINDOW]
                    pending.extend(zip(chunk, send(addr, chunk)))
                    while len(pending) > WINDOW:
                        first, call = pending.popleft()
                        done[first] = take(call)
            else:
                for item in items:
                    pending.append((item, send(addr, item)))
                    if len(pending) >= WINDOW:
                        first, call = pending.popleft()
                        done[first] = take(call)
            while pending:
                first, call = pending.popleft()
                done[first] = take(call)
        except RmqRemotingError:
            for _, call in pending:
                call.cancel()
        return done

    def _fetch(self, mqs: list[MessageQueue], zero_will_do=None,
               away: set[str] | None = None) -> dict[MessageQueue, int]:
        def one(broker: str, queues: list[MessageQueue]):
            try:
                return self._fetch_broker(broker, queues, zero_will_do)
            except (RmqRemotingConnectionError, RmqRemotingTimeoutError):
                if away is None:
                    raise
                return None

        found: dict[MessageQueue, int] = {}
        # (brokers asked side by side: a broker's statistics of thousands of queues take it tens
        # of milliseconds)
        for broker, part in self.backend.each_broker(one, _by_broker(mqs)).items():
            if part is None:
                away.add(broker)
            else:
                found.update(part)
        return found

    def _fetch_broker(self, broker: str, queues: list[MessageQueue], zero_will_do
                      ) -> dict[MessageQueue, int]:
        found: dict[MessageQueue, int] = {}
        master = self.backend.master_addr(broker)
        exact = []
        if zero_will_do is not None:
            bulk = self._bulk(broker, master, queues)
            for mq in queues:
                value = bulk.get(mq)
                if value is not None and (value > 0 or zero_will_do(mq)):
                    found[mq] = value
                else:
                    exact.append(mq)
        else:
            exact = queues
        answered = self._in_a_row(
            broker, master, exact,
            lambda addr, mq: rq.query_consumer_offset_call(
                self.client, addr, self.group, mq.topic, mq.queue_id, broker_name=broker),
            lambda call: rq.consumer_offset_of(self.client, call))
        for mq in exact:
            if mq in answered:
                value = answered[mq]
            else:
                value = self.backend._call(broker, lambda addr: rq.query_consumer_offset(
                    self.client, addr, self.group, mq.topic, mq.queue_id, broker_name=broker),
                    slave_ok=True)
            if value is not None and value >= 0:
                found[mq] = value
        return found

    def _bulk(self, broker: str, addr: str | None, queues: list[MessageQueue]) -> dict[MessageQueue, int]:
        """The offsets GET_CONSUME_STATS answers for ``queues`` of ``broker`` at its master
        ``addr``, per topic with at least :data:`BULK_MIN` of them (0 also for "no offset"); {}
        where the master cannot be asked now (none listed, away, refusing or not serving the
        request: a Proxy, an account without the Get right on 5.x): those are asked one by one."""
        out: dict[MessageQueue, int] = {}
        if addr is None or self.backend.away_for(broker) is not None or addr in self._no_bulk:
            return out
        by_topic: dict[str, list[MessageQueue]] = {}
        for mq in queues:
            by_topic.setdefault(mq.topic, []).append(mq)
        for topic, mqs in by_topic.items():
            if len(mqs) < BULK_MIN or not self.client.serves(addr, rq.GET_CONSUME_STATS):
                continue
            looked = self._looked
            try:
                table = looked.get((addr, topic)) if looked is not None else None
                if table is None:
                    table = rq.consume_stats(self.client, addr, self.group, topic)
                    if looked is not None:
                        looked[(addr, topic)] = table
            except RmqAuthError as exc:
                log.info("consumer group %r: %s refuses GET_CONSUME_STATS (%s): its queues' offsets "
                         "are asked one by one", self.group, addr, exc)
                self._no_bulk.add(addr)
                return out
            except RmqRemotingError:
                return out      # (the one-by-one questions retry, fall back and name errors)
            out.update((mq, table[mq.queue_id]) for mq in mqs if mq.queue_id in table)
        return out

    def _lay_over(self, addr: str, written: list[tuple[MessageQueue, int]]) -> None:
        """Writes the master at ``addr`` took, laid over the look taken there (one_look)."""
        if self._looked:
            for mq, offset in written:
                table = self._looked.get((addr, mq.topic))
                if table is not None:
                    table[mq.queue_id] = offset

    def may_have_lost(self, broker: str, written_ms: int) -> bool:
        """True when the master of ``broker`` is not the one that took the write, or started less
        than a second before ``written_ms`` or later (its ``bootTimestamp``: a restarted broker
        comes back with the offsets it last flushed, every 5 s by default; in its first second it
        cannot say, and counts as just started). False when the master does not serve the
        question (a RocketMQ 5 Proxy; an account not allowed to ask): then a different offset there
        is someone's write, and following it reads again rather than losing an operator's reset."""
        addr = self.backend.master_addr(broker)
        if addr is None or addr != self._written_to.get(broker):
            return True
        try:
            booted = self.backend._call(broker, lambda a: rq.broker_boot_ms(self.client, a))
        except RmqBrokerError as exc:
            # a Proxy does not serve the question (code 3); a broker in its first second fails
            # it (its statistics are empty: NoSuchElementException, 4.9 and 5.3): just booted
            return not (exc.code == rq.REQUEST_CODE_NOT_SUPPORTED or isinstance(exc, RmqAuthError))
        except RmqRemotingProtocolError:
            return False
        except (RmqRemotingConnectionError, RmqRemotingTimeoutError):
            return True     # (away again: cannot tell, its offsets are not read meanwhile)
        return booted >= written_ms - 1000

    def _write_broker(self, broker: str, entries: Mapping[MessageQueue, int]) -> set[MessageQueue]:
        declined: set[MessageQueue] = set()

        def write(addr, mq, offset):
            """None when the master took it, else what its slave did with it."""
            on_master = self.backend.is_master(broker, addr)
            try:
                taken = rq.update_consumer_offset(self.client, addr, self.group, mq.topic, mq.queue_id,
                                                  offset, broker_name=broker)
            except RmqBrokerError as exc:
                if on_master:
                    raise
                return f"its slave {addr} refused it too ({exc})"
            if on_master:
                self._written_to[broker] = addr
                if not taken:
                    declined.add(mq)
                else:
                    self._lay_over(addr, [(mq, offset)])
            return None if on_master else f"written to its slave {addr} meanwhile"

        on_slave = []
        ordered = sorted(entries.items(), key=lambda e: (e[0].topic, e[0].queue_id))
        master = self.backend.master_addr(broker)

        def in_a_row(items, min_items=2):
            return self._in_a_row(
                broker, master, items,
                lambda addr, entries: rq.update_consumer_offset_calls(
                    self.client, addr, self.group,
                    [(mq.topic, mq.queue_id, offset) for mq, offset in entries], broker_name=broker),
                lambda call: rq.offset_taken(self.client, call), min_items, together=True)

        # A broker records a topic@group's first offset by creating its table unlocked
        # (ConsumerOffsetManager.commitOffset, 4.9 and 5.3): first writes of one topic handled
        # side by side keep only one of them. So a topic's first entry is answered before the
        # others of the topic are sent.
        firsts = list({mq.topic: (mq, offset) for mq, offset in reversed(ordered)}.values())
        taken = in_a_row(firsts, min_items=1)
        if len(taken) == len(firsts):
            taken.update(in_a_row([e for e in ordered if e not in taken]))
        if taken:
            self._written_to[broker] = master
            declined.update(mq for (mq, _), ok in taken.items() if not ok)
            self._lay_over(master, [(mq, offset) for (mq, offset), ok in taken.items() if ok])
        for mq, offset in ordered:
            if (mq, offset) in taken:
                continue
            try:
                said = self.backend._call(broker, lambda addr: write(addr, mq, offset), slave_ok=True)
            except RmqBrokerError as exc:
                if exc.code not in _NOT_KNOWN_YET:
                    raise
                # a master that does not know the group or topic yet: one just elected before
                # its last config sync (5.x controller mode), or a 5.x broker before the group's
                # first heartbeat there (which creates the group): not taken yet, as if away
                not_yet = RmqBrokerUnavailableError(
                    f"consumer group {self.group!r}: broker {broker} does not know the group or "
                    f"topic yet ({exc.reason}); its progress is kept until it does",
                    peer=exc.peer, request=exc.request)
                not_yet.name_peer(exc.peer_role)
                raise not_yet from exc
            if said is not None:
                on_slave.append(said)
        if on_slave:
            raise RmqMasterAwayError(
                f"consumer group {self.group!r}: the master of broker {broker} is away, so the "
                f"progress of {len(on_slave)} queue(s) is not on it yet ({on_slave[0]}); kept "
                "until the master takes it")
        return declined


def _by_broker(mqs: Iterable[MessageQueue]) -> dict[str, list[MessageQueue]]:
    out: dict[str, list[MessageQueue]] = {}
    for mq in mqs:
        out.setdefault(mq.broker_name, []).append(mq)
    return out
