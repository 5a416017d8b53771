"""A task's rows encoded into batch request bodies by the C core, without a Python object per row.

Applies when the DataFrame's columns are only ``body`` and any of ``tags``, ``keys`` (string or
array of strings) and ``properties``: then every row is a free message (any queue, no delay) of
the ``topic`` option, and the C core (native/core/sinkenc.c) splits the rows into batches of at
most ``batchMessages`` messages and ``batchBytes`` bytes, checks them as
:func:`rmq_source.sink.columns.messages` does, and writes each batch's SEND_BATCH_MESSAGE body
with the same properties and UNIQ_KEYs (:mod:`.uniq`) byte for byte. Other columns go through
:mod:`.columns`, row by row. Property names RocketMQ reserves and names or values that may be
blank (no visible ASCII character: Python's ``str.strip`` decides) are looked for over whole
columns first; only the rows they are in are checked row by row.

A batch still open at the end of an Arrow batch is kept and filled from the next one, so batches
do not depend on how Spark cut the rows. A row that cannot be a message is reported by
:func:`~rmq_source.sink.columns.messages` itself (same error, same wording).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmq_source.errors import RmqSinkRowError
from rmq_source.native_columns import fill, lists
from rmq_source.sink.columns import RESERVED_PROPERTIES, messages
from rmq_source.sink.options import SinkOptions
from rmq_source.sink.uniq import PERSON, TaskKeys
from rmq_source.store.native import _raise, ffi, lib

_VAR = (pa.types.is_binary, pa.types.is_string, pa.types.is_large_binary, pa.types.is_large_string)
_TEXT = (pa.types.is_string, pa.types.is_large_string)
_LIST = (pa.types.is_list, pa.types.is_large_list)
_PERSON16 = PERSON.ljust(16, b"\0")
_VISIBLE = "[!-~]"      # a visible ASCII character: not blank whatever else the text holds


def _is(checks, t: pa.DataType) -> bool:
    return any(check(t) for check in checks)


def encodable(schema: pa.Schema) -> bool:
    """Whether the C path takes rows of ``schema`` (module doc)."""
    for field in schema:
        t = field.type
        if field.name == "body" and _is(_VAR, t):
            continue
        if field.name == "tags" and _is(_TEXT, t):
            continue
        if field.name == "keys" and (_is(_TEXT, t) or (_is(_LIST, t) and _is(_TEXT, t.value_type))):
            continue
        if field.name == "properties" and pa.types.is_map(t) and _is(_TEXT, t.key_type) \
                and _is(_TEXT, t.item_type):
            continue
        return False
    return schema.get_field_index("body") >= 0


@dataclass(slots=True)
class EncodedBatch:
    """The SEND_BATCH_MESSAGE body of task rows ``first_row .. first_row + count - 1``."""

    first_row: int
    count: int
    data: bytes


class BatchEncoder:
    """Encodes the rows of one task (their Arrow batches in order) into :class:`EncodedBatch`\\ es."""

    def __init__(self, opts: SinkOptions, keys: TaskKeys, partition: int):
        self.opts, self.keys, self.partition = opts, keys, partition
        self._limits = ffi.new("rmq_sink_limits *", (opts.batch_messages, opts.batch_bytes,
                                                      opts.max_message_bytes))
        self._uniq = ffi.new("rmq_blake2b *")
        self._err = ffi.new("rmq_error *")
        if lib.rmq_uniq_init(self._uniq, _PERSON16, keys.prefix, len(keys.prefix), self._err):
            _raise(self._err)
        self._open: EncodedBatch | None = None     # the batch the next rows continue

    def encode(self, batch: pa.RecordBatch, first_row: int) -> Iterator[EncodedBatch]:
        """The batches completed by ``batch`` (task rows ``first_row ...``); the last one stays
        open until :meth:`finish` or the next call."""
        n = batch.num_rows
        rows, keep = ffi.new("rmq_sink_rows *"), []
        rows.n = n
        fill(rows.body, batch.column(batch.schema.get_field_index("body")), keep)
        if (i := batch.schema.get_field_index("tags")) >= 0:
            fill(rows.tags, batch.column(i), keep)
        if (i := batch.schema.get_field_index("keys")) >= 0:
            keys = batch.column(i)
            if _is(_LIST, keys.type):
                rows.key_lists, rows.key_lists_valid, _, _ = lists(keys, keep)
                rows.key_items = len(keys.values)
                fill(rows.keys, keys.values, keep)
            else:
                fill(rows.keys, keys, keep)
        if (i := batch.schema.get_field_index("properties")) >= 0:
            self._properties(rows, batch, i, first_row, keep)
        ends, sizes = np.empty(n + 1, np.int64), np.empty(n + 1, np.int64)
        bad, last_open = ffi.new("int64_t *"), ffi.new("int32_t *")
        open_ = self._open
        nb = lib.rmq_sink_plan(rows, 0, self._limits, open_.count if open_ else 0,
                               len(open_.data) if open_ else 0, ffi.from_buffer("int64_t[]", ends),
                               ffi.from_buffer("int64_t[]", sizes), n + 1, bad, last_open, self._err)
        if nb < 0:
            _raise(self._err)
        good = int(ends[nb - 1])
        out = bytearray(int(sizes[:nb].sum()))
        if good and lib.rmq_sink_encode(rows, 0, good, self._uniq, first_row, ffi.from_buffer(out),
                                        len(out), self._err):
            _raise(self._err)
        view, start, at = memoryview(out), 0, 0
        for i in range(nb):
            end, size = int(ends[i]), int(sizes[i])
            data = bytes(view[at:at + size])
            if i == 0 and open_ is not None:
                done = EncodedBatch(open_.first_row, open_.count + end, open_.data + data)
            else:
                done = EncodedBatch(first_row + start, end - start, data)
            start, at = end, at + size
            if i == nb - 1 and last_open[0]:
                self._open = done if done.count else None
            else:
                self._open = None
                yield done
        if bad[0] >= 0:
            raise self._row_error(batch, int(bad[0]), first_row) or RmqSinkRowError(
                f"partition {self.partition}, row {first_row + int(bad[0])}: cannot be a message "
                "(rejected by the batch encoder)")

    def _properties(self, rows, batch: pa.RecordBatch, i: int, first_row: int, keep: list) -> None:
        """Points ``rows`` at the map column ``i``; the first row with a reserved name or a name
        or value that is blank (checked row by row where it may be) is marked bad."""
        props, n = batch.column(i), batch.num_rows
        names, values = props.keys, props.items
        rows.prop_lists, rows.prop_lists_valid, starts, valid = lists(props, keep)
        rows.prop_entries = len(names)
        fill(rows.prop_names, names, keep)
        fill(rows.prop_values, values, keep)
        if not len(names):
            return
        doubt = pc.or_kleene(pc.invert(pc.match_substring_regex(names, _VISIBLE)),
                             pc.invert(pc.match_substring_regex(values, _VISIBLE)))
        doubt = pc.or_(pc.fill_null(doubt, True), pc.is_in(names, value_set=_reserved()))
        entries = np.flatnonzero(doubt.to_numpy(zero_copy_only=False))
        if not len(entries):
            return
        # the rows holding those entries (a null row's entries are not its properties)
        owner = np.searchsorted(starts, entries, side="right") - 1
        for r in np.unique(owner[(entries >= starts[0]) & (entries < starts[-1])]):
            if valid is not None and not valid[r]:
                continue
            if self._row_error(batch, int(r), first_row) is not None:
                row_bad = np.zeros(n, np.uint8)
                row_bad[r] = 1
                keep.append(row_bad)
                rows.row_bad = ffi.from_buffer("uint8_t[]", row_bad)
                return

    def _row_error(self, batch: pa.RecordBatch, row: int, first_row: int) -> RmqSinkRowError | None:
        """The row-by-row path's error for the row (its words), None when it takes the row."""
        try:
            for _ in messages(batch.slice(row, 1), first_row=first_row + row, partition=self.partition,
                              keys=self.keys, default_topic=self.opts.topic,
                              max_message_bytes=self.opts.max_message_bytes,
                              namespace=self.opts.namespace):
                pass
        except RmqSinkRowError as exc:
            return exc
        return None

    def finish(self) -> EncodedBatch | None:
        """The batch left open, if any."""
        done, self._open = self._open, None
        return done


@functools.cache
def _reserved() -> pa.Array:
    # built on first use: pa.array imports pandas (0.2 s) in every process that imports the sink
    return pa.array(sorted(RESERVED_PROPERTIES))
