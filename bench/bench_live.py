"""Reading a live cluster: our client, the Spark read and RocketMQ's own Java client, same run.

Starts a NameServer and two brokers of one RocketMQ version (``tests/rocketmq_cluster.py``; Java 17
and Maven), sends ``--messages`` 1 KiB messages to a topic of 4 queues on each broker, then reads
them all, each best of ``--repeat`` after a warm-up pass:

* **ours**: :class:`rmq_source.remote.backend.ClusterBackend` pulling (the C core's pull loop, 4
  pulls in flight a queue) and decoding into Arrow batches with the C core, no Spark; CPU seconds
  of this process;
* **java**: the real ``DefaultMQPullConsumer`` (compiled here) pulling 32 at a time and decoding
  into ``MessageExt`` (bodies touched); CPU seconds of its JVM, measured inside it;
* **spark**: ``spark.read.format("rmq")`` with every column into the ``noop`` sink (wall clock).

Targets (issue 11): ours >= 2x the Java client per CPU second; the Spark read >= the Java client's
rate. Planning: min/max offsets of 1,000 queues over the two brokers (``infos``, what
``latestOffset`` asks) in tens of milliseconds: one topic-statistics request per broker and topic.

``--tls``: the servers accept TLS only (``tls.server.mode=enforcing``, certificates made by
``tests/tls_certs.py``); ours checks the servers' certificates against the test CA (``useTLS``,
the C core's OpenSSL), the Java client speaks TLS (``-Dtls.enable=true``, checking nothing, its
default) and so does the Spark read. Target (issue 28): ours >= 2x the Java client per CPU second.

``--proxy`` (5.x): a RocketMQ 5 Proxy in cluster mode in front of the brokers; ours, the Java
client and the Spark read name its remoting port as their NameServer, and ours also reads
directly once more for comparison. Target (issue 41): through a Proxy ours >= 1.5x the Java client
per CPU second.

    python bench/bench_live.py [--version 5.3] [--messages 200000] [--repeat 3] [--tls | --proxy]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import types
from pathlib import Path

import common  # noqa: F401  (puts the checkout on sys.path)
from common import REPO, print_machine, print_table, run_java_client, spark_session

sys.path.insert(0, str(REPO / "tests"))

import rocketmq_cluster  # noqa: E402
from rmq_source.group.allocation import MessageQueue  # noqa: E402
from rmq_source.remote import RemotingClient  # noqa: E402
from rmq_source.remote import requests as rq  # noqa: E402
from rmq_source.remote.backend import ClusterBackendSpec  # noqa: E402

TOPIC, PLAN_TOPIC = "LiveBench", "LivePlan"
BROKERS, QUEUES_PER_BROKER, BODY = ("broker-a", "broker-b"), 4, 1024

JAVA_PULL = r"""
import java.lang.management.ManagementFactory;
import java.util.Set;
import org.apache.rocketmq.client.consumer.DefaultMQPullConsumer;
import org.apache.rocketmq.client.consumer.PullResult;
import org.apache.rocketmq.client.consumer.PullStatus;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

public class LivePull {
    public static void main(String[] args) throws Exception {
        DefaultMQPullConsumer c = new DefaultMQPullConsumer("live_bench_java");
        c.setNamesrvAddr(args[0]);
        c.setInstanceName("live-bench-" + System.nanoTime());
        c.start();
        com.sun.management.OperatingSystemMXBean os =
            (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
        Set<MessageQueue> mqs = c.fetchSubscribeMessageQueues(args[1]);
        for (int pass = 0; pass < Integer.parseInt(args[2]); pass++) {
            long t0 = System.nanoTime(), cpu0 = os.getProcessCpuTime(), n = 0, bytes = 0;
            for (MessageQueue mq : mqs) {
                long offset = 0;
                while (true) {
                    PullResult r = c.pull(mq, "*", offset, 32);
                    if (r.getPullStatus() != PullStatus.FOUND) break;
                    for (MessageExt m : r.getMsgFoundList()) { n++; bytes += m.getBody().length; }
                    offset = r.getNextBeginOffset();
                }
            }
            System.out.println("PASS " + pass + " " + n + " " + bytes + " " + (System.nanoTime() - t0)
                               + " " + (os.getProcessCpuTime() - cpu0));
        }
        c.shutdown();
    }
}
"""


def start_cluster(version_line: str, workdir: Path, tls: bool):
    """The cluster, and the TLS settings of our client (None without ``tls``)."""
    version, jars = rocketmq_cluster.resolve_line(version_line)
    props, config = {}, None
    if tls:
        from tls_certs import make_certs
        from rmq_source.remote.tls import TlsConfig
        certs = make_certs(workdir / "certs")
        props = rocketmq_cluster.tls_server_props(certs.server_cert, certs.server_key)
        config = TlsConfig(trust_cert_path=str(certs.ca))
    cluster = rocketmq_cluster.Cluster(version, jars, workdir, broker_names=BROKERS, system_props=props,
                                       client_tls=config).start()
    return cluster, config


def fill(cluster, messages: int, tls) -> None:
    body = os.urandom(BODY)
    per_broker = messages // len(BROKERS)
    with RemotingClient(timeout=30, tls=tls) as client:
        for name in BROKERS:
            addr = cluster.brokers[name].addr
            rq.create_topic(client, addr, TOPIC, read_queues=QUEUES_PER_BROKER)
            rq.create_topic(client, addr, PLAN_TOPIC, read_queues=500)
            for start in range(0, per_broker, 64):
                n = min(64, per_broker - start)
                rq.send_batch(client, addr, TOPIC, [{"body": body, "tags": "t", "keys": f"k{start + i}"}
                                                    for i in range(n)],
                              queue_id=(start // 64) % QUEUES_PER_BROKER)
        deadline = time.monotonic() + 60
        while not all(rq.topic_route(client, cluster.namesrv_addr, t).queue_datas
                      for t in (TOPIC, PLAN_TOPIC)):
            assert time.monotonic() < deadline, "topics never reached the NameServer"
            time.sleep(0.2)


def ours(namesrv: str, passes: int, tls) -> list[tuple[int, float, float]]:
    """(messages, wall s, CPU s of this process) per pass."""
    backend = ClusterBackendSpec((namesrv,), 30.0, tls=tls).open()
    mqs = backend.queues_for_topics([TOPIC])
    infos = backend.infos(mqs)
    out = []
    for _ in range(passes):
        t0, c0, n = time.perf_counter(), time.process_time(), 0
        for mq in mqs:
            for batch in backend.read(mq, infos[mq].min_offset, infos[mq].max_offset, subscription="*",
                                      batch_rows=8192, batch_bytes=64 << 20, verify_crc=False,
                                      on_data_loss=_fail, on_short_read=_fail):
                n += batch.num_rows
        out.append((n, time.perf_counter() - t0, time.process_time() - c0))
    return out


def _fail(*args):
    raise RuntimeError(f"unexpected callback {args}")


def java(cluster, namesrv: str, workdir: Path, passes: int, tls) -> list[tuple[int, float, float]]:
    view = types.SimpleNamespace(namesrv_addr=namesrv, jars=cluster.jars)
    lines = run_java_client(view, workdir, "LivePull", JAVA_PULL, [TOPIC, str(passes)], timeout=1800,
                            system_props={"tls.enable": "true"} if tls else None)
    rows = [line.split() for line in lines if line.startswith("PASS ")]
    return [(int(r[2]), int(r[4]) / 1e9, int(r[5]) / 1e9) for r in rows]


def spark_read(namesrv: str, passes: int, tls) -> list[tuple[int, float]]:
    spark = spark_session()
    from rmq_source import RocketMQDataSource
    spark.dataSource.register(RocketMQDataSource)
    out = []
    for _ in range(passes):
        reader = spark.read.format("rmq").option("namesrvAddr", namesrv).option("topic", TOPIC)
        if tls is not None:
            reader = reader.option("useTLS", "true").option("tlsTrustCertPath", tls.trust_cert_path)
        df = reader.load()
        t0 = time.perf_counter()
        df.write.format("noop").mode("overwrite").save()
        out.append((0, time.perf_counter() - t0))
    spark.stop()
    return out


def planning(namesrv: str, repeat: int, tls) -> tuple[int, float]:
    backend = ClusterBackendSpec((namesrv,), 30.0, tls=tls).open()
    mqs = backend.queues_for_topics([PLAN_TOPIC])
    best = float("inf")
    for _ in range(repeat + 1):
        t0 = time.perf_counter()
        infos = backend.infos(mqs)
        best = min(best, time.perf_counter() - t0)
    assert len(infos) == len(mqs) and all(isinstance(m, MessageQueue) for m in infos)
    return len(mqs), best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", default="5.3", choices=("4.9", "5.3"))
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tls", action="store_true", help="servers accepting TLS only, every reader over TLS")
    ap.add_argument("--proxy", action="store_true", help="every reader through a RocketMQ 5 Proxy")
    args = ap.parse_args()
    if args.proxy and (args.tls or args.version.startswith("4.")):
        ap.error("--proxy: a RocketMQ 5 line (--version 5.3), without --tls")
    workdir = Path(tempfile.mkdtemp(prefix="rmq-live-bench-"))
    print_machine()
    cluster, tls = start_cluster(args.version, workdir, args.tls)
    proxy = direct = None
    try:
        fill(cluster, args.messages, tls)
        namesrv = cluster.namesrv_addr
        if args.proxy:
            proxy = rocketmq_cluster.Proxy(cluster.version, rocketmq_cluster.resolve_proxy_jars(cluster.version),
                                           workdir / "proxy", namesrv=namesrv,
                                           cluster=cluster.cluster_name).start()
            namesrv = proxy.addr
        passes = args.repeat + 1                      # the first pass warms caches and the JIT
        o = min(ours(namesrv, passes, tls)[1:], key=lambda r: r[2])
        if proxy is not None:
            direct = min(ours(cluster.namesrv_addr, passes, tls)[1:], key=lambda r: r[2])
        j = min(java(cluster, namesrv, workdir, passes, tls)[1:], key=lambda r: r[2])
        s = min(spark_read(namesrv, passes, tls)[1:], key=lambda r: r[1])
        n_plan, plan_s = planning(namesrv, args.repeat, tls)
    finally:
        if proxy is not None:
            proxy.stop()
        cluster.stop()
    n = o[0]
    assert j[0] == n, f"the Java client read {j[0]} messages, ours {n}"
    ours_cpu, java_cpu = n / o[2], n / j[2]
    print(f"\nRocketMQ {cluster.version}, {n} messages of {BODY} B over {len(BROKERS)} brokers x "
          f"{QUEUES_PER_BROKER} queues, best of {args.repeat} after a warm-up pass"
          + (", every connection TLS" if args.tls else "")
          + (", every reader through a Proxy" if proxy is not None else ""))
    direct_row = [] if direct is None else [
        ["ours directly (no Proxy), for comparison", f"{n / direct[1] / 1e3:.0f} k msgs/s",
         f"{n / direct[2] / 1e3:.0f} k msgs/CPU-s"]]
    print_table(["reader", "wall clock", "CPU time (reader process)"], [
        ["ours: pull + C decode, no Spark", f"{n / o[1] / 1e3:.0f} k msgs/s", f"{ours_cpu / 1e3:.0f} k msgs/CPU-s"],
        *direct_row,
        ["RocketMQ Java DefaultMQPullConsumer", f"{n / j[1] / 1e3:.0f} k msgs/s", f"{java_cpu / 1e3:.0f} k msgs/CPU-s"],
        ["spark.read (every column, noop sink)", f"{n / s[1] / 1e3:.0f} k msgs/s", "-"],
    ])
    target = "1.5x, through a Proxy" if proxy is not None else "2x"
    print(f"\nours / Java per CPU second (target >= {target}): {ours_cpu / java_cpu:.1f}x")
    print(f"Spark read / Java wall clock (target >= 1x): {(n / s[1]) / (n / j[1]):.1f}x")
    print(f"planning: min/max offsets of {n_plan} queues over {len(BROKERS)} brokers: "
          f"{plan_s * 1e3:.1f} ms (target: tens of ms)")


if __name__ == "__main__":
    main()
