"""Backfill a time window with a batch read: every message whose storeTimestamp is in [start, end).

    python examples/backfill_by_timestamp.py [--store DIR] [--topic T] [--start MS] [--end MS]

Without --store a sample store is generated; without --start/--end the middle third of the topic's
time span is read.

Everything it starts listens and talks on 127.0.0.1 only: a local Spark session (``local[2]``, its
driver bound to ``SPARK_LOCAL_IP``, 127.0.0.1 unless that is set; see _common.py). To point it at a
real deployment instead, give ``--store`` the broker's ``storePathRootDir`` (read-only is enough);
to run the same code on a Spark cluster, submit it with ``spark-submit --master ...`` as in
docs/deploy.md (examples/cluster_job.py).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from _common import generate, local_spark, table

from rmq_source.store.reader import Store


def time_span(store: Path, topic: str) -> tuple[int, int]:
    with Store(store) as s:
        first, last = None, None
        for q in s.queues([topic]):
            if q.max_offset > q.min_offset:
                head = s.read(topic, q.queue_id, q.min_offset, q.min_offset + 1)
                tail = s.read(topic, q.queue_id, q.max_offset - 1, q.max_offset)
                lo = head.column("storeTimestamp")[0].value // 1000
                hi = tail.column("storeTimestamp")[0].value // 1000
                first = lo if first is None else min(first, lo)
                last = hi if last is None else max(last, hi)
    if first is None:
        raise SystemExit(f"topic {topic} has no messages")
    return first, last


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store")
    ap.add_argument("--topic", default="Orders")
    ap.add_argument("--start", type=int, help="epoch ms, inclusive")
    ap.add_argument("--end", type=int, help="epoch ms, exclusive")
    ap.add_argument("--out", default="example-output/backfill")
    args = ap.parse_args()
    store = Path(args.store) if args.store else Path(args.out).resolve() / "store"
    if not args.store and not store.exists():
        generate(store, topic=args.topic, queues=4, messages=20_000, extra=["--no-progress", "--rate", "20000"])
    first, last = time_span(store, args.topic)
    start = args.start if args.start is not None else first + (last - first) // 3
    end = args.end if args.end is not None else first + 2 * (last - first) // 3

    spark = local_spark("backfill by timestamp")
    df = (spark.read.format("rmq").option("storePath", str(store)).option("topic", args.topic)
          .option("startingTimestamp", str(start)).option("endingTimestamp", str(end)).load())
    rows = df.groupBy("queueId").agg({"queueOffset": "min", "storeTimestamp": "max", "*": "count"})
    table([r.asDict() for r in rows.orderBy("queueId").collect()],
          f"messages stored in [{start}, {end}) ms, per queue")
    spark.stop()


if __name__ == "__main__":
    main()
