"""A stream planner process that Spark stops leaves its consumer group on the way out.

Spark runs a Python stream reader in a process of its own
(``python -m pyspark.sql.streaming.python_streaming_source_runner``). When the query stops, the
JVM closes that process's socket and ends the process with SIGTERM
(``PythonWorkerFactory.stopWorker`` destroys it), racing PySpark's ``finally: reader.stop()``,
which runs when the socket's end is read. Python's default for SIGTERM ends a process at once:
a group query's queue locks and membership then outlive it until their leases run out, and the
query's next run (or another member) waits for them.

:func:`leave_cleanly_on_sigterm` changes SIGTERM in that process only: while the reader's stop is
under way, the signal waits for it to finish (the process then ends as PySpark ends it);
otherwise it raises :class:`SystemExit` in the main thread, so PySpark's loop unwinds through
``reader.stop()``. Later SIGTERMs wait too (Spark sends two: ``stopWorker`` and the factory's
``stop`` each destroy the process). Whatever happens, the process ends within
:data:`GRACE_S` of the first SIGTERM (an alarm, whose default action ends it). Nothing changes
in any other process (a driver, a task worker, a test).
"""
from __future__ import annotations

import signal
import sys
import threading
from typing import Callable

#: the module PySpark runs a stream reader's planner process as (every 4.x minor)
PLANNER_MODULE = "pyspark.sql.streaming.python_streaming_source_runner"

#: seconds a stopped planner process has to release its queues and leave before it ends anyway
GRACE_S = 30

_stop_underway: Callable[[], bool] = lambda: False  # noqa: E731
_exiting = False


def is_planner_process() -> bool:
    """Whether this process is Spark's stream planner process (run as ``python -m`` that module)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == PLANNER_MODULE


def leave_cleanly_on_sigterm(stop_underway: Callable[[], bool]) -> bool:
    """In Spark's planner process, from its main thread, with SIGTERM at its default: handle
    SIGTERM as the module docstring says; ``stop_underway()`` tells whether the reader's stop is
    running now. True if the handler is in place (installed now or before)."""
    global _stop_underway
    installed = signal.getsignal(signal.SIGTERM) is _on_sigterm
    free = (is_planner_process() and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
    if not (installed or free):
        return False
    _stop_underway = stop_underway
    if not installed:
        signal.signal(signal.SIGTERM, _on_sigterm)
    return True


def _on_sigterm(signum, _frame) -> None:
    global _exiting
    if _exiting:
        return          # the first SIGTERM's stop is under way (or its SystemExit unwinding)
    _exiting = True
    signal.alarm(GRACE_S)
    if not _stop_underway():
        raise SystemExit(128 + signum)
    # else the reader is releasing its queues and leaving: let it finish
