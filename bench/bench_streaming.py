"""Streaming throughput and end-to-end latency of ``spark.readStream.format("rmq")``.

1. Sustained rate. ``Trigger.AvailableNow`` over the whole backlog of the bench store
   (bench_spark.py's store of 1 KiB messages, reused from ``--workdir``), micro-batches capped by
   ``maxMessagesPerTrigger``, ``noop`` sink, fresh checkpoint per round, best of ``--repeat``.
   Rows/s is all rows over the wall time from ``start()`` to the end of the query; the same-run
   batch read of the same store (``spark.read``, noop) is printed beside it, with the per-batch
   phase times Spark reports (``durationMs``).

2. Latency. A separate writer process (``StoreWriter``, this script with ``--produce``) appends
   ``--rate`` messages/s to a fresh store while a ``processingTime`` query (``--trigger-ms``) runs
   with a ``foreachBatch`` sink that collects each micro-batch to the driver. For every message,
   latency = (driver clock when ``collect()`` of its micro-batch returned) - (its storeTimestamp,
   which the writer sets from the same machine clock at append, in ms). It covers waiting for the
   next trigger, planning (latestOffset, partitions), the task reading the store, the Arrow
   transport and the collect. The first ``--warmup`` seconds of messages are not counted (Python
   workers start). Reported: p50/p95/p99/max.

    python bench/bench_streaming.py [--quick] [--workdir /tmp/rmq_bench]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import common  # noqa: F401  (puts the checkout on sys.path)
from common import (DEFAULT_WORKDIR, TOPIC, StoreSpec, ensure_store, fmt_rate, print_machine,
                    print_table, spark_session, store_bytes, warm_page_cache)

LATENCY_QUEUES = 4


# ------------------------------------------------------------------------------ producer process

def produce(root: str, rate: float, seconds: float) -> None:
    """Append ``rate`` messages/s for ``seconds`` (1 KiB bodies, round robin over the queues)."""
    from rmq_source.store.writer import StoreWriter

    body = os.urandom(1024)
    count = int(rate * seconds)
    with StoreWriter(root) as w:
        t0 = time.perf_counter()
        for i in range(count):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            w.append(TOPIC, body, tags="TagA")
    print(json.dumps({"produced": count}), flush=True)


# ------------------------------------------------------------------------------ sustained rate

def sustained(spark, store_root: Path, workdir: Path, max_per_trigger: int, repeat: int) -> dict:
    msgs, rec_bytes = store_bytes(store_root)
    runs = []
    for r in range(repeat):
        chk = workdir / f"stream_chk_{r}"
        shutil.rmtree(chk, ignore_errors=True)
        df = (spark.readStream.format("rmq").option("storePath", str(store_root))
              .option("topic", TOPIC).option("startingOffsets", "earliest")
              .option("maxMessagesPerTrigger", str(max_per_trigger)).load())
        t0 = time.perf_counter()
        q = (df.writeStream.format("noop").option("checkpointLocation", str(chk))
             .trigger(availableNow=True).start())
        q.awaitTermination()
        secs = time.perf_counter() - t0
        if q.exception() is not None:
            raise SystemExit(f"streaming query failed: {q.exception()}")
        progress = [p for p in q.recentProgress if p["numInputRows"]]
        rows = sum(p["numInputRows"] for p in progress)
        if rows != msgs:
            raise SystemExit(f"streaming read {rows} rows, expected {msgs}")
        runs.append({"seconds": secs, "rows": rows, "progress": progress})
        shutil.rmtree(chk, ignore_errors=True)
        print(f"  availableNow round {r + 1}: {rows:,} rows in {secs:.2f} s, "
              f"{len(progress)} micro-batches", flush=True)

    def batch_read():
        (spark.read.format("rmq").option("storePath", str(store_root)).option("topic", TOPIC)
         .load().write.format("noop").mode("overwrite").save())

    batch_times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        batch_read()
        batch_times.append(time.perf_counter() - t0)
    best = min(runs, key=lambda x: x["seconds"])
    return {"msgs": msgs, "bytes": rec_bytes, "best": best, "all": [x["seconds"] for x in runs],
            "batch": min(batch_times), "batch_all": batch_times}


# ------------------------------------------------------------------------------ latency

def latency(spark, workdir: Path, rate: float, seconds: float, warmup: float, trigger_ms: int,
            num_partitions: int | None) -> dict:
    root = workdir / "latency_store"
    chk = workdir / "latency_chk"
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(chk, ignore_errors=True)
    from rmq_source.store.writer import StoreWriter

    with StoreWriter(root, commitlog_file_size=64 << 20) as w:
        w.create_topic(TOPIC, LATENCY_QUEUES)
        for _ in range(LATENCY_QUEUES):
            w.append(TOPIC, b"prime", tags="TagA")

    seen: list[tuple[int, float]] = []      # (storeTimestamp ms, driver time ms when collected)
    lock = threading.Lock()

    batches: set[int] = set()              # ids of micro-batches that carried rows

    def sink(df, batch_id):
        rows = df.selectExpr("unix_millis(storeTimestamp) AS ts").collect()
        now = time.time() * 1000
        with lock:
            seen.extend((r.ts, now) for r in rows)
            if rows:
                batches.add(batch_id)

    reader = (spark.readStream.format("rmq").option("storePath", str(root)).option("topic", TOPIC)
              .option("startingOffsets", "earliest"))
    if num_partitions:
        reader = reader.option("numPartitions", str(num_partitions))
    q = (reader.load().writeStream.foreachBatch(sink).option("checkpointLocation", str(chk))
         .trigger(processingTime=f"{trigger_ms} milliseconds").start())
    deadline = time.time() + 120
    while len(seen) < LATENCY_QUEUES and time.time() < deadline:   # the primer went through
        time.sleep(0.1)
    producer = subprocess.Popen(
        [sys.executable, __file__, "--produce", str(root), "--rate", str(rate),
         "--seconds", str(seconds)], stdout=subprocess.PIPE, text=True,
        env={**os.environ,
             "PYTHONPATH": os.pathsep.join([str(common.REPO), str(common.BENCH_DIR)])})
    started_ms = time.time() * 1000
    out, _ = producer.communicate(timeout=seconds + 120)
    produced = json.loads(out.strip().splitlines()[-1])["produced"]
    expected = LATENCY_QUEUES + produced
    deadline = time.time() + 60
    while len(seen) < expected and time.time() < deadline:
        time.sleep(0.1)
    progress = list(q.recentProgress)
    q.stop()
    if q.exception() is not None:
        raise SystemExit(f"latency query failed: {q.exception()}")
    with lock:
        got = sorted(seen)[LATENCY_QUEUES:]
    lat = [now - ts for ts, now in got if ts >= started_ms + warmup * 1000]
    lat.sort()

    def pct(p):
        return lat[min(len(lat) - 1, int(round(p / 100 * (len(lat) - 1))))]

    phases: dict[str, list[float]] = {}       # (recentProgress keeps the last 100 batches)
    for p in progress:
        if p["numInputRows"]:
            for k, v in p["durationMs"].items():
                phases.setdefault(k, []).append(v)
    return {"produced": produced, "received": len(got), "counted": len(lat),
            "p50": pct(50), "p95": pct(95), "p99": pct(99), "max": lat[-1],
            "mean": statistics.mean(lat),
            "phases": {k: statistics.median(v) for k, v in phases.items()},
            "batches": len(batches)}


# ------------------------------------------------------------------------------ main

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=DEFAULT_WORKDIR)
    parser.add_argument("--messages", type=int, default=2_000_000,
                        help="backlog size (bench store)")
    parser.add_argument("--max-per-trigger", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--rate", type=float, default=200.0, help="latency test: messages/s")
    parser.add_argument("--seconds", type=float, default=60.0, help="latency test: producing time")
    parser.add_argument("--warmup", type=float, default=5.0,
                        help="latency test: seconds not counted")
    parser.add_argument("--trigger-ms", type=int, default=200)
    parser.add_argument("--latency-partitions", default="default,1",
                        help="latency test: numPartitions values to run, 'default' = one task per "
                             f"queue ({LATENCY_QUEUES} queues)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--quick", action="store_true",
                        help="200,000-message backlog (50,000 per trigger), 20 s latency test")
    parser.add_argument("--produce", metavar="STORE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.produce:
        produce(args.produce, args.rate, args.seconds)
        return
    if args.quick:
        args.messages, args.max_per_trigger, args.seconds = 200_000, 50_000, 20.0
    args.repeat = max(2, args.repeat)
    workdir = Path(args.workdir)

    print_machine()
    store_root = ensure_store(workdir, StoreSpec(args.messages))
    warm_page_cache([store_root])
    spark = spark_session(args.master)

    print("sustained rate (availableNow, maxMessagesPerTrigger, noop sink):", flush=True)
    s = sustained(spark, store_root, workdir, args.max_per_trigger, args.repeat)
    lats = []
    for value in args.latency_partitions.split(","):
        parts = None if value.strip() == "default" else int(value)
        print(f"latency: {args.rate:.0f} msgs/s for {args.seconds:.0f} s, processingTime "
              f"{args.trigger_ms} ms, numPartitions {parts or 'default'}, foreachBatch collect ...",
              flush=True)
        lats.append((parts, latency(spark, workdir, args.rate, args.seconds, args.warmup,
                                    args.trigger_ms, parts)))
    spark.stop()

    best = s["best"]
    secs = best["seconds"]
    print(f"\nSustained rate, {args.master}: {s['msgs']:,} rows of 1 KiB bodies, "
          f"maxMessagesPerTrigger={args.max_per_trigger:,}, best of {args.repeat}")
    print_table(["query", "micro-batches", "best s", "rows/s", "GB/s", "all rounds s"], [
        ["readStream availableNow -> noop", len(best["progress"]), f"{secs:.2f}",
         fmt_rate(s["msgs"] / secs), f"{s['bytes'] / secs / 1e9:.2f}",
         " ".join(f"{x:.2f}" for x in s["all"])],
        ["read (batch) -> noop, same store", 1, f"{s['batch']:.2f}",
         fmt_rate(s["msgs"] / s["batch"]),
         f"{s['bytes'] / s['batch'] / 1e9:.2f}", " ".join(f"{x:.2f}" for x in s["batch_all"])],
    ])
    print(f"streaming / batch rows/s (same run): {s['batch'] / secs:.2f}")
    phases: dict[str, list[float]] = {}
    for p in best["progress"]:
        for k, v in p["durationMs"].items():
            phases.setdefault(k, []).append(v)
    print("median per micro-batch phase, ms: " + ", ".join(
        f"{k} {statistics.median(v):.0f}" for k, v in sorted(phases.items())))
    print(f"median processedRowsPerSecond: "
          f"{fmt_rate(statistics.median(p['processedRowsPerSecond'] for p in best['progress']))}\n")

    print(f"End-to-end latency, append -> foreachBatch collect, {args.rate:.0f} msgs/s over "
          f"{LATENCY_QUEUES} queues for {args.seconds:.0f} s (first {args.warmup:.0f} s not "
          "counted), "
          f"processingTime {args.trigger_ms} ms:")
    print_table(["tasks per micro-batch", "counted / produced / received", "micro-batches",
                 "p50 ms", "p95 ms", "p99 ms", "max ms", "mean ms"],
                [[f"{parts} (numPartitions={parts})" if parts
                  else f"{LATENCY_QUEUES} (default: one per queue)",
                  f"{lat['counted']:,} / {lat['produced']:,} / {lat['received']:,}", lat["batches"],
                  f"{lat['p50']:.0f}", f"{lat['p95']:.0f}", f"{lat['p99']:.0f}",
                  f"{lat['max']:.0f}",
                  f"{lat['mean']:.0f}"] for parts, lat in lats])
    for parts, lat in lats:
        print("median micro-batch phases (last 100 with data), "
              f"numPartitions {parts or 'default'}, "
              "ms: " + ", ".join(
            f"{k} {v:.0f}" for k, v in sorted(lat["phases"].items())))


if __name__ == "__main__":
    main()
