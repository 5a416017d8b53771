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
