"""Byte-level builders of CommitLog records and small stores, for the C core's tests.

The builders follow docs/rocketmq-store-format.md §3.2 (record), §3.4 (BLANK), §7.1 (CQ unit)
independently of rmq_source (they are the tests' own encoder). The tests in this file check the
builder itself against the spec's worked example (Appendix B.1), so the other native tests can
trust it. Other test modules import it as ``test_native_craft``.
"""
from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

MAGIC_V1 = 0xDAA320A7
MAGIC_V2 = 0xDAA320AB
MAGIC_BLANK = 0xCBD43194
CQ_UNIT = 20


def java_hash(text: str) -> int:
    h = 0
    units = text.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def encode_props(props: dict[str, str] | bytes | None, trailing: bool = False) -> bytes:
    if props is None:
        return b""
    if isinstance(props, bytes):
        return props
    text = "\x02".join(f"{k}\x01{v}" for k, v in props.items())
    if trailing and text:
        text += "\x02"
    return text.encode("utf-8")


def host(ip: str, port: int) -> bytes:
    """Host field bytes: 4 or 16 address bytes + int32 port (big-endian)."""
    import ipaddress
    return ipaddress.ip_address(ip).packed + struct.pack(">i", port)


@dataclass
class Rec:
    """Field values of one record; defaults give a valid V1/IPv4 record."""

    topic: str | bytes = "T"
    queue_id: int = 0
    flag: int = 0
    queue_offset: int = 0
    phy: int = 0
    sysflag: int = 0
    born_ts: int = 1_700_000_000_000
    born_host: bytes = field(default_factory=lambda: host("10.0.0.5", 53210))
    store_ts: int = 1_700_000_000_123
    store_host: bytes = field(default_factory=lambda: host("10.0.0.1", 10911))
    reconsume: int = 0
    prepared: int = 0
    body: bytes = b""
    props: dict[str, str] | bytes | None = None
    v2: bool = False
    body_crc: int | None = None         # default: crc32(body) & 0x7FFFFFFF
    # raw overrides for corrupt records
    total: int | None = None
    body_len: int | None = None
    topic_len: int | None = None
    prop_len: int | None = None
    magic: int | None = None

    def encode(self) -> bytes:
        topic = self.topic if isinstance(self.topic, bytes) else self.topic.encode("utf-8")
        props = encode_props(self.props)
        if len(self.born_host) == 20:
            self.sysflag |= 0x10
        if len(self.store_host) == 20:
            self.sysflag |= 0x20
        crc = zlib.crc32(self.body) & 0x7FFFFFFF if self.body_crc is None else self.body_crc
        tl = 2 if self.v2 else 1
        total = 74 + len(self.born_host) + len(self.store_host) + tl + len(self.body) + \
            len(topic) + len(props)
        magic = self.magic if self.magic is not None else (MAGIC_V2 if self.v2 else MAGIC_V1)
        out = struct.pack(">iIiiiqqiq", self.total if self.total is not None else total, magic,
                          crc, self.queue_id, self.flag, self.queue_offset, self.phy,
                          self.sysflag, self.born_ts)
        out += self.born_host + struct.pack(">q", self.store_ts) + self.store_host
        out += struct.pack(">iqi", self.reconsume, self.prepared,
                           len(self.body) if self.body_len is None else self.body_len)
        out += self.body
        tlen = len(topic) if self.topic_len is None else self.topic_len
        out += struct.pack(">h" if self.v2 else ">b", tlen) + topic
        out += struct.pack(">h", len(props) if self.prop_len is None else self.prop_len) + props
        return out


def tags_code(props) -> int:
    if isinstance(props, dict) and props.get("TAGS"):
        return java_hash(props["TAGS"])
    return 0


class CraftStore:
    """A store written byte by byte: one CommitLog, ConsumeQueues ``consumequeue/<topic>/<qid>``.

    ``add`` appends a record (the broker's rule: a record of length L goes in the current file
    only if L + 8 <= bytes left, else a BLANK fills the file) and its CQ unit; ``units`` may also
    be appended raw with ``add_unit``. ``write`` materialises full-size files.
    """

    def __init__(self, root: Path, cl_file_size: int = 8192, cq_file_size: int = 10 * CQ_UNIT):
        self.root = Path(root)
        self.cl_file_size = cl_file_size
        self.cq_file_size = cq_file_size
        self.cl = bytearray()
        self.queues: dict[tuple[str, int], bytearray] = {}

    def add(self, rec: Rec, tags_code_value: int | None = None) -> tuple[int, int]:
        """Append ``rec`` (its phy and queue_offset are filled in); returns (phy, queue offset)."""
        key = (rec.topic if isinstance(rec.topic, str) else rec.topic.decode(), rec.queue_id)
        cq = self.queues.setdefault(key, bytearray())
        rec.queue_offset = len(cq) // CQ_UNIT
        size = len(rec.encode())
        pos = len(self.cl) % self.cl_file_size
        left = self.cl_file_size - pos
        if size + 8 > left:
            self.cl += struct.pack(">iI", left, MAGIC_BLANK) + bytes(left - 8)
        rec.phy = len(self.cl)
        data = rec.encode()
        self.cl += data
        code = tags_code(rec.props) if tags_code_value is None else tags_code_value
        cq += struct.pack(">qiq", rec.phy, len(data), code)
        return rec.phy, rec.queue_offset

    def add_unit(self, topic: str, qid: int, phy: int, size: int, code: int = 0) -> int:
        cq = self.queues.setdefault((topic, qid), bytearray())
        cq += struct.pack(">qiq", phy, size, code)
        return len(cq) // CQ_UNIT - 1

    def write(self, extra_zero_cl_file: bool = False) -> None:
        cl_dir = self.root / "commitlog"
        cl_dir.mkdir(parents=True, exist_ok=True)
        nfiles = max(1, -(-len(self.cl) // self.cl_file_size)) + (1 if extra_zero_cl_file else 0)
        data = bytes(self.cl) + bytes(nfiles * self.cl_file_size - len(self.cl))
        for i in range(nfiles):
            start = i * self.cl_file_size
            (cl_dir / f"{start:020d}").write_bytes(data[start:start + self.cl_file_size])
        for (topic, qid), units in self.queues.items():
            qdir = self.root / "consumequeue" / topic / str(qid)
            qdir.mkdir(parents=True, exist_ok=True)
            nq = max(1, -(-len(units) // self.cq_file_size))
            raw = bytes(units) + bytes(nq * self.cq_file_size - len(units))
            for i in range(nq):
                start = i * self.cq_file_size
                (qdir / f"{start:020d}").write_bytes(raw[start:start + self.cq_file_size])


def files_of(folder: Path) -> list[tuple[int, str]]:
    return sorted((int(n), os.path.join(folder, n)) for n in os.listdir(folder) if n.isdigit())


def open_store(root: Path, cl_file_size: int, topic: str = "T", qid: int = 0):
    """(CommitLog, cq segments) through rmq_source.store.native for a crafted or copied store."""
    from rmq_source.store import native
    cl = native.CommitLog([native.map_segment(p, s) for s, p in files_of(Path(root) / "commitlog")],
                          cl_file_size)
    qdir = Path(root) / "consumequeue" / topic / str(qid)
    cq = [native.map_segment(p, s) for s, p in files_of(qdir)] if qdir.is_dir() else []
    return cl, cq


# -- tests of the builder itself --------------------------------------------------------------

def test_builder_matches_spec_worked_example_b1():
    """Appendix B.1: topic T, queue 1, offset 7, phy 4096, body "hi", TAGS=A, WAIT=true."""
    rec = Rec(topic="T", queue_id=1, queue_offset=7, phy=4096, born_ts=1_700_000_000_000,
              born_host=host("10.0.0.5", 53210), store_ts=1_700_000_000_123,
              store_host=host("10.0.0.1", 10911), body=b"hi", props={"TAGS": "A", "WAIT": "true"})
    expected = bytes.fromhex(
        "0000006E DAA320A7 58932AAC 00000001"
        "00000000 00000000 00000007 00000000"
        "00001000 00000000 0000018B CFE56800"
        "0A000005 0000CFDA 0000018B CFE5687B"
        "0A000001 00002A9F 00000000 00000000"
        "00000000 00000002 6869 01 54 0010 5441"
        "4753 01 41 02 57 41 49 54 01 74 72 75 65".replace(" ", ""))
    assert rec.encode() == expected
    assert java_hash("A") == 65
    assert java_hash("Aa") == java_hash("BB") == 2112


def test_store_builder_places_blank_and_units(tmp_path):
    store = CraftStore(tmp_path, cl_file_size=1024)
    phys = [store.add(Rec(body=bytes(300), props={"TAGS": "x"}))[0] for _ in range(4)]
    store.write()
    # records of 398 bytes: two fit in 1024 (796 + 398 + 8 > 1024), the third rolls over
    assert phys == [0, 398, 1024, 1422]
    first = (tmp_path / "commitlog" / f"{0:020d}").read_bytes()
    assert struct.unpack(">iI", first[796:804]) == (1024 - 796, MAGIC_BLANK)
    cq = (tmp_path / "consumequeue" / "T" / "0" / f"{0:020d}").read_bytes()
    assert struct.unpack(">qiq", cq[20:40]) == (398, 398, java_hash("x"))
