"""Fuzz harness: turns fuzz bytes into store files, runs the C core and the model, compares.

Two targets (entry points :func:`record_target` and :func:`queue_target`):

* ``record``: the fuzz input holds a 16-byte header, raw ConsumeQueue units and the CommitLog
  bytes. The CommitLog bytes are cut into files; ConsumeQueue units are derived by walking those
  bytes as the broker lays records out (plus the raw units and optional pre-blank units). Every
  entry point of ``rmq_source.store.native`` runs on them.
* ``queue``: a fixed, valid CommitLog (records of the RocketMQ 4.9.3 reference store when present,
  plus crafted V1/V2/IPv6/compressed/BLANK records) and ConsumeQueue files made of the fuzz input.

For every call the C core must give the model's answer (``fuzz_model``) or raise the
RmqSourceError subclass the model names; any other exception, a crash or a sanitizer report is a
finding. The header (``Knobs``) selects the call arguments: flags, max_rows, file sizes, tag
subscription, max_bytes, timestamps, whether scans name the queue they read (so that records
are checked against it), and a raw int64 for out-of-range arguments.

Files live in one temporary folder per process and are rewritten for every input; their
mappings are dropped at the end of each input.
"""
from __future__ import annotations

import atexit
import functools
import gc
import ipaddress
import os
import shutil
import struct
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from rmq_source.store import native
from rmq_source.store import record_codec as rc
from rmq_source.errors import (RmqCorruptStoreError, RmqOptionError, RmqSourceError,
                               RmqStoreLayoutError)

import fuzz_model as fm
from fuzz_model import CQ_UNIT, Files, Model, ModelError

HEADER = struct.Struct(">BBBBIq")
HEADER_SIZE = HEADER.size        # 16
UNIT = struct.Struct(">qiq")
TAG_POOL = ("TagA", "TagB", "Aa", "BB", "タグ")     # "Aa" and "BB" share hash code 2112
MAX_CL_FILES = 8
MAX_DERIVED_UNITS = 64
DEFAULT_MAX_BYTES = 64 << 20
# the first CommitLog file of the RocketMQ 4.9.3 reference store: from RMQ_FIXTURES (set by the
# test session to the folder it uses), ../shared/fixtures, or the embedded copy of the fixtures
FIXTURE_COMMITLOG_REL = f"rocketmq-4.9.3/basic/store/commitlog/{0:020d}"
SHARED_FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"
EMBEDDED_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "reference.tar.xz"

# flag bits of header byte 0
F_VERIFY_CRC = 0x01
F_FILTER = 0x02          # tag hash-code filter (codes)
F_TAGS = 0x04            # also compare TAGS strings (needs F_FILTER)
F_CL_BASE = 0x08         # record: CommitLog starts at 2 * file size; queue: drop the first file
F_PREBLANK = 0x10        # record: pre-blank units first; queue: a short middle ConsumeQueue file
F_RAW_ARGS = 0x20        # arguments taken from the raw int64 (often out of range)
F_SMALL_BYTES = 0x40     # max_bytes 1..4096
F_EXTRA = 0x80           # record: an extra zero-filled CommitLog file; queue: CQ starts later


class Finding(AssertionError):
    """The C core and the model disagree (or an invariant of a result does not hold)."""


@dataclass(frozen=True)
class Knobs:
    """The 16-byte header of every fuzz input."""

    flags: int
    rows_sel: int
    size_sel: int
    misc: int
    u32: int
    raw: int

    @classmethod
    def parse(cls, data: bytes) -> tuple["Knobs", bytes]:
        head = data[:HEADER_SIZE].ljust(HEADER_SIZE, b"\0")
        return cls(*HEADER.unpack(head)), data[HEADER_SIZE:]

    def pack(self) -> bytes:
        return HEADER.pack(self.flags, self.rows_sel, self.size_sel, self.misc, self.u32,
                           self.raw)

    def has(self, flag: int) -> bool:
        return bool(self.flags & flag)

    @property
    def max_rows(self) -> int:
        if self.has(F_RAW_ARGS):
            return ((self.u32 >> 8) & 0xFF) - 4          # <= 0 must be rejected
        return 1 + (self.rows_sel & 0x3F) if self.rows_sel < 0xC0 else 65536

    @property
    def max_bytes(self) -> int:
        if self.has(F_RAW_ARGS):
            return ((self.u32 >> 16) & 0xFFFF) - 8
        return 1 + ((self.u32 >> 5) & 0xFFF) if self.has(F_SMALL_BYTES) else DEFAULT_MAX_BYTES

    @property
    def start_sel(self) -> int:
        return self.misc & 7

    @property
    def end_trim(self) -> int:
        return (self.misc >> 3) & 7

    @property
    def names_queue(self) -> bool:
        """Scans pass the queue read (topic, queue_id): records must be its messages. Top bits
        of misc: 0 or 2 no, 1 yes, 3 many tag codes (see subscription)."""
        return self.misc >> 6 == 1

    def subscription(self) -> tuple[tuple[int, ...] | None, tuple[str, ...] | None]:
        """(codes, tags) for scan_queue: None/None (all) or a selection of TAG_POOL."""
        if not self.has(F_FILTER):
            return None, None
        chosen = [t for i, t in enumerate(TAG_POOL) if self.u32 >> i & 1]
        codes = [fm.java_hash(t) for t in chosen]
        if self.misc >> 6 == 3:             # many codes: the C core's sorted / binary-search path
            codes += [_s32((self.raw * (2 * i + 1)) >> 7) for i in range(10)]
        tags = tuple(chosen) if self.has(F_TAGS) else None
        return tuple(codes), tags


def _s32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


# -- files ---------------------------------------------------------------------------------------

def fast_tmpdir() -> str | None:
    """/dev/shm when usable: rewriting a file there costs microseconds, on disk milliseconds."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


class Workspace:
    """The folder of one process's store files, overwritten input after input.

    ``RMQ_FUZZ_WORKSPACE`` names it (run_fuzz.py sets it and removes it afterwards: libFuzzer
    ends the process without running atexit handlers); otherwise a temporary folder removed at
    exit.
    """

    def __init__(self) -> None:
        given = os.environ.get("RMQ_FUZZ_WORKSPACE")
        if given:
            self.root = Path(given)
            self.root.mkdir(parents=True, exist_ok=True)
        else:
            self.root = Path(tempfile.mkdtemp(prefix="rmq-fuzz-", dir=fast_tmpdir()))
            atexit.register(shutil.rmtree, self.root, True)

    def write(self, name: str, data: bytes) -> str:
        path = str(self.root / name)
        with open(path, "wb") as fh:
            fh.write(data)
        return path


def map_files(paths: list[str], starts: list[int]) -> list[native.Segment]:
    return [native.map_segment(p, s) for p, s in zip(paths, starts)]


# -- comparing ----------------------------------------------------------------------------------

_ERROR_CLASS = {"corrupt": RmqCorruptStoreError, "layout": RmqStoreLayoutError,
                "option": RmqOptionError}


def _run(fn):
    """("ok", value) or ("err", RmqSourceError); any other exception propagates (a finding)."""
    try:
        return "ok", fn()
    except RmqSourceError as exc:
        exc.__traceback__ = None       # its frames would hold the caller's locals in a cycle
        return "err", exc


def _model(fn):
    try:
        return "ok", fn()
    except ModelError as exc:
        exc.__traceback__ = None
        return "err", exc


def _check_error(what: str, exc: RmqSourceError, want: ModelError) -> None:
    cls = _ERROR_CLASS[want.kind]
    if not isinstance(exc, cls):
        raise Finding(f"{what}: C core raised {type(exc).__name__}: {exc}; the model expects "
                      f"{cls.__name__} ({want.why})")
    if want.kind == "corrupt":
        if not exc.code:
            raise Finding(f"{what}: RmqCorruptStoreError without a code: {exc}")
        if want.path is not None and (exc.path, exc.position) != (want.path, want.position):
            raise Finding(f"{what}: error names ({exc.path}, {exc.position}), the model expects "
                          f"({want.path}, {want.position}) ({want.why}); message: {exc}")


def compare(what: str, model_fn, native_fn):
    """Run both; require the same value or the matching error. Returns the native outcome."""
    m_kind, m_val = _model(model_fn)
    n_kind, n_val = _run(native_fn)
    if m_kind == "err":
        if n_kind == "ok":
            raise Finding(f"{what}: C core returned {n_val!r}; the model expects "
                          f"{type(m_val).__name__} {m_val}")
        _check_error(what, n_val, m_val)
    elif n_kind == "err":
        raise Finding(f"{what}: C core raised {type(n_val).__name__}: {n_val}; the model "
                      f"expects {m_val!r}")
    elif n_val != m_val:
        raise Finding(f"{what}: C core returned {n_val!r}, the model {m_val!r}")
    return n_kind, n_val


def batch_rows(batch: pa.RecordBatch) -> list[dict]:
    cols = {}
    for fld in batch.schema:
        col = batch.column(fld.name)
        if pa.types.is_timestamp(fld.type):
            col = col.cast(pa.int64())
        cols[fld.name] = col.to_pylist()
    return [dict(zip(cols, values)) for values in zip(*cols.values())] if cols else []


def _public(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("_")}


def _diff_rows(got: list[dict], want: list[dict]) -> str:
    if len(got) != len(want):
        return (f"{len(got)} rows (queue offsets {[r['queueOffset'] for r in got]}), the model "
                f"{len(want)} (queue offsets {[r['queueOffset'] for r in want]})")
    for g, w in zip(got, want):
        w = _public(w)
        if g != w:
            keys = sorted(k for k in set(g) | set(w) if g.get(k) != w.get(k))
            return (f"row at queue offset {w['queueOffset']}: " +
                    "; ".join(f"{k}: C {g.get(k)!r} vs model {w.get(k)!r}" for k in keys))
    return "same"


def check_scan(model: Model, cl: native.CommitLog, cq_model: Files, cq_segs, start: int,
               end: int, codes, tags, max_rows: int, max_bytes: int, verify_crc: bool,
               queue: tuple[str, int] | None = None) -> None:
    """scan_queue against the model, plus the result invariants of the contract. ``queue``:
    (topic, queue_id) passed to the scan, or None."""
    topic, queue_id = queue if queue is not None else (None, None)
    what = (f"scan_queue(start={start}, end={end}, codes={codes}, tags={tags}, "
            f"max_rows={max_rows}, max_bytes={max_bytes}, verify_crc={verify_crc}, "
            f"topic={topic!r}, queue_id={queue_id})")
    m_kind, m_val = _model(lambda: model.scan(cq_model, start, end, codes, tags, max_rows,
                                              max_bytes, verify_crc, topic, queue_id))
    n_kind, res = _run(lambda: native.scan_queue(
        cl, cq_segs, cq_model.file_size, start, end, codes=codes, tags=tags, max_rows=max_rows,
        max_bytes=max_bytes, verify_crc=verify_crc, topic=topic, queue_id=queue_id))
    if n_kind == "err":
        if m_kind == "ok":
            raise Finding(f"{what}: C core raised {type(res).__name__}: {res}; the model expects "
                          f"{len(m_val[0])} rows, next offset {m_val[1]}, status {m_val[2]}")
        _check_error(what, res, m_val)
        return
    # invariants that hold whatever the model says
    batch = res.batch
    if batch.schema != native.NATIVE_SCHEMA:
        raise Finding(f"{what}: batch schema {batch.schema} is not NATIVE_SCHEMA")
    try:
        batch.validate(full=True)
    except pa.ArrowInvalid as exc:
        raise Finding(f"{what}: the batch is not valid Arrow: {exc}") from None
    rows = batch_rows(batch)
    if not start <= res.next_offset <= end:
        raise Finding(f"{what}: next_offset {res.next_offset} outside [start, end]")
    if res.scanned != res.next_offset - start:
        raise Finding(f"{what}: scanned {res.scanned} != next_offset - start")
    if len(rows) > max_rows:
        raise Finding(f"{what}: {len(rows)} rows > max_rows {max_rows}")
    if res.status not in ("END", "FULL", "CQ_END", "CL_GONE"):
        raise Finding(f"{what}: unknown status {res.status!r}")
    if (res.status == "END") != (res.next_offset == end):
        raise Finding(f"{what}: status {res.status} with next_offset {res.next_offset}, end {end}")
    offsets = [r["queueOffset"] for r in rows]
    if offsets != sorted(set(offsets)) or any(not start <= o < res.next_offset for o in offsets):
        raise Finding(f"{what}: row queue offsets {offsets} not increasing inside "
                      f"[{start}, {res.next_offset})")
    if m_kind == "err" and m_val.kind == "option":
        raise Finding(f"{what}: C core accepted arguments the contract rejects ({m_val.why})")
    m_rows = m_val[0] if m_kind == "ok" else m_val.rows
    k = len(rows)
    if k >= 2 and sum(r["_bytes"] for r in m_rows[:k]) > max_bytes:
        raise Finding(f"{what}: {k} rows hold more than max_bytes of body + properties")
    if res.status == "FULL" and k < max_rows:
        # stopped by max_bytes: a prefix of the model's rows, and the next row must be one the
        # model accepts at next_offset and that could plausibly exceed max_bytes
        if k == 0:
            raise Finding(f"{what}: FULL with no row (at least one row is always accepted)")
        if _diff_rows(rows, m_rows[:k]) != "same":
            raise Finding(f"{what}: FULL (bytes) rows differ: {_diff_rows(rows, m_rows[:k])}")
        if len(m_rows) <= k or m_rows[k]["queueOffset"] != res.next_offset:
            raise Finding(f"{what}: FULL (bytes) at {res.next_offset}, but the model accepts no "
                          f"row there")
        bound = sum(r["_bytes"] + r["_props_bytes"] + 176 for r in m_rows[:k + 1])
        if bound <= max_bytes:
            raise Finding(f"{what}: FULL (bytes) although {k + 1} rows need at most {bound} "
                          f"bytes <= max_bytes")
        return
    if m_kind == "err":
        raise Finding(f"{what}: C core returned {k} rows, next offset {res.next_offset}, status "
                      f"{res.status}; the model expects {type(m_val).__name__} {m_val} after "
                      f"{len(m_val.rows)} rows")
    m_rows, m_next, m_status = m_val
    if (res.next_offset, res.status) != (m_next, m_status) or _diff_rows(rows, m_rows) != "same":
        raise Finding(f"{what}: C core next offset {res.next_offset}, status {res.status}; "
                      f"model {m_next}, {m_status}; rows: {_diff_rows(rows, m_rows)}")


def live_batches() -> int:
    """C batches not freed yet (0 when this version of the C core does not count them)."""
    counter = getattr(native, "live_batches", None)
    return counter() if counter else 0


def check_released(before: int) -> None:
    """Every batch of this input was freed once its Arrow arrays were dropped (error paths too)."""
    after = live_batches()
    if after != before:
        gc.collect()                   # a reference cycle may still hold one; that is no leak
        after = live_batches()
    if after != before:
        raise Finding(f"{after - before} C batch(es) still allocated after the input: a leak")


def check_commitlog(model: Model, cl: native.CommitLog, units) -> None:
    """min_offset, valid_end (with and without CRC) and store_timestamp of some units."""
    if cl.min_offset != model.cl.min_offset:
        raise Finding(f"CommitLog.min_offset {cl.min_offset} != {model.cl.min_offset}")
    for verify in (False, True):
        compare(f"valid_end(verify_crc={verify})", lambda: model.valid_end(verify),
                lambda: cl.valid_end(verify_crc=verify))
    for phy, size in units:
        compare(f"store_timestamp({phy}, {size})", lambda: model.store_timestamp(phy, size),
                lambda: cl.store_timestamp(phy, size))


def check_cq_files(cq_model: Files, cq_segs, phy_mins) -> None:
    for data, seg in zip(cq_model.datas, cq_segs):
        compare(f"cq_valid_units({seg.path})", lambda: fm.cq_valid_units(data),
                lambda: native.cq_valid_units(seg))
        for phy_min in phy_mins:
            compare(f"cq_first_unit_at_or_above({seg.path}, {phy_min})",
                    lambda: fm.cq_first_unit_at_or_above(data, phy_min),
                    lambda: native.cq_first_unit_at_or_above(seg, phy_min))


def check_lookup(model: Model, cl, cq_model: Files, cq_segs, lo: int, hi: int, ts: int) -> None:
    compare(f"lookup_time({lo}, {hi}, {ts})", lambda: model.lookup_time(cq_model, lo, hi, ts),
            lambda: native.lookup_time(cl, cq_segs, cq_model.file_size, lo, hi, ts))


def scan_range(k: Knobs, first: int, count: int) -> tuple[int, int]:
    """(start, end) of a scan over units [first, first + count): a little before/after."""
    if k.has(F_RAW_ARGS):
        start = k.raw if k.raw & 1 else (k.raw & 0xFFFF) + first - 0x8000
        return start, start + (k.u32 & 0xFF) - 16
    start = max(0, first + k.start_sel - 2)
    return start, max(start, first + count + 1 - k.end_trim)


def lookup_args(k: Knobs, first: int, count: int, stamps: list[int]) -> tuple[int, int, int]:
    if k.has(F_RAW_ARGS):
        lo = (k.raw >> 8) & 0xFF
        return lo, lo + (k.raw & 0xFF) - 32, k.raw
    lo = max(0, first + k.start_sel - 1)
    hi = max(lo, first + count - k.end_trim)
    if stamps:
        ts = stamps[(k.u32 >> 17) % len(stamps)] + (k.u32 >> 8) % 3 - 1
    else:
        ts = k.raw
    return lo, hi, ts


# -- target "record" -----------------------------------------------------------------------------

_WS: Workspace | None = None


def _workspace() -> Workspace:
    global _WS
    if _WS is None:
        _WS = Workspace()
    return _WS


def record_layout(k: Knobs, rest: bytes) -> tuple[int, int, list[bytes], bytes]:
    """(file size, base address, CommitLog file contents, raw unit bytes) of a record input."""
    fs = 128 << (k.size_sel & 7)
    n_raw = (k.size_sel >> 4) & 7
    raw_units, cl_bytes = rest[:n_raw * CQ_UNIT], rest[n_raw * CQ_UNIT:]
    cl_bytes = cl_bytes[:MAX_CL_FILES * fs]
    files = [cl_bytes[i:i + fs] for i in range(0, len(cl_bytes), fs)] or [b""]
    if k.has(F_EXTRA) and len(files) < MAX_CL_FILES:
        files[-1] = files[-1].ljust(fs, b"\0")
        files.append(bytes(fs))
    base = 2 * fs if k.has(F_CL_BASE) else 0
    return fs, base, files, raw_units


def derive_units(files: list[bytes], fs: int, base: int) -> list[tuple[int, int, int]]:
    """Units the broker's dispatcher would write: walk records file by file (BLANK -> next file),
    stopping at TOTALSIZE <= 0; a record running past its file still gets its unit."""
    units = []
    for idx, data in enumerate(files):
        pos = 0
        while pos + 8 <= len(data) and len(units) < MAX_DERIVED_UNITS:
            total, magic = struct.unpack_from(">iI", data, pos)
            if magic == fm.MAGIC_BLANK:
                break
            if total <= 0:
                return units
            rec = fm.parse_record(data, pos, total)
            dec = fm.decode(rec) if rec else None
            code = fm.java_hash(dec.tags) if dec and dec.tags else 0
            units.append((base + idx * fs + pos, total, code))
            if total > len(data) - pos:
                return units
            pos += total
    return units


def raw_unit_list(raw_units: bytes, fs: int, base: int) -> list[tuple[int, int, int]]:
    out = []
    for i in range(0, len(raw_units) - CQ_UNIT + 1, CQ_UNIT):
        phy, size, code = UNIT.unpack_from(raw_units, i)
        if 0 <= phy < 1 << 24 and base:
            phy += base - fs           # small values are relative: below base -> CL_GONE
        out.append((phy, size, code))
    return out


def queue_of_first_record(files: list[bytes], fs: int, base: int,
                          units: list[tuple[int, int, int]]) -> tuple[str, int]:
    """(topic, queue id) of the first derived unit's record that parses, else ("T", 0): the
    queue a record-target scan names when it checks records against it."""
    for phy, size, _ in units:
        idx, pos = divmod(phy - base, fs)
        rec = fm.parse_record(files[idx], pos, size) if 0 <= idx < len(files) else None
        if rec is not None and rec.topic:
            return rec.topic.decode("utf-8", "surrogateescape"), rec.queue_id
    return "T", 0


def record_target(data: bytes) -> None:
    before = live_batches()
    _record_input(data)
    check_released(before)


def _record_input(data: bytes) -> None:
    k, rest = Knobs.parse(data)
    ws = _workspace()
    fs, base, files, raw_units = record_layout(k, rest)
    units = derive_units(files, fs, base)
    derived = list(units)
    if k.has(F_PREBLANK):
        units = [(0, fm.PREBLANK_SIZE, 0)] * 2 + units
    units += raw_unit_list(raw_units, fs, base)

    starts = [base + i * fs for i in range(len(files))]
    paths = [ws.write(f"cl{i}", d) for i, d in enumerate(files)]
    cl_model = Files(paths, starts, files, fs)
    cq_data = b"".join(UNIT.pack(*u) for u in units)
    cq_size = max(CQ_UNIT, -(-len(cq_data) // CQ_UNIT) * CQ_UNIT)
    if units or k.rows_sel & 1:
        cq_paths = [ws.write("cq0", cq_data)]
        cq_model = Files(cq_paths, [0], [cq_data], cq_size)
    else:
        cq_model = Files([], [], [], cq_size)          # no ConsumeQueue file at all

    model = Model(cl_model)
    cl = native.CommitLog(map_files(paths, starts), fs)
    cq_segs = map_files(cq_model.paths, cq_model.starts)
    check_commitlog(model, cl, [(p, s) for p, s, _ in derived[:8] if s > 0])
    check_cq_files(cq_model, cq_segs, (0, base, base + fs, k.raw & fm.INT64_MAX))
    codes, tags = k.subscription()
    start, end = scan_range(k, 0, len(units))
    queue = queue_of_first_record(files, fs, base, derived) if k.names_queue else None
    check_scan(model, cl, cq_model, cq_segs, start, end, codes, tags, k.max_rows, k.max_bytes,
               k.has(F_VERIFY_CRC), queue)
    stamps = []
    for phy, size, _ in derived:
        try:
            stamps.append(model.record_at(phy, size).store_ts)
        except ModelError:
            pass
    lo, hi, ts = lookup_args(k, 0, len(units), stamps)
    check_lookup(model, cl, cq_model, cq_segs, lo, hi, ts)


# -- target "queue" ------------------------------------------------------------------------------

QUEUE_CL_FILE_SIZE = 2048


def _host(ip: str, port: int) -> bytes:
    return ipaddress.ip_address(ip).packed + struct.pack(">i", port)


def _record(topic: str, body: bytes = b"", props: bytes = b"", *, born=("10.0.0.5", 53210),
            store=("10.0.0.1", 10911), sysflag: int = 0, ts: int = 1_700_000_000_000,
            v2: bool | None = None, qid: int = 0) -> bytes:
    bh, sh = _host(*born), _host(*store)
    sysflag |= (0x10 if len(bh) == 20 else 0) | (0x20 if len(sh) == 20 else 0)
    return rc.encode_record(
        queue_id=qid, flag=0, queue_offset=0, physical_offset=0, sys_flag=sysflag,
        born_timestamp=ts - 7, born_host=bh, store_timestamp=ts, store_host=sh,
        reconsume_times=0, prepared_transaction_offset=0, body=body, topic=topic.encode(),
        properties=props, v2=v2)


def crafted_records() -> dict[str, bytes]:
    """Records covering the format's variants, by name (seeds and the fixed CommitLog use them);
    the last two are corrupt: a wrong BODYCRC, then invalid UTF-8 in the properties. Store times
    follow those of the reference store's records."""
    ts = 1_800_000_000_000
    many_keys = " ".join(f"key{i}" for i in range(120))
    big_props = (f"KEYS\x01 {many_keys}  \x02UNIQ_KEY\x01{'U' * 300}\x02TAGS\x01TagA\x02" +
                 "\x02".join(f"p{i}\x01{'v' * i}" for i in range(1, 25))).encode()
    recs = {
        "v1": _record("T", b"hello", b"TAGS\x01TagA\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01ABC", ts=ts),
        "tag_b": _record("T", b"", b"TAGS\x01TagB", ts=ts + 1),
        "untagged": _record("T", b"untagged", b"", ts=ts + 2),
        "v2": _record("L" * 140, b"v2 body", b"TAGS\x01TagA\x02", ts=ts + 3, v2=True),
        "v6": _record("T", b"v6", b"TAGS\x01Aa", born=("::1", 40000),
                      store=("2001:db8::a:0:1", 10911), ts=ts + 4),
        "mapped": _record("T", b"mapped", b"TAGS\x01BB", born=("::ffff:192.0.2.7", 5),
                          store=("10.1.2.3", -1), ts=ts + 5),
        "zlib_legacy": _record("T", zlib.compress(b"hello " * 40), b"TAGS\x01TagA\x02",
                               sysflag=0x1, ts=ts + 6),
        "zlib_type": _record("T", zlib.compress(b"z" * 99), b"", sysflag=0x301, ts=ts + 7),
        # non-ASCII entry, empty value, empty name, no separator, 0x01 in a value, duplicate
        "props": _record("T", b"props", "TAGS\x01タグ\x02名\x01値\x02e\x01\x02\x01v\x02novalue\x02"
                         "k\x01a\x01b\x02k\x01last\x02".encode(), ts=ts + 8),
        "many": _record("T", b"many",
                        "\x02".join(f"k{i % 20}\x01v{i}" for i in range(45)).encode(), ts=ts + 9),
        "keys": _record("T", b"keys", b"KEYS\x01   \x02TAGS\x01TagB\x02UNIQ_KEY\x01U", ts=ts + 10),
        # long strings: batch buffers grow after a few rows
        "big_props": _record("T", b"b" * 40, big_props, ts=ts + 11),
        "big_body": _record("T", bytes(range(256)) * 6, b"TAGS\x01TagB", ts=ts + 12),
        # over 128 bytes, few entries: a shape a decoder may remember from row to row
        "long_props": _record("T", b"lp", b"src\x01fuzz-corpus-generator-for-rmq-source\x02KEYS\x01KEY-1 ORDER-2\x02"
                              b"UNIQ_KEY\x01C0A8000100002A9F0000000000000001\x02CLUSTER\x01"
                              b"DefaultCluster\x02TAGS\x01TagC\x02seq\x011", ts=ts + 12),
        # multi-byte UTF-8 of every length, also as the last bytes of the properties
        "utf8_edges": _record("T", b"u", "KEYS\x01é ⌘ 😀\x02TAGS\x01タグ\x02n\x01"
                              "\u07ff\ud7ff\U0010ffff".encode(), ts=ts + 12),
        "utf8_topic": _record("Tópico😀", b"t", "x\x01é".encode(), ts=ts + 12),
    }
    bad_crc = bytearray(_record("T", b"bad crc", b"TAGS\x01TagA", ts=ts + 13))
    bad_crc[8:12] = struct.pack(">i", 12345)
    recs["bad_crc"] = bytes(bad_crc)
    recs["bad_utf8"] = _record("T", b"bad utf8", b"TAGS\x01TagB\x02x\x01\xc3\x28", ts=ts + 14)
    return recs


@functools.lru_cache(maxsize=None)
def _fixture_commitlog_head(size: int) -> bytes:
    roots = [SHARED_FIXTURES]
    if os.environ.get("RMQ_FIXTURES", "") not in ("", "auto", "embedded"):
        roots.insert(0, Path(os.environ["RMQ_FIXTURES"]))
    for root in roots:
        try:
            with open(root / FIXTURE_COMMITLOG_REL, "rb") as fh:
                return fh.read(size)
        except OSError:
            pass
    try:
        import tarfile
        with tarfile.open(EMBEDDED_FIXTURES, "r:xz") as tar:
            member = tar.extractfile(FIXTURE_COMMITLOG_REL)
            return member.read(size) if member is not None else b""
    except (OSError, KeyError, tarfile.TarError):
        return b""


def fixture_records(limit: int = 4, max_size: int = 700) -> list[bytes]:
    """A few small records of the RocketMQ 4.9.3 reference store (empty if it is absent)."""
    head = _fixture_commitlog_head(1 << 16)
    out, pos = [], 0
    while pos + 8 <= len(head) and len(out) < limit:
        total, magic = struct.unpack_from(">iI", head, pos)
        if magic not in (fm.MAGIC_V1, fm.MAGIC_V2) or total <= 0 or pos + total > len(head):
            break
        if total <= max_size:
            out.append(head[pos:pos + total])
        pos += total
    return out


def layout_records(records: list[bytes], fs: int, base: int = 0,
                   first_queue_offset: int = 0) -> tuple[list[bytes], list[tuple[int, int]]]:
    """Place records as the broker does (a record goes in only if size + 8 <= space left, else
    a BLANK fills the file), with QUEUEOFFSET and PHYSICALOFFSET set to where they land (the
    CommitLog starting at ``base``); returns full-size files (plus one zero file) and
    (phy, size) of each record."""
    files, placed = [bytearray()], []
    for i, rec in enumerate(records):
        cur = files[-1]
        if len(rec) + 8 > fs - len(cur):
            left = fs - len(cur)
            cur += rc.blank_record(left) + bytes(left - 8)
            files.append(bytearray())
            cur = files[-1]
        phy = base + (len(files) - 1) * fs + len(cur)
        placed.append((phy, len(rec)))
        cur += rec[:20] + struct.pack(">qq", first_queue_offset + i, phy) + rec[36:]
    files[-1] += bytes(fs - len(files[-1]))
    files.append(bytearray(fs))                      # the preallocated next file
    return [bytes(f) for f in files], placed


def fixed_commitlog() -> tuple[list[bytes], list[tuple[int, int, int]]]:
    """The queue target's CommitLog: (file contents, (phy, size, tagsCode) of every record)."""
    files, placed = layout_records(fixture_records() + list(crafted_records().values()),
                                   QUEUE_CL_FILE_SIZE)
    units = []
    for phy, size in placed:
        idx, pos = divmod(phy, QUEUE_CL_FILE_SIZE)
        dec = fm.decode(fm.parse_record(files[idx], pos, size))
        units.append((phy, size, fm.java_hash(dec.tags) if dec and dec.tags else 0))
    return files, units


class QueueTarget:
    """State of the queue target: the fixed CommitLog, mapped once (two views)."""

    def __init__(self) -> None:
        self.ws = _workspace()
        files, self.units = fixed_commitlog()
        fs = QUEUE_CL_FILE_SIZE
        starts = [i * fs for i in range(len(files))]
        paths = [self.ws.write(f"fixed-cl{i}", d) for i, d in enumerate(files)]
        segs = map_files(paths, starts)
        self.views = []
        for drop in (0, 1):       # all files, or the first one deleted by retention
            cl_model = Files(paths[drop:], starts[drop:], files[drop:], fs)
            self.views.append((Model(cl_model), native.CommitLog(segs[drop:], fs)))
        self.stamps = [self.views[0][0].record_at(p, s).store_ts for p, s, _ in self.units]
        for model, cl in self.views:
            check_commitlog(model, cl, [(p, s) for p, s, _ in self.units] + [(0, 1), (fs, 91)])

    def run(self, data: bytes) -> None:
        before = live_batches()
        self._run(data)
        check_released(before)

    def _run(self, data: bytes) -> None:
        k, cq_bytes = Knobs.parse(data)
        model, cl = self.views[1 if k.has(F_CL_BASE) else 0]
        model.trim_cache()
        per_file = 1 + (k.size_sel & 15)
        cq_size = CQ_UNIT * per_file
        first_file = (1 + (k.size_sel >> 4)) * cq_size if k.has(F_EXTRA) else 0
        chunks = [cq_bytes[i:i + cq_size] for i in range(0, len(cq_bytes), cq_size)][:8]
        if k.has(F_PREBLANK) and len(chunks) >= 2:
            chunks[0] = chunks[0][:-(1 + k.misc % CQ_UNIT)]     # a short middle file
        if k.has(F_RAW_ARGS) and k.raw & 2:
            cq_size += 1 + (k.raw >> 2) % 19                     # not a multiple of 20
        starts = [first_file + i * CQ_UNIT * per_file for i in range(len(chunks))]
        paths = [self.ws.write(f"qcq{i}", c) for i, c in enumerate(chunks)]
        cq_model = Files(paths, starts, chunks, cq_size)
        cq_segs = map_files(paths, starts)
        first_q = first_file // CQ_UNIT
        count = len(cq_bytes) // CQ_UNIT
        check_cq_files(cq_model, cq_segs, (0, cl.min_offset, 1 + (k.raw & 0x3FFF)))
        codes, tags = k.subscription()
        start, end = scan_range(k, first_q, count)
        # most crafted records are messages of queue T/0 (record i has QUEUEOFFSET i)
        check_scan(model, cl, cq_model, cq_segs, start, end, codes, tags, k.max_rows, k.max_bytes,
                   k.has(F_VERIFY_CRC), ("T", 0) if k.names_queue else None)
        lo, hi, ts = lookup_args(k, first_q, count, self.stamps)
        check_lookup(model, cl, cq_model, cq_segs, lo, hi, ts)


_QUEUE: QueueTarget | None = None


def queue_target(data: bytes) -> None:
    global _QUEUE
    if _QUEUE is None:
        _QUEUE = QueueTarget()
    _QUEUE.run(data)


TARGETS = {"record": record_target, "queue": queue_target}
