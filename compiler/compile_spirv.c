/*
 * compile_spirv.c: GLSL kernels to checked, optimized SPIR-V.
 *
 * Each dispatch names a shader family and its #defines. Identical (family,
 * defines) pairs compile once. shaderc compiles the family's GLSL (embedded
 * in kiln at build time from shaders/) for Vulkan 1.2 / SPIR-V 1.5 with its
 * size level, which runs spirv-tools' optimizer passes (the spirv-tools of
 * Debian 12 has no C API for the optimizer itself): loop unrolling, SSA,
 * dead code, constant folding. The performance level gives the same
 * instructions for kiln's kernels (the matmul's differ in a few unused
 * decorations) in twice the time: 2.1 s against 1.0 s for one BERT-base
 * matmul, the longest job of a cold compile. spirv-tools then validates
 * the result. Modules whose final words are identical are stored
 * once, so the generated file carries each distinct kernel once. The kernel
 * cache (kernel_cache.c) spares the compile of a kernel built before; what
 * it returns is validated again (an invalid entry is compiled afresh).
 *
 * With --sync-check each kernel's main is renamed (common.glsl) and a new
 * main is appended (sync_tail): it declares the dispatch's bindings as
 * storage-buffer descriptors, read-only where the kernel only reads, touches
 * them in a branch that never runs, and calls the kernel. The validation
 * layer then counts them as accesses of the ranges the runtime binds.
 *
 * A kernel that fails to compile or validate is a bug in kiln, not in the
 * model: it is reported as an internal error with the compiler's message.
 */
#define _POSIX_C_SOURCE 200809L
#include "kiln.h"

#include <pthread.h>
#include <shaderc/shaderc.h>
#include <spirv-tools/libspirv.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Called from the worker threads: plain calloc, not the tracked heap. */
static shaderc_include_result *include_file(void *user, const char *requested,
                                            int type, const char *requester,
                                            size_t depth) {
    (void)user;
    (void)type;
    (void)requester;
    (void)depth;
    shaderc_include_result *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    const EmbeddedFile *f = embedded_file(requested);
    if (f) {
        r->source_name = f->name;
        r->source_name_length = strlen(f->name);
        r->content = f->text;
        r->content_length = f->size;
    } else {
        r->source_name = "";
        r->content = "no such shader include";
        r->content_length = strlen(r->content);
    }
    return r;
}

static void release_include(void *user, shaderc_include_result *r) {
    (void)user;
    free(r);
}

/* what followed by msg, with malloc (the worker threads use it too: not
 * the tracked heap); NULL when out of memory. */
static char *dup_message(const char *what, const char *msg) {
    size_t n = strlen(what) + strlen(msg) + 1;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%s%s", what, msg);
    return s;
}

/* NULL when the words are valid SPIR-V for Vulkan, else the validator's
 * message (malloc: free it). */
static char *spirv_invalid(spv_context ctx, const uint32_t *words, size_t n) {
    spv_const_binary_t bin = {words, n};
    spv_diagnostic diag = NULL;
    char *msg = NULL;
    if (spvValidate(ctx, &bin, &diag) != SPV_SUCCESS)
        msg = dup_message("", diag && diag->error ? diag->error : "?");
    spvDiagnosticDestroy(diag);
    return msg;
}

static Module module_of(const Dispatch *d, const uint32_t *words, size_t nwords) {
    Module m = {0};
    m.family = d->family;
    m.defines = d->defines.buf ? d->defines.buf : "";
    m.nwords = nwords;
    m.words = xcalloc(m.nwords, sizeof(uint32_t));
    memcpy(m.words, words, m.nwords * sizeof(uint32_t));
    m.hash = hash_bytes(HASH_SEED, m.words, m.nwords * sizeof(uint32_t));
    return m;
}

/* --sync-check: what follows the kernel's source (see the top). Binding k is
 * argument k; the validation layer does not report write-after-write hazards
 * between descriptor writes, so each written argument is bound a second time,
 * read-only (bindings nargs, nargs + 1, ... in argument order), which turns a
 * missing barrier between two writes into a read after write. Every dispatch
 * writes something, so the reads feed a write and stay. */
static char *sync_tail(const Dispatch *d) {
    Str s = {0};
    str_add(&s, "\n#undef main\n");
    int alias = d->nargs;
    for (int k = 0; k < d->nargs; k++) {
        bool w = (d->writes >> k) & 1u;
        str_addf(&s, "layout(set = 0, binding = %d, std430) restrict%s buffer KilnSync%d "
                     "{ uint d[]; } kiln_sync%d;\n", k, w ? "" : " readonly", k, k);
        if (w)
            str_addf(&s, "layout(set = 0, binding = %d, std430) restrict readonly buffer "
                         "KilnSyncR%d { uint d[]; } kiln_sync_r%d;\n", alias++, k, k);
    }
    str_add(&s, "void main() {\n"
                "    if (gl_NumWorkGroups.x == 0u) { /* never while a dispatch runs */\n"
                "        uint s = 0u;\n");
    for (int k = 0; k < d->nargs; k++)
        str_addf(&s, "        s += kiln_sync%s%d.d[0];\n", (d->writes >> k) & 1u ? "_r" : "", k);
    for (int k = 0; k < d->nargs; k++)
        if ((d->writes >> k) & 1u)
            str_addf(&s, "        kiln_sync%d.d[0] = s;\n", k);
    str_add(&s, "    }\n    kiln_kernel_main();\n}\n");
    return s.buf;
}

static bool words_equal(const uint32_t *a, size_t na, const uint32_t *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

/* Whether embedded file f contains the text what. */
static bool contains(const EmbeddedFile *f, const char *what) {
    size_t n = strlen(what);
    for (size_t i = 0; f && i + n <= f->size; i++)
        if (memcmp(f->text + i, what, n) == 0)
            return true;
    return false;
}

/* Whether a family's kernels reduce through subgroups where they can: their
 * source includes reduce.glsl or tests KILN_SUBGROUP itself. They get a
 * second build with KILN_SUBGROUP 1 (reductions within subgroups first)
 * for devices with KILN_FEATURE_SUBGROUP. */
static bool reduces(const char *family) {
    const EmbeddedFile *src = embedded_file(format("%s.comp", family));
    return contains(src, "#include \"reduce.glsl\"") || contains(src, "#if KILN_SUBGROUP");
}

/* One kernel to build: d's family with d's defines and then extra ones
 * (""). Prepared and finished on the main thread; compiled on a worker
 * (compile_job), which touches only the job, shaderc and spirv-tools. */
typedef struct Job {
    const Dispatch *d;
    const char *file, *text, *all, *key; /* source, its defines, cache key */
    uint32_t *words;                     /* result (malloc), or NULL */
    size_t nwords;
    char *error;                         /* strdup'ed message, or NULL */
    bool cached;
} Job;

static void prepare_job(Job *j, const Dispatch *d, const char *extra, bool sync_check,
                        KernelCache *cache, spv_context ctx) {
    const char *tail = sync_check ? sync_tail(d) : "";
    j->d = d;
    j->all = format("%s%s", d->defines.buf ? d->defines.buf : "", extra);
    /* The cache key holds the tail too: it is source the defines do not name. */
    j->key = format("%s%s", j->all, tail);
    size_t cached_words = 0;
    uint32_t *cached = kernel_cache_get(cache, d->family, j->key, &cached_words);
    if (cached) {
        char *invalid = spirv_invalid(ctx, cached, cached_words);
        if (!invalid && (j->words = malloc(cached_words * sizeof *j->words + 1))) {
            memcpy(j->words, cached, cached_words * sizeof *j->words);
            j->nwords = cached_words;
            j->cached = true;
        }
        free(invalid); /* invalid: compiled again, and the entry overwritten */
        xfree(cached);
        if (j->cached)
            return;
    }
    j->file = format("%s.comp", d->family);
    const EmbeddedFile *src = embedded_file(j->file);
    if (!src)
        internal_error("no shader family %s", j->file);
    j->text = format("%.*s%s", (int)src->size, src->text, tail);
}

static void compile_job(Job *j, shaderc_compiler_t sc, spv_context ctx) {
    shaderc_compile_options_t o = shaderc_compile_options_initialize();
    shaderc_compile_options_set_target_env(o, shaderc_target_env_vulkan,
                                           shaderc_env_version_vulkan_1_2);
    shaderc_compile_options_set_target_spirv(o, shaderc_spirv_version_1_5);
    /* SPIRV_OPTIMIZER_LEVEL names this level in the kernel cache's key */
    shaderc_compile_options_set_optimization_level(o, shaderc_optimization_level_size);
    shaderc_compile_options_set_include_callbacks(o, include_file, release_include,
                                                  NULL);
    for (const char *p = j->all; *p;) {
        const char *sp = strchr(p, ' '), *nl = strchr(p, '\n');
        if (!sp || !nl || sp > nl) {
            j->error = dup_message("malformed define in ", j->d->family);
            shaderc_compile_options_release(o);
            return;
        }
        shaderc_compile_options_add_macro_definition(o, p, (size_t)(sp - p), sp + 1,
                                                     (size_t)(nl - sp - 1));
        p = nl + 1;
    }
    shaderc_compilation_result_t r =
        shaderc_compile_into_spv(sc, j->text, strlen(j->text), shaderc_compute_shader,
                                 j->file, "main", o);
    if (shaderc_result_get_compilation_status(r) != shaderc_compilation_status_success) {
        j->error = dup_message("does not compile:\n", shaderc_result_get_error_message(r));
    } else {
        size_t nwords = shaderc_result_get_length(r) / 4;
        const uint32_t *words = (const uint32_t *)shaderc_result_get_bytes(r);
        char *invalid = spirv_invalid(ctx, words, nwords);
        if (invalid)
            j->error = dup_message("is invalid SPIR-V: ", invalid);
        else if ((j->words = malloc(nwords * sizeof *j->words + 1)))
            memcpy(j->words, words, nwords * sizeof *j->words);
        else
            j->error = dup_message("", "out of memory");
        j->nwords = nwords;
        free(invalid);
    }
    shaderc_result_release(r);
    shaderc_compile_options_release(o);
}

/* The workers take the jobs to compile in turn; a progress line on a
 * terminal when the compile takes more than a second. */
typedef struct Pool {
    Job **todo;
    int n, next, done;
    pthread_mutex_t lock;
    struct timespec start;
    bool progress;
} Pool;

static double seconds_since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) * 1e-9;
}

static void *worker(void *arg) {
    Pool *pool = arg;
    shaderc_compiler_t sc = shaderc_compiler_initialize();
    spv_context ctx = spvContextCreate(SPV_ENV_VULKAN_1_2);
    for (;;) {
        pthread_mutex_lock(&pool->lock);
        int i = pool->next < pool->n ? pool->next++ : -1;
        pthread_mutex_unlock(&pool->lock);
        if (i < 0)
            break;
        if (!sc || !ctx)
            pool->todo[i]->error = dup_message("", "cannot initialize shaderc");
        else
            compile_job(pool->todo[i], sc, ctx);
        pthread_mutex_lock(&pool->lock);
        pool->done++;
        if (pool->progress && seconds_since(&pool->start) > 1.0)
            fprintf(stderr, "\rkiln: compiling kernels: %d of %d", pool->done, pool->n);
        pthread_mutex_unlock(&pool->lock);
    }
    if (ctx)
        spvContextDestroy(ctx);
    if (sc)
        shaderc_compiler_release(sc);
    return NULL;
}

/* Compiles the jobs on worker_threads(n) threads (1: on this thread). */
static void compile_jobs(Job **todo, int n) {
    Pool pool = {todo, n, 0, 0, PTHREAD_MUTEX_INITIALIZER, {0, 0}, false};
    clock_gettime(CLOCK_MONOTONIC, &pool.start);
    pool.progress = !kiln_quiet && isatty(2);
    long threads = worker_threads(n);
    if (threads <= 1) {
        worker(&pool);
    } else {
        pthread_t *ids = xcalloc((size_t)threads, sizeof *ids);
        long started = 0;
        while (started < threads && pthread_create(&ids[started], NULL, worker, &pool) == 0)
            started++;
        if (started == 0)
            worker(&pool);
        for (long t = 0; t < started; t++)
            pthread_join(ids[t], NULL);
    }
    if (pool.progress && seconds_since(&pool.start) > 1.0)
        fprintf(stderr, "\rkiln: compiled %d kernels in %.1f s            \n", n,
                seconds_since(&pool.start));
}

/* The job's module (an error is a bug in kiln: its message, and the node). */
static Module finish_job(Job *j, KernelCache *cache) {
    if (j->error)
        internal_error("kernel %s for node '%s' %s\ndefines:\n%s", j->d->family,
                       j->d->node->name, j->error, j->all);
    if (!j->cached)
        kernel_cache_put(cache, j->d->family, j->key, j->words, j->nwords);
    /* coopmat_wg.comp: written with NV cooperative matrices of workgroup
     * scope, validated as such (and cached), run as KHR ones */
    if (strcmp(j->d->family, "coopmat_wg") == 0) {
        char *error;
        size_t n;
        uint32_t *khr = spirv_khr_coopmat(j->words, j->nwords, &n, &error);
        if (!khr)
            internal_error("kernel %s for node '%s': %s", j->d->family, j->d->node->name,
                           error);
        free(j->words);
        j->words = NULL;
        Module m = module_of(j->d, khr, n);
        xfree(khr);
        return m;
    }
    Module m = module_of(j->d, j->words, j->nwords);
    free(j->words);
    j->words = NULL;
    return m;
}

uint64_t spirv_bytes(const Program *p) {
    uint64_t b = 0;
    for (int i = 0; i < p->nmodules; i++)
        b += (p->modules[i].nwords + p->modules[i].alt_nwords) * 4;
    return b;
}

/* Three passes, so that the output does not depend on the threads: the
 * distinct kernels in dispatch order (and each one's cache entry), their
 * compiles in parallel, then their modules in dispatch order. */
void compile_kernels(Program *p, KernelCache *cache) {
    spv_context ctx = spvContextCreate(SPV_ENV_VULKAN_1_2);
    if (!ctx)
        fatal("cannot initialize spirv-tools");
    Map by_source = {0}; /* family + defines -> job pair index + 1 */
    Job *jobs = xcalloc(2 * (size_t)p->ndispatches + 1, sizeof *jobs);
    int *pair_of = xcalloc((size_t)p->ndispatches + 1, sizeof *pair_of);
    int npairs = 0;
    for (int i = 0; i < p->ndispatches; i++) {
        Dispatch *d = p->dispatches[i];
        if (p->sync_check) { /* the tail depends on them */
            define_int(d, "KILN_SYNC_ARGS", d->nargs);
            define_int(d, "KILN_SYNC_WRITES", d->writes);
        }
        char *key = format("%s\n%s", d->family, d->defines.buf ? d->defines.buf : "");
        intptr_t known = (intptr_t)map_get(&by_source, key);
        if (known) {
            pair_of[i] = (int)known - 1;
            continue;
        }
        pair_of[i] = npairs;
        prepare_job(&jobs[2 * npairs], d, "", p->sync_check, cache, ctx);
        if (reduces(d->family))
            prepare_job(&jobs[2 * npairs + 1], d, "KILN_SUBGROUP 1\n", p->sync_check, cache,
                        ctx);
        map_put(&by_source, key, (void *)(intptr_t)(++npairs));
    }
    spvContextDestroy(ctx);
    Job **todo = xcalloc(2 * (size_t)npairs + 1, sizeof *todo);
    int ntodo = 0;
    for (int k = 0; k < 2 * npairs; k++)
        if (jobs[k].d && !jobs[k].cached)
            todo[ntodo++] = &jobs[k];
    if (ntodo)
        compile_jobs(todo, ntodo);

    p->modules = xcalloc((size_t)p->ndispatches + 1, sizeof(Module));
    int *module_of_pair = xcalloc((size_t)npairs + 1, sizeof *module_of_pair);
    for (int k = 0; k < npairs; k++) {
        Module m = finish_job(&jobs[2 * k], cache);
        if (jobs[2 * k + 1].d) {
            Module alt = finish_job(&jobs[2 * k + 1], cache);
            if (!words_equal(alt.words, alt.nwords, m.words, m.nwords)) {
                m.alt_words = alt.words;
                m.alt_nwords = alt.nwords;
                m.alt_needs = KILN_FEATURE_SUBGROUP | jobs[2 * k].d->alt_needs;
            }
        }
        int idx = -1;
        for (int j = 0; j < p->nmodules; j++) {
            const Module *o = &p->modules[j];
            if (o->hash == m.hash && words_equal(o->words, o->nwords, m.words, m.nwords) &&
                words_equal(o->alt_words, o->alt_nwords, m.alt_words, m.alt_nwords))
                idx = j;
        }
        if (idx < 0) {
            idx = p->nmodules++;
            p->modules[idx] = m;
        }
        module_of_pair[k] = idx;
    }
    for (int i = 0; i < p->ndispatches; i++)
        p->dispatches[i]->module = module_of_pair[pair_of[i]];
}
