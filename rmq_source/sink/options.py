"""The options of ``df.write.format("rmq")`` / ``df.writeStream.format("rmq")``, parsed once into
:class:`SinkOptions`.

As for reads, names are case-insensitive, every value is checked strictly and an unknown option is
an error naming the valid ones. :data:`SINK_OPTION_DOCS` documents every option (docs/sink.md).
"""
from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Mapping

from rmq_source.errors import RmqOptionError
from rmq_source.remote.acl import Credentials
from rmq_source.namespace import wrap
from rmq_source.spark.option_values import (NAME_RE, fail, bool_option, int_option, namespace_option,
                                            parse_namesrv_addr, topic_name)
from rmq_source.remote.tls import TlsConfig
from rmq_source.spark.option_docs import OPTION_DOCS
from rmq_source.spark.options import (TLS_OPTIONS, normalise_options, parse_credentials, parse_tls,
                                      trace_topic_option)

#: the broker's default maxMessageSize (4 MiB): a message, and a whole batch, must fit in it
BROKER_MAX_MESSAGE_SIZE = 4 << 20
DEFAULT_PRODUCER_GROUP = "rmq_source_producer"
WRITE_ID_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")

SINK_OPTION_DOCS: dict[str, tuple[str, str]] = {
    "namesrvAddr": ("required", "The cluster's NameServers, host:port;host:port, or a RocketMQ 5 "
                                "Proxy's remoting port."),
    "topic": ("none", "The topic of rows whose topic column is null or absent. Required unless "
                      "the DataFrame has a topic column."),
    "producerGroup": (DEFAULT_PRODUCER_GROUP, "The producer group named in every send (brokers "
                                              "log it; it plays no part in routing)."),
    "namespace": ("none", "Client namespace, as RocketMQ producers' namespace: the topic option, "
                          "the rows' topic column and producerGroup name <namespace>%<name> on the "
                          "brokers (system topics left alone). Characters [A-Za-z0-9_-]."),
    "accessKey": ("none", "The ACL account's access key (with secretKey): every request is signed."),
    "secretKey": ("none", "The ACL account's secret key (never shown in logs or errors)."),
    **{name: OPTION_DOCS[name] for name in TLS_OPTIONS},      # the same as the source's
    "requestTimeoutMs": ("10000", "Timeout of one send or route request, in ms."),
    "requestRetries": ("5", "How many times a failed send is tried again: on another queue when "
                            "its rows have no shardingKey/queueId, else on the same queue once its "
                            "broker is back. 0: never."),
    "retryBackoffMs": ("500", "The wait before the first retry of a queue's send, doubled for each "
                              "next one up to 8 s (the retries span about 15 s)."),
    "brokerOutageTimeoutMs": ("180000", "How long a send goes on being tried while its broker is "
                                        "away (unreachable, restarting, without a master) once "
                                        "requestRetries are used up: rows pinned to a queue wait "
                                        "for its broker's restart. 0: give up after the retries."),
    "batchMessages": ("128", "At most this many messages in one SEND_BATCH_MESSAGE request."),
    "batchBytes": ("1048576", "At most this many encoded bytes in one batch request (a single "
                              "larger message goes alone). At most maxMessageBytes."),
    "maxInFlight": ("8", "Send requests a task has in flight at once, each to another queue (a "
                         "queue has one at a time, so its messages keep their order). Through "
                         "a RocketMQ 5 Proxy at most 64 (it drops answers it cannot write at "
                         "once; docs/semantics.md)."),
    "maxMessageBytes": (str(BROKER_MAX_MESSAGE_SIZE),
                        "The largest message body accepted (the broker's maxMessageSize, 4 MiB "
                        "by default): a larger body fails its row before anything is sent."),
    "requireStoreOk": ("true", "A send the broker stored but could not confirm (FLUSH_DISK_TIMEOUT, "
                               "FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE) is tried again and fails "
                               "the task if never confirmed; false accepts it."),
    "enableMsgTrace": ("false", "true: every message sent is recorded in RocketMQ's message traces "
                                "(a Pub context: producer group, topic, id, tags, keys, broker, "
                                "cost, as RocketMQ's producers with enableMsgTrace), shown by mqadmin "
                                "queryMsgTraceById and the Dashboard; the trace topic must exist "
                                "(brokers with traceTopicEnable=true create it)."),
    "customizedTraceTopic": OPTION_DOCS["customizedTraceTopic"],
    "writeId": ("a new id per write", "Batch writes: names the write in every message's UNIQ_KEY, "
                                      "so running the same write again (same rows, same "
                                      "partitioning) sends the same keys. Streaming queries use "
                                      "their query id and batch id."),
}


@dataclass(frozen=True)
class SinkOptions:
    """Every option of one write, validated."""

    namesrv_addrs: tuple[str, ...]
    topic: str | None
    producer_group: str = DEFAULT_PRODUCER_GROUP
    credentials: Credentials | None = None
    tls: TlsConfig | None = None
    request_timeout_ms: int = 10_000
    retries: int = 5
    retry_backoff_ms: int = 500
    broker_outage_ms: int = 180_000
    batch_messages: int = 128
    batch_bytes: int = 1 << 20
    max_in_flight: int = 8
    max_message_bytes: int = BROKER_MAX_MESSAGE_SIZE
    require_store_ok: bool = True
    #: batch writes: the write's id in UNIQ_KEYs; None in streaming (the query id is used)
    write_id: str | None = None
    #: the client namespace: ``topic`` and ``producer_group`` are already wrapped in it, the
    #: rows' topics are wrapped as they are sent (rmq_source.namespace)
    namespace: str | None = None
    #: enableMsgTrace: the topic the sent messages' traces go to (None: no traces)
    trace_topic: str | None = None


def parse_sink_options(options: Mapping[str, str], *, streaming: bool) -> SinkOptions:
    opts = normalise_options(options, SINK_OPTION_DOCS, what="rmq sink option")
    if "namesrvAddr" not in opts:
        raise RmqOptionError("option namesrvAddr is required to write: the NameServers of the "
                             "cluster (host:port;host:port)")
    namespace = namespace_option("namespace", opts["namespace"]) if "namespace" in opts else None
    topic = topic_name("topic", opts["topic"], opts["topic"].strip()) if "topic" in opts else None
    if topic is not None:
        topic = wrap(namespace, topic)
    group = opts.get("producerGroup", DEFAULT_PRODUCER_GROUP).strip()
    if not NAME_RE.fullmatch(group):
        raise fail("producerGroup", opts["producerGroup"], "expected a group name (characters "
                                                           "[%|a-zA-Z0-9_-], non-empty)")
    group = wrap(namespace, group)

    def number(name: str, default: int, minimum: int, maximum: int) -> int:
        return int_option(name, opts[name], minimum=minimum, maximum=maximum) if name in opts else default

    max_message = number("maxMessageBytes", BROKER_MAX_MESSAGE_SIZE, 1, 1 << 30)
    batch_bytes = number("batchBytes", min(1 << 20, max_message), 1, max_message)
    if streaming and "writeId" in opts:
        raise RmqOptionError("option writeId only applies to batch writes: a streaming query's "
                             "UNIQ_KEYs come from its query id and batch id (stable across restarts "
                             "from the checkpoint)")
    write_id = None
    if not streaming:
        write_id = opts.get("writeId", uuid.uuid4().hex).strip()
        if not WRITE_ID_RE.fullmatch(write_id):
            raise fail("writeId", opts["writeId"], f"expected 1-128 characters of {WRITE_ID_RE.pattern}")
    return SinkOptions(
        namesrv_addrs=parse_namesrv_addr(opts["namesrvAddr"]), topic=topic, producer_group=group,
        credentials=parse_credentials(opts), tls=parse_tls(opts),
        request_timeout_ms=number("requestTimeoutMs", 10_000, 1, 3_600_000),
        retries=number("requestRetries", 5, 0, 1000),
        retry_backoff_ms=number("retryBackoffMs", 500, 0, 600_000),
        broker_outage_ms=number("brokerOutageTimeoutMs", 180_000, 0, 86_400_000),
        batch_messages=number("batchMessages", 128, 1, 1 << 20),
        batch_bytes=batch_bytes,
        max_in_flight=number("maxInFlight", 8, 1, 1024),
        max_message_bytes=max_message,
        require_store_ok=bool_option("requireStoreOk", opts["requireStoreOk"]) if "requireStoreOk" in opts else True,
        write_id=write_id, namespace=namespace,
        trace_topic=trace_topic_option(opts, parse_namesrv_addr(opts["namesrvAddr"])))
