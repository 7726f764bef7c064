/*
 * hash.c: the checksums of kiln_hash.h.
 *
 * kiln__hash is a multiply-rotate hash in four independent lanes, so that
 * the processor overlaps their multiplications: each 32-byte block adds
 * word i, times an odd constant, to lane i, rotates and multiplies again.
 * A segment's value mixes the lanes, its tail and its length; the segments'
 * values are joined in order (a rotate-multiply chain, so that their order
 * counts), and the result, with the total length, avalanches
 * (xor-shift-multiply): one flipped bit anywhere changes about half of the
 * result's. It detects damage; it is not a cryptographic hash.
 */
#include "kiln_hash.h"

#include <string.h>

#define K1 0x9e3779b97f4a7c15ull
#define K2 0xbf58476d1ce4e5b9ull
#define K3 0x94d049bb133111ebull
#define K4 0xd6e8feb86659fd93ull

uint64_t kiln__fnv1a64(const void *data, size_t n, uint64_t h) {
    const unsigned char *p = (const unsigned char *)data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

uint64_t kiln__get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

/* The 8 bytes at p as a little-endian word: one load where the host is
 * little-endian (the compiler folds the test). */
static uint64_t word(const unsigned char *p) {
    const uint16_t one = 1;
    uint64_t v;
    if (*(const unsigned char *)&one) {
        memcpy(&v, p, 8);
        return v;
    }
    return kiln__get_u64(p);
}

static uint64_t round64(uint64_t lane, uint64_t w) { return rotl(lane + w * K2, 31) * K1; }

static void blocks(kiln__hash *h, const unsigned char *p, size_t nblocks) {
    uint64_t a = h->lane[0], b = h->lane[1], c = h->lane[2], d = h->lane[3];
    for (size_t i = 0; i < nblocks; i++, p += 32) {
        a = round64(a, word(p));
        b = round64(b, word(p + 8));
        c = round64(c, word(p + 16));
        d = round64(d, word(p + 24));
    }
    h->lane[0] = a;
    h->lane[1] = b;
    h->lane[2] = c;
    h->lane[3] = d;
}

static void lanes_init(kiln__hash *h) {
    h->lane[0] = K1 + K2;
    h->lane[1] = K2;
    h->lane[2] = 0;
    h->lane[3] = 0 - K1;
    h->segment_bytes = 0;
}

void kiln__hash_init(kiln__hash *h) {
    memset(h, 0, sizeof *h);
    lanes_init(h);
    h->joined = K3;
}

uint64_t kiln__hash_segment(const kiln__hash *h) {
    uint64_t v = rotl(h->lane[0], 1) + rotl(h->lane[1], 7) + rotl(h->lane[2], 12) +
                 rotl(h->lane[3], 18);
    for (int i = 0; i < 4; i++)
        v = (v ^ round64(0, h->lane[i])) * K1 + K4;
    v += h->segment_bytes;
    size_t rest = (size_t)(h->segment_bytes % 32), i = 0;
    for (; i + 8 <= rest; i += 8)
        v = rotl(v ^ round64(0, word(h->tail + i)), 27) * K1 + K4;
    for (; i < rest; i++)
        v = rotl(v ^ (h->tail[i] * K3), 11) * K1;
    return v;
}

static uint64_t join(uint64_t joined, uint64_t segment) {
    return rotl(joined ^ round64(0, segment), 27) * K1 + K4;
}

/* Up to the end of the segment being hashed. */
static void segment_update(kiln__hash *h, const unsigned char *p, size_t n) {
    size_t have = (size_t)(h->segment_bytes % 32);
    h->segment_bytes += n;
    if (have) { /* fill the pending block first */
        size_t take = 32 - have < n ? 32 - have : n;
        memcpy(h->tail + have, p, take);
        p += take;
        n -= take;
        if (have + take < 32)
            return;
        blocks(h, h->tail, 1);
    }
    blocks(h, p, n / 32);
    memcpy(h->tail, p + n / 32 * 32, n % 32);
}

void kiln__hash_update(kiln__hash *h, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    h->bytes += n;
    while (n) {
        if (h->segment_bytes == KILN__HASH_SEGMENT) { /* full, and more follows */
            h->joined = join(h->joined, kiln__hash_segment(h));
            lanes_init(h);
        }
        size_t room = (size_t)(KILN__HASH_SEGMENT - h->segment_bytes);
        size_t take = n < room ? n : room;
        segment_update(h, p, take);
        p += take;
        n -= take;
    }
}

static uint64_t avalanche(uint64_t v) {
    v ^= v >> 33;
    v *= K2;
    v ^= v >> 29;
    v *= K3;
    v ^= v >> 32;
    return v;
}

uint64_t kiln__hash_final(const kiln__hash *h) {
    uint64_t joined = h->joined;
    if (h->segment_bytes || h->bytes == 0) /* the last segment */
        joined = join(joined, kiln__hash_segment(h));
    return avalanche(joined ^ h->bytes);
}

uint64_t kiln__hash_join(const uint64_t *segments, size_t count, uint64_t bytes) {
    uint64_t joined = K3;
    for (size_t i = 0; i < count; i++)
        joined = join(joined, segments[i]);
    if (count == 0) { /* no bytes: one empty segment, as kiln__hash_final has */
        kiln__hash h;
        kiln__hash_init(&h);
        joined = join(joined, kiln__hash_segment(&h));
    }
    return avalanche(joined ^ bytes);
}

uint64_t kiln__hash64(const void *data, size_t n) {
    kiln__hash h;
    kiln__hash_init(&h);
    kiln__hash_update(&h, data, n);
    return kiln__hash_final(&h);
}
