/* native/core/netpull.c - part of the C core's one translation unit (see rmq_core.c).
 * A puller: the PULL_MESSAGE requests of one queue range sent ahead on one TCP connection and
 * their answers read back and joined, with no Python per answer (rmq_puller_*).
 *
 * FRAMES READ AND WRITTEN HERE (RocketMQ remoting; all integers big-endian):
 *     int32 total     bytes after this field (4 + header + body); 4 <= total <= RMQ_NET_MAX_FRAME
 *     int32 mark      serializeType << 24 | headerLength (type 0 JSON, type 1 ROCKETMQ binary)
 *     header          JSON: an object {"code":n,"opaque":n,"flag":n,"extFields":{"k":"v",...},
 *                     ...} (other members skipped); binary: int16 code, int8 language,
 *                     int16 version, int32 opaque, int32 flag, int32 remarkLength, remark,
 *                     int32 extLength, then extLength bytes of (int16 keyLength, key,
 *                     int32 valueLength, value)
 *     body            the rest; a SUCCESS (code 0) pull answer's is CommitLog records end to end
 *   flag bit 0 set: an answer (to the request with the same opaque), else a request of the
 *   server; bit 1: oneway. A pull answer's extFields hold nextBeginOffset, minOffset, maxOffset
 *   and suggestWhichBrokerId as decimal strings.
 * Requests are JSON frames without a body, built from a template the caller made (the header
 * with three values cut out: opaque, queueOffset, maxMsgNums).
 *
 * Answers may come in any order (the broker pulls on a thread pool): they are matched by opaque;
 * an answer for a request no longer wanted (the range moved on, a short answer) is dropped. Only
 * plain messages (code 0, nextBeginOffset past the offset asked) are joined here; any other answer
 * goes to the caller whole, which then says where to go on (rmq_puller_seek).
 */

#include <poll.h>
#include <sys/socket.h>
#include <time.h>

#define NP_MAX_SLOTS 16
#define RMQ_NET_MAX_FRAME (16 * 1024 * 1024)   /* NettyDecoder's limit on the length field */
#define NP_MIN_IN (256 << 10)

typedef struct np_slot {
    int32_t opaque;
    int32_t nums;
    int64_t asked;
    int64_t deadline_ms;
    uint8_t *frame;        /* its answer, when it came before its turn (malloc) */
    int64_t frame_len;
} np_slot;

struct rmq_puller {
    int fd;
    SSL *ssl;               /* the TLS session on fd (rmq_puller_tls), NULL: plain TCP */
    int dead;               /* a network or protocol error happened: only free is left */
    int need_seek;          /* an answer went to the caller: it says where to go on */
    uint8_t *tmpl;
    int32_t tmpl_len, cut[3];
    int64_t pos, ask, end, expect_suggest;
    int32_t per_pull, in_flight, timeout_ms;
    int32_t per_pull_max, full_run;   /* the range's pull size; rmq_next_pull_size's count */
    int32_t next_opaque;
    np_slot slots[NP_MAX_SLOTS];
    int head, count;
    uint8_t *in;            /* bytes received: in[in_start, in_len) not yet taken */
    int64_t in_start, in_len, in_cap;
    uint8_t *out;           /* bodies joined (DATA) */
    int64_t out_len, out_cap;
    uint8_t *wbuf;          /* requests built, not sent yet: sent together (np_flush) */
    int64_t wbuf_len, wbuf_cap;
    uint8_t *held;          /* a frame for the caller's next call (ANSWER or REQUEST) */
    int64_t held_len, held_cap, held_asked;
    int held_status;        /* -1: nothing held */
};

static int64_t np_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint32_t np_be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static void np_put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}

static int np_reserve(uint8_t **buf, int64_t *cap, int64_t need) {
    if (need <= *cap) return 0;
    int64_t n = *cap ? *cap : 4096;
    while (n < need) n *= 2;
    uint8_t *m = realloc(*buf, (size_t)n);
    if (!m) return -1;
    *buf = m;
    *cap = n;
    return 0;
}

/* ---------------------------------------------------------------------- header parsing */

/* Decimal integer of exactly s[0, n): optional '-', 1..19 digits, no overflow. */
static int np_parse_int(const uint8_t *s, int64_t n, int64_t *out) {
    int neg = 0;
    int64_t i = 0;
    uint64_t v = 0;
    if (n > 0 && s[0] == '-') { neg = 1; i = 1; }
    if (i >= n || n - i > 19) return -1;
    uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (limit - d) / 10) return -1;
        v = v * 10 + d;
    }
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 0;
}

static int np_key_is(const uint8_t *k, int64_t n, const char *name) {
    size_t m = strlen(name);
    return (size_t)n == m && memcmp(k, name, m) == 0;
}

/* A pull answer field of extFields (value s[0, n)): 0 if not one of ours or parsed, -1 bad. */
static int np_ext_field(rmq_net_header *h, const uint8_t *k, int64_t kn, const uint8_t *v, int64_t vn) {
    int64_t *dst = NULL;
    if (np_key_is(k, kn, "nextBeginOffset")) { dst = &h->next_begin_offset; h->has_next_begin = 1; }
    else if (np_key_is(k, kn, "minOffset")) dst = &h->min_offset;
    else if (np_key_is(k, kn, "maxOffset")) dst = &h->max_offset;
    else if (np_key_is(k, kn, "suggestWhichBrokerId")) dst = &h->suggest_broker_id;
    if (!dst) return 0;
    return np_parse_int(v, vn, dst);
}

typedef struct js {
    const uint8_t *p, *e;
    const char *why;
} js;

static int np_atom_char(uint8_t c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' ||
           c == '+' || c == '.';
}

static void js_ws(js *j) {
    while (j->p < j->e && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

/* A string's raw span (escapes left as they are), the quotes passed over. */
static int js_string(js *j, const uint8_t **s, int64_t *n) {
    js_ws(j);
    if (j->p >= j->e || *j->p != '"') { j->why = "expected a string"; return -1; }
    const uint8_t *start = ++j->p;
    while (j->p < j->e && *j->p != '"') {
        if (*j->p == '\\' && ++j->p >= j->e) break;   /* a backslash ending the header */
        j->p++;
    }
    if (j->p >= j->e) { j->why = "unterminated string"; return -1; }
    *s = start;
    *n = j->p - start;
    j->p++;
    return 0;
}

/* A number, true, false or null: its span. */
static int js_atom(js *j, const uint8_t **s, int64_t *n) {
    js_ws(j);
    const uint8_t *start = j->p;
    while (j->p < j->e && np_atom_char(*j->p)) j->p++;
    if (j->p == start) { j->why = "expected a value"; return -1; }
    *s = start;
    *n = j->p - start;
    return 0;
}

static int js_expect(js *j, uint8_t c) {
    js_ws(j);
    if (j->p >= j->e || *j->p != c) {
        j->why = c == ':' ? "expected ':'" : c == '{' ? "expected '{'" : "expected a delimiter";
        return -1;
    }
    j->p++;
    return 0;
}

static int js_skip(js *j, int depth) {
    js_ws(j);
    if (j->p >= j->e) { j->why = "expected a value"; return -1; }
    if (depth > 32) { j->why = "nested too deeply"; return -1; }
    const uint8_t *s;
    int64_t n;
    uint8_t c = *j->p;
    if (c == '"') return js_string(j, &s, &n);
    if (c != '{' && c != '[') return js_atom(j, &s, &n);
    uint8_t close = c == '{' ? '}' : ']';
    j->p++;
    js_ws(j);
    if (j->p < j->e && *j->p == close) { j->p++; return 0; }
    for (;;) {
        if (c == '{' && (js_string(j, &s, &n) || js_expect(j, ':'))) return -1;
        if (js_skip(j, depth + 1)) return -1;
        js_ws(j);
        if (j->p < j->e && *j->p == ',') { j->p++; continue; }
        if (j->p < j->e && *j->p == close) { j->p++; return 0; }
        j->why = "expected ',' or the end of an object or array";
        return -1;
    }
}

/* A value that is a string or an atom (extFields values, code/opaque/flag): its span. */
static int js_scalar(js *j, const uint8_t **s, int64_t *n) {
    js_ws(j);
    if (j->p < j->e && *j->p == '"') return js_string(j, s, n);
    if (j->p < j->e && (*j->p == '{' || *j->p == '[')) { j->why = "expected a scalar"; return -1; }
    return js_atom(j, s, n);
}

static int np_json_header(const uint8_t *h, int64_t n, rmq_net_header *out, const char **why) {
    js j = {h, h + n, NULL};
    int seen = 0;
    const uint8_t *k, *v;
    int64_t kn, vn;
    if (js_expect(&j, '{')) goto bad;
    js_ws(&j);
    if (j.p < j.e && *j.p == '}') { j.why = "no code, opaque or flag"; goto bad; }
    for (;;) {
        if (js_string(&j, &k, &kn) || js_expect(&j, ':')) goto bad;
        int which = np_key_is(k, kn, "code") ? 1 : np_key_is(k, kn, "opaque") ? 2
                  : np_key_is(k, kn, "flag") ? 4 : np_key_is(k, kn, "extFields") ? 8 : 0;
        if (which & 7) {
            int64_t x;
            if (js_scalar(&j, &v, &vn)) goto bad;
            if (np_parse_int(v, vn, &x) || x < INT32_MIN || x > INT32_MAX) {
                j.why = "code, opaque or flag is not a 32-bit integer";
                goto bad;
            }
            if (which == 1) out->code = (int32_t)x;
            else if (which == 2) out->opaque = (int32_t)x;
            else out->flag = (int32_t)x;
            seen |= which;
        } else if (which == 8) {
            js_ws(&j);
            if (j.p + 4 <= j.e && memcmp(j.p, "null", 4) == 0) {
                j.p += 4;
            } else {
                if (js_expect(&j, '{')) goto bad;
                js_ws(&j);
                if (j.p < j.e && *j.p == '}') {
                    j.p++;
                } else {
                    for (;;) {
                        if (js_string(&j, &k, &kn) || js_expect(&j, ':')) goto bad;
                        js_ws(&j);
                        if (j.p < j.e && (*j.p == '{' || *j.p == '[')) {
                            if (js_skip(&j, 1)) goto bad;
                        } else {
                            if (js_scalar(&j, &v, &vn)) goto bad;
                            if (np_ext_field(out, k, kn, v, vn)) {
                                j.why = "a pull answer offset in extFields is not an integer";
                                goto bad;
                            }
                        }
                        js_ws(&j);
                        if (j.p < j.e && *j.p == ',') { j.p++; continue; }
                        if (js_expect(&j, '}')) goto bad;
                        break;
                    }
                }
            }
        } else if (js_skip(&j, 1)) {
            goto bad;
        }
        js_ws(&j);
        if (j.p < j.e && *j.p == ',') { j.p++; continue; }
        if (js_expect(&j, '}')) goto bad;
        break;
    }
    js_ws(&j);
    if (j.p != j.e) { j.why = "bytes after the header object"; goto bad; }
    if (seen != 7) { *why = "the JSON header lacks code, opaque or flag"; return -1; }
    return 0;
bad:
    *why = j.why ? j.why : "bad JSON header";
    out->position = j.p - h;
    return -1;
}

static int np_binary_header(const uint8_t *h, int64_t n, rmq_net_header *out, const char **why) {
    if (n < 13 + 4) { *why = "binary header shorter than its fixed fields"; return -1; }
    out->code = (int16_t)((h[0] << 8) | h[1]);
    out->opaque = (int32_t)np_be32(h + 5);
    out->flag = (int32_t)np_be32(h + 9);
    int64_t p = 13;
    int32_t rlen = (int32_t)np_be32(h + p);
    p += 4;
    if (rlen < 0 || rlen > n - p || n - p - rlen < 4) { *why = "remark length out of bounds"; return -1; }
    p += rlen;
    int32_t elen = (int32_t)np_be32(h + p);
    p += 4;
    if (elen < 0 || elen > n - p) { *why = "extFields length out of bounds"; return -1; }
    int64_t end = p + elen;
    while (p < end) {
        if (end - p < 2) { *why = "extFields key length out of bounds"; return -1; }
        int64_t kl = (int16_t)((h[p] << 8) | h[p + 1]);
        p += 2;
        if (kl < 0 || kl > end - p || end - p - kl < 4) { *why = "extFields key out of bounds"; return -1; }
        const uint8_t *k = h + p;
        p += kl;
        int64_t vl = (int32_t)np_be32(h + p);
        p += 4;
        if (vl < 0 || vl > end - p) { *why = "extFields value out of bounds"; return -1; }
        if (np_ext_field(out, k, kl, h + p, vl)) {
            *why = "a pull answer offset in extFields is not an integer";
            return -1;
        }
        p += vl;
    }
    return 0;
}

int rmq_net_parse_header(const uint8_t *frame, int64_t len, rmq_net_header *out, rmq_error *err) {
    clear_err(err);
    if (!out || len < 0 || (len > 0 && !frame))
        return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "bad header arguments");
    memset(out, 0, sizeof *out);
    out->position = -1;
    if (len < 4)
        return set_err(err, RMQ_E_PROTOCOL, NULL, 0, -1, -1,
                       "frame of %lld bytes has no header-length field", (long long)len);
    uint32_t mark = np_be32(frame);
    int stype = (int)(mark >> 24);
    int64_t hlen = mark & 0xFFFFFF;
    if (hlen > len - 4)
        return set_err(err, RMQ_E_PROTOCOL, NULL, 0, -1, -1,
                       "header length %lld exceeds the frame (%lld bytes)", (long long)hlen,
                       (long long)len);
    out->header_len = hlen;
    out->serialize_type = stype;
    const char *why = NULL;
    int rc = stype == 0 ? np_json_header(frame + 4, hlen, out, &why)
           : stype == 1 ? np_binary_header(frame + 4, hlen, out, &why)
           : (why = "unknown serialize type", -1);
    if (rc) {
        int64_t at = out->position >= 0 ? 4 + out->position : 4;
        return set_err(err, RMQ_E_PROTOCOL, NULL, at, -1, -1,
                       "bad header: %s (byte %lld of the frame, serialize type %d)", why,
                       (long long)at, stype);
    }
    return RMQ_OK;
}

/* ---------------------------------------------------------------------- the puller */

static int np_err(rmq_puller *p, rmq_error *err, int code, int sys, const char *fmt, const char *what) {
    p->dead = 1;
    set_err(err, code, NULL, -1, -1, -1, fmt, what);   /* the caller names the peer */
    if (err) err->sys_errno = sys;
    return code;
}

static void np_drop_slots(rmq_puller *p) {
    for (int i = 0; i < NP_MAX_SLOTS; i++) {
        free(p->slots[i].frame);
        p->slots[i].frame = NULL;
    }
    p->head = p->count = 0;
    p->ask = p->pos;
    p->wbuf_len = 0;        /* (pulls built and not sent belong to the slots dropped) */
}

rmq_puller *rmq_puller_new(int fd, rmq_error *err) {
    clear_err(err);
    if (fd < 0) {
        set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "bad puller arguments");
        return NULL;
    }
    rmq_puller *p = calloc(1, sizeof *p);
    if (!p) {
        set_err(err, RMQ_E_NOMEM, NULL, -1, -1, -1, "out of memory");
        return NULL;
    }
    p->fd = fd;
    p->held_status = -1;
    p->next_opaque = 1;
    p->need_seek = 1;   /* no range yet */
    return p;
}

void rmq_puller_free(rmq_puller *p) {
    if (!p) return;
    SSL_free(p->ssl);
    np_drop_slots(p);
    free(p->tmpl);
    free(p->in);
    free(p->out);
    free(p->wbuf);
    free(p->held);
    free(p);
}

int rmq_puller_range(rmq_puller *p, const uint8_t *tmpl, int32_t tmpl_len, const int32_t *cuts,
                     int64_t start, int64_t end, int32_t per_pull, int32_t in_flight,
                     int32_t timeout_ms, int64_t expect_suggest, rmq_error *err) {
    clear_err(err);
    if (!p || !tmpl || !cuts || tmpl_len < 1 || tmpl_len > (1 << 20) || cuts[0] < 0 ||
        cuts[0] > cuts[1] || cuts[1] > cuts[2] || cuts[2] > tmpl_len || start < 0 || end < start ||
        per_pull < 1 || in_flight < 1 || in_flight > NP_MAX_SLOTS || timeout_ms < 1)
        return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "bad pull range arguments");
    if (p->dead) return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "the puller failed before");
    uint8_t *t = malloc((size_t)tmpl_len);
    if (!t) return set_err(err, RMQ_E_NOMEM, NULL, -1, -1, -1, "out of memory");
    memcpy(t, tmpl, (size_t)tmpl_len);
    free(p->tmpl);
    p->tmpl = t;
    p->tmpl_len = tmpl_len;
    memcpy(p->cut, cuts, sizeof p->cut);
    p->pos = start;
    p->end = end;
    p->per_pull = p->per_pull_max = per_pull;
    p->full_run = 0;
    p->in_flight = in_flight;
    p->timeout_ms = timeout_ms;
    p->expect_suggest = expect_suggest;
    if (p->held_status == RMQ_PULL_ANSWER) p->held_status = -1;   /* belongs to the range left */
    p->need_seek = 0;
    np_drop_slots(p);      /* answers to earlier requests are dropped when they come */
    return RMQ_OK;
}

int rmq_puller_tls(rmq_puller *p, rmq_tls_ctx *ctx, const char *host, int32_t timeout_ms, rmq_error *err) {
    clear_err(err);
    if (!p || !ctx || p->ssl || timeout_ms < 1)
        return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "bad TLS arguments");
    p->ssl = tls_connect(ctx, p->fd, host, np_now_ms() + timeout_ms, err);
    if (!p->ssl) {
        p->dead = 1;
        return err ? err->code : RMQ_E_NET;
    }
    return RMQ_OK;
}

int rmq_puller_seek(rmq_puller *p, int64_t offset, rmq_error *err) {
    clear_err(err);
    if (!p || offset < 0 || !p->tmpl)
        return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "bad seek arguments");
    if (p->dead) return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "the puller failed before");
    p->pos = offset;
    p->need_seek = 0;
    if (p->held_status == RMQ_PULL_ANSWER) p->held_status = -1;   /* it was for the old position */
    np_drop_slots(p);
    return RMQ_OK;
}

static int np_send_all(rmq_puller *p, const uint8_t *buf, int64_t len, int64_t deadline, rmq_error *err) {
    while (len > 0 && p->ssl) {
        int want = 0;
        const char *what = NULL;
        int64_t n = tls_write_some(p->ssl, buf, len, &want, &what);
        if (n > 0) { buf += n; len -= n; continue; }
        if (n < 0) return np_err(p, err, RMQ_E_NET, errno, "%s", what);
        int w = tls_wait(p->fd, want, deadline);
        if (w == RMQ_E_TIMEOUT)
            return np_err(p, err, RMQ_E_TIMEOUT, 0, "%s", "send timed out (peer not reading)");
        if (w < 0) return np_err(p, err, RMQ_E_NET, -w, "poll failed: %s", strerror(-w));
    }
    while (len > 0) {
        ssize_t n = send(p->fd, buf, (size_t)len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) { buf += n; len -= n; continue; }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int64_t left = deadline - np_now_ms();
            if (left <= 0)
                return np_err(p, err, RMQ_E_TIMEOUT, 0, "%s", "send timed out (peer not reading)");
            struct pollfd pf = {p->fd, POLLOUT, 0};
            if (poll(&pf, 1, (int)(left > INT32_MAX ? INT32_MAX : left)) < 0 && errno != EINTR)
                return np_err(p, err, RMQ_E_NET, errno, "poll failed: %s", strerror(errno));
            continue;
        }
        int e = n < 0 ? errno : EPIPE;
        return np_err(p, err, RMQ_E_NET, e, "send failed: %s", strerror(e));
    }
    return RMQ_OK;
}

int rmq_puller_send(rmq_puller *p, const uint8_t *buf, int64_t len, int32_t timeout_ms, rmq_error *err) {
    clear_err(err);
    if (!p || !buf || len < 1 || timeout_ms < 1)
        return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "bad send arguments");
    if (p->dead) return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "the puller failed before");
    return np_send_all(p, buf, len, np_now_ms() + timeout_ms, err);
}

/* Add one PULL_MESSAGE to the requests not sent yet: the template tmpl[0, tmpl_len) with the
 * opaque, the queue offset and the count inserted at cut[0..2]. */
static int np_put_pull(rmq_puller *p, const uint8_t *tmpl, int32_t tmpl_len, const int32_t *cut,
                       int32_t opaque, int64_t offset, int32_t nums, rmq_error *err) {
    char num[3][24];
    int nl[3];
    nl[0] = snprintf(num[0], sizeof num[0], "%d", (int)opaque);
    nl[1] = snprintf(num[1], sizeof num[1], "%lld", (long long)offset);
    nl[2] = snprintf(num[2], sizeof num[2], "%d", (int)nums);
    int64_t hlen = tmpl_len + nl[0] + nl[1] + nl[2];
    if (np_reserve(&p->wbuf, &p->wbuf_cap, p->wbuf_len + 8 + hlen))
        return np_err(p, err, RMQ_E_NOMEM, 0, "%s", "out of memory");
    uint8_t *f = p->wbuf + p->wbuf_len;
    np_put32(f, (uint32_t)(4 + hlen));
    np_put32(f + 4, (uint32_t)hlen);   /* serialize type 0: JSON */
    int64_t w = 8, from = 0;
    for (int i = 0; i < 3; i++) {
        memcpy(f + w, tmpl + from, (size_t)(cut[i] - from));
        w += cut[i] - from;
        memcpy(f + w, num[i], (size_t)nl[i]);
        w += nl[i];
        from = cut[i];
    }
    memcpy(f + w, tmpl + from, (size_t)(tmpl_len - from));
    w += tmpl_len - from;
    p->wbuf_len += w;
    return RMQ_OK;
}

/* Send the requests added since the last flush in one write. Requests are built as slots free
 * up and sent only before the loop waits for input or returns to its caller: the answers one
 * receive brings free several slots, and their pulls then cost one send (on loopback a send
 * costs about what the peer's handling of it does), not one each. */
static int np_flush(rmq_puller *p, rmq_error *err) {
    int64_t len = p->wbuf_len;
    p->wbuf_len = 0;
    return len ? np_send_all(p, p->wbuf, len, np_now_ms() + p->timeout_ms, err) : RMQ_OK;
}

static int32_t np_opaque(rmq_puller *p) {
    int32_t opaque = p->next_opaque;
    p->next_opaque = p->next_opaque >= INT32_MAX - 1 ? 1 : p->next_opaque + 1;
    return opaque;
}

/* Add the pull of nums messages at offset to the requests to send (np_flush) and give it a slot. */
static int np_queue_pull(rmq_puller *p, int64_t offset, int32_t nums, rmq_error *err) {
    int32_t opaque = np_opaque(p);
    int64_t now = np_now_ms();
    int rc = np_put_pull(p, p->tmpl, p->tmpl_len, p->cut, opaque, offset, nums, err);
    if (rc) return rc;
    np_slot *s = &p->slots[(p->head + p->count) % NP_MAX_SLOTS];
    s->opaque = opaque;
    s->nums = nums;
    s->asked = offset;
    s->deadline_ms = now + p->timeout_ms;
    s->frame = NULL;
    s->frame_len = 0;
    p->count++;
    return RMQ_OK;
}

/* The next whole frame in the input (after its length field) or NULL; room made for it. */
static int np_frame(rmq_puller *p, const uint8_t **frame, int64_t *len, rmq_error *err) {
    *frame = NULL;
    int64_t have = p->in_len - p->in_start;
    if (have >= 4) {
        int64_t total = (int32_t)np_be32(p->in + p->in_start);
        if (total < 4 || total > RMQ_NET_MAX_FRAME) {
            char what[96];
            snprintf(what, sizeof what, "frame length %lld is outside [4, %d]", (long long)total,
                     RMQ_NET_MAX_FRAME);
            return np_err(p, err, RMQ_E_PROTOCOL, 0, "%s", what);
        }
        if (have >= 4 + total) {
            *frame = p->in + p->in_start + 4;
            *len = total;
            p->in_start += 4 + total;
            return RMQ_OK;
        }
        if (p->in_start + 4 + total > p->in_cap) {   /* room for the whole frame */
            memmove(p->in, p->in + p->in_start, (size_t)have);
            p->in_len = have;
            p->in_start = 0;
            if (np_reserve(&p->in, &p->in_cap, 4 + total))
                return np_err(p, err, RMQ_E_NOMEM, 0, "%s", "out of memory");
        }
    }
    return RMQ_OK;
}

/* Receive what the socket has, waiting until deadline (ms, monotonic) for something. */
static int np_fill(rmq_puller *p, int64_t deadline, rmq_error *err) {
    if (p->in_start == p->in_len) p->in_start = p->in_len = 0;
    if (p->in_cap - p->in_len < 4096) {
        if (p->in_start > 0) {
            memmove(p->in, p->in + p->in_start, (size_t)(p->in_len - p->in_start));
            p->in_len -= p->in_start;
            p->in_start = 0;
        }
        if (np_reserve(&p->in, &p->in_cap, p->in_len + (p->in_cap ? 4096 : NP_MIN_IN)))
            return np_err(p, err, RMQ_E_NOMEM, 0, "%s", "out of memory");
    }
    for (;;) {
        ssize_t n;
        if (p->ssl) {
            int want = 0;
            const char *what = NULL;
            n = tls_read_some(p->ssl, p->in + p->in_len, p->in_cap - p->in_len, &want, &what);
            if (n == -1) return np_err(p, err, RMQ_E_NET, 0, "%s", what);
            if (n == 0) {
                int w = tls_wait(p->fd, want, deadline);
                if (w == RMQ_E_TIMEOUT) return RMQ_E_TIMEOUT;   /* the caller names the request */
                if (w < 0) return np_err(p, err, RMQ_E_NET, -w, "poll failed: %s", strerror(-w));
                continue;
            }
            if (n == -2) n = 0;
        } else {
            n = recv(p->fd, p->in + p->in_len, (size_t)(p->in_cap - p->in_len), MSG_DONTWAIT);
        }
        if (n > 0) { p->in_len += n; return RMQ_OK; }
        if (n == 0) {
            char what[160];
            int64_t have = p->in_len - p->in_start;
            if (have == 0) snprintf(what, sizeof what, "connection closed by the peer");
            else if (have < 4)
                snprintf(what, sizeof what, "truncated frame: the peer closed the connection after "
                         "%lld of 4 bytes of the frame length", (long long)have);
            else
                snprintf(what, sizeof what, "truncated frame: the peer closed the connection after "
                         "%lld of %lld bytes of the frame content", (long long)(have - 4),
                         (long long)(int32_t)np_be32(p->in + p->in_start));
            return np_err(p, err, RMQ_E_NET, 0, "%s", what);
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return np_err(p, err, RMQ_E_NET, errno, "receive failed: %s", strerror(errno));
        int64_t left = deadline - np_now_ms();
        if (left <= 0) return RMQ_E_TIMEOUT;    /* the caller names the request */
        struct pollfd pf = {p->fd, POLLIN, 0};
        if (poll(&pf, 1, (int)(left > INT32_MAX ? INT32_MAX : left)) < 0 && errno != EINTR)
            return np_err(p, err, RMQ_E_NET, errno, "poll failed: %s", strerror(errno));
    }
}

/* The next frame received (after its length field) with its header, waiting until deadline (ms,
 * monotonic): RMQ_E_TIMEOUT when none came by then (the puller still usable; the caller names
 * what was awaited), other errors leave the puller failed. */
static int np_await_frame(rmq_puller *p, int64_t deadline, const uint8_t **frame, int64_t *len,
                          rmq_net_header *h, rmq_error *err) {
    for (;;) {
        int rc = np_frame(p, frame, len, err);
        if (rc) return rc;
        if (*frame) break;
        if ((rc = np_flush(p, err))) return rc;       /* (what is built goes before any wait) */
        rc = np_fill(p, deadline, err);
        if (rc) return rc;
    }
    int rc = rmq_net_parse_header(*frame, *len, h, err);
    if (rc) p->dead = 1;
    return rc;
}

static int np_hold(rmq_puller *p, const uint8_t *frame, int64_t len, int status, int64_t asked,
                   rmq_error *err) {
    if (np_reserve(&p->held, &p->held_cap, len > 0 ? len : 1))
        return np_err(p, err, RMQ_E_NOMEM, 0, "%s", "out of memory");
    memcpy(p->held, frame, (size_t)len);
    p->held_len = len;
    p->held_status = status;
    p->held_asked = asked;
    return RMQ_OK;
}

static int np_pop_head(rmq_puller *p) {
    np_slot *s = &p->slots[p->head];
    free(s->frame);
    s->frame = NULL;
    p->head = (p->head + 1) % NP_MAX_SLOTS;
    p->count--;
    return 0;
}

void rmq_next_pull_size(int32_t *state, int64_t covered, int32_t asked, int32_t largest) {
    if (!state) return;
    if (covered < asked) {
        int32_t c = covered < 1 ? 1 : (int32_t)covered;
        if (c < state[0]) state[0] = c;
        state[1] = 0;
    } else if (state[0] < largest && ++state[1] >= RMQ_PULL_GROW_AFTER) {
        state[0] = state[0] > largest / 2 ? largest : 2 * state[0];
        state[1] = 0;
    } else if (state[0] >= largest) {
        state[1] = 0;
    }
}

/* The head slot's answer: joined into out, or held for the caller. 1: stop and return DATA. */
static int np_take_head(rmq_puller *p, const uint8_t *frame, int64_t len, rmq_pull_out *o,
                        int64_t max_rows, int64_t max_bytes, rmq_error *err) {
    rmq_net_header h;
    int rc = rmq_net_parse_header(frame, len, &h, err);
    if (rc) {
        p->dead = 1;
        return -rc;
    }
    np_slot *s = &p->slots[p->head];
    int64_t asked = s->asked;
    int32_t nums = s->nums;
    if (h.code != 0 || !h.has_next_begin || h.next_begin_offset <= asked) {
        if (np_hold(p, frame, len, RMQ_PULL_ANSWER, asked, err)) return -RMQ_E_NOMEM;
        np_pop_head(p);
        np_drop_slots(p);
        p->need_seek = 1;
        return o->answers > 0;
    }
    int64_t blen = len - 4 - h.header_len;
    if (np_reserve(&p->out, &p->out_cap, o->len + blen + 1))
        return -np_err(p, err, RMQ_E_NOMEM, 0, "%s", "out of memory");
    if (o->answers == 0) o->first = asked;
    memcpy(p->out + o->len, frame + 4 + h.header_len, (size_t)blen);
    o->len += blen;
    o->answers++;
    o->rows += h.next_begin_offset - asked;
    o->suggest = h.suggest_broker_id;
    p->pos = o->next = h.next_begin_offset;
    np_pop_head(p);
    int64_t expected = p->count ? p->slots[p->head].asked : p->ask;
    int32_t size[2] = {p->per_pull, p->full_run};
    rmq_next_pull_size(size, p->pos - asked, nums, p->per_pull_max);
    p->per_pull = size[0];
    p->full_run = size[1];
    if (p->pos != expected) np_drop_slots(p);   /* short answer: what was asked beyond is dropped */
    return h.suggest_broker_id != p->expect_suggest || o->rows >= max_rows || o->len >= max_bytes ||
           p->pos >= p->end;
}

static int np_next(rmq_puller *p, int64_t max_rows, int64_t max_bytes, rmq_pull_out *o,
                   rmq_error *err);

int rmq_puller_next(rmq_puller *p, int64_t max_rows, int64_t max_bytes, rmq_pull_out *o,
                    rmq_error *err) {
    int rc = np_next(p, max_rows, max_bytes, o, err);
    /* pulls built on the way out go now, not at the next call: the broker works meanwhile */
    if (rc == RMQ_OK && p && p->wbuf_len) rc = np_flush(p, err);
    return rc;
}

static int np_next(rmq_puller *p, int64_t max_rows, int64_t max_bytes, rmq_pull_out *o,
                   rmq_error *err) {
    clear_err(err);
    if (!p || !o || max_rows < 1 || max_bytes < 1)
        return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "bad pull arguments");
    if (p->dead) return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "the puller failed before");
    memset(o, 0, sizeof *o);
    o->first = o->next = o->asked = -1;
    for (;;) {
        if (p->held_status >= 0 && o->answers == 0) {
            o->status = p->held_status;
            o->asked = p->held_asked;
            o->data = p->held;
            o->len = p->held_len;
            p->held_status = -1;
            return RMQ_OK;
        }
        if (p->need_seek && o->answers == 0)
            return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "seek after an answer, before pulling on");
        if (p->pos >= p->end) np_drop_slots(p);   /* nothing asked reaches past the end */
        if (p->held_status >= 0 || p->need_seek || p->pos >= p->end) {
            o->data = p->out;
            o->status = o->answers > 0 ? RMQ_PULL_DATA : RMQ_PULL_END;
            return RMQ_OK;
        }
        while (p->count < p->in_flight && p->ask < p->end) {
            int64_t n = p->end - p->ask < p->per_pull ? p->end - p->ask : p->per_pull;
            int rc = np_queue_pull(p, p->ask, (int32_t)n, err);
            if (rc) return rc;
            p->ask += n;
        }
        if (p->count == 0)   /* cannot be: pos < end sends at least one pull */
            return np_err(p, err, RMQ_E_ARG, 0, "%s", "internal: no pull in flight");
        np_slot *head = &p->slots[p->head];
        if (head->frame) {
            uint8_t *f = head->frame;
            head->frame = NULL;        /* the pop must not free it while it is read */
            int r = np_take_head(p, f, head->frame_len, o, max_rows, max_bytes, err);
            free(f);
            if (r < 0) return -r;
            if (r) { o->data = p->out; o->status = RMQ_PULL_DATA; return RMQ_OK; }
            continue;
        }
        const uint8_t *frame;
        int64_t len;
        rmq_net_header h;
        int rc = np_await_frame(p, head->deadline_ms, &frame, &len, &h, err);
        if (rc == RMQ_E_TIMEOUT) {
            char what[96];
            snprintf(what, sizeof what, "no answer in %d ms to PULL_MESSAGE at queue offset %lld",
                     (int)p->timeout_ms, (long long)head->asked);
            return np_err(p, err, RMQ_E_TIMEOUT, 0, "%s", what);
        }
        if (rc) return rc;
        if (!(h.flag & 1)) {                       /* a request of the server */
            if (h.flag & 2) continue;              /* oneway: nothing to answer */
            if ((rc = np_hold(p, frame, len, RMQ_PULL_REQUEST, -1, err))) return rc;
            continue;
        }
        int k = 0;
        while (k < p->count && p->slots[(p->head + k) % NP_MAX_SLOTS].opaque != h.opaque) k++;
        if (k == p->count) continue;               /* an answer no longer wanted */
        if (k > 0) {                               /* before its turn: kept for it */
            np_slot *s = &p->slots[(p->head + k) % NP_MAX_SLOTS];
            if (s->frame) continue;
            s->frame = malloc((size_t)(len > 0 ? len : 1));
            if (!s->frame) return np_err(p, err, RMQ_E_NOMEM, 0, "%s", "out of memory");
            memcpy(s->frame, frame, (size_t)len);
            s->frame_len = len;
            continue;
        }
        int r = np_take_head(p, frame, len, o, max_rows, max_bytes, err);
        if (r < 0) return -r;
        if (r) { o->data = p->out; o->status = RMQ_PULL_DATA; return RMQ_OK; }
    }
}

/* ------------------------------------------------------------- first pulls of many ranges */

/* Answer a two-way request of the server "not supported" (a pull connection serves none). */
static int np_refuse(rmq_puller *p, int32_t code, int32_t opaque, int64_t deadline, rmq_error *err) {
    char h[256];
    int n = snprintf(h, sizeof h, "{\"code\":3,\"extFields\":{},\"flag\":1,\"language\":\"PYTHON\","
                     "\"opaque\":%d,\"remark\":\"request code %d not supported by this client\","
                     "\"serializeTypeCurrentRPC\":\"JSON\",\"version\":401}", (int)opaque, (int)code);
    uint8_t f[8 + sizeof h];
    np_put32(f, (uint32_t)(4 + n));
    np_put32(f + 4, (uint32_t)n);
    memcpy(f + 8, h, (size_t)n);
    return np_send_all(p, f, 8 + n, deadline, err);
}

int rmq_puller_firsts(rmq_puller *p, rmq_first_pull *pulls, int32_t n, int32_t in_flight,
                      int32_t timeout_ms, const uint8_t **bodies, rmq_error *err) {
    clear_err(err);
    if (!p || !pulls || !bodies || n < 0 || n > RMQ_FIRSTS_MAX || in_flight < 1 ||
        in_flight > NP_MAX_SLOTS || timeout_ms < 1)
        return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "bad first pulls arguments");
    for (int32_t i = 0; i < n; i++) {
        const rmq_first_pull *q = &pulls[i];
        if (!q->tmpl || q->tmpl_len < 1 || q->tmpl_len > (1 << 20) || q->cuts[0] < 0 ||
            q->cuts[0] > q->cuts[1] || q->cuts[1] > q->cuts[2] || q->cuts[2] > q->tmpl_len ||
            q->offset < 0 || q->nums < 1)
            return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "bad first pull arguments");
    }
    if (p->dead) return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "the puller failed before");
    /* the range pulled before is left: its answers still to come are dropped below */
    np_drop_slots(p);
    if (p->held_status == RMQ_PULL_ANSWER) p->held_status = -1;
    p->need_seek = 1;
    int32_t op[NP_MAX_SLOTS], at[NP_MAX_SLOTS];
    int64_t due[NP_MAX_SLOTS];
    int32_t flying = 0, sent = 0, done = 0;
    int64_t out_len = 0;
    for (int32_t i = 0; i < n; i++) {
        pulls[i].code = -1;
        pulls[i].next_begin = pulls[i].suggest = -1;
        pulls[i].body_at = pulls[i].body_len = 0;
    }
    while (done < n) {
        while (flying < in_flight && sent < n) {
            rmq_first_pull *q = &pulls[sent];
            int32_t opaque = np_opaque(p);
            int rc = np_put_pull(p, q->tmpl, q->tmpl_len, q->cuts, opaque, q->offset, q->nums, err);
            if (rc) return rc;
            op[flying] = opaque;
            at[flying] = sent++;
            due[flying++] = np_now_ms() + timeout_ms;
        }
        int32_t late = 0;           /* the pull answered latest by now */
        for (int32_t k = 1; k < flying; k++)
            if (due[k] < due[late]) late = k;
        const uint8_t *frame;
        int64_t len;
        rmq_net_header h;
        int rc = np_await_frame(p, due[late], &frame, &len, &h, err);
        if (rc == RMQ_E_TIMEOUT) {
            char what[128];
            snprintf(what, sizeof what, "no answer in %d ms to PULL_MESSAGE at queue offset %lld "
                     "(first pull %d of %d)", (int)timeout_ms, (long long)pulls[at[late]].offset,
                     (int)at[late] + 1, (int)n);
            return np_err(p, err, RMQ_E_TIMEOUT, 0, "%s", what);
        }
        if (rc) return rc;
        if (!(h.flag & 1)) {                       /* a request of the server */
            if (!(h.flag & 2) && (rc = np_refuse(p, h.code, h.opaque, np_now_ms() + timeout_ms, err)))
                return rc;
            continue;
        }
        int32_t k = 0;
        while (k < flying && op[k] != h.opaque) k++;
        if (k == flying) continue;                 /* an answer no longer wanted */
        rmq_first_pull *q = &pulls[at[k]];
        q->code = h.code;
        q->next_begin = h.has_next_begin ? h.next_begin_offset : -1;
        q->suggest = h.suggest_broker_id;
        if (h.code == 0 && h.has_next_begin && h.next_begin_offset > q->offset) {
            int64_t blen = len - 4 - h.header_len;
            if (np_reserve(&p->out, &p->out_cap, out_len + blen + 1))
                return np_err(p, err, RMQ_E_NOMEM, 0, "%s", "out of memory");
            memcpy(p->out + out_len, frame + 4 + h.header_len, (size_t)blen);
            q->body_at = out_len;
            q->body_len = blen;
            out_len += blen;
        }
        flying--;
        op[k] = op[flying];
        at[k] = at[flying];
        due[k] = due[flying];
        done++;
    }
    *bodies = p->out;
    return RMQ_OK;
}
