"""The packages a user would install: ``python -m build`` makes an sdist and a wheel of a copy of the
checkout, and both install into a throwaway venv that has no checkout beside it.

The wheel installs with no compiler reachable (PATH holds only the venv's bin/, CC names no
program): the C core is inside it. The sdist then replaces it in the same venv and compiles the C
core (the sdist must carry native/). Each install imports the C core from the venv and reads a
store RocketMQ 4.9.3 wrote, through ``rmq-store print`` (the console script) and ``Store``.
Dependencies come from the package index, through pip's cache.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import rmq_source
from conftest import fixture_dir, missing

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
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


def test_wheel_then_sdist_install_into_a_fresh_venv_and_read_a_store(dists):
    work = dists["work"]
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", venv])
    py, bin_dir = venv / "bin" / "python", venv / "bin"
    away = work / "elsewhere"           # no checkout beside the venv's processes
    away.mkdir()
    base = fixture_dir("rocketmq-4.9.3/basic")
    manifest = [json.loads(line) for line in open(base / "manifest.jsonl", encoding="utf-8")]
    expected = [m["msgId"] for m in manifest if m["topic"] == "TopicTest" and m["queueId"] == 0]
    assert expected
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PIP_"))}

    def check(how: str):
        got = json.loads(_run([py, "-c", READ_STORE, base / "store"], env=env, cwd=away))
        assert got["msgIds"] == expected, how
        assert got["version"] == rmq_source.__version__
        for key in ("package", "native"):
            assert Path(got[key]).is_relative_to(venv), (how, got[key])
        rows = [json.loads(line) for line in _run([bin_dir / "rmq-store", "print", base / "store", "--topic",
                                                   "TopicTest", "--queue", 0, "--json"], env=env, cwd=away)
                .splitlines()]
        assert [r["msgId"] for r in rows] == expected, how

    no_compiler = dict(env, PATH=str(bin_dir), CC="/nonexistent/cc")
    _run([py, "-m", "pip", "install", "-q", dists["wheel"]], env=no_compiler, cwd=away)
    check("wheel")
    log = _run([py, "-m", "pip", "install", "--force-reinstall", "--no-deps", dists["sdist"]], env=env,
               cwd=away)
    assert "Building wheel for rmq_source" in log, log    # the C core compiled from the sdist
    check("sdist")
