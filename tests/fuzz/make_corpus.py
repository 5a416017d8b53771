"""Write the seed corpora of the fuzz targets (generated at test time; nothing binary is kept).

    python tests/fuzz/make_corpus.py OUTDIR      # -> OUTDIR/record/*, OUTDIR/queue/*

Seeds are valid inputs built from valid records: V1 and V2 (140-character topic), IPv6 and
IPv4-mapped hosts, compressed bodies (legacy zlib flag and 5.x type bits), properties with a
trailing separator, duplicates and non-ASCII text, KEYS/UNIQ_KEY, "Aa"/"BB" (same tag hash), a
bad BODYCRC, invalid UTF-8, BLANK file ends, pre-blank units (leading, and misplaced ones),
records of another queue or with a wrong PHYSICALOFFSET, a multi-dispatch (LMQ) record, and
header variations (filters, max_rows/max_bytes, CommitLog base, raw arguments, scans naming the
queue they read). Each seed is a 16-byte header
(``fuzz_harness.Knobs``) followed by the target's payload.
"""
from __future__ import annotations

import hashlib
import os
import re
import struct
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fuzz_harness as fh  # noqa: E402  (sibling module, not a package)
from fuzz_harness import (F_CL_BASE, F_EXTRA, F_FILTER, F_PREBLANK, F_RAW_ARGS,  # noqa: E402
                          F_SMALL_BYTES, F_TAGS, F_VERIFY_CRC, Knobs)

ALL_TAGS = 0b11111
NAMES_QUEUE = 0x40          # misc: scans name the queue read (Knobs.names_queue)
PREBLANK = struct.pack(">qiq", 0, 0x7FFFFFFF, 0)


def knobs(flags: int = 0, rows: int = 0xFF, size: int = 0, misc: int = 0x02, u32: int = 0,
          raw: int = 0) -> bytes:
    """Header bytes; defaults: max_rows 65536, scan from offset 0 to one past the last unit."""
    return Knobs(flags, rows, size, misc, u32, raw).pack()


def _size_sel(fs: int, n_raw: int = 0) -> int:
    return (fs.bit_length() - 8) | (n_raw << 4)     # fs = 128 << (sel & 7)


def _cl(records: list[bytes], fs: int, base: int = 0, first_queue_offset: int = 0) -> bytes:
    """CommitLog bytes of the record target: files laid out as the broker does, the last file
    cut after its data (the harness pads nothing)."""
    files, placed = fh.layout_records(records, fs, base, first_queue_offset)
    end = placed[-1][0] - base + placed[-1][1] if placed else 0
    return b"".join(files)[:end]


def _poke_phy(cl: bytes, phy: int, value: int) -> bytes:
    """CommitLog bytes with the PHYSICALOFFSET field of the record at ``phy`` (base 0) set."""
    return cl[:phy + 28] + struct.pack(">q", value) + cl[phy + 36:]


def record_seeds() -> dict[str, bytes]:
    r = fh.crafted_records()
    v1, tag_b, untagged, v2, v6, mapped = (r[n] for n in ("v1", "tag_b", "untagged", "v2", "v6",
                                                          "mapped"))
    zlib_legacy, zlib_type, props, many, keys = (r[n] for n in ("zlib_legacy", "zlib_type",
                                                                "props", "many", "keys"))
    bad_crc, bad_utf8 = r["bad_crc"], r["bad_utf8"]
    fixture = fh.fixture_records()
    seeds = {
        "v1_basic": knobs(size=_size_sel(1024)) + _cl([v1, tag_b, untagged], 1024),
        "v2_long_topic": knobs(size=_size_sel(512)) + _cl([v2, v1], 512),
        "ipv6_hosts": knobs(size=_size_sel(512)) + _cl([v6, mapped], 512),
        "compressed": knobs(size=_size_sel(1024)) + _cl([zlib_legacy, zlib_type], 1024),
        "properties_trailing_sep": knobs(size=_size_sel(1024)) + _cl([props, keys, v2], 1024),
        "many_properties": knobs(size=_size_sel(1024)) + _cl([many], 1024),
        "big_records": knobs(size=_size_sel(4096)) + _cl([r["big_props"], r["big_body"]], 4096),
        # records fill 256-byte files: BLANK ends, next file, preallocated zero file
        "blank_multi_file": knobs(F_EXTRA, size=_size_sel(256)) + _cl([v1, tag_b, untagged, v1],
                                                                       256),
        "filter_aa_bb": knobs(F_FILTER | F_TAGS, size=_size_sel(512), u32=0b00100) +
        _cl([v6, mapped, v1], 512),
        "filter_codes_only": knobs(F_FILTER, size=_size_sel(1024), u32=0b00101) +
        _cl([v1, tag_b, v6, mapped, props], 1024),
        "filter_many_codes": knobs(F_FILTER, size=_size_sel(1024), u32=ALL_TAGS, misc=0xC2,
                                   raw=0x1234_5678_9ABC) + _cl([v1, tag_b, untagged], 1024),
        "verify_crc": knobs(F_VERIFY_CRC, size=_size_sel(512)) + _cl([v1, bad_crc], 512),
        "bad_utf8": knobs(size=_size_sel(512)) + _cl([v1, bad_utf8], 512),
        "utf8_edges": knobs(size=_size_sel(1024)) + _cl([r["utf8_edges"], r["utf8_topic"]], 1024),
        # no properties right after rows with long ones (nothing may carry over between rows)
        "empty_after_long_props": knobs(size=_size_sel(1024)) +
        _cl([r["long_props"], r["long_props"], untagged, r["long_props"], zlib_type], 1024),
        "max_rows_1": knobs(rows=0, size=_size_sel(1024)) + _cl([v1, tag_b, untagged], 1024),
        "filter_max_rows_2": knobs(F_FILTER, rows=1, size=_size_sel(1024), u32=0b00011) +
        _cl([v1, tag_b, untagged, v1, tag_b], 1024),
        "small_max_bytes": knobs(F_SMALL_BYTES, size=_size_sel(1024), u32=40 << 5) +
        _cl([v1, tag_b, zlib_legacy, untagged], 1024),
        "cl_base_preblank": knobs(F_CL_BASE | F_PREBLANK, size=_size_sel(512, 2)) +
        struct.pack(">qiq", 0, 120, 0) + struct.pack(">qiq", 1 << 40, 100, 0) +
        _cl([v1, untagged], 512, base=2 * 512, first_queue_offset=2),
        "raw_units": knobs(size=_size_sel(512, 4)) +
        struct.pack(">qiq", 0, 7, 0) +                   # wrong size
        struct.pack(">qiq", 4, 100, 0) +                 # inside a record
        struct.pack(">qiq", 1 << 33, 100, 65) +          # beyond the CommitLog
        struct.pack(">qiq", -1, 0, 0) +                  # unwritten
        _cl([v1, tag_b], 512),
        "raw_args": knobs(F_RAW_ARGS, size=_size_sel(512), u32=0x0040_2010, raw=0x7FFF_0002) +
        _cl([v1, tag_b], 512),
        "lookup_window": knobs(size=_size_sel(1024), misc=0x0B, u32=3 << 17) +
        _cl([v1, tag_b, untagged, v6], 1024),
        "empty": knobs(rows=1),
        # scans that name the queue read: records of queue T/0 at their QUEUEOFFSETs, then one
        # of another topic; a multi-dispatch (LMQ) record listing T at offset 1, then one whose
        # offsets do not match
        "queue_named": knobs(size=_size_sel(1024), misc=NAMES_QUEUE | 0x02) +
        _cl([v1, tag_b, untagged], 1024),
        "queue_named_other_topic": knobs(size=_size_sel(1024), misc=NAMES_QUEUE | 0x02) +
        _cl([v1, v2, tag_b], 1024),
        "queue_named_multi_dispatch": knobs(size=_size_sel(1024), misc=NAMES_QUEUE | 0x02) +
        _cl([v1, fh._record("Parent", b"lmq", b"INNER_MULTI_DISPATCH\x01%LMQ%x,T\x02"
                            b"INNER_MULTI_QUEUE_OFFSET\x017,1\x02TAGS\x01TagA", qid=3), tag_b],
            1024),
        "queue_named_multi_dispatch_wrong_offset": knobs(size=_size_sel(1024),
                                                         misc=NAMES_QUEUE | 0x02) +
        _cl([v1, fh._record("Parent", b"lmq", b"INNER_MULTI_DISPATCH\x01T,%LMQ%x\x02"
                            b"INNER_MULTI_QUEUE_OFFSET\x012,1")], 1024),
        "physical_offset_wrong": knobs(size=_size_sel(1024)) +
        _poke_phy(_cl([v1, tag_b], 1024), len(v1), 4096),
        # a pre-blank unit after written units (raw units follow the derived ones)
        "preblank_after_units": knobs(size=_size_sel(512, 1)) + PREBLANK + _cl([v1, tag_b], 512),
    }
    if fixture:
        seeds["fixture_4_9_3"] = knobs(size=_size_sel(4096)) + _cl(fixture, 4096)
    return seeds


def queue_seeds() -> dict[str, bytes]:
    _files, units = fh.fixed_commitlog()
    n_fixture = len(fh.fixture_records())
    unit_of = dict(zip(list(fh.crafted_records()), units[n_fixture:]))
    # the last two records are corrupt (BODYCRC, UTF-8): most seeds stop before them
    valid = b"".join(fh.UNIT.pack(*u) for u in units[:-2])
    with_bad_crc = b"".join(fh.UNIT.pack(*u) for u in units[:-1])
    with_bad_utf8 = valid + fh.UNIT.pack(*units[-1])
    pre = fh.UNIT.pack(0, 0x7FFFFFFF, 0) * 3
    p0, s0, c0 = units[0]
    p1, s1, _ = units[1]
    odd = b"".join([
        fh.UNIT.pack(p0 + 4, s0, c0),                      # inside a record
        fh.UNIT.pack(p0, s0 + 1, c0),                      # size mismatch
        fh.UNIT.pack(fh.QUEUE_CL_FILE_SIZE - 8, 8, 0),     # near a file end
        fh.UNIT.pack(1 << 40, s1, 0),                      # beyond the CommitLog
        fh.UNIT.pack(p1, s1, 0),
    ])
    per_file_4 = 3                                         # 4 units per ConsumeQueue file
    mid = len(valid) // fh.CQ_UNIT // 2 * fh.CQ_UNIT
    seeds = {
        "all_units": knobs(size=15) + valid,
        "all_units_small_files": knobs(size=per_file_4) + valid,
        "preblank_then_units": knobs(size=15) + pre + valid,
        "trailing_zero_units": knobs(size=15) + valid + bytes(60),
        "odd_units": knobs(size=15) + odd,
        "empty_after_long_props": knobs(size=15) + b"".join(
            fh.UNIT.pack(*unit_of[n]) for n in ("long_props", "long_props", "untagged",
                                                  "long_props", "zlib_type")),
        "size_mismatch": knobs(size=15) + valid[:40] + fh.UNIT.pack(p1, s1 - 1, 0),
        "filter_tags": knobs(F_FILTER | F_TAGS, size=15, u32=0b01101) + valid,
        "filter_codes": knobs(F_FILTER, size=per_file_4, u32=0b00110) + valid,
        "filter_many_codes": knobs(F_FILTER, size=15, u32=ALL_TAGS, misc=0xC2, raw=99) + valid,
        "verify_crc": knobs(F_VERIFY_CRC, size=15) + with_bad_crc,
        "bad_crc_unchecked": knobs(size=15) + with_bad_crc,
        "bad_utf8": knobs(size=15) + with_bad_utf8,
        "cl_gone": knobs(F_CL_BASE, size=15) + valid,
        "short_middle_file": knobs(F_PREBLANK, size=per_file_4, misc=0x12) + valid,
        "cq_starts_later": knobs(F_EXTRA, size=per_file_4 | 0x10) + valid,
        # more rows than a batch's first allocation (64 + 8): row buffers must grow
        "many_rows": knobs(size=15) + valid * 7,
        "many_rows_filtered": knobs(F_FILTER, size=15, u32=0b11111) + valid * 7,
        "max_rows_2": knobs(rows=1, size=15) + valid,
        "filter_max_rows_3": knobs(F_FILTER, rows=2, size=15, u32=0b00011) + valid,
        "small_max_bytes": knobs(F_SMALL_BYTES, size=15, u32=300 << 5) + valid,
        "raw_args": knobs(F_RAW_ARGS, size=15, u32=0x0100_0830, raw=0x0000_1000_0000_8004) +
        valid,
        "lookup_window": knobs(size=15, misc=0x09, u32=5 << 17) + valid,
        # pre-blank units after written units: mid-file, filtered, at the head of a later file
        "preblank_mid_queue": knobs(size=15) + valid[:40] + PREBLANK + valid[40:],
        "preblank_mid_queue_filtered": knobs(F_FILTER, size=15, u32=0b00011) + valid[:40] +
        PREBLANK + valid[40:],
        "preblank_head_of_later_file": knobs(size=per_file_4) + valid[:80] + PREBLANK +
        valid[80:],
        # the lookup's first probe (window [0, count - 1)) lands on it
        "preblank_lookup": knobs(size=15, misc=0x09, u32=5 << 17) + valid[:mid] + PREBLANK +
        valid[mid:],
        # scans naming queue T/0: the crafted records at their QUEUEOFFSETs (the reference
        # store's records before them replaced by leading pre-blank units), then all units
        "queue_named": knobs(size=15, misc=NAMES_QUEUE | 0x02) + PREBLANK * n_fixture +
        b"".join(fh.UNIT.pack(*unit_of[n]) for n in ("v1", "tag_b", "untagged")),
        "queue_named_mismatch": knobs(size=15, misc=NAMES_QUEUE | 0x02) + valid,
    }
    return seeds


def dictionary() -> dict[str, bytes]:
    """libFuzzer dictionary: byte strings whose values matter to the decoder (magic codes,
    boundary integers, property names and separators, UTF-8 edge sequences, tag hash codes)."""
    words = {
        "magic_v1": struct.pack(">I", 0xDAA320A7), "magic_v2": struct.pack(">I", 0xDAA320AB),
        "magic_blank": struct.pack(">I", 0xCBD43194),
        "int_max": b"\x7f\xff\xff\xff", "int_min": b"\x80\x00\x00\x00",
        "minus_one": b"\xff\xff\xff\xff", "zero64": bytes(8),
        "sysflag_v6_both": struct.pack(">i", 0x30), "sysflag_born_v6": struct.pack(">i", 0x10),
        "sysflag_store_v6": struct.pack(">i", 0x20), "sysflag_zlib": struct.pack(">i", 0x301),
        "v4_mapped": bytes(10) + b"\xff\xff",
        "prop_tags": b"TAGS\x01", "prop_keys": b"KEYS\x01", "prop_uniq": b"UNIQ_KEY\x01",
        "sep_name": b"\x01", "sep_entry": b"\x02", "space": b" ",
        # UTF-8: the first invalid and last valid of each class
        "u_surrogate": b"\xed\xa0\x80", "u_before_surrogate": b"\xed\x9f\xbf",
        "u_above_max": b"\xf4\x90\x80\x80", "u_max": b"\xf4\x8f\xbf\xbf",
        "u_overlong2": b"\xc0\x80", "u_overlong2b": b"\xc1\xbf", "u_min2": b"\xc2\x80",
        "u_overlong3": b"\xe0\x80\x80", "u_min3": b"\xe0\xa0\x80",
        "u_overlong4": b"\xf0\x80\x80\x80", "u_min4": b"\xf0\x90\x80\x80",
        "u_f5": b"\xf5\x80\x80\x80", "u_cont": b"\x80", "u_bmp_max": b"\xef\xbf\xbf",
        "u_lead3": b"\xe3\x82", "u_lead4": b"\xf0\x9f\x98",
    }
    for tag in fh.TAG_POOL:
        words[f"hash_{tag.encode('unicode_escape').decode()}"] = struct.pack(
            ">q", fh.fm.java_hash(tag))
    return words


def write_dictionary(path: str | os.PathLike) -> Path:
    lines = []
    for name, value in dictionary().items():
        escaped = "".join(chr(b) if 0x20 <= b < 0x7F and chr(b) not in '"\\' else f"\\x{b:02x}"
                          for b in value)
        lines.append(f'{re.sub(r"[^A-Za-z0-9_]", "_", name)}="{escaped}"')
    Path(path).write_text("\n".join(lines) + "\n", encoding="ascii")
    return Path(path)


def write(outdir: str | os.PathLike) -> dict[str, Path]:
    """Write both corpora and OUTDIR/fuzz.dict; returns {target: folder}. File names are content
    hashes."""
    Path(outdir).mkdir(parents=True, exist_ok=True)
    write_dictionary(Path(outdir) / "fuzz.dict")
    out = {}
    for target, seeds in (("record", record_seeds()), ("queue", queue_seeds())):
        folder = Path(outdir) / target
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in seeds.items():
            digest = hashlib.sha1(data).hexdigest()[:12]
            (folder / f"seed-{name}-{digest}").write_bytes(data)
        out[target] = folder
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/fuzz/make_corpus.py OUTDIR")
    for target, folder in write(sys.argv[1]).items():
        print(f"{target}: {len(os.listdir(folder))} seeds in {folder}")
