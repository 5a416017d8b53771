"""ConsumeQueue dispatch: one 20-byte unit per message of a queue (physical offset, size, tags
code), files created on demand; the size is written last, so a reader that sees a valid unit sees
all of it. At most ``max_open_queue_files`` files are mapped at once, whatever the number of
queues: a queue's file is mapped while there is room, and a queue that finds no room writes its
units with ``pwrite`` through a descriptor opened for the write. (Closing mappings to make room
made every write of queues taken in turn fault on a fresh mapping, milliseconds each.)"""
from __future__ import annotations

import mmap
import os
import resource
from pathlib import Path

from rmq_source.store import record_codec as rc
from rmq_source.store.mapped_files import MappedFile, file_name, list_files, open_full_size
from rmq_source.subscription import tags_code

_CQ_PACK = rc.CQ_UNIT.pack_into


class QueueState:
    """Write state of one ConsumeQueue: ``next_offset`` is the queue offset the next unit gets."""

    __slots__ = ("topic", "queue_id", "folder", "next_offset", "file", "mm", "file_first",
                 "file_end")

    def __init__(self, topic: str, queue_id: int, folder: Path, next_offset: int):
        self.topic, self.queue_id, self.folder = topic, queue_id, folder
        self.next_offset = next_offset
        self.file: MappedFile | None = None
        self.mm: mmap.mmap | None = None
        self.file_first = 0   # queue offset of the first unit of the mapped file
        self.file_end = 0     # one past its last unit



def _pre_blank(q: QueueState, offset: int, first: int) -> bytes:
    """What a new file of ``q`` starting at unit ``first`` holds before unit ``offset``: nothing,
    unless it is the queue's first file and the queue starts mid-file, which the broker fills
    with pre-blank units (0, 0x7FFFFFFF, 0)."""
    if offset > first and not list_files(q.folder)[:-1]:
        return rc.encode_cq_unit(0, 0x7FFFFFFF, 0) * (offset - first)
    return b""


def default_open_queue_files() -> int:
    """A quarter of the process's descriptor limit (a mapped file holds two), 16 to 1024."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1024
    return max(16, min(1024, soft // 4))


class ConsumeQueueDispatch:
    """Part of :class:`~rmq_source.store.writer.StoreWriter`: its ConsumeQueues."""

    def _queue(self, topic: str, queue_id: int, next_offset: int) -> QueueState:
        q = self._queues.get((topic, queue_id))
        if q is None:
            q = QueueState(topic, queue_id, self._cq_root / topic / str(queue_id), next_offset)
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


    # ------------------------------------------------------------------------------ ConsumeQueue

    def _put_unit(self, q: QueueState, phy: int, size: int, code: int) -> None:
        """Write the unit for ``q.next_offset``: phy and tagsCode first, then the size as one
        aligned 4-byte store, so a reader that sees size > 0 also sees the rest."""
        off = q.next_offset
        if q.file is None or not (q.file_first <= off < q.file_end):
            if q.file is None and len(self._mapped_queues) >= self.max_open_queue_files:
                self._write_unit_unmapped(q, off, phy, size, code)
                return
            self._map_queue_file(q, off)
        pos = (off - q.file_first) * 20
        _CQ_PACK(q.mm, pos, phy, 0, code)
        q.mm[pos + 8:pos + 12] = size.to_bytes(4, "big")    # size > 0 makes the unit valid: last
        q.next_offset = off + 1

    def _write_unit_unmapped(self, q: QueueState, off: int, phy: int, size: int, code: int) -> None:
        """:meth:`_put_unit` through ``pwrite`` (same bytes, same order: the size last); the file
        is created as the mapped path creates it and fsync-ed by the next flush()."""
        first = off - off % self.cq_units_per_file
        path = q.folder / file_name(first * rc.CQ_UNIT_SIZE)
        try:
            fd, new = open_full_size(path, self.cq_file_size, create=True)
        except FileNotFoundError:            # the queue's first file: its folder is made now
            q.folder.mkdir(parents=True, exist_ok=True)
            fd, new = open_full_size(path, self.cq_file_size, create=True)
        try:
            if new:
                os.pwrite(fd, _pre_blank(q, off, first), 0)
            pos = (off - first) * rc.CQ_UNIT_SIZE
            os.pwrite(fd, phy.to_bytes(8, "big", signed=True), pos)
            os.pwrite(fd, code.to_bytes(8, "big", signed=True), pos + 12)
            os.pwrite(fd, size.to_bytes(4, "big"), pos + 8)      # size > 0 makes the unit valid: last
        finally:
            os.close(fd)
        self._closed_unsynced.add(path)
        q.next_offset = off + 1

    def _unmap(self, q: QueueState) -> None:
        """Close the queue's mapped file (written pages stay in the page cache; flush() fsyncs
        the file)."""
        self._closed_unsynced.add(q.file.path)
        q.file.close()
        q.file = q.mm = None
        q.file_first = q.file_end = 0      # the append fast path then maps again
        self._mapped_queues.pop(q, None)

    def _map_queue_file(self, q: QueueState, offset: int) -> None:
        if q.file is not None:
            self._unmap(q)
        while len(self._mapped_queues) >= self.max_open_queue_files:
            self._unmap(next(iter(self._mapped_queues)))
        units = self.cq_units_per_file
        first = offset - offset % units
        q.folder.mkdir(parents=True, exist_ok=True)
        path = q.folder / file_name(first * rc.CQ_UNIT_SIZE)
        new = not path.exists()
        q.file = MappedFile(path, first * rc.CQ_UNIT_SIZE, self.cq_file_size, create=True)
        q.mm = q.file.mm
        q.file_first, q.file_end = first, first + units
        self._mapped_queues[q] = None
        if new:
            blank = _pre_blank(q, offset, first)
            q.file.mm[0:len(blank)] = blank

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
