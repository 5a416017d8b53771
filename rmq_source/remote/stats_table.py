"""A broker's statistics answer (GET_TOPIC_STATS_INFO, GET_CONSUME_STATS) read by the C core
(``native/core/stats.c``): the queue ids of its offset table and the integer fields asked, as
lists, without a Python object per queue (a planning of 10,000 queues reads two such answers of
5,000 queues from each broker every batch; parsed as JSON and walked in Python they took ~20 ms
each).

Only the compact form fastjson writes is read here (MessageQueue objects as the map's keys, every
key of the topic asked, the fields integers); anything else is None, and the caller reads the
answer with its general parser (:mod:`rmq_source.remote.fastjson`), which also says what is wrong
with an answer that is.
"""
from __future__ import annotations

import numpy as np

from rmq_source.store.native import ffi, lib

#: the shortest entry the C reader accepts is ``{"queueId":0,"topic":""}:{}`` with the topic
#: between the quotes: an answer of n bytes has at most n // (this + len(topic)) + 1 entries
_MIN_ENTRY_BYTES = 27


def read_stats_table(body: bytes, topic: str, fields: tuple[str, ...], member: str = "offsetTable"
                     ) -> tuple[list[int], list[list[int]]] | None:
    """(queue ids, one list per name of ``fields`` with each entry's value, 0 where an entry has
    no such member) of the map ``member`` of ``body``, entries in the answer's order; None when
    ``body`` is not that map about ``topic`` in fastjson's compact form."""
    if not isinstance(body, (bytes, bytearray)):
        raise TypeError(f"body must be bytes, got {type(body).__name__}")
    if not isinstance(topic, str) or not isinstance(member, str):
        raise TypeError("topic and member must be str")
    if not all(isinstance(f, str) and f for f in fields):
        raise TypeError(f"fields must be non-empty str, got {fields!r}")
    encoded = [f.encode() for f in fields]
    names = [ffi.new("char[]", f) for f in encoded]
    member_b, topic_b = member.encode(), topic.encode()
    cap = len(body) // (_MIN_ENTRY_BYTES + len(topic_b)) + 1
    n = len(fields)
    qids = np.empty(cap, dtype=np.int64)
    values = np.empty(cap * max(n, 1), dtype=np.int64)
    present = np.empty(cap * max(n, 1), dtype=np.uint8)
    count, err_pos = ffi.new("size_t *"), ffi.new("size_t *")
    code = lib.rmq_stats_table(
        ffi.from_buffer(body), len(body), member_b, len(member_b), topic_b, len(topic_b),
        ffi.new("char *[]", names), ffi.new("size_t[]", [len(f) for f in encoded]), n,
        ffi.cast("int64_t *", qids.ctypes.data), ffi.cast("int64_t *", values.ctypes.data),
        ffi.cast("uint8_t *", present.ctypes.data), cap, count, err_pos)
    if code == lib.RMQ_E_PROTOCOL:
        return None
    if code != lib.RMQ_OK:           # (cap counts the shortest entries: a bug if ever reached)
        raise RuntimeError(f"rmq_stats_table failed with code {code}")
    rows = count[0]
    table = np.where(present[:rows * n].view(bool), values[:rows * n], 0).reshape(rows, n)
    return qids[:rows].tolist(), [table[:, k].tolist() for k in range(n)]
