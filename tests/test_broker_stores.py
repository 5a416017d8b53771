"""Stores crossing between rmq_source and real RocketMQ brokers (4.9.x and 5.3.x).

1. A store written by our writer (several CommitLog files, compressed bodies, IPv6 hosts, keys,
   properties; and one topic written by ``rmq-store generate``) is started under a real broker: every
   message pulled through the broker equals what our reader reads; the broker then takes new messages
   after ours, and our reader reads both once it stopped.
2. Messages sent to a real broker by our remoting client are read by ``Store`` from the broker's store
   folder while it runs (a prefix: dispatch may lag) and after it stops, equal to the broker's pull.
"""
from __future__ import annotations

import base64
import os
import random
import subprocess
import sys
import time

import pytest

import rocketmq_archive
import rocketmq_cluster as rc_cluster
from rocketmq_cluster import pull_all
from rmq_source.store import record_codec
from rmq_source.store.bodies import decompress_body
from rmq_source.remote import RemotingClient
from rmq_source.remote import requests as rq
from rmq_source.store.reader import Store
from rmq_source.store.writer import StoreWriter

pytestmark = pytest.mark.broker


def store_rows(store_root, broker_name, topic, queue_id):
    with Store(store_root, broker_name=broker_name) as st:
        end = st.max_offset(topic, queue_id)
        return st.read(topic, queue_id, st.min_offset(topic, queue_id), end).to_pylist()


def assert_same(rows, recs):
    """Rows of our reader equal the broker's pulled records, field by field."""
    assert [r["queueOffset"] for r in rows] == [p.queue_offset for p in recs]
    for row, rec in zip(rows, recs):
        where = f"queue offset {rec.queue_offset}"
        assert row["commitLogOffset"] == rec.physical_offset, where
        assert row["storeSize"] == rec.total_size, where
        assert row["msgId"] == record_codec.offset_msg_id(rec.store_host, rec.physical_offset), where
        assert row["uniqKey"] == rec.properties.get("UNIQ_KEY"), where
        assert row["tags"] == rec.properties.get("TAGS"), where
        assert (row["keys"] or []) == (rec.properties.get("KEYS", "").split() or []), where
        assert dict(row["properties"]) == rec.properties, where
        assert row["body"] == decompress_body(rec.body, rec.sys_flag), where
        assert row["sysFlag"] == rec.sys_flag and row["flag"] == rec.flag, where
        assert row["bodyCRC"] == rec.body_crc, where
        assert row["storeHost"] == record_codec.java_host_string(rec.store_host), where
        assert row["bornHost"] == record_codec.java_host_string(rec.born_host), where


def write_store(root, style):
    """Our writer's store: topic W (2 queues) over several CommitLog files, plus topic G by the CLI."""
    rnd = random.Random(7)
    expected = []
    with StoreWriter(root, broker_name="broker-w", commitlog_file_size=rc_cluster.COMMITLOG_SIZE,
                     cq_units_per_file=rc_cluster.CQ_UNITS, properties_style=style) as w:
        w.create_topic("W", 2)
        for i in range(600):
            body = bytes(rnd.getrandbits(8) for _ in range(64)) * (200 + i % 50)
            opts = {}
            if i % 3 == 0:
                opts["compression"] = "zlib"
            if i % 5 == 0:
                opts["born_host"] = "[::1]:40001"
            if i % 7 == 0:
                opts["store_host"] = "[::1]:10911"
            res = w.append("W", body, queue_id=i % 2, tags=f"T{i % 4}", keys=[f"k{i}", "all"],
                           properties={"n": str(i), "p": "v\u00e9"}, flag=i, **opts)
            expected.append(res)
        w.append_batch("W", [b"batch-%d" % j for j in range(5)], queue_id=0, tags="B", keys="bk")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(rc_cluster.Path(__file__).parents[1]),
                                                                  os.environ.get("PYTHONPATH")])))
    subprocess.run([sys.executable, "-m", "rmq_source", "generate", "--topic", "G", "--queues", "3",
                    "--messages", "300", "--body-size", "500", "--tags", "a,b,c", "--keys-per-message", "2",
                    "--broker-name", "broker-w", "--no-progress", "--seed", "3", str(root)],
                   check=True, env=env, capture_output=True, timeout=120)
    return expected


def test_our_store_served_by_real_broker(rocketmq, tmp_path):
    style = "4.9.3" if rocketmq.version.startswith("4.") else "5.3.3"
    root = tmp_path / "store"
    write_store(root, style)
    files = sorted(os.listdir(root / "commitlog"))
    assert len(files) >= 3, files
    before = {(t, q): store_rows(root, "broker-w", t, q) for t, qs in (("W", 2), ("G", 3)) for q in range(qs)}

    broker = rocketmq.start_broker("broker-w", store=root, workdir=tmp_path / "broker-w")
    try:
        with RemotingClient(timeout=15) as client:
            for (topic, q), rows in before.items():
                assert rq.max_offset(client, broker.addr, topic, q) == len(rows)
                assert_same(rows, pull_all(client, broker.addr, topic, q))
            # the broker takes new messages after ours, on the same queues
            sent = [rq.send_message(client, broker.addr, "W", b"new-%d" % i, queue_id=i % 2, tags="N",
                                    keys=["nk"], properties={"after": "ours"}, compress=i == 3)
                    for i in range(6)]
            assert [s.queue_offset for s in sent[:2]] == [len(before["W", 0]), len(before["W", 1])]
            for q in range(2):
                rq.wait_max_offset(client, broker.addr, "W", q, len(before["W", q]) + 3)
            pulled = {q: pull_all(client, broker.addr, "W", q) for q in range(2)}
            # the real Java client pulls the same messages (it decompresses bodies itself)
            for topic, queues in (("W", 2), ("G", 3)):
                dumped, ends = java_dump(rocketmq, tmp_path, topic, "broker-w", queues)
                for q in range(queues):
                    rows = before[topic, q]
                    got = dumped[q][:len(rows)]
                    assert ends[q][0] == len(rows) + (3 if topic == "W" else 0), (topic, q, ends[q])
                    assert [g[0] for g in got] == [r["queueOffset"] for r in rows], (topic, q)
                    for g, row in zip(got, rows):
                        where = (topic, q, row["queueOffset"])
                        assert g[1] == row["msgId"], where
                        assert (g[2], g[3], g[4]) == (row["flag"], row["bodyCRC"], row["body"]), where
                        assert g[5] == dict(row["properties"]), where
    finally:
        rocketmq.stop_broker("broker-w")
    assert not (root / "abort").exists()
    for q in range(2):
        rows = store_rows(root, "broker-w", "W", q)
        assert len(rows) == len(before["W", q]) + 3
        assert rows[:len(before["W", q])] == before["W", q]
        assert_same(rows, pulled[q])
        assert [r["body"] for r in rows[-3:]] == [b"new-%d" % i for i in range(q, 6, 2)]


JAVA_PRODUCER = r"""
import java.nio.charset.StandardCharsets;
import java.util.List;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.MessageQueueSelector;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageQueue;

public class Produce {
    public static void main(String[] args) throws Exception {
        DefaultMQProducer p = new DefaultMQProducer("java_producer");
        p.setNamesrvAddr(args[0]);
        p.setInstanceName("rmq-test-" + System.nanoTime());
        p.start();
        int n = Integer.parseInt(args[2]);
        MessageQueueSelector byKey = (List<MessageQueue> mqs, Message m, Object arg) ->
            mqs.get(((Integer) arg) % mqs.size());
        for (int i = 0; i < n; i++) {
            StringBuilder b = new StringBuilder();
            int reps = i % 3 == 0 ? 900 : 3;          // > 4 KiB: the client compresses the body
            for (int r = 0; r < reps; r++) b.append("java-").append(i).append('-');
            Message m = new Message(args[1], "jt" + (i % 2), "jk" + i + " jall",
                                    b.toString().getBytes(StandardCharsets.UTF_8));
            m.putUserProperty("ji", Integer.toString(i));
            SendResult r = i % 2 == 0 ? p.send(m, byKey, i / 2) : p.send(m);
            System.out.println("SENT " + r.getMessageQueue().getQueueId() + " " + r.getQueueOffset()
                               + " " + r.getMsgId() + " " + r.getOffsetMsgId());
        }
        p.shutdown();
    }
}
"""

JAVA_CONSUMER = r"""
import org.apache.rocketmq.client.consumer.DefaultMQPullConsumer;
import org.apache.rocketmq.client.consumer.PullResult;
import org.apache.rocketmq.client.impl.consumer.DefaultMQPullConsumerImpl;
import org.apache.rocketmq.common.message.MessageQueue;

public class Consume {
    public static void main(String[] args) throws Exception {
        DefaultMQPullConsumer c = new DefaultMQPullConsumer(args[2]);
        c.setNamesrvAddr(args[0]);
        c.setInstanceName("rmq-test-" + System.nanoTime());
        c.start();
        java.lang.reflect.Field f = DefaultMQPullConsumer.class.getDeclaredField("defaultMQPullConsumerImpl");
        f.setAccessible(true);
        DefaultMQPullConsumerImpl impl = (DefaultMQPullConsumerImpl) f.get(c);
        for (MessageQueue mq : c.fetchSubscribeMessageQueues(args[1])) {
            PullResult r = c.pull(mq, "*", 0, 32);
            long commit = Math.min(r.getNextBeginOffset(), 1 + mq.getQueueId());
            c.updateConsumeOffset(mq, commit);
            // a pull consumer persists only rebalanced queues at shutdown: commit to the broker now
            impl.getOffsetStore().updateConsumeOffsetToBroker(mq, commit, false);
            System.out.println("COMMIT " + mq.getQueueId() + " " + commit + " " + r.getPullStatus());
        }
        c.shutdown();
    }
}
"""

# Pulls every message of queues 0..n-1 of one broker with the real client (which decompresses bodies)
# and prints one line per message: queue, offset, offset msgId (store host + CommitLog offset), flag, body CRC, body and properties
# (base64; properties as sorted "k\u0001v" pairs joined by \u0002).
JAVA_DUMP = r"""
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.TreeMap;
import org.apache.rocketmq.client.consumer.DefaultMQPullConsumer;
import org.apache.rocketmq.client.consumer.PullResult;
import org.apache.rocketmq.client.consumer.PullStatus;
import org.apache.rocketmq.common.message.MessageClientExt;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

public class Dump {
    public static void main(String[] args) throws Exception {
        DefaultMQPullConsumer c = new DefaultMQPullConsumer("java_dump");
        c.setNamesrvAddr(args[0]);
        c.setInstanceName("rmq-test-" + System.nanoTime());
        c.start();
        Base64.Encoder b64 = Base64.getEncoder();
        for (int q = 0; q < Integer.parseInt(args[3]); q++) {
            MessageQueue mq = new MessageQueue(args[1], args[2], q);
            long offset = 0;
            while (true) {
                PullResult r = c.pull(mq, "*", offset, 32);
                if (r.getPullStatus() != PullStatus.FOUND) {
                    System.out.println("END " + q + " " + offset + " " + r.getPullStatus());
                    break;
                }
                for (MessageExt m : r.getMsgFoundList()) {
                    StringBuilder props = new StringBuilder();
                    for (java.util.Map.Entry<String, String> e : new TreeMap<>(m.getProperties()).entrySet()) {
                        if (props.length() > 0) props.append('\u0002');
                        props.append(e.getKey()).append('\u0001').append(e.getValue());
                    }
                    String offsetId = m instanceof MessageClientExt
                        ? ((MessageClientExt) m).getOffsetMsgId() : m.getMsgId();
                    System.out.println("MSG " + q + " " + m.getQueueOffset() + " " + offsetId + " "
                        + m.getFlag() + " " + m.getBodyCRC() + " "
                        + b64.encodeToString(m.getBody() == null ? new byte[0] : m.getBody()) + " "
                        + b64.encodeToString(props.toString().getBytes(StandardCharsets.UTF_8)));
                }
                offset = r.getNextBeginOffset();
            }
        }
        c.shutdown();
    }
}
"""


JAVA_SOURCES = {"Produce": JAVA_PRODUCER, "Consume": JAVA_CONSUMER, "Dump": JAVA_DUMP}


def java_command(rocketmq, workdir, main, *args, sources=JAVA_SOURCES, system_props=None):
    """The command running ``main`` with the real client of the cluster's version (first argument:
    the NameServer), ``sources`` ({class: text}) compiled once into ``workdir/java``."""
    if rc_cluster.shutil.which("javac") is None:
        rocketmq_skip("the Java client tests need a JDK 17 (javac)")
    src = workdir / "java"
    cp = rc_cluster.java_class_path(rocketmq.jars)
    if not src.is_dir():
        src.mkdir()
        for name, text in sources.items():
            (src / f"{name}.java").write_text(text)
        subprocess.run(["javac", "-nowarn", "-cp", cp, "-d", str(src),
                        *(str(src / f"{name}.java") for name in sources)],
                       check=True, capture_output=True, timeout=180)
    # (the jars first: the run's class-data archive of them applies, tests/rocketmq_archive.py)
    archive = rocketmq_archive.java_options(rocketmq.version, rocketmq.jars)
    return ["java", "-Xmx128m", "-XX:TieredStopAtLevel=1", *archive, *rc_cluster.ADD_OPENS,
            f"-Duser.home={src}", "-Drocketmq.client.logUseSlf4j=true",
            *(f"-D{k}={v}" for k, v in (system_props or {}).items()),
            "-cp", f"{cp}:{src}", main, rocketmq.namesrv_addr, *args]


def run_java(rocketmq, workdir, main, *args, sources=JAVA_SOURCES, timeout=120):
    """Run :func:`java_command` to its end; its stdout lines."""
    out = subprocess.run(java_command(rocketmq, workdir, main, *args, sources=sources),
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out.stdout.splitlines()


def rocketmq_skip(reason):
    from conftest import broker_unavailable
    broker_unavailable(reason)


def run_java_producer(rocketmq, workdir, topic, count):
    lines = run_java(rocketmq, workdir, "Produce", topic, str(count))
    return [line.split()[1:] for line in lines if line.startswith("SENT ")]


def java_dump(rocketmq, workdir, topic, broker_name, queues):
    """{queue: [(offset, msgId, flag, bodyCRC, body, properties)]} as the real Java pull consumer sees them."""
    out = {q: [] for q in range(queues)}
    ends = {}
    for line in run_java(rocketmq, workdir, "Dump", topic, broker_name, str(queues)):
        kind, *f = line.split(" ")      # (an empty body is an empty field)
        if kind == "MSG":
            props = base64.b64decode(f[6]).decode()
            props = dict(kv.split("\u0001", 1) for kv in props.split("\u0002") if kv)
            # the client adds the queue's bounds to every pulled message (PullAPIWrapper); not stored
            props.pop("MIN_OFFSET"), props.pop("MAX_OFFSET")
            out[int(f[0])].append((int(f[1]), f[2], int(f[3]), int(f[4]), base64.b64decode(f[5]), props))
        elif kind == "END":
            ends[int(f[0])] = (int(f[1]), f[2])
    assert set(ends) == set(range(queues)), ends
    return out, ends


def test_broker_store_read_by_us(rocketmq, tmp_path, spark):
    broker = rocketmq.start_broker("broker-c", workdir=tmp_path / "broker-c")
    root = broker.store
    topic = "S"
    try:
        with RemotingClient(timeout=15) as client:
            rq.create_topic(client, broker.addr, topic, read_queues=2)
            rnd = random.Random(5)
            for i in range(40):
                rq.send_message(client, broker.addr, topic, bytes(rnd.getrandbits(8) for _ in range(300)) * (1 + i),
                                queue_id=i % 2, tags=f"t{i % 3}", keys=[f"k{i}"],
                                properties={"i": str(i)}, compress=i % 4 == 0, flag=i)
            rq.send_batch(client, broker.addr, topic, [{"body": b"b%d" % j, "tags": "bt", "keys": f"bk{j}",
                                                        "properties": {"j": str(j)}} for j in range(7)],
                          queue_id=1)
            assert [rq.wait_max_offset(client, broker.addr, topic, q, n) for q, n in ((0, 20), (1, 27))] == [20, 27]
            pulled = {q: pull_all(client, broker.addr, topic, q) for q in range(2)}
            assert [len(pulled[0]), len(pulled[1])] == [20, 27]
            # live: what our reader sees while the broker runs is a prefix of the pull
            deadline = time.monotonic() + 20
            for q in range(2):
                while True:
                    rows = store_rows(root, "broker-c", topic, q)
                    assert_same(rows, pulled[q][:len(rows)])
                    if len(rows) == len(pulled[q]) or time.monotonic() > deadline:
                        break
                    time.sleep(0.3)
                assert len(rows) == len(pulled[q])
            # the real Java producer: tags, keys, user properties, bodies it compresses, a queue selector
            rocketmq.create_topic(client, "J", 3, broker="broker-c")
            sent = run_java_producer(rocketmq, tmp_path, "J", 12)
            assert len(sent) == 12
            last = {}
            for queue_id, offset, _, _ in sent:
                last[int(queue_id)] = max(last.get(int(queue_id), 0), int(offset) + 1)
            for q, n in last.items():
                rq.wait_max_offset(client, broker.addr, "J", q, n)
            java_pulled = {q: pull_all(client, broker.addr, "J", q) for q in range(3)}
            by_uniq = {r.properties["UNIQ_KEY"]: r for recs in java_pulled.values() for r in recs}
            for i, (queue_id, offset, uniq, offset_id) in enumerate(sent):
                rec = by_uniq[uniq]
                assert (rec.queue_id, rec.queue_offset) == (int(queue_id), int(offset))
                assert record_codec.offset_msg_id(rec.store_host, rec.physical_offset) == offset_id
                if i % 2 == 0:
                    assert rec.queue_id == (i // 2) % 3
                assert rec.properties["TAGS"] == f"jt{i % 2}" and rec.properties["KEYS"] == f"jk{i} jall"
                assert rec.properties["ji"] == str(i)
                assert bool(rec.sys_flag & 1) == (i % 3 == 0)
                reps = 900 if i % 3 == 0 else 3
                assert decompress_body(rec.body, rec.sys_flag) == (f"java-{i}-" * reps).encode()
            # a real Java consumer group commits offsets; the broker persists consumerOffset.json
            commits = {int(q): int(o) for _, q, o, _ in (line.split() for line in
                       run_java(rocketmq, tmp_path, "Consume", "J", "java_group") if line.startswith("COMMIT "))}
            assert commits == {0: 1, 1: 2, 2: 3}
            for q, o in commits.items():
                assert rq.query_consumer_offset(client, broker.addr, "java_group", "J", q) == o
    finally:
        rocketmq.stop_broker("broker-c")
    for q in range(2):
        assert_same(store_rows(root, "broker-c", topic, q), pulled[q])
    for q in range(3):
        assert_same(store_rows(root, "broker-c", "J", q), java_pulled[q])
    with Store(root, broker_name="broker-c") as st:
        assert st.consumer_offsets()[("J", "java_group")] == commits

    # format("rmq") on the broker's store: everything, then from the Java group's committed offsets
    def load(**options):
        reader = spark.read.format("rmq").option("storePath", str(root)).option("brokerName", "broker-c")
        for k, v in {"topic": "J", **options}.items():
            reader = reader.option(k, v)
        return {(r.queueId, r.queueOffset): (r.msgId, r.uniqKey, bytes(r.body), r.tags)
                for r in reader.load().collect()}
    expected = {(r.queue_id, r.queue_offset): (record_codec.offset_msg_id(r.store_host, r.physical_offset),
                                               r.properties["UNIQ_KEY"], decompress_body(r.body, r.sys_flag),
                                               r.properties["TAGS"])
                for recs in java_pulled.values() for r in recs}
    assert load() == expected
    from_group = load(startingOffsets="group", consumerGroup="java_group")
    assert from_group == {k: v for k, v in expected.items() if k[1] >= commits[k[0]]}


def test_stream_tails_a_running_broker(rocketmq, tmp_path, spark):
    """A streaming ``format("rmq")`` query tails the store of a broker that takes messages while it
    runs: micro-batches end where the broker's ConsumeQueue dispatch has got to (it lags the CommitLog),
    and the sink ends with exactly the messages the broker's own pull path returns, once each."""
    import threading

    broker = rocketmq.start_broker("broker-t", workdir=tmp_path / "broker-t")
    topic, queues, total = "Tail", 3, 900
    sink, chk = tmp_path / "sink", tmp_path / "chk"
    errors: list = []
    try:
        with RemotingClient(timeout=15) as client:
            rq.create_topic(client, broker.addr, topic, read_queues=queues)
            rq.send_message(client, broker.addr, topic, b"first", queue_id=0, tags="x")
            rq.wait_max_offset(client, broker.addr, topic, 0, 1)
            query = (spark.readStream.format("rmq").option("storePath", str(broker.store))
                     .option("brokerName", "broker-t").option("topic", topic)
                     .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", "200").load()
                     .writeStream.format("parquet").option("path", str(sink))
                     .option("checkpointLocation", str(chk)).trigger(processingTime="200 milliseconds").start())

            def produce():
                try:
                    with RemotingClient(timeout=15) as producer:
                        for i in range(1, total, 20):
                            rq.send_batch(producer, broker.addr, topic,
                                          [{"body": b"m-%d" % j, "tags": f"t{j % 2}", "keys": f"k{j}"}
                                           for j in range(i, min(i + 20, total))], queue_id=i % queues)
                except BaseException as exc:      # noqa: BLE001 - reported by the test
                    errors.append(exc)

            t = threading.Thread(target=produce)
            t.start()
            t.join(120)
            assert not errors, errors
            # sends are answered before the ConsumeQueue dispatch: wait for the queues to show them
            counts = {q: 0 for q in range(queues)}
            counts[0] = 1
            for i in range(1, total, 20):
                counts[i % queues] += min(i + 20, total) - i
            assert sum(counts.values()) == total
            for q, n in counts.items():
                assert rq.wait_max_offset(client, broker.addr, topic, q, n, timeout=60) == n
            deadline = time.monotonic() + 180
            while sum(p["numInputRows"] for p in query.recentProgress) < total:
                assert query.exception() is None, query.exception()
                assert time.monotonic() < deadline, query.recentProgress[-3:]
                time.sleep(0.3)
            query.stop()
            assert query.exception() is None, query.exception()
            pulled = {q: pull_all(client, broker.addr, topic, q) for q in range(queues)}
    finally:
        rocketmq.stop_broker("broker-t")
    rows = spark.read.parquet(str(sink)).select("queueId", "queueOffset", "body", "commitLogOffset").collect()
    got = sorted((r.queueId, r.queueOffset, bytes(r.body), r.commitLogOffset) for r in rows)
    assert got == sorted((q, p.queue_offset, p.body, p.physical_offset) for q, recs in pulled.items() for p in recs)
    assert len(got) == total
