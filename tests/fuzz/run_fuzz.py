"""Run the fuzz targets (atheris/libFuzzer) against the C core built with AddressSanitizer.

    python tests/fuzz/run_fuzz.py                        # both targets, 30 s each
    python tests/fuzz/run_fuzz.py --seconds 600          # longer manual run (or RMQ_FUZZ_SECONDS)
    python tests/fuzz/run_fuzz.py --targets queue --workdir /tmp/rmq-fuzz --seed 7
    python tests/fuzz/run_fuzz.py --reproduce record /tmp/rmq-fuzz/artifacts/record/crash-...

Steps: build the ASan + UBSan variant of the C core with native/asan_build.py (cached under
WORKDIR/build by a hash of the sources), link atheris's libFuzzer into a shared library that is
preloaded before libasan (gcc's libasan also defines the coverage callbacks, and would otherwise
swallow the coverage of the instrumented Python code), write the seed corpus (make_corpus.py),
then run each target in its own subprocess, one at a time, with a hard timeout.

A target is clean when the subprocess exits 0, left no crash-/timeout-/oom-/leak- file in
WORKDIR/artifacts/TARGET, and printed no sanitizer or libFuzzer error. Exit status: 0 clean,
1 finding (artifacts and a reproduce command are printed), 2 setup error. The corpus grows in
WORKDIR/corpus/TARGET and is reused by the next run with the same WORKDIR; WORKDIR/summary.json
holds the per-target numbers.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
NATIVE = REPO / "native"
TARGETS = ("record", "queue")
MAX_LEN = {"record": 4096, "queue": 4096}
ARTIFACT_PREFIXES = ("crash-", "timeout-", "oom-", "leak-")
ERROR_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                 "ERROR: libFuzzer", "Uncaught Python exception", "==ABORTING")
DEFAULT_WORKDIR = Path(tempfile.gettempdir()) / "rmq-fuzz"


class SetupError(Exception):
    pass


def log(msg: str) -> None:
    print(msg, flush=True)


# -- build ---------------------------------------------------------------------------------------

def libasan() -> str:
    try:
        out = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True,
                             text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        raise SetupError(f"gcc not usable to locate libasan.so: {exc}") from None
    if not (os.path.isabs(out) and os.path.exists(out)):
        raise SetupError("libasan.so not found (gcc -print-file-name=libasan.so)")
    return os.path.realpath(out)


def asan_module(build_root: Path, native_dir: Path = NATIVE) -> Path:
    """Folder holding _rmq_native_asan built from the sources in ``native_dir`` (cached by their
    hash)."""
    digest = hashlib.sha1()
    names = ["rmq_core.c", "rmq_core.h", "rmq_layout.h", "_build.py", "asan_build.py"]
    names += sorted(f"core/{p.name}" for p in (native_dir / "core").glob("*.c"))
    for name in names:
        digest.update((native_dir / name).read_bytes())
    out = build_root / f"asan-{digest.hexdigest()[:12]}"
    if any(out.glob("_rmq_native_asan*.so")):
        return out
    out.mkdir(parents=True, exist_ok=True)
    log(f"building the ASan variant of the C core from {native_dir} in {out}")
    proc = subprocess.run([sys.executable, str(native_dir / "asan_build.py"), str(out)],
                          capture_output=True, text=True, cwd=out)
    if proc.returncode != 0 or not any(out.glob("_rmq_native_asan*.so")):
        raise SetupError("native/asan_build.py failed:\n" + proc.stdout[-2000:] +
                         proc.stderr[-4000:])
    return out


def libfuzzer_shim(build_root: Path) -> str | None:
    """atheris's libFuzzer as a shared library, to preload ahead of libasan; None if not built."""
    try:
        import atheris
    except ImportError:
        return None
    archive = Path(atheris.path()) / "libclang_rt.fuzzer_no_main.a"
    if not archive.is_file():
        return None
    tag = hashlib.sha1(archive.read_bytes()).hexdigest()[:12]
    out = build_root / f"libfuzzer-{tag}.so"
    if out.is_file():
        return str(out)
    build_root.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.so")
    for cxx in ("g++", "c++", "clang++"):
        if shutil.which(cxx) is None:
            continue
        proc = subprocess.run([cxx, "-shared", "-o", str(tmp), "-Wl,--whole-archive",
                               str(archive), "-Wl,--no-whole-archive", "-lpthread"],
                              capture_output=True, text=True)
        if proc.returncode == 0:
            tmp.replace(out)
            return str(out)
        log(f"warning: {cxx} could not link {archive}: {proc.stderr[-1000:]}")
    return None


def child_env(asan_dir: Path | None, preload: list[str], workspace: Path) -> dict:
    env = dict(os.environ)
    paths = [str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    if asan_dir is not None:
        paths.insert(0, str(asan_dir))
        env["RMQ_NATIVE"] = "asan"
        env["ASAN_OPTIONS"] = ":".join([
            "detect_leaks=0",                 # CPython keeps memory until exit on purpose
            "halt_on_error=1",
            "verify_asan_link_order=0",       # libFuzzer is preloaded ahead of libasan
            env.get("ASAN_OPTIONS", ""),
        ]).strip(":")
        env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
    else:
        env.pop("RMQ_NATIVE", None)
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["RMQ_FUZZ_WORKSPACE"] = str(workspace)
    return env


# -- running -------------------------------------------------------------------------------------

def _stats(output: str) -> dict:
    def last_int(pattern: str) -> int | None:
        found = re.findall(pattern, output)
        return int(found[-1]) if found else None

    return {
        "execs": last_int(r"stat::number_of_executed_units:\s*(\d+)"),
        "exec_per_sec": last_int(r"stat::average_exec_per_sec:\s*(\d+)"),
        "new_units": last_int(r"stat::new_units_added:\s*(\d+)"),
        "peak_rss_mb": last_int(r"stat::peak_rss_mb:\s*(\d+)"),
        "cov": last_int(r"\bcov: (\d+)"),
        "ft": last_int(r"\bft: (\d+)"),
    }


def artifacts_of(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name.startswith(ARTIFACT_PREFIXES))


def run_target(target: str, args, env: dict, seeds: Path, workdir: Path) -> dict:
    corpus = workdir / "corpus" / target
    artifacts = workdir / "artifacts" / target
    corpus.mkdir(parents=True, exist_ok=True)
    artifacts.mkdir(parents=True, exist_ok=True)
    logfile = workdir / "logs" / f"{target}.log"
    logfile.parent.mkdir(parents=True, exist_ok=True)
    # libFuzzer names an artifact after the input's hash: the same crash again rewrites the file
    before = {p: p.stat().st_mtime_ns for p in artifacts_of(artifacts)}
    cmd = [sys.executable, str(HERE / "fuzz_target.py"), target, str(corpus), str(seeds / target),
           f"-max_total_time={args.seconds}", f"-max_len={args.max_len or MAX_LEN[target]}",
           f"-timeout={args.unit_timeout}", f"-rss_limit_mb={args.rss_limit_mb}",
           f"-artifact_prefix={artifacts}{os.sep}", f"-dict={seeds / 'fuzz.dict'}",
           "-print_final_stats=1"]
    if args.runs is not None:
        cmd.append(f"-runs={args.runs}")
    if args.seed is not None:
        cmd.append(f"-seed={args.seed}")
    hard_timeout = args.seconds + args.startup_allowance
    log(f"[{target}] fuzzing for {args.seconds} s (hard timeout {hard_timeout} s), log {logfile}")
    started = time.monotonic()
    with open(logfile, "w", encoding="utf-8", errors="replace") as fh:
        proc = subprocess.Popen(cmd, env=env, cwd=workdir, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=hard_timeout)
            hung = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
            hung = True
    elapsed = time.monotonic() - started
    output = logfile.read_text(encoding="utf-8", errors="replace")
    new_artifacts = [p for p in artifacts_of(artifacts)
                     if before.get(p) != p.stat().st_mtime_ns]
    markers = [m for m in ERROR_MARKERS if m in output]
    result = {"target": target, "returncode": rc, "hung": hung, "seconds": round(elapsed, 1),
              "artifacts": [str(p) for p in new_artifacts], "error_markers": markers,
              "log": str(logfile), **_stats(output)}
    result["clean"] = rc == 0 and not hung and not new_artifacts and not markers
    result["coverage_feedback"] = args.coverage_feedback
    return result


def report(result: dict) -> None:
    t = result["target"]
    log(f"[{t}] {'clean' if result['clean'] else 'FINDING'}: {result['execs']} inputs in "
        f"{result['seconds']} s ({result['exec_per_sec']}/s), coverage {result['cov']} "
        f"features {result['ft']}, {result['new_units']} new corpus inputs, peak RSS "
        f"{result['peak_rss_mb']} MB")
    if result["clean"]:
        return
    log(f"[{t}] exit status {result['returncode']}, hung={result['hung']}, "
        f"markers={result['error_markers']}")
    output = Path(result["log"]).read_text(encoding="utf-8", errors="replace")
    tail = [ln for ln in output.splitlines() if not ln.startswith("INFO: Instrumenting")]
    log("\n".join(tail[-60:]))
    for path in result["artifacts"]:
        data = Path(path).read_bytes()
        log(f"[{t}] artifact {path} ({len(data)} bytes), base64 "
            f"{base64.b64encode(data[:4096]).decode()}")
        log(f"[{t}] reproduce: python {HERE / 'run_fuzz.py'} --reproduce {t} {path}")


def reproduce(args, env: dict) -> int:
    cmd = [sys.executable, str(HERE / "fuzz_target.py"), args.reproduce] + \
          [str(Path(p).resolve()) for p in args.inputs]
    proc = subprocess.run(cmd, env=env, timeout=600)
    return proc.returncode


# -- main ----------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--targets", default=",".join(TARGETS),
                   help="comma-separated targets (record, queue)")
    p.add_argument("--seconds", type=int,
                   default=int(os.environ.get("RMQ_FUZZ_SECONDS", "30")),
                   help="fuzzing time per target (default 30, or RMQ_FUZZ_SECONDS)")
    p.add_argument("--runs", type=int, default=None, help="stop each target after N inputs")
    p.add_argument("--seed", type=int, default=None, help="libFuzzer random seed")
    p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR,
                   help=f"build cache, corpus, artifacts, logs (default {DEFAULT_WORKDIR})")
    p.add_argument("--no-asan", action="store_true",
                   help="use the release build of the C core (faster, finds fewer bugs)")
    p.add_argument("--native-dir", type=Path, default=NATIVE,
                   help="build the ASan C core from this copy of native/ (default: the repo's; "
                        "a copy with a planted bug checks that the fuzzers find it)")
    p.add_argument("--max-len", type=int, default=None,
                   help="largest input in bytes (default 4096)")
    p.add_argument("--unit-timeout", type=int, default=30,
                   help="seconds one input may take before it counts as a hang")
    p.add_argument("--rss-limit-mb", type=int, default=3072)
    p.add_argument("--startup-allowance", type=int, default=180,
                   help="seconds added to --seconds for the hard timeout of a target")
    p.add_argument("--reproduce", choices=TARGETS, default=None,
                   help="replay INPUTS through this target once and show the output")
    p.add_argument("inputs", nargs="*", help="inputs for --reproduce")
    args = p.parse_args(argv)
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    for t in args.targets:
        if t not in TARGETS:
            p.error(f"unknown target {t!r}; choose from {', '.join(TARGETS)}")
    if args.reproduce and not args.inputs:
        p.error("--reproduce needs input files")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        import atheris  # noqa: F401
    except ImportError:
        log("atheris is not installed (pip install atheris); nothing to run")
        return 2
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        preload: list[str] = []
        asan_dir = None
        args.coverage_feedback = True
        if not args.no_asan:
            asan_dir = asan_module(workdir / "build", args.native_dir.resolve())
            shim = libfuzzer_shim(workdir / "build")
            if shim is None:
                args.coverage_feedback = False
                log("warning: could not link atheris's libFuzzer into a shared library; Python "
                    "coverage is lost under libasan (inputs are mutated blindly)")
            preload = ([shim] if shim else []) + [libasan()]
    except SetupError as exc:
        log(f"setup failed: {exc}")
        return 2
    sys.path.insert(0, str(HERE))
    import make_corpus
    seeds = workdir / "seeds"
    shutil.rmtree(seeds, ignore_errors=True)
    make_corpus.write(seeds)
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    workspace = Path(tempfile.mkdtemp(prefix="rmq-fuzz-ws-", dir=shm))
    try:
        env = child_env(asan_dir, preload, workspace)
        if args.reproduce:
            return reproduce(args, env)
        results = []
        for target in args.targets:
            result = run_target(target, args, env, seeds, workdir)
            report(result)
            results.append(result)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    (workdir / "summary.json").write_text(json.dumps(results, indent=2) + "\n")
    clean = all(r["clean"] for r in results)
    log("fuzzing clean" if clean else "fuzzing found problems (see above)")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
