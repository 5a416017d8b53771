"""The C batch encoder of the sink (rmq_source/sink/encoder.py, native/core/sinkenc.c) against the
row-by-row path it replaces: same batches, same bytes, same UNIQ_KEYs, same errors."""
from __future__ import annotations

import hashlib

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from conftest import raises_rmq
from rmq_source.errors import RmqOptionError, RmqSinkRowError
from rmq_source.remote import requests as rq
from rmq_source.sink.columns import messages
from rmq_source.sink.encoder import BatchEncoder, encodable
from rmq_source.sink.options import parse_sink_options
from rmq_source.sink.uniq import PERSON, TaskKeys
from rmq_source.store.native import ffi, lib

PARTITION = 4


def _opts(batch_messages=3, batch_bytes=300, max_message_bytes=400):
    return parse_sink_options({"namesrvAddr": "127.0.0.1:9876", "topic": "T",
                               "batchMessages": str(batch_messages), "batchBytes": str(batch_bytes),
                               "maxMessageBytes": str(max_message_bytes)}, streaming=False)


def _reference(batches, opts, keys):
    """Batches as the producer's free lane builds them from row-by-row messages."""
    out, open_, open_bytes, row = [], [], 0, 0

    def close():
        out.append((open_[0].row, len(open_), rq.encode_batch_encoded((m.body, m.props, 0) for m in open_)))

    for batch in batches:
        for m in messages(batch, first_row=row, partition=PARTITION, keys=keys, default_topic="T",
                          max_message_bytes=opts.max_message_bytes):
            if open_ and (len(open_) >= opts.batch_messages or open_bytes + m.size > opts.batch_bytes):
                close()
                open_, open_bytes = [], 0
            open_.append(m)
            open_bytes += m.size
        row += batch.num_rows
    if open_:
        close()
    return out


def _encoded(batches, opts, keys):
    enc, out, row = BatchEncoder(opts, keys, PARTITION), [], 0
    for batch in batches:
        out.extend((b.first_row, b.count, b.data) for b in enc.encode(batch, row))
        row += batch.num_rows
    if (last := enc.finish()) is not None:
        out.append((last.first_row, last.count, last.data))
    return out


def _outcome(fn, *args):
    try:
        return fn(*args)
    except RmqSinkRowError as exc:
        return ("error", str(exc))


_word = st.text(st.characters(blacklist_characters=" \x00", blacklist_categories=("Cs",)), min_size=1, max_size=6)
# property names/values: clean ones have a visible ASCII character (never blank); hostile rows
# also draw reserved, blank (to Python's str.strip), separator-holding and null ones
_clean = st.tuples(st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=4),
                   st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
                           max_size=3)).map("".join)
_odd_names = st.sampled_from(["TAGS", "UNIQ_KEY", "DELAY", "a\x02", "", " ", "\u3000", "\x1c", "\u00e9"])
_odd_values = st.none() | st.sampled_from(["", " ", "\t", "\u2003 ", "v\x01", "\u00e9\u00e9", "\x85"])


_row = st.fixed_dictionaries({
    "body": st.binary(max_size=120),
    "tags": st.none() | st.text(max_size=8),
    "keys_str": st.none() | st.text(max_size=10),
    "keys_list": st.none() | st.lists(_word, max_size=3),
    "props": st.none() | st.lists(st.tuples(_clean, _clean), max_size=3),
})


@st.composite
def _rows(draw):
    """Rows with clean properties, and half the time one more property, maybe odd, in one row."""
    rows = draw(st.lists(_row, max_size=40))
    if rows and draw(st.booleans()):
        i = draw(st.integers(0, len(rows) - 1))
        odd = (draw(_clean | _odd_names), draw(_clean | _odd_values))
        rows[i] = {**rows[i], "props": [*(rows[i]["props"] or []), odd]}
    return rows


_types = st.fixed_dictionaries({
    "body": st.sampled_from([pa.binary(), pa.large_binary(), pa.string(), pa.large_string()]),
    "tags": st.sampled_from([None, pa.string(), pa.large_string()]),
    "keys": st.sampled_from([None, pa.string(), pa.large_string(), pa.list_(pa.string()),
                             pa.large_list(pa.large_string())]),
    "props": st.sampled_from([None, pa.map_(pa.string(), pa.string()),
                              pa.map_(pa.large_string(), pa.large_string())]),
})


def _table(rows, types, lead):
    """A RecordBatch of ``rows`` after ``lead`` filler rows (sliced off: arrays with an offset)."""
    filler = [{"body": b"f", "tags": "f", "keys_str": "f", "keys_list": ["f"], "props": [("TAGS", " ")]}] * lead
    rows = filler + rows
    cols = {}
    if types["body"] in (pa.string(), pa.large_string()):
        cols["body"] = pa.array([r["body"].hex() for r in rows], types["body"])
    else:
        cols["body"] = pa.array([r["body"] for r in rows], types["body"])
    if types["tags"] is not None:
        cols["tags"] = pa.array([r["tags"] for r in rows], types["tags"])
    if types["keys"] is not None:
        listed = pa.types.is_list(types["keys"]) or pa.types.is_large_list(types["keys"])
        cols["keys"] = pa.array([r["keys_list" if listed else "keys_str"] for r in rows], types["keys"])
    if types["props"] is not None:    # (the filler's reserved, blank property lies outside the slice)
        cols["properties"] = pa.array([r["props"] for r in rows], types["props"])
    return pa.RecordBatch.from_pydict(cols).slice(lead)


@settings(max_examples=300, deadline=None)
@given(rows=_rows(), types=_types, lead=st.integers(0, 3),
       cuts=st.lists(st.integers(0, 40), max_size=4), limits=st.tuples(
           st.integers(1, 5), st.integers(60, 400)), write_id=st.text(max_size=150))
def test_same_batches_and_bytes_as_the_row_by_row_path(rows, types, lead, cuts, limits, write_id):
    table = _table(rows, types, lead)
    bounds = sorted({0, table.num_rows, *(c for c in cuts if c <= table.num_rows)})
    batches = [table.slice(a, b - a) for a, b in zip(bounds, bounds[1:])] or [table]
    opts = _opts(limits[0], limits[1], 400)
    keys = TaskKeys(write_id, 7, PARTITION)
    assert encodable(table.schema)
    expected = _outcome(_reference, batches, opts, keys)
    assert _outcome(_encoded, batches, opts, keys) == expected


@pytest.mark.parametrize("cols, match", [
    ({"body": [b"ok", None]}, "row 1: body is null"),
    ({"body": [b"ok", ""]}, "row 1: body is empty"),
    ({"body": [b"x" * 401]}, "row 0: body of 401 bytes exceeds maxMessageBytes"),
    ({"body": [b"x", b"y"], "tags": ["a", "b\x01"]}, "row 1: tags contain"),
    ({"body": [b"x"], "keys": ["a\x02b"]}, "row 0: keys contain"),
    ({"body": [b"x"], "keys": [["a", "b c"]]}, "without spaces"),
    ({"body": [b"x"], "keys": [["a", ""]]}, "without spaces"),
    ({"body": [b"x"], "keys": [["a", None]]}, "without spaces"),
    ({"body": [b"x"], "keys": [["a\x01"]]}, "keys contain"),
    ({"body": [b"x"], "tags": ["t" * 40000]}, "at most 32767"),
    ({"body": [b"x"], "keys": [["k" * 20000, "k" * 20000]]}, "at most 32767"),
    ({"body": [b"x", b"y"], "properties": [[("a", "1")], [("UNIQ_KEY", "1")]]}, "row 1: property 'UNIQ_KEY' is reserved"),
    ({"body": [b"x"], "properties": [[("a", "1"), ("\u3000", "1")]]}, "non-blank"),
    ({"body": [b"x"], "properties": [[("a", "\u2003")]]}, "non-blank"),
    ({"body": [b"x"], "properties": [[(" ", "v")]]}, "property ' ': names and values must be non-blank"),
    ({"body": [b"x"], "properties": [[("a", " \t")]]}, "non-blank"),
    ({"body": [b"x"], "properties": [[("a", "\x85")]]}, "non-blank"),
    ({"body": [b"x"], "properties": [[("\x1c", "v")]]}, "non-blank"),
    ({"body": [b"x"], "properties": [[("a", None)]]}, "non-blank"),
    ({"body": [b"x"], "properties": [[("a", "")]]}, "non-blank"),
    ({"body": [b"x"], "properties": [[("a\x01", "v")]]}, "separate properties"),
    ({"body": [b"x"], "properties": [[("a", "v" * 40000)]]}, "at most 32767"),
    ({"body": [b"x"], "properties": [[("a", "v" * 20000), ("b", "v" * 20000)]]}, "at most 32767"),
])
def test_bad_rows_fail_with_the_row_by_row_error(cols, match):
    if "properties" in cols:
        cols = {**cols, "properties": pa.array(cols["properties"], pa.map_(pa.string(), pa.string()))}
    batch = pa.RecordBatch.from_pydict(cols)
    assert encodable(batch.schema)
    opts = _opts(max_message_bytes=400)
    keys = TaskKeys("w", 0, PARTITION)
    with pytest.raises(RmqSinkRowError) as row_by_row:
        _reference([batch], opts, keys)
    with raises_rmq(RmqSinkRowError, match) as c_path:
        _encoded([batch], opts, keys)
    assert str(c_path.value) == str(row_by_row.value)


def test_a_batch_stays_open_across_arrow_batches_until_full():
    opts = _opts(batch_messages=4, batch_bytes=400)
    keys = TaskKeys("w", 0, PARTITION)
    enc = BatchEncoder(opts, keys, PARTITION)
    one = pa.RecordBatch.from_pydict({"body": [b"a", b"b", b"c"]})
    assert list(enc.encode(one, 0)) == []                 # 3 of 4: still open
    done = list(enc.encode(one, 3))                        # the 4th row closes it, 2 rows open
    assert [(b.first_row, b.count) for b in done] == [(0, 4)]
    assert list(enc.encode(one.slice(0, 0), 6)) == []     # an empty Arrow batch changes nothing
    last = enc.finish()
    assert (last.first_row, last.count) == (4, 2) and enc.finish() is None


@pytest.mark.parametrize("schema, ok", [
    ({"body": pa.binary()}, True),
    ({"body": pa.string(), "tags": pa.string(), "keys": pa.list_(pa.string())}, True),
    ({"tags": pa.string()}, False),
    ({"body": pa.binary(), "topic": pa.string()}, False),
    ({"body": pa.binary(), "keys": pa.list_(pa.binary())}, False),
    ({"body": pa.binary(), "properties": pa.map_(pa.string(), pa.string())}, True),
    ({"body": pa.binary(), "properties": pa.map_(pa.string(), pa.int32())}, False),
    ({"body": pa.binary(), "shardingKey": pa.string()}, False),
    ({"body": pa.binary_view()}, False),
])
def test_which_schemas_the_c_path_takes(schema, ok):
    assert encodable(pa.schema(list(schema.items()))) is ok


@pytest.mark.parametrize("prefix_len", [0, 1, 119, 120, 121, 127, 128, 129, 255, 256, 1000])
def test_c_blake2b_keys_equal_hashlib(prefix_len):
    prefix = bytes(range(256)) * 4
    prefix = prefix[:prefix_len]
    state, err = ffi.new("rmq_blake2b *"), ffi.new("rmq_error *")
    assert lib.rmq_uniq_init(state, PERSON.ljust(16, b"\0"), prefix, len(prefix), err) == 0
    rows = [0, 1, 255, 256, (1 << 40) + 3, (1 << 63) - 1]
    for row in rows:
        out = ffi.new("char[]", 32)
        assert lib.rmq_uniq_keys(state, row, 1, out, err) == 0
        d = hashlib.blake2b(prefix + row.to_bytes(8, "big"), digest_size=12, person=PERSON).digest()
        assert ffi.buffer(out, 32)[:].decode() == (d[:10] + bytes(4) + d[10:]).hex().upper()


def _raw_rows(body_off, data, n):
    rows = ffi.new("rmq_sink_rows *")
    keep = [ffi.new("int64_t[]", body_off), ffi.from_buffer(data)]
    rows.n, rows.body.off, rows.body.data, rows.body.data_len = n, keep[0], keep[1], len(data)
    return rows, keep


@pytest.mark.parametrize("offsets, n, match", [
    ([0, 5, 3], 2, "offsets decrease at entry 1"),
    ([0, 2, 99], 2, "outside its 10 data bytes"),
    ([-1, 2], 1, "outside its 10 data bytes"),
])
def test_hostile_offsets_are_errors_not_reads(offsets, n, match):
    rows, keep = _raw_rows(offsets, bytearray(10), n)
    lim = ffi.new("rmq_sink_limits *", (10, 1000, 1000))
    ends, sizes = ffi.new("int64_t[]", n + 1), ffi.new("int64_t[]", n + 1)
    bad, last_open, err = ffi.new("int64_t *"), ffi.new("int32_t *"), ffi.new("rmq_error *")
    assert lib.rmq_sink_plan(rows, 0, lim, 0, 0, ends, sizes, n + 1, bad, last_open, err) == -1
    assert match in ffi.string(err.message).decode()
    state = ffi.new("rmq_blake2b *")
    assert lib.rmq_uniq_init(state, PERSON.ljust(16, b"\0"), b"", 0, err) == 0
    out = bytearray(100)
    assert lib.rmq_sink_encode(rows, 0, n, state, 0, ffi.from_buffer(out), len(out), err) == lib.RMQ_E_ARG
    assert match in ffi.string(err.message).decode()


def test_encode_checks_the_output_size():
    rows, keep = _raw_rows([0, 3], bytearray(b"abc"), 1)
    state, err = ffi.new("rmq_blake2b *"), ffi.new("rmq_error *")
    lib.rmq_uniq_init(state, PERSON.ljust(16, b"\0"), b"", 0, err)
    for size in (0, 22 + 3 + 52 - 1, 22 + 3 + 52 + 1):
        out = bytearray(size)
        assert lib.rmq_sink_encode(rows, 0, 1, state, 0, ffi.from_buffer(out), size, err) == lib.RMQ_E_ARG
    out = bytearray(22 + 3 + 52)
    assert lib.rmq_sink_encode(rows, 0, 1, state, 0, ffi.from_buffer(out), len(out), err) == 0
    with pytest.raises(RmqOptionError):     # planning through the wrapper checks arguments too
        from rmq_source.store.native import _raise
        assert lib.rmq_sink_plan(rows, 0, ffi.NULL, 0, 0, ffi.NULL, ffi.NULL, 0, ffi.NULL, ffi.NULL, err) == -1
        _raise(err)


@pytest.mark.parametrize("which, lists, items, match", [
    ("keys", [0, 5], 2, "column keys: list offsets [0, 5] outside its 2 entries"),
    ("keys", [1, 0, 2], 2, "column keys: list offsets decrease at row 0"),
    ("properties", [0, 2, 1], 2, "column properties: list offsets decrease at row 1"),
    ("properties", [-1, 1], 2, "column properties: list offsets [-1, 1] outside"),
])
def test_hostile_list_offsets_are_errors_not_reads(which, lists, items, match):
    n = len(lists) - 1
    rows, keep = _raw_rows([0] * (n + 1), bytearray(1), n)
    child_off = ffi.new("int64_t[]", [0, 1, 2])
    data = ffi.from_buffer(bytearray(b"ab"))
    keep += [ffi.new("int64_t[]", lists), child_off, data]
    if which == "keys":
        rows.key_lists, rows.key_items = keep[-3], items
        rows.keys.off, rows.keys.data, rows.keys.data_len = child_off, data, 2
    else:
        rows.prop_lists, rows.prop_entries = keep[-3], items
        for col in (rows.prop_names, rows.prop_values):
            col.off, col.data, col.data_len = child_off, data, 2
    lim = ffi.new("rmq_sink_limits *", (10, 1000, 1000))
    ends, sizes = ffi.new("int64_t[]", n + 1), ffi.new("int64_t[]", n + 1)
    bad, last_open, err = ffi.new("int64_t *"), ffi.new("int32_t *"), ffi.new("rmq_error *")
    assert lib.rmq_sink_plan(rows, 0, lim, 0, 0, ends, sizes, n + 1, bad, last_open, err) == -1
    assert match in ffi.string(err.message).decode()
