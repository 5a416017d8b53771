/* native/core/buffers.c - part of the C core's one translation unit (see rmq_core.c).
 * Growable 64-byte aligned column buffers (pooled) and batches.
 */

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

