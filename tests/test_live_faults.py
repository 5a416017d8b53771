"""Faults of a live cluster under the source, with real servers (RocketMQ 4.9.x and 5.3.x).

Each RocketMQ line gets its own NameServer and broker here (the session's are shared by other
tests and must not die): the broker is killed with SIGKILL and restarted on the same port and
store while a streaming query of a consumer group runs; it is frozen (SIGSTOP) to stop answering;
and a query names NameServers where none listens.
"""
from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

from conftest import BROKER_LINES, raises_rmq, running_cluster
from rmq_source.errors import RmqRemotingConnectionError, RmqRemotingTimeoutError
from rmq_source.remote import RemotingClient
from rmq_source.remote import requests as rq

pytestmark = [pytest.mark.broker, pytest.mark.spark]

QUEUES = 4


@pytest.fixture(scope="module", params=BROKER_LINES, ids=lambda line: f"rocketmq-{line}")
def own_cluster(request, rocketmq_jars, tmp_path_factory):
    with running_cluster(rocketmq_jars, request.param, tmp_path_factory, "faults") as cluster:
        yield cluster


def _topic(cluster) -> str:
    name = f"Fault_{uuid.uuid4().hex[:8]}"
    with RemotingClient(timeout=15) as client:
        cluster.create_topic(client, name, QUEUES)
    return name


def _send(cluster, topic: str, per_queue: int, tag: str) -> set[bytes]:
    broker = cluster.brokers["broker-a"]
    bodies = set()
    with RemotingClient(timeout=15) as client:
        for q in range(QUEUES):
            for i in range(per_queue):
                body = f"{tag}-{q}-{i}".encode()
                rq.send_message(client, broker.addr, topic, body, queue_id=q, tags="t")
                bodies.add(body)
    return bodies


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
            if not (sink / "_spark_metadata").is_dir():
                return []
            return [bytes(r.body) for r in spark.read.schema("body binary").parquet(str(sink)).collect()]

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
