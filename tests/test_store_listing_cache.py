"""The store reader keeps a folder's listing while the folder is unchanged: new files, deleted
files and swapped folders must still be seen at the next call, and a folder changed just before
it was listed is never kept (its mtime could hide a change in the same clock tick)."""
from __future__ import annotations

import os
import shutil
import time

import pytest

from rmq_source.errors import RmqStoreLayoutError
from rmq_source.store.reader import Store
from rmq_source.store.writer import StoreWriter

UNITS = 4        # ConsumeQueue units per file: a new file every 4 messages


def _settle(*folders):
    """Date the folders 10 s back, as if nothing had changed them for a while."""
    past = time.time() - 10
    for f in folders:
        os.utime(f, (past, past))


@pytest.fixture()
def live(tmp_path):
    root = tmp_path / "store"
    w = StoreWriter(str(root), broker_name="broker-a", commitlog_file_size=4096, cq_units_per_file=UNITS)
    w.create_topic("T", 1)
    for _ in range(6):
        w.append("T", b"x" * 100, queue_id=0)
    w.flush()
    yield root, w
    w.close()


def _queue_dir(root):
    return os.path.join(root, "consumequeue", "T", "0")


def test_kept_listing_sees_new_files_and_appends(live):
    root, w = live
    qdir = _queue_dir(root)
    _settle(qdir, os.path.join(root, "commitlog"))
    st = Store(root)
    assert st.max_offset("T", 0) == 6
    assert qdir in st._listings                      # kept: an idle queue costs one stat
    w.append("T", b"y" * 100, queue_id=0)            # into the kept last file
    w.flush()
    assert st.max_offset("T", 0) == 7
    for _ in range(3):                               # a new ConsumeQueue file (offsets 8..)
        w.append("T", b"z" * 100, queue_id=0)
    w.flush()
    assert st.max_offset("T", 0) == 10
    rows = [r for b in st.iter_batches("T", 0, 0, 10) for r in b.column("queueOffset").to_pylist()]
    assert rows == list(range(10))


def test_kept_listing_sees_deleted_files(live):
    root, w = live
    qdir = _queue_dir(root)
    _settle(qdir, os.path.join(root, "commitlog"))
    st = Store(root)
    assert (st.min_offset("T", 0), st.max_offset("T", 0)) == (0, 6)
    assert qdir in st._listings
    w.close()
    first = sorted(os.listdir(qdir))[0]
    os.unlink(os.path.join(qdir, first))             # retention removes the first file
    assert st.min_offset("T", 0) == UNITS
    assert st.max_offset("T", 0) == 6


def test_swapped_queue_folder_is_refused(live, tmp_path):
    root, w = live
    qdir = _queue_dir(root)
    _settle(qdir)
    st = Store(root)
    assert st.max_offset("T", 0) == 6
    w.close()
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(qdir, elsewhere)
    shutil.rmtree(qdir)
    os.symlink(elsewhere, qdir)
    with pytest.raises(RmqStoreLayoutError, match="symlink"):
        st.max_offset("T", 0)


def test_recently_changed_folder_is_listed_every_time(live):
    root, _ = live
    st = Store(root)
    assert st.max_offset("T", 0) == 6                # written just now: not kept
    assert _queue_dir(root) not in st._listings
    assert os.path.join(root, "commitlog") not in st._listings
    _settle(_queue_dir(root))
    assert st.max_offset("T", 0) == 6
    assert _queue_dir(root) in st._listings


# -- many queues at once (Store.queue_infos polls unchanged folders in one C call) -----------------

QUEUES = 3


@pytest.fixture()
def live3(tmp_path):
    root = tmp_path / "store"
    w = StoreWriter(str(root), broker_name="broker-a", commitlog_file_size=4096, cq_units_per_file=UNITS)
    w.create_topic("T", QUEUES)
    for q in range(QUEUES):
        for _ in range(6):
            w.append("T", b"x" * 100, queue_id=q)
    w.flush()
    yield root, w
    w.close()


def _settle_all(root):
    _settle(os.path.join(root, "commitlog"),
            *(os.path.join(root, "consumequeue", "T", str(q)) for q in range(QUEUES)))


def _fresh_infos(root):
    """What a store that kept nothing answers (each queue listed and counted anew)."""
    with Store(root) as fresh:
        return [fresh.queue_info("T", q) for q in range(QUEUES)]


def _polled_infos(st):
    return st.queue_infos("T", list(range(QUEUES)))


def test_polled_infos_answer_unchanged_queues_in_c(live3):
    root, _ = live3
    _settle_all(root)
    st = Store(root)
    first = _polled_infos(st)
    assert first == _fresh_infos(root)
    again = _polled_infos(st)
    assert list(st._polled["T"].poll.same[:QUEUES]) == [1] * QUEUES   # the fast path answered
    assert again == first and all(a is b for a, b in zip(again, first))   # idle: same objects


def test_polled_infos_see_appends_new_files_and_deleted_files(live3):
    root, w = live3
    _settle_all(root)
    st = Store(root)
    _polled_infos(st)
    _polled_infos(st)
    w.append("T", b"y" * 100, queue_id=1)            # into queue 1's kept live file
    w.flush()
    got = _polled_infos(st)
    assert [i.max_offset for i in got] == [6, 7, 6]
    assert st._polled["T"].poll.same[0] == 1 and st._polled["T"].poll.same[1] == 1
    for _ in range(3):                               # queue 2: a new ConsumeQueue file
        w.append("T", b"z" * 100, queue_id=2)
    w.flush()
    assert [i.max_offset for i in _polled_infos(st)] == [6, 7, 9]
    _settle_all(root)
    _polled_infos(st)
    w.close()
    qdir = os.path.join(root, "consumequeue", "T", "0")
    os.unlink(os.path.join(qdir, sorted(os.listdir(qdir))[0]))   # retention: queue 0's first file
    got = _polled_infos(st)
    assert (got[0].min_offset, got[0].max_offset) == (UNITS, 6)
    assert got == _fresh_infos(root)


def test_polled_infos_see_commitlog_retention(live3):
    root, w = live3
    _settle_all(root)
    st = Store(root)
    before = _polled_infos(st)
    _polled_infos(st)
    w.close()
    cl_dir = os.path.join(root, "commitlog")
    os.unlink(os.path.join(cl_dir, sorted(os.listdir(cl_dir))[0]))   # the oldest messages go
    after = _polled_infos(st)
    assert after == _fresh_infos(root)
    assert [i.min_offset for i in after] != [i.min_offset for i in before]


def test_polled_infos_refuse_a_swapped_folder(live3, tmp_path):
    root, w = live3
    _settle_all(root)
    st = Store(root)
    _polled_infos(st)
    _polled_infos(st)
    w.close()
    qdir = os.path.join(root, "consumequeue", "T", "1")
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(qdir, elsewhere)
    shutil.rmtree(qdir)
    os.symlink(elsewhere, qdir)
    with pytest.raises(RmqStoreLayoutError, match="symlink"):
        st.queue_infos("T", list(range(QUEUES)))


def test_polled_infos_see_a_recreated_queue(live3):
    root, w = live3
    _settle_all(root)
    st = Store(root)
    _polled_infos(st)
    _polled_infos(st)
    w.close()
    shutil.rmtree(os.path.join(root, "consumequeue", "T", "2"))   # the queue was deleted
    assert _polled_infos(st) == _fresh_infos(root)
    assert _polled_infos(st)[2].max_offset == 0
