/* native/core/base.c - part of the C core's one translation unit (see rmq_core.c).
 * Byte helpers (unaligned big-endian reads), errors, mapped segments and file queues.
 */

/* ------------------------------------------------------------------------------------------ */
/* Byte helpers (unaligned, big-endian, no UB)                                                 */

static inline uint32_t be32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return __builtin_bswap32(v);
}
static inline uint64_t be64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return __builtin_bswap64(v);
}
static inline int32_t s32(uint32_t u) {
    return u <= (uint32_t)INT32_MAX ? (int32_t)u : (int32_t)(u - 0x80000000u) + INT32_MIN;
}
static inline int64_t s64(uint64_t u) {
    return u <= (uint64_t)INT64_MAX ? (int64_t)u : (int64_t)(u - 0x8000000000000000ull) + INT64_MIN;
}
static inline int32_t rd_i32(const uint8_t *p) { return s32(be32(p)); }
static inline int64_t rd_i64(const uint8_t *p) { return s64(be64(p)); }
static inline int16_t rd_i16(const uint8_t *p) {
    uint16_t u = (uint16_t)((p[0] << 8) | p[1]);
    return u <= 0x7FFF ? (int16_t)u : (int16_t)((int32_t)u - 65536);
}
/* native-order loads, for compares against constants built the same way */
static inline uint32_t ld32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint64_t ld64(const void *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                      */

const char *rmq_code_name(int code) {
    switch (code) {
    case RMQ_OK: return "OK";
    case RMQ_E_ARG: return "BAD_ARGUMENT";
    case RMQ_E_IO: return "IO_ERROR";
    case RMQ_E_NOMEM: return "NO_MEMORY";
    case RMQ_E_MISSING_FILE: return "MISSING_FILE";
    case RMQ_E_BAD_MAGIC: return "BAD_MAGIC";
    case RMQ_E_TRUNCATED: return "TRUNCATED";
    case RMQ_E_SIZE_MISMATCH: return "SIZE_MISMATCH";
    case RMQ_E_NEGATIVE_LENGTH: return "NEGATIVE_LENGTH";
    case RMQ_E_UNIT_OUT_OF_RANGE: return "UNIT_OUT_OF_RANGE";
    case RMQ_E_BAD_UTF8: return "BAD_UTF8";
    case RMQ_E_CRC_MISMATCH: return "CRC_MISMATCH";
    case RMQ_E_BAD_UNIT: return "BAD_UNIT";
    case RMQ_E_UNIT_MISMATCH: return "UNIT_MISMATCH";
    case RMQ_E_BAD_ENTRY: return "BAD_ENTRY";
    case RMQ_E_NET: return "NETWORK";
    case RMQ_E_TIMEOUT: return "TIMEOUT";
    case RMQ_E_PROTOCOL: return "PROTOCOL";
    default: return "UNKNOWN";
    }
}

/* Fill *err; the message is "<CODE>: <what> (file <path>, position <pos>[, physical offset ..]
 * [, queue offset ..])". Returns code so callers can `return set_err(...)`. */
__attribute__((format(printf, 7, 8)))
static int set_err(rmq_error *err, int code, const char *path, int64_t pos, int64_t phy,
                   int64_t qoff, const char *fmt, ...) {
    if (!err) return code;
    err->code = code;
    err->position = pos;
    err->phy_offset = phy;
    err->queue_offset = qoff;
    snprintf(err->path, sizeof err->path, "%s", path ? path : "");
    char what[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    size_t n = (size_t)snprintf(err->message, sizeof err->message, "%s: %s", rmq_code_name(code),
                                what);
    if (n >= sizeof err->message) return code;
    if (path) {
        n += (size_t)snprintf(err->message + n, sizeof err->message - n, " (file %s, position %lld",
                              path, (long long)pos);
        if (n < sizeof err->message && phy >= 0)
            n += (size_t)snprintf(err->message + n, sizeof err->message - n,
                                  ", physical offset %lld", (long long)phy);
        if (n < sizeof err->message && qoff >= 0)
            n += (size_t)snprintf(err->message + n, sizeof err->message - n, ", queue offset %lld",
                                  (long long)qoff);
        if (n < sizeof err->message)
            snprintf(err->message + n, sizeof err->message - n, ")");
    }
    return code;
}

static void clear_err(rmq_error *err) {
    if (!err) return;
    err->code = RMQ_OK;
    err->sys_errno = 0;
    err->position = -1;
    err->phy_offset = -1;
    err->queue_offset = -1;
    err->path[0] = 0;
    err->message[0] = 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Segments                                                                                    */

static rmq_segment *segment_of_fd(int fd, const char *path, int64_t file_start, rmq_error *err);

rmq_segment *rmq_segment_open(const char *path, int64_t file_start, rmq_error *err) {
    clear_err(err);
    if (!path || file_start < 0) {
        set_err(err, RMQ_E_ARG, path, -1, -1, -1, "bad path or negative file start");
        return NULL;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        set_err(err, e == ENOENT ? RMQ_E_MISSING_FILE : RMQ_E_IO, path, -1, -1, -1,
                "cannot open: %s", strerror(e));
        if (err) err->sys_errno = e;
        return NULL;
    }
    return segment_of_fd(fd, path, file_start, err);
}

/* A segment of what the caller's descriptor `fd` holds (an in-memory file: ConsumeQueue units
 * read out of a RocksDB database), named `label` in errors; `fd` stays the caller's. */
rmq_segment *rmq_segment_from_fd(int fd, const char *label, int64_t file_start, rmq_error *err) {
    clear_err(err);
    if (fd < 0 || !label || file_start < 0) {
        set_err(err, RMQ_E_ARG, label, -1, -1, -1, "bad descriptor, label or file start");
        return NULL;
    }
    int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (own < 0) {
        int e = errno;
        set_err(err, RMQ_E_IO, label, -1, -1, -1, "cannot duplicate descriptor: %s", strerror(e));
        if (err) err->sys_errno = e;
        return NULL;
    }
    return segment_of_fd(own, label, file_start, err);
}

/* Map (or, in sanitizer builds, copy) the regular file open as `fd`, which it closes. */
static rmq_segment *segment_of_fd(int fd, const char *path, int64_t file_start, rmq_error *err) {
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int e = errno;
        if (fstat(fd, &st) == 0) e = EISDIR; /* not a regular file */
        close(fd);
        set_err(err, RMQ_E_IO, path, -1, -1, -1, "cannot stat or not a regular file: %s",
                strerror(e));
        if (err) err->sys_errno = e;
        return NULL;
    }
    rmq_segment *seg = calloc(1, sizeof *seg);
    char *p = seg ? strdup(path) : NULL;
    if (!seg || !p) {
        free(seg);
        close(fd);
        set_err(err, RMQ_E_NOMEM, path, -1, -1, -1, "out of memory");
        return NULL;
    }
    seg->path = p;
    seg->file_start = file_start;
    seg->size = (int64_t)st.st_size;
    seg->base = NULL;
#ifdef RMQ_HEAP_SEGMENTS
    /* Sanitizer builds: an exact-size heap copy, so AddressSanitizer sees any read past the end
     * of a file (reads past an mmap are invisible to it until they leave the mapped pages). */
    if (seg->size > 0) {
        uint8_t *m = malloc((size_t)seg->size);
        int64_t got = 0;
        while (m && got < seg->size) {
            ssize_t r = pread(fd, m + got, (size_t)(seg->size - got), (off_t)got);
            if (r <= 0) break;
            got += r;
        }
        if (!m || got != seg->size) {
            int e = m ? (errno ? errno : EIO) : ENOMEM;
            free(m);
            close(fd);
            free(seg->path);
            free(seg);
            set_err(err, RMQ_E_IO, path, -1, -1, -1, "read failed: %s", strerror(e));
            if (err) err->sys_errno = e;
            return NULL;
        }
        seg->base = m;
    }
#else
    if (seg->size > 0) {
        void *m = mmap(NULL, (size_t)seg->size, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            free(seg->path);
            free(seg);
            set_err(err, RMQ_E_IO, path, -1, -1, -1, "mmap failed: %s", strerror(e));
            if (err) err->sys_errno = e;
            return NULL;
        }
        seg->base = (const uint8_t *)m;
    }
#endif
    close(fd);
    return seg;
}

void rmq_segment_close(rmq_segment *seg) {
    if (!seg) return;
#ifdef RMQ_HEAP_SEGMENTS
    free((void *)seg->base);
#else
    if (seg->base && seg->size > 0) munmap((void *)seg->base, (size_t)seg->size);
#endif
    free(seg->path);
    free(seg);
}

/* Segment of a file queue holding address `addr`, or NULL (before the first / after the last). */
static inline rmq_segment *files_seg(const rmq_files *f, int64_t addr, int64_t *idx_out) {
    if (f->count <= 0 || f->file_size <= 0) return NULL;
    int64_t first = f->segs[0]->file_start;
    if (addr < first) return NULL;
    int64_t idx = (addr - first) / f->file_size;
    if (idx >= f->count) return NULL;
    if (idx_out) *idx_out = idx;
    return f->segs[idx];
}

static int check_files(const rmq_files *f, const char *what, rmq_error *err) {
    if (!f || f->count < 0 || (f->count > 0 && (!f->segs || f->file_size <= 0)))
        return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "bad %s file list", what);
    for (int64_t i = 0; i < f->count; i++) {
        const rmq_segment *s = f->segs[i];
        if (!s || s->file_start != f->segs[0]->file_start + i * f->file_size ||
            s->size > f->file_size)
            return set_err(err, RMQ_E_ARG, s ? s->path : NULL, -1, -1, -1,
                           "%s files are not consecutive files of size %lld", what,
                           (long long)f->file_size);
    }
    return RMQ_OK;
}

