"""Sending a task's messages: batches per queue, several queues in flight, retries.

Contract:

* Messages go to *lanes*: one per (topic, broker, queue) and kind (pinned by ``shardingKey`` or
  ``queueId``, or free). A lane has at most one request in flight and sends its batches in the
  order its messages arrived, a failed batch first again: so messages of one ``shardingKey`` are
  stored in their order, whatever fails in between.
* Free messages fill one batch at a time, queue after queue of the topic's publish list (round
  robin, as the Java producer's batch send picks a queue per send). A free batch that fails goes
  to another queue, on another broker when there is one; a pinned one waits (doubling backoff)
  and goes to its queue again.
* A batch counts as sent when its broker answered SEND_OK (or, with ``requireStoreOk=false``,
  a flush/slave status). After ``requestRetries`` failed tries of one batch (and, when its broker
  did not answer, once it has been away ``brokerOutageTimeoutMs``: a broker restart is waited
  for), or an answer that a retry cannot change (message illegal, ACL refusal),
  :class:`RmqSendError` names the rows, the queue and what to do. Messages are sent at least
  once; a retried batch carries the same ``UNIQ_KEY`` values.
* Delayed messages (``delayTimeLevel``) go alone (SEND_MESSAGE): brokers refuse delay in batches.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from rmq_source.errors import (RmqAuthError, RmqBrokerError, RmqRemotingConnectionError,
                               RmqRemotingTimeoutError, RmqSendError, RmqSinkRowError,
                               RmqUnknownTopicError)
from rmq_source.remote import requests as rq
from rmq_source.remote.client import RemotingClient, ask_namesrvs
from rmq_source.remote.proxy import SENDS_IN_FLIGHT, routes_through_proxy
from rmq_source.sink.columns import Outgoing
from rmq_source.sink.options import SinkOptions
from rmq_source.sink.routing import PublishQueue, hash_index, publish_queues

log = logging.getLogger(__name__)

SEND_OK = 0
#: stored by the master, not confirmed as asked (SendStatus other than SEND_OK)
STORE_STATUS = {10: "FLUSH_DISK_TIMEOUT", 11: "SLAVE_NOT_AVAILABLE", 12: "FLUSH_SLAVE_TIMEOUT"}
#: answers another try may change (DefaultMQProducer.retryResponseCodes of 5.3)
RETRY_CODES = {1: "SYSTEM_ERROR", 2: "SYSTEM_BUSY", 14: "SERVICE_NOT_AVAILABLE", 16: "NO_PERMISSION",
               17: "TOPIC_NOT_EXIST", 204: "NO_BUYER_ID", 205: "NOT_IN_CURRENT_UNIT", 1500: "GO_AWAY"}
MESSAGE_ILLEGAL = 13
MAX_BACKOFF_S = 8.0

_CLIENTS: dict = {}
_CLIENTS_LOCK = threading.Lock()


def shared_client(opts: SinkOptions) -> RemotingClient:
    """One client per process and settings: Spark reuses its Python workers across tasks."""
    key = (opts.credentials, opts.tls, opts.request_timeout_ms)
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            client = _CLIENTS[key] = RemotingClient(timeout=opts.request_timeout_ms / 1000,
                                                    credentials=opts.credentials, tls=opts.tls)
        return client


def fetch_route(client: RemotingClient, opts: SinkOptions, topic: str) -> rq.TopicRoute:
    """The topic's route from the first NameServer that answers; :class:`RmqUnknownTopicError`
    when it has none (the sink does not create topics)."""
    try:
        return ask_namesrvs(opts.namesrv_addrs, f"route of topic {topic!r}",
                            lambda addr: rq.topic_route(client, addr, topic),
                            unreachable=(RmqRemotingConnectionError, RmqRemotingTimeoutError))
    except RmqBrokerError as exc:
        if exc.code != rq.TOPIC_NOT_EXIST:
            raise
        raise RmqUnknownTopicError(
            f"topic {topic!r} does not exist in the cluster of NameServer "
            f"{';'.join(opts.namesrv_addrs)} (no route); create it first, e.g. mqadmin "
            f"updateTopic -n {opts.namesrv_addrs[0]} -c <cluster> -t {topic} (the sink does "
            "not create topics)") from None


@dataclass(slots=True)
class _Batch:
    """One request's messages: ``messages`` (encoded when first sent) or ``encoded`` already."""

    count: int
    nbytes: int
    first_row: int
    last_row: int
    messages: list[Outgoing] | None = None
    encoded: bytes | None = None
    single: bool = False
    attempts: int = 0
    #: when its broker first failed to answer it (monotonic s; None: it answered, or never failed)
    away_since: float | None = None
    #: its last send: wall clock ms and the broker address (for its traces)
    sent_ms: int = 0
    sent_to: str = ""

    @classmethod
    def of(cls, messages: list[Outgoing], nbytes: int, *, single: bool = False) -> "_Batch":
        rows = [m.row for m in messages]
        return cls(len(messages), nbytes, min(rows), max(rows), messages, single=single)

    def rows(self) -> str:
        if self.count == 1:
            return f"row {self.first_row}"
        return f"rows {self.first_row}..{self.last_row} ({self.count} messages)"


@dataclass
class _Lane:
    topic: str
    queue: PublishQueue
    pinned: bool
    open: list = field(default_factory=list)
    open_bytes: int = 0
    closed: deque = field(default_factory=deque)
    busy: bool = False
    queued: bool = False        # in the producer's ready deque
    not_before: float = 0.0

    def where(self) -> str:
        return f"topic {self.topic} queue {self.queue.broker}/{self.queue.queue_id}"


@dataclass
class _Topic:
    queues: list[PublishQueue]
    masters: dict[str, str]
    fetched: float
    #: the publish list pinned rows are placed by, for the whole task: the first one seen, so a
    #: broker leaving the route for a while does not move a key's later rows to another queue
    pinned: list[PublishQueue]
    cursor: int = 0
    free: _Lane | None = None


@dataclass
class SendStats:
    messages: int = 0
    requests: int = 0
    retries: int = 0
    #: messages accepted with a flush/slave status (requireStoreOk=false)
    unconfirmed: int = 0
    #: the most requests the task had in flight at once
    peak_in_flight: int = 0


class TaskProducer:
    """The producer of one task (module doc): :meth:`add` each message, then :meth:`flush`."""

    def __init__(self, opts: SinkOptions, partition: int, client: RemotingClient | None = None):
        self.opts = opts
        self.partition = partition
        self.client = client or shared_client(opts)
        self.stats = SendStats()
        self._topics: dict[str, _Topic] = {}
        self._lanes: dict[tuple, _Lane] = {}
        self._ready: deque[_Lane] = deque()
        self._in_flight: deque = deque()     # (lane, batch, call)
        self._buffered = 0                   # bytes of messages added and not yet acknowledged
        self._buffer_limit = max(opts.batch_bytes * (2 * opts.max_in_flight + 2), 8 << 20)
        self._avoid: dict[str, float] = {}   # broker -> monotonic time until free sends avoid it
        self._max_in_flight = opts.max_in_flight   # (fewer through a Proxy: see _topic)
        self._traces = None
        if opts.trace_topic is not None:
            from rmq_source.sink.traces import PublishTraces
            self._traces = PublishTraces(opts, self.client,
                                         lambda topic: fetch_route(self.client, opts, topic))

    # -- routes ---------------------------------------------------------------------------------
    def _topic(self, topic: str, *, refresh: bool = False) -> _Topic:
        state = self._topics.get(topic)
        if state is not None and not refresh:
            return state
        if state is not None and time.monotonic() - state.fetched < 1.0:
            return state
        route = fetch_route(self.client, self.opts, topic)
        queues = publish_queues(topic, route)
        fresh = _Topic(queues, route.master_addrs(), time.monotonic(), queues)
        if (self._max_in_flight > SENDS_IN_FLIGHT
                and routes_through_proxy(self.opts.namesrv_addrs, fresh.masters)):
            log.info("topic %s is routed through a RocketMQ 5 Proxy: at most %d sends in flight "
                     "(maxInFlight %d), as it drops answers it cannot write at once", topic,
                     SENDS_IN_FLIGHT, self.opts.max_in_flight)
            self._max_in_flight = SENDS_IN_FLIGHT
        if state is not None:
            fresh.cursor, fresh.free, fresh.pinned = state.cursor, state.free, state.pinned
        self._topics[topic] = fresh
        return fresh

    def _queues(self, topic: str, row_error) -> _Topic:
        state = self._topic(topic)
        if not state.queues:
            state = self._topic(topic, refresh=True)
        if not state.pinned and state.queues:
            state.pinned = state.queues
        if not state.queues:
            raise RmqSendError(f"topic {topic} has no writable queue with a master in the cluster of "
                               f"NameServer {';'.join(self.opts.namesrv_addrs)} ({row_error}); check the "
                               "topic's permission and that its brokers run")
        return state

    # -- lanes ----------------------------------------------------------------------------------
    def _lane(self, topic: str, queue: PublishQueue, pinned: bool) -> _Lane:
        key = (topic, queue, pinned)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(topic, queue, pinned)
        return lane

    def _next_free(self, topic: str, state: _Topic, *, avoid: str | None = None) -> _Lane:
        """The next queue of the topic for free messages, round robin, skipping brokers that
        failed lately (and ``avoid``) while another broker is left."""
        now = time.monotonic()
        n = len(state.queues)
        for step in range(n):
            q = state.queues[(state.cursor + step) % n]
            if q.broker != avoid and self._avoid.get(q.broker, 0) <= now:
                state.cursor = (state.cursor + step + 1) % n
                return self._lane(topic, q, False)
        q = state.queues[state.cursor % n]
        state.cursor = (state.cursor + 1) % n
        return self._lane(topic, q, False)

    def _pinned_queue(self, msg: Outgoing, state: _Topic) -> PublishQueue:
        if msg.pin[0] == "hash":
            return state.pinned[hash_index(msg.pin[1], len(state.pinned))]
        _, broker, qid = msg.pin
        brokers = sorted({q.broker for q in state.pinned})
        if broker is None:
            if len(brokers) > 1:
                raise self._row_error(msg, f"queueId {qid} without brokerName, but topic {msg.topic} "
                                           f"has writable queues on brokers {', '.join(brokers)}: add a "
                                           "brokerName column")
            broker = brokers[0]
        ids = [q.queue_id for q in state.pinned if q.broker == broker]
        if qid not in ids:
            have = f"queues 0..{max(ids)}" if ids else "no writable queue"
            raise self._row_error(msg, f"topic {msg.topic} has {have} on broker {broker!r} "
                                       f"(queueId {qid} asked; writable brokers: {', '.join(brokers)})")
        return PublishQueue(broker, qid)

    def _row_error(self, msg: Outgoing, what: str) -> RmqSinkRowError:
        return RmqSinkRowError(f"partition {self.partition}, row {msg.row}: {what}")

    # -- adding ---------------------------------------------------------------------------------
    def add(self, msg: Outgoing) -> None:
        state = self._topics.get(msg.topic)
        if state is None or not state.queues:
            state = self._queues(msg.topic, f"partition {self.partition}, row {msg.row}")
        if msg.pin is None:
            lane = state.free or self._next_free(msg.topic, state)
            state.free = lane
        else:
            lane = self._lane(msg.topic, self._pinned_queue(msg, state), True)
        size = msg.size
        self._buffered += size
        if msg.delayed:
            self._close(lane)
            self._enqueue(lane, _Batch.of([msg], size, single=True))
        else:
            if lane.open and (len(lane.open) >= self.opts.batch_messages
                              or lane.open_bytes + size > self.opts.batch_bytes):
                self._close(lane)
                if msg.pin is None:
                    lane = state.free = self._next_free(msg.topic, state)
            lane.open.append(msg)
            lane.open_bytes += size
        self._bound_memory()

    def add_encoded(self, topic: str, first_row: int, count: int, encoded: bytes) -> None:
        """Adds a batch of free messages already encoded (:mod:`.encoder`): task rows
        ``first_row .. first_row + count - 1``, sent to the topic's next queue."""
        state = self._topics.get(topic)
        if state is None or not state.queues:
            state = self._queues(topic, f"partition {self.partition}, rows from {first_row}")
        self._buffered += len(encoded)
        batch = _Batch(count, len(encoded), first_row, first_row + count - 1, encoded=encoded)
        self._enqueue(self._next_free(topic, state), batch)
        self._bound_memory()

    def _bound_memory(self) -> None:
        if self._buffered > self._buffer_limit:
            # bounded memory: send what is open and wait until enough was acknowledged
            for each in self._lanes.values():
                self._close(each)
            self._drain(lambda: self._buffered <= self._buffer_limit // 2)
        elif self._ready:
            self._pump()

    def _close(self, lane: _Lane) -> None:
        if lane.open:
            self._enqueue(lane, _Batch.of(lane.open, lane.open_bytes))
            lane.open, lane.open_bytes = [], 0

    def _enqueue(self, lane: _Lane, batch: _Batch, *, first: bool = False) -> None:
        (lane.closed.appendleft if first else lane.closed.append)(batch)
        self._mark_ready(lane)

    def _mark_ready(self, lane: _Lane) -> None:
        if lane.closed and not lane.busy and not lane.queued:
            lane.queued = True
            self._ready.append(lane)

    # -- sending --------------------------------------------------------------------------------
    def _pump(self) -> None:
        """Send the head batch of ready lanes while fewer than maxInFlight are in flight."""
        now = time.monotonic()
        waiting = []
        while self._ready and len(self._in_flight) < self._max_in_flight:
            lane = self._ready.popleft()
            lane.queued = False
            if lane.busy or not lane.closed:
                continue
            if lane.not_before > now:
                waiting.append(lane)
                continue
            self._send(lane, lane.closed.popleft())
        for lane in waiting:
            self._mark_ready(lane)

    def _send(self, lane: _Lane, batch: _Batch) -> None:
        lane.busy = True
        self.stats.requests += 1
        try:
            addr = self._master(lane)
            born = int(time.time() * 1000)
            batch.sent_ms, batch.sent_to = born, addr
            timeout = self.opts.request_timeout_ms / 1000
            if batch.single:
                m = batch.messages[0]
                call = rq.send_one_call(self.client, addr, lane.topic, m.body, m.props,
                                        queue_id=lane.queue.queue_id, born_ms=born,
                                        producer_group=self.opts.producer_group,
                                        broker_name=lane.queue.broker, timeout=timeout)
            else:
                if batch.encoded is None:   # kept for retries; the messages are not needed again
                    batch.encoded = rq.encode_batch_encoded((m.body, m.props, 0) for m in batch.messages)
                    batch.messages = None
                call = rq.send_batch_call(self.client, addr, lane.topic, batch.encoded,
                                          queue_id=lane.queue.queue_id, born_ms=born,
                                          producer_group=self.opts.producer_group,
                                          broker_name=lane.queue.broker, timeout=timeout)
        except (RmqRemotingConnectionError, RmqRemotingTimeoutError, _NoMaster) as exc:
            self._failed(lane, batch, str(exc), None)
            return
        self._in_flight.append((lane, batch, call))
        self.stats.peak_in_flight = max(self.stats.peak_in_flight, len(self._in_flight))

    def _at(self, lane: _Lane) -> str:
        """The lane's queue and its broker's master as last routed, for messages."""
        state = self._topics.get(lane.topic)
        addr = state.masters.get(lane.queue.broker) if state is not None else None
        return f"{lane.where()} (broker {lane.queue.broker} master {addr or 'away'})"

    def _master(self, lane: _Lane) -> str:
        state = self._topic(lane.topic)
        addr = state.masters.get(lane.queue.broker)
        if addr is None:
            state = self._topic(lane.topic, refresh=True)
            addr = state.masters.get(lane.queue.broker)
        if addr is None:
            raise _NoMaster(f"broker {lane.queue.broker} has no master in the NameServer's route")
        return addr

    def _complete_oldest(self) -> None:
        lane, batch, call = self._in_flight.popleft()
        try:
            resp = self.client.answer(call, ok=None)
        except RmqAuthError as exc:
            raise RmqSendError(f"partition {self.partition}, {batch.rows()} to {self._at(lane)}: refused "
                               f"by ACL: {exc}; give accessKey/secretKey of an account with PUB "
                               f"permission on {lane.topic}", code=exc.code, broker=lane.queue.broker) from exc
        except (RmqRemotingConnectionError, RmqRemotingTimeoutError) as exc:
            self._failed(lane, batch, str(exc), None)
            return
        code = resp.code
        if code == SEND_OK or (code in STORE_STATUS and not self.opts.require_store_ok):
            if code != SEND_OK:
                self.stats.unconfirmed += batch.count
                log.warning("partition %d, %s to %s: %s (accepted: requireStoreOk=false)", self.partition,
                            batch.rows(), lane.where(), STORE_STATUS[code])
            if self._traces is not None:
                self._trace(lane, batch, resp)
            self._done(lane, batch)
        elif code == MESSAGE_ILLEGAL or (code == 1 and "size exceeded" in (resp.remark or "")):
            self._fatal(lane, batch, code, resp.remark)     # 5.x says too large with SYSTEM_ERROR
        elif code in STORE_STATUS or code in RETRY_CODES:
            name = STORE_STATUS.get(code) or RETRY_CODES[code]
            self._failed(lane, batch, f"broker answered {name} ({code}): {resp.remark or '(no remark)'}", code)
        else:
            self._fatal(lane, batch, code, resp.remark)

    def _trace(self, lane: _Lane, batch: _Batch, resp) -> None:
        encoded = batch.encoded
        if encoded is None:            # (a delayed message, sent alone)
            m = batch.messages[0]
            encoded = rq.encode_batch_encoded([(m.body, m.props, 0)])
        self._traces.sent(lane.topic, encoded, batch.count, resp, batch.sent_to, batch.sent_ms,
                          max(0, int(time.time() * 1000) - batch.sent_ms))

    def _done(self, lane: _Lane, batch: _Batch) -> None:
        lane.busy = False
        lane.not_before = 0.0
        self.stats.messages += batch.count
        self._buffered -= batch.nbytes
        self._mark_ready(lane)

    def _failed(self, lane: _Lane, batch: _Batch, reason: str, code: int | None) -> None:
        lane.busy = False
        batch.attempts += 1
        self.stats.retries += 1
        broker = lane.queue.broker
        now = time.monotonic()
        if code is None:        # no answer: the broker is away (down, restarting, no master)
            batch.away_since = batch.away_since or now
        else:
            batch.away_since = None
        waiting = (batch.away_since is not None
                   and now - batch.away_since < self.opts.broker_outage_ms / 1000)
        if batch.attempts > self.opts.retries and not waiting:
            what = (f"the broker stored them but did not confirm ({reason}); set requireStoreOk=false "
                    "to accept that, or fix the broker's flush/slave setup" if code in STORE_STATUS
                    else f"{reason}; check that broker {broker} runs and is reachable, or raise "
                         "requestRetries/retryBackoffMs/brokerOutageTimeoutMs")
            raise RmqSendError(f"partition {self.partition}, {batch.rows()} to {self._at(lane)}: gave up "
                               f"after {batch.attempts} tries: {what}", code=code, broker=broker)
        delay = min(self.opts.retry_backoff_ms / 1000 * 2 ** (batch.attempts - 1), MAX_BACKOFF_S)
        if batch.attempts > self.opts.retries:
            log.warning("partition %d, %s to %s: %s; broker %s away for %.0f s, tried again until "
                        "brokerOutageTimeoutMs (%d ms)", self.partition, batch.rows(), lane.where(),
                        reason, broker, now - batch.away_since, self.opts.broker_outage_ms)
        else:
            log.warning("partition %d, %s to %s: %s; trying again (%d of %d)", self.partition,
                        batch.rows(), lane.where(), reason, batch.attempts, self.opts.retries)
        try:
            self._topic(lane.topic, refresh=True)
        except (RmqRemotingConnectionError, RmqRemotingTimeoutError) as exc:
            log.warning("route of %s not refreshed: %s", lane.topic, exc)
        if lane.pinned:
            lane.not_before = time.monotonic() + delay
            self._enqueue(lane, batch, first=True)
            return
        self._avoid[broker] = time.monotonic() + delay
        state = self._topic(lane.topic)
        target = self._next_free(lane.topic, state, avoid=broker) if state.queues else lane
        if target.queue.broker == broker:
            target.not_before = time.monotonic() + delay
        self._enqueue(target, batch)
        self._mark_ready(lane)

    def _fatal(self, lane: _Lane, batch: _Batch, code: int, remark: str | None) -> None:
        remark = (remark or "(no remark)").split("\n")[0][:400]
        hint = ("a message or the batch exceeds what the broker takes (its maxMessageSize, or the "
                "properties' size): lower batchBytes / maxMessageBytes to the broker's limit, or "
                "raise maxMessageSize on the broker" if code in (MESSAGE_ILLEGAL, 1)
                else "see the broker's remark")
        raise RmqSendError(f"partition {self.partition}, {batch.rows()} to {self._at(lane)}: the broker "
                           f"refused them with code {code}: {remark}; {hint}", code=code,
                           broker=lane.queue.broker)

    # -- the end --------------------------------------------------------------------------------
    def flush(self) -> SendStats:
        """Send everything added; returns when every message was acknowledged (or raises)."""
        for lane in self._lanes.values():
            self._close(lane)
        self._drain(lambda: False)
        if self._traces is not None:
            self._traces.close()
        return self.stats

    def _drain(self, enough) -> None:
        """Send and wait for answers (sleeping through retry backoffs) until ``enough()`` or
        nothing is left to send."""
        while not enough():
            self._pump()
            if self._in_flight:
                self._complete_oldest()
                continue
            pending = [lane for lane in self._lanes.values() if lane.closed]
            if not pending:
                return
            wake = min(lane.not_before for lane in pending)
            time.sleep(max(0.0, min(wake - time.monotonic(), MAX_BACKOFF_S)))
            for lane in pending:
                self._mark_ready(lane)

    def abandon(self) -> None:
        """Stop waiting for answers (the task failed): calls in flight are cancelled."""
        for _, _, call in self._in_flight:
            call.cancel()
        self._in_flight.clear()
        if self._traces is not None:
            self._traces.abandon()


class _NoMaster(Exception):
    pass
