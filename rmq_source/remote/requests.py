"""Typed helpers for the requests rmq_source sends to NameServers and brokers.

Each takes a :class:`~rmq_source.remote.client.RemotingClient` and the server address. Error answers
raise :class:`~rmq_source.errors.RmqBrokerError` (code and remark), except where an answer code is a
normal outcome (pull: not found / offset moved; query offset: not found).

Requests about a broker's queues, offsets or messages take ``broker_name``: it travels as the ext
field ``bname`` (``n`` in SEND_BATCH_MESSAGE's V2 header), which a RocketMQ 5 Proxy forwards the
request by (it answers code 15, "Request doesn't have field bname", without it); a broker
ignores the field. The package's own callers always pass it, to brokers and Proxies alike; tests
talking to a broker directly may leave it out.
"""
from __future__ import annotations

import json
import os
import socket
import struct
import time
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, NamedTuple

from rmq_source.store import record_codec as rc
from rmq_source.errors import RmqBrokerError, RmqRemotingProtocolError
from rmq_source.remote.client import Call, RemotingClient, check
from rmq_source.remote.fastjson import keyed_by_objects
from rmq_source.remote.stats_table import read_stats_table
from rmq_source.remote.frames import SERIALIZE_ROCKETMQ, RemotingCommand, loads_fastjson

# request codes
SEND_MESSAGE = 10
PULL_MESSAGE = 11
QUERY_CONSUMER_OFFSET = 14
UPDATE_CONSUMER_OFFSET = 15
UPDATE_AND_CREATE_TOPIC = 17
GET_BROKER_RUNTIME_INFO = 28
SEARCH_OFFSET_BY_TIMESTAMP = 29
GET_MAX_OFFSET = 30
GET_MIN_OFFSET = 31
HEART_BEAT = 34
UNREGISTER_CLIENT = 35
GET_CONSUMER_LIST_BY_GROUP = 38
LOCK_BATCH_MQ = 41
UNLOCK_BATCH_MQ = 42
GET_ROUTEINFO_BY_TOPIC = 105
GET_BROKER_CLUSTER_INFO = 106
GET_TOPIC_STATS_INFO = 202
GET_CONSUME_STATS = 208
GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
SEND_BATCH_MESSAGE = 320

# answer codes
SUCCESS = 0
SYSTEM_ERROR = 1
SYSTEM_BUSY = 2
REQUEST_CODE_NOT_SUPPORTED = 3
TOPIC_NOT_EXIST = 17
SUBSCRIPTION_GROUP_NOT_EXIST = 26
PULL_NOT_FOUND = 19
PULL_RETRY_IMMEDIATELY = 20
PULL_OFFSET_MOVED = 21
QUERY_NOT_FOUND = 22

# PullSysFlag
PULL_COMMIT_OFFSET = 0x1
PULL_SUSPEND = 0x2
PULL_SUBSCRIPTION = 0x4

DEFAULT_TOPIC = "TBW102"


def _json(body: bytes, what: str, peer: str):
    try:
        return loads_fastjson(body) if body else {}
    except ValueError as exc:
        raise RmqRemotingProtocolError(f"answer body is not JSON: {exc}", peer=peer, request=what) from None


def _dumps(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


#: the ext field naming the broker a Proxy forwards a request to (RpcRequestHeader's ``bname``);
#: SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE carry it as their V2 header's ``n``
BROKER_NAME_FIELD = "bname"
BROKER_NAME_FIELD_V2 = "n"


def _to_broker(fields: dict, broker_name: str | None, key: str = BROKER_NAME_FIELD) -> dict:
    """``fields`` with the broker's name for a Proxy to forward by (unchanged without one)."""
    if broker_name is not None:
        fields[key] = broker_name
    return fields


# ------------------------------------------------------------------ NameServer
@dataclass
class TopicRoute:
    queue_datas: list[dict]
    broker_datas: list[dict]
    #: "brokerName:queues;..." when the NameServer keeps an ORDER_TOPIC_CONFIG for the topic
    order_topic_conf: str | None = None

    def master_addrs(self) -> dict[str, str]:
        """brokerName -> master address (broker id 0)."""
        return {b["brokerName"]: b["brokerAddrs"]["0"] for b in self.broker_datas
                if "0" in (b.get("brokerAddrs") or {})}

    def write_queues(self) -> dict[str, int]:
        return {q["brokerName"]: int(q["writeQueueNums"]) for q in self.queue_datas}

    def nodes(self) -> dict[str, dict[int, str]]:
        """brokerName -> broker id -> address (0 is the master, the others its slaves)."""
        return {b["brokerName"]: _node_ids(b) for b in self.broker_datas}


def _node_ids(broker_data: dict) -> dict[int, str]:
    return {int(i): a for i, a in (broker_data.get("brokerAddrs") or {}).items()}


def _str_keys(obj):
    if isinstance(obj, dict):
        return {str(k): _str_keys(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_str_keys(v) for v in obj]
    return obj


def topic_route(client: RemotingClient, namesrv: str, topic: str, *, timeout: float | None = None) -> TopicRoute:
    resp = client.invoke(namesrv, GET_ROUTEINFO_BY_TOPIC, {"topic": topic, "acceptStandardJsonOnly": "true"},
                         timeout=timeout)
    data = _str_keys(_json(resp.body, f"GET_ROUTEINFO_BY_TOPIC(topic={topic})", namesrv))
    return TopicRoute(data.get("queueDatas") or [], data.get("brokerDatas") or [],
                      data.get("orderTopicConf") or None)


@dataclass
class ClusterInfo:
    brokers: dict[str, dict]          # brokerName -> {cluster, brokerName, brokerAddrs: {id: addr}}
    clusters: dict[str, list[str]]    # cluster -> broker names

    def master_addr(self, broker_name: str) -> str | None:
        return ((self.brokers.get(broker_name) or {}).get("brokerAddrs") or {}).get("0")

    def nodes(self, broker_name: str) -> dict[int, str]:
        """broker id -> address of ``broker_name`` (0 is the master)."""
        return _node_ids(self.brokers.get(broker_name) or {})


def cluster_info(client: RemotingClient, namesrv: str, *, timeout: float | None = None) -> ClusterInfo:
    resp = client.invoke(namesrv, GET_BROKER_CLUSTER_INFO, timeout=timeout)
    data = _str_keys(_json(resp.body, "GET_BROKER_CLUSTER_INFO", namesrv))
    return ClusterInfo(data.get("brokerAddrTable") or {},
                       {k: sorted(v) for k, v in (data.get("clusterAddrTable") or {}).items()})


def all_topics(client: RemotingClient, namesrv: str, *, timeout: float | None = None) -> list[str]:
    """Every topic the NameServer knows (system topics included), sorted."""
    resp = client.invoke(namesrv, GET_ALL_TOPIC_LIST_FROM_NAMESERVER, timeout=timeout)
    return sorted(_json(resp.body, "GET_ALL_TOPIC_LIST_FROM_NAMESERVER", namesrv).get("topicList") or [])


# ------------------------------------------------------------------ topics
class QueueStats(NamedTuple):
    """A queue of one broker: offsets ``[min_offset, max_offset)``; the time of its last message."""

    min_offset: int
    max_offset: int
    last_update_ms: int


def _queue_table(body: bytes, what: str, peer: str, topic: str) -> dict[int, dict]:
    """{queue id: its entry} of the ``offsetTable`` (a map keyed by MessageQueue) of a statistics
    answer about ``topic``: read by :func:`fastjson.keyed_by_objects` when it can (thousands of
    queues in milliseconds), else by the full parser; an entry of another topic is an error."""
    pairs = keyed_by_objects(body, "offsetTable") if body else []
    if pairs is None or any(k.get("topic") != topic for k, _ in pairs):
        table = _json(body, what, peer).get("offsetTable") or {}
        # fastjson writes the MessageQueue key as an object; a writer that quotes keys, as a string
        pairs = [(dict(k) if isinstance(k, tuple) else _json(str(k).encode(), what, peer), v)
                 for k, v in table.items()]
    out = {}
    for mq, value in pairs:
        if (not isinstance(mq, dict) or not isinstance(value, dict) or not isinstance(mq.get("queueId"), int)
                or mq.get("topic") != topic):
            raise RmqRemotingProtocolError(f"unexpected statistics entry {mq!r}: {value!r}",
                                           peer=peer, request=what)
        out[mq["queueId"]] = value
    return out


def _stats_columns(body: bytes, what: str, peer: str, topic: str, fields: tuple[str, ...]
                   ) -> tuple[list[int], list[list[int]]]:
    """(queue ids, a list per name of ``fields``: each queue's integer, 0 when absent) of the
    ``offsetTable`` of a statistics answer about ``topic``: read by the C core
    (:func:`rmq_source.remote.stats_table.read_stats_table`) when it is fastjson's compact form,
    else by :func:`_queue_table` (which also refuses what is wrong)."""
    fast = read_stats_table(body, topic, fields) if body else None
    if fast is not None:
        return fast
    table = _queue_table(body, what, peer, topic)
    return list(table), [[int(v.get(f, 0)) for v in table.values()] for f in fields]


def topic_stats(client: RemotingClient, broker: str, topic: str, *, timeout: float | None = None
                ) -> dict[int, QueueStats]:
    """GET_TOPIC_STATS_INFO: every queue of ``topic`` on ``broker`` in one round trip, by queue id."""
    what = f"GET_TOPIC_STATS_INFO(topic={topic})"
    resp = client.invoke(broker, GET_TOPIC_STATS_INFO, {"topic": topic}, timeout=timeout)
    qids, columns = _stats_columns(resp.body, what, broker, topic,
                                   ("minOffset", "maxOffset", "lastUpdateTimestamp"))
    return dict(zip(qids, map(QueueStats._make, zip(*columns))))


def consume_stats(client: RemotingClient, broker: str, group: str, topic: str, *,
                  timeout: float | None = None) -> dict[int, int]:
    """GET_CONSUME_STATS (what ``mqadmin consumerProgress`` asks): the group's committed offset of
    every queue of ``topic`` on ``broker`` in one round trip, by queue id. The broker answers 0
    both for offset 0 and for no offset (AdminBrokerProcessor.getConsumeStats, 4.9.7 and 5.3.3):
    only :func:`query_consumer_offset` tells them apart. A topic the broker has no config of, or
    that the group's online members do not subscribe, has no entries (a queue left out is
    unknown here, not "no offset"). An operator's reset pending on a 5.x broker is answered as
    the group's offset, as QUERY_CONSUMER_OFFSET answers it."""
    what = f"GET_CONSUME_STATS(group={group}, topic={topic})"
    resp = client.invoke(broker, GET_CONSUME_STATS, {"consumerGroup": group, "topic": topic},
                         timeout=timeout)
    qids, (offsets,) = _stats_columns(resp.body, what, broker, topic, ("consumerOffset",))
    return dict(zip(qids, offsets))


#: queues whose GET_MIN_OFFSET + GET_MAX_OFFSET are in flight at once in :func:`queue_offsets`:
#: their answers (about 200 bytes each) stay under the 64 KiB a Proxy leaves unsent on a
#: connection before it drops answers (docs/remoting.md)
OFFSETS_WINDOW = 64


def queue_offsets(client: RemotingClient, addr: str, topic: str, queue_ids: Iterable[int], *,
                  broker_name: str | None = None, timeout: float | None = None) -> dict[int, QueueStats]:
    """GET_MIN_OFFSET and GET_MAX_OFFSET of every queue of ``queue_ids``, those of
    :data:`OFFSETS_WINDOW` queues in flight at once (what RocketMQ's Java client asks per queue;
    a Proxy serves no GET_TOPIC_STATS_INFO). ``last_update_ms`` is 0: these answers do not carry
    it."""
    calls: deque = deque()                # (queue id, its GET_MIN_OFFSET, its GET_MAX_OFFSET)
    out: dict[int, QueueStats] = {}

    def take() -> None:
        qid, low, high = calls.popleft()
        try:
            out[qid] = QueueStats(int(client.answer(low).ext_fields["offset"]),
                                  int(client.answer(high).ext_fields["offset"]), 0)
        finally:
            low.cancel()
            high.cancel()
    try:
        for qid in queue_ids:
            calls.append((qid, *(client.send(addr, code, _to_broker({"topic": topic, "queueId": qid},
                                                                      broker_name), timeout=timeout)
                                 for code in (GET_MIN_OFFSET, GET_MAX_OFFSET))))
            if len(calls) >= OFFSETS_WINDOW:
                take()
        while calls:
            take()
    finally:
        for _, low, high in calls:        # (after a failure: answers nobody waits for)
            low.cancel()
            high.cancel()
    return out


def create_topic(client: RemotingClient, broker: str, topic: str, *, read_queues: int = 4,
                 write_queues: int | None = None, perm: int = 6, order: bool = False,
                 attributes: Mapping[str, str] | None = None, timeout: float | None = None) -> None:
    """UPDATE_AND_CREATE_TOPIC; ``attributes`` (5.x) as mqadmin's ``-a +key=value``, e.g.
    ``{"message.type": "DELAY"}``."""
    fields = {
        "topic": topic, "defaultTopic": DEFAULT_TOPIC, "readQueueNums": read_queues,
        "writeQueueNums": write_queues if write_queues is not None else read_queues, "perm": perm,
        "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": "true" if order else "false",
    }
    if attributes:
        fields["attributes"] = ",".join(f"+{k}={v}" for k, v in attributes.items())
    client.invoke(broker, UPDATE_AND_CREATE_TOPIC, fields, timeout=timeout)


# ------------------------------------------------------------------ send
@dataclass
class SendResult:
    offset_msg_id: str
    queue_id: int
    queue_offset: int
    uniq_keys: list[str]


_uniq = rc.UniqKeyFactory()


def _local_ip() -> bytes:
    return socket.inet_aton("127.0.0.1")


def message_properties(*, tags: str | None = None, keys: str | Iterable[str] | None = None,
                       properties: Mapping[str, str] | None = None, uniq_key: str | None = None,
                       born_ms: int) -> tuple[dict[str, str], str]:
    props = dict(properties or {})
    if tags is not None:
        props["TAGS"] = tags
    if keys is not None:
        props["KEYS"] = keys if isinstance(keys, str) else " ".join(keys)
    uniq = uniq_key or _uniq.create(_local_ip(), born_ms)
    props["UNIQ_KEY"] = uniq
    props.setdefault("WAIT", "true")
    return props, uniq


def _props_string(props: Mapping[str, str]) -> str:
    return "".join(f"{k}\x01{v}\x02" for k, v in props.items())


def send_message(client: RemotingClient, broker: str, topic: str, body: bytes, *, queue_id: int = 0,
                 tags: str | None = None, keys: str | Iterable[str] | None = None,
                 properties: Mapping[str, str] | None = None, flag: int = 0, compress: bool = False,
                 producer_group: str = "rmq_source_producer", born_timestamp: int | None = None,
                 broker_name: str | None = None, timeout: float | None = None) -> SendResult:
    """Send one message to ``queue_id`` (SEND_MESSAGE); ``compress`` zlib-compresses the body as the
    Java client does for large bodies (SYSFLAG bit 0)."""
    born = born_timestamp if born_timestamp is not None else rc.now_ms()
    props, uniq = message_properties(tags=tags, keys=keys, properties=properties, born_ms=born)
    sys_flag = 0
    if compress:
        body = zlib.compress(body, 5)
        sys_flag |= rc.FLAG_COMPRESSED
    ext = _taken(client, lambda: send_one_call(
        client, broker, topic, body, props_bytes(props), queue_id=queue_id, born_ms=born, flag=flag,
        sys_flag=sys_flag, producer_group=producer_group, broker_name=broker_name, timeout=timeout))
    return SendResult(ext.get("msgId", ""), int(ext.get("queueId", queue_id)), int(ext["queueOffset"]), [uniq])


#: a send the broker shed is sent again this many times at most, after 0.1, 0.2, 0.4 s
SHED_RETRIES = 3


def _taken(client: RemotingClient, send: Callable[[], Call]) -> dict:
    """The answer fields of the send ``send()`` makes. A broker shedding load answers SYSTEM_BUSY
    (its send queue waited too long, its page cache is busy: the message was not stored) and
    the send is made again, :data:`SHED_RETRIES` times at most, as RocketMQ's producer does; a
    broker that is still busy then raises RmqBrokerError."""
    for attempt in range(SHED_RETRIES):
        try:
            return client.answer(send()).ext_fields
        except RmqBrokerError as exc:
            if exc.code != SYSTEM_BUSY:
                raise
            time.sleep(0.1 * 2 ** attempt)
    return client.answer(send()).ext_fields


def props_bytes(props: Mapping[str, str]) -> bytes:
    """The properties as a message carries them (name \\x01 value \\x02 ...), UTF-8."""
    return _props_string(props).encode()


def encode_batch(messages: Iterable[tuple[bytes, Mapping[str, str], int]]) -> bytes:
    """The body of SEND_BATCH_MESSAGE from (body, properties, flag)."""
    return encode_batch_encoded((body, props_bytes(props), flag) for body, props, flag in messages)


_BATCH_HEAD = struct.Struct(">iiiii")


def encode_batch_encoded(messages: Iterable[tuple[bytes, bytes, int]]) -> bytes:
    """The body of SEND_BATCH_MESSAGE from (body, encoded properties, flag): per message TOTALSIZE,
    MAGIC 0, BODYCRC 0, FLAG, BODYLENGTH, body, PROPERTIESLENGTH (2 bytes), properties."""
    out = []
    for body, props, flag in messages:
        out.append(_BATCH_HEAD.pack(22 + len(body) + len(props), 0, 0, flag, len(body)))
        out.append(body)
        out.append(len(props).to_bytes(2, "big"))
        out.append(props)
    return b"".join(out)


BATCH_HEADER_PROPS = _props_string({"WAIT": "true"})


def send_batch_call(client: RemotingClient, broker: str, topic: str, encoded: bytes, *, queue_id: int,
                    born_ms: int, producer_group: str = "rmq_source_producer",
                    broker_name: str | None = None, timeout: float | None = None) -> Call:
    """SEND_BATCH_MESSAGE of an :func:`encode_batch_encoded` body, without waiting: the answer
    (:func:`send_answer`) comes through ``client.answer``."""
    return client.send(broker, SEND_BATCH_MESSAGE, _to_broker({
        "a": producer_group, "b": topic, "c": DEFAULT_TOPIC, "d": 4, "e": queue_id, "f": 0, "g": born_ms,
        "h": 0, "i": BATCH_HEADER_PROPS, "j": 0, "k": "false", "m": "true",
    }, broker_name, BROKER_NAME_FIELD_V2), encoded, timeout=timeout)


def send_one_call(client: RemotingClient, broker: str, topic: str, body: bytes, props: bytes, *,
                  queue_id: int, born_ms: int, flag: int = 0, sys_flag: int = 0,
                  producer_group: str = "rmq_source_producer", broker_name: str | None = None,
                  timeout: float | None = None, binary_header: bool = False) -> Call:
    """SEND_MESSAGE of one message with encoded properties, without waiting. ``binary_header``:
    RocketMQ's binary header form instead of JSON (large properties, as a trace message's KEYS,
    cost no escaping)."""
    return client.send(broker, SEND_MESSAGE, _to_broker({
        "producerGroup": producer_group, "topic": topic, "defaultTopic": DEFAULT_TOPIC,
        "defaultTopicQueueNums": 4, "queueId": queue_id, "sysFlag": sys_flag, "bornTimestamp": born_ms,
        "flag": flag, "properties": props.decode(), "reconsumeTimes": 0, "unitMode": "false",
        "batch": "false",
    }, broker_name), body, timeout=timeout,
        serialize_type=SERIALIZE_ROCKETMQ if binary_header else None)


def send_batch(client: RemotingClient, broker: str, topic: str, messages: Iterable[dict], *,
               queue_id: int = 0, producer_group: str = "rmq_source_producer",
               broker_name: str | None = None, timeout: float | None = None) -> SendResult:
    """Send several messages in one request (SEND_BATCH_MESSAGE). Each message is a dict with
    ``body`` and optional ``tags``, ``keys``, ``properties``, ``flag``."""
    born = rc.now_ms()
    encoded, uniqs = [], []
    for m in messages:
        props, uniq = message_properties(tags=m.get("tags"), keys=m.get("keys"),
                                         properties=m.get("properties"), born_ms=born)
        encoded.append((m["body"], props_bytes(props), int(m.get("flag", 0))))
        uniqs.append(uniq)
    body = encode_batch_encoded(encoded)
    ext = _taken(client, lambda: send_batch_call(client, broker, topic, body, queue_id=queue_id, born_ms=born,
                                                 producer_group=producer_group, broker_name=broker_name,
                                                 timeout=timeout))
    return SendResult(ext.get("msgId", ""), int(ext.get("queueId", queue_id)), int(ext["queueOffset"]), uniqs)


# ------------------------------------------------------------------ pull
@dataclass
class PullResult:
    code: int                 # 0 found, 19 not found, 20 retry immediately, 21 offset moved
    next_begin_offset: int
    min_offset: int
    max_offset: int
    suggest_broker_id: int
    body: bytes = b""
    remark: str | None = None

    @property
    def found(self) -> bool:
        return self.code == SUCCESS

    def records(self) -> list[rc.DecodedRecord]:
        """The CommitLog records of the body (as stored: bodies still compressed)."""
        return decode_records(self.body)


def decode_records(body: bytes) -> list[rc.DecodedRecord]:
    out, pos, view = [], 0, memoryview(body)
    while pos < len(body):
        rec = rc.decode_record(view, pos, where="pull body")
        if rec is None:
            break
        out.append(rec)
        pos += rec.total_size
    return out


PULL_ANSWERS = (SUCCESS, PULL_NOT_FOUND, PULL_RETRY_IMMEDIATELY, PULL_OFFSET_MOVED)


def pull(client: RemotingClient, broker: str, group: str, topic: str, queue_id: int, offset: int, *,
         max_nums: int = 32, subscription: str = "*", expression_type: str = "TAG",
         suspend_ms: int = 0, broker_name: str | None = None, timeout: float | None = None) -> PullResult:
    """One PULL_MESSAGE with the subscription in the request (no heartbeat needed)."""
    return pull_result(client, send_pull(client, broker, group, topic, queue_id, offset,
                                         max_nums=max_nums, subscription=subscription,
                                         expression_type=expression_type, suspend_ms=suspend_ms,
                                         broker_name=broker_name, timeout=timeout), offset)


def send_pull(client: RemotingClient, broker: str, group: str, topic: str, queue_id: int, offset: int, *,
              max_nums: int = 32, subscription: str = "*", expression_type: str = "TAG",
              suspend_ms: int = 0, broker_name: str | None = None, timeout: float | None = None) -> Call:
    """:func:`pull` without waiting: several pulls can be in flight on one connection;
    :func:`pull_result` waits for one."""
    if timeout is None:
        timeout = client.timeout + suspend_ms / 1000.0
    return client.send(broker, PULL_MESSAGE, pull_fields(
        group, topic, queue_id, offset, max_nums=max_nums, subscription=subscription,
        expression_type=expression_type, suspend_ms=suspend_ms, broker_name=broker_name),
        timeout=timeout)


def pull_fields(group: str, topic: str, queue_id: int, offset: int, *, max_nums: int = 32,
                subscription: str = "*", expression_type: str = "TAG", suspend_ms: int = 0,
                broker_name: str | None = None) -> dict:
    """The header fields of a PULL_MESSAGE carrying its subscription (no heartbeat needed; a
    Proxy forwards it as it is, the subscription included); the C core's pulls are made from
    them too (:func:`rmq_source.remote.native_pull.pull_template`)."""
    sys_flag = PULL_SUBSCRIPTION | (PULL_SUSPEND if suspend_ms else 0)
    return _to_broker({
        "consumerGroup": group, "topic": topic, "queueId": queue_id, "queueOffset": offset,
        "maxMsgNums": max_nums, "sysFlag": sys_flag, "commitOffset": 0,
        "suspendTimeoutMillis": suspend_ms, "subscription": subscription, "subVersion": 0,
        "expressionType": expression_type,
    }, broker_name)


def pull_result(client: RemotingClient, call: Call, offset: int) -> PullResult:
    """The answer of a :func:`send_pull` asking from ``offset``."""
    return pull_answer(client.answer(call, ok=PULL_ANSWERS), offset)


def pull_answer(resp: RemotingCommand, offset: int) -> PullResult:
    """A pull answer (one of PULL_ANSWERS) to a request asking from ``offset``."""
    ext = resp.ext_fields
    return PullResult(resp.code, int(ext.get("nextBeginOffset", offset)), int(ext.get("minOffset", 0)),
                      int(ext.get("maxOffset", 0)), int(ext.get("suggestWhichBrokerId", 0)),
                      resp.body if resp.code == SUCCESS else b"", resp.remark)


# ------------------------------------------------------------------ offsets
def max_offset(client: RemotingClient, broker: str, topic: str, queue_id: int, *,
               broker_name: str | None = None, timeout=None) -> int:
    return int(max_offset_answer(client, broker, topic, queue_id, broker_name=broker_name,
                                 timeout=timeout).ext_fields["offset"])


def max_offset_answer(client: RemotingClient, broker: str, topic: str, queue_id: int, *,
                      broker_name: str | None = None, timeout=None) -> RemotingCommand:
    """GET_MAX_OFFSET's answer itself: through a Proxy it is the broker's own (its ``version``
    is the broker's), unlike the answers the Proxy makes (routes, heartbeats)."""
    return client.invoke(broker, GET_MAX_OFFSET, _to_broker({"topic": topic, "queueId": queue_id},
                                                            broker_name), timeout=timeout)


def wait_max_offset(client: RemotingClient, broker: str, topic: str, queue_id: int, at_least: int, *,
                    timeout: float = 15.0, broker_name: str | None = None) -> int:
    """Poll GET_MAX_OFFSET until it reaches ``at_least``: a send is answered before the broker's
    ConsumeQueue dispatch catches up, so the max offset (and pulls) can lag a send's answer."""
    import time
    deadline = time.monotonic() + timeout
    while True:
        value = max_offset(client, broker, topic, queue_id, broker_name=broker_name)
        if value >= at_least or time.monotonic() >= deadline:
            return value
        time.sleep(0.05)


def min_offset(client: RemotingClient, broker: str, topic: str, queue_id: int, *,
               broker_name: str | None = None, timeout=None) -> int:
    r = client.invoke(broker, GET_MIN_OFFSET, _to_broker({"topic": topic, "queueId": queue_id}, broker_name),
                      timeout=timeout)
    return int(r.ext_fields["offset"])


def offset_by_timestamp(client: RemotingClient, broker: str, topic: str, queue_id: int, timestamp_ms: int,
                        *, broker_name: str | None = None, timeout=None) -> int:
    r = client.invoke(broker, SEARCH_OFFSET_BY_TIMESTAMP, _to_broker(
        {"topic": topic, "queueId": queue_id, "timestamp": timestamp_ms}, broker_name), timeout=timeout)
    return int(r.ext_fields["offset"])


def query_consumer_offset(client: RemotingClient, broker: str, group: str, topic: str, queue_id: int, *,
                          broker_name: str | None = None, timeout=None) -> int | None:
    """The group's committed offset, or None when the broker has none."""
    return consumer_offset_of(client, query_consumer_offset_call(
        client, broker, group, topic, queue_id, broker_name=broker_name, timeout=timeout))


def query_consumer_offset_call(client: RemotingClient, broker: str, group: str, topic: str,
                               queue_id: int, *, broker_name: str | None = None, timeout=None) -> Call:
    """:func:`query_consumer_offset` sent without waiting: :func:`consumer_offset_of` answers."""
    return client.send(broker, QUERY_CONSUMER_OFFSET, _to_broker(
        {"consumerGroup": group, "topic": topic, "queueId": queue_id, "setZeroIfNotFound": "false"},
        broker_name), timeout=timeout)


def consumer_offset_of(client: RemotingClient, call: Call) -> int | None:
    r = client.answer(call, ok=(SUCCESS, QUERY_NOT_FOUND))
    return int(r.ext_fields["offset"]) if r.code == SUCCESS else None


#: the remark of a 5.x broker that ignored a group commit: an operator's reset of the queue is
#: pending there (``ConsumerManageProcessor.updateConsumerOffset``, ``useServerSideResetOffset``)
RESET_PENDING_REMARK = "Offset has been previously reset"


def update_consumer_offset(client: RemotingClient, broker: str, group: str, topic: str, queue_id: int,
                           offset: int, *, broker_name: str | None = None, timeout=None) -> bool:
    """Commit the group's offset; False when the broker ignored it for a pending reset."""
    return offset_taken(client, update_consumer_offset_call(
        client, broker, group, topic, queue_id, offset, broker_name=broker_name, timeout=timeout))


def update_consumer_offset_call(client: RemotingClient, broker: str, group: str, topic: str,
                                queue_id: int, offset: int, *, broker_name: str | None = None,
                                timeout=None) -> Call:
    """:func:`update_consumer_offset` sent without waiting: :func:`offset_taken` answers."""
    return client.send(broker, UPDATE_CONSUMER_OFFSET, _to_broker(
        {"consumerGroup": group, "topic": topic, "queueId": queue_id, "commitOffset": offset},
        broker_name), timeout=timeout)


def update_consumer_offset_calls(client: RemotingClient, broker: str, group: str,
                                 entries: list[tuple[str, int, int]], *, broker_name: str | None = None,
                                 timeout=None) -> list[Call]:
    """:func:`update_consumer_offset_call` of each (topic, queue id, offset) of ``entries``,
    written together; :func:`offset_taken` answers each."""
    return client.send_many(broker, UPDATE_CONSUMER_OFFSET, [_to_broker(
        {"consumerGroup": group, "topic": topic, "queueId": str(queue_id), "commitOffset": str(offset)},
        broker_name) for topic, queue_id, offset in entries], timeout=timeout)


def offset_taken(client: RemotingClient, call: Call) -> bool:
    r = client.answer(call)
    return (r.remark or "") != RESET_PENDING_REMARK


def broker_boot_ms(client: RemotingClient, broker: str, *, timeout=None) -> int:
    """When the broker at ``broker`` started (its store's ``bootTimestamp``, ms since the epoch)."""
    r = client.invoke(broker, GET_BROKER_RUNTIME_INFO, {}, timeout=timeout)
    try:
        return int(loads_fastjson(r.body)["table"]["bootTimestamp"])
    except (KeyError, TypeError, ValueError):
        raise RmqRemotingProtocolError(f"GET_BROKER_RUNTIME_INFO of {broker}: no bootTimestamp "
                                       f"in {bytes(r.body[:200])!r}") from None


# ------------------------------------------------------------------ consumers
def client_id() -> str:
    return f"127.0.0.1@rmq_source-{os.getpid()}"


def heartbeat(client: RemotingClient, broker: str, client_id_: str, *, consumer_groups: Mapping[str, list[str]] = (),
              producer_groups: Iterable[str] = (), subscription: str = "*",
              expression_type: str = "TAG", consume_from_where: str = "CONSUME_FROM_LAST_OFFSET",
              timeout=None) -> None:
    """HEART_BEAT: ``consumer_groups`` maps a group to the topics it subscribes, each with the
    expression ``subscription`` (a tag expression with its tags and their Java hash codes, as the
    Java client sends, or a SQL92 selector); a group's retry topic with ``*``, as the Java
    client subscribes it (a broker keeps one subscription per topic and group, the last one
    heard: another expression there would filter the retries of the group's Java consumers)."""
    from rmq_source.group.retry import is_retry_topic
    from rmq_source.subscription import Subscription
    given = Subscription.parse(subscription, expression_type)
    every = Subscription.parse("*", "TAG")

    def data(topic: str) -> dict:
        sub = every if is_retry_topic(topic) else given
        return {"classFilterMode": False, "topic": topic, "subString": sub.expression,
                # SQL92: the selector alone, as the Java client sends it
                "tagsSet": [] if sub.is_sql else list(sub.tags),
                "codeSet": [] if sub.is_sql else list(sub.codes),
                "subVersion": 0, "expressionType": sub.expression_type}

    consumers = [{
        "groupName": g, "consumeType": "CONSUME_ACTIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": consume_from_where, "unitMode": False,
        "subscriptionDataSet": [data(t) for t in topics],
    } for g, topics in dict(consumer_groups).items()]
    body = {"clientID": client_id_, "producerDataSet": [{"groupName": g} for g in producer_groups],
            "consumerDataSet": consumers}
    client.invoke(broker, HEART_BEAT, {}, _dumps(body), timeout=timeout)


def unregister_consumer(client: RemotingClient, broker: str, client_id_: str, group: str, *,
                        timeout=None) -> None:
    """UNREGISTER_CLIENT: ``client_id_`` leaves ``group`` on ``broker`` (at once, not after the
    broker's channel expiry)."""
    client.invoke(broker, UNREGISTER_CLIENT, {"clientID": client_id_, "consumerGroup": group},
                  timeout=timeout)


def consumer_list(client: RemotingClient, broker: str, group: str, *, timeout=None) -> list[str]:
    """Client ids of the group's live consumers on ``broker`` or a Proxy (empty when it has none:
    a broker answers that with an error code and the remark "no consumer for this group", a
    5.3 Proxy with the same code and the text of the NullPointerException its lookup of the
    missing group throws, :func:`_no_member_at_proxy`)."""
    r = client.invoke(broker, GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group}, timeout=timeout,
                      ok=None)
    if r.code == SYSTEM_ERROR and ((r.remark or "").startswith("no consumer for this group")
                                   or _no_member_at_proxy(r.remark)):
        return []
    check(r, f"GET_CONSUMER_LIST_BY_GROUP(consumerGroup={group})", broker, (SUCCESS,))
    return list(_json(r.body, f"GET_CONSUMER_LIST_BY_GROUP({group})", broker).get("consumerIdList") or [])


def _no_member_at_proxy(remark: str | None) -> bool:
    """The remark of a Proxy's GET_CONSUMER_LIST_BY_GROUP for a group it has no member of: the
    NullPointerException's message, which names ``consumerGroupInfo`` on Java 15+ (helpful NPE
    messages) and is empty (``null``) before."""
    text = (remark or "").strip()
    return text in ("", "null") or "consumerGroupInfo" in text


def _mq_set(queues: Iterable[tuple[str, str, int]]) -> list[dict]:
    return [{"topic": t, "brokerName": b, "queueId": int(q)} for t, b, q in queues]


def lock_batch(client: RemotingClient, broker: str, group: str, client_id_: str,
               queues: Iterable[tuple[str, str, int]], *, timeout=None) -> set[tuple[str, str, int]]:
    """LOCK_BATCH_MQ: the (topic, brokerName, queueId) of ``queues`` now locked by ``client_id_``."""
    body = {"consumerGroup": group, "clientId": client_id_, "onlyThisBroker": True, "mqSet": _mq_set(queues)}
    r = client.invoke(broker, LOCK_BATCH_MQ, {}, _dumps(body), timeout=timeout)
    data = _json(r.body, f"LOCK_BATCH_MQ({group})", broker)
    return {(m["topic"], m["brokerName"], int(m["queueId"])) for m in data.get("lockOKMQSet") or []}


def unlock_batch(client: RemotingClient, broker: str, group: str, client_id_: str,
                 queues: Iterable[tuple[str, str, int]], *, timeout=None) -> None:
    body = {"consumerGroup": group, "clientId": client_id_, "onlyThisBroker": True, "mqSet": _mq_set(queues)}
    client.invoke(broker, UNLOCK_BATCH_MQ, {}, _dumps(body), timeout=timeout)
