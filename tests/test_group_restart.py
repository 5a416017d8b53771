"""A group query restarted in a new process (a new client id), driven directly (no Spark): the
re-run of the logged batch takes its locks through the group's rules, and a Trigger.AvailableNow
restart does not end while a dead member still has queues below the target.

A "dead" reader is one whose renewal thread is stopped without unlocking or leaving the group, as
a process killed with SIGKILL leaves it. Real kill -9 runs are in test_fault_restart_matrix.py.
"""
from __future__ import annotations

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
