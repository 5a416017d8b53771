"""The live-cluster backend: queues, offsets and messages from RocketMQ brokers over the network.

Routes come from the NameServers (``namesrvAddr``, tried in order until one answers); every
question about a queue goes to the master of its broker:

* queues: the topic's route (GET_ROUTEINFO_BY_TOPIC); a broker's readable queues are
  ``0 .. readQueueNums-1`` when its permission allows reading;
* min/max offsets: one GET_TOPIC_STATS_INFO per broker and topic (not one round trip per queue);
  where an address does not serve it (a RocketMQ 5 Proxy), GET_MIN_OFFSET and GET_MAX_OFFSET of
  every queue, all in flight at once (what RocketMQ's Java client asks);
* offset by time: SEARCH_OFFSET_BY_TIMESTAMP;
* messages: PULL_MESSAGE with the subscription; the answer's CommitLog records are decoded by the
  C core (:func:`rmq_source.store.native.decode_records`) into the same columns as the store mode.
  With the subscription ``*`` several pulls of one range are in flight at once. Pulls run in the
  C core too (:mod:`.native_pull`: requests sent and answers read and joined with no Python per
  answer) unless requests are ACL-signed; any failure there goes on in the Python client, whose
  retries then apply.
* group offsets: on the brokers (:class:`~rmq_source.remote.offset_store.BrokerOffsetStore`).

Every request about a broker's queues names the broker (``bname``, :mod:`.requests`), so
``namesrvAddr`` may be a RocketMQ 5 Proxy's remoting port: its routes give itself as every
broker and it forwards each request to the broker named. What an address does not serve
(answered code 3 once, :meth:`RemotingClient.serves`) is not asked again: topic statistics are
asked per queue there, a broker's master is looked up in the route of the topic named after it
instead of the cluster info, and listing topics (``topicPattern``, ``rmq-store topics``) is
refused with what to do instead (docs/semantics.md, "Through a RocketMQ 5 Proxy").

While a broker's master is away (not in the NameServers' routes, or it just failed), what a slave
may answer is asked of its slave (``_call(slave_ok=True)``); a slave's answers decide less than
its master's (docs/semantics.md, "A master that dies while its slave runs").

A pull answered "offset moved" below the queue's min offset reports the exact messages lost
(``on_data_loss``); a queue that ends before the planned end reports it (``on_short_read``).
"""
from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping

import numpy as np

from rmq_source.backend import Backend, BackendSpec, QueueInfo, TaskLock
from rmq_source.errors import (RmqAuthError, RmqBrokerError, RmqBrokerUnavailableError,
                               RmqMasterAwayError, RmqOptionError,
                               RmqRemotingConnectionError, RmqRemotingError, RmqRemotingProtocolError,
                               RmqRemotingTimeoutError, RmqUnknownTopicError)
from rmq_source.group.allocation import MessageQueue, sort_queues
from rmq_source.group.retry import is_retry_topic, retry_topic
from rmq_source.remote import native_pull, read_ahead
from rmq_source.remote import requests as rq
from rmq_source.remote.acl import Credentials
from rmq_source.remote.proxy import is_proxy_addr
from rmq_source.remote.timestamps import first_at_or_after
from rmq_source.remote.tls import TlsConfig
from rmq_source.remote.client import RemotingClient, ask_namesrvs, auth_error, check, is_auth_failure
from rmq_source.sql92 import compile_selector
from rmq_source.sql92.nodes import string_tests
from rmq_source.subscription import Subscription

PERM_READ = 4
PULL_BATCH = 32          # messages per pull: the broker's default cap (maxTransferCountOnMessageInMemory)
PULLS_IN_FLIGHT = 8      # pulls of one queue unanswered at once (a direct broker; bench_pull_size)
UNPIPED_S = 300.0        # pulls one at a time this long to an address that left one unanswered
MAX_BACKOFF_S = 8.0
OUTAGE_POLL_S = 2.0     # a task waiting for a broker away beyond the retries asks this often
OUTAGE_LOG_S = 15.0     # and says so this often
NO_MASTER_RECHECK_S = 1.0
COALESCE_BYTES = 16 << 20     # pull answers decoded together, at most
FANOUT_THREADS = 8            # brokers asked side by side (each_broker)
FIRSTS_MAX = 64               # first pulls of small ranges sent together, at most (read_many)
_TEMPLATES_KEPT = 1 << 16     # pull templates kept (one per queue and subscription read)
_NO_TEMPLATE = object()
PULL_GROUP = "rmq_source_reader"   # pulls without consumerGroup name it; the subscription travels in each request
_MAX_RETRIES = 5
#: errors that say the broker is not there (as opposed to an answer refusing the request)
_UNREACHABLE = (RmqRemotingConnectionError, RmqRemotingTimeoutError)

log = logging.getLogger(__name__)
#: what :meth:`ClusterBackend._if_served` returns for a request the address does not serve
_NOT_SERVED = object()


def _cancel(ahead: deque) -> None:
    while ahead:
        call = ahead.popleft()[2]
        if call is not None:
            call.cancel()


def next_pull_size(size: int, full_run: int, covered: int, asked: int, largest: int
                   ) -> tuple[int, int]:
    """(pull size, full answers in a row) after an answer that covered ``covered`` of the
    ``asked`` offsets: the C pull loop's own rule (rmq_next_pull_size, rmq_core.h), so the
    Python pulls adapt as it does. A short answer (a broker answers at most its transfer caps)
    makes the next pulls ask what it covered; RMQ_PULL_GROW_AFTER full answers in a row double
    the size back, up to ``largest``."""
    from rmq_source._native import ffi, lib
    state = ffi.new("int32_t[2]", [size, full_run])
    lib.rmq_next_pull_size(state, covered, asked, largest)
    return state[0], state[1]


def _explain_filter_refusal(pulls, mq: MessageQueue):
    """``pulls``, with the answer of a broker that does not filter by SQL92 made an error that
    says what to change."""
    try:
        yield from pulls
    except RmqBrokerError as exc:
        if "does not support consumer to filter message by" not in (exc.remark or ""):
            raise
        raise RmqBrokerError(
            f"broker {mq.broker_name} does not filter messages by SQL92 (it answered code {exc.code}: "
            f"{exc.remark}): set enablePropertyFilter=true in its broker configuration and restart "
            "it, or select by tags (expressionType=TAG)", code=exc.code, remark=exc.remark,
            peer=exc.peer, request=exc.request) from None


#: MQVersion.Version.V5_1_3.ordinal(): the first broker whose SQL92 filter has CONTAINS,
#: STARTSWITH and ENDSWITH (4.9.7 answers 407, 5.3.3 479)
_STRING_TESTS_SINCE = 439

_BACKENDS: dict["ClusterBackendSpec", "ClusterBackend"] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class ClusterBackendSpec(BackendSpec):
    """NameServer addresses (in the order tried), the request timeout in seconds and the ACL
    credentials (their repr hides the secret key)."""

    namesrv_addrs: tuple[str, ...]
    timeout_s: float = 10.0
    pulls_in_flight: int = PULLS_IN_FLIGHT
    #: a request that finds its broker unreachable, timing out or busy is tried again this many
    #: times, the route asked again and the wait doubling from ``retry_backoff_s`` (capped)
    retries: int = 5
    retry_backoff_s: float = 0.5
    #: how long a broker may stay away (unreachable, or without a master in the NameServers'
    #: view) before a task's pulls and lock checks give up on it, counted from the first failed
    #: try; the driver's planning waits for it as long (see the stream reader)
    outage_s: float = 180.0
    credentials: Credentials | None = None
    #: TLS to every server (:mod:`.tls`), None: plain connections
    tls: TlsConfig | None = None
    #: the consumer group pulls name (the query's consumerGroup when it has one): brokers with ACL
    #: check the account's permission on it, brokers without auto-created groups need it to exist
    pull_group: str = PULL_GROUP
    #: messages asked per pull (option pullBatchSize); the broker answers at most its own caps
    pull_batch: int = PULL_BATCH
    #: pulls run by the C core (:mod:`.native_pull`) when requests are not signed; False: every
    #: pull through the Python client (the two give the same answers: tests compare them)
    native_pulls: bool = True

    def open(self) -> "ClusterBackend":
        with _LOCK:
            backend = _BACKENDS.get(self)
            if backend is None:
                backend = _BACKENDS[self] = ClusterBackend(self)
            return backend


class ClusterBackend(Backend):
    """A RocketMQ cluster reached through its NameServers (module doc)."""

    def __init__(self, spec: ClusterBackendSpec):
        self.spec = spec
        self.client = RemotingClient(timeout=spec.timeout_s, credentials=spec.credentials, tls=spec.tls)
        # pulls: the waiting reader reads its answers itself (no thread switch per answer)
        self.pull_client = RemotingClient(timeout=spec.timeout_s, credentials=spec.credentials,
                                          reader_thread=False, tls=spec.tls)
        # group offsets (hundreds of commits a batch) alike; no heartbeat on it, so no server
        # requests to serve there
        self.offsets_client = RemotingClient(timeout=spec.timeout_s, credentials=spec.credentials,
                                             reader_thread=False, tls=spec.tls)
        self._masters: dict[str, str] = {}
        self._mutex = threading.Lock()
        self._down: set[str] = set()   # brokers whose last call failed after every retry
        self._down_since: dict[str, float] = {}   # broker -> first failure of its absence
        self._nodes: dict[str, dict[int, str]] = {}   # brokerName -> broker id -> address
        self._no_master_at: dict[str, float] = {}      # when the NameServers last listed no master
        self._pull_from: dict[MessageQueue, int] = {}  # the broker id the last pull answer suggested
        self._local = threading.local()                # this thread's NativePullers by address
        self._templates: dict[tuple, object] = {}      # (queue, subscription) -> pull template
        self._queues_of: dict[str, tuple] = {}         # topic -> (readable queues by broker, queues)
        self._read_ahead = None                        # threads reading small ranges ahead
        self._fanout: ThreadPoolExecutor | None = None  # threads asking brokers side by side
        self._versions: dict[tuple[str, str], int] = {}  # (address, brokerName) -> broker version
        # brokerName -> the topics asked about there (broker lookups through a Proxy)
        self._topics_of: dict[str, dict[str, None]] = {}
        # address -> until when (monotonic) its pulls go one at a time: it left one sent ahead
        # unanswered
        self._unpiped: dict[str, float] = {}
        # topic -> its last route (None: the NameServers said it does not exist), for outages
        self._routes: dict[str, rq.TopicRoute | None] = {}
        self._routes_stale: set[str] = set()   # topics routed from _routes now (warned)

    # -- NameServer ----------------------------------------------------------------------------
    def _ask_namesrv(self, what: str, call):
        """``call(addr)`` on the first NameServer that answers; every address tried is named."""
        return ask_namesrvs(self.spec.namesrv_addrs, what, call)

    def _if_served(self, addr: str, code: int, ask, instead: str | None = None):
        """``ask()``, or :data:`_NOT_SERVED` when ``addr`` does not serve request ``code``: it
        answered it with REQUEST_CODE_NOT_SUPPORTED now or before (:meth:`RemotingClient.serves`;
        a 5.x Proxy's remoting port). ``instead`` (what is done there instead) is logged the
        first time."""
        if not self.client.serves(addr, code):
            return _NOT_SERVED
        try:
            return ask()
        except RmqBrokerError as exc:
            if exc.code != rq.REQUEST_CODE_NOT_SUPPORTED:
                raise
            if instead:
                log.info("%s does not serve %s (%s): %s", addr, exc.request or code, exc.reason, instead)
            return _NOT_SERVED

    def route(self, topic: str) -> rq.TopicRoute:
        """``topic``'s route as the NameServers give it now. While none answers (restarting; a
        Proxy restarting), or when they no longer route a topic they routed before (its only
        broker restarting: a NameServer drops a broker's routes when its connection closes), the
        last route this backend was given stands in, as RocketMQ's clients keep theirs: a
        planning goes on with it (warned once; its brokers' absence is decided where they are
        asked); with no earlier route the NameServers' error is raised."""
        unknown = (f"option topic: {topic!r} is not in {self.where()}; the NameServer has no "
                   "route for it")
        try:
            route = self._ask_namesrv(f"route of topic {topic!r}",
                                      lambda a: rq.topic_route(self.client, a, topic))
        except RmqBrokerError as exc:
            if exc.code != rq.TOPIC_NOT_EXIST:
                raise
            with self._mutex:
                last = self._routes.get(topic)
                if last is None:
                    self._routes[topic] = None
                    self._routes_stale.discard(topic)
            if last is None:
                raise RmqUnknownTopicError(unknown) from None
            return self._last_route(topic, last, "the NameServers no longer route it (its "
                                    "brokers restarting or deregistered)")
        except _UNREACHABLE as exc:
            with self._mutex:
                if topic not in self._routes:
                    raise
                last = self._routes[topic]
            if last is None:
                raise RmqUnknownTopicError(unknown) from None
            return self._last_route(topic, last, str(exc))
        masters, nodes = route.master_addrs(), route.nodes()
        with self._mutex:
            self._routes[topic] = route
            if topic in self._routes_stale:
                self._routes_stale.discard(topic)
                log.warning("route of topic %r: the NameServers answer again", topic)
            self._masters.update(masters)
            self._nodes.update(nodes)
            for name in set(nodes) - set(masters):      # routed by its slaves alone
                self._masters.pop(name, None)
                self._no_master_at[name] = time.monotonic()
        return route

    def _last_route(self, topic: str, last: rq.TopicRoute, why: str) -> rq.TopicRoute:
        with self._mutex:
            first = topic not in self._routes_stale
            self._routes_stale.add(topic)
        if first:
            log.warning("route of topic %r: %s; going on with the last route until a NameServer "
                        "routes it again", topic, why)
        return last

    def broker_addr(self, broker_name: str) -> str:
        """The master address of ``broker_name`` (from the last route; cluster info otherwise)."""
        with self._mutex:
            addr = self._masters.get(broker_name)
            # a broker without a master is asked about at most once a second (every pull of a
            # fail-over would ask otherwise)
            recent = time.monotonic() - self._no_master_at.get(broker_name, -NO_MASTER_RECHECK_S)
        if addr is None and recent < NO_MASTER_RECHECK_S:
            raise self._no_master(broker_name)
        if addr is None:
            addr, nodes = self._ask_namesrv(f"master of broker {broker_name!r}",
                                            lambda a: self._lookup_broker(a, broker_name))
            with self._mutex:
                self._nodes[broker_name] = nodes
                if addr is not None:
                    self._masters[broker_name] = addr
                else:
                    self._no_master_at[broker_name] = time.monotonic()
            if addr is None:
                raise self._no_master(broker_name)
        return addr

    def _note_topic(self, mq: MessageQueue) -> None:
        """Remember that ``mq``'s topic was asked about on its broker (see :meth:`_lookup_broker`)."""
        with self._mutex:
            self._topics_of.setdefault(mq.broker_name, {})[mq.topic] = None

    def _lookup_broker(self, namesrv: str, broker_name: str) -> tuple[str | None, dict[int, str]]:
        """(master address or None, broker id -> address) of ``broker_name`` as ``namesrv`` says
        now: its cluster info; where that is not served (a Proxy), the route of a topic asked
        about on that broker (the route a Java client asks, which an account with ACL may
        read), else of the topic named after the broker, which every broker
        registers (how a Proxy finds a broker itself)."""
        info = self._if_served(namesrv, rq.GET_BROKER_CLUSTER_INFO,
                               lambda: rq.cluster_info(self.client, namesrv),
                               "brokers are looked up in routes there")
        if info is not _NOT_SERVED:
            return info.master_addr(broker_name), info.nodes(broker_name)
        with self._mutex:
            topics = list(self._topics_of.get(broker_name, {}))
        for topic in topics:
            try:
                route = rq.topic_route(self.client, namesrv, topic)
            except RmqBrokerError:
                continue        # (gone, or not this account's): the next one, then the broker's
            if broker_name in route.nodes():
                return route.master_addrs().get(broker_name), route.nodes()[broker_name]
        try:
            route = rq.topic_route(self.client, namesrv, broker_name)
        except RmqBrokerError as exc:
            if exc.code == rq.TOPIC_NOT_EXIST:
                return None, {}
            raise
        return route.master_addrs().get(broker_name), route.nodes().get(broker_name, {})

    def _acting_addr(self, broker_name: str, master_failed: bool) -> str:
        """Where a question a slave may answer goes: the master while the NameServers list it
        and it has not just failed, else the slave with the lowest broker id (RocketMQ's
        clients pull from and commit to a slave when the route has no master). Raises what
        :meth:`broker_addr` raises when no slave is listed either."""
        try:
            master = self.broker_addr(broker_name)
        except RmqBrokerUnavailableError:
            master = None
        if master is not None and not master_failed:
            return master
        with self._mutex:
            slaves = {i: a for i, a in (self._nodes.get(broker_name) or {}).items() if i != 0}
        if slaves:
            return slaves[min(slaves)]
        return master if master is not None else self.broker_addr(broker_name)

    def master_away(self, broker_name: str) -> bool:
        """Whether the NameServers list no master for ``broker_name`` now (asked afresh: a
        cached master may be one that died). False when no NameServer answers (they may be
        restarting, or be a Proxy that is): not known to be away, the last master stays cached
        and the caller's broker calls find out for themselves."""
        with self._mutex:
            cached = self._masters.pop(broker_name, None)
        try:
            self.broker_addr(broker_name)
        except RmqBrokerUnavailableError:
            return True
        except _UNREACHABLE as exc:
            log.info("broker %s: whether it has a master is not known now (%s)", broker_name, exc)
            if cached is not None:
                with self._mutex:
                    self._masters.setdefault(broker_name, cached)
        return False

    def is_master(self, broker_name: str, addr: str) -> bool:
        """Whether ``addr`` is the master of ``broker_name`` as last routed."""
        with self._mutex:
            return self._masters.get(broker_name) == addr

    def master_addr(self, broker_name: str) -> str | None:
        """The master of ``broker_name`` as last routed (never asks)."""
        with self._mutex:
            return self._masters.get(broker_name)

    def describe(self, broker_name: str) -> str:
        """``broker_name`` with its master's address as last routed, for messages (never asks)."""
        with self._mutex:
            master = self._masters.get(broker_name)
        return f"{broker_name} (master {master})" if master else f"{broker_name} (master away)"

    def role_of(self, broker_name: str, addr: str | None) -> str:
        """``broker-a master`` / ``broker-a slave 1`` for ``addr`` as last routed (``broker-a``
        when the route does not list it), for messages."""
        with self._mutex:
            ids = [i for i, a in (self._nodes.get(broker_name) or {}).items() if a == addr]
        if not ids:
            return broker_name
        return f"{broker_name} master" if ids[0] == 0 else f"{broker_name} slave {ids[0]}"

    def _no_master(self, broker_name: str) -> RmqBrokerUnavailableError:
        with self._mutex:
            slaves = sorted((i, a) for i, a in (self._nodes.get(broker_name) or {}).items() if i != 0)
        known = ("; its slaves: " + ", ".join(f"{i} at {a}" for i, a in slaves) if slaves
                 else "; no slave of it is listed either")
        return RmqBrokerUnavailableError(f"broker {broker_name!r} has no master in {self.where()}{known}")

    def _forget(self, broker_name: str) -> None:
        with self._mutex:
            self._masters.pop(broker_name, None)

    # -- queues --------------------------------------------------------------------------------
    def where(self) -> str:
        return f"the cluster of NameServer {';'.join(self.spec.namesrv_addrs)}"

    @staticmethod
    def _readable(route: rq.TopicRoute) -> dict[str, int]:
        return {q["brokerName"]: int(q.get("readQueueNums", 0)) for q in route.queue_datas
                if int(q.get("perm", 6)) & PERM_READ}

    def topics(self) -> dict[str, list[str]]:
        out = {}
        for topic in self._topic_names("listing every topic", "name the topic (option topic; "
                                       "rmq-store topics/lag --topic T)"):
            try:
                brokers = sorted(self._readable(self.route(topic)))
            except RmqUnknownTopicError:      # deleted between the list and the route
                continue
            if brokers:
                out[topic] = brokers
        return out

    def _topic_names(self, what: str, instead: str) -> list[str]:
        """Every topic the NameServers know; a server that lists none (a 5.x Proxy's remoting
        port answers GET_ALL_TOPIC_LIST_FROM_NAMESERVER with code 3, to RocketMQ's Java clients
        too) is an :class:`RmqOptionError` saying that ``what`` needs the list and to do
        ``instead``."""
        def ask(addr):
            names = self._if_served(addr, rq.GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
                                    lambda: rq.all_topics(self.client, addr))
            if names is not _NOT_SERVED:
                return names
            raise RmqOptionError(
                f"{what} needs the topic list of the NameServers, but namesrvAddr {addr} lists no "
                "topics: it is not a NameServer (it answered GET_ALL_TOPIC_LIST_FROM_NAMESERVER with "
                "code 3, request not supported, as a RocketMQ 5 Proxy's remoting port does); "
                f"{instead}, or set namesrvAddr to the NameServers behind the Proxy")
        return self._ask_namesrv("topic list", ask)

    def queue_ids(self, topic: str, broker_name: str) -> list[int]:
        return list(range(self._readable(self.route(topic)).get(broker_name, 0)))

    def queues_for_topics(self, topics: Iterable[str]) -> list[MessageQueue]:
        out = []
        for topic in topics:
            out.extend(self._route_queues(topic, self.route(topic)))
        return sort_queues(out)

    def _route_queues(self, topic: str, route: rq.TopicRoute) -> list[MessageQueue]:
        """The readable queues of ``route``, made again only when the route changed (a planning
        of 10,000 queues asks every batch)."""
        readable = sorted(self._readable(route).items())
        kept = self._queues_of.get(topic)
        if kept is None or kept[0] != readable:
            kept = self._queues_of[topic] = (readable, [
                MessageQueue.of(topic, broker, q) for broker, n in readable for q in range(n)])
        return kept[1]

    def retry_queues(self, group: str) -> list[MessageQueue]:
        """The queues of ``%RETRY%<group>`` on the brokers; none until a broker made the topic
        (at the group's first heartbeat there)."""
        try:
            return self.queues_for_topics([retry_topic(group)])
        except RmqUnknownTopicError:
            return []

    def queues_for_pattern(self, pattern: re.Pattern) -> list[MessageQueue]:
        names = [t for t in self._topic_names(f"option topicPattern ({pattern.pattern!r})",
                                              "name the topics with option topic (comma-separated)")
                 if pattern.fullmatch(t)]
        out = []
        for topic in names:
            try:
                out.extend(self.queues_for_topics([topic]))
            except RmqUnknownTopicError:
                continue
        return sorted(out)

    def check_broker(self, broker_name: str) -> None:
        try:
            self.broker_addr(broker_name)
        except RmqBrokerUnavailableError as exc:
            raise RmqUnknownTopicError(str(exc)) from None

    # -- offsets -------------------------------------------------------------------------------
    def check_subscription(self, subscription, mqs: Iterable[MessageQueue]) -> None:
        """A SQL92 selector with CONTAINS/STARTSWITH/ENDSWITH needs RocketMQ 5.1.3 or newer on
        every broker it is sent to: an older one reads ``s CONTAINS 'b'`` as ``s``, ignores the
        rest and delivers other messages than the selector selects, which the client's recheck
        cannot bring back. A broker's version is the one its answers carry."""
        if not subscription.is_sql:
            return
        tests = string_tests(compile_selector(subscription.expression).root)
        if not tests:
            return
        first: dict[str, MessageQueue] = {}      # a queue of each broker (of a topic it has made)
        for mq in mqs:
            if mq.broker_name not in first or is_retry_topic(first[mq.broker_name].topic):
                first[mq.broker_name] = mq
        for broker, mq in sorted(first.items()):
            version = self._call(broker, lambda addr, mq=mq: self._version_of(addr, mq))
            if 0 < version < _STRING_TESTS_SINCE:
                raise RmqOptionError(
                    f"option subExpression uses {', '.join(sorted(tests))}, which RocketMQ's "
                    f"SQL92 filter knows since 5.1.3, but broker {broker} answers as version "
                    f"{version} (older): it would take {subscription.expression!r} for something "
                    "else and deliver other messages; upgrade the brokers, or write the selector "
                    "without these predicates (e.g. LIKE)")

    def _version_of(self, addr: str, mq: MessageQueue) -> int:
        """The version broker ``mq.broker_name`` answers with (asked once per address): a
        GET_MAX_OFFSET answer is the broker's own even through a Proxy, which answers for several
        brokers at one address and carries its own version in what it answers itself."""
        key = (addr, mq.broker_name)
        if key not in self._versions:
            self._versions[key] = rq.max_offset_answer(self.client, addr, mq.topic, mq.queue_id,
                                                       broker_name=mq.broker_name).version
        return self._versions[key]

    def infos(self, mqs: Iterable[MessageQueue]) -> dict[MessageQueue, QueueInfo]:
        found, down = self.infos_reachable(mqs)
        for exc in down.values():
            raise exc
        return found

    def infos_reachable(self, mqs: Iterable[MessageQueue]
                        ) -> tuple[dict[MessageQueue, QueueInfo], dict[str, Exception]]:
        """One GET_TOPIC_STATS_INFO per broker and topic (:meth:`_queue_stats`). A broker that
        stays unreachable (or
        without a master in the NameServers' view) after the retries is in the second dict with
        its error; its queues are not in the first. Neither are the queues of a group's retry
        topic on a broker that has not made it yet."""
        mqs = list(mqs)
        by_broker: dict[str, dict[str, list[MessageQueue]]] = {}
        for mq in mqs:
            by_broker.setdefault(mq.broker_name, {}).setdefault(mq.topic, []).append(mq)
        for topics in by_broker.values():
            for group in topics.values():
                self._note_topic(group[0])
        found: dict[MessageQueue, QueueInfo] = {}
        down: dict[str, Exception] = {}
        for broker, (infos, exc) in self.each_broker(self._broker_infos, by_broker).items():
            found.update(infos)
            if exc is not None:
                down[broker] = exc
        return {mq: found[mq] for mq in mqs if mq in found}, down

    def each_broker(self, fn, work: Mapping[str, object]) -> dict[str, object]:
        """{broker: fn(broker, its work)}, the brokers asked side by side (a planning waits for
        the slowest broker, not for their sum: a broker's statistics of thousands of queues take
        it tens of milliseconds); an exception is raised as the sequential loop would raise it."""
        if len(work) < 2:
            return {broker: fn(broker, w) for broker, w in work.items()}
        fanout = self._pool("_fanout", lambda: ThreadPoolExecutor(max_workers=FANOUT_THREADS,
                                                                  thread_name_prefix="rmq-brokers"))
        futures = {broker: fanout.submit(fn, broker, w) for broker, w in work.items()}
        return {broker: future.result() for broker, future in futures.items()}

    def _broker_infos(self, broker: str, topics: dict[str, list[MessageQueue]]
                      ) -> tuple[dict[MessageQueue, QueueInfo], Exception | None]:
        """:meth:`infos_reachable` of one broker's queues: (infos, the error that made it away)."""
        found: dict[MessageQueue, QueueInfo] = {}
        for topic, group in topics.items():
            try:
                addr, stats = self._call(broker, lambda addr: (addr, self._queue_stats(
                    addr, broker, topic, [mq.queue_id for mq in group])), slave_ok=True)
            except _UNREACHABLE as exc:
                return found, exc
            except RmqBrokerError as exc:
                if exc.code == rq.TOPIC_NOT_EXIST and is_retry_topic(topic):
                    # not made on this broker yet (a master elected before its config sync):
                    # the group's next heartbeat makes it; its queues wait until then
                    log.info("broker %s has no %s yet: its queues wait", broker, topic)
                    continue
                raise
            slave = None if self.is_master(broker, addr) else addr
            for mq in group:
                s = stats.get(mq.queue_id)
                found[mq] = (QueueInfo(topic, mq.queue_id, s.min_offset, s.max_offset, slave) if s is not None
                             else QueueInfo(topic, mq.queue_id, 0, 0, slave))
        return found, None

    def _queue_stats(self, addr: str, broker: str, topic: str, queue_ids: list[int]
                     ) -> dict[int, rq.QueueStats]:
        """The offsets of ``topic``'s queues on ``broker`` at ``addr``: GET_TOPIC_STATS_INFO (every
        queue in one answer) where the address serves it, else GET_MIN_OFFSET and GET_MAX_OFFSET
        per queue, pipelined; an address answering the former with code 3 (a Proxy) is asked
        the latter from then on (:meth:`RemotingClient.serves`)."""
        stats = self._if_served(addr, rq.GET_TOPIC_STATS_INFO,
                                lambda: rq.topic_stats(self.client, addr, topic),
                                "queue offsets are asked per queue there")
        if stats is not _NOT_SERVED:
            return stats
        return rq.queue_offsets(self.client, addr, topic, queue_ids, broker_name=broker)

    def offset_for_timestamp(self, mq: MessageQueue, timestamp_ms: int, *,
                             info: QueueInfo | None = None) -> int:
        """The first message stored at or after ``timestamp_ms`` (the max offset when none): the
        broker's answer, checked by pulls (:mod:`rmq_source.remote.timestamps`) within ``info``'s
        offsets (asked when not given); the answer as it is when the broker stops answering the
        checks (a broker away is not waited for here)."""
        self._note_topic(mq)
        hint = self._call(mq.broker_name, lambda addr: rq.offset_by_timestamp(
            self.client, addr, mq.topic, mq.queue_id, timestamp_ms, broker_name=mq.broker_name),
            slave_ok=True)
        try:
            info = self.infos([mq])[mq] if info is None else info
            return first_at_or_after(timestamp_ms, info.min_offset, info.max_offset, hint,
                                     lambda offset: self._store_time(mq, offset))
        except _UNREACHABLE + (RmqBrokerUnavailableError, RmqMasterAwayError) as exc:
            log.warning("%s: the broker's offset %d for timestamp %d could not be checked (%s); "
                        "taking it as it is", mq, hint, timestamp_ms, exc)
            return hint

    def _store_time(self, mq: MessageQueue, offset: int) -> int | None:
        """Message ``offset``'s store time in ms (one pull of it), None when it is gone."""
        def pull(addr):
            return rq.pull(self.pull_client, addr, self.spec.pull_group, mq.topic, mq.queue_id,
                           offset, max_nums=1, subscription="*", expression_type="TAG",
                           broker_name=mq.broker_name)

        res = self._call(mq.broker_name, pull, slave_ok=True)
        if res.code != rq.SUCCESS or not res.body:
            return None
        from rmq_source.store import native
        batch, _ = native.decode_records(res.body, where=f"pull answer of {mq} at offset {offset}",
                                         topic=mq.topic, queue_id=mq.queue_id, start=offset,
                                         end=offset + 1)
        return batch.column("storeTimestamp")[0].value // 1000 if batch.num_rows else None

    def unit_sizes(self, mq: MessageQueue, start: int, end: int):
        """The brokers tell no message sizes without the messages: pulls them (bodies included)."""
        sizes = []
        for batch in self.read(mq, start, end, subscription="*", batch_rows=1 << 16,
                               batch_bytes=1 << 26, verify_crc=False,
                               on_data_loss=lambda *_: None, on_short_read=lambda *_: None):
            sizes.extend(batch.column("storeSize").to_pylist())
        return np.asarray(sizes, dtype=np.int64)

    def _call(self, broker_name: str, fn, *, ride_out: bool = False, slave_ok: bool = False):
        """``fn(master address)``, tried again (``spec.retries`` times at most, with a doubling
        backoff) while the broker is unreachable, times out, is busy or has no master in the
        NameServers' view (a restarting broker); the master is looked up again before each try.
        Other answers (errors of the request itself, ACL refusals) are not retried.

        ``slave_ok``: a question a slave may answer (pulls, statistics, offsets by time, group
        offsets, heartbeats) goes to a slave of the broker when the NameServers list no master
        or the master failed the previous try (see :meth:`_acting_addr`); ``fn`` raises
        :class:`RmqMasterAwayError` for an answer only the master may give, which counts as no
        answer (the master is waited for as for a broker away).

        A broker whose last call failed after every try is tried once, without waiting, until it
        answers again: planning while a broker is away does not wait the whole backoff in every
        batch (:meth:`away_for` says since when). ``ride_out`` (what a task must read or check
        before it may go on: pulls of planned messages, its queue locks) goes on trying, every
        ``OUTAGE_POLL_S``, until the broker has been away ``spec.outage_s`` (a broker restart)."""
        known_down = not ride_out and broker_name in self._down
        retries = 0 if known_down else self.spec.retries
        delay = self.spec.retry_backoff_s
        started = time.monotonic()
        attempt = 0
        said_at = -OUTAGE_LOG_S        # when the wait beyond the retries was last logged
        master_failed = known_down     # the last try went to the master and failed
        while True:
            addr = None
            try:
                addr = (self._acting_addr(broker_name, master_failed) if slave_ok
                        else self.broker_addr(broker_name))
                master_failed = self.is_master(broker_name, addr)   # (until it answers)
                result = fn(addr)
            except _UNREACHABLE as exc:
                last = exc
            except RmqBrokerError as exc:
                if exc.code == rq.SYSTEM_BUSY:
                    last = exc
                elif (slave_ok and addr is not None and not isinstance(exc, RmqAuthError)
                      and not self.is_master(broker_name, addr)):
                    # e.g. a 5.3 slave that has not synced the topic's or group's config yet
                    last = RmqMasterAwayError(f"broker {broker_name}: its master is away and "
                                              f"its slave {addr} refused: {exc.reason}", peer=addr,
                                              request=exc.request)
                else:
                    exc.name_peer(self.role_of(broker_name, exc.peer))
                    raise
            else:
                self._down.discard(broker_name)
                self._down_since.pop(broker_name, None)
                return result
            last.name_peer(self.role_of(broker_name, last.peer))
            self._forget(broker_name)
            self._down_since.setdefault(broker_name, started)
            waited = time.monotonic() - started
            # beyond the retries a task asks every OUTAGE_POLL_S: it goes on soon after a restart
            pause = delay if attempt < retries else min(delay, OUTAGE_POLL_S)
            if attempt >= retries and not (ride_out and waited + pause <= self.spec.outage_s):
                break
            attempt += 1
            if attempt <= retries:
                log.warning("broker %s: %s; trying again in %.1f s (%d of %d)", broker_name, last,
                            delay, attempt, retries)
            elif waited >= said_at + OUTAGE_LOG_S:
                said_at = waited
                log.warning("broker %s away for %.0f s (%s); this task waits for it up to "
                            "brokerOutageTimeoutMs (%.0f s), asking every %.0f s", broker_name,
                            waited, last.reason, self.spec.outage_s, pause)
            time.sleep(pause)
            delay = min(delay * 2, MAX_BACKOFF_S)
        self._down.add(broker_name)
        took = time.monotonic() - started
        if isinstance(last, (RmqRemotingConnectionError, RmqRemotingTimeoutError)):
            tries = ("1 try (it did not answer the previous call's tries either)" if known_down
                     else f"{attempt + 1} tries in {took:.1f} s")
            options = ("options requestRetries, retryBackoffMs, brokerOutageTimeoutMs" if ride_out
                       else "options requestRetries, retryBackoffMs")
            gave_up = type(last)(f"broker {broker_name}: gave up after {tries} ({options}): "
                                 f"{last.reason}", peer=last.peer, request=last.request)
            gave_up.name_peer(last.peer_role)
            raise gave_up from last
        raise last

    def away_for(self, broker_name: str) -> float | None:
        """Seconds since a call to ``broker_name`` first failed in its current absence (None:
        its last call was answered)."""
        since = self._down_since.get(broker_name)
        return None if since is None else time.monotonic() - since

    # -- messages ------------------------------------------------------------------------------
    def _slave_addr(self, mq: MessageQueue) -> str | None:
        """The slave the last pull answer of ``mq`` suggested (the master suggests one when the
        messages asked are no longer in its memory and the brokers have ``slaveReadEnable``);
        None for the master. As RocketMQ's clients do, a suggested id not in the route falls
        back to the next id, then to the master."""
        which = self._pull_from.get(mq, 0)
        if which == 0:
            return None
        with self._mutex:
            nodes = self._nodes.get(mq.broker_name) or {}
        return nodes.get(which) or nodes.get(which + 1)

    def _follow(self, mq: MessageQueue, res: rq.PullResult) -> rq.PullResult:
        if res.suggest_broker_id:
            self._pull_from[mq] = res.suggest_broker_id
        else:
            self._pull_from.pop(mq, None)
        return res

    def _pull(self, mq: MessageQueue, offset: int, count: int, sub: Subscription) -> rq.PullResult:
        """One pull: from the suggested slave when there is one and it delivers messages; any
        other answer of a slave (nothing there yet, an error, no answer) is asked of the master,
        whose answers alone decide what is lost or where a queue ends."""
        expression = sub.expression if not sub.sub_all else "*"
        kind = sub.expression_type
        max_nums = max(1, min(count, self.spec.pull_batch))
        slave = self._slave_addr(mq)
        if slave is not None:
            try:
                call = rq.send_pull(self.pull_client, slave, self.spec.pull_group, mq.topic, mq.queue_id,
                                    offset, max_nums=max_nums, subscription=expression,
                                    expression_type=kind, broker_name=mq.broker_name)
            except RmqRemotingError:
                call = None
            res = self._answer(mq, offset, call, True)
            if res is not None:
                return res

        def pull(addr):
            if self.is_master(mq.broker_name, addr):
                return rq.pull(self.pull_client, addr, self.spec.pull_group, mq.topic, mq.queue_id,
                               offset, max_nums=max_nums, subscription=expression,
                               expression_type=kind, broker_name=mq.broker_name)
            # the master is away: a slave's messages are taken (all of them: read() filters by
            # tags, the caller rechecks SQL92), anything else waits for the master
            res = rq.pull(self.pull_client, addr, self.spec.pull_group, mq.topic, mq.queue_id,
                          offset, max_nums=max_nums, subscription="*", expression_type="TAG",
                          broker_name=mq.broker_name)
            if res.code != rq.SUCCESS:
                raise RmqMasterAwayError(
                    f"broker {mq.broker_name}: its master is away and its slave {addr} answered "
                    f"the pull of {mq} at offset {offset} with code {res.code} ({res.remark}); "
                    "only the master says that messages are not there", peer=addr)
            return res

        return self._follow(mq, self._call(mq.broker_name, pull, ride_out=True, slave_ok=True))

    def _send_pull(self, mq: MessageQueue, offset: int, count: int):
        """(a pull of ``*`` sent without waiting or None when it could not be sent, whether it
        went to a slave); the caller pulls an offset not sent with :meth:`_pull`, which retries."""
        slave = self._slave_addr(mq)
        from_slave = slave is not None
        try:
            addr = slave or self._acting_addr(mq.broker_name, False)
            from_slave = from_slave or not self.is_master(mq.broker_name, addr)
            return rq.send_pull(self.pull_client, addr, self.spec.pull_group, mq.topic, mq.queue_id, offset,
                                max_nums=max(1, min(count, self.spec.pull_batch)),
                                broker_name=mq.broker_name), from_slave
        except _UNREACHABLE:
            return None, from_slave

    def _answer(self, mq: MessageQueue, asked: int, call, from_slave: bool,
                in_flight: int = 1) -> rq.PullResult | None:
        """The answer of a pull sent ahead (``call``; None: it could not be sent; ``in_flight``
        were sent ahead with it), or None when it must be asked again of the master: no answer,
        busy, or (from a slave) anything but messages."""
        res = None
        try:
            if call is not None:
                res = rq.pull_result(self.pull_client, call, asked)
        except RmqRemotingError as exc:
            if isinstance(exc, RmqBrokerError) and exc.code != rq.SYSTEM_BUSY and not from_slave:
                raise                              # the master refused the request itself
            self._unanswered(call.conn.addr, in_flight, exc)
            if from_slave:
                log.info("pull of %s at offset %d from a slave failed (%s); asking the master",
                         mq, asked, exc)
        if from_slave and (res is None or res.code != rq.SUCCESS):
            self._pull_from.pop(mq, None)          # only the master says what is not there
            return None
        return None if res is None else self._follow(mq, res)

    def _pulls(self, mq: MessageQueue, start: int, end: int, sub: Subscription, max_rows: int = 1 << 16,
               max_bytes: int = COALESCE_BYTES):
        """(offset asked, PullResult) in offset order; the caller sends the offset to go on from.
        A SUCCESS result may join several answers (up to ``max_rows`` queue offsets or
        ``max_bytes`` of records): its body is their records end to end, its next_begin_offset
        the last one's. The body may be a view of the C puller's buffer (:meth:`_native_pulls`):
        valid until the caller sends, copied by whoever keeps it longer."""
        self._note_topic(mq)        # (once a read, not once a pull)
        if self.spec.native_pulls and self.spec.credentials is None:     # (TLS: in C too)
            template = self._template(mq, sub)
            if template is not None:
                return self._native_pulls(mq, start, end, sub, template, max_rows, max_bytes)
        return self._python_pulls(mq, start, end, sub)

    def _template(self, mq: MessageQueue, sub: Subscription):
        """The C core's PULL_MESSAGE template of ``mq`` and ``sub`` (:func:`native_pull.pull_template`),
        made once: a task of a thousand queues reads a few messages of each, every batch."""
        key = (mq, sub.expression, sub.expression_type, sub.sub_all)
        template = self._templates.get(key, _NO_TEMPLATE)
        if template is _NO_TEMPLATE:
            template = native_pull.pull_template(rq.pull_fields(
                self.spec.pull_group, mq.topic, mq.queue_id, 0,
                subscription=sub.expression if not sub.sub_all else "*",
                expression_type=sub.expression_type, broker_name=mq.broker_name))
            if len(self._templates) >= _TEMPLATES_KEPT:
                self._templates.clear()          # (queues of topics no longer read)
            self._templates[key] = template
        return template

    def _take_puller(self, addr: str) -> tuple[native_pull.NativePuller, bool]:
        """An idle puller of this thread for ``addr`` (reused: True) or a new one. A puller
        serves one range reader at a time: :meth:`_give_back` returns it."""
        idle = self._local.__dict__.setdefault("idle", {}).setdefault(addr, [])
        while idle:
            puller = idle.pop()
            if not puller.closed:
                return puller, True
        return native_pull.NativePuller(addr, connect_timeout=self.client.connect_timeout,
                                        tls=self.spec.tls), False

    def _give_back(self, pullers: dict) -> None:
        idle = self._local.__dict__.setdefault("idle", {})
        for addr, puller in pullers.items():
            if not puller.closed:
                idle.setdefault(addr, []).append(puller)
        pullers.clear()

    def _in_flight_to(self, addr: str | None) -> int:
        """How many pulls of ``*`` go ahead on one connection to ``addr``: ``pulls_in_flight``,
        but one at a time through a RocketMQ 5 Proxy, which drops answers it cannot write at
        once (:mod:`rmq_source.remote.proxy`): four answers of 32 1 KiB messages in flight lost
        some. One pull at a time is what RocketMQ's pull consumer sends there."""
        if addr is not None and self._proxied(addr):
            return 1
        return self.spec.pulls_in_flight

    def _proxied(self, addr: str) -> bool:
        """Whether ``addr`` is known to be a RocketMQ 5 Proxy: routed as one
        (:func:`is_proxy_addr`: a NameServer address, or the master of several brokers), an
        address that does not serve GET_TOPIC_STATS_INFO, one routed by NameServers that do not
        serve cluster info (Proxies), or one that left a pull sent ahead unanswered (learnt:
        :meth:`_unanswered`)."""
        with self._mutex:
            masters = dict(self._masters)
        return (self._unpiped.get(addr, 0.0) > time.monotonic()
                or is_proxy_addr(addr, self.spec.namesrv_addrs, masters)
                or not self.client.serves(addr, rq.GET_TOPIC_STATS_INFO)
                or not all(self.client.serves(n, rq.GET_BROKER_CLUSTER_INFO)
                           for n in self.spec.namesrv_addrs))

    def _unanswered(self, addr: str, in_flight: int, exc: BaseException) -> None:
        """A pull to ``addr`` timed out while ``in_flight`` > 1 were ahead: one at a time there
        for :data:`UNPIPED_S` (an answer dropped by a Proxy in front of the broker looks like
        this; so does a broker that stalled, which gets its pipelining back afterwards)."""
        if addr is not None and in_flight > 1 and isinstance(exc, RmqRemotingTimeoutError):
            self._unpiped[addr] = time.monotonic() + UNPIPED_S
            log.warning("%s left a pull unanswered with %d in flight (%s); pulls go there one at "
                        "a time for %.0f s (a RocketMQ 5 Proxy drops answers it cannot write at "
                        "once)", addr, in_flight, exc.reason, UNPIPED_S)

    def _native_pulls(self, mq: MessageQueue, start: int, end: int, sub: Subscription, template,
                      max_rows: int, max_bytes: int):
        """:meth:`_pulls` by the C core, from the broker :meth:`_pull` would ask (the suggested
        slave while it delivers messages, else the master). An answer that is not plain messages
        comes here and is judged as :meth:`_answer` does; a failure of the connection (or busy)
        goes on with :meth:`_python_pulls` from where the range is, which retries. A reused
        connection that fails at once (the broker closed it while idle) is made again once."""
        in_flight = min(self.spec.pulls_in_flight, native_pull.MAX_IN_FLIGHT) if sub.sub_all else 1
        broken = (RmqRemotingConnectionError, RmqRemotingTimeoutError, RmqRemotingProtocolError)
        mine: dict[str, native_pull.NativePuller] = {}
        offset = start
        try:
            while offset < end:
                expect = self._pull_from.get(mq, 0)     # the broker id the answers should suggest
                slave = self._slave_addr(mq)
                item = addr = None
                ahead = 1
                for attempt in (0, 1):
                    reused = False
                    try:
                        addr = slave or self.broker_addr(mq.broker_name)
                        reused = addr in mine
                        if not reused:
                            mine[addr], reused = self._take_puller(addr)
                        puller = mine[addr]
                        ahead = min(in_flight, self._in_flight_to(addr))
                        puller.range(template, offset, end, per_pull=self.spec.pull_batch,
                                     in_flight=max(1, ahead), timeout_s=self.spec.timeout_s,
                                     expect_suggest=expect, what=str(mq))
                        item = puller.next(max_rows, max_bytes, view=True)
                        break
                    except broken as exc:
                        mine.pop(addr, None)
                        self._unanswered(addr, ahead, exc)
                        if attempt == 0 and reused and not isinstance(exc, RmqRemotingTimeoutError):
                            continue
                        if slave is not None:
                            self._pull_from.pop(mq, None)
                            item = False
                            break
                        log.info("pulls of %s by the C core failed (%s); going on in Python", mq, exc)
                        yield from self._python_pulls(mq, offset, end, sub)
                        return
                    except RmqBrokerUnavailableError:
                        yield from self._python_pulls(mq, offset, end, sub)   # waits for a master
                        return
                if item is False:
                    continue                             # asked again of the master
                while item is not None:
                    if isinstance(item, native_pull.ServerRequest):
                        puller.refuse(item.command)
                    elif isinstance(item, native_pull.Data):
                        res = rq.PullResult(rq.SUCCESS, item.next, 0, 0, item.suggest, item.body)
                        offset = yield item.first, res
                        if item.suggest != expect:
                            self._follow(mq, res)
                            break                        # a range of its own from the suggested broker
                        if offset >= end:
                            return
                    else:
                        res = self._native_answer(mq, item, slave is not None, puller.addr)
                        if res is None:
                            offset = item.asked
                            if slave is not None:
                                break                    # asked again of the master
                            yield from self._python_pulls(mq, offset, end, sub)   # busy: retried there
                            return
                        offset = yield item.asked, res
                        if offset >= end or self._pull_from.get(mq, 0) != expect:
                            break
                    try:
                        if isinstance(item, native_pull.Answer) or (
                                isinstance(item, native_pull.Data) and offset != item.next):
                            puller.seek(offset)
                        item = puller.next(max_rows, max_bytes, view=True)
                    except broken as exc:
                        mine.pop(puller.addr, None)
                        self._unanswered(puller.addr, ahead, exc)
                        if slave is not None:
                            self._pull_from.pop(mq, None)
                            break
                        log.info("pulls of %s by the C core failed (%s); going on in Python", mq, exc)
                        yield from self._python_pulls(mq, offset, end, sub)
                        return
                else:
                    return                               # the range's end
        finally:
            self._give_back(mine)

    def _native_answer(self, mq: MessageQueue, item, from_slave: bool, addr: str) -> rq.PullResult | None:
        """:meth:`_answer` for an answer the C core handed over (never plain messages)."""
        resp = item.command
        if from_slave and resp.code != rq.SUCCESS:
            self._pull_from.pop(mq, None)          # only the master says what is not there
            return None
        if is_auth_failure(resp):
            raise auth_error(resp, f"PULL_MESSAGE({mq}, queue offset {item.asked})", addr, None)
        if resp.code not in rq.PULL_ANSWERS:
            if resp.code == rq.SYSTEM_BUSY:
                return None
            check(resp, f"PULL_MESSAGE({mq}, queue offset {item.asked})", addr, rq.PULL_ANSWERS)
        return self._follow(mq, rq.pull_answer(resp, item.asked))

    def _python_pulls(self, mq: MessageQueue, start: int, end: int, sub: Subscription):
        """(offset asked, PullResult) in offset order. With ``*`` the next pulls of the range are
        sent ahead on the broker's connection (their offsets are known), ``pulls_in_flight`` at
        most; a filter makes the broker choose the next offset, so it is pulled one at a time.
        A pull sent ahead that fails is pulled again with the retries of :meth:`_call`."""
        if not sub.sub_all or self.spec.pulls_in_flight <= 1:
            offset = start
            while offset < end:
                res = self._pull(mq, offset, end - offset, sub)
                offset = yield offset, res
            return
        ahead: deque = deque()      # (offset asked, count asked, Call or None, sent to a slave)
        offset = next_ask = start
        size, full_run = self.spec.pull_batch, 0
        try:
            while offset < end:
                limit = self._in_flight_to(self._masters.get(mq.broker_name))
                while len(ahead) < limit and next_ask < end:
                    n = min(size, end - next_ask)
                    ahead.append((next_ask, n, *self._send_pull(mq, next_ask, n)))
                    next_ask += n
                asked, n, call, from_slave = ahead.popleft()
                res = None
                if asked == offset and call is not None:
                    res = self._answer(mq, asked, call, from_slave, limit)
                if res is None:               # not sent, failed, or not where the stream is
                    _cancel(ahead)
                    res = self._pull(mq, offset, end - offset, sub)
                    asked, n = offset, None
                offset = yield asked, res
                if n is not None and asked < offset <= asked + n:    # (messages of what was asked)
                    size, full_run = next_pull_size(size, full_run, offset - asked, n,
                                                    self.spec.pull_batch)
                if not (ahead and ahead[0][0] == offset):
                    # the answer ended short of what was asked (brokers cap what they send per
                    # pull, e.g. 8 messages or 64 KiB read from disk): what was asked beyond is
                    # dropped
                    _cancel(ahead)
                    next_ask = offset
        finally:
            _cancel(ahead)

    def read_many(self, ranges, *, subscription, batch_rows: int, batch_bytes: int, verify_crc: bool,
                  columns=None) -> Iterator:
        """:meth:`Backend.read_many`. Small ranges (at most ``read_ahead.SMALL_RANGE`` messages) of
        a broker pulled by the C core have their first pulls sent together (:meth:`_firsts`): a
        range that one answer completes costs no round trip of its own; other small ranges are
        read ahead several at once (:mod:`rmq_source.remote.read_ahead`). The decoded rows of
        consecutive ranges of one broker are made full rows together."""
        from rmq_source.store import native
        sub = subscription if isinstance(subscription, Subscription) else Subscription.parse(subscription)
        kw = dict(subscription=sub, batch_rows=batch_rows, batch_bytes=batch_bytes, verify_crc=verify_crc,
                  columns=columns)
        tags = tuple(sub.tags) if sub.tag_filter else None
        skip = native.skip_bits(columns)
        pool = self._pool("_read_ahead", read_ahead.pool)

        def one(r, first=None):
            go_on = r.start
            if first is not None and first.body is not None:
                # what _read_native makes of a SUCCESS answer at the range's start
                batch, after = self._decode(r.mq, first.body, r.start, r.end, tags, verify_crc, skip)
                if batch is not None:
                    yield batch, r.mq
                if first.suggest != self._pull_from.get(r.mq, 0):
                    self._follow(r.mq, rq.PullResult(rq.SUCCESS, first.next, 0, 0, first.suggest))
                go_on = max(first.next, after)
            if go_on < r.end:
                for batch in self._read_native(r.mq, go_on, r.end, on_data_loss=r.on_data_loss,
                                               on_short_read=r.on_short_read, **kw):
                    yield batch, r.mq

        def parts():
            todo = list(ranges)
            addrs: dict[int, str | None] = {}     # (each range's looked at once, when reached)

            def addr_of(k: int) -> str | None:
                if k not in addrs:
                    addrs[k] = self._first_pull_addr(todo[k], sub)
                return addrs[k]
            i = 0
            while i < len(todo):
                addr = addr_of(i)
                j = i + 1
                while j < len(todo) and j - i < FIRSTS_MAX and addr is not None and addr_of(j) == addr:
                    j += 1
                if addr is not None and j - i >= 2:
                    chunk = todo[i:j]
                    for r, first in zip(chunk, self._firsts(addr, chunk, sub)):
                        yield from one(r, first)
                else:
                    while j < len(todo) and addr_of(j) is None:
                        j += 1
                    yield from read_ahead.in_range_order(todo[i:j], one, pool)
                i = j
        return read_ahead.full_rows(parts(), batch_rows, batch_bytes)

    def _first_pull_addr(self, r, sub: Subscription) -> str | None:
        """The broker whose C core pulls the small range ``r`` starts with (its first pull may go
        with others'), or None: an empty or larger range, signed pulls, pulls sent to a slave or
        one at a time (a Proxy), no master known."""
        if (not 0 < r.end - r.start <= read_ahead.SMALL_RANGE or not self.spec.native_pulls
                or self.spec.credentials is not None or self._slave_addr(r.mq) is not None
                or self._template(r.mq, sub) is None):
            return None
        self._note_topic(r.mq)
        try:
            addr = self.broker_addr(r.mq.broker_name)
        except (RmqBrokerUnavailableError, RmqRemotingError):
            return None                  # (its usual way says what is wrong, or waits)
        if r.mq.broker_name in self._down or self._in_flight_to(addr) < 2:
            return None
        return addr

    def _firsts(self, addr: str, chunk: list, sub: Subscription) -> list:
        """The answers to the first pulls of the ranges of ``chunk`` at ``addr``, sent together
        on one connection (:meth:`NativePuller.firsts`); Nones when the connection fails (each
        range is then pulled its usual way, which retries)."""
        pulls = [(self._template(r.mq, sub), r.start, min(self.spec.pull_batch, r.end - r.start))
                 for r in chunk]
        broken = (RmqRemotingConnectionError, RmqRemotingTimeoutError, RmqRemotingProtocolError)
        in_flight = min(self.spec.pulls_in_flight * 4, native_pull.MAX_IN_FLIGHT)
        for attempt in (0, 1):
            reused = False
            try:
                puller, reused = self._take_puller(addr)
                answers = puller.firsts(pulls, in_flight=in_flight, timeout_s=self.spec.timeout_s,
                                        what=f"{len(chunk)} queues of {chunk[0].mq.broker_name}")
                self._give_back({addr: puller})
                return answers
            except broken as exc:
                self._unanswered(addr, in_flight, exc)
                # a reused connection the broker closed while idle fails at once: made again once
                if attempt == 0 and reused and not isinstance(exc, RmqRemotingTimeoutError):
                    continue
                log.info("first pulls of %d ranges at %s failed (%s); each is pulled its usual way",
                         len(chunk), addr, exc)
        return [None] * len(chunk)

    def _pool(self, attr: str, make) -> ThreadPoolExecutor:
        """The thread pool kept in ``attr``, made by ``make()`` on first use."""
        with self._mutex:
            if getattr(self, attr) is None:
                setattr(self, attr, make())
            return getattr(self, attr)

    def read(self, mq, start, end, *, subscription, batch_rows, batch_bytes, verify_crc,
             on_data_loss, on_short_read, columns=None) -> Iterator:
        """Pull answers are decoded several at a time (consecutive answers are consecutive
        CommitLog records): up to ``batch_rows`` messages or ``min(batch_bytes, 16 MiB)`` of records
        a batch, so the per-batch work is not paid for every pull of 32 messages."""
        from rmq_source.store.reader import native_rows
        for batch in self._read_native(mq, start, end, subscription=subscription, batch_rows=batch_rows,
                                       batch_bytes=batch_bytes, verify_crc=verify_crc,
                                       on_data_loss=on_data_loss, on_short_read=on_short_read,
                                       columns=columns):
            yield native_rows(batch, mq.topic, mq.broker_name, mq.queue_id)

    def _decode(self, mq: MessageQueue, body: bytes, first: int, end: int, tags, verify_crc: bool,
                skip: int):
        """(the C core's batch of the records of pull answers ``body`` from queue offset ``first``
        within ``end``, or None when it has no rows; the queue offset after the last record)."""
        from rmq_source.store import native
        where = (f"pull answer(s) of {mq} from offset {first} "
                 f"(broker {self.describe(mq.broker_name)}; byte positions in the answers joined)")
        batch, after = native.decode_records(body, where=where, topic=mq.topic, queue_id=mq.queue_id,
                                             start=first, end=end, tags=tags, verify_crc=verify_crc,
                                             skip=skip)
        return (batch if batch.num_rows else None), after

    def _read_native(self, mq, start, end, *, subscription, batch_rows, batch_bytes, verify_crc,
                     on_data_loss, on_short_read, columns=None) -> Iterator:
        """:meth:`read` in the C core's columns (NATIVE_SCHEMA: bodies as stored, no topic nor
        brokerName)."""
        from rmq_source.store import native

        sub = subscription if isinstance(subscription, Subscription) else Subscription.parse(subscription)
        tags = tuple(sub.tags) if sub.tag_filter else None   # SQL92: the caller rechecks rows
        limit_bytes = min(batch_bytes, COALESCE_BYTES)
        skip = native.skip_bits(columns)
        pending: list[bytes] = []        # bodies of SUCCESS answers not yet decoded, in order
        first = [0, 0, 0]                # queue offset of the first of them; messages, bytes in them

        def decode():
            body = pending[0] if len(pending) == 1 else b"".join(pending)
            pending.clear()
            return self._decode(mq, body, first[0], end, tags, verify_crc, skip)

        pulls = _explain_filter_refusal(self._pulls(mq, start, end, sub, batch_rows, limit_bytes), mq)
        try:
            offset, res = next(pulls)
        except StopIteration:
            return
        retries = 0
        while True:
            if res.code == rq.SUCCESS:
                if not pending:
                    first[:] = [offset, 0, 0]
                first[1] += max(0, res.next_begin_offset - offset)
                first[2] += len(res.body)
                nxt = res.next_begin_offset
                if (nxt <= offset or nxt >= end or first[1] >= batch_rows
                        or first[2] >= limit_bytes):
                    pending.append(res.body)         # (decoded before the next pull: no copy)
                    rows, after = decode()
                    if rows is not None:
                        yield rows
                    nxt = max(nxt, after)
                else:
                    pending.append(bytes(res.body))  # (a view is valid only until then)
                if nxt > offset:
                    retries = 0
            else:
                if pending:                     # what came before, then the answer's meaning
                    rows, _ = decode()
                    if rows is not None:
                        yield rows
                where = f"pull answer of {mq} at offset {offset} from {self.describe(mq.broker_name)}"
                if res.code == rq.PULL_OFFSET_MOVED and offset < res.min_offset:
                    on_data_loss(offset, min(res.min_offset, end))   # removed by retention
                    nxt = res.min_offset
                elif res.code in (rq.PULL_NOT_FOUND, rq.PULL_OFFSET_MOVED):
                    if offset >= res.max_offset:
                        on_short_read(offset, end, f"the broker's queue ends at offset "
                                      f"{res.max_offset}, before the planned end {end}")
                        return
                    if res.code == rq.PULL_OFFSET_MOVED:
                        # inside the queue: a 5.x broker handing over an operator's reset of the
                        # group (it forgets it now); the batch's range is logged, so it is read
                        # as planned and the planner follows the reset (spark/resets.py)
                        log.info("%s: the broker reset the group to offset %d; the batch reads "
                                 "its logged range, the next planning follows the reset", where,
                                 res.next_begin_offset)
                        nxt = offset
                    else:
                        nxt = max(res.next_begin_offset, offset)
                elif res.code == rq.PULL_RETRY_IMMEDIATELY:
                    nxt = res.next_begin_offset     # nothing matched the filter up to there
                else:
                    raise RmqBrokerError(f"{where}: unexpected pull answer code {res.code} "
                                         f"({res.remark})", code=res.code)
            if nxt <= offset:
                retries += 1
                if retries > _MAX_RETRIES:
                    raise RmqBrokerError(f"pull answers of {mq} at offset {offset}: the broker "
                                         f"answered code {res.code} ({res.remark}) {retries} times "
                                         f"without moving past it", code=res.code)
                nxt = offset
            if nxt >= end:
                return
            try:
                offset, res = pulls.send(nxt)
            except StopIteration:
                if pending:
                    rows, _ = decode()
                    if rows is not None:
                        yield rows
                return

    # -- group state ---------------------------------------------------------------------------
    def offset_store(self, group: str):
        from rmq_source.remote.offset_store import BrokerOffsetStore
        return BrokerOffsetStore(self.offsets_client, group, self)

    def group_session(self, opts, strategy, offset_store):
        """The query as a consumer of its group on the brokers (:mod:`.membership`), ordered
        reading under the brokers' queue locks (:mod:`.locks`); its batch plans in
        ``groupStatePath``."""
        from rmq_source.group.session import GroupSession
        from rmq_source.remote.locks import BrokerLockManager
        from rmq_source.remote.membership import BrokerMembership
        from rmq_source.remote.running_info import MemberAnswers
        membership = BrokerMembership(self, opts.consumer_group, opts.client_id,
                                      subscription=opts.subscription.expression,
                                      expression_type=opts.subscription.expression_type,
                                      consume_from_where=opts.consume_from_where,
                                      heartbeat_timeout_ms=opts.lock_lease_ms)
        membership.subscribe(opts.topics or ())
        session = GroupSession(opts, strategy, offset_store, state_dir=opts.group_state_path,
                               membership=membership,
                               locks=BrokerLockManager(self, opts.consumer_group,
                                                       lease_ms=opts.lock_lease_ms),
                               keep_own_progress=True)
        # the brokers' questions for mqadmin and the Dashboard, asked over the member's connections
        membership.client.on_request = MemberAnswers(session, opts).serve
        return session

    def group_topics(self, group: str) -> set[str]:
        raise RmqOptionError("listing a group's topics on the brokers is not supported yet; name "
                             "the topic")

    def group_users(self, group: str) -> tuple[list[str], dict[str, str]]:
        """The group's consumers listed by every master (one list per address: a Proxy lists the
        members heartbeating to it, for all its brokers at once)."""
        live: set[str] = set()
        for addr in sorted(set(self._masters_all().values())):
            live.update(rq.consumer_list(self.client, addr, group))
        return sorted(live), {}

    def _masters_all(self) -> dict[str, str]:
        """brokerName -> master address of every broker in the NameServers' cluster info; where
        that is not served (a Proxy), of the brokers routed so far (the Proxy's address)."""
        def ask(addr):
            info = self._if_served(addr, rq.GET_BROKER_CLUSTER_INFO,
                                   lambda: rq.cluster_info(self.client, addr),
                                   "brokers are looked up in routes there")
            if info is not _NOT_SERVED:
                return {b: info.master_addr(b) for b in info.brokers if info.master_addr(b)}
            with self._mutex:
                return dict(self._masters)
        return self._ask_namesrv("cluster info", ask)

    def check_task_locks(self, lock: TaskLock, mqs: Iterable[MessageQueue]) -> set[MessageQueue]:
        """The queues whose broker grants the driver's client id their lock (a restarted broker
        grants it again); see :meth:`BrokerLockManager.task_readable`."""
        from rmq_source.remote.locks import BrokerLockManager
        return BrokerLockManager(self, lock.group, lease_ms=lock.client_lease_ms + 1).task_readable(
            list(mqs), lock.client_id, trusted_until_ms=lock.locked_at_ms + lock.client_lease_ms)
