"""Find messages by key: the broker's index files (format doc §12.2), verified against the CommitLog,
or a full scan of a topic's queues when a store has no index files.

Index file (``<store>/index/<yyyyMMddHHmmssSSS>``, read-only mmap): a 40-byte header, ``S`` int32
hash slots, ``N`` 20-byte entries; ``size = 40 + 4*S + 20*N``. ``S`` (``maxHashSlotNum``) and ``N``
(``maxIndexNum``) are broker settings that the file does not store. They are taken, in this order:

1. from the caller (``hash_slots`` / ``index_num``; one of them is enough, the size gives the other);
2. the broker defaults S = 5,000,000, N = 20,000,000, when the file size is exactly theirs;
3. a geometry already accepted for another file of the same size in the same lookup;
4. otherwise inferred: a full file has ``indexCount == N``, so ``S = (size - 40 - 20*indexCount)/4``;
   for a file still filling, the header's ``endPhyOffset`` is the physical offset of entry
   ``indexCount - 1`` (``- 2`` while an insertion is in flight), so each place where those 8 bytes
   occur in the file gives a candidate S.

Every geometry, given or inferred, must fit the header: ``indexCount <= N``, ``hashSlotCount <=
indexCount``, entry 1 holds ``beginPhyOffset`` and starts no chain, entry ``indexCount - 1`` (or
``- 2`` while the broker is between writing an entry and updating the header) holds
``endPhyOffset``, and the entries after ``indexCount`` are empty. When several inferred candidates
fit, the whole slot table and every chain are checked as well (slot heads and chain links must
hash to their slot). No candidate, or more than one, raises :class:`RmqStoreLayoutError` asking for
``hash_slots`` / ``index_num`` (``--hash-slots`` / ``--index-num``). A file whose ``indexCount <= 1``
holds no entries and needs no geometry. A wrong geometry could only lose matches, never invent them:
every candidate is verified.

Lookup (``IndexService.queryOffset`` without a time range): index key ``topic + "#" + key``, hash
``abs(String.hashCode)`` (``Integer.MIN_VALUE`` -> 0), slot ``hash % S``; files newest to oldest,
each slot chain newest to oldest, entries whose stored hash equals the key's hash are candidates.
The broker stops there (its answers are unverified and capped at 64); here each candidate is
**verified**: the record header at the physical offset gives queue id and queue offset (§3.2),
:meth:`Store.read` reads that one message, and it counts only when its ``commitLogOffset`` is the
candidate (so it belongs to ``topic``) and ``key`` is one of its ``KEYS`` words or its
``UNIQ_KEY``. Hash and slot collisions are therefore removed, and a message indexed under several
keys is reported once (deduplicated by physical offset). Candidates whose CommitLog file was
deleted by retention, or whose bytes are not a message record, are counted as ``unresolved``.
Records that no ConsumeQueue references (transaction PREPARED records) cannot be read through a
queue and are not reported.

``max_results`` keeps the newest matches (highest ``commitLogOffset``), as the broker keeps the
newest candidates; results are returned in ``commitLogOffset`` order.
"""
from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa

from rmq_source.errors import (RmqCorruptStoreError, RmqDataLossError, RmqOptionError, RmqStoreIOError,
                               RmqStoreLayoutError)
from rmq_source.store.record_codec import MAGIC_V1, MAGIC_V2
from rmq_source.schema import ARROW_SCHEMA
from rmq_source.subscription import java_string_hash

__all__ = ["DEFAULT_HASH_SLOTS", "DEFAULT_INDEX_NUM", "DEFAULT_MAX_RESULTS", "IndexHeader",
           "IndexFile", "index_key_hash", "index_file_paths", "index_candidates", "find_by_key",
           "scan_for_key", "verify_candidates", "KeySearch"]

DEFAULT_HASH_SLOTS = 5_000_000       # MessageStoreConfig.maxHashSlotNum
DEFAULT_INDEX_NUM = 20_000_000       # MessageStoreConfig.maxIndexNum
DEFAULT_MAX_RESULTS = 64             # the broker's maxMsgsNumBatch
HEADER_SIZE, SLOT_SIZE, ENTRY_SIZE = 40, 4, 20
_HEADER = struct.Struct(">qqqqii")
_ENTRY = struct.Struct(">iqii")      # keyHash, phyOffset, timeDiff (s), prevIndex
_ENTRY_DTYPE = np.dtype([("hash", ">i4"), ("phy", ">i8"), ("time", ">i4"), ("prev", ">i4")])
_RECORD_HEAD = struct.Struct(">iiiiiq")  # TOTALSIZE MAGIC BODYCRC QUEUEID FLAG QUEUEOFFSET
_MIN_RECORD = 91
_NAME = re.compile(r"^\d+$")
_TAIL_WINDOW = 64                    # entries after indexCount checked to be empty (light check)
_MAX_PATTERN_HITS = 1024


def index_key_hash(topic: str, key: str) -> int:
    """The broker's index hash of ``topic#key``: ``abs(String.hashCode)``, MIN_VALUE mapped to 0."""
    h = java_string_hash(f"{topic}#{key}")
    return 0 if h == -(1 << 31) else abs(h)


@dataclass(frozen=True)
class IndexHeader:
    begin_timestamp: int
    end_timestamp: int
    begin_phy_offset: int
    end_phy_offset: int
    hash_slot_count: int
    index_count: int      # next entry number; entries 1..index_count-1 are in use


def _positive_or_none(name: str, value: int | None) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise RmqOptionError(f"{name} must be a positive integer, got {value!r}")
    return value


class IndexFile:
    """One index file, mapped read-only. ``hash_slots``/``index_num``: see the module docstring;
    ``known`` are geometries accepted for other files. ``geometry`` is ``(S, N)`` or None for a file
    without entries; ``geometry_source`` says where it came from."""

    def __init__(self, path: str, *, hash_slots: int | None = None, index_num: int | None = None,
                 known: tuple[tuple[int, int], ...] = ()):
        self.path = path
        _positive_or_none("hash_slots", hash_slots)
        _positive_or_none("index_num", index_num)
        try:
            with open(path, "rb") as f:
                self.size = os.fstat(f.fileno()).st_size
                if self.size >= HEADER_SIZE:
                    self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError as exc:
            raise RmqStoreLayoutError(f"index file {path} disappeared: {exc}") from exc
        except OSError as exc:
            raise RmqStoreIOError(f"cannot map index file {path}: {exc}") from exc
        if self.size < HEADER_SIZE:
            raise RmqStoreLayoutError(
                f"index file {path} has {self.size} bytes, less than its 40-byte header")
        try:
            self.header = IndexHeader(*_HEADER.unpack_from(self._mm, 0))
            self.geometry, self.geometry_source = self._geometry(hash_slots, index_num, known)
        except BaseException:
            self._mm.close()
            raise

    # -- geometry -------------------------------------------------------------------------------

    def _entry(self, s: int, i: int) -> tuple[int, int, int, int]:
        return _ENTRY.unpack_from(self._mm, HEADER_SIZE + SLOT_SIZE * s + ENTRY_SIZE * i)

    def _light_check(self, s: int, n: int) -> str | None:
        """Why (S, N) does not fit this file's header and boundary entries, or None when it fits."""
        h = self.header
        if s <= 0 or n <= 0 or HEADER_SIZE + SLOT_SIZE * s + ENTRY_SIZE * n != self.size:
            return f"40 + 4*{s} + 20*{n} != file size {self.size}"
        ic = h.index_count
        if ic > n:
            return f"indexCount {ic} > {n} entries"
        if not 0 <= h.hash_slot_count <= min(s, ic):
            return f"hashSlotCount {h.hash_slot_count} does not fit {s} slots / indexCount {ic}"
        first = self._entry(s, 1)
        if first[1] != h.begin_phy_offset or first[3] != 0 or first[0] < 0:
            return f"entry 1 {first} does not hold beginPhyOffset {h.begin_phy_offset}"
        last = self._entry(s, ic - 1)
        in_flight = ic >= 3 and self._entry(s, ic - 2)[1] == h.end_phy_offset
        if last[1] != h.end_phy_offset and not in_flight:
            return f"entry {ic - 1} {last} does not hold endPhyOffset {h.end_phy_offset}"
        if last[0] < 0 or not 0 <= last[3] < ic - 1 or last[2] < 0:
            return f"entry {ic - 1} {last} is not a valid entry"
        lo, hi = ic + 1, min(n, ic + 1 + _TAIL_WINDOW)   # entry ic may be in flight
        if lo < hi:
            start = HEADER_SIZE + SLOT_SIZE * s + ENTRY_SIZE * lo
            if any(self._mm[start:HEADER_SIZE + SLOT_SIZE * s + ENTRY_SIZE * hi]):
                return f"entries after indexCount {ic} are not empty"
        return None

    def _full_check(self, s: int, n: int) -> str | None:
        """Why the slot table and chains of (S, N) are inconsistent, or None."""
        ic = self.header.index_count
        slots = np.frombuffer(self._mm, dtype=">i4", count=s, offset=HEADER_SIZE)
        if slots.min() < 0 or slots.max() > ic:
            return "slot values outside [0, indexCount]"
        used = int(np.count_nonzero(slots))
        if used not in (self.header.hash_slot_count, self.header.hash_slot_count + 1):
            return f"{used} slots in use, header says {self.header.hash_slot_count}"
        ent = np.frombuffer(self._mm, dtype=_ENTRY_DTYPE, count=min(ic + 1, n),
                            offset=HEADER_SIZE + SLOT_SIZE * s)
        live = ent[1:ic]
        hashes = ent["hash"].astype(np.int64)
        if (live["hash"] < 0).any() or (live["phy"] < 0).any() or (live["time"] < 0).any():
            return "negative hash, offset or time in an entry"
        idx = np.arange(1, ic)
        prev = live["prev"].astype(np.int64)
        if ((prev < 0) | (prev >= idx)).any():
            return "a chain link points forward"
        linked = prev > 0
        if (hashes[prev[linked]] % s != hashes[idx[linked]] % s).any():
            return "a chain links entries of different slots"
        heads = np.flatnonzero((slots > 0) & (slots < ic))
        if (hashes[slots[heads].astype(np.int64)] % s != heads).any():
            return "a slot points at an entry of another slot"
        return None

    def _pattern_candidates(self) -> list[tuple[int, int]]:
        """(S, N) for each place where endPhyOffset's bytes could be the offset of entry
        indexCount-1 (or indexCount-2 while an insertion is in flight)."""
        h = self.header
        if h.end_phy_offset == 0:
            return []            # eight zero bytes are everywhere
        pattern = struct.pack(">q", h.end_phy_offset)
        bases = [HEADER_SIZE + ENTRY_SIZE * (h.index_count - k) + 4 for k in (1, 2)
                 if h.index_count - k >= 1]
        out, hits = [], 0
        pos = self._mm.find(pattern, min(bases) + SLOT_SIZE)
        while pos >= 0 and hits < _MAX_PATTERN_HITS:
            hits += 1
            for base in bases:
                if pos > base and (pos - base) % SLOT_SIZE == 0:
                    s = (pos - base) // SLOT_SIZE
                    rest = self.size - HEADER_SIZE - SLOT_SIZE * s
                    if rest > 0 and rest % ENTRY_SIZE == 0:
                        out.append((s, rest // ENTRY_SIZE))
            pos = self._mm.find(pattern, pos + 1)
        return out

    def _geometry(self, hash_slots, index_num, known) -> tuple[tuple[int, int] | None, str]:
        size, ic = self.size, self.header.index_count
        if hash_slots is not None or index_num is not None:
            s, n = hash_slots, index_num
            if s is None:
                s, rem = divmod(size - HEADER_SIZE - ENTRY_SIZE * n, SLOT_SIZE)
            elif n is None:
                n, rem = divmod(size - HEADER_SIZE - SLOT_SIZE * s, ENTRY_SIZE)
            else:
                rem = size - (HEADER_SIZE + SLOT_SIZE * s + ENTRY_SIZE * n)
            if rem or s <= 0 or n <= 0:
                raise RmqOptionError(
                    f"--hash-slots/--index-num ({hash_slots}/{index_num}) do not fit index file "
                    f"{self.path}: its size {size} must equal 40 + 4*slots + 20*entries")
            if ic <= 1:
                return (s, n), "options"
            why = self._light_check(s, n)
            if why is not None:
                raise RmqOptionError(f"--hash-slots {s} / --index-num {n} do not fit index file "
                                     f"{self.path}: {why}")
            return (s, n), "options"
        if ic <= 1:
            return None, "empty"
        if (size - HEADER_SIZE) % SLOT_SIZE:
            raise RmqStoreLayoutError(
                f"index file {self.path} has size {size}, which is not 40 + 4*slots + 20*entries")
        fixed = [((DEFAULT_HASH_SLOTS, DEFAULT_INDEX_NUM), "defaults")]
        fixed += [(g, "known") for g in known]
        for geom, source in fixed:
            if HEADER_SIZE + SLOT_SIZE * geom[0] + ENTRY_SIZE * geom[1] == size \
                    and self._light_check(*geom) is None:
                return geom, source
        inferred = [((size - HEADER_SIZE - ENTRY_SIZE * ic) // SLOT_SIZE, ic)]  # a full file
        inferred += self._pattern_candidates()
        fits = list(dict.fromkeys(g for g in inferred if g[0] > 0 and self._light_check(*g) is None))
        if len(fits) > 1:
            fits = [g for g in fits if self._full_check(*g) is None]
        if len(fits) == 1:
            return fits[0], "inferred"
        found = f"candidates {fits}" if fits else "no slot/entry count fits its header"
        raise RmqStoreLayoutError(
            f"cannot infer maxHashSlotNum/maxIndexNum of index file {self.path} (size {size}, "
            f"indexCount {ic}): {found}; pass --hash-slots and --index-num (the broker's "
            f"maxHashSlotNum and maxIndexNum), or search with --method scan")

    # -- lookup ---------------------------------------------------------------------------------

    def lookup(self, key_hash: int) -> list[int]:
        """Physical offsets of the entries with ``key_hash``, newest first (unverified)."""
        if self.geometry is None:
            return []
        s, n = self.geometry
        if self.header.index_count <= 1:
            return []
        ic = min(self.header.index_count, n - 1)    # entry numbers stay inside the file
        (i,) = struct.unpack_from(">i", self._mm, HEADER_SIZE + SLOT_SIZE * (key_hash % s))
        if i <= 0 or i > ic:
            return []
        out, steps = [], 0
        while True:
            h, phy, time_diff, prev = self._entry(s, i)
            if time_diff < 0:
                break
            if h == key_hash:
                out.append(phy)
            if prev <= 0 or prev > ic or prev == i:
                break
            i, steps = prev, steps + 1
            if steps > ic:
                raise RmqCorruptStoreError(
                    f"index file {self.path}: the chain of slot {key_hash % s} loops (entry {i})",
                    path=self.path, position=HEADER_SIZE + SLOT_SIZE * s + ENTRY_SIZE * i,
                    code="INDEX_CHAIN_LOOP")
        return out

    def close(self) -> None:
        self._mm.close()

    def __enter__(self) -> "IndexFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def index_file_paths(store_root: str) -> list[str]:
    """Index files of a store, oldest first (names are creation times); [] without ``index/``."""
    folder = os.path.join(store_root, "index")
    try:
        names = [n for n in os.listdir(folder) if _NAME.match(n)]
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise RmqStoreIOError(f"cannot list index folder {folder}: {exc}") from exc
    return [os.path.join(folder, n) for n in sorted(names, key=lambda n: (len(n), n))
            if os.path.isfile(os.path.join(folder, n))]


def index_candidates(store_root: str, topic: str, key: str, *, hash_slots: int | None = None,
                     index_num: int | None = None) -> Iterator[int]:
    """Unverified physical offsets for ``topic#key``, newest first, each once."""
    key_hash = index_key_hash(topic, key)
    known: list[tuple[int, int]] = []
    seen: set[int] = set()
    for path in reversed(index_file_paths(store_root)):
        with IndexFile(path, hash_slots=hash_slots, index_num=index_num,
                       known=tuple(known)) as f:
            if f.geometry is not None and f.geometry not in known:
                known.append(f.geometry)
            hits = f.lookup(key_hash)
        for phy in hits:
            if phy not in seen:
                seen.add(phy)
                yield phy


# ------------------------------------------------------------------------------------ verifying

def _record_queue(commitlog, phy: int) -> tuple[int, int] | None:
    """(queueId, queueOffset) from the record header at ``phy``; None when its file is gone or the
    bytes there are not a message record."""
    segs = commitlog.segments
    if not segs or phy < commitlog.min_offset:
        return None
    k = (phy - commitlog.min_offset) // commitlog.file_size
    if k >= len(segs) or not segs[k].file_start <= phy < segs[k].file_start + commitlog.file_size:
        return None
    seg, pos = segs[k], phy - segs[k].file_start
    if pos + _RECORD_HEAD.size > seg.size:
        return None
    try:
        with open(seg.path, "rb") as f:
            raw = os.pread(f.fileno(), _RECORD_HEAD.size, pos)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RmqStoreIOError(f"cannot read CommitLog file {seg.path}: {exc}") from exc
    if len(raw) < _RECORD_HEAD.size:
        return None
    size, magic, _, queue_id, _, queue_offset = _RECORD_HEAD.unpack(raw)
    if magic not in (MAGIC_V1, MAGIC_V2) or size < _MIN_RECORD or queue_id < 0 or queue_offset < 0:
        return None
    return queue_id, queue_offset


def _matches_key(row_keys, uniq_key, key: str) -> bool:
    return uniq_key == key or (row_keys is not None and key in row_keys)


def verify_candidates(store, topic: str, key: str, candidates, *, limit: int | None = None,
                      counters: dict | None = None) -> list[pa.RecordBatch]:
    """One-row batches of the candidates that really are ``topic`` messages with ``key`` (see the
    module docstring), in candidate order, at most ``limit``. ``counters`` (optional) receives
    ``candidates``, ``unresolved`` and ``truncated``."""
    counters = counters if counters is not None else {}
    counters.update(candidates=0, unresolved=0, truncated=False)
    out: list[pa.RecordBatch] = []
    for phy in candidates:
        if limit is not None and len(out) >= limit:
            counters["truncated"] = True
            break
        counters["candidates"] += 1
        where = _record_queue(store.commitlog(), phy)
        if where is None:
            counters["unresolved"] += 1
            continue
        qid, qoff = where
        try:
            batch = store.read(topic, qid, qoff, qoff + 1, on_data_loss=lambda *_: None)
        except RmqDataLossError:
            counters["unresolved"] += 1
            continue
        if batch.num_rows != 1 or batch.column("commitLogOffset")[0].as_py() != phy:
            continue     # another topic's record (or a record no queue of this topic references)
        if _matches_key(batch.column("keys")[0].as_py(), batch.column("uniqKey")[0].as_py(), key):
            out.append(batch)
    return out


def scan_for_key(store, topic: str, key: str, *,
                 on_progress: Callable[[int, int], None] | None = None) -> list[pa.RecordBatch]:
    """Every message of ``topic`` (all queues, min to max offset) with ``key`` as a KEYS word or
    UNIQ_KEY. ``on_progress(done, total)`` is called with messages examined so far."""
    queues = store.queues([topic])
    total = sum(q.max_offset - q.min_offset for q in queues)
    finished, out = 0, []                 # messages of the queues already scanned
    for q in queues:
        done = 0
        for batch in store.iter_batches(topic, q.queue_id, q.min_offset, q.max_offset,
                                        on_data_loss=lambda *_: None):
            keys = batch.column("keys")
            import pyarrow.compute as pc   # slow to import: only where used
            flat = pc.list_flatten(keys)
            parents = np.asarray(pc.list_parent_indices(keys))
            hit = np.zeros(batch.num_rows, dtype=bool)
            hit[parents[np.asarray(pc.fill_null(pc.equal(flat, key), False))]] = True
            hit |= np.asarray(pc.fill_null(pc.equal(batch.column("uniqKey"), key), False))
            if hit.any():
                out.append(batch.filter(pa.array(hit)))
            done += batch.num_rows
            if on_progress is not None:
                on_progress(finished + done, total)
        finished += q.max_offset - q.min_offset
        if on_progress is not None:
            on_progress(finished, total)
    return out


@dataclass(frozen=True)
class KeySearch:
    """Outcome of :func:`find_by_key`. ``rows``: matching messages (row schema) in commitLogOffset
    order; ``method``: ``index`` or ``scan``; ``index_files``: files consulted; ``candidates``:
    distinct index candidates examined; ``unresolved``: candidates whose record is gone or not a
    message; ``truncated``: more matches may exist beyond ``max_results``."""
    rows: pa.Table
    method: str
    index_files: int
    candidates: int
    unresolved: int
    truncated: bool


def _table(batches: list[pa.RecordBatch]) -> pa.Table:
    table = pa.Table.from_batches(batches, schema=ARROW_SCHEMA)
    return table.sort_by("commitLogOffset")


def find_by_key(store, topic: str, key: str, *, max_results: int | None = DEFAULT_MAX_RESULTS,
                method: str = "auto", hash_slots: int | None = None, index_num: int | None = None,
                on_progress: Callable[[int, int], None] | None = None) -> KeySearch:
    """Messages of ``topic`` on ``store`` (a :class:`~rmq_source.store.reader.Store`) whose KEYS contain
    ``key`` or whose UNIQ_KEY is ``key``: the newest ``max_results`` (None = all).

    ``method``: ``index`` (the store's index files; an error when there are none), ``scan`` (read
    every message of the topic; ``on_progress`` sees it), ``auto`` (index when the store has index
    files, else scan).
    """
    if not isinstance(key, str) or not key or " " in key:
        raise RmqOptionError(f"--key must be one non-empty word without spaces (a KEYS word or a "
                             f"UNIQ_KEY), got {key!r}")
    if method not in ("auto", "index", "scan"):
        raise RmqOptionError(f"--method must be auto, index or scan, got {method!r}")
    _positive_or_none("max_results", max_results)
    store.queue_ids(topic)                 # unknown topic -> RmqUnknownTopicError
    files = index_file_paths(store.root)
    if method == "index" and not files:
        raise RmqStoreLayoutError(f"store {store.root} has no index files in {store.root}/index; "
                                  "search with --method scan")
    if method == "scan" or (method == "auto" and not files):
        batches = scan_for_key(store, topic, key, on_progress=on_progress)
        table = _table(batches)
        truncated = max_results is not None and table.num_rows > max_results
        if truncated:
            table = table.slice(table.num_rows - max_results)
        return KeySearch(table, "scan", 0, 0, 0, truncated)
    counters: dict = {}
    batches = verify_candidates(
        store, topic, key,
        index_candidates(store.root, topic, key, hash_slots=hash_slots, index_num=index_num),
        limit=max_results, counters=counters)
    return KeySearch(_table(batches), "index", len(files), counters["candidates"],
                     counters["unresolved"], counters["truncated"])
