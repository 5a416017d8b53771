"""Read a RocketMQ broker store directory: topics, queues, offsets and messages as Arrow batches.

A store root is the directory holding ``commitlog/`` (or, written by a DLedger broker,
``dledger-<selfId>/data/``: :mod:`rmq_source.store.layout`), ``consumequeue/`` and ``config/`` (the
broker's ``storePathRootDir``). Offsets are ConsumeQueue (logical) offsets:

* ``min_offset`` is the first offset still readable: the first unit whose CommitLog record has not
  been deleted by retention (the 4.9.3 broker's ``correctMinOffset`` rule, clamped to the first
  existing ConsumeQueue file).
* ``max_offset`` is the next offset to be written (one past the last valid unit).
* Every range is half-open: ``[start, end)``.

The store may be appended to while it is read (by a broker or by
:class:`rmq_source.store.writer.StoreWriter`);
every call re-lists the folders so new files, new queues and deleted files are seen.
"""
from __future__ import annotations

import os
import re
import stat
import threading
import time
from typing import Iterator

import numpy as np
import pyarrow as pa

from rmq_source.store import layout as store_layout
from rmq_source.store import native
from rmq_source.store.bodies import decompress_bodies
from rmq_source.store.queue_poll import PolledTopic
from rmq_source.store.rocksdb_queues import RocksQueues
from rmq_source.errors import (RmqCorruptStoreError, RmqDataLossError, RmqOptionError, RmqStoreLayoutError,
                               RmqUnknownTopicError)
from rmq_source.backend import DataLossCallback, QueueInfo, ShortReadCallback
from rmq_source.schema import ARROW_SCHEMA, empty_batch, int32_array, repeat_string
from rmq_source.subscription import Subscription

CQ_UNIT_SIZE = 20
_FILE_NAME = re.compile(r"^\d{20}$")
_CQ_UNIT = np.dtype([("phy", ">i8"), ("size", ">i4"), ("tags", ">i8")])
DEFAULT_BATCH_ROWS = 65536
DEFAULT_BATCH_BYTES = 64 << 20
_LISTING_ATTEMPTS = 5
_SETTLED_NS = 2_000_000_000     # a folder unchanged this long before a listing: the listing is kept

# The seam's types (rmq_source.backend): a store answers in them directly.
__all__ = ["Store", "QueueInfo", "DataLossCallback", "ShortReadCallback", "native_rows"]


def native_rows(batch: pa.RecordBatch, topic: str, broker_name: str, queue_id: int) -> pa.RecordBatch:
    """The C core's columns (NATIVE_SCHEMA) -> the full row schema: add topic and brokerName,
    decompress bodies. topic and queueId are those of the queue read; they equal the record's own
    fields except for light message queues (LMQ), whose records carry the parent topic's. A body
    that does not decompress raises RmqCorruptStoreError with its record's physical offset."""
    n = batch.num_rows
    return _full_rows(batch, repeat_string(topic, n), broker_name,
                      int32_array(np.full(n, queue_id, dtype=np.int32)))


def native_rows_of_queues(parts: list[tuple[pa.RecordBatch, str, np.ndarray]], broker_name: str
                          ) -> pa.RecordBatch:
    """:func:`native_rows` of the C core's batches of queues of one broker, given as (batch,
    topic, int32 array of the queue id of each row), as one batch in that order (one
    conversion, not one per queue)."""
    if len(parts) == 1:
        batch, topic, queue_ids = parts[0]
        return _full_rows(batch, repeat_string(topic, batch.num_rows), broker_name,
                          int32_array(queue_ids))
    topics = pa.concat_arrays([repeat_string(t, b.num_rows) for b, t, _ in parts])
    queue_ids = int32_array(np.concatenate([q for _, _, q in parts]))
    return _full_rows(pa.concat_batches([b for b, _, _ in parts]), topics, broker_name, queue_ids)


def _full_rows(batch: pa.RecordBatch, topics: pa.Array, broker_name: str, queue_ids: pa.Array
               ) -> pa.RecordBatch:
    columns = [topics, repeat_string(broker_name, batch.num_rows)]
    columns.extend(batch.columns)
    columns[_QUEUE_ID] = queue_ids
    columns[_BODY] = decompress_bodies(columns[_BODY], columns[_SYS_FLAG], columns[_CL_OFFSET])
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


_QUEUE_ID, _BODY, _SYS_FLAG, _CL_OFFSET = (ARROW_SCHEMA.get_field_index(n) for n in
                                           ("queueId", "body", "sysFlag", "commitLogOffset"))


def _segment_files(folder: str) -> list[tuple[int, str]]:
    """Mapped files of a folder as (start offset, path), sorted; other names are ignored.

    What is named like a mapped file must be a regular file: the broker never makes links (one
    could point at any file of the machine), FIFOs (opening one blocks) or devices.
    """
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return []
    out = []
    for e in entries:
        if not _FILE_NAME.match(e.name):
            continue
        if e.is_symlink():
            raise RmqStoreLayoutError(f"{e.path} is a symlink (to {os.readlink(e.path)}); the store's "
                                      "mapped files must be regular files inside it")
        if not e.is_file(follow_symlinks=False) and os.path.lexists(e.path):
            raise RmqStoreLayoutError(f"{e.path} is not a regular file; refusing to open it")
        out.append((int(e.name), e.path))
    return sorted(out)


def _check_real_dirs(*paths: str) -> None:
    """Topic and queue folders are created by the broker: real folders, never symlinks."""
    for p in paths:
        if os.path.islink(p):
            raise RmqStoreLayoutError(f"{p} is a symlink (to {os.readlink(p)}); ConsumeQueue "
                                      "folders must be real folders inside the store")


def _check_subscription(subscription: str | Subscription | None) -> Subscription:
    if isinstance(subscription, Subscription):
        return subscription
    if subscription is None or isinstance(subscription, str):
        return Subscription.parse(subscription)
    raise RmqOptionError(f"subscription must be a tag expression string, got {subscription!r}")


def _check_offset(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RmqOptionError(f"{name} must be an integer >= 0, got {value!r}")
    return value


class Store:
    """A read-only view of one broker's store directory.

    ``commitlog_file_size`` and ``cq_file_size`` (bytes) default to the size of the existing files,
    which the broker always creates at full size; pass them when a folder holds a single file that
    may not be full size (for example a store copied without sparse tails).
    """

    def __init__(self, root: str | os.PathLike, *, broker_name: str = "broker-a",
                 commitlog_file_size: int | None = None, cq_file_size: int | None = None):
        self.root = os.path.abspath(os.fspath(root))
        if not os.path.isdir(self.root):
            raise RmqStoreLayoutError(f"store root {self.root!r} is not a directory")
        self.layout = store_layout.detect(self.root)
        self._rocks = RocksQueues(self.root) if self.layout.rocksdb_cq else None
        if not broker_name or not isinstance(broker_name, str):
            raise RmqOptionError(f"broker_name must be a non-empty string, got {broker_name!r}")
        for name, value in (("commitlog_file_size", commitlog_file_size), ("cq_file_size", cq_file_size)):
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise RmqOptionError(f"{name} must be a positive integer, got {value!r}")
        if cq_file_size is not None and cq_file_size % CQ_UNIT_SIZE:
            raise RmqOptionError(f"cq_file_size must be a multiple of 20, got {cq_file_size}")
        self.broker_name = broker_name
        self._cl_file_size = commitlog_file_size
        self._cq_file_size = cq_file_size
        self._segments: dict[str, dict[str, native.Segment]] = {}   # folder -> path -> mapping
        self._listings: dict[str, tuple[tuple, tuple[list, int]]] = {}  # see _segments_of
        self._min_offsets: dict[tuple[str, int], tuple[list, int, int]] = {}  # see queue_info
        self._queue_files_kept: dict[tuple[str, int], native.QueueFiles] = {}  # see _queue_files
        self._commitlog: tuple[list, int, native.CommitLog] | None = None
        self._polled: dict[str, PolledTopic] = {}   # topic -> see queue_infos
        self._lock = threading.RLock()

    def _check_root(self) -> None:
        """An empty listing is normal for a folder (a queue without messages), not for a store
        whose root has gone: that is said, naming the path, rather than read as empty queues."""
        if not os.path.isdir(self.root):
            raise RmqStoreLayoutError(
                f"store root {self.root!r} of broker {self.broker_name!r} no longer exists (removed "
                f"or unmounted after it was opened); {store_layout.EXPECTED}")
        if not self.layout.present():
            raise RmqStoreLayoutError(
                f"store root {self.root!r} of broker {self.broker_name!r} no longer has a "
                f"{self.layout.missing_text()} folder (removed after the store was opened)")

    # -- mapped files -------------------------------------------------------------------------
    def _segment(self, folder: str, path: str, start: int) -> native.Segment:
        """A mapping of ``path``, re-made when the file changed size or was replaced."""
        st = os.stat(path)
        mapped = self._segments.setdefault(folder, {})
        seg = mapped.get(path)
        if seg is not None and (seg.size != st.st_size or getattr(seg, "_ino", None) != st.st_ino):
            seg.close()
            seg = None
        if seg is None:
            seg = native.map_segment(path, start)
            seg._ino = st.st_ino
            mapped[path] = seg
        return seg

    def _forget_missing(self, folder: str, present: set[str]) -> None:
        mapped = self._segments.get(folder)
        if not mapped:
            return
        for path in [p for p in mapped if p not in present]:
            mapped.pop(path).close()

    def _segments_of(self, folder: str, file_size: int | None, what: str, *, real_dir: bool = False
                     ) -> tuple[list, int]:
        """Mapped files of ``folder`` (sorted, consecutive) and the file size; ``real_dir``: the
        folder must not be a symlink (see :func:`_check_real_dirs`).

        A directory listing is not a snapshot (a file created while ``listdir`` runs may be
        missed) and retention deletes files at any time: a listing with a gap or a file that
        vanished before it was mapped is made again; only a persistent problem is an error.

        A listing is reused while the folder's (inode, mtime) stays what it was and its files
        were all full size, so an idle queue costs one ``stat``: files are created, deleted and
        replaced only by changing the folder, which moves its mtime. Only a folder unchanged for
        :data:`_SETTLED_NS` before it was listed is remembered: a change in the same clock tick
        as the listing could leave its mtime as it was.
        """
        try:
            st = os.lstat(folder) if real_dir else os.stat(folder)
            key = (st.st_dev, st.st_ino, st.st_mtime_ns)
        except FileNotFoundError:
            key = None
        else:
            if real_dir and stat.S_ISLNK(st.st_mode):
                _check_real_dirs(folder)
        hit = self._listings.get(folder)
        if hit is not None and hit[0] == key and (file_size is None or hit[1][1] == file_size):
            return hit[1]
        self._listings.pop(folder, None)
        listed_at = time.time_ns()
        for attempt in range(_LISTING_ATTEMPTS):
            try:
                got = self._map_listing(folder, _segment_files(folder), file_size, what)
                break
            except FileNotFoundError:   # includes RmqStoreLayoutError
                if attempt == _LISTING_ATTEMPTS - 1:
                    raise
                time.sleep(0.002 * (attempt + 1))
        segs, size = got
        if (key is not None and listed_at - key[2] > _SETTLED_NS and segs
                and all(seg.size == size for seg in segs)):
            self._listings[folder] = (key, got)
        return got

    def _map_listing(self, folder: str, files: list[tuple[int, str]], file_size: int | None,
                     what: str) -> tuple[list, int]:
        self._forget_missing(folder, {p for _, p in files})
        if not files:
            return [], file_size or 0
        if file_size is None:
            # A zero-length file is one being created (opened, not yet sized): nothing to read.
            sizes = [s for s in (os.path.getsize(p) for _, p in files) if s > 0]
            if not sizes:
                return [], 0
            file_size = sizes[0]
        for (a, pa_), (b, _) in zip(files, files[1:]):
            if b - a != file_size:
                raise RmqStoreLayoutError(
                    f"{what} files are not consecutive: {pa_} starts at {a} and the next at {b}, "
                    f"expected a step of the file size {file_size}")
        return [self._segment(folder, p, s) for s, p in files], file_size

    def commitlog(self) -> native.CommitLog:
        """The CommitLog as currently on disk (its folders looked at on every call; the same
        object while their listings are kept, see :meth:`_segments_of`). A DLedger store's
        address space is its DLedger data files above the ``commitlog/`` files it may have kept
        from before the switch (:mod:`rmq_source.store.layout`)."""
        with self._lock:
            listed = tuple(self._segments_of(folder, self._cl_file_size, "CommitLog")
                           for folder in self.layout.commitlog_dirs())
            segs, size, dledger_from = self._address_space(listed)
            if not segs:
                self._check_root()
            if size and self._cl_file_size is None:
                self._cl_file_size = size
            kept = self._commitlog
            if (kept is not None and len(kept[0]) == len(listed)
                    and all(a[0] is b[0] for a, b in zip(kept[0], listed)) and kept[1] == size):
                return kept[2]
            cl = native.CommitLog(segs, size or 1, dledger_from)
            self._commitlog = (listed, size, cl)
            return cl

    def _address_space(self, listed: tuple) -> tuple[list, int, int | None]:
        """(segments, file size, DLedger start) of the listed CommitLog folders."""
        if self.layout.dledger_dir is None:
            segs, size = listed[0]
            return segs, size, None
        (low, low_size), (high, high_size) = listed
        if low and high and (low_size != high_size
                             or high[0].file_start != low[-1].file_start + low_size):
            raise RmqStoreLayoutError(
                f"the DLedger CommitLog {self.layout.dledger_data} does not continue the "
                f"commitlog/ files it follows: its first file starts at {high[0].file_start} "
                f"(file size {high_size}), the last commitlog/ file at {low[-1].file_start} "
                f"(file size {low_size})")
        start = high[0].file_start if high else (low[-1].file_start + low_size if low else 0)
        return low + high, high_size or low_size, start

    def _queue_dir(self, topic: str, queue_id: int) -> str:
        return f"{self.root}/consumequeue/{topic}/{queue_id}"

    def _cq(self, topic: str, queue_id: int, topic_checked: bool = False) -> tuple[list, int]:
        if self._rocks is not None:
            with self._lock:
                segs, size = self._rocks.segments(topic, queue_id)
                if not segs:
                    self._check_root()
                return segs, size
        if not topic_checked:
            _check_real_dirs(f"{self.root}/consumequeue/{topic}")
        with self._lock:
            segs, size = self._segments_of(self._queue_dir(topic, queue_id), self._cq_file_size,
                                           f"ConsumeQueue {topic}/{queue_id}", real_dir=True)
            if not segs:
                self._check_root()
            if size and self._cq_file_size is None and len(segs) > 1:
                self._cq_file_size = size
            if size % CQ_UNIT_SIZE:
                raise RmqStoreLayoutError(
                    f"ConsumeQueue {topic}/{queue_id} file size {size} is not a multiple of 20")
            return segs, size

    # -- topics and queues --------------------------------------------------------------------
    def _configured_topics(self) -> dict[str, dict]:
        from rmq_source.store.config_files import read_topics
        return read_topics(self.root) or {}

    def topics(self) -> list[str]:
        """Topics that have ConsumeQueue folders or are configured in ``config/topics.json``."""
        self._check_root()
        found = set()
        cq_root = os.path.join(self.root, "consumequeue")
        if os.path.isdir(cq_root):
            found.update(n for n in os.listdir(cq_root) if os.path.isdir(os.path.join(cq_root, n)))
        if self._rocks is not None:
            found.update(self._rocks.queues())
        found.update(self._configured_topics())
        return sorted(found)

    def queue_ids(self, topic: str) -> list[int]:
        """Queue ids of ``topic``: its ConsumeQueue folders and the configured readable queues.

        A configured queue that never received a message has no folder (the broker creates it with
        its first unit); it is listed with min = max = 0.
        """
        self._check_root()
        ids: set[int] = set()
        folder = os.path.join(self.root, "consumequeue", topic)
        if self._rocks is not None:
            ids.update(self._rocks.queues().get(topic, ()))
        elif os.path.isdir(folder):
            ids.update(int(n) for n in os.listdir(folder) if n.isdigit())
        conf = self._configured_topics().get(topic)
        store_layout.check_topic_queue_type(self.root, topic, conf)
        if conf is not None and int(conf.get("perm", 6)) & 4:
            ids.update(range(int(conf.get("readQueueNums", 0))))
        if not ids and conf is None:
            raise RmqUnknownTopicError(
                f"topic {topic!r} is not in store {self.root!r} (known: {', '.join(self.topics()) or 'none'})")
        return sorted(ids)

    def max_offset(self, topic: str, queue_id: int) -> int:
        """Next queue offset to be written (one past the last valid ConsumeQueue unit)."""
        segs, _ = self._cq(topic, queue_id)
        return self._max_of(segs)

    @staticmethod
    def _max_of(segs: list) -> int:
        if not segs:
            return 0
        last = segs[-1]
        return (last.file_start + native.cq_valid_units(last) * CQ_UNIT_SIZE) // CQ_UNIT_SIZE

    def min_offset(self, topic: str, queue_id: int) -> int:
        """First queue offset whose CommitLog record still exists (retention moves it forward)."""
        segs, _ = self._cq(topic, queue_id)
        return self._min_offset(segs, self.commitlog().min_offset)

    @staticmethod
    def _min_offset(segs: list, cl_min: int) -> int:
        return Store._min_offset_found(segs, cl_min)[0]

    @staticmethod
    def _min_offset_found(segs: list, cl_min: int) -> tuple[int, bool]:
        """(min offset, whether a written unit at or above ``cl_min`` was found: then the answer
        holds as long as these files and ``cl_min`` do, since written units never change)."""
        for seg in segs:
            valid = native.cq_valid_units(seg)
            idx = native.cq_first_unit_at_or_above(seg, cl_min)
            if idx < valid:
                return (seg.file_start + idx * CQ_UNIT_SIZE) // CQ_UNIT_SIZE, True
            if valid * CQ_UNIT_SIZE < seg.size:  # the live file ends here: nothing readable
                return (seg.file_start + valid * CQ_UNIT_SIZE) // CQ_UNIT_SIZE, False
        return (segs[-1].file_start // CQ_UNIT_SIZE + segs[-1].size // CQ_UNIT_SIZE if segs else 0), False

    def queue_info(self, topic: str, queue_id: int, *, commitlog: native.CommitLog | None = None,
                   _topic_checked: bool = False) -> QueueInfo:
        """Min/max offsets of one queue; ``commitlog`` (default: listed now) may be shared by
        the calls of one planning pass."""
        segs, _ = self._cq(topic, queue_id, _topic_checked)
        if not segs:
            return QueueInfo(topic, queue_id, 0, 0)
        max_off = self._max_of(segs)
        cl_min = (self.commitlog() if commitlog is None else commitlog).min_offset
        min_off = self._min_offset_kept(topic, queue_id, segs, cl_min)
        return QueueInfo(topic, queue_id, min(min_off, max_off), max_off)

    def _min_offset_kept(self, topic: str, queue_id: int, segs: list, cl_min: int) -> int:
        """:meth:`_min_offset` of the queue's listing ``segs``, remembered while that listing
        and ``cl_min`` stay (written units never change)."""
        known = self._min_offsets.get((topic, queue_id))
        if known is not None and known[0] is segs and known[1] == cl_min:
            return known[2]
        min_off, found = self._min_offset_found(segs, cl_min)
        if found:      # (segs is the kept listing while the folder is unchanged)
            self._min_offsets[(topic, queue_id)] = (segs, cl_min, min_off)
        return min_off

    def _queue_files(self, topic: str, queue_id: int, segs: list, cq_size: int
                     ) -> native.QueueFiles:
        """The C view of the queue's listing ``segs``, remembered while that listing stays."""
        known = self._queue_files_kept.get((topic, queue_id))
        if known is not None and known.segments_of is segs and known.file_size == cq_size:
            return known
        files = native.QueueFiles(segs, cq_size)
        if self._queue_dir(topic, queue_id) in self._listings:   # a kept listing (else no reuse)
            self._queue_files_kept[(topic, queue_id)] = files
        return files

    def queue_infos(self, topic: str, queue_ids) -> list[QueueInfo]:
        """:meth:`queue_info` of several queues, listing the CommitLog folder once; queues whose
        folder is unchanged since their listing was kept are answered in one C call
        (:class:`rmq_source.store.queue_poll.PolledTopic`)."""
        cl = self.commitlog()
        if self._rocks is not None:
            return [self.queue_info(topic, q, commitlog=cl) for q in queue_ids]
        topic_dir = f"{self.root}/consumequeue/{topic}"
        _check_real_dirs(topic_dir)
        with self._lock:
            polled = self._polled.get(topic)
            if polled is None:
                polled = self._polled[topic] = PolledTopic(topic)
            return polled.infos(self, topic_dir, queue_ids, cl.min_offset, cl)

    def _kept(self, topic: str, queue_id: int, cl_min: int):
        """(folder key, live file, file size, min offset or None) of the queue's kept listing,
        the min offset being the one kept for ``cl_min`` with that listing; None when nothing is
        kept."""
        hit = self._listings.get(self._queue_dir(topic, queue_id))
        if hit is None or not hit[1][0]:
            return None
        key, (segs, size) = hit
        known = self._min_offsets.get((topic, queue_id))
        found = known is not None and known[0] is segs and known[1] == cl_min
        return key, segs[-1], size, known[2] if found else None

    def queues(self, topics: list[str] | None = None) -> list[QueueInfo]:
        """Every queue of ``topics`` (default: all topics) with its current min/max offsets."""
        out = []
        for topic in (self.topics() if topics is None else topics):
            out.extend(self.queue_infos(topic, self.queue_ids(topic)))
        return out

    # -- reading ------------------------------------------------------------------------------
    def iter_batches(self, topic: str, queue_id: int, start: int, end: int, *,
                     subscription: str | Subscription | None = "*",
                     batch_rows: int = DEFAULT_BATCH_ROWS, batch_bytes: int = DEFAULT_BATCH_BYTES,
                     verify_crc: bool = False,
                     on_data_loss: DataLossCallback | None = None,
                     on_short_read: ShortReadCallback | None = None,
                     columns: tuple[str, ...] | None = None) -> Iterator[pa.RecordBatch]:
        """Yield the messages of queue offsets ``[start, end)`` that match ``subscription``
        (many ranges at once: :func:`rmq_source.store.range_reads.read_ranges`).

        Rows come in ascending queue offset, bodies decompressed, with the full row schema. When
        retention deleted part of the range, ``on_data_loss(first_lost, first_readable)`` is
        called and reading goes on from ``first_readable``; without a callback
        :class:`RmqDataLossError` is raised.

        Without ``on_short_read`` the range stops early at the first unit not yet written (a live
        queue; a queue without a ConsumeQueue folder has none). With it, the range is one that was
        planned below the queue's max offset, so every unit of it was written: when the queue ends
        before ``end`` (its ConsumeQueue folder was removed, it holds fewer units than planned, or
        the store root was removed) ``on_short_read(first_unread, end, reason)`` is called and the
        read stops; nothing is skipped without that call. ``columns``: the columns the caller
        uses (None: all); others may come empty or null (:func:`native.skip_bits`).
        """
        _check_offset("start", start)
        _check_offset("end", end)
        if end < start:
            raise RmqOptionError(f"end ({end}) must be >= start ({start})")
        if batch_rows <= 0 or batch_bytes <= 0:
            raise RmqOptionError("batch_rows and batch_bytes must be positive")
        sub = _check_subscription(subscription)
        codes = sub.codes if sub.tag_filter else None     # SQL92: the caller filters rows
        tags = sub.tags if sub.tag_filter else None
        skip = native.skip_bits(columns)
        pos = start
        while pos < end:
            try:
                segs, cq_size = self._cq(topic, queue_id)
                if not segs:
                    if on_short_read is not None:
                        on_short_read(pos, end, self._queue_gone(topic, queue_id))
                    return
                # Units are written after their record: every unit below this end points into a
                # CommitLog file that already exists when the CommitLog is listed next.
                written = self._max_of(segs)
                cl = self.commitlog()
            except RmqStoreLayoutError:
                if on_short_read is None or self.layout.present():
                    raise
                on_short_read(pos, end, self._root_gone())
                return
            min_off = self._min_offset(segs, cl.min_offset)
            if pos < min_off:
                # report everything lost from pos (the callback's contract), read on from min
                self._data_loss(topic, queue_id, pos, min_off, on_data_loss)
                pos = min(min_off, end)
                continue
            stop = min(end, written)
            if pos >= stop:
                if on_short_read is not None and written < end:
                    on_short_read(pos, end, self._queue_ends(written, end))
                return
            res = native.scan_queue(cl, segs, cq_size, pos, stop, codes=codes, tags=tags,
                                    max_rows=batch_rows, max_bytes=batch_bytes, verify_crc=verify_crc,
                                    topic=topic, queue_id=queue_id, skip=skip)
            if res.batch.num_rows:
                yield self._finish([(res.batch, topic,
                                     np.full(res.batch.num_rows, queue_id, np.int32))])
            self._raise_if_damage(topic, queue_id, segs, res.status, res.next_offset, cl)
            if res.next_offset <= pos:   # every status above moves on; never stop silently
                raise AssertionError(f"scan of {topic}/{queue_id} made no progress at offset {pos} "
                                     f"(status {res.status})")
            pos = res.next_offset

    # -- why a planned range ends early (on_short_read), and scan statuses that are damage --------
    def _queue_gone(self, topic: str, queue_id: int) -> str:
        return (f"its ConsumeQueue folder {self._queue_dir(topic, queue_id)} no longer exists or "
                "has no files (the topic or queue was deleted)")

    def _root_gone(self) -> str:
        return (f"the store root {self.root} of broker {self.broker_name!r} no longer exists (or "
                f"lost its {self.layout.missing_text()})")

    @staticmethod
    def _queue_ends(written: int, end: int) -> str:
        return (f"its ConsumeQueue ends at offset {written}, before the planned end {end} (the "
                "queue was truncated or recreated)")

    def _raise_if_damage(self, topic: str, queue_id: int, segs: list, status: str,
                         next_offset: int, cl: native.CommitLog) -> None:
        """A scan of units below the listed end that stopped with CL_GONE or CQ_END met damage:
        ``cl`` is one listing and the min offset comes from it, units point to growing physical
        offsets, so a unit at or above the min offset that points below the CommitLog min is not
        retention (retrying would spin forever); every unit below the listed end was valid when
        it was counted and units are never unwritten, so an invalid one is not the live edge."""
        if status == "CL_GONE":
            raise self._bad_unit(topic, queue_id, segs, next_offset,
                                 f"points below the CommitLog min offset {cl.min_offset} "
                                 "although earlier units point above it")
        if status == "CQ_END":
            raise self._bad_unit(topic, queue_id, segs, next_offset,
                                 "is not a valid unit although later units are")

    @staticmethod
    def _bad_unit(topic: str, queue_id: int, segs: list, offset: int, what: str):
        addr = offset * CQ_UNIT_SIZE
        seg = next(s for s in reversed(segs) if s.file_start <= addr)
        pos = addr - seg.file_start
        return RmqCorruptStoreError(
            f"BAD_UNIT: ConsumeQueue {topic}/{queue_id}: the unit at queue offset {offset} {what} "
            f"(file {seg.path}, position {pos})", path=seg.path, position=pos, code="BAD_UNIT")

    def _data_loss(self, topic: str, queue_id: int, lost_from: int, readable: int,
                   callback: DataLossCallback | None) -> None:
        if callback is None:
            raise RmqDataLossError(
                f"queue {topic}/{self.broker_name}/{queue_id}: offsets [{lost_from}, {readable}) "
                f"({readable - lost_from} messages) were deleted by retention before they were read")
        callback(lost_from, readable)

    def read(self, topic: str, queue_id: int, start: int, end: int, **kwargs) -> pa.RecordBatch:
        """All matching messages of ``[start, end)`` as one RecordBatch (see :meth:`iter_batches`)."""
        batches = list(self.iter_batches(topic, queue_id, start, end, **kwargs))
        if not batches:
            return empty_batch(ARROW_SCHEMA)
        if len(batches) == 1:
            return batches[0]
        return pa.Table.from_batches(batches, schema=ARROW_SCHEMA).combine_chunks().to_batches()[0]

    def _finish(self, parts: list[tuple[pa.RecordBatch, str, np.ndarray]]) -> pa.RecordBatch:
        """The C core's batches as (batch, topic, queue id of each row) -> one batch of the
        full row schema (:func:`native_rows_of_queues`), a body's error naming its file."""
        try:
            return native_rows_of_queues(parts, self.broker_name)
        except RmqCorruptStoreError as exc:
            if exc.path is not None or exc.position is None or not self._cl_file_size:
                raise
            # decompress_bodies reports the record's physical offset: name its file and position
            start = exc.position - exc.position % self._cl_file_size
            path = os.path.join(self._commitlog_folder(exc.position), f"{start:020d}")
            raise RmqCorruptStoreError(f"{exc} (file {path}, position {exc.position - start})",
                                       path=path, position=exc.position - start,
                                       code=exc.code) from exc

    def _commitlog_folder(self, phy: int) -> str:
        """The folder of the CommitLog file holding physical offset ``phy``."""
        kept = self._commitlog
        dledger_from = kept[2].dledger_from if kept is not None else None
        if dledger_from is not None and phy >= dledger_from:
            return self.layout.dledger_data
        return self.layout.commitlog_dir

    def _unit_sizes(self, topic: str, queue_id: int, start: int, end: int) -> np.ndarray:
        """Record sizes of the ConsumeQueue units ``[start, end)`` (read from the CQ files); shorter
        when the files end first or a file of the range is missing (the prefix before the gap)."""
        segs, cq_size = self._cq(topic, queue_id)
        parts = []
        pos, stop = start * CQ_UNIT_SIZE, end * CQ_UNIT_SIZE
        for seg in segs:
            lo, hi = max(pos, seg.file_start), min(stop, seg.file_start + cq_size)
            if lo >= hi:
                continue
            if lo != pos:  # a missing file (retention): what follows is not aligned with ``start``
                break
            pos = hi
            with open(seg.path, "rb") as f:
                raw = os.pread(f.fileno(), hi - lo, lo - seg.file_start)
            parts.append(np.frombuffer(raw[: len(raw) - len(raw) % CQ_UNIT_SIZE], dtype=_CQ_UNIT)["size"])
        sizes = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
        return np.maximum(sizes, 0)

    def unit_sizes(self, topic: str, queue_id: int, start: int, end: int) -> np.ndarray:
        """Record sizes of the messages at queue offsets ``start``, ``start + 1``, ... (at most
        ``end - start``; fewer when the queue's files end or have a gap first)."""
        return self._unit_sizes(topic, queue_id, start, end)

    def range_bytes(self, topic: str, queue_id: int, start: int, end: int) -> int:
        """Total CommitLog bytes of the messages in queue offsets ``[start, end)``."""
        return int(self._unit_sizes(topic, queue_id, start, end).sum())

    def count_within_bytes(self, topic: str, queue_id: int, start: int, end: int, budget: int) -> int:
        """How many messages from ``start`` (at most ``end - start``) fit in ``budget`` bytes.

        At least one message is admitted when the range is not empty, so a message larger than
        the budget still makes progress.
        """
        sizes = self._unit_sizes(topic, queue_id, start, end)
        if sizes.size == 0:
            return 0
        fit = int(np.searchsorted(np.cumsum(sizes), budget, side="right"))
        return max(1, fit)

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """Smallest queue offset whose storeTimestamp >= ``timestamp_ms`` (RocketMQ 5 LOWER bound).

        Before the first message this is ``min_offset``; after the last message it is
        ``max_offset`` (the next message to be written), so a read from there returns only newer
        messages. A queue with no messages returns 0.
        """
        if isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, int):
            raise RmqOptionError(f"timestamp_ms must be an integer (epoch ms), got {timestamp_ms!r}")
        cl = self.commitlog()
        info = self.queue_info(topic, queue_id, commitlog=cl)
        if info.max_offset == info.min_offset:
            return info.max_offset
        segs, cq_size = self._cq(topic, queue_id)
        return native.lookup_time(cl, segs, cq_size, info.min_offset, info.max_offset, timestamp_ms)

    def consumer_offsets(self) -> dict[tuple[str, str], dict[int, int]]:
        """The broker's own ``config/consumerOffset.json``: {(topic, group): {queueId: offset}}."""
        from rmq_source.store.config_files import read_consumer_offsets
        return read_consumer_offsets(self.root)

    # -- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            self._listings.clear()
            self._min_offsets.clear()
            self._polled.clear()
            self._queue_files_kept.clear()
            self._commitlog = None
            if self._rocks is not None:
                self._rocks.close()
            for mapped in self._segments.values():
                for seg in mapped.values():
                    seg.close()
            self._segments.clear()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.root!r}, broker_name={self.broker_name!r})"
