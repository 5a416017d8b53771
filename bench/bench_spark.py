"""End-to-end batch read throughput of ``spark.read.format("rmq")`` against its ceiling, same run.

1. Writes (once; reused from ``--workdir``) a store of ``--messages`` 1 KiB messages, one topic,
   8 queues, each message with a tag, one key and a UNIQ_KEY, with :class:`StoreWriter`; and, from
   it, the Arrow ceiling files: the same rows, in the same batches, one file per queue.
2. Warms the page cache (store and ceiling files).
3. Without Spark, on a subset of every queue: our reader (``Store.iter_batches``) against a
   straightforward pure-Python decoder (bench/pure_python_decoder.py) of the same messages into
   the same schema; outputs are checked equal first. Target: >= 10x.
4. On ``local[2]`` with the ``noop`` sink, full schema, interleaved rounds (ceiling, rmq, ceiling,
   rmq, ...), best of ``--repeat``: the ceiling (a trivial Python data source yielding the
   pre-built batches from memory-mapped Arrow IPC files, same number of partitions) and
   ``spark.read.format("rmq")``. Target: rmq >= 0.7 x ceiling. Wall clock and CPU seconds of
   Spark's whole process tree are both reported (CPU is steadier on a shared machine).
   The same with a narrow schema, beside it: ``.schema(...)`` of five columns (topic, queueId,
   queueOffset, body, storeTimestamp) against the ceiling source yielding those five.
5. With ``--column-costs``: the ceiling source yielding subsets of the columns, to show what each
   kind of column costs in Spark (Python data sources get no column pruning).

Rates count every row of the topic; GB/s counts CommitLog record bytes (what the reader consumes;
bodies are 1 KiB of each ~1.2 KiB record). No assertion: this prints measurements and ratios.

    python bench/bench_spark.py [--quick] [--workdir /tmp/rmq_bench] [--messages 2000000]
"""
from __future__ import annotations

import argparse
import time

import common  # noqa: F401  (puts the checkout on sys.path)
from rmq_source.schema import COLUMN_NAMES
from common import (DEFAULT_WORKDIR, TOPIC, StoreSpec, ceiling_ddl, ensure_ceiling_files,
                    ensure_store, fmt_rate, interleaved_runs, jvm_pid, print_machine, print_table,
                    register_ceiling_source, spark_session, store_bytes, tree_cpu_seconds,
                    warm_page_cache)

SPARK_TARGET = 0.7
#: the narrow schema of the issue-45 measurements
NARROW = ["topic", "queueId", "queueOffset", "body", "storeTimestamp"]
PURE_PYTHON_TARGET = 10.0


def compare_pure_python(store_root, queues: int, per_queue: int, repeat: int) -> dict:
    """Store.iter_batches vs the pure-Python decoder on the first ``per_queue`` messages of
    every queue; returns {name: best seconds} and the row count."""
    import pyarrow as pa
    from pure_python_decoder import PurePythonQueueReader
    from rmq_source.store.reader import Store

    store = Store(store_root)
    pure = PurePythonQueueReader(store_root)
    qids = [q.queue_id for q in store.queues([TOPIC]) if q.max_offset > q.min_offset][:queues]

    ours = pa.Table.from_batches([b for q in qids
                                  for b in store.iter_batches(TOPIC, q, 0, per_queue)])
    theirs = pa.Table.from_batches([pure.decode_queue(TOPIC, q, 0, per_queue) for q in qids])
    if not ours.equals(theirs):
        raise SystemExit("pure-Python decoder and Store.iter_batches disagree; fix the decoder")
    rows = ours.num_rows
    del ours, theirs

    def run_store():
        for q in qids:
            for _ in store.iter_batches(TOPIC, q, 0, per_queue):
                pass

    def run_pure():
        for q in qids:
            pure.decode_queue(TOPIC, q, 0, per_queue)

    runs = interleaved_runs({"Store.iter_batches": run_store, "pure Python": run_pure}, repeat)
    pure.close()
    store.close()
    best = {k: (min(w for w, _ in v), min(c for _, c in v)) for k, v in runs.items()}
    return {"rows": rows, **best}


def whole_store_single_thread(store_root, repeat: int) -> tuple[float, float]:
    """Best (wall, CPU) seconds for Store.iter_batches over every queue of the topic, in this
    process."""
    from rmq_source.store.reader import Store

    with Store(store_root) as store:
        qs = store.queues([TOPIC])

        def run():
            for q in qs:
                for _ in store.iter_batches(TOPIC, q.queue_id, q.min_offset, q.max_offset):
                    pass
        runs = interleaved_runs({"store": run}, repeat)["store"]
        return min(w for w, _ in runs), min(c for _, c in runs)


COLUMN_SETS = {
    "all 21 columns": None,
    "without properties (map)": [c for c in COLUMN_NAMES if c != "properties"],
    "without properties, keys (map, list)": [c for c in COLUMN_NAMES
                                             if c not in ("properties", "keys")],
    "12 columns: no map, list or string": [
        "queueId", "queueOffset", "commitLogOffset", "storeSize", "body", "bornTimestamp",
        "storeTimestamp", "sysFlag", "flag", "reconsumeTimes", "bodyCRC",
        "preparedTransactionOffset"],
    "4: queueId, queueOffset, storeTimestamp, body": ["queueId", "queueOffset",
                                                      "storeTimestamp", "body"],
    "3: queueId, queueOffset, storeTimestamp": ["queueId", "queueOffset", "storeTimestamp"],
}


def column_costs(spark, ceiling_dir, repeat: int, cpu) -> dict:
    """Ceiling source with column subsets: {name: (best wall s, best CPU s)}. Python data sources
    get no column pruning from Spark, so every column a reader yields is converted."""
    def run(cols):
        reader = spark.read.format("arrow_ceiling").option("path", str(ceiling_dir))
        if cols is not None:
            reader = reader.option("columns", ",".join(cols))
        return lambda: reader.load().write.format("noop").mode("overwrite").save()

    runs = interleaved_runs({name: run(cols) for name, cols in COLUMN_SETS.items()}, repeat, cpu)
    return {k: (min(w for w, _ in v), min(c for _, c in v)) for k, v in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=DEFAULT_WORKDIR)
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--body-size", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3, help="rounds per measurement (best kept)")
    parser.add_argument("--subset", type=int, default=80_000,
                        help="messages decoded by the pure-Python comparison (spread over queues)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--column-costs", action="store_true",
                        help="also run the ceiling source with subsets of the columns (what the "
                             "full schema costs in Spark), about 2 more minutes")
    parser.add_argument("--quick", action="store_true",
                        help="200,000 messages, 2 rounds, 20,000-message subset")
    args = parser.parse_args()
    if args.quick:
        args.messages, args.repeat, args.subset = 200_000, 2, 20_000
    args.repeat = max(2, args.repeat)

    print_machine()
    spec = StoreSpec(args.messages, args.body_size, args.queues)
    store_root = ensure_store(args.workdir, spec)
    ceiling_dir = ensure_ceiling_files(args.workdir, store_root)
    msgs, rec_bytes = store_bytes(store_root)
    t0 = time.perf_counter()
    warmed = warm_page_cache([store_root, ceiling_dir])
    print(f"store {store_root}: {msgs:,} messages, {rec_bytes / 1e9:.2f} GB of records; page cache "
          f"warmed ({warmed / 1e9:.2f} GB read in {time.perf_counter() - t0:.1f} s)\n", flush=True)

    # -- without Spark ----------------------------------------------------------------------
    per_queue = max(1, args.subset // args.queues)
    cmp = compare_pure_python(store_root, args.queues, per_queue, args.repeat)
    single = whole_store_single_thread(store_root, args.repeat)

    # -- Spark ----------------------------------------------------------------------------------
    spark = spark_session(args.master)
    register_ceiling_source(spark)

    def rmq_df():
        return (spark.read.format("rmq").option("storePath", str(store_root)).option("topic", TOPIC)
                .load())

    def ceiling_df():
        return spark.read.format("arrow_ceiling").option("path", str(ceiling_dir)).load()

    def rmq_narrow_df():
        return (spark.read.format("rmq").schema(ceiling_ddl(NARROW)).option("storePath", str(store_root))
                .option("topic", TOPIC).load())

    def ceiling_narrow_df():
        return (spark.read.format("arrow_ceiling").option("path", str(ceiling_dir))
                .option("columns", ",".join(NARROW)).load())

    cases = {"ceiling": ceiling_df, "rmq": rmq_df, "ceiling narrow": ceiling_narrow_df,
             "rmq narrow": rmq_narrow_df}
    parts = {}
    for name, make in cases.items():
        df = make()
        parts[name] = df.rdd.getNumPartitions()
        t0 = time.perf_counter()
        count = df.count()                        # warm-up pass (workers, JIT) and row check
        print(f"warm-up {name}: count() = {count:,} in {time.perf_counter() - t0:.1f} s, "
              f"{parts[name]} partitions", flush=True)
        if count != msgs:
            raise SystemExit(f"{name} returned {count} rows, expected {msgs}")

    def noop(make):
        return lambda: make().write.format("noop").mode("overwrite").save()

    pid = jvm_pid(spark)
    cpu = lambda: tree_cpu_seconds(pid) + time.process_time()  # noqa: E731
    rounds = interleaved_runs({name: noop(make) for name, make in cases.items()}, args.repeat,
                              cpu=cpu)
    costs = column_costs(spark, ceiling_dir, args.repeat, cpu) if args.column_costs else None
    spark.stop()

    best = {k: min(w for w, _ in v) for k, v in rounds.items()}
    best_cpu = {k: min(c for _, c in v) for k, v in rounds.items()}
    print()
    print(f"Spark {args.master}, noop sink, {msgs:,} rows of {args.body_size} B "
          "bodies "
          f"({rec_bytes / msgs:.0f} B records); best of {args.repeat} interleaved rounds")
    rows = []
    for name, label in (("ceiling", "Arrow ceiling source (pre-built batches), 21 columns"),
                        ("rmq", 'spark.read.format("rmq"), 21 columns'),
                        ("ceiling narrow", "Arrow ceiling source, the 5 columns"),
                        ("rmq narrow", 'spark.read.format("rmq").schema(<the 5 columns>)')):
        secs = best[name]
        rows.append([label, parts[name], f"{secs:.2f}", fmt_rate(msgs / secs),
                     f"{rec_bytes / secs / 1e9:.2f}", f"{best_cpu[name]:.1f}",
                     fmt_rate(msgs / best_cpu[name]),
                     " ".join(f"{w:.2f}" for w, _ in rounds[name])])
    print_table(["source", "partitions", "best wall s", "rows/s", "GB/s", "CPU s",
                 "rows per CPU s", "all rounds wall s"], rows)
    print("CPU s = user + system time of Spark's JVM, its Python workers and the driver process "
          "(all cores).\n")

    ratio_spark = best["ceiling"] / best["rmq"]
    ratio_spark_cpu = best_cpu["ceiling"] / best_cpu["rmq"]
    ratio_narrow = best["ceiling narrow"] / best["rmq narrow"]
    ratio_narrow_cpu = best_cpu["ceiling narrow"] / best_cpu["rmq narrow"]
    (st_wall, st_cpu), (py_wall, py_cpu) = cmp["Store.iter_batches"], cmp["pure Python"]
    ratio_pure, ratio_pure_cpu = py_wall / st_wall, py_cpu / st_cpu
    print(f"Without Spark, one thread, {cmp['rows']:,} messages ({per_queue:,} per queue), "
          f"outputs checked equal:")
    print_table(["reader", "best wall s", "rows/s", "best CPU s", "rows per CPU s"], [
        ["Store.iter_batches (C core)", f"{st_wall:.3f}", fmt_rate(cmp["rows"] / st_wall),
         f"{st_cpu:.3f}", fmt_rate(cmp["rows"] / st_cpu)],
        ["pure-Python struct decoder", f"{py_wall:.3f}", fmt_rate(cmp["rows"] / py_wall),
         f"{py_cpu:.3f}", fmt_rate(cmp["rows"] / py_cpu)],
        [f"Store.iter_batches, whole store ({msgs:,})", f"{single[0]:.3f}",
         fmt_rate(msgs / single[0]), f"{single[1]:.3f}", fmt_rate(msgs / single[1])],
    ])
    def met(*values, target):
        return " / ".join("yes" if v >= target else "NO" for v in values)

    print("Ratios (same run):")
    print_table(["ratio", "wall clock", "CPU time", "target", "met (wall / CPU)"], [
        ["rmq / Arrow ceiling (Spark rows/s)", f"{ratio_spark:.2f}", f"{ratio_spark_cpu:.2f}",
         f">= {SPARK_TARGET}", met(ratio_spark, ratio_spark_cpu, target=SPARK_TARGET)],
        ["rmq / Arrow ceiling, the 5 columns", f"{ratio_narrow:.2f}", f"{ratio_narrow_cpu:.2f}",
         f">= {SPARK_TARGET}", met(ratio_narrow, ratio_narrow_cpu, target=SPARK_TARGET)],
        ["rmq 5 columns / rmq 21 columns", f"{best['rmq'] / best['rmq narrow']:.2f}",
         f"{best_cpu['rmq'] / best_cpu['rmq narrow']:.2f}", "-", "-"],
        ["Store.iter_batches / pure Python", f"{ratio_pure:.1f}", f"{ratio_pure_cpu:.1f}",
         f">= {PURE_PYTHON_TARGET:.0f}",
         met(ratio_pure, ratio_pure_cpu, target=PURE_PYTHON_TARGET)],
    ])

    if costs:
        full_cpu = costs["all 21 columns"][1]
        print("Ceiling source by columns yielded (same run; Spark converts every column of a "
              "Python data source):")
        print_table(["columns", "best wall s", "rows/s", "rows per CPU s", "CPU cost vs all"], [
            [name, f"{w:.2f}", fmt_rate(msgs / w), fmt_rate(msgs / c), f"{c / full_cpu:.2f}"]
            for name, (w, c) in costs.items()])


if __name__ == "__main__":
    main()
