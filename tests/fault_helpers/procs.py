"""Process handling shared by the fault tests: start helpers in their own process group, wait with
deadlines, kill -9 a whole group (the helper and every process it started, e.g. Spark's JVM)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import spark_archive

HELPERS = Path(__file__).resolve().parent
REPO = HELPERS.parents[1]


def start(script: str, args: list[str], log_dir: Path, name: str, env: dict | None = None
          ) -> subprocess.Popen:
    """Run ``fault_helpers/<script>`` with this interpreter in a new session (own process group);
    stdout/stderr go to ``log_dir/<name>.out`` / ``.err``."""
    if script in ("stream_query.py", "cluster_query.py"):
        spark_archive.ensure()            # their Spark drivers start from the run's CDS archive
    full_env = dict(os.environ)
    full_env["PYSPARK_PYTHON"] = sys.executable
    full_env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [str(REPO), str(REPO / "tests")]
    if full_env.get("PYTHONPATH"):
        paths.append(full_env["PYTHONPATH"])
    full_env["PYTHONPATH"] = os.pathsep.join(paths)
    if env:
        full_env.update(env)
    out = open(log_dir / f"{name}.out", "ab")
    err = open(log_dir / f"{name}.err", "ab")
    try:
        return subprocess.Popen([sys.executable, str(HELPERS / script), *args], stdout=out,
                                stderr=err, cwd=str(REPO), env=full_env, start_new_session=True)
    finally:
        out.close()
        err.close()


def tail(log_dir: Path, name: str, n: int = 4000) -> str:
    parts = []
    for ext in ("out", "err"):
        p = log_dir / f"{name}.{ext}"
        if p.exists():
            parts.append(f"--- {p.name} ---\n" + p.read_text(errors="replace")[-n:])
    return "\n".join(parts)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group this test started (the helper and its children), then reap."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def stop(proc: subprocess.Popen, timeout: float = 60) -> int:
    """SIGTERM the helper and wait for a clean exit; kill -9 the group if it does not come."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise


def wait_for(cond: Callable[[], object], timeout: float, what: str,
             proc: subprocess.Popen | None = None, interval: float = 0.05):
    """Poll ``cond`` until it returns something truthy; fail after ``timeout`` seconds, or at once
    when ``proc`` exits first."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the helper exited early with code {proc.returncode}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout:.0f} s")
        time.sleep(interval)


def read_jsonl(path: Path) -> list[dict]:
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line))
    return out
