"""Waiting on long-running test queries, and keeping them alive through Spark's own start-up limit
(nothing else).

Spark starts the Python worker that plans a Python data source's stream with a fixed 10 s for the
worker to connect back (``PythonWorkerFactory.createSimpleWorker``; no setting raises it). On a
machine loaded far beyond its cores (two suites side by side) a query can die of that before its
first batch, before any code of ours ran. A test that waits for a state across several queries
restarts such a query from its checkpoint, as a supervisor would; any other failure fails the test
at once with the query's own error instead of a timeout later.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

log = logging.getLogger(__name__)

WORKER_START_TIMEOUTS = ("Python worker failed to connect back",
                         "Timed out while waiting for the Python worker to connect back")


def revive(queries: dict, start: Callable[[str], object]) -> None:
    """Check each query of ``queries`` (name -> StreamingQuery, updated in place): restart one that
    died of Spark's worker start-up timeout with ``start(name)``, one per call (restarting all of
    them at once on a machine that loaded starts as many planning workers at once, and they died
    again: 57 restarts in 300 s once); raise any other query failure."""
    restarted = False
    for name, query in list(queries.items()):
        if query.isActive:
            continue
        error = query.exception()
        if error is None:
            continue   # stopped by the test
        text = str(error)
        if any(t in text for t in WORKER_START_TIMEOUTS):
            if restarted:
                continue       # the next call restarts it
            restarted = True
            log.warning("query %s died of Spark's Python worker start-up timeout; restarting it "
                        "from its checkpoint", name)
            queries[name] = start(name)
            continue
        raise AssertionError(f"query {name} failed: {text[:2000]}")


def wait_alive(queries, what: str, done: Callable[[], object], timeout: float = 120) -> None:
    """Poll ``done()`` every 0.5 s until it is true; fail with ``what`` after ``timeout`` s, or at
    once with the error of a query of ``queries`` (one StreamingQuery or several) that died."""
    queries = queries if isinstance(queries, (list, tuple)) else [queries]
    deadline = time.monotonic() + timeout
    while not done():
        for q in queries:
            assert q.exception() is None, f"{what}: {q.exception()}"
        assert time.monotonic() < deadline, what
        time.sleep(0.5)
