"""A streaming query as a member of a consumer group on real brokers (RocketMQ 4.9.x and 5.3.x).

The query heartbeats to the broker as a clustering consumer; the broker's consumer list of the
group (with another consumer registered over its own connection) decides which queues it reads,
with RocketMQ's allocation; the committed progress is on the broker (UPDATE_CONSUMER_OFFSET), where
RocketMQ's own ``mqadmin consumerProgress`` shows it; when the other consumer leaves, the query
takes its queues from the group's progress.
"""
from __future__ import annotations

import time
import uuid

import pytest

from rmq_source.remote import RemotingClient
from rmq_source.remote import requests as rq

pytestmark = [pytest.mark.broker, pytest.mark.spark]

QUEUES, PER_QUEUE = 4, 12
# AVG over the sorted client ids [aa-..., zz-...]: the first gets queues 0-1, the second 2-3
SPARK_ID, OTHER_ID = "aa-spark-query", "zz-other-consumer"


@pytest.fixture(scope="module")
def topic(rocketmq):
    name = f"LiveGroup_{uuid.uuid4().hex[:8]}"
    broker = rocketmq.brokers["broker-a"]
    with RemotingClient(timeout=15) as client:
        rocketmq.create_topic(client, name, QUEUES)
        for q in range(QUEUES):
            for i in range(PER_QUEUE):
                rq.send_message(client, broker.addr, name, b"q%d-%d" % (q, i), queue_id=q, tags="t")
        for q in range(QUEUES):
            rq.wait_max_offset(client, broker.addr, name, q, PER_QUEUE)
    return name


def _run(spark, rocketmq, topic, group, tmp_path, **extra):
    """One Trigger.AvailableNow run of the query (one checkpoint and parquet sink across runs);
    the (queueId, queueOffset) it added to the sink."""
    sink = tmp_path / "sink"
    before = _sink_rows(spark, sink)
    reader = spark.readStream.format("rmq")
    for k, v in {"namesrvAddr": rocketmq.namesrv_addr, "topic": topic, "consumerGroup": group,
                 "clientId": SPARK_ID, "startingOffsets": "earliest",
                 "groupStatePath": str(tmp_path / "state"), "lockRenewIntervalMs": "1000", **extra}.items():
        reader = reader.option(k, v)
    q = (reader.load().select("queueId", "queueOffset").writeStream.format("parquet")
         .option("path", str(sink)).option("checkpointLocation", str(tmp_path / "chk"))
         .trigger(availableNow=True).start())
    assert q.awaitTermination(180), "the AvailableNow run did not finish"
    assert q.exception() is None, q.exception()
    after = _sink_rows(spark, sink)
    assert len(after) == len(set(after)), "a message was written twice"
    return set(after) - set(before)


def _sink_rows(spark, sink) -> list[tuple[int, int]]:
    """The rows of the parquet sink's committed batches (read with the schema: a running query's
    sink may have files before its first batch is committed)."""
    if not (sink / "_spark_metadata").is_dir():
        return []
    frame = spark.read.schema("queueId INT, queueOffset LONG").parquet(str(sink))
    return [(r.queueId, r.queueOffset) for r in frame.collect()]


def _progress(client, addr, topic, group) -> dict[int, int | None]:
    return {q: rq.query_consumer_offset(client, addr, group, topic, q) for q in range(QUEUES)}


@pytest.mark.spark42     # (AvailableNow runs: their last batch committed to the group)
def test_a_query_shares_the_queues_with_another_consumer_of_its_group(spark, rocketmq, topic, tmp_path):
    group = f"LiveGroup_{uuid.uuid4().hex[:6]}"
    broker = rocketmq.brokers["broker-a"]
    everything = {(q, o) for q in range(QUEUES) for o in range(PER_QUEUE)}
    with RemotingClient(timeout=15) as other:
        # another consumer of the group, registered over its own connection as a Java one would be
        rq.heartbeat(other, broker.addr, OTHER_ID, consumer_groups={group: [topic]})
        first = _run(spark, rocketmq, topic, group, tmp_path)
        assert first == {(q, o) for q, o in everything if q < 2}, sorted(first)
        progress = _progress(other, broker.addr, topic, group)
        assert progress[0] == progress[1] == PER_QUEUE, progress
        # the other member read nothing: no progress (4.9 answers 0 for a queue starting at 0)
        assert progress[2] in (None, 0) and progress[3] in (None, 0), progress
        # the query left the group when its run ended: only the other consumer is listed
        assert rq.consumer_list(other, broker.addr, group) == [OTHER_ID]

        report = rocketmq.mqadmin("consumerProgress", "-g", group)
        lines = [line for line in report.splitlines() if topic in line]
        assert len(lines) == QUEUES, report[-3000:]
        rq.unregister_consumer(other, broker.addr, OTHER_ID, group)

    # alone now: the query takes queues 2 and 3 from the group's progress (none: from earliest)
    second = _run(spark, rocketmq, topic, group, tmp_path)
    assert second == {(q, o) for q, o in everything if q >= 2}, sorted(second)
    with RemotingClient(timeout=15) as client:
        assert _progress(client, broker.addr, topic, group) == {q: PER_QUEUE for q in range(QUEUES)}


@pytest.mark.spark42     # (AvailableNow runs: their last batch committed to the group)
def test_ordered_query_waits_for_a_queue_another_client_holds_on_the_broker(spark, rocketmq, topic,
                                                                           tmp_path):
    """orderly=true (the default): a queue whose broker lock another client holds is not read
    until that client lets it go; then the same run reads it."""
    import threading
    group = f"LiveLock_{uuid.uuid4().hex[:6]}"
    broker = rocketmq.brokers["broker-a"]
    everything = {(q, o) for q in range(QUEUES) for o in range(PER_QUEUE)}
    with RemotingClient(timeout=15) as holder:
        rq.heartbeat(holder, broker.addr, "holder-not-a-member", consumer_groups={group: [topic]})
        assert rq.lock_batch(holder, broker.addr, group, "holder-not-a-member",
                             [(topic, "broker-a", 0)]) == {(topic, "broker-a", 0)}
        rq.unregister_consumer(holder, broker.addr, "holder-not-a-member", group)  # lock stays
        result: dict = {}
        run = threading.Thread(target=lambda: result.update(rows=_run(spark, rocketmq, topic, group,
                                                                       tmp_path)))
        run.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            progress = _progress(holder, broker.addr, topic, group)
            if all(progress[q] == PER_QUEUE for q in (1, 2, 3)):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"queues 1-3 were never consumed: {progress}")
        time.sleep(3)       # several more plannings: queue 0 stays unread while held
        assert run.is_alive(), "the run ended without queue 0"
        assert _progress(holder, broker.addr, topic, group)[0] in (None, 0)
        rq.unlock_batch(holder, broker.addr, group, "holder-not-a-member", [(topic, "broker-a", 0)])
        run.join(180)
    assert not run.is_alive()
    assert result["rows"] == everything, sorted(everything - result["rows"])[:5]


# A Java push consumer of a group: consumes until it has seen the number of messages asked for
# (printing each queue and offset), waits a little for more (none may come), and shuts down,
# which commits its progress to the broker.
JAVA_GROUP_CONSUMER = r"""
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;

public class GroupConsume {
    public static void main(String[] args) throws Exception {
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(args[2]);
        c.setNamesrvAddr(args[0]);
        c.setInstanceName("rmq-java-" + System.nanoTime());
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.setPersistConsumerOffsetInterval(500);
        c.subscribe(args[1], "*");
        CountDownLatch left = new CountDownLatch(Integer.parseInt(args[3]));
        c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                synchronized (System.out) {
                    System.out.println("MSG " + m.getQueueId() + " " + m.getQueueOffset());
                }
                left.countDown();
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        c.start();
        boolean all = left.await(90, TimeUnit.SECONDS);
        Thread.sleep(2000);
        c.shutdown();
        System.out.println(all ? "DONE" : "TIMEOUT");
    }
}
"""


@pytest.mark.spark42     # (AvailableNow runs: their last batch committed to the group)
def test_java_consumer_and_query_resume_each_other(spark, rocketmq, tmp_path):
    """The group's progress is one: a Java push consumer of the group starts where the query's
    committed batches ended, and the query continues where the Java consumer stopped."""
    from test_broker_stores import run_java
    name = f"LiveResume_{uuid.uuid4().hex[:8]}"
    group = f"ResumeGroup_{uuid.uuid4().hex[:6]}"
    broker = rocketmq.brokers["broker-a"]
    sent = {q: 0 for q in range(QUEUES)}

    def send(per_queue: int) -> set[tuple[int, int]]:
        new = set()
        with RemotingClient(timeout=15) as client:
            for q in range(QUEUES):
                for _ in range(per_queue):
                    rq.send_message(client, broker.addr, name, b"m", queue_id=q, tags="t")
                    new.add((q, sent[q]))
                    sent[q] += 1
                rq.wait_max_offset(client, broker.addr, name, q, sent[q])
        return new

    with RemotingClient(timeout=15) as client:
        rocketmq.create_topic(client, name, QUEUES)
    first = send(6)
    assert _run(spark, rocketmq, name, group, tmp_path) == first

    second = send(5)
    lines = run_java(rocketmq, tmp_path, "GroupConsume", name, group, str(len(second)),
                     sources={"GroupConsume": JAVA_GROUP_CONSUMER}, timeout=180)
    assert "DONE" in lines, lines[-20:]       # (the client may log after it)
    got = [tuple(map(int, line.split()[1:])) for line in lines if line.startswith("MSG ")]
    assert set(got) == second, (sorted(set(got) - second)[:5], sorted(second - set(got))[:5])
    with RemotingClient(timeout=15) as client:
        assert _progress(client, broker.addr, name, group) == dict(sent)

    third = send(3)
    assert _run(spark, rocketmq, name, group, tmp_path) == third


def test_a_queue_another_client_took_is_left_out_not_failed(rocketmq, topic, tmp_path, caplog):
    """Ordered mode, a lock lost on the broker (as across a broker restart) and taken by another
    client: the task's check leaves that queue out instead of failing, saying why, and the driver
    drops it from its plan, so the batch's end is not committed for it."""
    import logging

    from rmq_source.backend import TaskLock
    from rmq_source.group.allocation import MessageQueue
    from rmq_source.spark.options import parse_options
    from rmq_source.spark.query import open_backend, open_group_store, strategy_of
    group = f"LiveTaken_{uuid.uuid4().hex[:6]}"
    opts = parse_options({"namesrvAddr": rocketmq.namesrv_addr, "topic": topic, "consumerGroup": group,
                          "clientId": SPARK_ID, "groupStatePath": str(tmp_path / "state")}, streaming=True)
    backend = open_backend(opts)
    session = backend.group_session(opts, strategy_of(opts), open_group_store(opts, backend))
    session.start()
    try:
        mqs = backend.queues_for_topics([topic])
        read, _ = session.choose(mqs, {mq: 0 for mq in mqs}, fresh=True)
        assert read == set(mqs)                          # the group's only member
        taken = MessageQueue(topic, "broker-a", 1)
        addr = rocketmq.brokers["broker-a"].addr
        with RemotingClient(timeout=15) as other:
            rq.unlock_batch(other, addr, group, SPARK_ID, [(topic, "broker-a", 1)])
            assert rq.lock_batch(other, addr, group, "zz-taker", [(topic, "broker-a", 1)])
            with caplog.at_level(logging.WARNING):
                readable = backend.check_task_locks(
                    TaskLock(group, SPARK_ID, opts.client_lock_lease_ms), mqs)
            assert readable == set(mqs) - {taken}
            assert "another member holds it" in caplog.text and f"{topic}|broker-a|1" in caplog.text
            assert session.held() == set(mqs) - {taken}
            assert taken not in session.own_progress
            rq.unlock_batch(other, addr, group, "zz-taker", [(topic, "broker-a", 1)])
    finally:
        session.stop()


def test_mqadmin_sees_and_resets_a_running_and_a_stopped_query(spark, rocketmq, topic, tmp_path):
    """What operators do with RocketMQ's tools to a group query. ``mqadmin consumerStatus``: the
    broker asks the running query for its running info (GET_CONSUMER_RUNNING_INFO): properties,
    subscription, and per queue the offset it committed and its lock (the other questions:
    test_running_info.py). ``mqadmin resetOffsetByTime`` to the first message, while the query runs
    (4.9: the broker sends the query the reset; 5.3: the broker keeps it and ignores commits until a
    pull meets it) and while it is stopped (4.9: mqadmin writes the offsets itself): the query reads
    everything again each time and the group ends at the end, never written over unseen. Ordered on
    5.3, unordered on 4.9 (store mode runs both with each: test_operator_resets.py)."""
    group = f"LiveStatus_{uuid.uuid4().hex[:6]}"
    broker = rocketmq.brokers["broker-a"]
    orderly = not rocketmq.version.startswith("4.")
    sink = tmp_path / "sink"
    everything = sorted((q, o) for q in range(QUEUES) for o in range(PER_QUEUE))

    def start():
        return (spark.readStream.format("rmq")
                .options(namesrvAddr=rocketmq.namesrv_addr, topic=topic, consumerGroup=group,
                         clientId=SPARK_ID, startingOffsets="earliest", subExpression="t || u",
                         orderly=str(orderly).lower(), groupStatePath=str(tmp_path / "state"),
                         lockRenewIntervalMs="1000")
                .load().select("queueId", "queueOffset").writeStream.format("parquet")
                .option("path", str(sink)).option("checkpointLocation", str(tmp_path / "chk"))
                .trigger(processingTime="300 milliseconds").start())

    def wait_for(q, times, client):
        """Until the sink has every message ``times`` times and the group is at the end."""
        deadline = time.monotonic() + 120
        while True:
            assert q.exception() is None, q.exception()
            rows = sorted(_sink_rows(spark, sink))
            if rows == sorted(everything * times) and _progress(
                    client, broker.addr, topic, group) == {i: PER_QUEUE for i in range(QUEUES)}:
                return
            assert len(rows) <= len(everything) * times, "read more than the resets give"
            assert time.monotonic() < deadline, (times, len(rows), _progress(client, broker.addr,
                                                                              topic, group))
            time.sleep(0.3)

    with RemotingClient(timeout=15) as client:
        q = start()
        try:
            wait_for(q, 1, client)           # (the last batch is committed at the next planning)
            report = rocketmq.mqadmin("consumerStatus", "-g", group, "-i", SPARK_ID)
            props = dict(line.split(":", 1) for line in report.split("#Consumer Subscription#")[0]
                         .splitlines() if ":" in line and not line.startswith("#"))
            props = {k.strip(): v.strip() for k, v in props.items()}
            assert props["clientId"] == SPARK_ID, report
            assert props["PROP_CONSUMEORDERLY"] == str(orderly).lower(), report
            assert props["PROP_NAMESERVER_ADDR"] == rocketmq.namesrv_addr, props
            assert f"Topic: {topic}" in report and "SubExpression: t || u" in report, report
            offsets = [line.split() for line in report.split("#Consumer Offset#")[1]
                       .split("#Consumer MQ Detail#")[0].splitlines() if line.startswith(topic)]
            assert sorted((int(r[2]), int(r[3])) for r in offsets) == [
                (i, PER_QUEUE) for i in range(QUEUES)], report
            detail = report.split("#Consumer MQ Detail#")[1]
            assert sum("locked=true" in line for line in detail.splitlines()
                       if line.startswith(topic)) == (QUEUES if orderly else 0), report
            assert "SubExpression: *" in report      # (its %RETRY% topic, read whole)
            tps = [line.split() for line in report.split("#Consumer RT&TPS#")[1].splitlines()
                   if line.startswith(topic)]
            assert tps and float(tps[0][4]) > 0, report   # ConsumeOK TPS: the last minute's batches
            listing = rocketmq.mqadmin("consumerStatus", "-g", group)
            assert any(line.split()[:2] == ["1", SPARK_ID] for line in listing.splitlines()), listing

            rocketmq.mqadmin("resetOffsetByTime", "-g", group, "-t", topic, "-s", "0")
            wait_for(q, 2, client)
        finally:
            q.stop()
        rocketmq.mqadmin("resetOffsetByTime", "-g", group, "-t", topic, "-s", "0")
        assert _progress(client, broker.addr, topic, group) == {i: 0 for i in range(QUEUES)}
        q = start()
        try:
            wait_for(q, 3, client)
        finally:
            q.stop()
