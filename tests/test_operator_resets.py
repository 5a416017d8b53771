"""An operator's reset of a group's progress meets a group query (rmq_source/spark/resets.py).

Driven directly (no Spark: Spark's calls in its order) on a store group, where
``rmq_source.group.progress.reset_group`` is what ``rmq-store reset-offset`` runs; the same
rules on real brokers with ``mqadmin resetOffsetByTime``: test_live_group.py. Every case checks
what the next batches read and that the group's progress is never written over the reset.
"""
from __future__ import annotations

import logging

import pytest

from rmq_source.errors import RmqBrokerError, RmqRemotingConnectionError, RmqRemotingTimeoutError
from rmq_source.group.allocation import MessageQueue
from rmq_source.group.offset_store import ReadOffsetType
from rmq_source.group.progress import reset_group
from rmq_source.spark import resets
from rmq_source.spark.offsets import from_json_dict
from rmq_source.spark.options import parse_options
from rmq_source.spark.stream_reader import RmqStreamReader
from store_builder import build_store

QUEUES, PER_QUEUE = 3, 20
Q0, Q1, Q2 = (MessageQueue("T", "broker-a", q) for q in range(QUEUES))


@pytest.fixture()
def store(tmp_path):
    root = tmp_path / "store"
    build_store(root, topics=(("T", QUEUES, QUEUES * PER_QUEUE),))
    return root


def _reader(store, client, orderly=True, **options):
    opts = {"storePath": str(store), "topic": "T", "startingOffsets": "earliest", "clientId": client,
            "consumerGroup": "GR", "orderly": str(orderly).lower(), "lockLeaseMs": "3000",
            "clientLockLeaseMs": "2000", "lockRenewIntervalMs": "500", **options}
    return RmqStreamReader(parse_options(opts, streaming=True))


def _batch(reader, start):
    """One micro-batch as Spark runs it: (end, {queue: (first, last + 1)} of the rows read)."""
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    read: dict[int, list[int]] = {}
    for part in reader.partitions(start, end):
        for batch in reader.read(part):
            for q, o in zip(batch.column("queueId").to_pylist(), batch.column("queueOffset").to_pylist()):
                read.setdefault(q, []).append(o)
    for offsets in read.values():
        assert offsets == list(range(offsets[0], offsets[-1] + 1)), "not in order, or a gap"
    reader.commit(end)
    return end, {q: (o[0], o[-1] + 1) for q, o in read.items()}


def _progress(reader) -> dict[int, int]:
    got = reader.group_store.read_offsets([Q0, Q1, Q2], ReadOffsetType.READ_FROM_STORE)
    return {mq.queue_id: v for mq, v in got.items()}


def _reset(reader, offsets) -> None:
    """``rmq-store reset-offset --offsets`` of group GR (on a backend of the same store)."""
    reset_group(reader.backend, "GR", "T", offsets=offsets)


def _drain(reader, end) -> tuple[dict, dict[int, list[int]]]:
    """Batches until one reads nothing: (last end, per queue the offsets read, in order)."""
    seen: dict[int, list[int]] = {}
    while True:
        end, read = _batch(reader, end)
        if not read:
            return end, seen
        for q, (first, stop) in read.items():
            seen.setdefault(q, []).extend(range(first, stop))


@pytest.mark.parametrize("orderly", [True, False])
def test_a_running_query_follows_a_reset_back_and_forward(store, orderly, caplog):
    reader = _reader(store, "aa", orderly=orderly, maxMessagesPerTrigger=str(QUEUES * 5))
    try:
        end, read = _batch(reader, reader.initialOffset())
        assert read == {q: (0, 5) for q in range(QUEUES)}
        end, read = _batch(reader, end)                       # records the first batch's progress
        assert _progress(reader) == {q: 5 for q in range(QUEUES)}
        _reset(reader, {Q0: 3, Q1: 15})                       # a rewind and a skip, batch 2 running
        with caplog.at_level(logging.WARNING):
            end, read = _batch(reader, end)                   # batch 2 committed: the reset wins
        assert read == {2: (10, 20)}, read                    # the reset queues move, unread
        assert from_json_dict(end)[Q0] == 3 and from_json_dict(end)[Q1] == 15
        assert _progress(reader) == {0: 3, 1: 15, 2: 10}, "the query wrote over the reset"
        assert "reset to offset 3" in caplog.text and "reads 7 message offset(s) again" in caplog.text
        assert "reset to offset 15" in caplog.text and "skips 5 message offset(s)" in caplog.text
        end, seen = _drain(reader, end)
        assert seen == {0: list(range(3, PER_QUEUE)), 1: list(range(15, PER_QUEUE))}
        assert _progress(reader) == {q: PER_QUEUE for q in range(QUEUES)}
    finally:
        reader.stop()


@pytest.mark.parametrize("reset", [None, 4], ids=["died-before-recording", "reset-while-stopped"])
def test_a_restart_tells_its_own_unrecorded_batch_from_a_reset(store, reset):
    """The last batch's progress is recorded when the next one is planned, so a query that dies
    in between leaves the batch's start as the group's progress; a restart writes its end. Any
    other offset behind that end was written by someone else while the query was away."""
    first = _reader(store, "aa", maxMessagesPerTrigger=str(QUEUES * 10))
    end1, _ = _batch(first, first.initialOffset())
    end2, read = _batch(first, end1)                          # records batch 1: the group at 10
    assert read == {q: (10, 20) for q in range(QUEUES)}
    first.stop()                                              # batch 2 committed, not recorded
    assert _progress(first) == {q: 10 for q in range(QUEUES)}
    if reset is not None:
        _reset(first, {Q0: reset})
    second = _reader(store, "bb", maxMessagesPerTrigger=str(QUEUES * 10))
    try:
        end, read = _batch(second, end2)
        if reset is None:
            assert read == {} and end == end2 and _progress(second) == {q: 20 for q in range(QUEUES)}
        else:
            assert from_json_dict(end)[Q0] == reset and _progress(second)[0] == reset
            end, read = _batch(second, end)
            assert read == {0: (reset, 20)}
    finally:
        second.stop()


class _Keeper:
    """A group offset store whose values and restarts a case sets."""
    group = "GR"

    def __init__(self, values, lost, away=()):
        self.values, self.lost, self.asked, self.away = values, lost, [], set(away)

    def read_offsets(self, mqs, read_type, zero_will_do=None, away=None):
        mqs = list(mqs)
        if away is None and any(mq.broker_name in self.away for mq in mqs):
            raise RmqRemotingConnectionError("refused")
        if away is not None:
            away |= {mq.broker_name for mq in mqs} & self.away
        # (as a broker's one answer for many queues: 0 for no offset where the caller allows it)
        return {mq: -1 if mq.broker_name in self.away
                else 0 if zero_will_do is not None and zero_will_do(mq) and self.values.get(mq, -1) < 0
                else self.values.get(mq, -1) for mq in mqs}

    def may_have_lost(self, broker, written_ms):
        self.asked.append((broker, written_ms))
        return self.lost


@pytest.mark.parametrize("now, restarted, found, lost", [
    (10, False, None, None),          # what the query committed: nothing happened
    (4, False, 4, None),              # behind, the broker never restarted: a reset
    (4, True, None, 10),              # behind after a restart: the broker lost the commit
    (15, True, 15, None),             # ahead: someone wrote it, whatever restarted
    (-1, False, None, 10),            # the broker has no entry now: written again
])
def test_a_changed_progress_is_a_reset_unless_the_broker_lost_it(now, restarted, found, lost):
    keeper = _Keeper({Q0: now, Q1: 7}, restarted)
    taken = {Q0: (10, 1000), Q1: (7, 1000), Q2: (5, 1000)}
    got, rewrite = resets.since_last_commit(keeper, taken, {Q0, Q1, Q2}, unsaved={Q2: 6})
    assert got == ({} if found is None else {Q0: (found, got[Q0][1])})
    assert rewrite == ({} if lost is None else {Q0: lost})
    assert keeper.asked == ([("broker-a", 1000)] if 0 <= now < 10 else [])


@pytest.mark.parametrize("restarted", [False, True])
def test_a_commit_of_0_is_asked_for_exactly_only_after_a_restart(restarted):
    """A broker answers many queues' offsets with 0 for none too: a commit of 0 it may have lost
    (restarted since) is asked for exactly and written again; otherwise its 0 is the commit."""
    keeper = _Keeper({Q1: 7}, restarted)
    taken = {Q0: (0, 1000), Q1: (7, 2000)}
    got, rewrite = resets.since_last_commit(keeper, taken, {Q0, Q1}, unsaved={})
    assert got == {} and rewrite == ({Q0: 0} if restarted else {})
    assert keeper.asked[0] == ("broker-a", 1000)


def test_a_broker_away_is_compared_once_it_answers_the_others_now():
    """A broker that does not answer leaves its queues uncompared this time (neither a reset nor
    a lost commit: the planning decides what its absence means); the other brokers' are."""
    qb = MessageQueue("T", "broker-b", 0)
    keeper = _Keeper({Q0: 4, qb: 3}, False, away={"broker-b"})
    taken = {Q0: (10, 1000), qb: (9, 1000)}
    got, rewrite = resets.since_last_commit(keeper, taken, {Q0, qb}, unsaved={})
    assert set(got) == {Q0} and got[Q0][0] == 4 and rewrite == {}
    keeper.away.clear()
    got, rewrite = resets.since_last_commit(keeper, taken, {Q0, qb}, unsaved={})
    assert {mq: v for mq, (v, _) in got.items()} == {Q0: 4, qb: 3}


def test_a_commit_declined_for_a_pending_reset_is_followed(store, monkeypatch):
    """A 5.x broker keeps an operator's reset pending and ignores the group's commits of the
    queue (remark "Offset has been previously reset"): the query follows the reset even when the
    changed progress alone looked like a restarted broker's loss."""
    reader = _reader(store, "aa", maxMessagesPerTrigger=str(QUEUES * 5))
    try:
        end, _ = _batch(reader, reader.initialOffset())
        end, _ = _batch(reader, end)                          # the group at 5 everywhere
        _reset(reader, {Q0: 2})
        monkeypatch.setattr(reader.group_store, "may_have_lost", lambda broker, ms: True)
        persist = reader.group_store.persist

        def pending(mqs=None):                                # Q0's commits ignored, as 5.x does
            mqs = list(mqs) if mqs is not None else None
            written = persist([mq for mq in mqs if mq != Q0] if mqs is not None else None)
            return written | ({Q0} if mqs is None or Q0 in mqs else set())
        monkeypatch.setattr(reader.group_store, "persist", pending)
        end, read = _batch(reader, end)
        assert 0 not in read and from_json_dict(end)[Q0] == 2, (read, end)
        assert _progress(reader)[0] == 2
        monkeypatch.setattr(reader.group_store, "persist", persist)   # the pull met the reset
        end, read = _batch(reader, end)
        assert read[0][0] == 2 and _progress(reader)[0] == 2
        _batch(reader, end)
        assert _progress(reader)[0] == read[0][1]
    finally:
        reader.stop()


@pytest.mark.parametrize("master, answer, lost", [
    ("a:1", 5000, True),                                      # started after the write
    ("a:1", 3000, False),                                     # running since before it
    ("b:2", 3000, True),                                      # another master took over
    ("a:1", RmqBrokerError("NoSuchElementException", code=1), True),   # its first second
    ("a:1", RmqBrokerError("not supported", code=3), False),  # a Proxy: cannot tell, follow
    ("a:1", RmqRemotingConnectionError("refused"), True),    # away again
])
def test_a_broker_may_have_lost_a_commit_only_if_it_restarted(master, answer, lost):
    from rmq_source.remote.offset_store import BrokerOffsetStore

    class Backend:
        def master_addr(self, broker):
            return master

        def _call(self, broker, fn):
            if isinstance(answer, Exception):
                raise answer
            return answer

    store = BrokerOffsetStore(None, "G", Backend())
    store._written_to["broker-a"] = "a:1"
    assert store.may_have_lost("broker-a", 4500) is lost


@pytest.mark.parametrize("error", [RmqRemotingConnectionError("refused"),
                                   RmqRemotingTimeoutError("no answer in 15 s")])
def test_a_broker_offset_store_reports_a_broker_away_and_keeps_the_others(error):
    from rmq_source.backend import Backend
    from rmq_source.remote.offset_store import BrokerOffsetStore

    qb = MessageQueue("T", "broker-b", 0)
    store = BrokerOffsetStore(None, "G", type("B", (), {"each_broker": Backend.each_broker})())

    def fetch_broker(broker, queues, zero_will_do):
        if broker == "broker-b":
            raise error
        return {mq: 7 for mq in queues}
    store._fetch_broker = fetch_broker
    away = set()
    assert store.read_offsets([Q0, qb], ReadOffsetType.READ_FROM_STORE, away=away) == {Q0: 7, qb: -1}
    assert away == {"broker-b"}
    with pytest.raises(type(error)):
        store.read_offsets([Q0, qb], ReadOffsetType.READ_FROM_STORE)


@pytest.mark.parametrize("orderly", [True, False])
def test_only_queues_that_moved_are_committed(store, monkeypatch, orderly):
    """A commit writes the queues whose offset moved since what their keeper took; the others
    were just compared with the keeper (a thousand idle queues cost no writes)."""
    reader = _reader(store, "aa", orderly=orderly, maxMessagesPerTrigger=str(QUEUES * 5))
    try:
        end, _ = _drain(reader, reader.initialOffset())
        assert _progress(reader) == {q: PER_QUEUE for q in range(QUEUES)}
        written = []
        persist = reader.group_store.persist
        monkeypatch.setattr(reader.group_store, "persist", lambda mqs=None: written.append(
            sorted(mqs or [])) or persist(mqs))
        end, read = _batch(reader, end)
        end, read = _batch(reader, end)
        assert read == {} and [w for w in written if w] == []     # nothing moved: nothing written
        _reset(reader, {Q1: 4})                                   # an operator moves Q1 back
        end, moved = _batch(reader, end)                          # (followed, not overwritten)
        end, seen = _drain(reader, end)
        assert moved == {} and seen == {1: list(range(4, PER_QUEUE))}
        end, _ = _batch(reader, end)
        assert {q for w in written for q in w} == {Q1} and _progress(reader)[1] == PER_QUEUE
    finally:
        reader.stop()
