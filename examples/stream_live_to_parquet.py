"""Stream a topic of a live RocketMQ cluster into parquet, as a consumer of a group on the brokers.

    python examples/stream_live_to_parquet.py --namesrv HOST:PORT --topic T [--group G] [--out DIR]
    python examples/stream_live_to_parquet.py            # a local NameServer and broker (Java, Maven)

The query is a member of ``--group`` on the brokers: it heartbeats, reads the queues RocketMQ's
allocation gives it (Java consumers of the group share them), reads each queue under the broker's
lock (``orderly=true``) and commits each finished batch to the brokers, where ``mqadmin
consumerProgress`` and ``rmq-store lag --namesrv`` show it. Run it twice: the second run resumes
from its checkpoint. Without --namesrv it starts RocketMQ from Maven Central (as the test suite
does), sends sample messages to ``--topic`` and stops the servers at the end. ACL: add
``.option("accessKey", ...)`` and ``.option("secretKey", ...)``.

Everything it starts listens and talks on 127.0.0.1 only: a local Spark session (``local[2]``, its
driver bound to ``SPARK_LOCAL_IP``, 127.0.0.1 unless that is set; see _common.py), and without
``--namesrv`` a NameServer and broker bound to loopback. To point it at a real deployment instead,
give ``--namesrv`` your NameServers' addresses (``host:port;host:port``, reachable from the driver
and every executor) and ``--topic``; to run the same code on a Spark cluster, submit it with
``spark-submit --master ...`` as in docs/deploy.md (examples/cluster_job.py).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import local_spark, stream_to_parquet

REPO = Path(__file__).resolve().parents[1]


def local_cluster(topic: str, messages: int):
    """A NameServer and broker-a of the newest RocketMQ 5.3.x, with ``messages`` sent to ``topic``."""
    sys.path.insert(0, str(REPO / "tests"))
    import rocketmq_cluster
    from rmq_source.remote import RemotingClient
    from rmq_source.remote import requests as rq

    version, jars = rocketmq_cluster.resolve_line("5.3")
    cluster = rocketmq_cluster.Cluster(version, jars, Path(tempfile.mkdtemp(prefix="rmq-live-"))).start()
    broker = cluster.brokers["broker-a"]
    with RemotingClient(timeout=15) as client:
        rq.create_topic(client, broker.addr, topic, read_queues=4)
        for n in range(messages):
            rq.send_message(client, broker.addr, topic, b'{"order": %d}' % n, queue_id=n % 4,
                            tags="TagA" if n % 3 else "TagB", keys=[f"order-{n}"])
    print(f"started RocketMQ {version}: NameServer {cluster.namesrv_addr}, {messages} messages sent")
    return cluster


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--namesrv", help="NameServers host:port;host:port (default: start a local cluster)")
    ap.add_argument("--topic", default="Orders")
    ap.add_argument("--group", default="parquet-loader")
    ap.add_argument("--out", default="example-output/stream-live")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    cluster = None if args.namesrv else local_cluster(args.topic, 2_000)
    namesrv = args.namesrv or cluster.namesrv_addr
    try:
        spark = local_spark("stream a live cluster to parquet")
        total = stream_to_parquet(spark, {
            "namesrvAddr": namesrv, "topic": args.topic, "consumerGroup": args.group,
            "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",   # a new group starts at the beginning
            "groupStatePath": str(out / "group-state"), "maxMessagesPerTrigger": "500"}, out)
        print(f"\n{total} messages in {out / 'parquet'}")
        spark.stop()
        print("\n== the group's progress on the brokers (rmq-store lag --namesrv)")
        subprocess.run([sys.executable, "-m", "rmq_source", "lag", "--namesrv", namesrv,
                        "--group", args.group, "--topic", args.topic], check=False)
    finally:
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    main()
