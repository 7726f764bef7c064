/*
 * compile_spirv.c: GLSL kernels to checked, optimized SPIR-V.
 *
 * Each dispatch names a shader family and its #defines. Identical (family,
 * defines) pairs compile once. shaderc compiles the family's GLSL (embedded
 * in kiln at build time from shaders/) for Vulkan 1.2 / SPIR-V 1.5 with its
 * performance level, which runs spirv-tools' optimizer passes (the spirv-tools
 * of Debian 12 has no C API for the optimizer itself); spirv-tools then
 * validates the result. Modules whose final words are identical are stored
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
#include "kiln.h"

#include <shaderc/shaderc.h>
#include <spirv-tools/libspirv.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static shaderc_include_result *include_file(void *user, const char *requested,
                                            int type, const char *requester,
                                            size_t depth) {
    (void)user;
    (void)type;
    (void)requester;
    (void)depth;
    shaderc_include_result *r = xcalloc(1, sizeof *r);
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
    (void)r;
}

/* NULL when the words are valid SPIR-V for Vulkan, else the validator's
 * message. */
static char *spirv_invalid(spv_context ctx, const uint32_t *words, size_t n) {
    spv_const_binary_t bin = {words, n};
    spv_diagnostic diag = NULL;
    char *msg = NULL;
    if (spvValidate(ctx, &bin, &diag) != SPV_SUCCESS)
        msg = xstrdup(diag && diag->error ? diag->error : "?");
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

/* Whether a family's kernels reduce across workgroups through reduce.glsl:
 * they get a second build with KILN_SUBGROUP 1 (reductions within
 * subgroups first) for devices with KILN_FEATURE_SUBGROUP. */
static bool reduces(const char *family) {
    static const char line[] = "#include \"reduce.glsl\"";
    const EmbeddedFile *src = embedded_file(format("%s.comp", family));
    for (size_t i = 0; src && i + sizeof line - 1 <= src->size; i++)
        if (memcmp(src->text + i, line, sizeof line - 1) == 0)
            return true;
    return false;
}

/* The module of d's family with d's defines and then extra ones (""). */
static Module compile_one(shaderc_compiler_t sc, spv_context ctx, const Dispatch *d,
                          const char *extra, bool sync_check, KernelCache *cache) {
    const char *tail = sync_check ? sync_tail(d) : "";
    const char *all = format("%s%s", d->defines.buf ? d->defines.buf : "", extra);
    /* The cache key holds the tail too: it is source the defines do not name. */
    const char *defines = format("%s%s", all, tail);
    size_t cached_words = 0;
    uint32_t *cached = kernel_cache_get(cache, d->family, defines, &cached_words);
    if (cached) {
        char *invalid = spirv_invalid(ctx, cached, cached_words);
        if (!invalid) {
            Module m = module_of(d, cached, cached_words);
            xfree(cached);
            return m;
        }
        xfree(invalid); /* compile it again, and overwrite the entry */
        xfree(cached);
    }
    char *file = format("%s.comp", d->family);
    const EmbeddedFile *src = embedded_file(file);
    if (!src)
        internal_error("no shader family %s", file);
    char *text = format("%.*s%s", (int)src->size, src->text, tail);

    shaderc_compile_options_t o = shaderc_compile_options_initialize();
    shaderc_compile_options_set_target_env(o, shaderc_target_env_vulkan,
                                           shaderc_env_version_vulkan_1_2);
    shaderc_compile_options_set_target_spirv(o, shaderc_spirv_version_1_5);
    shaderc_compile_options_set_optimization_level(o, shaderc_optimization_level_performance);
    shaderc_compile_options_set_include_callbacks(o, include_file, release_include,
                                                  NULL);
    for (const char *p = all; *p;) {
        const char *sp = strchr(p, ' '), *nl = strchr(p, '\n');
        if (!sp || !nl || sp > nl)
            internal_error("malformed define in %s", d->family);
        shaderc_compile_options_add_macro_definition(o, p, (size_t)(sp - p), sp + 1,
                                                     (size_t)(nl - sp - 1));
        p = nl + 1;
    }
    shaderc_compilation_result_t r =
        shaderc_compile_into_spv(sc, text, strlen(text), shaderc_compute_shader,
                                 file, "main", o);
    if (shaderc_result_get_compilation_status(r) !=
        shaderc_compilation_status_success)
        internal_error("kernel %s for node '%s' does not compile:\n%s\ndefines:\n%s",
                       d->family, d->node->name, shaderc_result_get_error_message(r), all);
    size_t nwords = shaderc_result_get_length(r) / 4;
    const uint32_t *words = (const uint32_t *)shaderc_result_get_bytes(r);
    char *invalid = spirv_invalid(ctx, words, nwords);
    if (invalid)
        internal_error("SPIR-V of %s for node '%s' is invalid: %s", d->family, d->node->name,
                       invalid);
    kernel_cache_put(cache, d->family, defines, words, nwords);
    Module m = module_of(d, words, nwords);
    shaderc_result_release(r);
    shaderc_compile_options_release(o);
    return m;
}

uint64_t spirv_bytes(const Program *p) {
    uint64_t b = 0;
    for (int i = 0; i < p->nmodules; i++)
        b += (p->modules[i].nwords + p->modules[i].alt_nwords) * 4;
    return b;
}

void compile_kernels(Program *p, KernelCache *cache) {
    shaderc_compiler_t sc = shaderc_compiler_initialize();
    if (!sc)
        fatal("cannot initialize shaderc");
    spv_context ctx = spvContextCreate(SPV_ENV_VULKAN_1_2);

    Map by_source = {0}; /* family + defines -> module index + 1 */
    p->modules = xcalloc((size_t)p->ndispatches + 1, sizeof(Module));
    for (int i = 0; i < p->ndispatches; i++) {
        Dispatch *d = p->dispatches[i];
        if (p->sync_check) { /* the tail depends on them */
            define_int(d, "KILN_SYNC_ARGS", d->nargs);
            define_int(d, "KILN_SYNC_WRITES", d->writes);
        }
        char *key = format("%s\n%s", d->family, d->defines.buf ? d->defines.buf : "");
        intptr_t known = (intptr_t)map_get(&by_source, key);
        if (known) {
            d->module = (int)known - 1;
            continue;
        }
        Module m = compile_one(sc, ctx, d, "", p->sync_check, cache);
        if (reduces(d->family)) {
            Module alt = compile_one(sc, ctx, d, "KILN_SUBGROUP 1\n", p->sync_check, cache);
            if (!words_equal(alt.words, alt.nwords, m.words, m.nwords)) {
                m.alt_words = alt.words;
                m.alt_nwords = alt.nwords;
                m.alt_needs = KILN_FEATURE_SUBGROUP;
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
        d->module = idx;
        map_put(&by_source, key, (void *)(intptr_t)(idx + 1));
    }
    spvContextDestroy(ctx);
    shaderc_compiler_release(sc);
}
