"""Tasks sized to the work: packing one-queue slots into tasks, the sampled weights, the joined
batches of a task over many small queues, and what a plan without numPartitions gives."""
from __future__ import annotations

import math

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from rmq_source.group.allocation import AllocateMessageQueueAveragely, MessageQueue, create_strategy
from rmq_source.spark.batch_reader import plan_batch
from rmq_source.spark.options import parse_options
from rmq_source.backend import coalesce
from rmq_source.spark.partition_reader import read_partition
from rmq_source.spark.planner import QUEUE_COST_BYTES, TASK_COST_BYTES, QueueRange, TaskSizing, plan_tasks
from rmq_source.spark.sizing import CQ_UNIT_BYTES, SAMPLE_MESSAGES, SAMPLE_WINDOWS, _windows, task_sizing
from rmq_source.spark.query import open_backend
from rmq_source.store.writer import StoreWriter

AVG = AllocateMessageQueueAveragely()


def _ranges(sizes, topic="T"):
    return [QueueRange(MessageQueue(topic, "broker-a", i), 100, 100 + n) for i, n in enumerate(sizes)]


def _flat(tasks):
    return [r for t in tasks for r in t.ranges]


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(0, 5000), min_size=1, max_size=60),
       parallelism=st.integers(1, 16), max_bytes=st.integers(1, 1 << 24),
       offset_bytes=st.floats(0, 4096), orderly=st.booleans())
def test_packing_keeps_every_range_once_in_order(sizes, parallelism, max_bytes, offset_bytes, orderly):
    ranges = _ranges(sizes)
    sizing = TaskSizing(parallelism, max_bytes, {"T": offset_bytes})
    tasks = plan_tasks(ranges, AVG, "", None, orderly, None, sizing=sizing)
    live = [r for r in ranges if r.size]
    # every queue with data is read by one task, the tasks in queue order, each queue whole
    assert _flat(tasks) == live
    if not live:
        return
    total = sum(sizing.weight(r) for r in live)
    wanted = max(parallelism, math.ceil(total / max_bytes))
    wanted = min(len(live), math.ceil(wanted / parallelism) * parallelism)    # whole waves
    assert 1 <= len(tasks) <= wanted
    # fewer tasks than wanted only when a slot is heavier than a task's share
    if len(tasks) < wanted:
        assert max(sizing.weight(r) for r in live) > total / wanted
    # balanced: no task exceeds its share by more than one range
    for t in tasks:
        assert sum(sizing.weight(r) for r in t.ranges) <= total / len(tasks) + 2 * max(
            sizing.weight(r) for r in live)


@pytest.mark.parametrize("queues, num_partitions, min_partitions, orderly, expected_tasks", [
    (1000, None, None, True, 2),     # parallelism 2, a light backlog: two tasks of 500 queues
    (1000, None, 8, True, 8),        # minPartitions raises the count, queues stay whole
    (1000, None, 8, False, 8),
    (1000, 7, None, True, 7),        # numPartitions is the slot count, unpacked
    (3, None, 8, True, 3),           # ordered: at most one task per queue
    (3, 3, 8, False, 9),             # unordered: ranges split into pieces of ceil(30 / 8) offsets
])
def test_task_count(queues, num_partitions, min_partitions, orderly, expected_tasks):
    ranges = _ranges([10] * queues)
    sizing = None if num_partitions else TaskSizing(min_partitions or 2, 128 << 20, {"T": 120})
    tasks = plan_tasks(ranges, AVG, "", num_partitions, orderly, min_partitions, sizing=sizing)
    assert len(tasks) == expected_tasks
    read = sorted((r.mq, o) for r in _flat(tasks) for o in range(r.start, r.end))
    assert read == sorted((r.mq, o) for r in ranges for o in range(r.start, r.end))


@pytest.mark.parametrize("mib, min_partitions, expected", [
    (1, None, 1),            # a micro-batch of 1 MiB: one task, not one per core
    (8, None, 1),            # up to TASK_COST_BYTES: one
    (9, None, 2),            # more: one per TASK_COST_BYTES, up to the parallelism
    (40, None, 4),
    (400, None, 4),          # the parallelism (under maxPartitionBytes' count)
    (1, 3, 3),               # minPartitions is a floor the user set: kept for small plans
])
def test_light_plans_get_fewer_tasks_than_parallelism(mib, min_partitions, expected):
    sizing = TaskSizing(min_partitions or 4, 1 << 30, {"T": 1024}, 0,
                        0 if min_partitions else TASK_COST_BYTES)
    tasks = plan_tasks(_ranges([mib * 1024 // 16] * 16), AVG, "", None, True, min_partitions,
                       sizing=sizing)
    assert len(tasks) == expected


def test_heavy_backlog_gets_more_tasks_than_parallelism():
    # 64 queues x 10,000 offsets x 1 KiB = 640 MiB: five tasks of 128 MiB, six at parallelism 2
    # (whole waves: the fifth would run alone)
    sizing = TaskSizing(2, 128 << 20, {"T": 1024})
    tasks = plan_tasks(_ranges([10_000] * 64), AVG, "", None, True, None, sizing=sizing)
    total = 64 * (10_000 * 1024 + QUEUE_COST_BYTES)
    assert math.ceil(total / (128 << 20)) == 5 and len(tasks) == 6


@pytest.mark.parametrize("strategy", ["AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH"])
def test_packing_keeps_the_strategy_allocation_per_queue(strategy):
    """Packing merges whole slots: each queue keeps the slot its strategy gave it (the slots of
    a task are consecutive)."""
    strat = create_strategy(strategy, virtual_node_count=3) if strategy == "CONSISTENT_HASH" else \
        create_strategy(strategy)
    ranges = _ranges([5] * 40)
    unpacked = plan_tasks(ranges, strat, "g", None, True, None)
    packed = plan_tasks(ranges, strat, "g", None, True, None, sizing=TaskSizing(3, 1 << 30))
    assert len(packed) == 3
    slot_of = {r.mq: t.slot for t in unpacked for r in t.ranges}
    for t in packed:
        first, _, last = t.slot.partition("..")
        assert all(first <= slot_of[r.mq] <= (last or first) for r in t.ranges)
    assert _flat(packed) == _flat(unpacked)


_SCHEMA = pa.schema([("x", pa.int64()), ("b", pa.binary())])


def _batch(n, start=0):
    return pa.RecordBatch.from_pydict({"x": list(range(start, start + n)), "b": [b"y" * 10] * n},
                                      schema=_SCHEMA)


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 50), max_size=40), max_rows=st.integers(1, 120),
       max_bytes=st.integers(1, 4000))
def test_coalesce_keeps_rows_in_order_within_limits(sizes, max_rows, max_bytes):
    batches, at = [], 0
    for n in sizes:
        batches.append(_batch(n, at))
        at += n
    out = list(coalesce(iter(batches), max_rows, max_bytes))
    assert [x for b in out for x in b.column("x").to_pylist()] == list(range(at))
    inputs = {id(b) for b in batches}
    for b in out:
        if id(b) in inputs:            # passed through unchanged (a large or a lone batch)
            continue
        assert b.num_rows <= max_rows and b.get_total_buffer_size() <= max_bytes + 64 * b.num_columns


def test_coalesce_joins_small_batches():
    out = list(coalesce(iter([_batch(3, 3 * i) for i in range(100)]), 1000, 1 << 20))
    assert len(out) == 1 and out[0].num_rows == 300


def test_coalesce_passes_an_eighth_of_a_limit_through_unjoined():
    """A live read decodes 16 MiB of answers at a time against batches of 64 MiB: such batches
    go out as they are (joining them would copy every body once more), smaller ones are joined."""
    big = [_batch(50, 50 * i) for i in range(4)]
    limit = big[0].get_total_buffer_size() * 6          # each is a sixth of the byte limit
    assert [b is a for b, a in zip(coalesce(iter(big), 10_000, limit), big)] == [True] * 4
    assert len(list(coalesce(iter(big), 10_000, limit * 2))) == 1     # a twelfth: joined


@pytest.fixture(scope="module")
def many_queues(tmp_path_factory):
    """200 queues of 5 messages; tag X on 1 message in 100 (queue 7 has two)."""
    root = tmp_path_factory.mktemp("many") / "store"
    with StoreWriter(str(root), broker_name="broker-a") as w:
        w.create_topic("M", 200)
        for i in range(1000):
            tag = "X" if i % 100 == 7 else "other"
            w.append("M", b"m" * 200, tags=tag, queue_id=i % 200)
    return root


def _opts(root, **extra):
    return parse_options({"storePath": str(root), "topic": "M", **extra}, streaming=False)


def test_plan_without_num_partitions_packs_small_queues(many_queues, monkeypatch):
    monkeypatch.setattr("rmq_source.spark.sizing.default_parallelism", lambda: 2)
    # 1,000 small messages weigh less than launching a second task: one task
    assert [len(p.ranges) for p in plan_batch(_opts(many_queues))] == [200]
    monkeypatch.setattr("rmq_source.spark.sizing.TASK_COST_BYTES", 1)
    parts = plan_batch(_opts(many_queues))
    assert len(parts) == 2
    assert [r.queue_id for p in parts for r in p.ranges] == list(range(200))
    rows = [row for p in parts for b in read_partition(p) for row in b.column("queueOffset").to_pylist()]
    assert len(rows) == 1000
    # a task over many small queues hands Spark one joined batch, not one per queue
    assert all(len(list(read_partition(p))) == 1 for p in parts)
    assert len(plan_batch(_opts(many_queues, minPartitions="5"))) == 5
    assert len(plan_batch(_opts(many_queues, numPartitions="200"))) == 200


def test_a_backend_states_its_queue_cost(many_queues):
    """The store's queue cost (its tasks scan many queues per C call) weighs a range, not the
    default; with it 10,000 queues of 10 small messages fit the parallelism's tasks."""
    backend = open_backend(_opts(many_queues))
    ranges = [QueueRange(MessageQueue("M", "broker-a", q), 0, 5) for q in range(200)]
    sizing = task_sizing(_opts(many_queues), backend, ranges)
    assert sizing.queue_cost_bytes == backend.queue_cost_bytes < QUEUE_COST_BYTES
    assert sizing.weight(ranges[0]) == 5 * sizing.offset_bytes["M"] + backend.queue_cost_bytes
    assert TaskSizing(2, 128 << 20).queue_cost_bytes == QUEUE_COST_BYTES
    wide = _ranges([10] * 10_000)
    sized = TaskSizing(2, 128 << 20, {"T": 282}, backend.queue_cost_bytes)
    assert len(plan_tasks(wide, AVG, "", None, True, None, sizing=sized)) == 2


def test_sampled_weight_follows_the_subscription(many_queues):
    backend = open_backend(_opts(many_queues))
    ranges = [QueueRange(MessageQueue("M", "broker-a", q), 0, 5) for q in range(200)]
    every = task_sizing(_opts(many_queues), backend, ranges).offset_bytes["M"]
    assert every > 200 + CQ_UNIT_BYTES                       # whole records, headers included
    # the sample reads the largest ranges first (all of 5 here: queues 0..3, none tagged X)
    tagged = task_sizing(_opts(many_queues, subExpression="X"), backend, ranges).offset_bytes["M"]
    assert tagged == CQ_UNIT_BYTES
    only_x = [QueueRange(MessageQueue("M", "broker-a", 7), 0, 5)]    # every message tagged X
    assert task_sizing(_opts(many_queues, subExpression="X"), backend, only_x).offset_bytes == \
        task_sizing(_opts(many_queues), backend, only_x).offset_bytes
    assert task_sizing(_opts(many_queues, numPartitions="3"), backend, ranges) is None
    known = {"M": 7.0}
    assert task_sizing(_opts(many_queues), backend, ranges, known).offset_bytes == {"M": 7.0}


@given(start=st.integers(0, 1 << 40), size=st.integers(0, 10**7))
def test_sample_windows_are_inside_the_range_and_apart(start, size):
    r = QueueRange(MessageQueue("T", "b", 0), start, start + size)
    windows = _windows(r)
    assert windows == _windows(r)
    assert all(r.start <= a < b <= r.end for a, b in windows) or not size
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(windows, windows[1:]))
    assert sum(b - a for a, b in windows) <= min(size, SAMPLE_WINDOWS * SAMPLE_MESSAGES)


def test_sample_windows_do_not_follow_a_period():
    """Runs of alike messages at a period (a producer sending batches) are not all met: the
    windows of a 250,000-offset range fall in different places of a 2,500-offset period."""
    r = QueueRange(MessageQueue("T", "b", 0), 0, 250_000)
    assert len({a % 2500 // 100 for a, _ in _windows(r)}) >= SAMPLE_WINDOWS // 2


def test_sampling_is_bounded_per_plan(tmp_path):
    """Many topics: the largest SAMPLE_TOPICS are sampled (a live sample pulls), the rest weigh
    their mean; a streaming query samples the rest at later plans (``known`` grows)."""
    from rmq_source.spark.sizing import SAMPLE_TOPICS
    root = tmp_path / "store"
    topics = [f"T{i:02d}" for i in range(SAMPLE_TOPICS + 3)]
    with StoreWriter(str(root), broker_name="broker-a") as w:
        for i, t in enumerate(topics):
            w.create_topic(t, 1)
            for _ in range(2 + i):               # later topics have more to read
                w.append(t, b"z" * (100 * (i + 1)), queue_id=0)
    opts = parse_options({"storePath": str(root), "topicPattern": "T.*"}, streaming=False)
    backend = open_backend(opts)
    ranges = [QueueRange(MessageQueue(t, "broker-a", 0), 0, 2 + i) for i, t in enumerate(topics)]
    known: dict[str, float] = {}
    weights = task_sizing(opts, backend, ranges, known).offset_bytes
    assert sorted(known) == topics[3:]           # the largest, sampled
    mean = sum(known.values()) / len(known)
    assert all(weights[t] == mean for t in topics[:3]) and set(weights) == set(topics)
    task_sizing(opts, backend, ranges, known)
    assert sorted(known) == topics               # the rest at the next plan
