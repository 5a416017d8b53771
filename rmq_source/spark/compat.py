"""What differs between the PySpark minors the data source supports (4.0 to 4.3), in one place.

The readers and writers import their PySpark base classes from here and never test a version
themselves. Importing this module checks the installed PySpark first: none, or one older than
4.0 (which has no Python data source API), raises :class:`RmqSparkVersionError` naming what was
found.

What differs (docs/options.md, "Spark versions"):

- **Admission control and Trigger.AvailableNow** (``pyspark.sql.streaming.datasource``: read
  limits, ``SupportsTriggerAvailableNow``) came with PySpark 4.2. Before, Spark calls a stream
  reader's ``latestOffset()`` without the batch's start or a limit, and runs
  ``Trigger.AvailableNow`` as a single micro-batch (its fallback for sources without it). There,
  :class:`StreamReaderBase` keeps the start itself (the end it last answered or saw planned; a new
  query's initial offset) and passes the reader's own default limit, so the rate limits still cap
  each micro-batch; ``Trigger.AvailableNow`` reads everything there at the start in one batch, and
  with a rate limit only that limit's worth (warned at query start: Spark does not tell a source
  its trigger).
- **Filter pushdown** (``DataSourceReader.pushFilters``) came with 4.1: on 4.0 Spark never asks,
  so nothing is pushed and Spark filters every row itself, with the same result.
- **Arrow stream writers** (``DataSourceStreamArrowWriter``) came with 4.1: on 4.0 the stream sink
  is an Arrow writer with the stream writer's ``commit(messages, batchId)``, which 4.0's streaming
  sink runner accepts and feeds Arrow batches (it checks only for ``DataSourceArrowWriter``).
"""
from __future__ import annotations

import logging

from rmq_source.errors import RmqSparkVersionError

log = logging.getLogger(__name__)

#: the oldest PySpark with the Python data source API this package needs, and the first that is not
#: supported (PySpark 5 may change the API)
MINIMUM = (4, 0)
BEYOND = (5, 0)


def _installed_version() -> str | None:
    try:
        import pyspark
    except ImportError:
        return None
    return getattr(pyspark, "__version__", None) or "unknown"


def parse_version(text: str) -> tuple[int, int]:
    """(major, minor) of a PySpark version string (``"4.0.5"``, ``"4.1.0.dev1"``)."""
    parts = text.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise RmqSparkVersionError(f"cannot read the PySpark version {text!r}") from None


def check_version(found: str | None) -> tuple[int, int]:
    """(major, minor) of ``found``, or RmqSparkVersionError when it cannot run the data source."""
    need = "PySpark 4.0 or later (pip install 'rmq_source[spark]', which takes pyspark>=4.0,<5)"
    if found is None:
        raise RmqSparkVersionError(f"the rmq data source needs {need}; no pyspark is installed in "
                                   "this Python")
    version = parse_version(found)
    if version < MINIMUM:
        raise RmqSparkVersionError(
            f"the rmq data source needs {need}; found pyspark {found}, which has no Python data "
            "source API (Spark 4.0 added it)")
    if version >= BEYOND:
        log.warning("pyspark %s is newer than the versions rmq_source is tested with (4.0 to 4.x)",
                    found)
    return version


PYSPARK_VERSION_TEXT = _installed_version()
PYSPARK_VERSION = check_version(PYSPARK_VERSION_TEXT)

# ------------------------------------------------------------------------------------ features
ADMISSION_CONTROL = PYSPARK_VERSION >= (4, 2)   # read limits, latestOffset(start, limit), AvailableNow
FILTER_PUSHDOWN = PYSPARK_VERSION >= (4, 1)     # DataSourceReader.pushFilters and the filter classes
ARROW_STREAM_WRITER = PYSPARK_VERSION >= (4, 1)  # DataSourceStreamArrowWriter

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamReader  # noqa: E402

if ADMISSION_CONTROL:
    from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxBytes,  # noqa: E402
                                                  ReadMaxRows, ReadMinRows, SupportsTriggerAvailableNow)
else:
    from dataclasses import dataclass

    class ReadLimit:
        """A micro-batch's read limit (PySpark 4.2's classes of the same names, for older Sparks)."""

    @dataclass
    class ReadAllAvailable(ReadLimit):
        pass

    @dataclass
    class ReadMinRows(ReadLimit):
        min_rows: int

    @dataclass
    class ReadMaxRows(ReadLimit):
        max_rows: int

    @dataclass
    class ReadMaxBytes(ReadLimit):
        max_bytes: int


if ADMISSION_CONTROL:
    class StreamReaderBase(DataSourceStreamReader, SupportsTriggerAvailableNow):
        """The stream reader's Spark side: Spark passes each batch's start and limit."""

        def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
            return self.plan_latest(start, limit)

        def partitions(self, start: dict, end: dict):
            return self.plan_partitions(start, end)

        def warn_unsupported_trigger_options(self) -> None:
            pass
else:
    class StreamReaderBase(DataSourceStreamReader):
        """The stream reader's Spark side where Spark passes neither start nor limit: the start is
        kept here, the limit is the reader's own default read limit.

        The next batch's start is where the last answer ended: Spark calls ``latestOffset()`` only
        after the previous batch is in the commit log, and an answer equal to its start plans no
        batch. A restarted query first plans the batch it logged last (``partitions(start,
        end)``, after ``partitions(end, end)`` through ``setLatestSeenOffset``), a new query
        starts at the initial offset.
        """

        _next_start: dict | None = None
        _planned_once = False

        def latestOffset(self) -> dict:
            start = self._next_start if self._next_start is not None else self.initialOffset()
            first = not self._planned_once
            if first:
                # This process's first plan is made as a Trigger.AvailableNow plan (the run may be
                # one: Spark does not say): up to what is there now, waiting for queues of its
                # group still locked by a member that is gone (an earlier run's process killed:
                # a stopped one leaves, planner_exit), as 4.2+ does; its later plans are plain.
                self.prepareForTriggerAvailableNow()
            try:
                self._next_start = self.plan_latest(start, self.getDefaultReadLimit())
            finally:
                if first:
                    self._target = None
                    self._planned_once = True
            return self._next_start

        def partitions(self, start: dict, end: dict):
            self._next_start = end
            if start == end:
                return []     # setLatestSeenOffset on a restart: a batch that reads nothing
            return self.plan_partitions(start, end)

        def warn_unsupported_trigger_options(self) -> None:
            limits = self.rate_limit_options()
            if limits:
                log.warning(
                    "pyspark %s gives Python sources no Trigger.AvailableNow (PySpark 4.2 added it): "
                    "a Trigger.AvailableNow query of this source runs one micro-batch, capped by %s, "
                    "and stops with the rest left for its next run; processing-time triggers are "
                    "capped as asked", PYSPARK_VERSION_TEXT, ", ".join(limits))


if ARROW_STREAM_WRITER:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as StreamArrowWriterBase  # noqa: E402
else:
    StreamArrowWriterBase = DataSourceArrowWriter


def supported_features() -> dict[str, bool]:
    """Feature -> whether this PySpark has it (for messages, docs and tests)."""
    return {"admission control and Trigger.AvailableNow": ADMISSION_CONTROL,
            "filter pushdown": FILTER_PUSHDOWN, "Arrow stream writer": ARROW_STREAM_WRITER}
