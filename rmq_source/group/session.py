"""One streaming query as a member of its consumer group: which queues it reads in each batch.

Several streaming queries with the same ``consumerGroup`` (and the same offset store folder) form the
group, like RocketMQ push consumers:

* each query is a client (``clientId``) that heartbeats into ``<state>/<group>.members.json``; the
  live clients are the ``cidAll`` of the allocation strategy, which gives each query its queues;
* with ``orderly=true`` a query reads a queue only while it holds the queue's lock
  (:mod:`rmq_source.group.locks`; renewed by a background thread), so no two queries read a queue at the
  same time; a query that stops cleanly unlocks its queues and leaves, a killed one loses them when
  its lease expires;
* a queue moves between queries only through the group's committed progress: the old owner commits
  the batch that ends its reading before it releases the queue (its next planning), and the new
  owner continues from that committed offset.

Spark offsets of a query still list every queue of the topic. For queues the query does not read,
the offset follows the group's committed progress (so when the queue comes back to this query, the
messages other queries consumed are not read again). A queue whose Spark offset differs from the
group's progress when the query acquires it is first moved to that progress in a batch that reads
nothing from it, then read from the next batch on.

Which queues a batch reads is decided in ``latestOffset`` and recorded, before Spark records the
batch, in ``<state>/<group>.plans.jsonl`` keyed by the batch's (start, end) offsets, so that a batch
re-planned after a crash reads exactly the same queues.

A restarted process (a new client id) re-runs the batch Spark logged but did not commit without a
``latestOffset`` first: :meth:`GroupSession.resume_batch` then takes the batch's queues through the
same lock rules as a running query, waiting at most for the rest of a dead holder's lease, and never
overriding a live holder (that queue is the live member's now: it reads it from the group's progress).
"""
from __future__ import annotations

import collections
import hashlib
import json
import logging
import threading
import time
from typing import Callable, NamedTuple

from rmq_source.group.allocation import MessageQueue, sort_queues
from rmq_source.errors import RmqLockError
from rmq_source.group.membership import GroupMembership
from rmq_source.group.locks import (ClientLockView, LockEntry, LockRenewer, QueueLockManager, parse_queue_key,
                                    queue_key)
from rmq_source.group.offset_store import GroupOffsetStore, ReadOffsetType
from rmq_source import nofollow
from rmq_source.group.statefile import append_jsonl, file_lock, group_state_path

log = logging.getLogger(__name__)

_PLANS_KEEP = 500
_PLANS_COMPACT_BYTES = 4 << 20  # the plans file is compacted beyond this size
_WAIT_POLL_S = 0.25             # how often a waiting query looks at the lock table again


#: the last canonical JSON texts :func:`plan_key` made: (offsets copied, text)
_TEXTS_MADE: collections.deque = collections.deque(maxlen=4)
_TEXTS_LOCK = threading.Lock()


def plan_key(start: dict, end: dict) -> str:
    """Stable key of a batch: the SHA-256 of the canonical JSON of ``[start, end]`` (sorted keys,
    no spaces), made of each side's canonical text: a batch's start is the last one's end, and a
    planning asks the same keys several times, so each side's text is kept with a copy of its
    offsets (comparing offsets is far cheaper than their canonical JSON at thousands of queues)."""
    text = f"[{_canonical(start)},{_canonical(end)}]"
    return hashlib.sha256(text.encode()).hexdigest()


def _canonical(offsets) -> str:
    with _TEXTS_LOCK:
        for made, text in _TEXTS_MADE:
            if made == offsets:
                return text
    text = json.dumps(offsets, sort_keys=True, separators=(",", ":"))
    with _TEXTS_LOCK:
        _TEXTS_MADE.appendleft((_copied(offsets), text))
    return text


def _copied(value):
    """A copy of nested dicts and lists (a caller may change its offsets after asking)."""
    if type(value) is dict:
        out = dict(value)                   # (a C-level copy; only nested containers copied again)
        for k, v in out.items():
            if type(v) is dict or type(v) is list:
                out[k] = _copied(v)
        return out
    if type(value) is list:
        return [_copied(v) for v in value]
    return value


def member_options(opts) -> dict[str, str]:
    """The options every query of a group must share (as given, so errors can quote them): the
    allocation strategy (the per-member CONFIG queues and MACHINE_ROOM rooms may differ, as in
    RocketMQ), the subscription (what is read and the tag expression) and ordered mode."""
    out = {"allocateStrategy": opts.allocate_strategy, "orderly": str(opts.orderly).lower(),
           "subExpression": opts.subscription.expression}
    if opts.nearby_inner_strategy is not None:
        out["nearbyInnerStrategy"] = opts.nearby_inner_strategy
    if opts.virtual_node_count is not None:
        out["virtualNodeCount"] = str(opts.virtual_node_count)
    if opts.topics is not None:
        out["topic"] = ",".join(opts.topics)
    if opts.topic_pattern is not None:
        out["topicPattern"] = opts.topic_pattern.pattern
    if opts.assign is not None:
        out["assign"] = json.dumps(opts.assign, sort_keys=True, separators=(",", ":"))
    return out


class Plan(NamedTuple):
    """A batch's recorded plan (:meth:`GroupSession.find_plan`)."""
    start: dict                  # the start offsets it was planned from
    read: set[MessageQueue]      # the queues it reads
    first: bool                  # a query's first batch
    #: a first batch's queues' offsets beyond which the group's progress means another member
    #: read them since (None: not recorded, older plans)
    past: dict[MessageQueue, int] | None


def _per_queue(rec: dict, field: str) -> list | None:
    """``rec[field]``: a list with one entry per queue of ``rec["read"]``, in its order; None when
    absent or not aligned with it (a plan of an older version, or a damaged one)."""
    values, read = rec.get(field), rec.get("read")
    if not isinstance(values, list) or not isinstance(read, list) or len(values) != len(read):
        return None
    return values


def _past_of(rec: dict) -> dict[MessageQueue, int] | None:
    """``rec``'s "past" offsets by queue; None when absent or not one integer per queue read
    (then the re-run is read as planned)."""
    past = _per_queue(rec, "past")
    if past is None or not all(type(o) is int for o in past):
        return None
    return {MessageQueue.of(*parse_queue_key(k)): o for k, o in zip(rec["read"], past)}


def _offset_of(offsets: dict, mq: MessageQueue) -> int | None:
    """The offset of ``mq`` in Spark offsets ``offsets`` (``{topic: {broker: {queueId: n}}}``)."""
    value = offsets.get(mq.topic, {}).get(mq.broker_name, {}).get(str(mq.queue_id))
    return value if isinstance(value, int) else None


def _plans_to_keep(lines: list[str]) -> set[int]:
    """Indexes of the plan lines :meth:`GroupSession._compact` keeps (see there)."""
    keep, size = set(), 0
    for i in range(len(lines) - 1, max(-1, len(lines) - 1 - _PLANS_KEEP), -1):
        size += len(lines[i])
        if keep and size > _PLANS_COMPACT_BYTES // 2:
            break     # (plans of thousands of queues: the newest half of the size limit)
        keep.add(i)
    last_two: dict[str, list[int]] = {}
    first: dict[str, int] = {}
    for i, line in enumerate(lines):
        try:
            rec = json.loads(line)
            client = rec["client"]
        except (ValueError, TypeError, KeyError):
            continue  # a torn line of a crashed writer
        last_two.setdefault(client, []).append(i)
        del last_two[client][:-2]
        if "start" in rec:
            first[client] = i
    for indexes in last_two.values():
        keep.update(indexes)
    keep.update(first.values())
    return keep


class RateMeter:
    """Counts per key over a sliding window (``window_s``): what a RocketMQ client reports as its
    consume TPS (``mqadmin consumerStatus``), here the messages of the micro-batches planned."""

    def __init__(self, window_s: float = 60.0):
        self.window_s = window_s
        self._events: collections.deque = collections.deque()   # (monotonic time, {key: count})
        self._mutex = threading.Lock()

    def add(self, counts: dict[str, int]) -> None:
        with self._mutex:
            self._events.append((time.monotonic(), dict(counts)))
            self._prune()

    def per_second(self) -> dict[str, float]:
        """{key: count per second over the window} (keys seen in the window, 0.0 included)."""
        with self._mutex:
            self._prune()
            out: dict[str, float] = {}
            for _, counts in self._events:
                for key, n in counts.items():
                    out[key] = out.get(key, 0.0) + n / self.window_s
            return out

    def _prune(self) -> None:
        cut = time.monotonic() - self.window_s
        while self._events and self._events[0][0] < cut:
            self._events.popleft()


class GroupSession:
    """Membership, allocation, locks and batch plans of one query in its group."""

    def __init__(self, opts, strategy, group_store: GroupOffsetStore, *, state_dir: str | None = None,
                 membership=None, locks=None, keep_own_progress: bool = False):
        """``state_dir`` holds the group's state files (default: ``opts.offset_store_path``);
        ``membership`` and ``locks`` replace the file-based membership and lock table there (a live
        cluster's brokers: :mod:`rmq_source.remote.membership`, :mod:`rmq_source.remote.locks`).

        ``keep_own_progress``: a queue this query read in its last batch and still holds, or whose
        progress this query committed last (:attr:`own_progress`, e.g. before its broker went
        away), goes on from the query's own offsets when the group's committed offset is behind
        them, as RocketMQ's clients keep their in-memory offsets: a broker killed loses the commits
        it had not yet flushed to its consumerOffset.json, and going back would read messages
        again."""
        self.opts = opts
        self.group = opts.consumer_group
        self.client_id = opts.client_id
        self.strategy = strategy
        self.group_store = group_store
        self.state_dir = state_dir or opts.offset_store_path
        self.orderly = opts.orderly
        self.keep_own_progress = keep_own_progress
        self.membership = membership if membership is not None else GroupMembership(
            self.state_dir, self.group, self.client_id, heartbeat_timeout_ms=opts.lock_lease_ms,
            options=member_options(opts))
        self.locks = locks if locks is not None else QueueLockManager(
            self.state_dir, self.group, lease_ms=opts.lock_lease_ms)
        self.view = ClientLockView(self.locks, self.client_id,
                                   client_lease_ms=opts.client_lock_lease_ms)
        self.plans_path = group_state_path(self.state_dir, self.group, "plans.jsonl")
        self._held: set[MessageQueue] = set()   # queues read in the last planned batch
        self._fresh_process = True              # nothing planned yet by this process
        self._batch_key: str | None = None      # plan_key of the batch this process planned last
        #: (queues, their keys sorted, the queues in that order) of the last plan recorded
        self._last_read: tuple[frozenset, list[str], list[MessageQueue]] | None = None
        self._progress_seen: dict[MessageQueue, int] = {}   # group progress choose() planned from
        #: (a queue without an entry there had none)
        self._compact_at = 0                    # plans file size of the next compaction (_compact)
        self.allocated: set[MessageQueue] = set()  # queues the strategy gave this query last time
        #: the group progress this process committed last, per queue (see keep_own_progress)
        self.own_progress: dict[MessageQueue, int] = {}
        self._mutex = threading.Lock()
        self._renewer: LockRenewer | None = None
        self._stopped = False
        #: when the locks of the queues read last were asked for (ms since the epoch; 0: never)
        self.locked_at_ms = 0
        #: messages of the micro-batches this query planned, per topic (operators' TPS figures)
        self.planned = RateMeter()
        #: resets an operator's tool sent this client (RESET_CONSUMER_CLIENT_OFFSET), not yet applied
        self._resets: dict[MessageQueue, tuple[int, str]] = {}

    # -- background renewal ----------------------------------------------------------------
    def held_now(self) -> list[MessageQueue]:
        with self._mutex:
            return sort_queues(self._held)

    def note_reset(self, offsets: dict[MessageQueue, int], why: str) -> None:
        """An operator reset the group's progress of ``offsets`` (a broker passed on
        ``mqadmin resetOffsetByTime``): the next planning applies it to the queues this query
        reads (:meth:`take_resets`); the group's other members get the same notice for theirs."""
        with self._mutex:
            for mq, offset in offsets.items():
                self._resets[mq] = (offset, why)

    def reset_queues(self) -> set[MessageQueue]:
        """The queues of the resets noted and not yet taken (:meth:`take_resets`)."""
        with self._mutex:
            return set(self._resets)

    def take_resets(self) -> dict[MessageQueue, tuple[int, str]]:
        """The resets noted since the last call: {queue: (offset, what sent it)}."""
        with self._mutex:
            out, self._resets = self._resets, {}
        return out

    def let_go(self, mqs) -> None:
        """Stop counting ``mqs`` as read by the last batch (their progress was reset: the next
        planning moves them to the group's progress, as it does a queue another member read)."""
        with self._mutex:
            self._held -= set(mqs)

    def _tick_membership(self, *_args) -> None:
        self.membership.heartbeat()

    def start(self) -> None:
        """Join the group and start renewing (every ``lockRenewIntervalMs``)."""
        self._stopped = False
        self.membership.heartbeat()
        if self._renewer is None:
            def on_result(requested, granted, started):
                self.view.record(requested, granted, started)
                away = self._unanswered_brokers()
                if away is not None:
                    self._drop_refused({mq for mq in requested
                                        if mq not in granted and mq.broker_name not in away})
                self._tick_membership()
            self._renewer = LockRenewer(self.locks, self.client_id, self.held_now,
                                        self.opts.lock_renew_interval_ms, acquire=False,
                                        on_result=on_result)
            self._renewer.start()

    def _unanswered_brokers(self) -> set[str] | None:
        """The brokers whose last lock request got no answer (brokers' locks only: a refusal
        there means another client holds the queue); None for the store's lock table."""
        return getattr(self.locks, "away_brokers", None)

    def _drop_refused(self, refused: set[MessageQueue]) -> None:
        """Queues of the planned batch whose broker answered that another client holds them
        (brokers only: it took them while this query's lock was lost, e.g. across a broker
        restart). They are this query's no longer: their tasks leave them out, the next planning
        does not commit them and follows the group's progress there (another member's reading)
        instead of this query's own offsets."""
        with self._mutex:
            lost = self._held & refused
            self._held -= lost
        for mq in sorted(lost):
            self.own_progress.pop(mq, None)
        if lost:
            log.warning("consumer group %r: another member holds %s now (its broker refused this "
                        "client's lock); this query leaves them, as in a rebalance", self.group,
                        ", ".join(queue_key(mq) for mq in sorted(lost)))

    def stop(self) -> None:
        """Clean stop: release the queues and leave the group."""
        if self._stopped:
            return
        self._stopped = True
        if self._renewer is not None:
            self._renewer.stop()
            self._renewer = None
        held = self.held_now()
        if held and self.orderly:
            self.view.unlock(held)
        with self._mutex:
            self._held = set()  # whatever we read before is the group's (committed) history now
        self.membership.leave()

    # -- planning --------------------------------------------------------------------------
    def choose(self, mqs: list[MessageQueue], starts: dict[MessageQueue, int], fresh: bool
               ) -> tuple[set[MessageQueue], dict[MessageQueue, int]]:
        """Which queues this batch reads, and the Spark offsets of the queues it does not read.

        ``fresh`` is true for the first batch of a new query whose starting position was forced by
        ``startingOffsets``/``startingTimestamp``: those win over the group's progress. Returns (queues to read from their start, {queue: end offset} for the
        others: the group's committed progress, or their start when the group has none).
        """
        if self._stopped:
            self.start()
        if not mqs:   # no broker of the topics answers now: nothing to allocate or lock
            with self._mutex:
                self._held = set()
                self._fresh_process = False
            self.allocated = set()
            return set(), {}
        self.membership.subscribe(mq.topic for mq in mqs)
        cid_all = self.membership.heartbeat()
        if self.client_id not in cid_all:  # our heartbeat was just written; be defensive
            cid_all = sorted(set(cid_all) | {self.client_id})
        mine = self._allocate(mqs, cid_all)
        with self._mutex:
            previous = set(self._held)
        released = previous - mine
        if released and self.orderly:
            self.view.unlock(sort_queues(released))
        asked_at = self.locks.now_ms()
        if self.orderly:   # (queues kept from the last batch: their renewals keep them)
            granted, asked_at = self.view.lock_untrusted(sort_queues(mine))
        else:
            granted = mine
        granted = {mq if type(mq) is MessageQueue else MessageQueue(*parse_queue_key(queue_key(mq)))
                   for mq in granted}
        # (a queue at offset 0 is planned alike whether the group has offset 0 or none there)
        committed = self.group_store.read_offsets(mqs, ReadOffsetType.READ_FROM_STORE,
                                                  zero_will_do=lambda mq: starts[mq] == 0)
        read: set[MessageQueue] = set()
        moved: dict[MessageQueue, int] = {}
        for mq in mqs:
            g = committed.get(mq, -1)
            # The previous batch's progress was just recorded, so for a queue this query kept reading
            # g == start; a different g means another query read it meanwhile (or a reset).
            ours = mq in previous or self.own_progress.get(mq) == starts[mq]
            continuing = (fresh or g < 0 or g == starts[mq]
                          or (self.keep_own_progress and ours and g < starts[mq]))
            if mq in granted and continuing:
                read.add(mq)
            elif g >= 0 and (mq in granted or g > starts[mq]):
                moved[mq] = g  # follow the group's progress without reading
            else:
                moved[mq] = starts[mq]
        with self._mutex:
            self._held = read
            self._fresh_process = False
        self._progress_seen = committed
        self.locked_at_ms = asked_at
        self.allocated = mine
        return read, moved

    def _allocate(self, mqs: list[MessageQueue], cid_all: list[str]) -> set[MessageQueue]:
        """This member's queues of ``mqs``: the strategy is asked topic by topic, as RocketMQ's
        clients rebalance (``rebalanceByTopic``), so a query reading several topics (or its
        group's retry topic) splits each of them with the group's Java consumers as they do."""
        by_topic: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            by_topic.setdefault(mq.topic, []).append(mq)
        mine: set[MessageQueue] = set()
        for queues in by_topic.values():
            mine.update(self.strategy.allocate(self.group, self.client_id, sort_queues(queues),
                                               cid_all))
        return mine & set(mqs)

    def resume_batch(self, start: dict, end: dict, planned: set[MessageQueue], first: bool,
                     past: dict[MessageQueue, int] | None = None) -> set[MessageQueue]:
        """The queues this process reads in batch (start, end), whose plan is ``planned``.

        A batch this process planned itself is read as planned: its locks were taken then. Any
        other batch is a re-run Spark asks for after a restart (or of a query restarted in the same
        process): with ``orderly`` the queues are locked first (:meth:`_lock_for_rerun`); a queue a
        live member holds is left out, since that member reads it from the group's progress. So is
        a queue whose group progress is now past the batch's start: another member read it from
        there after the batch was planned. A first batch's start may have been forced below the
        group's progress (``startingOffsets``): ``past`` (its :class:`Plan`'s) gives, per
        queue, the offset beyond which the group's progress means another member read it; a first
        batch recorded without it is re-run as planned. The queues read are recorded as this
        client's plan of the batch, so the next planning commits exactly them and a second crash
        re-runs the same read set.
        """
        if self._stopped:
            self.start()
        if self._batch_key == plan_key(start, end):
            return planned
        asked_at = self.locks.now_ms()
        read = self._lock_for_rerun(planned) if self.orderly else set(planned)
        self.locked_at_ms = asked_at
        if not first or past is not None:
            if past is None:
                past = {mq: o for mq in read if (o := _offset_of(start, mq)) is not None}
            kept = self._not_read_since(read, past)
            if self.orderly and read - kept:
                self.view.unlock(sort_queues(read - kept))   # theirs to read now: no need to wait
            read = kept
        with self._mutex:
            self._held = set(read)
            self._fresh_process = False
        self.record_plan(start, end, read, first=first, past=past)
        return read

    def _not_read_since(self, mqs: set[MessageQueue], past: dict[MessageQueue, int]
                        ) -> set[MessageQueue]:
        """The queues of ``mqs`` whose group progress is not beyond their offset in ``past`` (the
        others were read by another member from the group's progress meanwhile)."""
        if not mqs:
            return mqs
        committed = self.group_store.read_offsets(sort_queues(mqs), ReadOffsetType.READ_FROM_STORE)
        keep = set()
        for mq in mqs:
            since = past.get(mq, -1)
            if committed.get(mq, -1) > since >= 0:
                log.warning("consumer group %r: queue %s moved to %d in the group since this batch was "
                            "planned at %d (another member read it): the re-run leaves it out",
                            self.group, queue_key(mq), committed[mq], since)
            else:
                keep.add(mq)
        return keep

    def _lock_for_rerun(self, planned: set[MessageQueue]) -> set[MessageQueue]:
        """Lock ``planned`` for a re-run: free, own and expired entries are taken at once; for an
        entry another client holds, wait until its lease runs out (then take it over) unless the
        holder renews it meanwhile, which proves it alive: that queue is left out."""
        granted = set(self.view.lock_all(sort_queues(planned)))
        with self._mutex:
            self._held = set(granted)     # renewed by the renewer while the rest is waited for
        # the entry seen first: None when the holder unlocked meanwhile (the next round takes it)
        waiting: dict[MessageQueue, LockEntry | None] = {
            mq: self.locks.entry(mq) for mq in sort_queues(planned - granted)}
        seen = [e for e in waiting.values() if e is not None]
        # a holder that renews within a lease from now is alive (brokers show no holders: only
        # this bound tells a dead holder's lock from a live one there)
        give_up_ms = self.locks.now_ms() + self.locks.lease_ms + 2 * int(_WAIT_POLL_S * 1000)
        if waiting:
            holders = sorted({e.client_id for e in seen}) or ["another client"]
            now = self.locks.now_ms()
            wait_ms = max([e.last_update_ms + e.lease_ms - now for e in seen] or [self.locks.lease_ms])
            log.warning("consumer group %r: re-running a logged batch needs %d queue(s) locked by %s; "
                        "waiting up to %d ms for their lease to run out (a live holder keeps them): %s",
                        self.group, len(waiting), ", ".join(holders), max(0, wait_ms),
                        ", ".join(queue_key(mq) for mq in waiting))
        while waiting:
            time.sleep(_WAIT_POLL_S)
            taken = set(self.view.lock_all(sort_queues(waiting)))
            granted |= taken
            with self._mutex:
                self._held = set(granted)
            for mq in list(waiting):
                if mq in taken:
                    del waiting[mq]
                    continue
                e = self.locks.entry(mq)
                if (e != waiting[mq] and e is not None) or self.locks.now_ms() > give_up_ms:
                    log.warning("consumer group %r: queue %s is held by the live member %r; the re-run "
                                "batch leaves it to that member, which reads it from the group's "
                                "progress", self.group, queue_key(mq),
                                e.client_id if e is not None else "(not shown by the broker)")
                    del waiting[mq]
        # one more round renews every lock now, so tasks may trust them for the full client lease
        return set(self.view.lock_all(sort_queues(granted))) if granted else set()

    def silent_members(self, since_ms: int) -> list[str]:
        """Live members other than this one that have not heartbeated since ``since_ms``: those that
        may have died (a killed query stays in the group until its heartbeat times out)."""
        now = self.membership.now_ms()
        timeout = self.membership.heartbeat_timeout_ms
        return sorted(cid for cid, t in self.membership.members().items()
                      if cid != self.client_id and now - t <= timeout and t < since_ms)

    def record_plan(self, start: dict, end: dict, read: set[MessageQueue], first: bool = False,
                    forced: bool = False, past: dict[MessageQueue, int] | None = None,
                    start_offsets: dict[MessageQueue, int] | None = None) -> None:
        """Persist which queues the batch (start, end) reads, before Spark logs the batch.
        ``start_offsets``: ``start`` by queue when the caller has it (the same offsets).

        ``first`` marks a query's first batch: its start offsets are kept too, because Spark re-runs
        that batch after a restart from a freshly computed ``initialOffset`` (see
        :meth:`first_batch_plan`), and so is each queue's offset beyond which the group's progress
        means another member read it meanwhile (:meth:`resume_batch`): ``past`` when given (a
        re-run recorded again), else its start, or the group's progress :meth:`choose` planned
        from when that is later and ``forced`` (the start was forced by ``startingOffsets``).
        """
        key = plan_key(start, end)
        keys, queues = self._read_in_key_order(read)
        if start_offsets is None:
            froms = [_offset_of(start, mq) for mq in queues]
        else:
            froms = [start_offsets.get(mq) for mq in queues]
        rec = {"key": key, "end": plan_key(end, end), "client": self.client_id,
               "read": keys, "from": froms}
        if first:
            rec["start"] = start
            if past is None:
                seen = self._progress_seen if forced else {}
                past = {mq: max(-1 if f is None else f, seen.get(mq, -1))
                        for mq, f in zip(queues, froms)}
            rec["past"] = [past.get(mq, -1) for mq in queues]
        self._batch_key = key
        with file_lock(self.plans_path + ".flock", exclusive=True, timeout_s=30, error_cls=RmqLockError):
            append_jsonl(self.plans_path, [rec], error_cls=RmqLockError)
            size = nofollow.file_size(self.plans_path, error_cls=RmqLockError)
            if size is not None and size > max(_PLANS_COMPACT_BYTES, self._compact_at):
                self._compact()

    def _read_in_key_order(self, read: set[MessageQueue]) -> tuple[list[str], list[MessageQueue]]:
        """(the queue keys of ``read`` sorted, its queues in that order); the last answer is kept:
        batch after batch reads the same thousands of queues."""
        last = self._last_read
        if last is not None and last[0] == read:
            return last[1], last[2]
        keyed = sorted((queue_key(mq), mq) for mq in read)      # (keys are unique per queue)
        keys, queues = [k for k, _ in keyed], [mq for _, mq in keyed]
        self._last_read = (frozenset(read), keys, queues)
        return keys, queues

    def _compact(self) -> None:
        """Keep the last ``_PLANS_KEEP`` plans (fewer when they take more than half of
        ``_PLANS_COMPACT_BYTES``: a plan of ten thousand queues takes hundreds of KiB), and
        whatever a client that is down may still need however long ago it planned: its last two
        plans (the batch it may re-run and the committed one before it) and its last first-batch
        plan. Rewritten atomically through an unpredictably named temporary file, never through
        a symlink (:mod:`rmq_source.nofollow`). The next compaction comes once the file has
        doubled (or passed the limit), not at every plan when what must be kept is large."""
        lines = self._plan_lines()
        kept = "".join(lines[i] for i in sorted(_plans_to_keep(lines))).encode("utf-8")
        nofollow.write_file_atomic(self.plans_path, kept, error_cls=RmqLockError)
        self._compact_at = max(_PLANS_COMPACT_BYTES, 2 * len(kept))

    def _plan_lines(self) -> list[str]:
        """Lines of the plans file (each with its newline, but a torn last one), [] when absent."""
        raw = nofollow.read_file(self.plans_path, error_cls=RmqLockError)
        if raw is None:
            return []
        parts = raw.decode("utf-8").split("\n")
        return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])

    def _plans(self):
        lines = self._plan_lines()
        for line in reversed(lines):
            try:
                yield json.loads(line)
            except ValueError:
                continue  # a torn last line of a crashed writer

    @staticmethod
    def _queues_of(rec: dict) -> set[MessageQueue]:
        return {MessageQueue.of(*parse_queue_key(k)) for k in rec["read"]}

    def find_plan(self, start: dict, end: dict) -> Plan | None:
        """The :class:`Plan` of batch (start, end); None when no plan was recorded.

        This client's own record wins. A restarted query (a new client id) finds the batch among
        the group's records: by (start, end), several members' plans for the same offsets are
        joined (reading a queue twice is at least once; leaving one out would lose it: the highest
        ``past`` of a queue counts), and a first batch, whose start Spark recomputes after a restart,
        is found by its end (:meth:`first_batch_plan`).
        """
        key = plan_key(start, end)
        found: set[MessageQueue] | None = None
        first = False
        past: dict[MessageQueue, int] | None = {}
        for rec in self._plans():
            if rec.get("key") != key:
                continue
            if rec.get("client") == self.client_id:
                return Plan(start, self._queues_of(rec), "start" in rec, _past_of(rec))
            found = (found or set()) | self._queues_of(rec)
            first = first or "start" in rec
            theirs = _past_of(rec)
            if past is not None and theirs is not None:
                for mq, o in theirs.items():
                    past[mq] = max(o, past.get(mq, -1))
            elif "start" in rec:
                past = None
        if found is not None:
            return Plan(start, found, first, past if first else None)
        rec = self._first_batch_record(end)
        if rec is None:
            return None
        return Plan(rec["start"], self._queues_of(rec), True, _past_of(rec))

    def first_batch_plan(self, end: dict) -> tuple[dict, set[MessageQueue]] | None:
        """The (start offsets, queues read) recorded for a query's first batch ending at ``end``.

        None when there is none, or when several first batches of the group end at ``end`` with
        different plans (then nothing says which one was this query's).
        """
        rec = self._first_batch_record(end)
        return None if rec is None else (rec["start"], self._queues_of(rec))

    def _first_batch_record(self, end: dict) -> dict | None:
        """The plan record of :meth:`first_batch_plan`."""
        key = plan_key(end, end)
        found = {}
        for rec in self._plans():
            if rec.get("end") == key and isinstance(rec.get("start"), dict):
                if rec.get("client") == self.client_id:
                    return rec
                found[json.dumps([rec["start"], rec["read"]], sort_keys=True)] = rec
        if len(found) != 1:
            return None
        return next(iter(found.values()))

    def reads_of_batch_ending_at(self, end: dict) -> dict[MessageQueue, int | None]:
        """After a restart: the queues the committed batch ending at ``end`` read, each with the
        offset the batch read it from (None in plans of versions that did not record it).

        Plans of this client id win; a restarted query with a generated client id finds its plan
        among the others' by the end offsets (queues of every match are returned; committing them
        only moves the group forward, see :meth:`held`).
        """
        key = plan_key(end, end)
        found: dict[MessageQueue, int | None] = {}
        for rec in self._plans():
            if rec.get("end") == key:
                froms = _per_queue(rec, "from") or [None] * len(rec["read"])
                reads = {MessageQueue.of(*parse_queue_key(k)): (f if type(f) is int else None)
                         for k, f in zip(rec["read"], froms)}
                if rec.get("client") == self.client_id:
                    return reads
                for mq, f in reads.items():
                    found[mq] = f if found.get(mq, f) == f else None
        return found

    def held(self, verify: Callable[[MessageQueue], bool] | None = None) -> set[MessageQueue] | None:
        """Queues read by the last batch this session planned (None before the first), less any
        whose lock this query no longer holds (ordered mode): their progress is no longer ours.

        The lock table is asked about the queues ``verify`` selects (all without it: those whose
        progress the caller is about to write); the others count as held while this client's view
        trusts their lock (granted or renewed within the client lease), as a RocketMQ client trusts
        its process queue's lock. A lock lost meanwhile is found by the tasks' own check before they
        read and by this call before any progress of that queue is written."""
        with self._mutex:
            if self._fresh_process:
                return None
            held = set(self._held)
        if self.orderly and held:
            ask = held if verify is None else held - (self.view.trusted(held)[0]
                                                      - {mq for mq in held if verify(mq)})
            asked_at = self.locks.now_ms()
            still = self.locks.held_by(ask, self.client_id) if ask else set()
            if ask - still:       # (the next planning must not trust them: asked again there)
                self.view.record(ask - still, (), asked_at)
            if self._unanswered_brokers() is not None:
                self._drop_refused(ask - still)
            held = (held - ask) | still
        return held
