/*
 * kernel_cache.c: compiled kernels kept on disk between runs of kiln.
 *
 * shaderc and the spirv-tools optimizer take most of a cold compile. The
 * cache keeps each kernel's final SPIR-V under a key that holds everything
 * the words depend on: kiln's version, shaderc's and spirv-tools', every
 * embedded shader source (any edit of any shader file changes every key),
 * the family and its #defines. An entry is one file, DIR/<16 hex>.spv:
 *
 *   "KILNSPV1" | u32 key bytes | key | u32 words | words | u64 FNV-1a of
 *   everything before it
 *
 * all little-endian. A read checks the magic, the whole key (the name is
 * only its hash), the length and the checksum, and the caller validates the
 * words again, so a truncated, corrupt or colliding entry is a miss, never a
 * wrong kernel. Writes go through a temporary file and a rename, so
 * concurrent kiln processes see whole entries or none. The cache never makes
 * a compile fail: a directory that cannot be made or written turns it off
 * (-v says so).
 */
#include "kiln.h"

#include <errno.h>
#include <shaderc/shaderc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAGIC "KILNSPV1"

/* From <spirv-tools/libspirv.h>, which cannot be included twice in one
 * program: in C it defines a constant (kDefaultMaxIdBound) per file. */
const char *spvSoftwareVersionDetailsString(void);

/* The default directory: $KILN_CACHE_DIR (empty: no cache), else
 * $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln; NULL when none applies. */
const char *kernel_cache_default(void) {
    const char *dir = getenv("KILN_CACHE_DIR");
    if (dir)
        return *dir ? dir : NULL;
    const char *xdg = getenv("XDG_CACHE_HOME");
    if (xdg && *xdg == '/')
        return format("%s/kiln", xdg);
    const char *home = getenv("HOME");
    if (home && *home == '/')
        return format("%s/.cache/kiln", home);
    return NULL;
}

/* mkdir -p; true when dir is a directory afterwards. */
static bool make_dirs(const char *dir) {
    char *path = xstrdup(dir);
    for (char *s = path + 1;; s++) {
        if (*s == '/' || *s == 0) {
            char c = *s;
            *s = 0;
            if (mkdir(path, 0777) != 0 && errno != EEXIST) {
                xfree(path);
                return false;
            }
            *s = c;
            if (!c)
                break;
        }
    }
    xfree(path);
    struct stat st;
    return stat(dir, &st) == 0 && S_ISDIR(st.st_mode);
}

KernelCache *kernel_cache_open(const char *dir, bool verbose) {
    if (!dir)
        return NULL;
    if (!make_dirs(dir)) {
        if (verbose)
            fprintf(stderr, "kiln: kernel cache off: cannot make directory %s: %s\n", dir,
                    strerror(errno));
        return NULL;
    }
    KernelCache *c = xcalloc(1, sizeof *c);
    c->dir = xstrdup(dir);
    c->verbose = verbose;
    unsigned int spv_version = 0, spv_revision = 0;
    shaderc_get_spv_version(&spv_version, &spv_revision);
    Str salt = {0};
    str_addf(&salt, "kiln %s\nshaderc spv %u.%u\nspirv-tools %s\noptimizer %s\n", KILN_VERSION,
             spv_version, spv_revision, spvSoftwareVersionDetailsString(),
             SPIRV_OPTIMIZER_LEVEL);
    uint64_t h = HASH_SEED;
    for (const EmbeddedFile *f = embedded_files; f->name; f++) {
        h = hash_bytes(h, f->name, strlen(f->name) + 1);
        h = hash_bytes(h, f->text, f->size);
    }
    str_addf(&salt, "sources %016llx\n", (unsigned long long)h);
    c->salt = salt.buf;
    return c;
}

static void put_u32(Str *s, uint32_t v) {
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8),
                          (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
    str_addn(s, b, 4);
}

static uint32_t get_u32(const unsigned char *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
           (uint32_t)b[3] << 24;
}

/* The entry's key and file name for a kernel. */
static char *entry_key(const KernelCache *c, const char *family, const char *defines) {
    return format("%s%s\n%s", c->salt, family, defines);
}

static char *entry_path(const KernelCache *c, const char *key) {
    return format("%s/%016llx.spv", c->dir,
                  (unsigned long long)hash_bytes(HASH_SEED, key, strlen(key)));
}

uint32_t *kernel_cache_get(KernelCache *c, const char *family, const char *defines,
                           size_t *nwords) {
    if (!c)
        return NULL;
    char *key = entry_key(c, family, defines), *path = entry_path(c, key);
    size_t klen = strlen(key);
    uint64_t size = 0;
    unsigned char *b = NULL;
    FILE *f = open_regular(path, &size); /* never a FIFO or a directory */
    if (f && size <= (64u << 20)) {
        b = xcalloc(1, (size_t)size + 1);
        if (!read_at(f, 0, b, size))
            size = 0;
    }
    if (f)
        fclose(f);
    uint32_t *words = NULL;
    size_t head = 8 + 4 + klen + 4;
    if (b && size >= head + 8 && memcmp(b, MAGIC, 8) == 0 && get_u32(b + 8) == klen &&
        memcmp(b + 12, key, klen) == 0) {
        uint64_t n = get_u32(b + head - 4), sum = 0;
        if (n > 0 && size == head + 4 * n + 8) {
            for (int i = 0; i < 8; i++)
                sum |= (uint64_t)b[size - 8 + (uint64_t)i] << (8 * i);
            if (sum == hash_bytes(HASH_SEED, b, size - 8)) {
                words = xcalloc(n, sizeof(uint32_t));
                for (uint64_t i = 0; i < n; i++)
                    words[i] = get_u32(b + head + 4 * i);
                *nwords = n;
            }
        }
    }
    c->hits += words != NULL;
    c->misses += words == NULL;
    xfree(b);
    xfree(key);
    xfree(path);
    return words;
}

void kernel_cache_put(KernelCache *c, const char *family, const char *defines,
                      const uint32_t *words, size_t nwords) {
    if (!c || c->failed)
        return;
    char *key = entry_key(c, family, defines), *path = entry_path(c, key);
    Str s = {0};
    str_addn(&s, MAGIC, 8);
    put_u32(&s, (uint32_t)strlen(key));
    str_add(&s, key);
    put_u32(&s, (uint32_t)nwords);
    for (size_t i = 0; i < nwords; i++)
        put_u32(&s, words[i]);
    uint64_t sum = hash_bytes(HASH_SEED, s.buf, s.len);
    for (int i = 0; i < 8; i++) {
        unsigned char byte = (unsigned char)(sum >> (8 * i));
        str_addn(&s, &byte, 1);
    }
    if (!write_file(path, s.buf, s.len)) {
        if (c->verbose)
            fprintf(stderr, "kiln: kernel cache off: cannot write %s: %s\n", path,
                    strerror(errno));
        c->failed = true;
    }
    xfree(s.buf);
    xfree(key);
    xfree(path);
}
