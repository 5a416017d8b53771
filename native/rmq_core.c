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
 *   Valid iff phy >= 0 && size > 0 (§2.4). Pre-blank filler units (0, 0x7FFFFFFF, 0) are
 *   skipped where the broker writes them, as the leading run of the queue's first file (§7.4:
 *   ConsumeQueue.fillPreBlank); one anywhere else (after a written unit) is BAD_UNIT.
 *   The record a unit points to must be that unit's message (else UNIT_MISMATCH): PHYSICALOFFSET
 *   equal to the unit's physical offset, always; and when the scan knows its queue (check_queue),
 *   TOPIC, QUEUEID and QUEUEOFFSET equal to the queue's topic, id and the unit's queue offset
 *   (§7.1, Appendix A.3 step 5), or, for light message queues and other multi-dispatch queues
 *   whose units point at the parent topic's records (§14 item 18), the queue's topic listed in
 *   the INNER_MULTI_DISPATCH property with the unit's queue offset at the same index of
 *   INNER_MULTI_QUEUE_OFFSET (§4.2, both comma-separated) and QUEUEID equal to the queue id or
 *   the queue id 0.
 *
 * Safety: every read is bounds-checked against the mapping; a bad record yields an error code and
 * a message naming the file, the byte position and the physical/queue offset, never a crash and
 * never a silent skip. Files are mapped PROT_READ/MAP_SHARED; the mapping must not be truncated
 * underneath us (the broker never shrinks a file; it only deletes whole files, which is harmless
 * for an existing mapping). Built with -DRMQ_HEAP_SEGMENTS (the sanitizer build) files are read
 * into exact-size heap buffers instead, so AddressSanitizer checks every read against file ends.
 *
 * Output: rmq_scan_queue fills an rmq_batch of 64-byte aligned Arrow buffers (see rmq_core.h);
 * rmq_batch_export hands them to Arrow through the C Data Interface (one struct array, zero
 * copy; its release callback frees the batch). Large freed buffers are pooled for the next scan.
 *
 * Speed (bench/bench_core.py; the decode is bound by memory traffic, then by instructions):
 *  - a record's structural checks are done once, branch-light (parse_fast); only a record that
 *    fails them goes through parse_record, which finds the exact error;
 *  - properties: a row with the same property names in the same order as the last row (its
 *    "shape", props_tpl), and usually the same layout, is matched rather than parsed; other rows
 *    are split in one SIMD pass that also tells whether they are ASCII (non-ASCII text gets the
 *    full UTF-8 validator); map entries are appended as they are found;
 *  - output: buffers are sized ahead (from the ConsumeQueue unit sizes that the records they
 *    point to confirm - a unit's size alone never sizes a buffer, see unit_bytes_checked - then
 *    from the first row), so a row does one capacity check for its body and one for all short
 *    strings; the row-indexed columns are staged 16 rows at a time and written as whole cache
 *    lines, and in a
 *    big batch the body column and those lines go out with streaming stores (no read of the
 *    destination lines first); the short-string buffers are prefetched for writing;
 *  - the CommitLog record of a unit is prefetched a few units ahead;
 *  - tag-filtered scans first collect the units whose tag hash matches (a branch-light loop over
 *    the 20-byte units), then decode the matches with their records prefetched.
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

#if defined(__SSE2__) && !defined(RMQ_PORTABLE)
#include <emmintrin.h>
#define RMQ_SSE2 1
#else
#define RMQ_SSE2 0
#endif

#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

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

typedef struct span { int64_t o, l; } span; /* offset and length in a string; l < 0: none */

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

/* The checks of parse_record for a record that has a ConsumeQueue size, reduced to a few
 * predictable branches: 1 when the record is well formed (r filled), 0 when it is not (call
 * parse_record for the precise error). Reads only bytes that earlier checks put inside the file. */
static inline __attribute__((always_inline)) int parse_fast(const rmq_segment *seg, int64_t pos,
                                                             int32_t size, rec *r) {
    if (unlikely(pos < 0 || pos > seg->size - 8)) return 0;
    const uint8_t *p = seg->base + pos;
    uint32_t magic = be32(p + 4);
    int32_t total = rd_i32(p);
    int v2 = magic == MAGIC_V2;
    /* total >= 91: the smallest V1 record; the header fields read below lie inside it */
    if (unlikely((magic != MAGIC_V1 && !v2) | (total != size) | (total < 91) |
                 ((int64_t)total > seg->size - pos)))
        return 0;
    int tl = 1 + v2;
    int32_t sysflag = rd_i32(p + 36);
    int bh = (sysflag & 0x10) ? 20 : 8;
    int sh = (sysflag & 0x20) ? 20 : 8;
    int32_t fixed = 72 + bh + sh; /* start of BODY */
    if (unlikely(fixed + tl + 2 > total)) return 0;
    int32_t body_len = rd_i32(p + fixed - 4);
    /* unsigned compares also reject negative lengths */
    if (unlikely((uint32_t)body_len > (uint32_t)(total - fixed - tl - 2))) return 0;
    int32_t q = fixed + body_len;
    int32_t topic_len = v2 ? (int32_t)rd_i16(p + q) : (p[q] <= 0x7F ? (int32_t)p[q] : -1);
    q += tl;
    if (unlikely((uint32_t)topic_len > (uint32_t)(total - q - 2))) return 0;
    q += topic_len;
    int32_t prop_len = rd_i16(p + q);
    if (unlikely(prop_len != total - q - 2)) return 0; /* the length rule */
    r->p = p;
    r->total = total;
    r->magic = magic;
    r->body_crc = rd_i32(p + 8);
    r->queue_id = rd_i32(p + 12);
    r->flag = rd_i32(p + 16);
    r->queue_offset = rd_i64(p + 20);
    r->phy = rd_i64(p + 28);
    r->sysflag = sysflag;
    r->born_ts = rd_i64(p + 40);
    r->bh = bh;
    r->sh = sh;
    r->born_host = p + 48;
    r->store_ts = rd_i64(p + 48 + bh);
    r->store_host = p + 56 + bh;
    r->reconsume = rd_i32(p + 56 + bh + sh);
    r->prepared = rd_i64(p + 60 + bh + sh);
    r->body = p + fixed;
    r->body_len = body_len;
    r->topic = p + fixed + body_len + tl;
    r->topic_len = topic_len;
    r->props = p + q + 2;
    r->prop_len = prop_len;
    return 1;
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

/* ------------------------------------------------------------------------------------------ */
/* Does the record belong to the unit pointing at it? (§7.1, §14 item 18)                      */

/* " (ConsumeQueue unit: file F, position P)" when the unit's file is known, else "". */
static void unit_ref(char *out, size_t cap, const char *cq_path, int64_t cq_pos) {
    if (cq_path)
        snprintf(out, cap, " (the ConsumeQueue unit pointing at it: file %s, position %lld)",
                 cq_path, (long long)cq_pos);
    else
        out[0] = 0;
}

/* UNIT_MISMATCH for a record whose PHYSICALOFFSET field is not the address it was read at.
 * The error names the record (CommitLog file, position) and the unit's queue offset. */
static __attribute__((cold, noinline)) int phy_mismatch(rmq_error *err, const rmq_segment *clseg,
                                                        int64_t clpos, const rec *r, int64_t phy,
                                                        int64_t qoff, const char *cq_path,
                                                        int64_t cq_pos) {
    char ref[600];
    unit_ref(ref, sizeof ref, cq_path, cq_pos);
    return set_err(err, RMQ_E_UNIT_MISMATCH, clseg->path, clpos, phy, qoff,
                   "record PHYSICALOFFSET %lld is not its physical offset %lld%s",
                   (long long)r->phy, (long long)phy, ref);
}

/* Value of property `name` in properties s[0..n) (§4.1: entries split on 0x02, name and value
 * split at the first 0x01, both non-empty, a later duplicate wins): 1 and *out, or 0. */
static int find_prop(const uint8_t *s, int64_t n, const char *name, int64_t nl, span *out) {
    int found = 0;
    const uint8_t *base = s, *end = s + n;
    while (s < end) {
        const uint8_t *e = memchr(s, 0x02, (size_t)(end - s));
        if (!e) e = end;
        const uint8_t *sep = memchr(s, 0x01, (size_t)(e - s));
        if (sep && sep - s == nl && sep + 1 < e && memcmp(s, name, (size_t)nl) == 0) {
            out->o = sep + 1 - base;
            out->l = e - (sep + 1);
            found = 1;
        }
        if (e == end) break;
        s = e + 1;
    }
    return found;
}

/* s[0..n) is a decimal number (ASCII digits only, at least one) equal to v (>= 0). */
static int decimal_is(const uint8_t *s, int64_t n, int64_t v) {
    if (n <= 0) return 0;
    int64_t x = 0;
    for (int64_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        int d = s[i] - '0';
        if (x > (INT64_MAX - d) / 10) return 0;
        x = x * 10 + d;
    }
    return x == v;
}

/* Whether the record lists queue (a->topic, a->queue_id) at queue offset n among its
 * multi-dispatch targets: INNER_MULTI_DISPATCH holds queue (topic) names and
 * INNER_MULTI_QUEUE_OFFSET their offsets, comma-separated, position-aligned (§4.2). The broker
 * files such a unit under the parent's QUEUEID, or under queue 0 for a light message queue. */
static int multi_dispatch_lists(const rmq_scan_args *a, const rec *r, int64_t n) {
    span qs, os;
    if (a->queue_id != 0 && a->queue_id != r->queue_id) return 0;
    if (!find_prop(r->props, r->prop_len, "INNER_MULTI_DISPATCH", 20, &qs) ||
        !find_prop(r->props, r->prop_len, "INNER_MULTI_QUEUE_OFFSET", 24, &os))
        return 0;
    const uint8_t *q = r->props + qs.o, *qe = q + qs.l;
    const uint8_t *o = r->props + os.o, *oe = o + os.l;
    for (;;) {
        const uint8_t *qc = memchr(q, ',', (size_t)(qe - q));
        const uint8_t *oc = memchr(o, ',', (size_t)(oe - o));
        if (!qc) qc = qe;
        if (!oc) oc = oe;
        if (qc - q == a->topic_len && memcmp(q, a->topic, (size_t)a->topic_len) == 0 &&
            decimal_is(o, oc - o, n))
            return 1;
        if (qc == qe || oc == oe) return 0;
        q = qc + 1;
        o = oc + 1;
    }
}

/* The record's own queue is (a->topic, a->queue_id) and its QUEUEOFFSET is n: the common case,
 * a few compares. */
static inline int record_of_queue(const rmq_scan_args *a, const rec *r, int64_t n) {
    return r->queue_offset == n && r->queue_id == a->queue_id && r->topic_len == a->topic_len &&
           memcmp(r->topic, a->topic, (size_t)a->topic_len) == 0;
}

/* RMQ_OK when record r (read at physical offset phy) is the message of unit n, else
 * UNIT_MISMATCH naming the record and the unit. Called when the fast checks failed. */
static __attribute__((cold, noinline)) int unit_mismatch(const rmq_scan_args *a, const rec *r,
                                                         int64_t phy, int64_t n,
                                                         const rmq_segment *clseg, int64_t clpos,
                                                         const char *cq_path, int64_t cq_pos,
                                                         rmq_error *err) {
    if (r->phy != phy) return phy_mismatch(err, clseg, clpos, r, phy, n, cq_path, cq_pos);
    if (!a->check_queue || record_of_queue(a, r, n) || multi_dispatch_lists(a, r, n))
        return RMQ_OK;
    char ref[600];
    unit_ref(ref, sizeof ref, cq_path, cq_pos);
    int tl = r->topic_len < 100 ? (int)r->topic_len : 100;
    int ql = a->topic_len < 100 ? (int)a->topic_len : 100;
    return set_err(err, RMQ_E_UNIT_MISMATCH, clseg->path, clpos, phy, n,
                   "record of topic '%.*s'%s, queue %d, QUEUEOFFSET %lld is not the message of "
                   "queue '%.*s'%s/%d at queue offset %lld%s",
                   tl, (const char *)r->topic, r->topic_len > tl ? "..." : "", r->queue_id,
                   (long long)r->queue_offset, ql, a->topic, a->topic_len > ql ? "..." : "",
                   a->queue_id, (long long)n, ref);
}

/* Locate the record at physical offset phy; errors name the CommitLog file when it exists. The
 * record's PHYSICALOFFSET must be phy (UNIT_MISMATCH). */
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
    int64_t pos = phy - seg->file_start;
    int rc = parse_record(seg, pos, size, r, phy, qoff, err);
    if (rc) return rc;
    if (unlikely(r->phy != phy)) return phy_mismatch(err, seg, pos, r, phy, qoff, cq_path, cq_pos);
    return RMQ_OK;
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

/* ------------------------------------------------------------------------------------------ */
/* Growable, 64-byte aligned buffers                                                           */

/* Pool of large freed buffers. Batches are usually dropped soon after they are consumed; handing
 * their buffers to the next scan avoids fresh pages (page faults + kernel zeroing cost about as
 * much as the decode itself). Buffers from 64 KiB up are pooled (malloc serves those with fresh
 * mappings that it returns to the kernel on free); smaller ones go back to malloc. */
#define POOL_MIN_CAP ((int64_t)64 << 10)
#define POOL_SLOTS 128
#define POOL_MAX_BYTES ((int64_t)384 << 20)
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static struct { uint8_t *data; int64_t cap; } pool[POOL_SLOTS];
static int pool_n;
static int64_t pool_bytes;
static int64_t live_batches; /* atomic: batches allocated and not yet freed */
static int64_t buffer_bytes; /* atomic: bytes of batch buffers ever taken (pool or allocator) */

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

/* Grow b to hold `need` bytes (capacity doubled until it does), keeping its first `keep` bytes.
 * A big buffer starts `skew` bytes into its allocation, a different multiple of 64 below 4096 for
 * each buffer id: a batch's columns are written side by side, row after row, and buffers that
 * all start at the same offset in their pages would compete for the same few cache sets (the
 * fixed-width columns alone cost a third of the decode time that way). */
#define SKEW_MIN_CAP ((int64_t)16 << 10)
static int buf_grow_keep(rmq_buf *b, int64_t need, int64_t keep) {
    int64_t cap = b->cap ? b->cap : ALIGN;
    while (cap < need) {
        if (cap > INT64_MAX / 2) return RMQ_E_NOMEM;
        cap *= 2;
    }
    cap = (cap + ALIGN - 1) / ALIGN * ALIGN;
    int32_t skew = cap >= SKEW_MIN_CAP ? ((b->id * 7) % 64) * 64 : 0;
    int64_t got = 0;
    uint8_t *m = pool_take(cap + skew, &got);
    if (m) {
        cap = got - skew;
    } else {
        void *v = NULL;
        if (posix_memalign(&v, ALIGN, (size_t)(cap + skew)) != 0) return RMQ_E_NOMEM;
        m = (uint8_t *)v;
    }
    __atomic_add_fetch(&buffer_bytes, cap + skew, __ATOMIC_RELAXED);
    if (keep > 0) memcpy(m + skew, b->data, (size_t)keep);
    pool_put(b->mem, b->cap + b->skew);
    b->mem = m;
    b->skew = skew;
    b->data = m + skew;
    b->cap = cap;
    return RMQ_OK;
}

/* Data buffers: keep what is used. */
static int buf_grow(rmq_buf *b, int64_t need) { return buf_grow_keep(b, need, b->len); }

static inline int buf_reserve(rmq_buf *b, int64_t extra) {
    if (likely(b->len + extra <= b->cap)) return RMQ_OK;
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
    for (int i = 0; i < RMQ_NBUF; i++)
        pool_put(batch->bufs[i].mem, batch->bufs[i].cap + batch->bufs[i].skew);
    free(batch);
    __atomic_sub_fetch(&live_batches, 1, __ATOMIC_RELAXED);
}

int64_t rmq_live_batches(void) { return __atomic_load_n(&live_batches, __ATOMIC_RELAXED); }

int64_t rmq_buffer_bytes_taken(void) { return __atomic_load_n(&buffer_bytes, __ATOMIC_RELAXED); }

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

/* Bytes a row-indexed buffer needs for `rows` rows (offsets: rows + 1 entries), 0 for others. */
static int64_t row_bytes_for(int id, int64_t rows) {
    int w = row_width(id);
    if (w > 0) return (rows + (is_offsets(id) ? 1 : 0)) * w;
    if (w < 0) return (rows + 7) / 8;
    return 0;
}

/* Make room for `rows` rows in every row-indexed buffer. */
static int batch_row_capacity(rmq_batch *b, int64_t rows) {
    for (int i = 0; i < RMQ_NBUF; i++) {
        int64_t need = row_bytes_for(i, rows);
        if (need > b->bufs[i].cap) {
            /* row-indexed buffers keep len 0 while scanning: preserve the rows written so far */
            int64_t used = row_bytes_for(i, b->rows);
            if (buf_grow_keep(&b->bufs[i], need, used)) return RMQ_E_NOMEM;
            if (row_width(i) < 0) memset(b->bufs[i].data + used, 0, (size_t)(b->bufs[i].cap - used));
        }
    }
    return RMQ_OK;
}

/* An empty batch whose row-indexed buffers hold `rows` rows; bitmaps zeroed, offsets at 0. */
static rmq_batch *batch_new(int64_t rows) {
    rmq_batch *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    __atomic_add_fetch(&live_batches, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < RMQ_NBUF; i++) b->bufs[i].id = i;
    for (int i = 0; i < RMQ_NBUF; i++) {
        int64_t need = row_bytes_for(i, rows);
        if (buf_grow_keep(&b->bufs[i], need > ALIGN ? need : ALIGN, 0)) goto fail;
        if (row_width(i) < 0)
            memset(b->bufs[i].data, 0, (size_t)b->bufs[i].cap);
        else
            memset(b->bufs[i].data, 0, 8); /* the first offset entry */
        if (is_offsets(i)) b->bufs[i].len = 4;
    }
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

/* A row that would cross max_bytes: decided exactly as if it were decoded (a properties UTF-8
 * error, a TAGS mismatch and a CRC error come first), without emitting it. */
static int row_over_budget(scanner *sc, const rec *r, int64_t qoff, const rmq_segment *clseg,
                           int64_t clpos, rmq_error *err) {
    const rmq_scan_args *a = sc->a;
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

    /* the map first: the tag check below may still take the row back */
    int64_t items0 = b->prop_items;
    int64_t kd0 = B[RMQ_B_PKEY_DATA].len, vd0 = B[RMQ_B_PVAL_DATA].len;
    props_out po;
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

    put_host(&sc->born, sc->stage[RMQ_B_BORNHOST_OFF], &B[RMQ_B_BORNHOST_DATA], row,
             r->born_host, r->bh);
    put_host(&sc->store, sc->stage[RMQ_B_STOREHOST_OFF], &B[RMQ_B_STOREHOST_DATA], row,
             r->store_host, r->sh);
    /* msgId: hex(store host field) + hex(physical offset), uppercase (§5.1); the host part comes
     * from the cache just refreshed above */
    {
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
        (a->check_tags && (!a->filter || (a->ntags > 0 && (!a->tags || !a->tag_lens)))) ||
        (a->check_queue && (!a->topic || a->topic_len < 1)))
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
    memset(&sc, 0, sizeof sc);
    sc.a = a;
    sc.rowcap = hint_rows + 8;
    sc.b = batch_new(sc.rowcap);
    if (!sc.b) return set_err(err, RMQ_E_NOMEM, NULL, -1, -1, -1, "out of memory");
    rmq_batch *b = sc.b;
    if (hint_bytes > 0 && buf_reserve(&b->bufs[RMQ_B_BODY_DATA], hint_bytes)) {
        rmq_batch_free(b);
        return set_err(err, RMQ_E_NOMEM, NULL, -1, -1, -1, "out of memory");
    }
    sc.cl_min = cl->count ? cl->segs[0]->file_start : 0;
    sc.cq = cq;
    sc.lead_end = -1;
    if (a->check_queue && a->topic_len <= 16) {
        uint8_t w[16] = {0}, m[16] = {0};
        memcpy(w, a->topic, (size_t)a->topic_len);
        memset(m, 0xFF, (size_t)a->topic_len);
        memcpy(sc.topic_w, w, 16);
        memcpy(sc.topic_m, m, 16);
        sc.topic16 = 1;
    }
    if (hint_bytes >= RMQ_STREAM_MIN) body_stream_start(&sc, stream_mode());
    fast_codes_init(&sc.fc, a);
    int status = RMQ_ST_END;
    int64_t n = a->start;
    int code = RMQ_OK;
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
        int res = a->filter ? run_filtered(&sc, cl, cseg, up, &n, stop, err)
                            : run_all(&sc, cl, cseg, up, &n, stop, err);
        if (res == RUN_MORE) continue;
        if (res >= 100) code = res - 100;
        else status = res;
        break;
    }
    if (!code) batch_finish(&sc);
    free(sc.props);
    free(sc.hash);
#if RMQ_SSE2
    if (sc.stream) _mm_sfence(); /* order the streaming stores before the batch is handed over */
#endif
    if (code) {
        rmq_batch_free(b);
        return code;
    }
    b->next_offset = n;
    b->scanned = n - a->start;
    b->status = status;
    *out = b;
    return RMQ_OK;
}

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

/* ------------------------------------------------------------------------------------------ */
/* Arrow C Data Interface export                                                               */

#define ARROW_FLAG_NULLABLE 2
#define N_COLS 19

/* The 19 columns in NATIVE_SCHEMA order: kind ('f' fixed width, 's' string/binary, 'l' keys
 * list<string>, 'm' properties map<string,string>), name, format, and their buffers (-1: none;
 * `valid` is exported only when the column has nulls). */
typedef struct col_desc {
    char kind;
    const char *name, *format;
    int8_t valid, off, data;
} col_desc;

static const col_desc COLS[N_COLS] = {
    {'f', "queueId", "i", -1, -1, RMQ_B_QUEUE_ID},
    {'f', "queueOffset", "l", -1, -1, RMQ_B_QUEUE_OFFSET},
    {'f', "commitLogOffset", "l", -1, -1, RMQ_B_COMMITLOG_OFFSET},
    {'f', "storeSize", "i", -1, -1, RMQ_B_STORE_SIZE},
    {'s', "msgId", "u", -1, RMQ_B_MSGID_OFF, RMQ_B_MSGID_DATA},
    {'s', "uniqKey", "u", RMQ_B_UNIQ_VALID, RMQ_B_UNIQ_OFF, RMQ_B_UNIQ_DATA},
    {'s', "tags", "u", RMQ_B_TAGS_VALID, RMQ_B_TAGS_OFF, RMQ_B_TAGS_DATA},
    {'l', "keys", "+l", RMQ_B_KEYS_VALID, RMQ_B_KEYS_OFF, -1},
    {'s', "body", "z", -1, RMQ_B_BODY_OFF, RMQ_B_BODY_DATA},
    {'m', "properties", "+m", -1, RMQ_B_PROPS_OFF, -1},
    {'f', "bornTimestamp", "tsu:UTC", -1, -1, RMQ_B_BORN_TS},
    {'f', "storeTimestamp", "tsu:UTC", -1, -1, RMQ_B_STORE_TS},
    {'s', "bornHost", "u", -1, RMQ_B_BORNHOST_OFF, RMQ_B_BORNHOST_DATA},
    {'s', "storeHost", "u", -1, RMQ_B_STOREHOST_OFF, RMQ_B_STOREHOST_DATA},
    {'f', "sysFlag", "i", -1, -1, RMQ_B_SYSFLAG},
    {'f', "flag", "i", -1, -1, RMQ_B_FLAG},
    {'f', "reconsumeTimes", "i", -1, -1, RMQ_B_RECONSUME},
    {'f', "bodyCRC", "i", -1, -1, RMQ_B_BODYCRC},
    {'f', "preparedTransactionOffset", "l", -1, -1, RMQ_B_PREPARED},
};

/* Node layout of an export: the root (the caller's struct), the 19 columns, then the keys
 * list's item strings, the map's entries struct and its key and value strings. */
enum { EX_KEYITEM = N_COLS, EX_ENTRIES, EX_PKEY, EX_PVAL, EX_NODES };

/* Everything an exported batch owns. Each node (root included) holds one reference; releasing a
 * node releases its children still in place (a consumer may move a child out and release it
 * later) and drops its reference; the last one frees the batch. */
typedef struct export_tree {
    int64_t refs;
    rmq_batch *batch;
    struct ArrowArray node[EX_NODES];
    struct ArrowArray *kids[N_COLS + 4];
    const void *bufs[64];
    int nbufs;
} export_tree;

static void export_release(struct ArrowArray *arr) {
    if (!arr || !arr->release) return;
    for (int64_t i = 0; i < arr->n_children; i++) {
        struct ArrowArray *c = arr->children[i];
        if (c->release) c->release(c);
    }
    export_tree *t = arr->private_data;
    arr->release = NULL;
    if (__atomic_sub_fetch(&t->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        rmq_batch_free(t->batch);
        free(t);
    }
}

/* Fill one node: `nbuf` buffer ids (-2: a NULL buffer), `nkids` children starting at kids. */
static void export_node(export_tree *t, struct ArrowArray *arr, int64_t length, int64_t nulls,
                        int nbuf, const int *ids, int nkids, struct ArrowArray **kids) {
    const void **bufs = &t->bufs[t->nbufs];
    for (int i = 0; i < nbuf; i++)
        bufs[i] = ids[i] >= 0 ? (const void *)t->batch->bufs[ids[i]].data : NULL;
    t->nbufs += nbuf;
    arr->length = length;
    arr->null_count = nulls;
    arr->offset = 0;
    arr->n_buffers = nbuf;
    arr->n_children = nkids;
    arr->buffers = bufs;
    arr->children = nkids ? kids : NULL;
    arr->dictionary = NULL;
    arr->release = export_release;
    arr->private_data = t;
}

int rmq_batch_export(rmq_batch *batch, struct ArrowArray *out) {
    if (out) memset(out, 0, sizeof *out);
    if (!batch || !out) {
        rmq_batch_free(batch);
        return RMQ_E_ARG;
    }
    export_tree *t = calloc(1, sizeof *t);
    if (!t) {
        rmq_batch_free(batch);
        return RMQ_E_NOMEM;
    }
    t->batch = batch;
    t->refs = EX_NODES + 1; /* the nodes below the root, and the root (out) */
    int64_t rows = batch->rows;
    struct ArrowArray **col_kids = &t->kids[0];
    for (int c = 0; c < N_COLS; c++) {
        const col_desc *d = &COLS[c];
        struct ArrowArray *arr = &t->node[c];
        col_kids[c] = arr;
        int64_t nulls = d->valid == RMQ_B_UNIQ_VALID ? batch->null_uniq
                        : d->valid == RMQ_B_TAGS_VALID ? batch->null_tags
                        : d->valid == RMQ_B_KEYS_VALID ? batch->null_keys : 0;
        int valid = nulls ? d->valid : -2;
        if (d->kind == 'f') {
            int ids[2] = {-2, d->data};
            export_node(t, arr, rows, 0, 2, ids, 0, NULL);
        } else if (d->kind == 's') {
            int ids[3] = {valid, d->off, d->data};
            export_node(t, arr, rows, nulls, 3, ids, 0, NULL);
        } else if (d->kind == 'l') {
            int ids[2] = {valid, d->off};
            int item_ids[3] = {-2, RMQ_B_KEYITEM_OFF, RMQ_B_KEYITEM_DATA};
            t->kids[N_COLS] = &t->node[EX_KEYITEM];
            export_node(t, &t->node[EX_KEYITEM], batch->key_items, 0, 3, item_ids, 0, NULL);
            export_node(t, arr, rows, nulls, 2, ids, 1, &t->kids[N_COLS]);
        } else { /* 'm' */
            int ids[2] = {-2, d->off};
            int none[1] = {-2};
            int key_ids[3] = {-2, RMQ_B_PKEY_OFF, RMQ_B_PKEY_DATA};
            int val_ids[3] = {-2, RMQ_B_PVAL_OFF, RMQ_B_PVAL_DATA};
            t->kids[N_COLS + 1] = &t->node[EX_ENTRIES];
            t->kids[N_COLS + 2] = &t->node[EX_PKEY];
            t->kids[N_COLS + 3] = &t->node[EX_PVAL];
            export_node(t, &t->node[EX_PKEY], batch->prop_items, 0, 3, key_ids, 0, NULL);
            export_node(t, &t->node[EX_PVAL], batch->prop_items, 0, 3, val_ids, 0, NULL);
            export_node(t, &t->node[EX_ENTRIES], batch->prop_items, 0, 1, none, 2,
                        &t->kids[N_COLS + 2]);
            export_node(t, arr, rows, 0, 2, ids, 1, &t->kids[N_COLS + 1]);
        }
    }
    int root_ids[1] = {-2};
    export_node(t, out, rows, 0, 1, root_ids, N_COLS, col_kids);
    return RMQ_OK;
}

/* The schema: static names and formats, nodes allocated per export (same reference scheme). */
typedef struct schema_tree {
    int64_t refs;
    struct ArrowSchema node[EX_NODES];
    struct ArrowSchema *kids[N_COLS + 4];
} schema_tree;

static void schema_release(struct ArrowSchema *s) {
    if (!s || !s->release) return;
    for (int64_t i = 0; i < s->n_children; i++) {
        struct ArrowSchema *c = s->children[i];
        if (c->release) c->release(c);
    }
    schema_tree *t = s->private_data;
    s->release = NULL;
    if (__atomic_sub_fetch(&t->refs, 1, __ATOMIC_ACQ_REL) == 0) free(t);
}

static void schema_node(schema_tree *t, struct ArrowSchema *s, const char *format,
                        const char *name, int64_t flags, int nkids, struct ArrowSchema **kids) {
    s->format = format;
    s->name = name;
    s->metadata = NULL;
    s->flags = flags;
    s->n_children = nkids;
    s->children = nkids ? kids : NULL;
    s->dictionary = NULL;
    s->release = schema_release;
    s->private_data = t;
}

int rmq_schema_export(struct ArrowSchema *out) {
    if (!out) return RMQ_E_ARG;
    memset(out, 0, sizeof *out);
    schema_tree *t = calloc(1, sizeof *t);
    if (!t) return RMQ_E_NOMEM;
    t->refs = EX_NODES + 1;
    for (int c = 0; c < N_COLS; c++) {
        const col_desc *d = &COLS[c];
        t->kids[c] = &t->node[c];
        if (d->kind == 'l') {
            t->kids[N_COLS] = &t->node[EX_KEYITEM];
            schema_node(t, &t->node[EX_KEYITEM], "u", "item", ARROW_FLAG_NULLABLE, 0, NULL);
            schema_node(t, &t->node[c], d->format, d->name, ARROW_FLAG_NULLABLE, 1,
                        &t->kids[N_COLS]);
        } else if (d->kind == 'm') {
            t->kids[N_COLS + 1] = &t->node[EX_ENTRIES];
            t->kids[N_COLS + 2] = &t->node[EX_PKEY];
            t->kids[N_COLS + 3] = &t->node[EX_PVAL];
            schema_node(t, &t->node[EX_PKEY], "u", "key", 0, 0, NULL);
            schema_node(t, &t->node[EX_PVAL], "u", "value", ARROW_FLAG_NULLABLE, 0, NULL);
            schema_node(t, &t->node[EX_ENTRIES], "+s", "entries", 0, 2, &t->kids[N_COLS + 2]);
            schema_node(t, &t->node[c], d->format, d->name, ARROW_FLAG_NULLABLE, 1,
                        &t->kids[N_COLS + 1]);
        } else {
            schema_node(t, &t->node[c], d->format, d->name, ARROW_FLAG_NULLABLE, 0, NULL);
        }
    }
    schema_node(t, out, "+s", "", 0, N_COLS, &t->kids[0]);
    return RMQ_OK;
}
