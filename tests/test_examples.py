"""The examples run to their end as a user runs them, on loopback only: Spark does not warn that
it moved off loopback, and no process they start (Spark's JVM and workers, the RocketMQ servers
of the live example) listens or talks on another address while they run."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import loopback

REPO = Path(__file__).resolve().parents[1]
#: Spark's warning when it binds the driver to a network interface instead of loopback
#: (org.apache.spark.util.Utils.findLocalInetAddress)
MOVED_OFF_LOOPBACK = "resolves to a loopback address"

EXAMPLES = [
    pytest.param("demo.py", ["--messages", "4000"], "done: store, sink and checkpoint", id="demo"),
    pytest.param("stream_live_to_parquet.py", [], "2000 messages in", id="stream_live_to_parquet",
                 marks=pytest.mark.broker),
]


@pytest.mark.slow
@pytest.mark.parametrize("script, args, last_words", EXAMPLES)
def test_example_runs_on_loopback_only(script, args, last_words, tmp_path, request):
    if script.startswith("stream_live"):
        # Java and Maven, or skip (fail under RMQ_REQUIRE_BROKER=1); the jars are then cached
        request.getfixturevalue("rocketmq_jars")("5.3")
        args = [*args, "--out", str(tmp_path / "out")]
    else:
        args = [*args, "--workdir", str(tmp_path / "demo")]
    code, output, offenders = loopback.run_watched([sys.executable, script, *args], timeout=600,
                                                   cwd=REPO / "examples")
    assert code == 0, output[-4000:]
    assert last_words in output, output[-4000:]
    assert MOVED_OFF_LOOPBACK not in output, output[-4000:]
    assert offenders == [], offenders
