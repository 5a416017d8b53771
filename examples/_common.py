"""Shared by the example scripts: a local Spark session and a sample store to read."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# Spark's Python workers must run this interpreter (the one with rmq_source installed).
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
# The local Spark session listens and talks on loopback only: without this it binds the driver to
# the machine's network interface. A session that must be reached from other machines (a cluster's
# executors) is started by the cluster's own spark-submit instead (examples/cluster_job.py);
# SPARK_LOCAL_IP set in the environment wins.
LOCAL_IP = os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def local_spark(app: str):
    """A local[2] Spark session on ``SPARK_LOCAL_IP`` (loopback unless set) with the rmq data
    source registered."""
    from pyspark.sql import SparkSession
    from rmq_source import RocketMQDataSource

    spark = (SparkSession.builder.master("local[2]").appName(app)
             .config("spark.driver.bindAddress", LOCAL_IP).config("spark.driver.host", LOCAL_IP)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(RocketMQDataSource)
    return spark


def generate(store: Path, *, topic: str, queues: int, messages: int, body_size: int = 512,
             tags: str = "TagA,TagB,TagC", extra: list[str] | None = None) -> None:
    """Append sample messages with the ``rmq-store generate`` command (progress bar on stderr)."""
    cmd = [sys.executable, "-m", "rmq_source", "generate", str(store), "--topic", topic,
           "--queues", str(queues), "--messages", str(messages), "--body-size", str(body_size),
           "--tags", tags, "--commitlog-file-size", str(64 << 20), *(extra or [])]
    subprocess.run(cmd, check=True)


def table(rows: list[dict], title: str | None = None) -> str:
    """Dict rows (same keys) in the table format of ``rmq-store`` (first column left-aligned)."""
    from rmq_source.group.report import table_lines

    if title:
        print(f"\n== {title}")
    if not rows:
        print("(no rows)")
        return ""
    cols = list(rows[0])
    text = "\n".join(table_lines(cols, [["-" if r[c] is None else r[c] for c in cols] for r in rows]))
    print(text)
    return text


def show_lag(store: Path, group: str, topic: str, title: str) -> None:
    """The group's lag on ``topic`` in the table ``rmq-store lag STORE --group G --topic T`` prints."""
    from rmq_source.group.progress import group_lag
    from rmq_source.group.report import lag_lines
    from rmq_source.store.backend import StoreBackend

    print(f"\n== {title}")
    print("\n".join(lag_lines(group_lag(StoreBackend({"broker-a": str(store)}), group, [topic]))))


def stream_to_parquet(spark, options: dict, out: Path):
    """Run a ``Trigger.AvailableNow`` stream of ``format("rmq")`` with ``options`` into
    ``out/parquet`` (checkpoint ``out/checkpoint``), print its micro-batches, return the rows now
    in the parquet folder."""
    query = (spark.readStream.format("rmq").options(**options).load()
             .writeStream.format("parquet")
             .option("path", str(out / "parquet")).option("checkpointLocation", str(out / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    table([{"batch": p["batchId"], "rows": p["numInputRows"]} for p in query.recentProgress],
          "micro-batches of this run")
    return spark.read.parquet(str(out / "parquet")).count()
