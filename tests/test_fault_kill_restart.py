"""kill -9 a streaming query in the middle of micro-batches, restart it from its checkpoint, again
and again, while another process keeps appending; the parquet sink must end up with every
message exactly once and each queue in order.

* writer: fault_helpers/append_writer.py appends at a steady rate to 3 queues (small files, so
  the CommitLog and ConsumeQueue files roll under the query) and logs every AppendResult;
* query: fault_helpers/stream_query.py, processingTime trigger, maxMessagesPerTrigger=20, each
  task held for a while (mapInArrow with a pause) so batches are long; it runs in its own process
  group and the test SIGKILLs the whole group (driver, JVM, Python workers): once right after the
  sink's _spark_metadata has the batch but (most likely) before the checkpoint's commit (its
  tasks were running), once at a random moment after a batch committed (a kill while tasks read
  is a step of test_fault_restart_matrix.py);
* then the writer stops cleanly and a last availableNow run of the same query (in the test's
  own Spark session) drains the store.

The sink is read back with spark.read.parquet, which only returns files of batches committed in
the sink's _spark_metadata log, and compared with the writer's log: the same (queue, offset)
set, no duplicates, identical commitLogOffset/storeSize/msgId and payload, offsets contiguous per
queue, and ascending within every parquet file.
"""
from __future__ import annotations

import random
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from fault_helpers import procs
from fault_helpers.payload import check_row

TOPIC = "FaultTopic"
ROUND_TIMEOUT = 240


def _ids(folder: Path) -> set[int]:
    if not folder.is_dir():
        return set()
    return {int(p.name) for p in folder.iterdir() if p.name.isdigit()}


def _state(chk: Path, sink: Path) -> dict:
    return {"offsets": sorted(_ids(chk / "offsets")), "commits": sorted(_ids(chk / "commits")),
            "sink_log": sorted(_ids(sink / "_spark_metadata"))}


def _start_query(tmp_path, name, *extra):
    return procs.start("stream_query.py",
                       ["--store", str(tmp_path / "store"), "--sink", str(tmp_path / "sink"),
                        "--checkpoint", str(tmp_path / "chk"), "--topic", TOPIC, *extra],
                       tmp_path, name)


@pytest.mark.spark
@pytest.mark.slow
def test_kill_9_mid_batch_and_restart_exactly_once(spark, tmp_path):
    chk, sink, log_path = tmp_path / "chk", tmp_path / "sink", tmp_path / "appends.jsonl"
    writer = procs.start("append_writer.py",
                         ["--root", str(tmp_path / "store"), "--log", str(log_path),
                          "--ready", str(tmp_path / "ready"), "--topic", TOPIC, "--queues", "3",
                          "--rate", "20", "--commitlog-file-size", str(64 * 1024),
                          "--cq-units", "64"], tmp_path, "writer")
    rng = random.Random(20240917)
    kills = []
    try:
        procs.wait_for(lambda: (tmp_path / "ready").exists(), 60, "first append", writer)
        # (a kill while tasks read is also one step of test_fault_restart_matrix.py's chains)
        for rnd, how in enumerate(("after the sink log, before the commit", "at a random moment")):
            before = _state(chk, sink)
            query = _start_query(tmp_path, f"query{rnd}", "--trigger", "500",
                                 "--max-per-trigger", "20", "--sleep-per-task", "1.5")
            try:
                new_batch = lambda: [n for n in _ids(chk / "offsets")   # noqa: E731
                                     if n not in before["offsets"]]
                if how.startswith("after the sink log"):
                    n = min(procs.wait_for(new_batch, ROUND_TIMEOUT, "a new batch planned", query))
                    procs.wait_for(lambda: n in _ids(sink / "_spark_metadata"), ROUND_TIMEOUT,
                                   f"batch {n} in the sink log", query, interval=0.005)
                else:
                    procs.wait_for(lambda: _ids(chk / "commits") - set(before["commits"]),
                                   ROUND_TIMEOUT, "a batch committed", query)
                    time.sleep(rng.uniform(0.0, 2.5))
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{procs.tail(tmp_path, f'query{rnd}')}") from None
            finally:
                procs.kill_group(query)
            kills.append((how, _state(chk, sink)))
    finally:
        rc = procs.stop(writer)
    assert rc == 0, procs.tail(tmp_path, "writer")
    in_flight = [how for how, s in kills if s["offsets"] and s["offsets"][-1] not in s["commits"]]
    assert in_flight, f"no kill hit a planned, uncommitted batch: {kills}"

    print("kills:", kills)

    # drain what is left with an availableNow run of the same query (in this test's session)
    df = (spark.readStream.format("rmq").option("storePath", str(tmp_path / "store"))
          .option("topic", TOPIC).option("startingOffsets", "earliest")
          .option("maxMessagesPerTrigger", "500").load())
    query = (df.mapInArrow(lambda batches: batches, df.schema).writeStream.format("parquet")
             .option("path", str(sink)).option("checkpointLocation", str(chk))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(600), "the final availableNow run did not finish"
    assert query.exception() is None, query.exception()

    log = [m for m in procs.read_jsonl(log_path) if "q" in m]
    written = {(m["q"], m["o"]): (m["phy"], m["size"], m["id"]) for m in log}
    df = spark.read.parquet(str(sink))
    rows = df.select("queueId", "queueOffset", "commitLogOffset", "storeSize", "msgId", "body",
                     "properties", "tags").collect()
    keys = [(r.queueId, r.queueOffset) for r in rows]
    assert len(keys) == len(set(keys)), "duplicates in the sink"
    assert set(keys) == set(written), (f"missing {sorted(set(written) - set(keys))[:5]}, "
                                       f"extra {sorted(set(keys) - set(written))[:5]}; kills: {kills}")
    for r in rows:
        assert (r.commitLogOffset, r.storeSize, r.msgId) == written[(r.queueId, r.queueOffset)]
        assert check_row(TOPIC, r.asDict()) is None, check_row(TOPIC, r.asDict())
    for q in range(3):
        offs = sorted(o for (qq, o) in keys if qq == q)
        assert offs == list(range(len(offs))), f"queue {q} is not contiguous from 0"
    # within each committed file, each queue's rows are in queue order
    for path in df.inputFiles():
        t = pq.read_table(path.removeprefix("file:"), columns=["queueId", "queueOffset"])
        per_queue: dict[int, list[int]] = {}
        for q, o in zip(t.column("queueId").to_pylist(), t.column("queueOffset").to_pylist()):
            per_queue.setdefault(q, []).append(o)
        assert all(v == sorted(v) for v in per_queue.values()), path
