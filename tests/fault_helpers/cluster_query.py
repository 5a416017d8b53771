"""Read a store with Spark executors in separate JVMs: master ``local-cluster[2,1,1024]``.

``python cluster_query.py --store REL_OR_ABS --sink DIR --checkpoint DIR --out RESULT.json``

Run with SPARK_HOME pointing at a folder that has pyspark's ``bin`` and ``jars`` (the workers
launch executors from there and put their work dirs under it). The store path may be relative
to this process's working directory: executors run in their own work dirs, so a read only works
if what a task needs travels in its input partition (absolute paths, options), not in driver
state. Every row is passed through ``mapInArrow`` that adds the working directory and pid of the
Python worker that produced it, which shows which executor read it.

Writes RESULT.json: ``{"executors": [...], "driver_cwd": ..., "driver_pid": ...,
"batch": [[queueId, queueOffset, msgId, bodyDigest, cwd, pid], ...], "stream": [...]}``, or
``{"skip": reason}`` when the local cluster cannot start.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import traceback

import phase_timings
import spark_archive


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--store", required=True)
    ap.add_argument("--sink", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from rmq_source import RocketMQDataSource

    started = time.monotonic()
    try:
        spark = (SparkSession.builder.master("local-cluster[2,1,1024]").appName("rmq-fault-cluster")
                 .config("spark.driver.extraJavaOptions", spark_archive.java_options())
                 .config("spark.executor.extraJavaOptions", spark_archive.LEAN_JVM)
                 .config("spark.ui.enabled", "false")
                 .config("spark.executor.memory", "768m")
                 .config("spark.driver.memory", "1g")
                 .config("spark.sql.shuffle.partitions", "2")
                 .config("spark.sql.session.timeZone", "UTC")
                 .getOrCreate())
    except Exception as exc:  # noqa: BLE001 - reported as the skip reason
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"skip": f"local-cluster master cannot start here: {exc!r}"[:2000]}, f)
        return 0
    phase_timings.record("Spark session start (helper process)", time.monotonic() - started,
                         "local-cluster")
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(RocketMQDataSource)
    sc = spark.sparkContext
    deadline = time.monotonic() + 180
    while True:   # the master returns before the workers' executors have registered
        ids = sc._jsc.sc().getExecutorIds()   # a Scala Seq of the non-driver executor ids
        executors = sorted(str(ids.apply(i)) for i in range(ids.size()))
        if len(executors) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.5)

    def tag_with_worker(batches):
        """Rows unchanged, plus where they were produced."""
        cwd, pid = os.getcwd(), os.getpid()
        for b in batches:
            digests = [hashlib.blake2b(x, digest_size=8).hexdigest()
                       for x in b.column("body").to_pylist()]
            yield pa.RecordBatch.from_arrays(
                [b.column("queueId"), b.column("queueOffset"), b.column("msgId"),
                 pa.array(digests), pa.array([cwd] * b.num_rows), pa.array([pid] * b.num_rows)],
                names=["queueId", "queueOffset", "msgId", "bodyDigest", "cwd", "pid"])

    out_schema = ("queueId int, queueOffset long, msgId string, bodyDigest string, cwd string, "
                  "pid long")
    result: dict = {"executors": executors, "driver_cwd": os.getcwd(), "driver_pid": os.getpid()}
    try:
        batch = (spark.read.format("rmq").option("storePath", args.store).option("topic", args.topic)
                 .option("numPartitions", "4").load())
        result["batch"] = [list(r) for r in batch.mapInArrow(tag_with_worker, out_schema).collect()]

        stream = (spark.readStream.format("rmq").option("storePath", args.store)
                  .option("topic", args.topic).option("startingOffsets", "earliest")
                  .option("maxMessagesPerTrigger", "100").load())
        query = (stream.mapInArrow(tag_with_worker, out_schema).writeStream.format("parquet")
                 .option("path", args.sink).option("checkpointLocation", args.checkpoint)
                 .trigger(availableNow=True).start())
        if not query.awaitTermination(300):
            query.stop()
            raise RuntimeError("the availableNow stream did not finish within 300 s")
        result["stream_batches"] = sum(1 for p in query.recentProgress if p["numInputRows"])
        result["stream"] = [list(r) for r in spark.read.parquet(args.sink).collect()]
    except Exception:  # noqa: BLE001 - the test shows the traceback
        result["error"] = traceback.format_exc()[-6000:]
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
