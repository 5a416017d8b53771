"""Stores of the other layouts (DLedger CommitLogs, RocksDB consume queues) written by real brokers.

Shared by the live tests (tests/test_store_layouts_live.py) and the generator of the reference
stores (tests/fixtures/make_layouts.py): the broker properties of each layout, one message plan,
and the rows a broker serves (pulled through it) as manifest rows that a store read must equal.
"""
from __future__ import annotations

import base64
import random
import time

from rocketmq_cluster import free_port, pull_all
from rmq_source.remote import requests as rq
from rmq_source.store import record_codec
from rmq_source.store.bodies import decompress_body

TOPIC = "LayoutTopic"
QUEUES = 4
#: CommitLog (and DLedger data) files this small hold ~20 messages of the plan: reads cross files,
#: and DLedger files end in BLANK fillers
SMALL_FILES = 64 * 1024

#: the manifest's fields, as a store row names them
FIELDS = ("queueId", "queueOffset", "commitLogOffset", "storeSize", "msgId", "uniqKey", "tags",
          "keys", "properties", "body", "sysFlag", "flag", "bodyCRC", "bornTimestamp",
          "storeTimestamp", "bornHost", "storeHost", "reconsumeTimes")


def dledger_props(self_id: str = "n0", peers: str | None = None, group: str = "broker-a") -> dict:
    """Broker properties of a DLedger peer (one peer on a free loopback port unless ``peers``)."""
    return {"enableDLegerCommitLog": "true", "dLegerGroup": group,
            "dLegerPeers": peers or f"{self_id}-127.0.0.1:{free_port()}", "dLegerSelfId": self_id}


def layout_props(kind: str) -> dict:
    if kind == "dledger":
        return dledger_props()
    if kind == "rocksdb":
        return {"storeType": "defaultRocksDB"}
    raise ValueError(kind)


def write_plan(client, addr: str, *, seed: int = 11, count: int = 300) -> int:
    """Send the plan to ``TOPIC`` on ``addr``: bodies of 1 B to 3 KiB (some compressed), three
    tags and untagged, keys, user properties (non-ASCII too), and a batch; returns the count."""
    rnd = random.Random(seed)
    for i in range(count):
        size = rnd.choice((1, 7, 120, 900, 3000))
        body = bytes(rnd.getrandbits(8) for _ in range(min(size, 64))) * (size // 64 + 1)
        rq.send_message(client, addr, TOPIC, body[:size], queue_id=i % QUEUES,
                        tags=None if i % 5 == 4 else f"t{i % 3}", keys=[f"k{i}", "all"],
                        properties={"n": str(i), "p": "v\u00e9\u4e2d"}, flag=i % 9,
                        compress=i % 6 == 0 and size > 100)
    rq.send_batch(client, addr, TOPIC, [{"body": b"batch-%d" % j, "tags": "tb", "keys": f"bk{j}",
                                        "properties": {"j": str(j)}} for j in range(10)],
                  queue_id=1)
    return count + 10


def wait_served(client, addr: str, total: int) -> None:
    """Wait (60 s at most) until the broker at ``addr`` dispatched ``total`` messages of ``TOPIC``."""
    deadline = time.monotonic() + 60
    while sum(rq.max_offset(client, addr, TOPIC, q) for q in range(QUEUES)) < total:
        assert time.monotonic() < deadline, "the broker did not dispatch every message sent"
        time.sleep(0.2)


def served(client, addr: str) -> dict[int, list[dict]]:
    """queue id -> every message the broker at ``addr`` serves of ``TOPIC``, as manifest rows."""
    return {q: [_row(q, rec) for rec in pull_all(client, addr, TOPIC, q)] for q in range(QUEUES)}


def _row(queue_id: int, rec) -> dict:
    props = dict(rec.properties)
    return {
        "queueId": queue_id, "queueOffset": rec.queue_offset, "commitLogOffset": rec.physical_offset,
        "storeSize": rec.total_size,
        "msgId": record_codec.offset_msg_id(rec.store_host, rec.physical_offset),
        "uniqKey": props.get("UNIQ_KEY"), "tags": props.get("TAGS"),
        "keys": props.get("KEYS", "").split() or None, "properties": props,
        "body": base64.b64encode(decompress_body(rec.body, rec.sys_flag)).decode(),
        "sysFlag": rec.sys_flag, "flag": rec.flag, "bodyCRC": rec.body_crc,
        "bornTimestamp": rec.born_timestamp, "storeTimestamp": rec.store_timestamp,
        "bornHost": record_codec.java_host_string(rec.born_host),
        "storeHost": record_codec.java_host_string(rec.store_host),
        "reconsumeTimes": rec.reconsume_times,
    }


def store_row(row: dict) -> dict:
    """A row of our store read in the manifest's form."""
    out = {k: row[k] for k in FIELDS}
    out["properties"] = dict(out["properties"])
    out["keys"] = list(out["keys"]) if out["keys"] else None
    out["body"] = base64.b64encode(out["body"]).decode()
    for k in ("bornTimestamp", "storeTimestamp"):   # timestamp columns: epoch milliseconds
        v = out[k]
        out[k] = v if isinstance(v, int) else int(v.timestamp() * 1000 + 0.5) if v else v
    return out


def read_store(root, topic: str = TOPIC, queues: int = QUEUES) -> dict[int, list[dict]]:
    """queue id -> every row our store reader reads of ``topic`` at ``root``, as manifest rows."""
    from rmq_source.store.reader import Store
    with Store(root, broker_name="broker-a") as st:
        return read_rows(st, topic, queues)


def read_rows(st, topic: str = TOPIC, queues: int = QUEUES) -> dict[int, list[dict]]:
    """:func:`read_store` through an open ``Store``."""
    return {q: [store_row(r) for r in st.read(topic, q, st.min_offset(topic, q),
                                              st.max_offset(topic, q)).to_pylist()]
            for q in range(queues)}
