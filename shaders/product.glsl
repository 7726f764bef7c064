// product.glsl: the batches of a matrix product (matmul, matvec, coopmat,
// splitk) and the epilogue of those that fuse one.
//
// BATCH batches over BRANK dimensions BSHAPE, with per-operand element
// strides C_BSTRIDES, A_BSTRIDES, B_BSTRIDES (0: broadcast). BATCH_RUN
// (an outer batch axis that follows the dims): the run's batches, the
// first BATCH_RUN; the kernels' loops end there.
#ifndef BATCH_RUN
#define BATCH_RUN BATCH
#endif
const uint BSHAPE_[BRANK] = uint[BRANK](BSHAPE);
const uint CBS[BRANK] = uint[BRANK](C_BSTRIDES);
const uint ABS[BRANK] = uint[BRANK](A_BSTRIDES);
const uint BBS[BRANK] = uint[BRANK](B_BSTRIDES);

// Where batch bz starts in C, A and B (elements).
void kiln_batch_offsets(uint bz, out uint ca, out uint cb, out uint cc) {
    uint rem = bz;
    ca = 0;
    cb = 0;
    cc = 0;
    for (int d = BRANK - 1; d >= 0; --d) {
        uint x = rem % BSHAPE_[d];
        rem /= BSHAPE_[d];
        ca += x * ABS[d];
        cb += x * BBS[d];
        cc += x * CBS[d];
    }
}

// B's element at (gk, gn) of the batch at cb (matmul.comp and coopmat.comp,
// where they gather B one element at a time). CONV: B is the im2col matrix
// of a 2-D convolution's input (NCHW, one group), element (k, p) x[ci, oh *
// CSH - CPH + kh * CDH, ow * CSW - CPW + kw * CDW] (0 outside), k = (ci *
// CKH + kh) * CKW + kw, p = oh * COW + ow, read through CONV_B(i), the
// kernel's load of the input's element i; CONV_KLAST: k = (kh * CKW + kw) *
// CIC + ci instead (the weights [OC, KH, KW, C], CIC input channels).
// CIMG: images fold into N, CIMG columns each, each image's input CIN_IMG
// elements after the last (a 1 x 1 convolution's plain B too: B_SK = CIMG,
// B_SN = 1).
#if CONV
// Column gn of the im2col matrix (an output position): where its window
// starts in the input, and its image's offset.
struct ConvCol {
    int ih, iw;
    uint base;
};
ConvCol conv_col(uint cb, uint gn) {
    ConvCol c;
#ifdef CIMG
    cb += gn / CIMG * CIN_IMG;
    gn %= CIMG;
#endif
    c.base = cb;
    c.ih = int(gn / COW * CSH) - CPH;
    c.iw = int(gn % COW * CSW) - CPW;
    return c;
}

// Element gk of column c (0 in the padding).
float conv_at(ConvCol c, uint gk) {
#if CONV_KLAST
    const uint ci = gk % CIC, kh = gk / CIC / CKW, kw = gk / CIC % CKW;
#else
    const uint ci = gk / (CKH * CKW), kh = gk / CKW % CKH, kw = gk % CKW;
#endif
    const uint ih = uint(c.ih + int(kh * CDH)), iw = uint(c.iw + int(kw * CDW));
    return ih < CIH && iw < CIW ? float(CONV_B(c.base + (ci * CIH + ih) * CIW + iw)) : 0.0;
}
#elif defined(CIMG)
#define B_INDEX(cb, gk, gn) ((cb) + (gn) / CIMG * CIN_IMG + (gk) * B_SK + (gn) % CIMG)
#else
#define B_INDEX(cb, gk, gn) ((cb) + (gk) * B_SK + (gn) * B_SN)
#endif

#ifndef ALPHA
#define ALPHA 1.0
#endif
#ifndef HAS_BIAS
#define HAS_BIAS 0
#endif
#ifndef HAS_RES
#define HAS_RES 0
#endif
#ifndef ACT
#define ACT(x) (x)
#endif

// The epilogue for element (gm, gn) of the batch at offset cc of C:
// C = ACT(ALPHA * acc + BETA * bias[gm * BIAS_SM + gn * BIAS_SN] + res[cc +
// gm * N + gn]), the bias where HAS_BIAS, res (a convolution's skip
// connection) where HAS_RES; ACT(x) is an activation expression. Its kernel
// declares C_T, C's element type, and args.c, args.bias and args.res.
// C_IMG (a convolution whose images fold into N, C_IMG positions each): C
// and res are [images, M, C_IMG], (gm, gn) at gn / C_IMG * M * C_IMG + gm *
// C_IMG + gn % C_IMG.

// Where element (gm, gn) of C (and of res) is.
uint c_at(uint cc, uint gm, uint gn) {
#ifdef C_IMG
    return gn / C_IMG * (uint(M) * C_IMG) + gm * C_IMG + gn % C_IMG;
#else
    return cc + gm * N + gn;
#endif
}

// The epilogue's value for element (gm, gn), at `at`, from the product acc.
float epilogue_value(uint gm, uint gn, uint at, float acc) {
    float v = ALPHA * acc;
#if HAS_BIAS
    v += BETA * args.bias.v[gm * BIAS_SM + gn * BIAS_SN];
#endif
#if HAS_RES
    v += float(args.res.v[at]);
#endif
    return ACT(v);
}

void store_c(uint cc, uint gm, uint gn, float acc) {
    const uint at = c_at(cc, gm, gn);
#ifdef C_IMG
    args.c.v[at] = C_T(epilogue_value(gm, gn, at, acc));
#else
    KILN_STORE_C(cc, gm, gn, C_T(epilogue_value(gm, gn, at, acc)));
#endif
}

#if STORE8
// store_c for the eight elements (gm, gn + j) of one row, which lie in one
// image (C_IMG a multiple of 8, gn too) and not across a QKV split: the
// index found once, a multiple of 8 (C's rows, batches and images in
// eights), so the eight go out as one 16-byte store (halves) or two (f32),
// not eight narrow ones.
layout(buffer_reference, std430, buffer_reference_align = 16) buffer KilnC8 {
    uvec4 v[];
};
void store_c8(uint cc, uint gm, uint gn, const float acc[8]) {
    const uint at = c_at(cc, gm, gn);
    float y[8];
    [[unroll]] for (uint j = 0; j < 8; ++j)
        y[j] = epilogue_value(gm, gn + j, at + j, acc[j]);
#if C_F16
    KilnC8(args.c).v[at / 8] = uvec4(packHalf2x16(vec2(y[0], y[1])), packHalf2x16(vec2(y[2], y[3])),
                                     packHalf2x16(vec2(y[4], y[5])), packHalf2x16(vec2(y[6], y[7])));
#else
    KilnC8(args.c).v[at / 4] = floatBitsToUint(vec4(y[0], y[1], y[2], y[3]));
    KilnC8(args.c).v[at / 4 + 1] = floatBitsToUint(vec4(y[4], y[5], y[6], y[7]));
#endif
}
#endif

#if defined(SPLIT_LAST) && SPLIT_LAST
// Split K with the sum in the same dispatch (matmul.comp, coopmat.comp):
// the SPLITK workgroups of a BM x BN tile each store their partial product
// to args.part ([SPLITK, M, N] f32) and count themselves on the tile's
// counter (args.count[tile]); the last to finish adds the partials up and
// stores C through the epilogue (store_c), then sets the counter back to
// zero for the next run. Every invocation of the workgroup calls it.
shared bool kiln_last;

void store_part(uint cc, uint gm, uint gn, float v) { args.part.v[cc + gm * N + gn] = v; }

// The sum of the SPLITK partial products at element e of [M, N] (four
// from e, a multiple of 4, with PART4), their loads issued together.
#define PART4 (N % 4 == 0)
vec4 part_sum(uint e) {
    vec4 sum = vec4(0.0);
#if PART4
    [[unroll]] for (uint s = 0; s < SPLITK; ++s)
        sum += V4C(args.part).v[(s * uint(M) * N + e) / 4];
#else
    [[unroll]] for (uint s = 0; s < SPLITK; ++s)
        sum.x += args.part.v[s * uint(M) * N + e];
#endif
    return sum;
}

void split_last(uint tile, uint m0, uint n0, uint tid) {
    memoryBarrierBuffer(); // this workgroup's partial product before its count
    barrier();
    if (tid == 0)
        kiln_last = atomicAdd(args.count.v[tile], 1u) == SPLITK - 1u;
    barrier();
    if (!kiln_last)
        return;
    memoryBarrierBuffer();
    // the tile in runs of W columns (4 with PART4), U runs an invocation
    // at a time, every run's loads before any of its sums is used
    const uint W = PART4 ? 4 : 1, RUNS = BM * BN / W, U = 4;
    for (uint e0 = tid; e0 < RUNS; e0 += U * NT) {
        vec4 sum[U];
        [[unroll]] for (uint u = 0; u < U; ++u) {
            const uint e = e0 + u * NT, gm = m0 + e / (BN / W), gn = n0 + e % (BN / W) * W;
            sum[u] = e < RUNS && gm < M && gn < N ? part_sum(gm * N + gn) : vec4(0.0);
        }
        [[unroll]] for (uint u = 0; u < U; ++u) {
            const uint e = e0 + u * NT, gm = m0 + e / (BN / W), gn = n0 + e % (BN / W) * W;
            [[unroll]] for (uint w = 0; w < W; ++w)
                if (e < RUNS && gm < M && gn + w < N)
                    store_c(0u, gm, gn + w, sum[u][w]);
        }
    }
    if (tid == 0)
        args.count.v[tile] = 0u;
}
#endif
