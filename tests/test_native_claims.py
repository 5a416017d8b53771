"""A ConsumeQueue unit's size is a claim: it never sizes the C core's buffers (issue 14, item 7).

Stores are crafted byte by byte (test_native_craft.CraftStore); one unit's size is then damaged to
a huge value. The scan must report the damaged record (file and position) without having taken
buffers anywhere near the claimed size: ``native.buffer_bytes_taken()`` counts every byte of batch
buffer the C core takes. A subprocess with a bounded address space shows what a user would see
otherwise: MemoryError instead of the corruption.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from rmq_source.store import native
from rmq_source.errors import RmqCorruptStoreError
from test_native_craft import CraftStore, Rec, java_hash, open_store

REPO = Path(__file__).resolve().parents[1]
TAG = "A"


def _craft(root: Path, cl_file_size: int, count: int = 8) -> CraftStore:
    store = CraftStore(root, cl_file_size=cl_file_size, cq_file_size=20 * 20)
    for i in range(count):
        store.add(Rec(topic="T", queue_id=0, body=b"body-%d" % i, props={"TAGS": TAG}))
    return store


def _claim(store: CraftStore, unit: int, size: int) -> None:
    """Overwrite the size field of one unit (before ``write``)."""
    units = store.queues[("T", 0)]
    struct.pack_into(">i", units, unit * 20 + 8, size)


# (case, CommitLog file size, damaged unit, claimed size): a claim past the end of the mapped
# CommitLog file, and one that fits in a big file (only the record's own TOTALSIZE disagrees)
CASES = [
    ("past-file-end-first-unit", 8192, 0, 2_000_000_000),
    ("past-file-end-later-unit", 8192, 5, 2_147_483_646),
    ("inside-a-big-file", 48 << 20, 3, 40 << 20),
]


@pytest.mark.parametrize("filtered", [False, True], ids=["all", "tag-filter"])
@pytest.mark.parametrize("cl_size, unit, claim", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_damaged_unit_size_is_reported_without_allocating_it(tmp_path, cl_size, unit, claim,
                                                               filtered):
    store = _craft(tmp_path, cl_size)
    _claim(store, unit, claim)
    store.write()
    cl, cq = open_store(tmp_path, cl_size)
    codes = (java_hash(TAG),) if filtered else None
    before = native.buffer_bytes_taken()
    with pytest.raises(RmqCorruptStoreError) as info:
        native.scan_queue(cl, cq, 400, 0, 8, codes=codes, max_bytes=native.MAX_BATCH_BYTES,
                          topic="T", queue_id=0)
    taken = native.buffer_bytes_taken() - before
    assert taken < 1 << 20, f"{taken} bytes of buffers taken for a unit claiming {claim}"
    err = info.value
    assert err.path is not None and err.position is not None
    assert f"(file {err.path}, position {err.position}" in str(err)
    assert f"queue offset {unit}" in str(err)


def test_buffers_still_sized_from_the_records_they_read(tmp_path):
    """The sizing ahead still works: a valid scan takes about what it returns, not max_bytes."""
    store = CraftStore(tmp_path, cl_file_size=1 << 20, cq_file_size=20 * 400)
    for i in range(300):
        store.add(Rec(topic="T", queue_id=0, body=bytes(2000), props={"TAGS": TAG}))
    store.write()
    cl, cq = open_store(tmp_path, 1 << 20)
    for codes in (None, (java_hash(TAG),)):
        before = native.buffer_bytes_taken()
        res = native.scan_queue(cl, cq, 20 * 400, 0, 300, codes=codes,
                                max_bytes=native.MAX_BATCH_BYTES, topic="T", queue_id=0)
        taken = native.buffer_bytes_taken() - before
        assert res.batch.num_rows == 300 and res.status == "END"
        assert 300 * 2000 <= taken < 8 * 300 * 2000


_SUBPROCESS = r"""
import json, resource, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests"]
from pathlib import Path
from rmq_source.store import native
from test_native_craft import open_store
cl, cq = open_store(Path(sys.argv[2]), 8192)
vm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status")
          if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + (768 << 20), resource.RLIM_INFINITY))
try:
    native.scan_queue(cl, cq, 400, 0, 8, max_bytes=native.MAX_BATCH_BYTES, topic="T", queue_id=0)
    out = {"error": None}
except Exception as exc:
    out = {"error": type(exc).__name__, "message": str(exc)}
print(json.dumps(out))
"""


def test_a_damaged_unit_size_is_not_a_memory_error_under_a_memory_limit(tmp_path):
    store = _craft(tmp_path / "s", 8192)
    _claim(store, 2, 2_000_000_000)
    store.write()
    proc = subprocess.run([sys.executable, "-c", _SUBPROCESS, str(REPO), str(tmp_path / "s")],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RMQ_NATIVE": ""})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["error"] == "RmqCorruptStoreError", out
    assert "queue offset 2" in out["message"] and "(file " in out["message"]
