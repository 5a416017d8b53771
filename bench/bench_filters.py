"""Filtering benchmarks (issue 12), ratios measured in one run:

* **pushdown**: ``spark.read.format("rmq")...where("tags = 'X'").count()`` over ``--messages``
  (2 M) messages of which 1% carry tag X, with ``spark.sql.python.filterPushdown.enabled`` on
  (the source scans ConsumeQueue tag hash codes and decodes only X) and off (every message is
  decoded and sent to Spark, which filters); target >= 10x;
* **SQL92**: the C evaluation of ``region = 'eu' AND amount >= 0`` (10% of the messages; the
  ``amount`` comparison converts a string property to a number, as the broker does) over the
  decoded batches of ``--sql-messages`` (1 M) messages, one core, no Spark: messages evaluated
  per second (target >= 5 M) and its cost against the unfiltered decode of the same messages.

The store is written by our writer (batches of 100 messages sharing tags and properties,
``--body-size`` bodies, 1 KiB by default as in the other benchmarks) into a temporary folder. No assertion: a measurement.

    python bench/bench_filters.py [--messages 2000000] [--sql-messages 1000000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (puts the checkout on sys.path)
from common import print_machine, print_table, spark_session

from rmq_source.store.reader import Store  # noqa: E402
from rmq_source.store.writer import StoreWriter  # noqa: E402
from rmq_source.sql92.program import selector_program  # noqa: E402

TOPIC, QUEUES, BATCH = "FilterBench", 8, 100
SELECTOR = "region = 'eu' AND amount >= 0"


def write(root: Path, messages: int, body_size: int) -> None:
    body = b"b" * body_size
    with StoreWriter(str(root), broker_name="broker-a") as w:
        w.create_topic(TOPIC, QUEUES)
        for i in range(messages // BATCH):
            w.append_batch(TOPIC, [body] * BATCH, tags="X" if i % 100 == 0 else "Y",
                           properties={"region": "eu" if i % 10 == 0 else "us", "amount": str(i % 1000)})


def pushdown(root: Path, repeat: int, partitions: int | None) -> tuple[float, float, int]:
    """(best seconds with pushdown, without, rows) of the tags = 'X' count."""
    spark = spark_session()
    best = {}
    rows = set()
    for on in (True, False) * (repeat + 1):
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true" if on else "false")
        t0 = time.perf_counter()
        reader = spark.read.format("rmq").option("storePath", str(root)).option("topic", TOPIC)
        if partitions:
            reader = reader.option("numPartitions", str(partitions))
        n = reader.load().where("tags = 'X'").count()
        took = time.perf_counter() - t0
        rows.add(n)
        best[on] = min(best.get(on, took), took)
    spark.stop()
    assert len(rows) == 1, f"different counts with pushdown on and off: {rows}"
    return best[True], best[False], rows.pop()


def sql92(root: Path, messages: int, repeat: int) -> tuple[float, float, int, int]:
    """(best seconds of decoding, of evaluating, messages, selected) over the first messages."""
    store = Store(str(root))
    per_queue = messages // QUEUES
    program = selector_program(SELECTOR)
    best_decode = best_eval = float("inf")
    for _ in range(repeat + 1):
        batches = []
        t0 = time.process_time()
        for q in range(QUEUES):
            batches += list(store.iter_batches(TOPIC, q, 0, per_queue, batch_rows=65536))
        decode = time.process_time() - t0
        t0 = time.process_time()
        selected = sum(int(program.matches_mask(b.column("properties")).sum()) for b in batches)
        evaluate = time.process_time() - t0
        best_decode, best_eval = min(best_decode, decode), min(best_eval, evaluate)
        n = sum(b.num_rows for b in batches)
    return best_decode, best_eval, n, selected


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--sql-messages", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--body-size", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=None,
                    help="numPartitions of the Spark reads (default: one task per queue)")
    args = ap.parse_args()
    print_machine()
    root = Path(tempfile.mkdtemp(prefix="rmq-filter-bench-")) / "store"
    try:
        t0 = time.perf_counter()
        write(root, max(args.messages, args.sql_messages), args.body_size)
        print(f"\nwrote {max(args.messages, args.sql_messages)} messages in {time.perf_counter() - t0:.1f} s")
        on, off, rows = pushdown(root, args.repeat, args.partitions)
        dec, ev, n, sel = sql92(root, args.sql_messages, args.repeat)
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)
    print(f"\npushdown: .where(\"tags = 'X'\").count() over {args.messages} messages of "
          f"{args.body_size} B ({rows} rows, {rows / args.messages:.1%}), numPartitions "
          f"{args.partitions or 'default'}, best of {args.repeat} after a warm-up pass")
    print_table(["filter pushdown", "wall clock"], [["on", f"{on:.2f} s"], ["off", f"{off:.2f} s"]])
    print(f"pushdown on / off (target >= 10x): {off / on:.1f}x")
    print(f"\nSQL92 {SELECTOR!r} over {n} decoded messages ({sel / n:.1%} selected), one core, "
          f"CPU time, best of {args.repeat}")
    print_table(["step", "CPU time", "rate"], [
        ["decode (every column, no filter)", f"{dec:.3f} s", f"{n / dec / 1e6:.2f} M msgs/s"],
        ["SQL92 evaluation (C, properties column)", f"{ev:.3f} s", f"{n / ev / 1e6:.2f} M msgs/s"],
    ])
    print(f"SQL92 evaluation rate (target >= 5 M msgs/s): {n / ev / 1e6:.1f} M msgs/s; its cost "
          f"against the decode: {ev / dec:.0%}")


if __name__ == "__main__":
    main()
