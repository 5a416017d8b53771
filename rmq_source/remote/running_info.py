"""What a group query answers when a broker (for mqadmin, the Dashboard) asks it as a consumer.

A broker forwards the operators' questions to a member over the member's own connection, as
requests from the server (RocketMQ's ``ClientRemotingProcessor`` answers them in the Java client):

* GET_CONSUMER_RUNNING_INFO (307, ``mqadmin consumerStatus``): a ``ConsumerRunningInfo`` body
  in fastjson's form (maps keyed by a MessageQueue object, as the Java client writes them):
  properties (the query's options and start time), the subscription of every topic, and per queue
  the group offset this query committed last and whether it holds the broker's lock (ordered
  queries), and per topic the messages a second of the micro-batches it planned in the last
  minute as its consume and pull TPS;
* GET_CONSUMER_STATUS_FROM_CLIENT (221): the offsets this query committed of a topic;
* CONSUME_MESSAGE_DIRECTLY (309): refused (a query reads in micro-batches), the remark says why;
* NOTIFY_CONSUMER_IDS_CHANGED (40, oneway): nothing to do, a query asks the members at every
  planning;
* RESET_CONSUMER_CLIENT_OFFSET (220, oneway; ``mqadmin resetOffsetByTime`` on a 4.x broker): the
  reset offsets are handed to the session, whose next planning applies them
  (:mod:`rmq_source.spark.resets`).

A question about another group is answered as the Java client does ("not exist in this consumer").
"""
from __future__ import annotations

import json
import logging
import os
import time

from rmq_source import __version__
from rmq_source.group.allocation import MessageQueue
from rmq_source.remote.frames import RemotingCommand, loads_fastjson

log = logging.getLogger(__name__)

NOTIFY_CONSUMER_IDS_CHANGED = 40
RESET_CONSUMER_CLIENT_OFFSET = 220
GET_CONSUMER_STATUS_FROM_CLIENT = 221
GET_CONSUMER_RUNNING_INFO = 307
CONSUME_MESSAGE_DIRECTLY = 309
SUCCESS, SYSTEM_ERROR = 0, 1

_COMPACT = (",", ":")


def _json(value) -> str:
    return json.dumps(value, separators=_COMPACT, ensure_ascii=False)


def _mq_key(mq) -> str:
    """A MessageQueue as fastjson writes it as a map key: an object, fields in name order."""
    return _json({"brokerName": mq.broker_name, "queueId": mq.queue_id, "topic": mq.topic})


def _mq_map(values: dict) -> str:
    return "{" + ",".join(f"{_mq_key(mq)}:{_json(v)}" for mq, v in sorted(values.items())) + "}"


class MemberAnswers:
    """The answers of the group query of ``session`` (a GroupSession over brokers) with options
    ``opts``; :meth:`serve` is the member connections' ``on_request``."""

    def __init__(self, session, opts):
        self.session = session
        self.opts = opts
        self.started_ms = int(time.time() * 1000)

    def serve(self, cmd: RemotingCommand) -> RemotingCommand | None:
        fields = cmd.ext_fields or {}
        if cmd.code == NOTIFY_CONSUMER_IDS_CHANGED:
            log.debug("consumer group %r: the broker says its members changed (asked again at "
                      "the next planning)", fields.get("consumerGroup"))
            return None
        if cmd.code == RESET_CONSUMER_CLIENT_OFFSET:
            self._note_reset(cmd)
            return None
        if cmd.code not in (GET_CONSUMER_RUNNING_INFO, GET_CONSUMER_STATUS_FROM_CLIENT,
                            CONSUME_MESSAGE_DIRECTLY):
            return None                                  # answered "not supported"
        group = fields.get("consumerGroup") or fields.get("group")
        if group != self.opts.consumer_group:
            return RemotingCommand(SYSTEM_ERROR, remark=f"The Consumer Group <{group}> not exist "
                                                        "in this consumer")
        if cmd.code == CONSUME_MESSAGE_DIRECTLY:
            return RemotingCommand(SYSTEM_ERROR, remark=(
                f"consumer group {group}: client {self.opts.client_id} is a Spark query "
                "(rmq_source), which reads in micro-batches and has no listener to hand one "
                "message to; read the message with a batch query (spark.read.format('rmq') "
                "with startingOffsets) instead"))
        if cmd.code == GET_CONSUMER_STATUS_FROM_CLIENT:
            topic = fields.get("topic")
            table = {mq: off for mq, off in self._committed().items() if mq.topic == topic}
            body = '{"consumerTable":{},"messageQueueTable":' + _mq_map(table) + "}"
            return RemotingCommand(SUCCESS, body=body.encode())
        return RemotingCommand(SUCCESS, body=self.running_info().encode())

    def _note_reset(self, cmd: RemotingCommand) -> None:
        """Hand a reset of this group to the session (a broker sends it oneway: no answer)."""
        fields = cmd.ext_fields or {}
        if fields.get("group") != self.opts.consumer_group:
            return
        try:
            table = loads_fastjson(bytes(cmd.body))["offsetTable"]
            offsets = {MessageQueue(dict(k)["topic"], dict(k)["brokerName"], int(dict(k)["queueId"])):
                       int(v) for k, v in table.items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            log.error("consumer group %r: a reset of topic %r from a broker could not be read "
                      "(%s): %r", self.opts.consumer_group, fields.get("topic"), exc,
                      bytes(cmd.body[:300]))
            return
        stamp = fields.get("timestamp", "?")
        log.warning("consumer group %r: a broker passed on an operator's reset of topic %r to the "
                    "messages stored from %s (ms since the epoch; -1: the end) for %d queue(s)",
                    self.opts.consumer_group, fields.get("topic"), stamp, len(offsets))
        self.session.note_reset(offsets, f"RESET_CONSUMER_CLIENT_OFFSET, timestamp {stamp}")

    def _committed(self) -> dict:
        return dict(self.session.own_progress)

    def running_info(self) -> str:
        """The ConsumerRunningInfo of this query now (fastjson's text)."""
        opts, session = self.opts, self.session
        committed = self._committed()
        # (what the lock renewer keeps: asking the brokers from here would block their reader)
        held = set(session.held_now()) if session.orderly else set()
        queues = set(getattr(session, "allocated", set()) or ()) | set(committed) | held
        locked_at = int(getattr(session, "locked_at_ms", 0) or 0)
        table = {mq: {
            "cachedMsgCount": 0, "cachedMsgMaxOffset": 0, "cachedMsgMinOffset": 0,
            "cachedMsgSizeInMiB": 0, "commitOffset": committed.get(mq, -1), "droped": False,
            "lastConsumeTimestamp": 0, "lastLockTimestamp": locked_at if mq in held else 0,
            "lastPullTimestamp": 0, "locked": mq in held, "transactionMsgCount": 0,
            "transactionMsgMaxOffset": 0, "transactionMsgMinOffset": 0, "tryUnlockTimes": 0,
        } for mq in queues}
        properties = {
            "PROP_NAMESERVER_ADDR": ";".join(opts.namesrv_addrs or ()),
            "PROP_CONSUME_TYPE": "CONSUME_ACTIVELY",       # as its heartbeats say (a pull consumer)
            "PROP_CONSUMEORDERLY": str(bool(session.orderly)).lower(),
            "PROP_THREADPOOL_CORE_SIZE": "-1",
            "PROP_CLIENT_VERSION": f"rmq_source {__version__} (Spark query, Python)",
            "PROP_CONSUMER_START_TIMESTAMP": str(self.started_ms),
            "clientId": opts.client_id, "allocateMessageQueueStrategy": opts.allocate_strategy,
            "consumeFromWhere": opts.consume_from_where, "pid": str(os.getpid()),
        }
        if os.environ.get("SPARK_APPLICATION_ID"):
            properties["sparkApplicationId"] = os.environ["SPARK_APPLICATION_ID"]
        sub = opts.subscription
        topics = sorted({mq.topic for mq in queues} | set(opts.topics or ()))
        # (the group's retry topic is read whole, as the Java client subscribes to it)
        subscriptions = [{
            "classFilterMode": False, "codeSet": [], "expressionType": sub.expression_type,
            "subString": sub.expression, "subVersion": self.started_ms,
            "tagsSet": sorted(sub.tags) if sub.tag_filter else [], "topic": topic,
        } if not topic.startswith("%RETRY%") else {
            "classFilterMode": False, "codeSet": [], "expressionType": "TAG", "subString": "*",
            "subVersion": self.started_ms, "tagsSet": [], "topic": topic,
        } for topic in topics]
        meter = getattr(session, "planned", None)
        tps = meter.per_second() if meter is not None else {}
        # (a query's rows are consumed by its micro-batches: both TPS are their messages a second)
        status = {topic: {"consumeFailedMsgs": 0, "consumeFailedTPS": 0.0,
                          "consumeOKTPS": round(tps.get(topic, 0.0), 2), "consumeRT": 0.0,
                          "pullRT": 0.0, "pullTPS": round(tps.get(topic, 0.0), 2)}
                  for topic in topics}
        return ("{" + f'"mqPopTable":{{}},"mqTable":{_mq_map(table)},'
                f'"properties":{_json(properties)},"statusTable":{_json(status)},'
                f'"subscriptionSet":{_json(subscriptions)},"userConsumerInfo":{{}}' + "}")
