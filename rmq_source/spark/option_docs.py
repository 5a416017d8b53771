"""Every option of ``format("rmq")`` with its documented default and meaning
(:data:`OPTION_DOCS`, canonical names), and the table of docs/options.md
(:func:`options_markdown`)."""
from __future__ import annotations

from rmq_source.group.offset_store import DEFAULT_OFFSET_STORE_DIRNAME
from rmq_source.store.native import MAX_BATCH_BYTES

ALLOCATE_STRATEGIES = ("AVG", "AVG_BY_CIRCLE", "CONFIG", "MACHINE_ROOM", "MACHINE_ROOM_NEARBY",
                       "CONSISTENT_HASH")
NEARBY_INNER_STRATEGIES = ("AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH")
CONSUME_FROM_WHERE = ("CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_FIRST_OFFSET",
                      "CONSUME_FROM_TIMESTAMP")
DEFAULT_BROKER_NAME = "broker-a"
DEFAULT_CONSUME_TIMESTAMP_AGO_MS = 30 * 60 * 1000
DEFAULT_MAX_PARTITION_BYTES = 128 << 20      # as Spark's spark.sql.files.maxPartitionBytes

# Option name -> (default as documented, description). Keys are the canonical spellings.
OPTION_DOCS: dict[str, tuple[str, str]] = {
    "namesrvAddr": ("none",
                    "Read a live cluster: its NameServers, host:port;host:port (as RocketMQ clients "
                    "take it), or a RocketMQ 5 Proxy's remoting port (no topicPattern there: "
                    "docs/semantics.md). Exclusive with storePath/brokers/brokerName."),
    "requestTimeoutMs": ("10000", "With namesrvAddr: timeout of one request to a NameServer or "
                                  "broker, in ms."),
    "requestRetries": ("5", "With namesrvAddr: how many times a request is tried again when its "
                            "broker is unreachable, times out or is busy (a restarting broker), "
                            "the route asked again each time; 0: never."),
    "retryBackoffMs": ("500", "With namesrvAddr: the wait before the first retry, doubled for each "
                              "next one up to 8 s (the retries span about 15 s)."),
    "pullBatchSize": ("32", "With namesrvAddr: the messages asked per pull, 1-1024 (RocketMQ's "
                            "pullBatchSize). A broker answers at most its "
                            "maxTransferCountOnMessageInMemory (32 by default) and "
                            "maxTransferBytesOnMessageInMemory (256 KiB): with both raised, pulls "
                            "of 1,024 cost about 2.5x less CPU a message here and 3x less on the "
                            "broker, and a narrow read ran 1.4x (1 KiB bodies) to 2x (100 B) as "
                            "fast as with pulls of 32 (bench/RESULTS.md: bench_pull_size.py, "
                            "bench_vs_kafka.py)."),
    "brokerOutageTimeoutMs": ("180000", "With namesrvAddr: how long a broker may be away "
                                        "(unreachable, restarting, without a master) before it "
                                        "counts as lost: until then a streaming query plans "
                                        "without its queues and keeps their commits, and tasks "
                                        "reading it wait for it; after that failOnDataLoss "
                                        "decides. 0: lost after the request retries."),
    "accessKey": ("none", "With namesrvAddr: the ACL account's access key; every request is signed "
                          "with it and secretKey (RocketMQ's AclClientRPCHook). Give both or neither."),
    "secretKey": ("none", "With namesrvAddr: the ACL account's secret key (never shown in logs, "
                          "errors, plans or offsets)."),
    "useTLS": ("false", "With namesrvAddr: speak TLS to every NameServer and broker (servers with "
                        "tls.server.mode=enforcing or permissive), from the driver and the tasks. "
                        "The server's certificate is checked (tlsTrustCertPath, tlsVerifyHostname, "
                        "tlsSkipVerify)."),
    "tlsTrustCertPath": ("the system's CAs", "With useTLS: PEM file of the CAs the servers' "
                                             "certificates must chain to (every host of the job "
                                             "reads it at the same path)."),
    "tlsVerifyHostname": ("true", "With useTLS: the server's certificate must name the address "
                                  "dialled (the IPs the NameServers give for brokers); false checks "
                                  "the chain only, as RocketMQ's Java client (which never checks "
                                  "names)."),
    "tlsSkipVerify": ("false", "With useTLS: true accepts any server certificate (as the Java "
                               "client's default tls.client.authServer=false): encrypted but not "
                               "authenticated; for tests."),
    "tlsCertPath": ("none", "With useTLS: PEM client certificate, for servers that ask for one "
                            "(tls.server.need.client.auth)."),
    "tlsKeyPath": ("none", "With tlsCertPath: its PEM private key (if not in the certificate "
                           "file)."),
    "tlsKeyPassword": ("none", "With tlsCertPath: the private key's password (never shown in "
                               "logs, errors, plans or offsets)."),
    "namespace": ("none", "Client namespace, as RocketMQ clients' namespace: every topic and group "
                          "named in the options (topic, offsets JSON, assign, allocateQueues, "
                          "consumerGroup) is <namespace>%<name> on the brokers (retry names "
                          "%RETRY%<namespace>%<group>, system topics left alone); topicPattern "
                          "matches the namespace's topics by their names without it, and the topic "
                          "column shows names without it (as MessageExt.getTopic()). Characters "
                          "[A-Za-z0-9_-]."),
    "groupStatePath": ("~/.cache/rmq_source/groups/<namesrvAddr>",
                       "With namesrvAddr and consumerGroup (streaming): the folder of the group's "
                       "batch plans (which queues each batch reads, so a restarted query re-runs a "
                       "batch exactly; offsets, membership and locks are on the brokers). Share it "
                       "between queries of the group whose drivers may restart on another host."),
    "storePath": ("required unless brokers or namesrvAddr",
                  "Root directory of one broker's store (the folder holding commitlog/, "
                  "consumequeue/ and config/)."),
    "path": ("none", "Set by Spark's load(path); the same as storePath (if both are given they "
                     "must be equal)."),
    "brokers": ("none",
                "Several stores: brokerA=/path/a,brokerB=/path/b (unique names, one store each; "
                "paths cannot contain ','). Exclusive with storePath/brokerName."),
    "brokerName": (DEFAULT_BROKER_NAME,
                   "Broker name of storePath (part of every MessageQueue and of offsets JSON)."),
    "topic": ("none", "Comma-separated topics to read. Exactly one of topic, topicPattern, assign."),
    "topicPattern": ("none",
                     "Python regular expression matched against the whole name of every topic in "
                     "the stores (live: the NameServers' topic list, which a RocketMQ 5 Proxy does "
                     "not serve); while streaming, new matching topics and queues are picked up "
                     "from their earliest offset."),
    "assign": ("none", 'Exact queues as JSON {"topic":{"broker":[queueIds]}}.'),
    "subExpression": ("*", "RocketMQ tag expression: * (all) or TagA || TagB; with "
                           "expressionType=SQL92 a SQL92 selector over the message properties "
                           "(required then), e.g. region = 'eu' AND amount > 100."),
    "expressionType": ("TAG", "TAG or SQL92: how subExpression selects messages. SQL92 is "
                              "RocketMQ's selector language and semantics (see semantics.md); "
                              "live brokers need enablePropertyFilter=true."),
    "consumerGroup": ("none",
                      "Consumer group whose progress is read (startingOffsets=group) and "
                      "committed. Characters [%|a-zA-Z0-9_-]. With namesrvAddr a streaming query "
                      "also reads the retry queues %RETRY%<group> it is allocated (messages the "
                      "group's Java consumers sent back)."),
    "startingOffsets": ("streaming: group with consumerGroup, else latest; batch: earliest",
                        'earliest, latest (streaming only), group (needs consumerGroup), or JSON '
                        '{"topic":{"broker":{"queueId":offset}}} with -2 = earliest, -1 = latest '
                        '(-1 streaming only). JSON must list every queue the query reads.'),
    "startingTimestamp": ("none",
                          "Epoch ms; each queue starts at its first message stored at or after "
                          "it. Takes precedence over startingOffsets."),
    "startingOffsetsByTimestamp": ("none",
                                   'JSON {"topic":{"broker":{"queueId":epochMs}}}: each listed queue '
                                   "starts at its first message stored at or after its timestamp "
                                   "(its end when there is none). Must list every queue the query "
                                   "reads. Over startingOffsets, under startingTimestamp."),
    "endingOffsets": ("latest (batch)",
                      "Batch only: latest or JSON as startingOffsets (-1 = latest; -2 is not "
                      "allowed); exclusive end."),
    "endingTimestamp": ("none",
                        "Batch only: epoch ms; each queue ends before its first message stored "
                        "at or after it. Takes precedence over endingOffsets."),
    "endingOffsetsByTimestamp": ("none",
                                 "Batch only: JSON as startingOffsetsByTimestamp; each queue ends "
                                 "before its first message stored at or after its timestamp. Over "
                                 "endingOffsets, under endingTimestamp."),
    "consumeFromWhere": ("CONSUME_FROM_LAST_OFFSET",
                         "Start of queues the group has no progress on (startingOffsets=group): "
                         "CONSUME_FROM_LAST_OFFSET, CONSUME_FROM_FIRST_OFFSET or "
                         "CONSUME_FROM_TIMESTAMP."),
    "consumeTimestamp": ("30 minutes before the options are parsed",
                         "yyyyMMddHHmmss in local time, for CONSUME_FROM_TIMESTAMP."),
    "maxMessagesPerTrigger": ("none",
                              "Streaming only: at most this many messages per micro-batch, shared "
                              "by backlog across queues."),
    "maxOffsetsPerTrigger": ("none", "Alias of maxMessagesPerTrigger (give only one)."),
    "maxBytesPerTrigger": ("none",
                           "Streaming only: at most this many CommitLog bytes of whole messages "
                           "per micro-batch, shared by backlog across queues; a single message "
                           "larger than the limit is read alone."),
    "minMessagesPerTrigger": ("none",
                              "Streaming only: wait until this many messages are available, but "
                              "never longer than maxTriggerDelay (Trigger.AvailableNow never waits); "
                              "maxMessagesPerTrigger and maxBytesPerTrigger still cap the batch."),
    "minOffsetsPerTrigger": ("none", "Alias of minMessagesPerTrigger (give only one)."),
    "maxTriggerDelay": ("15m",
                        "Streaming only, with minMessagesPerTrigger: longest wait, a duration like "
                        "500ms, 30s, 15m, 1h, 1d."),
    "allocateStrategy": ("AVG",
                         "How queues are spread over consumer slots: AVG, AVG_BY_CIRCLE, CONFIG, "
                         "MACHINE_ROOM, MACHINE_ROOM_NEARBY, CONSISTENT_HASH (case-insensitive) "
                         "or package.module:Class."),
    "allocateQueues": ("none", 'CONFIG only (required): JSON {"topic":{"broker":[queueIds]}}.'),
    "consumeRooms": ("none", "MACHINE_ROOM only (required): comma-separated machine rooms."),
    "nearbyInnerStrategy": ("none",
                            "MACHINE_ROOM_NEARBY only (required): AVG, AVG_BY_CIRCLE, "
                            "CONSISTENT_HASH or package.module:Class."),
    "virtualNodeCount": ("10",
                         "CONSISTENT_HASH (or MACHINE_ROOM_NEARBY with inner CONSISTENT_HASH): "
                         "virtual nodes per consumer slot."),
    "numPartitions": ("sized to the work", "Consumer slots, i.e. Spark tasks per (micro-)batch, each "
                      "reading the queues the allocation strategy gives it. Without it every queue "
                      "is a slot and the slots are packed, in order, into tasks: at least "
                      "minPartitions (default: the CPUs of the planning machine, but one task per "
                      "8 MiB of work when the batch is lighter) as far as the queues with data "
                      "allow, more when the backlog exceeds maxPartitionBytes per task."),
    "orderly": ("true", "true: a queue is read by one task in offset order; false: ranges may split."),
    "minPartitions": ("the planning machine's CPUs (fewer for light batches)",
                      "At least this many tasks when the queues allow, however light the batch: "
                      "without numPartitions the "
                      "slots are packed into this many tasks or more; with orderly=false large "
                      "ranges are also split to reach it (a queue is never split when orderly)."),
    "maxPartitionBytes": (str(DEFAULT_MAX_PARTITION_BYTES), "Without numPartitions: the bytes (estimated from sampled "
                          "message sizes, plus a fixed cost per queue) a task reads at most "
                          "before the plan gets another task; one queue's range is never split "
                          "for it."),
    "failOnDataLoss": ("true", "Fail when needed messages were deleted by retention, or are gone "
                               "when a task reads its planned range (a queue's ConsumeQueue "
                               "removed or shorter than planned, a store removed), or when a "
                               "live broker stays away after the retries; false: skip lost "
                               "messages with a warning giving the range and count, and let an "
                               "away broker's queues wait until it is back."),
    "offsetStorePath": (f"<first store root>/{DEFAULT_OFFSET_STORE_DIRNAME}",
                        "With consumerGroup: where the group's committed offsets live "
                        "(<offsetStorePath>/<brokerName>/consumerOffset.json). Never inside a "
                        "broker's config/ folder; the broker's own consumerOffset.json is only read."),
    "lockLeaseMs": ("60000", "orderly=true: broker-side queue lock lease (ms); with consumerGroup "
                    "also how long a silent member (a killed query) stays in the group."),
    "clientLockLeaseMs": ("30000", "orderly=true: client-side lock lease (ms); < lockLeaseMs."),
    "lockRenewIntervalMs": ("20000", "orderly=true or consumerGroup: lock renewal and member "
                            "heartbeat interval (ms); < clientLockLeaseMs."),
    "clientId": ("generated: rmq_source-<host>-<pid>-<random>",
                 "Consumer id of this query (lock owner, slot ids); text before the first @ is "
                 "its machine room. Characters [A-Za-z0-9_.:@#%|-]."),
    "verifyCrc": ("false", "Verify each record's BODYCRC while reading."),
    "enableMsgTrace": ("false", "Live mode: record what the query consumed as RocketMQ message "
                       "traces (SubBefore/SubAfter, as RocketMQ's clients with enableMsgTrace), "
                       "shown by mqadmin queryMsgTraceById and the Dashboard; the trace topic "
                       "must exist (brokers with traceTopicEnable=true create it)."),
    "customizedTraceTopic": ("RMQ_SYS_TRACE_TOPIC", "With enableMsgTrace=true: the topic the "
                             "traces go to."),
    "batchRows": ("65536", "Most rows per Arrow batch."),
    "batchBytes": (str(64 << 20), "Most body bytes per Arrow batch (at least one row is always read); "
                                  f"at most {MAX_BATCH_BYTES} (2^31-1, the C core's limit)."),
}


def options_markdown(docs: dict[str, tuple[str, str]] | None = None) -> str:
    """``docs`` (default :data:`OPTION_DOCS`) as a Markdown table (option, default, meaning)."""
    lines = ["| option | default | meaning |", "|---|---|---|"]
    for name, (default, text) in (OPTION_DOCS if docs is None else docs).items():
        lines.append(f"| `{name}` | {default} | {text.replace('|', '&#124;')} |")
    return "\n".join(lines)
