"""The streaming reader's offset logic, driven directly (no Spark session): admission control,
Trigger.AvailableNow targets, reported lag, planning of partitions."""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rmq_source.spark.compat import ReadAllAvailable, ReadMaxBytes, ReadMaxRows, ReadMinRows

from rmq_source.group.allocation import MessageQueue
from rmq_source.errors import RmqDataLossError, RmqOptionError, RmqUnknownTopicError
from rmq_source.spark.offsets import from_json_dict
from rmq_source.spark.options import parse_options
from rmq_source.spark.planner import share_limit
from rmq_source.store.reader import Store
from rmq_source.spark.stream_reader import RmqStreamReader
from rmq_source.store.writer import StoreWriter
from store_builder import append_messages, build_store


@pytest.fixture()
def store(tmp_path):
    root = tmp_path / "store"
    build_store(root, topics=(("T", 3, 90),))
    return root


def _reader(store, **options):
    opts = {"storePath": str(store), "topic": "T", "startingOffsets": "earliest", **options}
    return RmqStreamReader(parse_options(opts, streaming=True))


def _total(start, end):
    s, e = from_json_dict(start), from_json_dict(end)
    return sum(e[mq] - s.get(mq, 0) for mq in e)


def test_max_messages_is_shared_by_backlog_and_never_exceeded(store):
    r = _reader(store, maxMessagesPerTrigger="20")
    assert r.getDefaultReadLimit() == ReadMaxRows(20)
    start = r.initialOffset()
    seen = 0
    while True:
        end = r.plan_latest(start, r.getDefaultReadLimit())
        n = _total(start, end)
        if n == 0:
            break
        assert n <= 20
        seen += n
        start = end
    assert seen == 90
    # the engine's ReadAllAvailable (e.g. Trigger.Once) ignores the option
    assert _total(r.initialOffset(), r.plan_latest(r.initialOffset(), ReadAllAvailable())) == 90


def test_max_bytes_admits_whole_messages_within_the_budget(store):
    r = _reader(store, maxBytesPerTrigger="4000")
    assert r.getDefaultReadLimit() == ReadMaxBytes(4000)
    start = r.initialOffset()
    end = r.plan_latest(start, r.getDefaultReadLimit())
    with Store(store) as s:
        used = sum(s.range_bytes(mq.topic, mq.queue_id, o, from_json_dict(end)[mq])
                   for mq, o in from_json_dict(start).items())
    assert 0 < used <= 4000  # whole messages, never over the budget
    assert _total(start, end) < 90


def test_min_messages_waits_until_the_delay(store, monkeypatch):
    r = _reader(store, startingOffsets="latest", minMessagesPerTrigger="10", maxTriggerDelay="1h")
    assert r.getDefaultReadLimit() == ReadMinRows(10)
    start = r.initialOffset()
    with StoreWriter(store) as w:
        append_messages(w, "T", 5, start_ts=1_700_009_000_000)
    assert r.plan_latest(start, r.getDefaultReadLimit()) == start  # 5 < 10: wait
    r._last_batch_at -= 3601  # the delay has passed
    assert _total(start, r.plan_latest(start, r.getDefaultReadLimit())) == 5


def test_available_now_stops_at_the_target_and_lag_is_reported(store):
    r = _reader(store)
    start = r.initialOffset()
    r.prepareForTriggerAvailableNow()
    with StoreWriter(store) as w:
        append_messages(w, "T", 12, start_ts=1_700_009_000_000)
    end = r.plan_latest(start, ReadAllAvailable())
    assert _total(start, end) == 90  # not the 12 appended after the target was taken
    latest = r.reportLatestOffset()
    assert _total(end, latest) == 12  # the lag Spark shows in the query progress
    with StoreWriter(store) as w:
        append_messages(w, "T", 3, start_ts=1_700_009_100_000)
    assert _total(end, r.reportLatestOffset()) == 15   # no planning since: asked again


def test_partitions_one_task_per_queue_in_order(store):
    r = _reader(store, numPartitions="2")
    start = r.initialOffset()
    end = r.plan_latest(start, ReadAllAvailable())
    parts = r.plan_partitions(start, end)
    assert len(parts) == 2
    ranges = [rg for p in parts for rg in p.ranges]
    assert sorted(rg.queue_id for rg in ranges) == [0, 1, 2]
    assert all(rg.start == 0 and rg.end == 30 for rg in ranges)


@pytest.mark.parametrize("backlog, limit, expected", [
    ({"a": 10, "b": 30}, 20, {"a": 5, "b": 15}),
    ({"a": 1, "b": 1, "c": 1}, 2, {"a": 1, "b": 1, "c": 0}),
    ({"a": 5, "b": 0}, 100, {"a": 5, "b": 0}),
    ({"a": 7, "b": 3}, 5, {"a": 4, "b": 1}),
])
def test_share_limit(backlog, limit, expected):
    got = share_limit(backlog, limit)
    assert got == expected and sum(got.values()) == min(limit, sum(backlog.values()))


@settings(max_examples=300, deadline=None)
@given(backlog=st.dictionaries(st.sampled_from("abcdefgh"), st.integers(-3, 40), max_size=8),
       limit=st.integers(1, 60))
def test_share_limit_is_the_largest_remainder_rule(backlog, limit):
    """Model: floor shares of every queue in order, the rounding left to the largest remainders
    (ties: queue order); queues without backlog take part and get 0."""
    total = sum(b for b in backlog.values() if b > 0)
    if total <= limit:
        want = {q: max(b, 0) for q, b in backlog.items()}
    else:
        want, rest = {}, []
        for i, q in enumerate(sorted(backlog)):
            want[q], r = divmod(limit * max(backlog[q], 0), total)
            rest.append((-r, i, q))
        for _, _, q in sorted(rest)[:limit - sum(want.values())]:
            want[q] += 1
    assert share_limit(backlog, limit) == want


def _ranges(parts):
    return sorted((rg.queue_id, rg.start, rg.end) for p in parts for rg in p.ranges)


def test_first_batch_reads_from_the_start_it_was_planned_from(store):
    """Spark asks ``initialOffset`` again when it runs the first batch, and again in a restarted
    process re-running it; meanwhile the group's progress moved. The batch still reads from the
    start it was planned from; the restart leaves out the queue another member read meanwhile."""
    group = dict(consumerGroup="GF", startingOffsets="group", consumeFromWhere="CONSUME_FROM_FIRST_OFFSET")
    r = _reader(store, clientId="first", **group)
    try:
        start = r.initialOffset()
        end = r.plan_latest(start, ReadAllAvailable())
        q0 = next(mq for mq in from_json_dict(start) if mq.queue_id == 0)
        r.group_store.update_offset(q0, 7, increase_only=False)   # another member commits meanwhile
        r.group_store.persist([q0])
        assert r.initialOffset() == start
        assert _ranges(r.plan_partitions(r.initialOffset(), end)) == [(q, 0, 30) for q in range(3)]
    finally:
        r.stop()
    restarted = _reader(store, clientId="restarted", **group)
    try:
        again = restarted.initialOffset()
        assert again != start  # computed anew from the group's progress
        assert _ranges(restarted.plan_partitions(again, end)) == [(q, 0, 30) for q in (1, 2)]
    finally:
        restarted.stop()


def test_compacting_the_plans_keeps_what_a_stopped_query_needs(store, monkeypatch):
    """A query that is down while the others plan on must still find, however long after, the
    plans of its first batch, of the batch it may re-run and of the batch committed before it."""
    import rmq_source.group.session as gs
    monkeypatch.setattr(gs, "_PLANS_KEEP", 3)
    monkeypatch.setattr(gs, "_PLANS_COMPACT_BYTES", 2000)
    group = dict(consumerGroup="GC", startingOffsets="group",
                 consumeFromWhere="CONSUME_FROM_FIRST_OFFSET")
    down, busy = _reader(store, clientId="down", **group), _reader(store, clientId="busy", **group)
    try:
        offsets = [{"T": {"broker-a": {"0": n}}} for n in range(60)]
        mq = next(iter(from_json_dict(offsets[0])))
        down.session.record_plan(offsets[0], offsets[1], {mq}, first=True)
        down.session.record_plan(offsets[1], offsets[2], {mq})
        down.session.record_plan(offsets[2], offsets[3], {mq})
        for n in range(10, 59):
            busy.session.record_plan(offsets[n], offsets[n + 1], set())
        with open(down.session.plans_path) as f:
            assert len(f.readlines()) < 30  # compacted
        assert down.session.first_batch_plan(offsets[1]) == (offsets[0], {mq})
        assert down.session.find_plan(offsets[1], offsets[2]) == (offsets[1], {mq}, False, None)
        assert down.session.find_plan(offsets[2], offsets[3]) == (offsets[2], {mq}, False, None)
        assert busy.session.find_plan(offsets[10], offsets[11]) is None  # dropped
        assert busy.session.find_plan(offsets[58], offsets[59]) == (offsets[58], set(), False, None)
    finally:
        down.stop()
        busy.stop()


def test_plans_of_thousands_of_queues_are_kept_within_half_the_compaction_size(store, monkeypatch):
    """Plans of many queues are large: compacting keeps the newest within half the size limit and
    what a stopped client needs, and the next compaction waits until the file doubled (not one
    at every plan when what must be kept is large)."""
    import rmq_source.group.session as gs
    monkeypatch.setattr(gs, "_PLANS_COMPACT_BYTES", 40_000)
    group = dict(consumerGroup="GB", startingOffsets="group", consumeFromWhere="CONSUME_FROM_FIRST_OFFSET")
    down, busy = _reader(store, clientId="down", **group), _reader(store, clientId="busy", **group)
    try:
        many = {MessageQueue("T", "broker-a", q) for q in range(1000)}     # ~10 KB a plan line
        offsets = [{"T": {"broker-a": {"0": n}}} for n in range(30)]
        down.session.record_plan(offsets[0], offsets[1], many, first=True)
        sizes = []
        for n in range(1, 29):
            busy.session.record_plan(offsets[n], offsets[n + 1], many)
            sizes.append(os.path.getsize(busy.session.plans_path))
        compactions = sum(1 for a, b in zip(sizes, sizes[1:]) if b < a)
        assert 1 <= compactions <= 8 and max(sizes) <= 5 * 40_000   # compacted, not at every plan
        assert down.session.first_batch_plan(offsets[1]) == (offsets[0], many)
        assert busy.session.find_plan(offsets[28], offsets[29]) == (offsets[28], many, False, None)
    finally:
        down.stop()
        busy.stop()


def test_available_now_reads_a_backlog_smaller_than_min_messages(store):
    """minMessagesPerTrigger must not end a Trigger.AvailableNow run with the backlog unread."""
    r = _reader(store, minMessagesPerTrigger="1000", maxTriggerDelay="1h")
    start = r.initialOffset()
    r.prepareForTriggerAvailableNow()
    assert _total(start, r.plan_latest(start, r.getDefaultReadLimit())) == 90


def _drain(r, limit, start=None, max_batches=500):
    """Plan batches until one plans nothing; returns [(start, end)] of the batches."""
    start = r.initialOffset() if start is None else start
    batches = []
    for _ in range(max_batches):
        end = r.plan_latest(start, limit)
        if end == start:
            return batches
        batches.append((start, end))
        start = end
    raise AssertionError(f"still planning after {max_batches} batches")


def _bytes(store, start, end):
    s, e = from_json_dict(start), from_json_dict(end)
    with Store(store) as st:
        return {mq: st.range_bytes(mq.topic, mq.queue_id, s[mq], e[mq]) for mq in e}


@pytest.mark.parametrize("queues, messages, limit", [
    (4, 2, 1_000_000),    # the case: two queues with nothing to read
    (4, 40, 1_000_000),   # catches up, then plans again with every queue idle
    (4, 40, 700),         # idle queues under a small budget
    (1, 0, 1000),         # nothing at all
])
def test_max_bytes_with_idle_queues(tmp_path, queues, messages, limit):
    root = tmp_path / "s"
    build_store(root, topics=(("T", queues, messages),))
    r = _reader(root, maxBytesPerTrigger=str(limit))
    batches = _drain(r, r.getDefaultReadLimit())
    assert sum(_total(s, e) for s, e in batches) == messages
    assert all(sum(_bytes(root, s, e).values()) <= limit for s, e in batches)


@pytest.mark.parametrize("limit", [600, 1000, 2500])
def test_max_bytes_never_overruns_and_is_fair(tmp_path, limit):
    """Under a byte budget every batch stays within the budget, and the budget is shared by
    backlog: at every batch each queue has read its proportional part of what was read, give or
    take three of the largest messages (whole messages only, so shares are rounded)."""
    root = tmp_path / "s"
    build_store(root, topics=(("T", 3, 150),))
    r = _reader(root, maxBytesPerTrigger=str(limit))
    start = r.initialOffset()
    batches = _drain(r, r.getDefaultReadLimit(), start)
    assert sum(_total(s, e) for s, e in batches) == 150
    with Store(root) as st:
        largest = max(int(st.unit_sizes("T", q, 0, 50).max()) for q in range(3))
    total = _bytes(root, start, batches[-1][1])
    for s, e in batches:
        assert sum(_bytes(root, s, e).values()) <= limit
        done = _bytes(root, start, e)
        part = sum(done.values()) / sum(total.values())
        assert all(abs(done[mq] - total[mq] * part) <= 3 * largest for mq in done), (s, e)


def test_max_bytes_admits_one_message_larger_than_the_budget(tmp_path):
    root = tmp_path / "s"
    with StoreWriter(root) as w:
        w.create_topic("T", 2)
        for q in range(2):
            for _ in range(2):
                w.append("T", b"x" * 500, queue_id=q)
    r = _reader(root, maxBytesPerTrigger="300")
    batches = _drain(r, r.getDefaultReadLimit())
    assert [_total(s, e) for s, e in batches] == [1, 1, 1, 1]
    # the queues take turns
    firsts = [next(mq.queue_id for mq, o in from_json_dict(e).items() if o != from_json_dict(s)[mq])
              for s, e in batches]
    assert sorted(firsts[:2]) == [0, 1]


def test_max_messages_is_fair(tmp_path):
    """Each batch shares maxMessagesPerTrigger by backlog: within one message of the exact share."""
    root = tmp_path / "s"
    with StoreWriter(root) as w:
        w.create_topic("T", 3)
        for q, n in enumerate((10, 40, 70)):
            for _ in range(n):
                w.append("T", b"m", queue_id=q)
    r = _reader(root, maxMessagesPerTrigger="12")
    for s, e in _drain(r, r.getDefaultReadLimit()):
        s_, e_ = from_json_dict(s), from_json_dict(e)
        backlog = {mq: {0: 10, 1: 40, 2: 70}[mq.queue_id] - s_[mq] for mq in s_}
        total = sum(backlog.values())
        assert sum(e_[mq] - s_[mq] for mq in s_) == min(12, total)
        for mq in s_:
            assert abs((e_[mq] - s_[mq]) - min(12, total) * backlog[mq] / total) < 1


# -- data loss at the edges ---------------------------------------------------------------------

def _retained_store(root):
    """The issue's store: one queue, 16 KiB CommitLog files, 10 units per ConsumeQueue file; 10
    messages read (returned: the checkpoint's offsets), then 290 appended and the oldest CommitLog
    file deleted by retention. Returns (start offsets, min offset after retention)."""
    with StoreWriter(root, commitlog_file_size=16 * 1024, cq_units_per_file=10) as w:
        w.create_topic("T", 1)
        for i in range(10):
            w.append("T", b"b" * 200, queue_id=0)
        for i in range(290):
            w.append("T", b"b" * 200, queue_id=0)
        w.delete_oldest_commitlog_files(1)
    with Store(root) as s:
        low = s.min_offset("T", 0)
    assert low > 10
    return {"T": {"broker-a": {"0": 10}}}, low


def _lost(caplog):
    return [r.rmq_lost for r in caplog.records if hasattr(r, "rmq_lost")]


@pytest.mark.parametrize("limit", [
    {"maxBytesPerTrigger": "2000"}, {"maxMessagesPerTrigger": "5"}, {},
])
def test_retention_overtaking_a_stopped_query_is_skipped_once(tmp_path, caplog, limit):
    root = tmp_path / "s"
    start, low = _retained_store(root)
    r = _reader(root, failOnDataLoss="false", **limit)
    caplog.set_level(logging.WARNING, logger="rmq_source")
    first = r.plan_latest(start, r.getDefaultReadLimit())
    assert from_json_dict(first)[next(iter(from_json_dict(first)))] > low  # past the loss at once
    parts = r.plan_partitions(start, first)
    assert [(rg.start, rg.end) for p in parts for rg in p.ranges] == [
        (low, from_json_dict(first)[next(iter(from_json_dict(first)))])]
    rest = _drain(r, r.getDefaultReadLimit(), first)
    assert _total(start, rest[-1][1] if rest else first) == 290
    (mq, lo, hi), = _lost(caplog)  # reported once, exactly
    assert (lo, hi) == (10, low)


@pytest.mark.parametrize("limit", [
    {"maxBytesPerTrigger": "2000"}, {"maxMessagesPerTrigger": "5"}, {},
])
def test_retention_overtaking_a_stopped_query_fails_exactly(tmp_path, limit):
    root = tmp_path / "s"
    start, low = _retained_store(root)
    r = _reader(root, **limit)
    with pytest.raises(RmqDataLossError, match=rf"offsets \[10, {low}\) \({low - 10} messages\)"):
        r.plan_latest(start, r.getDefaultReadLimit())


def _replace_store(root, messages):
    shutil.rmtree(root)
    build_store(root, topics=(("T", 1, messages),), start_ts=1_800_000_000_000)


@pytest.mark.parametrize("fail", [True, False])
def test_recreated_store_continues_at_its_earliest_offset(tmp_path, caplog, fail):
    """The store is re-created below the query's position (issue 14 item 4): continue at its min
    offset, not at its max; a re-run of the batch reads the same range."""
    root = tmp_path / "s"
    build_store(root, topics=(("T", 1, 100),))
    r = _reader(root, failOnDataLoss=str(fail).lower())
    start = r.plan_latest(r.initialOffset(), ReadAllAvailable())
    assert _total(r.initialOffset(), start) == 100
    _replace_store(root, 10)
    caplog.set_level(logging.WARNING, logger="rmq_source")
    if fail:
        with pytest.raises(RmqDataLossError, match=r"offset 100 is beyond the queue's max offset 10:"):
            r.plan_latest(start, ReadAllAvailable())
        return
    end = r.plan_latest(start, ReadAllAvailable())
    assert from_json_dict(end) == {mq: 10 for mq in from_json_dict(start)}
    assert "continuing from its earliest available offset 0" in caplog.text
    with StoreWriter(root) as w:  # more arrive before the batch runs (or is re-run)
        append_messages(w, "T", 100, start_ts=1_800_001_000_000)
    for again in range(2):
        assert _ranges(r.plan_partitions(start, end)) == [(0, 0, 10)]
    later = r.plan_latest(end, ReadAllAvailable())
    assert _ranges(r.plan_partitions(end, later)) == [(0, 10, 110)]


@pytest.mark.parametrize("option, value", [
    ("startingOffsets", '{"T": {"broker-a": {"0": 0, "1": 0, "2": 0, "3": 0}}}'),
    ("startingOffsets", '{"T": {"broker-a": {"7": -2}}}'),
])
def test_offsets_json_naming_a_queue_the_topic_lacks_is_refused(store, option, value):
    r = _reader(store, **{option: value})
    with pytest.raises(RmqUnknownTopicError, match=r"option startingOffsets: queue T/broker-a/\d is "
                                                   r"not a queue this query reads.*\[0, 1, 2\]"):
        r.initialOffset()


def test_batch_ending_offsets_naming_a_queue_the_topic_lacks_is_refused(store):
    from rmq_source.spark.batch_reader import plan_batch
    opts = parse_options({"storePath": str(store), "topic": "T",
                          "endingOffsets": '{"T": {"broker-a": {"0": 5, "3": 5}}}'},
                         streaming=False)
    with pytest.raises(RmqUnknownTopicError, match=r"option endingOffsets: queue T/broker-a/3"):
        plan_batch(opts)


@pytest.mark.parametrize("fail", [True, False])
def test_batch_read_from_beyond_a_recreated_queue_starts_at_its_min(store, caplog, fail):
    """A batch read whose start lies beyond a queue's max (the store was re-created since the
    group's progress was recorded) fails, or continues at the queue's earliest offset."""
    from rmq_source.spark.batch_reader import plan_batch
    opts = parse_options({"storePath": str(store), "topic": "T",
                          "failOnDataLoss": str(fail).lower(),
                          "startingOffsets": '{"T": {"broker-a": {"0": 100, "1": 5, "2": 0}}}'},
                         streaming=False)
    if fail:
        with pytest.raises(RmqDataLossError,
                           match=r"offset 100 is beyond the queue's max offset 30:"):
            plan_batch(opts)
        return
    parts = plan_batch(opts)
    assert _ranges(parts) == [(0, 0, 30), (1, 5, 30), (2, 0, 30)]
    assert "continuing from its earliest available offset 0" in caplog.text


class _ByTime:
    """A backend that only answers offsets by time (group_start asks nothing else)."""

    @staticmethod
    def offset_for_timestamp(mq, ts, *, info=None):
        return 7


@pytest.mark.parametrize("topic,where,want", [
    ("T", "CONSUME_FROM_LAST_OFFSET", 20), ("T", "CONSUME_FROM_FIRST_OFFSET", 5),
    ("T", "CONSUME_FROM_TIMESTAMP", 7),
    # a retry topic: what waits there was sent back before this member came (computePullFromWhere)
    ("%RETRY%G", "CONSUME_FROM_LAST_OFFSET", 5), ("%RETRY%G", "CONSUME_FROM_FIRST_OFFSET", 5),
    ("%RETRY%G", "CONSUME_FROM_TIMESTAMP", 20),
])
def test_a_queue_without_group_progress_starts_where_rocketmq_clients_start(tmp_path, topic, where, want):
    from rmq_source.backend import QueueInfo
    from rmq_source.group.allocation import MessageQueue
    from rmq_source.spark.positions import group_start
    opts = parse_options({"storePath": str(tmp_path), "topic": "T", "consumerGroup": "G",
                          "consumeFromWhere": where, **({"consumeTimestamp": "20240101000000"}
                                                        if where == "CONSUME_FROM_TIMESTAMP" else {})},
                         streaming=True)
    info = QueueInfo(topic, 0, 5, 20)
    assert group_start(_ByTime(), MessageQueue(topic, "broker-a", 0), info, opts, None) == want


def test_starting_offsets_by_timestamp_per_queue(store):
    """startingOffsetsByTimestamp: each queue from its first message stored at or after its own
    timestamp; one before every message starts at the min, one after them all at the end."""
    with Store(store) as s:
        stamps = [t // 1000 for t in s.read("T", 0, 0, 30).column("storeTimestamp").cast("int64").to_pylist()]
    mid = stamps[17]
    r = _reader(store, startingOffsetsByTimestamp='{"T":{"broker-a":{"0":%d,"1":0,"2":9999999999999}}}' % mid)
    start = from_json_dict(r.initialOffset())
    by_queue = {mq.queue_id: offset for mq, offset in start.items()}
    assert by_queue == {0: next(i for i, t in enumerate(stamps) if t >= mid), 1: 0, 2: 30}
    missing = _reader(store, startingOffsetsByTimestamp='{"T":{"broker-a":{"0":1}}}')
    with pytest.raises(RmqOptionError, match="startingOffsetsByTimestamp: no timestamp given for .*T/broker-a/1"):
        missing.initialOffset()


def test_skip_lost_moves_only_lost_starts_and_lets_a_slaves_queues_wait(store, caplog):
    """Planning moves a start the store no longer has to its min (failOnDataLoss=false), leaves
    starts inside the queue alone whoever answered, and a start only a slave cannot place waits
    for the master (warned once, again only after the master answered in between)."""
    from rmq_source.backend import QueueInfo
    r = _reader(store, failOnDataLoss="false")
    q = [MessageQueue("T", "broker-a", i) for i in range(4)]
    starts = {q[0]: 5, q[1]: 5, q[2]: 2, q[3]: 1}
    infos = {q[0]: QueueInfo("T", 0, 0, 9), q[1]: QueueInfo("T", 1, 3, 9, "slave:1"),
             q[2]: QueueInfo("T", 2, 4, 9, "slave:1"), q[3]: QueueInfo("T", 3, 3, 9)}
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            out = r._skip_lost(starts, set(q), infos)
            assert out == {q[0]: 5, q[1]: 5, q[2]: 2, q[3]: 3}
            assert r._waits_for_master == {q[2]}
        assert sum("waits for the master" in m for m in caplog.messages) == 1
        infos[q[2]] = QueueInfo("T", 2, 0, 9)                # its master answers again
        assert r._skip_lost(starts, set(q), infos)[q[2]] == 2 and not r._waits_for_master
        infos[q[2]] = QueueInfo("T", 2, 4, 9, "slave:1")     # and goes again: warned again
        r._skip_lost(starts, set(q), infos)
        assert sum("waits for the master" in m for m in caplog.messages) == 2


@pytest.mark.parametrize("call", ["latestOffset", "partitions", "reportLatestOffset"])
@pytest.mark.parametrize("fails", [False, True])
def test_the_collector_is_paused_while_the_driver_plans_and_restored_after(store, monkeypatch,
                                                                          call, fails):
    """Spark's driver-side calls run with the cyclic collector paused (gc_pause: per-queue
    objects of a planning would be promoted and set off full collections), and leave it as they
    found it, also when they fail; a caller's own gc.disable() stands."""
    import gc
    from rmq_source.spark import stream_reader

    r = _reader(store, consumerGroup="G", offsetStorePath=str(store / "offsets"))
    start = r.initialOffset()
    end = r.latestOffset(start, r.getDefaultReadLimit())
    seen = []

    def watched(real):
        def run(*args, **kwargs):
            seen.append(gc.isenabled())
            if fails:
                raise RmqOptionError("made to fail")
            return real(*args, **kwargs)
        return run
    monkeypatch.setattr(stream_reader, "from_json_dict", watched(stream_reader.from_json_dict))
    monkeypatch.setattr(stream_reader, "to_json_dict", watched(stream_reader.to_json_dict))
    calls = {"latestOffset": lambda: r.latestOffset(end, r.getDefaultReadLimit()),
             "partitions": lambda: r.partitions(start, end),
             "reportLatestOffset": r.reportLatestOffset}
    try:
        for caller_enabled in (True, False):
            (gc.enable if caller_enabled else gc.disable)()
            seen.clear()
            try:
                calls[call]()
            except RmqOptionError:
                assert fails
            assert seen and not any(seen), seen
            assert gc.isenabled() is caller_enabled
    finally:
        gc.enable()
        r.stop()


@pytest.mark.parametrize("to_the_end", [True, False])
def test_a_task_reads_with_the_collector_paused_and_leaves_it_as_found(store, to_the_end):
    """A task's read runs with the cyclic collector paused (its per-pull objects die by reference
    counting) and leaves it as it found it, read to the end or closed half-way by Spark."""
    import gc

    r = _reader(store)
    start = r.initialOffset()
    parts = r.partitions(start, r.latestOffset(start, r.getDefaultReadLimit()))
    try:
        for caller_enabled in (True, False):
            (gc.enable if caller_enabled else gc.disable)()
            rows = r.read(parts[0])
            next(rows)
            assert not gc.isenabled()
            if to_the_end:
                for _ in rows:
                    assert not gc.isenabled()
            else:
                rows.close()
            assert gc.isenabled() is caller_enabled
    finally:
        gc.enable()
        r.stop()


def test_a_task_freezes_what_outlives_tasks_once_there_is_much_of_it(store):
    """PySpark's worker daemon runs a full collection after every task; a task of the rmq source
    first moves what the worker holds out of the collector's reach when the oldest generation
    holds FREEZE_FROM objects or more: the start-up modules at the first task, then only after
    that many more have stayed (a module a task imported), also in a forked worker; outside a
    Spark task (no TaskContext: a test, a script) nothing."""
    script = textwrap.dedent(f"""
        import gc, os
        from pyspark import TaskContext
        from rmq_source.spark.compat import ReadAllAvailable
        from rmq_source.spark.datasource import RocketMQDataSource
        from rmq_source.spark.gc_pause import FREEZE_FROM

        def read_all():
            r = RocketMQDataSource({{"storePath": {str(store)!r}, "topic": "T",
                                     "startingOffsets": "earliest"}}).streamReader(None)
            start = r.initialOffset()
            end = r.latestOffset(start, ReadAllAvailable())
            return sum(b.num_rows for p in r.partitions(start, end) for b in r.read(p))

        def kept(n):        # objects that outlive a task, promoted as the daemon's collection does
            out = [[i] for i in range(n)]
            gc.collect()
            return out
        rows = read_all()                      # no task: nothing frozen
        before = gc.get_freeze_count()
        TaskContext._getOrCreate()             # as in a PySpark worker's task
        read_all()
        first = gc.get_freeze_count()
        few = kept(FREEZE_FROM // 10)            # fewer than FREEZE_FROM: left to the collector
        read_all()
        again = gc.get_freeze_count()
        many = kept(FREEZE_FROM)                 # as many: frozen by the next task
        read_all()
        more = gc.get_freeze_count()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            child_kept = kept(FREEZE_FROM)
            read_all()
            os.write(w, str(gc.get_freeze_count()).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        child = int(os.read(r, 64))
        # (a frozen object freed by reference counting leaves the count: it can only go down)
        print(rows, before, first > 5000, again <= first, more >= again + FREEZE_FROM,
              child >= more + FREEZE_FROM)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["90", "0", "True", "True", "True", "True"]
