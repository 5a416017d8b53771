"""The min/max offsets of many queues of one topic, for planning at thousands of queues.

:meth:`Store.queue_info` costs a few µs of Python per queue even when the queue is idle (a
``stat`` of its folder, a C call for its live file, the listing and min offset looked up).
:class:`PolledTopic` answers the same for a whole list of queues with one C call
(:mod:`.native_poll`) for every queue whose folder is unchanged since its listing was kept by the
store (the store's own rule: a folder unchanged for a while, every file full size; see
``Store._segments_of``) and whose min offset is known for the CommitLog's current min offset.
Every other queue goes through :meth:`Store.queue_info` as before, and its slot then takes what
the store kept. An unchanged folder has the same files, so only an append to its live file can
change its max offset, and the C call counts that file's valid units again at every call: an
append, a new file and a deleted file are all seen at the next call, as without the poll.
"""
from __future__ import annotations

import numpy as np

from rmq_source.backend import QueueInfo
from rmq_source.store.native_poll import FolderPoll

CQ_UNIT_SIZE = 20


class PolledTopic:
    """What the last answer for each queue of ``topic`` was and what it was computed from.

    Per slot (see :class:`FolderPoll`): the live file's start address, the min offset (-1: not
    known for ``cl_min``), and the QueueInfo last answered with its offsets (reused while they
    stay the same, so an idle queue makes no Python object). Used under the store's lock.
    """

    def __init__(self, topic: str):
        self.topic = topic
        self.poll = FolderPoll()
        self.slots: dict[int, int] = {}
        self.cl_min: int | None = None
        self._ids: tuple | None = None
        self._sel = np.zeros(0, np.int32)
        self._cap = 0
        self._starts = self._sizes = self._mins = np.zeros(0, np.int64)
        self._info_min = self._info_max = np.zeros(0, np.int64)
        self._infos: list = []

    def _slot_of(self, queue_id: int) -> int:
        i = self.slots.get(queue_id)
        if i is None:
            i = self.slots[queue_id] = self.poll.add(queue_id)
            if i >= self._cap:
                self._cap = max(16, 2 * self._cap)
                grown = []
                for a in (self._starts, self._sizes, self._mins, self._info_min, self._info_max):
                    b = np.full(self._cap, -1, np.int64)
                    b[:len(a)] = a
                    grown.append(b)
                self._starts, self._sizes, self._mins, self._info_min, self._info_max = grown
            self._infos.append(None)
        return i

    def _selection(self, queue_ids) -> np.ndarray:
        ids = tuple(queue_ids)
        if ids != self._ids:   # (a query asks for the same queues at every call)
            self._sel = np.fromiter((self._slot_of(q) for q in ids), np.int32, len(ids))
            self._ids = ids
        return self._sel

    def infos(self, store, topic_dir: str, queue_ids, cl_min: int, commitlog) -> list[QueueInfo]:
        """``store.queue_info`` of each of ``queue_ids`` (same answers, same errors), with
        ``commitlog`` the CommitLog listed for this call and ``cl_min`` its min offset."""
        sel = self._selection(queue_ids)
        if cl_min != self.cl_min:
            self._mins[:] = -1          # known min offsets hold for one CommitLog min
            self.cl_min = cl_min
        fast = np.zeros(len(sel), bool)
        if len(sel) and self.poll.poll(topic_dir, sel):
            fast = (self.poll.same[sel] == 1) & (self._mins[sel] >= 0)
            if store._cq_file_size is not None:   # (a kept listing of another size is not used)
                fast &= self._sizes[sel] == store._cq_file_size
        maxs = (self._starts[sel] + self.poll.units[sel] * CQ_UNIT_SIZE) // CQ_UNIT_SIZE
        mins = np.minimum(self._mins[sel], maxs)
        moved = fast & ((mins != self._info_min[sel]) | (maxs != self._info_max[sel]))
        for k in np.flatnonzero(moved).tolist():
            i = int(sel[k])
            self._set(i, QueueInfo(self.topic, self.poll.queue_ids[i], int(mins[k]), int(maxs[k])))
        for k in np.flatnonzero(~fast).tolist():
            i = int(sel[k])
            queue_id = self.poll.queue_ids[i]
            self._set(i, store.queue_info(self.topic, queue_id, commitlog=commitlog,
                                          _topic_checked=True))
            kept = store._kept(self.topic, queue_id, cl_min)
            if kept is None:
                self.poll.keep(i, None, None)
                self._mins[i] = -1
            else:
                key, live, size, min_offset = kept
                self.poll.keep(i, key, live)
                self._starts[i], self._sizes[i] = live.file_start, size
                self._mins[i] = -1 if min_offset is None else min_offset
        infos = self._infos
        return [infos[i] for i in sel.tolist()]

    def _set(self, i: int, info: QueueInfo) -> None:
        self._infos[i] = info
        self._info_min[i], self._info_max[i] = info.min_offset, info.max_offset
