"""StoreWriter reopening a store: broker-style recovery of the CommitLog end and queue offsets."""
from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import fixture_dir, require

from rmq_source.store import record_codec as rc
from rmq_source.store.config_files import read_topics
from rmq_source.errors import RmqOptionError, RmqStoreLayoutError
from rmq_source.store.writer import StoreWriter, delete_oldest_commitlog_files

require("rmq_source._native", "recovery needs the compiled C core (pip install -e .)")

CL = 4096
UNITS = 8


def fill(root: Path, count: int, *, topic: str = "T", queues: int = 3, **opts) -> list:
    with StoreWriter(root, commitlog_file_size=CL, cq_units_per_file=UNITS, **opts) as w:
        if topic not in w.topics():
            w.create_topic(topic, queues)
        return [w.append(topic, f"message {i}".encode() * (i % 9), tags=("TagA", "TagB", None)[i % 3],
                         keys=[f"k{i}"]) for i in range(count)]


def tree_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def end_of(results) -> int:
    return results[-1].commitlog_offset + results[-1].size


def test_reopen_resumes_offsets_and_commitlog_end(tmp_path):
    root = tmp_path / "s"
    first = fill(root, 50)
    with StoreWriter(root) as w:                       # sizes inferred from the files
        assert (w.commitlog_file_size, w.cq_units_per_file) == (CL, UNITS)
        assert w.commitlog_end == end_of(first)
        for qid in range(3):
            assert w.next_offset("T", qid) == sum(r.queue_id == qid for r in first)
        r = w.append("T", b"next", queue_id=1)
        assert r.commitlog_offset == end_of(first)
        assert r.queue_offset == sum(x.queue_id == 1 for x in first)
        nxt = r.commitlog_offset - r.commitlog_offset % CL + CL
        assert (root / "commitlog" / f"{nxt:020d}").stat().st_size == CL   # preallocated again
    more = fill(root, 20)
    assert more[0].commitlog_offset == r.commitlog_offset + r.size


def test_reopen_with_contradicting_sizes_is_refused(tmp_path):
    root = tmp_path / "s"
    fill(root, 3)
    with pytest.raises(RmqOptionError, match="commitlog_file_size"):
        StoreWriter(root, commitlog_file_size=2 * CL)
    with pytest.raises(RmqOptionError, match="cq_units_per_file"):
        StoreWriter(root, cq_units_per_file=UNITS * 2)


def test_crashed_writer_leaves_a_resumable_store(tmp_path):
    root = tmp_path / "s"
    script = ("import os, sys\nfrom rmq_source.store.writer import StoreWriter\n"
              f"w = StoreWriter(sys.argv[1], commitlog_file_size={CL}, cq_units_per_file={UNITS})\n"
              "w.create_topic('T', 2)\n"
              "rs = [w.append('T', b'x' * i, tags='TagA') for i in range(40)]\n"
              "print(rs[-1].commitlog_offset + rs[-1].size, rs[-1].queue_offset)\n"
              "sys.stdout.flush()\nos._exit(0)\n")
    out = subprocess.run([sys.executable, "-c", script, str(root)], capture_output=True, text=True,
                         timeout=60, check=True)
    end, last_offset = map(int, out.stdout.split())
    assert (root / "abort").exists()                   # the writer never closed
    with StoreWriter(root) as w:
        assert w.commitlog_end == end
        assert w.next_offset("T", 1) == last_offset + 1
        assert w.append("T", b"after crash", queue_id=1).queue_offset == last_offset + 1


@pytest.mark.parametrize("damage", ["half_header", "bad_crc", "tail_bytes_only", "random_garbage"])
def test_torn_record_at_the_end_is_cut_off_and_zeroed(tmp_path, damage):
    root = tmp_path / "s"
    results = fill(root, 30)
    end = end_of(results)
    path = root / "commitlog" / f"{end - end % CL:020d}"
    data = bytearray(path.read_bytes())
    pos = end % CL
    good = data[results[-1].commitlog_offset % CL:pos]        # a copy of the last record
    if damage == "half_header":
        torn = good[:40]
    elif damage == "bad_crc":
        torn = bytearray(good)
        torn[-1] ^= 0xFF
        torn[8:12] = b"\x00\x00\x00\x01"
    elif damage == "tail_bytes_only":
        torn = bytes(8) + good[8:]
    else:
        torn = bytes(range(256)) * 2
    torn = bytes(torn)[:CL - pos]
    data[pos:pos + len(torn)] = torn
    path.write_bytes(bytes(data))
    with StoreWriter(root) as w:
        assert w.commitlog_end == end
        assert path.read_bytes()[pos:] == bytes(CL - pos)
        r = w.append("T", b"fresh", tags="TagC")
    assert r.commitlog_offset in (end, end - end % CL + CL)


def test_missing_consume_queue_units_are_dispatched_again(tmp_path):
    """Crash between the CommitLog write and the ConsumeQueue unit: the broker's reput adds it."""
    root = tmp_path / "s"
    results = fill(root, 40)
    cq = root / "consumequeue"
    before = tree_bytes(cq)
    last = results[-1]
    first = last.queue_offset - last.queue_offset % UNITS
    unit_file = cq / "T" / str(last.queue_id) / f"{first * 20:020d}"
    data = bytearray(unit_file.read_bytes())
    data[(last.queue_offset - first) * 20:(last.queue_offset - first + 1) * 20] = bytes(20)
    unit_file.write_bytes(bytes(data))
    with StoreWriter(root) as w:
        assert w.next_offset("T", last.queue_id) == last.queue_offset + 1
    assert tree_bytes(cq) == before


def test_consume_queues_are_rebuilt_from_the_commitlog(tmp_path):
    root = tmp_path / "s"
    results = fill(root, 60)
    before = tree_bytes(root / "consumequeue")
    shutil.rmtree(root / "consumequeue")
    with StoreWriter(root, cq_units_per_file=UNITS) as w:   # no ConsumeQueue file to infer it from
        assert w.next_offset("T", 0) == sum(r.queue_id == 0 for r in results)
    assert tree_bytes(root / "consumequeue") == before


def test_units_pointing_past_the_commitlog_end_are_dropped(tmp_path):
    root = tmp_path / "s"
    results = fill(root, 10)
    end = end_of(results)
    qid = 0
    n = sum(r.queue_id == qid for r in results)
    unit_file = root / "consumequeue" / "T" / str(qid) / f"{(n - n % UNITS) * 20:020d}"
    data = bytearray(unit_file.read_bytes())
    data[(n % UNITS) * 20:(n % UNITS + 1) * 20] = rc.encode_cq_unit(end, 200, 0)
    unit_file.write_bytes(bytes(data))
    with StoreWriter(root) as w:
        assert w.next_offset("T", qid) == n
        assert w.append("T", b"x", queue_id=qid).queue_offset == n
    assert struct.unpack_from(">q", unit_file.read_bytes(), (n % UNITS) * 20)[0] == end


def test_garbage_files_beyond_the_end_are_removed(tmp_path):
    root = tmp_path / "s"
    results = fill(root, 10)
    end = end_of(results)
    far = end - end % CL + 2 * CL                     # just after the preallocated file
    (root / "commitlog" / f"{far:020d}").write_bytes(b"\x01" * CL)
    nxt = root / "commitlog" / f"{far - CL:020d}"                # the preallocated file
    with open(nxt, "r+b") as f:
        f.seek(CL // 2)
        f.write(b"\xee" * 100)
    with StoreWriter(root) as w:
        assert w.commitlog_end == end
    names = sorted(p.name for p in (root / "commitlog").iterdir())
    assert names[-1] == f"{end - end % CL + CL:020d}"
    assert (root / "commitlog" / names[-1]).read_bytes() == bytes(CL)


def test_file_of_wrong_size_is_a_layout_error(tmp_path):
    root = tmp_path / "s"
    fill(root, 40)
    files = sorted((root / "commitlog").iterdir())
    files[0].write_bytes(files[0].read_bytes()[:100])
    with pytest.raises(RmqStoreLayoutError):
        StoreWriter(root, commitlog_file_size=CL)


def test_module_level_retention_helper(tmp_path):
    root = tmp_path / "s"
    fill(root, 80)
    files = sorted((root / "commitlog").iterdir())
    deleted = delete_oldest_commitlog_files(root, 2)
    assert deleted[:2] == files[:2]
    with StoreWriter(root) as w:                        # still resumable after retention
        w.append("T", b"x")


# --------------------------------------------------------------------------- the broker's stores

def copy_fixture(version: str, tmp_path: Path) -> tuple[Path, Path]:
    base = fixture_dir(f"rocketmq-{version}/basic")
    root = tmp_path / "store"
    shutil.copytree(base / "store", root)
    for p in [root, *root.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return base, root


@pytest.mark.parametrize("version, style", [("4.9.3", "4.9.3"), ("5.3.3", "5.3.3")])
def test_appending_to_a_store_the_broker_wrote(tmp_path, version, style):
    base, root = copy_fixture(version, tmp_path)
    queues = json.loads((base / "queues.json").read_text())
    max_phy = queues["commitLog"]["maxPhyOffset"]
    max_offsets = {(q["topic"], q["queueId"]): q["maxOffset"] for q in queues["queues"]}
    with StoreWriter(root, properties_style=style, store_host="192.0.2.100:10911") as w:
        assert w.commitlog_end == max_phy
        assert (w.commitlog_file_size, w.cq_units_per_file) == (524288, 64)
        for (topic, qid), n in max_offsets.items():
            if (root / "consumequeue" / topic / str(qid)).is_dir():
                assert w.next_offset(topic, qid) == n, (topic, qid)
        r = w.append("TopicTest", b"appended by StoreWriter", queue_id=2, tags="TagA")
    assert (r.commitlog_offset, r.queue_offset) == (max_phy, max_offsets[("TopicTest", 2)])
    if version == "4.9.3":
        topics = read_topics(root)
        assert topics["SCHEDULE_TOPIC_XXXX"]["readQueueNums"] == 18    # broker's entries kept
    try:
        from rmq_source.store.reader import Store
    except ImportError:
        return
    with Store(root) as store:
        batch = store.read("TopicTest", 2, r.queue_offset, r.queue_offset + 1)
        assert batch.column("body").to_pylist() == [b"appended by StoreWriter"]
        assert batch.column("msgId").to_pylist() == [r.msg_id]
        assert store.max_offset("TopicTest", 2) == r.queue_offset + 1
