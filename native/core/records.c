/* native/core/records.c - part of the C core's one translation unit (see rmq_core.c).
 * CommitLog records: parsing and validation, the valid end of the CommitLog, and
 * whether a record is the message of the ConsumeQueue unit that points at it.
 */

/* ------------------------------------------------------------------------------------------ */
/* CommitLog record parsing                                                                    */

typedef struct span { int64_t o, l; } span; /* offset and length in a string; l < 0: none */

typedef struct rec {
    const uint8_t *p;   /* record start */
    int32_t total;
    uint32_t magic;
    int32_t body_crc, queue_id, flag, sysflag, reconsume;
    int64_t queue_offset, phy, born_ts, store_ts, prepared;
    const uint8_t *born_host, *store_host;
    int bh, sh;
    int32_t body_len, topic_len, prop_len;
    const uint8_t *body, *topic, *props;
} rec;

/* Validate and split the record at `pos` of `seg`. expect_size < 0 means "no CQ unit size to
 * compare with". phy/qoff only decorate error messages. */
static int parse_record(const rmq_segment *seg, int64_t pos, int64_t expect_size, rec *r,
                        int64_t phy, int64_t qoff, rmq_error *err) {
    const char *path = seg->path;
    if (pos < 0 || pos > seg->size - 8)
        return set_err(err, RMQ_E_TRUNCATED, path, pos, phy, qoff,
                       "record header runs past the end of the file (file size %lld)",
                       (long long)seg->size);
    const uint8_t *p = seg->base + pos;
    uint32_t magic = be32(p + 4);
    int32_t total = rd_i32(p);
    if (magic != MAGIC_V1 && magic != MAGIC_V2)
        return set_err(err, RMQ_E_BAD_MAGIC, path, pos, phy, qoff,
                       "record magic is 0x%08X%s, expected 0xDAA320A7 or 0xDAA320AB", magic,
                       magic == MAGIC_BLANK ? " (BLANK end-of-file filler)" : "");
    if (expect_size >= 0 && total != expect_size)
        return set_err(err, RMQ_E_SIZE_MISMATCH, path, pos, phy, qoff,
                       "record TOTALSIZE %d differs from the ConsumeQueue unit size %lld", total,
                       (long long)expect_size);
    int tl = magic == MAGIC_V2 ? 2 : 1;
    if (total < 90 + tl)
        return set_err(err, RMQ_E_SIZE_MISMATCH, path, pos, phy, qoff,
                       "record TOTALSIZE %d is below the minimum %d", total, 90 + tl);
    if ((int64_t)total > seg->size - pos)
        return set_err(err, RMQ_E_TRUNCATED, path, pos, phy, qoff,
                       "record of TOTALSIZE %d runs past the end of the file (file size %lld)",
                       total, (long long)seg->size);
    r->p = p;
    r->total = total;
    r->magic = magic;
    r->body_crc = rd_i32(p + 8);
    r->queue_id = rd_i32(p + 12);
    r->flag = rd_i32(p + 16);
    r->queue_offset = rd_i64(p + 20);
    r->phy = rd_i64(p + 28);
    r->sysflag = rd_i32(p + 36);
    r->born_ts = rd_i64(p + 40);
    int bh = (r->sysflag & 0x10) ? 20 : 8;
    int sh = (r->sysflag & 0x20) ? 20 : 8;
    int64_t fixed = 72 + bh + sh; /* start of BODY */
    if (fixed + tl + 2 > total)
        return set_err(err, RMQ_E_SIZE_MISMATCH, path, pos, phy, qoff,
                       "record TOTALSIZE %d is too small for its host fields (SYSFLAG 0x%X)", total,
                       (unsigned)r->sysflag);
    r->bh = bh;
    r->sh = sh;
    r->born_host = p + 48;
    r->store_ts = rd_i64(p + 48 + bh);
    r->store_host = p + 56 + bh;
    r->reconsume = rd_i32(p + 56 + bh + sh);
    r->prepared = rd_i64(p + 60 + bh + sh);
    int32_t body_len = rd_i32(p + 68 + bh + sh);
    if (body_len < 0)
        return set_err(err, RMQ_E_NEGATIVE_LENGTH, path, pos, phy, qoff,
                       "BODYLENGTH is negative (%d)", body_len);
    if ((int64_t)body_len > total - fixed - tl - 2)
        return set_err(err, RMQ_E_SIZE_MISMATCH, path, pos, phy, qoff,
                       "BODYLENGTH %d does not fit in TOTALSIZE %d", body_len, total);
    int64_t q = fixed + body_len;
    int32_t topic_len = tl == 1 ? (int32_t)(int8_t)(p[q] <= 0x7F ? p[q] : p[q] - 256)
                                : (int32_t)rd_i16(p + q);
    if (topic_len < 0)
        return set_err(err, RMQ_E_NEGATIVE_LENGTH, path, pos, phy, qoff,
                       "TOPICLENGTH is negative (%d)", topic_len);
    q += tl;
    if ((int64_t)topic_len > total - q - 2)
        return set_err(err, RMQ_E_SIZE_MISMATCH, path, pos, phy, qoff,
                       "TOPICLENGTH %d does not fit in TOTALSIZE %d", topic_len, total);
    r->topic = p + q;
    q += topic_len;
    int32_t prop_len = rd_i16(p + q);
    if (prop_len < 0)
        return set_err(err, RMQ_E_NEGATIVE_LENGTH, path, pos, phy, qoff,
                       "PROPERTIESLENGTH is negative (%d)", prop_len);
    q += 2;
    int64_t expect = 74 + bh + sh + tl + (int64_t)body_len + topic_len + prop_len;
    if (expect != total)
        return set_err(err, RMQ_E_SIZE_MISMATCH, path, pos, phy, qoff,
                       "length rule violated: 74+%d+%d+%d+body %d+topic %d+properties %d = %lld "
                       "but TOTALSIZE is %d",
                       bh, sh, tl, body_len, topic_len, prop_len, (long long)expect, total);
    r->body = p + fixed;
    r->body_len = body_len;
    r->topic_len = topic_len;
    r->props = p + q;
    r->prop_len = prop_len;
    return RMQ_OK;
}

/* The checks of parse_record for a record that has a ConsumeQueue size, reduced to a few
 * predictable branches: 1 when the record is well formed (r filled), 0 when it is not (call
 * parse_record for the precise error). Reads only bytes that earlier checks put inside the file. */
static inline __attribute__((always_inline)) int parse_fast(const rmq_segment *seg, int64_t pos,
                                                             int32_t size, rec *r) {
    if (unlikely(pos < 0 || pos > seg->size - 8)) return 0;
    const uint8_t *p = seg->base + pos;
    uint32_t magic = be32(p + 4);
    int32_t total = rd_i32(p);
    int v2 = magic == MAGIC_V2;
    /* total >= 91: the smallest V1 record; the header fields read below lie inside it */
    if (unlikely((magic != MAGIC_V1 && !v2) | (total != size) | (total < 91) |
                 ((int64_t)total > seg->size - pos)))
        return 0;
    int tl = 1 + v2;
    int32_t sysflag = rd_i32(p + 36);
    int bh = (sysflag & 0x10) ? 20 : 8;
    int sh = (sysflag & 0x20) ? 20 : 8;
    int32_t fixed = 72 + bh + sh; /* start of BODY */
    if (unlikely(fixed + tl + 2 > total)) return 0;
    int32_t body_len = rd_i32(p + fixed - 4);
    /* unsigned compares also reject negative lengths */
    if (unlikely((uint32_t)body_len > (uint32_t)(total - fixed - tl - 2))) return 0;
    int32_t q = fixed + body_len;
    int32_t topic_len = v2 ? (int32_t)rd_i16(p + q) : (p[q] <= 0x7F ? (int32_t)p[q] : -1);
    q += tl;
    if (unlikely((uint32_t)topic_len > (uint32_t)(total - q - 2))) return 0;
    q += topic_len;
    int32_t prop_len = rd_i16(p + q);
    if (unlikely(prop_len != total - q - 2)) return 0; /* the length rule */
    r->p = p;
    r->total = total;
    r->magic = magic;
    r->body_crc = rd_i32(p + 8);
    r->queue_id = rd_i32(p + 12);
    r->flag = rd_i32(p + 16);
    r->queue_offset = rd_i64(p + 20);
    r->phy = rd_i64(p + 28);
    r->sysflag = sysflag;
    r->born_ts = rd_i64(p + 40);
    r->bh = bh;
    r->sh = sh;
    r->born_host = p + 48;
    r->store_ts = rd_i64(p + 48 + bh);
    r->store_host = p + 56 + bh;
    r->reconsume = rd_i32(p + 56 + bh + sh);
    r->prepared = rd_i64(p + 60 + bh + sh);
    r->body = p + fixed;
    r->body_len = body_len;
    r->topic = p + fixed + body_len + tl;
    r->topic_len = topic_len;
    r->props = p + q + 2;
    r->prop_len = prop_len;
    return 1;
}

static inline int32_t body_crc(const uint8_t *b, int32_t n) {
    uLong c = crc32(0L, Z_NULL, 0);
    if (n > 0) c = crc32(c, b, (uInt)n);
    return (int32_t)(c & 0x7FFFFFFFu);
}

/* Index of the first invalid UTF-8 byte, or -1 when valid (strict: no overlongs, surrogates or
 * code points above U+10FFFF). */
/* True when s[0..n) is all ASCII (the common case), word at a time. */
static inline int all_ascii(const uint8_t *s, int64_t n) {
    uint64_t acc = 0, v;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&v, s + i, 8);
        acc |= v;
    }
    if (n >= 8) {
        memcpy(&v, s + n - 8, 8);       /* the tail, overlapping the last word */
        acc |= v;
    } else {
        for (; i < n; i++) acc |= s[i];
    }
    return !(acc & 0x8080808080808080ull);
}

static int64_t utf8_invalid_at(const uint8_t *s, int64_t n) {
    if (all_ascii(s, n)) return -1;
    int64_t i = 0;
    while (i < n) {
        /* ASCII runs 16 bytes at a time */
        while (i + 16 <= n) {
            uint64_t v, w;
            memcpy(&v, s + i, 8);
            memcpy(&w, s + i + 8, 8);
            if ((v | w) & 0x8080808080808080ull) break;
            i += 16;
        }
        if (i >= n) break;
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
        } else if (c < 0xC2) {
            return i;
        } else if (c < 0xE0) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80) return i;
            i += 2;
        } else if (c < 0xF0) {
            if (i + 2 >= n) return i;
            uint8_t c1 = s[i + 1], c2 = s[i + 2];
            if ((c1 & 0xC0) != 0x80 || (c2 & 0xC0) != 0x80) return i;
            if (c == 0xE0 && c1 < 0xA0) return i;
            if (c == 0xED && c1 >= 0xA0) return i;
            i += 3;
        } else if (c < 0xF5) {
            if (i + 3 >= n) return i;
            uint8_t c1 = s[i + 1], c2 = s[i + 2], c3 = s[i + 3];
            if ((c1 & 0xC0) != 0x80 || (c2 & 0xC0) != 0x80 || (c3 & 0xC0) != 0x80) return i;
            if (c == 0xF0 && c1 < 0x90) return i;
            if (c == 0xF4 && c1 >= 0x90) return i;
            i += 4;
        } else {
            return i;
        }
    }
    return -1;
}

/* ------------------------------------------------------------------------------------------ */
/* CommitLog valid end (§2.3) and single-record reads                                          */

int rmq_commitlog_valid_end(const rmq_files *cl, int verify_crc, int64_t *out, rmq_error *err) {
    clear_err(err);
    int rc = check_files(cl, "CommitLog", err);
    if (rc) return rc;
    if (!out) return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "out is NULL");
    if (cl->count == 0) {
        *out = 0;
        return RMQ_OK;
    }
    int64_t idx = cl->count >= 3 ? cl->count - 3 : 0;
    int64_t pos = 0;
    for (;;) {
        const rmq_segment *seg = cl->segs[idx];
        if (pos > seg->size - 8) break; /* short buffer: invalid */
        const uint8_t *p = seg->base + pos;
        uint32_t magic = be32(p + 4);
        if (magic == MAGIC_BLANK) {
            if (idx + 1 >= cl->count) break; /* BLANK in the last file: stop at it */
            idx++;
            pos = 0;
            continue;
        }
        rec r;
        if (parse_record(seg, pos, -1, &r, -1, -1, NULL) != RMQ_OK) break;
        if (verify_crc && body_crc(r.body, r.body_len) != r.body_crc) break;
        pos += r.total;
    }
    *out = cl->segs[idx]->file_start + pos;
    return RMQ_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Does the record belong to the unit pointing at it? (§7.1, §14 item 18)                      */

/* " (ConsumeQueue unit: file F, position P)" when the unit's file is known, else "". */
static void unit_ref(char *out, size_t cap, const char *cq_path, int64_t cq_pos) {
    if (cq_path)
        snprintf(out, cap, " (the ConsumeQueue unit pointing at it: file %s, position %lld)",
                 cq_path, (long long)cq_pos);
    else
        out[0] = 0;
}

/* UNIT_MISMATCH for a record whose PHYSICALOFFSET field is not the address it was read at.
 * The error names the record (CommitLog file, position) and the unit's queue offset. */
static __attribute__((cold, noinline)) int phy_mismatch(rmq_error *err, const rmq_segment *clseg,
                                                        int64_t clpos, const rec *r, int64_t phy,
                                                        int64_t qoff, const char *cq_path,
                                                        int64_t cq_pos) {
    char ref[600];
    unit_ref(ref, sizeof ref, cq_path, cq_pos);
    return set_err(err, RMQ_E_UNIT_MISMATCH, clseg->path, clpos, phy, qoff,
                   "record PHYSICALOFFSET %lld is not its physical offset %lld%s",
                   (long long)r->phy, (long long)phy, ref);
}

/* Value of property `name` in properties s[0..n) (§4.1: entries split on 0x02, name and value
 * split at the first 0x01, both non-empty, a later duplicate wins): 1 and *out, or 0. */
static int find_prop(const uint8_t *s, int64_t n, const char *name, int64_t nl, span *out) {
    int found = 0;
    const uint8_t *base = s, *end = s + n;
    while (s < end) {
        const uint8_t *e = memchr(s, 0x02, (size_t)(end - s));
        if (!e) e = end;
        const uint8_t *sep = memchr(s, 0x01, (size_t)(e - s));
        if (sep && sep - s == nl && sep + 1 < e && memcmp(s, name, (size_t)nl) == 0) {
            out->o = sep + 1 - base;
            out->l = e - (sep + 1);
            found = 1;
        }
        if (e == end) break;
        s = e + 1;
    }
    return found;
}

/* s[0..n) is a decimal number (ASCII digits only, at least one) equal to v (>= 0). */
static int decimal_is(const uint8_t *s, int64_t n, int64_t v) {
    if (n <= 0) return 0;
    int64_t x = 0;
    for (int64_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        int d = s[i] - '0';
        if (x > (INT64_MAX - d) / 10) return 0;
        x = x * 10 + d;
    }
    return x == v;
}

/* Whether the record lists queue (a->topic, a->queue_id) at queue offset n among its
 * multi-dispatch targets: INNER_MULTI_DISPATCH holds queue (topic) names and
 * INNER_MULTI_QUEUE_OFFSET their offsets, comma-separated, position-aligned (§4.2). The broker
 * files such a unit under the parent's QUEUEID, or under queue 0 for a light message queue. */
static int multi_dispatch_lists(const rmq_scan_args *a, const rec *r, int64_t n) {
    span qs, os;
    if (a->queue_id != 0 && a->queue_id != r->queue_id) return 0;
    if (!find_prop(r->props, r->prop_len, "INNER_MULTI_DISPATCH", 20, &qs) ||
        !find_prop(r->props, r->prop_len, "INNER_MULTI_QUEUE_OFFSET", 24, &os))
        return 0;
    const uint8_t *q = r->props + qs.o, *qe = q + qs.l;
    const uint8_t *o = r->props + os.o, *oe = o + os.l;
    for (;;) {
        const uint8_t *qc = memchr(q, ',', (size_t)(qe - q));
        const uint8_t *oc = memchr(o, ',', (size_t)(oe - o));
        if (!qc) qc = qe;
        if (!oc) oc = oe;
        if (qc - q == a->topic_len && memcmp(q, a->topic, (size_t)a->topic_len) == 0 &&
            decimal_is(o, oc - o, n))
            return 1;
        if (qc == qe || oc == oe) return 0;
        q = qc + 1;
        o = oc + 1;
    }
}

/* The record's own queue is (a->topic, a->queue_id) and its QUEUEOFFSET is n: the common case,
 * a few compares. */
static inline int record_of_queue(const rmq_scan_args *a, const rec *r, int64_t n) {
    return r->queue_offset == n && r->queue_id == a->queue_id && r->topic_len == a->topic_len &&
           memcmp(r->topic, a->topic, (size_t)a->topic_len) == 0;
}

/* RMQ_OK when record r (read at physical offset phy) is the message of unit n, else
 * UNIT_MISMATCH naming the record and the unit. Called when the fast checks failed. */
static __attribute__((cold, noinline)) int unit_mismatch(const rmq_scan_args *a, const rec *r,
                                                         int64_t phy, int64_t n,
                                                         const rmq_segment *clseg, int64_t clpos,
                                                         const char *cq_path, int64_t cq_pos,
                                                         rmq_error *err) {
    if (r->phy != phy) return phy_mismatch(err, clseg, clpos, r, phy, n, cq_path, cq_pos);
    if (!a->check_queue || record_of_queue(a, r, n) || multi_dispatch_lists(a, r, n))
        return RMQ_OK;
    char ref[600];
    unit_ref(ref, sizeof ref, cq_path, cq_pos);
    int tl = r->topic_len < 100 ? (int)r->topic_len : 100;
    int ql = a->topic_len < 100 ? (int)a->topic_len : 100;
    return set_err(err, RMQ_E_UNIT_MISMATCH, clseg->path, clpos, phy, n,
                   "record of topic '%.*s'%s, queue %d, QUEUEOFFSET %lld is not the message of "
                   "queue '%.*s'%s/%d at queue offset %lld%s",
                   tl, (const char *)r->topic, r->topic_len > tl ? "..." : "", r->queue_id,
                   (long long)r->queue_offset, ql, a->topic, a->topic_len > ql ? "..." : "",
                   a->queue_id, (long long)n, ref);
}

/* A record of a DLedger CommitLog (phy >= cl->dledger_from) must be the body of the entry whose
 * 48-byte header precedes it in the same file (rmq_layout.h): else BAD_ENTRY, naming the header's
 * position. The record itself was validated first, so r->total is its TOTALSIZE. */
static int check_entry(const rmq_files *cl, const rmq_segment *seg, int64_t pos, const rec *r,
                       int64_t phy, int64_t qoff, rmq_error *err) {
    if (!cl->dledger || phy < cl->dledger_from) return RMQ_OK;
    int64_t hp = pos - DLEDGER_HEADER;
    if (unlikely(hp < 0))
        return set_err(err, RMQ_E_BAD_ENTRY, seg->path, pos, phy, qoff,
                       "record at position %lld of a DLedger data file has no room for the "
                       "48-byte entry header before it", (long long)pos);
    const uint8_t *h = seg->base + hp;
    int32_t magic = rd_i32(h), size = rd_i32(h + 4), body = rd_i32(h + 44);
    int64_t epos = rd_i64(h + 24);
    if (likely(magic == DLEDGER_MAGIC && epos == phy - DLEDGER_HEADER && body == r->total &&
               (int64_t)size == (int64_t)r->total + DLEDGER_HEADER))
        return RMQ_OK;
    return set_err(err, RMQ_E_BAD_ENTRY, seg->path, hp, phy, qoff,
                   "DLedger entry header before the record is not this record's: magic %d "
                   "(expected 1), pos %lld (expected %lld), body length %d and size %d "
                   "(expected %d and %lld)", magic, (long long)epos,
                   (long long)(phy - DLEDGER_HEADER), body, size, r->total,
                   (long long)r->total + DLEDGER_HEADER);
}

/* Locate the record at physical offset phy; errors name the CommitLog file when it exists. The
 * record's PHYSICALOFFSET must be phy (UNIT_MISMATCH), and in a DLedger CommitLog it must sit in
 * its entry (BAD_ENTRY). */
static int locate_record(const rmq_files *cl, int64_t phy, int64_t size, rec *r, int64_t qoff,
                         const char *cq_path, int64_t cq_pos, rmq_error *err) {
    rmq_segment *seg = files_seg(cl, phy, NULL);
    if (!seg) {
        int64_t lo = cl->count ? cl->segs[0]->file_start : 0;
        int64_t hi = cl->count ? lo + cl->count * cl->file_size : 0;
        return set_err(err, RMQ_E_UNIT_OUT_OF_RANGE, cq_path, cq_pos, phy, qoff,
                       "ConsumeQueue unit points to physical offset %lld (size %lld) outside the "
                       "mapped CommitLog [%lld, %lld)",
                       (long long)phy, (long long)size, (long long)lo, (long long)hi);
    }
    int64_t pos = phy - seg->file_start;
    int rc = parse_record(seg, pos, size, r, phy, qoff, err);
    if (rc) return rc;
    if (unlikely(r->phy != phy)) return phy_mismatch(err, seg, pos, r, phy, qoff, cq_path, cq_pos);
    return check_entry(cl, seg, pos, r, phy, qoff, err);
}

int rmq_store_timestamp(const rmq_files *cl, int64_t phy, int32_t size, int64_t *out,
                        rmq_error *err) {
    clear_err(err);
    int rc = check_files(cl, "CommitLog", err);
    if (rc) return rc;
    if (!out || phy < 0) return set_err(err, RMQ_E_ARG, NULL, -1, phy, -1, "bad arguments");
    rec r;
    rc = locate_record(cl, phy, size, &r, -1, NULL, -1, err);
    if (rc) return rc;
    *out = r.store_ts;
    return RMQ_OK;
}

