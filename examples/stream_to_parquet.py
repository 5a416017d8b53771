"""Stream a topic into parquet with a consumer group, exactly once across restarts.

    python examples/stream_to_parquet.py [--store DIR] [--topic T] [--out DIR]

Without --store a sample store is generated under --out. Run it twice: the second run resumes from
the checkpoint and writes only what arrived in between (the script appends some messages first).

Everything it starts listens and talks on 127.0.0.1 only: a local Spark session (``local[2]``, its
driver bound to ``SPARK_LOCAL_IP``, 127.0.0.1 unless that is set; see _common.py). To point it at a
real deployment instead, give ``--store`` the broker's ``storePathRootDir``; to run the same code on
a Spark cluster, submit it with ``spark-submit --master ...`` as in docs/deploy.md
(examples/cluster_job.py).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from _common import generate, local_spark, stream_to_parquet


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", help="broker store root (default: a generated sample under --out)")
    ap.add_argument("--topic", default="Orders")
    ap.add_argument("--group", default="parquet-loader")
    ap.add_argument("--out", default="example-output/stream")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    store = Path(args.store) if args.store else out / "store"
    if not args.store:
        generate(store, topic=args.topic, queues=4, messages=5_000, extra=["--no-progress"])

    spark = local_spark("stream to parquet")
    total = stream_to_parquet(spark, {
        "storePath": str(store), "topic": args.topic, "consumerGroup": args.group,
        "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",   # a new group starts at the beginning
        "maxMessagesPerTrigger": "2000"}, out)
    print(f"parquet rows in total: {total}")
    spark.stop()


if __name__ == "__main__":
    main()
