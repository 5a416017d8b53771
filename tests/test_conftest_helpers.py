"""conftest's prerequisite and error helpers: skip locally, fail under CI; Spark-wrapped errors."""
from __future__ import annotations

import pytest

from conftest import raises_rmq, require, strict
from rmq_source.errors import RmqCorruptStoreError, RmqDataLossError, RmqSourceError


@pytest.fixture
def local(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("RMQ_REQUIRE_ALL_TESTS", raising=False)


@pytest.mark.parametrize("what", ["no_such_module_xyz", "cmd:no-such-tool-xyz", None, 0])
def test_a_missing_prerequisite_skips_locally(local, what):
    assert not strict()
    with pytest.raises(pytest.skip.Exception, match="needed here"):
        require(what, "needed here")


@pytest.mark.parametrize("env", [{"CI": "true"}, {"RMQ_REQUIRE_ALL_TESTS": "1"},
                                 {"CI": "true", "RMQ_REQUIRE_ALL_TESTS": "yes"}])
@pytest.mark.parametrize("what", ["no_such_module_xyz", "cmd:no-such-tool-xyz", None])
def test_a_missing_prerequisite_fails_under_ci(local, monkeypatch, env, what):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert strict()
    with pytest.raises(pytest.fail.Exception, match="needed here"):
        require(what, "needed here")


def test_require_all_tests_0_overrides_ci(local, monkeypatch):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("RMQ_REQUIRE_ALL_TESTS", "0")
    assert not strict()


def test_a_present_prerequisite_is_returned(local):
    assert require("json", "std").dumps([1]) == "[1]"
    assert require("cmd:sh", "posix").endswith("/sh")
    assert require(42, "a condition") == 42


class _Wrapped(Exception):
    """Stands for a Spark error that carries a Python task's traceback as text."""


_Wrapped.__module__ = "pyspark.errors.exceptions.captured"


def test_raises_rmq_takes_the_class_or_a_spark_error_naming_it():
    with raises_rmq(RmqDataLossError, match=r"\[2, 5\)") as info:
        raise RmqDataLossError("offsets [2, 5) (3 messages)")
    assert isinstance(info.value, RmqDataLossError)
    with raises_rmq(RmqSourceError) as info:           # a subclass, wrapped
        raise _Wrapped("rmq_source.errors.RmqDataLossError: offsets [2, 5)")
    assert "RmqDataLossError" in info.text


@pytest.mark.parametrize("error", [
    _Wrapped("rmq_source.errors.RmqCorruptStoreError: BAD_MAGIC"),    # Spark, another class
    RuntimeError("RmqDataLossError, but not from Spark"),
    RmqCorruptStoreError("bad"),
], ids=["spark-other-class", "not-spark", "other-class"])
def test_raises_rmq_lets_other_errors_through(error):
    with pytest.raises(type(error)) as outer:
        with raises_rmq(RmqDataLossError):
            raise error
    assert outer.value is error


def test_raises_rmq_fails_when_nothing_is_raised_or_the_text_differs():
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        with raises_rmq(RmqDataLossError):
            pass
    with pytest.raises(pytest.fail.Exception, match="does not match"):
        with raises_rmq(RmqDataLossError, match="queue 7"):
            raise RmqDataLossError("queue 3")


class _Query:
    def __init__(self, active, error=None):
        self.isActive, self._error = active, error

    def exception(self):
        return self._error


@pytest.mark.parametrize("query, restarted, fails", [
    (_Query(True), False, False),
    (_Query(False), False, False),   # stopped by the test
    (_Query(False, RuntimeError("py4j ... Python worker failed to connect back.")), True, False),
    (_Query(False, RuntimeError("Timed out while waiting for the Python worker to connect back "
                                "after 10000 ms")), True, False),
    (_Query(False, RuntimeError("RmqLockError: queue held by c2")), False, True),
])
def test_revive_restarts_only_queries_spark_could_not_start(query, restarted, fails):
    from fault_helpers.queries import revive
    queries, again = {"c1": query}, _Query(True)
    if fails:
        with pytest.raises(AssertionError, match="query c1 failed: RmqLockError"):
            revive(queries, lambda name: again)
    else:
        revive(queries, lambda name: again)
    assert (queries["c1"] is again) == restarted


def test_revive_restarts_one_query_per_call():
    from fault_helpers.queries import revive
    dead = RuntimeError("Python worker failed to connect back.")
    queries = {name: _Query(False, dead) for name in ("c1", "c2")}
    revive(queries, lambda name: _Query(True))
    assert [q.isActive for q in queries.values()] == [True, False]
    revive(queries, lambda name: _Query(True))
    assert [q.isActive for q in queries.values()] == [True, True]


@pytest.mark.parametrize("ephemeral, span, expected", [
    ((32768, 60999), (0,), range(10000, 32768)),             # Linux's default: below it
    ((32768, 60999), (-2, 0, 1), range(10002, 32767)),       # a broker's ports all below it
    ((1024, 40000), (0,), range(40001, 65536)),              # a low range: above it
    ((1024, 65000), (0,), range(20000, 59000)),              # no room outside it: as before
])
def test_free_ports_stay_out_of_the_ephemeral_range(monkeypatch, ephemeral, span, expected):
    import rocketmq_cluster
    monkeypatch.setattr(rocketmq_cluster, "_ephemeral_range", lambda: ephemeral)
    assert rocketmq_cluster._port_choices(span) == expected


def test_free_ports_are_not_ports_outgoing_connections_take():
    import rocketmq_cluster
    low, high = rocketmq_cluster._ephemeral_range()
    for _ in range(20):
        port = rocketmq_cluster.free_port((-2, 0, 1))
        assert not any(low <= port + d <= high for d in (-2, 0, 1)), (port, low, high)


class _Item:
    def __init__(self, nodeid: str, lines):
        self.nodeid, self._lines = nodeid, lines

    def get_closest_marker(self, name):
        assert name == "lines"
        return None if self._lines is None else pytest.mark.lines(*self._lines).mark


@pytest.mark.parametrize("nodeid, lines, every_line, other", [
    ("t.py::test_x[rocketmq-4.9]", ("5.3",), "", True),
    ("t.py::test_x[rocketmq-5.3]", ("5.3",), "", False),
    ("t.py::test_x[rocketmq-4.9-route]", ("4.9", "5.3"), "", False),
    ("t.py::test_x[rocketmq-4.9]", ("5.3",), "1", False),       # RMQ_EVERY_LINE=1 runs it anyway
    ("t.py::test_x[rocketmq-4.9]", None, "", False),            # not marked
    ("t.py::test_store_only", ("5.3",), "", False),             # no line in its id
])
def test_a_test_marked_lines_runs_on_those_lines_only(monkeypatch, nodeid, lines, every_line, other):
    from conftest import EVERY_LINE_ENV, _on_other_line
    monkeypatch.setenv(EVERY_LINE_ENV, every_line)
    assert _on_other_line(_Item(nodeid, lines)) is other
