"""RocketMQ ACL: ``accessKey``/``secretKey`` sign every request, judged by real brokers with ACL on.

Each RocketMQ line gets its own NameServer and broker with ACL on (4.9 plain ACL; 5.3 ACL 2.0, its
users migrated from the same ``plain_acl.yml`` and the reader's grants made with the real
``mqadmin updateAcl``). The reader account may subscribe to one topic through two groups and to
nothing else. What must hold: the reader reads its topic (batch and streaming); every refusal
(no credentials, a wrong secret, an unknown account, a topic or group without permission) is an
``RmqAuthError`` that names the access key, the request and the broker, after one request (no
retry storm); the secret key shows nowhere: errors, options and partition reprs, query plans,
checkpoint offsets, our logs.
"""
from __future__ import annotations

import logging
import pickle
import time
import uuid
from pathlib import Path

import pytest

from conftest import BROKER_LINES, raises_rmq, running_cluster, running_proxy
from rmq_source.errors import RmqAuthError
from rmq_source.group.allocation import MessageQueue
from rmq_source.remote import RemotingClient
from rmq_source.remote import requests as rq
from rmq_source.remote.acl import Credentials
from rmq_source.remote.backend import PULL_GROUP, ClusterBackendSpec
from rmq_source.spark.batch_reader import plan_batch
from rmq_source.spark.options import parse_options

pytestmark = [pytest.mark.broker]

ADMIN = Credentials("rmqAdmin", "admin-Secret-7f3a")
READER = Credentials("rmqReader", "reader-Secret-91c2")
TOPIC, DENIED, GROUP = "AclTopic", "AclDenied", "AclGroup"
SECRETS = (ADMIN.secret_key, READER.secret_key)
QUEUES, MESSAGES = 2, 24
#: the reader may subscribe to TOPIC, through GROUP or the group of pulls without consumerGroup
READER_GROUPS = (GROUP, PULL_GROUP)


def _accounts(is_v4: bool) -> list[dict]:
    reader = {"accessKey": READER.access_key, "secretKey": READER.secret_key,
              "defaultTopicPerm": "DENY", "defaultGroupPerm": "DENY"}
    if is_v4:   # 5.x takes the grants from mqadmin below (ACL 2.0 needs Get beside Sub)
        reader["topicPerms"] = [f"{TOPIC}=SUB"]
        reader["groupPerms"] = [f"{g}=SUB" for g in READER_GROUPS]
    return [{"accessKey": ADMIN.access_key, "secretKey": ADMIN.secret_key, "admin": True}, reader]


class AclCluster:
    def __init__(self, cluster):
        self.cluster = cluster
        self.broker = cluster.brokers["broker-a"]
        self.namesrv = cluster.namesrv_addr
        self.bodies: dict[int, list[bytes]] = {q: [] for q in range(QUEUES)}

    def options(self, creds: Credentials | None = READER, **extra) -> dict:
        out = {"namesrvAddr": self.namesrv, "topic": TOPIC, "startingOffsets": "earliest"}
        if creds is not None:
            out.update(accessKey=creds.access_key, secretKey=creds.secret_key)
        out.update(extra)
        return out


@pytest.fixture(scope="module", params=BROKER_LINES, ids=lambda line: f"rocketmq-{line}")
def acl(request, rocketmq_jars, tmp_path_factory):
    is_v4 = request.param.startswith("4.")
    with running_cluster(rocketmq_jars, request.param, tmp_path_factory, "acl",
                         broker_kw={"acl": _accounts(is_v4)}) as cluster:
        c = AclCluster(cluster)
        if not is_v4:
            resources = ",".join([f"Topic:{TOPIC}"] + [f"Group:{g}" for g in READER_GROUPS])
            cluster.mqadmin("updateAcl", "-b", c.broker.addr, "-s", f"User:{READER.access_key}",
                            "-r", resources, "-a", "Sub,Get,Update", "-d", "Allow",
                            access_key=ADMIN.access_key, secret_key=ADMIN.secret_key)
        with RemotingClient(timeout=15, credentials=ADMIN) as admin:
            for topic in (TOPIC, DENIED):
                cluster.create_topic(admin, topic, QUEUES)
            for n in range(MESSAGES):
                body = b"acl-%d-" % n + uuid.uuid4().bytes
                for topic in (TOPIC, DENIED):
                    rq.send_message(admin, c.broker.addr, topic, body, queue_id=n % QUEUES, tags="t")
                c.bodies[n % QUEUES].append(body)
            for q in range(QUEUES):
                rq.wait_max_offset(admin, c.broker.addr, TOPIC, q, len(c.bodies[q]))
        yield c


def _backend(acl: AclCluster, creds: Credentials | None, group: str = PULL_GROUP):
    return ClusterBackendSpec((acl.namesrv,), 10.0, credentials=creds, pull_group=group).open()


def _read_all(backend, topic: str = TOPIC) -> list[bytes]:
    out = []
    for q in range(QUEUES):
        mq = MessageQueue(topic, "broker-a", q)
        end = backend.info(mq).max_offset
        for batch in backend.read(mq, 0, end, subscription="*", batch_rows=100, batch_bytes=1 << 20,
                                  verify_crc=True, on_data_loss=_never, on_short_read=_never):
            out += batch.column("body").to_pylist()
    return out


def _never(*args):
    raise AssertionError(f"unexpected callback {args}")


def _expected(acl: AclCluster) -> list[bytes]:
    return [b for q in range(QUEUES) for b in acl.bodies[q]]


def test_the_reader_reads_its_topic_through_both_groups(acl):
    for group in READER_GROUPS:
        assert _read_all(_backend(acl, READER, group)) == _expected(acl)


def _refused(acl: AclCluster, creds, group=PULL_GROUP, topic=TOPIC, what="queues"):
    backend = _backend(acl, creds, group)
    sent = []
    real = backend.client.invoke

    def counting(addr, code, *args, **kw):
        sent.append(code)
        return real(addr, code, *args, **kw)

    backend.client.invoke = counting
    t0 = time.monotonic()
    with raises_rmq(RmqAuthError) as info:
        if what == "queues":
            backend.infos([MessageQueue(topic, "broker-a", 0)])
        else:
            _read_all(backend, topic)
    return info.value, sent, time.monotonic() - t0


# (id, credentials, pull group, topic, operation, text the error must hold); the 4.9 broker
# checks no permission on queue stats (only the signature), 5.x checks every request
REFUSALS = [
    ("no-credentials", None, GROUP, TOPIC, "read", "no credentials (if the broker has ACL on, set the options accessKey"),
    ("wrong-secret", Credentials(READER.access_key, "not-the-secret"), GROUP, TOPIC, "queues",
     "access key 'rmqReader'"),
    ("unknown-account", Credentials("nobody", "whatever-secret"), GROUP, TOPIC, "queues",
     "access key 'nobody'"),
    ("topic-not-allowed", READER, GROUP, DENIED, "read", DENIED),
    ("group-not-allowed", READER, "OtherGroup", TOPIC, "read", "OtherGroup"),
    ("topic-stats-not-allowed", READER, GROUP, DENIED, "queues", DENIED),
]


@pytest.mark.parametrize("creds, group, topic, what, text", [c[1:] for c in REFUSALS],
                         ids=[c[0] for c in REFUSALS])
def test_refusals_are_auth_errors_after_one_request(acl, creds, group, topic, what, text):
    if what == "queues" and topic == DENIED and acl.cluster.version.startswith("4."):
        # 4.9's plain ACL checks no permission on queue stats: any known account reads them
        infos = _backend(acl, creds, group).infos([MessageQueue(topic, "broker-a", 0)])
        assert list(infos.values())[0].max_offset == MESSAGES // QUEUES
        return
    err, sent, took = _refused(acl, creds, group, topic, what)
    message = str(err)
    assert text in message and "peer: " + acl.broker.addr in message, message
    assert isinstance(err, PermissionError) and err.code in (1, 16)
    assert not any(s in message for s in SECRETS), message
    # the refused request is the last one sent: nothing retried it
    assert sent and sent.count(sent[-1]) == 1, sent
    assert took < 10, took


@pytest.mark.lines("5.3")
def test_secrets_show_nowhere_in_options_partitions_plans_and_offsets(acl, spark, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="rmq_source")
    opts = acl.options(consumerGroup=GROUP)
    parsed = parse_options(opts, streaming=False)
    reader = spark.read.format("rmq").options(**opts)
    df = reader.load()
    rows = df.collect()
    assert sorted(r.body for r in rows) == sorted(_expected(acl))
    plan = df._jdf.queryExecution().toString()

    parts = plan_batch(parsed)
    assert pickle.loads(pickle.dumps(parts[0])).backend.credentials == READER  # tasks get them
    shown = "\n".join([repr(parsed), str(parsed), plan, *map(repr, parts),
                       *(r.getMessage() for r in caplog.records)])

    # a streaming run (pulls without consumerGroup) writes its offsets into the checkpoint
    chk, sink = tmp_path / "chk", tmp_path / "sink"
    query = (spark.readStream.format("rmq").options(**acl.options()).load()
             .writeStream.format("parquet").option("path", str(sink))
             .option("checkpointLocation", str(chk)).trigger(availableNow=True).start())
    assert query.awaitTermination(120)
    assert sorted(spark.read.parquet(str(sink)).select("body").toPandas()["body"]) == sorted(_expected(acl))
    files = "\n".join(p.read_text(errors="replace") for p in Path(chk).rglob("*") if p.is_file())
    assert TOPIC in files
    for secret in SECRETS:
        assert secret not in shown and secret not in files


def test_wrong_secret_through_spark_names_the_account_not_the_secret(acl, spark):
    bad = Credentials(READER.access_key, "wrong-Secret-0000")
    with pytest.raises(Exception) as info:
        spark.read.format("rmq").options(**acl.options(bad, consumerGroup=GROUP)).load().collect()
    text = str(info.value)
    assert "RmqAuthError" in text and "access key 'rmqReader'" in text, text[-2000:]
    assert bad.secret_key not in text


def _cli(*args, secret: str | None):
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "RMQ_SECRET_KEY"}
    if secret is not None:
        env["RMQ_SECRET_KEY"] = secret
    return subprocess.run([sys.executable, "-m", "rmq_source", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def test_cli_signs_with_the_secret_from_the_environment(acl):
    ok = _cli("lag", "--namesrv", acl.namesrv, "--group", GROUP, "--topic", TOPIC, "--json",
              "--access-key", READER.access_key, secret=READER.secret_key)
    assert ok.returncode == 0, ok.stderr
    assert len(ok.stdout.splitlines()) == QUEUES
    for secret, text in ((None, "RMQ_SECRET_KEY"), ("wrong-Secret-0000", "access key 'rmqReader'")):
        bad = _cli("lag", "--namesrv", acl.namesrv, "--group", GROUP, "--topic", TOPIC,
                   "--access-key", READER.access_key, secret=secret)
        assert bad.returncode != 0 and text in bad.stderr, bad.stderr
        assert READER.secret_key not in bad.stderr + bad.stdout


@pytest.mark.parametrize("who, delayed", [("admin", False), ("reader", False), ("reader", True),
                                         ("nobody", False)])
def test_sink_signs_its_sends(acl, spark, who, delayed):
    """The sink signs every request with accessKey/secretKey: the admin account writes, an
    unsigned writer is refused, and so is an account without PUB permission - except that 4.9's
    plain ACL does not check the topic of SEND_BATCH_MESSAGE (PlainAccessValidator has no case
    for it; the Java client's batch send passes the same way), so there only single sends (a
    delayed row) are refused. The error names ACL and never shows a secret."""
    from rmq_source.errors import RmqSendError
    topic = "AclSink"
    with RemotingClient(timeout=15, credentials=ADMIN) as admin:
        if not _routed(admin, acl, topic):
            acl.cluster.create_topic(admin, topic, QUEUES)
    creds = {"admin": ADMIN, "reader": READER, "nobody": None}[who]
    name = f"{who}{'-delayed' if delayed else ''}"
    bodies = [f"{name}-{i}".encode() for i in range(30)]
    df = spark.createDataFrame([(b, 1 if delayed else None) for b in bodies], "body binary, delayTimeLevel int")
    w = (df.write.format("rmq").mode("append").option("namesrvAddr", acl.namesrv).option("topic", topic)
         .option("requestRetries", "0"))
    if creds is not None:
        w = w.option("accessKey", creds.access_key).option("secretKey", creds.secret_key)
    v4_batch_gap = acl.cluster.version.startswith("4.") and who == "reader" and not delayed
    if who != "admin" and not v4_batch_gap:
        with raises_rmq(RmqSendError, "refused by ACL") as info:
            w.save()
        assert not any(s in info.text for s in SECRETS)
        return
    w.save()
    deadline = time.monotonic() + 20
    while True:
        got = sorted(b for b in _read_all(_backend(acl, ADMIN), topic) if b.startswith(name.encode() + b"-"))
        if got == sorted(bodies) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert got == sorted(bodies)


def _routed(admin, acl, topic) -> bool:
    from rmq_source.errors import RmqBrokerError
    try:
        return bool(rq.topic_route(admin, acl.namesrv, topic).queue_datas)
    except RmqBrokerError as exc:
        if exc.code != rq.TOPIC_NOT_EXIST:
            raise
        return False


# ------------------------------------------------------------------ through a RocketMQ 5 Proxy

@pytest.fixture(scope="module")
def acl_proxy(acl, tmp_path_factory):
    """A Proxy in front of the 5.3 ACL cluster that checks signatures and grants itself (ACL 2.0
    users and policies fetched from the brokers) and signs what it forwards with the admin
    account (``enableAclRpcHookForClusterMode``), as a deployment behind Proxies does."""
    import json

    auth = {
        "authenticationEnabled": True, "authorizationEnabled": True,
        "authenticationMetadataProvider": "org.apache.rocketmq.proxy.auth.ProxyAuthenticationMetadataProvider",
        "authorizationMetadataProvider": "org.apache.rocketmq.proxy.auth.ProxyAuthorizationMetadataProvider",
        "enableAclRpcHookForClusterMode": True,
        "innerClientAuthenticationCredentials": json.dumps(
            {"accessKey": ADMIN.access_key, "secretKey": ADMIN.secret_key}),
    }
    with running_proxy(acl.cluster, tmp_path_factory, "acl-proxy", auth) as server:
        yield server


@pytest.mark.parametrize("acl", ["5.3"], indirect=True, ids=["rocketmq-5.3"])
def test_signed_requests_through_a_proxy(acl, acl_proxy, spark):
    """Through the Proxy: the reader reads its topic (batch, signed pulls and offsets); a wrong
    secret, an unknown account and a topic without permission are auth errors naming the access
    key and the Proxy; the admin account's sink write reaches the topic."""
    through = ClusterBackendSpec((acl_proxy.addr,), 10.0, credentials=READER, pull_group=GROUP).open()
    assert sorted(_read_all(through)) == sorted(_expected(acl))
    rows = spark.read.format("rmq").options(**acl.options(namesrvAddr=acl_proxy.addr)).load()
    assert sorted(bytes(r.body) for r in rows.select("body").collect()) == sorted(_expected(acl))
    for creds, topic, text in ((Credentials(READER.access_key, "not-the-secret"), TOPIC, "rmqReader"),
                               (Credentials("nobody", "whatever-secret"), TOPIC, "nobody"),
                               (READER, DENIED, DENIED)):
        backend = ClusterBackendSpec((acl_proxy.addr,), 10.0, credentials=creds, pull_group=GROUP).open()
        with raises_rmq(RmqAuthError) as info:
            _read_all(backend, topic)
        assert text in info.text and acl_proxy.addr in info.text, info.text
        assert not any(s in info.text for s in SECRETS), info.text
    sink_topic = "AclSink"
    with RemotingClient(timeout=15, credentials=ADMIN) as admin:
        if not _routed(admin, acl, sink_topic):
            acl.cluster.create_topic(admin, sink_topic, QUEUES)
    bodies = {b"via-proxy-%d" % i for i in range(20)}
    (spark.createDataFrame([(b,) for b in sorted(bodies)], "body binary").write.format("rmq")
     .mode("append").option("namesrvAddr", acl_proxy.addr).option("topic", sink_topic)
     .option("accessKey", ADMIN.access_key).option("secretKey", ADMIN.secret_key).save())
    deadline = time.monotonic() + 20
    while not bodies <= set(_read_all(_backend(acl, ADMIN), sink_topic)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert bodies <= set(_read_all(_backend(acl, ADMIN), sink_topic))
