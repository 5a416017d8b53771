"""Many queue ranges of one store read as a task reads them: the C core scans the ranges of a topic
in one call per batch (:func:`rmq_source.store.native.scan_ranges`), not one call per range, and
a batch of many ranges is converted to rows once.

Each range is read as :meth:`Store.iter_batches` reads it: its ConsumeQueue listed, then the
CommitLog, retention reported through ``on_data_loss`` before the range is scanned, a queue that
ends before the range does (or is gone) through ``on_short_read``, a bad unit or record raised
naming its file and position; rows in ascending queue offset, ranges in the given order. Only the
batch boundaries differ: a batch holds the rows of many ranges, at most ``batch_rows`` rows and
``batch_bytes`` bytes of data.
"""
from __future__ import annotations

from typing import Iterator, NamedTuple, Sequence

import numpy as np
import pyarrow as pa

from rmq_source.backend import RangeRead
from rmq_source.errors import RmqOptionError, RmqStoreLayoutError
from rmq_source.store import native

#: Ranges prepared (listed, checked) for the first C call of a read; a window that the call
#: reads whole lets the next one be 4 times larger, a call that stops early (the batch is full)
#: sizes the next from what it read, so the ranges prepared and not read stay few.
FIRST_WINDOW = 512
MIN_WINDOW = 16


class _Listed(NamedTuple):
    """A range of a window after its ConsumeQueue was listed (segs None: gone, see ``gone``)."""

    index: int
    segs: list | None
    cq_size: int
    written: int
    gone: str | None      # why the queue cannot be read (its store root was removed)


class _Ready(NamedTuple):
    """A range of a window to scan: ``[pos, stop)`` of its queue; ``short``: the queue ended
    before the range (it is listed again once read to ``stop``)."""

    index: int
    files: native.QueueFiles
    segs: list
    pos: int
    stop: int
    short: bool


def read_ranges(store, ranges: Sequence[RangeRead], *, subscription, batch_rows: int,
                batch_bytes: int, verify_crc: bool, columns: tuple[str, ...] | None = None
                ) -> Iterator[pa.RecordBatch]:
    """Batches of the full row schema holding the rows of ``ranges`` (queues of ``store``, each
    with both callbacks), in range order (module doc). A batch is handed out as soon as it is
    full, before more is read. ``columns``: the columns the caller uses (None: all), others may
    come empty or null (:func:`native.skip_bits`)."""
    from rmq_source.store.reader import _check_offset, _check_subscription
    if batch_rows <= 0 or batch_bytes <= 0:
        raise RmqOptionError("batch_rows and batch_bytes must be positive")
    sub = _check_subscription(subscription)
    codes = sub.codes if sub.tag_filter else None     # SQL92: the caller filters rows
    tags = sub.tags if sub.tag_filter else None
    skip = native.skip_bits(columns)
    for r in ranges:
        _check_offset("start", r.start)
        _check_offset("end", r.end)
        if r.end < r.start:
            raise RmqOptionError(f"end ({r.end}) must be >= start ({r.start})")
    # where each range goes on from; None once it is read (or reported)
    pos: list[int | None] = [r.start if r.start < r.end else None for r in ranges]
    held: list[tuple[pa.RecordBatch, str, np.ndarray]] = []
    held_rows = held_size = 0
    first, cap = 0, FIRST_WINDOW
    while True:
        while first < len(ranges) and pos[first] is None:
            first += 1
        if first == len(ranges):
            break
        topic = ranges[first].mq.topic
        listed = _list_window(store, ranges, pos, first, cap,
                              batch_rows if codes is None else None)
        ready, cl = _check_window(store, ranges, pos, listed)
        if not ready:
            continue
        res = native.scan_ranges(cl, [e.files for e in ready], [e.pos for e in ready],
                                 [e.stop for e in ready],
                                 [ranges[e.index].mq.queue_id for e in ready], topic=topic,
                                 codes=codes, tags=tags, max_rows=batch_rows - held_rows,
                                 max_bytes=batch_bytes, verify_crc=verify_crc, skip=skip)
        _advance(store, ranges, pos, ready, res, cl)
        cap = (max(MIN_WINDOW, 2 * res.done) if res.done < len(ready) or res.statuses[-1] != "END"
               else cap * 4 if len(listed) >= cap else cap)
        batch = res.batch
        if not batch.num_rows:
            continue
        size = batch.get_total_buffer_size()
        if held and (held_rows + batch.num_rows > batch_rows or held_size + size > batch_bytes):
            yield store._finish(held)
            held, held_rows, held_size = [], 0, 0
        qids = np.array([ranges[e.index].mq.queue_id for e in ready[:res.done]], np.int32)
        held.append((batch, topic, np.repeat(qids, res.rows)))
        held_rows, held_size = held_rows + batch.num_rows, held_size + size
        if held_rows >= batch_rows or held_size >= batch_bytes // 2:
            yield store._finish(held)
            held, held_rows, held_size = [], 0, 0
    if held:
        yield store._finish(held)


def _list_window(store, ranges, pos, first: int, cap: int, units: int | None) -> list[_Listed]:
    """The ConsumeQueue listings of the ranges of one topic from ``first`` on, until ``cap``
    ranges, ``units`` queue offsets to read (None: no bound), or a queue that ends before its
    range (it ends the window: once read, it is listed again before the next range is read)."""
    from rmq_source.store.reader import _check_real_dirs
    topic = ranges[first].mq.topic
    _check_real_dirs(f"{store.root}/consumequeue/{topic}")
    out: list[_Listed] = []
    total = 0
    for i in range(first, len(ranges)):
        r = ranges[i]
        if r.mq.topic != topic or len(out) >= cap or (units is not None and total >= units):
            break
        at = pos[i]
        if at is None:
            continue
        try:
            segs, cq_size = store._cq(topic, r.mq.queue_id, topic_checked=True)
        except RmqStoreLayoutError:
            if store.layout.present():
                raise
            out.append(_Listed(i, None, 0, 0, store._root_gone()))
            continue
        # units are written after their record: every unit below this end points into a
        # CommitLog file that already exists when the CommitLog is listed next
        written = store._max_of(segs)
        out.append(_Listed(i, segs, cq_size, written, None))
        total += max(0, min(r.end, written) - at)
        if segs and written < r.end:
            break
    return out


def _check_window(store, ranges, pos, listed: list[_Listed]
                  ) -> tuple[list[_Ready], native.CommitLog | None]:
    """The CommitLog listed after the window's queues, and the ranges with units to read from
    it. The others are reported (``on_short_read``: queue gone or shorter than planned) and done;
    a range whose first units retention deleted is reported (``on_data_loss``) and read on from
    the first readable one."""
    cl = None
    if any(e.segs for e in listed):
        try:
            cl = store.commitlog()
        except RmqStoreLayoutError:
            if store.layout.present():
                raise
            listed = [e._replace(segs=None, gone=store._root_gone()) for e in listed]
    ready: list[_Ready] = []
    for e in listed:
        r, at = ranges[e.index], pos[e.index]
        topic, queue_id = r.mq.topic, r.mq.queue_id
        if e.gone is not None or not e.segs:
            pos[e.index] = None
            r.on_short_read(at, r.end, e.gone or store._queue_gone(topic, queue_id))
            continue
        min_off = store._min_offset_kept(topic, queue_id, e.segs, cl.min_offset)
        if at < min_off:
            # report everything lost from pos (the callback's contract), read on from min
            store._data_loss(topic, queue_id, at, min_off, r.on_data_loss)
            at = pos[e.index] = min(min_off, r.end)
        stop = min(r.end, e.written)
        if at >= stop:
            pos[e.index] = None
            if e.written < r.end and at < r.end:
                r.on_short_read(at, r.end, store._queue_ends(e.written, r.end))
            continue
        ready.append(_Ready(e.index, store._queue_files(topic, queue_id, e.segs, e.cq_size),
                            e.segs, at, stop, e.written < r.end))
    return ready, cl


def _advance(store, ranges, pos, ready: list[_Ready], res: native.RangesResult,
             cl: native.CommitLog) -> None:
    """Each range's progress after a scan: read (done), going on from where it stopped (the
    batch was full, or its queue ended before it: listed again), or a bad unit (raised)."""
    for j in range(res.done):
        e, status, nxt = ready[j], res.statuses[j], int(res.next_offsets[j])
        r = ranges[e.index]
        store._raise_if_damage(r.mq.topic, r.mq.queue_id, e.segs, status, nxt, cl)
        if status == "FULL":
            if nxt < e.pos or (nxt == e.pos and not res.batch.num_rows):   # never stop silently
                raise AssertionError(f"scan of {r.mq} made no progress at offset {e.pos}")
            pos[e.index] = nxt
        else:
            pos[e.index] = e.stop if e.short else None
