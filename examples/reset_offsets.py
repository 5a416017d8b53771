"""Reset a consumer group's progress, then let a new streaming query resume from it.

    python examples/reset_offsets.py [--store DIR] [--topic T] [--group G] [--timestamp MS]

Shows the two ways: rewriting the group's committed offsets (``rmq_source.group.progress.reset_group``,
also ``rmq-store reset-offset``), or starting a new query with ``startingOffsets``/
``startingTimestamp``, which take precedence over the group's progress.

Everything it starts listens and talks on 127.0.0.1 only: a local Spark session (``local[2]``, its
driver bound to ``SPARK_LOCAL_IP``, 127.0.0.1 unless that is set; see _common.py). To point it at a
real deployment instead, give ``--store`` the broker's ``storePathRootDir``; to run the same code on
a Spark cluster, submit it with ``spark-submit --master ...`` as in docs/deploy.md
(examples/cluster_job.py).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from _common import generate, local_spark, show_lag

from rmq_source.group.progress import reset_group
from rmq_source.store.backend import StoreBackend


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store")
    ap.add_argument("--topic", default="Orders")
    ap.add_argument("--group", default="reset-demo")
    ap.add_argument("--out", default="example-output/reset")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    store = Path(args.store) if args.store else out / "store"
    if not args.store and not store.exists():
        generate(store, topic=args.topic, queues=2, messages=1_000, extra=["--no-progress"])

    new = reset_group(StoreBackend({"broker-a": str(store)}), args.group, args.topic, to="earliest")
    show_lag(store, args.group, args.topic, f"group {args.group} reset to earliest")

    spark = local_spark("reset offsets")
    # A new query of the group with explicit offsets: they win over the group's progress.
    start = {args.topic: {"broker-a": {str(mq.queue_id): 100 for mq in new}}}
    q = (spark.readStream.format("rmq").option("storePath", str(store)).option("topic", args.topic)
         .option("consumerGroup", args.group).option("startingOffsets", json.dumps(start)).load()
         .writeStream.format("noop").option("checkpointLocation", str(out / "chk-explicit"))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    print(f"query from offset 100 read {sum(p['numInputRows'] for p in q.recentProgress)} messages")
    show_lag(store, args.group, args.topic, "group progress after that query committed")
    spark.stop()


if __name__ == "__main__":
    main()
