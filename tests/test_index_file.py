"""Index files (format doc §12.2): geometry inference, lookups and verified key search.

Conformance cases read the 4.9.3 fixture (index files written by the broker, maxHashSlotNum=512,
maxIndexNum=2048) and compare with the broker's own answers (index.jsonl) and with the manifest.
Crafted cases write index files per §12.2 (``IndexBuilder`` below, following ``IndexFile.putKey``)
for stores made by our StoreWriter, which writes no index files itself.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest

from conftest import fixture_dir, fixtures_root

from rmq_source.errors import (RmqCorruptStoreError, RmqOptionError, RmqStoreLayoutError,
                               RmqUnknownTopicError)
from rmq_source.store.index_file import (DEFAULT_HASH_SLOTS, DEFAULT_INDEX_NUM, IndexFile, find_by_key,
                                         index_candidates, index_file_paths, index_key_hash)
from rmq_source.store.reader import Store
from rmq_source.subscription import java_string_hash
from rmq_source.store.writer import StoreWriter

BASIC = fixtures_root() / "rocketmq-4.9.3" / "basic"


def _fixture() -> Path:
    return fixture_dir("rocketmq-4.9.3/basic")


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _truth(manifest: list[dict], topic: str, key: str) -> list[int]:
    return sorted(m["commitLogOffset"] for m in manifest if m["topic"] == topic and (
        key in (m["keys"] or "").split(" ") or m["uniqKey"] == key))


@pytest.fixture(scope="module")
def broker_answers():
    base = _fixture()
    return _jsonl(base / "index.jsonl"), _jsonl(base / "manifest.jsonl")


# ------------------------------------------------------------------------------- a spec writer

class IndexBuilder:
    """Writes index files as IndexFile.putKey does: entry at indexCount, slot -> newest entry,
    header begin/end updated, a new file when indexCount reaches N."""

    def __init__(self, folder: Path, slots: int, entries: int):
        self.folder, self.s, self.n = folder, slots, entries
        folder.mkdir(parents=True, exist_ok=True)
        self.files: list[Path] = []
        self.buf: bytearray | None = None

    def _new_file(self) -> None:
        self.flush()
        self.buf = bytearray(40 + 4 * self.s + 20 * self.n)
        self.ic, self.hsc, self.begin = 1, 0, (0, 0)
        self.files.append(self.folder / f"2026010100000{len(self.files):04d}")

    def put(self, topic: str, key: str, phy: int, store_ts: int) -> None:
        if self.buf is None or self.ic >= self.n:
            self._new_file()
        h = index_key_hash(topic, key)
        slot_pos = 40 + 4 * (h % self.s)
        (head,) = struct.unpack_from(">i", self.buf, slot_pos)
        if head <= 0 or head > self.ic:
            head = 0
        begin_ts = self.begin[0]
        diff = 0 if begin_ts <= 0 else min(max((store_ts - begin_ts) // 1000, 0), 2**31 - 1)
        struct.pack_into(">iqii", self.buf, 40 + 4 * self.s + 20 * self.ic, h, phy, diff, head)
        struct.pack_into(">i", self.buf, slot_pos, self.ic)
        if self.ic <= 1:
            self.begin = (store_ts, phy)
        self.hsc += head == 0
        self.ic += 1
        struct.pack_into(">qqqqii", self.buf, 0, self.begin[0], store_ts, self.begin[1], phy,
                         self.hsc, self.ic)

    def flush(self) -> None:
        if self.buf is not None:
            self.files[-1].write_bytes(bytes(self.buf))


def index_store(root: Path, builder: IndexBuilder) -> None:
    """Index every message of every topic of ``root`` in store order (UNIQ_KEY, then KEYS words)."""
    with Store(root) as store:
        rows = []
        for q in store.queues():
            batch = store.read(q.topic, q.queue_id, q.min_offset, q.max_offset)
            rows += batch.to_pylist()
    for r in sorted(rows, key=lambda r: r["commitLogOffset"]):
        ts = int(r["storeTimestamp"].timestamp() * 1000)
        for key in ([r["uniqKey"]] if r["uniqKey"] else []) + (r["keys"] or []):
            builder.put(r["topic"], key, r["commitLogOffset"], ts)
    builder.flush()


@pytest.fixture(scope="module")
def crafted(tmp_path_factory):
    """A writer-made store with several full index files and one filling (S=61, N=50)."""
    root = tmp_path_factory.mktemp("idx") / "store"
    messages = []
    with StoreWriter(root, commitlog_file_size=4096, cq_units_per_file=16) as w:
        w.create_topic("T", 3)
        w.create_topic("U", 1)
        for i in range(70):
            keys = [f"K{i}", f"G{i % 5}"] + (["dup", "dup"] if i == 33 else [])
            r = w.append("T", f"body-{i}".encode(), keys=keys, store_timestamp=1_700_000_000_000 + i * 400)
            messages.append(("T", r, keys))
            if i % 10 == 0:                 # same key on another topic: must not be reported for T
                r = w.append("U", b"u", keys=[f"G{i % 5}"], store_timestamp=1_700_000_000_000 + i * 400)
                messages.append(("U", r, [f"G{i % 5}"]))
    builder = IndexBuilder(root / "index", 61, 50)
    index_store(root, builder)
    assert len(builder.files) >= 4
    return root, messages, builder


# --------------------------------------------------------------------------------------- hashing

@pytest.mark.parametrize("topic, key", [("T", "k1"), ("TopicTest", "KEY-00001"),
                                        ("OrderTopic", "ORDER-024"), ("x", "\u00e9\U0001f600")])
def test_index_key_hash_is_abs_java_hash(topic, key):
    h = java_string_hash(f"{topic}#{key}")
    assert index_key_hash(topic, key) == abs(h) and index_key_hash(topic, key) >= 0


def test_index_slot_of_the_worked_example():
    # format doc B.2: "T#k1" hashes to 2539445, slot 2539445 with the default 5,000,000 slots
    assert index_key_hash("T", "k1") == 2539445
    assert index_key_hash("T", "k1") % DEFAULT_HASH_SLOTS == 2539445


# ------------------------------------------------------------------------------ fixture geometry

def test_fixture_geometry_is_inferred():
    base = _fixture()
    gen = json.loads((base / "generation.json").read_text())["storeParams"]
    paths = index_file_paths(str(base / "store"))
    assert len(paths) == 3 and paths == sorted(paths)
    for path in paths:
        with IndexFile(path) as f:
            assert f.geometry == (gen["maxHashSlotNum"], gen["maxIndexNum"])
            assert f.geometry_source == "inferred"


@pytest.mark.parametrize("slots, entries", [(512, None), (None, 2048), (512, 2048)])
def test_fixture_geometry_from_options(slots, entries):
    path = index_file_paths(str(_fixture() / "store"))[-1]
    with IndexFile(path, hash_slots=slots, index_num=entries) as f:
        assert f.geometry == (512, 2048) and f.geometry_source == "options"


@pytest.mark.parametrize("slots, entries, fragment", [
    (500, None, "must equal 40 + 4*slots + 20*entries"),
    (507, 2049, "does not hold beginPhyOffset"),   # fits the size, not the header
    (512, 2047, "must equal"),
])
def test_fixture_geometry_options_that_do_not_fit(slots, entries, fragment):
    path = index_file_paths(str(_fixture() / "store"))[-1]
    with pytest.raises(RmqOptionError, match="--hash-slots") as info:
        IndexFile(path, hash_slots=slots, index_num=entries)
    assert fragment in str(info.value)


# ------------------------------------------------------------------------ fixture conformance

def test_candidates_equal_the_brokers_answers(broker_answers):
    answers, _ = broker_answers
    root = str(BASIC / "store")
    for a in answers:
        ours = list(index_candidates(root, a["topic"], a["key"]))
        assert len(ours) == len(set(ours))
        assert sorted(ours) == sorted(a["commitLogOffsets"]), a["key"]
        assert ours == sorted(ours, reverse=True)      # newest first, as the broker walks


def test_verified_search_is_the_subset_that_really_matches(broker_answers):
    answers, manifest = broker_answers
    with Store(BASIC / "store") as store:
        for a in answers:
            truth = _truth(manifest, a["topic"], a["key"])
            found = find_by_key(store, a["topic"], a["key"], max_results=None, method="index")
            got = found.rows.column("commitLogOffset").to_pylist()
            assert got == truth, a["key"]
            assert set(got) <= set(a["commitLogOffsets"])
            assert found.method == "index" and found.index_files == 3 and not found.truncated
            assert found.candidates == len(a["commitLogOffsets"]) and found.unresolved == 0
            for row in found.rows.to_pylist():
                assert row["topic"] == a["topic"]
                assert a["key"] in (row["keys"] or []) or row["uniqKey"] == a["key"]


def test_scan_and_index_agree_on_the_fixture(broker_answers):
    answers, _ = broker_answers
    with Store(BASIC / "store") as store:
        for a in answers[:6]:
            by_index = find_by_key(store, a["topic"], a["key"], method="index")
            by_scan = find_by_key(store, a["topic"], a["key"], method="scan")
            assert by_scan.method == "scan"
            assert by_scan.rows.to_pylist() == by_index.rows.to_pylist()


def test_hash_collisions_are_removed_by_verification(broker_answers):
    # "OR" -> "P3": 31*'O' + 'R' == 31*'P' + '3', so both keys have the same index hash
    assert java_string_hash("OrderTopic#P3DER-024") == java_string_hash("OrderTopic#ORDER-024")
    answers, _ = broker_answers
    expected = next(a for a in answers if a["key"] == "ORDER-024")["commitLogOffsets"]
    with Store(BASIC / "store") as store:
        found = find_by_key(store, "OrderTopic", "P3DER-024", method="index")
    assert found.candidates == len(expected) > 0
    assert found.rows.num_rows == 0


def test_max_results_keeps_the_newest(broker_answers):
    answers, _ = broker_answers
    offsets = sorted(next(a for a in answers if a["key"] == "ORDER-024")["commitLogOffsets"])
    with Store(BASIC / "store") as store:
        for method in ("index", "scan"):
            found = find_by_key(store, "OrderTopic", "ORDER-024", max_results=5, method=method)
            assert found.rows.column("commitLogOffset").to_pylist() == offsets[-5:]
            assert found.truncated
            exact = find_by_key(store, "OrderTopic", "ORDER-024", max_results=len(offsets),
                                method=method)
            assert exact.rows.num_rows == len(offsets)


# ------------------------------------------------------------------------------ crafted stores

def _expected(messages, topic, key) -> list[int]:
    return sorted({r.commitlog_offset for t, r, keys in messages if t == topic and key in keys})


def test_crafted_files_infer_geometry(crafted):
    root, _, builder = crafted
    for i, path in enumerate(builder.files):
        with IndexFile(str(path)) as f:
            assert f.geometry == (61, 50), path
        with IndexFile(str(path), known=((61, 50),)) as f:
            assert f.geometry_source == "known"


@pytest.mark.parametrize("topic, key", [("T", "K0"), ("T", "K69"), ("T", "G3"), ("U", "G0"),
                                        ("T", "dup"), ("T", "none"), ("U", "K1")])
def test_crafted_search(crafted, topic, key):
    root, messages, _ = crafted
    with Store(root) as store:
        found = find_by_key(store, topic, key, max_results=None, method="index")
        scanned = find_by_key(store, topic, key, max_results=None, method="scan")
    assert found.rows.column("commitLogOffset").to_pylist() == _expected(messages, topic, key)
    assert scanned.rows.to_pylist() == found.rows.to_pylist()


def test_crafted_search_finds_uniq_keys_and_dedupes(crafted):
    root, messages, _ = crafted
    with Store(root) as store:
        row = store.read("T", 0, 3, 4).to_pylist()[0]
        found = find_by_key(store, "T", row["uniqKey"], method="index")
        assert found.rows.to_pylist() == [row]
        dup = find_by_key(store, "T", "dup", method="index")   # indexed twice, reported once
    assert dup.rows.num_rows == 1 and dup.candidates == 1


def _copy(root: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(root, dst)
    return dst


def test_candidates_into_deleted_commitlog_are_unresolved(crafted, tmp_path):
    root, messages, _ = crafted
    copy = _copy(root, tmp_path)
    from rmq_source.store.writer import delete_oldest_commitlog_files
    delete_oldest_commitlog_files(copy, 1)
    with Store(copy) as store:
        gone = store.commitlog().min_offset
        found = find_by_key(store, "T", "G1", max_results=None, method="index")
    expected = [o for o in _expected(messages, "T", "G1") if o >= gone]
    assert found.rows.column("commitLogOffset").to_pylist() == expected
    assert found.unresolved == len(_expected(messages, "T", "G1")) - len(expected) > 0


def test_in_flight_header_is_accepted(tmp_path):
    # the broker writes the entry and its slot, then bumps indexCount, then sets endPhyOffset: a
    # reader can see the new count with the previous entry's offset
    builder = IndexBuilder(tmp_path / "index", 7, 10)
    for i, key in enumerate(["a", "b", "c"]):
        builder.put("T", key, 1000 * (i + 1), 1_700_000_000_000 + i)
    builder.flush()
    data = bytearray(builder.files[0].read_bytes())
    struct.pack_into(">q", data, 24, 2000)                # endPhyOffset of entry 2, count 4
    path = tmp_path / "20260101000000009"
    path.write_bytes(bytes(data))
    with IndexFile(str(path)) as f:
        assert f.geometry == (7, 10) and f.geometry_source == "inferred"
        assert f.lookup(index_key_hash("T", "c")) == [3000]


def test_header_that_fits_nothing_asks_for_the_options(crafted, tmp_path):
    _, _, builder = crafted
    data = bytearray(builder.files[-1].read_bytes())
    struct.pack_into(">q", data, 24, 123456789)           # endPhyOffset found in no entry
    path = tmp_path / "20260101000000000"
    path.write_bytes(bytes(data))
    with pytest.raises(RmqStoreLayoutError, match="--hash-slots and --index-num") as info:
        IndexFile(str(path))
    assert str(path) in str(info.value)


def test_explicit_options_are_checked_against_the_header(crafted, tmp_path):
    _, _, builder = crafted
    data = bytearray(builder.files[-1].read_bytes())
    struct.pack_into(">q", data, 24, 123456789)
    path = tmp_path / "20260101000000000"
    path.write_bytes(bytes(data))
    with pytest.raises(RmqOptionError, match="endPhyOffset"):
        IndexFile(str(path), hash_slots=61)


@pytest.mark.parametrize("size", [40, 43048])
def test_file_without_entries_needs_no_geometry(tmp_path, size):
    path = tmp_path / "20260101000000000"
    data = bytearray(size)
    struct.pack_into(">i", data, 36, 1)                   # indexCount 1: nothing written yet
    path.write_bytes(bytes(data))
    with IndexFile(str(path)) as f:
        assert f.geometry is None and f.lookup(12345) == []


def test_short_or_odd_files_are_layout_errors(tmp_path):
    short = tmp_path / "20260101000000000"
    short.write_bytes(b"\0" * 39)
    with pytest.raises(RmqStoreLayoutError, match="40-byte header"):
        IndexFile(str(short))
    odd = tmp_path / "20260101000000001"
    data = bytearray(40 + 4 * 8 + 20 * 8 + 2)
    struct.pack_into(">i", data, 36, 5)
    odd.write_bytes(bytes(data))
    with pytest.raises(RmqStoreLayoutError, match="not 40 \\+ 4\\*slots"):
        IndexFile(str(odd))


def test_default_geometry_on_a_sparse_default_size_file(tmp_path):
    size = 40 + 4 * DEFAULT_HASH_SLOTS + 20 * DEFAULT_INDEX_NUM
    path = tmp_path / "20260101000000000"
    h = index_key_hash("T", "k1")
    with open(path, "wb") as f:
        f.truncate(size)                                  # sparse: no 420 MB on disk
        entries = 40 + 4 * DEFAULT_HASH_SLOTS
        f.seek(40 + 4 * (h % DEFAULT_HASH_SLOTS))
        f.write(struct.pack(">i", 2))
        f.seek(40 + 4 * 77)
        f.write(struct.pack(">i", 1))
        f.seek(entries + 20)
        f.write(struct.pack(">iqii", 77, 4096, 0, 0))    # another key, another slot
        f.seek(entries + 40)
        f.write(struct.pack(">iqii", h, 8192, 1, 0))
        f.seek(0)
        f.write(struct.pack(">qqqqii", 1_700_000_000_000, 1_700_000_001_000, 4096, 8192, 2, 3))
    with IndexFile(str(path)) as f:
        assert f.geometry == (DEFAULT_HASH_SLOTS, DEFAULT_INDEX_NUM)
        assert f.geometry_source == "defaults"
        assert f.lookup(h) == [8192] and f.lookup(77) == [4096] and f.lookup(78) == []


def test_chain_loop_is_a_corrupt_store_error(tmp_path):
    s, n = 4, 8
    data = bytearray(40 + 4 * s + 20 * n)
    h = 5                                                  # slot 1
    ent = 40 + 4 * s
    struct.pack_into(">iqii", data, ent + 20 * 1, 6, 100, 0, 0)
    struct.pack_into(">iqii", data, ent + 20 * 2, h, 200, 0, 3)   # 2 -> 3 -> 2 -> ...
    struct.pack_into(">iqii", data, ent + 20 * 3, h, 300, 0, 2)
    struct.pack_into(">iqii", data, ent + 20 * 4, 7, 400, 0, 0)
    struct.pack_into(">i", data, 40 + 4 * 1, 3)
    struct.pack_into(">qqqqii", data, 0, 1, 1, 100, 400, 3, 5)
    path = tmp_path / "20260101000000000"
    path.write_bytes(bytes(data))
    with IndexFile(str(path), hash_slots=s, index_num=n) as f:
        with pytest.raises(RmqCorruptStoreError, match="loops"):
            f.lookup(h)


# ------------------------------------------------------------------------------ argument errors

@pytest.mark.parametrize("kwargs, error, fragment", [
    ({"key": "a b"}, RmqOptionError, "--key"),
    ({"key": ""}, RmqOptionError, "--key"),
    ({"method": "fast"}, RmqOptionError, "--method"),
    ({"max_results": 0}, RmqOptionError, "max_results"),
    ({"topic": "Nope"}, RmqUnknownTopicError, "Nope"),
])
def test_find_by_key_arguments(crafted, kwargs, error, fragment):
    root, _, _ = crafted
    args = {"topic": "T", "key": "K1", **kwargs}
    with Store(root) as store:
        with pytest.raises(error, match=fragment):
            find_by_key(store, args.pop("topic"), args.pop("key"), **args)


def test_index_method_without_index_files(tmp_path):
    root = tmp_path / "s"
    with StoreWriter(root, commitlog_file_size=8192) as w:
        w.create_topic("T", 1)
        w.append("T", b"x", keys=["a"])
    with Store(root) as store:
        with pytest.raises(RmqStoreLayoutError, match="no index files"):
            find_by_key(store, "T", "a", method="index")
        assert find_by_key(store, "T", "a").method == "scan"   # auto falls back
    assert not os.path.exists(root / "index")


def test_the_533_fixture_index_agrees_with_its_manifest():
    base = fixture_dir("rocketmq-5.3.3/basic")
    manifest = _jsonl(base / "manifest.jsonl")
    long_topic = next(m["topic"] for m in manifest if len(m["topic"]) > 127)   # V2 records
    picks = [m for m in manifest if m["topic"] == "OrderTopic"][:3]
    picks += [m for m in manifest if m["topic"] == long_topic][:3]
    with Store(base / "store") as store:
        for m in picks:
            for key in [m["uniqKey"], *(m["keys"] or "").split(" ")]:
                if not key:
                    continue
                found = find_by_key(store, m["topic"], key, max_results=None, method="index")
                assert found.rows.column("commitLogOffset").to_pylist() == _truth(
                    manifest, m["topic"], key), key
                assert m["commitLogOffset"] in found.rows.column("commitLogOffset").to_pylist()
