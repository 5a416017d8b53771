"""The mapped files of a store as a broker writes them: files named by their 20-digit start offset,
created at full size (sparse, zero-filled) and mapped read-write, written so that a concurrent
reader never sees a record header before the bytes it announces."""
from __future__ import annotations

import errno
import mmap
import os
import re
from pathlib import Path

from rmq_source.errors import RmqStoreLayoutError

FILE_NAME = re.compile(r"^\d{20}$")
ZERO_CHUNK = bytes(1 << 20)


def file_name(start: int) -> str:
    return f"{start:020d}"


def list_files(folder: Path) -> list[tuple[int, Path]]:
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted((int(n), folder / n) for n in names if FILE_NAME.match(n))


def data_ranges(fd: int, pos: int, size: int):
    """(start, end) ranges of ``[pos, size)`` that may hold data; holes of sparse files are skipped
    with SEEK_DATA/SEEK_HOLE where the file system supports them."""
    try:
        while pos < size:
            try:
                data = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:   # no data after pos
                    return
                raise
            hole = min(os.lseek(fd, data, os.SEEK_HOLE), size)
            yield data, hole
            pos = hole
    except (OSError, AttributeError):
        yield pos, size


def zero_from(mm: mmap.mmap, fd: int, pos: int) -> None:
    """Zero every non-zero byte of ``mm`` from ``pos`` on (leftovers of an interrupted write), front
    to back so a reader never sees a record header ahead of zeros it could mistake for data."""
    step = len(ZERO_CHUNK)
    for start, end in list(data_ranges(fd, pos, len(mm))):
        while start < end:
            n = min(step, end - start)
            if mm[start:start + n] != ZERO_CHUNK[:n]:
                mm[start:start + n] = ZERO_CHUNK[:n]
            start += n


def publish(mm: mmap.mmap, pos: int, data: bytes) -> None:
    """Copy records to ``mm[pos:]`` so that a concurrent reader never sees a valid magic before the
    bytes it announces: everything after the first 8 bytes, then TOTALSIZE, then MAGIC last."""
    mm[pos + 8:pos + len(data)] = memoryview(data)[8:]
    mm[pos:pos + 4] = data[:4]
    mm[pos + 4:pos + 8] = data[4:8]


def open_full_size(path: Path, size: int, *, create: bool) -> tuple[int, bool]:
    """A read-write descriptor of the file at ``path`` of ``size`` bytes, and whether it was just
    sized: with ``create`` a missing or empty file is made full size (sparse, zero-filled); any
    other size is RmqStoreLayoutError."""
    fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
    try:
        actual = os.fstat(fd).st_size
        if actual == 0 and create:
            os.ftruncate(fd, size)
            return fd, True
        if actual != size:
            raise RmqStoreLayoutError(f"{path}: file is {actual} bytes, expected {size} (every "
                                      "mapped file of a queue has the same size)")
        return fd, False
    except BaseException:
        os.close(fd)
        raise


class MappedFile:
    """One full-size mapped file, opened read-write (created sparse and zero-filled when new)."""

    __slots__ = ("path", "start", "size", "fd", "mm")

    def __init__(self, path: Path, start: int, size: int, *, create: bool):
        self.path, self.start, self.size = path, start, size
        self.fd, _ = open_full_size(path, size, create=create)
        try:
            self.mm = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        if self.mm is not None:
            self.mm.close()
            self.mm = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
