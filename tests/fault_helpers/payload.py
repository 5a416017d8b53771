"""What the fault tests' writer puts in each message, so any reader can check a row on its own.

A message's body and properties are a pure function of (topic, queue id, queue offset): a reader
that gets a row for queue offset n can tell at once whether the row is exactly what was written
there, without waiting for the writer's log. Members of a batch send share their properties
(the writer's ``append_batch`` gives every member the same ones), so they carry the batch's first
offset and size instead of their own offset.
"""
from __future__ import annotations

import hashlib

TAGS = ("TagA", "TagB", None, "TagC")


def body_for(topic: str, queue_id: int, offset: int) -> bytes:
    """Body of the message at (topic, queue_id, offset): 20..~5,000 bytes, now and then large."""
    seed = hashlib.blake2b(f"{topic}/{queue_id}/{offset}".encode(), digest_size=16).digest()
    n = seed[0] * 3 + (4000 if seed[1] < 8 else 0)
    head = f"{topic}/{queue_id}/{offset}/".encode()
    return head + (seed * (n // 16 + 1))[:n]


def digest(body: bytes) -> str:
    return hashlib.blake2b(body, digest_size=8).hexdigest()


def tags_for(offset: int) -> str | None:
    return TAGS[offset % len(TAGS)]


def props_for(topic: str, queue_id: int, offset: int) -> dict[str, str]:
    """User properties of a single (non-batch) message."""
    return {"q": str(queue_id), "o": str(offset), "d": digest(body_for(topic, queue_id, offset))}


def batch_props(queue_id: int, first: int, count: int) -> dict[str, str]:
    """User properties shared by the members of a batch starting at queue offset ``first``."""
    return {"q": str(queue_id), "first": str(first), "n": str(count)}


def check_row(topic: str, row: dict) -> str | None:
    """None when ``row`` (a dict of the row schema) is exactly what the writer wrote at its
    (queueId, queueOffset); otherwise what is wrong."""
    qid, off = row["queueId"], row["queueOffset"]
    where = f"{topic}/{qid}@{off}"
    if row["body"] != body_for(topic, qid, off):
        return f"{where}: body differs ({len(row['body'])} bytes read)"
    props = dict(row["properties"])
    if props.get("q") != str(qid):
        return f"{where}: property q={props.get('q')!r}"
    if "o" in props:
        if props["o"] != str(off) or props.get("d") != digest(row["body"]):
            return f"{where}: properties {props!r} belong to another message"
    else:
        first, count = int(props.get("first", -1)), int(props.get("n", 0))
        if not first <= off < first + count:
            return f"{where}: batch properties {props!r} do not cover this offset"
    if row["tags"] != tags_for(off if "o" in props else int(props["first"])):
        return f"{where}: tags {row['tags']!r}"
    return None
