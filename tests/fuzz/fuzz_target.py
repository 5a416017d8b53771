"""atheris entry point: ``python tests/fuzz/fuzz_target.py TARGET [libFuzzer args...]``.

TARGET is ``record`` or ``queue`` (see fuzz_harness). The remaining arguments go to libFuzzer
(corpus folders, -max_total_time=, -runs=, -artifact_prefix=, or input files to replay).

Coverage feedback comes from instrumented Python only: rmq_source (native.py is what runs per
input) and the model, whose branches mirror the C core's decisions. The C core itself is not
instrumented; run_fuzz.py runs it under AddressSanitizer. Instrumenting more (the harness,
pyarrow) costs speed without guiding better.

RMQ_FUZZ_SELFTEST=python|segv makes every input fail (an AssertionError, or a wild read in C);
run_fuzz.py's self-check uses it to prove that findings are detected.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in ("record", "queue"):
        sys.exit("usage: python tests/fuzz/fuzz_target.py record|queue [libFuzzer args...]")
    name = sys.argv.pop(1)
    import atheris
    import pyarrow  # noqa: F401  (compiled code; imported before instrumentation on purpose)

    with atheris.instrument_imports(include=["rmq_source", "fuzz_model"]):
        import fuzz_harness
    target = fuzz_harness.TARGETS[name]
    selftest = os.environ.get("RMQ_FUZZ_SELFTEST", "")

    def test_one_input(data: bytes) -> None:
        if selftest == "python":
            raise fuzz_harness.Finding("self-test finding")
        if selftest == "segv":
            import ctypes
            ctypes.string_at(8, 1)          # (address 0 would make a fresh buffer)
        target(data)

    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
