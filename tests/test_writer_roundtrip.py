"""Whatever StoreWriter writes, the reader (rmq_source.store.reader.Store) returns unchanged."""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import zlib
from datetime import datetime, timezone
from pathlib import Path


from conftest import require

require("hypothesis", "the round-trip properties are hypothesis tests")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from rmq_source.store import record_codec as rc
from rmq_source.store.writer import StoreWriter

store_module = require("rmq_source.store.reader", "the reader is not available")
Store = store_module.Store

# text that a property string can carry: no separators, no lone surrogates
_prop_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"),
                     min_size=1, max_size=12)
_tag = st.one_of(st.none(), st.sampled_from(["TagA", "TagB", "Aa", "BB", "名前", "*"]), _prop_text)
_key = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02 "),
               min_size=1, max_size=8)
_ipv4 = st.ip_addresses(v=4).map(lambda ip: f"{ip}:{0}")
_ipv6 = st.ip_addresses(v=6).filter(lambda ip: ip.ipv4_mapped is None).map(lambda ip: f"[{ip}]:{0}")
_host = st.tuples(st.one_of(_ipv4, _ipv6), st.integers(0, 65535)).map(
    lambda t: t[0][:-1] + str(t[1]))

_message = st.fixed_dictionaries({
    "topic": st.sampled_from(["T", "Other_%-|", "V" * 128]),
    "body": st.one_of(st.just(b""), st.binary(max_size=300), st.just(b"repeat " * 60)),
    "tags": _tag,
    "keys": st.one_of(st.none(), st.lists(_key, min_size=1, max_size=3)),
    "properties": st.one_of(st.none(), st.dictionaries(
        _prop_text.filter(lambda k: k not in ("TAGS", "KEYS", "UNIQ_KEY")), _prop_text,
        max_size=3)),
    "flag": st.integers(-(1 << 31), (1 << 31) - 1),
    "reconsume_times": st.integers(0, 16),
    "born_host": st.one_of(st.none(), _host),
    "store_host": st.one_of(st.none(), _host),
    "compression": st.sampled_from([None, None, "zlib", "lz4", "zstd"]),
    "queue_id": st.one_of(st.none(), st.integers(0, 2)),
    "gap_ms": st.one_of(st.none(), st.integers(0, 5000)),   # None: the writer's clock
})


def _java_host(text: str | None, default: str) -> str:
    return rc.java_host_string(rc.parse_host(text or default).field)


def _ts(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=st.lists(_message, min_size=1, max_size=25),
       style=st.sampled_from(["4.9.3", "5.3.3"]),
       cl_size=st.sampled_from([2048, 4096, 1 << 16]), units=st.sampled_from([2, 3, 64]))
def test_round_trip(messages, style, cl_size, units):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "store"
        expected = []
        ts = 1_700_000_000_000
        with StoreWriter(root, commitlog_file_size=cl_size, cq_units_per_file=units,
                         properties_style=style, store_host="[::1]:10911") as w:
            for topic in ("T", "Other_%-|", "V" * 128):
                w.create_topic(topic, 3)
            for m in messages:
                # pass only what differs from the defaults, so append's fast path is exercised too
                kwargs = {k: m[k] for k in ("tags", "keys", "properties", "flag", "reconsume_times",
                                            "born_host", "store_host", "compression", "queue_id")
                          if m[k] not in (None, 0)}
                if m["gap_ms"] is None:
                    born = None
                else:
                    ts = max(ts + m["gap_ms"], w._last_store_ts)
                    born = ts - 7
                    kwargs.update(born_timestamp=born, store_timestamp=ts)
                r = w.append(m["topic"], m["body"], **kwargs)
                expected.append((r, m, born))
            roots = (w.root, w.commitlog_file_size)
        with Store(root) as store:
            for r, m, born in expected:
                row = store.read(m["topic"], r.queue_id, r.queue_offset, r.queue_offset + 1).to_pylist()
                assert len(row) == 1, (r, m)
                row = row[0]
                props = dict(row["properties"])
                assert row["body"] == m["body"]
                assert (row["topic"], row["queueId"], row["queueOffset"]) == (m["topic"], r.queue_id,
                                                                             r.queue_offset)
                assert (row["commitLogOffset"], row["storeSize"], row["msgId"]) == (
                    r.commitlog_offset, r.size, r.msg_id)
                assert row["tags"] == m["tags"] and props.get("TAGS") == m["tags"]
                assert row["keys"] == m["keys"]
                assert row["uniqKey"] == props["UNIQ_KEY"]
                assert props["WAIT"] == (m["properties"] or {}).get("WAIT", "true")
                for k, v in (m["properties"] or {}).items():
                    if k != "WAIT":
                        assert props[k] == v
                assert (row["flag"], row["reconsumeTimes"]) == (m["flag"], m["reconsume_times"])
                path, file_size = roots
                start = r.commitlog_offset - r.commitlog_offset % file_size
                data = (path / "commitlog" / f"{start:020d}").read_bytes()
                stored = rc.decode_record(data, r.commitlog_offset - start)
                if born is None:     # the writer's clock: born = store time
                    assert stored.born_timestamp == stored.store_timestamp
                else:
                    assert stored.born_timestamp == born and stored.store_timestamp == born + 7
                assert row["bornTimestamp"] == _ts(stored.born_timestamp)
                assert row["storeTimestamp"] == _ts(stored.store_timestamp)
                assert row["bornHost"] == _java_host(m["born_host"], "127.0.0.1:53210")
                assert row["storeHost"] == _java_host(m["store_host"], "[::1]:10911")
                assert row["preparedTransactionOffset"] == 0 and row["brokerName"] == "broker-a"
                assert bool(row["sysFlag"] & 1) == (m["compression"] is not None)
                assert bool(row["sysFlag"] & 0x10) == (len(rc.parse_host(
                    m["born_host"] or "127.0.0.1:53210").address) == 16)
                assert row["bodyCRC"] == zlib.crc32(stored.body) & 0x7FFFFFFF == stored.body_crc
            for topic in ("T", "Other_%-|", "V" * 128):
                for qid in range(3):
                    n = sum(1 for r, m, _ in expected if m["topic"] == topic and r.queue_id == qid)
                    assert store.max_offset(topic, qid) == n
                    assert store.read(topic, qid, 0, n).num_rows == n


def test_tag_filter_on_written_store(tmp_path):
    with StoreWriter(tmp_path / "s", commitlog_file_size=4096, cq_units_per_file=4) as w:
        w.create_topic("T", 1)
        tags = ["TagA", "Aa", "BB", None, "TagC", "TagA"]
        for i, t in enumerate(tags * 5):
            w.append("T", str(i).encode(), tags=t)
    with Store(tmp_path / "s") as store:
        got = store.read("T", 0, 0, 30, subscription="TagA || BB").column("tags").to_pylist()
        assert got == [t for t in tags * 5 if t in ("TagA", "BB")]


WRITER_SCRIPT = """
import sys, time
from rmq_source.store.writer import StoreWriter
root, count = sys.argv[1], int(sys.argv[2])
with StoreWriter(root, commitlog_file_size=8192, cq_units_per_file=16) as w:
    w.create_topic("Live", 2)
    print("ready", flush=True)
    for i in range(count):
        w.append("Live", (b"%d:" % i) * (1 + i % 40), queue_id=i % 2, tags="TagA" if i % 3 else None)
        if i % 50 == 0:
            time.sleep(0.002)
"""


def test_reader_concurrent_with_writer_sees_only_complete_messages(tmp_path):
    """A second process appends while we read: every row read is complete and in order."""
    root = tmp_path / "live"
    count = 3000
    proc = subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, str(root), str(count)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        seen = {0: 0, 1: 0}
        deadline = time.monotonic() + 120
        with Store(root) as store:
            while sum(seen.values()) < count and time.monotonic() < deadline:
                for qid in (0, 1):
                    if not (root / "consumequeue" / "Live" / str(qid)).is_dir():
                        continue
                    batch = store.read("Live", qid, seen[qid], seen[qid] + 500)
                    for offset, body in zip(batch.column("queueOffset").to_pylist(),
                                            batch.column("body").to_pylist()):
                        i = offset * 2 + qid
                        assert offset == seen[qid]
                        assert body == (b"%d:" % i) * (1 + i % 40)
                        seen[qid] += 1
        assert sum(seen.values()) == count
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == 0


def test_batches_read_back(tmp_path):
    bodies = [bytes([i]) * i for i in range(40)]
    with StoreWriter(tmp_path / "s", commitlog_file_size=4096, cq_units_per_file=8) as w:
        w.create_topic("T", 2)
        written = []
        for i in range(0, 40, 5):
            written += w.append_batch("T", bodies[i:i + 5], tags="TagA", keys=["k"])
    with Store(tmp_path / "s") as store:
        for qid in (0, 1):
            mine = [(r, bodies[i]) for i, r in enumerate(written) if r.queue_id == qid]
            batch = store.read("T", qid, 0, 100)
            assert batch.column("body").to_pylist() == [b for _, b in mine]
            assert batch.column("msgId").to_pylist() == [r.msg_id for r, _ in mine]
            assert set(batch.column("tags").to_pylist()) == {"TagA"}
