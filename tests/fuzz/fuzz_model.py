"""Reference model of the C core's read contract, in plain Python, for the fuzz targets.

The fuzz targets run ``rmq_source.store.native`` (C) and this model on the same files and require the
same answer. The model follows the contracts (docs/rocketmq-store-format.md §2.3, §2.4, §3,
§4.1, §7; DESIGN.md "native.py") and is deliberately slow and literal; where they leave a choice
open (which check decides when several would fail, that max_rows stops a scan before the next
record is read, that a record rejected by its TAGS is not CRC-checked) it follows the C core's
current behaviour. It never imports ``rmq_source``.

Outcomes are compared loosely where the contract is loose: an error is "corrupt" (the C core must
raise RmqCorruptStoreError), "layout" (RmqStoreLayoutError, a missing ConsumeQueue file) or
"option" (RmqOptionError); the exact error code is not compared, only which file and byte
position the error names.

Queue model: a file queue is ``Files`` (consecutive files, each at most ``file_size`` bytes).
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

MAGIC_V1 = 0xDAA320A7
MAGIC_V2 = 0xDAA320AB
MAGIC_BLANK = 0xCBD43194
CQ_UNIT = 20
PREBLANK_SIZE = 0x7FFFFFFF
INT32_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1
MAX_QUEUE_OFFSET = INT64_MAX // CQ_UNIT

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_UNIT = struct.Struct(">qiq")


def java_hash(text: str) -> int:
    """Java String.hashCode as a signed int32 (UTF-16 code units)."""
    h = 0
    units = text.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def wrap64(v: int) -> int:
    """Two's complement int64 wrap (the C core multiplies ms by 1000 in uint64)."""
    return ((v + (1 << 63)) % (1 << 64)) - (1 << 63)


class ModelError(Exception):
    """The model's verdict that the C core must raise.

    ``kind``: "corrupt" (RmqCorruptStoreError), "layout" (RmqStoreLayoutError) or "option"
    (RmqOptionError). ``path``/``position``: the file and byte position the error must name, or
    None when not checked.
    """

    def __init__(self, kind: str, why: str, path: str | None = None,
                 position: int | None = None):
        super().__init__(f"{kind}: {why} (path {path}, position {position})")
        self.kind = kind
        self.why = why
        self.path = path
        self.position = position


@dataclass
class Files:
    """A file queue: ``datas[i]`` is the content of the file starting at ``starts[i]``."""

    paths: list[str]
    starts: list[int]
    datas: list[bytes]
    file_size: int

    @property
    def min_offset(self) -> int:
        return self.starts[0] if self.starts else 0

    def index_of(self, addr: int) -> int | None:
        """Index of the file holding address ``addr`` (by file_size), or None."""
        if not self.starts or addr < self.starts[0]:
            return None
        idx = (addr - self.starts[0]) // self.file_size
        return idx if idx < len(self.starts) else None


# -- records ---------------------------------------------------------------------------------

@dataclass
class Record:
    total: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    phy_field: int
    phy_raw: bytes
    sysflag: int
    born_ts: int
    born_host: bytes
    store_ts: int
    store_host: bytes
    reconsume: int
    prepared: int
    body: bytes
    topic: bytes
    props: bytes


def parse_record(data: bytes, pos: int, expect: int | None) -> Record | None:
    """The record at ``pos`` of one file if it is structurally what the broker writes, else None.

    Rules (§3.2, DESIGN.md scan_queue): magic V1/V2; TOTALSIZE equal to ``expect`` (the CQ unit
    size) when given; the whole record inside the file; BODYLENGTH, TOPICLENGTH (int8 in V1,
    int16 in V2) and PROPERTIESLENGTH not negative; every field inside TOTALSIZE; length rule.
    UTF-8 is not checked here (see :func:`row_of`).
    """
    if pos < 0 or pos + 8 > len(data):
        return None
    total = _I32.unpack_from(data, pos)[0]
    magic = _U32.unpack_from(data, pos + 4)[0]
    if magic not in (MAGIC_V1, MAGIC_V2):
        return None
    if expect is not None and total != expect:
        return None
    if total <= 0 or pos + total > len(data):
        return None
    rec = data[pos:pos + total]
    try:
        sysflag = _I32.unpack_from(rec, 36)[0]
        bh = 20 if sysflag & 0x10 else 8
        sh = 20 if sysflag & 0x20 else 8
        q = 48
        born_host = rec[q:q + bh]
        q += bh
        store_ts = _I64.unpack_from(rec, q)[0]
        q += 8
        store_host = rec[q:q + sh]
        q += sh
        reconsume = _I32.unpack_from(rec, q)[0]
        prepared = _I64.unpack_from(rec, q + 4)[0]
        body_len = _I32.unpack_from(rec, q + 12)[0]
        q += 16
        if body_len < 0 or q + body_len > total:
            return None
        body = rec[q:q + body_len]
        q += body_len
        if magic == MAGIC_V2:
            topic_len = _I16.unpack_from(rec, q)[0]
            q += 2
            tl = 2
        else:
            topic_len = _I8.unpack_from(rec, q)[0]
            q += 1
            tl = 1
        if topic_len < 0 or q + topic_len > total:
            return None
        topic = rec[q:q + topic_len]
        q += topic_len
        prop_len = _I16.unpack_from(rec, q)[0]
        q += 2
        if prop_len < 0 or q + prop_len > total:
            return None
        props = rec[q:q + prop_len]
    except struct.error:        # a fixed field past TOTALSIZE
        return None
    if len(born_host) != bh or len(store_host) != sh:
        return None
    if 74 + bh + sh + tl + body_len + topic_len + prop_len != total:
        return None
    return Record(
        total=total, magic=magic, body_crc=_I32.unpack_from(rec, 8)[0],
        queue_id=_I32.unpack_from(rec, 12)[0], flag=_I32.unpack_from(rec, 16)[0],
        queue_offset=_I64.unpack_from(rec, 20)[0], phy_field=_I64.unpack_from(rec, 28)[0],
        phy_raw=rec[28:36], sysflag=sysflag, born_ts=_I64.unpack_from(rec, 40)[0],
        born_host=born_host, store_ts=store_ts, store_host=store_host, reconsume=reconsume,
        prepared=prepared, body=body, topic=topic, props=props)


def crc_ok(rec: Record) -> bool:
    return (zlib.crc32(rec.body) & 0x7FFFFFFF) == rec.body_crc


def host_text(field_bytes: bytes) -> str:
    """"ip:port" as Java prints it: IPv4 dotted (also IPv4-mapped IPv6), IPv6 long form."""
    addr, port = field_bytes[:-4], _I32.unpack(field_bytes[-4:])[0]
    if len(addr) == 16 and addr[:12] == bytes(10) + b"\xff\xff":
        addr = addr[12:]
    if len(addr) == 4:
        ip = ".".join(str(b) for b in addr)
    else:
        ip = ":".join(format(int.from_bytes(addr[i:i + 2], "big"), "x") for i in range(0, 16, 2))
    return f"{ip}:{port}"


def parse_properties(raw: str) -> dict[str, str]:
    """§4.1: entries split on 0x02; accepted with a 0x01 not at 0 and a non-empty value."""
    out: dict[str, str] = {}
    for seg in raw.split("\x02"):
        i = seg.find("\x01")
        if i > 0 and i < len(seg) - 1:
            out[seg[:i]] = seg[i + 1:]
    return out


@dataclass
class Decoded:
    """A record that passed the UTF-8 checks: its row (NATIVE_SCHEMA minus queueOffset)."""

    row: dict
    tags: str | None
    props_bytes: int
    body_bytes: int


def decode(rec: Record) -> Decoded | None:
    """Row fields of a structurally valid record; None when topic/properties are not UTF-8."""
    try:
        rec.topic.decode("utf-8")
        props_text = rec.props.decode("utf-8")
    except UnicodeDecodeError:
        return None
    props = parse_properties(props_text)
    tags = props.get("TAGS")
    keys_value = props.get("KEYS")
    keys = [w for w in keys_value.split(" ") if w] if keys_value is not None else None
    row = {
        "queueId": rec.queue_id,
        "commitLogOffset": rec.phy_field,
        "storeSize": rec.total,
        "msgId": (rec.store_host + rec.phy_raw).hex().upper(),
        "uniqKey": props.get("UNIQ_KEY"),
        "tags": tags,
        "keys": keys or None,
        "body": rec.body,
        "properties": list(props.items()),
        "bornTimestamp": wrap64(rec.born_ts * 1000),
        "storeTimestamp": wrap64(rec.store_ts * 1000),
        "bornHost": host_text(rec.born_host),
        "storeHost": host_text(rec.store_host),
        "sysFlag": rec.sysflag,
        "flag": rec.flag,
        "reconsumeTimes": rec.reconsume,
        "bodyCRC": rec.body_crc,
        "preparedTransactionOffset": rec.prepared,
    }
    return Decoded(row, tags, len(rec.props), len(rec.body))


# -- ConsumeQueue ----------------------------------------------------------------------------

def cq_unit(cq: Files, n: int):
    """Unit of queue offset ``n``: (phy, size, tagsCode, path, position), or None when it lies
    beyond the written files. Raises ModelError for a missing first file or a short middle file.
    """
    if not cq.starts:
        return None
    addr = n * CQ_UNIT
    if addr < cq.starts[0]:
        raise ModelError("layout", f"queue offset {n} is below the first ConsumeQueue file")
    idx = (addr - cq.starts[0]) // cq.file_size
    if idx >= len(cq.starts):
        return None
    pos = addr - cq.starts[idx]
    data = cq.datas[idx]
    if pos + CQ_UNIT > len(data):
        if idx == len(cq.starts) - 1:
            return None
        raise ModelError("corrupt", "ConsumeQueue file shorter than its file size",
                         cq.paths[idx], pos)
    phy, size, code = _UNIT.unpack_from(data, pos)
    return phy, size, code, cq.paths[idx], pos


def unit_valid(phy: int, size: int) -> bool:
    return phy >= 0 and size > 0


def unit_preblank(phy: int, size: int, code: int) -> bool:
    return phy == 0 and size == PREBLANK_SIZE and code == 0


def preblank_lead_end(cq: Files) -> int:
    """Queue offset one past the leading run of pre-blank units of the queue's first file (its
    first whole unit when there is none): the only place the broker writes them (§7.4,
    ConsumeQueue.fillPreBlank). A pre-blank unit at or above it is damage."""
    if not cq.starts:
        return 0
    start, data = cq.starts[0], cq.datas[0]
    n = -(-start // CQ_UNIT)
    while n <= MAX_QUEUE_OFFSET and n * CQ_UNIT - start + CQ_UNIT <= len(data):
        if not unit_preblank(*_UNIT.unpack_from(data, n * CQ_UNIT - start)):
            break
        n += 1
    return n


def property_value(props: bytes, name: bytes) -> bytes | None:
    """§4.1 on bytes: the value of ``name`` (split on 0x02, then at the first 0x01; name and
    value non-empty; a later duplicate wins), or None."""
    value = None
    for seg in props.split(b"\x02"):
        i = seg.find(b"\x01")
        if i > 0 and i < len(seg) - 1 and seg[:i] == name:
            value = seg[i + 1:]
    return value


def multi_dispatch_lists(rec: Record, topic: bytes, queue_id: int, n: int) -> bool:
    """The record names queue (topic, queue_id) at queue offset ``n`` among its multi-dispatch
    targets (§4.2, §14 item 18): ``topic`` in INNER_MULTI_DISPATCH and ``n`` at the same index
    of INNER_MULTI_QUEUE_OFFSET (comma-separated), filed under the record's QUEUEID or queue 0."""
    if queue_id not in (0, rec.queue_id):
        return False
    queues = property_value(rec.props, b"INNER_MULTI_DISPATCH")
    offsets = property_value(rec.props, b"INNER_MULTI_QUEUE_OFFSET")
    if queues is None or offsets is None:
        return False
    for name, off in zip(queues.split(b","), offsets.split(b",")):
        if name == topic and off and all(0x30 <= c <= 0x39 for c in off) and int(off) == n:
            return True
    return False


def record_is_unit(rec: Record, topic: bytes, queue_id: int, n: int) -> bool:
    """The record is the message of unit ``n`` of queue (topic, queue_id) (§7.1, A.3 step 5)."""
    if rec.topic == topic and rec.queue_id == queue_id and rec.queue_offset == n:
        return True
    return multi_dispatch_lists(rec, topic, queue_id, n)


def cq_valid_units(data: bytes) -> int:
    n = 0
    for i in range(len(data) // CQ_UNIT):
        phy, size, _ = _UNIT.unpack_from(data, i * CQ_UNIT)
        if not unit_valid(phy, size):
            break
        n += 1
    return n


def cq_first_unit_at_or_above(data: bytes, phy_min: int) -> int:
    count = len(data) // CQ_UNIT
    for i in range(count):
        phy, size, code = _UNIT.unpack_from(data, i * CQ_UNIT)
        if not unit_valid(phy, size):
            return i
        if not unit_preblank(phy, size, code) and phy >= phy_min:
            return i
    return count


# -- the operations --------------------------------------------------------------------------

class Model:
    """The read operations over one CommitLog; record parses are cached by (file, pos, size)."""

    def __init__(self, cl: Files):
        self.cl = cl
        self._cache: dict = {}

    def trim_cache(self, limit: int = 50_000) -> None:
        """Bound the memory of a long run (fuzzed units name ever new (phy, size) pairs)."""
        if len(self._cache) > limit:
            self._cache.clear()

    def record_at(self, phy: int, expect: int | None, cq_path: str | None = None,
                  cq_pos: int | None = None) -> Record:
        """Structurally valid record at physical offset ``phy`` whose PHYSICALOFFSET field is
        ``phy``, or ModelError naming the file."""
        idx = self.cl.index_of(phy)
        if idx is None:
            raise ModelError("corrupt", f"physical offset {phy} outside the CommitLog",
                             cq_path, cq_pos)
        pos = phy - self.cl.starts[idx]
        key = (idx, pos, expect)
        if key not in self._cache:
            self._cache[key] = parse_record(self.cl.datas[idx], pos, expect)
        rec = self._cache[key]
        if rec is None:
            raise ModelError("corrupt", f"no valid record at physical offset {phy}",
                             self.cl.paths[idx], pos)
        if rec.phy_field != phy:
            raise ModelError("corrupt", f"PHYSICALOFFSET {rec.phy_field} read at {phy}",
                             self.cl.paths[idx], pos)
        return rec

    def decoded_at(self, phy: int, expect: int, cq_path: str, cq_pos: int) -> Decoded:
        rec = self.record_at(phy, expect, cq_path, cq_pos)
        key = ("decoded", phy, expect)
        if key not in self._cache:
            self._cache[key] = decode(rec)
        dec = self._cache[key]
        if dec is None:
            idx = self.cl.index_of(phy)
            raise ModelError("corrupt", "topic or properties are not UTF-8", self.cl.paths[idx],
                             phy - self.cl.starts[idx])
        return dec

    # CommitLog.valid_end (§2.3)
    def valid_end(self, verify_crc: bool) -> int:
        cl = self.cl
        if not cl.starts:
            return 0
        idx = max(len(cl.starts) - 3, 0)
        pos = 0
        while True:
            data = cl.datas[idx]
            if pos + 8 > len(data):
                break
            magic = _U32.unpack_from(data, pos + 4)[0]
            if magic == MAGIC_BLANK:
                if idx + 1 >= len(cl.starts):
                    break
                idx += 1
                pos = 0
                continue
            rec = parse_record(data, pos, None)
            if rec is None or (verify_crc and not crc_ok(rec)):
                break
            pos += rec.total
        return cl.starts[idx] + pos

    # CommitLog.store_timestamp
    def store_timestamp(self, phy: int, size: int) -> int:
        if not 0 <= phy <= INT64_MAX:
            raise ModelError("option", "phy_offset out of range")
        if not 1 <= size <= INT32_MAX:
            raise ModelError("option", "size out of range")
        return self.record_at(phy, size).store_ts

    # scan_queue, without the max_bytes limit (the comparator checks that part)
    def scan(self, cq: Files, start: int, end: int, codes, tags, max_rows: int,
             max_bytes: int, verify_crc: bool, topic: str | None = None,
             queue_id: int | None = None):
        """Returns (rows, next_offset, status) as if ``max_bytes`` were unlimited (it is only
        validated); each row carries "queueOffset" and the private keys "_bytes" (body +
        properties bytes) and "_props_bytes". A ModelError raised part-way carries ``rows``, the
        rows accepted before it. ``topic``/``queue_id``: the queue read (records must be its
        messages), or None."""
        check_cq_file_size(cq.file_size)
        check_range("start", start, 0, MAX_QUEUE_OFFSET)
        check_range("end", end, 0, MAX_QUEUE_OFFSET)
        if end < start:
            raise ModelError("option", "end < start")
        check_range("max_rows", max_rows, 1, INT64_MAX)
        check_range("max_bytes", max_bytes, 1, INT32_MAX)
        if tags is not None and codes is None:
            raise ModelError("option", "tags without codes")
        if (topic is None) != (queue_id is None):
            raise ModelError("option", "topic without queue_id or the reverse")
        ident = None
        if topic is not None:
            if not topic:
                raise ModelError("option", "empty topic")
            check_range("queue_id", queue_id, -(1 << 31), INT32_MAX)
            ident = (topic.encode("utf-8", "surrogateescape"), queue_id)
        rows: list[dict] = []
        try:
            return self._scan(cq, start, end, codes, tags, max_rows, verify_crc, ident, rows)
        except ModelError as exc:
            exc.rows = rows
            raise

    def _scan(self, cq, start, end, codes, tags, max_rows, verify_crc, ident, rows):
        code_set = None if codes is None else {c for c in codes}
        tag_set = None if tags is None else set(tags)
        cl_min = self.cl.min_offset
        lead_end = None
        n = start
        status = "END"
        while n < end:
            unit = cq_unit(cq, n)
            if unit is None:
                status = "CQ_END"
                break
            phy, size, code, cq_path, cq_pos = unit
            if not unit_valid(phy, size):
                status = "CQ_END"
                break
            if unit_preblank(phy, size, code):          # whatever the subscription
                if lead_end is None:
                    lead_end = preblank_lead_end(cq)
                if n >= lead_end:
                    raise ModelError("corrupt", f"pre-blank unit {n} after written units",
                                     cq_path, cq_pos)
                n += 1
                continue
            if code_set is not None:
                low = code & 0xFFFFFFFF
                low = low - (1 << 32) if low & 0x80000000 else low
                if low not in code_set:
                    n += 1
                    continue
            if phy < cl_min:
                status = "CL_GONE"
                break
            if len(rows) >= max_rows:
                status = "FULL"
                break
            rec = self.record_at(phy, size, cq_path, cq_pos)
            if ident is not None and not record_is_unit(rec, ident[0], ident[1], n):
                idx = self.cl.index_of(phy)
                raise ModelError("corrupt", f"the record at {phy} is not the message of unit {n}",
                                 self.cl.paths[idx], phy - self.cl.starts[idx])
            dec = self.decoded_at(phy, size, cq_path, cq_pos)
            if tag_set is not None and dec.tags not in tag_set:
                n += 1
                continue
            if verify_crc and not crc_ok(self.record_at(phy, size)):
                idx = self.cl.index_of(phy)
                raise ModelError("corrupt", "BODYCRC mismatch", self.cl.paths[idx],
                                 phy - self.cl.starts[idx])
            row = dict(dec.row)
            row["queueOffset"] = n
            row["_bytes"] = dec.body_bytes + dec.props_bytes
            row["_props_bytes"] = dec.props_bytes
            rows.append(row)
            n += 1
        return rows, n, status

    # lookup_time (5.x LOWER by binary search)
    def lookup_time(self, cq: Files, lo: int, hi: int, ts: int) -> int:
        check_cq_file_size(cq.file_size)
        check_range("min_offset", lo, 0, MAX_QUEUE_OFFSET)
        check_range("max_offset", hi, 0, MAX_QUEUE_OFFSET)
        if hi < lo:
            raise ModelError("option", "max_offset < min_offset")
        check_range("timestamp_ms", ts, -(1 << 63), INT64_MAX)
        lead_end = preblank_lead_end(cq)
        while lo < hi:
            mid = lo + (hi - lo) // 2
            if self._time_ge(cq, mid, ts, lead_end):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _time_ge(self, cq: Files, n: int, ts: int, lead_end: int) -> bool:
        unit = cq_unit(cq, n)
        if unit is None:
            raise ModelError("corrupt", f"queue offset {n} beyond the written ConsumeQueue")
        phy, size, code, cq_path, cq_pos = unit
        if not unit_valid(phy, size):
            raise ModelError("corrupt", f"unit {n} not written", cq_path, cq_pos)
        if unit_preblank(phy, size, code):
            if n >= lead_end:
                raise ModelError("corrupt", f"pre-blank unit {n} after written units", cq_path,
                                 cq_pos)
            return False
        if phy < self.cl.min_offset:
            return False
        return self.record_at(phy, size, cq_path, cq_pos).store_ts >= ts


def check_range(name: str, value: int, lo: int, hi: int) -> None:
    if not lo <= value <= hi:
        raise ModelError("option", f"{name}={value} outside [{lo}, {hi}]")



def check_cq_file_size(size: int) -> None:
    if size < CQ_UNIT or size % CQ_UNIT:
        raise ModelError("option", f"cq_file_size {size} is not a positive multiple of 20")
