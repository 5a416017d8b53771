"""A job for a Spark cluster, submitted with a packed venv as the Python of its driver and executors
(docs/deploy.md, "Standalone, client mode, with a packed venv"; run by tests/test_packaging.py):

    spark-submit --master spark://HOST:7077 --deploy-mode client \\
        --archives env.tar.gz#environment examples/cluster_job.py \\
        --namesrv HOST:9876 --topic T --group G --sink-topic T2 --out /shared/folder

with ``PYSPARK_PYTHON=./environment/bin/python`` and ``PYSPARK_DRIVER_PYTHON=./environment/bin/python``
set, and the env also unpacked as ``./environment`` in the folder spark-submit runs in (client mode:
Spark plans a Python data source in a Python worker on the driver, started from the same path).

Three things a deployment must get right, each done once: a live batch read of ``--topic`` into
``OUT/batch``; a streaming query of group ``--group`` (Trigger.AvailableNow, from the first
offsets) into ``OUT/stream``, its progress committed to the brokers; the batch read's bodies sent
to ``--sink-topic``. Every row also carries ``python`` (``sys.prefix`` of the Python worker on the
executor that produced it) and ``package`` (where that worker imported rmq_source from), so a run
shows which Python the executors used. ``OUT`` must be one folder for the driver and every executor
(a shared file system). Prints one JSON line: the driver's Python and the master.
"""
from __future__ import annotations

import argparse
import json
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T


def _worker_python(_body) -> list[str]:
    import sys as worker_sys

    import rmq_source
    return [worker_sys.prefix, rmq_source.__file__]


def with_worker_python(df):
    """``df`` plus the columns ``python`` and ``package`` (see the module's docstring). A plain
    Python UDF: unlike pandas and Arrow UDFs (mapInArrow too) it needs no pandas in the env."""
    where = F.udf(_worker_python, T.ArrayType(T.StringType()), useArrow=False)("body")
    return df.withColumn("where", where).select("*", F.col("where")[0].alias("python"),
                                                F.col("where")[1].alias("package")).drop("where")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--namesrv", required=True, help="the NameServers (host:port;host:port)")
    ap.add_argument("--topic", required=True, help="the topic to read")
    ap.add_argument("--group", required=True, help="the consumer group of the streaming query")
    ap.add_argument("--sink-topic", required=True, help="the topic the bodies are sent to")
    ap.add_argument("--out", required=True, help="a folder the driver and every executor can write")
    args = ap.parse_args()

    from rmq_source import RocketMQDataSource
    spark = SparkSession.builder.appName("rmq_source cluster job").getOrCreate()
    spark.dataSource.register(RocketMQDataSource)
    live = {"namesrvAddr": args.namesrv, "topic": args.topic}

    batch = spark.read.format("rmq").options(**live).load().select("queueId", "queueOffset", "body")
    with_worker_python(batch).write.mode("overwrite").parquet(f"{args.out}/batch")

    stream = (spark.readStream.format("rmq")
              .options(**live, consumerGroup=args.group, groupStatePath=f"{args.out}/group-state",
                       consumeFromWhere="CONSUME_FROM_FIRST_OFFSET")
              .load().select("queueId", "queueOffset", "body"))
    query = (with_worker_python(stream).writeStream.format("parquet").option("path", f"{args.out}/stream")
             .option("checkpointLocation", f"{args.out}/checkpoint").trigger(availableNow=True).start())
    query.awaitTermination()

    (spark.read.parquet(f"{args.out}/batch").select("body")
     .write.format("rmq").mode("append").options(namesrvAddr=args.namesrv, topic=args.sink_topic).save())

    print(json.dumps({"driverPython": sys.prefix, "master": spark.sparkContext.master}))
    spark.stop()


if __name__ == "__main__":
    main()
