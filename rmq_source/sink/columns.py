"""The DataFrame columns the sink takes, checked once at query start, and the rows of an Arrow
batch turned into :class:`Outgoing` messages in the task.

Columns (by exact name; any other column is an error): ``body`` binary or string (required,
never null), ``topic`` string, ``tags`` string, ``keys`` string (space-separated, as RocketMQ
stores them) or array of strings, ``properties`` map of string to string, ``queueId`` integer
with optional ``brokerName`` string (an explicit queue), ``shardingKey`` string (the queue is
chosen by hash, :mod:`.routing`), ``delayTimeLevel`` integer (0 or null: none).
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
from pyspark.sql import types as T

from rmq_source.errors import RmqSinkRowError, RmqSinkSchemaError
from rmq_source.namespace import wrap
from rmq_source.spark.option_values import NAME_RE
from rmq_source.sink.uniq import TaskKeys

_STR = (T.StringType,)
_INT = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
COLUMN_TYPES: dict[str, str] = {
    "body": "binary or string", "topic": "string", "tags": "string",
    "keys": "string or array<string>", "properties": "map<string,string>", "queueId": "integer",
    "brokerName": "string", "shardingKey": "string", "delayTimeLevel": "integer",
}

#: property names RocketMQ reserves (MessageConst.STRING_HASH_SET of 5.3, a superset of 4.9's);
#: the sink sets TAGS, KEYS, UNIQ_KEY, WAIT and DELAY itself from the columns
RESERVED_PROPERTIES = frozenset((
    "TRACE_ON", "MSG_REGION", "KEYS", "TAGS", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC",
    "REAL_QID", "TRAN_MSG", "PGROUP", "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID", "ORIGIN_MESSAGE_ID",
    "TRANSFER_FLAG", "CORRECTION_FLAG", "MQ2_FLAG", "RECONSUME_TIME", "UNIQ_KEY",
    "MAX_RECONSUME_TIMES", "CONSUME_START_TIME", "POP_CK", "POP_CK_OFFSET", "1ST_POP_TIME",
    "TRAN_PREPARED_QUEUE_OFFSET", "DUP_INFO", "EXTEND_UNIQ_INFO", "INSTANCE_ID", "CORRELATION_ID",
    "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME", "PUSH_REPLY_TIME", "CLUSTER", "MSG_TYPE",
    "INNER_MULTI_QUEUE_OFFSET", "TIMER_DELAY_MS", "TIMER_DELAY_SEC", "TIMER_DELIVER_MS",
    "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES", "TIMER_OUT_MS",
    "TIMER_DEL_UNIQKEY", "TIMER_DELAY_LEVEL", "__BORNHOST", "BORN_TIMESTAMP", "DLQ_ORIGIN_TOPIC",
    "DLQ_ORIGIN_MESSAGE_ID", "__CRC32#"))
_SEPARATORS = ("\x01", "\x02")
MAX_PROPERTIES_BYTES = 32767          # the record keeps their length in a signed short


def _fits(name: str, dtype: T.DataType) -> bool:
    if name == "body":
        return isinstance(dtype, (T.BinaryType, T.StringType))
    if name == "keys":
        return isinstance(dtype, _STR) or (isinstance(dtype, T.ArrayType)
                                           and isinstance(dtype.elementType, _STR))
    if name == "properties":
        return (isinstance(dtype, T.MapType) and isinstance(dtype.keyType, _STR)
                and isinstance(dtype.valueType, _STR))
    if name in ("queueId", "delayTimeLevel"):
        return isinstance(dtype, _INT)
    return isinstance(dtype, _STR)


def check_schema(schema: T.StructType, *, default_topic: str | None) -> tuple[str, ...]:
    """The columns of ``schema`` the sink will read, or :class:`RmqSinkSchemaError` naming the
    first column that is unknown, repeated or of a type that does not fit, a missing body, or no
    topic at all (neither a topic column nor the option)."""
    names = [f.name for f in schema.fields]
    for field in schema.fields:
        if field.name not in COLUMN_TYPES:
            close = difflib.get_close_matches(field.name.lower(), [c.lower() for c in COLUMN_TYPES], n=1)
            hint = ""
            if close:
                hint = f" (did you mean {next(c for c in COLUMN_TYPES if c.lower() == close[0])}?)"
            raise RmqSinkSchemaError(
                f"column {field.name!r} ({field.dataType.simpleString()}) is not a column the rmq "
                f"sink writes{hint}; its columns: " + ", ".join(f"{k} ({v})" for k, v in COLUMN_TYPES.items())
                + ". Select or drop columns before writing.")
        if names.count(field.name) > 1:
            raise RmqSinkSchemaError(f"column {field.name!r} appears more than once")
        if not _fits(field.name, field.dataType):
            raise RmqSinkSchemaError(f"column {field.name!r} has type {field.dataType.simpleString()}; "
                                     f"the rmq sink takes {COLUMN_TYPES[field.name]} there")
    if "body" not in names:
        raise RmqSinkSchemaError("the DataFrame has no column 'body' (binary or string): the message "
                                 f"bodies; its columns: {', '.join(names) or '(none)'}")
    if "topic" not in names and default_topic is None:
        raise RmqSinkSchemaError("no topic: give the option topic, or a column 'topic' (string)")
    if "brokerName" in names and "queueId" not in names:
        raise RmqSinkSchemaError("column 'brokerName' only applies with a column 'queueId' (it names "
                                 "the broker of the explicit queue)")
    return tuple(names)


@dataclass(slots=True)
class Outgoing:
    """One message on its way. ``row`` is its index among the task's rows (0-based, input order);
    ``pin`` is None (any queue), ``("hash", key)`` or ``("queue", brokerName or None, queueId)``."""

    row: int
    topic: str
    body: bytes
    props: bytes
    pin: tuple | None
    delayed: bool

    @property
    def size(self) -> int:
        return 22 + len(self.body) + len(self.props)


def _props(row_error, tags, keys, user: list | None, uniq: str, delay: int | None) -> bytes:
    if tags is None and keys is None and not user and not delay:
        return f"UNIQ_KEY\x01{uniq}\x02WAIT\x01true\x02".encode()
    parts = []
    if user:
        for name, value in user:
            if name is None or value is None or not name.strip() or not value.strip():
                raise row_error(f"property {name!r}: names and values must be non-blank strings "
                                "(as RocketMQ's Message.putUserProperty requires)")
            if name in RESERVED_PROPERTIES:
                raise row_error(f"property {name!r} is reserved by RocketMQ; use the columns tags, "
                                "keys, delayTimeLevel for those, or another name")
            if any(s in name or s in value for s in _SEPARATORS):
                raise row_error(f"property {name!r} contains \\x01 or \\x02, which separate properties")
            parts.append(f"{name}\x01{value}\x02")
    if tags is not None:
        if any(s in tags for s in _SEPARATORS):
            raise row_error("tags contain \\x01 or \\x02, which separate properties")
        parts.append(f"TAGS\x01{tags}\x02")
    if keys is not None:
        if not isinstance(keys, str):
            for k in keys:
                if k is None or not k or " " in k:
                    raise row_error(f"key {k!r} in the keys array: each key must be a non-empty "
                                    "string without spaces (RocketMQ keeps keys space-separated)")
            keys = " ".join(keys)
        if keys:
            if any(s in keys for s in _SEPARATORS):
                raise row_error("keys contain \\x01 or \\x02, which separate properties")
            parts.append(f"KEYS\x01{keys}\x02")
    if delay:
        parts.append(f"DELAY\x01{delay}\x02")
    parts.append(f"UNIQ_KEY\x01{uniq}\x02WAIT\x01true\x02")
    data = "".join(parts).encode()
    if len(data) > MAX_PROPERTIES_BYTES:
        raise row_error(f"its properties take {len(data)} bytes encoded; a message holds at most "
                        f"{MAX_PROPERTIES_BYTES}")
    return data


def _column(batch: pa.RecordBatch, name: str, n: int) -> list:
    idx = batch.schema.get_field_index(name)
    return [None] * n if idx < 0 else batch.column(idx).to_pylist()


class _RowError:
    """Builds the error of one row (made only when a row fails)."""

    __slots__ = ("partition", "row")

    def __init__(self, partition: int):
        self.partition, self.row = partition, 0

    def __call__(self, what: str) -> RmqSinkRowError:
        return RmqSinkRowError(f"partition {self.partition}, row {self.row}: {what}; nothing was sent "
                               "for this row (the rows before it may have been)")


def messages(batch: pa.RecordBatch, *, first_row: int, partition: int, keys: TaskKeys,
             default_topic: str | None, max_message_bytes: int,
             namespace: str | None = None) -> Iterator[Outgoing]:
    """The rows of ``batch`` (the task's rows ``first_row ...``) as messages; the first row that
    cannot be one raises :class:`RmqSinkRowError` naming the partition and row. A row's topic is
    wrapped in ``namespace`` (``default_topic`` already is)."""
    n = batch.num_rows
    row_error = _RowError(partition)
    key_of = keys.key
    cols = [_column(batch, name, n) for name in ("body", "topic", "tags", "keys", "properties",
                                                 "queueId", "brokerName", "shardingKey",
                                                 "delayTimeLevel")]
    on_brokers: dict = {}                   # a row's topic -> the name it is sent to
    for row, (body, topic, tags, keys_v, props, qid, broker, shard, delay) in enumerate(zip(*cols), first_row):
        row_error.row = row
        if body is None:
            raise row_error("body is null (every message needs a body)")
        if body.__class__ is str:
            body = body.encode()
        if not body:
            raise row_error("body is empty (RocketMQ takes no message without body bytes: the Java "
                            "client refuses one, a 5.x broker fails on it)")
        if len(body) > max_message_bytes:
            raise row_error(f"body of {len(body)} bytes exceeds maxMessageBytes ({max_message_bytes}: "
                            "the broker's maxMessageSize); split it or raise both limits")
        if topic is None:
            topic = default_topic
            if topic is None:
                raise row_error("topic is null and the option topic is not given")
        wrapped = on_brokers.get(topic)
        if wrapped is None:
            wrapped = wrap(namespace, topic)
            if not NAME_RE.fullmatch(topic) or len(wrapped) > 127:
                raise row_error(f"topic {topic!r} is not a topic name (1-127 characters of [%|a-zA-Z0-9_-]"
                                + (f", {wrapped!r} in namespace {namespace}" if wrapped != topic else "")
                                + ")")
            on_brokers[topic] = wrapped
        topic = wrapped
        pin = None
        if qid is not None:
            if shard is not None:
                raise row_error("both queueId and shardingKey are set; a message goes to one queue")
            if qid < 0:
                raise row_error(f"queueId {qid} is negative")
            pin = ("queue", broker, int(qid))
        elif broker is not None:
            raise row_error("brokerName is set without queueId")
        elif shard is not None:
            pin = ("hash", shard)
        if delay is not None and delay < 0:
            raise row_error(f"delayTimeLevel {delay} is negative (0 or null: no delay; levels are "
                            "1..N of the broker's messageDelayLevel)")
        data = _props(row_error, tags, keys_v, props, key_of(row), delay)
        yield Outgoing(row, topic, body, data, pin, bool(delay))
