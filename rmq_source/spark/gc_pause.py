"""The cyclic garbage collector paused while a planning runs.

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
