/*
 * model_weights.c: the weights sidecar file (kiln compile --weights-file),
 * read and checked whole before create uploads it.
 */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

uint64_t kiln__get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

uint64_t kiln__fnv1a64(const void *data, size_t n, uint64_t h) {
    const unsigned char *p = (const unsigned char *)data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* Reads a weights sidecar file (written by kiln compile --weights-file:
 * "KILNWTS1", u64 size, u64 FNV-1a 64 checksum, the bytes) into dst, after
 * checking that it is the one this model was compiled with, whole. */
kiln_status kiln__read_weights_file(const char *path, const kiln_model_desc *d, void *dst) {
    if (!path)
        return KILN_FAIL(KILN_ERROR_WEIGHTS, "the model has neither weights nor a weights file");
    FILE *f = fopen(path, "rb");
    if (!f)
        return KILN_FAIL(KILN_ERROR_WEIGHTS, "cannot open the weights file %s: %s", path,
                         strerror(errno));
    unsigned char head[24];
    kiln_status s = KILN_OK;
    unsigned long long want = (unsigned long long)d->weight_bytes;
    if (fread(head, 1, sizeof head, f) != sizeof head || memcmp(head, "KILNWTS1", 8) != 0)
        s = KILN_FAIL(KILN_ERROR_WEIGHTS, "%s is not a kiln weights file", path);
    else if (kiln__get_u64(head + 8) != d->weight_bytes)
        s = KILN_FAIL(KILN_ERROR_WEIGHTS, "%s holds %llu bytes of weights; model %s needs %llu "
                      "(a file from another compile?)", path,
                      (unsigned long long)kiln__get_u64(head + 8), d->name, want);
    else if (kiln__get_u64(head + 16) != d->weights_checksum)
        s = KILN_FAIL(KILN_ERROR_WEIGHTS, "%s is from another compile: its checksum is "
                      "%016llx, model %s expects %016llx", path,
                      (unsigned long long)kiln__get_u64(head + 16), d->name,
                      (unsigned long long)d->weights_checksum);
    else if (fread(dst, 1, (size_t)d->weight_bytes, f) != (size_t)d->weight_bytes)
        s = KILN_FAIL(KILN_ERROR_WEIGHTS, "%s is truncated: it has fewer than the %llu bytes "
                      "of weights its header announces", path, want);
    else if (fgetc(f) != EOF)
        s = KILN_FAIL(KILN_ERROR_WEIGHTS, "%s has bytes after its %llu bytes of weights", path,
                      want);
    fclose(f);
    if (s != KILN_OK)
        return s;
    uint64_t h = kiln__fnv1a64(dst, (size_t)d->weight_bytes, KILN__FNV_SEED);
    if (h != d->weights_checksum)
        return KILN_FAIL(KILN_ERROR_WEIGHTS, "%s is corrupt: its bytes do not match their "
                         "checksum (%016llx, expected %016llx)", path, (unsigned long long)h,
                         (unsigned long long)d->weights_checksum);
    return KILN_OK;
}
