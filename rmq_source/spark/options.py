"""The data source options of ``format("rmq")``: parsed and validated once into :class:`SourceOptions`.

:func:`parse_options` is the only place that reads the raw option strings. Names are
case-insensitive (Spark lower-cases them); every value is checked strictly and a bad one raises
:class:`~rmq_source.errors.RmqOptionError` naming the option, the value given and what is valid.
Nothing is silently defaulted or ignored: an unknown option, an option that does not apply to the
query (a streaming-only option in a batch read, an allocation parameter of another strategy, ...)
and contradicting options are errors. :data:`OPTION_DOCS` (:mod:`.option_docs`) documents every
option; the parsers of single values are :mod:`.option_values`'s; this module holds the rules
between options and :class:`SourceOptions`.

Where a query starts (precedence as in Spark's Kafka source)
-----------------------------------------------------------
``startingTimestamp`` > ``startingOffsetsByTimestamp`` > ``startingOffsets`` (``earliest`` /
``latest`` / JSON) > ``group`` progress; likewise ``endingTimestamp`` >
``endingOffsetsByTimestamp`` > ``endingOffsets``. The lower-precedence option may be
given but is then not used. ``group`` reads the consumer group's committed offsets (the
rmq_source offset store, else the broker's own ``config/consumerOffset.json``); queues without
progress follow ``consumeFromWhere``. A restarted streaming query resumes from its checkpoint and
ignores all starting options.

Values kept in :class:`SourceOptions`
-------------------------------------
* ``starting_offsets``: ``"earliest"``, ``"latest"``, ``"group"`` or ``{MessageQueue: offset}``
  where offset -2 = earliest, -1 = latest, otherwise the next queue offset to read.
* ``ending_offsets`` (batch only, else ``None``): ``"latest"`` or ``{MessageQueue: offset}``
  (-1 = latest); the end is exclusive.
* ``starting_timestamp`` / ``ending_timestamp`` / ``consume_timestamp``: epoch milliseconds; each
  resolves per queue to the first message stored at or after it (the queue's max offset when
  there is none). The first two may also be ``{MessageQueue: epoch ms}`` (the ``...ByTimestamp``
  options), listing every queue the query reads.
* With ``namespace``: every topic and group (``topics``, offsets JSON, ``assign``,
  ``allocate_queues``, ``consumer_group``) is the name on the brokers, wrapped as RocketMQ's
  clients wrap it (:mod:`rmq_source.namespace`); ``topic_pattern`` matches the unwrapped names of
  the namespace's topics.
"""
from __future__ import annotations

import difflib
import re
import time
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from rmq_source.errors import RmqOptionError, RmqStoreLayoutError
from rmq_source.remote.acl import Credentials
from rmq_source.remote.tls import TlsConfig, check_file
from rmq_source.group.allocation import MessageQueue
from rmq_source.group.offset_store import (BROKER_NAME_RE, DEFAULT_OFFSET_STORE_DIRNAME,
                                           check_offset_store_path, default_group_state_path,
                                           default_offset_store_path)
from rmq_source.group.statefile import check_group
from rmq_source.namespace import NamespacedPattern, wrap
from rmq_source.spark.option_docs import (ALLOCATE_STRATEGIES, CONSUME_FROM_WHERE, DEFAULT_BROKER_NAME,
                                          DEFAULT_CONSUME_TIMESTAMP_AGO_MS, DEFAULT_MAX_PARTITION_BYTES,
                                          NEARBY_INNER_STRATEGIES,
                                          OPTION_DOCS, options_markdown)
from rmq_source.spark.option_values import (CLASS_SPEC_RE, CLIENT_ID_RE, EARLIEST, GROUP, LATEST,
                                            NAME_RE, SECRET_NAME_RE, bool_option, choice, comma_list,
                                            consume_timestamp_ms, default_client_id, duration_ms,
                                            fail, int_option, namespace_option, parse_namesrv_addr,
                                            parse_offsets_json, parse_queue_json, topic_name, wrap_names,
                                            wrap_queue_keys, wrap_topic_keys)
from rmq_source.store.native import MAX_BATCH_BYTES
from rmq_source.subscription import EXPRESSION_TYPES, SQL92, Subscription

__all__ = [
    "SourceOptions", "parse_options", "OPTION_DOCS", "options_markdown",
    "EARLIEST", "LATEST", "GROUP", "ALLOCATE_STRATEGIES", "CONSUME_FROM_WHERE",
    "DEFAULT_OFFSET_STORE_DIRNAME", "default_client_id",
]

#: Spark's Kafka source's names, accepted for ours (give one of a pair)
_ALIASES = {"maxOffsetsPerTrigger": "maxMessagesPerTrigger",
            "minOffsetsPerTrigger": "minMessagesPerTrigger"}
_CANONICAL = {name.lower(): name for name in OPTION_DOCS}
_STREAMING_ONLY = ("maxMessagesPerTrigger", "maxOffsetsPerTrigger", "maxBytesPerTrigger",
                   "minMessagesPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay")
_BATCH_ONLY = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")
_ALLOCATE_PARAMS = ("allocateQueues", "consumeRooms", "nearbyInnerStrategy", "virtualNodeCount")
_LOCK_OPTIONS = ("lockLeaseMs", "clientLockLeaseMs", "lockRenewIntervalMs")


def _check_window(names: tuple[str, str], start, end) -> None:
    """Refuse an end before the start of the same queue. ``start`` / ``end``: None, one value for
    every queue, or ``{queue: value}``; negative values (-2 / -1: earliest / latest) are not
    compared; ``names`` are the options they came from."""
    if not isinstance(start, (int, dict)) or not isinstance(end, (int, dict)):
        return                                    # (None, or a word: earliest, latest, group)
    if isinstance(start, int) and isinstance(end, int):
        if end < start:
            raise RmqOptionError(f"options {names[0]}={start} and {names[1]}={end}: the end must be "
                                 ">= the start")
        return
    for mq in sorted(start if isinstance(start, dict) else end):
        s = start if isinstance(start, int) else start.get(mq)
        e = end if isinstance(end, int) else end.get(mq)
        if s is not None and e is not None and 0 <= e < s:
            raise RmqOptionError(f"options {names[0]}/{names[1]}: queue {mq.topic}/{mq.broker_name}/"
                                 f"{mq.queue_id} ends at {e} before it starts at {s}; the end must be "
                                 ">= the start")


# ------------------------------------------------------------------------------------------
# The parsed options
# ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SourceOptions:
    """Every option of one query, validated. Treat the dict fields as read-only.

    Picklable (it travels to executors). See the module docstring for offsets and timestamps.
    """

    streaming: bool
    brokers: dict[str, str] = field(hash=False)        # broker name -> absolute store root, given order
    topics: tuple[str, ...] | None                      # topic option
    topic_pattern: re.Pattern | None                    # topicPattern option (use .fullmatch)
    assign: dict[str, dict[str, tuple[int, ...]]] | None = field(hash=False)
    subscription: Subscription
    consumer_group: str | None
    starting_offsets: Any = field(hash=False)            # str or dict[MessageQueue, int]
    starting_timestamp: int | dict[MessageQueue, int] | None
    ending_offsets: Any = field(hash=False)              # None (streaming), "latest" or dict
    ending_timestamp: int | dict[MessageQueue, int] | None
    consume_from_where: str
    consume_timestamp: int | None                       # epoch ms, only for CONSUME_FROM_TIMESTAMP
    max_messages_per_trigger: int | None
    max_bytes_per_trigger: int | None
    min_messages_per_trigger: int | None
    max_trigger_delay_ms: int
    allocate_strategy: str                              # canonical name or "package.module:Class"
    allocate_queues: tuple[MessageQueue, ...] | None    # CONFIG
    consume_rooms: tuple[str, ...] | None               # MACHINE_ROOM
    nearby_inner_strategy: str | None                   # MACHINE_ROOM_NEARBY
    virtual_node_count: int | None                      # CONSISTENT_HASH (also as nearby inner)
    num_partitions: int | None
    orderly: bool
    min_partitions: int | None
    max_partition_bytes: int
    fail_on_data_loss: bool
    offset_store_path: str | None                       # absolute; None without consumerGroup
    lock_lease_ms: int
    client_lock_lease_ms: int
    lock_renew_interval_ms: int
    client_id: str
    verify_crc: bool
    batch_rows: int
    batch_bytes: int
    namesrv_addrs: tuple[str, ...] | None = None       # live cluster mode (brokers is then empty)
    request_timeout_ms: int = 10_000
    request_retries: int = 5
    retry_backoff_ms: int = 500
    broker_outage_ms: int = 180_000                    # see option brokerOutageTimeoutMs
    pull_batch: int = 32                               # see option pullBatchSize
    credentials: Credentials | None = None             # ACL (its repr hides the secret key)
    tls: TlsConfig | None = None                       # useTLS (its repr hides the key password)
    group_state_path: str | None = None                # live mode, streaming with consumerGroup
    #: the client namespace (rmq_source.namespace); every topic and group above is already
    #: wrapped in it (the names on the brokers), the rows' topic column shows them unwrapped
    namespace: str | None = None
    #: enableMsgTrace: the topic consumed messages' traces go to (None: no traces)
    trace_topic: str | None = None
    #: the columns a user schema asked for, in its order (rmq_source.spark.columns); None: all
    columns: tuple[str, ...] | None = None

    @property
    def broker_names(self) -> tuple[str, ...]:
        return tuple(self.brokers)

    @property
    def assigned_queues(self) -> list[MessageQueue] | None:
        """The ``assign`` option as sorted :class:`MessageQueue` objects (``None`` if not given)."""
        if self.assign is None:
            return None
        return sorted(MessageQueue(t, b, q) for t, by_broker in self.assign.items()
                      for b, qids in by_broker.items() for q in qids)


# ------------------------------------------------------------------------------------------
# parse_options
# ------------------------------------------------------------------------------------------

def _shown(name: str, value) -> str:
    """How an option value appears in an error: secrets (and what may be a misspelled one) never."""
    if SECRET_NAME_RE.search(name):
        return "(value hidden)"
    return repr(value)


def trace_topic_option(opts: Mapping[str, str], namesrv_addrs) -> str | None:
    """``enableMsgTrace``/``customizedTraceTopic``: the trace topic, or None without traces."""
    enabled = bool_option("enableMsgTrace", opts["enableMsgTrace"]) if "enableMsgTrace" in opts else False
    if "customizedTraceTopic" in opts and not enabled:
        raise RmqOptionError(f"option customizedTraceTopic={opts['customizedTraceTopic']!r} only "
                             "applies with enableMsgTrace=true")
    if not enabled:
        return None
    if not namesrv_addrs:
        raise RmqOptionError("option enableMsgTrace=true needs namesrvAddr: traces are messages "
                             "sent to the brokers' trace topic (a store folder has no broker)")
    raw = opts.get("customizedTraceTopic", "RMQ_SYS_TRACE_TOPIC")
    topic = topic_name("customizedTraceTopic", raw, raw.strip())
    if len(topic) > 127:                       # (RocketMQ's TopicValidator limit)
        raise fail("customizedTraceTopic", raw, "a topic name has at most 127 characters")
    return topic


def normalise_options(options: Mapping[str, str], docs: Mapping[str, Any] = OPTION_DOCS,
                      *, what: str = "option") -> dict[str, str]:
    """Raw options -> {canonical name: value} for the options documented in ``docs`` (canonical
    name -> doc); unknown, repeated or non-str options raise, ``what`` naming the kind."""
    canonical_of = _CANONICAL if docs is OPTION_DOCS else {name.lower(): name for name in docs}
    out: dict[str, str] = {}
    for key, value in options.items():
        if not isinstance(key, str):
            raise RmqOptionError(f"option names must be strings, got {key!r}")
        canonical = canonical_of.get(key.strip().lower())
        if canonical is None:
            close = difflib.get_close_matches(key.strip().lower(), list(canonical_of), n=1)
            hint = f" (did you mean {canonical_of[close[0]]}?)" if close else ""
            raise RmqOptionError(f"unknown {what} {key!r} (value {_shown(key, value)}){hint}; valid "
                                 f"{what}s: " + ", ".join(sorted(docs, key=str.lower)))
        if canonical in out:
            raise RmqOptionError(f"option {canonical} given twice (names are case-insensitive): "
                                 f"{_shown(canonical, out[canonical])} and {_shown(canonical, value)}")
        if not isinstance(value, str):
            raise RmqOptionError(f"option {canonical}: invalid value {_shown(canonical, value)}; "
                                 "option values must be strings")
        out[canonical] = value
    return out


def _parse_namesrv(opts: dict[str, str]) -> tuple[str, ...] | None:
    """The NameServers of a live cluster, or None for the store mode."""
    if "namesrvAddr" not in opts:
        for name in ("requestTimeoutMs", "requestRetries", "retryBackoffMs", "brokerOutageTimeoutMs",
                     "pullBatchSize", "accessKey", "secretKey", *TLS_OPTIONS):
            if name in opts:
                raise RmqOptionError(f"option {name} only applies with namesrvAddr (a live "
                                     "cluster); store folders are read without credentials")
        return None
    for other in ("storePath", "path", "brokers", "brokerName", "offsetStorePath"):
        if other in opts:
            raise RmqOptionError(f"options namesrvAddr and {other} are exclusive: a query reads a live "
                                 "cluster (namesrvAddr; group offsets on its brokers) or store "
                                 "folders (storePath/brokers)")
    return parse_namesrv_addr(opts["namesrvAddr"])


def parse_credentials(opts: dict[str, str]) -> Credentials | None:
    """ACL credentials: accessKey and secretKey together, or neither."""
    given = [n for n in ("accessKey", "secretKey") if n in opts]
    if not given:
        return None
    if len(given) == 1:
        other = "secretKey" if given[0] == "accessKey" else "accessKey"
        raise RmqOptionError(f"option {given[0]} needs {other} too: RocketMQ ACL signs every request "
                             "with the account's access key and secret key")
    for name in given:
        if not opts[name] or opts[name] != opts[name].strip():
            raise RmqOptionError(f"option {name}: expected a non-empty value without leading or "
                                 "trailing spaces (value hidden)")
    return Credentials(opts["accessKey"], opts["secretKey"])


TLS_OPTIONS = ("useTLS", "tlsTrustCertPath", "tlsVerifyHostname", "tlsSkipVerify", "tlsCertPath",
               "tlsKeyPath", "tlsKeyPassword")


def parse_tls(opts: dict[str, str]) -> TlsConfig | None:
    """TLS settings: None without useTLS=true; the other TLS options need it, files must be
    readable, and skipping the checks excludes what only a check uses."""
    on = bool_option("useTLS", opts["useTLS"]) if "useTLS" in opts else False
    given = [n for n in TLS_OPTIONS[1:] if n in opts]
    if not on:
        if given:
            raise RmqOptionError(f"option {given[0]} only applies with useTLS=true")
        return None
    skip = bool_option("tlsSkipVerify", opts["tlsSkipVerify"]) if "tlsSkipVerify" in opts else False
    hostname = (bool_option("tlsVerifyHostname", opts["tlsVerifyHostname"])
                if "tlsVerifyHostname" in opts else True)
    if skip:
        for name in ("tlsTrustCertPath", "tlsVerifyHostname"):
            if name in opts:
                raise RmqOptionError(f"option {name} has no effect with tlsSkipVerify=true (no "
                                     "certificate is checked); give one or the other")
    for name in ("tlsKeyPath", "tlsKeyPassword"):
        if name in opts and "tlsCertPath" not in opts:
            raise RmqOptionError(f"option {name} only applies with tlsCertPath (the client "
                                 "certificate it belongs to)")
    files = {name: check_file(name, opts[name])
             for name in ("tlsTrustCertPath", "tlsCertPath", "tlsKeyPath") if name in opts}
    config = TlsConfig(trust_cert_path=files.get("tlsTrustCertPath"), cert_path=files.get("tlsCertPath"),
                       key_path=files.get("tlsKeyPath"), key_password=opts.get("tlsKeyPassword"),
                       verify=not skip, verify_hostname=hostname and not skip)
    try:
        config.context()               # the files are read now: a bad one fails the query here
    except (OSError, ValueError) as exc:     # ssl.SSLError is an OSError
        names = ", ".join(f"{n}={p}" for n, p in files.items())
        raise RmqOptionError(f"options {names}: cannot be used for TLS ({exc})") from None
    return config


def _parse_brokers(opts: dict[str, str]) -> dict[str, str]:
    if "path" in opts:
        if "storePath" in opts and opts["storePath"] != opts["path"]:
            raise RmqOptionError(f"options storePath={opts['storePath']!r} and path={opts['path']!r} "
                                 "(from load(path)) disagree; give the store root once")
        opts.setdefault("storePath", opts["path"])
    if "brokers" in opts:
        for other in ("storePath", "brokerName"):
            if other in opts:
                raise RmqOptionError(f"options brokers and {other} (or load(path)) are exclusive: "
                                     "with several stores name each one in brokers")
        value = opts["brokers"]
        shape = "expected brokerA=/path/a,brokerB=/path/b (unique broker names and store roots)"
        brokers: dict[str, str] = {}
        for entry in value.split(","):
            broker, sep, path = entry.partition("=")
            broker, path = broker.strip(), path.strip()
            if not sep or not broker or not path:
                raise fail("brokers", value, f"entry {entry!r} is not name=path; {shape}")
            if not BROKER_NAME_RE.fullmatch(broker):
                raise fail("brokers", value, f"broker name {broker!r} has characters outside "
                                              f"[A-Za-z0-9_%|@.-] or starts with '.'; {shape}")
            if broker in brokers:
                raise fail("brokers", value, f"broker name {broker!r} given twice; {shape}")
            brokers[broker] = path
    elif "storePath" in opts:
        value = opts["storePath"]
        if not value:
            raise fail("storePath", value, "expected the root directory of a broker store")
        broker = opts.get("brokerName", DEFAULT_BROKER_NAME)
        if not BROKER_NAME_RE.fullmatch(broker):
            raise fail("brokerName", broker, "expected a broker name of characters "
                                              "[A-Za-z0-9_%|@.-], not starting with '.'")
        brokers = {broker: value}
    else:
        raise RmqOptionError("option storePath (or brokers) is required: the root directory of the "
                             "broker store to read, e.g. .option('storePath', '/data/rocketmq/store'); "
                             "or namesrvAddr to read a live cluster")
    seen: dict[str, str] = {}
    option = "brokers" if "brokers" in opts else "storePath"
    for broker, path in list(brokers.items()):
        absolute = os.path.abspath(path)
        if not os.path.isdir(absolute):
            raise RmqStoreLayoutError(f"option {option}: store root {path!r} of broker {broker!r} is "
                                      "not a directory; expected the broker's storePathRootDir")
        real = os.path.realpath(absolute)
        if real in seen:
            raise fail(option, opts[option], f"brokers {seen[real]!r} and {broker!r} name the same "
                                              "store; each store must be listed once")
        seen[real] = broker
        brokers[broker] = absolute
    return brokers


def parse_options(options: Mapping[str, str], *, streaming: bool,
                  now_ms: int | None = None) -> SourceOptions:
    """Validate ``options`` (as passed by Spark) into :class:`SourceOptions`.

    ``streaming`` selects the readStream rules (defaults, streaming-only and batch-only options).
    ``now_ms`` (epoch ms, default: the current time) is the clock for the default consumeTimestamp.
    Store roots must be existing directories (:class:`RmqStoreLayoutError` otherwise); any other
    problem raises :class:`RmqOptionError`.
    """
    opts = normalise_options(options)
    mode = "streaming" if streaming else "batch"

    for name in (_BATCH_ONLY if streaming else _STREAMING_ONLY):
        if name in opts:
            kind = "batch (read)" if streaming else "streaming (readStream)"
            raise RmqOptionError(f"option {name}={opts[name]!r} applies only to {kind} queries, "
                                 f"not to this {mode} query")

    namesrv_addrs = _parse_namesrv(opts)
    brokers = {} if namesrv_addrs else _parse_brokers(opts)
    credentials = parse_credentials(opts)
    tls = parse_tls(opts)
    namespace = namespace_option("namespace", opts["namespace"]) if "namespace" in opts else None
    request_timeout_ms = (int_option("requestTimeoutMs", opts["requestTimeoutMs"], minimum=1,
                               maximum=3_600_000) if "requestTimeoutMs" in opts else 10_000)
    request_retries = (int_option("requestRetries", opts["requestRetries"], minimum=0, maximum=100)
                       if "requestRetries" in opts else 5)
    retry_backoff_ms = (int_option("retryBackoffMs", opts["retryBackoffMs"], minimum=1,
                                   maximum=60_000) if "retryBackoffMs" in opts else 500)
    broker_outage_ms = (int_option("brokerOutageTimeoutMs", opts["brokerOutageTimeoutMs"], minimum=0,
                                   maximum=86_400_000) if "brokerOutageTimeoutMs" in opts else 180_000)
    pull_batch = (int_option("pullBatchSize", opts["pullBatchSize"], minimum=1, maximum=1024)
                  if "pullBatchSize" in opts else 32)

    # What to read
    chosen = [n for n in ("topic", "topicPattern", "assign") if n in opts]
    if len(chosen) != 1:
        detail = "none was given" if not chosen else "got " + ", ".join(chosen)
        raise RmqOptionError(f"exactly one of topic, topicPattern, assign is required ({detail})")
    topics = topic_pattern = assign = None
    if "topic" in opts:
        topics = wrap_names(namespace, "topic", opts["topic"],
                            comma_list("topic", opts["topic"], pattern=NAME_RE, what="topic"))
    elif "topicPattern" in opts:
        value = opts["topicPattern"]
        if not value:
            raise fail("topicPattern", value, "expected a non-empty Python regular expression")
        try:
            topic_pattern = re.compile(value)
        except re.error as exc:
            raise fail("topicPattern", value, f"not a valid Python regular expression ({exc})") from None
        if namespace is not None:
            topic_pattern = NamespacedPattern(topic_pattern, namespace)
    else:
        assign = wrap_topic_keys(namespace, "assign", opts["assign"],
                                 parse_queue_json("assign", opts["assign"], brokers))

    def check_read(name: str, value: str, mqs) -> None:
        for mq in mqs:
            if topics is not None and mq.topic not in topics:
                raise fail(name, value, f"topic {mq.topic!r} is not read by this query "
                                         f"(topic={','.join(topics)})")
            if topic_pattern is not None and not topic_pattern.fullmatch(mq.topic):
                raise fail(name, value, f"topic {mq.topic!r} does not match topicPattern "
                                         f"{topic_pattern.pattern!r}")
            if assign is not None and mq.queue_id not in assign.get(mq.topic, {}).get(mq.broker_name, ()):
                raise fail(name, value, f"queue {mq.topic}/{mq.broker_name}/{mq.queue_id} is not "
                                         "in assign")

    expression_type = opts.get("expressionType", "TAG")
    if expression_type not in EXPRESSION_TYPES:
        raise fail("expressionType", expression_type, "expected TAG (the default) or SQL92")
    if expression_type == SQL92:
        if "subExpression" not in opts:
            raise RmqOptionError("option subExpression: required with expressionType=SQL92 (a "
                                 "selector such as region = 'eu' AND amount > 100)")
        subscription = Subscription.parse(opts["subExpression"], SQL92)
        from rmq_source.sql92.program import selector_program
        selector_program(subscription.expression)     # what the tasks run: its limits, now
    else:
        expression = opts.get("subExpression", "*")
        subscription = Subscription.parse(expression)
        if not subscription.sub_all and not subscription.tags:
            raise fail("subExpression", expression, "expected * or tags separated by || "
                                                     "(e.g. TagA || TagB); this names no tag")

    group = None
    if "consumerGroup" in opts:
        try:
            group = check_group(wrap(namespace, check_group(opts["consumerGroup"])))
        except RmqOptionError as exc:
            raise fail("consumerGroup", opts["consumerGroup"], str(exc)) from None

    # Where to start and end
    start_valid = ("expected earliest, latest, group or JSON {\"topic\":{\"broker\":{\"queueId\":"
                   "offset}}}" if streaming else
                   "expected earliest, group or JSON {\"topic\":{\"broker\":{\"queueId\":offset}}} "
                   "(latest is streaming only)")
    if "startingOffsets" in opts:
        value = opts["startingOffsets"]
        word = value.strip().lower()
        if word in (EARLIEST, LATEST, GROUP):
            if word == LATEST and not streaming:
                raise fail("startingOffsets", value, "latest is not allowed for batch queries; "
                                                      + start_valid)
            if word == GROUP and group is None:
                raise fail("startingOffsets", value, "group needs option consumerGroup")
            starting_offsets: Any = word
        elif value.lstrip().startswith("{"):
            starting_offsets = wrap_queue_keys(namespace, "startingOffsets", value, parse_offsets_json(
                "startingOffsets", value, brokers, allow_earliest=True, allow_latest=streaming))
            check_read("startingOffsets", value, starting_offsets)
        else:
            raise fail("startingOffsets", value, start_valid)
    elif streaming:
        starting_offsets = GROUP if group is not None else LATEST
    else:
        starting_offsets = EARLIEST

    ending_offsets: Any = None
    if not streaming:
        ending_offsets = LATEST
        if "endingOffsets" in opts:
            value = opts["endingOffsets"]
            word = value.strip().lower()
            if word == LATEST:
                ending_offsets = LATEST
            elif value.lstrip().startswith("{"):
                ending_offsets = wrap_queue_keys(namespace, "endingOffsets", value, parse_offsets_json(
                    "endingOffsets", value, brokers, allow_earliest=False, allow_latest=True))
                check_read("endingOffsets", value, ending_offsets)
            else:
                raise fail("endingOffsets", value, "expected latest or JSON "
                            "{\"topic\":{\"broker\":{\"queueId\":offset}}} with offsets >= 0 or -1 "
                            "(latest); earliest is not allowed as an end")
        if isinstance(starting_offsets, dict) and isinstance(ending_offsets, dict):
            _check_window(("startingOffsets", "endingOffsets"), starting_offsets, ending_offsets)

    # one timestamp for every queue wins over one per queue (as in Spark's Kafka source)
    starting_timestamp: Any = None
    ending_timestamp: Any = None
    for name in ("startingOffsetsByTimestamp", "endingOffsetsByTimestamp"):
        if name in opts:
            value = opts[name]
            table = wrap_queue_keys(namespace, name, value, parse_offsets_json(
                name, value, brokers, allow_earliest=False, allow_latest=False, unit="timestamp"))
            check_read(name, value, table)
            if name.startswith("starting"):
                starting_timestamp = table
            else:
                ending_timestamp = table
    if "startingTimestamp" in opts:
        starting_timestamp = int_option("startingTimestamp", opts["startingTimestamp"], minimum=0)
    if "endingTimestamp" in opts:
        ending_timestamp = int_option("endingTimestamp", opts["endingTimestamp"], minimum=0)
    _check_window(("startingTimestamp" if isinstance(starting_timestamp, int) else "startingOffsetsByTimestamp",
                   "endingTimestamp" if isinstance(ending_timestamp, int) else "endingOffsetsByTimestamp"),
                  starting_timestamp, ending_timestamp)

    # Queues the group has no progress on
    consume_from_where = "CONSUME_FROM_LAST_OFFSET"
    consume_timestamp = None
    if "consumeFromWhere" in opts or "consumeTimestamp" in opts:
        name = "consumeFromWhere" if "consumeFromWhere" in opts else "consumeTimestamp"
        if starting_offsets != GROUP:
            raise RmqOptionError(
                f"option {name}={opts[name]!r} only applies with startingOffsets=group (queues the "
                f"consumer group has no progress on); here startingOffsets is "
                f"{starting_offsets if isinstance(starting_offsets, str) else 'JSON'}")
    if "consumeFromWhere" in opts:
        consume_from_where = choice("consumeFromWhere", opts["consumeFromWhere"], CONSUME_FROM_WHERE)
    if consume_from_where == "CONSUME_FROM_TIMESTAMP":
        if "consumeTimestamp" in opts:
            consume_timestamp = consume_timestamp_ms("consumeTimestamp", opts["consumeTimestamp"])
        else:
            now = int(time.time() * 1000) if now_ms is None else now_ms
            # RocketMQ formats "now - 30 min" as yyyyMMddHHmmss: whole seconds.
            consume_timestamp = (now - DEFAULT_CONSUME_TIMESTAMP_AGO_MS) // 1000 * 1000
    elif "consumeTimestamp" in opts:
        raise RmqOptionError(f"option consumeTimestamp={opts['consumeTimestamp']!r} only applies "
                             f"with consumeFromWhere=CONSUME_FROM_TIMESTAMP (here "
                             f"{consume_from_where})")

    # Admission control (streaming only; batch rejected them above)
    for alias, name in _ALIASES.items():
        if name in opts and alias in opts:
            raise RmqOptionError(f"options {name} and {alias} are aliases; give only one (got "
                                 f"{opts[name]!r} and {opts[alias]!r})")

    def limit(name: str) -> int | None:
        """Option ``name`` (or its alias), a positive integer, or None when not given."""
        given = [n for n in (name, *(a for a, c in _ALIASES.items() if c == name)) if n in opts]
        return int_option(given[0], opts[given[0]], minimum=1) if given else None

    max_messages, min_messages = limit("maxMessagesPerTrigger"), limit("minMessagesPerTrigger")
    max_bytes = limit("maxBytesPerTrigger")
    if min_messages is not None and max_messages is not None and min_messages > max_messages:
        raise RmqOptionError(f"options minMessagesPerTrigger={min_messages} and maxMessagesPerTrigger"
                             f"={max_messages}: the minimum must be <= the maximum")
    if "maxTriggerDelay" in opts and min_messages is None:
        raise RmqOptionError(f"option maxTriggerDelay={opts['maxTriggerDelay']!r} only applies with "
                             "minMessagesPerTrigger (or minOffsetsPerTrigger)")
    max_trigger_delay_ms = duration_ms("maxTriggerDelay", opts.get("maxTriggerDelay", "15m"))

    # Allocation
    strategy_text = opts.get("allocateStrategy", "AVG").strip()
    if strategy_text.upper() in ALLOCATE_STRATEGIES:
        strategy = strategy_text.upper()
    elif CLASS_SPEC_RE.fullmatch(strategy_text):
        strategy = strategy_text
    else:
        raise fail("allocateStrategy", opts.get("allocateStrategy"),
                    "expected one of " + ", ".join(ALLOCATE_STRATEGIES)
                    + " (case-insensitive) or package.module:Class")
    inner = None
    if strategy == "MACHINE_ROOM_NEARBY" and "nearbyInnerStrategy" in opts:
        inner_text = opts["nearbyInnerStrategy"].strip()
        if inner_text.upper() in NEARBY_INNER_STRATEGIES:
            inner = inner_text.upper()
        elif CLASS_SPEC_RE.fullmatch(inner_text):
            inner = inner_text
        else:
            raise fail("nearbyInnerStrategy", opts["nearbyInnerStrategy"],
                        "expected one of " + ", ".join(NEARBY_INNER_STRATEGIES)
                        + " (case-insensitive) or package.module:Class")
    uses = {
        "CONFIG": ("allocateQueues",),
        "MACHINE_ROOM": ("consumeRooms",),
        "MACHINE_ROOM_NEARBY": ("nearbyInnerStrategy",)
        + (("virtualNodeCount",) if inner == "CONSISTENT_HASH" else ()),
        "CONSISTENT_HASH": ("virtualNodeCount",),
    }.get(strategy, ())
    for name in _ALLOCATE_PARAMS:
        if name in opts and name not in uses:
            raise RmqOptionError(f"option {name}={opts[name]!r} does not apply to allocateStrategy "
                                 f"{strategy}; it takes "
                                 + (", ".join(uses) if uses else "no parameter options"))
    required = {"CONFIG": "allocateQueues", "MACHINE_ROOM": "consumeRooms",
                "MACHINE_ROOM_NEARBY": "nearbyInnerStrategy"}.get(strategy)
    if required and required not in opts:
        raise RmqOptionError(f"allocateStrategy {strategy} requires option {required}: "
                             + OPTION_DOCS[required][1])
    allocate_queues = None
    if "allocateQueues" in opts:
        table = parse_queue_json("allocateQueues", opts["allocateQueues"], brokers)
        allocate_queues = tuple(MessageQueue(wrap(namespace, t), b, q) for t, by_b in table.items()
                                for b, qids in by_b.items() for q in qids)
        check_read("allocateQueues", opts["allocateQueues"], allocate_queues)
    consume_rooms = (comma_list("consumeRooms", opts["consumeRooms"], pattern=None,
                                 what="machine room") if "consumeRooms" in opts else None)
    virtual_node_count = None
    if "virtualNodeCount" in uses:
        virtual_node_count = int_option("virtualNodeCount", opts.get("virtualNodeCount", "10"), minimum=1,
                                  maximum=(1 << 31) - 1)

    # Tasks
    num_partitions = (int_option("numPartitions", opts["numPartitions"], minimum=1, maximum=(1 << 31) - 1)
                      if "numPartitions" in opts else None)
    orderly = bool_option("orderly", opts["orderly"]) if "orderly" in opts else True
    min_partitions = (int_option("minPartitions", opts["minPartitions"], minimum=1, maximum=(1 << 31) - 1)
                      if "minPartitions" in opts else None)
    max_partition_bytes = DEFAULT_MAX_PARTITION_BYTES
    if "maxPartitionBytes" in opts:
        if num_partitions is not None:
            raise RmqOptionError(f"option maxPartitionBytes={opts['maxPartitionBytes']!r} sizes the tasks "
                                 f"only without numPartitions (given: numPartitions={num_partitions}); "
                                 "set one of them")
        max_partition_bytes = int_option("maxPartitionBytes", opts["maxPartitionBytes"], minimum=1)
    fail_on_data_loss = bool_option("failOnDataLoss", opts["failOnDataLoss"]) if "failOnDataLoss" in opts else True

    # Offset store
    offset_store_path = None
    if "offsetStorePath" in opts:
        if group is None:
            raise RmqOptionError(f"option offsetStorePath={opts['offsetStorePath']!r} only applies "
                                 "with consumerGroup")
        if not opts["offsetStorePath"]:
            raise fail("offsetStorePath", opts["offsetStorePath"], "expected a directory path")
        offset_store_path = os.path.abspath(opts["offsetStorePath"])
    elif group is not None and brokers:
        offset_store_path = default_offset_store_path(brokers)
    if offset_store_path is not None:
        check_offset_store_path(offset_store_path, brokers, brokers)
    group_state_path = None
    if "groupStatePath" in opts:
        if not namesrv_addrs or group is None or not streaming:
            raise RmqOptionError("option groupStatePath only applies to a streaming query with "
                                 "namesrvAddr and consumerGroup (in store mode the group's state "
                                 "lives in offsetStorePath)")
        if not opts["groupStatePath"]:
            raise fail("groupStatePath", opts["groupStatePath"], "expected a directory path")
        group_state_path = os.path.abspath(opts["groupStatePath"])
    elif namesrv_addrs and group is not None and streaming:
        group_state_path = default_group_state_path(namesrv_addrs)

    # Locks (ordered mode) and, in a group, the members' heartbeat timeout and interval
    lock_values = {}
    for name, default in zip(_LOCK_OPTIONS, (60000, 30000, 20000)):
        if name in opts and not orderly and group is None:
            raise RmqOptionError(f"option {name}={opts[name]!r} only applies with orderly=true or "
                                 "consumerGroup")
        lock_values[name] = int_option(name, opts[name], minimum=1) if name in opts else default
    if not (lock_values["lockRenewIntervalMs"] < lock_values["clientLockLeaseMs"]
            < lock_values["lockLeaseMs"]):
        raise RmqOptionError(
            "options lockRenewIntervalMs < clientLockLeaseMs < lockLeaseMs must hold (a client must "
            "stop before the broker-side lease can pass its queues on); got "
            + ", ".join(f"{n}={v}" for n, v in lock_values.items()))
    if "clientId" in opts:
        client_id = opts["clientId"]
        if not CLIENT_ID_RE.fullmatch(client_id) or len(client_id) > 200:
            raise fail("clientId", client_id, "expected 1..200 characters from [A-Za-z0-9_.:@#%|-]")
    else:
        client_id = default_client_id()

    # Reading
    verify_crc = bool_option("verifyCrc", opts["verifyCrc"]) if "verifyCrc" in opts else False
    batch_rows = int_option("batchRows", opts["batchRows"], minimum=1, maximum=(1 << 31) - 1) \
        if "batchRows" in opts else 65536
    # the C core's limit (Arrow int32 offsets): checked here, once, not in every task
    batch_bytes = (int_option("batchBytes", opts["batchBytes"], minimum=1, maximum=MAX_BATCH_BYTES)
                   if "batchBytes" in opts else 64 << 20)

    trace_topic = trace_topic_option(opts, namesrv_addrs)

    return SourceOptions(
        streaming=streaming, brokers=brokers, topics=topics, topic_pattern=topic_pattern,
        assign=assign, subscription=subscription, consumer_group=group,
        starting_offsets=starting_offsets, starting_timestamp=starting_timestamp,
        ending_offsets=ending_offsets, ending_timestamp=ending_timestamp,
        consume_from_where=consume_from_where, consume_timestamp=consume_timestamp,
        max_messages_per_trigger=max_messages, max_bytes_per_trigger=max_bytes,
        min_messages_per_trigger=min_messages, max_trigger_delay_ms=max_trigger_delay_ms,
        allocate_strategy=strategy, allocate_queues=allocate_queues, consume_rooms=consume_rooms,
        nearby_inner_strategy=inner, virtual_node_count=virtual_node_count,
        num_partitions=num_partitions, orderly=orderly, min_partitions=min_partitions,
        max_partition_bytes=max_partition_bytes,
        fail_on_data_loss=fail_on_data_loss, offset_store_path=offset_store_path,
        lock_lease_ms=lock_values["lockLeaseMs"], client_lock_lease_ms=lock_values["clientLockLeaseMs"],
        lock_renew_interval_ms=lock_values["lockRenewIntervalMs"], client_id=client_id,
        verify_crc=verify_crc, batch_rows=batch_rows, batch_bytes=batch_bytes,
        namesrv_addrs=namesrv_addrs, request_timeout_ms=request_timeout_ms,
        request_retries=request_retries, retry_backoff_ms=retry_backoff_ms,
        broker_outage_ms=broker_outage_ms, pull_batch=pull_batch,
        credentials=credentials, tls=tls, group_state_path=group_state_path, namespace=namespace,
        trace_topic=trace_topic,
    )
