/*
 * quantize.c: matmul weights in a smaller format (kiln compile --weights).
 *
 * Runs after optimize. The B operand of a live matmul or gemm that is an
 * f32 weight of rank 2, read by nothing else, is re-encoded here; the node
 * keeps its inputs (shapes and strides stay those of the f32 tensor) and
 * records the new weight tensors in wq, wscale, wzero, which lowering binds
 * instead of B and which shaders/weights.glsl turns back into f32 where the
 * matmul loads them. The f32 tensor is then read by no dispatch, so
 * plan_memory leaves it out of the weight buffer.
 *
 * Formats (docs/cli.md, "Weight formats", gives the error of each):
 *   f16        round to nearest even;
 *   int8       per block of QUANT_BLOCK consecutive k of one column n:
 *              s = max|w| / 127, q = rint(w / s) in [-127, 127];
 *   int8-asym  lo = min(w, 0), hi = max(w, 0), s = (hi - lo) / 255,
 *              z = rint(-lo / s), q = rint(w / s) + z, both in [0, 255];
 *   int4       s = max|w| / 7, q in [-8, 7], two per byte, low nibble first;
 *   int4-asym  s = (hi - lo) / 15, z and q in [0, 15];
 *   fp8-e4m3   s = max|w| / 448, q the nearest e4m3 (FN) value to w / s;
 *   fp8-e5m2   s = max|w| / 57344, q the nearest e5m2 value.
 * Scales are f32 ([ceil(K / QUANT_BLOCK), N]); zero points one byte each,
 * same index. Every rounding is done in double on the stored f32 scale, so
 * that a reference written from this description gets the same bytes.
 *
 * A weight that arrived as 8-bit codes (Tensor.quant: an ONNX
 * DequantizeLinear of a constant) keeps them without --weights, where its
 * layout fits: every block of QUANT_BLOCK k of one column sharing one scale
 * and zero point (a scale per output column, or ONNX blocks along K of a
 * multiple of QUANT_BLOCK). int8 codes with zero points of 0 are int8;
 * others int8-asym (int8 codes and zero points moved up by 128). The
 * kernels then compute with exactly the values the f32 weight holds.
 */
#include "kiln.h"

#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

const char *const weight_format_names[WF_COUNT] = {
    "f32", "f16", "int8", "int8-asym", "int4", "int4-asym", "fp8-e4m3", "fp8-e5m2"};

/* The fp8 value of code q (sign in bit 7) with ebits exponent bits. */
static double fp8_value(unsigned q, int ebits) {
    int mbits = 7 - ebits, bias = (1 << (ebits - 1)) - 1;
    unsigned e = (q >> mbits) & ((1u << ebits) - 1u), m = q & ((1u << mbits) - 1u);
    double mag = e == 0 ? ldexp((double)m, 1 - bias - mbits)
                        : ldexp((double)(m + (1u << mbits)), (int)e - bias - mbits);
    return (q & 128u) ? -mag : mag;
}

/* The nearest finite fp8 code to v (ties to the even code); v is within
 * the format's range by construction of the scale. */
static unsigned fp8_encode(double v, int ebits) {
    unsigned top = ebits == 4 ? 126u : 123u; /* the largest finite magnitude */
    double a = fabs(v);
    unsigned lo = 0, hi = top;
    if (a >= fp8_value(top, ebits)) {
        lo = top;
    } else {
        while (hi - lo > 1) { /* magnitudes grow with the code */
            unsigned mid = (lo + hi) / 2;
            if (fp8_value(mid, ebits) <= a)
                lo = mid;
            else
                hi = mid;
        }
        double dl = a - fp8_value(lo, ebits), dh = fp8_value(hi, ebits) - a;
        if (dh < dl || (dh == dl && (hi & 1u) == 0))
            lo = hi;
    }
    return lo | (v < 0 && lo ? 128u : 0u);
}

static double clampd(double v, double lo, double hi) { return v < lo ? lo : v > hi ? hi : v; }

static Tensor *new_weight(Graph *g, const Tensor *from, const char *suffix, kiln_dtype dt,
                          int64_t count) {
    Tensor *t = graph_tensor(g, format("%s%s", from->name, suffix), T_WEIGHT, from->loc);
    t->dtype = dt;
    t->rank = 1;
    t->shape[0] = count;
    t->data = xcalloc((size_t)tensor_bytes(t) + 4, 1);
    return t;
}

bool matvec_k_off(void) {
    const char *v = getenv("KILN_MATVEC_K");
    return v && strcmp(v, "0") == 0;
}

int64_t weight_chunk(int f) {
    return f == WF_F32 ? 4 : f == WF_F16 ? 8 : f == WF_INT4 || f == WF_INT4_ASYM ? 32 : 16;
}

/* Where element (k, col) of B (K x N) goes in n's encoded weight: B's own
 * order (k * sk + col * sn), or K-major (n->wkmajor); and its block's scale. */
static int64_t dst_index(const Node *n, int64_t K, int64_t k, int64_t col, int64_t sk,
                         int64_t sn) {
    return n->wkmajor ? col * K + k : k * sk + col * sn;
}

static int64_t scale_index(const Node *n, int64_t K, int64_t N, int64_t blk, int64_t col) {
    return n->wkmajor ? col * ((K + QUANT_BLOCK - 1) / QUANT_BLOCK) + blk : blk * N + col;
}

/* Columns and rows of B a tile of encode's loops: a K-major copy reads B
 * row-major and writes it column-major; within a tile both stay in the
 * cache. */
#define ENCODE_TILE 64

/* One encoding of B: what copy_columns and quantize_columns need. */
typedef struct Encoding {
    Node *n;
    const Tensor *b;
    int64_t K, N, sk, sn, nb;
    WeightFormat f;
    double levels;
} Encoding;

/* The K-major copy (f32, or halves) of B's columns [c0, c1). */
static void copy_columns(const Encoding *e, int64_t c0, int64_t c1) {
    Node *n = e->n;
    const Tensor *b = e->b;
    bool bits = e->f == WF_F16 && b->dtype == KILN_DTYPE_F16;
    for (int64_t k0 = 0; k0 < e->K; k0 += ENCODE_TILE)
        for (int64_t k = k0; k < e->K && k < k0 + ENCODE_TILE; k++)
            for (int64_t col = c0; col < c1; col++) {
                int64_t i = k * e->sk + col * e->sn, o = dst_index(n, e->K, k, col, e->sk, e->sn);
                if (bits) {
                    memcpy(n->wq->data + 2 * o, b->data + 2 * i, 2);
                } else if (e->f == WF_F32) {
                    float w = weight_float(b, i);
                    memcpy(n->wq->data + 4 * o, &w, 4);
                } else {
                    uint16_t h = float_to_half(weight_float(b, i));
                    memcpy(n->wq->data + 2 * o, &h, 2);
                }
            }
}

/* The codes, scales (and zero points) of B's columns [c0, c1). */
static void quantize_columns(const Encoding *e, int64_t c0, int64_t c1) {
    Node *n = e->n;
    const Tensor *b = e->b;
    WeightFormat f = e->f;
    int64_t K = e->K, N = e->N, sk = e->sk, sn = e->sn;
    bool int4 = f == WF_INT4 || f == WF_INT4_ASYM;
    bool asym = f == WF_INT8_ASYM || f == WF_INT4_ASYM;
    double levels = e->levels;
    for (int64_t blk = 0; blk < e->nb; blk++)
        for (int64_t col = c0; col < c1; col++) {
            int64_t k0 = blk * QUANT_BLOCK, k1 = k0 + QUANT_BLOCK < K ? k0 + QUANT_BLOCK : K;
            double lo = 0, hi = 0, amax = 0;
            for (int64_t k = k0; k < k1; k++) {
                float w = weight_float(b, k * sk + col * sn);
                lo = w < lo ? w : lo;
                hi = w > hi ? w : hi;
                amax = fabs((double)w) > amax ? fabs((double)w) : amax;
            }
            float s = (float)((asym ? hi - lo : amax) / levels);
            double z = 0;
            if (asym && s > 0)
                z = clampd(rint(-lo / s), 0, levels);
            int64_t si = scale_index(n, K, N, blk, col);
            memcpy(n->wscale->data + 4 * si, &s, 4);
            if (asym)
                n->wzero->data[si] = (uint8_t)z;
            for (int64_t k = k0; k < k1; k++) {
                int64_t i = k * sk + col * sn, o = dst_index(n, K, k, col, sk, sn);
                double v = s > 0 ? (double)weight_float(b, i) / s : 0;
                unsigned q;
                if (f == WF_FP8_E4M3 || f == WF_FP8_E5M2)
                    q = fp8_encode(v, f == WF_FP8_E4M3 ? 4 : 5);
                else if (asym)
                    q = (unsigned)clampd(rint(v) + z, 0, levels);
                else
                    q = (unsigned)(int)clampd(rint(v), -levels - 1, levels) & (int4 ? 15u : 255u);
                if (int4)
                    n->wq->data[o / 2] |= (uint8_t)(q << (4 * (o & 1)));
                else
                    n->wq->data[o] = (uint8_t)q;
            }
        }
}

/* A stripe of the tiles of columns (run_striped). */
static void encode_tiles(void *ctx, int index, int threads) {
    const Encoding *e = ctx;
    for (int64_t c0 = (int64_t)index * ENCODE_TILE; c0 < e->N;
         c0 += (int64_t)threads * ENCODE_TILE) {
        int64_t c1 = c0 + ENCODE_TILE < e->N ? c0 + ENCODE_TILE : e->N;
        if (e->f == WF_F32 || e->f == WF_F16)
            copy_columns(e, c0, c1);
        else
            quantize_columns(e, c0, c1);
    }
}

/* Encodes B (K x N, element (k, n) at k * sk + n * sn; f32, or f16) in
 * format f (f32: a K-major copy; f16: a K-major copy in halves, an f16
 * B's bits as they are), tiles of columns on worker threads (KILN_JOBS):
 * a decoder's weights are most of a compile's time (a 2048 x 11264 f32
 * weight to f16 K-major about 0.5 s on one core). 4-bit codes pack two a
 * byte; where two columns' codes could share one (an odd count along the
 * packing), one thread does all. */
static void encode(Graph *g, Node *n, Tensor *b, int64_t K, int64_t N, int64_t sk, int64_t sn,
                   WeightFormat f) {
    int64_t count = K * N, nb = (K + QUANT_BLOCK - 1) / QUANT_BLOCK;
    n->wformat = f;
    bool int4 = f == WF_INT4 || f == WF_INT4_ASYM;
    bool asym = f == WF_INT8_ASYM || f == WF_INT4_ASYM;
    if (f == WF_F32 || f == WF_F16) {
        /* f16: two halves per 32-bit word, count rounded up to an even number. */
        n->wq = f == WF_F32 ? new_weight(g, b, ".kmajor", KILN_DTYPE_F32, count)
                            : new_weight(g, b, ".f16", KILN_DTYPE_F16, count + (count & 1));
    } else {
        int64_t qbytes = int4 ? (count + 1) / 2 : count;
        n->wq = new_weight(g, b, ".q", KILN_DTYPE_U8, (qbytes + 3) / 4 * 4);
        n->wscale = new_weight(g, b, ".scale", KILN_DTYPE_F32, nb * N);
        if (asym)
            n->wzero = new_weight(g, b, ".zero", KILN_DTYPE_U8, (nb * N + 3) / 4 * 4);
    }
    double levels = f == WF_INT8 ? 127 : f == WF_INT4 ? 7 : f == WF_INT8_ASYM ? 255
                  : f == WF_INT4_ASYM ? 15 : f == WF_FP8_E4M3 ? 448 : 57344;
    Encoding e = {n, b, K, N, sk, sn, nb, f, levels};
    int64_t tiles = (N + ENCODE_TILE - 1) / ENCODE_TILE;
    bool shared_bytes = int4 && (n->wkmajor ? K % 2 : N % 2);
    run_striped(shared_bytes || count < (1 << 20)
                    ? 1 : worker_threads((int)(tiles < 64 ? tiles : 64)),
                encode_tiles, &e);
}

int64_t quant_param_index(int rank, const int64_t *shape, int axis, int64_t block, int64_t i) {
    if (axis < 0)
        return 0;
    int64_t coords[MAX_RANK];
    for (int d = rank - 1; d >= 0; d--) {
        coords[d] = i % shape[d];
        i /= shape[d];
    }
    if (!block)
        return coords[axis];
    int64_t idx = 0;
    for (int d = 0; d < rank; d++)
        idx = d == axis ? idx * ((shape[d] + block - 1) / block) + coords[d] / block
                        : idx * shape[d] + coords[d];
    return idx;
}

/* The index into b->quant's scales and zero points of element i. */
static int64_t code_param(const Tensor *b, int64_t i) {
    return quant_param_index(b->rank, b->shape, b->quant.axis, b->quant.block, i);
}

static int code_zero(const Tensor *b, int64_t p) {
    const QuantCodes *q = &b->quant;
    return !q->zero ? 0 : q->is_signed ? (int)(int8_t)q->zero[p] : (int)q->zero[p];
}

/* Stores B's 8-bit codes as they are (int8 or int8-asym), when each block
 * of QUANT_BLOCK k of one column shares a scale and a zero point; false
 * (nothing done) when one does not. */
static bool keep_codes(Graph *g, Node *n, Tensor *b, int64_t K, int64_t N, int64_t sk,
                       int64_t sn) {
    int64_t nb = (K + QUANT_BLOCK - 1) / QUANT_BLOCK;
    bool asym = !b->quant.is_signed;
    for (int64_t col = 0; col < N; col++)
        for (int64_t blk = 0; blk < nb; blk++) {
            int64_t k0 = blk * QUANT_BLOCK, k1 = k0 + QUANT_BLOCK < K ? k0 + QUANT_BLOCK : K;
            int64_t p0 = code_param(b, k0 * sk + col * sn);
            asym |= code_zero(b, p0) != 0;
            for (int64_t k = k0 + 1; k < k1; k++) {
                int64_t p = code_param(b, k * sk + col * sn);
                if (b->quant.scale[p] != b->quant.scale[p0] || code_zero(b, p) != code_zero(b, p0))
                    return false;
            }
        }
    int shift = asym && b->quant.is_signed ? 128 : 0;
    n->wformat = asym ? WF_INT8_ASYM : WF_INT8;
    n->wq = new_weight(g, b, ".q", KILN_DTYPE_U8, (K * N + 3) / 4 * 4);
    n->wscale = new_weight(g, b, ".scale", KILN_DTYPE_F32, nb * N);
    if (asym)
        n->wzero = new_weight(g, b, ".zero", KILN_DTYPE_U8, (nb * N + 3) / 4 * 4);
    for (int64_t col = 0; col < N; col++)
        for (int64_t blk = 0; blk < nb; blk++) {
            int64_t p0 = code_param(b, blk * QUANT_BLOCK * sk + col * sn);
            int64_t si = scale_index(n, K, N, blk, col);
            memcpy(n->wscale->data + 4 * si, &b->quant.scale[p0], 4);
            if (asym)
                n->wzero->data[si] = (uint8_t)(code_zero(b, p0) + shift);
        }
    for (int64_t k = 0; k < K; k++)
        for (int64_t col = 0; col < N; col++)
            n->wq->data[dst_index(n, K, k, col, sk, sn)] =
                (uint8_t)(b->quant.codes[k * sk + col * sn] + shift);
    return true;
}

/* Whether n (a matmul or gemm reading its weight B as K x N) is a decode
 * step's product: few rows of A, fixed, contiguous along K (no trans_a), in
 * f32 or f16, and K whole chunks of format f: it runs on matvec_k.comp,
 * which reads B K-major (lower_matmul.c). Few: up to 2 rows for f32, 8 for
 * the other formats; beyond, matvec.comp on the row-major weight was as
 * fast or faster, since each of matvec_k's workgroups reads all of A
 * (H200, [M, 4096] x [4096, 4096], us row-major -> K-major: f32 M=1 30 ->
 * 22, M=2 28 -> 25, M=4 33 -> 35; int4 M=1 96 -> 17, M=8 49 -> 47, M=16 82
 * -> 133; bench/WEIGHTS.md). KILN_MATVEC_K=0 keeps every weight row-major. */
static bool decode_product(Node *n, int64_t K, WeightFormat f) {
    const Tensor *a = n->inputs[0];
    if (matvec_k_off() || (a->dyn_axes && !a->dynamic) ||
        (a->dtype != KILN_DTYPE_F32 && a->dtype != KILN_DTYPE_F16) || K % weight_chunk(f) ||
        (n->op == OP_GEMM && attr_int(n, "trans_a")))
        return false;
    if (a->dynamic) { /* rows that follow the dims: a decoder's [1, seq, K] */
        int64_t ext = a->shape[a->dyn_axis];
        int64_t per = a->dyn_axis < a->rank - 1 && ext ? tensor_count(a) / K / ext : 0;
        return per >= 1 && per <= MATVEC_K_DYN_M;
    }
    return tensor_count(a) / K <= (f == WF_F32 ? 2 : 8);
}

bool decode_weight(Graph *g, const Tensor *b) {
    if (b->kind != T_WEIGHT || b->rank != 2 || !b->data || b->is_output)
        return false;
    bool any = false;
    for (int i = 0; i < g->nodes.len; i++) {
        Node *n = g->nodes.data[i];
        for (int k = 0; !n->dead && k < n->ninputs; k++) {
            if (n->inputs[k] != b)
                continue;
            if (k != 1 || n->op != OP_MATMUL || !n->inputs[0]->dynamic ||
                !decode_product(n, b->shape[0], WF_F16))
                return false;
            any = true;
        }
    }
    return any;
}

/* Whether n is a gemm that reads its B transposed (B given as N x K). */
static bool trans_b(Node *n) { return n->op == OP_GEMM && attr_int(n, "trans_b"); }

/* A reader of B that n's encoding serves: B of the same product and
 * orientation (those after n share n's encoding). */
static bool served(Node *m, int k, void *ctx) {
    Node *n = ctx;
    return k == 1 && m->op == n->op && trans_b(m) == trans_b(n);
}

/* Frees B's own bytes once n's encoding holds all its readers need
 * (release_weight). No dispatch binds B then (lowering binds the
 * encoding): a decoder's weights are never held twice, in the file's
 * dtype and encoded (the 8B of issue 65 is 16 GB in f16). */
static void release_source(Graph *g, Node *n, Tensor *b) {
    release_weight(g, b, served, n);
}

void quantize_weights(Graph *g, const Options *opt) {
    const WeightFormat given = (WeightFormat)opt->weights_format;
    WeightFormat f = given;
    /* A weight qualifies when every live reader is a matmul or gemm that
     * takes it as B; it is stored K-major when every one of them is a
     * decode step's product. */
    bool *other = xcalloc((size_t)g->tensors.len + 1, sizeof *other);
    bool *wide = xcalloc((size_t)g->tensors.len + 1, sizeof *wide);
    for (int i = 0; i < g->nodes.len; i++) {
        Node *n = g->nodes.data[i];
        if (n->dead)
            continue;
        bool product = n->op == OP_MATMUL || n->op == OP_GEMM;
        for (int k = 0; k < n->ninputs; k++)
            if (k != 1 || !product)
                other[n->inputs[k]->id] = true;
        if (product && n->ninputs >= 2 && n->inputs[1]->rank == 2) {
            Tensor *b = n->inputs[1];
            /* 8-bit codes kept (f32) take int8's chunks */
            WeightFormat as = f == WF_F32 && b->quant.codes ? WF_INT8 : f;
            wide[b->id] |= !decode_product(n, b->shape[trans_b(n) ? 1 : 0], as);
        }
    }
    int done = 0, kept = 0, kmajor = 0;
    for (int i = 0; i < g->nodes.len; i++) {
        Node *n = g->nodes.data[i];
        if (n->dead || (n->op != OP_MATMUL && n->op != OP_GEMM) || n->ninputs < 2)
            continue;
        Tensor *b = n->inputs[1];
        /* Readers of one weight with the same orientation share its bytes
         * (the first one's encoding, which may have freed B's own) */
        Node *same = NULL;
        for (int j = 0; j < i && !same; j++) {
            Node *m = g->nodes.data[j];
            if (!m->dead && m->wq && m->inputs[1] == b && m->op == n->op &&
                trans_b(m) == trans_b(n))
                same = m;
        }
        if (same) {
            n->wformat = same->wformat;
            n->wq = same->wq;
            n->wscale = same->wscale;
            n->wzero = same->wzero;
            n->wkmajor = same->wkmajor;
            n->act_int8 = opt->activations_int8;
            continue;
        }
        bool half = b->dtype == KILN_DTYPE_F16;
        if (b->kind != T_WEIGHT || (b->dtype != KILN_DTYPE_F32 && !half) || b->rank != 2 ||
            b->is_output || other[b->id] || !b->data)
            continue;
        /* --precision f16 leaves a decoder's weights f32 (precision.c) for
         * an f16 K-major copy here; a decoder exported in f16 (its weights
         * f16 in the file) gets the same copy, its halves as they are (with
         * or without --precision f16), or its --weights codes from those
         * halves */
        f = given;
        if (f == WF_F32 && (opt->precision == KILN_DTYPE_F16 || half) && !b->quant.codes &&
            decode_weight(g, b))
            f = WF_F16;
        if (half && f == WF_F32)
            continue;
        int64_t K = b->shape[0], N = b->shape[1], sk = N, sn = 1;
        bool tb = trans_b(n);
        if (tb) {
            K = b->shape[1];
            N = b->shape[0];
            sk = 1;
            sn = K;
        }
        /* K-major where every reader is decode-shaped; an f32 weight then
         * gets a K-major copy unless it is K-major already (trans_b), and
         * otherwise stays as it is but for 8-bit codes kept */
        n->wkmajor = !wide[b->id];
        n->act_int8 = opt->activations_int8;
        bool f32_copy = f == WF_F32 && !tb && n->wkmajor;
        if (K * N == 0 || (f == WF_F32 && !b->quant.codes && !f32_copy)) {
            n->wkmajor = false;
            continue;
        }
        if (f == WF_F32 && b->quant.codes && keep_codes(g, n, b, K, N, sk, sn)) {
            kept++;
            kmajor += n->wkmajor;
            continue;
        }
        if (f == WF_F32 && !f32_copy) { /* codes that do not fit */
            n->wkmajor = false;
            continue;
        }
        kmajor += n->wkmajor;
        encode(g, n, b, K, N, sk, sn, f);
        done += f != WF_F32;
        release_source(g, n, b);
    }
    if (opt->verbose && done)
        fprintf(stderr, "kiln: %d matmul weights re-encoded as %s\n", done,
                weight_format_names[given == WF_F32 ? WF_F16 : given]);
    if (opt->verbose && kept)
        fprintf(stderr, "kiln: %d dequantized matmul weights kept as their 8-bit codes\n", kept);
    if (opt->verbose && kmajor)
        fprintf(stderr, "kiln: %d matmul weights stored K-major for decode-shaped products\n",
                kmajor);
    xfree(other);
    xfree(wide);
}
