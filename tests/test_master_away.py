"""Where questions go while a broker's master is away, and what a slave's answers may decide,
without servers: the NameServers' view and each address's answers are scripted (the real
fail-over runs against RocketMQ in test_live_slave.py)."""
from __future__ import annotations

import pytest

from rmq_source.backend import QueueInfo
from rmq_source.errors import (RmqAuthError, RmqBrokerError, RmqBrokerUnavailableError,
                               RmqDataLossError, RmqMasterAwayError, RmqRemotingConnectionError)
from rmq_source.group.allocation import MessageQueue
from rmq_source.remote import requests as rq
from rmq_source.remote.backend import ClusterBackend, ClusterBackendSpec
from rmq_source.spark.positions import check_data_loss, logged_range_start

MASTER, SLAVE = "127.0.0.1:10911", "127.0.0.1:10921"


class _Cluster:
    """The NameServers' view of broker-a (``master`` listed or not, the slave always) and what
    each address answers: a list of outcomes taken in turn (the last one repeats)."""

    def __init__(self, master_listed: bool, answers: dict[str, list]):
        self.master_listed = master_listed
        self.answers = {a: list(v) for a, v in answers.items()}
        self.asked: list[str] = []

    def info(self):
        nodes = {"1": SLAVE, **({"0": MASTER} if self.master_listed else {})}
        return rq.ClusterInfo({"broker-a": {"brokerName": "broker-a", "brokerAddrs": nodes}}, {})

    def fn(self, addr):
        self.asked.append(addr)
        outcomes = self.answers.get(addr) or [RmqRemotingConnectionError("refused", peer=addr)]
        outcome = outcomes.pop(0) if len(outcomes) > 1 else outcomes[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def _backend(cluster: _Cluster, outage_s: float = 30.0) -> ClusterBackend:
    backend = ClusterBackend(ClusterBackendSpec(("127.0.0.1:1",), 1.0, retries=2, retry_backoff_s=0.01,
                                                outage_s=outage_s))
    # (no NameServer asked: broker lookups read the fake's cluster info, any other question gets it)
    backend._lookup_broker = lambda namesrv, name: (cluster.info().master_addr(name),
                                                    cluster.info().nodes(name))
    backend._ask_namesrv = lambda what, call: (call("127.0.0.1:1") if what.startswith("master of")
                                               else cluster.info())
    return backend


_refused = RmqRemotingConnectionError("refused")
_no_topic = RmqBrokerError("topic not exist", code=17)


@pytest.mark.parametrize("master_listed, answers, slave_ok, asked, result", [
    # a master that answers is the only one asked, slave_ok or not
    (True, {MASTER: ["m"]}, True, [MASTER], "m"),
    # no master in the NameServers' view: the slave at once
    (False, {SLAVE: ["s"]}, True, [SLAVE], "s"),
    # a master still listed but dead: the next try goes to the slave
    (True, {MASTER: [_refused], SLAVE: ["s"]}, True, [MASTER, SLAVE], "s"),
    # a slave that refuses (a 5.3 slave without the topic's config yet) is no answer: asked again
    (False, {SLAVE: [_no_topic, "s"]}, True, [SLAVE, SLAVE], "s"),
    # without slave_ok (locks): only a master, so nothing is asked while none is listed
    (False, {SLAVE: ["s"]}, False, [], RmqBrokerUnavailableError),
    # an ACL refusal of a slave is an answer: raised at once
    (False, {SLAVE: [RmqAuthError("denied", code=16)]}, True, [SLAVE], RmqAuthError),
])
def test_questions_a_slave_may_answer_go_to_it_while_the_master_is_away(master_listed, answers,
                                                                        slave_ok, asked, result):
    cluster = _Cluster(master_listed, answers)
    backend = _backend(cluster)
    if isinstance(result, type):
        with pytest.raises(result):
            backend._call("broker-a", cluster.fn, slave_ok=slave_ok)
    else:
        assert backend._call("broker-a", cluster.fn, slave_ok=slave_ok) == result
        assert backend.away_for("broker-a") is None
    assert cluster.asked == asked


@pytest.mark.parametrize("master_listed, answers, slave_ok, error, text", [
    # a master that never answers: the retries' end names it with its role
    (True, {MASTER: [_refused]}, False, RmqRemotingConnectionError,
     f"gave up after 3 tries .*; peer: {MASTER} \\(broker-a master\\)"),
    # an error of the request itself, raised at once
    (True, {MASTER: [_no_topic]}, False, RmqBrokerError, f"topic not exist; peer: {MASTER} \\(broker-a master\\)"),
    # a slave that keeps refusing while the master is away
    (False, {SLAVE: [_no_topic]}, True, RmqMasterAwayError,
     f"its master is away and its slave {SLAVE} refused: topic not exist; peer: {SLAVE} \\(broker-a slave 1\\)"),
    # a question only a master answers while none is listed: the slaves it has are named
    (False, {}, False, RmqBrokerUnavailableError,
     f"'broker-a' has no master in the cluster of NameServer 127.0.0.1:1; its slaves: 1 at {SLAVE}"),
])
def test_errors_name_the_broker_its_role_and_address(master_listed, answers, slave_ok, error, text):
    cluster = _Cluster(master_listed, {a: [_with_peer(o, a) for o in v] for a, v in answers.items()})
    with pytest.raises(error, match=text):
        _backend(cluster)._call("broker-a", cluster.fn, slave_ok=slave_ok)


def _with_peer(outcome, addr):
    """A fresh copy of a scripted error, from ``addr`` as the client reports it."""
    if not isinstance(outcome, BaseException):
        return outcome
    if isinstance(outcome, RmqBrokerError):
        return type(outcome)(outcome.reason, code=outcome.code, peer=addr)
    return type(outcome)(outcome.reason, peer=addr)


def test_a_slave_that_cannot_tell_is_waited_on_until_the_outage_bound():
    """A pull a slave answers with anything but messages waits for the master like a broker away
    (ride_out), and fails as RmqMasterAwayError once the broker has been away that long."""
    cannot = RmqMasterAwayError("slave answered code 20", peer=SLAVE)
    cluster = _Cluster(False, {SLAVE: [cannot]})
    with pytest.raises(RmqMasterAwayError, match="brokerOutageTimeoutMs"):
        _backend(cluster, outage_s=0.2)._call("broker-a", cluster.fn, ride_out=True, slave_ok=True)
    assert len(cluster.asked) > 3 and set(cluster.asked) == {SLAVE}
    # and the master's return ends the wait with its answer
    cluster = _Cluster(False, {SLAVE: [cannot]})
    backend = _backend(cluster)
    calls = iter(range(100))

    def fn(addr):
        if next(calls) == 3:
            cluster.master_listed = True
            backend._no_master_at.clear()     # (as if the second of NameServer silence had passed)
        return "m" if addr == MASTER else cluster.fn(addr)
    assert backend._call("broker-a", fn, ride_out=True, slave_ok=True) == "m"


def test_the_master_is_asked_afresh_for_a_tasks_lock_check():
    """master_away does not trust a cached master (a reused worker's cache may hold a dead one)."""
    cluster = _Cluster(True, {})
    backend = _backend(cluster)
    assert backend.broker_addr("broker-a") == MASTER and not backend.master_away("broker-a")
    cluster.master_listed = False
    assert backend.master_away("broker-a")
    assert backend._acting_addr("broker-a", master_failed=False) == SLAVE


def test_silent_nameservers_do_not_make_a_master_away():
    """No NameServer answering (e.g. a Proxy restarting) is no answer: not away, and the master
    last routed stays where the task's lock calls look for it."""
    cluster = _Cluster(True, {})
    backend = _backend(cluster)
    assert backend.broker_addr("broker-a") == MASTER

    def silent(namesrv, name):
        raise RmqRemotingConnectionError(f"{namesrv}: cannot connect", peer=namesrv)
    backend._lookup_broker = silent
    backend._no_master_at.clear()
    assert not backend.master_away("broker-a")
    assert backend._masters["broker-a"] == MASTER


def test_silent_nameservers_leave_the_last_route_standing():
    """A planning while no NameServer answers, or while they no longer route a topic they
    routed before, goes on with the topic's last route (RocketMQ's clients keep theirs); a topic
    never routed raises, one known not to exist stays unknown."""
    from rmq_source.errors import RmqUnknownTopicError
    backend = _backend(_Cluster(True, {}))
    route = rq.TopicRoute([{"brokerName": "broker-a", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}],
                          [{"brokerName": "broker-a", "brokerAddrs": {"0": MASTER}}])
    answers = {"T": route, "Gone": RmqBrokerError("no route", code=rq.TOPIC_NOT_EXIST)}
    silent = [False]

    def ask(what, call):
        if silent[0]:
            raise RmqRemotingConnectionError(f"{what}: no NameServer answered")
        answer = answers[what.split("'")[1]]
        if isinstance(answer, BaseException):
            raise answer
        return answer
    backend._ask_namesrv = ask
    assert backend.queues_for_topics(["T"]) == [MessageQueue("T", "broker-a", q) for q in range(2)]
    with pytest.raises(RmqUnknownTopicError):
        backend.route("Gone")
    silent[0] = True
    assert backend.queues_for_topics(["T"]) == [MessageQueue("T", "broker-a", q) for q in range(2)]
    with pytest.raises(RmqUnknownTopicError):
        backend.route("Gone")
    with pytest.raises(RmqRemotingConnectionError, match="no NameServer answered"):
        backend.route("Never")
    silent[0] = False
    assert backend.route("T") is route and "T" not in backend._routes_stale
    # its only broker restarting: the NameServers drop its routes, the last one stands
    answers["T"] = RmqBrokerError("No topic route info in name server for the topic: T",
                                  code=rq.TOPIC_NOT_EXIST)
    assert backend.queues_for_topics(["T"]) == [MessageQueue("T", "broker-a", q) for q in range(2)]
    assert "T" in backend._routes_stale
    answers["T"] = route
    assert backend.route("T") is route and "T" not in backend._routes_stale


MQ = MessageQueue("T", "broker-a", 0)


@pytest.mark.parametrize("wanted", [10, 20, 25, 30])
def test_a_slaves_offsets_decide_no_loss_and_no_recreation(wanted):
    """Inside a slave's [min, max] a position stands; below its min or above its max (it lags)
    only the master can tell: RmqMasterAwayError, whatever failOnDataLoss says. The same numbers
    from a master are retention (below) and a re-created queue (above)."""
    slave_info, master_info = QueueInfo("T", 0, 20, 25, SLAVE), QueueInfo("T", 0, 20, 25)
    for fail in (True, False):
        if 20 <= wanted <= 25:
            assert check_data_loss(MQ, wanted, slave_info, fail) == wanted
            continue
        with pytest.raises(RmqMasterAwayError, match="only the master can say"):
            check_data_loss(MQ, wanted, slave_info, fail)
        if fail:
            with pytest.raises(RmqDataLossError):
                check_data_loss(MQ, wanted, master_info, fail)
        else:
            assert check_data_loss(MQ, wanted, master_info, fail) == 20
    # a logged batch starting below a slave's min is read from its start (its pulls then wait for
    # the master), never moved past "lost" offsets
    assert logged_range_start(MQ, 10, 25, slave_info, True) == 10
    with pytest.raises(RmqDataLossError):
        logged_range_start(MQ, 10, 25, master_info, True)


@pytest.mark.parametrize("code, error, text", [
    # a master that has not heard of the group (elected before its config sync): kept, as if away
    (26, RmqBrokerUnavailableError, "does not know the group or topic yet .*; peer: .* \\(broker-a master\\)"),
    (17, RmqBrokerUnavailableError, "does not know the group or topic yet"),
    # any other refusal of the master is the query's to judge
    (1, RmqBrokerError, "refused"),
])
def test_a_group_commit_a_new_master_cannot_take_yet_is_kept(monkeypatch, code, error, text):
    from rmq_source.remote.offset_store import BrokerOffsetStore
    cluster = _Cluster(True, {})
    backend = _backend(cluster)

    def refuse(client, addr, group, topic, queue_id, offset, broker_name=None):
        raise RmqBrokerError("refused", code=code, peer=addr)
    monkeypatch.setattr(rq, "update_consumer_offset", refuse)
    with pytest.raises(error, match=text) as info:
        BrokerOffsetStore(None, "G", backend)._write_broker("broker-a", {MQ: 5})
    assert info.type is error


@pytest.mark.parametrize("topic, error", [
    # a group's retry topic a just-elected master has not made yet: its queues wait, no error
    ("%RETRY%G", None),
    # any other topic the master does not know is the query's to judge
    ("T", RmqBrokerError),
])
def test_a_retry_topic_a_new_master_lacks_leaves_its_queues_out(monkeypatch, topic, error):
    cluster = _Cluster(True, {})
    backend = _backend(cluster)

    def no_topic(client, addr, name):
        raise RmqBrokerError(f"topic[{name}] not exist", code=17, peer=addr)
    monkeypatch.setattr(rq, "topic_stats", no_topic)
    mqs = [MessageQueue(topic, "broker-a", 0)]
    if error is None:
        assert backend.infos_reachable(mqs) == ({}, {})
    else:
        with pytest.raises(error, match="not exist"):
            backend.infos_reachable(mqs)


class _Call:
    def __init__(self, item):
        self.item, self.cancelled = item, False

    def cancel(self):
        self.cancelled = True


@pytest.mark.parametrize("fail_at", [None, 0, 5, 39])
def test_offsets_of_many_queues_go_in_a_row_and_failures_the_one_at_a_time_way(monkeypatch, fail_at):
    """A broker's queues are asked and written without waiting for each answer (at most WINDOW
    in flight); from the first failure on, the queues left take the one-at-a-time way (its
    retries and fallbacks), so every queue ends with its answer and none is asked twice when
    nothing fails. A write the broker declines (a pending reset) is reported either way."""
    from rmq_source.remote import offset_store
    from rmq_source.remote.offset_store import BrokerOffsetStore
    cluster = _Cluster(True, {})
    backend = _backend(cluster)
    backend.broker_addr("broker-a")                   # (routes the master)
    mqs = [MessageQueue("T", "broker-a", q) for q in range(40)]
    sent, one_by_one, in_flight = [], [], []

    def send_query(client, addr, group, topic, queue_id, broker_name=None):
        sent.append(queue_id)
        in_flight.append(len(sent) - len(answered))
        return _Call(queue_id)

    answered = []

    def answer(client, call):
        if call.item == fail_at:
            raise RmqRemotingConnectionError("reset by peer")
        answered.append(call.item)
        return None if call.item % 7 == 0 else call.item * 10

    def query(client, addr, group, topic, queue_id, broker_name=None):
        one_by_one.append(queue_id)
        return None if queue_id % 7 == 0 else queue_id * 10

    monkeypatch.setattr(rq, "query_consumer_offset_call", send_query)
    monkeypatch.setattr(rq, "consumer_offset_of", answer)
    monkeypatch.setattr(rq, "query_consumer_offset", query)
    found = BrokerOffsetStore(None, "G", backend)._fetch(mqs)
    assert found == {mq: mq.queue_id * 10 for mq in mqs if mq.queue_id % 7}
    assert max(in_flight) <= offset_store.WINDOW
    assert one_by_one == ([] if fail_at is None else list(range(fail_at, 40)))
    assert answered == list(range(40 if fail_at is None else fail_at))

    writes, written_one_by_one = [], []
    monkeypatch.setattr(rq, "update_consumer_offset_calls",
                        lambda client, addr, group, entries, broker_name=None:
                        [writes.append(q) or _Call(q) for _, q, _ in entries])

    def taken(client, call):
        if call.item == fail_at:
            raise RmqRemotingConnectionError("reset by peer")
        return call.item != 3                          # queue 3: a reset is pending there

    monkeypatch.setattr(rq, "offset_taken", taken)
    monkeypatch.setattr(rq, "update_consumer_offset",
                        lambda client, addr, group, topic, q, offset, broker_name=None:
                        written_one_by_one.append(q) or q != 3)
    store = BrokerOffsetStore(None, "G", backend)
    declined = store._write_broker("broker-a", {mq: 100 + mq.queue_id for mq in mqs})
    assert declined == {mqs[3]}
    assert written_one_by_one == ([] if fail_at is None else list(range(fail_at, 40)))
    assert store._written_to["broker-a"] == MASTER


def test_a_topics_first_group_offset_is_answered_before_its_others_are_sent(monkeypatch):
    """A broker creates a topic@group's offset table unlocked on its first write (4.9 and 5.3
    ConsumerOffsetManager.commitOffset), so first writes of one topic side by side lose all but
    one: each topic's first entry is answered before any other entry of the topic is sent; the
    rest go in a row."""
    from rmq_source.remote.offset_store import BrokerOffsetStore
    backend = _backend(_Cluster(True, {}))
    backend.broker_addr("broker-a")
    mqs = [MessageQueue(t, "broker-a", q) for t in ("T", "U") for q in range(10)]
    events = []
    monkeypatch.setattr(rq, "update_consumer_offset_calls",
                        lambda client, addr, group, entries, broker_name=None:
                        [events.append(("send", topic, q)) or _Call((topic, q)) for topic, q, _ in entries])
    monkeypatch.setattr(rq, "offset_taken",
                        lambda client, call: events.append(("take", *call.item)) or True)
    monkeypatch.setattr(rq, "update_consumer_offset", lambda *a, **k: pytest.fail("one by one"))
    assert BrokerOffsetStore(None, "G", backend)._write_broker(
        "broker-a", {mq: 7 for mq in mqs}) == set()
    for topic in ("T", "U"):
        first_taken = events.index(("take", topic, 0))
        assert all(events.index(("send", topic, q)) > first_taken for q in range(1, 10))
    assert sorted(e for e in events if e[0] == "send") == sorted(("send", mq.topic, mq.queue_id) for mq in mqs)


def test_lock_requests_go_to_the_brokers_side_by_side_and_one_away_is_its_own():
    """An ordered planning's lock request of each broker is sent side by side (a broker that
    rides out an outage delays no other); a broker that does not answer leaves its queues away
    (held_by counts them held: no one can take them there), the other's grants stand."""
    import threading
    from rmq_source.remote.locks import BrokerLockManager
    backend = _backend(_Cluster(True, {}))
    both_asked = threading.Barrier(2, timeout=10)

    def call(broker, fn, ride_out=False, slave_ok=False):
        both_asked.wait()                           # (asked one after the other: times out)
        if broker == "broker-b":
            raise RmqRemotingConnectionError("refused", peer="127.0.0.1:2")
        return {("T", "broker-a", q) for q in range(3)}
    backend._call = call
    locks = BrokerLockManager(backend, "G", lease_ms=60_000)
    a = [MessageQueue("T", "broker-a", q) for q in range(3)]
    b = [MessageQueue("T", "broker-b", q) for q in range(2)]
    granted, away = locks._lock(a + b, "cid")
    assert granted == set(a) and away == set(b) and locks.away_brokers == {"broker-b"}
    assert locks.held_by(a + b, "cid") == set(a + b)
