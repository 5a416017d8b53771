"""The remoting frame codec and connection against a small local peer that misbehaves."""
from __future__ import annotations

import json
import socket
import struct
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_source.errors import (RmqBrokerError, RmqRemotingConnectionError, RmqRemotingError,
                               RmqRemotingProtocolError, RmqRemotingTimeoutError, RmqSourceError)
from rmq_source.remote import Connection, RemotingClient, fastjson, frames
from rmq_source.remote import requests as rq
from rmq_source.remote.frames import RemotingCommand


class Peer:
    """A one-connection server on loopback; ``script(conn, request_frames)`` decides what to send."""

    def __init__(self, script):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.addr = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.script = script
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(5)
            try:
                self.script(conn)
            except OSError:
                pass
            time.sleep(0.3)

    def close(self):
        self.sock.close()


def _recv_exactly(conn, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:       # the client closed: without this the peer's thread spins forever
            raise ConnectionResetError("the client closed the connection")
        data += chunk
    return data


def read_request(conn) -> RemotingCommand:
    total = struct.unpack(">i", _recv_exactly(conn, 4))[0]
    return frames.decode(_recv_exactly(conn, total))


def answer(req, code=0, body=b"", ext=None, stype=frames.SERIALIZE_JSON, remark=None) -> bytes:
    return frames.encode(RemotingCommand(code, ext or {}, body, opaque=req.opaque, flag=1,
                                         serialize_type=stype, remark=remark, language="JAVA"))


@pytest.fixture(params=[True, False], ids=["reader-thread", "inline-reads"])
def connect(request):
    """Connections of both reading modes: a reader thread, or the waiting caller reads."""
    return lambda addr: Connection(addr, reader_thread=request.param)


@pytest.fixture
def peer():
    peers = []

    def make(script):
        p = Peer(script)
        peers.append(p)
        return p
    yield make
    for p in peers:
        p.close()


@pytest.mark.parametrize("stype", [frames.SERIALIZE_JSON, frames.SERIALIZE_ROCKETMQ])
def test_answers_in_either_header_form(peer, connect, stype):
    def script(conn):
        req = read_request(conn)
        conn.sendall(answer(req, ext={"offset": "42", "k": "v"}, body=b"payload", stype=stype))
    p = peer(script)
    with connect(p.addr) as c:
        resp = c.invoke(30, {"topic": "T", "queueId": 1}, timeout=5)
    assert (resp.code, resp.ext_fields, resp.body, resp.serialize_type) == (0, {"offset": "42", "k": "v"},
                                                                          b"payload", stype)


def test_answers_matched_by_opaque_out_of_order(peer, connect):
    def script(conn):
        a, b = read_request(conn), read_request(conn)
        conn.sendall(answer(b, ext={"n": b.ext_fields["n"]}) + answer(a, ext={"n": a.ext_fields["n"]}))
    p = peer(script)
    results = {}
    with connect(p.addr) as c:
        threads = [threading.Thread(target=lambda n=n: results.__setitem__(n, c.invoke(30, {"n": n}, timeout=5)))
                   for n in ("1", "2")]
        for t in threads:
            t.start()
            time.sleep(0.1)
        for t in threads:
            t.join(10)
    assert {n: r.ext_fields["n"] for n, r in results.items()} == {"1": "1", "2": "2"}


def test_requests_written_together_get_their_own_answers(peer, connect):
    """send_many: the requests arrive whole, in order, each with its own opaque; answers sent in
    the reverse order reach their calls; an empty list sends nothing."""
    got = []

    def script(conn):
        reqs = [read_request(conn) for _ in range(40)]
        got.extend(reqs)
        conn.sendall(b"".join(answer(r, ext={"n": r.ext_fields["n"]}) for r in reversed(reqs)))
    p = peer(script)
    with connect(p.addr) as c:
        assert c.send_many(15, []) == []
        calls = c.send_many(15, [{"n": str(n), "topic": "T"} for n in range(40)], timeout=5)
        answers = [call.result().ext_fields["n"] for call in calls]
    assert answers == [str(n) for n in range(40)]
    assert [r.ext_fields["n"] for r in got] == answers and len({r.opaque for r in got}) == 40
    assert all(r.code == 15 and r.ext_fields["topic"] == "T" for r in got)


def test_requests_written_together_refused_whole_when_one_cannot_be_a_frame(peer, connect):
    p = peer(lambda conn: conn.recv(1))
    with connect(p.addr) as c:
        with pytest.raises(RmqRemotingProtocolError, match="exceeds"):
            c.send_many(15, [{"n": "1"}, {"n": "x" * (frames.MAX_FRAME + 1)}], timeout=5)
        assert c._pending == {}      # (no call is left waiting for an answer)


def test_oversized_frame_fails_with_peer_and_request(peer, connect):
    def script(conn):
        read_request(conn)
        conn.sendall(struct.pack(">i", frames.MAX_FRAME + 1) + b"\0" * 64)
    p = peer(script)
    c = connect(p.addr)
    t0 = time.monotonic()
    with pytest.raises(RmqRemotingProtocolError) as err:
        c.invoke(105, {"topic": "Big"}, timeout=5)
    assert time.monotonic() - t0 < 3
    msg = str(err.value)
    assert "16777216" in msg and p.addr in msg and "GET_ROUTEINFO_BY_TOPIC" in msg and "topic=Big" in msg
    assert isinstance(err.value, RmqSourceError) and isinstance(err.value, OSError)
    with pytest.raises(RmqRemotingConnectionError):      # the connection is closed after that
        c.invoke(105, {"topic": "Big"}, timeout=5)


def test_truncated_frame(peer, connect):
    def script(conn):
        req = read_request(conn)
        conn.sendall(answer(req, body=b"x" * 100)[:-30])
        conn.shutdown(socket.SHUT_WR)
    p = peer(script)
    with connect(p.addr) as c, pytest.raises(RmqRemotingConnectionError) as err:
        c.invoke(30, {"topic": "T"}, timeout=5)
    assert "truncated frame" in str(err.value) and p.addr in str(err.value)
    assert isinstance(err.value, ConnectionError)


def test_an_http2_server_is_named_as_one(peer, connect):
    """A gRPC port (a RocketMQ 5 Proxy's, say) answers any new connection with an HTTP/2 SETTINGS
    frame and closes it after our frame: the error says what the peer is and which port to name."""
    def script(conn):
        read_request(conn)
        conn.sendall(b"\0\0\x12\x04\0\0\0\0\0" + b"\0\x03\0\0\x7f\xff" * 3 + b"\0\0\x08\x07\0\0\0\0\0")
        conn.shutdown(socket.SHUT_WR)
    p = peer(script)
    with connect(p.addr) as c, pytest.raises(RmqRemotingProtocolError) as err:
        c.invoke(105, {"topic": "T"}, timeout=5)
    assert "HTTP/2" in str(err.value) and "remotingListenPort" in str(err.value) and p.addr in str(err.value)


@pytest.mark.parametrize("bad", [
    struct.pack(">ii", 4, 9 << 24),                       # unknown serialize type
    struct.pack(">ii", 8, 100) + b"abcd",                 # header longer than the frame
    struct.pack(">ii", 9, 5) + b"{oops",                  # JSON header that is not JSON
    struct.pack(">ii", 2, 0),                             # length shorter than its own field
    struct.pack(">ii", 14, 10) + struct.pack(">hBhii", 0, 0, 0, 0, 1)[:10],   # binary header cut short
], ids=["serialize-type", "header-length", "json", "short-length", "binary-header"])
def test_bad_frames_are_protocol_errors(peer, connect, bad):
    if bad[4] == 0 and len(bad) == 14:
        bad = struct.pack(">ii", 14, (1 << 24) | 10) + bad[8:]
    def script(conn):
        read_request(conn)
        conn.sendall(bad)
    p = peer(script)
    with connect(p.addr) as c, pytest.raises(RmqRemotingProtocolError) as err:
        c.invoke(31, {"topic": "T"}, timeout=5)
    assert p.addr in str(err.value) and "GET_MIN_OFFSET" in str(err.value)


def test_timeout_when_peer_is_silent_and_late_answer_is_dropped(peer, connect):
    gate = threading.Event()

    def script(conn):
        first = read_request(conn)
        gate.wait(5)
        conn.sendall(answer(first, ext={"which": "late"}))
        second = read_request(conn)
        conn.sendall(answer(second, ext={"which": "second"}))
    p = peer(script)
    with connect(p.addr) as c:
        t0 = time.monotonic()
        with pytest.raises(RmqRemotingTimeoutError) as err:
            c.invoke(30, {"topic": "T"}, timeout=0.5)
        assert 0.4 < time.monotonic() - t0 < 2
        assert isinstance(err.value, TimeoutError) and "GET_MAX_OFFSET" in str(err.value)
        gate.set()
        assert c.invoke(30, timeout=5).ext_fields == {"which": "second"}


def test_unknown_answer_code_is_broker_error(peer):
    def script(conn):
        req = read_request(conn)
        conn.sendall(answer(req, code=12345, remark="what is this"))
    p = peer(script)
    with RemotingClient(timeout=5) as client, pytest.raises(RmqBrokerError) as err:
        client.invoke(p.addr, 11, {"topic": "T", "queueId": 0})
    assert err.value.code == 12345 and err.value.remark == "what is this"
    assert "PULL_MESSAGE" in str(err.value) and p.addr in str(err.value)


def test_server_request_answered_not_supported_and_oneway(peer):
    got = {}

    def script(conn):
        conn.sendall(frames.encode(RemotingCommand(307, {"consumerGroup": "g"}, opaque=99, language="JAVA")))
        got["answer"] = read_request(conn)
        got["oneway"] = read_request(conn)
    p = peer(script)
    with Connection(p.addr) as c:
        time.sleep(0.3)
        c.invoke_oneway(15, {"x": "1"})
        p.thread.join(5)
    assert got["answer"].is_response and got["answer"].opaque == 99
    assert got["answer"].code == 3
    assert got["oneway"].is_oneway and got["oneway"].ext_fields == {"x": "1"}


def test_inline_reads_serve_server_requests_while_a_call_waits(peer):
    got = {}

    def script(conn):
        conn.sendall(frames.encode(RemotingCommand(307, {"consumerGroup": "g"}, opaque=99, language="JAVA")))
        req = read_request(conn)
        got["answer"] = read_request(conn)
        conn.sendall(answer(req, ext={"offset": "7"}))
    p = peer(script)
    with Connection(p.addr, reader_thread=False) as c:
        assert c.invoke(30, {"topic": "T"}, timeout=5).ext_fields == {"offset": "7"}
    assert got["answer"].is_response and got["answer"].opaque == 99 and got["answer"].code == 3


def test_connect_refused_and_closed_peer():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(RmqRemotingConnectionError) as err:
        Connection(f"127.0.0.1:{port}")
    assert f"127.0.0.1:{port}" in str(err.value)


def test_peer_closes_without_answer(peer, connect):
    def script(conn):
        read_request(conn)
    p = peer(script)
    with connect(p.addr) as c, pytest.raises(RmqRemotingConnectionError) as err:
        c.invoke(30, timeout=5)
    assert "closed by the peer" in str(err.value)


def test_sending_oversized_frame_is_refused_before_sending(peer, connect):
    p = peer(lambda conn: time.sleep(1))
    with connect(p.addr) as c, pytest.raises(RmqRemotingProtocolError):
        c.invoke(10, {"topic": "T"}, b"\0" * frames.MAX_FRAME, timeout=5)


def test_fastjson_integer_keys():
    text = '{"brokerAddrTable":{"b":{"brokerAddrs":{0:"127.0.0.1:1",1:"x,2:y"}}},"n":{-1:"a"}}'
    data = frames.loads_fastjson(text)
    assert data["brokerAddrTable"]["b"]["brokerAddrs"] == {0: "127.0.0.1:1", 1: "x,2:y"}
    assert data["n"] == {-1: "a"}


def test_fastjson_object_keys():
    # TopicStatsTable as fastjson writes it: MessageQueue objects as map keys
    text = ('{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T:{x}"}:{"maxOffset":5,"minOffset":0},'
            ' {"brokerName":"b","queueId":1,"topic":"T"} : {"maxOffset":-1.5e3,"minOffset":null}},"ok":true}')
    data = fastjson.loads(text)
    (k0, v0), (k1, v1) = data["offsetTable"].items()
    assert isinstance(k0, fastjson.ObjectKey) and dict(k0) == {"brokerName": "b", "queueId": 0, "topic": "T:{x}"}
    assert v0 == {"maxOffset": 5, "minOffset": 0}
    assert dict(k1)["queueId"] == 1 and v1 == {"maxOffset": -1500.0, "minOffset": None}
    assert data["ok"] is True


def _fastjson_table(entries, *, space="", tail="") -> bytes:
    """A statistics answer as fastjson writes it: ``offsetTable`` keyed by MessageQueue objects."""
    parts = [json.dumps(k, separators=(",", ":")) + space + ":" + space + json.dumps(v, separators=(",", ":"))
             for k, v in entries]
    return ('{"consumeTps":0.0,"offsetTable":{' + ",".join(parts) + "}" + tail + "}").encode()


_NAMES = st.text(alphabet='ab}:{"\\,', min_size=1, max_size=6)
_VALUES = st.dictionaries(st.sampled_from(["maxOffset", "minOffset", "consumerOffset", "x"]),
                          st.one_of(st.integers(-5, 2**62), st.text(alphabet="}:{,", max_size=4),
                                    st.lists(st.integers(0, 3), max_size=2)), max_size=4)


@settings(max_examples=300, deadline=None)
@given(topic=_NAMES, other=_NAMES, values=st.lists(_VALUES, max_size=6), space=st.sampled_from(["", " "]),
       tail=st.sampled_from(["", ',"z":1', ',"z":{"a":1}', ',"z":[{}]']), foreign=st.booleans())
def test_statistics_tables_read_fast_as_the_full_parser_reads_them(topic, other, values, space, tail, foreign):
    """The fast path of large statistics answers (fastjson.keyed_by_objects) gives what the full
    parser gives, or steps aside: names holding ``}:{``, spaces, a member after the table; an
    entry of another topic is refused either way."""
    entries = [({"brokerName": "b", "queueId": i, "topic": other if foreign and i == len(values) - 1 else topic}, v)
               for i, v in enumerate(values)]
    body = _fastjson_table(entries, space=space, tail=tail)
    if foreign and values and other != topic:
        with pytest.raises(RmqRemotingProtocolError, match="unexpected statistics entry"):
            rq._queue_table(body, "Q", "peer", topic)
        return
    assert rq._queue_table(body, "Q", "peer", topic) == {i: v for i, v in enumerate(values)}
    if not space and tail in ("", ',"z":1') and "}:{" not in json.dumps(entries):
        assert fastjson.keyed_by_objects(body, "offsetTable") is not None   # (the fast path read it)
    full = {dict(k)["queueId"]: v for k, v in fastjson.loads(body)["offsetTable"].items()}
    assert full == {i: v for i, v in enumerate(values)}


@pytest.mark.parametrize("text, where", [
    ('{{"a":1}', "expected ':'"), ('{"a":1,}', "expected a value"), ('{"a" 1}', "expected ':'"),
    ('[1 2]', "expected ',' or ']'"), ('{"a":1} x', "extra data"), ('{', "unexpected end"),
])
def test_fastjson_errors_name_the_position(text, where):
    with pytest.raises(ValueError, match=where):
        fastjson.loads(text)


@settings(max_examples=200, deadline=None)
@given(code=st.integers(-32768, 32767), opaque=st.integers(0, 2**31 - 1), flag=st.integers(0, 3),
       remark=st.one_of(st.none(), st.text(min_size=1, max_size=20)),
       ext=st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=20), max_size=5),
       body=st.binary(max_size=64), stype=st.sampled_from([0, 1]))
def test_roundtrip(code, opaque, flag, remark, ext, body, stype):
    cmd = RemotingCommand(code, ext, body, opaque=opaque, flag=flag, remark=remark, serialize_type=stype)
    out = frames.decode(frames.encode(cmd)[4:])
    assert (out.code, out.opaque, out.flag, out.ext_fields, out.body, out.remark) == (
        code, opaque, flag, ext, body, remark)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=80))
def test_garbage_never_crashes(data):
    try:
        frames.decode(data)
    except RmqRemotingError:
        pass


@pytest.mark.parametrize("code, remark, refused", [
    (16, "no permission", True),                                          # a 5.x broker
    (1, "org.apache.rocketmq.acl.common.AclException: [10003]", True),    # 4.9's plain ACL
    (1, "check signature failed.", True),                                 # a 5.x Proxy (ACL 2.0)
    (1, "User:bob is not found.", True),
    (1, "User:bob is disabled.", True),
    (1, "Authentication failed. Please verify the credentials and try again.", True),
    (1, "User:bob has no permission to access Topic:T from 127.0.0.1, Pub", True),
    (1, "no consumer for this group, ProxyGroup", False),
    (1, 'Cannot invoke "ConsumerGroupInfo.getAllClientId()" because "consumerGroupInfo" is null', False),
    (3, " request type 202 not supported", False),
])
def test_refused_credentials_are_told_from_other_errors(code, remark, refused):
    from rmq_source.remote.client import is_auth_failure
    assert is_auth_failure(RemotingCommand(code, remark=remark)) is refused


@pytest.mark.parametrize("remark, none", [
    ('Cannot invoke "org.apache.rocketmq.broker.client.ConsumerGroupInfo.getAllClientId()" because '
     '"consumerGroupInfo" is null', True),      # a Proxy on Java 15+ (helpful NPE messages)
    (None, True), ("null", True),               # ... before (the NPE has no message)
    ("check signature failed.", False),
    ("broker busy", False),
])
def test_a_proxy_without_members_of_the_group_answers_no_member(remark, none):
    from rmq_source.remote.requests import _no_member_at_proxy
    assert _no_member_at_proxy(remark) is none


@pytest.mark.parametrize("kind", ["one", "batch"])
@pytest.mark.parametrize("busy, taken", [(0, True), (rq.SHED_RETRIES, True), (rq.SHED_RETRIES + 1, False)])
def test_a_send_the_broker_shed_is_sent_again(peer, kind, busy, taken):
    """SYSTEM_BUSY to a send (the broker stored nothing: its queue waited too long) makes the send
    again, SHED_RETRIES times at most; a broker still busy then fails it with its remark. Other
    refusals are not retried (one request)."""
    seen = []

    def script(conn):
        while True:
            req = read_request(conn)
            seen.append(req.code)
            if len(seen) <= busy:
                conn.sendall(answer(req, code=rq.SYSTEM_BUSY, remark="[TIMEOUT_CLEAN_QUEUE]broker busy"))
            else:
                conn.sendall(answer(req, ext={"msgId": "M", "queueId": "0", "queueOffset": "7"}))

    p = peer(script)
    with RemotingClient(timeout=5) as client:
        def send():
            if kind == "one":
                return rq.send_message(client, p.addr, "T", b"x")
            return rq.send_batch(client, p.addr, "T", [{"body": b"x"}, {"body": b"y"}])
        if taken:
            assert send().queue_offset == 7
        else:
            with pytest.raises(RmqBrokerError, match="TIMEOUT_CLEAN_QUEUE") as info:
                send()
            assert info.value.code == rq.SYSTEM_BUSY
    assert len(seen) == min(busy, rq.SHED_RETRIES + 1) + (1 if taken else 0)


def test_a_send_refused_otherwise_is_not_sent_again(peer):
    seen = []

    def script(conn):
        while True:
            req = read_request(conn)
            seen.append(req.code)
            conn.sendall(answer(req, code=1, remark="system error"))

    p = peer(script)
    with RemotingClient(timeout=5) as client:
        with pytest.raises(RmqBrokerError, match="system error"):
            rq.send_message(client, p.addr, "T", b"x")
    assert len(seen) == 1
