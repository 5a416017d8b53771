"""Shared helpers of the end-to-end benchmarks (bench_spark, bench_streaming, bench_planning,
plot_throughput): bench stores written once and reused, page-cache warming, best-of timing, the
Spark session every benchmark uses, the machine description and table printing.

A bench store lives under ``--workdir`` (default ``/tmp/rmq_bench``) in a folder named after its
shape; ``bench_store.json`` is written last, so a folder without it (an interrupted run) is
rebuilt rather than reused.
"""
from __future__ import annotations

import json
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

DEFAULT_WORKDIR = "/tmp/rmq_bench"
TOPIC = "BenchTopic"
TAGS = ("TagA", "TagB", "TagC", "TagD")
MANIFEST = "bench_store.json"

#: Spark settings of every benchmark session (printed with the results). They are what a user
#: would set for a local job: Arrow on, a driver heap large enough for 64 MiB Arrow batches, no UI.
#: Benches listen and talk on loopback only (SPARK_LOCAL_IP for every JVM they start, the driver's
#: addresses below); their RocketMQ servers bind loopback (tests/rocketmq_cluster.py), Kafka too.
LOOPBACK = "127.0.0.1"
os.environ["SPARK_LOCAL_IP"] = LOOPBACK

SPARK_CONF = {
    "spark.driver.bindAddress": LOOPBACK,
    "spark.driver.host": LOOPBACK,
    "spark.driver.memory": "4g",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
    "spark.python.worker.reuse": "true",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.streaming.stopTimeout": "30s",
}


# ------------------------------------------------------------------------------------ stores

@dataclass(frozen=True)
class StoreSpec:
    """Shape of a bench store: ``messages`` bodies of ``body_size`` random bytes over ``queues``
    queues of one topic, round robin; every message has a tag (4 values) and one key."""

    messages: int
    body_size: int = 1024
    queues: int = 8
    commitlog_file_size: int = 256 << 20
    keys: bool = True
    cq_units_per_file: int | None = None      # None: the broker default (300,000)

    @property
    def name(self) -> str:
        return (f"store_{self.messages}x{self.body_size}B_{self.queues}q"
                f"{'' if self.keys else '_nokeys'}_cl{self.commitlog_file_size >> 20}M"
                f"{'' if self.cq_units_per_file is None else f'_cq{self.cq_units_per_file}'}")


def ensure_store(workdir: str | os.PathLike, spec: StoreSpec, *, quiet: bool = False) -> Path:
    """The store of ``spec`` under ``workdir``, written with :class:`StoreWriter` unless a
    complete one is already there."""
    root = Path(workdir) / spec.name
    manifest = root / MANIFEST
    if manifest.exists() and json.loads(manifest.read_text()).get("spec") == asdict(spec):
        return root
    shutil.rmtree(root, ignore_errors=True)
    from rmq_source.store.writer import StoreWriter

    if not quiet:
        print(f"writing {spec.messages:,} messages of {spec.body_size} B to {root} ...", flush=True)
    t0 = time.perf_counter()
    pool = [os.urandom(spec.body_size) for _ in range(64)]   # distinct bodies, cheap to produce
    with StoreWriter(root, commitlog_file_size=spec.commitlog_file_size,
                     cq_units_per_file=spec.cq_units_per_file) as w:
        w.create_topic(TOPIC, spec.queues)
        append = w.append
        if spec.keys:
            for i in range(spec.messages):
                append(TOPIC, pool[i & 63], tags=TAGS[i & 3], keys=[f"order-{i}"])
        else:
            for i in range(spec.messages):
                append(TOPIC, pool[i & 63], tags=TAGS[i & 3])
        w.flush()
    elapsed = time.perf_counter() - t0
    manifest.write_text(json.dumps({"spec": asdict(spec), "write_seconds": round(elapsed, 1)}))
    if not quiet:
        print(f"  written in {elapsed:.1f} s ({spec.messages / elapsed:,.0f} msgs/s)", flush=True)
    return root


def warm_page_cache(paths: Iterable[str | os.PathLike]) -> int:
    """Read every file under ``paths`` once (1 MiB reads, sparse holes skipped); returns bytes."""
    total = 0
    for base in paths:
        for dirpath, _, files in os.walk(base):
            for name in files:
                path = os.path.join(dirpath, name)
                fd = os.open(path, os.O_RDONLY)
                try:
                    size = os.fstat(fd).st_size
                    pos = 0
                    while pos < size:
                        try:
                            pos = os.lseek(fd, pos, os.SEEK_DATA)
                        except OSError:   # no data after pos (ENXIO)
                            break
                        hole = os.lseek(fd, pos, os.SEEK_HOLE)
                        while pos < hole:
                            chunk = os.pread(fd, min(1 << 20, hole - pos), pos)
                            if not chunk:
                                break
                            pos += len(chunk)
                            total += len(chunk)
                finally:
                    os.close(fd)
    return total


def store_bytes(root: str | os.PathLike) -> tuple[int, int]:
    """(messages, CommitLog record bytes) of every queue of the bench topic, from the CQ units."""
    from rmq_source.store.reader import Store

    with Store(root) as store:
        msgs = nbytes = 0
        for q in store.queues([TOPIC]):
            msgs += q.max_offset - q.min_offset
            nbytes += store.range_bytes(TOPIC, q.queue_id, q.min_offset, q.max_offset)
    return msgs, nbytes


# ------------------------------------------------------------------------------------ timing

def best_of(fn: Callable[[], object], repeat: int) -> tuple[float, list[float]]:
    """Run ``fn`` ``repeat`` times; (best seconds, all seconds)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), times


def interleaved_best(cases: dict[str, Callable[[], object]], repeat: int) -> dict[str, list[float]]:
    """Run every case once per round, ``repeat`` rounds (A B A B ...), so background load on a
    shared machine hits every case alike; {name: seconds of each round}."""
    return {k: [w for w, _ in v] for k, v in interleaved_runs(cases, repeat).items()}


def interleaved_runs(cases: dict[str, Callable[[], object]], repeat: int,
                     cpu: Callable[[], float] = time.process_time
                     ) -> dict[str, list[tuple[float, float]]]:
    """As :func:`interleaved_best`, recording (wall seconds, CPU seconds) of each round; ``cpu``
    reads a CPU-seconds counter (default: this process)."""
    out: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    for _ in range(repeat):
        for name, fn in cases.items():
            c0, t0 = cpu(), time.perf_counter()
            fn()
            out[name].append((time.perf_counter() - t0, cpu() - c0))
    return out


# ------------------------------------------------------------------------------------ CPU time

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def tree_cpu_seconds(root_pid: int) -> float:
    """CPU seconds (user + system) used so far by ``root_pid``, its live descendants and the
    children they have reaped (Linux /proc). Spark's JVM forks the Python daemon, which forks
    the workers, so this is the CPU cost of a local Spark job apart from the driver's Python
    process. A process that ends between two readings without being reaped is missed, so compare
    readings taken while the session is up."""
    parent: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        pid = int(entry)
        parent[pid] = int(fields[1])
        times[pid] = sum(int(x) for x in fields[11:15]) / _TICK   # utime stime cutime cstime
    total = 0.0
    for pid, t in times.items():
        p = pid
        while p > 1 and p != root_pid:
            p = parent.get(p, 0)
        if p == root_pid:
            total += t
    return total


def measured(spark, server_pid, run) -> tuple[float, float, float]:
    """(wall s, Spark CPU s: JVM + Python workers + driver, server CPU s) of ``run()``."""
    jvm = jvm_pid(spark)
    self0 = resource.getrusage(resource.RUSAGE_SELF)
    s0, k0, t0 = tree_cpu_seconds(jvm), server_pid and tree_cpu_seconds(server_pid), time.perf_counter()
    run()
    wall = time.perf_counter() - t0
    self1 = resource.getrusage(resource.RUSAGE_SELF)
    driver = (self1.ru_utime - self0.ru_utime) + (self1.ru_stime - self0.ru_stime)
    spark_cpu = tree_cpu_seconds(jvm) - s0 + driver
    server = (tree_cpu_seconds(server_pid) - k0) if server_pid else 0.0
    return wall, spark_cpu, server


def jvm_pid(spark) -> int:
    """Process id of the local session's JVM (started by PySpark's gateway)."""
    return spark.sparkContext._gateway.proc.pid


# ------------------------------------------------------------------------------------ Spark

def spark_session(master: str = "local[2]", app: str = "rmq_source-bench",
                  extra: dict | None = None):
    """A local session with :data:`SPARK_CONF` (plus ``extra``) and the rmq source registered."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")
    # Python processes as a deployment runs them: with compiled modules (pip writes them; without
    # them every fresh worker and streaming runner compiles the package again, ~80 ms)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    # Python workers import rmq_source and the bench modules from the checkout.
    path = os.pathsep.join(p for p in (str(REPO), str(BENCH_DIR), os.environ.get("PYTHONPATH"))
                           if p)
    os.environ["PYTHONPATH"] = path
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app)
    for key, value in {**SPARK_CONF, **(extra or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from rmq_source import RocketMQDataSource

    spark.dataSource.register(RocketMQDataSource)
    return spark


# ------------------------------------------------------------------------------------ output

def _first_line(cmd: Sequence[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def machine_info() -> dict[str, str]:
    """What the figures were measured on."""
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "unknown"
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / (1 << 20):.1f} GiB"
                break
    except OSError:
        pass
    import pyarrow

    try:
        import pyspark
        spark_version = pyspark.__version__
    except ImportError:
        spark_version = "not installed"
    return {
        "nproc": str(os.cpu_count()),
        "memory": mem,
        "cpu": cpu,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "pyspark": spark_version,
        "pyarrow": pyarrow.__version__,
        "java": _first_line(["java", "-version"]),
        "load average (1 min) at start": f"{os.getloadavg()[0]:.2f}",
    }


def print_machine(extra_conf: dict | None = None, spark: bool = True) -> None:
    print("machine:")
    for key, value in machine_info().items():
        print(f"  {key:32s} {value}")
    if spark:
        print("spark settings:")
        for key, value in {**SPARK_CONF, **(extra_conf or {})}.items():
            print(f"  {key} = {value}")
    print(flush=True)


def print_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """A plain Markdown table (pastes straight into RESULTS.md)."""
    rows = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
    print(flush=True)


def fmt_rate(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.2f} M"
    if value >= 1e3:
        return f"{value / 1e3:.1f} k"
    return f"{value:.0f}"


# ------------------------------------------------------------------------------------ ceiling

def ensure_ceiling_files(workdir: str | os.PathLike, store_root: Path, *,
                         batch_rows: int = 65536, batch_bytes: int = 64 << 20,
                         quiet: bool = False, topic: str = TOPIC) -> Path:
    """Arrow IPC files holding exactly the rows ``spark.read.format("rmq")`` returns for ``topic``
    (default: the bench topic) of ``store_root``: one file per queue (one per rmq input
    partition), in batches cut by :meth:`Store.iter_batches` with the source's default
    batchRows/batchBytes, so the ceiling source sends the same batches over the same number of
    partitions. Written once, reused."""
    import pyarrow as pa
    from rmq_source.schema import ARROW_SCHEMA
    from rmq_source.store.reader import Store

    name = store_root.name if topic == TOPIC else f"{store_root.name}_{topic}"
    out = Path(workdir) / f"ceiling_{name}_{batch_rows}r_{batch_bytes}b"
    manifest = out / "ceiling.json"
    if manifest.exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if not quiet:
        print(f"writing the Arrow ceiling files to {out} ...", flush=True)
    rows = 0
    with Store(store_root) as store:
        for q in store.queues([topic]):
            if q.max_offset <= q.min_offset:
                continue
            path = out / f"part-{q.queue_id:05d}.arrow"
            with pa.OSFile(str(path), "wb") as sink, \
                    pa.ipc.new_file(sink, ARROW_SCHEMA) as w:
                for batch in store.iter_batches(topic, q.queue_id, q.min_offset, q.max_offset,
                                                batch_rows=batch_rows, batch_bytes=batch_bytes):
                    w.write_batch(batch)
                    rows += batch.num_rows
    manifest.write_text(json.dumps({"rows": rows, "store": str(store_root)}))
    return out


_CEILING_FILES: dict = {}


def open_ceiling_file(path: str):
    """The memory-mapped Arrow IPC file ``path``, kept open for the life of this process (a Python
    worker), as the rmq source keeps its store files mapped: after the first read its pages are
    mapped in the worker and batches are handed out without copies or page faults."""
    reader = _CEILING_FILES.get(path)
    if reader is None:
        import pyarrow as pa
        reader = _CEILING_FILES[path] = pa.ipc.open_file(pa.memory_map(path))
    return reader


def ceiling_ddl(columns: list[str]) -> str:
    """The Spark DDL of a subset of the row schema's columns (in the given order)."""
    from rmq_source.schema import SPARK_DDL

    fields = dict(f.split(" ", 1) for f in SPARK_DDL.split(", "))
    return ", ".join(f"{c} {fields[c]}" for c in columns)


def _ceiling_source_class():
    """The trivial Python data source ``format("arrow_ceiling")``: its reader yields the
    pre-built batches of one Arrow IPC file per partition, memory-mapped (zero copy) and kept open
    per worker (:func:`open_ceiling_file`), in the rmq row schema. Spark's cost of moving these
    batches from a Python worker into the JVM is the transport ceiling of any Python data source.
    Options: ``path`` (folder of the files), ``numPartitions`` (default one partition per file;
    files are dealt round robin; ``sized``: as many as the rmq source would make of these bytes,
    see ``_sized_tasks``) and ``columns`` (comma-separated subset of the columns, default
    all: what Spark pays per column). As a stream (PySpark 4.2+) the same files are read once,
    ``maxMessagesPerTrigger`` rows a micro-batch at most, in tasks ``sized`` unless
    ``numPartitions`` is a number: what Spark costs any Python streaming source
    for these rows (query start included)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
    from rmq_source.schema import SPARK_DDL

    class _FilePartition(InputPartition):
        def __init__(self, paths: list[str]):
            super().__init__(paths)
            self.paths = paths

    def _files(folder: str) -> list[str]:
        return [os.path.join(folder, n) for n in sorted(os.listdir(folder)) if n.endswith(".arrow")]

    def _rows(path: str) -> int:
        import common
        reader = common.open_ceiling_file(path)
        return sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))

    def _offset_bytes(path: str) -> float:
        """What the rmq source weighs one offset of this file by: its record's stored bytes
        (storeSize) plus its ConsumeQueue unit (rmq_source.spark.sizing)."""
        import pyarrow.compute as pc
        import common
        from rmq_source.spark.sizing import CQ_UNIT_BYTES
        reader = common.open_ceiling_file(path)
        stored = sum(pc.sum(reader.get_batch(i).column("storeSize")).as_py() or 0
                     for i in range(reader.num_record_batches))
        return CQ_UNIT_BYTES + stored / max(_rows(path), 1)

    def _sized_tasks(weight: float) -> int:
        """Tasks for ``weight`` bytes as the rmq source sizes a plan without options: one per
        maxPartitionBytes, at least one per core, more rounded up to whole waves (a Python task
        costs tens of ms: one per file would handicap the ceiling against rmq's fewer tasks)."""
        from rmq_source.spark.options import DEFAULT_MAX_PARTITION_BYTES
        from rmq_source.spark.planner import default_parallelism
        cores = default_parallelism()
        wanted = max(cores, math.ceil(weight / DEFAULT_MAX_PARTITION_BYTES))
        return math.ceil(wanted / cores) * cores

    class _CeilingReader(DataSourceReader):
        def __init__(self, folder: str, partitions: str | None, columns: list[str] | None):
            self.folder = folder
            self.count = partitions
            self.columns = columns

        def partitions(self):
            files = _files(self.folder)
            if self.count == "sized":
                n = _sized_tasks(sum(_rows(f) * _offset_bytes(f) for f in files))
            else:
                n = int(self.count) if self.count else len(files)
            return [_FilePartition(files[i::n]) for i in range(n) if files[i::n]]

        def read(self, partition):
            import common   # this worker's module: its cache outlives the task (worker reuse)
            for path in partition.paths:
                reader = common.open_ceiling_file(path)
                for i in range(reader.num_record_batches):
                    batch = reader.get_batch(i)
                    yield batch if self.columns is None else batch.select(self.columns)

    class _Slices(InputPartition):
        def __init__(self, slices: list[tuple[str, int, int]]):
            super().__init__(slices)
            self.slices = slices

    def _sliced(path: str, start: int, end: int, columns: list[str] | None):
        """The rows [start, end) of one file, as its batches cut to that range (no copies)."""
        import common
        reader, at = common.open_ceiling_file(path), 0
        for i in range(reader.num_record_batches):
            if at >= end:
                return
            batch = reader.get_batch(i)
            lo, hi = max(start - at, 0), min(end - at, batch.num_rows)
            at += batch.num_rows
            if lo < hi:
                batch = batch if (lo, hi) == (0, batch.num_rows) else batch.slice(lo, hi - lo)
                yield batch if columns is None else batch.select(columns)

    def _stream_reader_class():
        from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadMaxRows,
                                                      SupportsTriggerAvailableNow)
        from pyspark.sql.datasource import DataSourceStreamReader

        class _CeilingStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
            """The same files as a stream: an offset is the rows taken of each file; a
            micro-batch reads each file's rows [start, end), the files dealt over its tasks; a
            row limit is shared over the files by what each has left, as the rmq source shares
            maxMessagesPerTrigger by backlog. The files never grow: Trigger.AvailableNow reads
            them to their ends."""

            def __init__(self, folder: str, columns: list[str] | None, max_rows: int | None,
                         partitions: int | None):
                self.files = _files(folder)
                self.sizes = [_rows(f) for f in self.files]
                self.columns, self.max_rows, self.count = columns, max_rows, partitions
                self.row_bytes = {f: _offset_bytes(f) for f in self.files}

            def initialOffset(self):
                return {"rows": [0] * len(self.files)}

            def getDefaultReadLimit(self):
                return ReadAllAvailable() if self.max_rows is None else ReadMaxRows(self.max_rows)

            def prepareForTriggerAvailableNow(self):
                pass

            def latestOffset(self, start, limit):
                at = start["rows"]
                left = [size - a for size, a in zip(self.sizes, at)]
                if not isinstance(limit, ReadMaxRows) or sum(left) <= limit.max_rows:
                    return {"rows": list(self.sizes)}
                total, share = sum(left), limit.max_rows
                take = [n * share // total for n in left]
                for i in range(len(take)):     # what the floors left, one row each to the first
                    if sum(take) >= share:
                        break
                    if take[i] < left[i]:
                        take[i] += 1
                return {"rows": [a + t for a, t in zip(at, take)]}

            def partitions(self, start, end):
                todo = [(f, s, e) for f, s, e in zip(self.files, start["rows"], end["rows"]) if e > s]
                n = self.count or _sized_tasks(sum((e - s) * self.row_bytes[f] for f, s, e in todo))
                n = min(n, len(todo))
                return [_Slices(todo[i::n]) for i in range(n) if todo[i::n]]

            def read(self, partition):
                for path, start, end in partition.slices:
                    yield from _sliced(path, start, end, self.columns)

            def commit(self, end):
                pass

        return _CeilingStreamReader

    class ArrowCeilingDataSource(DataSource):
        @classmethod
        def name(cls):
            return "arrow_ceiling"

        def streamReader(self, schema):
            columns, cap = self.options.get("columns"), self.options.get("maxMessagesPerTrigger")
            parts = self.options.get("numPartitions")
            return _stream_reader_class()(self.options["path"], columns.split(",") if columns else None,
                                          int(cap) if cap else None,
                                          int(parts) if parts and parts != "sized" else None)

        def schema(self):
            columns = self.options.get("columns")
            return SPARK_DDL if not columns else ceiling_ddl(columns.split(","))

        def reader(self, schema):
            parts = self.options.get("numPartitions")
            columns = self.options.get("columns")
            return _CeilingReader(self.options["path"], parts, columns.split(",") if columns else None)

    return ArrowCeilingDataSource


def register_ceiling_source(spark) -> None:
    spark.dataSource.register(_ceiling_source_class())


def run_java_client(cluster, workdir: Path, main: str, source: str, args: Sequence[str], *,
                    timeout: float = 3600, system_props: dict | None = None) -> list[str]:
    """Compile ``source`` (class ``main``) against the cluster's RocketMQ client jars under
    ``workdir/java`` and run it with the NameServer address as first argument (and the Java
    system properties ``system_props``); its stdout lines."""
    sys.path.insert(0, str(REPO / "tests"))
    import rocketmq_cluster
    src = Path(workdir) / "java"
    src.mkdir(exist_ok=True)
    (src / f"{main}.java").write_text(source)
    cp = rocketmq_cluster.java_class_path(cluster.jars)
    subprocess.run(["javac", "-nowarn", "-cp", cp, "-d", str(src), str(src / f"{main}.java")],
                   check=True, capture_output=True, timeout=300)
    proc = subprocess.run(["java", "-Xmx512m", *rocketmq_cluster.ADD_OPENS, f"-Duser.home={src}",
                           "-Drocketmq.client.logUseSlf4j=true",
                           *(f"-D{k}={v}" for k, v in (system_props or {}).items()),
                           "-cp", f"{src}:{cp}", main,
                           cluster.namesrv_addr, *args],
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(proc.stdout[-2000:] + proc.stderr[-3000:])
    return proc.stdout.splitlines()
