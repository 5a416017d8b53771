"""The cyclic garbage collector kept off what does not need it: paused while a planning or a
task's read runs, and kept off a Python worker's long-lived objects
(:func:`freeze_long_lived_objects`).

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


#: a task's start freezes the oldest generation when it holds this many objects or more
FREEZE_FROM = 10_000


def freeze_long_lived_objects() -> None:
    """At the start of a Spark task (in a Python worker: a TaskContext is set), when the
    collector's oldest generation holds :data:`FREEZE_FROM` objects or more: move every object
    alive out of the collector's reach (``gc.freeze``). Elsewhere (a test or a script calling a
    reader itself) nothing is frozen: a long-lived process of other work is not a worker.

    PySpark's worker daemon runs a full ``gc.collect()`` after every task of a reused worker.
    Right after a task has streamed hundreds of MB through the caches, that collection's walk
    over every object misses the caches at each step: measured 50-200 ms a task in the read
    workers (the same walk takes 4-10 ms warm), 0.1-0.2 s of the workers' CPU per million
    100-byte messages. What a worker holds at a task's start outlives tasks: the modules PySpark,
    pyarrow and this package imported (~80,000 objects at the first task), and the ones imported
    by a task since (the same workers run the sink's tasks, during which PySpark imports pandas,
    ~30,000 objects, and a user's own Python functions). Frozen, they are not walked again; each
    task's objects are collected as before, and the next freeze comes only when the old
    generation has grown that much again.
    Nothing that is garbage is frozen (a collection comes first); what a frozen object could
    leak is bounded: only cycles among objects that were alive at a task's start."""
    from pyspark import TaskContext
    if TaskContext.get() is None or len(gc.get_objects(generation=2)) < FREEZE_FROM:
        return
    gc.collect()
    gc.freeze()
