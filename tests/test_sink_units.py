"""The sink's parts that need no broker: options, columns, queue choice, UNIQ_KEY, batch encoding."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, strategies as st
from pyspark.sql import types as T

from conftest import raises_rmq
from rmq_source.errors import RmqOptionError, RmqSinkRowError, RmqSinkSchemaError
from rmq_source.remote import requests as rq
from rmq_source.sink.columns import check_schema, messages
from rmq_source.sink.options import parse_sink_options
from rmq_source.sink.routing import PublishQueue, hash_index, java_string_hash, publish_queues
from rmq_source.sink.uniq import TaskKeys
from rmq_source.store import record_codec as rc

NS = {"namesrvAddr": "127.0.0.1:9876"}


# Values printed by java.lang.String.hashCode() on JDK 17 (the last one is Integer.MIN_VALUE)
@pytest.mark.parametrize("text, expected", [
    ("", 0), ("a", 97), ("hello", 99162322), ("Aa", 2112), ("BB", 2112),
    ("\u00e9t\u00e9", 227742), ("\U0001F600", 1772899), ("polygenelubricants", -2147483648),
])
def test_java_string_hash(text, expected):
    assert java_string_hash(text) == expected


@given(st.text(max_size=40), st.integers(min_value=1, max_value=300))
def test_hash_index_is_javas_remainder_then_abs(key, size):
    h = java_string_hash(key)
    java_rem = int(h - size * int(h / size))        # truncating division, as Java's %
    assert hash_index(key, size) == abs(java_rem)
    assert 0 <= hash_index(key, size) < size


def _route(queue_datas, broker_datas, order=None):
    return rq.TopicRoute(queue_datas, broker_datas, order)


def test_publish_list_sorted_writable_with_master():
    route = _route(
        [{"brokerName": "b", "writeQueueNums": 2, "perm": 6}, {"brokerName": "a", "writeQueueNums": 3, "perm": 6},
         {"brokerName": "c", "writeQueueNums": 2, "perm": 4},          # read-only
         {"brokerName": "d", "writeQueueNums": 2, "perm": 6}],         # no master
        [{"brokerName": n, "brokerAddrs": {"0": f"{n}:1"}} for n in "abc"]
        + [{"brokerName": "d", "brokerAddrs": {"1": "d:2"}}])
    assert publish_queues("T", route) == [PublishQueue("a", 0), PublishQueue("a", 1), PublishQueue("a", 2),
                                          PublishQueue("b", 0), PublishQueue("b", 1)]
    ordered = _route([], [], "b:1;a:2")
    assert publish_queues("T", ordered) == [PublishQueue("b", 0), PublishQueue("a", 0), PublishQueue("a", 1)]


@pytest.mark.parametrize("options, streaming, match", [
    ({}, False, "namesrvAddr is required"),
    ({**NS, "topic": "bad topic"}, False, "not a topic name"),
    ({**NS, "batchMessages": "0"}, False, "batchMessages"),
    ({**NS, "batchBytes": str(5 << 20)}, False, "batchBytes"),
    ({**NS, "maxMessageBytes": "1000", "batchBytes": "2000"}, False, "batchBytes"),
    ({**NS, "requireStoreOk": "yes"}, False, "requireStoreOk"),
    ({**NS, "writeId": "w"}, True, "writeId only applies to batch"),
    ({**NS, "writeId": "has space"}, False, "writeId"),
    ({**NS, "accessKey": "ak"}, False, "needs secretKey"),
    ({**NS, "startingOffsets": "earliest"}, False, "unknown rmq sink option"),
    ({**NS, "topc": "x"}, False, "did you mean topic"),
    ({**NS, "clientId": "x"}, False, "unknown rmq sink option"),
    ({**NS, "customizedTraceTopic": "X"}, False, "only applies with enableMsgTrace=true"),
    ({**NS, "enableMsgTrace": "on"}, False, "enableMsgTrace"),
])
def test_bad_options(options, streaming, match):
    with raises_rmq(RmqOptionError, match):
        parse_sink_options(options, streaming=streaming)


def test_options_defaults_and_write_id():
    a, b = parse_sink_options(NS, streaming=False), parse_sink_options(NS, streaming=False)
    assert a.write_id != b.write_id and a.batch_messages == 128 and a.require_store_ok
    assert parse_sink_options({**NS, "WRITEID": "job-7"}, streaming=False).write_id == "job-7"
    assert parse_sink_options(NS, streaming=True).write_id is None
    assert a.trace_topic is None
    assert parse_sink_options({**NS, "enableMsgTrace": "true"}, streaming=True).trace_topic == "RMQ_SYS_TRACE_TOPIC"


def _schema(**cols):
    return T.StructType([T.StructField(k, v) for k, v in cols.items()])


S, B, I = T.StringType(), T.BinaryType(), T.IntegerType()


@pytest.mark.parametrize("cols, topic, match", [
    ({"value": B}, "T", "column 'value'"),
    ({"body": B, "Tags": S}, "T", "did you mean tags"),
    ({"tags": S}, "T", "no column 'body'"),
    ({"body": I}, "T", "column 'body' has type int"),
    ({"body": B, "keys": T.ArrayType(I)}, "T", "column 'keys' has type array<int>"),
    ({"body": B, "properties": T.MapType(S, I)}, "T", "column 'properties'"),
    ({"body": B, "queueId": S}, "T", "column 'queueId' has type string"),
    ({"body": B}, None, "no topic"),
    ({"body": B, "brokerName": S}, "T", "brokerName' only applies with a column 'queueId'"),
])
def test_bad_schemas(cols, topic, match):
    with raises_rmq(RmqSinkSchemaError, match):
        check_schema(_schema(**cols), default_topic=topic)


def test_good_schema():
    cols = dict(body=S, topic=S, tags=S, keys=T.ArrayType(S), properties=T.MapType(S, S), queueId=T.LongType(),
                brokerName=S, delayTimeLevel=T.ShortType())
    assert check_schema(_schema(**cols), default_topic=None) == tuple(cols)


def _batch(**cols):
    import pyarrow as pa
    return pa.RecordBatch.from_pydict(cols)


def _messages(batch, topic="T", max_bytes=1 << 20):
    return list(messages(batch, first_row=10, partition=3, keys=TaskKeys("w", 0, 3), default_topic=topic,
                         max_message_bytes=max_bytes))


@pytest.mark.parametrize("cols, match", [
    ({"body": [b"x", None]}, "partition 3, row 11: body is null"),
    ({"body": [b"x", b""]}, "partition 3, row 11: body is empty"),
    ({"body": [b"x" * 11]}, "exceeds maxMessageBytes"),
    ({"body": [b"x"], "properties": [[("TAGS", "a")]]}, "reserved"),
    ({"body": [b"x"], "properties": [[("k", " ")]]}, "non-blank"),
    ({"body": [b"x"], "properties": [[("k", "a\x01b")]]}, "separate properties"),
    ({"body": [b"x"], "properties": [[("k", "v" * 40000)]]}, "at most 32767"),
    ({"body": [b"x"], "keys": [["a b"]]}, "without spaces"),
    ({"body": [b"x"], "queueId": [1], "shardingKey": ["s"]}, "both queueId and shardingKey"),
    ({"body": [b"x"], "queueId": [-1]}, "negative"),
    ({"body": [b"x"], "delayTimeLevel": [-2]}, "delayTimeLevel -2"),
    ({"body": [b"x"], "topic": ["bad topic"]}, "not a topic name"),
])
def test_bad_rows(cols, match):
    with raises_rmq(RmqSinkRowError, match):
        _messages(_batch(**cols), max_bytes=10)


def test_rows_become_messages_and_decode_as_rocketmq_records():
    import pyarrow as pa
    batch = pa.RecordBatch.from_pydict({
        "body": ["héllo", "b"], "topic": [None, "U"], "tags": ["t", None],
        "keys": [["k1", "k2"], None], "properties": [[("a", "1")], None], "shardingKey": ["s", None],
        "delayTimeLevel": [None, 3]})
    out = _messages(batch)
    assert [(m.row, m.topic, m.body, m.pin, m.delayed) for m in out] == [
        (10, "T", "héllo".encode(), ("hash", "s"), False), (11, "U", b"b", None, True)]
    body = rq.encode_batch_encoded((m.body, m.props, 0) for m in out)
    # the broker splits a batch body the way it splits records it stores: decode it back
    pos, seen = 0, []
    while pos < len(body):
        total = int.from_bytes(body[pos:pos + 4], "big")
        blen = int.from_bytes(body[pos + 16:pos + 20], "big")
        plen = int.from_bytes(body[pos + 20 + blen:pos + 22 + blen], "big")
        props = rc.decode_properties(body[pos + 22 + blen:pos + 22 + blen + plen])
        seen.append((body[pos + 20:pos + 20 + blen], props))
        assert total == 22 + blen + plen
        pos += total
    assert seen[0][1] == {"a": "1", "TAGS": "t", "KEYS": "k1 k2", "UNIQ_KEY": TaskKeys("w", 0, 3).key(10),
                          "WAIT": "true"}
    assert seen[1][1]["DELAY"] == "3" and "TAGS" not in seen[1][1]


def test_uniq_keys_are_deterministic_and_distinct():
    a, b = TaskKeys("q", 5, 1), TaskKeys("q", 5, 1)
    keys = [a.key(r) for r in range(2000)]
    assert keys == [b.key(r) for r in range(2000)]
    assert len(set(keys)) == 2000
    others = {TaskKeys("q", 6, 1).key(0), TaskKeys("q", 5, 2).key(0), TaskKeys("r", 5, 1).key(0)}
    assert len(others | {keys[0]}) == 4
    for k in keys[:50]:
        assert len(k) == 32 and k == k.upper() and k[20:28] == "00000000"
        int(k, 16)


@pytest.mark.parametrize("large", [False, True], ids=["default", "useLargeVarTypes"])
@pytest.mark.parametrize("schema, c_path", [
    ("body binary", True),
    ("body string, tags string, keys array<string>", True),
    ("body binary, keys string", True),
    ("body binary, properties map<string,string>", True),
    ("body binary, shardingKey string", False),
])
def test_spark_hands_the_c_encoder_the_arrow_types_it_takes(spark, schema, c_path, large):
    """The sink's tasks run inside mapInArrow (pyspark's write_into_data_source): the Arrow batches
    a mapInArrow function sees are those the writer gets, with Spark's large-types setting either way."""
    from pyspark.sql import functions as F
    from rmq_source.sink.encoder import encodable
    fields = spark.createDataFrame([], schema).schema.fields
    df = spark.range(3).select(*[F.lit(None).cast(f.dataType).alias(f.name) for f in fields])

    def seen(batches):
        import pyarrow as pa
        for batch in batches:
            yield pa.RecordBatch.from_pydict({"ok": [encodable(batch.schema)], "types": [str(batch.schema)]})
    conf = "spark.sql.execution.arrow.useLargeVarTypes"
    before = spark.conf.get(conf, None)
    spark.conf.set(conf, str(large).lower())
    try:
        got = df.mapInArrow(seen, "ok boolean, types string").collect()
    finally:
        if before is None:
            spark.conf.unset(conf)
        else:
            spark.conf.set(conf, before)
    assert got and all(r.ok is c_path for r in got), got
    assert all(("large_" in r.types) is large for r in got), got     # the setting took


SINK_DOC = Path(__file__).resolve().parents[1] / "docs" / "sink.md"


def _batch_write(mode):
    def write(spark, tmp_path):
        w = spark.createDataFrame([("a",)], "body string").write.format("rmq")
        (w.mode(mode) if mode else w).option("namesrvAddr", NS["namesrvAddr"]).option("topic", "T").save()
    return write


def _stream_write(output_mode):
    def write(spark, tmp_path):
        rows = spark.readStream.format("rate").option("rowsPerSecond", 1).load()
        if output_mode == "complete":
            rows = rows.groupBy("value").count()
        q = (rows.selectExpr("cast(value as string) AS body").writeStream.format("rmq")
             .outputMode(output_mode).option("namesrvAddr", NS["namesrvAddr"]).option("topic", "T")
             .option("checkpointLocation", str(tmp_path / "chk")).start())
        try:
            q.awaitTermination(300)
            raise q.exception() or AssertionError("the stream did not fail within 300 s")
        finally:
            q.stop()
    return write


@pytest.mark.parametrize("write, documented", [
    (_batch_write(None), '[UNSUPPORTED_DATA_SOURCE_SAVE_MODE] The data source "rmq" cannot be written '
                         'in the "ErrorIfExists" mode.'),
    (_batch_write("error"), '[UNSUPPORTED_DATA_SOURCE_SAVE_MODE] The data source "rmq" cannot be written '
                            'in the "ErrorIfExists" mode.'),
    (_batch_write("ignore"), '[UNSUPPORTED_DATA_SOURCE_SAVE_MODE] The data source "rmq" cannot be written '
                             'in the "Ignore" mode.'),
    (_batch_write("overwrite"), "RmqOptionError: the rmq sink only appends: a RocketMQ topic cannot be "
                                "overwritten (use mode('append'))"),
    (_stream_write("complete"), "RmqOptionError: the rmq sink only appends"),
    (_stream_write("update"), "rmq does not support Update mode"),
], ids=["default", "error", "ignore", "overwrite", "stream-complete", "stream-update"])
def test_save_modes_fail_with_the_text_docs_sink_md_shows(spark, tmp_path, write, documented):
    """Only append writes (docs/sink.md "Save modes"): every other mode fails before a row is sent,
    with the error docs/sink.md quotes (the session fixture registered the source)."""
    assert f"`{documented}" in SINK_DOC.read_text(encoding="utf-8")
    with pytest.raises(Exception) as err:
        write(spark, tmp_path)
    assert documented in str(err.value)
