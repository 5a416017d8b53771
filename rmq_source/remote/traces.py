"""RocketMQ message traces (option ``enableMsgTrace``): what a query consumed, what the sink sent.

A RocketMQ client with message traces on sends, for every message it consumes, a SubBefore and a
SubAfter context, and for every message it sends a Pub context, to the trace topic
(``RMQ_SYS_TRACE_TOPIC`` unless ``customizedTraceTopic``), many contexts to one trace message
whose keys are the traced messages' ids, so that ``mqadmin queryMsgTraceById -i <msgId>`` and the
Dashboard find them through the broker's key index. The contexts are those of RocketMQ's
``TraceDataEncoder`` (4.9 and 5.3 read the same form); the C core writes them for a whole batch
at once (native/core/traces.c has the byte layout). ``mqadmin`` shows per message the group, the
time, the cost and the status, and the host that sent the trace message. ``msgId`` is the id
RocketMQ's clients show for a message: its ``UNIQ_KEY``, else (consumed) the broker's ``msgId``.

Trace messages carry at most ``TRACE_BATCH`` contexts and ``KEYS_LIMIT`` bytes of keys (a broker
refuses properties over 32 KiB) and go without waiting (:class:`TraceSender`); the answers are
checked when the task ends. A trace that cannot be sent is logged and dropped, as RocketMQ's
clients drop theirs: traces never fail a query or a write.
"""
from __future__ import annotations

import itertools
import logging
import os
import time
import uuid
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa

from rmq_source.errors import RmqRemotingError, RmqSourceError
from rmq_source.native_columns import fill, lists, validity
from rmq_source.remote import requests as rq
from rmq_source.store.native import _raise, ffi, lib

log = logging.getLogger(__name__)

REGION = "DefaultRegion"             # what RocketMQ's clients write when no region is set
TRACE_BATCH = 1024                   # messages per trace message, at most
KEYS_LIMIT = 30 << 10                # bytes of the trace message's KEYS property, at most (< 32767)
_IN_FLIGHT = 16                      # trace messages sent and not yet answered, at most
C, F = "\x01", "\x02"


@dataclass
class Contexts:
    """The trace contexts of ``n`` messages: message ``i``'s context is
    ``data[ends[i-1]:ends[i]]`` (``ends[-1]`` taken as 0), the keys it is found by
    ``keys[key_ends[i-1]:key_ends[i]]`` (each key followed by a space)."""

    data: bytes | memoryview
    ends: np.ndarray
    keys: bytes | memoryview
    key_ends: np.ndarray

    @property
    def n(self) -> int:
        return len(self.ends)

    @staticmethod
    def join(parts: list["Contexts"]) -> "Contexts":
        if len(parts) == 1:
            return parts[0]
        data_at = np.cumsum([0] + [len(p.data) for p in parts[:-1]])
        keys_at = np.cumsum([0] + [len(p.keys) for p in parts[:-1]])
        return Contexts(b"".join(p.data for p in parts),
                        np.concatenate([p.ends + at for p, at in zip(parts, data_at)]),
                        b"".join(p.keys for p in parts),
                        np.concatenate([p.key_ends + at for p, at in zip(parts, keys_at)]))

    def _span(self, ends: np.ndarray, start: int, stop: int) -> tuple[int, int]:
        return (int(ends[start - 1]) if start else 0), int(ends[stop - 1])

    def slice(self, start: int, stop: int) -> "Contexts":
        a, b = self._span(self.ends, start, stop)
        ka, kb = self._span(self.key_ends, start, stop)
        return Contexts(self.data[a:b], self.ends[start:stop] - a, self.keys[ka:kb],
                        self.key_ends[start:stop] - ka)

    def body(self, start: int, stop: int) -> bytes | memoryview:
        """The trace message body of messages ``start .. stop - 1``."""
        a, b = self._span(self.ends, start, stop)
        return self.data[a:b]

    def keys_text(self, start: int, stop: int) -> str:
        """The KEYS property of the trace message of messages ``start .. stop - 1``."""
        a, b = self._span(self.key_ends, start, stop)
        return str(self.keys[a:b], "utf-8", "replace").strip()

    def chunks(self) -> list[tuple[int, int]]:
        """Message ranges of one trace message each: ``TRACE_BATCH`` messages and ``KEYS_LIMIT``
        key bytes at most (one message at least)."""
        sizes, out, start, n = self.key_ends, [], 0, self.n
        while start < n:
            base = sizes[start - 1] if start else 0
            fit = int(np.searchsorted(sizes, base + KEYS_LIMIT, side="right"))
            stop = min(n, start + TRACE_BATCH, max(fit, start + 1))
            out.append((start, stop))
            start = stop
        return out


def _texts(*texts: str):
    """(the C struct of the four texts, the memory it points to, the bytes a message's context
    takes besides its own fields, at most: the texts, numbers, separators and "null"s)."""
    raw = [t.encode() for t in texts]
    t = ffi.new("rmq_trace_texts *")
    keep = [ffi.new("char[]", r) for r in raw]
    for k, (r, c) in enumerate(zip(raw, keep)):
        t.text[k], t.len[k] = c, len(r)
    return t, keep, sum(map(len, raw)) + 40


def _run(fn, n: int, cap: int, keys_cap: int, *args) -> Contexts:
    # (np.empty: the C core writes every byte it reports; the views keep the arrays alive)
    out, keys = np.empty(max(cap, 1), np.uint8), np.empty(max(keys_cap, 1), np.uint8)
    ends, key_ends = np.empty(max(n, 1), np.int64), np.empty(max(n, 1), np.int64)
    err = ffi.new("rmq_error *")
    if fn(*args, ffi.from_buffer(out), cap, ffi.from_buffer("int64_t[]", ends), ffi.from_buffer(keys),
          keys_cap, ffi.from_buffer("int64_t[]", key_ends), err):
        _raise(err)
    ends, key_ends = ends[:n], key_ends[:n]
    return Contexts(memoryview(out)[:ends[-1] if n else 0], ends,
                    memoryview(keys)[:key_ends[-1] if n else 0], key_ends)


def _size(arr: pa.Array) -> int:
    return arr.buffers()[2].size if arr.buffers()[2] is not None else 0


def sub_contexts(batch: pa.RecordBatch, group: str, request_id: str, now_ms: int, cost_ms: int
                 ) -> Contexts:
    """The SubBefore and SubAfter contexts of each row of a batch read (its ``uniqKey``,
    ``msgId``, ``keys`` and ``reconsumeTimes`` columns)."""
    n, keep = batch.num_rows, []
    rows = ffi.new("rmq_trace_sub_rows *")
    rows.n = n
    uniq, msg_id, keys = batch.column("uniqKey"), batch.column("msgId"), batch.column("keys")
    fill(rows.uniq, uniq, keep)
    fill(rows.msg_id, msg_id, keep)
    key_bytes = 0
    if keys.null_count < n and len(keys.values):
        rows.key_lists, rows.key_lists_valid, _, _ = lists(keys, keep)
        rows.key_items = len(keys.values)
        fill(rows.keys, keys.values, keep)
        key_bytes = _size(keys.values) + len(keys.values)
    retries = batch.column("reconsumeTimes")
    if retries.null_count < n and retries.buffers()[1] is not None:
        values = np.frombuffer(retries.buffers()[1], np.int32)[retries.offset:retries.offset + n]
        keep.append(values)
        rows.retries = ffi.from_buffer("int32_t[]", values)
        valid = validity(retries)
        if valid is not None:
            keep.append(valid)
            rows.retries_valid = ffi.from_buffer("uint8_t[]", valid)
    now, req = str(now_ms), request_id
    texts, keep_texts, fixed = _texts(f"SubBefore{C}{now}{C}{REGION}{C}{group}{C}{req}{C}",
                                      f"{F}SubAfter{C}{req}{C}", f"{C}{cost_ms}{C}true{C}",
                                      f"{C}0{C}{now}{C}{group}{F}")
    ids = _size(uniq) + _size(msg_id)
    return _run(lib.rmq_trace_sub, n, n * fixed + 2 * (ids + key_bytes), n * 2 + ids + key_bytes,
                rows, texts)


def pub_contexts(encoded: bytes, count: int, offset_ids: str, *, group: str, topic: str,
                 store_host: str, region: str, sent_ms: int, cost_ms: int,
                 success: bool = True) -> Contexts:
    """The Pub contexts of the ``count`` messages of a SEND_BATCH_MESSAGE body the broker
    stored (``offset_ids``: its answer's ``msgId``, one per message, joined by commas;
    ``success``: it answered SEND_OK, as RocketMQ's producers record it)."""
    texts, keep, fixed = _texts(f"Pub{C}{sent_ms}{C}{region}{C}{group}{C}{topic}{C}",
                                f"{C}{store_host}{C}", f"{C}{cost_ms}{C}",
                                f"{C}{'true' if success else 'false'}{F}")
    ids = offset_ids.encode()
    return _run(lib.rmq_trace_pub, count, count * fixed + len(encoded) + len(ids),
                2 * count + len(encoded), encoded, len(encoded), count, ids, len(ids), texts)


class TraceSender:
    """Sends the trace messages of one task, round robin over the trace topic's writable queues
    (``queues()``: [(broker name, queue id)], asked once), without waiting: at most
    ``_IN_FLIGHT`` unanswered. ``send(broker, queue id, body, properties)`` starts a send and
    returns its call (answered through ``client``). Contexts wait until ``TRACE_BATCH`` of them
    are there (:meth:`add`) or the task ends (:meth:`close`)."""

    def __init__(self, topic: str, group: str, client, queues: Callable[[], list],
                 send: Callable):
        self.topic, self.group, self.client = topic, group, client
        self._queues_of, self._send_to = queues, send
        self._queues = None
        self._next = itertools.count()
        self._waiting: list[Contexts] = []
        self._waiting_n = 0
        self._pending: list = []              # (Call, messages)
        self._dropped = 0
        self._said = False

    def add(self, contexts: Contexts) -> None:
        if not contexts.n:
            return
        self._waiting.append(contexts)
        self._waiting_n += contexts.n
        if self._waiting_n >= TRACE_BATCH:
            self._flush(keep_tail=True)

    def _flush(self, keep_tail: bool) -> None:
        if not self._waiting:
            return
        joined = Contexts.join(self._waiting)
        self._waiting, self._waiting_n = [], 0
        chunks = joined.chunks()
        if keep_tail and chunks[-1][1] - chunks[-1][0] < TRACE_BATCH:
            tail = joined.slice(*chunks.pop())      # (sent with the next contexts, or at the end)
            self._waiting, self._waiting_n = [tail], tail.n
        for start, stop in chunks:
            self._send(joined.body(start, stop), joined.keys_text(start, stop), stop - start)

    def _send(self, body: bytes, keys: str, n: int) -> None:
        try:
            if self._queues is None:
                self._queues = list(self._queues_of())
                if not self._queues:
                    raise RmqRemotingError(f"trace topic {self.topic!r} has no writable queue")
            broker, queue_id = self._queues[next(self._next) % len(self._queues)]
            call = self._send_to(broker, queue_id, body, rq.props_bytes({"KEYS": keys, "WAIT": "true"}))
            self._pending.append((call, n))
            if len(self._pending) >= _IN_FLIGHT:
                self._settle(self._pending.pop(0))
        except RmqSourceError as exc:     # (no route, no master, no connection: dropped)
            self._drop(n, exc)

    def _settle(self, item) -> None:
        call, n = item
        try:
            self.client.answer(call)
        except RmqSourceError as exc:
            self._drop(n, exc)

    def _drop(self, n: int, exc: Exception) -> None:
        self._dropped += n
        if not self._said:
            self._said = True
            log.error("message traces of group %r to topic %r are dropped (traces never fail a "
                      "query or a write): %s", self.group, self.topic, exc)

    def close(self) -> None:
        """Sends what waits and checks every answer."""
        self._flush(keep_tail=False)
        while self._pending:
            self._settle(self._pending.pop(0))
        if self._dropped:
            log.error("message traces of %d message(s) were dropped (pid %d)", self._dropped,
                      os.getpid())

    def abandon(self) -> None:
        """The task failed: what waits is dropped, calls in flight are cancelled."""
        for call, _ in self._pending:
            call.cancel()
        self._pending, self._waiting, self._waiting_n = [], [], 0


def trace_producer_group(group: str) -> str:
    """The producer group the trace messages of ``group``'s traces are sent as."""
    return f"_INNER_TRACE_PRODUCER-{group}"


class ConsumeTraces:
    """The traces of one task reading: :meth:`record` each batch handed to Spark, :meth:`close`
    at the end. ``backend`` is the task's ClusterBackend; ``group`` the consumer group as
    RocketMQ's clients write it in traces (without the namespace)."""

    def __init__(self, backend, topic: str, group: str):
        self.group = group

        def queues():
            return [(b, q) for b, n in sorted(backend.route(topic).write_queues().items())
                    for q in range(n)]

        def send(broker, queue_id, body, props):
            return backend._call(broker, lambda addr: rq.send_one_call(
                backend.client, addr, topic, body, props, queue_id=queue_id,
                born_ms=int(time.time() * 1000), producer_group=trace_producer_group(group),
                broker_name=broker, binary_header=True))

        self.sender = TraceSender(topic, group, backend.client, queues, send)

    def record(self, batch: pa.RecordBatch, cost_ms: int) -> None:
        if batch.num_rows:
            self.sender.add(sub_contexts(batch, self.group, uuid.uuid4().hex.upper(),
                                         int(time.time() * 1000), cost_ms))

    def close(self) -> None:
        self.sender.close()
