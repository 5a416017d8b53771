"""Read stores through the public Store API in a separate process and report what came back.

``python store_probe.py JOBS.json OUT.jsonl``: JOBS is a list of
``{"id": any, "store": path, "topic": str, "queues": [ids] | null, "verify_crc": bool}``.
For each job every listed queue (null: every queue of the topic) is read over ``[min, max)``
as the store reports them, and one JSON line is written (and flushed) to OUT:

* ``{"id": ..., "queues": {qid: {"min": m, "max": M, "rows": [{column: digest}]}}}``, or
* ``{"id": ..., "error": {"type", "module", "code", "path", "position", "message", "mro"}}``.

Each value is reduced to a short digest (timestamps as their int64 microseconds, so values
beyond Python's datetime range still compare) so a test can tell exactly which columns of which row
differ from an undamaged store. A crash (signal) or a hang shows as a missing line: the caller
runs this with a timeout and knows the job that was being read.
"""
from __future__ import annotations

import hashlib
import json
import sys

import pyarrow as pa

from rmq_source.store.reader import Store


def _digest(value) -> str:
    if isinstance(value, list):   # map (list of pairs) or list of keys
        value = sorted(value, key=repr) if value and isinstance(value[0], tuple) else value
    return hashlib.blake2b(repr(value).encode(), digest_size=6).hexdigest()


def run(job: dict) -> dict:
    out: dict = {"id": job["id"]}
    try:
        with Store(job["store"]) as store:
            qids = job.get("queues") or store.queue_ids(job["topic"])
            result = {}
            for qid in qids:
                info = store.queue_info(job["topic"], qid)
                batch = store.read(job["topic"], qid, info.min_offset, info.max_offset,
                                   verify_crc=bool(job.get("verify_crc")))
                columns = {}
                for field, col in zip(batch.schema, batch.columns):
                    if pa.types.is_timestamp(field.type):   # any int64, even past year 9999
                        col = col.cast(pa.int64())
                    columns[field.name] = col.to_pylist()
                rows = [{k: _digest(v[i]) for k, v in columns.items()} for i in range(batch.num_rows)]
                for row, off in zip(rows, columns["queueOffset"]):
                    row["_offset"] = off
                result[str(qid)] = {"min": info.min_offset, "max": info.max_offset, "rows": rows}
            out["queues"] = result
    except Exception as exc:  # noqa: BLE001 - the caller judges every outcome
        out["error"] = {"type": type(exc).__name__, "module": type(exc).__module__,
                        "mro": [c.__name__ for c in type(exc).__mro__],
                        "code": getattr(exc, "code", None), "path": getattr(exc, "path", None),
                        "position": getattr(exc, "position", None), "message": str(exc)}
    return out


def main(argv: list[str]) -> int:
    jobs = json.loads(open(argv[1], encoding="utf-8").read())
    with open(argv[2], "w", encoding="utf-8") as out:
        for job in jobs:
            out.write(json.dumps(run(job)) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
