"""Remoting frames: ``int32 total | int32 (serializeType << 24 | headerLen) | header | body``.

``total`` counts everything after itself. The header is JSON (serialize type 0) or RocketMQ's binary
form (type 1); a server answers in its own configured form, so both are decoded. All integers are
big-endian.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

from rmq_source.errors import RmqRemotingProtocolError
from rmq_source.remote import fastjson

#: NettyDecoder's frame limit (the length field's value).
MAX_FRAME = 16 * 1024 * 1024
SERIALIZE_JSON = 0
SERIALIZE_ROCKETMQ = 1
FLAG_RESPONSE = 0x1
FLAG_ONEWAY = 0x2

LANGUAGES = ("JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO",
             "PHP", "OMS", "RUST")
#: Sent as ``version``: >= 401 (V4_9_4) makes NameServers answer routes in standard JSON.
CLIENT_VERSION = 401

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_BIN_FIXED = struct.Struct(">hBhii")   # code, language, version, opaque, flag


@dataclass
class RemotingCommand:
    code: int
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    language: str = "PYTHON"
    version: int = CLIENT_VERSION
    serialize_type: int = SERIALIZE_JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)


def str_fields(ext: dict) -> dict[str, str]:
    """Header fields as sent on the wire: strings, booleans as true/false, None left out."""
    if all(type(k) is str and type(v) is str for k, v in ext.items()):
        return dict(ext)                 # the common case: answers, fields already converted
    out = {}
    for k, v in ext.items():
        if v is None:
            continue
        if isinstance(v, bool):
            v = "true" if v else "false"
        out[str(k)] = str(v)
    return out


def encode_header(cmd: RemotingCommand) -> bytes:
    ext = str_fields(cmd.ext_fields)
    if cmd.serialize_type == SERIALIZE_JSON:
        obj = {"code": cmd.code, "language": cmd.language, "version": cmd.version, "opaque": cmd.opaque,
               "flag": cmd.flag, "extFields": ext, "serializeTypeCurrentRPC": "JSON"}
        if cmd.remark is not None:
            obj["remark"] = cmd.remark
        return json.dumps(obj, separators=(",", ":")).encode()
    if cmd.serialize_type != SERIALIZE_ROCKETMQ:
        raise RmqRemotingProtocolError(f"unknown serialize type {cmd.serialize_type}")
    lang = LANGUAGES.index(cmd.language) if cmd.language in LANGUAGES else LANGUAGES.index("OTHER")
    parts = [_BIN_FIXED.pack(cmd.code, lang, cmd.version, cmd.opaque, cmd.flag)]
    remark = (cmd.remark or "").encode()
    parts += [_I32.pack(len(remark)), remark]
    fields = b"".join(_I16.pack(len(kb)) + kb + _I32.pack(len(vb)) + vb
                      for kb, vb in ((k.encode(), v.encode()) for k, v in ext.items()))
    parts += [_I32.pack(len(fields)), fields]
    return b"".join(parts)


def encode(cmd: RemotingCommand) -> bytes:
    """The whole frame, length prefix included."""
    header = encode_header(cmd)
    total = 4 + len(header) + len(cmd.body)
    if total > MAX_FRAME:
        raise RmqRemotingProtocolError(f"frame of {total} bytes exceeds the {MAX_FRAME}-byte limit")
    return _I32.pack(total) + _I32.pack((cmd.serialize_type << 24) | len(header)) + header + cmd.body


def check_length(total: int) -> None:
    """Raise for a frame length field that no valid frame has."""
    if total > MAX_FRAME:
        raise RmqRemotingProtocolError(f"frame of {total} bytes exceeds the {MAX_FRAME}-byte limit")
    if total < 4:
        raise RmqRemotingProtocolError(f"frame length {total} is shorter than its header-length field")


def decode(payload: bytes | memoryview) -> RemotingCommand:
    """Decode one frame's bytes after the length prefix."""
    payload = bytes(payload)
    if len(payload) < 4:
        raise RmqRemotingProtocolError(f"frame of {len(payload)} bytes has no header-length field")
    mark = _I32.unpack_from(payload, 0)[0]
    stype = (mark >> 24) & 0xFF
    hlen = mark & 0xFFFFFF
    if hlen > len(payload) - 4:
        raise RmqRemotingProtocolError(f"header length {hlen} exceeds the frame ({len(payload)} bytes)")
    header = payload[4:4 + hlen]
    body = payload[4 + hlen:]
    if stype == SERIALIZE_JSON:
        cmd = _decode_json_header(header)
    elif stype == SERIALIZE_ROCKETMQ:
        cmd = _decode_binary_header(header)
    else:
        raise RmqRemotingProtocolError(f"unknown serialize type {stype}")
    cmd.body = body
    cmd.serialize_type = stype
    return cmd


def _decode_json_header(header: bytes) -> RemotingCommand:
    try:
        obj = loads_fastjson(header.decode("utf-8"))
        if not isinstance(obj, dict):
            raise ValueError("not an object")
        ext = obj.get("extFields") or {}
        if not isinstance(ext, dict):
            raise ValueError("extFields is not an object")
        lang = obj.get("language", "JAVA")
        return RemotingCommand(code=int(obj.get("code", 0)), ext_fields=str_fields(ext),
                               opaque=int(obj.get("opaque", 0)), flag=int(obj.get("flag", 0)),
                               remark=obj.get("remark"), language=str(lang),
                               version=int(obj.get("version", 0)))
    except (ValueError, TypeError, UnicodeDecodeError) as exc:
        raise RmqRemotingProtocolError(f"bad JSON header: {exc}") from None


def _decode_binary_header(h: bytes) -> RemotingCommand:
    try:
        code, lang, version, opaque, flag = _BIN_FIXED.unpack_from(h, 0)
        p = _BIN_FIXED.size
        rlen = _I32.unpack_from(h, p)[0]
        p += 4
        if rlen < 0 or p + rlen > len(h):
            raise ValueError(f"remark length {rlen} out of bounds")
        remark = h[p:p + rlen].decode() if rlen else None
        p += rlen
        elen = _I32.unpack_from(h, p)[0]
        p += 4
        if elen < 0 or p + elen > len(h):
            raise ValueError(f"extFields length {elen} out of bounds")
        end = p + elen
        ext = {}
        while p < end:
            klen = _I16.unpack_from(h, p)[0]
            p += 2
            if klen < 0 or p + klen > end:
                raise ValueError("extFields key out of bounds")
            key = h[p:p + klen].decode()
            p += klen
            vlen = _I32.unpack_from(h, p)[0]
            p += 4
            if vlen < 0 or p + vlen > end:
                raise ValueError("extFields value out of bounds")
            ext[key] = h[p:p + vlen].decode()
            p += vlen
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise RmqRemotingProtocolError(f"bad binary header: {exc}") from None
    language = LANGUAGES[lang] if lang < len(LANGUAGES) else f"LANG{lang}"
    return RemotingCommand(code=code, ext_fields=ext, opaque=opaque, flag=flag, remark=remark,
                           language=language, version=version)


def loads_fastjson(text: str | bytes):
    """JSON as fastjson writes it (integer and object map keys): see :mod:`.fastjson`."""
    return fastjson.loads(text)
