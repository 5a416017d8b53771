"""Fuzzing of the C core's record decoder and ConsumeQueue scanner (tests/fuzz/).

* Fast, in-process, release build: every seed of the generated corpus passes the harness (C core
  and reference model agree), the seeds reach every scan outcome, and a deliberately wrong model
  or a batch left allocated is caught (the comparison can fail).
* Slow, subprocess (``@pytest.mark.slow``, ``@pytest.mark.asan``): a bounded atheris run of both
  targets against the AddressSanitizer/UBSan build must find nothing; and a planted failure (a
  Python exception, a NULL read in native code) must be reported as a finding with a crash file.

Longer runs are manual: ``python tests/fuzz/run_fuzz.py --seconds 600`` (docs/reliability.md,
"Fuzzing").
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from conftest import missing, require

FUZZ = Path(__file__).resolve().parent / "fuzz"
REPO = FUZZ.parents[1]
sys.path.insert(0, str(FUZZ))

import fuzz_harness as fh  # noqa: E402  (tests/fuzz is not a package)
import fuzz_model as fm  # noqa: E402
import make_corpus  # noqa: E402

from rmq_source.store import native  # noqa: E402

CI_SECONDS_PER_TARGET = 12          # twice what the planted bugs needed (docs/reliability.md)


def _seeds():
    return ([("record", n, d) for n, d in make_corpus.record_seeds().items()] +
            [("queue", n, d) for n, d in make_corpus.queue_seeds().items()])


SEEDS = _seeds()


@pytest.mark.parametrize("target,name,data", SEEDS, ids=[f"{t}-{n}" for t, n, _ in SEEDS])
def test_seed_passes_the_harness(target, name, data):
    fh.TARGETS[target](data)


def test_seeds_reach_every_scan_outcome(monkeypatch):
    seen = set()
    real_scan = native.scan_queue

    def spy(*args, **kwargs):
        try:
            res = real_scan(*args, **kwargs)
        except Exception as exc:
            seen.add(getattr(exc, "code", None) or type(exc).__name__)
            raise
        seen.add(res.status)
        return res

    monkeypatch.setattr(native, "scan_queue", spy)
    for target, _name, data in SEEDS:
        try:
            fh.TARGETS[target](data)
        except fh.Finding:
            pass                       # reported by test_seed_passes_the_harness
    want = {"END", "FULL", "CQ_END", "CL_GONE", "BAD_MAGIC", "BAD_UTF8", "CRC_MISMATCH",
            "TRUNCATED", "SIZE_MISMATCH", "BAD_UNIT", "UNIT_MISMATCH", "RmqOptionError"}
    assert want <= seen, f"no seed reaches {sorted(want - seen)}"


@pytest.mark.parametrize("attr,wrong", [
    ("crc_ok", lambda rec: True),                                # C reports CRC_MISMATCH
    ("unit_preblank", lambda phy, size, code: False),            # C skips pre-blank units
    ("preblank_lead_end", lambda cq: fm.MAX_QUEUE_OFFSET),       # C: BAD_UNIT after real units
    ("record_is_unit", lambda rec, topic, queue_id, n: True),    # C: UNIT_MISMATCH
    ("host_text", lambda field: "0.0.0.0:0"),                    # every row's hosts differ
    ("wrap64", lambda v: v + 1),                                 # timestamps differ
])
def test_a_wrong_model_is_a_finding(monkeypatch, attr, wrong):
    monkeypatch.setattr(fm, attr, wrong)
    caught = []
    for target, name, data in SEEDS:
        fh._QUEUE = None                                         # rebuild with the patched model
        try:
            fh.TARGETS[target](data)
        except fh.Finding as exc:
            caught.append((name, str(exc)))
    fh._QUEUE = None
    assert caught, f"patching fuzz_model.{attr} changed no verdict on any seed"


def test_a_batch_left_allocated_is_a_finding(monkeypatch):
    if not hasattr(native, "live_batches"):
        missing("this C core does not count its live batches")
    kept = []
    real_scan = native.scan_queue

    def keeping(*args, **kwargs):
        res = real_scan(*args, **kwargs)
        kept.append(res)
        return res

    monkeypatch.setattr(native, "scan_queue", keeping)
    with pytest.raises(fh.Finding, match="still allocated"):
        fh.record_target(make_corpus.record_seeds()["v1_basic"])
    kept.clear()


# -- bounded atheris runs under AddressSanitizer ------------------------------------------------

def _need_fuzz_tools() -> None:
    require("atheris", "the bounded fuzz run needs atheris (a test dependency: pip install -e '.[test]')")
    require("cmd:gcc", "gcc is needed to build the ASan variant of the C core")


@pytest.fixture(scope="module")
def fuzz_workdir(tmp_path_factory):
    _need_fuzz_tools()
    return tmp_path_factory.mktemp("fuzz")


def _runner(workdir: Path, *args: str, env_extra: dict | None = None, timeout: int):
    env = dict(os.environ)
    env.pop("RMQ_FUZZ_SELFTEST", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, str(FUZZ / "run_fuzz.py"), "--workdir", str(workdir),
                           *args], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=timeout)


@pytest.mark.slow
@pytest.mark.asan
def test_bounded_fuzz_run_finds_nothing(fuzz_workdir):
    proc = _runner(fuzz_workdir, "--seconds", str(CI_SECONDS_PER_TARGET), "--seed", "1",
                   timeout=2 * CI_SECONDS_PER_TARGET + 2 * 180 + 300)
    output = proc.stdout + proc.stderr
    if proc.returncode == 2 and "setup failed" in output:
        missing("cannot build the fuzzing setup: " + output[-2000:])
    assert proc.returncode == 0, output[-12000:]
    results = json.loads((fuzz_workdir / "summary.json").read_text())
    assert [r["target"] for r in results] == ["record", "queue"]
    for r in results:
        assert r["clean"] and not r["artifacts"], r
        # it really ran: the seeds and mutations of them, with coverage feedback
        assert r["execs"] and r["execs"] > len(SEEDS), r
        if r["coverage_feedback"]:
            assert r["cov"], r
        else:
            warnings.warn("fuzzing ran without coverage feedback (no C++ compiler to link "
                          "atheris's libFuzzer for preloading ahead of libasan)")
    assert "AddressSanitizer" not in output and "runtime error" not in output


@pytest.mark.slow
@pytest.mark.asan
@pytest.mark.parametrize("mode", ["python", "segv"])
def test_runner_reports_a_planted_finding(fuzz_workdir, mode):
    proc = _runner(fuzz_workdir, "--targets", "record", "--seconds", "20", "--runs", "50",
                   env_extra={"RMQ_FUZZ_SELFTEST": mode}, timeout=400)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-6000:]
    results = json.loads((fuzz_workdir / "summary.json").read_text())
    assert not results[0]["clean"]
    assert any(Path(a).name.startswith("crash-") for a in results[0]["artifacts"]), output[-6000:]
    assert "reproduce: python" in output
    if mode == "segv":
        assert "AddressSanitizer" in output, output[-6000:]
