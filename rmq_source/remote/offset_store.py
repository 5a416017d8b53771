"""A consumer group's offsets on the brokers, as RocketMQ's RemoteBrokerOffsetStore keeps them.

The memory table and its API are :class:`~rmq_source.group.offset_store.OffsetTable`'s; reads ask
the broker of each queue (QUERY_CONSUMER_OFFSET; a queue the broker has no offset for is "no
progress", -1, not offset 0) and :meth:`persist` writes each entry to its broker
(UPDATE_CONSUMER_OFFSET). The broker keeps them in its ``config/consumerOffset.json``, where
``mqadmin consumerProgress`` and every other client of the group see them.
"""
from __future__ import annotations

from typing import Callable, Mapping

from rmq_source.group.allocation import MessageQueue
from rmq_source.group.offset_store import OffsetTable
from rmq_source.remote import requests as rq
from rmq_source.remote.client import RemotingClient


class BrokerOffsetStore(OffsetTable):
    """Offsets of ``group`` kept by the brokers; ``broker_addr(name)`` gives a broker's master."""

    def __init__(self, client: RemotingClient, group: str, broker_addr: Callable[[str], str]):
        super().__init__(group)
        self.client = client
        self.broker_addr = broker_addr

    def __getstate__(self) -> dict:
        raise TypeError("a BrokerOffsetStore holds connections; tasks receive a BackendSpec instead")

    def __repr__(self) -> str:
        return f"BrokerOffsetStore(group={self.group!r})"

    def _fetch(self, mqs: list[MessageQueue]) -> dict[MessageQueue, int]:
        found = {}
        for mq in mqs:
            value = rq.query_consumer_offset(self.client, self.broker_addr(mq.broker_name), self.group,
                                             mq.topic, mq.queue_id)
            if value is not None and value >= 0:
                found[mq] = value
        return found

    def _write_broker(self, broker: str, entries: Mapping[MessageQueue, int]) -> None:
        addr = self.broker_addr(broker)
        for mq, offset in sorted(entries.items()):
            rq.update_consumer_offset(self.client, addr, self.group, mq.topic, mq.queue_id, offset)
