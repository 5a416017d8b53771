"""The streaming reader's offset logic, driven directly (no Spark session): admission control,
Trigger.AvailableNow targets, reported lag, planning of partitions."""
from __future__ import annotations

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxRows, ReadMinRows

from rmq_source.offsets import from_json_dict
from rmq_source.options import parse_options
from rmq_source.planner import share_limit
from rmq_source.store import Store
from rmq_source.stream_reader import RmqStreamReader
from rmq_source.writer import StoreWriter
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
        end = r.latestOffset(start, r.getDefaultReadLimit())
        n = _total(start, end)
        if n == 0:
            break
        assert n <= 20
        seen += n
        start = end
    assert seen == 90
    # the engine's ReadAllAvailable (e.g. Trigger.Once) ignores the option
    assert _total(r.initialOffset(), r.latestOffset(r.initialOffset(), ReadAllAvailable())) == 90


def test_max_bytes_admits_whole_messages_within_the_budget(store):
    r = _reader(store, maxBytesPerTrigger="4000")
    assert r.getDefaultReadLimit() == ReadMaxBytes(4000)
    start = r.initialOffset()
    end = r.latestOffset(start, r.getDefaultReadLimit())
    with Store(store) as s:
        used = sum(s.range_bytes(mq.topic, mq.queue_id, o, from_json_dict(end)[mq])
                   for mq, o in from_json_dict(start).items())
    assert 0 < used <= 4000 + 3 * 600  # at most one message over per queue (each queue admits one)
    assert _total(start, end) < 90


def test_min_messages_waits_until_the_delay(store, monkeypatch):
    r = _reader(store, startingOffsets="latest", minMessagesPerTrigger="10", maxTriggerDelay="1h")
    assert r.getDefaultReadLimit() == ReadMinRows(10)
    start = r.initialOffset()
    with StoreWriter(store) as w:
        append_messages(w, "T", 5, start_ts=1_700_009_000_000)
    assert r.latestOffset(start, r.getDefaultReadLimit()) == start  # 5 < 10: wait
    r._last_batch_at -= 3601  # the delay has passed
    assert _total(start, r.latestOffset(start, r.getDefaultReadLimit())) == 5


def test_available_now_stops_at_the_target_and_lag_is_reported(store):
    r = _reader(store)
    start = r.initialOffset()
    r.prepareForTriggerAvailableNow()
    with StoreWriter(store) as w:
        append_messages(w, "T", 12, start_ts=1_700_009_000_000)
    end = r.latestOffset(start, ReadAllAvailable())
    assert _total(start, end) == 90  # not the 12 appended after the target was taken
    latest = r.reportLatestOffset()
    assert _total(end, latest) == 12  # the lag Spark shows in the query progress


def test_partitions_one_task_per_queue_in_order(store):
    r = _reader(store, numPartitions="2")
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())
    parts = r.partitions(start, end)
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


def _ranges(parts):
    return sorted((rg.queue_id, rg.start, rg.end) for p in parts for rg in p.ranges)


def test_first_batch_reads_from_the_start_it_was_planned_from(store):
    """Spark asks ``initialOffset`` again when it runs the first batch, and again in a restarted
    process re-running it; meanwhile the group's progress moved. The batch still reads from the
    start it was planned from."""
    group = dict(consumerGroup="GF", startingOffsets="group", consumeFromWhere="CONSUME_FROM_FIRST_OFFSET")
    r = _reader(store, clientId="first", **group)
    try:
        start = r.initialOffset()
        end = r.latestOffset(start, ReadAllAvailable())
        for mq in from_json_dict(start):  # another member of the group commits meanwhile
            r.group_store.update_offset(mq, 7, increase_only=False)
        r.group_store.persist(list(from_json_dict(start)))
        assert r.initialOffset() == start
        assert _ranges(r.partitions(r.initialOffset(), end)) == [(q, 0, 30) for q in range(3)]
    finally:
        r.stop()
    restarted = _reader(store, clientId="restarted", **group)
    try:
        again = restarted.initialOffset()
        assert again != start  # computed anew from the group's progress
        assert _ranges(restarted.partitions(again, end)) == [(q, 0, 30) for q in range(3)]
    finally:
        restarted.stop()


def test_compacting_the_plans_keeps_what_a_stopped_query_needs(store, monkeypatch):
    """A query that is down while the others plan on must still find, however long after, the
    plans of its first batch, of the batch it may re-run and of the batch committed before it."""
    import rmq_source.group_session as gs
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
        assert down.session.find_plan(offsets[1], offsets[2]) == (offsets[1], {mq}, False)
        assert down.session.find_plan(offsets[2], offsets[3]) == (offsets[2], {mq}, False)
        assert busy.session.find_plan(offsets[10], offsets[11]) is None  # dropped
        assert busy.session.find_plan(offsets[58], offsets[59]) == (offsets[58], set(), False)
    finally:
        down.stop()
        busy.stop()


def test_available_now_reads_a_backlog_smaller_than_min_messages(store):
    """minMessagesPerTrigger must not end a Trigger.AvailableNow run with the backlog unread."""
    r = _reader(store, minMessagesPerTrigger="1000", maxTriggerDelay="1h")
    start = r.initialOffset()
    r.prepareForTriggerAvailableNow()
    assert _total(start, r.latestOffset(start, r.getDefaultReadLimit())) == 90
