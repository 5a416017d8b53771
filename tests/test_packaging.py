"""The packages a user would install, and docs/deploy.md's cluster recipe run with one of them.

``python -m build`` makes an sdist and a wheel of a copy of the checkout; both install into a
throwaway venv that has no checkout beside it. The wheel installs with no compiler reachable (PATH
holds only the venv's bin/, CC names no program): the C core is inside it. That venv, packed by
venv-pack2, is then the Python of a Spark standalone cluster's driver and executors
(examples/cluster_job.py: a live read, a group stream and a sink write against RocketMQ 4.9).
Last the sdist replaces the wheel in the venv and compiles the C core (the sdist must carry
native/). Each install imports the C core from the venv and reads a store RocketMQ 4.9.3 wrote,
through ``rmq-store print`` (the console script) and ``Store``. Dependencies come from the
package index, through pip's cache.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import uuid
import zipfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import phase_timings
import rmq_source
import spark_archive
from spark_servers import spark_home, wait_ready
from conftest import fixture_dir, missing
from rmq_source.remote import RemotingClient
from rmq_source.remote import requests as rq
from rocketmq_cluster import free_port, pull_all, send_numbered

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
QUEUES, PER_QUEUE = 4, 50
#: what a copy of the checkout leaves out (built or bulky things; tests are not packaged)
IGNORED = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.so",
                                 "*.o", "tests", "bench", "spark-warehouse", "demo-output", ".hypothesis")

#: what a reader of a store checks in the venv: the package's place, the C core, one queue's rows
READ_STORE = """
import json, sys
import rmq_source, rmq_source._native
from rmq_source.store.reader import Store
with Store(sys.argv[1]) as s:
    batch = s.read("TopicTest", 0, start=0, end=10**9)
print(json.dumps({"package": rmq_source.__file__, "native": rmq_source._native.__file__,
                  "version": rmq_source.__version__, "msgIds": batch.column("msgId").to_pylist()}))
"""


def _run(cmd, *, env=None, cwd=None, timeout=600) -> str:
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=cwd,
                         timeout=timeout)
    assert out.returncode == 0, f"{cmd} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    if importlib.util.find_spec("build") is None:
        missing("the 'build' package (the test extra) is not installed")
    work = tmp_path_factory.mktemp("packaging")
    src = work / "src"
    shutil.copytree(REPO, src, ignore=IGNORED)
    _run([sys.executable, "-m", "build", "--outdir", work / "dist", src], cwd=work)
    found = {p.suffix: p for p in (work / "dist").iterdir()}
    return {"sdist": found[".gz"], "wheel": found[".whl"], "work": work}


def test_the_sdist_holds_the_build_inputs_and_no_test_bulk(dists):
    with tarfile.open(dists["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for needed in ("setup.py", "pyproject.toml", "MANIFEST.in", "LICENSE", "README.md", "native/_build.py",
                   "native/rmq_core.c", "native/rmq_core.h", "native/rmq_layout.h", "native/core/rows.c",
                   "rmq_source/__init__.py", "rmq_source/store/reader.py"):
        assert needed in names, needed
    assert not [n for n in names if n.startswith(("tests/", "bench/", "examples/")) or n.endswith(".so")]


def test_the_wheel_carries_the_c_core_for_the_stable_abi(dists):
    wheel = dists["wheel"]
    assert wheel.name == f"rmq_source-{rmq_source.__version__}-cp311-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta = zf.read(f"rmq_source-{rmq_source.__version__}.dist-info/METADATA").decode()
    assert "rmq_source/_native.abi3.so" in names
    assert not [n for n in names if n.startswith(("tests/", "native/"))]
    for line in ("Requires-Python: >=3.11", "License-Expression: Apache-2.0", "Provides-Extra: spark",
                 f"Version: {rmq_source.__version__}"):
        assert line in meta, line


def _clean_env() -> dict:
    """This process's environment without what points a Python at this checkout or venv."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYSPARK_", "VIRTUAL_ENV", "PIP_"))}


def _check_install(venv: Path, away: Path, how: str) -> None:
    """The venv imports rmq_source and its C core from itself and reads a queue of a 4.9.3 store
    (``Store`` and ``rmq-store print``), run from ``away``."""
    base = fixture_dir("rocketmq-4.9.3/basic")
    manifest = [json.loads(line) for line in open(base / "manifest.jsonl", encoding="utf-8")]
    expected = [m["msgId"] for m in manifest if m["topic"] == "TopicTest" and m["queueId"] == 0]
    assert expected
    env = _clean_env()
    got = json.loads(_run([venv / "bin" / "python", "-c", READ_STORE, base / "store"], env=env, cwd=away))
    assert got["msgIds"] == expected, how
    assert got["version"] == rmq_source.__version__
    for key in ("package", "native"):
        assert Path(got[key]).is_relative_to(venv), (how, got[key])
    rows = [json.loads(line) for line in _run([venv / "bin" / "rmq-store", "print", base / "store", "--topic",
                                               "TopicTest", "--queue", 0, "--json"], env=env, cwd=away)
            .splitlines()]
    assert [r["msgId"] for r in rows] == expected, how


@pytest.fixture(scope="module")
def wheel_venv(dists) -> Path:
    """A fresh venv with the wheel installed by a pip that finds no compiler (PATH holds only the
    venv's bin/, CC names no program), run from a folder with no checkout beside it."""
    work = dists["work"]
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", venv])
    (work / "elsewhere").mkdir()
    no_compiler = dict(_clean_env(), PATH=str(venv / "bin"), CC="/nonexistent/cc")
    _run([venv / "bin" / "python", "-m", "pip", "install", "-q", dists["wheel"]], env=no_compiler,
         cwd=work / "elsewhere")
    return venv


def test_the_wheel_installs_without_a_compiler_and_reads_a_store(dists, wheel_venv):
    _check_install(wheel_venv, dists["work"] / "elsewhere", "wheel")


@pytest.fixture(scope="module")
def packed_env(wheel_venv, dists) -> Path:
    """The wheel's venv packed by venv-pack2 (docs/deploy.md): ``env.tar.gz``, unpacked by Spark
    as ``./environment`` where its executors run. A ``.tar.gz``: Spark unpacks a plain ``.tar``
    in Java, which drops the files' modes (bin/python not executable) and refuses the venv's
    symlink to its base interpreter; a ``.tar.gz`` keeps both."""
    if importlib.util.find_spec("venv_pack") is None:
        missing("venv-pack2 (the test extra) is not installed")
    out = dists["work"] / "env.tar.gz"
    _run([Path(sys.executable).parent / "venv-pack", "--prefix", wheel_venv, "--output", out,
          "--compress-level", 1, "--quiet"])
    return out


def test_the_sdist_compiles_the_c_core_and_reads_a_store(dists, wheel_venv, packed_env):
    # packed_env: the wheel's venv is packed before the sdist's build replaces the wheel in it
    log = _run([wheel_venv / "bin" / "python", "-m", "pip", "install", "--force-reinstall", "--no-deps",
                dists["sdist"]], env=_clean_env(), cwd=dists["work"] / "elsewhere")
    assert "Building wheel for rmq_source" in log, log    # the C core compiled from the sdist
    _check_install(wheel_venv, dists["work"] / "elsewhere", "sdist")


# -- docs/deploy.md's standalone recipe, run ---------------------------------------------------

@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    """A Spark Master and one Worker (2 cores) on loopback, started with pyspark's own launcher
    (``bin/spark-class``; pip's pyspark has no sbin/start-master.sh); the master URL and the
    Worker's work folder (where executors run and unpack archives)."""
    work = tmp_path_factory.mktemp("standalone")
    home = spark_home()
    spark_archive.ensure()
    env = dict(_clean_env(), SPARK_HOME=str(home), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_DAEMON_JAVA_OPTS=spark_archive.java_options())
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    procs = []
    try:
        with phase_timings.timed("Spark standalone Master + Worker start"):
            for name, cls, args, ready in [
                    ("master", "org.apache.spark.deploy.master.Master",
                     ["--host", "127.0.0.1", "--port", port, "--webui-port", free_port()],
                     "I have been elected leader"),
                    ("worker", "org.apache.spark.deploy.worker.Worker",
                     ["--host", "127.0.0.1", "--cores", 2, "--memory", "2g", "--work-dir", work / "worker",
                      "--webui-port", free_port(), url],
                     "Successfully registered with master")]:
                log = work / f"{name}.log"
                with open(log, "wb") as out:
                    procs.append(subprocess.Popen([str(a) for a in [home / "bin" / "spark-class", cls, *args]],
                                                  stdout=out, stderr=subprocess.STDOUT, env=env, cwd=work))
                wait_ready(procs[-1], log, lambda: ready in log.read_text(errors="replace"), name)
        yield url, work / "worker"
    finally:
        for proc in reversed(procs):
            proc.kill()
            proc.wait(30)


@pytest.mark.parametrize("rocketmq", ["4.9"], indirect=True)
def test_a_packed_env_on_a_standalone_cluster_reads_streams_and_sends(rocketmq, standalone, packed_env,
                                                                      tmp_path):
    """examples/cluster_job.py submitted in client mode, the packed env the Python of the driver,
    its planner and the executors: the live batch read and the group stream hold every message
    once, the group's progress is on the broker, the sink topic holds every body; every row came
    from a Python worker of the packed env in the Worker's folder, importing rmq_source from it."""
    url, executors_dir = standalone
    tag = uuid.uuid4().hex[:8]
    topic, sink_topic, group = f"Deploy_{tag}", f"DeploySink_{tag}", f"deploy-{tag}"
    broker = rocketmq.brokers["broker-a"]
    with RemotingClient(timeout=15) as client:
        rocketmq.create_topic(client, topic, QUEUES)
        rocketmq.create_topic(client, sink_topic, QUEUES)
        sent = sorted(b for q in range(QUEUES) for b in send_numbered(client, broker.addr, topic, q, 0, PER_QUEUE))
    driver = tmp_path / "driver"          # client mode: the env unpacked beside the driver too
    shutil.unpack_archive(packed_env, driver / "environment")
    out = tmp_path / "out"
    home = spark_home()
    cds = spark_archive.java_options()
    env = dict(_clean_env(), SPARK_HOME=str(home), SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_PYTHON="./environment/bin/python", PYSPARK_DRIVER_PYTHON="./environment/bin/python")
    with phase_timings.timed("spark-submit to the standalone cluster"):
        job = subprocess.run(
            [str(a) for a in [home / "bin" / "spark-submit", "--master", url, "--deploy-mode", "client",
                              "--archives", f"{packed_env}#environment",
                              "--conf", "spark.executor.memory=1g", "--conf", "spark.ui.enabled=false",
                              "--conf", "spark.sql.shuffle.partitions=2",
                              "--conf", f"spark.driver.extraJavaOptions={cds}",
                              "--conf", f"spark.executor.extraJavaOptions={cds}",
                              REPO / "examples" / "cluster_job.py", "--namesrv", rocketmq.namesrv_addr,
                              "--topic", topic, "--group", group, "--sink-topic", sink_topic, "--out", out]],
            capture_output=True, text=True, cwd=driver, env=env, timeout=900)
    assert job.returncode == 0, "\n".join(
        [job.stdout[-3000:]] + [line for line in job.stderr.splitlines() if " INFO " not in line][-80:])
    report = json.loads(job.stdout.strip().splitlines()[-1])
    assert report == {"master": url, "driverPython": str(driver / "environment")}, report
    for part in ("batch", "stream"):
        rows = pq.read_table(out / part).to_pylist()
        assert sorted(r["body"] for r in rows) == sent, part
        assert len({(r["queueId"], r["queueOffset"]) for r in rows}) == len(rows), part
        for r in rows:
            env_dir = Path(r["python"])
            assert env_dir.name == "environment" and env_dir.is_relative_to(executors_dir), (part, r["python"])
            assert Path(r["package"]).is_relative_to(env_dir), (part, r["package"])
    with RemotingClient(timeout=15) as client:
        assert [rq.query_consumer_offset(client, broker.addr, group, topic, q) for q in range(QUEUES)] \
            == [PER_QUEUE] * QUEUES
        got = sorted(r.body for q in range(QUEUES) for r in pull_all(client, broker.addr, sink_topic, q))
    assert got == sent
