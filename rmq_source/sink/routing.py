"""Which queue a message goes to, as RocketMQ's Java producer decides it.

The *publish list* of a topic is the producer's ``TopicPublishInfo.messageQueueList``: with an
order-topic configuration on the NameServer (``orderTopicConf`` "broker:n;broker:n"), those
queues in that order; otherwise the route's queue data sorted by broker name (Java string order),
only brokers whose permission allows writes and that have a master, each with queue ids
``0 .. writeQueueNums-1``. A ``shardingKey`` picks ``list[abs(hash % len)]`` with Java's
``String.hashCode`` - RocketMQ's ``SelectMessageQueueByHash`` - so a Java producer and this sink
send one key to the same queue.
"""
from __future__ import annotations

from typing import NamedTuple

from rmq_source.errors import RmqSendError
from rmq_source.remote.requests import TopicRoute

PERM_WRITE = 0x2
MASTER_ID = "0"


class PublishQueue(NamedTuple):
    broker: str
    queue_id: int


def _java_order(name: str) -> bytes:
    return name.encode("utf-16-be", "surrogatepass")


def publish_queues(topic: str, route: TopicRoute) -> list[PublishQueue]:
    """The topic's publish list (module doc), possibly empty (no writable broker with a master)."""
    if route.order_topic_conf:
        out = []
        for item in route.order_topic_conf.split(";"):
            broker, _, count = item.partition(":")
            if not broker or not count.strip().isdigit():
                raise RmqSendError(f"topic {topic}: the NameServer's order-topic configuration "
                                   f"{route.order_topic_conf!r} is not broker:queues;...")
            out.extend(PublishQueue(broker, i) for i in range(int(count)))
        return out
    masters = {b["brokerName"] for b in route.broker_datas if MASTER_ID in (b.get("brokerAddrs") or {})}
    out = []
    for qd in sorted(route.queue_datas, key=lambda q: _java_order(q["brokerName"])):
        if int(qd.get("perm", 0)) & PERM_WRITE and qd["brokerName"] in masters:
            out.extend(PublishQueue(qd["brokerName"], i) for i in range(int(qd["writeQueueNums"])))
    return out


def java_string_hash(text: str) -> int:
    """``String.hashCode()``: over UTF-16 code units, 32-bit signed overflow."""
    h = 0
    data = text.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def hash_index(key: str, size: int) -> int:
    """``SelectMessageQueueByHash``: Java's remainder (sign of the dividend), then its absolute value."""
    h = java_string_hash(key)
    value = abs(h) % size
    return value
