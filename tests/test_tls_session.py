"""A TLS session the server ends under a send (rmq_source.remote.client with TLS, a local peer)."""
from __future__ import annotations

import socket
import ssl
import threading

import pytest

from rmq_source.errors import RmqRemotingConnectionError
from rmq_source.remote import Connection
from rmq_source.remote.tls import TlsConfig
from tls_certs import make_certs


@pytest.fixture(scope="module")
def tls_peer(tmp_path_factory):
    """A TLS server on loopback that completes each handshake and reads until the client leaves."""
    certs = make_certs(tmp_path_factory.mktemp("certs"))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(certs.server_cert), str(certs.server_key))
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():
        server.settimeout(0.5)
        while not stop.is_set():
            try:
                raw, _ = server.accept()
            except (socket.timeout, OSError):
                continue
            try:
                with ctx.wrap_socket(raw, server_side=True) as conn:
                    while conn.recv(4096):
                        pass
            except (ssl.SSLError, OSError):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}", TlsConfig(trust_cert_path=str(certs.ca))
    stop.set()
    thread.join(5)
    server.close()


def test_a_send_the_ended_session_refuses_names_the_servers_reason(tls_peer):
    """The server's alert (e.g. no client certificate) ends the session while a request is being
    sent: the send fails with what the reader read from the server, not with the TLS library's
    bare EOF, even when the reader says so after the send found the session closed."""
    addr, tls = tls_peer
    conn = Connection(addr, tls=tls)
    why = RmqRemotingConnectionError("TLS record refused: TLSV13_ALERT_CERTIFICATE_REQUIRED (the server "
                                     "asks for a client certificate: set tlsCertPath)", peer=addr)

    def ended(data):
        threading.Timer(0.2, conn._fail, [why]).start()        # the reader's verdict comes later
        raise ssl.SSLZeroReturnError(6, "TLS/SSL connection has been closed (EOF)")

    conn._tls.encrypt = ended
    with pytest.raises(RmqRemotingConnectionError, match="client certificate: set tlsCertPath") as err:
        conn.invoke(105, {"topic": "T"}, timeout=30)
    assert addr in str(err.value) and conn.closed
