"""Python face of the C core's ``rmq_cq_poll``: many queue folders of one topic polled in one call.

A :class:`FolderPoll` holds, per slot (one queue id each), what the caller last listed of the
queue's folder: its key ``(st_dev, st_ino, st_mtime_ns)`` as ``os.lstat`` gives it and the mapping
of its live (last) ConsumeQueue file. :meth:`FolderPoll.poll` asks C, for the selected slots,
whether each folder is still that real folder and, for those that are, counts the valid units of
the live file. The arrays live in C memory and are read as numpy views (no Python object per
queue per call).
"""
from __future__ import annotations

import os

import numpy as np

from rmq_source.errors import RmqOptionError
from rmq_source.store.native import Segment, ffi, lib

_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_UINT64_MAX = (1 << 64) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class FolderPoll:
    """Kept folder keys and live-file mappings of the queues ``queue_ids`` of one topic folder.

    Slot ``i`` is queue ``queue_ids[i]``; :meth:`add` appends slots. A slot is polled only while
    it keeps something (:meth:`keep`); a new slot keeps nothing.
    """

    def __init__(self) -> None:
        self.queue_ids: list[int] = []
        self._cap = 0
        self._handles: list = []    # the live mappings' handles, kept alive while referenced
        self._grow(16)

    def _grow(self, cap: int) -> None:
        old = self._cap
        ids, dev_ino, mtime = (ffi.new("int32_t[]", cap), ffi.new("uint64_t[]", 2 * cap),
                               ffi.new("int64_t[]", cap))
        live, units, same = (ffi.new("rmq_segment *[]", cap), ffi.new("int64_t[]", cap),
                             ffi.new("int8_t[]", cap))
        if old:
            ffi.memmove(ids, self._ids, old * 4)
            ffi.memmove(dev_ino, self._dev_ino, 2 * old * 8)
            ffi.memmove(mtime, self._mtime, old * 8)
            ffi.memmove(live, self._live, old * ffi.sizeof("rmq_segment *"))
            ffi.memmove(units, self._units, old * 8)
        self._ids, self._dev_ino, self._mtime = ids, dev_ino, mtime
        self._live, self._units, self._same = live, units, same
        self.units = np.frombuffer(ffi.buffer(units), np.int64)   # valid units of each live file
        self.same = np.frombuffer(ffi.buffer(same), np.int8)      # last poll: 1 = unchanged
        self._cap = cap

    def add(self, queue_id: int) -> int:
        """A new slot for ``queue_id`` (keeping nothing); returns its index."""
        if (isinstance(queue_id, bool) or not isinstance(queue_id, int)
                or not _INT32_MIN <= queue_id <= _INT32_MAX):
            raise RmqOptionError(f"queue id must be an int in [{_INT32_MIN}, {_INT32_MAX}], "
                                 f"got {queue_id!r}")
        i = len(self.queue_ids)
        if i == self._cap:
            self._grow(2 * self._cap)
        self._ids[i] = queue_id
        self._live[i] = ffi.NULL
        self._units[i] = 0
        self.queue_ids.append(queue_id)
        self._handles.append(None)
        return i

    def keep(self, i: int, key: tuple[int, int, int] | None, live: Segment | None) -> None:
        """Slot ``i`` keeps folder ``key`` with ``live`` its last file; None: keep nothing."""
        if key is None or live is None or live.closed:
            self._live[i] = ffi.NULL
            self._handles[i] = None
            return
        dev, ino, mtime = key
        if not (0 <= dev <= _UINT64_MAX and 0 <= ino <= _UINT64_MAX
                and _INT64_MIN <= mtime <= _INT64_MAX):
            raise RmqOptionError(f"folder key {key!r} is out of range")
        self._dev_ino[2 * i], self._dev_ino[2 * i + 1], self._mtime[i] = dev, ino, mtime
        handle = live._live()
        self._handles[i] = handle
        self._live[i] = handle
        self._units[i] = live._valid_units

    def poll(self, topic_dir: str, sel: np.ndarray) -> bool:
        """Poll the slots ``sel`` (int32 indexes) under the folder ``topic_dir``: afterwards
        ``same[i]`` says whether slot i's folder is unchanged and then ``units[i]`` is its live
        file's valid units now. False when C could not poll (the topic folder cannot be opened as
        a real folder): then no slot is to be taken as the same."""
        if not isinstance(topic_dir, str) or not topic_dir:
            raise RmqOptionError(f"topic_dir must be a non-empty string, got {topic_dir!r}")
        sel = np.ascontiguousarray(sel, dtype=np.int32)
        n = len(self.queue_ids)
        if len(sel) and (int(sel.min()) < 0 or int(sel.max()) >= n):
            raise RmqOptionError(f"slot indexes must be in [0, {n}), got {sel.min()}..{sel.max()}")
        got = lib.rmq_cq_poll(os.fsencode(topic_dir), n, self._ids,
                              ffi.from_buffer("int32_t[]", sel), len(sel), self._dev_ino,
                              self._mtime, self._live, self._units, self._same)
        return got >= 0
