"""A class-data sharing archive (AppCDS) for the Spark JVMs a test run starts.

A Spark driver loads some 10,000 classes at start; mapped from an archive instead of parsed and
verified again, a local session starts in about half the time (3 s instead of 6 here), and a run
starts dozens (the test process's session and the helpers of the fault tests). The archive is
made once per test run, on the first Spark start, by a throwaway session started and stopped with
``-XX:ArchiveClassesAtExit`` (about 10 s), in a temporary folder of the run: it fits only this
interpreter's pyspark jars and this JVM. The JVMs then get ``-XX:SharedArchiveFile``; a JVM that
cannot use it (another JDK, another class path) runs without it, as without the option.

``$RMQ_SPARK_CDS`` carries the archive's path to helper processes and pytest-xdist workers
(inherited with the environment); the first of them to need it makes it under a file lock, the
others wait for it. :func:`java_options` is what a Spark start adds to
``spark.driver.extraJavaOptions``: the archive, and the C1 compiler alone with the serial
collector (:data:`LEAN_JVM`). The run's folder holds the RocketMQ JVMs' archives too
(tests/rocketmq_archive.py), made once a run by :func:`once` as this one is.
"""
from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import phase_timings

ENV = "RMQ_SPARK_CDS"

_MAKER = """
import sys
from pyspark import SparkContext
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[2]").appName("rmq-cds-archive")
         .config("spark.ui.enabled", "false")
         .config("spark.driver.extraJavaOptions", "-XX:ArchiveClassesAtExit=" + sys.argv[1])
         .getOrCreate())
spark.createDataFrame([(1, b"x")], "a int, b binary").groupBy("a").count().collect()
jvm = SparkContext._gateway.proc
spark.stop()
try:      # the archive is written when the JVM exits by itself, not when it is killed
    SparkContext._jvm.java.lang.System.exit(0)
except Exception:
    pass
jvm.wait(120)
"""


#: A test's Spark JVM runs small queries on a 2-core machine that the suite keeps busy: C2's
#: compiler threads and G1's concurrent ones cost more CPU than they save there (measured on the
#: Spark test files in one process: 27 % less CPU, 18 % less wall time with these two flags).
LEAN_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def java_options() -> str:
    """The extra Java options of a test's Spark JVM: :data:`LEAN_JVM`, and the archive when
    there is one."""
    path = os.environ.get(ENV)
    if not path or not os.path.isfile(path):
        return LEAN_JVM
    return f"{LEAN_JVM} -XX:SharedArchiveFile={path} -Xlog:cds=off -Xlog:cds+dynamic=off"


def choose_path() -> None:
    """Name the run's archive (in a new temporary folder, removed when this process exits)
    unless a parent process named it; made later by :func:`ensure`."""
    if os.environ.get(ENV) is None:
        folder = tempfile.mkdtemp(prefix="rmq-spark-cds-")
        atexit.register(_remove, folder, os.getpid())
        os.environ[ENV] = str(Path(folder) / "spark.jsa")


def _remove(folder: str, owner: int) -> None:
    if os.getpid() == owner:        # (not in a forked child)
        shutil.rmtree(folder, True)


def ensure() -> None:
    """Make the run's archive unless it exists or was tried (once per run, whichever process
    comes first; a failure only means Spark starts without one)."""
    choose_path()
    path = Path(os.environ[ENV])
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)

    def make() -> None:
        subprocess.run([sys.executable, "-c", _MAKER, str(path)], env=env, timeout=300,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=path.parent)

    once(path, "Spark class-data archive (once a run)", make)


def run_folder() -> Path:
    """The run's folder of class-data archives (shared by its processes)."""
    choose_path()
    return Path(os.environ[ENV]).parent


def once(path: Path, phase: str, make) -> None:
    """Call ``make()`` (which writes the archive ``path``) unless it was called for ``path`` in
    this run, by any of its processes: the first to come makes it under a file lock, the others
    wait for it. An error of ``make`` (OSError, a timeout) only means no archive: the JVMs then
    start without one."""
    tried = path.with_suffix(".tried")
    if tried.exists():
        return
    try:
        lock = open(path.with_suffix(".lock"), "w")
    except OSError:
        return              # (the run's folder is gone: a helper outliving its run)
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)          # another process may be making it: wait
        if tried.exists():
            return
        with phase_timings.timed(phase):
            try:
                make()
            except (OSError, subprocess.SubprocessError):
                pass
        tried.touch()       # also when it was not written (java_options then leaves it out)
