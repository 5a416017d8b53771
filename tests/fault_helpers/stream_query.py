"""A streaming query from a store into a parquet sink with a checkpoint, in its own process.

``python stream_query.py --store S --sink DIR --checkpoint DIR [--trigger 500|availableNow]
[--max-per-trigger N] [--sleep-per-task SECONDS] [--timeout SECONDS] [--master local[N]]
[--option NAME=VALUE ...] [--crash STEP:N] [--rmq-sink NAME=VALUE ...] [--rmq-sink-body-only]``

The query reads every queue of ``--topic`` from the earliest offset (a restarted query resumes
from its checkpoint); ``--option`` adds source options (e.g. ``consumerGroup=G``, and then
``startingOffsets=group`` to start from the group's progress instead). ``--sleep-per-task`` (when above 0) passes each task's rows through ``mapInArrow``
with a pause first, so a micro-batch stays in flight long enough for a test to kill the process in the
middle of it (the rows themselves are passed on unchanged). ``--crash`` runs the source of
``crash_source.py``, which SIGKILLs the whole query at that step of a batch's life. A processing-time query runs until the
process is killed; an availableNow query exits 0 when it finished, 1 when it failed.
``--rmq-sink`` writes ``body`` and ``properties['k']`` as ``shardingKey`` to RocketMQ with the
rmq sink instead (its options; ``--sink`` is then unused); with ``--rmq-sink-body-only`` only
``body`` (free rows: the batches the C core encodes).
Prints one line per event to stdout ("started", "progress <batchId> <numInputRows>", "done").
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import phase_timings
import spark_archive


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--store", required=True)
    ap.add_argument("--sink", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--topic", default="FaultTopic")
    ap.add_argument("--trigger", default="500")
    ap.add_argument("--max-per-trigger", type=int, default=0)
    ap.add_argument("--sleep-per-task", type=float, default=0.0)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--option", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--crash", default=None, metavar="STEP:N", help="see crash_source.py")
    ap.add_argument("--rmq-sink", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--rmq-sink-body-only", action="store_true")
    args = ap.parse_args(argv)
    options = {"storePath": args.store, "topic": args.topic, "startingOffsets": "earliest"}
    for item in args.option:
        name, sep, value = item.partition("=")
        if not sep:
            ap.error(f"--option {item!r} is not NAME=VALUE")
        options[name] = value

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if args.crash:   # before Spark starts, so that its JVM and workers inherit them
        os.environ["RMQ_CRASH_AT"] = args.crash
        os.environ["RMQ_CRASH_PGID"] = str(os.getpgrp())
    from pyspark.sql import SparkSession

    if args.crash:
        from fault_helpers.crash_source import CrashingDataSource as RocketMQDataSource
    else:
        from rmq_source import RocketMQDataSource

    started = time.monotonic()
    spark = (SparkSession.builder.master(args.master).appName("rmq-fault-stream")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.driver.memory", "1g")
             .config("spark.driver.extraJavaOptions", spark_archive.java_options())
             .getOrCreate())
    phase_timings.record("Spark session start (helper process)", time.monotonic() - started)
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(RocketMQDataSource)

    reader = spark.readStream.format("rmq").options(**options)
    if args.max_per_trigger:
        reader = reader.option("maxMessagesPerTrigger", str(args.max_per_trigger))
    df = reader.load()
    pause = args.sleep_per_task

    def slow_identity(batches):
        time.sleep(pause)
        yield from batches

    if pause > 0:
        df = df.mapInArrow(slow_identity, df.schema)
    if args.rmq_sink:
        from pyspark.sql import functions as F
        out = df.select("body") if args.rmq_sink_body_only else df.select(
            "body", F.col("properties")["k"].alias("shardingKey"))
        writer = (out.writeStream.format("rmq")
                  .options(**dict(item.split("=", 1) for item in args.rmq_sink))
                  .option("checkpointLocation", args.checkpoint))
    else:
        writer = (df.writeStream.format("parquet").option("path", args.sink)
                  .option("checkpointLocation", args.checkpoint))
    if args.trigger == "availableNow":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{int(args.trigger)} milliseconds")
    query = writer.start()
    print("started", flush=True)
    if args.trigger == "availableNow":
        try:
            finished = query.awaitTermination(args.timeout)
        except Exception as exc:  # noqa: BLE001 - reported to the caller through the exit code
            print(f"failed: {exc}", flush=True)
            return 1
        for p in query.recentProgress:
            print(f"progress {p['batchId']} {p['numInputRows']}", flush=True)
        if not finished:
            print("timeout", flush=True)
            query.stop()
            return 1
        print("done", flush=True)
        spark.stop()
        return 0
    seen = -1
    while True:   # until killed
        query.awaitTermination(0.5)
        if query.exception() is not None:
            print(f"failed: {query.exception()}", flush=True)
            return 1
        for p in query.recentProgress:
            if p["batchId"] > seen:
                seen = p["batchId"]
                print(f"progress {p['batchId']} {p['numInputRows']}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
