"""Reopening a store as a broker restart does (format doc §2.3, §2.4): the CommitLog's valid end
found by the C core, garbage after it zeroed, ConsumeQueue units past it dropped, and records
missing from their ConsumeQueue dispatched again (the broker's reput)."""
from __future__ import annotations

import mmap
import re
from pathlib import Path

from rmq_source.errors import RmqCorruptStoreError, RmqMissingDependencyError, RmqStoreLayoutError
from rmq_source.store import record_codec as rc
from rmq_source.store.mapped_files import file_name, list_files, zero_from
from rmq_source.subscription import tags_code


class Recovery:
    """Part of :class:`~rmq_source.store.writer.StoreWriter`: recovery when a store is opened."""

    # ---------------------------------------------------------------------------------- recovery

    def _recover(self) -> None:
        files = list_files(self._commitlog_dir)
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
        zero_from(self._cl.mm, self._cl.fd, self._pos)
        if self._next_cl is not None:
            zero_from(self._next_cl.mm, self._next_cl.fd, 0)
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
                    found[(topic_dir.name, int(qdir.name))] = list_files(qdir)
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
                            zero_from(mm, f.fileno(), end - start)
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
            path = self._commitlog_dir / file_name(fstart)
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
        if q.next_offset == 0 and q.file is None and not list_files(q.folder):
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
