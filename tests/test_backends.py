"""One table of cases, run against both backends: the store folders and the live cluster.

The messages are sent to a real broker (RocketMQ 4.9.x and 5.3.x). The store mode reads that
broker's own store folder (``storePath``), the live mode asks the broker (``namesrvAddr``): every
case must give exactly the same rows in both, every column included (CommitLog offsets, msgIds
and store hosts are the broker's in both), and those rows must be what the case selects from the
messages the broker's own pull path returns. Planning (offsets, timestamps, tags, partitions,
admission control) is the Spark side's and must not depend on the backend.
"""
from __future__ import annotations

import json
import random
import time
import uuid

import pytest
from pyspark.sql import functions as F

from rmq_source.remote import RemotingClient
from rmq_source.remote import requests as rq

pytestmark = [pytest.mark.broker, pytest.mark.spark]

QUEUES = 3
ROUNDS = 3            # sends in rounds a little apart: timestamps that split the topic
PER_ROUND = 60
GROUP = "both_group"
GROUP_OFFSETS = {0: 5, 1: 11}


class Topic:
    """A topic on the session's broker-a, its messages as the broker's pull returns them."""

    def __init__(self, rocketmq, name: str):
        self.rocketmq = rocketmq
        self.name = name
        self.broker = rocketmq.brokers["broker-a"]
        self.pulled: dict[int, list] = {}
        self.round_starts: list[int] = []

    def options(self, kind: str) -> dict:
        if kind == "store":
            return {"storePath": str(self.broker.store), "brokerName": "broker-a", "topic": self.name}
        return {"namesrvAddr": self.rocketmq.namesrv_addr, "topic": self.name}

    def all_rows(self) -> list:
        return [r for q in sorted(self.pulled) for r in self.pulled[q]]


@pytest.fixture(scope="module")
def topic(rocketmq):
    t = Topic(rocketmq, f"Both_{uuid.uuid4().hex[:8]}")
    rnd = random.Random(11)
    with RemotingClient(timeout=15) as client:
        rocketmq.create_topic(client, t.name, QUEUES)
        sent = {q: 0 for q in range(QUEUES)}
        for r in range(ROUNDS):
            t.round_starts.append(int(time.time() * 1000))
            for i in range(PER_ROUND):
                n = r * PER_ROUND + i
                q = rnd.randrange(QUEUES)
                body = bytes(rnd.getrandbits(8) for _ in range(40)) * (1 + n % 7)
                rq.send_message(client, t.broker.addr, t.name, body, queue_id=q, tags=f"t{n % 3}",
                                keys=[f"k{n}"], properties={"n": str(n)}, compress=n % 5 == 0)
                sent[q] += 1
            time.sleep(0.05)
            rq.send_batch(client, t.broker.addr, t.name,
                          [{"body": b"batch-%d-%d" % (r, j), "tags": "b", "keys": f"bk{j}"} for j in range(5)],
                          queue_id=r % QUEUES)
            sent[r % QUEUES] += 5
            time.sleep(1.1)
        for q, n in sent.items():
            assert rq.wait_max_offset(client, t.broker.addr, t.name, q, n) == n
        for q in range(QUEUES):
            out, offset = [], 0
            while offset < sent[q]:
                res = rq.pull(client, t.broker.addr, "cmp_both", t.name, q, offset, max_nums=32)
                assert res.found, (res.code, res.remark)
                out += res.records()
                offset = res.next_begin_offset
            t.pulled[q] = out
        # a consumer's heartbeat makes the group known (5.x refuses offsets of unknown groups)
        rq.heartbeat(client, t.broker.addr, rq.client_id(), consumer_groups={GROUP: [t.name]})
        for q, o in GROUP_OFFSETS.items():
            rq.update_consumer_offset(client, t.broker.addr, GROUP, t.name, q, o)
    # the broker writes config/consumerOffset.json every few seconds: wait for it
    from rmq_source.store.config_files import read_consumer_offsets
    deadline = time.monotonic() + 30
    while read_consumer_offsets(str(t.broker.store)).get((t.name, GROUP)) != GROUP_OFFSETS:
        assert time.monotonic() < deadline, "the broker never persisted the group's offsets"
        time.sleep(0.5)
    return t


def _load(spark, topic: Topic, kind: str, options: dict):
    reader = spark.read.format("rmq")
    for k, v in {**topic.options(kind), **options}.items():
        reader = reader.option(k, v)
    df = reader.load()
    rows = df.collect()
    return sorted(tuple(r) for r in rows), df.rdd.getNumPartitions()


def _key(rec):
    return rec.queue_id, rec.queue_offset


def _expect_offsets(topic: Topic, keep) -> list[tuple[int, int]]:
    return sorted(_key(r) for r in topic.all_rows() if keep(r))


FAR = 9_999_999_999_999      # epoch ms after every message


def _mid_ts(topic: Topic) -> int:
    return topic.round_starts[1]


def _after_round0(topic: Topic) -> int:
    """1 ms after the last message of the first round: the closest message is the one before
    (RocketMQ 4.9's own answer), the first at or after it is a second later."""
    return max(r.store_timestamp for r in topic.all_rows() if r.store_timestamp < _mid_ts(topic)) + 1


# (id, options(topic) -> dict, selects(topic, record) -> bool)
CASES = [
    ("everything", lambda t: {}, lambda t, r: True),
    ("tags", lambda t: {"subExpression": "t1 || b"}, lambda t, r: r.properties.get("TAGS") in ("t1", "b")),
    # group progress: on the broker (live) and in the broker's config/consumerOffset.json (store);
    # queue 2 has none: CONSUME_FROM_FIRST_OFFSET reads it all
    ("group", lambda t: {"startingOffsets": "group", "consumerGroup": GROUP,
                         "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET"},
     lambda t, r: r.queue_offset >= GROUP_OFFSETS.get(r.queue_id, 0)),
    ("json-offsets", lambda t: {"startingOffsets": json.dumps({t.name: {"broker-a": {"0": 3, "1": -2, "2": 10}}}),
                                "endingOffsets": json.dumps({t.name: {"broker-a": {"0": 10, "1": -1, "2": -1}}})},
     lambda t, r: ((r.queue_id == 0 and 3 <= r.queue_offset < 10) or r.queue_id == 1
                   or (r.queue_id == 2 and r.queue_offset >= 10))),
    ("from-timestamp", lambda t: {"startingTimestamp": str(_mid_ts(t))},
     lambda t, r: r.store_timestamp >= _mid_ts(t)),
    ("to-timestamp", lambda t: {"endingTimestamp": str(_mid_ts(t))},
     lambda t, r: r.store_timestamp < _mid_ts(t)),
    ("just-after-a-message", lambda t: {"startingTimestamp": str(_after_round0(t))},
     lambda t, r: r.store_timestamp >= _after_round0(t)),
    # a window per queue; queue 2 from after its last message: nothing
    ("by-timestamp", lambda t: {
        "startingOffsetsByTimestamp": json.dumps({t.name: {"broker-a": {"0": _mid_ts(t), "1": 0, "2": FAR}}}),
        "endingOffsetsByTimestamp": json.dumps({t.name: {"broker-a": {"0": FAR, "1": _mid_ts(t), "2": FAR}}})},
     lambda t, r: ((r.queue_id == 0 and r.store_timestamp >= _mid_ts(t))
                   or (r.queue_id == 1 and r.store_timestamp < _mid_ts(t)))),
    ("partitions", lambda t: {"numPartitions": "2", "subExpression": "t2"},
     lambda t, r: r.properties.get("TAGS") == "t2"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_batch_read_same_in_both_backends(spark, topic, case):
    _, options, selects = case
    opts = options(topic)
    store_rows, store_parts = _load(spark, topic, "store", opts)
    live_rows, live_parts = _load(spark, topic, "cluster", opts)
    diff = [(a, b) for a, b in zip(live_rows, store_rows) if a != b]
    assert not diff, [(i, x, y) for a, b in diff[:2] for i, (x, y) in enumerate(zip(a, b)) if x != y]
    assert len(live_rows) == len(store_rows)
    assert live_parts == store_parts
    got = sorted((r[2], r[3]) for r in live_rows)   # (queueId, queueOffset)
    assert got == _expect_offsets(topic, lambda r: selects(topic, r))


def _stream_available_now(spark, topic: Topic, kind: str, tmp_path, options: dict):
    """Run an AvailableNow query from the earliest offsets: (rows per batch, the rows' table)."""
    reader = spark.readStream.format("rmq")
    for k, v in {**topic.options(kind), "startingOffsets": "earliest", **options}.items():
        reader = reader.option(k, v)
    name = f"both_{kind}_{uuid.uuid4().hex[:6]}"
    q = (reader.load().writeStream.foreachBatch(lambda df, i: df.withColumn("batch", F.lit(i))
                                   .write.mode("append").saveAsTable(name))
         .option("checkpointLocation", str(tmp_path / f"chk_{kind}")).trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    return sizes, name


@pytest.mark.parametrize("kind", ["store", "cluster"])
def test_stream_available_now_with_limits(spark, topic, tmp_path, kind):
    sizes, name = _stream_available_now(spark, topic, kind, tmp_path, {"maxMessagesPerTrigger": "70"})
    total = len(topic.all_rows())
    assert sum(sizes) == total and max(sizes) <= 70 and len(sizes) == -(-total // 70), sizes
    rows = spark.sql(f"select queueId, queueOffset from {name}").collect()
    assert sorted((r.queueId, r.queueOffset) for r in rows) == _expect_offsets(topic, lambda r: True)


@pytest.mark.lines("4.9")
def test_stream_byte_limit_same_in_both_backends(spark, topic, tmp_path):
    """maxBytesPerTrigger admits by the messages' stored sizes, which the live mode learns by
    pulling: both modes must plan the same batches, each within the limit."""
    limit = 4096
    planned = {}
    for kind in ("store", "cluster"):
        sizes, name = _stream_available_now(spark, topic, kind, tmp_path, {"maxBytesPerTrigger": str(limit)})
        per_batch = spark.sql(f"select batch, sum(storeSize) bytes, count(*) n from {name} group by batch").collect()
        assert max(r.bytes for r in per_batch) <= limit, per_batch
        rows = spark.sql(f"select queueId, queueOffset from {name}").collect()
        assert sorted((r.queueId, r.queueOffset) for r in rows) == _expect_offsets(topic, lambda r: True)
        planned[kind] = sorted((r.batch, r.n) for r in per_batch)
        assert [n for _, n in planned[kind]] == sizes
    assert planned["store"] == planned["cluster"]
    # the limit is used, not undershot: most batches leave less than the largest message unused
    assert len(planned["store"]) <= -(-sum(r.total_size for r in topic.all_rows()) // (limit // 2))


# (schema, options(topic)): a user schema selects the columns, filters still see every column
SCHEMAS = [
    ("queueOffset long, body binary, queueId int", lambda t: {}),
    ("keys array<string>, queueId int, queueOffset long, tags string, properties map<string,string>",
     lambda t: {"subExpression": "t1 || b"}),
    ("queueId int, queueOffset long", lambda t: {"subExpression": "t2"}),        # tags not asked
    ("queueOffset long, queueId int", lambda t: {"expressionType": "SQL92",
                                                 "subExpression": "n > 100"}),   # properties not asked
    ("storeTimestamp timestamp, queueId int, queueOffset long, msgId string",
     lambda t: {"startingOffsets": "group", "consumerGroup": GROUP,
                "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET"}),
]


@pytest.mark.lines("5.3")
@pytest.mark.parametrize("schema, options", SCHEMAS, ids=[s[0].split(",")[0] + f"-{i}" for i, s in enumerate(SCHEMAS)])
def test_a_schema_selects_the_columns_in_both_backends(spark, topic, schema, options):
    """Both backends give the asked columns, in the schema's order, of the rows the same read
    without a schema gives."""
    opts = options(topic)
    names = [c.split()[0] for c in schema.split(", ")]
    full = spark.read.format("rmq").options(**topic.options("cluster"), **opts).load()
    expected = sorted(tuple(r) for r in full.select(*names).collect())
    assert expected, "the case selects no row"
    for kind in ("store", "cluster"):
        df = spark.read.format("rmq").schema(schema).options(**topic.options(kind), **opts).load()
        assert df.columns == names
        assert sorted(tuple(r) for r in df.collect()) == expected, kind


@pytest.mark.lines("5.3")
@pytest.mark.parametrize("kind", ["store", "cluster"])
def test_a_schema_selects_the_columns_of_a_stream(spark, topic, tmp_path, kind):
    reader = (spark.readStream.format("rmq").schema("body binary, queueOffset long, queueId int")
              .options(**topic.options(kind), startingOffsets="earliest", maxMessagesPerTrigger="100"))
    name = f"cols_{kind}_{uuid.uuid4().hex[:6]}"
    q = (reader.load().writeStream.format("parquet").option("path", str(tmp_path / name))
         .option("checkpointLocation", str(tmp_path / f"chk_{kind}")).trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    rows = spark.read.parquet(str(tmp_path / name))
    assert rows.columns == ["body", "queueOffset", "queueId"]
    batch = spark.read.format("rmq").options(**topic.options(kind)).load()
    assert sorted(tuple(r) for r in rows.collect()) == sorted(
        tuple(r) for r in batch.select("body", "queueOffset", "queueId").collect())
    assert rows.count() == len(topic.all_rows())


@pytest.mark.lines("5.3")
def test_the_sql_api_and_a_wrong_schema(spark, topic):
    """``CREATE TEMPORARY VIEW ... (cols) USING rmq`` reads those columns (a catalog table,
    ``CREATE TABLE ... USING``, reaches Python sources without its OPTIONS in PySpark 4.x); a
    wrong column fails the query at its start naming it and the valid ones."""
    name = f"rmq_cols_{uuid.uuid4().hex[:6]}"
    spark.sql(f"CREATE TEMPORARY VIEW {name} (queueId INT, queueOffset BIGINT) USING rmq OPTIONS "
              f"(storePath '{topic.broker.store}', brokerName 'broker-a', topic '{topic.name}')")
    try:
        rows = spark.sql(f"SELECT * FROM {name}").collect()
        assert sorted(tuple(r) for r in rows) == _expect_offsets(topic, lambda r: True)
    finally:
        spark.sql(f"DROP VIEW {name}")
    with pytest.raises(Exception) as info:
        spark.read.format("rmq").schema("queueOffset long, Body binary").options(
            **topic.options("store")).load().collect()
    assert "RmqReadSchemaError" in str(info.value) and "did you mean body" in str(info.value)
