/* native/core/traces.c - part of the C core's one translation unit (see rmq_core.c).
 * Message trace contexts (option enableMsgTrace), in the form of RocketMQ's TraceDataEncoder,
 * written for many messages at once (\1 and \2 are the bytes 1 and 2; t[k] are the caller's
 * texts, the same for every message):
 *
 *   consumed (rmq_trace_sub), per row of a batch read:
 *     t0 id \1 retries \1 keys t1 id t2 keys t3
 *     with t0 = "SubBefore\1<time>\1<region>\1<group>\1<requestId>\1",
 *          t1 = "\2SubAfter\1<requestId>\1", t2 = "\1<costMs>\1true\1", t3 = "\10\1<time>\1<group>\2"
 *   sent (rmq_trace_pub), per message of a SEND_BATCH_MESSAGE body (layout in sinkenc.c):
 *     t0 id \1 tags \1 keys t1 bodyLength t2 type \1 offsetMsgId t3
 *     with t0 = "Pub\1<time>\1<region>\1<group>\1<topic>\1", t1 = "\1<storeHost>\1",
 *          t2 = "\1<costMs>\1", t3 = "\1true\2"; type 3 (Delay_Msg) with a DELAY property, else
 *          0 (Normal_Msg); offsetMsgId the message's piece of the broker's comma-joined answer.
 *
 * A message without keys or tags has "null" there, as Java's encoder writes a null String.
 * keys: the keys the message is found by (its id and its own keys, each followed by a space),
 * the KEYS property of the trace message carrying its context. ends[i] / key_ends[i]: where
 * message i's context / keys end in out / keys_out (they start where message i - 1's end).
 * Output that would pass cap / keys_cap is an RMQ_E_ARG error (nothing is cut short).
 */

typedef struct {
    uint8_t *p, *end;
} trace_out;

static inline int tput(trace_out *o, const void *src, int64_t n) {
    if (n < 0 || o->end - o->p < n) return -1;
    if (n) memcpy(o->p, src, (size_t)n);
    o->p += n;
    return 0;
}

static inline int tbyte(trace_out *o, uint8_t b) { return tput(o, &b, 1); }

/* a field that may be absent: "null" then, as Java's StringBuilder writes a null String (4.9's
 * decoder needs the field there: String.split drops empty fields at the end of a context) */
static inline int tfield(trace_out *o, const void *src, int64_t n) {
    return n ? tput(o, src, n) : tput(o, "null", 4);
}

static int tdecimal(trace_out *o, int64_t v) {
    char buf[24], *q = buf + sizeof buf;
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    do {
        *--q = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) *--q = '-';
    return tput(o, q, buf + sizeof buf - q);
}

static int texts_check(const rmq_trace_texts *t, rmq_error *err) {
    if (!t) return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "no trace texts");
    for (int k = 0; k < 4; k++)
        if (t->len[k] < 0 || (t->len[k] && !t->text[k]))
            return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "bad trace text %d", k);
    return RMQ_OK;
}

static int out_full(rmq_error *err, const char *what, int64_t cap, int64_t i) {
    return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "trace %s of %lld bytes too small at message %lld",
                   what, (long long)cap, (long long)i);
}

/* The keys a message is found by: its id, then its own keys (space-separated), each followed by
 * a space. */
static int put_index_keys(trace_out *k, const void *id, int64_t id_len, const void *keys,
                          int64_t keys_len) {
    return tput(k, id, id_len) || tbyte(k, ' ') ||
           (keys_len && (tput(k, keys, keys_len) || tbyte(k, ' ')));
}

/* the keys of row r of a list column, joined by spaces */
static int put_key_list(trace_out *o, const rmq_trace_sub_rows *rw, int64_t r) {
    if (!rw->key_lists || (rw->key_lists_valid && !rw->key_lists_valid[r])) return 0;
    for (int64_t i = rw->key_lists[r]; i < rw->key_lists[r + 1]; i++) {
        if (col_null(&rw->keys, i)) continue;
        if (i > rw->key_lists[r] && tbyte(o, ' ')) return -1;
        if (tput(o, rw->keys.data + rw->keys.off[i], rw->keys.off[i + 1] - rw->keys.off[i])) return -1;
    }
    return 0;
}

int rmq_trace_sub(const rmq_trace_sub_rows *rw, const rmq_trace_texts *t, uint8_t *out, int64_t cap,
                  int64_t *ends, uint8_t *keys_out, int64_t keys_cap, int64_t *key_ends,
                  rmq_error *err) {
    clear_err(err);
    if (!rw || rw->n < 0 || !ends || !key_ends || cap < 0 || keys_cap < 0 || (cap && !out) ||
        (keys_cap && !keys_out))
        return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "bad trace arguments");
    int rc = texts_check(t, err);
    if (rc || rw->n == 0) return rc;
    rc = col_check(&rw->uniq, "uniqKey", 0, rw->n, err);
    if (!rc) rc = col_check(&rw->msg_id, "msgId", 0, rw->n, err);
    if (!rc && rw->key_lists) rc = lists_check(rw->key_lists, rw->key_items, &rw->keys, NULL, "keys", 0, rw->n, err);
    if (rc) return rc;
    trace_out o = {out, out + cap}, k = {keys_out, keys_out + keys_cap};
    for (int64_t r = 0; r < rw->n; r++) {
        const rmq_sink_col *idc = &rw->uniq;
        if (col_null(idc, r) || idc->off[r + 1] == idc->off[r]) idc = &rw->msg_id;
        const uint8_t *id = col_null(idc, r) ? NULL : idc->data + idc->off[r];
        int64_t id_len = id ? idc->off[r + 1] - idc->off[r] : 0;
        int64_t retries = rw->retries && !(rw->retries_valid && !rw->retries_valid[r]) ? rw->retries[r] : 0;
        uint8_t *keys_at = NULL;
        int64_t keys_len = 0;
        if (tput(&o, t->text[0], t->len[0]) || tput(&o, id, id_len) || tbyte(&o, 1) ||
            tdecimal(&o, retries) || tbyte(&o, 1))
            return out_full(err, "output", cap, r);
        keys_at = o.p;
        if (put_key_list(&o, rw, r)) return out_full(err, "output", cap, r);
        keys_len = o.p - keys_at;
        if ((!keys_len && tfield(&o, NULL, 0)) || tput(&o, t->text[1], t->len[1]) ||
            tput(&o, id, id_len) || tput(&o, t->text[2], t->len[2]) ||
            tfield(&o, keys_len ? keys_at : NULL, keys_len) || tput(&o, t->text[3], t->len[3]))
            return out_full(err, "output", cap, r);
        ends[r] = o.p - out;
        if (put_index_keys(&k, id, id_len, keys_at, keys_len))
            return out_full(err, "keys", keys_cap, r);
        key_ends[r] = k.p - keys_out;
    }
    return RMQ_OK;
}

/* The value of property `name` in props[0, len) (name \1 value \2 ...), or NULL. */
static const uint8_t *prop_value(const uint8_t *props, int64_t len, const char *name, int64_t *vlen) {
    size_t nl = strlen(name);
    const uint8_t *p = props, *end = props + len;
    while (p < end) {
        const uint8_t *sep = memchr(p, 1, (size_t)(end - p));
        if (!sep) return NULL;
        const uint8_t *stop = memchr(sep + 1, 2, (size_t)(end - sep - 1));
        if (!stop) stop = end;
        if ((size_t)(sep - p) == nl && memcmp(p, name, nl) == 0) {
            *vlen = stop - sep - 1;
            return sep + 1;
        }
        p = stop + 1;
    }
    return NULL;
}

int rmq_trace_pub(const uint8_t *batch, int64_t len, int64_t count, const char *offset_ids,
                  int64_t offset_ids_len, const rmq_trace_texts *t, uint8_t *out, int64_t cap,
                  int64_t *ends, uint8_t *keys_out, int64_t keys_cap, int64_t *key_ends,
                  rmq_error *err) {
    clear_err(err);
    if ((len && !batch) || len < 0 || count < 0 || !ends || !key_ends || cap < 0 || keys_cap < 0 ||
        (cap && !out) || (keys_cap && !keys_out) || offset_ids_len < 0 || (offset_ids_len && !offset_ids))
        return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "bad trace arguments");
    int rc = texts_check(t, err);
    if (rc) return rc;
    trace_out o = {out, out + cap}, k = {keys_out, keys_out + keys_cap};
    const uint8_t *p = batch, *end = batch + len;
    const char *ids = offset_ids, *ids_end = offset_ids + offset_ids_len;
    for (int64_t i = 0; i < count; i++) {
        int64_t at = p - batch;
        if (end - p < 22)
            return set_err(err, RMQ_E_ARG, NULL, at, -1, -1, "batch body ends at byte %lld before "
                           "message %lld of %lld", (long long)at, (long long)i, (long long)count);
        int64_t total = (int64_t)be32(p), blen = (int64_t)be32(p + 16);
        if (total < 22 || total > end - p || blen < 0 || blen > total - 22)
            return set_err(err, RMQ_E_ARG, NULL, at, -1, -1, "batch body: message %lld at byte %lld "
                           "has size %lld, body %lld (%lld bytes left)", (long long)i, (long long)at,
                           (long long)total, (long long)blen, (long long)(end - p));
        const uint8_t *props = p + 22 + blen;
        int64_t plen = ((int64_t)props[-2] << 8) | props[-1];
        if (plen != total - 22 - blen)
            return set_err(err, RMQ_E_ARG, NULL, at, -1, -1, "batch body: message %lld at byte %lld "
                           "has %lld property bytes in a size of %lld", (long long)i, (long long)at,
                           (long long)plen, (long long)total);
        int64_t id_len = 0, tags_len = 0, keys_len = 0, delay_len = 0;
        const uint8_t *id = prop_value(props, plen, "UNIQ_KEY", &id_len);
        const uint8_t *tags = prop_value(props, plen, "TAGS", &tags_len);
        const uint8_t *keys = prop_value(props, plen, "KEYS", &keys_len);
        int delayed = prop_value(props, plen, "DELAY", &delay_len) != NULL;
        const char *comma = ids < ids_end ? memchr(ids, ',', (size_t)(ids_end - ids)) : NULL;
        const char *id_stop = comma ? comma : ids_end;
        if (!id) id_len = 0;
        if (!tags) tags_len = 0;
        if (!keys) keys_len = 0;
        if (tput(&o, t->text[0], t->len[0]) || tput(&o, id, id_len) || tbyte(&o, 1) ||
            tfield(&o, tags, tags_len) || tbyte(&o, 1) || tfield(&o, keys, keys_len) ||
            tput(&o, t->text[1], t->len[1]) || tdecimal(&o, blen) || tput(&o, t->text[2], t->len[2]) ||
            tbyte(&o, delayed ? '3' : '0') || tbyte(&o, 1) || tput(&o, ids, id_stop - ids) ||
            tput(&o, t->text[3], t->len[3]))
            return out_full(err, "output", cap, i);
        ends[i] = o.p - out;
        if (put_index_keys(&k, id, id_len, keys, keys_len))
            return out_full(err, "keys", keys_cap, i);
        key_ends[i] = k.p - keys_out;
        ids = comma ? comma + 1 : ids_end;
        p += total;
    }
    if (p != end)
        return set_err(err, RMQ_E_ARG, NULL, p - batch, -1, -1, "batch body has %lld bytes after its "
                       "%lld messages", (long long)(end - p), (long long)count);
    return RMQ_OK;
}
