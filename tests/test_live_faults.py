"""Faults of a live cluster under the source, with real servers (RocketMQ 4.9.x and 5.3.x).

Each RocketMQ line gets its own NameServer and broker here (the session's are shared by other
tests and must not die): the broker is killed with SIGKILL and restarted on the same port and
store while a streaming query of a consumer group runs; it is frozen (SIGSTOP) to stop answering;
and a query names NameServers where none listens.
"""
from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import pytest

from conftest import BROKER_LINES, raises_rmq, running_cluster
from fault_helpers.queries import wait_alive
from fault_helpers.sinks import body_streams, rows_stream, sink_bodies, topic_bodies
from rmq_source.errors import (RmqBrokerError, RmqRemotingConnectionError, RmqRemotingError,
                               RmqRemotingTimeoutError)
from rmq_source.remote import RemotingClient
from rmq_source.remote import requests as rq

pytestmark = [pytest.mark.broker, pytest.mark.spark]

QUEUES = 4


@pytest.fixture(scope="module", params=BROKER_LINES, ids=lambda line: f"rocketmq-{line}")
def own_cluster(request, rocketmq_jars, tmp_path_factory):
    with running_cluster(rocketmq_jars, request.param, tmp_path_factory, "faults") as cluster:
        yield cluster


def _topic(cluster, brokers=("broker-a",)) -> str:
    name = f"Fault_{uuid.uuid4().hex[:8]}"
    with RemotingClient(timeout=15) as client:
        for broker in brokers:
            cluster.create_topic(client, name, QUEUES, broker=broker)
        deadline = time.monotonic() + 30
        while {q["brokerName"] for q in rq.topic_route(client, cluster.namesrv_addr, name).queue_datas
               } != set(brokers):
            assert time.monotonic() < deadline, f"topic {name} not routed to {brokers}"
            time.sleep(0.2)
    return name


def _send(cluster, topic: str, per_queue: int, tag: str, broker: str = "broker-a") -> set[bytes]:
    addr = cluster.brokers[broker].addr
    bodies = set()
    with RemotingClient(timeout=15) as client:
        for q in range(QUEUES):
            for i in range(per_queue):
                body = f"{tag}-{broker}-{q}-{i}".encode()
                deadline = time.monotonic() + 60
                while True:
                    try:
                        rq.send_message(client, addr, topic, body, queue_id=q, tags="t")
                        break
                    except RmqBrokerError as exc:
                        # a broker just restarted may shed load ("broker busy", SYSTEM_BUSY):
                        # send again, as RocketMQ's producers do; it stored nothing
                        if exc.code != rq.SYSTEM_BUSY or time.monotonic() > deadline:
                            raise
                        time.sleep(0.2)
                bodies.add(body)
    return bodies


@pytest.mark.lines("4.9")      # (5.3: the every-kind restarts below kill a broker under group streams)
def test_broker_killed_and_restarted_under_a_streaming_group_query(spark, own_cluster, tmp_path):
    """Exactly once into the sink across a SIGKILL and restart of the only broker; the group's
    offsets on the restarted broker end at the queues' ends."""
    topic = _topic(own_cluster)
    group = f"FaultGroup_{uuid.uuid4().hex[:6]}"
    sent = _send(own_cluster, topic, 15, "before")
    sink = tmp_path / "sink"
    q = (spark.readStream.format("rmq")
         .options(namesrvAddr=own_cluster.namesrv_addr, topic=topic, consumerGroup=group,
                  startingOffsets="earliest", maxMessagesPerTrigger="8", requestRetries="8",
                  requestTimeoutMs="3000", groupStatePath=str(tmp_path / "state"),
                  lockRenewIntervalMs="1000")
         .load().select("body").writeStream.format("parquet").option("path", str(sink))
         .option("checkpointLocation", str(tmp_path / "chk")).trigger(processingTime="300 milliseconds")
         .start())
    try:
        def committed() -> list[bytes]:
            return sink_bodies(sink)

        deadline = time.monotonic() + 120
        while len(committed()) < 16:
            assert q.exception() is None and time.monotonic() < deadline, q.exception()
            time.sleep(0.5)
        own_cluster.brokers["broker-a"].kill()          # SIGKILL, mid-stream
        time.sleep(2)
        own_cluster.start_broker("broker-a")            # same port and store: recovery after a crash
        sent |= _send(own_cluster, topic, 5, "after")

        deadline = time.monotonic() + 180
        while set(committed()) != sent:
            assert q.exception() is None, q.exception()
            assert time.monotonic() < deadline, f"{len(set(committed()))} of {len(sent)} in the sink"
            time.sleep(0.5)
        rows = committed()
        assert len(rows) == len(set(rows)), "a message reached the sink twice"
        broker = own_cluster.brokers["broker-a"]
        with RemotingClient(timeout=15) as client:
            ends = {i: rq.max_offset(client, broker.addr, topic, i) for i in range(QUEUES)}
            deadline = time.monotonic() + 60      # the last batch is recorded at the next planning
            while {i: rq.query_consumer_offset(client, broker.addr, group, topic, i)
                   for i in range(QUEUES)} != ends:
                assert time.monotonic() < deadline, "the group's offsets never reached the ends"
                time.sleep(0.5)
    finally:
        q.stop()


def test_a_broker_that_stops_answering_fails_after_the_timeout(spark, own_cluster):
    """SIGSTOP freezes the broker: connections stay open, nothing answers. A batch read ends with
    a timeout error after its bounded tries, never a hang."""
    topic = _topic(own_cluster)
    _send(own_cluster, topic, 2, "x")
    broker = own_cluster.brokers["broker-a"]
    os.killpg(broker.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with raises_rmq(RmqRemotingTimeoutError, "gave up after 2 tries"):
            (spark.read.format("rmq")
             .options(namesrvAddr=own_cluster.namesrv_addr, topic=topic, requestTimeoutMs="1500",
                      requestRetries="1", retryBackoffMs="200")
             .load().collect())
        assert time.monotonic() - started < 60
    finally:
        os.killpg(broker.proc.pid, signal.SIGCONT)


def test_no_nameserver_answers(spark):
    import rocketmq_cluster
    addrs = f"127.0.0.1:{rocketmq_cluster.free_port()};127.0.0.1:{rocketmq_cluster.free_port()}"
    with raises_rmq(RmqRemotingConnectionError, "no NameServer answered") as info:
        spark.read.format("rmq").options(namesrvAddr=addrs, topic="T").load().collect()
    for addr in addrs.split(";"):
        assert addr in info.text


def _second_broker(cluster, tmp_path):
    """broker-b on the module's NameServer, for one test (stopped by the caller)."""
    return cluster.start_broker("broker-b", workdir=tmp_path / "broker-b")


def _stream(spark, cluster, topic, tmp_path, **options):
    """A parquet-sink stream of ``topic`` (None: the options name the topics, e.g. topicPattern)."""
    sink = tmp_path / "sink"
    if topic is not None:
        options["topic"] = topic
    q = (spark.readStream.format("rmq")
         .options(namesrvAddr=cluster.namesrv_addr, startingOffsets="earliest",
                  requestRetries="1", retryBackoffMs="200", requestTimeoutMs="3000", **options)
         .load().select("body").writeStream.format("parquet").option("path", str(sink))
         .option("checkpointLocation", str(tmp_path / "chk")).trigger(processingTime="300 milliseconds")
         .start())
    return q, sink


@pytest.mark.lines("5.3")
def test_a_lost_second_broker_waits_with_fail_on_data_loss_false(spark, own_cluster, tmp_path):
    """failOnDataLoss=false: while broker-b is gone (SIGKILL) broker-a's queues go on, broker-b's
    wait; once it is back (same store) they go on from where they stopped. Exactly once into the
    sink, and the group's offsets on both brokers end at the queues' ends."""
    _second_broker(own_cluster, tmp_path)
    try:
        topic = _topic(own_cluster, ("broker-a", "broker-b"))
        group = f"LostGroup_{uuid.uuid4().hex[:6]}"
        sent = _send(own_cluster, topic, 4, "one") | _send(own_cluster, topic, 4, "one", "broker-b")
        q, sink = _stream(spark, own_cluster, topic, tmp_path, consumerGroup=group,
                          failOnDataLoss="false", groupStatePath=str(tmp_path / "state"),
                          lockRenewIntervalMs="1000")
        try:
            wait_alive(q, "the first messages never reached the sink",
                      lambda: set(sink_bodies(sink)) == sent)
            time.sleep(1.5)   # a batch or two more: the group's progress of that batch is written
            own_cluster.brokers["broker-b"].kill()
            sent |= (away := _send(own_cluster, topic, 3, "two"))
            wait_alive(q, "broker-a's queues stopped while broker-b was away",
                      lambda: away <= set(sink_bodies(sink)))
            own_cluster.start_broker("broker-b")         # same port and store
            sent |= _send(own_cluster, topic, 3, "three", "broker-b")
            sent |= _send(own_cluster, topic, 2, "three")
            wait_alive(q, "broker-b's queues did not go on once it was back",
                      lambda: set(sink_bodies(sink)) == sent, timeout=180)
            rows = sink_bodies(sink)
            assert len(rows) == len(set(rows)), "a message reached the sink twice"
            with RemotingClient(timeout=15) as client:
                ends = {(b, i): rq.max_offset(client, own_cluster.brokers[b].addr, topic, i)
                        for b in ("broker-a", "broker-b") for i in range(QUEUES)}
                deadline = time.monotonic() + 60
                while {(b, i): rq.query_consumer_offset(client, own_cluster.brokers[b].addr, group,
                                                        topic, i) for b, i in ends} != ends:
                    assert time.monotonic() < deadline, "the group's offsets never reached the ends"
                    time.sleep(0.5)
        finally:
            q.stop()
    finally:
        own_cluster.stop_broker("broker-b", graceful=False)   # a throwaway broker


@pytest.mark.lines("4.9")
def test_a_lost_second_broker_fails_the_query_with_fail_on_data_loss_true(spark, own_cluster, tmp_path):
    """failOnDataLoss=true (the default): the query fails once the broker has been away
    brokerOutageTimeoutMs, naming the broker, its queues and the options."""
    _second_broker(own_cluster, tmp_path)
    try:
        topic = _topic(own_cluster, ("broker-a", "broker-b"))
        sent = _send(own_cluster, topic, 2, "one") | _send(own_cluster, topic, 2, "one", "broker-b")
        q, sink = _stream(spark, own_cluster, topic, tmp_path, brokerOutageTimeoutMs="4000")
        try:
            wait_alive(q, "the first messages never reached the sink",
                      lambda: set(sink_bodies(sink)) == sent)
            own_cluster.brokers["broker-b"].kill()
            deadline = time.monotonic() + 90
            while q.exception() is None:
                assert time.monotonic() < deadline, "the query did not fail without broker-b"
                time.sleep(0.5)
            text = str(q.exception())
            for part in ("RmqBrokerUnavailableError", "broker broker-b does not answer",
                         f"{topic}/broker-b/", "longer than brokerOutageTimeoutMs (4000)",
                         "failOnDataLoss=false"):
                assert part in text, text[-2000:]
        finally:
            q.stop()
    finally:
        own_cluster.stop_broker("broker-b", graceful=False)   # a throwaway broker


def _routed(cluster, topic: str, queues: dict[str, int]) -> None:
    """Wait until the NameServer routes ``topic`` to exactly ``queues`` (broker -> read queues)."""
    with RemotingClient(timeout=15) as client:
        deadline = time.monotonic() + 60
        while {q["brokerName"]: int(q["readQueueNums"]) for q in
               rq.topic_route(client, cluster.namesrv_addr, topic).queue_datas} != queues:
            assert time.monotonic() < deadline, f"topic {topic} never routed to {queues}"
            time.sleep(0.2)


def test_route_changes_are_picked_up_between_micro_batches(spark, own_cluster, tmp_path):
    """A topicPattern stream keeps reading while the routes change under it: more queues on a
    topic, a new topic that matches, the topic on a broker added to the cluster. Each change's
    messages arrive without a restart, every message exactly once."""
    prefix = f"Route_{uuid.uuid4().hex[:6]}"
    first, second = f"{prefix}_a", f"{prefix}_b"
    with RemotingClient(timeout=15) as client:
        own_cluster.create_topic(client, first, QUEUES)
    sent = _send(own_cluster, first, 2, "start")
    q, sink = _stream(spark, own_cluster, None, tmp_path, topicPattern=f"{prefix}_.*")
    b_started = False
    try:
        wait_alive(q, "the first messages never reached the sink", lambda: set(sink_bodies(sink)) == sent)
        changes = []
        with RemotingClient(timeout=15) as client:
            a = own_cluster.brokers["broker-a"].addr
            rq.create_topic(client, a, first, read_queues=QUEUES + 2)            # more queues
            _routed(own_cluster, first, {"broker-a": QUEUES + 2})
            new_queue = {f"{first}-q{QUEUES + 1}-{i}".encode() for i in range(3)}
            for body in new_queue:
                rq.send_message(client, a, first, body, queue_id=QUEUES + 1)
            changes.append(("a queue added", new_queue))
            own_cluster.create_topic(client, second, QUEUES)                     # a new topic
            changes.append(("a new matching topic", _send(own_cluster, second, 2, "new-topic")))
        _second_broker(own_cluster, tmp_path)                                     # a broker added
        b_started = True
        with RemotingClient(timeout=15) as client:
            own_cluster.create_topic(client, first, QUEUES, broker="broker-b")
        _routed(own_cluster, first, {"broker-a": QUEUES + 2, "broker-b": QUEUES})
        changes.append(("a broker added", _send(own_cluster, first, 2, "added", "broker-b")))
        for what, bodies in changes:
            sent |= bodies
            wait_alive(q, f"{what}: its messages never reached the sink",
                      lambda: bodies <= set(sink_bodies(sink)))
        rows = sink_bodies(sink)
        assert set(rows) == sent and len(rows) == len(sent), "a message missing or read twice"
    finally:
        q.stop()
        if b_started:
            own_cluster.stop_broker("broker-b", graceful=False)   # a throwaway broker


class _Producer(threading.Thread):
    """Sends numbered messages to the queues of both brokers until stopped, going round the
    brokers that answer (as a producer does: a send that fails goes to the other broker). A send
    whose answer never came may still be stored: its body is kept in ``unsure`` and never sent
    again, so each body names one message. Every 25 messages also writes a file of rows for the
    sink stream's source."""

    def __init__(self, cluster, topic: str, rows_dir):
        super().__init__(daemon=True)
        self.cluster, self.topic, self.rows_dir = cluster, topic, rows_dir
        self.sent: set[bytes] = set()
        self.unsure: set[bytes] = set()
        self.rows: set[str] = set()
        self.per_broker = {"broker-a": 0, "broker-b": 0}
        self.halt = threading.Event()
        self.mutex = threading.Lock()

    def snapshot(self) -> set[bytes]:
        with self.mutex:
            return set(self.sent)

    def run(self) -> None:
        n = 0
        pending: list[str] = []
        with RemotingClient(timeout=3) as client:
            while not self.halt.is_set():
                broker = ("broker-a", "broker-b")[n % 2]
                for name in (broker, "broker-b" if broker == "broker-a" else "broker-a"):
                    body = f"m{n}-{name}".encode()
                    n += 1
                    try:
                        rq.send_message(client, self.cluster.brokers[name].addr, self.topic, body,
                                        queue_id=n % QUEUES, tags="t")
                    except RmqRemotingError:
                        with self.mutex:
                            self.unsure.add(body)
                        continue
                    with self.mutex:
                        self.sent.add(body)
                        self.per_broker[name] += 1
                    break
                else:
                    time.sleep(0.2)           # neither broker answers
                pending.append(f"row{n}")
                if len(pending) == 25:
                    path = self.rows_dir / f"rows-{n}.json"
                    tmp = self.rows_dir / f".rows-{n}.tmp"
                    tmp.write_text("".join(f'{{"body": "{r}"}}\n' for r in pending))
                    tmp.rename(path)
                    self.rows.update(pending)
                    pending = []
                time.sleep(0.01)


@pytest.mark.lines("5.3")      # (4.9: test_broker_killed_and_restarted_under_a_streaming_group_query)
def test_broker_restarts_are_ridden_out_by_every_kind_of_stream(spark, own_cluster, tmp_path):
    """With default options, a producer sending throughout: broker-b SIGKILLed and down for 20 s
    (longer than the requests' retries, about 15 s, so broker-b is "away" to the planning),
    then restarted; then broker-a stopped cleanly (it leaves the routes) and restarted. An ordered group query, an unordered
    one, a query without a group and a sink stream all go on: every message exactly once in each
    read sink, every row of the sink stream in its topic, both groups' offsets at the queues' ends
    on both brokers."""
    _second_broker(own_cluster, tmp_path)
    try:
        topic = _topic(own_cluster, ("broker-a", "broker-b"))
        sink_topic = _topic(own_cluster, ("broker-a", "broker-b"))
        rows_dir = tmp_path / "rows"
        rows_dir.mkdir()
        producer = _Producer(own_cluster, topic, rows_dir)
        producer.start()
        groups = {"ordered": f"Ordered_{uuid.uuid4().hex[:6]}", "unordered": f"Unordered_{uuid.uuid4().hex[:6]}"}
        reads = body_streams(spark, tmp_path, own_cluster.namesrv_addr, topic, {
            "ordered": {"consumerGroup": groups["ordered"], "groupStatePath": str(tmp_path / "state-ordered")},
            "unordered": {"consumerGroup": groups["unordered"], "orderly": "false",
                          "groupStatePath": str(tmp_path / "state-unordered")},
            "no group": {}})
        sink_stream = rows_stream(spark, rows_dir, own_cluster.namesrv_addr, sink_topic, tmp_path / "chk-sink")
        queries = [q for q, _ in reads.values()] + [sink_stream]

        def all_alive() -> None:
            for q in queries:
                assert q.exception() is None, q.exception()

        def read_past(bodies: set[bytes], what: str, timeout: float = 240) -> None:
            """Wait until every read sink holds ``bodies``."""
            for kind, (q, sink) in reads.items():
                wait_alive(q, f"{kind}: {what}", lambda: (all_alive(), bodies <= set(sink_bodies(sink)))[1],
                          timeout)

        try:
            read_past(_wait_sent(producer, 200), "the first messages never arrived")
            killed_at = time.monotonic()
            own_cluster.brokers["broker-b"].kill()                     # SIGKILL
            # a batch planned before the kill waits for broker-b (its offsets are logged); the
            # batches after it leave broker-b out
            during = _wait_sent(producer, producer.per_broker["broker-a"] + 200, "broker-a")
            while time.monotonic() - killed_at < 20:                   # an outage of 20 s at least
                all_alive()
                time.sleep(0.5)
            own_cluster.start_broker("broker-b")                       # same port and store
            read_past(during, "broker-a's messages sent while broker-b was away never arrived")
            read_past(_wait_sent(producer, producer.per_broker["broker-b"] + 100, "broker-b"),
                      "broker-b's queues did not go on after its restart")
            own_cluster.stop_broker("broker-a")                        # a clean restart of the other
            own_cluster.start_broker("broker-a")
            read_past(_wait_sent(producer, producer.per_broker["broker-a"] + 100, "broker-a"),
                      "broker-a's queues did not go on after its restart")
            producer.halt.set()
            producer.join(30)
            sent, unsure = set(producer.sent), set(producer.unsure)
            read_past(sent, "not every message sent reached the sink")
            for kind, (q, sink) in reads.items():
                rows = sink_bodies(sink)
                assert len(rows) == len(set(rows)), f"{kind}: a message reached the sink twice"
                assert set(rows) - sent <= unsure, f"{kind}: rows nobody sent"
            wait_alive(sink_stream, "the sink stream did not deliver every row",
                      lambda: producer.rows <= topic_bodies(spark, own_cluster.namesrv_addr, sink_topic), 240)
            with RemotingClient(timeout=15) as client:
                ends = {(b, i): rq.max_offset(client, own_cluster.brokers[b].addr, topic, i)
                        for b in ("broker-a", "broker-b") for i in range(QUEUES)}
                for kind, group in groups.items():
                    deadline = time.monotonic() + 60
                    while {(b, i): rq.query_consumer_offset(client, own_cluster.brokers[b].addr, group,
                                                            topic, i) for b, i in ends} != ends:
                        all_alive()
                        assert time.monotonic() < deadline, f"{kind}: the group's offsets never reached the ends"
                        time.sleep(0.5)
        finally:
            producer.halt.set()
            for q in queries:
                q.stop()
    finally:
        own_cluster.stop_broker("broker-b", graceful=False)   # a throwaway broker


def _wait_sent(producer: _Producer, count: int, broker: str | None = None, timeout: float = 120) -> set[bytes]:
    """The producer's acknowledged messages once ``broker`` (or both) took ``count`` in all."""
    deadline = time.monotonic() + timeout
    while (producer.per_broker[broker] if broker else sum(producer.per_broker.values())) < count:
        assert producer.is_alive() and time.monotonic() < deadline, f"{broker or 'the brokers'} took no {count} messages"
        time.sleep(0.2)
    return producer.snapshot()
