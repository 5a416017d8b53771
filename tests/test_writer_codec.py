"""record_codec: byte-exact records (worked example B.1 and every record of the broker's fixtures),
hosts, properties, UNIQ_KEY layout and compression."""
from __future__ import annotations

import base64
import json
import os
import zlib
from datetime import datetime

import pytest

from conftest import fixture_dir

from rmq_source.store import record_codec as rc
from rmq_source.errors import RmqCorruptStoreError, RmqOptionError


# Worked example B.1 of the format doc, byte for byte.
B1_HEX = """
00 00 00 6E DA A3 20 A7 58 93 2A AC 00 00 00 01  00 00 00 00 00 00 00 00 00 00 00 07 00 00 00 00
00 00 10 00 00 00 00 00 00 00 01 8B CF E5 68 00  0A 00 00 05 00 00 CF DA 00 00 01 8B CF E5 68 7B
0A 00 00 01 00 00 2A 9F 00 00 00 00 00 00 00 00  00 00 00 00 00 00 00 02 68 69 01 54 00 10 54 41
47 53 01 41 02 57 41 49 54 01 74 72 75 65
"""
B1 = bytes.fromhex(B1_HEX)


def b1_record(**overrides) -> bytes:
    fields = dict(queue_id=1, flag=0, queue_offset=7, physical_offset=4096, sys_flag=0,
                  born_timestamp=1_700_000_000_000,
                  born_host=rc.parse_host("10.0.0.5:53210").field,
                  store_timestamp=1_700_000_000_123,
                  store_host=rc.parse_host("10.0.0.1:10911").field, reconsume_times=0,
                  prepared_transaction_offset=0, body=b"hi", topic=b"T",
                  properties=rc.encode_properties({"TAGS": "A", "WAIT": "true"}, "4.9.3"))
    fields.update(overrides)
    return rc.encode_record(**fields)


def test_worked_example_b1_byte_exact():
    assert len(B1) == 110
    assert b1_record() == B1


def test_worked_example_b1_5x_properties_add_trailing_separator():
    rec = b1_record(properties=rc.encode_properties({"TAGS": "A", "WAIT": "true"}, "5.3.3"))
    assert len(rec) == 111 and rec[-19:] == b"\x00\x11TAGS\x01A\x02WAIT\x01true\x02"


def test_worked_example_b1_cq_unit_and_msg_id():
    unit = rc.encode_cq_unit(4096, 110, 65)
    assert unit == bytes.fromhex("0000000000001000 0000006E 0000000000000041")
    assert rc.offset_msg_id(rc.parse_host("10.0.0.1:10911").field, 4096) == \
        "0A00000100002A9F0000000000001000"


def test_decode_record_inverts_encode():
    rec = rc.decode_record(B1, 0)
    assert (rec.total_size, rec.queue_id, rec.queue_offset, rec.physical_offset) == (110, 1, 7, 4096)
    assert (rec.topic, rec.body, rec.properties) == ("T", b"hi", {"TAGS": "A", "WAIT": "true"})
    assert rc.decode_record(rc.blank_record(4000), 0) is None


@pytest.mark.parametrize("cut", [0, 8, 50, 109])
def test_decode_record_rejects_truncated_records(cut):
    data = B1[:cut] + bytes(0 if cut >= 8 else 8 - cut)
    with pytest.raises(RmqCorruptStoreError, match="at position 0") as exc:
        rc.decode_record(data, 0)
    assert exc.value.position == 0


def _fixture_records(version: str):
    base = fixture_dir(f"rocketmq-{version}/basic")
    with open(base / "manifest.jsonl", encoding="utf-8") as f:
        for line in f:
            yield base, json.loads(line)


@pytest.mark.parametrize("version", ["4.9.3", "5.3.3"])
def test_every_fixture_record_is_reencoded_byte_exact(version):
    """Encoding the broker's decoded fields again gives the broker's bytes (V1 and V2 records)."""
    files: dict[int, bytes] = {}
    count = v2 = 0
    for base, m in _fixture_records(version):
        size = 524288
        start = m["commitLogOffset"] - m["commitLogOffset"] % size
        if start not in files:
            files[start] = (base / "store" / "commitlog" / f"{start:020d}").read_bytes()
        pos = m["commitLogOffset"] - start
        stored = files[start][pos:pos + m["storeSize"]]
        rec = rc.encode_record(
            queue_id=m["queueId"], flag=m["flag"], queue_offset=m["queueOffset"],
            physical_offset=m["commitLogOffset"], sys_flag=m["sysFlag"],
            born_timestamp=m["bornTimestamp"], born_host=rc.parse_host(m["bornHost"]).field,
            store_timestamp=m["storeTimestamp"], store_host=rc.parse_host(m["storeHost"]).field,
            reconsume_times=m["reconsumeTimes"],
            prepared_transaction_offset=m["preparedTransactionOffset"],
            body=base64.b64decode(m["body"]), topic=m["topic"].encode(),
            properties=m["propertiesRaw"].encode("utf-8"))
        assert rec == stored, (m["topic"], m["queueId"], m["queueOffset"])
        assert rc.encode_cq_unit(m["commitLogOffset"], m["storeSize"], m["cq"]["tagsCode"]) == \
            rc.encode_cq_unit(*m["cq"].values())
        count += 1
        v2 += m["magicCode"] == rc.MAGIC_V2
    assert count >= 2000
    assert (v2 > 0) == (version == "5.3.3")


# ---------------------------------------------------------------------------------------- hosts

@pytest.mark.parametrize("text, address, port, java", [
    ("127.0.0.1:10911", "7f000001", 10911, "127.0.0.1:10911"),
    ("[::1]:80", "0" * 31 + "1", 80, "0:0:0:0:0:0:0:1:80"),
    ("0:0:0:0:0:0:0:1:10911", "0" * 31 + "1", 10911, "0:0:0:0:0:0:0:1:10911"),
    ("[fe80::1:abcd]:0", "fe80" + "0" * 20 + "0001abcd", 0, "fe80:0:0:0:0:0:1:abcd:0"),
    ("[::ffff:10.1.2.3]:5", "0a010203", 5, "10.1.2.3:5"),     # Java turns mapped IPv6 into IPv4
    ("10.0.0.1:65535", "0a000001", 65535, "10.0.0.1:65535"),
])
def test_parse_host(text, address, port, java):
    host = rc.parse_host(text)
    assert host.address.hex() == address and host.port == port
    assert host.field == host.address + port.to_bytes(4, "big")
    assert rc.java_host_string(host.field) == java


@pytest.mark.parametrize("text", ["127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "1.2.3:4",
                                  "host:80", "[::1]80", ":80", "127.0.0.1:-1", "", "::1:x"])
def test_parse_host_rejects(text):
    with pytest.raises(RmqOptionError, match="store_host"):
        rc.parse_host(text, option="store_host")


# ----------------------------------------------------------------------------------- properties

@pytest.mark.parametrize("entries, style, raw", [
    ({"TAGS": "A", "WAIT": "true"}, "4.9.3", b"TAGS\x01A\x02WAIT\x01true"),
    ({"TAGS": "A", "WAIT": "true"}, "5.3.3", b"TAGS\x01A\x02WAIT\x01true\x02"),
    ({"A": "1", "B": None, "C": "3"}, "4.9.3", b"A\x011\x02C\x013"),
    ({}, "4.9.3", b""),
    ({}, "5.3.3", b""),
    ({"名前": "値"}, "4.9.3", "名前\x01値".encode()),
])
def test_encode_properties(entries, style, raw):
    assert rc.encode_properties(entries, style) == raw
    assert rc.decode_properties(raw) == {k: v for k, v in entries.items() if v is not None}


@pytest.mark.parametrize("name, value", [("", "v"), ("k", ""), ("a\x01b", "v"), ("k", "v\x02"),
                                         (1, "v"), ("k", 1), ("k", "\ud800")])
def test_validate_property_rejects(name, value):
    with pytest.raises(RmqOptionError):
        rc.validate_property(name, value)


# ------------------------------------------------------------------------------------- UNIQ_KEY

@pytest.mark.parametrize("ip", [bytes([192, 0, 2, 7]), bytes(range(16))])
def test_uniq_key_layout(ip):
    born = 1_795_292_110_389
    factory = rc.UniqKeyFactory()
    first, second = factory.create(ip, born), factory.create(ip, born + 5)
    raw = bytes.fromhex(first)
    assert len(raw) == len(ip) + 12 and first == first.upper()
    assert raw[:len(ip)] == ip
    assert int.from_bytes(raw[len(ip):len(ip) + 2], "big") == os.getpid() & 0xFFFF
    moment = datetime.fromtimestamp(born / 1000).astimezone()
    month_start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    expected = born - int(month_start.timestamp() * 1000)
    assert int.from_bytes(raw[len(ip) + 6:len(ip) + 10], "big") == expected
    raw2 = bytes.fromhex(second)
    assert int.from_bytes(raw2[len(ip) + 6:len(ip) + 10], "big") == expected + 5
    counter = int.from_bytes(raw[-2:], "big")
    assert int.from_bytes(raw2[-2:], "big") == (counter + 1) & 0xFFFF


# ---------------------------------------------------------------------------------- compression

@pytest.mark.parametrize("name, style, flag", [
    ("zlib", "4.9.3", 0x1), ("zlib", "5.3.3", 0x301), ("lz4", "4.9.3", 0x101),
    ("zstd", "5.3.3", 0x201),
])
def test_compress_body_flags_and_round_trip(name, style, flag):
    body = b"hello " * 1000
    stored, bits = rc.compress_body(body, name, 5, style)
    assert bits == flag and len(stored) < len(body)
    if name == "zlib":
        assert stored[0] == 0x78 and zlib.decompress(stored) == body     # RFC 1950 stream
    elif name == "lz4":
        import lz4.frame
        assert lz4.frame.decompress(stored) == body
    else:
        import zstandard
        assert zstandard.ZstdDecompressor().decompress(stored) == body


def test_compress_body_rejects_unknown_name():
    with pytest.raises(RmqOptionError, match="compression"):
        rc.compress_body(b"x", "snappy", 5, "4.9.3")
