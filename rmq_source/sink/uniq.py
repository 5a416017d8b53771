"""Deterministic ``UNIQ_KEY`` values: the same write, batch, partition and row give the same key.

A Java producer's key is 16 bytes in hex (address, pid, class-loader hash, time, counter); consumers
read it as the message id (``MessageExt.getMsgId()``) and deduplicate by it. The sink's keys have the
same length and alphabet (32 uppercase hex digits) so every tool takes them, but are made of a
96-bit BLAKE2b digest of (write id, batch id, task partition, row index): a task that Spark runs
again, or a streaming batch re-run after a restart, sends the keys of its first run.

Layout (bytes): 0-9 digest, 10-13 zero (the Java key's "ms since the start of the month": tools
reading it, such as 4.9's ``queryMsgByUniqueKey``, then search from the start of the month), 14-15
digest. Twelve digest bytes make a collision between two different rows about as likely as
2^-96 a pair. The C core (native/core/sinkenc.c, ``rmq_uniq_keys``) derives the same keys from
:attr:`TaskKeys.prefix` and :data:`PERSON`.
"""
from __future__ import annotations

import hashlib


#: BLAKE2b personalization of every key (hashlib pads it to 16 bytes with zeros)
PERSON = b"rmq_source.uniq"
DIGEST_SIZE = 12


class TaskKeys:
    """The keys of one task: ``key(row)`` for its rows in input order (row 0 first): the digest
    of :attr:`prefix` followed by the row as 8 bytes big-endian."""

    __slots__ = ("_base", "prefix")

    def __init__(self, write_id: str, batch_id: int, partition: int):
        self.prefix = f"rmq-sink\x00{write_id}\x00{batch_id}\x00{partition}".encode()
        self._base = hashlib.blake2b(self.prefix, digest_size=DIGEST_SIZE, person=PERSON)

    def key(self, row: int) -> str:
        h = self._base.copy()
        h.update(row.to_bytes(8, "big"))
        d = h.digest()
        return (d[:10] + b"\0\0\0\0" + d[10:]).hex().upper()

    def keys(self, first_row: int, count: int) -> list[str]:
        return [self.key(r) for r in range(first_row, first_row + count)]
