"""Queue locks for ordered consumption, shared by several processes through files.

Modelled on the broker's rebalance lock manager (format doc §13.1) and the client's process-queue
lock (§13.2), with the table kept in a file instead of broker memory so that several Spark queries of
one consumer group (several processes, possibly several hosts) agree on who reads which queue.

Files in ``state_dir`` (beside the group's offset store), per consumer group ``<g>``:

* ``<g>.locks.json`` — ``{"version": 1, "group": g, "locks": {"<topic>|<broker>|<queueId>":
  {"clientId": c, "lastUpdateTimestamp": ms, "leaseMs": ms}}}``, updated by read-modify-write under an
  exclusive flock on ``<g>.locks.json.flock`` and replaced atomically (see :mod:`rmq_source.group.statefile`).
* ``<g>.lock-history.jsonl`` — append-only log, one JSON object per change, written under the same
  lock in the order the changes happened: ``{"t", "client", "queue", "action", "prev", "prevUpdateMs",
  "leaseMs"}`` with action ``lock`` (free queue taken), ``renew`` (caller already owned it),
  ``expire-takeover`` (another client's lease had run out), ``unlock`` or ``purge`` (entry expired
  for ten leases removed). Rotated to ``.1`` past ``history_max_bytes``. :func:`find_lock_overlaps`
  checks that no queue was ever held by two clients within a lease.

None of these files (nor their ``.flock``, temporary files or ``.1``) is ever opened through a
symlink: the folder may be shared, and a planted link is refused with :class:`RmqLockError` naming
it. An entry whose ``lastUpdateTimestamp`` is negative or more than this manager's lease plus
:data:`rmq_source.group.statefile.CLOCK_SKEW_ALLOWANCE_MS` ahead of its clock (it would never expire), or
whose ``leaseMs`` is not positive, makes the file invalid: every operation raises
:class:`RmqLockError` naming the file, the entry and the value.

Rules (all times in ms from ``clock``): an entry is expired when ``now - lastUpdateTimestamp >
leaseMs`` (the lease the owner was granted, so managers configured with different leases stay
safe). ``try_lock_batch`` renews queues the caller owns (expired or not), takes free or expired ones
and leaves queues owned by another live client alone. ``unlock_batch`` removes only the caller's
entries.

Safety: exact across processes on one host (flock is released by the kernel when a process dies, so
``kill -9`` loses nothing but the dead client's lease, which then expires). Across hosts sharing the
folder it holds only if the file system gives coherent flock/POSIX locks to all hosts (NFSv4 or NFSv3
with a lock manager; not ``nolock`` mounts, many FUSE/SMB setups) and the hosts' clocks differ by much
less than ``lease_ms - client_lease_ms``, because each process judges expiry with its own clock.

Clients must stop reading a queue before the manager can hand it to someone else: a client trusts a
lock for ``client_lease_ms`` (default 30 s) after the moment it *asked* for it, shorter than the
manager lease (default 60 s), and renews every ``interval_ms`` (default 20 s, :class:`LockRenewer`).
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from rmq_source.errors import RmqLockError, RmqOptionError
from rmq_source.group.allocation import MessageQueue
from rmq_source import nofollow
from rmq_source.group.statefile import (JsonStateFile, append_jsonl, check_group, group_state_path,
                                        group_table_validator, timestamp_problem)

log = logging.getLogger(__name__)

DEFAULT_LEASE_MS = 60_000          # broker: rocketmq.broker.rebalance.lockMaxLiveTime
DEFAULT_CLIENT_LEASE_MS = 30_000   # client: rocketmq.client.rebalance.lockMaxLiveTime
DEFAULT_RENEW_INTERVAL_MS = 20_000  # client: rocketmq.client.rebalance.lockInterval
PURGE_AFTER_LEASES = 10            # an entry expired for this many leases is dropped from the file
STATE_VERSION = 1

ACTIONS = ("lock", "renew", "expire-takeover", "unlock", "purge")
_ACQUIRING = frozenset(("lock", "renew", "expire-takeover"))


# ---------------------------------------------------------------------------------------------
# Queue identity


def _queue_fields(mq: Any) -> tuple[str, str, int]:
    if type(mq) is MessageQueue:        # (its fields are str, str, int already)
        topic, broker, qid = mq
        if topic and broker and qid >= 0:
            return topic, broker, qid
    if all(hasattr(mq, a) for a in ("topic", "broker_name", "queue_id")):
        fields = (mq.topic, mq.broker_name, mq.queue_id)
    elif isinstance(mq, tuple) and len(mq) == 3:
        fields = tuple(mq)
    else:
        raise RmqOptionError(
            f"message queue {mq!r} must be a (topic, broker_name, queue_id) tuple or an object with "
            "those attributes")
    topic, broker, qid = fields
    if not isinstance(topic, str) or not topic:
        raise RmqOptionError(f"message queue {mq!r}: topic must be a non-empty string")
    if not isinstance(broker, str) or not broker:
        raise RmqOptionError(f"message queue {mq!r}: broker_name must be a non-empty string")
    if isinstance(qid, bool) or not isinstance(qid, int) or qid < 0:
        raise RmqOptionError(f"message queue {mq!r}: queue_id must be an int >= 0")
    return topic, broker, qid


def _escape(part: str) -> str:
    # '|' may occur in topic names; escaping keeps keys unambiguous and common keys unchanged.
    return part.replace("\\", "\\\\").replace("|", "\\|")


#: keys of queues and queues of keys made lately (a group planning makes the same thousands each
#: batch); cleared when full
_KEYS: dict = {}
_PARSED: dict[str, tuple[str, str, int]] = {}
_CACHE_MAX = 1 << 16


def queue_key(mq: Any) -> str:
    """The lock-file key of a queue: ``"<topic>|<broker>|<queueId>"`` (``\\`` and ``|`` escaped)."""
    key = _KEYS.get(mq) if type(mq) is MessageQueue else None
    if key is None:
        topic, broker, qid = _queue_fields(mq)
        key = f"{_escape(topic)}|{_escape(broker)}|{qid}"
        if type(mq) is MessageQueue:
            if len(_KEYS) >= _CACHE_MAX:
                _KEYS.clear()
            _KEYS[mq] = key
    return key


def parse_queue_key(key: str) -> tuple[str, str, int]:
    """Inverse of :func:`queue_key`: ``(topic, broker_name, queue_id)``."""
    found = _PARSED.get(key)
    if found is None:
        found = _parse_queue_key(key)
        if len(_PARSED) >= _CACHE_MAX:
            _PARSED.clear()
        _PARSED[key] = found
    return found


def _parse_queue_key(key: str) -> tuple[str, str, int]:
    parts, cur, i = [], [], 0
    while i < len(key):
        ch = key[i]
        if ch == "\\" and i + 1 < len(key):
            cur.append(key[i + 1])
            i += 2
            continue
        if ch == "|":
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    parts.append("".join(cur))
    if len(parts) != 3 or not parts[0] or not parts[1] or not parts[2].isdigit():
        raise RmqLockError(f"malformed queue key {key!r}: expected '<topic>|<broker>|<queueId>'")
    return parts[0], parts[1], int(parts[2])


def _check_client(client_id: object) -> str:
    if not isinstance(client_id, str) or not client_id or "\n" in client_id:
        raise RmqOptionError(f"client_id must be a non-empty single-line string, got {client_id!r}")
    return client_id


def _check_ms(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise RmqOptionError(f"{name} must be a positive integer number of milliseconds, got {value!r}")
    return value


def check_queues_given(mqs: Iterable[Any]) -> None:
    """Refuse a string where an iterable of message queues is expected (it iterates too)."""
    if isinstance(mqs, (str, bytes)):
        raise RmqOptionError("mqs must be an iterable of message queues, not a string")


def _keyed(mqs: Iterable[Any]) -> list[tuple[str, Any]]:
    check_queues_given(mqs)
    return [(queue_key(mq), mq) for mq in mqs]


# ---------------------------------------------------------------------------------------------
# Manager (the broker side)


@dataclass(frozen=True)
class LockEntry:
    """Owner of one queue's lock. ``last_update_ms``: last lock/renew time; ``lease_ms``: the lease
    granted then. Expired when ``now_ms - last_update_ms > lease_ms``."""
    client_id: str
    last_update_ms: int
    lease_ms: int = DEFAULT_LEASE_MS

    def age_ms(self, now_ms: int) -> int:
        return now_ms - self.last_update_ms

    def is_expired(self, now_ms: int) -> bool:
        return now_ms - self.last_update_ms > self.lease_ms

    def is_locked_by(self, client_id: str, now_ms: int) -> bool:
        return self.client_id == client_id and not self.is_expired(now_ms)


def _entry_from_json(raw: dict) -> LockEntry:
    return LockEntry(raw["clientId"], raw["lastUpdateTimestamp"], raw["leaseMs"])


def _entry_to_json(e: LockEntry) -> dict:
    return {"clientId": e.client_id, "lastUpdateTimestamp": e.last_update_ms, "leaseMs": e.lease_ms}


def _lock_problem(key: str, e: Any, now_ms: int, lease_ms: int) -> str | None:
    ok = (isinstance(e, dict) and isinstance(e.get("clientId"), str) and e["clientId"]
          and all(isinstance(e.get(f), int) and not isinstance(e.get(f), bool)
                  for f in ("lastUpdateTimestamp", "leaseMs")))
    if not ok:
        return (f"entry {key!r} must have clientId (string), lastUpdateTimestamp and leaseMs "
                f"(integers), got {e!r}")
    if e["leaseMs"] <= 0:
        return f"entry {key!r} of client {e['clientId']!r}: leaseMs {e['leaseMs']} must be positive"
    why = timestamp_problem("lastUpdateTimestamp", e["lastUpdateTimestamp"], now_ms, lease_ms)
    return None if why is None else f"entry {key!r} of client {e['clientId']!r}: {why}"


class QueueLockManager:
    """File-backed lock table of one consumer group (see the module docstring for files and rules).

    ``clock`` returns seconds (like ``time.time``); it is read while the file lock is held, so history
    times are in the order the changes happened when all clients share one clock.
    """

    def __init__(self, state_dir: str | os.PathLike, group: str, *, lease_ms: int = DEFAULT_LEASE_MS,
                 clock: Callable[[], float] = time.time, history: bool = True,
                 history_max_bytes: int = 16 << 20, lock_timeout_s: float | None = 30.0):
        self.group = check_group(group)
        self.lease_ms = _check_ms("lease_ms", lease_ms)
        self._clock = clock
        self.history = history
        self.history_max_bytes = _check_ms("history_max_bytes", history_max_bytes)
        self.path = group_state_path(state_dir, group, "locks.json")
        self.history_path = group_state_path(state_dir, group, "lock-history.jsonl")
        self._state = JsonStateFile(
            self.path, empty=lambda: {"version": STATE_VERSION, "group": group, "locks": {}},
            validate=group_table_validator(
                group, STATE_VERSION, "lock state file", "locks",
                lambda key, e, now: _lock_problem(key, e, now, self.lease_ms), RmqLockError,
                self.now_ms),
            error_cls=RmqLockError,
            lock_timeout_s=lock_timeout_s)

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    # -- writes -------------------------------------------------------------------------------

    def _change(self, mqs: Iterable[Any], client_id: str,
                decide: Callable[[LockEntry | None, int], str | None]) -> set:
        """Apply ``decide(entry, now) -> action | None`` to each distinct queue; returns the inputs
        whose queue got an action."""
        cid = _check_client(client_id)
        pairs = _keyed(mqs)
        if not pairs:
            return set()

        def mutate(state: dict) -> tuple[set[str], list[dict]]:
            now = self.now_ms()
            locks = state["locks"]
            done: set[str] = set()
            events: list[dict] = []
            for key in dict.fromkeys(k for k, _ in pairs):
                raw = locks.get(key)
                prev = _entry_from_json(raw) if raw is not None else None
                action = decide(prev, now)
                if action is None:
                    continue
                if action == "unlock":
                    del locks[key]
                else:
                    locks[key] = _entry_to_json(LockEntry(cid, now, self.lease_ms))
                done.add(key)
                events.append(self._event(now, cid, key, action, prev))
            self._purge(locks, now, events)
            return done, events

        done, _ = self._state.update(mutate, after_write=lambda r: self._log(r[1]))
        return {mq for key, mq in pairs if key in done}

    def try_lock_batch(self, mqs: Iterable[Any], client_id: str) -> set:
        """Lock what can be locked; returns the given queues the caller now holds (RocketMQ
        ``tryLockBatch``: owned -> renewed, free or expired -> taken, another live owner -> excluded)."""
        def decide(e: LockEntry | None, now: int) -> str | None:
            if e is None:
                return "lock"
            if e.client_id == client_id:
                return "renew"
            return "expire-takeover" if e.is_expired(now) else None
        return self._change(mqs, client_id, decide)

    def try_lock(self, mq: Any, client_id: str) -> bool:
        """Single-queue :meth:`try_lock_batch`."""
        return bool(self.try_lock_batch([mq], client_id))

    def renew(self, mqs: Iterable[Any], client_id: str) -> set:
        """Refresh the caller's own entries (even expired ones nobody took); never takes a queue.
        Returns the given queues renewed."""
        return self._change(mqs, client_id,
                            lambda e, now: "renew" if e is not None and e.client_id == client_id else None)

    def unlock_batch(self, mqs: Iterable[Any], client_id: str) -> set:
        """Remove the caller's entries (expired or not); others' entries are left alone (no-op).
        Returns the given queues unlocked."""
        return self._change(mqs, client_id,
                            lambda e, now: "unlock" if e is not None and e.client_id == client_id else None)

    def _purge(self, locks: dict, now: int, events: list[dict]) -> None:
        for key in [k for k, raw in locks.items()
                    if now - raw["lastUpdateTimestamp"] > PURGE_AFTER_LEASES * raw["leaseMs"]]:
            prev = _entry_from_json(locks.pop(key))
            events.append(self._event(now, prev.client_id, key, "purge", prev))

    def _event(self, now: int, cid: str, key: str, action: str, prev: LockEntry | None) -> dict:
        return {"t": now, "client": cid, "queue": key, "action": action,
                "prev": prev.client_id if prev else None,
                "prevUpdateMs": prev.last_update_ms if prev else None,
                "leaseMs": self.lease_ms if action in _ACQUIRING else None}

    def _log(self, events: list[dict]) -> None:
        if not self.history or not events:
            return
        try:
            size = nofollow.file_size(self.history_path, error_cls=RmqLockError)
            if size is not None and size >= self.history_max_bytes:
                nofollow.rename_file(self.history_path, os.path.basename(self.history_path) + ".1",
                                     error_cls=RmqLockError)
            append_jsonl(self.history_path, events, error_cls=RmqLockError)
        except RmqLockError:
            raise
        except OSError as exc:
            raise RmqLockError(f"cannot append to lock history {self.history_path}: {exc}") from exc

    # -- reads --------------------------------------------------------------------------------

    def entries(self) -> dict[str, LockEntry]:
        """Every entry in the file, expired ones included, keyed by :func:`queue_key`."""
        return {k: _entry_from_json(v) for k, v in self._state.read()["locks"].items()}

    def entry(self, mq: Any) -> LockEntry | None:
        """The file's entry for ``mq`` (possibly expired), or None."""
        raw = self._state.read()["locks"].get(queue_key(mq))
        return _entry_from_json(raw) if raw is not None else None

    def owner(self, mq: Any) -> str | None:
        """Client holding ``mq`` now, or None when free or expired."""
        e = self.entry(mq)
        return e.client_id if e is not None and not e.is_expired(self.now_ms()) else None

    def is_locked(self, mq: Any, client_id: str) -> bool:
        """True when ``client_id`` owns ``mq`` and the entry is not expired (RocketMQ ``isLocked``)."""
        e = self.entry(mq)
        return e is not None and e.is_locked_by(_check_client(client_id), self.now_ms())

    def held_by(self, mqs: Iterable[Any], client_id: str) -> set:
        """The queues of ``mqs`` that ``client_id`` holds now (one read of the file)."""
        now = self.now_ms()
        entries = self.entries()
        return {mq for mq in mqs if (e := entries.get(queue_key(mq))) is not None
                and e.is_locked_by(_check_client(client_id), now)}

    def assert_held(self, mq: Any, client_id: str,
                    client_lease_ms: int = DEFAULT_CLIENT_LEASE_MS) -> LockEntry:
        """Raise RmqLockError unless ``client_id`` owns ``mq`` and renewed it within the client lease
        (and within the entry's own lease). Tasks call this before reading an ordered queue."""
        return self.assert_held_batch([mq], client_id, client_lease_ms)[queue_key(mq)]

    def assert_held_batch(self, mqs: Iterable[Any], client_id: str,
                          client_lease_ms: int = DEFAULT_CLIENT_LEASE_MS) -> dict[str, LockEntry]:
        """:meth:`assert_held` for several queues with one read of the file; returns their entries
        keyed by :func:`queue_key`. The first queue not held raises."""
        cid = _check_client(client_id)
        limit = min(_check_ms("client_lease_ms", client_lease_ms), self.lease_ms)
        keys = list(dict.fromkeys(k for k, _ in _keyed(mqs)))
        locks = self._state.read()["locks"]
        now = self.now_ms()
        held = {}
        for key in keys:
            raw = locks.get(key)
            held[key] = self._check_held(key, _entry_from_json(raw) if raw else None, cid, limit, now)
        return held

    def _check_held(self, key: str, e: LockEntry | None, cid: str, limit: int, now: int) -> LockEntry:
        where = f"queue {key} of group {self.group!r} ({self.path})"
        if e is None:
            raise RmqLockError(f"{where} is not locked by anyone; client {cid!r} must lock it first")
        if e.client_id != cid:
            state = "expired" if e.is_expired(now) else "live"
            raise RmqLockError(f"{where} is locked by {e.client_id!r}, not {cid!r} ({state}, last "
                               f"renewed {e.age_ms(now)} ms ago, lease {e.lease_ms} ms)")
        limit = min(limit, e.lease_ms)
        if e.age_ms(now) > limit:
            raise RmqLockError(f"{where}: lock of {cid!r} was last renewed {e.age_ms(now)} ms ago, more "
                               f"than the {limit} ms a client may trust it; renew before reading")
        return e


# ---------------------------------------------------------------------------------------------
# History check


def read_history(state_dir: str | os.PathLike, group: str) -> list[dict]:
    """All history records of ``group`` (rotated generation first), in the order they were written."""
    path = os.path.join(os.fspath(state_dir), f"{check_group(group)}.lock-history.jsonl")
    records: list[dict] = []
    for p in (path + ".1", path):
        raw = nofollow.read_file(p, error_cls=RmqLockError)
        if raw is None:
            continue
        lines = raw.decode("utf-8").split("\n")
        if lines[-1] == "":
            lines.pop()  # after the last newline
        for n, line in enumerate(lines, 1):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RmqLockError(f"lock history {p} line {n} is not JSON: {exc}") from exc
            if not isinstance(rec, dict) or rec.get("action") not in ACTIONS:
                raise RmqLockError(f"lock history {p} line {n} is not a history record: {line!r}")
            records.append(rec)
    return records


def find_lock_overlaps(records: Iterable[dict]) -> list[str]:
    """Replay history records; return one message per moment a client took or renewed a queue while
    another client's grant on it was still within its lease (empty list = mutual exclusion held)."""
    holders: dict[str, tuple[str, int, int]] = {}  # queue -> (client, last lock/renew ms, lease ms)
    problems: list[str] = []
    for i, r in enumerate(records):
        q, c, t, action = r["queue"], r["client"], r["t"], r["action"]
        h = holders.get(q)
        if action in _ACQUIRING:
            if h is not None and h[0] != c and t - h[1] <= h[2]:
                problems.append(f"record {i}: {c!r} {action} {q} at {t} while {h[0]!r} held it "
                                f"(renewed at {h[1]}, lease {h[2]} ms)")
            holders[q] = (c, t, r["leaseMs"])
        elif h is not None and h[0] == c:
            del holders[q]
    return problems


# ---------------------------------------------------------------------------------------------
# Client side


@dataclass
class ProcessQueueLock:
    """A client's belief about one queue (RocketMQ ``ProcessQueue`` lock fields): ``locked`` after a
    granted request, ``last_lock_ms`` = when that request was *sent* (never later than the manager's
    timestamp, so the client's trust ends no later than the manager's lease)."""
    locked: bool = False
    last_lock_ms: int = 0

    def is_lock_expired(self, now_ms: int, client_lease_ms: int = DEFAULT_CLIENT_LEASE_MS) -> bool:
        return now_ms - self.last_lock_ms > client_lease_ms

    def is_readable(self, now_ms: int, client_lease_ms: int = DEFAULT_CLIENT_LEASE_MS) -> bool:
        return self.locked and not self.is_lock_expired(now_ms, client_lease_ms)


class ClientLockView:
    """One client's view of its queue locks, trusted for ``client_lease_ms`` (< the manager lease).

    Thread-safe: a :class:`LockRenewer` may update it while tasks check :meth:`is_readable`.
    """

    def __init__(self, manager: QueueLockManager, client_id: str, *,
                 client_lease_ms: int = DEFAULT_CLIENT_LEASE_MS, clock: Callable[[], float] | None = None):
        self.manager = manager
        self.client_id = _check_client(client_id)
        self.client_lease_ms = _check_ms("client_lease_ms", client_lease_ms)
        if client_lease_ms >= manager.lease_ms:
            raise RmqOptionError(
                f"client_lease_ms ({client_lease_ms}) must be shorter than the manager lease_ms "
                f"({manager.lease_ms}) so a client stops reading before its queue can be handed over")
        self._clock = clock or manager._clock
        self._queues: dict[str, ProcessQueueLock] = {}
        self._mutex = threading.Lock()

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    def record(self, requested: Iterable[Any], granted: Iterable[Any], started_ms: int) -> None:
        """Apply the answer of a lock request sent at ``started_ms``: granted -> locked and
        ``last_lock_ms = started_ms``; refused -> not locked."""
        granted_keys = {queue_key(mq) for mq in granted}
        with self._mutex:
            for key, _ in _keyed(requested):
                pq = self._queues.setdefault(key, ProcessQueueLock())
                if key in granted_keys:
                    pq.locked, pq.last_lock_ms = True, started_ms
                else:
                    pq.locked = False

    def lock_all(self, mqs: Iterable[Any]) -> set:
        """RocketMQ ``lockAll``: try to lock (or renew) every queue; returns the granted ones."""
        mqs = list(mqs)
        started = self.now_ms()
        granted = self.manager.try_lock_batch(mqs, self.client_id)
        self.record(mqs, granted, started)
        return granted

    def lock_untrusted(self, mqs: Iterable[Any]) -> tuple[set, int]:
        """:meth:`lock_all` of the queues of ``mqs`` this view does not trust now (not locked, or
        granted longer than the client lease ago), as RocketMQ's clients lock only the queues a
        rebalance adds and let the renewal keep the others. Returns (the trusted and the granted
        queues, when the oldest of their grants was asked: a caller trusts them until then plus
        the client lease)."""
        mqs = list(mqs)
        trusted, oldest = self.trusted(mqs)
        ask = [mq for mq in mqs if mq not in trusted]
        granted = self.lock_all(ask) if ask else set()
        return trusted | set(granted), oldest

    def trusted(self, mqs: Iterable[Any]) -> tuple[set, int]:
        """(the queues of ``mqs`` this view trusts now, :meth:`is_readable`; when the oldest of
        their grants was asked, now when none)."""
        now = self.now_ms()
        since = now - self.client_lease_ms        # (is_readable, inlined: thousands of queues)
        trusted, oldest = [], now
        queues = self._queues
        check_queues_given(mqs)
        with self._mutex:
            for mq in mqs:
                pq = queues.get(queue_key(mq))
                if pq is not None and pq.locked and pq.last_lock_ms >= since:
                    trusted.append(mq)
                    if pq.last_lock_ms < oldest:
                        oldest = pq.last_lock_ms
        return set(trusted), oldest

    def lock(self, mq: Any) -> bool:
        return bool(self.lock_all([mq]))

    def unlock(self, mqs: Iterable[Any]) -> set:
        """Stop trusting the queues first, then release them in the manager."""
        mqs = list(mqs)
        with self._mutex:
            for key, _ in _keyed(mqs):
                if key in self._queues:
                    self._queues[key].locked = False
        return self.manager.unlock_batch(mqs, self.client_id)

    def process_queue(self, mq: Any) -> ProcessQueueLock:
        """A copy of the view's state for ``mq`` (unlocked if never requested)."""
        with self._mutex:
            pq = self._queues.get(queue_key(mq))
            return ProcessQueueLock(pq.locked, pq.last_lock_ms) if pq else ProcessQueueLock()

    def is_lock_expired(self, mq: Any) -> bool:
        return self.process_queue(mq).is_lock_expired(self.now_ms(), self.client_lease_ms)

    def is_readable(self, mq: Any) -> bool:
        """Locked and not older than the client lease: the only state in which to read ``mq``."""
        return self.process_queue(mq).is_readable(self.now_ms(), self.client_lease_ms)

    def assert_readable(self, mq: Any) -> None:
        pq = self.process_queue(mq)
        now = self.now_ms()
        if not pq.locked:
            raise RmqLockError(f"queue {queue_key(mq)}: client {self.client_id!r} does not hold its "
                               f"lock (group {self.manager.group!r})")
        if pq.is_lock_expired(now, self.client_lease_ms):
            raise RmqLockError(f"queue {queue_key(mq)}: lock of {self.client_id!r} was granted "
                               f"{now - pq.last_lock_ms} ms ago, more than the client lease "
                               f"{self.client_lease_ms} ms; renew before reading")

    def start_renewer(self, mqs_provider: Callable[[], Iterable[Any]],
                      interval_ms: int = DEFAULT_RENEW_INTERVAL_MS) -> "LockRenewer":
        """Start a :class:`LockRenewer` that keeps this view up to date (``lock_all`` each tick)."""
        if interval_ms >= self.client_lease_ms:
            raise RmqOptionError(f"interval_ms ({interval_ms}) must be shorter than client_lease_ms "
                                 f"({self.client_lease_ms}) or locks lapse between renewals")
        renewer = LockRenewer(self.manager, self.client_id, mqs_provider, interval_ms,
                              on_result=lambda req, granted, started: self.record(req, granted, started))
        renewer.start()
        return renewer


class LockRenewer:
    """Daemon thread that calls ``manager.try_lock_batch(mqs_provider(), client_id)`` at once and then
    every ``interval_ms`` (RocketMQ clients re-lock every 20 s), or only :meth:`QueueLockManager.renew`
    when ``acquire=False``. ``on_result(requested, granted, started_ms)`` sees each answer.

    A failing tick (file system error, provider error) is logged and kept in ``last_error``; the
    thread goes on, and locks it could not renew simply expire. ``stop()`` ends and joins it.
    """

    def __init__(self, manager: QueueLockManager, client_id: str,
                 mqs_provider: Callable[[], Iterable[Any]], interval_ms: int = DEFAULT_RENEW_INTERVAL_MS,
                 *, acquire: bool = True,
                 on_result: Callable[[list, set, int], None] | None = None):
        self.manager = manager
        self.client_id = _check_client(client_id)
        self.interval_ms = _check_ms("interval_ms", interval_ms)
        if interval_ms >= manager.lease_ms:
            raise RmqOptionError(f"interval_ms ({interval_ms}) must be shorter than the lock lease "
                                 f"({manager.lease_ms} ms) or locks expire between renewals")
        self.mqs_provider = mqs_provider
        self.acquire = acquire
        self.on_result = on_result
        self.ticks = 0
        self.last_granted: set = set()
        self.last_error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"rmq-lock-renewer-{manager.group}-{client_id}")

    def start(self) -> "LockRenewer":
        self._thread.start()
        return self

    def tick(self) -> set:
        """One renewal round (also usable without the thread)."""
        mqs = list(self.mqs_provider())
        started = self.manager.now_ms()
        if self.acquire:
            granted = self.manager.try_lock_batch(mqs, self.client_id)
        else:
            granted = self.manager.renew(mqs, self.client_id)
        if self.on_result is not None:
            self.on_result(mqs, granted, started)
        self.last_granted = granted
        return granted

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
                self.last_error = None
            except Exception as exc:  # keep renewing; unrenewed locks just expire
                self.last_error = exc
                log.warning("lock renewal for client %s of group %s failed: %s",
                            self.client_id, self.manager.group, exc)
            self.ticks += 1
            self._stop.wait(self.interval_ms / 1000)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, *, unlock: bool = False, timeout: float | None = None) -> None:
        """Stop the thread and wait for it; with ``unlock=True`` then release the provider's queues."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if unlock:
            self.manager.unlock_batch(list(self.mqs_provider()), self.client_id)

    def __enter__(self) -> "LockRenewer":
        if not self._thread.is_alive() and not self._stop.is_set():
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
