// weights.glsl: B operands of matmul.comp and matvec.comp stored in another
// format than f32 (kiln compile --weights FORMAT), turned back into f32
// where they are loaded, so all arithmetic stays f32.
//
// W_FORMAT: 0 f32; 1 f16 (two per 32-bit word, unpackHalf2x16: no 16-bit
// storage feature needed); 2 int8, symmetric: w = q * s; 3 int8,
// asymmetric: w = (q - z) * s, q and z unsigned bytes; 4 int4, symmetric,
// q in [-8, 7]; 5 int4, asymmetric, q and z in [0, 15]; 6 fp8 e4m3 (the FN
// variant: no infinities, 448 largest) times s; 7 fp8 e5m2 times s.
// Quantized elements keep B's element order (element i of the f32 tensor is
// byte i, or nibble i with the low nibble first); s and z are per block of
// QBLOCK consecutive k of one column n: s at bscale[(k / QBLOCK) * N + n],
// z the byte at the same index of bzero (W_KMAJOR: B stored K-major, its
// scales at n * NBLK + k / QBLOCK). Everything is read through 32-bit
// words, so no 8-bit storage feature is needed either.
//
// LOAD_B(i, k, n) is element i of B, at row k and column n; it reads
// args.b, args.bscale and args.bzero, so include this before the kernel's
// push constants (it defines their B_BUF type) and use it after them.
#ifndef W_FORMAT
#define W_FORMAT 0
#endif

#if W_FORMAT == 0
#define B_BUF F32R
#define LOAD_B(i, k, n) args.b.v[i]
#else
#define B_BUF U32R

uint kiln_byte(U32R buf, uint i) { return (buf.v[i >> 2] >> ((i & 3u) * 8u)) & 255u; }

// fp8 bytes to float by building the f32 bits (no ldexp, no branches but
// the selects): a normal value moves its exponent and mantissa into place
// with the exponent rebiased; a subnormal one is m times its step.
float kiln_fp8_e4m3(uint q) {
    const uint e = (q >> 3) & 15u, m = q & 7u;
    float mag = e == 0u ? float(m) * (1.0 / 512.0)
                        : uintBitsToFloat(((e + 120u) << 23) | (m << 20));
    mag = (q & 127u) == 127u ? uintBitsToFloat(0x7fc00000u) : mag; // the FN variant's NaN
    return (q & 128u) != 0u ? -mag : mag;
}
float kiln_fp8_e5m2(uint q) {
    const uint e = (q >> 2) & 31u, m = q & 3u;
    float mag = e == 0u ? float(m) * (1.0 / 65536.0)
              : e == 31u ? uintBitsToFloat(m == 0u ? 0x7f800000u : 0x7fc00000u)
                         : uintBitsToFloat(((e + 112u) << 23) | (m << 21));
    return (q & 128u) != 0u ? -mag : mag;
}

float kiln_load_b(U32R b, F32R bscale, U32R bzero, uint i, uint k, uint n) {
#if W_FORMAT == 1
    vec2 h = unpackHalf2x16(b.v[i >> 1]);
    return (i & 1u) != 0u ? h.y : h.x;
#else
#if defined(W_KMAJOR) && W_KMAJOR
    const uint blk = n * NBLK + k / QBLOCK; // B K-major: its scales too
#else
    const uint blk = (k / QBLOCK) * N + n;
#endif
    const float s = bscale.v[blk];
#if W_FORMAT == 4 || W_FORMAT == 5
    const uint q = (b.v[i >> 3] >> ((i & 7u) * 4u)) & 15u;
#else
    const uint q = kiln_byte(b, i);
#endif
#if W_FORMAT == 2
    return float(int(q << 24) >> 24) * s;
#elif W_FORMAT == 4
    return float(int(q << 28) >> 28) * s;
#elif W_FORMAT == 3 || W_FORMAT == 5
    return (float(q) - float(kiln_byte(bzero, blk))) * s;
#elif W_FORMAT == 6
    return kiln_fp8_e4m3(q) * s;
#else
    return kiln_fp8_e5m2(q) * s;
#endif
#endif
}
#define LOAD_B(i, k, n) kiln_load_b(args.b, args.bscale, args.bzero, i, k, n)
#endif
