"""The C core of an installed rmq_source against the reference stores, with any Python.

    python tests/wheel_check.py FIXTURES_ROOT

Run by tests/test_wheels.py with the x86_64 wheel on this machine's Python and with the aarch64
wheel on Debian's arm64 Python under qemu-user; imports only rmq_source (and pyarrow, numpy, cffi),
never the test suite. For each store RocketMQ wrote (4.9.3 and 5.3.3, ``basic``) it checks, against
the answers RocketMQ gave when it wrote them:

- every queue scanned (37 rows a batch, so batches cross ConsumeQueue files) equals manifest.jsonl;
- the CommitLog's valid end, with every body's CRC checked, is queues.json's maxPhyOffset;
- the tag-hash scans of filter.jsonl hold the broker's queue offsets;
- each queue's records cut out of the CommitLog and laid end to end, as a pull answer lays them,
  decode into the same rows as the scan;
- SQL92 selectors run by the C core over each queue's properties select what the Python
  evaluator (the broker's rules) selects;
- the C core's OpenSSL (the wheel's own copy) makes a TLS client context with the default CAs,
  and refuses a CA file that is not there.

An assertion names what differs. Last it prints one JSON line: the machine, the counts and a
SHA-256 of every row decoded (scans, filters, pull answers): equal digests on two machines mean
the same answers.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import platform
import sys
from collections import defaultdict
from pathlib import Path

import rmq_source._native as _native
from rmq_source.store import native
from rmq_source.sql92 import compile_selector
from rmq_source.sql92.program import selector_program
from rmq_source.subscription import Subscription

VERSIONS = ["rocketmq-4.9.3", "rocketmq-5.3.3"]
#: numbers as Long and Double, strings, missing properties (null)
SELECTORS = ["seq > 100 AND seq <= 1500.5", "TAGS IN ('TagA', 'TagB') OR orderId BETWEEN 10 AND 20",
             "NOT (orderId = 40) AND src STARTSWITH 'oracle'", "orderId IS NULL OR seq < -1e300",
             "KEYS ENDSWITH '-040' OR KEYS CONTAINS 'ORDER-03'"]
COLUMNS = ("queueId", "commitLogOffset", "storeSize", "msgId", "uniqKey", "tags", "bornHost",
           "storeHost", "sysFlag", "flag", "reconsumeTimes", "bodyCRC", "preparedTransactionOffset")


def _jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _files(folder: Path) -> list[tuple[int, str]]:
    return sorted((int(n), str(folder / n)) for n in os.listdir(folder) if n.isdigit())


def _canonical(value):
    """Rows as JSON can hold them: bytes as hex, timestamps as text."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    return value if value is None or isinstance(value, (int, str, float)) else str(value)


class Store:
    def __init__(self, folder: Path):
        self.store = folder / "store"
        self.queues = json.loads((folder / "queues.json").read_text())
        params = json.loads((folder / "generation.json").read_text())["storeParams"]
        self.cl_files = _files(self.store / "commitlog")
        self.commitlog = native.CommitLog([native.map_segment(p, s) for s, p in self.cl_files],
                                          params["mappedFileSizeCommitLog"])
        self.cq_file_size = params["mappedFileSizeConsumeQueue"]

    def scan(self, topic: str, qid: int, start: int, end: int, **kw) -> list[dict]:
        self.batches = []
        folder = self.store / "consumequeue" / topic / str(qid)
        cq = [native.map_segment(p, s) for s, p in _files(folder)]
        rows, pos = [], start
        while pos < end:
            res = native.scan_queue(self.commitlog, cq, self.cq_file_size, pos, end, **kw)
            res.batch.validate(full=True)
            self.batches.append(res.batch)
            rows += res.batch.to_pylist()
            if res.status != "FULL":
                assert res.status == "END" and res.next_offset == end, (topic, qid, res.status)
                break
            pos = res.next_offset
        return rows

    def record(self, phy: int, size: int) -> bytes:
        start, path = max((s, p) for s, p in self.cl_files if s <= phy)
        with open(path, "rb") as fh:
            fh.seek(phy - start)
            return fh.read(size)


def _tls_contexts() -> str:
    """A TLS client context of the C core, and its refusal of a missing CA file (its message)."""
    ffi, lib = native.ffi, native.lib
    err = ffi.new("rmq_error *")
    ctx = lib.rmq_tls_ctx_new(ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, 1, err)
    assert ctx != ffi.NULL, ffi.string(err.message)
    lib.rmq_tls_ctx_free(ctx)
    ctx = lib.rmq_tls_ctx_new(b"/nonexistent/ca.pem", ffi.NULL, ffi.NULL, ffi.NULL, 1, err)
    assert ctx == ffi.NULL and err.code == lib.RMQ_E_ARG
    return ffi.string(err.message).decode("utf-8", "replace")


def check(root: Path) -> dict:
    digest = hashlib.sha256()
    counts: dict = defaultdict(int)

    def absorb(what: str, rows) -> None:
        digest.update(json.dumps([what, _canonical(rows)], sort_keys=True).encode())

    for version in VERSIONS:
        folder = root / version / "basic"
        st = Store(folder)
        manifest = defaultdict(list)
        for row in _jsonl(folder / "manifest.jsonl"):
            manifest[(row["topic"], row["queueId"])].append(row)
        assert st.commitlog.valid_end(verify_crc=True) == st.queues["commitLog"]["maxPhyOffset"], version
        for q in (q for q in st.queues["queues"] if q["files"]):
            topic, qid = q["topic"], q["queueId"]
            rows = st.scan(topic, qid, q["minOffset"], q["maxOffset"], max_rows=37)
            expected = manifest[(topic, qid)]
            assert len(rows) == len(expected), (version, topic, qid)
            for row, exp in zip(rows, expected):
                where = (version, topic, qid, exp["queueOffset"])
                assert row["queueOffset"] == exp["queueOffset"], where
                assert all(row[c] == exp[c] for c in COLUMNS), where
                assert row["body"] == base64.b64decode(exp["body"]), where
                assert dict(row["properties"]) == exp["properties"], where
            absorb(f"{version} scan {topic}/{qid}", rows)
            counts["scanned"] += len(rows)
            for text in SELECTORS:
                program, selector = selector_program(text), compile_selector(text)
                mask = [int(m) for b in st.batches for m in program.matches_mask(b.column("properties"))]
                assert mask == [int(selector.matches(dict(r["properties"]))) for r in rows], (version, text)
                absorb(f"{version} sql92 {topic}/{qid} {text}", mask)
                counts["selected"] += sum(mask)
            # a pull answer: the queue's records end to end
            answer = b"".join(st.record(r["commitLogOffset"], r["storeSize"]) for r in rows)
            batch, nxt = native.decode_records(answer, where=f"{version} {topic}/{qid}", topic=topic,
                                               queue_id=qid, start=q["minOffset"], end=q["maxOffset"])
            decoded = batch.to_pylist()
            assert nxt == q["maxOffset"] and decoded == rows, (version, topic, qid, "pull answer")
            absorb(f"{version} pull {topic}/{qid}", decoded)
            counts["decoded"] += len(decoded)
        for case in _jsonl(folder / "filter.jsonl"):
            if case["status"] not in ("FOUND", "NO_MATCHED_MESSAGE") or \
                    case["startOffset"] >= case["nextBeginOffset"]:
                continue
            sub = Subscription.parse(case["expression"])
            rows = st.scan(case["topic"], case["queueId"], case["startOffset"], case["nextBeginOffset"],
                           codes=None if sub.sub_all else sub.codes, max_rows=1000)
            offsets = [r["queueOffset"] for r in rows]
            assert offsets == case["queueOffsets"], (version, case["expression"], case["startOffset"])
            absorb(f"{version} filter", offsets)
            counts["filters"] += 1
    counts["tls"] = _tls_contexts()
    return {"machine": platform.machine(), "module": _native.__file__, **counts,
            "digest": digest.hexdigest()}


if __name__ == "__main__":
    print(json.dumps(check(Path(sys.argv[1]))))
