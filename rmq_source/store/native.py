"""Python face of the C core (``native/rmq_core.c``): mapped files, CommitLog/ConsumeQueue reads.

Offsets: a *physical offset* is a byte address in the CommitLog (global across its files); a
*queue offset* is the index of a 20-byte ConsumeQueue unit. Ranges are half-open ``[start, end)``.

Every function validates its arguments here, before calling C, and turns a C error into an
``rmq_source.errors`` exception carrying the C message (file path, byte position, physical and
queue offset): corrupt bytes raise :class:`RmqCorruptStoreError` (``.path``, ``.position``,
``.code``), missing files :class:`RmqStoreLayoutError`, bad arguments :class:`RmqOptionError`.

The extension is built by setup.py (``rmq_source._native``); importing never compiles. With the
environment variable ``RMQ_NATIVE=asan`` (or ``asan-portable``) the AddressSanitizer build made by
``native/asan_build.py`` (module ``_rmq_native_asan`` or ``_rmq_native_asan_portable``, found on
``sys.path``) is used instead.

Batches cross into Arrow through the Arrow C Data Interface: the C core exports one struct array
whose release callback frees the C buffers; the RecordBatch (and any array sliced from it) keeps
them alive, zero-copy.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from rmq_source.errors import RmqCorruptStoreError, RmqOptionError, RmqStoreIOError, RmqStoreLayoutError
from rmq_source.schema import ARROW_SCHEMA, empty_batch

_BUILD = os.environ.get("RMQ_NATIVE", "")

# Sanitizer builds read each file into an exact-size heap copy (so AddressSanitizer sees reads past
# its end) instead of mapping it: their segments do not see bytes written to the file later.
SEGMENTS_FOLLOW_WRITES = not _BUILD.startswith("asan")

if _BUILD == "asan":
    from _rmq_native_asan import ffi, lib  # type: ignore[import-not-found]
elif _BUILD == "asan-portable":
    from _rmq_native_asan_portable import ffi, lib  # type: ignore[import-not-found]
else:
    try:
        from rmq_source._native import ffi, lib  # type: ignore[attr-defined]
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError(
            "the C core rmq_source._native is not built; run `pip install -e .` (or "
            "`python setup.py build_ext --inplace`) in the project root") from exc

__all__ = ["Segment", "map_segment", "memory_segment", "CommitLog", "cq_valid_units", "cq_first_unit_at_or_above",
           "ScanResult", "scan_queue", "QueueFiles", "RangesResult", "scan_ranges", "lookup_time", "live_batches", "buffer_bytes_taken",
           "NATIVE_SCHEMA", "C_SCHEMA",
           "CQ_UNIT_SIZE", "MAX_BATCH_BYTES", "MAX_QUEUE_OFFSET"]

CQ_UNIT_SIZE = 20
INT32_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1
#: Largest queue offset: the ConsumeQueue byte address ``offset * 20`` must fit in an int64.
MAX_QUEUE_OFFSET = INT64_MAX // CQ_UNIT_SIZE
_MAX_QUEUE_OFFSET = MAX_QUEUE_OFFSET
#: Largest ``max_bytes`` of a scan (``rmq_scan_args.max_bytes``): a batch's string and binary
#: columns use Arrow's int32 offsets. The batchBytes option is checked against this value.
MAX_BATCH_BYTES = INT32_MAX

#: The 19 columns a scan returns: ARROW_SCHEMA without topic and brokerName, same order.
NATIVE_SCHEMA = pa.schema([f for f in ARROW_SCHEMA if f.name not in ("topic", "brokerName")])

_STATUS = {lib.RMQ_ST_END: "END", lib.RMQ_ST_FULL: "FULL", lib.RMQ_ST_CQ_END: "CQ_END",
           lib.RMQ_ST_CL_GONE: "CL_GONE"}
_CORRUPT = {lib.RMQ_E_BAD_MAGIC, lib.RMQ_E_TRUNCATED, lib.RMQ_E_SIZE_MISMATCH,
            lib.RMQ_E_NEGATIVE_LENGTH, lib.RMQ_E_UNIT_OUT_OF_RANGE, lib.RMQ_E_BAD_UTF8,
            lib.RMQ_E_CRC_MISMATCH, lib.RMQ_E_BAD_UNIT, lib.RMQ_E_UNIT_MISMATCH,
            lib.RMQ_E_BAD_ENTRY}


def _raise(err) -> None:
    """Turn a filled ``rmq_error`` into the matching exception."""
    code = err.code
    message = ffi.string(err.message).decode("utf-8", "replace")
    path = ffi.string(err.path).decode("utf-8", "surrogateescape") or None
    position = err.position if err.position >= 0 else None
    if code in _CORRUPT:
        raise RmqCorruptStoreError(message, path=path, position=position,
                                   code=ffi.string(lib.rmq_code_name(code)).decode())
    if code == lib.RMQ_E_MISSING_FILE:
        raise RmqStoreLayoutError(message)
    if code == lib.RMQ_E_IO:
        raise RmqStoreIOError(err.sys_errno or None, message, path)
    if code == lib.RMQ_E_NOMEM:
        raise MemoryError(message)
    raise RmqOptionError(message)


def _check_int(name: str, value, lo: int = 0, hi: int = INT64_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RmqOptionError(f"{name} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise RmqOptionError(f"{name} must be in [{lo}, {hi}], got {value}")
    return value


# -- mapped files ----------------------------------------------------------------------------

class Segment:
    """One file mapped read-only by the C core (open/fstat/mmap PROT_READ, MAP_SHARED).

    ``path`` is the file, ``file_start`` the address of its first byte in its queue (the numeric
    file name), ``size`` its length in bytes when mapped (0: empty file, nothing mapped).
    :meth:`close` drops this object's hold on the mapping; the mapping itself is released when no
    :class:`CommitLog` or running call uses it any more (ffi.gc), so closing never invalidates
    memory still in use.
    """

    def __init__(self, handle, path: str, file_start: int, size: int):
        self._handle = handle
        self.path = path
        self.file_start = file_start
        self.size = size
        self._valid_units = 0  # leading valid ConsumeQueue units at the last count (a hint)
        self._first_at_or_above = (0, 0)  # (answer, phy_min) of cq_first_unit_at_or_above

    @property
    def closed(self) -> bool:
        return self._handle is None

    def close(self) -> None:
        self._handle = None

    def _live(self):
        if self._handle is None:
            raise RmqOptionError(f"segment {self.path} is closed")
        return self._handle

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"size={self.size}"
        return f"Segment({self.path!r}, file_start={self.file_start}, {state})"


def map_segment(path: str | os.PathLike, file_start: int) -> Segment:
    """Map ``path`` read-only; ``file_start`` is its start address (the 20-digit file name).

    Raises :class:`RmqStoreLayoutError` if the file does not exist, :class:`RmqStoreIOError` (an
    ``OSError``) if it cannot be opened or mapped.
    """
    path = os.fspath(path)
    if not isinstance(path, str) or not path:
        raise RmqOptionError(f"path must be a non-empty string, got {path!r}")
    _check_int("file_start", file_start)
    err = ffi.new("rmq_error *")
    ptr = lib.rmq_segment_open(path.encode("utf-8", "surrogateescape"), file_start, err)
    if ptr == ffi.NULL:
        _raise(err)
    handle = ffi.gc(ptr, lib.rmq_segment_close)
    return Segment(handle, path, file_start, int(ptr.size))


def memory_segment(data, label: str, file_start: int) -> Segment:
    """A read-only Segment holding the bytes ``data`` (an in-memory file), named ``label`` in
    errors; ``file_start`` is its start address. Used for ConsumeQueue units that come from a
    RocksDB database rather than from files (:mod:`rmq_source.store.rocksdb_queues`)."""
    if not isinstance(label, str) or not label:
        raise RmqOptionError(f"label must be a non-empty string, got {label!r}")
    _check_int("file_start", file_start)
    view = memoryview(data).cast("B")
    fd = os.memfd_create("rmq_source-units", os.MFD_CLOEXEC)
    try:
        done = 0
        while done < len(view):
            done += os.write(fd, view[done:])
        err = ffi.new("rmq_error *")
        ptr = lib.rmq_segment_from_fd(fd, label.encode("utf-8", "surrogateescape"), file_start, err)
    finally:
        os.close(fd)
    if ptr == ffi.NULL:
        _raise(err)
    handle = ffi.gc(ptr, lib.rmq_segment_close)
    return Segment(handle, label, file_start, int(ptr.size))


class _Files:
    """A C ``rmq_files`` view of consecutive segments; keeps the segment handles alive."""

    __slots__ = ("handles", "array", "struct")

    def __init__(self, segments, file_size: int, what: str, dledger_from: int | None = None):
        if isinstance(segments, Segment):
            raise RmqOptionError(f"{what} segments must be a list of Segment, got one Segment")
        segments = list(segments)
        _check_int(f"{what} file size", file_size, 1)
        for i, seg in enumerate(segments):
            if not isinstance(seg, Segment):
                raise RmqOptionError(f"{what} segments must be Segment objects, got {seg!r}")
            if seg.size > file_size:
                raise RmqStoreLayoutError(
                    f"{what} file {seg.path} has {seg.size} bytes, more than the file size "
                    f"{file_size}")
            if i:
                prev = segments[i - 1]
                if seg.file_start <= prev.file_start:
                    raise RmqOptionError(
                        f"{what} segments must be sorted by file_start: {prev.path} "
                        f"({prev.file_start}) comes before {seg.path} ({seg.file_start})")
                if seg.file_start != prev.file_start + file_size:
                    raise RmqStoreLayoutError(
                        f"{what} file missing between {prev.path} (start {prev.file_start}) and "
                        f"{seg.path} (start {seg.file_start}); files must be consecutive with "
                        f"file size {file_size}")
        self.handles = tuple(seg._live() for seg in segments)
        self.array = ffi.new("rmq_segment *[]", max(len(self.handles), 1))
        for i, h in enumerate(self.handles):
            self.array[i] = h
        self.struct = ffi.new("rmq_files *", {"segs": self.array, "count": len(self.handles),
                                              "file_size": file_size})
        if dledger_from is not None:
            self.struct.dledger = 1
            self.struct.dledger_from = _check_int("dledger_from", dledger_from)


class CommitLog:
    """The CommitLog address space as a list of mapped files.

    ``segments`` are sorted by ``file_start`` and consecutive (each starts ``file_size`` bytes
    after the previous one); ``min_offset`` is the first segment's ``file_start`` (0 when empty):
    records below it were deleted by retention. The CommitLog is a snapshot of that file list: it
    keeps the mappings alive itself, so closing its Segments later does not invalidate it.

    ``dledger_from``: the physical offset from which records sit in DLedger entries (a broker
    with ``enableDLegerCommitLog``; its first DLedger data file's start, above the files of a
    CommitLog it wrote before, if any); every record read at or above it must be the body of its
    entry (``BAD_ENTRY`` otherwise). None: the default layout.
    """

    def __init__(self, segments: list[Segment], file_size: int, dledger_from: int | None = None):
        self.segments = list(segments)
        self.file_size = file_size
        self.dledger_from = dledger_from
        self._files = _Files(self.segments, file_size, "CommitLog", dledger_from)
        self.min_offset = self.segments[0].file_start if self.segments else 0

    def valid_end(self, verify_crc: bool = False) -> int:
        """Physical offset one past the last valid record, found as the broker recovers (§2.3).

        The walk starts at position 0 of the third-from-last file; a record that is valid (magic,
        length rule, inside its file, and BODYCRC when ``verify_crc``) advances; a BLANK jumps to
        the next file (in the last file it ends the walk at the BLANK); anything else ends it.
        """
        out = ffi.new("int64_t *")
        err = ffi.new("rmq_error *")
        if lib.rmq_commitlog_valid_end(self._files.struct, bool(verify_crc), out, err):
            _raise(err)
        return int(out[0])

    def store_timestamp(self, phy_offset: int, size: int) -> int:
        """STORETIMESTAMP (epoch ms) of the record at ``phy_offset`` whose TOTALSIZE is ``size``
        (and whose PHYSICALOFFSET field is ``phy_offset``, else ``UNIT_MISMATCH``)."""
        _check_int("phy_offset", phy_offset)
        _check_int("size", size, 1, INT32_MAX)
        out = ffi.new("int64_t *")
        err = ffi.new("rmq_error *")
        if lib.rmq_store_timestamp(self._files.struct, phy_offset, size, out, err):
            _raise(err)
        return int(out[0])

    def __repr__(self) -> str:
        return f"CommitLog({len(self.segments)} files, file_size={self.file_size})"


def cq_valid_units(seg: Segment) -> int:
    """Number of leading valid 20-byte units of a ConsumeQueue file (§2.4: phy >= 0, size > 0).

    Units are only appended to a live file, so a later call on the same mapping re-checks the last
    unit it counted (counting anew if that unit was cut back) and scans only the units after it.
    """
    if not isinstance(seg, Segment):
        raise RmqOptionError(f"seg must be a Segment, got {seg!r}")
    seg._valid_units = int(lib.rmq_cq_valid_units_from(seg._live(), seg._valid_units))
    return seg._valid_units


def cq_first_unit_at_or_above(seg: Segment, phy_min: int) -> int:
    """Index (in the file) of the first valid, non-pre-blank unit with phy >= ``phy_min``.

    Only the leading valid units are considered; when none qualifies the result is their count
    (:func:`cq_valid_units`). Pre-blank filler units (0, 0x7FFFFFFF, 0) never qualify.
    Retention only raises the CommitLog min, so a later call on the same mapping with a
    ``phy_min`` at least as high resumes where the last one stopped.
    """
    if not isinstance(seg, Segment):
        raise RmqOptionError(f"seg must be a Segment, got {seg!r}")
    _check_int("phy_min", phy_min)
    known, known_min = seg._first_at_or_above
    if phy_min < known_min:
        known = 0
    found = int(lib.rmq_cq_first_unit_at_or_above_from(seg._live(), phy_min, known))
    seg._first_at_or_above = (found, phy_min)
    return found


def _check_cq(cq_segments, cq_file_size: int) -> _Files:
    _check_int("cq_file_size", cq_file_size, CQ_UNIT_SIZE)
    if cq_file_size % CQ_UNIT_SIZE:
        raise RmqOptionError(f"cq_file_size must be a multiple of 20, got {cq_file_size}")
    return _Files(cq_segments, cq_file_size, "ConsumeQueue")


def _check_commitlog(commitlog) -> CommitLog:
    # A CommitLog holds its own references to the mappings: closing its Segments afterwards does
    # not invalidate it (it is a snapshot of the file list taken at construction).
    if not isinstance(commitlog, CommitLog):
        raise RmqOptionError(f"commitlog must be a CommitLog, got {commitlog!r}")
    return commitlog


# -- scanning --------------------------------------------------------------------------------

@dataclass(frozen=True)
class ScanResult:
    """Outcome of :func:`scan_queue`.

    ``batch``: NATIVE_SCHEMA columns (bodies as stored, still compressed when sysFlag & 1).
    ``next_offset``: queue offset where scanning stopped; every unit of ``[start, next_offset)``
    was examined (accepted or filtered out). ``scanned`` = ``next_offset - start``.
    ``status``: "END" (reached ``end``), "FULL" (max_rows/max_bytes reached), "CQ_END" (unit at
    ``next_offset`` not written yet), "CL_GONE" (unit at ``next_offset`` points below
    ``commitlog.min_offset``: retention deleted its record).
    """

    batch: pa.RecordBatch
    next_offset: int
    scanned: int
    status: str


def _import_c_schema() -> pa.Schema:
    """The batch type as the C core declares it (Arrow C Data Interface)."""
    c_schema = ffi.new("struct ArrowSchema *")
    if lib.rmq_schema_export(c_schema):
        raise MemoryError("rmq_schema_export failed")
    return pa.Schema._import_from_c(int(ffi.cast("uintptr_t", c_schema)))


#: NATIVE_SCHEMA as exported by the C core; equal to NATIVE_SCHEMA (tests check it).
C_SCHEMA = _import_c_schema()
_EMPTY_BATCH = empty_batch(NATIVE_SCHEMA)


def _to_arrow(batch_ptr) -> pa.RecordBatch:
    """The C batch as a RecordBatch, zero-copy, through the Arrow C Data Interface: the C core
    fills one ArrowArray (a struct of the 19 columns) that owns the batch; Arrow calls its release
    callback, which frees the C buffers, when the last array using them is gone."""
    if batch_ptr.rows == 0:            # polls of live queues often find nothing: skip the import
        lib.rmq_batch_free(batch_ptr)
        return _EMPTY_BATCH
    c_array = ffi.new("struct ArrowArray *")
    if lib.rmq_batch_export(batch_ptr, c_array):      # the batch is freed on failure
        raise MemoryError("rmq_batch_export failed")
    try:
        return pa.RecordBatch._import_from_c(int(ffi.cast("uintptr_t", c_array)), NATIVE_SCHEMA)
    finally:
        if c_array.release != ffi.NULL:   # not moved into Arrow (the import failed)
            c_array.release(c_array)


def _int32_codes(codes) -> list[int]:
    if isinstance(codes, (str, bytes)):
        raise RmqOptionError(f"codes must be a sequence of int32 hash codes, got {codes!r}")
    out = []
    for c in codes:
        _check_int("tag hash code", c, -(1 << 31), INT32_MAX)
        out.append(c)
    return sorted(set(out))


#: the columns a scan may leave out (rmq_core.h, rmq_scan_args.skip) and the bit of each
_SKIPPABLE = {"msgId": lib.RMQ_SKIP_MSGID, "bornHost": lib.RMQ_SKIP_HOSTS,
              "storeHost": lib.RMQ_SKIP_HOSTS, "properties": lib.RMQ_SKIP_PROPS,
              "keys": lib.RMQ_SKIP_KEYS, "uniqKey": lib.RMQ_SKIP_UNIQ, "tags": lib.RMQ_SKIP_TAGS}


def skip_bits(needed) -> int:
    """The ``skip`` of a scan whose caller needs only the columns ``needed`` (names of the row
    schema; None: every column): the bits of the columns the C core may then leave out (left
    out, they come back empty or null, see rmq_core.h). bornHost and storeHost go together."""
    if needed is None:
        return 0
    needed = set(needed)
    bits = 0
    for name, bit in _SKIPPABLE.items():
        if name not in needed:
            bits |= bit
    if needed & {"bornHost", "storeHost"}:
        bits &= ~lib.RMQ_SKIP_HOSTS
    return bits


def _scan_args(keep: list, start: int, end: int, max_rows: int, max_bytes: int, verify_crc: bool,
               codes, tags, topic, queue_id, skip: int = 0):
    """The C arguments of a scan or decode; ``keep`` holds the C memory they point to."""
    if not 0 <= skip <= lib.RMQ_SKIP_ALL:
        raise RmqOptionError(f"skip must be RMQ_SKIP_* bits (0..{lib.RMQ_SKIP_ALL}), got {skip!r}")
    args = ffi.new("rmq_scan_args *")
    keep.append(args)
    args.start, args.end, args.max_rows, args.max_bytes = start, end, max_rows, max_bytes
    args.verify_crc = bool(verify_crc)
    args.skip = skip
    if codes is not None:
        code_list = _int32_codes(codes)
        c_codes = ffi.new("int32_t[]", code_list or [0])
        keep.append(c_codes)
        args.filter = 1
        args.codes = c_codes
        args.ncodes = len(code_list)
    if tags is not None:
        if isinstance(tags, (str, bytes)):
            raise RmqOptionError(f"tags must be a sequence of strings, got {tags!r}")
        encoded = []
        for t in tags:
            if not isinstance(t, str):
                raise RmqOptionError(f"tags must be strings, got {t!r}")
            encoded.append(t.encode("utf-8"))
        c_strs = [ffi.new("char[]", t) for t in encoded]
        c_tags = ffi.new("char *[]", c_strs or [ffi.NULL])
        c_lens = ffi.new("int32_t[]", [len(t) for t in encoded] or [0])
        keep.extend((c_strs, c_tags, c_lens))
        args.check_tags = 1
        args.tags = c_tags
        args.tag_lens = c_lens
        args.ntags = len(encoded)
    if topic is not None:
        if not isinstance(topic, str) or not topic:
            raise RmqOptionError(f"topic must be a non-empty string, got {topic!r}")
        _check_int("queue_id", queue_id, -(1 << 31), INT32_MAX)
        # the folder name's bytes (a name that is not UTF-8 comes from listdir as surrogates)
        topic_bytes = topic.encode("utf-8", "surrogateescape")
        if len(topic_bytes) > INT32_MAX:
            raise RmqOptionError("topic is too long")
        c_topic = ffi.new("char[]", topic_bytes)
        keep.append(c_topic)
        args.check_queue = 1
        args.topic = c_topic
        args.topic_len = len(topic_bytes)
        args.queue_id = queue_id
    return args


def scan_queue(commitlog: CommitLog, cq_segments: list[Segment], cq_file_size: int, start: int,
               end: int, *, codes: tuple[int, ...] | None = None,
               tags: tuple[str, ...] | None = None, max_rows: int = 65536,
               max_bytes: int = 64 << 20, verify_crc: bool = False, topic: str | None = None,
               queue_id: int | None = None, skip: int = 0) -> ScanResult:
    """Decode the messages of queue offsets ``[start, end)`` of one ConsumeQueue.

    ``cq_segments``: the queue's files sorted by file_start, consecutive (``cq_file_size`` apart);
    unit n lives at byte ``n * 20`` of the queue's address space. ``codes=None`` accepts every
    unit; otherwise a unit is accepted only if the low 32 bits of its tagsCode are in ``codes``
    (rejected units never touch the CommitLog) and, when ``tags`` is given, the record's TAGS
    property equals one of ``tags`` exactly (removes hash collisions such as "Aa"/"BB").
    ``codes=()`` accepts nothing. Pre-blank units (0, 0x7FFFFFFF, 0) are skipped as the leading
    run of the queue's first file (``cq_segments[0]``), where the broker writes them; one after a
    written unit raises :class:`RmqCorruptStoreError` ``BAD_UNIT`` naming the ConsumeQueue file
    and the unit's position, whatever the subscription.

    Stops with "FULL" before a row that would exceed ``max_rows`` rows or ``max_bytes`` bytes of
    body + properties + string data (at least one row is always accepted), "CQ_END" at the first
    unwritten unit, "CL_GONE" at an accepted unit below ``commitlog.min_offset``.
    ``verify_crc`` checks BODYCRC. ``skip``: columns left out (:func:`skip_bits`). A record that
    is not what the broker writes raises :class:`RmqCorruptStoreError` (path, position of the
    record in its file, code).

    Each accepted unit's record must be that unit's message, else ``UNIT_MISMATCH`` (naming the
    record's CommitLog file and position, and the unit's queue offset): its PHYSICALOFFSET must
    be the unit's physical offset; with ``topic`` and ``queue_id`` (the queue being read; give
    both or neither) also its TOPIC, QUEUEID and QUEUEOFFSET must be ``topic``, ``queue_id`` and
    the unit's queue offset - or, for light message queues and other multi-dispatch queues whose
    units point at the parent topic's records, the record's INNER_MULTI_DISPATCH property must
    list ``topic`` with the unit's queue offset at the same index of INNER_MULTI_QUEUE_OFFSET
    (and QUEUEID be ``queue_id`` unless ``queue_id`` is 0).
    """
    _check_commitlog(commitlog)
    cq = _check_cq(cq_segments, cq_file_size)
    _check_int("start", start, 0, _MAX_QUEUE_OFFSET)
    _check_int("end", end, 0, _MAX_QUEUE_OFFSET)
    if end < start:
        raise RmqOptionError(f"end ({end}) must be >= start ({start})")
    _check_int("max_rows", max_rows, 1)
    _check_int("max_bytes", max_bytes, 1, MAX_BATCH_BYTES)
    if tags is not None and codes is None:
        raise RmqOptionError("tags needs codes (the tag hash codes of the same subscription)")
    if (topic is None) != (queue_id is None):
        raise RmqOptionError("topic and queue_id go together (the queue being read): give both "
                             f"or neither, got topic={topic!r}, queue_id={queue_id!r}")
    keep: list = []
    args = _scan_args(keep, start, end, max_rows, max_bytes, verify_crc, codes, tags, topic, queue_id,
                      skip)
    out = ffi.new("rmq_batch **")
    err = ffi.new("rmq_error *")
    rc = lib.rmq_scan_queue(commitlog._files.struct, cq.struct, args, out, err)
    if rc:
        _raise(err)
    ptr = out[0]
    next_offset, scanned, status = int(ptr.next_offset), int(ptr.scanned), _STATUS[ptr.status]
    return ScanResult(_to_arrow(ptr), next_offset, scanned, status)


class QueueFiles:
    """The mapped files of one ConsumeQueue, checked once, for :func:`scan_ranges` (the arguments
    of :func:`scan_queue`'s ``cq_segments`` and ``cq_file_size``). Keeps the mappings alive."""

    __slots__ = ("segments", "file_size", "_files", "segments_of")

    def __init__(self, cq_segments: list[Segment], cq_file_size: int):
        self.segments_of = cq_segments     # the list given (its holder may compare it)
        self.segments = list(cq_segments)
        self.file_size = cq_file_size
        self._files = _check_cq(self.segments, cq_file_size)


@dataclass(frozen=True)
class RangesResult:
    """Outcome of :func:`scan_ranges`: ranges ``[0, done)`` were examined, in order.

    ``batch``: their rows, range after range (NATIVE_SCHEMA, as :class:`ScanResult`'s);
    ``rows[i]``, ``next_offsets[i]`` and ``statuses[i]`` (numpy arrays of ``done`` entries): the
    rows range i gave, where its scan stopped, and its status as :class:`ScanResult` names it
    ("END", "FULL", "CQ_END", "CL_GONE"). Every range before ``done - 1`` ended with "END"."""

    batch: pa.RecordBatch
    done: int
    rows: np.ndarray
    next_offsets: np.ndarray
    statuses: list[str]


def _offsets_array(name: str, values, n: int, lo: int, hi: int, dtype) -> np.ndarray:
    try:
        arr = np.array(values, dtype=dtype)
    except (OverflowError, TypeError, ValueError) as exc:
        raise RmqOptionError(f"{name} must be integers in [{lo}, {hi}]: {exc}") from None
    if arr.shape != (n,):
        raise RmqOptionError(f"{name} must hold one entry per range ({n}), got shape {arr.shape}")
    if n and (arr.min() < lo or arr.max() > hi):
        raise RmqOptionError(f"{name} must be in [{lo}, {hi}], got {arr.min()}..{arr.max()}")
    return arr


def scan_ranges(commitlog: CommitLog, queues: list[QueueFiles], starts, ends, queue_ids, *,
                topic: str, codes: tuple[int, ...] | None = None,
                tags: tuple[str, ...] | None = None, max_rows: int = 65536,
                max_bytes: int = 64 << 20, verify_crc: bool = False, skip: int = 0) -> RangesResult:
    """:func:`scan_queue` of several queues of ``topic`` in one call, into one batch: range i is
    queue offsets ``[starts[i], ends[i])`` of ``queues[i]``, the queue ``queue_ids[i]``; rows
    come range after range. ``max_rows`` and ``max_bytes`` bound the whole batch (at least one
    row is accepted, from the first range that has one).

    The scan stops after the first range whose status is not "END" ("FULL": the batch is full,
    that range goes on from its ``next_offsets`` entry in another call; "CQ_END", "CL_GONE" as
    :func:`scan_queue`), so the caller follows each range's progress. A corrupt record raises
    :class:`RmqCorruptStoreError` naming its file and position, as :func:`scan_queue` does.
    """
    _check_commitlog(commitlog)
    n = len(queues)
    if n < 1:
        raise RmqOptionError("scan_ranges needs at least one range")
    for q in queues:
        if not isinstance(q, QueueFiles):
            raise RmqOptionError(f"queues must be QueueFiles, got {q!r}")
    c_starts = _offsets_array("starts", starts, n, 0, _MAX_QUEUE_OFFSET, np.int64)
    c_ends = _offsets_array("ends", ends, n, 0, _MAX_QUEUE_OFFSET, np.int64)
    if (c_ends < c_starts).any():
        i = int(np.argmax(c_ends < c_starts))
        raise RmqOptionError(f"range {i}: end ({c_ends[i]}) must be >= start ({c_starts[i]})")
    c_qids = _offsets_array("queue_ids", queue_ids, n, -(1 << 31), INT32_MAX, np.int32)
    _check_int("max_rows", max_rows, 1)
    _check_int("max_bytes", max_bytes, 1, MAX_BATCH_BYTES)
    if tags is not None and codes is None:
        raise RmqOptionError("tags needs codes (the tag hash codes of the same subscription)")
    keep: list = []
    args = _scan_args(keep, 0, 0, max_rows, max_bytes, verify_crc, codes, tags, topic, 0, skip)
    rows = np.zeros(n, np.int64)
    nexts = np.zeros(n, np.int64)
    statuses = np.zeros(n, np.int32)
    cqs = ffi.new("rmq_files *[]", [q._files.struct for q in queues])
    r = ffi.new("rmq_ranges *", {
        "n": n, "cqs": cqs,
        "starts": ffi.from_buffer("int64_t[]", c_starts),
        "ends": ffi.from_buffer("int64_t[]", c_ends),
        "queue_ids": ffi.from_buffer("int32_t[]", c_qids),
        "rows": ffi.from_buffer("int64_t[]", rows, require_writable=True),
        "next_offsets": ffi.from_buffer("int64_t[]", nexts, require_writable=True),
        "statuses": ffi.from_buffer("int32_t[]", statuses, require_writable=True)})
    out = ffi.new("rmq_batch **")
    err = ffi.new("rmq_error *")
    if lib.rmq_scan_ranges(commitlog._files.struct, args, r, out, err):
        _raise(err)
    done = int(r.done)
    return RangesResult(_to_arrow(out[0]), done, rows[:done], nexts[:done],
                        [_STATUS[s] for s in statuses[:done].tolist()])


def decode_records(body: bytes, *, where: str, topic: str, queue_id: int, start: int, end: int,
                   tags: tuple[str, ...] | None = None, verify_crc: bool = False, skip: int = 0
                   ) -> tuple[pa.RecordBatch, int]:
    """Decode the CommitLog records of a PULL_MESSAGE answer ``body`` (records end to end).

    Returns the NATIVE_SCHEMA batch of the messages with queue offsets in ``[start, end)`` (bodies
    as stored) and the queue offset after the last record examined (at least ``start``). Every
    record must be a message of (``topic``, ``queue_id``) in ascending queue offset; with ``tags``
    (the subscription's) a record whose TAGS is none of them is left out, since the broker filters
    by hash code only. A record that is not what the broker stores raises RmqCorruptStoreError
    naming ``where`` and the byte position in the answer.
    """
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise RmqOptionError(f"body must be bytes, got {type(body).__name__}")
    if not isinstance(where, str) or not where:
        raise RmqOptionError("where must name the answer (for error messages)")
    if topic is None or queue_id is None:
        raise RmqOptionError("topic and queue_id name the queue the answer is for: both are required")
    _check_int("start", start, 0, _MAX_QUEUE_OFFSET)
    _check_int("end", end, 0, _MAX_QUEUE_OFFSET)
    if end < start:
        raise RmqOptionError(f"end ({end}) must be >= start ({start})")
    data = body if isinstance(body, (bytes, memoryview)) else bytes(body)   # (a bytearray may change)
    keep: list = []
    args = _scan_args(keep, start, end, INT64_MAX, MAX_BATCH_BYTES, verify_crc,
                      None, tags, topic, queue_id, skip)
    c_buf = ffi.from_buffer("uint8_t[]", data)
    c_where = ffi.new("char[]", where.encode("utf-8", "replace"))
    out = ffi.new("rmq_batch **")
    err = ffi.new("rmq_error *")
    rc = lib.rmq_decode_records(c_buf, len(data), c_where, args, out, err)
    if rc:
        _raise(err)
    ptr = out[0]
    if ptr.status != 0:     # END: an answer is far below the batch limits
        lib.rmq_batch_free(ptr)
        raise RmqCorruptStoreError(f"{where}: the answer's records exceed one batch "
                                   f"({len(data)} bytes)", path=where, position=0)
    next_offset = int(ptr.next_offset)
    return _to_arrow(ptr), next_offset


def live_batches() -> int:
    """C batches allocated and not yet freed (a leak check: 0 once every batch is dropped)."""
    return int(lib.rmq_live_batches())


def buffer_bytes_taken() -> int:
    """Bytes of batch buffers the C core has taken so far (pooled or allocated), cumulative: a
    check that scans size their buffers from the records they read, never from a ConsumeQueue
    unit's size alone."""
    return int(lib.rmq_buffer_bytes_taken())


def lookup_time(commitlog: CommitLog, cq_segments: list[Segment], cq_file_size: int,
                min_offset: int, max_offset: int, timestamp_ms: int) -> int:
    """Smallest queue offset in ``[min_offset, max_offset)`` whose storeTimestamp >= timestamp_ms.

    RocketMQ 5 ``BoundaryType.LOWER`` semantics by binary search (store times grow with the queue
    offset). Returns ``max_offset`` when every message is older, ``min_offset`` when none is.
    Units whose CommitLog file is gone (phy < ``commitlog.min_offset``) and the leading pre-blank
    units of the queue's first file count as older. Every unit in the range must be written, and
    a pre-blank unit after written units is damage (RmqCorruptStoreError BAD_UNIT). A record read
    must hold its unit's physical offset in its PHYSICALOFFSET field (else ``UNIT_MISMATCH``).
    """
    _check_commitlog(commitlog)
    cq = _check_cq(cq_segments, cq_file_size)
    _check_int("min_offset", min_offset, 0, _MAX_QUEUE_OFFSET)
    _check_int("max_offset", max_offset, 0, _MAX_QUEUE_OFFSET)
    if max_offset < min_offset:
        raise RmqOptionError(f"max_offset ({max_offset}) must be >= min_offset ({min_offset})")
    _check_int("timestamp_ms", timestamp_ms, -(1 << 63), INT64_MAX)
    out = ffi.new("int64_t *")
    err = ffi.new("rmq_error *")
    if lib.rmq_lookup_time(commitlog._files.struct, cq.struct, min_offset, max_offset,
                           timestamp_ms, out, err):
        _raise(err)
    return int(out[0])
