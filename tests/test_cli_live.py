"""rmq-store topics / lag / reset-offset with --namesrv: the same commands on a live cluster (real
RocketMQ 4.9.x and 5.3.x), as subprocesses. Group offsets are read from and written to the brokers,
where the brokers' own answers (QUERY_CONSUMER_OFFSET) must show them."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pytest

from rmq_source.remote import RemotingClient
from rmq_source.remote import requests as rq

pytestmark = pytest.mark.broker

PER_QUEUE = 10


def run(*args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rmq_source", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def ok(*args) -> list[dict]:
    out = run(*args)
    assert out.returncode == 0, out.stdout + out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def live(rocketmq):
    """A topic of two queues holding PER_QUEUE messages each, sent in two rounds 1.1 s apart;
    returns (namesrv, topic, the time the second round began)."""
    topic = f"Cli_{uuid.uuid4().hex[:8]}"
    broker = rocketmq.brokers["broker-a"].addr
    with RemotingClient(timeout=15) as client:
        rocketmq.create_topic(client, topic, 2)
        second = 0
        for rnd in range(2):
            if rnd:
                time.sleep(1.1)
                second = int(time.time() * 1000)
            for i in range(PER_QUEUE // 2):
                for q in range(2):
                    rq.send_message(client, broker, topic, b"m%d" % i, queue_id=q, tags="t")
        for q in range(2):
            assert rq.wait_max_offset(client, broker, topic, q, PER_QUEUE) == PER_QUEUE
    return rocketmq.namesrv_addr, topic, second


def test_topics_on_a_live_cluster(live):
    namesrv, topic, _ = live
    rows = [r for r in ok("topics", "--namesrv", namesrv, "--json") if r["topic"] == topic]
    assert rows == [{"topic": topic, "brokerName": "broker-a", "queueId": q, "minOffset": 0,
                     "maxOffset": PER_QUEUE} for q in range(2)]
    text = run("topics", "--namesrv", namesrv).stdout
    assert "BROKER" in text and any(line.startswith(topic) and "broker-a" in line for line in text.splitlines())


def test_lag_and_reset_on_the_brokers(live, rocketmq):
    namesrv, topic, second = live
    group = f"cli_group_{uuid.uuid4().hex[:6]}"
    broker = rocketmq.brokers["broker-a"].addr
    lag = ok("lag", "--namesrv", namesrv, "--group", group, "--topic", topic, "--json")
    # a group without progress: 5.x brokers answer "not found" (-1); 4.9 brokers answer 0 while the
    # queue still starts at 0 (what RocketMQ's own 4.9 clients are told as well)
    none = 0 if rocketmq.version.startswith("4.") else -1
    assert [(r["queueId"], r["consumerOffset"], r["diff"]) for r in lag] == [(0, none, 10), (1, none, 10)]

    # a live consumer of the group (its heartbeat also makes the group known to a 5.x broker)
    with RemotingClient(timeout=15) as member:
        rq.heartbeat(member, broker, rq.client_id() + "-member", consumer_groups={group: [topic]})
        refused = run("reset-offset", "--namesrv", namesrv, "--group", group, "--topic", topic,
                      "--to", "earliest")
        assert refused.returncode == 4, refused.stdout + refused.stderr
        assert "in use by live client(s)" in refused.stderr
        forced = ok("reset-offset", "--namesrv", namesrv, "--group", group, "--topic", topic,
                    "--to", "latest", "--force", "--json")
        assert [(r["queueId"], r["offset"]) for r in forced] == [(0, PER_QUEUE), (1, PER_QUEUE)]
    with RemotingClient(timeout=15) as client:
        deadline = time.monotonic() + 30
        while rq.consumer_list(client, broker, group):       # the member's connection is gone
            assert time.monotonic() < deadline
            time.sleep(0.3)
        done = ok("reset-offset", "--namesrv", namesrv, "--group", group, "--topic", topic,
                  "--timestamp", second, "--json")
        assert [(r["previousOffset"], r["offset"]) for r in done] == [(PER_QUEUE, PER_QUEUE // 2)] * 2
        for q in range(2):
            assert rq.query_consumer_offset(client, broker, group, topic, q) == PER_QUEUE // 2
    lag = ok("lag", "--namesrv", namesrv, "--group", group, "--topic", topic, "--json")
    assert [(r["consumerOffset"], r["diff"]) for r in lag] == [(5, 5), (5, 5)]
    assert all(r["lastTimestamp"] is not None and r["lastTimestamp"] < second for r in lag)


@pytest.mark.parametrize("args, code, text", [
    (["topics", "STORE", "--namesrv", "NS"], 2, "either STORE"),
    (["topics"], 2, "either STORE"),
    (["lag", "--namesrv", "NS", "--group", "g"], 2, "needs --topic"),
    (["lag", "--namesrv", "NS", "--group", "g", "--topic", "T", "--broker-name", "b"], 2,
     "--broker-name applies to STORE"),
    (["reset-offset", "--namesrv", "NS", "--group", "g", "--topic", "T", "--offsets", "{}"], 2,
     "--offsets applies to STORE"),
    (["lag", "--namesrv", "NS", "--group", "g", "--topic", "NoSuchTopic_x"], 3, "NoSuchTopic_x"),
    (["topics", "--namesrv", "127.0.0.1:1"], 3, "no NameServer answered (tried 127.0.0.1:1)"),
])
def test_live_cli_errors(live, tmp_path, args, code, text):
    namesrv = live[0]
    args = [str(tmp_path) if a == "STORE" else namesrv if a == "NS" else a for a in args]
    out = run(*args)
    assert out.returncode == code, out.stdout + out.stderr
    assert text in out.stderr, out.stderr
