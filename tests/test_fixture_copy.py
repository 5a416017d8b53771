"""The embedded copy of the reference fixtures (tests/fixtures/reference.tar.xz) cannot rot.

When ../shared/fixtures sits beside the checkout (always in CI), every file of it that the tests
may read is in the embedded copy, byte for byte, and the copy holds nothing else; the files left
out on purpose are listed in tests/fixtures/make_archive.py (OMITTED). Rebuild the archive with
``python tests/fixtures/make_archive.py`` when shared/fixtures changes.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

from conftest import SHARED_FIXTURES, embedded_fixtures, fixtures_root, missing

_spec = importlib.util.spec_from_file_location(
    "make_archive", Path(__file__).resolve().parent / "fixtures" / "make_archive.py")
make_archive = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_archive)


def _tree(root: Path) -> dict[str, str]:
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            out[path.relative_to(root).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def test_embedded_copy_is_byte_identical_to_shared_fixtures():
    if not SHARED_FIXTURES.is_dir():
        missing(f"{SHARED_FIXTURES} is absent: nothing to compare the embedded copy with")
    shared = _tree(SHARED_FIXTURES)
    embedded = _tree(embedded_fixtures())
    assert make_archive.OMITTED <= set(shared), \
        f"OMITTED names files shared/fixtures no longer has: {sorted(make_archive.OMITTED - set(shared))}"
    expected = {rel: digest for rel, digest in shared.items() if rel not in make_archive.OMITTED}
    missing_files = sorted(set(expected) - set(embedded))
    extra = sorted(set(embedded) - set(expected))
    differ = sorted(rel for rel in set(expected) & set(embedded) if expected[rel] != embedded[rel])
    assert not (missing_files or extra or differ), (
        f"the embedded fixtures differ from {SHARED_FIXTURES} (rebuild: python "
        f"tests/fixtures/make_archive.py): missing {missing_files[:10]}, extra {extra[:10]}, "
        f"different {differ[:10]}")


def test_embedded_copy_is_read_only_like_the_shared_one():
    """Tests copy what they change: like ../shared/fixtures, nothing in the copy is writable."""
    root = embedded_fixtures()
    assert (root / "rocketmq-4.9.3" / "basic" / "store" / "commitlog").is_dir()
    writable = [str(Path(folder, name).relative_to(root))
                for folder, dirs, files in os.walk(root) for name in [*dirs, *files]
                if os.stat(Path(folder, name)).st_mode & 0o222]
    assert not writable, writable[:10]


def test_fixtures_root_holds_every_fixture_folder():
    root = fixtures_root()
    for name in ("rocketmq-4.9.3/basic/store", "rocketmq-5.3.3/basic/store", "oracle"):
        assert (root / name).is_dir(), root / name
    assert os.environ["RMQ_FIXTURES"] == str(root)       # test subprocesses use the same folder

