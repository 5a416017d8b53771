"""rmq_source.spark.options: every option parsed into SourceOptions, and every bad value rejected clearly."""
from __future__ import annotations

import os
import pickle
import re
import time

import pytest

from conftest import raises_rmq, require
from rmq_source.group.allocation import MessageQueue
from rmq_source.errors import RmqOptionError, RmqStoreLayoutError
from rmq_source.remote.acl import Credentials
from rmq_source.remote.tls import TlsConfig
from rmq_source.spark.options import OPTION_DOCS, SourceOptions, options_markdown, parse_options
from rmq_source.spark.query import strategy_of

MQ = MessageQueue
NOW_MS = 1_700_000_000_123


@pytest.fixture
def dirs(tmp_path):
    """Two empty store roots A and B (options only check that they are directories)."""
    out = {}
    for name in ("A", "B"):
        path = tmp_path / name
        path.mkdir()
        out[name] = str(path)
    return out


def fill(obj, dirs):
    """Replace {A}/{B} in strings (recursively) with the store roots."""
    if isinstance(obj, str):
        return obj.replace("{A}", dirs["A"]).replace("{B}", dirs["B"])
    if isinstance(obj, dict):
        return {fill(k, dirs): fill(v, dirs) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not isinstance(obj, MessageQueue):
        return type(obj)(fill(v, dirs) for v in obj)
    return obj


def base(**extra):
    return {"storePath": "{A}", "topic": "T", **extra}


DEFAULTS_BATCH = dict(
    streaming=False, brokers={"broker-a": "{A}"}, topics=("T",), topic_pattern=None, assign=None,
    consumer_group=None, starting_offsets="earliest", starting_timestamp=None,
    ending_offsets="latest", ending_timestamp=None, consume_from_where="CONSUME_FROM_LAST_OFFSET",
    consume_timestamp=None, max_messages_per_trigger=None, max_bytes_per_trigger=None,
    min_messages_per_trigger=None, max_trigger_delay_ms=15 * 60_000, allocate_strategy="AVG",
    allocate_queues=None, consume_rooms=None, nearby_inner_strategy=None, virtual_node_count=None,
    num_partitions=None, orderly=True, min_partitions=None, max_partition_bytes=128 << 20,
    fail_on_data_loss=True,
    offset_store_path=None, lock_lease_ms=60000, client_lock_lease_ms=30000,
    lock_renew_interval_ms=20000, verify_crc=False, batch_rows=65536, batch_bytes=64 << 20,
)

# (id, streaming, options, expected field values)
VALID = [
    ("batch-defaults", False, base(), DEFAULTS_BATCH),
    ("streaming-defaults", True, base(), {"streaming": True, "starting_offsets": "latest",
                                          "ending_offsets": None, "consumer_group": None}),
    ("keys-case-insensitive", False, {"STOREPATH": "{A}", "Topic": "T", "VERIFYcrc": "TRUE"},
     {"brokers": {"broker-a": "{A}"}, "topics": ("T",), "verify_crc": True}),
    ("path-from-load", False, {"path": "{A}", "topic": "T"}, {"brokers": {"broker-a": "{A}"}}),
    ("path-equal-storePath", False, base(path="{A}"), {"brokers": {"broker-a": "{A}"}}),
    ("brokerName", False, base(brokerName="room1@broker-b"), {"brokers": {"room1@broker-b": "{A}"}}),
    ("brokers", False, {"brokers": "b2={B}, b1={A}", "topic": "T"},
     {"brokers": {"b2": "{B}", "b1": "{A}"}}),
    ("namesrvAddr", False, {"namesrvAddr": "127.0.0.1:9876; ns2:9877", "topic": "T"},
     {"brokers": {}, "namesrv_addrs": ("127.0.0.1:9876", "ns2:9877"), "request_timeout_ms": 10_000}),
    ("namesrv-group-offsets-on-broker", True,
     {"namesrvAddr": "h:1", "topic": "T", "consumerGroup": "G", "requestTimeoutMs": "2500",
      "startingOffsets": '{"T":{"any-broker":{"0":5}}}'},
     {"offset_store_path": None, "request_timeout_ms": 2500,
      "starting_offsets": {MQ("T", "any-broker", 0): 5}}),
    ("acl-credentials", False, {"namesrvAddr": "h:1", "topic": "T", "accessKey": "ak",
                                "secretKey": "sk-1"},
     {"credentials": Credentials("ak", "sk-1")}),
    ("namespace", True, {"namesrvAddr": "h:1", "topic": "T", "consumerGroup": "G", "namespace": " ns "},
     {"namespace": "ns", "topics": ("ns%T",), "consumer_group": "ns%G"}),
    ("msg-trace", True, {"namesrvAddr": "h:1", "topic": "T", "enableMsgTrace": "true",
                         "customizedTraceTopic": "TR"}, {"trace_topic": "TR"}),
    ("msg-trace-default-topic", False, {"namesrvAddr": "h:1", "topic": "T", "enableMsgTrace": "TRUE"},
     {"trace_topic": "RMQ_SYS_TRACE_TOPIC"}),
    ("tls-unchecked", False, {"namesrvAddr": "h:1", "topic": "T", "useTLS": "true", "tlsSkipVerify": "true"},
     {"tls": TlsConfig(verify=False, verify_hostname=False)}),
    ("live-retries", False, {"namesrvAddr": "h:1", "topic": "T", "requestRetries": "0",
                             "retryBackoffMs": "250", "brokerOutageTimeoutMs": "0"},
     {"request_retries": 0, "retry_backoff_ms": 250, "broker_outage_ms": 0}),
    ("live-retries-default", False, {"namesrvAddr": "h:1", "topic": "T"},
     {"request_retries": 5, "retry_backoff_ms": 500, "broker_outage_ms": 180_000, "pull_batch": 32}),
    ("pull-batch", False, {"namesrvAddr": "h:1", "topic": "T", "pullBatchSize": "1024"}, {"pull_batch": 1024}),
    ("live-group-state", True, {"namesrvAddr": "ns1:9876;ns2:9876", "topic": "T",
                                "consumerGroup": "G", "groupStatePath": "{A}/plans"},
     {"group_state_path": "{A}/plans"}),
    ("topic-list", False, base(topic=" T1 , %RETRY%G ,T-3"), {"topics": ("T1", "%RETRY%G", "T-3")}),
    ("topicPattern", True, {"storePath": "{A}", "topicPattern": "Topic.*"},
     {"topics": None, "topic_pattern": re.compile("Topic.*")}),
    ("assign", False, {"storePath": "{A}", "assign": '{"T":{"broker-a":[3,0]},"U":{"broker-a":[1]}}'},
     {"topics": None, "assign": {"T": {"broker-a": (3, 0)}, "U": {"broker-a": (1,)}},
      "assigned_queues": [MQ("T", "broker-a", 0), MQ("T", "broker-a", 3), MQ("U", "broker-a", 1)]}),
    ("subExpression", False, base(subExpression="TagA || TagB"),
     {"subscription.tags": ("TagA", "TagB"), "subscription.sub_all": False}),
    ("subExpression-all", False, base(subExpression="*"), {"subscription.sub_all": True}),
    ("subExpression-sql92", True, base(expressionType="SQL92", subExpression="a > 5 AND TAGS = 'x'"),
     {"subscription.is_sql": True, "subscription.expression": "a > 5 AND TAGS = 'x'",
      "subscription.tags": ("x",), "subscription.tag_filter": True}),
    ("consumerGroup-streaming", True, base(consumerGroup="%RETRY%G_1|x"),
     {"consumer_group": "%RETRY%G_1|x", "starting_offsets": "group",
      "offset_store_path": "{A}" + os.sep + "rmq_source_offsets"}),
    ("consumerGroup-batch", False, base(consumerGroup="G"),
     {"consumer_group": "G", "starting_offsets": "earliest"}),
    ("startingOffsets-word", True, base(startingOffsets=" EARLIEST "), {"starting_offsets": "earliest"}),
    ("startingOffsets-latest", True, base(startingOffsets="latest"), {"starting_offsets": "latest"}),
    ("startingOffsets-group-batch", False, base(consumerGroup="G", startingOffsets="group"),
     {"starting_offsets": "group"}),
    ("startingOffsets-json-streaming", True,
     base(startingOffsets='{"T":{"broker-a":{"0":-2,"1":-1,"2":17}}}'),
     {"starting_offsets": {MQ("T", "broker-a", 0): -2, MQ("T", "broker-a", 1): -1,
                           MQ("T", "broker-a", 2): 17}}),
    ("startingOffsets-json-batch", False, base(startingOffsets='{"T":{"broker-a":{"0":-2,"1":5}}}'),
     {"starting_offsets": {MQ("T", "broker-a", 0): -2, MQ("T", "broker-a", 1): 5}}),
    ("startingTimestamp", True, base(startingTimestamp="1700000000000"),
     {"starting_timestamp": 1700000000000}),
    ("timestamps-batch", False, base(startingTimestamp="0", endingTimestamp="1700000000000"),
     {"starting_timestamp": 0, "ending_timestamp": 1700000000000}),
    ("byTimestamp-streaming", True, base(startingOffsetsByTimestamp='{"T":{"broker-a":{"0":5,"1":0}}}'),
     {"starting_timestamp": {MQ("T", "broker-a", 0): 5, MQ("T", "broker-a", 1): 0}}),
    ("byTimestamp-batch", False, base(startingOffsetsByTimestamp='{"T":{"broker-a":{"0":5}}}',
                                      endingOffsetsByTimestamp='{"T":{"broker-a":{"0":9,"1":2}}}'),
     {"starting_timestamp": {MQ("T", "broker-a", 0): 5},
      "ending_timestamp": {MQ("T", "broker-a", 0): 9, MQ("T", "broker-a", 1): 2}}),
    ("startingTimestamp-over-byTimestamp", False,
     base(startingTimestamp="7", startingOffsetsByTimestamp='{"T":{"broker-a":{"0":5}}}',
          endingOffsetsByTimestamp='{"T":{"broker-a":{"0":9}}}'),
     {"starting_timestamp": 7, "ending_timestamp": {MQ("T", "broker-a", 0): 9}}),
    ("endingOffsets-json", False,
     base(startingOffsets='{"T":{"broker-a":{"0":3}}}', endingOffsets='{"T":{"broker-a":{"0":3,"1":-1}}}'),
     {"ending_offsets": {MQ("T", "broker-a", 0): 3, MQ("T", "broker-a", 1): -1}}),
    ("endingOffsets-latest", False, base(endingOffsets="LATEST"), {"ending_offsets": "latest"}),
    ("consumeFromWhere-first", True, base(consumerGroup="G", consumeFromWhere="consume_from_first_offset"),
     {"consume_from_where": "CONSUME_FROM_FIRST_OFFSET", "consume_timestamp": None}),
    ("consumeFromWhere-timestamp-default", True,
     base(consumerGroup="G", consumeFromWhere="CONSUME_FROM_TIMESTAMP"),
     {"consume_from_where": "CONSUME_FROM_TIMESTAMP",
      "consume_timestamp": (NOW_MS - 30 * 60_000) // 1000 * 1000}),
    ("maxMessagesPerTrigger", True, base(maxMessagesPerTrigger="1000"), {"max_messages_per_trigger": 1000}),
    ("maxOffsetsPerTrigger-alias", True, base(maxOffsetsPerTrigger="7"), {"max_messages_per_trigger": 7}),
    ("minOffsetsPerTrigger-alias", True, base(minOffsetsPerTrigger="3", maxTriggerDelay="1s"),
     {"min_messages_per_trigger": 3, "max_trigger_delay_ms": 1000}),
    ("maxBytesPerTrigger", True, base(maxBytesPerTrigger="1048576"), {"max_bytes_per_trigger": 1048576}),
    ("minMessagesPerTrigger", True, base(minMessagesPerTrigger="10", maxMessagesPerTrigger="10"),
     {"min_messages_per_trigger": 10, "max_trigger_delay_ms": 900_000}),
    ("maxTriggerDelay-ms", True, base(minMessagesPerTrigger="1", maxTriggerDelay="500ms"),
     {"max_trigger_delay_ms": 500}),
    ("maxTriggerDelay-s", True, base(minMessagesPerTrigger="1", maxTriggerDelay="30s"),
     {"max_trigger_delay_ms": 30_000}),
    ("maxTriggerDelay-min", True, base(minMessagesPerTrigger="1", maxTriggerDelay="15 min"),
     {"max_trigger_delay_ms": 900_000}),
    ("maxTriggerDelay-h", True, base(minMessagesPerTrigger="1", maxTriggerDelay="1H"),
     {"max_trigger_delay_ms": 3_600_000}),
    ("maxTriggerDelay-d", True, base(minMessagesPerTrigger="1", maxTriggerDelay="2d"),
     {"max_trigger_delay_ms": 2 * 86_400_000}),
    ("allocate-circle", False, base(allocateStrategy="avg_by_circle"), {"allocate_strategy": "AVG_BY_CIRCLE"}),
    ("allocate-config", False,
     base(allocateStrategy="CONFIG", allocateQueues='{"T":{"broker-a":[2,0]}}'),
     {"allocate_strategy": "CONFIG", "allocate_queues": (MQ("T", "broker-a", 2), MQ("T", "broker-a", 0))}),
    ("allocate-machine-room", False, base(allocateStrategy="MACHINE_ROOM", consumeRooms="room1, room2"),
     {"allocate_strategy": "MACHINE_ROOM", "consume_rooms": ("room1", "room2")}),
    ("allocate-nearby", False, base(allocateStrategy="MACHINE_ROOM_NEARBY", nearbyInnerStrategy="avg"),
     {"allocate_strategy": "MACHINE_ROOM_NEARBY", "nearby_inner_strategy": "AVG",
      "virtual_node_count": None}),
    ("allocate-nearby-hash", False,
     base(allocateStrategy="MACHINE_ROOM_NEARBY", nearbyInnerStrategy="CONSISTENT_HASH",
          virtualNodeCount="4"),
     {"nearby_inner_strategy": "CONSISTENT_HASH", "virtual_node_count": 4}),
    ("allocate-hash-default", False, base(allocateStrategy="CONSISTENT_HASH"),
     {"allocate_strategy": "CONSISTENT_HASH", "virtual_node_count": 10}),
    ("allocate-hash-nodes", False, base(allocateStrategy="CONSISTENT_HASH", virtualNodeCount="3"),
     {"virtual_node_count": 3}),
    ("allocate-user-class", False, base(allocateStrategy="my_pkg.alloc:Strategy"),
     {"allocate_strategy": "my_pkg.alloc:Strategy"}),
    ("numPartitions", False, base(numPartitions="4"), {"num_partitions": 4}),
    ("unordered", False, base(orderly="False", minPartitions="8"), {"orderly": False, "min_partitions": 8}),
    ("minPartitions-orderly", False, base(minPartitions="3"), {"orderly": True, "min_partitions": 3}),
    ("maxPartitionBytes", True, base(maxPartitionBytes="1048576"), {"max_partition_bytes": 1 << 20}),
    ("failOnDataLoss", False, base(failOnDataLoss="FALSE"), {"fail_on_data_loss": False}),
    ("offsetStorePath", True, base(consumerGroup="G", offsetStorePath="{B}/offs"),
     {"offset_store_path": "{B}" + os.sep + "offs"}),
    ("locks", True, base(lockLeaseMs="9000", clientLockLeaseMs="6000", lockRenewIntervalMs="3000"),
     {"lock_lease_ms": 9000, "client_lock_lease_ms": 6000, "lock_renew_interval_ms": 3000}),
    ("clientId", True, base(clientId="room1@etl-job:1"), {"client_id": "room1@etl-job:1"}),
    ("verifyCrc", False, base(verifyCrc="true"), {"verify_crc": True}),
    ("batch-bounds", False, base(batchRows="100", batchBytes="1024"), {"batch_rows": 100, "batch_bytes": 1024}),
    ("batchBytes-C-limit", False, base(batchBytes=str((1 << 31) - 1)), {"batch_bytes": (1 << 31) - 1}),
]


def _field(opts: SourceOptions, dotted: str):
    value = opts
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


@pytest.mark.parametrize("streaming, options, expected", [c[1:] for c in VALID], ids=[c[0] for c in VALID])
def test_valid_options(dirs, streaming, options, expected):
    opts = parse_options(fill(options, dirs), streaming=streaming, now_ms=NOW_MS)
    for name, value in fill(expected, dirs).items():
        assert _field(opts, name) == value, name


# (id, streaming, options, option named in the error, substring of the error)
INVALID = [
    ("unknown", False, base(fooBar="1"), "fooBar", "valid options: accessKey, allocateQueues"),
    ("unknown-close", False, base(startingOffset="earliest"), "startingOffset",
     "did you mean startingOffsets"),
    ("twice-by-case", False, {"storePath": "{A}", "topic": "T", "TOPIC": "U"}, "topic", "given twice"),
    ("non-str-value", False, base(numPartitions=4), "numPartitions", "must be strings"),
    ("namespace-separator", False, base(namespace="a%b"), "namespace", "characters [A-Za-z0-9_-]"),
    ("trace-in-store-mode", False, base(enableMsgTrace="true"), "enableMsgTrace", "needs namesrvAddr"),
    ("trace-topic-alone", False, {"namesrvAddr": "h:1", "topic": "T", "customizedTraceTopic": "X"},
     "customizedTraceTopic", "only applies with enableMsgTrace=true"),
    ("trace-topic-name", False, {"namesrvAddr": "h:1", "topic": "T", "enableMsgTrace": "true",
                                 "customizedTraceTopic": "a b"}, "customizedTraceTopic", "topic name"),
    ("tls-option-without-tls", False, {"namesrvAddr": "h:1", "topic": "T", "tlsTrustCertPath": "/ca.pem"},
     "tlsTrustCertPath", "only applies with useTLS=true"),
    ("tls-in-store-mode", False, base(useTLS="true"), "useTLS", "only applies with namesrvAddr"),
    ("tls-skip-and-name-check", False, {"namesrvAddr": "h:1", "topic": "T", "useTLS": "true",
                                        "tlsSkipVerify": "true", "tlsVerifyHostname": "true"},
     "tlsVerifyHostname", "has no effect with tlsSkipVerify=true"),
    ("tls-cert-unreadable", False, {"namesrvAddr": "h:1", "topic": "T", "useTLS": "true",
                                    "tlsCertPath": "{A}/no-cert.pem"}, "tlsCertPath", "is not a readable file"),
    ("tls-key-without-cert", False, {"namesrvAddr": "h:1", "topic": "T", "useTLS": "true",
                                     "tlsKeyPath": "/k.pem", "tlsKeyPassword": "pw-hidden"},
     "tlsKeyPath", "only applies with tlsCertPath"),
    ("tls-password-without-cert", False, {"namesrvAddr": "h:1", "topic": "T", "useTLS": "true",
                                          "tlsKeyPassword": "pw-hidden"},
     "tlsKeyPassword", "only applies with tlsCertPath"),
    ("no-store", False, {"topic": "T"}, "storePath", "is required"),
    ("retries-in-store-mode", False, base(requestRetries="3"), "requestRetries",
     "only applies with namesrvAddr"),
    ("outage-in-store-mode", False, base(brokerOutageTimeoutMs="1000"), "brokerOutageTimeoutMs",
     "only applies with namesrvAddr"),
    ("outage-negative", False, {"namesrvAddr": "h:1", "topic": "T", "brokerOutageTimeoutMs": "-1"},
     "brokerOutageTimeoutMs", "expected an integer in"),
    ("pull-batch-in-store-mode", False, base(pullBatchSize="64"), "pullBatchSize",
     "only applies with namesrvAddr"),
    ("pull-batch-zero", False, {"namesrvAddr": "h:1", "topic": "T", "pullBatchSize": "0"},
     "pullBatchSize", "expected an integer in"),
    ("pull-batch-over-java-max", False, {"namesrvAddr": "h:1", "topic": "T", "pullBatchSize": "1025"},
     "pullBatchSize", "expected an integer in"),
    ("backoff-zero", False, {"namesrvAddr": "h:1", "topic": "T", "retryBackoffMs": "0"},
     "retryBackoffMs", "expected an integer in"),
    ("groupStatePath-in-store-mode", True, base(consumerGroup="G", groupStatePath="{B}"),
     "groupStatePath", "only applies to a streaming query with namesrvAddr"),
    ("groupStatePath-in-batch", False, {"namesrvAddr": "h:1", "topic": "T", "consumerGroup": "G",
                                        "groupStatePath": "{B}"},
     "groupStatePath", "only applies to a streaming query"),
    ("namesrv-and-storePath", False, {"namesrvAddr": "h:1", "storePath": "{A}", "topic": "T"},
     "namesrvAddr", "are exclusive"),
    ("namesrv-and-offsetStorePath", False,
     {"namesrvAddr": "h:1", "consumerGroup": "G", "offsetStorePath": "{A}", "topic": "T"},
     "offsetStorePath", "are exclusive"),
    ("namesrv-no-port", False, {"namesrvAddr": "h1:9876;h2", "topic": "T"}, "namesrvAddr",
     "'h2' is not host:port"),
    ("namesrv-empty", False, {"namesrvAddr": " ; ", "topic": "T"}, "namesrvAddr", "expected host:port"),
    ("namesrv-bad-broker-in-json", False,
     {"namesrvAddr": "h:1", "topic": "T", "startingOffsets": '{"T":{".x":{"0":1}}}'},
     "startingOffsets", "broker name '.x'"),
    ("requestTimeoutMs-without-namesrv", False, base(requestTimeoutMs="100"), "requestTimeoutMs",
     "only applies with namesrvAddr"),
    ("requestTimeoutMs-zero", False, {"namesrvAddr": "h:1", "topic": "T", "requestTimeoutMs": "0"},
     "requestTimeoutMs", "expected an integer in [1, 3600000]"),
    ("empty-storePath", False, base(storePath=""), "storePath", "root directory"),
    ("path-disagrees", False, base(path="{B}"), "storePath", "disagree"),
    ("brokers-and-storePath", False, base(brokers="b={B}"), "brokers", "exclusive"),
    ("brokers-and-brokerName", False, {"brokers": "b={B}", "brokerName": "x", "topic": "T"},
     "brokerName", "exclusive"),
    ("brokers-no-equals", False, {"brokers": "b1", "topic": "T"}, "brokers", "not name=path"),
    ("brokers-empty-path", False, {"brokers": "b1=", "topic": "T"}, "brokers", "not name=path"),
    ("brokers-dup-name", False, {"brokers": "b={A},b={B}", "topic": "T"}, "brokers", "given twice"),
    ("brokers-same-store", False, {"brokers": "b1={A},b2={A}/.", "topic": "T"}, "brokers", "same store"),
    ("brokers-bad-name", False, {"brokers": "../x={A}", "topic": "T"}, "brokers", "characters"),
    ("brokerName-bad", False, base(brokerName="a/b"), "brokerName", "'a/b'"),
    ("no-topic", False, {"storePath": "{A}"}, "topic", "exactly one of topic, topicPattern, assign"),
    ("two-topic-options", False, base(topicPattern="T.*"), "topicPattern", "got topic, topicPattern"),
    ("topic-empty-entry", False, base(topic="a,,b"), "topic", "without empty entries"),
    ("topic-bad-char", False, base(topic="a@b"), "topic", "'a@b' has characters"),
    ("topic-dup", False, base(topic="a,a"), "topic", "more than once"),
    ("topicPattern-bad", False, {"storePath": "{A}", "topicPattern": "(ab"}, "topicPattern",
     "missing ), unterminated subpattern"),
    ("topicPattern-empty", False, {"storePath": "{A}", "topicPattern": ""}, "topicPattern", "non-empty"),
    ("assign-not-json", False, {"storePath": "{A}", "assign": "{T:"}, "assign", "not valid JSON"),
    ("assign-not-object", False, {"storePath": "{A}", "assign": "[1]"}, "assign", "non-empty JSON object"),
    ("assign-unknown-broker", False, {"storePath": "{A}", "assign": '{"T":{"b9":[0]}}'}, "assign",
     "broker 'b9' is not configured"),
    ("assign-negative-qid", False, {"storePath": "{A}", "assign": '{"T":{"broker-a":[-1]}}'}, "assign",
     "queue id -1"),
    ("assign-float-qid", False, {"storePath": "{A}", "assign": '{"T":{"broker-a":[1.5]}}'}, "assign",
     "queue id 1.5"),
    ("assign-bool-qid", False, {"storePath": "{A}", "assign": '{"T":{"broker-a":[true]}}'}, "assign",
     "queue id True"),
    ("assign-empty-list", False, {"storePath": "{A}", "assign": '{"T":{"broker-a":[]}}'}, "assign",
     "non-empty list"),
    ("assign-dup-qid", False, {"storePath": "{A}", "assign": '{"T":{"broker-a":[1,1]}}'}, "assign",
     "more than once"),
    ("assign-dup-key", False, {"storePath": "{A}", "assign": '{"T":{"broker-a":[1]},"T":{"broker-a":[2]}}'},
     "assign", "given twice"),
    ("assign-bad-topic", False, {"storePath": "{A}", "assign": '{"T@x":{"broker-a":[1]}}'}, "assign",
     "not a topic name"),
    ("subExpression-no-tag", False, base(subExpression=" || "), "subExpression", "names no tag"),
    ("expressionType-bad", False, base(expressionType="sql92"), "expressionType", "TAG (the default) or SQL92"),
    ("sql92-without-subExpression", True, base(expressionType="SQL92"), "subExpression",
     "required with expressionType=SQL92"),
    ("sql92-malformed", False, base(expressionType="SQL92", subExpression="a = NULL"), "subExpression",
     "position 2"),
    ("consumerGroup-bad", False, base(consumerGroup="my group"), "consumerGroup", "'my group'"),
    ("group-without-consumerGroup", True, base(startingOffsets="group"), "startingOffsets",
     "needs option consumerGroup"),
    ("latest-batch", False, base(startingOffsets="latest"), "startingOffsets", "not allowed for batch"),
    ("startingOffsets-word", True, base(startingOffsets="newest"), "startingOffsets",
     "expected earliest, latest, group"),
    ("startingOffsets-below-2", True, base(startingOffsets='{"T":{"broker-a":{"0":-3}}}'),
     "startingOffsets", "offsets must be integers >= -2"),
    ("startingOffsets-latest-json-batch", False, base(startingOffsets='{"T":{"broker-a":{"0":-1}}}'),
     "startingOffsets", "-1 (latest)"),
    ("startingOffsets-string-offset", True, base(startingOffsets='{"T":{"broker-a":{"0":"5"}}}'),
     "startingOffsets", "not an integer"),
    ("startingOffsets-float-offset", True, base(startingOffsets='{"T":{"broker-a":{"0":5.0}}}'),
     "startingOffsets", "not an integer"),
    ("startingOffsets-bad-qid", True, base(startingOffsets='{"T":{"broker-a":{"x":5}}}'),
     "startingOffsets", "queue id 'x'"),
    ("startingOffsets-qid-twice", True, base(startingOffsets='{"T":{"broker-a":{"1":5,"01":6}}}'),
     "startingOffsets", "listed twice"),
    ("startingOffsets-other-topic", True, base(startingOffsets='{"U":{"broker-a":{"0":5}}}'),
     "startingOffsets", "'U' is not read by this query"),
    ("startingOffsets-pattern-miss", True,
     {"storePath": "{A}", "topicPattern": "T.*", "startingOffsets": '{"U":{"broker-a":{"0":5}}}'},
     "startingOffsets", "does not match topicPattern"),
    ("startingOffsets-not-assigned", True,
     {"storePath": "{A}", "assign": '{"T":{"broker-a":[0]}}', "startingOffsets": '{"T":{"broker-a":{"1":5}}}'},
     "startingOffsets", "not in assign"),
    ("startingOffsets-unknown-broker", True, base(startingOffsets='{"T":{"b9":{"0":5}}}'),
     "startingOffsets", "broker 'b9' is not configured"),
    ("startingTimestamp-negative", True, base(startingTimestamp="-1"), "startingTimestamp", "integer in [0"),
    ("startingTimestamp-float", True, base(startingTimestamp="1.5"), "startingTimestamp", "'1.5'"),
    ("startingTimestamp-underscore", True, base(startingTimestamp="1_000"), "startingTimestamp", "digits only"),
    ("endingTimestamp-streaming", True, base(endingTimestamp="5"), "endingTimestamp", "only to batch"),
    ("endingTimestamp-before-start", False, base(startingTimestamp="10", endingTimestamp="5"),
     "endingTimestamp", "end must be >= the start"),
    ("endingOffsets-streaming", True, base(endingOffsets="latest"), "endingOffsets", "only to batch"),
    ("endingOffsets-earliest", False, base(endingOffsets="earliest"), "endingOffsets",
     "earliest is not allowed"),
    ("endingOffsets-json-earliest", False, base(endingOffsets='{"T":{"broker-a":{"0":-2}}}'),
     "endingOffsets", "offsets must be integers >= -1"),
    ("endingOffsets-before-start", False,
     base(startingOffsets='{"T":{"broker-a":{"0":9}}}', endingOffsets='{"T":{"broker-a":{"0":3}}}'),
     "endingOffsets", "ends at 3 before it starts at 9"),
    ("consumeFromWhere-not-group", False, base(consumerGroup="G", consumeFromWhere="CONSUME_FROM_FIRST_OFFSET"),
     "consumeFromWhere", "only applies with startingOffsets=group"),
    ("consumeFromWhere-no-group", True, base(consumeFromWhere="CONSUME_FROM_FIRST_OFFSET"),
     "consumeFromWhere", "only applies with startingOffsets=group"),
    ("consumeFromWhere-bad", True, base(consumerGroup="G", consumeFromWhere="CONSUME_FROM_MIN_OFFSET"),
     "consumeFromWhere", "expected one of CONSUME_FROM_LAST_OFFSET, CONSUME_FROM_FIRST_OFFSET"),
    ("consumeTimestamp-wrong-where", True, base(consumerGroup="G", consumeTimestamp="20240101000000"),
     "consumeTimestamp", "only applies with consumeFromWhere=CONSUME_FROM_TIMESTAMP"),
    ("consumeTimestamp-bad-date", True,
     base(consumerGroup="G", consumeFromWhere="CONSUME_FROM_TIMESTAMP", consumeTimestamp="20241301000000"),
     "consumeTimestamp", "yyyyMMddHHmmss"),
    ("consumeTimestamp-short", True,
     base(consumerGroup="G", consumeFromWhere="CONSUME_FROM_TIMESTAMP", consumeTimestamp="2024"),
     "consumeTimestamp", "'2024'"),
    ("maxMessagesPerTrigger-batch", False, base(maxMessagesPerTrigger="5"), "maxMessagesPerTrigger",
     "only to streaming"),
    ("maxMessagesPerTrigger-zero", True, base(maxMessagesPerTrigger="0"), "maxMessagesPerTrigger",
     "integer in [1"),
    ("maxMessagesPerTrigger-float", True, base(maxMessagesPerTrigger="1.5"), "maxMessagesPerTrigger", "'1.5'"),
    ("maxOffsetsPerTrigger-sci", True, base(maxOffsetsPerTrigger="1e3"), "maxOffsetsPerTrigger", "'1e3'"),
    ("both-aliases", True, base(maxMessagesPerTrigger="5", maxOffsetsPerTrigger="5"),
     "maxOffsetsPerTrigger", "aliases"),
    ("both-min-aliases", True, base(minMessagesPerTrigger="5", minOffsetsPerTrigger="5"),
     "minOffsetsPerTrigger", "aliases"),
    ("minOffsetsPerTrigger-batch", False, base(minOffsetsPerTrigger="5"), "minOffsetsPerTrigger",
     "only to"),
    ("byTimestamp-negative", True, base(startingOffsetsByTimestamp='{"T":{"broker-a":{"0":-1}}}'),
     "startingOffsetsByTimestamp", "timestamps must be integers >= 0"),
    ("byTimestamp-string", True, base(startingOffsetsByTimestamp='{"T":{"broker-a":{"0":"5"}}}'),
     "startingOffsetsByTimestamp", "timestamp '5' of T/broker-a/0 is not an integer"),
    ("byTimestamp-other-topic", True, base(startingOffsetsByTimestamp='{"U":{"broker-a":{"0":5}}}'),
     "startingOffsetsByTimestamp", "'U' is not read by this query"),
    ("byTimestamp-not-json", True, base(startingOffsetsByTimestamp="5"), "startingOffsetsByTimestamp",
     "JSON"),
    ("endingByTimestamp-streaming", True, base(endingOffsetsByTimestamp='{"T":{"broker-a":{"0":5}}}'),
     "endingOffsetsByTimestamp", "only to batch"),
    ("endingByTimestamp-before-start", False,
     base(startingTimestamp="10", endingOffsetsByTimestamp='{"T":{"broker-a":{"0":11,"1":5}}}'),
     "endingOffsetsByTimestamp", "T/broker-a/1 ends at 5 before it starts at 10"),
    ("maxBytesPerTrigger-negative", True, base(maxBytesPerTrigger="-5"), "maxBytesPerTrigger", "'-5'"),
    ("maxBytesPerTrigger-batch", False, base(maxBytesPerTrigger="5"), "maxBytesPerTrigger", "only to streaming"),
    ("min-above-max", True, base(minMessagesPerTrigger="10", maxMessagesPerTrigger="5"),
     "minMessagesPerTrigger", "minimum must be <= the maximum"),
    ("minMessagesPerTrigger-zero", True, base(minMessagesPerTrigger="0"), "minMessagesPerTrigger", "'0'"),
    ("maxTriggerDelay-alone", True, base(maxTriggerDelay="1m"), "maxTriggerDelay",
     "only applies with minMessagesPerTrigger"),
    ("maxTriggerDelay-no-unit", True, base(minMessagesPerTrigger="1", maxTriggerDelay="15"),
     "maxTriggerDelay", "with unit ms, s, m, h"),
    ("maxTriggerDelay-zero", True, base(minMessagesPerTrigger="1", maxTriggerDelay="0s"),
     "maxTriggerDelay", "positive duration"),
    ("maxTriggerDelay-weeks", True, base(minMessagesPerTrigger="1", maxTriggerDelay="1w"),
     "maxTriggerDelay", "'1w'"),
    ("maxTriggerDelay-batch", False, base(maxTriggerDelay="1m"), "maxTriggerDelay", "only to streaming"),
    ("allocateStrategy-unknown", False, base(allocateStrategy="RANDOM"), "allocateStrategy",
     "expected one of AVG, AVG_BY_CIRCLE, CONFIG"),
    ("allocateStrategy-no-class", False, base(allocateStrategy="my.module"), "allocateStrategy",
     "package.module:Class"),
    ("allocateQueues-for-avg", False, base(allocateQueues='{"T":{"broker-a":[0]}}'), "allocateQueues",
     "does not apply to allocateStrategy AVG"),
    ("config-needs-queues", False, base(allocateStrategy="CONFIG"), "allocateQueues", "requires option"),
    ("allocateQueues-bad", False, base(allocateStrategy="CONFIG", allocateQueues='{"T":{"broker-a":[-2]}}'),
     "allocateQueues", "queue id -2"),
    ("allocateQueues-unread-topic", False,
     base(allocateStrategy="CONFIG", allocateQueues='{"U":{"broker-a":[0]}}'),
     "allocateQueues", "'U' is not read by this query"),
    ("machine-room-needs-rooms", False, base(allocateStrategy="MACHINE_ROOM"), "consumeRooms",
     "requires option"),
    ("consumeRooms-empty-entry", False, base(allocateStrategy="MACHINE_ROOM", consumeRooms="r1,,r2"),
     "consumeRooms", "without empty entries"),
    ("consumeRooms-for-avg", False, base(consumeRooms="r1"), "consumeRooms", "does not apply"),
    ("nearby-needs-inner", False, base(allocateStrategy="MACHINE_ROOM_NEARBY"), "nearbyInnerStrategy",
     "requires option"),
    ("nearby-bad-inner", False, base(allocateStrategy="MACHINE_ROOM_NEARBY", nearbyInnerStrategy="CONFIG"),
     "nearbyInnerStrategy", "expected one of AVG, AVG_BY_CIRCLE, CONSISTENT_HASH"),
    ("nearbyInnerStrategy-for-hash", False, base(allocateStrategy="CONSISTENT_HASH", nearbyInnerStrategy="AVG"),
     "nearbyInnerStrategy", "does not apply to allocateStrategy CONSISTENT_HASH"),
    ("virtualNodeCount-nearby-avg", False,
     base(allocateStrategy="MACHINE_ROOM_NEARBY", nearbyInnerStrategy="AVG", virtualNodeCount="3"),
     "virtualNodeCount", "does not apply"),
    ("virtualNodeCount-zero", False, base(allocateStrategy="CONSISTENT_HASH", virtualNodeCount="0"),
     "virtualNodeCount", "integer in [1"),
    ("virtualNodeCount-user-class", False, base(allocateStrategy="a.b:C", virtualNodeCount="3"),
     "virtualNodeCount", "no parameter options"),
    ("numPartitions-zero", False, base(numPartitions="0"), "numPartitions", "integer in [1"),
    ("numPartitions-text", False, base(numPartitions="four"), "numPartitions", "'four'"),
    ("orderly-yes", False, base(orderly="yes"), "orderly", "expected true or false"),
    ("maxPartitionBytes-with-numPartitions", False, base(numPartitions="2", maxPartitionBytes="100"),
     "maxPartitionBytes", "only without numPartitions"),
    ("maxPartitionBytes-zero", False, base(maxPartitionBytes="0"), "maxPartitionBytes", "integer in [1"),
    ("minPartitions-zero", False, base(orderly="false", minPartitions="0"), "minPartitions", "integer in [1"),
    ("failOnDataLoss-1", False, base(failOnDataLoss="1"), "failOnDataLoss", "expected true or false"),
    ("offsetStorePath-no-group", True, base(offsetStorePath="{B}"), "offsetStorePath",
     "only applies with consumerGroup"),
    ("offsetStorePath-in-config", True, base(consumerGroup="G", offsetStorePath="{A}/config"),
     "offsetStorePath", "config folder"),
    ("offsetStorePath-broker-named-config", True,
     base(consumerGroup="G", brokerName="config", offsetStorePath="{A}"), "offsetStorePath", "config folder"),
    ("offsetStorePath-empty", True, base(consumerGroup="G", offsetStorePath=""), "offsetStorePath",
     "directory path"),
    ("lockLeaseMs-text", True, base(lockLeaseMs="60s"), "lockLeaseMs", "'60s'"),
    ("lock-unordered", True, base(orderly="false", lockLeaseMs="60000"), "lockLeaseMs",
     "only applies with orderly=true"),
    ("clientLockLeaseMs-too-long", True, base(clientLockLeaseMs="70000"), "clientLockLeaseMs",
     "lockRenewIntervalMs < clientLockLeaseMs < lockLeaseMs"),
    ("lockRenewIntervalMs-too-long", True, base(lockRenewIntervalMs="30000"), "lockRenewIntervalMs",
     "lockRenewIntervalMs=30000"),
    ("clientId-space", True, base(clientId="my client"), "clientId", "'my client'"),
    ("clientId-empty", True, base(clientId=""), "clientId", "[A-Za-z0-9_.:@#%|-]"),
    ("verifyCrc-bad", False, base(verifyCrc="on"), "verifyCrc", "expected true or false"),
    ("batchRows-zero", False, base(batchRows="0"), "batchRows", "integer in [1"),
    ("batchBytes-units", False, base(batchBytes="64MiB"), "batchBytes", "'64MiB'"),
    # numeric limits are the real ones, checked once on the driver (not in every task)
    ("batchBytes-above-C-limit", False, base(batchBytes="3000000000"), "batchBytes",
     "integer in [1, 2147483647]"),
    ("batchBytes-just-above-C-limit", True, base(batchBytes=str(1 << 31)), "batchBytes",
     "integer in [1, 2147483647]"),
    ("startingOffsets-above-max-queue-offset", False,
     base(startingOffsets='{"T":{"broker-a":{"0":%d}}}' % (2 ** 70)), "startingOffsets",
     "above the largest queue offset 461168601842738790"),
    ("endingOffsets-above-max-queue-offset", False,
     base(endingOffsets='{"T":{"broker-a":{"0":%d}}}' % (((1 << 63) - 1) // 20 + 1)), "endingOffsets",
     "above the largest queue offset 461168601842738790"),
    ("maxTriggerDelay-overflow", True,
     base(minMessagesPerTrigger="1", maxTriggerDelay="%dd" % (2 ** 63)), "maxTriggerDelay",
     "at most 9223372036854775807 ms"),
]


@pytest.mark.parametrize("streaming, options, option, message", [c[1:] for c in INVALID],
                         ids=[c[0] for c in INVALID])
def test_invalid_options(dirs, streaming, options, option, message):
    with pytest.raises(RmqOptionError) as info:
        parse_options(fill(options, dirs), streaming=streaming, now_ms=NOW_MS)
    text = str(info.value)
    assert option in text
    assert fill(message, dirs) in text


def test_every_documented_option_is_exercised():
    used = set()
    for case in VALID + INVALID:
        used.update(k for k in case[2])
    documented = set(OPTION_DOCS)
    assert documented - {k for k in used if k in documented} == set()


def test_missing_store_root_is_a_layout_error(tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(RmqStoreLayoutError, match="option storePath: store root .*nope"):
        parse_options({"storePath": missing, "topic": "T"}, streaming=False)
    with pytest.raises(RmqStoreLayoutError, match="option brokers: .*broker 'b2'"):
        parse_options({"brokers": f"b1={tmp_path},b2={missing}", "topic": "T"}, streaming=False)


def test_unknown_option_lists_every_valid_option(dirs):
    with pytest.raises(RmqOptionError) as info:
        parse_options(fill(base(nope="x"), dirs), streaming=True)
    for name in OPTION_DOCS:
        assert name in str(info.value)


def test_spark_case_insensitive_dict(dirs):
    datasource = require("pyspark.sql.datasource", "needs pyspark")
    raw = datasource.CaseInsensitiveDict({"storePath": dirs["A"], "TOPIC": "T", "maxOffsetsPerTrigger": "9"})
    opts = parse_options(raw, streaming=True)
    assert opts.topics == ("T",) and opts.max_messages_per_trigger == 9


def test_relative_paths_become_absolute(dirs, monkeypatch):
    monkeypatch.chdir(os.path.dirname(dirs["A"]))
    opts = parse_options({"storePath": "A", "topic": "T", "consumerGroup": "G",
                          "offsetStorePath": "offs"}, streaming=True)
    assert opts.brokers == {"broker-a": dirs["A"]}
    assert opts.offset_store_path == os.path.join(os.path.dirname(dirs["A"]), "offs")


def test_options_pickle_round_trip(dirs):
    opts = parse_options(fill(base(topic="T", consumerGroup="G", subExpression="TagA||TagB",
                                   startingOffsets='{"T":{"broker-a":{"0":4}}}'), dirs), streaming=True)
    copy = pickle.loads(pickle.dumps(opts))
    assert copy == opts
    pattern = parse_options({"storePath": dirs["A"], "topicPattern": "T.*"}, streaming=True)
    assert pickle.loads(pickle.dumps(pattern)).topic_pattern.fullmatch("T1")


def test_options_are_frozen(dirs):
    opts = parse_options(fill(base(), dirs), streaming=False)
    with pytest.raises(AttributeError):
        opts.batch_rows = 1


def test_default_client_id_is_generated_per_parse(dirs):
    a = parse_options(fill(base(), dirs), streaming=True).client_id
    b = parse_options(fill(base(), dirs), streaming=True).client_id
    assert a != b
    assert re.fullmatch(r"rmq_source-[A-Za-z0-9_.-]+-\d+-[0-9a-f]{8}", a)
    assert "@" not in a  # text before '@' would be read as a machine room


def test_default_consume_timestamp_uses_current_clock(dirs):
    before = int(time.time() * 1000)
    opts = parse_options(fill(base(consumerGroup="G", consumeFromWhere="CONSUME_FROM_TIMESTAMP"), dirs),
                         streaming=True)
    after = int(time.time() * 1000)
    assert (before - 1_800_000) // 1000 * 1000 <= opts.consume_timestamp <= after - 1_800_000
    assert opts.consume_timestamp % 1000 == 0


@pytest.fixture
def timezone(monkeypatch):
    def use(name):
        monkeypatch.setenv("TZ", name)
        time.tzset()
    yield use
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize("tz, expected_ms", [
    ("UTC", 1704067199000),               # 2023-12-31 23:59:59 UTC
    ("Asia/Shanghai", 1704067199000 - 8 * 3600_000),
    ("America/New_York", 1704067199000 + 5 * 3600_000),
])
def test_consume_timestamp_is_local_time(dirs, timezone, tz, expected_ms):
    timezone(tz)
    opts = parse_options(fill(base(consumerGroup="G", consumeFromWhere="CONSUME_FROM_TIMESTAMP",
                                   consumeTimestamp="20231231235959"), dirs), streaming=True)
    assert opts.consume_timestamp == expected_ms


@pytest.mark.parametrize("options, name, check", [
    (base(allocateStrategy="avg"), "AVG", None),
    (base(allocateStrategy="CONFIG", allocateQueues='{"T":{"broker-a":[1]}}'), "CONFIG",
     lambda s: s.allocate("G", "c1", [MQ("T", "broker-a", 0)], ["c1"]) == [MQ("T", "broker-a", 1)]),
    (base(allocateStrategy="MACHINE_ROOM", consumeRooms="r1"), "MACHINE_ROOM",
     lambda s: s.consume_rooms == {"r1"}),
    (base(allocateStrategy="MACHINE_ROOM_NEARBY", nearbyInnerStrategy="CONSISTENT_HASH", virtualNodeCount="3"),
     "MACHINE_ROOM_NEARBY-CONSISTENT_HASH", lambda s: s.inner.virtual_node_count == 3),
    (base(allocateStrategy="CONSISTENT_HASH"), "CONSISTENT_HASH", lambda s: s.virtual_node_count == 10),
    (base(allocateStrategy="CONSISTENT_HASH", virtualNodeCount="7"), "CONSISTENT_HASH",
     lambda s: s.virtual_node_count == 7),
    (base(allocateStrategy="AVG_BY_CIRCLE"), "AVG_BY_CIRCLE", None),
    (base(allocateStrategy="MACHINE_ROOM_NEARBY", nearbyInnerStrategy="AVG"), "MACHINE_ROOM_NEARBY-AVG",
     lambda s: s.inner.name == "AVG"),
])
def test_strategy_of(dirs, options, name, check):
    """query.strategy_of, the one place the batch and stream readers build their strategy."""
    strategy = strategy_of(parse_options(fill(options, dirs), streaming=False))
    assert strategy.name == name
    assert check is None or check(strategy)


def test_user_strategy_class_is_loaded_when_built(dirs):
    opts = parse_options(fill(base(allocateStrategy="no_such_module_xyz:Strategy"), dirs), streaming=False)
    with pytest.raises(RmqOptionError, match="no_such_module_xyz"):
        strategy_of(opts)


def test_options_markdown_lists_every_option():
    table = options_markdown()
    for name, (default, _) in OPTION_DOCS.items():
        assert f"| `{name}` | {default} |" in table


# ACL credentials (the brokers' side is tests/test_acl_live.py)
CREDENTIAL_CASES = [
    ("access-key-alone", {"accessKey": "a"}, "needs secretKey"),
    ("secret-key-alone", {"secretKey": "s3cr3t-value"}, "needs accessKey"),
    ("blank-secret", {"accessKey": "a", "secretKey": " s3cr3t-value"}, "without leading or trailing"),
    ("misspelled-secret", {"accessKey": "a", "secretKy": "s3cr3t-value"}, "unknown option 'secretKy'"),
    ("secret-twice", {"accessKey": "a", "secretKey": "s3cr3t-value", "SECRETKEY": "s3cr3t-value"},
     "given twice"),
]


@pytest.mark.parametrize("extra, text", [c[1:] for c in CREDENTIAL_CASES], ids=[c[0] for c in CREDENTIAL_CASES])
def test_credential_options_are_checked_without_showing_the_secret(extra, text):
    with raises_rmq(RmqOptionError, text) as info:
        parse_options({"namesrvAddr": "127.0.0.1:9876", "topic": "T", **extra}, streaming=True)
    assert "s3cr3t-value" not in str(info.value)


def test_live_group_state_defaults_to_a_folder_per_cluster(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    opts = parse_options({"namesrvAddr": "ns1:9876;[::1]:9876", "topic": "T", "consumerGroup": "G"},
                         streaming=True)
    assert opts.group_state_path == str(tmp_path / "rmq_source" / "groups" / "ns1_9876____1__9876")


def test_the_secret_key_is_not_in_the_repr_of_options():
    opts = parse_options({"namesrvAddr": "h:1", "topic": "T", "accessKey": "ak",
                          "secretKey": "s3cr3t-value"}, streaming=True)
    assert opts.credentials.secret_key == "s3cr3t-value"
    assert "s3cr3t-value" not in repr(opts) and "'ak'" in repr(opts)


def test_credentials_need_a_live_cluster(tmp_path):
    with raises_rmq(RmqOptionError, "only applies with namesrvAddr"):
        parse_options({"storePath": str(tmp_path), "topic": "T", "accessKey": "a",
                       "secretKey": "s3cr3t-value"}, streaming=False)
