"""The operations commands of rmq-store (lag, reset-offset, search), run as real subprocesses.

Stores: one written by our StoreWriter (tests/store_builder.py; no index files, so search scans)
and a writable copy of the RocketMQ 4.9.3 fixture (index files, the broker's consumerOffset.json).
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import fixture_dir, fixtures_root

from rmq_source.group.membership import GroupMembership
from rmq_source.group.locks import QueueLockManager

sys.path.insert(0, str(Path(__file__).resolve().parent))
from store_builder import build_store  # noqa: E402

BASIC = fixtures_root() / "rocketmq-4.9.3" / "basic"
GROUP = "GroupOps"


def run(*args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rmq_source", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def ok(*args) -> subprocess.CompletedProcess:
    out = run(*args)
    assert out.returncode == 0, out.stderr
    return out


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def lag_table(root, *extra) -> dict[tuple[str, int], dict]:
    rows = json_lines(ok("lag", root, "--group", GROUP, "--json", *extra).stdout)
    return {(r["topic"], r["queueId"]): r for r in rows}


@pytest.fixture()
def written(tmp_path):
    """A fresh writer-made store: TopicTest 4 queues x 60 messages, OrderTopic 3 x 30."""
    root = tmp_path / "store"
    return root, build_store(root)


@pytest.fixture(scope="module")
def fixture_copy(tmp_path_factory):
    fixture_dir("rocketmq-4.9.3/basic")
    root = tmp_path_factory.mktemp("fx") / "store"
    shutil.copytree(BASIC / "store", root)
    for folder, _, files in os.walk(root):        # the fixture is read-only
        os.chmod(folder, os.stat(folder).st_mode | stat.S_IWUSR)
        for name in files:
            path = os.path.join(folder, name)
            os.chmod(path, os.stat(path).st_mode | stat.S_IWUSR)
    return root


def _manifest() -> list[dict]:
    return [json.loads(line) for line in open(BASIC / "manifest.jsonl", encoding="utf-8")]


# ------------------------------------------------------------------------------------------ lag

def test_lag_of_a_java_group_comes_from_the_brokers_file(fixture_copy):
    lags = json_lines(ok("lag", fixture_copy, "--group", "ConsumerGroupA", "--json").stdout)
    readback = json.loads((BASIC / "offsets_readback.json").read_text())["offsetTable"]
    committed = {int(q): o for q, o in readback["TopicTest@ConsumerGroupA"].items()}
    queues = {(q["topic"], q["queueId"]): q for q in
              json.loads((BASIC / "queues.json").read_text())["queues"]}
    stamps = {(m["topic"], m["queueId"], m["queueOffset"]): m["storeTimestamp"] for m in _manifest()}
    assert [(r["topic"], r["queueId"]) for r in lags] == [("TopicTest", q) for q in range(4)]
    for r in lags:
        broker = queues[("TopicTest", r["queueId"])]["maxOffset"]
        consumer = committed[r["queueId"]]
        assert (r["brokerName"], r["brokerOffset"], r["consumerOffset"], r["diff"]) == (
            "broker-a", broker, consumer, broker - consumer)
        assert r["lastTimestamp"] == stamps[("TopicTest", r["queueId"], consumer - 1)]


def test_lag_human_table_has_a_total(fixture_copy):
    out = ok("lag", fixture_copy, "--group", "ConsumerGroupB")
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["TOPIC", "BROKER", "QUEUE", "BROKER_OFFSET", "CONSUMER_OFFSET",
                                "DIFF", "LAST_CONSUMED"]
    body = [line.split() for line in lines[1:-1]]
    assert len(body) == 8 and all(row[0] == "OrderTopic" for row in body)
    assert len({len(line) for line in lines[:-1]}) == 1                 # aligned columns
    total = sum(int(row[5]) for row in body)
    assert lines[-1] == f"total diff: {total} (8 queues)" and total > 0


def test_lag_before_and_after_resets(written):
    root, msgs = written
    # no progress anywhere: nothing to list unless a topic is named
    out = ok("lag", root, "--group", GROUP)
    assert "has no offsets" in out.stdout and "--topic" in out.stdout
    assert ok("lag", root, "--group", GROUP, "--json").stdout == ""
    before = lag_table(root, "--topic", "TopicTest")
    assert {k: (r["consumerOffset"], r["diff"], r["lastTimestamp"]) for k, r in before.items()} == {
        ("TopicTest", q): (-1, 60, None) for q in range(4)}

    ok("reset-offset", root, "--group", GROUP, "--topic", "TopicTest", "--to", "latest")
    after = lag_table(root)                                  # the group now has TopicTest offsets
    last_ts = {}
    for m in msgs:
        if m.topic == "TopicTest":
            last_ts[m.queue_id] = max(last_ts.get(m.queue_id, 0), m.store_ts)
    assert {k: (r["consumerOffset"], r["diff"], r["lastTimestamp"]) for k, r in after.items()} == {
        ("TopicTest", q): (60, 0, last_ts[q]) for q in range(4)}

    # by timestamp: the first message stored at or after T in each queue
    ts = sorted(m.store_ts for m in msgs if m.topic == "TopicTest")[100]
    out = ok("reset-offset", root, "--group", GROUP, "--topic", "TopicTest", "--timestamp", ts,
             "--json")
    expected = {}
    for m in msgs:
        if m.topic == "TopicTest" and m.store_ts >= ts:
            expected[m.queue_id] = min(expected.get(m.queue_id, 60), m.queue_offset)
    rows = json_lines(out.stdout)
    assert {r["queueId"]: (r["previousOffset"], r["offset"]) for r in rows} == {
        q: (60, expected[q]) for q in range(4)}
    lags = lag_table(root)
    assert {k[1]: r["diff"] for k, r in lags.items()} == {q: 60 - expected[q] for q in range(4)}
    assert sum(r["diff"] for r in lags.values()) == 240 - 100


@pytest.mark.parametrize("offsets, expected", [
    ('{"1": 7}', {0: -1, 1: 7, 2: -1, 3: -1}),            # queues not named keep their (no) offset
    ('{"TopicTest": {"broker-a": {"0": 3, "3": -2}}}', {0: 3, 1: -1, 2: -1, 3: 0}),
    ('{"2": 999, "0": -1}', {0: 60, 1: -1, 2: 60, 3: -1}),       # clamped to max / latest
])
def test_reset_explicit_offsets(written, offsets, expected):
    root, _ = written
    out = ok("reset-offset", root, "--group", GROUP, "--topic", "TopicTest", "--offsets", offsets)
    assert "reset consumer group 'GroupOps' on topic 'TopicTest'" in out.stdout
    assert {k[1]: r["consumerOffset"] for k, r in
            lag_table(root, "--topic", "TopicTest").items()} == expected


def test_reset_and_lag_share_a_custom_offset_store(written, tmp_path):
    root, _ = written
    other = tmp_path / "offsets"
    ok("reset-offset", root, "--group", GROUP, "--topic", "OrderTopic", "--to", "earliest",
       "--offset-store", other)
    assert (other / "broker-a" / "consumerOffset.json").is_file()
    assert not (root / "rmq_source_offsets").exists()
    mine = lag_table(root, "--offset-store", other)
    assert {k: r["consumerOffset"] for k, r in mine.items()} == {("OrderTopic", q): 0 for q in range(3)}
    assert lag_table(root) == {}                              # the default store knows nothing


def test_lag_skips_topics_that_left_the_store(written):
    from rmq_source.group.allocation import MessageQueue
    from rmq_source.group.offset_store import GroupOffsetStore
    root, _ = written
    offsets = GroupOffsetStore(root / "rmq_source_offsets", GROUP)
    offsets.update_offset(MessageQueue("Gone", "broker-a", 0), 5)
    offsets.update_offset(MessageQueue("OrderTopic", "broker-a", 1), 4)
    offsets.persist()
    out = ok("lag", root, "--group", GROUP, "--json")
    assert [(r["topic"], r["queueId"], r["consumerOffset"]) for r in json_lines(out.stdout)] == [
        ("OrderTopic", 0, -1), ("OrderTopic", 1, 4), ("OrderTopic", 2, -1)]
    assert "note:" in out.stderr and "'Gone'" in out.stderr and "skipped" in out.stderr


def test_reset_on_the_fixture_overrides_the_brokers_offsets(fixture_copy):
    broker_file = fixture_copy / "config" / "consumerOffset.json"
    original = broker_file.read_bytes()
    ok("reset-offset", fixture_copy, "--group", "ConsumerGroupA", "--topic", "TopicTest", "--to",
       "earliest")
    lags = json_lines(ok("lag", fixture_copy, "--group", "ConsumerGroupA", "--json").stdout)
    assert [(r["consumerOffset"], r["diff"]) for r in lags] == [(0, r["brokerOffset"]) for r in lags]
    assert broker_file.read_bytes() == original               # the broker's file is never written


# --------------------------------------------------------------------- reset refused while in use

def _offsets(root) -> dict[int, int]:
    return {k[1]: r["consumerOffset"] for k, r in lag_table(root, "--topic", "TopicTest").items()}


def test_reset_refused_while_a_query_holds_locks_then_forced(written):
    root, _ = written
    ok("reset-offset", root, "--group", GROUP, "--topic", "TopicTest", "--to", "latest")
    state = root / "rmq_source_offsets"
    locks = QueueLockManager(state, GROUP)
    held = locks.try_lock_batch([("TopicTest", "broker-a", 1), ("OrderTopic", "broker-a", 2)],
                                "spark-query-1")
    assert len(held) == 2
    out = run("reset-offset", root, "--group", GROUP, "--topic", "TopicTest", "--to", "earliest")
    assert out.returncode == 4, out.stderr
    line, = out.stderr.strip().splitlines()
    assert line.startswith("rmq-store: refused:") and "spark-query-1" in line
    assert "TopicTest/broker-a/1" in line and "OrderTopic/broker-a/2" in line and "--force" in line
    assert _offsets(root) == {q: 60 for q in range(4)}        # nothing written

    out = run("reset-offset", root, "--group", GROUP, "--topic", "TopicTest", "--to", "earliest",
              "--force")
    assert out.returncode == 0, out.stderr
    assert "warning" in out.stderr and "spark-query-1" in out.stderr
    assert _offsets(root) == {q: 0 for q in range(4)}
    assert locks.owner(("TopicTest", "broker-a", 1)) == "spark-query-1"   # locks left alone

    locks.unlock_batch([("TopicTest", "broker-a", 1), ("OrderTopic", "broker-a", 2)], "spark-query-1")
    ok("reset-offset", root, "--group", GROUP, "--topic", "TopicTest", "--to", "latest")
    assert _offsets(root) == {q: 60 for q in range(4)}


def test_reset_refused_while_a_query_heartbeats(written):
    root, _ = written
    member = GroupMembership(root / "rmq_source_offsets", GROUP, "spark-query-2")
    member.heartbeat()
    out = run("reset-offset", root, "--group", GROUP, "--topic", "TopicTest", "--to", "latest")
    assert out.returncode == 4 and "spark-query-2" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    member.leave()
    ok("reset-offset", root, "--group", GROUP, "--topic", "TopicTest", "--to", "latest")


def test_expired_locks_and_other_groups_do_not_block(written):
    root, _ = written
    state = root / "rmq_source_offsets"
    stale = QueueLockManager(state, GROUP, lease_ms=1000, clock=lambda: time.time() - 60)
    assert stale.try_lock_batch([("TopicTest", "broker-a", 0)], "dead-query")
    QueueLockManager(state, "OtherGroup").try_lock_batch([("TopicTest", "broker-a", 0)], "q")
    out = ok("reset-offset", root, "--group", GROUP, "--topic", "TopicTest", "--to", "latest")
    assert out.stderr == ""


FAR_FUTURE = 10 ** 18
GHOST_STATE = {
    "locks.json": {"version": 1, "group": GROUP, "locks": {"TopicTest|broker-a|1": {
        "clientId": "ghost", "lastUpdateTimestamp": FAR_FUTURE, "leaseMs": 60000}}},
    "members.json": {"version": 1, "group": GROUP, "clients": {
        "ghost": {"lastHeartbeatMs": FAR_FUTURE, "host": "h", "pid": 1}}},
}


@pytest.mark.parametrize("name", GHOST_STATE)
def test_a_far_future_stamp_is_corrupt_state_not_a_group_in_use_forever(written, name):
    """A lock or heartbeat stamped in 10^18 never expires: instead of refusing forever as "in use",
    reset-offset fails as for any corrupt state file (exit 3) naming the file, the entry and the
    value; --force resets anyway with that text as a warning."""
    root, _ = written
    ok("reset-offset", root, "--group", GROUP, "--topic", "TopicTest", "--to", "latest")
    path = root / "rmq_source_offsets" / f"{GROUP}.{name}"
    path.write_text(json.dumps(GHOST_STATE[name]))
    out = run("reset-offset", root, "--group", GROUP, "--topic", "TopicTest", "--to", "earliest")
    assert out.returncode == 3, out.stderr
    line, = out.stderr.strip().splitlines()
    assert line.startswith("rmq-store: store error: ") and f"{path} is invalid" in line
    assert "ghost" in line and f" {FAR_FUTURE} is " in line and "ahead of this host's clock" in line
    assert _offsets(root) == {q: 60 for q in range(4)}        # nothing written

    out = run("reset-offset", root, "--group", GROUP, "--topic", "TopicTest", "--to", "earliest",
              "--force")
    assert out.returncode == 0, out.stderr
    assert out.stderr.startswith("rmq-store: warning: cannot tell whether group") and str(path) in out.stderr
    assert _offsets(root) == {q: 0 for q in range(4)}
    assert json.loads(path.read_text()) == GHOST_STATE[name]  # left for the operator


# --------------------------------------------------------------------------------------- search

@pytest.mark.parametrize("topic, key", [
    ("OrderTopic", "ORDER-024"),                          # a KEYS word on 20 messages
    ("OrderTopic", "C000020245EC5FFD2B276B57B669001B"),   # a UNIQ_KEY
    ("TopicTest", "KEY-01275"),
    ("TopicTest", "NO-SUCH-KEY"),
])
def test_search_by_index_on_the_fixture(fixture_copy, topic, key):
    answer = next(json.loads(line) for line in open(BASIC / "index.jsonl", encoding="utf-8")
                  if json.loads(line)["topic"] == topic and json.loads(line)["key"] == key)
    truth = sorted(m["commitLogOffset"] for m in _manifest() if m["topic"] == topic and (
        key in (m["keys"] or "").split(" ") or m["uniqKey"] == key))
    assert truth == sorted(answer["commitLogOffsets"])   # here the broker's candidates all match
    out = ok("search", fixture_copy, "--topic", topic, "--key", key, "--json")
    rows = json_lines(out.stdout)
    assert [r["commitLogOffset"] for r in rows] == truth
    assert out.stderr == ""                               # no scan, no progress bar


def test_search_human_output(fixture_copy):
    lines = ok("search", fixture_copy, "--topic", "OrderTopic", "--key", "ORDER-045").stdout.splitlines()
    assert lines[-1] == ("11 message(s) with key 'ORDER-045' in topic 'OrderTopic' (index: 3 "
                         "index file(s), 11 candidate(s), 11 verified)")
    assert len(lines) == 12 and all(line.startswith("OrderTopic/5@") for line in lines[:-1])
    assert all("ORDER-045" in line.split("keys=")[1].split("  ")[0] for line in lines[:-1])


def test_search_drops_index_hash_collisions(fixture_copy):
    # "P3DER-024" has the Java hash of "ORDER-024": the index yields ORDER-024's 20 messages
    out = ok("search", fixture_copy, "--topic", "OrderTopic", "--key", "P3DER-024")
    assert out.stdout.strip() == ("0 message(s) with key 'P3DER-024' in topic 'OrderTopic' "
                                  "(index: 3 index file(s), 20 candidate(s), 0 verified)")


def test_search_scan_agrees_with_the_index_on_the_fixture(fixture_copy):
    by_index = ok("search", fixture_copy, "--topic", "OrderTopic", "--key", "ORDER-006", "--json")
    by_scan = ok("search", fixture_copy, "--topic", "OrderTopic", "--key", "ORDER-006", "--json",
                 "--method", "scan")
    assert by_scan.stdout == by_index.stdout and len(json_lines(by_scan.stdout)) == 13
    assert "100%" in by_scan.stderr


def test_search_by_scan_on_a_writer_store(written):
    root, msgs = written
    # store_builder gives message i of a topic the keys K{i} and O{i % 7}
    expected = [m.msg_id for i, m in enumerate(x for x in msgs if x.topic == "TopicTest")
                if i % 7 == 3]
    out = ok("search", root, "--topic", "TopicTest", "--key", "O3", "--json", "--max", 1000)
    rows = json_lines(out.stdout)
    assert sorted(r["msgId"] for r in rows) == sorted(expected) and len(rows) > 30
    assert [r["commitLogOffset"] for r in rows] == sorted(r["commitLogOffset"] for r in rows)
    assert all("O3" in r["keys"] for r in rows)
    assert "scan TopicTest" in out.stderr and "100%" in out.stderr and "240/240" in out.stderr

    newest = ok("search", root, "--topic", "TopicTest", "--key", "O3", "--max", 5, "--no-progress")
    assert newest.stderr == ""
    lines = newest.stdout.splitlines()
    assert len(lines) == 6 and "full scan" in lines[-1] and "the newest 5 shown" in lines[-1]
    shown = [line.split("msgId=")[1].split()[0] for line in lines[:-1]]
    assert shown == sorted(expected, key=lambda mid: int(mid[-16:], 16))[-5:]

    uniq = rows[0]["uniqKey"]
    by_uniq = json_lines(ok("search", root, "--topic", "TopicTest", "--key", uniq, "--json",
                            "--no-progress").stdout)
    assert [r["msgId"] for r in by_uniq] == [rows[0]["msgId"]]
    none = ok("search", root, "--topic", "OrderTopic", "--key", "K999", "--no-progress")
    assert none.stdout.startswith("0 message(s) with key 'K999'")


def test_search_index_method_needs_index_files(written):
    root, _ = written
    out = run("search", root, "--topic", "TopicTest", "--key", "K1", "--method", "index")
    assert out.returncode == 3 and "no index files" in out.stderr


# ------------------------------------------------------------------------------- argument errors

@pytest.mark.parametrize("args, fragment", [
    (["lag", "{root}"], "--group"),
    (["lag", "{root}", "--group", "bad group!"], "--group"),
    (["reset-offset", "{root}", "--group", "G", "--topic", "TopicTest"],
     "--timestamp --to --offsets"),
    (["reset-offset", "{root}", "--group", "G", "--to", "latest"], "--topic"),
    (["reset-offset", "{root}", "--group", "G", "--topic", "TopicTest", "--to", "middle"], "--to"),
    (["reset-offset", "{root}", "--group", "G", "--topic", "TopicTest", "--timestamp", "-5"],
     "--timestamp"),
    (["reset-offset", "{root}", "--group", "G", "--topic", "TopicTest", "--timestamp", "soon"],
     "--timestamp"),
    (["reset-offset", "{root}", "--group", "G", "--topic", "TopicTest", "--timestamp", "1", "--to",
      "latest"], "--to"),
    (["reset-offset", "{root}", "--group", "G", "--topic", "TopicTest", "--offsets", "{0: 1}"],
     "--offsets"),
    (["reset-offset", "{root}", "--group", "G", "--topic", "TopicTest", "--offsets", "[1]"],
     "--offsets"),
    (["reset-offset", "{root}", "--group", "G", "--topic", "TopicTest", "--offsets", '{"x": 1}'],
     "--offsets"),
    (["reset-offset", "{root}", "--group", "G", "--topic", "TopicTest", "--offsets", '{"0": -3}'],
     "--offsets"),
    (["reset-offset", "{root}", "--group", "G", "--topic", "TopicTest", "--offsets", '{"0": 1.5}'],
     "--offsets"),
    (["reset-offset", "{root}", "--group", "G", "--topic", "TopicTest", "--offsets", '{"9": 1}'],
     "--offsets"),
    (["reset-offset", "{root}", "--group", "G", "--topic", "TopicTest", "--offsets",
      '{"OrderTopic": {"broker-a": {"0": 1}}}'], "--offsets"),
    (["reset-offset", "{root}", "--group", "G", "--topic", "TopicTest", "--offsets",
      '{"TopicTest": {"broker-b": {"0": 1}}}'], "--offsets"),
    (["reset-offset", "{root}", "--group", "G", "--topic", "TopicTest", "--to", "latest",
      "--offset-store", "{root}/config/offsets"], "--offset-store"),
    (["lag", "{root}", "--group", "G", "--offset-store", "{root}/config"], "--offset-store"),
    (["search", "{root}", "--topic", "TopicTest"], "--key"),
    (["search", "{root}", "--topic", "TopicTest", "--key", "a b"], "--key"),
    (["search", "{root}", "--topic", "TopicTest", "--key", "K1", "--max", "0"], "--max"),
    (["search", "{root}", "--topic", "TopicTest", "--key", "K1", "--method", "fast"], "--method"),
    (["search", "{root}", "--topic", "TopicTest", "--key", "K1", "--method", "scan",
      "--hash-slots", "512"], "--hash-slots"),
])
def test_bad_arguments_exit_2_naming_the_option(written, args, fragment):
    root, _ = written
    out = run(*(a.replace("{root}", str(root)) for a in args))
    assert out.returncode == 2, out.stderr
    assert fragment in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert out.stdout == ""
    assert not (root / "rmq_source_offsets").exists()


def test_geometry_options_that_do_not_fit_the_index_exit_2(fixture_copy):
    out = run("search", fixture_copy, "--topic", "TopicTest", "--key", "K", "--hash-slots", 500)
    assert out.returncode == 2 and "--hash-slots" in out.stderr and "index file" in out.stderr
    good = ok("search", fixture_copy, "--topic", "TopicTest", "--key", "KEY-01275",
              "--hash-slots", 512, "--index-num", 2048)
    assert good.stdout.startswith("TopicTest/")


@pytest.mark.parametrize("args, fragment", [
    (["lag", "{missing}", "--group", "G"], "not a directory"),
    (["lag", "{root}", "--group", "G", "--topic", "Nope"], "Nope"),
    (["reset-offset", "{root}", "--group", "G", "--topic", "Nope", "--to", "latest"], "Nope"),
    (["search", "{root}", "--topic", "Nope", "--key", "K1"], "Nope"),
])
def test_store_errors_exit_3(written, tmp_path, args, fragment):
    root, _ = written
    out = run(*(a.replace("{root}", str(root)).replace("{missing}", str(tmp_path / "none"))
                for a in args))
    assert out.returncode == 3, out.stderr
    assert fragment in out.stderr and len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args, code, stream, names", [
    (("reset-offset", "{root}", "--group", GROUP, "--topic", "TopicTest", "--offsets",
      '{"9": 1, "1": 2}'), 2, "stderr", ["TopicTest/broker-a/9"]),
    (("reset-offset", "{root}", "--group", GROUP, "--topic", "TopicTest", "--offsets",
      '{"TopicTest": {"broker-a": {"4": 1}}}'), 2, "stderr", ["TopicTest/broker-a/4"]),
    (("reset-offset", "{root}", "--group", GROUP, "--topic", "TopicTest", "--to", "earliest"),
     0, "stdout", ["TopicTest", "broker-a"]),
    (("lag", "{root}", "--group", GROUP, "--topic", "TopicTest"), 0, "stdout",
     ["TopicTest", "broker-a"]),
])
def test_queues_are_named_one_way_in_human_output(written, args, code, stream, names):
    """Every human-readable output names a queue as topic/broker/queueId (or in TOPIC, BROKER,
    QUEUE columns), never as Java's ``MessageQueue [topic=..., ...]``."""
    root, _ = written
    out = run(*(str(root) if a == "{root}" else a for a in args))
    assert out.returncode == code, out.stderr
    text = getattr(out, stream)
    assert "MessageQueue" not in out.stdout + out.stderr
    assert all(n in text for n in names), text
    if code == 2:
        assert "its queues: 0, 1, 2, 3" in text


# ------------------------------------------------------------------------------------ namespace

def test_namespace_names_topics_and_groups_as_its_clients_do(tmp_path):
    """--namespace NS: --topic T and --group G are NS%T and NS%G in the store (as the data
    source's namespace option names them); topics lists NS's topics only, every output shows
    them without NS%; the offsets JSON may name the topic either way."""
    from rmq_source.store.writer import StoreWriter
    root = tmp_path / "store"
    with StoreWriter(str(root), broker_name="broker-a") as writer:
        for topic in ("ns1%Orders", "Orders", "ns2%Orders"):
            writer.create_topic(topic, 2)
            for i in range(6):
                writer.append(topic, f"{topic}-{i}".encode(), tags="t")
    ns = ("--namespace", "ns1")
    assert [(r["topic"], r["queueId"], r["maxOffset"]) for r in
            json_lines(ok("topics", root, "--json", *ns).stdout)] == [("Orders", 0, 3), ("Orders", 1, 3)]
    rows = json_lines(ok("print", root, "--topic", "Orders", "--json", *ns).stdout)
    assert sorted(base64.b64decode(r["body"]).decode() for r in rows) == [
        f"ns1%Orders-{i}" for i in range(6)] and {r["topic"] for r in rows} == {"Orders"}
    for offsets in ('{"Orders": {"broker-a": {"0": 2}}}', '{"ns1%Orders": {"broker-a": {"1": 1}}}'):
        out = ok("reset-offset", root, "--group", "G", "--topic", "Orders", "--offsets", offsets, *ns)
        assert "on topic 'ns1%Orders'" in out.stdout, out.stdout
    stored = json_lines(ok("lag", root, "--group", "ns1%G", "--topic", "ns1%Orders", "--json").stdout)
    assert [(r["topic"], r["queueId"], r["consumerOffset"]) for r in stored] == [
        ("ns1%Orders", 0, 2), ("ns1%Orders", 1, 1)]
    shown = json_lines(ok("lag", root, "--group", "G", "--json", *ns).stdout)
    assert [(r["topic"], r["consumerOffset"]) for r in shown] == [("Orders", 2), ("Orders", 1)]
    assert "Orders" in ok("lag", root, "--group", "G", *ns).stdout
    bad = run("topics", root, "--namespace", "a%b")
    assert bad.returncode == 2 and "--namespace" in bad.stderr, bad.stderr
