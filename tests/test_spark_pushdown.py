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
    build_store(root, broker="broker-a")
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
    pushdown(True)
    _, df = _rows(spark, store, "topic = 'TopicTest' AND queueId = 2")
    assert df.rdd.getNumPartitions() == 1
    _, df = _rows(spark, store, "tags = 'nope'")
    assert df.count() == 0
    pushdown(False)
    _, df = _rows(spark, store, "topic = 'TopicTest' AND queueId = 2")
    assert df.rdd.getNumPartitions() == 7      # one task per queue of the two topics


def test_a_subscription_of_the_query_keeps_tag_filters_with_spark(spark, store, pushdown):
    pushdown(True)
    on, _ = _rows(spark, store, "tags IN ('TagA', 'BB')", subExpression="TagA || TagB")
    pushdown(False)
    off, _ = _rows(spark, store, "tags IN ('TagA', 'BB')", subExpression="TagA || TagB")
    assert on == off and on
