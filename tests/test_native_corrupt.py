"""Corrupt stores: every damage gives the documented RmqCorruptStoreError, never a crash.

A copy of the RocketMQ 4.9.3 reference store (CommitLog + one ConsumeQueue) is damaged byte by
byte; the scan must fail with the right code, naming the damaged file and the byte position of
the record (CommitLog damage) or of the unit (ConsumeQueue damage). The same table, the decoder
tables and the fast-path models (test_native_export.py) run again in a subprocess against the
AddressSanitizer/UBSan builds of the C core, SIMD and portable (``@pytest.mark.asan``).
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import fixture_dir, missing, require
from rmq_source.store import native
from rmq_source.errors import RmqCorruptStoreError

REPO = Path(__file__).resolve().parents[1]
TOPIC, QID, TARGET = "TopicTest", 0, 100        # the damaged message: TopicTest/0 offset 100
CL_SIZE, CQ_SIZE = 524288, 1280


@dataclass
class Damaged:
    root: Path
    phy: int               # physical offset of the target record
    size: int
    body_len: int
    topic_len: int
    prop_len: int

    @property
    def cl_path(self) -> Path:
        return self.root / "commitlog" / f"{self.phy - self.phy % CL_SIZE:020d}"

    @property
    def cl_pos(self) -> int:
        return self.phy % CL_SIZE

    @property
    def cq_path(self) -> Path:
        start = TARGET * 20 - TARGET * 20 % CQ_SIZE
        return self.root / "consumequeue" / TOPIC / str(QID) / f"{start:020d}"

    @property
    def cq_pos(self) -> int:
        return TARGET * 20 % CQ_SIZE

    def poke(self, path: Path, pos: int, data: bytes) -> None:
        with open(path, "r+b") as fh:
            fh.seek(pos)
            fh.write(data)

    def poke_record(self, field_pos: int, data: bytes) -> None:
        self.poke(self.cl_path, self.cl_pos + field_pos, data)

    def poke_unit_size(self, size: int) -> None:
        self.poke(self.cq_path, self.cq_pos + 8, struct.pack(">i", size))


@pytest.fixture
def damaged(tmp_path) -> Damaged:
    fixture = fixture_dir("rocketmq-4.9.3/basic")
    store = fixture / "store"
    for sub in ("commitlog", f"consumequeue/{TOPIC}/{QID}"):
        (tmp_path / sub).mkdir(parents=True)
        for name in os.listdir(store / sub):
            shutil.copyfile(store / sub / name, tmp_path / sub / name)   # content, writable mode
    with open(fixture / "manifest.jsonl", encoding="utf-8") as fh:
        row = next(r for r in map(json.loads, fh)
                   if (r["topic"], r["queueId"], r["queueOffset"]) == (TOPIC, QID, TARGET))
    props = len(row["propertiesRaw"].encode("utf-8"))
    assert row["sysFlag"] == 0 and row["bodyLength"] > 0 and row["commitLogOffset"] % CL_SIZE
    return Damaged(tmp_path, row["commitLogOffset"], row["storeSize"], row["bodyLength"],
                   len(TOPIC), props)


def _scan(d: Damaged, verify_crc: bool = False, named: bool = True):
    """Scan the damaged queue; ``named``: tell the scan which queue it reads (as Store does), so
    that records are also checked against it."""
    cl = native.CommitLog([native.map_segment(d.root / "commitlog" / n, int(n))
                           for n in sorted(os.listdir(d.root / "commitlog"))], CL_SIZE)
    qdir = d.root / "consumequeue" / TOPIC / str(QID)
    cq = [native.map_segment(qdir / n, int(n)) for n in sorted(os.listdir(qdir))]
    queue = {"topic": TOPIC, "queue_id": QID} if named else {}
    res = native.scan_queue(cl, cq, CQ_SIZE, 0, 10_000, max_rows=100_000, verify_crc=verify_crc,
                            **queue)
    return res, cl, cq


# Offsets inside an IPv4/V1 record (§3.2): body length at 84, body at 88, then topic length,
# topic, properties length, properties.
def _topic_len_pos(d): return 88 + d.body_len
def _prop_len_pos(d): return 89 + d.body_len + d.topic_len
def _props_pos(d): return 91 + d.body_len + d.topic_len


def _truncate(d: Damaged, keep: int) -> None:
    os.truncate(d.cl_path, d.cl_pos + keep)


CASES = {
    # name: (damage, expected code, damaged file "cl"/"cq", verify_crc)
    "commitlog file truncated inside the record": (lambda d: _truncate(d, 50), "TRUNCATED", "cl", False),
    "commitlog file truncated inside the header": (lambda d: _truncate(d, 5), "TRUNCATED", "cl", False),
    "garbage magic": (lambda d: d.poke_record(4, b"\xde\xad\xbe\xef"), "BAD_MAGIC", "cl", False),
    "BLANK magic where a message is expected":
        (lambda d: d.poke_record(4, struct.pack(">I", 0xCBD43194)), "BAD_MAGIC", "cl", False),
    "zeroed record": (lambda d: d.poke_record(0, bytes(d.size)), "BAD_MAGIC", "cl", False),
    "CQ unit past the end of the CommitLog":
        (lambda d: d.poke(d.cq_path, d.cq_pos, struct.pack(">q", 6 * CL_SIZE + 10)),
         "UNIT_OUT_OF_RANGE", "cq", False),
    "CQ unit far past the CommitLog":
        (lambda d: d.poke(d.cq_path, d.cq_pos, struct.pack(">q", (1 << 62))), "UNIT_OUT_OF_RANGE", "cq", False),
    "CQ unit into the middle of a record":
        (lambda d: d.poke(d.cq_path, d.cq_pos, struct.pack(">q", d.phy + 13)), "BAD_MAGIC", "cl+13", False),
    "CQ unit size differs from TOTALSIZE":
        (lambda d: d.poke_unit_size(d.size + 1), "SIZE_MISMATCH", "cl", False),
    "TOTALSIZE and unit claim 4 more bytes (length rule)":
        (lambda d: (d.poke_record(0, struct.pack(">i", d.size + 4)), d.poke_unit_size(d.size + 4)),
         "SIZE_MISMATCH", "cl", False),
    "TOTALSIZE below the minimum record":
        (lambda d: (d.poke_record(0, struct.pack(">i", 40)), d.poke_unit_size(40)),
         "SIZE_MISMATCH", "cl", False),
    "huge TOTALSIZE (runs past its file)":
        (lambda d: (d.poke_record(0, struct.pack(">i", 0x7FFFFFFF)), d.poke_unit_size(0x7FFFFFFF)),
         "TRUNCATED", "cl", False),
    "negative body length": (lambda d: d.poke_record(84, struct.pack(">i", -5)), "NEGATIVE_LENGTH", "cl", False),
    "huge body length": (lambda d: d.poke_record(84, struct.pack(">i", 0x7FFFFFF0)), "SIZE_MISMATCH", "cl", False),
    "body length one short": (lambda d: d.poke_record(84, struct.pack(">i", d.body_len - 1)), None, "cl", False),
    "negative topic length":
        (lambda d: d.poke_record(_topic_len_pos(d), b"\xff"), "NEGATIVE_LENGTH", "cl", False),
    "huge topic length": (lambda d: d.poke_record(_topic_len_pos(d), b"\x7f"), "SIZE_MISMATCH", "cl", False),
    "negative properties length":
        (lambda d: d.poke_record(_prop_len_pos(d), b"\x80\x01"), "NEGATIVE_LENGTH", "cl", False),
    "huge properties length":
        (lambda d: d.poke_record(_prop_len_pos(d), b"\x7f\xff"), "SIZE_MISMATCH", "cl", False),
    "invalid UTF-8 byte in properties":
        (lambda d: d.poke_record(_props_pos(d) + 1, b"\xff"), "BAD_UTF8", "cl", False),
    "UTF-16 surrogate encoded in properties":
        (lambda d: d.poke_record(_props_pos(d), b"\xed\xa0\x80"), "BAD_UTF8", "cl", False),
    "overlong UTF-8 in properties":
        (lambda d: d.poke_record(_props_pos(d), b"\xc0\xaf"), "BAD_UTF8", "cl", False),
    "truncated UTF-8 sequence at the end of properties":
        (lambda d: d.poke_record(_props_pos(d) + d.prop_len - 1, b"\xe3"), "BAD_UTF8", "cl", False),
    "invalid UTF-8 in topic":
        (lambda d: d.poke_record(_topic_len_pos(d) + 1, b"\x80"), "BAD_UTF8", "cl", False),
    "body CRC mismatch (verify_crc)":
        (lambda d: d.poke_record(88, b"\x00\x01\x02"), "CRC_MISMATCH", "cl", True),
    # the record is not the message of the unit pointing at it
    "record PHYSICALOFFSET differs from its position":
        (lambda d: d.poke_record(28, struct.pack(">q", d.phy + 1)), "UNIT_MISMATCH", "cl", False),
    "record QUEUEOFFSET differs from the unit's queue offset":
        (lambda d: d.poke_record(20, struct.pack(">q", TARGET + 1)), "UNIT_MISMATCH", "cl", False),
    "record QUEUEID of another queue":
        (lambda d: d.poke_record(12, struct.pack(">i", QID + 3)), "UNIT_MISMATCH", "cl", False),
    "record TOPIC of another topic (same length)":
        (lambda d: d.poke_record(_topic_len_pos(d) + 1, b"X"), "UNIT_MISMATCH", "cl", False),
    "pre-blank filler unit after written units":
        (lambda d: d.poke(d.cq_path, d.cq_pos, struct.pack(">qiq", 0, 0x7FFFFFFF, 0)),
         "BAD_UNIT", "cq", False),
    "non-last ConsumeQueue file shorter than its size":
        (lambda d: os.truncate(d.cq_path.with_name(f"{0:020d}"), 100), "TRUNCATED", "cq0", False),
}


# A damaged topic is also another queue's topic: a scan that names its queue reports
# UNIT_MISMATCH first (both are right); these cases check the other verdict without the name.
UNNAMED = {"invalid UTF-8 in topic"}


@pytest.mark.parametrize("name", list(CASES))
def test_corrupt_input(damaged, name):
    damage, code, where, verify = CASES[name]
    damage(damaged)
    if code is None:
        # body one byte short shifts the topic length onto the topic's first byte: whatever the
        # bytes then say, the record must be rejected
        with pytest.raises(RmqCorruptStoreError) as exc:
            _scan(damaged)
        assert exc.value.code in {"SIZE_MISMATCH", "NEGATIVE_LENGTH", "BAD_UTF8"}
        return
    with pytest.raises(RmqCorruptStoreError) as exc:
        _scan(damaged, verify_crc=verify, named=name not in UNNAMED)
    err = exc.value
    assert err.code == code
    if where.startswith("cl"):
        path, pos = damaged.cl_path, damaged.cl_pos + (13 if where == "cl+13" else 0)
    elif where == "cq":
        path, pos = damaged.cq_path, damaged.cq_pos
    else:  # the unit just past the short file's end, reported in that file
        path, pos = damaged.cq_path.with_name(f"{0:020d}"), 100
    assert (err.path, err.position) == (str(path), pos)
    message = str(err)
    assert message.startswith(code + ":")
    assert f"file {path}, position {pos}" in message
    assert f"queue offset {5 if where == 'cq0' else TARGET}" in message

@pytest.mark.parametrize("name", list(CASES))
def test_corrupt_input_other_entry_points_survive(damaged, name):
    """valid_end, store_timestamp and lookup_time on the same damage: an answer or the error."""
    damage, _, _, _ = CASES[name]
    damage(damaged)
    try:
        _, cl, cq = _scan(damaged)
    except RmqCorruptStoreError:
        cl = native.CommitLog([native.map_segment(damaged.root / "commitlog" / n, int(n))
                               for n in sorted(os.listdir(damaged.root / "commitlog"))], CL_SIZE)
        qdir = damaged.root / "consumequeue" / TOPIC / str(QID)
        cq = [native.map_segment(qdir / n, int(n)) for n in sorted(os.listdir(qdir))]
    assert 0 <= cl.valid_end(verify_crc=True) <= 6 * CL_SIZE
    for call in (lambda: cl.store_timestamp(damaged.phy, damaged.size),
                 lambda: native.lookup_time(cl, cq, CQ_SIZE, 0, 317, 1795292112000)):
        try:
            call()
        except RmqCorruptStoreError as exc:
            assert exc.path and exc.position is not None and exc.code
        except Exception as exc:  # noqa: BLE001 - only the documented errors may escape
            from rmq_source.errors import RmqStoreLayoutError
            assert isinstance(exc, RmqStoreLayoutError), exc


def test_crc_is_not_checked_unless_asked(damaged):
    damaged.poke_record(88, b"\x00\x01\x02")
    res, _, _ = _scan(damaged)
    assert (res.status, res.batch.num_rows, res.next_offset) == ("CQ_END", 317, 317)


# -- random damage (property-based): a row or a documented error, never anything else -----------

def _fuzz_store(root: Path) -> tuple[bytes, bytes]:
    from test_native_craft import CraftStore, Rec, host
    store = CraftStore(root, 4096, 10 * 20)
    store.add(Rec(body=b"abc" * 20, props={"TAGS": "A", "KEYS": "k1 k2", "UNIQ_KEY": "U"}))
    store.add(Rec(born_host=host("::1", 7), store_host=host("fe80::1", 8), body=b"\x00" * 33,
                  props={"名前": "値", "TAGS": "B"}))
    store.add(Rec(topic="V2" + "x" * 140, v2=True, body=b"z", props=b"a\x01b\x02"))
    store.add(Rec(props={"TAGS": "A"}, sysflag=0x301, body=b"\x78\x9c"))
    store.write()
    cl = (root / "commitlog" / f"{0:020d}").read_bytes()
    return cl, b""


try:
    from hypothesis import HealthCheck, given, settings, strategies as st
except ImportError:  # hypothesis is a test dependency: without it the test is still collected
    given = None

if given is None:
    def test_random_damage_never_crashes():
        require("hypothesis", "the random damage test needs hypothesis (pip install -e '.[test]')")
else:
    @settings(max_examples=int(os.environ.get("RMQ_FUZZ_EXAMPLES", "150")), deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(pokes=st.lists(st.tuples(st.integers(0, 1200), st.integers(0, 255)), min_size=1,
                          max_size=6),
           unit_pokes=st.lists(st.tuples(st.integers(0, 79), st.integers(0, 255)), max_size=2),
           verify=st.booleans())
    def test_random_damage_never_crashes(tmp_path_factory, pokes, unit_pokes, verify):
        import test_native_craft as craft
        root = tmp_path_factory.mktemp("fuzz")
        cl_bytes, _ = _fuzz_store(root)
        data = bytearray(cl_bytes)
        for pos, val in pokes:
            data[pos] = val
        (root / "commitlog" / f"{0:020d}").write_bytes(bytes(data))
        topics = sorted(os.listdir(root / "consumequeue"))
        for topic in topics:
            qdir = root / "consumequeue" / topic / "0"
            unit_file = qdir / f"{0:020d}"
            raw = bytearray(unit_file.read_bytes())
            for pos, val in unit_pokes:
                raw[pos] = val
            unit_file.write_bytes(bytes(raw))
            cl, cq = craft.open_store(root, 4096, topic)
            for codes, tags in ((None, None), ((craft.java_hash("A"),), ("A",))):
                try:
                    res = native.scan_queue(cl, cq, 200, 0, 10, codes=codes, tags=tags,
                                            verify_crc=verify)
                    res.batch.validate(full=True)      # offsets, UTF-8, map keys
                    assert res.batch.num_rows <= 4
                except RmqCorruptStoreError as exc:
                    assert exc.code and exc.path and exc.position is not None
            try:
                native.lookup_time(cl, cq, 200, 0, native.cq_valid_units(cq[0]), 1_700_000_000_100)
            except RmqCorruptStoreError as exc:
                assert exc.code
            assert 0 <= cl.valid_end(verify_crc=verify) <= 4096


# -- the same table under AddressSanitizer + UBSan -------------------------------------------

def _libasan() -> str | None:
    try:
        out = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True,
                             text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return out if os.path.isabs(out) and os.path.exists(out) else None


@pytest.fixture(scope="session")
def asan_build(tmp_path_factory):
    require("cmd:gcc", "the ASan variant of the C core is built with gcc")
    lib = _libasan()
    if lib is None:
        missing("cannot build the ASan variant: libasan.so not found (gcc -print-file-name=libasan.so)")
    out = tmp_path_factory.mktemp("asan")
    for extra in ([], ["--portable"]):
        proc = subprocess.run([sys.executable, str(REPO / "native" / "asan_build.py"), str(out),
                               *extra], capture_output=True, text=True, cwd=out)
        if proc.returncode != 0:
            missing("cannot build the ASan variant of the C core: " + proc.stderr[-2000:])
    return out, lib


# the SIMD build runs every native table; the portable one (plain C paths, no streaming stores)
# the decoder tables and the fast-path models, big batches aside (their streaming stores are
# SIMD-only; the staged columns are the same code in both builds)
ASAN_RUNS = {
    "asan": ["tests/test_native_corrupt.py", "tests/test_native_decoder.py",
             "tests/test_native_export.py", "tests/test_native_claims.py", "tests/test_pull_decode.py",
             "tests/test_native_pull.py", "tests/test_sql92.py", "tests/test_sink_encoder.py",
             "tests/test_traces.py", "tests/test_store_range_reads.py", "tests/test_stats_table.py",
             "-k", "not memory_limit"],     # an address-space limit and ASan's shadow do not mix
    "asan-portable": ["tests/test_native_decoder.py", "tests/test_native_export.py",
                      "-k", "not big and not dense"],
}


@pytest.mark.slow          # two sanitizer builds and a pytest run in each (about a minute)
@pytest.mark.asan
@pytest.mark.parametrize("variant", list(ASAN_RUNS))
def test_corrupt_and_decoder_tables_under_asan(asan_build, variant):
    outdir, libasan = asan_build
    module = "_rmq_native_asan" + ("_portable" if variant.endswith("portable") else "")
    env = dict(os.environ)
    env.update({
        "RMQ_NATIVE": variant,
        "PYTHONPATH": os.pathsep.join([str(outdir), str(REPO)]),
        "LD_PRELOAD": libasan,
        "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
    })
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, rmq_source.store.native; "
                               "assert 'rmq_source._native' not in sys.modules; "
                               f"print(sys.modules['{module}'].__file__)"],
        env=env, capture_output=True, text=True, cwd=REPO)
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert probe.stdout.strip().startswith(str(outdir)), probe.stdout
    proc = subprocess.run(
        # -s: a sanitizer report goes to the real stderr (pytest's capture would swallow it when
        # the process aborts)
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-m", "not asan",
         *ASAN_RUNS[variant]],
        env=env, capture_output=True, text=True, cwd=REPO, timeout=900)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert "AddressSanitizer" not in output and "runtime error" not in output, output[-6000:]
    assert " passed" in output
