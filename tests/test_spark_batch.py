"""spark.read.format("rmq") against stores written by our writer (the written messages are the oracle)."""
from __future__ import annotations

import json

import pytest

from conftest import raises_rmq, require
from rmq_source.errors import RmqOptionError, RmqUnknownTopicError
from store_builder import build_store

assert_df_equality = require("chispa", "the Spark batch tests compare DataFrames with chispa").assert_df_equality

pytestmark = pytest.mark.spark

KEY_COLS = ["topic", "brokerName", "queueId", "queueOffset", "tags", "body", "msgId"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    a = tmp_path_factory.mktemp("broker-a")
    b = tmp_path_factory.mktemp("broker-b")
    written_a = build_store(a, broker="broker-a")
    written_b = build_store(b, broker="broker-b", topics=(("TopicTest", 2, 50), ("Other", 1, 10)),
                            start_ts=1_700_000_500_000)
    return {"a": (str(a), written_a), "b": (str(b), written_b)}


def _expected(spark, rows):
    data = [(w.topic, w.broker, w.queue_id, w.queue_offset, w.tags, bytearray(w.body), w.msg_id)
            for w in rows]
    schema = ("topic string, brokerName string, queueId int, queueOffset long, tags string, "
              "body binary, msgId string")
    return spark.createDataFrame(data, schema)


def _read(spark, **options):
    reader = spark.read.format("rmq")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _check(spark, df, rows):
    assert_df_equality(df.select(*KEY_COLS), _expected(spark, rows), ignore_row_order=True,
                       ignore_nullable=True)


def test_full_read_has_the_schema_and_every_message(spark, stores):
    path, written = stores["a"]
    df = _read(spark, storePath=path, topic="TopicTest,OrderTopic")
    assert df.schema.simpleString().startswith("struct<topic:string,brokerName:string,queueId:int")
    _check(spark, df, written)
    row = df.where("topic = 'TopicTest' and queueOffset = 0 and queueId = 0").first()
    assert row.properties["seq"] and row.keys[0].startswith("K") and row.storeHost == "127.0.0.1:10911"
    # a user schema selects columns (every PySpark 4.x minor runs this test: tests/test_spark_versions.py)
    narrow = (spark.read.format("rmq").schema("queueOffset long, topic string, body binary")
              .options(storePath=path, topic="TopicTest,OrderTopic").load())
    assert narrow.columns == ["queueOffset", "topic", "body"]
    assert sorted(tuple(r) for r in narrow.collect()) == sorted(
        tuple(r) for r in df.select("queueOffset", "topic", "body").collect())


CASES = {
    "assign": (dict(assign=json.dumps({"TopicTest": {"broker-a": [1, 3]}})),
               lambda w: w.topic == "TopicTest" and w.queue_id in (1, 3)),
    "topicPattern": (dict(topicPattern="Order.*"), lambda w: w.topic == "OrderTopic"),
    "subExpression": (dict(topic="TopicTest", subExpression="TagA || BB"),
                      lambda w: w.topic == "TopicTest" and w.tags in ("TagA", "BB")),
    "offsets JSON": (dict(topic="OrderTopic",
                          startingOffsets=json.dumps({"OrderTopic": {"broker-a": {"0": 5, "1": -2, "2": -2}}}),
                          endingOffsets=json.dumps({"OrderTopic": {"broker-a": {"0": 20, "1": 3, "2": -1}}})),
                     lambda w: w.topic == "OrderTopic" and ((w.queue_id == 0 and 5 <= w.queue_offset < 20)
                                                            or (w.queue_id == 1 and w.queue_offset < 3)
                                                            or w.queue_id == 2)),
    "timestamp window": (dict(topic="TopicTest", startingTimestamp=str(1_700_000_000_500),
                              endingTimestamp=str(1_700_000_001_200)),
                         lambda w: w.topic == "TopicTest" and 1_700_000_000_500 <= w.store_ts < 1_700_000_001_200),
    "SQL92 selector": (dict(topic="TopicTest", expressionType="SQL92",
                            subExpression="TAGS = 'TagA' OR (seq > 200 AND seq NOT IN ('230'))"),
                       lambda w: w.topic == "TopicTest" and (w.tags == "TagA" or (
                           _seq(w) > 200 and _seq(w) != 230))),
    "few partitions AVG_BY_CIRCLE": (dict(topic="TopicTest", numPartitions="3", allocateStrategy="AVG_BY_CIRCLE"),
                                     lambda w: w.topic == "TopicTest"),
}


def _seq(w) -> int:
    """The ``seq`` property store_builder gives each message (also in its body)."""
    return int(w.body.split(b"-")[4])


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_batch_options(spark, stores, case):
    path, written = stores["a"]
    options, keep = CASES[case]
    expected = [w for w in written if keep(w)]
    assert expected, "the case must select something"
    _check(spark, _read(spark, storePath=path, **options), expected)


def test_multi_broker(spark, stores):
    (pa_, wa), (pb, wb) = stores["a"], stores["b"]
    df = _read(spark, brokers=f"broker-a={pa_},broker-b={pb}", topic="TopicTest")
    _check(spark, df, [w for w in wa + wb if w.topic == "TopicTest"])


def test_rows_of_a_queue_come_in_offset_order(spark, stores):
    path, _ = stores["a"]
    df = _read(spark, storePath=path, topic="TopicTest", numPartitions="1")
    offsets = [(r.queueId, r.queueOffset) for r in df.select("queueId", "queueOffset").collect()]
    for qid in {q for q, _ in offsets}:
        seq = [o for q, o in offsets if q == qid]
        assert seq == sorted(seq) == list(range(len(seq)))


@pytest.mark.parametrize("options, error, message", [
    (dict(topic="TopicTest", maxMessagesPerTrigger="x"), RmqOptionError, "maxMessagesPerTrigger"),
    (dict(topic="NoSuchTopic"), RmqUnknownTopicError, "NoSuchTopic"),
    (dict(topic="TopicTest", allocateStrategy="NOPE"), RmqOptionError, "allocateStrategy"),
    (dict(topic="TopicTest", startingOffsets="{bad json"), RmqOptionError, "startingOffsets"),
    (dict(topic="TopicTest", expressionType="SQL"), RmqOptionError, "expressionType"),
    (dict(topic="TopicTest", expressionType="SQL92", subExpression="seq > 'x'"), RmqOptionError,
     "invalid SQL92 selector at position 4"),
])
def test_bad_options_fail_with_a_clear_error(spark, stores, options, error, message):
    path, _ = stores["a"]
    with raises_rmq(error, match=message) as exc:
        _read(spark, storePath=path, **options).count()
    assert error.__name__ in exc.text, exc.text[-3000:]
