"""Two Spark queries and a Java orderly push consumer in one consumer group on real brokers
(RocketMQ 4.9.x and 5.3.x), members coming and going.

Every member consumes under the broker's queue locks (``orderly=true`` for the queries,
``MessageListenerOrderly`` for Java). Each consumption is recorded with its member and its time
span (a query: its batch's read, from the start to the end of ``foreachBatch``'s collect; Java:
each message's listener call). Across the life of the group the test checks, per queue:

* every message sent is consumed;
* no two members consume a queue at the same time (their spans never overlap);
* a member's run over a queue is consecutive offsets, and the next member starts at most where
  it stopped (no gap);
* a message is consumed twice only where the queue passed from a member that left (a query
  stopped before its last batch's progress was written) or died (the Java consumer, SIGKILL).

The brokers here keep a lock 15 s after its last renewal (instead of 60 s) so the queues of the
killed consumer move in the test's time; every client's lease is shorter, as RocketMQ requires.
"""
from __future__ import annotations

import subprocess
import threading
import time
import uuid
from collections import defaultdict

import pytest

from conftest import BROKER_LINES, running_cluster
from rmq_source.remote import RemotingClient
from rmq_source.remote import requests as rq

pytestmark = [pytest.mark.broker, pytest.mark.spark]

QUEUES = 8
BROKER_LOCK_MS = 15000
JAVA = "java"
SPARK_1, SPARK_2 = "spark-1", "spark-2"

# A Java orderly push consumer: prints its client id, then every message it consumes with the
# time span of the listener call, until the stop file appears (then it shuts down cleanly).
JAVA_ORDERLY_MEMBER = r"""
import java.io.File;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;

public class OrderlyMember {
    public static void main(String[] args) throws Exception {
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(args[2]);
        c.setNamesrvAddr(args[0]);
        c.setInstanceName("java-orderly-" + System.nanoTime());
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.setPersistConsumerOffsetInterval(500);
        c.setHeartbeatBrokerInterval(1000);
        c.subscribe(args[1], "*");
        c.registerMessageListener((MessageListenerOrderly) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                long t0 = System.currentTimeMillis();
                try { Thread.sleep(3); } catch (InterruptedException e) { }
                long t1 = System.currentTimeMillis();
                synchronized (System.out) {
                    System.out.println("MSG " + m.getQueueId() + " " + m.getQueueOffset() + " " + t0 + " " + t1);
                    System.out.flush();
                }
            }
            return ConsumeOrderlyStatus.SUCCESS;
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

# the Java client's own lock lease and renewal must fit in the broker's
JAVA_PROPS = {"rocketmq.client.rebalance.lockMaxLiveTime": 10000,
              "rocketmq.client.rebalance.lockInterval": 2000,
              "rocketmq.client.rebalance.waitInterval": 2000,
              "rocketmq.client.unlockDelayTimeMills": 2000}


@pytest.fixture(scope="module", params=BROKER_LINES, ids=lambda line: f"rocketmq-{line}")
def group_cluster(request, rocketmq_jars, tmp_path_factory):
    kw = {"system_props": {"rocketmq.broker.rebalance.lockMaxLiveTime": BROKER_LOCK_MS}}
    with running_cluster(rocketmq_jars, request.param, tmp_path_factory, "members",
                         broker_kw=kw) as cluster:
        yield cluster


class Consumptions:
    """(member, queueId, queueOffset, span start ms, span end ms) of every consumption. A query's
    batch re-run after a restart replaces the earlier record of that batch (as a foreachBatch
    sink keyed by batch id would)."""

    def __init__(self):
        self._batches: dict[tuple[str, int], list] = {}
        self._lock = threading.Lock()

    def recorder(self, member: str):
        def on_batch(df, batch_id):
            t0 = time.time() * 1000
            rows = df.select("queueId", "queueOffset").collect()
            t1 = time.time() * 1000
            with self._lock:
                self._batches[(member, batch_id)] = [(member, r.queueId, r.queueOffset, t0, t1)
                                                     for r in rows]
        return on_batch

    def events(self, java_out) -> list[tuple]:
        with self._lock:
            out = [e for rows in self._batches.values() for e in rows]
        for line in java_out.read_text().splitlines():
            if line.startswith("MSG "):
                q, o, t0, t1 = map(int, line.split()[1:])
                out.append((JAVA, q, o, t0, t1))
        return out


def _query(spark, cluster, topic, group, member, tmp_path, record: Consumptions):
    return (spark.readStream.format("rmq")
            .options(namesrvAddr=cluster.namesrv_addr, topic=topic, consumerGroup=group,
                     clientId=member, orderly="true", startingOffsets="group",
                     consumeFromWhere="CONSUME_FROM_FIRST_OFFSET",
                     groupStatePath=str(tmp_path / "state"), lockLeaseMs=str(BROKER_LOCK_MS),
                     clientLockLeaseMs="10000", lockRenewIntervalMs="1000", requestTimeoutMs="5000")
            .load().writeStream.foreachBatch(record.recorder(member))
            .option("checkpointLocation", str(tmp_path / f"chk-{member}"))
            .trigger(processingTime="500 milliseconds").start())


def check_group_history(events, sent: set[tuple[int, int]], may_repeat: set[str]) -> None:
    """The module's four checks over ``events``; ``may_repeat``: members whose last messages of a
    queue another member may consume again (they left before writing that progress, or died)."""
    consumed = {(q, o) for _, q, o, _, _ in events}
    missing = sorted(sent - consumed)
    assert not missing, f"{len(missing)} message(s) never consumed, e.g. {missing[:5]}"
    by_queue = defaultdict(list)
    for member, q, o, t0, t1 in events:
        by_queue[q].append((t0, o, t1, member))
    for q, evs in sorted(by_queue.items()):
        evs.sort()
        runs: list[list] = []      # [member, first offset, last offset, span start, span end]
        for t0, o, t1, member in evs:
            if runs and runs[-1][0] == member:
                run = runs[-1]
                assert o == run[2] + 1, (f"queue {q}: {member} consumed offset {o} after {run[2]} "
                                         "in one run (a message skipped or repeated)")
                run[2], run[4] = o, max(run[4], t1)
            else:
                runs.append([member, o, o, t0, t1])
        for before, after in zip(runs, runs[1:]):
            assert after[3] >= before[4], (f"queue {q}: {after[0]} consumed from {after[3]:.0f} ms "
                                           f"while {before[0]} did until {before[4]:.0f} ms")
            assert after[1] <= before[2] + 1, (f"queue {q}: {after[0]} started at offset {after[1]}"
                                               f" but {before[0]} stopped at {before[2]}")
            if after[1] <= before[2]:
                assert before[0] in may_repeat, (
                    f"queue {q}: offsets {after[1]}..{before[2]} consumed again by {after[0]} after "
                    f"{before[0]}, which neither left nor died")


@pytest.mark.parametrize("history", [
    # one member's queue runs: a repeat from a member that did not leave is refused
    ([("a", 0, 0, 0, 1), ("a", 0, 1, 1, 2), ("b", 0, 1, 3, 4), ("b", 0, 2, 4, 5)], set(), "neither left"),
    ([("a", 0, 0, 0, 1), ("a", 0, 1, 1, 2), ("b", 0, 1, 3, 4), ("b", 0, 2, 4, 5)], {"a"}, None),
    ([("a", 0, 0, 0, 5), ("b", 0, 1, 3, 6), ("b", 0, 2, 6, 7)], {"a"}, "while a did"),
    ([("a", 0, 0, 0, 1), ("b", 0, 2, 3, 4)], set(), "never consumed"),
    ([("a", 0, 0, 0, 1), ("a", 0, 2, 1, 2), ("a", 0, 1, 2, 3)], set(), "in one run"),
], ids=["repeat-refused", "repeat-after-leaving", "overlap", "gap", "out-of-order"])
def test_history_check_refuses_what_it_must(history):
    events, may_repeat, error = history
    sent = {(0, o) for o in range(3)}
    if error is None:
        check_group_history(events, sent, may_repeat)
    else:
        with pytest.raises(AssertionError, match=error):
            check_group_history(events, sent, may_repeat)


@pytest.mark.lines("5.3")      # (4.9's Java client: tests/test_live_group.py)
def test_two_queries_and_a_java_orderly_consumer_share_a_group(spark, group_cluster, tmp_path):
    from test_broker_stores import java_command
    cluster = group_cluster
    topic = f"Members_{uuid.uuid4().hex[:8]}"
    group = f"MembersGroup_{uuid.uuid4().hex[:6]}"
    broker = cluster.brokers["broker-a"]
    sent: set[tuple[int, int]] = set()
    ends = [0] * QUEUES
    record = Consumptions()
    java_out = tmp_path / "java.out"
    stop_file = tmp_path / "java.stop"

    with RemotingClient(timeout=15) as client:
        cluster.create_topic(client, topic, QUEUES)

        def burst(per_queue: int) -> None:
            for q in range(QUEUES):
                for _ in range(per_queue):
                    rq.send_message(client, broker.addr, topic, b"m", queue_id=q, tags="t")
                    sent.add((q, ends[q]))
                    ends[q] += 1

        def all_consumed(what: str, timeout: float = 120) -> None:
            deadline = time.monotonic() + timeout
            while True:
                for q in queries.values():
                    assert q.exception() is None, q.exception()
                missing = sent - {(q, o) for _, q, o, _, _ in record.events(java_out)}
                if not missing:
                    return
                assert time.monotonic() < deadline, (f"{what}: {len(missing)} message(s) not "
                                                     f"consumed, e.g. {sorted(missing)[:5]}")
                time.sleep(0.5)

        def members() -> set[str]:
            return set(rq.consumer_list(client, broker.addr, group))

        cmd = java_command(cluster, tmp_path, "OrderlyMember", topic, group, str(stop_file),
                           sources={"OrderlyMember": JAVA_ORDERLY_MEMBER}, system_props=JAVA_PROPS)
        with java_out.open("w") as out:
            java = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        queries = {}
        try:
            queries[SPARK_1] = _query(spark, cluster, topic, group, SPARK_1, tmp_path, record)
            queries[SPARK_2] = _query(spark, cluster, topic, group, SPARK_2, tmp_path, record)
            deadline = time.monotonic() + 90
            while len(members()) < 3:
                assert java.poll() is None, java_out.read_text()[-3000:]
                for q in queries.values():      # a query that died never joins: say why
                    assert q.exception() is None, q.exception()
                assert time.monotonic() < deadline, f"the group's members: {members()}"
                time.sleep(0.5)
            # a member gets its queues once the rebalance that counts it has run everywhere (and
            # the Java member released their locks): until then the others consume its share
            deadline = time.monotonic() + 120
            while True:
                burst(3)
                all_consumed("three members")
                per_member = defaultdict(set)
                for member, q, *_ in record.events(java_out):
                    per_member[member].add(q)
                if set(per_member) == {JAVA, SPARK_1, SPARK_2}:
                    break
                assert time.monotonic() < deadline, f"a member never got a queue: {dict(per_member)}"
                time.sleep(2)

            queries.pop(SPARK_2).stop()          # a query leaves
            burst(5)
            all_consumed("after spark-2 left")

            queries[SPARK_2] = _query(spark, cluster, topic, group, SPARK_2, tmp_path, record)
            burst(5)                              # ... and comes back on its checkpoint
            all_consumed("after spark-2 came back")

            java.kill()                           # the Java consumer dies holding its locks
            java.wait(30)
            burst(5)
            all_consumed("after the Java consumer died", timeout=120 + BROKER_LOCK_MS / 1000)
            time.sleep(2)                         # nothing more may arrive: no late duplicate
            for q in queries.values():
                assert q.exception() is None, q.exception()
        finally:
            for q in queries.values():
                q.stop()
            if java.poll() is None:
                stop_file.touch()
                try:
                    java.wait(30)
                except subprocess.TimeoutExpired:
                    java.kill()
    check_group_history(record.events(java_out), sent, may_repeat={JAVA, SPARK_2})
