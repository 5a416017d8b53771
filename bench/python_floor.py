"""``format("python_floor")``: a streaming Python data source that costs nothing but Spark's own
machinery, the floor under any Python streaming source's latency and start-up.

It stands for a perfect broker: message ``k`` is sent at ``k / rate`` seconds of the epoch and can
be read at once. An offset is a time (``{"ms": epoch ms}``); the latest offset is now; a
micro-batch ``(start, end]`` is one task yielding the messages sent in it, each a ``value`` of
``size`` bytes whose first 8 are its send time in ms (big-endian), as bench_vs_kafka.py's producer
writes them. Options: ``rate`` (msgs/s), ``size`` (bytes), ``endMs`` (a fixed latest offset: a
Trigger.AvailableNow run of one small batch measures the start-up).
"""
from __future__ import annotations

import time

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition


class _Window(InputPartition):
    def __init__(self, start_ms: int, end_ms: int):
        super().__init__((start_ms, end_ms))
        self.start_ms, self.end_ms = start_ms, end_ms


class FloorStreamReader(DataSourceStreamReader):
    def __init__(self, rate: float, size: int, end_ms: int | None):
        self.rate, self.size, self.end_ms = rate, size, end_ms

    def initialOffset(self) -> dict:
        return {"ms": 0 if self.end_ms is not None else int(time.time() * 1000)}

    def latestOffset(self, start=None, limit=None) -> dict:
        return {"ms": self.end_ms if self.end_ms is not None else int(time.time() * 1000)}

    def partitions(self, start: dict, end: dict):
        return [_Window(start["ms"], end["ms"])]

    def read(self, partition):
        import numpy as np
        import pyarrow as pa

        first = int(np.floor(partition.start_ms * self.rate / 1000)) + 1    # sent after start
        last = int(np.floor(partition.end_ms * self.rate / 1000))           # sent at or before end
        n = max(0, last - first + 1)
        sent = (np.arange(first, first + n, dtype=np.float64) * 1000 / self.rate).astype(np.int64)
        data = np.zeros((n, self.size), dtype=np.uint8)
        data[:, :8] = sent.astype(">i8").view(np.uint8).reshape(n, 8)
        offsets = np.arange(n + 1, dtype=np.int32) * self.size
        values = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                        pa.py_buffer(data)])
        yield pa.RecordBatch.from_arrays([values], names=["value"])

    def commit(self, end: dict) -> None:
        pass


class PythonFloorDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "python_floor"

    def schema(self) -> str:
        return "value binary"

    def streamReader(self, schema):
        end = self.options.get("endMs")
        return FloorStreamReader(float(self.options.get("rate", "1000")),
                                 int(self.options.get("size", "1024")),
                                 int(end) if end is not None else None)
