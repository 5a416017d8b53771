"""Retention deletes the oldest CommitLog and ConsumeQueue files under readers.

Expected numbers never come from the reader: the writer's AppendResults say where every message
went, so after deleting the CommitLog files below ``cl_min`` the first readable offset of a queue
is the number of its messages stored below ``cl_min`` (queue offsets start at 0 and physical
offsets grow with them), and a reader that needed offset ``s`` lost exactly ``min - s`` messages.

* the writer's ``delete_oldest_commitlog_files`` deletes what the broker deletes (format doc §7.4);
* batch: startingOffsets below the min fails naming the queue and the count (failOnDataLoss=true)
  or reads exactly what is left (false);
* streaming, restarted from a checkpoint after retention overtook it: the next batch fails the
  same way, or skips to the min and goes on, the sink then holding every surviving message once;
* streaming, retention while a processingTime query runs behind: the same, under way.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from conftest import raises_rmq
from fault_helpers.payload import body_for, check_row, props_for, tags_for
from rmq_source.errors import RmqDataLossError
from rmq_source.store.reader import Store
from rmq_source.store.writer import AppendResult, StoreWriter, delete_oldest_commitlog_files

TOPIC = "Ret"
QUEUES = 3
CL_SIZE = 16 * 1024
CQ_UNITS = 16


def _append(w: StoreWriter, count: int, results: list[AppendResult]) -> None:
    for i in range(count):
        qid = (len(results) + i) % QUEUES if i % 5 else 0     # queue 0 gets more
        off = w.next_offset(TOPIC, qid)
        results.append(w.append(TOPIC, body_for(TOPIC, qid, off), queue_id=qid,
                                tags=tags_for(off), properties=props_for(TOPIC, qid, off)))


def _build(root: Path, count: int) -> list[AppendResult]:
    results: list[AppendResult] = []
    with StoreWriter(root, commitlog_file_size=CL_SIZE, cq_units_per_file=CQ_UNITS) as w:
        w.create_topic(TOPIC, QUEUES)
        _append(w, count, results)
    return results


def _cl_min(root: Path) -> int:
    return min(int(n) for n in (p.name for p in (root / "commitlog").iterdir()) if n.isdigit())


def _expected_min(results: list[AppendResult], cl_min: int) -> dict[int, int]:
    """First readable offset per queue after retention, from the writer's results alone."""
    return {q: sum(1 for r in results if r.queue_id == q and r.commitlog_offset < cl_min)
            for q in range(QUEUES)}


def _max(results: list[AppendResult]) -> dict[int, int]:
    return {q: sum(1 for r in results if r.queue_id == q) for q in range(QUEUES)}


def _offsets_json(offsets: dict[int, int]) -> str:
    return json.dumps({TOPIC: {"broker-a": {str(q): o for q, o in offsets.items()}}})


def _lost_message(text: str, queue: int, lost: int, first: int) -> bool:
    """The RmqDataLossError text names the queue (topic/broker/queue, in planning and in tasks)
    and the exact count and range."""
    named = f"{TOPIC}/broker-a/{queue}: offsets [{first}, {first + lost}) ({lost} messages)" in text
    return "RmqDataLossError" in text and named


def test_writer_retention_deletes_what_the_broker_deletes(tmp_path):
    root = tmp_path / "store"
    results = _build(root, 400)
    before_cl = sorted(p.name for p in (root / "commitlog").iterdir())
    before_cq = {q: sorted(p.name for p in (root / "consumequeue" / TOPIC / str(q)).iterdir())
                 for q in range(QUEUES)}
    deleted = delete_oldest_commitlog_files(root, 5)
    cl_min = _cl_min(root)
    assert cl_min == 5 * CL_SIZE
    assert sorted(p.name for p in deleted if p.parent.name == "commitlog") == before_cl[:5]
    unit_phy = {(r.queue_id, r.queue_offset): r.commitlog_offset for r in results}
    for q in range(QUEUES):
        files = before_cq[q]
        # the broker deletes a ConsumeQueue file (never the last) whose last unit points below
        # the new CommitLog min, oldest first, and stops at the first one it keeps
        gone = []
        for name in files[:-1]:
            last_off = int(name) // 20 + CQ_UNITS - 1
            if unit_phy[(q, last_off)] >= cl_min:
                break
            gone.append(name)
        left = sorted(p.name for p in (root / "consumequeue" / TOPIC / str(q)).iterdir())
        assert left == files[len(gone):], (q, gone)
        assert gone, f"queue {q}: no ConsumeQueue file was old enough to go"
    # a second pass deleting everything but the active file empties no queue folder
    delete_oldest_commitlog_files(root, 1000)
    assert len(list((root / "commitlog").iterdir())) == 2   # the active and the preallocated file
    cl_min = _cl_min(root)
    want_min, want_max = _expected_min(results, cl_min), _max(results)
    with Store(root) as store:
        for q in range(QUEUES):
            info = store.queue_info(TOPIC, q)
            assert (info.min_offset, info.max_offset) == (want_min[q], want_max[q])
            got = store.read(TOPIC, q, info.min_offset, info.max_offset).to_pylist()
            assert [r["queueOffset"] for r in got] == list(range(want_min[q], want_max[q]))
            assert all(check_row(TOPIC, r) is None for r in got)


@pytest.fixture()
def retained(tmp_path):
    """A store of 600 messages whose 6 oldest CommitLog files were deleted by retention."""
    root = tmp_path / "store"
    results = _build(root, 600)
    delete_oldest_commitlog_files(root, 6)
    cl_min = _cl_min(root)
    mins = _expected_min(results, cl_min)
    assert all(0 < mins[q] < _max(results)[q] for q in range(QUEUES)), mins
    return root, results, mins


def _read(spark, **options):
    reader = spark.read.format("rmq")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _check_rows(rows, want: dict[int, range]):
    got: dict[int, list[int]] = {q: [] for q in range(QUEUES)}
    for r in rows:
        d = r.asDict()
        assert check_row(TOPIC, d) is None, check_row(TOPIC, d)
        got[d["queueId"]].append(d["queueOffset"])
    assert {q: sorted(v) for q, v in got.items()} == {q: list(want[q]) for q in range(QUEUES)}


COLUMNS = ["queueId", "queueOffset", "body", "properties", "tags"]


@pytest.mark.spark
@pytest.mark.slow
def test_batch_start_below_the_min(spark, retained):
    root, results, mins = retained
    maxes = _max(results)
    # queue 0 and 2 start below their min (from 0 and from min-7), queue 1 above it
    start = {0: 0, 1: mins[1] + 3, 2: mins[2] - 7}
    opts = dict(storePath=str(root), topic=TOPIC, startingOffsets=_offsets_json(start))
    with raises_rmq(RmqDataLossError) as exc:
        _read(spark, **opts).select("queueOffset").collect()
    text = exc.text
    assert _lost_message(text, 0, mins[0], 0), text[-3000:]   # the first queue that lost data
    rows = _read(spark, failOnDataLoss="false", **opts).select(*COLUMNS).collect()
    _check_rows(rows, {q: range(max(start[q], mins[q]), maxes[q]) for q in range(QUEUES)})


def test_loss_inside_a_range_reports_every_lost_message(retained):
    root, results, mins = retained
    with Store(root) as store:
        calls = []
        got = store.read(TOPIC, 1, 2, 6, on_data_loss=lambda a, b: calls.append((a, b)))
        assert got.num_rows == 0
        # DataLossCallback's contract: (first lost offset, first readable offset)
        assert calls == [(2, mins[1])]
        with pytest.raises(RmqDataLossError) as exc:
            store.read(TOPIC, 1, 2, 6)
    assert f"[2, {mins[1]}) ({mins[1] - 2} messages)" in str(exc.value)


def _stream(spark, root, sink, chk, trigger, **options):
    reader = spark.readStream.format("rmq").option("storePath", str(root)).option("topic", TOPIC)
    for k, v in options.items():
        reader = reader.option(k, v)
    writer = (reader.load().select(*COLUMNS).writeStream.format("parquet")
              .option("path", str(sink)).option("checkpointLocation", str(chk)))
    return writer.trigger(**trigger).start()


def _sink(spark, sink) -> list:
    return spark.read.parquet(str(sink)).collect()


def _latest_offsets(chk: Path) -> tuple[int, dict[int, int]]:
    """Batch id and source offsets of the newest entry of the checkpoint's offset log."""
    n = max(int(p.name) for p in (chk / "offsets").iterdir() if p.name.isdigit())
    source = json.loads((chk / "offsets" / str(n)).read_text().splitlines()[-1])
    return n, {int(q): o for q, o in source[TOPIC]["broker-a"].items()}


@pytest.mark.spark
@pytest.mark.slow
def test_stream_restarted_after_retention_overtook_its_checkpoint(spark, tmp_path):
    root, sink, chk = tmp_path / "store", tmp_path / "sink", tmp_path / "chk"
    results = _build(root, 150)
    q = _stream(spark, root, sink, chk, {"availableNow": True}, startingOffsets="earliest")
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    read_up_to = _max(results)                       # the checkpoint is at the max offsets
    with StoreWriter(root) as w:                     # 450 more, then retention passes them by
        _append(w, 450, results)
        w.delete_oldest_commitlog_files(10_000)      # all but the active file
    mins = _expected_min(results, _cl_min(root))
    lost = {q: mins[q] - read_up_to[q] for q in range(QUEUES)}
    assert all(n > 0 for n in lost.values()), lost

    q = _stream(spark, root, sink, chk, {"availableNow": True})   # failOnDataLoss defaults to true
    with raises_rmq(RmqDataLossError) as exc:
        q.awaitTermination(300)
    text = exc.text
    assert _lost_message(text, 0, lost[0], read_up_to[0]), text[-3000:]

    q = _stream(spark, root, sink, chk, {"availableNow": True}, failOnDataLoss="false")
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    maxes = _max(results)
    want = {q: [*range(0, read_up_to[q]), *range(mins[q], maxes[q])] for q in range(QUEUES)}
    _check_rows(_sink(spark, sink), want)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("fail_on_data_loss", [True, False], ids=["failOnDataLoss", "skip"])
def test_retention_under_a_running_stream(spark, tmp_path, fail_on_data_loss):
    root, sink, chk = tmp_path / "store", tmp_path / "sink", tmp_path / "chk"
    results = _build(root, 600)
    maxes = _max(results)
    q = _stream(spark, root, sink, chk, {"processingTime": "300 milliseconds"},
                startingOffsets="earliest", maxMessagesPerTrigger="12",
                failOnDataLoss=str(fail_on_data_loss).lower())
    try:
        deadline = time.monotonic() + 240
        while not (chk / "commits" / "1").exists():   # two batches done: the query is running
            assert q.exception() is None and time.monotonic() < deadline, q.exception()
            time.sleep(0.1)
        delete_oldest_commitlog_files(root, 10_000)
        mins = _expected_min(results, _cl_min(root))
        while time.monotonic() < deadline and q.exception() is None:
            done = q.lastProgress and q.lastProgress["sources"][0]["endOffset"]
            if done and json.loads(done)[TOPIC]["broker-a"] == {str(k): v for k, v in maxes.items()}:
                break
            time.sleep(0.3)
        error = q.exception()
    finally:
        q.stop()
    if fail_on_data_loss:
        assert error is not None, "the query went on although messages it needed were deleted"
        # Found when planning the next batch (latestOffset, from the last logged end: [end, min)),
        # or in the last logged batch [offsets n-1, offsets n): in its planPartitions ([start,
        # min)) or by a task (the files went after planning: [start, batch end), B12).
        n, end = _latest_offsets(chk)
        start = json.loads((chk / "offsets" / str(n - 1)).read_text().splitlines()[-1])
        start = {int(k): v for k, v in start[TOPIC]["broker-a"].items()}
        text = str(error)
        # found in planning or by a task (the files went after planning), the loss is reported
        # once, from the first lost offset to the first readable one (B12, fixed: a task used to
        # report [start, batch end))
        assert "RmqDataLossError" in text, text[-3000:]
        found = [(first, stop) for first in (start, end) for k in range(QUEUES)
                 if first[k] < mins[k]
                 for stop in {mins[k], min(mins[k], end[k])} if stop > first[k]
                 if _lost_message(text, k, stop - first[k], first[k])]
        assert found, (start, end, mins, text[-3000:])
        return
    assert error is None, error
    rows = _sink(spark, sink)
    got: dict[int, list[int]] = {k: [] for k in range(QUEUES)}
    for r in rows:
        assert check_row(TOPIC, r.asDict()) is None
        got[r.queueId].append(r.queueOffset)
    for k in range(QUEUES):
        offs = sorted(got[k])
        assert len(offs) == len(set(offs)), f"queue {k}: duplicates"
        # read before the deletion: a prefix [0, a); after it: everything in [min, max)
        a = next((i for i, o in enumerate(offs) if o != i), len(offs))
        assert a <= mins[k] and offs[a:] == list(range(mins[k], maxes[k])), (k, a, mins[k], offs[:5])
        assert a < mins[k], f"queue {k}: retention took nothing the query still needed"
