"""Where a test run's time goes: JVM starts and stops (NameServers, brokers, Spark), recorded by the
test process and by the helper processes it starts, and summed at the end of the run (conftest.py
prints the table after pytest's own summary, so growth shows in every CI run).

Each record is one JSON line appended to the file named by ``$RMQ_PHASE_TIMINGS`` (set by conftest
for the whole run and inherited by subprocesses); an append of one short line is atomic, so the
test process and its helpers write to the same file without a lock. Without the variable nothing
is recorded (bench/ and helpers run by hand).
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from collections import defaultdict

ENV = "RMQ_PHASE_TIMINGS"
#: a row each pytest process writes at its start (pytest-xdist workers too): its phases are the
#: tests' own, the others' (helper processes) overlap with them
TEST_PROCESS = "_pytest process"


def record(phase: str, seconds: float, what: str = "") -> None:
    """Note that ``phase`` (e.g. "broker start") took ``seconds`` for ``what``, ending now."""
    path = os.environ.get(ENV)
    if not path:
        return
    line = json.dumps({"phase": phase, "s": round(seconds, 3), "end": round(time.time(), 3),
                       "what": what, "pid": os.getpid()})
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


@contextlib.contextmanager
def timed(phase: str, what: str = ""):
    """Record how long the block took as ``phase`` (also when it raises)."""
    start = time.monotonic()
    try:
        yield
    finally:
        record(phase, time.monotonic() - start, what)


def summary(path: str, wall_s: float) -> list[str]:
    """The table printed at the end of a run: per phase, how many and how many seconds; then the
    run's wall time and what is left of it. Phases recorded by helper processes overlap with the
    tests that started them, and phases nest (a cluster start holds its servers' boots), so the
    rest is wall time minus the union of the pytest processes' own phase intervals (with
    pytest-xdist: the time no worker spent in a phase)."""
    count: dict[str, int] = defaultdict(int)
    total: dict[str, float] = defaultdict(float)
    own: list[tuple[float, float]] = []
    try:
        with open(path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        rows = []
    testers = {row["pid"] for row in rows if row["phase"] == TEST_PROCESS} | {os.getpid()}
    for row in rows:
        if row["phase"] == TEST_PROCESS:
            continue
        count[row["phase"]] += 1
        total[row["phase"]] += row["s"]
        if row["pid"] in testers:
            own.append((row["end"] - row["s"], row["end"]))
    lines = [f"{'phase':<44}{'count':>7}{'seconds':>10}"]
    for phase in sorted(total, key=total.get, reverse=True):
        lines.append(f"{phase:<44}{count[phase]:>7}{total[phase]:>10.1f}")
    lines.append(f"{'pytest wall time':<44}{'':>7}{wall_s:>10.1f}")
    lines.append(f"{'  of it outside the phases above (tests)':<44}{'':>7}{wall_s - _covered(own):>10.1f}")
    return lines


def _covered(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of ``intervals``."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total
