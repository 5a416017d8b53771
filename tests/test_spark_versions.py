"""The Spark-facing tests on every older PySpark minor the package supports, each in its own venv
(tests/spark_versions.py): the suite itself runs on the newest.

- 4.0 (the oldest: no admission control, no AvailableNow for Python sources, no pushdown, no
  Arrow stream writer): streaming reads, admission, AvailableNow, consumer groups and ordered
  queries (store and live), the sink, a live line; of the batch tests a full read and the option
  errors (the other batch options are planned by our code alike on every version);
- 4.1 and 4.2: the smoke set in store mode (a batch read, the version checks; on 4.2, whose
  admission control is the newest's, an AvailableNow stream with a rate limit). The live code asks Spark nothing the store mode does not (its
  reads, groups and the sink are tested on 4.0 and on the newest), so these runs start no broker;
  4.1 has 4.0's features and 4.2 the newest's (rmq_source.spark.compat), whose streams, restarts
  and groups are tested there.

Each run is one pytest process of that venv's Python over the checkout, with the same strict
settings as the suite's (a skip for a missing prerequisite fails). A new Spark API used without a
fallback fails here. The test id names the RocketMQ line the run uses.
"""
from __future__ import annotations

import os

import pytest

import phase_timings
import rocketmq_cluster
import spark_archive
import spark_versions

from test_spark_compat import EXPECT_ENV  # noqa: E402

# (the tests tests/test_spark_compat.py tests without a broker, on every version)
_COMPAT = "tests/test_spark_compat.py"
_BATCH = "tests/test_spark_batch.py::test_full_read_has_the_schema_and_every_message"
_BATCH_ERRORS = "tests/test_spark_batch.py::test_bad_options_fail_with_a_clear_error"

# (the group and restart streams of test_spark_compat run on 4.0 and the newest; 4.1 streams
# nothing: it has 4.0's features, rmq_source.spark.compat)
_NO_GROUP_STREAMS = "not group_stream_resumes and not group_runs_resume and not reads_what_was_there"
RUNS = [
    pytest.param("4.0", "4.9", [_COMPAT, _BATCH, _BATCH_ERRORS, "tests/test_spark_stream.py"], "",
                 id="pyspark-4.0-rocketmq-4.9"),
    pytest.param("4.1", None, [_COMPAT, _BATCH], f"{_NO_GROUP_STREAMS} and not available_now",
                 id="pyspark-4.1-store"),
    pytest.param("4.2", None, [_COMPAT, _BATCH], _NO_GROUP_STREAMS, id="pyspark-4.2-store"),
]


@pytest.mark.slow
@pytest.mark.broker
@pytest.mark.parametrize("minor, line, selection, narrower", RUNS)
def test_the_spark_facing_tests_pass_on(minor, line, selection, narrower, rocketmq_jars, tmp_path):
    """``line``: the RocketMQ line of the run's broker tests (None: none run); ``narrower``: a
    ``-k`` expression of the tests left out."""
    if line is not None:
        rocketmq_jars(line)          # Java and Maven (the inner run needs them too)
        only = ["-k", f"not rocketmq-{'5.3' if line == '4.9' else '4.9'}"]
    else:
        only = ["-m", "not broker", "-k", narrower]
    version = spark_versions.NEWEST_PATCHES[minor]
    python = spark_versions.venv_for(version, rocketmq_cluster.cache_root())
    env = {k: v for k, v in os.environ.items()
           if k not in (spark_archive.ENV, phase_timings.ENV)}      # its own Spark, its own timings
    env[EXPECT_ENV] = version      # (test_spark_compat checks that this PySpark is the one running)
    # no class-data archive: making one costs more than the few Spark starts of a run save
    env[spark_archive.ENV] = str(tmp_path / "none.jsa")
    (tmp_path / "none.tried").touch()
    with phase_timings.timed("older PySpark test run", version):
        out = spark_versions.run_pytest(python, [*selection, *only, "--timeout", "900"], timeout=1800, env=env)
    summary = out.stdout.strip().splitlines()[-1:] or ["(no output)"]
    assert out.returncode == 0, (f"pyspark {version}: {summary[0]}\n{out.stdout[-8000:]}\n"
                                 f"{out.stderr[-3000:]}")
    assert " passed" in summary[0], summary
