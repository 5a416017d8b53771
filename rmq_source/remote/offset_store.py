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
    """Offsets of ``group`` kept by the brokers; ``call(broker name, fn)`` runs ``fn(address of
    the broker's master)`` (with the backend's retries)."""

    def __init__(self, client: RemotingClient, group: str, call: Callable[[str, Callable], object]):
        super().__init__(group)
        self.client = client
        self.call = call

    def __getstate__(self) -> dict:
        raise TypeError("a BrokerOffsetStore holds connections; tasks receive a BackendSpec instead")

    def __repr__(self) -> str:
        return f"BrokerOffsetStore(group={self.group!r})"

    def _fetch(self, mqs: list[MessageQueue]) -> dict[MessageQueue, int]:
        found = {}
        for mq in mqs:
            value = self.call(mq.broker_name, lambda addr: rq.query_consumer_offset(
                self.client, addr, self.group, mq.topic, mq.queue_id))
            if value is not None and value >= 0:
                found[mq] = value
        return found

    def _write_broker(self, broker: str, entries: Mapping[MessageQueue, int]) -> None:
        for mq, offset in sorted(entries.items()):
            self.call(broker, lambda addr: rq.update_consumer_offset(
                self.client, addr, self.group, mq.topic, mq.queue_id, offset))
