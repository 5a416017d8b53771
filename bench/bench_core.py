"""Benchmark of the C core: decode throughput and tag-filtered ConsumeQueue scan.

Builds a temporary store of 1 KiB messages (bytes crafted with numpy, as a broker lays them out:
records never cross a CommitLog file, each full file ends with a BLANK), warms the page cache,
then measures in the same run:

* memcpy bandwidth: numpy ``copyto`` of a 256 MiB array (the baseline);
* decode: ``native.scan_queue`` of every queue, all columns, Arrow batches of 65536 rows —
  messages/s and GB/s of CommitLog record bytes;
* filtered scan: a tag subscription matching 1% of the messages (hash + exact string check) —
  ConsumeQueue units/s;
* a straightforward pure-Python decoder (struct) on a sample, for the "10x" anchor.

Prints same-run ratios against the targets of docs/performance-anchors.md: decode >= 40% of
memcpy, filtered >= 100 M units/s. memcpy and decode are timed in alternating rounds (a load change
on a shared machine then hits both); the ratio is that of the best rounds, and the median of the
per-round ratios is printed too. ``--instructions`` also counts, with valgrind's callgrind, the
instructions the C core executes per message (decode) and per unit (filtered scan): a figure that,
unlike times, does not move with the machine's load. No assertion: this is a measurement, not a
test.

    python bench/bench_core.py [--messages 400000] [--queues 8] [--repeat 5] [--instructions]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rmq_source.store import native  # noqa: E402
from rmq_source.subscription import java_string_hash  # noqa: E402

MAGIC_V1 = 0xDAA320A7
MAGIC_BLANK = 0xCBD43194
DLEDGER_HEADER = 48
HIT, MISS = "TagHIT", "TagMIS"          # same length: every record has the same size
JAVA_MSGS_PER_S = 1.37e6                # RocketMQ 4.9.3 read path, 1 thread (anchors)
JAVA_UNITS_PER_S = 9.9e6


def build_store(root: Path, messages: int, queues: int, body_size: int, cl_file_size: int,
                cq_file_size: int, hit_every: int, dledger: bool = False) -> dict:
    """Write commitlog/ and consumequeue/Bench/<q>/; returns layout facts. ``dledger``: the
    CommitLog as a one-peer DLedger broker writes it instead (dledger-n0/data/, each record the
    body of a 48-byte entry header, native/rmq_layout.h), the same messages otherwise."""
    rng = np.random.default_rng(7)
    topic = b"Bench"
    props_tpl = ("UNIQ_KEY\x01" + "0" * 32 + "\x02KEYS\x01K" + "0" * 9 + "\x02TAGS\x01" + MISS +
                 "\x02WAIT\x01true").encode()
    size = 74 + 8 + 8 + 1 + body_size + len(topic) + len(props_tpl)
    head = struct.pack(">iIiiiqqiq", size, MAGIC_V1, 0, 0, 0, 0, 0, 0, 0)
    head += bytes([192, 0, 2, 16]) + struct.pack(">i", 40000) + struct.pack(">q", 0)
    head += bytes([192, 0, 2, 100]) + struct.pack(">i", 10911) + struct.pack(">iqi", 0, 0, body_size)
    tpl = head + bytes(body_size) + bytes([len(topic)]) + topic + struct.pack(">h", len(props_tpl)) + props_tpl
    assert len(tpl) == size

    recs = np.tile(np.frombuffer(tpl, np.uint8), (messages, 1))
    idx = np.arange(messages, dtype=np.int64)
    qid = (idx % queues).astype(">i4")
    qoff = (idx // queues).astype(">i8")
    head_len = DLEDGER_HEADER if dledger else 0
    stride = head_len + size
    per_file = (cl_file_size - 8) // stride        # k records fit when k*stride + 8 <= file size
    phy = (idx // per_file) * cl_file_size + (idx % per_file) * stride + head_len
    ts = (1_795_000_000_000 + idx // 50).astype(">i8")
    body_at = 88
    p0 = body_at + body_size + 1 + len(topic) + 2
    recs[:, body_at:body_at + body_size] = rng.integers(0, 256, (messages, body_size), np.uint8)
    recs[:, 12:16] = qid.view(np.uint8).reshape(-1, 4)
    recs[:, 20:28] = qoff.view(np.uint8).reshape(-1, 8)
    recs[:, 28:36] = phy.astype(">i8").view(np.uint8).reshape(-1, 8)
    recs[:, 40:48] = ts.view(np.uint8).reshape(-1, 8)
    recs[:, 56:64] = ts.view(np.uint8).reshape(-1, 8)
    hex_ids = np.array([f"{i:032X}".encode() for i in range(messages)], dtype="S32")
    recs[:, p0 + 9:p0 + 41] = hex_ids.view(np.uint8).reshape(-1, 32)
    keys = np.array([f"{i:09d}".encode() for i in range(messages)], dtype="S9")
    recs[:, p0 + 48:p0 + 57] = keys.view(np.uint8).reshape(-1, 9)
    hit = idx % hit_every == 0
    tag_at = p0 + 63
    assert bytes(recs[0, tag_at:tag_at + 6]) == MISS.encode()
    recs[hit, tag_at:tag_at + 6] = np.frombuffer(HIT.encode(), np.uint8)
    crc = np.array([zlib.crc32(recs[i, body_at:body_at + body_size]) & 0x7FFFFFFF
                    for i in range(messages)], dtype=">i4")
    recs[:, 8:12] = crc.view(np.uint8).reshape(-1, 4)

    if dledger:
        heads = np.zeros((messages, head_len), np.uint8)
        for at, dtype, values in ((0, ">i4", 1), (4, ">i4", stride), (8, ">i8", idx),
                                  (24, ">i8", phy - head_len), (44, ">i4", size)):
            col = np.broadcast_to(np.asarray(values, dtype=dtype), (messages,))
            heads[:, at:at + col.itemsize] = np.ascontiguousarray(col).view(np.uint8).reshape(-1, col.itemsize)
        recs = np.concatenate([heads, recs], axis=1)
    cl_dir = root / "dledger-n0" / "data" if dledger else root / "commitlog"
    cl_dir.mkdir(parents=True)
    nfiles = -(-messages // per_file)
    for f in range(nfiles):
        chunk = recs[f * per_file:(f + 1) * per_file].tobytes()
        tail = cl_file_size - len(chunk)
        with open(cl_dir / f"{f * cl_file_size:020d}", "wb") as fh:
            fh.write(chunk)
            if f < nfiles - 1:      # DLedger: int32 -1 then the bytes left
                fh.write(struct.pack(">ii", -1, tail) if dledger else struct.pack(">iI", tail, MAGIC_BLANK))
            fh.truncate(cl_file_size)

    unit = np.dtype([("phy", ">i8"), ("size", ">i4"), ("tags", ">i8")])
    codes = np.where(hit, java_string_hash(HIT), java_string_hash(MISS))
    for q in range(queues):
        sel = idx % queues == q
        units = np.zeros(int(sel.sum()), unit)
        units["phy"], units["size"], units["tags"] = phy[sel], size, codes[sel]
        raw = units.tobytes()
        qdir = root / "consumequeue" / "Bench" / str(q)
        qdir.mkdir(parents=True)
        for start in range(0, max(len(raw), 1), cq_file_size):
            with open(qdir / f"{start:020d}", "wb") as fh:
                fh.write(raw[start:start + cq_file_size])
                fh.truncate(cq_file_size)
    return {"record_size": size, "cl_files": nfiles, "per_queue": messages // queues}


def files(folder: Path) -> list[native.Segment]:
    return [native.map_segment(folder / n, int(n)) for n in sorted(os.listdir(folder))]


def warm(root: Path) -> None:
    for dirpath, _, names in os.walk(root):
        for n in names:
            with open(os.path.join(dirpath, n), "rb") as fh:
                while fh.read(1 << 24):
                    pass


def best_of(repeat: int, fn) -> tuple[float, float]:
    """Minimum wall-clock and minimum CPU seconds over ``repeat`` runs of ``fn``. On a shared
    machine the CPU time is the steadier figure (it excludes time the process was preempted)."""
    walls, cpus = [], []
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return min(walls), min(cpus)


def scan_all(cl, cqs, cq_file_size, end, **kw) -> tuple[int, int]:
    """Scan queues 0.. of topic Bench as ``Store`` does (naming the queue, so each record's topic,
    queue id and offset are checked against its unit)."""
    rows = units = 0
    for qid, cq in enumerate(cqs):
        pos = 0
        while pos < end:
            res = native.scan_queue(cl, cq, cq_file_size, pos, end, topic="Bench", queue_id=qid,
                                    **kw)
            rows += res.batch.num_rows
            units += res.scanned
            if res.status != "FULL":
                break
            pos = res.next_offset
    return rows, units


def pure_python_decode(cl_dir: Path, count: int, size: int, cl_file_size: int) -> float:
    """A plain struct-based decoder of ``count`` records (all fields, properties dict)."""
    data = (cl_dir / f"{0:020d}").read_bytes()
    per_file = (cl_file_size - 8) // size
    count = min(count, per_file)
    t = time.perf_counter()
    out = []
    for i in range(count):
        p = i * size
        total, magic, crc, qid, flag, qoff, phy, sysflag, born = struct.unpack_from(">iIiiiqqiq", data, p)
        bh = data[p + 48:p + 56]
        store_ts, = struct.unpack_from(">q", data, p + 56)
        sh = data[p + 64:p + 72]
        recon, prep, blen = struct.unpack_from(">iqi", data, p + 72)
        body = data[p + 88:p + 88 + blen]
        q = p + 88 + blen
        tlen = data[q]
        topic = data[q + 1:q + 1 + tlen].decode()
        plen, = struct.unpack_from(">h", data, q + 1 + tlen)
        raw = data[q + 3 + tlen:q + 3 + tlen + plen].decode()
        props = {}
        for entry in raw.split("\x02"):
            k, sep, v = entry.partition("\x01")
            if k and sep and v:
                props[k] = v
        msg_id = (sh + phy.to_bytes(8, "big")).hex().upper()
        born_host = ".".join(str(b) for b in bh[:4]) + ":" + str(int.from_bytes(bh[4:], "big"))
        out.append((qid, qoff, phy, total, msg_id, props.get("UNIQ_KEY"), props.get("TAGS"),
                    [w for w in props.get("KEYS", "").split(" ") if w] or None, body, props,
                    born * 1000, store_ts * 1000, born_host, topic, sysflag, flag, recon, crc, prep))
    return count / (time.perf_counter() - t)


HISTORY = [
    "### Changes (2026-11-21, same script, same machine; CPU time; before = the previous C core)",
    "",
    "| measure | before | after |",
    "|---|---|---|",
    "| decode, all columns, 1 thread | 2.16-2.45 GB/s, 23-24% of memcpy | 3.52-4.71 GB/s, "
    "39-42% of memcpy (39% once at load 5; 41-42% otherwise) |",
    "| decode, instructions per message (callgrind) | 1,971 | 1,195 |",
    "| tag-filtered scan, 1% selectivity | 67-98 M units/s | 117-251 M units/s |",
    "| filtered scan, instructions per unit (callgrind) | 46.3 | 30.0 |",
    "| fixed cost of one scan_queue call | 73-146 us | 28-50 us |",
    "",
    "What moved the decode (C harness on the same store, same-run memcpy ratio):",
    "- Arrow C Data Interface (one struct array, release callback frees the batch) instead of",
    "  34 `foreign_buffer` + `from_buffers` per call: ~100 us -> ~12 us per call.",
    "- one capacity check per row (body + a budget for all short strings), structural checks",
    "  with few branches, properties split and appended in one SIMD pass, and matched against",
    "  the previous row's names/layout when they repeat: 1,971 -> ~1,150 instructions.",
    "- bodies with streaming stores in big batches (no read of destination lines): +3-4",
    "  points; with the above, 23% -> 33-36%.",
    "- the largest single step: the 11 fixed-width columns and 8 row offset arrays staged 16",
    "  rows at a time and written as whole lines (streamed in big batches): 33-36% -> 41-45%.",
    "  Written one value at a time they were ~20 narrow streams each missing the cache on a",
    "  new line; stores retire in order, so each miss held back every later store.",
    "- short-string buffers prefetched for writing; buffers of 64 KiB+ pooled: +1-2 points.",
    "",
    "Why not much more than 40% here: the same records merely copied into one buffer (C, same",
    "access pattern: a queue's records are every 8th record of the CommitLog) reach 42-43% of",
    "memcpy with memcpy and 47-48% with streaming stores; reading them alone costs ~150 ns per",
    "message (7-8 GB/s for this strided pattern, vs 10-11 GB/s memcpy). The decode also writes",
    "~1.35 KB of columns per message and executes ~1.2 k instructions (~250 ns with the data in",
    "L2), half of which the memory stalls hide. So 40% sits ~5 points under the copy floor; the",
    "3x-Java anchor (4.1 M msgs/s, 45-49% of memcpy here) is at or above that floor here.",
    "",
]

NOTES = [
    "Notes: the CPU-time column is the one to read on a shared machine (the wall clock includes",
    "time the process waited for a core; the load average is printed above). The decode is bound",
    "by memory traffic first: every record (1.2 KB, queues interleaved in the CommitLog) is read",
    "once and about 1.35 KB of columns are written per message; a plain copy of the same records",
    "into one buffer already reaches only ~42-48% of the memcpy figure (a strided read, then a",
    "write). What is left is kept small: ~1.2 k instructions per message (callgrind, 1 KiB body",
    "copy included), the row-indexed columns written 16 rows at a time as whole cache lines,",
    "bodies and those lines with streaming stores in big batches. Each scan_queue call costs ~30",
    "us (argument checks, batch set-up, one Arrow C Data Interface import).",
]


def write_results(path: Path, lines: list[str]) -> None:
    """Replace (or append) the "## C core" section of a markdown file, keeping the others."""
    import platform
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    body = ["## C core", "",
            f"`python bench/bench_core.py` on {platform.machine()}, {os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}.", ""]
    body += lines + ["", *NOTES, "", *HISTORY]
    out, skip, done = [], False, False
    for line in text.splitlines():
        if line.strip() == "## C core":
            skip, done = True, True
            out.extend(body)
            continue
        if skip and line.startswith("## "):
            skip = False
        if not skip:
            out.append(line)
    if not done:
        out += [""] + body
    path.write_text("\n".join(out).rstrip() + "\n")


def _count_run(mode: str, passes: int, root: Path, queues: int, per_queue: int) -> None:
    """Child process of count_instructions: ``passes`` scans of the store at ``root`` (decode:
    queue 0 only; filter: every queue), nothing printed."""
    cl_file_size, cq_file_size = 128 << 20, 300_000 * 20
    cl = native.CommitLog(files(root / "commitlog"), cl_file_size)
    cqs = [files(root / "consumequeue" / "Bench" / str(q)) for q in range(queues)]
    codes, tags = (java_string_hash(HIT),), (HIT,)
    for _ in range(passes):
        if mode == "decode":
            scan_all(cl, cqs[:1], cq_file_size, per_queue)
        else:
            scan_all(cl, cqs, cq_file_size, per_queue, codes=codes, tags=tags)


def count_instructions(root: Path, queues: int, per_queue: int) -> dict[str, float] | None:
    """Instructions executed in the C core (rmq_scan_queue, rmq_batch_export) per decoded
    message and per filtered unit, by valgrind's callgrind: a run of 2 passes minus a run of 1
    pass, so start-up and the first pass's one-time costs cancel out. None without valgrind."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return None
    out: dict[str, float] = {}
    for mode, units in (("decode", per_queue), ("filter", per_queue * queues)):
        totals = []
        for passes in (1, 2):
            cg = root / f"callgrind.{mode}.{passes}"
            subprocess.run(
                [valgrind, "--tool=callgrind", f"--callgrind-out-file={cg}",
                 "--toggle-collect=rmq_scan_queue", "--toggle-collect=rmq_batch_export",
                 sys.executable, os.path.abspath(__file__), "--count-run", mode, str(passes),
                 str(root), str(queues), str(per_queue)],
                check=True, capture_output=True)
            summary = next(line for line in cg.read_text().splitlines()
                           if line.startswith(("summary:", "totals:")))
            totals.append(int(summary.split()[1]))
        out[mode] = (totals[1] - totals[0]) / units
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=400_000)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--body", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=None, help="where to build the store (temp dir)")
    ap.add_argument("--write-results", type=Path, default=None, metavar="RESULTS.md",
                    help='replace the "## C core" section of this file with the figures')
    ap.add_argument("--instructions", action="store_true",
                    help="also count instructions per message/unit with valgrind (callgrind)")
    ap.add_argument("--count-run", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.count_run:
        mode, passes, root, queues, per_queue = args.count_run
        _count_run(mode, int(passes), Path(root), int(queues), int(per_queue))
        return
    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())

    cl_file_size, cq_file_size = 128 << 20, 300_000 * 20
    root = Path(tempfile.mkdtemp(prefix="rmq-bench-core-", dir=args.dir))
    try:
        t = time.perf_counter()
        facts = build_store(root, args.messages, args.queues, args.body, cl_file_size,
                            cq_file_size, hit_every=100)
        print(f"store: {args.messages} messages of {args.body} B body ({facts['record_size']} B "
              f"records), {args.queues} queues, {facts['cl_files']} CommitLog files; built in "
              f"{time.perf_counter() - t:.1f} s at {root}")
        warm(root)
        cl = native.CommitLog(files(root / "commitlog"), cl_file_size)
        cqs = [files(root / "consumequeue" / "Bench" / str(q)) for q in range(args.queues)]
        end = facts["per_queue"]
        total_bytes = args.messages * facts["record_size"]

        scan_all(cl, cqs, cq_file_size, end)                                  # warm-up
        src = np.ones(256 << 20, np.uint8)
        dst = np.empty_like(src)
        np.copyto(dst, src)
        mem_bytes = src.nbytes
        mem_runs, dec_runs = [], []
        for _ in range(args.repeat):            # alternating rounds: memcpy, decode
            mem_runs.append(best_of(1, lambda: np.copyto(dst, src)))
            dec_runs.append(best_of(1, lambda: scan_all(cl, cqs, cq_file_size, end)))
        src = dst = None                        # the 512 MiB go before the next steps
        mem_wall, mem_cpu = min(r[0] for r in mem_runs), min(r[1] for r in mem_runs)
        dec = (min(r[0] for r in dec_runs), min(r[1] for r in dec_runs))
        round_share = statistics.median(m[1] / d[1] * total_bytes / mem_bytes
                                        for m, d in zip(mem_runs, dec_runs))
        rows, _ = scan_all(cl, cqs, cq_file_size, end)
        assert rows == args.messages, rows
        codes, tags = (java_string_hash(HIT),), (HIT,)
        filt = best_of(args.repeat, lambda: scan_all(cl, cqs, cq_file_size, end, codes=codes,
                                                     tags=tags))
        hits, units = scan_all(cl, cqs, cq_file_size, end, codes=codes, tags=tags)
        assert units == args.messages and hits == -(-args.messages // 100), (units, hits)
        crc = best_of(max(1, args.repeat // 2),
                      lambda: scan_all(cl, cqs, cq_file_size, end, verify_crc=True))
        py_rate = pure_python_decode(root / "commitlog", 20_000, facts["record_size"], cl_file_size)
        # fixed cost of one scan_queue call (argument checks, C call, Arrow import of 1 row)
        one = best_of(200, lambda: native.scan_queue(cl, cqs[0], cq_file_size, 0, 1))
        instr = count_instructions(root, args.queues, end) if args.instructions else None

        lines = [f"store: {args.messages} messages, {args.body} B bodies ({facts['record_size']} B "
                 f"records), {args.queues} queues; best of {args.repeat}; "
                 f"load average before: {load_before}", "",
                 "| measure | wall clock | CPU time |", "|---|---|---|"]
        mem_gbps = (mem_bytes / mem_wall / 1e9, mem_bytes / mem_cpu / 1e9)
        dec_msgs = (args.messages / dec[0], args.messages / dec[1])
        dec_gbps = (total_bytes / dec[0] / 1e9, total_bytes / dec[1] / 1e9)
        crc_gbps = (total_bytes / crc[0] / 1e9, total_bytes / crc[1] / 1e9)
        filt_units = (args.messages / filt[0], args.messages / filt[1])
        share = (dec_gbps[0] / mem_gbps[0], dec_gbps[1] / mem_gbps[1])
        lines += [
            f"| memcpy, numpy copyto 256 MiB | {mem_gbps[0]:.2f} GB/s | {mem_gbps[1]:.2f} GB/s |",
            f"| C decode, all 19 columns, 1 thread | {dec_msgs[0] / 1e6:.2f} M msgs/s, "
            f"{dec_gbps[0]:.2f} GB/s | {dec_msgs[1] / 1e6:.2f} M msgs/s, {dec_gbps[1]:.2f} GB/s |",
            f"| decode / memcpy (target >= 40%) | {share[0]:.0%} | {share[1]:.0%} "
            f"(median of rounds {round_share:.0%}) |",
            f"| decode vs RocketMQ Java read path (anchor 1.37 M msgs/s, target >= 3x) | "
            f"{dec_msgs[0] / JAVA_MSGS_PER_S:.1f}x | {dec_msgs[1] / JAVA_MSGS_PER_S:.1f}x |",
            f"| C decode + verify_crc | {crc_gbps[0]:.2f} GB/s | {crc_gbps[1]:.2f} GB/s |",
            f"| tag-filtered scan, 1% selectivity (target >= 100 M units/s) | "
            f"{filt_units[0] / 1e6:.0f} M units/s | {filt_units[1] / 1e6:.0f} M units/s |",
            f"| pure-Python struct decoder (target: C >= 10x) | {py_rate / 1e6:.3f} M msgs/s | "
            f"C = {dec_msgs[1] / py_rate:.0f}x |",
            f"| fixed cost of one scan_queue call (1 row) | {one[0] * 1e6:.0f} us | "
            f"{one[1] * 1e6:.0f} us |",
        ]

        verdict = (f"decode {share[1]:.0%} of memcpy (CPU time) -> "
                   f"{'OK' if share[1] >= 0.4 else 'BELOW TARGET'}; filtered "
                   f"{filt_units[1] / 1e6:.0f} M units/s -> "
                   f"{'OK' if filt_units[1] >= 100e6 else 'BELOW TARGET'}")
        if instr is not None:
            lines += ["", f"C core instructions (callgrind, independent of the load): decode "
                          f"{instr['decode']:.0f} per message, filtered scan "
                          f"{instr['filter']:.1f} per unit."]
        lines.append("")
        lines.append(verdict)
        print("\n".join(lines))
        if args.write_results:
            write_results(args.write_results, lines)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
