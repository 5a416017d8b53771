"""The sink against real RocketMQ clusters (4.9 and 5.3): round trips read back by the Java
consumer and by our source, RocketMQ's own hash queue selector, broker refusals, a broker killed
under a streaming write."""
from __future__ import annotations

import signal
import threading
import time

import pytest
from pyspark.sql import Row, functions as F, types as T

from conftest import BROKER_LINES, running_cluster
from rmq_source.remote import RemotingClient
from rmq_source.remote import requests as rq
from rmq_source.store.writer import StoreWriter

pytestmark = [pytest.mark.broker]

JAVA_HASH = r"""
import java.util.List;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.selector.SelectMessageQueueByHash;
import org.apache.rocketmq.common.message.MessageQueue;

public class Hash {
    public static void main(String[] args) throws Exception {
        DefaultMQProducer p = new DefaultMQProducer("java_hash");
        p.setNamesrvAddr(args[0]);
        p.setInstanceName("rmq-test-" + System.nanoTime());
        p.start();
        List<MessageQueue> mqs = p.fetchPublishMessageQueues(args[1]);
        SelectMessageQueueByHash byHash = new SelectMessageQueueByHash();
        for (int i = 2; i < args.length; i++) {
            MessageQueue q = byHash.select(mqs, null, args[i]);
            System.out.println("KEY " + args[i] + " " + q.getBrokerName() + " " + q.getQueueId());
        }
        p.shutdown();
    }
}
"""

QUEUES = {"broker-a": 4, "broker-b": 3}


@pytest.fixture(scope="module", params=BROKER_LINES, ids=lambda line: f"rocketmq-{line}")
def cluster(request, rocketmq_jars, tmp_path_factory):
    """broker-a and broker-b as usual; broker-s a SYNC_MASTER without slave taking messages of at
    most 64 KiB: every send is stored but answered SLAVE_NOT_AVAILABLE (4.9), FLUSH_SLAVE_TIMEOUT
    after slaveTimeout (5.x, which waits for inSyncReplicas acks)."""
    with running_cluster(rocketmq_jars, request.param, tmp_path_factory, "sink",
                         broker_names=("broker-a", "broker-b")) as c:
        c.start_broker("broker-s", extra={"brokerRole": "SYNC_MASTER", "maxMessageSize": 65536,
                                                "inSyncReplicas": 2, "slaveTimeout": 500})
        yield c


def make_topic(cluster, topic, queues=QUEUES, perm=6):
    with RemotingClient(timeout=15) as client:
        for broker, n in queues.items():
            rq.create_topic(client, cluster.brokers[broker].addr, topic, read_queues=n, perm=perm)
        deadline = time.monotonic() + 30
        while {q["brokerName"] for q in rq.topic_route(client, cluster.namesrv_addr, topic).queue_datas} != set(queues):
            assert time.monotonic() < deadline, f"topic {topic} not routed"
            time.sleep(0.2)


def dump(cluster, tmp_path, topic, queues=QUEUES):
    """{(broker, queue): [(offset, body, properties)]} as the real Java consumer pulls them."""
    from test_broker_stores import java_dump
    out = {}
    for broker, n in queues.items():
        got, _ = java_dump(cluster, tmp_path, topic, broker, n)
        for q, msgs in got.items():
            out[broker, q] = [(m[0], m[4], m[5]) for m in msgs]
    return out


def java_hash(cluster, tmp_path, topic, keys):
    from test_broker_stores import run_java
    (tmp_path / "hash").mkdir(exist_ok=True)
    lines = run_java(cluster, tmp_path / "hash", "Hash", topic, *keys, sources={"Hash": JAVA_HASH})
    return {f[1]: (f[2], int(f[3])) for f in (line.split() for line in lines) if f[:1] == ["KEY"]}


SCHEMA = T.StructType([
    T.StructField("body", T.StringType()), T.StructField("tags", T.StringType()),
    T.StructField("keys", T.ArrayType(T.StringType())),
    T.StructField("properties", T.MapType(T.StringType(), T.StringType())),
    T.StructField("shardingKey", T.StringType()), T.StructField("delayTimeLevel", T.IntegerType())])


def rows(n):
    return [Row(f"m{i}", f"t{i % 3}", [f"k{i}", "all"], {"i": str(i)}, f"s{i % 7}" if i % 2 == 0 else None,
                1 if i % 100 == 99 else None) for i in range(n)]


def write(spark, cluster, df, topic, **options):
    w = df.write.format("rmq").mode("append").option("namesrvAddr", cluster.namesrv_addr)
    if topic is not None:
        w = w.option("topic", topic)
    for k, v in options.items():
        w = w.option(k, str(v))
    w.save()


@pytest.mark.lines("4.9")
def test_round_trip(cluster, spark, tmp_path):
    topic = "SinkRT"
    make_topic(cluster, topic)
    n = 600
    df = spark.createDataFrame(spark.sparkContext.parallelize(rows(n), 3), SCHEMA)
    write(spark, cluster, df, topic, batchMessages=16, writeId="rt-1")
    time.sleep(2.5)                                 # the delayed rows (level 1 = 1 s)
    got = dump(cluster, tmp_path, topic)
    seen = {}
    for (broker, q), msgs in got.items():
        for offset, body, props in msgs:
            i = int(body.decode()[1:])
            assert body.decode() not in seen, body
            seen[body.decode()] = (broker, q, offset, props)
            assert props["TAGS"] == f"t{i % 3}" and props["KEYS"] == f"k{i} all" and props["i"] == str(i)
            assert len(props["UNIQ_KEY"]) == 32
    assert sorted(seen) == sorted(f"m{i}" for i in range(n))
    assert len({p["UNIQ_KEY"] for *_, p in seen.values()}) == n

    # every shardingKey in the queue RocketMQ's SelectMessageQueueByHash picks; the rows of one
    # key and one task (Spark partition: rows 0-199, 200-399, 400-599) stored in row order
    keys = sorted({f"s{k}" for k in range(7)})
    java = java_hash(cluster, tmp_path, topic, keys)
    for key in keys:
        mine = [i for i in range(0, n, 2) if f"s{i % 7}" == key and i % 100 != 99]
        assert {seen[f"m{i}"][:2] for i in mine} == {java[key]}, key
        for part in range(3):
            placed = sorted((seen[f"m{i}"][2], i) for i in mine if i // 200 == part)
            assert [i for _, i in placed] == sorted(i for _, i in placed), (key, part)
    # free rows spread over both brokers
    assert {seen[f"m{i}"][0] for i in range(1, n, 2)} == set(QUEUES)

    # our source reads the same messages
    back = (spark.read.format("rmq").option("namesrvAddr", cluster.namesrv_addr).option("topic", topic)
            .load().select("body", "tags", "keys", "uniqKey", "storeTimestamp", "bornTimestamp").collect())
    assert sorted(r.body.decode() for r in back) == sorted(seen)
    for r in back:
        assert r.uniqKey == seen[r.body.decode()][3]["UNIQ_KEY"]
        assert r.tags == seen[r.body.decode()][3]["TAGS"]
        if int(r.body.decode()[1:]) % 100 == 99:   # delayed: stored a second after it was born
            assert (r.storeTimestamp - r.bornTimestamp).total_seconds() >= 0.9

    # the same write again (same writeId, rows, partitioning) sends the same UNIQ_KEYs
    write(spark, cluster, df, topic, batchMessages=16, writeId="rt-1")
    time.sleep(2.5)
    again = (spark.read.format("rmq").option("namesrvAddr", cluster.namesrv_addr).option("topic", topic)
             .load().select("body", "uniqKey").collect())
    pairs = {}
    for r in again:
        pairs.setdefault(r.uniqKey, set()).add(bytes(r.body))   # (bytearray before PySpark 4.1)
    assert len(again) == 2 * n and len(pairs) == n and all(len(b) == 1 for b in pairs.values())


C_SCHEMA = T.StructType([
    T.StructField("body", T.BinaryType()), T.StructField("tags", T.StringType()),
    T.StructField("keys", T.ArrayType(T.StringType())),
    T.StructField("properties", T.MapType(T.StringType(), T.StringType()))])


@pytest.mark.lines("5.3")
def test_round_trip_of_rows_the_c_core_encodes(cluster, spark, tmp_path):
    """body/tags/keys/properties only: the task encodes batches in C (rmq_source/sink/encoder.py).
    The Java consumer reads the rows with their tags, keys and properties, each with the UNIQ_KEY
    of its (write, partition, row); the same rows written again through the row-by-row path (a
    delayTimeLevel column of nulls) carry the same UNIQ_KEYs."""
    from rmq_source.sink.columns import RESERVED_PROPERTIES
    from rmq_source.sink.uniq import TaskKeys
    topic, n, parts = "SinkC", 500, 3
    make_topic(cluster, topic)
    data = [Row(b"c%d" % i, None if i % 5 == 0 else f"t{i % 4}",
                None if i % 7 == 0 else [] if i % 7 == 1 else [f"k{i}", "all"],
                None if i % 3 == 0 else {} if i % 3 == 1 else {"i": str(i), "caf\u00e9": "\u00e9t\u00e9 \u2603"})
            for i in range(n)]
    df = spark.createDataFrame(spark.sparkContext.parallelize(data, parts), C_SCHEMA)
    write(spark, cluster, df, topic, batchMessages=16, writeId="rt-c")
    expected_key = {}
    for p, part in enumerate(df.rdd.glom().collect()):      # each task's rows, in order
        keys = TaskKeys("rt-c", 0, p)
        for row, r in enumerate(part):
            expected_key[bytes(r.body)] = keys.key(row)
    assert len(expected_key) == n
    got = dump(cluster, tmp_path, topic)
    seen = {}
    for msgs in got.values():
        for _, body, props in msgs:
            i = int(body[1:])
            assert body not in seen
            seen[body] = props
            assert props.get("TAGS") == (None if i % 5 == 0 else f"t{i % 4}")
            assert props.get("KEYS") == (None if i % 7 in (0, 1) else f"k{i} all")
            assert props["UNIQ_KEY"] == expected_key[body] and props["WAIT"] == "true"
            own = {k: v for k, v in props.items() if k not in RESERVED_PROPERTIES}   # brokers add some
            assert own == ({"i": str(i), "caf\u00e9": "\u00e9t\u00e9 \u2603"} if i % 3 == 2 else {}), own
    assert sorted(seen) == sorted(expected_key)
    assert {b for (broker, _), msgs in got.items() for _, b, _ in msgs if broker == "broker-b"}

    row_by_row = df.withColumn("delayTimeLevel", F.lit(None).cast("int"))
    write(spark, cluster, row_by_row, topic, batchMessages=16, writeId="rt-c")
    back = (spark.read.format("rmq").option("namesrvAddr", cluster.namesrv_addr).option("topic", topic)
            .load().select("body", "uniqKey", "tags", "keys").collect())
    assert len(back) == 2 * n
    for r in back:
        assert r.uniqKey == expected_key[r.body], r
        assert r.tags == seen[r.body].get("TAGS")


def _df(spark, cols: dict, schema: str):
    n = len(next(iter(cols.values())))
    return spark.createDataFrame([tuple(c[i] for c in cols.values()) for i in range(n)], schema)


BIG = "x" * (100 << 10)


# (name, columns, schema, options, error class, text the error must show)
REFUSALS = [
    ("missing option topic", {"body": ["a"]}, "body string", {"topic": "NoSuchTopic"},
     "RmqUnknownTopicError", "does not exist .*mqadmin updateTopic"),
    ("missing row topic", {"body": ["a", "b"], "topic": ["SinkErr", "NoSuchRowTopic"]}, "body string, topic string",
     {}, "RmqUnknownTopicError", "NoSuchRowTopic"),
    ("body over maxMessageBytes", {"body": ["a" * 2000]}, "body string", {"topic": "SinkErr", "maxMessageBytes": 1000},
     "RmqSinkRowError", "row 0: body of 2000 bytes exceeds maxMessageBytes"),
    ("queue the topic lacks", {"body": ["a"], "queueId": [9], "brokerName": ["broker-b"]},
     "body string, queueId int, brokerName string", {"topic": "SinkErr"}, "RmqSinkRowError",
     "has queues 0..2 on broker 'broker-b'"),
    ("queueId on a two-broker topic", {"body": ["a"], "queueId": [0]}, "body string, queueId int", {"topic": "SinkErr"},
     "RmqSinkRowError", "add a brokerName column"),
    ("broker's maxMessageSize", {"body": [BIG], "queueId": [0], "brokerName": ["broker-s"]},
     "body string, queueId int, brokerName string", {"topic": "SinkStrict", "requireStoreOk": "false"},
     "RmqSendError", r"\(broker broker-s master 127\.0\.0\.1:\d+\): the broker refused them with code (13|1): .*lower batchBytes"),
    ("sync master without slave", {"body": ["a"]}, "body string",
     {"topic": "SinkStrict", "requestRetries": 1, "retryBackoffMs": 10}, "RmqSendError",
     "gave up after 2 tries: the broker stored them but did not confirm .*(SLAVE_NOT_AVAILABLE|FLUSH_SLAVE_TIMEOUT).*requireStoreOk=false"),
    ("read-only topic", {"body": ["a"]}, "body string", {"topic": "SinkReadOnly"}, "RmqSendError",
     "topic SinkReadOnly has no writable queue .*check the topic's permission"),
    ("bad schema", {"value": ["a"]}, "value string", {"topic": "SinkErr"}, "RmqSinkSchemaError", "column 'value'"),
    ("overwrite", {"body": ["a"]}, "body string", {"topic": "SinkErr", "_mode": "overwrite"}, "RmqOptionError",
     "only appends"),
]


@pytest.mark.parametrize("name, cols, schema, options, error, text", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refusals_name_the_row_and_what_to_do(cluster, spark, name, cols, schema, options, error, text):
    import re
    from rmq_source import errors
    make_topic(cluster, "SinkErr")
    make_topic(cluster, "SinkStrict", {"broker-s": 2})
    make_topic(cluster, "SinkReadOnly", perm=4)
    options = dict(options)
    mode = options.pop("_mode", "append")
    w = _df(spark, cols, schema).write.format("rmq").mode(mode).option("namesrvAddr", cluster.namesrv_addr)
    for k, v in options.items():
        w = w.option(k, str(v))
    from conftest import raises_rmq
    with raises_rmq(getattr(errors, error), text) as info:
        w.save()
    assert re.search(text, info.text)


def test_store_status_accepted_when_asked(cluster, spark, tmp_path):
    """requireStoreOk=false: SLAVE_NOT_AVAILABLE counts as sent (the master has the message)."""
    make_topic(cluster, "SinkLoose", {"broker-s": 2})
    df = _df(spark, {"body": [f"l{i}" for i in range(20)]}, "body string")
    write(spark, cluster, df, "SinkLoose", requireStoreOk="false")
    got = dump(cluster, tmp_path, "SinkLoose", {"broker-s": 2})
    assert sorted(b.decode() for msgs in got.values() for _, b, _ in msgs) == sorted(f"l{i}" for i in range(20))


def _producer(cluster, topic, **options):
    from rmq_source.sink.options import parse_sink_options
    from rmq_source.sink.producer import TaskProducer
    opts = parse_sink_options({"namesrvAddr": cluster.namesrv_addr, "topic": topic,
                               **{k: str(v) for k, v in options.items()}}, streaming=False)
    return TaskProducer(opts, 7), opts


def _outgoing(opts, bodies, *, keys=None):
    import pyarrow as pa
    from rmq_source.sink.columns import messages
    from rmq_source.sink.uniq import TaskKeys
    cols = {"body": bodies}
    if keys is not None:
        cols["shardingKey"] = keys
    return messages(pa.RecordBatch.from_pydict(cols), first_row=0, partition=7, keys=TaskKeys("p", 0, 7),
                    default_topic=opts.topic, max_message_bytes=opts.max_message_bytes)


def test_producer_keeps_several_queues_in_flight(cluster, tmp_path):
    topic = "SinkInFlight"
    make_topic(cluster, topic)
    producer, opts = _producer(cluster, topic, batchMessages=4, maxInFlight=3)
    bodies = [b"f%d" % i for i in range(200)]
    for msg in _outgoing(opts, bodies):
        producer.add(msg)
    stats = producer.flush()
    assert (stats.messages, stats.retries, stats.peak_in_flight) == (200, 0, 3)
    got = dump(cluster, tmp_path, topic)
    assert sorted(b for msgs in got.values() for _, b, _ in msgs) == sorted(bodies)
    for msgs in got.values():     # one task's rows in one queue are stored in row order
        rows = [int(b[1:]) for _, b, _ in msgs]
        assert rows == sorted(rows)


def test_producer_memory_is_bounded(cluster):
    """Rows spread by key over every queue: open batches are sent when the buffered bytes pass
    the bound instead of growing with the queues."""
    topic = "SinkBound"
    make_topic(cluster, topic, {"broker-a": 16, "broker-b": 16})
    producer, opts = _producer(cluster, topic, batchMessages=1000, batchBytes=65536)
    body = b"x" * 2048
    peak = 0
    for msg in _outgoing(opts, [body] * 9000, keys=[f"k{i}" for i in range(9000)]):
        producer.add(msg)
        peak = max(peak, producer._buffered)
    assert peak <= producer._buffer_limit + len(body) + 200
    assert producer.flush().messages == 9000


def test_producer_memory_is_bounded_for_batches_encoded_in_c(cluster):
    import pyarrow as pa
    from rmq_source.sink.encoder import BatchEncoder
    from rmq_source.sink.uniq import TaskKeys
    topic = "SinkBoundC"
    make_topic(cluster, topic)
    producer, opts = _producer(cluster, topic, batchMessages=32, batchBytes=65536)
    encoder = BatchEncoder(opts, TaskKeys("b", 0, 7), 7)
    rows = pa.RecordBatch.from_pydict({"body": [b"y" * 2048] * 1000})
    peak = 0
    for k in range(9):
        for done in encoder.encode(rows, k * 1000):
            producer.add_encoded(topic, done.first_row, done.count, done.data)
            peak = max(peak, producer._buffered)
    last = encoder.finish()       # 30 messages of 2,122 B fit 64 KiB: 299 batches, the 300th open
    assert (last.first_row, last.count) == (8970, 30)
    producer.add_encoded(topic, last.first_row, last.count, last.data)
    assert producer._buffer_limit < 9000 * 2048 and peak <= producer._buffer_limit + 65536
    assert producer.flush().messages == 9000

def check_copies(spark, cluster, topic, bodies, keys_of, *, one_queue: bool = True):
    """Read ``topic`` back with our source: exactly ``bodies`` (each maybe more than once), every
    copy of a body with the same UNIQ_KEY; per key (``keys_of(body)``, None: no key), counting first
    copies only, its messages in input order within each queue, and with ``one_queue`` all in one
    queue. Returns the rows read."""
    got = (spark.read.format("rmq").option("namesrvAddr", cluster.namesrv_addr).option("topic", topic).load()
           .select("body", "uniqKey", "brokerName", "queueId", "queueOffset").collect())
    uniq_of = {}
    for r in got:
        uniq_of.setdefault(r.body, set()).add(r.uniqKey)
    assert sorted(uniq_of) == sorted(bodies)
    assert all(len(u) == 1 for u in uniq_of.values()), "a message sent twice with two UNIQ_KEYs"
    first = {}
    for r in sorted(got, key=lambda r: (r.brokerName, r.queueId, r.queueOffset)):
        first.setdefault(r.uniqKey, r)
    by_key = {}
    for r in first.values():
        if keys_of(r.body) is not None:
            by_key.setdefault(keys_of(r.body), []).append(r)
    for key, mine in by_key.items():
        queues = {(r.brokerName, r.queueId) for r in mine}
        if one_queue:
            assert len(queues) == 1, (key, queues)
        for q in queues:
            order = [int(r.body[1:]) for r in sorted(mine, key=lambda r: r.queueOffset)
                     if (r.brokerName, r.queueId) == q]
            assert order == sorted(order), (key, q)
    return got


@pytest.mark.lines("5.3")
def test_stream_query_killed_mid_batch_resends_the_same_keys(cluster, spark, tmp_path):
    """SIGKILL a streaming query (driver, JVM, workers) while a batch is being sent, restart it
    from its checkpoint: the re-run batch sends its rows with the same UNIQ_KEYs (query id and
    batch id come back from the checkpoint), nothing is lost, keys stay in their queue and order.
    Rows with a shardingKey against 4.9, rows the C core encodes (body only, every row a free
    message) against 5.3: both ways of sending meet a broker of each line (the brokers store
    what either sends alike), in half the time of all four pairs."""
    from fault_helpers import procs
    keyed = cluster.version.startswith("4.")
    n, per_batch = 3000, 1000
    with StoreWriter(tmp_path / "in", commitlog_file_size=1 << 20) as w:
        w.create_topic("In", 1)
        for i in range(n):
            w.append("In", f"c{i}".encode(), queue_id=0, properties={"k": f"k{i % 5}"})

    def stored(client, topic) -> int:
        total = 0
        for broker in QUEUES:
            total += sum(q.max_offset for q in rq.topic_stats(client, cluster.brokers[broker].addr, topic).values())
        return total

    # the sink task of micro-batch 1 SIGKILLs the query's processes once the broker stored half of
    # its rows (sent one per request, one request at once): fault_helpers/crash_source.py
    topic = f"SinkCrash{'' if keyed else 'Free'}"
    make_topic(cluster, topic)
    args = ["--store", str(tmp_path / "in"), "--sink", "unused", "--checkpoint", str(tmp_path / "chk"),
            "--topic", "In", "--max-per-trigger", str(per_batch),
            "--rmq-sink", f"namesrvAddr={cluster.namesrv_addr}", "--rmq-sink", f"topic={topic}",
            "--rmq-sink", "batchMessages=1", "--rmq-sink", "maxInFlight=1"]
    if not keyed:
        args.append("--rmq-sink-body-only")
    first = procs.start("stream_query.py", [*args, "--crash", f"sending:{per_batch // 2}"], tmp_path, "first")
    assert first.wait(timeout=300) == -signal.SIGKILL, procs.tail(tmp_path, "first")
    with RemotingClient(timeout=15) as client:     # stored: the queues' ends, dispatched a bit later
        procs.wait_for(lambda: stored(client, topic) >= per_batch + per_batch // 2, 60, "batch 1 half stored")
        assert stored(client, topic) == per_batch + per_batch // 2, "not killed half way through batch 1"
    again = procs.start("stream_query.py", [*args, "--trigger", "availableNow"], tmp_path, "again")
    assert again.wait(timeout=300) == 0, procs.tail(tmp_path, "again")

    got = check_copies(spark, cluster, topic, [f"c{i}".encode() for i in range(n)],
                       (lambda body: int(body[1:]) % 5) if keyed else (lambda body: None))
    assert len(got) > n, "the killed batch was not re-sent (the test did not kill mid-batch)"


def set_order_conf(cluster, topic, conf):
    """The NameServer's ORDER_TOPIC_CONFIG for ``topic`` (PUT_KV_CONFIG): producers then place
    messages by that fixed list, whether its brokers are up or not."""
    with RemotingClient(timeout=15) as client:
        client.invoke(cluster.namesrv_addr, 100, {"namespace": "ORDER_TOPIC_CONFIG", "key": topic, "value": conf})
        assert rq.topic_route(client, cluster.namesrv_addr, topic).order_topic_conf == conf


@pytest.mark.parametrize("rows", [pytest.param("route", marks=pytest.mark.lines("4.9")),
                                  pytest.param("orderTopicConf", marks=pytest.mark.lines("5.3")),
                                  pytest.param("free", marks=pytest.mark.lines("4.9"))])
def test_stream_rides_out_a_killed_broker(cluster, spark, tmp_path, rows):
    """A streaming query copies a topic into the cluster while broker-b is SIGKILLed and
    restarted: every message arrives and copies of one message share its UNIQ_KEY. The NameServer
    drops a killed broker from the route at once, so with the route (as with RocketMQ's own
    producer) a key's rows may go to another queue while the broker is away, each queue keeping
    them in input order; with an order-topic configuration the publish list stays fixed and
    every key stays in one queue in input order (one input queue: one task per batch, batches
    in turn); one retry only: a pinned batch waits through the restart by brokerOutageTimeoutMs
    (its default). "free": no shardingKey at all, the batches the C core encodes, each failed one sent
    to broker-a instead. Runs last in this module (it restarts broker-b)."""
    ordered = rows == "orderTopicConf"
    n, topic = 1500, {"route": "SinkKill", "orderTopicConf": "SinkKillOrdered", "free": "SinkKillFree"}[rows]
    make_topic(cluster, topic)
    if ordered:
        set_order_conf(cluster, topic, "broker-a:4;broker-b:3")
    with StoreWriter(tmp_path / "in", commitlog_file_size=1 << 20) as w:
        w.create_topic("In", 1)
        for i in range(n):
            w.append("In", f"v{i}".encode(), queue_id=0,
                     properties={"k": f"k{i % 11}"} if i % 3 else None)
    src = (spark.readStream.format("rmq").option("storePath", str(tmp_path / "in")).option("topic", "In")
           .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", 50).load()
           .select("body", F.col("properties")["k"].alias("shardingKey")))
    if rows == "free":
        src = src.select("body")
    query = (src.writeStream.format("rmq").option("namesrvAddr", cluster.namesrv_addr).option("topic", topic)
             .option("requestRetries", 1).option("retryBackoffMs", 300).option("batchMessages", 8)
             .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())
    killed = {}

    def kill_and_restart():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (query.lastProgress or {}).get("batchId", -1) < 3:
            time.sleep(0.05)
        killed["active"] = query.isActive
        cluster.brokers["broker-b"].kill()
        time.sleep(3)
        cluster.start_broker("broker-b")
        killed["restarted"] = True
    t = threading.Thread(target=kill_and_restart)
    t.start()
    try:
        query.awaitTermination(600)
    finally:
        t.join(300)
        if query.isActive:
            query.stop()
    assert query.exception() is None, query.exception()
    assert killed == {"active": True, "restarted": True}, killed
    assert (query.lastProgress or {}).get("batchId", 0) >= 20

    got = check_copies(spark, cluster, topic, [f"v{i}".encode() for i in range(n)],
                       lambda body: int(body[1:]) % 11 if int(body[1:]) % 3 and rows != "free" else None,
                       one_queue=ordered)
    assert {r.brokerName for r in got} == {"broker-a", "broker-b"}
