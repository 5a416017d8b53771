"""The loopback guard (tests/loopback.py) and the bind shim (tests/loopback_bind.c): the check that
fails a test whose processes listen or talk beyond 127.0.0.1, and the preload that keeps RocketMQ's
servers on loopback. Nothing here opens a socket beyond loopback: the offending cases are kernel
table lines, the real sockets are loopback ones, and the shim is asked to bind the wildcard
address only where it must turn it into loopback."""
from __future__ import annotations

import ipaddress
import os
import subprocess
import sys

import pytest

import loopback
import rocketmq_cluster

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def _line(local: str, remote: str, state: str, inode: int) -> str:
    return f"   0: {local} {remote} {state} 00000000:00000000 00:00000000 00000000     0        0 {inode} 1 0\n"


# address fields as a little-endian kernel writes them
V4_LOOP, V4_ANY, V4_NIC = "0100007F", "00000000", "020200C0"          # 127.0.0.1, 0.0.0.0, 192.0.2.2
V6_LOOP = "00000000000000000000000001000000"                          # ::1
V6_ANY = "0" * 32                                                     # ::
V6_MAPPED_LOOP = "0000000000000000FFFF00000100007F"                   # ::ffff:127.0.0.1
V6_MAPPED_NIC = "0000000000000000FFFF0000020200C0"                    # ::ffff:192.0.2.2

SOCKETS = [
    # (local, remote, state, offends)
    (f"{V4_LOOP}:2694", f"{V4_ANY}:0000", "0A", None),
    (f"{V4_ANY}:2694", f"{V4_ANY}:0000", "0A", "listens on 0.0.0.0:9876"),
    (f"{V4_NIC}:2694", f"{V4_ANY}:0000", "0A", "listens on 192.0.2.2:9876"),
    (f"{V6_ANY}:2694", f"{V6_ANY}:0000", "0A", "listens on [::]:9876"),
    (f"{V6_LOOP}:2694", f"{V6_ANY}:0000", "0A", None),
    (f"{V6_MAPPED_LOOP}:2694", f"{V6_ANY}:0000", "0A", None),
    (f"{V4_LOOP}:A000", f"{V4_LOOP}:2694", "01", None),
    (f"{V4_NIC}:A000", f"{V4_NIC}:2694", "01",
     "is connected from 192.0.2.2:40960 to 192.0.2.2:9876"),
    (f"{V6_MAPPED_LOOP}:A000", f"{V6_MAPPED_LOOP}:2694", "01", None),
    (f"{V6_MAPPED_NIC}:A000", f"{V6_MAPPED_NIC}:2694", "01",
     "is connected from [::ffff:c000:202]:40960 to [::ffff:c000:202]:9876"),
    (f"{V4_ANY}:A000", f"{V4_ANY}:0000", "07", None),          # a closed, unconnected socket
]


@pytest.mark.skipif(sys.byteorder != "little", reason="the table lines above are little-endian")
@pytest.mark.parametrize("local, remote, state, offends", SOCKETS)
def test_socket_table_lines(local, remote, state, offends):
    (sock,) = loopback.parse_table(HEADER + _line(local, remote, state, 4242))
    assert sock.inode == 4242
    assert sock.offence() == offends
    # the fast path keeps exactly the lines that may offend
    suspects = loopback.parse_table(HEADER + _line(local, remote, state, 4242), suspects_only=True)
    assert [s.offence() for s in suspects] == ([offends] if offends else [])


def test_address_decoding_round_trips_this_machines_byte_order():
    for text in ("127.0.0.1", "192.0.2.2", "::1", "2001:db8::7", "::ffff:127.0.0.1"):
        addr = ipaddress.ip_address(text)
        raw = addr.packed
        field = "".join(int.from_bytes(raw[i:i + 4], "big").to_bytes(4, sys.byteorder).hex()
                        for i in range(0, len(raw), 4))
        assert loopback.decode_address(f"{field.upper()}:0050") == (addr, 80)
    with pytest.raises(ValueError, match="not a /proc/net/tcp address"):
        loopback.decode_address("0100:0050")


_SERVE = """
import socket, sys
srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
srv.bind(("127.0.0.1", 0)); srv.listen()
cli = socket.create_connection(srv.getsockname())
print(srv.getsockname()[1], flush=True)
sys.stdin.read()
"""


def test_a_childs_sockets_are_found_and_loopback_ones_pass():
    """The real chain: a child's listening and connected sockets are found in the kernel's tables
    through its file descriptors, and loopback ones are no offence."""
    child = subprocess.Popen([sys.executable, "-c", _SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        port = int(child.stdout.readline())
        assert child.pid in loopback.descendants(os.getpid())
        mine = loopback.socket_inodes(child.pid)
        found = [s for s in loopback.machine_sockets() if s.inode in mine]
        assert any(s.listening and s.local == (ipaddress.ip_address("127.0.0.1"), port) for s in found)
        assert any(not s.listening and s.remote[1] == port for s in found)
        assert loopback.offenders_of(child.pid) == []
    finally:
        child.stdin.close()
        child.wait(10)


_BIND = """
import socket, sys
family, addr, v6only = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
s = socket.socket(socket.AF_INET6 if family == "6" else socket.AF_INET, socket.SOCK_STREAM)
if family == "6":
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, int(v6only))
s.bind((addr, 0))
print(s.getsockname()[0])
"""


@pytest.mark.parametrize("family, asked, v6only, bound", [
    ("4", "0.0.0.0", "0", "127.0.0.1"),
    ("4", "127.0.0.1", "0", "127.0.0.1"),
    ("6", "::", "0", "::ffff:127.0.0.1"),         # IPv4 clients dialling 127.0.0.1 still reach it
    ("6", "::", "1", "::1"),
    ("6", "::1", "1", "::1"),
])
def test_bind_shim_turns_the_wildcard_into_loopback(family, asked, v6only, bound):
    if family == "6" and not os.path.exists("/proc/net/tcp6"):
        pytest.skip("no IPv6 in this kernel")
    shim = loopback.bind_shim(rocketmq_cluster.cache_root())
    env = loopback.preload_env(dict(os.environ), shim)
    out = subprocess.run([sys.executable, "-c", _BIND, family, asked, v6only], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == bound


def test_preload_env_keeps_what_was_preloaded():
    env = loopback.preload_env({"LD_PRELOAD": "/x/other.so"}, "/c/shim.so")
    assert env["LD_PRELOAD"] == "/c/shim.so /x/other.so"
    assert loopback.preload_env(dict(env), "/c/shim.so")["LD_PRELOAD"] == env["LD_PRELOAD"]
    assert loopback.preload_env({}, "/c/shim.so")["LD_PRELOAD"] == "/c/shim.so"


def test_the_guard_names_a_child_that_listens_beyond_loopback(monkeypatch):
    """The Watch's verdict path end to end: a child's real socket whose table line reads as the
    wildcard address is reported with the child's pid and command line."""
    child = subprocess.Popen([sys.executable, "-c", _SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        port = int(child.stdout.readline())
        real = loopback.machine_sockets

        def as_wildcard(**kw):
            return [loopback.Socket((ipaddress.ip_address("0.0.0.0"), s.local[1]), s.remote, s.state, s.inode)
                    if s.listening and s.local[1] == port else s for s in real()]
        monkeypatch.setattr(loopback, "machine_sockets", as_wildcard)
        offenders = loopback.Watch().offenders()
        assert len(offenders) == 1, offenders
        assert offenders[0].startswith(f"pid {child.pid} (") and offenders[0].endswith(f"listens on 0.0.0.0:{port}")
    finally:
        child.stdin.close()
        child.wait(10)
