"""Arrow columns handed to the C core as ``rmq_sink_col`` (native/rmq_core.h): entry ``i`` of a
binary or string column is ``data[off[i] .. off[i+1])``, offsets widened to int64, validity one
byte per entry (NULL when nothing is null). The C core checks the offsets against the data
before it reads; the arrays given to :func:`fill` and :func:`lists` are kept alive in ``keep``
for as long as the C call runs.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from rmq_source.store.native import ffi


def _offsets(buf: pa.Buffer, wide: bool, start: int, n: int) -> np.ndarray:
    off = np.frombuffer(buf, dtype=np.int64 if wide else np.int32)[start:start + n + 1]
    return off if wide else off.astype(np.int64)


def validity(arr: pa.Array) -> np.ndarray | None:
    """One byte per entry (0: null), None when nothing is null."""
    if not arr.null_count:
        return None
    return arr.is_valid().to_numpy(zero_copy_only=False).view(np.uint8)


def fill(col, arr: pa.Array, keep: list) -> None:
    """Points ``col`` (an ``rmq_sink_col``) at a binary/string array."""
    bufs = arr.buffers()
    wide = pa.types.is_large_binary(arr.type) or pa.types.is_large_string(arr.type)
    off = _offsets(bufs[1], wide, arr.offset, len(arr))
    data = bufs[2]
    valid = validity(arr)
    keep.extend((off, valid, data))
    col.off = ffi.from_buffer("int64_t[]", off)
    col.data = ffi.NULL if data is None or data.size == 0 else ffi.cast("const uint8_t *", data.address)
    col.data_len = 0 if data is None else data.size
    col.valid = ffi.NULL if valid is None else ffi.from_buffer("uint8_t[]", valid)


def lists(arr: pa.Array, keep: list):
    """(offsets pointer, validity pointer or NULL, offsets, validity) of a list or map array:
    row ``r``'s entries are ``offsets[r] .. offsets[r+1]`` of the array's child (``.values``)."""
    off = _offsets(arr.buffers()[1], pa.types.is_large_list(arr.type), arr.offset, len(arr))
    valid = validity(arr)
    keep.extend((off, valid))
    return (ffi.from_buffer("int64_t[]", off),
            ffi.NULL if valid is None else ffi.from_buffer("uint8_t[]", valid), off, valid)
