"""Filter pushdown of batch reads: the same rows with spark.sql.python.filterPushdown.enabled on and
off, for filters the source takes, filters it leaves to Spark, and combinations; and proof that
the taken ones narrow the plan."""
from __future__ import annotations

import pytest

from store_builder import build_store

pytestmark = pytest.mark.spark

KEY = ["topic", "brokerName", "queueId", "queueOffset"]
CONF = "spark.sql.python.filterPushdown.enabled"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("pushdown")
    # a system topic too: its tag codes are not trusted, the rows' tags are checked instead
    build_store(root, broker="broker-a",
                topics=(("TopicTest", 4, 240), ("OrderTopic", 3, 90), ("rmq_sys_test", 1, 40)))
    return str(root)


@pytest.fixture
def pushdown(spark):
    old = spark.conf.get(CONF, "false")

    def set_(on: bool):
        spark.conf.set(CONF, "true" if on else "false")
    yield set_
    spark.conf.set(CONF, old)


def _rows(spark, store, where, **options):
    reader = spark.read.format("rmq").option("storePath", store)
    for k, v in {"topicPattern": ".*", **options}.items():
        reader = reader.option(k, v)
    df = reader.load()
    if where:
        df = df.where(where)
    return sorted(tuple(r) for r in df.select(*KEY).collect()), df


FILTERS = [
    "tags = 'TagA'", "tags IN ('TagA', 'BB')", "tags = 'TagA' AND tags = 'BB'", "tags = 'nope'",
    "tags = 'TagA' AND tags IN ('TagA', 'TagB')", "tags IN ('TagA', NULL)",
    "topic = 'TopicTest' AND queueId = 2", "queueId IN (0, 3)", "brokerName = 'broker-a'",
    "brokerName = 'broker-b'", "topic IN ('OrderTopic', 'Nope')",
    "queueOffset >= 10 AND queueOffset < 20", "queueOffset = 5", "queueOffset > 1000",
    "queueOffset < -1", "queueOffset <= 3 AND queueOffset > 1", "queueOffset BETWEEN 3 AND 7",
    "tags = 'TagA' AND queueOffset BETWEEN 3 AND 7 AND queueId = 1",
    # narrowed by the timestamp search, compared by Spark too (messages every 10 ms from
    # 2023-11-14 22:13:20 UTC)
    "storeTimestamp >= timestamp'2023-11-14 22:13:20.505'",
    "storeTimestamp > timestamp'2023-11-14 22:13:20.500' AND storeTimestamp < timestamp'2023-11-14 22:13:21.2005'",
    "storeTimestamp = timestamp'2023-11-14 22:13:20.600'", "storeTimestamp <= timestamp'2023-11-14 22:13:20.3'",
    "storeTimestamp < timestamp'1960-01-01 00:00:00'", "storeTimestamp > timestamp'1960-01-01 00:00:00'",
    "storeTimestamp BETWEEN timestamp'2023-11-14 22:13:20.1' AND timestamp'2023-11-14 22:13:20.2' AND tags = 'TagA'",
    # left to Spark, alone or beside taken ones
    "tags IS NULL", "tags <> 'TagA'", "tags = 'TagA' OR queueId = 1", "length(body) > 100",
    "properties['seq'] = '5'", "queueId = 1 AND tags LIKE 'Tag%'", "tags = ' TagA'",
    "storeTimestamp >= timestamp'2023-11-14 22:13:21'", "queueOffset + 1 = 5", "NOT (queueId = 1)",
    "tags = 'TagA' AND length(body) > 50",
]


@pytest.mark.parametrize("where", FILTERS)
def test_same_rows_with_pushdown_on_and_off(spark, store, pushdown, where):
    pushdown(False)
    off, _ = _rows(spark, store, where)
    pushdown(True)
    on, _ = _rows(spark, store, where)
    assert on == off


def test_taken_filters_narrow_the_plan(spark, store, pushdown):
    # minPartitions=8: a task per queue with data (the packing would otherwise join them)
    pushdown(True)
    _, df = _rows(spark, store, "topic = 'TopicTest' AND queueId = 2", minPartitions="8")
    assert df.rdd.getNumPartitions() == 1
    _, df = _rows(spark, store, "tags = 'nope'")
    assert df.count() == 0
    pushdown(False)
    _, df = _rows(spark, store, "topic = 'TopicTest' AND queueId = 2", minPartitions="8")
    assert df.rdd.getNumPartitions() == 8      # one task per queue of the three topics


OFFSETS = '{"TopicTest":{"broker-a":{"0":3,"1":0,"2":5,"3":1}}}'
ENDS = '{"TopicTest":{"broker-a":{"0":50,"1":40,"2":-1,"3":60}}}'


@pytest.mark.parametrize("where", ["queueId = 0", "queueId IN (1, 3) AND tags = 'TagA'",
                                   "topic = 'TopicTest' AND queueOffset < 10", "tags = 'BB'"])
def test_offsets_json_names_every_queue_whatever_is_pushed(spark, store, pushdown, where):
    rows = {}
    for on in (False, True):
        pushdown(on)
        rows[on], _ = _rows(spark, store, where, topicPattern="TopicTest", startingOffsets=OFFSETS,
                            endingOffsets=ENDS)
    assert rows[True] == rows[False] and rows[True]


def test_system_topic_tags_are_checked_on_the_rows(spark, store, pushdown):
    for where in ("tags = 'TagA'", "tags IN ('TagA', 'BB') AND topic = 'rmq_sys_test'"):
        pushdown(False)
        off, _ = _rows(spark, store, where)
        pushdown(True)
        on, _ = _rows(spark, store, where)
        assert on == off and any(r[0] == "rmq_sys_test" for r in on)


def test_a_subscription_of_the_query_keeps_tag_filters_with_spark(spark, store, pushdown):
    pushdown(True)
    on, _ = _rows(spark, store, "tags IN ('TagA', 'BB')", subExpression="TagA || TagB")
    pushdown(False)
    off, _ = _rows(spark, store, "tags IN ('TagA', 'BB')", subExpression="TagA || TagB")
    assert on == off and on


def test_absorbed_bounds():
    import datetime as dt

    from pyspark.sql.datasource import (EqualTo, GreaterThan, GreaterThanOrEqual, In, LessThan,
                                        LessThanOrEqual, StringStartsWith)

    from rmq_source.spark.pushdown import absorb
    utc = dt.timezone.utc
    t = dt.datetime(2023, 11, 14, 22, 13, 20, 500_500, tzinfo=utc)     # 1_700_000_000_500.5 ms
    filters = [GreaterThan(("storeTimestamp",), t), LessThanOrEqual(("storeTimestamp",), t),
               GreaterThanOrEqual(("queueOffset",), 3), LessThan(("queueOffset",), 9),
               EqualTo(("queueOffset",), 5), In(("queueId",), (1, 2, None)), EqualTo(("queueId",), 2),
               EqualTo(("tags",), "A"), In(("tags",), ("A", "B")), StringStartsWith(("tags",), "A"),
               EqualTo(("queueId",), "2"), GreaterThan(("storeTimestamp",), dt.datetime(2023, 1, 1))]
    pushed, left = absorb(filters, subscription_all=True)
    assert (pushed.ts_lo_ms, pushed.ts_hi_ms) == (1_700_000_000_501, 1_700_000_000_501)
    assert (pushed.offset_lo, pushed.offset_hi) == (5, 6)
    assert pushed.queue_ids == {2} and pushed.tags == {"A"}
    assert [id(f) for f in left] == [id(f) for f in (filters[0], filters[1], filters[9], filters[10],
                                                     filters[11])]
    _, left = absorb([EqualTo(("tags",), "A")], subscription_all=False)
    assert len(left) == 1
