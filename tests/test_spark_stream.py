"""spark.readStream.format("rmq"): exactly-once into parquet across restarts, admission control,
live appends, lag reporting, and consumer-group progress."""
from __future__ import annotations

import base64
import json
import shutil
import threading
import time

import pytest

from conftest import fixture_dir
from rmq_source.group.allocation import MessageQueue
from rmq_source.store.config_files import read_consumer_offsets
from rmq_source.group.offset_store import GroupOffsetStore
from rmq_source.spark import compat
from rmq_source.store.reader import Store
from rmq_source.store.writer import StoreWriter
from store_builder import append_messages, build_store

pytestmark = pytest.mark.spark


def _stream(spark, **options):
    reader = spark.readStream.format("rmq")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _run_available_now(spark, sink, chk, **options):
    q = (_stream(spark, **options).writeStream.format("parquet").option("path", str(sink))
         .option("checkpointLocation", str(chk)).trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    return q


def _sink_rows(spark, sink):
    """The sink's rows as sorted (topic, brokerName, queueId, queueOffset, body), duplicates kept."""
    rows = (spark.read.parquet(str(sink))
            .select("topic", "brokerName", "queueId", "queueOffset", "body").collect())
    return sorted((r.topic, r.brokerName, r.queueId, r.queueOffset, bytes(r.body)) for r in rows)


def _rows(written):
    return sorted((w.topic, w.broker, w.queue_id, w.queue_offset, bytes(w.body)) for w in written)


def _max_offsets(written) -> dict:
    """{topic: {broker: {queueId: next offset}}} of the written messages, as the source's offsets."""
    out: dict = {}
    for w in written:
        queues = out.setdefault(w.topic, {}).setdefault(w.broker, {})
        queues[str(w.queue_id)] = max(queues.get(str(w.queue_id), 0), w.queue_offset + 1)
    return out


@pytest.mark.spark42
def test_available_now_exactly_once_across_restarts_with_limits(spark, tmp_path):
    store = tmp_path / "store"
    written = build_store(store, topics=(("TopicTest", 4, 200),))
    sink, chk = tmp_path / "sink", tmp_path / "chk"
    opts = dict(storePath=str(store), topic="TopicTest", startingOffsets="earliest",
                maxMessagesPerTrigger="70")
    q = _run_available_now(spark, sink, chk, **opts)
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 200 and max(sizes) <= 70 and len(sizes) >= 3, sizes
    last = [p for p in q.recentProgress if p["numInputRows"]][-1]["sources"][0]
    assert json.loads(last["latestOffset"]) == json.loads(last["endOffset"])  # no lag left

    with StoreWriter(store) as w:
        written += append_messages(w, "TopicTest", 55, start_ts=1_700_000_900_000, seed=99)
    q = _run_available_now(spark, sink, chk, **opts)
    assert _sink_rows(spark, sink) == _rows(written)  # every message exactly once, unchanged
    last = [p for p in q.recentProgress if p["numInputRows"]][-1]["sources"][0]
    assert json.loads(last["endOffset"]) == _max_offsets(written)


@pytest.mark.parametrize("messages", [2, 40])
def test_available_now_with_max_bytes_and_idle_queues_into_memory(spark, tmp_path, messages):
    """Issue 8: a 4-queue topic with 2 (or 40) messages under maxBytesPerTrigger into a memory
    sink: idle queues and the caught-up state must not fail the query."""
    store = tmp_path / "store"
    written = build_store(store, topics=(("Idle", 4, messages),))
    name = f"idle_{messages}"
    q = (_stream(spark, storePath=str(store), topic="Idle", startingOffsets="earliest",
                 maxBytesPerTrigger="1000000")
         .writeStream.format("memory").queryName(name)
         .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    rows = spark.sql(f"select topic, brokerName, queueId, queueOffset, body from {name}").collect()
    assert sorted((r.topic, r.brokerName, r.queueId, r.queueOffset, bytes(r.body)) for r in rows) == \
        sorted((w.topic, w.broker, w.queue_id, w.queue_offset, w.body) for w in written)


def test_processing_time_trigger_while_the_writer_appends(spark, tmp_path):
    store = tmp_path / "store"
    written = build_store(store, topics=(("Live", 3, 30),))
    sink, chk = tmp_path / "sink", tmp_path / "chk"
    q = (_stream(spark, storePath=str(store), topic="Live", startingOffsets="earliest",
                 maxMessagesPerTrigger="40")
         .writeStream.format("parquet").option("path", str(sink)).option("checkpointLocation", str(chk))
         .trigger(processingTime="500 milliseconds").start())
    more: list = []

    def produce():
        with StoreWriter(store) as w:
            for i in range(6):
                more.extend(append_messages(w, "Live", 25, start_ts=1_700_001_000_000 + i * 1000, seed=i))
                w.flush()
                time.sleep(0.4)

    t = threading.Thread(target=produce)
    t.start()
    t.join()
    total = len(written) + len(more)
    deadline = time.time() + 180
    while time.time() < deadline:
        done = sum(p["numInputRows"] for p in q.recentProgress)
        if done >= total and q.lastProgress and not q.status["isDataAvailable"]:
            break
        time.sleep(1)
    progress = q.recentProgress
    q.stop()
    assert all(p["numInputRows"] <= 40 for p in progress)
    src = progress[-1]["sources"][0]
    # (before 4.2 Spark asks Python sources for no latestOffset metric, and the progress shows their
    # offsets as Python dicts: the rows below are the check there)
    if compat.ADMISSION_CONTROL:
        # lag is reported to the query progress: the store's max offsets, reached by the query
        assert json.loads(src["latestOffset"]) == _max_offsets(written + more), src
        assert json.loads(src["endOffset"]) == json.loads(src["latestOffset"]), src
    assert _sink_rows(spark, sink) == _rows(written + more)


@pytest.fixture()
def java_group_store(tmp_path):
    """A copy of the RocketMQ 4.9.3 fixture store, whose broker config holds ConsumerGroupA."""
    src = fixture_dir("rocketmq-4.9.3/basic") / "store"
    dst = tmp_path / "store"
    shutil.copytree(src, dst)
    return dst


def _fixture_rows(keep) -> list:
    """Rows of TopicTest in the 4.9.3 fixture's manifest (RocketMQ's own decoding) that ``keep``
    (queueId, queueOffset) selects, as _sink_rows gives them."""
    manifest = fixture_dir("rocketmq-4.9.3/basic") / "manifest.jsonl"
    rows = []
    with open(manifest, encoding="utf-8") as fh:
        for m in map(json.loads, fh):
            if m["topic"] == "TopicTest" and keep(m["queueId"], m["queueOffset"]):
                body = base64.b64decode(m.get("decompressedBody") or m["body"])
                rows.append(("TopicTest", "broker-a", m["queueId"], m["queueOffset"], body))
    return sorted(rows)


@pytest.mark.spark42    # (before 4.2 the group trails an AvailableNow run by its last batch)
def test_group_progress_resume_and_reset(spark, tmp_path, java_group_store):
    store = java_group_store
    broker_file = (store / "config" / "consumerOffset.json").read_bytes()
    taken_over = read_consumer_offsets(store)[("TopicTest", "ConsumerGroupA")]
    opts = dict(storePath=str(store), topic="TopicTest", consumerGroup="ConsumerGroupA")

    # 1. A new query takes over the group where the Java consumers left it.
    sink1, chk1 = tmp_path / "sink1", tmp_path / "chk1"
    _run_available_now(spark, sink1, chk1, **opts)
    with Store(store) as s:
        max_off = {q: s.max_offset("TopicTest", q) for q in range(4)}
    assert any(max_off[q] > taken_over[q] for q in range(4)), (max_off, taken_over)
    # exactly the messages after the group's offsets, as RocketMQ decodes them
    assert _sink_rows(spark, sink1) == _fixture_rows(lambda q, o: taken_over[q] <= o < max_off[q])
    assert (store / "config" / "consumerOffset.json").read_bytes() == broker_file  # never written

    # 2. Spark committed: the group's progress is now the max offsets, in our offset store.
    group = GroupOffsetStore(str(store / "rmq_source_offsets"), "ConsumerGroupA",
                             broker_stores={"broker-a": str(store)})
    assert {q: group.read_offset(MessageQueue("TopicTest", "broker-a", q)) for q in range(4)} == max_off

    # 3. A new query (new checkpoint) of the group resumes: it reads only what was appended since.
    with StoreWriter(store) as w:
        w.create_topic("TopicTest", 4)
        new = append_messages(w, "TopicTest", 12, start_ts=1_795_300_000_000, seed=5)
    sink2, chk2 = tmp_path / "sink2", tmp_path / "chk2"
    _run_available_now(spark, sink2, chk2, **opts)
    assert _sink_rows(spark, sink2) == _rows(new)

    # 4. Reset by timestamp: a new query reads from the first message stored at/after T.
    sink3, chk3 = tmp_path / "sink3", tmp_path / "chk3"
    _run_available_now(spark, sink3, chk3, startingTimestamp=str(1_795_300_000_000), **opts)
    assert _sink_rows(spark, sink3) == _rows(new)

    # 5. Reset by explicit offsets wins over the group's progress.
    sink4, chk4 = tmp_path / "sink4", tmp_path / "chk4"
    start = {"TopicTest": {"broker-a": {str(q): max_off[q] - 1 for q in range(4)}}}
    _run_available_now(spark, sink4, chk4, startingOffsets=json.dumps(start), **opts)
    assert _sink_rows(spark, sink4) == sorted(
        _fixture_rows(lambda q, o: o == max_off[q] - 1) + _rows(new))


def test_topic_pattern_picks_up_new_topics_and_queues_from_earliest(spark, tmp_path):
    store = tmp_path / "store"
    written = build_store(store, topics=(("Ev_orders", 2, 40),))
    sink, chk = tmp_path / "sink", tmp_path / "chk"
    opts = dict(storePath=str(store), topicPattern=r"Ev_.*", startingOffsets="latest")
    q = _run_available_now(spark, sink, chk, **opts)  # starts at latest: nothing yet
    assert sum(p["numInputRows"] for p in q.recentProgress) == 0, q.recentProgress
    with StoreWriter(store) as w:
        w.create_topic("Ev_payments", 3)          # a new matching topic
        w.create_topic("Other", 1)                # not matching
        new = append_messages(w, "Ev_payments", 30, start_ts=1_700_000_800_000, seed=3)
        append_messages(w, "Other", 5, start_ts=1_700_000_900_000, seed=4)
        w.create_topic("Ev_orders", 3)            # a queue added to a known topic
        more = append_messages(w, "Ev_orders", 9, start_ts=1_700_000_950_000, seed=5)
    _run_available_now(spark, sink, chk, **opts)
    # the first 40 were before the query's start (latest): only the new messages, unchanged
    assert _sink_rows(spark, sink) == _rows(new + more)
    assert any(w.queue_id == 2 for w in more) and len(written) == 40
