"""Pub traces of what a sink task sent (option ``enableMsgTrace``), as RocketMQ's producers with
message traces on record theirs (rmq_source/remote/traces.py has the format and the sending).

Every message a broker stored (SEND_OK; or a flush/slave status the write accepts, recorded as
not successful, as RocketMQ's producers record a send status other than SEND_OK) gets one Pub
context: the producer group and topic (without the namespace, as RocketMQ's clients write them),
its id (``UNIQ_KEY``), tags, keys, the broker's address, body length, the request's cost, its type
(3 for delayed messages, else 0), its offset message id from the broker's answer, and success. A
Java producer's batch send records one context for the whole batch (its ids joined by commas);
this one a context per message, so ``mqadmin queryMsgTraceById`` finds each. The broker's answer
may turn traces off (``TRACE_ON=false``, its ``traceOn`` setting) and names its region
(``MSG_REGION``). Contexts of a failed task are dropped with it (its rows are sent again).
"""
from __future__ import annotations

import time
from typing import Callable

from rmq_source.errors import RmqOptionError, RmqRemotingError, RmqUnknownTopicError
from rmq_source.namespace import unwrap
from rmq_source.remote import requests as rq
from rmq_source.remote.frames import RemotingCommand
from rmq_source.remote.traces import REGION, TraceSender, pub_contexts, trace_producer_group
from rmq_source.sink.options import SinkOptions
from rmq_source.sink.routing import publish_queues


def check_trace_topic(route_of: Callable[[str], rq.TopicRoute], opts: SinkOptions) -> None:
    """enableMsgTrace: the trace topic must have a writable queue (checked when a write starts)."""
    topic = opts.trace_topic
    try:
        queues = publish_queues(topic, route_of(topic))
    except RmqUnknownTopicError:
        raise RmqOptionError(
            f"option enableMsgTrace=true: the trace topic {topic!r} (option customizedTraceTopic) "
            f"does not exist in the cluster of NameServer {';'.join(opts.namesrv_addrs)}; create it, "
            "or start the brokers with traceTopicEnable=true (which creates RMQ_SYS_TRACE_TOPIC)"
        ) from None
    if not queues:
        raise RmqOptionError(f"option enableMsgTrace=true: the trace topic {topic!r} has no "
                             "writable queue with a master")


class PublishTraces:
    """The Pub traces of one task: :meth:`sent` for each request a broker stored, then
    :meth:`close` (or :meth:`abandon` when the task failed). ``route_of(topic)`` is the
    producer's route lookup."""

    def __init__(self, opts: SinkOptions, client, route_of: Callable[[str], rq.TopicRoute]):
        self.opts, self.client = opts, client
        self.group = unwrap(opts.namespace, opts.producer_group)
        self._masters: dict[str, str] = {}
        topic = opts.trace_topic

        def queues():
            route = route_of(topic)
            self._masters = route.master_addrs()
            return [(q.broker, q.queue_id) for q in publish_queues(topic, route)]

        def send(broker, queue_id, body, props):
            addr = self._masters.get(broker)
            if addr is None:
                raise RmqRemotingError(f"broker {broker} of trace topic {topic!r} has no master")
            return rq.send_one_call(client, addr, topic, body, props, queue_id=queue_id,
                                    born_ms=int(time.time() * 1000),
                                    producer_group=trace_producer_group(self.group),
                                    broker_name=broker, binary_header=True)

        self.sender = TraceSender(topic, self.group, client, queues, send)

    def sent(self, topic: str, encoded: bytes, count: int, answer: RemotingCommand, store_host: str,
             sent_ms: int, cost_ms: int) -> None:
        """Records the ``count`` messages of ``encoded`` (a SEND_BATCH_MESSAGE body) that
        ``store_host`` stored, as its ``answer`` says."""
        ext = answer.ext_fields
        if ext.get("TRACE_ON") == "false":
            return
        self.sender.add(pub_contexts(
            encoded, count, ext.get("msgId", ""), group=self.group,
            topic=unwrap(self.opts.namespace, topic), store_host=store_host,
            region=ext.get("MSG_REGION") or REGION, sent_ms=sent_ms, cost_ms=cost_ms,
            success=answer.code == 0))

    def close(self) -> None:
        self.sender.close()

    def abandon(self) -> None:
        self.sender.abandon()
