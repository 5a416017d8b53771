"""The rmq-store command line, run as real subprocesses (python -m rmq_source ...)."""
from __future__ import annotations

import base64
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import fixture_dir

pytest.importorskip("rmq_source.store.reader", reason="the CLI reads stores through rmq_source.store.reader")


def run(*args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rmq_source", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli") / "store"
    out = run("generate", root, "--topic", "T", "--queues", 3, "--messages", 300, "--body-size", 100,
              "--tags", "TagA,TagB", "--keys-per-message", 2, "--commitlog-file-size", 16384,
              "--cq-units-per-file", 32, "--seed", 7)
    assert out.returncode == 0, out.stderr
    return root, out


def test_generate_writes_a_store_with_progress_on_stderr(sample):
    root, out = sample
    assert out.stdout.startswith("appended 300 messages to topic 'T'")
    assert "100%" in out.stderr and "300/300" in out.stderr
    assert len(list((root / "commitlog").iterdir())) > 2


def test_topics_json(sample):
    root, _ = sample
    out = run("topics", root, "--json")
    assert out.returncode == 0, out.stderr
    rows = [r for r in json_lines(out.stdout) if r["topic"] == "T"]
    assert [(r["queueId"], r["minOffset"], r["maxOffset"]) for r in rows] == [
        (0, 0, 100), (1, 0, 100), (2, 0, 100)]


def test_topics_human(sample):
    root, _ = sample
    out = run("topics", root)
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["TOPIC", "QUEUE", "MIN", "MAX", "MESSAGES"]
    assert ["T", "1", "0", "100", "100"] in [line.split() for line in lines]


def test_print_json_has_every_column(sample):
    root, _ = sample
    out = run("print", root, "--topic", "T", "--json")
    assert out.returncode == 0, out.stderr
    rows = json_lines(out.stdout)
    assert len(rows) == 300
    from rmq_source.schema import ARROW_SCHEMA
    assert list(rows[0]) == ARROW_SCHEMA.names
    # every queue of the topic, min to max, in queue order
    assert [(r["queueId"], r["queueOffset"]) for r in rows] == [(q, o) for q in range(3)
                                                                 for o in range(100)]
    for r in rows:
        assert len(base64.b64decode(r["body"])) == 100
        assert r["tags"] in ("TagA", "TagB") and len(r["keys"]) == 2
        assert r["properties"]["TAGS"] == r["tags"] and r["properties"]["UNIQ_KEY"] == r["uniqKey"]
        assert isinstance(r["storeTimestamp"], int) and r["storeTimestamp"] > 1_600_000_000_000
        assert r["msgId"] == "7F00000100002A9F" + f"{r['commitLogOffset']:016X}"


@pytest.mark.parametrize("extra, expected", [
    (["--queue", 1, "--from", 10, "--to", 13], [(1, 10), (1, 11), (1, 12)]),
    (["--queue", 2, "--from", 98], [(2, 98), (2, 99)]),
    (["--queue", 0, "--to", 2], [(0, 0), (0, 1)]),
    (["--queue", 0, "--from", 100], []),
    (["--queue", 0, "--from", 5, "--to", 5], []),
])
def test_print_ranges(sample, extra, expected):
    root, _ = sample
    out = run("print", root, "--topic", "T", "--json", *extra)
    assert out.returncode == 0, out.stderr
    assert [(r["queueId"], r["queueOffset"]) for r in json_lines(out.stdout)] == expected


def test_print_sub_expression(sample):
    root, _ = sample
    everything = json_lines(run("print", root, "--topic", "T", "--json").stdout)
    out = run("print", root, "--topic", "T", "--json", "--sub-expression", "TagB")
    assert out.returncode == 0
    assert [r["msgId"] for r in json_lines(out.stdout)] == [r["msgId"] for r in everything
                                                            if r["tags"] == "TagB"]


def test_print_human_lines(sample):
    root, _ = sample
    out = run("print", root, "--topic", "T", "--queue", 2, "--from", 4, "--to", 6)
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("T/2@4  ") and lines[1].startswith("T/2@5  ")
    assert "msgId=7F00000100002A9F" in lines[0] and "tags=Tag" in lines[0]


def test_generate_appends_to_an_existing_store(tmp_path):
    root = tmp_path / "s"
    assert run("generate", root, "--topic", "T", "--queues", 2, "--messages", 10, "--no-progress",
               "--commitlog-file-size", 8192, "--cq-units-per-file", 4).returncode == 0
    out = run("generate", root, "--topic", "T", "--messages", 6, "--no-progress")
    assert out.returncode == 0, out.stderr
    rows = json_lines(run("topics", root, "--json").stdout)
    assert {(r["topic"], r["queueId"]): r["maxOffset"] for r in rows if r["topic"] == "T"} == {
        ("T", 0): 8, ("T", 1): 8}
    second = run("generate", root, "--topic", "U", "--queues", 1, "--messages", 3, "--no-progress")
    assert second.returncode == 0


def test_generate_rate_paces_the_store_timestamps(tmp_path):
    root = tmp_path / "s"
    out = run("generate", root, "--topic", "T", "--queues", 1, "--messages", 11, "--rate", 50,
              "--no-progress", "--commitlog-file-size", 65536)
    assert out.returncode == 0, out.stderr
    rows = json_lines(run("print", root, "--topic", "T", "--json").stdout)
    assert rows[-1]["storeTimestamp"] - rows[0]["storeTimestamp"] >= 190   # 10 gaps of 20 ms


@pytest.mark.parametrize("args, fragment", [
    ([], "usage error"),
    (["generate", "X", "--topic", "T", "--messages", "-1"], "must be >= 0"),
    (["generate", "X", "--topic", "T", "--messages", "x"], "not an integer"),
    (["generate", "X", "--messages", "1"], "--topic"),
    (["print", "X"], "--topic"),
    (["topics"], "STORE"),
    (["bogus"], "invalid choice"),
    (["topics", "X", "--nope"], "unrecognized arguments"),
    (["generate", "X", "--topic", "T", "--messages", 1, "--rate", 0], "positive"),
])
def test_usage_errors_exit_2(tmp_path, args, fragment):
    out = run(*args)
    assert out.returncode == 2
    assert fragment in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "X").exists()


@pytest.mark.parametrize("args, fragment", [
    (["generate", "{root}", "--topic", "NewTopic", "--messages", 1], "--queues is required"),
    (["generate", "{root}", "--topic", "bad/topic", "--queues", 1, "--messages", 1],
     "invalid characters"),
    (["generate", "{root}", "--topic", "T", "--messages", 1, "--tags", "A,,B"], "empty tag"),
    (["generate", "{root}", "--topic", "T", "--messages", 1, "--commitlog-file-size", 999],
     "commitlog_file_size"),
    (["print", "{root}", "--topic", "T", "--from", 5, "--to", 2], "before --from"),
])
def test_option_errors_exit_2(sample, args, fragment):
    root, _ = sample
    out = run(*(str(a).replace("{root}", str(root)) for a in args))
    assert out.returncode == 2, out.stderr
    assert fragment in out.stderr and len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args, fragment", [
    (["topics", "{missing}"], "not a directory"),
    (["print", "{root}", "--topic", "Nope"], "Nope"),
    (["print", "{root}", "--topic", "T", "--queue", 7], "no queue 7"),
])
def test_store_errors_exit_3(sample, tmp_path, args, fragment):
    root, _ = sample
    out = run(*(str(a).replace("{root}", str(root)).replace("{missing}", str(tmp_path / "none"))
                for a in args))
    assert out.returncode == 3, out.stderr
    assert fragment in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_corrupt_record_exits_3_naming_the_file(tmp_path):
    root = tmp_path / "s"
    assert run("generate", root, "--topic", "T", "--queues", 1, "--messages", 5, "--no-progress",
               "--commitlog-file-size", 8192).returncode == 0
    first = root / "commitlog" / f"{0:020d}"
    data = bytearray(first.read_bytes())
    size = struct.unpack_from(">i", data, 0)[0]
    data[size + 4:size + 8] = b"\x12\x34\x56\x78"        # magic of the second record
    first.write_bytes(bytes(data))
    out = run("print", root, "--topic", "T", "--json")
    assert out.returncode == 3
    assert "00000000000000000000" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_data_deleted_by_retention_exits_3(tmp_path):
    root = tmp_path / "s"
    assert run("generate", root, "--topic", "T", "--queues", 1, "--messages", 200, "--no-progress",
               "--commitlog-file-size", 8192, "--cq-units-per-file", 8).returncode == 0
    from rmq_source.store.writer import delete_oldest_commitlog_files
    delete_oldest_commitlog_files(root, 2)
    ok = run("print", root, "--topic", "T", "--json")              # default range: min..max
    assert ok.returncode == 0 and json_lines(ok.stdout)[0]["queueOffset"] > 0
    out = run("print", root, "--topic", "T", "--from", 0)
    assert out.returncode == 3 and "retention" in out.stderr


def test_print_to_a_closed_pipe_is_quiet(sample):
    root, _ = sample
    proc = subprocess.Popen([sys.executable, "-m", "rmq_source", "print", str(root), "--topic", "T"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and b"Traceback" not in err


def test_print_the_brokers_store():
    base = fixture_dir("rocketmq-4.9.3/basic")
    out = run("print", base / "store", "--topic", "TopicTest", "--queue", 0, "--json")
    assert out.returncode == 0, out.stderr
    rows = json_lines(out.stdout)
    manifest = [json.loads(line) for line in open(base / "manifest.jsonl", encoding="utf-8")]
    expected = [m for m in manifest if m["topic"] == "TopicTest" and m["queueId"] == 0]
    assert [r["msgId"] for r in rows] == [m["msgId"] for m in expected]
    assert [r["body"] for r in rows] == [m["body"] for m in expected]
    assert [r["properties"] for r in rows] == [m["properties"] for m in expected]


def test_console_script_entry_point_is_main():
    from rmq_source import cli
    assert callable(cli.main)
    assert cli.main(["topics", "/nonexistent/store/path"]) == 3


def test_installed_console_script(sample):
    # The script sits beside the interpreter running the tests (a venv's bin/), which need not be
    # on PATH (``.venv/bin/python -m pytest``); a missing script is a packaging failure.
    exe = Path(sys.executable).parent / ("rmq-store.exe" if os.name == "nt" else "rmq-store")
    assert exe.is_file(), f"console script {exe} not installed (pip install -e .)"
    root, _ = sample
    out = subprocess.run([exe, "topics", str(root), "--json"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and '"topic": "T"' in out.stdout
