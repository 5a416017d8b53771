"""TLS for the remoting connections (NameServers and brokers started with ``tls.server.mode``
``enforcing`` or ``permissive``).

:class:`TlsConfig` is what the options give (picklable: paths and switches, it travels to the
tasks); :meth:`TlsConfig.context` the process's :class:`ssl.SSLContext` made from it.
:class:`TlsStream` runs the TLS records of one connection over its plain socket through memory
BIOs, so the reader thread and the senders of a connection share one TLS session safely: the
records leave in the order the session made them (senders hold the connection's send lock while
they encrypt and write), and nothing decrypted waits inside the TLS object where ``select`` on
the socket cannot see it.

Checks (by default): the server's certificate chain against the system's CAs or
``tlsTrustCertPath``, and its host name or IP address against the address dialled (the broker
addresses the NameServers hand out are IPs: their certificates need those IP addresses). RocketMQ's
Java client checks neither by default (``tls.client.authServer=false``) and never the host name;
``tlsVerifyHostname=false`` drops the name check, ``tlsSkipVerify=true`` both (as the Java client's
default; for tests only).
"""
from __future__ import annotations

import os
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field

from rmq_source.errors import RmqOptionError, RmqRemotingConnectionError, RmqRemotingTimeoutError

_contexts: dict = {}
_contexts_lock = threading.Lock()
READ_CHUNK = 256 << 10


@dataclass(frozen=True)
class TlsConfig:
    """How to speak TLS to every server of a query. Paths are absolute; ``key_password`` is a
    secret (its repr never shows it)."""

    trust_cert_path: str | None = None      # PEM CA bundle; None: the system's CAs
    cert_path: str | None = None             # client certificate (PEM), for servers asking one
    key_path: str | None = None              # its private key (PEM)
    key_password: str | None = field(default=None, repr=False)
    verify: bool = True                      # check the chain
    verify_hostname: bool = True             # and the name/IP of the address dialled

    def context(self) -> ssl.SSLContext:
        """The process's context for this configuration (made once; files read then)."""
        with _contexts_lock:
            ctx = _contexts.get(self)
            if ctx is None:
                ctx = _contexts[self] = self._make_context()
            return ctx

    def _make_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.verify:
            ctx.check_hostname = self.verify_hostname
            ctx.verify_mode = ssl.CERT_REQUIRED
            if self.trust_cert_path:
                ctx.load_verify_locations(cafile=self.trust_cert_path)
            else:
                ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
        else:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert_path:
            ctx.load_cert_chain(self.cert_path, self.key_path, password=self.key_password)
        return ctx

    def refusal_hint(self) -> str:
        """What to do when a server's certificate is refused (for messages)."""
        return (f"{self.describe()}: give its CA with tlsTrustCertPath"
                + (", or set tlsVerifyHostname=false if the certificate does not name this address"
                   if self.verify_hostname else ""))

    def describe(self) -> str:
        """For messages: what is checked (no secret)."""
        if not self.verify:
            return "TLS without certificate checks (tlsSkipVerify=true)"
        ca = self.trust_cert_path or "the system's CAs"
        return f"TLS checking the server's certificate against {ca}" + (
            " and its address" if self.verify_hostname else " (not its address)")


def check_file(option: str, path: str) -> str:
    """``path`` made absolute; an unreadable file is an error naming the option."""
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(full) or not os.access(full, os.R_OK):
        raise RmqOptionError(f"option {option}: {full!r} is not a readable file")
    return full


def _client_cert_hint(exc: ssl.SSLError) -> str:
    """What to do when the server's alert refuses our client certificate or its absence (with
    TLS 1.3 the alert comes after the handshake, on the first record read)."""
    reason = str(exc.reason or exc).upper()
    if "CERTIFICATE_REQUIRED" in reason or "BAD_CERTIFICATE" in reason:
        return (" (the server asks for a client certificate, tls.server.need.client.auth, and got "
                "none it trusts: give tlsCertPath and tlsKeyPath, signed by a CA it trusts)")
    return ""


class TlsStream:
    """The TLS session of one connection (module doc). The handshake runs in the constructor,
    within ``timeout`` seconds."""

    def __init__(self, sock: socket.socket, config: TlsConfig, host: str, addr: str, timeout: float):
        self.sock, self.addr = sock, addr
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.lock = threading.Lock()
        try:
            self.obj = config.context().wrap_bio(self._in, self._out, server_hostname=host)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise RmqRemotingConnectionError(f"TLS setup failed: {exc}", peer=addr) from None
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.obj.do_handshake()
                self._flush_blocking(deadline)
                return
            except ssl.SSLWantReadError:
                self._flush_blocking(deadline)
                self._receive_blocking(deadline)
            except ssl.SSLCertVerificationError as exc:
                raise RmqRemotingConnectionError(
                    f"TLS handshake failed: the server's certificate was refused "
                    f"({exc.verify_message}); " + config.refusal_hint(), peer=addr) from None
            except ssl.SSLError as exc:
                raise RmqRemotingConnectionError(f"TLS handshake failed: {exc.reason or exc}"
                                                 + _client_cert_hint(exc), peer=addr) from None

    def _flush_blocking(self, deadline: float) -> None:
        data = self._out.read()
        if data:
            try:
                self.sock.settimeout(max(0.01, deadline - time.monotonic()))
                self.sock.sendall(data)
            except socket.timeout:
                raise RmqRemotingTimeoutError("TLS handshake timed out (sending)", peer=self.addr) from None
            except OSError as exc:
                raise RmqRemotingConnectionError(f"TLS handshake failed: {exc}", peer=self.addr) from None
            finally:
                self.sock.settimeout(None)

    def _receive_blocking(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RmqRemotingTimeoutError("TLS handshake timed out (no answer from the server)",
                                          peer=self.addr)
        try:
            self.sock.settimeout(left)
            raw = self.sock.recv(READ_CHUNK)
        except socket.timeout:
            raise RmqRemotingTimeoutError("TLS handshake timed out (no answer from the server)",
                                          peer=self.addr) from None
        except OSError as exc:
            raise RmqRemotingConnectionError(f"TLS handshake failed: {exc}", peer=self.addr) from None
        finally:
            self.sock.settimeout(None)
        if not raw:
            raise RmqRemotingConnectionError(
                "TLS handshake failed: the server closed the connection (does it speak TLS? "
                "a server without tls.server.mode enforcing or permissive does not)", peer=self.addr)
        self._in.write(raw)

    def encrypt(self, data) -> bytes:
        """``data`` as TLS records to send (call with the connection's send lock held)."""
        with self.lock:
            view = memoryview(data)
            while view:
                n = self.obj.write(view)
                view = view[n:]
            return self._out.read()

    def decrypt(self, raw: bytes) -> tuple[bytes, bool]:
        """(the plaintext of ``raw`` and whatever came before it that now completes a record,
        whether the server closed the TLS session); b"" when no record is complete yet."""
        with self.lock:
            self._in.write(raw)
            parts = []
            closed = False
            while True:
                try:
                    chunk = self.obj.read(READ_CHUNK)
                except ssl.SSLWantReadError:
                    break
                except ssl.SSLZeroReturnError:
                    closed = True
                    break
                except ssl.SSLError as exc:
                    raise RmqRemotingConnectionError(f"TLS record refused: {exc.reason or exc}"
                                                     + _client_cert_hint(exc), peer=self.addr) from None
                if not chunk:
                    closed = True
                    break
                parts.append(chunk)
            return b"".join(parts), closed

    def pending_output(self) -> bytes:
        """Records the session made while reading (e.g. a key update answer): send them with
        the connection's send lock held."""
        with self.lock:
            return self._out.read()

    @property
    def has_output(self) -> bool:
        return self._out.pending > 0
