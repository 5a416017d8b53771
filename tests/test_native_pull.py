"""Pulls run by the C core (``native/core/netpull.c`` through :mod:`rmq_source.remote.native_pull`)
against a small local peer playing a broker that answers in any order, short, stale, wrong or not
at all. The real brokers judge the same code in test_live_slave.py, test_broker_remoting.py and
every live test (the C core is the default way pulls go)."""
from __future__ import annotations

import json
import random
import select
import socket
import struct
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_source.errors import (RmqRemotingConnectionError, RmqRemotingError, RmqRemotingProtocolError,
                               RmqRemotingTimeoutError)
from rmq_source.remote import frames
from rmq_source.remote import requests as rq
from rmq_source.remote.frames import RemotingCommand
from rmq_source.remote.native_pull import (Answer, Data, NativePuller, ServerRequest, parse_header,
                                           pull_template)
from test_remoting_frames import read_request

FIELDS = rq.pull_fields("g", "T", 3, 0, subscription="*")
TEMPLATE = pull_template(FIELDS)


def msg(i: int) -> bytes:
    return b"<%d>" % i


def joined(start: int, end: int) -> bytes:
    return b"".join(msg(i) for i in range(start, end))


def pull_answer(req, *, n_messages: int, cap: int = 32, code: int = 0, suggest: int = 0,
                min_offset: int = 0, remark: str | None = None) -> bytes:
    """A broker's answer to ``req``: the messages from its offset on (``cap`` at most)."""
    offset, nums = int(req.ext_fields["queueOffset"]), int(req.ext_fields["maxMsgNums"])
    end = min(offset + nums, offset + cap, n_messages)
    if code == 0 and end <= offset:
        code = rq.PULL_NOT_FOUND
    body = joined(offset, end) if code == 0 else b""
    ext = {"nextBeginOffset": str(end if code == 0 else offset), "minOffset": str(min_offset),
           "maxOffset": str(n_messages), "suggestWhichBrokerId": str(suggest)}
    return frames.encode(RemotingCommand(code, ext, body, opaque=req.opaque, flag=1, language="JAVA",
                                         remark=remark))


class Broker:
    """A one-connection peer on loopback; ``serve(conn, req)`` answers each request read (it may
    hold answers back and send them later, in another order); ``idle(conn)`` runs when no request
    came for 20 ms."""

    def __init__(self, serve, idle=None):
        self.idle = idle
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.addr = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.serve = serve
        self.requests: list[RemotingCommand] = []
        self.done = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(10)
            try:
                while not self.done.is_set():
                    if not select.select([conn], [], [], 0.02)[0]:
                        if self.idle is not None:
                            self.idle(conn)
                        continue
                    req = read_request(conn)
                    self.requests.append(req)
                    if self.serve(conn, req) is False:
                        break
            except (OSError, struct.error):
                pass
            self.done.wait(5)

    def close(self):
        self.done.set()
        self.sock.close()


@pytest.fixture
def broker():
    made = []

    def make(serve):
        b = Broker(serve)
        made.append(b)
        return b
    yield make
    for b in made:
        b.close()


def puller_for(b, start, end, *, in_flight=4, per_pull=32, timeout_s=5.0, expect_suggest=0):
    p = NativePuller(b.addr, connect_timeout=5)
    p.range(TEMPLATE, start, end, per_pull=per_pull, in_flight=in_flight, timeout_s=timeout_s,
            expect_suggest=expect_suggest, what="T@b/3")
    return p


def drain(p, max_rows=1 << 20, max_bytes=1 << 30):
    out = []
    while (item := p.next(max_rows, max_bytes)) is not None:
        out.append(item)
    return out


def test_requests_are_the_pull_message_the_python_client_sends(broker):
    b = broker(lambda conn, req: conn.sendall(pull_answer(req, n_messages=100)))
    p = puller_for(b, 7, 100, in_flight=3, per_pull=32)
    assert b"".join(d.body for d in drain(p)) == joined(7, 100)
    asked = [(int(r.ext_fields["queueOffset"]), int(r.ext_fields["maxMsgNums"])) for r in b.requests]
    assert asked == [(7, 32), (39, 32), (71, 29)]
    for r in b.requests:
        assert r.code == rq.PULL_MESSAGE and not r.is_response
        expected = frames.str_fields(dict(FIELDS, queueOffset=r.ext_fields["queueOffset"],
                                          maxMsgNums=r.ext_fields["maxMsgNums"]))
        assert r.ext_fields == expected
    assert len({r.opaque for r in b.requests}) == 3


def test_a_view_is_the_data_until_the_next_call(broker):
    """``next(view=True)``: the same answers joined as bytes, as a view of the puller's buffer
    (the decode reads it in place) that the next call may overwrite."""
    b = broker(lambda conn, req: conn.sendall(pull_answer(req, n_messages=100)))
    p = puller_for(b, 0, 100, in_flight=2, per_pull=10)
    views = []
    while (item := p.next(30, 1 << 30, view=True)) is not None:
        assert isinstance(item.body, memoryview)
        views.append((item.first, item.next, bytes(item.body)))
    assert b"".join(v for _, _, v in views) == joined(0, 100)
    assert [(f, n) for f, n, _ in views] == [(0, 30), (30, 60), (60, 90), (90, 100)]


@pytest.mark.parametrize("subscription", ['x || "<queueOffset>"', '"opaque":1987654321', "<maxMsgNums>",
                                          "a || b", "ünï || \\\""])
def test_templates_hold_any_subscription(subscription):
    """The marks cut out are quoted JSON, which a string value holds only when it is the mark
    itself: then the template is refused (the Python client pulls)."""
    template = pull_template(dict(FIELDS, subscription=subscription))
    if template is None:
        assert subscription in ("<queueOffset>", "<maxMsgNums>")
        return
    tmpl, cuts = template
    header = tmpl[:cuts[0]] + b"9" + tmpl[cuts[0]:cuts[1]] + b"123" + tmpl[cuts[1]:cuts[2]] + b"4" + tmpl[cuts[2]:]
    cmd = frames.decode(struct.pack(">i", len(header)) + header)
    assert cmd.opaque == 9 and cmd.ext_fields == frames.str_fields(
        dict(FIELDS, subscription=subscription, queueOffset=123, maxMsgNums=4))


def _scrambling_broker(n_messages, cap, rng, window) -> Broker:
    """Answers held back and sent ``window`` at a time (or when no request comes) in a random
    order, as a broker pulling on a thread pool may send them."""
    held = []

    def flush(conn):
        rng.shuffle(held)
        conn.sendall(b"".join(held))
        held.clear()

    def serve(conn, req):
        held.append(pull_answer(req, n_messages=n_messages, cap=cap))
        if len(held) >= window or rng.random() < 0.3:
            flush(conn)
    return Broker(serve, idle=flush)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 300), start=st.integers(0, 40), cap=st.sampled_from([1, 3, 8, 32]),
       in_flight=st.integers(1, 16), max_rows=st.integers(1, 200), seed=st.integers(0, 1000))
def test_answers_join_in_offset_order_whatever_order_and_size_they_come(n, start, cap, in_flight,
                                                                        max_rows, seed):
    end = max(start, n)
    b = _scrambling_broker(n, cap, random.Random(seed), window=in_flight)
    try:
        p = puller_for(b, start, end, in_flight=in_flight)
        pieces = drain(p, max_rows=max_rows)
        assert all(isinstance(d, Data) for d in pieces)
        assert b"".join(d.body for d in pieces) == joined(start, end)
        pos = start
        for d in pieces:
            assert d.first == pos and d.next > d.first and d.rows == d.next - d.first
            # a piece ends once it holds max_rows (an answer is never split)
            assert d.rows < max_rows + cap
            pos = d.next
        assert pos == end
        p.close()
    finally:
        b.close()


def test_bytes_limit_ends_a_piece_at_the_answer_that_crosses_it(broker):
    b = broker(lambda conn, req: conn.sendall(pull_answer(req, n_messages=1000)))
    pieces = drain(puller_for(b, 0, 1000), max_bytes=300)
    assert b"".join(d.body for d in pieces) == joined(0, 1000)
    for d in pieces[:-1]:
        assert len(joined(d.first, d.next - 32)) < 300 <= len(d.body), (d.first, d.next)
    assert len(pieces) > 5


@pytest.mark.parametrize("code", [rq.PULL_OFFSET_MOVED, rq.PULL_NOT_FOUND, rq.SYSTEM_BUSY, 1])
def test_an_answer_that_is_not_messages_goes_to_the_caller_who_seeks(broker, code):
    def serve(conn, req):
        offset = int(req.ext_fields["queueOffset"])
        conn.sendall(pull_answer(req, n_messages=200, code=code if offset == 64 else 0,
                                 min_offset=100, remark="no"))
    b = broker(serve)
    p = puller_for(b, 0, 200)
    first = p.next(1 << 20, 1 << 30)
    assert isinstance(first, Data) and (first.first, first.next) == (0, 64)
    ans = p.next(1 << 20, 1 << 30)
    assert isinstance(ans, Answer) and ans.asked == 64 and ans.command.code == code
    assert ans.command.remark == "no" and ans.command.ext_fields["minOffset"] == "100"
    with pytest.raises(RmqRemotingError, match="seek"):
        p.next(1 << 20, 1 << 30)
    p2 = puller_for(b, 0, 0)       # a new connection: the failed call closed the first one
    assert p2.next(1, 1) is None
    p3 = puller_for(broker(serve), 0, 200)
    drain_until = [p3.next(1 << 20, 1 << 30), p3.next(1 << 20, 1 << 30)]
    assert isinstance(drain_until[1], Answer)
    p3.seek(100)
    rest = drain(p3)
    assert b"".join(d.body for d in rest) == joined(100, 200)


def test_a_request_of_the_server_is_handed_over_and_refused_a_oneway_dropped(broker):
    answers = []

    def serve(conn, req):
        if req.code != rq.PULL_MESSAGE:          # our refusal of the server's request
            answers.append(req)
            return
        offset = int(req.ext_fields["queueOffset"])
        if offset == 32:
            conn.sendall(frames.encode(RemotingCommand(40, {"x": "1"}, opaque=900, flag=frames.FLAG_ONEWAY)))
            conn.sendall(frames.encode(RemotingCommand(40, {"x": "2"}, opaque=901)))
        conn.sendall(pull_answer(req, n_messages=100))
    b = broker(serve)
    p = puller_for(b, 0, 100, in_flight=1)
    items = drain(p)
    kinds = [type(i).__name__ for i in items]
    assert kinds.count("ServerRequest") == 1, kinds
    req = next(i for i in items if isinstance(i, ServerRequest)).command
    assert (req.code, req.opaque, req.ext_fields) == (40, 901, {"x": "2"})
    assert b"".join(i.body for i in items if isinstance(i, Data)) == joined(0, 100)
    p.refuse(req)
    deadline = time.monotonic() + 5
    while not answers and time.monotonic() < deadline:
        time.sleep(0.01)
    assert answers and answers[0].opaque == 901 and answers[0].code == 3 and answers[0].is_response


def test_a_changed_suggestion_ends_the_piece_after_its_answer(broker):
    def serve(conn, req):
        offset = int(req.ext_fields["queueOffset"])
        conn.sendall(pull_answer(req, n_messages=200, suggest=1 if offset >= 64 else 0))
    p = puller_for(broker(serve), 0, 200)
    d = p.next(1 << 20, 1 << 30)
    assert (d.first, d.next, d.suggest) == (0, 96, 1)


def test_answers_of_an_earlier_range_are_dropped(broker):
    gate = threading.Event()

    def serve(conn, req):
        offset = int(req.ext_fields["queueOffset"])
        if offset < 500 and offset != 0:
            gate.wait(5)                         # held until the new range was asked
        conn.sendall(pull_answer(req, n_messages=1000))
    b = broker(serve)
    p = puller_for(b, 0, 400, in_flight=4)
    first = p.next(1, 1 << 30)
    assert (first.first, first.next) == (0, 32)
    p.range(TEMPLATE, 500, 600, per_pull=32, in_flight=4, timeout_s=5, expect_suggest=0, what="T@b/3")
    gate.set()
    assert b"".join(d.body for d in drain(p)) == joined(500, 600)


def _frame_then(tail: bytes):
    """Send ``tail`` and end the stream (reading on: a close with requests unread would reset
    the connection instead)."""
    sent = []

    def serve(conn, req):
        if not sent:
            sent.append(1)
            conn.sendall(tail)
            conn.shutdown(socket.SHUT_WR)
    return serve


@pytest.mark.parametrize("tail,error,match", [
    (struct.pack(">i", 64 << 20), RmqRemotingProtocolError, "frame length 67108864"),
    (struct.pack(">i", 2), RmqRemotingProtocolError, "frame length 2"),
    (struct.pack(">i", 100) + b"\x00" * 10, RmqRemotingConnectionError, "after 10 of 100 bytes"),
    (b"\x00\x00", RmqRemotingConnectionError, "after 2 of 4 bytes"),
    (b"", RmqRemotingConnectionError, "closed by the peer"),
    (struct.pack(">ii", 12, 8) + b'{"code":', RmqRemotingProtocolError, "byte 12 of the frame"),
    (struct.pack(">ii", 8, 4) + b"abcd", RmqRemotingProtocolError, "bad header"),
    (struct.pack(">ii", 4, 0x05000000), RmqRemotingProtocolError, "serialize type 5"),
    (struct.pack(">ii", 4, 100), RmqRemotingProtocolError, "header length 100 exceeds"),
], ids=["oversized", "too-short", "truncated-content", "truncated-length", "closed", "bad-json",
        "json-garbage", "serialize-type", "header-length"])
def test_broken_streams_raise_naming_the_broker_and_the_range(broker, tail, error, match):
    b = broker(_frame_then(tail))
    p = puller_for(b, 0, 100)
    with pytest.raises(error, match=match) as info:
        drain(p)
    assert b.addr in str(info.value) and "T@b/3" in str(info.value)
    assert p.closed
    with pytest.raises(RmqRemotingConnectionError, match="closed"):
        p.next(1, 1)


def test_a_silent_broker_times_out(broker):
    b = broker(lambda conn, req: None)
    p = puller_for(b, 0, 100, timeout_s=0.3)
    t0 = time.monotonic()
    with pytest.raises(RmqRemotingTimeoutError, match="no answer in 300 ms to PULL_MESSAGE at queue offset 0"):
        p.next(1, 1)
    assert 0.25 < time.monotonic() - t0 < 3


def test_connect_refused_names_the_address():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(RmqRemotingConnectionError, match=f"127.0.0.1:{port}"):
        NativePuller(f"127.0.0.1:{port}", connect_timeout=2)


@pytest.mark.parametrize("kw", [dict(in_flight=0), dict(in_flight=17), dict(per_pull=0)])
def test_bad_range_arguments(broker, kw):
    b = broker(lambda conn, req: None)
    args = dict(in_flight=4, per_pull=32)
    args.update(kw)
    with pytest.raises((ValueError, RmqRemotingError)):
        puller_for(b, 0, 10, **args)


# ------------------------------------------------------------------ the header parser

_EXT_INT = st.integers(-(2**63), 2**63 - 1).map(str)
_EXT = st.fixed_dictionaries({}, optional={"nextBeginOffset": _EXT_INT, "minOffset": _EXT_INT,
                                           "maxOffset": _EXT_INT, "suggestWhichBrokerId": _EXT_INT}
                             ).flatmap(lambda d: st.dictionaries(
                                 st.text(min_size=1, max_size=6), st.text(max_size=12), max_size=3
                             ).map(lambda other: {**other, **d}))


@settings(max_examples=300, deadline=None)
@given(code=st.integers(-32768, 32767), opaque=st.integers(-(2**31), 2**31 - 1),
       flag=st.integers(0, 3), remark=st.one_of(st.none(), st.text(max_size=30)), ext=_EXT,
       body=st.binary(max_size=40), stype=st.sampled_from([0, 1]))
def test_header_parser_agrees_with_the_python_decoder(code, opaque, flag, remark, ext, body, stype):
    frame = frames.encode(RemotingCommand(code, ext, body, opaque=opaque, flag=flag, remark=remark,
                                          serialize_type=stype))[4:]
    got = parse_header(frame)
    cmd = frames.decode(frame)
    assert (got["code"], got["opaque"], got["flag"]) == (cmd.code, cmd.opaque, cmd.flag)
    assert frame[4 + got["header_len"]:] == body
    assert got["has_next_begin"] == ("nextBeginOffset" in cmd.ext_fields)
    for key, name in [("nextBeginOffset", "next_begin_offset"), ("minOffset", "min_offset"),
                      ("maxOffset", "max_offset"), ("suggestWhichBrokerId", "suggest_broker_id")]:
        assert got[name] == int(cmd.ext_fields.get(key, 0))


@pytest.mark.parametrize("header", [
    b'{"code":0,"opaque":1,"flag":1,"extFields":{"nextBeginOffset":"12x"}}',
    b'{"code":0,"opaque":1,"flag":1,"extFields":{"minOffset":"99999999999999999999"}}',
    b'{"code":0,"opaque":1}',
    b'{"code":0,"opaque":1,"flag":1} x',
    b'{"code":0,"opaque":1,"flag":1,"extFields":{"a":"b"',
    b'{"code":4294967296,"opaque":1,"flag":1}',
    b'{"code":0,"opaque":1,"flag":1,"remark":"unterminated}',
    b'{' * 60,
])
def test_headers_no_server_writes_are_protocol_errors(header):
    with pytest.raises(RmqRemotingProtocolError, match="PROTOCOL: bad header"):
        parse_header(struct.pack(">i", len(header)) + header)


def test_json_the_java_servers_write_is_read():
    """fastjson's order and spacing vary; null members and nested values are passed over."""
    header = (b' { "extFields" : { "suggestWhichBrokerId" : "1", "nested": {"a": [1, {"b": null}]}, '
              b'"nextBeginOffset":"64" , "minOffset":-3 } , "remark":null, "code":0,"flag":1,'
              b'"language":"JAVA","opaque":77,"serializeTypeCurrentRPC":"JSON","version":475 } ')
    got = parse_header(struct.pack(">i", len(header)) + header + b"BODY")
    assert (got["code"], got["opaque"], got["flag"], got["next_begin_offset"], got["min_offset"],
            got["suggest_broker_id"], got["has_next_begin"]) == (0, 77, 1, 64, -3, 1, 1)


def test_a_proxy_pull_answer_is_read():
    """A RocketMQ 5.3 Proxy relays the broker's answer with two ext fields of its own (MSG_REGION,
    empty by default, and TRACE_ON): passed over like any field that is not an offset."""
    header = (b'{"code":0,"extFields":{"suggestWhichBrokerId":"0","groupSysFlag":"0","TRACE_ON":"false",'
              b'"nextBeginOffset":"5","MSG_REGION":"","maxOffset":"5","minOffset":"0","topicSysFlag":"0"},'
              b'"flag":1,"language":"JAVA","opaque":9,"serializeTypeCurrentRPC":"JSON","version":479}')
    got = parse_header(struct.pack(">i", len(header)) + header + b"BODY")
    assert (got["code"], got["opaque"], got["next_begin_offset"], got["max_offset"],
            got["has_next_begin"]) == (0, 9, 5, 5, 1)


def test_the_pull_template_names_the_broker_for_a_proxy():
    fields = rq.pull_fields("g", "T", 3, 0, subscription="*", broker_name="broker-a")
    header, cuts = pull_template(fields)
    ext = json.loads(header[:cuts[0]] + b"1" + header[cuts[0]:cuts[1]] + b"7" + header[cuts[1]:cuts[2]]
                     + b"32" + header[cuts[2]:])["extFields"]
    assert ext["bname"] == "broker-a" and (ext["queueOffset"], ext["maxMsgNums"]) == ("7", "32")


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=120), cut=st.integers(0, 200))
def test_header_parser_never_crashes_on_garbage_or_cut_frames(data, cut):
    valid = frames.encode(RemotingCommand(0, {"nextBeginOffset": "5"}, b"xy", opaque=3, flag=1))[4:]
    for frame in (data, valid[:cut], valid[:cut] + data):
        try:
            parse_header(frame)
        except RmqRemotingProtocolError:
            pass


def test_a_seek_after_data_drops_the_answer_held_behind_it(broker):
    calls = []

    def serve(conn, req):
        offset = int(req.ext_fields["queueOffset"])
        calls.append(offset)
        code = 1 if offset == 5 and calls.count(5) == 1 else 0
        conn.sendall(pull_answer(req, n_messages=10, cap=5, code=code, remark="held"))
    p = puller_for(broker(serve), 0, 10, in_flight=2, per_pull=5)
    d = p.next(1 << 20, 1 << 30)
    assert isinstance(d, Data) and (d.first, d.next) == (0, 5)
    p.seek(3)                                  # the caller goes on elsewhere: the held answer is stale
    rest = drain(p)
    assert all(isinstance(x, Data) for x in rest) and b"".join(x.body for x in rest) == joined(3, 10)


def test_answers_with_empty_bodies_count_as_progress(broker):
    def serve(conn, req):
        offset, nums = int(req.ext_fields["queueOffset"]), int(req.ext_fields["maxMsgNums"])
        end = min(offset + nums, 20)
        body = b"" if offset < 10 else joined(offset, end)       # e.g. every message filtered out
        conn.sendall(frames.encode(RemotingCommand(0, {"nextBeginOffset": str(end), "minOffset": "0",
                                                       "maxOffset": "20", "suggestWhichBrokerId": "0"},
                                                   body, opaque=req.opaque, flag=1)))
    pieces = drain(puller_for(broker(serve), 0, 20, in_flight=1, per_pull=5))
    assert pieces[0].first == 0 and all(d.rows == d.next - d.first for d in pieces)
    assert pieces[-1].next == 20 and b"".join(d.body for d in pieces) == joined(10, 20)


def test_no_nameserver_when_c_pulls_start_is_the_python_clients_clear_error():
    """The master's address is asked before the C core gets a connection: a NameServer that does
    not answer ends in the Python client's error naming what was tried, not in a crash."""
    from rmq_source.group.allocation import MessageQueue
    from rmq_source.remote.backend import ClusterBackend, ClusterBackendSpec
    from rmq_source.subscription import Subscription

    backend = ClusterBackend(ClusterBackendSpec(("127.0.0.1:1",), 1.0, retries=0, outage_s=0.0))
    pulls = backend._pulls(MessageQueue("T", "b", 0), 0, 10, Subscription.parse("*"))
    with pytest.raises(RmqRemotingConnectionError, match="no NameServer answered .*127.0.0.1:1"):
        next(pulls)


def _templates(n: int):
    """First pulls of queues 0..n-1 of topic T: (template, offset, count) each."""
    return [(pull_template(rq.pull_fields("g", "T", q, 0, subscription="*")), 10 * q, 4) for q in range(n)]


@given(st.permutations(range(12)), st.sets(st.integers(0, 11)), st.booleans())
@settings(max_examples=25, deadline=None)
def test_first_pulls_sent_together_match_answers_in_any_order(order, not_found, ask_meanwhile):
    """The first pulls of 12 ranges (3 of them answered at a time here, held back and sent in any
    order; some not found; a two-way request of the peer in between, which is answered "not
    supported", and an answer to nothing, which is dropped): each range gets its own answer."""
    pulls = _templates(12)
    held, refused = [], []

    def serve(conn, req):
        if req.flag & 1:                   # our answer to the peer's request
            refused.append(req)
            return
        held.append(req)
        if len(held) == 3 or int(req.ext_fields["queueId"]) == 11:      # (the last one asked)
            if ask_meanwhile and not refused:
                conn.sendall(frames.encode(RemotingCommand(34, {}, opaque=777, flag=0, language="JAVA")))
            conn.sendall(frames.encode(RemotingCommand(0, {"nextBeginOffset": "5"}, b"x", opaque=99999,
                                                       flag=1, language="JAVA")))
            rank = {q: i for i, q in enumerate(order)}
            for r in sorted(held, key=lambda r: rank[int(r.ext_fields["queueId"])]):
                q = int(r.ext_fields["queueId"])
                conn.sendall(pull_answer(r, n_messages=0 if q in not_found else 10 * q + 3, cap=32,
                                         code=rq.PULL_NOT_FOUND if q in not_found else 0))
            held.clear()

    b = Broker(serve)
    try:
        p = NativePuller(b.addr, connect_timeout=5)
        answers = p.firsts(pulls, in_flight=3, timeout_s=5, what="12 queues")
        for q, a in enumerate(answers):
            if q in not_found:
                assert (a.code, a.body) == (rq.PULL_NOT_FOUND, None), (q, a)
            else:
                assert (a.code, a.next, a.body) == (0, 10 * q + 3, joined(10 * q, 10 * q + 3)), (q, a)
        assert [int(r.ext_fields["queueOffset"]) for r in b.requests if not r.flag & 1] == \
            [10 * q for q in range(12)]
        # the puller goes on with a range afterwards
        p.close()
    finally:
        b.close()
    if ask_meanwhile:
        deadline = time.monotonic() + 10
        while not refused and time.monotonic() < deadline:
            time.sleep(0.05)
        assert refused and refused[0].code == 3 and refused[0].opaque == 777
        assert "34 not supported" in refused[0].remark


@pytest.mark.parametrize("peer, error, words", [
    ("silent", RmqRemotingTimeoutError, "no answer in 300 ms to PULL_MESSAGE at queue offset 0 (first pull 1 of 4)"),
    ("closes", RmqRemotingConnectionError, "connection closed by the peer"),
    ("garbage", RmqRemotingProtocolError, "frame length"),
])
def test_first_pulls_a_peer_fails_are_an_error_naming_them(broker, peer, error, words):
    def serve(conn, req):
        if peer == "closes":
            conn.shutdown(socket.SHUT_RDWR)
            return False
        if peer == "garbage":
            conn.sendall(struct.pack(">i", 1 << 30))
    b = broker(serve)
    p = NativePuller(b.addr, connect_timeout=5)
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")) as info:
        p.firsts(_templates(4), in_flight=2, timeout_s=0.3, what="4 queues of b")
    assert "4 queues of b" in str(info.value) and p.closed


class _Records:
    """A socket.create_connection stand-in: one end of an AF_UNIX SOCK_SEQPACKET pair, where each
    send of the puller arrives as one record at the other end (TCP would merge or split them)."""

    def __init__(self):
        self.ours, self.peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)

    def settimeout(self, _):
        pass

    def setsockopt(self, *_):
        pass

    def fileno(self):
        return self.ours.fileno()

    def close(self):
        self.ours.close()


@pytest.mark.parametrize("in_flight", [1, 3, 8])
def test_pulls_freed_by_one_receive_go_out_in_one_send(monkeypatch, in_flight):
    """The peer answers every pull in flight at once: the pulls those answers free are built as
    each answer is taken and sent together before the puller waits again (one send, not one per
    pull: on loopback a send costs about what the broker's handling of it does)."""
    link = _Records()
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: link)
    sends: list[list[RemotingCommand]] = []

    def peer():
        outstanding = []
        while True:
            try:
                record = link.peer.recv(1 << 16)
            except OSError:          # (closed at the test's end)
                return
            if not record:
                return
            reqs, at = [], 0
            while at < len(record):
                size = struct.unpack(">i", record[at:at + 4])[0]
                reqs.append(frames.decode(record[at + 4:at + 4 + size]))
                at += 4 + size
            sends.append(reqs)
            outstanding += reqs
            if len(outstanding) == in_flight or int(reqs[-1].ext_fields["queueOffset"]) + 4 >= 120:
                link.peer.sendall(b"".join(pull_answer(r, n_messages=120, cap=4) for r in outstanding))
                outstanding.clear()
    serving = threading.Thread(target=peer, daemon=True)
    serving.start()
    p = NativePuller("127.0.0.1:1", connect_timeout=5)
    p.range(TEMPLATE, 0, 120, per_pull=4, in_flight=in_flight, timeout_s=5, expect_suggest=0,
            what="T@b/3")
    try:
        assert b"".join(d.body for d in drain(p)) == joined(0, 120)
    finally:
        p.close()
        link.peer.shutdown(socket.SHUT_RDWR)
        serving.join(10)
        link.peer.close()
    asked = [int(r.ext_fields["queueOffset"]) for s in sends for r in s]
    assert asked == list(range(0, 120, 4))
    assert [len(s) for s in sends] == [in_flight] * (30 // in_flight) + (
        [30 % in_flight] if 30 % in_flight else [])


@pytest.mark.parametrize("cap, per_pull, in_flight", [(8, 32, 8), (3, 32, 4), (32, 32, 8), (5, 5, 8)])
def test_pulls_after_a_short_answer_ask_what_the_broker_answers(broker, cap, per_pull, in_flight):
    """A broker answers at most its transfer caps (8 messages from disk by default): after a
    short answer the range's pulls ask as many as it covered, so the pulls sent behind it are not
    each dropped again; every 16 full answers the size is tried twice as large (one round of
    in-flight pulls lost then, where asking 32 against a cap of 8 lost all but one each time)."""
    b = broker(lambda conn, req: conn.sendall(pull_answer(req, n_messages=400, cap=cap)))
    p = puller_for(b, 0, 400, in_flight=in_flight, per_pull=per_pull)
    assert b"".join(d.body for d in drain(p)) == joined(0, 400)
    useful = -(-400 // min(cap, per_pull))
    assert useful <= len(b.requests) <= useful + (in_flight - 1) * (1 + useful // 16), len(b.requests)


def test_the_pull_size_grows_back_after_an_answer_made_short_by_one_large_message(broker):
    """One answer covering a single offset (a message near the byte cap) does not leave the rest
    of the range pulled one message at a time: full answers double the size back to the range's."""
    def serve(conn, req):
        conn.sendall(pull_answer(req, n_messages=3000, cap=1 if req.ext_fields["queueOffset"] == "0" else 32))
    b = broker(serve)
    p = puller_for(b, 0, 3000, in_flight=8, per_pull=32)
    assert b"".join(d.body for d in drain(p)) == joined(0, 3000)
    asked = [int(r.ext_fields["maxMsgNums"]) for r in b.requests]
    assert asked[-2] == 32 and len(asked) < 3000 // 32 + 6 * 16 + 8, asked
