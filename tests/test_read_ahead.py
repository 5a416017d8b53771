"""Small ranges of a live task read ahead several at once (rmq_source.remote.read_ahead)."""
from __future__ import annotations

import threading
from typing import NamedTuple

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def _native(qid: int, offsets: range) -> pa.RecordBatch:
    from rmq_source.store import native
    rows = [{"queueId": 0, "queueOffset": o, "commitLogOffset": o * 100, "storeSize": 100,
             "body": b"b%d" % o, "sysFlag": 0, "keys": [], "properties": []} for o in offsets]
    return pa.RecordBatch.from_pylist(rows, schema=native.NATIVE_SCHEMA)


@given(st.lists(st.tuples(st.sampled_from(["broker-a", "broker-b"]), st.integers(0, 3),
                          st.integers(0, 40)), max_size=30),
       st.integers(1, 64), st.integers(1 << 10, 1 << 16))
@settings(max_examples=200, deadline=None)
def test_full_rows_converts_ranges_of_one_broker_together(parts, max_rows, max_bytes):
    """The rows of consecutive ranges of one broker made full rows at once: the same rows, in the
    same order, as converting each range alone; an output never mixes brokers; several parts are
    joined only within the limits, and a part of an eighth of a limit or more is never joined."""
    from rmq_source.group.allocation import MessageQueue
    from rmq_source.store.reader import native_rows
    given_parts, expected, first = [], [], 0
    for broker, qid, n in parts:
        mq = MessageQueue("T", broker, qid)
        batch = _native(qid, range(first, first + n))
        first += n
        given_parts.append((batch, mq))
        if n:
            expected.append(native_rows(batch, "T", broker, qid))
    out = list(read_ahead.full_rows(iter(given_parts), max_rows, max_bytes))
    want = pa.Table.from_batches(expected) if expected else None
    got = pa.Table.from_batches(out) if out else None
    assert (got is None) == (want is None)
    if got is not None:
        assert got.equals(want)
    for batch in out:
        assert len(set(batch.column("brokerName").to_pylist())) == 1
        offsets = batch.column("queueOffset").to_pylist()
        members = [b for b, _ in given_parts if b.num_rows and b.column("queueOffset")[0].as_py() in offsets]
        if len(members) > 1:
            assert batch.num_rows <= max_rows
            assert sum(m.get_total_buffer_size() for m in members) <= max_bytes
            assert all(m.num_rows * 8 < max_rows and m.get_total_buffer_size() * 8 < max_bytes
                       for m in members)
