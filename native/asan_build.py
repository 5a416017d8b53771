"""Build the C core under AddressSanitizer + UBSan as the top-level module ``_rmq_native_asan``.

Usage: ``python native/asan_build.py OUTDIR``. Put OUTDIR on PYTHONPATH and set ``RMQ_NATIVE=asan``
so that ``rmq_source.native`` loads it; run Python with
``LD_PRELOAD=$(gcc -print-file-name=libasan.so)`` (the interpreter itself is not instrumented) and
``ASAN_OPTIONS=detect_leaks=0``.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _build import make_ffi  # noqa: E402  (sibling build script, not a package)

MODULE = "_rmq_native_asan"
ASAN_FLAGS = ["-O1", "-g", "-std=c11", "-fsanitize=address,undefined", "-fno-omit-frame-pointer",
              "-fno-sanitize-recover=undefined",
              # files are read into exact-size heap buffers instead of mmap so that ASan also
              # checks every read against the end of the file
              "-DRMQ_HEAP_SEGMENTS"]


def build(outdir: str) -> str:
    """Compile into ``outdir``; returns the path of the extension module."""
    outdir = os.path.abspath(outdir)
    os.makedirs(outdir, exist_ok=True)
    ffi = make_ffi(MODULE, ASAN_FLAGS, ["-fsanitize=address,undefined"], absolute_paths=True)
    return ffi.compile(tmpdir=outdir, verbose=False)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python native/asan_build.py OUTDIR")
    print(build(sys.argv[1]))
