"""Append messages to a store directory exactly as a RocketMQ 4.9.3 broker lays it out.

:class:`StoreWriter` writes ``commitlog/`` (files named by their 20-digit start offset, created at
full size, the next file preallocated, a BLANK record when ``record + 8 > remaining``),
``consumequeue/<topic>/<queueId>/`` (20-byte units, files created on demand), ``config/topics.json``
and ``checkpoint``. Readers may read the store while it is written: a record is completely in the
CommitLog (its MAGIC written last) before its ConsumeQueue unit appears (its size written last).

Reopening a store resumes it as a broker restart would: the CommitLog end and every queue's max
offset are recovered with the broker's rules (format doc §2.3, §2.4) through :mod:`rmq_source.store.native`;
garbage after the valid end is zeroed, records missing from their ConsumeQueue are dispatched again.

One writer per store: the writer holds the broker's lock on ``<root>/lock`` (a running broker holds
the same lock) and marks the store running with ``<root>/abort`` until :meth:`StoreWriter.close`. A
writer is not thread-safe; use it from one thread.
"""
from __future__ import annotations

import errno
import inspect
import fcntl
import mmap
import os
import re
import struct
import time
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from rmq_source.store import record_codec as rc
from rmq_source.store.config_files import dump_fastjson, load_config_json, write_config_atomic
from rmq_source.errors import (RmqCorruptStoreError, RmqMissingDependencyError, RmqOptionError,
                               RmqSourceError, RmqStoreLayoutError, RmqUnknownTopicError)
from rmq_source.subscription import tags_code

DEFAULT_COMMITLOG_FILE_SIZE = 1 << 30
DEFAULT_CQ_UNITS_PER_FILE = 300_000
DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024
CHECKPOINT_SIZE = 4096
MAX_QUEUES = 65535
PERM_WRITE = 2
_FILE_NAME = re.compile(r"^\d{20}$")
_ZERO_CHUNK = bytes(1 << 20)
_INT64_MAX = (1 << 63) - 1
_INT32_MAX = (1 << 31) - 1
_CHECKPOINT = struct.Struct(">qqq")
_I64 = struct.Struct(">q")

_locked_roots: set[str] = set()   # POSIX record locks do not exclude the same process
_APPEND_OPTIONS = frozenset({"selector", "selector_arg", "keys", "properties", "flag",
                             "born_timestamp", "store_timestamp", "born_host", "store_host",
                             "compression", "reconsume_times", "uniq_key",
                             "prepared_transaction_offset", "sys_flag_extra"})
_CQ_PACK = rc.CQ_UNIT.pack_into
_tuple_new = tuple.__new__
_time_ns = time.time_ns      # module-level aliases: append's fast path is a few microseconds
_crc32 = zlib.crc32
_COUNTER = rc._COUNTER
_COUNTER_HEX = [f"{i:04X}".encode("ascii") for i in range(1 << 16)]   # UNIQ_KEY counter part


class AppendResult(NamedTuple):
    """Where a message went. ``queue_offset`` is ``None`` for transaction PREPARED/ROLLBACK records,
    which the broker keeps in the CommitLog only; ``msg_id`` is the offset message id (§5.1)."""

    topic: str
    queue_id: int
    queue_offset: int | None
    commitlog_offset: int
    size: int
    msg_id: str


class Message(NamedTuple):
    """What a queue selector sees of the message being appended (``MessageQueueSelector``'s msg)."""

    topic: str
    body: bytes
    tags: str | None
    keys: Any
    properties: Mapping[str, str] | None


QueueSelector = Callable[[list, Message, Any], int]


# ------------------------------------------------------------------------------------ validation

def _int_arg(name: str, value: Any, lo: int, hi: int) -> int:
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, int)):
        raise RmqOptionError(f"{name} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise RmqOptionError(f"{name}={value} is out of range [{lo}, {hi}]")
    return value


def validate_topic(topic: Any) -> bytes:
    """Topic bytes, or :class:`RmqOptionError` unless the name is 1..32767 broker-valid characters
    (``A-Z a-z 0-9 _ % - |``; names over 127 characters are stored in the V2 record format)."""
    if not isinstance(topic, str) or not topic:
        raise RmqOptionError(f"topic must be a non-empty string, got {topic!r}")
    if len(topic) > rc.MAX_TOPIC_LENGTH:
        raise RmqOptionError(f"topic is {len(topic)} characters, at most {rc.MAX_TOPIC_LENGTH} allowed")
    bad = set(topic) - rc.TOPIC_CHARS
    if bad:
        raise RmqOptionError(f"topic {topic!r} has invalid characters {sorted(bad)!r}; allowed: "
                             "A-Z a-z 0-9 _ % - |")
    return topic.encode("ascii")


@lru_cache(maxsize=256)
def _cached_host(text: str, option: str) -> rc.Host:
    return rc.parse_host(text, option=option)


def _host(text: Any, option: str) -> rc.Host:
    if type(text) is not str:
        return rc.parse_host(text, option=option)    # raises the option error
    return _cached_host(text, option)


def _file_name(start: int) -> str:
    return f"{start:020d}"


def _list_files(folder: Path) -> list[tuple[int, Path]]:
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted((int(n), folder / n) for n in names if _FILE_NAME.match(n))


def _data_ranges(fd: int, pos: int, size: int):
    """(start, end) ranges of ``[pos, size)`` that may hold data; holes of sparse files are skipped
    with SEEK_DATA/SEEK_HOLE where the file system supports them."""
    try:
        while pos < size:
            try:
                data = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:   # no data after pos
                    return
                raise
            hole = min(os.lseek(fd, data, os.SEEK_HOLE), size)
            yield data, hole
            pos = hole
    except (OSError, AttributeError):
        yield pos, size


def _zero_from(mm: mmap.mmap, fd: int, pos: int) -> None:
    """Zero every non-zero byte of ``mm`` from ``pos`` on (leftovers of an interrupted write), front
    to back so a reader never sees a record header ahead of zeros it could mistake for data."""
    step = len(_ZERO_CHUNK)
    for start, end in list(_data_ranges(fd, pos, len(mm))):
        while start < end:
            n = min(step, end - start)
            if mm[start:start + n] != _ZERO_CHUNK[:n]:
                mm[start:start + n] = _ZERO_CHUNK[:n]
            start += n


def _publish(mm: mmap.mmap, pos: int, data: bytes) -> None:
    """Copy records to ``mm[pos:]`` so that a concurrent reader never sees a valid magic before the
    bytes it announces: everything after the first 8 bytes, then TOTALSIZE, then MAGIC last."""
    mm[pos + 8:pos + len(data)] = memoryview(data)[8:]
    mm[pos:pos + 4] = data[:4]
    mm[pos + 4:pos + 8] = data[4:8]


class _MappedFile:
    """One full-size mapped file, opened read-write (created sparse and zero-filled when new)."""

    __slots__ = ("path", "start", "size", "fd", "mm")

    def __init__(self, path: Path, start: int, size: int, *, create: bool):
        self.path, self.start, self.size = path, start, size
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        self.fd = os.open(path, flags, 0o644)
        try:
            actual = os.fstat(self.fd).st_size
            if actual == 0 and create:
                os.ftruncate(self.fd, size)
            elif actual != size:
                raise RmqStoreLayoutError(f"{path}: file is {actual} bytes, expected {size} (every "
                                          "mapped file of a queue has the same size)")
            self.mm = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        if self.mm is not None:
            self.mm.close()
            self.mm = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _Queue:
    """Write state of one ConsumeQueue: ``next_offset`` is the queue offset the next unit gets."""

    __slots__ = ("topic", "queue_id", "folder", "next_offset", "file", "mm", "file_first",
                 "file_end")

    def __init__(self, topic: str, queue_id: int, folder: Path, next_offset: int):
        self.topic, self.queue_id, self.folder = topic, queue_id, folder
        self.next_offset = next_offset
        self.file: _MappedFile | None = None
        self.mm: mmap.mmap | None = None
        self.file_first = 0   # queue offset of the first unit of the mapped file
        self.file_end = 0     # one past its last unit


@dataclass
class _Topic:
    name: str
    raw: bytes
    read_queues: int
    write_queues: int
    perm: int
    order: bool
    extra: dict          # fields of an existing topics.json entry we do not manage
    round_robin: int = 0
    sized_from_folders: bool = False   # no topics.json entry: queue count taken from the folders
    queue_list: list = field(default_factory=list)   # queue id -> _Queue (or None), for speed

    def __post_init__(self) -> None:
        v2 = len(self.raw) > rc.V1_MAX_TOPIC_LENGTH
        self.magic = rc.MAGIC_V2 if v2 else rc.MAGIC_V1
        self.magic_bytes = self.magic.to_bytes(4, "big", signed=True)
        self.len_bytes = len(self.raw).to_bytes(2 if v2 else 1, "big")
        self.topic_part = self.len_bytes + self.raw              # TOPICLENGTH field + topic
        self.len_part = len(self.topic_part)


class StoreWriter:
    """Writes a broker store at ``root`` (created if missing; resumed if it holds data).

    ``commitlog_file_size`` (bytes) and ``cq_units_per_file`` default to the sizes of the existing
    files, or to the broker defaults (1 GiB, 300,000 units) for a new store; an explicit value that
    contradicts existing files raises :class:`RmqOptionError`. ``store_host``/``born_host`` are
    ``"ip:port"`` defaults for every message (IPv6 gives 20-byte host fields and the V6 SYSFLAG bits).
    ``properties_style`` ``"4.9.3"`` writes properties without a trailing ``\\x02``, ``"5.3.3"`` with
    one (and zlib compression with the 5.x type bits). ``max_message_size`` limits the whole record
    (4.9.3 rule) or, in 5.3.3 style, the body.
    """

    def __init__(self, root: str | os.PathLike, *, broker_name: str = "broker-a",
                 commitlog_file_size: int | None = None, cq_units_per_file: int | None = None,
                 store_host: str = "127.0.0.1:10911", born_host: str = "127.0.0.1:53210",
                 properties_style: str = "4.9.3", compression_level: int = 5,
                 max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE):
        if not isinstance(root, (str, os.PathLike)) or not str(root):
            raise RmqOptionError(f"root must be a directory path, got {root!r}")
        if not isinstance(broker_name, str) or not broker_name:
            raise RmqOptionError(f"broker_name must be a non-empty string, got {broker_name!r}")
        if properties_style not in rc.PROPERTIES_STYLES:
            raise RmqOptionError(f"properties_style={properties_style!r} must be one of "
                                 f"{', '.join(rc.PROPERTIES_STYLES)}")
        if commitlog_file_size is not None:
            _int_arg("commitlog_file_size", commitlog_file_size, 128, _INT32_MAX)
        if cq_units_per_file is not None:
            _int_arg("cq_units_per_file", cq_units_per_file, 1, _INT32_MAX // rc.CQ_UNIT_SIZE)
        self._level = _int_arg("compression_level", compression_level, 0, 22)
        self._max_message_size = _int_arg("max_message_size", max_message_size, 1, _INT32_MAX)
        self.root = Path(root)
        self.broker_name = broker_name
        self.properties_style = properties_style
        self.store_host = _host(store_host, "store_host")
        self.born_host = _host(born_host, "born_host")
        self._uniq = rc.UniqKeyFactory()
        # TAGS value (None = no tag) -> (tagsCode, PROPERTIESLENGTH + property bytes before the
        # UNIQ_KEY value, PROPERTIESLENGTH) for the default born host
        self._props_tail = b"\x02WAIT\x01true" + (b"\x02" if properties_style == "5.3.3" else b"")
        self._tag_props: dict[str | None, tuple[int, bytes, int]] = {}
        self._tag_props[None] = self._fast_props_info(0, b"UNIQ_KEY\x01")
        self._uk_ms = -1
        self._uk_prefix = b""
        self._bh_field, self._sh_field = self.born_host.field, self.store_host.field
        self._head = rc.header_struct(len(self._bh_field), len(self._sh_field))
        # the fixed fields after TOTALSIZE and MAGIC, and where the body starts
        self._head_rest = struct.Struct(">" + self._head.format[3:])
        self._body_at = self._head.size
        self._sh_hex = self._sh_field.hex().upper()
        self._sys_flag = ((rc.FLAG_BORNHOST_V6 if self.born_host.is_v6 else 0)
                          | (rc.FLAG_STOREHOST_V6 if self.store_host.is_v6 else 0))
        self._fixed_len = 74 + len(self._bh_field) + len(self._sh_field)
        self._topics: dict[str, _Topic] = {}
        self._fast_topics: dict[str, _Topic] = {}
        self._queues: dict[tuple[str, int], _Queue] = {}
        self._other_topics: dict[str, dict] = {}
        self._data_version: dict = {}
        self._topics_dirty = False
        self._last_store_ts = 0
        self._last_dispatch_ts = 0
        self._cl: _MappedFile | None = None
        self._next_cl: _MappedFile | None = None
        self._pos = 0
        self._lock_fd = -1
        self._closed = True
        self._real_root = ""

        self.root.mkdir(parents=True, exist_ok=True)
        self._acquire_lock()
        try:
            self._closed = False
            self._commitlog_dir = self.root / "commitlog"
            self._cq_root = self.root / "consumequeue"
            self._commitlog_dir.mkdir(exist_ok=True)
            self._cq_root.mkdir(exist_ok=True)
            (self.root / "abort").touch()
            self.commitlog_file_size = self._infer_commitlog_size(commitlog_file_size)
            self.cq_file_size = self._infer_cq_size(cq_units_per_file)
            self.cq_units_per_file = self.cq_file_size // rc.CQ_UNIT_SIZE
            # records up to this size need no further size check (larger: general path decides)
            self._fast_max_total = min(self._max_message_size, self.commitlog_file_size - 8)
            self._load_topics()
            self._recover()
            if self._topics_dirty or not (self.root / "config" / "topics.json").exists():
                self._write_topics()
            self._ensure_checkpoint()
        except BaseException:
            self._abandon()
            raise

    # ------------------------------------------------------------------------------ lock, sizes

    def _acquire_lock(self) -> None:
        real = os.path.realpath(self.root)
        if real in _locked_roots:
            raise RmqSourceError(f"store {self.root} is already open by a StoreWriter in this process")
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        except OSError:
            os.close(fd)
            raise RmqSourceError(f"store {self.root} is locked by another process (a running broker "
                                 f"or another StoreWriter holds {self.root}/lock)") from None
        if os.fstat(fd).st_size == 0:
            os.write(fd, b"lock")
        self._lock_fd = fd
        self._real_root = real
        _locked_roots.add(real)

    def _release_lock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)   # closing the descriptor drops the record lock
            self._lock_fd = -1
            _locked_roots.discard(self._real_root)

    def _infer_commitlog_size(self, given: int | None) -> int:
        files = _list_files(self._commitlog_dir)
        sizes = {p.stat().st_size for _, p in files}
        sizes.discard(0)
        if not files or not sizes:
            return given if given is not None else DEFAULT_COMMITLOG_FILE_SIZE
        if len(sizes) != 1:
            raise RmqStoreLayoutError(f"{self._commitlog_dir}: CommitLog files have different sizes "
                                      f"{sorted(sizes)}")
        actual = sizes.pop()
        if given is not None and given != actual:
            raise RmqOptionError(f"commitlog_file_size={given} contradicts the existing files of "
                                 f"{self._commitlog_dir} ({actual} bytes)")
        return actual

    def _infer_cq_size(self, units: int | None) -> int:
        given = None if units is None else units * rc.CQ_UNIT_SIZE
        actual = None
        for topic_dir in sorted(self._cq_root.iterdir()) if self._cq_root.is_dir() else []:
            for qdir in sorted(topic_dir.iterdir()) if topic_dir.is_dir() else []:
                for _, p in _list_files(qdir):
                    size = p.stat().st_size
                    if size == 0:
                        continue
                    if size % rc.CQ_UNIT_SIZE:
                        raise RmqStoreLayoutError(f"{p}: ConsumeQueue file size {size} is not a "
                                                  "multiple of 20")
                    if actual is not None and size != actual:
                        raise RmqStoreLayoutError(f"{p}: ConsumeQueue file is {size} bytes, other "
                                                  f"files are {actual}")
                    actual = size
        if actual is None:
            return given if given is not None else DEFAULT_CQ_UNITS_PER_FILE * rc.CQ_UNIT_SIZE
        if given is not None and given != actual:
            raise RmqOptionError(f"cq_units_per_file={units} contradicts the existing ConsumeQueue "
                                 f"files ({actual // rc.CQ_UNIT_SIZE} units)")
        return actual

    # ------------------------------------------------------------------------------------ topics

    def _load_topics(self) -> None:
        data = load_config_json(self.root / "config" / "topics.json")
        if data is None:
            self._data_version = {"counter": 0, "timestamp": rc.now_ms()}
            if set(self.broker_name) <= rc.TOPIC_CHARS:
                # the broker creates a topic named after itself (1 queue, perm 7); a hint for readers
                self._adopt_topic(self.broker_name, {"readQueueNums": 1, "writeQueueNums": 1,
                                                     "perm": 7})
            return
        if not isinstance(data, dict) or not isinstance(data.get("topicConfigTable", {}), dict):
            raise RmqStoreLayoutError(f"{self.root}/config/topics.json: no topicConfigTable object")
        dv = data.get("dataVersion")
        self._data_version = dict(dv) if isinstance(dv, dict) else {"counter": 0}
        for name, cfg in data.get("topicConfigTable", {}).items():
            if not isinstance(cfg, dict):
                raise RmqStoreLayoutError(f"{self.root}/config/topics.json: entry {name!r} is not an "
                                          "object")
            if isinstance(name, str) and name and set(name) <= rc.TOPIC_CHARS:
                self._adopt_topic(name, cfg)
            else:
                self._other_topics[name] = cfg

    def _adopt_topic(self, name: str, cfg: dict) -> _Topic:
        def num(key: str, default: int) -> int:
            value = cfg.get(key, default)
            return value if isinstance(value, int) and not isinstance(value, bool) else default
        managed = {"topicName", "readQueueNums", "writeQueueNums", "perm", "order"}
        topic = _Topic(name, name.encode("ascii"), num("readQueueNums", 16), num("writeQueueNums", 16),
                       num("perm", 6), bool(cfg.get("order", False)),
                       {k: v for k, v in cfg.items() if k not in managed})
        self._topics[name] = topic
        self._other_topics.pop(name, None)
        self._refresh_fast_topics()
        return topic

    def _topic_json(self, name: str, read: int, write: int, perm: int, order: bool,
                    extra: dict) -> dict:
        cfg = {"order": order, "perm": perm, "readQueueNums": read,
               "topicFilterType": extra.get("topicFilterType", "SINGLE_TAG"), "topicName": name,
               "topicSysFlag": extra.get("topicSysFlag", 0), "writeQueueNums": write}
        if self.properties_style == "5.3.3" or "attributes" in extra:
            cfg["attributes"] = extra.get("attributes", {})
        for key, value in extra.items():
            cfg.setdefault(key, value)
        return dict(sorted(cfg.items()))

    def _write_topics(self) -> None:
        table = dict(self._other_topics)
        for t in self._topics.values():
            table[t.name] = self._topic_json(t.name, t.read_queues, t.write_queues, t.perm, t.order,
                                             t.extra)
        dv = dict(self._data_version)
        dv["counter"] = int(dv.get("counter", 0)) + 1 if isinstance(dv.get("counter", 0), int) else 1
        dv["timestamp"] = rc.now_ms()
        if self.properties_style == "5.3.3":
            dv.setdefault("stateVersion", 0)
        self._data_version = dv
        write_config_atomic(self.root / "config" / "topics.json",
                            dump_fastjson({"dataVersion": dv, "topicConfigTable": table}))
        self._topics_dirty = False

    def create_topic(self, topic: str, queues: int, *, order: bool = False, perm: int = 6,
                     read_queues: int | None = None) -> None:
        """Create or update a topic with ``queues`` write queues (read queues default to the same).

        ``perm`` is the broker's permission bits (``PERM_READ`` 4, ``PERM_WRITE`` 2, ...). The topic
        is saved to ``config/topics.json`` at once (atomically). Queue folders appear with the first
        message of each queue, as with the broker.
        """
        raw = validate_topic(topic)
        _int_arg("queues", queues, 1, MAX_QUEUES)
        read = queues if read_queues is None else _int_arg("read_queues", read_queues, 1, MAX_QUEUES)
        _int_arg("perm", perm, 0, 15)
        if not isinstance(order, bool):
            raise RmqOptionError(f"order must be a bool, got {order!r}")
        self._check_open()
        existing = self._topics.get(topic)
        if existing is None:
            extra = self._other_topics.pop(topic, {})
            extra = {k: v for k, v in extra.items()
                     if k not in ("topicName", "readQueueNums", "writeQueueNums", "perm", "order")}
            self._topics[topic] = _Topic(topic, raw, read, queues, perm, order, extra)
        else:
            existing.read_queues, existing.write_queues = read, queues
            existing.perm, existing.order = perm, order
        self._refresh_fast_topics()
        self._write_topics()

    def _refresh_fast_topics(self) -> None:
        """Topics append's fast path may write to: writable (PERM_WRITE) with write queues."""
        self._fast_topics = {name: t for name, t in self._topics.items()
                             if t.perm & PERM_WRITE and t.write_queues > 0}

    def topics(self) -> dict[str, int]:
        """Topics this writer can append to, with their number of write queues."""
        return {name: t.write_queues for name, t in self._topics.items()}

    def next_offset(self, topic: str, queue_id: int) -> int:
        """The queue offset the next message appended to (topic, queue_id) will get."""
        q = self._queues.get((topic, queue_id))
        return q.next_offset if q is not None else 0

    @property
    def commitlog_end(self) -> int:
        """Physical offset where the next record will be written (or the BLANK that ends the file)."""
        return self._cl.start + self._pos if self._cl is not None else 0

    # ---------------------------------------------------------------------------------- recovery

    def _recover(self) -> None:
        files = _list_files(self._commitlog_dir)
        size = self.commitlog_file_size
        # a zero-length last file (5.3.3 leaves one after a crash) is deleted, as the broker does
        while files and files[-1][1].stat().st_size == 0:
            files.pop()[1].unlink()
        for i, (start, path) in enumerate(files):
            if start % size or (i and start != files[i - 1][0] + size):
                raise RmqStoreLayoutError(f"{path}: CommitLog file names must be consecutive multiples "
                                          f"of the file size {size}")
        queue_files = self._list_queues()
        if not files:
            if any(qf for qf in queue_files.values()):
                raise RmqStoreLayoutError(f"{self.root}: ConsumeQueue files exist but commitlog/ is "
                                          "empty")
            self._open_commitlog(0, 0, create=True)
            for (topic, qid) in queue_files:
                self._queue(topic, qid, 0)
            return
        try:
            from rmq_source.store import native
        except ImportError as exc:
            raise RmqMissingDependencyError(
                "reopening a store that holds data needs the compiled C core rmq_source._native "
                f"(pip install -e .): {exc}") from None
        segments = [native.map_segment(str(p), start) for start, p in files]
        try:
            end = native.CommitLog(segments, size).valid_end(verify_crc=True)   # checkCRCOnRecover
            cl_min = files[0][0]
            max_offsets, cq_max_phy = self._recover_queues(native, queue_files, end)
        finally:
            for seg in segments:
                seg.close()
        active_start = end - end % size
        for start, path in files:
            if start > active_start + size:
                path.unlink()   # entirely beyond the valid end (broker: truncateDirtyFiles)
        active_existing = any(start == active_start for start, _ in files)
        self._open_commitlog(active_start, end - active_start, create=not active_existing)
        _zero_from(self._cl.mm, self._cl.fd, self._pos)
        if self._next_cl is not None:
            _zero_from(self._next_cl.mm, self._next_cl.fd, 0)
        for (topic, qid), next_offset in max_offsets.items():
            self._queue(topic, qid, next_offset)
        # from the last dispatched record on: it gives the last store timestamp, later ones get units
        self._redispatch(max(cq_max_phy, cl_min), end)

    def _list_queues(self) -> dict[tuple[str, int], list[tuple[int, Path]]]:
        found: dict[tuple[str, int], list[tuple[int, Path]]] = {}
        if not self._cq_root.is_dir():
            return found
        for topic_dir in sorted(self._cq_root.iterdir()):
            if not topic_dir.is_dir():
                continue
            for qdir in sorted(topic_dir.iterdir()):
                if qdir.is_dir() and re.fullmatch(r"\d+", qdir.name):
                    found[(topic_dir.name, int(qdir.name))] = _list_files(qdir)
        return found

    def _recover_queues(self, native, queue_files, cl_end: int):
        """Max offset of every queue (§2.4) after dropping units that point past the CommitLog end,
        and the largest physical offset a remaining unit points at (0 when there is none)."""
        max_offsets: dict[tuple[str, int], int] = {}
        cq_max_phy = 0
        fsize = self.cq_file_size
        for key, files in queue_files.items():
            for i, (start, path) in enumerate(files):
                if start % fsize or (i and start != files[i - 1][0] + fsize):
                    raise RmqStoreLayoutError(f"{path}: ConsumeQueue file names must be consecutive "
                                              f"multiples of the file size {fsize}")
            end = files[0][0] if files else 0
            for start, path in files[max(0, len(files) - 3):]:
                seg = native.map_segment(str(path), start)
                try:
                    units = native.cq_valid_units(seg)
                finally:
                    seg.close()
                end = start + units * rc.CQ_UNIT_SIZE
                if units * rc.CQ_UNIT_SIZE < fsize:
                    break
            # drop trailing units whose record is not (completely) in the CommitLog
            while end > (files[0][0] if files else 0):
                start = end - 1 - (end - 1) % fsize
                with open(files[[s for s, _ in files].index(start)][1], "r+b") as f:
                    f.seek(end - rc.CQ_UNIT_SIZE - start)
                    phy, usize, _ = rc.CQ_UNIT.unpack(f.read(rc.CQ_UNIT_SIZE))
                    if phy + usize <= cl_end or usize == 0x7FFFFFFF:
                        if usize != 0x7FFFFFFF:
                            cq_max_phy = max(cq_max_phy, phy)
                        break
                    f.seek(end - rc.CQ_UNIT_SIZE - start)
                    f.write(bytes(rc.CQ_UNIT_SIZE))
                end -= rc.CQ_UNIT_SIZE
            active = end - end % fsize
            for start, path in files:
                if start > active:
                    path.unlink()
                elif start == active and path.stat().st_size:
                    with open(path, "r+b") as f:
                        mm = mmap.mmap(f.fileno(), 0)
                        try:
                            _zero_from(mm, f.fileno(), end - start)
                        finally:
                            mm.close()
            max_offsets[key] = end // rc.CQ_UNIT_SIZE
        return max_offsets, cq_max_phy

    def _redispatch(self, start: int, end: int) -> None:
        """Add ConsumeQueue units for records in [start, end) that have none (the broker's reput)."""
        size = self.commitlog_file_size
        pos = start
        while pos < end:
            fstart = pos - pos % size
            path = self._commitlog_dir / _file_name(fstart)
            with open(path, "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                try:
                    while pos < end and pos < fstart + size:
                        rec = rc.decode_record(mm, pos - fstart, where=str(path))
                        if rec is None:
                            pos = fstart + size
                            break
                        self._last_store_ts = max(self._last_store_ts, rec.store_timestamp)
                        self._dispatch_recovered(rec, pos, path)
                        pos += rec.total_size
                finally:
                    mm.close()

    def _dispatch_recovered(self, rec: rc.DecodedRecord, phy: int, path: Path) -> None:
        if rec.sys_flag & rc.TX_MASK in (rc.TX_PREPARED, rc.TX_ROLLBACK):
            return
        q = self._queue(rec.topic, rec.queue_id, 0)
        if q.next_offset == 0 and q.file is None and not _list_files(q.folder):
            q.next_offset = rec.queue_offset   # queue rebuilt from a CommitLog that starts later
        if rec.queue_offset < q.next_offset:
            return
        if rec.queue_offset > q.next_offset:
            raise RmqCorruptStoreError(
                f"{path}: record at physical offset {phy} has queue offset {rec.queue_offset} but "
                f"queue {rec.topic}/{rec.queue_id} ends at {q.next_offset}", path=str(path),
                position=phy % self.commitlog_file_size, code="QUEUE_GAP")
        self._put_unit(q, phy, rec.total_size, tags_code(rec.properties.get("TAGS")))
        self._last_dispatch_ts = max(self._last_dispatch_ts, rec.store_timestamp)

    def _queue(self, topic: str, queue_id: int, next_offset: int) -> _Queue:
        q = self._queues.get((topic, queue_id))
        if q is None:
            q = _Queue(topic, queue_id, self._cq_root / topic / str(queue_id), next_offset)
            self._queues[(topic, queue_id)] = q
            if topic not in self._topics and set(topic) <= rc.TOPIC_CHARS:
                # a queue folder without a topics.json entry: adopt it, sized to cover its ids
                cfg = self._other_topics.get(topic, {})
                t = self._adopt_topic(topic, cfg)
                if not cfg:
                    t.read_queues = t.write_queues = queue_id + 1
                    t.sized_from_folders = True
                self._topics_dirty = True
            elif topic in self._topics:
                t = self._topics[topic]
                if t.sized_from_folders and queue_id >= t.write_queues:
                    t.read_queues = t.write_queues = queue_id + 1
        t = self._topics.get(topic)
        if t is not None:
            if len(t.queue_list) <= queue_id:
                t.queue_list.extend([None] * (queue_id + 1 - len(t.queue_list)))
            t.queue_list[queue_id] = q
        return q

    # --------------------------------------------------------------------------------- CommitLog

    def _open_commitlog(self, start: int, pos: int, *, create: bool) -> None:
        size = self.commitlog_file_size
        self._cl = _MappedFile(self._commitlog_dir / _file_name(start), start, size, create=create)
        self._pos = pos
        # the broker's AllocateMappedFileService creates the following file too
        self._next_cl = _MappedFile(self._commitlog_dir / _file_name(start + size), start + size,
                                    size, create=True)

    def _roll(self) -> None:
        """End the active file with a BLANK record and continue in the (preallocated) next one."""
        cl = self._cl
        remaining = cl.size - self._pos
        blank = rc.blank_record(remaining)
        cl.mm[self._pos:self._pos + 4] = blank[:4]
        cl.mm[self._pos + 4:self._pos + 8] = blank[4:]    # the magic last
        cl.close()
        self._cl = self._next_cl
        self._pos = 0
        nxt = self._cl.start + self._cl.size
        self._next_cl = _MappedFile(self._commitlog_dir / _file_name(nxt), nxt, self._cl.size,
                                    create=True)

    # ------------------------------------------------------------------------------ ConsumeQueue

    def _put_unit(self, q: _Queue, phy: int, size: int, code: int) -> None:
        """Write the unit for ``q.next_offset``: phy and tagsCode first, then the size as one
        aligned 4-byte store, so a reader that sees size > 0 also sees the rest."""
        off = q.next_offset
        if q.file is None or not (q.file_first <= off < q.file_end):
            self._map_queue_file(q, off)
        pos = (off - q.file_first) * 20
        _CQ_PACK(q.mm, pos, phy, 0, code)
        q.mm[pos + 8:pos + 12] = size.to_bytes(4, "big")    # size > 0 makes the unit valid: last
        q.next_offset = off + 1

    def _map_queue_file(self, q: _Queue, offset: int) -> None:
        if q.file is not None:
            q.file.close()
            q.file = q.mm = None
            q.file_first = q.file_end = 0
        units = self.cq_units_per_file
        first = offset - offset % units
        q.folder.mkdir(parents=True, exist_ok=True)
        path = q.folder / _file_name(first * rc.CQ_UNIT_SIZE)
        new = not path.exists()
        q.file = _MappedFile(path, first * rc.CQ_UNIT_SIZE, self.cq_file_size, create=True)
        q.mm = q.file.mm
        q.file_first, q.file_end = first, first + units
        if new and offset > first and not _list_files(q.folder)[:-1]:
            # first file of a queue starting mid-file: the broker fills it with pre-blank units
            blank = rc.encode_cq_unit(0, 0x7FFFFFFF, 0)
            q.file.mm[0:(offset - first) * 20] = blank * (offset - first)

    def _tags_code(self, tags: str | None) -> int:
        """tagsCode of a validated TAGS value; remembers the tag for append's fast path."""
        if not tags:
            return 0
        info = self._tag_props.get(tags)
        if info is None:
            info = self._fast_props_info(
                tags_code(tags), b"TAGS\x01" + tags.encode("utf-8") + b"\x02UNIQ_KEY\x01")
            if len(self._tag_props) < 4096:
                self._tag_props[tags] = info
        return info[0]

    def _fast_props_info(self, code: int, head: bytes) -> tuple[int, bytes, int]:
        # UNIQ_KEY of the default born host: hex of ip + pid(2) + hash(4) + time(4) + counter(2)
        props_len = len(head) + 2 * (len(self.born_host.address) + 12) + len(self._props_tail)
        return code, props_len.to_bytes(2, "big") + head, props_len

    # ------------------------------------------------------------------------------------ append

    def _check_open(self) -> None:
        if self._closed:
            raise RmqOptionError("StoreWriter is closed")

    def _select_queue(self, t: _Topic, queue_id, selector, selector_arg, message_parts) -> int:
        n = t.write_queues
        if not t.perm & PERM_WRITE or n <= 0:
            raise RmqOptionError(f"topic {t.name!r} is not writable (perm {t.perm}, "
                                 f"{n} write queues); the broker refuses such sends")
        if queue_id is not None:
            if selector is not None:
                raise RmqOptionError("give either queue_id or selector, not both")
            if isinstance(queue_id, bool) or not isinstance(queue_id, int) or not 0 <= queue_id < n:
                raise RmqOptionError(f"queue_id={queue_id!r} is not a write queue of topic {t.name!r} "
                                     f"(0..{n - 1})")
            return queue_id
        if selector is not None:
            if not callable(selector):
                raise RmqOptionError(f"selector must be callable(queues, message, arg), got {selector!r}")
            queues = list(range(n))
            chosen = selector(queues, Message(*message_parts), selector_arg)
            if isinstance(chosen, bool) or not isinstance(chosen, int) or not 0 <= chosen < n:
                raise RmqOptionError(f"selector returned {chosen!r}, not one of the queue ids "
                                     f"0..{n - 1} of topic {t.name!r}")
            return chosen
        qid = t.round_robin % n
        t.round_robin = qid + 1
        return qid

    def _build_properties(self, tags, keys, properties, uniq_key, born_ip: bytes,
                          born_ts: int) -> tuple[bytes, str | None]:
        entries: dict[str, str | None] = {}
        if tags is not None:
            if not isinstance(tags, str) or not tags:
                raise RmqOptionError(f"tags must be a non-empty string or None, got {tags!r}")
            entries["TAGS"] = tags
        if keys is not None:
            if isinstance(keys, str):
                if not keys.strip(" "):
                    raise RmqOptionError(f"keys={keys!r} has no key (keys are separated by ' ')")
                entries["KEYS"] = keys
            else:
                try:
                    key_list = list(keys)
                except TypeError:
                    raise RmqOptionError(f"keys must be a string or a list of strings, got "
                                         f"{keys!r}") from None
                for k in key_list:
                    if not isinstance(k, str) or not k or " " in k:
                        raise RmqOptionError(f"key {k!r} must be a non-empty string without spaces")
                if key_list:
                    entries["KEYS"] = " ".join(key_list)
        if uniq_key is not None:
            if not isinstance(uniq_key, str) or not uniq_key:
                raise RmqOptionError(f"uniq_key must be a non-empty string, got {uniq_key!r}")
            entries["UNIQ_KEY"] = uniq_key
        else:
            entries["UNIQ_KEY"] = None   # generated below unless properties say otherwise
        entries["WAIT"] = "true"
        user_uniq = False
        if properties is not None:
            if type(properties) is not dict and not isinstance(properties, Mapping):
                raise RmqOptionError(f"properties must be a mapping of str to str, got "
                                     f"{type(properties).__name__}")
            for name, value in properties.items():
                if name in ("TAGS", "KEYS", "UNIQ_KEY") and entries.get(name) is not None:
                    raise RmqOptionError(f"property {name!r} is also given as the "
                                         f"{name.lower()} argument; give it once")
                if value is None:
                    if not isinstance(name, str):
                        rc.validate_property(name, "x")
                    entries[name] = None
                    user_uniq |= name == "UNIQ_KEY"
                    continue
                rc.validate_property(name, value)
                entries[name] = value
                user_uniq |= name == "UNIQ_KEY"
        for name in ("TAGS", "KEYS", "UNIQ_KEY"):
            value = entries.get(name)
            if value is not None:
                rc.validate_property(name, value)
        if entries["UNIQ_KEY"] is None and not user_uniq:
            entries["UNIQ_KEY"] = self._uniq.create(born_ip, born_ts)
        raw = rc.encode_properties(entries, self.properties_style)
        if len(raw) > rc.MAX_PROPERTIES_LENGTH:
            raise RmqOptionError(f"properties are {len(raw)} bytes encoded, at most "
                                 f"{rc.MAX_PROPERTIES_LENGTH} allowed")
        return raw, entries.get("TAGS")

    def _timestamps(self, store_timestamp: int | None, born_timestamp: int | None) -> tuple[int, int]:
        """(store, born) epoch ms: store defaults to now and never decreases within this writer;
        born defaults to the store timestamp."""
        if store_timestamp is None:
            store_ts = max(_time_ns() // 1_000_000, self._last_store_ts)
        else:
            store_ts = _int_arg("store_timestamp", store_timestamp, 0, _INT64_MAX)
            if store_ts < self._last_store_ts:
                raise RmqOptionError(f"store_timestamp={store_ts} is before the previous record's "
                                     f"{self._last_store_ts}; store timestamps never decrease")
        born_ts = store_ts if born_timestamp is None else _int_arg("born_timestamp", born_timestamp,
                                                                   0, _INT64_MAX)
        return store_ts, born_ts

    def append(self, topic: str, body: bytes = b"", *, queue_id: int | None = None,
               tags: str | None = None, **options: Any) -> AppendResult:
        """Append one message; returns where it went.

        Full signature (shown by ``help()``; ``options`` keeps the common call cheap)::

            append(topic, body=b"", *, queue_id=None, selector=None, selector_arg=None, tags=None,
                   keys=None, properties=None, flag=0, born_timestamp=None, store_timestamp=None,
                   born_host=None, store_host=None, compression=None, reconsume_times=0,
                   uniq_key=None, prepared_transaction_offset=0, sys_flag_extra=0)

        Queue: ``queue_id``, else ``selector(queue_ids, Message, selector_arg)`` (like RocketMQ's
        ``MessageQueueSelector``), else round robin over the topic's write queues. Properties are
        ``TAGS``, ``KEYS`` (a string as is, or a list joined by ``' '``), ``UNIQ_KEY`` (given or
        generated like ``MessageClientIDSetter``), ``WAIT=true``, then ``properties``; a ``None``
        value in ``properties`` removes that entry (e.g. ``{"UNIQ_KEY": None}``). Timestamps are epoch
        ms; the store timestamp defaults to now and never decreases within this writer (an explicit
        smaller one is an error); the born timestamp defaults to the store timestamp.
        ``compression`` ``"zlib"``/``"lz4"``/``"zstd"`` compresses the body (BODYCRC covers the stored
        bytes). ``sys_flag_extra`` may set MULTI_TAGS (0x2) and the transaction type (0x4, 0x8, 0xC);
        PREPARED and ROLLBACK records get queue offset 0 and no ConsumeQueue unit, as in the broker.
        """
        # Fast path for the common shape (bytes body, known topic, known tag or none, no other
        # option); it writes exactly the bytes _append_general writes for the same message.
        t = self._fast_topics.get(topic)     # emptied by close()
        tag_info = self._tag_props.get(tags) if (tags is None or type(tags) is str) else None
        if options or t is None or tag_info is None or type(body) is not bytes:
            unknown = options.keys() - _APPEND_OPTIONS
            if unknown:
                raise RmqOptionError(f"append() got unknown option(s) {sorted(unknown)}; valid: "
                                     f"{sorted(_APPEND_OPTIONS)}")
            return self._append_general(topic, body, queue_id=queue_id, tags=tags, **options)
        n = t.write_queues
        if queue_id is None:
            qid = t.round_robin % n
            t.round_robin = qid + 1
        elif type(queue_id) is int and 0 <= queue_id < n:
            qid = queue_id
        else:
            return self._append_general(topic, body, queue_id=queue_id, tags=tags)
        now = _time_ns() // 1_000_000
        if now < self._last_store_ts:
            now = self._last_store_ts
        if now != self._uk_ms:
            self._uk_ms = now
            self._uk_prefix = self._uniq.prefix(self.born_host.address, now).encode("ascii")
        code, props_head, props_len = tag_info
        total = self._fixed_len + len(body) + t.len_part + props_len
        if total > self._fast_max_total:
            return self._append_general(topic, body, queue_id=qid, tags=tags)
        q = t.queue_list[qid] if qid < len(t.queue_list) else None
        if q is None:
            q = self._queue(topic, qid, 0)
        off = q.next_offset
        if self._pos + total + 8 > self._cl.size:
            self._roll()
        cl = self._cl
        pos = self._pos
        phy = cl.start + pos
        # straight into the map, in _publish's order: fields after MAGIC, TOTALSIZE, MAGIC last
        mm = cl.mm
        self._head_rest.pack_into(mm, pos + 8, _crc32(body) & 0x7FFFFFFF, qid, 0, off, phy,
                                  self._sys_flag, now, self._bh_field, now, self._sh_field, 0, 0,
                                  len(body))
        p = pos + self._body_at
        end = p + len(body)
        mm[p:end] = body
        mm[end:pos + total] = b"".join((t.topic_part, props_head, self._uk_prefix,
                                        _COUNTER_HEX[next(_COUNTER) & 0xFFFF], self._props_tail))
        size_bytes = total.to_bytes(4, "big")
        mm[pos:pos + 4] = size_bytes
        mm[pos + 4:pos + 8] = t.magic_bytes
        self._pos = pos + total
        self._last_store_ts = self._last_dispatch_ts = now
        if q.file_first <= off < q.file_end:
            upos = (off - q.file_first) * 20
            _CQ_PACK(q.mm, upos, phy, 0, code)
            q.mm[upos + 8:upos + 12] = size_bytes      # size last, see _put_unit
            q.next_offset = off + 1
        else:
            self._put_unit(q, phy, total, code)
        return _tuple_new(AppendResult, (topic, qid, off, phy, total,
                                         self._sh_hex + format(phy, "016X")))

    def _append_general(self, topic: str, body: bytes = b"", *, queue_id: int | None = None,
                        selector: QueueSelector | None = None, selector_arg: Any = None,
                        tags: str | None = None, keys: str | Iterable[str] | None = None,
                        properties: Mapping[str, str | None] | None = None, flag: int = 0,
                        born_timestamp: int | None = None, store_timestamp: int | None = None,
                        born_host: str | None = None, store_host: str | None = None,
                        compression: str | None = None, reconsume_times: int = 0,
                        uniq_key: str | None = None, prepared_transaction_offset: int = 0,
                        sys_flag_extra: int = 0) -> AppendResult:
        """:meth:`append` for every shape of message: validates everything, then writes."""
        if self._closed:
            raise RmqOptionError("StoreWriter is closed")
        t = self._topics.get(topic)
        if t is None:
            validate_topic(topic)
            raise RmqUnknownTopicError(f"topic {topic!r} does not exist in {self.root}; call "
                                       "create_topic(topic, queues) first")
        if not isinstance(body, (bytes, bytearray, memoryview)):
            raise RmqOptionError(f"body must be bytes, got {type(body).__name__}")
        body = bytes(body)
        if (flag, reconsume_times, prepared_transaction_offset, sys_flag_extra) != (0, 0, 0, 0):
            _int_arg("flag", flag, -(1 << 31), _INT32_MAX)
            _int_arg("reconsume_times", reconsume_times, 0, _INT32_MAX)
            _int_arg("prepared_transaction_offset", prepared_transaction_offset, 0, _INT64_MAX)
            _int_arg("sys_flag_extra", sys_flag_extra, 0, 0xF)
            if sys_flag_extra & rc.FLAG_COMPRESSED:
                raise RmqOptionError("sys_flag_extra must not set the compressed bit 0x1; use "
                                     "compression=")
        store_ts, born_ts = self._timestamps(store_timestamp, born_timestamp)
        bh = self.born_host if born_host is None else _host(born_host, "born_host")
        sh = self.store_host if store_host is None else _host(store_host, "store_host")

        qid = self._select_queue(t, queue_id, selector, selector_arg,
                                 (topic, body, tags, keys, properties))
        props, tag_value = self._build_properties(tags, keys, properties, uniq_key, bh.address,
                                                  born_ts)

        sys_flag = sys_flag_extra
        if compression is not None:
            body_len_before = len(body)
            body, cflag = rc.compress_body(body, compression, self._level, self.properties_style)
            sys_flag |= cflag
        else:
            body_len_before = len(body)
        if bh.is_v6:
            sys_flag |= rc.FLAG_BORNHOST_V6
        if sh.is_v6:
            sys_flag |= rc.FLAG_STOREHOST_V6
        raw_topic = t.raw
        v2 = len(raw_topic) > rc.V1_MAX_TOPIC_LENGTH
        total = (74 + len(bh.field) + len(sh.field) + (2 if v2 else 1) + len(body) + len(raw_topic)
                 + len(props))
        if self.properties_style == "4.9.3":
            if total > self._max_message_size:
                raise RmqOptionError(f"record of {total} bytes exceeds max_message_size "
                                     f"{self._max_message_size}")
        elif body_len_before > self._max_message_size:
            raise RmqOptionError(f"body of {body_len_before} bytes exceeds max_message_size "
                                 f"{self._max_message_size}")
        if total + rc.END_FILE_MIN_BLANK_LENGTH > self.commitlog_file_size:
            raise RmqOptionError(f"record of {total} bytes cannot fit in a CommitLog file of "
                                 f"{self.commitlog_file_size} bytes")

        dispatch = sys_flag & rc.TX_MASK not in (rc.TX_PREPARED, rc.TX_ROLLBACK)
        q = self._queues.get((topic, qid))
        if q is None:
            q = self._queue(topic, qid, 0)
        queue_offset = q.next_offset if dispatch else 0

        if self._pos + total + rc.END_FILE_MIN_BLANK_LENGTH > self._cl.size:
            self._roll()
        cl = self._cl
        pos = self._pos
        phy = cl.start + pos
        head = rc.header_struct(len(bh.field), len(sh.field)).pack(
            total, rc.MAGIC_V2 if v2 else rc.MAGIC_V1, _crc32(body) & 0x7FFFFFFF, qid, flag,
            queue_offset, phy, sys_flag, born_ts, bh.field, store_ts, sh.field, reconsume_times,
            prepared_transaction_offset, len(body))
        record = b"".join((head, body, len(raw_topic).to_bytes(2 if v2 else 1, "big"), raw_topic,
                           len(props).to_bytes(2, "big"), props))
        mm = cl.mm
        _publish(mm, pos, record)
        self._pos = pos + total
        self._last_store_ts = store_ts
        if dispatch:
            self._put_unit(q, phy, total, self._tags_code(tag_value))
            self._last_dispatch_ts = store_ts
        return AppendResult(topic, qid, queue_offset if dispatch else None, phy, total,
                            (sh.field + _I64.pack(phy)).hex().upper())

    def append_batch(self, topic: str, bodies: Iterable[bytes], *, queue_id: int | None = None,
                     tags: str | None = None, keys: str | Iterable[str] | None = None,
                     properties: Mapping[str, str | None] | None = None,
                     born_timestamp: int | None = None,
                     store_timestamp: int | None = None) -> list[AppendResult]:
        """Append several messages as one batch send, as the broker's ``putMessages`` stores it.

        Every member goes to the same queue (``queue_id`` or the next round-robin queue) with
        consecutive queue offsets and one store timestamp; the batch is placed as a whole: when it
        does not fit in the rest of the CommitLog file, the BLANK goes before its first record.
        ``tags``, ``keys`` and ``properties`` apply to every member; each member gets its own
        ``UNIQ_KEY`` (``properties`` must not set one). Bodies are never compressed (the broker
        does not compress batches). Returns one :class:`AppendResult` per member, in order.
        """
        self._check_open()
        t = self._topics.get(topic)
        if t is None:
            validate_topic(topic)
            raise RmqUnknownTopicError(f"topic {topic!r} does not exist in {self.root}; call "
                                       "create_topic(topic, queues) first")
        try:
            members = [bytes(b) if isinstance(b, (bytearray, memoryview)) else b for b in bodies]
        except TypeError:
            raise RmqOptionError("bodies must be an iterable of bytes") from None
        for b in members:
            if type(b) is not bytes:
                raise RmqOptionError(f"every body must be bytes, got {type(b).__name__}")
        if properties is not None and isinstance(properties, Mapping) and "UNIQ_KEY" in properties:
            raise RmqOptionError("append_batch: properties must not set UNIQ_KEY (each member gets "
                                 "its own)")
        store_ts, born_ts = self._timestamps(store_timestamp, born_timestamp)
        qid = self._select_queue(t, queue_id, None, None, None)
        # property bytes around the UNIQ_KEY value, shared by every member
        sentinel = "\x00rmq-uniq-key\x00"
        template, tag_value = self._build_properties(tags, keys, properties, sentinel,
                                                     self.born_host.address, born_ts)
        head_props, found, tail_props = template.partition(sentinel.encode("ascii"))
        if not found or sentinel.encode("ascii") in tail_props:
            raise RmqOptionError("append_batch: property values must not contain NUL-delimited "
                                 "'rmq-uniq-key'")
        if not members:
            return []
        code = self._tags_code(tag_value)
        uk_prefix = self._uniq.prefix(self.born_host.address, born_ts).encode("ascii")
        props_len = len(head_props) + len(uk_prefix) + 4 + len(tail_props)
        if props_len > rc.MAX_PROPERTIES_LENGTH:
            raise RmqOptionError(f"properties are {props_len} bytes encoded, at most "
                                 f"{rc.MAX_PROPERTIES_LENGTH} allowed")
        props_len_bytes = props_len.to_bytes(2, "big")
        fixed = self._fixed_len + t.len_part + props_len
        sizes = [fixed + len(b) for b in members]
        batch_size = sum(sizes)
        biggest = max(sizes)
        if self.properties_style == "4.9.3" and biggest > self._max_message_size:
            raise RmqOptionError(f"a record of {biggest} bytes exceeds max_message_size "
                                 f"{self._max_message_size}")
        if self.properties_style == "5.3.3" and max(map(len, members)) > self._max_message_size:
            raise RmqOptionError(f"a body exceeds max_message_size {self._max_message_size}")
        if batch_size + rc.END_FILE_MIN_BLANK_LENGTH > self.commitlog_file_size:
            raise RmqOptionError(f"batch of {batch_size} bytes cannot fit in a CommitLog file of "
                                 f"{self.commitlog_file_size} bytes; split it")
        q = self._queues.get((topic, qid)) or self._queue(topic, qid, 0)
        if self._pos + batch_size + rc.END_FILE_MIN_BLANK_LENGTH > self._cl.size:
            self._roll()
        cl = self._cl
        start = cl.start + self._pos
        pack = self._head.pack
        magic, len_bytes, raw, sys_flag = t.magic, t.len_bytes, t.raw, self._sys_flag
        bh_field, sh_field = self._bh_field, self._sh_field
        parts = []
        units = []
        phy, off = start, q.next_offset
        for body, size in zip(members, sizes):
            parts += (pack(size, magic, _crc32(body) & 0x7FFFFFFF, qid, 0, off, phy, sys_flag,
                           born_ts, bh_field, store_ts, sh_field, 0, 0, len(body)),
                      body, len_bytes, raw, props_len_bytes, head_props, uk_prefix,
                      _COUNTER_HEX[next(_COUNTER) & 0xFFFF], tail_props)
            units.append((phy, size, off))
            phy += size
            off += 1
        blob = b"".join(parts)
        mm, pos = cl.mm, self._pos
        _publish(mm, pos, blob)
        self._pos = pos + batch_size
        self._last_store_ts = self._last_dispatch_ts = store_ts
        sh_hex = self._sh_hex
        results = []
        for phy, size, off in units:
            self._put_unit(q, phy, size, code)
            results.append(_tuple_new(AppendResult, (topic, qid, off, phy, size,
                                                     sh_hex + format(phy, "016X"))))
        return results

    # ------------------------------------------------------------------------- flush, checkpoint

    def _ensure_checkpoint(self) -> None:
        path = self.root / "checkpoint"
        if not path.exists() or path.stat().st_size < CHECKPOINT_SIZE:
            with open(path, "ab") as f:
                f.truncate(CHECKPOINT_SIZE)

    def _write_checkpoint(self) -> None:
        fd = os.open(self.root / "checkpoint", os.O_RDWR)
        try:
            os.pwrite(fd, _CHECKPOINT.pack(self._last_store_ts, self._last_dispatch_ts, 0), 0)
            os.fsync(fd)
        finally:
            os.close(fd)

    def flush(self) -> None:
        """Flush CommitLog and ConsumeQueue pages to disk (msync) and update ``checkpoint``
        (physicMsgTimestamp, logicsMsgTimestamp = store time of the last record; index 0)."""
        self._check_open()
        if self._cl is not None:
            self._cl.mm.flush()
        for q in self._queues.values():
            if q.file is not None:
                q.file.mm.flush()
        self._write_checkpoint()
        if self._topics_dirty:
            self._write_topics()

    # ---------------------------------------------------------------------------------- retention

    def delete_oldest_commitlog_files(self, count: int) -> list[Path]:
        """Delete up to ``count`` oldest CommitLog files, never the active one, then every
        ConsumeQueue file (never a queue's last) whose last unit points below the new CommitLog min
        offset (format doc §7.4). Returns the deleted paths."""
        self._check_open()
        _int_arg("count", count, 0, 1 << 30)
        deleted: list[Path] = []
        old = [(s, p) for s, p in _list_files(self._commitlog_dir) if s < self._cl.start]
        for _, path in old[:count]:
            path.unlink()
            deleted.append(path)
        remaining = _list_files(self._commitlog_dir)
        cl_min = remaining[0][0] if remaining else self._cl.start
        for (topic, qid), files in self._list_queues().items():
            for start, path in files[:-1]:
                with open(path, "rb") as f:
                    f.seek(self.cq_file_size - rc.CQ_UNIT_SIZE)
                    phy = _I64.unpack(f.read(8))[0]
                if phy >= cl_min:
                    break
                path.unlink()
                deleted.append(path)
        return deleted

    # ------------------------------------------------------------------------------------- close

    def _abandon(self) -> None:
        """Release files and the lock without writing anything (failed open)."""
        for q in self._queues.values():
            if q.file is not None:
                q.file.close()
                q.file = None
        for f in (self._cl, self._next_cl):
            if f is not None:
                f.close()
        self._cl = self._next_cl = None
        self._fast_topics = {}
        self._release_lock()
        self._closed = True

    def close(self) -> None:
        """Flush, save ``topics.json`` if it changed, remove ``abort`` and release the lock."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._abandon()
            try:
                (self.root / "abort").unlink()
            except FileNotFoundError:
                pass

    def __enter__(self) -> "StoreWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._closed:
                self._abandon()
        except Exception:
            pass

    def __repr__(self) -> str:
        return (f"StoreWriter({str(self.root)!r}, commitlog_file_size={self.commitlog_file_size}, "
                f"cq_units_per_file={self.cq_units_per_file})")


def _public_append_signature() -> inspect.Signature:
    general = inspect.signature(StoreWriter._append_general)
    return general.replace(return_annotation=AppendResult)


StoreWriter.append.__signature__ = _public_append_signature()


def delete_oldest_commitlog_files(root: str | os.PathLike, count: int, **writer_options) -> list[Path]:
    """Open ``root`` with a :class:`StoreWriter` and delete its ``count`` oldest CommitLog files and
    the ConsumeQueue files they make obsolete (see :meth:`StoreWriter.delete_oldest_commitlog_files`)."""
    with StoreWriter(root, **writer_options) as writer:
        return writer.delete_oldest_commitlog_files(count)
