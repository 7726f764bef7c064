/*
 * matmul.h: what the matrix-product files share. lower_matmul.c (the ops,
 * and which kernel a product gets: matmul_dispatch) calls the kernels'
 * files: matmul_coopmat.c (cooperative matrices for f16, the tiled kernel
 * recorded as their variant), matmul_tiled.c (matmul.comp, its split along
 * K; its matmul_kernel binds matvec.comp too) and, through it,
 * matmul_matvec.c (the kernels for few rows); all of them use
 * matmul_common.c (the defines every product kernel shares). Each calls
 * only files after it in that order: the dependencies run one way. Each
 * section is named after the file that defines it; the comments at the
 * definitions say how each kernel was chosen and measured.
 */
#ifndef KILN_MATMUL_H
#define KILN_MATMUL_H

#include "lower.h"

/* ---- matmul_common.c --------------------------------------------------- */

/* A product's rows at the run's extent, in GLSL (the constant M when they
 * are fixed). */
char *rows_glsl(const MatmulShape *s);
/* groups[1] of d following s's rows where they follow the dims, per_group
 * rows a group. */
void rows_groups(Dispatch *d, const MatmulShape *s, int64_t per_group);
/* Whether s's extent follows the dims: its rows, or a convolution's
 * images. */
bool follows_dims(const MatmulShape *s);
/* A convolution over a dynamic batch of images: N_RUN, and groups[0] of d
 * following its columns, per_group columns a group. */
void cols_groups(Dispatch *d, const MatmulShape *s, int64_t per_group);
/* The defines every matmul kernel shares but M. */
void define_product(Dispatch *d, const MatmulShape *s);
/* A convolution's defines (product.glsl); partial: the kernel writes a
 * split's partial products, not C. */
void define_conv(Dispatch *d, const MatmulShape *s, bool partial);
/* The residual's type (RES_F16), its storage features recorded in need. */
void define_res_type(Program *p, Dispatch *d, bool *need, const MatmulShape *s);
/* The format kernels read B in (weights.glsl's W_FORMAT): n's encoded
 * one where quantize.c made n->wq (whatever B's own dtype), else f16 for
 * an f16 B, else n->wformat. */
int b_weight_format(const Node *n, const MatmulShape *s);
/* The operand types' defines (A_F16, C_F16) and storage features. */
void define_operand_types(Program *p, Dispatch *d, const MatmulShape *s);
/* s at `units` of what follows the dims (its rows, or a convolution's
 * images). */
MatmulShape shape_at(const MatmulShape *s, int64_t units);
/* d, whose groups follow s's rows, runs only for lo to hi rows. */
void for_rows(Dispatch *d, const MatmulShape *s, int64_t lo, int64_t hi);

/* ---- matmul_matvec.c --------------------------------------------------- */

/* matvec.comp's layout: NCOL column lanes by KSPLIT splits of K, VEC
 * columns a lane (4: vec4s of B), A's rows as vec4s (AVEC), the partial
 * sums of MC rows at a time in shared memory. */
typedef struct MatvecShape {
    int64_t ncol, ksplit, vec, avec, mc;
} MatvecShape;

/* matvec.comp's layout for s at `rows` rows (its arrays' size). */
MatvecShape matvec_shape(const Node *n, const MatmulShape *s, int64_t rows);
/* Whether matvec_k.comp can compute s (B K-major in whole chunks along K);
 * an internal error where n's weight is stored K-major and it cannot. */
bool kmajor_shape(const Node *n, MatmulShape *s);
/* matvec_k.comp for s (kmajor_shape holds), rows up to mrows. */
Dispatch *matvec_k_kernel(Program *p, Node *n, const MatmulShape *s, int64_t mrows);

/* ---- matmul_tiled.c ---------------------------------------------------- */

/* A tiled product's tiles: BM x BN of C a workgroup, TM x TN of them an
 * invocation, K in steps of BK. */
typedef struct Tiles {
    int64_t bm, bn, tm, tn, bk;
} Tiles;

/* Whether matmul.comp reads both of s's operands as vec4s. */
bool matmul_vec4_shape(const Node *n, const MatmulShape *s);
/* Whether convolution s takes pick_tiles' 64 x 128 tiles of 8 x 4. */
bool conv_narrow(const MatmulShape *s);
/* matmul.comp's tiles for s (wide: 128 x 256, for devices with 48 KiB of
 * shared memory). */
Tiles pick_tiles(const Node *n, const MatmulShape *s, bool wide);
/* One kernel for s: matvec_k.comp or matvec.comp where matvec (rows up to
 * mrows), else matmul.comp, on wide tiles where wide, over K in chunks of
 * kchunk where it is not 0 (the partial products in s's C). */
Dispatch *matmul_kernel(Program *p, Node *n, MatmulShape *s, bool matvec, int64_t mrows,
                        bool wide, int64_t kchunk);
/* Whether a product split along K has each tile's last workgroup add the
 * chunks up (KILN_SPLIT_LAST=1), not splitk.comp. */
bool split_in_last(const Node *n);
/* The most chunks of K a split of s may take within its scratch budget,
 * at least 1. */
int64_t split_scratch_cap(const MatmulShape *s);
/* The split count of least model time for s on tiles t, K in `steps`
 * steps, that time in *ns. */
int64_t best_split(const MatmulShape *s, Tiles t, int64_t steps, double *ns);
/* The chunk of K the cost model gives s on tiles t, or 0 for no split. */
int64_t split_chunk(const MatmulShape *s, Tiles t);
/* s split along K in chunks of kchunk; returns the dispatch that writes C,
 * whose epilogue its callers bind. */
Dispatch *split_product(Program *p, Node *n, MatmulShape *s, int64_t kchunk);
/* splitk.comp: C from the [splits, M, N] partial products of s. */
Dispatch *splitk_sum(Program *p, Node *n, const MatmulShape *s, Tensor *partial,
                     int64_t splits);
/* A split product's dispatch d adds its chunks in each tile's last
 * workgroup: binds the scratch `partial` and the tiles' counters. */
void bind_split_last(Program *p, Dispatch *d, Tensor *partial);
/* The tile rows (MatmulShape.tile_rows) for the few-rows variant few. */
int64_t few_rows_tiles(const Node *n, const MatmulShape *few);

/* ---- matmul_coopmat.c -------------------------------------------------- */

#define COOPMAT_GROUPS 264 /* two workgroups per multiprocessor of an H200 */

/* Why coopmat.comp does not apply to s ("A is not f16", ...), or NULL
 * where it does: coopmat_takes. */
const char *coopmat_refusal(const Node *n, const MatmulShape *s);
/* Whether coopmat.comp applies to s. */
bool coopmat_takes(const Node *n, const MatmulShape *s);
/* coopmat.comp for s, or NULL where it does not apply; returns the
 * dispatch that writes C. */
Dispatch *coopmat_kernel(Program *p, Node *n, MatmulShape *s);
/* coopmat_wg.comp for s, or NULL where it does not apply. */
Dispatch *coopmat_wg_kernel(Program *p, Node *n, MatmulShape *s);
/* coopmat.comp's dispatch cm with the tiled kernel as its variant for
 * devices without cooperative matrices; returns cm. */
Dispatch *with_tiled_variant(Program *p, Node *n, MatmulShape *s, Dispatch *cm);
/* The few-rows variants of s on coopmat.comp for runs of lo to hi rows;
 * returns the first sum, the rest its variants. */
Dispatch *coopmat_few_rows(Program *p, Node *n, const MatmulShape *s, int64_t lo,
                           int64_t hi);

#endif
