"""rmq_source.group.allocation against RocketMQ 4.9.3's own answers (oracle fixture) and Java edge cases."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_source.group.allocation import (
    AllocateMachineRoomNearby,
    AllocateMessageQueueAveragely,
    AllocateMessageQueueAveragelyByCircle,
    AllocateMessageQueueByConfig,
    AllocateMessageQueueByMachineRoom,
    AllocateMessageQueueConsistentHash,
    MessageQueue,
    UserStrategy,
    create_strategy,
    java_string_key,
    md5_hash,
    sort_queues,
)
from rmq_source.errors import RmqAllocationError, RmqOptionError

from conftest import fixtures_root, missing

ORACLE = fixtures_root() / "oracle" / "allocations.jsonl"
TESTS_DIR = Path(__file__).resolve().parent


def _load_cases() -> list[dict]:
    if not ORACLE.is_file():
        return []
    with ORACLE.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


CASES = _load_cases()


def _need_oracle(case) -> None:
    if case is None:
        missing(f"allocation oracle not found at {ORACLE}")


def mqs(rows) -> list[MessageQueue]:
    return [MessageQueue(*row) for row in rows]


# Oracle result key -> strategy built from the case's config, as the oracle's Java program built it.
ORACLE_STRATEGIES = {
    "AllocateMessageQueueAveragely": lambda cfg: create_strategy("AVG"),
    "AllocateMessageQueueAveragelyByCircle": lambda cfg: create_strategy("AVG_BY_CIRCLE"),
    "AllocateMessageQueueByConfig":
        lambda cfg: create_strategy("CONFIG", message_queues=mqs(cfg["byConfigMessageQueueList"])),
    "AllocateMessageQueueByMachineRoom":
        lambda cfg: create_strategy("MACHINE_ROOM", consume_rooms=set(cfg["consumeridcs"])),
    "AllocateMachineRoomNearby(AllocateMessageQueueAveragely)":
        lambda cfg: create_strategy("MACHINE_ROOM_NEARBY", inner="AVG"),
    "AllocateMachineRoomNearby(AllocateMessageQueueAveragelyByCircle)":
        lambda cfg: create_strategy("MACHINE_ROOM_NEARBY", inner=AllocateMessageQueueAveragelyByCircle()),
    "AllocateMessageQueueConsistentHash": lambda cfg: create_strategy("CONSISTENT_HASH"),
    "AllocateMessageQueueConsistentHash(virtualNodeCnt=3)":
        lambda cfg: create_strategy("CONSISTENT_HASH", virtual_node_count=3),
}

ORACLE_RESOLVER = 'brokerDeployIn = brokerName.split("@")[0]; consumerDeployIn = clientId.split("@")[0]'


def _oracle_params():
    if not CASES:
        return [pytest.param(None, None, id="oracle-missing")]
    return [pytest.param(case, key, id=f"case{case['case']}-{key}")
            for case in CASES for key in case["results"]]


def _case_params():
    if not CASES:
        return [pytest.param(None, id="oracle-missing")]
    return [pytest.param(case, id=f"case{case['case']}") for case in CASES]


# ------------------------------------------------------------------------------------------------
# Oracle conformance
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case, key", _oracle_params())
def test_oracle_allocation(case, key):
    _need_oracle(case)
    assert key in ORACLE_STRATEGIES, f"oracle strategy {key!r} has no builder in this test"
    assert case["config"]["machineRoomResolver"] == ORACLE_RESOLVER
    strategy = ORACLE_STRATEGIES[key](case["config"])
    mq_all = mqs(case["mqAll"])
    expected_by_cid = case["results"][key]
    assert sorted(expected_by_cid) == sorted(case["cidAll"])
    for cid in case["cidAll"]:
        got = strategy.allocate(case["consumerGroup"], cid, mq_all, case["cidAll"])
        assert got == mqs(expected_by_cid[cid]), f"case {case['case']} {key} consumer {cid}"


@pytest.mark.parametrize("case", _case_params())
def test_oracle_message_queue_string_and_order(case):
    _need_oracle(case)
    mq_all = mqs(case["mqAll"])
    assert [mq.java_string() for mq in mq_all] == case["mqAllToString"]
    # RocketMQ's RebalanceImpl sorted both lists before allocating.
    assert sorted(reversed(mq_all)) == mq_all
    assert sorted(reversed(case["cidAll"]), key=java_string_key) == case["cidAll"]


def test_oracle_covers_every_strategy():
    _need_oracle(CASES or None)
    assert len(CASES) == 150
    assert {key for case in CASES for key in case["results"]} == set(ORACLE_STRATEGIES)


# ------------------------------------------------------------------------------------------------
# MessageQueue
# ------------------------------------------------------------------------------------------------

def test_message_queue_str_equality_and_hash():
    mq = MessageQueue("T", "room1@broker-a", 7)
    assert mq.java_string() == "MessageQueue [topic=T, brokerName=room1@broker-a, queueId=7]"
    assert str(mq) == "T/room1@broker-a/7"
    assert mq == MessageQueue("T", "room1@broker-a", 7)
    assert len({mq, MessageQueue("T", "room1@broker-a", 7), MessageQueue("T", "room1@broker-a", 8)}) == 2
    assert mq != ("T", "room1@broker-a", 7) and ("T", "room1@broker-a", 7) != mq
    assert not mq == ("T", "room1@broker-a", 7) and not ("T", "room1@broker-a", 7) == mq
    assert {("T", "room1@broker-a", 7): 1}.get(mq) is None
    assert mq != "T/room1@broker-a/7" and mq != 7 and mq != MessageQueue("T", "room1@broker-a", -7)
    # hashed by the tuple's C slot: planning hashes queues ~600,000 times a batch at 10,000 queues
    assert MessageQueue.__hash__ is tuple.__hash__ and hash(mq) == hash(("T", "room1@broker-a", 7))
    assert (mq.topic, mq.broker_name, mq.queue_id) == ("T", "room1@broker-a", 7)
    assert repr(mq) == "MessageQueue(topic='T', broker_name='room1@broker-a', queue_id=7)"
    with pytest.raises(dataclasses.FrozenInstanceError):
        mq.queue_id = 8
    clone = pickle.loads(pickle.dumps(mq))
    assert clone == mq and not clone < mq and not mq < clone


def test_message_queue_pickled_to_another_process_hashes_there():
    """The hash is kept per queue; another process (a Spark task) has other str hashes."""
    code = ("import pickle, sys; from rmq_source.group.allocation import MessageQueue as M; "
            "q = pickle.loads(sys.stdin.buffer.read()); "
            "print({M('T\u00e9', 'broker-a', 3): 1}.get(q), M.of('T\u00e9', 'broker-a', 3) == q)")
    out = {subprocess.run([sys.executable, "-c", code], input=pickle.dumps(MessageQueue("T\u00e9", "broker-a", 3)),
                          capture_output=True, check=True, env={**os.environ, "PYTHONHASHSEED": seed}
                          ).stdout.decode().strip() for seed in ("1", "2")}
    assert out == {"1 True"}


@given(st.lists(st.tuples(st.sampled_from(["A", "B", "\uffff", "\U00010000"]), st.sampled_from(["a", "b"]),
                          st.integers(0, (1 << 31) - 1)), max_size=30))
def test_sort_queues_is_java_order(keys):
    mqs = [MessageQueue.of(*k) for k in keys]
    assert sort_queues(mqs) == sorted(mqs)
    with_negative = mqs + [MessageQueue("A", "a", -5)]
    assert sort_queues(with_negative) == sorted(with_negative)


def test_message_queue_order_topic_then_broker_then_queue_id():
    expected = [MessageQueue("A", "b", 2), MessageQueue("A", "b", 10), MessageQueue("A", "c", 0),
                MessageQueue("B", "a", 0)]
    assert sorted(reversed(expected)) == expected


def test_message_queue_order_is_java_utf16_order():
    # Java compares UTF-16 code units: a surrogate pair (0xD800..) sorts before U+FFFF.
    supplementary = MessageQueue("\U00010000", "b", 0)
    bmp_high = MessageQueue("\uffff", "b", 0)
    assert supplementary < bmp_high and bmp_high > supplementary
    assert sorted([bmp_high, supplementary]) == [supplementary, bmp_high]
    assert sorted(["\uffff", "\U00010000"], key=java_string_key) == ["\U00010000", "\uffff"]


def test_message_queue_queue_id_compare_wraps_like_java_int_subtraction():
    low, one = MessageQueue("T", "b", -(1 << 31)), MessageQueue("T", "b", 1)
    assert low.compare_to(one) == 1 and low > one  # (-2**31) - 1 overflows to a positive int
    assert MessageQueue("T", "b", -1) < MessageQueue("T", "b", 0)


@pytest.mark.parametrize("args", [
    (None, "b", 0), ("T", None, 0), ("T", "b", "0"), ("T", "b", True), ("T", "b", 1 << 31),
    ("T", "b", -(1 << 31) - 1),
])
def test_message_queue_rejects_non_java_values(args):
    with pytest.raises(RmqOptionError):
        MessageQueue(*args)


# ------------------------------------------------------------------------------------------------
# Hand-checked results and Java argument checks
# ------------------------------------------------------------------------------------------------

def _queues(n, broker="broker-a", topic="T"):
    return [MessageQueue(topic, broker, i) for i in range(n)]


@pytest.mark.parametrize("strategy, n_queues, cids, expected", [
    (AllocateMessageQueueAveragely(), 5, ["c0", "c1"], {"c0": [0, 1, 2], "c1": [3, 4]}),
    (AllocateMessageQueueAveragely(), 2, ["c0", "c1", "c2"], {"c0": [0], "c1": [1], "c2": []}),
    (AllocateMessageQueueAveragely(), 7, ["c0", "c1", "c2"],
     {"c0": [0, 1, 2], "c1": [3, 4], "c2": [5, 6]}),
    (AllocateMessageQueueAveragelyByCircle(), 5, ["c0", "c1"], {"c0": [0, 2, 4], "c1": [1, 3]}),
    (AllocateMessageQueueAveragelyByCircle(), 2, ["c0", "c1", "c2"], {"c0": [0], "c1": [1], "c2": []}),
])
def test_hand_checked_allocations(strategy, n_queues, cids, expected):
    queues = _queues(n_queues)
    for cid in cids:
        assert strategy.allocate("G", cid, queues, cids) == [queues[i] for i in expected[cid]]


CHECKED = [
    pytest.param(AllocateMessageQueueAveragely(), id="AVG"),
    pytest.param(AllocateMessageQueueAveragelyByCircle(), id="AVG_BY_CIRCLE"),
    pytest.param(AllocateMessageQueueByMachineRoom({"room1"}), id="MACHINE_ROOM"),
    pytest.param(AllocateMachineRoomNearby("AVG"), id="MACHINE_ROOM_NEARBY"),
    pytest.param(AllocateMessageQueueConsistentHash(), id="CONSISTENT_HASH"),
]
QUEUES = _queues(3, broker="room1@broker-a")
CIDS = ["room1@c1", "room1@c2"]


@pytest.mark.parametrize("strategy", CHECKED)
@pytest.mark.parametrize("cid, mq_all, cid_all, message", [
    ("", QUEUES, CIDS, "currentCID is empty"),
    (None, QUEUES, CIDS, "currentCID is empty"),
    ("", [], [], "currentCID is empty"),  # Java checks currentCID first
    ("room1@c1", [], CIDS, "mqAll is null or mqAll empty"),
    ("room1@c1", None, CIDS, "mqAll is null or mqAll empty"),
    ("room1@c1", QUEUES, [], "cidAll is null or cidAll empty"),
    ("room1@c1", QUEUES, None, "cidAll is null or cidAll empty"),
    ("room1@c1", set(QUEUES), CIDS, "mqAll must be a list"),
    ("room1@c1", [("T", "room1@broker-a", 0)], CIDS, r"mqAll\[0\] is not a MessageQueue"),
    ("room1@c1", QUEUES, ["room1@c1", 5], r"cidAll\[1\] is not a str"),
])
def test_java_illegal_arguments_raise(strategy, cid, mq_all, cid_all, message):
    with pytest.raises(RmqAllocationError, match=message):
        strategy.allocate("G", cid, mq_all, cid_all)


@pytest.mark.parametrize("strategy", CHECKED)
def test_consumer_not_in_cid_all_gets_nothing(strategy):
    assert strategy.allocate("G", "room1@other", QUEUES, CIDS) == []
    assert strategy.allocate("G", "room1@c1", QUEUES, CIDS) != []


@pytest.mark.parametrize("cid, machine_room_raises", [
    (" ", True), ("\t\n", True), ("\u2028", True), ("\x1c", True),
    ("\u00a0", False),  # no-break space is not Java whitespace
])
def test_machine_room_rejects_blank_cid_others_only_empty(cid, machine_room_raises):
    machine_room = AllocateMessageQueueByMachineRoom({"room1"})
    if machine_room_raises:
        with pytest.raises(RmqAllocationError, match="currentCID is empty"):
            machine_room.allocate("G", cid, QUEUES, CIDS)
    else:
        assert machine_room.allocate("G", cid, QUEUES, CIDS) == []
    assert AllocateMessageQueueAveragely().allocate("G", cid, QUEUES, CIDS) == []


def test_machine_room_uses_java_split_and_remainder_rule():
    brokers = ["r1@b", "r1@b@", "r1@b@c", "r1@", "@b", "r1", "r2@b", "r1@d"]
    mq_all = sorted(MessageQueue("T", b, q) for b in brokers for q in range(1))
    # Java split drops trailing empties: "r1@b@" -> [r1, b] counts, "r1@" -> [r1] does not,
    # "@b" -> ["", b] counts when "" is a room.
    eligible = [mq for mq in mq_all if mq.broker_name in {"r1@b", "r1@b@", "@b", "r1@d"}]
    strategy = create_strategy("MACHINE_ROOM", consume_rooms={"r1", ""})
    assert strategy.allocate("G", "c", mq_all, ["c"]) == eligible
    # 4 queues over 3 consumers: one each in blocks, the remainder to the first consumer.
    cids = ["c0", "c1", "c2"]
    got = {cid: strategy.allocate("G", cid, mq_all, cids) for cid in cids}
    assert got == {"c0": [eligible[0], eligible[3]], "c1": [eligible[1]], "c2": [eligible[2]]}


def test_config_returns_configured_list_without_checks():
    configured = [MessageQueue("T", "b", 3), ("Other", "x", 1)]
    strategy = AllocateMessageQueueByConfig(configured)
    result = strategy.allocate("G", "", [], [])
    assert result == [MessageQueue("T", "b", 3), MessageQueue("Other", "x", 1)]
    result.clear()
    assert len(strategy.allocate("G", "c", QUEUES, CIDS)) == 2


# ------------------------------------------------------------------------------------------------
# Machine room nearby
# ------------------------------------------------------------------------------------------------

class MappedResolver:
    def __init__(self, rooms):
        self.rooms = rooms

    def broker_deploy_in(self, mq):
        return self.rooms[mq.broker_name]

    def consumer_deploy_in(self, cid):
        return self.rooms[cid]


def test_nearby_visits_consumerless_rooms_in_java_string_order():
    # b1 is in room U+FFFF, b2 in room U+10000: insertion order and Python order put U+FFFF first,
    # Java's TreeMap puts U+10000 first.
    resolver = MappedResolver({"b1": "\uffff", "b2": "\U00010000", "c": "here"})
    mq_all = _queues(2, "b1") + _queues(2, "b2")
    strategy = AllocateMachineRoomNearby("AVG", resolver=resolver)
    assert strategy.allocate("G", "c", mq_all, ["c"]) == mq_all[2:] + mq_all[:2]


def test_nearby_name_and_user_resolver(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS_DIR))
    strategy = create_strategy("machine_room_nearby", inner="avg_by_circle",
                               resolver="alloc_user_strategy:Resolver")
    assert strategy.name == "MACHINE_ROOM_NEARBY-AVG_BY_CIRCLE"
    mq_all = _queues(3, "brokerX") + _queues(2, "brokerY")
    cids = ["c1X", "c2X", "c3Z"]
    # Room X's queues go to its two consumers; room Y has no consumer, so all three share it.
    assert strategy.allocate("G", "c1X", mq_all, cids) == [mq_all[0], mq_all[2], mq_all[3]]
    assert strategy.allocate("G", "c2X", mq_all, cids) == [mq_all[1], mq_all[4]]
    assert strategy.allocate("G", "c3Z", mq_all, cids) == []


@pytest.mark.parametrize("broker, cid, message", [
    ("@broker", "r@c", "Machine room is null for mq"),
    ("@", "r@c", "no part"),
    ("r@broker", "@c", "Machine room is null for consumer id"),
])
def test_nearby_default_resolver_edges(broker, cid, message):
    strategy = AllocateMachineRoomNearby(AllocateMessageQueueAveragely())
    with pytest.raises(RmqAllocationError, match=message):
        strategy.allocate("G", cid, [MessageQueue("T", broker, 0)], [cid])


@pytest.mark.parametrize("room, message", [
    (None, "Machine room is null"), ("", "Machine room is null"), (5, "not a str"),
])
def test_nearby_resolver_bad_answers(room, message):
    resolver = MappedResolver({"b": room, "c": "r"})
    with pytest.raises(RmqAllocationError, match=message):
        AllocateMachineRoomNearby("AVG", resolver).allocate("G", "c", _queues(1, "b"), ["c"])


def test_nearby_resolver_exception_is_wrapped():
    with pytest.raises(RmqAllocationError, match="resolver failed") as info:
        AllocateMachineRoomNearby("AVG", MappedResolver({})).allocate("G", "c", _queues(1, "b"), ["c"])
    assert isinstance(info.value.__cause__, KeyError)


# ------------------------------------------------------------------------------------------------
# Consistent hash: the exact ring
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key, expected", [
    ("", 0xD41D8CD9),  # md5("") = d41d8cd9...
    ("a", 0x0CC175B9),  # md5("a") = 0cc175b9...
    ("é", int.from_bytes(hashlib.md5("é".encode("utf-8")).digest()[:4], "big")),
    ("\ud800", int.from_bytes(hashlib.md5(b"?").digest()[:4], "big")),  # Java encodes a lone surrogate as '?'
])
def test_md5_hash_uses_first_four_digest_bytes(key, expected):
    assert md5_hash(key) == expected


def test_ring_keys_are_cid_dash_replica_and_repeat_cids_continue():
    seen = []

    def recording(key):
        seen.append(key)
        return md5_hash(key)

    mq_all = _queues(2)
    AllocateMessageQueueConsistentHash(2, recording).allocate("G", "a", mq_all, ["a", "b", "a"])
    assert seen == ["a-0", "a-1", "b-0", "b-1", "a-2", "a-3"] + [mq.java_string() for mq in mq_all]


def test_ring_collisions_overwrite_and_replica_count_follows_the_ring():
    seen = []

    def constant(key):
        seen.append(key)
        return 7

    strategy = AllocateMessageQueueConsistentHash(2, constant)
    mq_all = _queues(3)
    # Every virtual node lands on 7; the last put wins. b's nodes evicted all of a's, so the second
    # "a" starts again at replica 0 (RocketMQ counts replicas still on the ring).
    assert strategy.allocate("G", "a", mq_all, ["a", "b", "a"]) == mq_all
    assert seen[:6] == ["a-0", "a-1", "b-0", "b-1", "a-0", "a-1"]
    assert strategy.allocate("G", "b", mq_all, ["a", "b"]) == mq_all
    assert strategy.allocate("G", "a", mq_all, ["a", "b"]) == []


def test_ring_ceiling_is_inclusive_and_wraps_to_smallest_point():
    mq_all = _queues(6)
    points = {"a-0": 100, "b-0": 200}
    points.update({mq.java_string(): h for mq, h in zip(mq_all, [50, 100, 150, 200, 250, -5])})
    strategy = AllocateMessageQueueConsistentHash(1, points.__getitem__)
    assert strategy.allocate("G", "a", mq_all, ["a", "b"]) == [mq_all[i] for i in (0, 1, 4, 5)]
    assert strategy.allocate("G", "b", mq_all, ["a", "b"]) == [mq_all[2], mq_all[3]]


def test_zero_virtual_nodes_allocates_nothing():
    strategy = create_strategy("CONSISTENT_HASH", virtual_node_count=0)
    assert all(strategy.allocate("G", cid, QUEUES, CIDS) == [] for cid in CIDS)


@pytest.mark.parametrize("hash_function, message", [
    (lambda key: "1", "expected an int"),
    (lambda key: 1 << 63, "expected an int"),
    (lambda key: 1 / 0, "hash_function failed"),
])
def test_bad_hash_function_raises(hash_function, message):
    with pytest.raises(RmqAllocationError, match=message):
        AllocateMessageQueueConsistentHash(3, hash_function).allocate("G", "room1@c1", QUEUES, CIDS)


# ------------------------------------------------------------------------------------------------
# create_strategy
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, params, cls, strategy_name", [
    ("AVG", {}, AllocateMessageQueueAveragely, "AVG"),
    ("avg_by_circle", {}, AllocateMessageQueueAveragelyByCircle, "AVG_BY_CIRCLE"),
    ("Config", {"message_queues": QUEUES}, AllocateMessageQueueByConfig, "CONFIG"),
    ("machine_room", {"consume_rooms": ["room1"]}, AllocateMessageQueueByMachineRoom, "MACHINE_ROOM"),
    ("MACHINE_ROOM_NEARBY", {"inner": "CONSISTENT_HASH"}, AllocateMachineRoomNearby,
     "MACHINE_ROOM_NEARBY-CONSISTENT_HASH"),
    ("consistent_hash", {}, AllocateMessageQueueConsistentHash, "CONSISTENT_HASH"),
])
def test_create_strategy_names(name, params, cls, strategy_name):
    strategy = create_strategy(name, **params)
    assert type(strategy) is cls and strategy.name == strategy_name


def test_create_strategy_defaults():
    assert create_strategy("CONSISTENT_HASH").virtual_node_count == 10
    assert create_strategy("CONSISTENT_HASH", virtual_node_count=3).virtual_node_count == 3


VALID = "AVG, AVG_BY_CIRCLE, CONFIG, MACHINE_ROOM, MACHINE_ROOM_NEARBY, CONSISTENT_HASH"


@pytest.mark.parametrize("name, params, message", [
    ("FOO", {}, f"unknown name 'FOO'; valid values: {VALID}"),
    ("", {}, "expected one of AVG"),
    (None, {}, "expected one of AVG"),
    ("AVG", {"virtual_node_count": 3}, "AVG: unknown parameter.*virtual_node_count; valid parameters: none"),
    ("CONSISTENT_HASH", {"virtual_nodes": 3},
     "unknown parameter.*virtual_nodes; valid parameters: virtual_node_count, hash_function"),
    ("CONFIG", {}, "CONFIG: missing required parameter.*message_queues"),
    ("MACHINE_ROOM", {}, "MACHINE_ROOM: missing required parameter.*consume_rooms"),
    ("MACHINE_ROOM_NEARBY", {}, "missing required parameter.*inner"),
    ("MACHINE_ROOM_NEARBY", {"inner": None}, "inner is required"),
    ("MACHINE_ROOM_NEARBY", {"inner": "NOPE"}, "unknown name 'NOPE'"),
    ("MACHINE_ROOM_NEARBY", {"inner": "CONFIG"}, "missing required parameter.*message_queues"),
    ("MACHINE_ROOM_NEARBY", {"inner": object()}, "no allocate"),
    ("MACHINE_ROOM_NEARBY", {"inner": "AVG", "resolver": object()}, "broker_deploy_in"),
    ("CONSISTENT_HASH", {"virtual_node_count": -1}, "virtual_node_count must be an int"),
    ("CONSISTENT_HASH", {"virtual_node_count": "10"}, "virtual_node_count must be an int"),
    ("CONSISTENT_HASH", {"virtual_node_count": True}, "virtual_node_count must be an int"),
    ("CONSISTENT_HASH", {"virtual_node_count": 1 << 31}, "virtual_node_count must be an int"),
    ("CONSISTENT_HASH", {"hash_function": 5}, "hash_function must be callable"),
    ("CONFIG", {"message_queues": "T"}, "message_queues must be a list"),
    ("CONFIG", {"message_queues": [("T", "b")]}, r"message_queues\[0\] must be a MessageQueue"),
    ("MACHINE_ROOM", {"consume_rooms": "room1"}, "consume_rooms must be a set"),
    ("MACHINE_ROOM", {"consume_rooms": {1}}, "consume_rooms entries must be str"),
    ("no_such_module_for_rmq_tests:Cls", {}, "cannot import module 'no_such_module_for_rmq_tests'"),
    ("alloc_user_strategy:Missing", {}, "'alloc_user_strategy:Missing' not found"),
    ("alloc_user_strategy:NoAllocate", {}, "has no allocate"),
    ("alloc_user_strategy:BrokenInit", {}, "cannot create 'alloc_user_strategy:BrokenInit'"),
    ("alloc_user_strategy:EveryNth", {"bogus": 1}, "cannot create.*bogus"),
    ("alloc_user_strategy:", {}, "is not 'package.module:Class'"),
    (":EveryNth", {}, "is not 'package.module:Class'"),
])
def test_create_strategy_option_errors(monkeypatch, name, params, message):
    monkeypatch.syspath_prepend(str(TESTS_DIR))
    with pytest.raises(RmqOptionError, match=message) as info:
        create_strategy(name, **params)
    assert isinstance(info.value, ValueError)


def test_user_strategy_is_loaded_with_params(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS_DIR))
    strategy = create_strategy("alloc_user_strategy:EveryNth", step=2)
    assert isinstance(strategy, UserStrategy) and strategy.name == "EVERY_NTH"
    queues = _queues(5)
    assert strategy.allocate("G", "c1", queues, ["c0", "c1"]) == [queues[1], queues[3]]
    nearby = create_strategy("MACHINE_ROOM_NEARBY", inner="alloc_user_strategy:EveryNth")
    assert nearby.name == "MACHINE_ROOM_NEARBY-EVERY_NTH"


@pytest.mark.parametrize("spec, message, cause", [
    ("alloc_user_strategy:Failing", "alloc_user_strategy:Failing failed", KeyError),
    ("alloc_user_strategy:ReturnsTuple", "returned tuple, expected a list", None),
    ("alloc_user_strategy:ReturnsForeignQueue", "not in mq_all", None),
    ("alloc_user_strategy:ReturnsStrings", "not a MessageQueue", None),
])
def test_user_strategy_failures_raise(monkeypatch, spec, message, cause):
    monkeypatch.syspath_prepend(str(TESTS_DIR))
    strategy = create_strategy(spec)
    with pytest.raises(RmqAllocationError, match=message) as info:
        strategy.allocate("G", "room1@c1", QUEUES, CIDS)
    if cause is not None:
        assert isinstance(info.value.__cause__, cause)
    # Behind the nearby proxy the failure still surfaces instead of an empty allocation.
    with pytest.raises(RmqAllocationError, match=message):
        create_strategy("MACHINE_ROOM_NEARBY", inner=spec).allocate("G", "room1@c1", QUEUES, CIDS)


def test_slot_allocation_is_memoized_only_for_built_in_strategies():
    """The planner remembers a built-in strategy's allocation (a pure function of its arguments)
    and asks a user's strategy every time, and both give the same answer as a fresh call."""
    from rmq_source.spark.planner import allocate_slots

    class Counting:
        calls = 0

        def allocate(self, consumer_group, current_cid, mq_all, cid_all):
            Counting.calls += 1
            return list(mq_all[cid_all.index(current_cid)::len(cid_all)])

    mqs = [MessageQueue("T", "b", q) for q in range(6)]
    slots = ["s0", "s1"]
    user = Counting()
    first = allocate_slots(mqs, user, "G", slots)
    assert allocate_slots(list(reversed(mqs)), user, "G", slots) == first
    assert Counting.calls == 4  # two slots, asked twice
    built_in = AllocateMessageQueueAveragely()
    got = allocate_slots(mqs, built_in, "G", slots)
    got["s0"].clear()  # a caller changing its copy does not change the remembered answer
    assert allocate_slots(mqs, built_in, "G", slots) == {"s0": mqs[:3], "s1": mqs[3:]}


ONE_PASS = {
    "AVG": {}, "AVG_BY_CIRCLE": {}, "CONSISTENT_HASH": {"virtual_node_count": 3},
    "MACHINE_ROOM": {"consume_rooms": ["r1", "r3"]},
    "MACHINE_ROOM_NEARBY": {"inner": "AVG"}, "MACHINE_ROOM_NEARBY-HASH": {"inner": "CONSISTENT_HASH"},
}


@settings(max_examples=600, deadline=None)
@given(n_mq=st.integers(0, 40),
       cids=st.lists(st.sampled_from(["c1", "c2", "r1@c3", "r2@c10", "r1@a", "", " ", "r3@x"]), max_size=8),
       brokers=st.lists(st.sampled_from(["b", "r1@b", "r2@b", "r3@b", "r1@b@c"]), min_size=1, max_size=3),
       name=st.sampled_from(sorted(ONE_PASS)))
def test_allocate_all_answers_as_allocate_for_each_consumer(n_mq, cids, brokers, name):
    """The one-pass allocation of every consumer equals RocketMQ's per-consumer one, errors
    included (an empty or blank consumer id, empty lists), duplicate ids too."""
    strategy = create_strategy(name.removesuffix("-HASH"), **ONE_PASS[name])
    mqs = [MessageQueue("T", brokers[i % len(brokers)], i) for i in range(n_mq)]

    def outcome(fn):
        try:
            return fn()
        except RmqAllocationError as exc:
            return ("error", str(exc))
    loop = outcome(lambda: {c: strategy.allocate("g", c, mqs, cids) for c in cids})
    assert outcome(lambda: strategy.allocate_all("g", mqs, cids)) == loop
