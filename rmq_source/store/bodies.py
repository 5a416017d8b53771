"""Body decompression, chosen per message from SYSFLAG (format document §6).

``sysFlag & 0x1`` marks a compressed body; ``(sysFlag & 0x700) >> 8`` names the codec: 0 (4.9.3 and
legacy 5.x) and 3 are zlib, 1 is an LZ4 frame, 2 is a zstd frame. LZ4 and zstd need the optional
``lz4`` and ``zstandard`` packages.
"""
from __future__ import annotations

import zlib

import pyarrow as pa

from rmq_source.errors import RmqCorruptStoreError, RmqMissingDependencyError
from rmq_source.schema import numpy_view

COMPRESSED_FLAG = 0x1
COMPRESSION_TYPE_MASK = 0x700
ZLIB, LZ4, ZSTD, ZLIB_EXPLICIT = 0, 1, 2, 3


def _lz4(data: bytes) -> bytes:
    try:
        import lz4.frame
    except ImportError as exc:
        raise RmqMissingDependencyError(
            "an LZ4-compressed body needs the Python package 'lz4' (pip install lz4)") from exc
    return lz4.frame.decompress(data)


def _zstd(data: bytes) -> bytes:
    try:
        import zstandard
    except ImportError as exc:
        raise RmqMissingDependencyError(
            "a ZSTD-compressed body needs the Python package 'zstandard' (pip install zstandard)"
        ) from exc
    # Java's ZstdOutputStream writes frames without a content size: decompress as a stream.
    return zstandard.ZstdDecompressor().decompressobj().decompress(data)


_CODECS = {ZLIB: zlib.decompress, ZLIB_EXPLICIT: zlib.decompress, LZ4: _lz4, ZSTD: _zstd}


def decompress_body(data: bytes, sys_flag: int) -> bytes:
    """The body as the producer sent it; ``data`` unchanged when the record is not compressed."""
    if not sys_flag & COMPRESSED_FLAG:
        return data
    codec = (sys_flag & COMPRESSION_TYPE_MASK) >> 8
    fn = _CODECS.get(codec)
    if fn is None:
        raise RmqCorruptStoreError(f"unknown compression type {codec} in sysFlag {sys_flag:#x}",
                                   code="BAD_COMPRESSION")
    try:
        return fn(data)
    except RmqMissingDependencyError:
        raise
    except Exception as exc:  # zlib.error, lz4/zstd errors: all mean the stored bytes are bad
        raise RmqCorruptStoreError(f"cannot decompress body (codec {codec}): {exc}",
                                   code="BAD_COMPRESSION") from exc


def decompress_bodies(bodies: pa.Array, sys_flags: pa.Array, commitlog_offsets: pa.Array) -> pa.Array:
    """Decompress the compressed rows of a batch; uncompressed batches are returned as they are.

    A body that does not decompress raises :class:`RmqCorruptStoreError` naming the record's
    CommitLog offset.
    """
    if sys_flags.null_count == 0:   # (the decoder's column: numpy reads it without a copy)
        if not (numpy_view(sys_flags) & COMPRESSED_FLAG).any():
            return bodies
    else:
        import pyarrow.compute as pc   # slow to import: only where used
        if not pc.any(pc.not_equal(pc.bit_wise_and(sys_flags, COMPRESSED_FLAG), 0)).as_py():
            return bodies
    values = bodies.to_pylist()
    flags = sys_flags.to_pylist()
    for i, flag in enumerate(flags):
        if flag & COMPRESSED_FLAG and values[i] is not None:
            try:
                values[i] = decompress_body(values[i], flag)
            except RmqCorruptStoreError as exc:
                offset = commitlog_offsets[i].as_py()
                raise RmqCorruptStoreError(f"record at commitLogOffset {offset}: {exc}",
                                           position=offset, code=exc.code) from exc
    return pa.array(values, type=pa.binary())
