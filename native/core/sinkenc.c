/* native/core/sinkenc.c - part of the C core's one translation unit (see rmq_core.c).
 * The sink's batch encoding: rows of Arrow columns (body, tags, keys) become the body of a
 * SEND_BATCH_MESSAGE request, with each message's UNIQ_KEY derived by BLAKE2b (RFC 7693), without
 * a Python object per row.
 *
 * One message of a batch body (big-endian, as the Java client's MessageDecoder.encodeMessage):
 *   TOTALSIZE int32 (= 22 + BODYLENGTH + PROPERTIESLENGTH), MAGICCODE int32 0, BODYCRC int32 0,
 *   FLAG int32 0, BODYLENGTH int32, BODY, PROPERTIESLENGTH int16, PROPERTIES
 * PROPERTIES (name \x01 value \x02 ...), in this order and only when present:
 *   the row's own properties in map order, TAGS \x01 tags \x02, KEYS \x01 keys joined by spaces \x02, UNIQ_KEY \x01 <32 hex> \x02,
 *   WAIT \x01 true \x02
 * UNIQ_KEY of task row r: BLAKE2b-96 (personalized) of prefix || r as 8 bytes big-endian, laid
 * out as digest bytes 0-9, four zero bytes, digest bytes 10-11, in uppercase hex
 * (rmq_source/sink/uniq.py is the same in Python).
 */

/* ------------------------------------------------------------------------------------------ */
/* BLAKE2b                                                                                     */

static const uint64_t B2_IV[8] = {
    0x6a09e667f3bcc908ull, 0xbb67ae8584caa73bull, 0x3c6ef372fe94f82bull, 0xa54ff53a5f1d36f1ull,
    0x510e527fade682d1ull, 0x9b05688c2b3e6c1full, 0x1f83d9abfb41bd6bull, 0x5be0cd19137e2179ull};

static const uint8_t B2_SIGMA[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3}};

static inline uint64_t rotr64(uint64_t x, int n) { return (x >> n) | (x << (64 - n)); }
static inline uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

#define B2_G(a, b, c, d, x, y)                                                                   \
    do {                                                                                         \
        v[a] = v[a] + v[b] + (x); v[d] = rotr64(v[d] ^ v[a], 32);                                \
        v[c] = v[c] + v[d];       v[b] = rotr64(v[b] ^ v[c], 24);                                \
        v[a] = v[a] + v[b] + (y); v[d] = rotr64(v[d] ^ v[a], 16);                                \
        v[c] = v[c] + v[d];       v[b] = rotr64(v[b] ^ v[c], 63);                                \
    } while (0)

static void b2_compress(rmq_blake2b *s, const uint8_t block[128], int last) {
    uint64_t m[16], v[16];
    for (int i = 0; i < 16; i++) m[i] = le64(block + 8 * i);
    for (int i = 0; i < 8; i++) {
        v[i] = s->h[i];
        v[i + 8] = B2_IV[i];
    }
    v[12] ^= s->t[0];
    v[13] ^= s->t[1];
    if (last) v[14] = ~v[14];
    for (int r = 0; r < 12; r++) {
        const uint8_t *g = B2_SIGMA[r];
        B2_G(0, 4, 8, 12, m[g[0]], m[g[1]]);
        B2_G(1, 5, 9, 13, m[g[2]], m[g[3]]);
        B2_G(2, 6, 10, 14, m[g[4]], m[g[5]]);
        B2_G(3, 7, 11, 15, m[g[6]], m[g[7]]);
        B2_G(0, 5, 10, 15, m[g[8]], m[g[9]]);
        B2_G(1, 6, 11, 12, m[g[10]], m[g[11]]);
        B2_G(2, 7, 8, 13, m[g[12]], m[g[13]]);
        B2_G(3, 4, 9, 14, m[g[14]], m[g[15]]);
    }
    for (int i = 0; i < 8; i++) s->h[i] ^= v[i] ^ v[i + 8];
}

static void b2_add_count(rmq_blake2b *s, uint64_t n) {
    s->t[0] += n;
    if (s->t[0] < n) s->t[1]++;
}

static void b2_update(rmq_blake2b *s, const uint8_t *in, int64_t len) {
    while (len > 0) {
        if (s->buflen == 128) {   /* a full buffer is compressed only once more input follows */
            b2_add_count(s, 128);
            b2_compress(s, s->buf, 0);
            s->buflen = 0;
        }
        int64_t take = 128 - s->buflen < len ? 128 - s->buflen : len;
        memcpy(s->buf + s->buflen, in, (size_t)take);
        s->buflen += (int32_t)take;
        in += take;
        len -= take;
    }
}

static void b2_final(rmq_blake2b *s, uint8_t *out) {
    b2_add_count(s, (uint64_t)s->buflen);
    memset(s->buf + s->buflen, 0, (size_t)(128 - s->buflen));
    b2_compress(s, s->buf, 1);
    for (int i = 0; i < s->outlen; i++) out[i] = (uint8_t)(s->h[i / 8] >> (8 * (i % 8)));
}

int rmq_uniq_init(rmq_blake2b *s, const uint8_t *person16, const uint8_t *prefix, int64_t prefix_len,
                  rmq_error *err) {
    clear_err(err);
    if (!s || !person16 || (prefix_len > 0 && !prefix) || prefix_len < 0)
        return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "bad UNIQ_KEY state arguments");
    memset(s, 0, sizeof *s);
    s->outlen = RMQ_UNIQ_DIGEST;
    for (int i = 0; i < 8; i++) s->h[i] = B2_IV[i];
    /* parameter block: digest length, key length 0, fanout 1, depth 1; personal in words 6-7 */
    s->h[0] ^= 0x01010000ull | (uint64_t)RMQ_UNIQ_DIGEST;
    s->h[6] ^= le64(person16);
    s->h[7] ^= le64(person16 + 8);
    b2_update(s, prefix, prefix_len);
    return RMQ_OK;
}

static const char HEX_UPPER[16] = "0123456789ABCDEF";

/* the 32 hex characters of task row `row`'s UNIQ_KEY */
static inline void uniq_key(const rmq_blake2b *base, int64_t row, char *out) {
    rmq_blake2b s = *base;
    uint8_t be[8], d[RMQ_UNIQ_DIGEST], k[16];
    uint64_t u = (uint64_t)row;
    for (int i = 7; i >= 0; i--, u >>= 8) be[i] = (uint8_t)u;
    b2_update(&s, be, 8);
    b2_final(&s, d);
    memcpy(k, d, 10);
    memset(k + 10, 0, 4);
    memcpy(k + 14, d + 10, 2);
    for (int i = 0; i < 16; i++) {
        out[2 * i] = HEX_UPPER[k[i] >> 4];
        out[2 * i + 1] = HEX_UPPER[k[i] & 15];
    }
}

int rmq_uniq_keys(const rmq_blake2b *base, int64_t first_row, int64_t count, char *out,
                  rmq_error *err) {
    clear_err(err);
    if (!base || (!out && count) || count < 0 || first_row < 0 ||
        (count > 0 && first_row > INT64_MAX - (count - 1)))
        return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "bad UNIQ_KEY arguments");
    for (int64_t i = 0; i < count; i++) uniq_key(base, first_row + i, out + 32 * i);
    return RMQ_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Rows -> batches                                                                             */

#define SINK_UNIQ_WAIT 52   /* "UNIQ_KEY\x01" 32 hex "\x02" "WAIT\x01true\x02" */
#define SINK_MAX_PROPS 32767

static inline int col_null(const rmq_sink_col *c, int64_t i) { return c->valid && !c->valid[i]; }

static int has_sep(const uint8_t *p, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (p[i] == 1 || p[i] == 2) return 1;
    return 0;
}

/* Check the offsets of entries [from, to) of a column against its data; 0 when sound. */
static int col_check(const rmq_sink_col *c, const char *name, int64_t from, int64_t to, rmq_error *err) {
    if (!c->off) return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "column %s has no offsets", name);
    if (c->off[from] < 0 || c->off[to] > c->data_len || (c->data_len > 0 && !c->data))
        return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1,
                       "column %s: offsets [%lld, %lld] outside its %lld data bytes", name,
                       (long long)c->off[from], (long long)c->off[to], (long long)c->data_len);
    for (int64_t i = from; i < to; i++)
        if (c->off[i] > c->off[i + 1])
            return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1,
                           "column %s: offsets decrease at entry %lld", name, (long long)i);
    return RMQ_OK;
}

/* Encoded properties length of row r, or -1 when the row cannot be a message (the caller
 * names the row; the Python path words the reason). Keys of a list column are joined by
 * spaces; each must be non-empty, without a space. Property names and values must be non-empty
 * and free of separators (blank and reserved names are the caller's row_bad). */
static int64_t row_props_len(const rmq_sink_rows *rw, int64_t r) {
    int64_t len = SINK_UNIQ_WAIT;
    if (rw->row_bad && rw->row_bad[r]) return -1;
    if (rw->prop_lists && !(rw->prop_lists_valid && !rw->prop_lists_valid[r])) {
        for (int64_t i = rw->prop_lists[r]; i < rw->prop_lists[r + 1]; i++) {
            if (col_null(&rw->prop_names, i) || col_null(&rw->prop_values, i)) return -1;
            int64_t a = rw->prop_names.off[i], b = rw->prop_names.off[i + 1];
            int64_t c = rw->prop_values.off[i], d = rw->prop_values.off[i + 1];
            if (a == b || c == d || has_sep(rw->prop_names.data + a, b - a) ||
                has_sep(rw->prop_values.data + c, d - c))
                return -1;
            len += (b - a) + (d - c) + 2;
            if (len > SINK_MAX_PROPS) return -1;
        }
    }
    if (rw->tags.off && !col_null(&rw->tags, r)) {
        int64_t a = rw->tags.off[r], b = rw->tags.off[r + 1];
        if (has_sep(rw->tags.data + a, b - a)) return -1;
        len += 6 + (b - a);
    }
    if (rw->keys.off && !(rw->key_lists ? rw->key_lists_valid && !rw->key_lists_valid[r]
                                        : col_null(&rw->keys, r))) {
        int64_t klen;
        if (rw->key_lists) {
            int64_t i0 = rw->key_lists[r], i1 = rw->key_lists[r + 1];
            klen = i1 > i0 ? i1 - i0 - 1 : 0;
            for (int64_t i = i0; i < i1; i++) {
                if (col_null(&rw->keys, i)) return -1;
                const uint8_t *p = rw->keys.data + rw->keys.off[i];
                int64_t n = rw->keys.off[i + 1] - rw->keys.off[i];
                if (n == 0 || memchr(p, ' ', (size_t)n) || has_sep(p, n)) return -1;
                klen += n;
            }
        } else {
            int64_t a = rw->keys.off[r], b = rw->keys.off[r + 1];
            if (has_sep(rw->keys.data + a, b - a)) return -1;
            klen = b - a;
        }
        if (klen > 0) len += 6 + klen;
    }
    return len > SINK_MAX_PROPS ? -1 : len;
}

/* Check the list (or map) offsets of rows [from, to) against the `items` entries of its child
 * column(s), and those entries' own offsets; 0 when sound. */
static int lists_check(const int64_t *lists, int64_t items, const rmq_sink_col *child,
                       const rmq_sink_col *child2, const char *name, int64_t from, int64_t to,
                       rmq_error *err) {
    int64_t i0 = lists[from], i1 = lists[to];
    if (i0 < 0 || i1 > items || i0 > i1)
        return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1,
                       "column %s: list offsets [%lld, %lld] outside its %lld entries", name,
                       (long long)i0, (long long)i1, (long long)items);
    for (int64_t r = from; r < to; r++)
        if (lists[r] > lists[r + 1])
            return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1,
                           "column %s: list offsets decrease at row %lld", name, (long long)r);
    int rc = col_check(child, name, i0, i1, err);
    if (!rc && child2) rc = col_check(child2, name, i0, i1, err);
    return rc;
}

static int rows_check(const rmq_sink_rows *rw, int64_t from, int64_t to, rmq_error *err) {
    if (!rw || from < 0 || to < from || to > rw->n)
        return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "bad row range [%lld, %lld)",
                       (long long)from, (long long)to);
    if (from == to) return RMQ_OK;
    int rc = col_check(&rw->body, "body", from, to, err);
    if (!rc && rw->tags.off) rc = col_check(&rw->tags, "tags", from, to, err);
    if (!rc && rw->keys.off) {
        if (!rw->key_lists) rc = col_check(&rw->keys, "keys", from, to, err);
        else rc = lists_check(rw->key_lists, rw->key_items, &rw->keys, NULL, "keys", from, to, err);
    }
    if (!rc && rw->prop_lists)
        rc = lists_check(rw->prop_lists, rw->prop_entries, &rw->prop_names, &rw->prop_values,
                         "properties", from, to, err);
    return rc;
}

int64_t rmq_sink_plan(const rmq_sink_rows *rw, int64_t from, const rmq_sink_limits *lim,
                      int64_t open_count, int64_t open_bytes, int64_t *ends, int64_t *sizes,
                      int64_t cap, int64_t *bad_row, int32_t *last_open, rmq_error *err) {
    clear_err(err);
    if (!lim || !ends || !sizes || !bad_row || !last_open || cap < 1 || open_count < 0 ||
        open_bytes < 0 || lim->max_messages < 1 || lim->max_bytes < 1 || lim->max_body < 0) {
        set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "bad batch plan arguments");
        return -1;
    }
    if (rows_check(rw, from, rw ? rw->n : 0, err)) return -1;
    *bad_row = -1;
    *last_open = 0;
    int64_t nb = 0, count = open_count, bytes = open_bytes, mine = 0;
    for (int64_t r = from; r < rw->n; r++) {
        int64_t blen = rw->body.off[r + 1] - rw->body.off[r];
        /* an empty body is no message: the Java client refuses it, a 5.x broker fails on it */
        int64_t plen = col_null(&rw->body, r) || blen == 0 || blen > lim->max_body
                           ? -1 : row_props_len(rw, r);
        if (plen < 0) {
            *bad_row = r;
            break;
        }
        int64_t size = 22 + blen + plen;
        if (count > 0 && (count >= lim->max_messages || bytes + size > lim->max_bytes)) {
            if (nb == cap) {
                set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "batch plan needs more than %lld batches",
                        (long long)cap);
                return -1;
            }
            ends[nb] = r;
            sizes[nb++] = mine;
            count = bytes = mine = 0;
        }
        count++;
        bytes += size;
        mine += size;
    }
    if (count > 0 || nb == 0) {
        if (nb == cap) {
            set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "batch plan needs more than %lld batches",
                    (long long)cap);
            return -1;
        }
        ends[nb] = *bad_row >= 0 ? *bad_row : rw->n;
        sizes[nb++] = mine;
        *last_open = 1;   /* ended by the rows (or a bad row), not by a limit */
    }
    return nb;
}

int rmq_sink_encode(const rmq_sink_rows *rw, int64_t from, int64_t to, const rmq_blake2b *uniq,
                    int64_t task_row0, uint8_t *out, int64_t out_len, rmq_error *err) {
    clear_err(err);
    if (!uniq || (!out && out_len) || out_len < 0 || task_row0 < 0)
        return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "bad batch encode arguments");
    int rc = rows_check(rw, from, to, err);
    if (rc) return rc;
    if (to > 0 && task_row0 > INT64_MAX - (to - 1))
        return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "task row %lld + %lld overflows",
                       (long long)task_row0, (long long)to);
    uint8_t *p = out, *end = out + out_len;
    for (int64_t r = from; r < to; r++) {
        int64_t blen = rw->body.off[r + 1] - rw->body.off[r];
        int64_t plen = col_null(&rw->body, r) ? -1 : row_props_len(rw, r);
        if (plen < 0 || blen > INT32_MAX - 22 - plen)
            return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "row %lld cannot be a message (plan it first)",
                           (long long)r);
        int64_t size = 22 + blen + plen;
        if (end - p < size)
            return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1,
                           "output of %lld bytes too small at row %lld", (long long)out_len, (long long)r);
        uint32_t head[5] = {__builtin_bswap32((uint32_t)size), 0, 0, 0, __builtin_bswap32((uint32_t)blen)};
        memcpy(p, head, 20);
        p += 20;
        if (blen) memcpy(p, rw->body.data + rw->body.off[r], (size_t)blen);
        p += blen;
        *p++ = (uint8_t)(plen >> 8);
        *p++ = (uint8_t)plen;
        if (rw->prop_lists && !(rw->prop_lists_valid && !rw->prop_lists_valid[r])) {
            for (int64_t i = rw->prop_lists[r]; i < rw->prop_lists[r + 1]; i++) {
                int64_t a = rw->prop_names.off[i], na = rw->prop_names.off[i + 1] - a;
                int64_t c = rw->prop_values.off[i], nc = rw->prop_values.off[i + 1] - c;
                memcpy(p, rw->prop_names.data + a, (size_t)na);
                p[na] = 1;
                memcpy(p + na + 1, rw->prop_values.data + c, (size_t)nc);
                p[na + 1 + nc] = 2;
                p += na + nc + 2;
            }
        }
        if (rw->tags.off && !col_null(&rw->tags, r)) {
            int64_t a = rw->tags.off[r], n = rw->tags.off[r + 1] - a;
            memcpy(p, "TAGS\x01", 5);
            if (n) memcpy(p + 5, rw->tags.data + a, (size_t)n);
            p[5 + n] = 2;
            p += 6 + n;
        }
        if (rw->keys.off && !(rw->key_lists ? rw->key_lists_valid && !rw->key_lists_valid[r]
                                            : col_null(&rw->keys, r))) {
            uint8_t *start = p;
            memcpy(p, "KEYS\x01", 5);
            p += 5;
            if (rw->key_lists) {
                for (int64_t i = rw->key_lists[r]; i < rw->key_lists[r + 1]; i++) {
                    int64_t n = rw->keys.off[i + 1] - rw->keys.off[i];
                    if (i > rw->key_lists[r]) *p++ = ' ';
                    memcpy(p, rw->keys.data + rw->keys.off[i], (size_t)n);
                    p += n;
                }
            } else {
                int64_t a = rw->keys.off[r], n = rw->keys.off[r + 1] - a;
                if (n) memcpy(p, rw->keys.data + a, (size_t)n);
                p += n;
            }
            if (p == start + 5) p = start;   /* no keys: no KEYS property */
            else *p++ = 2;
        }
        memcpy(p, "UNIQ_KEY\x01", 9);
        uniq_key(uniq, task_row0 + r, (char *)p + 9);
        memcpy(p + 41, "\x02WAIT\x01true\x02", 11);
        p += SINK_UNIQ_WAIT;
    }
    if (p != end)
        return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "rows [%lld, %lld) take %lld bytes, not %lld",
                       (long long)from, (long long)to, (long long)(p - out), (long long)out_len);
    return RMQ_OK;
}
