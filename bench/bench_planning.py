"""Planning cost of the rmq source: what the driver spends per micro-batch before any task runs.

Calls the source's driver-side code in this process (no Spark session): options parsed with
``rmq_source.spark.options.parse_options``, then :class:`rmq_source.spark.stream_reader.RmqStreamReader`
``initialOffset``, ``latestOffset`` (all available; with ``maxMessagesPerTrigger``; with
``maxBytesPerTrigger``), ``partitions(start, end)``, the batch reader's ``partitions()``, and
:meth:`Store.offset_for_timestamp` for every queue (what ``startingTimestamp`` costs).

Two series of stores (written once under ``--workdir``, 100-byte bodies):

* queue count: 10, 100, 1,000 queues of 100 messages each (one CommitLog file);
* store size: 100 queues of 100, 1,000, 10,000 messages, 4 MiB CommitLog files and ConsumeQueue
  files of 3,000 units, so a larger store also has more CommitLog and ConsumeQueue files (a
  production store of 1 GiB CommitLog files has hundreds);
* ConsumeQueue fill: 10 queues of 1,000, 30,000, 250,000 messages in broker-default ConsumeQueue
  files (300,000 units), i.e. how full each queue's files are.

Each figure is the best of ``--repeat`` calls on a warm reader (Spark keeps one reader for the
life of a query; the store's file mappings are cached per process), wall clock and CPU time of
this process (the steadier one on a loaded machine); the first, cold latestOffset is shown
separately. Milliseconds, and CPU microseconds per queue to show the growth.

    python bench/bench_planning.py [--quick] [--workdir /tmp/rmq_bench] [--repeat 5]
"""
from __future__ import annotations

import argparse
import os
import time

import common  # noqa: F401  (puts the checkout on sys.path)
from common import DEFAULT_WORKDIR, TOPIC, StoreSpec, ensure_store, print_machine, print_table

BODY = 100


def _count_files(folder: str) -> int:
    return sum(1 for n in os.listdir(folder) if len(n) == 20 and n.isdigit())


def _timed(fn, repeat: int) -> tuple[float, float, float, object]:
    """(first call wall ms, best wall ms, best CPU ms of the next ``repeat`` calls, last result).
    CPU time (this process, user + system) is steadier than the wall clock on a loaded machine."""
    t0 = time.perf_counter()
    result = fn()
    first = (time.perf_counter() - t0) * 1000
    best = best_cpu = float("inf")
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        result = fn()
        best = min(best, (time.perf_counter() - t0) * 1000)
        best_cpu = min(best_cpu, (time.process_time() - c0) * 1000)
    return first, best, best_cpu, result


def measure(root, queues: int, repeat: int) -> dict:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxRows
    from rmq_source.store.backend import _CACHE
    from rmq_source.spark.datasource import RmqBatchReader
    from rmq_source.spark.options import parse_options
    from rmq_source.store.reader import Store
    from rmq_source.spark.stream_reader import RmqStreamReader

    _CACHE.clear()   # every store starts cold in this process
    base = {"storePath": str(root), "topic": TOPIC, "startingOffsets": "earliest"}
    out: dict = {}
    reader = RmqStreamReader(parse_options(base, streaming=True))
    out["initialOffset"] = _timed(reader.initialOffset, repeat)
    start = out["initialOffset"][3]
    out["latestOffset"] = _timed(lambda: reader.latestOffset(start, ReadAllAvailable()), repeat)
    end = out["latestOffset"][3]
    total = sum(v for by_broker in end[TOPIC].values() for v in by_broker.values())
    limited = RmqStreamReader(parse_options({**base, "maxMessagesPerTrigger": str(total // 2)},
                                            streaming=True))
    limited.initialOffset()
    out["latestOffset maxMessages"] = _timed(
        lambda: limited.latestOffset(start, ReadMaxRows(total // 2)), repeat)
    by_bytes = RmqStreamReader(parse_options({**base, "maxBytesPerTrigger": str(64 << 20)},
                                             streaming=True))
    by_bytes.initialOffset()
    out["latestOffset maxBytes"] = _timed(
        lambda: by_bytes.latestOffset(start, ReadMaxBytes(64 << 20)), repeat)
    out["partitions"] = _timed(lambda: reader.partitions(start, end), repeat)
    out["tasks"] = len(out["partitions"][3])
    batch = RmqBatchReader(dict(base))
    out["batch partitions"] = _timed(batch.partitions, repeat)

    store = Store(root)
    mid_ts = int(store.read(TOPIC, 0, 50, 51).column("storeTimestamp")[0].value // 1000)
    qids = store.queue_ids(TOPIC)
    out["timestamp lookup, all queues"] = _timed(
        lambda: [store.offset_for_timestamp(TOPIC, q, mid_ts) for q in qids], repeat)
    store.close()
    out["messages"] = total
    return out


COLUMNS = ("initialOffset", "latestOffset", "latestOffset maxMessages", "latestOffset maxBytes",
           "partitions", "batch partitions", "timestamp lookup, all queues")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=DEFAULT_WORKDIR)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true",
                        help="skip the 1,000,000- and 2,500,000-message stores, 3 repeats")
    args = parser.parse_args()
    if args.quick:
        args.repeat = 3
    print_machine(spark=False)

    shapes = [("queues", StoreSpec(q * 100, BODY, q, 64 << 20, keys=False))
              for q in (10, 100, 1000)]
    sizes = (100, 1_000) if args.quick else (100, 1_000, 10_000)
    shapes += [("size", StoreSpec(100 * m, BODY, 100, 4 << 20, keys=False, cq_units_per_file=3000))
               for m in sizes]
    fills = (1_000, 30_000) if args.quick else (1_000, 30_000, 250_000)
    shapes += [("fill", StoreSpec(10 * m, BODY, 10, 256 << 20, keys=False)) for m in fills]

    results = []
    for series, spec in shapes:
        root = ensure_store(args.workdir, spec)
        cl_files = _count_files(os.path.join(root, "commitlog"))
        cq_files = _count_files(os.path.join(root, "consumequeue", TOPIC, "0"))
        print(f"measuring {root.name} ...", flush=True)
        results.append((series, spec, cl_files, cq_files, measure(root, spec.queues, args.repeat)))

    for series, title in (("queues", "Growth with the number of queues (100 messages each)"),
                          ("size", "Growth with store size (100 queues; 4 MiB CommitLog files, "
                                   "3,000-unit ConsumeQueue files)"),
                          ("fill", "Growth with messages per queue (10 queues; broker-default "
                                   "ConsumeQueue files of 300,000 units, one file per queue)")):
        print(f"\n{title}: best of {args.repeat} warm calls, wall ms / CPU ms")
        rows = []
        for s, spec, cl_files, cq_files, r in results:
            if s != series:
                continue
            rows.append([f"{spec.queues:,}", f"{spec.messages:,}", cl_files, cq_files, r["tasks"],
                         f"{r['latestOffset'][0]:.0f}"]
                        + [f"{r[c][1]:.1f} / {r[c][2]:.1f}" for c in COLUMNS])
        print_table(["queues", "messages", "CL files", "CQ files/queue", "tasks",
                     "first latestOffset (cold) ms"] + list(COLUMNS), rows)
        print("per queue, µs of CPU (best warm call / queues):")
        rows = [[f"{spec.queues:,}", f"{spec.messages:,}"]
                + [f"{r[c][2] * 1000 / spec.queues:.0f}" for c in COLUMNS]
                for s, spec, _, _, r in results if s == series]
        print_table(["queues", "messages"] + list(COLUMNS), rows)


if __name__ == "__main__":
    main()
