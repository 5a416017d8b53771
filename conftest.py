"""Shared pytest fixtures: one local Spark session for the whole run, fixture paths, temp stores.

Reference fixtures (stores written by RocketMQ 4.9.3 and 5.3.3, with their answer files) come from
``../shared/fixtures`` when the steering repo's ``shared/`` folder sits beside this checkout, and
otherwise from the embedded copy ``tests/fixtures/reference.tar.xz``, extracted once per test session
into a temporary folder (read-only, like the shared copy). ``RMQ_FIXTURES`` overrides the choice:
``embedded`` always uses the embedded copy, a path uses that folder.

Strict mode (``CI=true``, or ``RMQ_REQUIRE_ALL_TESTS=1`` which ``.ci/run`` exports): a missing
prerequisite (fixture, tool, Python package) fails the test instead of skipping it. Tests ask
for prerequisites through :func:`require` (or :func:`missing`), never through ``pytest.skip``.
"""
from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import re
import shutil
import stat
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import NoReturn

import pytest

# Spark's Python workers must run the interpreter that runs the tests.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")
# Everything the suite starts listens and talks on loopback only: the Spark JVMs (local sessions,
# helpers' sessions, standalone Master/Workers, Connect servers: all inherit this) bind and
# advertise 127.0.0.1 instead of the machine's network interface. tests/loopback.py checks it.
LOOPBACK = "127.0.0.1"
os.environ["SPARK_LOCAL_IP"] = LOOPBACK

REPO = Path(__file__).resolve().parent
SHARED_FIXTURES = REPO.parent / "shared" / "fixtures"
EMBEDDED_ARCHIVE = REPO / "tests" / "fixtures" / "reference.tar.xz"


# -- prerequisites: skip locally, fail in CI ---------------------------------------------------

def strict() -> bool:
    """True under CI (``CI=true``) or with ``RMQ_REQUIRE_ALL_TESTS=1``: nothing may skip for a
    missing prerequisite."""
    flag = os.environ.get("RMQ_REQUIRE_ALL_TESTS", "").strip().lower()
    if flag:
        return flag not in ("0", "false", "no")
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def missing(why: str) -> NoReturn:
    """A prerequisite is missing: skip the test (or module) locally, fail it in strict mode."""
    if strict():
        pytest.fail(f"{why} [a missing prerequisite fails under CI / RMQ_REQUIRE_ALL_TESTS=1]",
                    pytrace=False)
    pytest.skip(why, allow_module_level=True)


def require(what, why: str = ""):
    """The prerequisite ``what``, or :func:`missing`.

    ``what`` is a module name (``"atheris"``, ``"pyspark.sql"``: the module is returned), ``"cmd:NAME"``
    (an executable on PATH: its path is returned), or any other value, used as a condition (returned
    when truthy, e.g. a path found by the caller).
    """
    if isinstance(what, str) and what.startswith("cmd:"):
        found = shutil.which(what[4:])
        if found is None:
            missing(f"{what[4:]} is not on PATH" + (f": {why}" if why else ""))
        return found
    if isinstance(what, str):
        try:
            return importlib.import_module(what)
        except ImportError as exc:
            missing(f"cannot import {what} ({exc})" + (f": {why}" if why else ""))
    if not what:
        missing(why or "a prerequisite is missing")
    return what


# -- errors that may come back wrapped by Spark -----------------------------------------------

def _class_names(cls: type) -> set[str]:
    names = {cls.__name__}
    for sub in cls.__subclasses__():
        names |= _class_names(sub)
    return names


class RaisesInfo:
    value: BaseException | None = None
    text: str = ""


@contextlib.contextmanager
def raises_rmq(cls: type, match: str | None = None):
    """``pytest.raises(cls, match=...)`` that also accepts ``cls`` (or a subclass) raised inside
    Spark (a Python task or the planner) and handed back wrapped in a Spark/Py4J error: then the
    wrapper's text must name the class. ``info.text`` is the error's text either way."""
    import re
    info = RaisesInfo()
    try:
        yield info
    except cls as exc:
        info.value, info.text = exc, str(exc)
    except Exception as exc:  # noqa: BLE001 - a wrapper from Spark, checked below
        text = str(exc)
        spark_side = any(m.startswith(("pyspark", "py4j")) for m in
                         (getattr(c, "__module__", "") for c in type(exc).__mro__))
        if not spark_side or not any(name in text for name in _class_names(cls)):
            raise
        info.value, info.text = exc, text
    else:
        pytest.fail(f"DID NOT RAISE {cls.__name__}")
    if match is not None and not re.search(match, info.text):
        pytest.fail(f"{cls.__name__} raised, but its text does not match {match!r}: "
                    f"{info.text[-3000:]}")


# -- live backends of their own ---------------------------------------------------------------

_DISTINCT = iter(range(1, 1 << 30))


def distinct_timeout(base: float) -> float:
    """``base`` seconds plus a few microseconds never handed out before in this process: a live
    backend spec with it is equal to no other test's, so the test gets a backend (routes, pooled
    connections) of its own. A counter, not a random value: random ones collide."""
    return base + next(_DISTINCT) / 1e6


# -- reference fixtures ------------------------------------------------------------------------

_EXTRACTED: Path | None = None


def _extract_embedded() -> Path:
    """The embedded copy, extracted once per session (and per process) into a temporary folder
    whose files and folders are read-only, as in ../shared/fixtures."""
    global _EXTRACTED
    if _EXTRACTED is not None:
        return _EXTRACTED
    if not EMBEDDED_ARCHIVE.is_file():
        missing(f"the embedded reference fixtures {EMBEDDED_ARCHIVE} are absent")
    top = Path(tempfile.mkdtemp(prefix="rmq-fixtures-"))
    atexit.register(_remove_tree, top, os.getpid())
    root = top / "fixtures"
    root.mkdir()
    dirs = [root]
    with tarfile.open(EMBEDDED_ARCHIVE, "r:xz") as tar:
        for member in tar:
            rel = PurePosixPath(member.name)
            if rel.is_absolute() or ".." in rel.parts or not (member.isfile() or member.isdir()):
                raise RuntimeError(f"{EMBEDDED_ARCHIVE}: unexpected member {member.name!r}")
            dest = root.joinpath(*rel.parts)
            if member.isdir():
                dest.mkdir(parents=True, exist_ok=True)
                dirs.append(dest)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out)
            os.chmod(dest, 0o444)
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        os.chmod(d, 0o555)
    _EXTRACTED = root
    return root


def _remove_tree(top: Path, owner: int) -> None:
    if os.getpid() != owner:          # a forked child exiting normally must not remove it
        return
    for folder, subdirs, _ in os.walk(top):
        for name in subdirs:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(folder, name), stat.S_IRWXU)
    with contextlib.suppress(OSError):
        os.chmod(top, stat.S_IRWXU)
    shutil.rmtree(top, ignore_errors=True)


_ROOT: Path | None = None


def fixtures_root() -> Path:
    """The folder holding the reference fixtures (``rocketmq-4.9.3/``, ``rocketmq-5.3.3/``,
    ``oracle/``): RMQ_FIXTURES, else ../shared/fixtures when present, else the embedded copy.
    Exported as RMQ_FIXTURES so that test subprocesses use the same folder."""
    global _ROOT
    if _ROOT is None:
        choice = os.environ.get("RMQ_FIXTURES", "").strip()
        if choice == "embedded":
            root = _extract_embedded()
        elif choice and choice != "auto":
            root = Path(choice)
            if not root.is_dir():
                missing(f"RMQ_FIXTURES={choice} is not a folder")
        elif SHARED_FIXTURES.is_dir():
            root = SHARED_FIXTURES
        else:
            root = _extract_embedded()
        os.environ["RMQ_FIXTURES"] = str(root)
        _ROOT = root
    return _ROOT


def embedded_fixtures() -> Path:
    """The embedded copy, extracted (whatever fixtures_root() uses)."""
    return _extract_embedded()


def fixture_dir(name: str) -> Path:
    """A RocketMQ-written fixture folder (``"rocketmq-4.9.3/basic"``) under fixtures_root()."""
    path = fixtures_root() / name
    if not path.is_dir():
        missing(f"reference fixture folder {path} not found")
    return path


def fixture_file(name: str) -> Path:
    """A file under fixtures_root() (``"oracle/allocations.jsonl"``)."""
    path = fixtures_root() / name
    if not path.is_file():
        missing(f"reference fixture file {path} not found")
    return path


# -- Spark --------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def spark():
    """The one local Spark session of the test run (local[2], no UI, small shuffles)."""
    pyspark_sql = require("pyspark.sql", "the Spark tests need pyspark (pip install -e '.[test]')")
    spark_archive.ensure()
    with phase_timings.timed("Spark session start (test process)"):
        session = (
            pyspark_sql.SparkSession.builder.master("local[2]")
            .appName("rmq_source-tests")
            .config("spark.driver.bindAddress", LOOPBACK).config("spark.driver.host", LOOPBACK)
            .config("spark.driver.extraJavaOptions", spark_archive.java_options())
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
    with phase_timings.timed("Spark session stop (test process)"):
        session.stop()


# ----------------------------------------------------------------------------- real RocketMQ servers
sys.path.insert(0, str(REPO / "tests"))
import loopback  # noqa: E402
import phase_timings  # noqa: E402
import rocketmq_cluster  # noqa: E402
import spark_archive  # noqa: E402

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


@contextlib.contextmanager
def running_cluster(rocketmq_jars, line: str, tmp_path_factory, name: str, **kw):
    """A NameServer and brokers of RocketMQ ``line`` (``Cluster`` keywords ``kw``) under a new
    temporary folder ``<name>-<version>``, stopped afterwards; a server that does not start fails
    the test with its log tails."""
    version, jars = rocketmq_jars(line)
    cluster = rocketmq_cluster.Cluster(version, jars, tmp_path_factory.mktemp(f"{name}-{version}"), **kw)
    try:
        with phase_timings.timed("RocketMQ cluster start (NameServer + brokers)", f"{name}-{version}"):
            cluster.start()
    except rocketmq_cluster.ServerError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop(graceful=False)        # nothing reads its stores afterwards


@contextlib.contextmanager
def running_proxy(cluster, tmp_path_factory, name: str, extra: dict | None = None):
    """A RocketMQ 5 Proxy in cluster mode in front of ``cluster`` (its brokers registered
    already; ``extra``: more ``rmq-proxy.json`` keys) under a new temporary folder ``name``,
    stopped afterwards. Proxy jars that cannot be had skip the test (or fail it, as the broker
    tests do); a Proxy that does not start fails it with its log tails."""
    try:
        jars = rocketmq_cluster.resolve_proxy_jars(cluster.version)
    except rocketmq_cluster.BrokerUnavailable as exc:
        broker_unavailable(str(exc))
    server = rocketmq_cluster.Proxy(cluster.version, jars, tmp_path_factory.mktemp(name),
                                    namesrv=cluster.namesrv_addr, cluster=cluster.cluster_name,
                                    extra=extra)
    try:
        server.start()          # (its boot is timed as "RocketMQ Proxy boot")
    except rocketmq_cluster.ServerError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop(graceful=False)


@pytest.fixture(scope="session", params=BROKER_LINES, ids=lambda line: f"rocketmq-{line}")
def rocketmq(request, rocketmq_jars, tmp_path_factory):
    """A running NameServer and broker ``broker-a`` of one version, shared by the whole session."""
    with running_cluster(rocketmq_jars, request.param, tmp_path_factory, "rocketmq") as cluster:
        yield cluster


#: fixtures whose tests get a marker without writing it: real RocketMQ servers are "broker"
#: (``-m "not broker and not slow"`` is the quick tier of the README), a Spark session "spark"
_MARKED_BY_FIXTURE = {"rocketmq": "broker", "rocketmq_jars": "broker", "spark": "spark"}


def _admission_control() -> bool:
    """Whether the PySpark running the tests passes Python sources read limits (4.2+)."""
    try:
        from rmq_source.spark import compat
    except ImportError:
        return True          # (no PySpark: the Spark tests fail on their own)
    return compat.ADMISSION_CONTROL


#: set to run the tests marked ``lines`` on every RocketMQ line anyway (a thorough run)
EVERY_LINE_ENV = "RMQ_EVERY_LINE"


def _on_other_line(item) -> bool:
    """A test marked ``lines(...)`` whose RocketMQ line (its ``rocketmq-X.Y`` id) is not listed."""
    marker = item.get_closest_marker("lines")
    line = re.search(r"\brocketmq-(\d+\.\d+)", item.nodeid)
    return (marker is not None and line is not None and line.group(1) not in marker.args
            and not os.environ.get(EVERY_LINE_ENV))


def pytest_collection_modifyitems(config, items):
    other_line = [item for item in items if _on_other_line(item)]
    if other_line:
        config.hook.pytest_deselected(items=other_line)
        items[:] = [item for item in items if not _on_other_line(item)]
    if not _admission_control():
        for item in items:
            if item.get_closest_marker("spark42") is not None:
                item.add_marker(pytest.mark.skip(reason="needs PySpark 4.2+: tests/test_spark_compat.py "
                                                 "covers what this PySpark does instead"))
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            marker = _MARKED_BY_FIXTURE.get(fixture)
            if marker is not None and item.get_closest_marker(marker) is None:
                item.add_marker(marker)
    # Files with real servers or slow tests first, each file's tests in their order: pytest-xdist
    # (``--dist loadfile``) hands files out in this order, so the long ones start early and the
    # many short ones even out the workers' ends.
    long_files = {item.path for item in items
                  if item.get_closest_marker("broker") or item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in long_files)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist with ``--dist loadfile`` (the README's command): a worker takes a test file's
    tests of one RocketMQ line at a time, in the collection's order (long files first, the 4.9
    tests before the 5.3 ones, as pytest orders them for its session fixtures). So each worker
    starts the session cluster of a line once, as a single process would, and the module
    fixtures of a file's two lines run on both workers at once."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileAndLine(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            line = re.search(r"\brocketmq-(\d+\.\d+)", nodeid)
            return nodeid.split("::", 1)[0] + (f"@{line.group(1)}" if line else "")

    config.option.loadscopereorder = False        # (it would put the files with most tests first)
    return FileAndLine(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed broker test prints the server log tails, a Proxy's too (the logs stay in the
    session's tmp dir)."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        cluster = getattr(item, "funcargs", {}).get("rocketmq")
        if isinstance(cluster, rocketmq_cluster.Cluster):
            report.sections.append(("RocketMQ server logs", f"workdir {cluster.workdir}\n"
                                    + cluster.log_tails()))
        for name, value in getattr(item, "funcargs", {}).items():
            if isinstance(value, rocketmq_cluster.Proxy):       # (fixtures proxy, acl_proxy, ...)
                report.sections.append((f"RocketMQ Proxy logs ({name})",
                                        f"workdir {value.workdir}\n" + value.log_tails()))


# ----------------------------------------------------------------------------- loopback only
_LOOPBACK_WATCH = None
_LOOPBACK_CHECKED_AT = 0.0
#: seconds between two checks at most: the kernel's socket tables cost ~15 ms to read with a few
#: thousand sockets, and thousands of short tests run back to back (what they leave open is seen
#: by the next check; servers and sessions live longer than this)
LOOPBACK_CHECK_EVERY = 1.0


@pytest.fixture(autouse=True)
def loopback_only():
    """After every test (at most once a second): no process this test run started (servers,
    Spark JVMs and workers, helpers) listens on, or is connected to, an address other than
    loopback (tests/loopback.py)."""
    yield
    import time
    global _LOOPBACK_WATCH, _LOOPBACK_CHECKED_AT
    if time.monotonic() - _LOOPBACK_CHECKED_AT < LOOPBACK_CHECK_EVERY:
        return
    if _LOOPBACK_WATCH is None:
        _LOOPBACK_WATCH = loopback.Watch()
    offenders = _LOOPBACK_WATCH.offenders()
    _LOOPBACK_CHECKED_AT = time.monotonic()
    if offenders:
        pytest.fail("open beyond loopback (tests must listen and talk on 127.0.0.1 only):\n  "
                    + "\n  ".join(offenders), pytrace=False)


# ----------------------------------------------------------------------------- where the time goes
_RUN_STARTED = 0.0


def pytest_configure(config):
    """One timings file per run (phase_timings.py), inherited by every helper process."""
    global _RUN_STARTED
    import time
    _RUN_STARTED = time.monotonic()
    if os.environ.get(phase_timings.ENV) is None:
        fd, path = tempfile.mkstemp(prefix="rmq-phase-timings-", suffix=".jsonl")
        os.close(fd)
        os.environ[phase_timings.ENV] = path
        atexit.register(_remove_file, path, os.getpid())
    phase_timings.record(phase_timings.TEST_PROCESS, 0.0)   # (pytest-xdist: one per worker)
    spark_archive.choose_path()      # before pytest-xdist starts its workers: they share it


def _remove_file(path: str, owner: int) -> None:
    if os.getpid() == owner:
        with contextlib.suppress(OSError):
            os.unlink(path)


def pytest_terminal_summary(terminalreporter):
    """After pytest's slowest tests (``--durations`` in pyproject.toml): JVM starts and stops by
    kind, how many and how long, so a run that grows shows where."""
    import time
    path = os.environ.get(phase_timings.ENV)
    if not path:
        return
    terminalreporter.section("where the time went (tests/phase_timings.py)")
    for line in phase_timings.summary(path, time.monotonic() - _RUN_STARTED):
        terminalreporter.write_line(line)
