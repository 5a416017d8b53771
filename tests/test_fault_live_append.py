"""A store read while another process appends to it (files rolling fast), with and without
retention deleting the oldest files at the same time.

A writer subprocess (fault_helpers/append_writer.py) appends as fast as a steady rate allows into
tiny mapped files (16 KiB CommitLog files, 32-unit ConsumeQueue files), mixing single sends, batch
sends and compressed bodies. Meanwhile this process reads every queue over and over (its live
tail ``[max - 30, max + 50)``, and every fifth time all of ``[min, max + 50)``), alternately
through the public :class:`Store` API and through the C scanner directly
(:mod:`rmq_source.store.native`, files mapped fresh each time). Every row must be exactly the message the
writer put at that queue offset (the payload is a function of the offset, so a partial or stale
record cannot pass), offsets must be contiguous, and no read may fail. After the writer exits, every
row seen is compared with the writer's own AppendResults log (commitLogOffset, storeSize, msgId).
"""
from __future__ import annotations

import os
import random
import time
import traceback
import zlib
from pathlib import Path

import pytest

from fault_helpers import procs
from fault_helpers.payload import body_for, check_row, props_for, tags_for
from rmq_source.store import native
from rmq_source.store.reader import Store
from rmq_source.store.writer import StoreWriter

TOPIC = "FaultTopic"
CL_SIZE = 16 * 1024     # tiny files: the CommitLog rolls ~10 times a second at the writer's rate
CQ_UNITS = 32
MIN_SECONDS = 5
READ_DEADLINE_S = 600


class Seen:
    """Rows observed during the run, and problems found (reported all together at the end)."""

    def __init__(self):
        self.rows: dict[tuple[int, int], tuple[int, int, str]] = {}
        self.problems: list[str] = []
        self.rows_read = 0
        self.losses = 0

    def add(self, row: dict, how: str) -> None:
        self.rows_read += 1
        bad = check_row(TOPIC, row)
        if bad:
            self.problems.append(f"{how}: {bad}")
        key = (row["queueId"], row["queueOffset"])
        value = (row["commitLogOffset"], row["storeSize"], row["msgId"])
        if self.rows.setdefault(key, value) != value:
            self.problems.append(f"{how}: {key} read as {value}, earlier as {self.rows[key]}")


def _check_contiguous(offsets: list[int], start: int, jumps: dict[int, int], how: str, seen: Seen):
    """Offsets must run start, start+1, ... except where data-loss callbacks moved the start
    (one after another when retention went on between two listings: 630 -> 660, 660 -> 699)."""
    expect = start
    for off in offsets:
        while expect in jumps:
            expect = jumps[expect]
        if off != expect:
            seen.problems.append(f"{how}: offset {off} where {expect} was expected (from {start}; "
                                 f"data-loss calls: {jumps})")
            return
        expect += 1


def _read_with_store(store: Store, seen: Seen, rng: random.Random, full: bool) -> None:
    """[min, max + 50) of every queue (``full``), else its live tail [max - 30, max + 50)."""
    for info in store.queues([TOPIC]):
        jumps: dict[int, int] = {}
        start = info.min_offset if full else max(info.min_offset, info.max_offset - 30)
        end = info.max_offset + 50   # past the edge: only complete units may come back
        batches = store.iter_batches(TOPIC, info.queue_id, start, end,
                                     batch_rows=rng.choice((5, 64, 5000)),
                                     on_data_loss=lambda lost, ok: jumps.__setitem__(lost, ok))
        offsets = []
        for batch in batches:
            for row in batch.to_pylist():
                seen.add(row, "Store")
                offsets.append(row["queueOffset"])
        seen.losses += len(jumps)
        _check_contiguous(offsets, start, jumps, f"Store {TOPIC}/{info.queue_id}", seen)


def _map_folder(folder: Path) -> list[native.Segment]:
    names = sorted(n for n in os.listdir(folder) if len(n) == 20 and n.isdigit())
    return [native.map_segment(str(folder / n), int(n)) for n in names]


def _read_with_native(root: Path, seen: Seen, valid_ends: list[int], full: bool) -> None:
    """The C scanner on freshly mapped files. As the contract of scan_queue requires, units are
    read only up to the ConsumeQueue end seen *before* the CommitLog is listed, so every unit read
    points into a mapped CommitLog file."""
    qroot = root / "consumequeue" / TOPIC
    queues = {}
    for qname in sorted(os.listdir(qroot)):
        cq = _map_folder(qroot / qname)
        if cq:
            queues[qname] = (cq, cq[-1].file_start // 20 + native.cq_valid_units(cq[-1]))
    cl = native.CommitLog(_map_folder(root / "commitlog"), CL_SIZE)
    end = cl.valid_end(verify_crc=bool(len(valid_ends) % 2))
    if valid_ends and end < valid_ends[-1]:
        seen.problems.append(f"valid_end went back from {valid_ends[-1]} to {end}")
    valid_ends.append(end)
    for qname, (cq, stop) in queues.items():
        pos = cq[0].file_start // 20 + native.cq_first_unit_at_or_above(cq[0], cl.min_offset)
        if not full:
            pos = max(pos, stop - 30)
        first = pos
        offsets = []
        while pos < stop:
            res = native.scan_queue(cl, cq, CQ_UNITS * 20, pos, stop, max_rows=97, verify_crc=True)
            for row in res.batch.to_pylist():
                if row["sysFlag"] & 1:
                    row["body"] = zlib.decompress(row["body"])
                seen.add(row, "native")
                offsets.append(row["queueOffset"])
            if res.status != "FULL":
                if res.status != "END":
                    seen.problems.append(f"native scan of {qname} [{pos}, {stop}) ended with "
                                         f"{res.status} at {res.next_offset}")
                break
            pos = res.next_offset
        if offsets and offsets[-1] != stop - 1:
            seen.problems.append(f"native {TOPIC}/{qname}: last row {offsets[-1]}, max was {stop}")
        _check_contiguous(offsets, first, {}, f"native {TOPIC}/{qname}", seen)


def _record_ends(log: list[dict]) -> set[int]:
    ends = {m["phy"] + m["size"] for m in log if "phy" in m}
    ends.update(m["phy"] - m["phy"] % CL_SIZE for m in log if "phy" in m)   # empty new file
    ends.add(0)
    return ends


@pytest.mark.slow
@pytest.mark.parametrize("retention", [False, True], ids=["append-roll", "append-roll-retention"])
def test_reads_while_another_process_appends(tmp_path, retention):
    root, log_path = tmp_path / "store", tmp_path / "appends.jsonl"
    # 300 messages/s: a full read maps and reads every file, so a faster writer on a loaded
    # machine grows the store faster than the reads get through it (800/s once left 26 of 30
    # reads done after 300 s with a second suite running beside this one)
    args = ["--root", str(root), "--log", str(log_path), "--ready", str(tmp_path / "ready"),
            "--queues", "4", "--rate", "300", "--duration", "600", "--max-messages", "200000",
            "--commitlog-file-size", str(CL_SIZE), "--cq-units", str(CQ_UNITS)]
    if retention:
        args += ["--retain-files", "4"]
    writer = procs.start("append_writer.py", args, tmp_path, "writer")
    seen, valid_ends = Seen(), []
    rng = random.Random(1234)
    iterations = {"store": 0, "native": 0}
    enough = {"store": 30, "native": 0 if retention else 15}
    try:
        procs.wait_for(lambda: (tmp_path / "ready").exists(), 60, "writer's first append", writer)
        started = time.monotonic()
        store = Store(root)
        i = 0
        # Until the reader has done its share, however slow a loaded machine makes it; the writer
        # keeps appending until it is stopped (its own bounds only keep the disk in check).
        while writer.poll() is None and time.monotonic() - started < READ_DEADLINE_S:
            if (time.monotonic() - started > MIN_SECONDS
                    and all(iterations[k] >= enough[k] for k in enough)):
                break
            i += 1
            try:
                if i % 2 or retention:
                    if i % 7 == 1:
                        store = Store(root)   # a fresh reader infers sizes from scratch
                    _read_with_store(store, seen, rng, full=i % 5 == 1)
                    iterations["store"] += 1
                else:   # (with retention our own listing here would race with the deletion)
                    _read_with_native(root, seen, valid_ends, full=i % 5 == 2)
                    iterations["native"] += 1
            except Exception:  # noqa: BLE001 - every failure is collected and reported below
                seen.problems.append(f"iteration {i}: " + traceback.format_exc(limit=8))
            if len(seen.problems) > 10:
                break
        writing_to_the_end = writer.poll() is None
    finally:
        rc = procs.stop(writer)
    assert rc == 0, procs.tail(tmp_path, "writer")
    assert not seen.problems, "\n".join(seen.problems[:10])
    assert all(iterations[k] >= enough[k] for k in enough), iterations
    assert writing_to_the_end, "the writer stopped on its own before the reads were done"

    log = procs.read_jsonl(log_path)
    by_key = {(m["q"], m["o"]): (m["phy"], m["size"], m["id"]) for m in log if "q" in m}
    assert seen.rows_read > 1000, seen.rows_read
    if retention:
        assert any("deleted" in m for m in log), "the writer never deleted a file"
    wrong = {k: (v, by_key.get(k)) for k, v in seen.rows.items() if by_key.get(k) != v}
    assert not wrong, f"rows that differ from the writer's AppendResults: {list(wrong.items())[:5]}"
    ends = _record_ends(log)
    assert all(e in ends for e in valid_ends), [e for e in valid_ends if e not in ends][:5]

    # After the writer is gone the store reads back exactly as logged, from each queue's min.
    with Store(root) as store:
        for info in store.queues([TOPIC]):
            logged = sorted(o for (q, o) in by_key if q == info.queue_id)
            assert info.max_offset == logged[-1] + 1
            got = store.read(TOPIC, info.queue_id, info.min_offset, info.max_offset)
            assert got.column("queueOffset").to_pylist() == logged[logged.index(info.min_offset):]
            for row in got.to_pylist():
                key = (row["queueId"], row["queueOffset"])
                assert (row["commitLogOffset"], row["storeSize"], row["msgId"]) == by_key[key]
                assert check_row(TOPIC, row) is None


# -- the same races, replayed deterministically ------------------------------------------------
# The stress test above meets these interleavings by chance; here each is forced at the exact
# point where it bites: a directory listing taken, then the writer (in this process) rolls,
# appends or deletes files before the reader uses that listing.

def _store_with_writer(tmp_path, count=120) -> StoreWriter:
    """An open writer (1 queue, 16 KiB CommitLog files) that has appended ``count`` messages."""
    w = StoreWriter(tmp_path / "store", commitlog_file_size=CL_SIZE, cq_units_per_file=1000)
    w.create_topic(TOPIC, 1)
    _append(w, count)
    return w


def _append(w: StoreWriter, count: int) -> None:
    for _ in range(count):
        off = w.next_offset(TOPIC, 0)
        w.append(TOPIC, body_for(TOPIC, 0, off), queue_id=0, tags=tags_for(off),
                 properties=props_for(TOPIC, 0, off))


class _Listing:
    """What ``os.scandir`` returns, over entries already read (usable with ``with`` too)."""

    def __init__(self, entries):
        self._it = iter(entries)

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._it)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        pass


def _after_listing(monkeypatch, folder: Path, action):
    """The next listing of ``folder`` (``os.listdir`` or ``os.scandir``) is returned only after
    ``action(names)`` ran; ``action`` may return the names to keep (a listing that missed a file)."""
    real_listdir, real_scandir = os.listdir, os.scandir
    state = {"done": False}

    def hit(path) -> bool:
        if state["done"] or os.path.abspath(path) != str(folder):
            return False
        state["done"] = True
        return True

    def listdir(path="."):
        names = real_listdir(path)
        if hit(path):
            keep = action(list(names))
            names = [n for n in names if keep is None or n in keep]
        return names

    def scandir(path="."):
        with real_scandir(path) as it:
            entries = list(it)
        if hit(path):
            keep = action([e.name for e in entries])
            entries = [e for e in entries if keep is None or e.name in keep]
        return _Listing(entries)

    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(os, "scandir", scandir)
    return state


def test_units_written_after_the_commitlog_listing_are_not_corruption(tmp_path, monkeypatch):
    w = _store_with_writer(tmp_path)
    try:
        root = tmp_path / "store"
        store = Store(root)
        old_max = store.max_offset(TOPIC, 0)
        # the reader lists commitlog/, then the writer rolls into a new CommitLog file before
        # the reader scans: the new units are visible through the already mapped CQ file
        state = _after_listing(monkeypatch, root / "commitlog", lambda names: _append(w, 200))
        got = store.read(TOPIC, 0, 0, old_max + 500)
        assert state["done"]
        offsets = got.column("queueOffset").to_pylist()
        assert offsets == list(range(len(offsets))) and len(offsets) >= old_max
        assert all(check_row(TOPIC, r) is None for r in got.to_pylist())
    finally:
        w.close()


def test_listing_that_missed_a_new_file_is_made_again(tmp_path, monkeypatch):
    w = _store_with_writer(tmp_path)
    try:
        root = tmp_path / "store"
        names = sorted(os.listdir(root / "commitlog"))
        assert len(names) >= 4
        # readdir is no snapshot: a file created during the listing may be missed while a file
        # created after it is returned (ext4 lists hashed directories in hash order)
        store = Store(root)
        state = _after_listing(monkeypatch, root / "commitlog",
                               lambda n: [x for x in n if x != names[-2]])
        got = store.read(TOPIC, 0, 0, w.next_offset(TOPIC, 0))
        assert state["done"] and got.num_rows == w.next_offset(TOPIC, 0)
    finally:
        w.close()


def test_file_deleted_between_listing_and_mapping(tmp_path, monkeypatch):
    w = _store_with_writer(tmp_path)
    try:
        root = tmp_path / "store"
        store = Store(root)
        end = w.next_offset(TOPIC, 0)
        state = _after_listing(monkeypatch, root / "commitlog",
                               lambda names: w.delete_oldest_commitlog_files(1) and None)
        losses = []
        got = store.read(TOPIC, 0, 0, end, on_data_loss=lambda a, b: losses.append((a, b)))
        first = got.column("queueOffset")[0].as_py()
        assert state["done"] and first > 0
        assert losses == [(0, first)] and got.num_rows == end - first
    finally:
        w.close()


def test_new_queue_with_a_file_still_being_created(tmp_path):
    w = _store_with_writer(tmp_path)
    w.close()
    root = tmp_path / "store"
    # the writer (like the broker's MappedFile) opens the file, then sizes it: between the two a
    # reader sees an empty file
    (root / "consumequeue" / TOPIC / "1").mkdir()
    (root / "consumequeue" / TOPIC / "1" / f"{0:020d}").touch()
    with Store(root) as store:
        infos = {i.queue_id: i for i in store.queues([TOPIC])}
        assert (infos[1].min_offset, infos[1].max_offset) == (0, 0)
        assert store.read(TOPIC, 1, 0, 10).num_rows == 0
        assert store.read(TOPIC, 0, 0, infos[0].max_offset).num_rows == 120
