/*
 * test_units.c: unit tests of compiler passes that need no GPU.
 *
 * Prints one line per test, "ok NAME" or "FAIL NAME: why"; tests/run_tests.py
 * counts them. Exit status 1 when any test failed.
 *
 *   planner    random graphs (with views): no two tensors live at once
 *              overlap, every offset is aligned, the arena is at least the
 *              peak of live bytes, inputs and outputs stay pinned
 *   schedule   barriers exactly where byte ranges conflict
 *   broadcast  numpy broadcasting rules
 *   derived    derive_dim: products, quotients, max and min of dims as
 *              constants, scaled dims or derived dims with their ranges,
 *              and none (false) where an operand or a range passes the
 *              bounds that keep the arithmetic from overflowing
 *   splitmix64 the published first outputs of the generator behind `init`
 *   hash       the weights checksum (runtime/hash.c): the same value for
 *              the same bytes however they are split between updates and
 *              from the segments hashed apart and joined; a flipped bit,
 *              a swap of two segments or one more byte changes it
 *   hostile    the front end (load, weights, shape inference) in process
 *              over every truncation of the samples and of ONNX models,
 *              every single-byte corruption of an ONNX model, deep
 *              nesting, alias bombs and cycles, dimensions near 2^63:
 *              each a located error or a success, never a crash (the
 *              sanitizer build checks the rest)
 *   spirv_khr  the rewrite of NV cooperative matrices of workgroup scope
 *              as KHR ones (compiler/spirv_khr.c) on GLSL compiled here:
 *              no NV instruction left, each type's use from the
 *              multiply-add, the layouts and strides kept, the constants
 *              it adds defined once within the bound; A and B of one shape
 *              refused by name
 */
#include "kiln.h"
#include "../runtime/kiln_hash.h"

#include <setjmp.h>
#include <shaderc/shaderc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures, passes;

static void report(const char *name, const char *why) {
    if (why) {
        printf("FAIL %s: %s\n", name, why);
        failures++;
    } else {
        printf("ok %s\n", name);
        passes++;
    }
}

static uint64_t rng_state = 12345;
static uint32_t rnd(uint32_t n) { return (uint32_t)(splitmix64(&rng_state) % n); }

static Tensor *mk_tensor(Graph *g, TensorKind kind, int64_t elems) {
    Loc nowhere = {NULL, 0, 0};
    Tensor *t = graph_tensor(g, format("t%d", g->tensors.len), kind, nowhere);
    t->dtype = KILN_DTYPE_F32;
    t->rank = 1;
    t->shape[0] = elems;
    return t;
}

static Node *mk_node(const char *name) {
    Node *n = xcalloc(1, sizeof *n);
    n->name = name;
    n->op = OP_ADD;
    return n;
}

/* A random DAG: each dispatch writes a new tensor from 1-3 earlier ones;
 * some results are views of earlier tensors; a few are outputs. */
static const char *planner_case(int ntensors, uint64_t align) {
    Graph *g = xcalloc(1, sizeof *g);
    Program *p = xcalloc(1, sizeof *p);
    p->alignment = align;
    int ninputs = 1 + (int)rnd(3);
    for (int i = 0; i < ninputs; i++)
        mk_tensor(g, T_INPUT, 1 + rnd(5000));
    mk_tensor(g, T_WEIGHT, 1 + rnd(5000));
    Node *n = mk_node("n");
    for (int i = 0; i < ntensors; i++) {
        int have = g->tensors.len;
        if (rnd(6) == 0) { /* a view of an earlier non-weight tensor */
            Tensor *src = g->tensors.data[rnd((uint32_t)have)];
            if (src->kind == T_WEIGHT)
                continue;
            Tensor *v = mk_tensor(g, T_VALUE, tensor_count(src));
            v->alias = src;
            continue;
        }
        Tensor *out = mk_tensor(g, T_VALUE, 1 + rnd(rnd(2) ? 300 : 20000));
        Dispatch *d = new_dispatch(p, n, "eltwise");
        dispatch_arg(d, out, true);
        int nin = 1 + (int)rnd(3);
        for (int k = 0; k < nin; k++)
            dispatch_arg(d, g->tensors.data[rnd((uint32_t)have)], false);
    }
    for (int i = 0; i < g->tensors.len; i++)
        if (rnd(8) == 0 && ((Tensor *)g->tensors.data[i])->kind == T_VALUE) {
            ((Tensor *)g->tensors.data[i])->is_output = true;
            vec_push(&g->outputs, g->tensors.data[i]);
        }
    plan_memory(g, p); /* calls check_plan itself and aborts on overlap */
    if (check_plan(g, p))
        return "live tensors overlap";
    if (p->arena_bytes < p->peak_bytes)
        return format("arena %llu below the lower bound %llu",
                      (unsigned long long)p->arena_bytes,
                      (unsigned long long)p->peak_bytes);
    for (int i = 0; i < g->tensors.len; i++) {
        Tensor *t = g->tensors.data[i];
        if (t->kind == T_WEIGHT && t->offset == UINT64_MAX)
            continue; /* unused: not placed */
        if (!t->alias && t->offset % align)
            return format("%s at %llu is not %llu-aligned", t->name,
                          (unsigned long long)t->offset, (unsigned long long)align);
    }
    for (int i = 0; i < g->outputs.len; i++) {
        Tensor *r = tensor_root(g->outputs.data[i]);
        if (r->kind != T_WEIGHT && (r->first != -1 || r->last != p->ndispatches))
            return format("output %s is not pinned", r->name);
    }
    return NULL;
}

static void test_planner(void) {
    double worst = 1.0;
    for (int c = 0; c < 200; c++) {
        uint64_t align = c % 3 == 0 ? 16 : 256;
        const char *why = planner_case(5 + (int)rnd(60), align);
        if (why) {
            report(format("planner random graph %d", c), why);
            return;
        }
    }
    (void)worst;
    report("planner: 200 random graphs, no overlap, arena >= peak, aligned", NULL);
}

/* Four tensors at fixed offsets; dispatches with chosen reads and writes. */
static void test_schedule(void) {
    Graph *g = xcalloc(1, sizeof *g);
    Tensor *t[5];
    for (int i = 0; i < 4; i++) {
        t[i] = mk_tensor(g, T_VALUE, 64);
        t[i]->buffer = KILN_BUFFER_ARENA;
        t[i]->offset = (uint64_t)i * 256;
    }
    t[4] = mk_tensor(g, T_WEIGHT, 64);
    t[4]->buffer = KILN_BUFFER_WEIGHTS;
    Program *p = xcalloc(1, sizeof *p);
    Node *n = mk_node("n");
    struct {
        int write, r1, r2;
        bool barrier;
        const char *what;
    } steps[] = {
        {0, 4, -1, false, "first dispatch"},
        {1, 4, -1, false, "independent of the first"},
        {2, 0, -1, true, "read after write"},
        {3, 4, 4, false, "weights only, disjoint write"},
        {0, 4, -1, true, "write after read of t0 (and write after write)"},
        {1, 3, -1, false, "reads t3, written before the last barrier"},
        {2, 0, -1, true, "read after write of t0 by the dispatch before"},
        {3, 4, -1, false, "t3 untouched since the last barrier"},
    };
    int nsteps = (int)(sizeof steps / sizeof steps[0]);
    for (int i = 0; i < nsteps; i++) {
        Dispatch *d = new_dispatch(p, n, "eltwise");
        dispatch_arg(d, t[steps[i].write], true);
        dispatch_arg(d, t[steps[i].r1], false);
        if (steps[i].r2 >= 0)
            dispatch_arg(d, t[steps[i].r2], false);
    }
    schedule(g, p);
    for (int i = 0; i < nsteps; i++) {
        if (p->dispatches[i]->barrier != steps[i].barrier) {
            report("schedule: barriers only on conflicts",
                   format("dispatch %d (%s): barrier %d, expected %d", i,
                          steps[i].what, p->dispatches[i]->barrier, steps[i].barrier));
            return;
        }
    }
    report("schedule: barriers only on conflicts", NULL);
}

static void test_broadcast(void) {
    struct {
        int ra;
        int64_t a[4];
        int rb;
        int64_t b[4];
        bool ok;
        int r;
        int64_t out[4];
    } cases[] = {
        {2, {2, 3}, 1, {3}, true, 2, {2, 3}},
        {2, {2, 1}, 2, {1, 3}, true, 2, {2, 3}},
        {3, {4, 1, 5}, 2, {3, 1}, true, 3, {4, 3, 5}},
        {1, {0}, 2, {3, 1}, true, 2, {3, 0}},
        {0, {0}, 2, {2, 2}, true, 2, {2, 2}},
        {2, {2, 3}, 1, {4}, false, 0, {0}},
        {2, {2, 3}, 2, {3, 3}, false, 0, {0}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int r;
        int64_t out[MAX_RANK];
        bool ok = broadcast_shapes(cases[i].ra, cases[i].a, cases[i].rb, cases[i].b,
                                   &r, out);
        if (ok != cases[i].ok ||
            (ok && (r != cases[i].r ||
                    memcmp(out, cases[i].out, sizeof(int64_t) * (size_t)r)))) {
            report("broadcast: numpy rules", format("case %zu", i));
            return;
        }
    }
    report("broadcast: numpy rules", NULL);
}

static void test_derived(void) {
    Graph *g = xcalloc(1, sizeof *g);
    Loc nowhere = {NULL, 0, 0};
    int seq = declare_dim(g, "seq", 1, 64, nowhere),
        past = declare_dim(g, "past", 0, 100, nowhere);
    DimExpr s = {0, {0}}, p = {0, {0}}, k = {0, {0}}, r;
    s.c[seq] = 1;
    p.c[past] = 1;
    const char *why = NULL;
    k.c0 = 6;
    if (!derive_dim(g, DIM_MUL, &s, &k, &r) || r.c[seq] != 6 || r.c0)
        why = "seq * 6 is not 6 seq";
    else if (!derive_dim(g, DIM_MUL, &s, &p, &r) || g->ndims != 3 || r.c[2] != 1 ||
             g->dims[2].lo != 0 || g->dims[2].hi != 6400)
        why = "seq * past is not a derived dim of range 0..6400";
    else if (!derive_dim(g, DIM_MUL, &p, &s, &r) || g->ndims != 3 || r.c[2] != 1)
        why = "past * seq is not the same derived dim";
    else if (!derive_dim(g, DIM_DIV, &s, &k, &r) || g->dims[3].lo != 0 ||
             g->dims[3].hi != 10)
        why = "seq / 6 is not a derived dim of range 0..10";
    k.c0 = (int64_t)1 << 40; /* bounds: each operand, each product */
    DimExpr big = {(int64_t)1 << 41, {0}}, wide = s;
    wide.c[seq] = (int64_t)1 << 21;
    int dims = g->ndims;
    DimExpr k20 = {(int64_t)1 << 20, {0}}, k21 = {(int64_t)1 << 21, {0}};
    if (!why && (!derive_dim(g, DIM_MUL, &s, &k20, &r) || r.c[seq] != k20.c0))
        why = "seq * 2^20 is not 2^20 seq";
    else if (!why && derive_dim(g, DIM_MUL, &s, &k21, &r))
        why = "seq * 2^21 was followed";
    else if (!why && derive_dim(g, DIM_MUL, &k, &k, &r))
        why = "2^40 * 2^40 was followed";
    else if (!why && (derive_dim(g, DIM_MUL, &big, &s, &r) ||
                      derive_dim(g, DIM_MAX, &wide, &p, &r)))
        why = "an operand past the bounds was followed";
    else if (!why && g->ndims != dims)
        why = "a refused operation declared a dim";
    report("derived: dims derived from the dims, and their bounds", why);
}

static void test_splitmix(void) {
    /* First outputs for seed 0, as published with the algorithm. */
    uint64_t s = 0;
    uint64_t a = splitmix64(&s), b = splitmix64(&s), c = splitmix64(&s);
    report("splitmix64: reference outputs",
           a == 0xe220a8397b1dcdafull && b == 0x6e789e6aa1b965f4ull &&
                   c == 0x06c45d188009454full
               ? NULL
               : format("got %016llx %016llx %016llx", (unsigned long long)a,
                        (unsigned long long)b, (unsigned long long)c));
}

/* kiln__hash of data[0, n) from its segments hashed one by one and joined
 * (what the compiler does on its threads). */
static uint64_t hash_by_segments(const unsigned char *data, size_t n) {
    size_t count = (n + KILN__HASH_SEGMENT - 1) / KILN__HASH_SEGMENT;
    uint64_t *seg = xcalloc(count + 1, sizeof *seg);
    for (size_t k = 0; k < count; k++) {
        size_t from = k * KILN__HASH_SEGMENT;
        size_t len = n - from < KILN__HASH_SEGMENT ? n - from : KILN__HASH_SEGMENT;
        kiln__hash h;
        kiln__hash_init(&h);
        kiln__hash_update(&h, data + from, len);
        seg[k] = kiln__hash_segment(&h);
    }
    uint64_t v = kiln__hash_join(seg, count, n);
    xfree(seg);
    return v;
}

static void test_hash(void) {
    size_t big = 3 * KILN__HASH_SEGMENT + 77;
    unsigned char *data = xcalloc(big + 1, 1);
    for (size_t i = 0; i < big; i++)
        data[i] = (unsigned char)(splitmix64(&rng_state) >> 56);
    const size_t sizes[] = {0, 1, 31, 32, 33, 1000, KILN__HASH_SEGMENT - 1, KILN__HASH_SEGMENT,
                            KILN__HASH_SEGMENT + 1, 2 * KILN__HASH_SEGMENT, big};
    const char *why = NULL;
    for (size_t c = 0; c < sizeof sizes / sizeof sizes[0] && !why; c++) {
        size_t n = sizes[c];
        uint64_t whole = kiln__hash64(data, n);
        kiln__hash h;
        kiln__hash_init(&h);
        for (size_t at = 0, step; at < n; at += step) { /* random pieces */
            step = 1 + rnd(c % 2 ? 97 : 300000);
            step = step < n - at ? step : n - at;
            kiln__hash_update(&h, data + at, step);
        }
        if (kiln__hash_final(&h) != whole)
            why = format("%zu bytes: split updates differ", n);
        else if (hash_by_segments(data, n) != whole)
            why = format("%zu bytes: joined segments differ", n);
        else if (n && kiln__hash64(data, n - 1) == whole)
            why = format("%zu bytes: one byte fewer, same hash", n);
        for (size_t bit = 0; n && bit < 8 && !why; bit++) {
            size_t at = rnd((uint32_t)n);
            data[at] ^= (unsigned char)(1u << bit);
            if (kiln__hash64(data, n) == whole)
                why = format("%zu bytes: flipping bit %zu of byte %zu kept the hash", n, bit, at);
            data[at] ^= (unsigned char)(1u << bit);
        }
    }
    if (!why) { /* two segments swapped */
        uint64_t before = kiln__hash64(data, 2 * KILN__HASH_SEGMENT);
        unsigned char *swapped = xcalloc(2 * KILN__HASH_SEGMENT, 1);
        memcpy(swapped, data + KILN__HASH_SEGMENT, KILN__HASH_SEGMENT);
        memcpy(swapped + KILN__HASH_SEGMENT, data, KILN__HASH_SEGMENT);
        if (kiln__hash64(swapped, 2 * KILN__HASH_SEGMENT) == before)
            why = "swapping two segments kept the hash";
        xfree(swapped);
    }
    xfree(data);
    report("hash: splits, segments and damage", why);
}

/* ---- hostile input ---- */

enum { FRONT_OK, FRONT_ERROR };

/* Runs the front end over bytes in memory; everything it allocated is
 * freed after. */
static int front_end(const char *path, const char *data, size_t size, bool onnx) {
    jmp_buf trap;
    volatile int result = FRONT_ERROR;
    char *text = xcalloc(1, size + 1);
    memcpy(text, data, size);
    kiln_error_trap = &trap;
    kiln_quiet = true;
    if (setjmp(trap) == 0) {
        Graph *g = onnx ? load_onnx_bytes(path, text, size, 0, NULL, 0, NULL)
                        : load_yaml_text(path, text, size);
        load_weights(g);
        infer_shapes(g);
        result = FRONT_OK;
    }
    kiln_error_trap = NULL;
    kiln_quiet = false;
    kiln_free_all();
    return result;
}

/* Every prefix of the file, and with `flips` every byte inverted: no
 * crash; the whole file loads. */
static void hostile_file(const char *path, bool onnx, bool flips) {
    /* Plain malloc and a stack buffer: front_end frees the compiler heap. */
    char name[512];
    snprintf(name, sizeof name, "hostile: every truncation%s of %s",
             flips ? " and byte flip" : "", path);
    size_t size;
    char *text = read_file(path, &size);
    char *data = text ? malloc(size + 1) : NULL;
    if (!data) {
        report(name, "cannot read the file");
        return;
    }
    memcpy(data, text, size + 1);
    for (size_t n = 0; n < size; n++)
        front_end(path, data, n, onnx);
    for (size_t i = 0; flips && i < size; i++) {
        data[i] = (char)~data[i];
        front_end(path, data, size, onnx);
        data[i] = (char)~data[i];
    }
    int whole = front_end(path, data, size, onnx);
    free(data);
    report(name, whole == FRONT_OK ? NULL : "the whole file does not load");
}

static const char hostile_head[] = "name: h\ninputs:\n  x: {dtype: f32, shape: [2, 3]}\n";

/* A model that must be rejected with an error, not a crash or a hang. */
static void hostile_yaml(const char *what, const char *text) {
    int r = front_end("hostile.yaml", text, strlen(text), false);
    report(format("hostile: %s", what), r == FRONT_ERROR ? NULL : "accepted");
}

static void test_hostile(void) {
    hostile_file("samples/transformer.yaml", false, false);
    hostile_file("samples/cnn.yaml", false, false);
    const char *onnx_dir = "/usr/share/libonnx-testdata/data/";
    const char *models[] = {"node/test_layer_normalization_4d_axis0_expanded/model.onnx",
                            "pytorch-converted/test_Conv2d/model.onnx",
                            "pytorch-converted/test_BatchNorm2d_eval/model.onnx"};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        char path[512]; /* not the compiler heap, which front_end frees */
        snprintf(path, sizeof path, "%s%s", onnx_dir, models[i]);
        hostile_file(path, true, true);
    }

    /* 200,000 nested lists as an attribute value. */
    Str deep = {0};
    str_add(&deep, hostile_head);
    str_add(&deep, "nodes:\n  - {name: y, op: relu, inputs: [x], alpha: ");
    for (int i = 0; i < 200000; i++)
        str_add(&deep, "[");
    for (int i = 0; i < 200000; i++)
        str_add(&deep, "]");
    str_add(&deep, "}\noutputs: [y]\n");
    hostile_yaml("200,000 nested lists", deep.buf);

    /* An alias bomb: 9 levels of 9 references (9^9 leaves if expanded). */
    Str bomb = {0};
    str_add(&bomb, "a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]\n");
    for (int i = 1; i < 10; i++)
        str_addf(&bomb, "a%d: &a%d [*a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d]\n", i, i,
                 i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1);
    str_add(&bomb, hostile_head + 8);
    str_add(&bomb, "nodes:\n  - {name: y, op: transpose, inputs: [x], perm: *a9}\n"
                   "outputs: [y]\n");
    hostile_yaml("alias bomb", bomb.buf);
    hostile_yaml("a list that contains itself",
                 format("%snodes: &n [*n]\noutputs: [y]\n", hostile_head));
    hostile_yaml("a node that is its own input list",
                 format("%snodes:\n  - &n {name: y, op: relu, inputs: *n}\noutputs: [y]\n",
                        hostile_head));
    hostile_yaml("a dimension of 2^63 - 1",
                 "name: h\ninputs:\n  x: {dtype: f32, shape: [9223372036854775807]}\n"
                 "nodes:\n  - {name: y, op: relu, inputs: [x]}\noutputs: [y]\n");
    hostile_yaml("a dimension of 2^63",
                 "name: h\ninputs:\n  x: {dtype: f32, shape: [9223372036854775808]}\n"
                 "nodes:\n  - {name: y, op: relu, inputs: [x]}\noutputs: [y]\n");
    hostile_yaml("an element count over 2^64",
                 "name: h\ninputs:\n  x: {dtype: f32, shape: [4294967296, 4294967296, 2]}\n"
                 "nodes:\n  - {name: y, op: relu, inputs: [x]}\noutputs: [y]\n");
    hostile_yaml("a reshape whose product overflows",
                 format("%snodes:\n  - {name: y, op: reshape, inputs: [x], shape: "
                        "[3037000500, 3037000500, -1]}\noutputs: [y]\n", hostile_head));
    hostile_yaml("a tile whose product overflows",
                 format("%snodes:\n  - {name: y, op: tile, inputs: [x], repeats: "
                        "[4611686018427387904, 4]}\noutputs: [y]\n", hostile_head));
    hostile_yaml("a weight read from a device",
                 format("%sweights:\n  w: {dtype: f32, shape: [3], file: /dev/zero}\n"
                        "nodes:\n  - {name: y, op: add, inputs: [x, w]}\noutputs: [y]\n",
                        hostile_head));
}

/* GLSL with NV cooperative matrices of workgroup scope, BM x BK times
 * BK x BN, compiled by shaderc (NULL when it does not compile). */
static uint32_t *nv_kernel(int bm, int bk, int bn, size_t *n) {
    char *src = format(
        "#version 460\n"
        "#extension GL_NV_cooperative_matrix : require\n"
        "#extension GL_KHR_memory_scope_semantics : require\n"
        "#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require\n"
        "layout(local_size_x = 128) in;\n"
        "layout(binding = 0) buffer C { float16_t c[]; };\n"
        "shared uvec4 As[%d]; shared uvec4 Bs[%d];\n"
        "void main() {\n"
        "  As[gl_LocalInvocationID.x] = uvec4(gl_LocalInvocationID.x); Bs[0] = uvec4(1);\n"
        "  barrier();\n"
        "  fcoopmatNV<32, gl_ScopeWorkgroup, %d, %d> acc = fcoopmatNV<32, gl_ScopeWorkgroup, "
        "%d, %d>(0.0);\n"
        "  fcoopmatNV<16, gl_ScopeWorkgroup, %d, %d> fa;\n"
        "  fcoopmatNV<16, gl_ScopeWorkgroup, %d, %d> fb;\n"
        "  coopMatLoadNV(fa, As, 0, 5, false);\n"
        "  coopMatLoadNV(fb, Bs, 0, 17, true);\n"
        "  acc = coopMatMulAddNV(fa, fb, acc);\n"
        "  fcoopmatNV<16, gl_ScopeWorkgroup, %d, %d> h = fcoopmatNV<16, gl_ScopeWorkgroup, "
        "%d, %d>(acc);\n"
        "  coopMatStoreNV(h, c, 0, 4096, false);\n"
        "}\n",
        bm * 5, bk * 17, bm, bn, bm, bn, bm, bk, bk, bn, bm, bn, bm, bn);
    shaderc_compiler_t sc = shaderc_compiler_initialize();
    shaderc_compile_options_t o = shaderc_compile_options_initialize();
    shaderc_compile_options_set_target_env(o, shaderc_target_env_vulkan,
                                           shaderc_env_version_vulkan_1_2);
    shaderc_compilation_result_t r = shaderc_compile_into_spv(
        sc, src, strlen(src), shaderc_compute_shader, "t.comp", "main", o);
    uint32_t *w = NULL;
    if (shaderc_result_get_compilation_status(r) == shaderc_compilation_status_success) {
        *n = shaderc_result_get_length(r) / 4;
        w = xcalloc(*n, sizeof *w);
        memcpy(w, shaderc_result_get_bytes(r), *n * 4);
    } else {
        printf("# %s\n", shaderc_result_get_error_message(r));
    }
    shaderc_result_release(r);
    shaderc_compile_options_release(o);
    shaderc_compiler_release(sc);
    return w;
}

/* What is wrong with the KHR words w of nv_kernel(bm, bk, bn), or NULL. */
static const char *khr_wrong(const uint32_t *w, size_t n, int bm, int bk, int bn) {
    uint32_t bound = w[3];
    uint32_t *value = xcalloc(bound, sizeof *value);   /* uint constants */
    uint8_t *defined = xcalloc(bound, 1);
    int32_t *use_of = xcalloc(bound, sizeof *use_of);  /* matrix type: use + 1 */
    uint32_t *rows = xcalloc(bound, sizeof *rows), *cols = xcalloc(bound, sizeof *cols);
    uint32_t *type_of = xcalloc(bound, sizeof *type_of);
    int khr_cap = 0, khr_ext = 0, loads = 0, muladds = 0, stores = 0;
    const char *why = NULL;
    for (size_t i = 5; i < n && !why; i += w[i] >> 16) {
        uint32_t op = w[i] & 0xffffu, len = w[i] >> 16;
        const uint32_t *a = w + i + 1;
        if (op >= 5357 && op <= 5362)
            why = format("NV instruction %u left", op);
        if (op == 17 && a[0] == 5357)
            why = "NV capability left";
        khr_cap |= op == 17 && a[0] == 6022;
        khr_ext |= op == 10 && strcmp((const char *)a, "SPV_KHR_cooperative_matrix") == 0;
        if (op == 43 && len == 4) { /* OpConstant */
            if (defined[a[1]])
                why = format("id %u defined twice", a[1]);
            defined[a[1]] = 1;
            value[a[1]] = a[2];
        }
        if (op == 4456) { /* OpTypeCooperativeMatrixKHR T S R C Use */
            if (len != 7 || !defined[a[2]] || !defined[a[3]] || !defined[a[4]] ||
                !defined[a[5]] || value[a[2]] != 2)
                why = "a matrix type's operands";
            else {
                use_of[a[0]] = (int32_t)value[a[5]] + 1;
                rows[a[0]] = value[a[3]];
                cols[a[0]] = value[a[4]];
            }
        }
        if (len >= 3 && a[0] < bound && use_of[a[0]] && op != 4456)
            type_of[a[1]] = a[0]; /* a matrix value (a load, a variable's load, ...) */
        if (op == 4457) { /* OpCooperativeMatrixLoadKHR T R ptr layout stride ... */
            uint32_t want_layout = rows[a[0]] == (uint32_t)bk ? 1 : 0; /* B: column-major */
            uint32_t want_stride = rows[a[0]] == (uint32_t)bk ? 17 : 5;
            if (!defined[a[3]] || value[a[3]] != want_layout || value[a[4]] != want_stride)
                why = format("load %d: layout %u stride %u", loads, value[a[3]], value[a[4]]);
            loads++;
        }
        if (op == 4459) { /* MulAddKHR T R a b c */
            muladds++;
            uint32_t ta = type_of[a[2]], tb = type_of[a[3]];
            if (use_of[ta] != 1 || rows[ta] != (uint32_t)bm || cols[ta] != (uint32_t)bk ||
                use_of[tb] != 2 || rows[tb] != (uint32_t)bk || cols[tb] != (uint32_t)bn ||
                use_of[a[0]] != 3 || rows[a[0]] != (uint32_t)bm || cols[a[0]] != (uint32_t)bn)
                why = "the multiply-add's types: uses or shapes";
        }
        if (op == 4458) { /* StoreKHR ptr obj layout stride */
            stores++;
            if (value[a[2]] != 0 || value[a[3]] != 4096)
                why = "the store's layout or stride";
        }
    }
    if (!why && (!khr_cap || !khr_ext || loads != 2 || muladds != 1 || stores != 1))
        why = format("capability %d, extension %d, %d loads, %d multiply-adds, %d stores",
                     khr_cap, khr_ext, loads, muladds, stores);
    xfree(value);
    xfree(defined);
    xfree(use_of);
    xfree(rows);
    xfree(cols);
    xfree(type_of);
    return why;
}

static void test_spirv_khr(void) {
    size_t n, out_n;
    char *error = NULL;
    uint32_t *nv = nv_kernel(128, 32, 64, &n);
    const char *why = nv ? NULL : "the NV kernel does not compile";
    uint32_t *khr = nv ? spirv_khr_coopmat(nv, n, &out_n, &error) : NULL;
    if (!why && !khr)
        why = format("refused: %s", error);
    if (!why)
        why = khr_wrong(khr, out_n, 128, 32, 64);
    report("spirv_khr rewrite", why);
    xfree(khr);
    xfree(nv);
    /* A and B of one shape: one NV type in two uses */
    nv = nv_kernel(32, 32, 32, &n);
    error = NULL;
    khr = nv ? spirv_khr_coopmat(nv, n, &out_n, &error) : NULL;
    report("spirv_khr refuses A and B of one type",
           !nv ? "the NV kernel does not compile"
           : khr ? "rewritten"
           : strstr(error, "more than one of A, B") ? NULL
                                                    : format("refused as: %s", error));
    xfree(khr);
    xfree(nv);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress shows as it happens */
    test_broadcast();
    test_derived();
    test_splitmix();
    test_hash();
    test_schedule();
    test_planner();
    test_hostile();
    test_spirv_khr();
    printf("%d passed, %d failed\n", passes, failures);
    return failures ? 1 : 0;
}
