/* native/core/consumequeue.c - part of the C core's one translation unit (see rmq_core.c).
 * ConsumeQueue units: validity, pre-blank units, valid counts, first unit above a
 * physical offset, and the time lookup (binary search).
 */

/* ------------------------------------------------------------------------------------------ */
/* ConsumeQueue helpers                                                                        */

typedef struct unit {
    int64_t phy;
    int32_t size;
    int64_t tags;
} unit;

static inline void read_unit(const uint8_t *u, unit *out) {
    out->phy = rd_i64(u);
    out->size = rd_i32(u + 8);
    out->tags = rd_i64(u + 12);
}
static inline int unit_valid(const unit *u) { return u->phy >= 0 && u->size > 0; }
static inline int unit_preblank(const unit *u) {
    return u->phy == 0 && u->size == PREBLANK_SIZE && u->tags == 0;
}

/* Queue offset one past the leading run of pre-blank units of the queue's first file (its first
 * unit when there is none). That run is the only place the broker writes them (§7.4: the first
 * file of a queue created at a non-zero offset is filled from its start up to that offset); a
 * pre-blank unit at or above the returned offset is damage. */
static int64_t preblank_lead_end(const rmq_files *cq) {
    if (cq->count <= 0) return 0;
    const rmq_segment *s = cq->segs[0];
    int64_t n = s->file_start / CQ_UNIT + (s->file_start % CQ_UNIT != 0); /* first whole unit */
    for (; n <= INT64_MAX / CQ_UNIT; n++) {
        int64_t pos = n * CQ_UNIT - s->file_start;
        if (pos > s->size - CQ_UNIT) break;
        unit u;
        read_unit(s->base + pos, &u);
        if (!unit_preblank(&u)) break;
    }
    return n;
}

static __attribute__((cold, noinline)) int preblank_err(rmq_error *err, const char *cq_path,
                                                        int64_t cq_pos, int64_t n) {
    return set_err(err, RMQ_E_BAD_UNIT, cq_path, cq_pos, -1, n,
                   "pre-blank filler unit (0, 0x7FFFFFFF, 0) after written units; the broker "
                   "writes them only at the head of a queue's first ConsumeQueue file");
}

int64_t rmq_cq_valid_units(const rmq_segment *seg) {
    if (!seg || !seg->base) return 0;
    int64_t n = seg->size / CQ_UNIT;
    for (int64_t i = 0; i < n; i++) {
        unit u;
        read_unit(seg->base + i * CQ_UNIT, &u);
        if (!unit_valid(&u)) return i;
    }
    return n;
}

int64_t rmq_cq_valid_units_from(const rmq_segment *seg, int64_t known) {
    if (!seg || !seg->base) return 0;
    int64_t n = seg->size / CQ_UNIT;
    if (known <= 0 || known > n) return rmq_cq_valid_units(seg);
    unit u;
    read_unit(seg->base + (known - 1) * CQ_UNIT, &u);
    if (!unit_valid(&u)) return rmq_cq_valid_units(seg); /* the tail was cut back: count anew */
    for (int64_t i = known; i < n; i++) {
        read_unit(seg->base + i * CQ_UNIT, &u);
        if (!unit_valid(&u)) return i;
    }
    return n;
}

int64_t rmq_cq_first_unit_at_or_above(const rmq_segment *seg, int64_t phy_min) {
    return rmq_cq_first_unit_at_or_above_from(seg, phy_min, 0);
}

int64_t rmq_cq_first_unit_at_or_above_from(const rmq_segment *seg, int64_t phy_min,
                                           int64_t known) {
    if (!seg || !seg->base) return 0;
    int64_t n = seg->size / CQ_UNIT;
    int64_t i = 0;
    if (known > 0 && known <= n) {
        /* resume only if the unit before `known` still is one the scan passes over */
        unit u;
        read_unit(seg->base + (known - 1) * CQ_UNIT, &u);
        if (unit_valid(&u) && (unit_preblank(&u) || u.phy < phy_min)) i = known;
    }
    for (; i < n; i++) {
        unit u;
        read_unit(seg->base + i * CQ_UNIT, &u);
        if (!unit_valid(&u)) return i;
        if (!unit_preblank(&u) && u.phy >= phy_min) return i;
    }
    return n;
}

/* Unit of queue offset n. Returns RMQ_OK, RMQ_E_MISSING_FILE / RMQ_E_TRUNCATED with *err set,
 * or -1 when the unit lies beyond the written files (not yet written). */
static int cq_unit_at(const rmq_files *cq, int64_t n, unit *u, const rmq_segment **seg_out,
                      int64_t *pos_out, rmq_error *err) {
    int64_t addr = n * CQ_UNIT;
    int64_t first = cq->count ? cq->segs[0]->file_start : 0;
    if (cq->count == 0 || addr < first) {
        if (cq->count == 0) return -1;
        return set_err(err, RMQ_E_MISSING_FILE, NULL, -1, -1, n,
                       "ConsumeQueue file holding queue offset %lld (byte %lld) is missing; the "
                       "first file starts at byte %lld",
                       (long long)n, (long long)addr, (long long)first);
    }
    int64_t idx = (addr - first) / cq->file_size;
    if (idx >= cq->count) return -1;
    const rmq_segment *seg = cq->segs[idx];
    int64_t pos = addr - seg->file_start;
    if (pos > seg->size - CQ_UNIT) {
        if (idx == cq->count - 1) return -1;
        return set_err(err, RMQ_E_TRUNCATED, seg->path, pos, -1, n,
                       "ConsumeQueue file is shorter (%lld bytes) than its file size %lld",
                       (long long)seg->size, (long long)cq->file_size);
    }
    read_unit(seg->base + pos, u);
    if (seg_out) *seg_out = seg;
    if (pos_out) *pos_out = pos;
    return RMQ_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Time lookup (binary search, LOWER semantics)                                                */

/* *ge = storeTimestamp(unit n) >= ts; units whose CommitLog is gone, and the leading pre-blank
 * units, count as older. *lead_end caches preblank_lead_end (-1: not computed yet). */
static int unit_time_ge(const rmq_files *cl, const rmq_files *cq, int64_t n, int64_t ts, int *ge,
                        int64_t *lead_end, rmq_error *err) {
    unit u = {0, 0, 0};
    const rmq_segment *cseg = NULL;
    int64_t cpos = -1;
    int rc = cq_unit_at(cq, n, &u, &cseg, &cpos, err);
    if (rc == -1)
        return set_err(err, RMQ_E_BAD_UNIT, cq->count ? cq->segs[cq->count - 1]->path : NULL, -1,
                       -1, n, "queue offset %lld is beyond the written ConsumeQueue files",
                       (long long)n);
    if (rc) return rc;
    if (!unit_valid(&u))
        return set_err(err, RMQ_E_BAD_UNIT, cseg->path, cpos, u.phy, n,
                       "ConsumeQueue unit is not written (phy %lld, size %d)", (long long)u.phy,
                       u.size);
    if (unit_preblank(&u)) {
        if (*lead_end < 0) *lead_end = preblank_lead_end(cq);
        if (n >= *lead_end) return preblank_err(err, cseg->path, cpos, n);
        *ge = 0;
        return RMQ_OK;
    }
    int64_t cl_min = cl->count ? cl->segs[0]->file_start : 0;
    if (u.phy < cl_min) {
        *ge = 0;
        return RMQ_OK;
    }
    rec r;
    rc = locate_record(cl, u.phy, u.size, &r, n, cseg->path, cpos, err);
    if (rc) return rc;
    *ge = r.store_ts >= ts;
    return RMQ_OK;
}

int rmq_lookup_time(const rmq_files *cl, const rmq_files *cq, int64_t min_offset,
                    int64_t max_offset, int64_t timestamp_ms, int64_t *out, rmq_error *err) {
    clear_err(err);
    int rc = check_files(cl, "CommitLog", err);
    if (rc) return rc;
    rc = check_files(cq, "ConsumeQueue", err);
    if (rc) return rc;
    if (!out || min_offset < 0 || max_offset < min_offset || max_offset > INT64_MAX / CQ_UNIT)
        return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "bad offset range [%lld, %lld)",
                       (long long)min_offset, (long long)max_offset);
    int64_t lo = min_offset, hi = max_offset, lead_end = -1;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int ge = 0;
        rc = unit_time_ge(cl, cq, mid, timestamp_ms, &ge, &lead_end, err);
        if (rc) return rc;
        if (ge)
            hi = mid;
        else
            lo = mid + 1;
    }
    *out = lo;
    return RMQ_OK;
}

