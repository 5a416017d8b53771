"""The task path over many queues (``StoreBackend.read_many``: one C call scans many ranges,
:mod:`rmq_source.store.range_reads`) gives exactly what reading each range on its own gives
(``Store.read``, one ``rmq_scan_queue`` per batch): same rows in the same order, same callbacks,
the same error naming the same file and position; only batch boundaries differ, within the limits.

The store is written by our writer: many queues of one topic with small ConsumeQueue files (a
range crosses file boundaries), queues without messages, tags (a tag filter), and a second topic.
"""
from __future__ import annotations

import random

import pyarrow as pa
import pytest

from rmq_source.backend import RangeRead
from rmq_source.errors import RmqCorruptStoreError, RmqDataLossError
from rmq_source.group.allocation import MessageQueue
from rmq_source.store import native
from rmq_source.store.backend import StoreBackend
from rmq_source.store.reader import Store
from rmq_source.store.writer import StoreWriter

BROKER = "broker-a"
TOPIC, OTHER = "ManyQueues", "Other"
QUEUES = 40
EMPTY = {3, 4, 17, 39}          # queues that never get a message
CQ_UNITS = 8                    # units per ConsumeQueue file: ranges cross file boundaries
TAGS = ("TagA", "TagB", None, "Aa", "BB")   # "Aa"/"BB" share a hash code


@pytest.fixture(scope="module")
def store_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("many_queues")
    rng = random.Random(15)
    with StoreWriter(root, broker_name=BROKER, commitlog_file_size=256 * 1024,
                     cq_units_per_file=CQ_UNITS) as w:
        w.create_topic(TOPIC, QUEUES)
        w.create_topic(OTHER, 2)
        busy = [q for q in range(QUEUES) if q not in EMPTY]
        for i in range(900):
            q = busy[rng.randrange(len(busy))] if i % 3 else busy[i % len(busy)]
            w.append(TOPIC, rng.randbytes(rng.randrange(0, 200)), queue_id=q,
                     tags=TAGS[rng.randrange(len(TAGS))], keys=[f"K{i}"],
                     properties={"seq": str(i)})
            if i % 50 == 0:
                w.append(OTHER, b"other-%d" % i, queue_id=i % 2, tags="TagA")
    return root


def _ranges(store: Store, topic: str, rng: random.Random) -> list[tuple[int, int, int]]:
    """(queue id, start, end) of every queue: from 0, mid-file or mid-queue, to the end or before."""
    out = []
    for info in store.queue_infos(topic, store.queue_ids(topic)):
        lo, hi = info.min_offset, info.max_offset
        start = lo if rng.random() < 0.4 else rng.randint(lo, hi)
        end = hi if rng.random() < 0.6 else rng.randint(start, hi)
        out.append((info.queue_id, start, end))
    return out


class Calls:
    """The callbacks of every range, recorded as (queue, what, args)."""

    def __init__(self):
        self.seen = []

    def range_read(self, topic, qid, start, end):
        mq = MessageQueue(topic, BROKER, qid)
        return RangeRead(mq, start, end,
                         lambda a, b: self.seen.append((qid, "loss", a, b)),
                         lambda a, b, why: self.seen.append((qid, "short", a, b, why)))


def _one_by_one(store, topic_ranges, calls, **kw) -> pa.Table:
    batches = []
    for topic, qid, start, end in topic_ranges:
        rr = calls.range_read(topic, qid, start, end)
        batches += list(store.iter_batches(topic, qid, start, end, on_data_loss=rr.on_data_loss,
                                           on_short_read=rr.on_short_read, **kw))
    return pa.Table.from_batches(batches, schema=_schema())


def _many(backend, topic_ranges, calls, batch_rows=65536, batch_bytes=64 << 20, **kw):
    batches = list(backend.read_many([calls.range_read(*r) for r in topic_ranges],
                                     batch_rows=batch_rows, batch_bytes=batch_bytes,
                                     verify_crc=False, **kw))
    return pa.Table.from_batches(batches, schema=_schema()), batches


def _schema():
    from rmq_source.schema import ARROW_SCHEMA
    return ARROW_SCHEMA


def _topic_ranges(store, seed):
    rng = random.Random(seed)
    return ([(TOPIC, *r) for r in _ranges(store, TOPIC, rng)]
            + [(OTHER, *r) for r in _ranges(store, OTHER, rng)]
            + [(TOPIC, *r) for r in _ranges(store, TOPIC, rng)][:5])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("subscription", ["*", "TagA || BB", "Nope"])
def test_many_ranges_read_as_one_by_one(store_root, seed, subscription):
    store = Store(store_root, broker_name=BROKER)
    backend = StoreBackend({BROKER: str(store_root)})
    ranges = _topic_ranges(store, seed)
    assert any(s % CQ_UNITS and e - s > CQ_UNITS for _, _, s, e in ranges)   # crossing files
    assert any(s == e for _, _, s, e in ranges)                              # empty
    want_calls, got_calls = Calls(), Calls()
    want = _one_by_one(store, ranges, want_calls, subscription=subscription)
    got, batches = _many(backend, ranges, got_calls, subscription=subscription)
    assert got.equals(want)
    assert got_calls.seen == want_calls.seen == []
    if subscription == "*":
        assert got.num_rows > 200
        assert len(batches) <= 2      # joined (one per topic run at most, then joined)
    if subscription == "TagA || BB":
        assert set(got.column("tags").to_pylist()) == {"TagA", "BB"}


@pytest.mark.parametrize("batch_rows,batch_bytes", [(1, 64 << 20), (7, 64 << 20), (50, 64 << 20),
                                                    (65536, 3000), (65536, 20_000), (13, 9000)])
def test_batch_limits_split_the_rows(store_root, batch_rows, batch_bytes):
    store = Store(store_root, broker_name=BROKER)
    backend = StoreBackend({BROKER: str(store_root)})
    ranges = _topic_ranges(store, 99)
    want = _one_by_one(store, ranges, Calls())
    got, batches = _many(backend, ranges, Calls(), batch_rows=batch_rows, batch_bytes=batch_bytes,
                         subscription="*")
    assert got.equals(want)
    assert all(0 < b.num_rows <= batch_rows for b in batches)
    data = [pa.compute.sum(pa.compute.binary_length(b.column("body"))).as_py() for b in batches]
    # one row alone may exceed the byte limit, several never do
    assert all(d <= batch_bytes or b.num_rows == 1 for d, b in zip(data, batches))
    if batch_rows < 65536:
        assert len(batches) >= got.num_rows // batch_rows


def test_scan_ranges_matches_scan_queue(store_root):
    """The C call itself: per-range rows, next offsets and statuses; FULL mid-range."""
    store = Store(store_root, broker_name=BROKER)
    cl = store.commitlog()
    ranges = [r for r in _ranges(store, TOPIC, random.Random(3)) if r[1] < r[2]]
    files = [native.QueueFiles(*store._cq(TOPIC, q)) for q, _, _ in ranges]
    res = native.scan_ranges(cl, files, [s for _, s, _ in ranges], [e for _, _, e in ranges],
                             [q for q, _, _ in ranges], topic=TOPIC)
    assert res.done == len(ranges) and res.statuses == ["END"] * len(ranges)
    singles = [native.scan_queue(cl, f.segments, f.file_size, s, e, topic=TOPIC, queue_id=q)
               for f, (q, s, e) in zip(files, ranges)]
    assert res.rows.tolist() == [r.batch.num_rows for r in singles]
    assert res.next_offsets.tolist() == [e for _, _, e in ranges]
    assert pa.Table.from_batches([res.batch]).equals(
        pa.Table.from_batches([r.batch for r in singles], schema=native.NATIVE_SCHEMA))
    # a full batch stops in the middle of a range, which says where it goes on
    cut = int(res.rows[:5].sum()) + 2
    part = native.scan_ranges(cl, files, [s for _, s, _ in ranges], [e for _, _, e in ranges],
                              [q for q, _, _ in ranges], topic=TOPIC, max_rows=cut)
    k = part.done - 1
    assert part.batch.num_rows == cut and part.statuses[-1] == "FULL"
    assert part.statuses[:-1] == ["END"] * k
    assert part.next_offsets[k] < ranges[k][2]
    assert native.live_batches() >= 0


def _corrupt_middle_record(root) -> tuple[int, str, int]:
    """Break the magic code of a record of the middle queue; (queue id, file, position)."""
    mid = QUEUES // 2
    store = Store(root, broker_name=BROKER)   # (a sanitizer build reads files when opened)
    rows = store.read(TOPIC, mid, 0, store.max_offset(TOPIC, mid))
    phy = rows.column("commitLogOffset")[rows.num_rows // 2].as_py()
    size = store.commitlog().file_size
    path = str(root / "commitlog" / f"{phy - phy % size:020d}")
    with open(path, "r+b") as f:
        f.seek(phy % size + 4)
        f.write(b"\x00\x00\x00\x01")
    return mid, path, phy % size


def test_a_corrupt_record_names_file_and_position(store_root, tmp_path):
    import shutil
    root = tmp_path / "store"
    shutil.copytree(store_root, root)
    _, path, pos = _corrupt_middle_record(root)
    store = Store(root, broker_name=BROKER)
    ranges = [(TOPIC, q, 0, store.max_offset(TOPIC, q)) for q in range(QUEUES)]
    with pytest.raises(RmqCorruptStoreError) as one:
        _one_by_one(store, ranges, Calls())
    with pytest.raises(RmqCorruptStoreError) as many:
        _many(StoreBackend({BROKER: str(root)}), ranges, Calls(), subscription="*")
    assert (many.value.path, many.value.position, many.value.code) == (path, pos, "BAD_MAGIC")
    assert str(many.value) == str(one.value)


def test_callbacks_as_one_by_one(store_root):
    """Ranges past a queue's end (short read), of a missing queue, below the min offset."""
    store = Store(store_root, broker_name=BROKER)
    backend = StoreBackend({BROKER: str(store_root)})
    top = store.max_offset(TOPIC, 1)
    ranges = [(TOPIC, 0, 0, 3), (TOPIC, 1, 2, top + 5), (TOPIC, 2, 0, 4), (TOPIC, 77, 0, 3),
              (TOPIC, 3, 0, 2), (TOPIC, 5, 1, 6)]
    want_calls, got_calls = Calls(), Calls()
    want = _one_by_one(store, ranges, want_calls)
    got, _ = _many(backend, ranges, got_calls, subscription="*")
    assert got.equals(want)
    assert got_calls.seen == want_calls.seen
    assert [c[:2] for c in got_calls.seen] == [(1, "short"), (77, "short"), (3, "short")]


def test_retention_is_reported_before_the_range_is_read(store_root, tmp_path):
    """A CommitLog head removed: the ranges below the new min offset report the loss (or raise
    without a callback, as one by one), then read on from the first readable offset."""
    import shutil
    root = tmp_path / "store"
    shutil.copytree(store_root, root)
    first = sorted((root / "commitlog").iterdir())[0]
    first.unlink()
    store = Store(root, broker_name=BROKER)
    backend = StoreBackend({BROKER: str(root)})
    ranges = [(TOPIC, q, 0, store.max_offset(TOPIC, q)) for q in range(QUEUES)]
    want_calls, got_calls = Calls(), Calls()
    want = _one_by_one(store, ranges, want_calls)
    got, _ = _many(backend, ranges, got_calls, subscription="*")
    assert got.equals(want)
    assert got_calls.seen == want_calls.seen
    assert any(c[1] == "loss" for c in got_calls.seen)
    loss = next(c for c in got_calls.seen if c[1] == "loss")
    with pytest.raises(RmqDataLossError):
        list(store.iter_batches(TOPIC, loss[0], 0, loss[3]))


_SKIPPABLE = ("msgId", "bornHost", "storeHost", "properties", "keys", "uniqKey", "tags")


@pytest.mark.parametrize("needed", [
    ("queueOffset", "body"),                               # everything the C core may leave out
    ("queueOffset", "storeHost"),                          # hosts go together; msgId left out
    ("msgId", "tags"),                                     # msgId without the host columns
    ("properties", "bornTimestamp"),
    ("keys", "uniqKey"),
    _SKIPPABLE,                                            # nothing left out
])
@pytest.mark.parametrize("subscription", ["*", "TagA || BB"])
def test_columns_left_out_come_empty_the_others_as_read_in_full(store_root, needed, subscription):
    """``columns``: the asked columns (and every fixed-width one) are those of the full read,
    in both paths (many ranges in one C call; one queue at a time), with a tag filter too; the
    columns the C core left out come as documented (rmq_core.h): empty strings, empty maps,
    nulls."""
    store = Store(store_root, broker_name=BROKER)
    backend = StoreBackend({BROKER: str(store_root)})
    ranges = _topic_ranges(store, 3)
    full, _ = _many(backend, ranges, Calls(), subscription=subscription)
    narrow, _ = _many(backend, ranges, Calls(), subscription=subscription, columns=needed)
    single = _one_by_one(store, ranges, Calls(), subscription=subscription, columns=needed)
    assert narrow.equals(single) and narrow.num_rows == full.num_rows > 50
    small, _ = _many(backend, ranges, Calls(), subscription=subscription, columns=needed,
                     batch_bytes=3000)                   # (rows over the budget decided alike)
    assert small.equals(narrow)
    hosts_kept = {"bornHost", "storeHost"} & set(needed)
    for name in full.column_names:
        kept = name not in _SKIPPABLE or name in needed or (name.endswith("Host") and hosts_kept)
        column = narrow.column(name).to_pylist()
        if kept:
            assert column == full.column(name).to_pylist(), name
        elif name in ("msgId", "bornHost", "storeHost"):
            assert set(column) == {""}, name
        elif name == "properties":
            assert set(map(len, column)) == {0}, name
        else:
            assert set(column) == {None}, name
