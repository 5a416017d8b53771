"""Queue allocation: RocketMQ 4.9.3's six AllocateMessageQueueStrategy algorithms, reproduced exactly.

Every strategy answers ``allocate(consumer_group, current_cid, mq_all, cid_all)``: the message
queues that the consumer ``current_cid`` owns among ``mq_all`` when the group's consumers are
``cid_all``. Like RocketMQ's client, the strategies do not sort: callers pass ``mq_all`` sorted
(``sorted(mq_all)`` uses :class:`MessageQueue`'s Java ordering) and ``cid_all`` sorted in Java
String order (``sorted(cid_all, key=java_string_key)``), as ``RebalanceImpl`` does before calling.

Argument checks follow the Java classes: where Java throws ``IllegalArgumentException`` (empty
``current_cid``, empty ``mq_all`` or ``cid_all``, a machine room that resolves to nothing) this
module raises :class:`RmqAllocationError`; where Java logs and returns an empty list
(``current_cid`` not in ``cid_all``) it returns ``[]``. Bad constructor parameters are options and
raise :class:`RmqOptionError`. A failing strategy always raises; it never degrades to an empty
allocation.

:func:`create_strategy` builds a strategy from RocketMQ's short name (``"AVG"``, ...) or from
``"package.module:Class"`` for a user strategy, whose calls are guarded (exceptions and malformed
results become :class:`RmqAllocationError`).
"""
from __future__ import annotations

import abc
import bisect
import functools
import hashlib
import importlib
import operator
import unicodedata
from collections import Counter
from dataclasses import FrozenInstanceError
from typing import Any, Callable, Iterable, Sequence

from rmq_source.errors import RmqAllocationError, RmqOptionError

__all__ = [
    "MessageQueue",
    "AllocationStrategy",
    "AllocateMessageQueueAveragely",
    "AllocateMessageQueueAveragelyByCircle",
    "AllocateMessageQueueByConfig",
    "AllocateMessageQueueByMachineRoom",
    "AllocateMachineRoomNearby",
    "AllocateMessageQueueConsistentHash",
    "AtSignMachineRoomResolver",
    "UserStrategy",
    "STRATEGY_NAMES",
    "create_strategy",
    "java_string_key",
    "md5_hash",
]

_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


# --------------------------------------------------------------------------------------------
# Java string semantics the algorithms depend on
# --------------------------------------------------------------------------------------------

def java_string_key(text: str) -> bytes:
    """Sort key giving Java ``String.compareTo`` order (UTF-16 code units, not code points).

    The two differ only when a supplementary character (U+10000 and up, a surrogate pair in
    Java) meets a character in U+E000..U+FFFF: Java puts the supplementary one first.
    """
    return text.encode("utf-16-be", "surrogatepass")


@functools.lru_cache(maxsize=4096)
def _name_key(text: str) -> bytes:
    """:func:`java_string_key` of a topic or broker name (few, repeated for every queue)."""
    return java_string_key(text)


def sort_queues(mqs: Iterable[MessageQueue]) -> list[MessageQueue]:
    """``sorted(mqs)`` in Java's ``MessageQueue.compareTo`` order, by a precomputed key (no
    Python comparison per pair) when every queue id is >= 0, where the int32 difference Java
    compares cannot wrap. Other items (tests share limits by name) sort as they compare."""
    out = list(mqs)
    try:
        if out and min(map(_QUEUE_ID, out)) < 0:
            out.sort()
        else:
            out.sort(key=_SORT_KEY)
    except AttributeError:       # not MessageQueues
        out.sort()
    return out


_SORT_KEY = operator.attrgetter("sort_key")
_QUEUE_ID = operator.attrgetter("queue_id")
_INTERNED: dict[tuple, MessageQueue] = {}
_INTERNED_MAX = 1 << 20


def _java_utf8(text: str) -> bytes:
    """``String.getBytes()`` with a UTF-8 default charset: unpaired surrogates become ``?``."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # Re-pair surrogate halves that Java would see as one character, then replace the rest.
        paired = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
        return paired.encode("utf-8", "replace")


def _java_split(text: str, sep: str) -> list[str]:
    """Java ``String.split`` with a one-character literal separator (trailing empties removed)."""
    if sep not in text:
        return [text]
    parts = text.split(sep)
    while parts and parts[-1] == "":
        parts.pop()
    return parts


_JAVA_EXTRA_WHITESPACE = frozenset("\t\n\u000b\f\r\u001c\u001d\u001e\u001f")
_JAVA_NON_BREAKING = frozenset("\u00a0\u2007\u202f")


def _java_is_blank(text: str) -> bool:
    """commons-lang ``StringUtils.isBlank``: every char is ``Character.isWhitespace``."""
    for ch in text:
        if ch in _JAVA_EXTRA_WHITESPACE:
            continue
        if ch in _JAVA_NON_BREAKING or unicodedata.category(ch) not in ("Zs", "Zl", "Zp"):
            return False
    return True


def md5_hash(key: str) -> int:
    """RocketMQ's default ring hash (``ConsistentHashRouter.MD5Hash``).

    MD5 of the key's UTF-8 bytes; only the first 4 digest bytes are used, big-endian, as an
    unsigned value in [0, 2**32).
    """
    return int.from_bytes(hashlib.md5(_java_utf8(key)).digest()[:4], "big")


# --------------------------------------------------------------------------------------------
# MessageQueue
# --------------------------------------------------------------------------------------------

class MessageQueue(tuple):
    """RocketMQ's ``MessageQueue``: equality and hash on all three fields (``topic``,
    ``broker_name``, ``queue_id``); immutable. Equal only to another MessageQueue, never to a plain
    tuple of the same fields.

    Ordering is ``MessageQueue.compareTo``: topic, then broker name (both Java String order), then
    ``queueId - other.queueId`` computed in int32 arithmetic. That subtraction wraps, so the order
    is total only while queue ids differ by less than 2**31 (always true for non-negative ids).
    ``str()`` is Java's ``toString`` and is the key the consistent-hash strategy hashes.

    (A tuple underneath so that hashing it is the tuple's C hash: a planning of 10,000 queues
    looks queues up in dicts and sets about 600,000 times a batch; a Python ``__hash__`` cost
    tens of milliseconds of it.)
    """

    topic = property(operator.itemgetter(0), doc="the topic")
    broker_name = property(operator.itemgetter(1), doc="the broker name")
    queue_id = property(operator.itemgetter(2), doc="the queue id")

    def __new__(cls, topic: str, broker_name: str, queue_id: int) -> MessageQueue:
        if not isinstance(topic, str):
            raise RmqOptionError(f"MessageQueue topic must be a str, got {topic!r}")
        if not isinstance(broker_name, str):
            raise RmqOptionError(f"MessageQueue broker_name must be a str, got {broker_name!r}")
        if (not isinstance(queue_id, int) or isinstance(queue_id, bool)
                or not _INT32_MIN <= queue_id <= _INT32_MAX):
            raise RmqOptionError(
                f"MessageQueue queue_id must be an int in [{_INT32_MIN}, {_INT32_MAX}] "
                f"(Java int), got {queue_id!r}")
        self = tuple.__new__(cls, (str(topic), str(broker_name), int(queue_id)))
        order = (_name_key(topic), _name_key(broker_name))
        attrs = self.__dict__
        attrs["_order"] = order
        #: (topic key, broker key, queue id): Java's order among queues with ids >= 0
        attrs["sort_key"] = (*order, int(queue_id))
        return self

    __hash__ = tuple.__hash__      # (the C slot itself: see the class docstring)

    def __eq__(self, other: object) -> bool:
        if type(other) is MessageQueue or isinstance(other, MessageQueue):
            return tuple.__eq__(self, other)
        return False if isinstance(other, tuple) else NotImplemented

    def __ne__(self, other: object) -> bool:
        same = self.__eq__(other)
        return same if same is NotImplemented else not same

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __repr__(self) -> str:
        return (f"MessageQueue(topic={self.topic!r}, broker_name={self.broker_name!r}, "
                f"queue_id={self.queue_id!r})")

    def __reduce__(self):
        # built again where unpickled: str hashes differ between processes (hash randomization)
        return type(self), (self.topic, self.broker_name, self.queue_id)

    def __copy__(self) -> MessageQueue:
        return self

    def __deepcopy__(self, memo) -> MessageQueue:
        return self

    @classmethod
    def of(cls, topic: str, broker_name: str, queue_id: int) -> MessageQueue:
        """The queue, shared with earlier calls (planning makes the same queues every batch)."""
        key = (topic, broker_name, queue_id)
        mq = _INTERNED.get(key)
        if mq is None or type(queue_id) is not int:     # (True == 1: such a call must fail)
            mq = cls(topic, broker_name, queue_id)
            if len(_INTERNED) >= _INTERNED_MAX:
                _INTERNED.clear()
            _INTERNED[key] = mq
        return mq

    def __str__(self) -> str:
        """How every message, table and error names a queue: ``topic/brokerName/queueId``."""
        return f"{self.topic}/{self.broker_name}/{self.queue_id}"

    def java_string(self) -> str:
        """Java's ``MessageQueue.toString()``, which CONSISTENT_HASH hashes (never shown to users)."""
        return (f"MessageQueue [topic={self.topic}, brokerName={self.broker_name}, "
                f"queueId={self.queue_id}]")

    def compare_to(self, other: MessageQueue) -> int:
        """Sign of Java's ``compareTo`` (-1, 0 or 1)."""
        if self._order != other._order:
            return -1 if self._order < other._order else 1
        diff = (self.queue_id - other.queue_id) & 0xFFFFFFFF
        if diff == 0:
            return 0
        return -1 if diff & 0x80000000 else 1

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, MessageQueue):
            return NotImplemented
        return self.compare_to(other) < 0

    def __le__(self, other: object) -> bool:
        if not isinstance(other, MessageQueue):
            return NotImplemented
        return self.compare_to(other) <= 0

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, MessageQueue):
            return NotImplemented
        return self.compare_to(other) > 0

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, MessageQueue):
            return NotImplemented
        return self.compare_to(other) >= 0


def _coerce_queue(value: Any, what: str) -> MessageQueue:
    if isinstance(value, MessageQueue):
        return value
    if isinstance(value, (list, tuple)) and len(value) == 3:
        return MessageQueue(*value)
    raise RmqOptionError(f"{what} must be a MessageQueue or a (topic, broker_name, queue_id) "
                         f"triple, got {value!r}")


# --------------------------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------------------------

class AllocationStrategy(abc.ABC):
    """A queue-allocation strategy; ``name`` is RocketMQ's ``getName()``."""

    name: str

    @abc.abstractmethod
    def allocate(self, consumer_group: str, current_cid: str, mq_all: Sequence[MessageQueue],
                 cid_all: Sequence[str]) -> list[MessageQueue]:
        """The queues of ``mq_all`` that ``current_cid`` owns; see the module docstring."""

    def allocate_all(self, consumer_group: str, mq_all: Sequence[MessageQueue],
                     cid_all: Sequence[str]) -> dict[str, list[MessageQueue]]:
        """``allocate`` for every consumer of ``cid_all`` (the same answers and errors); the
        averaging strategies do it in one pass instead of one pass per consumer."""
        return {cid: self.allocate(consumer_group, cid, mq_all, cid_all) for cid in cid_all}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def _check_all(mq_all: Any, cid_all: Any, *, blank_cid: bool = False
               ) -> tuple[list[MessageQueue], list[str], dict[str, int]]:
    """_check_args as the per-consumer calls meet it (the first call checks the lists, each call
    its own consumer id); the lists and each consumer's first index (Java's ``indexOf``)."""
    first_cid = cid_all[0] if isinstance(cid_all, (list, tuple)) and cid_all else None
    mqs, cids = _check_args(first_cid, mq_all, cid_all, blank_cid=blank_cid)
    first: dict[str, int] = {}
    for i, cid in enumerate(cids):
        if _java_is_blank(cid) if blank_cid else not cid:
            raise RmqAllocationError("currentCID is empty")
        first.setdefault(cid, i)
    return mqs, cids, first


def _check_sequence(value: Any, what: str) -> list:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise RmqAllocationError(f"{what} must be a list, got {type(value).__name__}")
    return list(value)


def _check_args(current_cid: Any, mq_all: Any, cid_all: Any, *, blank_cid: bool = False
                ) -> tuple[list[MessageQueue], list[str]]:
    """RocketMQ's common argument checks, in Java's order; returns list copies of the inputs.

    ``blank_cid`` selects ``StringUtils.isBlank`` (MACHINE_ROOM) instead of "null or empty".
    """
    if current_cid is None or (isinstance(current_cid, str)
                               and (_java_is_blank(current_cid) if blank_cid else not current_cid)):
        raise RmqAllocationError("currentCID is empty")
    if not isinstance(current_cid, str):
        raise RmqAllocationError(f"currentCID must be a str, got {current_cid!r}")
    if mq_all is None or (isinstance(mq_all, (list, tuple)) and not mq_all):
        raise RmqAllocationError("mqAll is null or mqAll empty")
    mqs = _check_sequence(mq_all, "mqAll")
    # The planner calls every slot's allocate with the same lists: check types in C first.
    if not set(map(type, mqs)) <= {MessageQueue}:
        for i, mq in enumerate(mqs):
            if not isinstance(mq, MessageQueue):
                raise RmqAllocationError(f"mqAll[{i}] is not a MessageQueue: {mq!r}")
    if cid_all is None or (isinstance(cid_all, (list, tuple)) and not cid_all):
        raise RmqAllocationError("cidAll is null or cidAll empty")
    cids = _check_sequence(cid_all, "cidAll")
    if not set(map(type, cids)) <= {str}:
        for i, cid in enumerate(cids):
            if not isinstance(cid, str):
                raise RmqAllocationError(f"cidAll[{i}] is not a str: {cid!r}")
    return mqs, cids


class AllocateMessageQueueAveragely(AllocationStrategy):
    """``AllocateMessageQueueAveragely`` ("AVG"): consecutive blocks, the first
    ``len(mq_all) % len(cid_all)`` consumers getting one queue more."""

    name = "AVG"

    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        mqs, cids = _check_args(current_cid, mq_all, cid_all)
        if current_cid not in cids:
            return []
        index = cids.index(current_cid)
        n_mq, n_cid = len(mqs), len(cids)
        mod = n_mq % n_cid
        bigger = mod > 0 and index < mod
        if n_mq <= n_cid:
            size = 1
        else:
            size = n_mq // n_cid + (1 if bigger else 0)
        start = index * size if bigger else index * size + mod
        count = min(size, n_mq - start)
        return [mqs[(start + i) % n_mq] for i in range(count)]

    def allocate_all(self, consumer_group, mq_all, cid_all):
        if isinstance(cid_all, (list, tuple)) and not cid_all:
            return {}
        mqs, cids, first = _check_all(mq_all, cid_all)
        n_mq, n_cid = len(mqs), len(cids)
        mod = n_mq % n_cid
        out = {}
        for cid, index in first.items():
            bigger = mod > 0 and index < mod
            size = 1 if n_mq <= n_cid else n_mq // n_cid + (1 if bigger else 0)
            start = index * size if bigger else index * size + mod
            out[cid] = [mqs[(start + i) % n_mq] for i in range(min(size, n_mq - start))]
        return out


class AllocateMessageQueueAveragelyByCircle(AllocationStrategy):
    """``AllocateMessageQueueAveragelyByCircle`` ("AVG_BY_CIRCLE"): queue i goes to consumer
    ``i % len(cid_all)``."""

    name = "AVG_BY_CIRCLE"

    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        mqs, cids = _check_args(current_cid, mq_all, cid_all)
        if current_cid not in cids:
            return []
        index = cids.index(current_cid)
        return mqs[index::len(cids)]

    def allocate_all(self, consumer_group, mq_all, cid_all):
        if isinstance(cid_all, (list, tuple)) and not cid_all:
            return {}
        mqs, cids, first = _check_all(mq_all, cid_all)
        return {cid: mqs[index::len(cids)] for cid, index in first.items()}


class AllocateMessageQueueByConfig(AllocationStrategy):
    """``AllocateMessageQueueByConfig`` ("CONFIG"): every consumer gets ``message_queues``.

    As in Java, the arguments are not examined at all: the configured list comes back verbatim
    (a copy), even for queues that are not in ``mq_all``.
    """

    name = "CONFIG"

    def __init__(self, message_queues: Iterable[MessageQueue]):
        if message_queues is None or isinstance(message_queues, (str, bytes, dict)):
            raise RmqOptionError("CONFIG strategy: message_queues must be a list of MessageQueue, "
                                 f"got {message_queues!r}")
        try:
            items = list(message_queues)
        except TypeError as exc:
            raise RmqOptionError("CONFIG strategy: message_queues must be a list of MessageQueue, "
                                 f"got {message_queues!r}") from exc
        self.message_queues = [_coerce_queue(mq, f"CONFIG strategy: message_queues[{i}]")
                               for i, mq in enumerate(items)]

    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        return list(self.message_queues)


class AllocateMessageQueueByMachineRoom(AllocationStrategy):
    """``AllocateMessageQueueByMachineRoom`` ("MACHINE_ROOM").

    Only queues whose broker name splits (Java ``split("@")``) into exactly two parts, the first
    in ``consume_rooms``, are allocated: ``len // len(cid_all)`` consecutive queues per consumer,
    the remainder handed out one each to the first consumers. A blank ``current_cid`` raises.
    """

    name = "MACHINE_ROOM"

    def __init__(self, consume_rooms: Iterable[str]):
        if consume_rooms is None or isinstance(consume_rooms, (str, bytes, dict)):
            raise RmqOptionError("MACHINE_ROOM strategy: consume_rooms must be a set of room names, "
                                 f"got {consume_rooms!r}")
        try:
            rooms = frozenset(consume_rooms)
        except TypeError as exc:
            raise RmqOptionError("MACHINE_ROOM strategy: consume_rooms must be a set of room "
                                 f"names, got {consume_rooms!r}") from exc
        for room in rooms:
            if not isinstance(room, str):
                raise RmqOptionError(f"MACHINE_ROOM strategy: consume_rooms entries must be str, "
                                     f"got {room!r}")
        self.consume_rooms = rooms

    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        mqs, cids = _check_args(current_cid, mq_all, cid_all, blank_cid=True)
        if current_cid not in cids:
            return []
        return self._share(self._eligible(mqs), cids.index(current_cid), len(cids))

    def allocate_all(self, consumer_group, mq_all, cid_all):
        if isinstance(cid_all, (list, tuple)) and not cid_all:
            return {}
        mqs, cids, first = _check_all(mq_all, cid_all, blank_cid=True)
        eligible = self._eligible(mqs)
        return {cid: self._share(eligible, index, len(cids)) for cid, index in first.items()}

    def _eligible(self, mqs: list[MessageQueue]) -> list[MessageQueue]:
        out = []
        for mq in mqs:
            parts = _java_split(mq.broker_name, "@")
            if len(parts) == 2 and parts[0] in self.consume_rooms:
                out.append(mq)
        return out

    @staticmethod
    def _share(eligible: list[MessageQueue], index: int, n_cids: int) -> list[MessageQueue]:
        per, rem = divmod(len(eligible), n_cids)
        result = eligible[per * index:per * index + per]
        if rem > index:
            result.append(eligible[index + per * n_cids])
        return result


class AtSignMachineRoomResolver:
    """Machine room = ``name.split("@")[0]`` in Java semantics, for brokers and clients alike.

    So the room is the text before the first ``@`` (the whole name when there is none). A name
    made only of ``@`` characters has no such part (Java: ArrayIndexOutOfBoundsException) and
    raises :class:`RmqAllocationError`; an empty result is rejected by the strategy.
    """

    @staticmethod
    def _room(name: str, what: str) -> str:
        parts = _java_split(name, "@")
        if not parts:
            raise RmqAllocationError(f"cannot resolve the machine room of {what} {name!r}: "
                                     "split(\"@\") leaves no part")
        return parts[0]

    def broker_deploy_in(self, mq: MessageQueue) -> str:
        return self._room(mq.broker_name, "broker")

    def consumer_deploy_in(self, cid: str) -> str:
        return self._room(cid, "consumer id")

    def __repr__(self) -> str:
        return "AtSignMachineRoomResolver()"


class AllocateMachineRoomNearby(AllocationStrategy):
    """``AllocateMachineRoomNearby`` ("MACHINE_ROOM_NEARBY"): a proxy around ``inner``.

    Queues of a room that has live consumers go (through ``inner``) only to that room's consumers;
    queues of rooms without consumers are shared (through ``inner``) by all consumers, rooms visited
    in Java String order. ``name`` is ``"MACHINE_ROOM_NEARBY-" + inner.name`` as in Java.

    ``inner``: a strategy object, a strategy name or ``"package.module:Class"``.
    ``resolver``: an object with ``broker_deploy_in(mq)`` and ``consumer_deploy_in(cid)``
    returning non-empty str, or ``"package.module:Class"`` (built without arguments); default
    :class:`AtSignMachineRoomResolver`.
    """

    def __init__(self, inner: Any, resolver: Any = None):
        self.inner = _as_strategy(inner, "MACHINE_ROOM_NEARBY strategy: inner")
        if resolver is None:
            resolver = AtSignMachineRoomResolver()
        elif isinstance(resolver, str):
            resolver = _instantiate(resolver, {}, "MACHINE_ROOM_NEARBY strategy: resolver")
        for method in ("broker_deploy_in", "consumer_deploy_in"):
            if not callable(getattr(resolver, method, None)):
                raise RmqOptionError(f"MACHINE_ROOM_NEARBY strategy: resolver {resolver!r} has no "
                                     f"{method}() method")
        self.resolver = resolver
        self.name = "MACHINE_ROOM_NEARBY-" + self.inner.name

    def _resolve(self, method: str, arg: Any, what: str) -> str:
        try:
            room = getattr(self.resolver, method)(arg)
        except RmqAllocationError:
            raise
        except Exception as exc:
            raise RmqAllocationError(f"machine room resolver failed for {what} {arg}: "
                                     f"{exc!r}") from exc
        if room is None or room == "":
            raise RmqAllocationError(f"Machine room is null for {what} {arg}")
        if not isinstance(room, str):
            raise RmqAllocationError(f"machine room resolver returned {room!r} (not a str) for "
                                     f"{what} {arg}")
        return room

    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        mqs, cids = _check_args(current_cid, mq_all, cid_all)
        if current_cid not in cids:
            return []
        queues_by_room: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            queues_by_room.setdefault(self._resolve("broker_deploy_in", mq, "mq"), []).append(mq)
        consumers_by_room: dict[str, list[str]] = {}
        for cid in cids:
            room = self._resolve("consumer_deploy_in", cid, "consumer id")
            consumers_by_room.setdefault(room, []).append(cid)

        result: list[MessageQueue] = []
        own_room = self._resolve("consumer_deploy_in", current_cid, "consumer id")
        own_queues = queues_by_room.pop(own_room, None)
        if own_queues:
            result.extend(self.inner.allocate(consumer_group, current_cid, own_queues,
                                              consumers_by_room.get(own_room)))
        for room in sorted(queues_by_room, key=java_string_key):
            if room not in consumers_by_room:
                result.extend(self.inner.allocate(consumer_group, current_cid,
                                                  queues_by_room[room], cids))
        return result

    def allocate_all(self, consumer_group, mq_all, cid_all):
        """The inner strategy allocates each room once for all of its consumers."""
        if isinstance(cid_all, (list, tuple)) and not cid_all:
            return {}
        # the first consumer's call resolves every room: its errors come before a later
        # consumer's empty id
        mqs, cids = _check_args(cid_all[0] if isinstance(cid_all, (list, tuple)) else None,
                                mq_all, cid_all)
        queues_by_room: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            queues_by_room.setdefault(self._resolve("broker_deploy_in", mq, "mq"), []).append(mq)
        room_of = {cid: self._resolve("consumer_deploy_in", cid, "consumer id") for cid in cids}
        _, _, first = _check_all(mqs, cids)
        consumers_by_room: dict[str, list[str]] = {}
        for cid in cids:
            consumers_by_room.setdefault(room_of[cid], []).append(cid)
        own = {room: self.inner.allocate_all(consumer_group, queues_by_room[room], room_cids)
               for room, room_cids in consumers_by_room.items() if queues_by_room.get(room)}
        shared = [self.inner.allocate_all(consumer_group, queues_by_room[room], cids)
                  for room in sorted(queues_by_room, key=java_string_key)
                  if room not in consumers_by_room]
        out = {}
        for cid in first:
            got = list(own.get(room_of[cid], {}).get(cid, ()))
            for by_cid in shared:
                got.extend(by_cid.get(cid, ()))
            out[cid] = got
        return out


class AllocateMessageQueueConsistentHash(AllocationStrategy):
    """``AllocateMessageQueueConsistentHash`` ("CONSISTENT_HASH").

    The ring holds ``virtual_node_count`` virtual nodes per consumer, keyed ``hash(cid + "-" + i)``
    (i continuing after replicas the consumer already has, so a repeated cid adds more); a later
    node overwrites an earlier one on a hash collision. A queue goes to the first virtual node at
    or after ``hash(mq.java_string())``, wrapping to the smallest key. ``hash_function(str) -> int`` (a Java
    long) defaults to :func:`md5_hash`. ``virtual_node_count=0`` allocates nothing.
    """

    name = "CONSISTENT_HASH"

    def __init__(self, virtual_node_count: int = 10,
                 hash_function: Callable[[str], int] | None = None):
        if (not isinstance(virtual_node_count, int) or isinstance(virtual_node_count, bool)
                or not 0 <= virtual_node_count <= _INT32_MAX):
            raise RmqOptionError("CONSISTENT_HASH strategy: virtual_node_count must be an int in "
                                 f"[0, {_INT32_MAX}], got {virtual_node_count!r}")
        if hash_function is not None and not callable(hash_function):
            raise RmqOptionError("CONSISTENT_HASH strategy: hash_function must be callable "
                                 f"(str -> int), got {hash_function!r}")
        self.virtual_node_count = virtual_node_count
        self.hash_function = hash_function

    def _hash(self, key: str) -> int:
        if self.hash_function is None:
            return md5_hash(key)
        try:
            value = self.hash_function(key)
        except Exception as exc:
            raise RmqAllocationError(f"hash_function failed for {key!r}: {exc!r}") from exc
        if (not isinstance(value, int) or isinstance(value, bool)
                or not _INT64_MIN <= value <= _INT64_MAX):
            raise RmqAllocationError(f"hash_function returned {value!r} for {key!r}; "
                                     "expected an int in the Java long range")
        return value

    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        mqs, cids = _check_args(current_cid, mq_all, cid_all)
        if current_cid not in cids:
            return []
        return self._owned(mqs, cids).get(current_cid, [])

    def allocate_all(self, consumer_group, mq_all, cid_all):
        """One ring for all consumers (a ring per consumer costs O(consumers x queues))."""
        if isinstance(cid_all, (list, tuple)) and not cid_all:
            return {}
        mqs, cids, first = _check_all(mq_all, cid_all)
        owned = self._owned(mqs, cids)
        return {cid: owned.get(cid, []) for cid in first}

    def _owned(self, mqs: list[MessageQueue], cids: list[str]) -> dict[str, list[MessageQueue]]:
        """Each consumer's queues on the ring of ``cids``, in ``mqs`` order."""
        ring: dict[int, str] = {}
        replicas: Counter[str] = Counter()
        for cid in cids:
            existing = replicas[cid]
            for i in range(self.virtual_node_count):
                point = self._hash(f"{cid}-{i + existing}")
                previous = ring.get(point)
                if previous is not None:
                    replicas[previous] -= 1
                ring[point] = cid
                replicas[cid] += 1
        out: dict[str, list[MessageQueue]] = {}
        if not ring:
            return out
        points = sorted(ring)
        for mq in mqs:
            at = bisect.bisect_left(points, self._hash(mq.java_string()))
            out.setdefault(ring[points[at] if at < len(points) else points[0]], []).append(mq)
        return out


# --------------------------------------------------------------------------------------------
# User strategies and the factory
# --------------------------------------------------------------------------------------------

class UserStrategy(AllocationStrategy):
    """Guard around a user-supplied strategy object.

    Exceptions from its ``allocate`` become :class:`RmqAllocationError` (cause attached); its
    result must be a ``list`` of :class:`MessageQueue` taken from ``mq_all``.
    """

    def __init__(self, target: Any, label: str):
        if not callable(getattr(target, "allocate", None)):
            raise RmqOptionError(f"{label}: {target!r} has no allocate() method")
        self.target = target
        self.label = label
        own_name = getattr(target, "name", None)
        self.name = own_name if isinstance(own_name, str) and own_name else label

    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        mqs = list(mq_all) if isinstance(mq_all, (list, tuple)) else mq_all
        cids = list(cid_all) if isinstance(cid_all, (list, tuple)) else cid_all
        try:
            result = self.target.allocate(consumer_group, current_cid, mqs, cids)
        except Exception as exc:
            raise RmqAllocationError(f"allocation strategy {self.label} failed for consumer "
                                     f"{current_cid!r}: {exc!r}") from exc
        if not isinstance(result, list):
            raise RmqAllocationError(f"allocation strategy {self.label} returned "
                                     f"{type(result).__name__}, expected a list of MessageQueue")
        allowed = set(mq_all) if isinstance(mq_all, (list, tuple)) else set()
        for item in result:
            if not isinstance(item, MessageQueue):
                raise RmqAllocationError(f"allocation strategy {self.label} returned {item!r}, "
                                         "which is not a MessageQueue")
            if item not in allowed:
                raise RmqAllocationError(f"allocation strategy {self.label} returned {item}, "
                                         "which is not in mq_all")
        return result


class AskedOnce(AllocationStrategy):
    """``inner`` asked at most once for each distinct set of arguments. A streaming reader wraps a
    user's strategy in a new one per batch, so planning a batch and building its tasks see the
    same allocation even when the user's answers change from call to call."""

    def __init__(self, inner: AllocationStrategy):
        self.inner = inner
        self.name = getattr(inner, "name", type(inner).__name__)
        self._answers: dict[tuple, list[MessageQueue]] = {}

    def allocate(self, consumer_group, current_cid, mq_all, cid_all):
        key = (consumer_group, current_cid, tuple(mq_all), tuple(cid_all))
        if key not in self._answers:
            self._answers[key] = list(self.inner.allocate(consumer_group, current_cid, mq_all, cid_all))
        return list(self._answers[key])


_BUILTINS = (AllocateMessageQueueAveragely, AllocateMessageQueueAveragelyByCircle,
             AllocateMessageQueueByConfig, AllocateMessageQueueByMachineRoom,
             AllocateMachineRoomNearby, AllocateMessageQueueConsistentHash)

# name -> (class, required parameters, optional parameters)
_REGISTRY: dict[str, tuple[type, tuple[str, ...], tuple[str, ...]]] = {
    "AVG": (AllocateMessageQueueAveragely, (), ()),
    "AVG_BY_CIRCLE": (AllocateMessageQueueAveragelyByCircle, (), ()),
    "CONFIG": (AllocateMessageQueueByConfig, ("message_queues",), ()),
    "MACHINE_ROOM": (AllocateMessageQueueByMachineRoom, ("consume_rooms",), ()),
    "MACHINE_ROOM_NEARBY": (AllocateMachineRoomNearby, ("inner",), ("resolver",)),
    "CONSISTENT_HASH": (AllocateMessageQueueConsistentHash, (),
                        ("virtual_node_count", "hash_function")),
}

STRATEGY_NAMES: tuple[str, ...] = tuple(_REGISTRY)

_VALID_NAMES = (", ".join(STRATEGY_NAMES) + " (case-insensitive), or 'package.module:Class' "
                "for a user strategy")


def _instantiate(spec: str, params: dict, option: str) -> Any:
    module_name, _, attr_path = spec.partition(":")
    if not module_name or not attr_path:
        raise RmqOptionError(f"{option}: {spec!r} is not 'package.module:Class'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise RmqOptionError(f"{option}: cannot import module {module_name!r} of {spec!r}: "
                             f"{exc!r}") from exc
    target: Any = module
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise RmqOptionError(f"{option}: {spec!r} not found ({module_name!r} has no "
                                 f"{attr_path!r})") from exc
    if not callable(target):
        raise RmqOptionError(f"{option}: {spec!r} is not a class")
    try:
        return target(**params)
    except Exception as exc:
        raise RmqOptionError(f"{option}: cannot create {spec!r} with parameters "
                             f"{sorted(params)}: {exc!r}") from exc


def _as_strategy(value: Any, option: str) -> AllocationStrategy:
    """A strategy object, name or spec as a strategy; user objects get the :class:`UserStrategy`
    guard."""
    if isinstance(value, str):
        return create_strategy(value)
    if type(value) in _BUILTINS or isinstance(value, UserStrategy):
        return value
    if value is None:
        raise RmqOptionError(f"{option} is required: a strategy object or one of {_VALID_NAMES}")
    return UserStrategy(value, f"{option} {type(value).__qualname__}")


def create_strategy(name: str, /, **params: Any) -> AllocationStrategy:
    """Build a strategy from RocketMQ's name (case-insensitive) or ``"package.module:Class"``.

    Parameters: CONFIG ``message_queues`` (required); MACHINE_ROOM ``consume_rooms`` (required);
    MACHINE_ROOM_NEARBY ``inner`` (required) and ``resolver``; CONSISTENT_HASH
    ``virtual_node_count`` (default 10) and ``hash_function``; AVG and AVG_BY_CIRCLE none. A user
    class is instantiated with ``**params`` and wrapped in :class:`UserStrategy`. Unknown names,
    unknown or missing parameters, and user classes that fail to import or build raise
    :class:`RmqOptionError`.
    """
    if not isinstance(name, str) or not name:
        raise RmqOptionError(f"allocation strategy: expected one of {_VALID_NAMES}, got {name!r}")
    entry = _REGISTRY.get(name.upper())
    if entry is not None:
        cls, required, optional = entry
        key = name.upper()
        unknown = sorted(set(params) - set(required) - set(optional))
        if unknown:
            valid = ", ".join(required + optional) or "none"
            raise RmqOptionError(f"allocation strategy {key}: unknown parameter(s) "
                                 f"{', '.join(unknown)}; valid parameters: {valid}")
        missing = [p for p in required if p not in params]
        if missing:
            raise RmqOptionError(f"allocation strategy {key}: missing required parameter(s) "
                                 f"{', '.join(missing)}")
        return cls(**params)
    if ":" in name:
        option = f"allocation strategy {name!r}"
        return UserStrategy(_instantiate(name, params, option), name)
    raise RmqOptionError(f"allocation strategy: unknown name {name!r}; valid values: {_VALID_NAMES}")
