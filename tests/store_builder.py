"""Deterministic sample stores for the Spark tests, written by our broker-compatible writer.

``build_store`` returns what was written (the oracle): one dict per message with the queue position
the writer reported, so tests compare Spark's rows against what went in, not against our reader.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from rmq_source.store.writer import StoreWriter

TAGS = ("TagA", "TagB", "TagC", None, "Aa", "BB")


@dataclass(frozen=True)
class Written:
    topic: str
    broker: str
    queue_id: int
    queue_offset: int
    tags: str | None
    body: bytes
    store_ts: int
    msg_id: str


def append_messages(writer: StoreWriter, topic: str, count: int, *, start_ts: int, seed: int = 7,
                    step_ms: int = 10) -> list[Written]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        tags = TAGS[rng.randrange(len(TAGS))]
        body = f"{topic}-{writer.broker_name}-{start_ts}-{i}-".encode() + rng.randbytes(rng.randrange(0, 300))
        ts = start_ts + i * step_ms
        r = writer.append(topic, body, tags=tags, keys=[f"K{i}", f"O{i % 7}"],
                          properties={"seq": str(i)}, store_timestamp=ts, born_timestamp=ts - 1)
        out.append(Written(topic, writer.broker_name, r.queue_id, r.queue_offset, tags, body, ts,
                           r.msg_id))
    return out


def build_store(root, *, broker="broker-a", topics=(("TopicTest", 4, 240), ("OrderTopic", 3, 90)),
                start_ts=1_700_000_000_000, commitlog_file_size=64 * 1024, cq_units_per_file=32
                ) -> list[Written]:
    """A store with small files (several CommitLog and ConsumeQueue files per queue)."""
    written: list[Written] = []
    with StoreWriter(root, broker_name=broker, commitlog_file_size=commitlog_file_size,
                     cq_units_per_file=cq_units_per_file) as w:
        for n, (topic, queues, count) in enumerate(topics):
            w.create_topic(topic, queues)
            written += append_messages(w, topic, count, start_ts=start_ts + n * 100_000, seed=n)
    return written
