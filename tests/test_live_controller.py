"""RocketMQ 5's controller mode: the master of a broker group SIGKILLed and a slave elected in its
place, under an ordered and an unordered group query and a sink stream (RocketMQ 5.3.x).

The NameServer runs the controller (``enableControllerInNamesrv``, one DLedger peer); broker-c is
a group of three brokers in controller mode (``enableControllerMode``, ``brokerId=-1``: the
controller gives the ids and elects the master, which registers as broker id 0;
``allAckInSyncStateSet``: a send is acknowledged once every in-sync replica has it, so an elected
slave holds every acknowledged message; ``slaveReadEnable``: slaves serve pulls meanwhile).
"""
from __future__ import annotations

import json
import time
import uuid

import pytest

from conftest import running_cluster
from fault_helpers.queries import wait_alive
from fault_helpers.sinks import body_streams, rows_stream, sink_bodies, topic_bodies
from rmq_source.remote import RemotingClient
from rmq_source.remote import requests as rq
from rmq_source.remote.frames import loads_fastjson
from rocketmq_cluster import free_port, send_numbered

pytestmark = [pytest.mark.broker, pytest.mark.spark]

QUEUES, BEFORE, AFTER, NODES = 4, 100, 40, 3
DELETE_SUBSCRIPTIONGROUP = 207   # RocketMQ's request codes
GET_BROKER_HA_STATUS = 907


@pytest.fixture(scope="module")
def controlled(rocketmq_jars, tmp_path_factory):
    """A NameServer with the controller and broker-c's three brokers, one of them elected."""
    peer = free_port()
    controller = {"enableControllerInNamesrv": "true", "controllerDLegerGroup": "rmqtest",
                  "controllerDLegerPeers": f"n0-127.0.0.1:{peer}", "controllerDLegerSelfId": "n0",
                  "controllerStorePath": tmp_path_factory.mktemp("controller-store"),
                  "enableElectUncleanMaster": "false", "notifyBrokerRoleChanged": "true"}
    with running_cluster(rocketmq_jars, "5.3", tmp_path_factory, "controller", broker_names=(),
                         namesrv_extra=controller) as cluster:
        extra = {"brokerId": -1, "brokerRole": "SLAVE", "enableControllerMode": "true",
                 "controllerAddr": f"127.0.0.1:{peer}", "allAckInSyncStateSet": "true",
                 "slaveReadEnable": "true", "syncBrokerMetadataPeriod": 1000,
                 "checkSyncStateSetPeriod": 1000, "syncControllerMetadataPeriod": 2000}
        nodes = [cluster._broker("broker-c", broker_id=n, extra=extra) for n in range(1, NODES + 1)]
        for node in nodes:
            node.launch()
            cluster.started.append(node)
        for node in nodes:
            node.wait_boot()
        _wait_nodes(cluster, lambda ids: 0 in ids and len(ids) == NODES, "broker-c never had a master and two slaves")
        yield cluster


def _nodes(cluster) -> dict[int, str]:
    with RemotingClient(timeout=5) as client:
        return rq.cluster_info(client, cluster.namesrv_addr).nodes("broker-c")


def _wait_nodes(cluster, ok, what: str, timeout: float = 120) -> dict[int, str]:
    deadline = time.monotonic() + timeout
    while not ok(nodes := _nodes(cluster)):
        assert time.monotonic() < deadline, f"{what}: {nodes}\n{cluster.log_tails()}"
        time.sleep(0.2)
    return nodes


def _wait_in_sync(master, timeout: float = 120) -> None:
    """Until every slave of broker-c is in ``master``'s sync state set (GET_BROKER_HA_STATUS, what
    ``mqadmin haStatus`` shows): the controller elects only among them
    (``enableElectUncleanMaster=false``), and a slave lagging on a loaded machine leaves the set."""
    deadline = time.monotonic() + timeout
    with RemotingClient(timeout=5) as client:
        while True:
            info = loads_fastjson(client.invoke(master.addr, GET_BROKER_HA_STATUS, {}).body)
            if info.get("inSyncSlaveNums") == NODES - 1:
                return
            assert time.monotonic() < deadline, f"broker-c's slaves never all in sync: {info}"
            time.sleep(0.2)


def _master(cluster):
    addr = _nodes(cluster)[0]
    return next(b for b in cluster.brokers.values() if b.addr == addr)


def test_an_elected_master_takes_over_under_group_queries_and_a_sink_stream(controlled, spark, tmp_path):
    """SIGKILL broker-c's master under an ordered and an unordered group query (reading at most
    20 messages a second, so each has messages left) and a sink stream: the controller elects a
    slave (the pause, from the kill until the NameServers route the new master, is printed),
    the queries go on, every message exactly once in each read sink, every row of the sink stream
    in its topic, and both groups' offsets on the new master at the queues' ends."""
    cluster = controlled
    old = _master(cluster)
    topic, sink_topic = f"Ctl_{uuid.uuid4().hex[:8]}", f"CtlSink_{uuid.uuid4().hex[:8]}"
    rows_dir = tmp_path / "rows"
    rows_dir.mkdir()
    with RemotingClient(timeout=15) as client:
        for t in (topic, sink_topic):
            # on every node: a slave copies topic configs from its master only every few seconds
            for node in cluster.brokers.values():
                rq.create_topic(client, node.addr, t, read_queues=QUEUES)
            cluster.create_topic(client, t, QUEUES, broker=next(k for k, b in cluster.brokers.items() if b is old))
        before = {b for q in range(QUEUES) for b in send_numbered(client, old.addr, topic, q, 0, BEFORE)}
    rows = set()

    def write_rows(name: str, count: int) -> None:
        batch = [f"{name}-{i}" for i in range(count)]
        (rows_dir / f"{name}.json").write_text("".join(json.dumps({"body": r}) + "\n" for r in batch))
        rows.update(batch)

    write_rows("before", 50)
    groups = {"ordered": f"CtlOrdered_{uuid.uuid4().hex[:6]}", "unordered": f"CtlUnordered_{uuid.uuid4().hex[:6]}"}
    streams = body_streams(spark, tmp_path, cluster.namesrv_addr, topic, {
        kind: {"consumerGroup": group, "maxMessagesPerTrigger": "20", "groupStatePath": str(tmp_path / f"state-{kind}"),
               **({"orderly": "false"} if kind == "unordered" else {})} for kind, group in groups.items()})
    sink_stream = rows_stream(spark, rows_dir, cluster.namesrv_addr, sink_topic, tmp_path / "chk-sink")
    queries = [q for q, _ in streams.values()] + [sink_stream]
    try:
        for kind, (q, sink) in streams.items():
            wait_alive(queries, f"{kind}: no first batch", lambda: sink_bodies(sink), 180)
        read_before = {kind: len(sink_bodies(sink)) for kind, (q, sink) in streams.items()}
        assert _nodes(cluster)[0] == old.addr, "the master changed before the kill"
        _forget_groups_on_slaves(cluster, old, groups.values())
        _wait_in_sync(old)
        killed_at = time.monotonic()
        old.kill()                                                   # SIGKILL the master
        assert all(n < len(before) for n in read_before.values()), read_before
        write_rows("during", 50)
        nodes = _wait_nodes(cluster, lambda ids: ids.get(0) not in (None, old.addr), "no master was elected")
        pause = time.monotonic() - killed_at
        print(f"controller mode: a new master ({nodes[0]}) routed {pause:.1f} s after the kill")
        new = _master(cluster)
        with RemotingClient(timeout=15) as client:
            after = {b for q in range(QUEUES) for b in send_numbered(client, new.addr, topic, q, BEFORE, AFTER)}
            write_rows("after", 50)
            for kind, (q, sink) in streams.items():
                wait_alive(queries, f"{kind}: not every message arrived after the election",
                           lambda: set(sink_bodies(sink)) >= before | after, 240)
                got = sink_bodies(sink)
                assert len(got) == len(set(got)) == len(before | after), f"{kind}: read twice"
            wait_alive(queries, "the sink stream did not deliver every row",
                       lambda: rows <= topic_bodies(spark, cluster.namesrv_addr, sink_topic), 240)
            ends = {q: BEFORE + AFTER for q in range(QUEUES)}
            for kind, group in groups.items():
                wait_alive(queries, f"{kind}: the group's offsets on the new master never reached the ends",
                           lambda: {q: rq.query_consumer_offset(client, new.addr, group, topic, q)
                                    for q in ends} == ends, 180)
    finally:
        for q in queries:
            q.stop()


def _forget_groups_on_slaves(cluster, master, groups) -> None:
    """The slaves forget the groups (made on the master by the queries' heartbeats), as a slave
    elected before its next config sync (every 10 s) has not heard of them: the elected one
    refuses the queries' commits ("Group ... not exist") until their heartbeats make the group
    there. (A retry topic it lacks is left out of planning meanwhile: test_master_away.py; these
    brokers cannot delete a topic, their timer store being off.)"""
    with RemotingClient(timeout=15) as client:
        for node in cluster.brokers.values():
            if node is not master:
                for group in groups:
                    client.invoke(node.addr, DELETE_SUBSCRIPTIONGROUP, {"groupName": group, "cleanOffset": "false"})
