"""A straightforward pure-Python reader of one queue: the baseline for the "10x" target.

This is what one would write without a C core: walk the ConsumeQueue units with ``struct``, read
each CommitLog record from an ``mmap``, decode its fields with precompiled ``struct.Struct``s, split
the properties, and collect Python lists that become one Arrow batch in the full row schema
(:data:`rmq_source.schema.ARROW_SCHEMA`). It is kept in bench/ only: it skips what the real reader
does for live and damaged stores (retention, torn tails, tag filtering) and validates only the
magic code and the record size. Bodies compressed with zlib are inflated.

    rows = decode_queue(store_root, "BenchTopic", 0, 0, 1000)   # -> pa.RecordBatch
"""
from __future__ import annotations

import mmap
import os
import struct
import zlib

import pyarrow as pa

from rmq_source.schema import ARROW_SCHEMA

MAGIC_V1 = -626843481     # 0xDAA320A7 as int32
MAGIC_V2 = -626843477     # 0xDAA320AB
CQ_UNIT = struct.Struct(">qiq")                 # physical offset, size, tagsCode
HEAD = struct.Struct(">iiiiiqqiq")              # TOTALSIZE .. BORNTIMESTAMP (48 bytes)
I32 = struct.Struct(">i")
I64 = struct.Struct(">q")
U16 = struct.Struct(">H")
I16 = struct.Struct(">h")
IPV6_GROUPS = struct.Struct(">8H")


def _mapped_files(folder: str) -> list[tuple[int, mmap.mmap]]:
    out = []
    if not os.path.isdir(folder):
        return out
    for name in sorted(os.listdir(folder)):
        if len(name) == 20 and name.isdigit():
            with open(os.path.join(folder, name), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size:
                    out.append((int(name), mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)))
    return out


def _host(field: bytes) -> str:
    port = I32.unpack_from(field, len(field) - 4)[0]
    if len(field) == 8:
        return f"{field[0]}.{field[1]}.{field[2]}.{field[3]}:{port}"
    return ":".join(f"{g:x}" for g in IPV6_GROUPS.unpack_from(field)) + f":{port}"


def _properties(text: str) -> dict[str, str]:
    props: dict[str, str] = {}
    for segment in text.split("\x02"):
        sep = segment.find("\x01")
        if sep > 0 and sep < len(segment) - 1:
            props[segment[:sep]] = segment[sep + 1:]
    return props


class PurePythonQueueReader:
    """Decodes queue ranges of one store; files are mapped once per reader."""

    def __init__(self, root: str | os.PathLike, broker_name: str = "broker-a"):
        self.root = os.fspath(root)
        self.broker_name = broker_name
        self.commitlog = _mapped_files(os.path.join(self.root, "commitlog"))
        self.cl_file_size = len(self.commitlog[0][1])

    def decode_queue(self, topic: str, queue_id: int, start: int, end: int) -> pa.RecordBatch:
        """Messages of queue offsets ``[start, end)`` as one batch in the full row schema."""
        cq_files = _mapped_files(os.path.join(self.root, "consumequeue", topic, str(queue_id)))
        cols = {name: [] for name in ARROW_SCHEMA.names}
        cq_size = len(cq_files[0][1]) if cq_files else 0
        for offset in range(start, end if cq_files else start):
            where = offset * 20
            file_start, cq = cq_files[(where - cq_files[0][0]) // cq_size]
            phy, size, _tags_code = CQ_UNIT.unpack_from(cq, where - file_start)
            if size <= 0:
                break
            file_start, cl = self.commitlog[(phy - self.commitlog[0][0]) // self.cl_file_size]
            self._decode_record(cl, phy - file_start, size, phy, cols)
        n = len(cols["queueId"])
        cols["topic"] = [topic] * n
        cols["brokerName"] = [self.broker_name] * n
        arrays = [pa.array(cols[f.name], type=f.type) for f in ARROW_SCHEMA]
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)

    @staticmethod
    def _decode_record(buf: mmap.mmap, pos: int, unit_size: int, phy: int, cols: dict) -> None:
        (total, magic, body_crc, queue_id, flag, queue_offset, phy_field, sys_flag,
         born_ts) = HEAD.unpack_from(buf, pos)
        if magic not in (MAGIC_V1, MAGIC_V2) or total != unit_size:
            raise ValueError(f"bad record at physical offset {phy}: magic {magic:#x}, size {total}")
        p = pos + 48
        bh = 20 if sys_flag & 0x10 else 8
        sh = 20 if sys_flag & 0x20 else 8
        born_host = buf[p:p + bh]
        p += bh
        store_ts = I64.unpack_from(buf, p)[0]
        p += 8
        store_host = buf[p:p + sh]
        p += sh
        reconsume = I32.unpack_from(buf, p)[0]
        prepared = I64.unpack_from(buf, p + 4)[0]
        body_len = I32.unpack_from(buf, p + 12)[0]
        p += 16
        body = buf[p:p + max(body_len, 0)]
        p += max(body_len, 0)
        if magic == MAGIC_V1:
            topic_len = buf[p]
            p += 1
        else:
            topic_len = U16.unpack_from(buf, p)[0]
            p += 2
        p += topic_len
        props_len = I16.unpack_from(buf, p)[0]
        p += 2
        props = _properties(buf[p:p + props_len].decode("utf-8")) if props_len > 0 else {}
        if sys_flag & 0x1:
            body = zlib.decompress(body)
        keys = props.get("KEYS")
        keys = [k for k in keys.split(" ") if k] if keys is not None else None
        cols["queueId"].append(queue_id)
        cols["queueOffset"].append(queue_offset)
        cols["commitLogOffset"].append(phy)
        cols["storeSize"].append(total)
        cols["msgId"].append((store_host + I64.pack(phy)).hex().upper())
        cols["uniqKey"].append(props.get("UNIQ_KEY"))
        cols["tags"].append(props.get("TAGS"))
        cols["keys"].append(keys or None)
        cols["body"].append(body)
        cols["properties"].append(list(props.items()))
        cols["bornTimestamp"].append(born_ts * 1000)
        cols["storeTimestamp"].append(store_ts * 1000)
        cols["bornHost"].append(_host(born_host))
        cols["storeHost"].append(_host(store_host))
        cols["sysFlag"].append(sys_flag)
        cols["flag"].append(flag)
        cols["reconsumeTimes"].append(reconsume)
        cols["bodyCRC"].append(body_crc)
        cols["preparedTransactionOffset"].append(prepared)

    def close(self) -> None:
        for _, mm in self.commitlog:
            mm.close()
        self.commitlog = []
