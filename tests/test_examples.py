"""The main demo (the README's first command) runs to its end as a user runs it, on loopback only:
Spark does not warn that it moved off loopback, and no process it starts (Spark's JVM and
workers) listens or talks on another address while it runs. (examples/stream_live_to_parquet.py
starts its RocketMQ servers with tests/rocketmq_cluster.py, whose every boot is checked the same
way; the script itself is left out for the suite's time budget.)"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import loopback
import spark_archive

REPO = Path(__file__).resolve().parents[1]
#: Spark's warning when it binds the driver to a network interface instead of loopback
#: (org.apache.spark.util.Utils.findLocalInetAddress)
MOVED_OFF_LOOPBACK = "resolves to a loopback address"

EXAMPLES = [
    pytest.param("demo.py", ["--messages", "4000"], "done: store, sink and checkpoint", id="demo"),
]


@pytest.mark.slow
@pytest.mark.parametrize("script, args, last_words", EXAMPLES)
def test_example_runs_on_loopback_only(script, args, last_words, tmp_path):
    args = [*args, "--workdir", str(tmp_path / "demo")]
    spark_archive.ensure()
    # the suite's lean JVM flags and class-data archive (the JVM's own options: the script is as is)
    env = dict(os.environ, JDK_JAVA_OPTIONS=spark_archive.java_options())
    code, output, offenders = loopback.run_watched([sys.executable, script, *args], timeout=600,
                                                   cwd=REPO / "examples", env=env)
    assert code == 0, output[-4000:]
    assert last_words in output, output[-4000:]
    assert MOVED_OFF_LOOPBACK not in output, output[-4000:]
    assert offenders == [], offenders
