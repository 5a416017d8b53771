"""Option ``namespace`` against real brokers and RocketMQ's Java client with the same namespace
(``ClientConfig.setNamespace``), on 4.9 and 5.3: the names on the brokers, the topic column,
a consumer group's progress and the sink agree with what the Java client does and shows."""
from __future__ import annotations

import subprocess
import uuid

import pytest

from rmq_source.remote import RemotingClient
from rmq_source.remote import requests as rq

pytestmark = [pytest.mark.broker, pytest.mark.spark]

QUEUES = 4

# Ns <namesrv> produce <namespace> <topic> <count> <prefix>: sends through a producer of the
# namespace. Ns <namesrv> consume <namespace> <group> <count> <topic>...: a push consumer of the
# namespace (from the first offset where its group has none) prints every message it gets with
# the topic the client shows, until it got <count>; it then shuts down (its offsets persisted).
JAVA_NS = r"""
import java.nio.charset.StandardCharsets;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

public class Ns {
    public static void main(String[] a) throws Exception {
        if (a[1].equals("produce")) {
            DefaultMQProducer p = new DefaultMQProducer("NsJavaProducer");
            p.setNamesrvAddr(a[0]);
            p.setNamespace(a[2]);
            p.setInstanceName("rmq-test-" + System.nanoTime());
            p.start();
            for (int i = 0; i < Integer.parseInt(a[4]); i++) {
                SendResult r = p.send(new Message(a[3], "t", (a[5] + "-" + i).getBytes(StandardCharsets.UTF_8)));
                System.out.println("SENT " + r.getMessageQueue().getQueueId() + " " + r.getQueueOffset());
            }
            p.shutdown();
            return;
        }
        int want = Integer.parseInt(a[4]);
        CountDownLatch got = new CountDownLatch(want);
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(a[3]);
        c.setNamesrvAddr(a[0]);
        c.setNamespace(a[2]);
        c.setInstanceName("rmq-test-" + System.nanoTime());
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        for (int i = 5; i < a.length; i++) c.subscribe(a[i], "*");
        c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                synchronized (System.out) {
                    System.out.println("MSG " + m.getTopic() + " " + new String(m.getBody(), StandardCharsets.UTF_8));
                    System.out.flush();
                }
                got.countDown();
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        c.start();
        boolean done = got.await(120, TimeUnit.SECONDS);
        c.shutdown();
        System.exit(done ? 0 : 3);
    }
}
"""


def _java(cluster, tmp_path, *args: str) -> list[list[str]]:
    from test_broker_stores import java_command
    cmd = java_command(cluster, tmp_path, "Ns", *args, sources={"Ns": JAVA_NS},
                       system_props={"rocketmq.client.rebalance.waitInterval": 1000})
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, f"Java Ns {args}: exit {out.returncode}\n{out.stdout[-2000:]}{out.stderr[-3000:]}"
    return [line.split(" ", 2) for line in out.stdout.splitlines() if line.startswith(("MSG ", "SENT "))]


def test_reads_groups_and_the_sink_agree_with_the_java_client(spark, rocketmq, tmp_path):
    """A Java producer of namespace ns fills ``ns%<topic>``; our batch read with namespace=ns
    shows the plain topic (as the Java consumer's getTopic()) and nothing of the same topic name
    in another namespace or without one; our group stream (namespace ns, group g) commits under
    ``ns%g`` on ``ns%<topic>``, so a Java push consumer of ns and g then gets only what came
    after; rows our sink wrote with namespace ns reach that consumer under their plain topic."""
    cluster, broker = rocketmq, rocketmq.brokers["broker-a"]
    ns, topic, group = f"ns{uuid.uuid4().hex[:6]}", f"NsOrders_{uuid.uuid4().hex[:6]}", f"NsGroup_{uuid.uuid4().hex[:6]}"
    sink_topic = f"NsSink_{uuid.uuid4().hex[:6]}"
    with RemotingClient(timeout=15) as client:
        for name in (f"{ns}%{topic}", f"{ns}%{sink_topic}", f"other%{topic}", topic):
            cluster.create_topic(client, name, QUEUES)
        for name in (f"other%{topic}", topic):          # the same name outside the namespace
            for q in range(QUEUES):
                rq.send_message(client, broker.addr, name, f"outside-{name}-{q}".encode(), queue_id=q, tags="t")
    _java(cluster, tmp_path, "produce", ns, topic, "40", "first")
    first = {f"first-{i}" for i in range(40)}

    # the batch read: only the namespace's topic, shown without the namespace
    rows = (spark.read.format("rmq").option("namesrvAddr", cluster.namesrv_addr).option("namespace", ns)
            .option("topic", topic).load().selectExpr("topic", "CAST(body AS STRING) AS body").collect())
    assert sorted(r.body for r in rows) == sorted(first)
    assert {r.topic for r in rows} == {topic}

    # the group stream commits on the brokers under the wrapped names
    sink = tmp_path / "sink"
    q = (spark.readStream.format("rmq").option("namesrvAddr", cluster.namesrv_addr).option("namespace", ns)
         .option("topic", topic).option("consumerGroup", group).option("orderly", "false")
         .option("consumeFromWhere", "CONSUME_FROM_FIRST_OFFSET").option("groupStatePath", str(tmp_path / "state"))
         .load().selectExpr("topic", "CAST(body AS STRING) AS body")
         .writeStream.format("parquet").option("path", str(sink))
         .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())
    assert q.awaitTermination(180), "the group stream did not end"
    assert q.exception() is None, q.exception()
    streamed = spark.read.parquet(str(sink)).collect()
    assert sorted(r.body for r in streamed) == sorted(first) and {r.topic for r in streamed} == {topic}
    with RemotingClient(timeout=15) as client:
        for qid in range(QUEUES):
            end = rq.max_offset(client, broker.addr, f"{ns}%{topic}", qid)
            assert rq.query_consumer_offset(client, broker.addr, f"{ns}%{group}", f"{ns}%{topic}", qid) == end

    # the sink writes rows of the plain topic into the namespace's topic
    sent = [f"sunk-{i}" for i in range(30)]
    (spark.createDataFrame([(b, sink_topic) for b in sent], "body string, topic string")
     .write.format("rmq").mode("append").option("namesrvAddr", cluster.namesrv_addr)
     .option("namespace", ns).save())

    # the Java consumer of the group: what came after our commits, and the sink's rows
    second = {f"second-{i}" for i in range(20)}
    with RemotingClient(timeout=15) as client:          # (the name on the brokers, sent as it is)
        for i, body in enumerate(sorted(second)):
            rq.send_message(client, broker.addr, f"{ns}%{topic}", body.encode(), queue_id=i % QUEUES, tags="t")
    got = _java(cluster, tmp_path, "consume", ns, group, str(len(second) + len(sent)), topic, sink_topic)
    by_topic = {}
    for _, shown, body in got:
        by_topic.setdefault(shown, set()).add(body)
    assert by_topic == {topic: second, sink_topic: set(sent)}, "the Java consumer got other messages"
