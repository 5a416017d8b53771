"""A task reads the ranges the driver planned to their end, or says exactly what it could not read.

Real stores written by our writer: the driver plans a batch (RmqBatchReader.partitions), the store
then changes as a topic deletion, a truncated queue or a removed broker change it, and the tasks run
(RmqBatchReader.read, and once through Spark). Also: what planning says when a store root went
away or a group offset in consumerOffset.json cannot be a queue offset (issue 14, items 1 and 8).
"""
from __future__ import annotations

import logging
import os
import shutil

import pytest

from rmq_source.spark.datasource import RmqBatchReader
from rmq_source.errors import RmqConfigFileError, RmqDataLossError, RmqStoreLayoutError
from rmq_source.store.reader import Store
from rmq_source.store.writer import StoreWriter

TOPIC = "T"
PER_QUEUE = 10


def _write(root, broker: str, queues: int = 2, per_queue: int = PER_QUEUE) -> None:
    with StoreWriter(root, broker_name=broker, commitlog_file_size=64 * 1024,
                     cq_units_per_file=4) as w:
        w.create_topic(TOPIC, queues)
        for i in range(queues * per_queue):
            w.append(TOPIC, f"m{i}".encode(), queue_id=i % queues, tags="A")


@pytest.fixture
def two_brokers(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _write(a, "brokerA")
    _write(b, "brokerB")
    return str(a), str(b)


def _reader(a: str, b: str, fail: bool, **extra) -> RmqBatchReader:
    opts = {"brokers": f"brokerA={a},brokerB={b}", "topic": TOPIC,
            "failOnDataLoss": str(fail).lower(), "numPartitions": "1", **extra}
    return RmqBatchReader(opts)


def _run(reader: RmqBatchReader, parts) -> set[tuple[str, int, int]]:
    """Every partition read to its end: the (broker, queue, offset) of each row."""
    seen = set()
    for part in parts:
        for batch in reader.read(part):
            for row in batch.to_pylist():
                seen.add((row["brokerName"], row["queueId"], row["queueOffset"]))
    return seen


def _all(brokers=("brokerA", "brokerB"), queues=(0, 1)) -> set[tuple[str, int, int]]:
    return {(b, q, o) for b in brokers for q in queues for o in range(PER_QUEUE)}


def _cut_queue(root: str, queue: int, keep: int) -> None:
    """The queue ends at ``keep``, as after the broker truncated it: the ConsumeQueue files after
    the one holding unit ``keep`` deleted, its units from ``keep`` on zeroed (4 units per file)."""
    folder = os.path.join(root, "consumequeue", TOPIC, str(queue))
    for name in sorted(os.listdir(folder)):
        first = int(name) // 20
        path = os.path.join(folder, name)
        if first > keep or (first == keep and first > 0):
            os.remove(path)
            continue
        with open(path, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            for unit in range(size // 20):
                if first + unit >= keep:
                    f.seek(unit * 20)
                    f.write(bytes(20))


# (case, mutation of the planned stores, what is lost as (broker, queue, first, end), reason)
CASES = [
    ("queue-folder-removed", lambda a, b: shutil.rmtree(os.path.join(b, "consumequeue", TOPIC, "1")),
     [("brokerB", 1, 0, 10)], "ConsumeQueue folder"),
    ("topic-folder-removed", lambda a, b: shutil.rmtree(os.path.join(a, "consumequeue", TOPIC)),
     [("brokerA", 0, 0, 10), ("brokerA", 1, 0, 10)], "no longer exists or has no files"),
    ("queue-shorter-than-planned", lambda a, b: _cut_queue(a, 1, 6),
     [("brokerA", 1, 6, 10)], "ConsumeQueue ends at offset 6, before the planned end 10"),
    ("queue-emptied", lambda a, b: _cut_queue(b, 0, 0),
     [("brokerB", 0, 0, 10)], "ConsumeQueue ends at offset 0"),
    ("broker-removed", lambda a, b: shutil.rmtree(b),
     [("brokerB", 0, 0, 10), ("brokerB", 1, 0, 10)], "no longer exists"),
]


def _lost_rows(lost) -> set[tuple[str, int, int]]:
    return {(b, q, o) for b, q, first, end in lost for o in range(first, end)}


@pytest.mark.parametrize("mutate, lost, reason", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_fail_on_data_loss_names_queue_offsets_and_reason(two_brokers, mutate, lost, reason):
    a, b = two_brokers
    reader = _reader(a, b, fail=True)
    parts = reader.partitions()
    mutate(a, b)
    with pytest.raises(RmqDataLossError) as info:
        _run(reader, parts)
    text = str(info.value)
    broker, queue, first, end = lost[0]      # ranges are read in queue order: the first one fails
    assert f"{TOPIC}/{broker}/{queue}: offsets [{first}, {end}) ({end - first} messages)" in text
    assert reason in text and "failOnDataLoss=false" in text


@pytest.mark.parametrize("mutate, lost, reason", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_without_fail_on_data_loss_the_rest_is_read_and_each_loss_warned(two_brokers, caplog, mutate,
                                                                         lost, reason):
    a, b = two_brokers
    reader = _reader(a, b, fail=False)
    parts = reader.partitions()
    mutate(a, b)
    with caplog.at_level(logging.WARNING, logger="rmq_source.spark.partition_reader"):
        seen = _run(reader, parts)
    assert seen == _all() - _lost_rows(lost)
    warnings = [r.getMessage() for r in caplog.records if r.name == "rmq_source.spark.partition_reader"]
    assert len(warnings) == len(lost), warnings
    for (broker, queue, first, end), text in zip(lost, warnings):
        assert f"/{broker}/{queue}: offsets [{first}, {end}) ({end - first} messages)" in text
        assert reason in text and f"skipped {end - first} messages" in text


@pytest.mark.parametrize("fail", [True, False])
def test_broker_removed_while_a_task_reads(two_brokers, caplog, fail):
    """The broker folder goes between two batches of one range: the rest of it is reported."""
    a, b = two_brokers
    reader = _reader(a, b, fail=fail, batchRows="3")
    (part,) = reader.partitions()
    rows = reader.read(part)
    first = next(iter(rows))                 # brokerA queue 0, offsets 0..2
    assert first.column("queueOffset").to_pylist() == [0, 1, 2]
    shutil.rmtree(a)
    if fail:
        with pytest.raises(RmqDataLossError, match=r"T/brokerA/0: offsets "
                                                   r"\[3, 10\) \(7 messages\).*store root .* no longer exists"):
            list(rows)
        return
    with caplog.at_level(logging.WARNING, logger="rmq_source.spark.partition_reader"):
        rest = [r for batch in rows for r in batch.to_pylist()]
    assert {(r["brokerName"], r["queueId"], r["queueOffset"]) for r in rest} == _all(["brokerB"])
    texts = [r.getMessage() for r in caplog.records if r.name == "rmq_source.spark.partition_reader"]
    assert [t.split(":")[0] for t in texts] == [
        "T/brokerA/0", "T/brokerA/1"]
    assert "offsets [3, 10) (7 messages)" in texts[0] and "offsets [0, 10) (10 messages)" in texts[1]


@pytest.mark.spark
def test_spark_tasks_fail_when_a_planned_queue_is_deleted(spark, two_brokers):
    """Through Spark: the plan is made (df.rdd), the topic's queue folder is deleted, tasks run."""
    from pyspark.errors import PythonException
    a, b = two_brokers
    df = (spark.read.format("rmq").option("brokers", f"brokerA={a},brokerB={b}")
          .option("topic", TOPIC).load())
    rdd = df.select("brokerName", "queueId", "queueOffset").rdd   # plans the partitions
    shutil.rmtree(os.path.join(a, "consumequeue", TOPIC, "1"))
    with pytest.raises(PythonException) as info:
        rdd.collect()
    text = str(info.value)
    assert "RmqDataLossError" in text
    assert ("T/brokerA/1: offsets [0, 10) (10 messages) "
            "of the planned range [0, 10) cannot be read") in text


# ---------------------------------------------------------------------------------- item 8

@pytest.mark.parametrize("extra", [
    {},                                                             # topic option: lists topics
    {"startingOffsets": '{"T":{"brokerA":{"0":5,"1":5},"brokerB":{"0":5,"1":5}}}'},
], ids=["earliest", "json-offsets"])
def test_planning_names_a_store_root_that_went_away(two_brokers, extra):
    a, b = two_brokers
    reader = _reader(a, b, fail=True, **extra)   # options parsed while the root existed
    reader.partitions()                          # the stores are open (cached per process)
    shutil.rmtree(b)
    with pytest.raises(RmqStoreLayoutError) as info:
        reader.partitions()
    text = str(info.value)
    assert f"store root {b!r} of broker 'brokerB' no longer exists" in text
    assert "beyond the queue's max offset" not in text


def test_store_api_names_a_store_root_that_went_away(tmp_path):
    _write(tmp_path / "s", "brokerA")
    store = Store(tmp_path / "s", broker_name="brokerA")
    assert store.queue_info(TOPIC, 0).max_offset == PER_QUEUE
    shutil.rmtree(tmp_path / "s")
    for call in (lambda: store.queue_info(TOPIC, 0), lambda: store.topics(),
                 lambda: store.queue_ids(TOPIC), lambda: store.commitlog(),
                 lambda: store.read(TOPIC, 0, 0, 5)):
        with pytest.raises(RmqStoreLayoutError, match="no longer exists"):
            call()


@pytest.mark.parametrize("where", ["broker", "offset-store"])
@pytest.mark.parametrize("offset", [2 ** 70, 2 ** 63 - 1, -7])
def test_implausible_group_offset_names_the_file(two_brokers, tmp_path, where, offset):
    a, b = two_brokers
    offs = tmp_path / "offs"
    if where == "broker":
        path = os.path.join(b, "config", "consumerOffset.json")
    else:
        path = str(offs / "brokerB" / "consumerOffset.json")
        os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write('{"offsetTable":{"T@G":{0:3,1:%d}}}' % offset)
    reader = _reader(a, b, fail=True, consumerGroup="G", startingOffsets="group",
                     offsetStorePath=str(offs))
    with pytest.raises(RmqConfigFileError) as info:
        reader.partitions()
    text = str(info.value)
    assert text.startswith(f"{path}: 'T@G' queue 1 has offset {offset}, which is not a queue offset")
    assert "[0, 461168601842738790]" in text and "max offset" not in text
