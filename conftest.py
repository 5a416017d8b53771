"""Shared pytest fixtures: one local Spark session for the whole run, fixture paths, temp stores."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Spark's Python workers must run the interpreter that runs the tests.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")

REPO = Path(__file__).resolve().parent
SHARED_FIXTURES = REPO.parent / "shared" / "fixtures"


def fixture_dir(name: str) -> Path:
    """A RocketMQ-written fixture folder under ../shared/fixtures; skips when it is absent."""
    path = SHARED_FIXTURES / name
    if not path.is_dir():
        pytest.skip(f"reference fixtures not found at {path} (the steering repo's shared/ folder "
                    "must sit beside this checkout)")
    return path


@pytest.fixture(scope="session")
def spark():
    """The one local Spark session of the test run (local[2], no UI, small shuffles)."""
    pyspark_sql = pytest.importorskip("pyspark.sql")
    session = (
        pyspark_sql.SparkSession.builder.master("local[2]")
        .appName("rmq_source-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    from rmq_source import RocketMQDataSource
    session.dataSource.register(RocketMQDataSource)
    yield session
    session.stop()


# ----------------------------------------------------------------------------- real RocketMQ servers
sys.path.insert(0, str(REPO / "tests"))
import rocketmq_cluster  # noqa: E402

BROKER_LINES = ("4.9", "5.3")


def broker_unavailable(reason: str):
    """Skip a broker test, or fail it when RMQ_REQUIRE_BROKER=1 (CI must run them)."""
    if os.environ.get(rocketmq_cluster.REQUIRE_ENV) == "1":
        pytest.fail(f"{reason} (RMQ_REQUIRE_BROKER=1 forbids skipping the broker tests)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def rocketmq_jars():
    """line -> (version, jar folder), resolved on first use; failures skip (or fail) per line."""
    cache: dict = {}

    def get(line: str):
        if line not in cache:
            try:
                cache[line] = rocketmq_cluster.resolve_line(line)
            except rocketmq_cluster.BrokerUnavailable as exc:
                cache[line] = exc
        if isinstance(cache[line], Exception):
            broker_unavailable(str(cache[line]))
        return cache[line]
    return get


@pytest.fixture(scope="session", params=BROKER_LINES, ids=lambda line: f"rocketmq-{line}")
def rocketmq(request, rocketmq_jars, tmp_path_factory):
    """A running NameServer and broker ``broker-a`` of one version, shared by the whole session."""
    version, jars = rocketmq_jars(request.param)
    workdir = tmp_path_factory.mktemp(f"rocketmq-{version}")
    cluster = rocketmq_cluster.Cluster(version, jars, workdir)
    try:
        cluster.start()
    except rocketmq_cluster.ServerError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield cluster
    cluster.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed broker test prints the server log tails (the logs stay in the session's tmp dir)."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        cluster = getattr(item, "funcargs", {}).get("rocketmq")
        if isinstance(cluster, rocketmq_cluster.Cluster):
            report.sections.append(("RocketMQ server logs", f"workdir {cluster.workdir}\n"
                                    + cluster.log_tails()))
