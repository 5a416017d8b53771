"""rmq_source.remote against real NameServers and brokers (4.9.x and 5.3.x)."""
from __future__ import annotations

import time
import uuid
import zlib

import pytest

from rmq_source.errors import RmqBrokerError
from rmq_source.remote import Connection, RemotingClient
from rmq_source.remote import frames
from rmq_source.remote import requests as rq
from rmq_source.remote.stats_table import read_stats_table

pytestmark = pytest.mark.broker


@pytest.fixture
def client():
    with RemotingClient(timeout=10.0) as c:
        yield c


def new_topic(rocketmq, client, queues=2) -> str:
    topic = f"T_{uuid.uuid4().hex[:10]}"
    broker = rocketmq.brokers["broker-a"].addr
    rq.create_topic(client, broker, topic, read_queues=queues)
    deadline = time.monotonic() + 30
    while True:
        try:
            route = rq.topic_route(client, rocketmq.namesrv_addr, topic)
            if route.queue_datas:
                return topic
        except RmqBrokerError as exc:
            assert exc.code == rq.TOPIC_NOT_EXIST, exc
        assert time.monotonic() < deadline, "topic never appeared in the route"
        time.sleep(0.2)


def test_cluster_info_and_route(rocketmq, client):
    # cluster info keeps fastjson's unquoted integer keys ({0:"addr"}) in both versions
    raw = client.invoke(rocketmq.namesrv_addr, rq.GET_BROKER_CLUSTER_INFO).body
    assert b'"brokerAddrs":{0:"' in raw
    info = rq.cluster_info(client, rocketmq.namesrv_addr)
    broker = rocketmq.brokers["broker-a"]
    assert info.master_addr("broker-a") == broker.addr
    assert info.clusters["DefaultCluster"] == ["broker-a"]
    topic = new_topic(rocketmq, client, queues=3)
    route = rq.topic_route(client, rocketmq.namesrv_addr, topic)
    assert route.master_addrs() == {"broker-a": broker.addr}
    assert route.write_queues() == {"broker-a": 3}
    with pytest.raises(RmqBrokerError) as err:
        rq.topic_route(client, rocketmq.namesrv_addr, "NoSuchTopic_" + uuid.uuid4().hex[:6])
    assert err.value.code == rq.TOPIC_NOT_EXIST
    assert rocketmq.namesrv_addr in str(err.value) and "GET_ROUTEINFO_BY_TOPIC" in str(err.value)


def test_binary_header_requests(rocketmq, client):
    # 4.9.x answers in the request's serialize type (binary here); 5.3.x in its own (JSON)
    with Connection(rocketmq.namesrv_addr, serialize_type=frames.SERIALIZE_ROCKETMQ) as conn:
        answer = conn.invoke(rq.GET_BROKER_CLUSTER_INFO, timeout=10)
    assert answer.code == 0
    assert answer.serialize_type == (frames.SERIALIZE_ROCKETMQ if rocketmq.version.startswith("4.")
                                     else frames.SERIALIZE_JSON)
    with RemotingClient(serialize_type=frames.SERIALIZE_ROCKETMQ) as binary:
        info = rq.cluster_info(binary, rocketmq.namesrv_addr)
        assert info.master_addr("broker-a") == rocketmq.brokers["broker-a"].addr
        topic = new_topic(rocketmq, client)
        addr = rocketmq.brokers["broker-a"].addr
        assert rq.max_offset(binary, addr, topic, 0) == 0


def test_send_pull_offsets(rocketmq, client):
    addr = rocketmq.brokers["broker-a"].addr
    topic = new_topic(rocketmq, client)
    before = int(time.time() * 1000)
    sent = []
    for i in range(5):
        r = rq.send_message(client, addr, topic, f"body-{i}".encode(), queue_id=1, tags="TagA" if i % 2 else "TagB",
                            keys=[f"k{i}", "common"], properties={"color": "red", "n": str(i)})
        assert (r.queue_id, r.queue_offset) == (1, i)
        sent.append(r)
    big = b"x" * 10000
    rz = rq.send_message(client, addr, topic, big, queue_id=1, compress=True, tags="Z")
    batch = rq.send_batch(client, addr, topic, [{"body": f"b{i}".encode(), "tags": "Bt", "keys": f"bk{i}",
                                                  "properties": {"i": str(i)}} for i in range(4)], queue_id=1)
    assert batch.queue_offset == 6
    # the send answer can come before the ConsumeQueue dispatch (seen on 5.3.3 under load)
    assert rq.wait_max_offset(client, addr, topic, 1, 10) == 10
    assert rq.min_offset(client, addr, topic, 1) == 0
    assert rq.max_offset(client, addr, topic, 0) == 0
    assert rq.offset_by_timestamp(client, addr, topic, 1, before - 60000) == 0

    result = rq.pull(client, addr, "g_" + topic, topic, 1, 0, max_nums=32)
    assert result.found and result.next_begin_offset == 10 and result.max_offset == 10
    recs = result.records()
    assert [r.queue_offset for r in recs] == list(range(10))
    for i, rec in enumerate(recs[:5]):
        assert rec.topic == topic and rec.queue_id == 1
        assert rec.body == f"body-{i}".encode()
        assert rec.properties["TAGS"] == ("TagA" if i % 2 else "TagB")
        assert rec.properties["KEYS"] == f"k{i} common"
        assert rec.properties["color"] == "red" and rec.properties["n"] == str(i)
        assert rec.properties["UNIQ_KEY"] == sent[i].uniq_keys[0]
        from rmq_source.store.record_codec import offset_msg_id
        assert offset_msg_id(rec.store_host, rec.physical_offset) == sent[i].offset_msg_id
    assert recs[5].sys_flag & 1 and zlib.decompress(recs[5].body) == big
    assert recs[5].properties["UNIQ_KEY"] == rz.uniq_keys[0]
    for i, rec in enumerate(recs[6:]):
        assert rec.body == f"b{i}".encode() and rec.properties["KEYS"] == f"bk{i}"
        assert rec.properties["i"] == str(i) and rec.properties["UNIQ_KEY"] == batch.uniq_keys[i]

    # tag filter (hash on the broker), from an offset, and at the end
    tagged = rq.pull(client, addr, "g_" + topic, topic, 1, 0, subscription="TagA")
    assert [r.queue_offset for r in tagged.records()] == [1, 3]
    assert [r.queue_offset for r in rq.pull(client, addr, "g2", topic, 1, 7).records()] == [7, 8, 9]
    end = rq.pull(client, addr, "g_" + topic, topic, 1, 10)
    assert end.code in (rq.PULL_NOT_FOUND, rq.PULL_OFFSET_MOVED) and not end.found
    assert end.next_begin_offset == 10
    assert rq.pull(client, addr, "g_" + topic, topic, 1, 50).next_begin_offset == 10
    # long polling: the answer comes when a message arrives, well before the suspend timeout
    t0 = time.monotonic()
    import threading
    sender = threading.Timer(0.5, lambda: rq.send_message(client, addr, topic, b"late", queue_id=1))
    sender.start()
    held = rq.pull(client, addr, "g_" + topic, topic, 1, 10, suspend_ms=8000)
    sender.join(15)            # its answer may come after the pull's: the client must stay open
    assert held.found and [r.body for r in held.records()] == [b"late"]
    assert time.monotonic() - t0 < 7


def test_consumer_offsets_heartbeat_locks(rocketmq, client):
    addr = rocketmq.brokers["broker-a"].addr
    topic = new_topic(rocketmq, client)
    group = "cg_" + topic
    # 4.9.x has no setZeroIfNotFound: a new group on a queue whose first message is still in memory
    # (never swapped out) gets 0; 5.x answers QUERY_NOT_FOUND when asked not to invent 0.
    expected_new = 0 if rocketmq.version.startswith("4.") else None
    assert rq.query_consumer_offset(client, addr, group, topic, 0) == expected_new
    cid_a, cid_b = "127.0.0.1@a-" + topic, "127.0.0.1@b-" + topic
    # 5.x refuses UPDATE_CONSUMER_OFFSET (26, group not exist) for a group the broker has not seen;
    # a heartbeat (or a pull) auto-creates it.
    rq.heartbeat(client, addr, cid_a, consumer_groups={group: [topic]})
    rq.update_consumer_offset(client, addr, group, topic, 0, 7)
    assert rq.query_consumer_offset(client, addr, group, topic, 0) == 7
    with RemotingClient() as other:
        rq.heartbeat(other, addr, cid_b, consumer_groups={group: [topic]})
        assert sorted(rq.consumer_list(client, addr, group)) == sorted([cid_a, cid_b])
        queues = [(topic, "broker-a", 0), (topic, "broker-a", 1)]
        assert rq.lock_batch(client, addr, group, cid_a, queues) == set(queues)
        assert rq.lock_batch(other, addr, group, cid_b, queues) == set()
        rq.unlock_batch(client, addr, group, cid_a, queues[:1])
        assert rq.lock_batch(other, addr, group, cid_b, queues) == {queues[0]}


def test_broker_error_names_request_and_peer(rocketmq, client):
    addr = rocketmq.brokers["broker-a"].addr
    with pytest.raises(RmqBrokerError) as err:
        client.invoke(addr, 99999)
    assert err.value.code != 0 and addr in str(err.value)
    # the connection still works after an error answer
    assert rq.cluster_info(client, rocketmq.namesrv_addr).master_addr("broker-a") == addr


def test_consume_stats_answer_every_queue_in_one_request_and_zero_for_none(rocketmq, client, monkeypatch):
    """GET_CONSUME_STATS gives the group's offset of every queue of a topic in one answer (0 for
    offset 0 and for none alike), read by the fast path as the full parser reads it; the offset
    store asks one by one only the queues where 0 and none differ for the caller."""
    from rmq_source.group.allocation import MessageQueue
    from rmq_source.group.offset_store import ReadOffsetType
    from rmq_source.remote import fastjson
    from rmq_source.remote.backend import ClusterBackendSpec
    addr = rocketmq.brokers["broker-a"].addr
    topic = new_topic(rocketmq, client, queues=12)
    group = "cg_" + topic
    for q in range(12):
        rq.send_message(client, addr, topic, b"m", queue_id=q)
    rq.heartbeat(client, addr, "127.0.0.1@stats-" + topic, consumer_groups={group: [topic]})
    committed = {q: 1 for q in range(4)} | {q: 0 for q in range(4, 7)}     # 7-11: none
    for q, offset in committed.items():
        rq.update_consumer_offset(client, addr, group, topic, q, offset)

    assert rq.consume_stats(client, addr, group, topic) == {q: committed.get(q, 0) for q in range(12)}
    for code, fields in [(rq.GET_CONSUME_STATS, {"consumerGroup": group, "topic": topic}),
                         (rq.GET_TOPIC_STATS_INFO, {"topic": topic})]:
        body = client.invoke(addr, code, fields).body
        fast = fastjson.keyed_by_objects(body, "offsetTable")
        assert fast is not None and len(fast) == 12, (body[:120], body[-120:])
        full = fastjson.loads(body)["offsetTable"]
        assert {dict(k)["queueId"]: v for k, v in full.items()} == {k["queueId"]: v for k, v in fast}
        # the C reader reads the real answers of both lines (every field fastjson wrote)
        names = tuple(sorted({f for v in full.values() for f in v if type(v[f]) is int}))
        qids, columns = read_stats_table(body, topic, names)
        assert dict(zip(qids, zip(*columns))) == {
            dict(k)["queueId"]: tuple(v.get(f, 0) for f in names) for k, v in full.items()}

    asked = []
    real = rq.query_consumer_offset_call
    monkeypatch.setattr(rq, "query_consumer_offset_call",
                        lambda *a, **kw: asked.append(a[4]) or real(*a, **kw))
    backend = ClusterBackendSpec((rocketmq.namesrv_addr,), 10.0).open()
    try:
        store = backend.offset_store(group)
        mqs = backend.queues_for_topics([topic])      # (routed, as a planning has)
        assert mqs == [MessageQueue(topic, "broker-a", q) for q in range(12)]
        got = store.read_offsets(mqs, ReadOffsetType.READ_FROM_STORE, zero_will_do=lambda mq: mq.queue_id >= 7)
        assert sorted(asked) == [4, 5, 6]          # the zeros that may not stand for none
        assert got == {mq: committed.get(mq.queue_id, 0) for mq in mqs}
        # (a 0 that may be none is not kept in memory)
        assert store.read_offsets(mqs[7:], ReadOffsetType.READ_FROM_MEMORY) == {mq: -1 for mq in mqs[7:]}
        # one look per planning: one GET_CONSUME_STATS, the store's own commits laid over it
        looks = []
        stats = rq.consume_stats
        monkeypatch.setattr(rq, "consume_stats", lambda *a, **kw: looks.append(a[3]) or stats(*a, **kw))
        every = lambda mq: True     # noqa: E731
        with store.one_look():
            assert store.read_offsets(mqs, ReadOffsetType.READ_FROM_STORE, every)[mqs[0]] == 1
            store.update_offset(mqs[0], 5)
            assert store.persist([mqs[0]]) == set()
            assert store.read_offsets(mqs, ReadOffsetType.READ_FROM_STORE, every)[mqs[0]] == 5
        assert looks == [topic]
        assert store.read_offsets(mqs[:2], ReadOffsetType.READ_FROM_STORE, every) == {mqs[0]: 5, mqs[1]: 1}
        assert looks == [topic, topic]             # (outside it, each question asks)
        committed[0] = 5
        asked.clear()
        exact = store.read_offsets(mqs, ReadOffsetType.READ_FROM_STORE)
        assert sorted(asked) == list(range(12))
        # (4.9 answers 0 for no offset on a queue whose first message is in memory)
        none = 0 if rocketmq.version.startswith("4.") else -1
        assert exact == {mq: committed.get(mq.queue_id, none) for mq in mqs}
    finally:
        backend.client.close()
