/* native/core/scan.c - part of the C core's one translation unit (see rmq_core.c).
 * Queue scans: unfiltered and tag-filtered walks of ConsumeQueue units, of one range
 * (rmq_scan_queue) or of many ranges of one topic's queues into one batch (rmq_scan_ranges).
 */

/* ------------------------------------------------------------------------------------------ */
/* Queue scan                                                                                  */

/* Whether record r is the message of unit n of the queue scanned (the fast path of
 * unit_mismatch): QUEUEOFFSET, QUEUEID and TOPIC compared, a short topic without a call. */
static inline int record_is_unit(const scanner *sc, const rec *r, int64_t n,
                                 const rmq_segment *clseg) {
    const rmq_scan_args *a = sc->a;
    if ((r->queue_offset != n) | (r->queue_id != a->queue_id) | (r->topic_len != a->topic_len))
        return 0;
    if (sc->topic16 && r->topic + 16 <= clseg->base + clseg->size) {
        uint64_t d = ((ld64(r->topic) ^ sc->topic_w[0]) & sc->topic_m[0]) |
                     ((ld64(r->topic + 8) ^ sc->topic_w[1]) & sc->topic_m[1]);
        return d == 0;
    }
    return memcmp(r->topic, a->topic, (size_t)a->topic_len) == 0;
}

/* Locate, validate (structure, then that it is the unit's message) and emit the record of an
 * accepted unit (n, at `up` of cseg). Returns ROW_* or 100 + an error code. */
static inline int take_unit(scanner *sc, const rmq_files *cl, int64_t phy, int32_t size,
                            int64_t n, const rmq_segment *cseg, const uint8_t *up,
                            rmq_error *err) {
    const rmq_segment *clseg = cl_seg(sc, cl, phy);
    rec r;
    if (unlikely(!clseg))
        return 100 + locate_record(cl, phy, size, &r, n, cseg->path, (int64_t)(up - cseg->base),
                                   err);
    int64_t clpos = phy - clseg->file_start;
    if (unlikely(!parse_fast(clseg, clpos, size, &r))) {
        int code = parse_record(clseg, clpos, size, &r, phy, n, err);
        if (code) return 100 + code;
    }
    /* the record must be the unit's message */
    if (unlikely(r.phy != phy) ||
        (sc->a->check_queue && unlikely(!record_is_unit(sc, &r, n, clseg)))) {
        int code = unit_mismatch(sc->a, &r, phy, n, clseg, clpos, cseg->path,
                                 (int64_t)(up - cseg->base), err);
        if (code) return 100 + code;
    }
    if (unlikely(cl->dledger)) {
        int code = check_entry(cl, clseg, clpos, &r, phy, n, err);
        if (code) return 100 + code;
    }
    return emit_row(sc, &r, n, clseg, clpos, err);
}

#define RUN_MORE (-1)      /* a run reached its stop offset */
#define PREFETCH_UNITS 4   /* unfiltered scans: fetch the record this many units ahead */
#define PREFETCH_MATCHES 3 /* filtered scans: fetch the record this many matches ahead */
#define MATCH_MAX 4096     /* filtered scans: matches collected before decoding them */

/* Whether a pre-blank unit at queue offset n is one of the leading run the broker writes. */
static inline int preblank_leading(scanner *sc, int64_t n) {
    if (sc->lead_end < 0) sc->lead_end = preblank_lead_end(sc->cq);
    return n < sc->lead_end;
}

/* Unfiltered scan of units [*np, stop) of one ConsumeQueue file (unit *np at `up`). Returns
 * RUN_MORE, an RMQ_ST_* status or 100 + an error code; *np = where it stopped. */
static int run_all(scanner *sc, const rmq_files *cl, const rmq_segment *cseg,
                   const uint8_t *up, int64_t *np, int64_t stop, rmq_error *err) {
    const rmq_scan_args *a = sc->a;
    int64_t n = *np;
    int rc = RUN_MORE;
    for (; n < stop; n++, up += CQ_UNIT) {
        /* a queue's records are interleaved with other queues' in the CommitLog: fetch ahead */
        if (n + PREFETCH_UNITS < stop) prefetch_unit_record(sc, cl, up + PREFETCH_UNITS * CQ_UNIT);
        int64_t phy = rd_i64(up);
        int32_t size = rd_i32(up + 8);
        if (unlikely(phy < 0 || size <= 0)) {
            rc = RMQ_ST_CQ_END;
            break;
        }
        if (unlikely(phy == 0 && size == PREBLANK_SIZE) && rd_i64(up + 12) == 0) {
            if (likely(preblank_leading(sc, n))) continue;
            rc = 100 + preblank_err(err, cseg->path, (int64_t)(up - cseg->base), n);
            break;
        }
        if (unlikely(phy < sc->cl_min)) {
            rc = RMQ_ST_CL_GONE;
            break;
        }
        if (unlikely(sc->b->rows >= a->max_rows)) {
            rc = RMQ_ST_FULL;
            break;
        }
        int e = take_unit(sc, cl, phy, size, n, cseg, up, err);
        if (likely(e == ROW_ACCEPTED)) continue;
        rc = e == ROW_FULL ? RMQ_ST_FULL : e;
        break;
    }
    *np = n;
    return rc;
}

/* Tag-filtered scan of units [*np, stop) of one ConsumeQueue file (unit *np at `up0`): collect
 * the units whose tag code matches (the others are examined and rejected here, without touching
 * the CommitLog), size the batch for them, then decode them with their records fetched a few
 * matches ahead. Same returns as run_all. */
static int run_filtered(scanner *sc, const rmq_files *cl, const rmq_segment *cseg,
                        const uint8_t *up0, int64_t *np, int64_t stop, rmq_error *err) {
    const rmq_scan_args *a = sc->a;
    rmq_batch *b = sc->b;
    const int64_t n0 = *np;
    int64_t n = n0;
    int64_t match[MATCH_MAX];
#define UNIT_AT(m) (up0 + ((m) - n0) * CQ_UNIT)
    while (n < stop) {
        int64_t want = a->max_rows - b->rows + 1;
        if (want > MATCH_MAX) want = MATCH_MAX;
        int64_t k = 0, bytes = 0;
        int cq_end = 0, bad_preblank = 0;
        while (k < want && n < stop) {
            n += skip_rejected(UNIT_AT(n), stop - n, a, &sc->fc);
            if (n >= stop) break;
            const uint8_t *u = UNIT_AT(n);
            int64_t uphy = rd_i64(u);
            int32_t size = rd_i32(u + 8);
            if (uphy < 0 || size <= 0) {
                cq_end = 1;
                break;
            }
            if (unlikely(size == PREBLANK_SIZE)) {
                if (uphy == 0 && rd_i64(u + 12) == 0) { /* pre-blank: whatever its tag code */
                    if (preblank_leading(sc, n)) {
                        n++;
                        continue;
                    }
                    bad_preblank = 1;   /* reported once the matches before it are decoded */
                    break;
                }
                if (!unit_code_hit(a, &sc->fc, u)) { /* stopped for its size only: rejected */
                    n++;
                    continue;
                }
            }
            match[k++] = n++;
        }
        /* the matches' records are decoded next: read their headers now (sizing from them) */
        const rmq_segment *clseg = NULL;
        for (int64_t j = 0; j < k && bytes < a->max_bytes; j++) {
            const uint8_t *u = UNIT_AT(match[j]);
            bytes += unit_bytes_checked(cl, rd_i64(u), rd_i32(u + 8), &clseg);
        }
        if (k > 0) {
            int64_t rows = k;
            if (k == want && n < stop) {
                /* more matches ahead: size for the rest of the file at the density seen so far,
                 * so that the batch grows (and is copied) once rather than every run */
                double more = (double)(stop - n0) / (double)(n - n0);
                rows = (int64_t)(k * more) + 1;
                bytes = (int64_t)(bytes * more) + 1;
                if (rows > a->max_rows - b->rows + 1) rows = a->max_rows - b->rows + 1;
            }
            if (b->rows + rows + 1 >= sc->rowcap) {
                if (batch_row_capacity(b, b->rows + rows + 8))
                    return 100 + set_err(err, RMQ_E_NOMEM, NULL, -1, -1, -1, "out of memory");
                sc->rowcap = b->rows + rows + 8;
            }
            if (bytes > a->max_bytes) bytes = a->max_bytes;
            if (!sc->stream && b->bufs[RMQ_B_BODY_DATA].len + bytes >= RMQ_STREAM_MIN)
                body_stream_start(sc, stream_mode());
            if (buf_reserve(&b->bufs[RMQ_B_BODY_DATA], bytes))
                return 100 + set_err(err, RMQ_E_NOMEM, NULL, -1, -1, -1, "out of memory");
        }
        for (int64_t j = 0; j < k && j < PREFETCH_MATCHES; j++)
            prefetch_unit_record(sc, cl, UNIT_AT(match[j]));
        for (int64_t j = 0; j < k; j++) {
            if (j + PREFETCH_MATCHES < k)
                prefetch_unit_record(sc, cl, UNIT_AT(match[j + PREFETCH_MATCHES]));
            int64_t m = match[j];
            const uint8_t *u = UNIT_AT(m);
            int64_t phy = rd_i64(u);
            int32_t size = rd_i32(u + 8);
            int rc = RUN_MORE;
            if (phy < sc->cl_min) {
                rc = RMQ_ST_CL_GONE;
            } else if (b->rows >= a->max_rows) {
                rc = RMQ_ST_FULL;
            } else {
                int e = take_unit(sc, cl, phy, size, m, cseg, u, err);
                if (e == ROW_ACCEPTED || e == ROW_REJECTED) continue;
                rc = e == ROW_FULL ? RMQ_ST_FULL : e;
            }
            *np = m;
            return rc;
        }
        if (cq_end) {
            *np = n;
            return RMQ_ST_CQ_END;
        }
        if (bad_preblank) {
            *np = n;
            return 100 + preblank_err(err, cseg->path, (int64_t)(UNIT_AT(n) - cseg->base), n);
        }
    }
#undef UNIT_AT
    *np = n;
    return RUN_MORE;
}

/* Unfiltered scans: rows and CommitLog bytes ahead (units up to the first unwritten one,
 * max_rows and max_bytes), to size the batch once; a unit's bytes count only when its record
 * agrees (unit_bytes_checked). */
static void plan_unfiltered(const rmq_files *cl, const rmq_files *cq, const rmq_scan_args *a,
                            int64_t *rows_out, int64_t *bytes_out) {
    int64_t n = a->start, claimed = 0, bytes = 0, limit = a->end;
    int32_t seen = 0; /* the size of the last record whose unit was checked */
    const rmq_segment *clseg = NULL;
    if (limit - n > a->max_rows) limit = n + a->max_rows;
    while (n < limit && claimed < a->max_bytes) {
        unit u;
        const rmq_segment *seg = NULL;
        int64_t pos = 0;
        if (cq_unit_at(cq, n, &u, &seg, &pos, NULL) != RMQ_OK) break;
        int64_t stop = n + (seg->size - pos) / CQ_UNIT;
        if (stop > limit) stop = limit;
        const uint8_t *up = seg->base + pos;
        /* the units decide how far to look (as the scan will), the records what counts */
        for (; n < stop && claimed < a->max_bytes; n++, up += CQ_UNIT) {
            int32_t size = rd_i32(up + 8);
            if ((up[0] & 0x80) || size <= 0) goto done;
            if (size == PREBLANK_SIZE) continue;
            claimed += size;
            /* a size a record of this scan already showed needs no second look: the reservation
             * stays within the units that exist times a size read from a record */
            if (size == seen) {
                bytes += size;
                continue;
            }
            int64_t got = unit_bytes_checked(cl, rd_i64(up), size, &clseg);
            if (got) seen = size;
            bytes += got;
        }
    }
done:
    *rows_out = n - a->start;
    *bytes_out = bytes < a->max_bytes ? bytes : a->max_bytes;
}

/* Finish a batch for export: the staged entries of the last, partial blocks and exact lengths. */
static void batch_finish(scanner *sc) {
    rmq_batch *b = sc->b;
    int64_t rows_done = b->rows;
    if (rows_done & 15) stage_out_values(sc, rows_done & ~(int64_t)15, rows_done & 15);
    stage_out_offsets(sc, rows_done & ~(int64_t)15, (rows_done & 15) + 1);
    body_flush(sc);
    for (int i = 0; i < RMQ_NBUF; i++)
        if (row_width(i) != 0) b->bufs[i].len = row_bytes_for(i, rows_done);
    b->bufs[RMQ_B_KEYITEM_OFF].len = (b->key_items + 1) * 4;
    b->bufs[RMQ_B_PKEY_OFF].len = (b->prop_items + 1) * 4;
    b->bufs[RMQ_B_PVAL_OFF].len = (b->prop_items + 1) * 4;
}

/* The checks every scan's arguments pass (the range itself aside). */
static int scan_args_ok(const rmq_scan_args *a) {
    return a && a->max_rows >= 1 && a->max_bytes >= 1 && a->max_bytes <= INT32_MAX &&
           !(a->filter && a->ncodes > 0 && !a->codes) &&
           !(a->check_tags && (!a->filter || (a->ntags > 0 && (!a->tags || !a->tag_lens)))) &&
           !(a->check_queue && (!a->topic || a->topic_len < 1));
}

static int range_ok(int64_t start, int64_t end) {
    return start >= 0 && end >= start && end <= INT64_MAX / CQ_UNIT;
}

/* A scanner over a new batch sized for hint_rows rows and hint_bytes body bytes; the state the
 * ranges of one topic share (topic words, tag codes, CommitLog min). sc->a and sc->cq are set
 * per range (scan_range). */
static int scanner_open(scanner *sc, const rmq_files *cl, const rmq_scan_args *a,
                        int64_t hint_rows, int64_t hint_bytes, rmq_error *err) {
    memset(sc, 0, sizeof *sc);
    sc->a = a;
    sc->rowcap = hint_rows + 8;
    sc->b = batch_new(sc->rowcap);
    if (!sc->b) return set_err(err, RMQ_E_NOMEM, NULL, -1, -1, -1, "out of memory");
    if (hint_bytes > 0 && buf_reserve(&sc->b->bufs[RMQ_B_BODY_DATA], hint_bytes)) {
        rmq_batch_free(sc->b);
        sc->b = NULL;
        return set_err(err, RMQ_E_NOMEM, NULL, -1, -1, -1, "out of memory");
    }
    sc->cl_min = cl->count ? cl->segs[0]->file_start : 0;
    sc->lead_end = -1;
    if (a->check_queue && a->topic_len <= 16) {
        uint8_t w[16] = {0}, m[16] = {0};
        memcpy(w, a->topic, (size_t)a->topic_len);
        memset(m, 0xFF, (size_t)a->topic_len);
        memcpy(sc->topic_w, w, 16);
        memcpy(sc->topic_m, m, 16);
        sc->topic16 = 1;
    }
    if (hint_bytes >= RMQ_STREAM_MIN) body_stream_start(sc, stream_mode());
    fast_codes_init(&sc->fc, sc->a);
    return RMQ_OK;
}

/* Scan units [a->start, a->end) of cq into the scanner's batch (a: the range's arguments, whose
 * tag filter and topic are those the scanner was opened with). Returns an RMQ_ST_* status or
 * 100 + an error code; *np = where the scan stopped. */
static int scan_range(scanner *sc, const rmq_files *cl, const rmq_files *cq,
                      const rmq_scan_args *a, int64_t *np, rmq_error *err) {
    sc->a = a;
    sc->cq = cq;
    sc->lead_end = -1;
    int64_t n = a->start;
    int rc = RMQ_ST_END;
    while (n < a->end) {
        /* locate the CQ file of unit n and walk the units it holds */
        unit u0;
        const rmq_segment *cseg = NULL;
        int64_t cpos = 0;
        int r0 = cq_unit_at(cq, n, &u0, &cseg, &cpos, err);
        if (r0 == -1) {
            rc = RMQ_ST_CQ_END;
            break;
        }
        if (r0) {
            rc = 100 + r0;
            break;
        }
        int64_t in_file = (cseg->size - cpos) / CQ_UNIT;
        int64_t stop = n + in_file < a->end ? n + in_file : a->end;
        const uint8_t *up = cseg->base + cpos;
        int res = a->filter ? run_filtered(sc, cl, cseg, up, &n, stop, err)
                            : run_all(sc, cl, cseg, up, &n, stop, err);
        if (res == RUN_MORE) continue;
        rc = res;
        break;
    }
    *np = n;
    return rc;
}

/* Free the scanner's scratch; finish its batch when `code` is RMQ_OK, else free it. */
static void scanner_close(scanner *sc, int code) {
    if (!code) batch_finish(sc);
    free(sc->props);
    free(sc->hash);
#if RMQ_SSE2
    if (sc->stream) _mm_sfence(); /* order the streaming stores before the batch is handed over */
#endif
    if (code) {
        rmq_batch_free(sc->b);
        sc->b = NULL;
    }
}

int rmq_scan_queue(const rmq_files *cl, const rmq_files *cq, const rmq_scan_args *a,
                   rmq_batch **out, rmq_error *err) {
    clear_err(err);
    if (out) *out = NULL;
    int rc = check_files(cl, "CommitLog", err);
    if (rc) return rc;
    rc = check_files(cq, "ConsumeQueue", err);
    if (rc) return rc;
    if (!out || !scan_args_ok(a) || !range_ok(a->start, a->end))
        return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "bad scan arguments");

    /* Size the batch up front from the CQ unit sizes (an upper bound of the body bytes) that the
     * records confirm, so the buffers are not regrown; a filtered scan sizes it per run of
     * collected matches. */
    int64_t hint_rows = 64, hint_bytes = 0;
    if (!a->filter) {
        plan_unfiltered(cl, cq, a, &hint_rows, &hint_bytes);
        if (hint_rows < 64) hint_rows = 64;
    }
    scanner sc;
    rc = scanner_open(&sc, cl, a, hint_rows, hint_bytes, err);
    if (rc) return rc;
    int64_t n = a->start;
    int res = scan_range(&sc, cl, cq, a, &n, err);
    int code = res >= 100 ? res - 100 : RMQ_OK;
    rmq_batch *b = sc.b;
    scanner_close(&sc, code);
    if (code) return code;
    b->next_offset = n;
    b->scanned = n - a->start;
    b->status = res;
    *out = b;
    return RMQ_OK;
}

int rmq_scan_ranges(const rmq_files *cl, const rmq_scan_args *a, rmq_ranges *r,
                    rmq_batch **out, rmq_error *err) {
    clear_err(err);
    if (out) *out = NULL;
    if (r) r->done = 0;
    int rc = check_files(cl, "CommitLog", err);
    if (rc) return rc;
    if (!out || !scan_args_ok(a) || !r || r->n < 1 || !r->cqs || !r->starts || !r->ends ||
        !r->queue_ids || !r->rows || !r->next_offsets || !r->statuses)
        return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "bad scan arguments");
    for (int64_t i = 0; i < r->n; i++) {
        rc = check_files(r->cqs[i], "ConsumeQueue", err);
        if (rc) return rc;
        if (!range_ok(r->starts[i], r->ends[i]))
            return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "bad scan range %lld: [%lld, %lld)",
                           (long long)i, (long long)r->starts[i], (long long)r->ends[i]);
    }
    /* each range's own arguments: a copy of a with its offsets and queue */
    rmq_scan_args ra = *a;
    /* sized up front as rmq_scan_queue sizes one range, over the ranges until the batch's
     * limits are reached */
    int64_t hint_rows = 0, hint_bytes = 0;
    if (!a->filter) {
        for (int64_t i = 0; i < r->n && hint_rows < a->max_rows && hint_bytes < a->max_bytes;
             i++) {
            int64_t rows = 0, bytes = 0;
            ra.start = r->starts[i];
            ra.end = r->ends[i];
            ra.max_rows = a->max_rows - hint_rows;
            ra.max_bytes = a->max_bytes - hint_bytes;
            plan_unfiltered(cl, r->cqs[i], &ra, &rows, &bytes);
            hint_rows += rows;
            hint_bytes += bytes;
        }
        ra.max_rows = a->max_rows;
        ra.max_bytes = a->max_bytes;
    }
    if (hint_rows < 64) hint_rows = 64;
    scanner sc;
    rc = scanner_open(&sc, cl, &ra, hint_rows, hint_bytes, err);
    if (rc) return rc;
    int res = RMQ_ST_END, code = RMQ_OK;
    int64_t i = 0, n = 0;
    for (; i < r->n; i++) {
        int64_t rows0 = sc.b->rows;
        ra.start = r->starts[i];
        ra.end = r->ends[i];
        ra.queue_id = r->queue_ids[i];
        res = scan_range(&sc, cl, r->cqs[i], &ra, &n, err);
        r->done = i + 1;
        if (res >= 100) {
            code = res - 100;
            break;
        }
        r->rows[i] = sc.b->rows - rows0;
        r->next_offsets[i] = n;
        r->statuses[i] = res;
        if (res != RMQ_ST_END) break;
    }
    rmq_batch *b = sc.b;
    scanner_close(&sc, code);
    if (code) return code;
    b->next_offset = n;
    b->scanned = n - ra.start;
    b->status = res;
    *out = b;
    return RMQ_OK;
}
