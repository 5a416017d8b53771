"""Reading back the parquet sinks of streaming queries: only the files of committed batches (the
sink's ``_spark_metadata`` log, as Spark's own reader), with pyarrow instead of a Spark job."""
from __future__ import annotations

from collections import Counter
from pathlib import Path


def union_of_sinks(folder: Path, names) -> tuple[Counter, dict[str, Counter]]:
    """Messages ``(queueId, queueOffset)`` in the committed batches of ``folder/sink-<name>``.

    Returns (how often each message is in any sink, {name: that query's messages}); a sink without a
    committed batch counts as empty. Only files in a sink's ``_spark_metadata`` log are read.
    """
    keys: Counter = Counter()
    per_query = {name: committed_keys(folder / f"sink-{name}") for name in names}
    for counts in per_query.values():
        keys.update(counts)
    return keys, per_query


def sink_bodies(sink: Path) -> list[bytes]:
    """The ``body`` column of a parquet sink's committed batches (empty before the first); read
    without Spark, so tests can poll it cheaply while their queries run."""
    import pyarrow.parquet as pq
    return [b for path in committed_files(sink) for b in pq.read_table(path, columns=["body"]).column("body").to_pylist()]


def committed_files(sink: Path) -> list[str]:
    """Paths of the parquet files of the batches committed in ``sink``'s ``_spark_metadata`` log
    (the latest ``N.compact`` file plus the batch files after it), without a Spark session."""
    import json
    log = sink / "_spark_metadata"
    if not log.is_dir():
        return []
    batches = {}
    for p in log.iterdir():
        stem = p.name.removesuffix(".compact")
        if stem.isdigit():
            batches[int(stem)] = p
    compacts = [n for n, p in batches.items() if p.name.endswith(".compact")]
    first = max(compacts, default=-1)
    files: dict[str, bool] = {}
    for n in sorted(b for b in batches if b >= first):
        lines = batches[n].read_text(encoding="utf-8").splitlines()
        for line in lines[1:]:      # the first line is the log's version, "v1"
            entry = json.loads(line)
            files[entry["path"]] = entry.get("action", "add") == "add"
    return [path.removeprefix("file://").removeprefix("file:") for path, added in files.items()
            if added]


def committed_keys(sink: Path) -> Counter:
    """How often each message ``(queueId, queueOffset)`` is in the committed batches of ``sink``."""
    import pyarrow.parquet as pq
    keys: Counter = Counter()
    for path in committed_files(sink):
        t = pq.read_table(path, columns=["queueId", "queueOffset"])
        keys.update(zip(t.column("queueId").to_pylist(), t.column("queueOffset").to_pylist()))
    return keys


def topic_bodies(spark, namesrv: str, topic: str) -> set[str]:
    """The bodies (text) of every message of ``topic`` in the cluster, read with the source."""
    df = spark.read.format("rmq").options(namesrvAddr=namesrv, topic=topic).load()
    return {bytes(r.body).decode() for r in df.select("body").collect()}


def body_streams(spark, folder: Path, namesrv: str, topic: str, kinds: dict[str, dict]) -> dict:
    """One stream per kind reading ``topic`` from the earliest offsets with the kind's options,
    its bodies into the parquet sink ``folder/sink-<kind>`` (checkpoint ``folder/chk-<kind>``),
    a batch a second: {kind: (query, sink folder)}."""
    streams = {}
    for kind, options in kinds.items():
        name = kind.replace(" ", "-")
        sink = folder / f"sink-{name}"
        streams[kind] = (spark.readStream.format("rmq")
                         .options(namesrvAddr=namesrv, topic=topic, startingOffsets="earliest", **options)
                         .load().select("body").writeStream.format("parquet").option("path", str(sink))
                         .option("checkpointLocation", str(folder / f"chk-{name}"))
                         .trigger(processingTime="1 second").start()), sink
    return streams


def rows_stream(spark, rows_dir: Path, namesrv: str, topic: str, checkpoint: Path):
    """A sink stream sending the ``body`` of the JSON rows files appearing in ``rows_dir`` to
    ``topic``, a batch a second."""
    return (spark.readStream.schema("body string").json(str(rows_dir))
            .writeStream.format("rmq").option("namesrvAddr", namesrv).option("topic", topic)
            .option("checkpointLocation", str(checkpoint)).trigger(processingTime="1 second").start())
