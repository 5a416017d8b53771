"""Spark offsets of the rmq source, and their JSON shape.

A Spark offset is ``{"topic": {"brokerName": {"queueId": next_offset}}}`` where ``next_offset`` is
the next queue offset to read (the same meaning as a RocketMQ consumer offset). Queue ids are JSON
object keys, hence strings. Mappings keyed by :class:`MessageQueue` are used everywhere else.
"""
from __future__ import annotations

from typing import Mapping

from rmq_source.group.allocation import MessageQueue, sort_queues
from rmq_source.errors import RmqOptionError

QueueOffsets = dict[MessageQueue, int]


def to_json_dict(offsets: Mapping[MessageQueue, int]) -> dict:
    """``{mq: offset}`` -> the nested JSON-able dict, sorted by topic, broker and queue id."""
    out: dict = {}
    for mq in sort_queues(offsets):
        out.setdefault(mq.topic, {}).setdefault(mq.broker_name, {})[str(mq.queue_id)] = int(offsets[mq])
    return out


def from_json_dict(data: Mapping, *, what: str = "offset") -> QueueOffsets:
    """The nested dict (from Spark's checkpoint or a user option) -> ``{mq: offset}``."""
    if not isinstance(data, Mapping):
        raise RmqOptionError(f"{what} must be a JSON object {{topic: {{broker: {{queueId: offset}}}}}}, "
                             f"got {data!r}")
    out: QueueOffsets = {}
    for topic, brokers in data.items():
        if not isinstance(brokers, Mapping):
            raise RmqOptionError(f"{what}: topic {topic!r} must map broker names to objects")
        for broker, queues in brokers.items():
            if not isinstance(queues, Mapping):
                raise RmqOptionError(f"{what}: {topic}/{broker} must map queue ids to offsets")
            for qid, offset in queues.items():
                try:
                    queue_id = int(qid)
                except (TypeError, ValueError):
                    raise RmqOptionError(f"{what}: queue id {qid!r} of {topic}/{broker} is not an "
                                         "integer") from None
                if isinstance(offset, bool) or not isinstance(offset, int):
                    raise RmqOptionError(f"{what}: offset of {topic}/{broker}/{qid} must be an "
                                         f"integer, got {offset!r}")
                out[MessageQueue.of(topic, broker, queue_id)] = offset
    return out
