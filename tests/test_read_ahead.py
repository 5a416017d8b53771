"""Small ranges of a live task read ahead several at once (rmq_source.remote.read_ahead)."""
from __future__ import annotations

import threading
from typing import NamedTuple

import pyarrow as pa
import pytest

from rmq_source.remote import read_ahead


class R(NamedTuple):
    name: str
    start: int
    end: int


def _batches(r: R):
    for offset in range(r.start, r.end, 10):
        yield pa.record_batch({"range": [r.name], "offset": [offset]})


def _rows(batches) -> list[tuple[str, int]]:
    return [(b.column(0)[0].as_py(), b.column(1)[0].as_py()) for b in batches]


@pytest.fixture(scope="module")
def executor():
    with read_ahead.pool() as pool:
        yield pool


def test_rows_come_in_range_order_while_small_ranges_are_read_at_once(executor):
    """The first THREADS small ranges are read at the same time (each waits at a barrier for the
    others: read one after the other, the barrier would break), a large one in its turn by the
    caller's thread, and the rows keep the ranges' order."""
    small = [R(f"s{i}", 0, 20) for i in range(3 * read_ahead.THREADS)]
    ranges = small[:read_ahead.THREADS] + [R("large", 0, 100)] + small[read_ahead.THREADS:]
    barrier = threading.Barrier(read_ahead.THREADS, timeout=60)
    threads = {}

    def read(r: R):
        threads[r.name] = threading.current_thread().name
        if r.name in {s.name for s in small[:read_ahead.THREADS]}:
            barrier.wait()
        return _batches(r)

    got = _rows(read_ahead.in_range_order(ranges, read, executor))
    assert got == _rows(b for r in ranges for b in _batches(r))
    assert threads["large"] == threading.current_thread().name
    assert all(threads[s.name].startswith("rmq-read-ahead") for s in small)


def test_an_error_of_a_range_read_ahead_comes_in_its_turn(executor):
    ranges = [R(f"s{i}", 0, 10) for i in range(6)]

    def read(r: R):
        if r.name == "s3":
            raise RuntimeError("lost s3")
        return _batches(r)

    out = read_ahead.in_range_order(ranges, read, executor)
    assert _rows(next(out) for _ in range(3)) == [("s0", 0), ("s1", 0), ("s2", 0)]
    with pytest.raises(RuntimeError, match="lost s3"):
        next(out)


def test_a_caller_that_stops_leaves_nothing_waiting(executor):
    started = []
    ranges = [R(f"s{i}", 0, 10) for i in range(50)]

    def read(r: R):
        started.append(r.name)
        return _batches(r)

    out = read_ahead.in_range_order(ranges, read, executor)
    next(out)
    out.close()
    executor.submit(lambda: None).result(timeout=60)       # (whatever ran has ended)
    assert len(started) <= 1 + read_ahead.THREADS         # nothing more than the window was asked


def test_fewer_than_two_small_ranges_are_read_in_turn(executor):
    names = []
    ranges = [R("large", 0, 100), R("s", 0, 5)]
    got = _rows(read_ahead.in_range_order(ranges, lambda r: names.append(
        threading.current_thread().name) or _batches(r), executor))
    assert got == _rows(b for r in ranges for b in _batches(r))
    assert set(names) == {threading.current_thread().name}
