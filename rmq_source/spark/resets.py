"""How a group query finds and takes an operator's reset of its group's progress.

Operators move a group's progress with RocketMQ's tools (``mqadmin resetOffsetByTime``, the
Dashboard's reset and skip) or ``rmq-store reset-offset``. A query of the group follows such a
reset as RocketMQ's Java consumers do: its next micro-batch moves the queue's Spark offset to the
reset offset without reading it, and the batch after reads on from there (a rewind reads again,
a skip leaves out what the operator skipped); the query never writes its own progress over the
reset. How a reset reaches the query:

* a RocketMQ 4.x broker (or a 5.x broker with ``useServerSideResetOffset=false``) sends the
  group's online members RESET_CONSUMER_CLIENT_OFFSET and changes nothing itself: the query notes
  it (:meth:`GroupSession.note_reset`) and writes it as the group's progress;
* a 5.x broker keeps the reset and ignores commits until a pull of the group meets it: a commit it
  declines (:data:`rmq_source.remote.requests.RESET_PENDING_REMARK`) is a reset;
* any tool that writes the progress itself (our CLI, mqadmin when no member is online, a 5.x
  reset once a pull met it): the group's progress differs from what the query committed last, and
  its keeper has not restarted since (a restarted broker loses commits it had not flushed; that
  is not a reset, the query writes its own progress again);
* while the query was stopped: its restart finds the group's progress behind the start of the last
  batch it committed (a query that died before recording that batch's progress finds exactly that
  start there instead).
"""
from __future__ import annotations

import logging

from rmq_source.errors import RmqRemotingConnectionError, RmqRemotingTimeoutError
from rmq_source.group.allocation import MessageQueue
from rmq_source.group.offset_store import ReadOffsetType

log = logging.getLogger(__name__)

#: {queue: (reset offset, how it was found)}
Resets = dict[MessageQueue, tuple[int, str]]


def since_last_commit(store, taken: dict[MessageQueue, tuple[int, int]], held,
                      unsaved) -> tuple[Resets, dict[MessageQueue, int]]:
    """The queues of ``held`` whose group progress in ``store`` is not what this query's keeper
    took last (``taken``: {queue: (offset, ms)}); queues in ``unsaved`` are not compared (their
    keeper has not taken the last commit). Returns (resets, queues whose keeper lost this query's
    commit, with the offset to write again)."""
    known = [mq for mq in held if mq in taken and mq not in unsaved]
    by_broker: dict[str, list[MessageQueue]] = {}
    for mq in known:
        by_broker.setdefault(mq.broker_name, []).append(mq)
    sure: dict[str, bool] = {}
    away: set[str] = set()
    for broker, queues in sorted(by_broker.items()):
        try:
            # a commit of 0 is still there (0, not none) unless the keeper may have lost it
            at_zero = [taken[mq][1] for mq in queues if taken[mq][0] == 0]
            sure[broker] = bool(at_zero) and not store.may_have_lost(broker, min(at_zero))
        except (RmqRemotingConnectionError, RmqRemotingTimeoutError):
            away.add(broker)

    def zero_will_do(mq: MessageQueue) -> bool:
        return sure[mq.broker_name] and taken[mq][0] == 0

    # (every broker in one question: they are asked side by side)
    now = store.read_offsets([mq for mq in known if mq.broker_name not in away],
                             ReadOffsetType.READ_FROM_STORE, zero_will_do=zero_will_do, away=away)
    # a broker away: compared once it answers (the planning decides what its absence means)
    known = [mq for mq in known if mq.broker_name not in away]
    found: Resets = {}
    lost: dict[MessageQueue, int] = {}
    asked: dict[tuple[str, int], bool] = {}
    for mq in known:
        value = now.get(mq, -1)
        mine, at_ms = taken[mq]
        if value == mine:
            continue
        key = (mq.broker_name, at_ms)
        if value < mine and value >= 0 and key not in asked:
            asked[key] = store.may_have_lost(*key)      # (a request: once per broker and commit)
        if value < 0 or (value < mine and asked[key]):
            lost[mq] = mine          # a restarted keeper: written again, as the Java client does
            continue
        found[mq] = (value, f"the group's progress changed from {mine}, committed by this query")
    if lost:
        log.warning("consumer group %r: broker(s) %s restarted or failed over and lost this query's "
                    "last commit of %d queue(s) (e.g. %s back at %d instead of %d); written again",
                    store.group, ", ".join(sorted({mq.broker_name for mq in lost})), len(lost),
                    min(lost), now.get(min(lost), -1), lost[min(lost)])
    return found, lost


def while_stopped(forward: dict[MessageQueue, int], current: dict[MessageQueue, int],
                  reads: dict[MessageQueue, int | None]) -> Resets:
    """At a restart: the queues the last committed batch read (ending at ``forward``) whose group
    progress (``current``) is behind that end and is not the batch's start ``reads`` (where a
    query that died before recording the batch leaves it): reset while the query was stopped."""
    out: Resets = {}
    for mq, end in forward.items():
        value, began = current.get(mq, -1), reads.get(mq)
        if 0 <= value < end and began is not None and value != began:
            out[mq] = (value, f"the group's progress is behind the batch {began} -> {end} this "
                              "query committed last")
    return out


def report(group: str, found: Resets, starts: dict[MessageQueue, int]) -> None:
    """Say in the log what each reset does to the query (per queue: from where to where, a rewind
    reads again, a skip leaves messages out), so that the operator's action is seen."""
    for mq in sorted(found):
        offset, why = found[mq]
        start = starts.get(mq, -1)
        if offset == start:
            continue
        what = (f"reads {start - offset} message offset(s) again" if offset < start
                else f"skips {offset - start} message offset(s), as the operator chose")
        log.warning("consumer group %r: queue %s was reset to offset %d (%s); the next micro-batch "
                    "moves it there from %d and the query %s", group, mq, offset, why, start, what)
