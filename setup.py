"""Builds the C core: everything else about the package is declared in pyproject.toml.

cffi compiles ``native/_build.py:ffi`` into ``rmq_source._native`` (CPython's stable ABI, so one
wheel serves Python 3.11 and later: the wheel is tagged ``cp311-abi3``).
"""
from setuptools import setup

setup(
    cffi_modules=["native/_build.py:ffi"],
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
