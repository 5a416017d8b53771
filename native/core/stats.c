/* native/core/stats.c - part of the C core's one translation unit (see rmq_core.c).
 * The offset table of a broker's statistics answer (GET_TOPIC_STATS_INFO, GET_CONSUME_STATS) read
 * into columns, without a Python object per queue.
 *
 * The answer is JSON as fastjson writes it: a top-level object one of whose members (``member``,
 * "offsetTable") is a map keyed by MessageQueue, which fastjson writes with OBJECTS as keys:
 *
 *   {"consumeTps":0.0,"offsetTable":{{"brokerName":"b","queueId":7,"topic":"T"}:
 *       {"brokerOffset":12,"consumerOffset":10,"lastTimestamp":1700000000000},...}}
 *
 * Every key object must have an integer "queueId" (int32) and a "topic" equal to ``topic``; of
 * each value object the members named in ``fields`` are read as integers (int64), the others
 * (and every other top-level member) are skipped whatever JSON they hold. Anything else (another
 * topic, a field that is not an integer, an escape in a compared name, an unexpected token, a
 * nesting deeper than STATS_MAX_DEPTH, the member twice or absent, bytes after the object) is
 * RMQ_E_PROTOCOL with the byte position in *err_pos: the caller then reads the answer with its
 * general parser, which says what is wrong (or reads forms this one does not). Every read is
 * bounds-checked against len.
 */

#define STATS_MAX_DEPTH 64

typedef struct stats_cur {
    const uint8_t *s;
    size_t n, i;
} stats_cur;

static inline void stats_ws(stats_cur *c) {
    while (c->i < c->n && (c->s[c->i] == ' ' || c->s[c->i] == '\t' || c->s[c->i] == '\n' ||
                           c->s[c->i] == '\r'))
        c->i++;
}

static inline int stats_peek(stats_cur *c) {
    stats_ws(c);
    return c->i < c->n ? c->s[c->i] : -1;
}

static inline int stats_take(stats_cur *c, uint8_t ch) {
    if (stats_peek(c) != ch) return 0;
    c->i++;
    return 1;
}

/* The length of the UTF-8 sequence at p (n bytes left), 0 when it is not one. */
static size_t stats_utf8(const uint8_t *p, size_t n) {
    uint32_t cp;
    size_t k;
    if (p[0] >= 0xC2 && p[0] <= 0xDF) {
        k = 2;
        cp = p[0] & 0x1F;
    } else if (p[0] >= 0xE0 && p[0] <= 0xEF) {
        k = 3;
        cp = p[0] & 0x0F;
    } else if (p[0] >= 0xF0 && p[0] <= 0xF4) {
        k = 4;
        cp = p[0] & 0x07;
    } else {
        return 0;
    }
    if (k > n) return 0;
    for (size_t j = 1; j < k; j++) {
        if ((p[j] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[j] & 0x3F);
    }
    if ((k == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (k == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0;
    return k;
}

/* A string at the cursor: [*start, *end) its raw bytes between the quotes, *escaped when it holds
 * a backslash escape (then the raw bytes are not its value). */
static int stats_string(stats_cur *c, size_t *start, size_t *end, int *escaped) {
    if (!stats_take(c, '"')) return 0;
    *start = c->i;
    *escaped = 0;
    while (c->i < c->n) {
        uint8_t ch = c->s[c->i];
        if (ch == '"') {
            *end = c->i++;
            return 1;
        }
        if (ch < 0x20) return 0;
        if (ch >= 0x80) { /* (what a JSON text must be: UTF-8, no overlong form or surrogate) */
            size_t k = stats_utf8(c->s + c->i, c->n - c->i);
            if (!k) return 0;
            c->i += k;
            continue;
        }
        if (ch == '\\') {
            *escaped = 1;
            if (c->i + 1 >= c->n) return 0;
            if (c->s[c->i + 1] == 'u') {
                if (c->i + 6 > c->n) return 0;
                for (size_t k = c->i + 2; k < c->i + 6; k++) {
                    uint8_t h = c->s[k];
                    if (!((h >= '0' && h <= '9') || (h >= 'a' && h <= 'f') || (h >= 'A' && h <= 'F')))
                        return 0;
                }
                c->i += 6;
            } else {
                if (c->s[c->i + 1] == 0 || !strchr("\"\\/bfnrt", c->s[c->i + 1])) return 0;
                c->i += 2;
            }
            continue;
        }
        c->i++;
    }
    return 0;
}

/* An integer at the cursor (JSON number without fraction or exponent) into *out. */
static int stats_int(stats_cur *c, int64_t *out) {
    stats_ws(c);
    size_t i = c->i;
    int neg = 0;
    if (i < c->n && c->s[i] == '-') {
        neg = 1;
        i++;
    }
    size_t first = i;
    uint64_t v = 0;
    while (i < c->n && c->s[i] >= '0' && c->s[i] <= '9') {
        if (i - first >= 19) return 0; /* (more digits than an int64 has) */
        v = v * 10 + (uint64_t)(c->s[i] - '0');
        i++;
    }
    if (i == first || (c->s[first] == '0' && i - first > 1)) return 0;
    if (i < c->n && (c->s[i] == '.' || c->s[i] == 'e' || c->s[i] == 'E')) return 0;
    if (v > (uint64_t)INT64_MAX + (uint64_t)neg) return 0;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    c->i = i;
    return 1;
}

static int stats_skip(stats_cur *c, int depth);

/* The members of an object after its '{' up to its '}' skipped (keys may be objects). */
static int stats_skip_object(stats_cur *c, int depth) {
    if (stats_take(c, '}')) return 1;
    for (;;) {
        if (stats_peek(c) == '{') {
            if (!stats_skip(c, depth + 1)) return 0;
        } else {
            size_t a, b;
            int esc;
            if (!stats_string(c, &a, &b, &esc)) return 0;
        }
        if (!stats_take(c, ':') || !stats_skip(c, depth + 1)) return 0;
        if (stats_take(c, ',')) continue;
        return stats_take(c, '}');
    }
}

/* Any JSON value at the cursor. */
static int stats_skip(stats_cur *c, int depth) {
    if (depth > STATS_MAX_DEPTH) return 0;
    int ch = stats_peek(c);
    if (ch == '{') {
        c->i++;
        return stats_skip_object(c, depth);
    }
    if (ch == '[') {
        c->i++;
        if (stats_take(c, ']')) return 1;
        for (;;) {
            if (!stats_skip(c, depth + 1)) return 0;
            if (stats_take(c, ',')) continue;
            return stats_take(c, ']');
        }
    }
    if (ch == '"') {
        size_t a, b;
        int esc;
        return stats_string(c, &a, &b, &esc);
    }
    static const char *const words[] = {"true", "false", "null"};
    for (int w = 0; w < 3; w++) {
        size_t k = strlen(words[w]);
        if (c->i + k <= c->n && memcmp(c->s + c->i, words[w], k) == 0) {
            c->i += k;
            return 1;
        }
    }
    if (ch == '-' || (ch >= '0' && ch <= '9')) {
        size_t i = c->i;
        if (c->s[i] == '-') i++;
        size_t digits = i;
        while (i < c->n && c->s[i] >= '0' && c->s[i] <= '9') i++;
        if (i == digits || (c->s[digits] == '0' && i - digits > 1)) return 0;
        if (i < c->n && c->s[i] == '.') {
            size_t f = ++i;
            while (i < c->n && c->s[i] >= '0' && c->s[i] <= '9') i++;
            if (i == f) return 0;
        }
        if (i < c->n && (c->s[i] == 'e' || c->s[i] == 'E')) {
            i++;
            if (i < c->n && (c->s[i] == '+' || c->s[i] == '-')) i++;
            size_t e = i;
            while (i < c->n && c->s[i] >= '0' && c->s[i] <= '9') i++;
            if (i == e) return 0;
        }
        c->i = i;
        return 1;
    }
    return 0;
}

static inline int stats_is(stats_cur *c, size_t a, size_t b, const char *text, size_t len) {
    return b - a == len && memcmp(c->s + a, text, len) == 0;
}

/* One entry {key}:{value} of the map at the cursor into row ``row``. */
static int stats_entry(stats_cur *c, const char *topic, size_t topic_len,
                       const char *const *fields, const size_t *field_lens, int nfields,
                       int64_t *queue_id, int64_t *values, uint8_t *present) {
    int have_qid = 0, have_topic = 0;
    if (!stats_take(c, '{')) return 0;
    if (!stats_take(c, '}')) {
        for (;;) {
            size_t a, b;
            int esc;
            if (!stats_string(c, &a, &b, &esc) || esc || !stats_take(c, ':')) return 0;
            if (stats_is(c, a, b, "queueId", 7)) {
                if (have_qid || !stats_int(c, queue_id) || *queue_id < INT32_MIN || *queue_id > INT32_MAX)
                    return 0;
                have_qid = 1;
            } else if (stats_is(c, a, b, "topic", 5)) {
                size_t ta, tb;
                int tesc;
                if (have_topic || !stats_string(c, &ta, &tb, &tesc) || tesc ||
                    !stats_is(c, ta, tb, topic, topic_len))
                    return 0;
                have_topic = 1;
            } else if (!stats_skip(c, 2)) {
                return 0;
            }
            if (stats_take(c, ',')) continue;
            if (!stats_take(c, '}')) return 0;
            break;
        }
    }
    if (!have_qid || !have_topic || !stats_take(c, ':') || !stats_take(c, '{')) return 0;
    memset(present, 0, (size_t)nfields);
    if (stats_take(c, '}')) return 1;
    for (;;) {
        size_t a, b;
        int esc;
        if (!stats_string(c, &a, &b, &esc) || esc || !stats_take(c, ':')) return 0;
        int k = 0;
        while (k < nfields && !stats_is(c, a, b, fields[k], field_lens[k])) k++;
        if (k < nfields) {
            if (present[k] || !stats_int(c, &values[k])) return 0;
            present[k] = 1;
        } else if (!stats_skip(c, 2)) {
            return 0;
        }
        if (stats_take(c, ',')) continue;
        return stats_take(c, '}');
    }
}

int rmq_stats_table(const uint8_t *buf, size_t len, const char *member, size_t member_len,
                    const char *topic, size_t topic_len, const char *const *fields,
                    const size_t *field_lens, int nfields, int64_t *queue_ids, int64_t *values,
                    uint8_t *present, size_t cap, size_t *count, size_t *err_pos) {
    *count = 0;
    *err_pos = 0;
    if (!buf || !member || !topic || nfields < 0 || (nfields && (!fields || !field_lens)) ||
        (cap && (!queue_ids || (nfields && (!values || !present)))))
        return RMQ_E_ARG;
    stats_cur cur = {buf, len, 0}, *c = &cur;
    int found = 0;
    if (!stats_take(c, '{')) goto bad;
    if (!stats_take(c, '}')) {
        for (;;) {
            size_t a, b;
            int esc;
            if (!stats_string(c, &a, &b, &esc) || !stats_take(c, ':')) goto bad;
            if (!esc && stats_is(c, a, b, member, member_len)) {
                if (found || !stats_take(c, '{')) goto bad;
                found = 1;
                if (!stats_take(c, '}')) {
                    for (;;) {
                        size_t row = *count;
                        if (row == cap) return RMQ_E_ARG;
                        if (!stats_entry(c, topic, topic_len, fields, field_lens, nfields,
                                         &queue_ids[row], values + row * (size_t)nfields,
                                         present + row * (size_t)nfields))
                            goto bad;
                        *count = row + 1;
                        if (stats_take(c, ',')) continue;
                        if (!stats_take(c, '}')) goto bad;
                        break;
                    }
                }
            } else if (!stats_skip(c, 1)) {
                goto bad;
            }
            if (stats_take(c, ',')) continue;
            if (!stats_take(c, '}')) goto bad;
            break;
        }
    }
    stats_ws(c);
    if (!found || c->i != c->n) goto bad;
    return RMQ_OK;
bad:
    *err_pos = c->i;
    *count = 0;
    return RMQ_E_PROTOCOL;
}
