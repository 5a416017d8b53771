"""The C core's hand-over to Arrow and its fast paths, checked against plain Python models.

* The Arrow C Data Interface export: the C schema is NATIVE_SCHEMA; every exported batch is freed
  by its release callback exactly once (also when a consumer moves a column out and releases the
  parent first); scanning in a loop leaves no batch behind and keeps the process size flat.
* Big batches (8 MiB of bodies and more) whose bodies, and the row-indexed columns staged 16
  rows at a time, go out with streaming stores: record sizes of every alignment, row counts that
  are not multiples of 16, nulls, a dense tag filter that switches to streaming mid-batch and
  takes rows back (hash collisions).
* Properties: runs of rows with the same names (the "shape" fast path) and the same layout,
  mixed with every kind of deviation (other lengths, names, duplicates, malformed segments, a
  final 0x02, non-ASCII text, more than 16 entries, long properties), against a model of §4.1.

These tests also run under AddressSanitizer, including the portable (no SIMD) build
(test_native_corrupt.py, ``-m asan``).
"""
from __future__ import annotations

import gc
import os
import random
import struct
import zlib

import pyarrow as pa
import pytest

from rmq_source.store import native

from test_native_craft import CQ_UNIT, CraftStore, Rec, host, java_hash, open_store

UNDER_ASAN = os.environ.get("RMQ_NATIVE", "").startswith("asan")


# -- models -------------------------------------------------------------------------------------

def props_model(raw: bytes) -> list[tuple[str, str]]:
    """§4.1: split on 0x02; an entry needs a 0x01 after a non-empty name and a non-empty value;
    a later duplicate replaces the value (first position kept)."""
    out: dict[str, str] = {}
    for seg in raw.split(b"\x02"):
        i = seg.find(b"\x01")
        if i > 0 and i + 1 < len(seg):
            out[seg[:i].decode("utf-8")] = seg[i + 1:].decode("utf-8")
    return list(out.items())


def row_model(rec: Rec) -> dict:
    raw = rec.props if isinstance(rec.props, bytes) else b""
    props = props_model(raw)
    d = dict(props)
    keys = [w for w in d["KEYS"].split(" ") if w] if "KEYS" in d else []
    return {"queueOffset": rec.queue_offset, "commitLogOffset": rec.phy, "body": rec.body,
            "properties": props, "tags": d.get("TAGS"), "uniqKey": d.get("UNIQ_KEY"),
            "keys": keys or None, "storeSize": len(rec.encode()),
            "msgId": (rec.store_host + struct.pack(">q", rec.phy)).hex().upper(),
            "bodyCRC": zlib.crc32(rec.body) & 0x7FFFFFFF}


def columns(batch: pa.RecordBatch, names=("queueOffset", "commitLogOffset", "body", "properties",
                                          "tags", "uniqKey", "keys", "storeSize", "msgId",
                                          "bodyCRC")) -> list[dict]:
    data = {n: batch.column(n).to_pylist() for n in names}
    return [{n: data[n][i] for n in names} for i in range(batch.num_rows)]


def scan_all(cl, cq, cq_size, end, **kw) -> tuple[list[dict], list[native.ScanResult]]:
    rows, results, pos = [], [], 0
    while pos < end:
        res = native.scan_queue(cl, cq, cq_size, pos, end, **kw)
        res.batch.validate(full=True)
        results.append(res)
        rows += columns(res.batch)
        if res.status != "FULL":
            break
        pos = res.next_offset
    return rows, results


# -- the C Data Interface -------------------------------------------------------------------------

def test_c_schema_is_native_schema():
    assert native.C_SCHEMA.equals(native.NATIVE_SCHEMA, check_metadata=True)
    props = native.C_SCHEMA.field("properties").type
    assert not props.key_field.nullable and props.item_field.nullable
    assert native.C_SCHEMA.field("keys").type.value_field.nullable
    assert all(f.nullable for f in native.C_SCHEMA)


def _small_store(tmp_path, n=40, body=300):
    store = CraftStore(tmp_path, 1 << 20, 64 * CQ_UNIT)
    recs = []
    for i in range(n):
        rec = Rec(body=bytes([i % 251]) * (body + i),
                  props={"TAGS": f"t{i % 3}", "KEYS": f"k{i} x", "UNIQ_KEY": f"U{i:08d}"})
        store.add(rec)
        recs.append(rec)
    store.write()
    cl, cq = open_store(tmp_path, 1 << 20)
    return cl, cq, recs


def _raw_batch(cl, cq, start, end):
    """An rmq_batch straight from the C core (what scan_queue hands to rmq_batch_export)."""
    ffi, lib = native.ffi, native.lib
    files = native._check_cq(cq, 64 * CQ_UNIT)
    args = ffi.new("rmq_scan_args *")
    args.start, args.end, args.max_rows, args.max_bytes = start, end, 1 << 20, 64 << 20
    out = ffi.new("rmq_batch **")
    err = ffi.new("rmq_error *")
    assert lib.rmq_scan_queue(cl._files.struct, files.struct, args, out, err) == 0
    return out[0], files


def test_batches_are_freed_when_the_last_array_goes(tmp_path):
    cl, cq, recs = _small_store(tmp_path)
    gc.collect()
    before = native.live_batches()
    batch = native.scan_queue(cl, cq, 64 * CQ_UNIT, 0, len(recs)).batch
    body = batch.column("body")
    assert native.live_batches() == before + 1
    del batch
    gc.collect()
    assert native.live_batches() == before + 1            # the column still uses the buffers
    assert body.to_pylist() == [r.body for r in recs]
    del body
    gc.collect()
    assert native.live_batches() == before


def test_a_column_moved_out_outlives_its_released_parent(tmp_path):
    """The spec allows a consumer to move a child out and release the parent at once."""
    ffi, lib = native.ffi, native.lib
    cl, cq, recs = _small_store(tmp_path)
    gc.collect()
    before = native.live_batches()
    ptr, _files = _raw_batch(cl, cq, 0, len(recs))
    root = ffi.new("struct ArrowArray *")
    assert lib.rmq_batch_export(ptr, root) == 0
    assert root.n_children == 19 and root.length == len(recs)
    body_idx = native.NATIVE_SCHEMA.get_field_index("body")
    props_idx = native.NATIVE_SCHEMA.get_field_index("properties")
    moved = []
    for idx in (body_idx, props_idx):
        child = ffi.new("struct ArrowArray *")
        ffi.memmove(child, root.children[idx], ffi.sizeof("struct ArrowArray"))
        root.children[idx].release = ffi.NULL             # moved: the parent must not release it
        moved.append(child)
    root.release(root)
    assert root.release == ffi.NULL
    assert native.live_batches() == before + 1            # the moved columns hold the batch
    body = pa.Array._import_from_c(int(ffi.cast("uintptr_t", moved[0])), pa.binary())
    assert moved[0].release == ffi.NULL                   # moved into Arrow
    assert body.to_pylist() == [r.body for r in recs]
    moved[1].release(moved[1])                            # released unimported
    assert native.live_batches() == before + 1
    del body
    gc.collect()
    assert native.live_batches() == before


def test_export_of_an_unused_batch_releases_once(tmp_path):
    ffi, lib = native.ffi, native.lib
    cl, cq, recs = _small_store(tmp_path, n=3)
    gc.collect()
    before = native.live_batches()
    ptr, _files = _raw_batch(cl, cq, 0, 3)
    root = ffi.new("struct ArrowArray *")
    assert lib.rmq_batch_export(ptr, root) == 0
    assert native.live_batches() == before + 1
    root.release(root)
    assert native.live_batches() == before and root.release == ffi.NULL


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def test_scanning_in_a_loop_leaves_nothing_behind(tmp_path):
    cl, cq, recs = _small_store(tmp_path, n=60, body=4000)
    gc.collect()
    before = native.live_batches()
    for _ in range(30):                                   # warm-up: pools and allocator
        native.scan_queue(cl, cq, 64 * CQ_UNIT, 0, len(recs)).batch.column("body")
    gc.collect()
    rss0 = _rss_bytes()
    loops = 100 if UNDER_ASAN else 600                    # ~150 MB of batches without ASan
    for i in range(loops):
        res = native.scan_queue(cl, cq, 64 * CQ_UNIT, i % 5, len(recs),
                                codes=(java_hash("t1"),) if i % 2 else None)
        assert res.batch.num_rows > 0
    del res
    gc.collect()
    assert native.live_batches() == before
    rss1 = _rss_bytes()
    if rss0 is not None and not UNDER_ASAN:               # ASan keeps freed memory quarantined
        assert rss1 - rss0 < 32 << 20, (rss0, rss1)


# -- big batches: streaming stores, staged columns ------------------------------------------------

BIG_CL = 20 << 20
BIG_CQ = 1000 * CQ_UNIT          # several ConsumeQueue files


@pytest.fixture(scope="module")
def big_store(tmp_path_factory):
    """7000 records, bodies of 0..6 KB (every alignment), 12+ MiB of bodies; some rows without
    TAGS, every fifth without UNIQ_KEY, keys with 0..3 words."""
    root = tmp_path_factory.mktemp("big")
    rng = random.Random(20261121)
    store = CraftStore(root, BIG_CL, BIG_CQ)
    recs = []
    tag_cycle = ["Aa", "BB", "Aa", "Aa", None, "zz", "Aa"]     # "Aa" and "BB" share a hash
    for i in range(7000):
        size = rng.choice([0, 1, 63, 64, 65, 127, 1024, 1999]) if i % 4 == 0 else rng.randrange(6000)
        body = rng.randbytes(size)
        parts = []
        if i % 5:
            parts.append(b"UNIQ_KEY\x01" + f"{i:032X}".encode())
        parts.append(b"KEYS\x01" + " ".join(f"k{i}-{j}" for j in range(i % 4)).encode())
        tag = tag_cycle[i % len(tag_cycle)]
        if tag:
            parts.append(b"TAGS\x01" + tag.encode())
        parts.append(b"WAIT\x01true")
        rec = Rec(body=body, props=b"\x02".join(parts), born_host=host("10.1.2.3", 4000 + i % 3),
                  store_ts=1_700_000_000_000 + i)
        store.add(rec, tags_code_value=java_hash(tag) if tag else 0)
        recs.append(rec)
    store.write()
    total = sum(len(r.body) for r in recs)
    assert total > 12 << 20
    return root, recs


def test_big_batch_streams_every_column_right(big_store):
    root, recs = big_store
    cl, cq = open_store(root, BIG_CL)
    rows, results = scan_all(cl, cq, BIG_CQ, len(recs), max_rows=1 << 20, max_bytes=(1 << 31) - 1)
    assert [r.status for r in results] == ["END"] and len(rows) == len(recs)
    assert rows == [row_model(r) for r in recs]
    batch = results[0].batch
    assert batch.column("bornHost").to_pylist()[:3] == ["10.1.2.3:4000", "10.1.2.3:4001",
                                                        "10.1.2.3:4002"]
    ts = batch.column("storeTimestamp").cast(pa.int64()).to_pylist()
    assert ts == [(1_700_000_000_000 + i) * 1000 for i in range(len(recs))]
    assert batch.column("body").buffers()[2].address % 64 == 0


@pytest.mark.parametrize("max_rows,max_bytes", [(5000, 64 << 20), (1 << 20, 9 << 20),
                                               (777, 64 << 20)])
def test_big_batches_cut_by_rows_and_bytes(big_store, max_rows, max_bytes):
    root, recs = big_store
    cl, cq = open_store(root, BIG_CL)
    rows, results = scan_all(cl, cq, BIG_CQ, len(recs), max_rows=max_rows, max_bytes=max_bytes)
    assert rows == [row_model(r) for r in recs]
    assert all(r.status == "FULL" for r in results[:-1]) and results[-1].status == "END"
    assert all(r.batch.num_rows <= max_rows for r in results)


def test_dense_filter_switches_to_streaming_and_takes_rows_back(big_store):
    root, recs = big_store
    cl, cq = open_store(root, BIG_CL)
    code = java_hash("Aa")
    expected = [row_model(r) for r in recs if row_model(r)["tags"] == "Aa"]
    rows, results = scan_all(cl, cq, BIG_CQ, len(recs), codes=(code,), tags=("Aa",),
                             max_rows=1 << 20, max_bytes=(1 << 31) - 1)
    assert rows == expected and sum(len(r["body"]) for r in rows) > 8 << 20
    # hash only: the "BB" rows come too
    rows, _ = scan_all(cl, cq, BIG_CQ, len(recs), codes=(code,), max_rows=1 << 20,
                       max_bytes=(1 << 31) - 1)
    assert rows == [row_model(r) for r in recs if row_model(r)["tags"] in ("Aa", "BB")]


# -- properties: shapes, layouts and every deviation ---------------------------------------------

def _props_cases(rng: random.Random) -> list[bytes]:
    """Runs of rows sharing a shape (often a layout), then deviations, in random order."""
    def uniq():
        return f"{rng.getrandbits(128):032X}"

    shapes = [
        lambda: b"UNIQ_KEY\x01%s\x02KEYS\x01K%09d\x02TAGS\x01TagMIS\x02WAIT\x01true" % (
            uniq().encode(), rng.randrange(10**9)),                       # same layout
        lambda: b"TAGS\x01%s\x02KEYS\x01%s" % (rng.choice([b"a", b"bb", b"ccc"]),
                                                b"order-%d" % rng.randrange(10**rng.randrange(1, 7))),
        lambda: b"TAGS\x01A\x02WAIT\x01true\x02",                              # final 0x02
        lambda: b"a\x01" + b"x" * rng.randrange(1, 200),                     # long values
    ]
    deviations = [
        b"",
        b"TAGS\x01A\x02TAGS\x01B",                                          # duplicate
        b"KEYS\x01a b\x02UNIQ_KEY\x01U\x02KEYS\x01c",                       # duplicate KEYS
        b"TAGS\x01A\x02\x02WAIT\x01true",                                   # empty segment
        b"TAGS\x01A\x02novalue\x02\x01v\x02e\x01",                          # malformed entries
        b"TAGS\x01v\x01w\x02WAIT\x01true",                                  # 0x01 in a value
        "TAGS\x01タグ\x02KEYS\x01名前 値".encode(),                            # non-ASCII values
        "名前\x01x\x02TAGS\x01A".encode(),                                   # non-ASCII name
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZ\x01long-name\x02TAGS\x01T",            # name > 15 bytes
        b"\x02".join(b"k%d\x01v%d" % (i, i) for i in range(20)),            # > 16 entries
        b"\x02".join(b"k%d\x01v%d" % (i % 7, i) for i in range(40)),        # many duplicates
        b"UNIQ_KEY\x01" + b"u" * 300 + b"\x02TAGS\x01A",                     # long properties
        b"TAGS\x01A\x02WAIT\x01truex",                                       # shape, other length
        b"TAGX\x01A\x02WAIT\x01true",                                        # shape, other name
        b"TAGS\x01A\x02WAIT",                                               # last value missing
        b"TAGS\x01A",                                                        # fewer entries
        b"TAGS\x01A\x02WAIT\x01true\x02EXTRA\x01x",                          # more entries
    ]
    out = []
    while len(out) < 1500:
        if rng.random() < 0.75:
            make = rng.choice(shapes)
            out += [make() for _ in range(rng.randrange(1, 25))]
        else:
            out.append(rng.choice(deviations))
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_properties_fast_paths_match_the_model(tmp_path, seed):
    rng = random.Random(seed)
    store = CraftStore(tmp_path, 4 << 20, 512 * CQ_UNIT)
    recs = []
    for raw in _props_cases(rng):
        rec = Rec(body=rng.randbytes(rng.randrange(64)), props=raw)
        store.add(rec)
        recs.append(rec)
    store.write()
    cl, cq = open_store(tmp_path, 4 << 20)
    rows, results = scan_all(cl, cq, 512 * CQ_UNIT, len(recs), max_rows=700)
    assert len(results) > 1
    assert rows == [row_model(r) for r in recs]


@pytest.mark.parametrize("prop_len", [0, 5, 15, 16, 17, 31, 33, 47, 79, 130])
def test_properties_at_the_very_end_of_a_file(tmp_path, prop_len):
    """The last record of a truncated CommitLog file ends at the file's last byte: no load (16
    bytes at a time) may run past it (ASan checks every read against the exact file size)."""
    store = CraftStore(tmp_path, 1 << 16, 16 * CQ_UNIT)
    recs = []
    for i in range(4):
        raw = (b"TAGS\x01A\x02KEYS\x01x y\x02WAIT\x01" + b"t" * 200)[:prop_len]
        rec = Rec(body=b"b" * (10 + i), props=raw)
        store.add(rec)
        recs.append(rec)
    store.write()
    end = recs[-1].phy + len(recs[-1].encode())
    os.truncate(tmp_path / "commitlog" / f"{0:020d}", end)
    cl, cq = open_store(tmp_path, 1 << 16)
    assert cl.segments[0].size == end
    for _ in range(2):                     # the second pass meets the shape of the first
        rows, _ = scan_all(cl, cq, 16 * CQ_UNIT, len(recs))
        assert rows == [row_model(r) for r in recs]
