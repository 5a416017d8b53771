/* native/core/sql92.c - part of the C core's one translation unit (see rmq_core.c).
 * SQL92 selectors evaluated over the properties column of decoded batches (rmq_sql_eval), as
 * RocketMQ's broker evaluates them for each message (its filter module). The program comes
 * from rmq_source/sql92/program.py, which parsed and checked the selector; the reference
 * evaluation is rmq_source/sql92/nodes.py, and the C code follows it step by step.
 *
 * INPUT LAYOUT (an Arrow map<string,string> column, offsets int32):
 *     map_off[row_offset + r] .. map_off[row_offset + r + 1]   entries of row r
 *     map_valid                                                 validity bitmap or NULL
 *     key_off[e], key_off[e + 1]   bytes of entry e's name in key_data (UTF-8)
 *     val_off[e], val_off[e + 1]   bytes of entry e's value in val_data (never null)
 * A row's property is the value of its last entry with that name; no entry: Java null.
 *
 * VALUES (Java objects): null, Integer, Long, Double, String (a property or literal, UTF-8),
 * Boolean. Conversions are Java's: Integer/Long.parseInt (a sign, decimal digits of any BMP
 * script), Double.parseDouble (trimmed, NaN/Infinity, decimal and hex, f/F/d/D suffix),
 * Boolean.valueOf; comparisons are __compare's with string conversion on. Any Java exception
 * (a number that does not parse, a class cast) makes the row not match, whatever the rest says.
 */

#include <locale.h>
#include <math.h>

enum { JV_NULL = 0, JV_INT = 1, JV_LONG = 2, JV_DOUBLE = 3, JV_STR = 4, JV_BOOL = 5 };
#define SQL_MAX_PROPS 1024
#define SQL_MAX_DEPTH 256

typedef struct jv {
    int k;
    int64_t i;          /* INT, LONG, BOOL (0/1) */
    double d;           /* DOUBLE */
    const uint8_t *s;   /* STR */
    int64_t n;
} jv;

typedef struct sql_ctx {
    const rmq_sql_prog *p;
    const uint8_t *pv[SQL_MAX_PROPS];   /* this row's property values */
    int64_t pn[SQL_MAX_PROPS];
    uint8_t pp[SQL_MAX_PROPS];          /* 1: the row has the property */
    locale_t c_locale;
} sql_ctx;

/* Zero digits of the BMP's decimal digit ranges (Unicode category Nd, ten in a row). */
static const uint32_t ND_ZEROS[] = {
    0x0030, 0x0660, 0x06F0, 0x07C0, 0x0966, 0x09E6, 0x0A66, 0x0AE6, 0x0B66, 0x0BE6, 0x0C66,
    0x0CE6, 0x0D66, 0x0DE6, 0x0E50, 0x0ED0, 0x0F20, 0x1040, 0x1090, 0x17E0, 0x1810, 0x1946,
    0x19D0, 0x1A80, 0x1A90, 0x1B50, 0x1BB0, 0x1C40, 0x1C50, 0xA620, 0xA8D0, 0xA900, 0xA9D0,
    0xA9F0, 0xAA50, 0xABF0, 0xFF10};

/* Next UTF-8 code point of s[*i, n) (the column holds valid UTF-8); -1 at a bad byte. */
static int32_t sql_utf8(const uint8_t *s, int64_t n, int64_t *i) {
    uint8_t c = s[*i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || *i + len > n) return -1;
    int32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < len; k++) cp = (cp << 6) | (s[*i + k] & 0x3F);
    *i += len;
    return cp;
}

static int sql_digit(int32_t cp) {
    if (cp >= '0' && cp <= '9') return cp - '0';
    if (cp < 0x660 || cp > 0xFFFF) return -1;
    for (size_t k = 1; k < sizeof ND_ZEROS / sizeof ND_ZEROS[0]; k++)
        if ((uint32_t)cp >= ND_ZEROS[k] && (uint32_t)cp < ND_ZEROS[k] + 10) return cp - (int32_t)ND_ZEROS[k];
    return -1;
}

/* Integer.parseInt / Long.parseLong within [lo, hi]; 1: NumberFormatException. */
static int sql_java_int(const uint8_t *s, int64_t n, int64_t lo, int64_t hi, int64_t *out) {
    int64_t i = 0;
    int neg = 0;
    if (n == 0) return 1;
    if (s[0] == '-' || s[0] == '+') {
        neg = s[0] == '-';
        i = 1;
        if (n == 1) return 1;
    }
    uint64_t v = 0, limit = neg ? (uint64_t)(-(lo + 1)) + 1 : (uint64_t)hi;
    while (i < n) {
        int d = sql_digit(sql_utf8(s, n, &i));
        if (d < 0) return 1;
        if (v > (limit - (uint64_t)d) / 10) return 1;
        v = v * 10 + (uint64_t)d;
    }
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 0;
}

static int sql_is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
static int sql_is_hex(uint8_t c) {
    return sql_is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Double.parseDouble; 1: NumberFormatException. */
static int sql_java_double(const sql_ctx *c, const uint8_t *s, int64_t n, double *out) {
    int64_t a = 0, b = n;
    while (a < b && s[a] <= ' ') a++;
    while (b > a && s[b - 1] <= ' ') b--;
    const uint8_t *t = s + a;
    int64_t m = b - a, i = 0;
    int neg = 0;
    if (i < m && (t[i] == '+' || t[i] == '-')) neg = t[i++] == '-';
    if (m - i == 3 && memcmp(t + i, "NaN", 3) == 0) { *out = NAN; return 0; }
    if (m - i == 8 && memcmp(t + i, "Infinity", 8) == 0) { *out = neg ? -INFINITY : INFINITY; return 0; }
    int64_t end = m;
    if (m - i > 2 && t[i] == '0' && (t[i + 1] == 'x' || t[i + 1] == 'X')) {
        int64_t j = i + 2, digits = 0;
        while (j < m && sql_is_hex(t[j])) { j++; digits++; }
        if (j < m && t[j] == '.') { j++; while (j < m && sql_is_hex(t[j])) { j++; digits++; } }
        if (!digits || j >= m || (t[j] != 'p' && t[j] != 'P')) return 1;
        j++;
        if (j < m && (t[j] == '+' || t[j] == '-')) j++;
        if (j >= m || !sql_is_digit(t[j])) return 1;
        while (j < m && sql_is_digit(t[j])) j++;
        end = j;
        if (j < m && (t[j] == 'f' || t[j] == 'F' || t[j] == 'd' || t[j] == 'D')) j++;
        if (j != m) return 1;
    } else {
        int64_t j = i, digits = 0;
        while (j < m && sql_is_digit(t[j])) { j++; digits++; }
        if (j < m && t[j] == '.') { j++; while (j < m && sql_is_digit(t[j])) { j++; digits++; } }
        if (!digits) return 1;
        if (j < m && (t[j] == 'e' || t[j] == 'E')) {
            j++;
            if (j < m && (t[j] == '+' || t[j] == '-')) j++;
            if (j >= m || !sql_is_digit(t[j])) return 1;
            while (j < m && sql_is_digit(t[j])) j++;
        }
        end = j;
        if (j < m && (t[j] == 'f' || t[j] == 'F' || t[j] == 'd' || t[j] == 'D')) j++;
        if (j != m) return 1;
    }
    char small[128];
    char *z = end < (int64_t)sizeof small ? small : malloc((size_t)end + 1);
    if (!z) return 1;
    memcpy(z, t, (size_t)end);
    z[end] = 0;
    *out = strtod_l(z, NULL, c->c_locale);   /* correctly rounded, hex included */
    if (z != small) free(z);
    return 0;
}

static int sql_bool_of(const uint8_t *s, int64_t n) {
    static const char t[] = "true";
    if (n != 4) return 0;
    for (int k = 0; k < 4; k++)
        if ((s[k] | 0x20) != t[k]) return 0;
    return 1;
}

static int sql_cmp_i(int64_t a, int64_t b) { return (a > b) - (a < b); }

static int sql_cmp_d(double a, double b) {   /* Double.compare */
    if (a < b) return -1;
    if (a > b) return 1;
    int64_t x, y;
    double na = NAN;
    if (isnan(a)) memcpy(&x, &na, 8); else memcpy(&x, &a, 8);
    if (isnan(b)) memcpy(&y, &na, 8); else memcpy(&y, &b, 8);
    return sql_cmp_i(x, y);
}

/* `to` kind of string s: 1 on a Java exception. */
static int sql_convert(const sql_ctx *c, int kind, const uint8_t *s, int64_t n, jv *out) {
    out->k = kind;
    if (kind == JV_INT) return sql_java_int(s, n, INT32_MIN, INT32_MAX, &out->i);
    if (kind == JV_LONG) return sql_java_int(s, n, INT64_MIN, INT64_MAX, &out->i);
    if (kind == JV_DOUBLE) return sql_java_double(c, s, n, &out->d);
    out->i = sql_bool_of(s, n);
    return 0;
}

static int sql_same(const jv *l, const jv *r) {      /* compareTo of one class */
    if (l->k == JV_DOUBLE) return sql_cmp_d(l->d, r->d);
    if (l->k == JV_STR) {
        int64_t m = l->n < r->n ? l->n : r->n;
        int k = m ? memcmp(l->s, r->s, (size_t)m) : 0;
        return k ? (k > 0 ? 1 : -1) : sql_cmp_i(l->n, r->n);
    }
    return sql_cmp_i(l->i, r->i);
}

/* __compare(lv, rv, true) of two non-null values into *res; 1 on a Java exception. */
static int sql_compare(const sql_ctx *c, jv l, jv r, int *res) {
    if (l.k == r.k) { *res = sql_same(&l, &r); return 0; }
    switch (l.k) {
    case JV_BOOL:
        if (r.k == JV_STR) return 1;                   /* ClassCastException */
        *res = -1;
        return 0;
    case JV_INT:
    case JV_LONG:
        if (r.k == JV_DOUBLE) { l.d = (double)l.i; l.k = JV_DOUBLE; break; }
        if (r.k == JV_INT || r.k == JV_LONG) { *res = sql_cmp_i(l.i, r.i); return 0; }
        if (r.k == JV_STR) {
            jv t;
            if (sql_convert(c, l.k, r.s, r.n, &t)) return 1;
            *res = sql_cmp_i(l.i, t.i);
            return 0;
        }
        *res = -1;
        return 0;
    case JV_DOUBLE:
        if (r.k == JV_INT || r.k == JV_LONG) { r.d = (double)r.i; r.k = JV_DOUBLE; break; }
        if (r.k == JV_STR) {
            jv t;
            if (sql_convert(c, JV_DOUBLE, r.s, r.n, &t)) return 1;
            *res = sql_cmp_d(l.d, t.d);
            return 0;
        }
        *res = -1;
        return 0;
    case JV_STR:
        if (r.k == JV_BOOL || r.k == JV_INT || r.k == JV_LONG || r.k == JV_DOUBLE) {
            jv t;
            if (sql_convert(c, r.k, l.s, l.n, &t)) return 1;
            *res = sql_same(&t, &r);
            return 0;
        }
        *res = -1;
        return 0;
    default:
        *res = -1;
        return 0;
    }
    *res = sql_cmp_d(l.d, r.d);
    return 0;
}

static int sql_equals(const jv *l, const jv *r) {
    if (l->k != r->k) return 0;
    if (l->k == JV_DOUBLE) {
        double a = isnan(l->d) ? NAN : l->d, b = isnan(r->d) ? NAN : r->d;
        return memcmp(&a, &b, 8) == 0;
    }
    if (l->k == JV_STR) return l->n == r->n && (l->n == 0 || memcmp(l->s, r->s, (size_t)l->n) == 0);
    return l->i == r->i;
}

static void sql_str(const rmq_sql_prog *p, int32_t k, const uint8_t **s, int64_t *n) {
    *s = p->strings + p->str_off[k];
    *n = p->str_off[k + 1] - p->str_off[k];
}

#define JB(x) ((jv){JV_BOOL, (x) ? 1 : 0, 0, NULL, 0})

static int sql_ev(const sql_ctx *c, int32_t at, jv *o) {
    const rmq_sql_node *nd = &c->p->nodes[at];
    jv l, r;
    int res;
    memset(o, 0, sizeof *o);
    switch (nd->op) {
    case RMQ_SQL_CONST:
        o->k = nd->kind;
        o->i = nd->ival;
        o->d = nd->dval;
        if (nd->kind == JV_STR) sql_str(c->p, nd->str, &o->s, &o->n);
        return 0;
    case RMQ_SQL_PROP:
        if (c->pp[nd->str]) { o->k = JV_STR; o->s = c->pv[nd->str]; o->n = c->pn[nd->str]; }
        return 0;
    case RMQ_SQL_NEG:
        if (sql_ev(c, nd->a, &l)) return 1;
        if (l.k == JV_INT || l.k == JV_LONG) { o->k = l.k; o->i = (int64_t)(0 - (uint64_t)l.i); }
        else if (l.k == JV_DOUBLE) { o->k = l.k; o->d = -l.d; }
        return 0;
    case RMQ_SQL_CAST:
        if (sql_ev(c, nd->a, &l)) return 1;
        if (l.k != JV_NULL) *o = JB(l.k == JV_BOOL && l.i);
        return 0;
    case RMQ_SQL_LESS:
        if (sql_ev(c, nd->a, &l)) return 1;
        if (l.k == JV_NULL) return 0;
        if (sql_ev(c, nd->b, &r)) return 1;
        if (r.k == JV_NULL) return 0;
        if (l.k == JV_STR && r.k == JV_STR) {
            jv a, b;
            if (sql_convert(c, JV_DOUBLE, l.s, l.n, &a) || sql_convert(c, JV_DOUBLE, r.s, r.n, &b)) return 1;
            l = a;
            r = b;
        }
        if (sql_compare(c, l, r, &res)) return 1;
        *o = JB(nd->kind == 0 ? res > 0 : nd->kind == 1 ? res >= 0 : nd->kind == 2 ? res < 0 : res <= 0);
        return 0;
    case RMQ_SQL_EQ:
        if (sql_ev(c, nd->a, &l) || sql_ev(c, nd->b, &r)) return 1;
        if ((l.k == JV_NULL) != (r.k == JV_NULL)) {
            if (r.k == JV_NULL) *o = JB(0);
            return 0;
        }
        if (l.k == JV_NULL || sql_equals(&l, &r)) { *o = JB(1); return 0; }
        if (sql_compare(c, l, r, &res)) return 1;
        *o = JB(res == 0);
        return 0;
    case RMQ_SQL_NOT:
        if (sql_ev(c, nd->a, &l)) return 1;
        if (l.k == JV_NULL) return 0;
        if (l.k != JV_BOOL) return 1;
        *o = JB(!l.i);
        return 0;
    case RMQ_SQL_AND:
    case RMQ_SQL_OR: {
        int stop = nd->op == RMQ_SQL_OR;        /* the value that decides alone */
        if (sql_ev(c, nd->a, &l)) return 1;
        if (l.k != JV_NULL && l.k != JV_BOOL) return 1;
        if (l.k == JV_BOOL && l.i == stop) { *o = JB(stop); return 0; }
        if (sql_ev(c, nd->b, &r)) return 1;
        if (r.k != JV_NULL && r.k != JV_BOOL) return 1;
        if (r.k == JV_BOOL && r.i == stop) { *o = JB(stop); return 0; }
        if (l.k != JV_NULL && r.k != JV_NULL) *o = JB(!stop);
        return 0;
    }
    case RMQ_SQL_IN: {
        if (sql_ev(c, nd->a, &l)) return 1;
        if (l.k != JV_STR) return 0;
        int hit = 0;
        for (int32_t k = 0; k < nd->nstr && !hit; k++) {
            const uint8_t *s;
            int64_t n;
            sql_str(c->p, nd->str + k, &s, &n);
            hit = n == l.n && (n == 0 || memcmp(s, l.s, (size_t)n) == 0);
        }
        *o = JB(hit != nd->negated);
        return 0;
    }
    case RMQ_SQL_STRTEST: {
        const uint8_t *s;
        int64_t n;
        sql_str(c->p, nd->str, &s, &n);
        *o = JB(0);
        if (n == 0) return 0;                  /* an empty search is false, NOT included */
        if (sql_ev(c, nd->a, &l)) return 1;
        if (l.k != JV_STR) return 0;
        int hit = 0;
        if (n <= l.n) {
            if (nd->kind == 1) hit = memcmp(l.s, s, (size_t)n) == 0;
            else if (nd->kind == 2) hit = memcmp(l.s + l.n - n, s, (size_t)n) == 0;
            else hit = memmem(l.s, (size_t)l.n, s, (size_t)n) != NULL;
        }
        *o = JB(hit != nd->negated);
        return 0;
    }
    default:
        return 1;
    }
}

/* 1 when the program is not one the evaluator can run safely (recursion bounded). */
static int sql_check_prog(const rmq_sql_prog *p) {
    if (!p || !p->nodes || p->nnodes < 1 || p->root < 0 || p->root >= p->nnodes || !p->str_off ||
        p->nstrings < 0 || (p->nstrings > 0 && !p->strings) || p->nprops < 0 ||
        p->nprops > SQL_MAX_PROPS || (p->nprops > 0 && !p->prop_str))
        return 1;
    for (int32_t k = 0; k < p->nstrings; k++)
        if (p->str_off[k] < 0 || p->str_off[k + 1] < p->str_off[k]) return 1;
    for (int32_t k = 0; k < p->nprops; k++)
        if (p->prop_str[k] < 0 || p->prop_str[k] >= p->nstrings) return 1;
    int32_t *depth = malloc(sizeof(int32_t) * (size_t)p->nnodes);
    if (!depth) return 1;
    int bad = 0;
    for (int32_t k = 0; k < p->nnodes && !bad; k++) {
        const rmq_sql_node *nd = &p->nodes[k];
        /* children come before their parent: the program is a tree without cycles */
        int kids = nd->op == RMQ_SQL_LESS || nd->op == RMQ_SQL_EQ || nd->op == RMQ_SQL_AND ||
                   nd->op == RMQ_SQL_OR ? 2 : nd->op == RMQ_SQL_CONST || nd->op == RMQ_SQL_PROP ? 0 : 1;
        bad = (kids >= 1 && (nd->a < 0 || nd->a >= k)) || (kids == 2 && (nd->b < 0 || nd->b >= k)) ||
              (nd->op == RMQ_SQL_PROP && (nd->str < 0 || nd->str >= p->nprops)) ||
              (nd->op == RMQ_SQL_CONST && (nd->kind < JV_NULL || nd->kind > JV_BOOL ||
                                           (nd->kind == JV_STR && (nd->str < 0 || nd->str >= p->nstrings)) ||
                                           (nd->kind == JV_BOOL && (nd->ival < 0 || nd->ival > 1)) ||
                                           (nd->kind == JV_INT && (nd->ival < INT32_MIN || nd->ival > INT32_MAX)))) ||
              (nd->op == RMQ_SQL_STRTEST && (nd->str < 0 || nd->str >= p->nstrings)) ||
              (nd->op == RMQ_SQL_IN && (nd->str < 0 || nd->nstr < 0 || nd->str > p->nstrings - nd->nstr)) ||
              nd->op < RMQ_SQL_CONST || nd->op > RMQ_SQL_STRTEST;
        if (bad) break;
        depth[k] = 1 + (kids >= 1 ? depth[nd->a] : 0);
        if (kids == 2 && depth[nd->b] + 1 > depth[k]) depth[k] = depth[nd->b] + 1;
        bad = depth[k] > SQL_MAX_DEPTH;
    }
    free(depth);
    return bad;
}

int rmq_sql_eval(const rmq_sql_prog *p, int64_t rows, int64_t row_offset, const int32_t *map_off,
                 const uint8_t *map_valid, const int32_t *key_off, const uint8_t *key_data,
                 const int32_t *val_off, const uint8_t *val_data, int64_t entries,
                 int64_t key_bytes, int64_t val_bytes, uint8_t *out, rmq_error *err) {
    clear_err(err);
    if (sql_check_prog(p) || rows < 0 || row_offset < 0 || !out || (rows > 0 && !map_off) ||
        entries < 0 || (entries > 0 && (!key_off || !val_off)) || key_bytes < 0 || val_bytes < 0)
        return set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "bad selector program or column");
    sql_ctx c;
    memset(&c, 0, sizeof c);
    c.p = p;
    c.c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    if (!c.c_locale) return set_err(err, RMQ_E_NOMEM, NULL, -1, -1, -1, "out of memory");
    int code = RMQ_OK;
    for (int64_t r = 0; r < rows; r++) {
        int64_t row = row_offset + r;
        memset(c.pp, 0, sizeof c.pp);
        if (!map_valid || (map_valid[row >> 3] >> (row & 7) & 1)) {
            int64_t e0 = map_off[row], e1 = map_off[row + 1];
            if (e0 < 0 || e1 < e0 || e1 > entries) {
                code = set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "map offsets of row %lld out of "
                               "bounds", (long long)r);
                break;
            }
            for (int64_t e = e0; e < e1; e++) {
                int64_t ka = key_off[e], kb = key_off[e + 1], va = val_off[e], vb = val_off[e + 1];
                if (ka < 0 || kb < ka || kb > key_bytes || va < 0 || vb < va || vb > val_bytes) {
                    code = set_err(err, RMQ_E_ARG, NULL, -1, -1, -1, "key/value offsets of entry %lld "
                                   "out of bounds", (long long)e);
                    goto done;
                }
                for (int32_t k = 0; k < p->nprops; k++) {
                    const uint8_t *s;
                    int64_t n;
                    sql_str(p, p->prop_str[k], &s, &n);
                    if (n == kb - ka && (n == 0 || memcmp(key_data + ka, s, (size_t)n) == 0)) {
                        c.pv[k] = val_data + va;
                        c.pn[k] = vb - va;
                        c.pp[k] = 1;
                    }
                }
            }
        }
        jv v;
        out[r] = !sql_ev(&c, p->root, &v) && v.k == JV_BOOL && v.i;
    }
done:
    freelocale(c.c_locale);
    return code;
}
