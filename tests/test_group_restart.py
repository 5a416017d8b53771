"""A group query restarted in a new process (a new client id), driven directly (no Spark): the
re-run of the logged batch takes its locks through the group's rules, and a Trigger.AvailableNow
restart does not end while a dead member still has queues below the target.

A "dead" reader is one whose renewal thread is stopped without unlocking or leaving the group, as
a process killed with SIGKILL leaves it. Real kill -9 runs are in test_fault_restart_matrix.py.
"""
from __future__ import annotations

import logging
import time

import pytest
from rmq_source.spark.compat import ReadAllAvailable

from rmq_source.group.locks import find_lock_overlaps, read_history
from rmq_source.spark.partition_reader import check_task_locks
from rmq_source.group.offset_store import ReadOffsetType
from rmq_source.spark.offsets import from_json_dict
from rmq_source.spark.options import parse_options
from rmq_source.spark.stream_reader import RmqStreamReader
from store_builder import build_store

LEASE_MS = 1500
GROUP = dict(consumerGroup="GR", lockLeaseMs=str(LEASE_MS), clientLockLeaseMs="1000",
             lockRenewIntervalMs="300")


@pytest.fixture()
def store(tmp_path):
    root = tmp_path / "store"
    build_store(root, topics=(("T", 4, 80),))
    return root


def _reader(store, client, **options):
    opts = {"storePath": str(store), "topic": "T", "startingOffsets": "earliest", "clientId": client,
            **GROUP, **options}
    return RmqStreamReader(parse_options(opts, streaming=True))


def _die(reader) -> None:
    """What SIGKILL leaves of a query: its locks and membership, renewed no more."""
    reader.session._renewer.stop()
    reader.session._renewer = None


def _ranges(parts):
    return sorted((rg.queue_id, rg.start, rg.end) for p in parts for rg in p.ranges)


def _rows(reader, parts) -> list[tuple[int, int]]:
    out = []
    for p in parts:
        for batch in reader.read(p):
            out += zip(batch.column("queueId").to_pylist(), batch.column("queueOffset").to_pylist())
    return out


def test_rerun_of_a_logged_batch_waits_out_the_dead_holders_lease(store):
    dead = _reader(store, "dead")
    start = dead.initialOffset()
    end = dead.latestOffset(start, ReadAllAvailable())
    planned = _ranges(dead.partitions(start, end))
    assert planned == [(q, 0, 20) for q in range(4)]
    _die(dead)
    died_at = time.time()

    restarted = _reader(store, "restarted")
    try:
        parts = restarted.partitions(start, end)   # Spark re-runs the logged batch, no latestOffset
        waited = time.time() - died_at
        assert _ranges(parts) == planned
        assert waited >= LEASE_MS / 1000 - 0.5   # the dead holder's lease ran out first
        for p in parts:
            check_task_locks(p)                     # the tasks find the locks held by the new client
        assert sorted(_rows(restarted, parts)) == [(q, o) for q in range(4) for o in range(20)]
        history = read_history(restarted.session.state_dir, "GR")
        assert find_lock_overlaps(history) == []
        takeovers = {r["queue"] for r in history
                     if r["action"] == "expire-takeover" and r["client"] == "restarted"}
        assert len(takeovers) == 4
        # the next planning records the re-run batch's progress for exactly the queues it read
        restarted.latestOffset(end, ReadAllAvailable())
        progress = restarted.group_store.read_offsets(list(from_json_dict(end)),
                                                      ReadOffsetType.READ_FROM_STORE)
        assert set(progress.values()) == {20}
    finally:
        restarted.stop()


def test_rerun_leaves_a_queue_that_a_live_member_holds(store):
    dead = _reader(store, "dead")
    start = dead.initialOffset()
    end = dead.latestOffset(start, ReadAllAvailable())
    _die(dead)
    time.sleep(LEASE_MS / 1000 + 0.2)
    live = _reader(store, "live")
    mq1 = next(mq for mq in from_json_dict(start) if mq.queue_id == 1)
    try:
        assert live.session.view.lock_all([mq1]) == {mq1}
        with live.session._mutex:
            live.session._held = {mq1}             # renewed by its running renewal thread
        restarted = _reader(store, "restarted")
        try:
            parts = restarted.partitions(start, end)
            assert _ranges(parts) == [(0, 0, 20), (2, 0, 20), (3, 0, 20)]
            assert live.session.locks.owner(mq1) == "live"
            restarted.latestOffset(end, ReadAllAvailable())
            progress = restarted.group_store.read_offsets(list(from_json_dict(end)),
                                                          ReadOffsetType.READ_FROM_STORE)
            assert progress[mq1] == -1 or progress[mq1] < 20   # not moved past what nobody read
            assert {mq.queue_id: o for mq, o in progress.items() if mq != mq1} == {0: 20, 2: 20, 3: 20}
        finally:
            restarted.stop()
    finally:
        live.stop()


@pytest.mark.parametrize("orderly", ["true", "false"])
def test_available_now_restart_reads_the_dead_members_queues(store, orderly):
    """The dead run is still a member, and holds its locks, when the restart plans: the restart
    must not end with only its own share read (nor with nothing, its own queues being locked)."""
    dead = _reader(store, "dead", orderly=orderly, maxMessagesPerTrigger="40")
    limit = dead.getDefaultReadLimit()
    start = dead.initialOffset()
    end = dead.latestOffset(start, limit)              # batch 0: 10 messages of each queue
    dead.partitions(start, end)
    dead.commit(end)
    dead.latestOffset(end, limit)                      # batch 1 planned, not logged; then killed
    _die(dead)

    restarted = _reader(store, "restarted", orderly=orderly, maxMessagesPerTrigger="40")
    restarted.prepareForTriggerAvailableNow()
    seen = []
    began = time.time()
    try:
        start = end
        for _ in range(50):                            # as Spark drives an AvailableNow run
            end = restarted.latestOffset(start, limit)
            if end == start:
                break
            seen += _rows(restarted, restarted.partitions(start, end))
            start = end
        assert end == start, "the run did not end"
    finally:
        restarted.stop()
    assert sorted(seen) == [(q, o) for q in range(4) for o in range(10, 20)]
    assert time.time() - began < 3 * LEASE_MS / 1000 + 5


@pytest.mark.parametrize("starting, progress_before, other_reads, read_again", [
    # the start is the group's progress: what another member read since is not read again
    ("group", None, True, []),
    ("group", None, False, [(q, 0, 20) for q in range(4)]),
    # the start was forced below the group's progress: re-run as planned unless the group moved
    ("earliest", 10, False, [(q, 0, 20) for q in range(4)]),
    ("earliest", 10, True, []),
])
def test_a_stopped_first_batch_rerun_leaves_out_what_another_member_read(
        store, caplog, starting, progress_before, other_reads, read_again):
    """A query stopped cleanly after Spark logged its first batch and before it committed it (its
    locks released, as query.stop() does); another member then reads its queues from the group's
    progress and commits. The restart (same client id) re-runs the logged batch: a queue the
    group moved past the batch's start, or past the progress a forced start was planned under,
    was read by the other member and is left out; one nobody read is read as planned."""
    if progress_before is not None:
        setter = _reader(store, "setter")
        mqs = list(from_json_dict(setter.initialOffset()))
        for mq in mqs:
            setter.group_store.update_offset(mq, progress_before, increase_only=False)
        setter.group_store.persist(mqs)
        setter.stop()
    caplog.set_level(logging.WARNING, logger="rmq_source")
    starting = dict(startingOffsets=starting, **({"consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET"}
                                                  if starting == "group" else {}))
    first = _reader(store, "a", **starting)
    start = first.initialOffset()
    end = first.latestOffset(start, ReadAllAvailable())
    assert _ranges(first.partitions(start, end)) == [(q, 0, 20) for q in range(4)]
    first.stop()                                     # stopped between logging and committing
    other_to = None
    if other_reads:
        other = _reader(store, "b", startingOffsets="group", maxMessagesPerTrigger="28",
                        consumeFromWhere="CONSUME_FROM_FIRST_OFFSET")
        try:
            o_start = other.initialOffset()
            o_end = other.latestOffset(o_start, other.getDefaultReadLimit())   # 7 of each queue
            got = sorted(_rows(other, other.partitions(o_start, o_end)))
            other_to = (progress_before or 0) + 7
            assert got == [(q, o) for q in range(4) for o in range(progress_before or 0, other_to)]
            other.commit(o_end)
            other.latestOffset(o_end, other.getDefaultReadLimit())   # writes the group's progress
        finally:
            other.stop()
    restarted = _reader(store, "a", **starting)
    try:
        parts = restarted.partitions(restarted.initialOffset(), end)
        assert _ranges(parts) == read_again
        if other_reads:
            assert "another member read it" in caplog.text
        restarted.latestOffset(end, ReadAllAvailable())
        progress = restarted.group_store.read_offsets(list(from_json_dict(end)),
                                                      ReadOffsetType.READ_FROM_STORE)
        # (the other member's progress stays: the query reads on from there in its next batch)
        assert set(progress.values()) == {other_to if other_reads else 20}
    finally:
        restarted.stop()


@pytest.mark.parametrize("past, read", [
    (None, ["T|broker-a|0"]),                # a plan of an older version
    ("7", ["T|broker-a|0"]),
    ([7, 8], ["T|broker-a|0"]),              # not one per queue read
    ([True], ["T|broker-a|0"]),
    (["7"], ["T|broker-a|0"]),
    ([7.0], ["T|broker-a|0"]),
    ([7], "T|broker-a|0"),
])
def test_a_damaged_past_in_a_plan_is_not_used(past, read):
    """A first batch's plan whose "past" offsets are absent or damaged: none (the re-run reads as
    planned, as before they were recorded), never an error or a wrong queue."""
    from rmq_source.group.session import _past_of
    rec = {"read": read} if past is None else {"read": read, "past": past}
    assert _past_of(rec) is None
    from rmq_source.group.allocation import MessageQueue
    assert _past_of({"read": ["T|broker-a|0", "T|broker-b|3"], "past": [7, -1]}) == {
        MessageQueue("T", "broker-a", 0): 7, MessageQueue("T", "broker-b", 3): -1}


@pytest.mark.parametrize("change", [
    lambda o: o["T"]["broker-a"].__setitem__("0", 8),          # an offset moved in place
    lambda o: o["T"]["broker-a"].__setitem__("1", 0),          # a queue added
    lambda o: o["T"].__setitem__("broker-b", {"0": 1}),        # a broker added
    lambda o: o.__setitem__("U", []),                          # a list put in, then changed
])
def test_a_plan_key_follows_offsets_changed_after_it_was_made(change):
    """plan_key keeps its last keys with a copy of their offsets: offsets changed in place after
    a key was made get their own key, never the remembered one."""
    import json
    from rmq_source.group.session import plan_key

    start, end = {"T": {"broker-a": {"0": 3}}}, {"T": {"broker-a": {"0": 7}, "x": [1, {"y": 2}]}}
    before = plan_key(start, end)
    for offsets in (start, end):
        change(offsets)
        if "U" in offsets:
            offsets["U"].append(1)
        fresh = plan_key(json.loads(json.dumps(start)), json.loads(json.dumps(end)))
        assert plan_key(start, end) == fresh != before
        before = fresh
    end["T"]["x"][1]["y"] = 3                                 # deep inside a list
    assert plan_key(start, end) != before
    # the key plans of earlier versions were recorded under: the hash of [start, end]'s JSON
    import hashlib
    assert plan_key(start, end) == hashlib.sha256(json.dumps(
        [start, end], sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def test_plan_records_are_the_same_whatever_a_session_kept_from_the_last_one(tmp_path):
    """A session keeps the last plan's queues in key order (batch after batch reads the same
    thousands of queues) and takes a batch's start by queue when the planning has it: every
    record is what a session that kept nothing writes from the Spark offsets alone."""
    import json
    from types import SimpleNamespace
    from rmq_source.group.allocation import MessageQueue
    from rmq_source.group.session import GroupSession
    from rmq_source.spark.offsets import to_json_dict

    def session(where):
        opts = SimpleNamespace(consumer_group="G", client_id="A", offset_store_path=str(where),
                               orderly=False, lock_lease_ms=60_000, client_lock_lease_ms=30_000,
                               allocate_strategy="AVG", subscription=SimpleNamespace(expression="*"),
                               nearby_inner_strategy=None, virtual_node_count=None, topics=("T",),
                               topic_pattern=None, assign=None)
        return GroupSession(opts, strategy=None, group_store=None)

    mqs = [MessageQueue.of("T", b, q) for b in ("broker-b", "broker-a") for q in (10, 2, 0)]
    a, b, c = set(mqs[:3]), set(mqs[2:]), set(mqs[3:])      # (c: as many queues as a)
    kept = session(tmp_path / "kept")
    lines = []
    for n, read in enumerate([a, a, b, set(a), c, a | b, set(), a, a]):
        start = {mq: 5 * n + mq.queue_id for mq in mqs}
        start_json, end_json = to_json_dict(start), to_json_dict({mq: o + 1 for mq, o in start.items()})
        kept.record_plan(start_json, end_json, read, first=n == 0, start_offsets=start)
        fresh = session(tmp_path / f"fresh{n}")
        fresh.record_plan(start_json, end_json, set(read), first=n == 0)
        lines.append(fresh._plan_lines()[-1])
    assert kept._plan_lines() == lines
    assert [json.loads(line)["read"] for line in lines[2:4]] == [
        ["T|broker-a|0", "T|broker-a|10", "T|broker-a|2", "T|broker-b|0"],
        ["T|broker-b|0", "T|broker-b|10", "T|broker-b|2"]]


def test_a_lock_lost_under_a_running_query_is_not_trusted_by_its_next_planning(store):
    """A broker that restarts loses its lock table and another client may take a queue there. The
    next planning must neither commit that queue's planned range nor plan it again on its own
    view's trust (the renewal, every 20 s here, has not run since)."""
    slow = dict(lockLeaseMs="60000", clientLockLeaseMs="30000", lockRenewIntervalMs="20000")
    r = _reader(store, "a", maxMessagesPerTrigger="8", **slow)
    try:
        limit = r.getDefaultReadLimit()
        start = r.initialOffset()
        end = r.latestOffset(start, limit)                    # 2 messages of each queue
        q0 = next(mq for mq in from_json_dict(start) if mq.queue_id == 0)
        locks = r.session.locks
        assert locks.unlock_batch([q0], "a") and locks.try_lock_batch([q0], "b") == {q0}
        # (its tasks find q0 refused: a broker's tasks leave it out, a store's fail the batch)
        r.commit(end)
        end2 = r.latestOffset(end, limit)
        progress = r.group_store.read_offsets([q0], ReadOffsetType.READ_FROM_STORE)
        assert progress.get(q0, -1) <= 0                       # its planned range not committed
        assert q0 not in r.session.find_plan(end, end2).read    # nor planned again
        assert locks.owner(q0) == "b"
    finally:
        r.stop()
