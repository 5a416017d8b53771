"""Where a query starts and ends in each queue.

Precedence, as in Spark's Kafka source: ``startingTimestamp``/``endingTimestamp`` >
``startingOffsetsByTimestamp``/``endingOffsetsByTimestamp`` > explicit offsets JSON > ``group``
progress. Starting options only matter for a new query; a restarted
streaming query resumes from its checkpoint.

* ``earliest`` = the queue's min offset; ``latest`` = its max offset (next to be written);
  in offsets JSON -2 means earliest and -1 latest.
* A timestamp (one for all queues, or one per queue) resolves per queue to the first message
  stored at or after it (:meth:`rmq_source.backend.Backend.offset_for_timestamp`; the max offset
  when there is none, Kafka's ``startingOffsetsByTimestampStrategy=latest``), so an ending
  timestamp is exclusive.
* ``group`` reads the consumer group's progress (our offset store, else the broker's own
  ``consumerOffset.json``); queues without progress follow ``consumeFromWhere`` like RocketMQ:
  ``CONSUME_FROM_LAST_OFFSET`` -> max offset, ``CONSUME_FROM_FIRST_OFFSET`` -> min offset,
  ``CONSUME_FROM_TIMESTAMP`` -> first message stored at or after ``consumeTimestamp``.
"""
from __future__ import annotations

import logging
from typing import Mapping

from rmq_source.group.allocation import MessageQueue
from rmq_source.backend import Backend, QueueInfo
from rmq_source.errors import (RmqDataLossError, RmqMasterAwayError, RmqOptionError,
                               RmqUnknownTopicError)
from rmq_source.group.offset_store import ReadOffsetType
from rmq_source.group.retry import is_retry_topic

log = logging.getLogger(__name__)

EARLIEST, LATEST = -2, -1


def _explicit(mq: MessageQueue, value: int, info: QueueInfo) -> int:
    if value == EARLIEST:
        return info.min_offset
    if value == LATEST:
        return info.max_offset
    return value


def _json_offset(table: Mapping[MessageQueue, int], mq: MessageQueue, option: str,
                 unit: str = "offset") -> int:
    try:
        return table[mq]
    except KeyError:
        special = " (-2 = earliest, -1 = latest)" if unit == "offset" else ""
        raise RmqOptionError(
            f"option {option}: no {unit} given for {mq}; when {unit}s are given as JSON every "
            f"queue read by the query must be listed{special}") from None


def _check_listed_queues_exist(spec: Mapping[MessageQueue, int], mqs: list[MessageQueue],
                               option: str) -> None:
    """Every queue named in offsets JSON must be one the query reads (as topics and brokers are)."""
    known = set(mqs)
    for mq in sorted(spec):
        if mq not in known:
            ids = sorted(q.queue_id for q in mqs
                         if q.topic == mq.topic and q.broker_name == mq.broker_name)
            raise RmqUnknownTopicError(
                f"option {option}: queue {mq.topic}/{mq.broker_name}/{mq.queue_id} is not a queue "
                f"this query reads; topic {mq.topic!r} on broker {mq.broker_name!r} has queue ids "
                f"{ids if ids else 'none'}")


def _resolve(backend: Backend, mqs: list[MessageQueue], timestamp, spec,
             option: str, named, infos: Mapping[MessageQueue, QueueInfo] | None
             ) -> dict[MessageQueue, int]:
    """Per queue: ``timestamp`` if given (epoch ms, or ``{queue: epoch ms}`` of option
    ``<option>ByTimestamp``), else the JSON offsets ``spec``, else ``named(mq, info)``; ``infos``
    (default: asked now) are the queues' min/max offsets."""
    by_queue = f"{option}ByTimestamp"
    if isinstance(timestamp, Mapping):
        _check_listed_queues_exist(timestamp, mqs, by_queue)
    elif timestamp is None and isinstance(spec, Mapping):
        _check_listed_queues_exist(spec, mqs, option)
    if infos is None:
        infos = backend.infos(mqs)
    out: dict[MessageQueue, int] = {}
    for mq in mqs:
        if isinstance(timestamp, Mapping):
            out[mq] = backend.offset_for_timestamp(mq, _json_offset(timestamp, mq, by_queue, "timestamp"),
                                                   info=infos[mq])
        elif timestamp is not None:
            out[mq] = backend.offset_for_timestamp(mq, timestamp, info=infos[mq])
        elif isinstance(spec, Mapping):
            out[mq] = _explicit(mq, _json_offset(spec, mq, option), infos[mq])
        else:
            out[mq] = named(mq, infos[mq])
    return out


def starting_offsets(backend: Backend, mqs: list[MessageQueue], opts, group_store=None,
                     infos: Mapping[MessageQueue, QueueInfo] | None = None) -> dict[MessageQueue, int]:
    """The first offset to read in each queue for a new query (see module docstring); ``infos``
    as :meth:`Backend.infos` answered for ``mqs`` in this planning pass (default: asked now)."""
    spec = opts.starting_offsets

    def named(mq: MessageQueue, info: QueueInfo) -> int:
        if spec == "earliest":
            return info.min_offset
        if spec == "latest":
            return info.max_offset
        if spec == "group":
            return group_start(backend, mq, info, opts, group_store)
        raise RmqOptionError(f"option startingOffsets: unsupported value {spec!r}")

    return _resolve(backend, mqs, opts.starting_timestamp, spec, "startingOffsets", named, infos)


def group_start(backend: Backend, mq: MessageQueue, info: QueueInfo, opts, group_store) -> int:
    """The group's committed offset for ``mq``, else the ``consumeFromWhere`` position; a retry
    topic without progress starts at its min offset, except with ``CONSUME_FROM_TIMESTAMP`` at
    its max (RocketMQ's ``computePullFromWhere``: whatever waits there was sent back by the group
    before this member joined, except what it chose to skip by time)."""
    # Like RocketMQ's computePullFromWhere: the stored progress, not a cached one.
    committed = (group_store.read_offset(mq, ReadOffsetType.READ_FROM_STORE)
                 if group_store is not None else -1)
    if committed is not None and committed >= 0:
        return committed
    where = opts.consume_from_where
    if is_retry_topic(mq.topic):
        return info.max_offset if where == "CONSUME_FROM_TIMESTAMP" else info.min_offset
    if where == "CONSUME_FROM_FIRST_OFFSET":
        return info.min_offset
    if where == "CONSUME_FROM_TIMESTAMP":
        return backend.offset_for_timestamp(mq, opts.consume_timestamp, info=info)
    return info.max_offset


def ending_offsets(backend: Backend, mqs: list[MessageQueue], opts,
                   infos: Mapping[MessageQueue, QueueInfo] | None = None) -> dict[MessageQueue, int]:
    """The exclusive end of a batch read in each queue (``latest`` = the max offset); ``infos``
    as in :func:`starting_offsets`."""
    return _resolve(backend, mqs, opts.ending_timestamp, opts.ending_offsets, "endingOffsets",
                    lambda mq, info: info.max_offset, infos)


def check_data_loss(mq: MessageQueue, wanted: int, info: QueueInfo, fail_on_data_loss: bool,
                    reported: dict[MessageQueue, int] | None = None) -> int:
    """The offset to continue from when the store no longer has ``wanted``.

    * ``wanted`` below the queue's min offset: retention deleted ``[wanted, min)``. With
      ``failOnDataLoss`` this raises :class:`RmqDataLossError` naming the queue and the exact range;
      otherwise it warns and returns the min offset.
    * ``wanted`` above the queue's max offset: the queue (or its broker's store) was re-created or
      truncated, so the offsets no longer name the messages they named. With ``failOnDataLoss``
      this raises; otherwise it warns and returns the min offset (the earliest available message of
      the new queue). A re-created queue whose max has already passed ``wanted`` cannot be told
      from a grown one.

    ``reported`` (per queue: the offset up to which lost offsets were already reported) makes a
    caller that checks the same queue repeatedly report each lost offset once; it is updated.
    Every warning carries the lost range as ``record.rmq_lost = (mq, first, end)`` (``None`` for a
    re-created queue, whose loss cannot be counted).

    Offsets a slave answered while its master was away (``info.slave``) decide neither: a slave
    may lag its master or keep other files (RocketMQ's slaves do not check offsets either,
    ``offsetCheckInSlave=false``), so this raises :class:`RmqMasterAwayError` instead.
    """
    if info.slave is not None and not info.min_offset <= wanted <= info.max_offset:
        raise RmqMasterAwayError(
            f"{mq}: the master of broker {mq.broker_name} is away and its slave {info.slave} holds "
            f"offsets [{info.min_offset}, {info.max_offset}), not {wanted}: only the master can say "
            "whether messages from there were deleted or the queue was re-created; read it again "
            "once the master is back")
    if wanted < info.min_offset:
        first = wanted if reported is None else max(wanted, reported.get(mq, wanted))
        lost = info.min_offset - wanted
        msg = (f"{mq}: offsets [{wanted}, {info.min_offset}) ({lost} messages) were deleted by "
               "retention before they were read")
        if fail_on_data_loss:
            raise RmqDataLossError(msg + "; set failOnDataLoss=false to skip to the earliest "
                                   "available offset")
        if first < info.min_offset:
            msg = (f"{mq}: offsets [{first}, {info.min_offset}) ({info.min_offset - first} "
                   "messages) were deleted by retention before they were read")
            log.warning("%s; skipping to offset %d (failOnDataLoss=false)", msg, info.min_offset,
                        extra={"rmq_lost": (mq, first, info.min_offset)})
        if reported is not None:
            reported[mq] = max(reported.get(mq, 0), info.min_offset)
        return info.min_offset
    if wanted > info.max_offset:
        msg = (f"{mq}: offset {wanted} is beyond the queue's max offset {info.max_offset}: the "
               "queue was re-created or truncated, and messages it held from the read position on "
               "may be lost")
        if fail_on_data_loss:
            raise RmqDataLossError(msg + "; set failOnDataLoss=false to continue from its earliest "
                                   f"available offset ({info.min_offset})")
        log.warning("%s; continuing from its earliest available offset %d (failOnDataLoss=false)",
                    msg, info.min_offset, extra={"rmq_lost": None})
        if reported is not None:
            reported[mq] = info.min_offset
        return info.min_offset
    return wanted


def logged_range_start(mq: MessageQueue, start: int, end: int, info: QueueInfo,
                       fail_on_data_loss: bool, reported: dict[MessageQueue, int] | None = None
                       ) -> int:
    """The first offset to read of a planned (logged) streaming batch ``[start, end)``.

    A batch reads exactly its logged range where the store still has it: only retention since the
    planning moves the first offset (reported by :func:`check_data_loss`). ``end < start`` marks a
    batch planned on a re-created queue, which reads the new queue from its min offset to ``end``
    (the re-creation was reported when the batch was planned). A start beyond the max offset is
    not moved here: the range reads what exists, and the next planning reports the re-creation.
    """
    if end < start:
        return min(info.min_offset, end)
    if start < info.min_offset and info.slave is None:
        return check_data_loss(mq, start, info, fail_on_data_loss, reported)
    return start   # (below a slave's min: the pulls wait for the master, see ClusterBackend._pull)
