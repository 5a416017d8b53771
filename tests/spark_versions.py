"""Virtual environments with another PySpark minor, for running parts of the suite against it.

One venv per PySpark version and suite venv under the jar cache
(``<cache>/pyspark-venvs/<version>-<hash of the suite's site-packages>``): PySpark
(and its py4j) installed from PyPI into it, everything else (pyarrow, pandas, pytest, chispa, ...)
taken from the suite's own venv through a ``.pth`` file placed after its own site-packages, so
its PySpark wins and nothing else is downloaded twice. rmq_source comes from the checkout (the C
core built there by the editable install: one abi3 module serves every Python 3.11+).

The venv is made once and reused while the suite's venv and the requested version are the same
(``.complete`` names them); a half-made one is made again.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import phase_timings

REPO = Path(__file__).resolve().parents[1]

#: the newest patch of every PySpark minor the package supports (pip index versions pyspark);
#: the suite's own venv runs the newest minor (pyproject.toml's test extra)
NEWEST_PATCHES = {"4.0": "4.0.5", "4.1": "4.1.4", "4.2": "4.2.1", "4.3": "4.3.0"}


def venv_for(version: str, cache: Path) -> Path:
    """The Python of a venv with ``pyspark==version`` (made on first use, under a file lock)."""
    suite = sysconfig.get_paths()["purelib"]
    # one venv per suite venv too: two suites side by side must not remake each other's
    root = cache / "pyspark-venvs" / f"{version}-{hashlib.sha256(suite.encode()).hexdigest()[:10]}"
    python = root / "bin" / "python"
    stamp = f"pyspark {version} over {suite}\n"
    marker = root / ".complete"
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file() and marker.read_text() == stamp and python.exists():
            return python
        shutil.rmtree(root, ignore_errors=True)
        with phase_timings.timed("PySpark venv (once per version)", version):
            _make(root, python, version)
        marker.write_text(stamp)
    return python


def _make(root: Path, python: Path, version: str) -> None:
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(root)], check=True, capture_output=True)
    own = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip())
    # pip of the suite's venv installs into the new one (no pip of its own to bootstrap)
    out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                          "--target", str(own), f"pyspark=={version}"],
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"pip could not install pyspark=={version}:\n{out.stdout[-2000:]}{out.stderr[-3000:]}")
    # after its own site-packages: the suite's packages (not its pyspark: that one is shadowed)
    (own / "zz_suite_packages.pth").write_text(f"{REPO}\n{sysconfig.get_paths()['purelib']}\n")


def run_pytest(python: Path, args: list[str], *, timeout: float, env: dict | None = None
               ) -> subprocess.CompletedProcess:
    """``python -m pytest args`` from the checkout, one process (no xdist), its output captured."""
    run_env = dict(os.environ if env is None else env)
    run_env.pop("PYTEST_XDIST_WORKER", None)
    run_env.pop("PYTEST_XDIST_TESTRUNUID", None)
    run_env["PYSPARK_PYTHON"] = str(python)
    run_env["PYSPARK_DRIVER_PYTHON"] = str(python)
    return subprocess.run([str(python), "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-p", "no:randomly", "-q", "-o", "addopts=-ra --strict-markers", *args],
                          cwd=REPO, env=run_env, capture_output=True, text=True, timeout=timeout)
