"""Real Apache RocketMQ servers for tests and benchmarks.

Resolves the NameServer, broker, Java client and tools jars of one RocketMQ version from Maven Central
(``mvn dependency:copy-dependencies`` on a generated pom) into a cache folder outside the repository,
then starts NameServers and brokers on free loopback ports with small stores and bounded JVM memory.

Cache: ``$RMQ_JARS_CACHE`` (default ``~/.cache/rmq_source``), one folder ``rocketmq-<version>`` a
version; a ``.complete`` marker is written only after a download finished, so an interrupted one is
redone from scratch.

Usable without pytest (bench/): ``resolve_jars("4.9.8")``, ``NameServer(...)``, ``Broker(...)``.
"""
from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import loopback
import rocketmq_archive
from phase_timings import timed

#: The two lines the suite runs against, newest first: the last 4.9.x and the newest 5.3.x whose
#: server artifacts resolve. (4.9.8's rocketmq-namesrv and rocketmq-broker are not on Maven Central,
#: only its client and tools; 4.9.7 is the newest 4.9.x with all four.)
VERSION_4_CANDIDATES = ("4.9.8", "4.9.7")
VERSION_5_CANDIDATES = ("5.3.4", "5.3.3", "5.3.2")
LINES = {"4.9": VERSION_4_CANDIDATES, "5.3": VERSION_5_CANDIDATES}
ARTIFACTS = ("rocketmq-namesrv", "rocketmq-broker", "rocketmq-client", "rocketmq-tools")
CACHE_ENV = "RMQ_JARS_CACHE"
REQUIRE_ENV = "RMQ_REQUIRE_BROKER"
MARKER = ".complete"

NAMESRV_MAIN = "org.apache.rocketmq.namesrv.NamesrvStartup"
BROKER_MAIN = "org.apache.rocketmq.broker.BrokerStartup"
MQADMIN_MAIN = "org.apache.rocketmq.tools.command.MQAdminStartup"
PROXY_MAIN = "org.apache.rocketmq.proxy.ProxyStartup"
UPDATE_BROKER_CONFIG = 25          # RequestCode.UPDATE_BROKER_CONFIG

ADD_OPENS = [
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
]

#: JVM flags of the test servers: a small serial heap, C1 only (they start faster; no long runs)
TEST_JVM_OPTS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")

_POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>rmq_source.tests</groupId>
  <artifactId>rocketmq-jars</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
{deps}
  </dependencies>
</project>
"""
_DEP = """    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version></dependency>"""

_LOGBACK = """<?xml version="1.0" encoding="UTF-8"?>
<configuration>
  <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%d{HH:mm:ss.SSS} %-5level %logger{20} - %msg%n</pattern></encoder>
  </appender>
  <root level="WARN"><appender-ref ref="STDOUT"/></root>
</configuration>
"""


class BrokerUnavailable(Exception):
    """Java, Maven or the RocketMQ jars cannot be had here; ``reason`` says what to install."""


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "rmq_source")


def tool_missing() -> str | None:
    """What to install for the broker tests, or None when Java and Maven are both on PATH."""
    missing = [name for name, exe in (("Java 17 (a JDK: java, javac)", "java"), ("Maven 3 (mvn)", "mvn"))
               if shutil.which(exe) is None]
    if missing:
        return "the broker tests need " + " and ".join(missing) + " on PATH"
    return None


def resolve_jars(version: str, *, timeout: float = 1500.0) -> Path:
    """The folder of every runtime jar of ``version`` (downloaded once into the cache)."""
    return maven_jars(f"rocketmq-{version}", [("org.apache.rocketmq", a, version) for a in ARTIFACTS],
                      "rocketmq-broker-*.jar", timeout=timeout, what=f"RocketMQ {version}")


def resolve_proxy_jars(version: str, *, timeout: float = 1500.0) -> Path:
    """The folder of the runtime jars of RocketMQ ``version``'s Proxy (``rocketmq-proxy`` and its
    dependencies, gRPC included), downloaded once into the cache beside the servers' jars (the
    broker's jars are among them: the Proxy runs in a JVM of its own with this folder alone)."""
    return maven_jars(f"rocketmq-proxy-{version}", [("org.apache.rocketmq", "rocketmq-proxy", version)],
                      "rocketmq-proxy-*.jar", timeout=timeout, what=f"RocketMQ Proxy {version}")


def maven_jars(name: str, coords, expect_glob: str, *, timeout: float = 1500.0, what: str = "") -> Path:
    """The folder ``name`` in the cache holding the runtime jars of ``coords`` ((group, artifact,
    version) tuples) and their dependencies, resolved from Maven Central once; ``expect_glob`` names a
    jar that must be among them."""
    why = tool_missing()
    if why:
        raise BrokerUnavailable(why)
    folder = cache_root() / name
    if (folder / MARKER).is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    # test runs or benches started side by side download one at a time
    with open(folder.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / MARKER).is_file():
            return folder
        return _download(coords, folder, expect_glob, timeout, what or name)


def _download(coords, folder: Path, expect_glob: str, timeout: float, what: str) -> Path:
    if folder.exists():
        shutil.rmtree(folder)          # an interrupted download: start again
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{folder.name}-", dir=folder.parent))
    try:
        deps = "\n".join(_DEP.format(g=g, a=a, v=v) for g, a, v in coords)
        (work / "pom.xml").write_text(_POM.format(deps=deps))
        jars = work / "lib"
        cmd = ["mvn", "-B", "-q", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
               "-DincludeScope=runtime", f"-DoutputDirectory={jars}"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise BrokerUnavailable(f"mvn did not resolve {what} in {timeout:.0f} s") from exc
        if proc.returncode != 0 or not any(jars.glob(expect_glob)):
            tail = (proc.stdout + proc.stderr)[-2000:]
            raise BrokerUnavailable(f"mvn could not resolve {what} (exit {proc.returncode}): {tail}")
        (jars / MARKER).write_text(f"{what}\n")
        os.replace(jars, folder)        # appears whole, marker included
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return folder


def resolve_line(line: str) -> tuple[str, Path]:
    """The newest version of ``line`` ("4.9" or "5.3") whose four artifacts resolve, and its jar folder.

    A version that failed to resolve is remembered (``rocketmq-<version>.unavailable`` in the cache) for a
    day, so later runs do not ask Maven again.
    """
    why = tool_missing()
    if why:                      # cached jars are no use without a JVM
        raise BrokerUnavailable(why)
    candidates = LINES[line]
    for version in candidates:
        folder = cache_root() / f"rocketmq-{version}"
        if (folder / MARKER).is_file():
            return version, folder
    errors = []
    for version in candidates:
        miss = cache_root() / f"rocketmq-{version}.unavailable"
        if miss.is_file() and time.time() - miss.stat().st_mtime < 86400:
            errors.append(f"{version}: {miss.read_text()[:300]}")
            continue
        try:
            return version, resolve_jars(version)
        except BrokerUnavailable as exc:
            if tool_missing() or not ("Could not find artifact" in str(exc) or "was not found in" in str(exc)):
                raise
            miss.write_text(str(exc)[-600:])
            errors.append(f"{version}: {str(exc)[:300]}")
    raise BrokerUnavailable(f"no RocketMQ {line}.x resolved: " + " | ".join(errors))


# --------------------------------------------------------------------------- ports and processes

def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    # (a program holding the wildcard address on the port makes this bind fail too)
    return True


_handed_out: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (Linux's default when unreadable)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            low, high = (int(v) for v in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _port_choices(span: tuple[int, ...]) -> range:
    """Where :func:`free_port` picks: ports 10000 and up outside the ephemeral range. A port in
    that range can be taken by any outgoing connection on the machine while its server is down,
    so a broker restarted on its own port (the fault tests) could find it in use."""
    low, high = _ephemeral_range()
    below = range(10000 - min(span), low - max(span))
    above = range(high + 1 - min(span), 65536 - max(span))
    best = max(below, above, key=len)
    return best if len(best) >= 2000 else range(20000, 59000)   # a narrow machine: as before


def free_port(span: tuple[int, ...] = (0,)) -> int:
    """A port P such that P+d is free on loopback for every d in ``span`` (never handed out twice
    by this process), outside the kernel's ephemeral port range (:func:`_port_choices`)."""
    import random
    rng = random.Random()
    choices = _port_choices(span)
    for _ in range(500):
        base = rng.choice(choices)
        ports = [base + d for d in span]
        if any(p in _handed_out for p in ports):
            continue
        if all(_port_free(p) for p in ports):
            _handed_out.update(ports)
            return base
    raise RuntimeError(f"no free loopback port range {span} in {choices}")


class ServerError(RuntimeError):
    """A RocketMQ server did not start (its log tail is in the message)."""


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


_running: set["JavaServer"] = set()


@atexit.register
def _stop_leftovers() -> None:
    """No JVM outlives the Python process that started it (an interrupted session, a bench crash)."""
    for server in list(_running):
        server.stop(timeout=10)


def _exit_on_sigterm() -> None:
    """A SIGTERM (``timeout``, ``kill``) ends this process through SystemExit, so the atexit stop
    above runs: by default the signal kills it at once and its JVMs, in their own sessions, live
    on. Only where nothing else handles the signal, from the main thread."""
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL):
        signal.signal(signal.SIGTERM, _raise_exit)


def _raise_exit(signum, _frame) -> None:
    raise SystemExit(128 + signum)


class JavaServer:
    """One RocketMQ JVM: started in its own process group, stopped with SIGTERM then SIGKILL."""

    boot_line = ""
    main_class = ""
    name = "server"

    def __init__(self, version: str, jars: Path, workdir: Path, *, heap_mb: int = 320,
                 direct_mb: int = 256, system_props: dict | None = None,
                 jvm_opts: tuple[str, ...] = TEST_JVM_OPTS, cds: bool = True):
        """``system_props``: Java system properties (``-Dkey=value``) of the JVM, e.g. the
        broker's ``rocketmq.broker.rebalance.lockMaxLiveTime``; ``jvm_opts``: the JIT and GC flags
        (:data:`TEST_JVM_OPTS` boot fast; a bench passes ``()`` for the JVM's defaults);
        ``cds=False``: without the test run's class-data archive (tests/rocketmq_archive.py)."""
        self.jvm_opts = tuple(jvm_opts)
        self.cds = cds
        self.system_props = dict(system_props or {})
        self.version = version
        self.jars = Path(jars)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.home = self.workdir / "home"          # -Duser.home: logs, default store, kv config
        self.rocketmq_home = self.workdir / "rocketmq_home"
        self.stdout_path = self.workdir / "stdout.log"
        self.heap_mb = heap_mb
        self.direct_mb = direct_mb
        self.proc: subprocess.Popen | None = None
        self.port_span: tuple[int, ...] | None = None   # set when the port was picked here
        self.booted = False                  # a restart keeps its port: it is never moved
        self.port = 0

    @property
    def is_v4(self) -> bool:
        return self.version.startswith("4.")

    def _prepare_home(self) -> None:
        conf = self.rocketmq_home / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        for name in ("logback_namesrv.xml", "logback_broker.xml", "logback_tools.xml"):
            (conf / name).write_text(_LOGBACK)
        self.home.mkdir(parents=True, exist_ok=True)

    def java_command(self, main: str, args: list[str]) -> list[str]:
        archive = rocketmq_archive.java_options(self.version, self.jars) if self.cds else ()
        return ["java", f"-Xmx{self.heap_mb}m", "-Xms32m", f"-XX:MaxDirectMemorySize={self.direct_mb}m",
                *self.jvm_opts, *archive, "-Xss512k", *ADD_OPENS,
                f"-Duser.home={self.home}", f"-Drocketmq.home.dir={self.rocketmq_home}",
                "-Drocketmq.broker.diskSpaceWarningLevelRatio=0.98",
                "-Drocketmq.client.logUseSlf4j=true", "-Dio.netty.leakDetection.level=disabled",
                *(f"-D{k}={v}" for k, v in self.system_props.items()),
                "-cp", f"{self.jars}/*", main, *args]

    def java_env(self) -> dict:
        env = dict(os.environ)
        env["ROCKETMQ_HOME"] = str(self.rocketmq_home)
        env.pop("JAVA_TOOL_OPTIONS", None)
        # every socket the server binds to "all interfaces" binds to loopback (tests/loopback_bind.c)
        return loopback.preload_env(env, loopback.bind_shim(cache_root()))

    def args(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout: float = 90.0) -> "JavaServer":
        self.launch()
        self.wait_boot(timeout)
        return self

    def launch(self) -> "JavaServer":
        """Start the JVM without waiting for it to boot (see :meth:`wait_boot`)."""
        self._prepare_home()
        cmd = self.java_command(self.main_class, self.args())
        out = open(self.stdout_path, "ab")
        self._launched_at = time.monotonic()
        self._log_from = out.tell()          # a restart appends: only what it prints counts
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=self.java_env(), cwd=self.workdir, start_new_session=True)
        out.close()
        _running.add(self)
        _exit_on_sigterm()
        return self

    def wait_boot(self, timeout: float = 90.0, relaunches: int = 3) -> None:
        """Wait until the launched JVM printed its boot line; it exiting first, or ``timeout`` seconds
        passing, raises ServerError with its log tails. A port picked here (free when checked) may
        be taken by another program before the JVM binds it (test runs side by side): then the
        server is launched again on new ports, ``relaunches`` times at most (at its first start
        only: a restart keeps its address)."""
        with timed(f"RocketMQ {self.name.split()[0]} boot (from launch)", self.version):
            for attempt in range(relaunches + 1):
                try:
                    self._wait_boot(timeout)
                    self.booted = True
                    self.check_loopback()
                    relax_timers(self.proc.pid)
                    return
                except ServerError:
                    if (attempt == relaunches or self.port_span is None or self.booted or self.alive()
                            or "Address already in use" not in self._own_output()):
                        raise
                self.port = free_port(self.port_span)
                self.launch()

    def check_loopback(self) -> None:
        """Raise ServerError when the booted server listens or talks on an address other than
        loopback (tests/loopback.py)."""
        offenders = loopback.offenders_of(self.proc.pid)
        if offenders:
            self.stop(graceful=False)
            raise ServerError(f"{self.name} (RocketMQ {self.version}) is open beyond loopback: "
                              + "; ".join(offenders))

    def _own_output(self) -> str:
        """What the JVM printed since its last launch."""
        try:
            with open(self.stdout_path, "rb") as f:
                f.seek(self._log_from)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _wait_boot(self, timeout: float) -> None:
        deadline = self._launched_at + timeout
        while time.monotonic() < deadline:
            if self.boot_line in self._own_output():
                return
            if self.proc.poll() is not None:
                raise ServerError(f"{self.name} (RocketMQ {self.version}) exited with {self.proc.returncode} "
                                  f"before booting:\n{self.log_tails()}")
            time.sleep(0.1)
        self.stop()
        raise ServerError(f"{self.name} (RocketMQ {self.version}) printed no boot line in {timeout:.0f} s:\n"
                          f"{self.log_tails()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 30.0, graceful: bool = True) -> int | None:
        """SIGTERM to the JVM (its shutdown hooks flush the store), then SIGKILL to its group;
        ``graceful=False``: SIGKILL at once (a cluster thrown away at the end of a test run)."""
        proc = self.proc
        if proc is None:
            return None
        _running.discard(self)
        with timed("RocketMQ server stop", "graceful" if graceful else "SIGKILL"):
            return self._stop(proc, timeout, graceful)

    def _stop(self, proc: subprocess.Popen, timeout: float, graceful: bool) -> int | None:
        if graceful and proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        return proc.returncode

    def kill(self) -> None:
        """SIGKILL at once (a crash: the store keeps its abort file)."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)

    def log_files(self) -> list[Path]:
        files = [self.stdout_path]
        logs = self.home / "logs"
        if logs.is_dir():
            files += sorted(p for p in logs.rglob("*.log") if p.is_file())
        return files

    def log_tails(self, lines: int = 30) -> str:
        parts = []
        for path in self.log_files():
            wanted = lines if path == self.stdout_path or path.name in (
                "broker.log", "namesrv.log", "store.log", "remoting.log") else 0
            if wanted:
                parts.append(f"--- {path} (last {wanted} lines)\n{_tail(path, wanted)}")
        return "\n".join(parts)


class NameServer(JavaServer):
    main_class = NAMESRV_MAIN
    boot_line = "The Name Server boot success"
    name = "NameServer"

    def __init__(self, version: str, jars: Path, workdir: Path, *, port: int | None = None,
                 extra: dict | None = None, **kw):
        """``extra``: more NameServer properties (e.g. the controller's, 5.x)."""
        super().__init__(version, jars, workdir, heap_mb=kw.pop("heap_mb", 192), **kw)
        if port is None:
            self.port_span = (0,)
        self.port = port or free_port()
        self.extra = dict(extra or {})

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def args(self) -> list[str]:
        conf = self.workdir / "namesrv.properties"
        conf.write_text("\n".join([
            f"listenPort={self.port}",
            "bindAddress=127.0.0.1",
            f"kvConfigPath={self.workdir / 'kvConfig.json'}",
            f"configStorePath={self.workdir / 'namesrv.properties.store'}",
            "serverWorkerThreads=2", "serverCallbackExecutorThreads=1", "serverSelectorThreads=1",
            "defaultThreadPoolNums=2", "clientRequestThreadPoolNums=2",
            # routes carry a topic's ORDER_TOPIC_CONFIG when one is set (strictly ordered topics)
            "orderMessageEnable=true",
            *(f"{k}={v}" for k, v in self.extra.items()),
        ]) + "\n")
        return ["-c", str(conf)]


#: Small store files: CommitLog 4 MiB (>= maxMessageSize + headroom), 1,000-unit ConsumeQueue files,
#: index files of about 300 KB.
COMMITLOG_SIZE = 4 * 1024 * 1024 + 128 * 1024
CQ_UNITS = 1000
INDEX_SLOTS = 2000
INDEX_ENTRIES = 8000


class Broker(JavaServer):
    main_class = BROKER_MAIN
    boot_line = "boot success"
    name = "broker"

    def __init__(self, version: str, jars: Path, workdir: Path, *, namesrv: str, name: str = "broker-a",
                 cluster: str = "DefaultCluster", port: int | None = None, store: Path | None = None,
                 commitlog_size: int = COMMITLOG_SIZE, cq_units: int = CQ_UNITS,
                 extra: dict | None = None, acl: list[dict] | None = None, broker_id: int = 0, **kw):
        """``acl``: accounts of RocketMQ's plain ACL (``accessKey``, ``secretKey``, ``admin``,
        ``defaultTopicPerm``, ``defaultGroupPerm``, ``topicPerms``, ``groupPerms``) turn ACL on:
        4.9 reads them from ``conf/plain_acl.yml``; 5.x migrates that file into its ACL 2.0 users
        and policies at boot (``migrateAuthFromV1Enabled``). ``broker_id`` > 0 starts a slave of
        the master ``name`` (it finds the master's HA address through the NameServer)."""
        super().__init__(version, jars, workdir, **kw)
        self.acl = acl
        self.broker_name = name
        self.broker_id = broker_id
        self.name = f"broker {name}" + (f" (slave {broker_id})" if broker_id else "")
        self.cluster = cluster
        self.namesrv = namesrv
        if port is None:
            self.port_span = (-2, 0, 1)       # fast remoting port, listen port, HA port
        self.port = port or free_port((-2, 0, 1))
        self.store = Path(store) if store is not None else self.workdir / "store"
        self.commitlog_size = commitlog_size
        self.cq_units = cq_units
        self.extra = dict(extra or {})

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def properties(self) -> dict:
        props = {
            "brokerClusterName": self.cluster, "brokerName": self.broker_name,
            "brokerId": self.broker_id, "brokerRole": "SLAVE" if self.broker_id else "ASYNC_MASTER",
            "flushDiskType": "ASYNC_FLUSH", "namesrvAddr": self.namesrv,
            "brokerIP1": "127.0.0.1", "brokerIP2": "127.0.0.1", "listenPort": self.port,
            "haListenPort": self.port + 1, "bindAddress": "127.0.0.1",   # 5.x's remoting port
            "storePathRootDir": self.store, "storePathCommitLog": self.store / "commitlog",
            "autoCreateTopicEnable": "true", "autoCreateSubscriptionGroup": "true",
            "enablePropertyFilter": "true",
            "mappedFileSizeCommitLog": self.commitlog_size,
            "mappedFileSizeConsumeQueue": self.cq_units * 20,
            "maxHashSlotNum": INDEX_SLOTS, "maxIndexNum": INDEX_ENTRIES,
            "diskMaxUsedSpaceRatio": 95, "diskSpaceWarningLevelRatio": 0.98,
            "diskSpaceCleanForciblyRatio": 0.97, "deleteWhen": "04", "fileReservedTime": 720,
            "transientStorePoolEnable": "false", "timerWheelEnable": "false",
            "sendMessageThreadPoolNums": 1, "pullMessageThreadPoolNums": 2,
            "queryMessageThreadPoolNums": 1, "adminBrokerThreadPoolNums": 2,
            "clientManageThreadPoolNums": 2, "consumerManageThreadPoolNums": 2,
            "heartbeatThreadPoolNums": 1, "endTransactionThreadPoolNums": 1,
            "processReplyMessageThreadPoolNums": 1, "serverWorkerThreads": 2,
            "serverCallbackExecutorThreads": 1, "serverSelectorThreads": 1,
            "flushConsumerOffsetInterval": 1000,
            "brokerHeartbeatInterval": 5000,
        }
        if self.acl is not None:
            if self.is_v4:
                props["aclEnable"] = "true"
            else:
                props.update({
                    "authenticationEnabled": "true", "authorizationEnabled": "true",
                    "authenticationMetadataProvider":
                        "org.apache.rocketmq.auth.authentication.provider.LocalAuthenticationMetadataProvider",
                    "authorizationMetadataProvider":
                        "org.apache.rocketmq.auth.authorization.provider.LocalAuthorizationMetadataProvider",
                    "migrateAuthFromV1Enabled": "true",
                })
        props.update(self.extra)
        return props

    def _prepare_home(self) -> None:
        super()._prepare_home()
        if self.acl is not None:
            (self.rocketmq_home / "conf" / "plain_acl.yml").write_text(plain_acl_yaml(self.acl))

    def args(self) -> list[str]:
        self.store.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "broker.properties"
        conf.write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        return ["-c", str(conf), "-n", self.namesrv]


#: timer slack of a booted server's threads (ns): see :func:`relax_timers`
SERVER_TIMER_SLACK_NS = 10_000_000


def relax_timers(pid: int) -> None:
    """Let the kernel defer the timed waits of ``pid``'s threads by up to 10 ms (Linux timer
    slack, ``/proc/<tid>/timerslack_ns``; the default is 50 us). An idle broker spends 8 % of a
    core, half of it in ``ReputMessageService``, which sleeps 1 ms between two looks at the
    CommitLog (hard-coded in 4.9 and 5.3); with the slack the thread wakes about every 10 ms and
    the broker idles at 4 %, and a suite keeps three or four brokers running on 2 cores. What the
    servers do is unchanged; new messages reach the consume queues up to 10 ms later. Threads
    started after the boot keep the default; without the permission to write the files
    (CAP_SYS_NICE) nothing changes."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            with open(f"/proc/{tid}/timerslack_ns", "w") as f:
                f.write(str(SERVER_TIMER_SLACK_NS))
        except OSError:
            pass


class Proxy(JavaServer):
    """A RocketMQ 5 Proxy in cluster mode in front of the brokers of ``cluster`` (registered at the
    NameServer ``namesrv`` before it starts: at boot it creates its heartbeat-sync topic on them
    and fails without one). Its remoting port (:attr:`addr`) is what a remoting client names as
    its NameServer: the Proxy answers routes with itself as every broker (``remotingAccessAddr``
    127.0.0.1 here, not the machine's first non-loopback address) and forwards the requests to
    the broker each names (docs/remoting.md, "Through a RocketMQ 5 Proxy").

    ``jars``: the folder of :func:`resolve_proxy_jars`. Both its ports (remoting P, gRPC P+1) are
    bound by the Proxy on the wildcard address, which the loopback shim turns into 127.0.0.1;
    metrics stay off (their exporter would listen too). ``extra``: more ``rmq-proxy.json`` keys.
    A restart (:meth:`start` after :meth:`kill`) keeps both ports."""

    main_class = PROXY_MAIN
    boot_line = "rocketmq-proxy startup successfully"
    name = "Proxy"

    def __init__(self, version: str, jars: Path, workdir: Path, *, namesrv: str,
                 cluster: str = "DefaultCluster", extra: dict | None = None, **kw):
        # (no class-data archive: the Proxy's jars are a folder of their own, started a few times a run)
        kw.setdefault("cds", False)
        super().__init__(version, jars, workdir, heap_mb=kw.pop("heap_mb", 256), **kw)
        self.namesrv = namesrv
        self.cluster = cluster
        self.extra = dict(extra or {})
        self.port_span = (0, 1)            # remoting port, gRPC port
        self.port = free_port(self.port_span)

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def grpc_port(self) -> int:
        return self.port + 1

    def config(self) -> dict:
        """The ``rmq-proxy.json`` of this Proxy: small thread pools (a test JVM on 2 cores)."""
        return {
            "rocketMQClusterName": self.cluster, "namesrvAddr": self.namesrv,
            "proxyMode": "cluster", "proxyName": f"proxy-{self.port}",
            "localServeAddr": "127.0.0.1", "remotingAccessAddr": "127.0.0.1",
            "remotingListenPort": self.port, "grpcServerPort": self.grpc_port,
            "metricsExporterType": "DISABLE", "enablePrintJstack": False,
            "grpcBossLoopNum": 1, "grpcWorkerLoopNum": 1, "grpcThreadPoolNums": 2,
            "rocketmqMQClientNum": 2, "heartbeatSyncerThreadPoolNums": 1,
            "transactionHeartbeatThreadPoolNums": 1, "metadataThreadPoolNums": 1,
            "renewThreadPoolNums": 1, "renewMaxThreadPoolNums": 1,
            "remotingHeartbeatThreadPoolNums": 2, "remotingTopicRouteThreadPoolNums": 2,
            "remotingSendMessageThreadPoolNums": 2, "remotingPullMessageThreadPoolNums": 4,
            "remotingUpdateOffsetThreadPoolNums": 2, "remotingDefaultThreadPoolNums": 4,
            **self.extra,
        }

    def args(self) -> list[str]:
        import json
        conf = self.workdir / "rmq-proxy.json"
        conf.write_text(json.dumps(self.config(), indent=1))
        return ["-pm", "cluster", "-pc", str(conf)]

    def log_files(self) -> list[Path]:
        return [self.stdout_path] + sorted((self.home / "logs").rglob("proxy.log"))

    def log_tails(self, lines: int = 30) -> str:
        return "\n".join(f"--- {p} (last {lines} lines)\n{_tail(p, lines)}" for p in self.log_files())


def plain_acl_yaml(accounts: list[dict]) -> str:
    """RocketMQ's ``plain_acl.yml`` for ``accounts`` (see :class:`Broker`)."""
    out = ["globalWhiteRemoteAddresses: []", "accounts:"]
    for acc in accounts:
        out.append(f"  - accessKey: {acc['accessKey']}")
        out.append(f"    secretKey: {acc['secretKey']}")
        out.append(f"    admin: {'true' if acc.get('admin') else 'false'}")
        for key in ("defaultTopicPerm", "defaultGroupPerm"):
            if key in acc:
                out.append(f"    {key}: {acc[key]}")
        for key in ("topicPerms", "groupPerms"):
            if acc.get(key):
                out.append(f"    {key}:")
                out.extend(f"      - {perm}" for perm in acc[key])
    return "\n".join(out) + "\n"


def java_class_path(jars: Path) -> str:
    return f"{jars}/*"


class Cluster:
    """A NameServer and ``len(broker_names)`` brokers of one version, under ``workdir``.

    ``wait_registered`` polls GET_BROKER_CLUSTER_INFO through rmq_source's own remoting client until
    every broker is listed. ``stop()`` stops every JVM started (brokers first).
    """

    def __init__(self, version: str, jars: Path, workdir: Path, *, broker_names=("broker-a",),
                 cluster: str = "DefaultCluster", broker_kw: dict | None = None,
                 namesrv_extra: dict | None = None, system_props: dict | None = None,
                 client_tls=None):
        """``broker_kw``: keyword arguments of every :class:`Broker` started (e.g. ``acl``);
        ``namesrv_extra``: more NameServer properties; ``system_props``: Java system properties
        of every server (e.g. TLS: :func:`tls_server_props`); ``client_tls``: the
        :class:`rmq_source.remote.tls.TlsConfig` this helper's own requests need."""
        self.version = version
        self.jars = Path(jars)
        self.workdir = Path(workdir)
        self.cluster_name = cluster
        self.system_props = dict(system_props or {})
        self.client_tls = client_tls
        self.namesrv = NameServer(version, jars, self.workdir / "namesrv", extra=namesrv_extra,
                                  system_props=self.system_props)
        self.brokers: dict[str, Broker] = {}
        self._broker_names = tuple(broker_names)
        self.broker_kw = dict(broker_kw or {})
        if self.system_props:
            self.broker_kw.setdefault("system_props", self.system_props)
        self.started: list[JavaServer] = []

    @property
    def namesrv_addr(self) -> str:
        return self.namesrv.addr

    def start(self) -> "Cluster":
        """Start the NameServer, then every broker at once (their JVMs boot side by side)."""
        try:
            self.namesrv.start()
            self.started.append(self.namesrv)
            brokers = [self._broker(name) for name in self._broker_names]
            for broker in brokers:
                broker.launch()
                self.started.append(broker)
            for broker in brokers:
                broker.wait_boot()
                self.wait_registered(broker.broker_name, broker.addr, timeout=90.0)
        except BaseException:
            self.stop(graceful=False)
            raise
        return self

    def _broker(self, name: str, *, store: Path | None = None, workdir: Path | None = None,
                broker_id: int = 0, **kw) -> Broker:
        """Broker ``name`` (slave ``broker_id``) as kept in ``brokers``: the old one when it is
        restarted on its own port and store, else a new one."""
        key = f"{name}-slave{broker_id}" if broker_id else name
        old = self.brokers.get(key)
        if old is not None and old.alive():
            raise RuntimeError(f"broker {key} is running")
        if old is not None and store is None and workdir is None:
            broker = old                      # restart on the same port and store
        else:
            broker = Broker(self.version, self.jars, workdir or self.workdir / f"{key}-{len(self.started)}",
                            namesrv=self.namesrv.addr, name=name, cluster=self.cluster_name,
                            store=store, broker_id=broker_id, **{**self.broker_kw, **kw})
        self.brokers[key] = broker
        return broker

    def start_broker(self, name: str, *, store: Path | None = None, workdir: Path | None = None,
                     timeout: float = 90.0, broker_id: int = 0, **kw) -> Broker:
        """Start (or restart, on the same port and store) broker ``name`` (its slave ``broker_id``
        when > 0, kept in ``brokers`` as ``<name>-slave<id>``); waits for registration."""
        broker = self._broker(name, store=store, workdir=workdir, broker_id=broker_id, **kw)
        broker.start(timeout)
        if broker not in self.started:
            self.started.append(broker)
        self.wait_registered(name, broker.addr, timeout=timeout, broker_id=broker_id)
        return broker

    def wait_registered(self, name: str, addr: str, timeout: float = 60.0, broker_id: int = 0) -> None:
        """Wait until the NameServer lists broker ``name`` (id ``broker_id``) at ``addr``; a 5.x
        broker not listed at once is asked to register (:meth:`_nudge_registration`)."""
        from rmq_source.remote import RemotingClient
        from rmq_source.remote import requests as rq
        deadline = time.monotonic() + timeout
        last = None
        nudge_at = time.monotonic()
        with RemotingClient(timeout=5.0, tls=self.client_tls) as client:
            while time.monotonic() < deadline:
                try:
                    info = rq.cluster_info(client, self.namesrv.addr)
                    if info.nodes(name).get(broker_id) == addr:
                        return
                    last = info
                except Exception as exc:       # noqa: BLE001 - retried until the deadline
                    last = exc
                if time.monotonic() >= nudge_at:       # (again if it reached no NameServer)
                    nudge_at = time.monotonic() + 3.0
                    self._nudge_registration(client, addr)
                time.sleep(0.2)
        raise ServerError(f"broker {name} at {addr} not in the NameServer's cluster info after "
                          f"{timeout:.0f} s (last: {last!r}):\n{self.log_tails()}")

    def _nudge_registration(self, client, addr: str) -> None:
        """Make a 5.x broker register with the NameServer now instead of 10 s after its boot.

        A 5.x broker registers at start only with the NameServers its remoting client has already
        found reachable, and that scan runs on another thread: when the registration comes first
        (most boots here) it reaches no NameServer, and the next one is scheduled 10 s later. Its
        own value of ``brokerPermission`` set through UPDATE_BROKER_CONFIG makes it register at
        once (AdminBrokerProcessor.updateBrokerConfig). Not for brokers that must stay unlisted
        until elected (controller mode, slave acting master), nor 4.x (registers at start).
        Signed by the broker's ACL admin account if it has one; refused, the scheduled
        registration still comes."""
        broker = next((b for b in self.brokers.values() if b.addr == addr), None)
        if broker is None or broker.is_v4:
            return
        props = broker.properties()
        if any(str(props.get(k, "false")).lower() == "true"
               for k in ("enableControllerMode", "enableSlaveActingMaster")):
            return
        body = f"brokerPermission={props.get('brokerPermission', 6)}\n".encode()
        admin = next((a for a in broker.acl or () if a.get("admin")), None)
        try:
            if admin is None:
                client.invoke(addr, UPDATE_BROKER_CONFIG, {}, body, timeout=5.0)
                return
            from rmq_source.remote import RemotingClient
            from rmq_source.remote.acl import Credentials
            with RemotingClient(timeout=5.0, credentials=Credentials(admin["accessKey"], admin["secretKey"]),
                                tls=self.client_tls) as signed:
                signed.invoke(addr, UPDATE_BROKER_CONFIG, {}, body)
        except Exception:                       # noqa: BLE001 - the scheduled registration remains
            pass

    def create_topic(self, client, topic: str, queues: int, *, broker: str = "broker-a",
                     timeout: float = 30.0, attributes: dict | None = None) -> None:
        """Create ``topic`` with ``queues`` queues on ``broker`` through ``client`` (ACL-signed when
        it is; ``attributes``: see :func:`rmq_source.remote.requests.create_topic`) and wait
        until the NameServer routes it."""
        from rmq_source.remote import requests as rq
        rq.create_topic(client, self.brokers[broker].addr, topic, read_queues=queues,
                        attributes=attributes)
        deadline = time.monotonic() + timeout
        while not rq.topic_route(client, self.namesrv_addr, topic).queue_datas:
            if time.monotonic() > deadline:
                raise ServerError(f"topic {topic} not routed by the NameServer after {timeout:.0f} s")
            time.sleep(0.2)

    def mqadmin(self, *args: str, access_key: str | None = None, secret_key: str | None = None,
                timeout: float = 120.0) -> str:
        """Run RocketMQ's own ``mqadmin`` (the tools jar of this version) against this cluster's
        NameServer and return its output; with credentials it signs as that ACL account
        (``conf/tools.yml``). A non-zero exit raises ServerError."""
        tool = JavaServer(self.version, self.jars, self.workdir / "mqadmin", heap_mb=192)
        tool._prepare_home()
        if access_key is not None:
            (tool.rocketmq_home / "conf" / "tools.yml").write_text(
                f"accessKey: {access_key}\nsecretKey: {secret_key}\n")
        cmd = tool.java_command(MQADMIN_MAIN, [*args, "-n", self.namesrv_addr])
        with timed("mqadmin run", args[0] if args else ""):
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                  env=tool.java_env(), cwd=tool.workdir)
        # (a failed command prints SubCommandException and may still exit 0)
        if proc.returncode != 0 or "SubCommandException" in proc.stderr:
            raise ServerError(f"mqadmin {' '.join(args)} exited {proc.returncode}:\n"
                              f"{(proc.stdout + proc.stderr)[-3000:]}")
        return proc.stdout

    def stop_broker(self, name: str, graceful: bool = True) -> int | None:
        """Stop broker ``name``: SIGTERM (its store flushed and closed, it unregisters from the
        NameServer), or with ``graceful=False`` SIGKILL (the NameServer drops it when its
        connection closes)."""
        return self.brokers[name].stop(graceful=graceful)

    def stop(self, graceful: bool = True) -> None:
        """Stop every JVM started, brokers first; ``graceful=False`` SIGKILLs them (a cluster
        thrown away: nothing of its stores is read afterwards)."""
        for server in reversed(self.started):
            server.stop(graceful=graceful)

    def log_tails(self, lines: int = 30) -> str:
        return "\n".join(s.log_tails(lines) for s in [self.namesrv, *self.brokers.values()])

    def alive(self) -> bool:
        return self.namesrv.alive() and all(b.alive() for b in self.brokers.values())


def send_numbered(client, broker: str, topic: str, queue: int, first: int, count: int) -> list[bytes]:
    """Send messages ``<topic>-<queue>-<i>`` for i in ``[first, first + count)`` to ``queue`` of
    ``broker`` (an address), 50 to a batch, tagged ``a``/``b`` by parity of i; their bodies."""
    from rmq_source.remote import requests as rq
    bodies = [f"{topic}-{queue}-{i}".encode() for i in range(first, first + count)]
    for start in range(0, count, 50):
        rq.send_batch(client, broker, topic, [{"body": b, "tags": "ab"[i % 2]} for i, b in
                                              enumerate(bodies[start:start + 50], first + start)],
                      queue_id=queue)
    return bodies


def pull_all(client, addr: str, topic: str, queue_id: int, start: int = 0) -> list:
    """Every record of one queue from ``start`` to its end, pulled from ``addr`` (32 a pull, consumer
    group ``cmp_<topic>``, which commits nothing); checks each answer continues the one before."""
    from rmq_source.remote import requests as rq
    out, offset = [], start
    while True:
        r = rq.pull(client, addr, "cmp_" + topic, topic, queue_id, offset, max_nums=32)
        if not r.found:
            assert r.code == rq.PULL_NOT_FOUND or r.next_begin_offset == offset, (r.code, r.remark)
            return out
        recs = r.records()
        assert recs and recs[0].queue_offset == offset
        out += recs
        offset = r.next_begin_offset


def tls_server_props(cert: Path, key: Path, mode: str = "enforcing") -> dict:
    """Java system properties of a NameServer or broker speaking TLS (``TlsSystemConfig``) with
    ``cert``/``key`` (PEM, the key PKCS#8): ``mode`` enforcing refuses plain connections; test
    mode off, else the server makes itself a self-signed certificate; no client certificate asked.
    Its own client (a broker to the NameServers) speaks TLS too, checking nothing."""
    return {"tls.server.mode": mode, "tls.enable": "true", "tls.test.mode.enable": "false",
            "tls.server.certPath": cert, "tls.server.keyPath": key,
            "tls.server.need.client.auth": "none", "tls.client.authServer": "false"}
