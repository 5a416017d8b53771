"""Writing to RocketMQ: the sink against RocketMQ's own Java producer, same cluster, same run.

Starts a NameServer and two brokers of one RocketMQ version (``tests/rocketmq_cluster.py``; Java 17
and Maven) with a topic of 4 queues on each, then sends ``--messages`` messages of 1 KiB in
batches of ``--batch`` per request, each case best of ``--repeat`` after a warm-up pass:

* **java**: the real ``DefaultMQProducer`` (compiled here) sending ``List<Message>`` batches
  (RocketMQ's batch send: one synchronous request at a time, a queue per send, round robin);
  wall seconds and CPU seconds of its JVM, measured inside it;
* **ours, no Spark**: Arrow batches of the same bodies through a task's path
  (:func:`rmq_source.sink.task.send_rows`: UNIQ_KEY, properties, encoding, sends),
  ``maxInFlight`` 8 by default: the sink's cost per message on the Spark side (CPU µs of this
  process per message) and its rate;
* **spark**: ``df.write.format("rmq")`` of a DataFrame of the same bodies (``local[2]``, two
  tasks), wall clock.

Target (issue 13): the Spark write's rate >= the Java producer's batch send (ratio printed).

    python bench/bench_sink.py [--version 5.3] [--messages 100000] [--batch 64] [--repeat 3]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (puts the checkout on sys.path)
from common import REPO, print_machine, print_table, run_java_client, spark_session

sys.path.insert(0, str(REPO / "tests"))

import pyarrow as pa  # noqa: E402
import rocketmq_cluster  # noqa: E402
from rmq_source.remote import RemotingClient  # noqa: E402
from rmq_source.remote import requests as rq  # noqa: E402
from rmq_source.sink.options import parse_sink_options  # noqa: E402
from rmq_source.sink.producer import TaskProducer  # noqa: E402
from rmq_source.sink.task import send_rows  # noqa: E402
from rmq_source.sink.uniq import TaskKeys  # noqa: E402

TOPIC = "SinkBench"
BROKERS, QUEUES_PER_BROKER, BODY = ("broker-a", "broker-b"), 4, 1024

JAVA_SEND = r"""
import java.lang.management.ManagementFactory;
import java.util.ArrayList;
import java.util.List;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.message.Message;

public class BatchSend {
    public static void main(String[] args) throws Exception {
        DefaultMQProducer p = new DefaultMQProducer("sink_bench_java");
        p.setNamesrvAddr(args[0]);
        p.setInstanceName("sink-bench-" + System.nanoTime());
        p.start();
        com.sun.management.OperatingSystemMXBean os =
            (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
        int n = Integer.parseInt(args[2]), batch = Integer.parseInt(args[3]);
        byte[] body = new byte[1024];
        for (int i = 0; i < body.length; i++) body[i] = (byte) ('a' + i % 26);
        for (int pass = 0; pass < Integer.parseInt(args[4]); pass++) {
            long t0 = System.nanoTime(), cpu0 = os.getProcessCpuTime(), sent = 0;
            for (int start = 0; start < n; start += batch) {
                List<Message> msgs = new ArrayList<>();
                for (int i = start; i < Math.min(n, start + batch); i++) msgs.add(new Message(args[1], body));
                SendResult r = p.send(msgs);
                if (r.getSendStatus() != SendStatus.SEND_OK) throw new RuntimeException(r.toString());
                sent += msgs.size();
            }
            System.out.println("PASS " + pass + " " + sent + " " + (System.nanoTime() - t0) + " "
                               + (os.getProcessCpuTime() - cpu0));
        }
        p.shutdown();
    }
}
"""


def start_cluster(version_line: str, workdir: Path):
    version, jars = rocketmq_cluster.resolve_line(version_line)
    cluster = rocketmq_cluster.Cluster(version, jars, workdir, broker_names=BROKERS).start()
    with RemotingClient(timeout=30) as client:
        for name in BROKERS:
            rq.create_topic(client, cluster.brokers[name].addr, TOPIC, read_queues=QUEUES_PER_BROKER)
        deadline = time.monotonic() + 60
        while len(rq.topic_route(client, cluster.namesrv_addr, TOPIC).queue_datas) < len(BROKERS):
            assert time.monotonic() < deadline, "the topic never reached the NameServer"
            time.sleep(0.2)
    return cluster


def body() -> bytes:
    return bytes(ord("a") + i % 26 for i in range(BODY))


def java(cluster, workdir: Path, n: int, batch: int, passes: int) -> list[tuple[int, float, float]]:
    lines = run_java_client(cluster, workdir, "BatchSend", JAVA_SEND, [TOPIC, str(n), str(batch), str(passes)])
    rows = [line.split() for line in lines if line.startswith("PASS ")]
    return [(int(r[2]), int(r[3]) / 1e9, int(r[4]) / 1e9) for r in rows]


def ours(cluster, n: int, batch: int, passes: int) -> list[tuple[int, float, float]]:
    """(messages, wall s, CPU s of this process) per pass: Arrow batches of 8,192 rows through
    the task's path (:func:`rmq_source.sink.task.send_rows`), no Spark."""
    opts = parse_sink_options({"namesrvAddr": cluster.namesrv_addr, "topic": TOPIC,
                               "batchMessages": str(batch)}, streaming=False)
    data = pa.RecordBatch.from_pydict({"body": pa.array([body()] * 8192, pa.binary())})
    out = []
    for p in range(passes):
        t0, c0 = time.perf_counter(), time.process_time()
        chunks = [data.slice(0, min(8192, n - row)) for row in range(0, n, 8192)]
        stats = send_rows(TaskProducer(opts, 0), chunks, TaskKeys(f"bench-{p}", 0, 0))
        out.append((stats.messages, time.perf_counter() - t0, time.process_time() - c0))
    return out


def spark_write(cluster, n: int, batch: int, passes: int) -> list[tuple[int, float]]:
    spark = spark_session()
    from pyspark.sql import functions as F
    from rmq_source import RocketMQDataSource
    spark.dataSource.register(RocketMQDataSource)
    df = spark.range(n, numPartitions=2).select(F.lit(body()).alias("body")).cache()
    df.count()
    out = []
    for _ in range(passes):
        t0 = time.perf_counter()
        (df.write.format("rmq").mode("append").option("namesrvAddr", cluster.namesrv_addr)
         .option("topic", TOPIC).option("batchMessages", str(batch)).save())
        out.append((n, time.perf_counter() - t0))
    spark.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", default="5.3", choices=("4.9", "5.3"))
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rmq-sink-bench-"))
    print_machine()
    cluster = start_cluster(args.version, workdir)
    passes = args.repeat + 1                      # the first pass warms caches and the JIT
    try:
        j = min(java(cluster, workdir, args.messages, args.batch, passes)[1:], key=lambda r: r[1])
        o = min(ours(cluster, args.messages, args.batch, passes)[1:], key=lambda r: r[1])
        s = min(spark_write(cluster, args.messages, args.batch, passes)[1:], key=lambda r: r[1])
    finally:
        cluster.stop()
    n = args.messages
    assert j[0] == n and o[0] == n, (j, o)
    print(f"\nRocketMQ {cluster.version}, {n} messages of {BODY} B in batches of {args.batch} to "
          f"{len(BROKERS)} brokers x {QUEUES_PER_BROKER} queues, best of {args.repeat} after a warm-up pass")
    print_table(["writer", "wall clock", "CPU (writer process)"], [
        ["RocketMQ Java DefaultMQProducer, batch send", f"{n / j[1] / 1e3:.0f} k msgs/s",
         f"{j[2] / n * 1e6:.1f} us/msg"],
        ["ours: TaskProducer, no Spark", f"{n / o[1] / 1e3:.0f} k msgs/s", f"{o[2] / n * 1e6:.1f} us/msg"],
        ["df.write.format('rmq') (local[2], 2 tasks)", f"{n / s[1] / 1e3:.0f} k msgs/s", "-"],
    ])
    print(f"\nSpark write / Java batch send (target >= 1x): {j[1] / s[1]:.2f}x; "
          f"ours without Spark / Java: {j[1] / o[1]:.2f}x")


if __name__ == "__main__":
    main()
