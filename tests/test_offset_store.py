"""rmq_source.group.offset_store: RocketMQ offset-store semantics, the broker's file shape, crash safety,
fallback to the broker's own consumerOffset.json, and no lost update between processes."""
from __future__ import annotations

import fcntl
import hashlib
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import fixture_dir

from rmq_source.group.allocation import MessageQueue
from rmq_source.store.config_files import dump_fastjson, parse_fastjson, write_config_atomic
from rmq_source.errors import RmqConfigFileError, RmqOffsetStoreError, RmqOptionError
from rmq_source.group.offset_store import OFFSET_FILE_NAME, GroupOffsetStore, ReadOffsetType

REPO = Path(__file__).resolve().parents[1]
MQ = MessageQueue
MEMORY, STORE, FIRST = (ReadOffsetType.READ_FROM_MEMORY, ReadOffsetType.READ_FROM_STORE,
                        ReadOffsetType.MEMORY_FIRST_THEN_STORE)
# What the 4.9.3 broker committed for ConsumerGroupA (fixture config/consumerOffset.json).
BROKER_GROUP_A = {0: 317, 1: 142, 2: 293, 3: 159}


def broker_store_4_9_3() -> Path:
    return fixture_dir("rocketmq-4.9.3/basic") / "store"


def snapshot(directory: Path) -> dict[str, tuple[str, int]]:
    """name -> (sha256, mtime_ns) of every file in ``directory``."""
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(directory.iterdir())}


def on_disk(store: GroupOffsetStore, broker: str = "broker-a") -> str:
    return Path(store.file_path(broker)).read_text("utf-8")


def test_round_trip_through_a_new_instance(tmp_path):
    store = GroupOffsetStore(tmp_path / "offs", "G")
    store.update_offset(MQ("T", "broker-a", 0), 10)
    store.update_offset(MQ("T", "broker-a", 3), 7)
    store.update_offset(MQ("U", "broker-b", 1), 5)
    store.persist()
    again = GroupOffsetStore(tmp_path / "offs", "G")
    assert again.read_offsets([MQ("T", "broker-a", 0), MQ("T", "broker-a", 3), MQ("U", "broker-b", 1),
                               MQ("T", "broker-a", 1)], STORE) == {
        MQ("T", "broker-a", 0): 10, MQ("T", "broker-a", 3): 7, MQ("U", "broker-b", 1): 5,
        MQ("T", "broker-a", 1): -1}
    assert GroupOffsetStore(tmp_path / "offs", "OtherGroup").read_offset(MQ("T", "broker-a", 0)) == -1


def test_file_has_the_brokers_fastjson_shape(tmp_path):
    store = GroupOffsetStore(tmp_path / "offs", "G")
    for qid, offset in ((2, 30), (0, 10), (1, 20)):
        store.update_offset(MQ("T", "broker-a", qid), offset)
    store.update_offset(MQ("T", "broker-b", 0), 99)
    store.persist()
    assert store.file_path("broker-a") == str(tmp_path / "offs" / "broker-a" / "consumerOffset.json")
    text = on_disk(store)
    assert "{0:10,1:20,2:30" in text            # bare integer keys, queue-id order
    assert '"0"' not in text and "broker-b" not in text
    assert parse_fastjson(text) == {"offsetTable": {"T@G": {0: 10, 1: 20, 2: 30}}}
    assert text == dump_fastjson({"offsetTable": {"T@G": {0: 10, 1: 20, 2: 30}}})
    assert parse_fastjson(on_disk(store, "broker-b")) == {"offsetTable": {"T@G": {0: 99}}}


def test_persist_keeps_other_groups_topics_and_fields(tmp_path):
    path = tmp_path / "offs" / "broker-a" / OFFSET_FILE_NAME
    existing = {"dataVersion": {"counter": 3}, "offsetTable": {
        "T@Other": {0: 1, 5: 2}, "U@G": {0: 8}, "T@G": {0: 100, 1: 200}}}
    write_config_atomic(path, dump_fastjson(existing))
    store = GroupOffsetStore(tmp_path / "offs", "G")
    store.update_offset(MQ("T", "broker-a", 1), 250)
    store.update_offset(MQ("T", "broker-a", 2), 300)
    store.persist()
    assert parse_fastjson(path.read_text()) == {"dataVersion": {"counter": 3}, "offsetTable": {
        "T@Other": {0: 1, 5: 2}, "U@G": {0: 8}, "T@G": {0: 100, 1: 250, 2: 300}}}


def test_unchanged_persist_does_not_rewrite(tmp_path):
    store = GroupOffsetStore(tmp_path / "offs", "G")
    store.update_offset(MQ("T", "broker-a", 0), 4)
    store.persist()
    before = os.stat(store.file_path("broker-a"))
    store.persist()
    after = os.stat(store.file_path("broker-a"))
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)


@pytest.mark.parametrize("damage", ["torn", "empty", "missing"])
def test_bak_is_used_when_the_main_file_is_damaged(tmp_path, damage):
    store = GroupOffsetStore(tmp_path / "offs", "G")
    mq = MQ("T", "broker-a", 0)
    store.update_offset(mq, 10)
    store.persist()
    store.update_offset(mq, 20)
    store.persist()
    main = Path(store.file_path("broker-a"))
    assert parse_fastjson(Path(str(main) + ".bak").read_text()) == {"offsetTable": {"T@G": {0: 10}}}
    text = main.read_text()
    if damage == "torn":
        main.write_text(text[: len(text) // 2])
    elif damage == "empty":
        main.write_text("")
    else:
        main.unlink()
    fresh = GroupOffsetStore(tmp_path / "offs", "G")
    assert fresh.read_offset(mq, STORE) == 10
    # The next commit repairs the main file from the .bak content plus the new offset.
    fresh.update_offset(MQ("T", "broker-a", 1), 5)
    fresh.persist([MQ("T", "broker-a", 1)])
    assert parse_fastjson(main.read_text()) == {"offsetTable": {"T@G": {0: 10, 1: 5}}}


def test_unreadable_store_raises_instead_of_minus_one(tmp_path):
    store = GroupOffsetStore(tmp_path / "offs", "G")
    main = Path(store.file_path("broker-a"))
    main.parent.mkdir(parents=True)
    main.write_text('{"offsetTable":{"T@G":{0:')
    Path(str(main) + ".bak").write_text("garbage")
    with pytest.raises(RmqConfigFileError, match="consumerOffset.json"):
        store.read_offset(MQ("T", "broker-a", 0), STORE)
    store.update_offset(MQ("T", "broker-a", 0), 3)
    with pytest.raises(RmqConfigFileError):
        store.persist()  # never overwrite a file it cannot read: other groups' offsets are in it
    assert main.read_text() == '{"offsetTable":{"T@G":{0:'


@pytest.mark.parametrize("content", ['{"offsetTable":[1,2]}', '{"offsetTable":{"T@G":{0:"x"}}}',
                                     '{"offsetTable":{"T@G":[0]}}', '[1]'])
def test_wrong_shape_is_a_config_file_error(tmp_path, content):
    store = GroupOffsetStore(tmp_path / "offs", "G")
    main = Path(store.file_path("broker-a"))
    main.parent.mkdir(parents=True)
    main.write_text(content)
    with pytest.raises(RmqConfigFileError, match=str(main)):
        store.read_offset(MQ("T", "broker-a", 0), STORE)


def test_falls_back_to_the_brokers_own_file(tmp_path):
    root = broker_store_4_9_3()
    before = snapshot(root / "config")
    store = GroupOffsetStore(tmp_path / "offs", "ConsumerGroupA", broker_stores={"broker-a": str(root)})
    mqs = [MQ("TopicTest", "broker-a", q) for q in range(5)]
    assert store.read_offsets(mqs) == {**{mqs[q]: v for q, v in BROKER_GROUP_A.items()}, mqs[4]: -1}
    assert store.read_offset(MQ("OrderTopic", "broker-a", 0), STORE) == -1        # other group's topic
    assert store.read_offset(MQ("TopicTest", "broker-b", 0), STORE) == -1         # no store for broker-b
    group_b = GroupOffsetStore(tmp_path / "offs", "ConsumerGroupB", broker_stores={"broker-a": str(root)})
    assert group_b.read_offset(MQ("OrderTopic", "broker-a", 7), STORE) == 42
    # Our own commits win over the broker's, queue by queue.
    store.update_offset(mqs[1], 500)
    store.persist([mqs[1]])
    fresh = GroupOffsetStore(tmp_path / "offs", "ConsumerGroupA", broker_stores={"broker-a": str(root)})
    assert fresh.read_offsets(mqs[:3], STORE) == {mqs[0]: 317, mqs[1]: 500, mqs[2]: 293}
    assert snapshot(root / "config") == before


def test_never_writes_the_brokers_config(tmp_path):
    root = tmp_path / "store"
    shutil.copytree(broker_store_4_9_3() / "config", root / "config")
    for p in (root / "config").iterdir():
        p.chmod(0o644)  # writable, so only the code (not permissions) keeps it unchanged
    before = snapshot(root / "config")
    store = GroupOffsetStore(root / "rmq_source_offsets", "ConsumerGroupA", broker_stores={"broker-a": str(root)})
    mqs = [MQ("TopicTest", "broker-a", q) for q in range(4)]
    assert store.read_offsets(mqs, STORE) == {mqs[q]: v for q, v in BROKER_GROUP_A.items()}
    for mq in mqs:
        store.update_offset(mq, 1000 + mq.queue_id)
    store.persist()
    store.persist_all(mqs)
    assert snapshot(root / "config") == before
    assert parse_fastjson(on_disk(store)) == {"offsetTable": {"TopicTest@ConsumerGroupA": {
        0: 1000, 1: 1001, 2: 1002, 3: 1003}}}


@pytest.mark.parametrize("path, broker", [("{root}", "config"), ("{root}/config", "broker-a"),
                                          ("{root}/config/x", "broker-a"), ("{root}/config/..", "config")])
def test_refuses_paths_inside_the_brokers_config(tmp_path, path, broker):
    root = tmp_path / "store"
    (root / "config").mkdir(parents=True)
    with pytest.raises(RmqOptionError, match="config folder"):
        store = GroupOffsetStore(path.format(root=root), "G", broker_stores={broker: str(root)})
        store.update_offset(MQ("T", broker, 0), 1)
        store.persist()
    assert list((root / "config").iterdir()) == []


# (memory before, new offset, increase_only, memory after)
INCREASE_CASES = [
    (None, 5, True, 5),
    (None, 5, False, 5),
    (10, 5, True, 10),
    (10, 10, True, 10),
    (10, 15, True, 15),
    (10, 5, False, 5),
    (10, 0, False, 0),
]


@pytest.mark.parametrize("before, offset, increase_only, after", INCREASE_CASES)
def test_update_offset_increase_only(tmp_path, before, offset, increase_only, after):
    store = GroupOffsetStore(tmp_path, "G")
    mq = MQ("T", "broker-a", 0)
    if before is not None:
        store.update_offset(mq, before)
    store.update_offset(mq, offset, increase_only)
    assert store.read_offset(mq, MEMORY) == after


# (memory, persisted, read type, returned, memory afterwards)
READ_CASES = [
    (7, 9, MEMORY, 7, 7),
    (7, 9, FIRST, 7, 7),
    (7, 9, STORE, 9, 9),
    (None, 9, MEMORY, -1, None),
    (None, 9, FIRST, 9, 9),
    (None, 9, STORE, 9, 9),
    (None, None, MEMORY, -1, None),
    (None, None, FIRST, -1, None),
    (None, None, STORE, -1, None),
    (7, None, STORE, -1, 7),
]


@pytest.mark.parametrize("memory, persisted, read_type, returned, memory_after", READ_CASES)
def test_read_offset_types(tmp_path, memory, persisted, read_type, returned, memory_after):
    mq = MQ("T", "broker-a", 2)
    if persisted is not None:
        writer = GroupOffsetStore(tmp_path, "G")
        writer.update_offset(mq, persisted)
        writer.persist()
    store = GroupOffsetStore(tmp_path, "G")
    if memory is not None:
        store.update_offset(mq, memory)
    assert store.read_offset(mq, read_type) == returned
    assert store.clone_offset_table().get(mq) == memory_after
    many = GroupOffsetStore(tmp_path, "G")
    if memory is not None:
        many.update_offset(mq, memory)
    assert many.read_offsets([mq], read_type) == {mq: returned}


def test_default_read_type_is_memory_first(tmp_path):
    store = GroupOffsetStore(tmp_path, "G")
    store.update_offset(("T", "broker-a", 0), 3)
    store.persist()
    store.update_offset(("T", "broker-a", 0), 4)
    assert store.read_offset(("T", "broker-a", 0)) == 4


def test_persist_subset_remove_and_clone(tmp_path):
    store = GroupOffsetStore(tmp_path, "G")
    a, b, c = MQ("T", "broker-a", 0), MQ("T", "broker-a", 1), MQ("U", "broker-a", 0)
    for mq, offset in ((a, 1), (b, 2), (c, 3)):
        store.update_offset(mq, offset)
    assert store.clone_offset_table("T") == {a: 1, b: 2}
    assert store.clone_offset_table() == store.clone_offset_table(" ") == {a: 1, b: 2, c: 3}
    store.persist([a, MQ("T", "broker-a", 9)])  # a queue without a memory entry is skipped
    assert parse_fastjson(on_disk(store)) == {"offsetTable": {"T@G": {0: 1}}}
    store.remove_offset(b)
    assert store.read_offset(b, MEMORY) == -1
    store.persist()
    assert parse_fastjson(on_disk(store)) == {"offsetTable": {"T@G": {0: 1}, "U@G": {0: 3}}}
    assert store.read_offset(b, STORE) == -1


def test_persist_all_follows_rocketmq(tmp_path):
    store = GroupOffsetStore(tmp_path, "G")
    a, b = MQ("T", "broker-a", 0), MQ("T", "broker-a", 1)
    store.update_offset(a, 1)
    store.update_offset(b, 2)
    store.persist_all(set())          # empty set: nothing at all
    assert not Path(store.file_path("broker-a")).exists() and store.clone_offset_table() == {a: 1, b: 2}
    store.persist_all({a})            # persist a, forget b
    assert store.clone_offset_table() == {a: 1}
    assert parse_fastjson(on_disk(store)) == {"offsetTable": {"T@G": {0: 1}}}
    store.update_offset(b, 5)
    store.persist_all()               # no argument: everything in memory
    assert parse_fastjson(on_disk(store)) == {"offsetTable": {"T@G": {0: 1, 1: 5}}}


@pytest.mark.parametrize("call, message", [
    (lambda s: s.update_offset(MQ("T", "broker-a", 0), -1), "offset must be an integer"),
    (lambda s: s.update_offset(MQ("T", "broker-a", 0), True), "offset must be an integer"),
    (lambda s: s.update_offset(MQ("T", "broker-a", 0), 1.0), "offset must be an integer"),
    (lambda s: s.update_offset("T", 1), "expected a MessageQueue"),
    (lambda s: s.update_offset(("T@x", "broker-a", 0), 1), "not a RocketMQ topic name"),
    (lambda s: s.update_offset(("T", "../b", 0), 1), "cannot name a directory"),
    (lambda s: s.update_offset(("T", "broker-a", -1), 1), "queue id must be >= 0"),
    (lambda s: s.read_offset(("T", "broker-a", 0), "READ_FROM_STORE"), "ReadOffsetType"),
    (lambda s: s.read_offsets([("T", "broker-a", 0)], 3), "ReadOffsetType"),
    (lambda s: GroupOffsetStore(s.path, "bad group"), "invalid consumer group"),
    (lambda s: GroupOffsetStore("", "G"), "non-empty directory path"),
])
def test_bad_arguments(tmp_path, call, message):
    with pytest.raises(RmqOptionError, match=message):
        call(GroupOffsetStore(tmp_path, "G"))


def test_pickle_keeps_memory_table(tmp_path):
    store = GroupOffsetStore(tmp_path, "G", broker_stores={"broker-a": str(tmp_path)})
    store.update_offset(MQ("T", "broker-a", 0), 12)
    copy = pickle.loads(pickle.dumps(store))
    assert copy.read_offset(MQ("T", "broker-a", 0), MEMORY) == 12
    copy.update_offset(MQ("T", "broker-a", 0), 13)
    copy.persist()
    assert store.read_offset(MQ("T", "broker-a", 0), STORE) == 13


def test_lock_held_by_another_process_times_out(tmp_path):
    store = GroupOffsetStore(tmp_path, "G", lock_timeout_s=0.2)
    store.update_offset(MQ("T", "broker-a", 0), 1)
    lock_path = store.file_path("broker-a") + ".lock"
    os.makedirs(os.path.dirname(lock_path))
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import fcntl, sys
            f = open({lock_path!r}, "a")
            fcntl.flock(f, fcntl.LOCK_EX)
            print("locked", flush=True)
            sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RmqOffsetStoreError, match="timed out"):
            store.persist()
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    store.persist()  # released: goes through
    with open(lock_path) as f:  # and the lock is free again
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


CHILD = textwrap.dedent("""
    import os, sys, time
    from rmq_source.group.allocation import MessageQueue
    from rmq_source.group.offset_store import GroupOffsetStore
    path, group, topic, first_qid, rounds, go = sys.argv[1:7]
    while not os.path.exists(go):
        time.sleep(0.001)
    store = GroupOffsetStore(path, group)
    for i in range(int(rounds)):
        mq = MessageQueue(topic, "broker-a", int(first_qid) + i)
        store.update_offset(mq, 1000 + i)
        store.persist([mq])      # only the new queue: a lost update would stay lost
""")


def test_concurrent_processes_lose_no_update(tmp_path):
    rounds = 25
    writers = [("G1", "T", 0), ("G1", "T", 100), ("G2", "T", 0), ("G1", "U", 0)]
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "offs"), group, topic,
                               str(first), str(rounds), str(go)], env=env, stderr=subprocess.PIPE,
                              text=True)
             for group, topic, first in writers]
    go.touch()
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    table = parse_fastjson((tmp_path / "offs" / "broker-a" / OFFSET_FILE_NAME).read_text())["offsetTable"]
    expected: dict[str, dict[int, int]] = {}
    for group, topic, first in writers:
        expected.setdefault(f"{topic}@{group}", {}).update({first + i: 1000 + i for i in range(rounds)})
    assert table == expected
