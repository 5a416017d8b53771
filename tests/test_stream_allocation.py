"""A user allocation strategy is asked once per streaming batch: the queues whose offsets a batch
advances are the queues its tasks read, even when the strategy's answers change between calls.
A group's members split each topic by itself, as RocketMQ's clients rebalance."""
from __future__ import annotations

import pytest
from rmq_source.spark.compat import ReadAllAvailable

from rmq_source.errors import RmqAllocationError
from rmq_source.spark.options import parse_options
from rmq_source.spark.stream_reader import RmqStreamReader
from store_builder import build_store


@pytest.fixture()
def store(tmp_path):
    root = tmp_path / "store"
    build_store(root, topics=(("T", 3, 30),))
    return root


def _reader(store):
    return RmqStreamReader(parse_options(
        {"storePath": str(store), "topic": "T", "startingOffsets": "earliest",
         "allocateStrategy": "alloc_user_strategy:Fickle"}, streaming=True))


def test_planning_and_tasks_of_a_batch_share_one_answer(store):
    r = _reader(store)
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())   # the strategy's first round: all queues
    ranges = sorted((rg.queue_id, rg.start, rg.end) for p in r.partitions(start, end)
                    for rg in p.ranges)
    assert ranges == [(0, 0, 10), (1, 0, 10), (2, 0, 10)]


def test_a_rerun_whose_strategy_now_answers_otherwise_fails_instead_of_losing_the_batch(store):
    r = _reader(store)
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())
    restarted = _reader(store)                         # a new process: its first round ...
    restarted.strategy.target.rounds = 1               # ... answers "none" this time
    with pytest.raises(RmqAllocationError, match="FICKLE gives no task the queues"):
        restarted.partitions(start, end)


def test_a_group_splits_each_topic_by_itself_as_rocketmq_clients_do(tmp_path):
    """Two members reading topics A and B: the strategy is asked topic by topic (Java's
    rebalanceByTopic), so AVG gives each member one queue of each topic, not one topic each."""
    from rmq_source.group.allocation import MessageQueue
    from rmq_source.spark.query import open_backend, open_group_store, strategy_of
    root = tmp_path / "store"
    build_store(root, topics=(("A", 2, 20), ("B", 2, 20)))
    sessions = {}
    for cid in ("c1", "c2"):
        opts = parse_options({"storePath": str(root), "topic": "A,B", "consumerGroup": "G", "clientId": cid,
                              "orderly": "false"}, streaming=True)
        backend = open_backend(opts)
        sessions[cid] = (backend, backend.group_session(opts, strategy_of(opts), open_group_store(opts, backend)))
        sessions[cid][1].start()
    try:
        for cid, (backend, session) in sessions.items():
            mqs = backend.queues_for_topics(["A", "B"])
            read, _ = session.choose(mqs, {mq: 0 for mq in mqs}, fresh=True)
            q = 0 if cid == "c1" else 1
            assert read == {MessageQueue("A", "broker-a", q), MessageQueue("B", "broker-a", q)}, (cid, read)
    finally:
        for _, session in sessions.values():
            session.stop()
