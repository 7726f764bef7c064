/*
 * util.c: allocation, strings, diagnostics and files for the compiler.
 *
 * Allocation failures end the program (the compiler frees nothing until it
 * exits; kiln_free_all is for programs that run it many times). Diagnostics follow the gcc shape, `file:line:col: error: msg`,
 * then the offending source line and a caret under the column.
 */
#define _POSIX_C_SOURCE 200809L /* fileno, fseeko */
#define _DEFAULT_SOURCE /* madvise */
#include "kiln.h"
#include "../runtime/kiln_hash.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Every allocation is a Block on one list, so that a program that runs the
 * front end many times in one process (the fuzz targets) can free it all
 * with kiln_free_all. The command line never frees. */
typedef union Block {
    struct {
        union Block *prev, *next;
    } link;
    max_align_t align;
} Block;

static Block heap = {{&heap, &heap}};

typedef struct Cleanup {
    void (*fn)(void *);
    void *arg;
} Cleanup;
static Cleanup cleanups[16];
static int ncleanups;

jmp_buf *kiln_error_trap;
bool kiln_quiet;

static void *link_block(Block *b) {
    b->link.prev = heap.link.prev;
    b->link.next = &heap;
    heap.link.prev->link.next = b;
    heap.link.prev = b;
    return b + 1;
}

static Block *unlink_block(void *p) {
    Block *b = (Block *)p - 1;
    b->link.prev->link.next = b->link.next;
    b->link.next->link.prev = b->link.prev;
    return b;
}

void *try_alloc(size_t size) {
    if (size > SIZE_MAX - sizeof(Block))
        return NULL;
    Block *b = calloc(1, sizeof(Block) + size);
    return b ? link_block(b) : NULL;
}

void *xcalloc(size_t n, size_t size) {
    if (n == 0)
        n = 1;
    if (size == 0)
        size = 1;
    void *p = n > SIZE_MAX / size ? NULL : try_alloc(n * size);
    if (!p)
        fatal("out of memory (%zu x %zu bytes)", n, size);
    return p;
}

void *xrealloc(void *p, size_t size) {
    if (!p)
        return xcalloc(1, size);
    Block *b = unlink_block(p);
    Block *nb = size > SIZE_MAX - sizeof(Block) ? NULL : realloc(b, sizeof(Block) + (size ? size : 1));
    if (!nb) {
        link_block(b);
        fatal("out of memory (%zu bytes)", size);
    }
    return link_block(nb);
}

void xfree(void *p) {
    if (p)
        free(unlink_block(p));
}

void on_reset(void (*fn)(void *), void *arg) {
    if (ncleanups == (int)(sizeof cleanups / sizeof cleanups[0]))
        internal_error("too many cleanups");
    cleanups[ncleanups].fn = fn;
    cleanups[ncleanups++].arg = arg;
}

void cancel_reset(void *arg) {
    for (int i = ncleanups - 1; i >= 0; i--)
        if (cleanups[i].arg == arg) {
            cleanups[i] = cleanups[--ncleanups];
            return;
        }
}

void kiln_free_all(void) {
    while (ncleanups > 0) {
        ncleanups--;
        cleanups[ncleanups].fn(cleanups[ncleanups].arg);
    }
    while (heap.link.next != &heap)
        free(unlink_block(heap.link.next + 1));
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = xcalloc(1, n);
    memcpy(p, s, n);
    return p;
}

__attribute__((format(printf, 1, 0)))
static char *vformat(const char *fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0)
        n = 0;
    char *buf = xcalloc(1, (size_t)n + 1);
    vsnprintf(buf, (size_t)n + 1, fmt, ap);
    return buf;
}

char *format(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *s = vformat(fmt, ap);
    va_end(ap);
    return s;
}

/* Prints line `line` of `file` and a caret under column `col`. */
static void show_source(const char *file, int line, int col) {
    FILE *f = fopen(file, "rb");
    if (!f)
        return;
    char buf[4096];
    int n = 1;
    while (fgets(buf, sizeof buf, f)) {
        size_t len = strlen(buf);
        bool whole = len > 0 && buf[len - 1] == '\n';
        if (n == line) {
            if (whole)
                buf[--len] = 0;
            fprintf(stderr, "  %s\n  ", buf);
            for (int i = 1; i < col && (size_t)(i - 1) < len; i++)
                fputc(buf[i - 1] == '\t' ? '\t' : ' ', stderr);
            fputs("^\n", stderr);
            break;
        }
        if (whole)
            n++;
    }
    fclose(f);
}

/* Out of an error: back to the trap when one is set, else exit(1). */
static _Noreturn void leave(void) {
    if (kiln_error_trap)
        longjmp(*kiln_error_trap, 1);
    exit(1);
}

void error_at(Loc loc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *msg = vformat(fmt, ap);
    va_end(ap);
    if (kiln_quiet)
        ; /* the caller only wants to know that it failed */
    else if (loc.file && loc.line > 0) {
        fprintf(stderr, "%s:%d:%d: error: %s\n", loc.file, loc.line, loc.col, msg);
        show_source(loc.file, loc.line, loc.col);
    } else if (loc.file) {
        fprintf(stderr, "%s: error: %s\n", loc.file, msg);
    } else {
        fprintf(stderr, "kiln: error: %s\n", msg);
    }
    xfree(msg);
    leave();
}

/* The message is a tracked allocation: kiln_free_all releases it when an
 * error trap catches the exit. */
void node_error(const Node *n, const char *fmt, ...) {
                va_list ap;
    va_start(ap, fmt);
    char *msg = vformat(fmt, ap);
    va_end(ap);
    error_at(n->loc, "node '%s': %s", n->name, msg);
}

void node_error_at(const Node *n, Loc loc, const char *fmt, ...) {
                   va_list ap;
    va_start(ap, fmt);
    char *msg = vformat(fmt, ap);
    va_end(ap);
    error_at(loc, "node '%s': %s", n->name, msg);
}

void fatal(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *msg = vformat(fmt, ap);
    va_end(ap);
    if (!kiln_quiet)
        fprintf(stderr, "kiln: error: %s\n", msg);
    xfree(msg);
    leave();
}

void internal_failure(const char *file, int line, const char *msg) {
    fprintf(stderr, "kiln: internal error at %s:%d: %s\n", file, line, msg);
    if (kiln_error_trap)
        abort(); /* a bug: the fuzz targets report it */
    exit(1);
}

void str_addn(Str *s, const void *data, size_t n) {
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->len + n + 1)
            cap *= 2;
        s->buf = xrealloc(s->buf, cap);
        s->cap = cap;
    }
    memcpy(s->buf + s->len, data, n);
    s->len += n;
    s->buf[s->len] = 0;
}

void str_add(Str *s, const char *text) { str_addn(s, text, strlen(text)); }

void str_addf(Str *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *t = vformat(fmt, ap);
    va_end(ap);
    str_add(s, t);
    xfree(t);
}

void vec_push(Vec *v, void *item) {
    if (v->len == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 16;
        v->data = xrealloc(v->data, sizeof(void *) * (size_t)v->cap);
    }
    v->data[v->len++] = item;
}

static uint64_t hash_str(const char *s) { return hash_bytes(HASH_SEED, s, strlen(s)); }

void *map_get(const Map *m, const char *key) {
    if (m->cap == 0)
        return NULL;
    for (uint64_t i = hash_str(key) % (uint64_t)m->cap;; i = (i + 1) % (uint64_t)m->cap) {
        if (!m->keys[i])
            return NULL;
        if (strcmp(m->keys[i], key) == 0)
            return m->vals[i];
    }
}

void map_put(Map *m, const char *key, void *val) {
    if ((m->len + 1) * 2 > m->cap) {
        Map bigger = {0};
        bigger.cap = m->cap ? m->cap * 2 : 64;
        bigger.keys = xcalloc((size_t)bigger.cap, sizeof(char *));
        bigger.vals = xcalloc((size_t)bigger.cap, sizeof(void *));
        for (int i = 0; i < m->cap; i++)
            if (m->keys[i])
                map_put(&bigger, m->keys[i], m->vals[i]);
        *m = bigger;
    }
    for (uint64_t i = hash_str(key) % (uint64_t)m->cap;; i = (i + 1) % (uint64_t)m->cap) {
        if (!m->keys[i]) {
            m->keys[i] = key;
            m->vals[i] = val;
            m->len++;
            return;
        }
        if (strcmp(m->keys[i], key) == 0) {
            m->vals[i] = val;
            return;
        }
    }
}

uint64_t hash_bytes(uint64_t h, const void *data, size_t n) {
    return kiln__fnv1a64(data, n, h);
}

char *read_file(const char *path, size_t *out_size) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    Str s = {0};
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        str_addn(&s, buf, n);
    bool bad = ferror(f);
    fclose(f);
    if (bad) {
        errno = EIO;
        return NULL;
    }
    if (!s.buf)
        s.buf = xcalloc(1, 1);
    if (out_size)
        *out_size = s.len;
    return s.buf;
}

int worker_threads(int jobs) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const char *env = getenv("KILN_JOBS");
    long threads = env && atol(env) > 0 ? atol(env) : cores > 0 ? cores : 1;
    if (threads > 16 && !env)
        threads = 16;
    if (threads > jobs)
        threads = jobs;
    return threads < 1 ? 1 : (int)threads;
}

typedef struct Striped {
    void (*fn)(void *ctx, int index, int threads);
    void *ctx;
    int index, threads;
} Striped;

static void *run_stripe(void *arg) {
    Striped *s = arg;
    s->fn(s->ctx, s->index, s->threads);
    return NULL;
}

void run_striped(int threads, void (*fn)(void *ctx, int index, int threads), void *ctx) {
    if (threads > 64)
        threads = 64;
    if (threads < 1)
        threads = 1;
    pthread_t ids[64];
    Striped stripes[64];
    int started[64] = {0};
    for (int t = 1; t < threads; t++) {
        stripes[t] = (Striped){fn, ctx, t, threads};
        started[t] = pthread_create(&ids[t], NULL, run_stripe, &stripes[t]) == 0;
        if (!started[t]) /* no thread: this one does that stripe too */
            fn(ctx, t, threads);
    }
    fn(ctx, 0, threads);
    for (int t = 1; t < threads; t++)
        if (started[t])
            pthread_join(ids[t], NULL);
}

void drop_pages(const void *p, uint64_t n) {
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0)
        return;
    uintptr_t lo = ((uintptr_t)p + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page;
    uintptr_t hi = ((uintptr_t)p + (uintptr_t)n) / (uintptr_t)page * (uintptr_t)page;
#ifdef MADV_DONTNEED
    if (hi > lo)
        madvise((void *)lo, hi - lo, MADV_DONTNEED);
#else
    (void)lo, (void)hi;
#endif
}

char *map_file(const char *path, size_t *out_size) {
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return NULL;
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 &&
        (uint64_t)st.st_size <= SIZE_MAX)
        p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) /* empty, not a regular file, or no mmap here */
        return read_file(path, out_size);
    *out_size = (size_t)st.st_size;
    return p;
}

FILE *open_regular(const char *path, uint64_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        errno = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
        return NULL;
    }
    *size = (uint64_t)st.st_size;
    return f;
}

bool read_at(FILE *f, uint64_t offset, void *dst, uint64_t n) {
    if (offset > (uint64_t)INT64_MAX || fseeko(f, (off_t)offset, SEEK_SET) != 0)
        return false;
    return n == 0 || fread(dst, 1, (size_t)n, f) == n;
}

bool write_file(const char *path, const void *data, size_t size) {
    char *tmp = format("%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return false;
    bool ok = fwrite(data, 1, size, f) == size;
    ok = (fclose(f) == 0) && ok;
    if (ok)
        ok = rename(tmp, path) == 0;
    if (!ok)
        remove(tmp);
    return ok;
}

int64_t double_to_i64(double x) {
    if (x != x)
        return 0;
    if (x >= 9223372036854775807.0)
        return INT64_MAX;
    if (x <= -9223372036854775808.0)
        return INT64_MIN;
    return (int64_t)x;
}

int64_t sat_mul(int64_t a, int64_t b) {
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r))
        return (a < 0) != (b < 0) ? INT64_MIN : INT64_MAX;
    return r;
}

int64_t shape_count(int rank, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        n = sat_mul(n, shape[i]);
    return n;
}

char *shape_str(int rank, const int64_t *shape) {
    Str s = {0};
    str_add(&s, "[");
    for (int i = 0; i < rank; i++)
        str_addf(&s, "%s%lld", i ? ", " : "", (long long)shape[i]);
    str_add(&s, "]");
    return s.buf;
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

uint64_t tensor_bytes(const Tensor *t) {
    return (uint64_t)tensor_count(t) * kiln_dtype_size(t->dtype);
}

int64_t tensor_count(const Tensor *t) { return shape_count(t->rank, t->shape); }

bool shape_equal(const Tensor *a, const Tensor *b) {
    return a->rank == b->rank &&
           memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->rank) == 0;
}

uint64_t slot_bytes(const Tensor *t) {
    uint64_t b = tensor_bytes(t);
    return t->kind == T_STATE && t->storage > b ? t->storage : b;
}

Tensor *tensor_root(Tensor *t) {
    while (t->alias)
        t = t->alias;
    return t;
}

int64_t index_value(const Tensor *t, int64_t i) {
    if (t->dtype == KILN_DTYPE_I64) {
        int64_t v;
        memcpy(&v, t->data + 8 * i, 8);
        return v;
    }
    int32_t w;
    memcpy(&w, t->data + 4 * i, 4);
    return w;
}

uint64_t tensor_base(Tensor *t) {
    uint64_t at = 0;
    for (; t->alias; t = t->alias)
        at += t->view_offset;
    return t->offset + at;
}

float weight_float(const Tensor *t, int64_t i) {
    if (t->dtype == KILN_DTYPE_F16) {
        uint16_t h;
        memcpy(&h, t->data + 2 * i, 2);
        return half_to_float(h);
    }
    float f;
    memcpy(&f, t->data + 4 * i, 4);
    return f;
}

/* IEEE half precision, round to nearest even. */
float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu, x;
    if (e == 0) {
        float f = (float)m * 5.9604644775390625e-8f; /* 2^-24 */
        memcpy(&x, &f, 4);
        x |= sign;
    } else if (e == 31) {
        x = sign | 0x7f800000u | (m << 13);
    } else {
        x = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

uint16_t float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, mag = x & 0x7fffffffu;
    if (mag >= 0x7f800000u)
        return (uint16_t)(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u : 0));
    if (mag >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u);
    if (mag < 0x38800000u) {
        float a;
        memcpy(&a, &mag, 4);
        return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f));
    }
    uint32_t h = (mag - 0x38000000u) >> 13, rest = mag & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}
