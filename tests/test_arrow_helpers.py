"""The Arrow helpers of the read path (rmq_source/schema.py) and what they are for: reading a store
or a pull answer never imports pandas (pyarrow's pa.array, pa.repeat, pa.scalar, from_pylist and
to_numpy would, 0.2 s in every fresh Python worker and in the streaming source's runner), nor
pyarrow.compute (20 ms) or the sink (15 ms) unless a filter or a write needs them."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest

from rmq_source.schema import ARROW_SCHEMA, empty_batch, int32_array, numpy_view, repeat_string


@pytest.mark.parametrize("value, n", [("TopicTest", 3), ("tópico", 2), ("", 4), ("x", 0)])
def test_repeat_string(value, n):
    a = repeat_string(value, n)
    a.validate(full=True)
    assert a.type == pa.string() and a.to_pylist() == [value] * n


def test_int32_array_and_numpy_view():
    a = int32_array(np.array([7, -1, 2**31 - 1], dtype=np.int64))
    a.validate(full=True)
    assert a.type == pa.int32() and a.to_pylist() == [7, -1, 2**31 - 1]
    sliced = pa.array([1, 2, 3, 4, 5], pa.int64()).slice(2)
    assert numpy_view(sliced).tolist() == [3, 4, 5]          # the slice's offset is honoured
    with pytest.raises(ValueError, match="nulls"):
        numpy_view(pa.array([1, None], pa.int32()))
    with pytest.raises(ValueError):
        numpy_view(pa.array(["a"]))


def test_empty_batch():
    b = empty_batch(ARROW_SCHEMA)
    b.validate(full=True)
    assert b.num_rows == 0 and b.schema == ARROW_SCHEMA


def test_a_store_read_does_not_import_pandas_compute_or_the_sink(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
        from store_builder import build_store
        build_store({str(tmp_path / "s")!r}, topics=(("T", 3, 40),))
        from rmq_source.spark.compat import ReadAllAvailable
        from rmq_source.spark.datasource import RocketMQDataSource
        reader = RocketMQDataSource({{"storePath": {str(tmp_path / "s")!r}, "topic": "T",
                                      "startingOffsets": "earliest"}}).streamReader(None)
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        rows = sum(b.num_rows for p in reader.partitions(start, end) for b in reader.read(p))
        print(rows, *(m in sys.modules for m in ("pandas", "pyarrow.compute", "rmq_source.sink.producer")))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["40", "False", "False", "False"]
