"""Connections speaking the remoting protocol: opaque-matched answers, oneway requests, timeouts.

One reader thread a connection reads frames and hands each answer to the call waiting on its opaque
(or, on connections made without it, the calls waiting read the socket in turn).
Every wait has a deadline; a broken, oversized or truncated frame closes the connection and fails
every call on it with an error naming the peer and the request. Requests the server sends to us
(after a heartbeat: consumer ids changed, running info) go to ``on_request``; without a handler a
two-way one is answered "not supported".
"""
from __future__ import annotations

import itertools
import re
import select
import socket
import ssl
import struct
import threading
import time
from typing import Callable

from rmq_source.errors import (RmqAuthError, RmqBrokerError, RmqRemotingConnectionError,
                               RmqRemotingError, RmqRemotingProtocolError, RmqRemotingTimeoutError)
from rmq_source.remote import frames
from rmq_source.remote.acl import Credentials, signed_fields
from rmq_source.remote.frames import RemotingCommand
from rmq_source.remote.tls import TlsConfig, TlsStream

DEFAULT_TIMEOUT = 10.0
CONNECT_TIMEOUT = 5.0
REQUEST_CODE_NOT_SUPPORTED = 3
SYSTEM_ERROR = 1
NO_PERMISSION = 16
#: how long a send the TLS session refused waits for the reader to read why the server ended it
TLS_VERDICT_S = 5.0

#: Names of the request codes this package sends, for messages.
REQUEST_NAMES = {
    10: "SEND_MESSAGE", 11: "PULL_MESSAGE", 14: "QUERY_CONSUMER_OFFSET", 15: "UPDATE_CONSUMER_OFFSET",
    17: "UPDATE_AND_CREATE_TOPIC", 29: "SEARCH_OFFSET_BY_TIMESTAMP", 30: "GET_MAX_OFFSET",
    31: "GET_MIN_OFFSET", 34: "HEART_BEAT", 35: "UNREGISTER_CLIENT", 38: "GET_CONSUMER_LIST_BY_GROUP",
    41: "LOCK_BATCH_MQ", 42: "UNLOCK_BATCH_MQ", 105: "GET_ROUTEINFO_BY_TOPIC",
    106: "GET_BROKER_CLUSTER_INFO", 202: "GET_TOPIC_STATS_INFO", 206: "GET_ALL_TOPIC_LIST_FROM_NAMESERVER",
    310: "SEND_MESSAGE_V2", 320: "SEND_BATCH_MESSAGE",
}
_I32 = struct.Struct(">i")
READ_BUFFER = 256 << 10


def _looks_like_http2(buf: bytes | bytearray) -> bool:
    """Whether an answer starts like an HTTP/2 server's first frame (9-byte header: 24-bit
    length, type 4 = SETTINGS, flags, stream 0), which a gRPC server sends to any new connection."""
    return len(buf) >= 9 and buf[3] == 0x04 and buf[5:9] == b"\0\0\0\0" and buf[0] == 0


def describe(cmd: RemotingCommand) -> str:
    name = REQUEST_NAMES.get(cmd.code, "request")
    keys = ("topic", "queueId", "consumerGroup", "queueOffset", "b", "e")
    shown = ", ".join(f"{k}={cmd.ext_fields[k]}" for k in keys if k in cmd.ext_fields)
    return f"{name}({cmd.code}{', ' + shown if shown else ''})"


class _Pending:
    """An answer to come. ``done`` is a lock taken at creation and released exactly once, by
    whoever removes the entry from the connection's table (the reader with the answer, or a
    failing connection with its error): cheaper than an Event for one waiter."""

    __slots__ = ("done", "response", "error")

    def __init__(self):
        self.done = threading.Lock()
        self.done.acquire()
        self.response: RemotingCommand | None = None
        self.error: BaseException | None = None


class Call:
    """A request on its way: :meth:`result` waits for the answer until the call's deadline (set
    when it was sent). Several calls may be in flight on one connection; a call whose answer is
    no longer wanted is :meth:`cancel`-led, so an answer arriving later is dropped."""

    __slots__ = ("conn", "cmd", "pending", "deadline", "timeout")

    def __init__(self, conn: "Connection", cmd: RemotingCommand, pending: _Pending, deadline: float,
                 timeout: float):
        self.conn, self.cmd, self.pending, self.deadline, self.timeout = conn, cmd, pending, deadline, timeout

    def result(self) -> RemotingCommand:
        """The answer (any code: see :func:`check`); RmqRemotingTimeoutError after the deadline,
        RmqRemotingConnectionError when the connection broke first."""
        pending = self.pending
        if self.conn._reader is None:
            self.conn._read_until(pending, self.deadline)
        if not pending.done.acquire(timeout=max(0.0, self.deadline - time.monotonic())):
            self.cancel()
            raise RmqRemotingTimeoutError(f"no answer in {self.timeout} s", peer=self.conn.addr,
                                          request=describe(self.cmd))
        if pending.error is not None:
            err = pending.error
            raise type(err)(err.reason, peer=self.conn.addr, request=describe(self.cmd)) from err
        return pending.response

    def cancel(self) -> None:
        with self.conn._lock:
            self.conn._pending.pop(self.cmd.opaque, None)


class Connection:
    """One TCP connection to a NameServer or broker (``host:port``; IPv6 as ``[::1]:port``)."""

    def __init__(self, addr: str, *, connect_timeout: float = CONNECT_TIMEOUT,
                 serialize_type: int = frames.SERIALIZE_JSON,
                 on_request: Callable[[RemotingCommand], RemotingCommand | None] | None = None,
                 credentials: Credentials | None = None, reader_thread: bool = True,
                 tls: TlsConfig | None = None):
        """With ``credentials`` every request is ACL-signed (:mod:`rmq_source.remote.acl`); with
        ``tls`` the connection speaks TLS (:mod:`rmq_source.remote.tls`, handshake here).
        Without ``reader_thread`` the threads waiting for answers read the socket themselves (one
        at a time, each handing out every answer it reads): no thread switch per answer, for
        connections that only carry requests and their answers (pulls); requests the server
        sends are then only served while a call waits."""
        self.addr = addr
        self.serialize_type = serialize_type
        self.on_request = on_request
        self.credentials = credentials
        host, _, port = addr.rpartition(":")
        host = host.strip("[]")
        try:
            self._sock = socket.create_connection((host, int(port)), timeout=connect_timeout)
        except socket.timeout as exc:
            raise RmqRemotingTimeoutError(f"connect timed out after {connect_timeout} s",
                                          peer=addr) from exc
        except (OSError, ValueError) as exc:
            raise RmqRemotingConnectionError(f"cannot connect: {exc}", peer=addr) from exc
        self._sock.settimeout(None)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._tls = None
        self._answered = False
        if tls is not None:
            try:
                self._tls = TlsStream(self._sock, tls, host, addr, connect_timeout)
            except BaseException:
                self._sock.close()
                raise
        self._opaque = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._closed = False
        self._failed = threading.Event()   # set with _closed (the reader's verdict, for senders)
        self.close_reason: RmqRemotingError | None = None
        self._rbuf = bytearray()          # bytes received, not yet a whole frame
        self._read_lock = threading.Lock()
        self._reader = None
        if reader_thread:
            self._reader = threading.Thread(target=self._read_loop, name=f"rmq-remoting-{addr}",
                                            daemon=True)
            self._reader.start()

    # ------------------------------------------------------------------ public
    @property
    def closed(self) -> bool:
        return self._closed

    def invoke(self, code: int, ext_fields: dict | None = None, body: bytes = b"", *,
               timeout: float = DEFAULT_TIMEOUT) -> RemotingCommand:
        """Send a request and return its answer (any code: see :func:`check`)."""
        return self.send(code, ext_fields, body, timeout=timeout).result()

    def send(self, code: int, ext_fields: dict | None = None, body: bytes = b"", *,
             timeout: float = DEFAULT_TIMEOUT, serialize_type: int | None = None) -> Call:
        """Send a request without waiting for its answer: :meth:`Call.result` waits for it.
        ``serialize_type``: this request's header form, when not the connection's (servers
        answer in the request's)."""
        cmd = RemotingCommand(code, self._fields(ext_fields, body), body,
                              serialize_type=(self.serialize_type if serialize_type is None
                                              else serialize_type))
        cmd.opaque = next(self._opaque) & 0x7FFFFFFF
        pending = _Pending()
        with self._lock:
            self._raise_if_closed(cmd)
            self._pending[cmd.opaque] = pending
        deadline = time.monotonic() + timeout
        call = Call(self, cmd, pending, deadline, timeout)
        try:
            self._send(cmd, deadline)
        except BaseException:
            call.cancel()
            raise
        return call

    def send_many(self, code: int, fields: list[dict], *, timeout: float = DEFAULT_TIMEOUT) -> list[Call]:
        """:meth:`send` of one request (no body) per entry of ``fields``, written to the socket
        together: one system call for them all instead of one each."""
        cmds = [RemotingCommand(code, self._fields(ext, b""), b"", serialize_type=self.serialize_type)
                for ext in fields]
        if not cmds:
            return []
        calls = []
        deadline = time.monotonic() + timeout
        with self._lock:
            self._raise_if_closed(cmds[0])
            for cmd in cmds:
                cmd.opaque = next(self._opaque) & 0x7FFFFFFF
                pending = self._pending[cmd.opaque] = _Pending()
                calls.append(Call(self, cmd, pending, deadline, timeout))
        try:
            self._send_encoded(b"".join(self._encode(cmd) for cmd in cmds), deadline, cmds[0])
        except BaseException:
            for call in calls:
                call.cancel()
            raise
        return calls

    def invoke_oneway(self, code: int, ext_fields: dict | None = None, body: bytes = b"", *,
                      timeout: float = DEFAULT_TIMEOUT) -> None:
        cmd = RemotingCommand(code, self._fields(ext_fields, body), body, flag=frames.FLAG_ONEWAY,
                              serialize_type=self.serialize_type)
        cmd.opaque = next(self._opaque) & 0x7FFFFFFF
        with self._lock:
            self._raise_if_closed(cmd)
        self._send(cmd, time.monotonic() + timeout)

    def close(self) -> None:
        self._fail(RmqRemotingConnectionError("connection closed by the client", peer=self.addr))

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Connection({self.addr!r}{', closed' if self._closed else ''})"

    # ------------------------------------------------------------------ internals
    def _fields(self, ext_fields: dict | None, body: bytes) -> dict[str, str]:
        fields = frames.str_fields(ext_fields or {})
        return fields if self.credentials is None else signed_fields(fields, body, self.credentials)

    def _raise_if_closed(self, cmd: RemotingCommand) -> None:
        if self._closed:
            why = str(self.close_reason).split("; peer:")[0] if self.close_reason else "closed"
            raise RmqRemotingConnectionError(f"connection is closed ({why})", peer=self.addr,
                                             request=describe(cmd))

    def _send(self, cmd: RemotingCommand, deadline: float) -> None:
        self._send_encoded(self._encode(cmd), deadline, cmd)

    def _encode(self, cmd: RemotingCommand) -> bytes:
        try:
            return frames.encode(cmd)
        except RmqRemotingError as exc:
            raise type(exc)(str(exc), peer=self.addr, request=describe(cmd)) from None

    def _send_encoded(self, data: bytes, deadline: float, cmd: RemotingCommand) -> None:
        """Write the frames ``data`` (of ``cmd``, the first of them, named in errors)."""
        data = memoryview(data)
        with self._send_lock:
            if self._tls is not None:
                try:
                    data = memoryview(self._tls.encrypt(data))
                except (ssl.SSLError, OSError) as exc:
                    raise self._session_ended(cmd, exc) from None
            self._write_all(data, deadline, cmd)

    def _session_ended(self, cmd: RemotingCommand, exc: BaseException) -> RmqRemotingConnectionError:
        """The error of a send the TLS session refused because the server ended it (an alert,
        e.g. for a missing client certificate, read by the reader meanwhile). The reader thread
        fails the connection with the server's reason as it reads it: that reason is given."""
        if self._reader is not None:
            self._failed.wait(TLS_VERDICT_S)
        self._fail(RmqRemotingConnectionError(f"the TLS session ended: {exc}", peer=self.addr))
        why = str(self.close_reason).split("; peer:")[0]
        return RmqRemotingConnectionError(f"connection is closed ({why})", peer=self.addr,
                                          request=describe(cmd))

    def _write_all(self, data: memoryview, deadline: float, cmd: RemotingCommand | None) -> None:
        """Send ``data`` on the socket (the send lock held); a failure fails the connection."""
        def what() -> str:                      # (named only in errors: not per send)
            return describe(cmd) if cmd is not None else "TLS records"
        while data:
            try:
                n = self._sock.send(data, socket.MSG_DONTWAIT)
            except BlockingIOError:       # the peer's window is full: wait until writable
                left = deadline - time.monotonic()
                if left <= 0:
                    err = RmqRemotingTimeoutError("send timed out (peer not reading)",
                                                  peer=self.addr, request=what())
                    self._fail(err)      # a partly written frame leaves the stream unusable
                    raise err
                try:
                    select.select([], [self._sock], [], min(left, 0.5))
                except (OSError, ValueError):
                    pass                 # the send after it reports what is wrong
                continue
            except (OSError, ValueError) as exc:
                if self._closed and self.close_reason is not None:    # the reader failed it first
                    why = str(self.close_reason).split("; peer:")[0]
                    raise RmqRemotingConnectionError(f"connection is closed ({why})", peer=self.addr,
                                                     request=what()) from None
                err = RmqRemotingConnectionError(f"send failed: {exc}", peer=self.addr,
                                                 request=what())
                self._fail(err)
                raise err from exc
            data = data[n:]

    def _read_frame(self, deadline: float | None) -> bytes | None:
        """The next frame's bytes after its length prefix; None when ``deadline`` passed first
        (None: wait as long as it takes; close() wakes the wait with shutdown())."""
        buf = self._rbuf
        while True:
            if len(buf) >= 4:
                total = _I32.unpack_from(buf, 0)[0]
                try:
                    frames.check_length(total)
                except RmqRemotingProtocolError as exc:
                    raise RmqRemotingProtocolError(str(exc), peer=self.addr) from None
                if len(buf) >= 4 + total:
                    with memoryview(buf) as view:
                        payload = bytes(view[4:4 + total])     # one copy
                    del buf[:4 + total]
                    return payload
            if self._closed:
                raise _Stop()
            try:
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0 or not select.select([self._sock], [], [], left)[0]:
                        return None
                chunk = self._sock.recv(READ_BUFFER)
            except (OSError, ValueError) as exc:
                if self._closed:
                    raise _Stop() from None
                raise RmqRemotingConnectionError(f"receive failed: {exc}", peer=self.addr) from None
            if chunk and self._tls is not None:
                chunk, tls_closed = self._tls.decrypt(chunk)
                if self._tls.has_output:
                    self._send_tls_output()
                if not chunk and not tls_closed:
                    continue                 # a record not complete yet
            if not chunk:
                if self._closed:
                    raise _Stop()
                if not buf:
                    hint = ""
                    if not self._answered and self._tls is None:
                        hint = (" before answering anything (a server with tls.server.mode="
                                "enforcing closes plain connections: set useTLS=true)")
                    raise RmqRemotingConnectionError("connection closed by the peer" + hint,
                                                     peer=self.addr)
                if _looks_like_http2(buf):
                    raise RmqRemotingProtocolError(
                        "the peer answers in HTTP/2, not RocketMQ remoting: a gRPC endpoint (a "
                        "RocketMQ 5 Proxy's gRPC port, 8081 by default?); name NameServers or a "
                        "Proxy's remoting port (its remotingListenPort, 8080 by default)",
                        peer=self.addr)
                if len(buf) < 4:
                    raise RmqRemotingConnectionError(
                        f"truncated frame: the peer closed the connection after {len(buf)} of 4 "
                        f"bytes of the frame length", peer=self.addr)
                raise RmqRemotingConnectionError(
                    f"truncated frame: the peer closed the connection after {len(buf) - 4} of "
                    f"{_I32.unpack_from(buf, 0)[0]} bytes of the frame content", peer=self.addr)
            buf += chunk

    def _send_tls_output(self) -> None:
        """Records the TLS session made while reading, sent in their turn."""
        with self._send_lock:
            data = self._tls.pending_output()
            if data:
                self._write_all(memoryview(data), time.monotonic() + DEFAULT_TIMEOUT, None)

    def _dispatch(self, payload: bytes) -> None:
        try:
            cmd = frames.decode(payload)
        except RmqRemotingProtocolError as exc:
            raise RmqRemotingProtocolError(str(exc), peer=self.addr) from None
        if cmd.is_response:
            self._answered = True
            with self._lock:
                pending = self._pending.pop(cmd.opaque, None)
            if pending is not None:      # else: the caller timed out already
                pending.response = cmd
                pending.done.release()
        else:
            self._serve(cmd)

    def _read_loop(self) -> None:
        self._guarded(lambda: self._dispatch(self._read_frame(None)), forever=True)

    def _read_until(self, pending: _Pending, deadline: float) -> None:
        """Without a reader thread: read and hand out answers until ``pending`` has its own (or
        the connection failed, or ``deadline`` passed). Another thread reading meanwhile may
        hand it out instead."""
        while pending.done.locked():
            left = deadline - time.monotonic()
            if left <= 0 or not self._read_lock.acquire(timeout=left):
                return
            try:
                if pending.done.locked():
                    payload = self._guarded(lambda: self._read_frame(deadline))
                    if payload is None:
                        return
                    self._guarded(lambda: self._dispatch(payload))
            finally:
                self._read_lock.release()

    def _guarded(self, step, forever: bool = False):
        """``step()`` (repeated with ``forever``); an error of the stream fails the connection
        (every call on it gets the error), it never escapes to the thread reading."""
        try:
            while True:
                out = step()
                if not forever:
                    return out
        except _Stop:
            pass
        except RmqRemotingError as exc:
            self._fail(exc)
        except Exception as exc:  # never let a reader die silently
            self._fail(RmqRemotingProtocolError(f"reader failed: {exc!r}", peer=self.addr))
        return None

    def _serve(self, cmd: RemotingCommand) -> None:
        answer = None
        if self.on_request is not None:
            try:
                answer = self.on_request(cmd)
            except Exception as exc:
                answer = RemotingCommand(1, remark=f"client handler failed: {exc!r}")
        if cmd.is_oneway:
            return
        if answer is None:
            answer = RemotingCommand(REQUEST_CODE_NOT_SUPPORTED,
                                     remark=f"request code {cmd.code} not supported by this client")
        answer.opaque = cmd.opaque
        answer.flag |= frames.FLAG_RESPONSE
        answer.serialize_type = self.serialize_type
        try:
            self._send(answer, time.monotonic() + DEFAULT_TIMEOUT)
        except RmqRemotingError:
            pass

    def _fail(self, err: RmqRemotingError) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.close_reason = err
            pending = list(self._pending.values())
            self._pending.clear()
        self._failed.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass
        for p in pending:
            p.error = err
            p.done.release()


class _Stop(Exception):
    pass


#: the remarks of a 5.x Proxy refusing credentials or permissions: it answers SYSTEM_ERROR with
#: the message of ACL 2.0's AuthenticationException / AuthorizationException (check signature
#: failed., User:x is not found., User:x is disabled., x has no permission to access y from z, ...)
_PROXY_AUTH_REMARK = re.compile(
    r"check signature failed|^User:\S* (?:is )?(?:not found|disabled)|^username can ?not be (?:null|blank)"
    r"|^(?:Authentication|Authorization) failed\. Please verify| has no permission to access ")


def is_auth_failure(resp: RemotingCommand) -> bool:
    """The server refused the request's credentials or permissions: a 5.x broker answers
    NO_PERMISSION, 4.9's plain ACL a system error carrying its AclException, a 5.x Proxy a system
    error with the text of its authentication or authorization failure."""
    if resp.code == NO_PERMISSION:
        return True
    remark = resp.remark or ""
    return resp.code == SYSTEM_ERROR and ("AclException" in remark or bool(_PROXY_AUTH_REMARK.search(remark)))


def auth_error(resp: RemotingCommand, what: str, peer: str,
               credentials: Credentials | None) -> RmqAuthError:
    who = (f"access key {credentials.access_key!r}" if credentials is not None
           else "no credentials (if the broker has ACL on, set the options accessKey and secretKey)")
    remark = (resp.remark or "(no remark)").split("\n")[0][:400]
    return RmqAuthError(f"refused with {who}: server answered code {resp.code}: {remark}",
                        code=resp.code, remark=resp.remark, peer=peer, request=what)


def check(resp: RemotingCommand, request: RemotingCommand | str, peer: str,
          ok: tuple[int, ...] = (0,)) -> RemotingCommand:
    """``resp`` if its code is in ``ok``, else :class:`RmqBrokerError` with the code and remark
    (:class:`RmqAuthError` when the server refused the credentials or a permission)."""
    if resp.code in ok:
        return resp
    what = request if isinstance(request, str) else describe(request)
    if is_auth_failure(resp):
        raise auth_error(resp, what, peer, None)
    raise RmqBrokerError(f"server answered code {resp.code}: {resp.remark or '(no remark)'}",
                         code=resp.code, remark=resp.remark, peer=peer, request=what)


def ask_namesrvs(addrs: tuple[str, ...], what: str, call, *,
                 unreachable: tuple[type[BaseException], ...] = (RmqRemotingConnectionError,)):
    """``call(addr)`` on the first NameServer of ``addrs`` that answers (errors of the kinds in
    ``unreachable`` try the next one); every address tried is named when none answers."""
    errors = []
    for addr in addrs:
        try:
            return call(addr)
        except unreachable as exc:
            errors.append(f"{addr}: {exc}")
    raise RmqRemotingConnectionError(
        f"{what}: no NameServer answered (tried {', '.join(addrs)}): " + "; ".join(errors))


class RemotingClient:
    """Connections by address, made on first use and made again after one broke."""

    def __init__(self, *, timeout: float = DEFAULT_TIMEOUT, connect_timeout: float = CONNECT_TIMEOUT,
                 serialize_type: int = frames.SERIALIZE_JSON,
                 on_request: Callable[[RemotingCommand], RemotingCommand | None] | None = None,
                 credentials: Credentials | None = None, reader_thread: bool = True,
                 tls: TlsConfig | None = None):
        """With ``credentials`` every request is ACL-signed; an answer refusing them raises
        :class:`RmqAuthError` whatever ``ok`` a call passes (never retried here).
        ``reader_thread``, ``tls``: see :class:`Connection`."""
        self.reader_thread = reader_thread
        self.tls = tls
        self.credentials = credentials
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.serialize_type = serialize_type
        self.on_request = on_request
        self._conns: dict[str, Connection] = {}
        self._lock = threading.Lock()
        #: address -> the ``version`` of its last answer (a broker answers with its own
        #: MQVersion ordinal: 407 = 4.9.7, 439 = 5.1.3; through a Proxy an address answers for
        #: several brokers and itself, so this says little there)
        self.peer_versions: dict[str, int] = {}
        #: address -> the request codes it answered REQUEST_CODE_NOT_SUPPORTED (3): what a server
        #: does not serve is learnt once, from its first refusal (:meth:`serves`)
        self.not_served: dict[str, set[int]] = {}

    def connection(self, addr: str) -> Connection:
        with self._lock:
            conn = self._conns.get(addr)
            if conn is None or conn.closed:
                conn = Connection(addr, connect_timeout=self.connect_timeout,
                                  serialize_type=self.serialize_type, on_request=self.on_request,
                                  credentials=self.credentials, reader_thread=self.reader_thread,
                                  tls=self.tls)
                self._conns[addr] = conn
            return conn

    def invoke(self, addr: str, code: int, ext_fields: dict | None = None, body: bytes = b"", *,
               timeout: float | None = None, ok: tuple[int, ...] | None = (0,)) -> RemotingCommand:
        """Send and wait; with ``ok`` (default: success only) other codes raise RmqBrokerError."""
        return self.answer(self.send(addr, code, ext_fields, body, timeout=timeout), ok=ok)

    def send(self, addr: str, code: int, ext_fields: dict | None = None, body: bytes = b"", *,
             timeout: float | None = None, serialize_type: int | None = None) -> Call:
        """Send without waiting (several requests in flight on one connection); :meth:`answer`
        waits for the answer and checks it."""
        return self.connection(addr).send(code, ext_fields, body,
                                          timeout=self.timeout if timeout is None else timeout,
                                          serialize_type=serialize_type)

    def send_many(self, addr: str, code: int, fields: list[dict], *, timeout: float | None = None
                  ) -> list[Call]:
        """:meth:`send` of one request per entry of ``fields``, written together
        (:meth:`Connection.send_many`)."""
        return self.connection(addr).send_many(code, fields,
                                               timeout=self.timeout if timeout is None else timeout)

    def answer(self, call: Call, *, ok: tuple[int, ...] | None = (0,)) -> RemotingCommand:
        """The answer of ``call``; with ``ok`` other codes raise RmqBrokerError, a refusal of the
        credentials RmqAuthError (whatever ``ok``)."""
        resp = call.result()
        self.peer_versions[call.conn.addr] = resp.version
        if resp.code == REQUEST_CODE_NOT_SUPPORTED:
            with self._lock:
                self.not_served.setdefault(call.conn.addr, set()).add(call.cmd.code)
        if is_auth_failure(resp):
            raise auth_error(resp, describe(call.cmd), call.conn.addr, self.credentials)
        if ok is not None and resp.code not in ok:
            check(resp, call.cmd, call.conn.addr, ok)
        return resp

    def serves(self, addr: str, code: int) -> bool:
        """False once ``addr`` answered a request ``code`` with REQUEST_CODE_NOT_SUPPORTED (a 5.x
        Proxy's remoting port: GET_TOPIC_STATS_INFO, GET_BROKER_CLUSTER_INFO, topic lists...);
        True until then (also for an address never asked)."""
        with self._lock:
            return code not in self.not_served.get(addr, ())

    def invoke_oneway(self, addr: str, code: int, ext_fields: dict | None = None, body: bytes = b"") -> None:
        self.connection(addr).invoke_oneway(code, ext_fields, body, timeout=self.timeout)

    def close(self) -> None:
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
        for c in conns:
            c.close()

    def __enter__(self) -> "RemotingClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

