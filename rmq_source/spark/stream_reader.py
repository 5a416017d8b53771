"""The streaming reader (``spark.readStream.format("rmq")``).

Offsets are ``{"topic": {"broker": {"queueId": next_offset}}}`` (see :mod:`rmq_source.spark.offsets`).
A micro-batch reads ``[start, end)`` of the queues it plans to read.

Group progress (with ``consumerGroup``) is written only for batches Spark has committed, so a failed
or retried batch never moves the group. Spark plans a new batch only after the batch ending at
``start`` is in the checkpoint's commit log, so :meth:`RmqStreamReader.latestOffset` records
``start`` as the group's progress (for the queues that batch read). This also records the last batch
of a ``Trigger.AvailableNow`` run (PySpark 4.2+; before, Spark runs it as one batch and asks
nothing after it: :mod:`rmq_source.spark.compat`). After a processing-time query stops, the group may trail the
checkpoint by its last batch; the same query resumes from its checkpoint regardless.

With ``consumerGroup`` the query is a member of its group (:mod:`rmq_source.group.session`): it reads
only the queues allocated to it among the group's live queries, and with ``orderly=true`` only those
whose lock it holds.
"""
from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING

import numpy as np

from rmq_source.spark.compat import (ReadAllAvailable, ReadLimit, ReadMaxBytes, ReadMaxRows, ReadMinRows,
                                    StreamReaderBase)

from rmq_source.group.allocation import (AllocateMessageQueueAveragely, AskedOnce, MessageQueue, UserStrategy,
                                        sort_queues)
from rmq_source.errors import (RmqAllocationError, RmqAuthError, RmqBrokerUnavailableError, RmqLockError,
                               RmqRemotingConnectionError, RmqRemotingError, RmqRemotingTimeoutError)
from rmq_source.group.offset_store import ReadOffsetType
from rmq_source.spark.gc_pause import collector_paused
from rmq_source.spark.offsets import from_json_dict, to_json_dict
from rmq_source.backend import TaskLock
from rmq_source.spark.planner_exit import leave_cleanly_on_sigterm
from rmq_source.spark.partition_reader import build_partitions, read_partition
from rmq_source.spark.planner import QueueRange, plan_tasks, share_limit, unallocated
from rmq_source.spark.sizing import task_sizing
from rmq_source.spark.positions import check_data_loss, logged_range_start, starting_offsets
from rmq_source.spark.query import discover_queues, open_backend, open_group_store, strategy_of
from rmq_source.spark import resets

if TYPE_CHECKING:
    from rmq_source.group.session import GroupSession


log = logging.getLogger(__name__)

# Inside one query of a group, the query's queues are spread over its slots evenly; the user's
# allocateStrategy already chose which queues the query (the group member) reads.
_EVERY_SLOT = AllocateMessageQueueAveragely()


_SIZE_SAMPLE = 1024          # units read per queue to estimate a large backlog's bytes
_MIN_RECORD_SIZE = 91        # the smallest CommitLog record (format doc §3.2)


class RmqStreamReader(StreamReaderBase):
    """Micro-batches over the queues of the query, with admission control and group commits.

    Spark's calls reach :meth:`plan_latest` and :meth:`plan_partitions` through
    :class:`rmq_source.spark.compat.StreamReaderBase`, which fits them to the PySpark in use."""

    def __init__(self, opts):
        self.opts = opts
        self.warn_unsupported_trigger_options()
        self.backend = open_backend(opts)
        self.strategy = strategy_of(opts)
        self._batch_strategy = self.strategy   # the strategy as asked for the batch being planned
        self.group_store = open_group_store(opts, self.backend)
        self._target: dict[MessageQueue, int] | None = None  # Trigger.AvailableNow end
        self._last_batch_at = time.monotonic()
        self._committed: dict[MessageQueue, int] | None = None
        self._fresh = False  # set by initialOffset: the next batch is the new query's first
        self._initial: dict | None = None
        self._session: GroupSession | None = None
        self._stopping = False                # stop() has begun
        self._wait_reason: str | None = None   # last reason a group AvailableNow run waited for
        self._lost_reported: dict[MessageQueue, int] = {}  # per queue: lost offsets reported up to
        self._waits_for_master: set[MessageQueue] = set()   # queues only a slave answers for
        self._away: set[str] = set()       # brokers whose queues wait (not answering)
        self._unsaved: dict[MessageQueue, int] = {}  # group commits their broker did not take yet
        #: per queue, the last group commit its keeper took: (offset, ms since the epoch)
        self._taken: dict[MessageQueue, tuple[int, int]] = {}
        self._declined: dict[MessageQueue, int] = {}   # commits ignored for a pending reset
        self._offset_bytes: dict[str, float] = {}   # topic -> bytes per offset (task sizing)
        #: the max offsets the last planning saw, for the reportLatestOffset that follows it
        self._seen_max: dict[MessageQueue, int] | None = None

    @property
    def session(self) -> GroupSession | None:
        """The query's membership in its group, joined on first use (not in every process that
        merely instantiates the reader)."""
        if self._session is None and self.group_store is not None:
            self._session = self.backend.group_session(self.opts, self.strategy, self.group_store)
            self._session.start()
            # Spark ends this process with SIGTERM when the query stops: leave the group first
            leave_cleanly_on_sigterm(lambda: self._stopping)
        return self._session

    # -- offsets -----------------------------------------------------------------------------
    def _queues(self, known=()) -> list[MessageQueue]:
        """The queues of the query's topics, with its group's retry queues (live mode, a
        subscription by topic; a pattern may match them too), plus ``known`` ones gone from the
        route."""
        found = discover_queues(self.backend, self.opts)
        if self.opts.consumer_group and self.opts.assign is None:
            found = found + self.backend.retry_queues(self.opts.consumer_group)
        have = set(found)
        extra = [mq for mq in known if mq not in have]
        return sort_queues(have.union(extra) if extra or len(have) != len(found) else found)

    def initialOffset(self) -> dict:
        """Where a new query starts. Computed once per reader: Spark asks again when it runs the
        first batch, and the answer must be the start that batch was planned from."""
        if self._initial is None:
            # A position forced by options wins over the group's progress in the first batch.
            self._fresh = (self.opts.starting_timestamp is not None
                           or self.opts.starting_offsets != "group")
            infos = self._reachable_infos(self._queues())
            mqs = sort_queues(infos)   # a queue of a broker away is picked up as new when it is back
            starts = starting_offsets(self.backend, mqs, self.opts, self.group_store, infos)
            self._initial = to_json_dict(
                {mq: check_data_loss(mq, starts[mq], infos[mq], self.opts.fail_on_data_loss)
                 for mq in mqs})
        return self._initial

    def _reachable_infos(self, mqs) -> dict:
        """:meth:`Backend.infos` of the queues whose broker answers. The queues of a broker
        that does not answer after the request retries are left out: they wait (warned once per
        absence) and are read again once it answers. A broker away longer than
        ``brokerOutageTimeoutMs`` fails the query with ``failOnDataLoss=true``; with ``false``
        its queues go on waiting."""
        infos, down = self.backend.infos_reachable(mqs)
        for broker, exc in sorted(down.items()):
            queues = sorted(mq for mq in mqs if mq.broker_name == broker)
            msg = (f"broker {broker} does not answer, so its {len(queues)} queue(s) of this query "
                   f"(e.g. {queues[0]}) cannot be read: {exc}")
            if self.opts.fail_on_data_loss and (away := self._outage_over(broker)):
                raise RmqBrokerUnavailableError(
                    f"{msg}; {away}; set failOnDataLoss=false to let its queues "
                    "wait while the other brokers' queues are read",
                    peer=getattr(exc, "peer", None)) from exc
            if broker not in self._away:
                until = ("as long as it takes (failOnDataLoss=false)" if not self.opts.fail_on_data_loss
                         else f"for up to brokerOutageTimeoutMs ({self.opts.broker_outage_ms} ms) "
                              "in all, then the query fails (failOnDataLoss=true)")
                log.warning("%s; they wait until it answers again, %s; the other brokers' queues "
                            "go on", msg, until)
        back = self._away - set(down)
        if back:
            log.warning("broker(s) %s answer again; their queues are read from where they stopped",
                        ", ".join(sorted(back)))
        self._away = set(down)
        return infos

    def _latest(self, mqs, infos) -> dict[MessageQueue, int]:
        latest = {mq: infos[mq].max_offset for mq in mqs}
        if self._target is not None:
            # Trigger.AvailableNow: nothing written after prepareForTriggerAvailableNow is read.
            latest = {mq: min(v, self._target.get(mq, 0)) for mq, v in latest.items()}
        return latest

    def _starts_with_new_queues(self, start: dict[MessageQueue, int], mqs) -> dict[MessageQueue, int]:
        """``start`` plus queues discovered since, which begin at their current min offset."""
        starts = dict(start)
        new = [mq for mq in mqs if mq not in starts]
        if new:   # (one of a broker that does not answer is new again at the next batch)
            infos, _ = self.backend.infos_reachable(new)
            for mq, info in infos.items():
                starts[mq] = info.min_offset
        return starts

    @collector_paused()   # (per-queue objects of a planning die young: gc_pause)
    def plan_latest(self, start: dict, limit: ReadLimit) -> dict:
        """The end of the next micro-batch starting at ``start`` (Spark's ``latestOffset``): every
        queue's offset after the admission limits (``limit`` is Spark's, or the default read
        limit), the group's allocation and locks; ``start`` is the end of the batch Spark
        committed last."""
        start_map = from_json_dict(start, what="start offset")
        if isinstance(self.strategy, UserStrategy):   # asked once per batch (see AskedOnce)
            self._batch_strategy = AskedOnce(self.strategy)
        # (the group's progress of every queue looked at once for the commit and the allocation)
        with self.group_store.one_look() if self.group_store is not None else contextlib.nullcontext():
            self._commit_previous(start_map)
            starts = self._starts_with_new_queues(start_map, self._queues(start_map))
            mqs = sort_queues(starts)
            # only the query's own first batch: a restarted process asks initialOffset too (to
            # re-run the first batch) and then plans later batches, where the group's progress counts
            fresh = self._fresh and start == self._initial
            self._fresh = False
            read, end, latest = self._plan_reachable(mqs, starts, limit, fresh)
        waited_since: int | None = None
        while self.session is not None and self._target is not None and end == starts:
            # Trigger.AvailableNow and nothing to read now: done, unless the target is not reached
            # in queues the group has not read and a member that may have died still has them.
            if waited_since is None:
                waited_since = self.session.membership.now_ms()
            reason = self._available_now_wait_reason(mqs, read, end, waited_since)
            if reason is None:
                break
            self._wait_for_group(reason, waited_since)
            read, end, latest = self._plan_reachable(mqs, starts, limit, fresh)
        end_json = to_json_dict(end)
        if self.session is not None:
            self.session.record_plan(start, end_json, read, first=start == self._initial,
                                     forced=fresh, start_offsets=start_map)
            per_topic = dict.fromkeys((mq.topic for mq in read), 0)
            for mq in read:
                per_topic[mq.topic] += max(0, end[mq] - starts[mq])
            self.session.planned.add(per_topic)
            if self._target is not None and end == starts and not self._away and all(
                    latest[mq] >= self._target.get(mq, 0) for mq in read):
                # Trigger.AvailableNow is done (Spark may not stop this process promptly): give
                # the queues back to the group now. A later call would simply rejoin.
                self.session.stop()
        return end_json

    def _plan_reachable(self, mqs, starts, limit, fresh: bool):
        """:meth:`_plan` over the queues whose broker answers now: (read, end, latest). A broker
        that stops answering during the planning (after its statistics came) is found away by
        planning again (whose :meth:`_reachable_infos` decides what its absence means)."""
        tries = 0
        while True:
            infos = self._reachable_infos(mqs)
            self.backend.check_subscription(self.opts.subscription, infos)
            self._seen_max = {mq: info.max_offset for mq, info in infos.items()}
            latest = self._latest(infos, infos)
            try:
                read, end = self._plan(mqs, starts, latest, infos, limit, fresh)
                return read, end, latest
            except (RmqRemotingConnectionError, RmqRemotingTimeoutError) as exc:
                tries += 1
                if tries == 3:
                    raise
                log.warning("planning again without the broker that stopped answering: %s", exc)

    def _plan(self, mqs, starts, latest, infos, limit, fresh: bool
              ) -> tuple[set[MessageQueue], dict[MessageQueue, int]]:
        """(queues this batch reads, end offset of every queue) after allocation and the limits.
        Only queues whose broker answered (``infos``) are allocated and read: as RocketMQ's own
        clients allocate over the route, which loses a broker that is gone."""
        here = [mq for mq in mqs if mq in infos]
        if self.session is not None:
            read, moved = self.session.choose(here, starts, fresh=fresh)
        else:
            read = set(here) - unallocated(here, self._batch_strategy, "", self.opts.num_partitions,
                                           self.opts.client_id)
            moved = {}
        starts = self._skip_lost(starts, read, infos)
        backlog = {mq: max(0, latest[mq] - starts[mq]) if infos[mq].min_offset <= starts[mq] else 0
                   for mq in read}   # (below a slave's min: waits for the master)
        if not isinstance(limit, ReadAllAvailable):
            backlog = self._admit(backlog, starts)
        if any(backlog.values()):
            self._last_batch_at = time.monotonic()
        return read, {mq: moved.get(mq, starts[mq] + backlog.get(mq, 0)) for mq in mqs}

    def _available_now_wait_reason(self, mqs, read, end, since_ms: int) -> str | None:
        """Why a group's ``Trigger.AvailableNow`` run that has nothing to read now must not end
        yet, or None. Queues below the target that are neither read by this query nor past the
        target in the group's progress are left to the other members only once each of them has
        heartbeated since the wait began (a killed query stays a member until its heartbeat times
        out, and holds its locks until their lease runs out); queues allocated to this query are
        waited for until their locks are granted."""
        pending = [mq for mq in mqs if end[mq] < self._target.get(mq, 0)]
        if not pending:
            return None
        ours = [mq for mq in pending if mq in self.session.allocated and mq not in read]
        if ours:
            return (f"{len(ours)} queue(s) allocated to this query are locked by another member "
                    f"(e.g. {ours[0]})")
        silent = self.session.silent_members(since_ms)
        if silent:
            return (f"{len(pending)} queue(s) below the AvailableNow target (e.g. {pending[0]}) are "
                    f"allocated to members that have not heartbeated since: {', '.join(silent)}")
        log.info("consumer group %r: %d queue(s) below the AvailableNow target are left to the "
                 "group's live members", self.opts.consumer_group, len(pending))
        return None

    def _wait_for_group(self, reason: str, since_ms: int) -> None:
        """Sleep one poll interval, or fail once the wait is longer than any lease could explain."""
        waited = self.session.membership.now_ms() - since_ms
        bound = 3 * self.opts.lock_lease_ms
        if waited > bound:
            raise RmqLockError(
                f"consumer group {self.opts.consumer_group!r}: Trigger.AvailableNow waited {waited} ms "
                f"(more than 3 x lockLeaseMs = {bound} ms) and {reason}; the group's state in "
                f"{self.session.state_dir} may hold entries of a client that no longer exists")
        if reason != self._wait_reason:   # said once per reason, not every poll
            self._wait_reason = reason
            log.warning("consumer group %r: Trigger.AvailableNow waits (%d ms so far): %s",
                        self.opts.consumer_group, waited, reason)
        time.sleep(0.25)

    def _commit_previous(self, start_map: dict[MessageQueue, int]) -> None:
        """The batch ending at ``start`` is committed: record the group's progress for its queues,
        except those an operator reset meanwhile (:mod:`rmq_source.spark.resets`): they move to
        the reset offset in this batch, without being read. Written are the queues whose offset
        differs from what their keeper took last (moved, or not taken yet); the others' offsets
        were just compared with the keeper's (which rewrites any it lost), so a thousand idle
        queues cost no writes."""
        if self.session is None:
            return
        # (the locks of queues whose progress is written are asked; the others' trusted)
        resets_noted = self.session.reset_queues()
        held = self.session.held(verify=lambda mq: mq in resets_noted or start_map.get(mq) != (
            self._taken.get(mq, (None,))[0]))
        if held is None:  # first planning of this process: a restart, or a new query
            reads = self.session.reads_of_batch_ending_at(to_json_dict(start_map))
            forward = {mq: o for mq, o in start_map.items() if mq in reads}
            current = self.group_store.read_offsets(list(forward), ReadOffsetType.READ_FROM_STORE)
            found = resets.while_stopped(forward, current, reads)
            self._commit_group({mq: o for mq, o in forward.items()
                                if o > current.get(mq, -1) and mq not in found})
        else:
            # a queue read again later starts from another member's progress, not from ours
            self._taken = {mq: v for mq, v in self._taken.items() if mq in held}
            found, lost = resets.since_last_commit(self.group_store, self._taken, held, self._unsaved)
            self._unsaved.update(lost)
            pushed = {mq: value for mq, value in self.session.take_resets().items() if mq in held}
            # only queues that moved: the keeper still has the others' offsets (just compared)
            self._commit_group({mq: o for mq, o in start_map.items()
                                if mq in held and mq not in found and mq not in pushed
                                and self._taken.get(mq, (None,))[0] != o})
            if pushed:   # (the brokers keep the group's progress: written as a Java client would)
                self._commit_group({mq: offset for mq, (offset, _) in pushed.items()})
                found.update(pushed)
        found.update(self._declined_for_reset())
        if found:
            resets.report(self.opts.consumer_group, found, start_map)
            now_ms = int(time.time() * 1000)
            for mq, (offset, _) in found.items():
                self._taken[mq] = (offset, now_ms)
                self.session.own_progress.pop(mq, None)
            self.session.let_go(found)

    def _declined_for_reset(self) -> resets.Resets:
        """Queues whose last commit the broker ignored for an operator's reset pending there,
        with the reset offset (what the broker answers for the group now)."""
        declined, self._declined = self._declined, {}
        if not declined:
            return {}
        now = self.group_store.read_offsets(sort_queues(declined), ReadOffsetType.READ_FROM_STORE)
        return {mq: (now[mq], "a reset pending on its broker, which ignored this query's commit")
                for mq, tried in declined.items() if now.get(mq, -1) >= 0 and now[mq] != tried}

    def _skip_lost(self, starts: dict[MessageQueue, int], read, infos) -> dict[MessageQueue, int]:
        """``starts`` with each queue to read moved past offsets the store no longer has (retention,
        a re-created queue), all at once: each lost offset is reported once (or raises with
        ``failOnDataLoss``), see :func:`rmq_source.spark.positions.check_data_loss`."""
        out = dict(starts)
        if self._waits_for_master:   # (warned again if its master goes again)
            self._waits_for_master -= {mq for mq in read if infos[mq].slave is None}
        # (nothing lost where start is inside the queue: check_data_loss would answer ``start``)
        odd = [mq for mq in read if not infos[mq].min_offset <= starts[mq] <= infos[mq].max_offset]
        for mq in sort_queues(odd):
            info, start = infos[mq], starts[mq]
            if info.slave is not None:
                # only a slave answers and it cannot tell (check_data_loss): the queue waits
                if mq not in self._waits_for_master:
                    log.warning("%s: the master of broker %s is away and its slave %s holds offsets "
                                "[%d, %d), not %d: the queue waits for the master", mq,
                                mq.broker_name, info.slave, info.min_offset, info.max_offset, start)
                self._waits_for_master.add(mq)
                continue
            out[mq] = check_data_loss(mq, start, info, self.opts.fail_on_data_loss,
                                      self._lost_reported)
        return out

    def _admit(self, backlog: dict[MessageQueue, int], starts) -> dict[MessageQueue, int]:
        """Apply the option limits: min messages (bounded by maxTriggerDelay), max messages/bytes.

        Returns an entry for every queue of ``backlog``. ``Trigger.AvailableNow`` never waits for
        ``minMessagesPerTrigger``: Spark ends the run at the first batch that plans nothing.
        """
        o = self.opts
        total = sum(backlog.values())
        waits = self._target is None  # (not under Trigger.AvailableNow)
        if waits and o.min_messages_per_trigger and total < o.min_messages_per_trigger:
            waited_ms = (time.monotonic() - self._last_batch_at) * 1000
            if waited_ms < o.max_trigger_delay_ms:
                return {mq: 0 for mq in backlog}
        if o.max_messages_per_trigger:
            backlog = share_limit(backlog, o.max_messages_per_trigger)
        if o.max_bytes_per_trigger:
            backlog = self._admit_bytes(backlog, starts, o.max_bytes_per_trigger)
        return backlog

    def _admit_bytes(self, backlog: dict[MessageQueue, int], starts, limit: int
                     ) -> dict[MessageQueue, int]:
        """Whole messages within ``limit`` bytes in all, shared by byte backlog.

        Each queue first takes what fits in its share; the bytes that rounding to whole messages
        leaves go first to the queues that got nothing, then to those with the most bytes left
        (ties: queue order), so a queue whose next message is larger than its share is not passed
        over batch after batch. The total never exceeds ``limit``, except that one message is
        admitted when no queue's next message fits at all (progress past a message larger than
        the limit).
        """
        cap = limit // _MIN_RECORD_SIZE + 1          # no more units than could fit
        sizes = {mq: np.cumsum(self._unit_sizes(mq, starts[mq], min(n, max(cap, _SIZE_SAMPLE))))
                 for mq, n in backlog.items() if n > 0}
        sizes = {mq: cum for mq, cum in sizes.items() if len(cum)}  # (empty: files just deleted)
        estimate = self._byte_backlog(backlog, sizes)
        shares = share_limit(estimate, limit)
        admitted = {mq: 0 for mq in backlog}
        used = {}
        for mq, cum in sizes.items():
            admitted[mq] = self._messages_within(cum, backlog[mq], 0, shares[mq])
            used[mq] = int(cum[admitted[mq] - 1]) if admitted[mq] else 0
        left = limit - sum(used.values())
        # queues that got nothing first (a share below their next message), then most bytes left
        by_bytes_left = sorted(sizes, key=lambda mq: (admitted[mq] > 0, used[mq] - estimate[mq],
                                                      mq))
        for mq in by_bytes_left:
            more = self._messages_within(sizes[mq], backlog[mq], admitted[mq], left)
            if more:
                left -= int(sizes[mq][admitted[mq] + more - 1]) - used[mq]
                admitted[mq] += more
        if sizes and not any(admitted.values()):
            admitted[by_bytes_left[0]] = 1
        return admitted

    def _unit_sizes(self, mq: MessageQueue, start: int, count: int):
        return self.backend.unit_sizes(mq, start, start + count)

    @staticmethod
    def _byte_backlog(backlog, sizes) -> dict[MessageQueue, int]:
        """Backlog bytes per queue with something to read, used only to share the byte limit:
        exact up to the units read (``_SIZE_SAMPLE`` at least), beyond that their mean size times
        the count (reading every unit of a large backlog on every trigger costs O(backlog))."""
        out = {}
        for mq, cum in sizes.items():
            k, total = len(cum), int(cum[-1]) if len(cum) else 0
            out[mq] = total if k >= backlog[mq] else (total * backlog[mq] // k if k else 0)
        return out

    @staticmethod
    def _messages_within(cum, count: int, done: int, budget: int) -> int:
        """How many more messages, after the first ``done``, fit in ``budget`` bytes (at most
        ``count`` in all; ``cum`` = cumulative sizes of the units from the queue's start)."""
        base = int(cum[done - 1]) if done else 0
        fit = int(np.searchsorted(cum, base + budget, side="right"))
        return max(0, min(fit, count) - done)

    def getDefaultReadLimit(self) -> ReadLimit:
        o = self.opts
        if o.max_messages_per_trigger:
            return ReadMaxRows(o.max_messages_per_trigger)
        if o.max_bytes_per_trigger:
            return ReadMaxBytes(o.max_bytes_per_trigger)
        if o.min_messages_per_trigger:
            return ReadMinRows(o.min_messages_per_trigger)
        return ReadAllAvailable()

    @collector_paused()
    def reportLatestOffset(self) -> dict:
        """The queues' max offsets (a metric Spark asks right after ``latestOffset``): those the
        planning just saw, as Spark's Kafka source reports the offsets its planning fetched; asked
        of the brokers when no planning came before (brokers away left out)."""
        seen, self._seen_max = self._seen_max, None
        if seen is None:
            infos, _ = self.backend.infos_reachable(self._queues())
            seen = {mq: info.max_offset for mq, info in infos.items()}
        return to_json_dict(seen)

    def prepareForTriggerAvailableNow(self) -> None:
        """The run's target: each queue's max offset now. A queue of a broker away
        (failOnDataLoss=false) gets none: the run does not wait for it."""
        infos = self._reachable_infos(self._queues())
        self._target = {mq: info.max_offset for mq, info in infos.items()}

    # -- planning and reading ----------------------------------------------------------------
    def rate_limit_options(self) -> list[str]:
        """The rate-limit options set (``name=value``), for messages."""
        o = self.opts
        named = (("maxMessagesPerTrigger", o.max_messages_per_trigger),
                 ("maxBytesPerTrigger", o.max_bytes_per_trigger),
                 ("minMessagesPerTrigger", o.min_messages_per_trigger))
        return [f"{name}={value}" for name, value in named if value]

    @collector_paused()
    def plan_partitions(self, start: dict, end: dict):
        """The tasks of the micro-batch ``[start, end)`` (Spark's ``partitions``)."""
        ends = from_json_dict(end, what="end offset")
        starts = from_json_dict(start, what="start offset")
        if self.session is not None:
            plan = self.session.find_plan(start, end)
            if plan is None:
                raise RmqLockError(
                    f"consumer group {self.opts.consumer_group!r}: no plan recorded for the batch "
                    f"{start} -> {end} in {self.session.plans_path}; the group's state folder was "
                    "removed or is not shared by this query")
            # A first batch re-run after a restart reads from the start it was planned from (Spark
            # recomputes initialOffset, and the group may have moved since).
            start, planned, first, past = plan
            starts = from_json_dict(start, what="recorded start offset")
            planned = self.session.resume_batch(start, end, planned, first, past)
            ends = {mq: o for mq, o in ends.items() if mq in planned}
        # queues the batch does not move need no broker (one that is away may be among them)
        ends = {mq: o for mq, o in ends.items() if o != starts.get(mq)}
        infos = self._logged_batch_infos(list(ends), start, end)
        ranges = []
        for mq in sort_queues(ends):
            stop = ends[mq]
            begin = starts.get(mq)
            if begin is not None and infos[mq].min_offset <= begin <= stop:
                ranges.append(QueueRange(mq, begin, stop))   # (what logged_range_start answers)
                continue
            if mq in starts:
                first = logged_range_start(mq, starts[mq], stop, infos[mq],
                                           self.opts.fail_on_data_loss, self._lost_reported)
            else:  # a queue discovered in this batch starts at its min offset: nothing was lost
                first = min(infos[mq].min_offset, stop)
            ranges.append(QueueRange(mq, first, max(first, stop)))
        # The group's strategy allocated queues among queries; inside the query every slot may read.
        strategy = self._batch_strategy if self.session is None else _EVERY_SLOT
        tasks = plan_tasks(ranges, strategy, self.opts.consumer_group or "",
                           self.opts.num_partitions, self.opts.orderly, self.opts.min_partitions,
                           self.opts.client_id,
                           task_sizing(self.opts, self.backend, ranges, self._offset_bytes))
        unread = {r.mq for r in ranges if r.size} - {r.mq for t in tasks for r in t.ranges}
        if unread:   # the batch's offsets move past them: leaving them out would lose messages
            raise RmqAllocationError(
                f"allocateStrategy {getattr(strategy, 'name', strategy)} gives no task the queues "
                f"{', '.join(map(str, sorted(unread)))}, which the batch {start} -> {end} reads; a "
                "strategy must answer the same for the same arguments")
        lock = None
        if self.session is not None and self.opts.orderly:
            lock = TaskLock(self.opts.consumer_group, self.opts.client_id, self.opts.client_lock_lease_ms,
                            self.session.locked_at_ms)
        return build_partitions(tasks, self.opts, self.backend, lock)

    def _outage_over(self, broker: str) -> str | None:
        """How long ``broker`` has been away, said for an error, once that is longer than
        ``brokerOutageTimeoutMs``; None while it may still come back."""
        away_s = self.backend.away_for(broker) or 0.0
        if away_s < self.opts.broker_outage_ms / 1000:
            return None
        return (f"it has been away {away_s:.0f} s, longer than brokerOutageTimeoutMs "
                f"({self.opts.broker_outage_ms})")

    def _logged_batch_infos(self, mqs: list[MessageQueue], start: dict, end: dict) -> dict:
        """:meth:`Backend.infos` of the queues a batch in the checkpoint reads. It must read
        exactly them (skipping its messages would lose them), so a broker that does not answer is
        waited for until it has been away ``brokerOutageTimeoutMs``; then the batch fails with
        RmqBrokerUnavailableError. The other queries' and brokers' work goes on meanwhile, this
        query's next batch waits for this one."""
        infos, down = self.backend.infos_reachable(mqs)
        warned: set[str] = set()
        while down:
            for broker, exc in sorted(down.items()):
                what = (f"broker {broker} does not answer and the batch {start} -> {end} (in the "
                        f"checkpoint) reads its queues")
                if away := self._outage_over(broker):
                    raise RmqBrokerUnavailableError(
                        f"{what}: {away}; the batch cannot be read until the broker is back (its "
                        f"offsets are logged, skipping its messages would lose them): {exc}",
                        peer=getattr(exc, "peer", None)) from exc
                if broker not in warned:
                    warned.add(broker)
                    log.warning("%s; the batch waits for it, up to brokerOutageTimeoutMs (%d ms) of "
                                "its absence: %s", what, self.opts.broker_outage_ms, exc)
            time.sleep(1.0)
            more, down = self.backend.infos_reachable([mq for mq in mqs if mq not in infos])
            infos.update(more)
        return infos

    def read(self, partition):
        return read_partition(partition)

    def __getstate__(self) -> dict:
        # Spark pickles the reader to ship ``read`` to executors; reading needs nothing of the
        # driver's state (threads, locks, the group session), only the partition.
        return {"opts": self.opts}

    def __setstate__(self, state: dict) -> None:
        self.opts = state["opts"]
        self._session = None
        self._offset_bytes = {}
        self.group_store = None

    def commit(self, end: dict) -> None:
        """Spark committed the batch ending at ``end``.

        Nothing to do here: :meth:`latestOffset` records the progress of every committed batch
        (it knows which queues the batch read; this call does not).
        """

    def _commit_group(self, offsets: dict[MessageQueue, int]) -> None:
        """Write ``offsets`` as the group's progress, each broker (or store file) on its own
        (brokers side by side). The entries of a broker that does not answer are kept and written
        again at every later commit until it takes them (as RocketMQ's clients persist their
        memory table): its queues wait meanwhile, so nothing newer can pass them. Whether the
        query may go on without the broker is :meth:`_reachable_infos`'s to say. Other refusals
        fail the query with ``failOnDataLoss=true``."""
        if self.group_store is None:
            return
        if offsets == self._committed and not self._unsaved:
            return
        offsets = {**self._unsaved, **offsets}
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq, offset in offsets.items():
            self.group_store.update_offset(mq, offset, increase_only=False)
            by_broker.setdefault(mq.broker_name, []).append(mq)

        def write(_broker, mqs):
            try:
                return self.group_store.persist(mqs), int(time.time() * 1000), None
            except RmqAuthError:
                raise
            except RmqRemotingError as exc:
                return set(), 0, exc

        unsaved = {}
        for broker, (declined, now_ms, exc) in sorted(self.backend.each_broker(write, by_broker).items()):
            mqs = by_broker[broker]
            if exc is None:
                self._declined.update({mq: offsets[mq] for mq in declined})
                self._taken.update({mq: (offsets[mq], now_ms) for mq in mqs if mq not in declined})
            else:
                away = isinstance(exc, (RmqRemotingConnectionError, RmqRemotingTimeoutError))
                if self.opts.fail_on_data_loss and not away:
                    raise exc
                log.warning("consumer group %r: broker %s did not take the progress of %d queue(s) "
                            "(kept, written again at the next batch): %s", self.opts.consumer_group,
                            broker, len(mqs), exc)
                unsaved.update({mq: offsets[mq] for mq in mqs})
        self._unsaved = unsaved
        self._committed = dict(offsets)
        if self._session is not None:
            self._session.own_progress.update(offsets)

    def stop(self) -> None:
        """Clean stop: release this query's queue locks and leave the group."""
        self._stopping = True     # (first: a SIGTERM from now on waits for the stop, planner_exit)
        if self._session is not None:
            self._session.stop()
