"""The row schema: the public contract of every reader (store API, Spark, CLI --json).

Timestamps are ``timestamp[us, UTC]`` in Arrow (Spark's TimestampType); the store holds epoch
milliseconds, multiplied by 1000 on the way out.
"""
from __future__ import annotations

import pyarrow as pa

SPARK_DDL = (
    "topic string, brokerName string, queueId int, queueOffset long, commitLogOffset long, "
    "storeSize int, msgId string, uniqKey string, tags string, keys array<string>, body binary, "
    "properties map<string,string>, bornTimestamp timestamp, storeTimestamp timestamp, "
    "bornHost string, storeHost string, sysFlag int, flag int, reconsumeTimes int, bodyCRC int, "
    "preparedTransactionOffset long"
)

TIMESTAMP = pa.timestamp("us", tz="UTC")

ARROW_SCHEMA = pa.schema([
    ("topic", pa.string()),
    ("brokerName", pa.string()),
    ("queueId", pa.int32()),
    ("queueOffset", pa.int64()),
    ("commitLogOffset", pa.int64()),
    ("storeSize", pa.int32()),
    ("msgId", pa.string()),
    ("uniqKey", pa.string()),
    ("tags", pa.string()),
    ("keys", pa.list_(pa.string())),
    ("body", pa.binary()),
    ("properties", pa.map_(pa.string(), pa.string())),
    ("bornTimestamp", TIMESTAMP),
    ("storeTimestamp", TIMESTAMP),
    ("bornHost", pa.string()),
    ("storeHost", pa.string()),
    ("sysFlag", pa.int32()),
    ("flag", pa.int32()),
    ("reconsumeTimes", pa.int32()),
    ("bodyCRC", pa.int32()),
    ("preparedTransactionOffset", pa.int64()),
])

COLUMN_NAMES = tuple(ARROW_SCHEMA.names)


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    """A batch of no rows of ``schema`` (built from ``pa.nulls``: ``from_pylist`` and ``pa.array``
    import pandas, 0.2 s in every fresh Python worker)."""
    return pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)


def int32_array(values) -> pa.Array:
    """An int32 Arrow array over a numpy array's buffer (``pa.array`` would import pandas)."""
    import numpy as np
    values = np.ascontiguousarray(values, dtype=np.int32)
    return pa.Array.from_buffers(pa.int32(), len(values), [None, pa.py_buffer(values)])


def repeat_string(value: str, n: int) -> pa.StringArray:
    """``value`` ``n`` times as a string array (``pa.repeat`` and ``pa.scalar`` import pandas)."""
    import numpy as np
    raw = value.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(raw)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)])


def numpy_view(array: pa.Array):
    """A zero-copy numpy view of an integer Arrow array without nulls (``to_numpy`` imports
    pandas)."""
    import numpy as np
    if array.null_count or not pa.types.is_integer(array.type):
        raise ValueError(f"numpy_view of {array.type} with {array.null_count} nulls")
    kind = "i" if pa.types.is_signed_integer(array.type) else "u"
    dtype = np.dtype(f"{kind}{array.type.bit_width // 8}")
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array),
                         offset=array.offset * dtype.itemsize)
