"""The cyclic garbage collector kept off what does not need it: paused while a planning or a
task's read runs, and kept off a Python worker's start-up objects (:func:`freeze_startup_objects`).

A micro-batch over thousands of queues builds per-queue objects that live for the planning and
are freed by reference counting at its end (its queues' statistics, offsets, lock states). With
the collector running, each of its young-generation passes during the planning finds them
alive and promotes them, and every few batches the promotions set off a full collection of the
whole process (measured at 10,000 queues: about one full pass a batch, 20-40 ms each in Spark's
Python source worker). Paused, they die young without being promoted: the planning leaves no more
objects behind than it keeps, and the full passes stop. Nothing the planning builds is cyclic
garbage; whatever cycles anything makes meanwhile are collected once the collector runs again.
"""
from __future__ import annotations

import contextlib
import gc
import os


@contextlib.contextmanager
def collector_paused():
    """Within it, no automatic cyclic collection (also usable as a decorator). The collector is
    enabled again on the way out, however the block ends, only when it was enabled on the way in
    (so a caller's own ``gc.disable()`` stands, and nested or concurrent uses end as they began:
    a second thread entering while paused leaves the state to the first)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


_frozen_in: int | None = None     # the process that froze its start-up objects


def freeze_startup_objects() -> None:
    """Once per process: move the objects alive now (the modules PySpark, pyarrow and this package
    imported into a Python worker, ~80,000 of them) out of the collector's reach (``gc.freeze``).

    PySpark's worker daemon runs a full ``gc.collect()`` after every task of a reused worker.
    Right after a task has streamed hundreds of MB through the caches, that collection's walk
    over every object misses the caches at each step: measured 50-200 ms a task in the read
    workers (the same walk takes 4-10 ms warm), 0.1-0.2 s of the workers' CPU per million
    100-byte messages. Frozen, the objects a worker starts with are not walked again; the objects of each
    task are collected as before. What a frozen object would leak is bounded: only cycles among
    objects alive at the first task, which are the imported modules."""
    global _frozen_in
    pid = os.getpid()
    if _frozen_in == pid:
        return
    _frozen_in = pid
    gc.collect()      # (nothing that is garbage already is frozen)
    gc.freeze()
