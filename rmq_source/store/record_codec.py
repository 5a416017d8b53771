"""Encoding of CommitLog records, ConsumeQueue units, hosts, properties and UNIQ_KEY ids.

Byte layouts follow the format doc (§3.2 record, §3.4 BLANK, §4.1 properties, §5 ids, §7.1 CQ unit).
Everything is big-endian. This module only builds and takes apart bytes; file handling lives in
:mod:`rmq_source.store.writer`.
"""
from __future__ import annotations

import ipaddress
import itertools
import os
import secrets
import struct
import time
import zlib
from dataclasses import dataclass
from datetime import datetime
from typing import Mapping

from rmq_source.errors import RmqCorruptStoreError, RmqMissingDependencyError, RmqOptionError

MAGIC_V1 = 0xDAA320A7 - (1 << 32)          # -626843481
MAGIC_V2 = 0xDAA320AB - (1 << 32)          # -626843477
BLANK_MAGIC = 0xCBD43194 - (1 << 32)       # -875286124
END_FILE_MIN_BLANK_LENGTH = 8
CQ_UNIT_SIZE = 20

FLAG_COMPRESSED = 0x1
FLAG_MULTI_TAGS = 0x2
TX_MASK = 0xC
TX_PREPARED = 0x4
TX_ROLLBACK = 0xC
FLAG_BORNHOST_V6 = 0x10
FLAG_STOREHOST_V6 = 0x20
COMPRESSION_TYPE_SHIFT = 8
# compression name -> 5.x type value in SYSFLAG bits 0x700 (CompressionType)
COMPRESSION_TYPES = {"lz4": 1, "zstd": 2, "zlib": 3}
PROPERTIES_STYLES = ("4.9.3", "5.3.3")
MAX_PROPERTIES_LENGTH = 32767
V1_MAX_TOPIC_LENGTH = 127
MAX_TOPIC_LENGTH = 32767

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

TOPIC_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_%-|")

# Fixed part of a record up to and including BODYLENGTH, for IPv4 born and store hosts:
# TOTALSIZE MAGIC BODYCRC QUEUEID FLAG QUEUEOFFSET PHYSICALOFFSET SYSFLAG BORNTS BORNHOST(8)
# STORETS STOREHOST(8) RECONSUMETIMES PREPAREDTXOFFSET BODYLENGTH
HEADER_V4V4 = struct.Struct(">iiiiiqqiq8sq8siqi")
CQ_UNIT = struct.Struct(">qiq")
BLANK = struct.Struct(">ii")
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


def _header_struct(born_len: int, store_len: int) -> struct.Struct:
    return struct.Struct(f">iiiiiqqiq{born_len}sq{store_len}siqi")


_HEADERS = {(bl, sl): _header_struct(bl, sl) for bl in (8, 20) for sl in (8, 20)}


def header_struct(born_host_len: int, store_host_len: int) -> struct.Struct:
    """The struct of the fixed fields (TOTALSIZE .. BODYLENGTH) for these host field widths."""
    return _HEADERS[(born_host_len, store_host_len)]


def record_length(body_len: int, topic_len: int, props_len: int, *, born_host_len: int = 8,
                  store_host_len: int = 8, topic_len_width: int = 1) -> int:
    """TOTALSIZE by the length rule of §3.2."""
    return (74 + born_host_len + store_host_len + topic_len_width + max(body_len, 0) + topic_len
            + max(props_len, 0))


# ---------------------------------------------------------------------------------------------- hosts

@dataclass(frozen=True)
class Host:
    """A parsed socket address: ``field`` is the record encoding (4/16 address bytes + int32 port)."""

    address: bytes
    port: int
    field: bytes

    @property
    def is_v6(self) -> bool:
        return len(self.address) == 16


def parse_host(text: str, *, option: str = "host") -> Host:
    """Parse ``"ip:port"``; IPv6 as ``"[addr]:port"`` or Java's long form ``"0:0:0:0:0:0:0:1:10911"``.

    IPv4-mapped IPv6 addresses become IPv4, as Java's ``InetAddress`` does. Raises
    :class:`RmqOptionError` naming ``option`` when the text is not an address with a port 0-65535.
    """
    if not isinstance(text, str):
        raise RmqOptionError(f"{option} must be a string 'ip:port', got {type(text).__name__}")
    if text.startswith("["):
        addr_text, sep, port_text = text[1:].partition("]:")
    else:
        addr_text, sep, port_text = text.rpartition(":")
    try:
        if not sep or not port_text.isdigit():
            raise ValueError("no port")
        port = int(port_text)
        if port > 65535:
            raise ValueError("port out of range")
        ip = ipaddress.ip_address(addr_text)
    except ValueError:
        raise RmqOptionError(f"{option}={text!r} is not 'ip:port' (IPv4 'a.b.c.d:port', IPv6 "
                             "'[addr]:port' or 'h:h:h:h:h:h:h:h:port', port 0-65535)") from None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    address = ip.packed
    return Host(address, port, address + _I32.pack(port))


def java_host_string(field: bytes) -> str:
    """``ip:port`` of a host field as the reader renders it (IPv6 in Java's uncompressed form)."""
    address, port = field[:-4], _I32.unpack(field[-4:])[0]
    if len(address) == 4:
        ip = ".".join(str(b) for b in address)
    else:
        ip = ":".join(format(int.from_bytes(address[i:i + 2], "big"), "x") for i in range(0, 16, 2))
    return f"{ip}:{port}"


def offset_msg_id(store_host_field: bytes, physical_offset: int) -> str:
    """Offset message id (§5.1): uppercase hex of store host field + int64 physical offset."""
    return (store_host_field + _I64.pack(physical_offset)).hex().upper()


# ----------------------------------------------------------------------------------------- UNIQ_KEY

_COUNTER = itertools.count()                 # per process, like MessageClientIDSetter.COUNTER
_CLASSLOADER_HASH = secrets.randbits(32)     # stands in for the producer's class-loader hash code


class UniqKeyFactory:
    """Creates ``UNIQ_KEY`` values laid out as ``MessageClientIDSetter`` does (§5.2).

    ip (4 or 16 bytes) + low 16 bits of the pid + class-loader hash (random per process) + ms since
    the start of the born timestamp's calendar month in the local time zone (as int32) + low 16 bits
    of a per-process counter; uppercase hex.
    """

    def __init__(self) -> None:
        self._prefixes: dict[bytes, str] = {}
        self._month_start = 0
        self._month_end = -1

    def _month(self, ts_ms: int) -> int:
        if not (self._month_start <= ts_ms < self._month_end):
            moment = datetime.fromtimestamp(ts_ms / 1000).astimezone()
            start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
            nxt = (start.replace(year=start.year + 1, month=1) if start.month == 12
                   else start.replace(month=start.month + 1))
            # astimezone() again: the month boundary can be on the other side of a DST change
            self._month_start = int(start.replace(tzinfo=None).astimezone().timestamp() * 1000)
            self._month_end = int(nxt.replace(tzinfo=None).astimezone().timestamp() * 1000)
        return self._month_start

    def prefix(self, ip: bytes, born_ms: int) -> str:
        """Everything but the counter: ip, pid, class-loader hash and time, as uppercase hex."""
        prefix = self._prefixes.get(ip)
        if prefix is None:
            prefix = (ip + struct.pack(">HI", os.getpid() & 0xFFFF, _CLASSLOADER_HASH)).hex().upper()
            self._prefixes[ip] = prefix
        delta = (born_ms - self._month(born_ms)) & 0xFFFFFFFF
        return f"{prefix}{delta:08X}"

    def create(self, ip: bytes, born_ms: int) -> str:
        return self.prefix(ip, born_ms) + next_counter_hex()


_COUNTER_HEX: list[str] = []


def next_counter_hex() -> str:
    """The next value of the per-process UNIQ_KEY counter, low 16 bits as 4 uppercase hex digits."""
    if not _COUNTER_HEX:
        _COUNTER_HEX.extend(f"{i:04X}" for i in range(1 << 16))
    return _COUNTER_HEX[next(_COUNTER) & 0xFFFF]


# ------------------------------------------------------------------------------------- properties

def validate_property(name: object, value: object) -> None:
    """Reject what the broker's property string cannot carry back unchanged."""
    if type(name) is not str and not isinstance(name, str) or not name:
        raise RmqOptionError(f"property name {name!r} must be a non-empty string")
    if type(value) is not str and not isinstance(value, str) or not value:
        raise RmqOptionError(f"property {name!r}: value {value!r} must be a non-empty string "
                             "(empty values are dropped by every reader)")
    for text in (name, value):
        if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
            raise RmqOptionError(f"property {name!r}: names and values must not contain the "
                                 "separator characters \\x01 or \\x02")
    try:
        name.encode("utf-8")
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise RmqOptionError(f"property {name!r} is not encodable as UTF-8 (lone surrogate?)") from None


def encode_properties(entries: Mapping[str, str], style: str = "4.9.3") -> bytes:
    """Property string (§4.1): ``name\\x01value`` entries joined by ``\\x02``.

    ``style="4.9.3"``: no trailing separator; ``"5.3.3"``: every entry followed by ``\\x02``. Entries
    whose value is ``None`` are skipped, as Java skips null values. Values are not validated here.
    """
    parts = [f"{k}\x01{v}" for k, v in entries.items() if v is not None]
    if not parts:
        return b""
    text = "\x02".join(parts)
    if style == "5.3.3":
        text += "\x02"
    return text.encode("utf-8")


def decode_properties(raw: bytes) -> dict[str, str]:
    """Parse a property string as the broker does (§4.1); bytes must be valid UTF-8."""
    out: dict[str, str] = {}
    for segment in raw.decode("utf-8").split("\x02"):
        if len(segment) < 3:
            continue
        i = segment.find("\x01")
        if i > 0 and i < len(segment) - 1:
            out[segment[:i]] = segment[i + 1:]
    return out


# ------------------------------------------------------------------------------------ compression

def compress_body(body: bytes, compression: str, level: int, style: str) -> tuple[bytes, int]:
    """Compress ``body``; returns (stored bytes, SYSFLAG bits).

    ``zlib``: RFC 1950 stream like ``java.util.zip.Deflater``; flag 0x1 in 4.9.3 style (legacy type 0)
    and 0x1|0x300 in 5.3.3 style. ``lz4`` (LZ4 frame) and ``zstd`` (zstd frame) are 5.x only: flag
    0x1 | type << 8. Raises :class:`RmqMissingDependencyError` when the package is missing.
    """
    if compression == "zlib":
        stored = zlib.compress(body, level)
        flag = FLAG_COMPRESSED if style == "4.9.3" else FLAG_COMPRESSED | (3 << COMPRESSION_TYPE_SHIFT)
        return stored, flag
    if compression == "lz4":
        try:
            import lz4.frame
        except ImportError:
            raise RmqMissingDependencyError("compression='lz4' needs the Python package 'lz4' "
                                            "(pip install lz4)") from None
        return lz4.frame.compress(body), FLAG_COMPRESSED | (1 << COMPRESSION_TYPE_SHIFT)
    if compression == "zstd":
        try:
            import zstandard
        except ImportError:
            raise RmqMissingDependencyError("compression='zstd' needs the Python package "
                                            "'zstandard' (pip install zstandard)") from None
        stored = zstandard.ZstdCompressor(level=level).compress(body)
        return stored, FLAG_COMPRESSED | (2 << COMPRESSION_TYPE_SHIFT)
    raise RmqOptionError(f"compression={compression!r} is not one of None, 'zlib', 'lz4', 'zstd'")


# ------------------------------------------------------------------------------------------ records

def encode_record(*, queue_id: int, flag: int, queue_offset: int, physical_offset: int,
                  sys_flag: int, born_timestamp: int, born_host: bytes, store_timestamp: int,
                  store_host: bytes, reconsume_times: int, prepared_transaction_offset: int,
                  body: bytes, topic: bytes, properties: bytes, v2: bool | None = None) -> bytes:
    """One CommitLog record (§3.2) from already-encoded parts.

    ``born_host``/``store_host`` are host fields (8 or 20 bytes) and must agree with the V6 bits of
    ``sys_flag``; ``body`` is stored as given (already compressed if the flag says so) and BODYCRC is
    computed over it. ``v2=None`` picks V2 (2-byte topic length) when the topic exceeds 127 bytes.
    """
    if v2 is None:
        v2 = len(topic) > V1_MAX_TOPIC_LENGTH
    bh, sh = len(born_host), len(store_host)
    if bh != (20 if sys_flag & FLAG_BORNHOST_V6 else 8) or sh != (20 if sys_flag & FLAG_STOREHOST_V6 else 8):
        raise RmqOptionError("host field widths do not match the V6 bits of sys_flag")
    tl = 2 if v2 else 1
    total = record_length(len(body), len(topic), len(properties), born_host_len=bh,
                          store_host_len=sh, topic_len_width=tl)
    head = _HEADERS[(bh, sh)].pack(
        total, MAGIC_V2 if v2 else MAGIC_V1, zlib.crc32(body) & 0x7FFFFFFF, queue_id, flag,
        queue_offset, physical_offset, sys_flag, born_timestamp, born_host, store_timestamp,
        store_host, reconsume_times, prepared_transaction_offset, len(body))
    topic_len = (_I16 if v2 else _I8).pack(len(topic))
    return b"".join((head, body, topic_len, topic, _I16.pack(len(properties)), properties))


def blank_record(remaining: int) -> bytes:
    """The 8-byte BLANK header that ends a CommitLog file with ``remaining`` bytes left (§3.4)."""
    return BLANK.pack(remaining, BLANK_MAGIC)


def encode_cq_unit(physical_offset: int, size: int, tags_code: int) -> bytes:
    """A 20-byte ConsumeQueue unit (§7.1)."""
    return CQ_UNIT.pack(physical_offset, size, tags_code)


@dataclass(frozen=True)
class DecodedRecord:
    """The fields of one record that recovery and tests need (body as stored)."""

    total_size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: bytes
    store_timestamp: int
    store_host: bytes
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties: dict[str, str]
    properties_raw: bytes


def decode_record(buf, pos: int, *, where: str = "commitlog") -> DecodedRecord | None:
    """Decode the record at ``pos`` of ``buf``; ``None`` for a BLANK record.

    Raises :class:`RmqCorruptStoreError` (naming ``where`` and ``pos``) when the bytes are not a
    complete, self-consistent record (magic, length rule, bounds).
    """
    def bad(why: str) -> RmqCorruptStoreError:
        return RmqCorruptStoreError(f"{where}: {why} at position {pos}", path=where, position=pos)

    end = len(buf)
    if pos + 8 > end:
        raise bad("fewer than 8 bytes left")
    total, magic = BLANK.unpack_from(buf, pos)
    if magic == BLANK_MAGIC:
        return None
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise bad(f"bad magic 0x{magic & 0xFFFFFFFF:08X}")
    if total < 91 or pos + total > end:
        raise bad(f"TOTALSIZE {total} does not fit")
    sys_flag = _I32.unpack_from(buf, pos + 36)[0]
    bh = 20 if sys_flag & FLAG_BORNHOST_V6 else 8
    sh = 20 if sys_flag & FLAG_STOREHOST_V6 else 8
    if pos + 72 + bh + sh > pos + total:
        raise bad("record shorter than its fixed fields")
    f = _HEADERS[(bh, sh)].unpack_from(buf, pos)
    body_len = f[14]
    p = pos + 72 + bh + sh
    nb = max(body_len, 0)
    body = bytes(buf[p:p + nb])
    p += nb
    try:
        if magic == MAGIC_V2:
            topic_len = _I16.unpack_from(buf, p)[0]
            p += 2
        else:
            topic_len = _I8.unpack_from(buf, p)[0]
            p += 1
        topic_raw = bytes(buf[p:p + max(topic_len, 0)])
        p += max(topic_len, 0)
        props_len = _I16.unpack_from(buf, p)[0]
        p += 2
    except struct.error:
        raise bad("record truncated") from None
    props_raw = bytes(buf[p:p + max(props_len, 0)])
    expected = record_length(body_len, max(topic_len, 0), props_len, born_host_len=bh,
                             store_host_len=sh, topic_len_width=2 if magic == MAGIC_V2 else 1)
    if expected != total:
        raise bad(f"length rule gives {expected}, TOTALSIZE is {total}")
    try:
        topic = topic_raw.decode("utf-8")
        props = decode_properties(props_raw)
    except UnicodeDecodeError:
        raise bad("topic or properties are not UTF-8") from None
    return DecodedRecord(total, magic, f[2], f[3], f[4], f[5], f[6], sys_flag, f[8], f[9], f[10],
                         f[11], f[12], f[13], body, topic, props, props_raw)


def now_ms() -> int:
    return time.time_ns() // 1_000_000
