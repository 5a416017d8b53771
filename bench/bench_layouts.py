"""Benchmark: a DLedger store read vs a default-layout store of the same messages.

Builds two stores of the same 1 KiB messages with bench_core's builder: the default layout
(commitlog/) and the one a one-peer DLedger broker writes (dledger-n0/data/, every record the
body of a 48-byte entry header, each checked by the C core as it is read). Both are read whole
through ``Store.iter_batches`` (all columns, the path store mode takes), in alternating rounds
after warming the page cache, and the ratio of the best rounds is printed against the target of
issue 43: DLedger >= 0.9x of the default layout. No assertion: a measurement.

    python bench/bench_layouts.py [--messages 300000] [--queues 8] [--repeat 9]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_core import build_store, warm  # noqa: E402
from common import interleaved_best  # noqa: E402
from rmq_source.store.reader import Store  # noqa: E402

TARGET = 0.9


def read_all(store: Store, queues: int) -> int:
    rows = 0
    for q in range(queues):
        for batch in store.iter_batches("Bench", q, 0, store.max_offset("Bench", q)):
            rows += batch.num_rows
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=300_000)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rmq-layouts-") as tmp:
        roots = {}
        for name, dledger in (("default", False), ("DLedger", True)):
            roots[name] = Path(tmp) / name
            build_store(roots[name], args.messages, args.queues, 1024, 64 << 20, 6_000_000, 100,
                        dledger=dledger)
            warm(roots[name])
        stores = {name: Store(root) for name, root in roots.items()}
        for name, st in stores.items():
            assert read_all(st, args.queues) == args.messages, name
            assert (st.layout.dledger_dir is not None) == (name == "DLedger")
        rounds = interleaved_best({name: (lambda st=st: read_all(st, args.queues))
                                   for name, st in stores.items()}, args.repeat)
        for st in stores.values():
            st.close()
    best = {name: min(times) for name, times in rounds.items()}
    ratio = best["default"] / best["DLedger"]
    per_round = statistics.median(d / l for d, l in zip(rounds["default"], rounds["DLedger"]))
    print(f"{args.messages} messages of 1 KiB, {args.queues} queues, best of {args.repeat} rounds:")
    for name in ("default", "DLedger"):
        print(f"  {name:8s} {args.messages / best[name] / 1e6:6.2f} M msg/s  ({best[name]:.3f} s)")
    verdict = "met" if ratio >= TARGET else "MISSED"
    print(f"DLedger / default: {ratio:.2f}x (median of rounds {per_round:.2f}x); target >= "
          f"{TARGET}x: {verdict}")


if __name__ == "__main__":
    main()
