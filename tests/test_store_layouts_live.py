"""Store mode on the other layouts, judged by real brokers (RocketMQ 4.9.x and 5.3.x).

1. One broker of each layout (DLedger and RocksDB consume queues on 5.3) writes the
   plan (tests/layout_stores.py): a Store opened while it runs reads a prefix of what it serves
   and (DLedger) catches up with it; stopped, our store read equals what the broker served (our pulls) and
   what the real Java client pulled.
2. A three-peer DLedger group: its followers frozen, the leader appends an entry it cannot
   commit and is SIGKILLed; the two others elect a leader and take more messages. The killed
   leader's store (the uncommitted entry in its data file) reads as a prefix of what the group
   serves, without that entry (which the new term may still commit, when it had reached a frozen
   follower's socket); the new leader's store, stopped, reads as all the group serves, which is
   what the real Java client pulls from it.
"""
from __future__ import annotations

import base64
import os
import signal
import time

import pytest

import rocketmq_cluster as rc_cluster
from conftest import running_cluster
from layout_stores import (QUEUES, SMALL_FILES, TOPIC, dledger_props, layout_props, read_rows,
                           read_store, served, wait_served, write_plan)
from test_broker_stores import java_dump
from rmq_source.remote import RemotingClient
from rmq_source.remote import requests as rq
from rmq_source.store.reader import Store

pytestmark = pytest.mark.broker


@pytest.fixture(scope="module")
def java_work(tmp_path_factory):
    """A folder per RocketMQ version where the Java Dump is compiled once."""
    return tmp_path_factory.mktemp("java")


# (4.9.7 DLedger: the group test below reads a live 4.9.7 DLedger store as its broker serves it,
# and tests/fixtures/make_layouts.py checked a one-peer 4.9.7 store against the Java client)
@pytest.mark.parametrize("line,kind", [("5.3", "dledger"), ("5.3", "rocksdb")],
                         ids=["rocketmq-5.3-dledger", "rocketmq-5.3-rocksdb"])
def test_store_reads_what_the_broker_served(rocketmq_jars, tmp_path_factory, java_work, line, kind):
    with running_cluster(rocketmq_jars, line, tmp_path_factory, f"layout-{kind}",
                         broker_kw={"extra": layout_props(kind), "commitlog_size": SMALL_FILES}) as cluster:
        broker = cluster.brokers["broker-a"]
        with RemotingClient(timeout=15) as client, Store(broker.store) as running:
            cluster.create_topic(client, TOPIC, QUEUES)
            first = write_plan(client, broker.addr, count=150)
            wait_served(client, broker.addr, first)
            early = served(client, broker.addr)
            # a store its broker writes to: a prefix of what it serves, then more of it
            assert all(rows == early[q][:len(rows)] for q, rows in read_rows(running).items())
            total = first + write_plan(client, broker.addr, seed=12, count=150)
            wait_served(client, broker.addr, total)
            live = served(client, broker.addr)
            deadline = time.monotonic() + 30
            # (a 5.3 broker writes RocksDB units without a WAL: they reach disk when it flushes)
            while (got := read_rows(running)) != live and kind != "rocksdb":
                assert all(rows == live[q][:len(rows)] for q, rows in got.items())
                assert time.monotonic() < deadline, "the store read did not catch up with its broker"
                time.sleep(0.2)
        work = java_work / cluster.version
        work.mkdir(exist_ok=True)
        dumped, ends = java_dump(cluster, work, TOPIC, "broker-a", QUEUES)
        cluster.stop_broker("broker-a")
    assert sum(map(len, live.values())) == total
    if kind == "dledger":
        assert len(os.listdir(broker.store / "dledger-n0" / "data")) > 3     # reads cross files
    got = read_store(broker.store)
    assert got == live
    for q in range(QUEUES):
        assert ends[q][0] == len(live[q])
        for (offset, msg_id, flag, crc, body, props), row in zip(dumped[q], got[q], strict=True):
            assert (offset, msg_id, flag, crc) == (row["queueOffset"], row["msgId"], row["flag"],
                                                   row["bodyCRC"])
            assert body == base64.b64decode(row["body"]) and props == row["properties"]


def _leader(client, namesrv: str, brokers: list, not_addr: str | None = None):
    deadline = time.monotonic() + 90
    while True:
        addr = rq.cluster_info(client, namesrv).master_addr("broker-a")
        found = [b for b in brokers if b.addr == addr and addr != not_addr]
        if found:
            return found[0]
        assert time.monotonic() < deadline, f"no DLedger leader registered (master: {addr})"
        time.sleep(0.3)


def _wait_frozen(servers, timeout: float = 30.0) -> None:
    """Wait until every thread of every server's JVM is stopped (a SIGSTOP is delivered to each
    thread when it next leaves the kernel)."""
    deadline = time.monotonic() + timeout
    for server in servers:
        tasks = f"/proc/{server.proc.pid}/task"
        while not all(_thread_state(f"{tasks}/{t}/stat") in "tTXZ" for t in os.listdir(tasks)):
            assert time.monotonic() < deadline, f"{server.addr} not frozen in {timeout:.0f} s"
            time.sleep(0.05)


def _thread_state(stat_path: str) -> str:
    try:
        with open(stat_path) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"                                          # (a thread that ended meanwhile)


def test_killed_leader_store_leaves_out_its_uncommitted_entry(rocketmq_jars, tmp_path_factory, java_work):
    version, jars = rocketmq_jars("4.9")
    with running_cluster(rocketmq_jars, "4.9", tmp_path_factory, "dledger-group", broker_names=()) as cluster:
        work = cluster.workdir
        ports = [rc_cluster.free_port() for _ in range(3)]
        peers = ";".join(f"n{i}-127.0.0.1:{p}" for i, p in enumerate(ports))
        brokers = [rc_cluster.Broker(version, jars, work / f"peer-n{i}", namesrv=cluster.namesrv_addr,
                                     commitlog_size=SMALL_FILES, heap_mb=256,
                                     extra={**dledger_props(f"n{i}", peers),
                                            "maxWaitAckTimeMs": 1000})
                   for i in range(3)]
        cluster.started.extend(brokers)
        for b in brokers:
            b.launch()
        for b in brokers:
            b.wait_boot()
        with RemotingClient(timeout=15) as client:
            leader = _leader(client, cluster.namesrv_addr, brokers)
            # (the next leader creates the topic itself when it is sent to: autoCreateTopicEnable)
            rq.create_topic(client, leader.addr, TOPIC, read_queues=QUEUES)
            total = write_plan(client, leader.addr, count=120)
            followers = [b for b in brokers if b is not leader]
            for b in followers:
                os.killpg(b.proc.pid, signal.SIGSTOP)
            try:
                _wait_frozen(followers)
                # appended by the leader, never acknowledged by a quorum
                try:
                    sent = rq.send_message(client, leader.addr, TOPIC, b"uncommitted-entry",
                                           queue_id=2, tags="t0", timeout=5)
                except Exception:
                    pass
                else:
                    master = rq.cluster_info(client, cluster.namesrv_addr).master_addr("broker-a")
                    pytest.fail(f"{leader.addr} stored a send with its followers frozen ({sent}; "
                                f"master now {master}, peers {peers}):\n"
                                + "\n".join(b.log_tails(60) for b in brokers))
                data = leader.store / f"dledger-n{brokers.index(leader)}" / "data"
                assert any(b"uncommitted-entry" in f.read_bytes() for f in data.iterdir())
                leader.kill()
            finally:
                for b in followers:
                    os.killpg(b.proc.pid, signal.SIGCONT)
            new = _leader(client, cluster.namesrv_addr, followers, not_addr=leader.addr)
            rq.send_batch(client, new.addr, TOPIC, [{"body": b"after-%d" % i, "tags": "t1"}
                                                    for i in range(8)], queue_id=2)
            wait_served(client, new.addr, total + 8)
            live = served(client, new.addr)
        (java_work / version).mkdir(exist_ok=True)
        dumped, _ = java_dump(cluster, java_work / version, TOPIC, "broker-a", QUEUES)
        assert {q: [(d[0], d[1]) for d in rows] for q, rows in dumped.items()} == {
            q: [(r["queueOffset"], r["msgId"]) for r in rows] for q, rows in live.items()}
        bodies = [base64.b64decode(r["body"]) for rows in live.values() for r in rows]
        # the entry reached the frozen followers' sockets or not: the new term commits it or not
        assert len(bodies) == total + 8 + bodies.count(b"uncommitted-entry")
        old = read_store(leader.store)
        assert all(base64.b64decode(r["body"]) != b"uncommitted-entry" for rows in old.values() for r in rows)
        for q in range(QUEUES):
            assert old[q] == live[q][:len(old[q])], q
        assert sum(map(len, old.values())) >= total - QUEUES     # dispatch may lag a message a queue
        new.stop()
        assert read_store(new.store) == live
