"""Keeping long-running test queries alive through Spark's own start-up limit, and nothing else.

Spark starts the Python worker that plans a Python data source's stream with a fixed 10 s for the
worker to connect back (``PythonWorkerFactory.createSimpleWorker``; no setting raises it). On a
machine loaded far beyond its cores (two suites side by side) a query can die of that before its
first batch, before any code of ours ran. A test that waits for a state across several queries
restarts such a query from its checkpoint, as a supervisor would; any other failure fails the test
at once with the query's own error instead of a timeout later.
"""
from __future__ import annotations

import logging
from typing import Callable

log = logging.getLogger(__name__)

WORKER_START_TIMEOUTS = ("Python worker failed to connect back",
                         "Timed out while waiting for the Python worker to connect back")


def revive(queries: dict, start: Callable[[str], object]) -> None:
    """Check each query of ``queries`` (name -> StreamingQuery, updated in place): restart one that
    died of Spark's worker start-up timeout with ``start(name)``; raise any other query failure."""
    for name, query in list(queries.items()):
        if query.isActive:
            continue
        error = query.exception()
        if error is None:
            continue   # stopped by the test
        text = str(error)
        if any(t in text for t in WORKER_START_TIMEOUTS):
            log.warning("query %s died of Spark's Python worker start-up timeout; restarting it "
                        "from its checkpoint", name)
            queries[name] = start(name)
            continue
        raise AssertionError(f"query {name} failed: {text[:2000]}")
