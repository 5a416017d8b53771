"""Several streaming queries of one consumer group share a 16-queue topic (ordered mode, locks).

Two queries start, a third joins while the writer appends, then one stops: the union of their
sinks holds every message (exactly once while the group only grows; a stopped query's last batch
may be read again by its successor, at-least-once, as with RocketMQ consumers), and the lock history
shows no queue held by two live queries at once.
"""
from __future__ import annotations

import threading
import time

import pytest

from fault_helpers.queries import revive
from fault_helpers.sinks import union_of_sinks
from rmq_source.errors import RmqLockError
from rmq_source.group.locks import find_lock_overlaps, read_history
from rmq_source.store.writer import StoreWriter
from store_builder import append_messages, build_store

pytestmark = [pytest.mark.spark, pytest.mark.slow]

GROUP = "G16"
LEASES = dict(lockLeaseMs="4000", clientLockLeaseMs="3000", lockRenewIntervalMs="1000")


def _start(spark, store, tmp_path, name):
    reader = spark.readStream.format("rmq")
    opts = dict(storePath=str(store), topic="Group16", consumerGroup=GROUP, clientId=name,
                consumeFromWhere="CONSUME_FROM_FIRST_OFFSET", maxMessagesPerTrigger="60", **LEASES)
    for k, v in opts.items():
        reader = reader.option(k, v)
    return (reader.load().writeStream.format("parquet").option("path", str(tmp_path / f"sink-{name}"))
            .option("checkpointLocation", str(tmp_path / f"chk-{name}"))
            .trigger(processingTime="500 milliseconds").start())



def _wait_for(tmp_path, names, expected, queries, start, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        revive(queries, start)
        keys, per_query = union_of_sinks(tmp_path, names)
        if set(keys) >= expected:
            return keys, per_query
        time.sleep(2)
    keys, per_query = union_of_sinks(tmp_path, names)
    missing = sorted(expected - set(keys))[:10]
    raise AssertionError(f"the group did not consume everything in {timeout}s; missing e.g. {missing}")


def _wait_until_locking(store, client, queries, start, timeout=300):
    """Wait until ``client`` has taken a queue lock (the group's lock history names it): a query
    that joins late must get queues before the test can say it shared them, however long Spark
    takes to start it on a loaded machine."""
    deadline = time.time() + timeout
    while True:
        revive(queries, start)
        try:
            if client in {r["client"] for r in read_history(store / "rmq_source_offsets", GROUP)}:
                return
        except RmqLockError:            # a line being appended right now: read again
            pass
        if time.time() > deadline:
            raise AssertionError(f"{client} took no queue lock in {timeout}s")
        time.sleep(1)


def test_queries_of_a_group_split_the_queues_and_hand_them_over(spark, tmp_path):
    store = tmp_path / "store"
    written = build_store(store, topics=(("Group16", 16, 320),))
    expected = {(w.queue_id, w.queue_offset) for w in written}

    def start(name):
        return _start(spark, store, tmp_path, name)

    queries = {"c1": start("c1"), "c2": start("c2")}
    more: list = []
    writer_done = threading.Event()

    def produce():
        with StoreWriter(store) as w:
            for i in range(5):
                more.extend(append_messages(w, "Group16", 40, start_ts=1_700_002_000_000 + i * 1000, seed=i))
                w.flush()
                time.sleep(0.7)
        writer_done.set()

    threading.Thread(target=produce, daemon=True).start()
    time.sleep(4)
    queries["c3"] = start("c3")
    _wait_until_locking(store, "c3", queries, start)
    assert writer_done.wait(60)
    expected |= {(w.queue_id, w.queue_offset) for w in more}
    names = ["c1", "c2", "c3"]
    keys, per_query = _wait_for(tmp_path, names, expected, queries, start)
    assert set(keys) == expected
    assert all(n == 1 for n in keys.values()), "a message was read twice while the group only grew"
    assert sum(1 for c in per_query.values() if c) >= 2, "the queues were not shared"

    # One query stops: after its lease its queues move to the others, and nothing is lost.
    queries["c2"].stop()
    with StoreWriter(store) as w:
        late = append_messages(w, "Group16", 64, start_ts=1_700_003_000_000, seed=42)
    expected |= {(w.queue_id, w.queue_offset) for w in late}
    _wait_for(tmp_path, names, expected, queries, start)
    for name in ("c1", "c3"):
        queries[name].stop()
    keys, per_query = union_of_sinks(tmp_path, names)
    assert set(keys) == expected
    twice = {k for k, n in keys.items() if n > 1}
    assert twice <= set(per_query["c2"]), "only the stopped query's last batch may be read again"

    history = read_history(store / "rmq_source_offsets", GROUP)
    assert {r["client"] for r in history} == {"c1", "c2", "c3"}
    assert find_lock_overlaps(history) == []
