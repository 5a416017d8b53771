"""Pulls by the C core against real brokers (RocketMQ 4.9.x and 5.3.x): the same rows as the Python
client's pulls and as what was sent, for every subscription kind, range and batch size; a queue
that ends before the planned end; a connection that breaks halfway, which goes on in Python."""
from __future__ import annotations

import uuid

import pytest

from conftest import distinct_timeout
from rmq_source.group.allocation import MessageQueue
from rmq_source.remote import RemotingClient, native_pull
from rmq_source.remote import requests as rq
from rmq_source.remote.backend import ClusterBackendSpec

pytestmark = [pytest.mark.broker]

QUEUES, PER_QUEUE = 2, 700


@pytest.fixture(scope="module")
def filled(rocketmq):
    """A topic of QUEUES queues: PER_QUEUE messages each, tags a/b/c in turn, bodies of 1 byte to
    20 KiB (answers capped by bytes as well as by count)."""
    topic = f"NativePull_{uuid.uuid4().hex[:8]}"
    addr = rocketmq.brokers["broker-a"].addr
    sent = {}
    with RemotingClient(timeout=30) as client:
        rocketmq.create_topic(client, topic, QUEUES)
        for q in range(QUEUES):
            sent[q] = [((b"%d-%d-" % (q, i) * (1 + (i * 37) % 1200))[:20000], "abc"[i % 3])
                       for i in range(PER_QUEUE)]
            for start in range(0, PER_QUEUE, 50):
                rq.send_batch(client, addr, topic, [{"body": b, "tags": t, "keys": f"k{start + j}"}
                                                    for j, (b, t) in enumerate(sent[q][start:start + 50])],
                              queue_id=q)
            rq.wait_max_offset(client, addr, topic, q, PER_QUEUE)
    return topic, sent


class _Uses:
    """Counts the pieces the C core handed over (a test of the C path must take it)."""

    def __init__(self, monkeypatch):
        self.pieces = 0
        real = native_pull.NativePuller.next

        def counted(puller, *args, **kw):
            item = real(puller, *args, **kw)
            self.pieces += item is not None
            return item
        monkeypatch.setattr(native_pull.NativePuller, "next", counted)




def _backend(rocketmq, native: bool, pull_batch: int = 32):
    # a timeout of its own: a backend (and its idle pullers) not shared with other tests. (A random
    # one of 1,000 values collided within a session: a test then got an earlier test's pooled
    # connection, which the backend makes again once when it fails at once; 10.5: apart from the
    # random 10.00x of other modules.)
    return ClusterBackendSpec((rocketmq.namesrv_addr,), distinct_timeout(10.5),
                              native_pulls=native, pull_batch=pull_batch).open()


def _read(backend, topic, q, start, end, sub, batch_rows, short=None):
    mq = MessageQueue(topic, "broker-a", q)
    rows = []
    for batch in backend.read(mq, start, end, subscription=sub, batch_rows=batch_rows,
                              batch_bytes=1 << 22, verify_crc=True,
                              on_data_loss=lambda *a: pytest.fail(f"data loss {a}"),
                              on_short_read=(lambda *a: short.append(a[:2])) if short is not None
                              else (lambda *a: pytest.fail(f"short read {a}"))):
        rows.extend(zip(batch.column("queueOffset").to_pylist(), batch.column("body").to_pylist(),
                        batch.column("tags").to_pylist()))
    return rows


@pytest.mark.parametrize("sub", ["*", "a", "b || c"])
@pytest.mark.parametrize("start,end", [(0, PER_QUEUE), (13, 500), (699, 700), (5, 6), (100, 100)])
def test_c_pulls_give_the_rows_python_pulls_give(rocketmq, filled, monkeypatch, sub, start, end):
    topic, sent = filled
    uses = _Uses(monkeypatch)
    wanted = set(sub.replace(" ", "").split("||"))
    for q in range(QUEUES):
        expected = [(o, sent[q][o][0], sent[q][o][1]) for o in range(start, end)
                    if sub == "*" or sent[q][o][1] in wanted]
        for batch_rows in (7, 8192):
            native = _read(_backend(rocketmq, True), topic, q, start, end, sub, batch_rows)
            python = _read(_backend(rocketmq, False), topic, q, start, end, sub, batch_rows)
            assert native == python == expected, (q, batch_rows, len(native), len(python))
    assert uses.pieces > 0 or start == end


@pytest.mark.parametrize("pull_batch", [1, 7, 1024])
def test_every_pull_size_reads_the_same_rows(rocketmq, filled, monkeypatch, pull_batch):
    """pullBatchSize: pulls of 1 or 7 messages, or of 1,024 (more than the broker answers: it
    caps a pull at 32 messages and 256 KiB here, and the reading goes on from where each answer
    stopped), give the rows that were sent, C pulls and Python pulls alike; the Python pulls ask
    that many messages."""
    topic, sent = filled
    asked = []
    real = rq.send_pull
    monkeypatch.setattr(rq, "send_pull", lambda *a, **kw: asked.append(kw["max_nums"]) or real(*a, **kw))
    for sub in ("*", "b || c"):
        wanted = set(sub.replace(" ", "").split("||"))
        expected = [(o, sent[0][o][0], sent[0][o][1]) for o in range(13, 500)
                    if sub == "*" or sent[0][o][1] in wanted]
        for native in (True, False):
            got = _read(_backend(rocketmq, native, pull_batch), topic, 0, 13, 500, sub, 8192)
            assert got == expected, (sub, native, len(got))
    assert asked and max(asked) == min(pull_batch, 487)


@pytest.mark.parametrize("native", [True, False], ids=["c-pulls", "python-pulls"])
def test_a_queue_that_ends_before_the_planned_end_is_a_short_read(rocketmq, filled, native):
    topic, sent = filled
    short: list = []
    rows = _read(_backend(rocketmq, native), topic, 0, 650, PER_QUEUE + 40, "*", 8192, short)
    assert [r[0] for r in rows] == list(range(650, PER_QUEUE)) and short == [(PER_QUEUE, PER_QUEUE + 40)]
    short.clear()
    assert _read(_backend(rocketmq, native), topic, 1, PER_QUEUE + 5, PER_QUEUE + 9, "*", 64, short) == []
    assert short == [(PER_QUEUE + 5, PER_QUEUE + 9)]


@pytest.mark.parametrize("break_at", [1, 3])
def test_a_pull_connection_broken_halfway_goes_on_in_python(rocketmq, filled, monkeypatch, break_at):
    topic, sent = filled
    calls = [0]
    real = native_pull.NativePuller.next

    def breaking(puller, *args, **kw):
        calls[0] += 1
        if calls[0] == break_at:
            import socket
            puller._sock.shutdown(socket.SHUT_RDWR)     # the connection dies under the C core
        return real(puller, *args, **kw)
    monkeypatch.setattr(native_pull.NativePuller, "next", breaking)
    backend = _backend(rocketmq, True)
    went_on = []
    real_python = backend._python_pulls

    def python_pulls(mq, start, *args):
        went_on.append(start)
        return real_python(mq, start, *args)
    monkeypatch.setattr(backend, "_python_pulls", python_pulls)
    rows = _read(backend, topic, 0, 0, PER_QUEUE, "*", 50)
    assert [r[0] for r in rows] == list(range(PER_QUEUE))
    assert [r[1] for r in rows] == [b for b, _ in sent[0]]
    assert calls[0] == break_at and len(went_on) == 1 and went_on[0] >= (break_at - 1) * 50


class _Firsts:
    """Counts the first pulls sent together and the answers that completed or began a range."""

    def __init__(self, monkeypatch, break_after: int | None = None):
        self.calls = self.with_body = 0
        real = native_pull.NativePuller.firsts

        def counted(puller, pulls, **kw):
            self.calls += 1
            if break_after is not None and self.calls > break_after:
                import socket
                puller._sock.shutdown(socket.SHUT_RDWR)     # the connection dies under the C core
            answers = real(puller, pulls, **kw)
            self.with_body += sum(a.body is not None for a in answers)
            return answers
        monkeypatch.setattr(native_pull.NativePuller, "firsts", counted)


def _read_many(backend, topic, windows, sub):
    from rmq_source.backend import RangeRead
    short = []
    ranges = [RangeRead(MessageQueue(topic, "broker-a", q), s, e,
                        lambda *a: pytest.fail(f"data loss {a}"), lambda *a, q=q: short.append((q, *a[:2])))
              for q, s, e in windows]
    rows = []
    for batch in backend.read_many(ranges, subscription=sub, batch_rows=8192, batch_bytes=1 << 22,
                                   verify_crc=True):
        rows.extend(zip(batch.column("queueId").to_pylist(), batch.column("queueOffset").to_pylist(),
                        batch.column("body").to_pylist(), batch.column("tags").to_pylist()))
    return rows, short


@pytest.mark.parametrize("sub", ["*", "b || c"])
@pytest.mark.parametrize("broken", [None, 1], ids=["whole", "connection-broken"])
def test_first_pulls_of_small_ranges_sent_together_give_the_rows_of_each_range(rocketmq, filled, monkeypatch,
                                                                               sub, broken):
    """Many small ranges of both queues (a task over a thousand queues with a few messages each):
    their first pulls go together on one connection and give the rows each range gives alone, in
    range order, also where one answer does not complete its range (20 KiB bodies: the broker caps
    an answer by bytes) or a filter leaves messages out, where a range ends past the queue's end
    (a short read, said once) and where the connection breaks under them (each range then pulled
    its usual way)."""
    topic, sent = filled
    firsts = _Firsts(monkeypatch, break_after=broken)
    windows = [(q, s, s + n) for s in range(0, 600, 37) for q in range(QUEUES) for n in (1, 5, 32)
               if s + n <= PER_QUEUE][:150]
    windows.append((1, PER_QUEUE - 2, PER_QUEUE + 3))           # past the end: a short read
    windows.insert(7, (0, 40, 40))                               # empty: nothing asked
    rows, short = _read_many(_backend(rocketmq, True), topic, windows, sub)
    wanted = set(sub.replace(" ", "").split("||"))
    expected = [(q, o, sent[q][o][0], sent[q][o][1]) for q, s, e in windows for o in range(s, min(e, PER_QUEUE))
                if sub == "*" or sent[q][o][1] in wanted]
    assert rows == expected
    assert short == [(1, PER_QUEUE, PER_QUEUE + 3)]
    assert firsts.calls >= 2 and (firsts.with_body > len(windows) // 2 if broken is None else True)
    python_rows, _ = _read_many(_backend(rocketmq, False), topic, windows, sub)
    assert python_rows == expected
