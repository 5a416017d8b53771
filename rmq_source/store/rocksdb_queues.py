"""RocketMQ 5.x RocksDB consume queues (broker ``storeType=defaultRocksDB``), read with rocksdict.

Such a broker keeps every consume queue in one RocksDB database, ``consumequeue/``
(RocketMQ 5.3.3 ``RocksDBConsumeQueueTable`` and ``RocksDBConsumeQueueOffsetTable``), all integers
big-endian, keys compared bytewise:

* column family ``default``: key ``int32 topicLen, 0x01, topic, 0x01, int32 queueId, 0x01,
  int64 queueOffset``; value (28 bytes) ``int64 phyOffset, int32 size, int64 tagsCode,
  int64 storeTimestamp``. One queue's units are one key range, in queue offset order.
* column family ``offset``: key ``int32 topicLen, 0x01, topic, 0x01, "max"|"min", 0x01,
  int32 queueId``; value ``int64 phyOffset, int64 queueOffset``: the queues that exist.

The units are copied out as the default layout's 20-byte ConsumeQueue units into in-memory files
(:func:`rmq_source.store.native.memory_segment`) of :data:`UNITS_PER_FILE` units, the first file
starting at the queue's first unit, so the C core scans them as it scans ConsumeQueue files and
keeps reading the records from the CommitLog. The database is opened as a RocksDB *secondary*
instance (read-only; it follows a running broker's writes) and caught up with the broker at most
every :data:`CATCH_UP_S` seconds; units once copied are kept (a written unit never changes) and
a catch-up copies only those after a queue's last one. The broker's compaction drops units whose
record retention deleted; the reader's minimum offset skips those already (first unit whose
record still exists), so keeping them changes nothing.

A running 5.3.3 broker writes these units without RocksDB's write-ahead log
(``AbstractRocksDBStorage.initWriteOptions``: ``setDisableWAL(true)``; a crash rebuilds them from
the CommitLog), so they reach disk only when RocksDB flushes a memtable, and always when the broker
stops: a store read of a running broker sees its queues as of the last flush (a prefix of what it
serves). Stream a running RocksDB broker in live mode.

rocksdict (PyPI; manylinux wheels with RocksDB built in, the extra ``rmq_source[rocksdb]``) is
the library: it opens a database read-only or as a secondary with its column families, and needs
no compiler or system RocksDB.
"""
from __future__ import annotations

import os
import shutil
import struct
import tempfile
import threading
import time
import weakref

import numpy as np

from rmq_source.errors import RmqCorruptStoreError, RmqStoreLayoutError
from rmq_source.store import native

UNITS_PER_FILE = 1 << 18            # 5 MiB of 20-byte units an in-memory file
CATCH_UP_S = 0.2                    # how stale a running broker's queues may be seen
_VALUE = np.dtype([("phy", ">i8"), ("size", ">i4"), ("tags", ">i8"), ("ts", ">i8")])
_UNIT = np.dtype([("phy", ">i8"), ("size", ">i4"), ("tags", ">i8")])
INSTALL = "pip install 'rmq_source[rocksdb]'"


def _queue_prefix(topic: str, queue_id: int) -> bytes:
    t = topic.encode("utf-8")
    return struct.pack(">i", len(t)) + b"\x01" + t + b"\x01" + struct.pack(">i", queue_id) + b"\x01"


class _Queue:
    """The units of one queue copied so far: full in-memory files and the bytes after them."""

    __slots__ = ("first", "next", "files", "tail", "segs")

    def __init__(self):
        self.first = -1          # queue offset of the first unit (-1: none yet)
        self.next = 0            # queue offset after the last unit copied
        self.files: list[native.Segment] = []
        self.tail = b""
        self.segs: list[native.Segment] = []


class RocksQueues:
    """The consume queues of one store root's RocksDB database, as ConsumeQueue segments."""

    def __init__(self, root: str):
        self.root = root
        self.path = os.path.join(root, "consumequeue")
        self._db = None
        self._lock = threading.RLock()
        self._queues: dict[tuple[str, int], _Queue] = {}
        self._open()

    def _open(self) -> None:
        """Open the database (again after :meth:`close`, as a Store's files are mapped again)."""
        if self._db is not None:
            return
        try:
            from rocksdict import AccessType, Options, Rdict
        except ImportError:
            raise RmqStoreLayoutError(
                f"store root {self.root!r} keeps its consume queues in a RocksDB database "
                f"({self.path}: a broker with storeType=defaultRocksDB); reading it needs the "
                f"rocksdict package ({INSTALL}), or read it in live mode (option namesrvAddr)"
            ) from None
        self._secondary = tempfile.mkdtemp(prefix="rmq_source-rocksdb-")
        try:
            self._db = Rdict(self.path, options=Options(raw_mode=True),
                             access_type=AccessType.secondary(self._secondary),
                             column_families={"default": Options(raw_mode=True),
                                              "offset": Options(raw_mode=True)})
        except Exception as exc:   # rocksdict raises plain Exception
            shutil.rmtree(self._secondary, ignore_errors=True)
            raise RmqStoreLayoutError(
                f"cannot open the RocksDB consume queues {self.path} (storeType=defaultRocksDB): "
                f"{exc}") from exc
        self._units = self._db.get_column_family("default")
        self._offsets = self._db.get_column_family("offset")
        self._caught_up = time.monotonic()
        # a Store dropped without close() still removes the secondary instance's folder
        self._finalizer = weakref.finalize(self, _release, self._db, self._secondary)

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._finalizer()
                self._db = None
                self._queues.clear()

    def _catch_up(self) -> None:
        now = time.monotonic()
        if now - self._caught_up >= CATCH_UP_S:
            try:
                self._db.try_catch_up_with_primary()
            except Exception as exc:
                raise RmqStoreLayoutError(f"cannot follow the RocksDB consume queues {self.path}: "
                                          f"{exc}") from exc
            self._caught_up = now

    def queues(self) -> dict[str, set[int]]:
        """topic -> queue ids the ``offset`` column family lists."""
        out: dict[str, set[int]] = {}
        with self._lock:
            self._open()
            self._catch_up()
            for key in self._offsets.keys():
                parsed = _offset_key(key)
                if parsed is not None:
                    out.setdefault(parsed[0], set()).add(parsed[1])
        return out

    def segments(self, topic: str, queue_id: int) -> tuple[list[native.Segment], int]:
        """(in-memory ConsumeQueue files of the queue, their file size); ([], size) for a queue
        without units. The same list object while the queue has no new units."""
        with self._lock:
            self._open()
            self._catch_up()
            q = self._queues.get((topic, queue_id))
            if q is None:
                q = self._queues[(topic, queue_id)] = _Queue()
            self._copy_new(topic, queue_id, q)
            return q.segs, UNITS_PER_FILE * 20

    def _copy_new(self, topic: str, queue_id: int, q: _Queue) -> None:
        from rocksdict import ReadOptions
        prefix = _queue_prefix(topic, queue_id)
        opts = ReadOptions()
        opts.set_iterate_upper_bound(prefix[:-1] + b"\x02")
        start = prefix + struct.pack(">q", q.next) if q.first >= 0 else prefix
        pairs = list(self._units.items(from_key=start, read_opt=opts))
        if not pairs:
            return
        keys = b"".join(k for k, _ in pairs)
        values = b"".join(v for _, v in pairs)
        n, key_len = len(pairs), len(prefix) + 8
        where = f"RocksDB consume queue {self.path} {topic}/{queue_id}"
        if len(keys) != n * key_len or len(values) != n * _VALUE.itemsize:
            raise RmqCorruptStoreError(f"{where}: a key or value of another length than RocketMQ "
                                       f"writes ({key_len} and {_VALUE.itemsize} bytes)",
                                       path=self.path, code="BAD_UNIT")
        offsets = np.ndarray(n, ">i8", keys, len(prefix), (key_len,)).astype(np.int64)
        first = int(offsets[0]) if q.first < 0 else q.next
        steps = np.diff(offsets, prepend=first - 1)
        if not np.all(steps == 1):
            bad = int(np.argmax(steps != 1))
            raise RmqCorruptStoreError(f"{where}: units are not consecutive: offset "
                                       f"{int(offsets[bad])} follows {int(offsets[bad] - steps[bad])}",
                                       path=self.path, code="BAD_UNIT")
        vals = np.frombuffer(values, _VALUE)
        units = np.empty(n, _UNIT)
        units["phy"], units["size"], units["tags"] = vals["phy"], vals["size"], vals["tags"]
        if q.first < 0:
            q.first = first
        q.next = first + n
        self._publish(topic, queue_id, q, q.tail + units.tobytes())

    def _publish(self, topic: str, queue_id: int, q: _Queue, tail: bytes) -> None:
        file_bytes = UNITS_PER_FILE * 20
        while len(tail) >= file_bytes:
            start = q.first * 20 + len(q.files) * file_bytes
            q.files.append(native.memory_segment(tail[:file_bytes], self._label(topic, queue_id, start),
                                                 start))
            tail = tail[file_bytes:]
        q.tail = tail
        segs = list(q.files)
        if tail:
            start = q.first * 20 + len(q.files) * file_bytes
            segs.append(native.memory_segment(tail, self._label(topic, queue_id, start), start))
        q.segs = segs

    def _label(self, topic: str, queue_id: int, start: int) -> str:
        return f"{self.path} (RocksDB) {topic}/{queue_id} from offset {start // 20}"


def _release(db, secondary: str) -> None:
    try:
        db.close()
    finally:
        shutil.rmtree(secondary, ignore_errors=True)


def _offset_key(key: bytes) -> tuple[str, int] | None:
    """(topic, queue id) of an ``offset`` column family key; None for another kind of key."""
    if len(key) < 4:
        return None
    n = struct.unpack_from(">i", key)[0]
    rest = key[4 + 1 + n:]
    if n < 0 or len(rest) != 1 + 3 + 1 + 4 or key[4:5] != b"\x01" or rest[0:1] != b"\x01":
        return None
    try:
        topic = key[5:5 + n].decode("utf-8")
    except UnicodeDecodeError:
        return None
    return topic, struct.unpack_from(">i", rest, 5)[0]
