"""Side by side with Spark's own Kafka source: throughput, latency and CPU, same machine, one run.

Starts a real Kafka broker (one KRaft node, ``bench/kafka_server.py``) and a real RocketMQ cluster (a
NameServer and one broker, ``tests/rocketmq_cluster.py``), both with their JVMs' default JIT and GC and
the servers' default thread pools (the RocketMQ broker with its transfer caps raised, as
bench_pull_size.py's RAISED: a pull of 32 messages, the default, is answered as at the shipped
caps of 32 messages and 256 KiB; only the pulls of 1,024 need them), and fills a topic of 8
partitions / 8 queues on each with the same messages (``--messages`` of ``--sizes`` bytes; message
i: key ``str(i)``, partition / queue ``i % 8``, a body cut from the SHA-256 of i), written by
Spark's own sinks (``format("kafka")``, ``format("rmq")``). Then, in one Spark session
(``local[2]``, bench/common.py's settings, the Kafka connector ``spark-sql-kafka-0-10_2.13`` from
Maven Central):

* **batch**: ``spark.read`` of every column into the ``noop`` sink: ``format("kafka")``,
  ``format("rmq")`` live (``namesrvAddr``) and store mode (``storePath``: the RocketMQ broker's own
  store folder, the same records); and **narrow**, five columns each: Kafka's ``select`` of
  topic, partition, offset, value, timestamp, rmq's ``.schema(...)`` of topic, queueId,
  queueOffset, body, storeTimestamp; the narrow live read again with pulls of 1,024 messages
  (``pullBatchSize``; RocketMQ's default is 32, Kafka's consumer fetches up to 1 MiB a partition);
  a warm-up read of each, then interleaved rounds, best of
  ``--repeat``; beside them the Python ceilings, all columns and narrow (``format("arrow_ceiling")``
  in bench/common.py: the very batches of the rmq store read, pre-built; what Spark costs any
  Python source for these rows, in the AvailableNow rounds too);
* **AvailableNow**: the same through ``readStream`` with ``Trigger.AvailableNow``, capped at a
  quarter of the messages per micro-batch (``maxOffsetsPerTrigger`` for Kafka,
  ``maxMessagesPerTrigger`` for rmq) and uncapped, fresh checkpoint per round, a warm-up round
  first (not counted);
* **CPU** per million messages of the batch reads: Spark's JVM and its Python workers, and the
  server's JVM, read from /proc around the best round;
* **latency** (first size only): a Java producer process (``RateProducer`` below) sends ``--rates``
  msgs/s for ``--seconds`` to a fresh topic, one message at a time round robin over the 8 partitions /
  queues, asynchronously, each client batching what waits as it does by default: Kafka's
  ``KafkaProducer`` (``linger.ms=5``, its 4.x default), RocketMQ's ``DefaultMQProducer`` with
  ``autoBatch`` (``batchMaxDelayMs=5``); a ``processingTime`` query (``--trigger-ms``) collects each
  micro-batch's send times in ``foreachBatch``. The producer writes its clock at the send call into
  the first 8 bytes of the body; latency = the driver's clock when ``collect()`` returned - that
  (both systems measured alike, producer batching included); the first ``--warmup`` seconds are
  not counted. Beside them ``python_floor`` (bench/python_floor.py: a perfect broker behind a
  Python source that costs nothing: Spark's own cost), alone and while RocketMQ takes the same
  sends from the same producer (``floor+rmq``: the machine as loaded as in the rmq run).

Each source runs with its defaults (one Spark task per partition / queue) but where said; ``--quick``
is a smoke run (100,000 messages, 15 s of latency). ``--messages`` takes several counts: the
first gives the headline figures (3 M by default: at 1 M a JVM source is not yet at its steady
state), the others more rows of the tables.

Targets (issue 45), same run, 100 B and 1 KiB: narrow, store mode >= 3x Kafka's batch and
AvailableNow; live mode >= 1x at 1 KiB; all columns, store mode >= 1.5x.

    python bench/bench_vs_kafka.py [--quick] [--messages 3000000,1000000] [--sizes 1024,100]
        [--rates 1000,10000] [--plot bench/vs_kafka.png]
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import common
from common import (ensure_ceiling_files, jvm_pid, measured, print_machine, print_table,
                    register_ceiling_source, spark_session, tree_cpu_seconds)
from bench_pull_size import RAISED as RAISED_CAPS
from kafka_server import KafkaServer
from python_floor import PythonFloorDataSource

sys.path.insert(0, str(common.REPO / "tests"))

import rocketmq_cluster  # noqa: E402
from rmq_source.remote import RemotingClient  # noqa: E402
from rmq_source.remote import requests as rq  # noqa: E402
from rmq_source.remote.backend import ClusterBackendSpec  # noqa: E402

KAFKA_CONNECTOR = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
PARTITIONS = 8
CORES = 2              # the machines this bench's targets are set for
#: the five columns of the narrow reads, rmq's as a schema and Kafka's as a select
RMQ_NARROW = "topic string, queueId int, queueOffset long, body binary, storeTimestamp timestamp"
RMQ_NARROW_COLUMNS = [c.split()[0] for c in RMQ_NARROW.split(", ")]
KAFKA_NARROW = ["topic", "partition", "offset", "value", "timestamp"]
#: the narrow live read with pulls of 1,024 messages (the broker's transfer caps are raised:
#: RAISED_CAPS; Kafka's consumer fetches up to 1 MiB a partition by default)
LARGE_PULLS = "rmq live narrow, pulls of 1,024"
#: RocketMQ 5.3's own thread pool defaults on 2 cores (the test brokers shrink them to boot fast)
BROKER_DEFAULT_POOLS = {
    "sendMessageThreadPoolNums": 2, "pullMessageThreadPoolNums": 20, "queryMessageThreadPoolNums": 10,
    "adminBrokerThreadPoolNums": 16, "clientManageThreadPoolNums": 32,
    "consumerManageThreadPoolNums": 32, "heartbeatThreadPoolNums": 2, "serverWorkerThreads": 8,
    "serverCallbackExecutorThreads": 0, "serverSelectorThreads": 3,
}

RATE_PRODUCER = r"""
import java.util.*;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;

public class RateProducer {
    // args: kafka|rmq address topic rate seconds bodyBytes
    public static void main(String[] a) throws Exception {
        boolean kafka = a[0].equals("kafka");
        String topic = a[2];
        double rate = Double.parseDouble(a[3]);
        long n = (long) (rate * Double.parseDouble(a[4]));
        byte[] body = new byte[Integer.parseInt(a[5])];
        new Random(7).nextBytes(body);
        AtomicLong acked = new AtomicLong(), failed = new AtomicLong();
        org.apache.kafka.clients.producer.KafkaProducer<byte[], byte[]> kp = null;
        org.apache.rocketmq.client.producer.DefaultMQProducer rp = null;
        List<org.apache.rocketmq.common.message.MessageQueue> queues = null;
        if (kafka) {
            Properties p = new Properties();
            p.put("bootstrap.servers", a[1]);
            p.put("linger.ms", "5");
            p.put("key.serializer", "org.apache.kafka.common.serialization.ByteArraySerializer");
            p.put("value.serializer", "org.apache.kafka.common.serialization.ByteArraySerializer");
            kp = new org.apache.kafka.clients.producer.KafkaProducer<>(p);
            kp.partitionsFor(topic);
        } else {
            rp = new org.apache.rocketmq.client.producer.DefaultMQProducer("bench_rate_producer");
            rp.setNamesrvAddr(a[1]);
            rp.setInstanceName("rate-" + System.nanoTime());
            rp.setAutoBatch(true);
            rp.batchMaxDelayMs(5);
            rp.start();
            queues = rp.fetchPublishMessageQueues(topic);
        }
        long t0 = System.nanoTime();
        for (long i = 0; i < n; i++) {
            long wait = t0 + (long) (i * 1e9 / rate) - System.nanoTime();
            if (wait > 0) LockSupport.parkNanos(wait);
            int part = (int) (i % 8);
            byte[] b = body.clone();
            java.nio.ByteBuffer.wrap(b).putLong(System.currentTimeMillis());   // the send time
            if (kafka) {
                kp.send(new org.apache.kafka.clients.producer.ProducerRecord<>(topic, part, null, b),
                        (md, e) -> { if (e == null) acked.incrementAndGet(); else failed.incrementAndGet(); });
            } else {
                org.apache.rocketmq.common.message.MessageQueue mq = null;
                for (org.apache.rocketmq.common.message.MessageQueue q : queues) if (q.getQueueId() == part) mq = q;
                rp.send(new org.apache.rocketmq.common.message.Message(topic, "t", b), mq,
                        new org.apache.rocketmq.client.producer.SendCallback() {
                            public void onSuccess(org.apache.rocketmq.client.producer.SendResult r) { acked.incrementAndGet(); }
                            public void onException(Throwable e) { failed.incrementAndGet(); }
                        });
            }
        }
        long deadline = System.nanoTime() + 60_000_000_000L;
        while (acked.get() + failed.get() < n && System.nanoTime() < deadline) Thread.sleep(10);
        System.out.println("PRODUCED " + acked.get() + " " + failed.get());
        if (kafka) kp.close(); else rp.shutdown();
    }
}
"""


# ------------------------------------------------------------------------------ servers

def start_servers(workdir: Path):
    kafka = KafkaServer(workdir / "kafka", partitions=PARTITIONS).start()
    version, jars = rocketmq_cluster.resolve_line("5.3")
    cluster = rocketmq_cluster.Cluster(
        version, jars, workdir / "rocketmq",
        broker_kw={"heap_mb": 2048, "direct_mb": 1024, "jvm_opts": (), "commitlog_size": 1 << 30,
                   "cq_units": 300_000, "extra": {**BROKER_DEFAULT_POOLS, **RAISED_CAPS}},
        namesrv_extra=None).start()
    return kafka, cluster


def broker(cluster):
    return next(iter(cluster.brokers.values()))


def create_rmq_topic(cluster, topic: str) -> None:
    with RemotingClient(timeout=30) as client:
        rq.create_topic(client, broker(cluster).addr, topic, read_queues=PARTITIONS)
        deadline = time.monotonic() + 60
        while not rq.topic_route(client, cluster.namesrv_addr, topic).queue_datas:
            assert time.monotonic() < deadline, f"{topic} never reached the NameServer"
            time.sleep(0.2)


def rmq_messages(cluster, topic: str) -> int:
    backend = ClusterBackendSpec((cluster.namesrv_addr,), 30.0).open()
    infos = backend.infos(backend.queues_for_topics([topic]))
    return sum(i.max_offset - i.min_offset for i in infos.values())


# ------------------------------------------------------------------------------ filling

def fill(spark, kafka, cluster, size: int, messages: int) -> dict:
    """The same ``messages`` into Kafka topic and RocketMQ topic ``Bench<size>_<messages>``; sink
    seconds."""
    topic = f"Bench{size}_{messages}"
    create_rmq_topic(cluster, topic)
    reps = size // 64 + 1
    rows = spark.range(0, messages, 1, PARTITIONS).selectExpr(
        f"CAST(id % {PARTITIONS} AS INT) AS part", "CAST(id AS STRING) AS k",
        f"CAST(substr(repeat(sha2(CAST(id AS STRING), 256), {reps}), 1, {size}) AS BINARY) AS v")
    t0 = time.perf_counter()
    (rows.selectExpr("k AS key", "v AS value", "part AS partition").write.format("kafka")
     .option("kafka.bootstrap.servers", kafka.bootstrap).option("topic", topic).mode("append").save())
    t1 = time.perf_counter()
    (rows.selectExpr("v AS body", "k AS keys", "'t' AS tags", "part AS queueId").write.format("rmq")
     .option("namesrvAddr", cluster.namesrv_addr).option("topic", topic).mode("append").save())
    t2 = time.perf_counter()
    deadline = time.monotonic() + 120
    while rmq_messages(cluster, topic) < messages:      # the broker's ConsumeQueue catches up
        assert time.monotonic() < deadline, "RocketMQ never listed every message"
        time.sleep(0.5)
    return {"topic": topic, "kafka_write": t1 - t0, "rmq_write": t2 - t1}


# ------------------------------------------------------------------------------ readers

def kafka_reader(reader, kafka, topic: str):
    return (reader.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap)
            .option("subscribe", topic).option("startingOffsets", "earliest"))


def rmq_live(reader, cluster, topic: str):
    return (reader.format("rmq").option("namesrvAddr", cluster.namesrv_addr).option("topic", topic)
            .option("startingOffsets", "earliest"))


def rmq_store(reader, cluster, topic: str):
    return (reader.format("rmq").option("storePath", str(broker(cluster).store)).option("topic", topic)
            .option("startingOffsets", "earliest"))


def sources(spark, kafka, cluster, topic: str, ceiling: Path):
    """name -> (reader factory (batch or streaming), the cap option, server pid or None, columns
    to select after load or None). The Python ceilings: a Python source handing Spark the very
    batches the rmq store read makes (pre-built, memory-mapped; all columns or the narrow five),
    Spark's cost of any Python source moving these rows, batch or stream."""
    kpid, bpid = kafka.pid, broker(cluster).proc.pid

    def arrow_ceiling(r, columns=None):
        r = r.format("arrow_ceiling").option("path", str(ceiling)).option("numPartitions", "sized")
        return r if columns is None else r.option("columns", ",".join(columns))
    return {
        "kafka": (lambda r: kafka_reader(r, kafka, topic), "maxOffsetsPerTrigger", kpid, None),
        "rmq live": (lambda r: rmq_live(r, cluster, topic), "maxMessagesPerTrigger", bpid, None),
        "rmq store": (lambda r: rmq_store(r, cluster, topic), "maxMessagesPerTrigger", None, None),
        "kafka narrow": (lambda r: kafka_reader(r, kafka, topic), "maxOffsetsPerTrigger", kpid,
                         KAFKA_NARROW),
        "rmq live narrow": (lambda r: rmq_live(r.schema(RMQ_NARROW), cluster, topic),
                            "maxMessagesPerTrigger", bpid, None),
        "rmq store narrow": (lambda r: rmq_store(r.schema(RMQ_NARROW), cluster, topic),
                             "maxMessagesPerTrigger", None, None),
        LARGE_PULLS: (lambda r: rmq_live(r.schema(RMQ_NARROW), cluster, topic)
                      .option("pullBatchSize", "1024"), "maxMessagesPerTrigger", bpid, None),
        "python ceiling": (arrow_ceiling, "maxMessagesPerTrigger", None, None),
        "python ceiling narrow": (lambda r: arrow_ceiling(r, RMQ_NARROW_COLUMNS),
                                  "maxMessagesPerTrigger", None, None),
    }


def load(make, reader, columns):
    df = make(reader).load()
    return df if columns is None else df.select(*columns)


def batch_rounds(spark, srcs, messages: int, repeat: int) -> dict:
    """Best (wall, Spark CPU, server CPU) of each source's batch read into noop."""
    for name, (make, _, _, columns) in srcs.items():   # warm-up and check: every message once
        df = load(make, spark.read, columns)
        n = df.count()
        if n != messages:
            raise SystemExit(f"{name}: read {n} messages, expected {messages}")
        df.write.format("noop").mode("overwrite").save()
    best: dict[str, tuple] = {}
    for _ in range(repeat):
        for name, (make, _, pid, columns) in srcs.items():
            df = load(make, spark.read, columns)
            r = measured(spark, pid, lambda: df.write.format("noop").mode("overwrite").save())
            if name not in best or r[0] < best[name][0]:
                best[name] = r
    return best


def stream_rounds(spark, srcs, messages: int, repeat: int, workdir: Path, cap: int | None) -> dict:
    """Best (wall from start() to the end, Spark CPU, server CPU, micro-batches, sum of the
    micro-batches' triggerExecution) of each source's AvailableNow run, ``cap`` messages a
    micro-batch (None: no limit, one micro-batch); round 0 warms up and is not counted."""
    best: dict[str, tuple] = {}
    for r in range(repeat + 1):
        for name, (make, cap_option, pid, columns) in srcs.items():
            chk = workdir / f"chk_{name.replace(' ', '_')}_{r}_{cap}"
            shutil.rmtree(chk, ignore_errors=True)
            df = load(lambda rd: make(rd) if cap is None else make(rd).option(cap_option, str(cap)),
                      spark.readStream, columns)
            box = {}

            def run():
                q = (df.writeStream.format("noop").option("checkpointLocation", str(chk))
                     .trigger(availableNow=True).start())
                q.awaitTermination()
                box["q"] = q
            res = measured(spark, pid, run)
            q = box["q"]
            if q.exception() is not None:
                raise SystemExit(f"{name} stream failed: {q.exception()}")
            rows = sum(p["numInputRows"] for p in q.recentProgress)
            if rows != messages:
                raise SystemExit(f"{name} stream read {rows} rows, expected {messages}")
            batches = sum(1 for p in q.recentProgress if p["numInputRows"])
            busy = sum(p["durationMs"]["triggerExecution"] for p in q.recentProgress) / 1000
            if r and (name not in best or res[0] < best[name][0]):
                best[name] = (*res, batches, busy)
    return best


def python_start(spark, workdir: Path, repeat: int) -> float:
    """Best wall time of a Trigger.AvailableNow run of ``python_floor`` (one micro-batch of one
    row): what Spark takes to start, run and end a query of a Python streaming source that costs
    nothing itself."""
    best = float("inf")
    for r in range(repeat + 1):
        chk = workdir / f"chk_floor_{r}"
        shutil.rmtree(chk, ignore_errors=True)
        t0 = time.perf_counter()
        q = (spark.readStream.format("python_floor").option("endMs", "1").load().writeStream
             .format("noop").option("checkpointLocation", str(chk)).trigger(availableNow=True).start())
        q.awaitTermination()
        if r:                                         # the first also starts Python workers
            best = min(best, time.perf_counter() - t0)
    return best


# ------------------------------------------------------------------------------ latency

def java_producer(cluster, kafka, workdir: Path) -> list[str]:
    """The command line prefix of RateProducer (compiled once)."""
    src = workdir / "java"
    src.mkdir(exist_ok=True)
    (src / "RateProducer.java").write_text(RATE_PRODUCER)
    kjars = [str(p) for p in sorted(kafka.jars.glob("*.jar"))
             if p.name.startswith(("kafka-clients-", "lz4-", "snappy-", "zstd-"))]
    cp = ":".join([rocketmq_cluster.java_class_path(cluster.jars), *kjars])
    subprocess.run(["javac", "-nowarn", "-cp", cp, "-d", str(src), str(src / "RateProducer.java")],
                   check=True, capture_output=True, timeout=300)
    return ["java", "-Xmx512m", *rocketmq_cluster.ADD_OPENS, f"-Duser.home={src}",
            "-Drocketmq.client.logUseSlf4j=true", "-cp", f"{src}:{cp}", "RateProducer"]


def latency(spark, system: str, kafka, cluster, producer_cmd, workdir: Path, rate: float,
            seconds: float, warmup: float, trigger_ms: int, size: int) -> dict:
    topic = f"Lat{system.capitalize().replace('+', '')}{int(rate)}"
    chk = workdir / f"lat_chk_{topic}"
    if system.startswith("floor"):   # Spark's cost alone: python_floor's perfect broker
        reader, body, addr = (spark.readStream.format("python_floor").option("rate", str(rate))
                              .option("size", str(size))), "value", None
        if system == "floor+rmq":       # ... while RocketMQ takes the same sends, read by nobody
            create_rmq_topic(cluster, topic)
    elif system == "kafka":
        reader, body, addr = kafka_reader(spark.readStream, kafka, topic), "value", kafka.bootstrap
        (spark.range(PARTITIONS).selectExpr("CAST(id AS INT) AS partition", "CAST('p' AS BINARY) AS value")
         .write.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap)
         .option("topic", topic).mode("append").save())
    else:
        reader, body, addr = rmq_live(spark.readStream, cluster, topic), "body", cluster.namesrv_addr
        create_rmq_topic(cluster, topic)
        (spark.range(PARTITIONS).selectExpr("CAST(id AS INT) AS queueId", "CAST('p' AS BINARY) AS body")
         .write.format("rmq").option("namesrvAddr", cluster.namesrv_addr).option("topic", topic)
         .mode("append").save())
    seen: list[tuple[int, float]] = []
    lock = threading.Lock()

    def sink(df, batch_id):
        rows = df.selectExpr(f"CAST(conv(hex(substring({body}, 1, 8)), 16, 10) AS BIGINT) AS ts").collect()
        now = time.time() * 1000
        with lock:
            seen.extend((r.ts, now) for r in rows)

    q = (reader.load().writeStream.foreachBatch(sink).option("checkpointLocation", str(chk))
         .trigger(processingTime=f"{trigger_ms} milliseconds").start())
    deadline = time.time() + 120
    while len(seen) < PARTITIONS and time.time() < deadline:      # the primers went through
        time.sleep(0.05)
    started_ms = time.time() * 1000
    server_pid = {"kafka": kafka.pid, "rmq": broker(cluster).proc.pid}.get(system)
    jvm = jvm_pid(spark)
    cpu0 = tree_cpu_seconds(jvm), server_pid and tree_cpu_seconds(server_pid)
    until_ms = started_ms + seconds * 1000
    if system.startswith("floor"):
        load = (subprocess.Popen([*producer_cmd, "rmq", cluster.namesrv_addr, topic, str(rate), str(seconds),
                                  str(size)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                if system == "floor+rmq" else None)
        time.sleep(seconds)
        if load is not None:
            load.wait(timeout=180)
        produced, failed = int(rate * seconds), 0
    else:
        proc = subprocess.run([*producer_cmd, system, addr, topic, str(rate), str(seconds), str(size)],
                              capture_output=True, text=True, timeout=seconds + 180)
        line = [x for x in proc.stdout.splitlines() if x.startswith("PRODUCED ")]
        if proc.returncode != 0 or not line:
            raise SystemExit(f"RateProducer {system} failed: {proc.stdout[-1500:]}{proc.stderr[-2500:]}")
        produced, failed = map(int, line[0].split()[1:])
        until_ms = float("inf")
    cpu = (tree_cpu_seconds(jvm) - cpu0[0], (tree_cpu_seconds(server_pid) - cpu0[1]) if server_pid else 0)
    expected = PARTITIONS + produced
    deadline = time.time() + 60
    while time.time() < deadline and (len(seen) < expected if not system.startswith("floor")
                                      else max(ts for ts, _ in seen) < until_ms):
        time.sleep(0.05)
    progress = [p for p in q.recentProgress if p["numInputRows"]]
    q.stop()
    if q.exception() is not None:
        raise SystemExit(f"{system} latency query failed: {q.exception()}")
    with lock:
        got = sorted(seen)[PARTITIONS:]
    lat = sorted(now - ts for ts, now in got if started_ms + warmup * 1000 <= ts <= until_ms)

    def pct(p):
        return lat[min(len(lat) - 1, int(round(p / 100 * (len(lat) - 1))))]
    phases: dict[str, list[float]] = {}
    for p in progress:
        for k, v in p["durationMs"].items():
            phases.setdefault(k, []).append(v)
    return {"produced": produced, "failed": failed, "received": len(got), "counted": len(lat),
            "spark_cpu_per_m": cpu[0] / produced * 1e6, "server_cpu_per_m": cpu[1] / produced * 1e6,
            "p50": pct(50), "p95": pct(95), "p99": pct(99), "max": lat[-1],
            "batches": len(progress),
            "phases": {k: statistics.median(v) for k, v in phases.items()},
            "slowest": sorted(((p["durationMs"]["triggerExecution"], p["numInputRows"],
                                {k: v for k, v in p["durationMs"].items() if v > 20})
                               for p in progress), key=lambda x: -x[0])[:4]}


# ------------------------------------------------------------------------------ report

def per_m(cpu: float, messages: int) -> str:
    return f"{cpu / messages * 1e6:.1f}"


#: (source, baseline, target) of the ratios printed under each table (issue 45; None: no target)
RATIOS = [("rmq store narrow", "kafka narrow", 3.0), ("rmq store narrow", "kafka", 3.0),
          ("rmq live narrow", "kafka narrow", 1.0), (LARGE_PULLS, "kafka narrow", None),
          ("rmq store", "kafka", 1.5),
          ("rmq live", "kafka", None),
          # what Spark leaves any Python source, and how near to it the rmq reads come
          ("python ceiling narrow", "kafka narrow", None), ("python ceiling", "kafka", None),
          ("rmq store narrow", "python ceiling narrow", None), ("rmq store", "python ceiling", None)]


def report(results: dict, args) -> None:
    for res in results["runs"].values():
        n, size = res["messages"], res["size"]
        b, s, one = res["batch"], res["stream"], res["stream_one"]
        if not b or not s:
            continue
        print(f"\n{n:,} messages of {size} B, {PARTITIONS} partitions / queues "
              f"(sinks filled them in: kafka {res['fill']['kafka_write']:.1f} s, "
              f"rmq {res['fill']['rmq_write']:.1f} s); AvailableNow capped at {n // 4:,} a micro-batch "
              "or uncapped (one micro-batch); msgs/s over the wall time from start() to the end")
        rows = []
        for name in b:
            wall, cpu, server = b[name]
            row = [name, f"{n / wall / 1e3:.0f} k", per_m(cpu, n), per_m(server, n) if server else "-"]
            if name in s:
                swall, _, _, batches, busy = s[name]
                owall = one[name][0]
                row += [f"{n / swall / 1e3:.0f} k ({batches})", f"{n / owall / 1e3:.0f} k",
                        f"{wall / swall:.2f} / {wall / owall:.2f}", f"{wall / busy:.2f}"]
            else:
                row += ["-"] * 4
            rows.append(row)
        print_table(["source", "batch msgs/s", "Spark CPU s per M msgs", "server CPU s per M msgs",
                     "AvailableNow capped (batches)", "AvailableNow uncapped",
                     "stream / batch: capped / uncapped", "capped, in micro-batches / batch"], rows)
        for name, base, target in RATIOS:
            if name not in b or base not in b:
                continue
            aim = f"target >= {target}x" if target else "no target"
            if name == "rmq live narrow" and size < 1024:
                aim = "at 1 KiB >= 1x; at 100 B as the broker's CPU a message leaves room"
            print(f"{name} / {base}: batch {b[base][0] / b[name][0]:.2f}x, AvailableNow capped "
                  f"{s[base][0] / s[name][0]:.2f}x, uncapped {one[base][0] / one[name][0]:.2f}x ({aim})")
        for live in ("rmq live narrow", LARGE_PULLS):
            if live not in b or "kafka narrow" not in b:
                continue
            _, cpu, server = b[live]
            most = CORES * n / (cpu + server)
            print(f"room on {CORES} cores for {live}: {CORES} / ({per_m(cpu, n)} s Spark + "
                  f"{per_m(server, n)} s broker CPU per M messages) = {most / 1e3:.0f} k msgs/s at most, "
                  f"{most * b['kafka narrow'][0] / n:.2f}x Kafka's narrow batch read")
    if "python_start" in results:
        print(f"\nSpark's start and end of a Trigger.AvailableNow query of a Python streaming source "
              f"that costs nothing (python_floor, one micro-batch of one row): "
              f"{results['python_start']:.2f} s")
    if results["latency"]:
        print(f"\nEnd-to-end latency, send -> foreachBatch collect, processingTime {args.trigger_ms} ms, "
              f"{args.seconds:.0f} s at each rate (first {args.warmup:.0f} s not counted); floor: "
              "python_floor, a perfect broker behind a Python source that costs nothing:")
        print_table(["source", "rate msgs/s", "counted / produced", "micro-batches", "p50 ms", "p95 ms",
                     "p99 ms", "max ms", "CPU s per M msgs: Spark / server", "median phases ms"],
                    [[sys_, f"{rate:,.0f}", f"{r['counted']:,} / {r['produced']:,}", r["batches"],
                      f"{r['p50']:.0f}", f"{r['p95']:.0f}", f"{r['p99']:.0f}", f"{r['max']:.0f}",
                      f"{r['spark_cpu_per_m']:.1f} / {r['server_cpu_per_m']:.1f}",
                      " ".join(f"{k[:12]}={v:.0f}" for k, v in sorted(r["phases"].items()))]
                     for (sys_, rate), r in results["latency"].items()])


def plot(results: dict, args, out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    head = [r for r in results["runs"].values() if r["messages"] == args.counts[0]]
    runs = {r["size"]: r for r in head}
    sizes = list(runs)
    messages = args.counts[0]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    ax = axes[0]
    names = ["kafka", "rmq live", "rmq store", "python ceiling"]
    modes = (("batch", "batch"), ("stream_one", "AvailableNow"), ("stream", "AvailableNow capped"))
    width = 0.07
    for i, name in enumerate(names):
        for j, (mode, label) in enumerate(modes):
            if name not in runs[sizes[0]][mode]:
                continue
            vals = [messages / runs[s][mode][name][0] / 1e3 for s in sizes]
            xs = [x + (i * 3 + j - 5.5) * width for x in range(len(sizes))]
            ax.bar(xs, vals, width, label=f"{name}: {label}", color=f"C{i}",
                   alpha=(1.0, 0.65, 0.35)[j])
    ax.set_xticks(range(len(sizes)), [f"{s} B bodies" for s in sizes])
    ax.set_ylim(0, ax.get_ylim()[1] * 1.35)          # room for the legend above the bars
    ax.set_ylabel("k messages / s (wall clock)")
    ax.set_title(f"Spark reads of {messages:,} messages, 8 partitions/queues, local[2]")
    ax.legend(fontsize=7, ncol=2)
    ax = axes[1]
    lat = results["latency"]
    rates = sorted({rate for _, rate in lat})
    labels = {"kafka": "kafka", "rmq": "rmq live", "floor": "python floor",
              "floor+rmq": "python floor, RocketMQ loaded"}
    width = 0.07
    for i, system in enumerate(labels):
        for j, p in enumerate(("p50", "p95", "p99")):
            vals = [lat[(system, r)][p] if (system, r) in lat else 0 for r in rates]
            xs = [x + (i * 3 + j - 5.5) * width for x in range(len(rates))]
            ax.bar(xs, vals, width, color=("C0", "C1", "C7", "C8")[i], alpha=(1.0, 0.65, 0.35)[j],
                   label=f"{labels[system]} {p}")
    ax.set_xticks(range(len(rates)), [f"{r:,.0f} msgs/s" for r in rates])
    ax.set_ylim(0, ax.get_ylim()[1] * 1.45)
    ax.set_ylabel("ms, send -> row in foreachBatch")
    ax.set_title(f"Streaming latency, processingTime {args.trigger_ms} ms")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"plot: {out}")


# ------------------------------------------------------------------------------ main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", default="3000000,1000000",
                    help="message counts, comma-separated: the first gives the headline figures")
    ap.add_argument("--sizes", default="1024,100")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rates", default="1000,10000")
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--trigger-ms", type=int, default=0)
    ap.add_argument("--plot", default=str(Path(__file__).resolve().parent / "vs_kafka.png"))
    ap.add_argument("--json", help="also save the figures here")
    ap.add_argument("--replot", metavar="JSON", help="only draw --plot from a run's --json (same --messages)")
    ap.add_argument("--quick", action="store_true", help="100,000 messages, 15 s of latency a rate")
    ap.add_argument("--skip", default="", help="comma list of parts not to run: batch,stream,latency")
    args = ap.parse_args()
    if args.quick:
        args.messages, args.seconds, args.repeat = "100000", 15.0, 2
    args.counts = [int(c) for c in args.messages.split(",")]
    skip = set(filter(None, args.skip.split(",")))
    if args.replot:
        saved = json.loads(Path(args.replot).read_text())
        results = {"runs": saved["runs"],
                   "latency": {(k.split()[0], float(k.split()[1])): v for k, v in saved["latency"].items()}}
        if "python_start" in saved:
            results["python_start"] = saved["python_start"]
        report(results, args)
        plot(results, args, args.plot)
        return
    workdir = Path(tempfile.mkdtemp(prefix="rmq-vs-kafka-"))
    spark_conf = {"spark.jars.packages": KAFKA_CONNECTOR}
    print_machine(spark_conf)
    kafka, cluster = start_servers(workdir)
    results: dict = {"runs": {}, "latency": {}}
    try:
        spark = spark_session(extra=spark_conf)
        register_ceiling_source(spark)
        spark.dataSource.register(PythonFloorDataSource)
        results["python_start"] = python_start(spark, workdir, args.repeat)
        sizes = [int(s) for s in args.sizes.split(",")]
        for count in args.counts:
            for size in sizes:
                print(f"filling {count:,} x {size} B ...", flush=True)
                f = fill(spark, kafka, cluster, size, count)
                ceiling = ensure_ceiling_files(workdir, broker(cluster).store, topic=f["topic"],
                                               quiet=True)
                srcs = sources(spark, kafka, cluster, f["topic"], ceiling)
                res = {"fill": f, "messages": count, "size": size}
                print("batch reads ...", flush=True)
                res["batch"] = {} if "batch" in skip else batch_rounds(spark, srcs, count, args.repeat)
                print("AvailableNow streams ...", flush=True)
                if "stream" in skip:
                    res["stream"] = res["stream_one"] = {}
                else:
                    res["stream"] = stream_rounds(spark, srcs, count, args.repeat, workdir, count // 4)
                    res["stream_one"] = stream_rounds(spark, srcs, count, args.repeat, workdir, None)
                results["runs"][f"{count} x {size}"] = res
                report({"runs": {f"{count} x {size}": res}, "latency": {}}, args)   # (as it goes)
        if "latency" not in skip:
            cmd = java_producer(cluster, kafka, workdir)
            for rate in (float(r) for r in args.rates.split(",")):
                for system in ("kafka", "rmq", "floor", "floor+rmq"):
                    print(f"latency {system} at {rate:,.0f} msgs/s ...", flush=True)
                    results["latency"][(system, rate)] = latency(
                        spark, system, kafka, cluster, cmd, workdir, rate, args.seconds, args.warmup,
                        args.trigger_ms, sizes[0])
        spark.stop()
    finally:
        cluster.stop()
        kafka.stop()
    report(results, args)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {**results, "latency": {f"{s} {r}": v for (s, r), v in results["latency"].items()}},
            indent=1, default=str))
    if args.plot and not skip:
        plot(results, args, args.plot)
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
