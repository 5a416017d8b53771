"""Client namespaces, as RocketMQ's clients apply them (``NamespaceUtil``, 4.9.7 and 5.3.3).

A client with namespace ``ns`` names resource ``R`` on the brokers as ``ns%R``; a retry or
dead-letter name keeps its prefix in front: ``%RETRY%g`` -> ``%RETRY%ns%g``, ``%DLQ%g`` ->
``%DLQ%ns%g``. Left alone: system topics and groups (:func:`is_system_resource`) and names that
already carry the namespace (``ns%R``, ``%RETRY%ns%g``), so wrapping twice changes nothing.
Messages show their topic unwrapped (what the Java client's ``MessageExt.getTopic()`` returns):
a topic of this namespace loses the ``ns%`` after its retry/DLQ prefix; any other is shown as
stored.
"""
from __future__ import annotations

import re

import pyarrow as pa

RETRY_PREFIX, DLQ_PREFIX = "%RETRY%", "%DLQ%"
SEPARATOR = "%"
#: a namespace's characters: a topic's, without the separator (Java accepts anything, but a
#: ``%`` inside would move where the client cuts the name apart again)
NAMESPACE_RE = re.compile(r"[A-Za-z0-9_-]+")

#: TopicValidator.SYSTEM_TOPIC_SET of 5.3.3 (4.9.7's lacks CHECKPOINT_TOPIC), and the prefixes
#: of system topics and system consumer groups (TopicValidator.SYSTEM_TOPIC_PREFIX,
#: MixAll.CID_RMQ_SYS_PREFIX)
SYSTEM_TOPICS = frozenset({
    "TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRACE_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC",
    "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT", "CHECKPOINT_TOPIC"})
SYSTEM_TOPIC_PREFIX, SYSTEM_GROUP_PREFIX = "rmq_sys_", "CID_RMQ_SYS_"


def is_system_resource(name: str) -> bool:
    """A system topic or group, never wrapped (``NamespaceUtil.isSystemResource``)."""
    return name in SYSTEM_TOPICS or name.startswith((SYSTEM_TOPIC_PREFIX, SYSTEM_GROUP_PREFIX))


def _split_prefix(name: str) -> tuple[str, str]:
    """(retry or DLQ prefix or "", the rest)."""
    for prefix in (RETRY_PREFIX, DLQ_PREFIX):
        if name.startswith(prefix):
            return prefix, name[len(prefix):]
    return "", name


def has_namespace(name: str, namespace: str | None) -> bool:
    """Whether ``name`` (a topic or group on the brokers) belongs to ``namespace``."""
    if not namespace or not name or is_system_resource(name):
        return False
    return _split_prefix(name)[1].startswith(namespace + SEPARATOR)


def wrap(namespace: str | None, name: str) -> str:
    """``name`` as a client of ``namespace`` names it on the brokers (module doc)."""
    if not namespace or not name or is_system_resource(name) or has_namespace(name, namespace):
        return name
    prefix, rest = _split_prefix(name)
    return f"{prefix}{namespace}{SEPARATOR}{rest}"


def unwrap(namespace: str | None, name: str) -> str:
    """What a client of ``namespace`` shows for ``name`` on the brokers: a name of the namespace
    loses it, any other is returned as it is (``NamespaceUtil.withoutNamespace(name, ns)``)."""
    if not has_namespace(name, namespace):
        return name
    prefix, rest = _split_prefix(name)
    return prefix + rest[len(namespace) + 1:]


def unwrap_topic_column(batch: pa.RecordBatch, namespace: str | None) -> pa.RecordBatch:
    """``batch`` with its ``topic`` column unwrapped (:func:`unwrap`), without a loop over rows:
    a batch holds the rows of a few queues, so each distinct topic is unwrapped once."""
    if not namespace or batch.num_rows == 0:
        return batch
    index = batch.schema.get_field_index("topic")
    if index < 0:
        return batch
    column = batch.column(index)
    import pyarrow.compute as pc   # slow to import: only where used
    stored = pc.unique(column).to_pylist()
    shown = [unwrap(namespace, t) if t is not None else None for t in stored]
    if shown == stored:
        return batch
    positions = pc.index_in(column, value_set=pa.array(stored, column.type))
    new = pc.take(pa.array(shown, column.type), positions)
    return batch.set_column(index, batch.schema.field(index), new)


class NamespacedPattern:
    """A ``topicPattern`` read within a namespace: it matches a topic of the namespace whose
    shown name (:func:`unwrap`) matches the user's expression in whole; topics of other
    namespaces and without one never match. Quacks like the ``re.Pattern`` it wraps."""

    def __init__(self, pattern: re.Pattern, namespace: str):
        self.regex = pattern
        self.namespace = namespace

    @property
    def pattern(self) -> str:
        return self.regex.pattern

    def fullmatch(self, topic: str):
        if not has_namespace(topic, self.namespace):
            return None
        return self.regex.fullmatch(unwrap(self.namespace, topic))

    def __eq__(self, other) -> bool:
        return (isinstance(other, NamespacedPattern) and other.regex == self.regex
                and other.namespace == self.namespace)

    def __hash__(self) -> int:
        return hash((self.regex, self.namespace))

    def __repr__(self) -> str:
        return f"NamespacedPattern({self.regex.pattern!r}, namespace={self.namespace!r})"
