"""Append messages to a store directory exactly as a RocketMQ 4.9.3 broker lays it out.

:class:`StoreWriter` writes ``commitlog/`` (files named by their 20-digit start offset, created at
full size, the next file preallocated, a BLANK record when ``record + 8 > remaining``),
``consumequeue/<topic>/<queueId>/`` (20-byte units, files created on demand), ``config/topics.json``
and ``checkpoint``. Readers may read the store while it is written: a record is completely in the
CommitLog (its MAGIC written last) before its ConsumeQueue unit appears (its size written last).

Reopening a store resumes it as a broker restart would (:mod:`.writer_recovery`): the CommitLog
end and every queue's max offset are recovered with the broker's rules (format doc §2.3, §2.4);
garbage after the valid end is zeroed, records missing from their ConsumeQueue are dispatched again.

This module encodes and appends records and owns the CommitLog; the rest of the writer lives
beside it: :mod:`.mapped_files` (files and safe publication), :mod:`.cq_dispatch` (ConsumeQueue
units), :mod:`.writer_topics` (topics.json), :mod:`.writer_recovery`, :mod:`.write_args`.

One writer per store: the writer holds the broker's lock on ``<root>/lock`` (a running broker holds
the same lock) and marks the store running with ``<root>/abort`` until :meth:`StoreWriter.close`. A
writer is not thread-safe; use it from one thread.
"""
from __future__ import annotations

import fcntl
import inspect
import os
import struct
import time
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from rmq_source.errors import RmqOptionError, RmqSourceError, RmqStoreLayoutError, RmqUnknownTopicError
from rmq_source.store.layout import refuse_other_layouts
from rmq_source.store import record_codec as rc
from rmq_source.store.cq_dispatch import ConsumeQueueDispatch, QueueState, default_open_queue_files
from rmq_source.store.mapped_files import MappedFile, file_name, list_files, publish
from rmq_source.store.write_args import host, int_arg, validate_topic
from rmq_source.store.writer_recovery import Recovery
from rmq_source.store.writer_topics import PERM_WRITE, TopicState, TopicTable

DEFAULT_COMMITLOG_FILE_SIZE = 1 << 30
DEFAULT_CQ_UNITS_PER_FILE = 300_000
DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024
CHECKPOINT_SIZE = 4096
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


class StoreWriter(TopicTable, Recovery, ConsumeQueueDispatch):
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
                 max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
                 max_open_queue_files: int | None = None):
        if not isinstance(root, (str, os.PathLike)) or not str(root):
            raise RmqOptionError(f"root must be a directory path, got {root!r}")
        if not isinstance(broker_name, str) or not broker_name:
            raise RmqOptionError(f"broker_name must be a non-empty string, got {broker_name!r}")
        if properties_style not in rc.PROPERTIES_STYLES:
            raise RmqOptionError(f"properties_style={properties_style!r} must be one of "
                                 f"{', '.join(rc.PROPERTIES_STYLES)}")
        if commitlog_file_size is not None:
            int_arg("commitlog_file_size", commitlog_file_size, 128, _INT32_MAX)
        if cq_units_per_file is not None:
            int_arg("cq_units_per_file", cq_units_per_file, 1, _INT32_MAX // rc.CQ_UNIT_SIZE)
        self._level = int_arg("compression_level", compression_level, 0, 22)
        self._max_message_size = int_arg("max_message_size", max_message_size, 1, _INT32_MAX)
        #: ConsumeQueue files kept mapped at once (two descriptors each), whatever the number of
        #: queues: the one mapped longest is closed first, and fsync-ed by the next flush()
        self.max_open_queue_files = (default_open_queue_files() if max_open_queue_files is None else
                                     int_arg("max_open_queue_files", max_open_queue_files, 1, 1 << 20))
        self.root = Path(root)
        refuse_other_layouts(self.root)
        self.broker_name = broker_name
        self.properties_style = properties_style
        self.store_host = host(store_host, "store_host")
        self.born_host = host(born_host, "born_host")
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
        self._topics: dict[str, TopicState] = {}
        self._fast_topics: dict[str, TopicState] = {}
        self._queues: dict[tuple[str, int], QueueState] = {}
        self._mapped_queues: OrderedDict[QueueState, None] = OrderedDict()   # oldest mapping first
        self._closed_unsynced: set[Path] = set()    # queue files closed since the last flush()
        self._other_topics: dict[str, dict] = {}
        self._data_version: dict = {}
        self._topics_dirty = False
        self._last_store_ts = 0
        self._last_dispatch_ts = 0
        self._cl: MappedFile | None = None
        self._next_cl: MappedFile | None = None
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
        files = list_files(self._commitlog_dir)
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
                for _, p in list_files(qdir):
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

    def next_offset(self, topic: str, queue_id: int) -> int:
        """The queue offset the next message appended to (topic, queue_id) will get."""
        q = self._queues.get((topic, queue_id))
        return q.next_offset if q is not None else 0

    @property
    def commitlog_end(self) -> int:
        """Physical offset where the next record will be written (or the BLANK that ends the file)."""
        return self._cl.start + self._pos if self._cl is not None else 0

    # --------------------------------------------------------------------------------- CommitLog

    def _open_commitlog(self, start: int, pos: int, *, create: bool) -> None:
        size = self.commitlog_file_size
        self._cl = MappedFile(self._commitlog_dir / file_name(start), start, size, create=create)
        self._pos = pos
        # the broker's AllocateMappedFileService creates the following file too
        self._next_cl = MappedFile(self._commitlog_dir / file_name(start + size), start + size,
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
        self._next_cl = MappedFile(self._commitlog_dir / file_name(nxt), nxt, self._cl.size,
                                    create=True)

    def _fast_props_info(self, code: int, head: bytes) -> tuple[int, bytes, int]:
        # UNIQ_KEY of the default born host: hex of ip + pid(2) + hash(4) + time(4) + counter(2)
        props_len = len(head) + 2 * (len(self.born_host.address) + 12) + len(self._props_tail)
        return code, props_len.to_bytes(2, "big") + head, props_len

    # ------------------------------------------------------------------------------------ append

    def _check_open(self) -> None:
        if self._closed:
            raise RmqOptionError("StoreWriter is closed")

    def _select_queue(self, t: TopicState, queue_id, selector, selector_arg, message_parts) -> int:
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
            store_ts = int_arg("store_timestamp", store_timestamp, 0, _INT64_MAX)
            if store_ts < self._last_store_ts:
                raise RmqOptionError(f"store_timestamp={store_ts} is before the previous record's "
                                     f"{self._last_store_ts}; store timestamps never decrease")
        born_ts = store_ts if born_timestamp is None else int_arg("born_timestamp", born_timestamp,
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
        # straight into the map, in publish's order: fields after MAGIC, TOTALSIZE, MAGIC last
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
            int_arg("flag", flag, -(1 << 31), _INT32_MAX)
            int_arg("reconsume_times", reconsume_times, 0, _INT32_MAX)
            int_arg("prepared_transaction_offset", prepared_transaction_offset, 0, _INT64_MAX)
            int_arg("sys_flag_extra", sys_flag_extra, 0, 0xF)
            if sys_flag_extra & rc.FLAG_COMPRESSED:
                raise RmqOptionError("sys_flag_extra must not set the compressed bit 0x1; use "
                                     "compression=")
        store_ts, born_ts = self._timestamps(store_timestamp, born_timestamp)
        bh = self.born_host if born_host is None else host(born_host, "born_host")
        sh = self.store_host if store_host is None else host(store_host, "store_host")

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
        publish(mm, pos, record)
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
        publish(mm, pos, blob)
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
        for q in self._mapped_queues:
            q.file.mm.flush()
        for path in sorted(self._closed_unsynced):     # their pages are still in the page cache
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:                  # deleted by retention meanwhile
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._closed_unsynced.clear()
        self._write_checkpoint()
        if self._topics_dirty:
            self._write_topics()

    # ---------------------------------------------------------------------------------- retention

    def delete_oldest_commitlog_files(self, count: int) -> list[Path]:
        """Delete up to ``count`` oldest CommitLog files, never the active one, then every
        ConsumeQueue file (never a queue's last) whose last unit points below the new CommitLog min
        offset (format doc §7.4). Returns the deleted paths."""
        self._check_open()
        int_arg("count", count, 0, 1 << 30)
        deleted: list[Path] = []
        old = [(s, p) for s, p in list_files(self._commitlog_dir) if s < self._cl.start]
        for _, path in old[:count]:
            path.unlink()
            deleted.append(path)
        remaining = list_files(self._commitlog_dir)
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
        self._mapped_queues.clear()
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
