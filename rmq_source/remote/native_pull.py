"""Pulls of a queue range run by the C core (``native/core/netpull.c``): the requests sent ahead
and the answers read, matched and joined with no Python per answer.

A :class:`NativePuller` owns one TCP connection to one broker, used by one thread at a time and
for nothing but pulls. Requests are built from a template (:func:`pull_template`: the JSON header
of a PULL_MESSAGE with its opaque, queue offset and message count cut out), so only unsigned
requests go this way: with ACL credentials every request is signed, and pulls take the Python
client (:mod:`.client`).

:meth:`NativePuller.next` returns one of

* :class:`Data`: the bodies of consecutive SUCCESS answers joined (their CommitLog records end to
  end), from the queue offset ``first`` to ``next`` (the last answer's nextBeginOffset);
* :class:`Answer`: any other answer (not found, offset moved, busy, an error...) as a decoded
  command, with the offset it was asked for; the caller then :meth:`~NativePuller.seek`-s;
* :class:`ServerRequest`: a request the broker sent (answered "not supported" by
  :meth:`~NativePuller.refuse`);
* ``None``: the range's end was reached.

Network failures raise the remoting errors of :mod:`rmq_source.errors` naming the broker; the
puller is then unusable (:meth:`~NativePuller.close` it).
"""
from __future__ import annotations

import socket
import threading
from dataclasses import dataclass

from rmq_source.errors import (RmqRemotingConnectionError, RmqRemotingError, RmqRemotingProtocolError,
                               RmqRemotingTimeoutError)
from rmq_source.remote import frames
from rmq_source.remote.frames import RemotingCommand
from rmq_source.remote.tls import TlsConfig

PULL_MESSAGE = 11
MAX_IN_FLIGHT = 16          # NP_MAX_SLOTS of netpull.c
_OPAQUE_MARK = 1_987_654_321
_MARKS = (b'"opaque":%d' % _OPAQUE_MARK, b'"<queueOffset>"', b'"<maxMsgNums>"')


def pull_template(fields: dict, code: int = PULL_MESSAGE) -> tuple[bytes, tuple[int, int, int]] | None:
    """The JSON header of a PULL_MESSAGE (tests: another request ``code``) with ``fields`` (their
    queueOffset and maxMsgNums are replaced) and where the opaque, the queue offset and the count
    go; None when the marks used to find those places are not each once in it (a subscription may
    contain any text)."""
    ext = dict(frames.str_fields(fields), queueOffset="<queueOffset>", maxMsgNums="<maxMsgNums>")
    header = frames.encode_header(RemotingCommand(code, ext, opaque=_OPAQUE_MARK))
    at = [header.find(m) for m in _MARKS]
    if any(header.count(m) != 1 for m in _MARKS) or at != sorted(at):
        return None
    # keep the key of the opaque and the quotes of the two strings: the values go in between
    keep = (len(b'"opaque":'), 1, 1)
    out, cuts, pos = [], [], 0
    for mark, start, k in zip(_MARKS, at, keep):
        out.append(header[pos:start + k])
        cuts.append(sum(map(len, out)))
        pos = start + len(mark) - (1 if k == 1 else 0)
    out.append(header[pos:])
    return b"".join(out), (cuts[0], cuts[1], cuts[2])


def parse_header(frame: bytes) -> dict:
    """What the C core reads of a frame's header (the frame after its length field): code,
    opaque, flag and the pull answer's offsets; RmqRemotingProtocolError for a header no server
    writes. For tests against :func:`frames.decode`."""
    from rmq_source.store.native import ffi, lib
    out = ffi.new("rmq_net_header *")
    err = ffi.new("rmq_error *")
    data = bytes(frame)
    if lib.rmq_net_parse_header(ffi.from_buffer("uint8_t[]", data), len(data), out, err):
        raise RmqRemotingProtocolError(ffi.string(err.message).decode("utf-8", "replace"))
    return {k: getattr(out, k) for k in ("code", "opaque", "flag", "serialize_type", "has_next_begin",
                                         "header_len", "next_begin_offset", "min_offset",
                                         "max_offset", "suggest_broker_id")}


@dataclass
class Data:
    first: int          # the queue offset the first answer was asked at
    next: int           # the last answer's nextBeginOffset
    body: bytes | memoryview    # the answers' bodies joined (a view: NativePuller.next)
    rows: int           # queue offsets advanced (next - first)
    answers: int
    suggest: int        # the last answer's suggestWhichBrokerId


@dataclass
class First:
    """The answer to the first pull of a range (:meth:`NativePuller.firsts`)."""
    code: int           # -1: none came
    next: int           # its nextBeginOffset (-1: none)
    suggest: int        # its suggestWhichBrokerId
    body: bytes | None  # a SUCCESS answer's records when it moved past the offset asked, else None


@dataclass
class Answer:
    asked: int
    command: RemotingCommand


@dataclass
class ServerRequest:
    command: RemotingCommand


class NativePuller:
    """One connection to the broker ``addr`` (``host:port``) for pulls by the C core."""

    def __init__(self, addr: str, *, connect_timeout: float, tls: TlsConfig | None = None):
        """Connects (and with ``tls`` makes the TLS handshake in C) within ``connect_timeout``."""
        from rmq_source.store.native import ffi, lib
        self._ffi, self._lib = ffi, lib
        self.addr = addr
        host, _, port = addr.rpartition(":")
        try:
            self._sock = socket.create_connection((host.strip("[]"), int(port)), timeout=connect_timeout)
        except socket.timeout as exc:
            raise RmqRemotingTimeoutError(f"connect timed out after {connect_timeout} s", peer=addr) from exc
        except (OSError, ValueError) as exc:
            raise RmqRemotingConnectionError(f"cannot connect: {exc}", peer=addr) from exc
        self._sock.settimeout(None)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._err = ffi.new("rmq_error *")
        self._out = ffi.new("rmq_pull_out *")
        self._cuts = ffi.new("int32_t[3]")
        self._tmpl = None
        handle = lib.rmq_puller_new(self._sock.fileno(), self._err)
        if handle == ffi.NULL:
            self._sock.close()
            self._raise("opening the puller")
        self._handle = ffi.gc(handle, lib.rmq_puller_free)
        self.range_desc = ""
        if tls is not None:
            check_host = host.strip("[]").encode() if tls.verify_hostname else None
            if lib.rmq_puller_tls(self._handle, _native_context(tls),
                                  ffi.new("char[]", check_host) if check_host else ffi.NULL,
                                  max(1, int(connect_timeout * 1000)), self._err):
                refused = "certificate was refused" in ffi.string(self._err.message).decode("utf-8", "replace")
                self._raise("", hint="; " + tls.refusal_hint() if refused else "")

    @property
    def closed(self) -> bool:
        return self._handle is None

    def range(self, template: tuple[bytes, tuple[int, int, int]], start: int, end: int, *,
              per_pull: int, in_flight: int, timeout_s: float, expect_suggest: int,
              what: str) -> None:
        """Pull ``[start, end)`` (queue offsets), ``per_pull`` messages a request, at most
        ``in_flight`` requests unanswered; ``what`` names the queue in errors."""
        tmpl, cuts = template
        if not 1 <= in_flight <= MAX_IN_FLIGHT:
            raise ValueError(f"in_flight must be in [1, {MAX_IN_FLIGHT}], got {in_flight}")
        self._tmpl = self._ffi.from_buffer("uint8_t[]", tmpl)   # copied by C, kept for clarity
        self._cuts[0:3] = list(cuts)
        self.range_desc = f"PULL_MESSAGE({what}, queue offsets {start}..{end})"
        self._check(self._lib.rmq_puller_range(
            self._live(), self._tmpl, len(tmpl), self._cuts, start, end, per_pull, in_flight,
            max(1, int(timeout_s * 1000)), expect_suggest, self._err))

    def seek(self, offset: int) -> None:
        self._check(self._lib.rmq_puller_seek(self._live(), offset, self._err))

    def next(self, max_rows: int, max_bytes: int, *, view: bool = False
             ) -> Data | Answer | ServerRequest | None:
        """The next answers (up to ``max_rows`` queue offsets or ``max_bytes`` of records joined).
        With ``view``, a :class:`Data`'s body is a memoryview of this puller's own buffer, valid
        only until its next call (no copy of the records: decode them or copy them before)."""
        lib, o = self._lib, self._out
        self._check(lib.rmq_puller_next(self._live(), max_rows, max_bytes, o, self._err))
        if o.status == lib.RMQ_PULL_END:
            return None
        if o.status == lib.RMQ_PULL_DATA:
            body = self._ffi.buffer(o.data, o.len)
            return Data(o.first, o.next, memoryview(body) if view else bytes(body), o.rows,
                        o.answers, o.suggest)
        data = bytes(self._ffi.buffer(o.data, o.len))
        try:
            cmd = frames.decode(data)
        except RmqRemotingProtocolError as exc:
            self.close()
            raise RmqRemotingProtocolError(str(exc), peer=self.addr, request=self.range_desc) from None
        if o.status == lib.RMQ_PULL_ANSWER:
            return Answer(o.asked, cmd)
        return ServerRequest(cmd)

    def firsts(self, pulls: list[tuple[tuple[bytes, tuple[int, int, int]], int, int]], *, in_flight: int,
               timeout_s: float, what: str) -> list[First]:
        """The first pull of each of several ranges of this broker, sent together: ``pulls`` is
        (template, queue offset, messages asked) per range (``what`` names them in errors), at
        most ``in_flight`` unanswered. Leaves the range pulled before (:meth:`range` again
        before :meth:`next`)."""
        ffi, lib = self._ffi, self._lib
        if not 1 <= in_flight <= MAX_IN_FLIGHT:
            raise ValueError(f"in_flight must be in [1, {MAX_IN_FLIGHT}], got {in_flight}")
        if len(pulls) > lib.RMQ_FIRSTS_MAX:
            raise ValueError(f"at most {lib.RMQ_FIRSTS_MAX} first pulls a call, got {len(pulls)}")
        arr = ffi.new("rmq_first_pull[]", len(pulls))
        keep = []
        for item, ((tmpl, cuts), offset, nums) in zip(arr, pulls):
            if offset < 0 or nums < 1:
                raise ValueError(f"a first pull asks from an offset >= 0 at least 1 message, got "
                                 f"offset {offset}, {nums} messages")
            buf = ffi.from_buffer("uint8_t[]", tmpl)
            keep.append(buf)
            item.tmpl, item.tmpl_len = buf, len(tmpl)
            item.cuts = list(cuts)
            item.offset, item.nums = offset, nums
        bodies = ffi.new("uint8_t **")
        self.range_desc = f"PULL_MESSAGE of {what}"
        self._check(lib.rmq_puller_firsts(self._live(), arr, len(pulls), in_flight,
                                          max(1, int(timeout_s * 1000)), bodies, self._err))
        out = []
        for item in arr:
            body = (bytes(ffi.buffer(bodies[0] + item.body_at, item.body_len))
                    if item.body_len else None)
            out.append(First(item.code, item.next_begin, item.suggest, body))
        return out

    def refuse(self, request: RemotingCommand) -> None:
        """Answer a request of the server "not supported" (a pull connection serves none). A
        send that fails closes the puller: its next call raises."""
        answer = RemotingCommand(3, remark=f"request code {request.code} not supported by this client",
                                 opaque=request.opaque, flag=frames.FLAG_RESPONSE)
        data = frames.encode(answer)
        if self._handle is None or self._lib.rmq_puller_send(
                self._handle, self._ffi.from_buffer("uint8_t[]", data), len(data), 10_000, self._err):
            self.close()

    def close(self) -> None:
        if self._handle is not None:
            handle, self._handle = self._handle, None
            self._ffi.release(handle)
            self._sock.close()

    def __repr__(self) -> str:
        return f"NativePuller({self.addr!r}{', closed' if self.closed else ''})"

    # ------------------------------------------------------------------ internals
    def _live(self):
        if self._handle is None:
            raise RmqRemotingConnectionError("the pull connection is closed", peer=self.addr,
                                             request=self.range_desc)
        return self._handle

    def _check(self, rc: int) -> None:
        if rc:
            self._raise(self.range_desc)

    def _raise(self, request: str, hint: str = "") -> None:
        lib, err = self._lib, self._err
        message = self._ffi.string(err.message).decode("utf-8", "replace") + hint
        kind = {lib.RMQ_E_NET: RmqRemotingConnectionError, lib.RMQ_E_TIMEOUT: RmqRemotingTimeoutError,
                lib.RMQ_E_PROTOCOL: RmqRemotingProtocolError}.get(err.code)
        if err.code == lib.RMQ_E_NOMEM:
            self.close()
            raise MemoryError(message)
        if kind is None:
            kind = RmqRemotingError
        self.close()      # a failed puller is never used again
        raise kind(message, peer=self.addr, request=request or None)


_contexts: dict = {}
_contexts_lock = threading.Lock()


def _native_context(tls: TlsConfig):
    """The C core's TLS context of ``tls`` (made once a process; the files are read then)."""
    from rmq_source.store.native import ffi, lib
    with _contexts_lock:
        ctx = _contexts.get(tls)
        if ctx is None:
            def c(text: str | None):
                return ffi.new("char[]", text.encode()) if text else ffi.NULL
            err = ffi.new("rmq_error *")
            handle = lib.rmq_tls_ctx_new(c(tls.trust_cert_path), c(tls.cert_path), c(tls.key_path),
                                         c(tls.key_password), 1 if tls.verify else 0, err)
            if handle == ffi.NULL:
                from rmq_source.errors import RmqOptionError
                raise RmqOptionError(ffi.string(err.message).decode("utf-8", "replace"))
            ctx = _contexts[tls] = ffi.gc(handle, lib.rmq_tls_ctx_free)
        return ctx
