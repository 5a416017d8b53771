"""The consumer group's state folder (``offsetStorePath``) may be shared with other users: nothing
in it is ever opened, written or created through a symlink (issue 14, item 2).

Each case plants a symlink, pointing outside the folder, where one of the group's state files,
lock files, folders or temporary files goes, runs the real operation, and checks that the link was
refused with the file's error class naming it (or, for a temporary name, simply not used) and that
the file the link points at is byte for byte what it was.
"""
from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

import rmq_source.group.session as group_session
from rmq_source.group.allocation import MessageQueue
from rmq_source.store.config_files import dump_fastjson
from rmq_source.errors import RmqLockError, RmqOffsetStoreError
from rmq_source.group.membership import GroupMembership
from rmq_source.group.session import GroupSession
from rmq_source.group.locks import QueueLockManager, read_history
from rmq_source.group.offset_store import GroupOffsetStore, ReadOffsetType

G = "GID_shared"
MQ = MessageQueue("T", "broker-a", 0)
OFFSETS = "broker-a/consumerOffset.json"

# What the planted links point at: content each reader would accept, so that a reader following the
# link would go on and write (the strongest temptation).
VICTIM = {
    "locks": {"version": 1, "group": G, "locks": {}},
    "members": {"version": 1, "group": G, "clients": {}},
    "offsets": {"offsetTable": {f"T@{G}": {0: 5}}},
}


def _locks(state: Path) -> None:
    # every second change rotates the history (one record is over 100 bytes)
    QueueLockManager(state, G, history_max_bytes=100).try_lock_batch([("T", "broker-a", 0)], "A")


def _history(state: Path) -> None:
    read_history(state, G)


def _members(state: Path) -> None:
    GroupMembership(state, G, "A").heartbeat()


def _session(state: Path) -> GroupSession:
    opts = SimpleNamespace(consumer_group=G, client_id="A", offset_store_path=str(state), orderly=True,
                           lock_lease_ms=60_000, client_lock_lease_ms=30_000,
                           allocate_strategy="AVG", subscription=SimpleNamespace(expression="*"),
                           nearby_inner_strategy=None, virtual_node_count=None, topics=("T",),
                           topic_pattern=None, assign=None)
    return GroupSession(opts, strategy=None, group_store=None)


def _plan(state: Path) -> None:
    _session(state).record_plan({"T": {"broker-a": {"0": 0}}}, {"T": {"broker-a": {"0": 1}}}, {MQ})


def _plans_read(state: Path) -> None:
    _session(state).find_plan({"T": {"broker-a": {"0": 0}}}, {"T": {"broker-a": {"0": 1}}})


_next_offset = itertools.count(7)


def _commit(state: Path) -> None:
    store = GroupOffsetStore(state, G)
    store.update_offset(MQ, next(_next_offset))  # a new value, so that the file is written
    store.persist()


def _read_offsets(state: Path) -> None:
    GroupOffsetStore(state, G).read_offsets([MQ], ReadOffsetType.READ_FROM_STORE)


# name: (state written before the link is planted, planted path, victim kind, operation,
#        expected error class or None when the link must simply be left alone)
CASES = {
    "locks file": (None, f"{G}.locks.json", "locks", _locks, RmqLockError),
    "locks .flock": (None, f"{G}.locks.json.flock", "text", _locks, RmqLockError),
    "locks <file>.tmp": (_locks, f"{G}.locks.json.tmp", "text", _locks, None),
    "lock history": (None, f"{G}.lock-history.jsonl", "text", _locks, RmqLockError),
    "lock history read": (_locks, f"{G}.lock-history.jsonl.1", "text", _history, RmqLockError),
    "lock history rotated to .1": (lambda s: [_locks(s) for _ in range(2)],
                                   f"{G}.lock-history.jsonl.1", "text", _locks, RmqLockError),
    "members file": (None, f"{G}.members.json", "members", _members, RmqLockError),
    "members .flock": (None, f"{G}.members.json.flock", "text", _members, RmqLockError),
    "members <file>.tmp": (_members, f"{G}.members.json.tmp", "text", _members, None),
    "plans file": (None, f"{G}.plans.jsonl", "text", _plan, RmqLockError),
    "plans file read": (None, f"{G}.plans.jsonl", "text", _plans_read, RmqLockError),
    "plans .flock": (None, f"{G}.plans.jsonl.flock", "text", _plan, RmqLockError),
    "plans <file>.tmp (compaction)": (_plan, f"{G}.plans.jsonl.tmp", "text", _plan, None),
    "offsets <brokerName> folder": (None, "broker-a", "folder", _commit, RmqOffsetStoreError),
    "offsets <brokerName> folder read": (None, "broker-a", "folder", _read_offsets,
                                         RmqOffsetStoreError),
    "offsets file": (None, OFFSETS, "offsets", _commit, RmqOffsetStoreError),
    "offsets file read": (None, OFFSETS, "offsets", _read_offsets, RmqOffsetStoreError),
    "offsets .lock": (None, OFFSETS + ".lock", "text", _commit, RmqOffsetStoreError),
    "offsets .bak": (_commit, OFFSETS + ".bak", "offsets", _commit, RmqOffsetStoreError),
    "offsets <file>.tmp read": (None, OFFSETS + ".tmp", "offsets", _read_offsets,
                                RmqOffsetStoreError),
}


def _victim(outside: Path, kind: str) -> Path:
    if kind == "folder":
        victim = outside / "victim-folder"
        victim.mkdir()
        (victim / "consumerOffset.json").write_text(dump_fastjson(VICTIM["offsets"]))
        return victim
    victim = outside / "victim"
    if kind == "text":
        victim.write_bytes(b"precious bytes of a file the link points at\n")
    elif kind == "offsets":
        victim.write_text(dump_fastjson(VICTIM["offsets"]))
    else:
        victim.write_text(json.dumps(VICTIM[kind]))
    return victim


def _snapshot(path: Path) -> dict[str, bytes]:
    if path.is_dir():
        return {p.name: p.read_bytes() for p in sorted(path.iterdir())}
    return {path.name: path.read_bytes()}


@pytest.fixture(autouse=True)
def _compact_every_plan(monkeypatch):
    monkeypatch.setattr(group_session, "_PLANS_COMPACT_BYTES", 0)  # so record_plan rewrites the file


@pytest.mark.parametrize("before, planted, kind, operation, error",
                         CASES.values(), ids=CASES.keys())
def test_a_planted_symlink_is_never_followed(tmp_path, before, planted, kind, operation, error):
    state, outside = tmp_path / "state", tmp_path / "outside"
    state.mkdir()
    outside.mkdir()
    if before is not None:
        before(state)
    victim = _victim(outside, kind)
    original = _snapshot(victim)
    link = state / planted
    link.parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(victim, link)

    if error is None:
        operation(state)
    else:
        with pytest.raises(error, match="symlink") as info:
            operation(state)
        assert str(link) in str(info.value) and str(victim) in str(info.value)
    assert _snapshot(victim) == original
    assert link.is_symlink() and os.readlink(link) == str(victim)


@pytest.mark.parametrize("operation, name", [(_plan, f"{G}.plans.jsonl"),
                                             (_locks, f"{G}.lock-history.jsonl")],
                         ids=["plans", "lock history"])
def test_a_log_hard_linked_to_another_file_is_not_appended_to(tmp_path, operation, name):
    """Logs are the only files written in place: a second name of another file is refused too."""
    state, victim = tmp_path / "state", tmp_path / "victim"
    state.mkdir()
    victim.write_bytes(b"precious\n")
    os.link(victim, state / name)
    with pytest.raises(RmqLockError, match="hard links") as info:
        operation(state)
    assert str(state / name) in str(info.value)
    assert victim.read_bytes() == b"precious\n"


# -- temporary files: new, unpredictable names, created exclusively without following links ----

def _members_twice(state: Path) -> None:
    m = GroupMembership(state, G, "A")
    m.heartbeat()
    m.leave()


def _commit_twice(state: Path) -> None:
    for _ in range(2):
        _commit(state)


WRITERS = {
    "locks": (lambda s: [QueueLockManager(s, G, history=False).try_lock_batch([("T", "b", i)], "A")
                         for i in range(2)], f"{G}.locks.json"),
    "members": (_members_twice, f"{G}.members.json"),
    "plans compaction": (lambda s: [_plan(s) for _ in range(2)], f"{G}.plans.jsonl"),
    "offsets": (_commit_twice, "consumerOffset.json"),
}


@pytest.mark.parametrize("write, name", WRITERS.values(), ids=WRITERS.keys())
def test_temporary_files_have_new_unpredictable_names(tmp_path, monkeypatch, write, name):
    """Also: offsetStorePath itself may be a symlink (the user's choice, e.g. another disk); only
    what is below it must be real files and folders."""
    disk2 = tmp_path / "disk2"
    disk2.mkdir()
    state = tmp_path / "state"
    os.symlink(disk2, state)
    created = []
    real_open = os.open

    def spy(path, flags, *args, **kwargs):
        if flags & os.O_CREAT and os.fspath(path).endswith(".tmp"):
            created.append((os.path.basename(os.fspath(path)), flags))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    write(state)
    temps = [t for t, _ in created if t.startswith(f".{name}.")]
    assert len(temps) >= 2 and len(set(temps)) == len(temps), created
    assert f"{name}.tmp" not in {t for t, _ in created}
    exclusive = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    assert all(flags & exclusive == exclusive for _, flags in created), created
    assert not [n for _, _, names in os.walk(disk2) for n in names if n.endswith(".tmp")]
