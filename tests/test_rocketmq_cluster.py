"""The cluster fixture's download cache and skip rules, with a stand-in ``mvn`` (no network)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import rocketmq_archive
import rocketmq_cluster as rc

FAKE_MVN = """#!/bin/sh
# stand-in for mvn: counts its runs, writes one jar per artifact into -DoutputDirectory
echo run >> "$FAKE_MVN_LOG"
for a in "$@"; do case "$a" in -DoutputDirectory=*) out="${a#-DoutputDirectory=}";; esac; done
[ -n "$FAKE_MVN_FAIL" ] && { echo "Could not find artifact org.apache.rocketmq:rocketmq-broker:jar:$FAKE_MVN_FAIL"; exit 1; }
mkdir -p "$out" && touch "$out/rocketmq-broker-x.jar" "$out/rocketmq-namesrv-x.jar"
"""


@pytest.fixture
def fake_tools(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("mvn", FAKE_MVN), ("java", "#!/bin/sh\nexit 0\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv(rc.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("FAKE_MVN_LOG", str(tmp_path / "mvn.log"))
    return tmp_path


def runs(tmp_path: Path) -> int:
    log = tmp_path / "mvn.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_download_once_into_env_cache(fake_tools):
    folder = rc.resolve_jars("9.9.9")
    assert folder == fake_tools / "cache" / "rocketmq-9.9.9"
    assert (folder / rc.MARKER).is_file() and (folder / "rocketmq-broker-x.jar").is_file()
    assert rc.resolve_jars("9.9.9") == folder
    assert runs(fake_tools) == 1


def test_interrupted_download_is_redone(fake_tools):
    folder = fake_tools / "cache" / "rocketmq-9.9.9"
    folder.mkdir(parents=True)
    (folder / "rocketmq-broker-half.jar").write_text("partial")      # no marker: incomplete
    rc.resolve_jars("9.9.9")
    assert runs(fake_tools) == 1 and not (folder / "rocketmq-broker-half.jar").exists()
    assert (folder / rc.MARKER).is_file()


def test_line_falls_back_to_older_version_and_remembers(fake_tools, monkeypatch):
    monkeypatch.setattr(rc, "LINES", {"9.9": ("9.9.9", "9.9.8")})
    monkeypatch.setenv("FAKE_MVN_FAIL", "x")
    with pytest.raises(rc.BrokerUnavailable, match="no RocketMQ 9.9.x resolved"):
        rc.resolve_line("9.9")
    assert (fake_tools / "cache" / "rocketmq-9.9.9.unavailable").is_file()
    monkeypatch.delenv("FAKE_MVN_FAIL")
    (fake_tools / "cache" / "rocketmq-9.9.8.unavailable").unlink()
    assert rc.resolve_line("9.9")[0] == "9.9.8"


def test_missing_tools_named(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    reason = rc.tool_missing()
    assert "Java 17" in reason and "Maven" in reason
    with pytest.raises(rc.BrokerUnavailable, match="Maven"):
        rc.resolve_jars("4.9.7")


@pytest.mark.parametrize("require, outcome", [("", "skipped"), ("1", "error")])
def test_skip_becomes_failure_when_required(tmp_path, require, outcome):
    test = tmp_path / "test_needs_broker.py"
    test.write_text("import pytest\n\n@pytest.mark.broker\ndef test_x(rocketmq):\n    pass\n")
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PATH=str(tmp_path), RMQ_REQUIRE_BROKER=require, PYTHONPATH=str(repo))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(repo),
                           "-c", str(repo / "pyproject.toml"), "-p", "conftest", str(test),
                           "-o", "testpaths=", "-rs"], capture_output=True, text=True, env=env, cwd=repo,
                          timeout=120)
    assert f"2 {outcome}" in proc.stdout, proc.stdout[-2000:]
    assert "Java 17" in proc.stdout and "Maven" in proc.stdout


@pytest.mark.broker
def test_a_port_taken_before_the_jvm_binds_it_is_replaced(rocketmq_jars, tmp_path, monkeypatch):
    """Suites side by side: a port found free may be taken before the server binds it; the server
    is launched again on another one instead of failing the test."""
    import socket
    version, jars = rocketmq_jars("4.9")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    real, picks = rc.free_port, [taken.getsockname()[1]]
    monkeypatch.setattr(rc, "free_port", lambda span=(0,): picks.pop() if picks else real(span))
    server = rc.NameServer(version, jars, tmp_path / "ns")
    assert server.port == taken.getsockname()[1]
    try:
        server.start()
        assert server.alive() and server.port != taken.getsockname()[1]
        assert "Address already in use" in server.stdout_path.read_text(errors="replace")
        # a booted server's threads have the relaxed timers (rc.relax_timers; root on CI)
        if os.geteuid() == 0:
            slack = {Path(f"/proc/{tid}/timerslack_ns").read_text().strip()
                     for tid in os.listdir(f"/proc/{server.proc.pid}/task")}
            assert str(rc.SERVER_TIMER_SLACK_NS) in slack, slack
    finally:
        server.stop(graceful=False)
        taken.close()


@pytest.mark.broker
@pytest.mark.parametrize("line", ["4.9", "5.3"])
def test_the_runs_class_data_archive_maps_the_servers_classes(rocketmq_jars, line):
    """Every server JVM of a run on these jars starts from the run's archive (made on the first
    start): ``-Xshare:on`` refuses to start a JVM that cannot map it; the servers' and mqadmin's
    own classes come from it."""
    version, jars = rocketmq_jars(line)
    options = rocketmq_archive.java_options(version, jars)
    assert options and options[0].startswith("-XX:SharedArchiveFile="), options
    cmd = ["java", "-Xshare:on", options[0], "-Xlog:class+load=info", *rc.TEST_JVM_OPTS,
           *rc.ADD_OPENS, "-cp", rc.java_class_path(jars), rc.NAMESRV_MAIN, "-h"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert f"{rc.NAMESRV_MAIN} source: shared objects file" in out.stdout, out.stdout[-2000:] + out.stderr
    # mapped: the broker's and the tools' classes (loaded by their own boots)
    listed = subprocess.run(["java", "-Xshare:on", options[0], "-XX:+PrintSharedArchiveAndExit",
                             "-cp", rc.java_class_path(jars)], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stdout[-2000:] + listed.stderr
    for cls in ("org.apache.rocketmq.broker.BrokerController", "org.apache.rocketmq.tools.admin.DefaultMQAdminExt"):
        assert f" {cls} " in listed.stdout, cls


def test_no_archive_outside_a_run_or_when_its_folder_is_gone(tmp_path, monkeypatch):
    """The benches' servers start without an archive; a helper whose run's folder was removed
    starts its servers without one too, instead of failing."""
    import spark_archive
    monkeypatch.delenv(spark_archive.ENV, raising=False)
    assert rocketmq_archive.java_options("9.9.9", tmp_path / "rocketmq-9.9.9") == ()
    monkeypatch.setenv(spark_archive.ENV, str(tmp_path / "gone" / "spark.jsa"))
    assert rocketmq_archive.java_options("9.9.9", tmp_path / "rocketmq-9.9.9") == ()


def test_a_process_ended_by_sigterm_stops_the_servers_it_started(tmp_path):
    """``timeout`` or ``kill`` on a bench or a test session: its JVMs run in their own sessions,
    so only the process's own exit path can stop them; SIGTERM takes that path (SystemExit, the
    atexit stop) instead of killing the process on the spot. (A stand-in server: the launch and
    the stop are JavaServer's whatever the command.)"""
    import signal
    import time
    child = subprocess.Popen(
        [sys.executable, "-c", "import time, rocketmq_cluster as rc\n"
         "class Stand(rc.JavaServer):\n"
         "    def java_command(self, main, args): return ['sleep', '600']\n"
         "    def args(self): return []\n"
         f"s = Stand('4.9.7', '.', {str(tmp_path / 'server')!r}).launch()\n"
         "print(s.proc.pid, flush=True)\ntime.sleep(600)\n"],
        cwd=Path(__file__).parent, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)})
    server = None
    try:
        server = int(child.stdout.readline())
        child.send_signal(signal.SIGTERM)
        assert child.wait(60) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{server}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{server}"), "the server outlived the process that started it"
    finally:
        child.kill()
        child.wait()
        if server is not None and os.path.exists(f"/proc/{server}"):
            os.kill(server, signal.SIGKILL)
