"""What a live read costs per message by pull size: ours and the broker's CPU (issue 45 part 2).

Starts a NameServer and one broker of a RocketMQ version (``tests/rocketmq_cluster.py``, the test
JVM flags: C1 only, serial GC), sends ``--messages`` messages of 100 B to a topic of one queue and
reads the queue whole with :class:`rmq_source.remote.backend.ClusterBackend` (the C core's pull
loop and decode, no Spark), best of ``--repeat`` passes by our CPU. Twice:

* **default caps**: the broker as shipped, which answers a pull with at most 32 messages
  (``maxTransferCountOnMessageInMemory``; 256 KiB ``maxTransferBytesOnMessageInMemory``);
* **raised caps**: the broker with both limits (in memory and on disk) raised to 2,048 messages
  and 8 MiB, read with pulls of 32, 128, 512 and 1,024 messages.

Printed per case: wall-clock rate, our CPU per message (this process) and the broker's (its JVM's
user + system time from ``/proc``), and the ratios of pulls of 1,024 to pulls of 32. The pull size
is the backend's ``pull_batch`` (option ``pullBatchSize``, default 32, RocketMQ's default cap);
``--default-in-flight 4,8`` compares pulls in flight per queue at the default caps.

    python bench/bench_pull_size.py [--version 5.3] [--messages 400000] [--repeat 3]
                                    [--default-in-flight 4,8]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, print_table

sys.path.insert(0, str(REPO / "tests"))

import rocketmq_cluster  # noqa: E402
from rmq_source.group.allocation import MessageQueue  # noqa: E402
from rmq_source.remote import RemotingClient  # noqa: E402
from rmq_source.remote import backend as remote_backend  # noqa: E402
from rmq_source.remote import requests as rq  # noqa: E402

BODY = b"x" * 100
RAISED = {"maxTransferCountOnMessageInMemory": 2048, "maxTransferBytesOnMessageInMemory": 8 << 20,
          "maxTransferCountOnMessageInDisk": 2048, "maxTransferBytesOnMessageInDisk": 8 << 20}
SIZES = (32, 128, 512, 1024)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _read_all(backend, mq: MessageQueue, end: int) -> int:
    rows = 0
    for batch in backend.read(mq, 0, end, subscription="*", batch_rows=65536, batch_bytes=64 << 20,
                              verify_crc=False, on_data_loss=lambda *_: None,
                              on_short_read=lambda *_: None):
        rows += batch.num_rows
    return rows


def run_case(version: str, messages: int, repeat: int, caps: dict, sizes, workdir: Path,
             in_flight=(remote_backend.PULLS_IN_FLIGHT,)) -> list[dict]:
    """One broker with ``caps``: for each pull size and pulls in flight, the best pass by our
    CPU."""
    release, jars = rocketmq_cluster.resolve_line(version)
    cluster = rocketmq_cluster.Cluster(
        release, jars, workdir, broker_names=("broker-a",),
        broker_kw={"extra": caps, "commitlog_size": 128 << 20,
                   "cq_units": max(rocketmq_cluster.CQ_UNITS, messages + 1000)}).start()
    out = []
    try:
        broker = cluster.brokers["broker-a"]
        with RemotingClient(timeout=60) as client:
            rq.create_topic(client, broker.addr, "PullSize", read_queues=1)
            for first in range(0, messages, 256):
                rq.send_batch(client, broker.addr, "PullSize",
                              [{"body": BODY} for _ in range(min(256, messages - first))], queue_id=0)
            deadline = time.monotonic() + 60
            while not rq.topic_route(client, cluster.namesrv_addr, "PullSize").queue_datas:
                assert time.monotonic() < deadline, "topic never routed"
                time.sleep(0.2)
        mq = MessageQueue("PullSize", "broker-a", 0)
        for size, ahead in [(size, ahead) for size in sizes for ahead in in_flight]:
            backend = remote_backend.ClusterBackendSpec(namesrv_addrs=(cluster.namesrv_addr,),
                                                        pull_batch=size, pulls_in_flight=ahead).open()
            _read_all(backend, mq, messages)                   # warm-up pass
            best = None
            for _ in range(repeat):
                w0, c0, b0 = time.perf_counter(), time.process_time(), _cpu_s(broker.proc.pid)
                rows = _read_all(backend, mq, messages)
                passed = (time.perf_counter() - w0, time.process_time() - c0, _cpu_s(broker.proc.pid) - b0)
                assert rows == messages, f"read {rows} of {messages}"
                if best is None or passed[1] < best[1]:
                    best = passed
            wall, ours, theirs = best
            out.append({"pull": size, "ahead": ahead, "rate": messages / wall,
                        "ours_us": ours / messages * 1e6,
                        "broker_us": theirs / messages * 1e6})
    finally:
        cluster.stop(graceful=False)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--version", default="5.3", choices=("4.9", "5.3"))
    ap.add_argument("--messages", type=int, default=400_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--default-in-flight", default=f"{remote_backend.PULLS_IN_FLIGHT}",
                    help="pulls in flight per queue to compare at the default caps (comma-separated; "
                         "the raised caps run the default)")
    args = ap.parse_args()
    compared = tuple(int(v) for v in args.default_in_flight.split(","))
    rows = []
    with tempfile.TemporaryDirectory(prefix="rmq-pull-size-") as tmp:
        for label, caps, sizes, ahead in (("default", {}, (32,), compared),
                                          ("raised", RAISED, SIZES, (remote_backend.PULLS_IN_FLIGHT,))):
            print(f"RocketMQ {args.version}, {label} transfer caps, {args.messages:,} messages of "
                  f"{len(BODY)} B ...", flush=True)
            for r in run_case(args.version, args.messages, args.repeat, caps, sizes, Path(tmp) / label,
                              ahead):
                rows.append([label, r["pull"], r["ahead"], f"{r['rate'] / 1e3:,.0f} k",
                             f"{r['ours_us']:.2f}", f"{r['broker_us']:.2f}"])
                if label == "raised" and r["pull"] == SIZES[0]:
                    base = r
                if label == "raised" and r["pull"] == SIZES[-1]:
                    top = r
    print_table(["broker caps", "messages a pull", "pulls in flight", "wall-clock rate",
                 "ours us CPU/msg", "broker us CPU/msg"], rows)
    print(f"pulls of {SIZES[-1]} vs {SIZES[0]} (raised caps): ours {base['ours_us'] / top['ours_us']:.2f}x "
          f"less CPU a message, the broker {base['broker_us'] / top['broker_us']:.2f}x, wall clock "
          f"{top['rate'] / base['rate']:.2f}x")


if __name__ == "__main__":
    main()
