"""A consumer group's committed offsets, kept the way RocketMQ's RemoteBrokerOffsetStore keeps them.

An offset here is always the **next queue offset to consume** (format doc §10.2), per
:class:`~rmq_source.group.allocation.MessageQueue` ``(topic, broker_name, queue_id)``.

:class:`GroupOffsetStore` holds an in-memory table (what the query has consumed) and a persistent
store with one file per broker::

    <offsetStorePath>/<brokerName>/consumerOffset.json        {"offsetTable":{"topic@group":{0:317,...}}}

in the broker's own ``consumerOffset.json`` shape (fastjson, bare integer queue-id keys, §10.1), so
RocketMQ tooling can read it and the file can be copied into a broker's ``config/`` by hand. Files
are replaced atomically (temp file, fsync, rename; the previous version kept as ``.bak``) by
:func:`~rmq_source.store.config_files.write_config_atomic`, and loaded with the ``.bak`` fallback. Every
read-modify-write holds an exclusive ``fcntl.flock`` on the sidecar ``consumerOffset.json.lock``, so
several processes committing different groups, topics or queues never lose each other's updates
(two commits of the same queue: the last one wins, as on a broker). Reads take no lock: a file is
only ever replaced whole.

``offsetStorePath`` itself is the user's choice and may be a symlink; below it nothing is ever
opened through one (the ``<brokerName>`` folder, the file, its ``.bak``, ``.tmp`` and ``.lock``):
the folder may be shared by every query of the group, and a planted link could make us overwrite
any file our user can write. A link is refused with :class:`~rmq_source.errors.RmqOffsetStoreError`
naming it; temporary files get unpredictable names and exclusive, no-follow creates.

Group progress is read from that store first and, for queues it has no entry for, from the
broker's own ``<storeRoot>/config/consumerOffset.json`` (``broker_stores``), so a Spark query can
take over a group that Java consumers ran. The broker's file is only ever read, never written.

``read_offset`` return conventions (RocketMQ's ``readOffset``):

* ``>= 0`` (or whatever was committed): the offset;
* ``-1``: no offset — ``READ_FROM_MEMORY`` with nothing in memory, or no entry in either store;
* RocketMQ's ``-2`` ("store error") and ``-3`` (bad argument) are not used: an unreadable store
  raises :class:`~rmq_source.errors.RmqOffsetStoreError` (I/O) or
  :class:`~rmq_source.errors.RmqConfigFileError` (content, naming the files), and a bad queue or
  read type raises :class:`~rmq_source.errors.RmqOptionError`, because a silent ``-2`` would make a
  caller fall back to ``consumeFromWhere`` and re-read or skip messages.
"""
from __future__ import annotations

import abc
import contextlib
import enum
import os
import re
import threading
from typing import Any, Iterable, Mapping

from rmq_source.group.allocation import MessageQueue
from rmq_source.store.config_files import (TOPIC_GROUP_SEPARATOR, check_group_offset, dump_fastjson,
                                           load_config_json, read_consumer_offsets, write_config_atomic)
from rmq_source import nofollow
from rmq_source.errors import RmqConfigFileError, RmqOffsetStoreError, RmqOptionError, RmqSourceError
from rmq_source.group.statefile import check_group, file_lock

__all__ = ["OffsetTable", "GroupOffsetStore", "ReadOffsetType", "OFFSET_FILE_NAME", "BROKER_NAME_RE",
           "check_offset_store_path", "DEFAULT_OFFSET_STORE_DIRNAME", "default_offset_store_path"]

DEFAULT_OFFSET_STORE_DIRNAME = "rmq_source_offsets"

OFFSET_FILE_NAME = "consumerOffset.json"
LOCK_SUFFIX = ".lock"
NO_OFFSET = -1
_INT64_MAX = (1 << 63) - 1
_TOPIC_RE = re.compile(r"[%|a-zA-Z0-9_-]+")
# A broker name becomes a directory name: no separators, not "." or "..".
BROKER_NAME_RE = re.compile(r"[A-Za-z0-9_%|@-][A-Za-z0-9_%|@.-]*")


class ReadOffsetType(enum.Enum):
    """Where :meth:`GroupOffsetStore.read_offset` looks (RocketMQ's ``ReadOffsetType``)."""

    READ_FROM_MEMORY = "READ_FROM_MEMORY"
    READ_FROM_STORE = "READ_FROM_STORE"
    MEMORY_FIRST_THEN_STORE = "MEMORY_FIRST_THEN_STORE"


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def default_offset_store_path(broker_stores: Mapping[str, str]) -> str:
    """Where group state lives when ``offsetStorePath`` is not given: beside the first store."""
    return os.path.join(next(iter(broker_stores.values())), DEFAULT_OFFSET_STORE_DIRNAME)


def default_group_state_path(namesrv_addrs: Iterable[str]) -> str:
    """Where a live-mode streaming query keeps its group's batch plans when ``groupStatePath`` is
    not given: ``$XDG_CACHE_HOME/rmq_source/groups/<NameServers>`` (``~/.cache`` without it), on
    the driver; one folder per cluster, so groups of the same name in two clusters stay apart."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    cluster = re.sub(r"[^A-Za-z0-9_.-]", "_", "+".join(namesrv_addrs))
    return os.path.join(cache, "rmq_source", "groups", cluster)


def check_offset_store_path(path: str, broker_stores: Mapping[str, str],
                            broker_names: Iterable[str]) -> None:
    """Raise :class:`RmqOptionError` (naming offsetStorePath) when the offset files of any broker in
    ``broker_names`` would land inside the ``config/`` folder of any store in ``broker_stores`` —
    that folder and its ``consumerOffset.json`` belong to the broker."""
    for root in broker_stores.values():
        config_dir = os.path.realpath(os.path.join(root, "config"))
        for broker in broker_names:
            target = os.path.realpath(os.path.join(path, broker))
            if _inside(target, config_dir):
                raise RmqOptionError(
                    f"option offsetStorePath: invalid value {path!r}; the offsets of broker "
                    f"{broker!r} would be written into {target}, inside the broker's config folder "
                    f"{config_dir}; choose a directory outside every broker's config/")


#: (topic, broker name) pairs :func:`_queue` found valid (a planning checks every queue each batch)
_VALID_NAMES: set[tuple[str, str]] = set()


def _queue(mq: Any) -> MessageQueue:
    if type(mq) is MessageQueue and (mq.topic, mq.broker_name) in _VALID_NAMES and mq.queue_id >= 0:
        return mq
    if isinstance(mq, (tuple, list)) and len(mq) == 3:
        mq = MessageQueue(*mq)
    if not isinstance(mq, MessageQueue):
        raise RmqOptionError(f"expected a MessageQueue or (topic, broker_name, queue_id), got {mq!r}")
    if not _TOPIC_RE.fullmatch(mq.topic):
        raise RmqOptionError(f"{mq}: topic {mq.topic!r} is not a RocketMQ topic name "
                             "(characters [%|a-zA-Z0-9_-])")
    if not BROKER_NAME_RE.fullmatch(mq.broker_name):
        raise RmqOptionError(f"{mq}: broker name {mq.broker_name!r} cannot name a directory "
                             "(characters [A-Za-z0-9_%|@.-], not starting with '.')")
    if mq.queue_id < 0:
        raise RmqOptionError(f"{mq}: queue id must be >= 0")
    if len(_VALID_NAMES) < 1 << 16:
        _VALID_NAMES.add((mq.topic, mq.broker_name))
    return mq


def _offset_value(offset: Any) -> int:
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= _INT64_MAX:
        raise RmqOptionError(f"offset must be an integer in [0, {_INT64_MAX}] (the next queue offset "
                             f"to consume), got {offset!r}")
    return offset


class OffsetTable(abc.ABC):
    """RocketMQ's OffsetStore API over an in-memory table of group ``group``'s offsets; where they
    persist is the subclass's: :meth:`_fetch` reads them, :meth:`_write_broker` writes one broker's.
    Thread-safe; picklable (the memory table travels, the thread lock is recreated)."""

    def __init__(self, group: str):
        self.group = check_group(group)
        self._table: dict[MessageQueue, int] = {}
        self._mutex = threading.Lock()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_mutex"]
        with self._mutex:
            state["_table"] = dict(self._table)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._mutex = threading.Lock()

    @abc.abstractmethod
    def _fetch(self, mqs: list[MessageQueue], zero_will_do=None,
               away: set[str] | None = None) -> dict[MessageQueue, int]:
        """Persisted offsets of ``mqs``; queues without one are left out. For a queue where
        ``zero_will_do(mq)`` is true, 0 may stand for "no offset" (see :meth:`read_offsets`).
        ``away``: see :meth:`read_offsets`."""

    @abc.abstractmethod
    def _write_broker(self, broker: str, entries: Mapping[MessageQueue, int]) -> set[MessageQueue] | None:
        """Persist ``entries`` (all of queues of ``broker``); returns the queues whose entry the
        keeper declined because an operator's reset of theirs is pending there (see
        :meth:`persist`)."""

    @contextlib.contextmanager
    def one_look(self):
        """Within it, questions about many queues may be answered from one look at where the
        offsets persist (taken at the first question, with this store's own writes since laid
        over it): a planning asks twice about the same thousands of queues. Nothing here."""
        yield

    def may_have_lost(self, broker: str, written_ms: int) -> bool:
        """Whether what this store wrote for ``broker`` at ``written_ms`` (ms since the epoch) may
        be gone from where it persists without anyone writing over it: a broker that restarted or
        failed over since forgets offsets it had not flushed. Files written here never do."""
        return False

    # -- RocketMQ OffsetStore API --------------------------------------------------------------

    def read_offset(self, mq: Any,
                    read_type: ReadOffsetType = ReadOffsetType.MEMORY_FIRST_THEN_STORE) -> int:
        """The next offset to consume of ``mq``, or -1 when none is known (see module docstring).

        ``READ_FROM_MEMORY``: the memory table only. ``READ_FROM_STORE``: the files (ours, then the
        broker's); a value found there also replaces the memory entry; nothing found leaves memory
        alone. ``MEMORY_FIRST_THEN_STORE``: memory, else as ``READ_FROM_STORE``.
        """
        mq = _queue(mq)
        if not isinstance(read_type, ReadOffsetType):
            raise RmqOptionError(f"read_type must be a ReadOffsetType "
                                 f"({', '.join(t.name for t in ReadOffsetType)}), got {read_type!r}")
        if read_type is not ReadOffsetType.READ_FROM_STORE:
            with self._mutex:
                offset = self._table.get(mq)
            if offset is not None:
                return offset
            if read_type is ReadOffsetType.READ_FROM_MEMORY:
                return NO_OFFSET
        found = self._fetch([mq])
        if mq not in found:
            return NO_OFFSET
        self._set(mq, found[mq], increase_only=False)
        return found[mq]

    def read_offsets(self, mqs: Iterable[Any],
                     read_type: ReadOffsetType = ReadOffsetType.MEMORY_FIRST_THEN_STORE,
                     zero_will_do=None, away: set[str] | None = None) -> dict[MessageQueue, int]:
        """:meth:`read_offset` for many queues, reading each broker's files once.

        ``zero_will_do(mq)``: true for the queues where the caller would do the same with offset
        0 as with no offset (-1). A broker answers a thousand queues' offsets in one request but
        says 0 for both (:func:`rmq_source.remote.requests.consume_stats`); only the queues where
        the difference matters are then asked one by one. Such a 0 may be -1 in truth, so it is
        not kept in the memory table.

        ``away``: a set; a broker that cannot be reached (connection refused or lost, no answer
        in time) is added to it and its queues are left out of the answer (-1), the other
        brokers' answers are kept. Without it such a broker's error is raised."""
        queues = [_queue(mq) for mq in mqs]
        if not isinstance(read_type, ReadOffsetType):
            raise RmqOptionError(f"read_type must be a ReadOffsetType, got {read_type!r}")
        out: dict[MessageQueue, int] = {}
        wanted = queues
        if read_type is not ReadOffsetType.READ_FROM_STORE:
            with self._mutex:
                for mq in queues:
                    if mq in self._table:
                        out[mq] = self._table[mq]
            wanted = [mq for mq in queues if mq not in out]
            if read_type is ReadOffsetType.READ_FROM_MEMORY:
                return {mq: out.get(mq, NO_OFFSET) for mq in queues}
        found = self._fetch(wanted, zero_will_do, away) if wanted else {}
        kept = found if zero_will_do is None else {
            mq: offset for mq, offset in found.items() if offset or not zero_will_do(mq)}
        with self._mutex:
            self._table.update(kept)
        out.update(found)
        return {mq: out.get(mq, NO_OFFSET) for mq in queues}

    def update_offset(self, mq: Any, offset: int, increase_only: bool = False) -> None:
        """Set the memory entry of ``mq`` to ``offset`` (not persisted until :meth:`persist`).

        With ``increase_only`` an existing entry only moves forward (a smaller ``offset`` is
        ignored); an absent entry is always set. Offsets must be in [0, 2**63-1].
        """
        self._set(_queue(mq), _offset_value(offset), increase_only)

    def _set(self, mq: MessageQueue, offset: int, increase_only: bool) -> None:
        with self._mutex:
            current = self._table.get(mq)
            if current is None or not increase_only or offset > current:
                self._table[mq] = offset

    def remove_offset(self, mq: Any) -> None:
        """Forget ``mq`` in memory (its persisted offset stays)."""
        mq = _queue(mq)
        with self._mutex:
            self._table.pop(mq, None)

    def clone_offset_table(self, topic: str | None = None) -> dict[MessageQueue, int]:
        """A copy of the memory table, only ``topic``'s queues unless ``topic`` is None or blank."""
        with self._mutex:
            items = list(self._table.items())
        if topic is None or not topic.strip():
            return dict(items)
        return {mq: offset for mq, offset in items if mq.topic == topic}

    def persist(self, mqs: Iterable[Any] | None = None) -> set[MessageQueue]:
        """Write the memory entries of ``mqs`` (default: every entry) where they persist.

        Queues without a memory entry are skipped. One locked read-modify-write per broker file:
        entries of other groups, topics and queues in the file are kept as they are.

        Returns the queues whose entry was declined because an operator's reset of the queue is
        pending where it persists (a RocketMQ 5 broker resetting on the server side keeps the
        reset until the group pulls the queue, and ignores commits meanwhile); empty otherwise.
        """
        with self._mutex:
            if mqs is None:
                entries = dict(self._table)
            else:
                wanted = {_queue(mq) for mq in mqs}
                entries = {mq: self._table[mq] for mq in wanted if mq in self._table}
        by_broker: dict[str, dict[MessageQueue, int]] = {}
        for mq, offset in entries.items():
            by_broker.setdefault(mq.broker_name, {})[mq] = offset
        declined: set[MessageQueue] = set()
        for broker in sorted(by_broker):
            declined |= self._write_broker(broker, by_broker[broker]) or set()
        return declined

    def persist_all(self, mqs: Iterable[Any] | None = None) -> None:
        """Persist every memory entry (``mqs`` None), or RocketMQ's ``persistAll(mqs)``: persist the
        entries of ``mqs`` and drop every other queue from memory; an empty ``mqs`` does nothing."""
        if mqs is None:
            self.persist(None)
            return
        keep = {_queue(mq) for mq in mqs}
        if not keep:
            return
        self.persist(keep)
        with self._mutex:
            for mq in [mq for mq in self._table if mq not in keep]:
                del self._table[mq]


class GroupOffsetStore(OffsetTable):
    """Offsets of consumer group ``group``: memory table + one file per broker under ``path``.

    ``broker_stores`` maps broker names to store roots whose ``config/consumerOffset.json`` is the
    read-only fallback. ``lock_timeout_s`` bounds the wait for another process's file lock
    (``None`` = forever); on timeout :class:`RmqOffsetStoreError` is raised. Thread-safe; picklable
    (the memory table travels, the thread lock is recreated).
    """

    def __init__(self, path: str | os.PathLike, group: str, *,
                 broker_stores: Mapping[str, str] | None = None, lock_timeout_s: float | None = 60.0):
        path = os.fspath(path)
        if not isinstance(path, str) or not path:
            raise RmqOptionError(f"offset store path must be a non-empty directory path, got {path!r}")
        super().__init__(group)
        self.path = os.path.abspath(path)
        self.broker_stores = {name: os.path.abspath(os.fspath(root))
                              for name, root in (broker_stores or {}).items()}
        check_offset_store_path(self.path, self.broker_stores, self.broker_stores)
        self.lock_timeout_s = lock_timeout_s

    def __repr__(self) -> str:
        return f"GroupOffsetStore(path={self.path!r}, group={self.group!r})"

    # -- files ---------------------------------------------------------------------------------

    def file_path(self, broker_name: str) -> str:
        """``<path>/<broker_name>/consumerOffset.json`` (checked to be outside every broker's config/)."""
        if not isinstance(broker_name, str) or not BROKER_NAME_RE.fullmatch(broker_name):
            raise RmqOptionError(f"broker name {broker_name!r} cannot name a directory "
                                 "(characters [A-Za-z0-9_%|@.-], not starting with '.')")
        check_offset_store_path(self.path, self.broker_stores, [broker_name])
        return os.path.join(self.path, broker_name, OFFSET_FILE_NAME)

    @staticmethod
    def _table_of(data: Any, path: str) -> dict:
        """The ``offsetTable`` object of loaded file content (``{}`` for an absent file)."""
        if data is None:
            return {}
        if not isinstance(data, dict) or not isinstance(data.get("offsetTable", {}), dict):
            raise RmqConfigFileError(f"{path}: expected {{\"offsetTable\":{{\"topic@group\":"
                                     "{queueId:offset}}}}")
        return data.get("offsetTable", {})

    def _load_own(self, broker_name: str) -> tuple[str, Any]:
        path = self.file_path(broker_name)
        try:
            return path, load_config_json(path, root=self.path, error_cls=RmqOffsetStoreError)
        except RmqSourceError:
            raise
        except OSError as exc:
            raise RmqOffsetStoreError(f"cannot read offset store file {path}: {exc}") from exc

    def _own_offsets(self, broker_name: str, topics: Iterable[str]) -> dict[tuple[str, int], int]:
        """{(topic, queue_id): offset} of this group in our file for ``broker_name``."""
        path, data = self._load_own(broker_name)
        table = self._table_of(data, path)
        out: dict[tuple[str, int], int] = {}
        for topic in set(topics):
            entry = table.get(f"{topic}{TOPIC_GROUP_SEPARATOR}{self.group}")
            if entry is None:
                continue
            for qid, offset in self._entry_items(entry, path, topic).items():
                out[(topic, qid)] = offset
        return out

    def _entry_items(self, entry: Any, path: str, topic: str) -> dict[int, int]:
        if not isinstance(entry, dict):
            raise RmqConfigFileError(f"{path}: offsets of '{topic}@{self.group}' are not an object")
        items: dict[int, int] = {}
        for qid, offset in entry.items():
            if isinstance(qid, str) and qid.isascii() and qid.isdigit():
                qid = int(qid)  # tolerate a quoted key written by another JSON tool
            if (isinstance(qid, bool) or not isinstance(qid, int) or isinstance(offset, bool)
                    or not isinstance(offset, int)):
                raise RmqConfigFileError(f"{path}: '{topic}@{self.group}' has entry {qid!r}: "
                                         f"{offset!r}; expected integer queue id and offset")
            items[qid] = check_group_offset(offset, path, f"{topic}@{self.group}", qid)
        return items

    def _broker_offsets(self, broker_name: str) -> dict[tuple[str, int], int]:
        """{(topic, queue_id): offset} of this group in the broker's own consumerOffset.json."""
        root = self.broker_stores.get(broker_name)
        if root is None:
            return {}
        try:
            table = read_consumer_offsets(root)
        except RmqConfigFileError:
            raise
        except OSError as exc:
            raise RmqOffsetStoreError(f"cannot read {root}/config/{OFFSET_FILE_NAME}: {exc}") from exc
        return {(topic, qid): offset for (topic, group), queues in table.items()
                if group == self.group for qid, offset in queues.items()}

    def _fetch(self, mqs: list[MessageQueue], zero_will_do=None,
               away: set[str] | None = None) -> dict[MessageQueue, int]:
        """Offsets found in the stores (ours first, then the broker's); absent queues left out.
        (Files are never away.)"""
        found: dict[MessageQueue, int] = {}
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            by_broker.setdefault(mq.broker_name, []).append(mq)
        for broker, queues in by_broker.items():
            own = self._own_offsets(broker, (mq.topic for mq in queues))
            missing = [mq for mq in queues if (mq.topic, mq.queue_id) not in own]
            fallback = self._broker_offsets(broker) if missing else {}
            for mq in queues:
                key = (mq.topic, mq.queue_id)
                if key in own:
                    found[mq] = own[key]
                elif key in fallback:
                    found[mq] = fallback[key]
        return found

    def _write_broker(self, broker: str, entries: Mapping[MessageQueue, int]) -> None:
        path = self.file_path(broker)
        directory = os.path.dirname(path)
        try:
            nofollow.ensure_folder(directory, root=self.path, error_cls=RmqOffsetStoreError)
        except RmqSourceError:
            raise
        except OSError as exc:
            raise RmqOffsetStoreError(f"cannot create offset store directory {directory}: {exc}") from exc
        with file_lock(path + LOCK_SUFFIX, exclusive=True, timeout_s=self.lock_timeout_s,
                       error_cls=RmqOffsetStoreError, root=self.path):
            _, data = self._load_own(broker)
            if data is None:
                data = {"offsetTable": {}}
            table = self._table_of(data, path)
            data["offsetTable"] = table
            changed = False
            by_topic: dict[str, dict[int, int]] = {}
            for mq, offset in entries.items():
                by_topic.setdefault(mq.topic, {})[mq.queue_id] = offset
            for topic, offsets in by_topic.items():
                key = f"{topic}{TOPIC_GROUP_SEPARATOR}{self.group}"
                current = self._entry_items(table.get(key, {}), path, topic)
                merged = dict(current)
                merged.update(offsets)
                if merged != current or key not in table:
                    changed = True
                table[key] = dict(sorted(merged.items()))
            if not changed:
                return
            try:
                write_config_atomic(path, dump_fastjson(data), root=self.path,
                                    error_cls=RmqOffsetStoreError)
            except RmqSourceError:
                raise
            except OSError as exc:
                raise RmqOffsetStoreError(f"cannot write offset store file {path}: {exc}") from exc
