"""Thousands of queues (issue 15): what the number of queues costs, for the same data.

Every store holds the same 100,000 messages of 100 B (no keys, one 64 MiB CommitLog file), spread
round robin over 8, 100, 1,000 and 10,000 queues of one topic (``--quick``: 8, 100, 1,000), so
anything that grows between them is a per-queue cost. The stores are written once under
``--workdir`` and reused (writing the 10,000-queue one takes about a minute).

1. **Planning** (driver side, in this process, no Spark), as ``bench_planning.py`` calls it:
   options from ``rmq_source.spark.options.parse_options``, then
   :class:`rmq_source.spark.stream_reader.RmqStreamReader` with ``startingOffsets=earliest``:

   * *cold initialOffset*: a new reader's first ``initialOffset`` after the process-wide store
     cache (``rmq_source.store.backend._CACHE``) was cleared, so every store file is opened and
     mapped again: what a new query pays once (reader construction included). The files are in
     the page cache (every store is read once first, and one written by this run is flushed
     with ``sync`` before), so cold means not yet mapped by this process, not read from disk;
   * *latestOffset*: ``latestOffset(start, ReadAllAvailable())`` on the warm reader (what every
     trigger pays);
   * *partitions*: the stream reader's ``partitions(start, end)`` of that batch (every trigger
     with data);
   * *batch partitions*: ``RmqBatchReader.partitions()`` of ``spark.read`` with the default
     options (what Spark's planning worker runs for every batch query).

   Warm figures are the best of ``--repeat`` calls after one untimed call, in CPU ms of this
   process (``time.process_time``: steadier than the wall clock on a loaded machine; the wall
   ms are printed beside), and CPU µs per queue to show the growth. *tasks* is the number of
   input partitions planned with the default options. Targets: cold initialOffset < 1 s and
   latestOffset / partitions < 100 ms at 10,000 queues; the ratio to the target is printed for
   the largest store of the run (only the 10,000-queue store is the target's shape).

2. **Batch read with Spark** (``local[2]``, the session of :func:`common.spark_session`):
   ``spark.read.format("rmq").option("storePath", root).option("topic", TOPIC).load().count()``,
   the default partitioning and ``numPartitions=2`` for comparison. Each case runs once as a
   warm-up, then ``--repeat`` rounds interleaved over all cases (8q, 100q, ... 8q, 100q, ...),
   the best round kept: wall seconds, CPU seconds of Spark's process tree (JVM, Python workers)
   plus this driver, and the ratio of the wall time to the 8-queue store's with the same
   partitioning (target: <= 2x at 10,000 queues). Every run builds a new DataFrame, so planning
   (in Spark's Python planning worker) is part of the time. *tasks* is
   ``df.rdd.getNumPartitions()``.

3. **A streaming micro-batch in a consumer group with ``orderly=true``** (store mode, in this
   process): a new :class:`RmqStreamReader` with ``consumerGroup=scale_bench``, ``orderly=true``,
   ``startingOffsets=earliest`` and ``offsetStorePath`` set to a fresh temporary folder (in store
   mode the group's state, i.e. its offsets, members, queue locks and batch plans, lives there;
   nothing else is required), then the calls Spark makes for two triggers:

   * ``initialOffset``;
   * ``latestOffset(start)``: joins the group (membership heartbeat, lock renewer thread), allocates
     and locks every queue, records the batch plan;
   * ``partitions(start, end)``: finds the recorded plan, builds the tasks (each carries the
     task lock the executor checks before reading);
   * ``latestOffset(end)``: the next trigger after Spark committed the first batch, which writes
     the group's progress for every queue read, renews the locks, and plans an idle batch;
   * ``partitions(end, end)`` of that idle batch (Spark itself skips running an empty batch,
     but planning it is what the reader would do);

   each step's CPU ms (and wall ms; the state files are written with fsync, so wall includes the
   disk) is the best over ``--repeat`` runs, each run in its own fresh folder with a new reader
   (store files are warm: opened by the planning part). Then the bytes of every file in the
   state folder after those two batches, in all and per queue, and per file kind (the lock
   history is append-only, one line per queue locked or renewed, and is rotated to ``.1`` past
   16 MiB, so a long-running group holds more than these two batches leave).
   ``reader.stop()`` (unlock, leave the group) ends each run. The lock renewer thread renews
   every ``lockRenewIntervalMs`` (20 s by default), so it does not run inside these steps; its
   start is part of the first ``latestOffset``.

No assertions: measurements only; ratios are computed within the run.

``--live``: a live cluster's micro-batches over 8, 1,024 and 10,000 queues instead (issue 44,
``bench/scale_live.py``).

    python bench/bench_scale.py [--quick] [--workdir /tmp/rmq_bench] [--repeat 3] [--live]
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from common import (DEFAULT_WORKDIR, MANIFEST, TOPIC, StoreSpec, ensure_store, interleaved_runs,
                    jvm_pid, print_machine, print_table, spark_session, tree_cpu_seconds,
                    warm_page_cache)

MESSAGES = 100_000
BODY = 100
GROUP = "scale_bench"
TARGET_INITIAL_MS = 1000.0      # cold initialOffset at 10,000 queues
TARGET_PLANNING_MS = 100.0      # latestOffset / partitions at 10,000 queues
TARGET_READ_RATIO = 2.0         # batch read at 10,000 queues vs 8 queues
TARGET_QUEUES = 10_000


def spec_of(queues: int) -> StoreSpec:
    return StoreSpec(MESSAGES, BODY, queues, 64 << 20, keys=False)


# ------------------------------------------------------------------------------------ timing

def _once(fn) -> tuple[float, float, object]:
    """(wall ms, CPU ms, result) of one call."""
    c0, t0 = time.process_time(), time.perf_counter()
    result = fn()
    return (time.perf_counter() - t0) * 1000, (time.process_time() - c0) * 1000, result


def _warm_best(fn, repeat: int) -> tuple[float, float, object]:
    """One untimed call, then (best wall ms, best CPU ms, last result) of ``repeat`` calls."""
    result = fn()
    wall = cpu = float("inf")
    for _ in range(repeat):
        w, c, result = _once(fn)
        wall, cpu = min(wall, w), min(cpu, c)
    return wall, cpu, result


# ------------------------------------------------------------------------------------ 1. planning

def measure_planning(root, repeat: int) -> dict:
    from pyspark.sql.streaming.datasource import ReadAllAvailable
    from rmq_source.spark.datasource import RmqBatchReader
    from rmq_source.spark.options import parse_options
    from rmq_source.spark.stream_reader import RmqStreamReader
    from rmq_source.store.backend import _CACHE

    base = {"storePath": str(root), "topic": TOPIC, "startingOffsets": "earliest"}
    out: dict = {}
    _CACHE.clear()   # every store file opened and mapped again
    opts = parse_options(base, streaming=True)
    holder: dict = {}

    def cold():
        holder["reader"] = reader = RmqStreamReader(opts)
        return reader.initialOffset()

    wall, cpu, start = _once(cold)
    out["cold initialOffset"] = (wall, cpu)
    reader = holder["reader"]
    wall, cpu, end = _warm_best(lambda: reader.latestOffset(start, ReadAllAvailable()), repeat)
    out["latestOffset"] = (wall, cpu)
    out["messages"] = sum(v for by_broker in end[TOPIC].values() for v in by_broker.values())
    wall, cpu, parts = _warm_best(lambda: reader.partitions(start, end), repeat)
    out["partitions"] = (wall, cpu)
    out["tasks"] = len(parts)
    batch = RmqBatchReader(dict(base))
    wall, cpu, parts = _warm_best(batch.partitions, repeat)
    out["batch partitions"] = (wall, cpu)
    out["batch tasks"] = len(parts)
    reader.stop()
    return out


PLANNING_STEPS = ("cold initialOffset", "latestOffset", "partitions", "batch partitions")


def report_planning(results: list[tuple[int, dict]], repeat: int) -> None:
    print(f"\n1. Planning in the driver (no Spark): cold = first call after the store cache was "
          f"cleared; warm = best of {repeat} calls; CPU ms / wall ms")
    rows = []
    for queues, r in results:
        rows.append([f"{queues:,}", f"{r['messages']:,}", r["tasks"], r["batch tasks"]]
                    + [f"{r[s][1]:.1f} / {r[s][0]:.1f}" for s in PLANNING_STEPS])
    print_table(["queues", "messages", "stream tasks", "batch tasks"] + list(PLANNING_STEPS), rows)
    print("per queue, µs of CPU:")
    rows = [[f"{queues:,}"] + [f"{r[s][1] * 1000 / queues:.1f}" for s in PLANNING_STEPS]
            for queues, r in results]
    print_table(["queues"] + list(PLANNING_STEPS), rows)
    queues, r = results[-1]
    shape = ("the target's shape" if queues == TARGET_QUEUES
             else f"the targets are set for {TARGET_QUEUES:,} queues")
    print(f"against the targets ({queues:,} queues, the largest of this run; {shape}):")
    rows = []
    for step in PLANNING_STEPS:
        target = TARGET_INITIAL_MS if step == "cold initialOffset" else TARGET_PLANNING_MS
        wall, cpu = r[step]
        rows.append([step, f"{cpu:.1f}", f"{wall:.1f}", f"< {target:.0f}",
                     f"{cpu / target:.2f}", f"{wall / target:.2f}"])
    print_table(["step", "CPU ms", "wall ms", "target ms", "CPU / target", "wall / target"], rows)


# ------------------------------------------------------------------------------------ 2. Spark

def measure_spark(roots: list[tuple[int, object]], repeat: int, master: str) -> dict:
    spark = spark_session(master, app="rmq_source-bench-scale")
    pid = jvm_pid(spark)

    def cpu() -> float:
        return tree_cpu_seconds(pid) + time.process_time()

    out: dict = {}
    cases = {}
    for queues, root in roots:
        for label, extra in (("default", {}), ("numPartitions=2", {"numPartitions": "2"})):
            def load(root=root, extra=extra):
                reader = (spark.read.format("rmq").option("storePath", str(root))
                          .option("topic", TOPIC))
                for k, v in extra.items():
                    reader = reader.option(k, v)
                return reader.load()

            def run(load=load, key=(queues, label)):
                out.setdefault(key, {})["rows"] = load().count()

            df = load()
            out.setdefault((queues, label), {})["tasks"] = df.rdd.getNumPartitions()
            print(f"  warm-up: {queues:,} queues, {label} ...", flush=True)
            run()   # warm-up: Python workers started, store files mapped in them
            cases[(queues, label)] = run
    runs = interleaved_runs(cases, repeat, cpu=cpu)
    for key, values in runs.items():
        out[key]["wall"] = min(w for w, _ in values)
        out[key]["cpu"] = min(c for _, c in values)
        out[key]["all"] = [w for w, _ in values]
    spark.stop()
    return out


def report_spark(queue_counts: list[int], out: dict, repeat: int) -> None:
    print(f"\n2. Batch read with Spark (count(), local session): best of {repeat} interleaved "
          "rounds after one warm-up each")
    rows = []
    for label in ("default", "numPartitions=2"):
        base = out[(queue_counts[0], label)]["wall"]
        for queues in queue_counts:
            r = out[(queues, label)]
            rows.append([f"{queues:,}", label, r["tasks"], f"{r['rows']:,}", f"{r['wall']:.2f}",
                         f"{r['cpu']:.2f}", " ".join(f"{w:.2f}" for w in r["all"]),
                         f"{r['wall'] / base:.2f}"])
    print_table(["queues", "partitioning", "tasks", "rows", "wall s (best)",
                 "CPU s (Spark tree + driver)", "wall s (all rounds)",
                 f"wall / {queue_counts[0]}q"], rows)
    last = queue_counts[-1]
    ratio = out[(last, "default")]["wall"] / out[(queue_counts[0], "default")]["wall"]
    print(f"default partitioning, {last:,} queues vs {queue_counts[0]}: {ratio:.2f}x "
          f"(target <= {TARGET_READ_RATIO:.0f}x at {TARGET_QUEUES:,} queues)\n", flush=True)


# ------------------------------------------------------------------------------------ 3. group

GROUP_STEPS = ("initialOffset", "latestOffset(start)", "partitions(start, end)",
               "latestOffset(end) after commit", "partitions(end, end) idle")


def _state_files(folder: str) -> dict[str, int]:
    """{file path relative to ``folder``: bytes} of every file under ``folder``."""
    sizes = {}
    for dirpath, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(dirpath, name)
            try:
                sizes[os.path.relpath(path, folder)] = os.stat(path).st_size
            except FileNotFoundError:   # a temporary file renamed meanwhile
                pass
    return sizes


def _file_kind(rel: str) -> str:
    """A file's name with the group name replaced, so the kinds line up across stores."""
    return rel.replace(GROUP, "<group>")


def measure_group(root, repeat: int) -> dict:
    from pyspark.sql.streaming.datasource import ReadAllAvailable
    from rmq_source.spark.options import parse_options
    from rmq_source.spark.stream_reader import RmqStreamReader

    best = {s: (float("inf"), float("inf")) for s in GROUP_STEPS}
    out: dict = {"errors": []}
    for _ in range(repeat):
        state = tempfile.mkdtemp(prefix="rmq_scale_group_")
        reader = None
        try:
            opts = parse_options({"storePath": str(root), "topic": TOPIC, "consumerGroup": GROUP,
                                  "orderly": "true", "startingOffsets": "earliest",
                                  "offsetStorePath": state}, streaming=True)
            reader = RmqStreamReader(opts)
            times = {}
            times["initialOffset"] = _once(reader.initialOffset)
            start = times["initialOffset"][2]
            times["latestOffset(start)"] = _once(
                lambda: reader.latestOffset(start, ReadAllAvailable()))
            end = times["latestOffset(start)"][2]
            times["partitions(start, end)"] = _once(lambda: reader.partitions(start, end))
            times["latestOffset(end) after commit"] = _once(
                lambda: reader.latestOffset(end, ReadAllAvailable()))
            end2 = times["latestOffset(end) after commit"][2]
            times["partitions(end, end) idle"] = _once(lambda: reader.partitions(end, end2))
            for s in GROUP_STEPS:
                best[s] = (min(best[s][0], times[s][0]), min(best[s][1], times[s][1]))
            out["tasks"] = len(times["partitions(start, end)"][2])
            out["idle tasks"] = len(times["partitions(end, end) idle"][2])
            out["read"] = sum(v for b in end[TOPIC].values() for v in b.values()) - sum(
                v for b in start[TOPIC].values() for v in b.values())
            out["idle"] = end2 == end
            out["files"] = _state_files(state)
        except Exception as exc:   # measure what can be measured; say what failed
            out["errors"].append(f"{type(exc).__name__}: {exc}")
            break
        finally:
            if reader is not None:
                try:
                    reader.stop()
                except Exception as exc:
                    out["errors"].append(f"stop: {type(exc).__name__}: {exc}")
            shutil.rmtree(state, ignore_errors=True)
    out["steps"] = best
    return out


def report_group(results: list[tuple[int, dict]], repeat: int) -> None:
    print(f"\n3. Streaming micro-batches in a consumer group, orderly=true, store mode (in the "
          f"driver): best of {repeat} runs, each in a fresh state folder; CPU ms / wall ms")
    rows = []
    for queues, r in results:
        steps = r["steps"]
        rows.append([f"{queues:,}", r.get("tasks", "-"), f"{r.get('read', 0):,}",
                     "yes" if r.get("idle") else "no"]
                    + [(f"{steps[s][1]:.1f} / {steps[s][0]:.1f}" if steps[s][0] < float("inf")
                        else "-") for s in GROUP_STEPS])
    print_table(["queues", "tasks", "messages in batch 1", "batch 2 idle"] + list(GROUP_STEPS),
                rows)
    print("per queue, µs of CPU:")
    rows = [[f"{queues:,}"] + [(f"{r['steps'][s][1] * 1000 / queues:.1f}"
                                if r["steps"][s][1] < float("inf") else "-") for s in GROUP_STEPS]
            for queues, r in results]
    print_table(["queues"] + list(GROUP_STEPS), rows)

    print("group state on disk after the two batches (offsetStorePath):")
    kinds = sorted({_file_kind(f) for _, r in results for f in r.get("files", {})})
    rows = []
    for queues, r in results:
        files = r.get("files", {})
        total = sum(files.values())
        by_kind = {}
        for f, n in files.items():
            by_kind[_file_kind(f)] = by_kind.get(_file_kind(f), 0) + n
        rows.append([f"{queues:,}", len(files), f"{total:,}", f"{total / queues:.0f}"]
                    + [f"{by_kind[k]:,}" if k in by_kind else "-" for k in kinds])
    print_table(["queues", "files", "bytes", "bytes / queue"] + kinds, rows)
    for queues, r in results:
        for err in r["errors"]:
            print(f"error at {queues:,} queues: {err}")


# ------------------------------------------------------------------------------------ main

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=DEFAULT_WORKDIR)
    parser.add_argument("--repeat", type=int, default=3,
                        help="warm calls / Spark rounds / group runs per figure (best kept)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--quick", action="store_true", help="skip the 10,000-queue store")
    parser.add_argument("--skip-spark", action="store_true", help="planning and group only")
    parser.add_argument("--live", action="store_true",
                        help="a live cluster's micro-batches instead (bench/scale_live.py)")
    parser.add_argument("--live-parts", default="driver,spark,java",
                        help="with --live: which parts run (driver, spark, java)")
    args = parser.parse_args()
    print_machine()
    if args.live:
        import scale_live
        scale_live.main(args)
        return

    queue_counts = [8, 100, 1000] if args.quick else [8, 100, 1000, TARGET_QUEUES]
    written = [q for q in queue_counts   # (ensure_store also rewrites a store of another shape)
               if not os.path.exists(os.path.join(args.workdir, spec_of(q).name, MANIFEST))]
    roots = [(q, ensure_store(args.workdir, spec_of(q))) for q in queue_counts]
    if written:
        # stores written by this run: their pages are still dirty, and the writeback would be
        # charged to whatever runs next (the first store opened after the writer took ~0.3 s of
        # system CPU in a test); flush them first
        os.sync()
    warm_page_cache([root for _, root in roots])
    for q, root in roots:
        print(f"store: {root} ({MESSAGES:,} messages of {BODY} B over {q:,} queues)")
    print(flush=True)

    planning = []
    for q, root in roots:
        print(f"planning, {q:,} queues ...", flush=True)
        planning.append((q, measure_planning(root, args.repeat)))
    report_planning(planning, args.repeat)

    if not args.skip_spark:
        print("Spark batch reads ...", flush=True)
        spark = measure_spark(roots, args.repeat, args.master)
        report_spark(queue_counts, spark, args.repeat)

    group = []
    for q, root in roots:
        print(f"consumer group batches, {q:,} queues ...", flush=True)
        group.append((q, measure_group(root, args.repeat)))
    report_group(group, args.repeat)


if __name__ == "__main__":
    main()
