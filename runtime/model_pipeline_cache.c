/*
 * model_pipeline_cache.c: the pipeline cache on disk, so that a program's
 * later starts skip the driver's shader compiles.
 *
 * Where: kiln_model_options.pipeline_cache names the file ("" turns it
 * off); by default it is DIR/pipelines/MODEL-VENDOR-DEVICE.vkpc, DIR being
 * $KILN_CACHE_DIR (empty: off), else $XDG_CACHE_HOME/kiln, else
 * ~/.cache/kiln (the compiler's kernel cache lives there too), MODEL a hash
 * of the model's kernels. The file is "KILNPC01", the data's byte count and
 * its FNV-1a 64 checksum (little-endian u64s), then what
 * vkGetPipelineCacheData gave. Before Vulkan sees the data, its header is
 * checked against this device (vendor, device, pipelineCacheUUID): a file
 * that is damaged, truncated or another device's is ignored, and written
 * afresh after the pipelines are made. The file is written through a
 * temporary name and renamed, so concurrent programs never see half of
 * one. Nothing here fails a create: a cache that cannot be read or written
 * is only slower.
 *
 * Beside it, FILE.weights remembers the weights sidecar that a create read
 * whole and found to match its checksum: the file's device, inode, size,
 * modification and status-change times (what stat says; a write changes the
 * last, which no program can set back) and the checksum. When a later
 * create opens a sidecar whose stat and header match that record, it skips
 * hashing the bytes again (60-90 ms of BERT-base's warm create on an H200
 * host); the header, the size and the trailing bytes are still checked. A
 * record that does not match is ignored, and rewritten after the next full
 * check. With the cache off, every create hashes the whole file.
 */
#define _POSIX_C_SOURCE 200809L
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAGIC "KILNPC01"
#define STAMP_MAGIC "KILNWS01"
#define STAMP_FIELDS 8u /* after the magic: see stamp_of */
#define HEAD_BYTES 24u /* magic, byte count, checksum */

static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static int make_dirs(char *path) { /* every directory of path but its last part */
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        int ok = mkdir(path, 0755) == 0 || errno == EEXIST;
        *p = '/';
        if (!ok)
            return 0;
    }
    return 1;
}

/* Writes n bytes to base + suffix through a temporary file and a rename,
 * making the directories; failures are silent (a cache is only slower). */
static void write_atomically(kiln_model *m, const char *base, const char *suffix,
                             const unsigned char *buf, size_t n) {
    size_t plen = strlen(base) + strlen(suffix) + 32;
    char *path = (char *)kiln__calloc(m->host, 2, plen), *tmp = path ? path + plen : NULL;
    if (path) {
        snprintf(path, plen, "%s%s", base, suffix);
        snprintf(tmp, plen, "%s%s.%ld.tmp", base, suffix, (long)getpid());
    }
    if (path && make_dirs(path)) {
        FILE *f = fopen(tmp, "wb");
        int ok = f && fwrite(buf, 1, n, f) == n;
        if (f && fclose(f) != 0)
            ok = 0;
        if (!ok || rename(tmp, path) != 0)
            remove(tmp);
    }
    kiln__free(m->host, path);
}

/* The cache file's path (allocated), or NULL when the cache is off. */
static char *cache_path(kiln_model *m, const char *option) {
    char *path = NULL;
    if (option) {
        if (!*option)
            return NULL;
        size_t n = strlen(option) + 1;
        path = (char *)kiln__calloc(m->host, n, 1);
        if (path)
            memcpy(path, option, n);
        return path;
    }
    const char *dir = getenv("KILN_CACHE_DIR"), *sub = "";
    if (dir && !*dir)
        return NULL;
    if (!dir && (dir = getenv("XDG_CACHE_HOME")) && *dir)
        sub = "/kiln";
    else if (!dir && (dir = getenv("HOME")) && *dir)
        sub = "/.cache/kiln";
    if (!dir || !*dir)
        return NULL;
    const kiln_model_desc *d = m->desc;
    uint64_t h = kiln__fnv1a64(&d->abi_version, sizeof d->abi_version, KILN__FNV_SEED);
    for (uint32_t i = 0; i < d->kernel_count; i++) {
        const kiln_kernel *k = &d->kernels[i];
        h = kiln__fnv1a64(k->spirv, (size_t)k->words * 4u, h);
        if (k->alt_spirv)
            h = kiln__fnv1a64(k->alt_spirv, (size_t)k->alt_words * 4u, h);
    }
    const VkPhysicalDeviceProperties *p = &m->device->props;
    size_t n = strlen(dir) + strlen(sub) + 80;
    path = (char *)kiln__calloc(m->host, n, 1);
    if (path)
        snprintf(path, n, "%s%s/pipelines/%016llx-%04x-%04x.vkpc", dir, sub,
                 (unsigned long long)h, p->vendorID, p->deviceID);
    return path;
}

/* Whether data (n bytes) starts with a pipeline cache header of this device. */
static int header_matches(const kiln_device *dev, const unsigned char *data, size_t n) {
    if (n < 16 + VK_UUID_SIZE)
        return 0;
    uint32_t f[4];
    for (int i = 0; i < 4; i++)
        f[i] = (uint32_t)data[4 * i] | (uint32_t)data[4 * i + 1] << 8 |
               (uint32_t)data[4 * i + 2] << 16 | (uint32_t)data[4 * i + 3] << 24;
    return f[0] >= 16 + VK_UUID_SIZE && f[0] <= n &&
           f[1] == VK_PIPELINE_CACHE_HEADER_VERSION_ONE && f[2] == dev->props.vendorID &&
           f[3] == dev->props.deviceID &&
           memcmp(data + 16, dev->props.pipelineCacheUUID, VK_UUID_SIZE) == 0;
}

void kiln__pipeline_cache_locate(kiln_model *m) {
    if (!m->pipeline_cache_path)
        m->pipeline_cache_path = cache_path(m, m->pipeline_cache_option);
}

void kiln__pipeline_cache_load(kiln_model *m, VkPipelineCacheCreateInfo *ci) {
    kiln__pipeline_cache_locate(m);
    if (!m->pipeline_cache_path)
        return;
    FILE *f = fopen(m->pipeline_cache_path, "rb");
    if (!f)
        return;
    unsigned char head[HEAD_BYTES];
    if (fread(head, 1, HEAD_BYTES, f) == HEAD_BYTES && memcmp(head, MAGIC, 8) == 0) {
        uint64_t n = kiln__get_u64(head + 8);
        unsigned char *data = n && n < (1ull << 31)
                                  ? (unsigned char *)kiln__calloc(m->host, (size_t)n, 1)
                                  : NULL;
        if (data && fread(data, 1, (size_t)n, f) == n && fgetc(f) == EOF &&
            kiln__fnv1a64(data, (size_t)n, KILN__FNV_SEED) == kiln__get_u64(head + 16) &&
            header_matches(m->device, data, (size_t)n)) {
            m->pipeline_cache_data = data;
            m->pipeline_cache_bytes = (size_t)n;
            ci->initialDataSize = (size_t)n;
            ci->pInitialData = data;
        } else {
            kiln__free(m->host, data);
        }
    }
    fclose(f);
}

void kiln__pipeline_cache_save(kiln_model *m) {
    VkDevice vd = m->device->device;
    size_t n = 0;
    if (!m->pipeline_cache_path || !m->cache ||
        vkGetPipelineCacheData(vd, m->cache, &n, NULL) != VK_SUCCESS || n == 0)
        return;
    unsigned char *buf = (unsigned char *)kiln__calloc(m->host, n + HEAD_BYTES, 1);
    if (!buf)
        return;
    size_t got = n;
    if (vkGetPipelineCacheData(vd, m->cache, &got, buf + HEAD_BYTES) == VK_SUCCESS &&
        !(got == m->pipeline_cache_bytes &&
          memcmp(buf + HEAD_BYTES, m->pipeline_cache_data, got) == 0)) {
        memcpy(buf, MAGIC, 8);
        put_u64(buf + 8, got);
        put_u64(buf + 16, kiln__fnv1a64(buf + HEAD_BYTES, got, KILN__FNV_SEED));
        write_atomically(m, m->pipeline_cache_path, "", buf, got + HEAD_BYTES);
    }
    kiln__free(m->host, buf);
}

/* The record of f (a weights sidecar with the given checksum): the magic,
 * then STAMP_FIELDS u64s and their FNV-1a 64. 0 when stat fails. */
static int stamp_of(FILE *f, uint64_t checksum, unsigned char out[16 + 8 * STAMP_FIELDS]) {
    struct stat st;
    if (fstat(fileno(f), &st) != 0)
        return 0;
    uint64_t v[STAMP_FIELDS] = {(uint64_t)st.st_dev, (uint64_t)st.st_ino,
                                (uint64_t)st.st_size, (uint64_t)st.st_mtim.tv_sec,
                                (uint64_t)st.st_mtim.tv_nsec, (uint64_t)st.st_ctim.tv_sec,
                                (uint64_t)st.st_ctim.tv_nsec, checksum};
    memcpy(out, STAMP_MAGIC, 8);
    for (unsigned i = 0; i < STAMP_FIELDS; i++)
        put_u64(out + 8 + 8 * i, v[i]);
    put_u64(out + 8 + 8 * STAMP_FIELDS, kiln__fnv1a64(out, 8 + 8 * STAMP_FIELDS, KILN__FNV_SEED));
    return 1;
}

int kiln__weights_stamp_matches(kiln_model *m, FILE *f, uint64_t checksum) {
    unsigned char want[16 + 8 * STAMP_FIELDS], have[sizeof want + 1];
    kiln__pipeline_cache_locate(m);
    if (!m->pipeline_cache_path || !stamp_of(f, checksum, want))
        return 0;
    size_t n = strlen(m->pipeline_cache_path) + 16;
    char *path = (char *)kiln__calloc(m->host, n, 1);
    FILE *r = path ? (snprintf(path, n, "%s.weights", m->pipeline_cache_path), fopen(path, "rb"))
                   : NULL;
    int same = r && fread(have, 1, sizeof have, r) == sizeof want &&
               memcmp(have, want, sizeof want) == 0;
    if (r)
        fclose(r);
    kiln__free(m->host, path);
    return same;
}

void kiln__weights_stamp_save(kiln_model *m, FILE *f, uint64_t checksum) {
    unsigned char stamp[16 + 8 * STAMP_FIELDS];
    kiln__pipeline_cache_locate(m);
    if (m->pipeline_cache_path && stamp_of(f, checksum, stamp))
        write_atomically(m, m->pipeline_cache_path, ".weights", stamp, sizeof stamp);
}

void kiln__pipeline_cache_free(kiln_model *m) {
    kiln__free(m->host, m->pipeline_cache_data);
    kiln__free(m->host, m->pipeline_cache_path);
    m->pipeline_cache_data = NULL;
    m->pipeline_cache_path = NULL;
}
