/*
 * kiln_hash.h: the checksums that the compiler writes and the runtime
 * checks (hash.c). Internal: neither installed nor part of the API. No
 * Vulkan here: the compiler links hash.c too.
 */
#ifndef KILN_HASH_H
#define KILN_HASH_H

#include <stddef.h>
#include <stdint.h>

#define KILN__FNV_SEED 1469598103934665603ull

/* FNV-1a 64 of n bytes, continuing from h (KILN__FNV_SEED to start): one
 * byte at a time, for small things (kernel cache entries, the pipeline
 * cache, weights files of format 1). */
uint64_t kiln__fnv1a64(const void *data, size_t n, uint64_t h);

/* The weights checksum (weights files of format 2): the data is cut into
 * segments of KILN__HASH_SEGMENT bytes; each is hashed in four 64-bit
 * multiply-rotate lanes over 32-byte blocks (about 9 GB/s on one core, 15
 * times FNV-1a), and the segments' hashes are joined in order. The same
 * value for the same bytes however they are split between updates, and
 * computable in parallel: kiln__hash_segment of each segment alone (init,
 * updates with that segment's bytes, then it), then kiln__hash_join. */
#define KILN__HASH_SEGMENT (1u << 20)

typedef struct kiln__hash {
    uint64_t lane[4];
    uint64_t segment_bytes;   /* in the segment being hashed */
    unsigned char tail[32];   /* its last segment_bytes % 32 bytes */
    uint64_t joined;          /* the finished segments, joined */
    uint64_t bytes;           /* all so far */
} kiln__hash;

void kiln__hash_init(kiln__hash *h);
void kiln__hash_update(kiln__hash *h, const void *data, size_t n);
uint64_t kiln__hash_final(const kiln__hash *h);
/* init, update, final on one piece. */
uint64_t kiln__hash64(const void *data, size_t n);
/* The hash of the one segment h has seen (its bytes alone, at most
 * KILN__HASH_SEGMENT of them). */
uint64_t kiln__hash_segment(const kiln__hash *h);
/* The checksum of `bytes` bytes from their segments' hashes, in order. */
uint64_t kiln__hash_join(const uint64_t *segments, size_t count, uint64_t bytes);

/* A little-endian u64 (the files' headers). */
uint64_t kiln__get_u64(const unsigned char *p);

#endif
