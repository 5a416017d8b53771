"""A streaming query and a Java push consumer in one consumer group, the Java consumer failing
some messages once (RocketMQ 4.9.x and 5.3.x).

A Java push consumer sends a message its listener fails back to the broker, which stores it, after
the retry delay, in the group's retry topic ``%RETRY%<group>``; every clustering member
subscribes that topic and the group's rebalance allocates its queues over the group's consumer
list, where the query is listed too. So a retry queue may fall to the query: it must serve it
(docs/semantics.md "Consumer groups with Java consumers"), or the retried messages stay there.
The cases put the query's client id before and after the Java consumer's, so that the retry
queue is the query's or the Java consumer's; every message sent must be consumed once in all,
and a retried one by whoever owns the retry queue.
"""
from __future__ import annotations

import subprocess
import time
import uuid
from dataclasses import dataclass, field

import pyarrow.parquet as pq
import pytest

from fault_helpers.queries import wait_alive
from fault_helpers.sinks import committed_files
from rmq_source.group.allocation import MessageQueue, create_strategy
from rmq_source.group.membership import java_sorted
from rmq_source.group.retry import retry_topic
from rmq_source.remote import RemotingClient
from rmq_source.remote import requests as rq

pytestmark = [pytest.mark.broker, pytest.mark.spark]

QUEUES, MESSAGES, FAIL_EVERY = 4, 48, 3   # (3: failures on every queue)

# A Java push consumer (concurrent listener, AVG) of args[1] (comma-separated topics) in group
# args[2]: prints its client id, then every message it consumed, and fails (RECONSUME_LATER,
# retry after 1 s) once each message "m-<n>" with n a multiple of args[4], until the stop file
# args[3] appears.
JAVA_RETRYING_MEMBER = r"""
import java.io.File;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueAveragely;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;

public class RetryingMember {
    public static void main(String[] args) throws Exception {
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(args[2]);
        c.setNamesrvAddr(args[0]);
        c.setInstanceName("java-" + System.nanoTime());
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.setPersistConsumerOffsetInterval(500);
        c.setHeartbeatBrokerInterval(1000);
        c.setAllocateMessageQueueStrategy(new AllocateMessageQueueAveragely());
        for (String t : args[1].split(",")) c.subscribe(t, "*");
        final int failEvery = Integer.parseInt(args[4]);
        c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                String body = new String(m.getBody());
                synchronized (System.out) {
                    if (body.startsWith("m-") && Integer.parseInt(body.substring(2)) % failEvery == 0
                            && m.getReconsumeTimes() == 0) {
                        System.out.println("FAIL " + body);
                        System.out.flush();
                        ctx.setDelayLevelWhenNextConsume(1);      // back in the retry topic after 1 s
                        return ConsumeConcurrentlyStatus.RECONSUME_LATER;
                    }
                    System.out.println("MSG " + body + " " + m.getReconsumeTimes() + " " + m.getTopic());
                    System.out.flush();
                }
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        c.start();
        System.out.println("STARTED " + c.buildMQClientId());
        System.out.flush();
        File stop = new File(args[3]);
        while (!stop.exists()) Thread.sleep(100);
        c.shutdown();
        System.out.println("DONE");
    }
}
"""

# the Java client rebalances every 20 s by default; the test's members should agree sooner
JAVA_PROPS = {"rocketmq.client.rebalance.waitInterval": 1000}


@dataclass
class Case:
    """One group: a Java member and a query (both AVG), the query's client id sorting ``order``
    of the Java one's, both subscribing ``topics`` topics."""

    order: str
    topics: int
    name: str = ""
    group: str = ""
    topic_names: list = field(default_factory=list)
    client_id: str = ""
    java: subprocess.Popen | None = None
    query: object = None

    def __post_init__(self):
        self.name = f"query-{self.order}-{self.topics}-topic"
        tag = uuid.uuid4().hex[:6]
        self.group = f"RetryGroup_{tag}"
        self.topic_names = [f"Retry{i}_{tag}" for i in range(self.topics)]
        self.client_id = ("0" if self.order == "first" else "z") + f"query-{tag}"


# AVG gives the one retry queue to the first client id: the query owns it, and so reads the
# retried messages, or not; two topics show each topic split as RocketMQ's clients split it.
# Which member another strategy gives the retry queue is its allocation's answer, checked
# against RocketMQ's own in test_allocation.py (the query reads whatever it is given).
CASES = [("first", 2), ("last", 1)]


def test_retried_messages_reach_whoever_owns_the_retry_queue(spark, rocketmq, tmp_path):
    """Two groups (the cases above), each a Java consumer failing every
    ``FAIL_EVERY``-th message once and a query: once the group is settled, every message sent is
    consumed exactly once in all, and each retried one by the member RocketMQ's allocation gives
    the retry queue (the query: as a row of ``%RETRY%<group>`` with ``RETRY_TOPIC`` and
    ``reconsumeTimes`` 1)."""
    from test_broker_stores import java_command
    cluster, broker = rocketmq, rocketmq.brokers["broker-a"]
    cases = [Case(order, topics) for order, topics in CASES]
    with RemotingClient(timeout=15) as client:
        try:
            for case in cases:             # (one at a time: fewer Spark workers starting at once)
                folder = tmp_path / case.name
                folder.mkdir()
                for topic in case.topic_names:
                    cluster.create_topic(client, topic, QUEUES)
                cmd = java_command(cluster, tmp_path, "RetryingMember", ",".join(case.topic_names), case.group,
                                   str(folder / "stop"), str(FAIL_EVERY),
                                   sources={"RetryingMember": JAVA_RETRYING_MEMBER}, system_props=JAVA_PROPS)
                with (folder / "java.out").open("w") as out:
                    case.java = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
                case.query = (spark.readStream.format("rmq")
                              .options(namesrvAddr=cluster.namesrv_addr, topic=",".join(case.topic_names),
                                       consumerGroup=case.group, clientId=case.client_id, orderly="false",
                                       consumeFromWhere="CONSUME_FROM_FIRST_OFFSET")
                              .load().select("topic", "body", "reconsumeTimes", "properties")
                              .writeStream.format("parquet").option("path", str(folder / "sink"))
                              .option("checkpointLocation", str(folder / "chk"))
                              .trigger(processingTime="500 milliseconds").start())
                _settle(case, client, broker.addr, folder)
            for case in cases:
                _send(client, broker.addr, case, "m", MESSAGES)
            for case in cases:
                _check(case, client, broker.addr, tmp_path / case.name)
        finally:
            for case in cases:
                if case.query is not None:
                    case.query.stop()
                if case.java is not None:
                    (tmp_path / case.name / "stop").touch()
            for case in cases:
                if case.java is not None:
                    try:
                        case.java.wait(30)
                    except subprocess.TimeoutExpired:
                        case.java.kill()


def _send(client, broker: str, case: Case, prefix: str, count: int) -> None:
    """``count`` messages ``<prefix>-<n>`` spread over every queue of every topic of ``case``."""
    queues = [(t, q) for t in case.topic_names for q in range(QUEUES)]
    for n in range(count):
        topic, q = queues[n % len(queues)]
        rq.send_message(client, broker, topic, f"{prefix}-{n}".encode(), queue_id=q, tags="t")


def _java_lines(folder, kind: str) -> list[list[str]]:
    return [line.split()[1:] for line in (folder / "java.out").read_text().splitlines()
            if line.startswith(kind + " ")]


def _consumed(folder) -> tuple[list[dict], list[list[str]]]:
    """(the query's committed rows, the Java consumer's successful consumptions)."""
    rows = [row for p in committed_files(folder / "sink")
            for row in pq.read_table(p).to_pylist()]
    return rows, _java_lines(folder, "MSG")


def _settle(case: Case, client, broker: str, folder) -> None:
    """Wait until both members are in the group and each consumes its own queues: rounds of
    warm-up messages (never failed) until one round is consumed, by both, each message once."""
    deadline = time.monotonic() + 120
    while len(cids := rq.consumer_list(client, broker, case.group)) < 2:
        assert case.java.poll() is None, (folder / "java.out").read_text()[-3000:]
        assert case.query.exception() is None, f"{case.name}: {case.query.exception()}"
        assert time.monotonic() < deadline, f"{case.name}: the group's members: {cids}"
        time.sleep(0.5)
    assert (java_sorted(cids)[0] == case.client_id) == (case.order == "first"), cids
    for round_ in range(30):
        prefix = f"w{round_}"
        _send(client, broker, case, prefix, QUEUES * case.topics)
        wanted = {f"{prefix}-{n}" for n in range(QUEUES * case.topics)}

        def by_member():
            rows, java = _consumed(folder)
            return ([r["body"].decode() for r in rows if r["body"].decode() in wanted],
                    [f[0] for f in java if f[0] in wanted])
        wait_alive(case.query, f"{case.name}: warm-up round {round_} was not consumed",
                   lambda: set(sum(by_member(), [])) >= wanted, 60)
        query, java = by_member()
        if query and java and len(query) + len(java) == len(wanted):
            return
        assert time.monotonic() < deadline, f"{case.name}: the group never settled"
    raise AssertionError(f"{case.name}: the group never settled")


def _check(case: Case, client, broker: str, folder) -> None:
    bodies = {f"m-{n}" for n in range(MESSAGES)}
    retry = retry_topic(case.group)

    def sent_ones():
        rows, java = _consumed(folder)
        return ([r for r in rows if r["body"].decode() in bodies], [f for f in java if f[0] in bodies])
    wait_alive(case.query, f"{case.name}: not every message was consumed",
               lambda: {r["body"].decode() for r in sent_ones()[0]} | {f[0] for f in sent_ones()[1]} >= bodies,
               120)
    rows, java = sent_ones()
    got = [r["body"].decode() for r in rows] + [f[0] for f in java]
    assert sorted(got) == sorted(bodies), f"{case.name}: consumed twice: {sorted(b for b in got if got.count(b) > 1)}"
    failed = {f[0] for f in _java_lines(folder, "FAIL")}
    assert failed, f"{case.name}: the Java consumer failed no message"
    assert failed <= {f"m-{n}" for n in range(0, MESSAGES, FAIL_EVERY)}
    # the owner of the retry queue, as RocketMQ's (and our) allocation says
    cids = java_sorted(rq.consumer_list(client, broker, case.group))
    owner = next(cid for cid in cids if create_strategy("AVG").allocate(
        case.group, cid, [MessageQueue(retry, "broker-a", 0)], cids))
    retried_by_query = {r["body"].decode(): r for r in rows if r["body"].decode() in failed}
    retried_by_java = {f[0]: f for f in java if f[0] in failed}
    if owner == case.client_id:
        assert set(retried_by_query) == failed, case.name
        for r in retried_by_query.values():
            assert r["topic"] == retry and r["reconsumeTimes"] == 1, r
            assert dict(r["properties"])["RETRY_TOPIC"] in case.topic_names, r
    else:
        assert set(retried_by_java) == failed, case.name
        assert all(f[1] == "1" and f[2] in case.topic_names for f in retried_by_java.values())
