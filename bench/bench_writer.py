"""Writer throughput: 1 KiB messages appended with StoreWriter, compared with the broker's put path.

Prints msgs/s and MB/s for the common call shapes, and the ratio to RocketMQ 4.9.3's own
``putMessage`` rate (0.23 M msgs/s, docs/performance-anchors.md). Also prints a same-run baseline:
``bytes`` building plus a ``memoryview`` copy of each record, the floor of any Python writer.

    python bench/bench_writer.py [--messages N] [--queues Q] [--dir DIR]
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from rmq_source.writer import StoreWriter

BROKER_PUT_RATE = 230_000


def run(root: str, messages: int, queues: int, body_size: int, **append_kwargs) -> float:
    shutil.rmtree(root, ignore_errors=True)
    body = os.urandom(body_size)
    with StoreWriter(root, commitlog_file_size=256 << 20) as writer:
        writer.create_topic("BenchTopic", queues)
        append = writer.append
        start = time.perf_counter()
        for i in range(messages):
            append("BenchTopic", body, **append_kwargs)
        elapsed = time.perf_counter() - start
    return messages / elapsed


def baseline(messages: int, body_size: int) -> float:
    body = os.urandom(body_size)
    buf = bytearray(body_size * 2 + 256)
    start = time.perf_counter()
    for _ in range(messages):
        record = b"".join((b"\0" * 88, body, b"\0" * 64))
        buf[0:len(record)] = record
    return messages / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--body-size", type=int, default=1024)
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    args = parser.parse_args()
    scratch = args.dir or tempfile.mkdtemp(prefix="bench_writer_")
    root = os.path.join(scratch, "store")
    try:
        floor = baseline(args.messages, args.body_size)
        print(f"baseline (build + copy one record)   {floor:12,.0f} msgs/s")
        cases = [
            ("round robin, tags", {"tags": "TagA"}),
            ("queue_id, tags", {"queue_id": 3, "tags": "TagA"}),
            ("round robin, tags + keys", {"tags": "TagA", "keys": ["k1", "k2"]}),
            ("round robin, no tags", {}),
        ]
        for name, kwargs in cases:
            rate = run(root, args.messages, args.queues, args.body_size, **kwargs)
            print(f"{name:36s} {rate:12,.0f} msgs/s  {rate * args.body_size / 1e6:8.1f} MB/s  "
                  f"{rate / BROKER_PUT_RATE:5.2f}x broker put path  {rate / floor:5.2f}x baseline")
    finally:
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
