"""A real Apache Kafka broker for bench_vs_kafka.py: one KRaft node (broker and controller in one
JVM) on loopback, its jars resolved from Maven Central once (``org.apache.kafka:kafka_2.13``, with
``mvn dependency:copy-dependencies`` into the cache tests/rocketmq_cluster.py uses).

The server runs with Kafka's own defaults but for a single node's replication factors of 1 and
``num.partitions`` (the partitions of a topic the first producer creates). Its JVM gets what
``kafka-server-start.sh`` gives it (1 GiB heap, G1 with 20 ms pauses).
"""
from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import common

KAFKA_VERSION = "4.1.1"
KAFKA_HEAP = ("-Xmx1G", "-Xms1G")
KAFKA_GC = ("-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
            "-XX:+ExplicitGCInvokesConcurrent")


def _rocketmq_cluster():
    import sys
    sys.path.insert(0, str(common.REPO / "tests"))
    import rocketmq_cluster
    return rocketmq_cluster


def resolve_kafka(version: str = KAFKA_VERSION) -> Path:
    """The folder of the Kafka server's runtime jars (``kafka_2.13`` and ``kafka-tools``)."""
    rc = _rocketmq_cluster()
    return rc.maven_jars(f"kafka-{version}", [("org.apache.kafka", "kafka_2.13", version),
                                              ("org.apache.kafka", "kafka-tools", version)],
                         f"kafka_2.13-{version}.jar", what=f"Apache Kafka {version}")


class KafkaServer:
    """One KRaft node under ``workdir``: ``start()`` formats the log folder and waits until the
    broker listens; ``bootstrap`` is its address; ``pid`` its JVM; ``stop()`` kills it."""

    def __init__(self, workdir: Path, *, partitions: int = 8, version: str = KAFKA_VERSION):
        self.workdir = Path(workdir)
        self.version = version
        self.jars = resolve_kafka(version)
        rc = _rocketmq_cluster()
        self.port = rc.free_port((0, 1))          # broker listener, controller listener
        self.partitions = partitions
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def _java(self, main: str, *args: str, heap: tuple[str, ...] = ("-Xmx256m",)) -> list[str]:
        return ["java", *heap, f"-Dkafka.logs.dir={self.workdir / 'logs'}", "-cp",
                f"{self.jars}/*", main, *args]

    def start(self, timeout: float = 60.0) -> "KafkaServer":
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "server.properties"
        conf.write_text("\n".join([
            "process.roles=broker,controller", "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{self.port + 1}",
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.port + 1}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names=CONTROLLER",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            f"log.dirs={self.workdir / 'data'}", f"num.partitions={self.partitions}",
            "offsets.topic.replication.factor=1", "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1", "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1", "group.initial.rebalance.delay.ms=0", ""]))
        cluster_id = subprocess.run(self._java("kafka.tools.StorageTool", "random-uuid"),
                                    capture_output=True, text=True, check=True).stdout.split()[-1]
        # (--cluster-id=: a random id may begin with "-")
        fmt = subprocess.run(self._java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}",
                                        "-c", str(conf)), capture_output=True, text=True)
        if fmt.returncode != 0:
            raise RuntimeError(f"kafka-storage format failed: {fmt.stdout[-1000:]}{fmt.stderr[-1000:]}")
        log = open(self.workdir / "server.out", "w")
        self.proc = subprocess.Popen(self._java("kafka.Kafka", str(conf), heap=KAFKA_HEAP + KAFKA_GC),
                                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        atexit.register(self.stop)          # a bench that fails leaves no JVM behind
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Kafka exited with {self.proc.returncode}: "
                                   f"{(self.workdir / 'server.out').read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"Kafka did not listen on {self.bootstrap} in {timeout:.0f} s")
                time.sleep(0.2)
        import loopback                     # (tests/, on the path through _rocketmq_cluster())
        offenders = loopback.offenders_of(self.proc.pid)
        if offenders:                       # the bench runs on loopback only
            self.stop()
            raise RuntimeError("Kafka is open beyond loopback: " + "; ".join(offenders))
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
