"""Client namespaces (option ``namespace``): RocketMQ's wrapping rules, the options that name
topics and groups, and store-mode reads of a store whose topics carry namespaces. The same
against real brokers and the Java client: test_live_namespace.py."""
from __future__ import annotations

import json
import re

import pyarrow as pa
import pytest

from rmq_source.errors import RmqOptionError
from rmq_source.group.allocation import MessageQueue
from rmq_source.namespace import NamespacedPattern, unwrap, unwrap_topic_column, wrap
from rmq_source.sink.options import parse_sink_options
from rmq_source.spark.options import parse_options
from store_builder import build_store

# (namespace, name as the application gives it, name on the brokers): NamespaceUtil.wrapNamespace
WRAPS = [
    ("ns", "Orders", "ns%Orders"),
    ("ns", "ns%Orders", "ns%Orders"),                   # already in the namespace
    ("ns", "other%Orders", "ns%other%Orders"),          # another namespace's name is a plain name
    ("ns", "%RETRY%group", "%RETRY%ns%group"),
    ("ns", "%RETRY%ns%group", "%RETRY%ns%group"),
    ("ns", "%DLQ%group", "%DLQ%ns%group"),
    ("ns", "TBW102", "TBW102"),                         # system topics and groups stay
    ("ns", "SCHEDULE_TOPIC_XXXX", "SCHEDULE_TOPIC_XXXX"),
    ("ns", "rmq_sys_anything", "rmq_sys_anything"),
    ("ns", "CID_RMQ_SYS_group", "CID_RMQ_SYS_group"),
    ("ns", "RMQ_SYS_TRACE_TOPIC", "RMQ_SYS_TRACE_TOPIC"),
    (None, "Orders", "Orders"),
    ("", "Orders", "Orders"),
]

# (namespace, name on the brokers, what the client shows): NamespaceUtil.withoutNamespace(name, ns)
UNWRAPS = [
    ("ns", "ns%Orders", "Orders"),
    ("ns", "ns%a%b", "a%b"),                            # cut after the namespace only
    ("ns", "%RETRY%ns%group", "%RETRY%group"),
    ("ns", "%DLQ%ns%group", "%DLQ%group"),
    ("ns", "other%Orders", "other%Orders"),             # not this namespace: as stored
    ("ns", "nsx%Orders", "nsx%Orders"),
    ("ns", "Orders", "Orders"),
    ("ns", "TBW102", "TBW102"),
    (None, "ns%Orders", "ns%Orders"),
]


@pytest.mark.parametrize("namespace, given, on_brokers", WRAPS)
def test_wrap_follows_the_java_clients_rules(namespace, given, on_brokers):
    assert wrap(namespace, given) == on_brokers
    assert wrap(namespace, on_brokers) == on_brokers            # wrapping twice changes nothing


@pytest.mark.parametrize("namespace, on_brokers, shown", UNWRAPS)
def test_unwrap_shows_what_get_topic_shows(namespace, on_brokers, shown):
    assert unwrap(namespace, on_brokers) == shown


def test_unwrap_topic_column_keeps_every_other_column_and_row():
    batch = pa.record_batch({"topic": ["ns%A", "ns%A", "other%A", "%RETRY%ns%g", None],
                             "queueOffset": [0, 1, 2, 3, 4]})
    out = unwrap_topic_column(batch, "ns")
    assert out.column("topic").to_pylist() == ["A", "A", "other%A", "%RETRY%g", None]
    assert out.column("queueOffset").to_pylist() == [0, 1, 2, 3, 4]
    assert out.schema == batch.schema
    assert unwrap_topic_column(batch, None) is batch


def test_a_pattern_matches_the_namespaces_topics_by_their_shown_names():
    p = NamespacedPattern(re.compile("Ord.*"), "ns")
    assert p.fullmatch("ns%Orders") and p.pattern == "Ord.*"
    assert not p.fullmatch("Orders") and not p.fullmatch("other%Orders")
    assert not p.fullmatch("ns%Items")


STORE_OPTS = {"storePath": "/"}


def _opts(**extra):
    return parse_options({**STORE_OPTS, **extra}, streaming=False)


def test_options_name_the_topics_and_groups_on_the_brokers():
    o = _opts(topic="A,B", namespace="ns", consumerGroup="g",
              startingOffsets=json.dumps({"A": {"broker-a": {"0": 3}}}),
              endingOffsets=json.dumps({"ns%A": {"broker-a": {"0": 5}}}))
    assert o.topics == ("ns%A", "ns%B") and o.consumer_group == "ns%g" and o.namespace == "ns"
    assert o.starting_offsets == {MessageQueue("ns%A", "broker-a", 0): 3}
    assert o.ending_offsets == {MessageQueue("ns%A", "broker-a", 0): 5}
    o = _opts(assign=json.dumps({"A": {"broker-a": [1]}}), namespace="ns")
    assert o.assigned_queues == [MessageQueue("ns%A", "broker-a", 1)]
    o = _opts(topic="A", namespace="ns", allocateStrategy="CONFIG",
              allocateQueues=json.dumps({"A": {"broker-a": [0]}}))
    assert o.allocate_queues == (MessageQueue("ns%A", "broker-a", 0),)
    assert _opts(topic="A").topics == ("A",)          # no namespace: names as given


@pytest.mark.parametrize("extra, words", [
    ({"topic": "A", "namespace": "n%s"}, "option namespace: invalid value 'n%s'"),
    ({"topic": "A", "namespace": ""}, "option namespace: invalid value ''"),
    ({"topic": "A,ns%A", "namespace": "ns"}, "topics listed more than once in namespace ns: ns%A"),
    ({"assign": '{"A": {"broker-a": [0]}, "ns%A": {"broker-a": [1]}}', "namespace": "ns"},
     "topic ns%A is named twice"),
    ({"topic": "A", "namespace": "ns",
      "startingOffsets": '{"A": {"broker-a": {"0": 1}}, "ns%A": {"broker-a": {"0": 2}}}'},
     "queue ns%A/broker-a/0 is named twice"),
    ({"topic": "A", "namespace": "ns", "startingOffsets": '{"B": {"broker-a": {"0": 1}}}'},
     "topic 'ns%B' is not read by this query"),
])
def test_bad_namespace_options_name_the_option(extra, words):
    with pytest.raises(RmqOptionError, match=re.escape(words)):
        _opts(**extra)


def test_sink_options_wrap_the_topic_and_the_producer_group():
    o = parse_sink_options({"namesrvAddr": "127.0.0.1:9876", "topic": "T", "namespace": "ns",
                            "producerGroup": "pg"}, streaming=False)
    assert (o.topic, o.producer_group, o.namespace) == ("ns%T", "ns%pg", "ns")
    o = parse_sink_options({"namesrvAddr": "127.0.0.1:9876", "namespace": "ns"}, streaming=False)
    assert o.topic is None and o.producer_group == "ns%rmq_source_producer"


def test_sink_rows_are_sent_to_their_topics_in_the_namespace():
    from rmq_source.sink.columns import messages
    from rmq_source.sink.uniq import TaskKeys
    batch = pa.record_batch({"body": [b"a", b"b", b"c"], "topic": ["T", None, "ns%U"]})
    keys = TaskKeys("w", 0, 0)
    got = [m.topic for m in messages(batch, first_row=0, partition=0, keys=keys, default_topic="ns%D",
                                     max_message_bytes=1 << 20, namespace="ns")]
    assert got == ["ns%T", "ns%D", "ns%U"]


# ------------------------------------------------------------------ a store with namespaced topics
@pytest.fixture(scope="module")
def ns_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("ns-store")
    build_store(root, topics=(("ns1%Orders", 2, 40), ("ns2%Orders", 2, 30), ("Orders", 2, 20),
                              ("ns1%Items", 1, 10)))
    return str(root)


def _read(spark, store, where=None, **options):
    reader = spark.read.format("rmq").option("storePath", store)
    for k, v in options.items():
        reader = reader.option(k, v)
    df = reader.load()
    if where:
        df = df.where(where)
    return [(r.topic, r.queueId, r.queueOffset) for r in df.select("topic", "queueId", "queueOffset").collect()]


@pytest.mark.spark
@pytest.mark.parametrize("options, where, expected", [
    ({"topic": "Orders", "namespace": "ns1"}, None, {"Orders": 40}),
    ({"topic": "Orders", "namespace": "ns2"}, None, {"Orders": 30}),
    ({"topic": "Orders"}, None, {"Orders": 20}),
    ({"topic": "ns1%Orders"}, None, {"ns1%Orders": 40}),
    ({"topicPattern": ".*", "namespace": "ns1"}, None, {"Orders": 40, "Items": 10}),
    ({"topicPattern": "Ord.*", "namespace": "ns1"}, None, {"Orders": 40}),
    ({"topicPattern": ".*", "namespace": "ns1"}, "topic = 'Items'", {"Items": 10}),
    ({"assign": '{"Orders": {"broker-a": [1]}}', "namespace": "ns1"}, None, {"Orders": 20}),
    ({"topic": "Orders", "namespace": "ns1", "startingOffsets": '{"Orders": {"broker-a": {"0": 15, "1": 5}}}'},
     None, {"Orders": 20}),
])
def test_store_reads_within_a_namespace(spark, ns_store, options, where, expected):
    """Each read sees only its namespace's topics, shown without the namespace."""
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        rows = _read(spark, ns_store, where, **options)
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")
    counts = {}
    for topic, _, _ in rows:
        counts[topic] = counts.get(topic, 0) + 1
    assert counts == expected
    assert len(set(rows)) == len(rows)
