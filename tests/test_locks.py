"""Queue lock manager: single-process semantics with an injected clock, client lease rule, renewal
thread, and real multi-process races / kill -9 with the real clock (short leases)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import require
from rmq_source.errors import RmqLockError, RmqOptionError
from rmq_source.group.allocation import MessageQueue
from rmq_source.group.locks import (ClientLockView, LockEntry, LockRenewer, ProcessQueueLock,
                                    QueueLockManager,
                                    find_lock_overlaps, parse_queue_key, queue_key, read_history)
from rmq_source.group.statefile import CLOCK_SKEW_ALLOWANCE_MS

REPO = Path(__file__).resolve().parents[1]
GROUP = "GID_orderly"
LEASE = 1000


class FakeClock:
    """Seconds clock driven by the test; ``step_ms`` advances it on every read."""

    def __init__(self, ms: int = 0, step_ms: int = 0):
        self.ms = ms
        self.step_ms = step_ms

    def __call__(self) -> float:
        now = self.ms
        self.ms += self.step_ms
        return now / 1000


@dataclass(frozen=True)
class MQ:  # shape of rmq_source.group.allocation.MessageQueue
    topic: str
    broker_name: str
    queue_id: int


def q(i: int) -> tuple[str, str, int]:
    return ("TopicOrder", "broker-a", i)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000_000)


@pytest.fixture
def mgr(tmp_path, clock) -> QueueLockManager:
    return QueueLockManager(tmp_path, GROUP, lease_ms=LEASE, clock=clock)


# --------------------------------------------------------------------------------------------
# Semantics table: (ms after start, operation, client, queue ids, expected returned queue ids)

SCENARIOS = {
    "free queue is taken": (
        [(0, "lock", "A", [0], {0})], {0: "A"}, ["lock"]),
    "owner renews": (
        [(0, "lock", "A", [0], {0}), (900, "lock", "A", [0], {0})], {0: "A"}, ["lock", "renew"]),
    "other live owner is excluded": (
        [(0, "lock", "A", [0], {0}), (500, "lock", "B", [0], set())], {0: "A"}, ["lock"]),
    "exactly one lease old is still live": (
        [(0, "lock", "A", [0], {0}), (LEASE, "lock", "B", [0], set())], {0: "A"}, ["lock"]),
    "expired lock is taken over": (
        [(0, "lock", "A", [0], {0}), (LEASE + 1, "lock", "B", [0], {0})], {0: "B"},
        ["lock", "expire-takeover"]),
    "batch takes only what is free": (
        [(0, "lock", "A", [0], {0}), (10, "lock", "B", [0, 1, 2], {1, 2})], {0: "A", 1: "B", 2: "B"},
        ["lock", "lock", "lock"]),
    "owner reclaims its own expired entry": (
        [(0, "lock", "A", [0], {0}), (5 * LEASE, "lock", "A", [0], {0})], {0: "A"}, ["lock", "renew"]),
    "unlock by non-owner is a no-op": (
        [(0, "lock", "A", [0], {0}), (10, "unlock", "B", [0], set()), (20, "lock", "B", [0], set())],
        {0: "A"}, ["lock"]),
    "unlock by owner frees the queue": (
        [(0, "lock", "A", [0, 1], {0, 1}), (10, "unlock", "A", [0], {0}), (20, "lock", "B", [0], {0})],
        {0: "B", 1: "A"}, ["lock", "lock", "unlock", "lock"]),
    "owner may unlock an expired entry": (
        [(0, "lock", "A", [0], {0}), (3 * LEASE, "unlock", "A", [0], {0})], {}, ["lock", "unlock"]),
    "renew never takes a free queue": (
        [(0, "renew", "A", [0], set())], {}, []),
    "renew leaves other owners alone": (
        [(0, "lock", "A", [0], {0}), (10, "renew", "B", [0], set())], {0: "A"}, ["lock"]),
    "renew refreshes an expired entry nobody took": (
        [(0, "lock", "A", [0], {0}), (LEASE + 500, "renew", "A", [0], {0}),
         (LEASE + 1000, "lock", "B", [0], set())], {0: "A"}, ["lock", "renew"]),
    "entry expired ten leases is purged": (
        [(0, "lock", "A", [0], {0}), (10 * LEASE + 1, "lock", "B", [1], {1})], {1: "B"},
        ["lock", "lock", "purge"]),
}


@pytest.mark.parametrize("steps, final_owners, actions", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_lock_semantics(tmp_path, steps, final_owners, actions):
    clock = FakeClock(1_000_000)
    mgr = QueueLockManager(tmp_path, GROUP, lease_ms=LEASE, clock=clock)
    start = clock.ms
    for at, op, client, qids, expected in steps:
        clock.ms = start + at
        method = {"lock": mgr.try_lock_batch, "unlock": mgr.unlock_batch, "renew": mgr.renew}[op]
        assert method([q(i) for i in qids], client) == {q(i) for i in expected}, (at, op, client)
    # The file (read by a fresh manager) holds exactly the expected owners.
    fresh = QueueLockManager(tmp_path, GROUP, lease_ms=LEASE, clock=clock)
    assert {parse_queue_key(k)[2]: e.client_id for k, e in fresh.entries().items()} == final_owners
    assert [r["action"] for r in read_history(tmp_path, GROUP)] == actions
    assert find_lock_overlaps(read_history(tmp_path, GROUP)) == []


def test_renew_updates_timestamp_and_takeover_records_previous_owner(mgr, clock):
    mgr.try_lock(q(0), "A")
    clock.ms += 700
    assert mgr.try_lock(q(0), "A")
    assert mgr.entry(q(0)) == LockEntry("A", clock.ms, LEASE)
    renewed_at = clock.ms
    clock.ms += LEASE + 1
    assert mgr.try_lock(q(0), "B")
    last = read_history(Path(mgr.path).parent, GROUP)[-1]
    assert last == {"t": clock.ms, "client": "B", "queue": "TopicOrder|broker-a|0",
                    "action": "expire-takeover", "prev": "A", "prevUpdateMs": renewed_at, "leaseMs": LEASE}


def test_reads_respect_expiry(mgr, clock):
    mgr.try_lock_batch([q(0), q(1)], "A")
    assert mgr.owner(q(0)) == "A" and mgr.is_locked(q(0), "A") and not mgr.is_locked(q(0), "B")
    assert mgr.owner(q(9)) is None and not mgr.is_locked(q(9), "A")
    clock.ms += LEASE + 1
    assert mgr.owner(q(0)) is None and not mgr.is_locked(q(0), "A")
    assert set(mgr.entries()) == {"TopicOrder|broker-a|0", "TopicOrder|broker-a|1"}  # expired kept


def test_entry_expiry_uses_the_lease_it_was_granted_with(tmp_path, clock):
    long_mgr = QueueLockManager(tmp_path, GROUP, lease_ms=5000, clock=clock)
    short_mgr = QueueLockManager(tmp_path, GROUP, lease_ms=1000, clock=clock)
    assert long_mgr.try_lock(q(0), "A")
    clock.ms += 2000
    assert not short_mgr.try_lock(q(0), "B")
    clock.ms += 3001
    assert short_mgr.try_lock(q(0), "B")


def test_objects_and_tuples_name_the_same_queue(mgr):
    granted = mgr.try_lock_batch([MQ("TopicOrder", "broker-a", 3), MQ("TopicOrder", "broker-a", 4)], "A")
    assert granted == {MQ("TopicOrder", "broker-a", 3), MQ("TopicOrder", "broker-a", 4)}
    assert mgr.is_locked(q(3), "A")
    assert mgr.try_lock_batch([q(3), MQ("TopicOrder", "broker-a", 3)], "A") == {
        q(3), MQ("TopicOrder", "broker-a", 3)}
    assert not mgr.try_lock(q(3), "B")


@pytest.mark.parametrize("mq, key", [
    (("T", "broker-a", 0), "T|broker-a|0"),
    (("%RETRY%G", "b", 12), "%RETRY%G|b|12"),
    (("a|b", "c", 1), "a\\|b|c|1"),
    (("a", "b|c", 1), "a|b\\|c|1"),
    (("x\\", "y", 2), "x\\\\|y|2"),
])
def test_queue_key_is_unambiguous(mq, key):
    assert queue_key(mq) == key
    assert parse_queue_key(key) == mq


@pytest.mark.parametrize("bad", [
    ("T", "b"), ("", "b", 0), ("T", "", 0), ("T", "b", -1), ("T", "b", "0"), ("T", "b", True), "T|b|0", 7,
])
def test_invalid_queue_is_rejected(mgr, bad):
    with pytest.raises(RmqOptionError, match="message queue"):
        mgr.try_lock(bad, "A")


@pytest.mark.parametrize("kwargs, match", [
    ({"group": "bad/group"}, "invalid consumer group"),
    ({"group": "g.x"}, "invalid consumer group"),
    ({"group": "g" * 201}, "invalid consumer group"),
    ({"lease_ms": 0}, "lease_ms"),
    ({"lease_ms": 1.5}, "lease_ms"),
])
def test_invalid_manager_arguments(tmp_path, kwargs, match):
    args = {"group": GROUP, **kwargs}
    with pytest.raises(RmqOptionError, match=match):
        QueueLockManager(tmp_path, args.pop("group"), **args)


@pytest.mark.parametrize("client", ["", None, "a\nb"])
def test_invalid_client_id(mgr, client):
    with pytest.raises(RmqOptionError, match="client_id"):
        mgr.try_lock(q(0), client)


@pytest.mark.parametrize("content, match", [
    (b"{not json", "not valid JSON"),
    (b'{"version": 2, "group": "GID_orderly", "locks": {}}', "version"),
    (b'{"version": 1, "group": "other", "locks": {}}', "belongs to group 'other'"),
    (b'{"version": 1, "group": "GID_orderly", "locks": []}', '"locks" must be an object'),
    (b'{"version": 1, "group": "GID_orderly", "locks": {"T|b|0": {"clientId": "A"}}}', "lastUpdateTimestamp"),
])
def test_corrupt_state_file_is_an_error_naming_it(mgr, content, match):
    Path(mgr.path).write_bytes(content)
    with pytest.raises(RmqLockError, match=match) as info:
        mgr.try_lock(q(0), "A")
    assert mgr.path in str(info.value)


# --------------------------------------------------------------------------------------------
# Implausible stamps: an entry that would never expire is corrupt state, not a lock

FAR_FUTURE = 10 ** 18
LIMIT_MS = LEASE + CLOCK_SKEW_ALLOWANCE_MS  # how far ahead of the reader's clock a stamp may be


def _lock_state(stamp: int, lease: int = LEASE) -> bytes:
    return json.dumps({"version": 1, "group": GROUP, "locks": {"TopicOrder|broker-a|0": {
        "clientId": "ghost", "lastUpdateTimestamp": stamp, "leaseMs": lease}}}).encode()


IMPLAUSIBLE_LOCKS = {
    "stamped in 10^18": (FAR_FUTURE, LEASE, f"lastUpdateTimestamp {FAR_FUTURE} is"),
    "one ms beyond lease + clock skew ahead": (1_000_000 + LIMIT_MS + 1, LEASE,
                                               f"lastUpdateTimestamp {1_000_000 + LIMIT_MS + 1} is "
                                               f"{LIMIT_MS + 1} ms ahead"),
    "negative stamp": (-5, LEASE, "lastUpdateTimestamp -5 is negative"),
    "lease of zero": (1_000_000, 0, "leaseMs 0 must be positive"),
}
_OPERATIONS = {
    "try_lock": lambda m: m.try_lock(q(1), "A"),
    "renew": lambda m: m.renew([q(0)], "A"),
    "owner": lambda m: m.owner(q(0)),
    "entries": lambda m: m.entries(),
    "assert_held": lambda m: m.assert_held(q(0), "ghost", 500),
}


@pytest.mark.parametrize("stamp, lease, match", IMPLAUSIBLE_LOCKS.values(), ids=IMPLAUSIBLE_LOCKS.keys())
def test_implausible_lock_entry_is_corrupt_state_naming_file_entry_and_value(mgr, stamp, lease, match):
    content = _lock_state(stamp, lease)
    Path(mgr.path).write_bytes(content)
    for name, operation in _OPERATIONS.items():
        with pytest.raises(RmqLockError, match=match) as info:
            operation(mgr)
        text = str(info.value)
        assert text.startswith(f"lock state file {mgr.path} is invalid: entry "
                               "'TopicOrder|broker-a|0'"), (name, text)
    assert Path(mgr.path).read_bytes() == content  # left for the operator to look at


def test_a_stamp_ahead_by_up_to_lease_plus_clock_skew_is_a_live_lock(mgr, clock):
    """Another host's clock may run ahead; only what no clock can explain is refused."""
    Path(mgr.path).write_bytes(_lock_state(clock.ms + LIMIT_MS))
    assert mgr.owner(q(0)) == "ghost" and not mgr.try_lock(q(0), "A")
    clock.ms -= 1
    with pytest.raises(RmqLockError, match=f"{LIMIT_MS + 1} ms ahead"):
        mgr.try_lock(q(0), "A")


def test_stale_temp_file_from_a_crashed_writer_is_harmless(mgr):
    mgr.try_lock(q(0), "A")
    Path(mgr.path + ".tmp").write_bytes(b"garbage from a writer killed mid-write")
    assert mgr.try_lock(q(1), "A")
    assert set(mgr.entries()) == {queue_key(q(0)), queue_key(q(1))}


def test_empty_batch_touches_nothing(mgr):
    assert mgr.try_lock_batch([], "A") == set()
    assert not os.path.exists(mgr.path)


# --------------------------------------------------------------------------------------------
# assert_held and the client lease


@pytest.mark.parametrize("setup, age_ms, client_lease, match", [
    (None, 0, 500, "not locked by anyone"),
    ("B", 0, 500, "locked by 'B', not 'A' \\(live, last renewed 0 ms ago"),
    ("B", LEASE + 1, 500, "locked by 'B', not 'A' \\(expired"),
    ("A", 501, 500, "last renewed 501 ms ago, more than the 500 ms"),
    ("A", LEASE + 1, 5000, f"more than the {LEASE} ms"),  # never trusts beyond the manager lease
])
def test_assert_held_refuses(mgr, clock, setup, age_ms, client_lease, match):
    if setup:
        mgr.try_lock(q(0), setup)
    clock.ms += age_ms
    with pytest.raises(RmqLockError, match=match) as info:
        mgr.assert_held(q(0), "A", client_lease)
    assert "TopicOrder|broker-a|0" in str(info.value) and GROUP in str(info.value)


def test_assert_held_accepts_a_fresh_lock(mgr, clock):
    mgr.try_lock(q(0), "A")
    clock.ms += 500
    assert mgr.assert_held(q(0), "A", 500).client_id == "A"


def test_assert_held_batch_names_the_first_queue_not_held(mgr, clock):
    mgr.try_lock_batch([q(0), q(1)], "A")
    assert set(mgr.assert_held_batch([q(0), q(1)], "A", 500)) == {queue_key(q(0)), queue_key(q(1))}
    with pytest.raises(RmqLockError, match="queue TopicOrder\\|broker-a\\|2 .* not locked by anyone"):
        mgr.assert_held_batch([q(0), q(2), q(1)], "A", 500)


@pytest.mark.parametrize("holder, age_ms, match", [
    ("task-client", 0, None),
    ("task-client", 801, "more than the 800 ms"),
    ("other", 0, "locked by 'other'"),
    (None, 0, "not locked by anyone"),
])
def test_check_task_locks_guards_a_spark_partition(tmp_path, holder, age_ms, match):
    pr = require("rmq_source.spark.partition_reader", "needs pyspark")
    from rmq_source.spark.partition_reader import check_task_locks
    from rmq_source.store.backend import StoreBackendSpec
    backend = StoreBackendSpec((("broker-a", "/nowhere"),), str(tmp_path))
    clock = FakeClock(int(time.time() * 1000) - age_ms)  # the task itself uses the real clock
    mgr = QueueLockManager(tmp_path, GROUP, lease_ms=LEASE, clock=clock)
    if holder:
        mgr.try_lock_batch([q(0), q(1)], holder)
    part = pr.RmqInputPartition(
        backend=backend, slot="s0",
        ranges=tuple(pr.RangeSpec("TopicOrder", "broker-a", i, 0, 10) for i in (0, 1)),
        sub_expression="*", batch_rows=10, batch_bytes=1 << 20, verify_crc=False, fail_on_data_loss=True,
        lock=pr.TaskLock(GROUP, "task-client", 800))
    if match is None:
        check_task_locks(part)
    else:
        with pytest.raises(RmqLockError, match=match):
            check_task_locks(part)
    check_task_locks(pr.RmqInputPartition(backend, "s0", (), "*", 10, 1 << 20, False, True, lock=None))


def test_client_view_trusts_a_lock_for_the_client_lease_from_the_request_time(tmp_path):
    clock = FakeClock(1_000_000, step_ms=1)  # every clock read advances 1 ms
    mgr = QueueLockManager(tmp_path, GROUP, lease_ms=LEASE, clock=clock)
    view = ClientLockView(mgr, "A", client_lease_ms=600)
    asked_at = clock.ms
    assert view.lock_all([q(0), q(1)]) == {q(0), q(1)}
    assert view.process_queue(q(0)) == ProcessQueueLock(True, asked_at)
    assert mgr.entry(q(0)).last_update_ms > asked_at  # manager stamped later than the request
    clock.step_ms = 0
    clock.ms = asked_at + 600
    assert view.is_readable(q(0)) and not view.is_lock_expired(q(0))
    view.assert_readable(q(0))
    clock.ms = asked_at + 601
    assert not view.is_readable(q(0)) and view.is_lock_expired(q(0))
    with pytest.raises(RmqLockError, match="more than the client lease 600 ms"):
        view.assert_readable(q(0))


def test_client_view_refused_and_unlocked_queues_are_not_readable(mgr, clock):
    other = ClientLockView(mgr, "B", client_lease_ms=500)
    other.lock(q(0))
    view = ClientLockView(mgr, "A", client_lease_ms=500)
    assert view.lock_all([q(0), q(1)]) == {q(1)}
    assert not view.is_readable(q(0)) and view.is_readable(q(1))
    with pytest.raises(RmqLockError, match="does not hold"):
        view.assert_readable(q(0))
    assert view.unlock([q(1)]) == {q(1)}
    assert not view.is_readable(q(1)) and mgr.owner(q(1)) is None
    assert view.process_queue(q(7)) == ProcessQueueLock()


def test_client_view_asks_only_for_the_locks_it_does_not_trust(mgr, clock, monkeypatch):
    """lock_untrusted: queues granted within the client lease are not asked again (their renewal
    keeps them); refused, unlocked, never asked and lapsed ones are; the answer's time is the
    oldest trusted grant (the lease boundary as is_readable draws it)."""
    other = ClientLockView(mgr, "B", client_lease_ms=500)
    other.lock(q(9))
    view = ClientLockView(mgr, "A", client_lease_ms=500)
    base = clock.ms
    assert view.lock_all([q(0), q(1), q(9)]) == {q(0), q(1)}
    clock.ms = base + 200
    assert view.lock_all([q(2), q(3)]) == {q(2), q(3)}
    view.unlock([q(3)])
    asked = []
    real = mgr.try_lock_batch
    monkeypatch.setattr(mgr, "try_lock_batch", lambda mqs, client: asked.append(sorted(mqs)) or real(mqs, client))
    clock.ms = base + 500                        # q(0), q(1): granted 500 ms ago, still trusted
    granted, oldest = view.lock_untrusted([q(0), q(1), q(2), q(3), q(4), q(9)])
    assert asked == [sorted([q(3), q(4), q(9)])]
    assert granted == {q(0), q(1), q(2), q(3), q(4)} and oldest == base
    assert view.trusted([q(0), q(2), q(9)]) == ({q(0), q(2)}, base)
    clock.ms = base + 501                        # q(0), q(1) lapsed: asked again
    asked.clear()
    granted, oldest = view.lock_untrusted([q(0), q(1), q(2)])
    assert asked == [sorted([q(0), q(1)])] and granted == {q(0), q(1), q(2)} and oldest == base + 200
    assert all(view.is_readable(mq) == (mq in view.trusted([mq])[0]) for mq in (q(0), q(3), q(9)))


@pytest.mark.parametrize("client_lease", [LEASE, LEASE + 1])
def test_client_lease_must_be_shorter_than_manager_lease(mgr, client_lease):
    with pytest.raises(RmqOptionError, match="must be shorter than the manager lease_ms"):
        ClientLockView(mgr, "A", client_lease_ms=client_lease)


def test_process_queue_lock_expiry_boundary():
    pq = ProcessQueueLock(True, 1000)
    assert not pq.is_lock_expired(31_000) and pq.is_readable(31_000)
    assert pq.is_lock_expired(31_001) and not pq.is_readable(31_001)
    assert not ProcessQueueLock(False, 1000).is_readable(1000)


# --------------------------------------------------------------------------------------------
# History checker must be able to fail


@pytest.mark.parametrize("records, overlaps", [
    ([("A", "lock", 0), ("B", "lock", 500)], 1),
    ([("A", "lock", 0), ("B", "expire-takeover", 1000)], 1),
    ([("A", "lock", 0), ("A", "renew", 900), ("B", "expire-takeover", 1500)], 1),
    ([("A", "lock", 0), ("B", "expire-takeover", 1001)], 0),
    ([("A", "lock", 0), ("A", "unlock", 10), ("B", "lock", 11)], 0),
    ([("A", "lock", 0), ("B", "unlock", 10), ("B", "lock", 11)], 1),  # non-owner unlock frees nothing
    ([("A", "lock", 0), ("A", "purge", 20000), ("B", "lock", 20000)], 0),
])
def test_find_lock_overlaps(records, overlaps):
    recs = [{"t": t, "client": c, "queue": "T|b|0", "action": a,
             "leaseMs": LEASE if a in ("lock", "renew", "expire-takeover") else None}
            for c, a, t in records]
    assert len(find_lock_overlaps(recs)) == overlaps


def test_history_rotates_and_reads_both_generations(tmp_path, clock):
    mgr = QueueLockManager(tmp_path, GROUP, lease_ms=LEASE, clock=clock, history_max_bytes=300)
    for i in range(10):
        clock.ms += 1
        mgr.try_lock(q(i), "A")
    assert os.path.exists(mgr.history_path + ".1")
    hist = read_history(tmp_path, GROUP)
    assert [r["t"] for r in hist] == sorted(r["t"] for r in hist)
    assert hist[-1]["queue"] == queue_key(q(9)) and len(hist) < 10  # oldest generation dropped


def test_history_can_be_disabled(tmp_path, clock):
    mgr = QueueLockManager(tmp_path, GROUP, lease_ms=LEASE, clock=clock, history=False)
    mgr.try_lock(q(0), "A")
    assert read_history(tmp_path, GROUP) == [] and mgr.owner(q(0)) == "A"


# --------------------------------------------------------------------------------------------
# Renewal thread (real clock, generous lease so only a very long stall could fail)


def wait_until(cond, timeout_s=5.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_renewer_keeps_locks_and_unlocks_on_stop(tmp_path):
    mgr = QueueLockManager(tmp_path, GROUP, lease_ms=2000)
    view = ClientLockView(mgr, "A", client_lease_ms=1000)
    renewer = view.start_renewer(lambda: [q(0), q(1)], interval_ms=30)
    wait_until(lambda: renewer.ticks >= 4, what="4 renewals")
    assert view.is_readable(q(0)) and view.is_readable(q(1))
    assert not mgr.try_lock(q(0), "B")
    renewer.stop(unlock=True)
    assert not renewer.is_alive()
    assert mgr.entries() == {}
    actions = [r["action"] for r in read_history(tmp_path, GROUP) if r["queue"] == queue_key(q(0))]
    assert actions[0] == "lock" and actions.count("renew") >= 3 and actions[-1] == "unlock"


def test_renewer_without_acquire_only_renews_held_queues(tmp_path):
    mgr = QueueLockManager(tmp_path, GROUP, lease_ms=2000)
    mgr.try_lock(q(0), "A")
    mgr.try_lock(q(1), "B")
    with LockRenewer(mgr, "A", lambda: [q(0), q(1), q(2)], interval_ms=30, acquire=False) as renewer:
        wait_until(lambda: renewer.ticks >= 2, what="2 renewals")
    assert not renewer.is_alive()
    assert renewer.last_granted == {q(0)}
    assert {k: e.client_id for k, e in mgr.entries().items()} == {queue_key(q(0)): "A", queue_key(q(1)): "B"}


def test_renewer_survives_failing_ticks(tmp_path):
    mgr = QueueLockManager(tmp_path, GROUP, lease_ms=2000)
    calls = []

    def provider():
        calls.append(1)
        if len(calls) == 1:
            raise OSError("queue listing failed")
        return [q(0)]
    renewer = LockRenewer(mgr, "A", provider, interval_ms=20).start()
    wait_until(lambda: len(calls) >= 3, what="3 ticks")
    renewer.stop()
    assert renewer.last_error is None and mgr.owner(q(0)) == "A"


@pytest.mark.parametrize("interval", [LEASE, LEASE + 1, 0])
def test_renewer_interval_must_fit_in_lease(mgr, interval):
    with pytest.raises(RmqOptionError, match="interval_ms"):
        LockRenewer(mgr, "A", lambda: [], interval_ms=interval)


def test_view_renewer_interval_must_fit_in_client_lease(mgr):
    with pytest.raises(RmqOptionError, match="shorter than client_lease_ms"):
        ClientLockView(mgr, "A", client_lease_ms=500).start_renewer(lambda: [], interval_ms=500)


def test_threads_of_one_process_lose_no_update(tmp_path):
    mgr = QueueLockManager(tmp_path, GROUP, lease_ms=60_000)

    def work(t):
        for i in range(15):
            assert mgr.try_lock(("T", "b", t * 100 + i), f"thread-{t}")
    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(mgr.entries()) == 60


# --------------------------------------------------------------------------------------------
# Real processes


def run_python(code: str, *args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def finish(procs, timeout=30):
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err
        outs.append(out)
    return outs


WRITER = """
    import sys
    from rmq_source.group.locks import QueueLockManager
    state_dir, group, client, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    mgr = QueueLockManager(state_dir, group, lease_ms=60000)
    for i in range(n):
        assert mgr.try_lock(("T", client, i), client)
"""


def test_processes_racing_lose_no_update(tmp_path):
    procs = [run_python(WRITER, str(tmp_path), GROUP, f"w{w}", "25") for w in range(4)]
    finish(procs)
    entries = QueueLockManager(tmp_path, GROUP).entries()
    assert len(entries) == 100
    assert all(e.client_id == parse_queue_key(k)[1] for k, e in entries.items())


HAMMER = """
    import json, random, sys, time
    from rmq_source.group.locks import ClientLockView, QueueLockManager
    state_dir, group, client, out = sys.argv[1:5]
    stall_at = float(sys.argv[5])
    lease, client_lease, queues, duration = 400, 200, 5, 1.5
    rnd = random.Random(client)
    mgr = QueueLockManager(state_dir, group, lease_ms=lease)
    view = ClientLockView(mgr, client, client_lease_ms=client_lease)
    mqs = [("TopicOrder", "broker-a", i) for i in range(queues)]
    windows = []   # [queue, start, end]: when this client may read the queue
    per_queue = {}  # queue id -> its windows (all cut on unlock)
    stalled = False
    print("ready", flush=True)
    sys.stdin.readline()  # all workers start together
    t0 = time.time()
    while time.time() - t0 < duration:
        wanted = rnd.sample(mqs, rnd.randint(1, queues))
        started = view.now_ms()
        granted = view.lock_all(wanted)
        after = view.now_ms()
        for mq in granted:
            w = [mq[2], after, started + client_lease]
            windows.append(w)
            per_queue.setdefault(mq[2], []).append(w)
        r = rnd.random()
        if not stalled and time.time() - t0 > stall_at:
            stalled = True            # a long pause while holding locks: others must take over
            time.sleep(lease * 1.5 / 1000)
        elif r < 0.25 and granted:
            drop = rnd.sample(sorted(granted), rnd.randint(1, len(granted)))
            cut = view.now_ms()
            for mq in drop:
                for w in per_queue[mq[2]]:
                    w[2] = min(w[2], cut)
            view.unlock(drop)
        else:
            time.sleep(rnd.random() * 0.02)
    with open(out, "w") as f:
        json.dump(windows, f)
"""


def test_racing_processes_never_share_a_queue(tmp_path):
    """4 processes hammer try_lock_batch/unlock on 5 shared queues with the real clock, each also
    pausing once past the lease (at staggered moments, so the others take its queues over).
    From the manager's history: no queue is ever taken or renewed while another client's grant is
    within its lease. From the clients' own records: read windows (from the answer until request
    time + client lease, cut at unlock) of different clients never overlap."""
    state = tmp_path / "state"
    outs = [tmp_path / f"w{i}.json" for i in range(4)]
    procs = [run_python(HAMMER, str(state), GROUP, f"client-{i}", str(outs[i]), str(0.2 + 0.25 * i),
                        stdin=subprocess.PIPE) for i in range(4)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    finish(procs)

    history = read_history(state, GROUP)
    assert find_lock_overlaps(history) == []
    actions = {r["action"] for r in history}
    assert {"lock", "renew", "unlock", "expire-takeover"} <= actions, actions
    holders = {}
    for r in history:
        if r["action"] in ("lock", "expire-takeover"):
            holders.setdefault(r["queue"], set()).add(r["client"])
    assert sum(len(h) >= 2 for h in holders.values()) >= 2, holders  # queues really changed hands

    windows = []
    for i, path in enumerate(outs):
        windows += [(qid, start, end, i) for qid, start, end in json.loads(path.read_text()) if start <= end]
    assert len(windows) > 50
    by_queue = {}
    for qid, start, end, who in sorted(windows):
        by_queue.setdefault(qid, []).append((start, end, who))
    for qid, ws in by_queue.items():
        latest_end = {}
        for start, end, who in ws:
            for other, other_end in latest_end.items():
                assert other == who or other_end < start, (qid, who, start, other, other_end)
            latest_end[who] = max(end, latest_end.get(who, end))


HOLDER = """
    import sys, time
    from rmq_source.group.locks import QueueLockManager
    mgr = QueueLockManager(sys.argv[1], sys.argv[2], lease_ms=int(sys.argv[3]))
    got = mgr.try_lock_batch([("TopicOrder", "broker-a", i) for i in range(3)], "doomed")
    print(len(got), flush=True)
    time.sleep(60)
"""


def test_killed_client_locks_expire_then_are_taken_over(tmp_path):
    lease = 500
    p = run_python(HOLDER, str(tmp_path), GROUP, str(lease))
    try:
        assert p.stdout.readline().strip() == "3"
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
    assert p.returncode == -signal.SIGKILL
    entries = QueueLockManager(tmp_path, GROUP, lease_ms=lease).entries()
    assert {e.client_id for e in entries.values()} == {"doomed"} and len(entries) == 3
    locked_at = max(e.last_update_ms for e in entries.values())

    # Up to exactly one lease after its last renewal the dead client still owns the queues.
    at_lease_end = QueueLockManager(tmp_path, GROUP, lease_ms=lease, clock=lambda: (locked_at + lease) / 1000)
    assert at_lease_end.try_lock_batch([q(0), q(1), q(2)], "survivor") == set()

    wait_until(lambda: time.time() * 1000 - locked_at > lease + 5, what="lease to run out")
    mgr = QueueLockManager(tmp_path, GROUP, lease_ms=lease)
    assert mgr.try_lock_batch([q(0), q(1), q(2)], "survivor") == {q(0), q(1), q(2)}
    history = read_history(tmp_path, GROUP)
    assert [(r["action"], r["prev"]) for r in history[-3:]] == [("expire-takeover", "doomed")] * 3
    assert find_lock_overlaps(history) == []


FLOCK_HOLDER = """
    import sys, time
    from rmq_source.errors import RmqLockError
    from rmq_source.group.statefile import file_lock
    with file_lock(sys.argv[1], exclusive=True, timeout_s=None, error_cls=RmqLockError):
        print("held", flush=True)
        time.sleep(60)
"""


def test_process_killed_while_holding_the_file_lock_does_not_block_others(tmp_path):
    mgr = QueueLockManager(tmp_path, GROUP, lease_ms=LEASE, lock_timeout_s=0.3)
    p = run_python(FLOCK_HOLDER, mgr.path + ".flock")
    try:
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(RmqLockError, match="timed out after 0.3 s waiting for state lock"):
            mgr.try_lock(q(0), "A")
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
    assert mgr.try_lock(q(0), "A")


@pytest.mark.parametrize("mq, error", [
    (MessageQueue("T", "broker-a", 3), None),
    (("T", "broker-a", 3), None),
    (MessageQueue("", "broker-a", 3), "topic must be a non-empty string"),
    (MessageQueue("T", "", 3), "broker_name must be a non-empty string"),
    (MessageQueue("T", "broker-a", -1), "queue_id must be an int >= 0"),
    (("T", "broker-a", True), "queue_id must be an int >= 0"),
])
def test_queue_keys_of_queues_and_triples_and_what_is_refused(mq, error):
    """A lock key names a real queue: MessageQueues (their fields checked without a lookup) and
    (topic, broker, id) triples alike; an empty name or a negative id is refused."""
    from rmq_source.group.locks import parse_queue_key, queue_key
    if error is None:
        assert parse_queue_key(queue_key(mq)) == ("T", "broker-a", 3)
    else:
        with pytest.raises(RmqOptionError, match=error):
            queue_key(mq)
