/* native/core/rows.c - part of the C core's one translation unit (see rmq_core.c).
 * Decoding one record into the batch's columns: strings, hosts, keys, properties, bodies.
 */

/* ------------------------------------------------------------------------------------------ */
/* Row emission                                                                                */

static const char HEXU[] = "0123456789ABCDEF";

static const char HEXL[] = "0123456789abcdef";

static inline char *put_u32dec(char *o, uint32_t v) {
    char tmp[10];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n) *o++ = tmp[--n];
    return o;
}
static inline char *put_i32dec(char *o, int32_t v) {
    if (v < 0) {
        *o++ = '-';
        return put_u32dec(o, (uint32_t)0 - (uint32_t)v);
    }
    return put_u32dec(o, (uint32_t)v);
}

/* "ip:port" as Java prints InetSocketAddress parts: IPv4 dotted; IPv6 8 groups of lowercase hex
 * without leading zeros and without "::" compression (Inet6Address.getHostAddress); an
 * IPv4-mapped IPv6 address (::ffff:a.b.c.d) is printed dotted, as InetAddress.getByAddress
 * turns it into an Inet4Address. Returns the length (<= 51). */
static int format_host(char *out, const uint8_t *h, int width) {
    char *o = out;
    const uint8_t *a = h;
    int alen = width - 4;
    if (alen == 16) {
        static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
        if (memcmp(h, mapped, 12) == 0) {
            a = h + 12;
            alen = 4;
        }
    }
    if (alen == 4) {
        for (int i = 0; i < 4; i++) {
            if (i) *o++ = '.';
            o = put_u32dec(o, a[i]);
        }
    } else {
        for (int g = 0; g < 8; g++) {
            if (g) *o++ = ':';
            unsigned v = ((unsigned)a[2 * g] << 8) | a[2 * g + 1];
            int started = 0;
            for (int s = 12; s >= 0; s -= 4) {
                unsigned d = (v >> s) & 0xF;
                if (d || started || s == 0) {
                    *o++ = HEXL[d];
                    started = 1;
                }
            }
        }
    }
    *o++ = ':';
    o = put_i32dec(o, rd_i32(h + width - 4));
    return (int)(o - out);
}

/* 8 uppercase hex digits of v, most significant first: nibbles spread one per byte, then
 * turned into ASCII with a carry trick (no table, no loop). */
static inline uint64_t hex8_word(uint32_t v) {
    uint64_t x = v;
    x = ((x & 0xFFFF0000ull) << 16) | (x & 0x0000FFFFull);
    x = ((x & 0x0000FF000000FF00ull) << 8) | (x & 0x000000FF000000FFull);
    x = ((x & 0x00F000F000F000F0ull) << 4) | (x & 0x000F000F000F000Full);
    uint64_t letters = ((x + 0x0606060606060606ull) >> 4) & 0x0101010101010101ull;
    return x + 0x3030303030303030ull + letters * 7;   /* '0'..'9', 'A'..'F' */
}

/* 16 uppercase hex digits of v, most significant first. The msgId is a string: the digits are
 * written with one 16-byte store, so the buffer needs 16 bytes of room. */
static inline void hex16(char *o, uint64_t v) {
#if RMQ_SSE2 && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    /* bytes most significant first, each split into its two nibbles, then '0'..'9' / 'A'..'F' */
    __m128i b = _mm_cvtsi64_si128((long long)__builtin_bswap64(v));
    __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F)),
                                    _mm_and_si128(b, _mm_set1_epi8(0x0F)));
    __m128i letter = _mm_and_si128(_mm_cmpgt_epi8(nib, _mm_set1_epi8(9)), _mm_set1_epi8(7));
    _mm_storeu_si128((__m128i *)o, _mm_add_epi8(nib, _mm_add_epi8(letter, _mm_set1_epi8('0'))));
#else
    uint64_t hi = hex8_word((uint32_t)(v >> 32)), lo = hex8_word((uint32_t)v);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    hi = __builtin_bswap64(hi);
    lo = __builtin_bswap64(lo);
#endif
    memcpy(o, &hi, 8);
    memcpy(o + 8, &lo, 8);
#endif
}

typedef struct prop { uint32_t ko, kl, vo, vl; } prop;

/* The last host field seen in one column, formatted. Hosts repeat from row to row (one broker,
 * few producers), so a row usually costs one compare and a fixed-size copy. */
typedef struct host_cache {
    int width;            /* 0: empty */
    int len;
    uint8_t key[24];
    char text[64];        /* "ip:port", zero padded: copied 32 (or 64) bytes at a time */
    char hex[48];         /* uppercase hex of the host field (the msgId prefix), 16 or 40 chars */
} host_cache;

static inline int host_same(const host_cache *c, const uint8_t *h, int width) {
    if (c->width != width) return 0;
    if (width == 8) return ld64(h) == ld64(c->key);
    return memcmp(c->key, h, (size_t)width) == 0;
}

static void host_fill(host_cache *c, const uint8_t *h, int width) {
    memset(c->text, 0, sizeof c->text);
    c->len = format_host(c->text, h, width);
    c->width = width;
    memcpy(c->key, h, (size_t)width);
    for (int i = 0; i < width; i++) {
        c->hex[2 * i] = HEXU[h[i] >> 4];
        c->hex[2 * i + 1] = HEXU[h[i] & 15];
    }
}

/* The shape of the last row's properties: the same names in the same order from row to row is
 * the common case (one producer, one code path), and then a row is matched against the shape
 * (each name compared in one 16-byte compare, each value's end taken from a bit string of the
 * 0x02 bytes) instead of being parsed. Built only from a row whose every segment was an entry
 * (no empty or malformed segments), with at most TPL_MAX distinct ASCII names of at most 15
 * bytes, so a row that matches it splits exactly as the general parse would split it. Only
 * properties of at most TPL_LAYOUT_MAX bytes use it. */
#define TPL_MAX 16
#define TPL_LAYOUT_MAX 128 /* bytes */
typedef struct props_tpl {
    int n;                    /* entries; 0: no shape */
    int trailing;             /* the properties end with a 0x02 */
    int tags, keys, uniq;     /* entry index of TAGS, KEYS, UNIQ_KEY, or -1 */
    uint8_t kl[TPL_MAX];
    uint16_t mask[TPL_MAX];   /* the kl + 1 bytes compared: name and its 0x01 */
    uint8_t name[TPL_MAX][16] __attribute__((aligned(16))); /* name, 0x01, zeros */
    /* The layout of the last row with the shape: when a row also has its length and the same
     * bytes everywhere but in the values (which hold no 0x02), its values are at the same
     * places: no search at all. len 0: none. */
    int64_t len;
    int64_t vo[TPL_MAX], vl[TPL_MAX];
    uint16_t fixed[TPL_LAYOUT_MAX / 16];  /* per 16 bytes: those outside the values */
    uint8_t bytes[TPL_LAYOUT_MAX] __attribute__((aligned(16)));
} props_tpl;

/* Tag codes as they sit in the units (see fast_codes_init). */
typedef struct fast_codes {
    int n;          /* number of raw codes (0..4), or -1: use code_match */
    uint32_t raw[4];
} fast_codes;

/* Scratch state of one scan. */
typedef struct scanner {
    const rmq_scan_args *a;
    rmq_batch *b;
    prop *props;          /* scratch: parsed entries of one record */
    int64_t props_cap;
    uint32_t *hash;       /* scratch: dedupe table for records with many entries */
    int64_t hash_cap;
    int64_t rowcap;       /* rows every row-indexed buffer can hold */
    int64_t small_budget; /* bytes every short-string buffer can still take (see SMALL_BUFS) */
    int64_t cl_min;       /* first CommitLog address still on disk */
    const rmq_files *cq;  /* the ConsumeQueue scanned */
    int64_t lead_end;     /* preblank_lead_end(cq), -1 until a pre-blank unit needs it */
    /* check_queue with a topic of at most 16 bytes: the topic zero-padded, and a mask of its
     * bytes, compared with two 8-byte loads of a record's topic (see record_is_unit) */
    int topic16;
    uint64_t topic_w[2], topic_m[2];
    const rmq_segment *clseg; /* CommitLog file of the last record: [cl_lo, cl_lo + cl_span) */
    int64_t cl_lo, cl_span;
    fast_codes fc;
    int stream;           /* output stores: 0 normal, 1 streaming (SSE2), 2 streaming (AVX2) */
    host_cache born, store;
    props_tpl tpl;        /* shape of the last row's properties */
    /* The row-indexed columns (fixed width, and the offsets of the per-row strings) are written
     * 16 entries at a time: staged here, then moved as whole cache lines (see stage_out). */
    uint8_t stage[RMQ_NBUF][16 * 8] __attribute__((aligned(64)));
    uint32_t vbits[3];    /* validity bits of uniqKey, tags, keys for the staged rows */
    uint8_t body_line[64] __attribute__((aligned(64))); /* see put_body */
} scanner;

static inline void put_off(rmq_buf *off, int64_t idx, int64_t value) {
    int32_t v = (int32_t)value; /* value < 2^31 by the max_bytes contract */
    memcpy(off->data + idx * 4, &v, 4);
}

/* memcpy for the short strings of a row (names, values, tags): overlapping word moves instead
 * of a libc call; writes exactly n bytes. */
static inline void copy_short(uint8_t *d, const uint8_t *s, int64_t n) {
    if (n >= 8 && n <= 16) {
        uint64_t a, b;
        memcpy(&a, s, 8);
        memcpy(&b, s + n - 8, 8);
        memcpy(d, &a, 8);
        memcpy(d + n - 8, &b, 8);
    } else if (n >= 4 && n < 8) {
        uint32_t a, b;
        memcpy(&a, s, 4);
        memcpy(&b, s + n - 4, 4);
        memcpy(d, &a, 4);
        memcpy(d + n - 4, &b, 4);
    } else if (n > 16) {
        memcpy(d, s, (size_t)n);
    } else {
        for (int64_t i = 0; i < n; i++) d[i] = s[i];
    }
}

/* copy_short, or when `over` (the caller guarantees 32 readable bytes after s + n and 32
 * writable bytes after d + n) one or two fixed 16-byte moves for strings up to 32 bytes. */
static inline void copy_small(uint8_t *d, const uint8_t *s, int64_t n, int over) {
    if (likely(over) && n <= 32) {
        memcpy(d, s, 16);
        if (n > 16) memcpy(d + 16, s + 16, 16);
        return;
    }
    copy_short(d, s, n);
}

static inline void append_str(rmq_buf *off, rmq_buf *data, int64_t idx, const uint8_t *s,
                              int64_t n, int over) {
    copy_small(data->data + data->len, s, n, over);
    data->len += n;
    put_off(off, idx + 1, data->len);
}

/* One host column: "ip:port" text from the cache (refreshed when the field changes). The data
 * buffer has at least SMALL_SLACK spare bytes, so the text is copied in fixed 32-byte blocks. */
static inline void put_host(host_cache *c, uint8_t *off_stage, rmq_buf *data, int64_t row,
                            const uint8_t *h, int width) {
    if (unlikely(!host_same(c, h, width))) host_fill(c, h, width);
    uint8_t *o = data->data + data->len;
    memcpy(o, c->text, 32);
    if (unlikely(c->len > 32)) memcpy(o + 32, c->text + 32, 32);
    data->len += c->len;
    int32_t v = (int32_t)data->len;
    memcpy(off_stage + ((row + 1) & 15) * 4, &v, 4);
}

/* True when s[0..n) is ASCII; one 16-byte test when n <= 16 and 16 bytes are readable. */
static inline int ascii_span(const uint8_t *s, int64_t n, const uint8_t *limit) {
#if RMQ_SSE2
    if (n <= 16 && limit - s >= 16) {
        unsigned m = (unsigned)_mm_movemask_epi8(_mm_loadu_si128((const __m128i *)s));
        return (m & ((1u << n) - 1)) == 0;
    }
#else
    (void)limit;
#endif
    return all_ascii(s, n);
}

static uint32_t fnv1a(const uint8_t *s, uint32_t n) {
    uint32_t h = 2166136261u;
    for (uint32_t i = 0; i < n; i++) h = (h ^ s[i]) * 16777619u;
    return h;
}

/* Where the derived columns come from: value spans (offset, length; length -1: absent) of the
 * TAGS, KEYS and UNIQ_KEY properties, and whether the whole string is ASCII. */
typedef struct props_out {
    span tags, keys, uniq;
    int ascii;            /* every byte < 0x80 (no UTF-8 validation needed) */
} props_out;

/* Record the value of a property whose name is one of the three derived columns: the name is
 * compared by length, then as one word. */
static inline void note_named(props_out *po, const uint8_t *name, uint32_t kl, int64_t vo,
                              int64_t vl) {
    if (kl == 4) {
        uint32_t w = ld32(name);
        if (w == ld32("TAGS")) po->tags = (span){vo, vl};
        else if (w == ld32("KEYS")) po->keys = (span){vo, vl};
    } else if (kl == 8 && ld64(name) == ld64("UNIQ_KEY")) {
        po->uniq = (span){vo, vl};
    }
}

/* Splitting a properties string (§4.1): FOR_EACH_SEPARATOR runs its body for every 0x01 and
 * 0x02 byte, in order (pos = its index, is_two = whether it is 0x02); an entry is a segment
 * between 0x02s whose first 0x01 leaves a non-empty name and a non-empty value. SSE2: 16 bytes
 * per step, the separators as bit masks; the high bits of the same loads tell whether the string
 * is ASCII. Loads may run past n up to `limit` (the end of the file), never further. */
#if RMQ_SSE2
/* one 16-byte block v_ at offset i_, bytes beyond `valid_` ignored */
#define SEPARATORS_IN_BLOCK_(v_, i_, valid_, high_, pos, is_two, ...)                          \
    do {                                                                                        \
        unsigned m2_ = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v_, _mm_set1_epi8(2))) & (valid_); \
        unsigned m_ = ((unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v_, _mm_set1_epi8(1))) &    \
                       (valid_)) | m2_;                                                         \
        high_ |= (unsigned)_mm_movemask_epi8(v_) & (valid_);                                    \
        while (m_) {                                                                            \
            unsigned bit_ = (unsigned)__builtin_ctz(m_);                                        \
            int64_t pos = (i_) + bit_;                                                          \
            int is_two = (m2_ >> bit_) & 1;                                                     \
            __VA_ARGS__;                                                                        \
            m_ &= m_ - 1;                                                                       \
        }                                                                                       \
    } while (0)
#define FOR_EACH_SEPARATOR(s, n, limit, pos, is_two, ascii_out, ...)                             \
    do {                                                                                        \
        unsigned high_ = 0;                                                                     \
        int64_t i_ = 0;                                                                         \
        for (; i_ + 16 <= (n); i_ += 16) {                                                      \
            __m128i v_ = _mm_loadu_si128((const __m128i *)((s) + i_));                          \
            SEPARATORS_IN_BLOCK_(v_, i_, 0xFFFFu, high_, pos, is_two, __VA_ARGS__);             \
        }                                                                                       \
        if (i_ < (n)) {                                                                         \
            __m128i v_;                                                                         \
            if ((limit) - ((s) + i_) >= 16) {                                                   \
                v_ = _mm_loadu_si128((const __m128i *)((s) + i_));                              \
            } else { /* the string ends near the end of the file: no over-read */               \
                uint8_t tmp_[16] = {0};                                                         \
                memcpy(tmp_, (s) + i_, (size_t)((n) - i_));                                     \
                v_ = _mm_loadu_si128((const __m128i *)tmp_);                                    \
            }                                                                                   \
            unsigned valid_ = (1u << ((n) - i_)) - 1;                                           \
            SEPARATORS_IN_BLOCK_(v_, i_, valid_, high_, pos, is_two, __VA_ARGS__);              \
        }                                                                                       \
        (ascii_out) = high_ == 0;                                                               \
    } while (0)
#else
#define FOR_EACH_SEPARATOR(s, n, limit, pos, is_two, ascii_out, ...)                             \
    do {                                                                                        \
        unsigned high_ = 0;                                                                     \
        (void)(limit);                                                                          \
        for (int64_t pos = 0; pos < (n); pos++) {                                               \
            uint8_t c_ = (s)[pos];                                                              \
            high_ |= c_;                                                                        \
            if (c_ == 0x01 || c_ == 0x02) {                                                     \
                int is_two = c_ == 0x02;                                                        \
                __VA_ARGS__;                                                                    \
            }                                                                                   \
        }                                                                                       \
        (ascii_out) = (high_ & 0x80) == 0;                                                      \
    } while (0)
#endif

/* Parser state while splitting one properties string into sc->props (the general path). */
typedef struct pstate {
    scanner *sc;
    const uint8_t *s;
    prop *pr;
    int64_t cnt, max_entries;
    uint64_t seen;        /* 64-bit filter on (first byte, length) of the names so far */
    int hashed;
    uint32_t hmask;
} pstate;

/* Add the entry name [ko, ko+kl) = value [vo, vo+vl): a new name is appended, a repeated one
 * gets the later value (first position kept). Returns -1 on allocation failure. */
static int add_prop(pstate *st, uint32_t ko, uint32_t kl, uint32_t vo, uint32_t vl) {
    const uint8_t *s = st->s;
    prop *pr = st->pr;
    int64_t found = -1;
    uint64_t bit = 1ull << ((s[ko] * 31u + kl) & 63u);
    int maybe_dup = (st->seen & bit) != 0;
    st->seen |= bit;
    if (maybe_dup && !st->hashed) {
        for (int64_t i = 0; i < st->cnt; i++)
            if (pr[i].kl == kl && s[pr[i].ko] == s[ko] && memcmp(s + pr[i].ko, s + ko, kl) == 0) {
                found = i;
                break;
            }
    }
    if (!st->hashed && found < 0 && st->cnt >= 16) {
        /* many entries: switch to a hash table sized for the worst case */
        scanner *sc = st->sc;
        int64_t hc = 64;
        while (hc < 2 * st->max_entries) hc *= 2;
        if (hc > sc->hash_cap) {
            uint32_t *nh = realloc(sc->hash, (size_t)hc * sizeof *nh);
            if (!nh) return -1;
            sc->hash = nh;
            sc->hash_cap = hc;
        }
        memset(sc->hash, 0xFF, (size_t)hc * sizeof *sc->hash);
        st->hmask = (uint32_t)(hc - 1);
        for (int64_t i = 0; i < st->cnt; i++) {
            uint32_t h = fnv1a(s + pr[i].ko, pr[i].kl) & st->hmask;
            while (sc->hash[h] != UINT32_MAX) h = (h + 1) & st->hmask;
            sc->hash[h] = (uint32_t)i;
        }
        st->hashed = 1;
    }
    if (st->hashed) {
        uint32_t *hash = st->sc->hash;
        uint32_t h = fnv1a(s + ko, kl) & st->hmask;
        while (hash[h] != UINT32_MAX) {
            const prop *q = &pr[hash[h]];
            if (q->kl == kl && memcmp(s + q->ko, s + ko, kl) == 0) {
                found = hash[h];
                break;
            }
            h = (h + 1) & st->hmask;
        }
        if (found < 0) hash[h] = (uint32_t)st->cnt;
    }
    if (found >= 0) {
        pr[found].vo = vo;
        pr[found].vl = vl;
    } else {
        pr[st->cnt++] = (prop){ko, kl, vo, vl};
    }
    return 0;
}

/* The general path: parse properties s[0..n) into sc->props (duplicates resolved) and fill po.
 * Returns the entry count, -1 on allocation failure. */
static int64_t parse_props(scanner *sc, const uint8_t *s, int32_t n, const uint8_t *limit,
                           props_out *po) {
    int64_t max_entries = n / 3 + 1;
    if (max_entries > sc->props_cap) {
        int64_t cap = max_entries > 64 ? max_entries : 64;
        prop *np = realloc(sc->props, (size_t)cap * sizeof *np);
        if (!np) return -1;
        sc->props = np;
        sc->props_cap = cap;
    }
    pstate st = {sc, s, sc->props, 0, max_entries, 0, 0, 0};
    int64_t seg = 0, one = -1;
    int fail = 0;
    FOR_EACH_SEPARATOR(s, n, limit, pos, is_two, po->ascii, {
        if (is_two) {
            if (one > seg && one + 1 < pos && !fail)
                fail = add_prop(&st, (uint32_t)seg, (uint32_t)(one - seg), (uint32_t)(one + 1),
                                (uint32_t)(pos - one - 1));
            seg = pos + 1;
            one = -1;
        } else if (one < 0) {
            one = pos;
        }
    });
    if (!fail && one > seg && one + 1 < n)
        fail = add_prop(&st, (uint32_t)seg, (uint32_t)(one - seg), (uint32_t)(one + 1),
                        (uint32_t)(n - one - 1));
    if (fail) return -1;
    po->tags = po->keys = po->uniq = (span){0, -1};
    for (int64_t i = 0; i < st.cnt; i++)
        note_named(po, s + st.pr[i].ko, st.pr[i].kl, st.pr[i].vo, st.pr[i].vl);
    return st.cnt;
}

static inline int code_match(const rmq_scan_args *a, int32_t code) {
    if (a->ncodes <= 8) {
        for (int32_t i = 0; i < a->ncodes; i++)
            if (a->codes[i] == code) return 1;
        return 0;
    }
    int32_t lo = 0, hi = a->ncodes;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (a->codes[mid] < code)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < a->ncodes && a->codes[lo] == code;
}

/* Tag codes as they sit in the unit (big-endian low 32 bits of tagsCode), for a compare
 * without byte swapping; up to 4 codes, more go through code_match. */
static void fast_codes_init(fast_codes *fc, const rmq_scan_args *a) {
    fc->n = -1;
    if (!a->filter || a->ncodes > 4) return;
    fc->n = a->ncodes;
    for (int i = 0; i < a->ncodes; i++) fc->raw[i] = __builtin_bswap32((uint32_t)a->codes[i]);
}

/* 1 when the scan must stop at unit u: not written (phy < 0 or size <= 0), size 0x7FFFFFFF (a
 * pre-blank unit is checked whatever its tag code) or its tag code is one of the nc raw codes.
 * Branch-free, so that blocks of units are tested with one branch. */
static inline __attribute__((always_inline)) int unit_stops(const uint8_t *u, const uint32_t *raw,
                                                            int nc) {
    uint32_t code = ld32(u + 16);
    int hit = 0;
    for (int k = 0; k < nc; k++) hit |= code == raw[k];
    /* size - 1 >= 0x7FFFFFFE unsigned: size <= 0 or size == 0x7FFFFFFF */
    return hit | (u[0] >> 7) | (be32(u + 8) - 1u >= (uint32_t)PREBLANK_SIZE - 1u);
}

/* The unit's tag code is subscribed (filtered scans). */
static inline int unit_code_hit(const rmq_scan_args *a, const fast_codes *fc, const uint8_t *u) {
    if (fc->n < 0) return code_match(a, s32(be32(u + 16)));
    uint32_t code = ld32(u + 16);
    for (int k = 0; k < fc->n; k++)
        if (code == fc->raw[k]) return 1;
    return 0;
}

static inline __attribute__((always_inline)) int64_t skip_n(const uint8_t *up, int64_t count,
                                                            const uint32_t *raw, int nc) {
    int64_t i = 0;
    for (; i + 8 <= count; i += 8) {
        const uint8_t *u = up + i * CQ_UNIT;
        int stop = 0;
        for (int k = 0; k < 8; k++) stop |= unit_stops(u + k * CQ_UNIT, raw, nc);
        if (stop) break;
    }
    for (; i < count; i++)
        if (unit_stops(up + i * CQ_UNIT, raw, nc)) break;
    return i;
}

/* Number of leading units of `up[0 .. count)` that are written (phy >= 0, size > 0), not of the
 * pre-blank size and whose tag code is not subscribed: they are examined and rejected without
 * touching the CommitLog. */
static int64_t skip_rejected(const uint8_t *up, int64_t count, const rmq_scan_args *a,
                             const fast_codes *fc) {
    switch (fc->n) {
    case 0: return skip_n(up, count, fc->raw, 0);
    case 1: return skip_n(up, count, fc->raw, 1);
    case 2: return skip_n(up, count, fc->raw, 2);
    case 3: return skip_n(up, count, fc->raw, 3);
    case 4: return skip_n(up, count, fc->raw, 4);
    default: break;
    }
    int64_t i = 0;
    for (; i < count; i++, up += CQ_UNIT)
        if ((up[0] & 0x80) || rd_i32(up + 8) <= 0 || rd_i32(up + 8) == PREBLANK_SIZE ||
            code_match(a, s32(be32(up + 16))))
            break;
    return i;
}

#define PREFETCH_HEAD 2048 /* bytes of a record prefetched from its start */

/* CommitLog file holding phy, with a one-entry cache (a queue's records are in few files). */
static inline const rmq_segment *cl_seg(scanner *sc, const rmq_files *cl, int64_t phy) {
    if (likely((uint64_t)(phy - sc->cl_lo) < (uint64_t)sc->cl_span)) return sc->clseg;
    const rmq_segment *s = files_seg(cl, phy, NULL);
    if (s) {
        sc->clseg = s;
        sc->cl_lo = s->file_start;
        sc->cl_span = cl->file_size;
    }
    return s;
}

/* The bytes a unit's size may reserve ahead of the decode: its size when the record it points
 * to is mapped, lies inside its file and starts with that TOTALSIZE and a message MAGIC; else 0
 * (the decode then reports what is wrong with it). A ConsumeQueue unit is only a claim: a damaged
 * size must not make the scan allocate up to max_bytes before any record is checked, so buffers
 * are sized from what the CommitLog holds. `*segp` caches the CommitLog file of the last call
 * (NULL at first): consecutive units mostly point into the same file. */
static inline int64_t unit_bytes_checked(const rmq_files *cl, int64_t phy, int32_t size,
                                         const rmq_segment **segp) {
    const rmq_segment *s = *segp;
    if (!s || (uint64_t)(phy - s->file_start) >= (uint64_t)cl->file_size) {
        s = files_seg(cl, phy, NULL);
        if (!s) return 0;
        *segp = s;
    }
    int64_t pos = phy - s->file_start;
    if (size < 8 || size > s->size - pos) return 0;
    const uint8_t *p = s->base + pos;
    /* branch-free: the loads may all be in flight at once */
    uint32_t magic = be32(p + 4);
    int ok = (rd_i32(p) == size) & ((magic == MAGIC_V1) | (magic == MAGIC_V2));
    return ok ? size : 0;
}

/* Ask for the cache lines of the record a unit points to: its header (fields read one after
 * the other), its properties at the tail, and the body in between. Never faults: addresses
 * outside the file are not prefetched. */
static inline void prefetch_unit_record(scanner *sc, const rmq_files *cl, const uint8_t *u) {
    int64_t phy = rd_i64(u);
    int32_t size = rd_i32(u + 8);
    const rmq_segment *seg = cl_seg(sc, cl, phy);
    if (!seg) return;
    int64_t pos = phy - seg->file_start;
    if (size <= 0 || pos < 0 || size > seg->size - pos) return;
    const uint8_t *p = seg->base + pos;
    if (cl->dledger && pos >= DLEDGER_HEADER) /* the entry header take_unit checks */
        __builtin_prefetch(p - DLEDGER_HEADER, 0, 3);
    int64_t head = size < PREFETCH_HEAD ? size : PREFETCH_HEAD;
    int64_t off = 0;
    for (; off + 256 <= head; off += 256) {
        __builtin_prefetch(p + off, 0, 3);
        __builtin_prefetch(p + off + 64, 0, 3);
        __builtin_prefetch(p + off + 128, 0, 3);
        __builtin_prefetch(p + off + 192, 0, 3);
    }
    for (; off < head; off += 64) __builtin_prefetch(p + off, 0, 3);
    if (size > head) { /* a long body: the properties at the tail */
        __builtin_prefetch(p + size - 129, 0, 3);
        __builtin_prefetch(p + size - 65, 0, 3);
    }
    __builtin_prefetch(p + size - 1, 0, 3);
}


enum { ROW_ACCEPTED = 0, ROW_REJECTED = 1, ROW_FULL = 2 };

/* Buffers of short strings. A row appends at most 2 * PROPERTIESLENGTH + SMALL_SLACK bytes to
 * each (msgId <= 56, hosts copied in 32/64-byte blocks, values and names <= PROPERTIESLENGTH,
 * item offsets <= 4 * (PROPERTIESLENGTH / 3 + 1)); sc->small_budget tracks the least spare
 * room among them, so one compare per row replaces a check per buffer. */
#define SMALL_SLACK 128
static const uint8_t SMALL_BUFS[] = {
    RMQ_B_MSGID_DATA, RMQ_B_UNIQ_DATA, RMQ_B_TAGS_DATA, RMQ_B_KEYITEM_OFF, RMQ_B_KEYITEM_DATA,
    RMQ_B_PKEY_OFF, RMQ_B_PKEY_DATA, RMQ_B_PVAL_OFF, RMQ_B_PVAL_DATA, RMQ_B_BORNHOST_DATA,
    RMQ_B_STOREHOST_DATA};
#define N_SMALL_BUFS ((int)(sizeof SMALL_BUFS / sizeof SMALL_BUFS[0]))

/* Grow every short-string buffer to `need` spare bytes (at least) and recompute the budget. */
static int small_reserve(scanner *sc, int64_t need) {
    int64_t budget = INT64_MAX;
    for (int k = 0; k < N_SMALL_BUFS; k++) {
        rmq_buf *x = &sc->b->bufs[SMALL_BUFS[k]];
        if (buf_reserve(x, need)) return RMQ_E_NOMEM;
        if (x->cap - x->len < budget) budget = x->cap - x->len;
    }
    sc->small_budget = budget;
    return RMQ_OK;
}

/* After the first row: reserve every variable-size buffer for the expected row count (first row's
 * usage x row capacity, +25%), so a batch is not regrown (and copied) a dozen times. */
static int presize_from_first_row(scanner *sc) {
    rmq_batch *b = sc->b;
    for (int i = 0; i < RMQ_NBUF; i++) {
        if (row_width(i) != 0 || i == RMQ_B_BODY_DATA) continue; /* body: sized from the CQ */
        rmq_buf *buf = &b->bufs[i];
        int64_t want = (buf->len + 8) * (sc->rowcap + sc->rowcap / 4) + SMALL_SLACK;
        /* no column can hold more than max_bytes + the row that crossed it */
        if (want > sc->a->max_bytes + buf->len + SMALL_SLACK)
            want = sc->a->max_bytes + buf->len + SMALL_SLACK;
        if (want > buf->cap && buf_grow(buf, want)) return RMQ_E_NOMEM;
    }
    return small_reserve(sc, 0);
}

/* Body bytes. A contiguous Arrow buffer needs the copy. A big batch (RMQ_STREAM_MIN bytes and
 * more, far beyond the caches) gets its bodies with non-temporal stores: they skip the read of
 * every destination line that a normal store does first (a third of the memory traffic of a
 * copy), and do not push the records still to be read out of the cache. Small batches keep
 * normal stores, so a reader right after the scan finds them cached. */
#define RMQ_STREAM_MIN ((int64_t)8 << 20)

/* Fewer than 64 bytes, as overlapping moves (no call). */
static inline void copy_lt64(uint8_t *d, const uint8_t *s, int64_t n) {
    if (n >= 32) {
        uint64_t a[4], b[4];
        memcpy(a, s, 32);
        memcpy(b, s + n - 32, 32);
        memcpy(d, a, 32);
        memcpy(d + n - 32, b, 32);
    } else if (n >= 16) {
        uint64_t a[2], b[2];
        memcpy(a, s, 16);
        memcpy(b, s + n - 16, 16);
        memcpy(d, a, 16);
        memcpy(d + n - 16, b, 16);
    } else {
        copy_short(d, s, n);
    }
}

#if RMQ_SSE2
/* Whole 64-byte destination lines [d, d + n), n a multiple of 64, d 64-byte aligned. */
static void copy_stream_sse2(uint8_t *d, const uint8_t *s, int64_t n) {
    for (; n > 0; n -= 64, s += 64, d += 64) {
        __m128i a0 = _mm_loadu_si128((const __m128i *)s);
        __m128i a1 = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i a2 = _mm_loadu_si128((const __m128i *)(s + 32));
        __m128i a3 = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a0);
        _mm_stream_si128((__m128i *)(d + 16), a1);
        _mm_stream_si128((__m128i *)(d + 32), a2);
        _mm_stream_si128((__m128i *)(d + 48), a3);
    }
}
#if defined(__x86_64__) && defined(__GNUC__)
#define RMQ_AVX2_STREAM 1
#include <immintrin.h>
/* The same with 32-byte moves, for CPUs with AVX2 (checked at run time; the rest of the
 * library is compiled for the baseline x86-64). */
__attribute__((target("avx2"))) static void copy_stream_avx2(uint8_t *d, const uint8_t *s,
                                                              int64_t n) {
    for (; n > 0; n -= 64, s += 64, d += 64) {
        __m256i a0 = _mm256_loadu_si256((const __m256i *)s);
        __m256i a1 = _mm256_loadu_si256((const __m256i *)(s + 32));
        _mm256_stream_si256((__m256i *)d, a0);
        _mm256_stream_si256((__m256i *)(d + 32), a1);
    }
}
static int have_avx2(void) {
    static int cached = -1;
    int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx2") ? 1 : 0;
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v;
}
#else
#define RMQ_AVX2_STREAM 0
#endif
#endif

/* The copy_body mode for big batches. */
static int stream_mode(void) {
#if RMQ_SSE2 && RMQ_AVX2_STREAM
    return have_avx2() ? 2 : 1;
#elif RMQ_SSE2
    return 1;
#else
    return 0;
#endif
}

/* Whole 64-byte lines [d, d + n) (d 64-byte aligned, n a multiple of 64) with streaming stores. */
static inline void stream_lines(int mode, uint8_t *d, const uint8_t *s, int64_t n) {
#if RMQ_SSE2
#if RMQ_AVX2_STREAM
    if (mode == 2) {
        copy_stream_avx2(d, s, n);
        return;
    }
#endif
    copy_stream_sse2(d, s, n);
#else
    (void)mode;
    memcpy(d, s, (size_t)n);
#endif
}

/* Append n body bytes. Streaming (sc->stream): the column goes out as whole lines with
 * streaming stores; its last, partial line waits in sc->body_line until the next body completes
 * it (so no line is read from memory just to be written) and is written when the scan ends
 * (body_flush). */
static inline void put_body(scanner *sc, rmq_buf *d, const uint8_t *s, int64_t n) {
    int64_t len = d->len;
    d->len = len + n;
    if (!sc->stream) {
        memcpy(d->data + len, s, (size_t)n);
        return;
    }
    int64_t p = len & 63;
    uint8_t *line = d->data + (len - p);
    if (p + n < 64) {
        copy_lt64(sc->body_line + p, s, n);
        return;
    }
    if (p) { /* complete the waiting line */
        copy_lt64(sc->body_line + p, s, 64 - p);
        stream_lines(sc->stream, line, sc->body_line, 64);
        s += 64 - p;
        n -= 64 - p;
        line += 64;
    }
    int64_t whole = n & ~(int64_t)63;
    stream_lines(sc->stream, line, s, whole);
    copy_lt64(sc->body_line, s + whole, n - whole);
}

/* Switch the body column to streaming stores: its partial last line moves to sc->body_line. */
static void body_stream_start(scanner *sc, int mode) {
    rmq_buf *d = &sc->b->bufs[RMQ_B_BODY_DATA];
    int64_t p = d->len & 63;
    memcpy(sc->body_line, d->data + (d->len - p), (size_t)p);
    sc->stream = mode;
}

/* The waiting partial line of a streamed body column. */
static void body_flush(scanner *sc) {
    rmq_buf *d = &sc->b->bufs[RMQ_B_BODY_DATA];
    int64_t p = d->len & 63;
    if (sc->stream && p) memcpy(d->data + (d->len - p), sc->body_line, (size_t)p);
}

/* Whether `name` (kl bytes) is one of the map keys [first, items) appended for this row. */
static int name_appended(const uint8_t *kdata, const uint8_t *koffs, int64_t first, int64_t items,
                         const uint8_t *name, uint32_t kl) {
    for (int64_t i = first; i < items; i++) {
        int32_t a, b;
        memcpy(&a, koffs + 4 * i, 4);
        memcpy(&b, koffs + 4 * (i + 1), 4);
        if ((uint32_t)(b - a) == kl && memcmp(kdata + a, name, kl) == 0) return 1;
    }
    return 0;
}

static inline void put_i32(uint8_t *p, int64_t v) {
    int32_t x = (int32_t)v;
    memcpy(p, &x, 4);
}

/* Cursors of the map column's buffers while a row's entries are appended. */
typedef struct map_cur {
    uint8_t *kdata, *vdata, *koffs, *voffs;
    int64_t klen, vlen, items;
} map_cur;

/* A short string when 32 bytes past its end may be read and written: one or two 16-byte moves. */
static inline void copy_over(uint8_t *d, const uint8_t *s, int64_t n) {
    memcpy(d, s, 16);
    if (unlikely(n > 16)) {
        if (n <= 32) memcpy(d + 16, s + 16, 16);
        else memcpy(d, s, (size_t)n);
    }
}


/* Remember the layout of a row that has the shape t (its values at vals). */
static void layout_save(props_tpl *t, const uint8_t *s, int64_t n, const span *vals) {
    t->len = 0;
    if (n > TPL_LAYOUT_MAX || n <= 0) return;
    memset(t->bytes, 0, sizeof t->bytes);
    memcpy(t->bytes, s, (size_t)n);
    uint8_t keep[TPL_LAYOUT_MAX];
    memset(keep, 0, sizeof keep);
    memset(keep, 1, (size_t)n);
    for (int j = 0; j < t->n; j++) {
        memset(keep + vals[j].o, 0, (size_t)vals[j].l);
        t->vo[j] = vals[j].o;
        t->vl[j] = vals[j].l;
    }
    for (int c = 0; c < TPL_LAYOUT_MAX / 16; c++) {
        unsigned m = 0;
        for (int k = 0; k < 16; k++) m |= (unsigned)keep[16 * c + k] << k;
        t->fixed[c] = (uint16_t)m;
    }
    t->len = n;
}

/* The map column of one row, the fast way: split the properties and append each entry as it is
 * found (no entry list, no second pass). The caller guarantees 32 readable bytes after s + n and
 * SMALL_SLACK spare bytes in the buffers. A repeated name needs the general path: then nothing is
 * committed to *mc and 0 is returned; 1: done, po filled, and the row's shape is saved in *tpl
 * when it qualifies. Kept out of line: a function of its own gets the registers to itself. */
static __attribute__((noinline)) int props_fast(const uint8_t *s, int64_t n,
                                                const uint8_t *limit, map_cur *mc,
                                                props_out *po, props_tpl *tpl) {
    uint8_t *const kdata = mc->kdata, *const vdata = mc->vdata;
    uint8_t *const koffs = mc->koffs, *const voffs = mc->voffs;
    const int64_t first = mc->items;
    int64_t items = first, klen = mc->klen, vlen = mc->vlen, segments = 0;
    uint64_t seen = 0;    /* 64-bit filter on (first byte, length) of the names so far */
    int64_t seg = 0, one = -1;
    props_out out = {{0, -1}, {0, -1}, {0, -1}, 1};
#define ENTRY_(END)                                                                             \
    do {                                                                                        \
        int64_t end_ = (END);                                                                   \
        segments++;                                                                             \
        if (one > seg && one + 1 < end_) {                                                      \
            uint32_t kl_ = (uint32_t)(one - seg);                                               \
            int64_t vl_ = end_ - one - 1;                                                       \
            uint64_t bit_ = 1ull << ((s[seg] + (kl_ << 2)) & 63u);                              \
            if (unlikely(seen & bit_) &&                                                        \
                name_appended(kdata, koffs, first, items, s + seg, kl_))                        \
                return 0;                                                                       \
            seen |= bit_;                                                                       \
            copy_over(kdata + klen, s + seg, kl_);                                              \
            klen += kl_;                                                                        \
            put_i32(koffs + 4 * (items + 1), klen);                                             \
            copy_over(vdata + vlen, s + one + 1, vl_);                                          \
            vlen += vl_;                                                                        \
            put_i32(voffs + 4 * (items + 1), vlen);                                             \
            items++;                                                                            \
            note_named(&out, s + seg, kl_, one + 1, vl_);                                       \
        }                                                                                       \
    } while (0)
    FOR_EACH_SEPARATOR(s, n, limit, pos, is_two, out.ascii, {
        if (is_two) {
            ENTRY_(pos);
            seg = pos + 1;
            one = -1;
        } else if (one < 0) {
            one = pos;
        }
    });
    ENTRY_(n);
#undef ENTRY_
    /* save the shape: every segment an entry (the empty one after a final 0x02 aside) */
    int trailing = n > 0 && s[n - 1] == 0x02;
    int64_t entries = items - first;
    tpl->n = 0;
    tpl->len = 0;
    if (n <= TPL_LAYOUT_MAX && out.ascii && entries > 0 && entries <= TPL_MAX &&
        entries == segments - trailing) {
        int ok = 1;
        for (int64_t j = 0; j < entries && ok; j++) {
            int32_t a, b;
            memcpy(&a, koffs + 4 * (first + j), 4);
            memcpy(&b, koffs + 4 * (first + j + 1), 4);
            int kl = b - a;
            if (kl > 15) {
                ok = 0;
                break;
            }
            memset(tpl->name[j], 0, 16);
            memcpy(tpl->name[j], kdata + a, (size_t)kl);
            tpl->name[j][kl] = 0x01;
            tpl->kl[j] = (uint8_t)kl;
            tpl->mask[j] = (uint16_t)((1u << (kl + 1)) - 1);
        }
        if (ok) {
            tpl->trailing = trailing;
            tpl->tags = tpl->keys = tpl->uniq = -1;
            for (int j = 0; j < (int)entries; j++) {
                props_out named = {{0, -1}, {0, -1}, {0, -1}, 1};
                note_named(&named, tpl->name[j], tpl->kl[j], 0, 0);
                if (named.tags.l == 0) tpl->tags = j;
                if (named.keys.l == 0) tpl->keys = j;
                if (named.uniq.l == 0) tpl->uniq = j;
            }
            tpl->n = (int)entries;
            span vals[TPL_MAX];
            for (int64_t j = 0; j < entries; j++) {
                int32_t a, b;
                memcpy(&a, voffs + 4 * (first + j), 4);
                memcpy(&b, voffs + 4 * (first + j + 1), 4);
                vals[j] = (span){0, b - a};
            }
            /* value offsets in s: after each name and its 0x01, entries one 0x02 apart */
            int64_t pos = 0;
            for (int64_t j = 0; j < entries; j++) {
                vals[j].o = pos + tpl->kl[j] + 1;
                pos = vals[j].o + vals[j].l + 1;
            }
            layout_save(tpl, s, n, vals);
        }
    }
    mc->klen = klen;
    mc->vlen = vlen;
    mc->items = items;
    *po = out;
    return 1;
}

#if RMQ_SSE2
/* The map column of one row by its shape (see props_tpl): 1 when the row has the shape (entries
 * appended, po filled), 0 when it has not (nothing committed). Same guarantees as props_fast;
 * properties longer than 128 bytes take props_fast. */
static __attribute__((noinline)) int props_by_shape(props_tpl *t, const uint8_t *s,
                                                    int64_t n, map_cur *mc, props_out *po) {
    if (n > TPL_LAYOUT_MAX) return 0;
    const __m128i two_ = _mm_set1_epi8(2);
    if (n == t->len) { /* the same layout as the last row? */
        unsigned high = 0, bad = 0;
        for (int64_t i = 0; i < n; i += 16) {
            __m128i v = _mm_loadu_si128((const __m128i *)(s + i));
            unsigned valid = n - i >= 16 ? 0xFFFFu : (1u << (n - i)) - 1;
            unsigned f = t->fixed[i >> 4];
            unsigned eq = (unsigned)_mm_movemask_epi8(
                _mm_cmpeq_epi8(v, _mm_load_si128((const __m128i *)(t->bytes + i))));
            unsigned two = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, two_));
            bad |= ((eq & f) ^ f) | (two & valid & ~f);
            high |= (unsigned)_mm_movemask_epi8(v) & valid;
        }
        if (!bad) {
            uint8_t *const kdata = mc->kdata, *const vdata = mc->vdata;
            uint8_t *const koffs = mc->koffs, *const voffs = mc->voffs;
            int64_t items = mc->items, klen = mc->klen, vlen = mc->vlen;
            for (int j = 0; j < t->n; j++, items++) {
                memcpy(kdata + klen, t->name[j], 16);
                klen += t->kl[j];
                put_i32(koffs + 4 * (items + 1), klen);
                copy_over(vdata + vlen, s + t->vo[j], t->vl[j]);
                vlen += t->vl[j];
                put_i32(voffs + 4 * (items + 1), vlen);
            }
            props_out out = {{0, -1}, {0, -1}, {0, -1}, high == 0};
            if (t->tags >= 0) out.tags = (span){t->vo[t->tags], t->vl[t->tags]};
            if (t->keys >= 0) out.keys = (span){t->vo[t->keys], t->vl[t->keys]};
            if (t->uniq >= 0) out.uniq = (span){t->vo[t->uniq], t->vl[t->uniq]};
            mc->klen = klen;
            mc->vlen = vlen;
            mc->items = items;
            *po = out;
            return 1;
        }
    }
    /* the 0x02 bytes of s as a 128-bit string, and whether s is ASCII */
    const __m128i two = _mm_set1_epi8(2);
    uint64_t m2[2] = {0, 0};
    unsigned high = 0;
    for (int64_t i = 0; i < n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(s + i));
        unsigned valid = n - i >= 16 ? 0xFFFFu : (1u << (n - i)) - 1;
        m2[i >> 6] |= (uint64_t)((unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, two)) & valid)
                      << (i & 63);
        high |= (unsigned)_mm_movemask_epi8(v) & valid;
    }
    uint8_t *const kdata = mc->kdata, *const vdata = mc->vdata;
    uint8_t *const koffs = mc->koffs, *const voffs = mc->voffs;
    int64_t items = mc->items, klen = mc->klen, vlen = mc->vlen;
    span vals[TPL_MAX] = {{0, 0}};
    int64_t pos = 0;
    const int last = t->n - 1;
    for (int j = 0; j <= last; j++) {
        int kl = t->kl[j];
        int64_t vs = pos + kl + 1;
        if (vs >= n) return 0;                 /* no room for a non-empty value */
        __m128i name = _mm_load_si128((const __m128i *)t->name[j]);
        unsigned eq = (unsigned)_mm_movemask_epi8(
            _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(s + pos)), name));
        if ((eq & t->mask[j]) != t->mask[j]) return 0;
        /* the value ends at the next 0x02 (or at n) */
        uint64_t w = m2[vs >> 6] >> (vs & 63);
        int64_t ve;
        if (w) ve = vs + __builtin_ctzll(w);
        else if (vs < 64 && m2[1]) ve = 64 + __builtin_ctzll(m2[1]);
        else ve = n;
        if (ve == vs) return 0;                /* empty value: not an entry */
        if (j < last ? ve >= n : ve != n - t->trailing) return 0;
        vals[j] = (span){vs, ve - vs};
        pos = ve + 1;
    }
    /* the row has the shape: append its entries */
    layout_save(t, s, n, vals);
    for (int j = 0; j <= last; j++) {
        memcpy(kdata + klen, t->name[j], 16);
        klen += t->kl[j];
        put_i32(koffs + 4 * (items + 1), klen);
        copy_over(vdata + vlen, s + vals[j].o, vals[j].l);
        vlen += vals[j].l;
        put_i32(voffs + 4 * (items + 1), vlen);
        items++;
    }
    props_out out = {{0, -1}, {0, -1}, {0, -1}, high == 0};
    if (t->tags >= 0) out.tags = vals[t->tags];
    if (t->keys >= 0) out.keys = vals[t->keys];
    if (t->uniq >= 0) out.uniq = vals[t->uniq];
    mc->klen = klen;
    mc->vlen = vlen;
    mc->items = items;
    *po = out;
    return 1;
}
#endif

/* The map column from the general parse (duplicates resolved). Returns -1 on allocation
 * failure, else 0. */
static int props_general(scanner *sc, const uint8_t *s, int32_t n, const uint8_t *limit,
                         int over, props_out *po) {
    int64_t np = parse_props(sc, s, n, limit, po);
    if (np < 0) return -1;
    rmq_buf *B = sc->b->bufs;
    rmq_buf *ko = &B[RMQ_B_PKEY_OFF], *kd = &B[RMQ_B_PKEY_DATA];
    rmq_buf *vo = &B[RMQ_B_PVAL_OFF], *vd = &B[RMQ_B_PVAL_DATA];
    int64_t items = sc->b->prop_items;
    for (int64_t i = 0; i < np; i++, items++) {
        const prop *e = &sc->props[i];
        append_str(ko, kd, items, s + e->ko, e->kl, over);
        append_str(vo, vd, items, s + e->vo, e->vl, over);
    }
    sc->b->prop_items = items;
    return 0;
}

/* Whether the TAGS value equals one of the subscribed tags (exact bytes). */
static int tags_subscribed(const rmq_scan_args *a, const uint8_t *ps, span tags) {
    if (tags.l < 0) return 0;
    for (int32_t i = 0; i < a->ntags; i++)
        if (a->tag_lens[i] == tags.l && memcmp(a->tags[i], ps + tags.o, (size_t)tags.l) == 0)
            return 1;
    return 0;
}

#define UTF8_ERR_PROPS(bad)                                                                   \
    (100 + set_err(err, RMQ_E_BAD_UTF8, clseg->path, clpos, r->phy, qoff,                     \
                   "properties are not valid UTF-8 (byte %lld of the properties)",           \
                   (long long)(bad)))
#define CRC_CHECK()                                                                           \
    do {                                                                                      \
        if (unlikely(a->verify_crc)) {                                                        \
            int32_t c_ = body_crc(r->body, r->body_len);                                      \
            if (c_ != r->body_crc)                                                            \
                return 100 + set_err(err, RMQ_E_CRC_MISMATCH, clseg->path, clpos, r->phy, qoff, \
                                     "BODYCRC %d differs from crc32(body) & 0x7FFFFFFF = %d",  \
                                     r->body_crc, c_);                                        \
        }                                                                                     \
    } while (0)
#define NOMEM_ERR() (100 + set_err(err, RMQ_E_NOMEM, NULL, -1, -1, -1, "out of memory"))

/* Nothing of the properties is handed out or checked (rmq_scan_args.skip): they are not parsed,
 * nor checked as UTF-8. */
static inline int props_unused(const rmq_scan_args *a) {
    const uint32_t every = RMQ_SKIP_PROPS | RMQ_SKIP_KEYS | RMQ_SKIP_UNIQ | RMQ_SKIP_TAGS;
    return (a->skip & every) == every && !a->check_tags;
}

/* A row that would cross max_bytes: decided exactly as if it were decoded (a properties UTF-8
 * error, a TAGS mismatch and a CRC error come first), without emitting it. */
static int row_over_budget(scanner *sc, const rec *r, int64_t qoff, const rmq_segment *clseg,
                           int64_t clpos, rmq_error *err) {
    const rmq_scan_args *a = sc->a;
    if (props_unused(a)) {
        CRC_CHECK();
        return ROW_FULL;
    }
    props_out po;
    const uint8_t *ps = r->props;
    if (parse_props(sc, ps, r->prop_len, clseg->base + clseg->size, &po) < 0) return NOMEM_ERR();
    if (!po.ascii) {
        int64_t bad = utf8_invalid_at(ps, r->prop_len);
        if (bad >= 0) return UTF8_ERR_PROPS(bad);
    }
    if (a->check_tags && !tags_subscribed(a, ps, po.tags)) return ROW_REJECTED;
    CRC_CHECK();
    return ROW_FULL;
}


/* The byte streams rows append to (strings, map entries), asked for writing a few lines ahead,
 * every other row (a row appends well under 128 bytes to each): a store to a line that is not
 * in the cache holds back the stores behind it. */
#define OUT_PREFETCH 256
static inline void prefetch_string_outputs(rmq_buf *B) {
    static const uint8_t ids[] = {RMQ_B_MSGID_DATA, RMQ_B_PKEY_DATA, RMQ_B_PVAL_DATA,
                                  RMQ_B_UNIQ_DATA, RMQ_B_TAGS_DATA, RMQ_B_BORNHOST_DATA,
                                  RMQ_B_STOREHOST_DATA, RMQ_B_PKEY_OFF, RMQ_B_PVAL_OFF,
                                  RMQ_B_KEYITEM_DATA, RMQ_B_KEYITEM_OFF};
    for (unsigned k = 0; k < sizeof ids; k++) {
        const rmq_buf *x = &B[ids[k]];
        if (x->len + OUT_PREFETCH < x->cap) __builtin_prefetch(x->data + x->len + OUT_PREFETCH, 1, 3);
    }
}

/* The staged row-indexed columns: values by row, offsets (of the per-row strings) by row + 1. */
static const uint8_t STAGED_VALUES[] = {
    RMQ_B_QUEUE_ID, RMQ_B_QUEUE_OFFSET, RMQ_B_COMMITLOG_OFFSET, RMQ_B_STORE_SIZE, RMQ_B_BORN_TS,
    RMQ_B_STORE_TS, RMQ_B_SYSFLAG, RMQ_B_FLAG, RMQ_B_RECONSUME, RMQ_B_BODYCRC, RMQ_B_PREPARED};
static const uint8_t STAGED_OFFSETS[] = {
    RMQ_B_MSGID_OFF, RMQ_B_UNIQ_OFF, RMQ_B_TAGS_OFF, RMQ_B_KEYS_OFF, RMQ_B_BODY_OFF,
    RMQ_B_PROPS_OFF, RMQ_B_BORNHOST_OFF, RMQ_B_STOREHOST_OFF};

static const uint8_t STAGED_VALUE_WIDTH[] = {4, 8, 8, 4, 8, 8, 4, 4, 4, 4, 8};

/* Entries [first, first + count) of the staged columns ids (widths w) to the batch (first a
 * multiple of 16). The row-indexed columns are some twenty narrow streams written side by side;
 * written one value at a time, each new cache line of each of them is first read from memory
 * (write-allocate), and stores leave the core in order, so one such miss holds back every store
 * behind it. A full block is one or two whole lines: streamed (no read) when the batch streams
 * its bodies, else copied. */
#if RMQ_SSE2 && RMQ_AVX2_STREAM
__attribute__((target("avx2"))) static void stage_stream_avx2(scanner *sc, const uint8_t *ids,
                                                               const uint8_t *w, int n,
                                                               int64_t first) {
    for (int k = 0; k < n; k++) {
        uint8_t *d = sc->b->bufs[ids[k]].data + first * w[k];
        const uint8_t *s = sc->stage[ids[k]];
        _mm256_stream_si256((__m256i *)d, _mm256_load_si256((const __m256i *)s));
        _mm256_stream_si256((__m256i *)(d + 32), _mm256_load_si256((const __m256i *)(s + 32)));
        if (w[k] == 8) {
            _mm256_stream_si256((__m256i *)(d + 64), _mm256_load_si256((const __m256i *)(s + 64)));
            _mm256_stream_si256((__m256i *)(d + 96), _mm256_load_si256((const __m256i *)(s + 96)));
        }
    }
}
#endif

static void stage_out(scanner *sc, const uint8_t *ids, const uint8_t *w, int n, int64_t first,
                      int64_t count) {
#if RMQ_SSE2
    if (count == 16 && sc->stream) {
#if RMQ_AVX2_STREAM
        if (sc->stream == 2) {
            stage_stream_avx2(sc, ids, w, n, first);
            return;
        }
#endif
        for (int k = 0; k < n; k++)
            copy_stream_sse2(sc->b->bufs[ids[k]].data + first * w[k], sc->stage[ids[k]],
                             16 * w[k]);
        return;
    }
#endif
    for (int k = 0; k < n; k++)
        memcpy(sc->b->bufs[ids[k]].data + first * w[k], sc->stage[ids[k]],
               (size_t)(count * w[k]));
}

static const uint8_t FOURS[] = {4, 4, 4, 4, 4, 4, 4, 4};

static void stage_out_values(scanner *sc, int64_t first, int64_t count) {
    stage_out(sc, STAGED_VALUES, STAGED_VALUE_WIDTH, (int)sizeof STAGED_VALUES, first, count);
    /* validity: the block's 16 bits are two whole bytes of each bitmap */
    static const uint8_t valid_ids[3] = {RMQ_B_UNIQ_VALID, RMQ_B_TAGS_VALID, RMQ_B_KEYS_VALID};
    for (int k = 0; k < 3; k++) {
        uint8_t *d = sc->b->bufs[valid_ids[k]].data + first / 8;
        d[0] = (uint8_t)sc->vbits[k];
        if (count > 8) d[1] = (uint8_t)(sc->vbits[k] >> 8);
        sc->vbits[k] = 0;
    }
}

static void stage_out_offsets(scanner *sc, int64_t first, int64_t count) {
    stage_out(sc, STAGED_OFFSETS, FOURS, (int)sizeof STAGED_OFFSETS, first, count);
}

/* Decode record r (already structurally validated) into the batch. Returns ROW_* or an error
 * code (>= RMQ_E_ARG, offset by 100 to keep the spaces apart). An error discards the batch, so
 * what was appended before it does not matter. */
static int emit_row(scanner *sc, const rec *r, int64_t qoff, const rmq_segment *clseg,
                    int64_t clpos, rmq_error *err) {
    const rmq_scan_args *a = sc->a;
    rmq_batch *b = sc->b;
    rmq_buf *B = b->bufs;
    const uint8_t *ps = r->props;
    const uint8_t *limit = clseg->base + clseg->size; /* readable bytes end here */
    if (unlikely(!ascii_span(r->topic, r->topic_len, limit))) {
        int64_t bad = utf8_invalid_at(r->topic, r->topic_len);
        if (bad >= 0)
            return 100 + set_err(err, RMQ_E_BAD_UTF8, clseg->path, clpos, r->phy, qoff,
                                 "topic is not valid UTF-8 (byte %lld of the topic)",
                                 (long long)bad);
    }
    /* max_bytes accounting: body + properties + fixed-size strings of this row */
    int64_t row_bytes = (int64_t)r->body_len + r->prop_len + (2 * r->sh + 16) + 2 * 52;
    if (unlikely(b->rows > 0 && b->data_bytes + row_bytes > a->max_bytes))
        return row_over_budget(sc, r, qoff, clseg, clpos, err);

    int64_t row = b->rows;
    if (unlikely(row + 1 >= sc->rowcap)) {
        if (batch_row_capacity(b, 2 * sc->rowcap + 8)) return NOMEM_ERR();
        sc->rowcap = 2 * sc->rowcap + 8;
    }
    int64_t need = 2 * (int64_t)r->prop_len + SMALL_SLACK;
    if (unlikely(buf_reserve(&B[RMQ_B_BODY_DATA], r->body_len) ||
                 (need > sc->small_budget && small_reserve(sc, need))))
        return NOMEM_ERR();
    sc->small_budget -= need;
    /* 32 readable bytes after the properties: short strings move in fixed 16-byte blocks */
    int over = limit - (ps + r->prop_len) >= 32;
    if (row & 1) prefetch_string_outputs(B);

    const uint32_t skip = a->skip;
    props_out po;
    if (unlikely(props_unused(a))) {
        po.tags = po.keys = po.uniq = (span){0, -1};
        CRC_CHECK();
    } else {
        /* the map first: the tag check below may still take the row back */
        int64_t items0 = b->prop_items;
        int64_t kd0 = B[RMQ_B_PKEY_DATA].len, vd0 = B[RMQ_B_PVAL_DATA].len;
        map_cur mc = {B[RMQ_B_PKEY_DATA].data, B[RMQ_B_PVAL_DATA].data, B[RMQ_B_PKEY_OFF].data,
                      B[RMQ_B_PVAL_OFF].data, kd0, vd0, items0};
        int done = 0;
        if (likely(over)) {
#if RMQ_SSE2
            if (sc->tpl.n) done = props_by_shape(&sc->tpl, ps, r->prop_len, &mc, &po);
#endif
            if (!done) done = props_fast(ps, r->prop_len, limit, &mc, &po, &sc->tpl);
        }
        if (likely(done)) {
            B[RMQ_B_PKEY_DATA].len = mc.klen;
            B[RMQ_B_PVAL_DATA].len = mc.vlen;
            b->prop_items = mc.items;
        } else if (props_general(sc, ps, r->prop_len, limit, over, &po)) {
            return NOMEM_ERR();
        }
        if (unlikely(!po.ascii)) {
            int64_t bad = utf8_invalid_at(ps, r->prop_len);
            if (bad >= 0) return UTF8_ERR_PROPS(bad);
        }
        if (a->check_tags && !tags_subscribed(a, ps, po.tags)) {
            b->prop_items = items0;
            B[RMQ_B_PKEY_DATA].len = kd0;
            B[RMQ_B_PVAL_DATA].len = vd0;
            return ROW_REJECTED;
        }
        CRC_CHECK();
        if (skip & RMQ_SKIP_PROPS) {     /* parsed for the spans and checks above; not handed out */
            b->prop_items = items0;
            B[RMQ_B_PKEY_DATA].len = kd0;
            B[RMQ_B_PVAL_DATA].len = vd0;
        }
        if (skip & RMQ_SKIP_KEYS) po.keys.l = -1;
        if (skip & RMQ_SKIP_UNIQ) po.uniq.l = -1;
        if (skip & RMQ_SKIP_TAGS) po.tags.l = -1;
    }
    B[RMQ_B_PKEY_OFF].len = B[RMQ_B_PVAL_OFF].len = (b->prop_items + 1) * 4;
    /* row-indexed columns go to the stage: entry (row & 15) of the value columns, entry
     * ((row + 1) & 15) of the offset columns */
    const int64_t sv = (row & 15), so = ((row + 1) & 15);
    int32_t i32;
    int64_t i64;
#define OFF(id, v) (i32 = (int32_t)(v), memcpy(sc->stage[id] + so * 4, &i32, 4))
#define PUT32(id, v) (i32 = (v), memcpy(sc->stage[id] + sv * 4, &i32, 4))
#define PUT64(id, v) (i64 = (v), memcpy(sc->stage[id] + sv * 8, &i64, 8))
    OFF(RMQ_B_PROPS_OFF, b->prop_items);
    PUT32(RMQ_B_QUEUE_ID, r->queue_id);
    PUT64(RMQ_B_QUEUE_OFFSET, qoff);
    PUT64(RMQ_B_COMMITLOG_OFFSET, r->phy);
    PUT32(RMQ_B_STORE_SIZE, r->total);
    PUT64(RMQ_B_BORN_TS, s64((uint64_t)r->born_ts * 1000u));
    PUT64(RMQ_B_STORE_TS, s64((uint64_t)r->store_ts * 1000u));
    PUT32(RMQ_B_SYSFLAG, r->sysflag);
    PUT32(RMQ_B_FLAG, r->flag);
    PUT32(RMQ_B_RECONSUME, r->reconsume);
    PUT32(RMQ_B_BODYCRC, r->body_crc);
    PUT64(RMQ_B_PREPARED, r->prepared);
#undef PUT32
#undef PUT64

    if (likely(!(skip & RMQ_SKIP_HOSTS))) {
        put_host(&sc->born, sc->stage[RMQ_B_BORNHOST_OFF], &B[RMQ_B_BORNHOST_DATA], row,
                 r->born_host, r->bh);
        put_host(&sc->store, sc->stage[RMQ_B_STOREHOST_OFF], &B[RMQ_B_STOREHOST_DATA], row,
                 r->store_host, r->sh);
    } else {
        OFF(RMQ_B_BORNHOST_OFF, B[RMQ_B_BORNHOST_DATA].len);
        OFF(RMQ_B_STOREHOST_OFF, B[RMQ_B_STOREHOST_DATA].len);
        if (!(skip & RMQ_SKIP_MSGID) && unlikely(!host_same(&sc->store, r->store_host, r->sh)))
            host_fill(&sc->store, r->store_host, r->sh);
    }
    /* msgId: hex(store host field) + hex(physical offset), uppercase (§5.1); the host part comes
     * from the cache just refreshed above */
    if (unlikely(skip & RMQ_SKIP_MSGID)) {
        OFF(RMQ_B_MSGID_OFF, B[RMQ_B_MSGID_DATA].len);
    } else {
        rmq_buf *d = &B[RMQ_B_MSGID_DATA];
        char *o = (char *)d->data + d->len;
        if (likely(r->sh == 8))
            memcpy(o, sc->store.hex, 16);
        else
            memcpy(o, sc->store.hex, 40);
        hex16(o + 2 * r->sh, be64(r->p + 28));
        d->len += 2 * r->sh + 16;
        OFF(RMQ_B_MSGID_OFF, d->len);
    }
    {
        rmq_buf *d = &B[RMQ_B_BODY_DATA];
        put_body(sc, d, r->body, r->body_len);
        OFF(RMQ_B_BODY_OFF, d->len);
    }
    if (po.uniq.l >= 0) {
        rmq_buf *d = &B[RMQ_B_UNIQ_DATA];
        copy_small(d->data + d->len, ps + po.uniq.o, po.uniq.l, over);
        d->len += po.uniq.l;
        sc->vbits[0] |= 1u << sv;
    } else {
        b->null_uniq++;
    }
    OFF(RMQ_B_UNIQ_OFF, B[RMQ_B_UNIQ_DATA].len);
    if (po.tags.l >= 0) {
        rmq_buf *d = &B[RMQ_B_TAGS_DATA];
        copy_small(d->data + d->len, ps + po.tags.o, po.tags.l, over);
        d->len += po.tags.l;
        sc->vbits[1] |= 1u << sv;
    } else {
        b->null_tags++;
    }
    OFF(RMQ_B_TAGS_OFF, B[RMQ_B_TAGS_DATA].len);
    {
        /* keys: KEYS split on ' ', empty words dropped */
        int64_t items = b->key_items, first = items;
        rmq_buf *io = &B[RMQ_B_KEYITEM_OFF], *id = &B[RMQ_B_KEYITEM_DATA];
        if (po.keys.l >= 0) {
            const uint8_t *k = ps + po.keys.o, *kend = k + po.keys.l, *w = NULL;
#if RMQ_SSE2
            if (over && po.keys.l <= 16) { /* 32 readable bytes after it: one 16-byte test */
                unsigned sp = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(
                                  _mm_loadu_si128((const __m128i *)k), _mm_set1_epi8(' '))) &
                              ((1u << po.keys.l) - 1);
                if (sp == 0) { /* one word, the usual case */
                    append_str(io, id, items++, k, po.keys.l, over);
                    k = kend;
                }
            }
#endif
            for (; k < kend; k++) {
                if (*k == ' ') {
                    if (w) append_str(io, id, items++, w, k - w, over);
                    w = NULL;
                } else if (!w) {
                    w = k;
                }
            }
            if (w) append_str(io, id, items++, w, kend - w, over);
        }
        if (items > first) sc->vbits[2] |= 1u << sv;
        else b->null_keys++;
        b->key_items = items;
        io->len = (items + 1) * 4;
        OFF(RMQ_B_KEYS_OFF, items);
    }
#undef OFF
    if (sv == 15) stage_out_values(sc, row - 15, 16);
    if (so == 15) stage_out_offsets(sc, row + 1 - 15, 16);
    b->rows = row + 1;
    b->data_bytes += row_bytes;
    if (unlikely(row == 0) && presize_from_first_row(sc)) return NOMEM_ERR();
    return ROW_ACCEPTED;
}

#undef UTF8_ERR_PROPS
#undef CRC_CHECK
#undef NOMEM_ERR

