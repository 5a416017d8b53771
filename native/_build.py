"""cffi build script of the C core (``rmq_source._native``).

setup.py runs it through ``cffi_modules=["native/_build.py:ffi"]``; nothing compiles when
``rmq_source`` is imported. ``make_ffi`` is shared with ``native/asan_build.py``, which builds the
same sources under AddressSanitizer into another module name.
"""
from __future__ import annotations

import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
HEADER = os.path.join(HERE, "rmq_core.h")
SOURCE = os.path.join(HERE, "rmq_core.c")
# rmq_core.c includes the units of core/ (one translation unit) and the layout header: a change to
# any of them rebuilds the extension, and an sdist carries them
DEPENDS = sorted([HEADER, os.path.join(HERE, "rmq_layout.h")]
                 + [os.path.join(HERE, "core", n) for n in os.listdir(os.path.join(HERE, "core"))
                    if n.endswith(".c")])

# No -march: pip compiles the package on the target machine, but a wheel or a shared build tree
# must not assume its CPU. The only wider instructions (AVX2 streaming stores) sit in two small
# functions compiled with a target attribute and are chosen at run time (core/rows.c, have_avx2).
RELEASE_FLAGS = ["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                 "-fno-strict-aliasing"]


def cdef_text() -> str:
    """The declarations between the CDEF markers of rmq_core.h (plain C that cffi can parse)."""
    with open(HEADER, encoding="utf-8") as fh:
        text = fh.read()
    return text.split("/* CDEF BEGIN */", 1)[1].split("/* CDEF END */", 1)[0]


def _relative(path: str) -> str:
    # setuptools prefers paths relative to setup.py's directory (the cwd during a build).
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def make_ffi(module_name: str, extra_compile_args: list[str],
             extra_link_args: list[str] | None = None, absolute_paths: bool = False) -> FFI:
    """FFI of the C core; ``absolute_paths`` for ``ffi.compile`` (which changes directory)."""
    ffi = FFI()
    ffi.cdef(cdef_text())
    ffi.set_source(
        module_name,
        '#include "rmq_core.h"\n',
        sources=[SOURCE if absolute_paths else _relative(SOURCE)],
        depends=DEPENDS if absolute_paths else [_relative(p) for p in DEPENDS],
        include_dirs=[HERE],
        libraries=["z", "ssl", "crypto"],
        extra_compile_args=extra_compile_args,
        extra_link_args=extra_link_args or [],
    )
    return ffi


ffi = make_ffi("rmq_source._native", RELEASE_FLAGS)

if __name__ == "__main__":
    ffi.compile(verbose=True)
