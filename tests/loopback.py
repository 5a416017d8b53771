"""Which sockets of the processes a test run started are open on an address other than loopback.

Everything the suite, the examples and the benches start must listen and talk on 127.0.0.1 only.
This module reads the kernel's socket tables (``/proc/net/tcp``, ``/proc/net/tcp6``: one line per
socket, addresses in hex, the socket's inode last but one of the fixed columns) and the sockets each
process holds (``/proc/<pid>/fd/*`` links ``socket:[inode]``), so it sees every JVM, Python worker
and helper a test started, whatever library opened the socket.

A socket *offends* when it is a TCP socket of one of the processes and either listens on an address
outside 127.0.0.0/8 and ::1 (``0.0.0.0`` and ``::`` included: they listen on every interface) or is
connected to such an address (traffic sent to the machine's network interface, e.g. to a server
that advertised it). Sockets in TIME_WAIT belong to no process any more (inode 0) and are ignored.
"""
from __future__ import annotations

import functools
import hashlib
import ipaddress
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TABLES = ("tcp", "tcp6")
LISTEN = "0A"                 # TCP_LISTEN in the kernel's st column
UNCONNECTED = {ipaddress.ip_address("0.0.0.0"), ipaddress.ip_address("::")}


@dataclass(frozen=True)
class Socket:
    """One TCP socket of the tables: local and remote (address, port), kernel state, inode."""

    local: tuple[ipaddress._BaseAddress, int]
    remote: tuple[ipaddress._BaseAddress, int]
    state: str
    inode: int

    @property
    def listening(self) -> bool:
        return self.state == LISTEN

    def offence(self) -> str | None:
        """Why this socket is off loopback, or None when it is on it (or unconnected)."""
        if self.listening:
            return None if is_loopback(self.local[0]) else f"listens on {_text(self.local)}"
        addr = self.remote[0]
        if addr in UNCONNECTED or is_loopback(addr):
            return None
        return f"is connected from {_text(self.local)} to {_text(self.remote)}"


def is_loopback(addr: ipaddress._BaseAddress) -> bool:
    """127.0.0.0/8, ::1, and IPv4 loopback mapped into IPv6 (``::ffff:127.0.0.1``)."""
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


def _text(end: tuple[ipaddress._BaseAddress, int]) -> str:
    addr, port = end
    return f"[{addr}]:{port}" if addr.version == 6 else f"{addr}:{port}"


def decode_address(field: str) -> tuple[ipaddress._BaseAddress, int]:
    """``/proc/net/tcp*``'s ``ADDR:PORT``: the address as 32-bit words in the kernel's (host) byte
    order, 8 hex digits for IPv4, 32 for IPv6; the port in hex, big-endian."""
    hex_addr, hex_port = field.split(":")
    return _address(hex_addr), int(hex_port, 16)


@functools.lru_cache(maxsize=256)
def _address(hex_addr: str) -> ipaddress._BaseAddress:
    raw = bytes.fromhex(hex_addr)
    if len(raw) not in (4, 16):
        raise ValueError(f"not a /proc/net/tcp address: {hex_addr!r}")
    words = b"".join(int.from_bytes(raw[i:i + 4], sys.byteorder).to_bytes(4, "big")
                     for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


@functools.lru_cache(maxsize=256)
def _harmless(hex_addr: str, listening: bool) -> bool:
    """Whether a socket whose local (listening) or remote (else) address is ``hex_addr`` is
    certainly no offence (memoized: a machine's sockets use a handful of addresses)."""
    addr = _address(hex_addr)
    return is_loopback(addr) or (not listening and addr in UNCONNECTED)


def parse_table(text: str, *, suspects_only: bool = False) -> list[Socket]:
    """The sockets of one ``/proc/net/tcp`` or ``/proc/net/tcp6`` text (header line first);
    ``suspects_only``: only those that may offend (the rest are skipped before decoding)."""
    sockets = []
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 10:
            continue
        if suspects_only:
            listening = cols[3] == LISTEN
            end = cols[1] if listening else cols[2]
            if cols[9] == "0" or _harmless(end.split(":")[0], listening):
                continue
        sockets.append(Socket(decode_address(cols[1]), decode_address(cols[2]), cols[3], int(cols[9])))
    return sockets


def machine_sockets(*, suspects_only: bool = False) -> list[Socket]:
    """Every TCP socket of this network namespace (``suspects_only``: see :func:`parse_table`)."""
    out = []
    for name in TABLES:
        try:
            out += parse_table((PROC / "net" / name).read_text(), suspects_only=suspects_only)
        except FileNotFoundError:         # no IPv6 in this kernel
            continue
    return out


def descendants(root: int) -> list[int]:
    """``root`` and every living process below it (by parent pid)."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:                   # gone meanwhile
            continue
        # the command name (2nd field) is in parentheses and may hold spaces: split after it
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def socket_inodes(pid: int) -> set[int]:
    """Inodes of the sockets process ``pid`` holds (empty when it is gone)."""
    inodes = set()
    try:
        fds = os.listdir(PROC / str(pid) / "fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            link = os.readlink(PROC / str(pid) / "fd" / fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(int(link[8:-1]))
    return inodes


def describe(pid: int) -> str:
    """``pid`` and the start of its command line, for messages."""
    try:
        cmd = (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        cmd = "?"
    main = [w for w in cmd.split() if not w.startswith("-")]
    return f"pid {pid} ({' '.join(main[:1] + main[-3:]) if len(main) > 4 else ' '.join(main)})"


class Watch:
    """Finds the off-loopback sockets of a process tree, cheaply enough to run after every test.

    The machine's tables are read first; only when they hold an offending socket not yet known to
    belong to another process are the tree's file descriptors looked at. A socket found outside the
    tree is remembered as foreign (an inode names one socket for its whole life).
    """

    def __init__(self, root: int | None = None):
        self.root = os.getpid() if root is None else root
        self.foreign: set[int] = set()

    def offenders(self) -> list[str]:
        """One line per offending socket of the tree: process, what it does."""
        suspects = {s.inode: s for s in machine_sockets(suspects_only=True)
                    if s.inode and s.inode not in self.foreign and s.offence()}
        if not suspects:
            return []
        found = []
        for pid in descendants(self.root):
            for inode in socket_inodes(pid) & suspects.keys():
                found.append(f"{describe(pid)} {suspects.pop(inode).offence()}")
        self.foreign |= suspects.keys()
        return found


def offenders_of(pid: int) -> list[str]:
    """The off-loopback sockets of ``pid`` and its descendants (one-off check, e.g. a booted server)."""
    return Watch(pid).offenders()


# ------------------------------------------------------------------ servers that bind every interface

SHIM_SOURCE = Path(__file__).with_name("loopback_bind.c")


def bind_shim(cache: Path) -> Path:
    """The shared object of ``loopback_bind.c`` (built with gcc once per source text, under
    ``cache``): preloaded (``LD_PRELOAD``) into a server that binds every interface with no
    setting to change it, it binds that server to loopback instead."""
    source = SHIM_SOURCE.read_bytes()
    target = cache / f"loopback_bind-{hashlib.sha256(source).hexdigest()[:12]}.so"
    if target.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as work:
        built = Path(work) / target.name
        subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(built),
                        str(SHIM_SOURCE), "-ldl"], check=True, capture_output=True)
        os.replace(built, target)          # appears whole; a racing builder writes the same bytes
    return target


def preload_env(env: dict, shim: Path) -> dict:
    """``env`` with ``shim`` added in front of its ``LD_PRELOAD``."""
    rest = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{shim} {rest}".strip() if str(shim) not in rest.split() else rest
    return env


def run_watched(cmd: list[str], *, timeout: float, poll: float = 0.5, **popen_kw):
    """Run ``cmd`` to its end (stdout and stderr merged, as text), checking its process tree for
    off-loopback sockets every ``poll`` seconds while it runs: ``(returncode, output, offenders)``.
    A run past ``timeout`` seconds is killed and raises ``subprocess.TimeoutExpired``."""
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                text=True, start_new_session=True, **popen_kw)
        watch, offenders, deadline = Watch(proc.pid), [], time.monotonic() + timeout
        try:
            while proc.poll() is None:
                offenders += [o for o in watch.offenders() if o not in offenders]
                if time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(cmd, timeout)
                time.sleep(poll)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        out.seek(0)
        return proc.returncode, out.read(), offenders
