"""Spark with executors in separate JVMs (``local-cluster[2,1,1024]``): a batch read and a short
availableNow stream give exactly what was written.

The run happens in a subprocess with its own SparkSession (fault_helpers/cluster_query.py); the
suite's session is local[2], where tasks share the driver's machine and working directory. Here
the store path is given *relative* to the driver's working directory while each executor runs in
its own work dir, and every row carries the working directory of the Python worker that read it:
rows read by both executors, none by the driver, all correct, shows that a task's read() depends
only on its input partition.

A pip-installed pyspark has no SPARK_HOME of its own; the workers launch executors with
``$SPARK_HOME/bin`` and ``$SPARK_HOME/jars`` and put work dirs in ``$SPARK_HOME/work``, so the
test points SPARK_HOME at a temporary folder linking pyspark's bin/ and jars/ (nothing is
written into site-packages).
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import missing, require
from fault_helpers import procs
from fault_helpers.payload import body_for, props_for, tags_for
from rmq_source.store.writer import StoreWriter

TOPIC = "ClusterTopic"
QUEUES = 4


def _spark_home(tmp_path: Path) -> Path:
    pyspark = require("pyspark", "local-cluster needs pyspark")
    src = Path(pyspark.__file__).parent
    if not (src / "bin" / "spark-class").exists() or not (src / "jars").is_dir():
        missing(f"pyspark at {src} has no bin/spark-class or jars/: local-cluster cannot "
                "launch executors")
    home = tmp_path / "spark_home"
    home.mkdir()
    for name in ("bin", "jars", "python", "sbin", "conf"):
        if (src / name).exists():
            os.symlink(src / name, home / name)
    return home


@pytest.mark.spark
@pytest.mark.slow
def test_local_cluster_batch_and_stream(tmp_path):
    written = {}
    with StoreWriter(tmp_path / "store", commitlog_file_size=64 * 1024, cq_units_per_file=50) as w:
        w.create_topic(TOPIC, QUEUES)
        for i in range(400):
            qid = i % QUEUES
            off = w.next_offset(TOPIC, qid)
            body = body_for(TOPIC, qid, off)
            r = w.append(TOPIC, body, queue_id=qid, tags=tags_for(off),
                         properties=props_for(TOPIC, qid, off))
            written[(qid, off)] = (r.msg_id, hashlib.blake2b(body, digest_size=8).hexdigest())
    out = tmp_path / "result.json"
    env = dict(os.environ, SPARK_HOME=str(_spark_home(tmp_path)), PYSPARK_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join([str(procs.REPO), str(procs.REPO / "tests")]))
    cmd = [sys.executable, str(procs.HELPERS / "cluster_query.py"), "--store", "store",
           "--sink", "sink", "--checkpoint", "chk", "--topic", TOPIC, "--out", str(out)]
    try:
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=900, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"local-cluster run did not finish within 900 s: "
                             f"{(exc.stderr or b'')[-3000:]!r}") from None
    assert proc.returncode == 0 and out.exists(), proc.stderr[-5000:]
    result = json.loads(out.read_text())
    if "skip" in result:
        missing(result["skip"])
    assert "error" not in result, result["error"]
    assert len(result["executors"]) == 2, result["executors"]

    work = tmp_path / "spark_home" / "work"
    readers = set()
    for name in ("batch", "stream"):
        rows = result[name]
        got = {(q, o): (msg_id, digest) for q, o, msg_id, digest, _, _ in rows}
        assert len(got) == len(rows), f"{name}: duplicate rows"
        assert got == written, f"{name}: rows differ from what was written"
        cwds = {cwd for *_, cwd, _ in rows}
        # every row was read in an executor's work dir (work/app-*/<executor id>), never the driver's
        assert all(Path(c).parent.parent == work for c in cwds), (cwds, result["driver_cwd"])
        assert result["driver_cwd"] not in cwds
        readers |= {Path(c).name for c in cwds}
    assert readers == set(result["executors"]), readers     # both executors read
    assert result["stream_batches"] >= 4    # maxMessagesPerTrigger=100 over 400 messages
