"""Spark's own server processes started by tests (a standalone Master and Worker, a Connect
server): where pyspark's launcher is, and waiting for a started server to be ready."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Callable


def spark_home() -> Path:
    """pyspark's installed folder: SPARK_HOME for its bin/spark-class and bin/spark-submit."""
    import pyspark
    return Path(pyspark.__file__).parent


def wait_ready(proc: subprocess.Popen, log: Path, ready: Callable[[], bool], what: str,
               timeout: float = 180) -> None:
    """Wait until ``ready()``; fail with the tail of ``log`` if ``proc`` exits or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not ready():
        tail = log.read_text(errors="replace")[-3000:]
        assert proc.poll() is None, f"{what} exited with {proc.returncode}:\n{tail}"
        assert time.monotonic() < deadline, f"{what} not ready after {timeout} s:\n{tail}"
        time.sleep(0.2)
