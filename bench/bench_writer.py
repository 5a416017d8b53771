"""Writer throughput: 1 KiB messages appended with StoreWriter, compared with the broker's put path.

Prints msgs/s (wall clock and process CPU time; on a shared machine the CPU-time rate is the
steadier one) and MB/s for the common call shapes, their ratio to RocketMQ 4.9.3's own
``putMessage`` rate (0.23 M msgs/s, docs/performance-anchors.md), and a same-run baseline: building
one record with ``bytes.join`` + ``zlib.crc32`` and copying it into an mmap, the floor of any
pure-Python writer.

    PYTHONPATH=. python bench/bench_writer.py [--messages N] [--queues Q] [--body-size B] [--dir DIR]
"""
from __future__ import annotations

import argparse
import mmap
import os
import shutil
import tempfile
import time
import zlib

from rmq_source.store.writer import StoreWriter

BROKER_PUT_RATE = 230_000


def _timed(fn, count: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return count / (time.perf_counter() - wall), count / max(time.process_time() - cpu, 1e-9)


def run_single(root: str, messages: int, queues: int, body: bytes, **kwargs) -> tuple[float, float]:
    shutil.rmtree(root, ignore_errors=True)
    with StoreWriter(root, commitlog_file_size=512 << 20) as writer:
        writer.create_topic("BenchTopic", queues)
        writer.append("BenchTopic", body, **kwargs)          # first call registers the tag
        append = writer.append

        def loop():
            for _ in range(messages):
                append("BenchTopic", body, **kwargs)
        return _timed(loop, messages)


def run_batch(root: str, messages: int, queues: int, body: bytes, size: int) -> tuple[float, float]:
    shutil.rmtree(root, ignore_errors=True)
    with StoreWriter(root, commitlog_file_size=512 << 20) as writer:
        writer.create_topic("BenchTopic", queues)
        bodies = [body] * size
        append_batch = writer.append_batch

        def loop():
            for _ in range(messages // size):
                append_batch("BenchTopic", bodies, tags="TagA")
        return _timed(loop, messages // size * size)


def baseline(messages: int, body: bytes) -> tuple[float, float]:
    mm = mmap.mmap(-1, 64 << 20)
    head, tail = b"\0" * 88, b"\0" * 64
    size = len(head) + len(body) + len(tail)

    def loop():
        pos = 0
        for _ in range(messages):
            record = b"".join((head, body, tail, b"%d" % (zlib.crc32(body) & 0x7FFFFFFF)))
            if pos + size > len(mm):
                pos = 0
            mm[pos:pos + len(record)] = record
            pos += len(record)
    return _timed(loop, messages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--body-size", type=int, default=1024)
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    args = parser.parse_args()
    scratch = args.dir or tempfile.mkdtemp(prefix="bench_writer_")
    root = os.path.join(scratch, "store")
    body = os.urandom(args.body_size)
    try:
        floor_wall, floor_cpu = baseline(args.messages, body)
        print(f"{'baseline: join + crc32 + mmap copy':40s} {floor_wall:10,.0f} msgs/s wall "
              f"{floor_cpu:10,.0f} msgs/s cpu")
        cases = [
            ("append, round robin, tags", lambda: run_single(root, args.messages, args.queues, body,
                                                             tags="TagA")),
            ("append, queue_id, tags", lambda: run_single(root, args.messages, args.queues, body,
                                                          queue_id=3, tags="TagA")),
            ("append, no tags", lambda: run_single(root, args.messages, args.queues, body)),
            ("append, tags + keys + property", lambda: run_single(
                root, args.messages, args.queues, body, tags="TagA", keys=["k1", "k2"],
                properties={"p": "v"})),
            ("append_batch of 32, tags", lambda: run_batch(root, args.messages, args.queues, body,
                                                           32)),
        ]
        for name, case in cases:
            wall, cpu = case()
            print(f"{name:40s} {wall:10,.0f} msgs/s wall {cpu:10,.0f} msgs/s cpu "
                  f"{cpu * args.body_size / 1e6:7.1f} MB/s  "
                  f"{cpu / BROKER_PUT_RATE:5.2f}x broker put path  "
                  f"{cpu / floor_cpu:5.2f}x baseline")
    finally:
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
