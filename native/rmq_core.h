/*
 * rmq_core.h - C core of rmq_source: read-only decoding of RocketMQ broker store files.
 *
 * The region between the CDEF markers is also fed to cffi (native/_build.py), so it holds only
 * declarations cffi can parse: no #include, no #define, no inline code.
 *
 * Conventions: every function that can fail returns an rmq_code and fills *err (code, path,
 * position, physical/queue offset, message). Offsets are int64 byte positions; "physical offset"
 * is a CommitLog address, "queue offset" the index of a 20-byte ConsumeQueue unit.
 *
 * struct ArrowSchema / struct ArrowArray are the Arrow C Data Interface structures, declared here
 * exactly as the Arrow specification defines them (no include guard: cffi cannot parse one, and
 * nothing else compiled with this header declares them).
 */
#ifndef RMQ_CORE_H
#define RMQ_CORE_H

#include <stdint.h>
#include <stddef.h>

/* CDEF BEGIN */
struct ArrowSchema {
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

enum rmq_code {
    RMQ_OK = 0,
    RMQ_E_ARG = 1,              /* bad argument (caller bug; native.py validates first) */
    RMQ_E_IO = 2,               /* open/fstat/mmap failed (sys_errno set) */
    RMQ_E_NOMEM = 3,            /* allocation failed */
    RMQ_E_MISSING_FILE = 4,     /* file absent (ENOENT), or a ConsumeQueue file needed for an offset */
    RMQ_E_BAD_MAGIC = 10,       /* record magic is neither V1 nor V2 (BLANK included) */
    RMQ_E_TRUNCATED = 11,       /* record / CQ unit runs past the end of its file */
    RMQ_E_SIZE_MISMATCH = 12,   /* TOTALSIZE != CQ unit size, or the length rule is violated */
    RMQ_E_NEGATIVE_LENGTH = 13, /* negative BODYLENGTH, TOPICLENGTH or PROPERTIESLENGTH */
    RMQ_E_UNIT_OUT_OF_RANGE = 14, /* CQ unit points outside the mapped CommitLog */
    RMQ_E_BAD_UTF8 = 15,        /* topic or properties are not valid UTF-8 */
    RMQ_E_CRC_MISMATCH = 16,    /* BODYCRC != crc32(body) & 0x7FFFFFFF (only when asked) */
    RMQ_E_BAD_UNIT = 17,        /* an unwritten/invalid CQ unit where a valid one is required, or
                                   a pre-blank filler unit after written units */
    RMQ_E_UNIT_MISMATCH = 18    /* the record a CQ unit points to is not that unit's message
                                   (PHYSICALOFFSET, or topic/QUEUEID/QUEUEOFFSET) */
};

enum rmq_status {
    RMQ_ST_END = 0,     /* reached `end` */
    RMQ_ST_FULL = 1,    /* max_rows or max_bytes reached */
    RMQ_ST_CQ_END = 2,  /* first unwritten/invalid unit (phy < 0 or size <= 0) or no file yet */
    RMQ_ST_CL_GONE = 3  /* an accepted unit points below the CommitLog min offset */
};

typedef struct rmq_error {
    int code;
    int sys_errno;
    int64_t position;       /* byte position inside `path`, -1 if not applicable */
    int64_t phy_offset;     /* CommitLog physical offset involved, -1 if none */
    int64_t queue_offset;   /* ConsumeQueue offset involved, -1 if none */
    char path[4096];
    char message[1536];
} rmq_error;

/* One read-only mapped file. base is NULL when size == 0. */
typedef struct rmq_segment {
    const uint8_t *base;
    int64_t size;
    int64_t file_start;
    char *path;
} rmq_segment;

/* A mapped file queue (CommitLog or one ConsumeQueue): segs sorted by file_start and
 * consecutive (segs[i]->file_start == segs[0]->file_start + i * file_size). */
typedef struct rmq_files {
    rmq_segment **segs;
    int64_t count;
    int64_t file_size;
} rmq_files;

typedef struct rmq_buf {
    uint8_t *data;   /* 64-byte aligned, never NULL inside a batch */
    int64_t len;     /* bytes used */
    int64_t cap;     /* bytes usable from data */
    uint8_t *mem;    /* the allocation: data - skew */
    int32_t id;      /* enum rmq_buf_id */
    int32_t skew;    /* bytes between mem and data (see buf_grow_keep) */
} rmq_buf;

/* Buffer indices of rmq_batch.bufs (Arrow layout; *_OFF are int32 offsets, *_VALID bitmaps). */
enum rmq_buf_id {
    RMQ_B_QUEUE_ID = 0, RMQ_B_QUEUE_OFFSET, RMQ_B_COMMITLOG_OFFSET, RMQ_B_STORE_SIZE,
    RMQ_B_MSGID_OFF, RMQ_B_MSGID_DATA,
    RMQ_B_UNIQ_VALID, RMQ_B_UNIQ_OFF, RMQ_B_UNIQ_DATA,
    RMQ_B_TAGS_VALID, RMQ_B_TAGS_OFF, RMQ_B_TAGS_DATA,
    RMQ_B_KEYS_VALID, RMQ_B_KEYS_OFF, RMQ_B_KEYITEM_OFF, RMQ_B_KEYITEM_DATA,
    RMQ_B_BODY_OFF, RMQ_B_BODY_DATA,
    RMQ_B_PROPS_OFF, RMQ_B_PKEY_OFF, RMQ_B_PKEY_DATA, RMQ_B_PVAL_OFF, RMQ_B_PVAL_DATA,
    RMQ_B_BORN_TS, RMQ_B_STORE_TS,
    RMQ_B_BORNHOST_OFF, RMQ_B_BORNHOST_DATA, RMQ_B_STOREHOST_OFF, RMQ_B_STOREHOST_DATA,
    RMQ_B_SYSFLAG, RMQ_B_FLAG, RMQ_B_RECONSUME, RMQ_B_BODYCRC, RMQ_B_PREPARED,
    RMQ_NBUF
};

typedef struct rmq_batch {
    int64_t rows;
    int64_t next_offset;   /* queue offset where scanning stopped */
    int64_t scanned;       /* units examined: next_offset - start */
    int status;            /* enum rmq_status */
    int64_t data_bytes;    /* body + properties + string bytes accepted (max_bytes accounting) */
    int64_t null_uniq;
    int64_t null_tags;
    int64_t null_keys;
    int64_t key_items;     /* entries of the keys list child */
    int64_t prop_items;    /* entries of the properties map child */
    rmq_buf bufs[34];      /* RMQ_NBUF */
} rmq_batch;

typedef struct rmq_scan_args {
    int64_t start;          /* first queue offset (inclusive) */
    int64_t end;            /* last queue offset (exclusive) */
    int64_t max_rows;       /* >= 1 */
    int64_t max_bytes;      /* >= 1, <= INT32_MAX */
    int filter;             /* 0: accept every unit; 1: tag-hash filter with codes */
    const int32_t *codes;   /* sorted ascending when ncodes > 8 */
    int32_t ncodes;
    int check_tags;         /* 1: also require TAGS == one of tags[] (exact bytes) */
    char **tags;            /* UTF-8 tag strings */
    const int32_t *tag_lens;
    int32_t ntags;
    int verify_crc;
    int check_queue;        /* 1: each record must be the message of (topic, queue_id) at its
                               unit's queue offset, or list that queue in its multi-dispatch
                               properties (LMQ); 0: only PHYSICALOFFSET is checked */
    const char *topic;      /* UTF-8 bytes of the queue's topic (check_queue), not terminated */
    int32_t topic_len;      /* >= 1 */
    int32_t queue_id;
} rmq_scan_args;

rmq_segment *rmq_segment_open(const char *path, int64_t file_start, rmq_error *err);
void rmq_segment_close(rmq_segment *seg);

int rmq_commitlog_valid_end(const rmq_files *cl, int verify_crc, int64_t *out, rmq_error *err);
int rmq_store_timestamp(const rmq_files *cl, int64_t phy, int32_t size, int64_t *out,
                        rmq_error *err);
int64_t rmq_cq_valid_units(const rmq_segment *seg);
/* rmq_cq_valid_units when the first `known` units were valid at an earlier call: units are only
 * appended, so only unit known-1 is re-checked (a full count if it is no longer valid) and the
 * count goes on from there. */
int64_t rmq_cq_valid_units_from(const rmq_segment *seg, int64_t known);
int64_t rmq_cq_first_unit_at_or_above(const rmq_segment *seg, int64_t phy_min);
/* The same, given that an earlier call with a phy_min <= this one answered `known` on the same
 * mapping: units before it are passed over again only if unit known-1 changed. */
int64_t rmq_cq_first_unit_at_or_above_from(const rmq_segment *seg, int64_t phy_min,
                                           int64_t known);
int rmq_lookup_time(const rmq_files *cl, const rmq_files *cq, int64_t min_offset,
                    int64_t max_offset, int64_t timestamp_ms, int64_t *out, rmq_error *err);
int rmq_scan_queue(const rmq_files *cl, const rmq_files *cq, const rmq_scan_args *args,
                   rmq_batch **out, rmq_error *err);
/* Decode the CommitLog records laid end to end in buf[0, len) (a PULL_MESSAGE answer body) into
 * a batch, as rmq_scan_queue does from the store. Every record must be a message of queue
 * (a->topic, a->queue_id) (check_queue is required; LMQ multi-dispatch records as in a scan), in
 * ascending QUEUEOFFSET, else RMQ_E_UNIT_MISMATCH. Records below a->start are passed over, the
 * first at or past a->end ends the decode; with check_tags a record whose TAGS is none of
 * a->tags is left out (the broker filters by hash code only); the codes are not used. Stops with
 * RMQ_ST_FULL at max_rows/max_bytes. next_offset = one past the last QUEUEOFFSET examined (at
 * least a->start); scanned = the bytes of buf examined. Errors name `label` and the byte
 * position in buf. */
int rmq_decode_records(const uint8_t *buf, int64_t len, const char *label,
                       const rmq_scan_args *a, rmq_batch **out, rmq_error *err);
void rmq_batch_free(rmq_batch *batch);
/* addresses and used lengths of the RMQ_NBUF buffers of a batch (for zero-copy wrapping) */
void rmq_batch_buffers(const rmq_batch *batch, uint64_t *addrs, int64_t *lens);
/* Move `batch` into *out: a struct array of the 19 native columns (rmq_schema_export's type)
 * whose buffers are the batch's own (zero-copy). The batch always passes to the callee: on
 * success out->release frees it (once the root and every child moved out of it are released);
 * on failure (RMQ_E_NOMEM) it is freed and out->release is NULL. */
int rmq_batch_export(rmq_batch *batch, struct ArrowArray *out);
/* The type of an exported batch: struct<19 fields> (NATIVE_SCHEMA of rmq_source/store/native.py). */
int rmq_schema_export(struct ArrowSchema *out);
/* Batches allocated and not yet freed (released), pooled buffers aside: a leak check. */
int64_t rmq_live_batches(void);
/* Bytes of batch buffers ever taken (from the pool or the allocator): a check that a scan sizes
 * its buffers from what it reads, not from what ConsumeQueue units claim. */
int64_t rmq_buffer_bytes_taken(void);
const char *rmq_code_name(int code);
/* CDEF END */

#endif
