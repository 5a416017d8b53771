"""StoreWriter: the bytes and files it lays down, checked without the reader."""
from __future__ import annotations

import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from rmq_source.store import record_codec as rc
from rmq_source.store import writer as writer_module
from rmq_source.store.config_files import read_topics
from rmq_source.errors import RmqOptionError, RmqSourceError, RmqUnknownTopicError
from rmq_source.subscription import java_string_hash
from rmq_source.store.writer import StoreWriter

CL = 4096          # tiny CommitLog files: several roll-overs per test
UNITS = 8          # ConsumeQueue files of 8 units


@pytest.fixture
def store(tmp_path):
    with StoreWriter(tmp_path / "store", commitlog_file_size=CL, cq_units_per_file=UNITS) as w:
        w.create_topic("T", 3)
        yield w


def commitlog_files(root: Path) -> list[Path]:
    return sorted((root / "commitlog").iterdir())


def walk_commitlog(root: Path, file_size: int):
    """Yield ("MSG", phy, record) / ("BLANK", phy, remaining) walking the files as the broker."""
    for path in commitlog_files(root):
        data = path.read_bytes()
        start = int(path.name)
        pos = 0
        while pos + 8 <= len(data):
            size, magic = struct.unpack_from(">ii", data, pos)
            if magic == rc.BLANK_MAGIC:
                yield "BLANK", start + pos, size
                break
            if magic == 0:
                return
            rec = rc.decode_record(data, pos, where=str(path))
            yield "MSG", start + pos, rec
            pos += rec.total_size


def cq_unit(root: Path, topic: str, qid: int, offset: int, units: int = UNITS):
    first = offset - offset % units
    path = root / "consumequeue" / topic / str(qid) / f"{first * 20:020d}"
    data = path.read_bytes()
    return rc.CQ_UNIT.unpack_from(data, (offset - first) * 20)


def test_file_names_sizes_and_preallocation(store):
    results = [store.append("T", os.urandom(200 + i), tags="TagA") for i in range(40)]
    root = store.root
    files = commitlog_files(root)
    assert [p.name for p in files] == [f"{i * CL:020d}" for i in range(len(files))]
    assert all(p.stat().st_size == CL for p in files)
    active = results[-1].commitlog_offset // CL
    assert len(files) == active + 2                                  # next file preallocated
    assert files[-1].read_bytes() == bytes(CL)
    for qid in range(3):
        qfiles = sorted((root / "consumequeue" / "T" / str(qid)).iterdir())
        count = store.next_offset("T", qid)
        assert [p.name for p in qfiles] == [f"{i * UNITS * 20:020d}"
                                            for i in range((count + UNITS - 1) // UNITS)]
        assert all(p.stat().st_size == UNITS * 20 for p in qfiles)   # created on demand, full size


def test_blank_records_end_every_full_file(store):
    results = [store.append("T", b"x" * (i * 37 % 500), tags=None) for i in range(60)]
    walked = list(walk_commitlog(store.root, CL))
    messages = [(phy, rec) for kind, phy, rec in walked if kind == "MSG"]
    assert [phy for phy, _ in messages] == [r.commitlog_offset for r in results]
    blanks = [(phy, rem) for kind, phy, rem in walked if kind == "BLANK"]
    assert blanks and len(blanks) == results[-1].commitlog_offset // CL
    for phy, remaining in blanks:
        assert phy % CL + remaining == CL and remaining >= 8
        nxt = next(r for r in results if r.commitlog_offset > phy)
        assert nxt.commitlog_offset % CL == 0                        # next record opens a file
        assert nxt.size + 8 > remaining                              # it did not fit
    for phy, rec in messages:
        assert phy % CL + rec.total_size + 8 <= CL                   # never spans, leaves 8 bytes


def test_exact_fit_rule_record_plus_8(tmp_path):
    """A record that leaves exactly 8 bytes stays; one byte more moves it to the next file."""
    with StoreWriter(tmp_path / "s", commitlog_file_size=1024, cq_units_per_file=UNITS) as w:
        w.create_topic("T", 1)
        first = w.append("T", b"", properties={"UNIQ_KEY": None, "WAIT": None})
        assert first.size == 91 + 1                                  # minimal record, topic "T"
        body_len = 1024 - first.size - 8 - 92
        second = w.append("T", b"a" * body_len, properties={"UNIQ_KEY": None, "WAIT": None})
        assert second.commitlog_offset == first.size and second.size + first.size == 1024 - 8
        third = w.append("T", b"", properties={"UNIQ_KEY": None, "WAIT": None})
        assert third.commitlog_offset == 1024
        data = (w.root / "commitlog" / f"{0:020d}").read_bytes()
        assert struct.unpack_from(">ii", data, 1016) == (8, rc.BLANK_MAGIC)


def test_cq_units_point_at_records_with_tag_codes(store):
    tags = ["TagA", None, "Aa", "BB", "名前", "TagA"]
    results = [store.append("T", f"m{i}".encode(), tags=tags[i % len(tags)]) for i in range(30)]
    for i, r in enumerate(results):
        tag = tags[i % len(tags)]
        code = java_string_hash(tag) if tag else 0
        assert cq_unit(store.root, "T", r.queue_id, r.queue_offset) == (r.commitlog_offset, r.size,
                                                                       code)
    assert cq_unit(store.root, "T", 0, 0)[2] == 2598919                  # "TagA"
    # the unit for the next offset is still zero (not yet written)
    q = results[-1].queue_id
    nxt = store.next_offset("T", q)
    if nxt % UNITS:
        assert cq_unit(store.root, "T", q, nxt) == (0, 0, 0)


def test_record_fields(store):
    r = store.append("T", b"body", queue_id=2, tags="TagB", keys=["k1", "k2"],
                     properties={"a": "1", "ü": "ß"}, flag=7, born_timestamp=1_000,
                     store_timestamp=2_000, born_host="10.0.0.5:1234", store_host="10.0.0.1:10911",
                     reconsume_times=3, uniq_key="U1", prepared_transaction_offset=99,
                     sys_flag_extra=rc.FLAG_MULTI_TAGS)
    data = (store.root / "commitlog" / f"{r.commitlog_offset - r.commitlog_offset % CL:020d}"
            ).read_bytes()
    rec = rc.decode_record(data, r.commitlog_offset % CL)
    assert (rec.queue_id, rec.queue_offset, rec.physical_offset, rec.flag) == (2, 0, r.commitlog_offset, 7)
    assert (rec.born_timestamp, rec.store_timestamp, rec.reconsume_times) == (1_000, 2_000, 3)
    assert rec.prepared_transaction_offset == 99 and rec.sys_flag == rc.FLAG_MULTI_TAGS
    assert rec.born_host == rc.parse_host("10.0.0.5:1234").field
    assert rec.body_crc == zlib.crc32(b"body") & 0x7FFFFFFF and rec.body == b"body"
    assert rec.properties_raw == ("TAGS\x01TagB\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01U1\x02WAIT\x01true"
                                  "\x02a\x011\x02ü\x01ß").encode()
    assert r.msg_id == "0A00000100002A9F" + f"{r.commitlog_offset:016X}"
    assert r.size == rec.total_size


@pytest.mark.parametrize("style, tail", [("4.9.3", b"WAIT\x01true"), ("5.3.3", b"WAIT\x01true\x02")])
def test_properties_style(tmp_path, style, tail):
    with StoreWriter(tmp_path / "s", commitlog_file_size=CL, properties_style=style) as w:
        w.create_topic("T", 1)
        for tags in ("TagA", "TagA", None):             # fast path and general path
            r = w.append("T", b"x", tags=tags)
            rec = rc.decode_record((w.root / "commitlog" / f"{0:020d}").read_bytes(),
                                   r.commitlog_offset)
            assert rec.properties_raw.endswith(tail)
            assert rec.properties["UNIQ_KEY"].startswith("7F000001")


def test_fast_and_general_paths_write_identical_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(writer_module, "_time_ns", lambda: 1_700_000_000_123_000_000)
    records = []
    for n, extra in enumerate(({}, {"properties": {}})):     # properties={} forces the general path
        with StoreWriter(tmp_path / f"s{n}", commitlog_file_size=CL) as w:
            w.create_topic("T", 2)
            w.append("T", b"warm-up", tags="TagA")              # registers the tag for the fast path
            r = w.append("T", b"payload", tags="TagA", **extra)
            data = (w.root / "commitlog" / f"{0:020d}").read_bytes()
            records.append(bytearray(data[r.commitlog_offset:r.commitlog_offset + r.size]))
    for rec in records:     # the UNIQ_KEY counter differs: blank its 4 hex digits
        i = rec.index(b"UNIQ_KEY\x01") + 9 + 28
        rec[i:i + 4] = b"____"
    assert records[0] == records[1]


def test_ipv6_hosts(tmp_path):
    with StoreWriter(tmp_path / "s", commitlog_file_size=CL, store_host="[::1]:10911",
                     born_host="[fe80::2]:5") as w:
        w.create_topic("T", 1)
        r = w.append("T", b"v6", tags="TagA")
        r4 = w.append("T", b"v4", born_host="1.2.3.4:5", store_host="5.6.7.8:9")
        data = (w.root / "commitlog" / f"{0:020d}").read_bytes()
    rec = rc.decode_record(data, r.commitlog_offset)
    assert rec.sys_flag == rc.FLAG_BORNHOST_V6 | rc.FLAG_STOREHOST_V6
    assert len(rec.born_host) == len(rec.store_host) == 20
    assert r.size == 91 + 24 + 1 + 2 + len(rec.properties_raw)
    assert len(r.msg_id) == 56 and r.msg_id.startswith("0" * 31 + "1" + "00002A9F")
    assert len(rec.properties["UNIQ_KEY"]) == 56 and rec.properties["UNIQ_KEY"].startswith("FE80")
    assert rc.decode_record(data, r4.commitlog_offset).sys_flag == 0


@pytest.mark.parametrize("compression, style, flag", [
    ("zlib", "4.9.3", 0x1), ("zlib", "5.3.3", 0x301), ("lz4", "5.3.3", 0x101),
    ("zstd", "5.3.3", 0x201),
])
def test_compression_crc_covers_stored_bytes(tmp_path, compression, style, flag):
    body = b"compressible " * 500
    with StoreWriter(tmp_path / "s", commitlog_file_size=1 << 16, properties_style=style) as w:
        w.create_topic("T", 1)
        r = w.append("T", body, compression=compression)
        rec = rc.decode_record((w.root / "commitlog" / f"{0:020d}").read_bytes(), r.commitlog_offset)
    assert rec.sys_flag == flag and len(rec.body) < len(body)
    assert rec.body_crc == zlib.crc32(rec.body) & 0x7FFFFFFF


def test_long_topic_uses_v2_record(tmp_path):
    topic = "L" * 140
    with StoreWriter(tmp_path / "s", commitlog_file_size=CL) as w:
        w.create_topic(topic, 1)
        w.create_topic("S" * 127, 1)
        r = w.append(topic, b"x", tags="TagA")
        r127 = w.append("S" * 127, b"x", tags="TagA")
        data = (w.root / "commitlog" / f"{0:020d}").read_bytes()
    rec = rc.decode_record(data, r.commitlog_offset)
    assert rec.magic == rc.MAGIC_V2 and rec.topic == topic
    assert rc.decode_record(data, r127.commitlog_offset).magic == rc.MAGIC_V1
    assert (w.root / "consumequeue" / topic / "0").is_dir()


def test_prepared_and_rollback_records_stay_out_of_the_consume_queue(store):
    a = store.append("T", b"a", queue_id=0)
    half = store.append("T", b"half", queue_id=0, sys_flag_extra=rc.TX_PREPARED)
    commit = store.append("T", b"commit", queue_id=0, sys_flag_extra=0x8,
                          prepared_transaction_offset=half.commitlog_offset)
    assert half.queue_offset is None and (a.queue_offset, commit.queue_offset) == (0, 1)
    data = (store.root / "commitlog" / f"{0:020d}").read_bytes()
    assert rc.decode_record(data, half.commitlog_offset).queue_offset == 0
    assert cq_unit(store.root, "T", 0, 1)[0] == commit.commitlog_offset


def test_queue_selection(store):
    assert [store.append("T", b"").queue_id for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    seen = []

    def selector(queues, message, arg):
        seen.append((queues, message.topic, message.body, message.tags, arg))
        return queues[arg % len(queues)]

    r = store.append("T", b"b", tags="X", selector=selector, selector_arg=5)
    assert r.queue_id == 2 and seen == [([0, 1, 2], "T", b"b", "X", 5)]
    assert store.append("T", b"", queue_id=1).queue_id == 1


def test_timestamps_never_decrease(store):
    a = store.append("T", b"", store_timestamp=5_000_000_000_000)     # far future
    b = store.append("T", b"")                                         # clock is behind: held
    data = (store.root / "commitlog" / f"{0:020d}").read_bytes()
    assert rc.decode_record(data, b.commitlog_offset).store_timestamp == 5_000_000_000_000
    with pytest.raises(RmqOptionError, match="never decrease"):
        store.append("T", b"", store_timestamp=4_000_000_000_000)
    assert rc.decode_record(data, a.commitlog_offset).born_timestamp == 5_000_000_000_000


@pytest.mark.parametrize("kwargs, match", [
    ({"topic": "T", "body": "text"}, "body must be bytes"),
    ({"topic": "bad/topic", "body": b""}, "invalid characters"),
    ({"topic": "", "body": b""}, "non-empty"),
    ({"topic": "T", "body": b"", "queue_id": 3}, "queue_id"),
    ({"topic": "T", "body": b"", "queue_id": -1}, "queue_id"),
    ({"topic": "T", "body": b"", "queue_id": True}, "queue_id"),
    ({"topic": "T", "body": b"", "queue_id": 0, "selector": lambda q, m, a: 0}, "either"),
    ({"topic": "T", "body": b"", "selector": lambda q, m, a: 9}, "selector returned"),
    ({"topic": "T", "body": b"", "selector": 5}, "callable"),
    ({"topic": "T", "body": b"", "tags": ""}, "tags"),
    ({"topic": "T", "body": b"", "tags": 5}, "tags"),
    ({"topic": "T", "body": b"", "tags": "a\x02b"}, "separator"),
    ({"topic": "T", "body": b"", "keys": ["a b"]}, "without spaces"),
    ({"topic": "T", "body": b"", "keys": [""]}, "without spaces"),
    ({"topic": "T", "body": b"", "keys": "  "}, "no key"),
    ({"topic": "T", "body": b"", "keys": 5}, "keys"),
    ({"topic": "T", "body": b"", "properties": {"k": ""}}, "non-empty"),
    ({"topic": "T", "body": b"", "properties": {"k": 1}}, "non-empty"),
    ({"topic": "T", "body": b"", "properties": [("k", "v")]}, "mapping"),
    ({"topic": "T", "body": b"", "properties": {"TAGS": "x"}, "tags": "y"}, "give it once"),
    ({"topic": "T", "body": b"", "properties": {"k": "v" * 40000}}, "32767"),
    ({"topic": "T", "body": b"", "flag": 1 << 31}, "flag"),
    ({"topic": "T", "body": b"", "flag": None}, "flag"),
    ({"topic": "T", "body": b"", "reconsume_times": -1}, "reconsume_times"),
    ({"topic": "T", "body": b"", "sys_flag_extra": 0x10}, "sys_flag_extra"),
    ({"topic": "T", "body": b"", "sys_flag_extra": 0x1}, "sys_flag_extra"),
    ({"topic": "T", "body": b"", "store_timestamp": -5}, "store_timestamp"),
    ({"topic": "T", "body": b"", "born_timestamp": "now"}, "born_timestamp"),
    ({"topic": "T", "body": b"", "born_host": "nohost"}, "born_host"),
    ({"topic": "T", "body": b"", "store_host": "1.2.3.4:99999"}, "store_host"),
    ({"topic": "T", "body": b"", "compression": "gzip"}, "compression"),
    ({"topic": "T", "body": b"", "uniq_key": ""}, "uniq_key"),
    ({"topic": "T", "body": b"x" * 5000}, "cannot fit"),
])
def test_append_rejects_bad_arguments(store, kwargs, match):
    before = store.commitlog_end
    with pytest.raises(RmqOptionError, match=match):
        store.append(**kwargs)
    assert store.commitlog_end == before


def test_unknown_topic(store):
    with pytest.raises(RmqUnknownTopicError, match="create_topic"):
        store.append("Nope", b"")


@pytest.mark.parametrize("kwargs, match", [
    ({"commitlog_file_size": 10}, "commitlog_file_size"),
    ({"cq_units_per_file": 0}, "cq_units_per_file"),
    ({"properties_style": "4.0"}, "properties_style"),
    ({"store_host": "x"}, "store_host"),
    ({"broker_name": ""}, "broker_name"),
    ({"compression_level": 99}, "compression_level"),
    ({"max_message_size": 0}, "max_message_size"),
])
def test_constructor_rejects_bad_options(tmp_path, kwargs, match):
    with pytest.raises(RmqOptionError, match=match):
        StoreWriter(tmp_path / "s", **kwargs)
    StoreWriter(tmp_path / "s").close()      # the failed attempt left no lock behind


def test_max_message_size(tmp_path):
    with StoreWriter(tmp_path / "s", commitlog_file_size=1 << 16, max_message_size=1000) as w:
        w.create_topic("T", 1)
        with pytest.raises(RmqOptionError, match="max_message_size"):
            w.append("T", b"x" * 1000, tags="TagA")
        w.append("T", b"x" * 800, tags="TagA")


@pytest.mark.parametrize("kwargs, match", [
    ({"topic": "T", "queues": 0}, "queues"), ({"topic": "T", "queues": 1, "perm": 16}, "perm"),
    ({"topic": "T", "queues": 1, "order": 1}, "order"), ({"topic": "a b", "queues": 1}, "topic"),
    ({"topic": "T", "queues": 2, "read_queues": 0}, "read_queues"),
])
def test_create_topic_rejects(store, kwargs, match):
    with pytest.raises(RmqOptionError, match=match):
        store.create_topic(**kwargs)


def test_topics_json_and_checkpoint(tmp_path):
    root = tmp_path / "s"
    with StoreWriter(root, commitlog_file_size=CL, broker_name="broker-x") as w:
        w.create_topic("T", 4)
        w.create_topic("O", 2, order=True, perm=4, read_queues=3)
        r = w.append("T", b"", store_timestamp=1_700_000_000_000)
        assert (root / "abort").exists()
    topics = read_topics(root)
    assert topics["T"] == {"order": False, "perm": 6, "readQueueNums": 4,
                           "topicFilterType": "SINGLE_TAG", "topicName": "T", "topicSysFlag": 0,
                           "writeQueueNums": 4}
    assert (topics["O"]["readQueueNums"], topics["O"]["writeQueueNums"]) == (3, 2)
    assert topics["O"]["order"] is True and topics["O"]["perm"] == 4
    assert topics["broker-x"]["perm"] == 7
    text = (root / "config" / "topics.json").read_text()
    assert text.startswith('{\n\t"dataVersion":{') and '"counter":' in text
    cp = (root / "checkpoint").read_bytes()
    assert len(cp) == 4096
    assert struct.unpack_from(">qqq", cp) == (1_700_000_000_000, 1_700_000_000_000, 0)
    assert not (root / "abort").exists()
    assert (root / "lock").read_bytes() == b"lock"
    assert r.queue_offset == 0


def test_second_writer_is_refused(tmp_path):
    root = tmp_path / "s"
    with StoreWriter(root, commitlog_file_size=CL):
        with pytest.raises(RmqSourceError, match="already open"):
            StoreWriter(root)
        probe = ("import sys\nfrom rmq_source.store.writer import StoreWriter\n"
                 "try:\n    StoreWriter(sys.argv[1])\nexcept Exception as e:\n"
                 "    print(type(e).__name__, e)\n")
        out = subprocess.run([sys.executable, "-c", probe, str(root)], capture_output=True,
                             text=True, timeout=60)
        assert "locked by another process" in out.stdout, out.stderr
    StoreWriter(root).close()


def test_closed_writer_refuses_appends(tmp_path):
    w = StoreWriter(tmp_path / "s", commitlog_file_size=CL)
    w.create_topic("T", 1)
    w.close()
    w.close()
    with pytest.raises(RmqOptionError, match="closed"):
        w.append("T", b"")


def test_retention_deletes_oldest_commitlog_then_obsolete_cq_files(tmp_path):
    root = tmp_path / "s"
    with StoreWriter(root, commitlog_file_size=CL, cq_units_per_file=4) as w:
        w.create_topic("T", 2)
        w.create_topic("Rare", 1)
        w.append("Rare", b"early", tags="TagA")
        results = [w.append("T", b"y" * 300, tags="TagA") for _ in range(60)]
        files_before = commitlog_files(root)
        deleted = w.delete_oldest_commitlog_files(3)
        assert deleted[:3] == files_before[:3]
        new_min = 3 * CL
        assert commitlog_files(root)[0].name == f"{new_min:020d}"
        for qid in range(2):
            qfiles = sorted((root / "consumequeue" / "T" / str(qid)).iterdir())
            first = qfiles[0].read_bytes()
            last_phy = struct.unpack_from(">q", first, len(first) - 20)[0]
            assert last_phy >= new_min or len(qfiles) == 1
            gone = [p for p in deleted if p.parent.name == str(qid) and p.parent.parent.name == "T"]
            for p in gone:
                assert int(p.name) < int(qfiles[0].name)
        assert len(list((root / "consumequeue" / "Rare" / "0").iterdir())) == 1   # last kept
        # deleting more than exists never touches the active file
        w.delete_oldest_commitlog_files(100)
        active = results[-1].commitlog_offset - results[-1].commitlog_offset % CL
        assert commitlog_files(root)[0].name == f"{active:020d}"
        w.append("T", b"still writable")


@pytest.mark.parametrize("call", ["append", "append_batch"])
def test_read_only_topic_refuses_appends(store, call):
    store.create_topic("RO", 2, perm=4)
    with pytest.raises(RmqOptionError, match="not writable"):
        if call == "append":
            store.append("RO", b"", tags="TagA")
        else:
            store.append_batch("RO", [b""])


def test_append_batch_members(store):
    results = store.append_batch("T", [b"a", b"", b"ccc" * 50], queue_id=1, tags="TagB",
                                 keys=["k"], properties={"p": "v"}, store_timestamp=1_800_000_000_000)
    assert [r.queue_id for r in results] == [1, 1, 1]
    assert [r.queue_offset for r in results] == [0, 1, 2]
    data = (store.root / "commitlog" / f"{0:020d}").read_bytes()
    records = [rc.decode_record(data, r.commitlog_offset) for r in results]
    assert [rec.body for rec in records] == [b"a", b"", b"ccc" * 50]
    assert {rec.store_timestamp for rec in records} == {1_800_000_000_000}
    assert len({rec.properties["UNIQ_KEY"] for rec in records}) == 3
    for r, rec in zip(results, records):
        assert rec.properties_raw.startswith(b"TAGS\x01TagB\x02KEYS\x01k\x02UNIQ_KEY\x01")
        assert rec.properties_raw.endswith(b"\x02WAIT\x01true\x02p\x01v")
        assert cq_unit(store.root, "T", 1, r.queue_offset) == (r.commitlog_offset, r.size,
                                                              java_string_hash("TagB"))
    assert results[1].commitlog_offset == results[0].commitlog_offset + results[0].size
    assert store.append_batch("T", []) == []
    assert store.append("T", b"after", queue_id=1).queue_offset == 3


def test_append_batch_is_placed_as_a_whole(store):
    store.append("T", b"x" * 3000, queue_id=0)                 # leaves ~1000 bytes in file 0
    results = store.append_batch("T", [b"y" * 300] * 4, queue_id=0)
    assert all(r.commitlog_offset // CL == 1 for r in results)  # moved together to file 1
    data = (store.root / "commitlog" / f"{0:020d}").read_bytes()
    first = rc.decode_record(data, 0)
    assert struct.unpack_from(">ii", data, first.total_size) == (CL - first.total_size,
                                                                rc.BLANK_MAGIC)


def test_append_batch_bytes_match_single_appends(tmp_path, monkeypatch):
    monkeypatch.setattr(writer_module, "_time_ns", lambda: 1_700_000_000_123_000_000)
    records = []
    for n, batch in enumerate((False, True)):
        with StoreWriter(tmp_path / f"s{n}", commitlog_file_size=CL) as w:
            w.create_topic("T", 2)
            bodies = [b"one", b"two"]
            if batch:
                rs = w.append_batch("T", bodies, queue_id=1, tags="TagA", properties={"p": "1"})
            else:
                rs = [w.append("T", b, queue_id=1, tags="TagA", properties={"p": "1"})
                      for b in bodies]
            data = (w.root / "commitlog" / f"{0:020d}").read_bytes()
            for r in rs:
                rec = bytearray(data[r.commitlog_offset:r.commitlog_offset + r.size])
                i = rec.index(b"UNIQ_KEY\x01") + 9 + 28
                rec[i:i + 4] = b"____"                          # per-process counter differs
                records.append(bytes(rec))
    assert records[:2] == records[2:]


@pytest.mark.parametrize("kwargs, match", [
    ({"bodies": [b"x" * 3000, b"y" * 3000]}, "cannot fit"),
    ({"bodies": [b"x"], "properties": {"UNIQ_KEY": "u"}}, "UNIQ_KEY"),
    ({"bodies": [b"x", "text"]}, "bytes"),
    ({"bodies": 5}, "iterable"),
    ({"bodies": [b"x"], "queue_id": 9}, "queue_id"),
    ({"bodies": [b"x"], "tags": ""}, "tags"),
    ({"bodies": [b"x"], "store_timestamp": -1}, "store_timestamp"),
])
def test_append_batch_rejects(store, kwargs, match):
    before = store.commitlog_end
    with pytest.raises(RmqOptionError, match=match):
        store.append_batch("T", **kwargs)
    assert store.commitlog_end == before


def test_unknown_append_option_is_an_option_error(store):
    with pytest.raises(RmqOptionError, match="unknown option.*'colour'"):
        store.append("T", b"", colour="red")


def test_append_signature_lists_every_option():
    import inspect
    params = inspect.signature(StoreWriter.append).parameters
    assert {"queue_id", "tags", "keys", "properties", "compression", "born_host", "uniq_key",
            "sys_flag_extra", "selector"} <= set(params)
    assert writer_module._APPEND_OPTIONS == set(params) - {"self", "topic", "body", "queue_id", "tags"}
