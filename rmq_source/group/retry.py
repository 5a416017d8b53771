"""A consumer group's retry topic, as RocketMQ names and treats it.

A Java push consumer (clustering) sends a message its listener fails back to the broker
(CONSUMER_SEND_MSG_BACK); after the retry delay the broker stores it in ``%RETRY%<group>``
(``MixAll.getRetryTopic``), with the original topic in the ``RETRY_TOPIC`` property. Every
clustering member of the group subscribes that topic with ``*`` and rebalances its queues over
the group's whole consumer list, so a query of the group is given retry queues like any other
and must read them (docs/semantics.md "Consumer groups with Java consumers").
"""
from __future__ import annotations

RETRY_PREFIX = "%RETRY%"


def retry_topic(group: str) -> str:
    """The retry topic of consumer group ``group``."""
    return RETRY_PREFIX + group


def is_retry_topic(topic: str) -> bool:
    return topic.startswith(RETRY_PREFIX)
