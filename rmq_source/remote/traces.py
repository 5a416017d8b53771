"""RocketMQ message traces of what a query consumed (option ``enableMsgTrace``).

A RocketMQ consumer with message traces on sends, for every message it consumes, a SubBefore and
a SubAfter context to the trace topic (``RMQ_SYS_TRACE_TOPIC`` unless ``customizedTraceTopic``),
many contexts to one trace message whose keys are the traced messages' ids, so that
``mqadmin queryMsgTraceById -i <msgId>`` and the Dashboard find them through the broker's key
index. The contexts, as RocketMQ's ``TraceDataEncoder`` writes them (\\1 and \\2 are the
characters 1 and 2; 4.9 and 5.3 read the same form)::

    SubBefore \\1 time \\1 region \\1 group \\1 requestId \\1 msgId \\1 retryTimes \\1 keys \\2
    SubAfter \\1 requestId \\1 msgId \\1 costMs \\1 true \\1 keys \\1 0 \\1 time \\1 group \\2

``mqadmin`` shows per message the group, the time and cost of its SubAfter and the host that sent
the trace message. ``msgId`` is the id RocketMQ's clients show for a consumed message: its
``UNIQ_KEY`` (``uniqKey``), else the broker's ``msgId``.

A task records each Arrow batch it hands to Spark (:class:`ConsumeTraces`): the contexts are built
column-wise (pyarrow, no per-row Python), at most ``TRACE_BATCH`` messages and ``KEYS_LIMIT``
bytes of keys per trace message (a broker refuses properties over 32 KiB), sent without waiting;
the answers are checked when the task ends. A trace that cannot be sent is logged and dropped, as
RocketMQ's clients drop theirs: traces never fail a query.
"""
from __future__ import annotations

import itertools
import logging
import os
import time
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rmq_source.errors import RmqRemotingError
from rmq_source.remote import requests as rq

log = logging.getLogger(__name__)

REGION = "DefaultRegion"             # what RocketMQ's clients write when no region is set
TRACE_BATCH = 1024                   # messages per trace message, at most
KEYS_LIMIT = 30 << 10                # bytes of the trace message's KEYS property, at most (< 32767)
_IN_FLIGHT = 16                      # trace messages sent and not yet answered, at most
C, F = "\x01", "\x02"


def _text(values: pa.Array) -> pa.Array:
    return pc.fill_null(values, "")


def trace_ids(batch: pa.RecordBatch) -> pa.Array:
    """The id RocketMQ's clients show for each consumed row: ``uniqKey``, else ``msgId``."""
    uniq = batch.column("uniqKey")
    return pc.if_else(pc.fill_null(pc.greater(pc.utf8_length(uniq), 0), False), uniq,
                      _text(batch.column("msgId")))


def encode(batch: pa.RecordBatch, group: str, request_id: str, now_ms: int, cost_ms: int
           ) -> tuple[pa.Array, pa.Array]:
    """(contexts, keys) per row: the SubBefore and SubAfter contexts of the row, and the keys its
    trace message carries for it (its id and its own keys, each followed by a space). One pass
    over the rows: the fields every row shares are joined once, into the separators."""
    ids = trace_ids(batch)
    keys = _text(pc.binary_join(batch.column("keys"), " "))
    retries = batch.column("reconsumeTimes")
    if pc.max(retries).as_py() in (None, 0):
        retry = pa.scalar("0")       # (nearly always: a message read from its topic, not redelivered)
    else:
        retry = pc.cast(pc.fill_null(retries, 0), pa.string())
    now, req = str(now_ms), request_id
    contexts = pc.binary_join_element_wise(
        f"SubBefore{C}{now}{C}{REGION}{C}{group}{C}{req}{C}", ids, C, retry, C, keys,
        f"{F}SubAfter{C}{req}{C}", ids, f"{C}{cost_ms}{C}true{C}", keys,
        f"{C}0{C}{now}{C}{group}{F}", "")
    index_keys = pc.binary_join_element_wise(ids, " ", keys, " ", "")
    return contexts, index_keys


def _joined(values: pa.Array, start: int, stop: int) -> bytes:
    """The UTF-8 bytes of ``values[start:stop]`` one after another (a string array's data)."""
    if start >= stop:
        return b""
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int32,
                            count=stop - start + 1, offset=4 * (values.offset + start))
    return values.buffers()[2].slice(int(offsets[0]), int(offsets[-1] - offsets[0])).to_pybytes()


def chunks(index_keys: pa.Array) -> list[tuple[int, int]]:
    """Row ranges of one trace message each: ``TRACE_BATCH`` rows and ``KEYS_LIMIT`` key bytes
    at most (one row at least)."""
    sizes = np.cumsum(pc.binary_length(index_keys).to_numpy(zero_copy_only=False))
    out, start, n = [], 0, len(index_keys)
    while start < n:
        base = sizes[start - 1] if start else 0
        fit = int(np.searchsorted(sizes, base + KEYS_LIMIT, side="right"))
        stop = min(n, start + TRACE_BATCH, max(fit, start + 1))
        out.append((start, stop))
        start = stop
    return out


class ConsumeTraces:
    """The traces of one task: :meth:`record` each batch handed to Spark, :meth:`close` at the
    end. ``backend`` is the task's ClusterBackend; ``group`` the consumer group (as the brokers
    name it)."""

    def __init__(self, backend, topic: str, group: str):
        self.backend, self.topic, self.group = backend, topic, group
        self._queues = None                   # [(broker name, queue id)] of the trace topic
        self._next = itertools.count()
        self._pending: list = []              # (Call, rows)
        self._dropped = 0
        self._said = False

    def record(self, batch: pa.RecordBatch, cost_ms: int) -> None:
        if not batch.num_rows:
            return
        request_id = uuid.uuid4().hex.upper()
        contexts, keys = encode(batch, self.group, request_id, int(time.time() * 1000), cost_ms)
        for start, stop in chunks(keys):
            self._send(_joined(contexts, start, stop), _joined(keys, start, stop).decode().strip(),
                       stop - start)

    def _send(self, body: bytes, keys: str, rows: int) -> None:
        try:
            if self._queues is None:
                route = self.backend.route(self.topic)
                self._queues = [(b, q) for b, n in sorted(route.write_queues().items())
                                for q in range(n)]
                if not self._queues:
                    raise RmqRemotingError(f"trace topic {self.topic!r} has no writable queue")
            broker, queue_id = self._queues[next(self._next) % len(self._queues)]
            props = rq.props_bytes({"KEYS": keys, "WAIT": "true"})
            call = self.backend._call(broker, lambda addr: rq.send_one_call(
                self.backend.client, addr, self.topic, body, props, queue_id=queue_id,
                born_ms=int(time.time() * 1000), producer_group=f"_INNER_TRACE_PRODUCER-{self.group}",
                broker_name=broker))
            self._pending.append((call, rows))
            if len(self._pending) >= _IN_FLIGHT:
                self._settle(self._pending.pop(0))
        except RmqRemotingError as exc:
            self._drop(rows, exc)

    def _settle(self, item) -> None:
        call, rows = item
        try:
            self.backend.client.answer(call)
        except RmqRemotingError as exc:
            self._drop(rows, exc)

    def _drop(self, rows: int, exc: Exception) -> None:
        self._dropped += rows
        if not self._said:
            self._said = True
            log.error("message traces of consumer group %r to topic %r are dropped (traces never "
                      "fail a query): %s", self.group, self.topic, exc)

    def close(self) -> None:
        while self._pending:
            self._settle(self._pending.pop(0))
        if self._dropped:
            log.error("message traces of %d message(s) were dropped (pid %d)", self._dropped,
                      os.getpid())
