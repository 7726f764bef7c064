/*
 * matmul_tiled.c: the tiled kernel (matmul.comp): its tiles, its vec4 and
 * K-major paths, its split along K (the cost model; the chunks added by
 * the tiles' last workgroups or splitk.comp); matmul_kernel binds
 * matvec.comp too.
 */
#include "matmul.h"

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

/* Whether matmul.comp's VEC4 path (two stages of K in shared memory) can
 * take s: A f32 or f16, B f32 or f16 as given or stored f16 (--weights f16),
 * not quantized and not K-major. The arithmetic is f32 either way; f16
 * operands load as four halves at a time (kiln_half4). Inside the op sweep
 * on an H100 (2026-12-07) the f16 batch of [192, 49, 32] products took 78
 * us loading one element at a time where f32 took 9.6 on this path. */
static bool matmul_vec4_types(const Node *n, const MatmulShape *s) {
    kiln_dtype a = s->ops[1].t->dtype, b = s->ops[2].t->dtype;
    const char *f16 = getenv("KILN_MATMUL_F16_VEC4"); /* 0: f16 element by element */
    bool half = a == KILN_DTYPE_F16 || b == KILN_DTYPE_F16 || n->wformat == WF_F16;
    if (half && f16 && strcmp(f16, "0") == 0)
        return false;
    bool a_ok = a == KILN_DTYPE_F32 || a == KILN_DTYPE_F16;
    bool b_ok = n->wformat == WF_F32 ? b == KILN_DTYPE_F32 || b == KILN_DTYPE_F16
                                     : n->wformat == WF_F16 && !n->wkmajor;
    return a_ok && b_ok;
}

/* Whether it reads s's A as vec4s: rows contiguous and 16-byte aligned,
 * and K fixed (a vec4 across a run's last k would read don't-care
 * elements, which B's zero rows past K would not cancel if they are not
 * finite). */
static bool matmul_a4(const Node *n, const MatmulShape *s) {
    return matmul_vec4_types(n, s) && !s->dyn_k && s->a_sk == 1 && s->K % 4 == 0 &&
           s->a_sm % 4 == 0 &&
           all_multiples(s->brank, s->ops[1].strides, 4);
}

/* And B (not a convolution's input, which it gathers one by one; a 1 x 1
 * convolution's images where each has a multiple of 4 positions). */
static bool matmul_b4(const Node *n, const MatmulShape *s) {
    return matmul_vec4_types(n, s) && !s->conv.in[0] && s->b_sn == 1 && s->N % 4 == 0 &&
           s->b_sk % 4 == 0 && all_multiples(s->brank, s->ops[2].strides, 4) &&
           s->conv.positions % 4 == 0;
}

/* Both as vec4s: the shapes the larger tiles are chosen for. */
bool matmul_vec4_shape(const Node *n, const MatmulShape *s) {
    return matmul_a4(n, s) && matmul_b4(n, s);
}

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
bool conv_narrow(const MatmulShape *s) {
    return s->conv.images > 1 && (s->M <= 64 || (!s->conv.in[0] && s->M <= 1024)) &&
           groups_for(s->M, 64) * groups_for(s->N, 128) >= 128;
}

/* matmul.comp's tiles for s (wide: the 128 x 256 ones, see
 * matmul_dispatch). */
Tiles pick_tiles(const Node *n, const MatmulShape *s, bool wide) {
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
Dispatch *matmul_kernel(Program *p, Node *n, MatmulShape *s, bool matvec,
                        int64_t mrows, bool wide, int64_t kchunk) {
    if (matvec && kmajor_shape(n, s))
        return matvec_k_kernel(p, n, s, mrows);
    if (n->wkmajor && !s->dyn) /* only a dynamic decode product's tiled variant */
        internal_error("node '%s': a K-major weight on the tiled kernel", n->name);
    Tiles tiles = pick_tiles(n, s, wide);
    int64_t splits = kchunk ? (s->K + kchunk - 1) / kchunk : 1;
    int64_t bm = tiles.bm, bn = tiles.bn, tm = tiles.tm, tn = tiles.tn, bk = tiles.bk;
    /* The VEC4 path: f32 or f16 operands, blocks of 4 x 4 per invocation
     * or more, whole vec4s per invocation in each K step's loads, two
     * stages in shared memory. An operand that cannot take vec4s (unaligned rows, a
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
    bool vec4 = !matvec && matmul_vec4_types(n, s) && tm % 4 == 0 && tn % 4 == 0 &&
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
    if (!n->wq && s->ops[2].t->dtype == KILN_DTYPE_F16) {
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

/* Whether a product split along K has each tile's last workgroup add the
 * chunks up (split_last: no second dispatch, no barrier before it), or
 * splitk.comp after it: splitk.comp, unless KILN_SPLIT_LAST=1 asks for the
 * last workgroups (products but convolutions; for comparison). Measured on
 * an H200 (bench/MODELS.md, 2026-11-27, host to host, in one run): the last
 * workgroups' sums made GPT-2 f16 0.86 -> 0.97 ms and f32 1.65 -> 1.80,
 * BERT-base f16 0.87 -> 1.00 and f32 1.65 -> 1.86, for 48 dispatches and
 * barriers fewer; in ResNet-50 at f16 (convolutions split 8 to 32 ways)
 * 0.75 -> 0.94 ms. */
bool split_in_last(const Node *n) {
    const char *v = getenv("KILN_SPLIT_LAST");
    return n->op != OP_CONV && v && strcmp(v, "1") == 0;
}

/* A convolution over a dynamic batch of images splits K for its fewest
 * images; its partial products, [splits, M, N] f32 at the most images,
 * stay within SPLIT_SCRATCH bytes (a split of ResNet-50's third stage for
 * one image would otherwise take 200 MiB at 32). The most chunks that
 * allows, at least 1. */
#define SPLIT_SCRATCH (64ll << 20)
int64_t split_scratch_cap(const MatmulShape *s) {
    int64_t one = s->M * s->N * 4;
    return one >= SPLIT_SCRATCH ? 1 : SPLIT_SCRATCH / one;
}

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
int64_t best_split(const MatmulShape *s, Tiles t, int64_t steps, double *ns) {
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
int64_t split_chunk(const MatmulShape *s, Tiles t) {
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
Dispatch *split_product(Program *p, Node *n, MatmulShape *s, int64_t kchunk) {
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
Dispatch *splitk_sum(Program *p, Node *n, const MatmulShape *s, Tensor *partial,
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
void bind_split_last(Program *p, Dispatch *d, Tensor *partial) {
    if (d->groups[0] == MAX_GROUPS || d->groups[1] == MAX_GROUPS)
        internal_error("a product split along K with %u x %u tiles", d->groups[0],
                       d->groups[1]);
    define_int(d, "SPLIT_LAST", 1);
    dispatch_arg(d, partial, true);
    bind_counters(p, d, (int64_t)d->groups[0] * d->groups[1]);
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
int64_t few_rows_tiles(const Node *n, const MatmulShape *few) {
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
