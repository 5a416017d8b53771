"""kill -9 one query of a consumer group: three streaming queries, each in its own process with its
own Spark driver, share a 16-queue topic in ordered mode while the store grows.

Two queries start, a third joins, then one is killed with SIGKILL (its whole process group: driver,
JVM, Python workers), so it neither unlocks its queues nor leaves the group. After its heartbeat and
lock leases expire, the survivors take its queues over from the group's committed progress:

* the union of the three parquet sinks (committed batches only) holds every message;
* a message is read twice only if the killed query had read it (its last committed batch may not
  be in the group's progress yet: at-least-once, as with RocketMQ consumers);
* the lock history shows no queue held by two clients within a lease, and each queue the killed
  query held was locked again by a survivor only after that query's lease had run out.
"""
from __future__ import annotations

import time

import pytest

from fault_helpers import procs
from fault_helpers.sinks import union_of_sinks
from rmq_source.group.locks import QueueLockManager, find_lock_overlaps, read_history
from rmq_source.store.writer import StoreWriter
from store_builder import append_messages, build_store

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TOPIC = "GroupKill16"
GROUP = "GK16"
LEASE_MS = 4000
OPTIONS = {"consumerGroup": GROUP, "startingOffsets": "group",
           "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "orderly": "true",
           "lockLeaseMs": str(LEASE_MS), "clientLockLeaseMs": "3000", "lockRenewIntervalMs": "1000"}


def _start(tmp_path, name):
    args = ["--store", str(tmp_path / "store"), "--sink", str(tmp_path / f"sink-{name}"),
            "--checkpoint", str(tmp_path / f"chk-{name}"), "--topic", TOPIC, "--trigger", "500",
            "--max-per-trigger", "60", "--master", "local[1]"]
    for k, v in {**OPTIONS, "clientId": name}.items():
        args += ["--option", f"{k}={v}"]
    return procs.start("stream_query.py", args, tmp_path, name)



def _wait_for(tmp_path, names, done, what, running, timeout=240):
    def check():
        for name, proc in running.items():
            if proc.poll() is not None:
                raise AssertionError(f"query {name} exited with {proc.returncode}\n"
                                     f"{procs.tail(tmp_path, name)}")
        got = union_of_sinks(tmp_path, names)
        return got if done(*got) else None
    try:
        return procs.wait_for(check, timeout, what, interval=2)
    except AssertionError as exc:
        keys, _ = union_of_sinks(tmp_path, names)
        raise AssertionError(f"{exc}; {len(keys)} distinct messages in the sinks") from None


def test_kill_9_one_query_of_a_group_its_queues_move_after_the_lease(tmp_path):
    store = tmp_path / "store"
    written = build_store(store, topics=((TOPIC, 16, 320),))
    expected = {(w.queue_id, w.queue_offset) for w in written}
    names = ["c1", "c2", "c3"]
    running = {}
    try:
        running["c1"], running["c2"] = _start(tmp_path, "c1"), _start(tmp_path, "c2")
        _wait_for(tmp_path, names, lambda k, per: per["c1"] and per["c2"],
                  "both first queries committed a batch", running)
        running["c3"] = _start(tmp_path, "c3")
        # append once the newcomer holds queues, so that it has something to read
        procs.wait_for(lambda: _held(store, "c3"), 180, "c3 locked its queues", running["c3"],
                       interval=0.5)
        with StoreWriter(store) as w:
            more = append_messages(w, TOPIC, 160, start_ts=1_700_002_000_000, seed=1)
        expected |= {(w.queue_id, w.queue_offset) for w in more}
        keys, per_query = _wait_for(
            tmp_path, names, lambda k, per: set(k) >= expected and per["c3"],
            "the three queries consumed everything", running)
        assert all(n == 1 for n in keys.values()), "a message was read twice while the group grew"

        victim = max(("c1", "c2", "c3"), key=lambda n: len(_held(store, n)))
        held = _held(store, victim)
        assert held, "no query holds a queue lock"
        killed_at = time.time() * 1000
        procs.kill_group(running.pop(victim))
        with StoreWriter(store) as w:
            late = append_messages(w, TOPIC, 96, start_ts=1_700_003_000_000, seed=2)
        expected |= {(w.queue_id, w.queue_offset) for w in late}
        keys, per_query = _wait_for(tmp_path, names, lambda k, per: set(k) >= expected,
                                    f"the survivors consumed what {victim} left", running)
    finally:
        for proc in running.values():
            procs.kill_group(proc)

    assert set(keys) == expected
    twice = {k for k, n in keys.items() if n > 1}
    assert twice <= set(per_query[victim]), "only messages the killed query read may be read again"
    history = read_history(store / "rmq_source_offsets", GROUP)
    assert {r["client"] for r in history} >= set(names)
    assert find_lock_overlaps(history) == []
    # the victim's queues went to survivors, each only after the victim's lease ran out
    last_renewal = {}
    for r in history:
        if r["client"] == victim and r["queue"] in held and r["action"] in ("lock", "renew"):
            last_renewal[r["queue"]] = r["t"]
    assert set(last_renewal) == held
    taken: dict[str, int] = {}
    for r in history:
        if (r["client"] != victim and r["t"] > killed_at and r["queue"] in last_renewal
                and r["action"] in ("lock", "expire-takeover")):
            taken.setdefault(r["queue"], r["t"])
    assert set(taken) == set(last_renewal), (
        f"queues of {victim} not taken over: {sorted(set(last_renewal) - set(taken))}")
    assert all(taken[q] - last_renewal[q] > LEASE_MS for q in taken)


def _held(store, client) -> set[str]:
    """The queues (history keys) whose lock ``client`` holds now, from the group's lock table."""
    table = QueueLockManager(str(store / "rmq_source_offsets"), GROUP, lease_ms=LEASE_MS)
    now = table.now_ms()
    return {q for q, e in table.entries().items() if e.is_locked_by(client, now)}
