/* native/core/pull.c - part of the C core's one translation unit (see rmq_core.c).
 * Records laid end to end, as a PULL_MESSAGE answer carries them (rmq_decode_records).
 */

/* ------------------------------------------------------------------------------------------ */
/* Records laid end to end (a PULL_MESSAGE answer)                                             */

int rmq_decode_records(const uint8_t *buf, int64_t len, const char *label,
                       const rmq_scan_args *a, rmq_batch **out, rmq_error *err) {
    clear_err(err);
    if (out) *out = NULL;
    if (!out || !a || !label || len < 0 || (len > 0 && !buf) || a->start < 0 ||
        a->end < a->start || a->max_rows < 1 || a->max_bytes < 1 || a->max_bytes > INT32_MAX ||
        !a->check_queue || !a->topic || a->topic_len < 1 ||
        (a->check_tags && a->ntags > 0 && (!a->tags || !a->tag_lens)))
        return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "bad decode arguments");
    /* the answer as one read-only "file": parse_record bounds every read by it */
    rmq_segment seg = {buf, len, 0, (char *)label};
    scanner sc;
    memset(&sc, 0, sizeof sc);
    sc.a = a;
    int64_t most = len / 91 + 1; /* rows: no record is shorter than 91 bytes */
    sc.rowcap = (most < a->max_rows ? most : a->max_rows) + 8;
    sc.b = batch_new(sc.rowcap);
    if (!sc.b) return set_err(err, RMQ_E_NOMEM, NULL, -1, -1, -1, "out of memory");
    rmq_batch *b = sc.b;
    if (len > 0 && buf_reserve(&b->bufs[RMQ_B_BODY_DATA], len)) {
        rmq_batch_free(b);
        return set_err(err, RMQ_E_NOMEM, NULL, -1, -1, -1, "out of memory");
    }
    sc.lead_end = -1;
    int code = RMQ_OK, status = RMQ_ST_END;
    int64_t pos = 0, last = -1;
    while (pos < len) {
        rec r;
        code = parse_record(&seg, pos, -1, &r, -1, -1, err);
        if (code) break;
        int64_t n = r.queue_offset;
        if (!record_of_queue(a, &r, n) && !multi_dispatch_lists(a, &r, n)) {
            int tl = r.topic_len < 100 ? (int)r.topic_len : 100;
            int ql = a->topic_len < 100 ? (int)a->topic_len : 100;
            code = set_err(err, RMQ_E_UNIT_MISMATCH, label, pos, r.phy, n,
                           "record of topic '%.*s'%s, queue %d, QUEUEOFFSET %lld is not a message "
                           "of queue '%.*s'%s/%d",
                           tl, (const char *)r.topic, r.topic_len > tl ? "..." : "", r.queue_id,
                           (long long)n, ql, a->topic, a->topic_len > ql ? "..." : "", a->queue_id);
            break;
        }
        if (n <= last) {
            code = set_err(err, RMQ_E_UNIT_MISMATCH, label, pos, r.phy, n,
                           "QUEUEOFFSET %lld does not follow the previous record's %lld",
                           (long long)n, (long long)last);
            break;
        }
        if (n >= a->end) break; /* past the range: the answer's rest is not needed */
        if (n >= a->start) {
            if (b->rows >= a->max_rows) {
                status = RMQ_ST_FULL;
                break;
            }
            int e = emit_row(&sc, &r, n, &seg, pos, err);
            if (e >= 100) {
                code = e - 100;
                break;
            }
            if (e == ROW_FULL) {
                status = RMQ_ST_FULL;
                break;
            }
        }
        last = n;
        pos += r.total;
    }
    if (!code) batch_finish(&sc);
    free(sc.props);
    free(sc.hash);
    if (code) {
        rmq_batch_free(b);
        return code;
    }
    b->next_offset = last + 1 > a->start ? last + 1 : a->start;
    b->scanned = pos; /* bytes of the answer examined */
    b->status = status;
    *out = b;
    return RMQ_OK;
}

