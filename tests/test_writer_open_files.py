"""The writer keeps a bounded number of files open whatever the number of queues (issue 15): at
most ``max_open_queue_files`` ConsumeQueue files mapped, the other queues written with pwrite
(the same bytes) and fsync-ed by flush(); what it wrote reads back whole, after a reopen too, and the CLI generates
thousands of queues under a small descriptor limit."""
from __future__ import annotations

import os
import subprocess
import sys

from rmq_source.store.reader import Store
from rmq_source.store.writer import StoreWriter


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_queue_files_mapped_at_once_are_bounded_and_everything_reads_back(tmp_path):
    root = tmp_path / "store"
    before = _open_fds()
    peak = 0
    with StoreWriter(root, max_open_queue_files=4, cq_units_per_file=8) as w:
        w.create_topic("Many", 60)
        for i in range(900):
            w.append("Many", b"m%d" % i, queue_id=i % 60, tags="t%d" % (i % 3))
            peak = max(peak, _open_fds())
            if i % 250 == 0:
                w.flush()
        assert len(w._mapped_queues) <= 4
    # commitlog (current and next), lock, checkpoint writes, 4 queue files of 2 descriptors each
    assert peak - before <= 4 * 2 + 6, (before, peak)
    store = Store(str(root))
    for q in range(60):
        rows = [r for b in store.iter_batches("Many", q, 0, 15) for r in
                zip(b.column("queueOffset").to_pylist(), b.column("body").to_pylist(),
                    b.column("tags").to_pylist())]
        assert rows == [(k, b"m%d" % (q + 60 * k), "t%d" % ((q + 60 * k) % 3)) for k in range(15)]
    with StoreWriter(root, max_open_queue_files=2, cq_units_per_file=8) as w:     # recovery
        for i in range(120):
            r = w.append("Many", b"n%d" % i, queue_id=i % 60)
            assert r.queue_offset == 15 + i // 60
    store = Store(str(root))
    assert all(store.queue_info("Many", q).max_offset == 17 for q in range(60))


def test_generate_thousands_of_queues_under_a_small_descriptor_limit(tmp_path):
    script = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        "from rmq_source.cli import main\n"
        f"sys.exit(main(['generate', {str(tmp_path / 's')!r}, '--topic', 'Wide', '--queues', '3000',"
        " '--messages', '6000', '--no-progress']))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = Store(str(tmp_path / "s"))
    assert sum(store.queue_info("Wide", q).max_offset for q in range(3000)) == 6000


def test_queues_without_a_mapping_write_the_same_bytes(tmp_path):
    """Queues that find no room for a mapping write their units with pwrite: the ConsumeQueue
    files are byte for byte those of a writer that maps every queue (file boundaries, the last
    unit of a file, a reopen that recovers the offsets)."""
    def write(root, limit):
        for round_ in range(2):
            with StoreWriter(root, max_open_queue_files=limit, cq_units_per_file=8) as w:
                if not round_:
                    w.create_topic("P", 40)
                for i in range(500):
                    w.append("P", b"p%d-%d" % (round_, i), queue_id=(i * 7) % 40, tags="t%d" % (i % 5),
                             store_timestamp=1_700_000_000_000 + 1000 * round_ + i,
                             born_timestamp=1_700_000_000_000 + i)

    write(tmp_path / "mapped", 1024)
    write(tmp_path / "pwrite", 16)
    for q in range(40):
        a, b = (sorted((tmp_path / s / "consumequeue" / "P" / str(q)).iterdir()) for s in ("mapped", "pwrite"))
        assert [p.name for p in a] == [p.name for p in b]
        assert all(x.read_bytes() == y.read_bytes() for x, y in zip(a, b)), q
