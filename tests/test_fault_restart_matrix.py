"""kill -9 a streaming query at each step of a micro-batch's life and start it again: the restart
must finish by itself, and the sinks must end up with every message (exactly once for a query
alone).

The crash run uses ``fault_helpers/crash_source.py``, which SIGKILLs the query's whole process
tree at a precise step (see there): before the first batch is logged, after a batch is logged and
before its tasks run (the first batch and a later one), while tasks are reading, and after a commit
before the next batch is planned; and a task failure that fails the query (a re-run in a new
process after it). The steps of one case run as a chain on one checkpoint: each run dies at its
step and the next one starts on what it left, so every step is also a restart after a death (one
Spark start per step instead of two, and deaths during the re-run of a logged batch too). Each
restart has a new generated client id, as a restarted process has, so the dead run's queue locks
and group membership must run out by themselves (short leases keep this fast). Cases: ordered and
unordered, with and without ``consumerGroup``, one query alone (a query of a group of several
killed while the others read on: test_fault_group_kill.py).
"""
from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest

from fault_helpers import procs
from fault_helpers.sinks import committed_keys
from store_builder import build_store

TOPIC, QUEUES, MESSAGES, PER_TRIGGER = "CrashTopic", 4, 480, 60
# batch k of a query alone reads [15k, 15k + 15) of every queue: 8 batches, enough for every chain
EVERY = Counter({(q, o): 1 for q in range(QUEUES) for o in range(MESSAGES // QUEUES)})
# a lease longer than a Spark start, so a restart finds the dead run's locks still live and waits
LEASES = ["lockLeaseMs=10000", "clientLockLeaseMs=6000", "lockRenewIntervalMs=2000"]
TIMEOUT = 240

# (chain id, consumerGroup options or None, crash steps in order). Each step is a run of a
# process restarted on the checkpoint the previous step's death left (so every step but the first
# also tests a restart after the step before it, and steps after a logged batch die while Spark
# re-runs it); a last restart with Trigger.AvailableNow must then finish.
CHAINS = [
    # (the ordered chain dies at every point, a logged later batch in the unordered chain; without
    # a group only the points where the restart has no plan of the group to follow: a logged
    # batch re-run, and after a commit)
    ("alone-no-group", None, ["logged:1", "next:3"]),
    ("alone-ordered", "orderly=true", ["failing:20", "plan:1", "logged:1", "reading:20", "next:3"]),
    ("alone-unordered", "orderly=false", ["logged:3", "next:3"]),
]


def _ids(folder: Path) -> set[int]:
    return {int(p.name) for p in folder.iterdir() if p.name.isdigit()} if folder.is_dir() else set()


def _query(tmp_path: Path, name: str, log: str, group: str | None, *extra: str):
    options = ["--option", "batchRows=5"]
    if group is not None:
        for opt in ["consumerGroup=CrashGroup", group, *LEASES]:
            options += ["--option", opt]
    return procs.start("stream_query.py",
                       ["--store", str(tmp_path / "store"), "--topic", TOPIC,
                        "--sink", str(tmp_path / f"sink-{name}"),
                        "--checkpoint", str(tmp_path / f"chk-{name}"),
                        "--max-per-trigger", str(PER_TRIGGER), *options, *extra], tmp_path, log)


def _wait_exit(proc, tmp_path: Path, log: str) -> int:
    try:
        return proc.wait(timeout=TIMEOUT)
    except Exception:
        procs.kill_group(proc)
        raise AssertionError(f"{log} did not end within {TIMEOUT} s\n{procs.tail(tmp_path, log)}")


def _check_crash_point(step: str, chk: Path) -> None:
    """The checkpoint shows the step the query died at (so the case tests what it says)."""
    offsets, commits = _ids(chk / "offsets"), _ids(chk / "commits")
    kind = step.split(":")[0]
    if kind == "plan":
        assert offsets == commits, (step, offsets, commits)
    elif kind in ("logged", "reading", "failing"):
        assert offsets and max(offsets) not in commits, (step, offsets, commits)
    else:
        assert offsets and offsets == commits, (step, offsets, commits)


@pytest.fixture(scope="module")
def chain_runs(request, tmp_path_factory):
    """The chains of the selected tests, started on first use two at a time, longest first (each
    spends much of its time waiting for Spark to start and leases to run out); chain id -> its
    future (raises what the chain raised)."""
    from concurrent.futures import ThreadPoolExecutor
    selected = {item.callspec.params["chain"] for item in request.session.items
                if item.originalname == "test_restart_after_kill_9"}
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="chain")
    runs = {c[0]: pool.submit(_run_chain, tmp_path_factory.mktemp(f"chain-{c[0]}"), *c[1:])
            for c in sorted(CHAINS, key=lambda c: -len(c[2])) if c[0] in selected}
    yield runs
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("chain", [c[0] for c in CHAINS])
def test_restart_after_kill_9(chain_runs, chain):
    """The chain's steps each died where they should, the last restart finished by itself, and
    the sinks hold every message (exactly once for a query alone)."""
    chain_runs[chain].result(timeout=3600)


def _run_chain(tmp_path: Path, group: str | None, steps: list[str]) -> None:
    build_store(tmp_path / "store", topics=((TOPIC, QUEUES, MESSAGES),))
    for n, step in enumerate(steps):
        log = f"crash-{n}-{step.replace(':', '')}"
        victim = _query(tmp_path, "victim", log, group, "--trigger", "200", "--crash", step)
        rc = _wait_exit(victim, tmp_path, log)
        expected = 1 if step.startswith("failing") else -signal.SIGKILL   # failed query / killed
        assert rc == expected, f"step {step} ended with {rc}\n" + procs.tail(tmp_path, log)
        _check_crash_point(step, tmp_path / "chk-victim")

    restarted = _query(tmp_path, "victim", "restart", group, "--trigger", "availableNow",
                       "--timeout", str(TIMEOUT))
    rc = _wait_exit(restarted, tmp_path, "restart")
    assert rc == 0, f"the restart ended with {rc}\n" + procs.tail(tmp_path, "restart")
    got = committed_keys(tmp_path / "sink-victim")
    assert got == EVERY, (f"missing {sorted(EVERY - got)[:5]}, duplicated "
                          f"{sorted(k for k, n in got.items() if n > 1)[:5]}")
