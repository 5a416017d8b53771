"""The rmq data source with a SIGKILL at a chosen step of a micro-batch's life, for crash tests.

``RMQ_CRASH_AT`` names the step, ``RMQ_CRASH_PGID`` the process group of the query's driver script
(the JVM and the Python workers it starts are in it, or in a group of their own):

* ``plan:N`` — the N-th ``latestOffset`` of this process returned (the plan is recorded and the
  locks taken) but Spark has not yet logged the batch;
* ``next:N`` — the N-th ``latestOffset`` of this process was entered: the batch before it is
  committed in the checkpoint, its group progress not yet recorded;
* ``logged:N`` — the N-th ``partitions`` call: Spark logged the batch, no task ran yet;
* ``reading:OFFSET`` — a task read its first rows of a range starting at ``OFFSET`` or later;
* ``failing:OFFSET`` — such a task raises instead: the query fails (no kill), and the process
  ends with exit code 1;
* ``sending:N`` — a task of the rmq sink (``writeStream.format("rmq")``) in a micro-batch after
  the first (id >= 1) had the broker's answer to N of its messages: dies before it sends more,
  so exactly N messages of that batch are stored.

The kill takes every process of the query at once, as ``kill -9`` of a driver host would.
"""
from __future__ import annotations

import os
import signal

from pyspark import TaskContext

from rmq_source import RocketMQDataSource
from rmq_source.sink.producer import TaskProducer
from rmq_source.spark.sink_writer import BATCH_ID_PROPERTY, RmqSinkStreamWriter
from rmq_source.spark.stream_reader import RmqStreamReader


def _spec() -> tuple[str, int]:
    step, _, n = os.environ["RMQ_CRASH_AT"].partition(":")
    if step not in ("plan", "next", "logged", "reading", "failing", "sending") or not n.isdigit():
        raise SystemExit(f"RMQ_CRASH_AT={os.environ['RMQ_CRASH_AT']!r}: expected plan|next|logged|"
                         "reading|failing|sending:N")
    return step, int(n)


def _die() -> None:
    for pgid in (int(os.environ["RMQ_CRASH_PGID"]), os.getpgrp()):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.kill(os.getpid(), signal.SIGKILL)


class CrashingStreamReader(RmqStreamReader):
    """:class:`RmqStreamReader` that dies at the step ``RMQ_CRASH_AT`` names."""

    def __init__(self, opts):
        super().__init__(opts)
        self._calls = {"plan": 0, "next": 0, "logged": 0}

    def _count(self, step: str) -> bool:
        self._calls[step] += 1
        want, n = _spec()
        return want == step and self._calls[step] == n

    # (the planning steps, behind whichever latestOffset/partitions this PySpark calls)
    def plan_latest(self, start, limit):
        if self._count("next"):
            _die()
        end = super().plan_latest(start, limit)
        if self._count("plan"):
            _die()
        return end

    def plan_partitions(self, start, end):
        if self._count("logged"):
            _die()
        return super().plan_partitions(start, end)

    def read(self, partition):
        step, offset = _spec()
        ranges = getattr(partition, "ranges", ())
        doomed = step in ("reading", "failing") and any(r.start >= offset and r.end > r.start
                                                         for r in ranges)
        for n, batch in enumerate(super().read(partition)):
            if doomed and n == 1:
                break
            yield batch
        if doomed and step == "failing":
            raise RuntimeError(f"task failure injected by RMQ_CRASH_AT={step}:{offset}")
        if doomed:
            _die()

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._calls = {"plan": 0, "next": 0, "logged": 0}


class CrashingSinkStreamWriter(RmqSinkStreamWriter):
    """:class:`RmqSinkStreamWriter` whose tasks die at ``sending:N``."""

    def write(self, iterator):
        step, n = _spec()
        if step != "sending" or int(TaskContext.get().getLocalProperty(BATCH_ID_PROPERTY) or 0) < 1:
            return super().write(iterator)
        real, stored = TaskProducer._done, [0]

        def counted(producer, lane, batch):   # the broker answered: batch.count messages stored
            real(producer, lane, batch)
            stored[0] += batch.count
            if stored[0] >= n:
                _die()
        TaskProducer._done = counted          # this worker process only; it dies with it
        try:
            return super().write(iterator)
        finally:
            TaskProducer._done = real


class CrashingDataSource(RocketMQDataSource):
    """Registered under the name ``rmq`` in place of the real source (and sink) by the crash run."""

    def streamReader(self, schema):
        real = super().streamReader(schema)
        return CrashingStreamReader(real.opts)

    def streamWriter(self, schema, overwrite):
        return CrashingSinkStreamWriter(super().streamWriter(schema, overwrite).opts)
