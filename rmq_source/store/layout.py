"""Which layout a broker wrote its store in, told from the folders of its root.

* **default**: the CommitLog in ``commitlog/``, one 20-byte-unit file queue per queue in
  ``consumequeue/<topic>/<queueId>/``.
* **DLedger** (``enableDLegerCommitLog=true``, 4.5 and later): the CommitLog address space is that
  of the DLedger data files ``dledger-<selfId>/data/``, each record the body of a DLedger entry
  (``native/rmq_layout.h``); the consume queues are the default ones and point at the records. A
  broker switched to DLedger over an existing store keeps its old ``commitlog/`` files below the
  first DLedger file (RocketMQ's ``dividedCommitlogOffset``): both are one address space.

* **RocksDB consume queues** (5.x ``storeType=defaultRocksDB``): ``consumequeue/`` is one RocksDB
  database (:mod:`rmq_source.store.rocksdb_queues`); the CommitLog is the default one.

The broker dispatches to its consume queues only what its DLedger group committed (the reput
stops at the committed position), so a reader that goes through the consume queues, as store
mode does, never reads an entry the group has not committed.

A layout store mode does not read is named, never mistaken for a missing topic: BatchCQ topics
(``batchconsumequeue/<topic>/``, or ``queue.type=BatchCQ`` in the topic's attributes).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from rmq_source.errors import RmqStoreLayoutError

DLEDGER_PREFIX = "dledger-"
LIVE_MODE = "read it in live mode instead (option namesrvAddr: the broker serves every layout)"
_ROCKSDB_MARKERS = ("CURRENT", "IDENTITY")


@dataclass(frozen=True)
class Layout:
    """Where one store root keeps its CommitLog.

    ``commitlog_dir``: the default layout's ``commitlog/`` (also the lower part of a DLedger
    store that a default store was switched from; it may be absent in a DLedger store).
    ``dledger_dir``: ``dledger-<selfId>/`` of a DLedger store, None for the default layout.
    ``rocksdb_cq``: the consume queues are a RocksDB database (``storeType=defaultRocksDB``).
    """

    root: str
    commitlog_dir: str
    dledger_dir: str | None = None
    rocksdb_cq: bool = False

    @property
    def name(self) -> str:
        log = "default" if self.dledger_dir is None else \
            f"DLedger ({os.path.basename(self.dledger_dir)}/)"
        return log + (", RocksDB consume queues" if self.rocksdb_cq else "")

    @property
    def dledger_data(self) -> str | None:
        return None if self.dledger_dir is None else os.path.join(self.dledger_dir, "data")

    def commitlog_dirs(self) -> tuple[str, ...]:
        """The folders of the CommitLog address space, lowest addresses first."""
        if self.dledger_dir is None:
            return (self.commitlog_dir,)
        return (self.commitlog_dir, self.dledger_data)

    def present(self) -> bool:
        """Whether the folder that makes this a store root still exists."""
        return os.path.isdir(self.dledger_data or self.commitlog_dir)

    def missing_text(self) -> str:
        return f"{os.path.basename(self.dledger_dir)}/data/" if self.dledger_dir else "commitlog/"


EXPECTED = ("expected the broker's storePathRootDir (holding commitlog/ or dledger-<selfId>/data/, "
            "consumequeue/, config/)")


def detect(root: str) -> Layout:
    """The layout of the store at ``root`` (an existing directory); RmqStoreLayoutError for a
    root that is no store and for several DLedger folders."""
    rocksdb = is_rocksdb_cq(root)
    dledgers = sorted(n for n in _names(root)
                      if n.startswith(DLEDGER_PREFIX) and os.path.isdir(os.path.join(root, n, "data")))
    commitlog = os.path.join(root, "commitlog")
    if len(dledgers) > 1:
        raise RmqStoreLayoutError(
            f"store root {root!r} holds the DLedger CommitLogs of several peers ({', '.join(dledgers)}); "
            "a broker writes one (dledger-<dLegerSelfId>): point the store path at a root holding one")
    if dledgers:
        return Layout(root, commitlog, os.path.join(root, dledgers[0]), rocksdb)
    elsewhere = sorted(n for n in _names(root) if n.startswith(DLEDGER_PREFIX)
                       and os.path.isfile(os.path.join(root, n, "checkpoint")))
    if elsewhere and not os.path.isdir(commitlog):
        raise RmqStoreLayoutError(
            f"store root {root!r} holds the DLedger state {elsewhere[0]}/ without its data/ folder: "
            "a broker with storePathDLedgerCommitLog keeps its DLedger CommitLog elsewhere, which "
            "store mode does not follow; point the store path at a root holding "
            f"{elsewhere[0]}/data/, or read the broker in live mode (option namesrvAddr)")
    if not os.path.isdir(commitlog):
        raise RmqStoreLayoutError(f"store root {root!r} has no commitlog/ folder; {EXPECTED}")
    return Layout(root, commitlog, None, rocksdb)


def is_rocksdb_cq(root: str) -> bool:
    """Whether ``consumequeue/`` is a RocksDB database (RocketMQ 5.x ``storeType=defaultRocksDB``)."""
    cq = os.path.join(root, "consumequeue")
    return any(os.path.isfile(os.path.join(cq, n)) for n in _ROCKSDB_MARKERS)


def refuse_other_layouts(root) -> None:
    """The writer writes the default layout only: a DLedger or RocksDB store is not appended to
    (a ``commitlog/`` beside ``dledger-*/`` would shadow the DLedger records)."""
    root = os.fspath(root)
    if not os.path.isdir(root):
        return
    if is_rocksdb_cq(root):
        raise RmqStoreLayoutError(
            f"store root {root!r} keeps its consume queues in a RocksDB database (a broker with "
            "storeType=defaultRocksDB); the writer writes file consume queues only and does not "
            "append to it")
    dledgers = sorted(n for n in _names(root) if n.startswith(DLEDGER_PREFIX))
    if dledgers:
        raise RmqStoreLayoutError(
            f"store root {root!r} holds a DLedger CommitLog ({', '.join(dledgers)}); the writer "
            "writes the default layout (commitlog/) only and does not append to it")


def check_topic_queue_type(root: str, topic: str, conf: dict | None) -> None:
    """A BatchCQ topic (5.x ``queue.type=BatchCQ``): said, naming it, rather than read as empty."""
    attrs = (conf or {}).get("attributes") or {}
    batch_dir = os.path.join(root, "batchconsumequeue", topic)
    if str(attrs.get("queue.type", "")).lower() == "batchcq" or os.path.isdir(batch_dir):
        raise RmqStoreLayoutError(
            f"topic {topic!r} of store {root!r} is a BatchCQ topic (queue.type=BatchCQ, its consume "
            f"queues in batchconsumequeue/{topic}/ as 46-byte units); store mode reads SimpleCQ "
            f"topics only: {LIVE_MODE}")


def _names(root: str) -> list[str]:
    try:
        return os.listdir(root)
    except FileNotFoundError:
        return []
