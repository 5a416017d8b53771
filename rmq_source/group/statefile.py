"""Small JSON state files shared by several processes (queue locks, group membership).

Contract of :class:`JsonStateFile`:

* The data file ``<path>`` is only ever replaced whole: new content goes to a new temporary file with
  an unpredictable name, is fsynced, renamed over ``<path>`` and the directory is fsynced. A reader
  therefore sees the old or the new content, never a torn mix, and a crash at any point leaves one
  of the two.
* The folder may be shared with other users: no file in it (data, ``.flock``, temporary files, logs)
  is ever opened through a symlink; one planted there is refused with the caller's error class
  naming it (:mod:`rmq_source.nofollow`).
* Entries carry the writer's clock (ms since the epoch). A stamp that is negative, or further ahead
  of the reader's clock than one lease (the reader's) plus :data:`CLOCK_SKEW_ALLOWANCE_MS`, cannot
  come from a member and would never expire: it makes the file invalid (:func:`timestamp_problem`).
* Every read-modify-write happens under an exclusive ``fcntl.flock`` on the sidecar ``<path>.flock``
  (the data file itself cannot carry the lock because rename replaces its inode), so two processes
  racing never lose an update. Reads take a shared lock; on NFS taking a lock also makes the client
  revalidate its cached copy of the file.
* A thread lock per sidecar path serialises threads of one process as well, whatever the file
  system's flock semantics for two descriptors of one process are.

Safety across hosts that share the folder holds only where the file system implements flock (or the
POSIX locks the Linux NFS client emulates it with) coherently for all hosts: local file systems and
NFSv4 / NFSv3 with a working lock manager do; ``nolock`` NFS mounts, many FUSE and SMB setups do not.
The kernel releases a dead process's flock, so ``kill -9`` never leaves a lock behind.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

from rmq_source import nofollow
from rmq_source.errors import RmqLockError, RmqOptionError, RmqSourceError

T = TypeVar("T")

# RocketMQ accepts group names made of these characters (TopicValidator / Validators); they are also
# safe as file-name parts. The length cap keeps "<group>.<suffix>" under the usual 255-byte NAME_MAX.
_GROUP_RE = re.compile(r"[%|a-zA-Z0-9_-]+")
GROUP_MAX_LENGTH = 200
# How far ahead of the reader's clock, beyond one lease, another member's clock may plausibly run.
# Clocks further apart break the lease rules anyway (see rmq_source.group.locks).
CLOCK_SKEW_ALLOWANCE_MS = 60_000

_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


def _reset_thread_locks_after_fork() -> None:
    # A child forked while another thread held one of these locks would otherwise deadlock on it.
    global _thread_locks_guard
    _thread_locks.clear()
    _thread_locks_guard = threading.Lock()


os.register_at_fork(after_in_child=_reset_thread_locks_after_fork)


def _thread_lock(path: str) -> threading.Lock:
    with _thread_locks_guard:
        lock = _thread_locks.get(path)
        if lock is None:
            lock = _thread_locks[path] = threading.Lock()
        return lock


def check_group(group: object) -> str:
    """Return ``group`` if it is a valid consumer-group name, else raise RmqOptionError."""
    if not isinstance(group, str) or not _GROUP_RE.fullmatch(group) or len(group) > GROUP_MAX_LENGTH:
        raise RmqOptionError(
            f"invalid consumer group {group!r}: expected 1..{GROUP_MAX_LENGTH} characters from "
            "[%|a-zA-Z0-9_-] (the characters RocketMQ allows in group names)")
    return group


def group_state_path(state_dir: str | os.PathLike, group: str, suffix: str) -> str:
    """Path of one per-group state file: ``<state_dir>/<group>.<suffix>``. Creates ``state_dir``."""
    check_group(group)
    state_dir = os.fspath(state_dir)
    if not state_dir:
        raise RmqOptionError("state_dir must be a non-empty directory path")
    os.makedirs(state_dir, exist_ok=True)
    return os.path.join(state_dir, f"{group}.{suffix}")


@contextmanager
def file_lock(lock_path: str, *, exclusive: bool, timeout_s: float | None,
              error_cls: type[RmqSourceError], root: str | None = None) -> Iterator[None]:
    """Hold flock on ``lock_path`` (created if missing) plus this process's thread lock for it.

    ``timeout_s=None`` waits forever; otherwise ``error_cls`` is raised when the lock is still busy
    after ``timeout_s`` seconds (a stopped or hung holder must not hang every other client). The
    lock file, and every folder between ``root`` (default: its own folder) and it, is opened
    without following symlinks: one there raises ``error_cls`` naming it.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    tlock = _thread_lock(os.path.abspath(lock_path))
    if not tlock.acquire(timeout=-1 if timeout_s is None else max(timeout_s, 0.0)):
        raise error_cls(f"timed out after {timeout_s} s waiting for state lock {lock_path} "
                        "(held by another thread of this process)")
    try:
        try:
            fd = nofollow.open_file(lock_path, os.O_RDWR | os.O_CREAT, root=root, error_cls=error_cls)
        except RmqSourceError:
            raise
        except OSError as exc:
            raise error_cls(f"cannot open state lock file {lock_path}: {exc}") from exc
        try:
            _flock(fd, lock_path, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, deadline, timeout_s,
                   error_cls)
            yield
        finally:
            os.close(fd)  # closing the only descriptor releases the flock
    finally:
        tlock.release()


def _flock(fd: int, lock_path: str, mode: int, deadline: float | None, timeout_s: float | None,
           error_cls: type[RmqSourceError]) -> None:
    delay = 0.0005
    while True:
        try:
            fcntl.flock(fd, mode | (0 if deadline is None else fcntl.LOCK_NB))
            return
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EINTR):
                raise error_cls(f"cannot lock state lock file {lock_path}: {exc}") from exc
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise error_cls(f"timed out after {timeout_s} s waiting for state lock {lock_path} "
                                "(held by another process that may be stopped or hung)")
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.02)


def write_json_atomic(path: str, obj: Any, *, error_cls: type[RmqSourceError]) -> None:
    """Replace ``path`` with ``obj`` as JSON: new unpredictably named temp file (exclusive,
    no-follow create), fsync, rename, directory fsync. A symlink at ``path`` raises ``error_cls``."""
    data = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("utf-8")
    nofollow.write_file_atomic(path, data, error_cls=error_cls)


def append_jsonl(path: str, records: list[dict], *,
                 error_cls: type[RmqSourceError] = RmqLockError) -> None:
    """Append one JSON line per record with a single write (O_APPEND). Not fsynced: a log, not state.

    ``path`` is never opened through a symlink (``error_cls`` naming it); the default class is the
    one of the group's logs (plans, lock history).
    """
    if not records:
        return
    data = "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in records)
    nofollow.append_file(path, data.encode("utf-8"), error_cls=error_cls)


def timestamp_problem(field: str, value: int, now_ms: int, lease_ms: int) -> str | None:
    """Why ``value`` (ms since the epoch, stamped by some member's clock, trusted for ``lease_ms``)
    cannot be a real stamp, or None.

    Invalid: negative, or more than ``lease_ms + CLOCK_SKEW_ALLOWANCE_MS`` ahead of ``now_ms`` (the
    reader's clock). Such an entry would never expire and hold its queues or its place in the group
    forever, so it is reported as corrupt rather than obeyed.
    """
    if value < 0:
        return f"{field} {value} is negative; it must be a time in ms since the epoch"
    limit = lease_ms + CLOCK_SKEW_ALLOWANCE_MS
    if value - now_ms > limit:
        return (f"{field} {value} is {value - now_ms} ms ahead of this host's clock ({now_ms}), more "
                f"than the {limit} ms a member's clock may be ahead (lease {lease_ms} ms + "
                f"{CLOCK_SKEW_ALLOWANCE_MS} ms clock skew); such an entry would never expire - "
                "remove it (or the file) once its holder is stopped")
    return None


def group_table_validator(group: str, version: int, what: str, table: str,
                          entry_problem: Callable[[str, Any, int], str | None],
                          error_cls: type[Exception], now_ms: Callable[[], int]
                          ) -> Callable[[Any, str], dict]:
    """A ``validate(obj, path)`` for a group's state file ``{"version", "group", <table>: {...}}``.

    ``entry_problem(key, value, now)`` returns why an entry of the table is invalid, or None; ``now``
    is ``now_ms()``, read once per validation (timestamps are judged against it). Errors are
    ``error_cls("<what> <path> is invalid: <why>")``.
    """
    def validate(obj: Any, path: str) -> dict:
        now = now_ms()

        def bad(why: str) -> Exception:
            return error_cls(f"{what} {path} is invalid: {why}")
        if not isinstance(obj, dict) or obj.get("version") != version:
            raise bad(f"expected an object with \"version\": {version}")
        if obj.get("group") != group:
            raise bad(f"it belongs to group {obj.get('group')!r}, not {group!r}")
        entries = obj.get(table)
        if not isinstance(entries, dict):
            raise bad(f"\"{table}\" must be an object")
        for key, value in entries.items():
            why = entry_problem(key, value, now)
            if why is not None:
                raise bad(why)
        return obj
    return validate


class JsonStateFile:
    """One JSON object persisted at ``path``, read and updated under the sidecar flock.

    ``empty`` builds the content of a file that does not exist yet. ``validate(obj, path)`` checks
    loaded content and raises ``error_cls``; a file that is not valid JSON raises ``error_cls``
    naming the file (never treated as empty: that would silently drop every entry).
    """

    def __init__(self, path: str, *, empty: Callable[[], dict], validate: Callable[[Any, str], dict],
                 error_cls: type[RmqSourceError], lock_timeout_s: float | None = 30.0):
        self.path = path
        self.lock_path = path + ".flock"
        self._empty = empty
        self._validate = validate
        self._error_cls = error_cls
        self.lock_timeout_s = lock_timeout_s

    def _load(self) -> dict:
        try:
            raw = nofollow.read_file(self.path, error_cls=self._error_cls)
        except RmqSourceError:
            raise
        except OSError as exc:
            raise self._error_cls(f"cannot read state file {self.path}: {exc}") from exc
        if raw is None:
            return self._empty()
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise self._error_cls(
                f"state file {self.path} is not valid JSON ({exc}); it is only ever replaced by "
                "rename, so something else wrote it - fix or delete it") from exc
        return self._validate(obj, self.path)

    def read(self) -> dict:
        """Current content (a fresh copy) under a shared lock."""
        with file_lock(self.lock_path, exclusive=False, timeout_s=self.lock_timeout_s,
                       error_cls=self._error_cls):
            return self._load()

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the exclusive lock, for callers that also write side files (logs) under it."""
        with file_lock(self.lock_path, exclusive=True, timeout_s=self.lock_timeout_s,
                       error_cls=self._error_cls):
            yield

    def update(self, mutate: Callable[[dict], T], *, after_write: Callable[[T], None] | None = None) -> T:
        """Read-modify-write under the exclusive lock.

        ``mutate(state)`` changes ``state`` in place and returns a result; the file is rewritten only
        if the content changed. ``after_write(result)`` runs after the write, still under the lock.
        """
        with self.locked():
            state = self._load()
            before = json.dumps(state, sort_keys=True)
            result = mutate(state)
            if json.dumps(state, sort_keys=True) != before:
                try:
                    write_json_atomic(self.path, state, error_cls=self._error_cls)
                except RmqSourceError:
                    raise
                except OSError as exc:
                    raise self._error_cls(f"cannot write state file {self.path}: {exc}") from exc
            if after_write is not None:
                after_write(result)
            return result
