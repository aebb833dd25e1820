/* Native helpers of the adapters (optional: setup.py builds them where a C compiler is found; each
   has a Python twin that gives the same result). forest(): canonical.nest's stack pass, with each
   span's outermost mapped ancestor and nearest op (canonical.forest). query():
   an SQLite query's result as columns (nsys).
   scan(): the elements of a Kineto trace's traceEvents array, scanned into columns in one pass
   (by two threads where the text is large: the second from an element boundary near the middle,
   which the first thread's own pass must meet exactly, else one thread reads it all).

   scan(data, start, end) reads data[start:end], the text between the array's brackets, and
   returns the columns of its complete events (ph "X") or None where it cannot vouch that they are
   exactly what kernelmap's typed msgspec path (kineto._typed_columns) gives: any JSON it does not
   take as valid, an element that is not an object, args that is neither an object nor null, a
   complete event without a string name or a number ts, a cat that is not a string or null, a
   number it does not read exactly (an integer beyond 2**53 in a numeric field, beyond int64 in
   ts/dur, a non-finite value), a bool or other non-number where a number is read, a grid/block
   list shorter than 3, a key written with escapes, a repeated key, invalid UTF-8, a lone
   surrogate. The caller then takes the Python path, which decides (and finds any error).

   Result: (n, cols, names, cats, dims, odd) where cols maps a column name to a Block, its array
   in memory handed over without a copy (int64 idx; int32 name, cat, dims codes; int64 ts and dur
   in nanoseconds, exactly the decimal text times 1000 rounded half to even (ns_of_number); float64 ext, NaN for missing/null; int64 the rest, each beside "<name>_na", a
   bool mask of its missing/null rows), names the distinct names (str), cats the distinct
   categories (cats[0] is None), dims the distinct raw "Input Dims" texts (bytes), odd a list of
   (column, row, str) for string pid/tid values and string args (correlation, ext, seq, stream,
   bytes: NaN in their columns), close the offset in data of the "]" that ended the
   elements before end (a later member of the document holds an array of its own, whose "]" the
   caller took for the array's), or -1.

   first_value(): where a member's first string value of a few wanted ones is (the peek at a trace's first
   device event; its twin: kineto._DEVICE_CAT). */

#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>
#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

typedef struct { char *p; size_t n, cap; } Buf;

/* A Buf's memory. On Linux: pages of its own (mmap), grown by mremap, which moves pages, not bytes.
   Grown by realloc in the C heap, a column of a million rows leaves the smaller blocks it outgrew
   behind as holes, and where the heap keeps freed pages (kernelmap.heap.freed_pages_kept,
   normalise's policy) those holes stay resident: 70 MB more at the peak of a 1M-event Kineto scan. */
#ifdef __linux__
#include <sys/mman.h>
#define BUF_MAPPED 1
#else
#define BUF_MAPPED 0
#endif

static char *buf_mem(char *p, size_t old, size_t cap) {
#if BUF_MAPPED
    void *q = p ? mremap(p, old, cap, MREMAP_MAYMOVE)
                : mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return q == MAP_FAILED ? NULL : (char *)q;
#else
    (void)old;
    return realloc(p, cap);
#endif
}

static void buf_mem_free(char *p, size_t cap) {
#if BUF_MAPPED
    if (p) munmap(p, cap);
#else
    (void)cap;
    free(p);
#endif
}

static void buf_free(Buf *b) {
    buf_mem_free(b->p, b->cap);
    b->p = NULL; b->n = b->cap = 0;
}

static int buf_put(Buf *b, const void *v, size_t sz) {
    if (b->n + sz > b->cap) {
        size_t c = b->cap ? b->cap * 2 : (1 << 16);
        while (c < b->n + sz) c *= 2;
        char *q = buf_mem(b->p, b->cap, c);
        if (!q) return -1;
        b->p = q; b->cap = c;
    }
    memcpy(b->p + b->n, v, sz);
    b->n += sz;
    return 0;
}

/* --- Block: a malloc'd buffer or a Buf's pages handed to Python without a copy (writable, freed
   with the object) --- */
typedef struct { PyObject_HEAD char *p; Py_ssize_t n; size_t cap; int mapped; } Block;  /* mapped: a Buf's pages */

static int block_getbuffer(PyObject *self, Py_buffer *view, int flags) {
    Block *b = (Block *)self;
    return PyBuffer_FillInfo(view, self, b->p, b->n, 0, flags);
}

static void block_dealloc(PyObject *self) {
    Block *b = (Block *)self;
    if (b->mapped) buf_mem_free(b->p, b->cap); else free(b->p);
    Py_TYPE(self)->tp_free(self);
}

static PyBufferProcs block_as_buffer = {block_getbuffer, NULL};

static PyTypeObject BlockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kernelmap.adapters._native.Block",
    .tp_basicsize = sizeof(Block),
    .tp_dealloc = block_dealloc,
    .tp_as_buffer = &block_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A column's memory, owned here and exported as a writable buffer (numpy.frombuffer).",
};

/* a Block that takes over p (n bytes of cap; mapped: a Buf's pages, else malloc'd), or NULL (p freed) */
static PyObject *block_take(char *p, Py_ssize_t n, size_t cap, int mapped) {
    Block *b = PyObject_New(Block, &BlockType);
    if (!b) { if (mapped) buf_mem_free(p, cap); else free(p); return NULL; }
    b->p = p; b->n = n; b->cap = cap; b->mapped = mapped;
    return (PyObject *)b;
}

/* a Block that takes over p (n malloc'd bytes; NULL: a fresh block of n bytes), or NULL (p freed) */
static PyObject *block_new(char *p, Py_ssize_t n) {
    if (!p) p = malloc(n ? n : 1);
    if (!p) return PyErr_NoMemory();
    return block_take(p, n, (size_t)n, 0);
}

/* a Block that takes over a Buf's memory (the Buf is left empty), or NULL (the memory freed) */
static PyObject *block_of_buf(Buf *buf) {
    char *p = buf->p;
    Py_ssize_t n = (Py_ssize_t)buf->n;
    size_t cap = buf->cap;
    buf->p = NULL; buf->n = buf->cap = 0;
    return p ? block_take(p, n, cap, BUF_MAPPED) : block_new(NULL, n);  /* none yet: a fresh block */
}

/* --- interning of byte spans: open addressing, id per distinct span ------------------------- */
typedef struct { const char *s; Py_ssize_t n; int32_t id; } Slot;
typedef struct { const char *s; Py_ssize_t n; int esc; } Span;
typedef struct { Slot *t; size_t cap, used; Buf spans; } Intern;  /* spans: a Span per id */

/* eight bytes at a time (names are long: kernel names of a hundred bytes and more), mixed as
   murmur3's finaliser does */
static uint64_t hash_bytes(const char *s, Py_ssize_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n, w;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdULL;
        h ^= h >> 32;
    }
    if (i < n) {
        w = 0;
        memcpy(&w, s + i, (size_t)(n - i));
        h = (h ^ w) * 0xc4ceb9fe1a85ec53ULL;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
}

static int intern_init(Intern *in) {
    memset(in, 0, sizeof *in);
    in->cap = 1024;
    in->t = calloc(in->cap, sizeof(Slot));
    return in->t ? 0 : -1;
}

static void intern_free(Intern *in) { free(in->t); buf_free(&in->spans); }

static Py_ssize_t intern_size(const Intern *in) { return (Py_ssize_t)(in->spans.n / sizeof(Span)); }

static int intern_grow(Intern *in) {
    size_t cap = in->cap * 2;
    Slot *t = calloc(cap, sizeof(Slot));
    if (!t) return -1;
    for (size_t i = 0; i < in->cap; i++) {
        if (!in->t[i].s) continue;
        size_t j = hash_bytes(in->t[i].s, in->t[i].n) & (cap - 1);
        while (t[j].s) j = (j + 1) & (cap - 1);
        t[j] = in->t[i];
    }
    free(in->t); in->t = t; in->cap = cap;
    return 0;
}

/* id of the span (ids in order of first sight), -1 where memory runs out */
static int32_t intern_find(Intern *in, const char *s, Py_ssize_t n, int esc) {
    size_t j = hash_bytes(s, n) & (in->cap - 1);
    while (in->t[j].s) {
        if (in->t[j].n == n && memcmp(in->t[j].s, s, n) == 0) return in->t[j].id;
        j = (j + 1) & (in->cap - 1);
    }
    if ((in->used + 1) * 2 > in->cap) {
        if (intern_grow(in) < 0) return -1;
        return intern_find(in, s, n, esc);
    }
    Span sp = {s, n, esc};
    int32_t id = (int32_t)intern_size(in);
    if (buf_put(&in->spans, &sp, sizeof sp)) return -1;
    in->t[j].s = s; in->t[j].n = n; in->t[j].id = id;
    in->used++;
    return id;
}

/* --- the scanner ----------------------------------------------------------------------------- */
typedef struct { const char *p, *end; int bad; } S;

#define WS(c) ((c) == ' ' || (c) == '\t' || (c) == '\n' || (c) == '\r')
static inline void skip_ws(S *s) { while (s->p < s->end && WS(*s->p)) s->p++; }

/* a string at s->p (at its quote): span of its content in *a, *n; *esc = has escapes. Validates
   UTF-8 and escapes. */
static int scan_string(S *s, const char **a, Py_ssize_t *n, int *esc) {
    const unsigned char *p = (const unsigned char *)s->p + 1, *e = (const unsigned char *)s->end;
    *esc = 0;
    while (p < e) {
#ifdef __SSE2__
        /* sixteen plain bytes at a time: none a quote, backslash, control or non-ASCII byte (as
           signed bytes, control and non-ASCII bytes are the ones below 0x20) */
        while (e - p >= 16) {
            __m128i x = _mm_loadu_si128((const __m128i *)p);
            __m128i sp = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, _mm_set1_epi8('"')),
                                                   _mm_cmpeq_epi8(x, _mm_set1_epi8('\\'))),
                                      _mm_cmplt_epi8(x, _mm_set1_epi8(0x20)));
            int m = _mm_movemask_epi8(sp);
            if (m) { p += __builtin_ctz((unsigned)m); break; }
            p += 16;
        }
#endif
        /* eight plain bytes at a time: none a quote, backslash, control or non-ASCII byte */
        while (e - p >= 8) {
            uint64_t x;
            memcpy(&x, p, 8);
            const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
            uint64_t q = x ^ (ones * '"'), b = x ^ (ones * '\\');
            uint64_t special = ((q - ones) & ~q) | ((b - ones) & ~b) | (x - ones * 0x20) | x;
            if (special & highs) break;
            p += 8;
        }
        if (p >= e) break;
        unsigned char c = *p;
        if (c == '"') {
            *a = s->p + 1; *n = (const char *)p - (s->p + 1);
            s->p = (const char *)p + 1;
            return 0;
        }
        if (c < 0x20) return -1;
        if (c == '\\') {
            *esc = 1;
            if (p + 1 >= e) return -1;
            c = p[1];
            if (c == 'u') {
                if (p + 6 > e) return -1;
                for (int k = 2; k < 6; k++) if (!isxdigit(p[k])) return -1;
                p += 6;
            } else if (strchr("\"\\/bfnrt", c) && c) {
                p += 2;
            } else return -1;
            continue;
        }
        if (c < 0x80) { p++; continue; }
        int len = (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        if (!len || p + len > e) return -1;
        for (int k = 1; k < len; k++) if ((p[k] & 0xC0) != 0x80) return -1;
        if (c == 0xE0 && p[1] < 0xA0) return -1;  /* overlong */
        if (c == 0xED && p[1] > 0x9F) return -1;  /* surrogate */
        if (c == 0xF0 && p[1] < 0x90) return -1;
        if (c == 0xF4 && p[1] > 0x8F) return -1;
        p += len;
    }
    return -1;
}

static int hexval(char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }

/* the str of a string's content (escapes decoded); NULL (no exception set) where we bail */
static PyObject *decode_string(const char *a, Py_ssize_t n, int esc) {
    if (!esc) {
        PyObject *r = PyUnicode_DecodeUTF8(a, n, NULL);
        if (!r) PyErr_Clear();
        return r;
    }
    char *out = malloc(n + 1), *o = out;
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n;) {
        if (a[i] != '\\') { *o++ = a[i++]; continue; }
        char c = a[i + 1];
        i += 2;
        switch (c) {
            case '"': *o++ = '"'; break;
            case '\\': *o++ = '\\'; break;
            case '/': *o++ = '/'; break;
            case 'b': *o++ = '\b'; break;
            case 'f': *o++ = '\f'; break;
            case 'n': *o++ = '\n'; break;
            case 'r': *o++ = '\r'; break;
            case 't': *o++ = '\t'; break;
            case 'u': {
                uint32_t u = 0;
                for (int k = 0; k < 4; k++) u = u * 16 + hexval(a[i + k]);
                i += 4;
                if (u >= 0xD800 && u <= 0xDBFF) {  /* a high surrogate: its low half must follow */
                    if (i + 6 > n || a[i] != '\\' || a[i + 1] != 'u') { free(out); return NULL; }
                    uint32_t l = 0;
                    for (int k = 0; k < 4; k++) l = l * 16 + hexval(a[i + 2 + k]);
                    if (l < 0xDC00 || l > 0xDFFF) { free(out); return NULL; }
                    i += 6;
                    u = 0x10000 + ((u - 0xD800) << 10) + (l - 0xDC00);
                } else if (u >= 0xDC00 && u <= 0xDFFF) { free(out); return NULL; }
                if (u < 0x80) *o++ = (char)u;
                else if (u < 0x800) { *o++ = 0xC0 | (u >> 6); *o++ = 0x80 | (u & 0x3F); }
                else if (u < 0x10000) { *o++ = 0xE0 | (u >> 12); *o++ = 0x80 | ((u >> 6) & 0x3F); *o++ = 0x80 | (u & 0x3F); }
                else { *o++ = 0xF0 | (u >> 18); *o++ = 0x80 | ((u >> 12) & 0x3F); *o++ = 0x80 | ((u >> 6) & 0x3F); *o++ = 0x80 | (u & 0x3F); }
                break;
            }
            default: free(out); return NULL;
        }
    }
    PyObject *r = PyUnicode_DecodeUTF8(out, o - out, NULL);
    free(out);
    if (!r) PyErr_Clear();
    return r;
}

/* kinds of value a field holds */
enum { V_NONE = 0, V_NUM, V_STR, V_OTHER };

/* a JSON number's grammar only (a value not read) */
static int skip_number(S *s) {
    const char *p = s->p, *e = s->end;
    if (p < e && *p == '-') p++;
    if (p >= e) return -1;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') while (p < e && *p >= '0' && *p <= '9') p++;
    else return -1;
    if (p < e && *p == '.') {
        p++;
        if (p >= e || *p < '0' || *p > '9') return -1;
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < e && (*p == '+' || *p == '-')) p++;
        if (p >= e || *p < '0' || *p > '9') return -1;
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    s->p = p;
    return 0;
}

/* a JSON number at s->p: *d its double; *isint; *big = an integer beyond int64 or a literal we do
   not read. Grammar checked as JSON's. */
static int scan_number(S *s, double *d, int *isint, int *big) {
    const char *b = s->p;
    if (skip_number(s)) return -1;
    const char *p = s->p;
    *isint = 1; *big = 0;
    for (const char *q = b; q < p; q++) if (*q == '.' || *q == 'e' || *q == 'E') { *isint = 0; break; }
    Py_ssize_t n = p - b;
    if (*isint) {
        const char *q = b;
        int neg = 0;
        if (*q == '-') { neg = 1; q++; }
        if (p - q > 18) { *big = 1; *d = 0; return 0; }  /* may not fit int64: not read here */
        int64_t v = 0;
        for (; q < p; q++) v = v * 10 + (*q - '0');
        *d = (double)(neg ? -v : v);
        return 0;
    }
    {   /* Clinger's fast path: an integer mantissa up to 2**53 and a power of ten up to 22 are
           exact doubles, so one multiplication or division rounds correctly, as strtod does */
        static const double P10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                     1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
        const char *q = b;
        int neg = 0, digits = 0, exp10 = 0, ok = 1;
        uint64_t m = 0;
        if (*q == '-') { neg = 1; q++; }
        for (; q < p && *q >= '0' && *q <= '9'; q++) { if (m || *q != '0') digits++; m = m * 10 + (*q - '0'); if (digits > 19) ok = 0; }
        if (q < p && *q == '.') {
            for (q++; q < p && *q >= '0' && *q <= '9'; q++) { if (m || *q != '0') digits++; m = m * 10 + (*q - '0'); exp10--; if (digits > 19) ok = 0; }
        }
        if (m > (1ULL << 53)) ok = 0;  /* (up to 19 digits m has not overflowed) */
        if (ok && q < p && (*q == 'e' || *q == 'E')) {
            int eneg = 0, ev = 0;
            q++;
            if (*q == '+' || *q == '-') { eneg = *q == '-'; q++; }
            for (; q < p; q++) { ev = ev * 10 + (*q - '0'); if (ev > 400) { ok = 0; break; } }
            exp10 += eneg ? -ev : ev;
        }
        if (ok && exp10 >= -22 && exp10 <= 22) {
            double v = (double)m;
            v = exp10 < 0 ? v / P10[-exp10] : v * P10[exp10];
            *d = neg ? -v : v;
            return 0;
        }
    }
    char tmp[64];
    if (n >= (Py_ssize_t)sizeof tmp) { *big = 1; *d = 0; return 0; }
    memcpy(tmp, b, n); tmp[n] = 0;
    *d = strtod(tmp, NULL);
    if (!isfinite(*d)) *big = 1;
    return 0;
}

/* the JSON number text [b, p) of microseconds as int64 nanoseconds: the exact decimal times 1000,
   rounded half to even (_common.ns_from_text); -1 where it is not read here (more than 19
   significant digits, nanoseconds beyond int64): the caller then declines the file */
static int ns_of_number(const char *b, const char *p, int64_t *out) {
    static const uint64_t P10[] = {1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL,
        100000000ULL, 1000000000ULL, 10000000000ULL, 100000000000ULL, 1000000000000ULL, 10000000000000ULL,
        100000000000000ULL, 1000000000000000ULL, 10000000000000000ULL, 100000000000000000ULL,
        1000000000000000000ULL, 10000000000000000000ULL};
    const char *q = b;
    int neg = 0, digits = 0, exp10 = 0;
    uint64_t m = 0, v;
    if (q < p && *q == '-') { neg = 1; q++; }
    for (; q < p && *q >= '0' && *q <= '9'; q++) {
        if (m || *q != '0') digits++;
        if (digits > 19) return -1;
        m = m * 10 + (uint64_t)(*q - '0');
    }
    if (q < p && *q == '.')
        for (q++; q < p && *q >= '0' && *q <= '9'; q++) {
            if (m || *q != '0') digits++;
            if (digits > 19) return -1;
            m = m * 10 + (uint64_t)(*q - '0');
            exp10--;
        }
    if (q < p && (*q == 'e' || *q == 'E')) {
        int eneg = 0, ev = 0;
        q++;
        if (q < p && (*q == '+' || *q == '-')) { eneg = *q == '-'; q++; }
        for (; q < p; q++) { if (ev < 100000) ev = ev * 10 + (*q - '0'); }
        exp10 += eneg ? -ev : ev;
    }
    int k = exp10 + 3;
    if (m == 0) v = 0;
    else if (k >= 0) {
        if (k > 18 || m > (uint64_t)INT64_MAX / P10[k]) return -1;
        v = m * P10[k];
    } else if (-k > 19) v = 0;  /* m < 10**19 <= 10**-k / 10: under a tenth of a nanosecond */
    else {
        uint64_t pw = P10[-k], r = m % pw;
        v = m / pw;
        if (r > pw - r || (r == pw - r && (v & 1))) v++;
    }
    if (v > (uint64_t)INT64_MAX) return -1;
    *out = neg ? -(int64_t)v : (int64_t)v;
    return 0;
}

static int skip_value(S *s, int depth);


static int skip_container(S *s, int depth, char close) {
    if (depth > 200) return -1;
    s->p++;
    skip_ws(s);
    if (s->p < s->end && *s->p == close) { s->p++; return 0; }
    for (;;) {
        if (close == '}') {
            const char *a; Py_ssize_t n; int esc;
            if (s->p >= s->end || *s->p != '"' || scan_string(s, &a, &n, &esc)) return -1;
            skip_ws(s);
            if (s->p >= s->end || *s->p != ':') return -1;
            s->p++;
            skip_ws(s);
        }
        if (skip_value(s, depth + 1)) return -1;
        skip_ws(s);
        if (s->p >= s->end) return -1;
        if (*s->p == ',') { s->p++; skip_ws(s); continue; }
        if (*s->p == close) { s->p++; return 0; }
        return -1;
    }
}

static int lit(S *s, const char *w, int n) {
    if (s->end - s->p < n || memcmp(s->p, w, n)) return -1;
    s->p += n;
    return 0;
}

static int skip_value(S *s, int depth) {
    if (s->p >= s->end) return -1;
    char c = *s->p;
    if (c == '{') return skip_container(s, depth, '}');
    if (c == '[') return skip_container(s, depth, ']');
    if (c == '"') { const char *a; Py_ssize_t n; int esc; return scan_string(s, &a, &n, &esc); }
    if (c == 't') return lit(s, "true", 4);
    if (c == 'f') return lit(s, "false", 5);
    if (c == 'n') return lit(s, "null", 4);
    return skip_number(s);
}

/* a value read as a number: V_NONE for null, V_NUM for a number (in *d); -1 to bail */
static int num_value(S *s, double *d, int limit53) {
    if (s->p < s->end && *s->p == 'n') { *d = NAN; return lit(s, "null", 4) ? -1 : V_NONE; }
    if (s->p >= s->end || !(*s->p == '-' || (*s->p >= '0' && *s->p <= '9'))) return -1;
    int isint, big;
    if (scan_number(s, d, &isint, &big) || big) return -1;
    if (limit53 && fabs(*d) >= 9007199254740992.0) return -1;
    return V_NUM;
}

/* grid/block: a list of >= 3 numbers/null (x, y, z), or anything else, which reads as missing */
static int triple_value(S *s, double xyz[3], int depth) {
    xyz[0] = xyz[1] = xyz[2] = NAN;
    if (s->p >= s->end || *s->p != '[') return skip_value(s, depth);
    const char *open = s->p;
    s->p++;
    skip_ws(s);
    if (s->p < s->end && *s->p == ']') { s->p++; return 0; }  /* [] reads as missing */
    s->p = open;
    s->p++;
    for (int k = 0;; k++) {
        skip_ws(s);
        if (k < 3) {
            if (num_value(s, &xyz[k], 1) < 0) return -1;
        } else if (skip_value(s, depth + 1)) return -1;
        skip_ws(s);
        if (s->p >= s->end) return -1;
        if (*s->p == ',') { s->p++; continue; }
        if (*s->p == ']') { s->p++; return k >= 2 ? 0 : -1; }
        return -1;
    }
}

#define NCOL 19
static const char *COLS[NCOL] = {"idx", "name", "cat", "ts", "dur", "pid", "tid", "correlation", "ext", "seq",
                                 "stream", "bytes", "grid_x", "grid_y", "grid_z", "block_x", "block_y",
                                 "block_z", "dims"};
enum { C_IDX, C_NAME, C_CAT, C_TS, C_DUR, C_PID, C_TID, C_CORR, C_EXT, C_SEQ, C_STREAM, C_BYTES,
       C_GX, C_GY, C_GZ, C_BX, C_BY, C_BZ, C_DIMS };

typedef struct { int col; int64_t row; Span v; } Odd;  /* a string pid/tid or numeric arg */

/* what one scanner thread finds: columns, distinct names/categories/dims, string ids; elements
   read (n) and, where it was asked to stop at a position, whether it met it there (met); the "]"
   that ended the elements before the end of the range, where one did (close) */
typedef struct {
    Buf col[NCOL];
    Intern names, cats, dims;
    Buf odd;
    int64_t n;
    int ok, met;
    const char *close;
} Out;

#define KEY_IS(a, n, lit) ((n) == (Py_ssize_t)(sizeof(lit) - 1) && memcmp((a), (lit), sizeof(lit) - 1) == 0)

static int event_field(const char *k, Py_ssize_t n) {
    switch (n) {
        case 2: return KEY_IS(k, n, "ph") ? 0 : KEY_IS(k, n, "ts") ? 3 : -1;
        case 3: return KEY_IS(k, n, "cat") ? 2 : KEY_IS(k, n, "dur") ? 4 : KEY_IS(k, n, "pid") ? 5
                       : KEY_IS(k, n, "tid") ? 6 : -1;
        case 4: return KEY_IS(k, n, "name") ? 1 : KEY_IS(k, n, "args") ? 7 : -1;
        default: return -1;
    }
}

static int arg_field(const char *k, Py_ssize_t n) {
    switch (n) {
        case 11: return KEY_IS(k, n, "correlation") ? 0 : KEY_IS(k, n, "External id") ? 1 : -1;
        case 15: return KEY_IS(k, n, "Sequence number") ? 2 : -1;
        case 6: return KEY_IS(k, n, "stream") ? 3 : -1;
        case 5: return KEY_IS(k, n, "bytes") ? 4 : KEY_IS(k, n, "block") ? 6 : -1;
        case 4: return KEY_IS(k, n, "grid") ? 5 : -1;
        case 10: return KEY_IS(k, n, "Input Dims") ? 7 : -1;
        default: return -1;
    }
}

/* pid/tid: a number or null, or a string (NaN, listed in odd for the caller) */
static int id_value(S *s, double *d, Out *o, int col, int64_t row, int *is_str) {
    *is_str = 0;
    if (s->p < s->end && *s->p == '"') {
        Odd r = {col, row, {NULL, 0, 0}};
        if (scan_string(s, &r.v.s, &r.v.n, &r.v.esc) || buf_put(&o->odd, &r, sizeof r)) return -1;
        *d = NAN; *is_str = 1;
        return 0;
    }
    return num_value(s, d, 1) < 0 ? -1 : 0;
}

/* a member's key (no escapes: such a key is not read here) and its colon: the field number that
   field() gives it, or -2 to bail; a repeated field bails too (bits of *seen) */
static int member(S *s, int (*field)(const char *, Py_ssize_t), unsigned *seen) {
    const char *k; Py_ssize_t kn; int kesc;
    if (s->p >= s->end || *s->p != '"' || scan_string(s, &k, &kn, &kesc) || kesc) return -2;
    skip_ws(s);
    if (s->p >= s->end || *s->p != ':') return -2;
    s->p++;
    skip_ws(s);
    if (s->p >= s->end) return -2;
    int f = field(k, kn);
    if (f >= 0) {
        if (*seen & (1u << f)) return -2;
        *seen |= 1u << f;
    }
    return f;
}

/* after a member: 1 at a comma (another follows), 0 at the closing brace, -1 to bail */
static int next_member(S *s) {
    skip_ws(s);
    if (s->p >= s->end) return -1;
    if (*s->p == ',') { s->p++; skip_ws(s); return 1; }
    if (*s->p == '}') { s->p++; return 0; }
    return -1;
}

/* one element (an event object); appends its columns where it is complete */
static int event(S *s, Out *o, int64_t idx) {
    if (s->p >= s->end || *s->p != '{') return -1;
    s->p++;
    skip_ws(s);
    int is_x = 0, have_name = 0, name_str = 0, have_ts = 0, cat_kind = V_NONE;
    const char *name_a = NULL, *cat_a = NULL, *pid_p = NULL, *tid_p = NULL;
    Py_ssize_t name_n = 0, cat_n = 0;
    int name_esc = 0, cat_esc = 0;
    double pid = NAN, tid = NAN;
    int64_t ts = 0, dur = 0;
    int ns_ok = 1;  /* ts and dur read exactly as nanoseconds */
    double a_num[5] = {NAN, NAN, NAN, NAN, NAN};  /* correlation, ext, seq, stream, bytes */
    Span a_str[5] = {{0}};  /* one given as a string (ROCm's "bytes": "616"): its text, for the caller */
    double grid[3] = {NAN, NAN, NAN}, block[3] = {NAN, NAN, NAN};
    const char *dims_a = NULL;
    Py_ssize_t dims_n = 0;
    unsigned seen = 0;
    if (s->p < s->end && *s->p == '}') { s->p++; return 0; }
    for (;;) {
        int f = member(s, event_field, &seen);
        if (f == -2) return -1;
        const char *v = s->p;
        switch (f) {
            case 0: {
                if (*v == '"') {
                    const char *a; Py_ssize_t n; int esc;
                    if (scan_string(s, &a, &n, &esc) || esc) return -1;  /* an escaped ph: not read here */
                    is_x = (n == 1 && a[0] == 'X');
                } else if (skip_value(s, 1)) return -1;
                break;
            }
            case 1:
                have_name = 1;
                if (*v == '"') {
                    name_str = 1;
                    if (scan_string(s, &name_a, &name_n, &name_esc)) return -1;
                } else if (skip_value(s, 1)) return -1;
                break;
            case 2:
                if (*v == '"') {
                    cat_kind = V_STR;
                    if (scan_string(s, &cat_a, &cat_n, &cat_esc)) return -1;
                } else if (*v == 'n') {
                    if (lit(s, "null", 4)) return -1;
                } else {
                    cat_kind = V_OTHER;
                    if (skip_value(s, 1)) return -1;
                }
                break;
            case 3: case 4: {
                /* checked for complete events only: any value parses here */
                int64_t ns = 0;
                if (*v == '-' || (*v >= '0' && *v <= '9')) {
                    const char *b0 = s->p;
                    if (skip_number(s)) return -1;
                    if (ns_of_number(b0, s->p, &ns)) ns_ok = 0;  /* not read here: sends a complete event back */
                } else {
                    if (skip_value(s, 1)) return -1;
                    ns_ok = 0;
                }
                if (f == 3) { ts = ns; have_ts = 1; } else dur = ns;
                break;
            }
            case 5: pid_p = v; if (skip_value(s, 1)) return -1; break;
            case 6: tid_p = v; if (skip_value(s, 1)) return -1; break;
            case 7: {
                if (*v == 'n') { if (lit(s, "null", 4)) return -1; break; }
                if (*v != '{') return -1;
                s->p++;
                skip_ws(s);
                if (s->p < s->end && *s->p == '}') { s->p++; break; }
                unsigned aseen = 0;
                for (;;) {
                    int g = member(s, arg_field, &aseen);
                    if (g == -2) return -1;
                    if (g >= 0 && g <= 4) {
                        /* read for every event (the typed path converts them for complete ones only:
                           a value we cannot read bails only where the event is complete) */
                        const char *at = s->p;
                        if (num_value(s, &a_num[g], 1) < 0) {
                            s->p = at;
                            a_num[g] = NAN;
                            if (*at == '"') {  /* a string: NaN here, its text in odd (the caller reads it) */
                                if (scan_string(s, &a_str[g].s, &a_str[g].n, &a_str[g].esc)) return -1;
                            } else {
                                if (skip_value(s, 2)) return -1;
                                seen |= 1u << (16 + g);  /* unreadable: bail if complete */
                            }
                        }
                    } else if (g == 5 || g == 6) {
                        const char *at = s->p;
                        if (triple_value(s, g == 5 ? grid : block, 2)) {
                            s->p = at;
                            if (skip_value(s, 2)) return -1;
                            seen |= 1u << (16 + g);
                        }
                    } else if (g == 7) {
                        const char *at = s->p;
                        if (skip_value(s, 2)) return -1;
                        dims_a = at; dims_n = s->p - at;
                    } else if (skip_value(s, 2)) return -1;
                    int more = next_member(s);
                    if (more < 0) return -1;
                    if (!more) break;
                }
                break;
            }
            default:
                if (skip_value(s, 1)) return -1;
        }
        int more = next_member(s);
        if (more < 0) return -1;
        if (!more) break;
    }
    if (!is_x) return 0;
    if (!have_name || !name_str || !have_ts || cat_kind == V_OTHER) return -1;
    if (!ns_ok) return -1;
    if (seen >> 16) return -1;  /* an arg value not read here */
    int64_t row = (int64_t)(o->col[C_IDX].n / 8);
    int is_str;
    if (pid_p) { S t = {pid_p, s->end, 0}; if (id_value(&t, &pid, o, C_PID, row, &is_str)) return -1; }
    if (tid_p) { S t = {tid_p, s->end, 0}; if (id_value(&t, &tid, o, C_TID, row, &is_str)) return -1; }
    for (int g = 0; g < 5; g++) {
        if (!a_str[g].s) continue;
        Odd r = {C_CORR + g, row, a_str[g]};
        if (buf_put(&o->odd, &r, sizeof r)) return -1;
    }
    int32_t nid = intern_find(&o->names, name_a, name_n, name_esc);
    if (nid < 0) return -1;
    int32_t cid = 0;  /* 0: no category; else 1 + the category's id */
    if (cat_kind == V_STR) {
        cid = intern_find(&o->cats, cat_a, cat_n, cat_esc);
        if (cid < 0) return -1;
        cid++;
    }
    int32_t did = -1;
    if (dims_a) {
        did = intern_find(&o->dims, dims_a, dims_n, 0);
        if (did < 0) return -1;
    }
    double vals[NCOL];
    memcpy(&vals[C_TS], &ts, 8); memcpy(&vals[C_DUR], &dur, 8);  /* int64 nanoseconds, kept as they are */
    vals[C_PID] = pid; vals[C_TID] = tid;
    for (int g = 0; g < 5; g++) vals[C_CORR + g] = a_num[g];
    for (int g = 0; g < 3; g++) { vals[C_GX + g] = grid[g]; vals[C_BX + g] = block[g]; }
    if (buf_put(&o->col[C_IDX], &idx, 8) || buf_put(&o->col[C_NAME], &nid, 4) || buf_put(&o->col[C_CAT], &cid, 4)
        || buf_put(&o->col[C_DIMS], &did, 4)) return -1;
    for (int c = C_TS; c <= C_BZ; c++) if (buf_put(&o->col[c], &vals[c], 8)) return -1;
    return 0;
}

/* elements of [from, end): all of them (stop == NULL), or up to the element boundary at *stop,
   which the scan must meet exactly (o->met); a "]" after an element ends them there (o->close: the
   array closes before the end the caller took, which it checks) */
static void scan_range(const char *from, const char *end, const char *stop, Out *o, int64_t first) {
    S s = {from, end, 0};
    o->ok = 1; o->met = 0; o->n = 0; o->close = NULL;
    skip_ws(&s);
    if (s.p >= s.end) return;
    for (;;) {
        if (event(&s, o, first + o->n)) { o->ok = 0; return; }
        o->n++;
        skip_ws(&s);
        if (s.p >= s.end) return;
        if (*s.p == ']') { o->close = s.p; return; }
        if (*s.p != ',') { o->ok = 0; return; }
        s.p++;
        skip_ws(&s);
        if (s.p >= s.end) { o->ok = 0; return; }  /* a trailing comma */
        if (stop && s.p >= stop) { o->met = s.p == stop; return; }
    }
}

static int out_init(Out *o) {
    memset(o, 0, sizeof *o);
    return (intern_init(&o->names) || intern_init(&o->cats) || intern_init(&o->dims)) ? -1 : 0;
}

static void out_free(Out *o) {
    for (int c = 0; c < NCOL; c++) buf_free(&o->col[c]);
    intern_free(&o->names); intern_free(&o->cats); intern_free(&o->dims);
    buf_free(&o->odd);
}

/* b's rows appended to a's (b read the elements after a's): b's codes re-interned in a's tables */
static int out_join(Out *a, Out *b) {
    Intern *ta[3] = {&a->names, &a->cats, &a->dims}, *tb[3] = {&b->names, &b->cats, &b->dims};
    int cols[3] = {C_NAME, C_CAT, C_DIMS};
    int64_t rows_a = (int64_t)(a->col[C_IDX].n / 8);
    for (int t = 0; t < 3; t++) {
        Py_ssize_t m = intern_size(tb[t]);
        int32_t *map = malloc((m ? m : 1) * sizeof(int32_t));
        if (!map) return -1;
        const Span *sp = (const Span *)tb[t]->spans.p;
        for (Py_ssize_t i = 0; i < m; i++) {
            map[i] = intern_find(ta[t], sp[i].s, sp[i].n, sp[i].esc);
            if (map[i] < 0) { free(map); return -1; }
        }
        int32_t *code = (int32_t *)b->col[cols[t]].p;
        Py_ssize_t rows = (Py_ssize_t)(b->col[cols[t]].n / 4);
        for (Py_ssize_t r = 0; r < rows; r++) {
            if (t == 1) { if (code[r] > 0) code[r] = map[code[r] - 1] + 1; }  /* cats: 0 is none */
            else if (code[r] >= 0) code[r] = map[code[r]];
        }
        free(map);
    }
    int64_t *idx = (int64_t *)b->col[C_IDX].p;
    for (size_t r = 0; r < b->col[C_IDX].n / 8; r++) idx[r] += a->n;
    Odd *odd = (Odd *)b->odd.p;
    for (size_t r = 0; r < b->odd.n / sizeof(Odd); r++) odd[r].row += rows_a;
    for (int c = 0; c < NCOL; c++) if (buf_put(&a->col[c], b->col[c].p ? b->col[c].p : "", b->col[c].n)) return -1;
    if (buf_put(&a->odd, b->odd.p ? b->odd.p : "", b->odd.n)) return -1;
    a->n += b->n;
    return 0;
}

#ifndef _WIN32
#include <pthread.h>
typedef struct { const char *from, *end; Out *o; } Job;
static void *run_job(void *arg) {
    Job *j = arg;
    scan_range(j->from, j->end, NULL, j->o, 0);
    return NULL;
}
#endif

/* the str of each span, as a list (None where one does not decode: the caller bails) */
static PyObject *decoded(const Intern *in, int with_none) {
    PyObject *list = PyList_New(0);
    if (!list || (with_none && PyList_Append(list, Py_None))) { Py_XDECREF(list); return NULL; }
    const Span *sp = (const Span *)in->spans.p;
    for (Py_ssize_t i = 0; i < intern_size(in); i++) {
        PyObject *v = decode_string(sp[i].s, sp[i].n, sp[i].esc);
        if (!v) { Py_DECREF(list); Py_RETURN_NONE; }
        int err = PyList_Append(list, v);
        Py_DECREF(v);
        if (err) { Py_DECREF(list); return NULL; }
    }
    return list;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, end;
    int threads = 2;
    Py_ssize_t min_bytes = 8 << 20;  /* below this, one thread */
    if (!PyArg_ParseTuple(args, "y*nn|in", &view, &start, &end, &threads, &min_bytes)) return NULL;
    if (start < 0 || end > view.len || start > end) { PyBuffer_Release(&view); Py_RETURN_NONE; }
    const char *base = (const char *)view.buf;
    Out a, b;
    PyObject *result = NULL, *names = NULL, *cats = NULL, *dims = NULL, *odd = NULL, *cols = NULL;
    int have_b = 0, fail = 0;
    if (out_init(&a) || out_init(&b)) { PyErr_NoMemory(); goto done; }
    /* a second thread reads from an element boundary near the middle, if the first thread's
       own pass meets it there (a "}," then "{" after any whitespace; one inside a string is not
       met, and then the first thread reads it all) */
    const char *split = NULL;
#ifndef _WIN32
    if (threads > 1 && end - start >= min_bytes && end - start >= 8) {
        const char *mid = base + start + (end - start) / 2, *stop = base + end;
        for (const char *q = memmem(mid, stop - mid, "},", 2); q && !split; q = memmem(q + 1, stop - q - 1, "},", 2)) {
            const char *r = q + 2;
            while (r < stop && WS(*r)) r++;
            if (r < stop && *r == '{') split = r;  /* the first thread's pass must still meet it */
        }
    }
#endif
    Py_BEGIN_ALLOW_THREADS
#ifndef _WIN32
    pthread_t th;
    Job job = {split, base + end, &b};
    if (split && pthread_create(&th, NULL, run_job, &job) == 0) have_b = 1;
#endif
    scan_range(base + start, base + end, have_b ? split : NULL, &a, 0);
#ifndef _WIN32
    if (have_b) pthread_join(th, NULL);
#endif
    if (have_b && a.ok && !a.met) {  /* the split was not a boundary: the first thread reads on */
        out_free(&b);
        out_init(&b);
        have_b = 0;
        fail = -1;
    }
    Py_END_ALLOW_THREADS
    if (fail) {  /* read the rest after where the first thread stopped, in this thread */
        /* simplest exact answer: read the whole range again in one thread */
        out_free(&a);
        if (out_init(&a)) { PyErr_NoMemory(); goto done; }
        Py_BEGIN_ALLOW_THREADS
        scan_range(base + start, base + end, NULL, &a, 0);
        Py_END_ALLOW_THREADS
    }
    if (!a.ok || (have_b && !b.ok)) { result = Py_None; Py_INCREF(result); goto done; }
    if (have_b && out_join(&a, &b)) { PyErr_NoMemory(); goto done; }
    names = decoded(&a.names, 0);
    cats = decoded(&a.cats, 1);
    if (!names || !cats) goto done;
    if (names == Py_None || cats == Py_None) { result = Py_None; Py_INCREF(result); goto done; }
    dims = PyList_New(0);
    odd = PyList_New(0);
    cols = PyDict_New();
    if (!dims || !odd || !cols) goto done;
    const Span *dsp = (const Span *)a.dims.spans.p;
    for (Py_ssize_t i = 0; i < intern_size(&a.dims); i++) {
        PyObject *v = PyBytes_FromStringAndSize(dsp[i].s, dsp[i].n);
        if (!v || PyList_Append(dims, v)) { Py_XDECREF(v); goto done; }
        Py_DECREF(v);
    }
    const Odd *od = (const Odd *)a.odd.p;
    for (size_t i = 0; i < a.odd.n / sizeof(Odd); i++) {
        PyObject *v = decode_string(od[i].v.s, od[i].v.n, od[i].v.esc);
        if (!v) { result = Py_None; Py_INCREF(result); goto done; }
        PyObject *t = Py_BuildValue("(sLN)", COLS[od[i].col], (long long)od[i].row, v);
        if (!t || PyList_Append(odd, t)) { Py_XDECREF(t); goto done; }
        Py_DECREF(t);
    }
    /* the final forms, in place: ts and dur as int64 nanoseconds (rint(us * 1000), as
       _common.ns_from_us), the integer columns as int64 beside a mask of their missing rows (NaN;
       rint, as _common.int64_array), ext as float64. A value int64 cannot hold: None (the typed
       path then names it). */
    Py_ssize_t rows = (Py_ssize_t)(a.col[C_IDX].n / 8);
    char *mask[NCOL] = {0};
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (int c = C_TS; c <= C_BZ && !bad; c++) {
        if (c == C_EXT) continue;
        const double *d = (const double *)a.col[c].p;
        int64_t *v = (int64_t *)a.col[c].p;  /* the same memory: row i is read before it is written */
        if (c == C_TS || c == C_DUR) continue;  /* already int64 nanoseconds (ns_of_number) */
        char *m = mask[c] = malloc(rows ? rows : 1);
        if (!m) { bad = 2; break; }
        for (Py_ssize_t i = 0; i < rows; i++) {
            double x = d[i];
            if (isnan(x)) { m[i] = 1; v[i] = 0; continue; }
            x = rint(x);
            if (!(x > -9223372036854775808.0 && x < 9223372036854775808.0)) { bad = 1; break; }
            m[i] = 0;
            v[i] = (int64_t)x;
        }
    }
    Py_END_ALLOW_THREADS
    if (bad) {
        for (int c = 0; c < NCOL; c++) free(mask[c]);
        if (bad == 2) PyErr_NoMemory(); else { result = Py_None; Py_INCREF(result); }
        goto done;
    }
    for (int c = 0; c < NCOL; c++) {
        PyObject *v = block_of_buf(&a.col[c]);  /* the block's now (freed with it, or here where that fails) */
        int err = !v || PyDict_SetItemString(cols, COLS[c], v);
        Py_XDECREF(v);
        if (err) { for (int k = c; k < NCOL; k++) free(mask[k]); goto done; }
        if (mask[c]) {
            char key[32];
            snprintf(key, sizeof key, "%s_na", COLS[c]);
            PyObject *m = block_new(mask[c], rows);
            mask[c] = NULL;
            int err = !m || PyDict_SetItemString(cols, key, m);
            Py_XDECREF(m);
            if (err) { for (int k = c + 1; k < NCOL; k++) free(mask[k]); goto done; }
        }
    }
    const char *close = have_b ? b.close : a.close;
    result = Py_BuildValue("(LOOOOOn)", (long long)a.n, cols, names, cats, dims, odd,
                           close ? (Py_ssize_t)(close - base) : (Py_ssize_t)-1);
done:
    Py_XDECREF(names); Py_XDECREF(cats); Py_XDECREF(dims); Py_XDECREF(odd); Py_XDECREF(cols);
    out_free(&a);
    out_free(&b);
    PyBuffer_Release(&view);
    return result;
}


/* --- query(): an SQLite query read into columns (the nsys adapter) ------------------------------
   The sqlite library Python's own sqlite3 module uses, opened at run time (no header or link
   dependency). query(path, sql) -> (rows, [(name, values)] per result column), values a buffer
   of int64 (a column of integers), None (only NULLs), or (int32 codes buffer, [str]) for text
   (code -1: NULL), the distinct texts once each; or None where a column holds anything else
   (floats, blobs, integers mixed with NULLs or text), where the query has no rows, where a text
   is not UTF-8, or where the library cannot be loaded: the caller then asks pandas. */
#ifndef _WIN32
#include <dlfcn.h>
typedef struct sqlite3 sqlite3;
typedef struct sqlite3_stmt sqlite3_stmt;
static struct {
    int loaded;
    int (*open_v2)(const char *, sqlite3 **, int, const char *);
    int (*prepare_v2)(sqlite3 *, const char *, int, sqlite3_stmt **, const char **);
    int (*step)(sqlite3_stmt *);
    int (*column_count)(sqlite3_stmt *);
    const char *(*column_name)(sqlite3_stmt *, int);
    int (*column_type)(sqlite3_stmt *, int);
    long long (*column_int64)(sqlite3_stmt *, int);
    const unsigned char *(*column_text)(sqlite3_stmt *, int);
    int (*column_bytes)(sqlite3_stmt *, int);
    int (*finalize)(sqlite3_stmt *);
    int (*close_v2)(sqlite3 *);
} SQ;

static int sq_load(void) {
    if (SQ.loaded) return SQ.loaded > 0 ? 0 : -1;
    SQ.loaded = -1;
    const char *libs[] = {"libsqlite3.so.0", "libsqlite3.so", "libsqlite3.dylib", NULL};
    void *h = NULL;
    for (int i = 0; libs[i] && !h; i++) h = dlopen(libs[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) return -1;
#define SQ_SYM(f, name) if (!(*(void **)&SQ.f = dlsym(h, name))) return -1;
    SQ_SYM(open_v2, "sqlite3_open_v2") SQ_SYM(prepare_v2, "sqlite3_prepare_v2") SQ_SYM(step, "sqlite3_step")
    SQ_SYM(column_count, "sqlite3_column_count") SQ_SYM(column_name, "sqlite3_column_name")
    SQ_SYM(column_type, "sqlite3_column_type") SQ_SYM(column_int64, "sqlite3_column_int64")
    SQ_SYM(column_text, "sqlite3_column_text") SQ_SYM(column_bytes, "sqlite3_column_bytes")
    SQ_SYM(finalize, "sqlite3_finalize") SQ_SYM(close_v2, "sqlite3_close_v2")
#undef SQ_SYM
    SQ.loaded = 1;
    return 0;
}

enum { Q_UNSEEN = 0, Q_INT, Q_NULL, Q_TEXT };
typedef struct { int kind; Buf vals; Intern texts; Buf arena_ptrs; int nulls; } QCol;

static PyObject *query(PyObject *self, PyObject *args) {
    const char *path, *sql;
    if (!PyArg_ParseTuple(args, "ss", &path, &sql)) return NULL;
    if (sq_load()) Py_RETURN_NONE;
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    QCol *cols = NULL;
    int ncol = 0, bail = 0, rc = 0;
    int64_t rows = 0;
    PyObject *result = NULL;
    if (SQ.open_v2(path, &db, 0x00000001 /* SQLITE_OPEN_READONLY */, NULL) != 0 ||
        SQ.prepare_v2(db, sql, -1, &st, NULL) != 0) { bail = 1; goto done; }
    ncol = SQ.column_count(st);
    cols = calloc(ncol ? ncol : 1, sizeof(QCol));
    if (!cols) { bail = 1; goto done; }
    for (int c = 0; c < ncol; c++) if (intern_init(&cols[c].texts)) { bail = 1; goto done; }
    Py_BEGIN_ALLOW_THREADS
    while ((rc = SQ.step(st)) == 100 /* SQLITE_ROW */ && !bail) {
        for (int c = 0; c < ncol && !bail; c++) {
            QCol *q = &cols[c];
            int t = SQ.column_type(st, c);
            if (t == 1) {  /* SQLITE_INTEGER */
                if (q->kind != Q_UNSEEN && q->kind != Q_INT) { bail = 1; break; }
                q->kind = Q_INT;
                int64_t v = SQ.column_int64(st, c);
                if (buf_put(&q->vals, &v, 8)) bail = 1;
            } else if (t == 5) {  /* SQLITE_NULL: a text column's code -1, or a column of NULLs */
                if (q->kind == Q_INT) { bail = 1; break; }
                if (q->kind == Q_UNSEEN) q->kind = Q_NULL;
                q->nulls++;
                int32_t code = -1;
                if (buf_put(&q->vals, &code, 4)) bail = 1;
            } else if (t == 3) {  /* SQLITE_TEXT */
                if (q->kind == Q_INT) { bail = 1; break; }
                q->kind = Q_TEXT;
                const char *txt = (const char *)SQ.column_text(st, c);
                int n = SQ.column_bytes(st, c);
                if (!txt && n) { bail = 1; break; }
                /* the text lives until the next step: a copy of each distinct one, interned */
                int32_t code = -1;
                size_t j = hash_bytes(txt ? txt : "", n) & (q->texts.cap - 1);
                Intern *in = &q->texts;
                while (in->t[j].s) {
                    if (in->t[j].n == n && memcmp(in->t[j].s, txt, n) == 0) { code = in->t[j].id; break; }
                    j = (j + 1) & (in->cap - 1);
                }
                if (code < 0) {
                    char *copy = malloc(n ? n : 1);
                    if (!copy || buf_put(&q->arena_ptrs, &copy, sizeof copy)) { free(copy); bail = 1; break; }
                    if (n) memcpy(copy, txt, n);
                    code = intern_find(in, copy, n, 0);
                    if (code < 0) { bail = 1; break; }
                }
                if (buf_put(&q->vals, &code, 4)) bail = 1;
            } else bail = 1;  /* floats, blobs: pandas decides */
        }
        rows++;
    }
    Py_END_ALLOW_THREADS
    if (bail || rc != 101 /* SQLITE_DONE */ || rows == 0) { bail = 1; goto done; }
    result = PyList_New(0);
    if (!result) goto done;
    for (int c = 0; c < ncol; c++) {
        QCol *q = &cols[c];
        PyObject *vals = NULL;
        if (q->kind == Q_INT) vals = block_of_buf(&q->vals);  /* its memory, no copy */
        else if (q->kind == Q_NULL) { vals = Py_None; Py_INCREF(vals); }
        else {
            PyObject *codes = block_of_buf(&q->vals), *texts = PyList_New(0);
            const Span *sp = (const Span *)q->texts.spans.p;
            for (Py_ssize_t i = 0; codes && texts && i < intern_size(&q->texts); i++) {
                PyObject *v = PyUnicode_DecodeUTF8(sp[i].s, sp[i].n, NULL);
                if (!v) { PyErr_Clear(); bail = 1; break; }
                int err = PyList_Append(texts, v);
                Py_DECREF(v);
                if (err) { Py_CLEAR(texts); break; }
            }
            if (codes && texts && !bail) vals = Py_BuildValue("(OO)", codes, texts);
            Py_XDECREF(codes); Py_XDECREF(texts);
        }
        PyObject *name = vals ? PyUnicode_FromString(SQ.column_name(st, c)) : NULL;
        PyObject *item = name ? Py_BuildValue("(NN)", name, vals) : NULL;
        if (!item || PyList_Append(result, item)) {
            Py_XDECREF(item);
            if (!item && !name) Py_XDECREF(vals);
            Py_CLEAR(result);
            if (!PyErr_Occurred()) bail = 1;
            break;
        }
        Py_DECREF(item);
    }
done:
    if (cols) {
        for (int c = 0; c < ncol; c++) {
            char **ptr = (char **)cols[c].arena_ptrs.p;
            for (size_t i = 0; i < cols[c].arena_ptrs.n / sizeof(char *); i++) free(ptr[i]);
            buf_free(&cols[c].arena_ptrs); buf_free(&cols[c].vals); intern_free(&cols[c].texts);
        }
        free(cols);
    }
    if (st) SQ.finalize(st);
    if (db) SQ.close_v2(db);
    if (bail && !PyErr_Occurred()) { Py_XDECREF(result); Py_RETURN_NONE; }
    return result ? Py_BuildValue("(LN)", (long long)rows, result) : NULL;
}
#endif

/* forest(tid, start, end, order, mapped, is_op) -> (parent, top, op): canonical.nest's pass over
   spans sorted by (thread, start, longest first) with a stack (order: the sorted positions), which
   also gives each span the outermost span of its ancestor chain (itself included) that is mapped
   (canonical.outermost_mapped) and its nearest strict ancestor that is an op
   (canonical.nearest_op); -1 where there is none. tid, start, end, order int64; mapped and is_op
   one byte per span; a parent comes before its children in the sorted order, so each is resolved
   from its parent's. */
static PyObject *forest(PyObject *self, PyObject *args) {
    Py_buffer b[6];
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5])) return NULL;
    PyObject *res = NULL, *out[3] = {NULL, NULL, NULL};
    Py_ssize_t n = b[3].len / 8;
    int64_t *stack = NULL;
    for (int i = 0; i < 3; i++) if (b[i].len != b[3].len) { PyErr_SetString(PyExc_ValueError, "lengths differ"); goto out; }
    if (b[4].len != n || b[5].len != n) { PyErr_SetString(PyExc_ValueError, "lengths differ"); goto out; }
    for (int i = 0; i < 3; i++) if (!(out[i] = block_new(NULL, n * 8))) goto out;
    stack = malloc((n ? n : 1) * sizeof(int64_t));
    if (!stack) { PyErr_NoMemory(); goto out; }
    const int64_t *tid = b[0].buf, *start = b[1].buf, *end = b[2].buf, *order = b[3].buf;
    const char *mapped = b[4].buf, *is_op = b[5].buf;
    int64_t *parent = (int64_t *)((Block *)out[0])->p, *top = (int64_t *)((Block *)out[1])->p,
            *op = (int64_t *)((Block *)out[2])->p;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t height = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        int64_t i = order[k];
        if (k == 0 || tid[i] != tid[order[k - 1]]) height = 0;
        while (height && end[order[stack[height - 1]]] <= start[i]) height--;
        int64_t p = height ? order[stack[height - 1]] : -1;
        parent[i] = p;
        if (p >= 0) {
            op[i] = is_op[p] ? p : op[p];
            top[i] = top[p] >= 0 ? top[p] : (mapped[i] ? i : -1);
        } else {
            op[i] = -1;
            top[i] = mapped[i] ? i : -1;
        }
        stack[height++] = k;
    }
    Py_END_ALLOW_THREADS
    res = PyTuple_Pack(3, out[0], out[1], out[2]);
out:
    free(stack);
    for (int i = 0; i < 3; i++) Py_XDECREF(out[i]);
    for (int i = 0; i < 6; i++) PyBuffer_Release(&b[i]);
    return res;
}

/* objcodes(values) -> (codes, distinct, first): pd.factorize of an int64 array (codes in order of
   first appearance, the distinct values in that order) and the first row of each distinct value;
   all three as int64 bytes. strings.factorize gives it the addresses of an object array's rows. */
static PyObject *objcodes(PyObject *self, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*", &b)) return NULL;
    Py_ssize_t n = b.len / 8;
    const int64_t *a = b.buf;
    PyObject *codes = PyBytes_FromStringAndSize(NULL, n * 8), *res = NULL;
    size_t cap = 1024, ucap = 256, nu = 0;  /* table slots (a power of two), distinct values' room */
    int shift = 64 - 10;
    int64_t *slot = malloc(cap * sizeof(int64_t)), *uniq = malloc(ucap * 8), *first = malloc(ucap * 8);
    int failed = 0;
    if (!codes || !slot || !uniq || !first) { PyErr_NoMemory(); goto out; }
    int64_t *c = (int64_t *)PyBytes_AS_STRING(codes);
    Py_BEGIN_ALLOW_THREADS
    for (size_t j = 0; j < cap; j++) slot[j] = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t v = a[i];
        if (i && v == a[i - 1]) { c[i] = c[i - 1]; continue; }  /* runs of one value */
        size_t h = (size_t)(((uint64_t)v * 0x9E3779B97F4A7C15ULL) >> shift);
        while (slot[h] >= 0 && uniq[slot[h]] != v) h = (h + 1) & (cap - 1);
        if (slot[h] >= 0) { c[i] = slot[h]; continue; }
        if (nu == ucap) {
            ucap *= 2;
            int64_t *u2 = realloc(uniq, ucap * 8), *f2 = u2 ? realloc(first, ucap * 8) : NULL;
            if (u2) uniq = u2;
            if (f2) first = f2;
            if (!u2 || !f2) { failed = 1; break; }
        }
        uniq[nu] = v; first[nu] = i; c[i] = (int64_t)nu; slot[h] = (int64_t)nu; nu++;
        if (nu * 2 > cap) {  /* keep the table at most half full: rebuild it twice as large */
            int64_t *s2 = malloc(cap * 2 * sizeof(int64_t));
            if (!s2) { failed = 1; break; }
            free(slot); slot = s2; cap *= 2; shift--;
            for (size_t j = 0; j < cap; j++) slot[j] = -1;
            for (size_t u = 0; u < nu; u++) {
                size_t g = (size_t)(((uint64_t)uniq[u] * 0x9E3779B97F4A7C15ULL) >> shift);
                while (slot[g] >= 0) g = (g + 1) & (cap - 1);
                slot[g] = (int64_t)u;
            }
        }
    }
    Py_END_ALLOW_THREADS
    if (failed) { PyErr_NoMemory(); goto out; }
    res = Py_BuildValue("(Oy#y#)", codes, (const char *)uniq, (Py_ssize_t)(nu * 8), (const char *)first,
                        (Py_ssize_t)(nu * 8));
out:
    Py_XDECREF(codes);
    free(slot); free(uniq); free(first);
    PyBuffer_Release(&b);
    return res;
}

/* first_seen(codes, width, n) -> int64 bytes: the codes 0..n-1 that occur in a Categorical's codes
   (signed, 1, 2 or 4 bytes wide; -1 is NA), in order of first appearance (pd.unique of the codes
   without -1, for strings.category_ranks). Stops at the row where all n have been seen. */
static PyObject *first_seen(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t w, m;
    if (!PyArg_ParseTuple(args, "y*nn", &b, &w, &m)) return NULL;
    PyObject *res = NULL;
    if ((w != 1 && w != 2 && w != 4) || b.len % w != 0 || m < 0) {
        PyErr_SetString(PyExc_ValueError, "codes width or count");
        goto out;
    }
    Py_ssize_t n = b.len / w, k = 0;
    unsigned char *seen = calloc(m ? m : 1, 1);
    int64_t *order = malloc((m ? m : 1) * sizeof(int64_t));
    if (!seen || !order) { free(seen); free(order); PyErr_NoMemory(); goto out; }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n && k < m; i++) {
        int64_t v = w == 1 ? ((const int8_t *)b.buf)[i] : w == 2 ? ((const int16_t *)b.buf)[i]
                    : ((const int32_t *)b.buf)[i];
        if (v >= 0 && v < m && !seen[v]) { seen[v] = 1; order[k++] = v; }
    }
    Py_END_ALLOW_THREADS
    res = PyBytes_FromStringAndSize((const char *)order, k * (Py_ssize_t)sizeof(int64_t));
    free(seen); free(order);
out:
    PyBuffer_Release(&b);
    return res;
}

/* same_objects(address, codes, distinct) -> bool: whether distinct[codes[i]] == address[i] for
   every row (strings._Answers' check that an array still holds the objects it was answered for),
   in one pass without a temporary; address and distinct int64, codes unsigned of 1, 2, 4 or 8
   bytes (the itemsize the length of codes says). */
static PyObject *same_objects(PyObject *self, PyObject *args) {
    Py_buffer a, c, d;
    if (!PyArg_ParseTuple(args, "y*y*y*", &a, &c, &d)) return NULL;
    Py_ssize_t n = a.len / 8, m = d.len / 8;
    int same = 1;
    PyObject *res = NULL;
    if (n == 0 ? c.len != 0 : (c.len % n != 0)) { PyErr_SetString(PyExc_ValueError, "lengths differ"); goto out; }
    Py_ssize_t w = n ? c.len / n : 1;
    if (w != 1 && w != 2 && w != 4 && w != 8) { PyErr_SetString(PyExc_ValueError, "codes itemsize"); goto out; }
    const int64_t *addr = a.buf, *dist = d.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t k = w == 1 ? ((const uint8_t *)c.buf)[i] : w == 2 ? ((const uint16_t *)c.buf)[i]
                     : w == 4 ? ((const uint32_t *)c.buf)[i] : ((const uint64_t *)c.buf)[i];
        if (k >= (uint64_t)m || dist[k] != addr[i]) { same = 0; break; }
    }
    Py_END_ALLOW_THREADS
    res = PyBool_FromLong(same);
out:
    PyBuffer_Release(&a); PyBuffer_Release(&c); PyBuffer_Release(&d);
    return res;
}

/* --- first_value(): the peek at a trace's first device event (kineto.refuse_unsupported) -------------
   first_value(data, key, exact, prefixes): where in data the first string value of the member key (its
   quoted name, e.g. b'"cat"') is one of exact (a tuple of bytes) or starts with one of prefixes: (start,
   end) of the value's text, or None. The same as searching the regex key\s*:\s*"(prefix[^"]*|exact)"
   (\s: space, \t, \n, \r, \f, \v), without sre's byte-at-a-time look for the key. */
#define PEEK_WS(c) ((c) == ' ' || (c) == '\t' || (c) == '\n' || (c) == '\r' || (c) == '\f' || (c) == '\v')

static int value_wanted(const char *v, Py_ssize_t n, PyObject *exact, PyObject *prefixes) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(exact); i++) {
        PyObject *w = PyTuple_GET_ITEM(exact, i);
        if (PyBytes_GET_SIZE(w) == n && !memcmp(PyBytes_AS_STRING(w), v, n)) return 1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(prefixes); i++) {
        PyObject *w = PyTuple_GET_ITEM(prefixes, i);
        if (PyBytes_GET_SIZE(w) <= n && !memcmp(PyBytes_AS_STRING(w), v, PyBytes_GET_SIZE(w))) return 1;
    }
    return 0;
}

static PyObject *first_value(PyObject *self, PyObject *args) {
    Py_buffer view, key;
    PyObject *exact, *prefixes;
    if (!PyArg_ParseTuple(args, "y*y*O!O!", &view, &key, &PyTuple_Type, &exact, &PyTuple_Type, &prefixes)) return NULL;
    PyObject *result = NULL;
    for (int t = 0; t < 2; t++) {
        PyObject *tup = t ? prefixes : exact;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tup); i++)
            if (!PyBytes_Check(PyTuple_GET_ITEM(tup, i))) { PyErr_SetString(PyExc_TypeError, "values must be bytes"); goto out; }
    }
    if (key.len == 0) { PyErr_SetString(PyExc_ValueError, "empty key"); goto out; }
    const char *p = view.buf, *end = p + view.len;
    Py_ssize_t start = -1, stop = -1;
    /* the tuples' bytes are read without the GIL: the caller's arguments hold them */
    Py_BEGIN_ALLOW_THREADS
    while (p < end && (p = memmem(p, end - p, key.buf, key.len)) != NULL) {
        const char *q = p + key.len;
        p++;
        while (q < end && PEEK_WS(*q)) q++;
        if (q >= end || *q != ':') continue;
        q++;
        while (q < end && PEEK_WS(*q)) q++;
        if (q >= end || *q != '"') continue;
        q++;
        const char *close = memchr(q, '"', end - q);
        if (close && value_wanted(q, close - q, exact, prefixes)) {
            start = q - (const char *)view.buf;
            stop = close - (const char *)view.buf;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    if (start < 0) { result = Py_None; Py_INCREF(result); }
    else result = Py_BuildValue("(nn)", start, stop);
out:
    PyBuffer_Release(&view);
    PyBuffer_Release(&key);
    return result;
}

static PyMethodDef methods[] = {
    {"objcodes", objcodes, METH_VARARGS, "pd.factorize of an int64 array, and each value's first row."},
    {"same_objects", same_objects, METH_VARARGS, "Whether distinct[codes] equals address, row for row."},
    {"first_seen", first_seen, METH_VARARGS, "A Categorical's codes in order of first appearance."},
    {"forest", forest, METH_VARARGS, "canonical.nest's pass, with each span's outermost mapped ancestor and nearest op."},
#ifndef _WIN32
    {"query", query, METH_VARARGS, "An SQLite query's result as columns, or None."},
#endif
    {"scan", scan, METH_VARARGS, "Columns of the complete events of a traceEvents array's text, or None."},
    {"first_value", first_value, METH_VARARGS, "Where the first wanted string value of a member is, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&BlockType) < 0) return NULL;
    return PyModule_Create(&module);
}
