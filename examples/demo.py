"""The main demo: a sample store, a streaming query with a consumer group, lag, backfill, reset.

    python examples/demo.py [--workdir DIR] [--messages N]

1. generates a sample store with the broker-compatible writer (``rmq-store generate``);
2. shows the group's lag (nothing consumed yet);
3. streams the topic into parquet with ``consumerGroup`` (Trigger.AvailableNow, admission-limited
   micro-batches) and shows the lag again (zero) after more messages arrive (lag > 0);
4. backfills a time window with a batch read (``startingTimestamp``/``endingTimestamp``);
5. resets the group's offset to a timestamp and shows the lag that creates.

Everything it starts listens and talks on 127.0.0.1 only: a local Spark session (``local[2]``, its
driver bound to ``SPARK_LOCAL_IP``, 127.0.0.1 unless that is set; see _common.py). To point it at a
real deployment instead, give the reader a broker's real store folder (``storePath``, as ``--store``
does in backfill_by_timestamp.py) or ``namesrvAddr`` for a live cluster; to run the same code on a
Spark cluster, submit it with ``spark-submit --master ...`` as in docs/deploy.md
(examples/cluster_job.py).
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from _common import generate, local_spark, show_lag, table

from rmq_source.group.offset_store import ReadOffsetType
from rmq_source.group.progress import reset_group
from rmq_source.group.report import reset_lines
from rmq_source.store.backend import StoreBackend
from rmq_source.store.reader import Store

TOPIC, GROUP = "Orders", "lake-loader"


def stream_once(spark, store: Path, sink: Path, checkpoint: Path) -> list[dict]:
    query = (spark.readStream.format("rmq")
             .option("storePath", str(store)).option("topic", TOPIC)
             .option("consumerGroup", GROUP).option("consumeFromWhere", "CONSUME_FROM_FIRST_OFFSET")
             .option("maxMessagesPerTrigger", "10000")
             .load()
             .writeStream.format("parquet").option("path", str(sink))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination()
    return [{"batch": p["batchId"], "rows": p["numInputRows"],
             "rows/s": int(p.get("processedRowsPerSecond") or 0)}
            for p in query.recentProgress if p["numInputRows"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="demo-output", help="where the store and sink go (recreated)")
    ap.add_argument("--messages", type=int, default=40_000)
    args = ap.parse_args()
    work = Path(args.workdir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    store, sink, chk = work / "store", work / "sink", work / "checkpoint"

    print(f"1) generating {args.messages} messages on topic {TOPIC} (4 queues) in {store}")
    generate(store, topic=TOPIC, queues=4, messages=args.messages, extra=["--seed", "1"])
    spark = local_spark("rmq_source demo")

    show_lag(store, GROUP, TOPIC, f"2) lag of group {GROUP} before the first query")

    with Store(store) as s:  # the time span of the generated messages, for the backfill below
        def ts(offset):
            return s.read(TOPIC, 0, offset, offset + 1).column("storeTimestamp")[0].value // 1000
        first, last = ts(0), ts(s.max_offset(TOPIC, 0) - 1)

    table(stream_once(spark, store, sink, chk), "3) streaming into parquet (micro-batches)")
    print(f"   parquet sink rows: {spark.read.parquet(str(sink)).count()}")
    show_lag(store, GROUP, TOPIC, f"   lag of group {GROUP} after the query committed")

    generate(store, topic=TOPIC, queues=4, messages=2_000, extra=["--seed", "2", "--no-progress"])
    show_lag(store, GROUP, TOPIC, "   2,000 new messages arrived: lag")
    table(stream_once(spark, store, sink, chk), "   the same query resumes from its checkpoint")
    print(f"   parquet sink rows: {spark.read.parquet(str(sink)).count()}")

    start_ms = first + (last - first) // 3
    end_ms = first + 2 * (last - first) // 3
    window = (spark.read.format("rmq").option("storePath", str(store)).option("topic", TOPIC)
              .option("startingTimestamp", str(start_ms)).option("endingTimestamp", str(end_ms)).load())
    rows = [r.asDict() for r in window.groupBy("tags").count().orderBy("tags").collect()]
    table(rows, f"4) backfill of [{start_ms}, {end_ms}) ms by storeTimestamp: messages per tag")

    backend = StoreBackend({"broker-a": str(store)})
    before = backend.offset_store(GROUP).read_offsets(backend.queues_for_topics([TOPIC]),
                                                      ReadOffsetType.READ_FROM_STORE)
    reset = reset_group(backend, GROUP, TOPIC, timestamp_ms=end_ms)
    print(f"\n== 5) reset group {GROUP} to timestamp {end_ms} (as rmq-store reset-offset prints it)")
    print("\n".join(reset_lines(before, reset)))
    show_lag(store, GROUP, TOPIC, "   lag after the reset")
    spark.stop()
    print(f"\ndone: store, sink and checkpoint are in {work}")


if __name__ == "__main__":
    main()
