"""The C core on crafted stores: field decoding corners, scan statuses, argument checks.

Stores are written byte by byte by ``test_native_craft`` (checked there against the spec's worked
example), so each case controls exactly the bytes the C decoder sees.
"""
from __future__ import annotations

import struct
import zlib

import pyarrow as pa
import pytest

from rmq_source.store import native
from rmq_source.errors import (RmqCorruptStoreError, RmqOptionError, RmqStoreIOError,
                               RmqStoreLayoutError)

from test_native_craft import CQ_UNIT, CraftStore, Rec, host, java_hash, open_store

CL_SIZE = 8192
CQ_SIZE = 10 * CQ_UNIT


def _one(tmp_path, rec: Rec, **scan_kw) -> dict:
    store = CraftStore(tmp_path, CL_SIZE, CQ_SIZE)
    store.add(rec)
    store.write()
    topic = rec.topic if isinstance(rec.topic, str) else rec.topic.decode()
    cl, cq = open_store(tmp_path, CL_SIZE, topic, rec.queue_id)
    res = native.scan_queue(cl, cq, CQ_SIZE, 0, 1, **scan_kw)
    res.batch.validate(full=True)
    assert res.batch.num_rows == 1 and res.status == "END"
    return res.batch.to_pylist()[0]


# -- hosts and message ids -----------------------------------------------------------------------

@pytest.mark.parametrize("born,store,born_text,store_text,msgid_prefix", [
    (("10.0.0.5", 53210), ("10.0.0.1", 10911), "10.0.0.5:53210", "10.0.0.1:10911",
     "0A00000100002A9F"),
    (("::1", 40000), ("2001:db8::a:0:1", 10911), "0:0:0:0:0:0:0:1:40000",
     "2001:db8:0:0:0:a:0:1:10911", "20010DB8000000000000000A0000000100002A9F"),
    (("fe80::1234:abcd", 1), ("10.1.2.3", 65535), "fe80:0:0:0:0:0:1234:abcd:1",
     "10.1.2.3:65535", "0A0102030000FFFF"),
    # an IPv4-mapped IPv6 address becomes an Inet4Address in Java: printed dotted
    (("::ffff:192.0.2.7", 5), ("::ffff:192.0.2.100", 10911), "192.0.2.7:5", "192.0.2.100:10911",
     "00000000000000000000FFFFC000026400002A9F"),
])
def test_hosts_and_msgid(tmp_path, born, store, born_text, store_text, msgid_prefix):
    rec = Rec(born_host=host(*born), store_host=host(*store), body=b"x")
    row = _one(tmp_path, rec)
    assert row["bornHost"] == born_text
    assert row["storeHost"] == store_text
    flags = (0x10 if ":" in born[0] else 0) | (0x20 if ":" in store[0] else 0)
    assert row["sysFlag"] == flags
    assert row["msgId"] == msgid_prefix + f"{row['commitLogOffset']:016X}"
    assert len(row["msgId"]) == (56 if ":" in store[0] else 32)


def test_v2_magic_long_topic_and_all_fixed_fields(tmp_path):
    topic = "LongTopic_" + "x" * 190
    rec = Rec(topic=topic, v2=True, queue_id=3, flag=-7, sysflag=0x0C | 0x40 | 0x80,
              born_ts=-5, store_ts=1_795_292_459_073, reconsume=16, prepared=123456789012,
              body=b"\x00\xff" * 10, props={"TAGS": "t", "UNIQ_KEY": "U1", "KEYS": "a b"})
    row = _one(tmp_path, rec)
    assert row["queueId"] == 3 and row["flag"] == -7
    assert row["sysFlag"] == 0x0C | 0x40 | 0x80
    assert row["reconsumeTimes"] == 16 and row["preparedTransactionOffset"] == 123456789012
    assert row["storeSize"] == len(rec.encode())
    assert row["body"] == b"\x00\xff" * 10
    assert row["bodyCRC"] == zlib.crc32(b"\x00\xff" * 10) & 0x7FFFFFFF
    assert (row["tags"], row["uniqKey"], row["keys"]) == ("t", "U1", ["a", "b"])


def test_timestamps_are_microseconds(tmp_path):
    store = CraftStore(tmp_path, CL_SIZE, CQ_SIZE)
    store.add(Rec(born_ts=1_700_000_000_001, store_ts=-1))
    store.write()
    cl, cq = open_store(tmp_path, CL_SIZE)
    batch = native.scan_queue(cl, cq, CQ_SIZE, 0, 1).batch
    assert batch.column("bornTimestamp").cast(pa.int64()).to_pylist() == [1_700_000_000_001_000]
    assert batch.column("storeTimestamp").cast(pa.int64()).to_pylist() == [-1000]
    assert batch.schema.field("bornTimestamp").type == pa.timestamp("us", tz="UTC")


def test_compressed_body_is_returned_as_stored(tmp_path):
    body = zlib.compress(b"hello " * 1000)
    row = _one(tmp_path, Rec(sysflag=0x1 | 0x300, body=body))
    assert row["body"] == body and row["sysFlag"] == 0x301
    assert row["bodyCRC"] == zlib.crc32(body) & 0x7FFFFFFF


# -- properties and derived columns -----------------------------------------------------------

@pytest.mark.parametrize("raw,props,tags,keys,uniq", [
    (b"", [], None, None, None),
    (b"TAGS\x01A\x02WAIT\x01true", [("TAGS", "A"), ("WAIT", "true")], "A", None, None),
    (b"TAGS\x01A\x02WAIT\x01true\x02", [("TAGS", "A"), ("WAIT", "true")], "A", None, None),
    # later duplicate wins, key kept once at its first position
    (b"a\x011\x02TAGS\x01X\x02a\x012\x02TAGS\x01Y", [("a", "2"), ("TAGS", "Y")], "Y", None, None),
    # empty value, empty name, no separator, lone separators: dropped
    (b"e\x01\x02\x01v\x02novalue\x02\x02\x02k\x01v", [("k", "v")], None, None, None),
    # a value may contain 0x01
    (b"k\x01a\x01b", [("k", "a\x01b")], None, None, None),
    (b"KEYS\x01  k1  k2 \x02UNIQ_KEY\x01ID", [("KEYS", "  k1  k2 "), ("UNIQ_KEY", "ID")],
     None, ["k1", "k2"], "ID"),
    (b"KEYS\x01   ", [("KEYS", "   ")], None, None, None),
    ("名前\x01値\x02TAGS\x01タグ".encode(), [("名前", "値"), ("TAGS", "タグ")], "タグ", None, None),
])
def test_properties_parsing(tmp_path, raw, props, tags, keys, uniq):
    row = _one(tmp_path, Rec(props=raw))
    assert row["properties"] == props
    assert (row["tags"], row["keys"], row["uniqKey"]) == (tags, keys, uniq)


def test_many_properties_with_duplicates_use_the_hash_path(tmp_path):
    entries = [(f"k{i % 40}", f"v{i}") for i in range(120)]
    raw = "\x02".join(f"{k}\x01{v}" for k, v in entries).encode()
    row = _one(tmp_path, Rec(props=raw))
    expected = {}
    for k, v in entries:
        expected[k] = v
    assert row["properties"] == list(expected.items())


def test_nulls_and_lists_across_buffer_growth(tmp_path):
    """Thousands of rows with mixed null patterns: bitmaps and offsets survive reallocation."""
    store = CraftStore(tmp_path, 1 << 20, 64 * CQ_UNIT)
    expected = []
    for i in range(3000):
        props = {}
        if i % 3 == 0:
            props["TAGS"] = f"t{i % 7}"
        if i % 5 == 0:
            props["KEYS"] = " ".join(f"k{j}" for j in range(i % 4))
        if i % 2 == 0:
            props["UNIQ_KEY"] = f"U{i}"
        store.add(Rec(body=bytes([i % 256]) * (i % 50), props=props or None))
        expected.append((props.get("TAGS"), [w for w in props.get("KEYS", "").split(" ") if w] or None,
                         props.get("UNIQ_KEY"), bytes([i % 256]) * (i % 50)))
    store.write()
    cl, cq = open_store(tmp_path, 1 << 20)
    res = native.scan_queue(cl, cq, 64 * CQ_UNIT, 0, 3000)
    res.batch.validate(full=True)
    assert (res.status, res.next_offset, res.scanned) == ("END", 3000, 3000)
    got = list(zip(res.batch.column("tags").to_pylist(), res.batch.column("keys").to_pylist(),
                   res.batch.column("uniqKey").to_pylist(), res.batch.column("body").to_pylist()))
    assert got == expected
    assert res.batch.column("queueOffset").to_pylist() == list(range(3000))
    body_buf = res.batch.column("body").buffers()[2]
    assert body_buf.address % 64 == 0


def test_batch_outlives_its_segments(tmp_path):
    store = CraftStore(tmp_path, CL_SIZE, CQ_SIZE)
    store.add(Rec(body=b"keep me", props={"TAGS": "a"}))
    store.write()
    cl, cq = open_store(tmp_path, CL_SIZE)
    batch = native.scan_queue(cl, cq, CQ_SIZE, 0, 1).batch
    for seg in cl.segments + cq:
        seg.close()
    del cl, cq
    import gc
    gc.collect()
    assert batch.column("body").to_pylist() == [b"keep me"]
    assert batch.column("properties").to_pylist() == [[("TAGS", "a")]]


# -- filtering and statuses ------------------------------------------------------------------------

def _tagged_store(tmp_path, tags: list[str | None], cl_size=1 << 16, cq_size=CQ_SIZE):
    store = CraftStore(tmp_path, cl_size, cq_size)
    for i, t in enumerate(tags):
        store.add(Rec(body=b"b%d" % i, props={"TAGS": t} if t else None))
    store.write()
    return open_store(tmp_path, cl_size)


def test_tag_filter_hash_and_exact(tmp_path):
    tags = ["Aa", "BB", None, "TagA", "Aa", "TagB", "BB"] * 3
    cl, cq = _tagged_store(tmp_path, tags)
    n = len(tags)
    res = native.scan_queue(cl, cq, CQ_SIZE, 0, n, codes=(java_hash("Aa"),))
    assert res.batch.column("queueOffset").to_pylist() == [i for i, t in enumerate(tags) if t in ("Aa", "BB")]
    res = native.scan_queue(cl, cq, CQ_SIZE, 0, n, codes=(java_hash("Aa"),), tags=("Aa",))
    assert res.batch.column("queueOffset").to_pylist() == [i for i, t in enumerate(tags) if t == "Aa"]
    assert (res.status, res.next_offset, res.scanned) == ("END", n, n)
    res = native.scan_queue(cl, cq, CQ_SIZE, 0, n, codes=(), tags=())
    assert res.batch.num_rows == 0 and res.status == "END"
    # many codes: the C side switches to binary search
    codes = tuple(c for c in range(-50, 50) if c) + (java_hash("TagB"),)  # 0 = untagged
    res = native.scan_queue(cl, cq, CQ_SIZE, 0, n, codes=codes)
    assert res.batch.column("tags").to_pylist() == ["TagB"] * 3


def test_filtered_units_never_touch_the_commitlog(tmp_path):
    """Units rejected by hash may point anywhere (even outside the CommitLog): no error."""
    store = CraftStore(tmp_path, CL_SIZE, CQ_SIZE)
    store.add(Rec(props={"TAGS": "keep"}))
    store.add_unit("T", 0, 10**12, 500, java_hash("skip"))
    store.add(Rec(props={"TAGS": "keep"}))
    store.write()
    cl, cq = open_store(tmp_path, CL_SIZE)
    res = native.scan_queue(cl, cq, CQ_SIZE, 0, 3, codes=(java_hash("keep"),))
    assert res.batch.column("queueOffset").to_pylist() == [0, 2]
    with pytest.raises(RmqCorruptStoreError) as exc:
        native.scan_queue(cl, cq, CQ_SIZE, 0, 3)
    assert exc.value.code == "UNIT_OUT_OF_RANGE"


@pytest.mark.parametrize("max_rows,max_bytes,rows,next_offset", [
    (3, 64 << 20, 3, 3),
    (1, 64 << 20, 1, 1),
    (100, 1, 1, 1),            # at least one row even if it alone exceeds max_bytes
    (100, 2 * 1300, 2, 2),     # each row counts ~1000 body + properties + strings
])
def test_full_status(tmp_path, max_rows, max_bytes, rows, next_offset):
    store = CraftStore(tmp_path, 1 << 16, CQ_SIZE)
    for _ in range(8):
        store.add(Rec(body=bytes(1000), props={"TAGS": "x"}))
    store.write()
    cl, cq = open_store(tmp_path, 1 << 16)
    res = native.scan_queue(cl, cq, CQ_SIZE, 0, 8, max_rows=max_rows, max_bytes=max_bytes)
    assert (res.batch.num_rows, res.status, res.next_offset) == (rows, "FULL", next_offset)


def test_full_status_skips_rejected_units_first(tmp_path):
    cl, cq = _tagged_store(tmp_path, ["a", "b", "b", "a", "b"])
    res = native.scan_queue(cl, cq, CQ_SIZE, 0, 5, codes=(java_hash("a"),), max_rows=1)
    # offset 0 accepted; 1, 2 examined and rejected; 3 would be the second row
    assert (res.batch.column("queueOffset").to_pylist(), res.status, res.next_offset, res.scanned) == \
        ([0], "FULL", 3, 3)


def test_cq_end_at_unwritten_unit_and_past_last_file(tmp_path):
    cl, cq = _tagged_store(tmp_path, ["a"] * 4)          # one CQ file of 10 units, 4 written
    res = native.scan_queue(cl, cq, CQ_SIZE, 0, 100)
    assert (res.batch.num_rows, res.status, res.next_offset) == (4, "CQ_END", 4)
    res = native.scan_queue(cl, cq, CQ_SIZE, 30, 40)     # no CQ file there yet
    assert (res.batch.num_rows, res.status, res.next_offset) == (0, "CQ_END", 30)
    res = native.scan_queue(cl, cq, CQ_SIZE, 2, 2)
    assert (res.batch.num_rows, res.status, res.next_offset, res.scanned) == (0, "END", 2, 0)
    res = native.scan_queue(cl, [], CQ_SIZE, 0, 5)       # queue folder without files yet
    assert (res.batch.num_rows, res.status, res.next_offset) == (0, "CQ_END", 0)
    assert res.batch.schema == native.NATIVE_SCHEMA


PRE_BLANK = (0, 0x7FFFFFFF, 0)


def test_pre_blank_units_are_skipped(tmp_path):
    store = CraftStore(tmp_path, CL_SIZE, CQ_SIZE)
    for _ in range(3):
        store.add_unit("T", 0, *PRE_BLANK)
    store.add(Rec(body=b"first", store_ts=500))
    store.write()
    cl, cq = open_store(tmp_path, CL_SIZE)
    for start in (0, 1):
        res = native.scan_queue(cl, cq, CQ_SIZE, start, 4)
        assert res.batch.column("queueOffset").to_pylist() == [3]
    # a filtered scan that would accept them (tag code 0) skips them too
    res = native.scan_queue(cl, cq, CQ_SIZE, 0, 4, codes=(0, java_hash("x")))
    assert res.batch.column("queueOffset").to_pylist() == [3]
    assert native.cq_first_unit_at_or_above(cq[0], 0) == 3
    assert native.cq_valid_units(cq[0]) == 4
    assert native.lookup_time(cl, cq, CQ_SIZE, 0, 4, 500) == 3        # fillers count as older


@pytest.mark.parametrize("scan_kw", [{}, {"codes": (java_hash("a"),)}, {"codes": (0,)},
                                     {"codes": tuple(range(1, 10))}],
                         ids=["all", "filtered", "filtered-code-0", "filtered-many-codes"])
@pytest.mark.parametrize("where", ["after units", "head of a later file", "after leading ones"])
def test_pre_blank_unit_after_written_units_is_damage(tmp_path, scan_kw, where):
    """The broker writes pre-blank units only at the head of a queue's first ConsumeQueue file
    (format doc §7.4); anywhere else one hides a message, so it is reported, never skipped."""
    store = CraftStore(tmp_path, CL_SIZE, CQ_SIZE)
    if where == "after leading ones":
        store.add_unit("T", 0, *PRE_BLANK)
    for _ in range(10 if where == "head of a later file" else 3):
        store.add(Rec(props={"TAGS": "a"}, store_ts=100))
    bad = store.add_unit("T", 0, *PRE_BLANK)
    store.add(Rec(props={"TAGS": "a"}, store_ts=200))
    store.write()
    cl, cq = open_store(tmp_path, CL_SIZE)
    with pytest.raises(RmqCorruptStoreError) as exc:
        native.scan_queue(cl, cq, CQ_SIZE, 0, bad + 2, **scan_kw)
    path, pos = cq[bad * CQ_UNIT // CQ_SIZE].path, bad * CQ_UNIT % CQ_SIZE
    assert (exc.value.code, exc.value.path, exc.value.position) == ("BAD_UNIT", path, pos)
    assert f"file {path}, position {pos}" in str(exc.value)
    assert f"queue offset {bad}" in str(exc.value)
    # also when the scan starts at it, and when a time lookup lands on it
    with pytest.raises(RmqCorruptStoreError, match="BAD_UNIT"):
        native.scan_queue(cl, cq, CQ_SIZE, bad, bad + 2, **scan_kw)
    with pytest.raises(RmqCorruptStoreError, match="BAD_UNIT"):
        native.lookup_time(cl, cq, CQ_SIZE, bad, bad + 1, 150)
    # the units before it are read up to it
    res = native.scan_queue(cl, cq, CQ_SIZE, 0, bad, **scan_kw)
    assert res.next_offset == bad


def _queue_store(tmp_path):
    """T/0: two messages; T/1: two messages; U/0: two messages (same queue offsets as T/0)."""
    store = CraftStore(tmp_path, CL_SIZE, CQ_SIZE)
    placed = {}
    for topic, qid in (("T", 0), ("T", 1), ("U", 0), ("T", 0), ("T", 1), ("U", 0)):
        rec = Rec(topic=topic, queue_id=qid, body=f"{topic}{qid}".encode(), props={"TAGS": "a"})
        phy, off = store.add(rec)
        placed[(topic, qid, off)] = (phy, len(rec.encode()))
    return store, placed


@pytest.mark.parametrize("source", [("T", 1, 1), ("U", 0, 1), ("T", 0, 0)],
                         ids=["other-queue", "other-topic", "other-offset"])
def test_unit_pointing_at_another_message_is_a_mismatch(tmp_path, source):
    store, placed = _queue_store(tmp_path)
    phy, size = placed[source]
    store.add_unit("T", 0, phy, size, java_hash("a"))     # T/0 offset 2 -> someone else's record
    store.write()
    cl, cq = open_store(tmp_path, CL_SIZE)
    # told which queue it reads, the scan checks TOPIC, QUEUEID and QUEUEOFFSET
    for kw in ({}, {"codes": (java_hash("a"),), "tags": ("a",)}):
        with pytest.raises(RmqCorruptStoreError) as exc:
            native.scan_queue(cl, cq, CQ_SIZE, 0, 3, topic="T", queue_id=0, **kw)
        err = exc.value
        assert (err.code, err.path, err.position) == ("UNIT_MISMATCH", cl.segments[0].path, phy)
        assert f"file {cl.segments[0].path}, position {phy}" in str(err)
        assert "queue offset 2" in str(err) and cq[0].path in str(err)
        res = native.scan_queue(cl, cq, CQ_SIZE, 0, 2, topic="T", queue_id=0, **kw)
        assert res.batch.column("queueOffset").to_pylist() == [0, 1]
    # without them only PHYSICALOFFSET can be checked, and it is right
    res = native.scan_queue(cl, cq, CQ_SIZE, 0, 3)
    assert res.batch.column("commitLogOffset").to_pylist()[2] == phy


def test_record_whose_physical_offset_is_not_its_position(tmp_path):
    store = CraftStore(tmp_path, CL_SIZE, CQ_SIZE)
    store.add(Rec(body=b"first", store_ts=100))
    phy, _ = store.add(Rec(body=b"second", store_ts=200))
    store.cl[phy + 28:phy + 36] = struct.pack(">q", phy + 4096)       # PHYSICALOFFSET field
    store.write()
    cl, cq = open_store(tmp_path, CL_SIZE)
    for kw in ({}, {"topic": "T", "queue_id": 0}):
        with pytest.raises(RmqCorruptStoreError) as exc:
            native.scan_queue(cl, cq, CQ_SIZE, 0, 2, **kw)
        assert (exc.value.code, exc.value.position) == ("UNIT_MISMATCH", phy)
        assert "queue offset 1" in str(exc.value)
    with pytest.raises(RmqCorruptStoreError, match="UNIT_MISMATCH"):
        cl.store_timestamp(phy, len(store.cl) - phy)
    with pytest.raises(RmqCorruptStoreError, match="UNIT_MISMATCH"):
        native.lookup_time(cl, cq, CQ_SIZE, 0, 2, 150)


@pytest.mark.parametrize("props,ok", [
    ({"INNER_MULTI_DISPATCH": "%LMQ%L", "INNER_MULTI_QUEUE_OFFSET": "0"}, True),
    ({"INNER_MULTI_DISPATCH": "%LMQ%M,%LMQ%L", "INNER_MULTI_QUEUE_OFFSET": "9,0"}, True),
    ({"INNER_MULTI_DISPATCH": "%LMQ%L,%LMQ%M", "INNER_MULTI_QUEUE_OFFSET": "00,9"}, True),
    ({"INNER_MULTI_DISPATCH": "%LMQ%L,%LMQ%M", "INNER_MULTI_QUEUE_OFFSET": "9,0"}, False),
    ({"INNER_MULTI_DISPATCH": "%LMQ%M,%LMQ%L", "INNER_MULTI_QUEUE_OFFSET": "0"}, False),
    ({"INNER_MULTI_DISPATCH": "%LMQ%Lx", "INNER_MULTI_QUEUE_OFFSET": "0"}, False),
    ({"INNER_MULTI_DISPATCH": "%LMQ%L", "INNER_MULTI_QUEUE_OFFSET": "+0"}, False),
    ({"INNER_MULTI_DISPATCH": "%LMQ%L"}, False),
    ({}, False),
])
def test_light_message_queue_units_point_at_the_parent_record(tmp_path, props, ok):
    """An LMQ (or other multi-dispatch) unit points at a record of the parent topic (format doc
    §14 item 18): accepted when the record's INNER_MULTI_DISPATCH lists the queue with this
    queue offset at the same index of INNER_MULTI_QUEUE_OFFSET."""
    store = CraftStore(tmp_path, CL_SIZE, CQ_SIZE)
    rec = Rec(topic="Parent", queue_id=3, body=b"lmq", props={"TAGS": "a", **props})
    phy, _ = store.add(rec)
    store.add_unit("%LMQ%L", 0, phy, len(rec.encode()), java_hash("a"))
    store.write()
    cl, cq = open_store(tmp_path, CL_SIZE, "%LMQ%L", 0)
    if ok:
        res = native.scan_queue(cl, cq, CQ_SIZE, 0, 1, topic="%LMQ%L", queue_id=0)
        assert res.batch.column("queueOffset").to_pylist() == [0]
        assert res.batch.column("queueId").to_pylist() == [3]           # the record's own
    else:
        with pytest.raises(RmqCorruptStoreError, match="UNIT_MISMATCH"):
            native.scan_queue(cl, cq, CQ_SIZE, 0, 1, topic="%LMQ%L", queue_id=0)
    # filed under another queue id than the record's (nor 0): never the unit's message
    with pytest.raises(RmqCorruptStoreError, match="UNIT_MISMATCH"):
        native.scan_queue(cl, cq, CQ_SIZE, 0, 1, topic="%LMQ%L", queue_id=1)


def test_cl_gone_when_commitlog_file_deleted(tmp_path):
    store = CraftStore(tmp_path, 1024, CQ_SIZE)
    for i in range(6):
        store.add(Rec(body=bytes(300), props={"TAGS": "a" if i != 1 else "b"}))
    store.write()
    (tmp_path / "commitlog" / f"{0:020d}").unlink()      # retention removed the first file
    cl, cq = open_store(tmp_path, 1024)
    assert cl.min_offset == 1024
    res = native.scan_queue(cl, cq, CQ_SIZE, 0, 6)
    assert (res.batch.num_rows, res.status, res.next_offset) == (0, "CL_GONE", 0)
    first_alive = native.cq_first_unit_at_or_above(cq[0], cl.min_offset)
    assert first_alive == 2
    res = native.scan_queue(cl, cq, CQ_SIZE, first_alive, 6)
    assert (res.batch.num_rows, res.status) == (4, "END")
    # a rejected unit below the min is passed over; an accepted one stops the scan
    res = native.scan_queue(cl, cq, CQ_SIZE, 0, 6, codes=(java_hash("b"),))
    assert (res.batch.num_rows, res.status, res.next_offset) == (0, "CL_GONE", 1)
    res = native.scan_queue(cl, cq, CQ_SIZE, 1, 6, codes=(java_hash("a"),))
    assert (res.batch.column("queueOffset").to_pylist(), res.status) == ([2, 3, 4, 5], "END")
    # lookup_time treats gone units as older
    assert native.lookup_time(cl, cq, CQ_SIZE, 0, 6, 0) == 2


def test_lookup_time_bounds(tmp_path):
    store = CraftStore(tmp_path, 1 << 16, CQ_SIZE)
    times = [100, 100, 200, 300, 300, 300, 400, 500, 500, 600, 700, 800]
    for t in times:
        store.add(Rec(store_ts=t))
    store.write()
    cl, cq = open_store(tmp_path, 1 << 16)
    n = len(times)
    for ts in [0, 99, 100, 101, 300, 301, 500, 800, 801, 10**15, -(1 << 63)]:
        expected = next((i for i, t in enumerate(times) if t >= ts), n)
        assert native.lookup_time(cl, cq, CQ_SIZE, 0, n, ts) == expected, ts
    assert native.lookup_time(cl, cq, CQ_SIZE, 4, 4, 0) == 4
    assert native.lookup_time(cl, cq, CQ_SIZE, 5, 9, 0) == 5
    assert native.lookup_time(cl, cq, CQ_SIZE, 5, 9, 10**9) == 9
    with pytest.raises(RmqCorruptStoreError) as exc:     # unit 12 is not written
        native.lookup_time(cl, cq, CQ_SIZE, 0, n + 1, 10**9)
    assert exc.value.code == "BAD_UNIT"


# -- CommitLog end ----------------------------------------------------------------------------

def _cl_only(tmp_path, bodies: list[int], file_size=1024, zero_file=False):
    """CommitLog-only store; returns the (phy, size) of each record."""
    store = CraftStore(tmp_path, file_size, CQ_SIZE)
    placed = [(store.add(Rec(body=bytes(b)))[0], 92 + b) for b in bodies]
    store.write(extra_zero_cl_file=zero_file)
    return store, placed


@pytest.mark.parametrize("bodies,zero_file", [
    ([], False),
    ([100], False),
    ([100, 900], False),            # the second record does not fit: BLANK, next file
    ([100, 900], True),             # preallocated all-zero trailing file
    ([800, 800, 800, 800], True),   # one record per file: the walk starts 3 files from the end
])
def test_valid_end(tmp_path, bodies, zero_file):
    _, placed = _cl_only(tmp_path, bodies, zero_file=zero_file)
    cl, _ = open_store(tmp_path, 1024)
    expected = placed[-1][0] + placed[-1][1] if placed else 0
    assert cl.valid_end() == expected
    if len(bodies) > 1:
        assert placed[-1][0] % 1024 == 0


def test_valid_end_stops_at_blank_in_last_file_and_at_damage(tmp_path):
    store, placed = _cl_only(tmp_path, [100, 900])
    assert placed == [(0, 192), (1024, 992)]
    cl_dir = tmp_path / "commitlog"
    (cl_dir / f"{1024:020d}").unlink()                 # last file now ends with a BLANK
    cl, _ = open_store(tmp_path, 1024)
    assert cl.valid_end() == 192
    store.write()
    data = bytearray((cl_dir / f"{1024:020d}").read_bytes())
    data[100] ^= 0xFF                                  # body byte: only a CRC check notices
    (cl_dir / f"{1024:020d}").write_bytes(data)
    cl, _ = open_store(tmp_path, 1024)
    assert cl.valid_end() == 1024 + 992
    assert cl.valid_end(verify_crc=True) == 1024
    assert native.CommitLog([], 1024).valid_end() == 0


def test_store_timestamp(tmp_path):
    store = CraftStore(tmp_path, CL_SIZE, CQ_SIZE)
    phy, _ = store.add(Rec(store_ts=424242, born_host=host("::1", 1), store_host=host("::2", 2)))
    store.write()
    cl, _ = open_store(tmp_path, CL_SIZE)
    size = len(Rec(born_host=host("::1", 1), store_host=host("::2", 2)).encode())
    assert cl.store_timestamp(phy, size) == 424242
    with pytest.raises(RmqCorruptStoreError) as exc:
        cl.store_timestamp(phy, size + 1)
    assert exc.value.code == "SIZE_MISMATCH"


# -- files and arguments ------------------------------------------------------------------------

_needs_shared_mapping = pytest.mark.skipif(
    not native.SEGMENTS_FOLLOW_WRITES,
    reason="this C core build reads files into heap copies (sanitizer build), not shared mappings")

def test_map_segment_files(tmp_path):
    with pytest.raises(RmqStoreLayoutError):
        native.map_segment(tmp_path / "nope", 0)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    seg = native.map_segment(empty, 0)
    assert seg.size == 0 and native.cq_valid_units(seg) == 0
    with pytest.raises(RmqStoreIOError) as exc:             # a directory: exists, not a file
        native.map_segment(tmp_path, 0)
    assert isinstance(exc.value, OSError) and str(tmp_path) in str(exc.value)
    seg.close()
    assert seg.closed
    with pytest.raises(RmqOptionError):
        native.cq_valid_units(seg)



@_needs_shared_mapping
def test_valid_unit_count_follows_a_live_file_on_the_same_mapping(tmp_path):
    """cq_valid_units resumes from its last count on a mapping: units written since are counted,
    and a tail cut back (zeroed, as recovery does) is counted anew."""
    path = tmp_path / "00000000000000000000"
    units = [struct.pack(">qiq", 100 * i, 100, 0) for i in range(10)]
    path.write_bytes(b"".join(units[:4]) + bytes(20 * 6))
    seg = native.map_segment(path, 0)

    def put(first, data):
        with open(path, "r+b") as f:
            f.seek(20 * first)
            f.write(data)

    steps = [(None, 4), ((4, b"".join(units[4:7])), 7), ((2, bytes(20 * 5)), 2),
             ((2, b"".join(units[2:10])), 10), ((9, bytes(20)), 9)]
    for change, expected in steps:
        if change is not None:
            put(*change)
        assert native.cq_valid_units(seg) == expected, change
    seg.close()


@_needs_shared_mapping
def test_first_unit_at_or_above_resumes_only_where_a_scan_from_the_start_would(tmp_path):
    """cq_first_unit_at_or_above on one mapping, with the CommitLog min going up (retention), down
    (another listing) and the file changing under it, always answers what a scan from unit 0
    answers."""
    path = tmp_path / "00000000000000000000"
    preblank = struct.pack(">qiq", 0, 0x7FFFFFFF, 0)
    units = [preblank] * 2 + [struct.pack(">qiq", 1000 + 100 * i, 100, 0) for i in range(8)]
    path.write_bytes(b"".join(units) + bytes(20 * 2))
    seg = native.map_segment(path, 0)

    def expected(phy_min):
        data = path.read_bytes()
        for i in range(len(data) // 20):
            phy, size, tags = struct.unpack_from(">qiq", data, 20 * i)
            if phy < 0 or size <= 0:
                return i
            if not (phy == 0 and size == 0x7FFFFFFF and tags == 0) and phy >= phy_min:
                return i
        return len(data) // 20

    def put(first, data):
        with open(path, "r+b") as f:
            f.seek(20 * first)
            f.write(data)

    steps = [(None, 0), (None, 1300), (None, 1500), (None, 1200), (None, 5000),
             ((10, struct.pack(">qiq", 1800, 100, 0)), 5000), ((3, bytes(20 * 9)), 5000),
             (None, 1000), ((3, struct.pack(">qiq", 9000, 100, 0)), 1100)]
    for change, phy_min in steps:
        if change is not None:
            put(*change)
        assert native.cq_first_unit_at_or_above(seg, phy_min) == expected(phy_min), (change,
                                                                                      phy_min)
    seg.close()

def test_missing_consumequeue_file_is_a_layout_error(tmp_path):
    store = CraftStore(tmp_path, 1 << 16, CQ_SIZE)
    for _ in range(35):
        store.add(Rec())
    store.write()
    cl, cq = open_store(tmp_path, 1 << 16)
    assert len(cq) == 4
    with pytest.raises(RmqStoreLayoutError, match="missing"):
        native.scan_queue(cl, [cq[0], cq[2]], CQ_SIZE, 0, 35)
    with pytest.raises(RmqStoreLayoutError, match="missing"):
        native.scan_queue(cl, cq[1:], CQ_SIZE, 5, 35)    # offset 5 lives in the deleted file
    res = native.scan_queue(cl, cq[1:], CQ_SIZE, 10, 35, max_rows=7)
    assert res.batch.column("queueOffset").to_pylist() == list(range(10, 17))


@pytest.mark.parametrize("kwargs,error", [
    ({"start": -1}, RmqOptionError),
    ({"start": 5, "end": 4}, RmqOptionError),
    ({"start": 1.0}, RmqOptionError),
    ({"end": True}, RmqOptionError),
    ({"end": 1 << 62}, RmqOptionError),
    ({"max_rows": 0}, RmqOptionError),
    ({"max_bytes": 0}, RmqOptionError),
    ({"max_bytes": 1 << 31}, RmqOptionError),
    ({"codes": (1 << 31,)}, RmqOptionError),
    ({"codes": "TagA"}, RmqOptionError),
    ({"tags": ("a",)}, RmqOptionError),                  # tags without codes
    ({"codes": (1,), "tags": "a"}, RmqOptionError),
    ({"codes": (1,), "tags": (b"a",)}, RmqOptionError),
    ({"cq_file_size": 30}, RmqOptionError),
    ({"cq_file_size": 0}, RmqOptionError),
    ({"cq_file_size": 100}, RmqStoreLayoutError),        # files bigger than the file size
    ({"topic": "T"}, RmqOptionError),                     # topic without queue_id
    ({"queue_id": 0}, RmqOptionError),
    ({"topic": "", "queue_id": 0}, RmqOptionError),
    ({"topic": b"T", "queue_id": 0}, RmqOptionError),
    ({"topic": "T", "queue_id": 1 << 31}, RmqOptionError),
    ({"topic": "T", "queue_id": "0"}, RmqOptionError),
])
def test_scan_argument_validation(tmp_path, kwargs, error):
    cl, cq = _tagged_store(tmp_path, ["a"] * 3)
    args = {"start": 0, "end": 3, "cq_file_size": CQ_SIZE} | kwargs
    with pytest.raises(error):
        native.scan_queue(cl, cq, args.pop("cq_file_size"), args.pop("start"), args.pop("end"),
                          **args)


def test_segment_list_validation(tmp_path):
    cl, cq = _tagged_store(tmp_path, ["a"] * 25)
    with pytest.raises(RmqOptionError, match="sorted"):
        native.scan_queue(cl, [cq[1], cq[0]], CQ_SIZE, 0, 1)
    with pytest.raises(RmqOptionError):
        native.scan_queue(cl, cq[0], CQ_SIZE, 0, 1)
    with pytest.raises(RmqOptionError):
        native.scan_queue("cl", cq, CQ_SIZE, 0, 1)
    with pytest.raises(RmqOptionError):
        native.CommitLog(cl.segments, 0)
    with pytest.raises(RmqOptionError):
        native.lookup_time(cl, cq, CQ_SIZE, 3, 2, 0)
    with pytest.raises(RmqOptionError):
        native.lookup_time(cl, cq, CQ_SIZE, 0, 2, 1 << 63)
    cq[1].close()
    with pytest.raises(RmqOptionError, match="closed"):
        native.scan_queue(cl, cq, CQ_SIZE, 0, 1)


def test_commitlog_is_a_snapshot_that_outlives_closed_segments(tmp_path):
    cl, cq = _tagged_store(tmp_path, ["a"] * 3)
    end = cl.valid_end()
    for seg in cl.segments:
        seg.close()
    import gc
    gc.collect()
    assert cl.valid_end() == end
    assert native.scan_queue(cl, cq, CQ_SIZE, 0, 3).batch.num_rows == 3
