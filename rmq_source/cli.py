"""``rmq-store`` / ``python -m rmq_source``: write sample stores and look into stores from a shell.

Subcommands::

    generate STORE --topic T --queues N --messages M [...]   append sample messages (progress on stderr)
    topics STORE [--json]                                  topics, queues and their min/max offsets
    print STORE --topic T [--queue Q] [--from N] [--to M] [--sub-expression EXPR] [--json]
    lag STORE --group G [--topic T] [--offset-store PATH] [--json]
                                                           a consumer group's lag per queue
    reset-offset STORE --group G --topic T (--timestamp MS | --to earliest|latest | --offsets JSON)
                 [--force] [--offset-store PATH] [--json]  rewrite a group's progress on a topic
    search STORE --topic T --key K [--max N] [--method auto|index|scan] [--json]
                                                           messages by KEYS word or UNIQ_KEY

Offsets are ConsumeQueue offsets; ``--to`` is exclusive; a queue's max offset is the next offset to
be written; a group offset is the next offset to consume. Exit codes: 0 success, 2 usage or option
error, 3 store error (missing, corrupt, unknown topic, data deleted by retention), 4 refused
(``reset-offset`` while a live query of the group holds queue locks or heartbeats; ``--force``
overrides), 1 anything unexpected. Errors are one line on stderr.
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

from rmq_source.errors import RmqLockError, RmqOptionError, RmqSourceError

EXIT_OK, EXIT_UNEXPECTED, EXIT_USAGE, EXIT_STORE, EXIT_REFUSED = 0, 1, 2, 3, 4
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


def _group_name(text: str) -> str:
    from rmq_source.group.statefile import check_group
    try:
        return check_group(text)
    except RmqOptionError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
    top.add_argument("store", metavar="STORE", nargs="?")
    _add_live_args(top)
    top.add_argument("--json", action="store_true", help="one JSON object per queue and line")
    top.add_argument("--topic", default=None,
                     help="this topic only (default: every topic; through a RocketMQ 5 Proxy, which "
                     "lists no topics, a topic must be named)")
    top.add_argument("--broker-name", default=None, help="STORE's broker name (default broker-a)")

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

    lag = sub.add_parser("lag", help="a consumer group's lag per queue (like consumerProgress)",
                         description="Per queue: broker max offset, the group's next offset to "
                         "consume (our offset store first, else the broker's "
                         "config/consumerOffset.json; -1 when it has none), their difference and "
                         "the store time of the last consumed message.")
    lag.add_argument("store", metavar="STORE", nargs="?")
    _add_live_args(lag)
    lag.add_argument("--group", required=True, type=_group_name, help="consumer group")
    lag.add_argument("--topic", default=None,
                     help="only this topic (default: every topic the group has offsets for)")
    lag.add_argument("--broker-name", default=None, help="STORE's broker name (default broker-a)")
    lag.add_argument("--offset-store", default=None, metavar="PATH",
                     help="the queries' offsetStorePath (default: STORE/rmq_source_offsets)")
    lag.add_argument("--json", action="store_true", help="one JSON object per queue and line")

    rs = sub.add_parser("reset-offset", help="rewrite a group's progress on a topic "
                        "(like resetOffsetByTime)",
                        description="Rewrite the group's next offsets to consume on every queue of "
                        "TOPIC (or the queues of --offsets) in the offset store. Refused (exit 4) "
                        "while a live query of the group holds queue locks or heartbeats, unless "
                        "--force.")
    rs.add_argument("store", metavar="STORE", nargs="?")
    _add_live_args(rs)
    rs.add_argument("--group", required=True, type=_group_name, help="consumer group")
    rs.add_argument("--topic", required=True)
    target = rs.add_mutually_exclusive_group(required=True)
    target.add_argument("--timestamp", type=_non_negative, metavar="MS",
                        help="epoch ms: each queue moves to its first message stored at or after it")
    target.add_argument("--to", choices=("earliest", "latest"),
                        help="each queue's min offset (earliest) or max offset (latest)")
    target.add_argument("--offsets", metavar="JSON",
                        help='explicit offsets: {"queueId": offset} for TOPIC on this broker, or '
                        '{"TOPIC": {"BROKER": {"queueId": offset}}}; -2 = earliest, -1 = latest; '
                        "queues not named keep their offsets")
    rs.add_argument("--force", action="store_true",
                    help="reset even while a live query of the group holds locks or heartbeats "
                    "(its next micro-batch moves to the reset)")
    rs.add_argument("--broker-name", default=None, help="STORE's broker name (default broker-a)")
    rs.add_argument("--offset-store", default=None, metavar="PATH",
                    help="the queries' offsetStorePath (default: STORE/rmq_source_offsets)")
    rs.add_argument("--json", action="store_true", help="one JSON object per queue and line")

    se = sub.add_parser("search", help="find messages by key (KEYS word or UNIQ_KEY)",
                        description="Find the messages of TOPIC whose KEYS contain KEY or whose "
                        "UNIQ_KEY is KEY, through the store's index files (every candidate verified "
                        "against the CommitLog), or by reading every message of the topic when the "
                        "store has no index files.")
    se.add_argument("store", metavar="STORE")
    se.add_argument("--topic", required=True)
    se.add_argument("--key", required=True, help="one KEYS word or a UNIQ_KEY")
    se.add_argument("--max", type=_positive, default=64,
                    help="at most this many messages, the newest (default 64)")
    se.add_argument("--method", choices=("auto", "index", "scan"), default="auto",
                    help="index files, full scan, or auto: index when the store has index files "
                    "(default)")
    se.add_argument("--hash-slots", type=_positive, default=None,
                    help="the broker's maxHashSlotNum (default: 5000000 when the index file size "
                    "fits, else inferred)")
    se.add_argument("--index-num", type=_positive, default=None,
                    help="the broker's maxIndexNum (default: 20000000 when the size fits, else "
                    "inferred)")
    se.add_argument("--broker-name", default="broker-a")
    se.add_argument("--json", action="store_true",
                    help="one JSON object per message, as print --json")
    se.add_argument("--no-progress", action="store_true", help="no progress bar during a scan")
    for command in (top, pr, lag, rs, se):
        command.add_argument("--namespace", default=None, metavar="NS",
                             help="the client namespace (the data source's namespace option): "
                             "--topic T and --group G are NS%%T and NS%%G on the brokers, and "
                             "topics are shown without NS%% (topics lists only NS's)")
    return parser


def _apply_namespace(args) -> None:
    """--namespace: checked as the option is, then --topic and --group wrapped in it."""
    from rmq_source.namespace import wrap
    from rmq_source.spark.option_values import namespace_option
    if getattr(args, "namespace", None) is None:
        return
    args.namespace = namespace_option("--namespace", args.namespace)
    for attr in ("topic", "group"):
        if getattr(args, attr, None) is not None:
            setattr(args, attr, wrap(args.namespace, getattr(args, attr)))


def _shown(args, name: str) -> str:
    """A topic or group as a client of --namespace names it (as stored without one)."""
    from rmq_source.namespace import unwrap
    return unwrap(getattr(args, "namespace", None), name)


# ------------------------------------------------------------------------------------- generate

def _generate(args) -> int:
    from rmq_source.store.writer import StoreWriter

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
        first = None
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
    from rmq_source.group.report import table_lines
    from rmq_source.store.backend import StoreBackend

    backend = _live_backend(args) or StoreBackend({args.broker_name: os.path.abspath(args.store)})
    if args.topic is not None:
        topics = [args.topic]
    else:
        from rmq_source.namespace import has_namespace
        topics = sorted(t for t in backend.topics()
                        if args.namespace is None or has_namespace(t, args.namespace))
    mqs = backend.queues_for_topics(topics)
    infos = backend.infos(mqs)
    live = args.namesrv is not None      # a cluster has several brokers: name them
    if args.json:
        for mq in mqs:
            q = infos[mq]
            row = {"topic": _shown(args, q.topic), **({"brokerName": mq.broker_name} if live else {}),
                   "queueId": q.queue_id, "minOffset": q.min_offset, "maxOffset": q.max_offset}
            print(json.dumps(row, ensure_ascii=False))
        return EXIT_OK
    if not mqs:
        print(f"no topics in {args.store or args.namesrv}")
        return EXIT_OK
    if live:
        rows = [(_shown(args, mq.topic), mq.broker_name, mq.queue_id, infos[mq].min_offset, infos[mq].max_offset,
                 infos[mq].max_offset - infos[mq].min_offset) for mq in mqs]
        print("\n".join(table_lines(("TOPIC", "BROKER", "QUEUE", "MIN", "MAX", "MESSAGES"), rows,
                                     left=2)))
        return EXIT_OK
    width = max(len("TOPIC"), *(len(_shown(args, mq.topic)) for mq in mqs))
    print(f"{'TOPIC':<{width}}  {'QUEUE':>5}  {'MIN':>12}  {'MAX':>12}  {'MESSAGES':>12}")
    for mq in mqs:
        q = infos[mq]
        print(f"{_shown(args, q.topic):<{width}}  {q.queue_id:>5}  {q.min_offset:>12}  {q.max_offset:>12}  "
              f"{q.max_offset - q.min_offset:>12}")
    return EXIT_OK


# ---------------------------------------------------------------------------------------- print

def _rows(batch, args=None):
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
        row = {name: values[i] for name, values in columns.items()}
        if "topic" in row:
            row["topic"] = _shown(args, row["topic"])
        yield row


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
    from rmq_source.errors import RmqUnknownTopicError
    from rmq_source.store.reader import Store

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
                for row in _rows(batch, args):
                    out.write((_json_row(row) if args.json else _human_row(row)) + "\n")
    return EXIT_OK


# ------------------------------------------------------------------------ consumer-group progress

def _offset_store_path(args, brokers: dict) -> str:
    """``--offset-store`` (default: the queries' default), refused inside a broker's config/."""
    from rmq_source.group.offset_store import check_offset_store_path, default_offset_store_path

    path = os.path.abspath(args.offset_store or default_offset_store_path(brokers))
    try:
        check_offset_store_path(path, brokers, brokers)
    except RmqOptionError:
        raise RmqOptionError(f"--offset-store {path!r} would put offset files inside the broker's "
                             f"config/ folder, which belongs to the broker; choose another "
                             f"directory") from None
    return path


SECRET_KEY_ENV = "RMQ_SECRET_KEY"
TLS_KEY_PASSWORD_ENV = "RMQ_TLS_KEY_PASSWORD"


def _add_live_args(parser) -> None:
    parser.add_argument("--namesrv", default=None, metavar="ADDR",
                        help="a live cluster's NameServers (host:port;host:port) instead of STORE")
    parser.add_argument("--access-key", default=None, metavar="AK",
                        help=f"with --namesrv: sign requests as this ACL account; its secret key is "
                        f"read from ${SECRET_KEY_ENV} (never from the command line)")
    parser.add_argument("--tls", action="store_true",
                        help="with --namesrv: speak TLS to the NameServers and brokers (the data "
                        "source's useTLS; the server certificates are checked)")
    parser.add_argument("--tls-trust-cert-path", default=None, metavar="PEM",
                        help="with --tls: the CAs the servers' certificates chain to (default: the system's)")
    parser.add_argument("--tls-no-verify-hostname", action="store_true",
                        help="with --tls: do not require the certificates to name the addresses dialled")
    parser.add_argument("--tls-skip-verify", action="store_true",
                        help="with --tls: accept any server certificate (tests only)")
    parser.add_argument("--tls-cert-path", default=None, metavar="PEM",
                        help=f"with --tls: a client certificate (its key with --tls-key-path, the "
                        f"key's password from ${TLS_KEY_PASSWORD_ENV})")
    parser.add_argument("--tls-key-path", default=None, metavar="PEM")


def _credentials(args):
    if args.access_key is None:
        return None
    from rmq_source.remote.acl import Credentials
    secret = os.environ.get(SECRET_KEY_ENV)
    if not secret:
        raise RmqOptionError(f"--access-key needs the account's secret key in the environment "
                             f"variable {SECRET_KEY_ENV}")
    return Credentials(args.access_key, secret)


def _tls(args):
    """The TLS settings of the --tls flags, checked as the data source's options are."""
    from rmq_source.spark.options import parse_tls
    opts = {}
    if args.tls:
        opts["useTLS"] = "true"
    for flag, name in (("tls_trust_cert_path", "tlsTrustCertPath"), ("tls_cert_path", "tlsCertPath"),
                       ("tls_key_path", "tlsKeyPath")):
        if getattr(args, flag) is not None:
            opts[name] = getattr(args, flag)
    if args.tls_no_verify_hostname:
        opts["tlsVerifyHostname"] = "false"
    if args.tls_skip_verify:
        opts["tlsSkipVerify"] = "true"
    if args.tls_cert_path is not None and os.environ.get(TLS_KEY_PASSWORD_ENV):
        opts["tlsKeyPassword"] = os.environ[TLS_KEY_PASSWORD_ENV]
    try:
        return parse_tls(opts)
    except RmqOptionError as exc:       # name the flags, not the options
        text = str(exc)
        for flag, name in (("--tls", "useTLS=true"), ("--tls-trust-cert-path", "tlsTrustCertPath"),
                           ("--tls-no-verify-hostname", "tlsVerifyHostname"),
                           ("--tls-skip-verify", "tlsSkipVerify"), ("--tls-cert-path", "tlsCertPath"),
                           ("--tls-key-path", "tlsKeyPath")):
            text = text.replace(name, flag)
        raise RmqOptionError(text) from None


def _live_backend(args):
    """The cluster backend of ``--namesrv``, or None when the command works on STORE (exactly one
    of them); STORE-only options are refused with --namesrv."""
    if (args.store is None) == (args.namesrv is None):
        raise RmqOptionError("give either STORE (a store root) or --namesrv ADDR (a live cluster)")
    if args.namesrv is None:
        if args.access_key is not None or _tls(args) is not None:
            raise RmqOptionError(f"{'--access-key' if args.access_key is not None else '--tls'} "
                                 "applies to --namesrv (a live cluster)")
        if args.broker_name is None:
            args.broker_name = "broker-a"
        return None
    for flag, value in (("--broker-name", args.broker_name),
                        ("--offset-store", getattr(args, "offset_store", None))):
        if value is not None:
            raise RmqOptionError(f"{flag} applies to STORE, not to --namesrv (a live cluster names "
                                 "its brokers; its group offsets are on them)")
    from rmq_source.remote.backend import ClusterBackendSpec
    from rmq_source.spark.option_values import parse_namesrv_addr
    return ClusterBackendSpec(parse_namesrv_addr(args.namesrv), credentials=_credentials(args),
                              tls=_tls(args)).open()


def _check_topic(backend, args) -> None:
    """An unknown --topic is an error naming it (exit 3)."""
    if args.namesrv is None:
        backend.queue_ids(args.topic, args.broker_name)
    else:
        backend.queues_for_topics([args.topic])


def _group_backend(args):
    """(backend, where its topics are, group state folder or None) of the group commands."""
    live = _live_backend(args)
    if live is not None:
        return live, live.where(), None
    from rmq_source.store.backend import StoreBackend

    root = os.path.abspath(args.store)
    brokers = {args.broker_name: root}
    path = _offset_store_path(args, brokers)
    return StoreBackend(brokers, path), root, path


def _lag(args) -> int:
    from rmq_source.group.progress import group_lag
    from rmq_source.group.report import lag_lines

    backend, root, path = _group_backend(args)
    if args.topic is not None:
        _check_topic(backend, args)
        topics = [args.topic]
    elif path is None:
        raise RmqOptionError("lag with --namesrv needs --topic (the brokers do not list a group's "
                             "topics)")
    else:
        existing = set(backend.topics())
        found = backend.group_topics(args.group)
        for topic in sorted(found - existing):
            print(f"{PROG}: note: group {args.group!r} has offsets for topic {topic!r}, which is "
                  f"not in {root}; skipped", file=sys.stderr)
        topics = sorted(found & existing)
    lags = group_lag(backend, args.group, topics) if topics else []
    if args.json:
        for q in lags:
            print(json.dumps({"topic": _shown(args, q.topic), "brokerName": q.broker_name, "queueId": q.queue_id,
                              "brokerOffset": q.broker_offset, "consumerOffset": q.consumer_offset,
                              "diff": q.diff, "lastTimestamp": q.last_timestamp},
                             ensure_ascii=False))
        return EXIT_OK
    if not lags:
        print(f"group {args.group!r} has no offsets on broker {args.broker_name!r} (offset store "
              f"{path}, {root}/config/consumerOffset.json); give --topic T to see a topic's backlog")
        return EXIT_OK
    import dataclasses
    print("\n".join(lag_lines([dataclasses.replace(q, topic=_shown(args, q.topic)) for q in lags])))
    return EXIT_OK


def _parse_offsets(text: str, topic: str, broker: str, namespace: str | None = None) -> dict:
    """``--offsets``: {"queueId": offset} or {topic: {broker: {"queueId": offset}}} ->
    {MessageQueue: offset}; offsets >= 0, or -2 (earliest) / -1 (latest)."""
    from rmq_source.group.allocation import MessageQueue

    shapes = ('{"queueId": offset}', f'{{"{topic}": {{"{broker}": {{"queueId": offset}}}}}}')
    expected = f"expected {shapes[0]} or {shapes[1]}"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RmqOptionError(f"--offsets is not valid JSON ({exc.msg} at character {exc.pos}); "
                             f"{expected}") from None
    if not isinstance(obj, dict) or not obj:
        raise RmqOptionError(f"--offsets must be a non-empty JSON object; {expected}")
    if all(isinstance(v, dict) for v in obj.values()):
        if namespace is not None:           # (the topic as the user names it, or as stored)
            from rmq_source.namespace import wrap
            obj = {wrap(namespace, t): v for t, v in obj.items()}
        if set(obj) != {topic}:
            others = ", ".join(repr(t) for t in obj if t != topic)
            raise RmqOptionError(f"--offsets names topic(s) {others or 'none'}, but reset-offset "
                                 f"changes only --topic {topic!r}; {expected}")
        by_broker = obj[topic]
        if set(by_broker) != {broker} or not isinstance(by_broker[broker], dict):
            raise RmqOptionError(f"--offsets names broker(s) {', '.join(map(repr, by_broker))}; this "
                                 f"store is broker {broker!r} (--broker-name); {expected}")
        queues = by_broker[broker]
    elif any(isinstance(v, dict) for v in obj.values()):
        raise RmqOptionError(f"--offsets mixes queue ids and topics; {expected}")
    else:
        queues = obj
    if not queues:
        raise RmqOptionError(f"--offsets names no queue; {expected}")
    out = {}
    for qid, offset in queues.items():
        if not (isinstance(qid, str) and qid.isascii() and qid.isdigit()):
            raise RmqOptionError(f"--offsets: queue id {qid!r} is not a non-negative integer; "
                                 f"{expected}")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < -2:
            raise RmqOptionError(f"--offsets: offset {offset!r} of queue {qid} must be an integer "
                                 ">= 0, or -2 (earliest) / -1 (latest)")
        out[MessageQueue(topic, broker, int(qid))] = offset
    return out


def _in_use_text(group: str, live: list[str], held: dict[str, str]) -> str:
    clients = sorted(set(live) | set(held.values()))
    queues = [f"{q} ({owner})" for q, owner in held.items()]
    shown = ", ".join(queues[:8]) + (f" and {len(queues) - 8} more" if len(queues) > 8 else "")
    return (f"consumer group {group!r} is in use by live client(s) {', '.join(clients)}"
            + (f"; locks held on {shown}" if queues else "; no queue locks held"))


def _reset(args) -> int:
    from rmq_source.group.offset_store import ReadOffsetType
    from rmq_source.group.progress import reset_group
    from rmq_source.group.report import reset_lines

    backend, root, path = _group_backend(args)
    offsets = None
    if args.offsets is not None:
        if path is None:
            raise RmqOptionError("--offsets applies to STORE; with --namesrv use --timestamp or --to")
        offsets = _parse_offsets(args.offsets, args.topic, args.broker_name, args.namespace)
    _check_topic(backend, args)
    mqs = backend.queues_for_topics([args.topic])
    try:
        live, held = backend.group_users(args.group)
    except RmqLockError as exc:   # a corrupt lock or membership file: cannot tell who uses the group
        if not args.force:
            raise
        print(f"{PROG}: warning: cannot tell whether group {args.group!r} is in use: {exc}; "
              f"resetting anyway (--force)", file=sys.stderr)
        live, held = [], {}
    if live or held:
        text = _in_use_text(args.group, live, held)
        if not args.force:
            print(f"{PROG}: refused: {text}; stop those queries (or wait until their leases "
                  f"expire) or pass --force", file=sys.stderr)
            return EXIT_REFUSED
        print(f"{PROG}: warning: {text}; resetting anyway (--force): running Spark queries of "
              f"the group move to the reset at their next micro-batch (docs/semantics.md, "
              f"\"Operator resets\"); other consumers (RocketMQ's Java clients) keep their own "
              f"position and may write over it (reset those with mqadmin resetOffsetByTime)",
              file=sys.stderr)
    group_store = backend.offset_store(args.group)
    before = group_store.read_offsets(mqs, ReadOffsetType.READ_FROM_STORE)
    written = reset_group(backend, args.group, args.topic, timestamp_ms=args.timestamp, to=args.to,
                          offsets=offsets)
    if args.json:
        for mq, value in sorted(written.items()):
            print(json.dumps({"topic": _shown(args, mq.topic), "brokerName": mq.broker_name,
                              "queueId": mq.queue_id, "previousOffset": before.get(mq, -1),
                              "offset": value}, ensure_ascii=False))
        return EXIT_OK
    from rmq_source.group.allocation import MessageQueue
    def view(mq):
        return MessageQueue(_shown(args, mq.topic), mq.broker_name, mq.queue_id)
    print("\n".join(reset_lines({view(mq): v for mq, v in before.items()},
                                 {view(mq): v for mq, v in written.items()})))
    print(f"reset consumer group {args.group!r} on topic {args.topic!r}: {len(written)} queues "
          f"written to {group_store.file_path(args.broker_name) if path else 'the brokers'}")
    return EXIT_OK


# --------------------------------------------------------------------------------------- search

def _search(args) -> int:
    from rmq_source.store.index_file import find_by_key
    from rmq_source.store.reader import Store

    if args.method == "scan" and (args.hash_slots is not None or args.index_num is not None):
        raise RmqOptionError("--hash-slots/--index-num describe index files; they do not apply "
                             "to --method scan")
    bar = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if args.no_progress:
            return
        if bar is None:
            from tqdm import tqdm
            bar = tqdm(total=total, unit="msg", file=sys.stderr, desc=f"scan {args.topic}",
                       mininterval=0.5)
        bar.update(done - bar.n)

    try:
        with Store(args.store, broker_name=args.broker_name) as store:
            found = find_by_key(store, args.topic, args.key, max_results=args.max,
                                method=args.method, hash_slots=args.hash_slots,
                                index_num=args.index_num, on_progress=progress)
            for batch in found.rows.to_batches():
                for row in _rows(batch, args):
                    sys.stdout.write((_json_row(row) if args.json else _human_row(row)) + "\n")
    finally:
        if bar is not None:
            bar.close()
    n = found.rows.num_rows
    notes = []
    if found.truncated:
        notes.append(f"the newest {args.max} shown (--max); more may exist")
    if found.unresolved:
        notes.append(f"{found.unresolved} index candidate(s) point at CommitLog data that is "
                     "deleted or not a message")
    if args.json:
        for note in notes:
            print(f"{PROG}: note: {note}", file=sys.stderr)
        return EXIT_OK
    how = (f"index: {found.index_files} index file(s), {found.candidates} candidate(s), {n} "
           f"verified" if found.method == "index" else "full scan of the topic's queues")
    print(f"{n} message(s) with key {args.key!r} in topic {args.topic!r} ({how})"
          + "".join(f"; {note}" for note in notes))
    return EXIT_OK


# ----------------------------------------------------------------------------------------- main

_COMMANDS = {"generate": _generate, "topics": _topics, "print": _print, "lag": _lag,
             "reset-offset": _reset, "search": _search}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (also used as the console script)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        _apply_namespace(args)
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
