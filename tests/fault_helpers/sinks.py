"""Reading back the parquet sinks of several streaming queries of one group."""
from __future__ import annotations

from collections import Counter
from pathlib import Path


def union_of_sinks(spark, folder: Path, names) -> tuple[Counter, dict[str, Counter]]:
    """Messages ``(queueId, queueOffset)`` in the committed batches of ``folder/sink-<name>``.

    Returns (how often each message is in any sink, {name: that query's messages}); a sink without a
    committed batch counts as empty. Only files in a sink's ``_spark_metadata`` log are read.
    """
    keys: Counter = Counter()
    per_query: dict[str, Counter] = {}
    for name in names:
        path = folder / f"sink-{name}"
        if not (path / "_spark_metadata").is_dir():
            per_query[name] = Counter()
            continue
        rows = spark.read.schema("queueId int, queueOffset long").parquet(str(path)).collect()
        per_query[name] = Counter((r.queueId, r.queueOffset) for r in rows)
        keys.update(per_query[name])
    return keys, per_query


def sink_bodies(spark, sink: Path) -> list[bytes]:
    """The ``body`` column of a parquet sink's committed batches (empty before the first)."""
    if not (sink / "_spark_metadata").is_dir():
        return []
    return [bytes(r.body) for r in spark.read.schema("body binary").parquet(str(sink)).collect()]


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
