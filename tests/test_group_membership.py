"""Group membership: heartbeats, liveness with an injected clock, Java ordering, and real processes
(concurrent heartbeats lose nobody; a kill -9'd client drops out after the timeout)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rmq_source.errors import RmqLockError, RmqOptionError
from rmq_source.group.membership import GroupMembership, java_sorted
from rmq_source.group.statefile import CLOCK_SKEW_ALLOWANCE_MS

REPO = Path(__file__).resolve().parents[1]
GROUP = "GID_orderly"
TIMEOUT = 1000


class FakeClock:
    def __init__(self, ms: int = 1_000_000):
        self.ms = ms

    def __call__(self) -> float:
        return self.ms / 1000


def member(tmp_path, cid, clock, **kw) -> GroupMembership:
    return GroupMembership(tmp_path, GROUP, cid, heartbeat_timeout_ms=TIMEOUT, clock=clock, **kw)


# Steps: (ms after start, client, "beat" | "leave" | "look", live clients expected afterwards)
SCENARIOS = {
    "first heartbeat registers": [(0, "A", "beat", ["A"])],
    "clients accumulate, sorted": [(0, "b@2", "beat", ["b@2"]), (10, "a@1", "beat", ["a@1", "b@2"])],
    "exactly the timeout is still live": [(0, "A", "beat", ["A"]), (TIMEOUT, "B", "look", ["A"])],
    "silent client drops out": [(0, "A", "beat", ["A"]), (500, "B", "beat", ["A", "B"]),
                                (TIMEOUT + 1, "B", "look", ["B"])],
    "heartbeat keeps a client live": [(0, "A", "beat", ["A"]), (900, "A", "beat", ["A"]),
                                      (1800, "B", "look", ["A"])],
    "leave removes only the caller": [(0, "A", "beat", ["A"]), (0, "B", "beat", ["A", "B"]),
                                      (10, "A", "leave", ["B"]), (20, "A", "leave", ["B"])],
    "a dropped client can come back": [(0, "A", "beat", ["A"]), (5000, "A", "beat", ["A"])],
}


@pytest.mark.parametrize("steps", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_membership_semantics(tmp_path, steps):
    clock = FakeClock()
    start = clock.ms
    for at, cid, op, expected in steps:
        clock.ms = start + at
        m = member(tmp_path, cid, clock)
        if op == "beat":
            assert m.heartbeat() == expected
        elif op == "leave":
            m.leave()
        assert m.live_clients() == expected, (at, cid, op)
        # Any other client reading the file at the same moment sees the same list.
        assert member(tmp_path, "observer", clock).live_clients() == expected


def test_stale_clients_are_pruned_from_the_file_on_write(tmp_path):
    clock = FakeClock()
    member(tmp_path, "A", clock).heartbeat()
    clock.ms += TIMEOUT + 1
    b = member(tmp_path, "B", clock)
    assert set(b.members()) == {"A"}  # reads do not prune
    b.heartbeat()
    assert b.members() == {"B": clock.ms}


@pytest.mark.parametrize("ids, expected", [
    (["b", "a", "B"], ["B", "a", "b"]),
    (["10.0.0.2@9", "10.0.0.10@1"], ["10.0.0.10@1", "10.0.0.2@9"]),
    (["\uFFFD", "\U0001F600"], ["\U0001F600", "\uFFFD"]),  # UTF-16 order, not code-point order
])
def test_java_sorted(ids, expected):
    assert java_sorted(ids) == expected


@pytest.mark.parametrize("group, cid, timeout, match", [
    ("", "A", TIMEOUT, "invalid consumer group"),
    ("a/b", "A", TIMEOUT, "invalid consumer group"),
    (None, "A", TIMEOUT, "invalid consumer group"),
    (GROUP, "", TIMEOUT, "client_id"),
    (GROUP, None, TIMEOUT, "client_id"),
    (GROUP, "A", 0, "heartbeat_timeout_ms"),
    (GROUP, "A", 1.5, "heartbeat_timeout_ms"),
    (GROUP, "A", True, "heartbeat_timeout_ms"),
])
def test_invalid_arguments(tmp_path, group, cid, timeout, match):
    with pytest.raises(RmqOptionError, match=match):
        GroupMembership(tmp_path, group, cid, heartbeat_timeout_ms=timeout)


@pytest.mark.parametrize("content, match", [
    (b"[", "not valid JSON"),
    (b'{"version": 1, "group": "other", "clients": {}}', "belongs to group 'other'"),
    (b'{"version": 1, "group": "GID_orderly", "clients": 3}', '"clients" must be an object'),
    (b'{"version": 1, "group": "GID_orderly", "clients": {"A": {"lastHeartbeatMs": "x"}}}', "lastHeartbeatMs"),
])
def test_corrupt_file_is_an_error_naming_it(tmp_path, content, match):
    m = member(tmp_path, "A", FakeClock())
    Path(m.path).write_bytes(content)
    with pytest.raises(RmqLockError, match=match) as info:
        m.heartbeat()
    assert m.path in str(info.value)


FAR_FUTURE = 10 ** 18
LIMIT_MS = TIMEOUT + CLOCK_SKEW_ALLOWANCE_MS  # how far ahead of the reader's clock a heartbeat may be


def _members_state(stamp: int) -> bytes:
    return json.dumps({"version": 1, "group": GROUP, "clients": {
        "ghost": {"lastHeartbeatMs": stamp, "host": "h", "pid": 1}}}).encode()


@pytest.mark.parametrize("stamp, match", [
    (FAR_FUTURE, f"client 'ghost': lastHeartbeatMs {FAR_FUTURE} is"),
    (1_000_000 + LIMIT_MS + 1, f"lastHeartbeatMs {1_000_000 + LIMIT_MS + 1} is {LIMIT_MS + 1} ms ahead"),
    (-1, "client 'ghost': lastHeartbeatMs -1 is negative"),
], ids=["stamped in 10^18", "one ms beyond timeout + clock skew ahead", "negative"])
def test_implausible_heartbeat_is_corrupt_state_naming_file_client_and_value(tmp_path, stamp, match):
    """A heartbeat that would never expire would keep a dead client in every allocation."""
    m = member(tmp_path, "A", FakeClock())
    content = _members_state(stamp)
    Path(m.path).write_bytes(content)
    for operation in (m.heartbeat, m.live_clients, m.members, m.leave):
        with pytest.raises(RmqLockError, match=match) as info:
            operation()
        assert str(info.value).startswith(f"group membership file {m.path} is invalid: ")
    assert Path(m.path).read_bytes() == content


def test_a_heartbeat_ahead_by_up_to_timeout_plus_clock_skew_is_live(tmp_path):
    clock = FakeClock()
    m = member(tmp_path, "A", clock)
    Path(m.path).write_bytes(_members_state(clock.ms + LIMIT_MS))
    assert m.heartbeat() == ["A", "ghost"]
    clock.ms -= 1
    with pytest.raises(RmqLockError, match=f"{LIMIT_MS + 1} ms ahead"):
        m.live_clients()


def wait_until(cond, timeout_s=5.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_heartbeat_thread_refreshes_and_context_exit_leaves(tmp_path):
    with GroupMembership(tmp_path, GROUP, "A", heartbeat_timeout_ms=5000) as m:
        m.start_heartbeat(interval_ms=20)
        first = m.members()["A"]
        wait_until(lambda: m.members()["A"] > first, what="a refreshed heartbeat")
        with pytest.raises(RmqOptionError, match="already running"):
            m.start_heartbeat(interval_ms=20)
        thread = m._thread
    assert not thread.is_alive()
    assert m.members() == {}


@pytest.mark.parametrize("interval", [TIMEOUT, TIMEOUT + 1, 0])
def test_heartbeat_interval_must_fit_in_timeout(tmp_path, interval):
    with pytest.raises(RmqOptionError, match="interval_ms"):
        member(tmp_path, "A", FakeClock()).start_heartbeat(interval_ms=interval)


# --------------------------------------------------------------------------------------------
# Real processes


def run_python(code: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


BEATER = """
    import sys
    from rmq_source.group.membership import GroupMembership
    state_dir, group, cid, n, leave = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    m = GroupMembership(state_dir, group, cid, heartbeat_timeout_ms=60000)
    for _ in range(n):
        assert cid in m.heartbeat()
        assert cid in m.live_clients()
    if leave == "leave":
        m.leave()
"""


@pytest.mark.parametrize("leave, expected", [("stay", [f"client-{i}" for i in range(4)]), ("leave", [])])
def test_concurrent_heartbeats_lose_nobody(tmp_path, leave, expected):
    procs = [run_python(BEATER, str(tmp_path), GROUP, f"client-{i}", "15", leave) for i in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
    assert GroupMembership(tmp_path, GROUP, "observer").live_clients() == expected


DOOMED = """
    import sys, time
    from rmq_source.group.membership import GroupMembership
    m = GroupMembership(sys.argv[1], sys.argv[2], "doomed", heartbeat_timeout_ms=int(sys.argv[3]))
    print(",".join(m.heartbeat()), flush=True)
    time.sleep(60)
"""


def test_killed_client_drops_out_after_the_timeout(tmp_path):
    timeout = 400
    survivor = GroupMembership(tmp_path, GROUP, "survivor", heartbeat_timeout_ms=timeout)
    survivor.heartbeat()
    p = run_python(DOOMED, str(tmp_path), GROUP, str(timeout))
    try:
        assert p.stdout.readline().strip() in ("doomed", "doomed,survivor")
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
    last = survivor.members()["doomed"]
    at_timeout = GroupMembership(tmp_path, GROUP, "x", heartbeat_timeout_ms=timeout,
                                 clock=lambda: (last + timeout) / 1000)
    assert "doomed" in at_timeout.live_clients()

    wait_until(lambda: time.time() * 1000 - last > timeout + 5, what="the timeout to pass")
    assert "doomed" not in survivor.live_clients()
    survivor.heartbeat()
    assert set(survivor.members()) == {"survivor"}
