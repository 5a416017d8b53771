/*
 * rmq_core.c - read-only decoder of Apache RocketMQ store files (CommitLog + ConsumeQueue).
 *
 * ON-DISK LAYOUT READ HERE (all integers big-endian, signed two's complement;
 * section numbers refer to docs/rocketmq-store-format.md)
 *
 * Mapped files (§2.1): every file of a queue is named by the address of its first byte and all
 * files of a queue have the same size; the CommitLog address of byte p of file F is start(F) + p.
 *
 * CommitLog record (§3.2). bh = 8, or 20 when SYSFLAG & 0x10 (born host IPv6);
 * sh = 8, or 20 when SYSFLAG & 0x20 (store host IPv6); tl = 1 for V1, 2 for V2.
 *     off         size  field
 *     0           4     TOTALSIZE   whole record length
 *     4           4     MAGIC       0xDAA320A7 (V1) | 0xDAA320AB (V2, 5.x topics > 127 chars)
 *     8           4     BODYCRC     crc32(stored body) & 0x7FFFFFFF
 *     12          4     QUEUEID
 *     16          4     FLAG
 *     20          8     QUEUEOFFSET
 *     28          8     PHYSICALOFFSET
 *     36          4     SYSFLAG     0x1 compressed, 0x700 compression type, 0x10/0x20 IPv6 hosts
 *     40          8     BORNTIMESTAMP (ms)
 *     48          bh    BORNHOST    4|16 address bytes + int32 port
 *     48+bh       8     STORETIMESTAMP (ms)
 *     56+bh       sh    STOREHOST
 *     56+bh+sh    4     RECONSUMETIMES
 *     60+bh+sh    8     PREPARED TRANSACTION OFFSET
 *     68+bh+sh    4     BODYLENGTH
 *     72+bh+sh    body  BODY (as stored, possibly compressed)
 *     ...         tl    TOPICLENGTH (int8 in V1, int16 in V2), then TOPIC (UTF-8)
 *     ...         2     PROPERTIESLENGTH (int16), then PROPERTIES (UTF-8)
 *   Length rule: TOTALSIZE = 74 + bh + sh + tl + bodyLen + topicLen + propLen. The broker never
 *   writes negative lengths, so a negative one is reported as corruption (NEGATIVE_LENGTH).
 *   Properties (§4.1): entries "name 0x01 value" separated by 0x02 (5.x also after the last one);
 *   an entry counts only with a non-empty name and value; a later duplicate replaces the value.
 *
 * BLANK record (§3.4): int32 TOTALSIZE = bytes to end of file, int32 MAGIC 0xCBD43194. It ends
 *   the file; the next record is at position 0 of the next file. Records never span files.
 *
 * ConsumeQueue unit (§7.1), 20 bytes, unit n at byte n*20 of the queue's address space:
 *     0 int64 CommitLog physical offset, 8 int32 record size (== TOTALSIZE),
 *     12 int64 tagsCode (Java String.hashCode of TAGS, sign-extended; 0 when untagged).
 *   Valid iff phy >= 0 && size > 0 (§2.4). Pre-blank filler units (0, 0x7FFFFFFF, 0) are skipped.
 *
 * Safety: every read is bounds-checked against the mapping; a bad record yields an error code and
 * a message naming the file, the byte position and the physical/queue offset, never a crash and
 * never a silent skip. Files are mapped PROT_READ/MAP_SHARED; the mapping must not be truncated
 * underneath us (the broker never shrinks a file; it only deletes whole files, which is harmless
 * for an existing mapping). Built with -DRMQ_HEAP_SEGMENTS (the sanitizer build) files are read
 * into exact-size heap buffers instead, so AddressSanitizer checks every read against file ends.
 *
 * Output: rmq_scan_queue fills an rmq_batch of 64-byte aligned Arrow buffers (see rmq_core.h);
 * rmq_source/native.py wraps them zero-copy. Large freed buffers are pooled for the next scan.
 */
#define _GNU_SOURCE
#include "rmq_core.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

_Static_assert(RMQ_NBUF == 34, "rmq_batch.bufs size must match RMQ_NBUF");

#define MAGIC_V1 0xDAA320A7u
#define MAGIC_V2 0xDAA320ABu
#define MAGIC_BLANK 0xCBD43194u
#define CQ_UNIT 20
#define PREBLANK_SIZE 0x7FFFFFFF
#define ALIGN 64

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

/* ------------------------------------------------------------------------------------------ */
/* CommitLog record parsing                                                                    */

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

/* Locate the record at physical offset phy; errors name the CommitLog file when it exists. */
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
    return parse_record(seg, phy - seg->file_start, size, r, phy, qoff, err);
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

int64_t rmq_cq_first_unit_at_or_above(const rmq_segment *seg, int64_t phy_min) {
    if (!seg || !seg->base) return 0;
    int64_t n = seg->size / CQ_UNIT;
    for (int64_t i = 0; i < n; i++) {
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

/* *ge = storeTimestamp(unit n) >= ts; units whose CommitLog is gone, and pre-blank units, count
 * as older. */
static int unit_time_ge(const rmq_files *cl, const rmq_files *cq, int64_t n, int64_t ts, int *ge,
                        rmq_error *err) {
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
    int64_t cl_min = cl->count ? cl->segs[0]->file_start : 0;
    if (unit_preblank(&u) || u.phy < cl_min) {
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
    int64_t lo = min_offset, hi = max_offset;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int ge = 0;
        rc = unit_time_ge(cl, cq, mid, timestamp_ms, &ge, err);
        if (rc) return rc;
        if (ge)
            hi = mid;
        else
            lo = mid + 1;
    }
    *out = lo;
    return RMQ_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Growable, 64-byte aligned buffers                                                           */

/* Pool of large freed buffers. Batches are usually dropped soon after they are consumed; handing
 * their buffers to the next scan avoids fresh pages (page faults + kernel zeroing cost about as
 * much as the decode itself). Small buffers go back to malloc, which recycles them anyway. */
#define POOL_MIN_CAP ((int64_t)1 << 20)
#define POOL_SLOTS 32
#define POOL_MAX_BYTES ((int64_t)384 << 20)
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static struct { uint8_t *data; int64_t cap; } pool[POOL_SLOTS];
static int pool_n;
static int64_t pool_bytes;

/* A pooled buffer of at least `need` bytes and at most twice that (best fit), or NULL. */
static uint8_t *pool_take(int64_t need, int64_t *cap_out) {
    if (need < POOL_MIN_CAP / 2) return NULL;
    uint8_t *got = NULL;
    pthread_mutex_lock(&pool_mu);
    int best = -1;
    for (int i = 0; i < pool_n; i++)
        if (pool[i].cap >= need && pool[i].cap <= 2 * need &&
            (best < 0 || pool[i].cap < pool[best].cap))
            best = i;
    if (best >= 0) {
        got = pool[best].data;
        *cap_out = pool[best].cap;
        pool_bytes -= pool[best].cap;
        pool[best] = pool[--pool_n];
    }
    pthread_mutex_unlock(&pool_mu);
    return got;
}

static void pool_put(uint8_t *data, int64_t cap) {
    if (!data) return;
    if (cap >= POOL_MIN_CAP) {
        pthread_mutex_lock(&pool_mu);
        if (pool_n < POOL_SLOTS && pool_bytes + cap <= POOL_MAX_BYTES) {
            pool[pool_n].data = data;
            pool[pool_n].cap = cap;
            pool_n++;
            pool_bytes += cap;
            data = NULL;
        }
        pthread_mutex_unlock(&pool_mu);
    }
    free(data);
}

/* Grow b to hold `need` bytes, keeping its first `keep` bytes. */
static int buf_grow_keep(rmq_buf *b, int64_t need, int64_t keep) {
    int64_t cap = b->cap ? b->cap : ALIGN;
    while (cap < need) {
        if (cap > INT64_MAX / 2) return RMQ_E_NOMEM;
        cap *= 2;
    }
    cap = (cap + ALIGN - 1) / ALIGN * ALIGN;
    int64_t pooled_cap = 0;
    uint8_t *m = pool_take(need, &pooled_cap);
    if (m) {
        cap = pooled_cap;
    } else {
        void *v = NULL;
        if (posix_memalign(&v, ALIGN, (size_t)cap) != 0) return RMQ_E_NOMEM;
        m = (uint8_t *)v;
    }
    if (keep > 0) memcpy(m, b->data, (size_t)keep);
    pool_put(b->data, b->cap);
    b->data = m;
    b->cap = cap;
    return RMQ_OK;
}

/* Data buffers: keep what is used. */
static int buf_grow(rmq_buf *b, int64_t need) { return buf_grow_keep(b, need, b->len); }

static inline int buf_reserve(rmq_buf *b, int64_t extra) {
    if (b->len + extra <= b->cap) return RMQ_OK;
    return buf_grow(b, b->len + extra);
}

void rmq_batch_buffers(const rmq_batch *batch, uint64_t *addrs, int64_t *lens) {
    for (int i = 0; i < RMQ_NBUF; i++) {
        addrs[i] = (uint64_t)(uintptr_t)batch->bufs[i].data;
        lens[i] = batch->bufs[i].len;
    }
}

void rmq_batch_free(rmq_batch *batch) {
    if (!batch) return;
    for (int i = 0; i < RMQ_NBUF; i++) pool_put(batch->bufs[i].data, batch->bufs[i].cap);
    free(batch);
}

/* Width in bytes of the per-row element of each buffer (offset arrays have rows + 1 entries),
 * 0 for data buffers, -1 for validity bitmaps. */
static int row_width(int id) {
    switch (id) {
    case RMQ_B_QUEUE_ID: case RMQ_B_STORE_SIZE: case RMQ_B_SYSFLAG: case RMQ_B_FLAG:
    case RMQ_B_RECONSUME: case RMQ_B_BODYCRC:
    case RMQ_B_MSGID_OFF: case RMQ_B_UNIQ_OFF: case RMQ_B_TAGS_OFF: case RMQ_B_KEYS_OFF:
    case RMQ_B_BODY_OFF: case RMQ_B_PROPS_OFF: case RMQ_B_BORNHOST_OFF: case RMQ_B_STOREHOST_OFF:
        return 4;
    case RMQ_B_QUEUE_OFFSET: case RMQ_B_COMMITLOG_OFFSET: case RMQ_B_BORN_TS: case RMQ_B_STORE_TS:
    case RMQ_B_PREPARED:
        return 8;
    case RMQ_B_UNIQ_VALID: case RMQ_B_TAGS_VALID: case RMQ_B_KEYS_VALID:
        return -1;
    default:
        return 0;
    }
}

static int is_offsets(int id) {
    return id == RMQ_B_MSGID_OFF || id == RMQ_B_UNIQ_OFF || id == RMQ_B_TAGS_OFF ||
           id == RMQ_B_KEYS_OFF || id == RMQ_B_BODY_OFF || id == RMQ_B_PROPS_OFF ||
           id == RMQ_B_BORNHOST_OFF || id == RMQ_B_STOREHOST_OFF || id == RMQ_B_KEYITEM_OFF ||
           id == RMQ_B_PKEY_OFF || id == RMQ_B_PVAL_OFF;
}

/* Make room for `rows` rows in every row-indexed buffer (offsets: rows + 1 entries). */
static int batch_row_capacity(rmq_batch *b, int64_t rows) {
    for (int i = 0; i < RMQ_NBUF; i++) {
        int w = row_width(i);
        int64_t need;
        if (w > 0)
            need = (rows + (is_offsets(i) ? 1 : 0)) * w;
        else if (w < 0)
            need = (rows + 7) / 8;
        else
            continue;
        if (need > b->bufs[i].cap) {
            /* row-indexed buffers keep len 0 while scanning: preserve the rows written so far */
            int64_t used = w > 0 ? (b->rows + (is_offsets(i) ? 1 : 0)) * w : (b->rows + 7) / 8;
            if (buf_grow_keep(&b->bufs[i], need, used)) return RMQ_E_NOMEM;
            if (w < 0) memset(b->bufs[i].data + used, 0, (size_t)(b->bufs[i].cap - used));
        }
    }
    return RMQ_OK;
}

static rmq_batch *batch_new(int64_t rows_hint) {
    rmq_batch *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    for (int i = 0; i < RMQ_NBUF; i++) {
        if (buf_grow(&b->bufs[i], ALIGN)) goto fail;
        memset(b->bufs[i].data, 0, ALIGN);
    }
    if (batch_row_capacity(b, rows_hint)) goto fail;
    /* offset arrays start with a 0 entry */
    for (int i = 0; i < RMQ_NBUF; i++)
        if (is_offsets(i)) b->bufs[i].len = 4;
    return b;
fail:
    rmq_batch_free(b);
    return NULL;
}

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

static inline void hex16(char *o, uint64_t v) {
    uint64_t hi = hex8_word((uint32_t)(v >> 32)), lo = hex8_word((uint32_t)v);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    hi = __builtin_bswap64(hi);
    lo = __builtin_bswap64(lo);
#endif
    memcpy(o, &hi, 8);
    memcpy(o + 8, &lo, 8);
}

typedef struct prop { uint32_t ko, kl, vo, vl; } prop;

typedef struct host_cache {
    int width;            /* 0: empty */
    int len;
    uint8_t key[20];
    char text[64];
    char hex[40];         /* uppercase hex of the host field (the msgId prefix) */
} host_cache;

/* format_host with a one-entry cache of the last host field seen in this column. */
static inline int format_host_cached(host_cache *c, char *out, const uint8_t *h, int width) {
    if (c->width != width || memcmp(c->key, h, (size_t)width) != 0) {
        c->len = format_host(c->text, h, width);
        c->width = width;
        memcpy(c->key, h, (size_t)width);
        for (int i = 0; i < width; i++) {
            c->hex[2 * i] = HEXU[h[i] >> 4];
            c->hex[2 * i + 1] = HEXU[h[i] & 15];
        }
    }
    memcpy(out, c->text, (size_t)c->len);
    return c->len;
}

typedef struct scanner {
    const rmq_scan_args *a;
    rmq_batch *b;
    prop *props;          /* scratch: parsed entries of one record */
    int64_t props_cap;
    uint32_t *hash;       /* scratch: dedupe table for records with many entries */
    int64_t hash_cap;
    int64_t rowcap;       /* rows every row-indexed buffer can hold */
    host_cache born, store; /* hosts repeat from row to row (one broker, few producers) */
} scanner;

static inline void set_valid(rmq_buf *bm, int64_t row) {
    bm->data[row >> 3] |= (uint8_t)(1u << (row & 7));
}

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

static inline void append_str(rmq_buf *off, rmq_buf *data, int64_t idx, const uint8_t *s,
                              int64_t n) {
    copy_short(data->data + data->len, s, n);
    data->len += n;
    put_off(off, idx + 1, data->len);
}

static uint32_t fnv1a(const uint8_t *s, uint32_t n) {
    uint32_t h = 2166136261u;
    for (uint32_t i = 0; i < n; i++) h = (h ^ s[i]) * 16777619u;
    return h;
}

/* Parse properties (§4.1) into sc->props; duplicates keep the first position and the last value.
 * Returns the entry count or -1 on allocation failure. */
static int64_t parse_props(scanner *sc, const uint8_t *s, int32_t n) {
    int64_t max_entries = n / 3 + 1;
    if (max_entries > sc->props_cap) {
        prop *np = realloc(sc->props, (size_t)max_entries * sizeof *np);
        if (!np) return -1;
        sc->props = np;
        sc->props_cap = max_entries;
    }
    prop *pr = sc->props;
    int64_t cnt = 0;
    int hashed = 0;
    uint32_t hmask = 0;
    uint64_t seen = 0;
    const uint8_t *end = s + n;
    const uint8_t *seg = s;
    while (seg < end) {
        const uint8_t *sep2 = memchr(seg, 0x02, (size_t)(end - seg));
        const uint8_t *segend = sep2 ? sep2 : end;
        size_t slen = (size_t)(segend - seg);
        if (slen >= 3) {
            const uint8_t *sep1 = memchr(seg, 0x01, slen);
            if (sep1 && sep1 > seg && sep1 + 1 < segend) {
                prop e = {(uint32_t)(seg - s), (uint32_t)(sep1 - seg), (uint32_t)(sep1 + 1 - s),
                          (uint32_t)(segend - sep1 - 1)};
                int64_t found = -1;
                /* a 64-bit filter on (first byte, length): most names are new, skip the search */
                uint64_t bit = 1ull << ((s[e.ko] * 31u + e.kl) & 63u);
                int maybe_dup = (seen & bit) != 0;
                seen |= bit;
                if (!hashed && maybe_dup) {
                    for (int64_t i = 0; i < cnt; i++)
                        if (pr[i].kl == e.kl && s[pr[i].ko] == s[e.ko] &&
                            memcmp(s + pr[i].ko, s + e.ko, e.kl) == 0) {
                            found = i;
                            break;
                        }
                }
                if (!hashed) {
                    if (found < 0 && cnt >= 16) {
                        /* switch to a hash table sized for the worst case */
                        int64_t hc = 64;
                        while (hc < 2 * max_entries) hc *= 2;
                        if (hc > sc->hash_cap) {
                            uint32_t *nh = realloc(sc->hash, (size_t)hc * sizeof *nh);
                            if (!nh) return -1;
                            sc->hash = nh;
                            sc->hash_cap = hc;
                        }
                        memset(sc->hash, 0xFF, (size_t)hc * sizeof *sc->hash);
                        hmask = (uint32_t)(hc - 1);
                        for (int64_t i = 0; i < cnt; i++) {
                            uint32_t h = fnv1a(s + pr[i].ko, pr[i].kl) & hmask;
                            while (sc->hash[h] != UINT32_MAX) h = (h + 1) & hmask;
                            sc->hash[h] = (uint32_t)i;
                        }
                        hashed = 1;
                    }
                }
                if (hashed) {
                    uint32_t h = fnv1a(s + e.ko, e.kl) & hmask;
                    while (sc->hash[h] != UINT32_MAX) {
                        prop *q = &pr[sc->hash[h]];
                        if (q->kl == e.kl && memcmp(s + q->ko, s + e.ko, e.kl) == 0) {
                            found = sc->hash[h];
                            break;
                        }
                        h = (h + 1) & hmask;
                    }
                    if (found < 0) sc->hash[h] = (uint32_t)cnt;
                }
                if (found >= 0) {
                    pr[found].vo = e.vo;
                    pr[found].vl = e.vl;
                } else {
                    pr[cnt++] = e;
                }
            }
        }
        if (!sep2) break;
        seg = sep2 + 1;
    }
    return cnt;
}

static inline int key_is(const uint8_t *s, const prop *e, const char *name, uint32_t len) {
    return e->kl == len && memcmp(s + e->ko, name, len) == 0;
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
typedef struct fast_codes {
    int n;          /* number of raw codes, or -1: use code_match */
    uint32_t raw[4];
} fast_codes;

static void fast_codes_init(fast_codes *fc, const rmq_scan_args *a) {
    fc->n = -1;
    if (!a->filter || a->ncodes > 4) return;
    fc->n = a->ncodes;
    for (int i = 0; i < a->ncodes; i++) {
        uint32_t be = __builtin_bswap32((uint32_t)a->codes[i]);
        fc->raw[i] = be;
    }
}

/* Number of leading units of `up[0 .. count)` that are written (phy >= 0, size > 0) and whose
 * tag code is not subscribed: they are examined and rejected without touching the CommitLog. */
static inline int64_t skip_rejected(const uint8_t *up, int64_t count, const rmq_scan_args *a,
                                    const fast_codes *fc) {
    int64_t i = 0;
    if (fc->n == 1) {
        uint32_t c0 = fc->raw[0];
        for (; i < count; i++, up += CQ_UNIT) {
            uint32_t raw;
            memcpy(&raw, up + 16, 4);
            if (raw == c0 || (up[0] & 0x80) || rd_i32(up + 8) <= 0) break;
        }
        return i;
    }
    if (fc->n >= 0) {
        for (; i < count; i++, up += CQ_UNIT) {
            uint32_t raw;
            memcpy(&raw, up + 16, 4);
            int hit = 0;
            for (int k = 0; k < fc->n; k++) hit |= raw == fc->raw[k];
            if (hit || (up[0] & 0x80) || rd_i32(up + 8) <= 0) break;
        }
        return i;
    }
    for (; i < count; i++, up += CQ_UNIT) {
        if ((up[0] & 0x80) || rd_i32(up + 8) <= 0 || code_match(a, s32(be32(up + 16)))) break;
    }
    return i;
}

#define LOOKAHEAD_UNITS 1024

static inline void prefetch_record(const rmq_segment *seg, int64_t pos, int64_t size) {
    if (pos < 0 || size <= 0 || size > seg->size - pos) return;
    const uint8_t *p = seg->base + pos;
    int64_t head = size < 1536 ? size : 1536;
    for (int64_t off = 0; off < head; off += 64) __builtin_prefetch(p + off, 0, 3);
    if (size > head) { /* the properties at the tail */
        __builtin_prefetch(p + size - 1, 0, 3);
        __builtin_prefetch(p + size - 129, 0, 3);
    }
}

static inline void prefetch_unit_record(const rmq_files *cl, const uint8_t *u) {
    int64_t phy = rd_i64(u), idx;
    rmq_segment *seg = files_seg(cl, phy, &idx);
    if (seg) prefetch_record(seg, phy - seg->file_start, rd_i32(u + 8));
}

enum { ROW_ACCEPTED = 0, ROW_REJECTED = 1, ROW_FULL = 2 };

/* After the first row: reserve every variable-size buffer for the expected row count (first row's
 * usage x row capacity, +25%), so a batch is not regrown (and copied) a dozen times. */
static int presize_from_first_row(scanner *sc) {
    rmq_batch *b = sc->b;
    b->bufs[RMQ_B_KEYITEM_OFF].len = (b->key_items + 1) * 4;
    b->bufs[RMQ_B_PKEY_OFF].len = (b->prop_items + 1) * 4;
    b->bufs[RMQ_B_PVAL_OFF].len = (b->prop_items + 1) * 4;
    for (int i = 0; i < RMQ_NBUF; i++) {
        if (row_width(i) != 0 || i == RMQ_B_BODY_DATA) continue; /* body: sized from the CQ */
        rmq_buf *buf = &b->bufs[i];
        int64_t want = (buf->len + 8) * (sc->rowcap + sc->rowcap / 4);
        /* no column can hold more than max_bytes + the row that crossed it */
        if (want > sc->a->max_bytes + buf->len) want = sc->a->max_bytes + buf->len;
        if (want > buf->cap && buf_grow(buf, want)) return RMQ_E_NOMEM;
    }
    return RMQ_OK;
}

/* Decode record r (already structurally validated) into the batch. Returns ROW_* or an error
 * code (>= RMQ_E_ARG, offset by 100 to keep the spaces apart). */
static int emit_row(scanner *sc, const rec *r, int64_t qoff, const rmq_segment *clseg,
                    int64_t clpos, rmq_error *err) {
    const rmq_scan_args *a = sc->a;
    rmq_batch *b = sc->b;
    const uint8_t *ps = r->props;
    int64_t bad = utf8_invalid_at(r->topic, r->topic_len);
    if (bad >= 0)
        return 100 + set_err(err, RMQ_E_BAD_UTF8, clseg->path, clpos, r->phy, qoff,
                             "topic is not valid UTF-8 (byte %lld of the topic)", (long long)bad);
    bad = utf8_invalid_at(ps, r->prop_len);
    if (bad >= 0)
        return 100 + set_err(err, RMQ_E_BAD_UTF8, clseg->path, clpos, r->phy, qoff,
                             "properties are not valid UTF-8 (byte %lld of the properties)",
                             (long long)bad);
    int64_t np = parse_props(sc, ps, r->prop_len);
    if (np < 0) return 100 + set_err(err, RMQ_E_NOMEM, NULL, -1, -1, -1, "out of memory");
    const prop *tags = NULL, *keys = NULL, *uniq = NULL;
    for (int64_t i = 0; i < np; i++) {
        const prop *e = &sc->props[i];
        if (e->kl == 4 && key_is(ps, e, "TAGS", 4)) tags = e;
        else if (e->kl == 4 && key_is(ps, e, "KEYS", 4)) keys = e;
        else if (e->kl == 8 && key_is(ps, e, "UNIQ_KEY", 8)) uniq = e;
    }
    if (a->check_tags) {
        int ok = 0;
        if (tags)
            for (int32_t i = 0; i < a->ntags && !ok; i++)
                ok = a->tag_lens[i] == (int32_t)tags->vl &&
                     memcmp(a->tags[i], ps + tags->vo, tags->vl) == 0;
        if (!ok) return ROW_REJECTED;
    }
    if (a->verify_crc) {
        int32_t c = body_crc(r->body, r->body_len);
        if (c != r->body_crc)
            return 100 + set_err(err, RMQ_E_CRC_MISMATCH, clseg->path, clpos, r->phy, qoff,
                                 "BODYCRC %d differs from crc32(body) & 0x7FFFFFFF = %d",
                                 r->body_crc, c);
    }
    /* max_bytes accounting: body + properties + fixed-size strings of this row */
    int64_t row_bytes = (int64_t)r->body_len + r->prop_len + (2 * r->sh + 16) + 2 * 52;
    if (b->rows > 0 && b->data_bytes + row_bytes > a->max_bytes) return ROW_FULL;

    int64_t row = b->rows;
    if (row + 1 >= sc->rowcap) {
        if (batch_row_capacity(b, 2 * sc->rowcap + 8))
            return 100 + set_err(err, RMQ_E_NOMEM, NULL, -1, -1, -1, "out of memory");
        sc->rowcap = 2 * sc->rowcap + 8;
    }
    int64_t pl = r->prop_len;
    /* item offset arrays are written by index; keep len at the used size for buf_reserve */
    b->bufs[RMQ_B_KEYITEM_OFF].len = (b->key_items + 1) * 4;
    b->bufs[RMQ_B_PKEY_OFF].len = (b->prop_items + 1) * 4;
    b->bufs[RMQ_B_PVAL_OFF].len = (b->prop_items + 1) * 4;
    if (buf_reserve(&b->bufs[RMQ_B_MSGID_DATA], 64) || buf_reserve(&b->bufs[RMQ_B_BODY_DATA], r->body_len) ||
        buf_reserve(&b->bufs[RMQ_B_BORNHOST_DATA], 64) ||
        buf_reserve(&b->bufs[RMQ_B_STOREHOST_DATA], 64) ||
        (uniq && buf_reserve(&b->bufs[RMQ_B_UNIQ_DATA], uniq->vl)) ||
        (tags && buf_reserve(&b->bufs[RMQ_B_TAGS_DATA], tags->vl)) ||
        (keys && (buf_reserve(&b->bufs[RMQ_B_KEYITEM_DATA], keys->vl) ||
                  buf_reserve(&b->bufs[RMQ_B_KEYITEM_OFF], 4 * ((int64_t)keys->vl / 2 + 2)))) ||
        buf_reserve(&b->bufs[RMQ_B_PKEY_DATA], pl) || buf_reserve(&b->bufs[RMQ_B_PVAL_DATA], pl) ||
        buf_reserve(&b->bufs[RMQ_B_PKEY_OFF], 4 * (np + 1)) ||
        buf_reserve(&b->bufs[RMQ_B_PVAL_OFF], 4 * (np + 1)))
        return 100 + set_err(err, RMQ_E_NOMEM, NULL, -1, -1, -1, "out of memory");

    rmq_buf *B = b->bufs;
    int32_t i32;
    int64_t i64;
#define PUT32(id, v) (i32 = (v), memcpy(B[id].data + row * 4, &i32, 4))
#define PUT64(id, v) (i64 = (v), memcpy(B[id].data + row * 8, &i64, 8))
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

    {
        rmq_buf *d = &B[RMQ_B_BORNHOST_DATA];
        d->len += format_host_cached(&sc->born, (char *)d->data + d->len, r->born_host, r->bh);
        put_off(&B[RMQ_B_BORNHOST_OFF], row + 1, d->len);
        d = &B[RMQ_B_STOREHOST_DATA];
        d->len += format_host_cached(&sc->store, (char *)d->data + d->len, r->store_host, r->sh);
        put_off(&B[RMQ_B_STOREHOST_OFF], row + 1, d->len);
    }
    /* msgId: hex(store host field) + hex(physical offset), uppercase (§5.1); the host part comes
     * from the cache just refreshed above */
    {
        rmq_buf *d = &B[RMQ_B_MSGID_DATA];
        char *o = (char *)d->data + d->len;
        memcpy(o, sc->store.hex, (size_t)(2 * r->sh));
        o += 2 * r->sh;
        hex16(o, be64(r->p + 28));
        o += 16;
        d->len = (uint8_t *)o - d->data;
        put_off(&B[RMQ_B_MSGID_OFF], row + 1, d->len);
    }
    append_str(&B[RMQ_B_BODY_OFF], &B[RMQ_B_BODY_DATA], row, r->body, r->body_len);
    if (uniq) {
        append_str(&B[RMQ_B_UNIQ_OFF], &B[RMQ_B_UNIQ_DATA], row, ps + uniq->vo, uniq->vl);
        set_valid(&B[RMQ_B_UNIQ_VALID], row);
    } else {
        put_off(&B[RMQ_B_UNIQ_OFF], row + 1, B[RMQ_B_UNIQ_DATA].len);
        b->null_uniq++;
    }
    if (tags) {
        append_str(&B[RMQ_B_TAGS_OFF], &B[RMQ_B_TAGS_DATA], row, ps + tags->vo, tags->vl);
        set_valid(&B[RMQ_B_TAGS_VALID], row);
    } else {
        put_off(&B[RMQ_B_TAGS_OFF], row + 1, B[RMQ_B_TAGS_DATA].len);
        b->null_tags++;
    }
    {
        int64_t words = 0;
        if (keys) {
            const uint8_t *k = ps + keys->vo, *kend = k + keys->vl;
            while (k < kend) {
                const uint8_t *sp = memchr(k, ' ', (size_t)(kend - k));
                const uint8_t *we = sp ? sp : kend;
                if (we > k) {
                    append_str(&B[RMQ_B_KEYITEM_OFF], &B[RMQ_B_KEYITEM_DATA], b->key_items, k,
                               we - k);
                    b->key_items++;
                    words++;
                }
                if (!sp) break;
                k = sp + 1;
            }
        }
        if (words) set_valid(&B[RMQ_B_KEYS_VALID], row);
        else b->null_keys++;
        put_off(&B[RMQ_B_KEYS_OFF], row + 1, b->key_items);
    }
    for (int64_t i = 0; i < np; i++) {
        const prop *e = &sc->props[i];
        append_str(&B[RMQ_B_PKEY_OFF], &B[RMQ_B_PKEY_DATA], b->prop_items, ps + e->ko, e->kl);
        append_str(&B[RMQ_B_PVAL_OFF], &B[RMQ_B_PVAL_DATA], b->prop_items, ps + e->vo, e->vl);
        b->prop_items++;
    }
    put_off(&B[RMQ_B_PROPS_OFF], row + 1, b->prop_items);
    b->rows = row + 1;
    b->data_bytes += row_bytes;
    if (row == 0 && presize_from_first_row(sc))
        return 100 + set_err(err, RMQ_E_NOMEM, NULL, -1, -1, -1, "out of memory");
    return ROW_ACCEPTED;
}

/* ------------------------------------------------------------------------------------------ */
/* Queue scan                                                                                  */

int rmq_scan_queue(const rmq_files *cl, const rmq_files *cq, const rmq_scan_args *a,
                   rmq_batch **out, rmq_error *err) {
    clear_err(err);
    if (out) *out = NULL;
    int rc = check_files(cl, "CommitLog", err);
    if (rc) return rc;
    rc = check_files(cq, "ConsumeQueue", err);
    if (rc) return rc;
    if (!out || !a || a->start < 0 || a->end < a->start || a->end > INT64_MAX / CQ_UNIT ||
        a->max_rows < 1 || a->max_bytes < 1 || a->max_bytes > INT32_MAX ||
        (a->filter && a->ncodes > 0 && !a->codes) ||
        (a->check_tags && (!a->filter || (a->ntags > 0 && (!a->tags || !a->tag_lens)))))
        return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "bad scan arguments");

    /* Size the batch up front from the CQ unit sizes (an upper bound of the body bytes) so the
     * buffers are not regrown; a filtered scan accepts few rows, start small. */
    int64_t hint_rows = 64, hint_bytes = 0;
    if (!a->filter) {
        int64_t m = a->start;
        while (m < a->end && m - a->start < a->max_rows && hint_bytes < a->max_bytes) {
            unit u;
            if (cq_unit_at(cq, m, &u, NULL, NULL, NULL) != RMQ_OK || !unit_valid(&u) ||
                unit_preblank(&u))
                break;
            hint_bytes += u.size;
            m++;
        }
        hint_rows = m - a->start;
        if (hint_bytes > a->max_bytes) hint_bytes = a->max_bytes;
    }
    if (hint_rows < 64) hint_rows = 64;
    scanner sc = {a, batch_new(hint_rows + 8), NULL, 0, NULL, 0, hint_rows + 8, {0}, {0}};
    if (!sc.b) return set_err(err, RMQ_E_NOMEM, NULL, -1, -1, -1, "out of memory");
    rmq_batch *b = sc.b;
    if (hint_bytes > 0 && buf_reserve(&b->bufs[RMQ_B_BODY_DATA], hint_bytes)) {
        rmq_batch_free(b);
        return set_err(err, RMQ_E_NOMEM, NULL, -1, -1, -1, "out of memory");
    }
    int64_t cl_min = cl->count ? cl->segs[0]->file_start : 0;
    int status = RMQ_ST_END;
    int64_t n = a->start;
    int code = RMQ_OK;
    fast_codes fc;
    fast_codes_init(&fc, a);
    int64_t known_stop = -1; /* filtered scans: next unit where skipping stops, when known */

    while (n < a->end) {
        /* locate the CQ file of unit n and walk the units it holds */
        unit u0;
        const rmq_segment *cseg = NULL;
        int64_t cpos = 0;
        int r0 = cq_unit_at(cq, n, &u0, &cseg, &cpos, err);
        if (r0 == -1) {
            status = RMQ_ST_CQ_END;
            break;
        }
        if (r0) {
            code = r0;
            break;
        }
        int64_t in_file = (cseg->size - cpos) / CQ_UNIT;
        int64_t stop = n + in_file < a->end ? n + in_file : a->end;
        const uint8_t *up = cseg->base + cpos;
        int done = 0;
        for (; n < stop; n++, up += CQ_UNIT) {
            if (a->filter) {
                /* the hot loop of a tag-filtered scan: pass over rejected units (or jump to the
                 * stop point the look-ahead below already found) */
                int64_t skip = known_stop > n && known_stop < stop
                                   ? known_stop - n
                                   : skip_rejected(up, stop - n, a, &fc);
                n += skip;
                up += skip * CQ_UNIT;
                if (n == stop) break;
            }
            /* a queue's records are interleaved with other queues' in the CommitLog: fetch ahead */
            if (!a->filter && n + 4 < stop) prefetch_unit_record(cl, up + 4 * CQ_UNIT);
            int64_t phy = rd_i64(up);
            int32_t size = rd_i32(up + 8);
            if (phy < 0 || size <= 0) {
                status = RMQ_ST_CQ_END;
                done = 1;
                break;
            }
            if (a->filter) {
                int32_t code32 = s32(be32(up + 16)); /* low 32 bits of tagsCode */
                if (!code_match(a, code32)) continue;
            }
            if (phy == 0 && size == PREBLANK_SIZE && rd_i64(up + 12) == 0) continue;
            if (phy < cl_min) {
                status = RMQ_ST_CL_GONE;
                done = 1;
                break;
            }
            if (b->rows >= a->max_rows) {
                status = RMQ_ST_FULL;
                done = 1;
                break;
            }
            const char *cq_path = cseg->path;
            int64_t upos = (int64_t)(up - cseg->base);
            rmq_segment *clseg = files_seg(cl, phy, NULL);
            rec r;
            if (!clseg) {
                code = locate_record(cl, phy, size, &r, n, cq_path, upos, err);
                done = 1;
                break;
            }
            int64_t clpos = phy - clseg->file_start;
            if (a->filter) {
                /* Accepted records are far apart: their bytes are cold. Ask for this record's
                 * lines now, and find and ask for the next accepted record, so that memory
                 * latency overlaps decoding instead of stalling the header's dependent reads. */
                prefetch_record(clseg, clpos, size);
                if (known_stop <= n && n + 1 < stop) {
                    int64_t limit = stop - n - 1 < LOOKAHEAD_UNITS ? stop - n - 1 : LOOKAHEAD_UNITS;
                    int64_t k = skip_rejected(up + CQ_UNIT, limit, a, &fc);
                    known_stop = k < limit ? n + 1 + k : -1;
                    if (known_stop > 0) prefetch_unit_record(cl, up + (k + 1) * CQ_UNIT);
                }
            }
            code = parse_record(clseg, clpos, size, &r, phy, n, err);
            if (code) {
                done = 1;
                break;
            }
            int e = emit_row(&sc, &r, n, clseg, clpos, err);
            if (e == ROW_REJECTED) continue;
            if (e == ROW_FULL) {
                status = RMQ_ST_FULL;
                done = 1;
                break;
            }
            if (e >= 100) {
                code = e - 100;
                done = 1;
                break;
            }
        }
        if (done) break;
    }
    free(sc.props);
    free(sc.hash);
    if (code) {
        rmq_batch_free(b);
        return code;
    }
    b->next_offset = n;
    b->scanned = n - a->start;
    b->status = status;
    /* exact lengths for the Arrow wrappers */
    int64_t rows = b->rows;
    for (int i = 0; i < RMQ_NBUF; i++) {
        int w = row_width(i);
        if (w > 0) b->bufs[i].len = (rows + (is_offsets(i) ? 1 : 0)) * w;
        else if (w < 0) b->bufs[i].len = (rows + 7) / 8;
    }
    b->bufs[RMQ_B_KEYITEM_OFF].len = (b->key_items + 1) * 4;
    b->bufs[RMQ_B_PKEY_OFF].len = (b->prop_items + 1) * 4;
    b->bufs[RMQ_B_PVAL_OFF].len = (b->prop_items + 1) * 4;
    *out = b;
    return RMQ_OK;
}
