"""The C core against stores written by RocketMQ 4.9.3 and 5.3.3 and their answer files.

Every column scan_queue produces is compared with manifest.jsonl (RocketMQ's MessageDecoder),
min/max offsets and the CommitLog end with queues.json, tag filtering with filter.jsonl (the
store's getMessage) and time lookup with timestamps.jsonl (5.3.3 resultLower) or, for 4.9.3 whose
answers depend on file mtimes and use a "closest" rule (§9.1), with "first offset whose
storeTimestamp >= T" computed from the manifest.
"""
from __future__ import annotations

import base64
import json
import os
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

import pyarrow as pa
import pytest

from conftest import fixture_dir, fixtures_root, missing

from rmq_source.store import native
from rmq_source.subscription import Subscription

VERSIONS = ["rocketmq-4.9.3", "rocketmq-5.3.3"]


def _fixture(version: str) -> Path:
    return fixture_dir(f"{version}/basic")


def _jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _files(folder: Path) -> list[tuple[int, str]]:
    return sorted((int(n), str(folder / n)) for n in os.listdir(folder) if n.isdigit())


class Fixture:
    def __init__(self, version: str):
        self.folder = _fixture(version)
        self.store = self.folder / "store"
        self.queues = json.loads((self.folder / "queues.json").read_text())
        gen = json.loads((self.folder / "generation.json").read_text())["storeParams"]
        self.cl_file_size = gen["mappedFileSizeCommitLog"]
        self.cq_file_size = gen["mappedFileSizeConsumeQueue"]
        self.commitlog = native.CommitLog(
            [native.map_segment(p, s) for s, p in _files(self.store / "commitlog")],
            self.cl_file_size)
        self.manifest: dict[tuple[str, int], list[dict]] = defaultdict(list)
        for row in _jsonl(self.folder / "manifest.jsonl"):
            self.manifest[(row["topic"], row["queueId"])].append(row)

    def cq(self, topic: str, qid: int) -> list[native.Segment]:
        folder = self.store / "consumequeue" / topic / str(qid)
        return [native.map_segment(p, s) for s, p in _files(folder)] if folder.is_dir() else []

    def queue_list(self) -> list[dict]:
        return [q for q in self.queues["queues"] if q["files"]]


@lru_cache(maxsize=None)
def fixture(version: str) -> Fixture:
    return Fixture(version)


def _queue_ids(version: str) -> list[str]:
    folder = fixtures_root() / version / "basic" / "queues.json"
    if not folder.is_file():
        return ["absent"]
    data = json.loads(folder.read_text())
    return [f"{q['topic']}/{q['queueId']}" for q in data["queues"] if q["files"]]


QUEUE_CASES = [(v, q) for v in VERSIONS for q in _queue_ids(v)]


def _split_queue(qname: str) -> tuple[str, int]:
    if qname == "absent":
        missing("reference fixture absent")
    topic, qid = qname.rsplit("/", 1)
    return topic, int(qid)


def _scan_all(fx: Fixture, topic: str, qid: int, start: int, end: int, **kw) -> tuple[pa.Table, list]:
    """Scan [start, end) in batches (small ones, to cross CQ file borders inside a call)."""
    cq = fx.cq(topic, qid)
    batches, results = [], []
    pos = start
    while pos < end:
        res = native.scan_queue(fx.commitlog, cq, fx.cq_file_size, pos, end, **kw)
        res.batch.validate(full=True)
        batches.append(res.batch)
        results.append(res)
        if res.status != "FULL":
            break
        assert res.next_offset > pos
        pos = res.next_offset
    return pa.Table.from_batches(batches, schema=native.NATIVE_SCHEMA), results


def _keys(raw):
    if raw is None:
        return None
    words = [w for w in raw.split(" ") if w]
    return words or None


@pytest.mark.parametrize("version,queue", QUEUE_CASES)
def test_scan_matches_manifest(version, queue):
    topic, qid = _split_queue(queue)
    fx = fixture(version)
    expected = fx.manifest[(topic, qid)]
    info = next(q for q in fx.queues["queues"] if q["topic"] == topic and q["queueId"] == qid)
    table, results = _scan_all(fx, topic, qid, info["minOffset"], info["maxOffset"], max_rows=37)
    assert results[-1].status == "END"
    assert results[-1].next_offset == info["maxOffset"]
    assert sum(r.scanned for r in results) == info["maxOffset"] - info["minOffset"]
    rows = table.to_pylist()
    born = table.column("bornTimestamp").cast(pa.int64()).to_pylist()
    store = table.column("storeTimestamp").cast(pa.int64()).to_pylist()
    assert len(rows) == len(expected) == info["maxOffset"] - info["minOffset"]
    for row, exp, b_us, s_us in zip(rows, expected, born, store):
        where = f"{topic}/{qid}@{exp['queueOffset']}"
        assert row["queueOffset"] == exp["queueOffset"], where
        for col in ("queueId", "commitLogOffset", "storeSize", "msgId", "uniqKey", "tags",
                    "bornHost", "storeHost", "sysFlag", "flag", "reconsumeTimes", "bodyCRC",
                    "preparedTransactionOffset"):
            assert row[col] == exp[col], (where, col)
        assert row["keys"] == _keys(exp["keys"]), where
        assert row["body"] == base64.b64decode(exp["body"]), where
        props = row["properties"]
        assert len({k for k, _ in props}) == len(props), (where, "duplicate map keys")
        assert dict(props) == exp["properties"], where
        assert b_us == exp["bornTimestamp"] * 1000, where
        assert s_us == exp["storeTimestamp"] * 1000, where
        assert exp["cq"]["size"] == row["storeSize"], where


@pytest.mark.parametrize("version,queue", QUEUE_CASES)
def test_min_max_offsets_match_queues_json(version, queue):
    topic, qid = _split_queue(queue)
    fx = fixture(version)
    info = next(q for q in fx.queues["queues"] if q["topic"] == topic and q["queueId"] == qid)
    cq = fx.cq(topic, qid)
    last = cq[-1]
    max_offset = (last.file_start + native.cq_valid_units(last) * 20) // 20
    first = cq[0]
    min_offset = (first.file_start
                  + native.cq_first_unit_at_or_above(first, fx.commitlog.min_offset) * 20) // 20
    assert (min_offset, max_offset) == (info["minOffset"], info["maxOffset"])


@pytest.mark.parametrize("version", VERSIONS)
def test_commitlog_valid_end_matches_broker(version):
    fx = fixture(version)
    expected = fx.queues["commitLog"]["maxPhyOffset"]
    assert fx.commitlog.valid_end() == expected
    assert fx.commitlog.valid_end(verify_crc=True) == expected
    assert fx.commitlog.min_offset == fx.queues["commitLog"]["minPhyOffset"]


@pytest.mark.parametrize("version", VERSIONS)
def test_store_timestamp_of_every_record(version):
    fx = fixture(version)
    for rows in fx.manifest.values():
        for exp in rows:
            assert fx.commitlog.store_timestamp(exp["commitLogOffset"], exp["storeSize"]) == \
                exp["storeTimestamp"]


def _filter_cases(version: str) -> list:
    path = fixtures_root() / version / "basic" / "filter.jsonl"
    if not path.is_file():
        return [pytest.param(None, id="absent")]
    cases, seen = [], set()
    for i, row in enumerate(_jsonl(path)):
        # answers that describe a scanned range (the others are offset-range statuses); the two
        # broker filter classes give the same answers, keep one of each
        key = (row["topic"], row["queueId"], row["startOffset"], row["nextBeginOffset"],
               row["expression"])
        if row["status"] in ("FOUND", "NO_MATCHED_MESSAGE") and \
                row["startOffset"] < row["nextBeginOffset"] and key not in seen:
            seen.add(key)
            cases.append(pytest.param(row, id=f"{i}-{row['topic'][:12]}-{row['queueId']}-"
                                               f"{row['expression']!r}-{row['startOffset']}"))
    return cases


@pytest.mark.parametrize("version", VERSIONS)
def test_filter_fixture_has_cases(version):
    _fixture(version)
    assert len(_filter_cases(version)) > 50


def _check_filter(version: str, row: dict) -> None:
    if row is None:
        missing("reference fixture absent")
    fx = fixture(version)
    topic, qid = row["topic"], row["queueId"]
    start, stop = row["startOffset"], row["nextBeginOffset"]
    sub = Subscription.parse(row["expression"])
    if "codeSet" in row:
        assert sorted(sub.codes) == sorted(row["codeSet"]) and set(sub.tags) == set(row["tagsSet"])
    codes = None if sub.sub_all else sub.codes
    # stage 1 only (hash codes), as the store answers
    table, results = _scan_all(fx, topic, qid, start, stop, codes=codes, max_rows=1000)
    assert results[-1].status == "END" and results[-1].next_offset == stop
    assert table.column("queueOffset").to_pylist() == row["queueOffsets"]
    # both stages: exact tag strings re-checked in C, as the client does
    tags = None if sub.sub_all else sub.tags
    table, _ = _scan_all(fx, topic, qid, start, stop, codes=codes, tags=tags, max_rows=1000)
    if "clientFilteredQueueOffsets" in row:
        expected = row["clientFilteredQueueOffsets"]
    else:
        by_offset = {m["queueOffset"]: m for m in fx.manifest[(topic, qid)]}
        expected = [o for o in row["queueOffsets"]
                    if sub.sub_all or by_offset[o]["tags"] in sub.tags]
    assert table.column("queueOffset").to_pylist() == expected
    if not sub.sub_all:
        assert all(t in sub.tags for t in table.column("tags").to_pylist())


@pytest.mark.parametrize("row", _filter_cases("rocketmq-4.9.3"))
def test_tag_filter_matches_4_9_3(row):
    _check_filter("rocketmq-4.9.3", row)


@pytest.mark.parametrize("row", _filter_cases("rocketmq-5.3.3"))
def test_tag_filter_matches_5_3_3(row):
    _check_filter("rocketmq-5.3.3", row)


def test_hash_collision_removed_only_by_exact_check():
    """'Aa' and 'BB' share hash 2112: hash-only keeps both, the exact check keeps only 'Aa'."""
    fx = fixture("rocketmq-4.9.3")
    sub = Subscription.parse("Aa")
    seen_bb = False
    for (topic, qid), rows in fx.manifest.items():
        end = rows[-1]["queueOffset"] + 1
        hashed, _ = _scan_all(fx, topic, qid, 0, end, codes=sub.codes, max_rows=10_000)
        exact, _ = _scan_all(fx, topic, qid, 0, end, codes=sub.codes, tags=sub.tags,
                             max_rows=10_000)
        seen_bb |= "BB" in hashed.column("tags").to_pylist()
        assert set(hashed.column("tags").to_pylist()) <= {"Aa", "BB"}
        assert exact.column("queueOffset").to_pylist() == \
            [r["queueOffset"] for r in rows if r["tags"] == "Aa"]
    assert seen_bb


def _time_cases(version: str) -> list:
    path = fixtures_root() / version / "basic" / "timestamps.jsonl"
    if not path.is_file():
        return [pytest.param(None, id="absent")]
    return [pytest.param(r, id=f"{i}-{r['topic'][:12]}-{r['queueId']}-{r['kind']}")
            for i, r in enumerate(_jsonl(path))]


@pytest.mark.parametrize("row", _time_cases("rocketmq-5.3.3"))
def test_lookup_time_matches_5_3_3_lower(row):
    if row is None:
        missing("reference fixture absent")
    fx = fixture("rocketmq-5.3.3")
    info = next(q for q in fx.queues["queues"]
                if q["topic"] == row["topic"] and q["queueId"] == row["queueId"])
    got = native.lookup_time(fx.commitlog, fx.cq(row["topic"], row["queueId"]), fx.cq_file_size,
                             info["minOffset"], info["maxOffset"], row["timestamp"])
    assert got == row["resultLower"]


@pytest.mark.parametrize("row", _time_cases("rocketmq-4.9.3"))
def test_lookup_time_4_9_3_first_at_or_after(row):
    """4.9.3 answers by file mtime and "closest" (§9.1); we check the LOWER rule on its data."""
    if row is None:
        missing("reference fixture absent")
    fx = fixture("rocketmq-4.9.3")
    topic, qid, ts = row["topic"], row["queueId"], row["timestamp"]
    info = next(q for q in fx.queues["queues"] if q["topic"] == topic and q["queueId"] == qid)
    expected = next((m["queueOffset"] for m in fx.manifest[(topic, qid)]
                     if m["storeTimestamp"] >= ts), info["maxOffset"])
    got = native.lookup_time(fx.commitlog, fx.cq(topic, qid), fx.cq_file_size,
                             info["minOffset"], info["maxOffset"], ts)
    assert got == expected
    if row["kind"].startswith("equal"):
        # an exact hit: 4.9.3 may return any unit with that time; ours is the first one
        assert fx.manifest[(topic, qid)][got]["storeTimestamp"] == ts
