"""Parsers of one option value of each kind (integers, booleans, durations, lists, offsets
JSON, timestamps, NameServer addresses). Every failure raises
:class:`~rmq_source.errors.RmqOptionError` naming the option, the value given and what is valid;
the rules between options are :mod:`rmq_source.spark.options`'s."""
from __future__ import annotations

import json
import os
import re
import socket
import time
import uuid
from datetime import datetime
from typing import Any, Mapping

from rmq_source.errors import RmqOptionError
from rmq_source.group.allocation import MessageQueue
from rmq_source.group.offset_store import BROKER_NAME_RE
from rmq_source.namespace import NAMESPACE_RE, wrap
from rmq_source.store.native import MAX_QUEUE_OFFSET

EARLIEST, LATEST, GROUP = "earliest", "latest", "group"
JSON_EARLIEST, JSON_LATEST = -2, -1
INT64_MAX = (1 << 63) - 1


NAME_RE = re.compile(r"[%|a-zA-Z0-9_-]+")          # RocketMQ topic/group characters
CLIENT_ID_RE = re.compile(r"[A-Za-z0-9_.:@#%|-]+")
INT_RE = re.compile(r"-?[0-9]+")
QUEUE_ID_RE = re.compile(r"[0-9]+")
DURATION_RE = re.compile(r"([0-9]+)\s*(ms|s|m|min|h|d)")
DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
CLASS_SPEC_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


# ------------------------------------------------------------------------------------------
# Helpers: every failure names the option, the value and what is valid
# ------------------------------------------------------------------------------------------

#: Option names whose values never appear in errors (a misspelled secret option included).
SECRET_NAME_RE = re.compile(r"(?i)secret|password|token")


def fail(name: str, value: Any, valid: str) -> RmqOptionError:
    return RmqOptionError(f"option {name}: invalid value {value!r}; {valid}")


def int_option(name: str, value: str, *, minimum: int, maximum: int = INT64_MAX) -> int:
    text = value.strip()
    if not INT_RE.fullmatch(text):
        raise fail(name, value, f"expected an integer in [{minimum}, {maximum}] (digits only)")
    number = int(text)
    if not minimum <= number <= maximum:
        raise fail(name, value, f"expected an integer in [{minimum}, {maximum}]")
    return number


def bool_option(name: str, value: str) -> bool:
    text = value.strip().lower()
    if text not in ("true", "false"):
        raise fail(name, value, "expected true or false")
    return text == "true"


def choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    text = value.strip().upper()
    if text not in choices:
        raise fail(name, value, "expected one of " + ", ".join(choices))
    return text


def duration_ms(name: str, value: str) -> int:
    m = DURATION_RE.fullmatch(value.strip().lower())
    if not m or int(m.group(1)) == 0:
        raise fail(name, value, "expected a positive duration: an integer with unit ms, s, m, h "
                                 "or d (e.g. 500ms, 30s, 15m, 1h)")
    ms = int(m.group(1)) * DURATION_MS[m.group(2)]
    if ms > INT64_MAX:
        raise fail(name, value, f"expected a positive duration of at most {INT64_MAX} ms")
    return ms


def comma_list(name: str, value: str, *, pattern: re.Pattern | None, what: str) -> tuple[str, ...]:
    items = [item.strip() for item in value.split(",")]
    if not value.strip() or any(not item for item in items):
        raise fail(name, value, f"expected a comma-separated list of {what} without empty entries")
    for item in items:
        if pattern is not None and not pattern.fullmatch(item):
            raise fail(name, value, f"{what} {item!r} has characters outside "
                                     f"{pattern.pattern}")
    dupes = sorted({item for item in items if items.count(item) > 1})
    if dupes:
        raise fail(name, value, f"{what} listed more than once: {', '.join(dupes)}")
    return tuple(items)


def topic_name(name: str, value: str, topic: Any) -> str:
    if not isinstance(topic, str) or not NAME_RE.fullmatch(topic):
        raise fail(name, value, f"topic {topic!r} is not a topic name (characters "
                                 "[%|a-zA-Z0-9_-], non-empty)")
    return topic


def namespace_option(name: str, value: str) -> str:
    text = value.strip()
    if not NAMESPACE_RE.fullmatch(text):
        raise fail(name, value, "expected a namespace of characters [A-Za-z0-9_-] (it is put in "
                                "front of every topic and group as <namespace>%<name>)")
    return text


def wrap_names(namespace: str | None, name: str, value: str, names: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` (topics of option ``name``) wrapped in ``namespace``; two that become one fail."""
    wrapped = tuple(wrap(namespace, n) for n in names)
    same = sorted({w for w in wrapped if wrapped.count(w) > 1})
    if same:
        raise fail(name, value, f"topics listed more than once in namespace {namespace}: "
                                + ", ".join(same))
    return wrapped


def _wrap_keys(namespace: str | None, name: str, value: str, table: dict, rekey, shown) -> dict:
    """``table`` with each key ``rekey``-ed into ``namespace``; two keys that become one fail
    (``shown(key)`` names it)."""
    if not namespace:
        return table
    out = {}
    for key, entry in table.items():
        new = rekey(key)
        if new in out:
            raise fail(name, value, f"{shown(new)} is named twice in namespace {namespace}")
        out[new] = entry
    return out


def wrap_topic_keys(namespace: str | None, name: str, value: str, table: dict) -> dict:
    """``{topic: ...}`` with its topics wrapped in ``namespace``; two that become one fail."""
    return _wrap_keys(namespace, name, value, table, lambda t: wrap(namespace, t), lambda t: f"topic {t}")


def wrap_queue_keys(namespace: str | None, name: str, value: str, offsets: dict) -> dict:
    """``{MessageQueue: offset}`` with its topics wrapped in ``namespace``; two queues that
    become one fail."""
    return _wrap_keys(namespace, name, value, offsets,
                      lambda mq: MessageQueue(wrap(namespace, mq.topic), mq.broker_name, mq.queue_id),
                      lambda mq: f"queue {mq.topic}/{mq.broker_name}/{mq.queue_id}")


def json_object(name: str, value: str, shape: str) -> dict:
    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise fail(name, value, f"JSON key(s) given twice: {', '.join(dupes)}; expected {shape}")
        return dict(pairs)
    try:
        obj = json.loads(value, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as exc:
        raise fail(name, value, f"not valid JSON ({exc.msg} at position {exc.pos}); "
                                 f"expected {shape}") from None
    if not isinstance(obj, dict) or not obj:
        raise fail(name, value, f"expected a non-empty JSON object {shape}")
    return obj


def check_broker(name: str, value: str, broker: str, brokers: Mapping[str, str]) -> None:
    """``broker`` must be configured; with namesrvAddr (no brokers configured: the cluster's come
    from its NameServers at query start) only its name is checked here."""
    if not brokers:
        if not BROKER_NAME_RE.fullmatch(broker):
            raise fail(name, value, f"broker name {broker!r} has characters outside "
                                     "[A-Za-z0-9_%|@.-] or starts with '.'")
        return
    if broker not in brokers:
        raise fail(name, value, f"broker {broker!r} is not configured; configured brokers: "
                                 f"{', '.join(brokers)}")


def parse_queue_json(name: str, value: str, brokers: Mapping[str, str]
                      ) -> dict[str, dict[str, tuple[int, ...]]]:
    """``{"topic":{"broker":[queueIds]}}`` -> the same as dict of tuples (order kept)."""
    shape = '{"topic":{"broker":[queueIds]}}'
    out: dict[str, dict[str, tuple[int, ...]]] = {}
    for topic, by_broker in json_object(name, value, shape).items():
        topic_name(name, value, topic)
        if not isinstance(by_broker, dict) or not by_broker:
            raise fail(name, value, f"topic {topic!r} must map to a non-empty object; expected {shape}")
        out[topic] = {}
        for broker, qids in by_broker.items():
            check_broker(name, value, broker, brokers)
            if not isinstance(qids, list) or not qids:
                raise fail(name, value, f"{topic}/{broker} must map to a non-empty list of queue "
                                         f"ids; expected {shape}")
            for qid in qids:
                if isinstance(qid, bool) or not isinstance(qid, int) or not 0 <= qid < (1 << 31):
                    raise fail(name, value, f"queue id {qid!r} of {topic}/{broker} is not an "
                                             "integer in [0, 2147483647]")
            if len(set(qids)) != len(qids):
                raise fail(name, value, f"{topic}/{broker} lists a queue id more than once")
            out[topic][broker] = tuple(qids)
    return out


def parse_offsets_json(name: str, value: str, brokers: Mapping[str, str], *, allow_earliest: bool,
                        allow_latest: bool, unit: str = "offset") -> dict[MessageQueue, int]:
    """{queue: value} of ``{"topic":{"broker":{"queueId":value}}}``; ``unit`` names the values
    ("offset", or "timestamp" for epoch ms, which allows neither -2 nor -1)."""
    shape = f'{{"topic":{{"broker":{{"queueId":{unit}}}}}}}'
    lowest = JSON_EARLIEST if allow_earliest else (JSON_LATEST if allow_latest else 0)
    valid = f"{unit}s must be integers >= {lowest}"
    if allow_earliest:
        valid += " (-2 = earliest" + (", -1 = latest)" if allow_latest else ")")
    elif allow_latest:
        valid += " (-1 = latest)"
    out: dict[MessageQueue, int] = {}
    for topic, by_broker in json_object(name, value, shape).items():
        topic_name(name, value, topic)
        if not isinstance(by_broker, dict) or not by_broker:
            raise fail(name, value, f"topic {topic!r} must map to a non-empty object; expected {shape}")
        for broker, by_queue in by_broker.items():
            check_broker(name, value, broker, brokers)
            if not isinstance(by_queue, dict) or not by_queue:
                raise fail(name, value, f"{topic}/{broker} must map to a non-empty object of "
                                         f"queueId: {unit}; expected {shape}")
            for qid_text, offset in by_queue.items():
                if not QUEUE_ID_RE.fullmatch(qid_text) or int(qid_text) >= (1 << 31):
                    raise fail(name, value, f"queue id {qid_text!r} of {topic}/{broker} is not an "
                                             "integer in [0, 2147483647]")
                if isinstance(offset, bool) or not isinstance(offset, int):
                    raise fail(name, value, f"{unit} {offset!r} of {topic}/{broker}/{qid_text} is "
                                             f"not an integer; {valid}")
                if offset == JSON_LATEST and not allow_latest:
                    raise fail(name, value, f"offset -1 (latest) of {topic}/{broker}/{qid_text} is "
                                             f"not allowed here; {valid}")
                if offset < lowest:
                    raise fail(name, value, f"{unit} {offset} of {topic}/{broker}/{qid_text}; {valid}")
                if offset > MAX_QUEUE_OFFSET:
                    what = ("queue offset", " (a unit's ConsumeQueue address, offset * 20, is a "
                            "64-bit integer)") if unit == "offset" else (unit, "")
                    raise fail(name, value, f"{unit} {offset} of {topic}/{broker}/{qid_text} is above "
                                             f"the largest {what[0]} {MAX_QUEUE_OFFSET}{what[1]}")
                mq = MessageQueue(topic, broker, int(qid_text))
                if mq in out:
                    raise fail(name, value, f"queue {topic}/{broker}/{int(qid_text)} is listed twice")
                out[mq] = offset
    return out


def consume_timestamp_ms(name: str, value: str) -> int:
    text = value.strip()
    try:
        if not re.fullmatch(r"[0-9]{14}", text):
            raise ValueError
        moment = datetime(int(text[0:4]), int(text[4:6]), int(text[6:8]), int(text[8:10]),
                          int(text[10:12]), int(text[12:14]))
    except ValueError:
        raise fail(name, value, "expected yyyyMMddHHmmss (14 digits, a real local date and "
                                 "time), e.g. 20240131235959") from None
    return int(time.mktime(moment.timetuple())) * 1000


def default_client_id() -> str:
    """A client id unique to this process and call: ``rmq_source-<host>-<pid>-<random>``."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "host"
    return f"rmq_source-{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def parse_namesrv_addr(value: str) -> tuple[str, ...]:
    """``host:port;host:port`` -> the addresses, in the order they are tried."""
    addrs = tuple(a.strip() for a in str(value).split(";") if a.strip())
    for a in addrs:
        host, _, port = a.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise fail("namesrvAddr", value, f"{a!r} is not host:port; expected host:port[;host:port...]")
    if not addrs:
        raise fail("namesrvAddr", value, "expected host:port[;host:port...]")
    return addrs
