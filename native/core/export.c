/* native/core/export.c - part of the C core's one translation unit (see rmq_core.c).
 * Batches exported through the Arrow C Data Interface.
 */

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
