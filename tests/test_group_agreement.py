"""Every query of a consumer group must share its allocation strategy and subscription (as
RocketMQ requires): a query whose options differ from a live member's is refused when it joins."""
from __future__ import annotations

import pytest
from rmq_source.spark.compat import ReadAllAvailable

from rmq_source.errors import RmqOptionError
from rmq_source.spark.options import parse_options
from rmq_source.spark.stream_reader import RmqStreamReader
from store_builder import build_store

BASE = {"topic": "T", "consumerGroup": "GA", "startingOffsets": "earliest", "orderly": "false"}


@pytest.fixture()
def store(tmp_path):
    root = tmp_path / "store"
    build_store(root, topics=(("T", 4, 40), ("U", 2, 10)))
    return root


def _reader(store, client, **options):
    opts = {"storePath": str(store), **BASE, "clientId": client, **options}
    return RmqStreamReader(parse_options(opts, streaming=True))


def _join(reader):
    start = reader.initialOffset()
    return reader.latestOffset(start, ReadAllAvailable())


@pytest.mark.parametrize("first, second, message", [
    ({"allocateStrategy": "AVG"}, {"allocateStrategy": "AVG_BY_CIRCLE"},
     "option allocateStrategy='AVG_BY_CIRCLE' differs from allocateStrategy='AVG'"),
    ({"subExpression": "TagA"}, {"subExpression": "TagA || TagB"},
     "option subExpression='TagA || TagB' differs from subExpression='TagA'"),
    ({"orderly": "true"}, {"orderly": "false"}, "option orderly='false' differs from orderly='true'"),
    ({"allocateStrategy": "CONSISTENT_HASH", "virtualNodeCount": "10"},
     {"allocateStrategy": "CONSISTENT_HASH", "virtualNodeCount": "20"},
     "option virtualNodeCount='20' differs from virtualNodeCount='10'"),
    ({}, {"topic": "T,U"}, "option topic='T,U' differs from topic='T'"),
    ({}, {"topic": None, "topicPattern": "T.*"}, "option topic not given differs from topic='T'"),
])
def test_a_member_with_other_options_is_refused(store, first, second, message):
    a = _reader(store, "a", **first)
    try:
        _join(a)
        second = {k: v for k, v in second.items() if v is not None}
        opts = {"storePath": str(store), **BASE, "clientId": "b", **second}
        if "topicPattern" in second:
            del opts["topic"]
        b = RmqStreamReader(parse_options(opts, streaming=True))
        with pytest.raises(RmqOptionError, match="live member 'a'") as err:
            _join(b)
        assert message in str(err.value)
        assert "GA" in str(err.value)
        assert "b" not in a.session.membership.members()
    finally:
        a.stop()


def test_same_options_join_and_a_gone_member_does_not_bind(store):
    a = _reader(store, "a", allocateStrategy="AVG")
    b = _reader(store, "b", allocateStrategy="AVG")
    try:
        _join(a)
        _join(b)
        assert sorted(a.session.membership.live_clients()) == ["a", "b"]
    finally:
        a.stop()
        b.stop()
    # the group is empty again: a query with other options may now form it anew
    c = _reader(store, "c", allocateStrategy="AVG_BY_CIRCLE")
    try:
        _join(c)
        assert c.session.membership.live_clients() == ["c"]
    finally:
        c.stop()


def test_config_queues_may_differ_per_member(store):
    """CONFIG gives each member the queues it lists, so the lists differ by design."""
    q = '{"T": {"broker-a": [%s]}}'
    a = _reader(store, "a", allocateStrategy="CONFIG", allocateQueues=q % "0, 1")
    b = _reader(store, "b", allocateStrategy="CONFIG", allocateQueues=q % "2, 3")
    try:
        _join(a)
        _join(b)
        assert sorted(b.session.membership.live_clients()) == ["a", "b"]
    finally:
        a.stop()
        b.stop()
