"""Pulls from a slave when the master suggests it, with real servers (RocketMQ 4.9.x and 5.3.x).

A master and its slave of ``broker-a`` run with ``slaveReadEnable=true`` and
``accessMessageInMemoryMaxRatio=0``: every message then counts as out of the master's memory, so
each pull answer suggests the slave (``suggestWhichBrokerId=1``), as a consumer far behind is told
in production. Reads must follow the suggestion and still give every message once, in order; a
slave that is gone sends the pulls back to the master.
"""
from __future__ import annotations

import time
import uuid

import pytest

from conftest import BROKER_LINES, distinct_timeout, running_cluster
from fault_helpers.queries import wait_alive
from fault_helpers.sinks import body_streams, sink_bodies
from rmq_source.errors import RmqRemotingError
from rmq_source.remote import RemotingClient
from rmq_source.remote import native_pull
from rmq_source.remote import requests as rq
from rmq_source.remote.backend import ClusterBackendSpec
from rmq_source.group.allocation import MessageQueue
from rocketmq_cluster import send_numbered

pytestmark = [pytest.mark.broker]

QUEUES, PER_QUEUE = 2, 150
SLAVE_READ = {"slaveReadEnable": "true", "accessMessageInMemoryMaxRatio": 0}


@pytest.fixture(scope="module", params=BROKER_LINES, ids=lambda line: f"rocketmq-{line}")
def ha_cluster(request, rocketmq_jars, tmp_path_factory):
    with running_cluster(rocketmq_jars, request.param, tmp_path_factory, "slave",
                         broker_kw={"extra": SLAVE_READ}) as cluster:
        cluster.start_broker("broker-a", broker_id=1)
        yield cluster


@pytest.fixture(scope="module")
def filled(ha_cluster):
    """One topic filled and replicated for the module's tests (each reads it whole with a backend
    of its own): a new topic reaches a 4.9 slave only at its next config sync (every 10 s)."""
    return _fill(ha_cluster)


def _fill(cluster, broker: str = "broker-a", queues: int = QUEUES, per_queue: int = PER_QUEUE
          ) -> tuple[str, dict[int, list[bytes]]]:
    """A new topic on ``broker`` with ``per_queue`` messages a queue, replicated to its slave
    (its max offsets and a pull answered by it)."""
    topic = f"Slave_{uuid.uuid4().hex[:8]}"
    master, slave = cluster.brokers[broker].addr, cluster.brokers[f"{broker}-slave1"].addr
    sent: dict[int, list[bytes]] = {}
    with RemotingClient(timeout=15) as client:
        cluster.create_topic(client, topic, queues, broker=broker)
        # the slave copies topic configs from its master only now and then (5.3: not for a minute
        # at times); until then it answers "topic not exist", which sends pulls to the master.
        # 5.3 takes the topic directly; 4.9 refuses writes on a slave (and syncs every 10 s).
        if not cluster.brokers[broker].is_v4:
            rq.create_topic(client, slave, topic, read_queues=queues)
        for q in range(queues):
            sent[q] = send_numbered(client, master, topic, q, 0, per_queue)
        deadline = time.monotonic() + 60
        for q in range(queues):
            while True:
                try:
                    if (rq.max_offset(client, slave, topic, q) >= per_queue
                            and rq.pull(client, slave, "slave_probe", topic, q, 0).found):
                        break
                except RmqRemotingError:       # not replicated yet
                    pass
                assert time.monotonic() < deadline, f"queue {q} never reached the slave"
                time.sleep(0.5)
    return topic, sent


class _Spy:
    """The addresses pulls were sent to (the servers still answer every one), by the Python
    client or by the C core."""

    def __init__(self, monkeypatch):
        self.addrs: list[str] = []
        for name in ("pull", "send_pull"):
            real = getattr(rq, name)
            monkeypatch.setattr(rq, name, self._wrap(real))

        real_next = native_pull.NativePuller.next

        def next_piece(puller, *args, **kw):    # pulls of the C core: one entry per answer
            item = real_next(puller, *args, **kw)
            if item is not None:
                self.addrs.extend([puller.addr] * getattr(item, "answers", 1))
            return item
        monkeypatch.setattr(native_pull.NativePuller, "next", next_piece)
        real_init = native_pull.NativePuller.__init__

        def connect(puller, addr, **kw):      # a connection tried (a slave that is gone fails here)
            self.addrs.append(addr)
            real_init(puller, addr, **kw)
        monkeypatch.setattr(native_pull.NativePuller, "__init__", connect)

    def _wrap(self, real):
        def call(client, addr, *args, **kw):
            self.addrs.append(addr)
            return real(client, addr, *args, **kw)
        return call




def _backend(cluster, in_flight: int, native: bool = True):
    # a timeout of its own: a backend not shared with other tests (it caches routes and pooled
    # connections); a counter, as random values collide within a session
    return ClusterBackendSpec((cluster.namesrv_addr,), distinct_timeout(5.0),
                              pulls_in_flight=in_flight, retries=1, retry_backoff_s=0.1,
                              native_pulls=native).open()


def _read_all(backend, topic, subscription: str = "*") -> dict[int, list[bytes]]:
    got = {}
    for q in range(QUEUES):
        mq = MessageQueue(topic, "broker-a", q)
        info = backend.infos([mq])[mq]
        got[q] = [body for batch in backend.read(
            mq, info.min_offset, info.max_offset, subscription=subscription, batch_rows=64,
            batch_bytes=1 << 20, verify_crc=True,
            on_data_loss=lambda *a: pytest.fail(f"data loss {a}"),
            on_short_read=lambda *a: pytest.fail(f"short read {a}"))
            for body in batch.column("body").to_pylist()]
    return got


@pytest.mark.parametrize("native", [True, False], ids=["c-pulls", "python-pulls"])
@pytest.mark.parametrize("in_flight,subscription", [(4, "*"), (1, "*"), (4, "a")],
                         ids=["pipelined", "one-at-a-time", "filtered"])
def test_pulls_follow_the_masters_suggestion_to_the_slave(ha_cluster, filled, monkeypatch, in_flight,
                                                           subscription, native):
    topic, sent = filled
    if subscription == "a":
        sent = {q: bodies[::2] for q, bodies in sent.items()}
    spy = _Spy(monkeypatch)
    assert _read_all(_backend(ha_cluster, in_flight, native), topic, subscription) == sent
    master, slave = ha_cluster.brokers["broker-a"].addr, ha_cluster.brokers["broker-a-slave1"].addr
    assert spy.addrs[0] == master, "the first pull of a queue goes to the master"
    assert spy.addrs.count(slave) > len(spy.addrs) // 2, spy.addrs


@pytest.mark.parametrize("native", [True, False], ids=["c-pulls", "python-pulls"])
def test_a_slave_that_is_gone_sends_the_pulls_back_to_the_master(ha_cluster, filled, monkeypatch, native):
    topic, sent = filled
    backend = _backend(ha_cluster, 4, native)
    backend.route(topic)                     # it knows the slave's address
    slave = ha_cluster.brokers["broker-a-slave1"]
    slave.kill()
    try:
        spy = _Spy(monkeypatch)
        assert _read_all(backend, topic) == sent
        assert ha_cluster.brokers["broker-a"].addr in spy.addrs
        assert slave.addr in spy.addrs, "the master still suggested its slave"
    finally:
        ha_cluster.start_broker("broker-a", broker_id=1)


FAILOVER_QUEUES, BEFORE, AFTER = 4, 100, 40


@pytest.fixture(scope="module")
def failover_pair(ha_cluster):
    """broker-f on the module's NameServer: a master and its slave with ``slaveReadEnable`` and
    the default memory ratio (the master serves the pulls until it dies)."""
    extra = {"slaveReadEnable": "true"}
    ha_cluster.start_broker("broker-f", extra=extra)
    ha_cluster.start_broker("broker-f", broker_id=1, extra=extra)
    return ha_cluster


@pytest.mark.lines("5.3")      # (both lines: the slave reads of the pulls tests above)
def test_a_dead_master_leaves_reads_and_group_streams_to_its_slave(failover_pair, spark, tmp_path):
    """broker-f's master SIGKILLed under a stream without a group, an unordered and an ordered
    group stream: the first two go on from the slave (statistics, pulls, the group's heartbeats
    and commits), the ordered one waits for the master's queue locks without failing; a batch
    read during the outage reads everything from the slave. The master comes back on its store
    and the streams go on with what it gets next. Every message exactly once in each sink, and
    both groups' offsets on the master at the queues' ends (the slave took them meanwhile)."""
    cluster = failover_pair
    topic, sent = _fill(cluster, "broker-f", FAILOVER_QUEUES, BEFORE)
    before = {b for bodies in sent.values() for b in bodies}
    group, ordered_group = f"Failover_{uuid.uuid4().hex[:8]}", f"FailoverOrdered_{uuid.uuid4().hex[:8]}"
    streams = body_streams(spark, tmp_path, cluster.namesrv_addr, topic, {
        kind: {"maxMessagesPerTrigger": "40", **options} for kind, options in (
            ("no-group", {}), ("unordered", {"consumerGroup": group, "orderly": "false"}),
            ("ordered", {"consumerGroup": ordered_group}))})
    queries = [q for q, _ in streams.values()]
    try:
        for kind, (q, sink) in streams.items():
            wait_alive(queries, f"{kind}: no first batch", lambda: sink_bodies(sink), 180)
        read_before = {kind: len(sink_bodies(sink)) for kind, (q, sink) in streams.items()}
        cluster.brokers["broker-f"].kill()                          # SIGKILL the master
        try:
            # 40 messages a second at most: each stream had messages of the 400 still to read
            assert all(n < len(before) for n in read_before.values()), read_before
            got = [bytes(r.body) for r in spark.read.format("rmq").options(
                namesrvAddr=cluster.namesrv_addr, topic=topic).load().select("body").collect()]
            assert sorted(got) == sorted(before), "a batch read while the master is away"
            for kind, (q, sink) in streams.items():
                if kind != "ordered":   # (it needs the master's queue locks: it waits, alive)
                    wait_alive(queries, f"{kind}: the slave's messages never all arrived",
                          lambda: set(sink_bodies(sink)) >= before, 180)
        finally:
            cluster.start_broker("broker-f")                       # same port and store
        with RemotingClient(timeout=15) as client:
            master = cluster.brokers["broker-f"].addr
            after = {b for q in range(FAILOVER_QUEUES)
                     for b in send_numbered(client, master, topic, q, BEFORE, AFTER)}
            for kind, (q, sink) in streams.items():
                wait_alive(queries, f"{kind}: the master's new messages never arrived",
                      lambda: set(sink_bodies(sink)) >= before | after, 180)
                rows = sink_bodies(sink)
                assert len(rows) == len(set(rows)) == len(before | after), f"{kind}: read twice"
            ends = {q: BEFORE + AFTER for q in range(FAILOVER_QUEUES)}
            for g in (group, ordered_group):
                wait_alive(queries, f"{g}: the group's offsets on the master never reached the queues' ends",
                      lambda: {q: rq.query_consumer_offset(client, master, g, topic, q)
                               for q in ends} == ends, 180)
    finally:
        for q in queries:
            q.stop()
