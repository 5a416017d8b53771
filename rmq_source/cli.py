"""``rmq-store`` / ``python -m rmq_source``: write sample stores and look into stores from a shell.

Subcommands::

    generate STORE --topic T --queues N --messages M [...]   append sample messages (progress on stderr)
    topics STORE [--json]                                  topics, queues and their min/max offsets
    print STORE --topic T [--queue Q] [--from N] [--to M] [--sub-expression EXPR] [--json]

Offsets are ConsumeQueue offsets; ``--to`` is exclusive; a queue's max offset is the next offset to
be written. Exit codes: 0 success, 2 usage or option error, 3 store error (missing, corrupt,
unknown topic, data deleted by retention), 1 anything unexpected. Errors are one line on stderr.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import random
import sys
import time
from typing import Sequence

from .errors import RmqOptionError, RmqSourceError

EXIT_OK, EXIT_UNEXPECTED, EXIT_USAGE, EXIT_STORE = 0, 1, 2, 3
PROG = "rmq-store"


class _UsageError(Exception):
    """Bad command line: exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):   # one line and exit 2, instead of argparse's usage dump
        raise _UsageError(message)


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must be >= 0")
    return value


def _positive(text: str) -> int:
    value = _non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Write and inspect Apache RocketMQ broker store "
                     "directories (commitlog/, consumequeue/, config/).")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    gen = sub.add_parser("generate", help="append sample messages to a store (created if missing)",
                         description="Append sample messages as a 4.9.3 broker would; appends when "
                         "STORE already holds data.")
    gen.add_argument("store", metavar="STORE", help="store root directory")
    gen.add_argument("--topic", required=True)
    gen.add_argument("--queues", type=_positive,
                     help="write queues of the topic (required when the topic does not exist yet)")
    gen.add_argument("--messages", type=_non_negative, required=True, help="messages to append")
    gen.add_argument("--body-size", type=_non_negative, default=256, help="body bytes (default 256)")
    gen.add_argument("--tags", default=None,
                     help="comma-separated tags picked at random per message (default: no tag)")
    gen.add_argument("--keys-per-message", type=_non_negative, default=0,
                     help="KEYS per message (default 0)")
    gen.add_argument("--rate", type=_positive_float, default=None,
                     help="pace to this many messages per second (default: as fast as possible)")
    gen.add_argument("--broker-name", default="broker-a")
    gen.add_argument("--commitlog-file-size", type=_positive, default=None,
                     help="CommitLog file size in bytes (default: existing files, else 1 GiB)")
    gen.add_argument("--cq-units-per-file", type=_positive, default=None,
                     help="units per ConsumeQueue file (default: existing files, else 300000)")
    gen.add_argument("--seed", type=int, default=None, help="random seed for bodies and tags")
    gen.add_argument("--no-progress", action="store_true", help="no progress bar")

    top = sub.add_parser("topics", help="list topics and queues with min/max offsets")
    top.add_argument("store", metavar="STORE")
    top.add_argument("--json", action="store_true", help="one JSON object per queue and line")
    top.add_argument("--broker-name", default="broker-a")

    pr = sub.add_parser("print", help="print the messages of a topic in queue order")
    pr.add_argument("store", metavar="STORE")
    pr.add_argument("--topic", required=True)
    pr.add_argument("--queue", type=_non_negative, default=None, help="only this queue id")
    pr.add_argument("--from", dest="start", type=_non_negative, default=None,
                    help="first queue offset (default: the queue's min offset)")
    pr.add_argument("--to", dest="end", type=_non_negative, default=None,
                    help="end queue offset, exclusive (default: the queue's max offset)")
    pr.add_argument("--sub-expression", default="*", help="tag subscription, e.g. 'TagA || TagB'")
    pr.add_argument("--json", action="store_true",
                    help="one JSON object per message with every column (body in base64, "
                    "timestamps in epoch ms)")
    pr.add_argument("--broker-name", default="broker-a")
    return parser


# ------------------------------------------------------------------------------------- generate

def _generate(args) -> int:
    from .writer import StoreWriter

    tags = None
    if args.tags is not None:
        tags = [t.strip() for t in args.tags.split(",")]
        if not all(tags):
            raise RmqOptionError(f"--tags {args.tags!r} has an empty tag; give e.g. TagA,TagB")
    rng = random.Random(args.seed)
    with StoreWriter(args.store, broker_name=args.broker_name,
                     commitlog_file_size=args.commitlog_file_size,
                     cq_units_per_file=args.cq_units_per_file) as writer:
        existing = writer.topics().get(args.topic)
        if args.queues is None and existing is None:
            raise RmqOptionError(f"--queues is required: topic {args.topic!r} does not exist in "
                                 f"{args.store}")
        if args.queues is not None and args.queues != existing:
            writer.create_topic(args.topic, args.queues)
        # bodies are slices of one random text pool: cheap, varied, reproducible with --seed
        alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789 "
        pool = bytes(rng.choices(alphabet, k=max(args.body_size * 2, 1 << 16)))
        span = len(pool) - args.body_size
        bar = None
        if not args.no_progress:
            from tqdm import tqdm
            bar = tqdm(total=args.messages, unit="msg", file=sys.stderr, desc=args.topic,
                       mininterval=0.5)
        started = time.monotonic()
        first = last = None
        try:
            for i in range(args.messages):
                if args.rate is not None:
                    delay = started + i / args.rate - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                offset = rng.randrange(span + 1)
                body = pool[offset:offset + args.body_size]
                keys = ([f"KEY-{rng.getrandbits(32):08x}" for _ in range(args.keys_per_message)]
                        or None)
                result = writer.append(args.topic, body, tags=rng.choice(tags) if tags else None,
                                       keys=keys)
                first = first or result
                last = result
                if bar is not None and (i & 63 == 63 or i + 1 == args.messages):
                    bar.update(i + 1 - bar.n)
        finally:
            if bar is not None:
                bar.close()
        end = writer.commitlog_end
    print(f"appended {args.messages} messages to topic {args.topic!r} in {args.store}; "
          f"CommitLog end {end}" + (f", first msgId {first.msg_id}" if first else ""))
    return EXIT_OK


# --------------------------------------------------------------------------------------- topics

def _topics(args) -> int:
    from .store import Store

    with Store(args.store, broker_name=args.broker_name) as store:
        queues = store.queues()
    if args.json:
        for q in queues:
            print(json.dumps({"topic": q.topic, "queueId": q.queue_id, "minOffset": q.min_offset,
                              "maxOffset": q.max_offset}, ensure_ascii=False))
        return EXIT_OK
    if not queues:
        print(f"no topics in {args.store}")
        return EXIT_OK
    width = max(len("TOPIC"), *(len(q.topic) for q in queues))
    print(f"{'TOPIC':<{width}}  {'QUEUE':>5}  {'MIN':>12}  {'MAX':>12}  {'MESSAGES':>12}")
    for q in queues:
        print(f"{q.topic:<{width}}  {q.queue_id:>5}  {q.min_offset:>12}  {q.max_offset:>12}  "
              f"{q.max_offset - q.min_offset:>12}")
    return EXIT_OK


# ---------------------------------------------------------------------------------------- print

def _rows(batch):
    """Rows of a RecordBatch as dicts; timestamps as epoch ms, everything else as Python values."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = {}
    for name in batch.schema.names:
        col = batch.column(name)
        if pa.types.is_timestamp(col.type):
            col = pc.divide(col.cast(pa.int64()), 1000)
        columns[name] = col.to_pylist()
    for i in range(batch.num_rows):
        yield {name: values[i] for name, values in columns.items()}


def _json_row(row: dict) -> str:
    out = dict(row)
    out["body"] = base64.b64encode(row["body"]).decode("ascii")
    out["properties"] = dict(row["properties"] or ())
    return json.dumps(out, ensure_ascii=False)


def _human_row(row: dict) -> str:
    body = row["body"]
    preview = body[:48].decode("utf-8", "replace")
    preview = "".join(c if c.isprintable() else "." for c in preview)
    more = f"... ({len(body)} bytes)" if len(body) > 48 else ""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(row["storeTimestamp"] / 1000))
    ms = row["storeTimestamp"] % 1000
    keys = " ".join(row["keys"] or ())
    return (f"{row['topic']}/{row['queueId']}@{row['queueOffset']}  {stamp}.{ms:03d}Z  "
            f"tags={row['tags'] or '-'}  keys={keys or '-'}  msgId={row['msgId']}  "
            f"body={preview!r}{more}")


def _print(args) -> int:
    from .errors import RmqUnknownTopicError
    from .store import Store

    if args.start is not None and args.end is not None and args.end < args.start:
        raise RmqOptionError(f"--to {args.end} is before --from {args.start}")
    with Store(args.store, broker_name=args.broker_name) as store:
        queue_ids = store.queue_ids(args.topic)
        if args.queue is not None:
            if args.queue not in queue_ids:
                raise RmqUnknownTopicError(f"topic {args.topic!r} has no queue {args.queue} in "
                                           f"{args.store} (queues: {queue_ids})")
            queue_ids = [args.queue]
        out = sys.stdout
        for qid in queue_ids:
            info = store.queue_info(args.topic, qid)
            start = info.min_offset if args.start is None else args.start
            end = info.max_offset if args.end is None else min(args.end, info.max_offset)
            if start >= end:
                continue
            for batch in store.iter_batches(args.topic, qid, start, end,
                                            subscription=args.sub_expression):
                for row in _rows(batch):
                    out.write((_json_row(row) if args.json else _human_row(row)) + "\n")
    return EXIT_OK


# ----------------------------------------------------------------------------------------- main

_COMMANDS = {"generate": _generate, "topics": _topics, "print": _print}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (also used as the console script)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return _COMMANDS[args.command](args)
    except _UsageError as exc:
        print(f"{PROG}: usage error: {exc} (see {PROG} --help)", file=sys.stderr)
        return EXIT_USAGE
    except RmqOptionError as exc:
        print(f"{PROG}: invalid option: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RmqSourceError as exc:
        print(f"{PROG}: store error: {exc}", file=sys.stderr)
        return EXIT_STORE
    except BrokenPipeError:
        # the reader of our output went away (e.g. `| head`): not an error; point stdout at
        # /dev/null so the interpreter's final flush does not complain
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return EXIT_OK
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        print(f"{PROG}: store error: {exc}", file=sys.stderr)
        return EXIT_STORE
    except Exception as exc:   # one line, not a traceback; exit code 1 says it was unexpected
        print(f"{PROG}: unexpected error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_UNEXPECTED


if __name__ == "__main__":
    sys.exit(main())
