/*
 * lower_matmul.c: matmul, gemm and grouped_matmul: the tiled kernel
 * (matmul.comp), the column-parallel one for few rows (matvec.comp),
 * cooperative matrices for f16 (coopmat.comp), with their epilogues (bias,
 * residual, activation), weight formats and QKV splits.
 */
#include "lower.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Matmul tile sizes by the extent of M or N: (tile, per-thread). A
 * workgroup has (BM/TM) * (BN/TN) invocations: 256 on 64 x 64 tiles, 128
 * where one side is 32. Blocks of 4 x 4 per invocation from 32 up: 32-wide
 * tiles with 2 per invocation (256 invocations, scalar loads) ran at half
 * the speed on the H200 (ConvNeXt-tiny's [49, 768] x [768, 3072] inside
 * the model: 74.6 against 35.2 us on 32 x 64 tiles of 4 x 4, which also
 * take the vec4 loads; bench/experiments/tiles-in-models-h200.txt). */
static void pick_tile(int64_t extent, int64_t *tile, int64_t *per_thread) {
    if (extent >= 64) {
        *tile = 64;
        *per_thread = 4;
    } else if (extent >= 32) {
        *tile = 32;
        *per_thread = 4;
    } else {
        *tile = 16;
        *per_thread = 1;
    }
}

/* Few rows (at most MATVEC_MAX_M): matvec.comp's column-parallel kernel, or
 * matvec_k.comp's where B is K-major; else matmul.comp's tiles. */
#define MATVEC_THREADS 256 /* NCOL x KSPLIT */
#define MATVEC_PART_FLOATS 3072 /* shared memory for partial sums: 12 KiB */

typedef struct MatvecShape {
    int64_t ncol, ksplit, vec, avec, mc;
} MatvecShape;

/* The environment variables that override the matmul kernels' tiles and
 * splits, or keep convolutions off them (lower_conv.c), for tuning: the
 * generated C names those that were set (emit_c.c). */
const char *const tuning_variables[] = {
    "KILN_MATMUL_TILE", "KILN_MATMUL_SPLITK", "KILN_COOPMAT_TILE", "KILN_COOPMAT_SPLITK",
    "KILN_COOPMAT_PIPE", "KILN_COOPMAT_CEILING", "KILN_MATVEC_NCOL", "KILN_MATVEC_K",
    "KILN_MATVEC_K_M", "KILN_DIRECT_CONV", "KILN_DWCONV", "KILN_FLASH", "KILN_FLASH_CM",
    "KILN_ATTN_SPLITS", "KILN_ATTN_VPRE", "KILN_SPLIT_LAST", "KILN_F16_PAIRS",
    "KILN_ROW_SPLIT", NULL};

/* A product's rows at the run's extent, in GLSL (the constant M when they
 * are fixed), and groups[1] of d following them, per_group rows a group. */
static char *rows_glsl(const MatmulShape *s) {
    return s->dyn ? dim_expr_glsl(s->dyn, s->M / s->dyn_most) : format("%lld", (long long)s->M);
}

static void rows_groups(Dispatch *d, const MatmulShape *s, int64_t per_group) {
    if (s->dyn)
        dyn_groups_along(d, 1, s->dyn, s->M / s->dyn_most, per_group);
}

/* Whether s's extent follows the dims: its rows, or a convolution's images
 * (its columns). Its tiles are looped over, not one a workgroup; it is not
 * split along K but for a convolution's images and a product's few-rows
 * variant (split_over_range). */
static bool follows_dims(const MatmulShape *s) { return s->dyn || s->conv.dyn_images; }

/* A convolution over a dynamic batch of images (its columns, the images'
 * positions side by side): the run's columns N_RUN, in GLSL, and groups[0]
 * of d following them, per_group columns a group. */
static void cols_groups(Dispatch *d, const MatmulShape *s, int64_t per_group) {
    const DimExpr *e = s->conv.dyn_images;
    if (!e)
        return;
    int64_t per = s->conv.images ? s->conv.positions : s->N;
    define_str(d, "N_RUN", dim_expr_glsl(e, per));
    dyn_groups_along(d, 0, e, per, per_group);
}

/* s's rows follow axis of A: its run extent, at most its size. */
static void follow_rows(MatmulShape *s, const Tensor *a, int axis) {
    s->dyn = &a->ext[axis];
    s->dyn_most = a->shape[axis];
}

/* matvec.comp's layout for s: vec4 columns when B is f32 with 16-byte
 * aligned rows, vec4 rows of A likewise. Column lanes per workgroup (4 to
 * 32): as few as leave 256 workgroups over the columns and batches (128
 * from 9 rows up, where each workgroup's reads of A cost more), so that a
 * large GPU has a workgroup or two per multiprocessor, each reading B with
 * at least 64 contiguous bytes a row. Splits of K fill the rest of 256
 * invocations, as many as K has steps. Measured on an H200 (bench/).
 * KILN_MATVEC_NCOL (a power of two from 1 to 256) overrides the lanes, for
 * tuning. */
static MatvecShape matvec_shape(const Node *n, const MatmulShape *s, int64_t rows) {
    MatvecShape v = {0};
    bool b_vec4 = n->wformat == WF_F32 && s->ops[2].t->dtype == KILN_DTYPE_F32 &&
                  s->b_sn == 1 && s->N % 4 == 0 && s->b_sk % 4 == 0 &&
                  all_multiples(s->brank, s->ops[2].strides, 4);
    v.vec = b_vec4 ? 4 : 1;
    v.avec = s->ops[1].t->dtype == KILN_DTYPE_F32 && s->a_sk == 1 && s->K % 4 == 0 &&
             s->a_sm % 4 == 0 && all_multiples(s->brank, s->ops[1].strides, 4);
    int64_t want_groups = rows > 8 ? 128 : 256;
    v.ncol = 4;
    while (v.ncol < 32 && groups_for(s->N, v.ncol * 2 * v.vec) * s->batch >= want_groups)
        v.ncol *= 2;
    const char *tune = getenv("KILN_MATVEC_NCOL");
    if (tune) {
        long t = strtol(tune, NULL, 10);
        if (t >= 1 && t <= MATVEC_THREADS && (t & (t - 1)) == 0)
            v.ncol = t;
    }
    int64_t steps = s->K / (v.avec ? 4 : 1);
    v.ksplit = MATVEC_THREADS / v.ncol;
    while (v.ksplit > 1 && v.ksplit > steps)
        v.ksplit /= 2;
    v.mc = MATVEC_PART_FLOATS / (v.ksplit * v.ncol * v.vec);
    if (v.mc > rows)
        v.mc = rows;
    return v;
}

/* The defines of a product that every matmul kernel shares but M: N, K,
 * the operands' strides and the batches. */
static void define_product(Dispatch *d, const MatmulShape *s) {
    define_int(d, "N", s->N);
    if (s->dyn_k)
        define_str(d, "K", format("uint%s", dim_expr_glsl(s->dyn_k, 1)));
    else
        define_int(d, "K", s->K);
    define_int(d, "A_SM", s->a_sm);
    define_int(d, "A_SK", s->a_sk);
    define_int(d, "B_SK", s->b_sk);
    define_int(d, "B_SN", s->b_sn);
    define_int(d, "BATCH", s->batch);
    if (s->dyn_batch)
        define_str(d, "BATCH_RUN", dim_expr_glsl(s->dyn_batch, s->batch_per));
    define_int(d, "BRANK", s->brank);
    define_list(d, "BSHAPE", s->brank, s->bshape);
    define_list(d, "C_BSTRIDES", s->brank, s->ops[0].strides);
    define_list(d, "A_BSTRIDES", s->brank, s->ops[1].strides);
    define_list(d, "B_BSTRIDES", s->brank, s->ops[2].strides);
}

/* A convolution's defines (product.glsl): its im2col matrix (CONV) and
 * images (CIMG; C_IMG where the kernel writes C, not a split's partial
 * products). */
static void define_conv(Dispatch *d, const MatmulShape *s, bool partial) {
    if (s->conv.in[0]) {
        define_int(d, "CONV", 1);
        define_int(d, "CIH", s->conv.in[0]);
        define_int(d, "CIW", s->conv.in[1]);
        define_int(d, "CKH", s->conv.k[0]);
        define_int(d, "CKW", s->conv.k[1]);
        define_int(d, "CSH", s->conv.stride[0]);
        define_int(d, "CSW", s->conv.stride[1]);
        define_int(d, "CPH", s->conv.pad[0]);
        define_int(d, "CPW", s->conv.pad[1]);
        define_int(d, "CDH", s->conv.dil[0]);
        define_int(d, "CDW", s->conv.dil[1]);
        define_int(d, "COW", s->conv.out_w);
        if (s->conv.klast) {
            define_int(d, "CONV_KLAST", 1);
            define_int(d, "CIC", s->conv.channels);
        }
    }
    if (s->conv.images) {
        define_int(d, "CIMG", s->conv.positions);
        define_int(d, "CIN_IMG", s->conv.in_img);
        if (!partial) /* else splitk.comp writes C */
            define_int(d, "C_IMG", s->conv.positions);
    }
}

/* The residual's type (RES_F16) and the storage features it needs. */
static void define_res_type(Program *p, Dispatch *d, bool *need, const MatmulShape *s) {
    if (!s->res)
        return;
    need_dtype(p, need, s->res->dtype);
    define_int(d, "RES_F16", s->res->dtype == KILN_DTYPE_F16);
}

/* The defines of a matmul kernel's operand types: f16 A and C through
 * 16-bit storage (B's f16 is weights.glsl's format, packed halves). */
static void define_operand_types(Program *p, Dispatch *d, const MatmulShape *s) {
    bool need[3] = {false, false, false};
    need_dtype(p, need, s->ops[0].t->dtype);
    need_dtype(p, need, s->ops[1].t->dtype);
    define_res_type(p, d, need, s);
    define_needs(d, need);
    define_int(d, "A_F16", s->ops[1].t->dtype == KILN_DTYPE_F16);
    define_int(d, "C_F16", s->ops[0].t->dtype == KILN_DTYPE_F16);
}

/* The format matvec_k.comp reads n's B in (weights.glsl's W_FORMAT). */
static int b_format(const Node *n, const MatmulShape *s) {
    return s->ops[2].t->dtype == KILN_DTYPE_F16 ? WF_F16 : n->wformat;
}

/* Whether matvec_k.comp can compute s: B K-major (encoded so by quantize.c,
 * its strides set so by matmul_dispatch, or given with B_SK 1) in whole
 * 16-byte chunks along K, A contiguous along K (f32 in vec4s or f16). */
static bool kmajor_shape(const Node *n, MatmulShape *s) {
    const Tensor *a = s->ops[1].t, *b = s->ops[2].t;
    int64_t kv = weight_chunk(b_format(n, s));
    bool a_ok = s->a_sk == 1 && (a->dtype == KILN_DTYPE_F16 ||
                                 (a->dtype == KILN_DTYPE_F32 && s->a_sm % 4 == 0 &&
                                  all_multiples(s->brank, s->ops[1].strides, 4)));
    if (n->wkmajor) {
        if (!a_ok || s->K % kv || s->conv.in[0])
            internal_error("node '%s': a K-major weight where matvec_k.comp does not apply",
                           n->name);
        return true;
    }
    return a_ok && !matvec_k_off() && !n->wq && !s->conv.in[0] && s->b_sk == 1 &&
           s->K % kv == 0 && s->b_sn % kv == 0 && all_multiples(s->brank, s->ops[2].strides, kv) &&
           (b->dtype == KILN_DTYPE_F32 || b->dtype == KILN_DTYPE_F16);
}

/* matvec_k.comp for s (kmajor_shape holds), rows up to mrows: WG
 * invocations along K a workgroup, CN columns. WG: 256, fewer where K has
 * fewer than WG / 2 chunks (at least 32); for rows that follow the dims
 * (M is their most, MATVEC_K_DYN_M: more partial sums a workgroup) halved
 * down to 64 while K has fewer than 4 * WG chunks (2 to 5 an invocation);
 * CN: 4, fewer where that leaves under 512 workgroups; their M x CN x WG
 * partial sums at most 16 KiB of shared memory. Measured on an H200 at
 * [1, 4096] x [4096, 4096] over WG 32 to 1024 and CN 1 to 8 (us, f32 / f16
 * / int8 / int4): 256 x 4 22.4 / 11.9 / 14.1 / 16.9, 128 x 4 23.6 / 12.4 /
 * 18.5 / 22.4, 512 x 4 23.1 / 14.0 / 14.7 / 20.1, 64 x 1 23.7 / 15.7 / 17.3 /
 * 24.6, 32 x 8 twice those; and on a decoder's dynamic products of K 2048
 * and 5632 (bench/experiments/matvec_k_dyn-h200.txt): 64 or 128, not 256,
 * at 2048 x 11264 22.3 against 31.2 us (f16), 17.3 against 29.1 (int8).
 * KILN_MATVEC_K=WG,CN[,UNROLL,TEAMS,A_SHARED] overrides them, for tuning
 * (0: matvec_k off). */
static Dispatch *matvec_k_kernel(Program *p, Node *n, const MatmulShape *s, int64_t mrows) {
    int fmt = b_format(n, s);
    int64_t chunks = s->K / weight_chunk(fmt), wg = 256, cn = 4;
    while (s->dyn ? wg > 64 && chunks < 4 * wg : wg > 32 && chunks < wg / 2)
        wg /= 2;
    /* a QKV split's product: CN 2 at least, a workgroup's columns pairs
     * for glu_after_product (a gated MLP's gate and up) and
     * rope_after_product (a head's columns c and c + D / 2) */
    int64_t least = n->nsiblings && !n->split_out && s->N % 2 == 0 ? 2 : 1;
    while (cn > least && groups_for(s->N, cn) * s->batch < 512)
        cn /= 2;
    /* Fixed-shape int4 B where A's rows fit in shared memory (as f32, a
     * chunk's run of A padded by a vec4 where it is two or more: stage_a
     * in matvec_k.comp; at most 32 KiB): 256 invocations in 8 teams of
     * 32, A in shared memory, the teams halved (each larger) down to 2
     * while they leave fewer than 256 workgroups. Measured on an H200
     * (bench/experiments/matvec_k_teams-h200.txt, us at one row): 4096 x
     * 16384 38.6 -> 27.4 (8 teams), 4096 x 4096 17.2 -> 12.7 (4); not int8
     * (33.5 -> 33.0, 13.9 -> 14.7) nor a decoder's dynamic products (f16
     * and int4 at K 2048 and 5632: 5 to 75% slower). */
    int64_t seg = weight_chunk(fmt) / 4;
    bool a_fits = mrows * s->K / 4 / seg * (seg + (seg >= 2)) * 16 <= 32768;
    long teams = 1, ashared = 0;
    if (!s->dyn && (fmt == WF_INT4 || fmt == WF_INT4_ASYM) && a_fits) {
        wg = 256, teams = 8, ashared = 1;
        while (teams > 2 && groups_for(s->N, cn * teams) * s->batch < 256)
            teams /= 2;
    }
    /* KILN_MATVEC_K=WG,CN[,UNROLL[,TEAMS[,A_SHARED]]], for tuning
     * (bench/experiments) */
    const char *tune = getenv("KILN_MATVEC_K");
    long t[5] = {0, 0, 1, 1, 0}, unroll = 1;
    int nt = tune ? sscanf(tune, "%ld,%ld,%ld,%ld,%ld", &t[0], &t[1], &t[2], &t[3], &t[4]) : 0;
    if (nt >= 2 && t[0] >= 1 && t[0] <= 1024 && (t[0] & (t[0] - 1)) == 0 && t[1] >= 1 &&
        t[1] <= 16 && t[2] >= 1 && t[2] <= 8 && t[3] >= 1 && t[3] <= t[0] &&
        (t[3] & (t[3] - 1)) == 0)
        wg = t[0], cn = t[1], unroll = t[2], teams = t[3], ashared = t[4] != 0;
    while (mrows * cn * wg > 4096 && wg > teams)
        wg /= 2;
    while (mrows * cn * wg > 4096)
        cn /= 2;
    if (!a_fits)
        ashared = 0;
    /* --activations int8: A's rows as bytes in shared memory, a scale per
     * 32 k (and for the asymmetric formats a sum per 16), in teams (each
     * workgroup's copy of A then serves more columns: 256 invocations in 8
     * teams, halved down to 2 while they leave fewer than 256 workgroups),
     * beside the partial sums: at most 32 KiB (lavapipe's limit), else A
     * as it is. fp8 codes times f16 A (--precision f16) on devices with f16
     * arithmetic: A's rows as f16 pairs in shared memory (A_H2, 52 bytes
     * a chunk of 16 k), within the same 32 KiB, in teams of 16 (16 halved
     * as above: its staging costs more than A_Q8's, and more columns
     * share it). Measured on an H200 at one row (us, the second of two
     * products; bench/experiments/act_int8-h200.txt section 8): e4m3 4096
     * x 65536 93.4 -> 88.9 (8 teams) -> 84.9 (16), 4096 x 16384 28.1 ->
     * 26.0 -> 24.7; e5m2 (8 teams) 95.8 -> 83.7 and 28.9 -> 24.5.
     * KILN_F16_PAIRS=0 turns it off, as F16_PAIRS below */
    const char *pairs_env = getenv("KILN_F16_PAIRS");
    bool pairs_off = pairs_env && strcmp(pairs_env, "0") == 0;
    bool a_vec = s->a_sm % 4 == 0 && all_multiples(s->brank, s->ops[1].strides, 4);
    bool a_f16 = s->ops[1].t->dtype == KILN_DTYPE_F16;
    bool asym = fmt == WF_INT8_ASYM || fmt == WF_INT4_ASYM;
    bool q8 = n->act_int8 && fmt >= WF_INT8 && fmt <= WF_INT4_ASYM && s->K % 32 == 0;
    bool h2 = !q8 && (fmt == WF_FP8_E4M3 || fmt == WF_FP8_E5M2) && a_f16 && a_vec && !pairs_off;
    int64_t qwg = wg, qteams = teams;
    if ((q8 || h2) && !tune) {
        qwg = 256, qteams = h2 ? 16 : 8;
        while (qteams > 2 && groups_for(s->N, cn * qteams) * s->batch < 256)
            qteams /= 2;
        while (mrows * cn * qwg > 4096 && qwg > qteams)
            qwg /= 2;
    }
    q8 = q8 && mrows * s->K + mrows * s->K / 8 + (asym ? mrows * s->K / 4 : 0) +
                       mrows * cn * qwg * 4 <= 32768;
    h2 = h2 && mrows * (s->K / 16) * 52 + mrows * cn * qwg * 4 <= 32768;
    if (q8 || h2)
        wg = qwg, teams = qteams, ashared = 0;
    Dispatch *d = new_dispatch(p, n, "matvec_k");
    d->local_size = (uint32_t)wg;
    define_int(d, "M", mrows);
    define_str(d, "MROWS", rows_glsl(s));
    define_product(d, s);
    define_operand_types(p, d, s);
    define_int(d, "WG", wg);
    define_int(d, "CN", cn);
    /* A four elements a load (A's rows and batches in whole vectors) */
    define_int(d, "A_VEC", a_vec);
    /* 8- and 4-bit codes times f16 A (--precision f16) in f16 pairs on
     * devices with f16 arithmetic (the KILN_SUBGROUP build, which then
     * needs it too): measured on an H200 at one row of a decoder's
     * products (bench/experiments/matvec_k_f16-h200.txt), int4 2048 x
     * 11264 11.8 -> 10.3 us, 5632 x 2048 8.7 -> 7.6, 2048 x 32000 24.9 ->
     * 20.7; KILN_F16_PAIRS=0 turns it off, for comparison */
    if (fmt >= WF_INT8 && fmt <= WF_INT4_ASYM && a_f16 && a_vec && !ashared && !q8 &&
        !pairs_off) {
        define_int(d, "F16_PAIRS", 1);
        d->alt_needs = KILN_FEATURE_FLOAT16;
    }
    if (h2) {
        define_int(d, "A_H2", 1);
        d->alt_needs = KILN_FEATURE_FLOAT16;
    }
    if (unroll > 1)
        define_int(d, "UNROLL", unroll);
    if (teams > 1)
        define_int(d, "TEAMS", teams);
    if (ashared)
        define_int(d, "A_SHARED", 1);
    if (q8) { /* OpSDot in the subgroup build */
        define_int(d, "A_Q8", 1);
        d->alt_needs |= KILN_FEATURE_INTDOT;
    }
    define_int(d, "W_FORMAT", fmt);
    if (fmt >= WF_INT8) {
        define_int(d, "QBLOCK", QUANT_BLOCK);
        define_int(d, "NBLK", (s->K + QUANT_BLOCK - 1) / QUANT_BLOCK);
    }
    dispatch_arg(d, s->ops[0].t, true);
    dispatch_arg(d, s->ops[1].t, false);
    dispatch_arg(d, n->wq ? n->wq : s->ops[2].t, false);
    d->flops = 2ull * (uint64_t)(mrows * s->N) * (uint64_t)s->K * (uint64_t)s->batch;
    d->groups[0] = groups_for(s->N, cn * teams);
    d->groups[1] = 1;
    d->groups[2] = groups_for(s->batch, 1);
    return d;
}

static void bind_split_last(Program *p, Dispatch *d, Tensor *partial);
static Dispatch *splitk_sum(Program *p, Node *n, const MatmulShape *s, Tensor *partial,
                            int64_t splits);

/* A product split along K whose chunks' sum its caller makes (the
 * few-rows variants, few_rows_split): the partial products' scratch (NULL
 * for the kernel to make one) and the chunks. */
typedef struct SplitParts {
    Tensor *partial;
    int64_t splits;
} SplitParts;

/* Whether a product split along K has each tile's last workgroup add the
 * chunks up (split_last: no second dispatch, no barrier before it), or
 * splitk.comp after it: splitk.comp, unless KILN_SPLIT_LAST=1 asks for the
 * last workgroups (products but convolutions; for comparison). Measured on
 * an H200 (bench/MODELS.md, 2026-11-27, host to host, in one run): the last
 * workgroups' sums made GPT-2 f16 0.86 -> 0.97 ms and f32 1.65 -> 1.80,
 * BERT-base f16 0.87 -> 1.00 and f32 1.65 -> 1.86, for 48 dispatches and
 * barriers fewer; in ResNet-50 at f16 (convolutions split 8 to 32 ways)
 * 0.75 -> 0.94 ms. */
static bool split_in_last(const Node *n) {
    const char *v = getenv("KILN_SPLIT_LAST");
    return n->op != OP_CONV && v && strcmp(v, "1") == 0;
}

#define COOPMAT_GROUPS 264 /* two workgroups per multiprocessor of an H200 */

/* A convolution over a dynamic batch of images splits K for its fewest
 * images; its partial products, [splits, M, N] f32 at the most images,
 * stay within SPLIT_SCRATCH bytes (a split of ResNet-50's third stage for
 * one image would otherwise take 200 MiB at 32). The most chunks that
 * allows, at least 1. */
#define SPLIT_SCRATCH (64ll << 20)
static int64_t split_scratch_cap(const MatmulShape *s) {
    int64_t one = s->M * s->N * 4;
    return one >= SPLIT_SCRATCH ? 1 : SPLIT_SCRATCH / one;
}

/* coopmat.comp's shared memory: ns stages of the A tile (bm rows of bk
 * halves) and the B tile (bn columns or bk rows, padded by a vector), and
 * a 16 x 16 f32 staging area a subgroup. */
static int64_t coopmat_shared_bytes(int64_t bm, int64_t bn, int64_t bk, int64_t subgroups,
                                    int64_t ns, bool b_cols) {
    int64_t a = bm * (bk / 8 + 1), b = b_cols ? bn * (bk / 8 + 1) : bk * (bn / 8 + 1);
    return 16 * ns * (a + b) + 1024 * subgroups;
}

/* s at `units` of what follows the dims: a convolution's images (N their
 * positions side by side), else its rows. */
static MatmulShape shape_at(const MatmulShape *s, int64_t units) {
    MatmulShape at = *s;
    if (s->conv.dyn_images)
        at.N = s->conv.positions * units;
    else
        at.M = units;
    return at;
}

/* Whether B is K-major as given: each column's K contiguous (gemm's
 * trans_b, a transposed operand), not a convolution's input. */
static bool b_kmajor(const Node *n, const MatmulShape *s) {
    return n->op != OP_CONV && s->b_sk == 1 && s->b_sn != 1;
}

/* Whether coopmat.comp applies to s (coopmat_kernel says when). Not to a
 * batch of products of at most 64 x 64 each (windowed attention's [192, 49,
 * 32] x [192, 32, 49]: 57 us on an H200's matrix units, a workgroup and a
 * gathered B a product, against 9 us for the tiled kernel in f32,
 * bench/OPS.md): a tile of one fragment row per subgroup has nothing to
 * pipeline. */
static bool coopmat_takes(const Node *n, const MatmulShape *s) {
    /* a decoder's weight stored f16 K-major (quantize.c): B is that copy */
    bool f16_kmajor = n->wkmajor && n->wq && n->wformat == WF_F16;
    const Tensor *a = s->ops[1].t, *b = f16_kmajor ? n->wq : s->ops[2].t;
    bool conv = n->op == OP_CONV;
    bool small = s->batch > 1 && s->M <= 64 && s->N <= 64 && !conv;
    return a->dtype == KILN_DTYPE_F16 && (!n->wq || f16_kmajor) && !s->dyn_k && !small &&
           s->M > MATVEC_MAX_M && s->a_sk == 1 && (b->dtype == KILN_DTYPE_F16 || conv) &&
           (s->b_sn == 1 || conv || f16_kmajor || b_kmajor(n, s));
}

/* Whether n's product writes C through a fused epilogue (product.glsl's
 * store_c): a bias, an activation, a QKV split or gemm's alpha and beta. */
static bool fused_epilogue(const Node *n) {
    return n->epi_bias || n->epi_act || n->nsiblings || n->split_out || n->op == OP_GEMM;
}

/* KILN_COOPMAT_CEILING, for benchmarks only: the cooperative-matrix
 * kernels' K steps without part of their work (coopmat.comp's and
 * coopmat_wg.comp's CEILING), C not the product; said once on stderr. 1:
 * multiply-adds alone, 2: with the matrices' loads from shared memory, 3:
 * the tiles' traffic alone, without the matrices (coopmat_wg.comp's only).
 * The mode for a kernel that has modes 1 to most; 0 where it is unset, out
 * of range or past the kernel's modes. */
static int coopmat_ceiling(int most) {
    const char *tune_ceiling = getenv("KILN_COOPMAT_CEILING");
    int ceiling = tune_ceiling ? atoi(tune_ceiling) : 0;
    if (ceiling < 1 || ceiling > most)
        return 0;
    static bool ceiling_told;
    if (!ceiling_told) {
        fprintf(stderr, "kiln: KILN_COOPMAT_CEILING=%d: the cooperative-matrix kernels do "
                        "not compute their products (a benchmark of the matrix units only)\n",
                ceiling);
        ceiling_told = true;
    }
    return ceiling;
}

static Dispatch *coopmat_parts(Program *p, Node *n, MatmulShape *s, SplitParts *parts);

/* coopmat.comp for s, when it applies: an f16 A (its rows contiguous), B
 * f16 as given (not re-encoded; its rows contiguous along N, or its
 * columns along K: gemm's trans_b, B_GATHER and, in whole vectors, B_KVEC),
 * f16 stored K-major for a decoder (n->wkmajor, B_KVEC) or a convolution's
 * input (f16 or f32), more rows than matvec takes; rows that follow the dims (one
 * batch; not split along K) take their tiles' workgroups from the run's
 * rows. Operands in whole 16-byte-aligned vectors of eight halves (K, N
 * and every row and batch stride multiples of 8; a 1 x 1 convolution's
 * images of a multiple of 8 positions) load as vectors; others, and every
 * convolution's windows, are gathered element by element (A_GATHER,
 * B_GATHER). The dispatch needs KILN_FEATURE_COOPMAT; NULL when it does
 * not apply. Tiles (measured on an H200, bench/): 128 x 256 of 8 subgroups
 * (64 x 64 each) when they leave 128 workgroups, else 128 x 128 of 4 when
 * those leave 64 (COOPMAT_GROUPS where K has 256 or fewer: 8 steps or fewer
 * leave a large tile little to pipeline; H200,
 * bench/experiments/coopmat-tiles-h200.txt: ConvNeXt-tiny's [3136, 96] x
 * [96, 384] 39.5 -> 19.5 us, ResNet-50's stem 51.5 -> 34.1 on 64 x 64), else
 * 64 x 64 of 4. A product of one batch whose tiles leave fewer than
 * COOPMAT_GROUPS workgroups splits K into chunks of at least 4 steps until
 * they do (BERT-base's [128, 3072] x [3072, 768]: 24 tiles of 64 x 64, 11
 * chunks), coopmat.comp writing the chunks' partial products and each
 * tile's last workgroup (split_in_last) or splitk.comp adding them up with
 * the epilogue (not a product on 128 x 256 tiles, which fill the GPU);
 * KILN_COOPMAT_SPLITK=S sets the chunks, for tuning. Returns the dispatch
 * that writes C. */
static Dispatch *coopmat_kernel(Program *p, Node *n, MatmulShape *s) {
    return coopmat_parts(p, n, s, NULL);
}

/* coopmat_kernel; where parts is given and the product splits along K, the
 * partial products go to parts->partial (made if NULL), the chunks to
 * parts->splits, and the kernel's dispatch is returned: its caller adds the
 * chunks up. */
static Dispatch *coopmat_parts(Program *p, Node *n, MatmulShape *s, SplitParts *parts) {
    if (!coopmat_takes(n, s))
        return NULL;
    bool f16_kmajor = n->wkmajor && n->wq && n->wformat == WF_F16;
    const Tensor *c = s->ops[0].t, *b = f16_kmajor ? n->wq : s->ops[2].t;
    bool conv = n->op == OP_CONV;
    bool kvec = (f16_kmajor || b_kmajor(n, s)) && s->K % 8 == 0 && s->b_sn % 8 == 0 &&
                all_multiples(s->brank, s->ops[2].strides, 8);
    bool a_vec = s->a_sm % 8 == 0 && s->K % 8 == 0 &&
                 all_multiples(s->brank, s->ops[1].strides, 8);
    bool b_vec = !s->conv.in[0] && b->dtype == KILN_DTYPE_F16 && s->b_sn == 1 &&
                 s->b_sk % 8 == 0 && s->N % 8 == 0 &&
                 all_multiples(s->brank, s->ops[2].strides, 8) &&
                 (!s->conv.images || (s->conv.positions % 8 == 0 && s->conv.in_img % 8 == 0));
    /* C's rows in whole vectors of 8 (fragments stored straight, or eight
     * columns a lane where an image's positions are too) */
    bool c_rows8 = s->N % 8 == 0 && all_multiples(s->brank, s->ops[0].strides, 8);
    int64_t bm = 128, bn = 256, wm = 2, wn = 4, bk = 32;
    if (groups_for(s->M, 128) * groups_for(s->N, 256) * s->batch < 128) {
        bn = 128;
        wn = 2;
        if (groups_for(s->M, 128) * groups_for(s->N, 128) * s->batch <
            (s->K > 256 ? 64 : COOPMAT_GROUPS))
            bm = bn = 64;
    }
    /* Convolutions over several images whose input loads as vectors or
     * eight channels at a kernel offset (the 3 x 3 ones), and any of 64
     * output channels or fewer: 64 x 256 tiles of 8 subgroups (32 x 64
     * each) where they leave 128 workgroups. Inside ResNet-50 at batch 32
     * on an H100 (bench/experiments/conv-tiles-b32.txt): 3 x 3 of 64 to 256
     * channels 10-20% faster (175 -> 142 us), 1 x 1 4-18%, the stem 481 ->
     * 431; products 8.44 -> 7.98 ms. Not where each tile gathers the
     * input element by element (strided 1 x 1, or images of positions
     * not in eights: 104 -> 147 us, 326 -> 484). */
    if (conv && s->conv.images > 1 && (b_vec || s->conv.klast || s->M <= 64) &&
        groups_for(s->M, 64) * groups_for(s->N, 256) >= 128) {
        bm = 64, bn = 256, wm = 2, wn = 4;
    }
    /* rows that follow the dims: 64 x 64 tiles, whatever the most rows.
     * Measured on an H200 (bench/experiments/dynamic-seq-h200.txt): tiles
     * chosen at the most rows made the few-rows variants' [32, 768] x
     * [768, 3072] take 28 us (128 x 128); over a dynamic batch, BERT-base's
     * FFN up product at 8 x 128 146 us on 128 x 256 (96 workgroups; the
     * model 6.24 -> 4.35 ms, a fixed build 3.77); its rows past the
     * few-rows variants', unsplit, 82 us at 512 rows on 128 x 128 (a fixed
     * build splits those 3 ways: under 47 us; the model at 1 x 512 f16 3.19 ->
     * 2.24 ms, a fixed build 2.43) */
    if (s->dyn)
        bm = bn = 64, wm = wn = 2;
    /* KILN_COOPMAT_TILE=BM,BN,WM,WN,BK overrides the tiles, for tuning
     * (each subgroup's block a multiple of 16, BK 16, 32 or 64) */
    const char *tune = getenv("KILN_COOPMAT_TILE");
    long t[5];
    if (tune && sscanf(tune, "%ld,%ld,%ld,%ld,%ld", &t[0], &t[1], &t[2], &t[3], &t[4]) == 5 &&
        t[2] > 0 && t[3] > 0 && t[2] * t[3] <= 32 && t[0] % (16 * t[2]) == 0 &&
        t[1] % (16 * t[3]) == 0 && (t[4] == 16 || t[4] == 32 || t[4] == 64)) {
        bm = t[0], bn = t[1], wm = t[2], wn = t[3], bk = t[4];
    }
    /* KILN_COOPMAT_PIPE=PF,NS: steps loaded ahead (registers) and shared
     * stages, 1 or 2 each, for tuning; two stages only where they fit
     * 48 KiB */
    int64_t pf = 1, ns = 1;
    const char *tune_pipe = getenv("KILN_COOPMAT_PIPE");
    long tp[2];
    if (tune_pipe && sscanf(tune_pipe, "%ld,%ld", &tp[0], &tp[1]) == 2 &&
        (tp[0] == 1 || tp[0] == 2) && (tp[1] == 1 || tp[1] == 2)) {
        pf = tp[0];
        ns = tp[1];
    }
    /* the ceiling: one step in flight, one stage */
    int ceiling = coopmat_ceiling(2);
    if (ceiling)
        pf = ns = 1;
    if (coopmat_shared_bytes(bm, bn, bk, wm * wn, ns, !b_vec) > 49152)
        ns = 1;
    int64_t tiles = groups_for(s->M, bm) * groups_for(s->N, bn) * s->batch;
    int64_t steps = (s->K + bk - 1) / bk, splits = 1;
    /* a product (not a convolution) on 128 x 256 tiles of 8 subgroups
     * already fills the GPU (they are chosen where they leave 128
     * workgroups): splitting it slowed 2048^3 from 96.9 to 139.8 us (three
     * chunks; two 132.6) on an H200, lone (bench/experiments/
     * coopmat-split-h200.txt) */
    bool full_wave = !conv && wm * wn == 8;
    if (s->batch == 1 && tiles < COOPMAT_GROUPS && !follows_dims(s) && !full_wave)
        splits = (COOPMAT_GROUPS + tiles - 1) / tiles;
    /* the few-rows variant of dynamic rows, or a dynamic batch of images:
     * as many chunks as fill the GPU at the fewest rows or images, within
     * the scratch budget at the most */
    if (s->rows_least || s->conv.dyn_images) {
        MatmulShape at = shape_at(s, s->rows_least ? s->rows_least : s->conv.images_min);
        int64_t least = groups_for(at.M, bm) * groups_for(at.N, bn);
        if (least < COOPMAT_GROUPS)
            splits = (COOPMAT_GROUPS + least - 1) / least;
        if (splits > split_scratch_cap(s))
            splits = split_scratch_cap(s);
    }
    if (splits > steps / 4)
        splits = steps / 4;
    const char *tune_split = getenv("KILN_COOPMAT_SPLITK");
    if (tune_split && s->batch == 1 && !follows_dims(s))
        splits = strtol(tune_split, NULL, 10);
    splits = splits < 1 ? 1 : splits > steps ? steps : splits;
    int64_t kchunk = (steps + splits - 1) / splits * bk;
    splits = (s->K + kchunk - 1) / kchunk;
    Tensor *partial = splits <= 1 ? NULL
                      : parts && parts->partial ? parts->partial
                      : scratch(p, n, "splitk", 3, (int64_t[]){splits, s->M, s->N});
    Dispatch *d = new_dispatch(p, n, "coopmat");
    d->needs = KILN_FEATURE_COOPMAT;
    d->local_size = (uint32_t)(32 * wm * wn);
    define_str(d, "M", rows_glsl(s));
    define_product(d, s);
    /* split along K: C the partial products, or (last) C itself, the
     * partial products in their own slot */
    bool last = partial && split_in_last(n);
    bool need[3] = {false, false, false};
    need_dtype(p, need, partial && !last ? KILN_DTYPE_F32 : c->dtype);
    define_res_type(p, d, need, s);
    need_dtype(p, need, KILN_DTYPE_F16); /* a gathered A or B (F16R) */
    define_needs(d, need);
    define_int(d, "C_F16", (!partial || last) && c->dtype == KILN_DTYPE_F16);
    bool epilogue = !partial && (fused_epilogue(n) || conv);
    define_int(d, "EPILOGUE", epilogue);
    define_int(d, "C_DIRECT", !epilogue && (partial ? s->N % 8 == 0
                                                      : c_rows8 && !s->conv.images));
    define_int(d, "STORE8", epilogue && !n->nsiblings && !n->split_out && c_rows8 &&
                                (!s->conv.images || s->conv.positions % 8 == 0));
    if (!a_vec)
        define_int(d, "A_GATHER", 1);
    if (!b_vec) {
        define_int(d, "B_GATHER", 1);
        define_int(d, "B_F32", b->dtype == KILN_DTYPE_F32);
        if (kvec)
            define_int(d, "B_KVEC", 1);
    }
    define_conv(d, s, partial && !last);
    if (partial) {
        define_int(d, "KCHUNK", kchunk);
        define_int(d, "SPLITS", splits);
    }
    define_int(d, "BM", bm);
    define_int(d, "BN", bn);
    define_int(d, "WM", wm);
    define_int(d, "WN", wn);
    define_int(d, "BK", bk);
    if (pf != 1)
        define_int(d, "PF", pf);
    if (ns != 1)
        define_int(d, "NS", ns);
    /* every workgroup's K steps in pairs (its chunk's, and the last
     * chunk's): the two-step loop's second step needs no test of k0 */
    int64_t last_steps = (s->K - (splits - 1) * kchunk + bk - 1) / bk;
    if ((pf != 1 || ns != 1) && kchunk / bk % 2 == 0 && last_steps % 2 == 0)
        define_int(d, "EVEN_STEPS", 1);
    if (ceiling)
        define_int(d, "CEILING", ceiling);
    dispatch_arg(d, partial && !last ? partial : s->ops[0].t, true);
    dispatch_arg(d, s->ops[1].t, false);
    dispatch_arg(d, f16_kmajor ? n->wq : s->ops[2].t, false);
    d->flops = 2ull * (uint64_t)(s->M * s->N) * (uint64_t)s->K * (uint64_t)s->batch;
    d->groups[0] = groups_for(s->N, bn);
    d->groups[1] = groups_for(s->M, bm);
    d->groups[2] = groups_for(partial ? splits : s->batch, 1);
    rows_groups(d, s, bm);
    cols_groups(d, s, bn);
    if (last)
        bind_split_last(p, d, partial);
    if (!partial || last)
        return d;
    if (parts) {
        parts->partial = partial;
        parts->splits = splits;
        return d;
    }
    Dispatch *r = splitk_sum(p, n, s, partial, splits);
    r->needs = KILN_FEATURE_COOPMAT;
    return r;
}

/* Whether matmul.comp's VEC4 path (two stages of K in shared memory) can
 * take s: f32 operands, B as given (not quantized). */
static bool matmul_f32_shape(const Node *n, const MatmulShape *s) {
    return n->wformat == WF_F32 && s->ops[1].t->dtype == KILN_DTYPE_F32 &&
           s->ops[2].t->dtype == KILN_DTYPE_F32;
}

/* Whether it reads s's A as vec4s: rows contiguous and 16-byte aligned,
 * and K fixed (a vec4 across a run's last k would read don't-care
 * elements, which B's zero rows past K would not cancel if they are not
 * finite). */
static bool matmul_a4(const Node *n, const MatmulShape *s) {
    return matmul_f32_shape(n, s) && !s->dyn_k && s->a_sk == 1 && s->K % 4 == 0 &&
           s->a_sm % 4 == 0 &&
           all_multiples(s->brank, s->ops[1].strides, 4);
}

/* And B (not a convolution's input, which it gathers one by one; a 1 x 1
 * convolution's images where each has a multiple of 4 positions). */
static bool matmul_b4(const Node *n, const MatmulShape *s) {
    return matmul_f32_shape(n, s) && !s->conv.in[0] && s->b_sn == 1 && s->N % 4 == 0 &&
           s->b_sk % 4 == 0 && all_multiples(s->brank, s->ops[2].strides, 4) &&
           s->conv.positions % 4 == 0;
}

/* Both as vec4s: the shapes the larger tiles are chosen for. */
static bool matmul_vec4_shape(const Node *n, const MatmulShape *s) {
    return matmul_a4(n, s) && matmul_b4(n, s);
}

/* After the bias slot: the scales and zero points of a quantized B, where
 * d reads B (splitk.comp does not), and unused slots in their place where
 * a later slot follows (later: the QKV split's outputs, a convolution's
 * residual). */
void bind_weight_scales(Dispatch *d, Node *n, bool later) {
    Tensor *a = n->inputs[0];
    bool scales = n->wscale && strcmp(d->family, "splitk") != 0;
    if (scales)
        dispatch_arg(d, n->wscale, false);
    else if (later)
        dispatch_unused(d, a);
    if (scales && n->wzero)
        dispatch_arg(d, n->wzero, false);
    else if (later)
        dispatch_unused(d, a);
}

/* A tiled product's tiles: BM x BN of C a workgroup, TM x TN of them an
 * invocation, K in steps of BK. */
typedef struct Tiles {
    int64_t bm, bn, tm, tn, bk;
} Tiles;

/* A workgroup's invocations on tiles t: one per TM x TN block. */
static int64_t tile_invocations(Tiles t) { return (t.bm / t.tm) * (t.bn / t.tn); }

/* Whether s is a convolution that the tile rules below treat as one: its
 * input gathered, or several images (a 1 x 1 on one image is a plain
 * product). */
static bool conv_tiles(const MatmulShape *s) { return s->conv.in[0] || s->conv.images; }

/* Whether convolution s takes 64 x 128 tiles of 8 x 4 a invocation in K
 * steps of 8 (pick_tiles): one over several images (their positions side
 * by side in N) whose input is a plain [C, H * W] matrix (1 x 1, unit
 * strides) of at most 1024 output channels, or any of 64 output channels
 * or fewer, where those tiles leave 128 workgroups. Inside ResNet-50 at
 * batch 32 on an H100 (bench/experiments/conv-tiles-b32.txt): 1 x 1
 * convolutions 15-35% faster than on 128 x 256 or 128 x 128 tiles (K 1024,
 * 256 channels: 149 -> 100 us), the 3 x 3 of 64 channels 396 -> 316, the
 * stem 363 -> 344; products 12.60 -> 11.39 ms. Not those of 2048 channels
 * (194 -> 246 us) nor the strided 1 x 1 and the larger 3 x 3 ones, whose
 * windows each tile gathers element by element (332 -> 447 us). */
static bool conv_narrow(const MatmulShape *s) {
    return s->conv.images > 1 && (s->M <= 64 || (!s->conv.in[0] && s->M <= 1024)) &&
           groups_for(s->M, 64) * groups_for(s->N, 128) >= 128;
}

/* matmul.comp's tiles for s (wide: the 128 x 256 ones, see
 * matmul_dispatch). */
static Tiles pick_tiles(const Node *n, const MatmulShape *s, bool wide) {
    Tiles t = {0, 0, 0, 0, 16};
    bool shape4 = matmul_vec4_shape(n, s);
    int64_t M = s->tile_rows ? s->tile_rows : s->M; /* the rows chosen for */
    pick_tile(M, &t.bm, &t.tm);
    pick_tile(s->N, &t.bn, &t.tn);
    /* Rows that leave the last 64-row tile at most half full (ViT's 197:
     * 5 of 64) take 32-row tiles: less of the work is padding, and twice the
     * workgroups (H200, inside ViT-B/16: 3.80 -> 3.34 ms of GPU time;
     * convolutions measured slower on them and keep 64) */
    if (!s->conv.in[0] && M > 64 && M % 64 != 0 && M % 64 <= 32)
        t.bm = 32;
    /* vec4 operands and convolutions: 64 x 128 tiles (4 x 8 per
     * invocation) where they still leave 128 workgroups, a large GPU's
     * multiprocessors (H200: 1024^3 in 73.5 against 83 us on 64 x 64; of
     * the ten tiles swept there, 8 x 8 blocks, 32-wide tiles and K steps of
     * 32 were slower) */
    if ((shape4 || conv_tiles(s)) &&
        groups_for(M, 64) * groups_for(s->N, 128) * s->batch >= 128)
        t = (Tiles){64, 128, 4, 8, 16};
    /* 128 x 128 tiles (8 x 8 per invocation) reuse more of what they load,
     * when they still leave enough workgroups (256) to fill a large GPU and
     * each side has more than 64 (a 128-wide tile of 64 is half padding);
     * K steps of 8 measured faster there (H200: 4.2 against 4.8 ms at
     * 4096), and A read one element at a time needs them (its padded
     * stages would not fit 32 KiB at 16). */
    if (M > 64 && s->N > 64 && (M + 127) / 128 * ((s->N + 127) / 128) * s->batch >= 256)
        t = (Tiles){128, 128, 8, 8, shape4 || !matmul_a4(n, s) ? 8 : 16};
    /* Convolutions: 128 x 128 tiles in K steps of 8 from 32 of them (the
     * split along K fills the rest), and K steps of 8 where K has at most
     * 256. Inside ResNet-50 at batch 32 on the H200 (bench/experiments/
     * conv-tiles-h200.txt, run 1): 3 x 3 convolutions of 128 to 512
     * channels 298-306 us against 371-440 on 64 x 64 or 64 x 128 tiles;
     * the 7 x 7 stem (K 147) 357 against 533 us, 1 x 1 of K 64 53 against
     * 82, in steps of 8 rather than 16. */
    if (conv_tiles(s) && s->M > 64 && s->N > 64 &&
        groups_for(s->M, 128) * groups_for(s->N, 128) >= 32)
        t = (Tiles){128, 128, 8, 8, 8};
    if (conv_tiles(s) && s->K <= 256)
        t.bk = 8;
    if (conv_narrow(s))
        t = (Tiles){64, 128, 8, 4, 8};
    /* wide: 128 x 256 tiles, 512 invocations of 8 x 8, two stages of K 16:
     * 48 KiB of shared memory (matmul_dispatch). */
    if (wide)
        t = (Tiles){128, 256, 8, 8, 16};
    /* KILN_MATMUL_TILE=BM,BN,TM,TN[,BK] overrides them, for tuning and
     * tests: (BM/TM) * (BN/TN) invocations, at most 1024. */
    const char *tune = getenv("KILN_MATMUL_TILE");
    long v[5] = {0, 0, 0, 0, 16};
    if (tune && sscanf(tune, "%ld,%ld,%ld,%ld,%ld", &v[0], &v[1], &v[2], &v[3], &v[4]) >= 4 &&
        v[2] > 0 && v[3] > 0 && v[4] > 0 && v[4] % 4 == 0 && v[0] % v[2] == 0 &&
        v[1] % v[3] == 0 && (v[0] / v[2]) * (v[1] / v[3]) <= 1024)
        t = (Tiles){v[0], v[1], v[2], v[3], v[4]};
    return t;
}

/* One matmul kernel for s: the matrix-vector one (rows up to mrows, its
 * array size) or the tiled one; the tiled one over K in chunks of kchunk
 * (a multiple of its BK) when kchunk is not 0, writing each chunk's partial
 * product to its own [M, N] of s's C (split_product). */
static Dispatch *matmul_kernel(Program *p, Node *n, MatmulShape *s, bool matvec,
                               int64_t mrows, bool wide, int64_t kchunk) {
    if (matvec && kmajor_shape(n, s))
        return matvec_k_kernel(p, n, s, mrows);
    if (n->wkmajor && !s->dyn) /* only a dynamic decode product's tiled variant */
        internal_error("node '%s': a K-major weight on the tiled kernel", n->name);
    Tiles tiles = pick_tiles(n, s, wide);
    int64_t splits = kchunk ? (s->K + kchunk - 1) / kchunk : 1;
    int64_t bm = tiles.bm, bn = tiles.bn, tm = tiles.tm, tn = tiles.tn, bk = tiles.bk;
    /* The VEC4 path: f32 operands, blocks of 4 x 4 per invocation or more,
     * whole vec4s per invocation in each K step's loads, two stages in
     * shared memory. An operand that cannot take vec4s (unaligned rows, a
     * convolution's input, or too few vec4s a step for every invocation) is
     * read one element at a time: A in whole runs of 8 along K, B in
     * whole floats per invocation. */
    int64_t nt = tile_invocations(tiles);
    bool a4 = matmul_a4(n, s) && bm * bk / 4 % nt == 0;
    bool b4 = matmul_b4(n, s) && bn * bk / 4 % nt == 0;
    /* B K-major (a decoder's weights, a transposed operand): its tiles
     * load along K (B_KMAJOR); on the VEC4 path like a scalar A, in runs of
     * 8 along K, its stage rows padded by a vec4 */
    bool kmajor_b = !s->conv.in[0] && s->b_sk == 1 && s->b_sn > 1;
    bool bkm = kmajor_b && !b4 && bk % 8 == 0;
    bool vec4 = !matvec && matmul_f32_shape(n, s) && tm % 4 == 0 && tn % 4 == 0 &&
                bm * bk % nt == 0 && bn * bk % nt == 0 && (a4 || bk % 8 == 0) &&
                /* two stages of shared memory: 48 KiB for wide tiles (the
                 * device's need), else 32 */
                2 * bk * (bm + (a4 ? 0 : 4) + bn + (bkm ? 4 : 0)) * 4 <=
                    (wide ? 49152 : 32768);
    MatvecShape mv = {0};
    if (matvec)
        mv = matvec_shape(n, s, mrows);
    Dispatch *d = new_dispatch(p, n, matvec ? "matvec" : "matmul");
    d->local_size = (uint32_t)(matvec ? mv.ncol * mv.ksplit : nt);
    /* Dynamic rows: matvec keeps M (the most) for its arrays and loops to
     * MROWS; the tiled kernel's M is the run's. */
    if (matvec) {
        define_int(d, "M", mrows);
        define_str(d, "MROWS", rows_glsl(s));
    } else {
        define_str(d, "M", rows_glsl(s));
    }
    define_product(d, s);
    define_operand_types(p, d, s);
    if (matvec) {
        define_int(d, "NCOL", mv.ncol);
        define_int(d, "KSPLIT", mv.ksplit);
        define_int(d, "VEC", mv.vec);
        define_int(d, "AVEC", mv.avec);
        define_int(d, "MC", mv.mc);
    } else {
        define_int(d, "BM", bm);
        define_int(d, "BN", bn);
        define_int(d, "BK", bk);
        define_int(d, "TM", tm);
        define_int(d, "TN", tn);
        define_int(d, "VEC4", vec4);
        if (vec4 && !a4)
            define_int(d, "A_SCALAR", 1);
        if (vec4 && !b4)
            define_int(d, "B_SCALAR", 1);
        if (vec4 ? bkm : kmajor_b)
            define_int(d, "B_KMAJOR", 1);
        define_conv(d, s, kchunk && !split_in_last(n));
        if (kchunk) {
            define_int(d, "SPLITK", splits);
            define_int(d, "KCHUNK", kchunk);
        }
    }
    dispatch_arg(d, s->ops[0].t, true);
    dispatch_arg(d, s->ops[1].t, false);
    dispatch_arg(d, n->wq ? n->wq : s->ops[2].t, false);
    if (s->ops[2].t->dtype == KILN_DTYPE_F16) {
        define_int(d, "W_FORMAT", WF_F16);
    } else if (n->wformat != WF_F32) {
        define_int(d, "W_FORMAT", n->wformat);
        define_int(d, "QBLOCK", QUANT_BLOCK);
        if (n->wkmajor) { /* scales K-major too (quantize.c) */
            define_int(d, "W_KMAJOR", 1);
            define_int(d, "NBLK", (s->K + QUANT_BLOCK - 1) / QUANT_BLOCK);
        }
    }
    d->flops = 2ull * (uint64_t)((matvec ? mrows : s->M) * s->N) * (uint64_t)s->K *
               (uint64_t)s->batch;
    d->groups[0] = groups_for(s->N, matvec ? mv.ncol * mv.vec : bn);
    d->groups[1] = matvec ? 1 : groups_for(s->M, bm);
    d->groups[2] = groups_for(kchunk ? splits : s->batch, 1);
    if (!matvec) {
        rows_groups(d, s, bm);
        cols_groups(d, s, bn);
    }
    /* The vec4 path without loops over tiles and batches where each has
     * its own workgroup, leaving registers to the inner loop. (Loads
     * without bounds checks where the tiles divide the product measured no
     * faster on the H200 once the loops were gone; in coopmat.comp neither
     * change measured faster.) */
    if (vec4)
        define_int(d, "ONE_TILE", !follows_dims(s) && d->groups[0] * bn >= s->N &&
                                      d->groups[1] * bm >= s->M && d->groups[2] >= s->batch);
    return d;
}

/* Split K. A product with few rows and long ones (BERT-base's FFN output,
 * [128, 3072] x [3072, 768]) has fewer tiles than a large GPU has
 * multiprocessors: 24 of 64 x 64 on the H200's 132. Split along K, its
 * workgroups each take one chunk of K for one tile and write a partial
 * product; the last of a tile's workgroups to finish adds them up and
 * applies the epilogue (product.glsl's split_last), or for a convolution
 * a second dispatch (splitk.comp; split_in_last says why).
 *
 * The split count minimises a cost model of the target: SPLIT_SLOTS
 * workgroups of 256 invocations run at once (a large GPU, one per
 * multiprocessor; twice as many of 128), each takes SPLIT_STEP_NS per K
 * step of a 64 x 64 tile (scaled by its tile's area), the workgroups run
 * in waves of those slots, and a split adds SPLIT_FIXED_NS (measured as
 * a second dispatch with its barrier, before the sum moved into the last
 * workgroups) and the reading of the partial products and writing of C at
 * SPLIT_BYTES_PER_NS. Constants measured on an H200 (bench/
 * experiments/splitk-h200.txt; the slots of 128-invocation workgroups from
 * tiles-in-models-h200.txt: ResNet-50's last stage, N = 49, 97 -> 56 us a
 * convolution on 16 splits instead of 8). KILN_MATMUL_SPLITK=S overrides
 * the count, for tuning and tests (1: no split). */
#define SPLIT_SLOTS 132
#define SPLIT_STEP_NS 600.0
#define SPLIT_FIXED_NS 3000.0
#define SPLIT_BYTES_PER_NS 2000.0
#define SPLIT_MAX 32

/* The model's time for s on tiles t in `splits` chunks of K. */
static double split_cost(const MatmulShape *s, Tiles t, int64_t splits) {
    int64_t tiles = groups_for(s->M, t.bm) * groups_for(s->N, t.bn) * s->batch;
    int64_t steps = (s->K + t.bk - 1) / t.bk, chunk = (steps + splits - 1) / splits;
    int64_t slots = SPLIT_SLOTS * 256 / tile_invocations(t);
    int64_t waves = (tiles * splits + slots - 1) / slots;
    double ns = (double)(waves * chunk) * SPLIT_STEP_NS * (double)(t.bm * t.bn * t.bk) /
                (64.0 * 64.0 * 16.0);
    if (splits > 1)
        ns += SPLIT_FIXED_NS +
              (double)((splits + 1) * s->M * s->N) * 4.0 / SPLIT_BYTES_PER_NS;
    return ns;
}

/* The split count (1 to SPLIT_MAX, at most steps) of least model time for
 * s, and that time in *ns. */
static int64_t best_split(const MatmulShape *s, Tiles t, int64_t steps, double *ns) {
    int64_t best = 1;
    *ns = split_cost(s, t, 1);
    for (int64_t k = 2; k <= SPLIT_MAX && k <= steps; k++) {
        double v = split_cost(s, t, k);
        if (v < *ns)
            best = k, *ns = v;
    }
    return best;
}

/* The split count whose one value serves runs of `least` to `most` units
 * (shape_at): the count whose model time, relative to the best count's at
 * the same units, is least at the worst of the fewest, the most and their
 * geometric middle (within split_scratch_cap). For a convolution over a
 * dynamic batch of images (ResNet-50 with a batch of 1..32 on an H200,
 * bench/experiments/dynamic-batch-h200.txt: its last stage's convolutions
 * unsplit took 620 us at any batch, one workgroup's walk along K, the
 * whole model 6.95 ms of GPU time at batch 1 against a fixed build's
 * 1.11) and a product's few-rows variant (dyn_tiled_dispatch). */
static int64_t split_over_range(const MatmulShape *s, Tiles t, int64_t steps, int64_t least,
                                int64_t most) {
    int64_t mid = least;
    while (mid * mid < least * most)
        mid++;
    const int64_t units[3] = {least, mid, most};
    MatmulShape at[3];
    double best_ns[3];
    for (int i = 0; i < 3; i++) {
        at[i] = shape_at(s, units[i]);
        best_split(&at[i], t, steps, &best_ns[i]);
    }
    int64_t best = 1;
    double best_worst = 0.0;
    for (int64_t k = 1; k <= SPLIT_MAX && k <= steps && k <= split_scratch_cap(s); k++) {
        double worst = 0.0;
        for (int i = 0; i < 3; i++) {
            double r = split_cost(&at[i], t, k) / best_ns[i];
            worst = r > worst ? r : worst;
        }
        if (k == 1 || worst < best_worst)
            best = k, best_worst = worst;
    }
    return best;
}

/* The chunk of K (a multiple of t.bk) that the cost model gives s, or 0
 * for no split. Only unbatched products split (their partial products are
 * one [M, N] each): with fixed rows, a convolution's dynamic batch of
 * images (split_over_range) and the few-rows variant of dynamic rows
 * (s->rows_least to s->M rows, split_over_range). */
static int64_t split_chunk(const MatmulShape *s, Tiles t) {
    if ((s->dyn && !s->rows_least) || s->batch != 1)
        return 0;
    int64_t steps = (s->K + t.bk - 1) / t.bk, best = 1;
    const char *tune = getenv("KILN_MATMUL_SPLITK");
    if (tune) {
        best = strtol(tune, NULL, 10);
        best = best < 1 ? 1 : best > steps ? steps : best;
    } else if (s->conv.dyn_images) {
        best = split_over_range(s, t, steps, s->conv.images_min, s->conv.images);
    } else if (s->rows_least) {
        best = split_over_range(s, t, steps, s->rows_least, s->M);
    } else {
        double ns;
        best = best_split(s, t, steps, &ns);
    }
    if (best == 1)
        return 0;
    return (steps + best - 1) / best * t.bk;
}

/* s split along K in chunks of kchunk: matmul.comp's partial products into
 * a [splits, M, N] scratch, added up with the epilogue by each tile's last
 * workgroup (split_in_last) or by splitk.comp, which takes matmul.comp's
 * argument slots (C, the scratch in A's, none in B's). Either way its
 * callers bind the bias, scales and split outputs as for any product
 * kernel. Returns the dispatch that writes C. */
static Dispatch *split_product(Program *p, Node *n, MatmulShape *s, int64_t kchunk) {
    int64_t splits = (s->K + kchunk - 1) / kchunk;
    Tensor *partial = scratch(p, n, "splitk", 3, (int64_t[]){splits, s->M, s->N});
    if (split_in_last(n)) {
        Dispatch *d = matmul_kernel(p, n, s, false, 0, false, kchunk);
        bind_split_last(p, d, partial);
        return d;
    }
    MatmulShape part = *s;
    part.ops[0].t = partial;
    Dispatch *d = matmul_kernel(p, n, &part, false, 0, false, kchunk);
    if (n->wscale) {
        dispatch_unused(d, n->inputs[0]); /* the bias slot: no epilogue here */
        bind_weight_scales(d, n, false);
    }
    return splitk_sum(p, n, s, partial, splits);
}

/* splitk.comp: C from the [splits, M, N] partial products of s, with the
 * epilogue its callers bind. */
static Dispatch *splitk_sum(Program *p, Node *n, const MatmulShape *s, Tensor *partial,
                            int64_t splits) {
    Dispatch *r = new_dispatch(p, n, "splitk");
    r->local_size = 256;
    define_int(r, "WG", r->local_size);
    define_str(r, "M", rows_glsl(s)); /* the run's rows where they follow the dims */
    define_product(r, s);
    define_int(r, "SPLITK", splits);
    bool need[3] = {false, false, false};
    need_dtype(p, need, s->ops[0].t->dtype);
    define_res_type(p, r, need, s);
    define_needs(r, need);
    define_int(r, "C_F16", s->ops[0].t->dtype == KILN_DTYPE_F16);
    if (s->conv.images)
        define_int(r, "C_IMG", s->conv.positions);
    dispatch_arg(r, s->ops[0].t, true);
    dispatch_arg(r, partial, false);
    dispatch_unused(r, partial);
    r->groups[0] = groups_for(s->M * s->N, r->local_size);
    if (s->conv.dyn_images) { /* the run's images' columns of each row */
        define_str(r, "N_RUN", dim_expr_glsl(s->conv.dyn_images, s->conv.positions));
        dyn_groups_along(r, 0, s->conv.dyn_images, s->M * s->conv.positions, r->local_size);
    }
    if (s->dyn) /* the run's rows */
        dyn_groups_along(r, 0, s->dyn, s->M / s->dyn_most * s->N, r->local_size);
    return r;
}

/* A split product's dispatch d (matmul.comp or coopmat.comp, SPLITK
 * chunks of K, a workgroup a tile in x and y): its partial products in the
 * scratch `partial`, and a counter for each tile, in the argument slots
 * after A and B (before the bias's, which its callers bind). */
static void bind_split_last(Program *p, Dispatch *d, Tensor *partial) {
    if (d->groups[0] == MAX_GROUPS || d->groups[1] == MAX_GROUPS)
        internal_error("a product split along K with %u x %u tiles", d->groups[0],
                       d->groups[1]);
    define_int(d, "SPLIT_LAST", 1);
    dispatch_arg(d, partial, true);
    bind_counters(p, d, (int64_t)d->groups[0] * d->groups[1]);
}

/* The matrix-vector kernel of s for runs of lo to hi rows (multiples of
 * per, the rows a unit of the dims adds): all its column groups then, none
 * otherwise. */
static Dispatch *matvec_variant(Program *p, Node *n, MatmulShape *s, int64_t per, int64_t hi,
                                int64_t lo) {
    Dispatch *v = matmul_kernel(p, n, s, true, hi, false, 0);
    uint32_t cols = v->groups[0];
    v->dynamic = true;
    v->dyn_axis = 0;
    v->work = *s->dyn;
    v->scale = per * cols;
    v->per_group = 1;
    v->work_min = lo * cols;
    v->work_max = hi * cols;
    v->one_row = hi == 1;
    return v;
}

/* coopmat_wg.comp for s (cooperative matrices of workgroup scope), or NULL
 * where it does not apply: a fixed f16 product (not a convolution, B as
 * given, row-major or K-major: B_KMAJOR) whose tiles are whole and vectors
 * of eight halves, at least
 * COOPMAT_WG_GROUPS workgroups of 128 x 128 tiles, or of 128 x 64 (fewer
 * products are left to coopmat.comp, which splits K); with a fused
 * epilogue (a bias, an activation, a QKV split, gemm) on 128 x 64 tiles,
 * whose f32 accumulator fits in shared memory. The dispatch needs
 * KILN_FEATURE_COOPMAT_WG. Measured on an H200
 * (bench/experiments/cm2-h200.txt), against coopmat.comp in the same run:
 * 4096^3 505 against 723 us, 2048^3 69 against 96, 8192^3 3826 against
 * 5609, 1024^3 (128 x 64 tiles) 19 against 36. */
#define COOPMAT_WG_GROUPS 128
static Dispatch *coopmat_wg_kernel(Program *p, Node *n, MatmulShape *s) {
    Tensor *c = s->ops[0].t, *b = s->ops[2].t;
    bool kmajor = b_kmajor(n, s); /* gemm's trans_b: B_KMAJOR */
    if (!coopmat_takes(n, s) || s->dyn || s->dyn_batch || n->op == OP_CONV || n->wq ||
        b->dtype != KILN_DTYPE_F16 || (s->b_sn != 1 && !kmajor) || s->conv.images)
        return NULL;
    bool epilogue = fused_epilogue(n);
    int64_t bm = 128, bn = 128, bk = 32;
    if (s->M % bm || s->K % bk || s->N % 64 || s->a_sm % 8 ||
        (kmajor ? s->b_sn : s->b_sk) % 8 ||
        !all_multiples(s->brank, s->ops[1].strides, 8) ||
        !all_multiples(s->brank, s->ops[2].strides, 8) ||
        !all_multiples(s->brank, s->ops[0].strides, 8))
        return NULL;
    if (epilogue || s->N % 128 || s->M / bm * (s->N / 128) * s->batch < COOPMAT_WG_GROUPS)
        bn = 64;
    if (s->M / bm * (s->N / bn) * s->batch < COOPMAT_WG_GROUPS)
        return NULL;
    Dispatch *d = new_dispatch(p, n, "coopmat_wg");
    d->needs = KILN_FEATURE_COOPMAT_WG;
    d->local_size = 128;
    define_int(d, "M", s->M);
    define_product(d, s);
    bool need[3] = {false, false, false};
    need_dtype(p, need, c->dtype);
    define_res_type(p, d, need, s);
    need_dtype(p, need, KILN_DTYPE_F16);
    define_needs(d, need);
    define_int(d, "C_F16", c->dtype == KILN_DTYPE_F16);
    define_int(d, "EPILOGUE", epilogue);
    define_int(d, "STORE8", epilogue && !n->nsiblings && !n->split_out);
    define_int(d, "BM", bm);
    define_int(d, "BN", bn);
    define_int(d, "BK", bk);
    if (kmajor)
        define_int(d, "B_KMAJOR", 1);
    int ceiling = coopmat_ceiling(3);
    if (ceiling)
        define_int(d, "CEILING", ceiling);
    dispatch_arg(d, c, true);
    dispatch_arg(d, s->ops[1].t, false);
    dispatch_arg(d, b, false);
    d->flops = 2ull * (uint64_t)(s->M * s->N) * (uint64_t)s->K * (uint64_t)s->batch;
    d->groups[0] = s->N / bn;
    d->groups[1] = s->M / bm;
    d->groups[2] = groups_for(s->batch, 1);
    return d;
}

/* coopmat.comp's dispatch cm, with the tiled kernel recorded after it as
 * its variant for devices without cooperative matrices. Returns cm. */
static Dispatch *with_tiled_variant(Program *p, Node *n, MatmulShape *s, Dispatch *cm) {
    cm->variant = matmul_kernel(p, n, s, false, 0, false, 0);
    cm->variant->unless = KILN_FEATURE_COOPMAT;
    return cm;
}

/* d, whose groups follow s's rows (their scale a multiple of the rows a
 * unit adds), runs only for lo to hi rows. */
static void for_rows(Dispatch *d, const MatmulShape *s, int64_t lo, int64_t hi) {
    int64_t per = s->M / s->dyn_most;
    d->work_min = (uint64_t)((lo + per - 1) / per * d->scale);
    d->work_max = (uint64_t)(hi / per * d->scale);
}

/* coopmat.comp's chunks for a run of r rows of s, as a fixed build of r
 * rows takes them (coopmat_kernel): as many as fill the GPU on 64 x 64
 * tiles, at most a quarter of K's steps of 32. */
static int64_t coopmat_chunks_at(const MatmulShape *s, int64_t r) {
    int64_t tiles = groups_for(r, 64) * groups_for(s->N, 64), c = 1;
    if (tiles < COOPMAT_GROUPS)
        c = (COOPMAT_GROUPS + tiles - 1) / tiles;
    int64_t most = s->K / 32 / 4;
    return c < most ? c : most;
}

#define FEW_ROWS_VARIANTS 8

/* few_rows_split on coopmat.comp for runs of lo to hi rows: a variant for
 * each range of row tiles over which a fixed build's chunk count
 * (coopmat_chunks_at) stays above two thirds of its count at the range's
 * fewest rows, that count fixed at compile time; all of them first (their
 * partial products in one scratch, since a run gives work to one), then
 * their sums, so that one barrier (the first sum's) orders every sum
 * after every product. A count read at run time instead (one variant)
 * made the products 25-40% slower on an H200 than a fixed build's at the
 * same count, and one count for the fewest rows made 512 rows 15% slower
 * than no split (bench/experiments/dynamic-seq-h200.txt). Returns the
 * first sum, the rest its variants. */
static Dispatch *coopmat_few_rows(Program *p, Node *n, const MatmulShape *s, int64_t lo,
                                  int64_t hi) {
    int64_t per = s->M / s->dyn_most;
    MatmulShape few[FEW_ROWS_VARIANTS];
    int64_t from[FEW_ROWS_VARIANTS], elems = 0; /* the largest variant's partials */
    int nv = 0;
    for (int64_t r = lo; r <= hi && nv < FEW_ROWS_VARIANTS; nv++) {
        int64_t c0 = coopmat_chunks_at(s, r), top = groups_for(r, 64) * 64;
        while (top + 64 <= hi && 3 * coopmat_chunks_at(s, top + 64) >= 2 * c0)
            top += 64;
        if (top > hi || nv == FEW_ROWS_VARIANTS - 1)
            top = hi;
        top = top / per * per; /* whole units */
        few[nv] = shape_at(s, top);
        few[nv].dyn_most = top / per;
        few[nv].rows_least = r;
        from[nv] = r;
        int64_t e = c0 * top * s->N;
        elems = e > elems ? e : elems;
        r = top + per;
    }
    SplitParts parts = {scratch(p, n, "splitk", 3, (int64_t[]){1, 1, elems}), 0};
    int64_t chunks[FEW_ROWS_VARIANTS];
    Dispatch *prev = NULL;
    for (int i = 0; i < nv; i++) {
        Dispatch *d = coopmat_parts(p, n, &few[i], &parts);
        if (parts.splits < 2)
            internal_error("node '%s': a few-rows variant of one chunk", n->name);
        chunks[i] = parts.splits;
        for_rows(d, &few[i], from[i], few[i].M);
        if (prev)
            prev->variant = d;
        prev = d;
        parts.splits = 0;
    }
    Dispatch *first = NULL;
    prev = NULL;
    for (int i = 0; i < nv; i++) {
        Dispatch *r = splitk_sum(p, n, &few[i], parts.partial, chunks[i]);
        r->needs = KILN_FEATURE_COOPMAT;
        for_rows(r, &few[i], from[i], few[i].M);
        if (prev)
            prev->variant = r;
        else
            first = r;
        prev = r;
    }
    return first;
}

/* The tile rows (MatmulShape.tile_rows) for few, the few-rows variant of
 * runs of few->rows_least to few->M rows: of the tiles pick_tiles gives
 * the most rows, and the fewest and their geometric middle with the most
 * each rounded up to whole 64-row tiles (no 32-row tiles for a row count
 * that no run need have: pick_tiles' rule for a last tile at most half
 * full), those whose model time
 * (split_cost, at the split split_over_range then gives them) relative to
 * the best of those tiles and splits at the same rows is least at the
 * worst of the three. The tiles of the most rows alone (64 x 128 for BERT-
 * base's [seq, 768] x [768, 3072] over seq 2..512) left runs of 128 rows
 * half the workgroups of a fixed build's 64 x 64. */
static int64_t few_rows_tiles(const Node *n, const MatmulShape *few) {
    int64_t least = few->rows_least, most = few->M, mid = least;
    while (mid * mid < least * most)
        mid++;
    const int64_t rows[3] = {least, mid, most};
    const int64_t tile_rows[3] = {(least + 63) / 64 * 64, (mid + 63) / 64 * 64, most};
    MatmulShape at[3];
    Tiles cand[3];
    double best_ns[3];
    for (int i = 0; i < 3; i++) {
        MatmulShape c = *few;
        c.tile_rows = tile_rows[i];
        cand[i] = pick_tiles(n, &c, false);
        at[i] = shape_at(few, rows[i]);
        at[i].tile_rows = 0;
    }
    for (int i = 0; i < 3; i++) { /* the best of any candidate at rows[i] */
        best_ns[i] = 0.0;
        for (int c = 0; c < 3; c++) {
            double ns;
            best_split(&at[i], cand[c], (few->K + cand[c].bk - 1) / cand[c].bk, &ns);
            if (c == 0 || ns < best_ns[i])
                best_ns[i] = ns;
        }
    }
    int64_t best = most;
    double best_worst = 0.0;
    for (int c = 2; c >= 0; c--) { /* ties: the most rows' tiles, as before */
        int64_t steps = (few->K + cand[c].bk - 1) / cand[c].bk;
        int64_t k = split_over_range(few, cand[c], steps, least, most);
        double worst = 0.0;
        for (int i = 0; i < 3; i++) {
            double r = split_cost(&at[i], cand[c], k) / best_ns[i];
            worst = r > worst ? r : worst;
        }
        if (c == 2 || worst < best_worst)
            best = tile_rows[c], best_worst = worst;
    }
    return best;
}

/* The few-rows variant of a product whose rows follow the dims: split
 * along K for runs of `least` rows (and the dims' least) up to *upto, the
 * most rows at which a fixed build of the same rows would split (the cost
 * model: split_chunk; coopmat.comp: fewer than COOPMAT_GROUPS tiles of 64 x
 * 64), its one chunk count chosen over that range (split_over_range;
 * coopmat.comp: as many as fill the GPU at the fewest). Returns the
 * dispatch that writes C (the chunks' sum, splitk.comp), or NULL where no
 * run of the range gains. Not with KILN_SPLIT_LAST or KILN_MATMUL_SPLITK
 * set. A run of fewer rows (a decoding step's one) leaves it idle: its
 * sum's barrier then falls to the next dispatch that runs, the product's
 * reader, which has one anyway. BERT-base exported with a
 * dynamic sequence, its FFN output [128, 3072] x [3072, 768] at 128 rows:
 * 24 tiles each walking K, where a fixed build splits it in 11
 * (bench/experiments/dynamic_seq.py). */
static Dispatch *few_rows_split(Program *p, Node *n, const MatmulShape *s, int64_t least,
                                int64_t *upto) {
    if (!s->dyn || s->batch != 1 || s->dyn_k || split_in_last(n) ||
        getenv("KILN_MATMUL_SPLITK"))
        return NULL;
    int64_t per = s->M / s->dyn_most;
    int64_t lo = dim_expr_min(p->graph, s->dyn) * per;
    lo = lo > least ? lo : least;
    lo = (lo + per - 1) / per * per;
    lo = lo > per ? lo : per;
    bool cm = coopmat_takes(n, s);
    int64_t hi = 0;
    /* down from the most rows, a 64-row tile at a time (the model's time
     * steps with the tiles), each a whole number of units */
    for (int64_t top = s->M; top >= lo && !hi; top = (top - 1) / 64 * 64) {
        int64_t r = top / per * per;
        if (r < lo)
            break;
        MatmulShape at = shape_at(s, r);
        double ns;
        Tiles t = pick_tiles(n, &at, false);
        if (cm ? groups_for(r, 64) * groups_for(s->N, 64) < COOPMAT_GROUPS
               : best_split(&at, t, (s->K + t.bk - 1) / t.bk, &ns) > 1)
            hi = r;
    }
    MatmulShape few = shape_at(s, hi);
    few.dyn_most = hi / per;
    few.rows_least = lo;
    /* coopmat.comp splits where K has 8 steps of 32 and the scratch takes
     * two chunks at the most rows */
    if (!hi || (cm && (s->K / 32 / 4 < 2 || split_scratch_cap(&few) < 2)))
        return NULL;
    Dispatch *sum;
    if (cm) {
        sum = coopmat_few_rows(p, n, s, lo, hi);
    } else {
        few.tile_rows = few_rows_tiles(n, &few);
        int64_t kchunk = split_chunk(&few, pick_tiles(n, &few, false));
        if (!kchunk)
            return NULL;
        int start = p->ndispatches;
        sum = split_product(p, n, &few, kchunk);
        for (int i = start; i < p->ndispatches; i++) /* the product and its sum */
            for_rows(p->dispatches[i], &few, lo, hi);
    }
    *upto = hi;
    return sum;
}

/* The tiled kernel for rows that follow the dims, or coopmat.comp where it
 * applies (a decoder's prompt in f16) with the tiled kernel as its variant;
 * runs of fewer than `least` rows give neither workgroups. Runs of few
 * rows take a variant split along K first where it gains (few_rows_split;
 * on devices without cooperative matrices the tiled kernel takes every
 * run of an f16 product). Returns the first. */
static Dispatch *dyn_tiled_dispatch(Program *p, Node *n, MatmulShape *s, int64_t least) {
    int64_t upto = 0;
    Dispatch *few = few_rows_split(p, n, s, least, &upto);
    if (few && upto >= s->M && !coopmat_takes(n, s))
        return few; /* it takes every run */
    Dispatch *cm = coopmat_kernel(p, n, s);
    Dispatch *first = cm ? with_tiled_variant(p, n, s, cm)
                         : matmul_kernel(p, n, s, false, 0, false, 0);
    for (Dispatch *v = first; v; v = v->variant)
        v->work_min = least;
    if (!few)
        return first;
    first->work_min = upto + 1; /* rows after the few-rows variants' */
    Dispatch *last = few;
    while (last->variant)
        last = last->variant;
    last->variant = first;
    return few;
}

/* The kernel by the rows: matrix-vector up to MATVEC_MAX_M, else tiled.
 * Dynamic rows that can be either get both, recorded one after the other:
 * each run gives one of them its groups and the other none (work_min and
 * work_max over the run's rows), and no barrier separates them; a decode
 * step's product has a third, the matrix-vector kernel for exactly one
 * row, first. Returns the first; d->variant is the next. */
Dispatch *matmul_dispatch(Program *p, Node *n, MatmulShape *s) {
    if (s->M * s->N * s->batch == 0)
        return NULL;
    if (s->dyn_k) /* a dynamic contracted axis: the tiled kernel, K at run time */
        return matmul_kernel(p, n, s, false, 0, false, 0);
    if (n->wkmajor) { /* its weight encoded K-major (quantize.c): column n at n * K */
        s->b_sk = 1;
        s->b_sn = s->K;
    }
    /* devices with cooperative matrices of workgroup scope run
     * coopmat_wg.comp, others with cooperative matrices coopmat.comp (its
     * dispatches from `before` on), the rest the tiled kernel */
    Dispatch *wg = s->dyn ? NULL : coopmat_wg_kernel(p, n, s);
    int before = p->ndispatches;
    Dispatch *cm = s->dyn ? NULL : coopmat_kernel(p, n, s);
    if (wg && !cm)
        internal_error("coopmat_wg.comp without coopmat.comp for node '%s'", n->name);
    if (wg)
        for (int i = before; i < p->ndispatches; i++)
            p->dispatches[i]->unless |= KILN_FEATURE_COOPMAT_WG;
    if (cm) { /* devices without cooperative matrices run the tiled kernel */
        with_tiled_variant(p, n, s, cm);
        if (!wg)
            return cm;
        wg->variant = cm;
        return wg;
    }
    if (s->M <= MATVEC_MAX_M && s->M > 1 && s->dyn && n->wkmajor &&
        s->M / s->dyn_most == 1) { /* one row, then 2 to M (see below) */
        Dispatch *one = matvec_variant(p, n, s, 1, 1, 1);
        one->variant = matvec_variant(p, n, s, 1, s->M, 2);
        return one;
    }
    if (s->M <= MATVEC_MAX_M)
        return matmul_kernel(p, n, s, true, s->M, false, 0);
    /* Fixed f32 products with at least 128 tiles of 128 x 256 run on those
     * where the device has 48 KiB of shared memory (H200: 3.5 against 4.2
     * ms at 4096), on 128 x 128 (or smaller) tiles elsewhere; not with 64
     * rows or fewer, half of a 128-row tile (a 1 x 1 convolution of 64
     * channels over 32 images: 102 against 72 us on 64 x 128 tiles). */
    if (!s->dyn && s->M > 64 && matmul_vec4_shape(n, s) && !conv_narrow(s) &&
        (s->M + 127) / 128 * ((s->N + 255) / 256) * s->batch >= 128 &&
        !getenv("KILN_MATMUL_TILE")) {
        Dispatch *w = matmul_kernel(p, n, s, false, 0, true, 0);
        w->needs = KILN_FEATURE_SHARED48K;
        w->variant = matmul_kernel(p, n, s, false, 0, false, 0);
        w->variant->unless = KILN_FEATURE_SHARED48K;
        return w;
    }
    int64_t kchunk = split_chunk(s, pick_tiles(n, s, false));
    if (kchunk)
        return split_product(p, n, s, kchunk);
    int64_t per = s->dyn ? s->M / s->dyn_most : 0; /* rows per unit */
    /* a K-major weight: matvec_k.comp up to MATVEC_K_DYN_M rows
     * (KILN_MATVEC_K_M=R, 1 to that, fewer: for tuning) */
    int64_t most = n->wkmajor ? MATVEC_K_DYN_M : MATVEC_MAX_M;
    const char *tune_m = getenv("KILN_MATVEC_K_M");
    if (n->wkmajor && tune_m && atoi(tune_m) >= 1 && atoi(tune_m) <= MATVEC_K_DYN_M)
        most = atoi(tune_m);
    if (!s->dyn)
        return matmul_kernel(p, n, s, false, 0, false, 0);
    if (per > most)
        return dyn_tiled_dispatch(p, n, s, 0);
    int64_t small = most / per * per; /* the most rows the matvec one takes */
    /* A decoding step's one row on a kernel built for one (as above): its
     * arrays and the partial sums it reduces are the rows' (bench/
     * experiments/matvec_k_dyn-h200.txt: 2048 x 2560 f16 8.6 -> 6.0 us on
     * the H200, 2048 x 11264 int4 17.0 -> 15.5). Recorded first: the
     * variants go in the order of their rows. */
    Dispatch *one = n->wkmajor && per == 1 && small > 1 ? matvec_variant(p, n, s, 1, 1, 1)
                                                        : NULL;
    Dispatch *v = matvec_variant(p, n, s, per, small, one ? 2 : 1);
    v->variant = dyn_tiled_dispatch(p, n, s, small + 1);
    if (!one)
        return v;
    one->variant = v;
    return one;
}

/* The bias slot of a matmul kernel: bias read at BIAS_SM * m + BIAS_SN * n
 * (strides of bo) and added times beta, or, without one, a slot the kernel
 * does not touch (a's address). */
void bind_bias(Dispatch *d, Tensor *bias, Operand bo, double beta, Tensor *a) {
    if (!bias) {
        dispatch_unused(d, a);
        return;
    }
    define_int(d, "HAS_BIAS", 1);
    define_float(d, "BETA", beta);
    define_int(d, "BIAS_SM", bo.strides[0]);
    define_int(d, "BIAS_SN", bo.strides[1]);
    dispatch_arg(d, bias, false);
}


bool norm_after_product(Program *p, Node *n, Dispatch *nd, Tensor *o, Tensor *res,
                        Tensor *y, Tensor *sum, Tensor *gamma, Tensor *beta, bool rms) {
    Node *prod = o->producer;
    if (!prod || prod->fused_into || o->uses != 1 || o->is_output || !every_run(nd) ||
        !shape_equal(o, res) || (sum && !shape_equal(sum, o)) || !shape_equal(y, o))
        return false;
    Dispatch *one = one_row_of(p, prod, nd);
    int64_t N = o->shape[o->rank - 1];
    /* C is o's whole row, the norm over it; gamma and beta per element; not
     * a QKV split's product */
    if (!one || one->args[0] != o || prod->nsiblings ||
        (gamma && tensor_count(gamma) != N) || (beta && tensor_count(beta) != N) ||
        /* each invocation holds its N / WG elements in registers */
        (N + one->local_size - 1) / one->local_size > 64)
        return false;
    /* f32 or f16; 16-bit storage where a half is read or written: the
     * kernel's needs are defined already (define_operand_types), from its
     * A and C */
    bool f16 = o->dtype == KILN_DTYPE_F16 || one->args[1]->dtype == KILN_DTYPE_F16;
    Tensor *all[6] = {o, res, y, sum, gamma, beta};
    for (int k = 0; k < 6; k++)
        if (all[k] && all[k]->dtype != KILN_DTYPE_F32 &&
            (all[k]->dtype != KILN_DTYPE_F16 || !f16))
            return false;
    define_int(one, "LAST_NORM", 1);
    define_int(one, "NORM_RMS", rms);
    define_int(one, "NORM_GAMMA", gamma != NULL);
    define_int(one, "NORM_BETA", beta != NULL);
    define_int(one, "NORM_SUM", sum != NULL);
    define_float(one, "EPS", attr_float(n, "eps"));
    bool need[3] = {false, false, false}; /* recorded already (f16) */
    define_storage(p, one, need, "NRES", res, false);
    define_storage(p, one, need, "NG", gamma ? gamma : res, false);
    define_storage(p, one, need, "NB", beta ? beta : res, false);
    define_storage(p, one, need, "NY", y, true);
    define_storage(p, one, need, "NSUM", sum ? sum : y, true);
    while (one->nargs < 8) /* c, a, b, bias, scales, zero points, the split's two */
        dispatch_unused(one, o);
    bind_counters(p, one, 1);
    dispatch_arg(one, res, false);
    if (gamma)
        dispatch_arg(one, gamma, false);
    else
        dispatch_unused(one, res);
    if (beta)
        dispatch_arg(one, beta, false);
    else
        dispatch_unused(one, res);
    dispatch_arg(one, y, true);
    if (sum)
        dispatch_arg(one, sum, true);
    else
        dispatch_unused(one, y);
    /* the norm's own dispatch: runs of two rows or more */
    nd->work_min = 2 * nd->scale;
    return true;
}

/* QKV split (optimize.c): the product's columns [0, N0) are n's output,
 * the next N1 its first sibling's, the rest its second's; each a row-major
 * [M, width] tensor (B is one 2-D weight, so the batch folded into M). The
 * kernels take the siblings' outputs after the scale and zero-point slots
 * (bind_weight_scales). A sibling's output that a decoder appends to its
 * cache state (a view of it; append_region) is written there directly,
 * SPLIT_BASE1 or 2 elements in. */
static void bind_split(Program *p, Dispatch *d, Node *n, const MatmulShape *s) {
    /* several batches: C's [batch, M, N] (KILN_STORE_C's rows) */
    if (s->batch != 1 && (s->brank != 1 || s->ops[0].strides[0] != s->M * s->N))
        internal_error("node '%s': a split product with %lld batches", n->name,
                       (long long)s->batch);
    Tensor *a = n->inputs[0];
    /* the parts: n's output and its siblings' (each product's last tensor,
     * its bias add's where it has one), or a gemm's Split's outputs */
    Tensor *part[3] = {n->epi_bias ? n->epi_bias->outputs[0] : n->outputs[0], NULL, NULL};
    int nparts = 1 + n->nsiblings;
    for (int k = 0; k < n->nsiblings; k++) {
        Node *sib = n->siblings[k];
        part[k + 1] = sib->epi_bias ? sib->epi_bias->outputs[0] : sib->outputs[0];
    }
    if (n->split_out) {
        nparts = n->split_out->noutputs;
        for (int k = 0; k < nparts; k++)
            part[k] = n->split_out->outputs[k];
    }
    int64_t n0 = part[0]->shape[part[0]->rank - 1];
    int64_t n1 = part[1]->shape[part[1]->rank - 1];
    define_int(d, "SPLIT_N0", n0);
    define_int(d, "SPLIT_N1", nparts > 2 ? n1 : s->N - n0);
    for (int k = 0; k + 1 < nparts; k++) {
        Tensor *t = part[k + 1];
        Operand region;
        if (append_region(p, t, &region)) {
            define_str(d, format("SPLIT_BASE%d", k + 1),
                       region.dyn_base ? format("uint(%s)", dim_expr_glsl(&region.base_expr, 1))
                                       : format("%lldu", (long long)region.base));
            t = region.t;
        }
        dispatch_arg(d, t, true);
    }
    if (nparts < 3)
        dispatch_unused(d, a);
}

/* The outer batch axis of a product A x B = C that follows the dims
 * (axis 0 of A and C, of one rank, with the same extent, and of B where B
 * has batch axes: B's rank the same), and that is a batch axis (A's rows
 * and contracted axis after it): its extent, else NULL. */
static const DimExpr *outer_batch(const Tensor *a, const Tensor *b, const Tensor *c) {
    if (a->rank < 3 || c->rank != a->rank || !is_dyn(a, 0) || !is_dyn(c, 0) ||
        !dim_expr_eq(&a->ext[0], &c->ext[0]))
        return NULL;
    if (b->rank > 2 && (b->rank != a->rank || (is_dyn(b, 0) && !dim_expr_eq(&b->ext[0],
                                                                            &a->ext[0])) ||
                        (!is_dyn(b, 0) && b->shape[0] != 1)))
        return NULL;
    return &a->ext[0];
}

/* Whether a product of one batch whose A follows the dims along its outer
 * axis and others (its batch folded into the rows: one that
 * batched_dyn_rows leaves out) takes the run's outer blocks of rows only
 * (each block of rows at its largest, a prefix of A's and C's rows). */
static bool outer_rows(const Tensor *a, const Tensor *c) {
    return a->rank >= 3 && c->rank == a->rank && a->shape[0] > 1 && is_dyn(a, 0) &&
           is_dyn(c, 0) && dim_expr_eq(&a->ext[0], &c->ext[0]) && !is_dyn(a, a->rank - 1);
}

/* Whether a batched product's rows follow the dims batch by batch: A's
 * row axis (the one before K) dynamic and no batch axis of A, B or C but
 * an outer one (outer_batch: then the run's batches only); C's rows the
 * same (a QKV split's parts too, each [batch, rows, width] as C's columns
 * of it lie). K may be dynamic too (dyn_k), and C's columns (B's then:
 * computed at their largest). */
static bool batched_dyn_rows(const Tensor *a, const Tensor *b,
                             const Tensor *c) {
    /* an outer batch axis (0) that follows the dims in A and C alike (and
     * in B where B is batched): the run's batches only (outer_batch) */
    uint32_t outer = outer_batch(a, b, c) ? 1u : 0u;
    if (a->rank < 3 || a->dynamic ||
        (a->dyn_axes & ~(1u << (a->rank - 1))) != (1u << (a->rank - 2) | outer) ||
        (c->dyn_axes & ~(1u << (c->rank - 1))) != (1u << (c->rank - 2) | outer) ||
        !dim_expr_eq(&a->ext[a->rank - 2], &c->ext[c->rank - 2]))
        return false;
    return b->rank <= 2 ||
           (b->dyn_axes & ((1u << (b->rank - 2)) - 1)) == (outer & b->dyn_axes);
}

/* A product over a dynamic outer batch of one batch up ([b, seq, K] x
 * [K, N], b from 1; batched_dyn_rows: rows s->dyn in each of the batches
 * s->dyn_batch): runs of one batch take the kernels of the unbatched
 * product of seq rows, as a build with b fixed at 1 takes them (split
 * along K for few rows, matrix-vector for fewer), the others the batched
 * kernels, whose tiles and lack of a split suit many rows. A dim derived
 * here, t = min(b - 1, 1), chooses: the one-batch kernels' rows are seq +
 * most * t (past their most where b > 1: none runs), the batched ones'
 * seq - most * (1 - t) (none runs where b is 1). ext: the two extents,
 * which the dispatches' defines and s->dyn (the batched ones' after this)
 * point to. Returns the first dispatch, the one-batch ones then the
 * batched ones as its variants; NULL where this does not apply (s
 * unchanged). Measured on an H200: BERT-base exported with a dynamic batch
 * and sequence, at b 1 and seq 128 (f32) its FFN output product [128,
 * 3072] x [3072, 768] 218 -> 53 us, split along K as the b = 1 build's
 * (bench/experiments/dynamic-seq-h200.txt). */
static Dispatch *one_batch_dispatch(Program *p, Node *n, MatmulShape *s, DimExpr ext[2]) {
    Graph *g = p->graph;
    /* rows above the matrix-vector kernel's most (which computes them all
     * in fixed work) */
    if (!s->dyn || s->M <= MATVEC_MAX_M || !s->dyn_batch || s->batch_per != 1 ||
        s->brank != 1 || s->dyn_k || s->conv.in[0] || dim_expr_min(g, s->dyn_batch) != 1 ||
        dim_expr_max(g, s->dyn_batch) < 2)
        return NULL;
    DimExpr less = *s->dyn_batch, one = {1, {0}}, t;
    less.c0 -= 1;
    if (!derive_dim(g, DIM_MIN, &less, &one, &t))
        return NULL;
    DimExpr most_t = dim_expr_scale(&t, s->dyn_most);
    ext[0] = dim_expr_add(s->dyn, &most_t);
    ext[1] = ext[0];
    ext[1].c0 -= s->dyn_most;
    MatmulShape one_batch = *s;
    one_batch.batch = 1;
    one_batch.bshape[0] = 1;
    for (int i = 0; i < 3; i++)
        one_batch.ops[i].strides[0] = 0;
    one_batch.dyn_batch = NULL;
    one_batch.batch_per = 0;
    one_batch.dyn = &ext[0];
    int start = p->ndispatches;
    Dispatch *first = matmul_dispatch(p, n, &one_batch);
    for (int i = start; i < p->ndispatches; i++) { /* none past the most rows */
        Dispatch *d = p->dispatches[i];
        if (!d->dynamic)
            internal_error("node '%s': a one-batch kernel of fixed work", n->name);
        int64_t cap = s->dyn_most * d->scale;
        d->work_max = d->work_max < cap ? d->work_max : cap;
    }
    Dispatch *last = first;
    while (last->variant)
        last = last->variant;
    s->dyn = &ext[1];
    last->variant = matmul_dispatch(p, n, s);
    return first;
}

void lower_matmul(Program *p, Node *n) {
    Tensor *a = n->inputs[0], *b = n->inputs[1], *out = n->outputs[0];
    MatmulShape s = {0};
    s.K = a->shape[a->rank - 1];
    s.M = a->rank >= 2 ? a->shape[a->rank - 2] : 1;
    s.N = b->rank >= 2 ? b->shape[b->rank - 1] : 1;
    s.a_sm = s.K;
    s.a_sk = 1;
    s.b_sk = b->rank >= 2 ? s.N : 1;
    s.b_sn = 1;
    /* Batch dimensions of the output and each operand's strides over them
     * (stride 0 where broadcast). */
    s.brank = out->rank - (a->rank >= 2) - (b->rank >= 2);
    s.ops[0] = (Operand){out, {0}, 0, false, {0, {0}}};
    s.ops[1] = (Operand){a, {0}, 0, false, {0, {0}}};
    s.ops[2] = (Operand){b, {0}, 0, false, {0, {0}}};
    memcpy(s.bshape, out->shape, sizeof(int64_t) * (size_t)s.brank);
    int64_t sa = s.M * s.K, sb = s.K * s.N, so = s.M * s.N;
    for (int i = s.brank - 1; i >= 0; i--) {
        int ja = i - (s.brank - (a->rank - 2)), jb = i - (s.brank - (b->rank - 2));
        s.ops[0].strides[i] = so;
        so *= s.bshape[i];
        if (a->rank > 2 && ja >= 0 && a->shape[ja] == s.bshape[i]) {
            s.ops[1].strides[i] = sa;
            sa *= s.bshape[i];
        }
        if (b->rank > 2 && jb >= 0 && b->shape[jb] == s.bshape[i]) {
            s.ops[2].strides[i] = sb;
            sb *= s.bshape[i];
        }
    }
    s.batch = shape_count(s.brank, s.bshape);
    s.brank = collapse(s.brank, s.bshape, 3, s.ops);
    /* Rows that follow the dims in each of several batches: A's row axis
     * (as [2, seq, K] x [K, N], two batches of seq rows at their largest
     * strides), not folded into M, where its rows would be no prefix. */
    bool batch_rows = batched_dyn_rows(a, b, out);
    /* A shared B and an unbroadcast A: fold the batch into M. */
    if (!batch_rows && s.brank == 1 && s.ops[2].strides[0] == 0 &&
        s.ops[1].strides[0] == s.M * s.K && a->rank >= 2) {
        s.M *= s.bshape[0];
        s.batch = 1;
        s.bshape[0] = 1;
        s.ops[0].strides[0] = s.ops[1].strides[0] = 0;
    }
    /* A fused epilogue (optimize.c): the dispatch writes the last tensor of
     * the group, adding a per-column (or, unbatched, per-element) bias and
     * applying the activation. */
    Node *last = n->epi_act ? n->epi_act : n->epi_bias;
    if (last)
        s.ops[0].t = last->outputs[0];
    /* Rows follow A's prefix extent in one batch, or its row axis in each
     * batch (above); other products with a dynamic A compute their largest
     * shape. */
    if (s.batch == 1 && a->dynamic)
        follow_rows(&s, a, a->dyn_axis);
    else if (s.batch == 1 && outer_rows(a, out))
        follow_rows(&s, a, 0);
    else if (batch_rows && s.batch > 1)
        follow_rows(&s, a, a->rank - 2);
    if (batch_rows && s.batch > 1 && outer_batch(a, b, out)) {
        s.dyn_batch = outer_batch(a, b, out);
        s.batch_per = s.batch / out->shape[0];
    }
    if (is_dyn(a, a->rank - 1))
        s.dyn_k = &a->ext[a->rank - 1];
    DimExpr one_batch_ext[2];
    Dispatch *first = one_batch_dispatch(p, n, &s, one_batch_ext);
    if (!first)
        first = matmul_dispatch(p, n, &s);
    for (Dispatch *d = first; d; d = d->variant) {
        if (n->epi_act)
            define_str(d, "ACT(x)", activation_expr(op_info[n->epi_act->op].name));
        Tensor *bias = NULL;
        Operand bo = whole(a);
        if (n->qkv_bias) { /* a QKV split's biases side by side */
            bias = n->qkv_bias;
            bo = broadcast(bias, 2, (int64_t[]){s.M, s.N});
        } else if (n->epi_bias) {
            bias = other_input(n->epi_bias, out);
            bo = broadcast(bias, 2, (int64_t[]){s.M, s.N});
            if (bias->rank >= 2 && bias->shape[bias->rank - 2] != 1)
                bo = broadcast(bias, 2, (int64_t[]){out->shape[out->rank - 2], s.N});
        }
        bind_bias(d, bias, bo, 1.0, a);
        bind_weight_scales(d, n, n->nsiblings != 0);
        if (n->nsiblings)
            bind_split(p, d, n, &s);
    }
}

/* A fused epilogue's activation over its float accumulator x: the named
 * ACTIVATION row's expression (ops.def) with the operand a as x and the
 * compute type CT as float; "(x)" for none. */
static const char *activation_name(void *ctx, const char *ident) {
    (void)ctx;
    return strcmp(ident, "a") == 0 ? "(x)" : strcmp(ident, "CT") == 0 ? "float" : NULL;
}

const char *activation_expr(const char *name) {
    int op = activation_lookup(name);
    if (op < 0)
        internal_error("activation '%s' is not an ACTIVATION row of ops.def", name);
    if (op == OP_COUNT)
        return "(x)";
    const char *e = op_info[op].expr, *bar = strchr(e, '#'); /* the float variant */
    return rewrite_identifiers(bar ? format("%.*s", (int)(bar - e), e) : e, activation_name,
                               NULL);
}

/* One product C [M, N] = op(A) op(B) of whole 2-D tensors, op a transpose
 * when ta / tb; A's rows dynamic when A is. */
MatmulShape matrix_product(Tensor *c, Tensor *a, Tensor *b, int64_t M, int64_t N,
                           int64_t K, bool ta, bool tb) {
    MatmulShape s = {0};
    s.M = M;
    s.N = N;
    s.K = K;
    s.a_sm = ta ? 1 : K;
    s.a_sk = ta ? M : 1;
    s.b_sk = tb ? 1 : N;
    s.b_sn = tb ? K : 1;
    s.batch = 1;
    s.brank = 1;
    s.bshape[0] = 1;
    s.ops[0] = (Operand){c, {0}, 0, false, {0, {0}}};
    s.ops[1] = (Operand){a, {0}, 0, false, {0, {0}}};
    s.ops[2] = (Operand){b, {0}, 0, false, {0, {0}}};
    if (a->dynamic)
        follow_rows(&s, a, a->dyn_axis);
    return s;
}

/* gemm: Y = act(alpha * op(A) op(B) + beta * C), op a transpose when asked;
 * the transposes are strides, bias and activation the matmul's epilogue
 * (the activation its own, or one fused after it: epi_act, optimize.c). */
void lower_gemm(Program *p, Node *n) {
    Tensor *a = n->inputs[0], *b = n->inputs[1], *y = n->outputs[0];
    Tensor *out = n->epi_act ? n->epi_act->outputs[0]
                  : n->split_out ? n->split_out->outputs[0] : y;
    bool ta = attr_int(n, "trans_a") != 0, tb = attr_int(n, "trans_b") != 0;
    MatmulShape s = matrix_product(out, a, b, y->shape[0], y->shape[1],
                                   ta ? a->shape[0] : a->shape[1], ta, tb);
    Attr *act = node_attr(n, "activation");
    const char *act_name = n->epi_act ? op_info[n->epi_act->op].name
                                      : act ? act->scalar : "none";
    for (Dispatch *d = matmul_dispatch(p, n, &s); d; d = d->variant) {
        define_float(d, "ALPHA", attr_float(n, "alpha"));
        define_str(d, "ACT(x)", activation_expr(act_name));
        Tensor *c = n->ninputs > 2 ? n->inputs[2] : NULL;
        bind_bias(d, c, c ? broadcast(c, 2, y->shape) : whole(a),
                  attr_float(n, "beta"), a);
        bind_weight_scales(d, n, n->split_out != NULL);
        if (n->split_out)
            bind_split(p, d, n, &s);
    }
}

/* grouped_matmul: grouped.comp, NCOL columns of GROUPED_RB rows a workgroup
 * (NCOL x KSPLIT invocations), each row reading its own expert's matrix. */
#define GROUPED_RB 4
#define GROUPED_NCOL 32
#define GROUPED_KSPLIT 8

void lower_grouped_matmul(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *w = n->inputs[1], *idx = n->inputs[2], *y = n->outputs[0];
    int64_t K = w->shape[1], N = w->shape[2], M = tensor_count(idx);
    if (M * N == 0)
        return;
    Dispatch *d = new_dispatch(p, n, "grouped");
    bool need[3] = {false, false, false};
    need_dtype(p, need, idx->dtype);
    define_needs(d, need);
    d->local_size = GROUPED_NCOL * GROUPED_KSPLIT;
    define_int(d, "M", M);
    define_int(d, "N", N);
    define_int(d, "K", K);
    define_int(d, "E", w->shape[0]);
    define_int(d, "RB", GROUPED_RB);
    define_int(d, "NCOL", GROUPED_NCOL);
    define_int(d, "KSPLIT", GROUPED_KSPLIT);
    define_str(d, "TIDX", buffer_type(idx->dtype, true));
    dispatch_arg(d, y, true);
    dispatch_arg(d, x, false);
    dispatch_arg(d, w, false);
    dispatch_arg(d, idx, false);
    if (n->ninputs > 3) {
        define_int(d, "HAS_BIAS", 1);
        dispatch_arg(d, n->inputs[3], false);
    } else {
        dispatch_unused(d, x);
    }
    d->flops = 2ull * (uint64_t)(M * N) * (uint64_t)K;
    d->groups[0] = groups_for(N, GROUPED_NCOL);
    d->groups[1] = groups_for(M, GROUPED_RB);
}

/* det: one invocation per matrix, Gaussian elimination with partial
 * pivoting on a copy in a scratch tensor. */
void lower_det(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *y = n->outputs[0];
    int64_t M = x->shape[x->rank - 1], count = tensor_count(y);
    if (count == 0)
        return;
    Tensor *work = scratch(p, n, "lu", 2, (int64_t[]){count, M * M});
    Dispatch *d = new_dispatch(p, n, "det");
    d->local_size = 64;
    define_int(d, "WG", d->local_size);
    define_int(d, "COUNT", count);
    define_int(d, "M", M);
    dispatch_arg(d, y, true);
    dispatch_arg(d, x, false);
    dispatch_arg(d, work, true);
    d->groups[0] = groups_for(count, d->local_size);
    d->flops = (uint64_t)count * (uint64_t)(M * M * M) * 2 / 3;
}
