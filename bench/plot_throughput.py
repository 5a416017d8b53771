"""Plot ``spark.read.format("rmq")`` throughput against message size and number of partitions.

For bodies of 128 B, 1 KiB and 8 KiB (stores of about the same CommitLog size, 8 queues, written
once under ``--workdir``) and 1, 2, 4, 8 partitions (the ``numPartitions`` option: consumer
slots, i.e. Spark tasks), measures on ``local[2]`` with the ``noop`` sink the rmq source and the
Arrow ceiling source (same rows, same partitions; see bench/common.py), interleaved, best of
``--repeat``. Saves a PNG with rows/s and GB/s (CommitLog bytes) panels, rmq solid and ceiling
dashed, and prints the figures as a table with the rmq/ceiling ratio.

Needs matplotlib (``pip install matplotlib``).

    python bench/plot_throughput.py [--quick] [--workdir /tmp/rmq_bench] [--out FILE.png]
    python bench/plot_throughput.py --replot       # redraw from the last run's figures
"""
from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import common  # noqa: F401  (puts the checkout on sys.path)
from common import (DEFAULT_WORKDIR, TOPIC, StoreSpec, ensure_ceiling_files, ensure_store,
                    fmt_rate, interleaved_best, machine_info, print_machine, print_table,
                    register_ceiling_source, spark_session, store_bytes, warm_page_cache)

SIZES = (128, 1024, 8192)
PARTITIONS = (1, 2, 4, 8)
TARGET_BYTES = 300 << 20        # CommitLog bytes per store (about)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=DEFAULT_WORKDIR)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "throughput.png"))
    parser.add_argument("--quick", action="store_true", help="stores of a quarter of the size")
    parser.add_argument("--replot", action="store_true",
                        help="only redraw the PNG from the last run's figures (kept in --workdir)")
    args = parser.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
    except ImportError:
        raise SystemExit("plot_throughput.py needs matplotlib: pip install matplotlib")
    saved = Path(args.workdir) / f"throughput_results{'_quick' if args.quick else ''}.json"
    if args.replot:
        plot(**json.loads(saved.read_text()), out=args.out)
        return
    target = TARGET_BYTES // 4 if args.quick else TARGET_BYTES
    args.repeat = max(2, args.repeat)

    info = machine_info()
    print_machine()
    stores = {}
    for size in SIZES:
        messages = max(8_000, target // (size + 180) // 8 * 8)   # ~180 B of headers+properties
        root = ensure_store(args.workdir, StoreSpec(messages, size, 8))
        ceiling = ensure_ceiling_files(args.workdir, root)
        stores[size] = (root, ceiling, *store_bytes(root))
    warm_page_cache([p for s in stores.values() for p in s[:2]])

    spark = spark_session(args.master)
    register_ceiling_source(spark)
    results = []
    for size, (root, ceiling, msgs, nbytes) in stores.items():
        for parts in PARTITIONS:
            def rmq(root=root, parts=parts):
                (spark.read.format("rmq").option("storePath", str(root)).option("topic", TOPIC)
                 .option("numPartitions", str(parts)).load()
                 .write.format("noop").mode("overwrite").save())

            def ceil(ceiling=ceiling, parts=parts):
                (spark.read.format("arrow_ceiling").option("path", str(ceiling))
                 .option("numPartitions", str(parts)).load()
                 .write.format("noop").mode("overwrite").save())
            if not results:          # first query of the session: start the Python workers
                rmq()
                ceil()
            times = interleaved_best({"ceiling": ceil, "rmq": rmq}, args.repeat)
            best = {k: min(v) for k, v in times.items()}
            results.append((size, parts, msgs, nbytes, best["rmq"], best["ceiling"]))
            print(f"  {size:>5} B x {msgs:,}, {parts} partitions: "
                  f"rmq {msgs / best['rmq']:,.0f} rows/s, "
                  f"ceiling {msgs / best['ceiling']:,.0f} rows/s", flush=True)
    spark.stop()

    print_table(["body", "messages", "partitions", "rmq rows/s", "rmq GB/s", "ceiling rows/s",
                 "ceiling GB/s", "rmq / ceiling"],
                [[f"{size} B", f"{msgs:,}", parts, fmt_rate(msgs / r), f"{nbytes / r / 1e9:.2f}",
                  fmt_rate(msgs / c), f"{nbytes / c / 1e9:.2f}", f"{c / r:.2f}"]
                 for size, parts, msgs, nbytes, r, c in results])
    title = (f'spark.read.format("rmq") -> noop, full schema, {args.master} '
             f"({info['nproc']} CPUs, {info['cpu']}); best of {args.repeat}; "
             f"{datetime.date.today()}; load average at start "
             f"{info['load average (1 min) at start']}")
    saved.write_text(json.dumps({"results": results, "title": title}))
    plot(results, title, args.out)


def plot(results: list, title: str, out: str) -> None:
    """Two panels (rows/s, log scale; GB/s) against partitions, one colour per body size."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, (ax_rows, ax_bytes) = plt.subplots(1, 2, figsize=(12, 5.8))
    colors = dict(zip(SIZES, ("tab:blue", "tab:orange", "tab:green")))
    for size in SIZES:
        pts = [x for x in results if x[0] == size]
        xs = [x[1] for x in pts]
        label = f"{size} B" if size < 1024 else f"{size // 1024} KiB"
        for ax, value in ((ax_rows, lambda m, b, s: m / s / 1e3),
                          (ax_bytes, lambda m, b, s: b / s / 1e9)):
            ax.plot(xs, [value(x[2], x[3], x[4]) for x in pts], "o-", color=colors[size],
                    label=f"rmq, {label} bodies")
            ax.plot(xs, [value(x[2], x[3], x[5]) for x in pts], "s--", color=colors[size],
                    alpha=0.6, label=f"Arrow ceiling, {label}")
    for ax, ylabel in ((ax_rows, "thousand rows / s (log scale)"),
                       (ax_bytes, "GB / s (CommitLog bytes)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(PARTITIONS)
        ax.set_xticklabels([str(p) for p in PARTITIONS])
        ax.set_xlabel("partitions (numPartitions = Spark tasks)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_rows.set_yscale("log")        # 128 B and 8 KiB rates differ by ~10x
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax_rows.yaxis.set_major_formatter(plain)
    ax_rows.yaxis.set_minor_formatter(plain)
    ax_rows.tick_params(axis="y", which="minor", labelsize=7)
    ax_bytes.set_ylim(bottom=0)
    handles, labels = ax_rows.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(out, dpi=110)
    print(f"saved {out}")


if __name__ == "__main__":
    main()
