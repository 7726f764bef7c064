// matvec_decode.glsl: matvec_k.comp's weight decoding (included after its
// RAW and format defines): four codes of a chunk as f32.

// Four weights, piece p (k 4p to 4p + 3) of a chunk, as f32. Quantized
// formats give their codes less the zero point (integers, exactly); the
// chunk's scale multiplies their sum once, in main. zo: the offsets below,
// plus the chunk's zero point.
//
// Integer codes become floats without an int-to-float conversion (a
// quarter-rate instruction on NVIDIA GPUs): a code of BITS bits at bit
// position b (b + BITS <= 23) ORed into the mantissa of 2^23 (0x4B000000)
// makes the float 2^23 + q * 2^b, and one fma by 2^-b less (2^(23 - b) +
// z) leaves q - z, exact in every step. Two of a word's four bytes (four of its eight
// nibbles) sit low enough to be used in place, the rest after one shift;
// signed codes are first moved to offset binary by flipping their sign
// bits (their zero point then 128, or 8). fp8 codes become halves by moving
// their bits (e5m2 is the top byte of an f16; e4m3's seven magnitude bits
// go under an f16's sign, leaving the value times 2^-8, which FP8_UNIT in
// the scale makes up), then f32 by unpackHalf2x16. The compiler writes finite fp8
// codes only, which this mapping keeps exact (an e4m3 NaN code would not).
const uint MAGIC = 0x4B000000u;
#if W_FORMAT == 2
#define FLIP 0x80808080u
#define ZERO 128.0
#elif W_FORMAT == 4
#define FLIP 0x88888888u
#define ZERO 8.0
#else
#define FLIP 0u
#endif
#if W_FORMAT == 2 || W_FORMAT == 3
#define BITS 8
#elif W_FORMAT == 4 || W_FORMAT == 5
#define BITS 4
#endif
// The code at bits b to b + BITS - 1 of v, less zo (2^(23 - b) plus the
// zero point).
#define KILN_CODE(v, b, zo) fma(uintBitsToFloat(((v) & (((1u << BITS) - 1u) << (b))) | MAGIC), \
                                1.0 / float(1u << (b)), -(zo))
// zo for a chunk's zero point z.
vec4 kiln_offsets(float z) {
#if BITS == 8
    return vec4(8388608.0, 32768.0, 0.0, 0.0) + z;
#elif BITS == 4
    return vec4(8388608.0, 524288.0, 32768.0, 2048.0) + z;
#else
    return vec4(z);
#endif
}
#if W_FORMAT == 6
const float FP8_UNIT = 256.0; // e4m3's bias is 7, an f16's 15
#else
const float FP8_UNIT = 1.0;
#endif

vec4 kiln_w4(RAW raw, uint p, vec4 zo) {
#if W_FORMAT == 0
    return raw;
#elif W_FORMAT == 1
    return vec4(unpackHalf2x16(raw[2 * p]), unpackHalf2x16(raw[2 * p + 1]));
#elif BITS == 8
    const uint x = raw[p] ^ FLIP, y = x >> 16;
    return vec4(KILN_CODE(x, 0, zo[0]), KILN_CODE(x, 8, zo[1]),
                KILN_CODE(y, 0, zo[0]), KILN_CODE(y, 8, zo[1]));
#elif BITS == 4
    const uint x = (raw[p >> 1] ^ FLIP) >> (16u * (p & 1u));
    return vec4(KILN_CODE(x, 0, zo[0]), KILN_CODE(x, 4, zo[1]),
                KILN_CODE(x, 8, zo[2]), KILN_CODE(x, 12, zo[3]));
#else
    const uint x = raw[p];
#if W_FORMAT == 6
    const uint odd = (x & 0x80008000u) | ((x >> 1) & 0x3F803F80u);
    const uint even = ((x << 8) & 0x80008000u) | ((x << 7) & 0x3F803F80u);
#else
    const uint odd = x & 0xFF00FF00u, even = (x << 8) & 0xFF00FF00u;
#endif
    const vec2 o = unpackHalf2x16(odd), e = unpackHalf2x16(even);
    return vec4(e.x, o.x, e.y, o.y);
#endif
}
