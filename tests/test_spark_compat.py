"""What differs between PySpark minors (rmq_source/spark/compat.py), tested on whichever PySpark
runs the test: the suite's own (the newest) and, through tests/test_spark_versions.py, each older
minor in its own venv.

- a PySpark the data source cannot run on (none, 3.x) is named at import;
- rate limits cap every micro-batch of a processing-time query, and a restart resumes exactly
  from the checkpoint (before 4.2 the reader keeps the batch's start itself);
- Trigger.AvailableNow reads everything there at its start and stops (4.2+: in rate-limited
  batches; before: one batch, capped by a rate limit);
- a live read and a sink write through the version's Spark.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from fault_helpers import procs
from rmq_source.errors import RmqSparkVersionError
from rmq_source.spark import compat
from store_builder import append_messages, build_store

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("found, outcome", [
    (None, "no pyspark is installed"),
    ("3.5.1", "found pyspark 3.5.1, which has no Python data source API"),
    ("3.0.0", "found pyspark 3.0.0"),
    ("4.0.0", (4, 0)),
    ("4.1.4", (4, 1)),
    ("4.3.0.dev2", (4, 3)),
    ("5.0.0", (5, 0)),
    ("four", "cannot read the PySpark version 'four'"),
])
def test_the_pyspark_found_is_checked(found, outcome):
    if isinstance(outcome, tuple):
        assert compat.check_version(found) == outcome
        return
    with pytest.raises(RmqSparkVersionError, match=outcome) as info:
        compat.check_version(found)
    assert isinstance(info.value, ImportError)
    if found != "four":
        assert "PySpark 4.0 or later" in str(info.value)


def test_importing_the_data_source_without_pyspark_names_what_is_needed():
    """Through the package's real import path, with pyspark made unimportable."""
    code = ("import sys; sys.modules['pyspark'] = None\n"
            "from rmq_source.errors import RmqSparkVersionError\n"
            "try:\n    from rmq_source import RocketMQDataSource\n"
            "except RmqSparkVersionError as exc:\n    print('refused:', exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "refused: the rmq data source needs PySpark 4.0 or later" in out.stdout, out.stdout
    assert "no pyspark is installed" in out.stdout


#: set by tests/test_spark_versions.py for its runs: the PySpark version the venv must be running
EXPECT_ENV = "RMQ_EXPECT_PYSPARK"


def test_the_features_follow_the_installed_version():
    import pyspark
    assert pyspark.__version__ == os.environ.get(EXPECT_ENV, pyspark.__version__)
    version = compat.parse_version(pyspark.__version__)
    assert compat.PYSPARK_VERSION == version
    assert compat.supported_features() == {
        "admission control and Trigger.AvailableNow": version >= (4, 2),
        "filter pushdown": version >= (4, 1), "Arrow stream writer": version >= (4, 1)}


# ------------------------------------------------------------------------------------ streams

@pytest.mark.parametrize("options, named", [
    ({"maxMessagesPerTrigger": "20"}, "maxMessagesPerTrigger=20"),
    ({"maxBytesPerTrigger": "4096", "minMessagesPerTrigger": "5"}, "maxBytesPerTrigger=4096, minMessagesPerTrigger=5"),
    ({}, None),
])
def test_a_rate_limit_spark_cannot_pass_is_warned_at_query_start(tmp_path, caplog, options, named):
    """Before 4.2 a rate-limited Trigger.AvailableNow query reads one capped batch: the reader says
    so when it starts (it cannot know its trigger); 4.2+ honours the limits and says nothing."""
    from rmq_source.spark.options import parse_options
    from rmq_source.spark.stream_reader import RmqStreamReader

    build_store(tmp_path / "store", topics=(("T", 1, 3),))
    with caplog.at_level("WARNING", logger="rmq_source.spark.compat"):
        RmqStreamReader(parse_options({"storePath": str(tmp_path / "store"), "topic": "T", **options},
                                      streaming=True))
    warned = [r.getMessage() for r in caplog.records if r.name == "rmq_source.spark.compat"]
    if compat.ADMISSION_CONTROL or named is None:
        assert warned == []
    else:
        assert len(warned) == 1 and named in warned[0] and compat.PYSPARK_VERSION_TEXT in warned[0], warned


def _rows(spark, sink):
    got = spark.read.parquet(str(sink)).select("queueId", "queueOffset").collect()
    return sorted((r.queueId, r.queueOffset) for r in got)


def _start(spark, store, sink, chk, trigger: dict, **options):
    reader = spark.readStream.format("rmq").option("storePath", str(store)).option("topic", "T")
    for key, value in options.items():
        reader = reader.option(key, value)
    return (reader.load().writeStream.format("parquet").option("path", str(sink))
            .option("checkpointLocation", str(chk)).trigger(**trigger).start())


def _wait_rows(query, want: int, timeout: float = 180.0) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert query.exception() is None, query.exception()
        progress = query.recentProgress
        if sum(p["numInputRows"] for p in progress) >= want:
            return progress
        time.sleep(0.2)
    raise AssertionError(f"{want} rows not read in {timeout} s: {query.recentProgress[-3:]}")


def test_rate_limited_group_stream_resumes_exactly_after_a_restart(spark, tmp_path):
    """Processing-time trigger, maxMessagesPerTrigger and a consumer group (ordered): every batch
    capped, a stop and a restart from the checkpoint, more messages meanwhile: each message once."""
    store = tmp_path / "store"
    written = build_store(store, topics=(("T", 3, 150),))
    sink, chk = tmp_path / "sink", tmp_path / "chk"
    opts = dict(consumerGroup=f"g-{uuid.uuid4().hex[:6]}", maxMessagesPerTrigger="25",
                startingOffsets="earliest")
    query = _start(spark, store, sink, chk, {"processingTime": "100 milliseconds"}, **opts)
    _wait_rows(query, 50)
    query.stop()
    progress = query.recentProgress  # batches may have run after the wait: count what ran
    # the stopped query left its group (planner_exit): its queue locks are free at once
    from rmq_source.group.locks import QueueLockManager
    locks = QueueLockManager(str(store / "rmq_source_offsets"), opts["consumerGroup"], lease_ms=60_000)
    # (20 s: well inside the 60 s lease a dead process's locks would keep)
    procs.wait_for(lambda: locks.entries() == {}, 20, "the stopped query's queue locks released",
                   interval=0.2)
    from rmq_source.store.writer import StoreWriter
    with StoreWriter(store) as w:
        written += append_messages(w, "T", 30, start_ts=1_700_002_000_000, seed=3)
    query = _start(spark, store, sink, chk, {"processingTime": "100 milliseconds"}, **opts)
    deadline = time.monotonic() + 180
    while len(_rows(spark, sink)) < len(written) and time.monotonic() < deadline:
        assert query.exception() is None, query.exception()
        time.sleep(0.5)
    query.stop()
    progress += query.recentProgress
    assert all(p["numInputRows"] <= 25 for p in progress), [p["numInputRows"] for p in progress]
    assert _rows(spark, sink) == sorted((w.queue_id, w.queue_offset) for w in written)


def test_available_now_reads_what_was_there_and_stops(spark, tmp_path):
    store = tmp_path / "store"
    written = build_store(store, topics=(("T", 2, 30),))
    sink, chk = tmp_path / "sink", tmp_path / "chk"
    query = _start(spark, store, sink, chk, {"availableNow": True}, startingOffsets="earliest")
    assert query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    assert _rows(spark, sink) == sorted((w.queue_id, w.queue_offset) for w in written)


def test_available_now_group_runs_resume_each_other(spark, tmp_path):
    """Ordered group, Trigger.AvailableNow run twice on one checkpoint with messages appended in
    between: the second run reads exactly the new ones (before 4.2 too: the first run's process
    leaves the group when Spark ends it, so its queue locks do not hold the second run back)."""
    from rmq_source.store.writer import StoreWriter

    store = tmp_path / "store"
    written = build_store(store, topics=(("T", 2, 40),))
    sink, chk = tmp_path / "sink", tmp_path / "chk"
    opts = dict(consumerGroup=f"g-{uuid.uuid4().hex[:6]}", consumeFromWhere="CONSUME_FROM_FIRST_OFFSET")
    for appended in (0, 30):
        if appended:
            with StoreWriter(store) as w:
                written += append_messages(w, "T", appended, start_ts=1_700_003_000_000, seed=4)
        query = _start(spark, store, sink, chk, {"availableNow": True}, **opts)
        assert query.awaitTermination(300)
        assert query.exception() is None, query.exception()
        assert _rows(spark, sink) == sorted((w.queue_id, w.queue_offset) for w in written)


def test_available_now_with_a_rate_limit(spark, tmp_path):
    """4.2+: every message, in batches of at most the limit. Before 4.2 Spark runs one batch: the
    limit's worth, the rest left for the next run (docs/options.md, "Spark versions")."""
    store = tmp_path / "store"
    written = build_store(store, topics=(("T", 2, 30),))
    sink, chk = tmp_path / "sink", tmp_path / "chk"
    query = _start(spark, store, sink, chk, {"availableNow": True}, startingOffsets="earliest",
                   maxMessagesPerTrigger="20")
    assert query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    if compat.ADMISSION_CONTROL:
        assert batches == [20, 10], batches
        assert len(_rows(spark, sink)) == len(written)
    else:
        assert batches == [20], batches
        assert len(_rows(spark, sink)) == 20


# ------------------------------------------------------------------------------------ live

@pytest.mark.broker
def test_a_live_read_and_a_sink_write(spark, rocketmq):
    """The sink sends a DataFrame to a topic of a real broker; a live batch read gives it back."""
    from rmq_source.remote import RemotingClient
    from rmq_source.remote import requests as rq

    topic = f"Compat{uuid.uuid4().hex[:8]}"
    broker = rocketmq.brokers["broker-a"]
    with RemotingClient(timeout=15) as client:
        rq.create_topic(client, broker.addr, topic, read_queues=2)
    df = spark.createDataFrame([(f"k{i}", f"body {i}".encode()) for i in range(50)], "keys string, body binary")
    df.write.format("rmq").option("namesrvAddr", rocketmq.namesrv_addr).option("topic", topic).mode("append").save()
    back = (spark.read.format("rmq").option("namesrvAddr", rocketmq.namesrv_addr).option("topic", topic)
            .load().select("body").collect())
    assert sorted(bytes(r.body) for r in back) == sorted(f"body {i}".encode() for i in range(50))


@pytest.mark.broker
def test_a_live_ordered_group_stream_commits_its_progress_to_the_broker(spark, rocketmq, tmp_path):
    """A processing-time group query of a live topic (ordered, rate-limited): every message read
    once, and the group's progress on the broker reaches the end while the query runs (each
    batch is committed there once Spark committed it), where mqadmin and Java consumers see it."""
    from rmq_source.remote import RemotingClient
    from rmq_source.remote import requests as rq

    topic, group = f"CompatG{uuid.uuid4().hex[:8]}", f"compat-{uuid.uuid4().hex[:6]}"
    broker = rocketmq.brokers["broker-a"]
    queues, per_queue = 3, 20
    with RemotingClient(timeout=15) as client:
        rocketmq.create_topic(client, topic, queues)
        for q in range(queues):
            for i in range(per_queue):
                rq.send_message(client, broker.addr, topic, b"q%d-%d" % (q, i), queue_id=q)
        for q in range(queues):
            rq.wait_max_offset(client, broker.addr, topic, q, per_queue)
    sink = tmp_path / "sink"
    query = (spark.readStream.format("rmq").option("namesrvAddr", rocketmq.namesrv_addr)
             .option("topic", topic).option("consumerGroup", group).option("startingOffsets", "earliest")
             .option("maxMessagesPerTrigger", "25").option("groupStatePath", str(tmp_path / "state"))
             .load().select("queueId", "queueOffset").writeStream.format("parquet")
             .option("path", str(sink)).option("checkpointLocation", str(tmp_path / "chk"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        progress = _wait_rows(query, queues * per_queue)
        deadline = time.monotonic() + 120
        with RemotingClient(timeout=15) as client:
            while True:
                committed = {q: rq.query_consumer_offset(client, broker.addr, group, topic, q)
                             for q in range(queues)}
                if all(committed[q] == per_queue for q in range(queues)) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
    finally:
        query.stop()
    assert committed == {q: per_queue for q in range(queues)}, committed
    assert all(p["numInputRows"] <= 25 for p in progress)
    # Spark ended the planner process (SIGTERM) and it released its queues on the way out: another
    # client locks them well before the minute the broker keeps a dead client's locks
    mqs = [(topic, "broker-a", q) for q in range(queues)]
    with RemotingClient(timeout=15) as client:
        procs.wait_for(lambda: rq.lock_batch(client, broker.addr, group, "compat-other", mqs) == set(mqs),
                       20, "the stopped query's queues free on the broker", interval=0.2)
    assert _rows(spark, sink) == sorted((q, o) for q in range(queues) for o in range(per_queue))


def test_sigterm_is_left_alone_outside_spark_planner_processes():
    """planner_exit changes SIGTERM only in Spark's stream planner process (not in this one)."""
    import signal
    from rmq_source.spark import planner_exit
    before = signal.getsignal(signal.SIGTERM)
    assert not planner_exit.is_planner_process()
    assert planner_exit.leave_cleanly_on_sigterm(lambda: False) is False
    assert signal.getsignal(signal.SIGTERM) is before
