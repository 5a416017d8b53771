"""docs/deploy.md's Spark Connect recipe, run: a Connect server (pyspark's own SparkConnectServer,
local[2]) whose Python workers run an interpreter with rmq_source installed (the server-side
install), and a client in another process that registers the data source over gRPC, reads a
store RocketMQ 4.9.3 wrote and runs an AvailableNow group stream of it. Exact against the store's
manifest; the group's progress, read back with ``rmq-store lag``, is at the end of every queue."""
from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import phase_timings
import spark_archive
from spark_servers import spark_home, wait_ready
from conftest import fixture_dir, missing
from rocketmq_cluster import free_port

pytestmark = pytest.mark.slow

TOPIC = "TopicTest"

CLIENT = r"""
import json, sys
from pyspark.sql import SparkSession
from rmq_source import RocketMQDataSource
url, store, out, group = sys.argv[1:5]
spark = SparkSession.builder.remote(url).getOrCreate()
assert type(spark).__module__.startswith("pyspark.sql.connect"), type(spark)
spark.dataSource.register(RocketMQDataSource)
opts = {"storePath": store, "topic": "TopicTest"}
batch = [r.msgId for r in spark.read.format("rmq").options(**opts).load().select("msgId").collect()]
from rmq_source.spark import compat
batches = 0
# Trigger.AvailableNow: every message in batches of 400 (4.2+); before 4.2 a run is one batch of
# 400, the rest left for the next runs (docs/options.md, "Spark versions")
for run in range(1 if compat.ADMISSION_CONTROL else 4):
    query = (spark.readStream.format("rmq")
             .options(**opts, consumerGroup=group, offsetStorePath=out + "/offsets",
                      consumeFromWhere="CONSUME_FROM_FIRST_OFFSET", maxMessagesPerTrigger="400").load()
             .select("msgId").writeStream.format("parquet").option("path", out + "/stream")
             .option("checkpointLocation", out + "/checkpoint").trigger(availableNow=True).start())
    query.awaitTermination()
    batches += len(query.recentProgress)
stream = [r.msgId for r in spark.read.parquet(out + "/stream").collect()]
print(json.dumps({"batch": batch, "stream": stream, "batches": batches}))
"""


def _serving(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    """A Spark Connect server on loopback, its Python workers on this interpreter; its sc:// URL."""
    if importlib.util.find_spec("grpc") is None:
        missing("a Spark Connect client needs pyspark[connect] (the test extra)")
    home = spark_home()
    work = tmp_path_factory.mktemp("connect")
    port = free_port()
    log = work / "server.log"
    spark_archive.ensure()
    env = dict(os.environ, SPARK_HOME=str(home), PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [str(home / "bin" / "spark-submit"), "--master", "local[2]",
             "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
             "--conf", f"spark.connect.grpc.binding.port={port}",
             "--conf", "spark.connect.grpc.binding.address=127.0.0.1",   # else every interface
             "--conf", "spark.ui.enabled=false",
             "--conf", "spark.sql.shuffle.partitions=2",
             "--conf", f"spark.driver.extraJavaOptions={spark_archive.java_options()}", "spark-internal"],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=work)
    try:
        with phase_timings.timed("Spark Connect server start"):
            wait_ready(server, log, lambda: _serving(port), "the Connect server")
        yield f"sc://127.0.0.1:{port}"
    finally:
        server.kill()
        server.wait(30)


def test_a_connect_client_reads_a_store_and_runs_a_group_stream(connect_server, tmp_path):
    base = fixture_dir("rocketmq-4.9.3/basic")
    manifest = [json.loads(line) for line in open(base / "manifest.jsonl", encoding="utf-8")]
    expected = sorted(m["msgId"] for m in manifest if m["topic"] == TOPIC)
    group = f"connect-{uuid.uuid4().hex[:8]}"
    # the client has no Spark of its own: everything runs in the server
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))}
    client = subprocess.run([sys.executable, "-c", CLIENT, connect_server, str(base / "store"), str(tmp_path),
                             group], capture_output=True, text=True, env=env, timeout=600)
    assert client.returncode == 0, client.stderr[-6000:]
    got = json.loads(client.stdout.strip().splitlines()[-1])
    assert sorted(got["batch"]) == expected
    assert sorted(got["stream"]) == expected
    assert got["batches"] >= 3              # 1,214 messages, 400 a trigger
    lag = subprocess.run([Path(sys.executable).parent / "rmq-store", "lag", base / "store", "--group", group,
                          "--topic", TOPIC, "--offset-store", tmp_path / "offsets", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert lag.returncode == 0, lag.stderr
    rows = [json.loads(line) for line in lag.stdout.splitlines()]
    assert len(rows) == 4 and all(r["consumerOffset"] == r["brokerOffset"] > 0 for r in rows), rows
