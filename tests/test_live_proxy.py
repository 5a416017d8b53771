"""Reading and writing through a real RocketMQ 5.3 Proxy (issue 41), its remoting port named as
``namesrvAddr``: the Proxy answers routes with itself as every broker and forwards each request to
the broker it names (``bname``); what it does not serve (topic statistics, cluster info, topic
lists) is learnt from its first refusal (docs/remoting.md, "Through a RocketMQ 5 Proxy").

One Proxy (module fixture) in front of the suite's shared 5.3 cluster; a topic and group per test.
What the tests compare against is asked of the broker directly.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import types
import uuid

import pytest

from tls_certs import make_certs
from conftest import raises_rmq, running_proxy
from fault_helpers.sinks import sink_bodies
from rmq_source.errors import RmqOptionError
from rmq_source.remote import RemotingClient
from rmq_source.remote import requests as rq

pytestmark = [pytest.mark.broker, pytest.mark.spark,
              # the shared 5.3 cluster of the session (a Proxy is a RocketMQ 5 server)
              pytest.mark.parametrize("rocketmq", ["5.3"], indirect=True, ids=["rocketmq-5.3"])]

QUEUES, FIRST, SECOND = 4, 6, 4      # messages per queue sent in the first and the second round


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("proxy-certs"))


@pytest.fixture(scope="module")
def proxy(rocketmq, tmp_path_factory, certs):
    """A Proxy in cluster mode in front of the shared cluster (its brokers registered already).
    Its remoting port speaks TLS with the test CA's certificate for 127.0.0.1 and plain remoting
    alike (the Proxy's default server mode, "permissive"; its own clients to the cluster stay
    plain)."""
    tls = {"tlsTestModeEnable": False, "tlsCertPath": str(certs.server_cert),
           "tlsKeyPath": str(certs.server_key)}
    with running_proxy(rocketmq, tmp_path_factory, "proxy", tls) as server:
        yield server


def _topic(rocketmq) -> str:
    name = f"Proxy_{uuid.uuid4().hex[:8]}"
    with RemotingClient(timeout=15) as client:
        rocketmq.create_topic(client, name, QUEUES)
    return name


def _send(rocketmq, topic: str, rnd: int, count: int, before: int = 0) -> set[bytes]:
    """``count`` messages a queue (holding ``before`` already), straight to the broker: tag a/b
    by parity, properties n (their index) and word (x every third), bodies
    ``r<rnd>-<queue>-<n>``."""
    addr = rocketmq.brokers["broker-a"].addr
    bodies = set()
    with RemotingClient(timeout=15) as client:
        for q in range(QUEUES):
            batch = [{"body": f"r{rnd}-{q}-{i}".encode(), "tags": "ab"[i % 2],
                      "properties": {"n": str(i), "word": "x" if i % 3 == 0 else "y"}}
                     for i in range(count)]
            rq.send_batch(client, addr, topic, batch, queue_id=q)
            bodies |= {m["body"] for m in batch}
        for q in range(QUEUES):
            assert rq.wait_max_offset(client, addr, topic, q, before + count) == before + count
    return bodies


@pytest.fixture(scope="module")
def filled(rocketmq):
    """A topic with two rounds of messages; (topic, the first store time the second round may
    have: every first-round message was stored before it)."""
    topic = _topic(rocketmq)
    _send(rocketmq, topic, 0, FIRST)
    boundary = int(time.time() * 1000) + 1
    while int(time.time() * 1000) < boundary:      # (a millisecond)
        pass
    _send(rocketmq, topic, 1, SECOND, FIRST)
    return topic, boundary


def _read(spark, namesrv: str, topic: str, **options):
    return (spark.read.format("rmq").option("namesrvAddr", namesrv).option("topic", topic)
            .options(**options).load())


def _bodies(df) -> list[bytes]:
    return sorted(bytes(r.body) for r in df.select("body").collect())


def _expected(rnd_counts, keep) -> list[bytes]:
    return sorted(f"r{rnd}-{q}-{i}".encode() for rnd, count in rnd_counts for q in range(QUEUES)
                  for i in range(count) if keep(rnd, i))


def test_a_batch_read_through_the_proxy_equals_a_direct_read(spark, rocketmq, proxy, filled):
    """Every column of every message as read through the NameServer; the Java client's pulls
    through the Proxy see the same messages at the same offsets."""
    from test_broker_stores import java_dump
    topic, _ = filled
    columns = ["topic", "brokerName", "queueId", "queueOffset", "body", "tags", "keys", "properties",
               "storeTimestamp", "bornTimestamp", "msgId"]
    through = _read(spark, proxy.addr, topic).select(*columns).orderBy("queueId", "queueOffset").collect()
    direct = _read(spark, rocketmq.namesrv_addr, topic).select(*columns).orderBy("queueId", "queueOffset").collect()
    assert through == direct
    assert len(through) == QUEUES * (FIRST + SECOND)
    java_view = types.SimpleNamespace(namesrv_addr=proxy.addr, jars=rocketmq.jars, version=rocketmq.version)
    dumped, ends = java_dump(java_view, proxy.workdir, topic, "broker-a", QUEUES)
    assert {q: [(m[0], m[4]) for m in dumped[q]] for q in range(QUEUES)} == {
        q: [(r.queueOffset, bytes(r.body)) for r in through if r.queueId == q] for q in range(QUEUES)}
    assert all(end[0] == FIRST + SECOND for end in ends.values()), ends


def test_tls_to_the_proxy(spark, rocketmq, proxy, filled, certs):
    """useTLS to the Proxy's remoting port (its certificate checked against the test CA): the
    same rows as plain remoting; a CA that did not sign it is refused, naming the Proxy."""
    topic, _ = filled
    tls = {"useTLS": "true", "tlsTrustCertPath": str(certs.ca)}
    assert _bodies(_read(spark, proxy.addr, topic, **tls)) == _bodies(_read(spark, proxy.addr, topic))
    with pytest.raises(Exception) as info:
        _read(spark, proxy.addr, topic, **dict(tls, tlsTrustCertPath=str(certs.other_ca),
                                               requestRetries="0")).collect()
    text = str(info.value)
    assert "certificate was refused" in text and proxy.addr in text, text[-2000:]


def test_the_proxys_grpc_port_is_refused_naming_the_remoting_port(spark, proxy, filled):
    from rmq_source.errors import RmqRemotingProtocolError
    topic, _ = filled
    grpc = f"127.0.0.1:{proxy.grpc_port}"
    with raises_rmq(RmqRemotingProtocolError) as info:
        _read(spark, grpc, topic).collect()
    assert "HTTP/2" in info.text and "remotingListenPort" in info.text and grpc in info.text, info.text


@pytest.mark.parametrize("options, keep", [
    ({"subExpression": "a"}, lambda rnd, i: i % 2 == 0),
    # (CONTAINS: the broker's version is checked, from a broker's answer through the Proxy)
    ({"expressionType": "SQL92", "subExpression": "word CONTAINS 'x' AND n >= 3"},
     lambda rnd, i: i % 3 == 0 and i >= 3),
    ("timestamp", lambda rnd, i: rnd == 1),
], ids=["tag", "sql92", "startingTimestamp"])
def test_filters_and_starts_through_the_proxy(spark, rocketmq, proxy, filled, options, keep):
    topic, boundary = filled
    if options == "timestamp":
        options = {"startingTimestamp": str(boundary)}
    assert _bodies(_read(spark, proxy.addr, topic, **options)) == _expected(
        [(0, FIRST), (1, SECOND)], keep)


def test_what_the_proxy_does_not_serve_is_asked_once(rocketmq, proxy, filled):
    """Queue offsets: one GET_TOPIC_STATS_INFO refused, then GET_MIN/MAX_OFFSET per queue, all in
    flight together; a broker's master from a route, never the cluster info again; the group's
    users from the Proxy's own list (one address: one request)."""
    from conftest import distinct_timeout
    from rmq_source.group.allocation import MessageQueue
    from rmq_source.remote.backend import ClusterBackendSpec
    topic, _ = filled
    backend = ClusterBackendSpec((proxy.addr,), timeout_s=distinct_timeout(10.0)).open()
    sent: list[int] = []
    send = backend.client.send
    backend.client.send = lambda addr, code, *a, **kw: sent.append(code) or send(addr, code, *a, **kw)
    mqs = backend.queues_for_topics([topic])
    assert mqs == [MessageQueue(topic, "broker-a", q) for q in range(QUEUES)]
    for _ in range(2):
        infos = backend.infos(mqs)
        assert {mq.queue_id: (i.min_offset, i.max_offset) for mq, i in infos.items()} == {
            q: (0, FIRST + SECOND) for q in range(QUEUES)}
    assert sent.count(rq.GET_TOPIC_STATS_INFO) == 1
    assert sent.count(rq.GET_MIN_OFFSET) == sent.count(rq.GET_MAX_OFFSET) == 2 * QUEUES
    assert backend.client.not_served == {proxy.addr: {rq.GET_TOPIC_STATS_INFO}}
    sent.clear()
    for _ in range(2):
        backend._forget("broker-a")                   # (as after a failed call)
        assert backend.broker_addr("broker-a") == proxy.addr
    assert sent == [rq.GET_BROKER_CLUSTER_INFO, rq.GET_ROUTEINFO_BY_TOPIC, rq.GET_ROUTEINFO_BY_TOPIC]
    assert backend.client.not_served == {proxy.addr: {rq.GET_TOPIC_STATS_INFO, rq.GET_BROKER_CLUSTER_INFO}}
    sent.clear()
    assert backend.group_users("ProxyNobody") == ([], {})      # (the Proxy's NPE answer)
    assert sent == [rq.GET_CONSUMER_LIST_BY_GROUP]


def test_topic_listing_through_the_proxy_is_refused_clearly(spark, proxy, filled):
    topic, _ = filled
    with raises_rmq(RmqOptionError, match=rf"option topicPattern .*namesrvAddr {proxy.addr} lists no "
                    r"topics.*Proxy.*option topic"):
        spark.read.format("rmq").option("namesrvAddr", proxy.addr).option("topicPattern", "Proxy_.*").load().count()
    listed = _cli("topics", "--namesrv", proxy.addr)
    assert listed.returncode == 2 and proxy.addr in listed.stderr and "--topic" in listed.stderr, listed.stderr
    rows = [json.loads(line) for line in _cli_ok("topics", "--namesrv", proxy.addr, "--topic", topic, "--json")]
    assert rows == [{"topic": topic, "brokerName": "broker-a", "queueId": q, "minOffset": 0,
                     "maxOffset": FIRST + SECOND} for q in range(QUEUES)]


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rmq_source", *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def _cli_ok(*args) -> list[str]:
    out = _cli(*args)
    assert out.returncode == 0, out.stdout + out.stderr
    return [line for line in out.stdout.splitlines() if line.startswith("{")]


def _offsets(rocketmq, topic: str, group: str) -> dict[int, int | None]:
    """The group's offsets as the broker itself answers them (not through the Proxy)."""
    addr = rocketmq.brokers["broker-a"].addr
    with RemotingClient(timeout=15) as client:
        return {q: rq.query_consumer_offset(client, addr, group, topic, q) for q in range(QUEUES)}


def test_lag_and_reset_offset_through_the_proxy(rocketmq, proxy, filled):
    """The group's offsets written through the Proxy are the broker's; a member heartbeating to
    the Proxy makes the group in use (the Proxy keeps the members; without one it answers the
    consumer list with an error, which is no member)."""
    topic, boundary = filled
    group = f"ProxyCli_{uuid.uuid4().hex[:6]}"
    common = ("--namesrv", proxy.addr, "--group", group, "--topic", topic)
    lag = [json.loads(line) for line in _cli_ok("lag", *common, "--json")]
    assert [(r["queueId"], r["consumerOffset"], r["diff"]) for r in lag] == [
        (q, -1, FIRST + SECOND) for q in range(QUEUES)]
    with RemotingClient(timeout=15) as member:
        rq.heartbeat(member, proxy.addr, "proxy-cli-member", consumer_groups={group: [topic]})
        # (heartbeats stay in the Proxy: the broker hears of the group at its first pull)
        assert rq.pull(member, proxy.addr, group, topic, 0, 0, broker_name="broker-a").found
        refused = _cli("reset-offset", *common, "--to", "latest")
        assert refused.returncode == 4 and "proxy-cli-member" in refused.stderr, refused.stderr
        rq.unregister_consumer(member, proxy.addr, "proxy-cli-member", group)
    _cli_ok("reset-offset", *common, "--timestamp", boundary, "--json")
    assert _offsets(rocketmq, topic, group) == {q: FIRST for q in range(QUEUES)}
    lag = [json.loads(line) for line in _cli_ok("lag", *common, "--json")]
    assert [(r["consumerOffset"], r["diff"]) for r in lag] == [(FIRST, SECOND)] * QUEUES
    assert all(r["lastTimestamp"] is not None and r["lastTimestamp"] < boundary for r in lag), lag


def test_answers_of_1_kib_messages_through_the_proxy_come_without_a_timeout(rocketmq, proxy, caplog):
    """A Proxy drops a forwarded answer it cannot write at once (more than 64 KiB unsent on the
    client's connection, docs/remoting.md): with several pulls of 32 1 KiB messages in flight some
    never came (the C core's pulls; Python's pipelined pulls read slower and lost none here).
    Through a Proxy pulls go one at a time: every answer comes, no pull times out."""
    from rmq_source.remote.backend import ClusterBackendSpec
    topic = _topic(rocketmq)
    addr = rocketmq.brokers["broker-a"].addr
    body = bytes(range(256)) * 4
    with RemotingClient(timeout=15) as client:
        for start in range(0, 512, 64):
            rq.send_batch(client, addr, topic, [{"body": body, "keys": f"k{start + i}"} for i in range(64)],
                          queue_id=0)
        assert rq.wait_max_offset(client, addr, topic, 0, 512) == 512
    backend = ClusterBackendSpec((proxy.addr,), 3.0).open()
    mq = next(m for m in backend.queues_for_topics([topic]) if m.queue_id == 0)
    with caplog.at_level("INFO", logger="rmq_source.remote"):
        got = [b for batch in backend.read(mq, 0, 512, subscription="*", batch_rows=8192,
                                          batch_bytes=64 << 20, verify_crc=True,
                                          on_data_loss=pytest.fail, on_short_read=pytest.fail)
               for b in batch.column("keys").to_pylist()]
    assert got == [[f"k{i}"] for i in range(512)]
    assert not [r.getMessage() for r in caplog.records if "unanswered" in r.getMessage()
                or "no answer" in r.getMessage() or "failed" in r.getMessage()]


def test_offsets_of_a_thousand_queues_through_the_proxy_come_without_a_timeout(rocketmq, proxy, caplog):
    """Per-queue GET_MIN/MAX_OFFSET of 1,000 queues (what planning asks through a Proxy) in
    windows: all 2,000 answers sent at once lost some at the Proxy (more than 64 KiB unsent)."""
    from rmq_source.remote.backend import ClusterBackendSpec
    name = f"ProxyWide_{uuid.uuid4().hex[:8]}"
    with RemotingClient(timeout=15) as client:
        rocketmq.create_topic(client, name, 1000)
        rq.send_message(client, rocketmq.brokers["broker-a"].addr, name, b"m", queue_id=999)
        assert rq.wait_max_offset(client, rocketmq.brokers["broker-a"].addr, name, 999, 1) == 1
    backend = ClusterBackendSpec((proxy.addr,), 3.0, retries=0).open()
    mqs = backend.queues_for_topics([name])
    with caplog.at_level("INFO", logger="rmq_source.remote"):
        infos = backend.infos(mqs)
    assert sorted((mq.queue_id, i.min_offset, i.max_offset) for mq, i in infos.items()) == [
        (q, 0, 1 if q == 999 else 0) for q in range(1000)]
    assert not [r.getMessage() for r in caplog.records if "no answer" in r.getMessage()]


@pytest.mark.parametrize("namespace", [None, "proxyNs"], ids=["plain", "namespace"])
def test_a_sink_write_through_the_proxy_reads_back(spark, rocketmq, proxy, namespace):
    """Written and read back through the Proxy; with a namespace the broker holds the topic as
    <namespace>%<topic> (the Proxy passes the client's names on) and rows name it without."""
    name = f"Proxy_{uuid.uuid4().hex[:8]}"
    stored = f"{namespace}%{name}" if namespace else name
    with RemotingClient(timeout=15) as client:
        rocketmq.create_topic(client, stored, QUEUES)
    opts = {"namespace": namespace} if namespace else {}
    rows = [(f"w-{i}".encode(), "t" if i % 2 else "u", f"k{i}") for i in range(40)]
    (spark.createDataFrame(rows, "body binary, tags string, keys string")
     .write.format("rmq").mode("append").option("namesrvAddr", proxy.addr).option("topic", name)
     .options(**opts).save())
    addr = rocketmq.brokers["broker-a"].addr
    with RemotingClient(timeout=15) as client:      # stored on the broker
        ends = {q: rq.max_offset(client, addr, stored, q) for q in range(QUEUES)}
    assert sum(ends.values()) == len(rows), ends
    back = _read(spark, proxy.addr, name, **opts).select("topic", "body", "tags", "keys").collect()
    assert sorted((bytes(r.body), r.tags, " ".join(r.keys)) for r in back) == sorted(rows)
    assert {r.topic for r in back} == {name}


@pytest.mark.parametrize("message_type", [None, "DELAY"], ids=["normal-topic", "delay-topic"])
def test_delayed_rows_through_the_proxy_need_a_delay_topic(spark, rocketmq, proxy, message_type):
    """The Proxy checks a message's type against the topic's ``message.type`` (NORMAL unless
    set): delayed rows to an ordinary topic are refused, naming both types; to a DELAY topic
    they are written and arrive."""
    from rmq_source.errors import RmqSendError
    name = f"ProxyDelay_{uuid.uuid4().hex[:8]}"
    with RemotingClient(timeout=15) as client:
        rocketmq.create_topic(client, name, QUEUES,
                              attributes={"message.type": message_type} if message_type else None)
    bodies = [f"d-{i}".encode() for i in range(6)]
    w = (spark.createDataFrame([(b, 1) for b in bodies], "body binary, delayTimeLevel int")
         .write.format("rmq").mode("append").option("namesrvAddr", proxy.addr).option("topic", name)
         .option("requestRetries", "0"))
    if message_type is None:
        with raises_rmq(RmqSendError, "expected type is NORMAL, but actual type is DELAY") as info:
            w.save()
        assert proxy.addr in info.text, info.text
        return
    w.save()
    _wait_for("the delayed rows never arrived",
              lambda: sorted(_bodies(_read(spark, proxy.addr, name))) == bodies, timeout=60)


def _stream(spark, namesrv, topic, group, tmp_path, **options):
    return (spark.readStream.format("rmq")
            .options(namesrvAddr=namesrv, topic=topic, consumerGroup=group, startingOffsets="earliest",
                     groupStatePath=str(tmp_path / "state"), lockRenewIntervalMs="1000", **options)
            .load().select("body").writeStream.format("parquet").option("path", str(tmp_path / "sink"))
            .option("checkpointLocation", str(tmp_path / "chk")))


def _wait_for(what: str, done, query=None, timeout: float = 120.0, last=None) -> None:
    """Poll ``done()`` until true; the query failing or ``timeout`` passing fails the test (with
    ``last()``, what was last seen)."""
    deadline = time.monotonic() + timeout
    while not done():
        assert query is None or query.exception() is None, query.exception()
        assert time.monotonic() < deadline, (f"{what} after {timeout:.0f} s"
                                             + (f"; last seen: {last()}" if last else ""))
        time.sleep(0.2)


@pytest.mark.spark42     # (an AvailableNow run: its last batch committed to the group)
def test_an_ordered_group_run_through_the_proxy_commits_on_the_broker(spark, rocketmq, proxy, filled,
                                                                     tmp_path):
    """The query is the group's member at the Proxy, holds the broker's queue locks through it
    (orderly, the default) and commits to the broker, where its offsets are the queues' ends."""
    topic, _ = filled
    group = f"ProxyGroup_{uuid.uuid4().hex[:6]}"
    q = _stream(spark, proxy.addr, topic, group, tmp_path).trigger(availableNow=True).start()
    assert q.awaitTermination(180), "the AvailableNow run did not finish"
    assert q.exception() is None, q.exception()
    got = sink_bodies(tmp_path / "sink")
    assert sorted(got) == _expected([(0, FIRST), (1, SECOND)], lambda rnd, i: True)
    assert _offsets(rocketmq, topic, group) == {q: FIRST + SECOND for q in range(QUEUES)}
    # RocketMQ's own tool, asking the brokers: every queue consumed to its end. (With the topic:
    # without it the tool looks for the group's %RETRY% topic, which brokers create at a member's
    # heartbeat; behind a Proxy none reaches them, for Java members alike. docs/semantics.md)
    report = rocketmq.mqadmin("consumerProgress", "-g", group, "-t", topic)
    rows = [line.split() for line in report.splitlines() if line.startswith(topic)]
    # topic, broker name, queue id, broker offset, consumer offset, (client ip), diff, ...
    assert sorted((int(r[2]), int(r[3]), int(r[4])) for r in rows) == [
        (q, FIRST + SECOND, FIRST + SECOND) for q in range(QUEUES)], report[-3000:]


def test_a_query_and_a_java_orderly_consumer_share_a_group_through_the_proxy(spark, rocketmq, proxy,
                                                                           tmp_path):
    """A group query and RocketMQ's Java orderly push consumer, both connected through the
    Proxy (which keeps the group's member list): each consumes a share of the queues under the
    broker's locks, and together every message once, in order, with no overlap
    (test_live_group_members' history checks; no member leaves or dies here)."""
    from test_broker_stores import java_command
    from test_live_group_members import (JAVA, JAVA_ORDERLY_MEMBER, JAVA_PROPS, Consumptions,
                                         check_group_history)
    topic = _topic(rocketmq)
    group = f"ProxyMembers_{uuid.uuid4().hex[:6]}"
    addr = rocketmq.brokers["broker-a"].addr
    record, sent, ends = Consumptions(), set(), [0] * QUEUES
    java_out, stop_file = tmp_path / "java.out", tmp_path / "java.stop"
    view = types.SimpleNamespace(namesrv_addr=proxy.addr, jars=rocketmq.jars, version=rocketmq.version)
    cmd = java_command(view, tmp_path, "OrderlyMember", topic, group, str(stop_file),
                       sources={"OrderlyMember": JAVA_ORDERLY_MEMBER}, system_props=JAVA_PROPS)
    with java_out.open("w") as out:
        java = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    query = None
    try:
        query = (spark.readStream.format("rmq")
                 .options(namesrvAddr=proxy.addr, topic=topic, consumerGroup=group, clientId="spark",
                          startingOffsets="group", consumeFromWhere="CONSUME_FROM_FIRST_OFFSET",
                          groupStatePath=str(tmp_path / "state"), lockRenewIntervalMs="1000",
                          requestTimeoutMs="5000")
                 .load().writeStream.foreachBatch(record.recorder("spark"))
                 .option("checkpointLocation", str(tmp_path / "chk"))
                 .trigger(processingTime="500 milliseconds").start())
        with RemotingClient(timeout=15) as client:
            def members() -> set[str]:       # as the Proxy lists them
                assert java.poll() is None, java_out.read_text()[-3000:]
                return set(rq.consumer_list(client, proxy.addr, group))
            _wait_for("the Proxy never listed both members", lambda: len(members()) == 2, query, 90,
                      last=members)

            def burst() -> bool:
                """One more message a queue (to the broker directly); True once every message
                sent was consumed and both members consumed some."""
                for q in range(QUEUES):
                    rq.send_message(client, addr, topic, f"m{ends[q]}".encode(), queue_id=q)
                    sent.add((q, ends[q]))
                    ends[q] += 1
                _wait_for("a message was never consumed",
                          lambda: sent <= {(q, o) for _, q, o, _, _ in record.events(java_out)}, query)
                return {m for m, *_ in record.events(java_out)} == {JAVA, "spark"}
            _wait_for("a member never got a queue", burst, query, 120,
                      last=lambda: {m for m, *_ in record.events(java_out)})
    finally:
        if query is not None:
            query.stop()
        stop_file.touch()
        try:
            java.wait(30)
        except subprocess.TimeoutExpired:
            java.kill()
    check_group_history(record.events(java_out), sent, may_repeat=set())


def test_the_proxy_killed_and_restarted_under_a_group_stream(spark, rocketmq, proxy, tmp_path):
    """SIGKILL of the Proxy mid-stream, restarted on its port: every message reaches the sink
    once, and the group's offsets on the broker end at the queues' ends. Few request retries:
    the driver plans while the Proxy (its NameServer and every broker) is away (on the last
    routes), tasks check their locks then (waiting for the broker)."""
    topic = _topic(rocketmq)
    group = f"ProxyKill_{uuid.uuid4().hex[:6]}"
    sent = _send(rocketmq, topic, 0, 8)
    sink = tmp_path / "sink"
    q = _stream(spark, proxy.addr, topic, group, tmp_path, maxMessagesPerTrigger="8",
                requestTimeoutMs="3000", requestRetries="2").trigger(processingTime="300 milliseconds").start()
    try:
        _wait_for("no batch reached the sink", lambda: len(sink_bodies(sink)) >= 8, q)
        more: dict = {}
        sender = threading.Thread(target=lambda: more.update(sent=_send(rocketmq, topic, 1, 6, 8)))
        proxy.kill()                                     # SIGKILL, mid-stream
        sender.start()                                   # (straight to the broker, meanwhile)
        proxy.start()                                    # its port again
        sender.join(60)
        sent |= more["sent"]
        _wait_for("the sink never had every message", lambda: set(sink_bodies(sink)) == sent, q, 180)
        rows = sink_bodies(sink)
        assert len(rows) == len(set(rows)), "a message reached the sink twice"
        # the last batch is committed to the group at the next planning
        _wait_for("the group's offsets never reached the ends",
                  lambda: _offsets(rocketmq, topic, group) == {i: 14 for i in range(QUEUES)}, q, 60,
                  last=lambda: _offsets(rocketmq, topic, group))
    finally:
        q.stop()
