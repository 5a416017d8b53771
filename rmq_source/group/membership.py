"""Which clients (Spark queries) currently form a consumer group.

Each client calls :meth:`GroupMembership.heartbeat` regularly; :meth:`live_clients` lists the clients
whose last heartbeat is at most ``heartbeat_timeout_ms`` old, sorted as Java sorts strings — the
``cidAll`` list a RocketMQ allocation strategy expects. Defaults follow RocketMQ: clients heartbeat
every 30 s and the broker drops a client silent for 120 s.

File: ``<state_dir>/<group>.members.json`` = ``{"version": 1, "group": g, "clients": {clientId:
{"lastHeartbeatMs": ms, "host": hostname, "pid": pid, "options": {name: value}}}}``, updated by
read-modify-write under an exclusive flock and replaced atomically (:mod:`rmq_source.group.statefile`;
same multi-process / multi-host caveats as :mod:`rmq_source.group.locks`). Clients no longer live
are dropped from the file on each write.

``options`` are the member's options that must agree across the group (RocketMQ requires one
allocation strategy and one subscription per group): a client whose options differ from a live
member's is refused when it joins, with an error naming the option and both values.

The file and its ``.flock`` are never opened through a symlink (:class:`RmqLockError` naming it). A
``lastHeartbeatMs`` that is negative or more than ``heartbeat_timeout_ms`` plus
:data:`rmq_source.group.statefile.CLOCK_SKEW_ALLOWANCE_MS` ahead of this client's clock would keep a client
"live" forever (and its queues unread): it makes the file invalid, every operation raising
:class:`RmqLockError` naming the file, the client and the value.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any, Callable, Iterable

from rmq_source.errors import RmqLockError, RmqOptionError
from rmq_source.group.statefile import (JsonStateFile, check_group, group_state_path,
                                        group_table_validator, timestamp_problem)

log = logging.getLogger(__name__)

DEFAULT_HEARTBEAT_TIMEOUT_MS = 120_000   # broker: channel expired after 120 s of silence
DEFAULT_HEARTBEAT_INTERVAL_MS = 30_000   # client: heartbeatBrokerInterval
STATE_VERSION = 1


def java_sorted(client_ids: Iterable[str]) -> list[str]:
    """Sort like Java's ``String.compareTo`` (UTF-16 code units), which differs from Python's code-point
    order for characters outside the BMP vs U+E000..U+FFFF."""
    return sorted(client_ids, key=lambda s: s.encode("utf-16-be", "surrogatepass"))


def _check_positive_ms(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise RmqOptionError(f"{name} must be a positive integer number of milliseconds, got {value!r}")
    return value


def _client_problem(cid: str, c: Any, now_ms: int, timeout_ms: int) -> str | None:
    t = c.get("lastHeartbeatMs") if isinstance(c, dict) else None
    if not cid or isinstance(t, bool) or not isinstance(t, int):
        return f"client {cid!r} must have an integer lastHeartbeatMs, got {c!r}"
    why = timestamp_problem("lastHeartbeatMs", t, now_ms, timeout_ms)
    if why is not None:
        return f"client {cid!r}: {why}"
    opts = c.get("options", {})
    if not isinstance(opts, dict) or not all(isinstance(v, str) for v in opts.values()):
        return f"client {cid!r}: options must be an object of strings, got {opts!r}"
    return None


def _shown(name: str, value: str | None) -> str:
    return f"{name} not given" if value is None else f"{name}={value!r}"


class GroupMembership:
    """Membership of ``client_id`` in ``group``, shared with other processes through ``state_dir``.

    ``clock`` returns seconds (like ``time.time``). Usable as a context manager: enter heartbeats,
    exit stops the heartbeat thread (if any) and leaves the group.
    """

    def __init__(self, state_dir: str | os.PathLike, group: str, client_id: str, *,
                 heartbeat_timeout_ms: int = DEFAULT_HEARTBEAT_TIMEOUT_MS,
                 clock: Callable[[], float] = time.time, lock_timeout_s: float | None = 30.0,
                 options: dict[str, str] | None = None):
        self.group = check_group(group)
        self.options = dict(options or {})
        if not isinstance(client_id, str) or not client_id or "\n" in client_id:
            raise RmqOptionError(f"client_id must be a non-empty single-line string, got {client_id!r}")
        self.client_id = client_id
        self.heartbeat_timeout_ms = _check_positive_ms("heartbeat_timeout_ms", heartbeat_timeout_ms)
        self._clock = clock
        self.path = group_state_path(state_dir, group, "members.json")
        self._state = JsonStateFile(
            self.path, empty=lambda: {"version": STATE_VERSION, "group": group, "clients": {}},
            validate=group_table_validator(
                group, STATE_VERSION, "group membership file", "clients",
                lambda cid, c, now: _client_problem(cid, c, now, self.heartbeat_timeout_ms),
                RmqLockError, self.now_ms),
            error_cls=RmqLockError,
            lock_timeout_s=lock_timeout_s)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.last_error: BaseException | None = None

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _live(self, clients: dict, now: int) -> list[str]:
        return java_sorted(cid for cid, c in clients.items()
                           if now - c["lastHeartbeatMs"] <= self.heartbeat_timeout_ms)

    def _prune(self, clients: dict, now: int) -> None:
        for cid in [cid for cid, c in clients.items()
                    if now - c["lastHeartbeatMs"] > self.heartbeat_timeout_ms]:
            del clients[cid]

    def heartbeat(self) -> list[str]:
        """Register or refresh this client now; returns the live clients after the update.

        Joining (the client is not yet a member) raises :class:`RmqOptionError` when a live member
        has different ``options``."""
        def mutate(state: dict) -> list[str]:
            now = self.now_ms()
            clients = state["clients"]
            self._prune(clients, now)
            if self.client_id not in clients:
                self._check_agreement(clients)
            clients[self.client_id] = {"lastHeartbeatMs": now, "host": socket.gethostname(),
                                       "pid": os.getpid(), "options": self.options}
            return self._live(clients, now)
        return self._state.update(mutate)

    def _check_agreement(self, clients: dict) -> None:
        for cid in java_sorted(clients):
            theirs = clients[cid].get("options")
            if theirs is None:      # written by a version that did not record options
                continue
            for name in sorted(set(self.options) | set(theirs)):
                ours, other = self.options.get(name), theirs.get(name)
                if ours != other:
                    raise RmqOptionError(
                        f"consumer group {self.group!r}: option {_shown(name, ours)} differs from "
                        f"{_shown(name, other)} of the live member {cid!r} ({self.path}); every "
                        "query of a group must use one allocation strategy and one subscription: "
                        "give the same value, or use another consumerGroup")

    def subscribe(self, topics) -> None:
        """The topics the query reads now: nothing to do here (the members share one folder)."""

    def live_clients(self) -> list[str]:
        """Client ids whose last heartbeat is at most ``heartbeat_timeout_ms`` old, Java-sorted."""
        return self._live(self._state.read()["clients"], self.now_ms())

    def members(self) -> dict[str, int]:
        """Every client in the file with its last heartbeat (ms), stale ones not yet pruned included."""
        return {cid: c["lastHeartbeatMs"] for cid, c in self._state.read()["clients"].items()}

    def leave(self) -> None:
        """Stop the heartbeat thread (if any) and remove this client from the group (idempotent)."""
        self.stop_heartbeat()

        def mutate(state: dict) -> None:
            state["clients"].pop(self.client_id, None)
            self._prune(state["clients"], self.now_ms())
        self._state.update(mutate)

    # -- optional background heartbeat ---------------------------------------------------------

    def start_heartbeat(self, interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS) -> None:
        """Heartbeat now and then every ``interval_ms`` from a daemon thread. Failures are logged and
        kept in ``last_error``; the thread goes on (a client that cannot heartbeat drops out)."""
        _check_positive_ms("interval_ms", interval_ms)
        if interval_ms >= self.heartbeat_timeout_ms:
            raise RmqOptionError(f"interval_ms ({interval_ms}) must be shorter than heartbeat_timeout_ms "
                                 f"({self.heartbeat_timeout_ms}) or this client drops out between beats")
        if self._thread is not None and self._thread.is_alive():
            raise RmqOptionError(f"heartbeat thread of client {self.client_id!r} is already running")
        self._stop.clear()
        self.heartbeat()
        self._thread = threading.Thread(target=self._run, args=(interval_ms / 1000,), daemon=True,
                                        name=f"rmq-heartbeat-{self.group}-{self.client_id}")
        self._thread.start()

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.heartbeat()
                self.last_error = None
            except Exception as exc:
                self.last_error = exc
                log.warning("heartbeat of client %s in group %s failed: %s", self.client_id, self.group, exc)

    def stop_heartbeat(self, timeout: float | None = None) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._thread = None

    def __enter__(self) -> "GroupMembership":
        self.heartbeat()
        return self

    def __exit__(self, *exc: object) -> None:
        self.leave()
