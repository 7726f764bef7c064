/*
 * matmul_coopmat.c: the cooperative-matrix kernels for f16 products:
 * coopmat.comp (subgroup scope; split along K where its tiles leave the GPU
 * idle, and its few-rows variants) and coopmat_wg.comp (workgroup scope),
 * with the tiled kernel as the variant for devices without them.
 */
#include "matmul.h"

#include <stdlib.h>

/* coopmat.comp's shared memory: ns stages of the A tile (bm rows of bk
 * halves) and the B tile (bn columns or bk rows, padded by a vector), and
 * a 16 x 16 f32 staging area a subgroup. */
static int64_t coopmat_shared_bytes(int64_t bm, int64_t bn, int64_t bk, int64_t subgroups,
                                    int64_t ns, bool b_cols) {
    int64_t a = bm * (bk / 8 + 1), b = b_cols ? bn * (bk / 8 + 1) : bk * (bn / 8 + 1);
    return 16 * ns * (a + b) + 1024 * subgroups;
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
const char *coopmat_refusal(const Node *n, const MatmulShape *s) {
    /* a decoder's weight stored f16 K-major (quantize.c): B is that copy */
    bool f16_kmajor = n->wkmajor && n->wq && n->wformat == WF_F16;
    const Tensor *a = s->ops[1].t, *b = f16_kmajor ? n->wq : s->ops[2].t;
    bool conv = n->op == OP_CONV;
    if (a->dtype != KILN_DTYPE_F16)
        return "A is not f16";
    if (n->wq && !f16_kmajor)
        return "B is encoded (--weights)";
    if (s->dyn_k)
        return "K follows the dims";
    if (s->batch > 1 && s->M <= 64 && s->N <= 64 && !conv)
        return "a batch of products of at most 64 x 64: one fragment row a subgroup";
    if (s->M <= MATVEC_MAX_M)
        return "few rows";
    if (s->a_sk != 1)
        return "A's rows are not contiguous";
    if (b->dtype != KILN_DTYPE_F16 && !conv)
        return "B is not f16";
    if (!(s->b_sn == 1 || conv || f16_kmajor || b_kmajor(n, s)))
        return "B is contiguous along neither N nor K";
    return NULL;
}

bool coopmat_takes(const Node *n, const MatmulShape *s) { return !coopmat_refusal(n, s); }

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

/* A product split along K whose chunks' sum its caller makes (the
 * few-rows variants, few_rows_split): the partial products' scratch (NULL
 * for the kernel to make one) and the chunks. */
typedef struct SplitParts {
    Tensor *partial;
    int64_t splits;
} SplitParts;

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
Dispatch *coopmat_kernel(Program *p, Node *n, MatmulShape *s) {
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
Dispatch *coopmat_wg_kernel(Program *p, Node *n, MatmulShape *s) {
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
Dispatch *with_tiled_variant(Program *p, Node *n, MatmulShape *s, Dispatch *cm) {
    cm->variant = matmul_kernel(p, n, s, false, 0, false, 0);
    cm->variant->unless = KILN_FEATURE_COOPMAT;
    return cm;
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
Dispatch *coopmat_few_rows(Program *p, Node *n, const MatmulShape *s, int64_t lo,
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
