"""``bench_scale.py --live`` (issue 44): a live cluster's micro-batches over 8, 1,024 and 10,000 queues.

Starts a NameServer and two brokers of RocketMQ 5.3 (``tests/rocketmq_cluster.py``, loopback; the
brokers with the JVM's own JIT and GC, as a deployment runs them, not the test servers' C1-only
flags) and
one topic per size, its queues split over the two brokers (4 + 4, 512 + 512, 5,000 + 5,000;
``--quick``: no 10,000), each holding the same ``MESSAGES`` messages of 100 B sent round robin over
its queues. Then, per topic:

1. **Driver profile** (this process, no Spark): a :class:`RmqStreamReader` makes the calls Spark
   makes for an AvailableNow run with ``maxMessagesPerTrigger=500`` (``initialOffset``,
   ``prepareForTriggerAvailableNow``, then ``latestOffset``, ``partitions``, the tasks' reads,
   ``commit`` per batch), ``latestOffset`` under cProfile, for an ordered and an unordered group
   query and a query without a group. Printed: median wall ms per batch of ``latestOffset``,
   ``partitions`` and the tasks' reads (in this process), and where ``latestOffset`` spends its
   time, per batch (cumulative ms of: routes, queue offsets, group offsets read, group commits,
   locks, heartbeats, allocation, batch plans). Profiling slows Python calls down: the shares
   count, not the totals (``latestOffset``'s own time is the Spark part's).
2. **Spark** (``local[2]``): the same AvailableNow stream into the ``noop`` sink, a new group each
   run, best of ``--repeat`` runs: the whole read (start to end of the query), the median
   micro-batch (``triggerExecution`` of the batches with rows) and the median ``latestOffset``
   (Spark's own ``durationMs``), and the ratios to the 8-queue topic's. Targets: 1,024 queues
   <= 1.5x of 8 (median micro-batch and whole read); 10,000 queues: ``latestOffset`` <= 200 ms.
3. **Java** (for reference): RocketMQ's DefaultMQPushConsumer of the same version, ordered
   (``MessageListenerOrderly``) and not, a new group each: from its start until it has consumed
   every message (its rebalance, locks and offset persistence every 5 s included), best of
   ``--repeat``.
"""
from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
import tempfile
import time
import types
import uuid
from pathlib import Path

from common import REPO, print_table, run_java_client, spark_session

sys.path.insert(0, str(REPO / "tests"))

import rocketmq_cluster  # noqa: E402
from rmq_source.remote import RemotingClient  # noqa: E402
from rmq_source.remote import requests as rq  # noqa: E402

BROKERS = ("broker-a", "broker-b")
MESSAGES, BODY, PER_TRIGGER = 4000, 100, 500
LATEST_TARGET_MS = 200.0
RATIO_TARGET = 1.5
MODES = ("ordered", "unordered", "no group")

#: where latestOffset's time goes: (label, functions whose cumulative time counts)
PARTS = [
    ("routes", ("remote/backend.py", "route")),
    ("queue offsets", ("remote/backend.py", "infos_reachable")),
    ("group offsets read", ("group/offset_store.py", "read_offsets")),
    ("group commits", ("spark/stream_reader.py", "_commit_group")),
    ("locks", ("remote/locks.py", "_lock")),
    ("heartbeats", ("remote/membership.py", "heartbeat")),
    ("allocation", ("group/session.py", "_allocate")),
    ("batch plans", ("group/session.py", "record_plan")),
]

JAVA_CONSUME = r"""
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.*;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;

public class ScaleConsume {
    public static void main(String[] a) throws Exception {
        String ns = a[0], topic = a[1];
        int total = Integer.parseInt(a[2]);
        boolean ordered = a[3].equals("ordered");
        CountDownLatch left = new CountDownLatch(total);
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(a[4]);
        c.setNamesrvAddr(ns);
        c.setClientIP("127.0.0.1");
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.subscribe(topic, "*");
        if (ordered) {
            c.registerMessageListener((MessageListenerOrderly) (msgs, ctx) -> {
                msgs.forEach(m -> left.countDown());
                return ConsumeOrderlyStatus.SUCCESS;
            });
        } else {
            c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                msgs.forEach(m -> left.countDown());
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
        }
        long t0 = System.nanoTime();
        c.start();
        boolean all = left.await(Long.parseLong(a[5]), TimeUnit.SECONDS);
        long ms = (System.nanoTime() - t0) / 1000000;
        c.shutdown();
        System.out.println("DONE " + (all ? ms : -1));
        System.out.flush();
        System.exit(0);    // (5.3.3's orderly service leaves a non-daemon thread running)
    }
}
"""


def topic_of(queues: int) -> str:
    return f"Scale{queues}"


def start_cluster(workdir: Path, sizes: list[int]):
    version, jars = rocketmq_cluster.resolve_line("5.3")
    # (the JIT and GC flags of a production broker, as bench_vs_kafka.py: the test flags, C1 only,
    # make a broker's statistics of 5,000 queues several times slower than a deployment's)
    cluster = rocketmq_cluster.Cluster(version, jars, workdir / "cluster", broker_names=BROKERS,
                                       broker_kw={"jvm_opts": (), "heap_mb": 1024}).start()
    body = b"x" * BODY
    with RemotingClient(timeout=60) as client:
        for queues in sizes:
            per_broker = queues // len(BROKERS)
            for name in BROKERS:
                rq.create_topic(client, cluster.brokers[name].addr, topic_of(queues), read_queues=per_broker)
            counts: dict[tuple[str, int], int] = {}
            for i in range(MESSAGES):            # round robin over every queue of the topic
                q = i % queues
                key = (BROKERS[q // per_broker], q % per_broker)
                counts[key] = counts.get(key, 0) + 1
            for (name, q), n in sorted(counts.items()):
                for first in range(0, n, 64):
                    rq.send_batch(client, cluster.brokers[name].addr, topic_of(queues),
                                  [{"body": body, "tags": "t"} for _ in range(min(64, n - first))], queue_id=q)
            deadline = time.monotonic() + 60
            while not rq.topic_route(client, cluster.namesrv_addr, topic_of(queues)).queue_datas:
                assert time.monotonic() < deadline, "topic never routed"
                time.sleep(0.2)
    return cluster


def _options(namesrv: str, queues: int, mode: str, state: Path) -> dict[str, str]:
    out = {"namesrvAddr": namesrv, "topic": topic_of(queues), "maxMessagesPerTrigger": str(PER_TRIGGER),
           "startingOffsets": "earliest"}
    if mode != "no group":
        out.update({"consumerGroup": f"scale_{mode.replace(' ', '')}_{uuid.uuid4().hex[:8]}",
                    "orderly": str(mode == "ordered").lower(), "groupStatePath": str(state)})
    return out


def driver_profile(namesrv: str, queues: int, mode: str, state: Path) -> dict:
    """The calls Spark makes for one AvailableNow run, in this process, under cProfile."""
    from rmq_source.spark.compat import ReadMaxRows
    from rmq_source.spark.options import parse_options
    from rmq_source.spark.stream_reader import RmqStreamReader
    opts = parse_options(_options(namesrv, queues, mode, state), streaming=True)
    reader = RmqStreamReader(opts)
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    latest, parts, reads, rows = [], [], [], 0
    prof = cProfile.Profile()
    try:
        for _ in range(10 * MESSAGES // PER_TRIGGER):
            t0 = time.perf_counter()
            prof.enable()
            end = reader.latestOffset(start, ReadMaxRows(PER_TRIGGER))
            prof.disable()
            t1 = time.perf_counter()
            if end == start:
                break
            tasks = reader.partitions(start, end)
            t2 = time.perf_counter()
            for task in tasks:
                rows += sum(b.num_rows for b in reader.read(task))
            reader.commit(end)
            start = end
            latest.append((t1 - t0) * 1000)
            parts.append((t2 - t1) * 1000)
            reads.append((time.perf_counter() - t2) * 1000)
    finally:
        reader.stop()
    assert rows == MESSAGES, f"{queues} queues, {mode}: read {rows} of {MESSAGES} messages"
    stats = pstats.Stats(prof).stats
    batches = len(latest) + 1           # (the last call planned nothing)
    shares = {}
    for label, (path, name) in PARTS:
        total = sum(v[3] for (file, _, func), v in stats.items() if file.endswith(path) and func == name)
        shares[label] = total * 1000 / batches
    return {"latestOffset": statistics.median(latest), "partitions": statistics.median(parts),
            "reads": statistics.median(reads), "batches": len(latest), "shares": shares}


def spark_run(spark, namesrv: str, queues: int, mode: str, tmp: Path) -> dict:
    reader = spark.readStream.format("rmq")
    for k, v in _options(namesrv, queues, mode, tmp / "state").items():
        reader = reader.option(k, v)
    t0 = time.perf_counter()
    q = (reader.load().writeStream.format("noop").option("checkpointLocation", str(tmp / f"chk-{uuid.uuid4().hex}"))
         .trigger(availableNow=True).start())
    q.awaitTermination(1800)
    whole = time.perf_counter() - t0
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))
    progress = [p for p in q.recentProgress if p["numInputRows"] > 0]
    read = sum(p["numInputRows"] for p in q.recentProgress)
    assert read == MESSAGES, f"{queues} queues, {mode}: read {read} of {MESSAGES} messages"
    return {"whole": whole, "batch": statistics.median(p["durationMs"]["triggerExecution"] for p in progress),
            "latestOffset": statistics.median(p["durationMs"].get("latestOffset", 0) for p in q.recentProgress),
            "batches": len(progress)}


JAVA_WAIT_S = 180


def java_run(cluster, queues: int, mode: str, workdir: Path) -> float | None:
    """Seconds until the Java consumer had every message; None when it had not after JAVA_WAIT_S."""
    view = types.SimpleNamespace(namesrv_addr=cluster.namesrv_addr, jars=cluster.jars)
    lines = run_java_client(view, workdir, "ScaleConsume", JAVA_CONSUME,
                            [topic_of(queues), str(MESSAGES), mode, f"java_{mode}_{uuid.uuid4().hex[:8]}",
                             str(JAVA_WAIT_S)], timeout=JAVA_WAIT_S + 120)
    ms = int(next(line for line in lines if line.startswith("DONE ")).split()[1])
    return ms / 1000 if ms >= 0 else None


def main(args) -> None:
    sizes = [8, 1024] if args.quick else [8, 1024, 10000]
    with tempfile.TemporaryDirectory(prefix="rmq-scale-live-") as tmp:
        tmp = Path(tmp)
        print(f"starting RocketMQ 5.3 (NameServer + {len(BROKERS)} brokers), {MESSAGES:,} messages of "
              f"{BODY} B per topic ...", flush=True)
        cluster = start_cluster(tmp, sizes)
        try:
            parts = args.live_parts.split(",")
            if "driver" in parts:
                _driver(cluster, sizes, args.repeat, tmp)
            if "spark" in parts:
                _spark(cluster, sizes, args.repeat, args.master, tmp)
            if "java" in parts:
                _java(cluster, sizes, args.repeat, tmp)
        finally:
            cluster.stop(graceful=False)


def _driver(cluster, sizes, repeat, tmp) -> None:
    rows, share_rows = [], []
    for queues in sizes:
        for mode in MODES:
            best = min((driver_profile(cluster.namesrv_addr, queues, mode, tmp / f"state-{uuid.uuid4().hex}")
                        for _ in range(repeat)), key=lambda r: r["latestOffset"])
            rows.append([f"{queues:,}", mode, best["batches"], f"{best['latestOffset']:.0f}",
                         f"{best['partitions']:.0f}", f"{best['reads']:.0f}"])
            share_rows.append([f"{queues:,}", mode] + [f"{best['shares'][label]:.1f}" for label, _ in PARTS])
    print("\ndriver calls without Spark, median ms per batch (best run; latestOffset timed under "
          "cProfile, which slows Python calls: its own time is the Spark table's):")
    print_table(["queues", "query", "batches", "latestOffset", "partitions", "tasks' reads"], rows)
    print("where latestOffset goes, ms per batch under cProfile:")
    print_table(["queues", "query"] + [label for label, _ in PARTS], share_rows)


def _spark(cluster, sizes, repeat, master, tmp) -> None:
    spark = spark_session(master)
    try:
        results: dict[tuple[int, str], dict] = {}
        for mode in MODES:
            spark_run(spark, cluster.namesrv_addr, 8, mode, tmp)          # warm-up
            for queues in sizes:
                runs = [spark_run(spark, cluster.namesrv_addr, queues, mode, tmp) for _ in range(repeat)]
                results[(queues, mode)] = min(runs, key=lambda r: r["whole"])
    finally:
        spark.stop()
    rows = []
    for queues in sizes:
        for mode in MODES:
            r, base = results[(queues, mode)], results[(8, mode)]
            rows.append([f"{queues:,}", mode, r["batches"], f"{r['whole']:.1f}", f"{r['whole'] / base['whole']:.2f}x",
                         f"{r['batch']:.0f}", f"{r['batch'] / base['batch']:.2f}x", f"{r['latestOffset']:.0f}"])
    print("\nSpark AvailableNow into noop, best of %d runs:" % repeat)
    print_table(["queues", "query", "batches", "whole read s", "vs 8", "median batch ms", "vs 8",
                 "median latestOffset ms"], rows)
    print("targets:")
    for mode in MODES:
        if (1024, mode) in results:
            r, base = results[(1024, mode)], results[(8, mode)]
            print(f"  {mode}: 1,024 queues whole read {r['whole'] / base['whole']:.2f}x, median batch "
                  f"{r['batch'] / base['batch']:.2f}x (target <= {RATIO_TARGET}x)")
        if (10000, mode) in results:
            print(f"  {mode}: 10,000 queues median latestOffset {results[(10000, mode)]['latestOffset']:.0f} ms "
                  f"(target <= {LATEST_TARGET_MS:.0f} ms)")
    print(flush=True)


def _java(cluster, sizes, repeat, tmp) -> None:
    rows = []
    for queues in sizes:
        for mode in ("ordered", "unordered"):
            runs = [java_run(cluster, queues, mode, tmp) for _ in range(repeat)]
            done = [r for r in runs if r is not None]
            rows.append([f"{queues:,}", mode, f"{min(done):.1f}" if done else f"not all after {JAVA_WAIT_S} s"])
    print("\nJava DefaultMQPushConsumer, start to every message consumed, best of %d:" % repeat)
    print_table(["queues", "listener", "whole read s"], rows)
