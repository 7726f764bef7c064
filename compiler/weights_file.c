/*
 * weights_file.c: the weight image, its checksum and the sidecar file.
 *
 * The image is never assembled in memory: its pieces (the weights' own
 * bytes, which for an ONNX model are still where the file mapping put them,
 * and the zero padding between) go straight to the checksum, to the C
 * (emit_c, when embedded) or to the sidecar file.
 */
#define _POSIX_C_SOURCE 200809L /* fileno, mmap, utimensat */
#define _DEFAULT_SOURCE /* madvise */
#include "kiln.h"
#include "../runtime/kiln_hash.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The image's bytes in [from, to), piece by piece in order. */
static void weight_range(const Graph *g, const Program *p, uint64_t from, uint64_t to,
                         WeightPieceFn fn, void *ctx) {
    static const uint8_t zeros[4096];
    uint64_t at = 0; /* the image's bytes before it are done (or before from) */
    for (int i = 0; i <= g->weights.len && at < to; i++) {
        const Tensor *t = i < g->weights.len ? g->weights.data[i] : NULL;
        if (t && t->offset == UINT64_MAX)
            continue; /* unused: not placed */
        uint64_t start = t ? t->offset : p->weight_bytes;
        if (start < at)
            internal_error("weight '%s' at %llu overlaps the one before", t->name,
                           (unsigned long long)start);
        for (uint64_t z = at > from ? at : from; z < start && z < to;) { /* zeros */
            uint64_t end = start < to ? start : to;
            size_t n = end - z < sizeof zeros ? (size_t)(end - z) : sizeof zeros;
            fn(ctx, zeros, n);
            z += n;
        }
        at = start;
        if (t && tensor_bytes(t)) {
            uint64_t end = start + tensor_bytes(t);
            uint64_t lo = start > from ? start : from, hi = end < to ? end : to;
            if (lo < hi)
                fn(ctx, t->data + (lo - start), (size_t)(hi - lo));
            at = end;
        }
    }
}

void weight_pieces(const Graph *g, const Program *p, WeightPieceFn fn, void *ctx) {
    weight_range(g, p, 0, p->weight_bytes, fn, ctx);
}

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* One segment (KILN__HASH_SEGMENT bytes) of the image: hashed, and
 * compared with the file's bytes (file: NULL when there is none to
 * compare), a cache-sized block at a time so that each byte is read once. */
typedef struct Compare {
    kiln__hash hash;
    const uint8_t *file;
    bool same;
} Compare;

static void compare_piece(void *ctx, const void *data, size_t n) {
    Compare *c = ctx;
    const uint8_t *d = data;
    for (size_t at = 0, step; at < n; at += step) {
        step = n - at < (256u << 10) ? n - at : (256u << 10);
        kiln__hash_update(&c->hash, d + at, step);
        if (c->file && c->same)
            c->same = memcmp(c->file + at, d + at, step) == 0;
    }
    if (c->file)
        c->file += n;
}

/* The segments, shared by the threads: thread t does t, t + threads, ... */
typedef struct Segments {
    const Graph *g;
    const Program *p;
    const uint8_t *file; /* the sidecar's image bytes, or NULL */
    uint64_t *hash;
    bool *same;
    size_t count;
} Segments;

/* A stripe of the segments (run_striped). */
static void hash_segments(void *ctx, int index, int threads) {
    Segments *s = ctx;
    for (size_t k = (size_t)index; k < s->count; k += (size_t)threads) {
        uint64_t from = (uint64_t)k * KILN__HASH_SEGMENT;
        uint64_t to = from + KILN__HASH_SEGMENT < s->p->weight_bytes
                          ? from + KILN__HASH_SEGMENT : s->p->weight_bytes;
        Compare c = {.file = s->file ? s->file + from : NULL, .same = s->file != NULL};
        kiln__hash_init(&c.hash);
        weight_range(s->g, s->p, from, to, compare_piece, &c);
        s->hash[k] = kiln__hash_segment(&c.hash);
        s->same[k] = c.same;
        if (s->file) /* the old file's pages of this segment leave this process */
            drop_pages(s->file + from, to - from);
    }
}

/* The image's checksum, its segments hashed on worker threads; *same:
 * whether path holds the sidecar of the image already, exactly (its
 * header too), compared as they go. */
static uint64_t check_image(const Graph *g, const Program *p, const char *path, bool *same) {
    uint64_t want = 24 + p->weight_bytes;
    void *map = MAP_FAILED;
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
        (uint64_t)st.st_size == want && want <= SIZE_MAX)
        map = mmap(NULL, (size_t)want, PROT_READ, MAP_SHARED, fd, 0);
    if (fd >= 0)
        close(fd);
    Segments s = {g, p, map != MAP_FAILED ? (const uint8_t *)map + 24 : NULL, NULL, NULL,
                  (size_t)((p->weight_bytes + KILN__HASH_SEGMENT - 1) / KILN__HASH_SEGMENT)};
    s.hash = xcalloc(s.count + 1, sizeof *s.hash);
    s.same = xcalloc(s.count + 1, sizeof *s.same);
    run_striped(worker_threads((int)(s.count < 64 ? s.count : 64)), hash_segments, &s);
    uint64_t sum = kiln__hash_join(s.hash, s.count, p->weight_bytes);
    *same = s.file != NULL && memcmp(map, "KILNWTS2", 8) == 0 &&
            kiln__get_u64((const uint8_t *)map + 8) == p->weight_bytes &&
            kiln__get_u64((const uint8_t *)map + 16) == sum;
    for (size_t k = 0; k < s.count && *same; k++)
        *same = s.same[k];
    if (map != MAP_FAILED)
        munmap(map, (size_t)want);
    xfree(s.hash);
    xfree(s.same);
    return sum;
}

typedef struct Out {
    FILE *f;
    int err; /* the first write's errno */
} Out;

static void write_piece(void *ctx, const void *data, size_t n) {
    Out *o = ctx;
    if (!o->err && fwrite(data, 1, n, o->f) != n)
        o->err = errno ? errno : EIO;
}

bool write_weights_file(const Graph *g, Program *p, const char *path) {
    bool same;
    p->weights_checksum = check_image(g, p, path, &same);
    if (same)
        return utimensat(AT_FDCWD, path, NULL, 0) == 0;
    uint8_t head[24];
    memcpy(head, "KILNWTS2", 8);
    put_u64(head + 8, p->weight_bytes);
    put_u64(head + 16, p->weights_checksum);
    char *tmp = format("%s.tmp%ld", path, (long)getpid());
    Out o = {fopen(tmp, "wb"), 0};
    if (!o.f)
        return false;
    write_piece(&o, head, sizeof head);
    weight_pieces(g, p, write_piece, &o);
    if (fclose(o.f) != 0 && !o.err)
        o.err = errno ? errno : EIO;
    if (!o.err && rename(tmp, path) != 0)
        o.err = errno;
    if (o.err) {
        remove(tmp);
        errno = o.err;
    }
    return !o.err;
}
