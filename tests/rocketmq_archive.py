"""A class-data sharing archive (static AppCDS) for the RocketMQ JVMs of a test run.

A run starts some hundred JVMs on RocketMQ's jars (NameServers, brokers, controllers, ``mqadmin``,
the Java clients of the tests); each parses and verifies thousands of the same classes again. From
an archive, a 5.3.3 broker boots in about 2.2 s instead of 3.4 (0.8 s less CPU), a NameServer in
1.4 s instead of 1.9.

One archive per jars folder (one RocketMQ version), made once a run by whichever process first
starts a server of that version (:func:`spark_archive.once`: under a file lock, in the run's
archive folder, removed at its end): a NameServer and a broker are booted with
``-XX:DumpLoadedClassList`` and ``mqadmin`` runs once against them (each writes the classes it
loaded as it loads them, so the JVMs are killed once booted), then ``java -Xshare:dump`` maps the
union of the lists into the archive (about 15 s of wall time, once). A JVM that cannot use the
archive (another JDK, another class path) starts without it, as without the option. The class
path of the archive must be the start of a JVM's class path: a Java client puts its own classes
after the jars (tests/test_broker_stores.py ``java_command``).

Only a test run has an archive folder (``$RMQ_SPARK_CDS``, conftest.py): the benches' servers
start without one.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import spark_archive

#: the options that keep a JVM quiet about an archive it cannot map
QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")


def archive_path(jars: Path) -> Path | None:
    """Where the run's archive of ``jars`` is (made or not), or None outside a test run."""
    if not os.environ.get(spark_archive.ENV):
        return None
    return spark_archive.run_folder() / f"{Path(jars).name}.jsa"


def java_options(version: str, jars: Path) -> tuple[str, ...]:
    """The options giving a JVM on ``jars`` the run's archive (made first when no process of the
    run tried yet); none outside a test run or when it could not be made."""
    path = archive_path(jars)
    if path is None:
        return ()
    spark_archive.once(path, f"RocketMQ class-data archive {version}",
                       lambda: _make(version, Path(jars), path))
    return (f"-XX:SharedArchiveFile={path}", *QUIET) if path.is_file() else ()


def _make(version: str, jars: Path, path: Path) -> None:
    import rocketmq_cluster as rc        # (it imports this module)

    work = Path(tempfile.mkdtemp(prefix=f"{jars.name}-classes-", dir=path.parent))
    try:
        lists = [work / "namesrv.lst", work / "broker.lst", work / "mqadmin.lst"]

        def dumping(target: Path) -> tuple[str, ...]:
            return (*rc.TEST_JVM_OPTS, f"-XX:DumpLoadedClassList={target}")

        ns = rc.NameServer(version, jars, work / "namesrv", jvm_opts=dumping(lists[0]), cds=False)
        broker = None
        try:
            ns.start()
            broker = rc.Broker(version, jars, work / "broker", namesrv=ns.addr,
                               jvm_opts=dumping(lists[1]), cds=False).launch()
            tool = rc.JavaServer(version, jars, work / "mqadmin", heap_mb=192,
                                 jvm_opts=dumping(lists[2]), cds=False)
            tool._prepare_home()
            subprocess.run(tool.java_command(rc.MQADMIN_MAIN, ["clusterList", "-n", ns.addr]),
                           env=tool.java_env(), cwd=tool.workdir, timeout=120,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            broker.wait_boot()
        finally:
            # the lists are written class by class: killing loses nothing of the boot
            for server in (broker, ns):
                if server is not None:
                    server.stop(graceful=False)
        classes = set()
        for listed in lists:
            if listed.is_file():
                classes.update(listed.read_text(errors="replace").splitlines())
        union = work / "classes.lst"
        union.write_text("\n".join(sorted(classes)) + "\n")
        try:
            subprocess.run(["java", "-Xshare:dump", *rc.TEST_JVM_OPTS, f"-XX:SharedClassListFile={union}",
                            f"-XX:SharedArchiveFile={path}", "-cp", rc.java_class_path(jars)],
                           timeout=300, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        except BaseException:
            path.unlink(missing_ok=True)     # (a half-written archive)
            raise
    finally:
        shutil.rmtree(work, True)
