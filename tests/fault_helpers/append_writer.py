"""Append to a store at a steady rate until told to stop; log every AppendResult as JSON lines.

Run as ``python append_writer.py --root STORE --log LOG.jsonl [options]``. Messages go to the
queues of one topic in turn; their content is ``fault_helpers.payload`` of (topic, queue, offset).
Every few messages a batch send (``append_batch``) and a zlib-compressed body are mixed in.

Log lines (one JSON object each, flushed often, complete once the process exits):
``{"q": queueId, "o": queueOffset, "phy": commitLogOffset, "size": storeSize, "id": msgId}`` per
message, and ``{"deleted": [paths], "cl_min": first remaining CommitLog offset}`` per retention
pass (``--retain-files``). A ``--ready`` file is created after the first message is appended.

Stops on SIGTERM/SIGINT, after ``--max-messages`` or ``--duration`` seconds, and always closes the
writer cleanly (flush, release the store lock) before exiting 0.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/ (for fault_helpers)

from fault_helpers.payload import batch_props, body_for, props_for, tags_for  # noqa: E402
from rmq_source.store.writer import StoreWriter  # noqa: E402

_stop = False


def _on_signal(signum, frame):  # noqa: ARG001 - signal handler signature
    global _stop
    _stop = True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--root", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--ready")
    ap.add_argument("--topic", default="FaultTopic")
    ap.add_argument("--queues", type=int, default=3)
    ap.add_argument("--rate", type=float, default=50.0, help="messages per second (0: no limit)")
    ap.add_argument("--duration", type=float, default=600.0)
    ap.add_argument("--max-messages", type=int, default=0)
    ap.add_argument("--commitlog-file-size", type=int, default=64 * 1024)
    ap.add_argument("--cq-units", type=int, default=64)
    ap.add_argument("--batch-every", type=int, default=17, help="0: never append_batch")
    ap.add_argument("--compress-every", type=int, default=5, help="0: never compress")
    ap.add_argument("--retain-files", type=int, default=0,
                    help="keep at most this many CommitLog files before the active one (0: all)")
    args = ap.parse_args(argv)

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    topic = args.topic
    log = open(args.log, "a", encoding="utf-8")
    written = 0
    started = time.monotonic()
    last_retention = started
    with StoreWriter(args.root, commitlog_file_size=args.commitlog_file_size,
                     cq_units_per_file=args.cq_units) as w:
        if topic not in w.topics():
            w.create_topic(topic, args.queues)
        qid = 0
        step = 0
        while not _stop:
            now = time.monotonic()
            if now - started > args.duration or (args.max_messages and written >= args.max_messages):
                break
            if args.rate > 0:
                due = started + written / args.rate
                if due > now:
                    time.sleep(min(due - now, 0.05))
                    continue
            step += 1
            first = w.next_offset(topic, qid)
            if args.batch_every and step % args.batch_every == 0:
                n = 3
                results = w.append_batch(topic, [body_for(topic, qid, first + i) for i in range(n)],
                                         queue_id=qid, tags=tags_for(first),
                                         properties=batch_props(qid, first, n))
            else:
                compress = args.compress_every and step % args.compress_every == 0
                compression = "zlib" if compress else None
                results = [w.append(topic, body_for(topic, qid, first), queue_id=qid,
                                    tags=tags_for(first), keys=[f"k{first}"],
                                    properties=props_for(topic, qid, first), compression=compression)]
            for i, r in enumerate(results):
                if r.queue_offset != first + i:   # the payload is keyed by the offset we expected
                    raise SystemExit(f"writer put {topic}/{qid} message at {r.queue_offset}, "
                                     f"expected {first + i}")
                log.write(json.dumps({"q": r.queue_id, "o": r.queue_offset, "phy": r.commitlog_offset,
                                      "size": r.size, "id": r.msg_id}) + "\n")
            written += len(results)
            qid = (qid + 1) % args.queues
            if written == len(results):
                log.flush()
                if args.ready:
                    Path(args.ready).touch()
            if step % 50 == 0:
                log.flush()
            if args.retain_files and now - last_retention > 0.2:
                last_retention = now
                files = sorted(n for n in os.listdir(Path(args.root) / "commitlog") if n.isdigit())
                # files before the active one: all but the active and the preallocated next file
                extra = len(files) - 2 - args.retain_files
                if extra > 0:
                    deleted = w.delete_oldest_commitlog_files(extra)
                    left = sorted(n for n in os.listdir(Path(args.root) / "commitlog") if n.isdigit())
                    log.write(json.dumps({"deleted": [str(p) for p in deleted],
                                          "cl_min": int(left[0])}) + "\n")
                    log.flush()
    log.flush()
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
