"""Build the C core under AddressSanitizer + UBSan as a top-level module.

Usage: ``python native/asan_build.py OUTDIR [--portable]``. Put OUTDIR on PYTHONPATH and set
``RMQ_NATIVE=asan`` (module ``_rmq_native_asan``) or, with ``--portable``, ``RMQ_NATIVE=asan-portable``
(module ``_rmq_native_asan_portable``: compiled with ``-DRMQ_PORTABLE``, i.e. the plain C code paths
used where SSE2 is not available, no SIMD and no streaming stores) so that ``rmq_source.store.native``
loads it; run Python with ``LD_PRELOAD=$(gcc -print-file-name=libasan.so)`` (the interpreter itself
is not instrumented) and ``ASAN_OPTIONS=detect_leaks=0``.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _build import make_ffi  # noqa: E402  (sibling build script, not a package)

MODULE = "_rmq_native_asan"
PORTABLE_MODULE = "_rmq_native_asan_portable"
ASAN_FLAGS = ["-O1", "-g", "-std=c11", "-fsanitize=address,undefined", "-fno-omit-frame-pointer",
              "-fno-sanitize-recover=undefined",
              # files are read into exact-size heap buffers instead of mmap so that ASan also
              # checks every read against the end of the file
              "-DRMQ_HEAP_SEGMENTS"]


def build(outdir: str, portable: bool = False) -> str:
    """Compile into ``outdir``; returns the path of the extension module."""
    outdir = os.path.abspath(outdir)
    os.makedirs(outdir, exist_ok=True)
    flags = ASAN_FLAGS + (["-DRMQ_PORTABLE"] if portable else [])
    ffi = make_ffi(PORTABLE_MODULE if portable else MODULE, flags,
                   ["-fsanitize=address,undefined"], absolute_paths=True)
    return ffi.compile(tmpdir=outdir, verbose=False)


if __name__ == "__main__":
    args = sys.argv[1:]
    portable = "--portable" in args
    args = [a for a in args if a != "--portable"]
    if len(args) != 1:
        sys.exit("usage: python native/asan_build.py OUTDIR [--portable]")
    print(build(args[0], portable))
