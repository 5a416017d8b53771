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
