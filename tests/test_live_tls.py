"""TLS (``useTLS``) against NameServers and brokers started with ``tls.server.mode=enforcing``
and certificates made here (tests/tls_certs.py), RocketMQ 4.9 and 5.3: reads (the C core's
pulls and the Python client's agree), a group stream, the sink and the CLI over TLS; refusals
(an unknown CA, a certificate for another name or self-signed, a plain client, TLS to a peer
that does not speak it) are clear errors naming the server, never a hang."""
from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
import uuid
from types import SimpleNamespace

import pytest

from conftest import BROKER_LINES, running_cluster
from rmq_source.errors import RmqRemotingConnectionError
from rmq_source.group.allocation import MessageQueue
from rmq_source.remote import RemotingClient
from rmq_source.remote import requests as rq
from rmq_source.remote.backend import ClusterBackendSpec
from rmq_source.remote.tls import TlsConfig
from rmq_source.subscription import Subscription
from rocketmq_cluster import NameServer, pull_all, tls_server_props
from tls_certs import make_certs

pytestmark = [pytest.mark.broker]

QUEUES, PER_QUEUE = 4, 25


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("tls-certs"))


@pytest.fixture(scope="module", params=BROKER_LINES, ids=lambda line: f"rocketmq-{line}")
def tls_cluster(request, rocketmq_jars, tmp_path_factory, certs):
    """A NameServer and broker that accept TLS only, with a topic of 4 x 25 messages."""
    tls = TlsConfig(trust_cert_path=str(certs.ca))
    with running_cluster(rocketmq_jars, request.param, tmp_path_factory, "tls",
                         system_props=tls_server_props(certs.server_cert, certs.server_key),
                         client_tls=tls) as cluster:
        topic = f"Tls_{uuid.uuid4().hex[:8]}"
        broker = cluster.brokers["broker-a"]
        with RemotingClient(timeout=15, tls=tls) as client:
            cluster.create_topic(client, topic, QUEUES)
            bodies = {q: [f"tls-{q}-{i}".encode() for i in range(PER_QUEUE)] for q in range(QUEUES)}
            for q, sent in bodies.items():
                for body in sent:
                    rq.send_message(client, broker.addr, topic, body, queue_id=q, tags="t")
            for q in range(QUEUES):
                rq.wait_max_offset(client, broker.addr, topic, q, PER_QUEUE)
        yield SimpleNamespace(cluster=cluster, tls=tls, topic=topic, bodies=bodies, broker=broker,
                              options={"namesrvAddr": cluster.namesrv_addr, "useTLS": "true",
                                       "tlsTrustCertPath": str(certs.ca)})


def _backend_rows(tls_cluster, native: bool) -> dict[int, list[bytes]]:
    spec = ClusterBackendSpec((tls_cluster.cluster.namesrv_addr,), 15.0, tls=tls_cluster.tls,
                              native_pulls=native, pull_group=f"TlsPull{int(native)}")
    backend = spec.open()
    out = {}
    for q in range(QUEUES):
        mq = MessageQueue(tls_cluster.topic, "broker-a", q)
        batches = backend.read(mq, 0, PER_QUEUE, subscription=Subscription.parse("*"), batch_rows=7,
                               batch_bytes=1 << 20, verify_crc=True,
                               on_data_loss=lambda *a: pytest.fail(f"data loss {a}"),
                               on_short_read=lambda *a: pytest.fail(f"short read {a}"))
        out[q] = [b for batch in batches for b in batch.column("body").to_pylist()]
    return out


@pytest.mark.spark
def test_reads_a_group_stream_the_sink_and_the_cli_over_tls(spark, tls_cluster, tmp_path):
    """Everything crosses TLS: the C core's pulls and the Python client's give the same rows; a
    Spark batch read and an AvailableNow group stream get every message once, the group's offsets
    on the broker end at the queues' ends (the CLI shows them over TLS), and the sink's rows are
    in their topic."""
    t = tls_cluster
    every = sorted(b for sent in t.bodies.values() for b in sent)
    assert _backend_rows(t, native=True) == _backend_rows(t, native=False) == t.bodies

    rows = spark.read.format("rmq").options(**t.options, topic=t.topic).load().select("body").collect()
    assert sorted(r.body for r in rows) == every

    group = f"TlsGroup_{uuid.uuid4().hex[:6]}"
    q = (spark.readStream.format("rmq").options(**t.options, topic=t.topic, consumerGroup=group,
                                                 consumeFromWhere="CONSUME_FROM_FIRST_OFFSET",
                                                 groupStatePath=str(tmp_path / "state"))
         .load().select("body").writeStream.format("parquet").option("path", str(tmp_path / "sink"))
         .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())
    assert q.awaitTermination(180) and q.exception() is None, q.exception()
    assert sorted(r.body for r in spark.read.parquet(str(tmp_path / "sink")).collect()) == every

    cli = subprocess.run([sys.executable, "-m", "rmq_source", "lag", "--namesrv", t.cluster.namesrv_addr,
                          "--tls", "--tls-trust-cert-path", t.options["tlsTrustCertPath"],
                          "--group", group, "--topic", t.topic, "--json"],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr[-2000:]
    lags = [json.loads(line) for line in cli.stdout.splitlines()]
    assert len(lags) == QUEUES and all(row["diff"] == 0 for row in lags), lags

    sink_topic = f"TlsSink_{uuid.uuid4().hex[:6]}"
    with RemotingClient(timeout=15, tls=t.tls) as client:
        t.cluster.create_topic(client, sink_topic, 2)
    sent = [f"sunk-{i}".encode() for i in range(40)]
    (spark.createDataFrame([(b,) for b in sent], "body binary").write.format("rmq").mode("append")
     .options(**t.options, topic=sink_topic).save())
    with RemotingClient(timeout=15, tls=t.tls) as client:
        got = [m.body for qid in range(2) for m in pull_all(client, t.broker.addr, sink_topic, qid)]
    assert sorted(got) == sorted(sent)


@contextlib.contextmanager
def _closing_peer():
    """host:port of a socket peer that reads what comes (a TLS client hello) and closes."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(4096)
                except OSError:
                    pass
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        server.close()


def _refused(call) -> str:
    started = time.monotonic()
    with pytest.raises(RmqRemotingConnectionError) as info:
        call()
    assert time.monotonic() - started < 30, "the refusal took as long as a hang"
    return str(info.value)


def test_refusals_name_the_server_and_what_to_do(tls_cluster, certs, tmp_path):
    """An unknown CA, a certificate naming another host, a self-signed one, a plain client to a TLS
    server and TLS to a peer that does not speak it each fail at once, naming the server; the certificate of another name is
    accepted without the name check, any certificate with tlsSkipVerify (in C as in Python)."""
    from rmq_source.remote.native_pull import NativePuller
    addr, broker = tls_cluster.cluster.namesrv_addr, tls_cluster.broker.addr

    def info(tls, at=addr):
        with RemotingClient(timeout=10, connect_timeout=10, tls=tls) as client:
            return rq.cluster_info(client, at)

    unknown_ca = TlsConfig(trust_cert_path=str(certs.other_ca))
    text = _refused(lambda: info(unknown_ca))
    assert "certificate was refused" in text and "tlsTrustCertPath" in text and addr in text
    text = _refused(lambda: NativePuller(broker, connect_timeout=10, tls=unknown_ca))
    assert "certificate was refused" in text and broker in text
    text = _refused(lambda: info(None))
    assert "set useTLS=true" in text and addr in text
    with _closing_peer() as plain:                 # a server that reads, then hangs up
        for call in (lambda: info(tls_cluster.tls, plain),
                     lambda: NativePuller(plain, connect_timeout=10, tls=tls_cluster.tls)):
            text = _refused(call)
            assert "does it speak TLS" in text and plain in text
    assert info(TlsConfig(verify=False)).nodes("broker-a")
    NativePuller(broker, connect_timeout=10, tls=TlsConfig(verify=False)).close()

    # a server whose certificate names other.example, not the address dialled; and one with
    # RocketMQ's default tls.server.mode=permissive, whose TLS side shows a self-signed test
    # certificate (tls.test.mode.enable defaults to true)
    version, jars = tls_cluster.cluster.version, tls_cluster.cluster.jars
    other = NameServer(version, jars, tmp_path / "other",
                       system_props=tls_server_props(certs.named_other, certs.named_other_key))
    permissive = NameServer(version, jars, tmp_path / "permissive")
    mutual = NameServer(version, jars, tmp_path / "mutual", system_props={
        **tls_server_props(certs.server_cert, certs.server_key),
        "tls.server.need.client.auth": "require", "tls.server.trustCertPath": certs.ca})
    try:
        for server in (other.launch(), permissive.launch(), mutual.launch()):
            server.wait_boot()
        no_name_check = TlsConfig(trust_cert_path=str(certs.ca), verify_hostname=False)
        for connect in (info, lambda tls, at: NativePuller(at, connect_timeout=10, tls=tls).close()):
            text = _refused(lambda: connect(tls_cluster.tls, other.addr))
            assert "IP address mismatch" in text and "tlsVerifyHostname=false" in text and other.addr in text
            connect(no_name_check, other.addr)
            text = _refused(lambda: connect(tls_cluster.tls, permissive.addr))
            assert "certificate was refused (self-signed certificate)" in text and permissive.addr in text
        assert info(None, permissive.addr) is not None          # plain still works there

        # a server asking for a client certificate (tls.server.need.client.auth=require)
        with_cert = TlsConfig(trust_cert_path=str(certs.ca), cert_path=str(certs.client_cert),
                              key_path=str(certs.client_key))
        assert info(with_cert, mutual.addr) is not None
        text = _refused(lambda: info(tls_cluster.tls, mutual.addr))
        assert "client certificate" in text and "tlsCertPath" in text and mutual.addr in text
        assert _native_round_trip(mutual.addr, with_cert).code != 0     # its answer came back
        text = _refused(lambda: _native_round_trip(mutual.addr, tls_cluster.tls))
        assert mutual.addr in text
    finally:
        for server in (other, permissive, mutual):
            server.stop(graceful=False)


def _native_round_trip(addr: str, tls: TlsConfig):
    """A request sent by the C core's puller over TLS to a NameServer (a route request for a topic
    it does not know, on the puller's template), whose answer must come back through the session:
    the command answered."""
    from rmq_source.remote.native_pull import Answer, NativePuller, pull_template
    puller = NativePuller(addr, connect_timeout=10, tls=tls)
    try:
        template = pull_template({"topic": "NoSuchTopicTls"}, code=rq.GET_ROUTEINFO_BY_TOPIC)
        puller.range(template, 0, 10, per_pull=5, in_flight=1, timeout_s=10, expect_suggest=0,
                     what="round trip")
        got = puller.next(100, 1 << 20)
        assert isinstance(got, Answer), got
        return got.command
    finally:
        puller.close()


@pytest.mark.spark
def test_a_spark_read_with_the_wrong_ca_fails_naming_the_nameserver(spark, tls_cluster, certs):
    t = tls_cluster
    options = dict(t.options, tlsTrustCertPath=str(certs.other_ca), requestRetries="0")
    with pytest.raises(Exception) as info:
        spark.read.format("rmq").options(**options, topic=t.topic).load().collect()
    text = str(info.value)
    assert "certificate was refused" in text and t.cluster.namesrv_addr in text
