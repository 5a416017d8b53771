"""native.decode_records: a PULL_MESSAGE answer (CommitLog records end to end) decoded by the C
core into the same rows as the store scan, and every malformed answer refused with its position.

Answers are made from stores our writer wrote: the records of one queue, cut out of the CommitLog
at the offsets the store reports, laid end to end as a broker's pull answer lays them.
"""
from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest

from rmq_source.errors import RmqCorruptStoreError, RmqOptionError
from rmq_source.store import native
from rmq_source.store.reader import Store, native_rows
from rmq_source.store.writer import StoreWriter

TOPIC = "PullTopic"
WHERE = "pull answer of test"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("pull") / "store"
    with StoreWriter(root, commitlog_file_size=1 << 20) as w:
        w.create_topic(TOPIC, 2)
        w.create_topic("Other", 1)
        for i in range(40):
            w.append(TOPIC, b"body-%d" % i * (1 + i % 9), queue_id=i % 2, tags=("Aa", "BB", "x")[i % 3],
                     keys=[f"k{i}"], properties={"i": str(i)},
                     compression="zlib" if i % 4 == 0 else None)
            w.append("Other", b"other-%d" % i, queue_id=0, tags="x")
    return root


def answer(root, topic=TOPIC, queue_id=0, start=0, end=None):
    """(records of [start, end) of the queue end to end, the store's rows of them)."""
    with Store(root) as st:
        end = st.max_offset(topic, queue_id) if end is None else end
        rows = st.read(topic, queue_id, start, end).to_pylist()
    data = b"".join((root / "commitlog" / f"{0:020d}").read_bytes()[r["commitLogOffset"]:
                                                                   r["commitLogOffset"] + r["storeSize"]]
                    for r in rows)
    return data, rows


def decode(data, **kw):
    args = dict(where=WHERE, topic=TOPIC, queue_id=0, start=0, end=1 << 40)
    args.update(kw)
    batch, nxt = native.decode_records(data, **args)
    return native_rows(batch, args["topic"], "broker-a", args["queue_id"]).to_pylist(), nxt


def test_same_rows_as_the_store_scan(store):
    data, rows = answer(store)
    got, nxt = decode(data)
    assert got == rows and nxt == 20


@pytest.mark.parametrize("start, end, expect", [(0, 20, range(0, 20)), (5, 9, range(5, 9)),
                                                (19, 40, range(19, 20)), (25, 30, range(0))])
def test_only_the_range_is_kept(store, start, end, expect):
    data, rows = answer(store)
    got, nxt = decode(data, start=start, end=end)
    assert [r["queueOffset"] for r in got] == list(expect)
    assert nxt == max(start, min(end, 20))


def test_tags_rechecked_on_the_string(store):
    # "Aa" and "BB" share a hash code: the broker's code filter lets both through
    data, rows = answer(store)
    got, _ = decode(data, tags=("Aa",))
    assert [r["queueOffset"] for r in got] == [r["queueOffset"] for r in rows if r["tags"] == "Aa"]
    assert got and all(r["tags"] == "Aa" for r in got)


def test_an_answer_starting_mid_queue(store):
    data, rows = answer(store, queue_id=1, start=7)
    got, nxt = decode(data, queue_id=1, start=7)
    assert got == rows and nxt == 20


def _corrupt_cases(data: bytes, rows: list):
    first = rows[0]["storeSize"]
    yield "truncated", data[:-5], "TRUNCATED", len(data) - rows[-1]["storeSize"]
    yield "bad magic", data[:first + 4] + b"\0\0\0\0" + data[first + 8:], "BAD_MAGIC", first
    yield "size", struct.pack(">i", 50) + data[4:], "SIZE_MISMATCH", 0
    # the second record moved before the first: queue offsets go backwards
    second = rows[1]["storeSize"]
    yield "order", data[first:first + second] + data[:first] + data[first + second:], "UNIT_MISMATCH", second
    yield "garbage tail", data + b"\x01\x02\x03", "TRUNCATED", len(data)


@pytest.mark.parametrize("case", ["truncated", "bad magic", "size", "order", "garbage tail"])
def test_malformed_answers_name_the_position(store, case):
    data, rows = answer(store)
    name, bad, code, pos = next(c for c in _corrupt_cases(data, rows) if c[0] == case)
    with pytest.raises(RmqCorruptStoreError) as exc:
        decode(bad)
    assert exc.value.code == code, exc.value
    assert exc.value.path == WHERE and exc.value.position == pos, (exc.value, exc.value.position)


def test_records_of_another_queue_are_refused(store):
    data, _ = answer(store, topic="Other")
    with pytest.raises(RmqCorruptStoreError, match="is not a message of queue 'PullTopic'/0") as exc:
        decode(data)
    assert exc.value.code == "UNIT_MISMATCH" and exc.value.position == 0
    data, _ = answer(store, queue_id=1)
    with pytest.raises(RmqCorruptStoreError, match="queue 1"):
        decode(data)


def _live_batches() -> int:
    """Native batches alive in this process once garbage is collected (earlier tests of the run
    may still hold some: each test compares with its own start)."""
    import gc
    gc.collect()
    return native.live_batches()


def test_empty_answer_and_bad_arguments(store):
    before = _live_batches()
    assert decode(b"") == ([], 0)
    assert decode(b"", start=9, end=12)[1] == 9
    for kw, match in [({"end": -1}, "end"), ({"start": 5, "end": 4}, "must be >="),
                      ({"where": ""}, "where"), ({"topic": None}, "topic and queue_id")]:
        with pytest.raises(RmqOptionError, match=match):
            decode(b"", **kw)
    with pytest.raises(RmqOptionError, match="bytes"):
        native.decode_records("text", where=WHERE, topic=TOPIC, queue_id=0, start=0, end=1)
    assert _live_batches() == before


def test_random_damage_never_crashes(store):
    """Bytes of the answer overwritten at random: a clean decode or RmqCorruptStoreError naming a
    position inside the answer, nothing else (this file also runs under ASan)."""
    import random
    before = _live_batches()
    data, rows = answer(store)
    rnd = random.Random(5)
    outcomes = set()
    for _ in range(400):
        bad = bytearray(data)
        for _ in range(rnd.randint(1, 6)):
            bad[rnd.randrange(len(bad))] = rnd.randrange(256)
        if rnd.random() < 0.2:
            bad = bad[:rnd.randrange(len(bad))]
        try:
            batch, nxt = native.decode_records(bytes(bad), where=WHERE, topic=TOPIC, queue_id=0,
                                               start=0, end=1 << 40)
            outcomes.add("ok")
            assert 0 <= nxt and batch.num_rows <= 20
            batch.validate(full=True)
            del batch
        except RmqCorruptStoreError as exc:
            outcomes.add(exc.code)
            assert exc.path == WHERE and 0 <= exc.position < len(bad), exc
    assert "ok" in outcomes and len(outcomes) >= 4, outcomes
    assert _live_batches() == before


def test_pulls_in_flight_follow_answers_that_come_short():
    """Brokers answer fewer messages than asked (at most 8 or 64 KiB when read from disk): the
    pulls asked ahead are dropped and the next ones start where the answer ended, up to the end,
    whatever the range's size against the pulls in flight."""
    from rmq_source.group.allocation import MessageQueue
    from rmq_source.remote.backend import ClusterBackend, ClusterBackendSpec
    from rmq_source.subscription import Subscription

    for end in (1, 8, 31, 32, 33, 64, 100, 129, 1000):
        for cap in (1, 3, 8, 32):
            backend = ClusterBackend(ClusterBackendSpec(("127.0.0.1:1",), pulls_in_flight=4))
            asked = []

            def send(mq, offset, count):
                asked.append((offset, count))
                return SimpleNamespace(count=count, cancel=lambda: None), False

            # a stand-in answer: how many messages it holds (brokers are the judge elsewhere)
            backend._send_pull = send
            backend._answer = lambda mq, asked, call, slave, in_flight=1: min(call.count, cap)
            backend._pull = lambda mq, offset, count, sub: pytest.fail("no pull needs a retry")
            gen = backend._python_pulls(MessageQueue("T", "b", 0), 0, end, Subscription.parse("*"))
            offsets, offset = [], 0
            try:
                got, n = next(gen)
                while True:
                    offsets.append(got)
                    assert got == offset, (end, cap, got, offset)
                    offset = got + n
                    got, n = gen.send(offset)
            except StopIteration:
                pass
            assert offset == end and offsets == sorted(set(offsets)), (end, cap, offsets)
            assert all(o < end and o + c <= end for o, c in asked), (end, cap, asked)
            # after a short answer the pulls ask what it covered: a round of pulls sent ahead is
            # lost at most once, then once per RMQ_PULL_GROW_AFTER full answers (the size tried larger)
            useful = -(-end // min(cap, 32))
            assert len(asked) <= useful + 3 * (1 + useful // 16), (end, cap, len(asked))


@pytest.mark.parametrize("size, run, covered, asked, after", [
    (32, 0, 8, 32, (8, 0)),          # short: ask what it covered
    (8, 5, 3, 8, (3, 0)),            # shorter still
    (8, 14, 8, 8, (8, 15)),          # full: counted
    (8, 15, 8, 8, (16, 0)),          # the 16th full answer in a row: twice the size
    (20, 15, 20, 20, (32, 0)),       # never past the largest
    (32, 7, 32, 32, (32, 0)),        # at the largest: nothing to count
    (32, 0, 40, 32, (32, 0)),        # more than asked: full
])
def test_the_python_pulls_adapt_their_size_as_the_c_loop_does(size, run, covered, asked, after):
    from rmq_source.remote.backend import next_pull_size
    assert next_pull_size(size, run, covered, asked, 32) == after
