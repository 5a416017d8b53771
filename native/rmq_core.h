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
    RMQ_E_UNIT_MISMATCH = 18,   /* the record a CQ unit points to is not that unit's message
                                   (PHYSICALOFFSET, or topic/QUEUEID/QUEUEOFFSET) */
    RMQ_E_BAD_ENTRY = 19,       /* a DLedger CommitLog record not inside a valid entry header */
    RMQ_E_NET = 20,             /* send/receive failed or the peer closed (sys_errno set if any) */
    RMQ_E_TIMEOUT = 21,         /* no answer (or no room to send) before the deadline */
    RMQ_E_PROTOCOL = 22         /* a frame no server writes: bad length, header, serialize type */
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
    int32_t dledger;        /* CommitLog only: nonzero when records from dledger_from on sit in
                               DLedger entries (rmq_layout.h); 0 for the default layout */
    int64_t dledger_from;   /* first physical offset of the DLedger data files */
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
    uint32_t skip;          /* RMQ_SKIP_* bits: columns nobody asked for, left out of the rows */
} rmq_scan_args;

/* Columns a scan may leave out (rmq_scan_args.skip). A left-out column keeps its place in the
 * batch: msgId, bornHost and storeHost come as empty strings, properties as empty maps, uniqKey,
 * tags and keys as nulls. The properties are parsed (and checked as UTF-8) while any of the
 * properties map, keys, uniqKey and tags is kept or the scan checks tags (TAGS, KEYS and
 * UNIQ_KEY come from the one parse); with all four left out and no tag check, not at all. */
enum {
    RMQ_SKIP_MSGID = 1,
    RMQ_SKIP_HOSTS = 2,       /* bornHost and storeHost */
    RMQ_SKIP_PROPS = 4,       /* the properties map */
    RMQ_SKIP_KEYS = 8,
    RMQ_SKIP_UNIQ = 16,
    RMQ_SKIP_TAGS = 32,
    RMQ_SKIP_ALL = 63
};

rmq_segment *rmq_segment_open(const char *path, int64_t file_start, rmq_error *err);
rmq_segment *rmq_segment_from_fd(int fd, const char *label, int64_t file_start, rmq_error *err);
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
/* Poll the queue folders sel[0..nsel) (indexes into the n-long arrays) of one topic: queue i's
 * folder is <topic_dir>/<queue_ids[i]>, which the caller listed as (dev_ino[2i], dev_ino[2i+1],
 * mtime_ns[i]) with live[i] its last file's mapping (NULL: nothing kept, not polled). same[i] = 1
 * when the folder is still that real folder, and then units[i] (in: a count of valid units from
 * an earlier call, a hint) = rmq_cq_valid_units_from(live[i], units[i]); else same[i] = 0 and
 * units[i] is untouched. Returns how many are the same, or -1 (same[] then means nothing) when
 * the topic folder cannot be opened as a real folder or an argument is bad. */
int64_t rmq_cq_poll(const char *topic_dir, int64_t n, const int32_t *queue_ids,
                    const int32_t *sel, int64_t nsel, const uint64_t *dev_ino,
                    const int64_t *mtime_ns, rmq_segment *const *live, int64_t *units,
                    int8_t *same);
/* The same, given that an earlier call with a phy_min <= this one answered `known` on the same
 * mapping: units before it are passed over again only if unit known-1 changed. */
int64_t rmq_cq_first_unit_at_or_above_from(const rmq_segment *seg, int64_t phy_min,
                                           int64_t known);
int rmq_lookup_time(const rmq_files *cl, const rmq_files *cq, int64_t min_offset,
                    int64_t max_offset, int64_t timestamp_ms, int64_t *out, rmq_error *err);
int rmq_scan_queue(const rmq_files *cl, const rmq_files *cq, const rmq_scan_args *args,
                   rmq_batch **out, rmq_error *err);
/* The ranges of rmq_scan_ranges: n entries per array, the outs filled by the scan. */
typedef struct rmq_ranges {
    int64_t n;                /* >= 1 */
    rmq_files **cqs;          /* each range's ConsumeQueue (queues of the scan's topic) */
    const int64_t *starts;    /* first queue offset (inclusive) */
    const int64_t *ends;      /* last queue offset (exclusive), >= start */
    const int32_t *queue_ids; /* the queue each range reads (check_queue) */
    int64_t *rows;            /* out: the batch's rows from each range (they follow range order) */
    int64_t *next_offsets;    /* out: queue offset where each range's scan stopped */
    int32_t *statuses;        /* out: enum rmq_status of each range */
    int64_t done;             /* out: ranges examined, their outs set but on an error (then the
                                 failing range is done - 1) */
} rmq_ranges;

/* rmq_scan_queue of several ranges in turn into one batch: range i is scanned as rmq_scan_queue
 * scans [starts[i], ends[i]) of cqs[i] with a->queue_id = queue_ids[i] (a->start, a->end and
 * a->queue_id are not used); max_rows and max_bytes bound the whole batch (its first row is
 * always accepted, a later range's first row is not). The scan stops after the first range whose
 * status is not RMQ_ST_END (FULL: the batch is full; CQ_END; CL_GONE): that is range done - 1,
 * and the batch's next_offset, scanned and status are its own. An error (naming file and
 * position, as rmq_scan_queue's) frees the batch. */
int rmq_scan_ranges(const rmq_files *cl, const rmq_scan_args *a, rmq_ranges *r,
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

/* -- pulls over the network (core/netpull.c: the frame layout, the rules) -- */

/* A remoting frame's header, as far as pull answers need it. */
typedef struct rmq_net_header {
    int32_t code;
    int32_t opaque;
    int32_t flag;              /* bit 0: an answer; bit 1: oneway */
    int32_t serialize_type;    /* 0 JSON, 1 ROCKETMQ binary */
    int32_t has_next_begin;    /* extFields has nextBeginOffset */
    int64_t header_len;        /* the body starts at 4 + header_len of the frame */
    int64_t next_begin_offset, min_offset, max_offset, suggest_broker_id;  /* 0 when absent */
    int64_t position;          /* a bad header: where in it the parse stopped, else -1 */
} rmq_net_header;

/* Parse frame[0, len): a frame after its length field (mark, header, body). RMQ_E_PROTOCOL
 * names the position in the frame for a header no server writes. */
int rmq_net_parse_header(const uint8_t *frame, int64_t len, rmq_net_header *out, rmq_error *err);

enum rmq_pull_status {
    RMQ_PULL_DATA = 0,     /* data[0, len): SUCCESS bodies joined, asked from `first`; `next` is
                              the last answer's nextBeginOffset (where the range goes on) */
    RMQ_PULL_ANSWER = 1,   /* data[0, len): the frame of an answer that is not plain messages,
                              asked at `asked`; the caller decides and calls rmq_puller_seek */
    RMQ_PULL_REQUEST = 2,  /* data[0, len): a two-way request the server sent; pulls go on */
    RMQ_PULL_END = 3       /* the range's end was reached */
};

typedef struct rmq_pull_out {
    int status;
    int64_t first, next, asked;
    int64_t rows;              /* DATA: queue offsets advanced (sum of nextBegin - asked) */
    int64_t answers;           /* DATA: answers joined */
    int64_t suggest;           /* DATA: the last answer's suggestWhichBrokerId */
    const uint8_t *data;       /* valid until the next call on the puller */
    int64_t len;
} rmq_pull_out;

typedef struct rmq_puller rmq_puller;

/* A puller on a connected TCP socket (the caller owns fd and closes it after rmq_puller_free;
 * errors do not name the peer: the caller does). */
rmq_puller *rmq_puller_new(int fd, rmq_error *err);
/* Pull [start, end): requests are the JSON header tmpl[0, tmpl_len) with the opaque, the queue
 * offset and maxMsgNums (min(per_pull, what is left)) inserted at cuts[0] <= cuts[1] <= cuts[2];
 * in_flight (1..16) requests at most are unanswered; each answer is awaited timeout_ms after its
 * request was sent. An answer whose suggestWhichBrokerId is not expect_suggest ends a DATA.
 * Answers to requests of an earlier range are dropped. */
int rmq_puller_range(rmq_puller *p, const uint8_t *tmpl, int32_t tmpl_len, const int32_t *cuts,
                     int64_t start, int64_t end, int32_t per_pull, int32_t in_flight,
                     int32_t timeout_ms, int64_t expect_suggest, rmq_error *err);
/* Go on from `offset` (required after an ANSWER; allowed after a DATA). */
int rmq_puller_seek(rmq_puller *p, int64_t offset, rmq_error *err);
/* The next piece of the range: DATA stops once `rows` >= max_rows or len >= max_bytes, at a
 * changed suggestion, at the end, or before an ANSWER/REQUEST. RMQ_E_NET, RMQ_E_TIMEOUT,
 * RMQ_E_PROTOCOL leave the puller failed (only rmq_puller_free then). */
int rmq_puller_next(rmq_puller *p, int64_t max_rows, int64_t max_bytes, rmq_pull_out *out,
                    rmq_error *err);
void rmq_puller_free(rmq_puller *p);
/* The pull size after an answer that covered `covered` of the `asked` offsets, the rule the
 * puller follows and the Python pulls call: state[0] is the pull size, state[1] the full answers
 * in a row, both updated. A broker answers at most its transfer caps (32 messages or 256 KiB from
 * memory, 8 or 64 KiB from disk by default) and a short answer drops the pulls in flight behind
 * it: after one the size is what it covered (at least 1); after RMQ_PULL_GROW_AFTER full answers
 * in a row it doubles, up to `largest` (the caps change as the data moves between disk and
 * memory, and one large message may have made the answer short). */
enum { RMQ_PULL_GROW_AFTER = 16 };
void rmq_next_pull_size(int32_t *state, int64_t covered, int32_t asked, int32_t largest);

/* The first pull of each of several ranges of one broker (any queues: each has its own template,
 * cut as for rmq_puller_range), sent together, in_flight (1..16) at most unanswered, each answered
 * within timeout_ms. In: tmpl, tmpl_len, cuts, offset (queue offset asked), nums (messages asked).
 * Out: code (-1: no answer), next_begin (-1: none), suggest; a SUCCESS answer that moved past
 * offset keeps its body at (*bodies)[body_at, body_at + body_len) (valid until the next call on
 * the puller; others have body_len 0: the caller pulls that range its usual way). Two-way requests
 * of the server are answered "not supported". Leaves the range pulled before (a range or a seek
 * must come before rmq_puller_next). Errors as rmq_puller_next. */
enum rmq_firsts_limit { RMQ_FIRSTS_MAX = 256 };
typedef struct rmq_first_pull {
    const uint8_t *tmpl;
    int32_t tmpl_len;
    int32_t cuts[3];
    int64_t offset;
    int32_t nums;
    int32_t code;
    int64_t next_begin, suggest, body_at, body_len;
} rmq_first_pull;
int rmq_puller_firsts(rmq_puller *p, rmq_first_pull *pulls, int32_t n, int32_t in_flight,
                      int32_t timeout_ms, const uint8_t **bodies, rmq_error *err);

/* TLS (core/tls.c): a client context; ca_file NULL: the system's CAs; verify 0: no certificate
 * is checked; cert_file (with key_file, or the key in cert_file; key_password may be NULL) for
 * servers asking for a client certificate. NULL with err set (RMQ_E_ARG: a file unusable). */
typedef struct rmq_tls_ctx rmq_tls_ctx;
rmq_tls_ctx *rmq_tls_ctx_new(const char *ca_file, const char *cert_file, const char *key_file,
                             const char *key_password, int verify, rmq_error *err);
void rmq_tls_ctx_free(rmq_tls_ctx *ctx);
/* Before the first range: the TLS handshake on the puller's socket (made non-blocking), within
 * timeout_ms; host (NULL: none) is the name or IP the server's certificate must name. After a
 * failure (RMQ_E_NET, RMQ_E_TIMEOUT) only rmq_puller_free is left. */
int rmq_puller_tls(rmq_puller *p, rmq_tls_ctx *ctx, const char *host, int32_t timeout_ms,
                   rmq_error *err);
/* Send buf[0, len) on the puller's connection (through TLS when on), within timeout_ms. */
int rmq_puller_send(rmq_puller *p, const uint8_t *buf, int64_t len, int32_t timeout_ms,
                    rmq_error *err);

/* -- SQL92 selectors over the properties column (core/sql92.c) -- */

enum rmq_sql_op {
    RMQ_SQL_CONST = 1,    /* kind: 0 null, 1 Integer, 2 Long, 3 Double, 4 String (str), 5 Boolean */
    RMQ_SQL_PROP = 2,     /* str: index of the property (rmq_sql_prog.prop_str) */
    RMQ_SQL_NEG = 3,      /* -a */
    RMQ_SQL_CAST = 4,     /* a property where a condition is expected */
    RMQ_SQL_LESS = 5,     /* kind: 0 >, 1 >=, 2 <, 3 <= */
    RMQ_SQL_EQ = 6,
    RMQ_SQL_NOT = 7,
    RMQ_SQL_AND = 8,
    RMQ_SQL_OR = 9,
    RMQ_SQL_IN = 10,      /* a [NOT] IN (strings str .. str + nstr - 1) */
    RMQ_SQL_STRTEST = 11  /* kind: 0 CONTAINS, 1 STARTSWITH, 2 ENDSWITH; search: string str */
};

typedef struct rmq_sql_node {
    int32_t op;
    int32_t a, b;          /* children: indices of earlier nodes */
    int32_t kind;
    int32_t negated;
    int32_t str, nstr;
    int64_t ival;
    double dval;
} rmq_sql_node;

/* A selector as rmq_source/sql92/program.py lays it out: nodes children first, root last;
 * strings[str_off[k], str_off[k + 1]) is string k (UTF-8); property k is named string
 * prop_str[k] (at most 1024 properties; nesting at most 256 deep). */
typedef struct rmq_sql_prog {
    const rmq_sql_node *nodes;
    int32_t nnodes, root;
    const uint8_t *strings;
    const int32_t *str_off;
    int32_t nstrings;
    const int32_t *prop_str;
    int32_t nprops;
} rmq_sql_prog;

/* out[r] = 1 when the selector is TRUE for row r of a map<string,string> column (rows from
 * row_offset; map_off/map_valid indexed by row_offset + r; entries, key_bytes, val_bytes bound
 * the children), 0 when it is FALSE, null or raised a Java exception (the broker's rule). */
int rmq_sql_eval(const rmq_sql_prog *p, int64_t rows, int64_t row_offset, const int32_t *map_off,
                 const uint8_t *map_valid, const int32_t *key_off, const uint8_t *key_data,
                 const int32_t *val_off, const uint8_t *val_data, int64_t entries,
                 int64_t key_bytes, int64_t val_bytes, uint8_t *out, rmq_error *err);
/* -- sink: rows of Arrow columns -> SEND_BATCH_MESSAGE bodies (core/sinkenc.c) -------------- */
enum { RMQ_UNIQ_DIGEST = 12 };

/* BLAKE2b state (RFC 7693) of the UNIQ_KEY prefix: rmq_uniq_init absorbs person16 (16 bytes, the
 * personalization) and the prefix; each key copies it. */
typedef struct rmq_blake2b {
    uint64_t h[8];
    uint64_t t[2];
    uint8_t buf[128];
    int32_t buflen;
    int32_t outlen;
} rmq_blake2b;

/* One variable-size column: entry i is data[off[i] .. off[i+1]); valid: one byte per entry
 * (0 = null), NULL when nothing is null. off == NULL: the column is absent. */
typedef struct rmq_sink_col {
    const int64_t *off;
    const uint8_t *data;
    int64_t data_len;
    const uint8_t *valid;
} rmq_sink_col;

/* The rows of a batch: body (required), tags, keys, properties. keys is a string column, or,
 * when key_lists is set, the items of a list column (row r's items are key_lists[r] ..
 * key_lists[r+1] of the key_items items; key_lists_valid per row, NULL when no row is null).
 * properties (prop_lists NULL: absent) is a map column the same way: row r's entries are
 * prop_lists[r] .. prop_lists[r+1] of prop_names/prop_values (prop_entries each). row_bad (NULL:
 * none): 1 for a row the caller found cannot be a message (reserved or blank property names). */
typedef struct rmq_sink_rows {
    int64_t n;
    rmq_sink_col body, tags, keys;
    const int64_t *key_lists;
    const uint8_t *key_lists_valid;
    int64_t key_items;
    const int64_t *prop_lists;
    const uint8_t *prop_lists_valid;
    int64_t prop_entries;
    rmq_sink_col prop_names, prop_values;
    const uint8_t *row_bad;
} rmq_sink_rows;

typedef struct rmq_sink_limits {
    int64_t max_messages;   /* messages per batch */
    int64_t max_bytes;      /* encoded bytes per batch (a single larger message goes alone) */
    int64_t max_body;       /* a body longer than this is a bad row */
} rmq_sink_limits;

int rmq_uniq_init(rmq_blake2b *s, const uint8_t *person16, const uint8_t *prefix, int64_t prefix_len,
                  rmq_error *err);
/* out: 32 * count characters (no terminator), the keys of task rows first_row ... */
int rmq_uniq_keys(const rmq_blake2b *base, int64_t first_row, int64_t count, char *out,
                  rmq_error *err);
/* Splits rows from..n into batches: batch i is rows [ends[i-1] (from for i = 0), ends[i]) of
 * sizes[i] encoded bytes; the first one continues an open batch of open_count messages and
 * open_bytes bytes (it may be empty: that open batch is full). Stops before the first row that
 * cannot be a message (*bad_row, else -1). *last_open = 1 when the last batch ended with the
 * rows, not at a limit. Returns the number of batches, -1 on bad arguments (*err). */
int64_t rmq_sink_plan(const rmq_sink_rows *rows, int64_t from, const rmq_sink_limits *lim,
                      int64_t open_count, int64_t open_bytes, int64_t *ends, int64_t *sizes,
                      int64_t cap, int64_t *bad_row, int32_t *last_open, rmq_error *err);
/* Encodes rows [from, to) (planned good rows) into out, exactly out_len bytes; row r's UNIQ_KEY
 * is that of task row task_row0 + r. */
int rmq_sink_encode(const rmq_sink_rows *rows, int64_t from, int64_t to, const rmq_blake2b *uniq,
                    int64_t task_row0, uint8_t *out, int64_t out_len, rmq_error *err);
/* -- message traces: contexts of many messages at once (core/traces.c) ------------------------- */
/* The four texts every message's context is made with (their meaning: core/traces.c). */
typedef struct rmq_trace_texts {
    const char *text[4];
    int64_t len[4];
} rmq_trace_texts;

/* Rows read: the id is uniq when not null and not empty, else msg_id; keys as in rmq_sink_rows
 * (key_lists NULL: no row has keys); retries: reconsumeTimes (NULL: 0 for every row). */
typedef struct rmq_trace_sub_rows {
    int64_t n;
    rmq_sink_col uniq, msg_id, keys;
    const int64_t *key_lists;
    const uint8_t *key_lists_valid;
    int64_t key_items;
    const int32_t *retries;
    const uint8_t *retries_valid;
} rmq_trace_sub_rows;

/* SubBefore/SubAfter contexts of every row into out (ends[r]: where row r's ends) and its keys
 * into keys_out (key_ends[r]); RMQ_E_ARG when a capacity is too small. */
int rmq_trace_sub(const rmq_trace_sub_rows *rows, const rmq_trace_texts *t, uint8_t *out, int64_t cap,
                  int64_t *ends, uint8_t *keys_out, int64_t keys_cap, int64_t *key_ends,
                  rmq_error *err);
/* Pub contexts of the count messages of a SEND_BATCH_MESSAGE body; offset_ids: the broker's
 * answer (offset message ids joined by commas, message i's is the i-th). */
int rmq_trace_pub(const uint8_t *batch, int64_t len, int64_t count, const char *offset_ids,
                  int64_t offset_ids_len, const rmq_trace_texts *t, uint8_t *out, int64_t cap,
                  int64_t *ends, uint8_t *keys_out, int64_t keys_cap, int64_t *key_ends,
                  rmq_error *err);

/* -- broker statistics answers (core/stats.c) ---------------------------------------------- */

/* The map ``member`` of a statistics answer (fastjson: MessageQueue objects as keys) into rows:
 * row r's queue id in queue_ids[r], the integer of fields[k] in values[r * nfields + k] with
 * present[r * nfields + k] = 1 (0: the entry has no such member). *count rows (at most cap:
 * RMQ_E_ARG when there are more). RMQ_E_PROTOCOL (position in *err_pos) for anything but that
 * exact form about ``topic``: the caller's general parser reads it then. */
int rmq_stats_table(const uint8_t *buf, size_t len, const char *member, size_t member_len,
                    const char *topic, size_t topic_len, const char *const *fields,
                    const size_t *field_lens, int nfields, int64_t *queue_ids, int64_t *values,
                    uint8_t *present, size_t cap, size_t *count, size_t *err_pos);
/* CDEF END */

#endif
